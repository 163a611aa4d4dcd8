"""Instruction kinds and their four operations: apply, matrix, inverse, masked.

An ``Instruction`` is one kernel call: a ``Kind`` (which kernel), the bits it acts on and
its data. What can be done with an instruction depends only on its kind, and it is written
here, once per kind, in four dispatch tables keyed by ``Kind``:

- ``APPLY``: run it on every vector of a backend's batch of states;
- ``DENSE_MATRIX``: its matrix on its targets (1 or B, 2**t, 2**t), without its controls
  (``instruction_matrix`` adds them), for fusion and the product-state preparation;
- ``INVERSE``: the instruction that undoes it (the adjoint sweeps walk back with it);
- ``MASKED``: the instruction on the selected vectors of a batch and the identity on the
  others (a conditional operation of the one-shot method, where each vector is a shot).

Why tables rather than per-kind classes: an instruction stays plain data (a frozen
dataclass naming an enum member) that the kernel key compares exactly, and each operation
reads as one short function per kind beside the others of its table. Every table lists
every member of ``Kind``; where an operation does not exist for a kind, its entry is an
``Unsupported`` that says why, and the lookup raises that reason (a ``ValueError``)
instead of a bare ``KeyError``. ``tests/circuits/test_instructions.py`` fails when a member of
``Kind`` is missing from a table. Adding a kind is one member of ``Kind`` and one entry
per table, in this module; the algorithm modules (simulate, fusion, the sweeps) call the
four functions below and never branch on kinds for these operations.

Conventions (see program.py): ``targets[j]`` is bit ``j`` of a matrix index, controls
act where each control bit equals its value, batched data has a leading axis of 1 or B.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping

import numpy as np
import pennylane as qml
from pennylane.operation import Operator

from .backends.base import Backend
from .backends.primitives import StateBatch
from .pauli import pauli_word_matrix


class Kind(enum.Enum):
    """The kernel an instruction runs; see backends/base.py for each one's meaning."""

    MATRIX = "matrix"
    DIAGONAL = "diagonal"
    PAULI = "pauli"
    PAULI_ROTATION = "pauli_rotation"
    Z_ROTATIONS = "z_rotations"
    ONE_QUBIT_ROTATIONS = "one_qubit_rotations"
    BIT_PERMUTATION = "bit_permutation"
    TILED_MATRICES = "tiled_matrices"
    PHASE = "phase"
    MID_MEASURE = "mid_measure"
    POSTSELECT = "postselect"


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One kernel call.

    ``data`` holds, by kind: MATRIX (1 or B, 2**k, 2**k) matrices; DIAGONAL (1 or B, 2**k);
    PAULI_ROTATION (1 or B,) angles of exp(-i angle/2 P); Z_ROTATIONS (1 or B, J) the
    angles of J commuting rotations exp(-i angle_j/2 Z_j), Z_j the word of Z letters on
    the bits of ``z_masks[j]``; ONE_QUBIT_ROTATIONS (1 or B, m) the angles of m one-qubit rotations
    exp(-i angle_j/2 P_j) on the distinct bits ``targets[j]``, P_j the letter
    ``paulis[j]``; BIT_PERMUTATION (1, 2, n + 1) int64: row 0 the source map of an affine
    permutation of the index bits (``Backend.apply_bit_permutation``), row 1 its inverse's,
    ``targets`` the bits it moves; TILED_MATRICES (1 or B, m, 2, 2) the matrices of m
    one-bit gates applied in order, gate j on bit ``targets[j]`` (a tiled run of fusion,
    ``Backend.apply_tiled_matrices``); PHASE (1 or B,) factors;
    POSTSELECT (1, 2**k, 2**k) the projector; PAULI and MID_MEASURE nothing.
    ``condition`` makes the instruction act only on the state vectors (shots) whose
    mid-circuit measurements satisfy it.
    """

    kind: Kind
    targets: tuple[int, ...] = ()
    controls: tuple[int, ...] = ()
    control_values: tuple[int, ...] = ()
    data: np.ndarray | None = None
    paulis: str = ""
    z_masks: tuple[int, ...] = ()
    source: Operator | None = None
    condition: qml.ops.MeasurementValue | None = None

    @property
    def call(self) -> tuple:
        """What the kernel call is but for its data: kind, bits, controls, Pauli letters,
        Z masks (equal for instructions that differ at most in their data)."""
        return (
            self.kind,
            self.targets,
            self.controls,
            self.control_values,
            self.paulis,
            self.z_masks,
        )

    def with_data(self, data: np.ndarray | None) -> Instruction:
        """The same kernel call with other ``data`` (``dataclasses.replace``'s result,
        without its per-field checks: called per instruction per call where a circuit's
        structure is compiled once, see structures.py)."""
        copied = object.__new__(Instruction)
        fields = copied.__dict__
        fields.update(self.__dict__)
        fields["data"] = data
        return copied


@dataclasses.dataclass(frozen=True)
class Unsupported:
    """A table's entry for a kind that does not have the table's operation."""

    reason: str
    """Why, as the end of a sentence that starts with the kind and the operation."""


Apply = Callable[[Backend, StateBatch, Instruction], None]
Matrix = Callable[[Instruction], np.ndarray]
Inverse = Callable[[Instruction], Instruction]
Masked = Callable[[Instruction, np.ndarray], Instruction]

_SAMPLED = Unsupported(
    "samples an outcome per vector: simulate.final_state_per_shot runs it, not as a gate"
)
_RENORMALISED = Unsupported(
    "renormalises the batch and returns the kept probability: simulate.final_state runs it, "
    "not as a gate"
)
_MADE_BY_FUSION = Unsupported(
    "is made by fusion from gates whose matrices fusion has already; it is never fused"
)


# ---------------------------------------------------------------------------------------
# apply


def _gate_bits(instruction: Instruction) -> tuple:
    return instruction.targets, instruction.controls, instruction.control_values


APPLY: dict[Kind, Apply | Unsupported] = {
    Kind.MATRIX: lambda backend, state, ins: backend.apply_matrix(
        state, ins.data, *_gate_bits(ins)
    ),
    Kind.DIAGONAL: lambda backend, state, ins: backend.apply_diagonal(
        state, ins.data, *_gate_bits(ins)
    ),
    Kind.PAULI: lambda backend, state, ins: backend.apply_pauli(
        state, ins.paulis, *_gate_bits(ins)
    ),
    Kind.PAULI_ROTATION: lambda backend, state, ins: backend.apply_pauli_rotation(
        state, ins.data, ins.paulis, *_gate_bits(ins)
    ),
    Kind.Z_ROTATIONS: lambda backend, state, ins: backend.apply_z_rotations(
        state, ins.data, ins.z_masks
    ),
    Kind.ONE_QUBIT_ROTATIONS: lambda backend, state, ins: backend.apply_one_qubit_rotations(
        state, ins.data, ins.paulis, ins.targets
    ),
    Kind.BIT_PERMUTATION: lambda backend, state, ins: backend.apply_bit_permutation(
        state, ins.data[0, 0]
    ),
    Kind.TILED_MATRICES: lambda backend, state, ins: backend.apply_tiled_matrices(
        state, ins.data, ins.targets
    ),
    Kind.PHASE: lambda backend, state, ins: backend.scale(state, ins.data),
    Kind.MID_MEASURE: _SAMPLED,
    Kind.POSTSELECT: _RENORMALISED,
}
"""How each kind runs on a batch: the backend kernel it names."""


# ---------------------------------------------------------------------------------------
# matrix


def _rotation_matrix(instruction: Instruction) -> np.ndarray:
    """exp(-i theta/2 P) = cos(theta/2) I - i sin(theta/2) P, per angle."""
    half = 0.5 * np.asarray(instruction.data, dtype=np.float64)[:, None, None]
    word = pauli_word_matrix(instruction.paulis)
    return np.cos(half) * np.eye(word.shape[0]) - 1j * np.sin(half) * word


def _diagonal_matrix(instruction: Instruction) -> np.ndarray:
    diagonals = np.asarray(instruction.data, dtype=np.complex128)
    return diagonals[:, :, None] * np.eye(diagonals.shape[1])


DENSE_MATRIX: dict[Kind, Matrix | Unsupported] = {
    Kind.MATRIX: lambda ins: np.asarray(ins.data, dtype=np.complex128),
    Kind.DIAGONAL: _diagonal_matrix,
    Kind.PAULI: lambda ins: pauli_word_matrix(ins.paulis)[None],
    Kind.PAULI_ROTATION: _rotation_matrix,
    Kind.Z_ROTATIONS: _MADE_BY_FUSION,
    Kind.ONE_QUBIT_ROTATIONS: _MADE_BY_FUSION,
    Kind.BIT_PERMUTATION: _MADE_BY_FUSION,
    Kind.TILED_MATRICES: _MADE_BY_FUSION,
    Kind.PHASE: lambda ins: np.asarray(ins.data, dtype=np.complex128).reshape(-1, 1, 1),
    Kind.MID_MEASURE: Unsupported("is no linear map of the state"),
    Kind.POSTSELECT: Unsupported("renormalises the state after its projector"),
}
"""Each kind's matrix on its targets (``targets[j]`` = bit j of the index), no controls."""


