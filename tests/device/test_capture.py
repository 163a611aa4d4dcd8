"""Programs captured with ``qml.capture.enable()``: the device runs them as tapes
(``eval_jaxpr``, ``jaxpr_jvp``). Before, every captured QNode failed (a ValueError from
``defer_measurements`` in the device's preprocessing); PennyLane's templates tests of
dynamic decompositions run with capture enabled."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pennylane as qml
import pytest
from conftest import DEVICE

jax.config.update("jax_enable_x64", True)

TOL = 1e-10


def _devices(**kwargs):
    return (
        qml.device(DEVICE, wires=3, backend="cpu", **kwargs),
        qml.device("default.qubit", wires=3, **kwargs),
    )


def _loop_circuit(x):
    qml.RX(x, 0)
    qml.CNOT([0, 1])

    @qml.for_loop(2)
    def loop(i):
        qml.RY(x * (i + 1), 2)
        qml.IsingXX(0.3 * x, [1, 2])

    loop()
    return qml.expval(qml.Z(1)), qml.probs(wires=[2])


CALLS = {
    "value": lambda node: node(0.5),
    "jit": lambda node: jax.jit(node)(0.5),
    "grad": lambda node: jax.grad(lambda x: node(x)[0])(0.5),
    "jacobian": lambda node: jax.jacobian(lambda x: node(x)[1])(0.5),
    "jit-grad": lambda node: jax.jit(jax.grad(lambda x: node(x)[0]))(0.5),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_captured_program_as_default_qubit(capture, call):
    ours, reference = (CALLS[call](qml.QNode(_loop_circuit, dev)) for dev in _devices())
    leaves = jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(reference)
    for a, b in zip(*leaves, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=TOL)
    assert qml.capture.enabled()  # the device leaves the user's setting as it was


def test_captured_program_with_shots_near_the_exact_values(capture):
    dev = qml.device(DEVICE, wires=3, backend="cpu", seed=4)
    node = qml.set_shots(qml.QNode(_loop_circuit, dev), shots=40_000)
    exact = qml.QNode(_loop_circuit, qml.device("default.qubit", wires=3))(0.5)
    sampled = node(0.5)
    bound = 5 / np.sqrt(40_000)
    np.testing.assert_allclose(sampled[0], exact[0], atol=2 * bound)
    np.testing.assert_allclose(sampled[1], exact[1], atol=bound)


def test_captured_program_with_a_shot_vector(capture):
    """One result tuple per shot copy, each as the same number of shots alone gives
    (default.qubit refuses shot vectors here; a flat list of the wrong length made
    PennyLane's captured QNode fail with "Too few leaves for PyTreeDef")."""
    dev = qml.device(DEVICE, wires=3, backend="cpu", seed=4)
    node = qml.set_shots(qml.QNode(_loop_circuit, dev), shots=[(20_000, 2), 30_000])
    exact = qml.QNode(_loop_circuit, qml.device("default.qubit", wires=3))(0.5)
    copies = node(0.5)
    assert len(copies) == 3
    for count, (expval, probs) in zip([20_000, 20_000, 30_000], copies, strict=True):
        bound = 5 / np.sqrt(count)
        assert np.shape(expval) == () and np.shape(probs) == (2,)
        np.testing.assert_allclose(expval, exact[0], atol=2 * bound)
        np.testing.assert_allclose(probs, exact[1], atol=bound)
    assert not np.array_equal(copies[0][1], copies[1][1])  # two samplings, not one copied


@pytest.mark.parametrize("shots", [None, 10, (3, 2)])
def test_captured_program_without_measurements(capture, shots):
    """Nothing to return: an empty list of results (as default.qubit; the device's own
    sampled path raised IndexError for a tape without measurements)."""

    def circuit(x):
        qml.RX(x, 0)

    jaxpr = jax.make_jaxpr(circuit)(0.5)
    for dev in _devices():
        assert dev.eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, 0.5, shots=None) == []
    ours = qml.device(DEVICE, wires=3, backend="cpu")
    assert (
        ours.eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, 0.5, shots=qml.measurements.Shots(shots)) == []
    )
    tape = qml.tape.QuantumScript([qml.RX(0.5, 0)], [], shots=shots)
    assert ours.execute(tape) == () == qml.device("default.qubit", wires=3).execute(tape)


def test_jitted_captured_program_with_shots_refused_by_name(capture):
    """Under jax.jit PennyLane passes a captured QNode's shots as traced values (default.qubit
    fails with a TracerBoolConversionError): refused by name, with what works."""
    dev = qml.device(DEVICE, wires=3, backend="cpu", seed=4)
    node = qml.set_shots(qml.QNode(_loop_circuit, dev), shots=100)
    with pytest.raises(Exception, match="numbers of shots are traced by jax") as raised:
        jax.jit(node)(0.5)
    assert "qml.capture.disable()" in str(raised.value)
    qml.capture.disable()
    try:  # the way the message names
        sampled = jax.jit(qml.set_shots(qml.QNode(_loop_circuit, dev), shots=100))(0.5)
    finally:
        qml.capture.enable()
    assert np.shape(sampled[1]) == (2,)


def _mid_measure_circuit(x):
    qml.RX(x, 0)
    m = qml.measure(0)
    qml.cond(m, qml.RY)(0.7, 1)
    return qml.expval(qml.Z(1)), qml.probs(wires=[0])


