"""The torch.autograd.Function that runs a compiled call's circuits on the device.

``apply(Circuits, call, layout, *trainable)`` runs ``call.plan.structures`` on
``call.plan.device`` (``execute_structures``) with the gate parameters of ``call`` and the
trainable ones given as tensors, and returns the results as flat torch tensors on the
inputs' torch device; its backward is the device's adjoint VJP (``vjp_structures``, with
the execution config of the forward pass, so the options in force at the forward pass).

Torch's cotangents follow the dL/dz* convention for complex outputs, PennyLane's the dL/dz
one: the backward conjugates them, as PennyLane's torch interface does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch._C import _functorch
from torch._functorch.utils import unwrap_dead_wrappers

from ..queuing import without_queuing
from ..structures import StructureRun
from .lanes import CircuitCall, DirectLane, LaneRun, bound_parameters
from .plans import CircuitsPlan, ResultsLayout, as_numpy, flatten, input_gradients, unflatten
from .vmap import unbatch_legacy


def _to_torch(value, device) -> torch.Tensor:
    """A device result (or gradient) as a torch tensor on ``device`` (None: the CPU),
    as ``torch.as_tensor`` makes it; numpy data on the CPU are shared, not copied
    (``torch.from_numpy``: the dtype and the memory that ``as_tensor`` gives)."""
    if device is None and isinstance(value, (np.ndarray, np.generic)):
        return torch.from_numpy(np.asarray(value))
    return torch.as_tensor(value, device=device)


def _host_cotangent(cotangent: torch.Tensor) -> np.ndarray:
    """A torch cotangent (dL/dz*) as the device takes it: PennyLane's dL/dz, numpy."""
    if cotangent.is_cpu and not cotangent.is_complex():  # real: its conjugate is itself
        return cotangent.detach().numpy()
    return np.asarray(torch.conj(cotangent).detach().cpu().resolve_conj().numpy())


def apply(function: type[torch.autograd.Function], *args):
    """``function.apply(*args)``. Where no torch.func transform is active, torch's own
    ``Function.apply`` binds the arguments to ``forward``'s signature on every call
    (``inspect.signature``, for functions with ``setup_context``), which is most of its
    cost; the arguments here are positional without defaults, so the binding changes
    nothing and the C-level apply that it ends in is called directly (after the same
    unwrapping of dead torch.func wrappers). Under a torch.func transform: torch's
    ``apply`` (``custom_function_call``, the vmap rules)."""
    if torch._C._are_functorch_transforms_active():
        return function.apply(*args)
    return super(torch.autograd.Function, function).apply(*unwrap_dead_wrappers(args))


class Circuits(torch.autograd.Function):
    """The circuits of one call (module docstring). Written in torch's ``setup_context``
    form so that torch.func transforms (``torch.func.vjp``) can run it; its backward is
    ``CircuitsVJP``, whose vmap rule takes a batch of cotangents in one sweep."""

    @staticmethod
    def forward(call: CircuitCall, layout: ResultsLayout, *trainable: torch.Tensor):
        plan = call.plan
        layout.input_shapes = tuple(tensor.shape for tensor in trainable)
        if call.lane is not None:
            host = [as_numpy(tensor) for tensor in trainable]
            lane, angles = call.lane, call.lane.angles(host, call.parameters)
            jacobians = None
            if call.jacobian_on_forward:
                result, direct_run, jacobian = plan.device.run_direct_jacobian(
                    lane.direct_plan, angles
                )
                jacobians = tuple(map(torch.from_numpy, lane.input_jacobians(jacobian)))
            else:
                result, direct_run = plan.device.run_direct(lane.direct_plan, angles)
            leaves, nesting = flatten(result)
            layout.nesting = ((len(leaves), nesting),)
            layout.run = LaneRun(direct_run, host, result, jacobians)
            return tuple(_to_torch(leaf, None) for leaf in leaves)
        with without_queuing():  # the device may build operators: never into a recording
            run = plan.device.execute_structures(
                plan.structures, bound_parameters(call, trainable), plan.config
            )
        leaves, nestings = [], []
        for result in run.results:
            result_leaves, nesting = flatten(result)
            leaves.extend(result_leaves)
            nestings.append((len(result_leaves), nesting))
        layout.nesting, layout.run = tuple(nestings), run
        return tuple(_to_torch(leaf, call.torch_device) for leaf in leaves)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.call, ctx.layout = inputs[0], inputs[1]
        ctx.save_for_backward(*inputs[2:])  # for CircuitsVJP with create_graph=True

    @staticmethod
    def backward(ctx, *cotangents: torch.Tensor):
        """The VJP. As a ``CircuitsVJP`` Function where its own rules matter: under a
        torch.func transform (its vmap rule) and with ``create_graph=True`` (grad mode on:
        its backward refuses a second derivative); else (a plain backward pass, grad mode
        off, nothing records) ``vjp`` itself, which is what that Function's forward runs.

        The gradients depend on the forward's inputs (through the final states), so
        ``CircuitsVJP`` takes them as inputs as well: a second derivative then reaches its
        backward, which refuses it, instead of torch taking the gradients for constants of
        the inputs (a Hessian without the circuit's second derivatives: a wrong number)."""
        return (None, None, *_backward(ctx.call, ctx.layout, cotangents, ctx.saved_tensors))


