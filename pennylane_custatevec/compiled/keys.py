"""The signature key of a compiled QNode's call: what decides that two calls may share a
recording, a trace and a replay.

Per argument (positional, then keyword by name in the call's order): a torch tensor by its
shape, dtype, device and ``requires_grad``, a numpy array or Python value by its exact
value (``exact.value_key``), anything else by identity, nested in lists, tuples and
dicts. The tensors themselves are collected in one fixed order (``torch_leaves``), the
order in which ``with_tracers`` replaces them by a trace's tracers.
"""

from __future__ import annotations

import torch

from ..exact import value_key
from .trace import Trace

_TENSOR = object()
"""The tag of a torch argument's part of a signature key: ``(_TENSOR, shape, dtype,
device, requires_grad)`` (a private object: no other part of a key holds it)."""


def argument_key(value, leaves: list):
    """An argument's part of the signature key (module docstring); its torch tensors are
    appended to ``leaves`` in the order ``with_tracers`` visits them."""
    if isinstance(value, torch.Tensor):
        leaves.append(value)
        return (_TENSOR, value.shape, value.dtype, value.device, value.requires_grad)
    if type(value) in (tuple, list):
        return (type(value), tuple(argument_key(item, leaves) for item in value))
    if type(value) is dict:
        return (dict, tuple((name, argument_key(item, leaves)) for name, item in value.items()))
    return value_key(value)  # exact values; an object of another kind by identity


def torch_leaves(value, leaves: list) -> None:
    """The torch tensors of an argument, in the order ``with_tracers`` visits them."""
    if isinstance(value, torch.Tensor):
        leaves.append(value)
    elif type(value) in (tuple, list):
        for item in value:
            torch_leaves(item, leaves)
    elif type(value) is dict:
        for item in value.values():
            torch_leaves(item, leaves)


def with_tracers(value, trace: Trace):
    """An argument with its torch tensors replaced by tracers of ``trace``."""
    if isinstance(value, torch.Tensor):
        return trace.tracer_of(value)
    if type(value) in (tuple, list):
        return type(value)(with_tracers(item, trace) for item in value)
    if type(value) is dict:
        return {name: with_tracers(item, trace) for name, item in value.items()}
    return value
