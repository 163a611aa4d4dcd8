"""The compiled path's device entry points: ``structure_of``, ``execute_structures`` and
``vjp_structures`` give what ``execute`` and ``compute_vjp`` give for the tapes they stand
for, in both accumulation modes, for one cotangent and for a batch of them."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from pennylane.devices import ExecutionConfig

from pennylane_custatevec import options
from pennylane_custatevec.structures import StructureKey


def _tape(angles, weights) -> qml.tape.QuantumScript:
    ops = [qml.RX(angles[0], wires=0), qml.RY(angles[1], wires=1), qml.CNOT([0, 1])]
    ops += [qml.StronglyEntanglingLayers(weights, wires=[0, 1, 2]), qml.CRZ(angles[2], [2, 0])]
    measurements = [qml.expval(qml.Z(0) @ qml.X(2)), qml.probs(wires=[1, 2])]
    return qml.tape.QuantumScript(ops, measurements, trainable_params=[0, 1, 2, 3])


def _adjoint_config(device) -> ExecutionConfig:
    config = ExecutionConfig(
        gradient_method="adjoint", use_device_jacobian_product=True, interface="torch"
    )
    return device.setup_execution_config(config)


@pytest.mark.parametrize("accumulation", ["deferred", "eager"])
def test_structures_run_and_differentiate_as_their_tapes(accumulation, rng):
    device = qml.device("custatevec.qubit", wires=3, backend="cpu")
    with options(grad_accumulation=accumulation):
        config = _adjoint_config(device)
    preprocess = device.preprocess_transforms(config)
    template = _tape(rng.uniform(0, 3, 3), rng.uniform(0, 3, (1, 3, 3)))
    (processed,), _ = preprocess((template,))
    structure = device.structure_of(processed)
    for _ in range(2):
        tape = _tape(rng.uniform(0, 3, 3), rng.uniform(0, 3, (1, 3, 3)))
        (expected_tape,), _ = preprocess((tape,))
        values = expected_tape.get_parameters(trainable_only=False, operations_only=True)
        run = device.execute_structures([structure], [values], config)
        expected = device.execute([expected_tape], config)
        for got, want in zip(run.results[0], expected[0], strict=True):
            np.testing.assert_allclose(got, want, atol=1e-12)
        dy = (np.float64(0.7), rng.uniform(-1, 1, 4))
        vjp = device.vjp_structures(run, [dy], config)
        expected_vjp = device.compute_vjp([expected_tape], [dy], config)
        for got, want in zip(vjp[0], expected_vjp[0], strict=True):
            np.testing.assert_allclose(got, want, atol=1e-12)
        # a batch of K cotangents: gradients with a leading axis K, row k the VJP of dy_k
        rows = (rng.uniform(-1, 1, 3), rng.uniform(-1, 1, (3, 4)))
        again = device.execute_structures([structure], [values], config)
        batched = device.vjp_structures(again, [rows], config)
        for k in range(3):
            single = device.compute_vjp([expected_tape], [(rows[0][k], rows[1][k])], config)
            for got, want in zip(batched[0], single[0], strict=True):
                np.testing.assert_allclose(np.asarray(got)[k], want, atol=1e-12)


def test_a_run_hands_its_states_out_once(rng):
    device = qml.device("custatevec.qubit", wires=3, backend="cpu")
    config = _adjoint_config(device)
    (processed,), _ = device.preprocess_transforms(config)(
        (_tape([0.1, 0.2, 0.3], np.ones((1, 3, 3))),)
    )
    structure = device.structure_of(processed)
    values = processed.get_parameters(trainable_only=False, operations_only=True)
    run = device.execute_structures([structure], [values], config)
    assert run.kept[0] is not None
    first = device.vjp_structures(run, [(1.0, np.ones(4))], config)
    assert run.kept == [None]
    # the second VJP simulates again and agrees
    second = device.vjp_structures(run, [(1.0, np.ones(4))], config)
    for a, b in zip(first[0], second[0], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-12)


def test_the_structure_key_is_exact_and_ignores_only_parameter_values():
    base = _tape([0.1, 0.2, 0.3], np.ones((1, 3, 3)))
    assert StructureKey.of(base) == StructureKey.of(_tape([1.1, 2.2, 3.3], np.zeros((1, 3, 3))))
    other_wires = qml.tape.QuantumScript(
        [qml.RX(0.1, wires=1)], [qml.expval(qml.Z(0))], trainable_params=[0]
    )
    same_wires = qml.tape.QuantumScript(
        [qml.RX(0.1, wires=0)], [qml.expval(qml.Z(0))], trainable_params=[0]
    )
    assert StructureKey.of(other_wires) != StructureKey.of(same_wires)
    # observables by exact data: coefficients differing in the last bit are other structures
    h1 = qml.Hamiltonian([0.1, 0.2], [qml.Z(0), qml.X(0)])
    h2 = qml.Hamiltonian([0.1, np.nextafter(0.2, 1)], [qml.Z(0), qml.X(0)])
    t1 = qml.tape.QuantumScript([qml.RX(0.1, wires=0)], [qml.expval(h1)], trainable_params=[0])
    t2 = qml.tape.QuantumScript([qml.RX(0.1, wires=0)], [qml.expval(h2)], trainable_params=[0])
    assert StructureKey.of(t1) != StructureKey.of(t2)
    # trainable parameters and parameter shapes are part of the structure
    assert StructureKey.of(same_wires) != StructureKey.of(same_wires.copy(trainable_params=[]))
    broadcast = qml.tape.QuantumScript(
        [qml.RX(np.array([0.1, 0.2]), wires=0)], [qml.expval(qml.Z(0))], trainable_params=[0]
    )
    assert StructureKey.of(broadcast) != StructureKey.of(same_wires)


def test_structures_refuse_shots_and_trainable_observables():
    device = qml.device("custatevec.qubit", wires=1, backend="cpu")
    sampled = qml.tape.QuantumScript([qml.RX(0.1, 0)], [qml.expval(qml.Z(0))], shots=10)
    with pytest.raises(ValueError, match="has shots"):
        device.structure_of(sampled)
    h = qml.Hamiltonian([0.5], [qml.Z(0)])
    trainable_obs = qml.tape.QuantumScript(
        [qml.RX(0.1, 0)], [qml.expval(h)], trainable_params=[0, 1]
    )
    with pytest.raises(ValueError, match="belong to its observables"):
        device.structure_of(trainable_obs)
