"""Jacobian-vector products (forward mode) on custatevec.qubit, and jax with the adjoint method.

The device's JVP (``compute_jvp``, ``execute_and_compute_jvp``) is compared with jax's
forward mode through default.qubit's ``diff_method="backprop"``, and with the contraction
of the device's own Jacobian. PennyLane 0.45 reaches the device JVP through
``DeviceJacobianProducts.execute_and_compute_jvp`` (the jax boundary ``jax_jvp_execute``
with device Jacobian products); its QNodes with the jax interface use the device Jacobian
(``device_vjp=False``) or the device VJP (``device_vjp=True``) instead: those are tested
here too, in forward and reverse mode and under ``jax.jit``.
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from conftest import assert_allclose_nested, generic_layer, make_devices, stable_seed
from pennylane import numpy as pnp
from pennylane.devices import ExecutionConfig
from pennylane.exceptions import DeviceError
from pennylane.tape import QuantumScript
from pennylane.workflow.jacobian_products import DeviceJacobianProducts

import pennylane_custatevec
import pennylane_custatevec.device
import pennylane_custatevec.runs

jax = pytest.importorskip("jax")
jnp = jax.numpy
from pennylane.workflow.interfaces.jax import jax_jvp_execute  # noqa: E402  (needs jax)

ATOL = 1e-10
WIRES = ["a", 3, "q1"]
MODES = pytest.mark.parametrize("mode", ["deferred", "eager"])


pytestmark = pytest.mark.usefixtures("jax_float64")


@pytest.fixture
def backend(each_backend):
    return each_backend


def _rng(*parts) -> np.random.Generator:
    return np.random.default_rng(stable_seed("jvp", *parts))


def _device(backend: str, mode: str, wires=WIRES):
    dev, ref = make_devices(wires, backend=backend, grad_accumulation=mode)
    assert dev.backend_name == backend
    return dev, ref


def _gates(x, y):
    generic_layer(WIRES, [(x[0], x[1]), (y, x[2]), (0.3, x[3])])
    qml.IsingXX(x[4], wires=[WIRES[2], WIRES[0]])
    qml.CRX(y, wires=[WIRES[1], WIRES[2]])


HAMILTONIAN = qml.Hamiltonian([0.7, -1.3], [qml.X(WIRES[0]) @ qml.Z(WIRES[2]), qml.Y(WIRES[1])])

MEASUREMENTS = {
    "expval": lambda: qml.expval(qml.Z(WIRES[1])),
    "probs": lambda: qml.probs(wires=[WIRES[2], WIRES[0]]),
    "state": lambda: qml.state(),
    "several": lambda: (
        qml.expval(HAMILTONIAN),
        qml.probs(wires=[WIRES[1]]),
        qml.state(),
        qml.expval(qml.Hermitian(np.diag([1.0, -2.0]), wires=WIRES[0])),
    ),
}


def _circuit(measured: str):
    def circuit(x, y):
        _gates(x, y)
        return MEASUREMENTS[measured]()

    return circuit


def _device_jvp_execute(dev, qfunc, *args):
    """``qfunc``'s results through PennyLane's jax boundary with the device's own JVP
    (``jax_jvp_execute`` with ``DeviceJacobianProducts``), as the workflow would run it;
    also returns the tapes the device received."""
    config = dev.setup_execution_config(
        ExecutionConfig(
            gradient_method="adjoint",
            use_device_gradient=True,
            use_device_jacobian_product=True,
            grad_on_execution=False,
            interface="jax",
        )
    )
    received = []

    def execute_fn(tapes):
        numpy_tapes, _ = qml.transforms.convert_to_numpy_parameters(tapes)
        return dev.execute(numpy_tapes, config)

    tape = qml.tape.make_qscript(qfunc)(*args)
    tapes, postprocess = dev.preprocess_transforms(config)((tape,))
    for t in tapes:
        t.trainable_params = qml.math.get_trainable_indices(t.get_parameters(trainable_only=False))
        received.append(t)
    results = jax_jvp_execute(tapes, execute_fn, DeviceJacobianProducts(dev, config))
    return postprocess(results), received


def _backprop(ref, qfunc):
    return qml.QNode(qfunc, ref, interface="jax", diff_method="backprop")


# ---------------------------------------------------------------------------------------
# 1. The device JVP under jax.jvp, against default.qubit's backprop


@MODES
@pytest.mark.parametrize("measured", list(MEASUREMENTS))
def test_device_jvp_matches_backprop(measured, mode, backend):
    rng = _rng(measured)
    x, y = jnp.array(rng.uniform(-np.pi, np.pi, 5)), jnp.array(0.8)
    dx, dy = jnp.array(rng.normal(size=5)), jnp.array(-1.7)
    dev, ref = _device(backend, mode)
    qfunc = _circuit(measured)
    received = []

    def on_device(a, b):
        results, tapes = _device_jvp_execute(dev, qfunc, a, b)
        received.extend(tapes)
        return results[0]

    with qml.Tracker(dev) as tracker:
        value, tangent = jax.jvp(on_device, (x, y), (dx, dy))
    expected_value, expected_tangent = jax.jvp(_backprop(ref, qfunc), (x, y), (dx, dy))
    assert_allclose_nested(value, expected_value, atol=ATOL)
    assert_allclose_nested(tangent, expected_tangent, atol=ATOL)
    assert max(np.abs(leaf).max() for leaf in jax.tree_util.tree_leaves(tangent)) > 0.1
    # one execution with its JVP: no Jacobian requested, no parameter-shift tapes
    assert len(received) == 1
    assert tracker.totals == {"execute_and_jvp_batches": 1, "executions": 1, "jvps": 1}


@MODES
def test_device_jvp_of_a_template_weight_and_broadcast_features(mode, backend):
    """StronglyEntanglingLayers stays whole: its weight's tangent is one array, contracted
    with the weight's array of derivatives; the features are a broadcast minibatch."""
    rng = _rng("template")
    weights = jnp.array(rng.uniform(-np.pi, np.pi, (2, 3, 3)))
    d_weights = jnp.array(rng.normal(size=(2, 3, 3)))
    features = rng.uniform(-np.pi, np.pi, (4, 3))
    dev, ref = _device(backend, mode)

    def qfunc(w):
        qml.AngleEmbedding(features, wires=WIRES)
        qml.StronglyEntanglingLayers(w, wires=WIRES)
        return qml.expval(qml.Z(WIRES[0])), qml.probs(wires=[WIRES[2]])

    received = []

    def on_device(w):
        results, tapes = _device_jvp_execute(dev, qfunc, w)
        received.extend(tapes)
        return results[0]

    with qml.Tracker(dev) as tracker:
        value, tangent = jax.jvp(on_device, (weights,), (d_weights,))
    expected_value, expected_tangent = jax.jvp(_backprop(ref, qfunc), (weights,), (d_weights,))
    assert_allclose_nested(value, expected_value, atol=ATOL)
    assert_allclose_nested(tangent, expected_tangent, atol=ATOL)
    assert np.shape(tangent[0]) == (4,) and np.shape(tangent[1]) == (4, 2)
    template = [
        op for t in received for op in t.operations if op.name == "StronglyEntanglingLayers"
    ]
    assert len(template) == len(received) and all(op.data[0].shape == (2, 3, 3) for op in template)
    # the deferred mode differentiates the broadcast tape whole; eager expands it
    tapes = 1 if mode == "deferred" else 4
    assert len(received) == tapes
    assert tracker.totals["jvps"] == tapes and "derivatives" not in tracker.totals


