"""A CNOT ring (StronglyEntanglingLayers' entangler, range 1) on the CPU backend: its CNOTs
one by one (``apply_pauli``) against the ring as permutation runs of at most
``permutation_bits`` moved bits (``apply_bit_permutation``), per register size and batch;
ms per ring, best of ``--rounds``, the two interleaved. Both give the same state (checked
first). The provenance of the CPU's ``FusionTraits.min_permutation_run`` and
``permutation_bits``.

    python benchmarks/permutation_runs.py [--sizes 12x1,16x1,16x17,20x1] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pennylane_custatevec.backends.cpu import CPU_FUSION_TRAITS, CPUBackend


def ring(n: int) -> list[tuple[int, int]]:
    """(control bit, target bit) of CNOT(w, w + 1 mod n) for wires w = 0 .. n - 1 (wire w is
    bit n - 1 - w)."""
    return [(n - 1 - w, n - 1 - (w + 1) % n) for w in range(n)]


def runs(gates: list[tuple[int, int]], most_bits: int) -> list[list[tuple[int, int]]]:
    """The gates cut into runs of at most ``most_bits`` distinct targets, as fusion cuts."""
    out: list[list[tuple[int, int]]] = [[]]
    for gate in gates:
        if len({t for _, t in out[-1]} | {gate[1]}) > most_bits:
            out.append([])
        out[-1].append(gate)
    return out


def sources(gates: list[tuple[int, int]], n: int) -> np.ndarray:
    """The source map of the run (``Backend.apply_bit_permutation``)."""

    def source(y: int) -> int:
        for control, target in reversed(gates):
            if (y >> control) & 1:
                y ^= 1 << target
        return y

    constant = source(0)
    return np.array([source(1 << j) ^ constant for j in range(n)] + [constant], dtype=np.int64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="12x1,16x1,16x17,20x1", help="qubits x vectors")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    backend = CPUBackend()
    most_bits = CPU_FUSION_TRAITS.permutation_bits
    print("| qubits | vectors | CNOTs | runs | CNOTs one by one (ms) | runs (ms) | ratio |")
    print("|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for size in args.sizes.split(","):
        n, batch = (int(x) for x in size.split("x"))
        gates = ring(n)
        cut = [sources(run, n) for run in runs(gates, most_bits)]
        psi = rng.normal(size=(batch, 1 << n)) + 1j * rng.normal(size=(batch, 1 << n))
        one_by_one, permuted = psi.copy(), psi.copy()
        for control, target in gates:
            backend.apply_pauli(one_by_one, "X", (target,), (control,), (1,))
        for run in cut:
            backend.apply_bit_permutation(permuted, run)
        assert np.array_equal(one_by_one, permuted)
        best = [float("inf"), float("inf")]
        for _ in range(args.rounds):
            start = time.perf_counter()
            for control, target in gates:
                backend.apply_pauli(one_by_one, "X", (target,), (control,), (1,))
            middle = time.perf_counter()
            for run in cut:
                backend.apply_bit_permutation(permuted, run)
            end = time.perf_counter()
            best = [min(best[0], middle - start), min(best[1], end - middle)]
        ratio = best[0] / best[1]
        print(
            f"| {n} | {batch} | {len(gates)} | {len(cut)} | {best[0] * 1e3:.3f} | "
            f"{best[1] * 1e3:.3f} | {ratio:.2f}x |"
        )


if __name__ == "__main__":
    main()
