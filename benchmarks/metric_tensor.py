"""The metric tensor's cost: this device's ``pennylane_custatevec.metric_tensor`` against
PennyLane's ``qml.adjoint_metric_tensor`` (default.qubit) and ``qml.metric_tensor``
(block-diagonal, on lightning.qubit and on this device, whose QNode there has
``diff_method="parameter-shift"`` so that its tapes run without a Jacobian), and against
this device's
gradient (one training step's VJP), on AngleEmbedding-free StronglyEntanglingLayers
circuits (expval of Z on wire 0, autograd interface).

    python benchmarks/metric_tensor.py                 # the target row and both sweeps
    python benchmarks/metric_tensor.py --quick         # smaller sizes (a smoke run)
    python benchmarks/metric_tensor.py --plot benchmarks/results/plots/metric_tensor.png

Each configuration runs once to warm up, then ``--repeats`` times; the table gives the
fastest. A configuration that took over ``--cap`` seconds at one size is not run at the
larger ones of the same sweep, and a call still running after ``--cap`` seconds
(``--limit`` for the target row) is stopped ("stopped"; a speed-up against it is then a
lower bound). The last columns check the values: the largest absolute
difference between this device's full metric and ``qml.adjoint_metric_tensor``'s, and
between its block-diagonal metric and ``qml.metric_tensor(approx="block-diag")``'s on
default.qubit.
"""

from __future__ import annotations

import argparse
import signal
import time
import warnings
from collections.abc import Callable

import numpy as np
import pennylane as qml
from pennylane import numpy as pnp

import pennylane_custatevec

OURS_FULL = "custatevec metric_tensor (full)"
OURS_BLOCK = "custatevec metric_tensor (block-diag)"
ADJOINT = "qml.adjoint_metric_tensor (default.qubit)"
BLOCK_LIGHTNING = "qml.metric_tensor block-diag (lightning.qubit)"
BLOCK_OURS = "qml.metric_tensor block-diag (custatevec.qubit)"
VJP = "custatevec gradient (one training step)"
CONFIGURATIONS = (OURS_FULL, OURS_BLOCK, ADJOINT, BLOCK_LIGHTNING, BLOCK_OURS, VJP)
LIMIT_SECONDS = [300]
"""``--limit``: a call still running after it is stopped, and the ratio is a lower bound."""


def circuit_on(device_name: str, wires: int, method: str | None = None) -> qml.QNode:
    dev = qml.device(device_name, wires=wires)
    # lightning's adjoint method does not serve qml.metric_tensor's tapes (probabilities)
    default = {"default.qubit": "backprop", "lightning.qubit": "best"}.get(device_name, "adjoint")
    method = method or default

    @qml.qnode(dev, diff_method=method)
    def circuit(weights):
        qml.StronglyEntanglingLayers(weights, wires=range(wires))
        return qml.expval(qml.Z(0))

    return circuit


def calls(wires: int) -> dict[str, Callable]:
    ours = circuit_on("custatevec.qubit", wires)
    default = circuit_on("default.qubit", wires)
    lightning = circuit_on("lightning.qubit", wires)
    return {
        OURS_FULL: pennylane_custatevec.metric_tensor(ours),
        OURS_BLOCK: pennylane_custatevec.metric_tensor(ours, approx="block-diag"),
        ADJOINT: qml.adjoint_metric_tensor(default),
        BLOCK_LIGHTNING: qml.metric_tensor(lightning, approx="block-diag"),
        # not the adjoint QNode: under autograd it would take the Jacobian of every
        # probability the metric's tapes measure (2**n rows) as they run
        BLOCK_OURS: qml.metric_tensor(
            circuit_on("custatevec.qubit", wires, "parameter-shift"), approx="block-diag"
        ),
        VJP: qml.grad(ours),
    }


class TimedOut(Exception):
    """A call ran past its time limit."""


def _alarm(signum, frame):
    raise TimedOut


