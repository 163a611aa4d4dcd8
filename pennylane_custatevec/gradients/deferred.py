"""Adjoint differentiation, deferred mode: the entry points (``vjps``, ``jacobians``) and
the scheduling of their sweeps (tasks, keys, groups and memory chunks); the sweep itself,
over fused blocks, is ``fused_sweep``'s.

Batches: tapes that share a structure (and the entries of a broadcast tape) sweep as one
batch of B state vectors, each with its R bras (R = 1 for a VJP; one per output for a
Jacobian), so a minibatch or a full Jacobian is one sweep. The bras of vector b are rows
b*R .. b*R + R - 1 of the bra batch. Tapes are grouped by ``SweepKey`` and cut into
chunks whose sweeps (final states, bras, temporaries and reductions: ``_ChunkTally``) fit
in the backend's free memory (``batching``, as the forward pass), and a chunk that does
not fit alone is refused before anything is allocated."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np
from pennylane.measurements import ExpectationMP, StateMP
from pennylane.operation import Operator
from pennylane.tape import QuantumScript
from pennylane.wires import Wires

from .. import batching, fused_units, measure, simulate
from ..backends.base import Backend
from ..backends.primitives import StateBatch
from ..exact import generator_key
from ..instructions import Instruction
from ..kept import KeptState
from ..program import Compilation, Register, Step, flatten, merge
from .bras import add_cotangent_terms
from .cotangents import (
    checked_cotangents,
    cotangent_batch,
    format_jacobian,
    one_hot_rows,
    stacked_gradients,
)
from .differentiated import DifferentiatedTape
from .forward import state_derivatives
from .fused_sweep import sweep
from .memory import SweepMemory, bra_build_scratch, eager_sweep_memory, require_sweep_memory
from .results import is_zero, output_shape, output_size


@dataclasses.dataclass
class _Task:
    """One tape's part of a batched sweep: its final state if known, the fused plan of its
    compilation if the forward pass made one, its rows of cotangents per vector, and the
    part of its gradients that the observables' trainable data take from the final state
    (``DifferentiatedTape.observable_gradients``; None without such data)."""

    index: int
    circuit: DifferentiatedTape
    state: StateBatch | None
    rows: list[list[tuple]]  # rows[b]: the R cotangent rows of vector b
    observable: np.ndarray | None = None
    plan: fused_units.FusedPlan | None = None

    @classmethod
    def make(
        cls, backend: Backend, index: int, circuit: DifferentiatedTape, kept: KeptState | None, rows
    ) -> _Task:
        """The task, with its observable part taken from the final state before any
        sweep consumes it (the state is computed here for such a task if not kept)."""
        state = kept.state if kept else None
        plan = kept.plan if kept else None
        if not circuit.observable_columns:
            return cls(index, circuit, state, rows, plan=plan)
        if state is None:
            state = circuit.final_state(backend)
        observable = circuit.observable_gradients(backend, state, rows)
        return cls(index, circuit, state, rows, observable, plan)

    def gradients(self, swept: np.ndarray) -> np.ndarray:
        """(B, R, P): the sweep's gradients of the task and its observable part."""
        return swept if self.observable is None else swept + self.observable

    @functools.cached_property
    def sweep_key(self) -> SweepKey:
        return SweepKey.of(self)


@dataclasses.dataclass(frozen=True)
class SweepKey:
    """Equal for tasks that may sweep as one batch: everything the sweep reads of a task
    but the data of its instructions and its cotangents. The merged compilation keeps the
    first task's operation of every step (``program.merge``), and the sweep reads from it
    the generators (``fused_sweep``'s ``_generator``, ``_operation_step``), the wires the
    generator acts on and whether the step is a plain Pauli rotation; so the operations of
    a step must agree in type, wires, hyperparameters (exactly) and whatever else their
    generator depends on (``exact.generator_key``), not only in the kernels they compiled
    to: IsingXY and SingleExcitation are both one 4x4 matrix, PhaseShift and
    ctrl(GlobalPhase) both one diagonal, with other generators."""

    kernels: tuple
    """The forward pass's kernel key (``Program.kernel_key``): register, kernels, bits,
    data shapes."""
    steps: tuple
    """Per step: the operation's ``generator_key``, and per instruction whether it is
    compiled from the operation itself (``plain_rotation``)."""
    columns: tuple
    """The trainable steps with their columns, and the number of columns."""
    rows: int
    """Cotangent rows (bras) per vector."""

    @classmethod
    def of(cls, task: _Task) -> SweepKey:
        circuit = task.circuit
        return cls(
            kernels=flatten(circuit.compilation).kernel_key,
            steps=tuple([_step_key(step.operation, step.instructions) for step in circuit.steps]),
            columns=(tuple(sorted(circuit.columns.items())), circuit.n_columns),
            rows=len(task.rows[0]),
        )

    def mismatch(
        self, other: SweepKey, steps: Sequence[Step], other_steps: Sequence[Step]
    ) -> str | None:
        """What differs between two keys (``steps``: the compilations' steps), or None."""
        for field in dataclasses.fields(self):
            mine, theirs = getattr(self, field.name), getattr(other, field.name)
            if mine == theirs:
                continue
            if field.name == "steps" and len(mine) == len(theirs):
                j = next(j for j, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b)
                return f"step {j}: {steps[j].operation!r} and {other_steps[j].operation!r}"
            return field.name
        return None


