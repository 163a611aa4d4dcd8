"""Tape transforms of the device's preprocessing that PennyLane does not ship."""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Sequence

import numpy as np
import pennylane as qml
from autograd.tracer import Box
from pennylane import math
from pennylane.devices.preprocess import decompose, device_resolve_dynamic_wires
from pennylane.exceptions import DeviceError
from pennylane.measurements import (
    CountsMP,
    DensityMatrixMP,
    ExpectationMP,
    MeasurementValue,
    MutualInfoMP,
    ProbabilityMP,
    PurityMP,
    SampleMP,
    StateMeasurement,
    StateMP,
    VarianceMP,
    VnEntropyMP,
)
from pennylane.operation import Operator, StatePrepBase
from pennylane.ops import (
    CompositeOp,
    Conditional,
    LinearCombination,
    MidMeasure,
    PauliMeasure,
    Pow,
    SProd,
    Sum,
    SymbolicOp,
)
from pennylane.pytrees import flatten, unflatten
from pennylane.queuing import QueuingManager
from pennylane.tape import QuantumScript
from pennylane.transforms import (
    broadcast_expand,
    defer_measurements,
    diagonalize_measurements,
    split_non_commuting,
)
from pennylane.transforms.core import transform
from pennylane.wires import Wires

from .entrywise import (
    ENTRYWISE_SOURCES,
    MAX_ENTRYWISE_QUBITS,
    MAX_ENTRYWISE_STATE_QUBITS,
    EntrywiseState,
    EntrywiseUnitary,
    entrywise_state,
    entrywise_unitary,
    jit_whole_matrix_reason,
    left_whole_under_jit,
    too_wide,
)
from .exact import observable_key
from .gradients.observables import MatrixDerivative, observable_derivatives
from .gradients.validation import is_swept, require_adjoint_serves
from .measure import DENSE_OBSERVABLE_WIRES, SHADOW_MEASUREMENTS, measured_on_positions
from .program import (
    is_broadcast,
    is_broadcast_by_hyperparameters,
    is_broadcast_power,
    scalar_parameters,
    tape_batch_size,
)
from .rotations import ROTATION_GATES, PauliRotations, gate_of
from .templates import is_native_template, template_operations


def _first_result(results):
    return results[0]


@transform
def results_off_the_jit_root(tape: QuantumScript):
    """Under ``jax.jit``, each result leaves through one operation that does nothing to its
    value (``jax.lax.reduce_precision`` to its own precision, real and imaginary parts
    apart), so that PennyLane's pure callback is never the root of the compiled program.

    jaxlib 0.7.1 (the jax PennyLane 0.45 pins) aborts the Python process when XLA compiles
    a program whose root is a callback and in which a matrix-vector product feeds that
    callback: its CPU dot emitter reads the root's backend configuration as its own
    protobuf, and the callback's is not ("Could not convert JSON string to proto ...
    xla.cpu.BackendConfig"; measured: ``jax.jit(lambda x: jax.pure_callback(f, s, M @ x))``
    aborts, ``jax.jit(lambda x: jnp.sin(jax.pure_callback(f, s, M @ x)))`` does not). A
    decomposition that multiplies matrices under ``jax.jit`` meets it: ``SelectPauliRot``,
    a trainable ``DiagonalQubitUnitary``, ``MottonenStatePreparation``,
    ``MultiplexerStatePreparation``, a ``BlockEncode`` of traced data, and the user's own
    ``qnode(M @ v)``. ``XLA_FLAGS`` have no option that avoids it; ``optimization_barrier``,
    ``x + 0`` and ``x * 1`` are simplified away before code generation, ``reduce_precision``
    is kept. The device adds this transform where its preprocessing runs on jax's tracers
    (the adjoint method, and ``"best"``, which takes it); under a gradient transform or
    ``diff_method=None`` the preprocessing runs inside the callback, on arrays, and this
    returns the results as they are. Outside ``jax.jit`` it changes nothing either."""
    return (tape,), _result_off_the_jit_root


def _result_off_the_jit_root(results):
    return _off_the_jit_root(results[0])


def _off_the_jit_root(result):
    if isinstance(result, (tuple, list)):
        return type(result)(_off_the_jit_root(part) for part in result)
    if isinstance(result, dict):
        return {key: _off_the_jit_root(part) for key, part in result.items()}
    if not math.is_abstract(result):
        return result
    import jax  # only jax's tracers come here

    def kept_identity(part):
        bits = jax.numpy.finfo(part.dtype)
        return jax.lax.reduce_precision(part, bits.nexp, bits.nmant)

    if jax.numpy.iscomplexobj(result):
        return jax.lax.complex(kept_identity(result.real), kept_identity(result.imag))
    if jax.numpy.issubdtype(result.dtype, jax.numpy.floating):
        return kept_identity(result)
    return result  # integers and booleans: sampled results, which no adjoint method makes


@transform
def decompose_late_state_preps(tape: QuantumScript):
    """Replace state preparations after the first operation by their decompositions.

    The device starts from a prepared state only at the beginning of a circuit.
    """
    if not any(isinstance(op, StatePrepBase) for op in tape.operations[1:]):
        return (tape,), _first_result
    operations = []
    for position, op in enumerate(tape.operations):
        if position > 0 and isinstance(op, StatePrepBase):
            operations.extend(op.decomposition())
        else:
            operations.append(op)
    return (tape.copy(operations=operations),), _first_result


@transform
def entrywise_trainable_operators(tape: QuantumScript):
    """For the adjoint method: a trainable ``QubitUnitary``, ``ControlledQubitUnitary`` or
    ``BlockEncode`` on at most ``entrywise.MAX_ENTRYWISE_QUBITS`` wires becomes an
    ``EntrywiseUnitary``, and a trainable state preparation that opens the circuit on at
    most ``entrywise.MAX_ENTRYWISE_STATE_QUBITS`` wires an ``EntrywiseState``: their
    parameters, the real and imaginary parts of the matrix's entries or the state's
    amplitudes, the ML framework takes from the operator here (the preprocessing runs where
    it records), so that the derivative is exact everywhere (see ``entrywise``). A wider one
    stays and is refused by name. A pulse is taken so under ``jax.jit`` too: jax's ODE solver
    for its matrix is compiled into the jitted program, beside PennyLane's callback (which
    ``results_off_the_jit_root`` keeps from aborting jaxlib 0.7.1)."""
    operations = tape.operations
    leading = bool(operations) and _entrywise_state(operations[0])
    converted = [_taken_for_adjoint(op) for op in operations]
    if not leading and all(new is op for new, op in zip(converted, operations, strict=True)):
        return (tape,), _first_result
    if leading:
        converted[0] = entrywise_state(operations[0])
    return (tape.copy(operations=converted),), _first_result


def _taken_for_adjoint(op: Operator) -> Operator:
    """``op`` as ``entrywise_trainable_operators`` leaves it: taken by its entries, passed
    through the refusing identity (``left_whole_under_jit``), or itself (one ``isinstance``
    for an operator that is none of ``ENTRYWISE_SOURCES``)."""
    if not isinstance(op, ENTRYWISE_SOURCES):
        return op
    if left_whole_under_jit(op):
        return _refusing_derivatives(op)
    return entrywise_unitary(op) if _entrywise(op) else op


def _refusing_derivatives(op: Operator) -> Operator:
    """A matrix that ``left_whole_under_jit`` leaves whole, passed through an identity
    whose derivative rule raises (``jit_whole_matrix_reason``): under
    ``jax.grad(jax.jit(f))`` jax asks for that rule only where the matrix depends on what
    is differentiated, so a matrix that jax merely computes inside the jitted function
    (PennyLane's QuantumMonteCarlo) is no obstacle, and one that is differentiated is
    refused by name before PennyLane's JVP rule fails on its shape."""
    refused = _derivative_refusing_identity()(op.data[0], jit_whole_matrix_reason(op))
    return qml.ops.functions.bind_new_parameters(op, [refused, *op.data[1:]])


@functools.cache
def _derivative_refusing_identity():
    import jax  # only reached with a jax.jit-traced value

    @functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
    def identity(value, reason: str):  # noqa: ARG001
        return value

    @identity.defjvp
    def _refuse(reason: str, primals, tangents):  # noqa: ARG001
        raise DeviceError(
            f"custatevec.qubit cannot differentiate this circuit by adjoint: {reason}."
        )

    return identity


def _entrywise(op: Operator) -> bool:
    if not isinstance(op, ENTRYWISE_SOURCES) or too_wide(op) or left_whole_under_jit(op):
        return False
    if isinstance(op, qml.pulse.ParametrizedEvolution):
        # its parameters or its times traced or trainable: its matrix is computed here, where
        # jax traces and differentiates (a pulse without parameters has a trainable time)
        values = op.data if op.t is None else (*op.data, op.t)
        return any(math.requires_grad(v) or math.is_abstract(v) for v in values)
    return math.requires_grad(op.data[0])


def _entrywise_state(op: Operator) -> bool:
    return (
        isinstance(op, StatePrepBase)
        and not isinstance(op, EntrywiseState)
        and len(op.wires) <= MAX_ENTRYWISE_STATE_QUBITS
        and any(math.requires_grad(d) for d in op.data)
    )


