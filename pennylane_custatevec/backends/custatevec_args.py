"""How the cuStateVec backend lays a batch out in GPU memory and turns its arguments into
the library's: one module of small pure functions, so that ``custatevec.py`` holds the
backend's calls alone.

A batch of ``B`` vectors of ``2**n`` amplitudes lies in one allocation, vector ``b`` at
element ``b * stride``. cuStateVec wants every vector that ``compute_expectation`` and the
batched calls read 128-byte aligned on Blackwell GPUs (custatevec.h): with ``stride =
2**n`` that fails for complex64 vectors of up to 3 qubits and complex128 ones of up to 2
(vector 1 starts 64 bytes in, or fewer), so :func:`padded_stride` rounds the stride up to
128 bytes there and the backend holds such a batch as the ``[:, :2**n]`` view of a
``(B, stride)`` allocation. Elsewhere ``stride = 2**n`` and the batch is C-contiguous.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

VECTOR_ALIGNMENT = 128
"""Bytes each vector of a batch starts on (cuStateVec's requirement on Blackwell)."""

SMALL_BATCHED_TARGETS = 4
"""A batch of vectors with a diagonal, Pauli word or rotation on at most this many targets
runs as one ``apply_matrix_batched`` launch of dense matrices; larger operators run their
specialised kernel once per vector (a dense matrix would cost 4**k)."""

NULL = 0
I_POWERS = (1.0 + 0.0j, 1.0j, -1.0 + 0.0j, -1.0j)


def padded_stride(amplitudes: int, dtype: np.dtype) -> int:
    """Elements from one vector of a batch to the next: ``amplitudes`` (a power of two),
    rounded up so that each vector starts on a ``VECTOR_ALIGNMENT`` boundary."""
    return max(amplitudes, VECTOR_ALIGNMENT // np.dtype(dtype).itemsize)


def batch_layout(state) -> tuple[int, int, int]:
    """(number of vectors, index bits, stride in elements) of a batch whose vectors are
    each contiguous (a C-contiguous batch, or a padded one's view)."""
    itemsize = state.dtype.itemsize
    rows, amplitudes = state.shape
    if (amplitudes > 1 and state.strides[1] != itemsize) or (
        rows > 1 and (state.strides[0] % itemsize or state.strides[0] < amplitudes * itemsize)
    ):
        raise ValueError("cuStateVec needs each state vector contiguous, one after the other")
    stride = state.strides[0] // itemsize if rows > 1 else amplitudes
    return rows, amplitudes.bit_length() - 1, stride


def vector_pointers(state) -> list[int]:
    """Device pointers of each vector of the batch."""
    return [state.data.ptr + vector * state.strides[0] for vector in range(state.shape[0])]


def vector_runs(state, shared: bool = True) -> list[tuple[int, int]]:
    """(device pointer, index bits) of each call that applies an operator to a batch: for
    an operator the same for every vector (``shared``), runs of 2**j adjacent vectors of
    2**n amplitudes taken as one vector of n + j index bits (the operator acts on its low
    n bits as on each vector), following the binary digits of the batch size: at most
    log2(B) + 1 calls. Otherwise, and for a padded batch, one call per vector."""
    rows, n_bits, stride = batch_layout(state)
    if not shared or stride != 1 << n_bits:
        return [(pointer, n_bits) for pointer in vector_pointers(state)]
    runs, start = [], 0
    for j in reversed(range(rows.bit_length())):
        if rows >> j & 1:
            runs.append((state.data.ptr + start * stride * state.dtype.itemsize, n_bits + j))
            start += 1 << j
    return runs


def pauli_groups(
    words: Sequence[tuple[str, Sequence[int]]], width: int
) -> tuple[list[tuple[list[int], list[tuple[int, str]]]], list[int]]:
    """Pauli words (letters without I, their bits) grouped for batched expectation calls:
    ([(bits of the group, [(word index, the word on those bits, I where it has no
    letter)])], indices of the words wider than ``width``). A word joins the first group
    whose bits it extends to at most ``width`` bits, widest words first; a word without
    letters (the identity: the norm) has a group of no bits."""
    groups: list[tuple[list[int], list[tuple[int, str, list[int]]]]] = []
    wide = []
    order = sorted(range(len(words)), key=lambda k: -len(words[k][1]))
    for k in order:
        letters, bits = words[k]
        if len(bits) > width:
            wide.append(k)
            continue
        for group_bits, members in groups:
            union = group_bits + [b for b in bits if b not in group_bits]
            if bool(group_bits) == bool(bits) and len(union) <= width:
                group_bits[:] = union
                members.append((k, letters, list(bits)))
                break
        else:
            groups.append((list(bits), [(k, letters, list(bits))]))
    spelled = []
    for group_bits, members in groups:
        on_group = []
        for k, letters, bits in members:
            letter_of = dict(zip(bits, letters, strict=True))
            on_group.append((k, "".join(letter_of.get(b, "I") for b in group_bits)))
        spelled.append((group_bits, on_group))
    return spelled, sorted(wide)


def runs_batched(state, n_targets: int) -> bool:
    return state.shape[0] > 1 and n_targets <= SMALL_BATCHED_TARGETS


def bit_list(bits: Sequence[int]) -> list[int]:
    """Bit positions as the binding's int32 sequence."""
    return [int(bit) for bit in bits]


def control_arguments(controls: Sequence[int], control_values: Sequence[int]) -> tuple:
    """(controls, control bit values) arguments, NULL when there are none."""
    if not len(controls):
        return NULL, NULL
    if len(control_values) != len(controls):
        raise ValueError(
            f"{len(controls)} controls need as many control values, not {len(control_values)}"
        )
    return bit_list(controls), bit_list(control_values)


def control_as_target(diagonals, controls, control_values):
    """A phase d on the subspace where the controls hold, written as a diagonal on the
    first control (d at its control value, 1 at the other) under the other controls."""
    phase = diagonals[:, 0]
    ones = np.ones_like(phase)
    if control_values[0]:
        diagonal = np.stack([ones, phase], axis=1)
    else:
        diagonal = np.stack([phase, ones], axis=1)
    return diagonal, (controls[0],), tuple(controls[1:]), tuple(control_values[1:])


def split_at_bits(n_index_bits: int, targets: Sequence[int]) -> tuple[tuple, dict, list]:
    """A vector's shape with an axis of 2 for each of the ``targets`` and one axis for each
    run of the other bits (at most 2k + 1 axes: within cupy's and numpy's limit of 32
    however large the state), the most significant bits first. Returns (shape, {bit: its
    axis}, the other axes), axes counted from 1 (axis 0 is the batch)."""
    chosen = {int(bit) for bit in targets}
    shape, axis_of, rest = [], {}, []
    run = 0
    for bit in range(n_index_bits - 1, -1, -1):
        if bit in chosen:
            if run:
                rest.append(len(shape) + 1)
                shape.append(1 << run)
                run = 0
            axis_of[bit] = len(shape) + 1
            shape.append(2)
        else:
            run += 1
    if run:
        rest.append(len(shape) + 1)
        shape.append(1 << run)
    return tuple(shape), axis_of, rest


def without_identities(paulis: str, targets: Sequence[int]) -> tuple[str, list[int]]:
    """The letters other than I and their bits (I acts as the identity on its bit)."""
    kept = [
        (letter, int(bit)) for letter, bit in zip(paulis, targets, strict=True) if letter != "I"
    ]
    return "".join(letter for letter, _ in kept), [bit for _, bit in kept]


@functools.cache
def pauli_as_permutation(letters: str) -> tuple[np.ndarray, np.ndarray]:
    """A Pauli word (letter j on bit j of the matrix index) as D P for
    apply_generalized_permutation_matrix: P|a> = |a ^ x> and D = diag(d) with
    d[r] = i**n_Y (-1)**|(r ^ x) & z|, so that (D P psi)[r] = d[r] psi[r ^ x]. The
    permutation is an involution, so the table reads the same in either direction."""
    x_mask = sum(1 << j for j, letter in enumerate(letters) if letter in "XY")
    z_mask = sum(1 << j for j, letter in enumerate(letters) if letter in "YZ")
    source = np.arange(1 << len(letters), dtype=np.int64) ^ x_mask
    parity = np.zeros_like(source)
    for j in range(len(letters)):
        parity ^= (source >> j) & (z_mask >> j) & 1
    diagonal = I_POWERS[letters.count("Y") % 4] * (1.0 - 2.0 * parity)
    diagonal = np.ascontiguousarray(diagonal, dtype=np.complex128)
    for array in (source, diagonal):
        array.flags.writeable = False
    return source, diagonal


def on_host(array) -> bool:
    """Whether a reduction is a host numpy array (a cupy array, or the test double's
    device array, is not)."""
    return type(array) is np.ndarray
