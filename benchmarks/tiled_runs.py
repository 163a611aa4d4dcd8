"""Tiled runs (issue 19, item 3: cache blocking) on the CPU backend, three tables:

1. kernels: a run of one-bit gates on the low bits (below the CPU's ``tile_bits``, 14)
   gate by gate (``apply_matrix``, one pass per gate) against ``apply_tiled_matrices``
   (tile by tile, one pass), and the sweep's steps (``adjoint_block_step`` per gate against
   ``adjoint_tiled_matrices_step``), per register size and number of bras;
2. gathered: the variant that was dropped, a tile made of the six highest bits and the
   lowest ones, its chunks gathered into a buffer (a probe kernel here), against the same
   gates one by one;
3. circuits: a VJP step (adjoint, device VJP, torch) of StronglyEntanglingLayers and of
   BasicEntanglerLayers with RY, with tiled runs on and off (the backend's
   ``fusion_traits`` swapped between steps), where ``min_tiled_qubits`` and
   ``min_tiled_rotation_qubits`` come from.

    python benchmarks/tiled_runs.py [--qubits 16,18,20,22,24] [--rounds 7]

Kernel times: median of ``--rounds`` calls after a warm-up. Circuit times: rounds of one
step each way, the order swapped every round; the ratio is the median of the rounds'
tiled / untiled ratios (below 1: tiled is faster). Every variant is checked against the
gate-by-gate result before it is timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time

import numba
import numpy as np
import pennylane as qml
import torch

import pennylane_custatevec  # noqa: F401 - registers custatevec.qubit
from pennylane_custatevec.backends._cpu_kernels import _pairs_2x2
from pennylane_custatevec.backends.cpu import CPUBackend


def median_ms(call, rounds: int) -> float:
    call()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def random_gates(m: int, rng: np.random.Generator) -> np.ndarray:
    """(1, m, 2, 2) random unitaries."""
    draws = rng.normal(size=(m, 2, 2)) + 1j * rng.normal(size=(m, 2, 2))
    return np.stack([np.linalg.qr(draw)[0] for draw in draws])[None]


def gates_one_by_one(backend, state, gates, targets) -> None:
    for j, bit in enumerate(targets):
        backend.apply_matrix(state, gates[:, j], (bit,))


def steps_one_by_one(backend, phi, bras, gates, targets) -> None:
    for j in reversed(range(len(targets))):
        backend.adjoint_block_step(phi, bras, gates[:, j], (targets[j],))


def kernels_table(sizes: list[int], rounds: int) -> None:
    backend = CPUBackend()
    tile_bits = backend.fusion_traits.tile_bits
    rng = np.random.default_rng(0)
    print("| qubits | bras | gates (bits) | forward: one by one | tiled | step: one by one "
          "| tiled |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for n in sizes:
        targets = tuple(range(min(n, tile_bits) - 1, -1, -1))
        gates = random_gates(len(targets), rng)
        for rows in (1, 4):
            phi = backend.from_host(rng.normal(size=(1, 1 << n)) + 0j)
            bras = backend.from_host(rng.normal(size=(rows, 1 << n)) + 0j)
            check_phi, check_bras = backend.copy(phi), backend.copy(bras)
            expected = backend.copy(phi)
            for j, bit in enumerate(targets):
                backend.apply_matrix(expected, gates[:, j], (bit,))
            backend.apply_tiled_matrices(check_phi, gates, targets)
            np.testing.assert_allclose(check_phi, expected, atol=1e-9)
            reference = [
                backend.adjoint_block_step(expected, check_bras, gates[:, j], (targets[j],))
                for j in reversed(range(len(targets)))
            ]
            tiled = backend.adjoint_tiled_matrices_step(
                check_phi, backend.copy(bras), gates, targets
            )
            np.testing.assert_allclose(tiled, np.stack(reference[::-1], axis=2), atol=1e-8)

            calls = (
                functools.partial(gates_one_by_one, backend, phi, gates, targets),
                functools.partial(backend.apply_tiled_matrices, phi, gates, targets),
                functools.partial(steps_one_by_one, backend, phi, bras, gates, targets),
                functools.partial(backend.adjoint_tiled_matrices_step, phi, bras, gates, targets),
            )
            times = [median_ms(call, rounds) for call in calls]
            cells = " | ".join(f"{t:.3g} ms" for t in times)
            print(f"| {n} | {rows} | {len(targets)} ({targets[0]}..0) | {cells} |")


@numba.njit(parallel=True, fastmath=True)
def _gathered_run(state, matrices, positions, group_bits, outside_bits, chunk_bits, buffers):
    """The dropped variant: each tile (the group bits) gathered chunk by chunk into a
    worker's buffer, taken through every gate, and written back."""
    dim = state.shape[1]
    width = group_bits.shape[0]
    size, chunk = 1 << width, 1 << chunk_bits
    chunks = size >> chunk_bits
    offsets = np.zeros(chunks, dtype=np.int64)
    for h in range(chunks):
        for k in range(width - chunk_bits):
            offsets[h] |= ((h >> k) & 1) << group_bits[chunk_bits + k]
    workers = buffers.shape[0]
    for worker in numba.prange(workers):
        tile = buffers[worker]
        for job in range(worker, dim >> width, workers):
            base = 0
            for k in range(outside_bits.shape[0]):
                base |= ((job >> k) & 1) << outside_bits[k]
            for h in range(chunks):
                start = base | offsets[h]
                tile[h * chunk : (h + 1) * chunk] = state[0, start : start + chunk]
            for j in range(matrices.shape[0]):
                m = matrices[j]
                _pairs_2x2(tile, tile, positions[j], 0, size >> 1, m[0, 0], m[0, 1], m[1, 0],
                           m[1, 1])  # fmt: skip
            for h in range(chunks):
                start = base | offsets[h]
                state[0, start : start + chunk] = tile[h * chunk : (h + 1) * chunk]


