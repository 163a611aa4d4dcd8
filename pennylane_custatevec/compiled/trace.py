"""The recorder of torch expressions: what a quantum function computes from its arguments.

A trace runs the quantum function (and the device's preprocessing) once with each torch
tensor argument replaced by a ``Tracer``: a ``torch.Tensor`` subclass holding the
argument's own data. While it runs, a torch function mode (``Trace.recording``) sees every
torch call, and records as a ``Node`` (function, arguments, the shapes of its outputs)
each call that either takes a tracer or draws random numbers (``randomness``: a call that
changes a watched generator's state); the outputs of a recorded call are tracers again.
Every other call (a factory such as ``torch.tensor(0.5)``, arithmetic on a global tensor)
computes a constant, which enters the recorded calls as an argument. So every gate
parameter of the traced tapes is an expression whose leaves are only:

- the call's arguments;
- random draws, which every replay makes again (the same generators, in the same order);
- constants, held by the nodes as snapshots (tensors copied when recorded): whether they
  are constant is proven by the caller, which compares two traces bit for bit
  (``Trace.difference``).

``Trace.replay`` evaluates those expressions on new arguments with plain torch operations,
so that torch's autograd differentiates the path from the arguments to the gate
parameters.

What a trace cannot replay, it refuses at once by raising ``TraceRefused`` (the caller
then records the quantum function anew on each call): a tracer's value leaving torch
(``bool``, ``int``, ``float``, ``.item()``, ``.tolist()``, ``.numpy()``, ``__array__``:
Python control flow or numpy on an argument's or a draw's value), in-place operations on
tracers (refused before they run) and in-place draws, operations whose output shape
depends on the data (and, at replay, any output whose shape differs from the traced one),
a constant tensor that requires grad (a parameter that is not an argument), a generator
changed outside torch's functions, and any use of a tracer after its trace has closed (a
traced value kept by a post-processing function).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence

import torch
from torch.overrides import TorchFunctionMode

from ..exact import identity_key, value_key
from .randomness import GeneratorChanged, GeneratorWatch, generators_in


class TraceRefused(Exception):
    """The trace met something it cannot replay; the message names it."""


@dataclasses.dataclass(frozen=True)
class Slot:
    """A value of the trace: an argument or an output of a recorded call (its index in the
    replay's list of values)."""

    index: int


@dataclasses.dataclass(frozen=True)
class Node:
    """One recorded torch call: ``func(*args, **kwargs)`` with ``Slot``s for the traced
    values among its arguments; ``outputs`` the slots its tensor outputs fill (``position``
    None: the output itself, else its index in the output tuple), with the shapes they had
    when traced."""

    func: Callable
    args: tuple
    kwargs: dict
    outputs: tuple[tuple[int | None, int, tuple[int, ...]], ...]
    has_slots: bool
    """Whether ``args``/``kwargs`` hold a Slot (else they are passed as they are)."""
    top_slots: tuple[tuple[int, int], ...] | None
    """Where every Slot sits among ``args`` itself (none in ``kwargs`` or nested): its
    ``(position, slot)`` pairs, so that a replay puts the values in place without walking
    the arguments (``_substitute``); None where Slots sit elsewhere."""
    random: bool
    """Whether the call drew from a generator: a replay always runs it (never pruned)."""
    grad_enabled: bool
    """Whether torch's grad mode was on for the call (off in a ``torch.no_grad()`` block of
    the quantum function): a replay runs it in the same mode."""

    @classmethod
    def of(cls, func: Callable, args: tuple, kwargs: dict, outputs: tuple, random: bool) -> Node:
        slots = _slots_in((args, kwargs))
        top = tuple((i, arg.index) for i, arg in enumerate(args) if isinstance(arg, Slot))
        top_only = len(top) == len(slots) and type(args) is tuple
        top = top if top_only else None
        grad = torch.is_grad_enabled()
        return cls(func, args, kwargs, outputs, bool(slots), top, random, grad)

    def key(self) -> tuple:
        """What the node computes, exactly: its function (by identity), its arguments (Slots
        by index, constants by ``constant_key``), its outputs, whether it draws and its grad
        mode."""
        return (
            identity_key(self.func),
            constant_key(self.args),
            constant_key(self.kwargs),
            self.outputs,
            self.random,
            self.grad_enabled,
        )


def constant_key(value):
    """A key of a recorded argument that is equal for two values only when they are equal
    exactly: Slots by index, tensors by dtype, shape, torch device and bytes, slices and
    torch devices by their parts, generators and functions by identity, the rest by
    ``exact.value_key``."""
    if type(value) is Slot:
        return value
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.device.type, value.device.index, value_key(value))
    if type(value) in (tuple, list):
        return (type(value), tuple(constant_key(item) for item in value))
    if type(value) is dict:
        return (dict, tuple((name, constant_key(item)) for name, item in value.items()))
    if type(value) is slice:
        return (slice, constant_key((value.start, value.stop, value.step)))
    if type(value) is torch.device:
        return (torch.device, value.type, value.index)
    return value_key(value)  # dtypes, layouts, generators, functions: by identity


