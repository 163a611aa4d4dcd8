"""Adjoint differentiation on custatevec.qubit, against default.qubit.

Values and gradients are compared with default.qubit's ``diff_method="backprop"`` (or its
own adjoint method for the device API), with ``device_vjp`` off (the device computes
Jacobians) and on (the device computes vector-Jacobian products).
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import torch
from adjoint_cases import (
    COMPOSITE,
    MATRIX_DEFINED,
    PARAMETRIZED,
    WIRES,
    api_tape,
    as_numpy,
    assert_same_run,
    float64_tensor,
    gate_case,
    measurements_for,
    random_angles,
    random_loss,
    real_vector,
    surrounding_circuit,
    torch_run,
)
from conftest import assert_allclose_nested, generic_layer, make_devices, stable_seed
from pennylane import numpy as pnp
from pennylane.devices import ExecutionConfig
from pennylane.exceptions import DeviceError
from pennylane.ops.functions import bind_new_parameters
from pennylane.tape import QuantumScript
from reference import random_hermitian

import pennylane_custatevec
import pennylane_custatevec.gradients.differentiated
import pennylane_custatevec.gradients.validation
import pennylane_custatevec.simulate

ATOL = 1e-8
W4 = WIRES[:4]
VJP = pytest.mark.parametrize("device_vjp", [False, True], ids=["jacobian", "vjp"])
ERROR_PREFIX = "custatevec.qubit cannot differentiate this circuit by adjoint"


@pytest.fixture(autouse=True, params=["deferred", "eager"])
def grad_accumulation(request):
    """Every test in both modes, through the context-local option override."""
    with pennylane_custatevec.options(grad_accumulation=request.param):
        yield request.param


def compare_torch(
    circuit, values, seed, wires=WIRES, trainable=None, ref_circuit=None, **qnode_kwargs
):
    """custatevec (adjoint, ``qnode_kwargs``) against default.qubit backprop (running
    ``ref_circuit``, by default ``circuit``)."""
    dev, ref = make_devices(wires)
    out, grads = torch_run(circuit, dev, values, seed, trainable, **qnode_kwargs)
    ref_out, ref_grads = torch_run(
        ref_circuit or circuit, ref, values, seed, trainable, diff_method="backprop"
    )
    assert_same_run((out, grads), (ref_out, ref_grads), ATOL)
    return out, grads, ref_grads


# ---------------------------------------------------------------------------------------
# 1. Every differentiable gate


@VJP
@pytest.mark.parametrize("outputs", ["expval_probs", "state"])
@pytest.mark.parametrize("name", PARAMETRIZED + list(COMPOSITE))
def test_gate_gradient(name, outputs, device_vjp):
    rng = np.random.default_rng(stable_seed("gate-gradient", name, outputs))
    op = gate_case(name, rng)
    before, after = surrounding_circuit(rng)
    measurements = measurements_for(outputs, rng)
    values = random_angles(rng, len(op.data))

    def circuit(*params):
        for o in before:
            qml.apply(o)
        qml.apply(bind_new_parameters(op, params))
        for o in after:
            qml.apply(o)
        return tuple(qml.apply(m) for m in measurements)

    _, grads, _ = compare_torch(
        circuit,
        values,
        stable_seed("loss", name),
        diff_method="adjoint",
        device_vjp=device_vjp,
    )
    assert len(grads) == len(values) > 0


def test_parametrized_gates_listed():
    """The enumeration above covers the rotations and the gates decomposed for adjoint."""
    for name in ("RX", "CRot", "Rot", "U2", "U3", "PSWAP", "GlobalPhase", "OrbitalRotation"):
        assert name in PARAMETRIZED
    assert not MATRIX_DEFINED & set(PARAMETRIZED)


# ---------------------------------------------------------------------------------------
# 2. Trainable and non-trainable parameters mixed


@VJP
@pytest.mark.parametrize("case", range(6))
def test_trainable_mix(case, device_vjp):
    """Each of 7 parameters is a trainable tensor, a constant tensor or (for the gates with
    one parameter: PennyLane's own Rot/U2 matrices do not mix floats and tensors) a float."""
    rng = np.random.default_rng(stable_seed("mix", case))
    kinds = [
        str(rng.choice(["grad", "tensor", "float"] if i in (0, 4, 5) else ["grad", "tensor"]))
        for i in range(7)
    ]
    kinds[rng.integers(7)] = "grad"  # at least one trainable
    if case == 0:
        kinds = ["float", "grad", "tensor", "grad", "float", "grad", "tensor"]
    values = random_angles(rng, 7)
    params = [
        v if k == "float" else float64_tensor(v, requires_grad=(k == "grad"))
        for v, k in zip(values, kinds, strict=True)
    ]
    ref_params = [
        v if k == "float" else float64_tensor(v, requires_grad=(k == "grad"))
        for v, k in zip(values, kinds, strict=True)
    ]

    def circuit(p):
        qml.Hadamard("a")
        qml.RX(p[0], wires="a")
        qml.CNOT(["a", 3])
        qml.Rot(p[1], p[2], p[3], wires="q1")
        qml.IsingXY(p[4], wires=[3, "q1"])
        qml.CRY(p[5], wires=["q1", 0])
        qml.RX(p[0], wires=0)  # the same parameter twice
        qml.U2(p[6], p[1], wires=3)
        return qml.expval(qml.X("a") @ qml.Z(0)), qml.probs(wires=[3, "q1"])

    dev, ref = make_devices(W4)
    out = qml.QNode(circuit, dev, diff_method="adjoint", device_vjp=device_vjp)(params)
    ref_out = qml.QNode(circuit, ref, diff_method="backprop")(ref_params)
    assert_allclose_nested(as_numpy(out), as_numpy(ref_out), atol=ATOL)
    random_loss(out, case).backward()
    random_loss(ref_out, case).backward()
    for i, (p, r, k) in enumerate(zip(params, ref_params, kinds, strict=True)):
        if k == "grad":
            assert p.grad is not None, f"trainable parameter {i} got no gradient"
            np.testing.assert_allclose(p.grad, r.grad, atol=ATOL, rtol=0, err_msg=str(i))
        elif k == "tensor":
            assert p.grad is None and not p.requires_grad


@VJP
def test_no_trainable_parameter(device_vjp):
    """A QNode with tensors that do not require grad executes and is not differentiable."""
    dev, ref = make_devices(W4)

    def circuit(x):
        qml.RX(x, wires="a")
        qml.CNOT(["a", 0])
        return qml.expval(qml.Z(0))

    out = qml.QNode(circuit, dev, diff_method="adjoint", device_vjp=device_vjp)(
        float64_tensor(0.4, requires_grad=False)
    )
    assert not out.requires_grad
    np.testing.assert_allclose(out.numpy(), np.cos(0.4), atol=ATOL)


# ---------------------------------------------------------------------------------------
# 3. Several measurements in one circuit

_MRNG = np.random.default_rng(stable_seed("measurement-matrices"))
HERMITIAN = random_hermitian(4, _MRNG)
_SPARSE_WIRES = [3, "a", 0]
SPARSE = qml.Hamiltonian(
    _MRNG.normal(size=3), [qml.X(3) @ qml.Z(0), qml.Y("a"), qml.Z(3) @ qml.X("a") @ qml.Y(0)]
).sparse_matrix(wire_order=_SPARSE_WIRES)


def _pauli_words():
    return [
        qml.expval(qml.X("a") @ qml.Y(3)),
        qml.expval(qml.Z("q1")),
        qml.expval(qml.Y(0) @ qml.Z("a") @ qml.X("q1")),
    ]


def _hermitian():
    return [qml.expval(qml.Hermitian(HERMITIAN, wires=["q1", "a"]))]


def _hamiltonian():
    obs = qml.Hamiltonian(
        [0.3, -1.2, 0.5], [qml.X("a") @ qml.Z(0), qml.Y(3), qml.Z("q1") @ qml.Z(3)]
    )
    return [qml.expval(obs)]


def _sum_sprod():
    obs = qml.sum(
        qml.s_prod(0.7, qml.X("a")),
        qml.prod(qml.Z(3), qml.Y(0)),
        qml.s_prod(-0.4, qml.sum(qml.Z("q1"), qml.X(0))),
    )
    return [qml.expval(obs)]


def _sparse():
    return [qml.expval(qml.SparseHamiltonian(SPARSE, wires=_SPARSE_WIRES))]


MEASUREMENTS = {
    "pauli_words": _pauli_words,
    "hermitian": _hermitian,
    "hamiltonian": _hamiltonian,
    "sum_sprod": _sum_sprod,
    "sparse_hamiltonian": _sparse,
    "probs_subset": lambda: [qml.probs(wires=["q1", "a"])],
    "probs_all": lambda: [qml.probs()],
    "state": lambda: [qml.state()],
    "expval_probs": lambda: [qml.expval(qml.Z(3)), qml.probs(wires=[0, "a"]), *_hermitian()],
    "expval_state": lambda: [qml.expval(qml.X("q1")), qml.state()],
    "everything": lambda: [
        *_pauli_words(),
        *_hermitian(),
        *_hamiltonian(),
        *_sum_sprod(),
        *_sparse(),
        qml.probs(wires=[3]),
        qml.state(),
    ],
}


def _for_reference(mp):
    """default.qubit's backprop takes no SparseHamiltonian: the same matrix, dense."""
    if isinstance(mp.obs, qml.SparseHamiltonian):
        return qml.expval(qml.Hermitian(mp.obs.sparse_matrix().toarray(), wires=mp.obs.wires))
    return mp


def measured_circuit(measure, reference=False):
    def circuit(weights, extra):
        generic_layer(W4, weights)
        qml.CRX(extra[0], wires=["q1", "a"])
        qml.Rot(extra[1], extra[2], extra[3], wires=3)
        qml.IsingZZ(extra[4], wires=[0, "q1"])
        qml.Hadamard(0)
        qml.SingleExcitation(extra[0], wires=["a", 0])
        with qml.QueuingManager.stop_recording():
            measurements = [_for_reference(m) if reference else m for m in measure()]
        return tuple(qml.apply(m) for m in measurements)

    return circuit


def _measurement_values(name):
    rng = np.random.default_rng(stable_seed("measurements", name))
    return [random_angles(rng, 8), random_angles(rng, 5)]


@VJP
@pytest.mark.parametrize("name", list(MEASUREMENTS))
def test_measurements(name, device_vjp):
    weights, extra = _measurement_values(name)
    compare_torch(
        measured_circuit(MEASUREMENTS[name]),
        [np.reshape(weights, (4, 2)), extra],
        stable_seed("loss", name),
        wires=W4,
        ref_circuit=measured_circuit(MEASUREMENTS[name], reference=True),
        diff_method="adjoint",
        device_vjp=device_vjp,
    )


@pytest.mark.parametrize("name", list(MEASUREMENTS))
def test_measurements_full_jacobian(name):
    """torch.autograd.functional.jacobian of every output, on the Jacobian path."""
    weights, extra = _measurement_values(name)
    dev, ref = make_devices(W4)
    inputs = (float64_tensor(np.reshape(weights, (4, 2))), float64_tensor(extra))
    jacobians = []
    for device, reference, kwargs in (
        (dev, False, {"diff_method": "adjoint"}),
        (ref, True, {"diff_method": "backprop"}),
    ):
        circuit = measured_circuit(MEASUREMENTS[name], reference)
        qnode = qml.QNode(circuit, device, interface="torch", **kwargs)
        jac = torch.autograd.functional.jacobian(lambda *p, q=qnode: real_vector(q(*p)), inputs)
        jacobians.append(tuple(j.numpy() for j in jac))
    assert_allclose_nested(jacobians[0], jacobians[1], atol=ATOL)
    assert np.abs(jacobians[1][1]).max() > 1e-3  # not trivially zero


# ---------------------------------------------------------------------------------------
# 4. Several tapes in one qml.execute


def _tapes(p):
    same = [qml.Hadamard("a"), qml.CNOT(["a", 3])]
    return [
        QuantumScript([*same, qml.RX(p[0], "a"), qml.RY(p[1], 3)], [qml.expval(qml.Z(3))]),
        # the same structure as the first tape, other parameters
        QuantumScript([*same, qml.RX(p[2], "a"), qml.RY(p[3], 3)], [qml.expval(qml.Z(3))]),
        QuantumScript([*same, qml.RX(p[0], "a"), qml.RY(p[2], 3)], [qml.expval(qml.Z(3))]),
        QuantumScript(
            [qml.Rot(p[4], p[5], p[6], wires="q1"), qml.CRY(p[0], wires=["q1", "a"])],
            [qml.probs(wires=["a"]), qml.expval(qml.X("q1") @ qml.Z("a"))],
        ),
        QuantumScript(
            [qml.RX(p[1], 0), qml.CNOT([0, "q1"]), qml.IsingXX(p[3], ["q1", 3])],
            [qml.expval(qml.Hamiltonian([0.4, -0.6], [qml.Z(3), qml.X(0) @ qml.Y("q1")]))],
        ),
        QuantumScript([qml.Hadamard(0), qml.RZ(p[5], 0), qml.RX(p[6], "a")], [qml.state()]),
    ]


def _execute_against_backprop(make_tapes, values, device_vjp: bool, loss_seed: int) -> list:
    """qml.execute of make_tapes(torch parameters) and a random loss's backward, on our
    device (adjoint) and on default.qubit (backprop); asserts equal results and gradients
    and returns each run's gradients."""
    dev, ref = make_devices(W4)
    runs = []
    for device, kwargs in (
        (dev, {"diff_method": "adjoint", "device_vjp": device_vjp}),
        (ref, {"diff_method": "backprop"}),
    ):
        params = [float64_tensor(v) for v in values]
        results = qml.execute(make_tapes(params), device, interface="torch", **kwargs)
        random_loss(results, loss_seed).backward()
        runs.append((as_numpy(results), [p.grad.numpy() for p in params]))
    assert_allclose_nested(runs[0][0], runs[1][0], atol=ATOL)
    np.testing.assert_allclose(runs[0][1], runs[1][1], atol=ATOL, rtol=0)
    return [grads for _, grads in runs]


@VJP
def test_execute_several_tapes(device_vjp):
    rng = np.random.default_rng(stable_seed("several-tapes"))
    _execute_against_backprop(_tapes, random_angles(rng, 7), device_vjp, loss_seed=7)


@VJP
def test_execute_identical_tapes_different_parameters(device_vjp):
    """Tapes that only differ by their parameters (one batch on the device)."""
    values = [0.3, -1.1, 2.2, 0.7]

    def tapes(params):
        return [
            QuantumScript(
                [qml.Hadamard(0), qml.RX(x, "a"), qml.CNOT(["a", 0]), qml.CRY(x, [0, 3])],
                [qml.expval(qml.Z(3) @ qml.X(0)), qml.probs(wires=["a", 3])],
            )
            for x in params
        ]

    _, reference = _execute_against_backprop(tapes, values, device_vjp, loss_seed=11)
    assert len({float(g) for g in reference}) == len(values)  # the gradients differ


# ---------------------------------------------------------------------------------------
# 5. Broadcasting


def _broadcast_circuit(outputs):
    def circuit(x, weights):
        qml.AngleEmbedding(x, wires=W4)
        qml.StronglyEntanglingLayers(weights, wires=W4)
        qml.CRX(weights[0, 0, 0], wires=["a", "q1"])
        if outputs == "state":
            return qml.state()
        return qml.expval(qml.Z("a") @ qml.Z(3)), qml.probs(wires=["q1"])

    return circuit


@VJP
@pytest.mark.parametrize("outputs", ["expval_probs", "state"])
@pytest.mark.parametrize("input_trainable", [False, True], ids=["x_const", "x_trainable"])
def test_broadcast(input_trainable, outputs, device_vjp):
    rng = np.random.default_rng(stable_seed("broadcast", input_trainable, outputs))
    x = rng.uniform(-np.pi, np.pi, size=(5, 4))
    weights = rng.uniform(-np.pi, np.pi, size=(2, 4, 3))
    out, _, _ = compare_torch(
        _broadcast_circuit(outputs),
        [x, weights],
        stable_seed("loss-broadcast", outputs),
        wires=W4,
        trainable=[input_trainable, True],
        diff_method="adjoint",
        device_vjp=device_vjp,
    )
    assert np.shape(out[0] if outputs != "state" else out)[0] == 5


@VJP
def test_broadcast_rotation_angles(device_vjp):
    """A trainable batch of angles in a single RX, with trainable weights elsewhere."""

    def circuit(thetas, w):
        qml.Hadamard(3)
        qml.RX(thetas, wires="a")
        qml.CNOT(["a", 3])
        qml.RY(w[0], wires=3)
        qml.CRZ(w[1], wires=[3, "a"])
        return qml.expval(qml.X(3)), qml.probs(wires=["a"])

    compare_torch(
        circuit,
        [[0.1, -0.8, 1.9], [0.4, 1.3]],
        5,
        wires=W4,
        diff_method="adjoint",
        device_vjp=device_vjp,
    )


# ---------------------------------------------------------------------------------------
# 6. Other interfaces


def _autograd_circuit(weights, x):
    generic_layer(W4, weights)
    qml.CRot(x[0], x[1], x[2], wires=[3, "a"])
    qml.IsingYY(x[0], wires=["q1", 0])
    return qml.expval(qml.X("a") @ qml.Y(0) + 0.5 * qml.Z(3))


def _autograd_probs(weights, x):
    generic_layer(W4, weights)
    qml.CRot(x[0], x[1], x[2], wires=[3, "a"])
    return qml.probs(wires=["a", "q1"])


@VJP
def test_autograd_grad_and_jacobian(device_vjp):
    rng = np.random.default_rng(stable_seed("autograd"))
    weights = pnp.array(rng.uniform(-np.pi, np.pi, size=(4, 2)), requires_grad=True)
    x = pnp.array(random_angles(rng, 3), requires_grad=True)
    dev, ref = make_devices(W4)
    kwargs = {"diff_method": "adjoint", "device_vjp": device_vjp}
    grad = qml.grad(qml.QNode(_autograd_circuit, dev, **kwargs))(weights, x)
    ref_grad = qml.grad(qml.QNode(_autograd_circuit, ref, diff_method="backprop"))(weights, x)
    assert_allclose_nested(grad, ref_grad, atol=ATOL)
    jac = qml.jacobian(qml.QNode(_autograd_probs, dev, **kwargs))(weights, x)
    ref_jac = qml.jacobian(qml.QNode(_autograd_probs, ref, diff_method="backprop"))(weights, x)
    assert_allclose_nested(jac, ref_jac, atol=ATOL)
    assert np.abs(ref_jac[1]).max() > 1e-3


@VJP
def test_jax(device_vjp):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(stable_seed("jax"))
    weights = jax.numpy.array(rng.uniform(-np.pi, np.pi, size=(4, 2)))
    x = jax.numpy.array(random_angles(rng, 3))
    dev, ref = make_devices(W4)
    kwargs = {"diff_method": "adjoint", "device_vjp": device_vjp}
    grad = jax.grad(qml.QNode(_autograd_circuit, dev, **kwargs), argnums=(0, 1))(weights, x)
    ref_grad = jax.grad(qml.QNode(_autograd_circuit, ref, diff_method="backprop"), argnums=(0, 1))(
        weights, x
    )
    assert_allclose_nested(grad, ref_grad, atol=ATOL)
    jac = jax.jacobian(qml.QNode(_autograd_probs, dev, **kwargs), argnums=(0, 1))(weights, x)
    ref_jac = jax.jacobian(qml.QNode(_autograd_probs, ref, diff_method="backprop"), argnums=(0, 1))(
        weights, x
    )
    assert_allclose_nested(jac, ref_jac, atol=ATOL)


# ---------------------------------------------------------------------------------------
# 7. TorchLayer training


def _train(device, steps=5, **qnode_kwargs):
    wires = W4[:3]

    @qml.qnode(device, interface="torch", **qnode_kwargs)
    def qnode(inputs, weights):
        qml.AngleEmbedding(inputs, wires=wires)
        qml.BasicEntanglerLayers(weights, wires=wires)
        qml.CRot(weights[0, 0], weights[0, 1], weights[1, 2], wires=[wires[2], wires[0]])
        return [qml.expval(qml.Z(w)) for w in wires]

    torch.manual_seed(1234)
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 3),
        qml.qnn.TorchLayer(qnode, {"weights": (2, 3)}),
        torch.nn.Linear(3, 1),
    ).double()
    data = torch.randn(6, 2, dtype=torch.float64)
    target = torch.randn(6, 1, dtype=torch.float64)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, [p.detach().numpy().copy() for p in model.parameters()]


