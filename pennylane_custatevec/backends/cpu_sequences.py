"""The CPU backend's gate sequences: a ``GateSequence`` encoded as the tables that
``_cpu_kernels.run_sequence`` and its siblings take (``PreparedSequence``), Pauli words as
rows of such a table, and the launch of a sequence kernel (threaded over the vectors, one
launch at a time)."""

import functools
import threading
from typing import NamedTuple

import numpy as np

from . import _cpu_kernels as kernels
from .cpu_arguments import I_POWERS, control_mask_of, int64_bits, pauli_masks_of
from .gate_sequence import DenseEntry, DerivativeEntry, GateSequence, RotationEntry


class PreparedSequence(NamedTuple):
    """A ``GateSequence`` as ``_cpu_kernels.run_sequence`` takes it (see there)."""

    ops: np.ndarray
    bits: np.ndarray
    matrices: np.ndarray
    """The constant matrices; the call's are written into a copy at ``slot_starts``."""
    slot_starts: tuple[int, ...]
    slot_sizes: tuple[int, ...]


def prepared_sequence_of(sequence: GateSequence) -> PreparedSequence:
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
        x_mask, z_mask, i_power = pauli_masks_of(entry.paulis, entry.targets)
        row[kernels.SEQ_X_MASK] = x_mask
        row[kernels.SEQ_Z_MASK] = z_mask
        row[kernels.SEQ_I_POWER] = I_POWERS.index(i_power)
        row[kernels.SEQ_CONTROL_MASK] = control_mask_of(entry.controls, (1,) * len(entry.controls))
        row[kernels.SEQ_CONTROL_VALUE] = control_mask_of(entry.controls, entry.control_values)
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
    return PreparedSequence(
        ops, int64_bits(bits or [0]), matrices, tuple(slot_starts), tuple(slot_sizes)
    )


@functools.lru_cache(maxsize=1024)
def pauli_word_rows(words: tuple) -> np.ndarray:
    """Pauli words (paulis, targets) as rows of a sequence table (``_cpu_kernels``: x and
    z masks, i power), for the kernels that measure or build bras from them."""
    rows = np.zeros((len(words), kernels.SEQ_FIELDS), dtype=np.int64)
    for row, (paulis, targets) in zip(rows, words, strict=True):
        x_mask, z_mask, i_power = pauli_masks_of(paulis, targets)
        row[kernels.SEQ_X_MASK] = x_mask
        row[kernels.SEQ_Z_MASK] = z_mask
        row[kernels.SEQ_I_POWER] = I_POWERS.index(i_power)
    rows.setflags(write=False)
    return rows


_SEQUENCE_MAX_BITS = 6
"""The widest dense gate of a gate sequence (the kernels' scratch holds 64 amplitudes)."""


_THREADED_SEQUENCES = threading.Lock()
"""Held while a threaded sequence kernel runs: numba's workqueue threading layer (the one
it falls back to without OpenMP or TBB) is not safe for parallel launches from several
Python threads at once, and small circuits are the likeliest to be run from threads (a
fresh-clone CI run hung with unguarded threaded sequences)."""


THREADED_SEQUENCE_AMPLITUDES = 1 << 11
"""Below the per-gate kernels' threshold (``_cpu_kernels._PARALLEL_THRESHOLD``): a sequence
call wakes the threads once for all its gates. Measured on the step of
``CPUBackend.sequence_amplitudes`` (``benchmarks/sequence_sizes.py`` with the threshold
edited; interleaved, best of 7), threads from 2**11 against
from 2**14 amplitudes: 0.62 against 0.38 ms on 8 vectors of 8 qubits, 1.05 against 0.55 ms
on 16, 1.98 against 0.95 ms on 32, 3.6 against 1.2 ms on 256 vectors of 4 qubits."""


def launch_sequence(kernel: kernels.Kernel, state: np.ndarray, *arguments) -> None:
    """``kernel`` on ``state`` (a batch of vectors first): threaded, a thread taking whole
    vectors, for batches of several vectors of ``THREADED_SEQUENCE_AMPLITUDES`` amplitudes
    in all, launched under ``_THREADED_SEQUENCES``; else serial."""
    if state.shape[0] > 1 and state.size >= THREADED_SEQUENCE_AMPLITUDES:
        with _THREADED_SEQUENCES:
            kernel.threaded(state, *arguments)
    else:
        kernel.serial(state, *arguments)
