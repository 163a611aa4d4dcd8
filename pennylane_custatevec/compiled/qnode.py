"""``compile(qnode)``: a QNode on ``custatevec.qubit`` as one torch.autograd.Function per call,
without PennyLane's per-call workflow.

A call's **signature key** is: per argument (positional, then keyword by name in the
call's order), a torch tensor by its shape, dtype, device and ``requires_grad``, a numpy
array or Python value by its exact value (``exact.value_key``), anything else by identity,
nested in lists, tuples and dicts; the differentiation options in force
(``pennylane_custatevec.options``) and whether torch's grad mode is on. Per key (at most
``MAX_KEYS``, least recently used dropped):

1. the first call records the quantum function with the real arguments, preprocesses it
   and runs it (``_recorded``): a circuit seen once costs what the QNode path costs;
2. the second call traces it (``trace.Trace``: every gate parameter becomes a torch
   expression of the arguments) and checks that the trace gives the circuit the first
   call gave (same ``StructureKey``s, same constant parameters): a quantum function that
   draws random numbers or reads state outside its arguments is not replayed;
3. later calls replay the trace on the arguments (plain torch operations, so autograd
   differentiates the path from the arguments to the gate parameters) and run the
   structures of the trace.

A key whose trace is refused (Python control flow on a tensor's value, numpy on a tensor,
a torch tensor not derived from the arguments, see ``trace``) runs in **re-record** mode:
each call records the quantum function again and finds its structure by its exact
``StructureKey`` (at most ``MAX_STRUCTURES`` kept). A structure is never reused for a
circuit it does not stand for.

What the path cannot serve runs the QNode itself (``qnode(*args, **kwargs)``), with one
UserWarning per reason and compiled QNode: shots, mid-circuit measurements, transforms on
the QNode, a gradient method other than adjoint, ``max_diff > 1``, an interface other than
torch, trainable observable data, another device.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import threading
import warnings
from collections.abc import Callable, Sequence

import pennylane as qml
import torch
from pennylane.devices.preprocess import null_postprocessing as _device_null_postprocessing
from pennylane.measurements import MeasurementProcess, MidMeasureMP
from pennylane.operation import Operator
from pennylane.ops import PauliMeasure
from pennylane.queuing import AnnotatedQueue
from pennylane.tape import QuantumScript
from pennylane.transforms.core.compile_pipeline import (
    _apply_postprocessing_stack,
    _batch_postprocessing,
)
from pennylane.transforms.defer_measurements import (
    null_postprocessing as _deferral_null_postprocessing,
)
from pennylane.workflow.qnode import _to_qfunc_output_type
from pennylane.workflow.resolution import _resolve_execution_config
from torch._C import _functorch

from .. import settings
from ..device import CuStateVecDevice
from ..exact import value_key
from ..queuing import without_queuing
from ..structures import Structure, StructureKey
from ..transforms import _first_result
from .function import (
    CircuitCall,
    Circuits,
    CircuitsPlan,
    DirectLane,
    LaneJacobian,
    ResultsLayout,
    apply,
    as_numpy,
    unflatten,
)
from .trace import Slot, Trace, Tracer, TraceRefused
from .vmap import VmapCall

MAX_KEYS = 64
"""Signature keys kept per compiled QNode (least recently used dropped)."""
MAX_STRUCTURES = 256
"""Structures kept per compiled QNode for re-recorded calls (least recently used dropped)."""

_ADJOINT_METHODS = ("adjoint", "best", "device")
_TORCH_INTERFACES = ("torch", "pytorch")


class _Mode(enum.Enum):
    SEEN_ONCE = "recorded once; traced at the next call"
    REPLAY = "replays its trace"
    RERECORD = "records the quantum function on each call"
    FALLBACK = "runs the QNode"


class _Fallback(Exception):
    """The compiled path cannot serve this call; the message is the reason."""


_TENSOR = object()
"""The tag of a torch argument's part of a signature key: ``(_TENSOR, shape, dtype,
device, requires_grad)`` (a private object: no other part of a key holds it)."""


def _argument_key(value, leaves: list):
    """An argument's part of the signature key (module docstring); its torch tensors are
    appended to ``leaves`` in the order ``_with_tracers`` visits them."""
    if isinstance(value, torch.Tensor):
        leaves.append(value)
        return (_TENSOR, value.shape, value.dtype, value.device, value.requires_grad)
    if type(value) in (tuple, list):
        return (type(value), tuple(_argument_key(item, leaves) for item in value))
    if type(value) is dict:
        return (dict, tuple((name, _argument_key(item, leaves)) for name, item in value.items()))
    return value_key(value)  # exact values; an object of another kind by identity


def _torch_leaves(value, leaves: list) -> None:
    """The torch tensors of an argument, in the order ``_with_tracers`` visits them."""
    if isinstance(value, torch.Tensor):
        leaves.append(value)
    elif type(value) in (tuple, list):
        for item in value:
            _torch_leaves(item, leaves)
    elif type(value) is dict:
        for item in value.values():
            _torch_leaves(item, leaves)


def _with_tracers(value, trace: Trace):
    """An argument with its torch tensors replaced by tracers of ``trace``."""
    if isinstance(value, torch.Tensor):
        return trace.tracer_of(value)
    if type(value) in (tuple, list):
        return type(value)(_with_tracers(item, trace) for item in value)
    if type(value) is dict:
        return {name: _with_tracers(item, trace) for name, item in value.items()}
    return value


@dataclasses.dataclass(frozen=True)
class _Batch:
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
    def of(cls, structures, keys, post_processing: Callable, qfunc_output) -> _Batch:
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
class _ReplayRow:
    """How a replay gives one structure's operation parameters."""

    constants: tuple
    """Per operation parameter: the constant that is not a torch tensor, else None."""
    dynamic: tuple[tuple[int, object, bool], ...]
    """``(position, source, trainable)`` per other parameter, in position order: its
    ``Slot`` in the trace, or the torch tensor (a constant: a global tensor, for the call
    that traced only), and whether it is one of the structure's trainable parameters."""

    @classmethod
    def of(cls, sources: tuple, trainable: Sequence[int], views: dict) -> _ReplayRow:
        """The row of a structure's ``sources`` (``_Replay.sources``); a trainable
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
class _Replay:
    """A key's trace: where each gate parameter of each structure comes from."""

    trace: Trace
    sources: tuple[tuple, ...]
    """Per structure, per operation parameter: a ``Slot`` of the trace or a constant."""
    batch: _Batch
    rows: tuple[_ReplayRow, ...]
    """Per structure, how the trace's values give its parameters."""
    inputs: tuple
    """The Function's inputs (``_function_inputs``): per input its Slot, or the tensor (a
    constant, for the call that traced only)."""
    plan: CircuitsPlan
    """What every replayed call runs (the key's execution config)."""
    lane: DirectLane | None = None
    """Where the plan has one (``DirectLane.of``): replayed calls whose inputs it serves
    run through it, with ``lane_parameters`` where no parameter varies (what ``bind``
    gives then), else with what ``bind`` gives for the call."""
    lane_parameters: tuple | None = None

    def with_lane(self, values: list) -> _Replay:
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