@VJP
def test_torch_layer_training(device_vjp):
    dev, ref = make_devices(W4[:3])
    losses, params = _train(dev, diff_method="adjoint", device_vjp=device_vjp)
    ref_losses, ref_params = _train(ref, diff_method="backprop")
    np.testing.assert_allclose(losses, ref_losses, atol=ATOL, rtol=0)
    assert_allclose_nested(params, ref_params, atol=ATOL)
    assert len(set(ref_losses)) == len(ref_losses)  # the training moved


# ---------------------------------------------------------------------------------------
# 8. Errors, and "best" falling back to parameter-shift


def _error_circuit(kind):
    def circuit(x):
        if kind == "state_prep":
            qml.StatePrep(qml.math.stack([torch.cos(x), torch.sin(x), 0 * x, 0 * x]), wires=[0, 1])
        if kind == "qubit_unitary":
            c, s = torch.cos(x), torch.sin(x)
            qml.QubitUnitary(qml.math.stack([qml.math.stack([c, -s]), qml.math.stack([s, c])]), 0)
        qml.RX(x, wires=0)
        qml.CNOT([0, 1])
        if kind == "sample":
            return qml.sample(wires=[1])
        if kind == "counts":
            return qml.counts(wires=[1])
        return qml.expval(qml.Z(1))

    return circuit


