"""``compile(qnode)``: a QNode on ``custatevec.qubit`` as one torch.autograd.Function per call,
without PennyLane's per-call workflow.

A call's **signature key** is: per argument (positional, then keyword by name in the
call's order), a torch tensor by its shape, dtype, device and ``requires_grad``, a numpy
array or Python value by its exact value (``exact.value_key``), anything else by identity,
nested in lists, tuples and dicts; the differentiation options in force
(``pennylane_custatevec.options``), whether torch's grad mode is on, and the scalars and
tensors the quantum function reads by name outside its arguments (``keys.NamedReads``).
Per key (at most ``MAX_KEYS``, least recently used dropped):

1. the first call records the quantum function with the real arguments, preprocesses it
   and runs it (``_recorded``): a circuit seen once costs what the QNode path costs;
2. the second call traces it (``trace.Trace``: every gate parameter becomes a torch
   expression of the arguments, of random draws and of constants) and checks that the
   trace gives the circuit the first call gave (same ``StructureKey``s, same constant
   parameters);
3. the third call traces it again: the key replays only if the two traces are the same
   exactly (the same torch calls, the same structures, every constant bit for bit), which
   proves that its constants are constant;
4. later calls replay the trace on the arguments (plain torch operations, so autograd
   differentiates the path from the arguments to the gate parameters, and random draws
   are drawn anew) and run the structures of the trace. A replaying key is traced again
   at its calls 4, 8, 16, ... up to ``verify_every`` and then at every ``verify_every``-th
   call; where that trace differs (the quantum function reads state outside its arguments
   that changed), the key re-records from then on, with one warning naming the change.

Every traced call runs from its own trace, the generators rewound to the trace's start so
that the replay draws the trace's numbers: the quantum function runs once per call and
the generators advance as the QNode's would.

A key whose trace is refused (Python control flow on a tensor's value, numpy on a tensor,
see ``trace``) or whose traces differ runs in **re-record** mode: each call records the
quantum function again and finds its structure by its exact ``StructureKey`` (at most
``MAX_STRUCTURES`` kept). A structure is never reused for a circuit it does not stand for.

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

import pennylane as qml
import torch
from pennylane.tape import QuantumScript
from pennylane.workflow.resolution import _resolve_execution_config
from torch._C import _functorch

from .. import settings
from ..device import CuStateVecDevice
from ..queuing import without_queuing
from ..settings import VERIFY_EVERY
from ..structures import Structure, StructureKey
from .function import Circuits, LaneJacobian, apply
from .keys import NamedReads, argument_key, torch_leaves, with_tracers
from .lanes import CircuitCall, DirectLane
from .plans import CircuitsPlan, ResultsLayout, as_numpy, unflatten
from .randomness import restore
from .recording import Unserved, numeric_tape, record_call
from .replay import (
    Batch,
    Replay,
    ReplayRow,
    constants_agree,
    function_inputs,
    parameter_sources,
    torch_device_of,
)
from .trace import Slot, Trace, TraceRefused
from .vmap import VmapCall

MAX_KEYS = 64
"""Signature keys kept per compiled QNode (least recently used dropped)."""
MAX_STRUCTURES = 256
"""Structures kept per compiled QNode for re-recorded calls (least recently used dropped)."""

_ADJOINT_METHODS = ("adjoint", "best", "device")
_TORCH_INTERFACES = ("torch", "pytorch")


class _Mode(enum.Enum):
    SEEN_ONCE = "recorded once; traced at the next call"
    PROVING = "traced once; traced again at the next call, which proves its constants"
    REPLAY = "replays its trace"
    RERECORD = "records the quantum function on each call"
    FALLBACK = "runs the QNode"


@dataclasses.dataclass
class _Entry:
    """What a compiled QNode knows of one signature key."""

    mode: _Mode
    config: object = None
    """The resolved ExecutionConfig of the key's calls."""
    first: Batch | None = None
    """The first call's batch (compared with the trace)."""
    first_parameters: tuple = ()
    """The first call's parameters per structure, as the device took them."""
    replay: Replay | None = None
    reason: str = ""
    calls: int = 1
    """The key's calls so far (the verification schedule counts them)."""
    candidate: Replay | None = None
    """The second call's trace, which the third call's must equal (PROVING)."""
    generators: tuple = ()
    """The generators (other than torch's defaults) that the key's last trace drew from."""
    tracing: bool = False
    """Whether a call of the key is being traced now (one at a time; ``_claims_trace``)."""


