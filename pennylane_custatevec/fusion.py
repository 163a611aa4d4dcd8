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

The units' instructions and matrices, and the plans kept for the sweep, are
``fused_units``'. Matrices follow the backends' conventions: a block's ``targets`` are its
bits in ascending order and ``targets[j]`` is bit ``j`` of the block's matrix index; batched
data has a leading axis of length 1 or B.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from .backends.primitives import FusionTraits
from .instructions import Instruction, Kind, has_matrix
from .program import Compilation, Register, plain_rotation, wire_labels


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


def block_width(register: Register, max_qubits: int, traits: FusionTraits) -> int:
    """The largest fused block for ``register``'s batch: ``max_qubits``, or 1 (no fusion) when
    the batch holds fewer than ``traits.min_fused_amplitudes`` amplitudes, where building
    the blocks costs the host more time than the passes they save."""
    amplitudes = register.batch_size << register.num_qubits
    return max_qubits if amplitudes >= traits.min_fused_amplitudes else 1


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
