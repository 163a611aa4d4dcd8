r"""``metric_tensor``: the Fubini-Study metric tensor of a QNode on ``custatevec.qubit``,
computed by the device, as a PennyLane transform.

It is shaped as ``qml.adjoint_metric_tensor`` and ``qml.metric_tensor``: an expansion
(PennyLane's: multi-parameter gates become gates of one parameter, so that the metric's
rows are PennyLane's), a tape transform that runs nothing and whose post-processing asks
the device for the metric of its tape (``CuStateVecDevice.compute_metric_tensor``), and
a classical co-transform that composes the gate-parameter metric :math:`g` with the
classical Jacobian :math:`J` of the QNode's arguments to the gate parameters,
:math:`J^T g J`, in the QNode's interface (autograd, torch, jax), as
``qml.metric_tensor`` does. Outside jax the expansion's own Jacobian is taken here, one
backward pass a gate parameter, and its tape carries the gate parameters as one linear
function of the QNode tape's (``ParameterCarrier``), so that PennyLane's classical
Jacobian is taken of that one parameter, not through the expansion (``_expand``).
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pennylane as qml
from autograd.core import VJPNode, backward_pass
from autograd.tracer import getval, isbox, new_box, trace_stack
from pennylane.decomposition import gate_sets
from pennylane.exceptions import TermsUndefinedError
from pennylane.tape import QuantumScript
from pennylane.transforms import decompose
from pennylane.transforms.core import transform

from .device import CuStateVecDevice
from .device_metric import APPROXIMATIONS, MetricTensorError, parametrized_layers, rebound
from .queuing import without_queuing


def _one_generator_term(op) -> bool:
    """Where PennyLane's metric tensors stop expanding: an operation without parameters,
    or one whose generator is a single term (so that each gate parameter has one)."""
    try:
        return len(op.data) == 0 or (op.has_generator and len(op.generator().terms()[0]) == 1)
    except TermsUndefinedError:
        return True


def _expand(tape: QuantumScript, approx=None, device=None):
    r"""PennyLane's expansion for the metric tensor (``qml.metric_tensor``'s): every
    multi-parameter gate into gates of one parameter (Rot into RZ RY RZ, ...), the
    trainable parameters taken again from the new tape. A complex trainable parameter (a
    matrix, a state) is refused first: the metric is one of real parameters.

    Outside jax, the expanded tape's gates hold plain values and one more operation, a
    :class:`ParameterCarrier`, holds its only trainable parameter:
    :math:`c = J_{\mathrm{exp}}\,\theta`, with :math:`\theta` the flattened trainable
    parameters of ``tape`` (in their interface) and :math:`J_{\mathrm{exp}}` the
    expansion's Jacobian (``_expansion_jacobian``), a constant. PennyLane's classical
    Jacobian of the QNode's arguments :math:`x` is then taken of :math:`c`:
    :math:`\partial c/\partial x = J_{\mathrm{exp}}\,\partial\theta/\partial x`, the
    Jacobian of the gate parameters by the chain rule, whose graph no longer holds the
    expansion (one small backward pass per gate parameter instead of one over every gate).
    """
    parameters = tape.get_parameters(trainable_only=False)
    for index in tape.trainable_params:
        if qml.math.is_abstract(parameters[index]):
            continue
        if np.iscomplexobj(qml.math.unwrap(parameters[index])):
            op = tape.par_info[index]["op"]
            raise MetricTensorError(
                "custatevec.qubit cannot compute this metric tensor: the trainable "
                f"parameter of {op.name} is complex (a matrix or a state), which has no "
                "generator; the metric tensor is one of real gate parameters (rotations, "
                "phase shifts, ...): parametrize the gate by its angles."
            )
    carried = _carried_expansion(tape)
    if carried is not None:
        return [carried], _only_result
    [new_tape], postprocessing = _expanded(tape)
    if new_tape is not tape:
        params = new_tape.get_parameters(trainable_only=False)
        new_tape.trainable_params = qml.math.get_trainable_indices(params)
    return [new_tape], postprocessing


def _only_result(results):
    return results[0]


def _expanded(tape: QuantumScript):
    """``decompose`` to gates of one generator term (the expansion itself)."""
    return decompose(
        tape, gate_set=gate_sets.ROTATIONS_PLUS_CNOT, stopping_condition=_one_generator_term
    )


class ParameterCarrier(qml.operation.Operator):
    r"""The last operation of ``_expand``'s tape outside jax: no wires, one parameter,
    :math:`c = J_{\mathrm{exp}}\,\theta` (the expanded tape's trainable gate
    parameters as a linear function of the QNode tape's, for PennyLane's classical
    Jacobian), and the positions among the expanded tape's parameters that are trainable,
    in order. ``device_metric_tensor`` takes it off before anything is computed."""

    grad_method = None

    def __init__(self, value, positions: tuple[int, ...], interface: str, id=None):
        self._hyperparameters = {"positions": tuple(positions), "interface": interface}
        super().__init__(value, wires=(), id=id)

    @property
    def positions(self) -> tuple[int, ...]:
        return self.hyperparameters["positions"]

    @property
    def interface(self) -> str:
        return self.hyperparameters["interface"]


def _plain(value) -> np.ndarray:
    """A parameter's value as numpy, out of any autograd box or torch graph."""
    if qml.math.get_interface(value) == "torch":
        return value.detach().cpu().numpy()
    return np.asarray(getval(value))


