"""Pauli-word matrices in the backends' bit order (a pure helper, no state memory)."""

import functools

import numpy as np

PAULI_2X2 = {
    "I": np.eye(2),
    "X": np.array([[0, 1], [1, 0]]),
    "Y": np.array([[0, -1j], [1j, 0]]),
    "Z": np.diag([1, -1]),
}


@functools.lru_cache(maxsize=256)
def pauli_word_matrix(paulis: str) -> np.ndarray:
    """Dense matrix of a Pauli word, letter j acting on bit j of the matrix index (cached:
    read-only)."""
    matrix = np.ones((1, 1), dtype=np.complex128)
    for letter in paulis:
        matrix = np.kron(PAULI_2X2[letter], matrix)
    matrix.flags.writeable = False
    return matrix
