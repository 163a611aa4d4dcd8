"""``pennylane_custatevec.metric_tensor``'s classical part: the QNode's tape parameters
(tensors, scalars, several arguments) composed with the expansion's Jacobian
(``metric_transform.ParameterCarrier``), against PennyLane's metric tensors on
default.qubit in each interface, and the classical work counted: the autograd nodes that
backward passes walk grow with the gates of a template, not with their square."""

from __future__ import annotations

import warnings

import autograd.core
import numpy as np
import pennylane as qml
import pytest
import torch
from conftest import DEVICE
from pennylane import numpy as pnp

import pennylane_custatevec as pc
from pennylane_custatevec.metric_transform import ParameterCarrier, device_metric_tensor

ATOL = 1e-10
N_WIRES = 3


def _device(wires):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CPU backend's warning under backend="auto"
        return qml.device(DEVICE, wires=wires, backend="cpu")


def mixed_circuit(weights, angles, scale):
    """A tensor (StronglyEntanglingLayers' weights, processed), a vector read element by
    element and by a multi-parameter gate, and a scalar used twice."""
    qml.StronglyEntanglingLayers(weights * scale, wires=range(N_WIRES))
    qml.RX(angles[0] * angles[1], wires=0)
    qml.Rot(*angles, wires=1)
    qml.RY(scale**2, wires=2)
    qml.IsingZZ(angles[2], wires=[0, 2])
    return qml.expval(qml.Z(0) @ qml.Z(2))


def mixed_values():
    rng = np.random.default_rng(50)
    return rng.uniform(-np.pi, np.pi, (2, N_WIRES, 3)), rng.uniform(-np.pi, np.pi, 3), 0.7


def _reference(approx, interface="autograd"):
    qnode = qml.QNode(
        mixed_circuit, qml.device("default.qubit", wires=N_WIRES), interface=interface
    )
    if approx is None:
        return qml.adjoint_metric_tensor(qnode)
    return qml.metric_tensor(qnode, approx=approx)


@pytest.mark.parametrize("approx", [None, "block-diag", "diag"])
def test_autograd_mixed_shapes(approx):
    args = tuple(pnp.array(v, requires_grad=True) for v in mixed_values())
    got = pc.metric_tensor(qml.QNode(mixed_circuit, _device(N_WIRES)), approx=approx)(*args)
    expected = _reference(approx)(*args)
    assert isinstance(got, tuple) and len(got) == 3
    for g, e, a in zip(got, expected, args, strict=True):
        assert np.shape(g) == np.shape(a) * 2
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), atol=ATOL, rtol=0)


def test_autograd_some_arguments_trainable():
    weights, angles, scale = mixed_values()
    args = (
        pnp.array(weights, requires_grad=False),
        pnp.array(angles, requires_grad=True),
        pnp.array(scale, requires_grad=True),
    )
    got = pc.metric_tensor(qml.QNode(mixed_circuit, _device(N_WIRES)))(*args)
    expected = _reference(None)(*args)
    assert isinstance(got, tuple) and len(got) == 2
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), atol=ATOL, rtol=0)


@pytest.mark.parametrize("approx", [None, "block-diag"])
def test_torch_mixed_shapes(approx):
    args = tuple(torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in mixed_values())
    qnode = qml.QNode(mixed_circuit, _device(N_WIRES), interface="torch")
    got = pc.metric_tensor(qnode, approx=approx)(*args)
    expected = _reference(approx, "torch")(*args)
    assert all(isinstance(g, torch.Tensor) and g.dtype == torch.float64 for g in got)
    for g, e, a in zip(got, expected, args, strict=True):
        assert tuple(g.shape) == tuple(a.shape) * 2
        np.testing.assert_allclose(g.detach().numpy(), e.detach().numpy(), atol=ATOL, rtol=0)


@pytest.mark.usefixtures("jax_float64")
def test_jax_mixed_shapes():
    import jax
    import jax.numpy as jnp

    values = mixed_values()
    got = pc.metric_tensor(qml.QNode(mixed_circuit, _device(N_WIRES), interface="jax"))(
        *(jnp.array(v) for v in values)
    )
    # under jax, argnums=0 by default: the first argument's block of autograd's metric
    expected = _reference(None)(*(pnp.array(v, requires_grad=True) for v in values))[0]
    assert isinstance(got, jax.Array) and got.shape == values[0].shape * 2
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=ATOL, rtol=0)


def test_the_expanded_tape_carries_one_trainable_parameter():
    """Outside jax the expansion's tape has one trainable parameter, the carrier's
    ``J_exp theta`` (the gate parameters' linear function of the tape's)."""
    weights, angles, scale = mixed_values()
    args = tuple(pnp.array(v, requires_grad=True) for v in (weights, angles, scale))
    qnode = device_metric_tensor(
        qml.QNode(mixed_circuit, _device(N_WIRES)), device=_device(N_WIRES)
    )
    tape = qml.workflow.construct_tape(qnode, level=1)(*args)
    carrier = tape.operations[-1]
    assert isinstance(carrier, ParameterCarrier)
    assert tape.trainable_params == [len(tape.get_parameters(trainable_only=False)) - 1]
    assert len(carrier.positions) == weights.size + 1 + 3 + 1 + 1  # RX, Rot, RY, IsingZZ
    gate_values = tape.get_parameters(trainable_only=False)
    np.testing.assert_allclose(
        np.asarray(carrier.data[0]),
        np.asarray(gate_values[:-1])[list(carrier.positions)],
        atol=1e-12,
        rtol=0,
    )


def _classical_work(layers: int, monkeypatch) -> tuple[int, int]:
    """(the autograd nodes walked by every backward pass, the quantum function's calls)
    of one full metric of a StronglyEntanglingLayers circuit of ``layers`` layers."""
    walked, calls = [0], [0]
    toposort = autograd.core.toposort

    def counting(end_node):
        for node in toposort(end_node):
            walked[0] += 1
            yield node

    monkeypatch.setattr(autograd.core, "toposort", counting)

    def circuit(weights):
        calls[0] += 1
        qml.StronglyEntanglingLayers(weights, wires=range(N_WIRES))
        return qml.expval(qml.Z(0))

    weights = pnp.array(
        np.random.default_rng(layers).uniform(0, 2 * np.pi, (layers, N_WIRES, 3)),
        requires_grad=True,
    )
    pc.metric_tensor(qml.QNode(circuit, _device(N_WIRES)))(weights)
    monkeypatch.setattr(autograd.core, "toposort", toposort)
    return walked[0], calls[0]


def test_classical_work_grows_with_the_gates_not_their_square(monkeypatch):
    """Each gate parameter's backward pass walks a fixed number of nodes (its own
    expansion's, and the carrier's few), so that the nodes walked double with the layers
    (a stack of every gate parameter, PennyLane's ``qml.jacobian`` through the expansion,
    walked every gate's node in each of them: four times as many), and the quantum
    function runs a fixed number of times."""
    work = {layers: _classical_work(layers, monkeypatch) for layers in (2, 4, 8)}
    for layers in (4, 8):
        walked, calls = work[layers]
        assert walked <= 2.2 * work[layers // 2][0]
        assert calls == work[2][1]
    assert work[2][1] <= 3