# ---------------------------------------------------------------------------------------
# 2. compute_jvp and execute_and_compute_jvp on tapes


def _tapes(rng) -> list[QuantumScript]:
    """Three tapes: two of one structure (they sweep as one batch in the deferred mode)
    and one with several measurements."""
    tapes = []
    for measurements in (
        [qml.expval(qml.Z(WIRES[1]))],
        [qml.expval(qml.Z(WIRES[1]))],
        [qml.expval(HAMILTONIAN), qml.probs(wires=[WIRES[2], WIRES[0]]), qml.state()],
    ):
        x, y = rng.uniform(-np.pi, np.pi, 5), rng.uniform(-np.pi, np.pi)
        with qml.queuing.AnnotatedQueue() as queue:
            _gates(x, y)
        tape = QuantumScript(queue.queue, measurements)
        tape.trainable_params = list(range(tape.num_params - _observable_params(tape)))
        tapes.append(tape)
    return tapes


def _observable_params(tape: QuantumScript) -> int:
    return sum(len(mp.obs.data) for mp in tape.measurements if mp.obs is not None)


def _contracted(jacobian, tangents, n_measurements: int):
    """sum_j J_mj t_j of a Jacobian as the device API returns it (scalar parameters)."""
    per_measurement = (jacobian,) if n_measurements == 1 else jacobian
    out = tuple(
        sum(np.asarray(j) * t for j, t in zip(jm, tangents, strict=True)) for jm in per_measurement
    )
    return out[0] if n_measurements == 1 else out


@MODES
def test_compute_jvp_is_the_contraction_of_the_jacobian(mode, backend):
    rng = _rng("contraction")
    dev, _ = _device(backend, mode)
    tapes = _tapes(rng)
    tangents = [tuple(rng.normal(size=len(t.trainable_params))) for t in tapes]
    with qml.Tracker(dev) as tracker:
        jvps = dev.compute_jvp(tapes, tangents)
    assert tracker.totals == {"jvp_batches": 1, "jvps": 3}
    jacobians = dev.compute_derivatives(tapes)
    for tape, jvp, jacobian, tangent in zip(tapes, jvps, jacobians, tangents, strict=True):
        expected = _contracted(jacobian, tangent, len(tape.measurements))
        assert_allclose_nested(jvp, expected, atol=ATOL)
    # the state's JVP is complex, as the state is
    assert np.iscomplexobj(jvps[2][2]) and np.abs(np.imag(jvps[2][2])).max() > 0.01


@MODES
def test_compute_jvp_matches_backprop_on_tapes(mode, backend):
    rng = _rng("tapes")
    dev, ref = _device(backend, mode)
    tapes = _tapes(rng)
    tangents = [tuple(rng.normal(size=len(t.trainable_params))) for t in tapes]
    results, jvps = dev.execute_and_compute_jvp(tapes, tangents)
    for tape, result, jvp, tangent in zip(tapes, results, jvps, tangents, strict=True):

        def run(parameters, tape=tape):
            return qml.execute(
                [tape.bind_new_parameters(parameters, tape.trainable_params)],
                ref,
                diff_method="backprop",
            )[0]

        parameters = tuple(jnp.array(p) for p in tape.get_parameters())
        expected_result, expected_jvp = jax.jvp(
            run, (parameters,), (tuple(jnp.array(t) for t in tangent),)
        )
        assert_allclose_nested(result, expected_result, atol=ATOL)
        assert_allclose_nested(jvp, expected_jvp, atol=ATOL)


