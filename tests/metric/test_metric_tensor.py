"""``pennylane_custatevec.metric_tensor`` against PennyLane's metric tensors on
default.qubit: every differentiable gate, both backends (cuStateVec through its NumPy
double), both accumulation modes, the three interfaces, blocks and memory, refusals by
name, ``Backend.gram``, and quantum natural gradient steps (``qml.QNGOptimizer`` and
``QNGTorch``)."""

from __future__ import annotations

import warnings

import numpy as np
import pennylane as qml
import pytest
import torch
from adjoint_cases import WIRES
from conftest import DEVICE
from metric_cases import GATE_NAMES, gate_circuit, layered_circuit, reference_metrics
from pennylane import numpy as pnp
from pennylane.devices import ExecutionConfig

import pennylane_custatevec as pc
from pennylane_custatevec import simulate
from pennylane_custatevec.backends import select_backend
from pennylane_custatevec.device_metric import MetricTensorError, device_circuit
from pennylane_custatevec.gradients.metric import (
    block_diagonal_metric,
    full_metric,
    plan_metric,
)

ATOL = 1e-10
MODES = ["deferred", "eager"]


def device(wires, backend="cpu", mode="deferred", **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CPU backend's warning under backend="auto"
        return qml.device(DEVICE, wires=wires, backend=backend, grad_accumulation=mode, **kwargs)


# --- every differentiable gate ---------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", GATE_NAMES)
def test_full_metric_of_every_gate(name, mode, each_backend):
    circuit, x = gate_circuit(name)
    qnode = qml.QNode(circuit, device(WIRES, each_backend, mode))
    got = pc.metric_tensor(qnode)(x)
    assert isinstance(got, np.ndarray) and got.shape == (len(x), len(x))
    np.testing.assert_allclose(got, reference_metrics(name)["adjoint"], atol=ATOL, rtol=0)


@pytest.mark.parametrize("approx", ["block-diag", "diag"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", GATE_NAMES)
def test_approximations_of_every_gate(name, mode, approx, each_backend):
    """Equal to the exact blocks of PennyLane's adjoint metric tensor over PennyLane's
    layers, and to ``qml.metric_tensor(approx=...)`` where PennyLane's covariances are
    right (``metric_cases.PENNYLANE_COVARIANCE_OFF``)."""
    circuit, x = gate_circuit(name)
    qnode = qml.QNode(circuit, device(WIRES, each_backend, mode))
    got = pc.metric_tensor(qnode, approx=approx)(x)
    references = reference_metrics(name)
    compared = [key for key in (approx, f"pl {approx}") if key in references]
    assert compared, "every gate has a reference"
    for key in compared:
        np.testing.assert_allclose(got, references[key], atol=ATOL, rtol=0, err_msg=key)


def test_pennylane_covariance_of_a_controlled_rotation_is_off():
    """The deviation named in ``PENNYLANE_COVARIANCE_OFF``: for a CRX, PennyLane's
    block-diagonal metric disagrees with its own adjoint metric tensor (and finite
    differences of the state); the device's agrees with the latter."""

    def gates(x):
        qml.RX(x[0], 0)
        qml.CRX(x[1], wires=[0, 2])
        qml.RY(x[2], 2)

    def circuit(x):
        gates(x)
        return qml.expval(qml.Z(0))

    def state_circuit(x):
        gates(x)
        return qml.state()

    x = pnp.array([0.3, 1.1, 0.7], requires_grad=True)
    reference = qml.QNode(circuit, qml.device("default.qubit", wires=3))
    exact = np.asarray(qml.adjoint_metric_tensor(reference)(x))
    pennylane = np.asarray(qml.metric_tensor(reference, approx="block-diag")(x))
    ours = pc.metric_tensor(qml.QNode(circuit, device(3)), approx="block-diag")(x)
    state = qml.QNode(state_circuit, qml.device("default.qubit", wires=3))
    step = 1e-6
    psi = np.asarray(state(x))
    d = np.asarray(state(x + step * np.eye(3)[1])) - np.asarray(state(x - step * np.eye(3)[1]))
    d /= 2 * step
    by_differences = np.vdot(d, d).real - abs(np.vdot(psi, d)) ** 2
    assert abs(exact[1, 1] - by_differences) < 1e-8
    assert abs(ours[1, 1] - exact[1, 1]) < ATOL
    assert abs(pennylane[1, 1] - exact[1, 1]) > 1e-2


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("count", [1, 2, 3])
def test_few_trainable_gates(count, mode):
    """One, two and three trainable gates (the deferred pass's frame before the first
    one, after the first, after the first of three), a constant gate after the last."""

    def circuit(x):
        qml.Hadamard(0)
        for k in range(count):
            qml.RY(x[k], wires=k % 2)
            qml.CNOT([k % 2, 1 - k % 2])
        qml.RX(0.4, wires=0)
        return qml.expval(qml.Z(0))

    x = pnp.array([0.3, -1.2, 0.8][:count], requires_grad=True)
    reference = qml.QNode(circuit, qml.device("default.qubit", wires=2))
    got = pc.metric_tensor(qml.QNode(circuit, device(2, mode=mode)))(x)
    np.testing.assert_allclose(got, qml.adjoint_metric_tensor(reference)(x), atol=ATOL, rtol=0)


@pytest.mark.parametrize("approx", [None, "block-diag"])
@pytest.mark.parametrize("mode", MODES)
def test_prepared_state(mode, approx, each_backend, rng):
    """A leading StatePrep is the register's initial state (vector 0 of every batch)."""
    state = rng.normal(size=8) + 1j * rng.normal(size=8)
    state /= np.linalg.norm(state)

    def circuit(x):
        qml.StatePrep(state, wires=[0, 1, 2])
        qml.RX(x[0], 0)
        qml.IsingYY(x[1], [0, 2])
        qml.RY(x[2], 1)
        qml.CNOT([1, 2])
        qml.RZ(x[3], 2)
        return qml.expval(qml.Z(0))

    x = pnp.array(rng.uniform(-np.pi, np.pi, 4), requires_grad=True)
    reference = qml.QNode(circuit, qml.device("default.qubit", wires=3))
    got = pc.metric_tensor(qml.QNode(circuit, device(3, each_backend, mode)), approx=approx)(x)
    expected = (
        qml.adjoint_metric_tensor(reference)(x)
        if approx is None
        else qml.metric_tensor(reference, approx=approx)(x)
    )
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0)


# --- interfaces, several arguments, classical processing ----------------------------------


def test_autograd_several_arguments(each_backend):
    circuit, weights, scale = layered_circuit()
    args = (pnp.array(weights, requires_grad=True), pnp.array(scale, requires_grad=True))
    reference = qml.adjoint_metric_tensor(qml.QNode(circuit, qml.device("default.qubit", wires=4)))
    got = pc.metric_tensor(qml.QNode(circuit, device(4, each_backend)))(*args)
    expected = reference(*args)
    assert isinstance(got, tuple) and len(got) == 2
    assert got[0].shape == weights.shape * 2 and np.shape(got[1]) == ()
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), atol=ATOL, rtol=0)


