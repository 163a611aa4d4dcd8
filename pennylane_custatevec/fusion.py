"""Gate fusion: a pure transformation of a compiled circuit, kept apart from the kernels.

Consecutive operations whose state bits together number at most ``k`` become one *block*,
applied as a single dense ``2**k x 2**k`` matrix: one pass over the state instead of one
per gate. An operation on more than ``k`` bits stays a *single*: its own kernel
instructions. The plan depends only on which bits each operation touches, so circuits that
share a structure share a plan (it is cached by the bits).

Greedy, in circuit order (as qsim's basic fuser): an operation may join a block that comes
no earlier than the last unit touching any of its bits (every unit after that one acts on
other bits, so the operation commutes past them); of those, the last unit touching its bits
is preferred, else the block whose bits grow least. Otherwise it opens a new block. With
``k <= 1`` nothing is merged: each operation on at most one bit is a block of its own.

Everything the planner takes from a backend is its ``FusionTraits`` (backends/base.py).
They may give ``block_costs``: the time of a dense block of w bits relative to one
native gate, per w. Then an operation joins a block only where that saves time
(cost(block) + 1 > cost(block with it)), and the candidate that saves most wins. On a GPU
a block costs one pass over memory whatever its width up to 5 or so (no costs: greedy); on
a CPU a dense 2**k x 2**k product is compute-bound beyond one bit, so wide blocks pay only
when they absorb many gates.

Two kinds of unit apply several rotations in one pass without a dense matrix: a ZRun
gathers commuting Z-word rotations (QAOA cost layers), and OneQubitRotations pairs adjacent
one-qubit rotations on distinct bits that would each be a block of their own (QAOA mixers),
as many as the traits' ``rotations_per_pass``. A BitPermutationRun applies adjacent bit
flips (the CNOT ring of an entangling layer) as one permutation of the amplitudes, where
the traits' ``permutation_bits`` allow it. A TiledRun applies adjacent blocks of one bit each,
on bits below the traits' ``tile_bits``, as one TILED_MATRICES instruction, tile by tile
(each tile in cache while it takes every gate of the run), on registers of at least
``min_tiled_qubits`` qubits: one pass over the state for the run instead of one per block.

Matrices follow the backends' conventions: a block's ``targets`` are its bits in ascending
order and ``targets[j]`` is bit ``j`` of the block's matrix index; batched data has a
leading axis of length 1 or B.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np

from .backends.primitives import FusionTraits
from .instructions import Instruction, Kind, has_matrix, instruction_matrix
from .pauli import pauli_word_matrix
from .program import Compilation, Program, Register, Step, plain_rotation, wire_labels


@dataclasses.dataclass(frozen=True)
class Block:
    """Operations (indices into the steps, in circuit order) applied as one matrix."""

    targets: tuple[int, ...]
    members: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Single:
    """One operation run as its own instructions."""

    member: int


@dataclasses.dataclass(frozen=True)
class ZRun:
    """Commuting rotations exp(-i theta/2 Z_word) (a QAOA cost layer), any width, applied
    as one Z_ROTATIONS instruction: one pass however many words."""

    members: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class OneQubitRotations:
    """Adjacent one-qubit rotations exp(-i theta/2 P) on distinct bits (a QAOA mixer
    layer) that would each be a block of their own, applied as one ONE_QUBIT_ROTATIONS instruction:
    one pass for up to the traits' ``rotations_per_pass`` of them."""

    members: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class BitPermutationRun:
    """Adjacent bit flips (CNOTs, X gates: X words with at most one control) that would
    each be a unit of their own, applied as one BIT_PERMUTATION instruction: the run is an
    affine map of the index bits over GF(2), one pass however many gates. ``moved``: the
    bits it flips (at most the traits' ``permutation_bits``)."""

    members: tuple[int, ...]
    moved: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class TiledRun:
    """Adjacent blocks of one bit each, on low bits (a layer of Rot or RX gates on the
    wires whose bits lie below the traits' ``tile_bits``), applied as one TILED_MATRICES
    instruction: tile by tile, so that the run costs one pass over the state."""

    blocks: tuple[Block, ...]

    @property
    def members(self) -> tuple[int, ...]:
        """Every operation of the run, in circuit order."""
        return tuple(member for block in self.blocks for member in block.members)


Unit = Block | Single | ZRun | OneQubitRotations | BitPermutationRun | TiledRun