@MODES
def test_zero_and_none_tangents(mode, backend, monkeypatch):
    """A zero or None tangent leaves its parameter out of the sweep; all zero: zeros shaped
    as the results (complex for a state), and no sweep."""
    rng = _rng("zeros")
    dev, _ = _device(backend, mode)
    tapes = _tapes(rng)
    swept = []
    jacobians = pennylane_custatevec.runs.Runs.jacobians

    def spy(runs, batch, *args):
        swept.append([list(t.trainable_params) for t in batch])
        return jacobians(runs, batch, *args)

    monkeypatch.setattr(pennylane_custatevec.runs.Runs, "jacobians", spy)
    full = [tuple(rng.normal(size=len(t.trainable_params))) for t in tapes]
    n_last = len(full[2])
    partial = [(0.0, None, *full[0][2:]), full[1], (None,) * n_last]
    jvps = dev.compute_jvp(tapes, partial)
    first = list(tapes[0].trainable_params)
    # one batch of Jacobians, without the parameters of zero tangents nor the third tape
    assert swept == [[first[2:], list(tapes[1].trainable_params)]]
    jacobians = dev.compute_derivatives(tapes[:2])
    for jvp, jacobian, tangent in zip(
        jvps[:2], jacobians, [(0.0, 0.0, *full[0][2:]), full[1]], strict=True
    ):
        assert_allclose_nested(jvp, _contracted(jacobian, tangent, 1), atol=ATOL)
    zero_expval, zero_probs, zero_state = jvps[2]
    assert zero_expval.shape == () and zero_probs.shape == (4,) and zero_state.shape == (8,)
    assert zero_state.dtype == np.complex128 and not np.any(zero_state)
    _, computed = dev.execute_and_compute_jvp(tapes[2], partial[2])
    assert_allclose_nested(computed, jvps[2], atol=0)


@MODES
def test_jvp_of_a_tape_without_trainable_parameters(mode, backend):
    dev, _ = _device(backend, mode)
    tape = QuantumScript([qml.RX(0.4, WIRES[0])], [qml.expval(qml.Z(WIRES[0])), qml.state()])
    tape.trainable_params = []
    results, (d_expval, d_state) = dev.execute_and_compute_jvp(tape, ())
    assert np.isclose(results[0], np.cos(0.4))
    assert d_expval.shape == () and not np.any(d_expval)
    assert d_state.shape == np.shape(results[1]) == (2,) and not np.any(d_state)


def test_bad_tangents_are_refused():
    dev, _ = _device("cpu", "deferred")
    tape = QuantumScript(
        [qml.RX(0.4, WIRES[0]), qml.RY(0.2, WIRES[1])], [qml.expval(qml.Z(WIRES[0]))]
    )
    with pytest.raises(DeviceError, match="1 tangent.*2 trainable parameter"):
        dev.compute_jvp([tape], [(1.0,)])
    with pytest.raises(DeviceError, match=r"shape \(2,\) for the parameter 1.*shape is \(\)"):
        dev.compute_jvp([tape], [(1.0, np.ones(2))])
    with pytest.raises(DeviceError, match="tangents for 2 tape"):
        dev.compute_jvp([tape], [(1.0, 1.0), (1.0, 1.0)])
    with pytest.raises(DeviceError, match="one tangent per trainable parameter"):
        dev.compute_jvp([tape], [1.0])
    shots = QuantumScript(tape.operations, tape.measurements, shots=100)
    with pytest.raises(DeviceError, match="analytic execution"):
        dev.compute_jvp([shots], [(1.0, 1.0)])
    with pytest.raises(DeviceError, match="analytic execution"):  # refused whatever the tangents
        dev.compute_jvp([shots], [(0.0, 0.0)])


def test_tracker_counts_as_default_qubit():
    """Counts of compute_jvp and execute_and_compute_jvp equal default.qubit's (whose
    adjoint JVP takes expectation values only); the JVP's Jacobian is not counted."""
    rng = _rng("tracker")
    dev, ref = _device("cpu", "deferred")
    tapes = _tapes(rng)[:2]
    tangents = [tuple(rng.normal(size=len(t.trainable_params))) for t in tapes]
    config = ExecutionConfig(gradient_method="adjoint")
    totals = []
    values = []
    for device in (dev, ref):
        with qml.Tracker(device) as tracker:
            values.append(device.execute_and_compute_jvp(tapes, tangents, config))
            values.append(device.compute_jvp(tapes, tangents, config))
        totals.append({k: v for k, v in tracker.totals.items() if k not in ("resources", "errors")})
    assert totals[0] == totals[1]
    assert totals[0] == {"execute_and_jvp_batches": 1, "executions": 2, "jvps": 4, "jvp_batches": 1}
    assert_allclose_nested(values[0], values[2], atol=ATOL)
    assert_allclose_nested(values[1], values[3], atol=ATOL)