_METADATA = frozenset(
    {
        "shape", "dtype", "device", "requires_grad", "ndim", "is_cuda", "layout", "is_leaf",
        "is_sparse", "is_quantized", "is_meta", "names", "grad_fn", "is_nested", "__len__",
        "dim", "size", "numel", "element_size", "is_complex", "is_floating_point",
        "is_conj", "is_neg", "get_device", "stride", "is_contiguous", "__hash__",
        "storage_offset", "itemsize", "nbytes", "_version", "output_nr", "_base",
        "is_inference", "is_signed",
    }
)  # fmt: skip
"""Calls whose non-tensor result depends on a tensor's shape, dtype, device or identity
only, never on its values (the shapes are part of the call's signature key, or checked at
replay): returned as they are, unrecorded. Any other call with a non-tensor result reads
values and is refused."""

_DATA_DEPENDENT_SHAPES = frozenset(
    {
        "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount",
        "repeat_interleave", "nonzero_static", "histc", "histogram",
    }
)  # fmt: skip
"""Calls whose output shape depends on the input's values."""

_IN_PLACE_DUNDERS = frozenset(
    {
        "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
        "__imod__", "__ipow__", "__imatmul__", "__iand__", "__ior__", "__ixor__",
        "__ilshift__", "__irshift__", "__delitem__",
    }
)  # fmt: skip


_GETITEM = torch.Tensor.__getitem__


def _name_of(func) -> str:
    """A torch call's name; a property's getter (``Tensor.shape``) by the property."""
    name = getattr(func, "__name__", "")
    if name == "__get__":
        return getattr(getattr(func, "__self__", None), "__name__", name)
    return name


