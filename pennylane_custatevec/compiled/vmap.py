"""Torch's two vmaps at the compiled path's boundary: their batch axes taken off tensors on
the way in and put back on the way out, so that a batch reaches the device as one batch.

- **torch.func.vmap over a compiled QNode** (``VmapCall``): the inputs arrive as functorch
  BatchedTensors of the innermost vmap level. The quantum function is recorded on them as
  they are (each gate parameter then stands for one row: its logical shape), every gate
  parameter's batch axis is taken off and moved first (a parameter the vmap did not batch
  stays as it is), and the tape runs once as a broadcast tape of the vmap's batch size:
  PennyLane's broadcasting gives row ``r`` of each result for row ``r`` of the inputs, so the
  results go back batched at their leading axis.
- **Torch's legacy vmap in the backward** (``LegacyBatch``): ``autograd.grad(...,
  is_grads_batched=True)`` and ``autograd.functional.jacobian(..., vectorize=True)`` never call
  a Function's vmap rule; the cotangents arrive as legacy BatchedTensors, whose rows go to the
  device as one batch, and the gradients go back batched as they came.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
from torch._C import _functorch
from torch._functorch.pyfunctorch import retrieve_current_functorch_interpreter

_ALTERNATIVE = (
    "pass the batch as a broadcast input (a leading batch axis on the gate parameters, "
    "as the QNode takes it)"
)


@dataclasses.dataclass(frozen=True)
class VmapCall:
    """A compiled QNode called under ``torch.func.vmap`` with inputs batched at ``level``
    (the innermost vmap, of ``size`` rows)."""

    level: int
    size: int
    interpreter: object
    """torch's interpreter of that vmap (``lower()`` runs code below it)."""

    @classmethod
    def of(cls, leaves: Sequence[torch.Tensor]) -> VmapCall | None:
        """The innermost torch.func transform if it is a vmap that batches some of the
        torch arguments ``leaves``, else None (other transforms, as torch.func.vjp over a
        replayed call, take the compiled path as it is)."""
        if _functorch.peek_interpreter_stack() is None:
            return None
        interpreter = retrieve_current_functorch_interpreter()
        if interpreter.key() != _functorch.TransformType.Vmap:
            return None
        level = interpreter.level()
        if not any(
            _functorch.is_batchedtensor(leaf) and _functorch.maybe_get_level(leaf) == level
            for leaf in leaves
        ):
            return None
        return cls(level, interpreter.batch_size(), interpreter)

    def broadcast(self, value):
        """A gate parameter recorded under the vmap as the broadcast tape takes it: its
        batch axis first; an unbatched value as it is. Run below the vmap
        (``interpreter.lower()``)."""
        if not isinstance(value, torch.Tensor):
            return value
        unwrapped, axis = _functorch._unwrap_batched(value, self.level)
        if _functorch.is_functorch_wrapped_tensor(unwrapped):
            raise RuntimeError(
                "pennylane_custatevec.compile: a gate parameter is batched by nested vmaps "
                f"(or another torch.func transform); {_ALTERNATIVE}."
            )
        return unwrapped if axis is None else unwrapped.movedim(axis, 0)

    def batched(self, result):
        """A broadcast result as the vmap returns it: every torch tensor batched at its
        leading axis; tuples, lists and dicts nest."""
        return _map_tensors(lambda leaf: _functorch._add_batch_dim(leaf, 0, self.level), result)


def _map_tensors(function: Callable, value):
    if isinstance(value, torch.Tensor):
        return function(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_map_tensors(function, item) for item in value)
    if isinstance(value, dict):
        return {name: _map_tensors(function, item) for name, item in value.items()}
    return value


_LEGACY_VMAP_LEVELS = 64
"""Torch's legacy vmap nests at most 64 levels (``kVmapNumLevels`` in ATen's
``LegacyBatchedTensorImpl.h``)."""


@dataclasses.dataclass(frozen=True)
class LegacyBatch:
    """The batch of a backward pass under torch's legacy vmap (``autograd.grad`` with
    ``is_grads_batched=True``, ``autograd.functional.jacobian`` with ``vectorize=True``):
    the cotangents arrive as legacy BatchedTensors of one vmap ``level``, each standing for
    ``size`` rows; the gradients go back batched at that level (``batched``)."""

    level: int
    size: int

    def batched(self, gradient: torch.Tensor) -> torch.Tensor:
        """A gradient with its leading axis of ``size`` rows as a legacy BatchedTensor."""
        return torch._add_batch_dim(gradient, 0, self.level)


def _legacy_level(cotangent: torch.Tensor) -> int:
    """The one legacy vmap level that batches ``cotangent``: the level whose removal leaves
    a plain tensor. Legacy BatchedTensors do not expose their levels to Python; removing a
    level the tensor is not batched at leaves it batched (at its own levels), so the trial
    is exact."""
    for level in range(1, _LEGACY_VMAP_LEVELS + 1):
        removed = torch._remove_batch_dim(cotangent, level, 1, 0)
        if not _functorch.is_legacy_batchedtensor(removed):
            return level
    raise RuntimeError(
        "pennylane_custatevec.compile: a cotangent is batched by nested legacy vmaps "
        "(autograd.grad with is_grads_batched=True inside another); use torch.func.vmap "
        "over torch.func.vjp, or torch.func.jacrev."
    )


def unbatch_legacy(cotangents: Sequence[torch.Tensor]) -> tuple[list, LegacyBatch | None]:
    """Cotangents of a legacy-vmapped backward as plain tensors with their batch axis first
    (a cotangent the vmap did not batch, as torch's zeros for an unused output, repeated
    on every row), and their ``LegacyBatch``; cotangents without a legacy batch as they are,
    and None."""
    batched = [_functorch.is_legacy_batchedtensor(dy) for dy in cotangents]
    if not any(batched):
        return list(cotangents), None
    levels = {
        _legacy_level(dy) for dy, is_batched in zip(cotangents, batched, strict=True) if is_batched
    }
    if len(levels) != 1:
        raise RuntimeError(
            "pennylane_custatevec.compile: the cotangents are batched by different legacy "
            f"vmap levels {sorted(levels)}; use torch.func.vmap over torch.func.vjp."
        )
    (level,) = levels
    rows = [
        torch._remove_batch_dim(dy, level, 1, 0) if is_batched else None
        for dy, is_batched in zip(cotangents, batched, strict=True)
    ]
    size = next(row.shape[0] for row in rows if row is not None)
    rows = [
        dy.unsqueeze(0).expand(size, *dy.shape) if row is None else row
        for dy, row in zip(cotangents, rows, strict=True)
    ]
    return rows, LegacyBatch(level, size)
