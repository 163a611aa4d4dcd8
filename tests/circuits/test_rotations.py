"""Runs of rotation gates gathered into one operation (rotations.py, the preprocessing's
``gather_rotations``).

The gathered operation must stand exactly for its gates: the same matrix, decomposition
and resources, and through the device the same results and gradients as default.qubit
running the gates, in every mode, output and backend; broadcast gates and single
rotations are left alone.
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import torch
from adjoint_cases import assert_same_run, torch_run
from conftest import (
    DEVICE,
    MIXED_WIRES,
    assert_sampled_matches_exact,
    stable_seed,
)
from pennylane.exceptions import DeviceError
from pennylane.ops.functions import bind_new_parameters
from pennylane.tape import QuantumScript

from pennylane_custatevec.preprocess.decompose import gather_rotations
from pennylane_custatevec.rotations import PauliRotations

ATOL = 1e-10
WIRES = MIXED_WIRES  # ["a", 3, "q1", 0, "z"]
N_ANGLES = 10


def rotations_circuit(angles, extra):
    """Runs of every kind of rotation gate between entanglers; ``extra`` feeds a
    non-rotation gate, so trainable and constant parameters interleave."""
    a, b, c, d, e = WIRES
    qml.Hadamard(a)
    qml.RX(angles[0], wires=b)
    qml.RY(angles[1], wires=a)
    qml.IsingZZ(angles[2], wires=[c, e])
    qml.RZ(angles[3], wires=b)
    qml.CNOT(wires=[b, d])
    qml.IsingXX(angles[4], wires=[a, d])
    qml.IsingYY(angles[5], wires=[e, b])
    qml.MultiRZ(angles[6], wires=[a, c, d])
    qml.PauliRot(angles[7], "XIY", wires=[e, a, c])
    qml.CRX(extra, wires=[c, a])
    qml.RY(angles[8], wires=e)
    qml.CZ(wires=[e, a])
    qml.RX(angles[9], wires=d)
    return qml.expval(qml.Z(a) @ qml.Y(c)), qml.probs(wires=[b, e])


def circuit_values(seed):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-np.pi, np.pi, size=N_ANGLES), rng.uniform(-np.pi, np.pi)]


def gathered_tape(values):
    with qml.queuing.AnnotatedQueue() as queue:
        rotations_circuit(*values)
    tape = QuantumScript.from_queue(queue)
    (gathered,), _ = gather_rotations(tape)
    return tape, gathered


# ---------------------------------------------------------------------------------------
# 1. The transform and the operation


def test_runs_of_two_or_more_are_gathered():
    tape, gathered = gathered_tape(circuit_values(1))
    names = [op.name for op in gathered.operations]
    assert names == [
        "Hadamard",
        "PauliRotations",
        "CNOT",
        "PauliRotations",
        "CRX",
        "RY",
        "CZ",
        "RX",
    ]
    runs = [op for op in gathered.operations if isinstance(op, PauliRotations)]
    assert [cls.__name__ for cls, _, _ in runs[0].hyperparameters["gates"]] == [
        "RX",
        "RY",
        "IsingZZ",
        "RZ",
    ]
    assert [word for _, _, word in runs[1].hyperparameters["gates"]] == ["XX", "YY", "ZZZ", "XIY"]
    # the parameters keep their order, so the trainable indices keep their meaning
    assert gathered.get_parameters(trainable_only=False) == tape.get_parameters(
        trainable_only=False
    )


def test_broadcast_gates_are_not_gathered():
    ops = [qml.RX(np.array([0.1, 0.2]), 0), qml.RY(0.3, 1), qml.RZ(np.array([0.4, 0.5]), 0)]
    tape = QuantumScript(ops, [qml.expval(qml.Z(0))])
    (same,), _ = gather_rotations(tape)
    assert same is tape


def test_operation_stands_for_its_gates():
    tape, gathered = gathered_tape(circuit_values(2))
    run = gathered.operations[3]
    gates = tape.operations[6:10]
    assert [g.name for g in run.decomposition()] == [g.name for g in gates]
    for got, expected in zip(run.decomposition(), gates, strict=True):
        assert qml.equal(got, expected)
    order = run.wires
    product = np.eye(2 ** len(order))
    for gate in gates:
        product = qml.matrix(gate, wire_order=order) @ product
    np.testing.assert_allclose(qml.matrix(run, wire_order=order), product, atol=1e-12)
    rebound = bind_new_parameters(run, [0.5] * run.num_params)
    assert isinstance(rebound, PauliRotations) and rebound.data == (0.5,) * run.num_params
    assert rebound.hyperparameters == run.hyperparameters and run.data != rebound.data


def test_resources_count_the_gates():
    """Gate counts are exact; the depth counts a run as one block of its own depth (PennyLane
    weighs an operation by its depth), so it can only grow."""
    tape, gathered = gathered_tape(circuit_values(3))
    expected, got = tape.specs["resources"], gathered.specs["resources"]
    assert got.gate_types == expected.gate_types
    assert got.gate_sizes == expected.gate_sizes
    assert got.num_gates == expected.num_gates
    assert expected.depth <= got.depth <= expected.depth + 1
    run = gathered.operations[1]
    # RX on b, RY on a and IsingZZ on (c, e) in one layer, then RZ on b
    assert run.resources().depth == 2


def test_tracker_counts_the_gates():
    values = circuit_values(4)
    dev = qml.device(DEVICE, wires=WIRES)
    with qml.Tracker(dev) as tracker:
        qml.QNode(rotations_circuit, dev)(*values)
    tape, _ = gathered_tape(values)
    assert tracker.history["resources"][0].gate_types == tape.specs["resources"].gate_types


def test_complex_angle_is_refused():
    """Named by the gate that has it (RY), not by the run, which the user never wrote."""
    run = PauliRotations(0.1, 0.2 + 0.1j, gates=((qml.RX, (0,), "X"), (qml.RY, (1,), "Y")))
    tape = QuantumScript([run], [qml.expval(qml.Z(0))])
    with pytest.raises(DeviceError, match="^RY got a complex angle"):
        qml.device(DEVICE, wires=2).execute(tape)
    gathered = QuantumScript([qml.RX(0.1, 0), qml.RY(0.2 + 0.1j, 1)], [qml.expval(qml.Z(0))])
    with pytest.raises(DeviceError, match="^RY got a complex angle"):
        qml.device(DEVICE, wires=2).execute(gathered)


# ---------------------------------------------------------------------------------------
# 2. Through the device, against default.qubit


def reference_run(values, seed, trainable):
    dev = qml.device("default.qubit", wires=WIRES)
    return torch_run(rotations_circuit, dev, values, seed, trainable, diff_method="backprop")


@pytest.mark.parametrize("device_vjp", [False, True], ids=["jacobian", "vjp"])
@pytest.mark.parametrize("mode", ["deferred", "eager"])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("trainable", [[True, True], [True, False]], ids=["all", "angles"])
def test_gradients_equal_default_qubit(trainable, k, mode, device_vjp):
    values = circuit_values(stable_seed("gradients", k, mode))
    dev = qml.device(DEVICE, wires=WIRES, grad_accumulation=mode, fusion_qubits=k)
    seed = stable_seed("loss", k, mode, device_vjp)
    run = torch_run(
        rotations_circuit,
        dev,
        values,
        seed,
        trainable,
        diff_method="adjoint",
        device_vjp=device_vjp,
    )
    assert_same_run(run, reference_run(values, seed, trainable), ATOL)


def test_some_angles_trainable():
    """Constant and trainable angles in one run: each trainable one gets its column."""

    def circuit(x, y):
        qml.RX(x, wires=0)
        qml.RY(0.4, wires=1)
        qml.IsingZZ(y, wires=[0, 1])
        qml.RZ(0.7, wires=0)
        return qml.expval(qml.X(0) @ qml.Y(1))

    values, trainable = [0.3, -1.1], [True, True]
    runs = [
        torch_run(circuit, qml.device(name, wires=2), values, 3, trainable, diff_method=method)
        for name, method in ((DEVICE, "adjoint"), ("default.qubit", "backprop"))
    ]
    assert_same_run(runs[0], runs[1], ATOL)


@pytest.mark.parametrize("device_vjp", [False, True], ids=["jacobian", "vjp"])
def test_state_output(device_vjp):
    def circuit(angles):
        qml.RX(angles[0], wires=0)
        qml.IsingYY(angles[1], wires=[0, 1])
        qml.RZ(angles[2], wires=1)
        return qml.state()

    values = [np.array([0.3, -1.1, 2.0])]
    run = torch_run(circuit, qml.device(DEVICE, wires=2), values, 5, device_vjp=device_vjp)
    reference = torch_run(
        circuit, qml.device("default.qubit", wires=2), values, 5, diff_method="backprop"
    )
    assert_same_run(run, reference, ATOL)


def test_cuStateVec_double(gpu_double):
    values = circuit_values(stable_seed("double"))
    dev = qml.device(DEVICE, wires=WIRES, backend="custatevec", fusion_qubits=3)
    run = torch_run(rotations_circuit, dev, values, 7, diff_method="adjoint", device_vjp=True)
    assert_same_run(run, reference_run(values, 7, None), ATOL)


def test_sampled_results():
    values = circuit_values(stable_seed("shots"))
    assert_sampled_matches_exact(rotations_circuit, values, WIRES, 11)


def test_reaches_the_device_gathered():
    values = circuit_values(stable_seed("device"))
    params = [torch.tensor(v, requires_grad=True) for v in values]
    dev = qml.device(DEVICE, wires=WIRES)
    qnode = qml.QNode(rotations_circuit, dev, diff_method="adjoint", device_vjp=True)
    (tape,), _ = qml.workflow.construct_batch(qnode, level="device")(*params)
    assert [op.name for op in tape.operations].count("PauliRotations") == 2


def test_gathered_before_and_after_decomposition():
    """The user's rotations are gathered before the preprocessing decomposes (fewer
    operations to inspect), and the rotations a decomposition makes (a trainable Rot:
    RZ RY RZ) after it, so both reach the device gathered."""

    def circuit(angles):
        qml.RX(angles[0], wires=0)
        qml.RY(angles[1], wires=1)
        qml.CNOT(wires=[0, 1])
        qml.Rot(angles[2], angles[3], angles[4], wires=1)
        return qml.expval(qml.Z(1))

    values = [np.array([0.3, -0.5, 1.1, 0.7, -1.4])]
    params = [torch.tensor(values[0], requires_grad=True)]
    dev = qml.device(DEVICE, wires=2)
    qnode = qml.QNode(circuit, dev, diff_method="adjoint", device_vjp=True)
    (tape,), _ = qml.workflow.construct_batch(qnode, level="device")(*params)
    assert [op.name for op in tape.operations] == ["PauliRotations", "CNOT", "PauliRotations"]
    gates = tape.operations[2].hyperparameters["gates"]
    assert [cls.__name__ for cls, _, _ in gates] == ["RZ", "RY", "RZ"]
    run = torch_run(circuit, dev, values, 13, device_vjp=True)
    reference = torch_run(
        circuit, qml.device("default.qubit", wires=2), values, 13, diff_method="backprop"
    )
    assert_same_run(run, reference, ATOL)
