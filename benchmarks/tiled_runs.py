"""Cache blocking, measured before it is built (issue 19, item 3): a run of one-qubit gates
on the low bits 0 .. k-1, applied gate by gate (one pass over the state per gate, what the
CPU backend does today) against tile by tile (each tile of 2**t amplitudes taken through
every gate of the run while it is in cache: one pass in all).

    python benchmarks/tiled_runs.py [--qubits 20,22,24] [--gates 13] [--tile-bits 13,15]

The tiled kernel here is a probe (a numba loop over tiles around the backend's own
vectorised pair loop, ``_cpu_kernels._pairs_2x2``), checked against the gate-by-gate result
before timing; medians of 7 calls after a warm-up.
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np

from pennylane_custatevec.backends._cpu_kernels import _pairs_2x2
from pennylane_custatevec.backends.cpu import CPUBackend


@numba.njit(parallel=True, fastmath=True)
def _run_tiled(state, matrices, bits, tile_bits):
    batch, dim = state.shape
    tile = 1 << tile_bits
    tiles = dim // tile
    for job in numba.prange(batch * tiles):
        start = (job % tiles) * tile
        segment = state[job // tiles, start : start + tile]
        for g in range(matrices.shape[0]):
            m = matrices[g]
            _pairs_2x2(segment, segment, bits[g], 0, tile // 2, m[0, 0], m[0, 1], m[1, 0], m[1, 1])


def median_ms(call) -> float:
    call()
    times = []
    for _ in range(7):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return sorted(times)[3] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--qubits", default="20,22,24")
    parser.add_argument("--gates", type=int, default=13)
    parser.add_argument("--tile-bits", default="13,15")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    k = args.gates
    matrices = np.stack(
        [np.linalg.qr(rng.normal(size=(2, 2)) + 1j * rng.normal(size=(2, 2)))[0] for _ in range(k)]
    )
    bits = np.arange(k, dtype=np.int64)
    backend = CPUBackend()
    print("| qubits | tile bits | gate by gate (ms) | tiled (ms) | speed-up |")
    print("|---|---|---|---|---|")
    for n in (int(q) for q in args.qubits.split(",")):
        state = backend.from_host(np.full((1, 1 << n), 2 ** (-n / 2)))

        def gate_by_gate(state=state):
            for g in range(k):
                backend.apply_matrix(state, matrices[g][None], (g,))

        for t in (int(b) for b in args.tile_bits.split(",")):
            expected, tiled = state.copy(), state.copy()
            gate_by_gate(expected)
            _run_tiled(tiled, matrices, bits, t)
            np.testing.assert_allclose(tiled, expected, atol=1e-12)
            plain = median_ms(gate_by_gate)
            blocked = median_ms(lambda t=t, s=state: _run_tiled(s, matrices, bits, t))
            print(f"| {n} | {t} | {plain:.2f} | {blocked:.2f} | {plain / blocked:.2f}x |")


if __name__ == "__main__":
    main()
