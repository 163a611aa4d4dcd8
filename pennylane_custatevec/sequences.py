"""Small circuits in one backend call: a compilation as a ``GateSequence``.

On a few qubits a gate's kernel takes less time than the host spends calling it: W4 (4
qubits, 7 gates) spent most of its forward pass and its adjoint sweep between kernels.
A backend that says so (``Backend.sequence_amplitudes``) runs a whole compilation as one
gate sequence instead: the forward pass in one ``run_sequence`` call, the deferred
adjoint sweep in one ``sweep_sequence`` call.

What a sequence holds is fixed by the circuit's structure (``structures.Structure``):
its gates (each instruction a dense matrix on its bits, or a Pauli rotation) and, for the
sweep, a ``DerivativeEntry`` after every trainable step. What a call changes is read from
the call's compilation: the angle of every rotation whose step reads a parameter
(``angles``) and the matrix of every other instruction that does (``matrices``). So the
plan is built once per structure and kept in the compilation's memo; a compilation without
a memo (a tape seen once) runs gate by gate.

A compilation runs as a sequence where every instruction is a gate (no mid-circuit
measurement, postselection or condition), every dense one acts on at most 6 bits, every
per-call matrix is one for the whole batch (a broadcast reaches the sequence through its
rotations' angles only), and each vector has at most ``Backend.sequence_amplitudes``
amplitudes (a batch of vectors runs vector by vector, in each vector's cache). Anything
else takes the per-gate path, which gives the same numbers to round-off (not bit for
bit: a run of one-bit gates is multiplied first here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from .backends.base import Backend
from .backends.gate_sequence import (
    DenseEntry,
    DerivativeEntry,
    GateSequence,
    RotationEntry,
    SequenceEntry,
)
from .backends.primitives import StateBatch
from .instructions import Instruction, Kind, instruction_matrix
from .program import Compilation, Step

MAX_DENSE_BITS = 6
"""The widest dense gate a sequence holds (the CPU kernels' scratch: 64 amplitudes)."""

_DENSE_KINDS = frozenset({Kind.MATRIX, Kind.DIAGONAL, Kind.PAULI, Kind.PHASE})

Derivative = DenseEntry | RotationEntry
"""A trainable step's generator as a sequence takes it (``DerivativeEntry.generator``)."""


@dataclasses.dataclass(frozen=True)
class SequencePlan:
    """A compilation's gate sequence, prepared by its backend, and where each call's
    data come from: per angle slot and per matrix slot, (step index, instruction index)
    in the compilation."""

    prepared: object
    angle_sources: tuple[tuple[int, int], ...]
    matrix_sources: tuple[tuple[int, int], ...]
    broadcast_angles: bool
    """Whether some rotation's angles differ per vector (then ``angles`` has B rows)."""

    def angles(self, compilation: Compilation) -> np.ndarray:
        """(1 or B, slots) float64: each rotation's angle per vector."""
        rows = compilation.register.batch_size if self.broadcast_angles else 1
        angles = np.empty((rows, len(self.angle_sources)))
        steps = compilation.steps
        for slot, (step, index) in enumerate(self.angle_sources):
            angles[:, slot] = steps[step].instructions[index].data
        return angles

    def matrices(self, compilation: Compilation) -> list[np.ndarray]:
        """The matrix of every instruction whose data the call gives."""
        steps = compilation.steps
        return [
            instruction_matrix(steps[step].instructions[index])[0][0]
            for step, index in self.matrix_sources
        ]


def forward_plan(backend: Backend, compilation: Compilation) -> SequencePlan | None:
    """The plan of the compilation's forward pass, or None where it runs gate by gate."""
    return _plan(backend, compilation, ("sequences", "forward"), {})


def sweep_plan(
    backend: Backend,
    compilation: Compilation,
    columns: Mapping[int, int],
    generator: Callable[[Step], Derivative | None],
) -> SequencePlan | None:
    """The plan of the compilation's adjoint sweep: ``columns`` {step index: gradient
    column} of the trainable steps, ``generator(step)`` each one's generator (None: the
    sweep cannot take it, then the plan is None and the sweep goes gate by gate)."""
    if not _fits(backend, compilation):  # before building generators: on every call
        return None
    key = ("sequences", "sweep", tuple(sorted(columns.items())))
    derivatives: dict[int, DerivativeEntry] = {}
    if key not in compilation.memo:
        for index, column in columns.items():
            entry = generator(compilation.steps[index])
            if entry is None or not compilation.steps[index].instructions:
                _remember(compilation, key, None)
                return None
            derivatives[index] = DerivativeEntry(column, entry)
    return _plan(backend, compilation, key, derivatives)


def run(backend: Backend, state: StateBatch, plan: SequencePlan, compilation: Compilation) -> None:
    """The compilation's gates on ``state`` in one backend call."""
    backend.run_sequence(state, plan.prepared, plan.angles(compilation), plan.matrices(compilation))


def sweep(
    backend: Backend,
    phi: StateBatch,
    bras: StateBatch,
    plan: SequencePlan,
    compilation: Compilation,
    n_columns: int,
) -> np.ndarray:
    """d/dtheta Re <bra|psi> for every bra and column, (B, R, n_columns), in one call (as
    ``fused_sweep.sweep``; ``phi`` and ``bras`` consumed)."""
    return backend.sweep_sequence(
        phi,
        bras,
        plan.prepared,
        plan.angles(compilation),
        plan.matrices(compilation),
        n_columns,
    )


def _plan(
    backend: Backend, compilation: Compilation, key: tuple, derivatives: dict
) -> SequencePlan | None:
    memo = compilation.memo
    if not _fits(backend, compilation):
        return None
    if key not in memo:
        _remember(compilation, key, _build(backend, compilation, derivatives))
    return memo[key]


def _fits(backend: Backend, compilation: Compilation) -> bool:
    """Whether the compilation may run as a sequence: it has a memo (a known structure)
    and each of its vectors has at most ``backend.sequence_amplitudes`` amplitudes."""
    register = compilation.register
    return (
        compilation.memo is not None
        and backend.sequence_amplitudes > 0
        and 1 << register.num_qubits <= backend.sequence_amplitudes
    )


def _remember(compilation: Compilation, key: tuple, plan: SequencePlan | None) -> None:
    if compilation.memo is not None:
        compilation.memo[key] = plan


def _build(
    backend: Backend, compilation: Compilation, derivatives: Mapping[int, DerivativeEntry]
) -> SequencePlan | None:
    """The plan, from the compilation's steps (any of its structure's compilations: what
    differs between them is read per call), or None where a step does not fit a sequence."""
    entries: list[SequenceEntry] = []
    angle_sources: list[tuple[int, int]] = []
    matrix_sources: list[tuple[int, int]] = []
    broadcast = False
    for s, step in enumerate(compilation.steps):
        # a step reads a parameter (its data change per call) unless its operation has
        # none or it is a template's fixed gate (as ``structures.Structure`` decides)
        varies = step.origin.parameter is not None and bool(step.operation.data)
        for i, instruction in enumerate(step.instructions):
            if instruction.condition is not None:
                return None
            if instruction.kind is Kind.PAULI_ROTATION:
                rows = instruction.data.shape[0]
                if rows not in (1, compilation.register.batch_size):
                    return None
                broadcast = broadcast or rows > 1
                entries.append(_rotation(instruction, len(angle_sources)))
                angle_sources.append((s, i))
                continue
            if instruction.kind not in _DENSE_KINDS:
                return None
            entry = _dense(instruction, len(matrix_sources) if varies else None)
            if entry is None:
                return None
            if varies:
                matrix_sources.append((s, i))
            entries.append(entry)
        if s in derivatives:
            entries.append(derivatives[s])
    if any(
        isinstance(d.generator, DenseEntry) and len(d.generator.bits) > MAX_DENSE_BITS
        for d in derivatives.values()
    ):
        return None
    sequence = GateSequence(
        compilation.register.num_qubits, tuple(entries), len(angle_sources), len(matrix_sources)
    )
    return SequencePlan(
        backend.prepare_sequence(sequence),
        tuple(angle_sources),
        tuple(matrix_sources),
        broadcast,
    )


def _rotation(instruction: Instruction, slot: int) -> RotationEntry:
    return RotationEntry(
        instruction.paulis,
        tuple(instruction.targets),
        tuple(instruction.controls),
        tuple(instruction.control_values),
        slot,
    )


def _dense(instruction: Instruction, slot: int | None) -> DenseEntry | None:
    """A dense gate: its matrix (None where the call gives it, at ``slot``), or None where
    it does not fit (too wide, or one matrix per vector)."""
    bits = (*instruction.targets, *instruction.controls)
    if len(bits) > MAX_DENSE_BITS:
        return None
    matrix, _ = instruction_matrix(instruction)
    if matrix.shape[0] != 1:
        return None
    if slot is not None:
        return DenseEntry(bits, None, slot)
    return DenseEntry(bits, np.ascontiguousarray(matrix[0], dtype=np.complex128))
