"""Time one W1 training step against the number of qubits, on this device and its peers.

    python benchmarks/scaling.py [--qubits 4,6,8] [--quick] [--repeat 3] [--layers 4]
                                 [--out-dir benchmarks/results] [--backend custatevec]

The step is W1 of workloads.py: StronglyEntanglingLayers, expval(Z_i) on every wire,
forward and torch backward of the sum. Configurations: our device (default options, that
is deferred gradient accumulation), our device with ``grad_accumulation="eager"``, and the
peers that differentiate in one backward pass (lightning.qubit adjoint + device_vjp,
default.qubit backprop; with ``--backend custatevec`` also lightning.gpu when it can be
built). At every size each configuration is warmed up and cross-checked, then all are
timed round-robin (``run_workloads.time_round_robin``). Writes ``scaling.md`` and
``plots/time_vs_qubits.png`` under ``--out-dir``.
"""

import argparse
import sys
from pathlib import Path

import plots
import torch
from run_workloads import (
    TORCH_THREADS,
    Cell,
    Config,
    eager_variant,
    environment_lines,
    our_config,
    progress,
    table_lines,
    time_round_robin,
    usable_peers,
)

WORKLOAD = "W1"
DEFAULT_QUBITS = tuple(range(4, 21, 2))
QUICK_QUBITS = (4, 6, 8, 10)
MAX_QUBITS = {"default.qubit": 20, "lightning.qubit": 22}
"""The largest n a peer device runs at. default.qubit's backprop keeps every intermediate
state for the backward pass (about 5 GB at n=20 with 4 layers, 4 times more per 2 qubits);
lightning.qubit's step takes about 10 s at n=22, 4 times longer per 2 qubits."""
TIME_VS_QUBITS = Path("plots/time_vs_qubits.png")
"""The plot's path under ``--out-dir``."""


def configurations(device: str, backend: str | None) -> tuple[Config | str, tuple[Config, ...]]:
    """Ours (a str says why it is unavailable), then its eager variant and the peers that
    differentiate in one backward pass: device VJPs or backprop, not a Jacobian per output."""
    ours = our_config(device, backend)
    one_pass = tuple(
        peer
        for peer in usable_peers(backend)
        if peer.setup.device_vjp or peer.setup.diff_method == "backprop"
    )
    return ours, eager_variant(ours) + one_pass


def row_configs(n_wires: int, ours: Config | str, peers: tuple[Config, ...]) -> list[Config | str]:
    """The configurations to run at ``n_wires``: a str for each one not run, saying why."""
    first = ours if isinstance(ours, Config) else "unavailable (see below)"
    row: list[Config | str] = [first]
    for peer in peers:
        limit = MAX_QUBITS.get(peer.setup.device)
        row.append(peer if limit is None or n_wires <= limit else f"n/a (n > {limit})")
    return row


def measure(
    qubits: list[int], layers: int, ours: Config | str, peers: tuple[Config, ...], repeat: int
) -> dict[int, list[Cell]]:
    """The cells of every size: ours, then every peer."""
    return {
        n: time_round_robin(
            WORKLOAD,
            row_configs(n, ours, peers),
            {"n_wires": n, "n_layers": layers},
            repeat,
            tag=f"n={n}",
        )
        for n in qubits
    }


def series(rows: dict[int, list[Cell]], labels: list[str]) -> dict[str, dict[int, float]]:
    """Per configuration (``labels``, in column order), its time at every size it ran."""
    return {
        label: {
            n: cells[column].seconds
            for n, cells in rows.items()
            if cells[column].seconds is not None
        }
        for column, label in enumerate(labels)
    }


def render(
    rows: dict[int, list[Cell]],
    ours_label: str,
    peers: tuple[Config, ...],
    args: argparse.Namespace,
    notes: list[str],
) -> str:
    """The report: environment, the table (one row per size), the plot, what it means."""
    table = table_lines("n (qubits)", ours_label, peers, {str(n): c for n, c in rows.items()})
    limits = ", ".join(f"{device} n <= {limit}" for device, limit in MAX_QUBITS.items())
    lines = [
        "# Scaling: one training step against the number of qubits",
        "",
        *environment_lines(args.repeat),
        f"- step: {WORKLOAD} of workloads.py, n_layers={args.layers}: StronglyEntanglingLayers,",
        "  expval(Z_i) on every wire, forward and backward of the sum",
        "",
        *table,
        "",
        f"![time of one step against the number of qubits]({TIME_VS_QUBITS.as_posix()})",
        "",
        "ratio = peer time / our time (higher is better); for the eager column it is the",
        "deferred/eager speed-up of grad_accumulation (our column is the default, deferred).",
        "Before timing, every configuration's values and gradients are compared with the",
        "first peer that ran (np.allclose, atol 1e-6); a difference is marked **MISMATCH**.",
        f"n/a: not run at that size, which would take too much memory or time ({limits}).",
        *notes,
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--qubits`` becomes a sorted list of ints."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--qubits",
        help=f"comma-separated sizes (default {','.join(map(str, DEFAULT_QUBITS))})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"sizes {','.join(map(str, QUICK_QUBITS))} unless --qubits is given, a smoke test",
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed steps after the warm-up")
    parser.add_argument("--layers", type=int, default=4, help="StronglyEntanglingLayers depth")
    parser.add_argument("--out-dir", default="benchmarks/results", type=Path)
    parser.add_argument("--device", default="custatevec.qubit", help="the device under test")
    parser.add_argument(
        "--backend",
        choices=("cpu", "custatevec"),
        help="require the device under test to run on this backend; custatevec also adds "
        "lightning.gpu as a peer when it can be built",
    )
    args = parser.parse_args(argv)
    if args.qubits is None:
        args.qubits = list(QUICK_QUBITS if args.quick else DEFAULT_QUBITS)
    else:
        try:
            args.qubits = sorted({int(n) for n in args.qubits.split(",") if n.strip()})
        except ValueError:
            parser.error(f"--qubits takes comma-separated integers, not {args.qubits!r}")
    if not args.qubits or min(args.qubits) < 1:
        parser.error("--qubits needs at least one size, every size >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run, print and write the report and the plot; exit status 1 if any configuration
    disagreed."""
    args = parse_args(argv)
    torch.set_num_threads(TORCH_THREADS)
    ours, peers = configurations(args.device, args.backend)
    rows = measure(args.qubits, args.layers, ours, peers, args.repeat)
    ours_label = ours.label if isinstance(ours, Config) else args.device
    notes = [] if isinstance(ours, Config) else [f"{args.device}: {ours}"]
    report = render(rows, ours_label, peers, args, notes)
    print(report)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "scaling.md").write_text(report, encoding="utf-8")
    labels = [ours_label, *(peer.label for peer in peers)]
    title = f"{WORKLOAD} step (StronglyEntanglingLayers, {args.layers} layers) against qubits"
    plots.plot_time_vs_qubits(series(rows, labels), args.out_dir / TIME_VS_QUBITS, title)
    progress(f"wrote {args.out_dir / 'scaling.md'} and {args.out_dir / TIME_VS_QUBITS}")
    return int(any(cell.mismatch for cells in rows.values() for cell in cells))


if __name__ == "__main__":
    sys.exit(main())
