"""Adversarial checks of the device's own path (a plain QNode, no ``compile``) against
default.qubit over several calls: the first call of a structure runs gate by gate, the
second compiles it from the cached ``Structure`` and small circuits of Pauli expectation
values then run directly (``direct.py``), so a call sequence crosses all three."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from pennylane import numpy as pnp

import pennylane_custatevec

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _device(wires, **kwargs):
    return qml.device("custatevec.qubit", wires=wires, backend="cpu", **kwargs)


def _stacked(qnode):
    def f(*args):
        result = qnode(*args)
        if isinstance(result, tuple):
            return qml.math.stack(result)
        return result

    return f


def _trainable(*values):
    return tuple(pnp.array(v, requires_grad=True) for v in values)


# Regressions found by these checks (fixed in backends/)


@pytest.mark.parametrize("gate", ["IsingZZ", "MultiRZ", "PauliRot"])
def test_zz_rotation_gradient_on_two_qubits_first_call(gate):
    """The adjoint step through a Z-word rotation on a 2-qubit register (the general path:
    a structure's first call): ``_low_diagonal_step`` walked dim >> 3 blocks of 8
    amplitudes, none on 4, so the gate was neither differentiated nor undone (a gradient
    of cos(x) and 0: wrong numbers)."""

    def circuit(x, z):
        qml.RY(x, wires=0)
        if gate == "IsingZZ":
            qml.IsingZZ(z, wires=[0, 1])
        elif gate == "MultiRZ":
            qml.MultiRZ(z, wires=[0, 1])
        else:
            qml.PauliRot(z, "ZZ", wires=[0, 1])
        return qml.expval(qml.PauliX(0))

    qnode = qml.QNode(circuit, _device(2), diff_method="adjoint")
    x, z = 0.3, 0.4
    grad = qml.grad(qnode)(*_trainable(x, z))  # the first call: gate by gate
    # <X0> = sin(x) cos(z)
    expected = [np.cos(x) * np.cos(z), -np.sin(x) * np.sin(z)]
    assert np.allclose(np.array(grad), expected, atol=1e-12)


def test_infinite_z_rotation_angle_on_the_first_call_gives_nan():
    """An infinite angle gives nan, as on default.qubit (it raised "math domain error":
    ``math.cos`` of the scalar angle)."""

    def circuit(x):
        qml.Hadamard(0)
        qml.IsingZZ(x, wires=[0, 1])
        return qml.expval(qml.PauliX(0))

    qnode = qml.QNode(circuit, _device(2))
    assert np.isnan(qnode(np.inf))


# Scenarios checked and found right


@pytest.mark.parametrize("first", [0.0, -0.0, np.pi, 1e-300])
def test_special_first_angles_then_ordinary_ones(first):
    """Adjoint rotations (the steps hold negated angles), a parameter shared by two gates
    and a gate with a constant: the template's special values must not leak into the
    structure's later calls."""

    def circuit(x, y):
        qml.Hadamard(0)
        qml.RX(x, wires=0)
        qml.adjoint(qml.RY(y, wires=1))
        qml.CNOT([0, 1])
        qml.adjoint(qml.IsingZZ(x, wires=[0, 1]))
        qml.RX(0.0, wires=1)
        qml.CRX(y, wires=[1, 0])
        qml.PauliRot(x, "XY", wires=[0, 1])
        return qml.expval(qml.PauliZ(0) @ qml.PauliX(1)), qml.expval(qml.PauliY(1))

    mine = qml.QNode(circuit, _device(2), diff_method="adjoint")
    reference = qml.QNode(circuit, qml.device("default.qubit", wires=2), diff_method="backprop")
    for values in [(first, first), (0.3, -0.7), (1.1, first), (-2.0, 0.9)]:
        args = _trainable(*values)
        assert np.allclose(mine(*args), reference(*args), atol=1e-12)
        got = qml.jacobian(_stacked(mine))(*args)
        want = qml.jacobian(_stacked(reference))(*args)
        assert np.allclose(got, want, atol=1e-12)


def test_broadcast_sizes_changing_between_calls():
    def circuit(x, y):
        qml.RX(x, wires=0)
        qml.RY(y, wires=1)
        qml.adjoint(qml.RZ(x, wires=1))
        qml.CNOT([0, 1])
        qml.IsingXX(y, wires=[0, 1])
        return qml.expval(qml.PauliZ(0) @ qml.PauliX(1)), qml.expval(qml.PauliY(1))

    rng = np.random.default_rng(7)
    mine = qml.QNode(circuit, _device(2), diff_method="adjoint")
    reference = qml.QNode(circuit, qml.device("default.qubit", wires=2), diff_method="backprop")
    for size in [1, 2, 7, 2, 7, 1]:
        args = _trainable(rng.normal(size=size), rng.normal(size=size))
        assert np.allclose(mine(*args), reference(*args), atol=1e-12)
        got = qml.jacobian(_stacked(mine))(*args)
        want = qml.jacobian(_stacked(reference))(*args)
        assert np.allclose(got, want, atol=1e-12)


def test_trainable_arguments_changing_between_calls():
    def circuit(x, y, z):
        qml.RX(x, wires=0)
        qml.RY(y, wires=1)
        qml.CNOT([0, 1])
        qml.RZ(z, wires=1)
        qml.RX(z, wires=0)
        return qml.expval(qml.PauliZ(1)), qml.expval(qml.PauliX(0) @ qml.PauliY(1))

    rng = np.random.default_rng(8)
    mine = qml.QNode(circuit, _device(2), diff_method="adjoint")
    reference = qml.QNode(circuit, qml.device("default.qubit", wires=2))
    for mask in [(1, 1, 1), (1, 0, 1), (0, 1, 1), (1, 0, 1), (1, 1, 0), (1, 1, 0)]:
        args = [
            pnp.array(v, requires_grad=bool(m))
            for v, m in zip(rng.normal(size=3), mask, strict=True)
        ]
        argnums = [j for j, m in enumerate(mask) if m]
        got = qml.jacobian(_stacked(mine), argnums=argnums)(*args)
        want = qml.jacobian(_stacked(reference), argnums=argnums)(*args)
        assert np.allclose(got, want, atol=1e-12)


def test_observables_of_equal_hash_and_other_data_on_one_device():
    """Two QNodes on one device whose Hermitian observables PennyLane hashes alike."""
    first = np.array([[1.0, 0.5], [0.5, -0.3]])
    second = first + np.array([[1e-9, 0.0], [0.0, 0.0]])
    assert qml.Hermitian(first, 0).hash == qml.Hermitian(second, 0).hash

    def circuit_of(matrix):
        def circuit(x):
            qml.RY(x, 0)
            qml.CNOT([0, 1])
            qml.RX(x, 1)
            return qml.expval(qml.Hermitian(matrix, wires=0))

        return circuit

    device = _device(2)
    for call in range(3):
        x = pnp.array(0.4 + 0.1 * call, requires_grad=True)
        values = [
            qml.QNode(circuit_of(m), device, diff_method="adjoint")(x) for m in (first, second)
        ]
        # the CNOT dephases wire 0: <H> = cos^2(x/2) H00 + sin^2(x/2) H11
        want = [
            np.cos(x / 2) ** 2 * m[0, 0] + np.sin(x / 2) ** 2 * m[1, 1] for m in (first, second)
        ]
        assert np.allclose(values, want, atol=1e-14, rtol=0)
        assert values[0] != values[1]


def test_parameter_types_across_calls():
    def circuit(x, y):
        qml.Hadamard(0)
        qml.RX(x, wires=0)
        qml.adjoint(qml.RY(y, wires=1))
        qml.CNOT([0, 1])
        qml.IsingZZ(x, wires=[0, 1])
        return qml.expval(qml.PauliZ(0) @ qml.PauliX(1)), qml.expval(qml.PauliY(1))

    mine = qml.QNode(circuit, _device(2))
    reference = qml.QNode(circuit, qml.device("default.qubit", wires=2))
    kinds = [
        int,
        float,
        np.float32,
        lambda v: np.array(v, dtype=np.complex128),
        np.array,
        lambda v: complex(v),
    ]
    for kind in kinds:
        for values in [(1, 2), (0, -1), (3, 1), (-2, 0)]:
            args = tuple(kind(v) for v in values)
            assert np.allclose(mine(*args), reference(*args), atol=1e-6)


def test_batch_of_tapes_torch_device_vjp_with_eager_backward():
    torch = pytest.importorskip("torch")

    def tape(x, y, z):
        ops = [
            qml.RX(x, 0),
            qml.RY(y, 1),
            qml.CNOT([0, 1]),
            qml.adjoint(qml.RZ(z, 1)),
            qml.IsingZZ(x, [1, 2]),
            qml.CRY(y, [2, 0]),
        ]
        measurements = [qml.expval(qml.PauliZ(0) @ qml.PauliX(2)), qml.expval(qml.PauliY(1))]
        return qml.tape.QuantumScript(ops, measurements)

    def loss(params, device, diff_method, device_vjp):
        tapes = [tape(*p) for p in params]
        results = qml.execute(tapes, device, diff_method=diff_method, device_vjp=device_vjp)
        return sum(r[0] * (k + 1) + 0.5 * r[1] for k, r in enumerate(results))

    rng = np.random.default_rng(9)
    device = _device(3)
    reference = qml.device("default.qubit", wires=3)
    for call in range(4):
        values = rng.normal(size=(3, 3))
        if call == 0:
            values[0] = [0.0, -0.0, 0.0]
        mine = torch.tensor(values, requires_grad=True)
        theirs = torch.tensor(values, requires_grad=True)
        value = loss(mine, device, "adjoint", True)
        options = {"grad_accumulation": "eager"} if call % 2 else {"fusion_qubits": 3}
        with pennylane_custatevec.options(**options):
            value.backward()
        expected = loss(theirs, reference, "backprop", False)
        expected.backward()
        assert np.allclose(value.detach().numpy(), expected.detach().numpy(), atol=1e-12)
        assert np.allclose(mine.grad.numpy(), theirs.grad.numpy(), atol=1e-12)


def test_complex64_across_calls():
    def circuit(w):
        for i in range(3):
            qml.RY(w[i], i)
        qml.CNOT([0, 1])
        qml.CNOT([1, 2])
        for i in range(3):
            qml.adjoint(qml.RX(w[3 + i], i))
        return qml.expval(qml.PauliZ(0) @ qml.PauliZ(2)), qml.expval(
            qml.Hamiltonian([0.5, 0.25], [qml.PauliX(1), qml.PauliY(0) @ qml.PauliY(2)])
        )

    rng = np.random.default_rng(10)
    mine = qml.QNode(circuit, _device(3, c_dtype=np.complex64), diff_method="adjoint")
    reference = qml.QNode(circuit, qml.device("default.qubit", wires=3), diff_method="backprop")
    for call in range(4):
        w = pnp.array(np.zeros(6) if call == 0 else rng.normal(size=6), requires_grad=True)
        assert np.allclose(mine(w), reference(w), atol=1e-6)
        got = qml.jacobian(_stacked(mine))(w)
        want = qml.jacobian(_stacked(reference))(w)
        assert np.allclose(got, want, atol=1e-6)