ERRORS = {
    # kind: (shots, words the message must contain)
    "shots": (100, ["shots"]),
    "sample": (100, ["sample"]),
    "counts": (100, ["counts"]),
}  # postselection is differentiated: tests/preprocess/test_postselection_adjoint.py


@VJP
@pytest.mark.parametrize("kind", list(ERRORS))
def test_adjoint_errors(kind, device_vjp):
    shots, words = ERRORS[kind]
    dev = qml.device("custatevec.qubit", wires=2)
    qnode = qml.QNode(
        _error_circuit(kind),
        dev,
        diff_method="adjoint",
        device_vjp=device_vjp,
    )
    if shots:
        qnode = qml.set_shots(qnode, shots)
    x = float64_tensor(0.4)
    with pytest.raises(DeviceError) as info:
        out = qnode(x)
        torch.as_tensor(out, dtype=torch.float64).sum().backward()
    message = str(info.value)
    assert message.startswith(ERROR_PREFIX), message
    for word in words:
        assert word in message.lower().replace("_", "").replace(" ", ""), message


@pytest.mark.parametrize("kind", ["qubit_unitary", "state_prep"])
@pytest.mark.parametrize("diff_method", ["adjoint", "best"])
def test_trainable_matrices_and_states_are_taken_by_their_entries(kind, diff_method):
    """A trainable QubitUnitary or StatePrep (refused before; "best" took parameter-shift
    through their decompositions): the adjoint method, backpropagation's gradient (at
    x = 0 the prepared state has zero amplitudes, where Mottonen's angles give NaN)."""
    dev, ref = make_devices(2)
    circuit = _error_circuit(kind)
    qnode = qml.QNode(circuit, dev, diff_method=diff_method)
    config = qml.workflow.construct_execution_config(qnode)(float64_tensor(0.4))
    assert config.gradient_method == "adjoint"
    for value in (0.4, 0.0):
        x, ref_x = float64_tensor(value), float64_tensor(value)
        qnode(x).backward()
        qml.QNode(circuit, ref, diff_method="backprop")(ref_x).backward()
        np.testing.assert_allclose(x.grad, ref_x.grad, atol=ATOL, rtol=0)
        assert np.isfinite(float(x.grad))


