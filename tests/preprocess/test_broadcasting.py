"""Parameter broadcasting (batch size 3) on custatevec.qubit against default.qubit."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from conftest import (
    DEVICE,
    MIXED_WIRES,
    TOL,
    assert_allclose_nested,
    assert_same_structure,
    generic_layer,
    make_devices,
)
from reference import random_hermitian, random_state
from scipy.stats import unitary_group

from pennylane_custatevec.rotations import PauliRotations

W = MIXED_WIRES
BATCH = 3
_RNG = np.random.default_rng(777)
ANGLES = _RNG.uniform(0, 2 * np.pi, size=(len(W), 2))
X = _RNG.uniform(-np.pi, np.pi, size=BATCH)
UNITARIES = np.stack([unitary_group.rvs(4, random_state=s) for s in range(BATCH)])
STATES = random_state(2, _RNG, batch=BATCH)
H2 = random_hermitian(4, _RNG)


def _rx(x):
    qml.RX(x, wires="q1")


def _cry(x):
    qml.CRY(x, wires=["z", "a"])


def _phase(x):
    qml.PhaseShift(x, wires=0)


def _ising(x):
    qml.IsingZZ(x, wires=[3, "z"])


def _paulirot(x):
    qml.PauliRot(x, "XIY", wires=["a", "q1", 3])


def _paulirot_identity(x):
    qml.PauliRot(x, "II", wires=["a", 0])


def _multirz(x):
    qml.MultiRZ(x, wires=[0, "a", "z"])


def _rot(x):
    qml.Rot(x, 0.3, -x, wires="a")


def _ctrl_rx(x):
    qml.ctrl(qml.RX(x, wires=3), control=["a", "z"], control_values=[0, 1])


def _adjoint_crz(x):
    qml.adjoint(qml.CRZ(x, wires=[0, "q1"]))


def _global_phase(x):
    qml.ctrl(qml.GlobalPhase(x), control="a", control_values=0)


def _unitary(x):
    qml.QubitUnitary(UNITARIES, wires=["z", 3])


def _ctrl_unitary(x):
    qml.ctrl(qml.QubitUnitary(UNITARIES, wires=["z", 3]), control="q1", control_values=0)


def _diag(x):
    qml.DiagonalQubitUnitary(np.exp(1j * np.stack([x, -x, 2 * x, 0 * x], axis=1)), wires=[3, 0])


def _two_broadcast(x):
    qml.RX(x, wires="a")
    qml.IsingXY(x[::-1], wires=["a", 0])


GATES = {
    f.__name__.lstrip("_"): f
    for f in (
        _rx,
        _cry,
        _phase,
        _ising,
        _paulirot,
        _paulirot_identity,
        _multirz,
        _rot,
        _ctrl_rx,
        _adjoint_crz,
        _global_phase,
        _unitary,
        _ctrl_unitary,
        _diag,
        _two_broadcast,
    )
}


def _measure_all():
    return (
        qml.expval(qml.X("a") @ qml.Z(3)),
        qml.expval(qml.Hermitian(H2, wires=["z", 0])),
        qml.var(qml.Y("q1")),
        qml.var(qml.X(0) + 0.5 * qml.Z("a")),
        qml.probs(wires=["z", "a"]),
        qml.probs(),
        qml.state(),
        qml.density_matrix(wires=[3]),
    )


def _run(gate, measure, shots=None, seed=None, dtype=np.complex128, prep=None):
    kwargs = {"c_dtype": dtype}
    if seed is not None:
        kwargs["seed"] = seed
    dev, ref = make_devices(W, **kwargs)

    def circuit(x):
        if prep is not None:
            prep()
        generic_layer(W, ANGLES)
        gate(x)
        return measure()

    out = []
    for d in (dev, ref):
        node = qml.QNode(circuit, d)
        if shots is not None:
            node = qml.set_shots(node, shots=shots)
        out.append(node(X))
    return out


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64], ids=["c128", "c64"])
@pytest.mark.parametrize("name", list(GATES))
def test_broadcast_gate_analytic(name, dtype):
    result, expected = _run(GATES[name], _measure_all, dtype=dtype)
    assert result[0].shape == (BATCH,)
    assert result[6].shape == (BATCH, 32)
    assert_allclose_nested(result, expected, atol=TOL[dtype] * 10)
    # The batch entries differ: the broadcast really took effect.
    assert not np.allclose(result[6][0], result[6][1])


@pytest.mark.parametrize("name", ["rx", "unitary", "paulirot"])
def test_broadcast_single_measurement(name):
    result, expected = _run(GATES[name], lambda: qml.expval(qml.Z("q1") @ qml.Y("z")))
    assert result.shape == (BATCH,)
    assert_allclose_nested(result, expected, atol=1e-10)


def test_broadcast_state_prep_first():
    def prep():
        qml.StatePrep(STATES, wires=["q1", "z"])

    result, expected = _run(GATES["rx"], _measure_all, prep=prep)
    assert_allclose_nested(result, expected, atol=1e-10)
    assert not np.allclose(result[6][0], result[6][1])


def test_broadcast_state_prep_only():
    dev, ref = make_devices(W)

    def circuit():
        qml.StatePrep(STATES, wires=[0, "a"])
        qml.CNOT(["a", "z"])
        return qml.state(), qml.expval(qml.X(0))

    result = qml.QNode(circuit, dev)()
    assert result[0].shape == (BATCH, 32)
    assert_allclose_nested(result, qml.QNode(circuit, ref)(), atol=1e-10)


def test_basis_state_first_then_broadcast_gate():
    dev, ref = make_devices(W)

    def circuit(x):
        qml.BasisState(np.array([1, 0]), wires=["z", 3])
        qml.RY(x, wires="z")
        return qml.probs(wires=["z", 3, "a"])

    result = qml.QNode(circuit, dev)(X)
    assert result.shape == (BATCH, 8)
    assert_allclose_nested(result, qml.QNode(circuit, ref)(X), atol=1e-10)


STAT_TOL = 0.05
SHOTS = 10000


def test_broadcast_sample_shapes_and_statistics():
    def measure():
        return qml.sample(wires=["q1", "a"]), qml.expval(qml.X("a")), qml.probs(wires=[3])

    result, expected = _run(GATES["rx"], measure, shots=SHOTS, seed=5)
    analytic, _ = _run(
        GATES["rx"],
        lambda: (qml.probs(wires=["q1", "a"]), qml.expval(qml.X("a")), qml.probs(wires=[3])),
    )
    assert_same_structure(result, expected)
    assert result[0].shape == (BATCH, SHOTS, 2)
    assert result[0].dtype == expected[0].dtype
    # per-batch marginal of wire q1 (the broadcast RX acts there)
    p_q1 = analytic[0][:, 2] + analytic[0][:, 3]
    np.testing.assert_allclose(result[0][:, :, 0].mean(axis=1), p_q1, atol=STAT_TOL)
    np.testing.assert_allclose(result[1], analytic[1], atol=STAT_TOL)
    np.testing.assert_allclose(result[2], analytic[2], atol=STAT_TOL)


def test_broadcast_expval_shots():
    obs = lambda: qml.expval(qml.Y("q1") @ qml.Z("z"))  # noqa: E731
    result, expected = _run(GATES["paulirot"], obs, shots=SHOTS, seed=6)
    analytic, _ = _run(GATES["paulirot"], obs)
    assert_same_structure(result, expected)
    assert result.shape == (BATCH,)
    np.testing.assert_allclose(result, analytic, atol=STAT_TOL)


def test_broadcast_counts_shots():
    result, expected = _run(GATES["cry"], lambda: qml.counts(wires=["a"]), shots=SHOTS, seed=7)
    analytic, _ = _run(GATES["cry"], lambda: qml.probs(wires=["a"]))
    assert len(result) == len(expected) == BATCH
    for counts, ref_counts, probs in zip(result, expected, analytic, strict=True):
        assert set(counts) == set(ref_counts) == {"0", "1"}
        assert sum(counts.values()) == SHOTS
        assert abs(counts["1"] / SHOTS - probs[1]) < STAT_TOL


def test_broadcast_counts_container_type():
    """Broadcast counts are a list of dicts, one per batch entry, as default.qubit's."""
    result, expected = _run(GATES["cry"], lambda: qml.counts(wires=["a"]), shots=100, seed=7)
    assert type(expected) is list
    assert type(result) is type(expected)