@pytest.mark.parametrize("approx", [None, "block-diag"])
def test_torch(approx):
    circuit, weights, scale = layered_circuit()
    args = (
        torch.tensor(weights, requires_grad=True),
        torch.tensor(scale, dtype=torch.float64, requires_grad=True),
    )
    reference_qnode = qml.QNode(circuit, qml.device("default.qubit", wires=4), interface="torch")
    qnode = qml.QNode(circuit, device(4), interface="torch")
    got = pc.metric_tensor(qnode, approx=approx)(*args)
    expected = (
        qml.adjoint_metric_tensor(reference_qnode)(*args)
        if approx is None
        else qml.metric_tensor(reference_qnode, approx=approx)(*args)
    )
    assert all(isinstance(g, torch.Tensor) and g.dtype == torch.float64 for g in got)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g.detach().numpy(), e.detach().numpy(), atol=ATOL, rtol=0)


@pytest.mark.usefixtures("jax_float64")
def test_jax():
    import jax
    import jax.numpy as jnp

    circuit, weights, scale = layered_circuit()
    args = (jnp.array(weights), jnp.array(scale))
    # the reference: autograd's first argument (under jax, argnums=0 by default;
    # PennyLane's adjoint metric tensor refuses Rot under jax with argnums)
    reference_qnode = qml.QNode(circuit, qml.device("default.qubit", wires=4))
    got = pc.metric_tensor(qml.QNode(circuit, device(4), interface="jax"))(*args)
    expected, _ = qml.adjoint_metric_tensor(reference_qnode)(
        pnp.array(weights, requires_grad=True), pnp.array(scale, requires_grad=True)
    )
    assert isinstance(got, jax.Array) and got.shape == weights.shape * 2
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=ATOL, rtol=0)


