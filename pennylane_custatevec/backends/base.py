"""The backend base class: the only layer that owns state-vector memory.

A backend holds a *batch* of ``B`` state vectors of ``n`` qubits in one allocation
(``B`` circuits that share a structure, or the ``B`` entries of a broadcast). The
algorithms above (simulate, measure) call these methods and never touch the memory.

:class:`Backend` splits the operations in two. The *primitives* (abstract,
``primitives.BackendPrimitives``, with the conventions they follow) are what a backend
must implement: memory queries, allocation and transfer, views, the four gate
applications, ``scale``, ``add_scaled``, the inner product ``braket`` and
``probabilities``. The *compositions* (concrete) are written once here in terms of the
primitives: product states, runs of rotations, expectation values, inner products with
an operator, Pauli sums, sampling and the adjoint sweeps' steps. A backend overrides a
composition only where it has a faster kernel; a new backend is the primitives plus what
it wants faster. The compositions' reductions are host (numpy) arrays; a backend's own
kernels may return backend arrays instead, which ``gather`` brings to the host.

Each backend also carries one ``primitives.FusionTraits``: what the fusion planner (its only
consumer besides the deferred sweep's choice of step) needs to know of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .gate_sequence import GateSequence
from .primitives import BackendPrimitives, StateBatch


class Backend(BackendPrimitives):
    """Operations on a batch of state vectors: the abstract primitives
    (``BackendPrimitives``) and the default compositions built on them."""

    # --- compositions: preparation and runs of rotations ---------------------------------

    def product_state(self, n_qubits: int, factors: np.ndarray, bits: Sequence[int]) -> StateBatch:
        """A new batch of product states: in vector b, bit ``bits[j]`` (ascending) holds the
        one-qubit state ``factors[b, j]`` (complex, shape (B, k, 2)) and every other bit
        is |0>."""
        # each factor enters as a matrix whose first column is the one-qubit state: applied
        # to a bit still |0>, it prepares that state (one matrix application per bit)
        factors = np.asarray(factors, dtype=np.complex128)
        state = self.zero_state(n_qubits, factors.shape[0])
        for j, bit in enumerate(bits):
            matrices = np.zeros((factors.shape[0], 2, 2), dtype=np.complex128)
            matrices[:, :, 0] = factors[:, j]
            self.apply_matrix(state, matrices, (bit,))
        return state

    def apply_z_rotations(
        self, state: StateBatch, angles: np.ndarray, z_masks: Sequence[int]
    ) -> None:
        """psi <- prod_j exp(-i angles[:, j]/2 Z_j) psi, Z_j the word of Z letters on the
        bits set in ``z_masks[j]``; ``angles`` of shape (1 or B, J). The rotations commute:
        a backend may apply them in one pass (the default: one rotation after the other)."""
        angles = np.asarray(angles, dtype=np.float64)
        for j, (paulis, bits) in enumerate(z_words(z_masks)):
            self.apply_pauli_rotation(state, angles[:, j], paulis, bits)

    def apply_one_qubit_rotations(
        self, state: StateBatch, angles: np.ndarray, paulis: str, targets: Sequence[int]
    ) -> None:
        """psi <- prod_j exp(-i angles[:, j]/2 P_j) psi for one-qubit rotations on the
        distinct bits ``targets[j]``, P_j the letter ``paulis[j]`` (X, Y or Z); ``angles``
        of shape (1 or B, m), 2 <= m <= ``fusion_traits.rotations_per_pass``. They commute:
        a backend may apply them in one pass (the default: one rotation after the other)."""
        angles = np.asarray(angles, dtype=np.float64)
        for j, (letter, bit) in enumerate(zip(paulis, targets, strict=True)):
            self.apply_pauli_rotation(state, angles[:, j], letter, (bit,))

    def apply_tiled_matrices(
        self, state: StateBatch, matrices: np.ndarray, targets: Sequence[int]
    ) -> None:
        """psi <- M_{m-1} ... M_1 M_0 psi for 2x2 gates M_j (``matrices`` of shape
        (1 or B, m, 2, 2)) on the bits ``targets[j]`` (a bit may repeat): a tiled run of
        fusion, which makes it for backends whose ``fusion_traits.tile_bits`` is positive. A
        backend may apply it tile by tile, each tile taking every gate while it is in cache
        (one pass over the state for the run); the default applies one gate after the
        other."""
        matrices = np.asarray(matrices)
        for j, bit in enumerate(targets):
            self.apply_matrix(state, matrices[:, j], (bit,))

    def apply_bit_permutation(self, state: StateBatch, sources: np.ndarray) -> None:
        """psi(y) <- psi(src(y)) on every vector, where src(y) is the XOR of ``sources[j]``
        over the set bits j of y, XORed with ``sources[n]`` (int64, shape (n + 1,)): an
        affine map of the index bits over GF(2), such as a run of CNOTs and X gates.
        Fusion makes the instruction only for backends whose ``fusion_traits.permutation_bits``
        is positive. The default gathers every vector through the whole source index, a
        copy of the batch: for backends whose arrays take numpy indices."""
        n = len(sources) - 1
        positions = np.arange(1 << n, dtype=np.int64)
        index = np.full(1 << n, sources[n], dtype=np.int64)
        for j in range(n):
            index[(positions >> j) & 1 == 1] ^= sources[j]
        state[...] = state[:, index]

    # --- compositions: results ----------------------------------------------------------

    gather_results: bool = True
    """Whether ``state_result`` and ``probabilities_result`` return whole results; False
    (a backend split over processes, the device's ``mpi_gather=False``): this process's
    share, which the adjoint method does not differentiate."""

    def state_result(self, state: StateBatch) -> np.ndarray:
        """What ``qml.state()`` returns for the batch: its amplitudes, complex128 (B, 2**n).
        A backend split over processes may return this process's share instead (a
        contiguous range of each vector's indices)."""
        return self.to_host(state)

    def probabilities_result(self, state: StateBatch, bits: Sequence[int]) -> np.ndarray:
        """What ``qml.probs()`` of every bit returns (``bits`` as in ``probabilities``):
        the marginal; a backend split over processes may return its share (as
        ``state_result``)."""
        return self.probabilities(state, bits)

    # --- compositions: expectation values and inner products -----------------------------

    def expval_pauli(self, state: StateBatch, paulis: str, targets: Sequence[int]) -> np.ndarray:
        """<psi_b|P|psi_b> for each vector, float64 of shape (B,)."""
        return np.real(self.inner_pauli(state, state, paulis, targets))

    def expval_pauli_words(
        self, state: StateBatch, words: Sequence[tuple[str, Sequence[int]]]
    ) -> np.ndarray:
        """<psi_b|P_k|psi_b> for each vector and each Pauli word (paulis, targets), float64
        of shape (B, K): a backend may measure all the words in one pass (the default: one
        ``expval_pauli`` per word)."""
        values = [self.expval_pauli(state, paulis, targets) for paulis, targets in words]
        return np.stack(values, axis=1) if values else np.zeros((state.shape[0], 0))

    def expval_matrix(
        self, state: StateBatch, matrix: np.ndarray, targets: Sequence[int]
    ) -> np.ndarray:
        """<psi_b|M|psi_b> for each vector, complex128 of shape (B,)."""
        return self.inner_matrix(state, state, matrix, targets)

    def inner_pauli(
        self, bra: StateBatch, ket: StateBatch, paulis: str, targets: Sequence[int]
    ) -> np.ndarray:
        """<bra_b|P|ket_b> for each bra, complex128 of shape (B,); a batch of one ket
        serves every bra. The default applies P to a copy of the kets."""
        applied = self.copy(ket)
        self.apply_pauli(applied, paulis, targets)
        return self.braket(bra, applied)

    def inner_matrix(
        self, bra: StateBatch, ket: StateBatch, matrix: np.ndarray, targets: Sequence[int]
    ) -> np.ndarray:
        """<bra_b|M|ket_b> for each bra, complex128 of shape (B,); one ket serves every bra.
        The default applies M (shape (d, d)) to a copy of the kets."""
        applied = self.copy(ket)
        self.apply_matrix(applied, np.asarray(matrix)[None], targets)
        return self.braket(bra, applied)

    def add_pauli_sum(
        self,
        dst: StateBatch,
        src: StateBatch,
        words: Sequence[tuple[str, Sequence[int]]],
        coefficients: np.ndarray,
    ) -> None:
        """dst_b <- dst_b + sum_k coefficients[k] P_k src_b for the Pauli words (paulis,
        targets); ``src`` ends unchanged (the default applies each word to it in place and
        undoes it: P P = 1 exactly). One src vector serves every dst."""
        coefficients = np.asarray(coefficients, dtype=np.complex128).reshape(-1)
        for (paulis, targets), coefficient in zip(words, coefficients, strict=True):
            self.apply_pauli(src, paulis, targets)
            self.add_scaled(dst, src, np.full(1, coefficient))
            self.apply_pauli(src, paulis, targets)  # P P = 1: src is back, exactly

    def sample(
        self, state: StateBatch, bits: Sequence[int], shots: int, rng: np.random.Generator
    ) -> np.ndarray:
        """``shots`` outcomes per vector, int64 (B, shots), outcome bits as in probabilities.
        The default inverts the cumulative marginal distribution at ``rng``'s uniform
        draws (one per shot, so that a seed fixes the samples)."""
        probs = self.probabilities(state, bits)
        cumulative = np.cumsum(probs, axis=1)
        cumulative /= cumulative[:, -1:]
        draws = rng.random((probs.shape[0], shots))
        return np.stack(
            [np.searchsorted(c, d, side="right") for c, d in zip(cumulative, draws, strict=True)]
        ).clip(max=probs.shape[1] - 1)

    # --- compositions: the adjoint sweeps' steps -----------------------------------------

    def adjoint_pauli_rotation_step(
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
        products = self.inner_pauli(bras, phi, paulis, targets)
        self.apply_pauli_rotation(phi, -np.asarray(angles), paulis, targets)
        self.apply_pauli_rotation(bras, -np.asarray(angles), paulis, targets)
        return products

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
        memory until ``gather``. A backend may fuse the three into one pass.

        The default: T[b, r, a, c] = <bra_{b,r}| E_ac |phi_b'> with E_ac = |a><c| on the
        targets, one ``braket`` per entry and vector (d**2 passes: a backend with a dense
        reduction overrides it)."""
        matrices = np.asarray(matrices, dtype=np.complex128)
        rows = bra_rows(phi, bras, matrices.shape[0])
        adjoints = np.conj(np.swapaxes(matrices, -1, -2))
        self._apply_block(phi, adjoints, targets)
        d = 1 << len(targets)
        reduction = np.empty((phi.shape[0], rows, d, d), dtype=np.complex128)
        for a in range(d):
            for c in range(d):
                moved = self.copy(phi)
                if d > 1:
                    entry = np.zeros((1, d, d), dtype=np.complex128)
                    entry[0, a, c] = 1.0
                    self.apply_matrix(moved, entry, targets)
                reduction[:, :, a, c] = self.bra_products(bras, moved, rows)
        self._apply_block(bras, per_bra(adjoints, rows), targets)
        return reduction

    def adjoint_z_rotations_step(
        self, phi: StateBatch, bras: StateBatch, angles: np.ndarray, z_masks: Sequence[int]
    ) -> Any:
        """One step of the deferred sweep back through the commuting rotations of
        ``apply_z_rotations``: returns <bra_{b,r}|Z_j|phi_b> for every bra and word,
        complex128 of shape (B, R, J), as a backend array (see ``gather``); then applies
        the inverse rotations to phi and to the bras (bras as in ``adjoint_block_step``)."""
        return self._commuting_step(
            phi, bras, angles, z_words(z_masks), lambda s, a: self.apply_z_rotations(s, a, z_masks)
        )

    def adjoint_one_qubit_rotations_step(
        self,
        phi: StateBatch,
        bras: StateBatch,
        angles: np.ndarray,
        paulis: str,
        targets: Sequence[int],
    ) -> Any:
        """One step of the deferred sweep back through the rotations of
        ``apply_one_qubit_rotations``: returns <bra_{b,r}|P_j|phi_b> for every bra and rotation,
        complex128 of shape (B, R, m), as a backend array (see ``gather``); then applies
        the inverse rotations to phi and to the bras (bras as in ``adjoint_block_step``)."""
        words = [(letter, (bit,)) for letter, bit in zip(paulis, targets, strict=True)]
        return self._commuting_step(
            phi,
            bras,
            angles,
            words,
            lambda s, a: self.apply_one_qubit_rotations(s, a, paulis, targets),
        )

    def adjoint_tiled_matrices_step(
        self, phi: StateBatch, bras: StateBatch, matrices: np.ndarray, targets: Sequence[int]
    ) -> Any:
        """One step of the deferred sweep back through the gates of ``apply_tiled_matrices``:
        for j = m-1 .. 0, the ``adjoint_block_step`` of gate j, whose reductions T_j are
        returned as one array (B, R, m, 2, 2), complex128 (bras as there; a backend array:
        see ``gather``). A backend may take the whole run tile by tile in one pass; the
        default takes one block step after the other and gathers their reductions at once."""
        matrices = np.asarray(matrices)
        reductions = [
            self.adjoint_block_step(phi, bras, matrices[:, j], (targets[j],))
            for j in reversed(range(len(targets)))
        ]
        return np.stack(self.gather(reductions)[::-1], axis=2)

    # --- optional: a whole gate sequence in one call -------------------------------------

    sequence_amplitudes: int = 0
    """Registers of at most this many amplitudes (2**n per vector, any number of vectors)
    may run a circuit as one ``GateSequence`` call (``run_sequence``, ``sweep_sequence``),
    where the per-gate calls cost more host time than their kernels or the vectors are
    small enough to run the whole sequence in cache one by one; 0: the backend has no such
    call."""

    def prepare_sequence(self, sequence: GateSequence) -> object:
        """The backend's form of ``sequence`` (built once per circuit structure)."""
        raise NotImplementedError(f"the {self.name} backend runs no gate sequences")

    def run_sequence(
        self, state: StateBatch, prepared: object, angles: np.ndarray, matrices: Sequence
    ) -> None:
        """Every gate of a prepared sequence on every vector of ``state``: ``angles``
        (1 or B, n_slots) float64, ``matrices[slot]`` (2**k, 2**k) the call's matrices."""
        raise NotImplementedError(f"the {self.name} backend runs no gate sequences")

    def sweep_sequence(
        self,
        phi: StateBatch,
        bras: StateBatch,
        prepared: object,
        angles: np.ndarray,
        matrices: Sequence,
        n_columns: int,
    ) -> np.ndarray:
        """The adjoint sweep of a prepared sequence (``DerivativeEntry``) from the B final
        states ``phi`` and their R bras each (both consumed): float64 (B, R, n_columns)."""
        raise NotImplementedError(f"the {self.name} backend runs no gate sequences")

    def run_sequence_measured(
        self,
        state: StateBatch,
        prepared: object,
        angles: np.ndarray,
        matrices: Sequence,
        words: Sequence[tuple[str, Sequence[int]]],
    ) -> np.ndarray:
        """``run_sequence``, then <psi_b|P_k|psi_b> for the Pauli words, float64 (B, K).
        The default: the two calls."""
        self.run_sequence(state, prepared, angles, matrices)
        return self.expval_pauli_words(state, words)

    def sweep_sequence_from_words(
        self,
        phi: StateBatch,
        prepared: object,
        angles: np.ndarray,
        matrices: Sequence,
        words: Sequence[tuple[str, Sequence[int]]],
        coefficients: np.ndarray,
        n_columns: int,
    ) -> np.ndarray:
        """``sweep_sequence`` from the final states ``phi``
        (consumed) and the bras bra_{b,r} = sum_k coefficients[b, r, k] P_k phi_b
        (coefficients (B, R, K) complex128): float64 (B, R, n_columns). The default builds
        the bras (one ``add_pauli_sum`` per bra; per word and vector, for a batch of
        several vectors with one bra each) and sweeps."""
        batch, rows, _ = coefficients.shape
        n_qubits = int(phi.shape[1]).bit_length() - 1
        bras = self.zero_state(n_qubits, batch * rows)
        self.scale(bras, np.zeros(1))
        if batch == 1:
            for r in range(rows):
                live = np.flatnonzero(coefficients[0, r])
                if live.size:
                    self.add_pauli_sum(
                        self.vectors(bras, r, r + 1),
                        phi,
                        [words[k] for k in live],
                        coefficients[0, r, live],
                    )
        elif rows == 1:
            scratch = self.zero_state(n_qubits, batch)
            for k in np.flatnonzero(coefficients[:, 0, :].any(axis=0)):
                self.scale(scratch, np.zeros(1))
                self.add_pauli_sum(scratch, phi, [words[k]], np.ones(1))
                self.add_scaled(bras, scratch, coefficients[:, 0, k])
        else:
            for b in range(batch):
                for r in range(rows):
                    live = np.flatnonzero(coefficients[b, r])
                    if live.size:
                        self.add_pauli_sum(
                            self.vectors(bras, b * rows + r, b * rows + r + 1),
                            self.vectors(phi, b, b + 1),
                            [words[k] for k in live],
                            coefficients[b, r, live],
                        )
        return self.sweep_sequence(phi, bras, prepared, angles, matrices, n_columns)

    def run_sequence_jacobian(
        self,
        state: StateBatch,
        prepared: object,
        sweep: object,
        angles: np.ndarray,
        matrices: Sequence,
        words: Sequence[tuple[str, Sequence[int]]],
        coefficients: np.ndarray,
        n_columns: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """A forward pass and R VJPs at once: ``run_sequence_measured`` of ``prepared``
        (the values <psi_b|P_k|psi_b>, float64 (B, K)), then ``sweep_sequence_from_words``
        of ``sweep`` (a prepared sweep sequence with the same angle and matrix slots) from
        the final states, which it consumes, with the bras of ``coefficients`` (B, R, K):
        float64 (B, R, n_columns). The default: the two calls."""
        values = self.run_sequence_measured(state, prepared, angles, matrices, words)
        swept = self.sweep_sequence_from_words(
            state, sweep, angles, matrices, words, coefficients, n_columns
        )
        return values, swept

    def bind_sequence_jacobian(
        self,
        n_qubits: int,
        prepared: object,
        sweep: object,
        words: Sequence[tuple[str, Sequence[int]]],
        coefficients: np.ndarray,
        n_columns: int,
    ) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """``run_sequence_jacobian`` of one vector from |0...0>, with everything but the
        angles bound (sequences without matrix slots): a callable of the angles (1,
        n_slots) giving the words' values (K,) and the sweep's gradient columns
        (R, n_columns). Bound once per circuit structure, called once per call of a small
        circuit, where the per-call host work around one backend call is most of its
        time (the compiled torch path's Jacobian on the forward pass). The default binds
        the arguments of ``run_sequence_jacobian``."""

        def run(angles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            state = self.zero_state(n_qubits, 1)
            values, swept = self.run_sequence_jacobian(
                state, prepared, sweep, angles, (), words, coefficients, n_columns
            )
            return values[0], swept[0]

        return run

    def gram(self, bras: StateBatch, kets: StateBatch) -> Any:
        """The inner products of every bra with every ket, G[r, c] = <bras_r|kets_c>,
        complex128 of shape (R, C), as a backend array: it stays in the backend's memory
        until ``gather`` (the metric tensor's reductions). ``bras`` and ``kets`` may be
        views of one batch; neither changes. The default: one ``braket`` per ket, on a
        copy of it (host arrays; a backend with a matrix product overrides it)."""
        products = np.empty((bras.shape[0], kets.shape[0]), dtype=np.complex128)
        for c in range(kets.shape[0]):
            products[:, c] = self.braket(bras, self.copy(self.vectors(kets, c, c + 1)))
        return products

    def gram_scratch_vectors(self, bras: int, kets: int) -> int:
        """The most state vectors ``gram`` of ``bras`` bras and ``kets`` kets allocates as
        temporaries (the default: a copy of one ket, and ``braket``'s), for the memory
        checks of the metric tensor."""
        return 1 + self.scratch_vectors(1, bras, False)

    def gather(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        """The reductions of a sweep (backend arrays, or host arrays from the default
        steps) as numpy arrays, in one transfer."""
        return [np.asarray(array) for array in arrays]

    # --- helpers of the default compositions ----------------------------------------------

    def _apply_block(self, state: StateBatch, matrices: np.ndarray, targets: Sequence[int]) -> None:
        """psi <- M psi for matrices (1 or B, d, d); a 1 x 1 block is a factor (no
        zero-target matrix application)."""
        if len(targets):
            self.apply_matrix(state, matrices, targets)
        else:
            self.scale(state, matrices[:, 0, 0])

    def bra_products(self, bras: StateBatch, kets: StateBatch, rows: int) -> np.ndarray:
        """<bra_{b,r}|kets_b>, complex128 (B, R): vector b's R bras against its ket (one
        ``braket`` per vector); ``kets`` is scratch."""
        batch = kets.shape[0]
        products = np.empty((batch, rows), dtype=np.complex128)
        for b in range(batch):
            own_bras = self.vectors(bras, b * rows, (b + 1) * rows)
            products[b] = self.braket(own_bras, self.vectors(kets, b, b + 1))
        return products

    def _commuting_step(
        self,
        phi: StateBatch,
        bras: StateBatch,
        angles: np.ndarray,
        words: Sequence[tuple[str, Sequence[int]]],
        rotate: Callable[[StateBatch, np.ndarray], None],
    ) -> np.ndarray:
        """A sweep step back through commuting rotations exp(-i angles_j/2 P_j) (the Pauli
        ``words``): <bra_{b,r}|P_j|phi_b> at their end, shape (B, R, J); then
        ``rotate(state, angles)`` with the negated angles undoes them on phi and on the
        bras (shared angles stay shared, vector b's row repeats for its bras)."""
        rows = bra_rows(phi, bras)
        products = np.empty((phi.shape[0], rows, len(words)), dtype=np.complex128)
        for j, (paulis, bits) in enumerate(words):
            flipped = self.copy(phi)
            self.apply_pauli(flipped, paulis, bits)
            products[:, :, j] = self.bra_products(bras, flipped, rows)
        angles = np.asarray(angles, dtype=np.float64)
        rotate(phi, -angles)
        rotate(bras, -per_bra(angles, rows))
        return products


def bra_rows(phi: StateBatch, bras: StateBatch, n_matrices: int = 1) -> int:
    """R, the bras per vector of ``phi`` in a deferred step; refuses bras that are not R
    per vector and per-vector data (``n_matrices``) that is not 1 or one per vector."""
    batch = phi.shape[0]
    rows, remainder = divmod(bras.shape[0], batch)
    if remainder or n_matrices not in (1, batch):
        raise ValueError(
            f"{bras.shape[0]} bras, {batch} vectors and {n_matrices} matrices: "
            "the bras must be R per vector and the matrices 1 or one per vector"
        )
    return rows


def per_bra(data: np.ndarray, rows: int) -> np.ndarray:
    """Batched data of the vectors (leading axis 1 or B) for their bras, R per vector:
    per-vector rows repeated R times, shared data as it is."""
    return data if data.shape[0] == 1 else np.repeat(data, rows, axis=0)


def z_words(z_masks: Sequence[int]) -> list[tuple[str, tuple[int, ...]]]:
    """The Pauli words (paulis, targets) of Z letters on the bits set in each mask."""
    words = []
    for mask in z_masks:
        bits = tuple(bit for bit in range(int(mask).bit_length()) if mask >> bit & 1)
        words.append(("Z" * len(bits), bits))
    return words