def test_broadcast_shot_vector_nesting():
    def measure():
        return qml.sample(wires=[0]), qml.expval(qml.Z("q1"))

    result, expected = _run(GATES["rx"], measure, shots=[50, (20, 2)], seed=8)
    assert_same_structure(result, expected)
    assert result[0][0].shape == (BATCH, 50, 1)
    assert result[2][1].shape == (BATCH,)


# --- several tapes of one structure run as one batch -------------------------------------


def _structured_tapes(rng, n_tapes=4, broadcast_every=2):
    """Tapes that share a structure (same gates, wires and measurements; other parameters),
    some of them broadcast, some starting from a prepared state."""
    tapes = []
    for i in range(n_tapes):
        x = rng.uniform(-3, 3, size=BATCH) if i % broadcast_every == 1 else rng.uniform(-3, 3)
        u = unitary_group.rvs(4, random_state=int(rng.integers(1000)))
        ops = [
            qml.StatePrep(random_state(2, rng), wires=["q1", 0]),
            qml.RX(x, wires="a"),
            qml.CRY(rng.uniform(-3, 3), wires=["a", "z"]),
            qml.QubitUnitary(u, wires=[3, "q1"]),
            qml.PauliRot(rng.uniform(-3, 3), "XY", wires=[0, "z"]),
            qml.PhaseShift(rng.uniform(-3, 3), wires="a"),
            qml.IsingZZ(x, wires=["q1", "a"]),
        ]
        tapes.append(
            qml.tape.QuantumScript(
                ops,
                [qml.expval(qml.X("a") @ qml.Z(0)), qml.probs(wires=["z", 3]), qml.state()],
            )
        )
    return tapes


