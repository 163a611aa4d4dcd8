"""What the compiled path's lane gains by taking the Jacobian in the forward pass
(``compiled.lanes.DirectLane.jacobian_on_forward``), and what it costs:

- per size, the device's direct calls on W4's circuit (RX on each wire, a CNOT chain,
  expval of Z on the last wire): ``run_direct`` alone, ``run_direct_jacobian`` (the
  forward and the Jacobian in one backend call) and ``run_direct`` + ``vjp_direct``
  (a forward and a VJP), best of 5 rounds, with the Jacobian's cost per amplitude update
  (2^n amplitudes x gates);
- W4's compiled call (``pennylane_custatevec.compile``) with the lane's Jacobian off and
  on, calls alternating one by one, the median forward and backward times.

Sizes the thresholds ``JACOBIAN_ON_FORWARD_WORK`` and ``JACOBIAN_ON_FORWARD_EXTRA_WORK``.

    python benchmarks/lane_jacobian.py
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pennylane as qml
import torch
from device_part import w4_tapes
from workloads import chain_problem

import pennylane_custatevec
from pennylane_custatevec.compiled import lanes


def _best_us(call, calls: int) -> float:
    for _ in range(20):
        call()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def direct_calls(sizes: list[int]) -> None:
    print("| n | gates | run_direct us | run_direct_jacobian us | run + vjp us | ns per update |")
    print("|---|---|---|---|---|---|")
    for n in sizes:
        print(_direct_row(n))


def _direct_row(n: int) -> str:
    device = qml.device("custatevec.qubit", wires=n)
    (tape,), config = w4_tapes(device, n, 1)
    plan = device.direct_plan(device.structure_of(tape), config)
    angles = np.random.default_rng(0).uniform(0, np.pi, (1, n))
    gates = len(plan.structure.compilation.steps)

    def forward_and_vjp():
        _, run = device.run_direct(plan, angles)
        device.vjp_direct(run, 1.0)

    alone = _best_us(lambda: device.run_direct(plan, angles), 500)
    jacobian = _best_us(lambda: device.run_direct_jacobian(plan, angles), 500)
    vjp = _best_us(forward_and_vjp, 500)
    per_update = (jacobian - alone) / (2**n * gates) * 1e3
    return f"| {n} | {gates} | {alone:.1f} | {jacobian:.1f} | {vjp:.1f} | {per_update:.2f} |"


def _compiled_w4(jacobian_work: int):
    problem = chain_problem(4, 1)
    saved = lanes.JACOBIAN_ON_FORWARD_WORK
    lanes.JACOBIAN_ON_FORWARD_WORK = jacobian_work  # read when the lane is built
    try:
        device = qml.device("custatevec.qubit", wires=4)
        qnode = qml.QNode(
            problem.circuit, device, interface="torch", diff_method="adjoint", device_vjp=True
        )
        compiled = pennylane_custatevec.compile(qnode)
        angles = torch.tensor(problem.calls[0][0], requires_grad=True)
        for _ in range(50):  # record, trace, then the lane
            angles.grad = None
            compiled(angles).backward()
    finally:
        lanes.JACOBIAN_ON_FORWARD_WORK = saved
    return compiled, angles


def compiled_w4(calls: int) -> None:
    variants = {"VJP in the backward": _compiled_w4(0), "Jacobian on forward": _compiled_w4(2**16)}
    times = {name: ([], []) for name in variants}
    clock = time.perf_counter
    for _ in range(calls):
        for name, (compiled, angles) in variants.items():
            angles.grad = None
            start = clock()
            value = compiled(angles)
            middle = clock()
            value.backward()
            end = clock()
            times[name][0].append(middle - start)
            times[name][1].append(end - middle)
    print("| W4 compiled, lane | forward us | backward us | total us |")
    print("|---|---|---|---|")
    for name, (forward, backward) in times.items():
        f, b = np.median(forward) * 1e6, np.median(backward) * 1e6
        print(f"| {name} | {f:.1f} | {b:.1f} | {f + b:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 10, 12])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    torch.set_num_threads(2)
    warnings.filterwarnings("ignore", message=".*runs on the CPU backend.*")
    direct_calls(args.sizes)
    print()
    compiled_w4(args.calls)


if __name__ == "__main__":
    main()
