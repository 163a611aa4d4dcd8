"""CPU backend: numpy state vectors updated in place by numba kernels (``_cpu_kernels``):
the kernels' dispatch, the measurements and the scratch memory of ``CPUBackend``; the
kernels' arguments are ``cpu_arguments``', its gate sequences ``cpu_sequences``'."""

import threading
from collections.abc import Callable, Sequence

import numba
import numpy as np

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
from .base import Backend
from .cpu_arguments import (
    DIAGONAL_WORD_LETTERS,
    MANY_WORDS,
    int64_bits,
    pauli_masks_of,
    permutation_groups_of,
    pivot_bits,
    placement_of,
    product_table,
    rotation_pair_arguments,
    sign_table,
    split_masks,
    tile_bits_for,
    z_masks_of,
    z_rotation_diagonals,
    z_rotation_plan,
    z_sum_blocks,
    z_word_signs,
)
from .cpu_sequences import (
    PreparedSequence,
    launch_sequence,
    pauli_word_rows,
    prepared_sequence_of,
)
from .gate_sequence import GateSequence
from .host import free_host_bytes
from .primitives import FusionTraits, StateBatch

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
    # at most 16 bits (PERMUTATION_GROUP_BITS): runs of up to 10 moved bits.
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


_SCRATCH = threading.local()
"""Each thread's buffers of ``apply_bit_permutation``, by dtype (``CPUBackend._buffers``)."""


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
    threads over the vectors from ``THREADED_SEQUENCE_AMPLITUDES``): the sequence path
    took 0.20-0.37x the gate-by-gate time on one vector of 9-12 qubits, 0.47x at 13 and
    0.94x at 14; on batches of 8 qubits 0.14x at 8 vectors, 0.34x at 32, 0.49x at 64 (W3),
    0.79x at 1024; 0.38-0.43x on 256-1024 vectors of 4 qubits, 0.85-0.92x on 65536
    amplitudes of 10-13-qubit vectors."""

    def prepare_sequence(self, sequence: GateSequence) -> PreparedSequence:
        return prepared_sequence_of(sequence)

    def _sequence_matrices(self, prepared: PreparedSequence, matrices: Sequence) -> np.ndarray:
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
        launch_sequence(
            run_sequence,
            state,
            prepared.ops,
            prepared.bits,
            self._sequence_matrices(prepared, matrices),
            np.ascontiguousarray(angles, dtype=np.float64),
        )

    def sweep_sequence(self, phi, bras, prepared, angles, matrices, n_columns) -> np.ndarray:
        out = np.zeros((phi.shape[0], bras.shape[0] // phi.shape[0], n_columns))
        launch_sequence(
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
        launch_sequence(run_sequence_measured, state, *arguments, values)
        return values

    def sweep_sequence_from_words(
        self, phi, prepared, angles, matrices, words, coefficients, n_columns
    ) -> np.ndarray:
        """One kernel call: the bras built from the words, and the sweep."""
        batch, rows, _ = coefficients.shape
        out = np.zeros((batch, rows, n_columns))
        launch_sequence(
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
        launch_sequence(
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
        kernel (one vector: what ``launch_sequence`` runs for it)."""
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
        word_rows = pauli_word_rows(tuple(words))
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

    def _measured_sequence(self, prepared: PreparedSequence, angles, matrices, words) -> tuple:
        """The arguments that ``run_sequence_measured`` and ``sweep_sequence_from_words``
        take after their state: the sequence with the call's matrices, the angles, the
        words as table rows."""
        return (
            prepared.ops,
            prepared.bits,
            self._sequence_matrices(prepared, matrices),
            np.ascontiguousarray(angles, dtype=np.float64),
            pauli_word_rows(tuple(words)),
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
        low = product_table(factors[:, :low_count]).astype(self.dtype)
        high = product_table(factors[:, low_count:]).astype(self.dtype)
        zero_bits = int64_bits(sorted(set(range(n_qubits)) - set(bits)))
        product_state.for_size(state)(state, low, high, low_count, zero_bits)
        return state

    def to_host(self, state: StateBatch) -> np.ndarray:
        return state.astype(np.complex128)

    def copy(self, state: StateBatch) -> StateBatch:
        return state.copy()

    def apply_matrix(self, state, matrices, targets, controls=(), control_values=()) -> None:
        matrices = np.ascontiguousarray(matrices, dtype=self.dtype)
        where = placement_of(targets, controls, control_values)
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
        where = placement_of(targets, controls, control_values)
        apply = apply_diagonal.for_size(state)
        apply(state, diagonals, where.targets, where.fixed_bits, where.control_mask)

    def apply_pauli_rotation(
        self, state, angles, paulis, targets, controls=(), control_values=()
    ) -> None:
        angles = np.ascontiguousarray(angles, dtype=np.float64).reshape(-1)
        if len(paulis) == 1:
            where = placement_of(targets, controls, control_values)
            letter = "IXYZ".index(paulis)
            apply = apply_1q_rotation.for_size(state)
            apply(state, angles, letter, int(targets[0]), where.fixed_bits, where.control_mask)
            return
        x_mask, z_mask, i_power = pauli_masks_of(paulis, targets)
        if x_mask == 0 and len(paulis) <= DIAGONAL_WORD_LETTERS:
            diagonals = z_rotation_diagonals(angles, paulis)
            self.apply_diagonal(state, diagonals, targets, controls, control_values)
            return
        where = placement_of(pivot_bits(x_mask), controls, control_values)
        apply = apply_pauli_rotation.for_size(state)
        apply(state, angles, x_mask, z_mask, i_power, where.fixed_bits, where.control_mask)

    def apply_one_qubit_rotations(self, state, angles, paulis, targets) -> None:
        angles, letters = rotation_pair_arguments(angles, paulis)
        where = placement_of(targets)
        apply = apply_rotation_pair.for_size(state)
        apply(state, angles, letters, where.targets, where.fixed_bits)

    def apply_pauli(self, state, paulis, targets, controls=(), control_values=()) -> None:
        x_mask, z_mask, i_power = pauli_masks_of(paulis, targets)
        if x_mask == 0 and 0 < len(paulis) <= DIAGONAL_WORD_LETTERS:
            signs = z_word_signs(paulis)[None]
            self.apply_diagonal(state, signs, targets, controls, control_values)
            return
        where = placement_of(pivot_bits(x_mask), controls, control_values)
        apply = apply_pauli.for_size(state)
        apply(state, x_mask, z_mask, i_power, where.fixed_bits, where.control_mask)

    def apply_bit_permutation(self, state, sources) -> None:
        n_bits = state.shape[1].bit_length() - 1
        sources = np.array(sources, dtype=np.int64)  # a writeable copy: one compilation
        groups = permutation_groups_of(tuple(int(s) for s in sources), n_bits)
        kernel = apply_bit_permutation.for_size(state)
        workers = numba.get_num_threads() if kernel is apply_bit_permutation.threaded else 1
        buffers = self._buffers(workers, 1 << len(groups.group_bits))
        kernel(
            state, sources, groups.group_bits, groups.outside_bits, groups.chunk_bits,
            groups.run_bits, buffers,
        )  # fmt: skip

    def apply_tiled_matrices(self, state, matrices, targets) -> None:
        tile_bits = tile_bits_for(state, targets, self.fusion_traits)
        if tile_bits is None:
            super().apply_tiled_matrices(state, matrices, targets)
            return
        matrices = np.ascontiguousarray(matrices, dtype=self.dtype)
        apply_tiled_2x2.for_size(state)(state, matrices, int64_bits(targets), tile_bits)

    def adjoint_tiled_matrices_step(self, phi, bras, matrices, targets) -> np.ndarray:
        tile_bits = tile_bits_for(phi, targets, self.fusion_traits)
        if tile_bits is None:
            return super().adjoint_tiled_matrices_step(phi, bras, matrices, targets)
        adjoints = np.ascontiguousarray(np.conj(np.swapaxes(matrices, -1, -2)), dtype=self.dtype)
        batch, dim = phi.shape
        rows = bras.shape[0] // batch
        per = chunks_per_vector(batch, dim >> tile_bits)
        out = np.empty((batch * per, rows, len(targets), 4), dtype=np.complex128)
        tiled_2x2_step.for_size(bras)(phi, bras, adjoints, int64_bits(targets), tile_bits, out)
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
        z_masks = z_masks_of(words)
        if z_masks is not None and len(words) >= MANY_WORDS:
            return _z_word_expectations(state, z_masks)
        return super().expval_pauli_words(state, words)

    def braket(self, bra, kets) -> np.ndarray:
        return self.inner_pauli(bra, kets, "", ())  # the empty word: the inner product

    GRAM_ROWS = 64
    """The bras ``gram`` conjugates at a time (its temporary, in vectors)."""

    def gram(self, bras, kets) -> np.ndarray:
        """BLAS products G = conj(bras) kets^T, ``GRAM_ROWS`` bras at a time."""
        out = np.empty((bras.shape[0], kets.shape[0]), dtype=np.complex128)
        for start in range(0, bras.shape[0], self.GRAM_ROWS):
            rows = bras[start : start + self.GRAM_ROWS]
            out[start : start + rows.shape[0]] = np.conj(rows) @ kets.T
        return out

    def gram_scratch_vectors(self, bras: int, kets: int) -> int:
        return min(bras, self.GRAM_ROWS)

    def inner_pauli(self, bra, ket, paulis, targets) -> np.ndarray:
        x_mask, z_mask, i_power = pauli_masks_of(paulis, targets)
        out = np.empty(bra.shape[0], dtype=np.complex128)
        if x_mask == 0 and 0 < len(paulis) <= DIAGONAL_WORD_LETTERS:
            where = placement_of(targets)
            inner = inner_diagonal.for_size(bra)
            inner(bra, ket, z_word_signs(paulis), where.targets, where.fixed_bits, out)
            return out
        where = placement_of(pivot_bits(x_mask))
        inner_pauli.for_size(bra)(bra, ket, x_mask, z_mask, i_power, where.fixed_bits, out)
        return out

    def inner_matrix(self, bra, ket, matrix, targets) -> np.ndarray:
        matrix = np.ascontiguousarray(matrix, dtype=np.complex128)
        out = np.empty(bra.shape[0], dtype=np.complex128)
        where = placement_of(targets)
        inner_matrix.for_size(bra)(bra, ket, matrix, where.targets, where.fixed_bits, out)
        return out

    def adjoint_pauli_rotation_step(self, phi, bras, angles, paulis, targets) -> np.ndarray:
        angles = np.ascontiguousarray(angles, dtype=np.float64).reshape(-1)
        out = np.empty(bras.shape[0], dtype=np.complex128)
        x_mask, _, _ = pauli_masks_of(paulis, targets)
        where = placement_of(targets)
        if len(paulis) == 1 and paulis != "I":
            letter = "IXYZ".index(paulis)
            step = rotation_step_1q.for_size(bras)
            step(phi, bras, angles, letter, int(targets[0]), where.fixed_bits, out)
            return out
        if x_mask == 0 and 0 < len(paulis) <= DIAGONAL_WORD_LETTERS:
            signs = z_word_signs(paulis)
            diagonal = z_rotation_diagonals(angles, paulis)[0]
            step = diagonal_step.for_size(bras)
            step(phi, bras, diagonal, signs, where.targets, where.fixed_bits, out)
            return out
        return super().adjoint_pauli_rotation_step(phi, bras, angles, paulis, targets)

    def apply_z_rotations(self, state, angles, z_masks) -> None:
        plan = z_rotation_plan(np.asarray(angles, dtype=np.float64), z_masks, state.shape[1])
        apply = apply_z_phases.for_size(state)
        apply(state, plan.counts, plan.low_signs, plan.tables, plan.low)

    def adjoint_z_rotations_step(self, phi, bras, angles, z_masks) -> np.ndarray:
        batch, dim = phi.shape
        rows = bras.shape[0] // batch
        plan = z_rotation_plan(np.asarray(angles, dtype=np.float64), z_masks, dim)
        blocks = dim >> plan.low
        out = np.empty((batch * blocks, rows, plan.low_signs.shape[0]), dtype=np.complex128)
        step = z_rotations_step.for_size(bras)
        step(phi, bras, plan.counts, plan.low_signs, plan.tables, plan.low, out)
        sums = out.reshape(batch, blocks, rows, -1)[..., plan.low_group]
        return np.einsum("bhrj,jh->brj", sums, plan.high_signs)

    def adjoint_one_qubit_rotations_step(self, phi, bras, angles, paulis, targets) -> np.ndarray:
        angles, letters = rotation_pair_arguments(angles, paulis)
        batch, dim = phi.shape
        rows = bras.shape[0] // batch
        per = chunks_per_vector(batch, dim >> 2)
        partial = np.empty((batch * per, rows, 2), dtype=np.complex128)
        where = placement_of(targets)
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
        where = placement_of(targets)
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
        z_masks = z_masks_of(words)
        if z_masks is not None and len(words) >= MANY_WORDS:
            block_coefficients, low_signs, low = z_sum_blocks(z_masks, coefficients, dst.shape[1])
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
        marginal_probs.for_size(state)(state, int64_bits(bits), out)
        return out


def _z_word_expectations(state: np.ndarray, z_masks: np.ndarray) -> np.ndarray:
    """<psi_b|Z-word_k|psi_b>, (B, K): one pass sums each block of low bits against the low
    signs of the distinct low masks; the high signs then combine the blocks."""
    batch, dim = state.shape
    low, low_masks, group = split_masks(z_masks, dim)
    high = dim.bit_length() - 1 - low
    sums = np.empty((batch, 1 << high, len(low_masks)))
    low_sign_sums.for_size(state)(state, sign_table(low_masks, low), low, sums)
    high_signs = sign_table(z_masks >> low, high)
    return (sums[:, :, group] * high_signs.T[None]).sum(axis=1)
