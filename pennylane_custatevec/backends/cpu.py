"""CPU backend: numpy state vectors updated in place by numba kernels."""

import functools
import math
import threading
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numba
import numpy as np

from . import _cpu_kernels as kernels

# The kernels by name, so that a misspelt one fails at import; several share the name of
# the method that calls them.
from ._cpu_kernels import (
    add_scaled,
    add_z_sum,
    add_z_sum_by_blocks,
    apply_1q,
    apply_1q_rotation,
    apply_2q,
    apply_bit_permutation,
    apply_diagonal,
    apply_kq,
    apply_pauli,
    apply_pauli_rotation,
    apply_rotation_pair,
    apply_tiled_2x2,
    apply_z_phases,
    block_step,
    block_step_1q,
    block_step_2q,
    chunks_per_vector,
    diagonal_step,
    inner_diagonal,
    inner_matrix,
    inner_pauli,
    low_sign_sums,
    marginal_probs,
    product_state,
    rotation_pair_step,
    rotation_step_1q,
    run_sequence,
    run_sequence_jacobian,
    run_sequence_measured,
    sweep_sequence,
    sweep_sequence_from_words,
    tiled_2x2_step,
    z_rotations_step,
)
from .base import (
    Backend,
    DenseEntry,
    DerivativeEntry,
    FusionTraits,
    GateSequence,
    RotationEntry,
    StateBatch,
)
from .host import free_host_bytes

_I_POWERS = (1.0 + 0.0j, 1.0j, -1.0 + 0.0j, -1.0j)