@dataclasses.dataclass
class _Entry:
    """What a compiled QNode knows of one signature key."""

    mode: _Mode
    config: object = None
    """The resolved ExecutionConfig of the key's calls."""
    first: _Batch | None = None
    """The first call's batch (compared with the trace)."""
    first_parameters: tuple = ()
    """The first call's parameters per structure, as the device took them."""
    replay: _Replay | None = None
    reason: str = ""


class CompiledQNode:
    """A QNode compiled for torch (module docstring); call it as the QNode."""

    def __init__(self, qnode: qml.QNode):
        if not isinstance(qnode, qml.QNode):
            raise TypeError(
                f"pennylane_custatevec.compile takes a QNode (qml.qnode(...)), got "
                f"{type(qnode).__name__}."
            )
        self.qnode = qnode
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._structures: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.RLock()
        self._warned: set[str] = set()
        self._options_seen: tuple | None = None
        """(the option overrides of a context, the options in force there): the last
        resolved (``_options_in_force``)."""
        functools.update_wrapper(self, qnode, updated=())

    def __repr__(self) -> str:
        return f"<CompiledQNode of {self.qnode!r}>"

    def __getattr__(self, name: str):
        """The QNode's public attributes (``func``, ``interface``, ``device``,
        ``construct``, ...), so that what takes a QNode (``qml.qnn.TorchLayer``, which reads
        the quantum function's signature and the interface) takes a compiled one."""
        if name.startswith("_") or name == "qnode":
            raise AttributeError(name)
        return getattr(self.qnode, name)

    def modes(self) -> dict:
        """How each signature key is served now (a ``_Mode``'s name per key), for tests and
        inspection."""
        with self._lock:
            return {key: entry.mode.name for key, entry in self._entries.items()}

    # --- dispatch ------------------------------------------------------------------

    @torch.compiler.disable  # under torch.compile: a graph break, the call runs eagerly
    def __call__(self, *args, **kwargs):
        reason = self._qnode_fallback_reason(args, kwargs)
        if reason is not None:
            return self._fallback(reason, args, kwargs)
        leaves: list = []
        key = (
            _argument_key(args, leaves),
            # in the call's order: the quantum function sees them in that order
            tuple((name, _argument_key(value, leaves)) for name, value in kwargs.items()),
            self._options_in_force(),
            torch.is_grad_enabled(),
        )
        vmapped = VmapCall.of(leaves)
        if vmapped is not None:
            return self._vmapped(vmapped, args, kwargs)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        if entry is None:
            return self._first_call(key, args, kwargs)
        if entry.mode is _Mode.FALLBACK:
            return self._fallback(entry.reason, args, kwargs)
        if entry.mode is _Mode.SEEN_ONCE:
            with self._lock:  # one thread traces a key; the others wait for its outcome
                if entry.mode is _Mode.SEEN_ONCE:
                    this_call_only = self._trace(entry, args, kwargs, leaves)
                    if this_call_only is not None:
                        try:  # the quantum function ran once for this call: not again
                            return self._replayed(this_call_only, leaves)
                        except TraceRefused:
                            pass
        replay = entry.replay  # once: another thread may drop it
        if entry.mode is _Mode.REPLAY and replay is not None:
            try:
                return self._replayed(replay, leaves)
            except TraceRefused:
                entry.mode, entry.replay = _Mode.RERECORD, None
        try:
            return self._recorded(args, kwargs, entry.config)[0]
        except _Fallback as refusal:
            return self._fallback(str(refusal), args, kwargs)

    def _options_in_force(self):
        """The device's ``options_in_force()``, resolved once per context's overrides: the
        device's own options are fixed when it is built, the overrides of a context are one
        immutable mapping (``settings.current_overrides``), held here so that it is the
        same object only while it is the same mapping."""
        overrides = settings.current_overrides()
        seen = self._options_seen
        if seen is not None and seen[0] is overrides:
            return seen[1]
        options = self.qnode.device.options_in_force()
        self._options_seen = (overrides, options)
        return options

    def _first_call(self, key, args, kwargs):
        try:
            result, batch, config, parameters = self._recorded(args, kwargs, None)
        except _Fallback as refusal:
            self._remember(key, _Entry(_Mode.FALLBACK, reason=str(refusal)))
            return self._fallback(str(refusal), args, kwargs)
        self._remember(key, _Entry(_Mode.SEEN_ONCE, config, batch, tuple(parameters)))
        return result

    def _remember(self, key, entry: _Entry) -> None:
        with self._lock:
            self._entries[key] = entry
            while len(self._entries) > MAX_KEYS:
                self._entries.popitem(last=False)

    def _qnode_fallback_reason(self, args, kwargs) -> str | None:
        """Why the QNode itself (not one of its circuits) is not for the compiled path."""
        qnode = self.qnode
        if not isinstance(qnode.device, CuStateVecDevice):
            return f"the QNode's device is {qnode.device!r}, not custatevec.qubit"
        if qml.capture.enabled():
            return "program capture is enabled"
        if "shots" in kwargs or qnode.shots:
            return "the QNode has shots (the compiled path is analytic)"
        if len(qnode.compile_pipeline):
            return "the QNode has transforms of its own"
        if not (isinstance(qnode.diff_method, str) and qnode.diff_method in _ADJOINT_METHODS):
            return (
                f"diff_method={qnode.diff_method!r} (the compiled path differentiates with "
                f"the device's adjoint method: diff_method in {_ADJOINT_METHODS})"
            )
        if qnode.execute_kwargs.get("max_diff", 1) > 1:
            return "max_diff > 1 (the adjoint method gives first derivatives only)"
        interface = qnode.interface
        if interface not in _TORCH_INTERFACES:
            leaves: list = []
            _torch_leaves((args, kwargs), leaves)
            if interface != "auto" or not leaves:
                return f"interface {interface!r} without torch arguments (torch only)"
        return None

    def _fallback(self, reason: str, args, kwargs):
        with self._lock:
            fresh = reason not in self._warned
            self._warned.add(reason)
        if fresh:
            warnings.warn(
                f"pennylane_custatevec.compile: {reason.rstrip('.')}; the call runs the QNode.",
                UserWarning,
                stacklevel=3,
            )
        return self.qnode(*args, **kwargs)

    # --- recorded calls ------------------------------------------------------------

    def _recorded(self, args, kwargs, config):
        """Record, preprocess and run one call: (result, batch, config, the parameters
        per structure as the device took them)."""
        tape, output = _record(self.qnode, args, kwargs)
        return self._recorded_tape(tape, output, args, kwargs, config)

    def _recorded_tape(self, tape: QuantumScript, output, args, kwargs, config):
        """``_recorded`` from the recorded ``tape`` on."""
        if config is None:
            config = self._config_of(tape, args, kwargs)
        batch, parameters, originals = self._batch_of(tape, output, config)
        tensors = [
            row[i]
            for row, structure in zip(originals, batch.structures, strict=True)
            for i in structure.template.trainable_params
        ]
        plan = CircuitsPlan.of(self.qnode.device, batch.structures, config)
        result = self._run(batch, plan, tuple(parameters), tensors, _torch_device(originals))
        return result, batch, config, parameters

    def _vmapped(self, vmapped: VmapCall, args, kwargs):
        """A call under ``torch.func.vmap`` as one broadcast call (``vmap.VmapCall``): the
        quantum function recorded on the batched arguments, its gate parameters' batch axes
        first, the broadcast tape recorded, preprocessed and run below the vmap, its results
        batched at their leading axis. Recorded on every call (a trace replays torch calls
        on plain tensors)."""
        tape, output = _record(self.qnode, args, kwargs)
        if tape.batch_size is not None:
            raise RuntimeError(
                "pennylane_custatevec.compile: under torch.func.vmap the circuit of one row is "
                f"itself broadcast (batch size {tape.batch_size}); pass the whole batch as a "
                "broadcast input instead of vmapping."
            )
        if any(
            _functorch.is_functorch_wrapped_tensor(value)
            for measurement in tape.measurements
            if measurement.obs is not None
            for value in measurement.obs.data
        ):
            raise RuntimeError(
                "pennylane_custatevec.compile: under torch.func.vmap an observable depends "
                "on a batched argument; only gate parameters may."
            )
        with vmapped.interpreter.lower():
            values = [vmapped.broadcast(value) for value in tape.get_parameters(False)]
            with without_queuing():
                broadcast = tape.bind_new_parameters(values, list(range(len(values))))
            broadcast.trainable_params = qml.math.get_trainable_indices(values)
            result = self._recorded_tape(broadcast, output, args, kwargs, None)[0]
        return vmapped.batched(result)

    def _config_of(self, tape: QuantumScript, args, kwargs):
        config = qml.workflow.construct_execution_config(self.qnode, resolve=False)(*args, **kwargs)
        config = _resolve_execution_config(config, self.qnode.device, (tape,))
        if config.gradient_method != "adjoint":
            raise _Fallback(f"the gradient method resolved to {config.gradient_method!r}")
        return config

    def _batch_of(self, tape: QuantumScript, output, config) -> tuple[_Batch, list, list]:
        """The preprocessed tapes of ``tape`` as structures (cached by their exact key),
        and per device tape its operation parameters: as the device takes them (numpy)
        and as recorded (the trainable ones torch tensors)."""
        device = self.qnode.device
        structures, keys, parameters, originals = [], [], [], []
        # operators built here (the numpy tapes' operations) must never land in another
        # thread's recording: PennyLane's queue is process-global
        with without_queuing():
            tapes, post_processing = device.preprocess_transforms(config)((tape,))
            for device_tape in tapes:
                everything = device_tape.get_parameters(trainable_only=False)
                numeric = _numeric(device_tape)
                numeric.trainable_params = qml.math.get_trainable_indices(everything)
                structure_key = StructureKey.of(numeric)
                structures.append(self._structure(structure_key, numeric))
                keys.append(structure_key)
                # this call's values: a cached structure's template holds another call's
                parameters.append(
                    numeric.get_parameters(trainable_only=False, operations_only=True)
                )
                originals.append(
                    device_tape.get_parameters(trainable_only=False, operations_only=True)
                )
        batch = _Batch.of(structures, keys, post_processing, output)
        return batch, parameters, originals

    def _structure(self, key: StructureKey, tape: QuantumScript) -> Structure:
        with self._lock:
            structure = self._structures.get(key)
            if structure is not None:
                self._structures.move_to_end(key)
                return structure
        try:
            structure = self.qnode.device.structure_of(tape)
        except ValueError as refusal:
            raise _Fallback(str(refusal)) from None
        with self._lock:
            self._structures[key] = structure
            while len(self._structures) > MAX_STRUCTURES:
                self._structures.popitem(last=False)
        return structure

    # --- traced calls --------------------------------------------------------------

    def _trace(self, entry: _Entry, args, kwargs, leaves: list) -> _Replay | None:
        """Trace the key's second call: REPLAY if the trace is sound, else RERECORD. A
        trace that recorded the whole call but cannot stand for later ones (other circuits
        than the first call's, a torch tensor not computed from the arguments) is returned
        to run this call; else None. ``leaves``: the call's torch tensors (``_argument_key``)."""
        trace = Trace()
        traced_args = _with_tracers(args, trace)
        traced_kwargs = _with_tracers(kwargs, trace)
        try:
            tape, output = _record(self.qnode, traced_args, traced_kwargs)
            with without_queuing():  # the bound tapes' operators: into no recording
                return self._traced(entry, trace, tape, output, leaves)
        except (TraceRefused, _Fallback) as refusal:
            entry.mode, entry.reason = _Mode.RERECORD, str(refusal)
            return None

    def _traced(self, entry: _Entry, trace: Trace, tape, output, leaves: list):
        """``_trace`` after the recording: preprocess, bind, and judge the trace."""
        tapes, post_processing = self.qnode.device.preprocess_transforms(entry.config)((tape,))
        rows = [_parameter_sources(device_tape, trace) for device_tape in tapes]
        sources = tuple(row for row, _ in rows)
        needed = [source.index for row in sources for source in row if isinstance(source, Slot)]
        trace.prune(needed)
        values = trace.replay(leaves)
        structures, keys, replay_rows = [], [], []
        for device_tape, row in zip(tapes, sources, strict=True):
            bound = [values[s.index] if isinstance(s, Slot) else s for s in row]
            numeric = device_tape.bind_new_parameters(
                [as_numpy(value) for value in bound], list(range(len(bound)))
            )
            numeric.trainable_params = [
                i
                for i, value in enumerate(bound)
                if isinstance(value, torch.Tensor) and value.requires_grad
            ]
            structure_key = StructureKey.of(numeric)
            keys.append(structure_key)
            structure = self._structure(structure_key, numeric)
            structures.append(structure)
        views = trace.integer_views()
        inputs, plan_sources = _function_inputs(sources, structures, views)
        for row, structure in zip(sources, structures, strict=True):
            replay_rows.append(_ReplayRow.of(row, structure.template.trainable_params, views))
        # the replay computes what the rows and the Function's inputs take (no views)
        trace.prune(
            [source.index for source in inputs if type(source) is Slot]
            + [
                source.index
                for row in replay_rows
                for _, source, _ in row.dynamic
                if type(source) is Slot
            ]
        )
        trace.close()
        batch = _Batch.of(structures, keys, post_processing, output)
        plan = CircuitsPlan.of(self.qnode.device, structures, entry.config, plan_sources)
        replay = _Replay(trace, sources, batch, tuple(replay_rows), inputs, plan)
        replay = replay.with_lane(trace.replay(leaves))
        reasons = [reason for _, reason in rows if reason is not None]
        if tuple(keys) != entry.first.keys or not _constants_agree(sources, entry.first_parameters):
            reasons.append("the trace gave another circuit than the first call")
        entry.first, entry.first_parameters = None, ()
        if reasons:
            entry.mode, entry.reason = _Mode.RERECORD, reasons[0]
            return replay
        entry.mode, entry.replay = _Mode.REPLAY, replay
        return None

    def _replayed(self, replay: _Replay, leaves: list):
        """A call replayed: the trace on the call's torch tensors ``leaves``, its values
        bound to the structures' parameters, run."""
        values = replay.trace.replay(leaves)
        if replay.lane is not None and not self.qnode.device.tracker.active:
            tensors = replay.lane_inputs(values)
            parameters, torch_device = replay.lane_parameters, None
            if tensors is not None and parameters is None:  # data the call gives
                parameters, _, torch_device = replay.bind(values)
            if tensors is not None and torch_device is None:
                return self._run(replay.batch, replay.plan, parameters, tensors, None, replay.lane)
        parameters, tensors, torch_device = replay.bind(values)
        return self._run(replay.batch, replay.plan, parameters, tensors, torch_device)

    # --- running -------------------------------------------------------------------

    def _run(
        self,
        batch: _Batch,
        plan: CircuitsPlan,
        parameters: tuple,
        tensors,
        torch_device,
        lane: DirectLane | None = None,
    ):
        """Run the batch's structures as one ``Circuits`` Function and post-process:
        ``parameters`` per structure as the device takes them (the trainable ones filled
        in from ``tensors``, in order), the results on ``torch_device`` (None: the CPU);
        through ``lane`` where given."""
        jacobian_on_forward = (
            lane is not None and lane.jacobian_on_forward and torch.is_grad_enabled()
        )
        if jacobian_on_forward and not torch._C._are_functorch_transforms_active():
            flat = apply(LaneJacobian, plan, lane, parameters, *tensors)
            return batch.finish((unflatten(flat, lane.nesting),))
        layout = ResultsLayout()
        call = CircuitCall(plan, parameters, torch_device, lane, jacobian_on_forward)
        flat = apply(Circuits, call, layout, *tensors)
        results, start = [], 0
        for count, nesting in layout.nesting:
            results.append(unflatten(flat[start : start + count], nesting))
            start += count
        return batch.finish(tuple(results))