@transform
def measure_in_computational_bases(tape: QuantumScript):
    r"""Mid-circuit measurements in other bases (``qml.ftqc``'s ``ParametricMidMeasure``:
    ``measure_x``, ``measure_y``, ``measure_arbitrary_basis``; Pauli product measurements,
    ``qml.pauli_measure``) as Z-basis measurements.

    A measurement in the eigenbasis of :math:`U^\dagger Z U` (U: the measurement's
    ``diagonalizing_gates``) is U, then a Z-basis measurement. The measured qubit is left in
    the computational basis state of the outcome, :math:`|m\rangle`, not rotated back: that is
    PennyLane's convention (``qml.ftqc.diagonalize_mcms``, which its documentation asks for
    before execution, and default.qubit's one-shot and tree-traversal methods without it; its
    ftqc tests read ``Z`` of the measured wire afterwards and expect the outcome's sign).

    A Pauli product measurement of P (``_pauli_product_as_parity``) is V, a Z-basis
    measurement of one of its wires, then :math:`V^\dagger`, where V takes P to Z on that
    wire: the state is projected onto P's eigenspace of the outcome
    (:math:`(I + (-1)^m P)/2`, renormalised), as ``pauli_measure`` documents. PennyLane
    0.45 executes it nowhere (default.qubit: a KeyError in ``defer_measurements``
    without shots, "not supported" with shots).

    ``qml.ftqc.cond_measure`` records two conditionals on one wire, the true branch's
    measurement under its condition and the false branch's under the inverse: they become
    each branch's basis change under its condition and one Z-basis measurement. A measurement
    value that names replaced measurements is rebuilt over their replacements, a measurement
    it names twice (both branches of one ``cond_measure``) once, so the deferred method does
    not see the same measurement twice.

    This is ``diagonalize_mcms`` without its two faults for a device: it writes the new
    measurements into the original tape's measurement values (a shallow copy), and a value
    built over both branches of a ``cond_measure`` names the new measurement twice. Without
    the transform the deferred method would measure such a measurement in the Z basis:
    silently wrong (default.qubit's deferred method rejects it only by an unrelated wire
    error).
    """
    if not _needs_computational_bases(tape):
        return (tape,), _first_result
    replacements: list[tuple[MidMeasure, MidMeasure]] = []  # (original, Z-basis), by identity

    def rebuilt(value):
        if isinstance(value, list | tuple):
            return [rebuilt(v) for v in value]
        return _over_replacements(value, replacements)

    operations: list[Operator] = []
    ops = tape.operations
    index = 0
    with QueuingManager.stop_recording():
        while index < len(ops):
            op = ops[index]
            if isinstance(op, Conditional) and isinstance(op.base, MidMeasure):
                if index + 1 == len(ops) or not _pairs_with(op, ops[index + 1]):
                    raise DeviceError(
                        f"A mid-circuit measurement applied conditionally ({op.base}) must come "
                        "from qml.ftqc.cond_measure, which measures the same wire in both "
                        "branches; measure unconditionally, or use cond_measure."
                    )
                branches = (op, ops[index + 1])
                measured = _z_measurement(op.base)
                for branch in branches:
                    condition = rebuilt(branch.meas_val)
                    operations.extend(Conditional(condition, g) for g in _basis_change(branch))
                operations.append(measured)
                replacements.extend((branch.base, measured) for branch in branches)
                index += 2
                continue
            if _is_in_other_basis(op):
                measured = _z_measurement(op)
                operations.extend(op.diagonalizing_gates())
                operations.append(measured)
                replacements.append((op, measured))
            elif isinstance(op, PauliMeasure):
                to_parity, measured = _pauli_product_as_parity(op)
                operations.extend(to_parity)
                operations.append(measured)
                operations.extend(qml.adjoint(g, lazy=False) for g in reversed(to_parity))
                replacements.append((op, measured))
            elif isinstance(op, Conditional):
                condition = rebuilt(op.meas_val)
                operations.append(
                    op if condition is op.meas_val else Conditional(condition, op.base)
                )
            else:
                operations.append(op)
            index += 1
        measurements = []
        for mp in tape.measurements:
            if mp.mv is None:
                measurements.append(mp)
                continue
            value = rebuilt(mp.mv)
            if value is mp.mv:
                measurements.append(mp)
                continue
            renamed = copy.copy(mp)  # its options (all_outcomes, dtype) stay; mv is replaced
            renamed.mv = value
            measurements.append(renamed)
    return (tape.copy(operations=operations, measurements=measurements),), _first_result


def _needs_computational_bases(tape: QuantumScript) -> bool:
    """A measurement in another basis, a conditional measurement, or a measurement value
    that names one measurement twice (``diagonalize_mcms``'s output for a
    ``cond_measure``, applied by the user: its ``v1 or v2`` takes scalars, and one-shot
    evaluates values over arrays of outcomes). Every tape passes here: one lookup by
    type per operation."""
    dynamic = [op for op in tape.operations if _is_dynamic_type(type(op))]
    values = [op.meas_val for op in dynamic if isinstance(op, Conditional)]
    for mp in tape.measurements:
        if isinstance(mp.mv, list | tuple):
            values.extend(mp.mv)
        elif mp.mv is not None:
            values.append(mp.mv)
    if not dynamic and not values:
        return False
    return any(_measures_off_z(op) for op in dynamic) or any(map(_names_twice, values))


@functools.cache
def _is_dynamic_type(kind: type) -> bool:
    """A mid-circuit measurement or a conditional (``isinstance`` on PennyLane's operator
    classes costs 0.3 us, a cached lookup a tenth of it)."""
    return issubclass(kind, MidMeasure | Conditional | PauliMeasure)


def _names_twice(value: MeasurementValue) -> bool:
    return len({id(m) for m in value.measurements}) < len(value.measurements)


def _is_in_other_basis(op: Operator) -> bool:
    """``qml.ftqc``'s ``ParametricMidMeasure``. Only a program that imported
    ``pennylane.ftqc`` (which ``import pennylane`` does not, and which takes 0.1 s) can
    hold one, so its class is looked up, never imported here."""
    ftqc = sys.modules.get("pennylane.ftqc")
    kind = getattr(ftqc, "ParametricMidMeasure", None)
    return kind is not None and isinstance(op, kind)


def _measures_off_z(op: Operator) -> bool:
    """A measurement in another basis (a Pauli product's too), or a conditional
    measurement (cond_measure's)."""
    if isinstance(op, Conditional):
        return isinstance(op.base, MidMeasure)
    return isinstance(op, PauliMeasure) or _is_in_other_basis(op)


def _pairs_with(true_branch: Conditional, false_branch: Operator) -> bool:
    """cond_measure's two conditionals: measurements of one wire with the same reset and
    postselection."""
    return (
        isinstance(false_branch, Conditional)
        and isinstance(false_branch.base, MidMeasure)
        and false_branch.base.wires == true_branch.base.wires
        and false_branch.base.reset == true_branch.base.reset
        and false_branch.base.postselect == true_branch.base.postselect
    )


def _pauli_product_as_parity(op: PauliMeasure) -> tuple[list[Operator], MidMeasure]:
    r"""The gates V that take the Pauli word P of ``op`` to Z on its last wire t
    (:math:`V P V^\dagger = Z_t`), and the Z-basis measurement of t that stands for ``op``
    (same postselection and uid). Each X becomes Z by H, each Y by :math:`H S^\dagger`
    (:math:`S^\dagger Y S = X`); then CNOTs from the other wires onto t take
    :math:`Z_1 \cdots Z_k` to :math:`Z_t`, so t's outcome is the word's parity: 0 for the
    eigenvalue +1, 1 for -1, PennyLane's convention."""
    to_z: list[Operator] = []
    for pauli, wire in zip(op.pauli_word, op.wires, strict=True):
        if pauli == "Y":
            to_z.append(qml.adjoint(qml.S(wire)))
        if pauli in "XY":
            to_z.append(qml.H(wire))
    target = op.wires[-1]
    to_z.extend(qml.CNOT([wire, target]) for wire in op.wires[:-1])
    return to_z, MidMeasure(target, postselect=op.postselect, meas_uid=op.meas_uid)


def _z_measurement(op: MidMeasure) -> MidMeasure:
    """The Z-basis measurement that stands for ``op``: same wire, reset, postselection and
    uid (results keyed by it keep their keys)."""
    return MidMeasure(op.wires, reset=op.reset, postselect=op.postselect, meas_uid=op.meas_uid)


def _basis_change(branch: Conditional) -> list[Operator]:
    measurement = branch.base
    if _is_in_other_basis(measurement):
        return measurement.diagonalizing_gates()
    return []


def _over_replacements(value, replacements):
    """``value`` over the replacements of its measurements, each distinct one once, its
    processing applied outcome by outcome to arrays; the value itself when it names none
    of them and no measurement twice."""
    named = [next((new for old, new in replacements if old is m), m) for m in value.measurements]
    unchanged = all(new is m for new, m in zip(named, value.measurements, strict=True))
    if unchanged and not _names_twice(value):
        return value
    distinct: list = []
    for m in named:
        if not any(m is d for d in distinct):
            distinct.append(m)
    positions = [next(i for i, d in enumerate(distinct) if d is m) for m in named]
    processing = value.processing_fn

    def over_distinct(*outcomes):
        spread = [outcomes[i] for i in positions]
        if any(np.ndim(outcome) for outcome in spread):
            # one-shot passes arrays of outcomes; cond_measure's ``v1 or v2`` takes scalars
            return np.vectorize(processing)(*spread)
        return processing(*spread)

    return MeasurementValue(distinct, over_distinct)


class DifferentiatedMeasurementBasisError(DeviceError):
    """A PennyLane gradient transform asked to differentiate the angle of a ``qml.ftqc``
    measurement basis, which it cannot see."""


def differentiated_measurement_bases(tape: QuantumScript) -> list[MidMeasure]:
    """The ``qml.ftqc`` measurements of ``tape`` (alone or under ``cond_measure``) whose
    angle is being differentiated: an autograd box or a jax differentiation tracer, or a
    torch tensor that requires grad while torch records gradients."""
    dynamic = (op for op in tape.operations if _is_dynamic_type(type(op)))
    measurements = [op.base if isinstance(op, Conditional) else op for op in dynamic]
    return [
        m
        for m in measurements
        if _is_in_other_basis(m) and _is_differentiated(m.hyperparameters["angle"])
    ]


def _is_differentiated(value) -> bool:
    """Being differentiated, or maybe: traced by ``jax.jit``, whose derivative
    (``jax.grad(jax.jit(f))``) reaches the device later through PennyLane's JVP rule, past
    every check that sees the caller's values."""
    if _differentiation_depth(value) > 0 or _is_jit_traced(value):
        return True
    if math.get_interface(value) != "torch":
        return False
    import torch  # only reached with a torch value

    return bool(value.requires_grad) and torch.is_grad_enabled()


def _is_jit_traced(value) -> bool:
    return type(value).__name__ == "DynamicJaxprTracer"


@transform
def refuse_differentiated_measurement_bases(tape: QuantumScript, method: str):
    """Refuse a tape in which ``method``, a PennyLane gradient transform, would
    differentiate the angle of a ``qml.ftqc`` measurement basis
    (``measure_arbitrary_basis(w, angle=a, ...)``). The angle is a hyperparameter, not a
    parameter of the tape: the transform never sees it, and autograd returns 0 for its
    derivative (torch and jax fail inside PennyLane, under ``jax.jit`` for values too: a
    jit-traced angle is refused as well). The basis change that
    ``measure_in_computational_bases`` writes is a gate whose parameter the adjoint method
    differentiates, and so does a transform once ``qml.ftqc.diagonalize_mcms`` has written
    it into the QNode's tape."""
    differentiated = differentiated_measurement_bases(tape)
    if differentiated:
        jit = _is_jit_traced(differentiated[0].hyperparameters["angle"])
        raise DifferentiatedMeasurementBasisError(
            f"custatevec.qubit cannot differentiate the angle of {differentiated[0]} with "
            f"diff_method={method!r}: PennyLane's gradient transforms do not see a "
            "measurement's angle (autograd would return 0 for it"
            + ("; under jax.jit PennyLane fails on it, for values too" if jit else "")
            + "). Use diff_method='adjoint' (analytic), or apply qml.ftqc.diagonalize_mcms "
            "to the QNode, which makes the basis change gates that the transform "
            "differentiates."
        )
    return (tape,), _first_result


class ShotNoiseFallbackError(DeviceError):
    """Parameter-shift with shots would take a parameter's derivative by finite
    differences with a step of 1e-7: shot noise divided by the step."""


