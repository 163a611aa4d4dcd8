"""Values a machine-learning framework differentiates, found where PennyLane's interface
did not take them: circuits that reach the device holding them run again through
PennyLane's workflow (``execute_through_workflow``), and derivatives asked for inside
torch's differentiable backward pass are refused (``refuse_differentiable_backward``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np
import pennylane as qml
from autograd.tracer import Box
from pennylane import math
from pennylane.devices import Device, ExecutionConfig
from pennylane.exceptions import DeviceError
from pennylane.tape import QuantumScript

from .preprocess.refusals import SecondDerivativesError
from .queuing import without_queuing

_PLAIN_VALUE_TYPES = (float, int, complex, np.float64, np.complex128)


def holds_differentiated_values(circuits: Sequence[QuantumScript]) -> bool:
    """Whether a parameter of ``circuits`` is one a framework differentiates
    (``_differentiated_items``). PennyLane's workflow hands the device numpy values;
    these come from code that calls ``dev.execute`` inside a differentiated function
    (PennyLane's gradient-transform tests do: ``fn(dev.execute(tapes))`` under
    ``torch.autograd.functional.jacobian`` or ``jax.jacobian``), and from a circuit whose
    interface PennyLane takes for numpy while autograd traces it: one whose parameter is
    a numpy array of autograd values, such as ``qml.AngleEmbedding((a, b), ...)`` with
    trainable scalars a and b under ``qml.grad`` (numpy builds an array of objects, and
    the gates of its decomposition get elements of it)."""
    return any(
        type(value) not in _PLAIN_VALUE_TYPES and _differentiated_items(value) is not None
        for circuit in circuits
        for op in circuit.operations
        for value in op.data
    )


def _differentiated_items(value) -> list | None:
    """``[value]`` for an autograd value, a torch tensor that requires grad or a jax
    tracer; the elements of a numpy array of objects that holds an autograd value; else
    None. Torch and jax are looked up only where already imported."""
    if isinstance(value, Box):
        return [value]
    if isinstance(value, np.ndarray):
        if value.dtype == np.dtype(object):
            items = list(value.flat)
            if any(isinstance(item, Box) for item in items):
                return items
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor) and value.requires_grad:
        return [value]
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(value, jax.core.Tracer):
        return [value]
    return None


def _with_differentiated_parameters(circuit: QuantumScript) -> QuantumScript:
    """``circuit`` with each numpy array of objects that holds autograd values as one
    autograd array (so that PennyLane finds the interface), and the differentiated
    parameters marked trainable."""
    parameters = circuit.get_parameters(trainable_only=False)
    trainable = []
    for index, value in enumerate(parameters):
        items = _differentiated_items(value)
        if items is None:
            continue
        trainable.append(index)
        if isinstance(value, np.ndarray):
            stacked = math.stack([math.asarray(item, like="autograd") for item in items])
            parameters[index] = math.reshape(stacked, value.shape)
    return circuit.bind_new_parameters(parameters, list(range(len(parameters)))).copy(
        trainable_params=trainable
    )


def refuse_differentiable_backward() -> None:
    """Refuse derivatives (a VJP, a Jacobian) asked for inside torch's backward pass with
    ``create_graph=True`` (torch enables grad mode in a backward pass only then: a
    Hessian, a gradient penalty, PennyLane's ``classical_fisher``): they are computed
    outside torch, so every derivative of them would be zero. (Tensors that raise only
    when differentiated again cannot be made here: the device does not hold the torch
    inputs they would have to depend on.) For torch the device takes the Jacobian in the
    backward pass (``grad_on_execution=False`` unless set), so that this check sees it."""
    torch = sys.modules.get("torch")  # imported by whoever runs a torch backward pass
    if torch is None or not torch.is_grad_enabled():
        return
    if torch._C._current_graph_task_id() == -1:  # not inside a backward pass
        return
    raise SecondDerivativesError(
        "custatevec.qubit's derivatives are not differentiable, and torch asked for them "
        "with create_graph=True (a Hessian, a gradient of a gradient), whose derivatives "
        "would be zero. Set max_diff=2 on the QNode with diff_method='parameter-shift' (or "
        "'best', which picks it then)."
    )


def execute_through_workflow(
    device: Device, circuits: Sequence[QuantumScript], config: ExecutionConfig
):
    """Circuits whose parameters a framework differentiates
    (``holds_differentiated_values``) that reached the device without PennyLane's
    interface for it (default.qubit is traced by the framework; this device is not):
    executed again through PennyLane's workflow, which now finds their interface, so
    that the framework differentiates them by the gradient method of ``config``. The
    tracker counts them once; other threads' recordings wait for this execution
    (``without_queuing``)."""
    if config.mcm_config.mcm_method == "one-shot" and any(
        isinstance(op, qml.ops.MidMeasure) for c in circuits for op in c.operations
    ):
        raise DeviceError(
            "custatevec.qubit cannot differentiate, with mcm_method='one-shot', a "
            "circuit that reached it with differentiated values outside PennyLane's "
            "interface (an array of autograd values such as a tuple of trainable "
            "scalars, or dev.execute called inside torch or jax differentiation); "
            "stack the values into one array (qml.numpy.stack), run a QNode, or use "
            "mcm_method='deferred'."
        )
    tracking, device.tracker.active = device.tracker.active, False
    try:
        with without_queuing():  # a rare path: PennyLane's workflow builds operators
            return qml.execute(
                [_with_differentiated_parameters(circuit) for circuit in circuits],
                device,
                diff_method=config.gradient_method or "best",
                device_vjp=bool(config.use_device_jacobian_product),
                max_diff=config.derivative_order,
                gradient_kwargs=config.gradient_keyword_arguments,
                postselect_mode=config.mcm_config.postselect_mode,
                mcm_method=config.mcm_config.mcm_method,
            )
    finally:
        device.tracker.active = tracking