def _step_key(op: Operator, instructions: Sequence[Instruction]) -> tuple:
    # no condition to compare: the adjoint method refuses conditional operations
    return generator_key(op), tuple([instruction.source is op for instruction in instructions])


def _merge_for_sweep(tasks: list[_Task]) -> Compilation:
    """``program.merge`` of the tasks' compilations, refused (an internal error) for tasks
    whose sweep keys differ: the merge keeps the first task's operations, and a task swept
    with another's generators would get a wrong gradient, silently."""
    if len(tasks) > 1:
        first = tasks[0]
        for task in tasks[1:]:
            difference = first.sweep_key.mismatch(
                task.sweep_key, first.circuit.steps, task.circuit.steps
            )
            if difference is not None:
                raise RuntimeError(
                    "custatevec.qubit internal error: tapes that the derivative reads "
                    f"differently were batched into one adjoint sweep ({difference} differ)."
                )
    return merge([task.circuit.compilation for task in tasks])


def vjps(
    backend: Backend,
    tapes: Sequence[QuantumScript],
    cotangents: Sequence,
    device_wires: Wires | None,
    kept: Sequence[KeptState | None],
    fusion_qubits: int,
) -> tuple:
    """The VJP of each tape (as ``eager.vjp``), tapes that share a structure in one
    sweep. ``kept[i]``: what the forward pass kept of tape i, or None."""
    results: list = [None] * len(tapes)
    tasks = []
    live_rows: dict[int, tuple] = {}  # a batch of cotangents: (K, the rows swept), by tape
    for index, (tape, dy, entry) in enumerate(zip(tapes, cotangents, kept, strict=True)):
        circuit = _circuit(tape, device_wires, entry)
        rows = cotangent_batch(circuit, dy)
        if rows is not None:
            live = [k for k, row in enumerate(rows) if not all(is_zero(d) for d in row)]
            results[index] = stacked_gradients(circuit, np.zeros((len(rows), circuit.n_columns)))
            if live and circuit.n_params:
                live_rows[index] = (len(rows), live)
                tasks.append(
                    _Task.make(backend, index, circuit, entry, _batch_rows(circuit, rows, live))
                )
            continue
        per_measurement = checked_cotangents(circuit, dy)
        if circuit.n_params == 0:
            results[index] = ()
        elif all(is_zero(d) for d in per_measurement):
            results[index] = tuple(circuit.fold(np.zeros(circuit.n_columns)))
        else:
            rows = _vector_rows(circuit, per_measurement)
            tasks.append(_Task.make(backend, index, circuit, entry, rows))
    for task, gradients in _run(backend, tasks, fusion_qubits):
        gradients = task.gradients(gradients)
        if task.index in live_rows:
            size, live = live_rows[task.index]
            stacked = np.zeros((size, task.circuit.n_columns), dtype=gradients.dtype)
            stacked[live] = gradients.sum(axis=0)  # over the vectors of a broadcast tape
            results[task.index] = stacked_gradients(task.circuit, stacked)
        else:
            results[task.index] = tuple(task.circuit.fold(gradients.sum(axis=(0, 1))))
    return tuple(results)


def _vector_rows(circuit: DifferentiatedTape, per_measurement: tuple) -> list[list[tuple]]:
    """One cotangent row per vector: a broadcast tape's cotangents split by entry."""
    register = circuit.register
    if not register.broadcast:
        return [[per_measurement]]
    batch = register.batch_size
    split = [
        [None] * batch
        if is_zero(dy)
        else list(np.broadcast_to(dy, (batch, *output_shape(mp, register))))
        for mp, dy in zip(circuit.tape.measurements, per_measurement, strict=True)
    ]
    return [[tuple(entries[b] for entries in split)] for b in range(batch)]


