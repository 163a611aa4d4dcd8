"""A batch of R cotangents (``torch.func.vmap`` over ``torch.func.vjp``, ``torch.func.jacrev``)
reaches the device as ONE batch: one ``vjp_structures`` sweep, with the values of R
separate backward passes; torch's legacy vmap gets an error naming the alternatives."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import torch

import pennylane_custatevec
from pennylane_custatevec import options
from pennylane_custatevec.device import CuStateVecDevice


def _circuit():
    @qml.qnode(qml.device("custatevec.qubit", wires=3, backend="cpu"), interface="torch")
    def circuit(x):
        qml.RX(x[0], 0)
        qml.RY(x[1], 1)
        qml.CNOT([0, 1])
        qml.CRZ(x[2], [1, 2])
        qml.IsingXX(x[0] * x[1], wires=[0, 2])
        return qml.expval(qml.Z(0)), qml.probs(wires=[1, 2])

    return circuit


def _flat(result):
    return torch.cat([result[0].reshape(1), result[1]])


@pytest.fixture
def sweeps(monkeypatch):
    """The cotangent shapes of each ``vjp_structures`` call."""
    seen = []
    original = CuStateVecDevice.vjp_structures

    def spy(self, run, cotangents, config=None):
        seen.append([tuple(np.shape(dy)) for dy in cotangents[0]])
        return original(self, run, cotangents, config)

    monkeypatch.setattr(CuStateVecDevice, "vjp_structures", spy)
    return seen


def _warm_up(compiled, x) -> None:
    """The key's recorded and traced calls (torch.func transforms run replayed calls: the
    recorded ones convert parameters with PennyLane, which torch.func's tensors refuse)."""
    compiled(x.detach().requires_grad_())
    compiled(x.detach().requires_grad_())
    assert list(compiled.modes().values()) == ["REPLAY"]


def _separate_rows(circuit, x, rows):
    out = []
    for row in rows:
        (gradient,) = torch.autograd.grad(_flat(circuit(x)), x, row)
        out.append(gradient)
    return torch.stack(out)


@pytest.mark.parametrize("accumulation", ["deferred", "eager"])
def test_vmap_over_vjp_is_one_sweep_of_r_cotangents(sweeps, accumulation):
    circuit = _circuit()
    compiled = pennylane_custatevec.compile(circuit)
    x = torch.tensor([0.3, -0.8, 1.1], dtype=torch.float64, requires_grad=True)
    rows = torch.as_tensor(np.random.default_rng(3).uniform(-1, 1, (6, 5)))
    with options(grad_accumulation=accumulation):
        expected = _separate_rows(circuit, x, rows)
        _warm_up(compiled, x)
        for _ in range(2):
            sweeps.clear()
            _, vjp_fn = torch.func.vjp(lambda v: _flat(compiled(v)), x)
            (batched,) = torch.func.vmap(vjp_fn)(rows)
            assert sweeps == [[(6,), (6, 4)]]
            torch.testing.assert_close(batched, expected, atol=1e-10, rtol=0)


def test_jacrev_is_one_sweep(sweeps):
    circuit = _circuit()
    compiled = pennylane_custatevec.compile(circuit)
    x = torch.tensor([0.5, 0.2, -0.4], dtype=torch.float64, requires_grad=True)
    expected = torch.autograd.functional.jacobian(lambda v: _flat(circuit(v)), x)
    _warm_up(compiled, x)
    for _ in range(2):
        sweeps.clear()
        jacobian = torch.func.jacrev(lambda v: _flat(compiled(v)))(x)
        assert sweeps == [[(5,), (5, 4)]]
        torch.testing.assert_close(jacobian, expected, atol=1e-10, rtol=0)


def test_legacy_vmap_gets_an_error_naming_the_alternatives():
    compiled = pennylane_custatevec.compile(_circuit())
    x = torch.tensor([0.5, 0.2, -0.4], dtype=torch.float64, requires_grad=True)
    y = _flat(compiled(x))
    with pytest.raises(RuntimeError, match="torch.func.vmap over torch.func.vjp"):
        torch.autograd.grad(y, x, torch.eye(5, dtype=torch.float64), is_grads_batched=True)
