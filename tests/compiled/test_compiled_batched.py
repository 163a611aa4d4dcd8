"""A batch of R cotangents (``torch.func.vmap`` over ``torch.func.vjp``, ``torch.func.jacrev``,
torch's legacy vmap: ``autograd.grad(..., is_grads_batched=True)``,
``autograd.functional.jacobian(..., vectorize=True)``; torchjd's ``autojac.backward``)
reaches the device as ONE batch: one ``vjp_structures`` sweep, with the values of R
separate backward passes."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import torch
from compiled_support import three_qubit_circuit

import pennylane_custatevec
from pennylane_custatevec import options
from pennylane_custatevec.device import CuStateVecDevice


def _flat(result):
    return torch.cat([result[0].reshape(1), result[1]])


@pytest.fixture
def sweeps(monkeypatch):
    """The cotangent shapes of each ``vjp_structures`` call: the first structure's
    cotangent's shape (one output), or the list of its outputs' cotangents' shapes."""
    seen = []
    original = CuStateVecDevice.vjp_structures

    def spy(self, run, cotangents, config=None):
        (first, *_) = cotangents
        if isinstance(first, np.ndarray):
            seen.append(first.shape)
        else:
            seen.append([tuple(np.shape(dy)) for dy in first])
        return original(self, run, cotangents, config)

    monkeypatch.setattr(CuStateVecDevice, "vjp_structures", spy)
    return seen


def _warm_up(compiled, x) -> None:
    """The key's recorded and two traced calls (torch.func transforms run replayed calls:
    the recorded ones convert parameters with PennyLane, which torch.func's tensors
    refuse)."""
    for _ in range(3):
        compiled(x.detach().requires_grad_())
    assert list(compiled.modes().values()) == ["REPLAY"]


def _separate_rows(circuit, x, rows):
    out = []
    for row in rows:
        (gradient,) = torch.autograd.grad(_flat(circuit(x)), x, row)
        out.append(gradient)
    return torch.stack(out)


def test_jacrev_is_one_sweep(sweeps):
    circuit = three_qubit_circuit()
    compiled = pennylane_custatevec.compile(circuit)
    x = torch.tensor([0.5, 0.2, -0.4], dtype=torch.float64, requires_grad=True)
    expected = torch.autograd.functional.jacobian(lambda v: _flat(circuit(v)), x)
    _warm_up(compiled, x)
    for _ in range(2):
        sweeps.clear()
        jacobian = torch.func.jacrev(lambda v: _flat(compiled(v)))(x)
        assert sweeps == [[(5,), (5, 4)]]
        torch.testing.assert_close(jacobian, expected, atol=1e-10, rtol=0)


def _batched_vjp(transform: str, compiled, x, rows):
    if transform == "torch.func.vmap":
        _, vjp_fn = torch.func.vjp(lambda v: _flat(compiled(v)), x)
        return torch.func.vmap(vjp_fn)(rows)[0]
    return torch.autograd.grad(_flat(compiled(x)), x, rows, is_grads_batched=True)[0]


@pytest.mark.parametrize("accumulation", ["deferred", "eager"])
@pytest.mark.parametrize("transform", ["torch.func.vmap", "is_grads_batched"])
def test_r_cotangents_are_one_sweep(sweeps, accumulation, transform):
    """torch.func.vmap over torch.func.vjp (on replayed calls), and torch's legacy vmap
    (``is_grads_batched=True``) on recorded (first), traced (second) and replayed calls
    alike: the 6 rows reach the device as one batch."""
    circuit = three_qubit_circuit()
    compiled = pennylane_custatevec.compile(circuit)
    x = torch.tensor([0.3, -0.8, 1.1], dtype=torch.float64, requires_grad=True)
    rows = torch.as_tensor(np.random.default_rng(3).uniform(-1, 1, (6, 5)))
    with options(grad_accumulation=accumulation):
        expected = _separate_rows(circuit, x, rows)
        if transform == "torch.func.vmap":
            _warm_up(compiled, x)
        modes = []
        for _ in range(4):
            sweeps.clear()
            batched = _batched_vjp(transform, compiled, x, rows)
            modes.append(next(iter(compiled.modes().values())))
            assert sweeps == [[(6,), (6, 4)]]
            torch.testing.assert_close(batched, expected, atol=1e-10, rtol=0)
    if transform == "is_grads_batched":
        assert modes == ["SEEN_ONCE", "PROVING", "REPLAY", "REPLAY"]
    else:
        assert modes == ["REPLAY"] * 4


def test_is_grads_batched_with_an_unused_output(sweeps):
    """An output outside the loss gets torch's unbatched zeros: repeated on every row."""
    circuit = three_qubit_circuit()
    compiled = pennylane_custatevec.compile(circuit)
    x = torch.tensor([0.7, 0.1, -1.3], dtype=torch.float64, requires_grad=True)
    rows = torch.as_tensor(np.random.default_rng(6).uniform(-1, 1, 3))
    expected = torch.stack([torch.autograd.grad(circuit(x)[0], x, row)[0] for row in rows])
    for _ in range(3):
        sweeps.clear()
        (batched,) = torch.autograd.grad(compiled(x)[0], x, rows, is_grads_batched=True)
        assert sweeps == [[(3,), (3, 4)]]
        torch.testing.assert_close(batched, expected, atol=1e-10, rtol=0)


def test_jacobian_vectorize_is_one_sweep(sweeps):
    circuit = three_qubit_circuit()
    compiled = pennylane_custatevec.compile(circuit)
    x = torch.tensor([0.5, 0.2, -0.4], dtype=torch.float64, requires_grad=True)
    expected = torch.autograd.functional.jacobian(lambda v: _flat(circuit(v)), x)
    for _ in range(3):
        sweeps.clear()
        jacobian = torch.autograd.functional.jacobian(
            lambda v: _flat(compiled(v)), x, vectorize=True
        )
        assert sweeps == [[(5,), (5, 4)]]
        torch.testing.assert_close(jacobian, expected, atol=1e-10, rtol=0)


def test_torchjd_backward_over_eight_losses_is_one_sweep(sweeps):
    """torchjd's ``autojac.backward`` over m = 8 losses of one call: one sweep of 8 rows;
    the aggregated gradient equals UPGrad applied to the Jacobian of 8 separate backward
    passes of the QNode."""
    torchjd = pytest.importorskip("torchjd")
    from torchjd.aggregation import UPGrad

    circuit = three_qubit_circuit(lambda: qml.probs(wires=[0, 1, 2]))
    compiled = pennylane_custatevec.compile(circuit)
    weights = torch.as_tensor(np.random.default_rng(8).uniform(-1, 1, 8))
    start = torch.tensor([0.3, -0.8, 1.1], dtype=torch.float64)
    x = start.clone().requires_grad_()
    separate = torch.stack(
        [torch.autograd.grad(circuit(x)[k] * weights[k], x)[0] for k in range(8)]
    )
    expected = UPGrad()(separate)
    for _ in range(3):
        x = start.clone().requires_grad_()
        probabilities = compiled(x)
        losses = [probabilities[k] * weights[k] for k in range(8)]
        sweeps.clear()
        torchjd.autojac.backward(losses)
        assert sweeps == [(8, 8)]
        torch.testing.assert_close(x.jac, separate, atol=1e-10, rtol=0)
        torchjd.autojac.jac_to_grad([x], UPGrad())
        torch.testing.assert_close(x.grad, expected, atol=1e-10, rtol=0)
