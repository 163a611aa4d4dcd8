"""qml.snapshots on custatevec.qubit: the device records snapshots (``_debugger``) as
default.qubit does, with a state snapshot exact under shots."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from pennylane import numpy as pnp


def _circuit(x):
    qml.RX(x[0], 0)
    qml.Snapshot("start")
    qml.CNOT([0, 1])
    qml.RY(x[1], 1)
    qml.Snapshot("probs", measurement=qml.probs(wires=[1, 0]))
    qml.Snapshot(measurement=qml.expval(qml.X(1)))
    qml.Hadamard(0)
    return qml.expval(qml.Z(0) @ qml.Z(1))


@pytest.mark.parametrize("diff_method", ["best", "adjoint", "parameter-shift"])
def test_analytic_snapshots_equal_default_qubit(diff_method):
    x = pnp.array([0.4, 1.3], requires_grad=True)
    ours = qml.QNode(_circuit, qml.device("custatevec.qubit", wires=2), diff_method=diff_method)
    theirs = qml.QNode(_circuit, qml.device("default.qubit", wires=2))
    result, expected = qml.snapshots(ours)(x), qml.snapshots(theirs)(x)
    assert list(result) == list(expected) == ["start", "probs", 2, "execution_results"]
    for key in expected:
        np.testing.assert_allclose(result[key], expected[key], atol=1e-12)
    # the QNode itself still differentiates, the snapshots left out
    np.testing.assert_allclose(qml.grad(ours)(x), qml.grad(theirs)(x), atol=1e-10)


def test_a_state_snapshot_is_exact_under_shots():
    """With shots a state snapshot is the exact state (PennyLane's fallback for devices
    without a debugger asks for state() with shots and fails); a measurement snapshot is
    sampled with the workflow's shots or its own."""
    x = np.array([0.4, 1.3])

    def circuit(x):
        qml.RX(x[0], 0)
        qml.Snapshot("state")
        qml.CNOT([0, 1])
        qml.Snapshot("own shots", measurement=qml.expval(qml.Z(1)), shots=50000)
        qml.Snapshot("workflow shots", measurement=qml.probs(wires=[0]))
        return qml.expval(qml.Z(0))

    device = qml.device("custatevec.qubit", wires=2, seed=3)
    result = qml.snapshots(qml.set_shots(qml.QNode(circuit, device), 40000))(x)
    exact = qml.snapshots(qml.QNode(circuit, qml.device("default.qubit", wires=2)))(x)
    np.testing.assert_allclose(result["state"], exact["state"], atol=1e-12)
    np.testing.assert_allclose(result["own shots"], exact["own shots"], atol=0.02)
    np.testing.assert_allclose(result["workflow shots"], exact["workflow shots"], atol=0.02)
    np.testing.assert_allclose(result["execution_results"], exact["execution_results"], atol=0.02)


def test_repeated_tags_collect_lists_and_plain_calls_ignore_snapshots():
    def circuit(x):
        for _ in range(2):
            qml.RX(x, 0)
            qml.Snapshot("again", measurement=qml.expval(qml.Z(0)))
        return qml.expval(qml.Z(0))

    qnode = qml.QNode(circuit, qml.device("custatevec.qubit", wires=1))
    result = qml.snapshots(qnode)(0.3)
    np.testing.assert_allclose(result["again"], [np.cos(0.3), np.cos(0.6)], atol=1e-12)
    np.testing.assert_allclose(qnode(0.3), np.cos(0.6), atol=1e-12)


def _measured_then_snapshot(postselect, reset):
    def circuit():
        qml.Hadamard(0)
        qml.RY(0.7, 1)
        qml.CNOT([0, 1])
        m = qml.measure(0, postselect=postselect, reset=reset)
        qml.cond(m, qml.RX)(0.4, wires=1)
        qml.Snapshot("after")
        qml.Snapshot("probs", measurement=qml.probs(wires=[1]))
        return qml.probs(wires=[0, 1])

    return circuit


@pytest.mark.parametrize(("postselect", "reset"), [(None, False), (None, True), (1, False)])
@pytest.mark.parametrize("wires", [None, 4])
def test_a_state_snapshot_after_a_mid_circuit_measurement(postselect, reset, wires):
    """PennyLane's test_snapshot_with_defer_measurement: with mcm_method="deferred" (the
    analytic default) a state snapshot after a mid-circuit measurement is the state of the
    deferred circuit, its measurement's wire included, as default.qubit records it
    (PennyLane's defer_measurements refused the state measurement)."""
    circuit = _measured_then_snapshot(postselect, reset)
    ours = qml.snapshots(qml.QNode(circuit, qml.device("custatevec.qubit", wires=wires)))()
    want = qml.snapshots(qml.QNode(circuit, qml.device("default.qubit", wires=wires)))()
    assert ours.keys() == want.keys()
    for key in want:
        np.testing.assert_allclose(ours[key], want[key], atol=1e-12)
