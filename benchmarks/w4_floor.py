"""How close a torch path can come to ``jax.jit`` on W4: the benchmark's own W4 step
(``workloads.latency``: 20 sequential forward + backward calls, outputs and gradients
taken to numpy) driven by

- the compiled QNode (``pennylane_custatevec.compile``),
- default.qubit under ``jax.jit`` (value and gradient in one compiled call),
- a minimal ``torch.autograd.Function`` whose forward and backward are the device's two
  backend calls (``run_direct``, ``vjp_direct``) and nothing else: the floor of any torch
  path through this device,
- an empty ``torch.autograd.Function`` (a constant forward and backward): torch's own
  cost of a Function with a backward pass.

Warm, best of ``--rounds`` steps, microseconds per call.

    python benchmarks/w4_floor.py
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pennylane as qml
import torch
from device_part import w4_tapes
from workloads import BUILDERS, Setup, Unavailable

import pennylane_custatevec  # noqa: F401 - registers custatevec.qubit

N_WIRES = 4


def _minimal_function(device) -> type[torch.autograd.Function]:
    """The device's two backend calls as a torch Function of the W4 angles."""
    (tape,), config = w4_tapes(device, N_WIRES, 1)
    plan = device.direct_plan(device.structure_of(tape), config)
    if plan is None:
        raise Unavailable("W4's structure does not run directly on this device")

    class TwoBackendCalls(torch.autograd.Function):
        @staticmethod
        def forward(ctx, angles):
            result, run = device.run_direct(plan, angles.detach().numpy()[None, :])
            ctx.run = run
            return torch.from_numpy(np.asarray(result))

        @staticmethod
        def backward(ctx, cotangent):
            gradients = device.vjp_direct(ctx.run, cotangent.item())
            return torch.from_numpy(np.array(gradients, dtype=np.float64))

    return TwoBackendCalls


class _Empty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, angles):
        return torch.from_numpy(np.asarray(0.5))

    @staticmethod
    def backward(ctx, cotangent):
        return torch.from_numpy(np.zeros(N_WIRES))


def _step_with(function):
    """W4's torch step with ``function`` in place of the QNode."""
    import workloads

    original = workloads._torch_qnode
    workloads._torch_qnode = lambda problem, setup: function
    try:
        return BUILDERS["W4"](Setup("custatevec.qubit", "adjoint", True)).step
    finally:
        workloads._torch_qnode = original


def _per_call_us(step, rounds: int) -> float:
    for _ in range(30):
        step()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    return best / 20 * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(2)
    warnings.filterwarnings("ignore", message=".*runs on the CPU backend.*")
    device = qml.device("custatevec.qubit", wires=N_WIRES)
    compiled = Setup("custatevec.qubit", "adjoint", True, compiled=True)
    steps = {"compiled QNode": BUILDERS["W4"](compiled).step}
    try:
        jitted = Setup("default.qubit", "backprop", framework="jax.jit")
        steps["default.qubit + jax.jit"] = BUILDERS["W4"](jitted).step
    except Unavailable as exc:
        print(f"default.qubit + jax.jit: unavailable ({exc})")
    steps["two backend calls in a Function"] = _step_with(_minimal_function(device).apply)
    steps["empty Function"] = _step_with(_Empty.apply)
    for name in ("two backend calls in a Function", "default.qubit + jax.jit"):
        if name in steps:  # the same values and gradients as the compiled QNode's
            for got, want in zip(steps[name](), steps["compiled QNode"](), strict=True):
                np.testing.assert_allclose(got, want, atol=1e-8, err_msg=name)
    print("| W4 step driven by | us per call |")
    print("|---|---|")
    for name, step in steps.items():
        print(f"| {name} | {_per_call_us(step, args.rounds):.1f} |")


if __name__ == "__main__":
    main()
