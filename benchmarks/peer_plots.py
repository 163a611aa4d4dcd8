"""The performance page's plots against the peers, drawn from the committed reports in
benchmarks/results/ (no timing is run here):

    python benchmarks/peer_plots.py [--results benchmarks/results]

- plots/peers_time_vs_qubits.png: one training step of W1 against the number of qubits,
  this device (its defaults) against lightning.qubit and default.qubit (scaling.md);
- plots/peers_speedup.png: per workload, how many times faster this device is than each
  peer, each in its fastest configuration measured (ours: QNode or compile; lightning.qubit:
  adjoint with VJPs or Jacobians, or Catalyst; default.qubit: backprop, or under jax.jit)
  (workloads.md; cells that did not run are left out).

Memory against the number of qubits is measured and drawn by ``memory_scaling.py``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from plots import _save, plot_time_vs_qubits

OURS = "custatevec.qubit adjoint + device_vjp"
PEERS = {
    "lightning.qubit adjoint + device_vjp": "lightning.qubit (adjoint)",
    "default.qubit backprop": "default.qubit (backprop)",
}
FASTEST = {
    "custatevec.qubit": [OURS, "custatevec.qubit compiled"],
    "lightning.qubit": [
        "lightning.qubit adjoint + device_vjp",
        "lightning.qubit adjoint (Jacobian on forward)",
        "Catalyst qjit + lightning.qubit adjoint",
    ],
    "default.qubit": ["default.qubit backprop", "default.qubit + jax.jit backprop"],
}
"""Each device's configurations in workloads.md: the speed-up plot takes its fastest."""
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}


def table(text: str) -> list[dict[str, str]]:
    """The rows of the first markdown table of ``text``, as {header: cell}."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == len(header):
            rows.append(dict(zip(header, cells, strict=True)))
        else:
            break
    return rows


def seconds(cell: str) -> float | None:
    """A report's time ("1.58 ms", "4.16 s", "910 ms, peak ...") in seconds, or None for a
    cell that did not run (n/a, ERROR, skipped, unavailable)."""
    match = re.match(r"([\d.]+)\s*(s|ms|us|µs)\b", cell)
    return float(match.group(1)) * _UNITS[match.group(2)] if match else None


def time_vs_qubits(results: Path, out: Path) -> Figure:
    rows = table((results / "scaling.md").read_text())
    series: dict[str, dict[int, float]] = {"custatevec.qubit (defaults)": {}}
    series.update({label: {} for label in PEERS.values()})
    for row in rows:
        n = int(row["n (qubits)"])
        for column, label in [(OURS, "custatevec.qubit (defaults)"), *PEERS.items()]:
            value = seconds(row.get(column, ""))
            if value is not None:
                series[label][n] = value
    return plot_time_vs_qubits(
        series,
        out / "peers_time_vs_qubits.png",
        "W1 training step (StronglyEntanglingLayers, torch), CPU, 2 cores",
    )


def _workload_cells(results: Path) -> list[dict[str, str]]:
    # the first table of workloads.md (the targets table after it is not read)
    return table((results / "workloads.md").read_text())


def _fastest(row: dict[str, str], columns: list[str]) -> float | None:
    times = [seconds(row.get(column, "")) for column in columns]
    times = [t for t in times if t is not None]
    return min(times) if times else None


def speedup(results: Path, out: Path) -> Figure:
    rows = _workload_cells(results)
    peers = [name for name in FASTEST if name != "custatevec.qubit"]
    names, ratios = [], {name: [] for name in peers}
    for row in rows:
        ours = _fastest(row, FASTEST["custatevec.qubit"])
        times = {name: _fastest(row, FASTEST[name]) for name in peers}
        if ours is None or all(value is None for value in times.values()):
            continue
        names.append(row["workload"].split(" (")[0])
        for name, value in times.items():
            ratios[name].append(np.nan if value is None else value / ours)
    figure = Figure(figsize=(8, 5), layout="constrained")
    axes = figure.add_subplot()
    height = 0.8 / len(ratios)
    positions = np.arange(len(names))
    for k, (label, values) in enumerate(ratios.items()):
        axes.barh(positions + k * height, values, height, label=label)
    axes.set_yticks(positions + height * (len(ratios) - 1) / 2, names)
    axes.invert_yaxis()
    axes.axvline(1.0, color="black", linewidth=0.8)
    axes.set_xscale("log")
    axes.set_xlabel("peer time / custatevec.qubit time, fastest configurations (> 1: ours faster)")
    axes.set_title("One training step per workload, CPU, 2 cores (workloads.md)")
    axes.grid(True, axis="x", which="both", alpha=0.3)
    axes.legend()
    _save(figure, out / "peers_speedup.png")
    return figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    out = args.results / "plots"
    time_vs_qubits(args.results, out)
    speedup(args.results, out)
    print(f"peer_plots.py: wrote {out}/peers_*.png")


if __name__ == "__main__":
    main()