def fastest(call: Callable, weights, repeats: int, limit: int) -> float:
    """The fastest of ``repeats`` calls after a warm-up one; a warm-up call of over 5 s is
    the figure itself (one call, no repeats); ``inf`` where it ran past ``limit`` seconds
    (it is stopped there)."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit)
    try:
        start = time.perf_counter()
        call(weights)
        first = time.perf_counter() - start
    except TimedOut:
        return float("inf")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    if first > 5:
        return first
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call(weights)
        times.append(time.perf_counter() - start)
    return min(times)


def differences(wires: int, weights) -> tuple[float, float]:
    ours = circuit_on("custatevec.qubit", wires)
    default = circuit_on("default.qubit", wires)
    full = np.max(
        np.abs(
            pennylane_custatevec.metric_tensor(ours)(weights)
            - qml.adjoint_metric_tensor(default)(weights)
        )
    )
    block = np.max(
        np.abs(
            pennylane_custatevec.metric_tensor(ours, approx="block-diag")(weights)
            - qml.metric_tensor(default, approx="block-diag")(weights)
        )
    )
    return float(full), float(block)


def sweep(sizes, repeats: int, cap: float, check_up_to: int, limit: int) -> list[dict]:
    rows, skipped = [], set()
    for wires, layers in sizes:
        shape = qml.StronglyEntanglingLayers.shape(n_layers=layers, n_wires=wires)
        weights = pnp.array(
            np.random.default_rng(7).uniform(0, 2 * np.pi, shape), requires_grad=True
        )
        row = {"wires": wires, "layers": layers, "parameters": int(np.prod(shape))}
        for name, call in calls(wires).items():
            if name in skipped:
                row[name] = None
                continue
            row[name] = fastest(call, weights, repeats, limit)
            if row[name] > cap:
                skipped.add(name)
        adjoint = row.get(ADJOINT)
        checked = wires <= check_up_to and adjoint is not None and adjoint <= cap
        row["check"] = differences(wires, weights) if checked else None
        rows.append(row)
        print(f"  {wires} wires, {layers} layers done", flush=True)
    return rows


def cell(value: float | None) -> str:
    if value is None:
        return "-"
    if value == float("inf"):
        return "stopped"
    return f"{value:.2f} s" if value >= 0.1 else f"{value * 1e3:.1f} ms"


def print_table(title: str, rows: list[dict]) -> None:
    print(f"\n### {title}\n")
    head = ["wires", "layers", "parameters", *CONFIGURATIONS, "full vs adjoint_metric_tensor"]
    head += ["block-diag vs qml.metric_tensor"]
    print("| " + " | ".join(head) + " |")
    print("|---" * len(head) + "|")
    for row in rows:
        check = row["check"]
        checks = ["-", "-"] if check is None else [f"{check[0]:.1e}", f"{check[1]:.1e}"]
        cells = [str(row["wires"]), str(row["layers"]), str(row["parameters"])]
        cells += [cell(row[name]) for name in CONFIGURATIONS] + checks
        print("| " + " | ".join(cells) + " |")


def print_targets(row: dict) -> None:
    p = row["parameters"]
    print(f"\n### Targets ({row['wires']} qubits, {row['layers']} layers, {p} parameters)\n")
    print("| target | measured | met |\n|---|---|---|")

    def ratio(slow: str, fast: str) -> float | None:
        if row[slow] is None or row[fast] is None:
            return None
        if row[slow] == float("inf"):  # stopped at the limit: a lower bound
            return LIMIT_SECONDS[0] / row[fast]
        return row[slow] / row[fast]

    full = ratio(ADJOINT, OURS_FULL)
    block = ratio(BLOCK_LIGHTNING, OURS_BLOCK)
    steps = None if row[VJP] is None else row[OURS_FULL] / row[VJP]
    for name, value, bound, above in (
        ("full: x faster than qml.adjoint_metric_tensor", full, 20, True),
        ("block-diag: x faster than qml.metric_tensor on lightning.qubit", block, 5, True),
        (f"full: cost in training steps (VJP), at most p/4 = {p / 4:.0f}", steps, p / 4, False),
    ):
        met = "-" if value is None else ("yes" if (value >= bound) == above else "no")
        bound_only = name.startswith("full: x") and row[ADJOINT] == float("inf")
        shown = "-" if value is None else f"{'at least ' if bound_only else ''}{value:.1f}"
        print(f"| {name} | {shown} | {met} |")


def plot(path: str, by_qubits: list[dict], by_parameters: list[dict]) -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.2))
    for axes, rows, key, label in (
        (figure.add_subplot(1, 2, 1), by_qubits, "wires", "qubits (2 layers)"),
        (figure.add_subplot(1, 2, 2), by_parameters, "parameters", "parameters (10 qubits)"),
    ):
        for name in CONFIGURATIONS:
            points = [
                (row[key], row[name])
                for row in rows
                if row[name] is not None and row[name] != float("inf")
            ]
            if points:
                x, y = zip(*points, strict=True)
                axes.plot(x, y, marker="o", label=name)
        axes.set_yscale("log")
        axes.set_xlabel(label)
        axes.set_ylabel("seconds per call")
        axes.grid(True, which="both", alpha=0.3)
    figure.axes[0].legend(fontsize=7)
    figure.suptitle("Metric tensor of StronglyEntanglingLayers, 2-core CPU")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--cap", type=float, default=60.0, help="the sweeps' time limit per call (seconds)"
    )
    parser.add_argument("--plot", help="write the two sweeps' plot to this PNG file")
    parser.add_argument(
        "--limit", type=int, default=300, help="seconds after which a call is stopped"
    )
    args = parser.parse_args(argv)
    LIMIT_SECONDS[0] = args.limit
    warnings.simplefilter("ignore")
    if args.quick:
        target, qubits, layers = (8, 2), (4, 6, 8), (1, 2)
    else:
        target, qubits, layers = (16, 4), (8, 10, 12, 14, 16), (1, 2, 4, 8)
    sweep_depth, sweep_wires = (2, 6) if args.quick else (2, 10)
    target_rows = sweep([target], args.repeats, float("inf"), 12, args.limit)
    print_targets(target_rows[0])
    print_table("The target circuit", target_rows)
    # the sweeps stop a call at --cap seconds (the target row at --limit)
    cap = int(args.cap)
    sizes = [(n, sweep_depth) for n in qubits]
    by_qubits = sweep(sizes, args.repeats, args.cap, 12, cap)
    print_table(f"Against the number of qubits ({sweep_depth} layers)", by_qubits)
    sizes = [(sweep_wires, n) for n in layers]
    by_parameters = sweep(sizes, args.repeats, args.cap, 12, cap)
    print_table(f"Against the number of parameters ({sweep_wires} qubits)", by_parameters)
    if args.plot:
        plot(args.plot, by_qubits, by_parameters)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