def test_same_structure_tapes_in_one_execute():
    rng = np.random.default_rng(31)
    tapes = _structured_tapes(rng)
    dev, ref = make_devices(W)
    result = qml.execute(tapes, dev)
    expected = qml.execute(tapes, ref)
    assert_allclose_nested(result, expected, atol=1e-10)
    assert result[1][0].shape == (BATCH,) and np.shape(result[0][0]) == ()


def test_mixed_structures_in_one_execute_keep_their_order():
    rng = np.random.default_rng(32)
    same = _structured_tapes(rng, n_tapes=3)
    other = [
        qml.tape.QuantumScript([qml.Hadamard("a"), qml.CNOT(["a", 3])], [qml.expval(qml.Z(3))]),
        qml.tape.QuantumScript([qml.RY(0.3, "z")], [qml.var(qml.X("z")), qml.probs(wires=["z"])]),
    ]
    tapes = [same[0], other[0], same[1], other[1], same[2]]
    dev, ref = make_devices(W)
    assert_allclose_nested(qml.execute(tapes, dev), qml.execute(tapes, ref), atol=1e-10)


def test_parameter_shift_gradient_matches():
    """Parameter-shift runs many tapes of one structure: the gradient must match."""
    dev, ref = make_devices(W)
    weights = qml.numpy.array(np.random.default_rng(33).uniform(-2, 2, size=6), requires_grad=True)

    def circuit(w):
        generic_layer(W, ANGLES)
        qml.RX(w[0], wires="a")
        qml.CRY(w[1], wires=["a", "z"])
        qml.PauliRot(w[2], "XZ", wires=[0, "q1"])
        qml.IsingXX(w[3], wires=[3, "z"])
        qml.Rot(w[4], w[5], -w[4], wires="q1")
        return qml.expval(qml.X("a") @ qml.Y("z") + 0.5 * qml.Z("q1"))

    grads = [
        qml.grad(qml.QNode(circuit, d, diff_method="parameter-shift"))(weights) for d in (dev, ref)
    ]
    np.testing.assert_allclose(grads[0], grads[1], atol=1e-10)
    assert np.abs(grads[0]).max() > 1e-3