class Trace:
    """The recorded calls of one tracing (module docstring)."""

    def __init__(self, known_generators: Sequence[torch.Generator] = ()) -> None:
        self.nodes: list[Node] = []
        self.n_slots = 0
        self.inputs: list[int] = []
        """The slots of the traced arguments, in the order ``tracer_of`` made them."""
        self.closed = False
        self._owner = threading.get_ident()
        self.generators = GeneratorWatch(known_generators)
        """The generators watched from the trace's start (``randomness``): besides torch's
        defaults, ``known_generators`` (those an earlier trace of the key drew from)."""

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Record the torch calls made in this block (module docstring); on leaving it,
        refuse where a generator changed after the last torch call."""
        with _TraceMode(self):
            yield
        try:
            self.generators.before_call()
        except GeneratorChanged as change:
            raise TraceRefused(str(change)) from None

    def tracer_of(self, tensor: torch.Tensor) -> Tracer:
        """A tracer standing for the argument ``tensor`` (its data, not a copy)."""
        tracer = torch.Tensor._make_subclass(Tracer, tensor.detach(), tensor.requires_grad)
        slot = self._new_slot(tracer)
        self.inputs.append(slot)
        return tracer

    def slot_of(self, value) -> int | None:
        """The slot of a tracer of this trace, else None."""
        if isinstance(value, Tracer) and value._trace is self:
            return value._slot
        return None

    def close(self) -> None:
        """No more recording: a tracer used from now on raises TraceRefused."""
        self.closed = True

    def prune(self, needed: Sequence[int]) -> None:
        """Keep only the calls that the slots ``needed`` depend on, and every call that
        draws (a replay draws what the quantum function draws, used or not)."""
        live = set(needed)
        kept = []
        for node in reversed(self.nodes):
            if node.random or any(slot in live for _, slot, _ in node.outputs):
                kept.append(node)
                live.update(_slots_in((node.args, node.kwargs)))
        self.nodes = kept[::-1]

    def integer_views(self) -> dict[int, tuple[int, tuple[int, ...]]]:
        """The slots that are an argument indexed by integers only (``x[i]``, ``x[i, j]``:
        a view, whose values numpy's ``x[i, j, ...]`` gives as well), as ``{slot:
        (the argument's slot, the index as a tuple)}``."""
        arguments = set(self.inputs)
        views = {}
        for node in self.nodes:
            if node.func is not _GETITEM or node.kwargs or len(node.args) != 2:
                continue
            tensor, index = node.args
            index = index if type(index) is tuple else (index,)
            if (
                type(tensor) is Slot
                and tensor.index in arguments
                and index
                and all(type(item) is int for item in index)  # not bool: a new axis
                and len(node.outputs) == 1
                and node.outputs[0][0] is None
            ):
                views[node.outputs[0][1]] = (tensor.index, index)
        return views

    @property
    def draws(self) -> bool:
        """Whether a replay draws random numbers (a recorded call drew)."""
        return any(node.random for node in self.nodes)

    def difference(self, other: Trace) -> str | None:
        """Where this trace's calls differ from ``other``'s (None: they compute the same
        expressions of the same leaves, constants bit for bit)."""
        if self.inputs != other.inputs or len(self.nodes) != len(other.nodes):
            return "the quantum function made other torch calls"
        for number, (mine, theirs) in enumerate(zip(self.nodes, other.nodes, strict=True)):
            if mine.key() != theirs.key():
                return (
                    f"its torch call {_name_of(mine.func)} (recorded call {number}) took other "
                    "constants or values"
                )
        return None

    def replay(self, arguments: Sequence[torch.Tensor], rewind: bool = False) -> list:
        """The values of all slots for new ``arguments`` (one per traced argument, in the
        order of ``inputs``), computed with plain torch calls; raises TraceRefused where an
        output's shape differs from the traced one (a shape that depends on values).
        ``rewind``: the generators first back to their states at the trace's start, so
        that the replay draws the trace's own numbers (the traced call itself)."""
        if rewind:
            self.generators.rewind()
        values: list = [None] * self.n_slots
        for slot, argument in zip(self.inputs, arguments, strict=True):
            values[slot] = argument
        grad_enabled = torch.is_grad_enabled()  # the replay's own calls do not change it
        for node in self.nodes:
            if node.top_slots is not None:
                args, kwargs = list(node.args), node.kwargs
                for position, slot in node.top_slots:
                    args[position] = values[slot]
            elif node.has_slots:
                args = _substitute(node.args, values)
                kwargs = _substitute(node.kwargs, values)
            else:
                args, kwargs = node.args, node.kwargs
            if node.grad_enabled is grad_enabled:
                out = node.func(*args, **kwargs)
            else:
                with torch.set_grad_enabled(node.grad_enabled):
                    out = node.func(*args, **kwargs)
            for position, slot, shape in node.outputs:
                value = out if position is None else out[position]
                if value.shape != shape:
                    raise TraceRefused(
                        f"{_name_of(node.func)} gave an output of shape {tuple(value.shape)} "
                        f"where the trace had {shape}: a shape that depends on values"
                    )
                values[slot] = value
        return values

    # --- recording (Tracer.__torch_function__) ---------------------------------------

    def _new_slot(self, tracer: Tracer) -> int:
        slot = self.n_slots
        self.n_slots += 1
        tracer._trace = self
        tracer._slot = slot
        return slot

    def record(self, func, args: tuple, kwargs: dict, out, random: bool = False):
        """Record ``func(*args, **kwargs) = out`` and return ``out`` with its tensors as
        tracers; raise TraceRefused for what cannot be replayed (module docstring).
        ``random``: the call drew from a generator."""
        name = _name_of(func)
        if self.closed:
            raise TraceRefused(f"a traced value was used after its trace closed (in {name})")
        if threading.get_ident() != self._owner:
            raise TraceRefused(f"a traced value was used by another thread (in {name})")
        if _in_place(name, kwargs):
            kind = "random draw" if random else "operation"
            raise TraceRefused(f"the in-place {kind} {name} on a traced value")
        if name in _DATA_DEPENDENT_SHAPES or _has_boolean_index(name, args):
            raise TraceRefused(f"{name} gives an output whose shape depends on values")
        if isinstance(out, torch.Tensor):
            tracer = out.as_subclass(Tracer)
            outputs = ((None, self._new_slot(tracer), out.shape),)
            result = tracer
        elif (
            isinstance(out, (tuple, list))
            and out
            and all(isinstance(item, torch.Tensor) for item in out)
        ):
            tracers = [item.as_subclass(Tracer) for item in out]
            outputs = tuple(
                (i, self._new_slot(tracer), item.shape)
                for i, (tracer, item) in enumerate(zip(tracers, out, strict=True))
            )
            result = type(out)(tracers)
        elif name in _METADATA:
            return out
        else:
            raise TraceRefused(
                f"{name} takes a traced value out of torch (Python control flow or numpy on "
                "an argument's value)"
            )
        marked = (_mark(args, self), _mark(kwargs, self))
        self.nodes.append(Node.of(func, marked[0], marked[1], outputs, random))
        return result


def _in_place(name: str, kwargs: dict) -> bool:
    return (
        name in _IN_PLACE_DUNDERS
        or (name.endswith("_") and not name.startswith("__"))
        or "out" in kwargs
    )


class _TraceMode(TorchFunctionMode):
    """Sees every torch call while a trace records (``Trace.recording``): a call that takes
    a tracer or draws from a watched generator is recorded, any other runs as it is and
    gives a constant (module docstring)."""

    def __init__(self, trace: Trace):
        super().__init__()
        self.trace = trace

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name_of(func)
        if name in _METADATA:  # never draws, never reads values
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        trace = self.trace
        found = _trace_in((args, kwargs))
        if found is not None and found is not trace:
            raise TraceRefused(f"a traced value of another call met this one (in {name})")
        if found is not None and _in_place(name, kwargs):  # refused before it runs
            raise TraceRefused(f"the in-place operation {name} on a traced value")
        for generator in generators_in(args, kwargs):
            trace.generators.watch(generator)
        try:
            trace.generators.before_call()
        except GeneratorChanged as change:
            raise TraceRefused(str(change)) from None
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        drew = trace.generators.after_call()
        if found is None and not drew:
            return out  # a constant: it enters the trace where a recorded call takes it
        return trace.record(func, args, kwargs, out, random=drew)


class Tracer(torch.Tensor):
    """A tensor whose torch calls its ``Trace`` records (module docstring)."""

    _trace: Trace
    _slot: int

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        trace = _trace_in((args, kwargs))
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if trace is None:  # a Tracer made by torch itself (e.g. a view), no trace of ours
            return out
        return trace.record(func, args, kwargs, out)


# PennyLane and autoray name a tensor's framework by the module of its class: a tracer is a
# torch tensor to them.
Tracer.__module__ = "torch.pennylane_custatevec_tracer"


def _trace_in(value) -> Trace | None:
    if isinstance(value, Tracer):
        return getattr(value, "_trace", None)
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _trace_in(item)
            if found is not None:
                return found
    elif isinstance(value, dict):
        return _trace_in(tuple(value.values()))
    return None


def _has_boolean_index(name: str, args: tuple) -> bool:
    if name not in ("__getitem__", "index_put", "index"):
        return False
    index = args[1] if len(args) > 1 else None
    items = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(item, torch.Tensor) and item.dtype == torch.bool for item in items)


def _mark(value, trace: Trace):
    """``value`` with the tracers of ``trace`` replaced by their Slots and its other tensors
    by snapshots (copies: a later in-place change of a global never reaches the trace)."""
    slot = trace.slot_of(value)
    if slot is not None:
        return Slot(slot)
    if isinstance(value, Tracer):
        raise TraceRefused("a value of another trace met this one")
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            raise TraceRefused(
                "a tensor that requires grad but is not an argument of the call (a global or "
                "closed-over parameter) enters a traced expression"
            )
        with torch._C.DisableTorchFunctionSubclass():
            return value.detach().clone()
    if type(value) in (tuple, list):
        return type(value)(_mark(item, trace) for item in value)
    if type(value) is dict:
        return {key: _mark(item, trace) for key, item in value.items()}
    return value


def _slots_in(value) -> list[int]:
    if isinstance(value, Slot):
        return [value.index]
    if type(value) in (tuple, list):
        return [slot for item in value for slot in _slots_in(item)]
    if type(value) is dict:
        return [slot for item in value.values() for slot in _slots_in(item)]
    return []


def _substitute(value, values: list):
    if isinstance(value, Slot):
        return values[value.index]
    if type(value) in (tuple, list):
        return type(value)(_substitute(item, values) for item in value)
    if type(value) is dict:
        return {key: _substitute(item, values) for key, item in value.items()}
    return value
