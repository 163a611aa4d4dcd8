"""Where gate sequences pay (the provenance of ``CPUBackend.sequence_amplitudes`` and
``cpu_sequences.THREADED_SEQUENCE_AMPLITUDES``): a compiled AngleEmbedding +
StronglyEntanglingLayers (L=2) training step on registers of several sizes and batches, once
with every known structure run as a gate sequence and once gate by gate
(``sequence_amplitudes`` set to a huge value and to 0 on each device's backend),
interleaved, best of ``--rounds``.

    python benchmarks/sequence_sizes.py
    python benchmarks/sequence_sizes.py --cases 8x64,13x1
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pennylane as qml
import torch

import pennylane_custatevec

DEFAULT_CASES = (
    "9x1,10x1,11x1,12x1,13x1,14x1,8x8,8x16,8x32,8x64,8x128,8x256,8x1024,"
    "4x128,4x256,4x1024,10x64,12x16,13x8"
)


def training_step(n_wires: int, batch: int, sequences: bool):
    """A warm compiled step (forward, backward of the sum) on its own CPU device."""
    device = qml.device("custatevec.qubit", wires=n_wires, backend="cpu")
    device._backend.sequence_amplitudes = (1 << 40) if sequences else 0

    def circuit(x, weights):
        qml.AngleEmbedding(x, wires=range(n_wires))
        qml.StronglyEntanglingLayers(weights, wires=range(n_wires))
        return qml.expval(qml.Z(0))

    qnode = qml.QNode(circuit, device, interface="torch", diff_method="adjoint", device_vjp=True)
    compiled = pennylane_custatevec.compile(qnode)
    rng = np.random.default_rng(2)
    x = torch.tensor(rng.uniform(0, np.pi, (batch, n_wires) if batch > 1 else (n_wires,)))
    weights = torch.tensor(rng.uniform(0, 6, (2, n_wires, 3)), requires_grad=True)

    def step():
        weights.grad = None
        compiled(x, weights).sum().backward()

    for _ in range(5):
        step()
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=DEFAULT_CASES, help="qubits x vectors, comma-separated")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    print("| qubits | vectors | amplitudes | sequence | gate by gate | ratio |")
    print("|---|---|---|---|---|---|")
    for case in args.cases.split(","):
        n_wires, batch = (int(part) for part in case.split("x"))
        steps = {on: training_step(n_wires, batch, on) for on in (True, False)}
        repeats = max(3, int(200 / ((batch << n_wires) / 4096 + 1)))
        best = {True: float("inf"), False: float("inf")}
        for _ in range(args.rounds):
            for sequences, step in steps.items():
                start = time.perf_counter()
                for _ in range(repeats):
                    step()
                best[sequences] = min(best[sequences], (time.perf_counter() - start) / repeats)
        print(
            f"| {n_wires} | {batch} | {batch << n_wires} | {best[True] * 1e3:.3f} ms | "
            f"{best[False] * 1e3:.3f} ms | {best[True] / best[False]:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
