"""The backend protocol: the only layer that owns state-vector memory.

A backend holds a *batch* of ``B`` state vectors of ``n`` qubits in one allocation
(``B`` circuits that share a structure, or the ``B`` entries of a broadcast). The
algorithms above (simulate, measure) call these methods and never touch the memory.

Conventions, chosen to be cuStateVec's so that the GPU backend passes them through:

* state index bits are little-endian: bit 0 is the least significant bit of the index;
* ``targets[j]`` is the state bit that becomes bit ``j`` of a matrix (or diagonal)
  index, so a ``2**k x 2**k`` matrix acts on ``targets`` in that order;
* ``controls[i]`` must equal ``control_values[i]`` for the gate to act;
* batched data (``matrices``, ``diagonals``, ``angles``, ``factors``) has a leading axis
  of length 1 (the same for every vector) or ``B`` (one per vector);
* Pauli words are strings over ``"IXYZ"``, letter ``j`` acting on ``targets[j]``.
"""

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

StateBatch = Any
"""A backend's handle on a batch of state vectors (a numpy or cupy array, shape (B, 2**n))."""


class Backend(Protocol):
    """Operations on a batch of state vectors, in the conventions of this module."""

    name: str
    dtype: np.dtype
    block_costs: tuple[float, ...] | None
    """The time of applying a dense block on w bits relative to one native gate, indexed
    by w (0 .. 6), for the fusion planner; None: a block costs one pass whatever its width
    (fuse greedily)."""
    fuses_z_rotations: bool
    """Whether fusion gathers runs of commuting Z-word rotations (QAOA cost layers) into
    one Z_ROTATIONS instruction for this backend."""
    rotations_per_pass: int
    """How many one-qubit Pauli rotations on distinct bits fusion gathers into one
    ROTATIONS instruction (``apply_rotations``); below 2, none."""
    min_fused_amplitudes: int
    """Batches of fewer amplitudes (vectors x 2**n) run unfused: there, building blocks
    costs more host time than the kernel passes they save."""
    min_product_state_amplitudes: int
    """Batches of fewer amplitudes start from |0...0> and apply their leading one-qubit
    gates one by one: there, tabulating the product state costs more host time than the
    kernel passes it saves."""

    sample_host_bytes: int
    """Host bytes that ``sample`` allocates at most per shot and state vector (its random
    numbers and outcomes, with their temporaries), for the memory check before sampling."""

    def available_bytes(self) -> int:
        """Memory that new state vectors may use now."""

    def available_host_bytes(self) -> int:
        """Host memory that new host arrays (samples) may use now."""

    def scratch_vectors(self, kets: int, bras: int, reduction: bool) -> int:
        """The most state vectors the backend allocates as temporaries inside one call on
        ``kets`` kets and ``bras`` bras, for the memory checks of the adjoint sweeps: an
        inner product (``inner_pauli``, ``inner_matrix``, ``adjoint_rotation_step``) or
        ``add_scaled`` (``kets`` its source vectors), or with ``reduction`` one of the
        deferred sweep's steps (``adjoint_block_step``, ``adjoint_z_rotations_step``,
        ``adjoint_rotations_step``)."""

    def zero_state(self, n_qubits: int, batch_size: int) -> StateBatch:
        """A new batch, every vector |0...0>."""

    def from_host(self, vectors: np.ndarray) -> StateBatch:
        """A new batch holding ``vectors`` (shape (B, 2**n), any complex dtype)."""

    def product_state(self, n_qubits: int, factors: np.ndarray, bits: Sequence[int]) -> StateBatch:
        """A new batch of product states: in vector b, bit ``bits[j]`` (ascending) holds the
        one-qubit state ``factors[b, j]`` (complex, shape (B, k, 2)) and every other bit
        is |0>."""

    def to_host(self, state: StateBatch) -> np.ndarray:
        """The amplitudes as a complex128 numpy array of shape (B, 2**n)."""

    def copy(self, state: StateBatch) -> StateBatch:
        """An independent copy of the batch."""

    def vectors(self, state: StateBatch, start: int, stop: int) -> StateBatch:
        """Vectors ``start .. stop-1`` of the batch as a batch that shares their memory."""

    def apply_matrix(
        self,
        state: StateBatch,
        matrices: np.ndarray,
        targets: Sequence[int],
        controls: Sequence[int] = (),
        control_values: Sequence[int] = (),
    ) -> None:
        """psi <- M psi with M of shape (1 or B, 2**k, 2**k) acting on ``targets``."""

    def apply_diagonal(
        self,
        state: StateBatch,
        diagonals: np.ndarray,
        targets: Sequence[int],
        controls: Sequence[int] = (),
        control_values: Sequence[int] = (),
    ) -> None:
        """psi <- diag(d) psi with d of shape (1 or B, 2**k) acting on ``targets``."""

    def apply_pauli_rotation(
        self,
        state: StateBatch,
        angles: np.ndarray,
        paulis: str,
        targets: Sequence[int],
        controls: Sequence[int] = (),
        control_values: Sequence[int] = (),
    ) -> None:
        """psi <- exp(-i angle/2 P) psi, PennyLane's sign; ``angles`` of shape (1 or B,)."""

    def apply_z_rotations(
        self, state: StateBatch, angles: np.ndarray, z_masks: Sequence[int]
    ) -> None:
        """psi <- prod_j exp(-i angles[:, j]/2 Z_j) psi, Z_j the word of Z letters on the
        bits set in ``z_masks[j]``; ``angles`` of shape (1 or B, J). The rotations commute:
        a backend may apply them in one pass."""

    def apply_rotations(
        self, state: StateBatch, angles: np.ndarray, paulis: str, targets: Sequence[int]
    ) -> None:
        """psi <- prod_j exp(-i angles[:, j]/2 P_j) psi for one-qubit rotations on the
        distinct bits ``targets[j]``, P_j the letter ``paulis[j]`` (X, Y or Z); ``angles``
        of shape (1 or B, m), 2 <= m <= ``rotations_per_pass``. They commute: a backend
        applies them in one pass."""

    def apply_pauli(
        self,
        state: StateBatch,
        paulis: str,
        targets: Sequence[int],
        controls: Sequence[int] = (),
        control_values: Sequence[int] = (),
    ) -> None:
        """psi <- P psi for the Pauli word P (X, CNOT, Toffoli, CZ, ...)."""

    def scale(self, state: StateBatch, factors: np.ndarray) -> None:
        """psi_b <- factors[b] psi_b (global phases, renormalisation)."""

    def expval_pauli(self, state: StateBatch, paulis: str, targets: Sequence[int]) -> np.ndarray:
        """<psi_b|P|psi_b> for each vector, float64 of shape (B,)."""

    def expval_pauli_words(
        self, state: StateBatch, words: Sequence[tuple[str, Sequence[int]]]
    ) -> np.ndarray:
        """<psi_b|P_k|psi_b> for each vector and each Pauli word (paulis, targets), float64
        of shape (B, K): a backend may measure all the words in one pass."""

    def expval_matrix(
        self, state: StateBatch, matrix: np.ndarray, targets: Sequence[int]
    ) -> np.ndarray:
        """<psi_b|M|psi_b> for each vector, complex128 of shape (B,)."""

    def inner_pauli(
        self, bra: StateBatch, ket: StateBatch, paulis: str, targets: Sequence[int]
    ) -> np.ndarray:
        """<bra_b|P|ket_b> for each bra, complex128 of shape (B,); a batch of one ket
        serves every bra."""

    def inner_matrix(
        self, bra: StateBatch, ket: StateBatch, matrix: np.ndarray, targets: Sequence[int]
    ) -> np.ndarray:
        """<bra_b|M|ket_b> for each bra, complex128 of shape (B,); one ket serves every bra."""

    def adjoint_rotation_step(
        self,
        phi: StateBatch,
        bras: StateBatch,
        angles: np.ndarray,
        paulis: str,
        targets: Sequence[int],
    ) -> np.ndarray:
        """One step of the adjoint sweep back through exp(-i angle/2 P) (no controls):
        returns <bra_r|P|phi> for every bra (complex128, shape (R,)), then applies
        exp(+i angle/2 P) to ``phi`` (one vector) and to every bra. ``angles`` has shape
        (1,). A backend may fuse the three into one pass over the vectors."""

    def adjoint_block_step(
        self, phi: StateBatch, bras: StateBatch, matrices: np.ndarray, targets: Sequence[int]
    ) -> Any:
        """One step of the deferred adjoint sweep back through a fused block M on ``targets``
        (no controls), ``matrices`` M of shape (1 or B, d, d). ``phi`` has B vectors and
        ``bras`` R per vector (bra r of vector b at row b*R + r). Applies M_b^dagger to
        phi_b and to its bras and returns the reduction

            T[b, r, a, c] = sum_rest conj(bra_{b,r}[a, rest]) phi_b'[c, rest]

        of each bra before the step with phi after it (a, c: the block's matrix index),
        shape (B, R, d, d), complex128, as a backend array: it stays in the backend's
        memory until ``gather``. A backend may fuse the three into one pass."""

    def adjoint_z_rotations_step(
        self, phi: StateBatch, bras: StateBatch, angles: np.ndarray, z_masks: Sequence[int]
    ) -> Any:
        """One step of the deferred sweep back through the commuting rotations of
        ``apply_z_rotations``: returns <bra_{b,r}|Z_j|phi_b> for every bra and word,
        complex128 of shape (B, R, J), as a backend array (see ``gather``); then applies
        the inverse rotations to phi and to the bras (bras as in ``adjoint_block_step``)."""

    def adjoint_rotations_step(
        self,
        phi: StateBatch,
        bras: StateBatch,
        angles: np.ndarray,
        paulis: str,
        targets: Sequence[int],
    ) -> Any:
        """One step of the deferred sweep back through the rotations of
        ``apply_rotations``: returns <bra_{b,r}|P_j|phi_b> for every bra and rotation,
        complex128 of shape (B, R, m), as a backend array (see ``gather``); then applies
        the inverse rotations to phi and to the bras (bras as in ``adjoint_block_step``)."""

    def gather(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        """Backend arrays (the reductions of a sweep) as numpy arrays, in one transfer."""

    def concatenate(self, states: Sequence[StateBatch]) -> StateBatch:
        """A new batch holding the vectors of ``states`` one batch after the other."""

    def add_pauli_sum(
        self,
        dst: StateBatch,
        src: StateBatch,
        words: Sequence[tuple[str, Sequence[int]]],
        coefficients: np.ndarray,
    ) -> None:
        """dst_b <- dst_b + sum_k coefficients[k] P_k src_b for the Pauli words (paulis,
        targets); ``src`` ends unchanged (a backend may apply each word to it in place and
        undo it: P P = 1 exactly). One src vector serves every dst."""

    def add_scaled(self, dst: StateBatch, src: StateBatch, factors: np.ndarray) -> None:
        """dst_b <- dst_b + factors[b] src_b; one src vector or factor serves every dst."""

    def probabilities(self, state: StateBatch, bits: Sequence[int]) -> np.ndarray:
        """Marginal probabilities, float64 (B, 2**k); bit j of the outcome is state bit bits[j]."""

    def sample(
        self, state: StateBatch, bits: Sequence[int], shots: int, rng: np.random.Generator
    ) -> np.ndarray:
        """``shots`` outcomes per vector, int64 (B, shots), outcome bits as in probabilities."""