def _batch_rows(
    circuit: DifferentiatedTape, rows: list[tuple], live: list[int]
) -> list[list[tuple]]:
    """The rows ``live`` of a batch of cotangents, for every vector: rows[b][i] is row
    live[i] for vector b (a broadcast tape's cotangents split by entry)."""
    per_row = [_vector_rows(circuit, rows[k]) for k in live]
    return [[split[b][0] for split in per_row] for b in range(circuit.register.batch_size)]


def jacobians(
    backend: Backend,
    tapes: Sequence[QuantumScript],
    device_wires: Wires | None,
    kept: Sequence[KeptState | None],
    fusion_qubits: int,
) -> tuple:
    """The Jacobian of each tape (as ``eager.jacobian``; a broadcast tape's entries carry
    its batch axis first), tapes that share a structure in one sweep. ``kept`` as in
    ``vjps``."""
    circuits, per_measurement, tasks = [], [], []
    for index, (tape, entry) in enumerate(zip(tapes, kept, strict=True)):
        circuit = _circuit(tape, device_wires, entry)
        circuits.append(circuit)
        per_measurement.append([None] * len(tape.measurements))
        swept = [i for i, mp in enumerate(tape.measurements) if not isinstance(mp, StateMP)]
        if swept and circuit.n_params:
            rows = one_hot_rows(circuit, swept)
            vector_rows = [rows] * circuit.register.batch_size
            tasks.append(_Task.make(backend, index, circuit, entry, vector_rows))
    for task, gradients in _run(backend, tasks, fusion_qubits):
        _split_outputs(task.circuit, task.gradients(gradients), per_measurement[task.index])
    for circuit, entries in zip(circuits, per_measurement, strict=True):
        if circuit.n_params and any(isinstance(mp, StateMP) for mp in circuit.tape.measurements):
            _state_outputs(backend, circuit, entries)
        if not circuit.n_params:
            entries[:] = [() for _ in entries]
    return tuple(
        format_jacobian(entries, circuit.n_params) if circuit.n_params else _no_parameters(entries)
        for circuit, entries in zip(circuits, per_measurement, strict=True)
    )


def _circuit(
    tape: QuantumScript, device_wires: Wires | None, kept: KeptState | None
) -> DifferentiatedTape:
    """The tape compiled for the batched sweep, with the kept compilation if any."""
    circuit = DifferentiatedTape(tape, device_wires, kept.compilation if kept else None)
    if circuit.entry_columns or circuit.state_columns is not None:
        raise TypeError(
            "custatevec.qubit internal error: a tape differentiated by the entries of a "
            "matrix or a state reached the deferred sweep; the eager sweep takes it "
            "(runs.swept_eagerly)"
        )
    return circuit


def _no_parameters(entries: list) -> tuple:
    return entries[0] if len(entries) == 1 else tuple(entries)


def _split_outputs(circuit: DifferentiatedTape, gradients: np.ndarray, entries: list) -> None:
    """Each swept measurement's rows of ``gradients`` (B, R, P) as per-parameter arrays."""
    register, start = circuit.register, 0
    for i, mp in enumerate(circuit.tape.measurements):
        if isinstance(mp, StateMP):
            continue
        size = output_size(mp, register)
        block = gradients[:, start : start + size]
        start += size
        shape = output_shape(mp, register)
        entries[i] = circuit.fold(
            [
                block[:, :, c].reshape((-1, *shape))
                if register.broadcast
                else block[0, :, c].reshape(shape)
                for c in range(circuit.n_columns)
            ]
        )


def _state_outputs(backend: Backend, circuit: DifferentiatedTape, entries: list) -> None:
    """The Jacobian of a state output, in forward mode (as the eager mode)."""
    derivatives = state_derivatives(backend, circuit)
    wires = circuit.register.wires
    for i, mp in enumerate(circuit.tape.measurements):
        if isinstance(mp, StateMP):
            entries[i] = circuit.fold(
                [
                    mp.process_state(d if circuit.register.broadcast else d[0], wire_order=wires)
                    for d in derivatives
                ]
            )


