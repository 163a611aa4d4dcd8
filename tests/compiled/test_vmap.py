"""``torch.func.vmap`` over a compiled QNode's inputs runs as ONE broadcast call (one
``execute_structures`` of one broadcast structure), with the per-row results of the QNode
and their gradients; what it cannot broadcast gets an error naming the alternative."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import torch
from compiled_support import ATOL, assert_same_result, three_qubit_circuit, weighted_loss

import pennylane_custatevec
from pennylane_custatevec.device import CuStateVecDevice


@pytest.fixture
def batch_sizes(monkeypatch):
    """Per ``execute_structures`` call, the batch size of each structure."""
    seen = []
    original = CuStateVecDevice.execute_structures

    def spy(self, structures, parameters, config=None):
        seen.append([structure.template.batch_size for structure in structures])
        return original(self, structures, parameters, config)

    monkeypatch.setattr(CuStateVecDevice, "execute_structures", spy)
    return seen


def _device():
    return qml.device("custatevec.qubit", wires=3, backend="cpu")


def _layers():
    @qml.qnode(_device(), interface="torch")
    def circuit(x, weights):
        qml.AngleEmbedding(x, wires=range(3))
        qml.StronglyEntanglingLayers(weights, wires=range(3))
        return qml.expval(qml.Z(0) @ qml.Z(2))

    return circuit


def _per_row(qnode, rows, *shared):
    """The QNode's results for each row, stacked as vmap stacks them."""
    results = [qnode(row, *shared) for row in rows]
    if isinstance(results[0], tuple):
        return tuple(torch.stack(parts) for parts in zip(*results, strict=True))
    return torch.stack(results)


def _assert_same_gradients(got, want, inputs) -> None:
    got_grads = torch.autograd.grad(weighted_loss(got), inputs)
    want_grads = torch.autograd.grad(weighted_loss(want), inputs)
    for g, w in zip(got_grads, want_grads, strict=True):
        np.testing.assert_allclose(g.numpy(), w.numpy(), atol=ATOL)


def test_vmap_over_inputs_is_one_broadcast_call(batch_sizes):
    """Without gradients: one structure of batch size 5."""
    circuit = three_qubit_circuit()
    compiled = pennylane_custatevec.compile(circuit)
    rows = torch.as_tensor(np.random.default_rng(11).uniform(-2, 2, (5, 3)))
    want = _per_row(circuit, rows)
    batch_sizes.clear()
    got = torch.func.vmap(compiled)(rows)
    assert batch_sizes == [[5]]
    assert_same_result(got, want)


def test_vmap_over_trainable_inputs_runs_as_the_broadcast_input(batch_sizes):
    """With trainable rows: as the compiled QNode runs the broadcast input itself (the
    device expands a broadcast tape with trainable broadcast parameters for the adjoint
    method), in one ``execute_structures`` call; values and gradients per row."""
    circuit = three_qubit_circuit()
    compiled = pennylane_custatevec.compile(circuit)
    rows = torch.as_tensor(np.random.default_rng(11).uniform(-2, 2, (5, 3))).requires_grad_()
    batch_sizes.clear()
    compiled(rows.T)  # x[0] is then the first parameter of every row
    (broadcast,) = batch_sizes
    for _ in range(3):
        want = _per_row(circuit, rows)
        batch_sizes.clear()
        got = torch.func.vmap(compiled)(rows)
        assert batch_sizes == [broadcast]
        assert_same_result(got, want)
        _assert_same_gradients(got, want, rows)


def test_vmap_with_an_unbatched_trainable_argument(batch_sizes):
    """``in_dims=(0, None)``: the weights are shared by every row (unbatched gate
    parameters in the broadcast tape), their gradient sums the rows'."""
    circuit = _layers()
    compiled = pennylane_custatevec.compile(circuit)
    generator = np.random.default_rng(12)
    rows = torch.as_tensor(generator.uniform(-2, 2, (4, 3))).requires_grad_()
    weights = torch.as_tensor(generator.uniform(-2, 2, (2, 3, 3))).requires_grad_()
    want = _per_row(circuit, rows, weights)
    batch_sizes.clear()
    got = torch.func.vmap(compiled, in_dims=(0, None))(rows, weights)
    assert len(batch_sizes) == 1
    assert_same_result(got, want)
    _assert_same_gradients(got, want, (rows, weights))


def test_vmap_over_a_later_axis():
    circuit = three_qubit_circuit()
    compiled = pennylane_custatevec.compile(circuit)
    columns = torch.as_tensor(np.random.default_rng(13).uniform(-2, 2, (3, 4)))
    columns.requires_grad_()
    want = _per_row(circuit, columns.T)
    got = torch.func.vmap(compiled, in_dims=1)(columns)
    assert_same_result(got, want)
    _assert_same_gradients(got, want, columns)


def test_a_row_that_is_itself_broadcast_gets_an_error_naming_the_alternative():
    @qml.qnode(_device(), interface="torch")
    def circuit(x):
        qml.RX(x[:, 0], 0)
        return qml.expval(qml.Z(0))

    compiled = pennylane_custatevec.compile(circuit)
    batch = torch.zeros((2, 4, 3), dtype=torch.float64)
    with pytest.raises(RuntimeError, match="pass the whole batch as a broadcast input"):
        torch.func.vmap(compiled)(batch)


def test_nested_vmap_gets_an_error_naming_the_alternative():
    compiled = pennylane_custatevec.compile(three_qubit_circuit())
    batch = torch.zeros((2, 2, 3), dtype=torch.float64)
    with pytest.raises(RuntimeError, match="pass the batch as a broadcast input"):
        torch.func.vmap(torch.func.vmap(compiled))(batch)


def test_vmap_with_an_observable_of_float_coefficients():
    """Regression: an observable whose data are Python floats (a Hamiltonian's
    coefficients) crashed ``torch.func.vmap`` of the compiled QNode (TypeError from
    ``is_functorch_wrapped_tensor(1.497)``): such data are not batched arguments."""

    @qml.qnode(_device(), interface="torch")
    def circuit(x):
        qml.AngleEmbedding(x, wires=range(3))
        qml.CNOT([0, 1])
        return qml.expval(1.497 * qml.Z(2) @ qml.Z(1) + 1.194 * qml.X(1))

    compiled = pennylane_custatevec.compile(circuit)
    rows = torch.tensor(np.random.default_rng(4).uniform(-1, 1, (5, 3)), requires_grad=True)
    got = torch.func.vmap(compiled)(rows)
    want = _per_row(circuit, rows)
    assert_same_result(got, want)
    _assert_same_gradients(got, want, [rows])