FALLBACK_STEP = 1e-7
"""The step of ``qml.gradients.finite_diff``, which ``param_shift`` calls, with its
defaults, for parameters of gates without a shift rule (PennyLane 0.45)."""


def refuse_shot_noise_fallback(tape: QuantumScript, fallback_given: bool) -> None:
    r"""Refuse a sampled tape that ``param_shift`` would differentiate partly by its
    finite-difference fallback: a differentiated parameter of a gate whose ``grad_method``
    is ``"F"`` (a conditional gate, ``qml.cond(m, qml.RX)``: PennyLane gives
    ``Conditional`` no shift rule; its decomposition keeps such gates), or one traced by
    ``jax.jit`` (``jax.grad(jax.jit(f))`` gave -18000 for -0.60). With shots, two
    estimates 1e-7 apart differ by their shot noise, about :math:`1/\sqrt{N}`, and the
    derivative comes out near :math:`10^7/\sqrt{N}` (measured: -24000 for a true -0.60 at
    5,000 shots, default.qubit alike), with no warning. ``fallback_given``: the user chose
    the fallback (``gradient_kwargs={"fallback_fn": ...}``), its step included."""
    if fallback_given or not tape.shots:
        return
    for op in tape.operations:
        # the data first: grad_method may compute an operator's parameter frequencies
        if any(map(_is_differentiated, op.data)) and getattr(op, "grad_method", None) == "F":
            jit = any(map(_is_jit_traced, op.data))
            raise ShotNoiseFallbackError(
                f"custatevec.qubit: diff_method='parameter-shift' with shots would "
                f"differentiate {op.name} by finite differences with a step of "
                f"{FALLBACK_STEP:g} (PennyLane gives it no shift rule), so the derivative "
                "would be shot noise divided by the step"
                + (
                    " (under jax.jit the device cannot tell whether a derivative follows)"
                    if jit
                    else ""
                )
                + ". Use diff_method='adjoint' without "
                "shots (analytic), diff_method='finite-diff' or 'spsa' with a step suited to "
                "the shots (gradient_kwargs={'h': ...}), or pass a fallback of your own: "
                "gradient_kwargs={'fallback_fn': functools.partial("
                "qml.gradients.finite_diff, h=...)}."
            )


@transform
def decompose_templates_for_gradients(tape: QuantumScript, array_gradients: bool):
    """Decompose the native templates (templates.py) whose trainable parameter would need
    a gradient the differentiation in use cannot hand back whole.

    A native template keeps its array parameter, so its gradient is an array of that
    shape. The device's VJP returns such arrays (``array_gradients``: adjoint with
    ``device_vjp=True``, or no differentiation); PennyLane's Jacobian contraction and
    its other gradient methods expect one entry per scalar, and its torch interface
    stacks a tape's VJPs, which needs every trainable parameter to have one shape. Other
    tapes keep their templates; the decomposed ones run gate by gate, as on other devices.
    It runs after the device's decomposition (which may make native templates) and
    decomposes a template straight to its native gates (``templates.template_operations``).
    """
    parameters = tape.get_parameters(trainable_only=False)
    trainable = [i for i, value in enumerate(parameters) if math.requires_grad(value)]
    templates = {
        tape.par_info[i]["op_idx"] for i in trainable if is_native_template(tape.par_info[i]["op"])
    }
    if not templates:
        return (tape,), _first_result
    shapes = {math.shape(parameters[i]) for i in trainable}
    if array_gradients and len(shapes) == 1:
        return (tape,), _first_result
    operations = []
    for position, op in enumerate(tape.operations):
        if position in templates:
            operations.extend(template_operations(op))
        else:
            operations.append(op)
    return (tape.copy(operations=operations),), _first_result


@transform
def gather_rotations(tape: QuantumScript):
    """Replace each run of two or more consecutive rotation gates (rotations.py) whose
    angles are scalars by one ``PauliRotations`` operation with their angles, in order.
    Broadcast gates stay as they are."""
    runs: list[list] = [[]]
    for op in tape.operations:
        if type(op) in _GATHERED and op.data and scalar_parameters(op):
            runs[-1].append(op)
        else:
            runs.append(op)
            runs.append([])
    if all(not isinstance(run, list) or len(run) < 2 for run in runs):
        return (tape,), _first_result
    operations = []
    for run in runs:
        if not isinstance(run, list):
            operations.append(run)
        elif len(run) >= 2:
            gates = tuple(gate_of(op) for op in run)
            operations.append(PauliRotations(*(op.data[0] for op in run), gates=gates))
        else:
            operations.extend(run)
    return (tape.copy(operations=operations),), _first_result


_GATHERED = frozenset(ROTATION_GATES)


@transform
def validate_adjoint_differentiation(
    tape: QuantumScript,
    batched: bool = False,
    through_state: bool = False,
    device_wires: Wires | None = None,
    array_gradients: bool = False,
):
    """Refuse, naming the reason, a circuit the adjoint method cannot differentiate.
    Trainable parameters are those that require a gradient in the ML framework. Runs after
    ``broadcast_expand`` (the tape is not broadcast) or, with ``batched`` (the deferred
    mode), after ``expand_broadcasts(trainable_only=True)``.

    With ``through_state`` it first rewrites the tape as ``measure_through_state`` (with
    ``device_wires`` and ``array_gradients``) and validates what will run: the device's
    preprocessing does both in one transform, so that a tape which passes unchanged (the
    common one) pays no second transform call."""
    if through_state:
        converted = _measured_through_state(tape, device_wires, array_gradients)
        if converted is not None:
            new_tape, postprocess = converted
            _require_adjoint_serves(new_tape, batched)
            return (new_tape,), postprocess
    _require_adjoint_serves(tape, batched)
    return (tape,), _first_result


def _require_adjoint_serves(tape: QuantumScript, batched: bool) -> None:
    """As ``require_adjoint_serves``, with the parameters that require a gradient as the
    trainable ones, except a matrix that ``left_whole_under_jit`` left whole: the forward
    pass runs, and its derivative is refused where it is asked for (device.py)."""
    trainable = {
        index
        for index, value in enumerate(tape.get_parameters(trainable_only=False))
        if math.requires_grad(value) and not left_whole_under_jit(tape.par_info[index]["op"])
    }
    broadcast = tape_batch_size(tape) is not None if batched else False
    require_adjoint_serves(tape, trainable, broadcast=broadcast, batched=batched)


@transform
def refuse_differentiated_shares(tape: QuantumScript, device_wires: Wires | None = None):
    """Refuse the adjoint method on a tape with trainable parameters that returns
    ``qml.state()`` or ``qml.probs()`` of every wire on a device with ``mpi_gather=False``:
    those results are each rank's share, and the cotangents of a share do not make a
    vector-Jacobian product of the whole."""
    every_wire = (0, len(device_wires or tape.wires))  # no wires: every wire
    shares = [
        mp
        for mp in tape.measurements
        if len(mp.wires) in every_wire
        and (
            isinstance(mp, StateMP)
            or (isinstance(mp, ProbabilityMP) and mp.obs is None and mp.mv is None)
        )
    ]
    if shares and tape.trainable_params:
        raise DeviceError(
            f"{shares[0]} returns each rank's share under mpi_gather=False, which the adjoint "
            "method cannot differentiate; use mpi_gather=True (whole results on every rank) "
            "to differentiate it, or measure expectation values."
        )
    return (tape,), _first_result


# Gradient transforms that difference the circuit's values as a black box: right for a
# postselecting circuit wherever they do not skip a parameter (see below).
_VALUE_DIFFERENCING_TRANSFORMS = ("finite_diff", "spsa_grad")


@transform
def refuse_complex_parameters_under_gradient_transforms(
    tape: QuantumScript, method: str, torch_records: bool = True
):
    """Refuse, naming the gate, a trainable coefficient of an exponential (``qml.exp``,
    ``Exp``) whose value has a nonzero imaginary part where ``method``, a PennyLane
    gradient transform, would differentiate it.

    The transforms shift and difference a parameter along the real axis only, and the
    framework's chain rule through a complex parameter ``c(t)`` needs its imaginary
    direction too: for ``qml.exp(G, -0.5j * t)`` (and ``qml.exp`` of a Pauli word)
    parameter-shift and finite differences return a derivative of exactly 0 where it is
    -0.91 (default.qubit returns those zeros too). A complex value with a zero imaginary
    part (``c(t)`` real, its derivative real) passes. Other operations' complex parameters
    pass: the transforms' expansions take a trainable matrix by rotation angles, and an
    untrainable one is a jax array that jax's interface marks trainable all the same.
    Only parameters whose derivative may be taken count (``_may_be_differentiated``); a
    jit-traced value, which cannot be checked, passes. The adjoint method takes an
    exponential by its real angle (``exponential_of_an_angle``)."""
    parameters = tape.get_parameters(trainable_only=False)
    for index in tape.trainable_params:
        operation, value = tape.par_info[index]["op"], parameters[index]
        if not isinstance(operation, qml.ops.Exp) or math.is_abstract(value):
            continue
        if not math.get_dtype_name(value).startswith("complex"):
            continue
        if not _may_be_differentiated(value, torch_records):
            continue
        if not math.any(math.imag(value) != 0):
            continue
        raise DeviceError(
            f"custatevec.qubit cannot take derivatives with diff_method={method!r} of the "
            f"complex-valued parameter {index} of {operation.name} on wires "
            f"{operation.wires.tolist()} (value {complex(math.toarray(value).flat[0])!r}): "
            "PennyLane's gradient transforms shift and difference parameters along the "
            "real axis only and would return a wrong derivative (0 for qml.exp(G, -1j * t), "
            "as default.qubit does). Use diff_method='adjoint' (or 'best'), which takes an "
            "exponential of a Hermitian G by its real angle, or write it as "
            "qml.evolve(G, t), whose parameter t is real."
        )
    return (tape,), _first_result


_REFUSED_BY_PENNYLANE = (StateMP, VnEntropyMP, MutualInfoMP)
"""The returns that PennyLane's shift-rule transforms refuse themselves
(``gradients.gradient_transform.assert_no_state_returns``; the density matrix is a
``StateMP``)."""


