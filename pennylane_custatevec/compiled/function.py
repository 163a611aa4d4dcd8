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

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from pennylane.devices import ExecutionConfig
from torch._functorch.utils import unwrap_dead_wrappers

from ..queuing import without_queuing
from ..structures import Structure, StructureRun
from .vmap import unbatch_legacy


@dataclasses.dataclass(frozen=True)
class CircuitsPlan:
    """What every call of one batch of structures runs on the device (built once per
    signature key that replays, once per call that records)."""

    device: object
    """The ``custatevec.qubit`` device."""
    structures: tuple[Structure, ...]
    """One per device tape of the call."""
    trainable: tuple[tuple[int, ...], ...]
    """Per structure, the positions of its trainable parameters (``trainable_params``)."""
    config: ExecutionConfig
    """The execution config of the calls (the options in force at their forward pass)."""


@dataclasses.dataclass(frozen=True)
class CircuitCall:
    """What one call of a compiled QNode runs on the device: its plan with its parameters."""

    plan: CircuitsPlan
    parameters: tuple[list, ...]
    """Per structure, its operation parameters as the device takes them (numpy arrays or
    Python numbers); the entries at ``plan.trainable`` (None here) are filled with the
    trainable tensors' data in the forward pass."""
    torch_device: torch.device | None
    """Where the results go: the torch device of the first CUDA parameter, else the CPU
    (as PennyLane's torch interface decides)."""


@dataclasses.dataclass
class ResultsLayout:
    """Filled by the forward pass of one call: how its flat outputs nest into each
    structure's results (``nesting``: per structure, its number of outputs and their
    nesting, see ``flatten``) and the device's run, for the backward pass."""

    nesting: tuple = ()
    run: StructureRun | None = None


def as_numpy(value):
    """A gate parameter as the device takes it: a torch tensor's data as numpy (no copy on
    the CPU), anything else as it is."""
    if isinstance(value, torch.Tensor):
        if value.is_cpu and not value.is_conj():  # the usual case: the data as they are
            return value.detach().numpy()
        return value.detach().cpu().resolve_conj().numpy()
    return value


def flatten(result) -> tuple[list, object]:
    """(leaves, nesting) of a result: tuples and lists nest, anything else is a leaf."""
    if isinstance(result, (tuple, list)):
        leaves, children = [], []
        for item in result:
            item_leaves, nesting = flatten(item)
            leaves.extend(item_leaves)
            children.append((len(item_leaves), nesting))
        return leaves, (type(result), tuple(children))
    return [result], None


def unflatten(leaves: Sequence, nesting):
    """The inverse of ``flatten``."""
    if nesting is None:
        (leaf,) = leaves
        return leaf
    kind, children = nesting
    items, start = [], 0
    for count, child in children:
        items.append(unflatten(leaves[start : start + count], child))
        start += count
    return kind(items)


def _bound_parameters(call: CircuitCall, trainable: Sequence[torch.Tensor]) -> list[list]:
    """Per structure, its parameter values with the trainable tensors' data in place."""
    values, taken = [], 0
    for parameters, positions in zip(call.parameters, call.plan.trainable, strict=True):
        bound = list(parameters)
        for position in positions:
            bound[position] = as_numpy(trainable[taken])
            taken += 1
        values.append(bound)
    return values


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
        with without_queuing():  # the device may build operators: never into a recording
            run = plan.device.execute_structures(
                plan.structures, _bound_parameters(call, trainable), plan.config
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

    @staticmethod
    def backward(ctx, *cotangents: torch.Tensor):
        """The VJP. As a ``CircuitsVJP`` Function where its own rules matter: under a
        torch.func transform (its vmap rule) and with ``create_graph=True`` (grad mode on:
        its backward refuses a second derivative); else (a plain backward pass, grad mode
        off, nothing records) ``vjp`` itself, which is what that Function's forward runs."""
        if torch.is_grad_enabled() or torch._C._are_functorch_transforms_active():
            return (None, None, *apply(CircuitsVJP, ctx.call, ctx.layout, *cotangents))
        return (None, None, *vjp(ctx.call, ctx.layout.run, ctx.layout, cotangents))


class CircuitsVJP(torch.autograd.Function):
    """The gradients of a ``Circuits`` call's trainable tensors for its outputs'
    cotangents (``vjp``). Under torch.func's ``vmap`` (over a ``torch.func.vjp`` function,
    ``torch.func.jacrev``, torchjd) its vmap rule, under torch's legacy vmap
    (``is_grads_batched=True``, ``jacobian(..., vectorize=True)``, which never calls a vmap
    rule) ``unbatch_legacy`` in ``vjp``, give the batch of R cotangents to the device as one
    batch: one sweep."""

    @staticmethod
    def forward(call: CircuitCall, layout: ResultsLayout, *cotangents: torch.Tensor):
        return tuple(vjp(call, layout.run, layout, cotangents))

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
    def vmap(info, in_dims, call: CircuitCall, layout: ResultsLayout, *cotangents):
        """One sweep for the batch: each cotangent with its batch axis first (a cotangent
        without one repeated), the gradients with the batch axis first."""
        rows = []
        for dy, axis in zip(cotangents, in_dims[2:], strict=True):
            if axis is None:
                rows.append(dy.unsqueeze(0).expand(info.batch_size, *dy.shape))
            else:
                rows.append(dy.movedim(axis, 0))
        gradients = tuple(vjp(call, layout.run, layout, rows))
        return gradients, (0,) * len(gradients)


def vjp(
    call: CircuitCall, run: StructureRun, layout: ResultsLayout, cotangents: Sequence
) -> list[torch.Tensor]:
    """The gradients of the trainable tensors of ``call`` for the flat ``cotangents`` of
    its outputs (torch's convention), by one ``vjp_structures`` of ``run``; a leading
    axis of ``batch`` rows on every cotangent gives gradients with that leading axis.
    Cotangents batched by torch's legacy vmap reach the device as one batch of their rows
    (``unbatch_legacy``), and the gradients go back batched as they came."""
    cotangents, legacy = unbatch_legacy(cotangents)
    host = [_host_cotangent(dy) for dy in cotangents]
    per_structure, start = [], 0
    for count, nesting in layout.nesting:
        per_structure.append(unflatten(host[start : start + count], nesting))
        start += count
    plan = call.plan
    with without_queuing():
        gradients = plan.device.vjp_structures(run, per_structure, plan.config)
    out = []
    for structure_gradients, positions in zip(gradients, plan.trainable, strict=True):
        for index in range(len(positions)):
            gradient = _to_torch(np.asarray(structure_gradients[index]), call.torch_device)
            if legacy is not None:
                gradient = legacy.batched(gradient)
            out.append(gradient)
    return out
