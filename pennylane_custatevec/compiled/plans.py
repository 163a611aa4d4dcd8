"""What every call of a batch of compiled structures shares (``CircuitsPlan``: the device,
the structures, their trainable parameters and where each comes from among the Function's
inputs), the nesting of a call's results (``ResultsLayout``, ``flatten``, ``unflatten``),
gate parameters as the device takes them (``as_numpy``) and the inputs' gradients from the
parameters' (``input_gradients``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from pennylane.devices import ExecutionConfig
from torch._C import _functorch

from ..structures import Structure, StructureRun


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
    sources: tuple[tuple[int, tuple | None], ...]
    """Per trainable parameter (the structures in order, each one's ``trainable`` in
    order): ``(k, index)``, the parameter is the Function's input ``k`` itself (index None)
    or its view ``input[index]`` (an index of ints and a trailing Ellipsis: what
    ``input[i]`` gives, also in numpy). A view's gradient is scattered into its input's."""
    gathers: tuple[_Gather, ...] | None
    """Per input, which parameters' gradients make its gradient; None: every input is one
    parameter itself (its gradient is the parameter's)."""

    @classmethod
    def of(cls, device, structures, config, sources=None) -> CircuitsPlan:
        """The plan of ``structures``; ``sources`` None: each trainable parameter its own
        input."""
        trainable = tuple(tuple(s.template.trainable_params) for s in structures)
        if sources is None:
            sources = tuple((k, None) for k in range(sum(map(len, trainable))))
        sources = tuple(sources)
        gathers = None
        if any(index is not None for _, index in sources):
            gathers = _Gather.of_inputs(sources)
        return cls(device, tuple(structures), trainable, config, sources, gathers)


@dataclasses.dataclass(frozen=True)
class _Gather:
    """How one input's gradient comes from the trainable parameters' gradients."""

    parameters: tuple[int, ...]
    """The numbers of the parameters that are this input or its views."""
    indices: tuple[tuple, ...] | None
    """Their indices into the input (None: the input is the one parameter itself)."""
    in_order: bool
    """Whether the views are ``input[0], input[1], ...`` in that order, each once: the
    gradient is then the parameters' gradients stacked (where they are all of them)."""

    @classmethod
    def of_inputs(cls, sources: tuple) -> tuple[_Gather, ...]:
        """Per input of ``sources`` (``CircuitsPlan.sources``), its gather."""
        inputs: dict[int, list] = {}
        for number, (k, index) in enumerate(sources):
            inputs.setdefault(k, []).append((number, index))
        gathers = []
        for k in range(len(inputs)):
            numbers = tuple(number for number, _ in inputs[k])
            indices = tuple(index for _, index in inputs[k])
            if indices == (None,):
                gathers.append(cls(numbers, None, False))
                continue
            in_order = all(index == (i, Ellipsis) for i, index in enumerate(indices))
            gathers.append(cls(numbers, indices, in_order))
        return tuple(gathers)


@dataclasses.dataclass
class ResultsLayout:
    """Filled by the forward pass of one call: how its flat outputs nest into each
    structure's results (``nesting``: per structure, its number of outputs and their
    nesting, see ``flatten``) and the device's run, for the backward pass."""

    nesting: tuple = ()
    run: StructureRun | None = None
    input_shapes: tuple = ()
    """The shapes of the Function's inputs (the gradients' shapes)."""


def as_numpy(value: object) -> object:
    """A gate parameter as the device takes it: a torch tensor's data as numpy (no copy on
    the CPU), anything else as it is."""
    if isinstance(value, torch.Tensor):
        try:
            if value.is_cpu and not value.is_conj():  # the usual case: the data as they are
                return value.detach().numpy()
            return value.detach().cpu().resolve_conj().numpy()
        except RuntimeError:  # torch.func's wrappers have no storage of their own
            if not _functorch.is_functorch_wrapped_tensor(value):
                raise
        return _wrapped_data(value)
    return value


def _wrapped_data(value: torch.Tensor) -> np.ndarray:
    """The data of a tensor wrapped by torch.func's gradient transforms (``torch.func.vjp``
    and ``jacrev`` wrap every argument, those they do not differentiate too), read below
    the transforms. A tensor batched by a vmap below them (``vmap(jacrev(compiled))`` over
    an argument) would give its whole batch for one row's parameter: refused."""
    inner = value
    while _functorch.is_functorch_wrapped_tensor(inner):
        if _functorch.is_batchedtensor(inner):
            raise RuntimeError(
                "pennylane_custatevec.compile: a gate parameter is batched by a "
                "torch.func.vmap outside another torch.func transform (vmap over jacrev or "
                "vjp of the compiled QNode); pass the batch as a broadcast input (a leading "
                "batch axis on the gate parameters), or vmap the compiled QNode itself."
            )
        inner = _functorch.get_unwrapped(inner)
    with torch._C._DisableFuncTorch():
        return value.detach().cpu().resolve_conj().numpy()


def flatten(result: object) -> tuple[list, object]:
    """(leaves, nesting) of a result: tuples and lists nest, anything else is a leaf."""
    if isinstance(result, (tuple, list)):
        leaves, children = [], []
        for item in result:
            item_leaves, nesting = flatten(item)
            leaves.extend(item_leaves)
            children.append((len(item_leaves), nesting))
        return leaves, (type(result), tuple(children))
    return [result], None


def unflatten(leaves: Sequence, nesting: object) -> object:
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


def input_gradients(
    plan: CircuitsPlan, gradients: list, shapes: tuple, batched: bool
) -> list[np.ndarray]:
    """The gradients of the Function's inputs from those of the trainable parameters
    (``gradients``, flat, a leading batch axis where ``batched``): an input that is a
    parameter itself takes its gradient; an input whose views are parameters the sum of
    theirs, each at its index (zeros elsewhere: what torch's indexing backward gives)."""
    if plan.gathers is None:
        return gradients
    out = []
    for gather, shape in zip(plan.gathers, shapes, strict=True):
        own = [gradients[number] for number in gather.parameters]
        if gather.indices is None:
            out.append(own[0])
        elif gather.in_order and len(own) == shape[0]:  # x[0], x[1], ...: all of x
            stacked = np.array(own)
            out.append(np.moveaxis(stacked, 0, 1) if batched else stacked)
        else:
            lead = own[0].shape[:1] if batched else ()
            total = np.zeros(lead + tuple(shape), dtype=np.result_type(*own))
            for index, gradient in zip(gather.indices, own, strict=True):
                total[(slice(None), *index) if batched else index] += gradient
            out.append(total)
    return out
