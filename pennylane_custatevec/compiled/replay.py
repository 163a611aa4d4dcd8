"""A key's trace bound to its circuits: where each gate parameter of each structure comes
from (an argument's expression, a random draw, a constant), the Function's inputs, and
the device's post-processing of the results (``Batch``). ``Replay.difference`` compares
two traces of a key exactly: the compiled QNode replays only a trace that two calls gave
alike, and verifies it later the same way."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import numpy as np
import torch
from pennylane.devices.preprocess import null_postprocessing as _device_null_postprocessing
from pennylane.measurements import MeasurementProcess
from pennylane.operation import Operator
from pennylane.tape import QuantumScript
from pennylane.transforms.core.compile_pipeline import (
    _apply_postprocessing_stack,
    _batch_postprocessing,
)
from pennylane.transforms.defer_measurements import (
    null_postprocessing as _deferral_null_postprocessing,
)
from pennylane.workflow.qnode import _to_qfunc_output_type

from ..exact import value_key
from ..preprocess.common import first_result
from ..structures import Structure, StructureKey
from .lanes import DirectLane
from .plans import CircuitsPlan, as_numpy
from .trace import Slot, Trace, Tracer, TraceRefused, constant_key


@dataclasses.dataclass(frozen=True)
class Batch:
    """A call's device tapes as the compiled path runs them."""

    structures: tuple[Structure, ...]
    keys: tuple[StructureKey, ...]
    post_processing: Callable
    qfunc_output: object
    """What the quantum function returned (its measurements' nesting)."""
    passes_through: bool
    """Whether ``post_processing`` returns the results as they are (``_passes_through``):
    then it is not called."""

    @classmethod
    def of(cls, structures, keys, post_processing: Callable, qfunc_output) -> Batch:
        return cls(
            tuple(structures),
            tuple(keys),
            post_processing,
            qfunc_output,
            _passes_through(post_processing),
        )

    def finish(self, results: tuple):
        """The call's result from the structures' results, as the QNode gives it: the
        device's post-processing, then the quantum function's output nesting (a single
        measurement's result is its own nesting: ``_to_qfunc_output_type`` returns it)."""
        result = results[0] if self.passes_through else self.post_processing(results)[0]
        if isinstance(self.qfunc_output, MeasurementProcess):
            return result
        return _to_qfunc_output_type(result, self.qfunc_output, False)


@dataclasses.dataclass(frozen=True)
class ReplayRow:
    """How a replay gives one structure's operation parameters."""

    constants: tuple
    """Per operation parameter: the constant that is not a torch tensor, else None."""
    dynamic: tuple[tuple[int, object, bool], ...]
    """``(position, source, trainable)`` per other parameter, in position order: its
    ``Slot`` in the trace, or the torch tensor (a constant: a global tensor, for the call
    that traced only), and whether it is one of the structure's trainable parameters."""

    @classmethod
    def of(cls, sources: tuple, trainable: Sequence[int], views: dict) -> ReplayRow:
        """The row of a structure's ``sources`` (``Replay.sources``); a trainable
        parameter that is a view of an argument (``views``, ``Trace.integer_views``) stands
        here for the torch device only: by its argument's Slot."""
        trainable = set(trainable)
        dynamic = tuple(
            (position, _viewed(source, views) if position in trainable else source,
             position in trainable)
            for position, source in enumerate(sources)
            if isinstance(source, (Slot, torch.Tensor))
        )  # fmt: skip
        if {position for position, _, is_trainable in dynamic if is_trainable} != trainable:
            raise TraceRefused("a trainable parameter is not a torch value of the trace")
        constants = tuple(
            None if isinstance(source, (Slot, torch.Tensor)) else source for source in sources
        )
        return cls(constants, dynamic)