def test_supports_jvp_answers_like_supports_derivatives():
    dev, _ = _device("cpu", "deferred")
    analytic = QuantumScript([qml.RX(0.3, WIRES[0])], [qml.expval(qml.Z(WIRES[0]))])
    sampled = QuantumScript(analytic.operations, analytic.measurements, shots=10)
    configs = [None] + [
        ExecutionConfig(gradient_method=method)
        for method in ("adjoint", "best", "device", "parameter-shift", "backprop", None)
    ]
    answers = []
    for config in configs:
        for circuit in (None, analytic, sampled):
            expected = dev.supports_derivatives(config, circuit)
            assert dev.supports_jvp(config, circuit) is expected
            answers.append(expected)
    assert True in answers and False in answers
    assert not dev.supports_jvp(ExecutionConfig(gradient_method="best"), sampled)
    assert dev.supports_jvp(ExecutionConfig(gradient_method="adjoint"), analytic)


# ---------------------------------------------------------------------------------------
# 3. jax QNodes with diff_method="adjoint" (PennyLane's workflow: device Jacobian or VJP)


def _qnode_gates(x, w):
    qml.AngleEmbedding(x, wires=WIRES)
    qml.StronglyEntanglingLayers(w, wires=WIRES)
    qml.RX(x[1] * w[0, 1, 2], wires=WIRES[2])


def _qnode_circuit(x, w):
    _qnode_gates(x, w)
    return qml.expval(qml.Z(WIRES[0]) @ qml.X(WIRES[2])), qml.probs(wires=[WIRES[1]])


def _scalar_circuit(x, w):
    _qnode_gates(x, w)
    return qml.expval(qml.Z(WIRES[0]) @ qml.X(WIRES[2]))


def _qnode_args(rng):
    return (
        jnp.array(rng.uniform(-np.pi, np.pi, 3)),
        jnp.array(rng.uniform(-np.pi, np.pi, (2, 3, 3))),
    )


@MODES
@pytest.mark.parametrize("grad_on_execution", [True, False])
@pytest.mark.parametrize("device_vjp", [False, True], ids=["jacobian", "vjp"])
def test_jax_qnode_reverse_mode(device_vjp, grad_on_execution, mode, backend):
    rng = _rng("reverse")
    x, w = _qnode_args(rng)
    dev, ref = _device(backend, mode)
    kwargs = {
        "interface": "jax",
        "diff_method": "adjoint",
        "device_vjp": device_vjp,
        "grad_on_execution": grad_on_execution,
    }
    scalar = qml.QNode(_scalar_circuit, dev, **kwargs)
    ref_scalar = _backprop(ref, _scalar_circuit)
    with qml.Tracker(dev) as tracker:
        grad = jax.grad(scalar, argnums=(0, 1))(x, w)
    assert tracker.totals["executions"] == 1  # no parameter-shift tapes
    assert ("vjps" if device_vjp else "derivatives") in tracker.totals
    assert_allclose_nested(grad, jax.grad(ref_scalar, argnums=(0, 1))(x, w), atol=ATOL)
    both = qml.QNode(_qnode_circuit, dev, **kwargs)
    jac = jax.jacobian(both, argnums=(0, 1))(x, w)
    ref_jac = jax.jacobian(_backprop(ref, _qnode_circuit), argnums=(0, 1))(x, w)
    assert_allclose_nested(jac, ref_jac, atol=ATOL)


@MODES
@pytest.mark.parametrize("grad_on_execution", [True, False])
def test_jax_qnode_forward_mode(grad_on_execution, mode, backend):
    """jax.jvp and jax.jacfwd of an adjoint QNode: PennyLane contracts the device
    Jacobian (device_vjp=False), computed with one execution."""
    rng = _rng("forward")
    x, w = _qnode_args(rng)
    dx, dw = jnp.array(rng.normal(size=3)), jnp.array(rng.normal(size=(2, 3, 3)))
    dev, ref = _device(backend, mode)
    node = qml.QNode(
        _qnode_circuit,
        dev,
        interface="jax",
        diff_method="adjoint",
        grad_on_execution=grad_on_execution,
    )
    reference = _backprop(ref, _qnode_circuit)
    with qml.Tracker(dev) as tracker:
        value, tangent = jax.jvp(node, (x, w), (dx, dw))
    assert tracker.totals["executions"] == 1 and "derivatives" in tracker.totals
    expected_value, expected_tangent = jax.jvp(reference, (x, w), (dx, dw))
    assert_allclose_nested(value, expected_value, atol=ATOL)
    assert_allclose_nested(tangent, expected_tangent, atol=ATOL)
    jac = jax.jacfwd(node, argnums=(0, 1))(x, w)
    assert_allclose_nested(jac, jax.jacfwd(reference, argnums=(0, 1))(x, w), atol=ATOL)


