"""A device's runs: the forward pass of a batch of tapes, what it keeps for the backward
pass, and the derivatives that start from what it kept.

Forward, each analytic tape is prepared by its structure (``structures.Structure``): a
small structure of Pauli expectation values runs directly (``direct``: a few backend
calls), any other tape on the general path (``execution.run_tapes``). With the adjoint
method the forward pass keeps, per tape, a ``Kept``: the tape's final state and its
compilation, either a ``kept.KeptState`` (general path) or a ``direct.DirectKept``. Both
answer the same questions (``Kept``: broadcast, general, direct_vjp, spent), so that the
backward pass routes without asking which path ran:

- the VJP: the direct one where the tape ran directly and the deferred mode is in
  force (its sweep is one gate sequence), else the eager sweep (eager mode, or a tape
  only the eager sweep differentiates: ``swept_eagerly``), else the deferred sweep;
- the Jacobian and the JVP: the eager or the deferred sweep from ``Kept.general()``.

A kept state is handed out once (a sweep consumes it) and only for a tape with the same
operations and parameters, bit for bit: its key, ``(StructureKey, the parameters'
bytes)``, is made when the tape is prepared; the derivatives that follow take the
structure key of the same tape object from the execution (``KeptStates``) instead of
computing it again, and read the parameters' bytes again (an array may have been
edited in place).
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np
import pennylane as qml
from pennylane.devices import ExecutionConfig
from pennylane.exceptions import DeviceError
from pennylane.math import Interface
from pennylane.tape import QuantumScript
from pennylane.wires import Wires

from . import direct, simulate
from .backends.base import Backend
from .entrywise import EntrywiseState, EntrywiseUnitary, jit_whole_matrix_reason
from .execution import PreparedTape, RunResult, run_tapes
from .gradients import deferred, eager, jvp
from .gradients.validation import require_adjoint_serves
from .kept import KeptState
from .preprocess.config import ADJOINT_VALIDATED_IN_PREPROCESSING
from .settings import DifferentiationOptions
from .structures import Structure, StructureCache, StructureKey, StructureRun


class Kept(Protocol):
    """What the forward pass kept of one tape for its derivatives: a ``KeptState`` or a
    ``direct.DirectKept``."""

    @property
    def broadcast(self) -> bool:
        """Whether the tape is broadcast (as its compilation says)."""

    def general(self) -> KeptState:
        """The tape's final state (None where a sweep took it) and compilation, as the
        eager and deferred sweeps take them."""

    def direct_vjp(self, backend: Backend, cotangents) -> tuple | None:
        """The tape's VJP in a few backend calls where it ran directly (None: the general
        path's)."""

    def spent(self) -> Kept:
        """What is left once a sweep took the state: a later derivative simulates again."""