# ---------------------------------------------------------------------------------------
# inverse


def _with_data(transform: Callable[[np.ndarray], np.ndarray]) -> Inverse:
    return lambda ins: ins.with_data(transform(ins.data))


_NEGATED_ANGLES = _with_data(np.negative)
"""exp(-i theta/2 P)^-1 = exp(+i theta/2 P), per rotation."""


def _reversed_gates(instruction: Instruction) -> Instruction:
    """A run of one-bit gates undone: their inverses M_j^dagger in reverse order."""
    inverses = np.conj(np.swapaxes(instruction.data[:, ::-1], -1, -2))
    return dataclasses.replace(instruction, targets=instruction.targets[::-1], data=inverses)


INVERSE: dict[Kind, Inverse | Unsupported] = {
    Kind.MATRIX: _with_data(lambda data: np.conj(np.swapaxes(data, -1, -2))),
    Kind.DIAGONAL: _with_data(np.conj),
    Kind.PAULI: lambda ins: ins,  # a Pauli word is its own inverse
    Kind.PAULI_ROTATION: _NEGATED_ANGLES,
    Kind.Z_ROTATIONS: _NEGATED_ANGLES,
    Kind.ONE_QUBIT_ROTATIONS: _NEGATED_ANGLES,
    Kind.BIT_PERMUTATION: _with_data(lambda data: data[:, ::-1].copy()),  # the maps swap
    Kind.TILED_MATRICES: _reversed_gates,
    Kind.PHASE: _with_data(np.conj),
    Kind.MID_MEASURE: Unsupported("cannot be undone (the adjoint method refuses it)"),
    Kind.POSTSELECT: Unsupported("cannot be undone (the adjoint method refuses it)"),
}
"""The instruction that undoes each kind (all gates are unitary)."""