@transform
def refuse_purity_under_gradient_transforms(
    tape: QuantumScript, method: str, torch_records: bool = True
):
    r"""Refuse ``qml.purity`` where ``method``, a PennyLane gradient transform that does
    not difference values, would differentiate it.

    The purity :math:`\mathrm{Tr}\,\rho^2` of a reduced state is quadratic in the state,
    and the rules of parameter-shift, the Hadamard tests and the pulse gradients hold for
    results linear in it (expectation values, probabilities). PennyLane's transforms
    refuse the state, the density matrix, the von Neumann entropy and the mutual
    information (``assert_no_state_returns``) but not the purity. Measured on default.qubit
    and here alike, for ``RX(a, 0); CNOT(0, 1); RY(b, 1); CRZ(c, [1, 0]);
    purity(wires=[0])``, whose gradient is (-0.339, 0.006, -0.013):

    * parameter-shift gives (0, 0, -0.013);
    * direct-hadamard gives (0, 0, 0);
    * hadamard and reversed-hadamard crash in PennyLane (a ``TypeError`` and an
      ``AttributeError``).

    Finite differences and SPSA difference values and are right. The adjoint method
    differentiates the purity exactly (``gradients.common``). A tape that also returns
    what PennyLane's transforms refuse (``_REFUSED_BY_PENNYLANE``) gets PennyLane's error.
    Only parameters whose derivative may be taken count (``_may_be_differentiated``): a
    forward evaluation runs.
    """
    if method in _VALUE_DIFFERENCING_TRANSFORMS:
        return (tape,), _first_result
    purity = next((mp for mp in tape.measurements if isinstance(mp, PurityMP)), None)
    if purity is None or any(isinstance(mp, _REFUSED_BY_PENNYLANE) for mp in tape.measurements):
        return (tape,), _first_result  # PennyLane's own error names the tape's state returns
    parameters = tape.get_parameters(trainable_only=False)
    if not any(_may_be_differentiated(parameters[p], torch_records) for p in tape.trainable_params):
        return (tape,), _first_result
    raise DeviceError(
        f"custatevec.qubit cannot differentiate qml.purity(wires={purity.wires.tolist()}) "
        f"with diff_method={method!r}: the "
        "purity Tr(rho^2) is quadratic in the state, and that method's rule holds only for "
        "results linear in it (PennyLane's transform returns wrong derivatives or fails "
        "there, on default.qubit too). Use diff_method='adjoint' (or 'best'), which "
        "differentiates the purity exactly, or diff_method='finite-diff'."
    )


@transform
def refuse_postselection_under_gradient_transforms(
    tape: QuantumScript, method: str, torch_records: bool = True
):
    r"""Refuse a tape that postselects a mid-circuit measurement where ``method``, a
    PennyLane gradient transform, would give wrong derivatives of it, and let the others
    through (PennyLane issue #5943: default.qubit returns those wrong numbers).

    A postselecting circuit's result is a ratio :math:`f(x) = N(x) / D(x)`, where
    :math:`D` is the probability of the postselected outcomes and :math:`N` the
    unnormalised expectation. Two things go wrong in the transforms:

    * All of them skip a parameter whose gate has no path in the circuit graph (wires and
      classical conditions) to a terminal measurement, taking its derivative to be 0. A
      gate with a path to a postselection changes :math:`D` and so the result: such a
      parameter's derivative is not 0 (``H(0); CNOT(0, 1); RX(x, 1); measure(1,
      postselect=1); expval(Z(0))``: the transforms give 0, the derivative is 0.49).
    * Parameter-shift and Hadamard-test gradients rely on the result being linear in the
      state: :math:`N` is, :math:`N / D` is not where :math:`D` depends on the parameter.

    So finite differences and SPSA (which difference values) are right unless a parameter
    reaches a postselection and no terminal measurement; parameter-shift, Hadamard and
    any other transform are right only if no trainable parameter reaches a postselection
    (then :math:`D` is a constant). The tape's own graph decides, as it does for the
    transforms. A ``qml.Projector`` applied as a gate is a postselection too: the state is
    renormalised after it, here and on default.qubit. Only parameters whose derivative may
    be taken count (``_may_be_differentiated``): a forward evaluation runs. So does a tape
    whose results no framework differentiates (``_integer_or_counted_results``): under
    ``jax.jit`` this preprocessing runs inside PennyLane's callback, where every parameter
    is a jax value, for a forward evaluation too. The adjoint method differentiates
    postselection itself (``gradients.eager``), exactly.
    """
    postselections = [index for index, op in enumerate(tape.operations) if _postselects(op)]
    if not postselections or _integer_or_counted_results(tape):
        return (tape,), _first_result
    parameters = tape.get_parameters(trainable_only=False)
    differentiated = [
        p for p in tape.trainable_params if _may_be_differentiated(parameters[p], torch_records)
    ]
    if not differentiated:
        return (tape,), _first_result
    graph, n_ops = tape.graph, len(tape.operations)
    measurements = range(n_ops, n_ops + len(tape.measurements))
    values_only = method in _VALUE_DIFFERENCING_TRANSFORMS
    for param in differentiated:
        op_index = tape.par_info[param]["op_idx"]
        if op_index >= n_ops:  # a measurement's parameter: after every postselection
            continue
        # a Projector's own parameter (its basis) is not differentiable
        reached = [p for p in postselections if p != op_index and graph.has_path_idx(op_index, p)]
        if not reached:
            continue
        if values_only and any(graph.has_path_idx(op_index, m) for m in measurements):
            continue
        op, postselection = tape.operations[op_index], tape.operations[reached[0]]
        gate = f"{op.name} on wires {op.wires.tolist()}"
        why = (
            f"and reaches no measured wire, so {method} takes its derivative to be 0"
            if values_only
            else f"and {method}'s rule does not hold for the renormalised result"
        )
        raise DeviceError(
            f"custatevec.qubit cannot differentiate this circuit with {method}: trainable "
            f"parameter {param} ({gate}) changes the probability of the "
            f"{_postselection_name(postselection)} {why} (PennyLane issue #5943; "
            "default.qubit returns such wrong derivatives). Use diff_method='finite-diff' "
            "where every trainable gate reaches a measured wire; else evaluate it with "
            "parameters that are not trainable or diff_method=None, or differentiate it on "
            "default.qubit with diff_method='backprop'."
            + (_JIT_CONSTANTS if math.get_interface(parameters[param]) == "jax" else "")
        )
    return (tape,), _first_result


_JIT_CONSTANTS = (
    " Under jax.jit PennyLane passes every gate parameter of the derivative's circuits as "
    "a jax value, so a constant gate that reaches the postselection counts as trainable "
    "there: differentiate such a circuit without jax.jit."
)


def _postselects(op: Operator) -> bool:
    """A postselected mid-circuit measurement, or a ``qml.Projector`` applied as a gate:
    the simulation renormalises the state after it (default.qubit too), so the result is
    the same ratio N(x) / D(x) as a postselection's."""
    if isinstance(op, qml.ops.MidMeasure):
        return op.postselect is not None
    return isinstance(op, qml.Projector)


def _postselection_name(op: Operator) -> str:
    if isinstance(op, qml.ops.MidMeasure):
        return f"postselection on wire {op.wires.tolist()[0]}"
    return f"postselection by the Projector gate on wires {op.wires.tolist()}"


def _integer_or_counted_results(tape: QuantumScript) -> bool:
    """Whether every result of ``tape`` is one that no framework differentiates: samples of
    wires or of mid-circuit measurement values (integers: jax refuses to differentiate
    them, torch gives them no gradient) and counts (dictionaries). Samples of an observable
    are floats, which PennyLane's transforms do differentiate shot by shot."""
    return all(
        isinstance(m, CountsMP) or (isinstance(m, SampleMP) and m.obs is None)
        for m in tape.measurements
    )


def _may_be_differentiated(value, torch_records: bool) -> bool:
    """Whether a trainable parameter's derivative may be taken of this evaluation.

    The device's preprocessing runs, for a gradient transform, on every execution: the
    call's tape, whose trainable parameters are the interface's, and the transform's
    shifted tapes, on which every parameter is trainable. So a parameter counts by its
    value: an autograd box (an autograd derivative boxes exactly what it differentiates;
    a bare ``pennylane.numpy`` tensor, ``requires_grad=True`` by default, is a
    forward-only evaluation); a torch tensor that requires grad where the call recorded
    gradients (``torch_records``: not under ``torch.no_grad()``); any jax value (jax's
    interface marks as trainable what it differentiates, every parameter under
    ``jax.jit``). A constant (Python or numpy number) never counts."""
    if isinstance(value, Box):
        return True
    interface = math.get_interface(value)
    if interface == "torch":
        return bool(value.requires_grad) and torch_records
    return interface == "jax"


class SecondDerivativesError(DeviceError):
    """A second derivative asked for where the device's derivatives would be taken as
    constants (a zero Hessian): beyond ``max_diff`` (``refuse_higher_derivatives``) or
    inside torch's backward pass with ``create_graph=True`` (device.py)."""


_DIFFERENTIATING_TRACERS = frozenset({"JVPTracer", "LinearizeTracer", "JaxprTracer"})
"""jax's tracers of a derivative being taken (forward mode, linearization, partial
evaluation); batching (``BatchTracer``) and jit (``DynamicJaxprTracer``) are not."""


def _differentiation_depth(value) -> int:
    """How many derivatives are being taken of ``value``: nested autograd boxes, or
    nested jax differentiation tracers (``_DIFFERENTIATING_TRACERS``)."""
    depth = 0
    while True:
        if isinstance(value, Box):
            depth += 1
            value = value._value
            continue
        name = type(value).__name__
        if not name.endswith("Tracer") or not type(value).__module__.startswith("jax"):
            return depth
        if name in _DIFFERENTIATING_TRACERS:
            depth += 1
        inner = getattr(value, "primal", None) if name != "BatchTracer" else value.val
        if inner is None:
            return depth
        value = inner


AUTOGRAD_DERIVATIVE_ORDERS = 2
"""The highest derivative PennyLane 0.45's autograd interface differentiates (measured:
``qml.jacobian`` three times of a parameter-shift QNode with ``max_diff=3`` gives zeros,
on default.qubit too; torch and jax give the third derivatives)."""


@transform
def refuse_higher_derivatives(
    tape: QuantumScript, method: str, order: int = 1, autograd: bool = False, hidden: int = 0
):
    """Refuse a tape whose parameters are traced for more derivatives than ``order``
    (``max_diff``; autograd's ``qml.jacobian(qml.grad(f))``, ``jax.hessian``), or, with
    ``autograd``, for more than ``AUTOGRAD_DERIVATIVE_ORDERS``: PennyLane's interfaces
    then differentiate the innermost derivatives as constants, and the higher ones come
    out zero, with no error (on every device, for every gradient method but
    backpropagation). ``hidden``: the levels PennyLane's interface takes off before the
    tapes reach this (its jax interface with a gradient transform: each of the ``order``
    differentiable levels is a ``custom_jvp`` whose rule sees the primal without its
    tracer; measured, ``jax.hessian`` under ``max_diff=1`` shows one level here)."""
    highest = min(order, AUTOGRAD_DERIVATIVE_ORDERS) if autograd else order
    seen = max(map(_differentiation_depth, tape.get_parameters(trainable_only=False)), default=0)
    if not seen or seen + hidden <= highest:
        return (tape,), _first_result
    depth = seen + hidden
    if order == 1:
        raise SecondDerivativesError(
            f"custatevec.qubit cannot take second derivatives with diff_method={method!r} "
            "and max_diff=1: PennyLane would differentiate the first derivatives as "
            "constants and return a zero Hessian. Set max_diff=2 on the QNode with "
            "diff_method='parameter-shift' (or 'best', which picks it then)."
        )
    if depth <= order:  # autograd beyond its reach
        raise SecondDerivativesError(
            f"custatevec.qubit cannot take derivatives of order {depth} through autograd "
            f"(diff_method={method!r}, max_diff={order}): PennyLane's autograd interface "
            f"returns zeros beyond order {AUTOGRAD_DERIVATIVE_ORDERS}. Use interface='torch' "
            "or 'jax' with max_diff set to the order."
        )
    raise SecondDerivativesError(
        f"custatevec.qubit cannot take derivatives of order {depth} with "
        f"diff_method={method!r} and max_diff={order}: PennyLane would differentiate the "
        f"derivatives of order {order} as constants and return zeros. Set max_diff={depth} "
        "on the QNode (with torch or jax beyond order 2)."
    )


