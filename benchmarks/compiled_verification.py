"""The cost of the compiled path's verification schedule on W4 (``compile``'s
``verify_every``): a replaying key is traced again and compared at its calls 4, 8, ...,
``verify_every``, then every ``verify_every``-th call.

W4's circuit (RX on each of 4 wires, a CNOT chain, expval(Z3)), one compiled QNode per
setting, ``--calls`` sequential forward + backward calls per run after the key's first
three (recorded, traced, traced), each call timed. Reported per setting, best of
``--rounds`` runs (the settings alternate): the whole run, the median replayed call, the
median verification call, and the run's extra time against ``verify_every=None``.

    python benchmarks/compiled_verification.py --calls 1024 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pennylane as qml
import torch
from workloads import chain_problem

import pennylane_custatevec

N_WIRES = 4


def _compiled(verify_every):
    problem = chain_problem(N_WIRES, 1)
    qnode = qml.QNode(
        problem.circuit,
        qml.device("custatevec.qubit", wires=N_WIRES),
        interface="torch",
        diff_method="adjoint",
    )
    return pennylane_custatevec.compile(qnode, verify_every=verify_every)


def _is_verification(call: int, verify_every) -> bool:
    if verify_every is None or call < 4:
        return False
    if call > verify_every:
        return call % verify_every == 0
    return call & (call - 1) == 0


def run(verify_every, calls: int, angles: np.ndarray) -> tuple[float, list, list]:
    """(seconds for the calls after the first three, replayed calls' seconds,
    verification calls' seconds)."""
    compiled = _compiled(verify_every)
    inputs = [torch.tensor(row, requires_grad=True) for row in angles]
    for call in range(1, 4):
        compiled(inputs[call % len(inputs)]).backward()
    replayed, verified = [], []
    start = time.perf_counter()
    for call in range(4, calls + 4):
        x = inputs[call % len(inputs)]
        x.grad = None
        begin = time.perf_counter()
        compiled(x).backward()
        seconds = time.perf_counter() - begin
        (verified if _is_verification(call, verify_every) else replayed).append(seconds)
    return time.perf_counter() - start, replayed, verified


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--verify-every", type=int, default=1024)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    angles = np.random.default_rng(11).uniform(0.0, np.pi, size=(16, N_WIRES))
    settings = (None, args.verify_every)
    best: dict = {s: None for s in settings}
    for _ in range(args.rounds):
        for setting in settings:
            total, replayed, verified = run(setting, args.calls, angles)
            if best[setting] is None or total < best[setting][0]:
                best[setting] = (total, replayed, verified)
    baseline = best[None][0]
    print(f"W4 compiled, {args.calls} forward + backward calls after the first three, ")
    print(f"best of {args.rounds} runs (torch threads: 2)\n")
    print("| verify_every | run (ms) | per call (us) | median replayed call (us) | "
          "verification calls | median verification call (us) | extra vs None |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for setting in settings:
        total, replayed, verified = best[setting]
        median_verified = f"{statistics.median(verified) * 1e6:.0f}" if verified else "-"
        print(
            f"| {setting} | {total * 1e3:.1f} | {total / args.calls * 1e6:.1f} | "
            f"{statistics.median(replayed) * 1e6:.1f} | {len(verified)} | {median_verified} | "
            f"{(total / baseline - 1) * 100:+.1f}% |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