def compile(qnode: qml.QNode) -> CompiledQNode:  # noqa: A001 - the package's entry point
    """``qnode`` compiled for torch: a callable with the QNode's signature, results and
    gradients, that runs each call as one torch.autograd.Function (see ``doc/compiled.md``).
    Usable as a decorator over a QNode."""
    return CompiledQNode(qnode)


class _ThisThreadsQueue(AnnotatedQueue):
    """A recording of the operators that this thread builds only. PennyLane's queue is
    process-global: an operator that another thread builds outside any recording of its
    own (PennyLane's workflow converting a tape's parameters, say) would otherwise land in
    this one (the device's own operators are kept out by ``queuing.without_queuing``)."""

    def __init__(self):
        super().__init__()
        self._owner = threading.get_ident()

    def append(self, obj, **kwargs):
        if threading.get_ident() == self._owner:
            super().append(obj, **kwargs)

    def remove(self, obj):
        if threading.get_ident() == self._owner:
            super().remove(obj)

    def update_info(self, obj, **kwargs):
        if threading.get_ident() == self._owner:
            super().update_info(obj, **kwargs)


def _numeric(tape: QuantumScript) -> QuantumScript:
    """``tape`` with numpy parameters. Rebinding builds operators (a product observable's
    factors): ``without_queuing``, never into another thread's recording. Parameters that
    torch.func's transforms wrap (a first call under ``jacrev``: PennyLane's conversion
    cannot read them) are read below the transforms (``function.as_numpy``, which refuses
    a vmap-batched one)."""
    with without_queuing():
        values = tape.get_parameters(trainable_only=False)
        if any(
            isinstance(value, torch.Tensor) and _functorch.is_functorch_wrapped_tensor(value)
            for value in values
        ):
            return tape.bind_new_parameters(
                [as_numpy(value) for value in values], list(range(len(values)))
            )
        (numeric,), _ = qml.transforms.convert_to_numpy_parameters(tape)
    return numeric