# --- blocks, memory ----------------------------------------------------------------------------


def _device_circuit(dev, qnode, *args):
    tape = qml.workflow.construct_tape(qnode)(*args)
    [expanded], _ = qml.transforms.decompose(
        tape,
        gate_set=qml.decomposition.gate_sets.ROTATIONS_PLUS_CNOT,
        stopping_condition=lambda op: len(op.data) == 0 or op.name in ("RX", "RY", "RZ", "IsingXX"),
    )
    expanded.trainable_params = qml.math.get_trainable_indices(
        expanded.get_parameters(trainable_only=False)
    )
    config = dev.setup_execution_config(ExecutionConfig(gradient_method="adjoint"))
    return device_circuit(expanded, dev.preprocess_transforms(config), dev.wires).circuit


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("block", [1, 2, 3, 5])
def test_blocks_give_the_one_pass_metric(block, mode, each_backend):
    circuit, weights, scale = layered_circuit()
    dev = device(4, each_backend)
    qnode = qml.QNode(circuit, dev)
    args = (pnp.array(weights, requires_grad=True), pnp.array(scale, requires_grad=False))
    compiled = _device_circuit(dev, qnode, *args)
    backend = select_backend(each_backend, np.complex128)
    deferred = mode == "deferred"
    one_pass = plan_metric(backend, compiled, deferred)
    plan = plan_metric(backend, compiled, deferred, block=block)
    assert one_pass.passes == 1 and plan.passes == -(-compiled.n_columns // block)
    np.testing.assert_allclose(
        full_metric(backend, compiled, plan), full_metric(backend, compiled, one_pass), atol=ATOL
    )


@pytest.mark.parametrize("mode", MODES)
def test_interleaved_layers_take_the_blocks_of_the_full_metric(mode, each_backend):
    """Layers that are not runs of consecutive gates (not PennyLane's) still get the
    exact blocks: those of the full metric."""
    circuit, weights, scale = layered_circuit()
    dev = device(4, each_backend)
    args = (pnp.array(weights, requires_grad=True), pnp.array(scale, requires_grad=False))
    compiled = _device_circuit(dev, qml.QNode(circuit, dev), *args)
    backend = select_backend(each_backend, np.complex128)
    deferred = mode == "deferred"
    full = full_metric(backend, compiled, plan_metric(backend, compiled, deferred))
    layers = [[0, 2, 5], [1, 3], [4, 6, 7]]
    got = block_diagonal_metric(backend, compiled, layers, False, deferred)
    mask = np.zeros(full.shape, dtype=bool)
    for layer in layers:
        mask[np.ix_(layer, layer)] = True
    np.testing.assert_allclose(got, np.where(mask, full, 0.0), atol=ATOL, rtol=0)
    consecutive = [[0, 1], [2, 3, 4], [5]]
    got = block_diagonal_metric(backend, compiled, consecutive, True, deferred)
    np.testing.assert_allclose(np.diag(got)[:6], np.diag(full)[:6], atol=ATOL, rtol=0)
    assert not got[:6, :6][~np.eye(6, dtype=bool)].any() and not got[6:].any()


@pytest.mark.parametrize("mode", MODES)
def test_free_memory_decides_the_block(mode, monkeypatch):
    """Where the derivative vectors do not fit at once, the largest block that fits: the
    same metric in several passes; where not even a block of one fits, a refusal before
    anything is allocated, naming single precision."""
    circuit, weights, scale = layered_circuit()
    args = (pnp.array(weights, requires_grad=True), pnp.array(scale, requires_grad=True))
    expected = pc.metric_tensor(qml.QNode(circuit, device(4, mode=mode)))(*args)
    dev = device(4, mode=mode)
    backend = dev._backend
    vector = simulate.state_bytes(backend, 4, 1)
    monkeypatch.setattr(simulate, "UNCHECKED_BYTES", 0)
    monkeypatch.setattr(type(backend), "available_bytes", lambda self: 9 * vector)
    plans = []
    original = plan_metric
    monkeypatch.setattr(
        "pennylane_custatevec.device_metric.plan_metric",
        lambda *a, **k: plans.append(original(*a, **k)) or plans[-1],
    )
    got = pc.metric_tensor(qml.QNode(circuit, dev))(*args)
    (plan,) = plans
    assert plan.vectors() <= 9 and plan.passes > 1
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, atol=ATOL, rtol=0)
    monkeypatch.setattr(type(backend), "available_bytes", lambda self: 2 * vector)
    with pytest.raises(simulate.RunTooLargeError, match="metric tensor of a circuit on 4 qubits"):
        pc.metric_tensor(qml.QNode(circuit, dev))(*args)


