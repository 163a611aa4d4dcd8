"""A state vector split over MPI ranks: a backend that wraps a local backend.

With ``P = 2**g`` ranks, a vector of ``n`` qubits is cut into ``P`` slices of ``2**L``
amplitudes (``L = n - g``): rank ``r`` holds the amplitudes whose ``g`` highest *physical*
index bits spell ``r``. Which state bit (the algorithms' bit, "logical") sits at which
physical bit is a per-vector *layout*, ``layout[q] = p``, changed lazily:

* a gate whose targets sit on global physical bits (``p >= L``) first swaps each of them
  with a free local bit, and leaves them there (a *bit swap*: every rank exchanges half
  of its slice with the rank that differs in that global bit, ``RankMessages.exchange``);
* a control on a global bit costs nothing: a rank whose bit does not match skips the gate;
* Z letters and diagonals on global bits cost nothing: on a rank the global bits are
  constants, so Z_g is the sign (-1)**bit and a diagonal is its restriction;
* two vectors that meet (an inner product, ``add_scaled``, a sweep's bras beside its ket)
  are first brought to one layout; readout (``to_host``) reorders what it gathers.

Reductions (inner products, probabilities, expectation values) are summed over ranks
(``RankMessages``); the deferred sweep's reductions stay rank-local until ``gather``, which
sums all of them in one collective per sweep. Sums are reduced to rank 0 and broadcast,
so that every rank holds bit-identical results (ranks that drew different outcomes of a
mid-circuit measurement would run different circuits); sampling is the base class's,
from the summed marginal with the generator the device gives every rank (rank 0's).

Vectors too small to be worth splitting (fewer than ``min_local_qubits`` local bits) are
*replicated*: every rank holds and computes the whole vector, and nothing is summed. An
operation on more bits than a rank holds (a Hermitian observable wider than ``L``) runs on
the gathered vectors (every rank computes it whole; only small vectors have so few local
bits).

The layouts, the bit swaps that change them and the sums over ranks are ``rank_layouts``'
(``RankLayouts``, this backend's base class); this module forwards each operation to the
rank-local backend on the slices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .base import Backend
from .messages import RankMessages
from .primitives import StateBatch
from .rank_layouts import (
    DistributedState,
    RankLayouts,
    flipped_bits,
    identity_layout,
    mask_mapper,
    moved_bits,
)

MIN_LOCAL_QUBITS = 10
"""Vectors with fewer local bits than this run replicated on every rank. Measured with
``benchmarks/mpi_latency.py`` (2 ranks on this 2-core machine, one thread each): a
one-qubit gate costs 4.1 us on a slice of 2**8 amplitudes, 4.4 us on 2**10 (call overhead,
not memory) and 5.6 us on 2**12, so below 2**10 local amplitudes a split vector computes
no faster than a whole one, while its bit swaps (2.4-3.1 us each there) and sums over ranks
only add messages. Tests lower it (``DistributedBackend.min_local_qubits``) to run the
split paths on small circuits."""

UNCHECKED_HOST_BYTES = 1 << 24
"""Whole results up to this size (16 MiB) skip the free-memory query (as
``simulate.UNCHECKED_BYTES`` does for states)."""


class ResultTooLargeError(MemoryError):
    """Whole results gathered on every rank would not fit in a rank's host memory."""


@dataclasses.dataclass(frozen=True)
class RankPartial:
    """A deferred sweep's reduction as one rank holds it: its slice's share of the sum
    over the state index, summed over ranks in ``gather``."""

    value: Any