@transform
def refuse_autograd_hessians_of_alike_measurements(tape: QuantumScript, method: str):
    """Refuse a tape traced by autograd for a second derivative (nested autograd boxes)
    whose several measurements all have one shape (expectation values and variances, or
    probabilities of as many wires each). PennyLane 0.45's autograd interface returns
    zero second derivatives through such a tape under ``max_diff=2`` with a gradient
    transform, with no error, on every device (default.qubit's parameter-shift too;
    measured: ``qml.jacobian(qml.jacobian(f))`` with f stacking or indexing the results
    of ``(expval, expval)``, ``(expval, var)``, ``(probs(0), probs(1))``), while tapes
    whose measurements differ in shape, torch and jax are right. First derivatives
    (one box) pass."""
    measurements = tape.measurements
    if len(measurements) < 2:
        return (tape,), _first_result
    if not any(_differentiation_depth(v) > 1 for v in tape.get_parameters(trainable_only=False)):
        return (tape,), _first_result
    shots, wires = tape.shots.total_shots, len(tape.wires)
    shapes = {tuple(mp.shape(shots, wires)) for mp in measurements}
    if len(shapes) == 1:
        raise SecondDerivativesError(
            f"custatevec.qubit cannot take second derivatives with autograd and "
            f"diff_method={method!r} of a circuit whose {len(measurements)} measurements "
            f"all have the shape {shapes.pop()}: PennyLane's autograd interface returns "
            "zero second derivatives for it. Use interface='torch' or 'jax' (right), or "
            "return measurements of different shapes (one probs over all their wires, or "
            "the measurements of one shape from a QNode of their own)."
        )
    return (tape,), _first_result


class TracedDecompositionError(DeviceError):
    """A decomposition the adjoint method needs that cannot run on jit-traced parameters
    (PennyLane's ``SpecialUnitary`` compares its angles with zero while decomposing).
    No other of PennyLane's gradient methods runs there either (parameter-shift and
    finite differences meet the same decomposition), so ``"best"`` says so too."""


def _is_concretization_error(error: Exception) -> bool:
    """jax's errors of a traced value used as a concrete one (``bool(tracer)``,
    ``float(tracer)``): subclasses of its ``ConcretizationTypeError``."""
    return any(
        kind.__name__ == "ConcretizationTypeError" and kind.__module__.startswith("jax")
        for kind in type(error).__mro__
    )


def decomposition_of(op: Operator) -> list[Operator]:
    """``op.decomposition()``, except for an exponential of an angle
    (``exponential_of_an_angle``: ``qml.exp(G, c)`` of a Hermitian ``G``, scalar products
    folded into ``c``, with ``c`` imaginary: ``exp(c G) = exp(-i x G)`` with
    ``x = real(1j c)``), which becomes the gate of that real angle: ``PauliRot(2 x)`` for a
    Pauli word, PennyLane's ``Evolution(G, x)`` for any other ``G``; and for an
    ``Evolution`` of a Pauli word (``TrotterProduct``'s terms), its ``PauliRot``. PennyLane's own
    decomposition fails for three of them: a torch coefficient (it takes autoray's
    ``real_if_close``, which has no torch function: an ``ImportError`` on every method,
    ``diff_method=None`` too, for ``TrotterProduct`` and ``QDrift`` with a torch time;
    default.qubit applies the ``Exp`` by its matrix), a broadcast coefficient (``bool`` of
    an array), and a base that is not a Pauli word (none; under ``jax.jit`` it compares the
    traced coefficient with generators'). The framework records ``x(c)``, so it
    differentiates through the complex coefficient."""
    angle_form = _angle_form(op)
    if angle_form is None:
        return op.decomposition()
    base, coefficient = angle_form
    with QueuingManager.stop_recording():
        angle = math.real(1j * coefficient)
        if qml.pauli.is_pauli_word(base):
            word = qml.pauli.pauli_word_to_string(base)
            return [qml.PauliRot(2 * angle, word, wires=base.wires)]
        if type(op) is qml.ops.Exp:
            return [qml.ops.Evolution(base, angle)]
    return op.decomposition()  # an Evolution (of a real angle already) of another base


def exponential_of_an_angle(op: Operator) -> bool:
    """Whether ``op`` is a ``qml.exp`` (an ``Exp``, not PennyLane's ``Evolution``) of a
    Hermitian base without parameters of its own (but for scalar products, folded into the
    coefficient) whose coefficient ``c`` is imaginary (its real part exactly 0, or traced
    by ``jax.jit``, where PennyLane assumes so too): ``exp(c G)`` is then the evolution
    ``exp(-i x G)`` by the real angle ``x = real(1j c)``.

    Its parameter is the complex ``c``, not an angle: the adjoint method differentiating it
    by its generator as an angle gave 0 (torch: the chain rule through ``c = -1j t / 2``
    takes the real part of a real derivative times ``-1j / 2``), so the device rewrites it
    by its angle first, where the framework records."""
    return type(op) is qml.ops.Exp and _angle_form(op) is not None


def _angle_form(op: Operator) -> tuple[Operator, object] | None:
    """``(G, c)`` with ``op = exp(c G)`` as ``exponential_of_an_angle`` describes (an
    ``Evolution`` too, whose ``c`` is ``-1j`` times its real angle), or None."""
    if not isinstance(op, qml.ops.Exp):
        return None
    with QueuingManager.stop_recording():
        base, coefficient = op.base.simplify(), op.coeff
    while isinstance(base, SProd):
        base, coefficient = base.base, base.scalar * coefficient
    if base.num_params != 0 or not base.is_verified_hermitian:
        return None
    if math.is_abstract(coefficient) or bool(math.allequal(math.real(coefficient), 0)):
        return base, coefficient
    return None


@transform
def decompose_traced(tape: QuantumScript, **options):
    """PennyLane's ``decompose`` (with the device's ``options``), refusing by name a
    decomposition that fails on jax.jit-traced parameters (``TracedDecompositionError``)
    instead of jax's ``TracerBoolConversionError`` from inside it. Each operator decomposes
    by ``decomposition_of``."""
    try:
        return decompose(tape, decomposer=decomposition_of, **options)
    except TypeError as error:
        if not _is_concretization_error(error):
            raise
        stops = options["stopping_condition"]
        traced = sorted(
            {
                op.name
                for op in tape.operations
                if not stops(op) and any(math.is_abstract(d) for d in op.data)
            }
        )
        raise TracedDecompositionError(
            f"The adjoint method differentiates {', '.join(traced) or 'an operation'} through "
            "its decomposition, which needs concrete parameters, and jax.jit traces them "
            "(under jax.jit every traced parameter counts as trainable). Call the QNode "
            "without jax.jit (values and derivatives are right there), or with "
            "diff_method=None under jax.jit for values only; default.qubit's "
            "diff_method='backprop' differentiates it under jax.jit."
        ) from error


class TracedPulseTimesError(DeviceError):
    """A pulse whose times ``jax.jit`` traces (``qml.evolve(H)(params, t)`` with ``t`` an
    argument of the jitted function)."""


def refuse_traced_pulse_times(tape: QuantumScript, adjoint: bool) -> None:
    """Refuse a pulse whose evolution times are traced by ``jax.jit`` where the pulse would
    reach PennyLane's jit callback: that callback hands the device concrete parameters but
    leaves the times (a hyperparameter) traced, and jax raised ``UnexpectedTracerError``
    from inside it (PennyLane's ``test_rydberg.py`` ``test_pennylane_and_exact_solution_
    correspond``, routed to this device). With the adjoint method (``adjoint``) a pulse with
    parameters is taken by its matrix's entries where jax traces
    (``entrywise_trainable_operators``; under ``jax.jit`` every parameter is trainable),
    traced times included, and never reaches the callback. Called where the trace sees the
    QNode's tape (``setup_execution_config``): from the preprocessing, which runs inside
    the callback for gradient transforms, the error would reach the user wrapped in jax's
    ``XlaRuntimeError``. One name comparison per operation."""
    for op in tape.operations:
        if op.name != "ParametrizedEvolution" or not math.is_abstract(op.t):
            continue
        if adjoint and _entrywise(op):
            continue
        raise TracedPulseTimesError(
            f"custatevec.qubit cannot evolve the pulse on wires {op.wires.tolist()} "
            "under jax.jit with traced times here: it computes this pulse's matrix inside "
            "PennyLane's jit callback, which receives the pulse's parameters but not its "
            "times (with diff_method='adjoint' or 'best' a pulse with parameters on at most "
            f"{MAX_ENTRYWISE_QUBITS} wires is computed where jax traces). Pass the times as "
            "constants of the jitted function (close over them), call the QNode without "
            "jax.jit, or use default.qubit, which traces the evolution."
        )


@transform
def allocate_dynamic_wires(tape: QuantumScript, wires: Wires | None, allow_resets: bool):
    """PennyLane's ``device_resolve_dynamic_wires`` (work wires that ``qml.allocate`` and
    decompositions such as TemporaryAnd's allocate take the device's free wires) for a
    tape that allocates; any other passes as it is (PennyLane's rebuilds every tape:
    about 20 us for 47 gates, measured with timeit)."""
    if not any(op.name == "Allocate" for op in tape.operations):
        return (tape,), _first_result
    return device_resolve_dynamic_wires(tape, wires=wires, allow_resets=allow_resets)


