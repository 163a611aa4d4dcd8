"""What ``diff_method="best"`` (a QNode's default) costs over an explicit ``"adjoint"``.

PennyLane asks the device on every call whether it differentiates the circuit
(``supports_derivatives``); for "best" the device answers by running the adjoint method's
preprocessing on the circuit (``_adjoint_serves``), and then the execution runs it again.
The answer is kept per ``structures.adjoint_serve_key``. This times the benchmark's own W4
step (``workloads.latency``: 20 sequential forward + backward calls, torch, device VJPs)
with "best" and with "adjoint", the two alternating step by step, and prints the medians
per call and their difference. Run it against two trees with ``PYTHONPATH`` to compare
revisions.

    python benchmarks/best_resolution.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from workloads import BUILDERS, Setup

import pennylane_custatevec  # noqa: F401 - registers custatevec.qubit

CALLS_PER_STEP = 20  # workloads.latency's default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    steps = {
        method: BUILDERS["W4"](Setup("custatevec.qubit", method, True)).step
        for method in ("best", "adjoint")
    }
    for got, want in zip(steps["best"](), steps["adjoint"](), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-12)  # the same numbers
    for step in steps.values():
        for _ in range(20):
            step()
    times: dict[str, list[float]] = {method: [] for method in steps}
    order = list(steps)
    for _ in range(args.rounds):
        for method in order:
            start = time.perf_counter()
            steps[method]()
            times[method].append((time.perf_counter() - start) / CALLS_PER_STEP * 1e6)
        order.reverse()  # neither always runs first
    medians = {method: float(np.median(values)) for method, values in times.items()}
    print("| W4 call (forward + backward), torch, device VJPs | median us per call |")
    print("|---|---|")
    for method, value in medians.items():
        print(f'| diff_method="{method}" | {value:.0f} |')
    print(f'| "best" - "adjoint" | {medians["best"] - medians["adjoint"]:.0f} |')


if __name__ == "__main__":
    main()