class CompiledQNode:
    """A QNode compiled for torch (module docstring); call it as the QNode."""

    def __init__(self, qnode: qml.QNode, verify_every: int | None = VERIFY_EVERY):
        if not isinstance(qnode, qml.QNode):
            raise TypeError(
                f"pennylane_custatevec.compile takes a QNode (qml.qnode(...)), got "
                f"{type(qnode).__name__}."
            )
        if verify_every is not None and (
            type(verify_every) is not int or verify_every < 4 or verify_every & (verify_every - 1)
        ):
            raise ValueError(
                f"pennylane_custatevec.compile: verify_every={verify_every!r}; give a power of "
                "two of at least 4 (a replaying key is traced again at its calls 4, 8, ..., "
                "verify_every, then every verify_every-th call), or None (never again after "
                "its third call)."
            )
        self.qnode = qnode
        self.verify_every = verify_every
        self._named_reads = NamedReads.of(qnode.func)
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._structures: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.RLock()
        """Guards the caches and the entries' fields; held only while they are read or
        written, never while a call runs: a call that waited for it while holding
        PennyLane's queue locks (``queuing.without_queuing``) would deadlock with one that
        held it while waiting for them."""
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
            argument_key(args, leaves),
            # in the call's order: the quantum function sees them in that order
            tuple((name, argument_key(value, leaves)) for name, value in kwargs.items()),
            self._options_in_force(),
            torch.is_grad_enabled(),
            self._named_reads.key(),
        )
        vmapped = VmapCall.of(leaves)
        if vmapped is not None:
            return self._vmapped(vmapped, args, kwargs)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                entry.calls += 1
                traces = self._claims_trace(entry)
        if entry is None:
            return self._first_call(key, args, kwargs)
        if entry.mode is _Mode.FALLBACK:
            return self._fallback(entry.reason, args, kwargs)
        if traces:
            try:
                this_call = self._trace(entry, args, kwargs, leaves)
                if this_call is not None:
                    try:  # the quantum function ran once for this call: not again
                        return self._replayed(this_call, leaves, rewind=True)
                    except TraceRefused as refusal:
                        this_call.trace.generators.rewind_everything()
                        entry.mode, entry.reason = _Mode.RERECORD, str(refusal)
                        entry.replay = entry.candidate = None
            finally:
                with self._lock:
                    entry.tracing = False
        replay = entry.replay  # once: another thread may drop it
        if entry.mode is _Mode.REPLAY and replay is not None:
            before = replay.trace.generators.states_now() if replay.draws else None
            try:
                return self._replayed(replay, leaves)
            except TraceRefused:  # the call is recorded instead: its draws made once
                if before is not None:
                    restore(before)
                entry.mode, entry.replay = _Mode.RERECORD, None
        try:
            return self._recorded(args, kwargs, entry.config)[0]
        except Unserved as refusal:
            return self._fallback(str(refusal), args, kwargs)

    def _claims_trace(self, entry: _Entry) -> bool:
        """Whether this call of the key traces, claiming the trace (with ``_lock`` held).
        A call traces on the key's second and third calls and on a replaying key's
        verification calls (``verify_every``), where no other thread traces the key: a
        call that finds a trace under way is served as the key's mode serves it meanwhile
        (recorded, or replayed) instead of waiting, so that no thread ever waits for
        another's trace."""
        if entry.tracing or entry.mode in (_Mode.RERECORD, _Mode.FALLBACK):
            return False
        if entry.mode is _Mode.REPLAY:
            every, calls = self.verify_every, entry.calls
            if every is None:
                return False
            if not (calls % every == 0 if calls > every else calls & (calls - 1) == 0):
                return False
        entry.tracing = True
        return True

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
        except Unserved as refusal:
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
            torch_leaves((args, kwargs), leaves)
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
        tape, output = record_call(self.qnode, args, kwargs)
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
        result = self._run(batch, plan, tuple(parameters), tensors, torch_device_of(originals))
        return result, batch, config, parameters

    def _vmapped(self, vmapped: VmapCall, args, kwargs):
        """A call under ``torch.func.vmap`` as one broadcast call (``vmap.VmapCall``): the
        quantum function recorded on the batched arguments, its gate parameters' batch axes
        first, the broadcast tape recorded, preprocessed and run below the vmap, its results
        batched at their leading axis. Recorded on every call (a trace replays torch calls
        on plain tensors)."""
        tape, output = record_call(self.qnode, args, kwargs)
        if tape.batch_size is not None:
            raise RuntimeError(
                "pennylane_custatevec.compile: under torch.func.vmap the circuit of one row is "
                f"itself broadcast (batch size {tape.batch_size}); pass the whole batch as a "
                "broadcast input instead of vmapping."
            )
        if any(
            isinstance(value, torch.Tensor) and _functorch.is_functorch_wrapped_tensor(value)
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
            raise Unserved(f"the gradient method resolved to {config.gradient_method!r}")
        return config

    def _batch_of(self, tape: QuantumScript, output, config) -> tuple[Batch, list, list]:
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
                numeric = numeric_tape(device_tape)
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
        batch = Batch.of(structures, keys, post_processing, output)
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
            raise Unserved(str(refusal)) from None
        with self._lock:
            self._structures[key] = structure
            while len(self._structures) > MAX_STRUCTURES:
                self._structures.popitem(last=False)
        return structure

    # --- traced calls --------------------------------------------------------------

    def _trace(self, entry: _Entry, args, kwargs, leaves: list) -> Replay | None:
        """Trace a call of the key and judge the trace (``_judged``). Returns the trace as
        a replay to run this call (it recorded the whole call), or None where the trace was
        refused (the key re-records; the generators are as they were before the trace).
        ``leaves``: the call's torch tensors (``argument_key``)."""
        trace = Trace(entry.generators)
        traced_args = with_tracers(args, trace)
        traced_kwargs = with_tracers(kwargs, trace)
        try:
            with trace.recording():
                tape, output = record_call(self.qnode, traced_args, traced_kwargs)
                tapes, post_processing = self.qnode.device.preprocess_transforms(entry.config)(
                    (tape,)
                )
            with without_queuing():  # the bound tapes' operators: into no recording
                replay = self._traced(entry, trace, tapes, post_processing, output, leaves)
        except (TraceRefused, Unserved) as refusal:
            trace.generators.rewind_everything()
            self._judged(entry, None, str(refusal))
            return None
        self._judged(entry, replay, replay.reason)
        return replay

    def _judged(self, entry: _Entry, replay: Replay | None, refusal: str | None) -> None:
        """The key's mode after a trace (``replay``, None where refused; ``refusal``: why
        the trace cannot stand for later calls, else None): a second call's trace that
        gives the first call's circuit waits for the third call's (PROVING); a third
        call's trace equal to the second's makes the key replay it; a verification's equal
        to the replayed one changes nothing. Anything else: the key re-records, with a
        warning where it was replaying (what it replayed may have been stale)."""
        mode = entry.mode
        if refusal is None and mode is _Mode.SEEN_ONCE:
            if entry.first.keys != replay.batch.keys or not constants_agree(
                replay.sources, entry.first_parameters
            ):
                refusal = "the trace gave another circuit than the first call"
        elif refusal is None and mode is _Mode.PROVING:
            refusal = replay.difference(entry.candidate)
        elif refusal is None and mode is _Mode.REPLAY:
            refusal = replay.difference(entry.replay)
        entry.first, entry.first_parameters = None, ()
        if replay is not None:
            entry.generators = replay.trace.generators.explicit
        if refusal is not None:
            if mode is _Mode.REPLAY:
                self._warn_once(
                    f"pennylane_custatevec.compile: a replayed call's quantum function changed "
                    f"({refusal}): it reads state outside its arguments; it is recorded on "
                    "every call from now on (calls since the last verification replayed the "
                    "earlier state)."
                )
            entry.mode, entry.reason, entry.replay, entry.candidate = (
                _Mode.RERECORD, refusal, None, None
            )  # fmt: skip
        elif mode is _Mode.SEEN_ONCE:
            entry.mode, entry.candidate = _Mode.PROVING, replay
        elif mode is _Mode.PROVING:
            entry.mode, entry.replay, entry.candidate = _Mode.REPLAY, entry.candidate, None

    def _warn_once(self, message: str) -> None:
        with self._lock:
            fresh = message not in self._warned
            self._warned.add(message)
        if fresh:
            warnings.warn(message, UserWarning, stacklevel=4)

    def _traced(
        self, entry: _Entry, trace: Trace, tapes, post_processing, output, leaves: list
    ) -> Replay:
        """``_trace`` after the recording: bind the device tapes' parameters to the trace."""
        rows = [parameter_sources(device_tape, trace) for device_tape in tapes]
        sources = tuple(row for row, _ in rows)
        needed = [source.index for row in sources for source in row if isinstance(source, Slot)]
        trace.prune(needed)
        values = trace.replay(leaves, rewind=True)
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
        inputs, plan_sources = function_inputs(sources, structures, views)
        for row, structure in zip(sources, structures, strict=True):
            replay_rows.append(ReplayRow.of(row, structure.template.trainable_params, views))
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
        batch = Batch.of(structures, keys, post_processing, output)
        plan = CircuitsPlan.of(self.qnode.device, structures, entry.config, plan_sources)
        reason = next((reason for _, reason in rows if reason is not None), None)
        replay = Replay(trace, sources, batch, tuple(replay_rows), inputs, plan, reason)
        return replay.with_lane(trace.replay(leaves, rewind=True))

    def _replayed(self, replay: Replay, leaves: list, rewind: bool = False):
        """A call replayed: the trace on the call's torch tensors ``leaves`` (``rewind``:
        drawing the trace's own numbers, for the traced call), its values bound to the
        structures' parameters, run."""
        values = replay.trace.replay(leaves, rewind)
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
        batch: Batch,
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


def compile(  # noqa: A001 - the package's entry point
    qnode: qml.QNode | None = None, *, verify_every: int | None = VERIFY_EVERY
):
    """``qnode`` compiled for torch: a callable with the QNode's signature, results and
    gradients, that runs each call as one torch.autograd.Function (see ``doc/compiled.md``).
    Usable as a decorator over a QNode, with or without arguments
    (``@compile(verify_every=None)``).

    ``verify_every``: a replaying key's quantum function is traced again, and compared
    with what is replayed, at the key's calls 4, 8, ..., ``verify_every`` and then every
    ``verify_every``-th call (a power of two of at least 4); None: never after the third
    call (a quantum function that reads state outside its arguments may then be replayed
    stale for good)."""
    if qnode is None:
        return functools.partial(CompiledQNode, verify_every=verify_every)
    return CompiledQNode(qnode, verify_every)