def _bits(values: Sequence[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64, ndmin=1)


def _fixed_bits(*groups: Sequence[int]) -> np.ndarray:
    """The bits a kernel holds fixed (targets, controls), sorted ascending."""
    return np.array(sorted(bit for group in groups for bit in group), dtype=np.int64, ndmin=1)


def _control_mask(controls: Sequence[int], control_values: Sequence[int]) -> int:
    return sum(int(v) << int(c) for c, v in zip(controls, control_values, strict=True))


class _Placement(NamedTuple):
    """Where a gate acts, as the kernels take it."""

    targets: np.ndarray
    fixed_bits: np.ndarray
    control_mask: int


def _placement(
    targets: Sequence[int], controls: Sequence[int] = (), control_values: Sequence[int] = ()
) -> _Placement:
    return _cached_placement(tuple(targets), tuple(controls), tuple(control_values))


@functools.lru_cache(maxsize=4096)
def _cached_placement(targets: tuple, controls: tuple, control_values: tuple) -> _Placement:
    """Built once per placement: a circuit applies the same few placements again and
    again, and building the arrays costs more than a gate on a few qubits."""
    placement = _Placement(
        _bits(targets), _fixed_bits(targets, controls), _control_mask(controls, control_values)
    )
    placement.targets.flags.writeable = False
    placement.fixed_bits.flags.writeable = False
    return placement


def _product_table(factors: np.ndarray) -> np.ndarray:
    """(B, 2**m): entry c is the product over j of factors[b, j, bit j of c]."""
    table = np.ones((factors.shape[0], 1), dtype=np.complex128)
    for j in range(factors.shape[1]):
        table = np.concatenate([table * factors[:, j, :1], table * factors[:, j, 1:]], axis=1)
    return table


def _rotation_pair(angles, paulis: str) -> tuple[np.ndarray, np.ndarray]:
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


def _pauli_masks(paulis: str, targets: Sequence[int]) -> tuple[int, int, complex]:
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
    return x_mask, z_mask, _I_POWERS[n_y % 4]


def _z_rotation_diagonals(angles: np.ndarray, paulis: str) -> np.ndarray:
    """The diagonals of exp(-i angle/2 P) for a word P of Z and I letters, (len(angles), 2**k)."""
    signs = _z_word_signs(paulis)
    if angles.shape[0] == 1 and math.isfinite(angles[0]):  # scalar math: numpy on one
        half = 0.5 * float(angles[0])  # angle costs microseconds per call (math.cos(inf)
        return (math.cos(half) - (1j * math.sin(half)) * signs)[None]  # raises: numpy's nan)
    half = 0.5 * angles.reshape(-1, 1)
    return np.cos(half) - 1j * np.sin(half) * signs


_TILE_BITS = 14
"""A tile of a tiled run: 2**14 consecutive amplitudes, 256 KiB in complex128, within a
core's share of the L2 cache (2 MiB; the sweep's tile of a ket and its bras stays within it
up to 7 bras); a probe of 13 and 15 bits measured alike. Tiles that also take high bits
(chunks gathered into a buffer) were not kept: ``benchmarks/tiled_runs.py``, "gathered",
six high bits 1.1-1.25x slower than one by one at 20-22 qubits, 1.4-1.6x faster at 24 (a
candidate from 24 qubits on)."""

CPU_FUSION_TRAITS = FusionTraits(
    # What the benchmarks chose (doc/options.md).
    default_width=2,
    # Measured with benchmarks/kernels.py-style timings at 20 qubits (2 cores): a dense
    # block on w bits against a single-qubit rotation; the 3- to 6-bit blocks share the
    # generic kernel, compute-bound.
    block_costs=(1.0, 1.0, 2.2, 5.8, 5.6, 10.6, 21.0),
    z_runs=True,
    # Measured at 16 qubits (2 cores): two X rotations in one pass took 68-97 us against
    # 95-137 us one by one, whatever their bits; wider groups need unrolled kernels.
    rotations_per_pass=2,
    # Measured on W1's and W4's steps (2 cores): unfused was 13-20% faster up to 12
    # qubits, fused 22% faster at 14; W3's batch of 64 vectors on 8 qubits gains from
    # fusion.
    min_fused_amplitudes=1 << 13,
    # The rotation kernels make one pass in real arithmetic; a dense block on k bits is
    # compute-bound here (block_costs).
    pauli_rotation_step_for_lone_rotations=True,
    # A group of apply_bit_permutation holds the moved bits and at least the 6 lowest, in
    # at most 16 bits (_PERMUTATION_GROUP_BITS): runs of up to 10 moved bits.
    permutation_bits=10,
    # benchmarks/permutation_runs.py (2 cores, 2026-12-02): a run took 0.84 ms on one
    # vector of 20 qubits against 0.13 ms per CNOT, 0.89 ms on 17 vectors of 16 qubits
    # against 0.15 ms per CNOT: a run pays from about 6 flips.
    min_permutation_run=6,
    # benchmarks/tiled_runs.py (2 cores, 2026-12-02): a run of 14 gates on bits 13..0,
    # forward 1.1-1.2x faster tiled at 16-22 qubits, 2.6x at 24; the sweep's step 1.1x at
    # 16-18, 1.0-1.5x at 20, 1.8-2.0x at 22-24. A VJP step of two layers, tiled / untiled:
    # StronglyEntanglingLayers 0.93-0.95 at 16-20 qubits, 0.86 at 22, 0.80 at 24;
    # BasicEntanglerLayers(RY) 1.05 at 16 (its rotation pairs and one-pass rotation steps
    # win there), 0.97-1.0 at 18-20, 0.87 at 22-24: lone rotations tiled from 18 qubits,
    # other one-bit blocks from 16 (SEL 0.93 at 16; W2's Jacobian on forward 0.97, W2jr
    # compiled 0.95; W5, whose mixers are rotations, 1.05 with them tiled).
    tile_bits=_TILE_BITS,
    min_tiled_qubits=16,
    min_tiled_rotation_qubits=18,
)
"""How fusion plans for the CPU backend (see FusionTraits)."""


_PERMUTATION_GROUP_BITS = 16
"""The most bits of one group of ``apply_bit_permutation`` (a worker's buffer: 2**16
amplitudes, 1 MiB in complex128)."""

_PERMUTATION_CHUNK_BITS = 6
"""The fewest low bits a group of ``apply_bit_permutation`` holds: it reads its amplitudes
in contiguous chunks of at least 2**6."""


_SCRATCH = threading.local()
"""Each thread's buffers of ``apply_bit_permutation``, by dtype (``CPUBackend._buffers``)."""


def _tile_bits(state: StateBatch, targets: Sequence[int], traits: FusionTraits) -> int | None:
    """The bits of a tile of ``apply_tiled_2x2`` for gates on ``targets``: the traits'
    ``tile_bits`` (the whole vector if smaller); None where a target lies above them (then
    the gates run one by one)."""
    tile_bits = min(traits.tile_bits, state.shape[1].bit_length() - 1)
    return tile_bits if max(targets, default=0) < tile_bits else None


class _PermutationGroups(NamedTuple):
    """How ``apply_bit_permutation`` walks a state for one map (see the kernel)."""

    group_bits: np.ndarray
    outside_bits: np.ndarray
    chunk_bits: int
    run_bits: int
    """The lowest bits that the map neither moves nor reads: runs of 2**run_bits
    amplitudes keep their order and are copied whole."""


@functools.lru_cache(maxsize=256)
def _permutation_groups(sources: tuple[int, ...], n_bits: int) -> _PermutationGroups:
    """The group bits of the map ``sources`` on ``n_bits``-bit indices: the bits it moves,
    then the lowest bits (contiguous chunks) up to ``_PERMUTATION_GROUP_BITS``."""
    moved = sources[n_bits]
    for j in range(n_bits):
        moved |= sources[j] ^ (1 << j)
    group = {j for j in range(n_bits) if (moved >> j) & 1}
    if len(group | set(range(_PERMUTATION_CHUNK_BITS))) > _PERMUTATION_GROUP_BITS:
        raise ValueError(
            f"apply_bit_permutation moves {len(group)} bits; the CPU backend takes at most "
            f"{_PERMUTATION_GROUP_BITS - _PERMUTATION_CHUNK_BITS} per call "
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
    return _PermutationGroups(_bits(sorted(group)), _bits(outside), low, run)


def _reads(sources: tuple[int, ...]) -> int:
    """The bits whose value changes another bit's source (controls of the run)."""
    reads = 0
    for j, column in enumerate(sources[:-1]):
        if column != 1 << j:
            reads |= 1 << j
    return reads


class _PreparedSequence(NamedTuple):
    """A ``GateSequence`` as ``_cpu_kernels.run_sequence`` takes it (see there)."""

    ops: np.ndarray
    bits: np.ndarray
    matrices: np.ndarray
    """The constant matrices; the call's are written into a copy at ``slot_starts``."""
    slot_starts: tuple[int, ...]
    slot_sizes: tuple[int, ...]


def _prepared_sequence(sequence: GateSequence) -> _PreparedSequence:
    ops = np.zeros((len(sequence.entries), kernels.SEQ_FIELDS), dtype=np.int64)
    bits: list[int] = []
    pool: list[np.ndarray] = []
    pool_size = 0
    slot_starts = [0] * sequence.n_matrices
    slot_sizes = [0] * sequence.n_matrices

    def dense(row: np.ndarray, entry: DenseEntry) -> None:
        nonlocal pool_size
        if len(entry.bits) > _SEQUENCE_MAX_BITS:
            raise ValueError(
                f"a gate sequence's dense gates act on at most {_SEQUENCE_MAX_BITS} bits; "
                f"got {len(entry.bits)}"
            )
        size = 1 << (2 * len(entry.bits))
        row[kernels.SEQ_BITS_START] = len(bits)
        row[kernels.SEQ_N_BITS] = len(entry.bits)
        row[kernels.SEQ_MATRIX_START] = pool_size
        bits.extend(entry.bits)
        if entry.matrix is None:
            slot_starts[entry.slot], slot_sizes[entry.slot] = pool_size, size
            pool.append(np.zeros(size, dtype=np.complex128))
        else:
            pool.append(np.asarray(entry.matrix, dtype=np.complex128).reshape(size))
        pool_size += size

    def rotation(row: np.ndarray, entry: RotationEntry) -> None:
        x_mask, z_mask, i_power = _pauli_masks(entry.paulis, entry.targets)
        row[kernels.SEQ_X_MASK] = x_mask
        row[kernels.SEQ_Z_MASK] = z_mask
        row[kernels.SEQ_I_POWER] = _I_POWERS.index(i_power)
        row[kernels.SEQ_CONTROL_MASK] = _control_mask(entry.controls, (1,) * len(entry.controls))
        row[kernels.SEQ_CONTROL_VALUE] = _control_mask(entry.controls, entry.control_values)
        row[kernels.SEQ_SLOT] = entry.slot

    for row, entry in zip(ops, sequence.entries, strict=True):
        if isinstance(entry, DerivativeEntry):  # encoded as its generator, under its own codes
            row[kernels.SEQ_COLUMN] = entry.column
            gate, codes = (
                entry.generator,
                (kernels.SEQ_ROTATION_DERIVATIVE, kernels.SEQ_DENSE_DERIVATIVE),
            )
        else:
            gate, codes = entry, (kernels.SEQ_ROTATION, kernels.SEQ_DENSE)
        if isinstance(gate, RotationEntry):
            row[kernels.SEQ_OPCODE] = codes[0]
            rotation(row, gate)
        else:
            row[kernels.SEQ_OPCODE] = codes[1]
            dense(row, gate)
    matrices = np.concatenate(pool) if pool else np.zeros(1, dtype=np.complex128)
    return _PreparedSequence(
        ops, _bits(bits or [0]), matrices, tuple(slot_starts), tuple(slot_sizes)
    )


@functools.lru_cache(maxsize=1024)
def _word_rows(words: tuple) -> np.ndarray:
    """Pauli words (paulis, targets) as rows of a sequence table (``_cpu_kernels``: x and
    z masks, i power), for the kernels that measure or build bras from them."""
    rows = np.zeros((len(words), kernels.SEQ_FIELDS), dtype=np.int64)
    for row, (paulis, targets) in zip(rows, words, strict=True):
        x_mask, z_mask, i_power = _pauli_masks(paulis, targets)
        row[kernels.SEQ_X_MASK] = x_mask
        row[kernels.SEQ_Z_MASK] = z_mask
        row[kernels.SEQ_I_POWER] = _I_POWERS.index(i_power)
    rows.setflags(write=False)
    return rows


_SEQUENCE_MAX_BITS = 6
"""The widest dense gate of a gate sequence (the kernels' scratch holds 64 amplitudes)."""


_THREADED_SEQUENCES = threading.Lock()
"""Held while a threaded sequence kernel runs: numba's workqueue threading layer (the one
it falls back to without OpenMP or TBB) is not safe for parallel launches from several
Python threads at once, and small circuits are the likeliest to be run from threads (a
fresh-clone CI run hung with unguarded threaded sequences)."""


_THREADED_SEQUENCE_AMPLITUDES = 1 << 11
"""Below the per-gate kernels' threshold (``_cpu_kernels._PARALLEL_THRESHOLD``): a sequence
call wakes the threads once for all its gates. Measured on the step of
``CPUBackend.sequence_amplitudes`` (``benchmarks/sequence_sizes.py`` with the threshold
edited; interleaved, best of 7), threads from 2**11 against
from 2**14 amplitudes: 0.62 against 0.38 ms on 8 vectors of 8 qubits, 1.05 against 0.55 ms
on 16, 1.98 against 0.95 ms on 32, 3.6 against 1.2 ms on 256 vectors of 4 qubits."""


def _launch_sequence(kernel: kernels.Kernel, state: np.ndarray, *arguments) -> None:
    """``kernel`` on ``state`` (a batch of vectors first): threaded, a thread taking whole
    vectors, for batches of several vectors of ``_THREADED_SEQUENCE_AMPLITUDES`` amplitudes
    in all, launched under ``_THREADED_SEQUENCES``; else serial."""
    if state.shape[0] > 1 and state.size >= _THREADED_SEQUENCE_AMPLITUDES:
        with _THREADED_SEQUENCES:
            kernel.threaded(state, *arguments)
    else:
        kernel.serial(state, *arguments)


class CPUBackend(Backend):
    """State vectors as a C-contiguous numpy array of shape (B, 2**n)."""

    name = "cpu"
    fusion_traits = CPU_FUSION_TRAITS
    min_product_state_amplitudes = 1 << 15
    """Measured with one gate per wire (2 cores): gate by gate took 15 us against the
    product state's 127 us at 4 qubits (RX), 153 us against 406 us on 64 vectors of 8
    qubits; at 15 qubits the two tie for RX and the product state wins for Hadamards
    (0.57 against 0.73 ms); at 16 it wins (0.8 against 0.92 ms for RX, 1.4 ms for
    Hadamards), at 20 qubits 6.6 against 19.3 ms."""

    def __init__(self, dtype: np.dtype = np.complex128):
        self.dtype = np.dtype(dtype)

    sequence_amplitudes = 1 << 13
    """Per vector. Measured (``benchmarks/sequence_sizes.py``) on a compiled AngleEmbedding +
    StronglyEntanglingLayers step
    (2 layers, 2 cores, interleaved, best of 7; sequences with one-bit runs fused and
    threads over the vectors from ``_THREADED_SEQUENCE_AMPLITUDES``): the sequence path
    took 0.20-0.37x the gate-by-gate time on one vector of 9-12 qubits, 0.47x at 13 and
    0.94x at 14; on batches of 8 qubits 0.14x at 8 vectors, 0.34x at 32, 0.49x at 64 (W3),
    0.79x at 1024; 0.38-0.43x on 256-1024 vectors of 4 qubits, 0.85-0.92x on 65536
    amplitudes of 10-13-qubit vectors."""

    def prepare_sequence(self, sequence: GateSequence) -> _PreparedSequence:
        return _prepared_sequence(sequence)

    def _sequence_matrices(self, prepared: _PreparedSequence, matrices: Sequence) -> np.ndarray:
        if not prepared.slot_starts:
            return prepared.matrices
        pool = prepared.matrices.copy()
        for start, size, matrix in zip(
            prepared.slot_starts, prepared.slot_sizes, matrices, strict=True
        ):
            pool[start : start + size] = np.asarray(matrix).reshape(size)
        return pool

    def run_sequence(self, state, prepared, angles, matrices) -> None:
        """One kernel call for the whole sequence."""
        _launch_sequence(
            run_sequence,
            state,
            prepared.ops,
            prepared.bits,
            self._sequence_matrices(prepared, matrices),
            np.ascontiguousarray(angles, dtype=np.float64),
        )

    def sweep_sequence(self, phi, bras, prepared, angles, matrices, n_columns) -> np.ndarray:
        out = np.zeros((phi.shape[0], bras.shape[0] // phi.shape[0], n_columns))
        _launch_sequence(
            sweep_sequence,
            phi,
            bras,
            prepared.ops,
            prepared.bits,
            self._sequence_matrices(prepared, matrices),
            np.ascontiguousarray(angles, dtype=np.float64),
            out,
        )
        return out

    def run_sequence_measured(self, state, prepared, angles, matrices, words) -> np.ndarray:
        """One kernel call: the sequence and the words' expectation values."""
        values = np.empty((state.shape[0], len(words)))
        arguments = self._measured_sequence(prepared, angles, matrices, words)
        _launch_sequence(run_sequence_measured, state, *arguments, values)
        return values

    def sweep_sequence_from_words(
        self, phi, prepared, angles, matrices, words, coefficients, n_columns
    ) -> np.ndarray:
        """One kernel call: the bras built from the words, and the sweep."""
        batch, rows, _ = coefficients.shape
        out = np.zeros((batch, rows, n_columns))
        _launch_sequence(
            sweep_sequence_from_words,
            phi,
            *self._measured_sequence(prepared, angles, matrices, words),
            np.ascontiguousarray(coefficients, dtype=np.complex128),
            out,
        )
        return out

    def run_sequence_jacobian(
        self, state, prepared, sweep, angles, matrices, words, coefficients, n_columns
    ) -> tuple[np.ndarray, np.ndarray]:
        """One kernel call: the sequence, the words' values, the bras and the sweep."""
        batch, rows, _ = coefficients.shape
        values = np.empty((batch, len(words)))
        out = np.zeros((batch, rows, n_columns))
        ops, bits, pool, angles, word_rows = self._measured_sequence(
            prepared, angles, matrices, words
        )
        _launch_sequence(
            run_sequence_jacobian,
            state,
            ops,
            bits,
            pool,
            sweep.ops,
            sweep.bits,
            self._sequence_matrices(sweep, matrices),
            angles,
            word_rows,
            np.ascontiguousarray(coefficients, dtype=np.complex128),
            values,
            out,
        )
        return values, out

    def bind_sequence_jacobian(
        self, n_qubits, prepared, sweep, words, coefficients, n_columns
    ) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """The kernel's arguments converted once (the tables, the words' rows, the
        coefficients); a call allocates the vector and the outputs and runs the serial
        kernel (one vector: what ``_launch_sequence`` runs for it)."""
        if prepared.slot_starts or sweep.slot_starts:
            raise ValueError("bind_sequence_jacobian: the sequence has matrix slots")
        kernel = run_sequence_jacobian.serial
        tables = (
            prepared.ops,
            prepared.bits,
            prepared.matrices,
            sweep.ops,
            sweep.bits,
            sweep.matrices,
        )
        word_rows = _word_rows(tuple(words))
        coefficients = np.ascontiguousarray(coefficients, dtype=np.complex128)
        rows = coefficients.shape[1]
        size, dtype = 1 << n_qubits, self.dtype

        def run(angles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            state = np.zeros((1, size), dtype=dtype)
            state[0, 0] = 1.0
            values = np.empty((1, len(word_rows)))
            out = np.zeros((1, rows, n_columns))
            angles = np.ascontiguousarray(angles, dtype=np.float64)
            kernel(state, *tables, angles, word_rows, coefficients, values, out)
            return values[0], out[0]

        return run

    def _measured_sequence(self, prepared: _PreparedSequence, angles, matrices, words) -> tuple:
        """The arguments that ``run_sequence_measured`` and ``sweep_sequence_from_words``
        take after their state: the sequence with the call's matrices, the angles, the
        words as table rows."""
        return (
            prepared.ops,
            prepared.bits,
            self._sequence_matrices(prepared, matrices),
            np.ascontiguousarray(angles, dtype=np.float64),
            _word_rows(tuple(words)),
        )

    def available_bytes(self) -> int:
        return free_host_bytes()

    def available_host_bytes(self) -> int:
        return self.available_bytes()  # the states live in host memory too

    def scratch_vectors(self, kets: int, bras: int, reduction: bool) -> int:
        return 0  # the kernels work in place; their partial sums are far below a vector

    def zero_state(self, n_qubits: int, batch_size: int) -> StateBatch:
        state = np.zeros((batch_size, 1 << n_qubits), dtype=self.dtype)
        state[:, 0] = 1.0
        return state

    def from_host(self, vectors: np.ndarray) -> StateBatch:
        return np.array(vectors, dtype=self.dtype, order="C", ndmin=2)

    def product_state(self, n_qubits, factors, bits) -> StateBatch:
        factors = np.asarray(factors, dtype=np.complex128)
        batch, k = factors.shape[0], factors.shape[1]
        state = np.zeros((batch, 1 << n_qubits), dtype=self.dtype)
        low_count = k // 2
        low = _product_table(factors[:, :low_count]).astype(self.dtype)
        high = _product_table(factors[:, low_count:]).astype(self.dtype)
        zero_bits = _bits(sorted(set(range(n_qubits)) - set(bits)))
        product_state.for_size(state)(state, low, high, low_count, zero_bits)
        return state

    def to_host(self, state: StateBatch) -> np.ndarray:
        return state.astype(np.complex128)

    def copy(self, state: StateBatch) -> StateBatch:
        return state.copy()

    def apply_matrix(self, state, matrices, targets, controls=(), control_values=()) -> None:
        matrices = np.ascontiguousarray(matrices, dtype=self.dtype)
        where = _placement(targets, controls, control_values)
        if len(targets) == 1:
            apply = apply_1q.for_size(state)
            apply(state, matrices, int(targets[0]), where.fixed_bits, where.control_mask)
        elif len(targets) == 2:
            apply = apply_2q.for_size(state)
            apply(state, matrices, where.targets, where.fixed_bits, where.control_mask)
        else:
            apply = apply_kq.for_size(state)
            apply(state, matrices, where.targets, where.fixed_bits, where.control_mask)

    def apply_diagonal(self, state, diagonals, targets, controls=(), control_values=()) -> None:
        diagonals = np.ascontiguousarray(diagonals, dtype=self.dtype)
        where = _placement(targets, controls, control_values)
        apply = apply_diagonal.for_size(state)
        apply(state, diagonals, where.targets, where.fixed_bits, where.control_mask)

    def apply_pauli_rotation(
        self, state, angles, paulis, targets, controls=(), control_values=()
    ) -> None:
        angles = np.ascontiguousarray(angles, dtype=np.float64).reshape(-1)
        if len(paulis) == 1:
            where = _placement(targets, controls, control_values)
            letter = "IXYZ".index(paulis)
            apply = apply_1q_rotation.for_size(state)
            apply(state, angles, letter, int(targets[0]), where.fixed_bits, where.control_mask)
            return
        x_mask, z_mask, i_power = _pauli_masks(paulis, targets)
        if x_mask == 0 and len(paulis) <= _DIAGONAL_WORD_LETTERS:
            diagonals = _z_rotation_diagonals(angles, paulis)
            self.apply_diagonal(state, diagonals, targets, controls, control_values)
            return
        where = _placement(_pivot(x_mask), controls, control_values)
        apply = apply_pauli_rotation.for_size(state)
        apply(state, angles, x_mask, z_mask, i_power, where.fixed_bits, where.control_mask)

    def apply_one_qubit_rotations(self, state, angles, paulis, targets) -> None:
        angles, letters = _rotation_pair(angles, paulis)
        where = _placement(targets)
        apply = apply_rotation_pair.for_size(state)
        apply(state, angles, letters, where.targets, where.fixed_bits)

    def apply_pauli(self, state, paulis, targets, controls=(), control_values=()) -> None:
        x_mask, z_mask, i_power = _pauli_masks(paulis, targets)
        if x_mask == 0 and 0 < len(paulis) <= _DIAGONAL_WORD_LETTERS:
            signs = _z_word_signs(paulis)[None]
            self.apply_diagonal(state, signs, targets, controls, control_values)
            return
        where = _placement(_pivot(x_mask), controls, control_values)
        apply = apply_pauli.for_size(state)
        apply(state, x_mask, z_mask, i_power, where.fixed_bits, where.control_mask)

    def apply_bit_permutation(self, state, sources) -> None:
        n_bits = state.shape[1].bit_length() - 1
        sources = np.array(sources, dtype=np.int64)  # a writeable copy: one compilation
        groups = _permutation_groups(tuple(int(s) for s in sources), n_bits)
        kernel = apply_bit_permutation.for_size(state)
        workers = numba.get_num_threads() if kernel is apply_bit_permutation.threaded else 1
        buffers = self._buffers(workers, 1 << len(groups.group_bits))
        kernel(
            state, sources, groups.group_bits, groups.outside_bits, groups.chunk_bits,
            groups.run_bits, buffers,
        )  # fmt: skip

    def apply_tiled_matrices(self, state, matrices, targets) -> None:
        tile_bits = _tile_bits(state, targets, self.fusion_traits)
        if tile_bits is None:
            super().apply_tiled_matrices(state, matrices, targets)
            return
        matrices = np.ascontiguousarray(matrices, dtype=self.dtype)
        apply_tiled_2x2.for_size(state)(state, matrices, _bits(targets), tile_bits)

    def adjoint_tiled_matrices_step(self, phi, bras, matrices, targets) -> np.ndarray:
        tile_bits = _tile_bits(phi, targets, self.fusion_traits)
        if tile_bits is None:
            return super().adjoint_tiled_matrices_step(phi, bras, matrices, targets)
        adjoints = np.ascontiguousarray(np.conj(np.swapaxes(matrices, -1, -2)), dtype=self.dtype)
        batch, dim = phi.shape
        rows = bras.shape[0] // batch
        per = chunks_per_vector(batch, dim >> tile_bits)
        out = np.empty((batch * per, rows, len(targets), 4), dtype=np.complex128)
        tiled_2x2_step.for_size(bras)(phi, bras, adjoints, _bits(targets), tile_bits, out)
        return out.reshape(batch, per, rows, len(targets), 2, 2).sum(axis=1)

    def _buffers(self, rows: int, amplitudes: int) -> np.ndarray:
        """Scratch rows of this backend's dtype, kept per calling thread and dtype (reused,
        so that each call does not fault in fresh pages; at module level, so that the
        backend, and the device holding it, stay picklable)."""
        kept = _SCRATCH.__dict__.setdefault("buffers", {})
        flat = kept.get(self.dtype)
        if flat is None or flat.size < rows * amplitudes:
            flat = np.empty(rows * amplitudes, dtype=self.dtype)
            kept[self.dtype] = flat
        return flat[: rows * amplitudes].reshape(rows, amplitudes)

    def scale(self, state, factors) -> None:
        state *= np.asarray(factors, dtype=self.dtype).reshape(-1, 1)

    def expval_pauli_words(self, state, words) -> np.ndarray:
        z_masks = _z_masks(words)
        if z_masks is not None and len(words) >= _MANY_WORDS:
            return _z_word_expectations(state, z_masks)
        return super().expval_pauli_words(state, words)

    def braket(self, bra, kets) -> np.ndarray:
        return self.inner_pauli(bra, kets, "", ())  # the empty word: the inner product

    def inner_pauli(self, bra, ket, paulis, targets) -> np.ndarray:
        x_mask, z_mask, i_power = _pauli_masks(paulis, targets)
        out = np.empty(bra.shape[0], dtype=np.complex128)
        if x_mask == 0 and 0 < len(paulis) <= _DIAGONAL_WORD_LETTERS:
            where = _placement(targets)
            inner = inner_diagonal.for_size(bra)
            inner(bra, ket, _z_word_signs(paulis), where.targets, where.fixed_bits, out)
            return out
        where = _placement(_pivot(x_mask))
        inner_pauli.for_size(bra)(bra, ket, x_mask, z_mask, i_power, where.fixed_bits, out)
        return out

    def inner_matrix(self, bra, ket, matrix, targets) -> np.ndarray:
        matrix = np.ascontiguousarray(matrix, dtype=np.complex128)
        out = np.empty(bra.shape[0], dtype=np.complex128)
        where = _placement(targets)
        inner_matrix.for_size(bra)(bra, ket, matrix, where.targets, where.fixed_bits, out)
        return out

    def adjoint_pauli_rotation_step(self, phi, bras, angles, paulis, targets) -> np.ndarray:
        angles = np.ascontiguousarray(angles, dtype=np.float64).reshape(-1)
        out = np.empty(bras.shape[0], dtype=np.complex128)
        x_mask, _, _ = _pauli_masks(paulis, targets)
        where = _placement(targets)
        if len(paulis) == 1 and paulis != "I":
            letter = "IXYZ".index(paulis)
            step = rotation_step_1q.for_size(bras)
            step(phi, bras, angles, letter, int(targets[0]), where.fixed_bits, out)
            return out
        if x_mask == 0 and 0 < len(paulis) <= _DIAGONAL_WORD_LETTERS:
            signs = _z_word_signs(paulis)
            diagonal = _z_rotation_diagonals(angles, paulis)[0]
            step = diagonal_step.for_size(bras)
            step(phi, bras, diagonal, signs, where.targets, where.fixed_bits, out)
            return out
        return super().adjoint_pauli_rotation_step(phi, bras, angles, paulis, targets)

    def apply_z_rotations(self, state, angles, z_masks) -> None:
        plan = _z_rotation_plan(np.asarray(angles, dtype=np.float64), z_masks, state.shape[1])
        apply = apply_z_phases.for_size(state)
        apply(state, plan.counts, plan.low_signs, plan.tables, plan.low)

    def adjoint_z_rotations_step(self, phi, bras, angles, z_masks) -> np.ndarray:
        batch, dim = phi.shape
        rows = bras.shape[0] // batch
        plan = _z_rotation_plan(np.asarray(angles, dtype=np.float64), z_masks, dim)
        blocks = dim >> plan.low
        out = np.empty((batch * blocks, rows, plan.low_signs.shape[0]), dtype=np.complex128)
        step = z_rotations_step.for_size(bras)
        step(phi, bras, plan.counts, plan.low_signs, plan.tables, plan.low, out)
        sums = out.reshape(batch, blocks, rows, -1)[..., plan.low_group]
        return np.einsum("bhrj,jh->brj", sums, plan.high_signs)

    def adjoint_one_qubit_rotations_step(self, phi, bras, angles, paulis, targets) -> np.ndarray:
        angles, letters = _rotation_pair(angles, paulis)
        batch, dim = phi.shape
        rows = bras.shape[0] // batch
        per = chunks_per_vector(batch, dim >> 2)
        partial = np.empty((batch * per, rows, 2), dtype=np.complex128)
        where = _placement(targets)
        step = rotation_pair_step.for_size(bras)
        step(phi, bras, angles, letters, where.targets, where.fixed_bits, partial)
        return partial.reshape(batch, per, rows, 2).sum(axis=1)

    def adjoint_block_step(self, phi, bras, matrices, targets) -> np.ndarray:
        adjoints = np.ascontiguousarray(np.conj(np.swapaxes(matrices, -1, -2)), dtype=self.dtype)
        batch, dim = phi.shape
        rows, d = bras.shape[0] // batch, 1 << len(targets)
        if bras.shape[1] != dim or bras.shape[0] != rows * batch or rows == 0:
            raise ValueError(
                f"adjoint_block_step needs R bras of {dim} amplitudes per vector of phi "
                f"({batch} vectors); got bras of shape {bras.shape}"
            )
        per = chunks_per_vector(batch, dim >> len(targets))
        partial = np.empty((batch * per, rows, d, d), dtype=np.complex128)
        where = _placement(targets)
        if len(targets) == 1:
            step = block_step_1q.for_size(bras)
            step(phi, bras, adjoints, int(targets[0]), partial)
        else:
            step = (block_step_2q if len(targets) == 2 else block_step).for_size(bras)
            step(phi, bras, adjoints, where.targets, where.fixed_bits, partial)
        return partial.reshape(batch, per, rows, d, d).sum(axis=1)

    def concatenate(self, states) -> StateBatch:
        return np.concatenate(states)

    def add_pauli_sum(self, dst, src, words, coefficients) -> None:
        coefficients = np.asarray(coefficients, dtype=np.complex128).reshape(-1)
        z_masks = _z_masks(words)
        if z_masks is not None and len(words) >= _MANY_WORDS:
            block_coefficients, low_signs, low = _z_sum_blocks(z_masks, coefficients, dst.shape[1])
            add = add_z_sum_by_blocks.for_size(dst)
            add(dst, src, block_coefficients, low_signs, low)
            return
        if z_masks is not None:
            add_z_sum.for_size(dst)(dst, src, z_masks.astype(np.uint64), coefficients)
            return
        super().add_pauli_sum(dst, src, words, coefficients)

    def add_scaled(self, dst, src, factors) -> None:
        factors = np.array(factors, dtype=self.dtype, ndmin=1)
        add_scaled.for_size(dst)(dst, src, factors)

    def vectors(self, state, start: int, stop: int) -> StateBatch:
        return state[start:stop]

    def probabilities(self, state, bits) -> np.ndarray:
        out = np.empty((state.shape[0], 1 << len(bits)))
        marginal_probs.for_size(state)(state, _bits(bits), out)
        return out


class _ZRotationPlan(NamedTuple):
    """How the CPU kernels apply commuting Z-word rotations (see _z_rotation_plan)."""

    low: int
    low_signs: np.ndarray  # (G, 2**low): the signs of the G distinct low parts of the words
    low_group: np.ndarray  # (J,): each word's low part among them
    high_signs: np.ndarray  # (J, 2**high): each word's sign on the high bits
    counts: np.ndarray  # (V, G, 2**high): per angle group and low part, the summed high signs
    tables: np.ndarray  # (1 or B, V, 2J + 1): exp(-i theta_v/2 n) for n = -J .. J


def _z_rotation_plan(angles: np.ndarray, z_masks, dim: int) -> _ZRotationPlan:
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
    return _ZRotationPlan(low, low_signs, low_group, high_signs, counts, tables)


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
    low, low_masks, low_group = _split_masks(masks, dim)
    high_signs = _sign_table(masks >> low, dim.bit_length() - 1 - low)
    return low, _sign_table(low_masks, low), low_group, high_signs


_DIAGONAL_WORD_LETTERS = 4
"""Words of Z and I up to this length run as diagonals: a constant factor per inner loop
instead of a parity per amplitude."""


_MANY_WORDS = 4
"""From this many Z words on, their expectation values come from one pass over the state
(see _z_word_expectations) and a weighted sum of them is one diagonal (_z_sum_blocks),
instead of a parity per word and amplitude."""


def _z_masks(words: Sequence[tuple[str, Sequence[int]]]) -> np.ndarray | None:
    """The Z masks of the words if every word is made of Z and I letters, else None."""
    masks = [_pauli_masks(paulis, targets) for paulis, targets in words]
    if any(x_mask for x_mask, _, _ in masks):
        return None
    return np.array([z_mask for _, z_mask, _ in masks], dtype=np.int64)


def _sign_table(masks: np.ndarray, bits: int) -> np.ndarray:
    """table[k, x] = (-1)**popcount(x & masks[k]) for x < 2**bits, float64."""
    x = np.arange(1 << bits, dtype=np.int64)
    return 1.0 - 2.0 * (np.bitwise_count(masks[:, None] & x[None, :]) & 1)


def _split_masks(z_masks: np.ndarray, dim: int) -> tuple[int, np.ndarray, np.ndarray]:
    """(low, low masks, group): the index split into its ``low`` lowest bits and the rest,
    and the distinct low parts of the masks with each mask's position among them. A Z-word
    sign factors over the split: (-1)**|x & m| = (-1)**|x_hi & m_hi| (-1)**|x_lo & m_lo|."""
    low = (dim.bit_length() - 1) // 2
    low_masks, group = np.unique(z_masks & ((1 << low) - 1), return_inverse=True)
    return low, low_masks, group


def _z_sum_blocks(
    z_masks: np.ndarray, coefficients: np.ndarray, dim: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """The diagonal d[x] = sum_k c_k (-1)**popcount(x & z_masks[k]) of sum_k c_k Z-word_k,
    factored over the split of x into high and low bits: d[h * 2**low + l] =
    sum_g block_coefficients[h, g] low_signs[g, l], g over the distinct low masks. Returns
    (block_coefficients, low_signs, low)."""
    low, low_masks, group = _split_masks(z_masks, dim)
    high_signs = _sign_table(z_masks >> low, dim.bit_length() - 1 - low)
    block_coefficients = np.zeros((high_signs.shape[1], len(low_masks)), dtype=np.complex128)
    for k, g in enumerate(group):  # no BLAS: its idle threads spin against the kernels'
        block_coefficients[:, g] += coefficients[k] * high_signs[k]
    return block_coefficients, _sign_table(low_masks, low), low


def _z_word_expectations(state: np.ndarray, z_masks: np.ndarray) -> np.ndarray:
    """<psi_b|Z-word_k|psi_b>, (B, K): one pass sums each block of low bits against the low
    signs of the distinct low masks; the high signs then combine the blocks."""
    batch, dim = state.shape
    low, low_masks, group = _split_masks(z_masks, dim)
    high = dim.bit_length() - 1 - low
    sums = np.empty((batch, 1 << high, len(low_masks)))
    low_sign_sums.for_size(state)(state, _sign_table(low_masks, low), low, sums)
    high_signs = _sign_table(z_masks >> low, high)
    return (sums[:, :, group] * high_signs.T[None]).sum(axis=1)


@functools.cache
def _z_word_signs(paulis: str) -> np.ndarray:
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


def _pivot(x_mask: int) -> tuple[int, ...]:
    """The bit whose zero half enumerates the amplitude pairs (i, i ^ x_mask)."""
    return (x_mask.bit_length() - 1,) if x_mask else ()