def step_bits(
    register: Register, op, instructions: Sequence[Instruction]
) -> tuple[int, ...] | None:
    """The state bits an operation touches: its instructions' targets and controls, and its
    wires (so that its generator fits in its block), ascending; or None if one of its
    instructions cannot be fused: a kind without a matrix (``instructions.has_matrix``:
    mid-circuit measurements, postselection) or a condition."""
    bits: set[int] = set()
    for instruction in instructions:
        if not has_matrix(instruction.kind) or instruction.condition is not None:
            return None
        bits.update(instruction.targets)
        bits.update(instruction.controls)
    wires = wire_labels(op)
    if len(bits) != len(wires):  # instructions act within the wires: then they cover them
        bits.update(register.bits(wires))
    return tuple(sorted(bits))


GREEDY = FusionTraits()
"""The traits of a backend with the base class's defaults: greedy dense blocks, no rotations
gathered (the planner's default where no backend is in play)."""


def plan(
    bits_per_step: Sequence[tuple[int, ...] | None],
    max_qubits: int,
    traits: FusionTraits = GREEDY,
    z_rotations: Sequence[bool] | None = None,
    one_qubit_rotations: Sequence[bool] | None = None,
    flipped_bits: Sequence[tuple[int, ...] | None] | None = None,
    num_qubits: int = 0,
) -> tuple[Unit, ...]:
    """The units of a circuit whose operations touch ``bits_per_step`` (module docstring),
    priced by ``traits.block_costs``. ``z_rotations`` flags the operations that are
    rotations exp(-i theta/2 Z_word): with fusion on, those on two bits or more gather
    into ZRuns (a rotation joins the last run that comes no earlier than the last unit
    touching its bits). ``one_qubit_rotations`` flags the one-qubit rotations
    exp(-i theta/2 P): with fusion on, up to ``traits.rotations_per_pass`` adjacent blocks
    of one such rotation each, on distinct bits, become one OneQubitRotations unit.
    ``flipped_bits`` gives, for each operation that is a bit flip (an X word with at most
    one control), the bits it flips (None for the others): with fusion on, runs of at least
    ``traits.min_permutation_run`` adjacent flips, each a unit of its own, that flip at
    most ``traits.permutation_bits`` bits together become BitPermutationRuns. With fusion
    on, a register of at least ``traits.min_tiled_qubits`` qubits (``num_qubits``) has its
    runs of adjacent blocks of one bit each below ``traits.tile_bits`` made TiledRuns,
    before rotations are paired; a block of one flagged rotation joins them only from
    ``traits.min_tiled_rotation_qubits``."""
    count = len(bits_per_step)
    z_flags = tuple(z_rotations) if z_rotations is not None else (False,) * count
    units = _cached_plan(tuple(bits_per_step), max_qubits, traits.block_costs, z_flags)
    if max_qubits <= 1:
        return units
    if traits.tile_bits > 0 and num_qubits >= max(traits.min_tiled_qubits, 1):
        kept_apart = None  # lone rotations kept out of the runs (to be paired)
        if one_qubit_rotations is not None and num_qubits < traits.min_tiled_rotation_qubits:
            kept_apart = tuple(one_qubit_rotations)
        units = _tiled_runs(units, traits.tile_bits, kept_apart)
    per_pass = traits.rotations_per_pass
    if per_pass >= 2 and one_qubit_rotations is not None:
        units = _paired_rotations(units, tuple(one_qubit_rotations), per_pass)
    if traits.permutation_bits > 0 and flipped_bits is not None:
        units = _permutation_runs(
            units, tuple(flipped_bits), traits.permutation_bits, traits.min_permutation_run
        )
    return units


@functools.lru_cache(maxsize=256)
def _permutation_runs(
    units: tuple[Unit, ...], flipped: tuple, most_bits: int, fewest_flips: int
) -> tuple[Unit, ...]:
    """``units`` with each run of adjacent one-operation units that are bit flips cut into
    BitPermutationRuns of at most ``most_bits`` flipped bits (adjacent units run back to
    back, so nothing moves across another operation); runs of fewer than ``fewest_flips``
    flips stay as they were."""
    out: list[Unit] = []
    run: list[Unit] = []
    moved: set[int] = set()

    def close() -> None:
        if len(run) >= fewest_flips:
            members = tuple(_lone_member(unit) for unit in run)
            out.append(BitPermutationRun(members, tuple(sorted(moved))))
        else:
            out.extend(run)
        run.clear()
        moved.clear()

    for unit in units:
        member = _lone_member(unit)
        bits = flipped[member] if member is not None else None
        if bits is None:
            close()
            out.append(unit)
            continue
        if len(moved.union(bits)) > most_bits:
            close()
        run.append(unit)
        moved.update(bits)
    close()
    return tuple(out)


