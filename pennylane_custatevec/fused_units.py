"""The units of a fusion plan realized: each with the instructions that run it forward
(``Fused``: a block as one dense matrix, its operations' matrices for the sweep, runs of
rotations and bit flips as one instruction each, tiled runs), and a compilation's plan kept
with what it was planned for (``FusedPlan``), which the adjoint sweep walks back. The plan
itself is ``fusion``'s."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np

from .backends.primitives import FusionTraits
from .fusion import (
    GREEDY,
    BitPermutationRun,
    Block,
    OneQubitRotations,
    Single,
    TiledRun,
    Unit,
    ZRun,
    plan_units,
)
from .instructions import Instruction, Kind, instruction_matrix
from .pauli import pauli_word_matrix
from .program import Compilation, Program, Step


@dataclasses.dataclass(frozen=True)
class Fused:
    """A unit with the instructions that run it forward: a block of several operations
    as one MATRIX instruction, anything else as its operations' own instructions.
    ``member_matrices``: each operation's matrix on the block's bits (blocks only).
    ``parts``: a tiled run's blocks, each as ``realize`` makes a block of its own (their
    member matrices give the sweep each block's gradients)."""

    unit: Unit
    instructions: list[Instruction]
    member_matrices: list[np.ndarray] | None = None
    parts: tuple[Fused, ...] = ()


def fuse(compilation: Compilation, max_qubits: int, traits: FusionTraits = GREEDY) -> list[Fused]:
    """The units of the compilation's steps (``plan_units``) with their instructions
    (``realize``). Stateless: a plan that the forward pass made travels to the sweep in
    its ``FusedPlan`` (``fused_plan``)."""
    return realize(compilation, plan_units(compilation, max_qubits, traits))


def realize(compilation: Compilation, units: Sequence[Unit]) -> list[Fused]:
    """Each unit with the instructions that run it forward, from the compilation's data. A
    block of one operation runs as that operation's own instructions (a CNOT stays a
    permutation); its matrix is built only if asked for."""
    steps = compilation.steps
    rotation_blocks = _rotation_blocks(steps, units)
    fused = []
    for index, unit in enumerate(units):
        if index in rotation_blocks:
            fused.append(rotation_blocks[index])
            continue
        if isinstance(unit, ZRun):
            fused.append(Fused(unit, [_z_rotations(steps, unit)]))
            continue
        if isinstance(unit, BitPermutationRun):
            fused.append(Fused(unit, [_bit_permutation(compilation, unit)]))
            continue
        if isinstance(unit, OneQubitRotations):
            fused.append(Fused(unit, [_one_qubit_rotations(steps, unit)]))
            continue
        if isinstance(unit, TiledRun):
            fused.append(_tiled_run(compilation, unit))
            continue
        if isinstance(unit, Single) or len(unit.members) == 1:
            member = unit.member if isinstance(unit, Single) else unit.members[0]
            fused.append(Fused(unit, list(steps[member].instructions)))
            continue
        matrices = [step_matrix(steps[m].instructions, unit.targets) for m in unit.members]
        matrix = matrices[0]
        for step in matrices[1:]:
            matrix = np.matmul(step, matrix)
        instruction = Instruction(Kind.MATRIX, targets=unit.targets, data=matrix)
        fused.append(Fused(unit, [instruction], matrices))
    return fused


def _rotation_blocks(steps: Sequence[Step], units: Sequence[Unit]) -> dict[int, Fused]:
    """{unit index: its realization} for the blocks on one bit of several operations that
    are one-letter Pauli rotations there (the RZ RY RZ of a StronglyEntanglingLayers
    wire, RX then RY, gathered rotations): every rotation's 2x2 matrix, each operation's product
    and each block's product built for all such blocks at once, per shape (the number of
    rotations of each operation, and 1 or B angle rows), instead of a few small array
    operations per rotation (at 14 qubits those took more host time than the blocks'
    passes); each rotation is ``exp(-i t/2 P)`` as ``instructions.DENSE_MATRIX`` gives it."""
    groups: dict[tuple, list[tuple[int, list[Instruction]]]] = {}
    for index, unit in enumerate(units):
        if type(unit) is not Block or len(unit.members) < 2 or len(unit.targets) != 1:
            continue
        shape, rotations = [], []
        for member in unit.members:
            instructions = steps[member].instructions
            if not instructions or not all(_is_rotation_on(i, unit.targets) for i in instructions):
                break
            shape.append(len(instructions))
            rotations.extend(instructions)
        else:
            rows = max(rotation.data.shape[0] for rotation in rotations)
            groups.setdefault((tuple(shape), rows), []).append((index, rotations))
    realized = {}
    for (shape, rows), blocks in groups.items():
        matrices = _rotation_matrices(blocks, rows)  # (rotations, blocks, rows, 2, 2)
        members, start = [], 0
        for count in shape:  # each operation: the product of its rotations, in order
            product = matrices[start]
            for position in range(start + 1, start + count):
                product = np.matmul(matrices[position], product)
            members.append(product)
            start += count
        block = members[0]
        for member in members[1:]:
            block = np.matmul(member, block)
        for k, (index, _) in enumerate(blocks):
            unit = units[index]
            instruction = Instruction(Kind.MATRIX, targets=unit.targets, data=block[k])
            realized[index] = Fused(unit, [instruction], [member[k] for member in members])
    return realized