@MODES
def test_jax_qnode_forward_mode_of_state_and_broadcast_input(mode, backend):
    rng = _rng("state")
    features = jnp.array(rng.uniform(-np.pi, np.pi, (3, 3)))  # a minibatch of 3
    w = jnp.array(rng.uniform(-np.pi, np.pi, (1, 3, 3)))

    def circuit(w, features):
        qml.AngleEmbedding(features, wires=WIRES)
        qml.StronglyEntanglingLayers(w, wires=WIRES)
        return qml.expval(qml.Y(WIRES[1])), qml.state()

    dev, ref = _device(backend, mode)
    node = qml.QNode(circuit, dev, interface="jax", diff_method="adjoint")
    jac = jax.jacfwd(node, holomorphic=False)(w, features)
    expected = jax.jacfwd(_backprop(ref, circuit))(w, features)
    assert np.shape(jac[1]) == (3, 8, 1, 3, 3)
    assert_allclose_nested(jac, expected, atol=ATOL)


def test_jax_qnode_device_vjp_refuses_forward_mode_as_default_qubit():
    """With device_vjp=True PennyLane's jax boundary is a custom VJP: forward mode is
    refused by jax on every device, default.qubit's adjoint too."""
    rng = _rng("refused")
    x, w = _qnode_args(rng)
    dev, ref = _device("cpu", "deferred")
    messages = []
    for device in (dev, ref):
        node = qml.QNode(_scalar_circuit, device, diff_method="adjoint", device_vjp=True)
        with pytest.raises(TypeError, match="custom_vjp") as info:
            jax.jvp(node, (x, w), (x, w))
        messages.append(str(info.value))
    assert messages[0] == messages[1]


@MODES
@pytest.mark.parametrize("device_vjp", [False, True], ids=["jacobian", "vjp"])
def test_jax_jit(device_vjp, mode, backend):
    """jax.jit of adjoint QNodes: PennyLane runs the device in a pure_callback."""
    rng = _rng("jit")
    x, w = _qnode_args(rng)
    dev, ref = _device(backend, mode)
    node = qml.QNode(_qnode_circuit, dev, diff_method="adjoint", device_vjp=device_vjp)
    scalar = qml.QNode(_scalar_circuit, dev, diff_method="adjoint", device_vjp=device_vjp)
    reference = _backprop(ref, _qnode_circuit)
    assert_allclose_nested(jax.jit(node)(x, w), reference(x, w), atol=ATOL)
    grad = jax.jit(jax.grad(scalar, argnums=(0, 1)))(x, w)
    assert_allclose_nested(
        grad, jax.grad(_backprop(ref, _scalar_circuit), argnums=(0, 1))(x, w), atol=ATOL
    )
    jac = jax.jit(jax.jacfwd(node, argnums=1))(x, w)
    assert_allclose_nested(jac, jax.jacfwd(reference, argnums=1)(x, w), atol=ATOL)


# ---------------------------------------------------------------------------------------
# 4. What jax's transformations hand the device: batches of cotangents, complex tangents


def _vjp_tapes(rng, mode: str) -> list[QuantumScript]:
    """Scalar parameters with expval, probs and state; a template's weight; in the
    deferred mode a broadcast tape (eager expands those in preprocessing)."""
    ops_tape = _tapes(rng)[2]
    weights = rng.uniform(-np.pi, np.pi, (2, 3, 3))
    template = QuantumScript(
        [qml.StronglyEntanglingLayers(weights, wires=WIRES)],
        [qml.expval(qml.Z(WIRES[1])), qml.probs(wires=[WIRES[0]])],
        trainable_params=[0],
    )
    tapes = [ops_tape, template]
    if mode == "deferred":
        features = rng.uniform(-np.pi, np.pi, (4, 3))
        tapes.append(
            QuantumScript(
                [qml.AngleEmbedding(features, wires=WIRES), qml.RY(0.7, WIRES[1])],
                [qml.expval(qml.X(WIRES[1]))],
                trainable_params=[1],
            )
        )
    return tapes


def _result_shapes(dev, tape) -> list[tuple]:
    results = dev.execute([tape])[0]
    return [np.shape(results)] if len(tape.measurements) == 1 else [np.shape(r) for r in results]


@MODES
def test_batched_cotangents_give_a_batch_of_vjps(mode, backend):
    """jax.jacobian of a QNode with device_vjp=True vmaps the VJP: each measurement's
    cotangent gains a leading axis of K; the device returns K VJPs, stacked first, the
    same as K VJPs one by one. A row that is all zero, and a scalar zero for a whole
    measurement, are valid."""
    rng = _rng("batched", mode)
    dev, _ = _device(backend, mode)
    tapes = _vjp_tapes(rng, mode)
    size = 3
    batched, rows = [], [[] for _ in range(size)]
    for tape in tapes:
        shapes = _result_shapes(dev, tape)
        dys = [rng.normal(size=(size, *shape)) for shape in shapes]
        for dy in dys:
            dy[1] = 0.0  # row 1: all zero
        if isinstance(tape.measurements[-1], qml.measurements.StateMP):
            dys[-1] = dys[-1] + 1j * rng.normal(size=dys[-1].shape)
            dys[-1][1] = 0.0
            dys[1] = 0.0  # a scalar zero serves every row
        batched.append(dys[0] if len(dys) == 1 else tuple(dys))
        for k in range(size):
            row = [dy if np.ndim(dy) == 0 else dy[k] for dy in dys]
            rows[k].append(row[0] if len(row) == 1 else tuple(row))
    stacked = dev.compute_vjp(tapes, batched)
    one_by_one = [dev.compute_vjp(tapes, row) for row in rows]
    for t, tape in enumerate(tapes):
        assert len(stacked[t]) == len(tape.trainable_params)
        for p, value in enumerate(tape.get_parameters()):
            expected = np.stack([one_by_one[k][t][p] for k in range(size)])
            assert np.shape(stacked[t][p]) == (size, *np.shape(value))
            np.testing.assert_allclose(stacked[t][p], expected, atol=ATOL, rtol=0)
            assert not np.any(stacked[t][p][1]) and np.abs(stacked[t][p]).max() > 1e-3