@transform
def snapshots_as_circuits(tape: QuantumScript, debugger, deferred: bool = False):
    """Under ``qml.snapshots`` (``debugger`` active): each ``qml.Snapshot`` becomes a
    circuit of the operations before it that measures the snapshot's measurement, analytic
    or with its shots (``"workflow"``: the tape's), with no trainable parameters; the
    results go into ``debugger.snapshots`` as default.qubit stores them (a tag seen again
    collects a list), and the tape's own result, its snapshots removed, is returned. A
    device-side split, unlike PennyLane's fallback for devices without a debugger, so
    that a state snapshot of a circuit with shots is the exact state, as on
    default.qubit.

    With ``deferred`` (``mcm_method="deferred"``) a state snapshot after mid-circuit
    measurements is the state of the deferred circuit, its measurements' wires included,
    as default.qubit records it (``_deferred_operations``): PennyLane's
    ``defer_measurements`` refuses a state measurement."""
    if debugger is None or not debugger.active:
        return (tape,), _first_result
    snapshots = [i for i, op in enumerate(tape.operations) if isinstance(op, qml.Snapshot)]
    if not snapshots:
        return (tape,), _first_result
    operations = [op for op in tape.operations if not isinstance(op, qml.Snapshot)]
    tapes, tags = [], []
    for count, index in enumerate(snapshots):
        op = tape.operations[index]
        shots = op.hyperparameters["shots"]
        shots = tape.shots if shots == "workflow" else shots
        before = operations[: index - count]
        measurement = op.hyperparameters["measurement"]
        if deferred and type(measurement) is StateMP and not shots:
            before = _deferred_operations(before)
        tapes.append(
            tape.copy(
                operations=before, measurements=[measurement], shots=shots, trainable_params=[]
            )
        )
        tags.append(op.tag)
    tapes.append(tape.copy(operations=operations))

    def record(results):
        for tag, snapshot in zip(tags, results[:-1], strict=True):
            _store_snapshot(debugger, tag, snapshot)
        return results[-1]

    return tapes, record


def _deferred_operations(operations: list[Operator]) -> list[Operator]:
    """``operations`` with their mid-circuit measurements deferred (PennyLane's
    ``defer_measurements``, as the device's preprocessing runs it), for a state snapshot:
    the state then spans the measurements' wires too."""
    if not any(isinstance(op, MidMeasure) for op in operations):
        return operations
    wires = Wires.all_wires([op.wires for op in operations])
    probe = QuantumScript(operations, [qml.probs(wires=wires)])
    (deferred,), _ = defer_measurements(probe, allow_postselect=True)
    return deferred.operations


def _store_snapshot(debugger, tag, snapshot) -> None:
    """default.qubit's storage (``apply_snapshot``): an untagged snapshot under the next
    index; a tag seen again collects a list."""
    if tag is None:
        debugger.snapshots[len(debugger.snapshots)] = snapshot
    elif tag not in debugger.snapshots:
        debugger.snapshots[tag] = snapshot
    elif isinstance(debugger.snapshots[tag], list):
        debugger.snapshots[tag].append(snapshot)
    else:
        debugger.snapshots[tag] = [debugger.snapshots[tag], snapshot]


@transform
def one_shot_where_sampled(tape: QuantumScript, postselect_mode: str | None = None):
    """PennyLane's ``dynamic_one_shot`` for a tape with shots, and nothing for one without:
    ``mcm_method="tree-traversal"`` samples as the one-shot method (the same distribution,
    shot by shot, in memory of a chunk of shots) and follows every branch analytically
    (``branches.py``)."""
    if not tape.shots:
        return (tape,), _first_result
    return qml.transforms.dynamic_one_shot(tape, postselect_mode=postselect_mode)


@transform
def expand_broadcasts(
    tape: QuantumScript, trainable_only: bool = False, mid_measurements_only: bool = False
):
    """``broadcast_expand``, with ``trainable_only`` only for a tape in which a broadcast
    parameter is trainable (its gradient has one entry per broadcast entry): the deferred
    mode differentiates other broadcast tapes whole, as one batch, but for a tape with an
    ``EntrywiseUnitary`` or a postselection, which the eager sweep differentiates (one
    vector); with
    ``mid_measurements_only`` only for an analytic tape with mid-circuit measurements (the
    tree traversal follows the branches of one state).

    The expanded tapes' operations are rebuilt where PennyLane's parameter binding kept a
    stale batch size (MultiRZ, PCPhase, their controlled and adjoint forms in 0.45), so
    that no expanded tape claims to be broadcast."""
    if tape_batch_size(tape) is None:
        return (tape,), _first_result
    if mid_measurements_only and (
        tape.shots or not any(isinstance(op, qml.ops.MidMeasure) for op in tape.operations)
    ):
        return (tape,), _first_result
    if trainable_only and not any(
        (is_broadcast(op) and any(math.requires_grad(d) for d in op.data))
        or isinstance(op, (EntrywiseUnitary, EntrywiseState, qml.Projector))  # eager's only
        for op in tape.operations
    ):
        return (tape,), _first_result
    tapes, recombine = _broadcast_expand(tape)
    rebuilt = [
        t.copy(
            operations=[_rebuilt(op) for op in t.operations], trainable_params=t.trainable_params
        )
        for t in tapes
    ]
    return rebuilt, recombine


def _broadcast_expand(tape: QuantumScript):
    """PennyLane's ``broadcast_expand``, with each operator broadcast by its
    hyperparameters (a power over its exponent, a pulse over its times) written as its
    matrices first: the expansion splits operators' parameters, and an exponent or a time
    is not one (the expansion recursed without end)."""
    if any(map(is_broadcast_by_hyperparameters, tape.operations)):
        tape = tape.copy(operations=[_broadcast_as_matrix(op) for op in tape.operations])
    if any(_lacks_parameter_dimensions(op) for op in tape.operations):
        tape = tape.copy(operations=[_with_parameter_dimensions(op) for op in tape.operations])
    return broadcast_expand(tape)


def _lacks_parameter_dimensions(op: Operator) -> bool:
    """Whether PennyLane's expansion cannot split ``op``: a broadcast ``qml.exp`` has no
    ``ndim_params`` in 0.45 (AttributeError)."""
    if op.batch_size is None:
        return False
    try:
        op.ndim_params  # noqa: B018
    except AttributeError:
        return isinstance(op, qml.ops.op_math.Exp)
    return False


def _with_parameter_dimensions(op: Operator) -> Operator:
    """A copy of a broadcast ``qml.exp`` that knows its parameters' dimensions (its scalar
    coefficient, then its base's), which the expansion reads to split it."""
    if not _lacks_parameter_dimensions(op):
        return op
    op = copy.copy(op)
    op._ndim_params = (0, *op.base.ndim_params)
    return op


def _broadcast_as_matrix(op):
    if not is_broadcast_by_hyperparameters(op):
        return op
    if any(math.requires_grad(d) for d in op.data):
        kind, over, entry = (
            ("a power", "exponent", "exponents; write one power per exponent")
            if is_broadcast_power(op)
            else ("a pulse", "intermediate times", "times; write one pulse per time")
        )
        raise DeviceError(
            f"custatevec.qubit cannot differentiate {op.name}, {kind} broadcast over its "
            f"{over} with trainable parameters: the adjoint method expands it into one "
            f"circuit per entry, and PennyLane's expansion splits parameters, not {entry}."
        )
    return qml.QubitUnitary(op.matrix(), wires=op.wires)


def _rebuilt(op):
    return op if op.batch_size is None else unflatten(*flatten(op))


MAX_MEASURED_VALUE_WIRES = 10
"""The most deferred measurements a measured value of them may combine for
``measure_mid_circuit_values_on_their_wires`` (its Z sentence has up to 2**k words)."""


@transform
def measure_mid_circuit_values_on_their_wires(tape: QuantumScript):
    r"""For the adjoint method, after ``defer_measurements``: measure what a tape returns of
    mid-circuit measurement values on the wires that hold them.

    Deferred, measurement k's outcome is the computational basis value :math:`b_k` of its
    wire (which later gates only control on), so, with :math:`e_b` the value's
    eigenvalues (``mp.eigvals()``, over the measurements' wires in order):

    * ``expval(f(m))`` and ``var(f(m))`` are those of the diagonal observable
      :math:`D = \sum_b e_b |b\rangle\langle b|`, written exactly as a sum of Z words,
      :math:`D = \sum_S c_S Z_S` with :math:`c_S = 2^{-k} \sum_b e_b (-1)^{|b \cap S|}`
      (a Walsh-Hadamard transform), which the adjoint sweep differentiates;
    * ``probs(op=[m0, m1, ...])`` of bare measurements is ``probs`` of their wires.

    PennyLane's parameter-shift, which "best" took for such tapes, fails on ``var`` of a
    measured value (``AttributeError: 'NoneType' object has no attribute 'name'``, on
    default.qubit too). A tape that still holds mid-circuit measurements (another
    ``mcm_method``), a value of more than ``MAX_MEASURED_VALUE_WIRES`` measurements, and
    other measurements of values (``probs`` of a computed value, samples, counts) pass
    unchanged, and the adjoint method refuses them by name as before."""
    if not any(mp.mv is not None for mp in tape.measurements) or any(
        isinstance(op, MidMeasure) for op in tape.operations
    ):
        return (tape,), _first_result
    measurements = [_on_their_wires(mp) for mp in tape.measurements]
    if all(new is old for new, old in zip(measurements, tape.measurements, strict=True)):
        return (tape,), _first_result
    return (tape.copy(measurements=measurements),), _first_result


def _on_their_wires(mp):
    """``mp`` measured on its values' wires (``measure_mid_circuit_values_on_their_wires``),
    or ``mp`` itself."""
    if mp.mv is None or len(mp.wires) > MAX_MEASURED_VALUE_WIRES:
        return mp
    if isinstance(mp, ProbabilityMP):
        values = mp.mv if isinstance(mp.mv, list) else [mp.mv]
        bare = all(
            isinstance(v, MeasurementValue) and not v.has_processing and len(v.measurements) == 1
            for v in values
        )
        return qml.probs(wires=mp.wires) if bare else mp
    if isinstance(mp, (ExpectationMP, VarianceMP)) and isinstance(mp.mv, MeasurementValue):
        observable = _diagonal_as_z_words(np.asarray(mp.eigvals(), dtype=float), mp.wires)
        return type(mp)(obs=observable)
    return mp


def _diagonal_as_z_words(eigenvalues: np.ndarray, wires: Wires) -> Operator:
    """The diagonal observable with ``eigenvalues`` on ``wires`` (the first wire the most
    significant bit) as a sum of Z words (``measure_mid_circuit_values_on_their_wires``)."""
    k = len(wires)
    coefficients = eigenvalues.reshape((2,) * k)
    for axis in range(k):  # Walsh-Hadamard along each bit: (e0 + e1, e0 - e1) / 2
        first, second = np.take(coefficients, 0, axis=axis), np.take(coefficients, 1, axis=axis)
        coefficients = np.stack([(first + second) / 2, (first - second) / 2], axis=axis)
    sentence = qml.pauli.PauliSentence()
    for index in np.ndindex(*coefficients.shape):
        coefficient = float(coefficients[index])
        if coefficient != 0.0:
            word = {wires[j]: "Z" for j, bit in enumerate(index) if bit}
            sentence[qml.pauli.PauliWord(word)] = coefficient
    if not sentence:
        sentence[qml.pauli.PauliWord({})] = 0.0
    return sentence.operation(wire_order=wires)


