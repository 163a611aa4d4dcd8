"""Peak memory of a training step against the number of qubits: W6's step (W1's
StronglyEntanglingLayers circuit with one layer, torch, value and gradient), run once per
device and size in a fresh (spawned) process, as ``run_workloads.py`` runs W6.

    python benchmarks/memory_scaling.py [--sizes 12,16,18,20,22,24] [--out FILE.md]

Prints a markdown table of the peak resident memory (VmHWM, after the warm-up step that
compiles kernels: the step's memory) and the memory at the start of the process, and
draws ``results/plots/memory_vs_qubits.png``. default.qubit's backprop stops at 22 qubits
(its step at 24 needs several minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
from pathlib import Path

from matplotlib.figure import Figure
from plots import _save
from run_workloads import PEERS, Config, our_config, run_in_fresh_process

HERE = Path(__file__).resolve().parent
LARGEST = {"default.qubit backprop": 22}
"""The largest size each peer runs here (none: every size)."""


def configurations() -> list[Config]:
    ours = our_config("custatevec.qubit")
    if isinstance(ours, str):
        raise SystemExit(f"custatevec.qubit is {ours}")
    return [ours, PEERS[0], PEERS[2]]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="12,16,18,20,22,24")
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    columns = configurations()
    peaks: dict[str, dict[int, float]] = {config.label: {} for config in columns}
    rows = []
    for n in sizes:
        cells = []
        for config in columns:
            if n > LARGEST.get(config.label, n):
                cells.append("-")
                continue
            cell = run_in_fresh_process("W6", config, {"n_wires": n}, repeat=1)
            if cell.peak_mib is None:
                cells.append(cell.note or "error")
                continue
            peaks[config.label][n] = cell.peak_mib
            cells.append(f"{cell.peak_mib:.0f} MiB (start {cell.start_mib:.0f})")
        rows.append(f"| {n} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    revision = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True
    ).stdout.strip()
    lines = [
        "# Peak memory of a training step against the number of qubits",
        "",
        f"- date: {datetime.datetime.now().isoformat(timespec='minutes')}, head {revision}",
        f"- command: `python benchmarks/memory_scaling.py --sizes {args.sizes}`",
        "- W6's step (StronglyEntanglingLayers, one layer, torch, value and gradient), each "
        "cell a fresh process; peak = VmHWM after the warm-up step (the kernels compiled "
        "before it), start = the process's resident memory before building the workload",
        "",
        "| qubits | " + " | ".join(config.label for config in columns) + " |",
        "|---" * (len(columns) + 1) + "|",
        *rows,
    ]
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    figure = Figure(figsize=(8, 5))
    axes = figure.subplots()
    for label, by_size in peaks.items():
        if by_size:
            axes.plot(list(by_size), list(by_size.values()), marker="o", label=label)
    axes.set_yscale("log")
    axes.set_xlabel("qubits")
    axes.set_ylabel("peak resident memory of the process (MiB)")
    axes.set_title("Memory of one training step (W6's step), CPU")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    _save(figure, HERE / "results" / "plots" / "memory_vs_qubits.png")


if __name__ == "__main__":
    main()