def _is_rotation_on(instruction: Instruction, targets: tuple[int, ...]) -> bool:
    """Whether ``instruction`` is a one-letter Pauli rotation on the bit ``targets``, with
    real angles and neither controls nor condition."""
    return (
        instruction.kind is Kind.PAULI_ROTATION
        and instruction.targets == targets
        and not instruction.controls
        and instruction.condition is None
        and instruction.paulis in ("X", "Y", "Z")
        and instruction.data.dtype.kind == "f"
    )


def _rotation_matrices(blocks: list[tuple[int, list[Instruction]]], rows: int) -> np.ndarray:
    """(rotations, blocks, rows, 2, 2) complex128: the matrix cos(t/2) I - i sin(t/2) P of
    each block's rotations (``_rotation_blocks``), their angles repeated over ``rows``
    where they have one row."""
    count = len(blocks[0][1])
    half = np.empty((count, len(blocks), rows))
    words = np.empty((count, len(blocks), 1, 2, 2), dtype=np.complex128)
    for k, (_, rotations) in enumerate(blocks):
        for position, rotation in enumerate(rotations):
            half[position, k] = 0.5 * rotation.data
            words[position, k] = pauli_word_matrix(rotation.paulis)
    half = half[..., None, None]
    return np.cos(half) * np.eye(2) - 1j * np.sin(half) * words


def _tiled_run(compilation: Compilation, unit: TiledRun) -> Fused:
    """The run as one TILED_MATRICES instruction, with its blocks realized one by one as
    its ``parts``: gate j is block j's 2x2 matrix (the product of its operations')."""
    parts = tuple(realize(compilation, unit.blocks))
    matrices = [block_matrices(compilation.steps, part)[0] for part in parts]
    batch = max(matrix.shape[0] for matrix in matrices)
    data = np.stack([np.broadcast_to(matrix, (batch, 2, 2)) for matrix in matrices], axis=1)
    targets = tuple(block.targets[0] for block in unit.blocks)
    instruction = Instruction(Kind.TILED_MATRICES, targets=targets, data=data)
    return Fused(unit, [instruction], parts=parts)


def block_matrices(steps: Sequence[Step], fused: Fused) -> tuple[np.ndarray, list[np.ndarray]]:
    """(the block's matrix, each of its operations' matrices on its bits) of a realized
    Block: a block of several operations has both already, one of a single operation runs
    as its own instructions, whose matrix is built here."""
    if fused.member_matrices:
        return fused.instructions[0].data, fused.member_matrices
    (member,) = fused.unit.members
    matrix = step_matrix(steps[member].instructions, fused.unit.targets)
    return matrix, [matrix]


Flip = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
"""A bit flip as exact data: (targets, controls, control values)."""


def _flip_index(index: int, flips: Sequence[Flip]) -> int:
    """``index`` after the bit flips ``flips`` (in order): each flips its targets where
    its control bits equal their values."""
    for targets, controls, values in flips:
        if all((index >> bit) & 1 == value for bit, value in zip(controls, values, strict=True)):
            for target in targets:
                index ^= 1 << target
    return index


def _affine_columns(n_bits: int, image) -> list[int]:
    """The columns of an affine map of ``n_bits``-bit indices: image(e_j) ^ image(0) for
    each bit j, then image(0)."""
    constant = image(0)
    return [image(1 << j) ^ constant for j in range(n_bits)] + [constant]


def _bit_permutation(compilation: Compilation, unit: BitPermutationRun) -> Instruction:
    """The run as a BIT_PERMUTATION: the gates map index x to dest(x) (applied in order);
    amplitude y comes from src(y) = dest^-1(y) (the gates, each its own inverse, in reverse
    order). Row 0 of the data is src's columns, row 1 dest's (the inverse's sources)."""
    flips = tuple(
        (ins.targets, ins.controls, ins.control_values)
        for m in unit.members
        for ins in compilation.steps[m].instructions
    )
    data = _permutation_maps(flips, compilation.register.num_qubits)
    return Instruction(Kind.BIT_PERMUTATION, targets=unit.moved, data=data)


@functools.lru_cache(maxsize=256)
def _permutation_maps(flips: tuple[Flip, ...], n_bits: int) -> np.ndarray:
    """The (1, 2, n_bits + 1) data of ``_bit_permutation``, by the flips' exact data (a
    structure's runs are the same at every call; built per call, they cost W2v's step
    2.4 ms). Read-only: instructions share it."""
    sources = _affine_columns(n_bits, lambda y: _flip_index(y, flips[::-1]))
    destinations = _affine_columns(n_bits, lambda x: _flip_index(x, flips))
    data = np.array([[sources, destinations]], dtype=np.int64)
    data.flags.writeable = False
    return data