@transform
def measure_through_state(
    tape: QuantumScript, device_wires: Wires | None = None, array_gradients: bool = False
):
    """For the adjoint method: measure the state in place of what the sweep does not
    differentiate, and compute those results from it in the post-processing, where the ML
    framework differentiates that computation and the device the state (one VJP bra, or
    the state's Jacobian, for all of them).

    Taken from the state (one ``StateMP`` on all the wires, appended to the measurements
    the sweep differentiates, which stay as they are):

    * every measurement of the state other than expval, var, probs and state:
      ``density_matrix``, ``purity``, ``vn_entropy``, ``mutual_info``, ... through their
      ``process_state``;
    * an expval or var whose observable has trainable data the device cannot hand back
      in the form PennyLane needs, as Re tr(rho O) and Re tr(rho O^2) - <O>^2 with rho the
      reduced density matrix on O's wires and O = ``qml.matrix(obs)`` of the framework's
      data: data that is neither a scalar coefficient nor a Hermitian matrix
      (``common.observable_derivatives``); or a Hermitian matrix when the device's
      gradient cannot be a matrix: with device Jacobians (PennyLane's Jacobian
      contraction takes one entry per scalar), with device VJPs when the trainable
      parameters differ in shape (PennyLane's torch interface stacks a tape's VJPs, as
      for native templates, see ``decompose_templates_for_gradients``), and for a
      complex matrix (whose gradient convention is the framework's own: torch's is the
      conjugate of autograd's).

    ``array_gradients``: the device computes VJPs (``device_vjp=True``). Tapes with only
    expval, var, probs and state measurements and no trainable observable data, and
    tapes with shots (refused later: the adjoint method is analytic) pass unchanged.
    (The device's preprocessing applies it inside ``validate_adjoint_differentiation``.)
    """
    converted = _measured_through_state(tape, device_wires, array_gradients)
    if converted is None:
        return (tape,), _first_result
    new_tape, postprocess = converted
    return (new_tape,), postprocess


def _measured_through_state(tape: QuantumScript, device_wires, array_gradients: bool):
    """(the converted tape, its post-processing) of ``measure_through_state``, or None
    where the tape passes unchanged."""
    derived = [
        i
        for i, mp in enumerate(tape.measurements)
        if isinstance(mp, StateMeasurement) and not is_swept(mp)
    ]
    # the data of an observable with a Pauli form are its coefficients, which the device
    # differentiates: only the others may need the state (and asking a composite for its
    # data rebuilds them)
    observed = [
        i
        for i, mp in enumerate(tape.measurements)
        if isinstance(mp, _OBSERVABLE_MEASUREMENTS)
        and mp.obs is not None
        and mp.obs.pauli_rep is None
        and mp.obs.data
    ]
    if (not derived and not observed) or tape.shots:
        return None
    if observed:
        derived += _observables_through_state(tape, observed, array_gradients)
    if not derived:
        return None
    derived = sorted(derived)
    wires = Wires(device_wires) if device_wires is not None else tape.wires
    kept = [mp for i, mp in enumerate(tape.measurements) if i not in derived]
    with QueuingManager.stop_recording():
        state = StateMP(wires=wires)
    converted = tape.copy(measurements=[*kept, state])
    return converted, _from_state(tape.measurements, derived, wires)


_OBSERVABLE_MEASUREMENTS = (ExpectationMP, VarianceMP)


def _observables_through_state(
    tape: QuantumScript, observed: list[int], array_gradients: bool
) -> list[int]:
    """Those of the ``observed`` measurements (indices) whose trainable observable data
    the device does not differentiate in the form PennyLane needs (see
    ``measure_through_state``), and that are small enough to take from the state (others
    stay, and the validation names what it refuses)."""
    through_state = []
    matrices = []
    for i in observed:
        obs = tape.measurements[i].obs
        data = obs.data
        trainable = [position for position, value in enumerate(data) if math.requires_grad(value)]
        if not trainable:
            continue
        served = True
        for position, derivative in observable_derivatives(obs, trainable).items():
            if isinstance(derivative, str):
                served = False
            elif isinstance(derivative, MatrixDerivative):
                matrices.append((i, data[position]))
        if not served and len(obs.wires) <= DENSE_OBSERVABLE_WIRES:
            through_state.append(i)
    if matrices:
        parameters = tape.get_parameters(trainable_only=False)
        shapes = {math.shape(value) for value in parameters if math.requires_grad(value)}
        uniform = array_gradients and len(shapes) == 1
        for i, value in matrices:
            complex_matrix = "complex" in math.get_dtype_name(value)
            if (not uniform or complex_matrix) and i not in through_state:
                through_state.append(i)
    return through_state


def _from_state(measurements, derived: list[int], wires: Wires):
    """The post-processing of ``measure_through_state``: the results of ``measurements``
    from the converted tape's (the kept ones, then the state)."""
    derived_set = frozenset(derived)

    def postprocess(results):
        values = results[0]
        n_kept = len(measurements) - len(derived)
        values = (values,) if n_kept == 0 else tuple(values)
        state = values[-1]
        out, kept = [], iter(values[:-1])
        for i, mp in enumerate(measurements):
            out.append(_result_from_state(mp, state, wires) if i in derived_set else next(kept))
        return out[0] if len(out) == 1 else tuple(out)

    return postprocess


def _result_from_state(mp, state, wires: Wires):
    """``mp``'s result from the state on ``wires``, differentiable by the ML framework;
    a NumPy scalar as a 0-d array, as the device's other results (a scalar's reduction
    in NumPy gives ``numpy.float64``; PennyLane's results are arrays)."""
    value = _measured_from_state(mp, state, wires)
    return np.asarray(value) if isinstance(value, np.generic) else value


def _measured_from_state(mp, state, wires: Wires):
    """``mp``'s result from the state on ``wires``. Measured on the wires' positions (as
    default.qubit does): some measurements' (as ``vn_entropy``'s) ``process_state`` take
    their wire labels for positions."""
    if not isinstance(mp, _OBSERVABLE_MEASUREMENTS):
        on_positions, standard = measured_on_positions(mp, wires)
        return on_positions.process_state(state, wire_order=standard)
    positions = {wire: position for position, wire in enumerate(wires)}
    standard = Wires(range(len(wires)))
    with QueuingManager.stop_recording():
        obs = mp.obs
        on_positions = [positions[w] for w in obs.wires]
        rho = DensityMatrixMP(wires=on_positions).process_state(state, wire_order=standard)
        matrix = qml.matrix(obs, wire_order=obs.wires)
    matrix = math.cast_like(matrix, rho)
    mean = math.real(math.einsum("...ab,ba->...", rho, matrix))
    if isinstance(mp, ExpectationMP):
        return mean
    square = math.real(math.einsum("...ab,bc,ca->...", rho, matrix, matrix))
    return square - mean**2


@transform
def complex_parameters_for_state(tape: QuantumScript):
    """Cast the trainable parameters to complex when a state is measured: its Jacobian is
    complex, and the ML framework takes the real part of a complex gradient only for a
    parameter that entered the circuit as complex (as default.qubit does)."""
    if not any(isinstance(mp, StateMP) for mp in tape.measurements):
        return (tape,), _first_result
    parameters = tape.get_parameters(trainable_only=False)
    trainable = [i for i, value in enumerate(parameters) if math.requires_grad(value)]
    if not trainable:
        return (tape,), _first_result
    cast = [math.cast(parameters[i], complex) for i in trainable]
    return (tape.bind_new_parameters(cast, trainable),), _first_result


_JAX_DIFFERENTIATING_TRACERS = ("JVPTracer", "LinearizeTracer")
"""jax's tracers of a value being differentiated (``jax.jit`` traces with others)."""


NOT_ANGLE_PARAMETERS = (
    qml.QubitUnitary,
    qml.ControlledQubitUnitary,
    qml.DiagonalQubitUnitary,
    qml.BlockEncode,
    StatePrepBase,
)
"""Operations whose parameters are matrices, phases or amplitudes, complex by nature:
never cast to real (a trainable DiagonalQubitUnitary decomposes into gates whose real
angles are its phases' differences; the others are refused by name when trainable)."""


@transform
def real_parameters_for_real_results(tape: QuantumScript):
    """Cast the trainable parameters given as complex numbers with a zero imaginary part to
    real for a tape that measures no state. For jax, which requires a result's tangent (and
    a parameter's cotangent) to have the dtype of the result (of the parameter): PennyLane
    contracts the device's real Jacobian with complex tangents otherwise, and the device's
    VJP of a real result is real. jax differentiates through the cast back to the complex
    argument. A parameter with a nonzero imaginary part is left as it is (the device
    refuses a complex angle by name). Under ``jax.jit`` the value cannot be checked here:
    a traced complex parameter is refused where jax differentiates it (the cast could
    hide an imaginary part) and left as it is where jax only evaluates."""
    if any(isinstance(mp, StateMP) for mp in tape.measurements):
        return (tape,), _first_result
    parameters = tape.get_parameters(trainable_only=False)
    cast = []
    for index in tape.trainable_params:
        value = parameters[index]
        if not math.get_dtype_name(value).startswith("complex"):
            continue
        # the operation of parameter ``index`` of all (get_operation counts trainable ones)
        operation = tape.par_info[index]["op"]
        if isinstance(operation, NOT_ANGLE_PARAMETERS) or exponential_of_an_angle(operation):
            continue  # an exponential's coefficient becomes a real angle where it decomposes
        if math.is_abstract(value):
            if type(value).__name__ in _JAX_DIFFERENTIATING_TRACERS:
                raise DeviceError(
                    f"custatevec.qubit cannot differentiate the complex-valued parameter "
                    f"{index} of {operation.name} under jax.jit: its "
                    "imaginary part cannot be checked while tracing, and the device's "
                    "angles are real. Pass real values (jnp.real(x)), or differentiate "
                    "without jax.jit."
                )
            continue
        if not math.any(math.imag(value) != 0):
            cast.append(index)
    if not cast:
        return (tape,), _first_result
    real = [math.real(parameters[i]) for i in cast]
    return (tape.bind_new_parameters(real, cast),), _first_result


@transform
def split_state_from_real_results(tape: QuantumScript):
    """A tape that measures a state and real results (expval, probs) becomes two tapes:
    the states, and the rest. For jax forward mode, where PennyLane contracts the device
    Jacobian with the tangents in the tangents' dtype: the state's tangents must be complex
    (``complex_parameters_for_state``), the real results' tangents real, as their results."""
    is_state = [isinstance(mp, StateMP) for mp in tape.measurements]
    if all(is_state) or not any(is_state):
        return (tape,), _first_result
    parts = [
        [i for i, state in enumerate(is_state) if state],
        [i for i, state in enumerate(is_state) if not state],
    ]
    tapes = tuple(tape.copy(measurements=[tape.measurements[i] for i in part]) for part in parts)

    def recombine(results):
        merged: list = [None] * len(is_state)
        for part, result in zip(parts, results, strict=True):
            for i, value in zip(part, (result,) if len(part) == 1 else result, strict=True):
                merged[i] = value
        return tuple(merged)

    return tapes, recombine