def _backward(
    call: CircuitCall,
    layout: ResultsLayout,
    cotangents: Sequence[torch.Tensor],
    inputs: Sequence[torch.Tensor],
) -> list[torch.Tensor]:
    """The gradients of a call's ``inputs`` for its outputs' ``cotangents`` in a backward
    pass (``Circuits.backward``)."""
    if torch.is_grad_enabled() or torch._C._are_functorch_transforms_active():
        return apply(CircuitsVJP, call, layout, len(cotangents), *cotangents, *inputs)
    run = layout.run
    if type(run) is LaneRun and run.jacobians is not None:
        gradients = run.torch_gradients(cotangents)
        if gradients is not None:
            return gradients
    return vjp(call, run, layout, cotangents)


class LaneJacobian(torch.autograd.Function):
    """A lane's call whose forward pass takes the Jacobian (``DirectLane.
    jacobian_on_forward``) where grad mode is on and no torch.func transform is active:
    what ``Circuits`` runs for it, in torch's older Function form (``forward`` with a
    context, no ``setup_context``), which torch applies with less work per call, with the
    plain backward pass (one real scalar cotangent per output, grad mode off) a product
    with the Jacobian in numpy. Every other backward pass is ``Circuits``'s
    (``_backward``, on the call and layout it would have built). torch.func transforms
    need the ``setup_context`` form: under them a call is a ``Circuits`` call.

    Measured with ``benchmarks/w4_floor.py`` (2 cores, W4's step, per forward and
    backward pass): the compiled QNode took 145-149 us with its lane calls through
    ``Circuits``, 120-122 us through this Function and the bound backend call
    (``direct.ForwardJacobian``)."""

    @staticmethod
    def forward(ctx, plan: CircuitsPlan, lane: DirectLane, parameters: tuple, *trainable):
        host = [tensor.detach().numpy() for tensor in trainable]  # lane.serves: CPU float64
        result, _, jacobian = plan.device.run_direct_jacobian(
            lane.direct_plan, lane.angles(host, parameters)
        )
        ctx.plan, ctx.lane, ctx.parameters, ctx.host, ctx.result = (
            plan,
            lane,
            parameters,
            host,
            result,
        )
        ctx.jacobians = lane.input_jacobians(jacobian)
        ctx.save_for_backward(*trainable)
        leaves, ctx.nesting = flatten(result)
        return tuple(torch.from_numpy(np.asarray(leaf)) for leaf in leaves)

    @staticmethod
    def backward(ctx, *cotangents: torch.Tensor):
        if len(cotangents) == 1 and not torch.is_grad_enabled():
            (dy,) = cotangents
            if (
                type(dy) is torch.Tensor
                and dy.dtype is torch.float64
                and dy.ndim == 0
                and dy.is_cpu
                and not _functorch.is_legacy_batchedtensor(dy)
            ):
                value = dy.item()
                return (
                    None,
                    None,
                    None,
                    *(
                        torch.from_numpy(np.asarray(jacobian[0] * value))
                        for jacobian in ctx.jacobians
                    ),
                )
        call = CircuitCall(ctx.plan, ctx.parameters, None, ctx.lane, True)
        run = LaneRun(None, ctx.host, ctx.result, tuple(map(torch.from_numpy, ctx.jacobians)))
        layout = ResultsLayout(
            ((len(cotangents), ctx.nesting),), run, tuple(t.shape for t in ctx.saved_tensors)
        )
        return (None, None, None, *_backward(call, layout, cotangents, ctx.saved_tensors))


