"""The cost of a bit swap against a gate on small slices (where ``MIN_LOCAL_QUBITS`` of
backends/distributed.py comes from). Run on two ranks, one numba thread each:

    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NUMBA_NUM_THREADS=1 \\
        mpiexec --oversubscribe -n 2 python benchmarks/mpi_latency.py

For slices of 2**L amplitudes, rank 0 prints the mean time of exchanging half a slice with
the other rank (``Sendrecv``, what a bit swap sends) and of one one-qubit gate on the
slice (the CPU backend's ``apply_matrix``), over 500 repetitions after 50 warm-ups.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from pennylane_custatevec.backends.cpu import CPUBackend

REPEAT, WARM_UP = 500, 50


def mean_seconds(call) -> float:
    for _ in range(WARM_UP):
        call()
    start = time.perf_counter()
    for _ in range(REPEAT):
        call()
    return (time.perf_counter() - start) / REPEAT


def main() -> None:
    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        raise SystemExit("run on two ranks: mpiexec -n 2 python benchmarks/mpi_latency.py")
    partner = 1 - comm.Get_rank()
    backend = CPUBackend()
    identity = np.eye(2, dtype=np.complex128)[None]
    for local_bits in (8, 10, 12, 14, 16):
        half = np.zeros(1 << (local_bits - 1), np.complex128)
        received = np.empty_like(half)
        exchange = mean_seconds(
            lambda h=half, r=received: comm.Sendrecv(h, dest=partner, recvbuf=r, source=partner)
        )
        state = backend.zero_state(local_bits, 1)
        gate = mean_seconds(lambda s=state: backend.apply_matrix(s, identity, (0,)))
        if comm.Get_rank() == 0:
            print(
                f"L={local_bits:2d}: exchange of half a slice {exchange * 1e6:8.1f} us, "
                f"one gate on the slice {gate * 1e6:8.1f} us"
            )


if __name__ == "__main__":
    main()