@functools.lru_cache(maxsize=256)
def _tiled_runs(
    units: tuple[Unit, ...], tile_bits: int, kept_apart: tuple | None
) -> tuple[Unit, ...]:
    """``units`` with each run of at least two adjacent blocks of one bit below
    ``tile_bits`` made a TiledRun (adjacent units run back to back, so nothing moves
    across another operation); ``kept_apart`` flags operations whose block of their own
    stays out of the runs."""
    out: list[Unit] = []
    run: list[Block] = []

    def close() -> None:
        if len(run) > 1:
            out.append(TiledRun(tuple(run)))
        else:
            out.extend(run)
        run.clear()

    def joins(unit: Unit) -> bool:
        if not (isinstance(unit, Block) and len(unit.targets) == 1):
            return False
        kept = kept_apart is not None and len(unit.members) == 1 and kept_apart[unit.members[0]]
        return unit.targets[0] < tile_bits and not kept

    for unit in units:
        if joins(unit):
            run.append(unit)
            continue
        close()
        out.append(unit)
    close()
    return tuple(out)


def _lone_member(unit: Unit) -> int | None:
    """The operation of a unit of one operation (a Single, a Block of one), else None."""
    if isinstance(unit, Single):
        return unit.member
    if isinstance(unit, Block) and len(unit.members) == 1:
        return unit.members[0]
    return None


@functools.lru_cache(maxsize=256)
def _paired_rotations(units: tuple[Unit, ...], flags: tuple, per_pass: int) -> tuple[Unit, ...]:
    """``units`` with each run of adjacent one-rotation blocks on distinct bits cut into
    OneQubitRotations of up to ``per_pass`` members (adjacent units run back to back, so nothing
    moves across another operation)."""
    paired: list[Unit] = []
    group: list[Block] = []

    def close() -> None:
        if len(group) > 1:
            paired.append(OneQubitRotations(tuple(block.members[0] for block in group)))
        else:
            paired.extend(group)
        group.clear()

    for unit in units:
        lone_rotation = (
            isinstance(unit, Block) and len(unit.members) == 1 and flags[unit.members[0]]
        )
        if not lone_rotation:
            close()
            paired.append(unit)
            continue
        if len(group) == per_pass or any(block.targets == unit.targets for block in group):
            close()
        group.append(unit)
    close()
    return tuple(paired)


class _OpenRun:
    def __init__(self):
        self.bits: set[int] = set()
        self.members: list[int] = []


@functools.lru_cache(maxsize=256)
def _cached_plan(bits_per_step: tuple, max_qubits: int, costs, z_flags) -> tuple[Unit, ...]:
    width = max(max_qubits, 1)
    units: list = []  # a Single, an open run, or an open block as [bits (a set), members]
    last_touch: dict[int, int] = {}
    barrier = -1  # the last unfusable operation: nothing moves across it
    for index, bits in enumerate(bits_per_step):
        if bits is None:
            units.append(Single(index))
            barrier = len(units) - 1
            continue
        earliest = max([barrier, *(last_touch.get(bit, -1) for bit in bits)])
        if max_qubits > 1 and z_flags[index] and (len(bits) > 1 or _open_run(units, earliest)):
            position = _open_run(units, earliest)
            if position is None:
                units.append(_OpenRun())
                position = len(units) - 1
            units[position].bits.update(bits)
            units[position].members.append(index)
        elif len(bits) > width:
            units.append(Single(index))
            position = len(units) - 1
        else:
            position = None
            if max_qubits > 1:
                position = _choose_block(units, bits, earliest, width, costs)
            if position is None:
                units.append([set(), []])
                position = len(units) - 1
            units[position][0].update(bits)
            units[position][1].append(index)
        for bit in bits:
            last_touch[bit] = position
    return tuple(_closed(unit) for unit in units)


def _open_run(units: list, earliest: int) -> int | None:
    for position in range(len(units) - 1, max(earliest, 0) - 1, -1):
        if isinstance(units[position], _OpenRun):
            return position
    return None


def _closed(unit) -> Unit:
    if isinstance(unit, Single):
        return unit
    if isinstance(unit, _OpenRun):
        if len(unit.members) > 1:
            return ZRun(tuple(unit.members))
        return Block(tuple(sorted(unit.bits)), tuple(unit.members))
    return Block(tuple(sorted(unit[0])), tuple(unit[1]))