@pytest.mark.parametrize("kind", ["shots"])
def test_best_falls_back_to_parameter_shift(kind):
    shots = 20000 if kind == "shots" else None
    dev, ref = make_devices(2, seed=17)
    circuit = _error_circuit(kind)
    qnode = qml.QNode(circuit, dev, diff_method="best")
    if shots:
        qnode = qml.set_shots(qnode, shots)
    config = qml.workflow.construct_execution_config(qnode)(float64_tensor(0.4))
    assert config.gradient_method is qml.gradients.param_shift
    x, ref_x = float64_tensor(0.4), float64_tensor(0.4)
    qnode(x).backward()
    qml.QNode(circuit, ref, diff_method="backprop")(ref_x).backward()
    atol = 0.05 if shots else ATOL
    np.testing.assert_allclose(x.grad, ref_x.grad, atol=atol, rtol=0)
    assert abs(float(ref_x.grad)) > 0.1


def test_best_takes_adjoint_when_it_can():
    dev = qml.device("custatevec.qubit", wires=2)
    qnode = qml.QNode(_error_circuit("expval"), dev, diff_method="best")
    config = qml.workflow.construct_execution_config(qnode)(float64_tensor(0.4))
    assert config.gradient_method == "adjoint"


def _best_state_mix(x, w):
    qml.Hadamard("a")
    qml.RX(x, wires="a")
    qml.CRY(w, wires=["a", 3])
    return qml.expval(qml.Z(3)), qml.state()


