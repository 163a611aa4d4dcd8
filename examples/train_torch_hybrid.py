"""Train a small hybrid classical-quantum torch model on the custatevec.qubit device.

A two-class "two moons" data set is generated in code; the model is a 4-qubit QNode
(AngleEmbedding of the 2 features + 2 StronglyEntanglingLayers, as a TorchLayer) followed by
Linear(4, 2), trained with Adam on the cross-entropy loss.

    python examples/train_torch_hybrid.py [--epochs 15] [--samples 64]
"""

import argparse
import time

import numpy as np
import pennylane as qml
import torch

N_QUBITS = 4
N_LAYERS = 2


def make_moons(n_samples, noise=0.1, seed=0):
    """Two interleaved half circles, labels 0 and 1, features scaled to about [-1, 1]."""
    rng = np.random.default_rng(seed)
    n_a = n_samples // 2
    n_b = n_samples - n_a
    t_a = np.linspace(0.0, np.pi, n_a)
    t_b = np.linspace(0.0, np.pi, n_b)
    a = np.stack([np.cos(t_a), np.sin(t_a)], axis=1)
    b = np.stack([1.0 - np.cos(t_b), 0.5 - np.sin(t_b)], axis=1)
    x = np.concatenate([a, b]) + noise * rng.standard_normal((n_samples, 2))
    y = np.concatenate([np.zeros(n_a, dtype=np.int64), np.ones(n_b, dtype=np.int64)])
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    perm = rng.permutation(n_samples)
    return x[perm], y[perm]


def build_model(dev):
    """TorchLayer on the raw features (not trainable, so a minibatch is one broadcast
    circuit) followed by a classical read-out layer."""

    @qml.qnode(dev, interface="torch", diff_method="best")
    def qnode(inputs, weights):
        qml.AngleEmbedding(inputs, wires=range(2))
        qml.StronglyEntanglingLayers(weights, wires=range(N_QUBITS))
        return [qml.expval(qml.PauliZ(w)) for w in range(N_QUBITS)]

    weight_shapes = {"weights": (N_LAYERS, N_QUBITS, 3)}
    diff_method = qml.workflow.get_best_diff_method(qnode)(
        torch.zeros(2), torch.zeros(weight_shapes["weights"])
    )
    model = torch.nn.Sequential(
        qml.qnn.TorchLayer(qnode, weight_shapes),
        torch.nn.Linear(N_QUBITS, 2),
    )
    return model, diff_method


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15, help="training epochs (default 15)")
    parser.add_argument("--samples", type=int, default=64, help="data set size (default 64)")
    parser.add_argument("--batch-size", type=int, default=16, help="minibatch size (default 16)")
    parser.add_argument(
        "--device",
        default="custatevec.qubit",
        help="PennyLane device name, for comparison (default custatevec.qubit)",
    )
    args = parser.parse_args()

    torch.manual_seed(0)
    x_np, y_np = make_moons(args.samples, seed=0)
    x = torch.tensor(x_np, dtype=torch.float32)
    y = torch.tensor(y_np)

    dev = qml.device(args.device, wires=N_QUBITS)
    print(dev)

    model, diff_method = build_model(dev)
    print(f"diff_method='best' resolved to {diff_method!r}")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()

    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(args.samples)
        total = 0.0
        for i in range(0, args.samples, args.batch_size):
            idx = order[i : i + args.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
        print(f"epoch {epoch:3d}  loss {total / args.samples:.4f}", flush=True)

    with torch.no_grad():
        accuracy = (model(x).argmax(dim=1) == y).float().mean().item()
    print(f"final accuracy {accuracy:.3f}  ({time.perf_counter() - start:.1f} s training)")


if __name__ == "__main__":
    main()
