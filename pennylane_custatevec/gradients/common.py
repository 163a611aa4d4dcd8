"""What both adjoint accumulation modes share (``eager``, ``deferred``): validation,
the ``DifferentiatedTape``, cotangent checks, the Jacobian layout, the derivatives of
observable data and the memory of sweeps.

The bra encodes what is differentiated, one cotangent dy per measurement:

    expval(O):     lambda += 2 dy O psi           (d<O> = 2 Re <O psi | d psi>)
    var(O):        lambda += 2 dy (O^2 - 2<O> O) psi
    probs(wires):  lambda += 2 D psi, D = diag(dy) on the wires (sum_x dy_x dp_x)
    state():       lambda += conj(dy)             (Re sum_i dy_i d psi_i)

The variance term: var = <O^2> - <O>^2, so d var = d<O^2> - 2<O> d<O>, and each
expectation contributes as expval does, with <O> a number taken from the final state
before the sweep (it does not depend on where in the circuit the sweep is). For a Pauli
word O^2 = I, whose <I> = 1 has no derivative: the term is -4 dy <O> O psi. Otherwise
O^2 psi is O applied twice (never O^2 built as an operator: a sum of K words would
square into K^2 products).

Trainable observable data (tape parameters after the operations' ones) needs no sweep:
its derivative is read off the final state psi, before the sweep consumes it
(``ObservableColumns``). Sums, scalar products and products of observables are linear in
each of their data entries separately (``observable_derivatives``), so for a scalar
coefficient x with dO/dx = D (an observable itself),

    d<O>/dx  = <D>                                  (a coefficient c_k: <O_k>)
    d var/dx = <D O + O D> - 2<O><D> = 2 Re <O psi|D|psi> - 2<O><D>.

For a Hermitian matrix M weighted by w in O, dO/dM_ab = w |a><b| on M's wires, so with
the reduced products R(u, v)[c, d] = sum_r u[c, r] conj(v[d, r]) on those wires
(rho = R(psi, psi), the reduced density matrix)

    d<O>/dM_ab  = w rho_ba                                   (w rho^T)
    d var/dM_ab = w (R(psi, O psi) + R(psi, O psi)^dagger - 2<O> rho)_ba.

For a real matrix the gradient is the real part (PennyLane's convention: the gradient of
a real parameter is real); a complex one keeps both parts, as autograd's.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np
import pennylane as qml
from pennylane.exceptions import DeviceError
from pennylane.measurements import (
    ExpectationMP,
    MeasurementProcess,
    ProbabilityMP,
    StateMP,
    VarianceMP,
)
from pennylane.operation import Operator, StatePrepBase
from pennylane.ops import Conditional, Hermitian, MidMeasure, Prod, Projector, SProd, Sum
from pennylane.queuing import QueuingManager
from pennylane.tape import QuantumScript
from pennylane.wires import Wires

from .. import measure, simulate
from ..backends.base import Backend, StateBatch
from ..entrywise import (
    ENTRYWISE_SOURCES,
    MAX_ENTRYWISE_CONTROLLED_QUBITS,
    MAX_ENTRYWISE_QUBITS,
    MAX_ENTRYWISE_STATE_QUBITS,
    EntrywiseState,
    EntrywiseUnitary,
    selected_block,
    too_wide,
)
from ..instructions import Kind, apply_instruction
from ..program import (
    Compilation,
    Register,
    compile_steps,
    compiles_by_gate,
    flatten,
    is_broadcast,
    tape_batch_size,
)
from ..queuing import generator_of


def is_swept(mp: MeasurementProcess) -> bool:
    """Whether the sweep differentiates ``mp``'s kind: expval, var, probs, or the state
    itself (a ``DensityMatrixMP`` is a ``StateMP`` but not the state: the device's
    preprocessing measures the state for it, see preprocess/through_state.py)."""
    return isinstance(mp, (ExpectationMP, VarianceMP, ProbabilityMP)) or type(mp) is StateMP


def unsupported_reason(
    tape: QuantumScript,
    trainable: set[int] | None = None,
    broadcast: bool | None = None,
    batched: bool = False,
) -> str | None:
    """Why the adjoint method cannot differentiate ``tape``, or None if it can.

    ``trainable`` holds the indices (into ``tape.get_parameters(trainable_only=False)``) of
    the trainable parameters; by default ``tape.trainable_params``. ``broadcast`` says
    whether the tape is broadcast where that is already known.
    ``batched``: the sweep runs a broadcast tape as one batch (the deferred mode), which
    it can when no trainable parameter is broadcast.
    """
    trainable = set(tape.trainable_params) if trainable is None else trainable
    for mp in tape.measurements:
        reason = _measurement_reason(mp)
        if reason:
            return reason
        if trainable and _not_hermitian(mp):
            return (
                f"the observable {mp.obs} of {type(mp).__name__} is not Hermitian (a non-real "
                "coefficient), so its expectation value is complex and its derivative is not "
                "the adjoint method's real one; use diff_method='parameter-shift' or "
                "'finite-diff', or a real coefficient"
            )
    if tape.shots:
        return (
            f"it needs analytic execution and the circuit has shots={tape.shots.total_shots}; "
            "use diff_method='parameter-shift' with shots"
        )
    if tape_batch_size(tape) is not None if broadcast is None else broadcast:
        if not batched:
            return "broadcast circuits are expanded by the device's preprocessing first"
        if any(is_broadcast(tape.par_info[index]["op"]) for index in trainable):
            return (
                "a trainable parameter is broadcast; such circuits are expanded by the "
                "device's preprocessing first"
            )
    n_ops = len(tape.operations)
    trainable_ops = set()
    observed = False
    for index in trainable:
        op_index = tape.par_info[index]["op_idx"]
        if op_index < n_ops:
            trainable_ops.add(op_index)
        else:
            observed = True
    if observed:
        for derivatives in observable_data_derivatives(tape, trainable).values():
            for derivative in derivatives.values():
                if isinstance(derivative, str):
                    return (
                        f"{derivative}; it differentiates gate parameters, scalar "
                        "coefficients of observables and Hermitian matrices (QNodes get "
                        "other trainable observables from the state through the device's "
                        "preprocessing; or make the observable's data non-trainable)"
                    )
    for position, op in enumerate(tape.operations):
        reason = _operation_reason(op, position in trainable_ops)
        if reason:
            return reason
    return None


def require_adjoint_serves(
    tape: QuantumScript,
    trainable: set[int] | None = None,
    broadcast: bool | None = None,
    batched: bool = False,
) -> None:
    """Refuse a tape that the adjoint method cannot differentiate (``unsupported_reason``,
    with the same arguments) with a DeviceError naming the reason. The device's
    preprocessing calls it for every differentiated tape
    (``preprocess.adjoint.validate_adjoint_differentiation``); the derivative entry points call
    it only for tapes that did not come through that preprocessing (device.py,
    ``ADJOINT_VALIDATED_IN_PREPROCESSING``)."""
    reason = unsupported_reason(tape, trainable, broadcast=broadcast, batched=batched)
    if reason:
        raise DeviceError(
            f"custatevec.qubit cannot differentiate this circuit by adjoint: {reason}."
        )


def _measurement_reason(mp: MeasurementProcess) -> str | None:
    supported = "it supports expval, var, probs (of wires) and state"
    if not is_swept(mp):
        return (
            f"{supported}, not {type(mp).__name__} (QNodes get density_matrix, purity, "
            "vn_entropy, mutual_info and the other measurements of the state from the "
            "state, through the device's preprocessing)"
        )
    if mp.mv is not None:
        return f"{supported}, not measurements of mid-circuit measurement values"
    if isinstance(mp, ProbabilityMP) and mp.obs is not None:
        return f"{supported}, not probs of an observable ({mp.obs.name})"
    return None


def _not_hermitian(mp: MeasurementProcess) -> bool:
    return isinstance(mp, (ExpectationMP, VarianceMP)) and not (
        mp.obs is None or measure.is_hermitian(mp.obs)
    )


def has_a_generator(op: Operator) -> bool:
    """``op.has_generator``, without asking ``bool`` of a ``jax.jit``-traced angle:
    PennyLane's ``Evolution`` (``qml.evolve(G, x)``) answers ``not real(coeff)``, a
    ``TracerBoolConversionError`` under ``jax.jit``. Its angle is real by its contract
    (``Evolution``'s ``param`` "is expected not to have any complex component"), so it has
    one where its base is Hermitian, as PennyLane's ``Exp`` answers for a traced
    coefficient."""
    if isinstance(op, qml.ops.Evolution) and qml.math.is_abstract(op.param):
        return op.base.is_verified_hermitian
    return op.has_generator


def _operation_reason(op: Operator, trainable: bool) -> str | None:
    if isinstance(op, (MidMeasure, Conditional)):
        return (
            f"{op.name} is not unitary; with mid-circuit measurements use "
            "mcm_method='deferred', or diff_method='parameter-shift'"
        )
    if isinstance(op, Projector):  # a postselection: the sweep projects its bras (eager)
        if trainable:
            return (
                f"the basis of the Projector on wires {op.wires.tolist()} is trainable; it "
                "is not a differentiable parameter (make it a constant)"
            )
        return None
    if not trainable:
        return None
    if isinstance(op, EntrywiseState):
        return None
    if isinstance(op, StatePrepBase):
        return (
            f"the parameters of the state preparation {op.name} on {len(op.wires)} wires are "
            "trainable; the adjoint method differentiates a trainable state preparation by "
            "its amplitudes where it opens the circuit on at most "
            f"{MAX_ENTRYWISE_STATE_QUBITS} wires, after the device's preprocessing (use "
            "diff_method='backprop' on default.qubit otherwise, or prepare the state with "
            "parametrized gates)" + _traced_hint(op)
        )
    if compiles_by_gate(op) or isinstance(op, EntrywiseUnitary):
        return None
    if isinstance(op, ENTRYWISE_SOURCES):
        if too_wide(op):
            return (
                f"{op.name} has a trainable matrix on {len(op.wires)} wires; the adjoint "
                f"method takes a trainable unitary on at most {MAX_ENTRYWISE_QUBITS} wires "
                "(by its entries: 2 * 4**k real parameters), a controlled one on at most "
                f"{MAX_ENTRYWISE_QUBITS} target wires and {MAX_ENTRYWISE_CONTROLLED_QUBITS} "
                "wires in all; use diff_method='backprop' on default.qubit for a wider one"
                + _traced_hint(op)
            )
        return (
            f"{op.name} has a trainable matrix, which the adjoint method takes by its "
            "entries after the device's preprocessing (device.preprocess_transforms(), "
            "which qml.execute and QNodes run); this tape did not go through it"
        )
    if op.num_params != 1 or not has_a_generator(op):
        return (
            f"{op.name} has trainable parameters but no generator; the adjoint method "
            "differentiates gates with one parameter and a generator (rotations, phase "
            "shifts, ...); use those, or diff_method='parameter-shift'" + _traced_hint(op)
        )
    return None


def _traced_hint(op: Operator) -> str:
    """Why a parameter the user does not differentiate can count as trainable: under
    ``jax.jit`` PennyLane takes every traced argument to be trainable."""
    if not any(qml.math.is_abstract(value) for value in op.data):
        return ""
    return (
        ". Under jax.jit every traced value counts as trainable: a constant "
        f"{op.name} parameter passed as an argument of the jitted function, or computed "
        "with jax inside it, is one; close over a NumPy array instead"
    )


# ---------------------------------------------------------------------------------------
# Trainable observable data


@dataclasses.dataclass(frozen=True)
class CoefficientDerivative:
    """dO/dx = ``operator`` for a scalar coefficient x of the observable O (an SProd's
    scalar, a Hamiltonian's coefficient), on which O depends linearly."""

    operator: Operator


@dataclasses.dataclass(frozen=True)
class MatrixDerivative:
    """dO/dM_ab = ``weight`` |a><b| on ``wires`` for the matrix M of a Hermitian in O
    (``weight``: the product of the scalars above it in O; None for 1)."""

    weight: complex | None
    wires: Wires


ObservableDerivative = CoefficientDerivative | MatrixDerivative


def observable_derivatives(
    obs: Operator, indices: Sequence[int]
) -> dict[int, ObservableDerivative | str]:
    """The derivative of ``obs`` by each of its data entries ``indices`` (into
    ``obs.data``), or the reason (a phrase) why the adjoint method has none.

    Sums (Hamiltonians and LinearCombinations among them) and products hold their
    operands' data in order, a scalar product its scalar and then its base's data: the
    walk goes down to the operands that hold the entries, once for all of them (a
    composite's ``data`` is rebuilt on every access: one walk per entry would cost
    K**2 for K terms). An observable is linear in each entry separately there:
    d(sum_k O_k) = dO_j, d(c B)/dc = B, d(c B) = c dB, d(A_1 ... A_n) = A_1 ... dA_j ... A_n.
    """
    with QueuingManager.stop_recording():
        return _derivatives(obs, list(indices), None)


def observable_data_derivatives(tape: QuantumScript, trainable) -> dict[int, dict]:
    """{measurement index: ``observable_derivatives`` of its observable's entries} for the
    trainable observable data among ``trainable`` (indices into the tape's parameters)."""
    n_ops = len(tape.operations)
    entries: dict[int, list[int]] = {}
    for index in sorted(trainable):
        info = tape.par_info[index]
        if info["op_idx"] >= n_ops:
            entries.setdefault(info["op_idx"] - n_ops, []).append(info["p_idx"])
    return {
        m: observable_derivatives(tape.measurements[m].obs, indices)
        for m, indices in entries.items()
    }


def _derivatives(obs: Operator, indices: list[int], weight) -> dict:
    if isinstance(obs, SProd):
        found = {}
        if 0 in indices:
            found[0] = (
                f"the coefficient of {obs.name} is trainable and not a scalar"
                if qml.math.shape(obs.scalar) != ()
                else CoefficientDerivative(_weighted(obs.base, weight))
            )
        inner = [i - 1 for i in indices if i > 0]
        if inner:
            scale = obs.scalar if weight is None else weight * obs.scalar
            found.update((i + 1, d) for i, d in _derivatives(obs.base, inner, scale).items())
        return found
    if isinstance(obs, (Sum, Prod)):
        operands = obs.operands
        starts = [0]
        for operand in operands:
            starts.append(starts[-1] + len(operand.data))
        if starts[-1] != len(obs.data):
            return {i: f"the data of {obs.name} is not its operands' data" for i in indices}
        by_operand: dict[int, list[int]] = {}
        for i in indices:
            position = bisect.bisect_right(starts, i) - 1
            by_operand.setdefault(position, []).append(i - starts[position])
        found = {}
        for position, local in by_operand.items():
            start = starts[position]
            if isinstance(obs, Sum):
                inner = _derivatives(operands[position], local, weight)
                found.update((start + i, d) for i, d in inner.items())
                continue
            for i, d in _derivatives(operands[position], local, None).items():
                if isinstance(d, CoefficientDerivative):
                    factors = list(operands)
                    factors[position] = d.operator
                    d = CoefficientDerivative(_weighted(qml.prod(*factors), weight))
                elif isinstance(d, MatrixDerivative):
                    d = "a Hermitian matrix in a product of observables is trainable"
                found[start + i] = d
        return found
    if isinstance(obs, Hermitian) and indices == [0]:
        return {0: MatrixDerivative(weight, obs.wires)}
    return {i: f"a parameter of the observable {obs.name} is trainable" for i in indices}


def _weighted(op: Operator, weight) -> Operator:
    return op if weight is None else qml.s_prod(weight, op)


@dataclasses.dataclass(frozen=True)
class ObservableColumns:
    """The columns ``start`` .. ``stop`` of a trainable data entry of the observable of
    measurement ``measurement`` (an expval or var): one column for a coefficient, one per
    entry of a matrix (flattened in C order). ``complex_gradient``: the parameter is
    complex and its gradient keeps its imaginary part."""

    measurement: int
    start: int
    stop: int
    derivative: ObservableDerivative
    complex_gradient: bool


def observable_values(
    backend: Backend,
    psi: StateBatch,
    register: Register,
    measurements: Sequence[MeasurementProcess],
    columns: Sequence[ObservableColumns],
) -> list[np.ndarray]:
    """d(result of its measurement)/d(entry) of each of ``columns`` (module docstring), for
    each of the B vectors of the final states ``psi`` (unchanged): (B, stop - start) each.
    Each measurement's <O> and O psi are computed once, and every Pauli derivative of the
    expectation values in one backend call."""
    values: list = [None] * len(columns)
    means: dict[int, np.ndarray] = {}
    applied: dict[int, StateBatch] = {}
    coefficients = [
        c
        for c, column in enumerate(columns)
        if isinstance(column.derivative, CoefficientDerivative)
    ]
    derivative_means = measure.expvals(
        backend, psi, register, [columns[c].derivative.operator for c in coefficients]
    )
    for c, mean_of_derivative in zip(coefficients, derivative_means, strict=True):
        values[c] = mean_of_derivative
    for c, column in enumerate(columns):
        mp = measurements[column.measurement]
        derivative = column.derivative
        if isinstance(mp, VarianceMP) and column.measurement not in means:
            means[column.measurement] = measure.expval(backend, psi, register, mp.obs)
            applied[column.measurement] = measure.applied_observable(backend, psi, register, mp.obs)
        mean = means.get(column.measurement)
        if isinstance(derivative, CoefficientDerivative):
            if isinstance(mp, VarianceMP):
                cross = measure.transition(
                    backend, applied[column.measurement], psi, register, derivative.operator
                )
                values[c] = 2.0 * np.real(cross) - 2.0 * mean * values[c]
            values[c] = np.asarray(values[c], dtype=np.float64)[:, None]
            continue
        rho = measure.reduced_products(backend, psi, psi, register, derivative.wires)
        if isinstance(mp, VarianceMP):
            cross = measure.reduced_products(
                backend, psi, applied[column.measurement], register, derivative.wires
            )
            rho = cross + np.conj(np.swapaxes(cross, -1, -2)) - 2.0 * mean[:, None, None] * rho
        gradient = np.swapaxes(rho, -1, -2)
        if derivative.weight is not None:
            gradient = complex(derivative.weight) * gradient
        if not column.complex_gradient:
            gradient = np.real(gradient)
        values[c] = gradient.reshape(gradient.shape[0], -1)
    return values


# ---------------------------------------------------------------------------------------
# The circuit and the sweep


_LAYOUT = ("gradients", "layout")
"""The start of the key of a ``_ColumnLayout`` in ``program.Compilation.memo`` (then the
tape's trainable parameters)."""


def _part_columns(
    operation: Operator, position: int, trainable: dict, starts: list
) -> np.ndarray | None:
    """The column of each part (parameter) of an ``entrywise`` operation at ``position``
    in the tape, -1 for a constant one; None when none is trainable. A controlled
    ``EntrywiseUnitary``'s are laid out over its whole matrix's parts, as the sweep
    reduces the whole dense block: its parts in the selected block, -1 elsewhere."""
    at = np.array(
        [
            starts[trainable[position, p]] if (position, p) in trainable else -1
            for p in range(len(operation.data))
        ]
    )
    if not bool((at >= 0).any()):
        return None
    control_values = getattr(operation, "control_values", ())
    if not control_values:
        return at
    block = int(round(np.sqrt(len(at) / 2)))
    full = block * 2 ** len(control_values)
    rows = selected_block(control_values, block) + np.arange(block)
    # entry (a, c) of the block is entry (offset + a, offset + c) of the whole matrix
    entries = (rows[:, None] * full + rows[None, :]).reshape(-1)
    whole = np.full(2 * full * full, -1)
    whole[2 * entries] = at[0::2]
    whole[2 * entries + 1] = at[1::2]
    return whole


@dataclasses.dataclass(frozen=True)
class _ColumnLayout:
    """Where each trainable parameter's scalars go (``DifferentiatedTape``'s columns): a
    function of the tape's structure alone (its trainable parameters' shapes, which
    operation each belongs to, its steps' origins, its observables)."""

    n_params: int
    shapes: list
    n_columns: int
    starts: list
    observable_columns: tuple
    columns: dict
    entry_columns: dict
    state_columns: tuple | None

    @classmethod
    def of(cls, tape: QuantumScript, steps: Sequence, register: Register) -> _ColumnLayout:
        # all of them, then the trainable: with trainable_only, PennyLane rebuilds an
        # observable's data for each of its entries (K**2 for a sum of K terms)
        every = tape.get_parameters(trainable_only=False)
        parameters = [every[index] for index in tape.trainable_params]
        shapes = [getattr(value, "shape", ()) for value in parameters]
        starts = [0]
        for shape in shapes:
            starts.append(starts[-1] + math.prod(shape))
        n_ops = len(tape.operations)
        trainable = {}
        observed = []
        for p, index in enumerate(tape.trainable_params):
            info = tape.par_info[index]
            if info["op_idx"] < n_ops:
                trainable[info["op_idx"], info["p_idx"]] = p
            else:
                observed.append((p, info["op_idx"] - n_ops, info["p_idx"]))
        observable_columns: tuple[ObservableColumns, ...] = ()
        if observed:
            derivatives = observable_data_derivatives(tape, tape.trainable_params)
            observable_columns = tuple(
                ObservableColumns(
                    measurement=m,
                    start=starts[p],
                    stop=starts[p + 1],
                    derivative=derivatives[m][entry],
                    complex_gradient=bool(np.iscomplexobj(parameters[p])),
                )
                for p, m, entry in observed
            )
        columns = {}
        entry_columns = {}
        for index, step in enumerate(steps):
            origin = step.origin
            if isinstance(step.operation, EntrywiseUnitary):
                at = _part_columns(step.operation, origin.operation, trainable, starts)
                if at is not None:
                    entry_columns[index] = at
                    columns[index] = int(at[at >= 0].min())
            elif (origin.operation, origin.parameter) in trainable:
                p = trainable[origin.operation, origin.parameter]
                columns[index] = starts[p] + origin.element
        state_columns = None
        operations = tape.operations
        if operations and isinstance(operations[0], EntrywiseState):
            at = _part_columns(operations[0], 0, trainable, starts)
            if at is not None:
                state_columns = (at, _amplitude_indices(operations[0], register))
        return cls(
            len(parameters),
            shapes,
            starts[-1],
            starts,
            observable_columns,
            columns,
            entry_columns,
            state_columns,
        )


def _amplitude_indices(preparation: Operator, register: Register) -> np.ndarray:
    """Where amplitude k of ``preparation``'s state (its wires, the first most significant)
    sits in the register's vectors, the other wires in |0>: sum_j bit_j(k) 2**bit(w_j)."""
    bits = register.bits(preparation.wires)
    k = np.arange(2 ** len(bits))
    indices = np.zeros_like(k)
    for j, bit in enumerate(bits):
        indices |= ((k >> (len(bits) - 1 - j)) & 1) << bit
    return indices


class DifferentiatedTape:
    """A tape as the adjoint method sees it: its compilation (register and steps), the
    columns of its trainable gates and the data of its observables. Named for what it is:
    the tape that is differentiated, not a circuit in general (the forward pass knows
    the same tape as a ``Compilation`` and a ``Program``).
    It does not validate: the tape comes from the device's preprocessing, or the entry
    point validated it (``require_adjoint_serves``).

    One column per scalar of the trainable parameters (``n_columns`` in all), in
    ``tape.trainable_params`` order: a scalar parameter has one, an array parameter (a
    native template's weights, a Hermitian's matrix) one per element. The sweeps
    differentiate by gate: ``columns`` maps each trainable step to its column; an
    ``EntrywiseUnitary``'s step, one column per trainable real part, has them in
    ``entry_columns`` (an array per step, -1 for a constant part), and its first in
    ``columns``, which only the eager sweep reads for it. A trainable ``EntrywiseState``
    that opens the tape (the register's initial state, not a step) has ``state_columns``:
    (its parts' columns, -1 for a constant; where each amplitude sits in the register's
    vectors), else None. The trainable data of observables, which come after the
    operations' parameters, have ``observable_columns``, read off the final state
    (``observable_gradients``). ``fold`` turns per-column values into per-parameter ones."""

    def __init__(
        self,
        tape: QuantumScript,
        device_wires: Wires | None,
        compilation: Compilation | None = None,
    ):
        self.tape = tape
        self.compilation = compilation or compile_steps(tape, device_wires)
        self.register = self.compilation.register
        self.steps = self.compilation.steps
        # a structure's memo: the layout is its structure's for these trainable parameters
        # (a caller may differentiate fewer of them than the structure's tapes, as the JVP)
        memo, key = self.compilation.memo, (*_LAYOUT, tuple(tape.trainable_params))
        layout = memo.get(key) if memo is not None else None
        if layout is None:
            layout = _ColumnLayout.of(tape, self.steps, self.register)
            if memo is not None:
                memo[key] = layout
        self.n_params = layout.n_params
        self.shapes = layout.shapes
        self.n_columns = layout.n_columns
        self._starts = layout.starts
        self.observable_columns = layout.observable_columns
        self.columns = layout.columns
        self.entry_columns = layout.entry_columns
        self.state_columns = layout.state_columns

    def fold(self, values: Sequence) -> list:
        """Per trainable parameter, from one value per column: a scalar parameter's value,
        or an array parameter's values stacked on trailing axes of its shape."""
        folded = []
        for p, shape in enumerate(self.shapes):
            start = self._starts[p]
            if not shape:
                folded.append(values[start])
                continue
            stacked = np.stack(values[start : self._starts[p + 1]], axis=-1)
            folded.append(stacked.reshape(stacked.shape[:-1] + shape))
        return folded

    def final_state(self, backend: Backend) -> StateBatch:
        state, _ = simulate.final_state(backend, flatten(self.compilation))
        return state

    def observable_gradients(
        self, backend: Backend, psi: StateBatch, rows: Sequence[Sequence[tuple]]
    ) -> np.ndarray | None:
        """The observable columns' part of the gradients of ``rows`` (rows[b]: the R
        cotangent rows of vector b of the final states ``psi``, which stay unchanged), as
        (B, R, n_columns), zero in the gate columns; None without observable columns.
        Called before the sweep, which consumes ``psi``."""
        if not self.observable_columns:
            return None
        values = observable_values(
            backend, psi, self.register, self.tape.measurements, self.observable_columns
        )
        complex_gradient = any(c.complex_gradient for c in self.observable_columns)
        gradients = np.zeros(
            (len(rows), len(rows[0]), self.n_columns),
            dtype=np.complex128 if complex_gradient else np.float64,
        )
        for column, value in zip(self.observable_columns, values, strict=True):
            for b, vector_rows in enumerate(rows):
                for r, row in enumerate(vector_rows):
                    dy = row[column.measurement]
                    if not is_zero(dy):
                        gradients[b, r, column.start : column.stop] += float(dy) * value[b]
        return gradients


@dataclasses.dataclass(frozen=True)
class SweepMemory:
    """What an adjoint sweep allocates beside the final states it is handed, counted in
    state vectors of the register (the deferred sweep's reductions in bytes), for the
    memory check before it allocates anything.

    The final states and the bras live through the whole sweep; the temporaries of
    building the bras are gone before the first step; the reductions accumulate during
    the steps, beside the temporaries of one step at a time."""

    states: int
    """Final states simulated again for the sweep, or copied into one batch."""
    bras: int
    """R per state vector (one for a VJP, one per output for a Jacobian)."""
    build_scratch: int
    """Temporary vectors while the bras are built (a cotangent term, the backend's)."""
    step_scratch: int
    """Temporary vectors of one sweep step (the backend's ``scratch_vectors``)."""
    reduction_bytes: int = 0
    """The deferred sweep's reductions, held until the sweep ends (an upper bound)."""

    def bytes(self, backend: Backend, num_qubits: int) -> int:
        return self._bytes(simulate.state_bytes(backend, num_qubits, 1))

    def _bytes(self, vector: int) -> int:
        during_steps = vector * self.step_scratch + self.reduction_bytes
        return vector * (self.states + self.bras) + max(vector * self.build_scratch, during_steps)

    def single_precision(self, backend: Backend, num_qubits: int) -> list[simulate.Alternative]:
        """``c_dtype=numpy.complex64`` as an alternative: half the bytes per vector (the
        reductions stay complex128)."""
        half = self._bytes(simulate.state_bytes(backend, num_qubits, 1) // 2)
        return simulate.single_precision(backend, half)

    def described(self) -> str:
        """What the vectors are, for an error message."""
        parts = [f"{self.bras:,} bra{'s' if self.bras != 1 else ''}"]
        if self.states:
            parts.insert(0, f"{self.states:,} final state{'s' if self.states != 1 else ''}")
        scratch = max(self.build_scratch, self.step_scratch)
        if scratch:
            parts.append(f"up to {scratch:,} temporary vector{'s' if scratch != 1 else ''}")
        if self.reduction_bytes:
            parts.append(f"{self.reduction_bytes:,} bytes of reductions")
        return ", ".join(parts)


def bra_build_scratch(backend: Backend) -> int:
    """Temporary vectors while one bra's cotangent terms are added (``add_cotangent_terms``):
    one term at a time (a copy of psi, O psi, or a state cotangent), and the backend's
    temporary of adding it."""
    return 1 + backend.scratch_vectors(1, 1, False)


def eager_sweep_memory(backend: Backend, held: bool, rows: int) -> SweepMemory:
    """The eager sweep of one (not broadcast) tape with ``rows`` bras; ``held``: its final
    state is handed over (kept from the forward pass), else simulated again."""
    return SweepMemory(
        states=0 if held else 1,
        bras=rows,
        build_scratch=bra_build_scratch(backend),
        step_scratch=backend.scratch_vectors(1, rows, False),
    )


def require_sweep_memory(
    backend: Backend,
    num_qubits: int,
    memory: SweepMemory,
    what: str,
    alternatives: Sequence[simulate.Alternative] | Callable = (),
) -> None:
    """Refuse a sweep whose ``memory`` does not fit, naming the ``alternatives`` (or a
    function of the available bytes that finds them) and single precision that would."""

    def found(available: int) -> list[simulate.Alternative]:
        named = alternatives(available) if callable(alternatives) else alternatives
        return [*named, *memory.single_precision(backend, num_qubits)]

    simulate.require_total(
        backend,
        memory.bytes(backend, num_qubits),
        f"{what} on {num_qubits} qubits ({memory.described()})",
        found,
    )


def cotangent_batch(circuit: DifferentiatedTape, cotangents) -> list[tuple] | None:
    """The K cotangents of a batch of cotangents, each as ``checked_cotangents`` gives it,
    or None for one cotangent. A batch (jax's vmap of a VJP: ``jax.jacobian`` of a QNode
    with ``device_vjp=True``) has one leading axis of size K on each measurement's
    cotangent, over its result's shape; a scalar or None serves every row."""
    tape = circuit.tape
    per_measurement = (cotangents,) if len(tape.measurements) == 1 else tuple(cotangents)
    batch = (circuit.register.batch_size,) if circuit.register.broadcast else ()
    batched, sizes = [], set()
    for mp, dy in zip(tape.measurements, per_measurement, strict=True):
        shape = np.shape(dy) if dy is not None else ()
        expected = batch + output_shape(mp, circuit.register)
        batched.append(len(shape) == len(expected) + 1 and shape[1:] == expected)
        if batched[-1]:
            sizes.add(shape[0])
    if not sizes:
        return None
    if len(sizes) > 1:
        raise DeviceError(
            f"custatevec.qubit got batches of cotangents of sizes {sorted(sizes)} for one "
            "tape; the cotangents of its measurements must batch alike."
        )
    rows = []
    for k in range(sizes.pop()):
        row = tuple(
            dy[k] if is_batched else dy
            for dy, is_batched in zip(per_measurement, batched, strict=True)
        )
        rows.append(checked_cotangents(circuit, row if len(row) > 1 else row[0]))
    return rows


def stacked_gradients(circuit: DifferentiatedTape, gradients: np.ndarray) -> tuple:
    """Per trainable parameter, from the rows of ``gradients`` ``(K, columns)``: an array
    of shape ``(K, *parameter_shape)``; ``()`` without trainable parameters."""
    if circuit.n_params == 0:
        return ()
    return tuple(circuit.fold(list(gradients.T)))


def checked_cotangents(circuit: DifferentiatedTape, cotangents) -> tuple:
    """PennyLane's per-tape cotangent as one entry per measurement, each of its result's
    shape (with the batch axis first for a broadcast tape), or a scalar, or None."""
    tape = circuit.tape
    per_measurement = (cotangents,) if len(tape.measurements) == 1 else tuple(cotangents)
    batch = (circuit.register.batch_size,) if circuit.register.broadcast else ()
    for mp, dy in zip(tape.measurements, per_measurement, strict=True):
        expected = output_shape(mp, circuit.register)
        if dy is not None and np.shape(dy) not in (batch + expected, ()):
            batched = "(K" + "".join(f", {n}" for n in batch + expected) + ")"
            raise DeviceError(
                f"custatevec.qubit got a cotangent of shape {np.shape(dy)} for {mp}, whose "
                f"result has shape {batch + expected}; a cotangent has its result's shape, "
                f"or is a scalar, and a batch of K cotangents has the shape {batched}."
            )
    return per_measurement


def is_zero(value) -> bool:
    return value is None or not np.any(np.asarray(value))


def output_size(mp: MeasurementProcess, register: Register) -> int:
    if isinstance(mp, (ProbabilityMP, StateMP)):
        return 2 ** len(mp.wires or register.wires)
    return 1


def output_shape(mp: MeasurementProcess, register: Register) -> tuple:
    """The shape of one (not broadcast) result of ``mp``."""
    return () if isinstance(mp, (ExpectationMP, VarianceMP)) else (output_size(mp, register),)


def one_hot_rows(circuit: DifferentiatedTape, measured: list[int]) -> list[tuple]:
    """One cotangent row per output of the measurements ``measured`` (indices into the
    tape's): 1 at that output, None elsewhere."""
    measurements = circuit.tape.measurements
    rows = []
    for i in measured:
        size = output_size(measurements[i], circuit.register)
        for output in range(size):
            row: list = [None] * len(measurements)
            scalar = isinstance(measurements[i], (ExpectationMP, VarianceMP))
            row[i] = 1.0 if scalar else np.eye(size)[output]
            rows.append(tuple(row))
    return rows


def format_jacobian(per_measurement: list[list[np.ndarray]], n_params: int):
    """measurement x parameter, with single measurements and single parameters unwrapped."""
    if n_params == 1:
        entries = [columns[0] for columns in per_measurement]
    else:
        entries = [tuple(columns) for columns in per_measurement]
    return entries[0] if len(entries) == 1 else tuple(entries)


def add_cotangent_terms(
    backend: Backend,
    bras: StateBatch,
    psi: StateBatch,
    register: Register,
    measurements: Sequence[MeasurementProcess],
    rows: Sequence[tuple],
    memo: dict | None = None,
) -> None:
    """bras[r] += the sum over measurements of each cotangent's term of row r (module
    docstring), for the final state ``psi`` (one vector, unchanged). ``memo``: the
    compilation's (``program.Compilation.memo``), which holds its Pauli plan."""
    plan = measure.pauli_plan(register, measurements, memo)
    if None not in plan.terms:  # Pauli expectation values only: one call per bra
        for r, row in enumerate(rows):
            coefficients = np.zeros(len(plan.words), dtype=np.complex128)
            for dy, terms in zip(row, plan.terms, strict=True):
                if not is_zero(dy):
                    for column, coefficient in terms:
                        coefficients[column] += 2.0 * float(dy) * coefficient
            live = np.flatnonzero(coefficients)
            if live.size:
                words = [plan.words[k] for k in live]
                backend.add_pauli_sum(
                    backend.vectors(bras, r, r + 1), psi, words, coefficients[live]
                )
        return
    for r, row in enumerate(rows):
        bra = backend.vectors(bras, r, r + 1)
        # the Pauli observables' terms as one sum: one backend call however many there are
        paulis = qml.pauli.PauliSentence()
        for mp, dy in zip(measurements, row, strict=True):
            if is_zero(dy):
                continue
            if isinstance(mp, ExpectationMP) and mp.obs.pauli_rep is not None:
                paulis += (2.0 * float(dy)) * mp.obs.pauli_rep
            elif isinstance(mp, VarianceMP):
                paulis += _add_variance_term(backend, bra, psi, register, mp.obs, float(dy))
            else:
                _add_term(backend, bra, psi, register, mp, dy)
        if paulis:
            measure.add_pauli_sentence(backend, bra, psi, register, paulis)


def _add_variance_term(
    backend, bra, psi, register: Register, obs: Operator, dy: float
) -> qml.pauli.PauliSentence:
    """bra += 2 dy (O^2 - 2<O> O) psi (module docstring), but for the part that is a
    Pauli sentence times psi, returned to join the other Pauli terms of the bra: all of
    it for a Pauli word (O^2 = c^2 I: <O^2> = c^2 <psi|psi>, whose term 2 dy c^2 psi
    vanishes for every gate with a generator, Re(i <psi|G|psi>) = 0, but not for a
    matrix's entries, which move psi off the unit sphere: ``entrywise``), -4 dy <O> O
    for a sum."""
    mean = float(measure.expval(backend, psi, register, obs)[0])
    sentence = obs.pauli_rep
    if sentence is not None and len(sentence) == 1:
        (coefficient,) = sentence.values()
        if np.imag(coefficient) == 0:
            norm = qml.pauli.PauliSentence({qml.pauli.PauliWord({}): 1.0})
            return (-4.0 * dy * mean) * sentence + (2.0 * dy * np.real(coefficient) ** 2) * norm
    applied = measure.applied_observable(backend, psi, register, obs)
    if sentence is not None:
        measure.add_pauli_sentence(backend, bra, applied, register, sentence, 2.0 * dy)
        return (-4.0 * dy * mean) * sentence
    backend.add_scaled(bra, measure.applied_observable(backend, applied, register, obs), [2 * dy])
    backend.add_scaled(bra, applied, [-4.0 * dy * mean])
    return qml.pauli.PauliSentence()


def _add_term(backend, bra, psi, register: Register, mp: MeasurementProcess, dy) -> None:
    """bra += the cotangent term of a state, probs, or expval of a non-Pauli observable."""
    if isinstance(mp, StateMP):
        backend.add_scaled(bra, backend.from_host(np.conj(np.asarray(dy))[None]), np.ones(1))
    elif isinstance(mp, ProbabilityMP):
        scaled = backend.copy(psi)
        weights = np.asarray(dy, dtype=np.complex128)[None]
        backend.apply_diagonal(scaled, weights, register.targets(mp.wires or register.wires))
        backend.add_scaled(bra, scaled, np.full(1, 2.0))
    else:
        applied = measure.applied_observable(backend, psi, register, mp.obs)
        backend.add_scaled(bra, applied, [2.0 * float(dy)])


def state_derivatives(backend: Backend, circuit: DifferentiatedTape) -> list[np.ndarray]:
    """Forward mode: d psi/d theta_j = U_N ... U_{j+1} (i G_j) phi_j for every trainable
    j, as host arrays (B, 2**n), one per column (the Jacobian of a state is that big)."""
    register = circuit.register
    n, batch = register.num_qubits, register.batch_size
    differentiated = len(circuit.columns) + sum(
        int(np.count_nonzero(columns >= 0)) - 1 for columns in circuit.entry_columns.values()
    )
    if circuit.state_columns is not None:
        differentiated += int(np.count_nonzero(circuit.state_columns[0] >= 0))
    vectors = (1 + differentiated) * batch
    vjp = eager_sweep_memory(backend, False, 1).bytes(backend, n) * batch
    simulate.require_total(
        backend,
        simulate.state_bytes(backend, n, vectors),
        f"the adjoint Jacobian of a state on {n} qubits ({vectors:,} state vectors: each "
        f"state and its derivative by each of {len(circuit.columns):,} trainable gates)",
        [
            simulate.Alternative(
                "device_vjp=True",
                "a VJP sweeps one bra per state instead of a derivative per gate",
                vjp,
            ),
            *simulate.single_precision(backend, simulate.state_bytes(backend, n, vectors) // 2),
        ],
    )
    state = simulate.initial_state(backend, register, batch)
    derivatives: list[StateBatch | None] = [None] * circuit.n_columns
    if circuit.state_columns is not None:  # d psi_0/d Re v_k = e_(i_k), d/d Im v_k = i e_(i_k)
        columns, indices = circuit.state_columns
        for part, column in enumerate(columns):
            if column >= 0:
                basis = np.zeros((batch, 2**n), dtype=np.complex128)
                basis[:, indices[part // 2]] = 1.0 if part % 2 == 0 else 1j
                derivatives[int(column)] = backend.from_host(basis)
    for index, step in enumerate(circuit.steps):
        entry_columns = circuit.entry_columns.get(index)
        fresh = {}  # derivatives that start after this step (from the state before it)
        if entry_columns is not None:
            fresh = _entry_derivatives(backend, state, step, entry_columns)
        for instruction in step.instructions:
            if instruction.kind is Kind.POSTSELECT:
                _renormalised_derivatives(backend, state, instruction, derivatives)
                continue
            apply_instruction(backend, state, instruction)
            for d in derivatives:
                if d is not None:
                    apply_instruction(backend, d, instruction)
        for column, derivative in fresh.items():
            derivatives[column] = derivative
        column = circuit.columns.get(index)
        if column is not None and entry_columns is None:
            generator = generator_of(step.operation)
            derivative = measure.applied_observable(backend, state, register, generator)
            backend.scale(derivative, np.full(1, 1j))
            derivatives[column] = derivative
    # the columns of observable data: the state does not depend on them
    zero = np.zeros((register.batch_size, 2**register.num_qubits), dtype=np.complex128)
    return [zero if d is None else backend.to_host(d) for d in derivatives]


def _renormalised_derivatives(
    backend: Backend, state: StateBatch, instruction, derivatives: list
) -> None:
    r"""A postselection in forward mode: ``state`` :math:`\chi` becomes
    :math:`\psi = \Pi\chi/\sqrt{p}` (``simulate.postselect``) and each derivative
    :math:`d\chi` becomes :math:`d\psi = (\Pi\,d\chi - \psi\,
    \mathrm{Re}\langle\psi|\Pi\,d\chi\rangle)/\sqrt{p}`, the derivative of the
    renormalised state (``eager._back_through_postselection`` is its transpose)."""
    scale = simulate.renormalising_factors(simulate.postselect(backend, state, instruction))
    for d in derivatives:
        if d is None:
            continue
        backend.apply_matrix(d, instruction.data, instruction.targets)
        backend.scale(d, scale)
        overlaps = np.real(backend.braket(state, backend.copy(d)))  # Re <psi_b|d_b>
        backend.add_scaled(d, state, -overlaps)


def _entry_derivatives(
    backend: Backend, phi: StateBatch, step, entry_columns: np.ndarray
) -> dict[int, StateBatch]:
    """{column: the derivative of the state after an ``EntrywiseUnitary`` U by that
    trainable real part}, from the state ``phi`` before it: d psi/d Re U_ac = E_ac phi and
    d psi/d Im U_ac = i E_ac phi (E_ac = |a><c| on U's bits); the later steps apply to
    them."""
    (instruction,) = step.instructions
    d = instruction.data.shape[-1]
    derivatives = {}
    for part, column in enumerate(entry_columns):
        if column < 0:
            continue
        entry = np.zeros((1, d, d), dtype=np.complex128)
        entry[0].flat[part // 2] = 1.0 if part % 2 == 0 else 1j
        derivative = backend.copy(phi)
        backend.apply_matrix(derivative, entry, instruction.targets)
        derivatives[int(column)] = derivative
    return derivatives
