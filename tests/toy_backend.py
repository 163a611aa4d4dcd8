"""A toy backend for the tests: only the abstract primitives of ``backends.base.Backend``,
in plain numpy, by index arithmetic on the flat state vectors (slow, small registers).

Everything else (product states, runs of rotations, expectation values, inner products
with operators, Pauli sums, sampling, the adjoint sweeps' steps) comes from the base
class's default compositions: the backend contract suite (test_backend_contract.py) runs
it with the real backends, and a QNode runs on it through the device end to end.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pennylane_custatevec.backends.base import Backend
from pennylane_custatevec.backends.host import free_host_bytes
from pennylane_custatevec.backends.primitives import StateBatch

_PAULI = {
    "I": np.eye(2, dtype=complex),
    "X": np.array([[0, 1], [1, 0]], dtype=complex),
    "Y": np.array([[0, -1j], [1j, 0]]),
    "Z": np.diag([1.0 + 0j, -1.0]),
}


class ToyBackend(Backend):
    """State vectors as numpy arrays (B, 2**n); every gate a gather and a weighted sum."""

    name = "toy"

    def __init__(self, dtype: np.dtype = np.complex128):
        self.dtype = np.dtype(dtype)

    def available_bytes(self) -> int:
        return free_host_bytes()

    def available_host_bytes(self) -> int:
        return free_host_bytes()

    def scratch_vectors(self, kets: int, bras: int, reduction: bool) -> int:
        # the compositions copy their kets; a gate here builds its result (d times the
        # batch, d <= 2**6) before writing it back
        return kets + 64 * max(kets, bras)

    def zero_state(self, n_qubits: int, batch_size: int) -> StateBatch:
        state = np.zeros((batch_size, 1 << n_qubits), dtype=self.dtype)
        state[:, 0] = 1.0
        return state

    def from_host(self, vectors: np.ndarray) -> StateBatch:
        return np.array(vectors, dtype=self.dtype, ndmin=2, order="C")

    def to_host(self, state: StateBatch) -> np.ndarray:
        return np.array(state, dtype=np.complex128)

    def copy(self, state: StateBatch) -> StateBatch:
        return state.copy()

    def vectors(self, state: StateBatch, start: int, stop: int) -> StateBatch:
        return state[start:stop]

    def concatenate(self, states: Sequence[StateBatch]) -> StateBatch:
        return np.concatenate(list(states))

    def apply_matrix(self, state, matrices, targets, controls=(), control_values=()) -> None:
        """(M psi)[i] = sum_c M[a(i), c] psi[rest(i) | c on the targets] where the controls
        hold; a(i) is i's matrix index (bit j: state bit targets[j])."""
        dim = state.shape[1]
        index = np.arange(dim)
        matrix_index = _matrix_index(index, targets)
        spread = _matrix_index_bits(targets)
        rest = index & ~_mask(targets)
        sources = rest[:, None] | spread[None, :]  # (dim, d): the amplitudes row i reads
        matrices = np.broadcast_to(np.asarray(matrices), (state.shape[0],) + matrices.shape[1:])
        rows = matrices[:, matrix_index, :]  # (B, dim, d)
        result = (rows * state[:, sources]).sum(axis=-1)
        active = _active(index, controls, control_values)
        state[:, active] = result[:, active]

    def apply_diagonal(self, state, diagonals, targets, controls=(), control_values=()) -> None:
        index = np.arange(state.shape[1])
        factors = np.asarray(diagonals)[:, _matrix_index(index, targets)]
        active = _active(index, controls, control_values)
        state[:, active] *= factors[:, active]

    def apply_pauli(self, state, paulis, targets, controls=(), control_values=()) -> None:
        self.apply_matrix(state, _word(paulis)[None], targets, controls, control_values)

    def apply_pauli_rotation(
        self, state, angles, paulis, targets, controls=(), control_values=()
    ) -> None:
        half = 0.5 * np.asarray(angles, dtype=np.float64).reshape(-1, 1, 1)
        word = _word(paulis)
        matrices = np.cos(half) * np.eye(len(word)) - 1j * np.sin(half) * word
        self.apply_matrix(state, matrices, targets, controls, control_values)

    def scale(self, state, factors) -> None:
        state *= np.asarray(factors).reshape(-1, 1)

    def add_scaled(self, dst, src, factors) -> None:
        dst += np.asarray(factors).reshape(-1, 1) * src

    def braket(self, bra, kets) -> np.ndarray:
        return np.einsum("bi,bi->b", bra.conj(), np.broadcast_to(kets, bra.shape)).astype(
            np.complex128
        )

    def probabilities(self, state, bits) -> np.ndarray:
        outcomes = _matrix_index(np.arange(state.shape[1]), bits)
        weights = np.abs(state.astype(np.complex128)) ** 2
        return np.stack([np.bincount(outcomes, w, minlength=1 << len(bits)) for w in weights])


def _mask(bits: Sequence[int]) -> int:
    return sum(1 << int(bit) for bit in bits)


def _matrix_index(index: np.ndarray, bits: Sequence[int]) -> np.ndarray:
    """Each state index's matrix index on ``bits`` (bit j of it: state bit bits[j])."""
    out = np.zeros_like(index)
    for j, bit in enumerate(bits):
        out |= ((index >> int(bit)) & 1) << j
    return out


def _matrix_index_bits(bits: Sequence[int]) -> np.ndarray:
    """For each matrix index c on ``bits``: its bits placed at their state bits."""
    c = np.arange(1 << len(bits))
    out = np.zeros_like(c)
    for j, bit in enumerate(bits):
        out |= ((c >> j) & 1) << int(bit)
    return out


def _active(index: np.ndarray, controls, control_values) -> np.ndarray:
    active = np.ones(index.shape, dtype=bool)
    for control, value in zip(controls, control_values, strict=True):
        active &= ((index >> int(control)) & 1) == int(value)
    return active


def _word(paulis: str) -> np.ndarray:
    """A Pauli word's matrix, letter j on bit j of the matrix index."""
    matrix = np.ones((1, 1), dtype=complex)
    for letter in paulis:
        matrix = np.kron(_PAULI[letter], matrix)
    return matrix