# --- refusals by name ---------------------------------------------------------------------------


def _qnode(body, dev=None, **kwargs):
    return qml.QNode(body, dev or device(2), **kwargs)


def test_refuses_shots():
    def body(x):
        qml.RX(x, 0)
        return qml.expval(qml.Z(0))

    qnode = qml.set_shots(_qnode(body), 100)
    with pytest.raises(MetricTensorError, match="shots=100"):
        pc.metric_tensor(qnode)(pnp.array(0.3, requires_grad=True))


def test_refuses_mid_circuit_measurements():
    def body(x):
        qml.RX(x, 0)
        qml.measure(0)
        qml.RY(x, 1)
        return qml.expval(qml.Z(1))

    with pytest.raises(MetricTensorError, match="mid-circuit measurement"):
        pc.metric_tensor(_qnode(body))(pnp.array(0.3, requires_grad=True))


def test_refuses_trainable_observables():
    def body(x, c):
        qml.RX(x, 0)
        return qml.expval(qml.Hamiltonian([c], [qml.Z(0)]))

    args = (pnp.array(0.3, requires_grad=True), pnp.array(0.5, requires_grad=True))
    with pytest.raises(MetricTensorError, match="observable .* is trainable"):
        pc.metric_tensor(_qnode(body))(*args)


def test_refuses_trainable_matrices():
    def body(u):
        qml.QubitUnitary(u, wires=0)
        return qml.expval(qml.Z(0))

    u = pnp.array(qml.matrix(qml.RX(0.4, 0)), requires_grad=True)
    with pytest.raises(MetricTensorError, match="parameter of QubitUnitary is complex"):
        pc.metric_tensor(_qnode(body))(u)


def test_refuses_other_devices_and_approximations():
    def body(x):
        qml.RX(x, 0)
        return qml.expval(qml.Z(0))

    x = pnp.array(0.3, requires_grad=True)
    with pytest.raises(ValueError, match="custatevec.qubit device"):
        pc.metric_tensor(_qnode(body, qml.device("default.qubit", wires=2)))(x)
    with pytest.raises(ValueError, match="Unknown value 'full' for approx"):
        pc.metric_tensor(_qnode(body), approx="full")(x)
    with pytest.raises(ValueError, match="takes a QNode"):
        pc.metric_tensor(body)


