"""The torch.autograd.Function that runs a compiled call's circuits on the device.

``Circuits.apply(call, layout, *trainable)`` runs ``call.structures`` on
``call.device`` (``execute_structures``) with the gate parameters of ``call`` and the
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

from ..queuing import without_queuing
from ..structures import Structure, StructureRun
from .vmap import unbatch_legacy


@dataclasses.dataclass(frozen=True)
class CircuitCall:
    """What one call of a compiled QNode runs on the device."""

    device: object
    """The ``custatevec.qubit`` device."""
    structures: tuple[Structure, ...]
    """One per device tape of the call."""
    parameters: tuple[tuple, ...]
    """Per structure, its operation parameters as the device takes them (numpy arrays or
    Python numbers); the entries at ``trainable`` are replaced by the trainable tensors."""
    trainable: tuple[tuple[int, ...], ...]
    """Per structure, the positions of its trainable parameters (``trainable_params``)."""
    config: ExecutionConfig
    """The execution config of the call (the options in force at its forward pass)."""
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
    for parameters, positions in zip(call.parameters, call.trainable, strict=True):
        bound = list(parameters)
        for position in positions:
            bound[position] = as_numpy(trainable[taken])
            taken += 1
        values.append(bound)
    return values


def _to_torch(value, device) -> torch.Tensor:
    return torch.as_tensor(value, device=device)


class Circuits(torch.autograd.Function):
    """The circuits of one call (module docstring). Written in torch's ``setup_context``
    form so that torch.func transforms (``torch.func.vjp``) can run it; its backward is
    ``CircuitsVJP``, whose vmap rule takes a batch of cotangents in one sweep."""

    @staticmethod
    def forward(call: CircuitCall, layout: ResultsLayout, *trainable: torch.Tensor):
        with without_queuing():  # the device may build operators: never into a recording
            run = call.device.execute_structures(
                call.structures, _bound_parameters(call, trainable), call.config
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
        return (None, None, *CircuitsVJP.apply(ctx.call, ctx.layout, *cotangents))


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
    host = [np.asarray(torch.conj(dy).detach().cpu().resolve_conj().numpy()) for dy in cotangents]
    per_structure, start = [], 0
    for count, nesting in layout.nesting:
        per_structure.append(unflatten(host[start : start + count], nesting))
        start += count
    with without_queuing():
        gradients = call.device.vjp_structures(run, per_structure, call.config)
    out = []
    for structure_gradients, positions in zip(gradients, call.trainable, strict=True):
        for index in range(len(positions)):
            gradient = _to_torch(np.asarray(structure_gradients[index]), call.torch_device)
            if legacy is not None:
                gradient = legacy.batched(gradient)
            out.append(gradient)
    return out
