"""The device's own part of one W4 call (issue 16, item 7): ``execute`` and the
``compute_vjp`` that follows, on preprocessed W4 tapes (RX on each of 4 wires, a CNOT
chain, expval(Z3)), without PennyLane's workflow or torch around them.

Each timed call gets a tape of new angles (as a training step does: the kept state and
the structure cache see a new parameter row every call); the tapes are preprocessed
beforehand. Prints the best of ``--rounds`` rounds of ``--calls`` calls, per call.

    python benchmarks/device_part.py                 # custatevec.qubit
    python benchmarks/device_part.py --device lightning.qubit
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pennylane as qml
from pennylane.devices import ExecutionConfig


def w4_tapes(device, n_wires: int, calls: int, seed: int = 0) -> tuple[list, ExecutionConfig]:
    """``calls`` preprocessed W4 tapes of seeded angles, and the adjoint VJP config."""
    config = device.setup_execution_config(
        ExecutionConfig(gradient_method="adjoint", use_device_jacobian_product=True)
    )
    program = device.preprocess_transforms(config)
    rng = np.random.default_rng(seed)
    tapes = []
    for _ in range(calls):
        angles = rng.uniform(0, np.pi, n_wires)
        ops = [qml.RX(a, wires=w) for w, a in enumerate(angles)]
        ops += [qml.CNOT([w, w + 1]) for w in range(n_wires - 1)]
        tape = qml.tape.QuantumScript(
            ops, [qml.expval(qml.Z(n_wires - 1))], trainable_params=list(range(n_wires))
        )
        (processed,), _ = program((tape,))
        tapes.append(processed)
    return tapes, config


def per_call_seconds(device, tapes, config, rounds: int) -> float:
    """The best round's time per call of ``execute`` + ``compute_vjp``."""

    def one_round() -> float:
        start = time.perf_counter()
        for tape in tapes:
            device.execute([tape], config)
            device.compute_vjp([tape], [np.float64(1.0)], config)
        return (time.perf_counter() - start) / len(tapes)

    one_round()  # warm-up: kernels compiled, the structure made
    return min(one_round() for _ in range(rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="custatevec.qubit")
    parser.add_argument("--wires", type=int, default=4)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*runs on the CPU backend.*")
    device = qml.device(args.device, wires=args.wires)
    tapes, config = w4_tapes(device, args.wires, args.calls)
    seconds = per_call_seconds(device, tapes, config, args.rounds)
    print(
        f"{args.device}: execute + compute_vjp of W4 ({args.wires} wires), per call: "
        f"{seconds * 1e3:.3f} ms (best of {args.rounds} rounds of {args.calls} calls)"
    )


if __name__ == "__main__":
    main()