def test_batches_of_cotangents_of_different_sizes_are_refused():
    dev, _ = _device("cpu", "deferred")
    tape = QuantumScript(
        [qml.RX(0.4, WIRES[0])], [qml.expval(qml.Z(WIRES[0])), qml.probs(wires=[WIRES[0]])]
    )
    with pytest.raises(DeviceError, match=r"batches of cotangents of sizes \[2, 3\]"):
        dev.compute_vjp([tape], [(np.ones(2), np.ones((3, 2)))])


@pytest.mark.parametrize("device_vjp", [False, True], ids=["jacobian", "vjp"])
def test_jax_jacobian_of_probs_with_both_modes_agree(device_vjp):
    """jax.jacobian (reverse mode, vmapped) in both modes equals backprop."""
    rng = _rng("jacobian", device_vjp)
    x, w = _qnode_args(rng)
    ref = qml.device("default.qubit", wires=WIRES)
    expected = jax.jacobian(_backprop(ref, _qnode_circuit), argnums=(0, 1))(x, w)
    for mode in ("deferred", "eager"):
        dev, _ = _device("cpu", mode)
        node = qml.QNode(_qnode_circuit, dev, diff_method="adjoint", device_vjp=device_vjp)
        with qml.Tracker(dev) as tracker:
            jac = jax.jacobian(node, argnums=(0, 1))(x, w)
        assert_allclose_nested(jac, expected, atol=ATOL)
        # one simulation, and with device VJPs one call for all 3 rows of the Jacobian
        if device_vjp:
            assert tracker.totals["simulations"] == 1 and tracker.totals["vjp_batches"] == 1
        else:
            assert tracker.totals["execute_and_derivative_batches"] == 1
            assert tracker.totals["executions"] == 1


@MODES
def test_jax_state_with_real_results(mode, backend):
    """A tape measuring a state and real results runs as two tapes under jax without
    device VJPs: PennyLane contracts the device Jacobian in the tangents' dtype, complex for
    the state, real for the rest (forward and reverse mode)."""
    rng = _rng("state and real")
    w = jnp.array(rng.uniform(-np.pi, np.pi, 4))

    def circuit(w):
        generic_layer(WIRES[:2], [(w[0], w[1]), (w[2], 0.4)])
        qml.CRY(w[3], wires=[WIRES[1], WIRES[2]])
        return qml.probs(wires=[WIRES[2]]), qml.state(), qml.expval(qml.X(WIRES[0]))

    def loss(node):
        def scalar(w):
            probs, state, expval = node(w)
            return probs[1] + jnp.abs(state[3]) ** 2 + jnp.real(state[5]) * expval

        return scalar

    dev, ref = _device(backend, mode)
    node = qml.QNode(circuit, dev, interface="jax", diff_method="adjoint")
    reference = _backprop(ref, circuit)
    with qml.Tracker(dev) as tracker:
        jac = jax.jacfwd(node)(w)
    assert tracker.totals["executions"] == 2
    assert_allclose_nested(jac, jax.jacfwd(reference)(w), atol=ATOL)
    grad = jax.grad(loss(node))(w)
    assert_allclose_nested(grad, jax.grad(loss(reference))(w), atol=ATOL)
    assert np.count_nonzero(np.abs(grad) > 1e-3) == 3  # the 4th gradient vanishes here


@pytest.mark.parametrize(
    "interface, device_vjp, pieces",
    [("jax", False, 2), ("jax-jit", False, 2), ("jax", True, 1), ("torch", False, 1)],
)
def test_state_with_real_results_splits_only_for_jax_jacobians(interface, device_vjp, pieces):
    dev, ref = _device("cpu", "deferred")
    tape = QuantumScript(
        [qml.RX(pnp.array(0.3, requires_grad=True), WIRES[0])],
        [qml.expval(qml.Z(WIRES[0])), qml.state(), qml.probs(wires=[WIRES[0]])],
    )
    config = dev.setup_execution_config(
        ExecutionConfig(
            gradient_method="adjoint", interface=interface, use_device_jacobian_product=device_vjp
        )
    )
    tapes, postprocess = dev.preprocess_transforms(config)((tape,))
    assert len(tapes) == pieces
    results = postprocess(dev.execute(tapes, config))[0]
    assert_allclose_nested(results, qml.execute([tape], ref)[0], atol=ATOL)
    if pieces == 2:
        assert [type(mp).__name__ for mp in tapes[0].measurements] == ["StateMP"]
        assert np.iscomplexobj(tapes[0].get_parameters()[0])
        assert not np.iscomplexobj(tapes[1].get_parameters()[0])


def _rx_ry_cnot(x, y):
    qml.RX(x, 0)
    qml.RY(y, 1)
    qml.CNOT([0, 1])
    return qml.expval(qml.Z(0)), qml.probs(wires=[1])