# ---------------------------------------------------------------------------------------
# Preprocessed tapes rebound to broadcast parameters (jax.vmap with device_vjp=True)


def _rebound_tape(mode: str, single: int = 2):
    """A tape through the device's adjoint preprocessing (its rotations gathered into
    ``PauliRotations`` runs), then rebound to broadcast values of all parameters but
    parameter ``single`` (2: the CRY's; 1: the second RY's, inside a run of the first
    RY's broadcast angles), as PennyLane's jax interface does under ``jax.vmap``; and the
    same circuit built directly with those values, for default.qubit."""
    dev = qml.device(DEVICE, wires=3, backend="cpu", grad_accumulation=mode)
    config = dev.setup_execution_config(qml.devices.ExecutionConfig(gradient_method="adjoint"))
    measurements = [qml.expval(qml.Z(0) @ qml.Z(1)), qml.probs(wires=[2])]

    def operations(a):
        return [
            qml.RY(a[0], 0),
            qml.RY(a[1], 1),
            qml.CNOT([0, 1]),
            qml.CRY(a[2], [1, 2]),
            qml.RX(a[3], 2),
            qml.IsingZZ(a[4], [1, 2]),
        ]

    tape = qml.tape.QuantumScript(operations([0.1, 0.2, 0.3, 0.4, 0.5]), measurements)
    (prepared,), _ = dev.preprocess_transforms(config)((tape,))
    assert any(isinstance(op, PauliRotations) for op in prepared.operations)
    rng = np.random.default_rng(31)
    values = [rng.uniform(0, np.pi, BATCH) for _ in range(5)]
    values[single] = np.float64(0.7)  # a parameter that is not broadcast
    rebound = prepared.bind_new_parameters(values, list(range(5)))  # runs keep the order
    direct = qml.tape.QuantumScript(operations(values), measurements)
    return dev, config, rebound, direct, values


@pytest.mark.parametrize("single", [2, 1])
@pytest.mark.parametrize("mode", ["deferred", "eager"])
def test_rebound_broadcast_tape_derivatives(mode, single):
    """execute, compute_vjp, compute_derivatives and compute_jvp of the rebound tape equal
    default.qubit's derivatives of the same broadcast circuit (jax backprop): a broadcast
    parameter's gradient per entry, the others' summed over entries. Before, the rebound
    run claimed not to be broadcast (one entry's results), and after that was fixed the
    deferred VJP summed a run's entries into the first: wrong numbers without an error.
    A run holding broadcast and single angles (``single`` 1) crashed in compiling it
    (``jax.vmap`` over a QNode with a constant rotation)."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    dev, config, rebound, direct, values = _rebound_tape(mode, single)
    assert rebound.batch_size == BATCH
    reference = qml.device("default.qubit", wires=3)
    assert_allclose_nested(dev.execute(rebound, config), reference.execute(direct), atol=1e-12)

    def results(*params):
        return reference.execute(direct.bind_new_parameters(list(params), list(range(5))))

    params = [jnp.asarray(v) for v in values]
    dy = (np.linspace(0.5, 1.5, BATCH), np.arange(2.0 * BATCH).reshape(BATCH, 2))
    vjp = dev.compute_vjp([rebound], [dy], config)[0]
    _, pullback = jax.vjp(results, *params)
    expected_vjp = pullback(tuple(jnp.asarray(d) for d in dy))
    assert_allclose_nested(vjp, expected_vjp, atol=1e-12)
    assert [np.shape(g) for g in vjp] == [() if k == single else (BATCH,) for k in range(5)]

    jacobian = dev.compute_derivatives([rebound], config)[0]
    tangents = tuple(np.full(np.shape(v), 0.3 + k) for k, v in enumerate(values))
    jvp = dev.compute_jvp([rebound], [tangents], config)[0]
    _, expected_jvp = jax.jvp(results, tuple(params), tuple(jnp.asarray(t) for t in tangents))
    assert_allclose_nested(jvp, expected_jvp, atol=1e-12)
    # the Jacobian (batch axis first in every entry) contracted with the tangents
    contracted = tuple(
        sum(_along_batch(column, t) for column, t in zip(columns, tangents, strict=True))
        for columns in jacobian
    )
    assert_allclose_nested(contracted, expected_jvp, atol=1e-12)


def _along_batch(column, tangent):
    """A Jacobian entry (batch axis first) times a tangent: a broadcast parameter's, one
    value per entry; another's, one value."""
    column = np.asarray(column)
    tangent = np.asarray(tangent)
    return column * tangent.reshape(tangent.shape + (1,) * (column.ndim - tangent.ndim))


