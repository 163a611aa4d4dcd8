"""The CPU backend's kernel arguments, built on the host (and cached where a circuit asks
for the same ones again and again): where a gate acts (``Placement``), Pauli words as bit
masks, rotation pairs, tiles, the groups of a bit permutation, and the tables of Z words
(commuting Z rotations, expectation values and sums of Z words)."""

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .primitives import FusionTraits, StateBatch

I_POWERS = (1.0 + 0.0j, 1.0j, -1.0 + 0.0j, -1.0j)


def int64_bits(values: Sequence[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64, ndmin=1)


def _fixed_bits(*groups: Sequence[int]) -> np.ndarray:
    """The bits a kernel holds fixed (targets, controls), sorted ascending."""
    return np.array(sorted(bit for group in groups for bit in group), dtype=np.int64, ndmin=1)


def control_mask_of(controls: Sequence[int], control_values: Sequence[int]) -> int:
    return sum(int(v) << int(c) for c, v in zip(controls, control_values, strict=True))


class Placement(NamedTuple):
    """Where a gate acts, as the kernels take it."""

    targets: np.ndarray
    fixed_bits: np.ndarray
    control_mask: int


def placement_of(
    targets: Sequence[int], controls: Sequence[int] = (), control_values: Sequence[int] = ()
) -> Placement:
    return _cached_placement(tuple(targets), tuple(controls), tuple(control_values))


@functools.lru_cache(maxsize=4096)
def _cached_placement(targets: tuple, controls: tuple, control_values: tuple) -> Placement:
    """Built once per placement: a circuit applies the same few placements again and
    again, and building the arrays costs more than a gate on a few qubits."""
    placement = Placement(
        int64_bits(targets),
        _fixed_bits(targets, controls),
        control_mask_of(controls, control_values),
    )
    placement.targets.flags.writeable = False
    placement.fixed_bits.flags.writeable = False
    return placement


def product_table(factors: np.ndarray) -> np.ndarray:
    """(B, 2**m): entry c is the product over j of factors[b, j, bit j of c]."""
    table = np.ones((factors.shape[0], 1), dtype=np.complex128)
    for j in range(factors.shape[1]):
        table = np.concatenate([table * factors[:, j, :1], table * factors[:, j, 1:]], axis=1)
    return table


def rotation_pair_arguments(angles: np.ndarray, paulis: str) -> tuple[np.ndarray, np.ndarray]:
    """(angles (1 or B, 2) float64, letters 1: X, 2: Y, 3: Z) of a ONE_QUBIT_ROTATIONS instruction,
    which this backend runs in pairs (``rotations_per_pass``)."""
    if len(paulis) != 2 or not set(paulis) <= set("XYZ"):
        raise ValueError(
            f"the CPU backend applies one-qubit rotations in pairs of X, Y or Z; got {paulis!r}"
        )
    angles = np.ascontiguousarray(angles, dtype=np.float64).reshape(-1, 2)
    return angles, _letter_codes(paulis)


@functools.lru_cache(maxsize=16)
def _letter_codes(paulis: str) -> np.ndarray:
    codes = np.array(["IXYZ".index(letter) for letter in paulis], dtype=np.int64)
    codes.flags.writeable = False
    return codes


def pauli_masks_of(paulis: str, targets: Sequence[int]) -> tuple[int, int, complex]:
    """(x_mask, z_mask, i**n_Y) of a Pauli word: P|i> = i**n_Y (-1)**|i & z| |i ^ x>."""
    return _cached_pauli_masks(paulis, tuple(targets))


@functools.lru_cache(maxsize=4096)
def _cached_pauli_masks(paulis: str, targets: tuple) -> tuple[int, int, complex]:
    x_mask = z_mask = n_y = 0
    for letter, bit in zip(paulis, targets, strict=True):
        if letter in "XY":
            x_mask |= 1 << bit
        if letter in "YZ":
            z_mask |= 1 << bit
        n_y += letter == "Y"
    return x_mask, z_mask, I_POWERS[n_y % 4]


def z_rotation_diagonals(angles: np.ndarray, paulis: str) -> np.ndarray:
    """The diagonals of exp(-i angle/2 P) for a word P of Z and I letters, (len(angles), 2**k)."""
    signs = z_word_signs(paulis)
    if angles.shape[0] == 1 and math.isfinite(angles[0]):  # scalar math: numpy on one
        half = 0.5 * float(angles[0])  # angle costs microseconds per call (math.cos(inf)
        return (math.cos(half) - (1j * math.sin(half)) * signs)[None]  # raises: numpy's nan)
    half = 0.5 * angles.reshape(-1, 1)
    return np.cos(half) - 1j * np.sin(half) * signs


PERMUTATION_GROUP_BITS = 16
"""The most bits of one group of ``apply_bit_permutation`` (a worker's buffer: 2**16
amplitudes, 1 MiB in complex128)."""

_PERMUTATION_CHUNK_BITS = 6
"""The fewest low bits a group of ``apply_bit_permutation`` holds: it reads its amplitudes
in contiguous chunks of at least 2**6."""


def tile_bits_for(state: StateBatch, targets: Sequence[int], traits: FusionTraits) -> int | None:
    """The bits of a tile of ``apply_tiled_2x2`` for gates on ``targets``: the traits'
    ``tile_bits`` (the whole vector if smaller); None where a target lies above them (then
    the gates run one by one)."""
    tile_bits = min(traits.tile_bits, state.shape[1].bit_length() - 1)
    return tile_bits if max(targets, default=0) < tile_bits else None


class PermutationGroups(NamedTuple):
    """How ``apply_bit_permutation`` walks a state for one map (see the kernel)."""

    group_bits: np.ndarray
    outside_bits: np.ndarray
    chunk_bits: int
    run_bits: int
    """The lowest bits that the map neither moves nor reads: runs of 2**run_bits
    amplitudes keep their order and are copied whole."""


@functools.lru_cache(maxsize=256)
def permutation_groups_of(sources: tuple[int, ...], n_bits: int) -> PermutationGroups:
    """The group bits of the map ``sources`` on ``n_bits``-bit indices: the bits it moves,
    then the lowest bits (contiguous chunks) up to ``PERMUTATION_GROUP_BITS``."""
    moved = sources[n_bits]
    for j in range(n_bits):
        moved |= sources[j] ^ (1 << j)
    group = {j for j in range(n_bits) if (moved >> j) & 1}
    if len(group | set(range(_PERMUTATION_CHUNK_BITS))) > PERMUTATION_GROUP_BITS:
        raise ValueError(
            f"apply_bit_permutation moves {len(group)} bits; the CPU backend takes at most "
            f"{PERMUTATION_GROUP_BITS - _PERMUTATION_CHUNK_BITS} per call "
            "(FusionTraits.permutation_bits plans runs within that)"
        )
    low = 0  # the chunk: bits below ``low``, all in the group
    while low < n_bits and (low in group or low < _PERMUTATION_CHUNK_BITS):
        group.add(low)
        low += 1
    outside = [j for j in range(n_bits) if j not in group]
    touched = moved | _reads(sources)  # bits the map moves or reads
    run = 0  # bit j < run: neither moved nor read, so runs of 2**run amplitudes stay whole
    while run < low and not (touched >> run) & 1:
        run += 1
    return PermutationGroups(int64_bits(sorted(group)), int64_bits(outside), low, run)


def _reads(sources: tuple[int, ...]) -> int:
    """The bits whose value changes another bit's source (controls of the run)."""
    reads = 0
    for j, column in enumerate(sources[:-1]):
        if column != 1 << j:
            reads |= 1 << j
    return reads


class ZRotationPlan(NamedTuple):
    """How the CPU kernels apply commuting Z-word rotations (see z_rotation_plan)."""

    low: int
    low_signs: np.ndarray  # (G, 2**low): the signs of the G distinct low parts of the words
    low_group: np.ndarray  # (J,): each word's low part among them
    high_signs: np.ndarray  # (J, 2**high): each word's sign on the high bits
    counts: np.ndarray  # (V, G, 2**high): per angle group and low part, the summed high signs
    tables: np.ndarray  # (1 or B, V, 2J + 1): exp(-i theta_v/2 n) for n = -J .. J


def z_rotation_plan(angles: np.ndarray, z_masks: Sequence[int], dim: int) -> ZRotationPlan:
    """Rotations that share an angle (in every vector) form an angle group v: their phase
    is exp(-i theta_v/2 n_v) with n_v the sum of their signs, an integer looked up in a
    table. A sign factors over the high and low index bits, so n_v at x = h * 2**low + l
    is sum_g counts[v, g, h] low_signs[g, l] over the distinct low parts g of the words."""
    z_masks = tuple(z_masks)
    low, low_signs, low_group, high_signs = _z_word_split(z_masks, dim)
    if angles.shape[0] == 1 and np.all(angles == angles[0, 0]):  # one angle (QAOA)
        shared_angles, angle_group = angles[:, :1], (0,) * len(z_masks)
    else:
        shared_angles, angle_group = np.unique(angles, axis=1, return_inverse=True)
        angle_group = tuple(angle_group.reshape(-1).tolist())
    counts = _sign_counts(z_masks, dim, angle_group)
    n = np.arange(-len(z_masks), len(z_masks) + 1)
    tables = np.exp(-0.5j * shared_angles[:, :, None] * n[None, None, :])
    return ZRotationPlan(low, low_signs, low_group, high_signs, counts, tables)


@functools.lru_cache(maxsize=64)
def _sign_counts(z_masks: tuple, dim: int, angle_group: tuple) -> np.ndarray:
    """counts[v, g, h]: the high signs summed over the words of angle group v and low part
    g; built once per run of words and grouping of their angles (a QAOA layer's words
    share one angle every step)."""
    _, low_signs, low_group, high_signs = _z_word_split(z_masks, dim)
    counts = np.zeros((max(angle_group) + 1, low_signs.shape[0], high_signs.shape[1]))
    for j, (v, g) in enumerate(zip(angle_group, low_group, strict=True)):
        counts[v, g] += high_signs[j]
    counts.flags.writeable = False
    return counts


@functools.lru_cache(maxsize=64)
def _z_word_split(z_masks: tuple, dim: int) -> tuple:
    """(low, low sign rows, each word's row, each word's high signs): what depends on the
    words only, built once per run of words."""
    masks = np.array(z_masks, dtype=np.int64)
    low, low_masks, low_group = split_masks(masks, dim)
    high_signs = sign_table(masks >> low, dim.bit_length() - 1 - low)
    return low, sign_table(low_masks, low), low_group, high_signs


DIAGONAL_WORD_LETTERS = 4
"""Words of Z and I up to this length run as diagonals: a constant factor per inner loop
instead of a parity per amplitude."""


MANY_WORDS = 4
"""From this many Z words on, their expectation values come from one pass over the state
(``CPUBackend.expval_pauli_words``) and a weighted sum of them is one diagonal (z_sum_blocks),
instead of a parity per word and amplitude."""


def z_masks_of(words: Sequence[tuple[str, Sequence[int]]]) -> np.ndarray | None:
    """The Z masks of the words if every word is made of Z and I letters, else None."""
    masks = [pauli_masks_of(paulis, targets) for paulis, targets in words]
    if any(x_mask for x_mask, _, _ in masks):
        return None
    return np.array([z_mask for _, z_mask, _ in masks], dtype=np.int64)


def sign_table(masks: np.ndarray, bits: int) -> np.ndarray:
    """table[k, x] = (-1)**popcount(x & masks[k]) for x < 2**bits, float64."""
    x = np.arange(1 << bits, dtype=np.int64)
    return 1.0 - 2.0 * (np.bitwise_count(masks[:, None] & x[None, :]) & 1)


def split_masks(z_masks: np.ndarray, dim: int) -> tuple[int, np.ndarray, np.ndarray]:
    """(low, low masks, group): the index split into its ``low`` lowest bits and the rest,
    and the distinct low parts of the masks with each mask's position among them. A Z-word
    sign factors over the split: (-1)**|x & m| = (-1)**|x_hi & m_hi| (-1)**|x_lo & m_lo|."""
    low = (dim.bit_length() - 1) // 2
    low_masks, group = np.unique(z_masks & ((1 << low) - 1), return_inverse=True)
    return low, low_masks, group


def z_sum_blocks(
    z_masks: np.ndarray, coefficients: np.ndarray, dim: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """The diagonal d[x] = sum_k c_k (-1)**popcount(x & z_masks[k]) of sum_k c_k Z-word_k,
    factored over the split of x into high and low bits: d[h * 2**low + l] =
    sum_g block_coefficients[h, g] low_signs[g, l], g over the distinct low masks. Returns
    (block_coefficients, low_signs, low)."""
    low, low_masks, group = split_masks(z_masks, dim)
    high_signs = sign_table(z_masks >> low, dim.bit_length() - 1 - low)
    block_coefficients = np.zeros((high_signs.shape[1], len(low_masks)), dtype=np.complex128)
    for k, g in enumerate(group):  # no BLAS: its idle threads spin against the kernels'
        block_coefficients[:, g] += coefficients[k] * high_signs[k]
    return block_coefficients, sign_table(low_masks, low), low


@functools.cache
def z_word_signs(paulis: str) -> np.ndarray:
    """The diagonal of a word of Z and I letters: (-1)**(number of Z letters whose bit is 1
    in a), for a in 0 .. 2**len(paulis) - 1 (letter j on bit j of a). Complex, read-only."""
    a = np.arange(1 << len(paulis))
    parity = np.zeros_like(a)
    for j, letter in enumerate(paulis):
        if letter == "Z":
            parity ^= (a >> j) & 1
    signs = (1.0 - 2.0 * parity).astype(np.complex128)
    signs.flags.writeable = False
    return signs


def pivot_bits(x_mask: int) -> tuple[int, ...]:
    """The bit whose zero half enumerates the amplitude pairs (i, i ^ x_mask)."""
    return (x_mask.bit_length() - 1,) if x_mask else ()