def _run(backend: Backend, tasks: list[_Task], fusion_qubits: int):
    """(task, gradients (B_task, R, P)) for every task: tasks with equal sweep keys (the
    same kernels, operations, trainable gates and number of rows) sweep together, in
    memory chunks (``batching.SWEEP``), every chunk checked before the first sweep
    allocates anything."""
    planned = [
        [tasks[i] for i in chunk.indices]
        for group in batching.group_by(tasks, lambda task: task.sweep_key)
        for chunk in batching.chunk_by_memory(
            backend,
            group,
            tasks,
            _ChunkTally.empty(backend, tasks[group.indices[0]], fusion_qubits),
            batching.SWEEP,
        )
    ]
    for chunk in planned:  # all of them before the first sweep allocates anything
        _require_chunk_memory(backend, chunk, fusion_qubits)
    for chunk in planned:
        gradients = _sweep_chunk(backend, chunk, fusion_qubits)
        offset = 0
        for task in chunk:
            size = task.circuit.register.batch_size
            yield task, gradients[offset : offset + size]
            offset += size


@dataclasses.dataclass(frozen=True)
class _ChunkTally:
    """What the sweep of a chunk of tasks of one group (same structure, rows and trainable
    gates) allocates, as ``_sweep_chunk`` runs it: the final states that were not kept,
    simulated as one batch (or, beside kept ones, each on its own) and, for several
    tasks, all copied into one batch; R bras per vector; a scratch batch for the bras of a
    broadcast tape of Pauli expvals, or one cotangent term at a time; the reductions held
    until the sweep ends: at most 4**k complex128 per bra and trainable gate (k the
    fusion width), or one per word of a run of commuting rotations."""

    backend: Backend
    num_qubits: int
    rows: int
    reduction_entries: int
    tasks: int = 0
    vectors: int = 0
    missing: int = 0
    build_scratch: int = 0

    @classmethod
    def empty(cls, backend: Backend, task: _Task, fusion_qubits: int) -> _ChunkTally:
        circuit = task.circuit
        width = min(max(fusion_qubits, 1), circuit.register.num_qubits)
        entries = len(circuit.columns) * 4**width + len(circuit.steps)
        return cls(backend, circuit.register.num_qubits, len(task.rows[0]), entries)

    @classmethod
    def of(cls, backend: Backend, tasks: Sequence[_Task], fusion_qubits: int) -> _ChunkTally:
        empty = cls.empty(backend, tasks[0], fusion_qubits)
        return batching.tally_of(empty, tasks)

    def add(self, task: _Task) -> _ChunkTally:
        size = len(task.rows)
        if self.rows == 1 and size > 1 and _pauli_expvals_only(task):
            build = size + self.backend.scratch_vectors(size, size, False)
        else:
            build = bra_build_scratch(self.backend)
        return dataclasses.replace(
            self,
            tasks=self.tasks + 1,
            vectors=self.vectors + size,
            missing=self.missing + (size if task.state is None else 0),
            build_scratch=max(self.build_scratch, build),
        )

    def resized(self, vectors: int, rows: int) -> _ChunkTally:
        """The same tasks with ``vectors`` state vectors (a smaller broadcast) and ``rows``
        bras each, for the alternatives of an error message."""
        return dataclasses.replace(
            self, vectors=vectors, rows=rows, missing=min(self.missing, vectors)
        )

    def memory(self) -> SweepMemory:
        if self.missing == self.vectors:
            states = self.vectors  # simulated as one batch
        elif self.tasks == 1:
            states = 0  # the kept state itself
        else:
            states = self.missing + self.vectors  # the missing ones, then all in one batch
        bras = self.vectors * self.rows
        return SweepMemory(
            states=states,
            bras=bras,
            build_scratch=self.build_scratch,
            step_scratch=max(
                self.backend.scratch_vectors(self.vectors, bras, True),
                self.backend.scratch_vectors(1, self.rows, False),
            ),
            reduction_bytes=16 * bras * self.reduction_entries,
        )

    def bytes(self) -> int:
        return self.memory().bytes(self.backend, self.num_qubits)