@dataclasses.dataclass(frozen=True)
class Replay:
    """A key's trace: where each gate parameter of each structure comes from."""

    trace: Trace
    sources: tuple[tuple, ...]
    """Per structure, per operation parameter: a ``Slot`` of the trace or a constant."""
    batch: Batch
    rows: tuple[ReplayRow, ...]
    """Per structure, how the trace's values give its parameters."""
    inputs: tuple
    """The Function's inputs (``function_inputs``): per input its Slot, or the tensor (a
    constant, for the call that traced only)."""
    plan: CircuitsPlan
    """What every replayed call runs (the key's execution config)."""
    reason: str | None = None
    """Why the trace can run its own call but not stand for later ones (a trainable
    parameter outside the arguments), else None."""
    lane: DirectLane | None = None
    """Where the plan has one (``DirectLane.of``): replayed calls whose inputs it serves
    run through it, with ``lane_parameters`` where no parameter varies (what ``bind``
    gives then), else with what ``bind`` gives for the call."""
    lane_parameters: tuple | None = None

    @functools.cached_property
    def draws(self) -> bool:
        """Whether a replay draws random numbers (``Trace.draws``, asked once)."""
        return self.trace.draws

    def difference(self, other: Replay) -> str | None:
        """What differs between this trace of a key and ``other`` (None: the same
        structures, the same parameter sources, the same torch calls with the same
        constants, bit for bit)."""
        if self.batch.keys != other.batch.keys:
            return "the circuit changed"
        for mine, theirs in zip(self.sources, other.sources, strict=True):
            if len(mine) != len(theirs):
                return "the circuit changed"
            for position, (a, b) in enumerate(zip(mine, theirs, strict=True)):
                if constant_key(a) != constant_key(b):
                    return f"the value or source of gate parameter {position} changed"
        return self.trace.difference(other.trace)

    def with_lane(self, values: list) -> Replay:
        """This replay with the plan's lane (where it has one) for calls like the one of
        the trace's ``values``."""
        parameters, tensors, torch_device = self.bind(values)
        if torch_device is not None or len(self.rows) != 1:
            return self
        varying = frozenset(p for p, _, trainable in self.rows[0].dynamic if not trainable)
        lane = DirectLane.of(self.plan, parameters, tuple(t.shape for t in tensors), varying)
        return dataclasses.replace(self, lane=lane, lane_parameters=None if varying else parameters)

    def lane_inputs(self, values: list) -> list | None:
        """The Function's inputs of a call (the trace's ``values``) where the lane serves
        it, else None; raises TraceRefused as ``bind`` does."""
        tensors = [values[s.index] if type(s) is Slot else s for s in self.inputs]
        for tensor in tensors:
            if not tensor.requires_grad:
                raise TraceRefused("the trainable parameters differ from the trace's")
        return tensors if self.lane.serves(tensors) else None

    def bind(self, values: list) -> tuple[tuple, list, torch.device | None]:
        """The parameters of a call from the trace's ``values``: per structure, its
        parameters as the device takes them (None at the trainable ones), the trainable
        tensors in order, and the torch device of the first CUDA parameter (else None).
        Raises TraceRefused where a trainable parameter does not require grad."""
        parameters, torch_device = [], None
        for row in self.rows:
            bound = list(row.constants)
            for position, source, trainable in row.dynamic:
                value = values[source.index] if type(source) is Slot else source
                if torch_device is None and value.is_cuda:
                    torch_device = value.device
                if not trainable:  # the trainable ones reach the device inside the Function
                    bound[position] = as_numpy(value)
            parameters.append(bound)
        tensors = [values[s.index] if type(s) is Slot else s for s in self.inputs]
        for tensor in tensors:
            if not tensor.requires_grad:
                raise TraceRefused("the trainable parameters differ from the trace's")
        return tuple(parameters), tensors, torch_device


def parameter_sources(tape: QuantumScript, trace: Trace) -> tuple[tuple, str | None]:
    """Per operation parameter of a traced device tape: its Slot, or the constant (a torch
    tensor as a snapshot), and why later calls cannot replay them (a torch tensor that
    requires grad and is not computed from the arguments: a global parameter), or None.
    Raises TraceRefused where a traced value sits where a replay would not reach it: a
    nested operator's data (a controlled gate's base) are reached only where they are
    among the outer operation's data, as PennyLane keeps them."""
    sources, reason = [], None
    for op in tape.operations:
        own = {id(value) for value in op.data if isinstance(value, Tracer)}
        if _holds_tracer(op.hyperparameters, allowed=own):
            raise TraceRefused(f"{op.name} holds a traced value among its hyperparameters")
        for value in op.data:
            slot = trace.slot_of(value)
            if slot is not None:
                sources.append(Slot(slot))
                continue
            if isinstance(value, torch.Tensor) and value.requires_grad:
                reason = (
                    f"{op.name} has a torch tensor that requires grad and is not computed from "
                    "the arguments"
                )
            elif isinstance(value, torch.Tensor):  # proven constant by the next trace
                value = value.detach().clone()
            sources.append(value)
    for measurement in tape.measurements:
        if _holds_tracer(measurement.obs) or _holds_tracer(measurement.mv):
            raise TraceRefused("a measurement depends on an argument tensor")
    return tuple(sources), reason