def _flattened(mp):
    """An expectation value or variance of a sum of Pauli words, with its observable as
    one flat LinearCombination: PennyLane's diagonalization drops the coefficients of
    the terms of a nested Sum."""
    obs = mp.obs
    if not isinstance(mp, (ExpectationMP, VarianceMP)) or not isinstance(obs, Sum):
        return mp
    terms = obs.pauli_rep
    if not terms:
        return mp
    words = [word.operation(wire_order=obs.wires) for word in terms]
    return type(mp)(LinearCombination(list(terms.values()), words))


def _measured_bases(mp, all_wires) -> dict | None:
    """{wire: basis} a measurement reads; a non-Pauli observable claims its wires whole."""
    if mp.obs is None:
        return {w: "Z" for w in (mp.wires or all_wires)}
    if mp.obs.pauli_rep is None:
        dense = ("dense", observable_key(mp.obs))
        return dict.fromkeys(mp.obs.wires, dense)
    bases: dict = {}
    for word in mp.obs.pauli_rep:
        for wire, letter in word.items():
            if bases.setdefault(wire, letter) != letter:
                return None
    return bases


def _reads_a_rotated_wire(measurements, all_wires) -> bool:
    """Whether a wire that one measurement reads in a basis other than Z is read by
    another too (the device rotates a whole observable at execution, so that the other
    would read it rotated): a tape the preprocessing has not rotated and split, such as
    ``expval(X(0) @ Y(1))`` beside ``expval(Z(0))``, or ``Y(0) @ Y(2)`` beside
    ``X(1) @ Y(2)`` (qubit-wise commuting, rotated per wire by the preprocessing)."""
    readers: dict = {}  # {wire: {who reads it}}: "Z", or the observable that rotates it
    for mp in measurements:
        bases = _measured_bases(mp, all_wires)
        if bases is None:  # a sum whose words do not commute qubit-wise
            return True
        for wire, basis in bases.items():
            reader = "Z" if basis == "Z" else observable_key(mp.obs)
            readers.setdefault(wire, set()).add(reader)
    return any(len(who) > 1 and who != {"Z"} for who in readers.values())


def _qubit_wise_commuting(measurements, all_wires) -> bool:
    """True when one rotation per wire diagonalizes every measurement together."""
    claimed: dict = {}
    for mp in measurements:
        bases = _measured_bases(mp, all_wires)
        if bases is None:
            return False
        for wire, basis in bases.items():
            if claimed.setdefault(wire, basis) != basis:
                return False
    return True


@transform
def rotate_sampled_measurements(tape: QuantumScript):
    """For finite shots: rotate observables into the computational basis, where the
    device samples, splitting the tape where its measurements do not commute qubit-wise.

    Sums and Hamiltonians are split term by term for expectation values. Any other
    measurement of an observable (variance, samples, counts, probabilities) needs its
    observable whole: it gets a tape of its own, rotated by the observable's diagonalizing
    gates when its terms do not commute qubit-wise.
    """
    if not tape.shots:
        return (tape,), _first_result
    if any(isinstance(mp, SHADOW_MEASUREMENTS) for mp in tape.measurements):
        return _shadows_apart(tape)
    if all(mp.obs is None for mp in tape.measurements):
        return (tape,), _first_result
    measurements = [_flattened(mp) for mp in tape.measurements]
    tape = tape.copy(measurements=measurements)
    if _qubit_wise_commuting(measurements, tape.wires):
        return (_diagonalized(tape),), _first_result
    wholes = [
        i
        for i, mp in enumerate(measurements)
        if mp.obs is not None and not isinstance(mp, ExpectationMP)
    ]
    others = [i for i in range(len(measurements)) if i not in wholes]
    pieces = []
    if others:
        groups, recombine = split_non_commuting(
            tape.copy(measurements=[measurements[i] for i in others]), grouping_strategy="qwc"
        )
        rotated = [_diagonalized(group) for group in groups]
        pieces.append((others, rotated, recombine))
    for index in wholes:
        alone = tape.copy(measurements=[measurements[index]])
        if _qubit_wise_commuting(alone.measurements, tape.wires):
            alone = _diagonalized(alone)
        pieces.append(([index], [alone], _first_result))
    return [t for _, tapes, _ in pieces for t in tapes], _reassemble(tape, pieces)


def sampled_apart(circuits: Sequence[QuantumScript]):
    """For ``dev.execute`` of tapes that skipped the preprocessing (PennyLane's gradient
    tests call it so): each sampled tape with a measurement that reads a wire another
    rotates (``_reads_a_rotated_wire``) rotated and split as
    ``rotate_sampled_measurements`` does it, so that no measurement is sampled from a
    state rotated for another (default.qubit samples each group apart too). ``(tapes,
    recombine)``, or None where no tape needs it (as no preprocessed tape does)."""
    split = [
        bool(c.shots)
        and not any(isinstance(mp, SHADOW_MEASUREMENTS) for mp in c.measurements)
        and _reads_a_rotated_wire(c.measurements, c.wires)
        for c in circuits
    ]
    if not any(split):
        return None
    tapes, pieces = [], []
    for circuit, apart in zip(circuits, split, strict=True):
        parts, postprocess = (
            rotate_sampled_measurements(circuit) if apart else ((circuit,), _first_result)
        )
        pieces.append((len(tapes), len(parts), postprocess))
        tapes.extend(parts)

    def recombine(results):
        return [postprocess(results[start : start + n]) for start, n, postprocess in pieces]

    return tapes, recombine


def _shadows_apart(tape: QuantumScript):
    """Each classical-shadow measurement in a tape of its own, expanded where the tape is
    broadcast (its measurement takes one state); the other measurements rotated together
    as ``rotate_sampled_measurements`` rotates them."""
    shadows = [i for i, mp in enumerate(tape.measurements) if isinstance(mp, SHADOW_MEASUREMENTS)]
    others = [i for i in range(len(tape.measurements)) if i not in shadows]
    pieces = []
    if others:
        rest = tape.copy(measurements=[tape.measurements[i] for i in others])
        tapes, postprocess = rotate_sampled_measurements(rest)
        pieces.append((others, list(tapes), postprocess))
    for index in shadows:
        alone = tape.copy(measurements=[tape.measurements[index]])
        if tape_batch_size(alone) is None:
            pieces.append(([index], [alone], _first_result))
        else:
            tapes, postprocess = _broadcast_expand(alone)
            pieces.append(([index], list(tapes), postprocess))
    return [t for _, tapes, _ in pieces for t in tapes], _reassemble(tape, pieces)


def _diagonalized(tape: QuantumScript) -> QuantumScript:
    """PennyLane's ``diagonalize_measurements`` of a tape whose measurements commute
    qubit-wise, with the options of counts (``all_outcomes``) and samples (``dtype``) kept:
    it rebuilds the measurements of observables without them (outcomes never sampled went
    missing from the dictionaries, samples came as float64)."""
    tape = _rotated_by_own_gates(tape)
    (rotated,), _ = diagonalize_measurements(tape)
    kept = [
        _with_options_of(old, new)
        for old, new in zip(tape.measurements, rotated.measurements, strict=True)
    ]
    return rotated.copy(measurements=kept)


def _rebuildable(obs) -> bool:
    """Whether PennyLane's ``diagonalize_measurements`` can rotate ``obs``: it rebuilds a
    symbolic operator from its parameters and hyperparameters with the base rotated,
    which scalar products and powers accept and exponentials, adjoints and controlled
    operators (CZ, ...) do not (a TypeError)."""
    if isinstance(obs, CompositeOp):
        return all(map(_rebuildable, obs.operands))
    if isinstance(obs, SymbolicOp):
        return isinstance(obs, (SProd, Pow)) and _rebuildable(obs.base)
    return True


class RotatedObservable(Operator):
    """An observable after its own diagonalizing gates (``_rotated_by_own_gates``):
    diagonal in the computational basis of its wires, with the eigenvalues of the
    observable it stands for. Measured through PennyLane's observable path, which sums
    the counts of equal eigenvalues (its counts by explicit ``eigvals`` keep one of them:
    ``{eigenvalue: count}`` built from every outcome, the last equal one winning)."""

    num_params = 1
    grad_method = None

    @staticmethod
    def compute_eigvals(eigenvalues):  # pylint: disable=arguments-differ
        return eigenvalues

    @staticmethod
    def compute_diagonalizing_gates(eigenvalues, wires):  # pylint: disable=arguments-differ
        return []

    @staticmethod
    def compute_matrix(eigenvalues):  # pylint: disable=arguments-differ
        return np.diag(eigenvalues)


RotatedObservable._primitive = None  # plain Python under program capture (device.eval_jaxpr)


def _rotated_by_own_gates(tape: QuantumScript) -> QuantumScript:
    """The tape with each observable that PennyLane cannot rotate (``_rebuildable``)
    rotated by its own diagonalizing gates, once per observable, and measured as a
    ``RotatedObservable``, as default.qubit samples it (the measurements commute
    qubit-wise: such an observable claims its wires whole)."""
    measurements = list(tape.measurements)
    opaque = [i for i, mp in enumerate(measurements) if mp.obs and not _rebuildable(mp.obs)]
    if not opaque:
        return tape
    gates, rotated = [], set()
    for index in opaque:
        mp = measurements[index]
        obs = mp.obs
        if observable_key(obs) not in rotated:
            rotated.add(observable_key(obs))
            gates.extend(obs.diagonalizing_gates())
        if isinstance(mp, ProbabilityMP):
            measurements[index] = ProbabilityMP(wires=obs.wires)
        else:
            diagonal = RotatedObservable(obs.eigvals(), wires=obs.wires)
            measurements[index] = _with_options_of(mp, type(mp)(obs=diagonal))
    return tape.copy(operations=tape.operations + gates, measurements=measurements)


def _with_options_of(old, new):
    if new.obs is None or new is old:
        return new
    if isinstance(old, CountsMP) and old.all_outcomes:
        return CountsMP(obs=new.obs, all_outcomes=True)
    dtype = getattr(old, "_dtype", None)  # SampleMP's option; PennyLane has no accessor
    if isinstance(old, SampleMP) and dtype is not None:
        return SampleMP(obs=new.obs, dtype=dtype)
    return new


def _reassemble(tape: QuantumScript, pieces):
    """Post-processing that puts the pieces' results back in the tape's measurement order."""
    partitioned = tape.shots.has_partitioned_shots
    n_partitions = len(list(tape.shots)) if partitioned else 1

    def per_measurement(value, count):
        """value -> [partition][measurement] for a piece of ``count`` measurements."""
        partitions = value if partitioned else (value,)
        return [part if count > 1 else (part,) for part in partitions]

    def reassemble(results):
        table = [[None] * len(tape.measurements) for _ in range(n_partitions)]
        start = 0
        for indices, tapes, postprocess in pieces:
            value = postprocess(results[start : start + len(tapes)])
            start += len(tapes)
            for p, part in enumerate(per_measurement(value, len(indices))):
                for index, result in zip(indices, part, strict=True):
                    table[p][index] = result
        rows = [row[0] if len(row) == 1 else tuple(row) for row in table]
        return tuple(rows) if partitioned else rows[0]

    return reassemble
