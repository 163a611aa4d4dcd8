"""The signature key of a compiled QNode's call: what decides that two calls may share a
recording, a trace and a replay.

Per argument (positional, then keyword by name in the call's order): a torch tensor by its
shape, dtype, device and ``requires_grad``, a numpy array or Python value by its exact
value (``exact.value_key``), anything else by identity, nested in lists, tuples and
dicts. The tensors themselves are collected in one fixed order (``torch_leaves``), the
order in which ``with_tracers`` replaces them by a trace's tracers.

The key also holds what the quantum function reads by name outside its arguments
(``NamedReads``): the module globals and closure variables its code names, where they
are Python or numpy scalars (by exact value) or torch tensors (by identity and version
counter, so a rebinding or an in-place edit is another key). A quantum function that
reads such a value (``if FLAG > 0``, ``x * scale``) is then never replayed past a change
of it; state it reads otherwise (an attribute, a dict's entry, a global read by a helper
function) is checked by the compiled QNode's verification schedule only.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable

import numpy as np
import torch

from ..exact import identity_key, value_key
from .trace import Trace

_SCALARS = (bool, int, float, complex, str, np.generic, type(None))


@dataclasses.dataclass(frozen=True)
class NamedReads:
    """The module globals and closure cells that a quantum function's code names (its
    nested functions and comprehensions included)."""

    namespace: dict
    names: tuple[str, ...]
    cells: tuple

    @classmethod
    def of(cls, func: Callable) -> NamedReads:
        func = getattr(func, "__wrapped__", func)
        code = getattr(func, "__code__", None)
        if code is None:  # not a Python function: nothing read by name is known
            return cls({}, (), ())
        names: set[str] = set()
        _names_in(code, names)
        namespace = getattr(func, "__globals__", {})
        return cls(namespace, tuple(sorted(names)), tuple(func.__closure__ or ()))

    def key(self) -> tuple:
        """The values read now, as a part of the signature key (module docstring)."""
        namespace = self.namespace
        values = [namespace.get(name) for name in self.names]
        for cell in self.cells:
            try:
                values.append(cell.cell_contents)
            except ValueError:  # a cell not yet filled
                values.append(None)
        return tuple(_read_key(value) for value in values)


def _names_in(code: types.CodeType, names: set[str]) -> None:
    names.update(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            _names_in(constant, names)


def _read_key(value):
    if isinstance(value, _SCALARS):
        return value_key(value)
    if isinstance(value, torch.Tensor):
        return identity_key(value), value._version
    return None  # modules, functions, other objects: not part of the key


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
