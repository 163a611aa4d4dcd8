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
    assert run.kept[0].state is None and run.kept[0].compilation is not None
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


# --- Structure.compile: a tape's compilation from its parameter values alone ------------

from gate_cases import (  # noqa: E402
    GATES,
    NON_UNITARY,
    SAME_HYPERPARAMETERS_EXPECTED_DIFFERENT,
    gate_forms,
    gate_pair,
    tape_around,
)

from pennylane_custatevec.compile_tapes import compile_steps  # noqa: E402
from pennylane_custatevec.structures import Structure  # noqa: E402


def assert_same_compilation(got, expected):
    """Equal registers, and equal steps: instructions equal field by field, data exactly."""
    assert tuple(got.register.wires) == tuple(expected.register.wires)
    assert got.register.batch_size == expected.register.batch_size
    assert got.register.broadcast == expected.register.broadcast
    if expected.register.initial_state is None:
        assert got.register.initial_state is None
    else:
        np.testing.assert_array_equal(got.register.initial_state, expected.register.initial_state)
    assert len(got.steps) == len(expected.steps)
    for mine, theirs in zip(got.steps, expected.steps, strict=True):
        assert mine.origin == theirs.origin
        assert type(mine.operation) is type(theirs.operation)
        assert len(mine.instructions) == len(theirs.instructions)
        for a, b in zip(mine.instructions, theirs.instructions, strict=True):
            assert a.call == b.call
            if b.data is None:
                assert a.data is None
            else:
                assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape
                np.testing.assert_array_equal(a.data, b.data)


@pytest.mark.parametrize(
    ("name", "form"), [(name, form) for name in sorted(GATES) for form in gate_forms(name)]
)
def test_a_structure_compiles_every_gate_as_compile_steps(name, form):
    first, second = gate_pair(name, form, seed=sum(map(ord, name + form)))
    template, tape = tape_around(first), tape_around(second)
    key = StructureKey.of(template)
    if name in SAME_HYPERPARAMETERS_EXPECTED_DIFFERENT and key != StructureKey.of(tape):
        pytest.skip("the two draws have other hyperparameters: two structures")
    assert key == StructureKey.of(tape)
    structure = Structure(key, template, None)
    values = structure.parameters_of(tape)
    expected = compile_steps(tape, None)
    assert_same_compilation(structure.compile(values, tape), expected)  # the device's path
    if structure.replayable:  # the compiled path's: from the values alone
        assert_same_compilation(structure.compile(values), expected)
    else:
        with pytest.raises(ValueError, match="cannot be rebuilt"):
            structure.compile(values)
    # and the template's own values give the template's compilation
    own = structure.parameters_of(template)
    assert_same_compilation(structure.compile(own, template), compile_steps(template, None))
    if name not in NON_UNITARY and first.data:
        assert not np.array_equal(np.asarray(values[-1]), np.asarray(own[-1]))


def _native_and_broadcast_tapes(values):
    """Tapes whose steps read elements of array parameters: native templates, a
    broadcast, a run of rotations; ``values`` (a seed's draws) fill them."""
    rng = np.random.default_rng(values)
    return [
        qml.tape.QuantumScript(
            [
                qml.AngleEmbedding(rng.uniform(0, 3, (4, 3)), wires=[0, 1, 2]),
                qml.StronglyEntanglingLayers(rng.uniform(0, 3, (2, 3, 3)), wires=[0, 1, 2]),
            ],
            [qml.expval(qml.Z(0))],
        ),
        qml.tape.QuantumScript(
            [
                qml.BasicEntanglerLayers(rng.uniform(0, 3, (2, 3)), wires=[0, 1, 2]),
                qml.RX(rng.uniform(0, 3, 4), wires=1),
                qml.CRY(rng.uniform(0, 3, 4), wires=[1, 0]),
            ],
            [qml.probs(wires=[0, 2])],
        ),
        qml.tape.QuantumScript(
            [qml.StatePrep(np.exp(1j * rng.uniform(0, 3, 8)) / np.sqrt(8), wires=[0, 1, 2])]
            + [qml.RX(rng.uniform(0, 3), wires=w) for w in range(3)]
            + [qml.IsingZZ(rng.uniform(0, 3), wires=[0, 2])],
            [qml.expval(qml.X(1))],
        ),
    ]


def test_a_structure_compiles_templates_broadcasts_and_runs_of_rotations():
    device = qml.device("custatevec.qubit", wires=3, backend="cpu")
    config = _adjoint_config(device)
    preprocess = device.preprocess_transforms(config)
    for template, tape in zip(
        _native_and_broadcast_tapes(1), _native_and_broadcast_tapes(2), strict=True
    ):
        (template,), _ = preprocess((template,))
        (tape,), _ = preprocess((tape,))
        key = StructureKey.of(template)
        assert key == StructureKey.of(tape)
        structure = Structure(key, template, device.wires)
        got = structure.compile(structure.parameters_of(tape))
        assert_same_compilation(got, compile_steps(tape, device.wires))
        # every parametrized step reads its data by an angle rule: nothing is rebuilt
        assert not structure._rebuilt  # noqa: SLF001


def test_the_cache_makes_a_structure_on_the_second_tape_of_a_key_and_keeps_the_hot_ones(
    monkeypatch,
):
    from pennylane_custatevec.structures import StructureCache

    monkeypatch.setattr(StructureCache, "MAX_STRUCTURES", 3)
    cache = StructureCache(None)

    def tape(wire, angle=0.1):
        return qml.tape.QuantumScript(
            [qml.RX(angle, wires=wire)], [qml.expval(qml.Z(wire))], trainable_params=[0]
        )

    key, structure = cache.lookup(tape(0))
    assert structure is None and key == StructureKey.of(tape(0))  # seen once: none yet
    _, structure = cache.lookup(tape(0, 0.7))
    assert isinstance(structure, Structure)
    assert cache.lookup(tape(0, 1.3))[1] is structure
    for wire in (1, 2):  # two more keys, each seen once; the first stays the most recent
        cache.lookup(tape(wire))
        assert cache.lookup(tape(0))[1] is structure
    cache.lookup(tape(3))  # a fourth key: the least recently used one (wire 1) goes
    assert cache.lookup(tape(0))[1] is structure
    assert cache.lookup(tape(1))[1] is None  # forgotten: seen once again
    sampled = qml.tape.QuantumScript([qml.RX(0.1, 0)], [qml.expval(qml.Z(0))], shots=10)
    cache.lookup(sampled)
    assert cache.lookup(sampled)[1] is None  # no structure with shots


def test_the_device_compiles_by_structure_from_the_second_call(mocker):
    device = qml.device("custatevec.qubit", wires=2, backend="cpu")
    compile_spy = mocker.spy(Structure, "compile")

    @qml.qnode(device, diff_method="adjoint")
    def circuit(x):
        qml.RX(x, wires=0)
        qml.CNOT([0, 1])
        return qml.probs(wires=1)  # Pauli expvals would run directly, uncompiled (direct.py)

    reference = qml.QNode(circuit.func, qml.device("default.qubit", wires=2))
    for calls, x in enumerate([0.3, -1.1, 2.5]):
        np.testing.assert_allclose(circuit(x), reference(x), atol=1e-12)
        assert compile_spy.call_count == calls  # none on the first call, then one each