def gathered_table(sizes: list[int], rounds: int) -> None:
    backend = CPUBackend()
    rng = np.random.default_rng(1)
    print("\n| qubits | gates (bits) | tile bits (chunk) | one by one | gathered tiles |")
    print("|---|---|---|---|---|")
    for n in sizes:
        targets = tuple(range(n - 1, n - 7, -1))
        gates = random_gates(len(targets), rng)
        state = backend.from_host(rng.normal(size=(1, 1 << n)) + 0j)
        for tile_bits in (14, 16):
            chunk_bits = tile_bits - len(targets)
            group = list(range(chunk_bits)) + sorted(targets)
            positions = np.array([group.index(bit) for bit in targets], dtype=np.int64)
            outside = np.array([b for b in range(n) if b not in group], dtype=np.int64)
            buffers = np.empty((numba.get_num_threads(), 1 << tile_bits), dtype=np.complex128)
            args = (gates[0], positions, np.array(group, dtype=np.int64), outside, chunk_bits)
            expected, check = backend.copy(state), backend.copy(state)
            gates_one_by_one(backend, expected, gates, targets)
            _gathered_run(check, *args, buffers)
            np.testing.assert_allclose(check, expected, atol=1e-9)
            plain = median_ms(
                functools.partial(gates_one_by_one, backend, state, gates, targets), rounds
            )
            gathered = median_ms(functools.partial(_gathered_run, state, *args, buffers), rounds)
            print(f"| {n} | 6 ({targets[0]}..{targets[-1]}) | {tile_bits} ({chunk_bits}) | "
                  f"{plain:.2f} ms | {gathered:.2f} ms |")  # fmt: skip


def circuit_step(n: int, template: str):
    """A VJP step of a 2-layer circuit on ``n`` wires, and the device's backend."""
    device = qml.device("custatevec.qubit", wires=n, backend="cpu")
    weights = np.random.default_rng(n).normal(size=(2, n, 3))
    w = torch.tensor(weights if template == "SEL" else weights[..., 0], requires_grad=True)

    @qml.qnode(device, diff_method="adjoint", interface="torch", device_vjp=True)
    def circuit(w):
        if template == "SEL":
            qml.StronglyEntanglingLayers(w, wires=range(n))
        else:
            qml.BasicEntanglerLayers(w, wires=range(n), rotation=qml.RY)
        return qml.expval(qml.Z(0))

    def step():
        w.grad = None
        value = circuit(w)
        value.backward()
        return value.item(), w.grad.numpy().copy()

    return step, device._backend


def circuits_table(sizes: list[int], rounds: int) -> None:
    print("\n| circuit | qubits | tiled | untiled | tiled / untiled (median, quartiles) |")
    print("|---|---|---|---|---|")
    for template in ("SEL", "BEL-RY"):
        for n in sizes:
            step, backend = circuit_step(n, template)
            tiled = dataclasses.replace(
                backend.fusion_traits, min_tiled_qubits=0, min_tiled_rotation_qubits=0
            )
            untiled = dataclasses.replace(backend.fusion_traits, tile_bits=0)
            times: dict[str, list[float]] = {"tiled": [], "untiled": []}
            results = {}
            for label, traits in (("tiled", tiled), ("untiled", untiled)):
                backend.fusion_traits = traits
                results[label] = step()  # warm-up, and the values to compare
            np.testing.assert_allclose(results["tiled"][0], results["untiled"][0], atol=1e-10)
            np.testing.assert_allclose(results["tiled"][1], results["untiled"][1], atol=1e-10)
            for r in range(rounds):
                order = ("tiled", "untiled") if r % 2 else ("untiled", "tiled")
                for label in order:
                    backend.fusion_traits = tiled if label == "tiled" else untiled
                    start = time.perf_counter()
                    step()
                    times[label].append(time.perf_counter() - start)
            ratios = np.array(times["tiled"]) / np.array(times["untiled"])
            q1, q2, q3 = np.quantile(ratios, [0.25, 0.5, 0.75])
            tiled_ms, untiled_ms = (1e3 * np.median(times[k]) for k in ("tiled", "untiled"))
            print(f"| {template} | {n} | {tiled_ms:.1f} ms | {untiled_ms:.1f} ms | "
                  f"{q2:.3f} ({q1:.3f}-{q3:.3f}) |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--qubits", default="16,18,20,22,24")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tables", default="kernels,gathered,circuits")
    args = parser.parse_args()
    sizes = [int(q) for q in args.qubits.split(",")]
    tables = args.tables.split(",")
    if "kernels" in tables:
        kernels_table(sizes, args.rounds)
    if "gathered" in tables:
        gathered_table([n for n in sizes if n >= 20], args.rounds)
    if "circuits" in tables:
        circuits_table(sizes, args.rounds)


if __name__ == "__main__":
    main()
