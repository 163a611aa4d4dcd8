"""The backend primitives: what every backend must implement (``BackendPrimitives``, the
abstract base of ``base.Backend``), the handle on a batch of state vectors (``StateBatch``)
and the traits the fusion planner reads of a backend (``FusionTraits``).

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

The primitives are memory queries, allocation and transfer, views, the four gate
applications, ``scale``, ``add_scaled``, the inner product ``braket`` and
``probabilities``; ``base.Backend`` composes everything else from them.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

StateBatch = Any
"""A backend's handle on a batch of state vectors (a numpy or cupy array, shape (B, 2**n))."""


@dataclasses.dataclass(frozen=True)
class FusionTraits:
    """How gate fusion plans for one backend: the default block width, what blocks cost,
    which fused kernels the backend has and the batch sizes where fusion pays. The
    defaults describe a backend with the base class's compositions only: no fusion unless
    the device asks for it, then greedy dense blocks, no gathered rotations."""

    default_width: int = 1
    """The largest fused block (``fusion_qubits``) when the device does not set one; 0 or
    1: no fusion."""
    block_costs: tuple[float, ...] | None = None
    """The time of applying a dense block on w bits relative to one native gate, indexed
    by w (0 .. 6), for the fusion planner; None: a block costs one pass whatever its width
    (fuse greedily)."""
    z_runs: bool = False
    """Whether fusion gathers runs of commuting Z-word rotations (QAOA cost layers) into
    one Z_ROTATIONS instruction (``apply_z_rotations``) for this backend."""
    rotations_per_pass: int = 1
    """How many one-qubit Pauli rotations on distinct bits fusion gathers into one
    ONE_QUBIT_ROTATIONS instruction (``apply_one_qubit_rotations``); below 2, none."""
    min_fused_amplitudes: int = 0
    """Batches of fewer amplitudes (vectors x 2**n) run unfused: there, building blocks
    costs more host time than the kernel passes they save."""
    permutation_bits: int = 0
    """The most state bits that a run of bit flips (CNOTs, X gates: X words with at most one
    control) may move for fusion to apply the run as one BIT_PERMUTATION instruction
    (``apply_bit_permutation``, one pass whatever the run's length); 0: no runs."""
    min_permutation_run: int = 2
    """The fewest bit flips that make such a run (where one pass of the permutation costs
    as much as that many flips one by one)."""
    tile_bits: int = 0
    """Fusion gathers adjacent blocks of one bit, each on a bit below ``tile_bits``, into
    tiled runs: TILED_MATRICES instructions (``apply_tiled_matrices``) that a backend
    applies tile by tile, each tile of 2**tile_bits consecutive amplitudes taking every gate
    of the run while it is in cache: one pass over the state for the run instead of one
    per block; 0: no tiled runs."""
    min_tiled_qubits: int = 0
    """Registers of fewer qubits keep their one-bit blocks one by one (their vectors sit
    in cache already)."""
    min_tiled_rotation_qubits: int = 0
    """A block of one lone one-qubit rotation (which fusion may pair, see
    ``rotations_per_pass``) joins tiled runs only on registers of at least this many
    qubits (at least ``min_tiled_qubits``): below, its own one-pass kernels beat a tile's
    dense 2x2 product."""
    pauli_rotation_step_for_lone_rotations: bool = False
    """Whether the deferred sweep takes a block of one Pauli rotation, on one state
    vector, through ``adjoint_pauli_rotation_step`` (one pass, real arithmetic) instead of
    ``adjoint_block_step``'s dense reduction: on backends whose dense 2**k products are
    compute-bound (the CPU)."""