class CircuitsVJP(torch.autograd.Function):
    """The gradients of a ``Circuits`` call's trainable tensors for its outputs'
    cotangents (``vjp``). Under torch.func's ``vmap`` (over a ``torch.func.vjp`` function,
    ``torch.func.jacrev``, torchjd) its vmap rule, under torch's legacy vmap
    (``is_grads_batched=True``, ``jacobian(..., vectorize=True)``, which never calls a vmap
    rule) ``unbatch_legacy`` in ``vjp``, give the batch of R cotangents to the device as one
    batch: one sweep. Its tensors: the ``n_cotangents`` cotangents, then the ``Circuits``
    call's inputs (unused: the gradients depend on them, see ``Circuits.backward``)."""

    @staticmethod
    def forward(call: CircuitCall, layout: ResultsLayout, n_cotangents: int, *tensors):
        return tuple(vjp(call, layout.run, layout, tensors[:n_cotangents]))

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass

    @staticmethod
    def backward(ctx, *_):
        raise RuntimeError(
            "pennylane_custatevec.compile: the adjoint method gives first derivatives only; "
            "a derivative of a gradient needs the QNode with diff_method='parameter-shift'."
        )

    @staticmethod
    def vmap(info, in_dims, call: CircuitCall, layout: ResultsLayout, n_cotangents, *tensors):
        """One sweep for the batch: each cotangent with its batch axis first (a cotangent
        without one repeated), the gradients with the batch axis first."""
        rows = []
        cotangents = tensors[:n_cotangents]
        for dy, axis in zip(cotangents, in_dims[3 : 3 + n_cotangents], strict=True):
            if axis is None:
                rows.append(dy.unsqueeze(0).expand(info.batch_size, *dy.shape))
            else:
                rows.append(dy.movedim(axis, 0))
        gradients = tuple(vjp(call, layout.run, layout, rows, batched=True))
        return gradients, (0,) * len(gradients)


def vjp(
    call: CircuitCall,
    run: StructureRun,
    layout: ResultsLayout,
    cotangents: Sequence,
    batched: bool = False,
) -> list[torch.Tensor]:
    """The gradients of the Function's inputs of ``call`` for the flat ``cotangents`` of
    its outputs (torch's convention), by one ``vjp_structures`` of ``run``; ``batched``: a
    leading axis of rows on every cotangent gives gradients with that leading axis.
    Cotangents batched by torch's legacy vmap reach the device as one batch of their rows
    (``unbatch_legacy``), and the gradients go back batched as they came."""
    cotangents, legacy = unbatch_legacy(cotangents)
    host = [_host_cotangent(dy) for dy in cotangents]
    if isinstance(run, LaneRun) and run.jacobians is not None:  # the forward's Jacobian
        return _torch_gradients(call, run.gradients(host), legacy)
    per_structure, start = [], 0
    for count, nesting in layout.nesting:
        per_structure.append(unflatten(host[start : start + count], nesting))
        start += count
    plan = call.plan
    if isinstance(run, LaneRun) and not batched and legacy is None:  # one cotangent each
        gradients = (plan.device.vjp_direct(run.direct_run, per_structure[0]),)
    else:
        if isinstance(run, LaneRun):  # a batch of cotangents: the general path's run
            run = run.general(call)
        with without_queuing():
            gradients = plan.device.vjp_structures(run, per_structure, plan.config)
    flat = [
        np.asarray(structure_gradients[index])
        for structure_gradients, positions in zip(gradients, plan.trainable, strict=True)
        for index in range(len(positions))
    ]
    flat = input_gradients(plan, flat, layout.input_shapes, batched or legacy is not None)
    return _torch_gradients(call, flat, legacy)


def _torch_gradients(call: CircuitCall, gradients: list, legacy) -> list[torch.Tensor]:
    """The inputs' ``gradients`` as torch tensors on the call's torch device, batched
    again by torch's legacy vmap where the cotangents came so (``legacy``)."""
    out = []
    for gradient in gradients:
        gradient = _to_torch(gradient, call.torch_device)
        if legacy is not None:
            gradient = legacy.batched(gradient)
        out.append(gradient)
    return out