@MODES
@pytest.mark.parametrize("device_vjp", [False, True])
def test_jax_complex_parameters_with_zero_imaginary_part(mode, device_vjp):
    """Angles given as complex numbers with a zero imaginary part (as PennyLane's jax QNode
    tests give the adjoint method): jax.jacobian works (jax requires a real result's
    tangent, and a parameter's cotangent, in their own dtypes) and equals default.qubit's,
    complex like it; the values are default.qubit's. Before, jax raised a TypeError."""
    x, y = jnp.array(0.543 + 0j), jnp.array(-0.654 + 0j)
    kwargs = {"diff_method": "adjoint", "device_vjp": device_vjp}
    dev = qml.device("custatevec.qubit", wires=2, backend="cpu", grad_accumulation=mode)
    ours = qml.QNode(_rx_ry_cnot, dev, **kwargs)
    ref = qml.QNode(_rx_ry_cnot, qml.device("default.qubit", wires=2), **kwargs)
    assert_allclose_nested(ours(x, y), ref(x, y), atol=ATOL)
    jacobian = jax.jacobian(ours, argnums=[0, 1])(x, y)
    expected = jax.jacobian(ref, argnums=[0, 1])(x, y)
    leaves = jax.tree_util.tree_leaves
    for got, want in zip(leaves(jacobian), leaves(expected), strict=True):
        assert got.dtype == want.dtype == jnp.complex128
        np.testing.assert_allclose(got, want, atol=ATOL)
    np.testing.assert_allclose(jacobian[0][0], -np.sin(0.543), atol=ATOL)


def test_jax_complex_parameters_under_jit():
    """Under jax.jit the imaginary part of a traced parameter cannot be checked: evaluating
    works (the device checks the values it gets), differentiating is refused by name
    rather than cast (which could hide an imaginary part) or left to jax's dtype error."""
    x, y = jnp.array(0.543 + 0j), jnp.array(-0.654 + 0j)
    dev = qml.device("custatevec.qubit", wires=2, backend="cpu")
    ours = qml.QNode(_rx_ry_cnot, dev, diff_method="adjoint")
    ref = qml.QNode(_rx_ry_cnot, qml.device("default.qubit", wires=2), diff_method="adjoint")
    assert_allclose_nested(jax.jit(ours)(x, y), ref(x, y), atol=ATOL)
    with pytest.raises(DeviceError, match="complex-valued parameter 0 of RX under jax.jit"):
        jax.jit(jax.jacobian(ours))(x, y)
    with pytest.raises(DeviceError, match="RX got a complex angle; angles must be real"):
        jax.jacobian(ours)(jnp.array(0.5 + 0.1j), y)


def _phase_after_a_constant(p):
    qml.RX(0.5, wires=0)  # a constant first: its parameter is not among the trainable ones
    qml.DiagonalQubitUnitary(jnp.exp(1j * jnp.array([0.0, 1.0]) * p[0]), wires=0)
    qml.RZ(p[1], wires=0)
    return qml.expval(qml.X(0))


@MODES
@pytest.mark.parametrize("device_vjp", [False, True])
def test_jax_complex_matrix_parameters_are_never_cast_to_real(mode, device_vjp):
    """A trainable DiagonalQubitUnitary whose phases are real at the point (exp(0i) = 1)
    keeps its complex data: its derivative lies along the imaginary part. The cast to
    real looked up each parameter's operation by its number among all parameters where
    PennyLane's ``get_operation`` counts the trainable ones: behind a constant RX it read
    the RZ, cast the phases to real, and the derivative came out 0 instead of
    sin(0.5) cos(0.3) (a wrong number, no error)."""
    p = jnp.array([0.0, 0.3])
    dev = qml.device("custatevec.qubit", wires=1, backend="cpu", grad_accumulation=mode)
    kwargs = {"diff_method": "adjoint", "device_vjp": device_vjp}
    ours = qml.QNode(_phase_after_a_constant, dev, **kwargs)
    ref = qml.QNode(_phase_after_a_constant, qml.device("default.qubit", wires=1), **kwargs)
    want = jax.grad(ref)(p)
    np.testing.assert_allclose(want[0], np.sin(0.5) * np.cos(0.3), atol=ATOL)
    np.testing.assert_allclose(jax.grad(ours)(p), want, atol=ATOL)


def _unitary_of(t):
    c, s = jnp.cos(t[0]), jnp.sin(t[0])
    phase, global_phase = jnp.exp(1j * t[1]), jnp.exp(1j * t[2])
    return jnp.stack(
        [
            jnp.stack([c * global_phase, -s * jnp.conj(phase) * global_phase]),
            jnp.stack([s * phase * global_phase, c * global_phase]),
        ]
    )


def _trainable_unitary(t):
    qml.RY(0.4, wires=0)
    qml.RX(0.3, wires=1)
    qml.QubitUnitary(_unitary_of(t), wires=0)
    qml.CNOT(wires=[0, 1])
    qml.RZ(0.7 * t[0], wires=1)
    return qml.expval(qml.X(0) @ qml.Z(1) + 0.3 * qml.Y(1))


