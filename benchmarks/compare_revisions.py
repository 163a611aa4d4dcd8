"""Time our device's workloads from two source trees, step by step in turn.

``run_workloads.py`` compares this device with its peers within one run, but two runs of it
(one per revision) differ by 10-30 % on a shared 2-core machine (the peers' times move as
much as ours), which hides a regression of a few percent. Here two worker processes, one
importing ``pennylane_custatevec`` from each tree (``PYTHONPATH``), build the same workloads
(``workloads.py`` of this tree) with our default configuration (adjoint with device VJPs;
W2's device Jacobian, as ``run_workloads.py``), cross-check their values and gradients, then
take turns: each round times one step of each, the order swapped every round, so that a slow
phase of the machine hits both. Each round's head/base ratio compares two steps next to
each other in time; the report gives their median and quartiles (the figure to read), and
each tree's best step.

    python benchmarks/compare_revisions.py --base /path/to/old/checkout --rounds 10

``--compiled``: each tree's QNodes wrapped by ``pennylane_custatevec.compile`` (the torch
workloads; every step continues the same keys' calls, so a step may hold a verification).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TORCH_THREADS = 2  # as run_workloads.py: the machine's cores
JACOBIAN_WORKLOADS = frozenset({"W2"})  # as run_workloads.py: a full Jacobian, no VJP


# ---------------------------------------------------------------------------------------
# The worker: one process per tree, driven over stdin/stdout, one JSON line per request


def worker(compiled: bool = False) -> None:
    """Answer ``build W``, ``time W`` and ``drop W`` requests, one JSON line each;
    ``compiled``: the QNodes wrapped by ``pennylane_custatevec.compile``."""
    import torch

    sys.path.insert(0, str(HERE))
    from workloads import BUILDERS, Setup

    import pennylane_custatevec

    torch.set_num_threads(TORCH_THREADS)
    built = {}
    _reply({"package": pennylane_custatevec.__file__})
    for line in sys.stdin:
        request, workload_id = line.split()
        if request == "build":
            vjp = workload_id not in JACOBIAN_WORKLOADS
            setup = Setup("custatevec.qubit", "adjoint", vjp, compiled=compiled)
            built[workload_id] = BUILDERS[workload_id](setup)
            values, gradients = built[workload_id].step()  # the warm-up, and the cross-check
            _reply({"values": np.ravel(values).tolist(), "gradients": np.ravel(gradients).tolist()})
        elif request == "time":
            start = time.perf_counter()
            built[workload_id].step()
            _reply({"seconds": time.perf_counter() - start})
        elif request == "drop":
            del built[workload_id]
            _reply({})


def _reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------------------------------
# The driver


class Worker:
    """A worker process importing the package from ``tree``."""

    def __init__(self, tree: Path, compiled: bool = False):
        env = dict(os.environ, PYTHONPATH=str(tree))
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--worker", *(["--compiled"] if compiled else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tree,
        )
        self.package = self._read()["package"]
        expected = (tree / "pennylane_custatevec" / "__init__.py").resolve()
        if Path(self.package).resolve() != expected:
            raise RuntimeError(f"the worker for {tree} imported {self.package}, not {expected}")

    def ask(self, request: str, workload_id: str) -> dict:
        self.process.stdin.write(f"{request} {workload_id}\n")
        self.process.stdin.flush()
        return self._read()

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"a worker stopped (exit status {self.process.wait()})")
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


@dataclass(frozen=True)
class Comparison:
    """One workload's times from the two trees."""

    base: float
    """The best base step, seconds."""
    head: float
    """The best head step, seconds."""
    round_ratios: tuple[float, ...]
    """head / base of each round: two steps next to each other in time, which a slow
    phase of the machine (seconds long) hits alike; their median is the figure to read."""
    note: str = ""
    """MISMATCH where the trees' values or gradients differ."""

    @property
    def median_ratio(self) -> float:
        return float(np.median(self.round_ratios))

    @property
    def quartiles(self) -> tuple[float, float]:
        low, high = np.percentile(self.round_ratios, [25, 75])
        return float(low), float(high)


def compare(
    base: Worker, head: Worker, workload_id: str, rounds: int, warm_up: int = 1
) -> Comparison:
    """Build the workload in both trees, cross-check them (the first warm-up step), take
    ``warm_up - 1`` more untimed steps each, time ``rounds`` rounds."""
    built = [base.ask("build", workload_id), head.ask("build", workload_id)]
    note = ""
    for key in ("values", "gradients"):
        if not np.allclose(built[0][key], built[1][key], atol=1e-6):
            note = "MISMATCH"
    workers = [base, head]
    for _ in range(warm_up - 1):
        for worker in workers:
            worker.ask("time", workload_id)
    times: list[list[float]] = [[], []]
    for round_index in range(rounds):
        order = (0, 1) if round_index % 2 == 0 else (1, 0)
        for index in order:
            times[index].append(workers[index].ask("time", workload_id)["seconds"])
    base.ask("drop", workload_id)
    head.ask("drop", workload_id)
    ratios = tuple(new / old for old, new in zip(times[0], times[1], strict=True))
    return Comparison(min(times[0]), min(times[1]), ratios, note)


def _revision(tree: Path) -> str:
    """The tree's commit, and whether its package differs from that commit."""

    def git(*words: str) -> str:
        run = subprocess.run(["git", "-C", str(tree), *words], capture_output=True, text=True)
        return run.stdout.strip() if run.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "an unknown commit"
    changed = git("status", "--porcelain", "--", "pennylane_custatevec")
    return f"{commit}{' with uncommitted changes to the package' if changed else ''}"


def _seconds(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the older source tree")
    parser.add_argument("--head", type=Path, default=HERE.parent, help="default: this tree")
    parser.add_argument("--workloads", default="W1,W2,W3,W4,W4F,W5,W6")
    parser.add_argument("--rounds", type=int, default=10, help="timed steps per tree")
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    parser.add_argument("--compiled", action="store_true", help="time compiled QNodes")
    parser.add_argument(
        "--warm-up", type=int, default=1, help="untimed steps per tree first (at least 1)"
    )
    args = parser.parse_args(argv)
    base = Worker(args.base.resolve(), args.compiled)
    head = Worker(args.head.resolve(), args.compiled)
    lines = [
        "# Two revisions of custatevec.qubit, step by step in turn",
        "",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- base: {base.package} at {_revision(args.base)}",
        f"- head: {head.package} at {_revision(args.head)}",
        f"- command: `python benchmarks/compare_revisions.py {' '.join(argv or sys.argv[1:])}`",
        f"- {args.rounds} rounds after {args.warm_up} warm-up steps, one step of each tree per "
        "round, the order "
        "swapped every round; ratio below 1: head is faster",
        "",
        "| workload | base, best | head, best | head / base, median of rounds | quartiles |",
        "| --- | --- | --- | --- | --- |",
    ]
    try:
        for workload_id in args.workloads.split(","):
            print(f"[{time.strftime('%H:%M:%S')}] {workload_id}", file=sys.stderr, flush=True)
            result = compare(base, head, workload_id, args.rounds, args.warm_up)
            low, high = result.quartiles
            cells = [
                workload_id,
                _seconds(result.base),
                _seconds(result.head),
                f"{result.median_ratio:.3f} {result.note}".strip(),
                f"{low:.3f} - {high:.3f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    finally:
        base.close()
        head.close()
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(compiled=sys.argv[2:] == ["--compiled"])
    else:
        main()