# ---------------------------------------------------------------------------------------
# masked


def _masked_data(identity: Callable[[np.ndarray], np.ndarray | float]) -> Masked:
    """Per-vector data: the instruction's where selected, ``identity(data)`` (the data of
    the identity) elsewhere; the condition is resolved."""

    def masked(instruction: Instruction, selected: np.ndarray) -> Instruction:
        data = instruction.data
        mask = selected.reshape((-1,) + (1,) * (data.ndim - 1))
        return dataclasses.replace(
            instruction, data=np.where(mask, data, identity(data)), condition=None
        )

    return masked


_MASKED_MATRIX = _masked_data(lambda data: np.eye(data.shape[-1]))
_ZERO_ANGLES = _masked_data(lambda data: 0.0)


def _masked_pauli(instruction: Instruction, selected: np.ndarray) -> Instruction:
    """The kernel of a Pauli word takes no per-vector data: its matrix, masked, does."""
    matrix = dataclasses.replace(
        instruction, kind=Kind.MATRIX, data=pauli_word_matrix(instruction.paulis)[None]
    )
    return _MASKED_MATRIX(matrix, selected)


MASKED: dict[Kind, Masked | Unsupported] = {
    Kind.MATRIX: _MASKED_MATRIX,
    Kind.DIAGONAL: _masked_data(lambda data: np.ones(data.shape[-1])),
    Kind.PAULI: _masked_pauli,
    Kind.PAULI_ROTATION: _ZERO_ANGLES,
    Kind.Z_ROTATIONS: _ZERO_ANGLES,
    Kind.ONE_QUBIT_ROTATIONS: _ZERO_ANGLES,
    Kind.BIT_PERMUTATION: Unsupported(
        "is made by fusion from unconditioned gates only; it is never conditioned"
    ),
    Kind.TILED_MATRICES: Unsupported(
        "is made by fusion from unconditioned gates only; it is never conditioned"
    ),
    Kind.PHASE: _masked_data(lambda data: 1.0),
    Kind.MID_MEASURE: Unsupported(
        "cannot be conditioned: PennyLane conditions operations, not measurements"
    ),
    Kind.POSTSELECT: Unsupported(
        "renormalises the whole batch: it runs in the deferred-measurement method only, "
        "where nothing is conditioned per vector"
    ),
}
"""Each kind on selected vectors only, the identity on the others."""


