"""Print doc/support_matrix.md's table by running it: for each measurement, each
differentiation method, analytic or with shots, and an interface, whether a gradient of a
small circuit on custatevec.qubit runs, or the first words of the error that refuses it.

    PYTHONPATH=. python scripts/support_matrix.py [--interface autograd|torch|jax]

The cells come from running, not from reading the code: rerun it after a change and paste
its table into doc/support_matrix.md.
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import pennylane as qml

MEASUREMENTS = {
    "expval": lambda: qml.expval(qml.Z(0) @ qml.Z(1)),
    "var": lambda: qml.var(qml.X(0)),
    "probs": lambda: qml.probs(wires=[0, 1]),
    "state": lambda: qml.state(),
    "density_matrix": lambda: qml.density_matrix(wires=[0]),
    "purity": lambda: qml.purity(wires=[0]),
    "vn_entropy": lambda: qml.vn_entropy(wires=[0]),
    "sample": lambda: qml.sample(wires=[0]),
    "counts": lambda: qml.counts(wires=[0]),
}
REASONS = {
    "does not support backprop": "no: no backprop (A)",
    "needs analytic execution": "no: adjoint needs analytic (B)",
    "not accepted with finite shots": "no: analytic only (C)",
    "not accepted for analytic simulation": "no: needs shots (D)",
    "return the state with the parameter-shift": "no: shift rules cannot (E)",
    "cannot differentiate qml.purity": "no: shift rules wrong (F)",
    "it supports expval, var, probs": "no: not differentiable (G)",
    "Expected isFloatingType": "no: torch refuses (H)",
}
"""The first words of a refusal -> its cell; the legend of doc/support_matrix.md explains
each letter."""

METHODS = ["adjoint", "parameter-shift", "finite-diff", "backprop", "best"]
SHOTS = {"analytic": None, "shots": 1000}


def _reduce(result, interface):
    """A scalar of a measurement's result, differentiable in its interface."""
    if interface == "torch":
        import torch  # noqa: PLC0415

        return torch.real(result).sum() if torch.is_complex(result) else result.sum()
    if interface == "jax":
        import jax.numpy as jnp  # noqa: PLC0415

        return jnp.real(jnp.sum(result))
    return qml.math.real(qml.math.sum(result))


def cell(measurement: str, method: str, shots, interface: str) -> str:
    dev = qml.device("custatevec.qubit", wires=2, backend="cpu", seed=1)

    def quantum_function(x):
        qml.RX(x, wires=0)
        qml.CNOT(wires=[0, 1])
        qml.RY(0.3, wires=1)
        return MEASUREMENTS[measurement]()

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            circuit = qml.set_shots(
                qml.QNode(quantum_function, dev, interface=interface, diff_method=method), shots
            )
            if measurement in ("sample", "counts"):
                circuit(0.5)
                return "runs"
            if interface == "torch":
                import torch  # noqa: PLC0415

                x = torch.tensor(0.5, requires_grad=True, dtype=torch.float64)
                _reduce(circuit(x), interface).backward()
                grad = x.grad
            elif interface == "jax":
                import jax  # noqa: PLC0415

                grad = jax.grad(lambda x: _reduce(circuit(x), interface))(0.5)
            else:
                x = qml.numpy.array(0.5, requires_grad=True)
                grad = qml.grad(lambda x: _reduce(circuit(x), interface))(x)
        if not np.all(np.isfinite(np.asarray(grad))):
            return "NaN gradient"
        return "works"
    except Exception as error:  # noqa: BLE001 - the cell reports it
        for words, label in REASONS.items():
            if words in str(error):
                return label
        return f"no: {type(error).__name__}: {str(error)[:80]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interface", default="autograd", choices=["autograd", "torch", "jax"])
    args = parser.parse_args()
    header = ["measurement"] + [f"{m}, {s}" for m in METHODS for s in SHOTS]
    print("| " + " | ".join(header) + " |")
    print("| " + " | ".join("---" for _ in header) + " |")
    for measurement in MEASUREMENTS:
        row = [f"`{measurement}`"]
        for method in METHODS:
            for shots in SHOTS.values():
                row.append(cell(measurement, method, shots, args.interface))
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