def _record(qnode: qml.QNode, args, kwargs) -> tuple[QuantumScript, object]:
    """The QNode's tape for ``args``, ``kwargs`` and what its quantum function returned
    (as ``QNode.construct``, without touching the QNode). PennyLane's recording holds its
    queue's lock: two threads never record into one queue."""
    with _ThisThreadsQueue() as queue:
        output = qnode.func(*args, **kwargs)
    tape = QuantumScript.from_queue(queue, qnode.shots)
    if any(isinstance(op, (MidMeasureMP, PauliMeasure)) for op in tape.operations):
        raise _Fallback("the circuit has mid-circuit measurements")
    if any(isinstance(op, qml.Projector) for op in tape.operations):
        # its derivative: the eager sweep, which the compiled lanes do not run
        raise _Fallback("the circuit postselects (a Projector gate)")
    tape.trainable_params = qml.math.get_trainable_indices(
        tape.get_parameters(trainable_only=False)
    )
    return tape, output


def _parameter_sources(tape: QuantumScript, trace: Trace) -> tuple[tuple, str | None]:
    """Per operation parameter of a traced device tape: its Slot, or the constant, and
    why later calls cannot replay them (a torch tensor not computed from the arguments:
    a global, or drawn by the quantum function), or None. Raises TraceRefused where a
    traced value sits where a replay would not reach it: a nested operator's data (a
    controlled gate's base) are reached only where they are among the outer operation's
    data, as PennyLane keeps them."""
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
            if isinstance(value, torch.Tensor):
                reason = f"{op.name} has a torch tensor not computed from the arguments"
            sources.append(value)
    for measurement in tape.measurements:
        if _holds_tracer(measurement.obs) or _holds_tracer(measurement.mv):
            raise TraceRefused("a measurement depends on an argument tensor")
    return tuple(sources), reason


