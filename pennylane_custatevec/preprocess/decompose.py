"""Decomposition to what the device runs: late state preparations, PennyLane's
``decompose`` with the device's stopping condition (exponentials by their real angle, a
refusal by name where jax.jit traces what a decomposition needs concrete), native templates
whose gradient the differentiation in use cannot hand back whole, runs of rotations gathered
into one ``PauliRotations``, and the work wires that decompositions allocate."""

from __future__ import annotations

import pennylane as qml
from pennylane import math
from pennylane.devices.preprocess import decompose, device_resolve_dynamic_wires
from pennylane.exceptions import DeviceError
from pennylane.operation import Operator, StatePrepBase
from pennylane.ops import SProd
from pennylane.queuing import QueuingManager
from pennylane.tape import QuantumScript
from pennylane.transforms.core import transform
from pennylane.wires import Wires

from ..program import scalar_parameters
from ..rotations import ROTATION_GATES, PauliRotations, gate_of
from ..templates import is_native_template, template_operations
from .common import first_result


@transform
def decompose_late_state_preps(tape: QuantumScript):
    """Replace state preparations after the first operation by their decompositions.

    The device starts from a prepared state only at the beginning of a circuit.
    """
    if not any(isinstance(op, StatePrepBase) for op in tape.operations[1:]):
        return (tape,), first_result
    operations = []
    for position, op in enumerate(tape.operations):
        if position > 0 and isinstance(op, StatePrepBase):
            operations.extend(op.decomposition())
        else:
            operations.append(op)
    return (tape.copy(operations=operations),), first_result


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
        return (tape,), first_result
    shapes = {math.shape(parameters[i]) for i in trainable}
    if array_gradients and len(shapes) == 1:
        return (tape,), first_result
    operations = []
    for position, op in enumerate(tape.operations):
        if position in templates:
            operations.extend(template_operations(op))
        else:
            operations.append(op)
    return (tape.copy(operations=operations),), first_result


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
        return (tape,), first_result
    operations = []
    for run in runs:
        if not isinstance(run, list):
            operations.append(run)
        elif len(run) >= 2:
            gates = tuple(gate_of(op) for op in run)
            operations.append(PauliRotations(*(op.data[0] for op in run), gates=gates))
        else:
            operations.extend(run)
    return (tape.copy(operations=operations),), first_result


_GATHERED = frozenset(ROTATION_GATES)


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


@transform
def allocate_dynamic_wires(tape: QuantumScript, wires: Wires | None, allow_resets: bool):
    """PennyLane's ``device_resolve_dynamic_wires`` (work wires that ``qml.allocate`` and
    decompositions such as TemporaryAnd's allocate take the device's free wires) for a
    tape that allocates; any other passes as it is (PennyLane's rebuilds every tape:
    about 20 us for 47 gates, measured with timeit)."""
    if not any(op.name == "Allocate" for op in tape.operations):
        return (tape,), first_result
    return device_resolve_dynamic_wires(tape, wires=wires, allow_resets=allow_resets)
