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


@pytest.fixture
def capture():
    qml.capture.enable()
    try:
        yield
    finally:
        qml.capture.disable()


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


def test_captured_mid_circuit_measurement_differentiated_refused(capture):
    node = qml.QNode(_mid_measure_circuit, _devices()[0])
    with pytest.raises(qml.exceptions.DeviceError, match="capture disabled"):
        jax.grad(lambda x: node(x)[0])(jnp.array(0.5))


def test_the_same_mid_circuit_derivative_without_capture():
    """What the refusal points to: -sin(x)/2 (1 - cos 0.7)."""
    node = qml.QNode(_mid_measure_circuit, _devices()[0])
    gradient = jax.grad(lambda x: node(x)[0])(jnp.array(0.5))
    np.testing.assert_allclose(gradient, -np.sin(0.5) / 2 * (1 - np.cos(0.7)), atol=TOL)
