"""``qml.qnn.TorchLayer`` on a compiled QNode trains as on the QNode (5 seeded SGD steps:
losses and weights to 1e-10), also inside a model under ``torch.compile`` (the compiled
call is a graph break, backend "eager")."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import torch

import pennylane_custatevec


def _qnode():
    @qml.qnode(qml.device("custatevec.qubit", wires=3, backend="cpu"), interface="torch")
    def circuit(inputs, weights):
        qml.AngleEmbedding(inputs, wires=range(3))
        qml.StronglyEntanglingLayers(weights, wires=range(3))
        return [qml.expval(qml.Z(0)), qml.expval(qml.Z(1))]

    return circuit


def _train(qnode, compiled_model: bool):
    """Losses and final parameters of 5 SGD steps of TorchLayer(qnode) + Linear."""
    torch.manual_seed(0)
    layer = qml.qnn.TorchLayer(qnode, {"weights": (2, 3, 3)})
    model = torch.nn.Sequential(layer, torch.nn.Linear(2, 1)).double()
    if compiled_model:
        model = torch.compile(model, backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = np.random.default_rng(0)
    inputs = torch.as_tensor(generator.uniform(-1, 1, (6, 3)))
    targets = torch.as_tensor(generator.uniform(-1, 1, (6, 1)))
    losses = []
    for _ in range(5):
        optimizer.zero_grad()
        loss = ((model(inputs) - targets) ** 2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses), [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("compiled_model", [False, True], ids=["eager", "torch.compile"])
def test_torch_layer_training_equals_the_qnodes(compiled_model):
    want_losses, want_parameters = _train(_qnode(), compiled_model=False)
    compiled = pennylane_custatevec.compile(_qnode())
    got_losses, got_parameters = _train(compiled, compiled_model)
    assert list(compiled.modes().values()) == ["REPLAY"]
    torch.testing.assert_close(got_losses, want_losses, atol=1e-10, rtol=0)
    for got, want in zip(got_parameters, want_parameters, strict=True):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