class DistributedBackend(RankLayouts):
    """One state vector over the ranks of an MPI communicator (see the module's text);
    each rank's slice lives in ``local``, a backend of any kind."""

    sequence_amplitudes = 0  # a gate sequence runs in one local call: no room for swaps

    def __init__(self, local: Backend, comm):
        size = comm.Get_size()
        if size & (size - 1):
            raise ValueError(
                f"mpi=True runs on a power-of-two number of MPI ranks (1, 2, 4, 8, ...); "
                f"this job has {size}. Launch with mpiexec -n 2, 4, 8, ..."
            )
        self.local = local
        self.comm = comm
        self.rank = comm.Get_rank()
        self.ranks = size
        self.rank_bits = size.bit_length() - 1
        self.min_local_qubits = MIN_LOCAL_QUBITS
        self.gather_results = True  # the device's mpi_gather (see Backend.gather_results)
        self.messages = RankMessages(comm, local)
        self.swap_route = self.messages.route.name  # named by the device's repr
        self.device_id = getattr(local, "device_id", None)  # the local backend's GPU
        self.dtype = local.dtype
        self.min_product_state_amplitudes = local.min_product_state_amplitudes
        self.sample_host_bytes = local.sample_host_bytes
        self.fusion_traits = dataclasses.replace(
            local.fusion_traits,
            # the lone rotation step sums its products at once (a collective per
            # rotation); the block step's sums wait for gather (one per sweep)
            pauli_rotation_step_for_lone_rotations=False,
            # a tiled run's gates may meet global bits (each its own swap): gate by gate
            tile_bits=0,
        )

    @property
    def name(self) -> str:
        return self.local.name

    def global_bits_for(self, num_qubits: int) -> int:
        """g for a vector of ``num_qubits`` qubits: the rank bits, or 0 (replicated) where
        fewer than ``min_local_qubits`` bits would stay local."""
        if num_qubits - self.rank_bits < max(self.min_local_qubits, 1):
            return 0
        return self.rank_bits

    def amplitudes_held(self, num_qubits: int) -> int:
        return 1 << (num_qubits - self.global_bits_for(num_qubits))

    # --- memory ----------------------------------------------------------------------------

    def available_bytes(self) -> int:
        return self.local.available_bytes()

    def available_host_bytes(self) -> int:
        return self.local.available_host_bytes()

    def scratch_vectors(self, kets: int, bras: int, reduction: bool) -> int:
        return self.local.scratch_vectors(kets, bras, reduction)

    # --- allocation, transfer, views -----------------------------------------------------

    def _new(self, local: StateBatch, num_qubits: int, global_bits: int) -> DistributedState:
        rows = int(local.shape[0])
        layouts = [identity_layout(num_qubits)] * rows
        return DistributedState(local, layouts, 0, rows, num_qubits, global_bits)

    def zero_state(self, n_qubits: int, batch_size: int) -> DistributedState:
        g = self.global_bits_for(n_qubits)
        local = self.local.zero_state(n_qubits - g, batch_size)
        if g and self.rank:
            self.local.scale(local, np.zeros(1))  # |0...0> lies in rank 0's slice
        return self._new(local, n_qubits, g)

    def from_host(self, vectors: np.ndarray) -> DistributedState:
        vectors = np.asarray(vectors)
        vectors = vectors.reshape(-1, vectors.shape[-1])
        n = int(vectors.shape[1]).bit_length() - 1
        g = self.global_bits_for(n)
        own = vectors.reshape(vectors.shape[0], 1 << g, -1)[:, self.rank if g else 0]
        return self._new(self.local.from_host(own), n, g)

    def product_state(
        self, n_qubits: int, factors: np.ndarray, bits: Sequence[int]
    ) -> DistributedState:
        g = self.global_bits_for(n_qubits)
        if not g:
            return self._new(self.local.product_state(n_qubits, factors, bits), n_qubits, 0)
        factors = np.asarray(factors, dtype=np.complex128)
        low = n_qubits - g
        local_js = [j for j, bit in enumerate(bits) if bit < low]
        # the global bits are constants on a rank: their factors multiply the slice
        weight = np.ones(factors.shape[0], dtype=np.complex128)
        for j, bit in enumerate(bits):
            if bit >= low:
                weight = weight * factors[:, j, self.bit_on_rank(bit, low)]
        prepared = set(bits)
        if any(self.bit_on_rank(p, low) for p in range(low, n_qubits) if p not in prepared):
            weight = weight * 0  # a bit left |0> reads 1 on this rank
        if local_js:
            local = self.local.product_state(low, factors[:, local_js], [bits[j] for j in local_js])
        else:
            local = self.local.zero_state(low, factors.shape[0])
        self.local.scale(local, weight)
        return self._new(local, n_qubits, g)

    def to_host(self, state: DistributedState) -> np.ndarray:
        if not state.global_bits:
            return self.local.to_host(state.local)
        n, rows = state.num_qubits, state.rows
        # the gathered slices and their reordered copy, complex128
        self._require_host(2 * rows * 16 << n, f"gathering {rows} whole vector(s) of {n} qubits")
        layout = self.uniform_layout(state)
        slices = self.messages.gather_slices(self.local.to_host(state.local))  # (P, B, 2**L)
        physical = np.moveaxis(slices, 0, 1).reshape((rows,) + (2,) * n)
        # axis 1 + (n - 1 - p) holds physical bit p; logical bit q is at p = layout[q]
        order = [1 + (n - 1 - layout[q]) for q in reversed(range(n))]
        return np.ascontiguousarray(physical.transpose([0] + order)).reshape(rows, 1 << n)

    def copy(self, state: DistributedState) -> DistributedState:
        local = self.local.copy(state.local)
        return DistributedState(
            local, state.own_layouts(), 0, state.rows, state.num_qubits, state.global_bits
        )

    def vectors(self, state: DistributedState, start: int, stop: int) -> DistributedState:
        return DistributedState(
            self.local.vectors(state.local, start, stop),
            state.layouts,
            state.offset + start,
            stop - start,
            state.num_qubits,
            state.global_bits,
        )

    def concatenate(self, states: Sequence[DistributedState]) -> DistributedState:
        layouts = [layout for s in states for layout in s.own_layouts()]
        first = states[0]
        local = self.local.concatenate([s.local for s in states])
        return DistributedState(
            local, layouts, 0, len(layouts), first.num_qubits, first.global_bits
        )

    # --- gates -----------------------------------------------------------------------------

    def apply_matrix(self, state, matrices, targets, controls=(), control_values=()) -> None:
        if len(targets) > state.local_bits:
            return self._on_whole_vectors(
                state,
                lambda b, s: b.apply_matrix(s, matrices, targets, controls, control_values),
            )
        layout = self.make_local(state, targets)
        where = self.local_controls(state, layout, controls, control_values)
        if where is None:
            return None
        return self.local.apply_matrix(state.local, matrices, [layout[t] for t in targets], *where)

    def apply_diagonal(self, state, diagonals, targets, controls=(), control_values=()) -> None:
        layout = self.uniform_layout(state)
        where = self.local_controls(state, layout, controls, control_values)
        if where is None:
            return None
        low = state.local_bits
        diagonals = np.asarray(diagonals)
        k = len(targets)
        # the diagonal's restriction to this rank's values of its global targets
        index: list[Any] = [slice(None)]
        local_targets = []
        for j in reversed(range(k)):  # axis 1 holds the diagonal index's bit k-1
            position = layout[targets[j]]
            if position >= low:
                index.append(self.bit_on_rank(position, low))
            else:
                index.append(slice(None))
                local_targets.append(position)
        restricted = diagonals.reshape((diagonals.shape[0],) + (2,) * k)[tuple(index)]
        restricted = restricted.reshape(diagonals.shape[0], -1)
        if not local_targets:
            return self.scale_where(state, restricted[:, 0], *where)
        return self.local.apply_diagonal(state.local, restricted, local_targets[::-1], *where)

    def apply_pauli(self, state, paulis, targets, controls=(), control_values=()) -> None:
        moved = moved_bits(paulis, targets, state)
        if moved is None:
            return self._on_whole_vectors(
                state, lambda b, s: b.apply_pauli(s, paulis, targets, controls, control_values)
            )
        on_slice = self.pauli_on_slice(state, moved, paulis, targets, controls, control_values)
        if on_slice is None:
            return None
        where, sign, word, bits = on_slice
        if word:
            self.local.apply_pauli(state.local, word, bits, *where)
        if sign < 0:
            self.scale_where(state, np.array([-1.0]), *where)
        return None

    def apply_pauli_rotation(
        self, state, angles, paulis, targets, controls=(), control_values=()
    ) -> None:
        moved = moved_bits(paulis, targets, state)
        if moved is None:
            return self._on_whole_vectors(
                state,
                lambda b, s: b.apply_pauli_rotation(
                    s, angles, paulis, targets, controls, control_values
                ),
            )
        on_slice = self.pauli_on_slice(state, moved, paulis, targets, controls, control_values)
        if on_slice is None:
            return None
        where, sign, word, bits = on_slice
        angles = sign * np.asarray(angles, dtype=np.float64)
        if not word:  # exp(-i s angle/2) on this rank: a phase
            return self.scale_where(state, np.exp(-0.5j * angles), *where)
        return self.local.apply_pauli_rotation(state.local, angles, word, bits, *where)

    def apply_z_rotations(self, state, angles, z_masks) -> None:
        if not state.global_bits:
            return self.local.apply_z_rotations(state.local, angles, z_masks)
        words = self.local_z_words(state, self.uniform_layout(state), z_masks)
        angles = np.asarray(angles, dtype=np.float64) * words.signs
        if words.kept:
            self.local.apply_z_rotations(state.local, angles[:, words.kept], words.masks)
        if words.phases:  # words wholly on global bits: exp(-i s angle/2), a phase
            self.local.scale(state.local, np.exp(-0.5j * angles[:, words.phases].sum(axis=1)))
        return None

    def adjoint_z_rotations_step(self, phi, bras, angles, z_masks) -> Any:
        """The local step on the words' local parts (their angles and products signed by
        their Z letters on global bits); a word wholly on global bits gives s <bra|phi>,
        which undoing the rotations leaves unchanged."""
        if not phi.global_bits:
            return self.local.adjoint_z_rotations_step(phi.local, bras.local, angles, z_masks)
        layout = self.uniform_layout(phi)
        self.align(bras, layout)
        words = self.local_z_words(phi, layout, z_masks)
        angles = np.asarray(angles, dtype=np.float64) * words.signs
        rows = bras.rows // phi.rows
        products = np.empty((phi.rows, rows, len(z_masks)), dtype=np.complex128)
        if words.phases:
            overlaps = self.local.bra_products(bras.local, self.local.copy(phi.local), rows)
            products[:, :, words.phases] = overlaps[:, :, None] * words.signs[words.phases]
            undo = np.exp(0.5j * angles[:, words.phases].sum(axis=1))
            self.local.scale(phi.local, undo)
            self.local.scale(bras.local, undo if undo.size == 1 else np.repeat(undo, rows))
        if words.kept:
            step = self.local.adjoint_z_rotations_step(
                phi.local, bras.local, angles[:, words.kept], words.masks
            )
            (kept_products,) = self.local.gather([step])
            products[:, :, words.kept] = kept_products * words.signs[words.kept]
        return RankPartial(products)

    def apply_one_qubit_rotations(self, state, angles, paulis, targets) -> None:
        if len(targets) > state.local_bits:
            return super().apply_one_qubit_rotations(state, angles, paulis, targets)
        layout = self.make_local(state, targets)
        return self.local.apply_one_qubit_rotations(
            state.local, angles, paulis, [layout[t] for t in targets]
        )

    def apply_bit_permutation(self, state, sources) -> None:
        """The affine map on each rank's slice: its moved bits (those whose value in
        src(y) may differ from y's) made local first, so that src(y) stays in the slice; a
        global input bit enters as this rank's constant (a CNOT controlled there flips its
        target or not)."""
        if not state.global_bits:
            return self.local.apply_bit_permutation(state.local, sources)
        n = state.num_qubits
        sources = [int(v) for v in sources]
        moved = [
            q
            for q in range(n)
            if sources[n] >> q & 1 or any((sources[j] >> q & 1) != (j == q) for j in range(n))
        ]
        if len(moved) > state.local_bits:
            return self._on_whole_vectors(
                state, lambda b, s: b.apply_bit_permutation(s, np.asarray(sources))
            )
        layout = self.make_local(state, moved)
        low = state.local_bits
        physical = mask_mapper(layout)
        holder = {p: q for q, p in enumerate(layout)}
        constant = physical(sources[n])
        for p in range(low, n):  # a global input bit set on this rank adds its column
            if self.bit_on_rank(p, low):
                constant ^= physical(sources[holder[p]]) & ((1 << low) - 1)
        local_sources = [physical(sources[holder[p]]) for p in range(low)] + [constant]
        return self.local.apply_bit_permutation(
            state.local, np.asarray(local_sources, dtype=np.int64)
        )

    # --- linear algebra, measurement -----------------------------------------------------

    def scale(self, state, factors) -> None:
        self.local.scale(state.local, factors)

    def add_scaled(self, dst, src, factors) -> None:
        self.align(src, self.uniform_layout(dst))
        self.local.add_scaled(dst.local, src.local, factors)

    def braket(self, bra, kets) -> np.ndarray:
        self.align(kets, self.uniform_layout(bra))
        return self.summed_over_ranks(bra, self.local.braket(bra.local, kets.local))

    def gram(self, bras, kets) -> Any:
        """Each rank's products of its slices (the kets brought to the bras' layout), left
        rank-local (``RankPartial``): ``gather`` sums them over ranks in its one collective."""
        self.align(kets, self.uniform_layout(bras))
        local = self.local.gram(bras.local, kets.local)
        return RankPartial(local) if bras.global_bits else local

    def gram_scratch_vectors(self, bras: int, kets: int) -> int:
        return self.local.gram_scratch_vectors(bras, kets)

    def probabilities(self, state, bits) -> np.ndarray:
        if not state.global_bits:
            return self.local.probabilities(state.local, bits)
        layout = self.uniform_layout(state)
        low = state.local_bits
        local_js = [j for j, bit in enumerate(bits) if layout[bit] < low]
        local = self.local.probabilities(state.local, [layout[bits[j]] for j in local_js])
        # this rank's outcomes: its global bits fixed, the local ones free
        fixed = sum(
            self.bit_on_rank(layout[bit], low) << j
            for j, bit in enumerate(bits)
            if layout[bit] >= low
        )
        outcomes = np.full(1 << len(local_js), fixed, dtype=np.int64)
        for i, j in enumerate(local_js):
            outcomes |= ((np.arange(outcomes.size) >> i) & 1) << j
        self._require_host(
            2 * state.rows * 8 << len(bits), f"the probabilities of {len(bits)} qubits"
        )
        spread = np.zeros((state.rows, 1 << len(bits)))
        spread[:, outcomes] = local
        return self.messages.sum(spread)

    def state_result(self, state) -> np.ndarray:
        """The whole amplitudes, or with ``gather_results`` off this rank's share: the
        indices from r 2**L to (r+1) 2**L - 1 (the first g wires spell the rank r)."""
        if self.gather_results or state.num_qubits < self.rank_bits:
            return self.to_host(state)
        if not state.global_bits:  # replicated: every rank cuts its share of the whole
            return self._share(self.local.to_host(state.local))
        self.align(state, identity_layout(state.num_qubits))
        return self.local.to_host(state.local)

    def probabilities_result(self, state, bits) -> np.ndarray:
        """As ``state_result``: the whole distribution, or this rank's share of it (where
        ``bits`` are every bit in index order, as ``qml.probs()`` asks)."""
        if (
            self.gather_results
            or state.num_qubits < self.rank_bits
            or tuple(bits) != identity_layout(state.num_qubits)
        ):
            return self.probabilities(state, bits)
        if not state.global_bits:
            return self._share(self.local.probabilities(state.local, bits))
        self.align(state, identity_layout(state.num_qubits))
        return self.local.probabilities(state.local, identity_layout(state.local_bits))

    def _require_host(self, needed: int, what: str) -> None:
        """Refuse, before allocating, whole results that would not fit in this rank's
        host memory (every rank holds them), naming ``mpi_gather=False``."""
        if needed <= UNCHECKED_HOST_BYTES:
            return
        available = self.local.available_host_bytes()
        if needed > available:
            raise ResultTooLargeError(
                f"{what[0].upper()}{what[1:]} needs {needed:,} bytes of host memory on every "
                f"rank; {available:,} bytes are available. Use mpi_gather=False (state() and "
                "probs() as each rank's share), fewer measured wires, or expectation values."
            )

    def _share(self, whole: np.ndarray) -> np.ndarray:
        """This rank's share of whole results (B, 2**n): its range of 2**(n - log2 P)."""
        size = whole.shape[1] >> self.rank_bits
        return whole[:, self.rank * size : (self.rank + 1) * size]

    def expval_pauli(self, state, paulis, targets) -> np.ndarray:
        return self.expval_pauli_words(state, [(paulis, targets)])[:, 0]

    def expval_pauli_words(self, state, words) -> np.ndarray:
        if not state.global_bits:
            return self.local.expval_pauli_words(state.local, words)
        partial = np.zeros((state.rows, len(words)))
        whole = np.zeros((state.rows, len(words)))
        layout = self.uniform_layout(state)
        # the words whose X and Y letters are local now, in one local call; then the
        # others one by one, each after its swaps
        ready = [
            k
            for k, (paulis, targets) in enumerate(words)
            if all(layout[t] < state.local_bits for t in flipped_bits(paulis, targets))
        ]
        if ready:
            self.local_expvals(state, layout, words, ready, partial)
        for k in sorted(set(range(len(words))) - set(ready)):
            moved = moved_bits(*words[k], state)
            if moved is None:
                full = self.local.from_host(self.to_host(state))
                whole[:, k] = self.local.expval_pauli_words(full, [words[k]])[:, 0]
                continue
            layout = self.make_local(state, moved)
            self.local_expvals(state, layout, words, [k], partial)
        return self.messages.sum(partial) + whole

    # --- the adjoint sweeps' steps -------------------------------------------------------

    def adjoint_pauli_rotation_step(self, phi, bras, angles, paulis, targets) -> np.ndarray:
        products = self._sweep_step(
            phi,
            bras,
            targets,
            lambda local, p, b, bits: local.adjoint_pauli_rotation_step(p, b, angles, paulis, bits),
            lambda: super(DistributedBackend, self).adjoint_pauli_rotation_step(
                phi, bras, angles, paulis, targets
            ),
        )
        if isinstance(products, RankPartial):  # this step's products are wanted now
            return self.messages.sum(np.asarray(products.value, dtype=np.complex128))
        return products

    def adjoint_block_step(self, phi, bras, matrices, targets) -> Any:
        return self._sweep_step(
            phi,
            bras,
            targets,
            lambda local, p, b, bits: local.adjoint_block_step(p, b, matrices, bits),
            lambda: super(DistributedBackend, self).adjoint_block_step(
                phi, bras, matrices, targets
            ),
        )

    def adjoint_one_qubit_rotations_step(self, phi, bras, angles, paulis, targets) -> Any:
        return self._sweep_step(
            phi,
            bras,
            targets,
            lambda local, p, b, bits: local.adjoint_one_qubit_rotations_step(
                p, b, angles, paulis, bits
            ),
            lambda: super(DistributedBackend, self).adjoint_one_qubit_rotations_step(
                phi, bras, angles, paulis, targets
            ),
        )

    def _sweep_step(
        self,
        phi: DistributedState,
        bras: DistributedState,
        targets: Sequence[int],
        step: Callable[[Backend, StateBatch, StateBatch, list[int]], Any],
        on_whole: Callable[[], Any],
    ) -> Any:
        """A sweep step on each rank's slices: its targets made local in phi, the bras
        brought to phi's layout, ``step(local backend, phi, bras, physical targets)``, its
        reduction left rank-local (``RankPartial``, summed in ``gather``). Replicated
        vectors: the local step as it is; targets that outnumber the local bits: the base
        class's composition (``on_whole``), on the primitives above."""
        if not phi.global_bits:
            return step(self.local, phi.local, bras.local, list(targets))
        if len(targets) > phi.local_bits:
            return on_whole()
        layout = self.make_local(phi, targets)
        self.align(bras, layout)
        return RankPartial(step(self.local, phi.local, bras.local, [layout[t] for t in targets]))

    def gather(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        """The local gather, then one sum over ranks of every rank-local reduction (the
        whole sweep's, in one collective)."""
        partial = [isinstance(a, RankPartial) for a in arrays]
        arrays = [  # states too, as a backend's arrays: whole, on every rank
            self.to_host(a).astype(self.dtype) if isinstance(a, DistributedState) else a
            for a in arrays
        ]
        values = self.local.gather(
            [a.value if p else a for a, p in zip(arrays, partial, strict=True)]
        )
        summed = [
            np.asarray(v, dtype=np.complex128) for v, p in zip(values, partial, strict=True) if p
        ]
        if summed:
            flat = self.messages.sum(np.concatenate([v.ravel() for v in summed]))
            start = 0
            for i, p in enumerate(partial):
                if p:
                    size = values[i].size
                    values[i] = flat[start : start + size].reshape(values[i].shape)
                    start += size
        return [np.asarray(v) for v in values]

    # --- layouts and swaps ---------------------------------------------------------------

    def _on_whole_vectors(
        self, state: DistributedState, apply: Callable[[Backend, StateBatch], None]
    ) -> None:
        """``apply`` on the whole vectors, gathered on every rank (each computes it), for
        an operation on more bits than a slice spans; then each rank keeps its slice."""
        whole = self.local.from_host(self.to_host(state))
        apply(self.local, whole)
        own = self.from_host(self.local.to_host(whole))  # this rank's slices, identity layout
        self.local.scale(state.local, np.zeros(1))
        self.local.add_scaled(state.local, own.local, np.ones(1))
        self.set_layout(state, identity_layout(state.num_qubits))
