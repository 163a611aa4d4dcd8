"""Hybrid classical-quantum classifier: a ``qml.qnn.TorchLayer`` on ``custatevec.qubit``.

Shows a QNode differentiated by the device itself (``diff_method="adjoint"`` with
``device_vjp=True``), compiled with ``pennylane_custatevec.compile`` (each call one
``torch.autograd.Function``, without PennyLane's per-call workflow; ``--plain-qnode`` runs
the QNode itself, with the same results), training inside an ordinary
``torch.nn.Sequential``:

    TorchLayer(data re-uploading circuit) -> Linear(wires, 2)

on a two-class "two moons" data set generated in the script (no downloads). The circuit
alternates an AngleEmbedding of the two features (feature ``w % 2`` on wire ``w``) with a
StronglyEntanglingLayers block, ``--layers`` times. The features are not trainable, so each
minibatch reaches the device as one broadcast circuit (a batch of state vectors) and its
vector-Jacobian product as one batched adjoint sweep.

Run from the repository root (about 30 s on a 2-core CPU with the defaults):

    python demos/torchlayer_classifier.py
    python demos/torchlayer_classifier.py --wires 8 --layers 4 --samples 1000 --epochs 40
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import pennylane as qml
import torch
from tqdm import tqdm

import pennylane_custatevec


@dataclass(frozen=True)
class Result:
    train_accuracy: float
    test_accuracy: float
    final_loss: float
    seconds: float


def make_moons(
    n_samples: int, noise: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Two interleaved half circles (labels 0 and 1), standardised, in random order."""
    n_a = n_samples // 2
    n_b = n_samples - n_a
    t_a = rng.uniform(0.0, np.pi, n_a)
    t_b = rng.uniform(0.0, np.pi, n_b)
    a = np.stack([np.cos(t_a), np.sin(t_a)], axis=1)
    b = np.stack([1.0 - np.cos(t_b), 0.5 - np.sin(t_b)], axis=1)
    x = np.concatenate([a, b]) + noise * rng.standard_normal((n_samples, 2))
    y = np.concatenate([np.zeros(n_a, dtype=np.int64), np.ones(n_b, dtype=np.int64)])
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    order = rng.permutation(n_samples)
    return x[order], y[order]


def build_model(n_wires: int, n_layers: int, compiled: bool = True) -> torch.nn.Module:
    dev = qml.device("custatevec.qubit", wires=n_wires)
    feature_of_wire = [w % 2 for w in range(n_wires)]

    # A trainable classical layer in front of the circuit would make the broadcast angles
    # trainable, and the device then differentiates one tape per sample instead of one
    # broadcast tape (several times slower): the classical layer goes after the circuit.
    @qml.qnode(dev, interface="torch", diff_method="adjoint", device_vjp=True)
    def circuit(inputs: torch.Tensor, weights: torch.Tensor) -> list:
        angles = inputs[..., feature_of_wire]
        for layer in range(n_layers):
            qml.AngleEmbedding(angles, wires=range(n_wires))
            qml.StronglyEntanglingLayers(weights[layer : layer + 1], wires=range(n_wires))
        return [qml.expval(qml.PauliZ(w)) for w in range(n_wires)]

    layer = pennylane_custatevec.compile(circuit) if compiled else circuit
    quantum = qml.qnn.TorchLayer(layer, {"weights": (n_layers, n_wires, 3)})
    return torch.nn.Sequential(quantum, torch.nn.Linear(n_wires, 2))


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train a hybrid TorchLayer classifier on custatevec.qubit."
    )
    parser.add_argument("--wires", type=int, default=4, help="qubits (default 4)")
    parser.add_argument("--layers", type=int, default=3, help="re-uploading layers (default 3)")
    parser.add_argument("--samples", type=int, default=400, help="data set size (default 400)")
    parser.add_argument(
        "--test-fraction", type=float, default=0.25, help="held-out fraction (default 0.25)"
    )
    parser.add_argument("--noise", type=float, default=0.15, help="data noise (default 0.15)")
    parser.add_argument("--epochs", type=int, default=20, help="training epochs (default 20)")
    parser.add_argument("--batch-size", type=int, default=16, help="minibatch (default 16)")
    parser.add_argument("--lr", type=float, default=0.1, help="Adam learning rate (default 0.1)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--plain-qnode",
        action="store_true",
        help="run the QNode itself rather than pennylane_custatevec.compile of it",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Result:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    x_np, y_np = make_moons(args.samples, args.noise, np.random.default_rng(args.seed))
    n_test = int(round(args.test_fraction * args.samples))
    x = torch.tensor(x_np, dtype=torch.float32)
    y = torch.tensor(y_np)
    x_train, y_train, x_test, y_test = x[n_test:], y[n_test:], x[:n_test], y[:n_test]

    model = build_model(args.wires, args.layers, compiled=not args.plain_qnode)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    n_train = len(x_train)
    batches_per_epoch = -(-n_train // args.batch_size)

    start = time.perf_counter()
    epoch_loss = float("nan")
    with tqdm(
        total=args.epochs * batches_per_epoch,
        desc="training",
        unit="batch",
        disable=args.no_progress,
    ) as bar:
        for epoch in range(1, args.epochs + 1):
            order = torch.randperm(n_train)
            total = 0.0
            for i in range(0, n_train, args.batch_size):
                idx = order[i : i + args.batch_size]
                optimizer.zero_grad()
                loss = loss_fn(model(x_train[idx]), y_train[idx])
                loss.backward()
                optimizer.step()
                total += loss.item() * len(idx)
                bar.update()
            epoch_loss = total / n_train
            bar.set_postfix(epoch=epoch, loss=f"{epoch_loss:.4f}")
    seconds = time.perf_counter() - start

    result = Result(
        train_accuracy=accuracy(model, x_train, y_train),
        test_accuracy=accuracy(model, x_test, y_test),
        final_loss=epoch_loss,
        seconds=seconds,
    )
    print(
        f"{args.wires} qubits, {args.layers} layers, {n_train} train / {n_test} test samples, "
        f"{args.epochs} epochs in {seconds:.1f} s"
    )
    print(
        f"final loss {result.final_loss:.4f}  train accuracy {result.train_accuracy:.3f}  "
        f"test accuracy {result.test_accuracy:.3f}"
    )
    return result


if __name__ == "__main__":
    main()