@pytest.mark.parametrize("mode", ["deferred", "eager"])
@pytest.mark.parametrize("jit", [False, True])
def test_jax_vmap_of_grad_with_device_vjp(mode, jit):
    """jax.vmap(jax.grad(qnode)) with the device VJP: equal to default.qubit's backprop
    (without jit default.qubit and lightning.qubit raise in their callback here; this
    device gave wrong gradients)."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    batch = jax.numpy.asarray(np.random.default_rng(3).uniform(0, np.pi, (4, 3)))

    def circuit(p):
        qml.RY(p[0], 0)
        qml.RY(p[1], 1)
        qml.CNOT([0, 1])
        qml.RX(p[2], 1)
        return qml.expval(qml.Z(0) @ qml.Z(1))

    dev = qml.device(DEVICE, wires=2, backend="cpu", grad_accumulation=mode)
    ours = jax.vmap(jax.grad(qml.QNode(circuit, dev, diff_method="adjoint", device_vjp=True)))
    ours = jax.jit(ours) if jit else ours
    reference = jax.vmap(jax.grad(qml.QNode(circuit, qml.device("default.qubit", wires=2))))
    np.testing.assert_allclose(ours(batch), reference(batch), atol=1e-12)


def _vmapped_circuit(x):
    qml.RX(x, 0)
    qml.RY(2.0, 1)  # a constant rotation: gathered with RX into one run
    qml.CNOT([0, 1])
    qml.CRZ(0.4 * x, [1, 0])
    return qml.expval(qml.Z(1)), qml.probs(wires=[0])


_VMAP_CALLS = {
    "vmap": lambda node, x: jax_module().vmap(node)(x),
    "vmap of grad": lambda node, x: jax_module().vmap(jax_module().grad(lambda v: node(v)[0]))(x),
    "jacobian of vmap": lambda node, x: jax_module().jacobian(
        lambda v: jax_module().vmap(node)(v)[1]
    )(x),
    "jit of vmap": lambda node, x: jax_module().jit(jax_module().vmap(node))(x),
}


def jax_module():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    return jax


@pytest.mark.parametrize("call", sorted(_VMAP_CALLS))
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"device_vjp": True}, {"diff_method": "parameter-shift"}],
    ids=["adjoint", "adjoint-device-vjp", "parameter-shift"],
)
def test_jax_vmap_over_a_qnode(call, kwargs):
    """jax.vmap over a QNode, without jax.jit too: PennyLane's jax boundary without jit
    reads the values as numpy, which a vmap's batch cannot be (ValueError, on
    lightning.qubit too): the device takes PennyLane's jit boundary, whose callback gets
    the batch whole as a broadcast (``_vmapped``). With device VJPs the constant RY, in a
    run with the vmapped RX, crashed the run's compilation. Values and derivatives equal
    default.qubit's."""
    jax = jax_module()
    x = jax.numpy.array([1.0, 2.0, 3.0])
    ours = qml.QNode(_vmapped_circuit, qml.device(DEVICE, wires=2, backend="cpu"), **kwargs)
    reference = qml.QNode(_vmapped_circuit, qml.device("default.qubit", wires=2))
    got, want = _VMAP_CALLS[call](ours, x), _VMAP_CALLS[call](reference, x)
    leaves = jax.tree_util.tree_leaves
    for a, b in zip(leaves(got), leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-12)