def _carried_expansion(tape: QuantumScript) -> QuantumScript | None:
    """The expanded tape with its ``ParameterCarrier`` (``_expand``), or None where the
    expansion is taken as PennyLane takes it: jax (whose argnums mark trainable
    parameters by tracing them), no trainable parameters, an abstract (jitted) one, or an
    expanded trainable parameter that is not a scalar (a broadcast, an observable's
    matrix: refused later with the reason)."""
    trainable = list(tape.trainable_params)
    parameters = tape.get_parameters(trainable_only=False)
    values = [parameters[index] for index in trainable]
    if not values or qml.math.get_interface(*values) not in ("autograd", "torch"):
        return None
    if any(qml.math.is_abstract(value) for value in values):
        return None
    found = _expansion_jacobian(tape)
    if found is None:
        return None
    expanded, positions, jacobian = found
    flat = qml.math.concatenate([qml.math.reshape(value, (-1,)) for value in values])
    interface = qml.math.get_interface(*values)
    constant = qml.math.cast_like(qml.math.asarray(jacobian, like=interface), flat)
    carried = qml.math.tensordot(constant, flat, axes=[[1], [0]])
    with without_queuing():
        carrier = ParameterCarrier(carried, positions, interface)
        script = QuantumScript(
            [*expanded.operations, carrier], expanded.measurements, shots=expanded.shots
        )
    script.trainable_params = [sum(len(op.data) for op in expanded.operations)]
    return script


def _expansion_jacobian(tape: QuantumScript):
    r"""The expansion of ``tape`` (``_expanded``) with plain values, the positions of its
    trainable parameters (those that depend on ``tape``'s trainable ones) and their
    Jacobian :math:`J_{\mathrm{exp}}[r, k] = \partial \phi_r / \partial \theta_k` by
    the flattened trainable parameters :math:`\theta` of ``tape``; None where one of them
    is not a scalar or the expansion cannot run on autograd's values. The expansion runs
    once on an autograd trace of :math:`\theta`; each row is a backward pass from its own
    parameter, which walks only the few nodes that parameter depends on (not a stack of
    them all, as ``qml.jacobian`` would)."""
    parameters = tape.get_parameters(trainable_only=False)
    trainable = set(tape.trainable_params)
    plain = [_plain(value) for value in parameters]
    flat = np.concatenate([np.ravel(plain[index]) for index in sorted(trainable)])
    with trace_stack.new_trace() as trace:
        box = new_box(flat.astype(np.float64), trace, VJPNode.new_root())
        try:
            with without_queuing():
                [expanded], _ = _expanded(rebound(tape, plain, box))
        except Exception:  # a decomposition autograd cannot trace: PennyLane's way, as it was
            return None
        outputs = expanded.get_parameters(trainable_only=False)
    positions = [k for k, v in enumerate(outputs) if isbox(v) and v._trace == trace]
    if any(np.size(getval(outputs[k])) != 1 for k in positions):
        return None
    jacobian = np.zeros((len(positions), flat.size))
    for row, k in enumerate(positions):
        jacobian[row] = np.ravel(backward_pass(np.ones_like(getval(outputs[k])), outputs[k]._node))
    with without_queuing():
        expanded = expanded.bind_new_parameters(
            [getval(v) for v in outputs], list(range(len(outputs)))
        )
    return expanded, tuple(positions), jacobian