def test_jax_best_with_a_trainable_qubit_unitary():
    """diff_method="best" (a QNode's default) with jax and a trainable QubitUnitary after
    constant gates: the device's answer whether the adjoint method serves it raised
    IndexError (the same operation lookup by the wrong count); "best" and the adjoint
    method take the matrix by its entries (tests/gradients/test_entrywise.py) and give
    default.qubit's gradient."""
    t = jnp.array([0.3, 1.1, -0.4])
    dev = qml.device("custatevec.qubit", wires=2, backend="cpu")
    ref = qml.QNode(_trainable_unitary, qml.device("default.qubit", wires=2))
    want = jax.grad(ref)(t)
    for method in ("best", "adjoint"):
        qnode = qml.QNode(_trainable_unitary, dev, diff_method=method)
        np.testing.assert_allclose(jax.grad(qnode)(t), want, atol=1e-12)


@MODES
def test_device_jvp_of_a_complex_tangent_is_real(mode):
    """A real result's JVP is real, as its primal: of a complex tangent only the real part
    enters (the device differentiates along the parameter's real axis; default.qubit's
    adjoint JVP accumulates into a real array likewise)."""
    tape = QuantumScript(
        [qml.RX(0.543, 0), qml.RY(-0.654, 1), qml.CNOT([0, 1])],
        [qml.expval(qml.Z(0)), qml.probs(wires=[1])],
    )
    dev = qml.device("custatevec.qubit", wires=2, backend="cpu", grad_accumulation=mode)
    config = dev.setup_execution_config(ExecutionConfig(gradient_method="adjoint"))
    complex_jvp = dev.compute_jvp((tape,), ((0.3 + 2.0j, -1.1 - 0.5j),), config)[0]
    real_jvp = dev.compute_jvp((tape,), ((0.3, -1.1),), config)[0]
    for got, want in zip(complex_jvp, real_jvp, strict=True):
        assert np.asarray(got).dtype == np.float64
        np.testing.assert_allclose(got, want, atol=ATOL)


class _PhaseByMatrix(qml.operation.Operation):
    """diag(1, e^{i phi}) defined by its matrix alone (no generator)."""

    num_wires = 1
    num_params = 1

    @staticmethod
    def compute_matrix(phi):
        return qml.math.diag(qml.math.stack([qml.math.ones_like(phi), qml.math.exp(1j * phi)]))


def test_jit_traced_matrix_refusal_says_why_it_counts_as_trainable():
    """Under jax.jit PennyLane takes every traced argument to be trainable: a constant gate
    parameter passed as an argument of a gate that the adjoint method does not
    differentiate (one defined by its matrix alone) is refused; the error says so and how
    to avoid it, and closing over the value works. A QubitUnitary matrix passed so is taken
    by its entries (it was refused), with the same gradient as the closed-over one."""
    dev = qml.device("custatevec.qubit", wires=1, backend="cpu")
    flip = np.array([[0.0, 1.0], [1.0, 0.0]])

    @qml.qnode(dev, diff_method="adjoint")
    def traced(phi, a):
        qml.Hadamard(wires=0)
        _PhaseByMatrix(phi, wires=0)
        qml.RY(a, wires=0)
        return qml.expval(qml.Z(0))

    with pytest.raises(DeviceError, match="Under jax.jit every traced value counts as"):
        jax.jit(jax.grad(traced, argnums=1))(jnp.array(0.5), jnp.array(0.1))

    @qml.qnode(dev, diff_method="adjoint")
    def traced_matrix(matrix, a):
        qml.QubitUnitary(matrix, wires=0)
        qml.RY(a, wires=0)
        return qml.expval(qml.Z(0))

    @qml.qnode(dev, diff_method="adjoint")
    def closed(a):
        qml.QubitUnitary(flip, wires=0)
        qml.RY(a, wires=0)
        return qml.expval(qml.Z(0))

    want = np.sin(0.1)
    np.testing.assert_allclose(jax.jit(jax.grad(closed))(jnp.array(0.1)), want, atol=ATOL)
    got = jax.jit(jax.grad(traced_matrix, argnums=1))(jnp.asarray(flip), jnp.array(0.1))
    np.testing.assert_allclose(got, want, atol=ATOL)


@MODES
@pytest.mark.parametrize("interface", ["auto", "jax-jit"])
def test_jit_with_device_vjp_and_template_weights(mode, interface):
    """Under jax.jit PennyLane differentiates through the device Jacobian whatever
    device_vjp says, shaped per scalar parameter: with device_vjp=True the device used to
    keep a native template's weight array (as for a VJP boundary), and jax's callback got
    a (3, 2, 3) Jacobian where it wanted (). The gradient (and a Jacobian of a state)
    equal default.qubit's."""
    weights = jnp.asarray(np.random.default_rng(0).uniform(0, np.pi, (3, 2, 3)))

    def circuit(w):
        qml.StronglyEntanglingLayers(w, wires=[0, 1])
        return qml.expval(qml.Z(0))

    def state(w):
        qml.StronglyEntanglingLayers(w, wires=[0, 1])
        return qml.state()

    dev = qml.device("custatevec.qubit", wires=2, backend="cpu", grad_accumulation=mode)
    kwargs = {"diff_method": "adjoint", "device_vjp": True, "interface": interface}
    reference = qml.device("default.qubit", wires=2)
    for fn, take in ((circuit, jax.grad), (state, jax.jacfwd)):
        ours = jax.jit(take(qml.QNode(fn, dev, **kwargs)))(weights)
        np.testing.assert_allclose(ours, take(qml.QNode(fn, reference))(weights), atol=ATOL)