def _viewed(source, views: dict):
    """A trainable parameter's source, or its argument's Slot where it is a view."""
    view = views.get(source.index) if type(source) is Slot else None
    return source if view is None else Slot(view[0])


def _function_inputs(sources: tuple, structures, views: dict) -> tuple[tuple, tuple]:
    """The inputs of a replay's ``Circuits`` Function and its ``CircuitsPlan.sources``:
    each trainable parameter its own input (its Slot, or a tensor constant), except those
    that are integer-indexed views of an argument (``x[i]``, ``views``): their argument is
    one input, once, and each of them its view. The replay then indexes nothing in torch
    and autograd keeps one node for the call (the backward scatters the views' gradients
    into the argument's, ``function._input_gradients``)."""
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


def _constants_agree(sources: tuple, first_parameters: tuple) -> bool:
    """Whether the constant parameters of a trace (``sources``: not computed from the
    arguments) are exactly those of the first call."""
    return all(
        value_key(source) == value_key(first[i])
        for row, first in zip(sources, first_parameters, strict=True)
        for i, source in enumerate(row)
        if not isinstance(source, Slot)
    )


def _torch_device(values) -> torch.device | None:
    """The torch device of the first CUDA parameter (PennyLane's torch interface's
    choice), else None (the CPU)."""
    for row in values:
        for value in row:
            if isinstance(value, torch.Tensor) and value.is_cuda:
                return value.device
    return None


_FIRST_RESULT = frozenset(
    {_device_null_postprocessing, _deferral_null_postprocessing, _first_result}
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
