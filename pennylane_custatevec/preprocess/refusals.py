"""Refusals, by name, of what PennyLane's gradient transforms and ML interfaces would
differentiate wrongly or silently as zero: postselection, complex exponential coefficients
and the purity under a gradient transform, the angle of a ``qml.ftqc`` measurement basis,
parameter-shift's finite-difference fallback with shots, and derivatives of a higher order
than ``max_diff`` (or than autograd reaches)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pennylane as qml
from autograd.tracer import Box
from pennylane import math
from pennylane.exceptions import DeviceError
from pennylane.measurements import CountsMP, MutualInfoMP, PurityMP, SampleMP, StateMP, VnEntropyMP
from pennylane.operation import Operator
from pennylane.ops import Conditional, MidMeasure
from pennylane.tape import QuantumScript
from pennylane.transforms.core import transform

from ..advice import channel_message
from .common import first_result, is_dynamic_type, is_in_other_basis


class DifferentiatedMeasurementBasisError(DeviceError):
    """A PennyLane gradient transform asked to differentiate the angle of a ``qml.ftqc``
    measurement basis, which it cannot see."""


def differentiated_measurement_bases(tape: QuantumScript) -> list[MidMeasure]:
    """The ``qml.ftqc`` measurements of ``tape`` (alone or under ``cond_measure``) whose
    angle is being differentiated: an autograd box or a jax differentiation tracer, or a
    torch tensor that requires grad while torch records gradients."""
    dynamic = (op for op in tape.operations if is_dynamic_type(type(op)))
    measurements = [op.base if isinstance(op, Conditional) else op for op in dynamic]
    return [
        m
        for m in measurements
        if is_in_other_basis(m) and _is_differentiated(m.hyperparameters["angle"])
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
    return (tape,), first_result


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
    return (tape,), first_result


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
    differentiates the purity exactly (``gradients.observables``). A tape that also returns
    what PennyLane's transforms refuse (``_REFUSED_BY_PENNYLANE``) gets PennyLane's error.
    Only parameters whose derivative may be taken count (``_may_be_differentiated``): a
    forward evaluation runs.
    """
    if method in _VALUE_DIFFERENCING_TRANSFORMS:
        return (tape,), first_result
    purity = next((mp for mp in tape.measurements if isinstance(mp, PurityMP)), None)
    if purity is None or any(isinstance(mp, _REFUSED_BY_PENNYLANE) for mp in tape.measurements):
        return (tape,), first_result  # PennyLane's own error names the tape's state returns
    parameters = tape.get_parameters(trainable_only=False)
    if not any(_may_be_differentiated(parameters[p], torch_records) for p in tape.trainable_params):
        return (tape,), first_result
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
        return (tape,), first_result
    parameters = tape.get_parameters(trainable_only=False)
    differentiated = [
        p for p in tape.trainable_params if _may_be_differentiated(parameters[p], torch_records)
    ]
    if not differentiated:
        return (tape,), first_result
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
    return (tape,), first_result


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
        return (tape,), first_result
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
        return (tape,), first_result
    if not any(_differentiation_depth(v) > 1 for v in tape.get_parameters(trainable_only=False)):
        return (tape,), first_result
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
    return (tape,), first_result


@functools.cache
def _is_channel_type(kind: type) -> bool:
    """Whether an operation of type ``kind`` is a noise channel (cached by type: an
    ``isinstance`` on PennyLane's operator classes per operation costs more)."""
    return issubclass(kind, qml.operation.Channel)


@transform
def refuse_channels(tape: QuantumScript) -> tuple[tuple[QuantumScript], Callable]:
    """Refuse a tape that applies a noise channel (``qml.operation.Channel``, or a
    ``qml.cond`` of one), naming default.mixed (``advice.channel_message``), instead of
    PennyLane's "not supported ... no decomposition"."""
    for op in tape.operations:
        for candidate in (op, getattr(op, "base", None)):
            if candidate is not None and _is_channel_type(type(candidate)):
                raise DeviceError(channel_message(candidate.name))
    return (tape,), first_result