def test_captured_mid_circuit_measurement_evaluated(capture):
    """<Z1> = cos^2(x/2) + sin^2(x/2) cos(0.7)."""
    value, probabilities = qml.QNode(_mid_measure_circuit, _devices()[0])(0.5)
    expected = np.cos(0.25) ** 2 + np.sin(0.25) ** 2 * np.cos(0.7)
    np.testing.assert_allclose(value, expected, atol=TOL)
    np.testing.assert_allclose(probabilities, [np.cos(0.25) ** 2, np.sin(0.25) ** 2], atol=TOL)


def test_captured_mid_circuit_measurement_differentiated(capture):
    """The device defers the measurement on the program it differentiates: the same
    derivative as without capture, -sin(x)/2 (1 - cos 0.7). Before, it was refused."""
    node = qml.QNode(_mid_measure_circuit, _devices()[0])
    gradient = jax.grad(lambda x: node(x)[0])(jnp.array(0.5))
    np.testing.assert_allclose(gradient, -np.sin(0.5) / 2 * (1 - np.cos(0.7)), atol=TOL)


def test_captured_mid_circuit_derivative_of_another_method_refused(capture):
    """The derivative defers the measurements: with another method the refusal names
    the way (the values run)."""
    node = qml.QNode(_mid_measure_circuit, _devices()[0], mcm_method="tree-traversal")
    expected = np.cos(0.25) ** 2 + np.sin(0.25) ** 2 * np.cos(0.7)
    np.testing.assert_allclose(node(0.5)[0], expected, atol=TOL)
    with pytest.raises(qml.exceptions.DeviceError, match="mcm_method='deferred'"):
        jax.grad(lambda x: node(x)[0])(jnp.array(0.5))


def test_the_same_mid_circuit_derivative_without_capture():
    """-sin(x)/2 (1 - cos 0.7) without capture."""
    node = qml.QNode(_mid_measure_circuit, _devices()[0])
    gradient = jax.grad(lambda x: node(x)[0])(jnp.array(0.5))
    np.testing.assert_allclose(gradient, -np.sin(0.5) / 2 * (1 - np.cos(0.7)), atol=TOL)


def _processed_measurement_circuit(x):
    qml.RX(x, 0)
    m0 = qml.measure(0)
    qml.RX(x + 0.4, 1)
    m1 = qml.measure(1)
    qml.RX(jnp.sin(2.0 * m0 + 0.5), 2)  # a measured value through jax.numpy, as an angle
    qml.cond(m0 & ~m1, qml.RY)(0.8, 2)  # boolean arithmetic of two measured values
    qml.RZ(m1, 2)  # a measured value as an angle
    return qml.expval(qml.Z(2)), qml.probs(wires=[2])


def _processed_angles_circuit(x):
    qml.RX(x, 0)
    m0 = qml.measure(0)
    qml.RX(jnp.sin(2.0 * m0 + x), 2)
    qml.RZ(m0, 2)
    return qml.expval(qml.X(2)), qml.probs(wires=[0])


@pytest.mark.parametrize(
    "function, call",
    [
        (_processed_measurement_circuit, "value"),
        (_processed_angles_circuit, "value"),
        (_processed_angles_circuit, "jit"),
    ],
)
def test_measured_values_in_classical_processing(capture, function, call):
    """A captured program whose measured values go through arithmetic, jax.numpy and
    boolean logic into gate angles and conditions: the device defers its measurements on
    the program (PennyLane's ``defer_measurements`` for programs, with the device's
    wires) before making it a tape, as default.qubit does. Before, ``plxpr_to_tape``
    raised jax's TypeError (a MeasurementValue is not an array). (A condition on measured
    values under jax.jit fails in PennyLane's program interpreters, default.qubit's
    too.)"""
    devices = (
        qml.device(DEVICE, wires=5, backend="cpu"),
        qml.device("default.qubit", wires=5),
    )
    ours, reference = (CALLS[call](qml.QNode(function, d)) for d in devices)
    for a, b in zip(
        jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(reference), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=TOL)


def test_vmap_of_a_captured_program(capture):
    """jax.vmap over a captured QNode: PennyLane vmaps the device's ``eval_jaxpr``, whose
    tape then holds the vmap's batch (see ``test_broadcasting.test_jax_vmap_over_a_qnode``);
    equal to default.qubit's."""
    x = jnp.array([0.4, 2.1, -1.3])
    results = [jax.vmap(qml.QNode(_loop_circuit, dev))(x) for dev in _devices()]
    for a, b in zip(*(jax.tree_util.tree_leaves(r) for r in results), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=TOL)


def test_measured_values_in_classical_processing_differentiated(capture):
    """jax.grad of a captured program whose measured value goes through jax.numpy into an
    angle: the device defers the measurement on the program it differentiates
    (``jaxpr_jvp``; PennyLane hands it the program without the device's preprocessing).
    <X_2> = sin^2(x/2) sin(sin(2 + x)) sin(1); its derivative here equals the central
    difference of default.qubit's captured values (default.qubit's own jax.grad of this
    program gives 0)."""
    node = qml.QNode(_processed_angles_circuit, qml.device(DEVICE, wires=5, backend="cpu"))
    reference = qml.QNode(_processed_angles_circuit, qml.device("default.qubit", wires=5))
    x, h = 0.5, 1e-5
    exact = np.sin(x / 2) ** 2 * np.sin(np.sin(2 + x)) * np.sin(1)
    np.testing.assert_allclose(node(x)[0], exact, atol=TOL)
    gradient = jax.grad(lambda v: node(v)[0])(x)
    difference = (reference(x + h)[0] - reference(x - h)[0]) / (2 * h)
    np.testing.assert_allclose(gradient, difference, atol=1e-8)
    assert abs(gradient) > 0.05
