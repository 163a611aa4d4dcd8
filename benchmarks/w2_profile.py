"""Where W2's step (the full Jacobian, benchmarks/workloads.py) spends its time, on this device
and on lightning.qubit (adjoint, Jacobian on the forward pass).

    python benchmarks/w2_profile.py [--repeat 5] [--quick]

Device time is each device's ``execute_and_compute_derivatives`` (ours under torch:
``execute`` in the forward pass and ``compute_derivatives`` in the first backward call);
the rest of the step is PennyLane and torch (``torch.autograd.functional.jacobian`` runs
one backward pass per output). Our device's time is split further: the forward pass, the
sweep, and in the sweep the one-qubit block steps and the CNOTs (one by one, or as
permutation runs). Steps alternate between the two devices; the parts printed are those
of each device's fastest step. ``--quick``: 6 wires.
"""

import argparse
import collections
import time
import warnings
from collections.abc import Callable

import pennylane_lightning.lightning_qubit as lightning
import torch
from workloads import BUILDERS, QUICK_SIZES, Setup

import pennylane_custatevec.device as device
import pennylane_custatevec.gradients.deferred as deferred
from pennylane_custatevec.backends.cpu import CPUBackend

PARTS = collections.Counter()


def timed(owner: object, name: str, label: str) -> None:
    """Replace ``owner.name`` by a wrapper that adds its time to ``PARTS[label]``."""
    original: Callable = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            PARTS[label] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="6 wires instead of 16")
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES["W2"] if args.quick else {}
    warnings.filterwarnings("ignore", message="custatevec.qubit runs on the CPU backend")
    torch.set_num_threads(2)
    # under torch the device executes in the forward pass and takes the Jacobian in the
    # first backward call (grad_on_execution=False); both count as the device's time
    for method in ("execute", "compute_derivatives", "execute_and_compute_derivatives"):
        timed(device.CuStateVecDevice, method, "ours: device")
    timed(device.CuStateVecDevice, "_execute", "ours: forward pass")
    timed(deferred, "sweep", "ours: sweep")
    timed(CPUBackend, "adjoint_block_step", "ours: sweep, one-qubit block steps")
    timed(CPUBackend, "apply_pauli", "ours: CNOTs, forward and sweep")
    timed(
        CPUBackend, "apply_bit_permutation", "ours: CNOT rings as permutations, forward and sweep"
    )
    # a small circuit (--quick) runs as one gate sequence per pass (sequences.py)
    timed(CPUBackend, "run_sequence", "ours: gate sequences, forward and sweep")
    timed(CPUBackend, "sweep_sequence", "ours: gate sequences, forward and sweep")
    timed(lightning.LightningQubit, "execute_and_compute_derivatives", "lightning: device")
    steps = {
        "ours": BUILDERS["W2"](Setup("custatevec.qubit", "adjoint"), **sizes).step,
        "lightning": BUILDERS["W2"](Setup("lightning.qubit", "adjoint"), **sizes).step,
    }
    for step in steps.values():
        step()
    best = dict.fromkeys(steps, float("inf"))
    parts: dict[str, float] = {}
    for _ in range(args.repeat):
        for name, step in steps.items():
            PARTS.clear()
            start = time.perf_counter()
            step()
            elapsed = time.perf_counter() - start
            if elapsed < best[name]:
                best[name] = elapsed
                parts.update({k: v for k, v in PARTS.items() if k.startswith(name)})
    for name in steps:
        in_device = parts[f"{name}: device"]
        print(
            f"{name}: step {1e3 * best[name]:.0f} ms, device {1e3 * in_device:.0f} ms, "
            f"PennyLane and torch {1e3 * (best[name] - in_device):.0f} ms"
        )
    for label, seconds in sorted(parts.items()):
        if not label.endswith(": device"):
            print(f"  {label}: {1e3 * seconds:.1f} ms")


if __name__ == "__main__":
    main()