def _uncarried(tape: QuantumScript) -> tuple[QuantumScript, str | None]:
    """``tape`` without its ``ParameterCarrier`` (its trainable positions restored) and the
    carrier's interface; ``tape`` itself and None where it has none."""
    if not tape.operations or not isinstance(tape.operations[-1], ParameterCarrier):
        return tape, None
    carrier = tape.operations[-1]
    with without_queuing():
        script = QuantumScript(tape.operations[:-1], tape.measurements, shots=tape.shots)
    script.trainable_params = list(carrier.positions)
    return script, carrier.interface


def _contracted(metric, cjac, tape):
    """The QNode's metric from the tape's: :math:`J^T g J` with the classical Jacobian
    ``cjac`` (one per argument where there are several: a tuple of metrics), the metric
    itself where ``cjac`` is the identity (``qml.metric_tensor``'s co-transform)."""
    if isinstance(metric, tuple) and len(metric) == 1:
        metric = metric[0]
    if _uncarried(tape)[1] is not None:  # the Jacobian of the carrier, stacked alone
        cjac = (
            tuple(None if c is None else c[0] for c in cjac) if isinstance(cjac, tuple) else cjac[0]
        )

    def contract(c):
        return qml.math.tensordot(c, qml.math.tensordot(metric, c, axes=[[-1], [0]]), [[0], [0]])

    if isinstance(cjac, tuple):
        metrics = tuple(contract(c) for c in cjac if c is not None)
        return metrics[0] if len(metrics) == 1 else metrics
    if not qml.math.is_abstract(cjac):
        square = cjac.shape == (1,) or (cjac.ndim == 2 and cjac.shape[0] == cjac.shape[1])
        if square and qml.math.allclose(cjac, qml.math.eye(cjac.shape[0])):
            return metric
    return contract(cjac)


@functools.partial(
    transform,
    expand_transform=_expand,
    classical_cotransform=_contracted,
    is_informative=True,
)
def device_metric_tensor(tape: QuantumScript, approx=None, device=None):
    """The tape transform of :func:`metric_tensor`: no tapes to run; the post-processing
    asks ``device`` (a ``custatevec.qubit``) for the metric of the tape's trainable
    parameters, returned in the tape's interface."""
    if not isinstance(device, CuStateVecDevice):
        raise ValueError(
            "pennylane_custatevec.metric_tensor computes on a custatevec.qubit device: "
            f"pass a QNode on one (or device=), not {device!r}; use qml.metric_tensor or "
            "qml.adjoint_metric_tensor for other devices"
        )
    if approx not in APPROXIMATIONS:
        raise ValueError(
            f"Unknown value {approx!r} for approx; valid values are None, 'block-diag' and 'diag'."
        )
    tape, carried_interface = _uncarried(tape)
    if not tape.trainable_params:
        warnings.warn(
            "Attempted to compute the metric tensor of a tape with no trainable parameters.",
            UserWarning,
            stacklevel=2,
        )
        return [], lambda _: ()

    def processing_fn(tapes):
        (circuit,) = tapes
        layers = parametrized_layers(circuit) if approx is not None else None
        metric = device.compute_metric_tensor(circuit, approx, layers)
        interface = carried_interface or qml.math.get_interface(*circuit.get_parameters())
        if interface == "numpy":
            return metric
        return qml.math.asarray(np.asarray(metric), like=interface)

    return [tape], processing_fn


def metric_tensor(qnode: qml.QNode, approx: str | None = None):
    r"""The Fubini-Study metric tensor of ``qnode``'s trainable arguments, computed by its
    ``custatevec.qubit`` device:

    .. math::

        g_{ij} = \mathrm{Re}\langle\partial_i\psi|\partial_j\psi\rangle
            - \mathrm{Re}\langle\partial_i\psi|\psi\rangle\langle\psi|\partial_j\psi\rangle

    over the gate parameters, composed with the classical Jacobian of the arguments as
    ``qml.metric_tensor`` does.

    Args:
        qnode: a QNode on ``custatevec.qubit`` (any interface).
        approx: None (the full metric, as ``qml.adjoint_metric_tensor``), ``"block-diag"``
            or ``"diag"`` (``qml.metric_tensor``'s approximations: the generators'
            covariances per parametrized layer).

    Returns:
        A callable with the QNode's signature giving the metric tensor (a tuple of them
        for several trainable arguments) in the QNode's interface. It plugs into
        ``qml.QNGOptimizer.step(..., metric_tensor_fn=...)``. See :doc:`metric_tensor`.
    """
    if not isinstance(qnode, qml.QNode):
        raise ValueError(
            f"pennylane_custatevec.metric_tensor takes a QNode, not {type(qnode).__name__}"
        )
    return device_metric_tensor(qnode, approx=approx, device=qnode.device)