def _best_broadcast(x, w):
    qml.Hadamard("a")
    qml.RX(x, wires="a")
    qml.CRY(w, wires=["a", 3])
    return qml.expval(qml.Z(3)), qml.probs(wires=["a"])


@pytest.mark.parametrize(
    "circuit, values",
    [(_best_state_mix, [0.3, -0.8]), (_best_broadcast, [[0.3, 1.2, -2.0], -0.8])],
    ids=["state_mix", "broadcast"],
)
def test_best_differentiates(circuit, values):
    """The default diff_method ("best") differentiates what adjoint serves, or falls back."""
    compare_torch(circuit, values, 13, wires=W4[:2])


@VJP
def test_deferred_measurement_without_postselection(device_vjp):
    """Mid-circuit measurements deferred (no postselection) are differentiable."""

    def circuit(x, y):
        qml.RX(x, wires=0)
        m = qml.measure(0)
        qml.cond(m, qml.RY)(y, wires=1)
        qml.CNOT([1, 2])
        return qml.expval(qml.Z(2)), qml.probs(wires=[0, 1])

    dev = qml.device("custatevec.qubit", wires=4)
    ref = qml.device("default.qubit", wires=4)
    runs = []
    for device, kwargs in (
        (dev, {"diff_method": "adjoint", "device_vjp": device_vjp}),
        (ref, {"diff_method": "backprop"}),
    ):
        params = [float64_tensor(0.7), float64_tensor(-1.2)]
        out = qml.QNode(circuit, device, mcm_method="deferred", **kwargs)(*params)
        random_loss(out, 3).backward()
        runs.append((as_numpy(out), [p.grad.numpy() for p in params]))
    assert_allclose_nested(runs[0][0], runs[1][0], atol=ATOL)
    np.testing.assert_allclose(runs[0][1], runs[1][1], atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------
# 9. Final states kept from the forward pass


def _cache_circuit(x, y):
    qml.Hadamard("a")
    qml.RX(x, wires="a")
    qml.CNOT(["a", 3])
    qml.Rot(y[0], y[1], y[2], wires="q1")
    qml.CRY(x, wires=["q1", 0])
    return qml.expval(qml.Z(3) @ qml.X("q1")), qml.probs(wires=[0, "a"])


def _cache_reference(values):
    """Values and gradients of random_loss(_cache_circuit) on default.qubit."""
    ref = qml.device("default.qubit", wires=W4)
    return torch_run(_cache_circuit, ref, values, 21, diff_method="backprop")


def _check(params, out, values):
    ref_out, ref_grads = _cache_reference(values)
    assert_allclose_nested(as_numpy(out), ref_out, atol=ATOL)
    for p, r in zip(params, ref_grads, strict=True):
        np.testing.assert_allclose(p.grad.numpy(), r, atol=ATOL, rtol=0)


class _Simulations:
    """Counts the simulations of whole circuits: ``simulate.final_state`` (gate by gate)
    and ``sequences.run`` (a small circuit of a known structure in one backend call)."""

    def __init__(self, mocker):
        self._spies = (
            mocker.spy(pennylane_custatevec.simulate, "final_state"),
            mocker.spy(pennylane_custatevec.sequences, "run"),
        )

    @property
    def call_count(self) -> int:
        return sum(spy.call_count for spy in self._spies)


@pytest.fixture
def simulations(mocker):
    """The simulations of whole circuits (forward and adjoint run them)."""
    return _Simulations(mocker)


def test_vjp_backward_does_not_simulate_again(simulations):
    dev = qml.device("custatevec.qubit", wires=W4)
    qnode = qml.QNode(_cache_circuit, dev, diff_method="adjoint", device_vjp=True)
    values = [0.3, [0.1, -0.5, 1.2]]
    params = [float64_tensor(v) for v in values]
    out = qnode(*params)
    assert simulations.call_count == 1
    random_loss(out, 21).backward()
    assert simulations.call_count == 1
    _check(params, out, values)


def test_broadcast_backward_does_not_simulate_again(simulations, mocker):
    """Broadcasting expands into tapes of one structure with other parameters: the forward
    pass simulates them as one batch, and every tape's VJP takes its own final state."""
    dev = qml.device("custatevec.qubit", wires=2)
    ref = qml.device("default.qubit", wires=2)
    compilations = mocker.spy(pennylane_custatevec.gradients.differentiated, "compile_steps")

    def circuit(x, y):
        qml.RX(x, wires=0)
        qml.CNOT([0, 1])
        qml.RY(y, wires=1)
        return qml.expval(qml.Z(1))

    grads = []
    for device, kwargs in ((dev, {"diff_method": "adjoint", "device_vjp": True}), (ref, {})):
        x, y = float64_tensor([0.1, 0.7, -1.3, 2.0]), float64_tensor(0.4)
        qml.QNode(circuit, device, **kwargs)(x, y).sum().backward()
        grads.append((x.grad.numpy(), y.grad.numpy()))
        if device is dev:
            assert simulations.call_count == 1
            assert compilations.call_count == 0
    for ours, reference in zip(*grads, strict=True):
        np.testing.assert_allclose(ours, reference, atol=ATOL)


def test_jacobian_path_simulates_once(simulations):
    dev = qml.device("custatevec.qubit", wires=W4)
    qnode = qml.QNode(_cache_circuit, dev, diff_method="adjoint")
    values = [0.3, [0.1, -0.5, 1.2]]
    params = [float64_tensor(v) for v in values]
    out = qnode(*params)
    random_loss(out, 21).backward()
    assert simulations.call_count == 1
    _check(params, out, values)


def test_second_forward_with_new_parameters(simulations):
    dev = qml.device("custatevec.qubit", wires=W4)
    qnode = qml.QNode(_cache_circuit, dev, diff_method="adjoint", device_vjp=True)
    for values in ([0.3, [0.1, -0.5, 1.2]], [-1.4, [2.0, 0.6, -0.2]]):
        params = [float64_tensor(v) for v in values]
        out = qnode(*params)
        random_loss(out, 21).backward()
        _check(params, out, values)
    assert simulations.call_count == 2


def test_backward_after_another_circuit_ran():
    """Another circuit executed on the device between forward and backward."""
    dev = qml.device("custatevec.qubit", wires=W4)
    qnode = qml.QNode(_cache_circuit, dev, diff_method="adjoint", device_vjp=True)

    def other(x):
        qml.Hadamard("a")
        qml.RX(x, wires="a")
        qml.CNOT(["a", 3])
        qml.Rot(0.4, 0.4, 0.4, wires="q1")
        qml.CRY(x, wires=["q1", 0])
        return qml.expval(qml.Z(3) @ qml.X("q1")), qml.probs(wires=[0, "a"])

    values = [0.3, [0.1, -0.5, 1.2]]
    params = [float64_tensor(v) for v in values]
    out = qnode(*params)
    for kwargs in ({"diff_method": "adjoint", "device_vjp": True}, {"diff_method": None}):
        qml.QNode(other, dev, **kwargs)(float64_tensor(1.1))  # a near-identical circuit
    qml.QNode(_cache_circuit, dev, diff_method="adjoint", device_vjp=True)(
        float64_tensor(2.5), float64_tensor([0.1, -0.5, 1.2])
    )  # the same circuit, another parameter
    random_loss(out, 21).backward()
    _check(params, out, values)


def test_two_forwards_then_one_backward():
    """Two QNodes run forward on the same device, then one loss of both is differentiated."""
    dev = qml.device("custatevec.qubit", wires=W4)
    ref = qml.device("default.qubit", wires=W4)

    def second(x):
        qml.RY(x, wires=0)
        qml.CNOT([0, "a"])
        return qml.expval(qml.X(0) @ qml.Z("a"))

    grads = []
    for device, kwargs in (
        (dev, {"diff_method": "adjoint", "device_vjp": True}),
        (ref, {"diff_method": "backprop"}),
    ):
        params = [float64_tensor(0.3), float64_tensor([0.1, -0.5, 1.2])]
        out1 = qml.QNode(_cache_circuit, device, **kwargs)(*params)
        out2 = qml.QNode(second, device, **kwargs)(params[0])
        (random_loss(out1, 21) + 0.7 * out2).backward()
        grads.append([p.grad.numpy() for p in params])
    assert_allclose_nested(grads[0], grads[1], atol=ATOL)


def test_backward_twice():
    """retain_graph: the second backward does not reuse the state the first consumed."""
    dev = qml.device("custatevec.qubit", wires=W4)
    qnode = qml.QNode(_cache_circuit, dev, diff_method="adjoint", device_vjp=True)
    values = [0.3, [0.1, -0.5, 1.2]]
    params = [float64_tensor(v) for v in values]
    loss = random_loss(qnode(*params), 21)
    loss.backward(retain_graph=True)
    loss.backward()
    _, ref_grads = _cache_reference(values)
    for p, r in zip(params, ref_grads, strict=True):
        np.testing.assert_allclose(p.grad.numpy(), 2 * r, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------
# 10. The device API


API_CASES = [
    "two_expvals_three_params",
    "one_expval_one_param",
    "one_expval_all_params",
    "hamiltonian_two_params",
    "three_expvals_one_param",
]
ADJOINT = ExecutionConfig(gradient_method="adjoint")


def _cotangent(tape, rng):
    dy = tuple(rng.normal() for _ in tape.measurements)
    return dy[0] if len(dy) == 1 else dy


@pytest.mark.parametrize("case", API_CASES)
def test_compute_derivatives(case):
    tape = api_tape(case)
    dev, ref = make_devices(W4)
    expected = ref.compute_derivatives([tape], ADJOINT)
    assert_allclose_nested(dev.compute_derivatives([tape], ADJOINT), expected, atol=ATOL)
    assert_allclose_nested(dev.compute_derivatives([tape]), expected, atol=ATOL)
    results, jac = dev.execute_and_compute_derivatives([tape], ADJOINT)
    ref_results, ref_jac = ref.execute_and_compute_derivatives([tape], ADJOINT)
    assert_allclose_nested(results, ref_results, atol=ATOL)
    assert_allclose_nested(jac, ref_jac, atol=ATOL)


@pytest.mark.parametrize("case", API_CASES)
def test_compute_vjp(case):
    tape = api_tape(case)
    rng = np.random.default_rng(stable_seed("vjp", case))
    dy = _cotangent(tape, rng)
    dev, ref = make_devices(W4)
    expected = ref.compute_vjp([tape], [dy], ADJOINT)
    assert_allclose_nested(dev.compute_vjp([tape], [dy], ADJOINT), expected, atol=ATOL)
    results, vjp = dev.execute_and_compute_vjp([tape], [dy], ADJOINT)
    ref_results, ref_vjp = ref.execute_and_compute_vjp([tape], [dy], ADJOINT)
    assert_allclose_nested(results, ref_results, atol=ATOL)
    assert_allclose_nested(vjp, ref_vjp, atol=ATOL)
    assert np.abs(np.asarray(ref_vjp[0])).max() > 1e-3


def test_device_api_several_tapes():
    tapes = [api_tape(case) for case in API_CASES]
    rng = np.random.default_rng(stable_seed("vjp-several"))
    dys = [_cotangent(t, rng) for t in tapes]
    dev, ref = make_devices(W4)
    assert_allclose_nested(
        dev.compute_derivatives(tapes, ADJOINT),
        ref.compute_derivatives(tapes, ADJOINT),
        atol=ATOL,
    )
    assert_allclose_nested(
        dev.execute_and_compute_vjp(tapes, dys, ADJOINT),
        ref.execute_and_compute_vjp(tapes, dys, ADJOINT),
        atol=ATOL,
    )


def test_device_api_probs_and_state():
    """Jacobians of probs and of a state alone, against parameter-shift on default.qubit."""
    dev, ref = make_devices(["a", 3])  # the tapes' wires: the device API does not map wires
    ops = [qml.RX(0.3, "a"), qml.CNOT(["a", 3]), qml.RY(0.5, 3), qml.CRZ(1.1, [3, "a"])]
    probs = QuantumScript([qml.Hadamard("a"), *ops], [qml.probs(wires=["a", 3])])
    probs.trainable_params = [0, 2]
    shift_tapes, fn = qml.gradients.param_shift(probs)
    assert_allclose_nested(dev.compute_derivatives([probs])[0], fn(ref.execute(shift_tapes)), ATOL)

    state = QuantumScript([qml.Hadamard("a"), *ops], [qml.state()])
    state.trainable_params = [1, 2]
    jac = dev.compute_derivatives([state])[0]
    assert len(jac) == 2

    def psi(p):
        bound = state.bind_new_parameters([p[0], p[1]], [1, 2])
        return real_vector(qml.execute([bound], ref, diff_method="backprop")[0])

    expected = torch.autograd.functional.jacobian(psi, float64_tensor([0.5, 1.1])).numpy()
    for column in range(2):
        np.testing.assert_allclose(
            real_vector(torch.tensor(jac[column])), expected[:, column], atol=ATOL
        )


def test_supports_derivatives():
    dev = qml.device("custatevec.qubit", wires=2)
    assert dev.supports_derivatives(ExecutionConfig(gradient_method="adjoint"))
    assert dev.supports_vjp(ExecutionConfig(gradient_method="adjoint"))
    assert not dev.supports_derivatives(ExecutionConfig(gradient_method="backprop"))
    config = dev.setup_execution_config(ExecutionConfig(gradient_method="best"))
    assert config.gradient_method == "adjoint"


def test_cotangents_of_a_wrong_shape_are_refused_with_a_clear_error():
    """A cotangent of neither its result's shape nor a batch of it is refused naming the
    shapes, never misread (batches of cotangents: tests/gradients/test_jvp.py)."""
    dev = qml.device("custatevec.qubit", wires=2)
    tape = qml.tape.QuantumScript(
        [qml.RX(0.3, wires=0), qml.CNOT([0, 1])], [qml.expval(qml.Z(1)), qml.probs(wires=[0])]
    )
    tape.trainable_params = [0]
    with pytest.raises(qml.exceptions.DeviceError, match=r"shape \(3,\).*shape \(2,\)"):
        dev.compute_vjp([tape], [(1.0, np.ones(3))])
    (result,) = dev.compute_vjp([tape], [(1.0, np.array([0.5, -0.5]))])
    expected = -np.sin(0.3) + 0.5 * (-np.sin(0.3) / 2) - 0.5 * (np.sin(0.3) / 2)
    assert np.allclose(result, [expected])


@pytest.mark.parametrize("entries", [[0.3, 1.1], [0.3]], ids=["two", "one"])
@pytest.mark.parametrize("executed_first", [False, True], ids=["cold", "after-execute"])
@pytest.mark.parametrize("mode", ["deferred", "eager"])
def test_broadcast_tapes_given_directly_are_expanded(entries, executed_first, mode):
    """Preprocessing expands broadcasts; a broadcast tape handed to the device's derivative
    methods directly (even a broadcast of one entry, even after its forward pass; PennyLane
    does this under jax.vmap) is expanded by them, never differentiated as if it were not
    broadcast: one gradient entry per broadcast entry (-sin x of cos x), a Jacobian and a
    JVP with the batch axis first."""
    dev = qml.device("custatevec.qubit", wires=2, grad_accumulation=mode)
    x = np.array(entries)
    tape = qml.tape.QuantumScript([qml.RX(x, wires=0), qml.CNOT([0, 1])], [qml.expval(qml.Z(1))])
    tape.trainable_params = [0]
    config = ExecutionConfig(gradient_method="adjoint")
    if executed_first:
        dev.execute([tape], config)
    (vjp,) = dev.compute_vjp([tape], [np.full(len(entries), 2.0)], config)
    assert len(vjp) == 1 and vjp[0].shape == (len(entries),)
    np.testing.assert_allclose(vjp[0], -2.0 * np.sin(x), atol=1e-12)
    (jacobian,) = dev.compute_derivatives([tape], config)
    np.testing.assert_allclose(jacobian, -np.sin(x), atol=1e-12)
    (jvp,) = dev.compute_jvp([tape], [(np.full(len(entries), 3.0),)], config)
    np.testing.assert_allclose(jvp, -3.0 * np.sin(x), atol=1e-12)


# ---------------------------------------------------------------------------------------
# 11. Validation: once, in the preprocessing; the entry points validate what skipped it


def _validation_circuit(x, w):
    qml.RY(x, wires=0)
    qml.CNOT([0, 1])
    qml.CRX(w, wires=[1, 0])
    return qml.expval(qml.Z(0)), qml.probs(wires=[1])


@pytest.mark.parametrize(
    "device_vjp, x, tapes",
    [(False, 0.4, 1), (True, 0.4, 1), (True, [0.4, -0.3, 1.2], 3)],
    ids=["jacobian", "vjp", "broadcast"],
)
def test_a_differentiated_qnode_validates_each_tape_once(device_vjp, x, tapes, mocker):
    """A QNode differentiated by adjoint: the preprocessing validates each tape, and the
    derivative that follows (a Jacobian on execution, or a VJP in the backward) does not
    again. A trainable broadcast: three tapes in both modes (the deferred mode expands a
    broadcast whose parameter is trainable too). Both modes (``grad_accumulation``)."""
    reasons = mocker.spy(pennylane_custatevec.gradients.validation, "unsupported_reason")
    dev = qml.device("custatevec.qubit", wires=2)
    qnode = qml.QNode(_validation_circuit, dev, diff_method="adjoint", device_vjp=device_vjp)
    x, w = float64_tensor(x), float64_tensor(0.9)
    real_vector(qnode(x, w)).sum().backward()
    assert reasons.call_count == tapes
    reference = qml.QNode(_validation_circuit, qml.device("default.qubit", wires=2))
    x_ref, w_ref = float64_tensor(x.detach().numpy()), float64_tensor(0.9)
    real_vector(reference(x_ref, w_ref)).sum().backward()
    np.testing.assert_allclose(w.grad, w_ref.grad, atol=1e-10)


def _trainable_unitary_tape():
    tape = QuantumScript(
        [qml.RX(0.3, wires=0), qml.QubitUnitary(np.eye(2), wires=1)], [qml.expval(qml.Z(0))]
    )
    tape.trainable_params = [0, 1]
    return tape


def _unit_tangents(tape):
    return tuple(np.ones(np.shape(p)) for p in tape.get_parameters())


DIRECT_CALLS = {
    "compute_derivatives": lambda dev, tape, config: dev.compute_derivatives([tape], config),
    "compute_vjp": lambda dev, tape, config: dev.compute_vjp([tape], [1.0], config),
    "compute_jvp": lambda dev, tape, config: dev.compute_jvp(
        [tape], [_unit_tangents(tape)], config
    ),
    "execute_and_compute_derivatives": lambda dev, tape, config: (
        dev.execute_and_compute_derivatives([tape], config)
    ),
    "execute_and_compute_vjp": lambda dev, tape, config: dev.execute_and_compute_vjp(
        [tape], [1.0], config
    ),
    "execute_and_compute_jvp": lambda dev, tape, config: dev.execute_and_compute_jvp(
        [tape], [_unit_tangents(tape)], config
    ),
}


@pytest.mark.parametrize(
    "config",
    [None, ExecutionConfig(), ExecutionConfig(gradient_method="adjoint")],
    ids=["no-config", "default", "adjoint-by-hand"],
)
@pytest.mark.parametrize("entry_point", list(DIRECT_CALLS))
def test_direct_calls_validate_what_the_preprocessing_did_not(entry_point, config):
    """The derivative entry points called without the device's preprocessing (a config of
    one's own, or none) refuse a tape the adjoint method cannot differentiate with the
    preprocessing's DeviceError, naming the reason (a trainable QubitUnitary, which only the
    preprocessing takes by its entries), in both modes (``grad_accumulation``)."""
    dev = qml.device("custatevec.qubit", wires=2)
    with pytest.raises(DeviceError, match="QubitUnitary has a trainable matrix") as info:
        DIRECT_CALLS[entry_point](dev, _trainable_unitary_tape(), config)
    assert str(info.value).startswith(ERROR_PREFIX)


@pytest.mark.parametrize("entry_point", ["compute_derivatives", "compute_vjp", "compute_jvp"])
def test_direct_calls_refuse_a_tape_with_shots(entry_point):
    """The same for a tape with shots (the default ExecutionConfig)."""
    dev = qml.device("custatevec.qubit", wires=2)
    tape = QuantumScript([qml.RX(0.3, wires=0)], [qml.expval(qml.Z(0))], shots=100)
    with pytest.raises(DeviceError, match="needs analytic execution and the circuit has shots"):
        DIRECT_CALLS[entry_point](dev, tape, ExecutionConfig())


def test_the_adjoint_config_of_the_device_says_its_preprocessing_validates():
    """``setup_execution_config`` marks a config for the adjoint method (whose preprocessing
    validates) and only such a config, whatever the config it was given said."""
    dev = qml.device("custatevec.qubit", wires=2)
    marker = pennylane_custatevec.preprocess.config.ADJOINT_VALIDATED_IN_PREPROCESSING
    adjoint = dev.setup_execution_config(ExecutionConfig(gradient_method="adjoint"))
    assert adjoint.device_options[marker] is True
    forward = dev.setup_execution_config(
        ExecutionConfig(gradient_method=None, device_options={marker: True})
    )
    assert marker not in forward.device_options
    with pytest.raises(DeviceError, match="QubitUnitary has a trainable matrix"):
        dev.compute_derivatives([_trainable_unitary_tape()], forward)