def _z_rotations(steps: Sequence[Step], run: ZRun) -> Instruction:
    instructions = [steps[m].instructions[0] for m in run.members]
    masks = tuple(sum(1 << t for t in ins.targets) for ins in instructions)
    return Instruction(Kind.Z_ROTATIONS, data=_stacked_angles(instructions), z_masks=masks)


def _one_qubit_rotations(steps: Sequence[Step], unit: OneQubitRotations) -> Instruction:
    instructions = [steps[m].instructions[0] for m in unit.members]
    return Instruction(
        Kind.ONE_QUBIT_ROTATIONS,
        targets=tuple(ins.targets[0] for ins in instructions),
        paulis="".join(ins.paulis for ins in instructions),
        data=_stacked_angles(instructions),
    )


def _stacked_angles(instructions: Sequence[Instruction]) -> np.ndarray:
    """The rotations' angles as (1 or B, J): column j from instruction j."""
    columns = [ins.data for ins in instructions]
    batch = max(column.shape[0] for column in columns)
    if any(column.shape[0] != batch for column in columns):
        columns = [np.broadcast_to(column, (batch,)) for column in columns]
    return np.array(columns).T


@dataclasses.dataclass(frozen=True, eq=False)
class FusedPlan:
    """A compilation's fused units, with what they were planned for: the forward pass
    makes it, and the kept state (``kept.KeptState``) hands it to the adjoint sweep, which
    walks the same units back instead of planning the compilation again."""

    compilation: Compilation
    """The compilation planned (the very object: the plan holds its data)."""
    width: int
    """The largest block planned, ``max_qubits`` of ``fuse``."""
    traits: FusionTraits
    """The backend's traits it was planned with."""
    units: tuple[Fused, ...]
    """The units, in circuit order (``fuse``)."""

    def fits(self, compilation: Compilation, width: int, traits: FusionTraits) -> bool:
        """Whether this is the plan of ``compilation`` (the same object) for ``width`` and
        ``traits``."""
        return self.compilation is compilation and self.width == width and self.traits == traits

    @property
    def program(self) -> Program:
        """The compilation's register with the fused instructions, in order."""
        instructions = tuple(ins for unit in self.units for ins in unit.instructions)
        return Program(self.compilation.register, instructions)


def fused_plan(
    compilation: Compilation,
    max_qubits: int,
    traits: FusionTraits = GREEDY,
    reusable: FusedPlan | None = None,
) -> FusedPlan:
    """The plan of ``compilation`` for blocks of at most ``max_qubits`` bits: ``reusable``
    (a plan made before, such as the forward pass's) where it ``fits``, else a new one."""
    if reusable is not None and reusable.fits(compilation, max_qubits, traits):
        return reusable
    units = tuple(fuse(compilation, max_qubits, traits))
    return FusedPlan(compilation, max_qubits, traits, units)


def fused_program(
    compilation: Compilation, max_qubits: int, traits: FusionTraits = GREEDY
) -> Program:
    """The compilation's register with the fused instructions of its steps, planned with
    ``traits``."""
    return fused_plan(compilation, max_qubits, traits).program


def step_matrix(instructions: Sequence[Instruction], targets: tuple[int, ...]) -> np.ndarray:
    """The matrix of one operation's instructions on the block bits ``targets`` (the
    identity for an operation without instructions)."""
    if len(instructions) == 1:
        return embed(*instruction_matrix(instructions[0]), targets)
    matrix = np.eye(1 << len(targets), dtype=np.complex128)[None]
    for instruction in instructions:
        matrix = np.matmul(embed(*instruction_matrix(instruction), targets), matrix)
    return matrix


def embed(matrix: np.ndarray, bits: tuple[int, ...], targets: tuple[int, ...]) -> np.ndarray:
    """``matrix`` (on ``bits``, bits[j] = bit j of its index) as a matrix on ``targets``."""
    if bits == targets:
        return matrix
    gate_index, same_rest = _embedding(tuple(targets.index(b) for b in bits), len(targets))
    return matrix[:, gate_index[:, None], gate_index[None, :]] * same_rest


@functools.lru_cache(maxsize=1024)
def _embedding(positions: tuple[int, ...], width: int) -> tuple[np.ndarray, np.ndarray]:
    """For each block index a: the gate index of its bits at ``positions``; and whether
    two block indices agree on every other bit."""
    block = np.arange(1 << width)
    gate_index = np.zeros_like(block)
    mask = 0
    for j, position in enumerate(positions):
        gate_index |= ((block >> position) & 1) << j
        mask |= 1 << position
    rest = block & ~mask
    return gate_index, rest[:, None] == rest[None, :]