@dataclasses.dataclass(frozen=True, eq=False)
class Preparation:
    """A tape as the forward pass takes it: compiled by its structure (``prepared``; None:
    it is compiled on its own) or run directly (``plan`` and ``call``), and the key of the
    state kept of it."""

    prepared: PreparedTape | None
    kept_key: tuple
    """``(StructureKey, the operations' parameters' bytes)``: the key fixes everything
    but the parameters' values (their dtypes and shapes too), the bytes those (``hash``
    rounds every parameter)."""
    plan: direct.DirectPlan | None = None
    """The structure's plan where the tape runs directly (then ``prepared`` is None)."""
    call: direct.CallData | None = None
    """The tape's call data, where it runs directly."""

    def general(self, tape: QuantumScript) -> Preparation:
        """This preparation of ``tape`` (one that runs directly) for the general path."""
        structure = self.plan.structure
        compilation = self.call.compilation or structure.compile(self.call.parameters, tape)
        return Preparation(PreparedTape(compilation, structure.batch_key), self.kept_key)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How one execution runs (the device's part of its config)."""

    keep: bool
    """Whether the final states are kept for the derivatives (the adjoint method)."""
    rng: np.random.Generator
    """The generator of the execution's samples and mid-circuit measurements."""
    postselect_mode: str | None
    fusion_qubits: int
    """The fusion width in force."""


class Runs:
    """One device's forward runs and what they keep for the derivatives that follow: the
    kept states of the last batch executed with the adjoint method (replaced, and so
    freed, by the next execution)."""

    def __init__(self, backend: Backend, wires: Wires | None, structure_cache: StructureCache):
        self.backend = backend
        self.wires = wires
        self._structures = structure_cache
        self.kept = KeptStates()

    def __getstate__(self) -> dict:
        """A copied or pickled device keeps no states (``KeptStates.__getstate__``)."""
        return {**self.__dict__, "kept": KeptStates()}

    # --- forward ---------------------------------------------------------------------

    def execute(self, circuits: Sequence[QuantumScript], options: RunOptions) -> tuple:
        """The results of ``circuits``; where ``options.keep`` (the adjoint method), their
        final states are kept for the derivatives that usually follow."""
        # the previous batch's states go first: the new ones would replace them anyway,
        # and the memory checks of this run see the memory they held as free
        self.kept.clear()
        preparations = [self._preparation(tape) for tape in circuits]
        ran_directly = [i for i, p in enumerate(preparations) if p.plan is not None]
        keep = options.keep
        if (
            ran_directly
            and keep
            and not simulate.fits(
                self.backend,
                direct.state_bytes(self.backend, [preparations[i].plan for i in ran_directly]),
            )
        ):  # their final states do not fit together: the general path chunks them
            for i in ran_directly:
                preparations[i] = preparations[i].general(circuits[i])
            ran_directly = []
        kept_keys = [p.kept_key for p in preparations]
        if not ran_directly:
            ran = self.run_tapes(circuits, options, [p.prepared for p in preparations])
            self.kept.replace(kept_keys, ran.kept, circuits)
            return ran.results
        # small structures of Pauli expvals (``direct``): a few backend calls each
        results: list = [None] * len(circuits)
        direct_results, direct_run = direct.forward(
            self.backend,
            [preparations[i].plan for i in ran_directly],
            [preparations[i].call for i in ran_directly],
            keep,
        )
        kept: dict = {}
        for position, i in enumerate(ran_directly):
            results[i] = direct_results[position]
            if keep:
                kept[i] = direct.DirectKept(direct_run, position)
        others = [i for i, p in enumerate(preparations) if p.plan is None]
        if others:
            ran = self.run_tapes(
                [circuits[i] for i in others], options, [preparations[i].prepared for i in others]
            )
            for position, i in enumerate(others):
                results[i] = ran.results[position]
                if position in ran.kept:
                    kept[i] = ran.kept[position]
        self.kept.replace(kept_keys, kept, circuits)
        return tuple(results)

    def run_tapes(
        self,
        circuits: Sequence[QuantumScript],
        options: RunOptions,
        prepared: Sequence[PreparedTape | None] | None = None,
    ) -> RunResult:
        """``execution.run_tapes`` on this device's backend and wires."""
        return run_tapes(
            self.backend,
            circuits,
            self.wires,
            options.rng,
            options.postselect_mode,
            keep=options.keep,
            fusion_qubits=options.fusion_qubits,
            prepared=prepared,
        )

    def execute_structures(
        self,
        structures_run: Sequence[Structure],
        parameters: Sequence[Sequence],
        options: RunOptions,
    ) -> StructureRun:
        """The compiled path's forward pass (``CuStateVecDevice.execute_structures``): the
        results of ``structures_run`` with ``parameters`` and, in the returned run, what it
        kept of each tape (``Kept``; a state not kept for memory leaves its compilation,
        from which the sweep simulates)."""
        tapes = tuple(structure.template for structure in structures_run)
        plans = direct.plans_of(self.backend, structures_run)
        if plans is not None and simulate.fits(
            self.backend, direct.state_bytes(self.backend, plans)
        ):  # small circuits of Pauli expvals: a few backend calls each
            calls = [direct.call_data(p, v) for p, v in zip(plans, parameters, strict=True)]
            if None not in calls:
                results, direct_run = direct.forward(self.backend, plans, calls)
                kept = [direct.DirectKept(direct_run, i) for i in range(len(tapes))]
                return StructureRun(results, tapes, kept)
        prepared = [
            PreparedTape(structure.compile(values), structure.batch_key)
            for structure, values in zip(structures_run, parameters, strict=True)
        ]
        ran = self.run_tapes(tapes, options, prepared)
        kept = [ran.kept.get(i) or KeptState(None, p.compilation) for i, p in enumerate(prepared)]
        return StructureRun(ran.results, tapes, kept)

    def _preparation(self, tape: QuantumScript) -> Preparation:
        """The tape compiled by its structure (cached, ``StructureCache``) if it has one
        (analytic, without mid-circuit measurements, its trainable parameters its gates',
        its key seen before), or its direct plan and call, and the key of its kept state."""
        key, structure = self._structures.lookup(tape)
        parameters = tape.get_parameters(trainable_only=False, operations_only=True)
        kept_key = (key, parameter_bytes(parameters))
        if structure is None or structure.has_mid_measurements:
            return Preparation(None, kept_key)
        plan = direct.plan_of(self.backend, structure)
        call = direct.call_data(plan, parameters, tape) if plan is not None else None
        if call is not None:
            return Preparation(None, kept_key, plan, call)
        return Preparation(
            PreparedTape(structure.compile(parameters, tape), structure.batch_key), kept_key
        )

    # --- backward --------------------------------------------------------------------

    def take_kept(self, tapes: Sequence[QuantumScript]) -> list[Kept | None]:
        """What the last execution kept of each tape (removed: a sweep consumes it), or
        None."""
        return [self.kept.take(tape) for tape in tapes]

    def vjps(
        self,
        circuits: Sequence[QuantumScript],
        cotangents: Sequence,
        kept: Sequence[Kept | None],
        in_force: DifferentiationOptions,
    ) -> tuple:
        """The VJP of each tape by the accumulation mode in force (module docstring)."""
        gradients: list = [None] * len(circuits)
        if in_force.grad_accumulation == "deferred":  # the direct sweep is the deferred one
            for i, entry in enumerate(kept):
                if entry is not None:
                    gradients[i] = entry.direct_vjp(self.backend, cotangents[i])
        return _swept(
            circuits,
            kept,
            in_force,
            gradients,
            eagerly=lambda i, entry: eager.vjp(
                self.backend, circuits[i], cotangents[i], self.wires, entry
            ),
            deferred_batch=lambda rest, entries: deferred.vjps(
                self.backend,
                [circuits[i] for i in rest],
                [cotangents[i] for i in rest],
                self.wires,
                entries,
                in_force.fusion_qubits,
            ),
        )

    def jacobians(
        self,
        tapes: Sequence[QuantumScript],
        kept: Sequence[Kept | None],
        in_force: DifferentiationOptions,
    ) -> tuple:
        """The adjoint Jacobian of each tape by the accumulation mode in force."""
        return _swept(
            tapes,
            kept,
            in_force,
            [None] * len(tapes),
            eagerly=lambda i, entry: eager.jacobian(self.backend, tapes[i], self.wires, entry),
            deferred_batch=lambda rest, entries: deferred.jacobians(
                self.backend, [tapes[i] for i in rest], self.wires, entries, in_force.fusion_qubits
            ),
        )

    def jvps(
        self,
        tapes: Sequence[QuantumScript],
        tangents: Sequence,
        kept: Sequence[Kept | None],
        in_force: DifferentiationOptions,
        validate: Callable[[Sequence[QuantumScript], Sequence[Kept | None]], None],
    ) -> tuple:
        """The JVP of each tape (``gradients.jvp``): the tapes differentiated (their
        trainable parameters reduced to those with a nonzero tangent) and those that get
        zeros, each validated (``validate(tapes, kept)``) as it comes."""
        general = [_general(entry) for entry in kept]

        def jacobians(differentiated: Sequence[QuantumScript], entries: Sequence) -> tuple:
            validate(differentiated, entries)
            return self.jacobians(differentiated, entries, in_force)

        def zero_jvp(tape: QuantumScript, entry: KeptState | None):
            validate([tape], [entry])
            return jvp.zeros(tape, self.wires, entry.compilation if entry else None)

        return jvp.jvps(tapes, tangents, general, jacobians=jacobians, zero_jvp=zero_jvp)


def require_served(
    tapes: Sequence[QuantumScript],
    kept: Sequence[Kept | None],
    config: ExecutionConfig | None,
    in_force: DifferentiationOptions,
) -> None:
    """Refuse a tape the sweep of the mode in force cannot differentiate, as the
    preprocessing would, unless ``config`` says that the preprocessing validated the
    tapes (``ADJOINT_VALIDATED_IN_PREPROCESSING``). As the sweep reads them: the tape's
    ``trainable_params``, and whether it is broadcast from the compilation the forward
    pass kept (``kept[i]``), if any."""
    if config is not None and config.device_options.get(ADJOINT_VALIDATED_IN_PREPROCESSING):
        if config.interface is Interface.JAX_JIT:
            _refuse_matrices_left_whole(tapes)
        return
    batched = in_force.grad_accumulation == "deferred"
    for tape, entry in zip(tapes, kept, strict=True):
        broadcast = None if entry is None else entry.broadcast
        require_adjoint_serves(tape, broadcast=broadcast, batched=batched)


def _refuse_matrices_left_whole(tapes: Sequence[QuantumScript]) -> None:
    """Under ``jax.jit``, the validated tapes may hold a trainable unitary matrix that the
    preprocessing left whole (``entrywise.left_whole_under_jit``: traced by jit alone, too
    wide to pass entry by entry): its derivative, asked for now, is refused by name."""
    for tape in tapes:
        for index in tape.trainable_params:
            op = tape.par_info[index]["op"]
            if isinstance(op, (qml.QubitUnitary, qml.ControlledQubitUnitary)):
                raise DeviceError(
                    "custatevec.qubit cannot differentiate this circuit by adjoint: "
                    f"{jit_whole_matrix_reason(op)}."
                )


def _swept(
    tapes: Sequence[QuantumScript],
    kept: Sequence[Kept | None],
    in_force: DifferentiationOptions,
    done: list,
    eagerly: Callable,
    deferred_batch: Callable,
) -> tuple:
    """``done`` (per tape its derivative, or None) completed by the sweeps: the eager
    sweep per tape (``eagerly(i, kept state)``) in the eager mode and for a tape that only
    it differentiates (``swept_eagerly``), the deferred sweep for the others as one batch
    (``deferred_batch(indices, kept states)``)."""
    deferred_mode = in_force.grad_accumulation == "deferred"
    rest = []
    for i, tape in enumerate(tapes):
        if done[i] is not None:
            continue
        if not deferred_mode or swept_eagerly(tape):
            done[i] = eagerly(i, _general(kept[i]))
        else:
            rest.append(i)
    if rest:
        swept = deferred_batch(rest, [_general(kept[i]) for i in rest])
        for i, value in zip(rest, swept, strict=True):
            done[i] = value
    return tuple(done)


def _general(entry: Kept | None) -> KeptState | None:
    return None if entry is None else entry.general()


def swept_eagerly(tape: QuantumScript) -> bool:
    """Whether the deferred mode hands ``tape`` to the eager sweep: an ``EntrywiseUnitary``
    or ``EntrywiseState`` (a trainable unitary or prepared state taken by its entries) is
    differentiated by the eager sweep only, whose step through it is one dense reduction
    (``gradients.eager``); the deferred sweep's fused blocks differentiate gates by their
    generators. So is a postselection (a Projector), which the eager sweep steps back
    through by simulating the state before it again
    (``eager._back_through_postselection``)."""
    return any(_is_swept_eagerly_only(type(op)) for op in tape.operations)


@functools.cache
def _is_swept_eagerly_only(kind: type) -> bool:
    """Whether the deferred sweep leaves an operation of type ``kind`` to the eager sweep
    (``swept_eagerly``): a cached lookup by type, for every operation of every tape the
    deferred mode differentiates (``isinstance`` on PennyLane's operator classes costs
    about ten times more: measured for ``preprocess.common.is_dynamic_type``)."""
    return issubclass(kind, (EntrywiseUnitary, EntrywiseState, qml.Projector))


class KeptStates:
    """What the last batch executed for adjoint differentiation kept (``Kept`` per tape:
    final states, compilations, fused plans), so that the VJP or Jacobian that follows
    neither simulates, compiles nor plans the circuits again. Each is handed out once
    (the sweep consumes the state) and only for a tape with the same operations and the
    same parameters, bit for bit (its key, ``Preparation.kept_key``)."""

    def __init__(self):
        self._entries: dict[tuple, list[Kept]] = {}
        self._executed: dict[int, ExecutedTape] = {}

    def __getstate__(self) -> dict:
        """A copied or pickled device keeps no states: they belong to the original's last
        execution, whose tapes they know by identity (and through weak references, which
        do not pickle)."""
        return {"_entries": {}, "_executed": {}}

    def clear(self) -> None:
        self._entries = {}
        self._executed = {}

    def replace(
        self,
        keys: Sequence[tuple],
        kept: Mapping[int, Kept],
        tapes: Sequence[QuantumScript],
    ) -> None:
        """``keys[i]``: tape i's key; ``kept``: {tape index: what was kept of it};
        ``tapes`` the tapes executed (whose structure keys the derivatives that follow
        take for the same tape objects, ``structure_key_of``)."""
        self._entries = {}
        self._executed = {}
        for i, entry in kept.items():
            self._entries.setdefault(keys[i], []).append(entry)
            self._executed[id(tapes[i])] = ExecutedTape.of(tapes[i], keys[i][0])

    def structure_key_of(self, tape: QuantumScript) -> StructureKey | None:
        """The structure key of ``tape`` if it is a tape object that the last execution ran
        and still holds the same operations, measurements and trainable parameters (the
        PennyLane workflow hands the derivatives the tapes it executed: their key is not
        computed twice); else None."""
        executed = self._executed.get(id(tape))
        return executed.key if executed is not None and executed.holds(tape) else None

    def take(self, tape: QuantumScript) -> Kept | None:
        """What was kept of ``tape`` (removed), or None."""
        if not self._entries:
            return None
        parameters = tape.get_parameters(trainable_only=False, operations_only=True)
        key = self.structure_key_of(tape) or StructureKey.of(tape)
        entries = self._entries.get((key, parameter_bytes(parameters)))
        return entries.pop(0) if entries else None


@dataclasses.dataclass(frozen=True, eq=False)
class ExecutedTape:
    """A tape object that an execution ran, by identity: its operations and
    measurements (the objects, held so that no other object takes their place), its
    trainable parameters, and its structure key."""

    tape: weakref.ref
    operations: tuple
    measurements: tuple
    trainable: tuple[int, ...]
    key: StructureKey

    @classmethod
    def of(cls, tape: QuantumScript, key: StructureKey) -> ExecutedTape:
        return cls(
            weakref.ref(tape),
            tuple(tape.operations),
            tuple(tape.measurements),
            tuple(tape.trainable_params),
            key,
        )

    def holds(self, tape: QuantumScript) -> bool:
        return (
            self.tape() is tape
            and _same_objects(self.operations, tape.operations)
            and _same_objects(self.measurements, tape.measurements)
            and self.trainable == tuple(tape.trainable_params)
        )


def _same_objects(held: tuple, current: Sequence) -> bool:
    return len(held) == len(current) and all(a is b for a, b in zip(held, current, strict=True))


def parameter_bytes(parameters: Sequence) -> bytes:
    """The parameters' values bit for bit, for a key that fixes their dtypes and shapes."""
    return b"".join([np.asarray(value).tobytes() for value in parameters])