class BackendPrimitives(abc.ABC):
    """Operations on a batch of state vectors, in the conventions of this module: the
    abstract primitives that every backend implements, and what a backend declares of
    itself (``fusion_traits``, ``dtype``, ...); ``base.Backend`` adds the default
    compositions."""

    fusion_traits: FusionTraits = FusionTraits()
    """What the fusion planner takes from this backend (see :class:`FusionTraits`)."""

    min_product_state_amplitudes: int = 0
    """Batches of fewer amplitudes start from |0...0> and apply their leading one-qubit
    gates one by one: there, tabulating the product state costs more host time than the
    kernel passes it saves (a simulation choice, not fusion's: ``simulate`` reads it)."""

    sample_host_bytes: int = 24
    """Host bytes that ``sample`` allocates at most per shot and state vector (its random
    numbers and outcomes, with their temporaries), for the memory check before sampling.
    The default ``sample``: the uniform draws (float64), each vector's outcomes (int64)
    and their stacked and clipped copies, two of them alive at once."""

    dtype: np.dtype
    """The amplitudes' complex dtype (complex128 or complex64)."""

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The backend's name, as ``backend=`` takes it and messages show it."""

    # --- primitives: memory --------------------------------------------------------------

    @abc.abstractmethod
    def available_bytes(self) -> int:
        """Memory that new state vectors may use now."""

    @abc.abstractmethod
    def available_host_bytes(self) -> int:
        """Host memory that new host arrays (samples) may use now."""

    @abc.abstractmethod
    def scratch_vectors(self, kets: int, bras: int, reduction: bool) -> int:
        """The most state vectors the backend allocates as temporaries inside one call on
        ``kets`` kets and ``bras`` bras, for the memory checks of the adjoint sweeps: an
        inner product (``inner_pauli``, ``inner_matrix``, ``adjoint_pauli_rotation_step``) or
        ``add_scaled`` (``kets`` its source vectors), or with ``reduction`` one of the
        deferred sweep's steps (``adjoint_block_step``, ``adjoint_z_rotations_step``,
        ``adjoint_one_qubit_rotations_step``). The default compositions copy their kets (one copy
        alive at a time)."""

    def amplitudes_held(self, num_qubits: int) -> int:
        """Amplitudes of one vector of ``num_qubits`` qubits that this process holds, for
        the memory checks: all ``2**n`` (a backend split over processes holds its share)."""
        return 1 << num_qubits

    # --- primitives: allocation, transfer, views -----------------------------------------

    @abc.abstractmethod
    def zero_state(self, n_qubits: int, batch_size: int) -> StateBatch:
        """A new batch, every vector |0...0>."""

    @abc.abstractmethod
    def from_host(self, vectors: np.ndarray) -> StateBatch:
        """A new batch holding ``vectors`` (shape (B, 2**n), any complex dtype; one vector
        of shape (2**n,) is a batch of one)."""

    @abc.abstractmethod
    def to_host(self, state: StateBatch) -> np.ndarray:
        """The amplitudes as a complex128 numpy array of shape (B, 2**n)."""

    @abc.abstractmethod
    def copy(self, state: StateBatch) -> StateBatch:
        """An independent copy of the batch."""

    @abc.abstractmethod
    def vectors(self, state: StateBatch, start: int, stop: int) -> StateBatch:
        """Vectors ``start .. stop-1`` of the batch as a batch that shares their memory."""

    @abc.abstractmethod
    def concatenate(self, states: Sequence[StateBatch]) -> StateBatch:
        """A new batch holding the vectors of ``states`` one batch after the other."""

    def read_block(self, block: Any) -> np.ndarray:
        """A host copy of ``block``, a (strided) view of a batch's memory, in its dtype and
        in order with the backend's pending work (the distributed backend's bit swaps
        send it). The default: numpy memory."""
        return np.array(block, copy=True)

    def write_block(self, block: Any, values: np.ndarray) -> None:
        """``block[...] = values`` (host values), in order with the backend's work."""
        block[...] = values

    # --- primitives: gates ---------------------------------------------------------------

    @abc.abstractmethod
    def apply_matrix(
        self,
        state: StateBatch,
        matrices: np.ndarray,
        targets: Sequence[int],
        controls: Sequence[int] = (),
        control_values: Sequence[int] = (),
    ) -> None:
        """psi <- M psi with M of shape (1 or B, 2**k, 2**k) acting on ``targets`` (k >= 1;
        M need not be unitary)."""

    @abc.abstractmethod
    def apply_diagonal(
        self,
        state: StateBatch,
        diagonals: np.ndarray,
        targets: Sequence[int],
        controls: Sequence[int] = (),
        control_values: Sequence[int] = (),
    ) -> None:
        """psi <- diag(d) psi with d of shape (1 or B, 2**k) acting on ``targets``."""

    @abc.abstractmethod
    def apply_pauli(
        self,
        state: StateBatch,
        paulis: str,
        targets: Sequence[int],
        controls: Sequence[int] = (),
        control_values: Sequence[int] = (),
    ) -> None:
        """psi <- P psi for the Pauli word P (X, CNOT, Toffoli, CZ, ...)."""

    @abc.abstractmethod
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

    # --- primitives: linear algebra, measurement -----------------------------------------

    @abc.abstractmethod
    def scale(self, state: StateBatch, factors: np.ndarray) -> None:
        """psi_b <- factors[b] psi_b (global phases, renormalisation); one factor serves
        every vector."""

    @abc.abstractmethod
    def add_scaled(self, dst: StateBatch, src: StateBatch, factors: np.ndarray) -> None:
        """dst_b <- dst_b + factors[b] src_b; one src vector or factor serves every dst."""

    @abc.abstractmethod
    def braket(self, bra: StateBatch, kets: StateBatch) -> np.ndarray:
        """<bra_b|kets_b> for each bra, complex128 of shape (B,); a batch of one ket serves
        every bra. ``kets`` is scratch: it may hold anything afterwards (a backend may
        conjugate it in place rather than copy the bras)."""

    @abc.abstractmethod
    def probabilities(self, state: StateBatch, bits: Sequence[int]) -> np.ndarray:
        """Marginal probabilities, float64 (B, 2**k); bit j of the outcome is state bit bits[j]."""
