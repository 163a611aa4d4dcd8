r"""``metric_tensor``: the Fubini-Study metric tensor of a QNode on ``custatevec.qubit``,
computed by the device, as a PennyLane transform.

It is shaped as ``qml.adjoint_metric_tensor`` and ``qml.metric_tensor``: an expansion
(PennyLane's: multi-parameter gates become gates of one parameter, so that the metric's
rows are PennyLane's), a tape transform that runs nothing and whose post-processing asks
the device for the metric of its tape (``CuStateVecDevice.compute_metric_tensor``), and
a classical co-transform that composes the gate-parameter metric :math:`g` with the
classical Jacobian :math:`J` of the QNode's arguments to the gate parameters,
:math:`J^T g J`, in the QNode's interface (autograd, torch, jax), as
``qml.metric_tensor`` does.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pennylane as qml
from pennylane.decomposition import gate_sets
from pennylane.exceptions import TermsUndefinedError
from pennylane.tape import QuantumScript
from pennylane.transforms import decompose
from pennylane.transforms.core import transform

from .device import CuStateVecDevice
from .device_metric import APPROXIMATIONS, MetricTensorError, parametrized_layers


def _one_generator_term(op) -> bool:
    """Where PennyLane's metric tensors stop expanding: an operation without parameters,
    or one whose generator is a single term (so that each gate parameter has one)."""
    try:
        return len(op.data) == 0 or (op.has_generator and len(op.generator().terms()[0]) == 1)
    except TermsUndefinedError:
        return True


def _expand(tape: QuantumScript, approx=None, device=None):
    """PennyLane's expansion for the metric tensor (``qml.metric_tensor``'s): every
    multi-parameter gate into gates of one parameter (Rot into RZ RY RZ, ...), the
    trainable parameters taken again from the new tape. A complex trainable parameter (a
    matrix, a state) is refused first: the metric is one of real parameters."""
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
    [new_tape], postprocessing = decompose(
        tape, gate_set=gate_sets.ROTATIONS_PLUS_CNOT, stopping_condition=_one_generator_term
    )
    if new_tape is not tape:
        params = new_tape.get_parameters(trainable_only=False)
        new_tape.trainable_params = qml.math.get_trainable_indices(params)
    return [new_tape], postprocessing


def _contracted(metric, cjac, tape):
    """The QNode's metric from the tape's: :math:`J^T g J` with the classical Jacobian
    ``cjac`` (one per argument where there are several: a tuple of metrics), the metric
    itself where ``cjac`` is the identity (``qml.metric_tensor``'s co-transform)."""
    if isinstance(metric, tuple) and len(metric) == 1:
        metric = metric[0]

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
        interface = qml.math.get_interface(*circuit.get_parameters())
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