def _viewed(source, views: dict):
    """A trainable parameter's source, or its argument's Slot where it is a view."""
    view = views.get(source.index) if type(source) is Slot else None
    return source if view is None else Slot(view[0])


def function_inputs(sources: tuple, structures, views: dict) -> tuple[tuple, tuple]:
    """The inputs of a replay's ``Circuits`` Function and its ``CircuitsPlan.sources``:
    each trainable parameter its own input (its Slot, or a tensor constant), except those
    that are integer-indexed views of an argument (``x[i]``, ``views``): their argument is
    one input, once, and each of them its view. The replay then indexes nothing in torch
    and autograd keeps one node for the call (the backward scatters the views' gradients
    into the argument's, ``plans.input_gradients``)."""
    inputs, plan_sources, argument_inputs = [], [], {}
    for row, structure in zip(sources, structures, strict=True):
        for position in structure.template.trainable_params:
            source = row[position]
            view = views.get(source.index) if type(source) is Slot else None
            if view is None:
                plan_sources.append((len(inputs), None))
                inputs.append(source)
                continue
            argument, index = view
            if argument not in argument_inputs:
                argument_inputs[argument] = len(inputs)
                inputs.append(Slot(argument))
            plan_sources.append((argument_inputs[argument], (*index, Ellipsis)))
    return tuple(inputs), tuple(plan_sources)


def _holds_tracer(value, allowed: frozenset | set = frozenset()) -> bool:
    """Whether ``value`` holds a tracer other than those in ``allowed`` (by id)."""
    if isinstance(value, Tracer):
        return id(value) not in allowed
    if isinstance(value, Operator):
        return _holds_tracer(value.data, allowed) or _holds_tracer(value.hyperparameters, allowed)
    if isinstance(value, (tuple, list)):
        return any(_holds_tracer(item, allowed) for item in value)
    if isinstance(value, dict):
        return any(_holds_tracer(item, allowed) for item in value.values())
    return False


def constants_agree(sources: tuple, first_parameters: tuple) -> bool:
    """Whether the constant parameters of a trace (``sources``: not computed from the
    arguments) are exactly those of the first call (``first_parameters``: as the device
    took them; a torch tensor constant is compared as the array of its values)."""
    return all(
        value_key(np.asarray(as_numpy(source))) == value_key(np.asarray(first[i]))
        if isinstance(source, torch.Tensor)
        else value_key(source) == value_key(first[i])
        for row, first in zip(sources, first_parameters, strict=True)
        for i, source in enumerate(row)
        if not isinstance(source, Slot)
    )


def torch_device_of(values) -> torch.device | None:
    """The torch device of the first CUDA parameter (PennyLane's torch interface's
    choice), else None (the CPU)."""
    for row in values:
        for value in row:
            if isinstance(value, torch.Tensor) and value.is_cuda:
                return value.device
    return None


_FIRST_RESULT = frozenset(
    {_device_null_postprocessing, _deferral_null_postprocessing, first_result}
)
"""Post-processing functions of one tape's results that return ``results[0]``: those of
the device's own transforms for an analytic tape (PennyLane's and this package's)."""


def _passes_through(post_processing: Callable) -> bool:
    """Whether the device's ``post_processing`` (PennyLane's stack of batch
    post-processings, ``CompilePipeline``) returns its results as they are: each stage maps
    tape ``i`` of the batch to ``results[i:i + 1][0]`` (a one-tape slice and a function in
    ``_FIRST_RESULT``), as the device's transforms do for tapes they leave as they are.
    Anything else (or another shape of PennyLane's objects) is run."""
    if not (
        isinstance(post_processing, functools.partial)
        and post_processing.func is _apply_postprocessing_stack
        and not post_processing.args
        and set(post_processing.keywords) == {"postprocessing_stack"}
    ):
        return False
    for stage in post_processing.keywords["postprocessing_stack"]:
        if not (
            isinstance(stage, functools.partial)
            and stage.func is _batch_postprocessing
            and not stage.args
            and set(stage.keywords) == {"individual_fns", "slices"}
        ):
            return False
        functions, slices = stage.keywords["individual_fns"], stage.keywords["slices"]
        if len(functions) != len(slices) or not all(
            function in _FIRST_RESULT and part == slice(i, i + 1)
            for i, (function, part) in enumerate(zip(functions, slices, strict=True))
        ):
            return False
    return True
