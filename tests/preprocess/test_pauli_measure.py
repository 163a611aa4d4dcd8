"""Pauli product measurements (``qml.pauli_measure``), which PennyLane 0.45 executes
nowhere (default.qubit raises a KeyError inside ``defer_measurements`` without shots and
"not supported" with shots).

The device measures the word P as V, a Z-basis measurement, then V^dagger
(``preprocess.mid_circuit._pauli_product_as_parity``). The reference here is independent of it: the
projectors (I + (-1)^m P) / 2 applied to default.qubit's state in numpy, each outcome's
branch carried through the rest of the circuit by its matrix.
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from pennylane import numpy as pnp

WIRES = 3
PAULI = {"X": qml.X, "Y": qml.Y, "Z": qml.Z}

# (word, wires): one, two and three wires, in and out of wire order
WORDS = [
    ("X", [1]),
    ("Y", [2]),
    ("Z", [0]),
    ("XY", [0, 1]),
    ("YY", [2, 0]),
    ("ZX", [1, 2]),
    ("XYZ", [0, 1, 2]),
    ("YZX", [2, 0, 1]),
]


def _prefix(x):
    qml.RY(x, 0)
    qml.RX(0.4, 1)
    qml.CNOT([0, 1])
    qml.RY(-0.8, 2)
    qml.CRX(1.1, [1, 2])
    qml.S(0)


def _suffix():
    qml.RX(0.6, 0)
    qml.CNOT([2, 1])


def _circuit(word, wires, postselect=None, x=0.7, z0_only=False):
    def circuit(x=x):
        _prefix(x)
        m = qml.pauli_measure(word, wires, postselect=postselect)
        qml.cond(m, qml.RY)(0.9, 2)  # reads the outcome
        _suffix()
        if z0_only:
            return qml.expval(qml.Z(0))
        return qml.expval(qml.Z(0)), qml.expval(m), qml.probs(wires=range(WIRES))

    return circuit


def _matrix(body, *args):
    return qml.matrix(body, wire_order=range(WIRES))(*args)


def _reference(word, wires, postselect=None, x=0.7):
    """(<Z0>, P(m = 1), probs) from the projectors in numpy."""
    state = qml.QNode(lambda: (_prefix(x), qml.state())[1], qml.device("default.qubit"))()
    pauli = qml.matrix(
        qml.prod(*(PAULI[p](w) for p, w in zip(word, wires, strict=True))),
        wire_order=range(WIRES),
    )
    conditional = _matrix(lambda: qml.RY(0.9, 2))
    suffix = _matrix(_suffix)
    z0 = _matrix(lambda: qml.Z(0))
    outcomes = {}
    for m in (0, 1):
        projected = (np.eye(2**WIRES) + (-1) ** m * pauli) / 2 @ state
        weight = np.vdot(projected, projected).real
        branch = projected / np.sqrt(weight) if weight > 1e-300 else projected
        if m == 1:
            branch = conditional @ branch
        outcomes[m] = (weight, suffix @ branch)
    if postselect is not None:
        outcomes = {postselect: (1.0, outcomes[postselect][1])}
    expval_z0 = sum(w * np.vdot(b, z0 @ b).real for w, b in outcomes.values())
    probability_one = outcomes[1][0] if 1 in outcomes else 0.0
    probs = sum(w * np.abs(b) ** 2 for w, b in outcomes.values())
    return expval_z0, probability_one, probs


def _assert_close(result, expected, atol):
    for r, e in zip(result, expected, strict=True):
        np.testing.assert_allclose(np.asarray(r, float), np.asarray(e, float), atol=atol, rtol=0)


@pytest.mark.parametrize(("word", "wires"), WORDS)
@pytest.mark.parametrize("method", ["deferred", "tree-traversal"])
def test_pauli_product_measurement_projects_onto_the_eigenspaces(word, wires, method):
    dev = qml.device("custatevec.qubit", wires=WIRES + 1)  # a spare wire for "deferred"
    result = qml.QNode(_circuit(word, wires), dev, mcm_method=method)()
    expected = _reference(word, wires)
    assert 0.05 < expected[1] < 0.95  # both outcomes carry weight: the test can fail
    _assert_close(result, expected, atol=1e-12)


@pytest.mark.parametrize(("word", "wires"), WORDS[3:6])
@pytest.mark.parametrize("postselect", [0, 1])
@pytest.mark.parametrize("method", ["deferred", "tree-traversal"])
def test_postselected_pauli_product_measurement(word, wires, postselect, method):
    dev = qml.device("custatevec.qubit", wires=WIRES + 1)
    node = qml.QNode(_circuit(word, wires, postselect), dev, mcm_method=method)
    _assert_close(node(), _reference(word, wires, postselect), atol=1e-12)


@pytest.mark.parametrize(("word", "wires"), [WORDS[3], WORDS[6]])
def test_pauli_product_measurement_with_shots(word, wires):
    """One-shot, 20,000 shots, seeded: within 5 standard errors of the exact values."""
    dev = qml.device("custatevec.qubit", wires=WIRES, seed=1234)
    node = qml.set_shots(qml.QNode(_circuit(word, wires), dev, mcm_method="one-shot"), 20000)
    tolerance = 5 * 0.5 / np.sqrt(20000)
    _assert_close(node(), _reference(word, wires), atol=2 * tolerance)


@pytest.mark.parametrize("method", ["deferred", "tree-traversal", "one-shot"])
def test_a_repeated_measurement_repeats_its_outcome(method):
    """Projective: measuring the same word again gives the same outcome, and a commuting
    word measured between does not change it (XX and ZZ commute)."""

    def circuit():
        qml.RY(0.8, 0)
        qml.RX(-1.3, 1)
        qml.CRY(0.5, [0, 1])
        first = qml.pauli_measure("XX", [0, 1])
        qml.pauli_measure("ZZ", [0, 1])
        second = qml.pauli_measure("XX", [0, 1])
        return qml.expval(first != second), qml.expval(first)

    shots = 2000 if method == "one-shot" else None
    dev = qml.device("custatevec.qubit", wires=5, seed=7)
    differs, first = qml.set_shots(qml.QNode(circuit, dev, mcm_method=method), shots)()
    assert abs(differs) < 1e-12
    assert 0.1 < first < 0.9


@pytest.mark.parametrize("method", ["deferred", "tree-traversal"])
def test_a_condition_on_a_pauli_product_and_a_mid_circuit_measurement(method):
    """PennyLane's ``test_compute_depth_with_condition`` circuit, executed: Z on wire 2 when
    both the Z measurement of wire 0 and the XY product measurement give 1."""

    def circuit():
        qml.H(0)
        qml.RY(0.7, 1)
        qml.H(2)
        m0 = qml.measure(0)
        m1 = qml.pauli_measure("XY", [0, 1])
        qml.cond(m0 & m1, qml.Z)(2)
        return qml.expval(qml.X(2)), qml.expval(m0 & m1)

    # after m0 the state of wires 0 and 1 is |m0> (x) RY(0.7)|0>; <X0 Y1> there is 0, so
    # m1 is 1 with probability 1/2 whatever m0 is: P(m0 & m1) = 1/4, and Z flips <X2>
    dev = qml.device("custatevec.qubit", wires=5)
    x2, both = qml.QNode(circuit, dev, mcm_method=method)()
    np.testing.assert_allclose([x2, both], [1 - 2 * 0.25, 0.25], atol=1e-12)


@pytest.mark.parametrize("diff_method", ["best", "parameter-shift"])
def test_derivative_through_a_pauli_product_measurement(diff_method):
    """d<Z0>/dx through the measurement against central differences of the reference."""
    dev = qml.device("custatevec.qubit", wires=WIRES + 1)
    node = qml.QNode(_circuit("ZYX", [0, 1, 2], z0_only=True), dev, diff_method=diff_method)
    gradient = qml.grad(node)(pnp.array(0.7, requires_grad=True))

    def value(x):
        return _reference("ZYX", [0, 1, 2], x=x)[0]

    step = 1e-5
    want = (value(0.7 + step) - value(0.7 - step)) / (2 * step)
    assert abs(want) > 0.05
    np.testing.assert_allclose(gradient, want, atol=1e-8)


@pytest.mark.parametrize(("sign", "expected"), [(1, 1.0), (-1, -1.0)])
def test_a_captured_program_with_a_pauli_product_measurement(capture, sign, expected):
    """With program capture (default.qubit: jax's TypeError on the measured value):
    |+>|0> and |->|0> are X0 Z1 eigenstates of eigenvalue 1 and -1 (outcomes 0 and 1)."""

    @qml.qnode(qml.device("custatevec.qubit", wires=4))
    def circuit():
        qml.H(0)
        if sign < 0:
            qml.Z(0)
        m = qml.pauli_measure("XZ", [0, 1])
        qml.cond(m, qml.X)(2)
        return qml.expval(qml.Z(2))

    np.testing.assert_allclose(circuit(), expected, atol=1e-12)