TABLES: Mapping[str, dict] = {
    "apply": APPLY,
    "matrix": DENSE_MATRIX,
    "inverse": INVERSE,
    "masked": MASKED,
}
"""Every table, by the name of its operation (for the error messages and the tests)."""


def _entry(operation: str, kind: Kind):
    entry = TABLES[operation][kind]
    if isinstance(entry, Unsupported):
        raise ValueError(f"{kind} has no {operation}: it {entry.reason}")
    return entry


def has_matrix(kind: Kind) -> bool:
    """Whether instructions of ``kind`` have a dense matrix (so fusion may fuse them)."""
    return not isinstance(DENSE_MATRIX[kind], Unsupported)


def apply_instruction(backend: Backend, state: StateBatch, instruction: Instruction) -> None:
    """Run one gate instruction on every vector of the batch."""
    _entry("apply", instruction.kind)(backend, state, instruction)


def instruction_matrix(instruction: Instruction) -> tuple[np.ndarray, tuple[int, ...]]:
    """(matrix (1 or B, 2**m, 2**m), its bits): a gate instruction as a dense matrix on its
    targets followed by its controls (the controls are the high bits of the index)."""
    matrix = _entry("matrix", instruction.kind)(instruction)
    return _controlled(matrix, instruction.control_values), (
        *instruction.targets,
        *instruction.controls,
    )


def _controlled(matrix: np.ndarray, control_values: tuple[int, ...]) -> np.ndarray:
    """``matrix`` acting where the controls (high index bits) equal their values."""
    if not control_values:
        return matrix
    d = matrix.shape[-1]
    selected = sum(int(v) << j for j, v in enumerate(control_values))
    size = d << len(control_values)
    full = np.tile(np.eye(size, dtype=np.complex128), (matrix.shape[0], 1, 1))
    rows = slice(selected * d, (selected + 1) * d)
    full[:, rows, rows] = matrix
    return full


def inverse(instruction: Instruction) -> Instruction:
    """The instruction that undoes ``instruction``."""
    return _entry("inverse", instruction.kind)(instruction)


def masked(instruction: Instruction, selected: np.ndarray) -> Instruction:
    """The instruction on the vectors of a batch where ``selected`` (bool, one per vector)
    holds, the identity on the others; without a condition."""
    return _entry("masked", instruction.kind)(instruction, selected)