def _choose_block(units: list, bits: tuple, earliest: int, width: int, costs) -> int | None:
    """The open block at or after ``earliest`` that ``bits`` joins (module docstring)."""
    best, best_score = None, None
    for position in range(len(units) - 1, max(earliest, 0) - 1, -1):
        unit = units[position]
        if isinstance(unit, (Single, _OpenRun)):
            continue
        size = len(unit[0].union(bits))
        if size > width:
            continue
        if costs is None:
            if position == earliest:
                return position
            score = -size
        else:
            current = costs[len(unit[0])] if len(unit[1]) > 1 else 1.0
            score = current + 1.0 - costs[size]
            if score <= 0:
                continue
            score += 1e-9 if position == earliest else 0.0  # ties: the block it follows
        if best_score is None or score > best_score:
            best, best_score = position, score
    return best


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


def block_width(register: Register, max_qubits: int, traits: FusionTraits) -> int:
    """The largest fused block for ``register``'s batch: ``max_qubits``, or 1 (no fusion) when
    the batch holds fewer than ``traits.min_fused_amplitudes`` amplitudes, where building
    the blocks costs the host more time than the passes they save."""
    amplitudes = register.batch_size << register.num_qubits
    return max_qubits if amplitudes >= traits.min_fused_amplitudes else 1


def fuse(compilation: Compilation, max_qubits: int, traits: FusionTraits = GREEDY) -> list[Fused]:
    """The units of the compilation's steps (``plan_units``) with their instructions
    (``realize``). Stateless: a plan that the forward pass made travels to the sweep in
    its ``FusedPlan`` (``fused_plan``)."""
    return realize(compilation, plan_units(compilation, max_qubits, traits))


def plan_units(
    compilation: Compilation, max_qubits: int, traits: FusionTraits = GREEDY
) -> tuple[Unit, ...]:
    """The units of the compilation's steps for blocks of at most ``max_qubits`` bits,
    planned with ``traits`` (Z runs and rotations per pass, see ``plan``); taken from
    ``compilation.memo`` where the compilation's structure planned them before."""
    memo, key = compilation.memo, ("fusion", max_qubits, traits)
    if memo is not None and (units := memo.get(key)) is not None:
        return units
    steps = compilation.steps
    bits = [step_bits(compilation.register, s.operation, s.instructions) for s in steps]
    z_flags = rotation_flags = flipped = None  # without fusion, nothing gathers
    if max_qubits > 1:
        rotations = [plain_rotation(s.operation, s.instructions) for s in steps]
        z_flags = [traits.z_runs and is_z_rotation(rotation) for rotation in rotations]
        rotation_flags = [
            traits.rotations_per_pass > 1 and is_one_qubit_rotation(rotation)
            for rotation in rotations
        ]
        if traits.permutation_bits > 0:
            flipped = [flipped_bits(s.instructions) for s in steps]
    units = plan(
        bits, max_qubits, traits, z_flags, rotation_flags, flipped,
        compilation.register.num_qubits,
    )  # fmt: skip
    if memo is not None:
        memo[key] = units
    return units


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


def is_z_rotation(rotation: Instruction | None) -> bool:
    """Whether an operation's ``plain_rotation`` (None: it is none) is exp(-i theta/2
    Z_word) (RZ, IsingZZ, MultiRZ, PauliRot of Z letters)."""
    return rotation is not None and set(rotation.paulis) == {"Z"} and rotation.condition is None


def is_one_qubit_rotation(rotation: Instruction | None) -> bool:
    """Whether an operation's ``plain_rotation`` (None: it is none) is exp(-i theta/2 P),
    P one letter X, Y or Z (RX, RY, RZ, and the gates of a run of rotations)."""
    return (
        rotation is not None
        and len(rotation.targets) == 1
        and rotation.paulis in ("X", "Y", "Z")
        and rotation.condition is None
    )


def flipped_bits(instructions: Sequence[Instruction]) -> tuple[int, ...] | None:
    """The bits an operation flips if it is a bit flip: instructions that are X words
    (Kind.PAULI of X letters) with at most one control and no condition, an affine map of
    the index bits; else None (a Toffoli's map is not affine)."""
    flipped: set[int] = set()
    for instruction in instructions:
        if (
            instruction.kind is not Kind.PAULI
            or set(instruction.paulis) != {"X"}
            or len(instruction.controls) > 1
            or instruction.condition is not None
        ):
            return None
        flipped.symmetric_difference_update(instruction.targets)
    return tuple(sorted(flipped)) if instructions else None


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