# --- the backends' Gram matrices ----------------------------------------------------------------


def test_gram(each_backend, rng):
    backend = select_backend(each_backend, np.complex128)
    vectors = rng.normal(size=(5, 16)) + 1j * rng.normal(size=(5, 16))
    batch = backend.from_host(vectors)
    bras, kets = backend.vectors(batch, 0, 3), backend.vectors(batch, 1, 5)
    (got,) = backend.gather([backend.gram(bras, kets)])
    np.testing.assert_allclose(got, vectors[:3].conj() @ vectors[1:5].T, atol=1e-12)
    np.testing.assert_array_equal(backend.to_host(batch), vectors)  # neither changes


# --- quantum natural gradient ----------------------------------------------------------------


def _qng_circuit():
    def circuit(weights):
        qml.StronglyEntanglingLayers(weights, wires=range(3))
        return qml.expval(qml.Z(0) @ qml.X(1) + 0.5 * qml.Y(2))

    rng = np.random.default_rng(7)
    return circuit, rng.uniform(-np.pi, np.pi, (2, 3, 3))


@pytest.mark.parametrize("approx", [None, "block-diag", "diag"])
def test_qng_optimizer_steps(approx):
    """Five steps of ``qml.QNGOptimizer`` with the device's metric tensor equal its steps
    with PennyLane's own (``qml.metric_tensor``; ``qml.adjoint_metric_tensor`` for the
    full metric)."""
    circuit, weights = _qng_circuit()
    reference = qml.QNode(circuit, qml.device("default.qubit", wires=3))
    qnode = qml.QNode(circuit, device(3))
    theirs = qml.QNGOptimizer(stepsize=0.1, approx=approx or "block-diag", lam=0.01)
    ours = qml.QNGOptimizer(stepsize=0.1, approx=approx or "block-diag", lam=0.01)
    theirs_fn = qml.adjoint_metric_tensor(reference) if approx is None else None
    ours_fn = pc.metric_tensor(qnode, approx=approx)
    a = b = pnp.array(weights, requires_grad=True)
    for _ in range(5):
        a = theirs.step(reference, a, metric_tensor_fn=theirs_fn)
        b = ours.step(qnode, b, metric_tensor_fn=ours_fn)
        np.testing.assert_allclose(b, a, atol=ATOL, rtol=0)
    assert not np.allclose(b, weights)


def test_qng_torch_steps():
    """``QNGTorch`` takes ``qml.QNGOptimizer``'s steps (full metric, ``lam``) on torch
    parameters."""
    circuit, weights = _qng_circuit()
    reference = qml.QNode(circuit, qml.device("default.qubit", wires=3))
    optimizer = qml.QNGOptimizer(stepsize=0.1, lam=0.05)
    metric = qml.adjoint_metric_tensor(reference)
    qnode = qml.QNode(circuit, device(3), interface="torch", diff_method="adjoint")
    parameters = torch.tensor(weights, requires_grad=True)
    metric_fn = pc.metric_tensor(qnode)
    torch_optimizer = pc.QNGTorch([parameters], lambda: metric_fn(parameters), lr=0.1, lam=0.05)
    a = pnp.array(weights, requires_grad=True)
    for _ in range(5):
        a = optimizer.step(reference, a, metric_tensor_fn=metric)
        torch_optimizer.zero_grad()
        qnode(parameters).backward()
        torch_optimizer.step()
        np.testing.assert_allclose(parameters.detach().numpy(), a, atol=ATOL, rtol=0)


def test_qng_torch_refuses_mismatched_metrics():
    parameters = [torch.zeros(2, requires_grad=True), torch.zeros(1, requires_grad=True)]
    optimizer = pc.QNGTorch(parameters, lambda: torch.eye(2), lr=0.1)
    with pytest.raises(ValueError, match="1 metric tensors for 2 parameter tensors"):
        optimizer.step()
    with pytest.raises(ValueError, match="lam must be non-negative"):
        pc.QNGTorch(parameters, lambda: None, lam=-1.0)