def _require_chunk_memory(backend: Backend, tasks: list[_Task], fusion_qubits: int) -> None:
    """Refuse, before allocating, a chunk's sweep that does not fit (``batching`` leaves
    only a lone task that large), naming what would fit: a VJP instead of a Jacobian; for
    a broadcast tape swept whole, the eager mode (entry by entry) or a smaller broadcast;
    single precision."""
    tally = _ChunkTally.of(backend, tasks, fusion_qubits)
    if tally.bytes() <= simulate.UNCHECKED_BYTES:
        return
    n, rows, batch = tally.num_qubits, tally.rows, tally.vectors

    def alternatives(available: int) -> list[simulate.Alternative]:
        found = []
        if rows > 1:
            found.append(
                simulate.Alternative(
                    "device_vjp=True",
                    "a VJP sweeps one bra per state vector instead of one per output",
                    tally.resized(batch, 1).bytes(),
                )
            )
        if batch > 1:
            eager = eager_sweep_memory(backend, False, rows).bytes(backend, n)
            found.append(
                simulate.Alternative(
                    'grad_accumulation="eager"', "it sweeps a broadcast entry by entry", eager
                )
            )
            fitting = [b for b in range(1, batch) if tally.resized(b, rows).bytes() <= available]
            if fitting:
                found.append(
                    simulate.Alternative(
                        f"a broadcast of at most {max(fitting):,} entries",
                        "the bras scale with the entries",
                        tally.resized(max(fitting), rows).bytes(),
                    )
                )
        return found

    require_sweep_memory(
        backend,
        n,
        tally.memory(),
        f"the deferred adjoint sweep of {batch:,} state vector{'s' if batch != 1 else ''} "
        f"with {rows:,} bra{'s' if rows != 1 else ''} each",
        alternatives,
    )


def _sweep_chunk(backend: Backend, tasks: list[_Task], fusion_qubits: int) -> np.ndarray:
    """The gradients (B, R, P) of the tasks' rows, the tasks' vectors in one batch (whose
    memory ``_require_chunk_memory`` checked)."""
    compilation = _merge_for_sweep(tasks)
    register = compilation.register
    if all(task.state is None for task in tasks):
        phi, _ = simulate.final_state(backend, flatten(compilation))
    else:
        states = [
            task.circuit.final_state(backend) if task.state is None else task.state
            for task in tasks
        ]
        phi = states[0] if len(states) == 1 else backend.concatenate(states)
        del states  # the states simulated here go once copied (kept ones stay with tasks)
    rows = len(tasks[0].rows[0])
    bras = backend.zero_state(register.num_qubits, register.batch_size * rows)
    backend.scale(bras, np.zeros(1))
    vector = 0
    for task in tasks:
        size = len(task.rows)
        if rows == 1 and size > 1 and _pauli_expvals_only(task):
            _add_batched_expval_terms(
                backend,
                backend.vectors(bras, vector, vector + size),
                backend.vectors(phi, vector, vector + size),
                register,
                task,
            )
            vector += size
            continue
        for vector_rows in task.rows:
            add_cotangent_terms(
                backend,
                backend.vectors(bras, vector * rows, (vector + 1) * rows),
                backend.vectors(phi, vector, vector + 1),
                register,
                task.circuit.tape.measurements,
                vector_rows,
                task.circuit.compilation.memo,
            )
            vector += 1
    circuit = tasks[0].circuit
    # the forward pass's plan, of the first task's compilation: it fits a chunk of that
    # task alone (``merge`` of one compilation is that compilation), else it is planned anew
    return sweep(
        backend,
        compilation,
        circuit.columns,
        circuit.n_columns,
        fusion_qubits,
        phi,
        bras,
        plan=tasks[0].plan,
    )


def _pauli_expvals_only(task: _Task) -> bool:
    return all(
        isinstance(mp, ExpectationMP) and mp.obs.pauli_rep is not None
        for mp in task.circuit.tape.measurements
    )


def _add_batched_expval_terms(backend: Backend, bras, psi, register: Register, task: _Task) -> None:
    """The VJP bras of a broadcast tape of Pauli expvals, bra_b = sum_m 2 dy_m[b] O_m psi_b,
    with a few calls over the whole batch instead of a few per vector: O_m psi into a
    scratch batch, then added with per-vector weights."""
    scratch = None
    for m, mp in enumerate(task.circuit.tape.measurements):
        weights = np.array([0.0 if is_zero(row[0][m]) else float(row[0][m]) for row in task.rows])
        if not weights.any():
            continue
        if scratch is None:
            scratch = backend.zero_state(register.num_qubits, len(task.rows))
        backend.scale(scratch, np.zeros(1))
        measure.add_pauli_sentence(backend, scratch, psi, register, mp.obs.pauli_rep)
        backend.add_scaled(bras, scratch, 2.0 * weights)
