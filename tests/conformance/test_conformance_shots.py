"""Finite shots and shot vectors on custatevec.qubit against default.qubit: samples and
counts of default.qubit's shapes, dtypes and keys; estimates within a statistical
tolerance of default.qubit's exact values; parameter-shift (and "best", which takes it with
shots) derivatives of sampled QNodes within the same tolerance of the exact derivatives,
for single shot numbers and shot vectors, in every interface; an explicit adjoint with
shots refused as default.qubit refuses it. Every device is seeded: each test is
deterministic.
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from conformance_support import (
    BEST,
    INTERFACE_NAMES,
    PARAMETER_SHIFT,
    custatevec_device,
    flat_real,
    interface,
    reference_device,
    reference_qnode,
    three_qubit_gates,
    to_numpy,
)
from conftest import stable_seed
from pennylane.exceptions import DeviceError, QuantumFunctionError

X = 0.543
Y = np.array([-0.654, 0.321])
SHOT_VECTOR = ((2000, 2), 6000)


def estimates(x, y):
    """Measurements whose sampled values estimate exact ones."""
    three_qubit_gates(x, y)
    return (
        qml.expval(qml.Z(0)),
        qml.expval(qml.Hamiltonian([0.4, -0.9], [qml.X(1) @ qml.Z(2), qml.Y(2)])),
        qml.probs(wires=[0, 2]),
        qml.var(qml.X(1)),
    )


def differentiated(x, y):
    """Measurements of the Jacobian tests (few outputs: torch takes one backward pass,
    and so one parameter-shift run, per output)."""
    three_qubit_gates(x, y)
    return qml.expval(qml.Z(0) @ qml.X(2)), qml.probs(wires=[1])


def samples(x, y):
    three_qubit_gates(x, y)
    return (
        qml.sample(wires=[0, 1]),
        qml.sample(qml.Z(0) @ qml.Z(2)),
        qml.counts(wires=[1]),
        qml.counts(qml.X(2)),
        qml.expval(qml.Z(0)),
    )


def tolerance(shots: int) -> float:
    """Six standard deviations of a +-1 estimate (and more than that of a probability)."""
    return 6 / np.sqrt(shots)


def shot_copies(shots) -> list[int]:
    """The shots of each copy of a shot vector (one entry for a single number)."""
    return list(qml.measurements.Shots(shots))


def seeded(*parts) -> int:
    return stable_seed("conformance-shots", *parts)


@pytest.mark.parametrize("interface_name", INTERFACE_NAMES)
@pytest.mark.parametrize("shots", [3000, SHOT_VECTOR], ids=["shots", "shot_vector"])
def test_samples_and_counts(interface_name, shots):
    """Samples and counts: default.qubit's nesting, shapes, dtypes and outcome keys; the
    sample means within tolerance of the exact values."""
    iface = interface(interface_name)
    seed = seeded("samples", interface_name, str(shots))
    ours = qml.set_shots(qml.QNode(samples, custatevec_device(3, seed=seed)), shots)
    ref = qml.set_shots(qml.QNode(samples, reference_device(3, seed=seed)), shots)
    args = (iface.constant(X), iface.constant(Y))
    result, expected = ours(*args), ref(*args)
    exact = qml.QNode(estimates, reference_device(3))(X, Y)
    copies = shot_copies(shots)
    if len(copies) == 1:
        result, expected = (result,), (expected,)
    assert type(result) is type(expected) and len(result) == len(expected) == len(copies)
    for n, r, e in zip(copies, result, expected, strict=True):
        wire_samples, word_samples, wire_counts, obs_counts, mean = map(to_numpy, r)
        for got, want in zip((wire_samples, word_samples), e[:2], strict=True):
            want = to_numpy(want)
            assert got.shape == want.shape and got.dtype == want.dtype
        assert set(np.unique(wire_samples)) <= {0, 1}
        assert set(np.unique(word_samples)) <= {-1.0, 1.0}
        for got, want in zip((wire_counts, obs_counts), e[2:4], strict=True):
            assert isinstance(got, dict) and set(got) <= {"0", "1", -1.0, 1.0}
            assert {type(k) for k in got} == {type(k) for k in want}
            assert sum(got.values()) == n
        atol = tolerance(n)
        assert abs(float(mean) - float(exact[0])) < atol
        assert abs(wire_samples[:, 0].mean() - (1 - float(exact[0])) / 2) < atol
        assert abs(np.mean(word_samples) - float(mean)) < 3 * atol  # <Z0 Z2> vs <Z0>: loose
        assert abs(wire_counts["1"] / n - wire_samples[:, 1].mean()) < 2 * atol


@pytest.mark.parametrize("interface_name", INTERFACE_NAMES)
@pytest.mark.parametrize("shots", [20000, SHOT_VECTOR], ids=["shots", "shot_vector"])
def test_estimates_within_tolerance(interface_name, shots):
    """Expectation values (a Hamiltonian among them), probabilities and variances:
    default.qubit's nesting and shapes for the shot vector, values within tolerance of
    the exact ones."""
    iface = interface(interface_name)
    seed = seeded("estimates", interface_name, str(shots))
    ours = qml.set_shots(qml.QNode(estimates, custatevec_device(3, seed=seed)), shots)
    ref = qml.set_shots(qml.QNode(estimates, reference_device(3, seed=seed)), shots)
    args = (iface.constant(X), iface.constant(Y))
    result, expected = to_numpy(ours(*args)), to_numpy(ref(*args))
    exact = to_numpy(qml.QNode(estimates, reference_device(3))(X, Y))
    copies = shot_copies(shots)
    if len(copies) == 1:
        result, expected = (result,), (expected,)
    assert type(result) is type(expected) and len(result) == len(expected) == len(copies)
    for n, r, e in zip(copies, result, expected, strict=True):
        assert type(r) is type(e) and len(r) == len(e)
        for got, want, value in zip(r, e, exact, strict=True):
            assert np.shape(got) == np.shape(want) and got.dtype == want.dtype
            np.testing.assert_allclose(got, value, atol=tolerance(n), rtol=0)


@pytest.mark.parametrize("config", [PARAMETER_SHIFT, BEST], ids=lambda c: c.name)
@pytest.mark.parametrize("interface_name", INTERFACE_NAMES)
@pytest.mark.parametrize("shots", [20000, SHOT_VECTOR], ids=["shots", "shot_vector"])
def test_sampled_jacobian_within_tolerance(interface_name, config, shots):
    """Parameter-shift derivatives of a sampled QNode ("best" takes parameter-shift with
    shots) are within tolerance of default.qubit's exact derivatives, for every copy of a
    shot vector. (With shots the device only samples: the accumulation mode does not
    enter.)"""
    iface = interface(interface_name)
    seed = seeded("jacobian", interface_name, config.name, str(shots))
    dev = custatevec_device(3, seed=seed)
    ours = qml.set_shots(qml.QNode(differentiated, dev, **config.qnode_kwargs()), shots)
    exact_qnode = reference_qnode(differentiated, 3)
    copies = shot_copies(shots)

    def exact_copies(x, y):
        result = exact_qnode(x, y)
        return result if len(copies) == 1 else tuple(result for _ in copies)

    jacobian = iface.jacobian(ours, iface.args([X, Y]))
    ref_iface = iface.for_reference_derivatives()
    expected = ref_iface.jacobian(exact_copies, ref_iface.args([X, Y]))
    atol = tolerance(min(copies))
    for got, want in zip(jacobian, expected, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=atol, rtol=0)


@pytest.mark.parametrize("interface_name", INTERFACE_NAMES)
def test_shots_changed_between_calls(interface_name):
    """One QNode run analytic (default.qubit's exact values, adjoint), then with shots set
    per call (sampled, parameter-shift through "best"), then analytic again."""
    iface = interface(interface_name)
    qnode = qml.QNode(estimates, custatevec_device(3, seed=seeded("changing")))
    exact = qml.QNode(estimates, reference_device(3), interface=interface_name)
    args = iface.args([X, Y])
    expected = flat_real(to_numpy(exact(*args)))
    np.testing.assert_allclose(flat_real(to_numpy(qnode(*args))), expected, atol=1e-10)
    sampled = qml.set_shots(qnode, 20000)
    np.testing.assert_allclose(flat_real(to_numpy(sampled(*args))), expected, atol=tolerance(20000))
    np.testing.assert_allclose(flat_real(to_numpy(qnode(*args))), expected, atol=1e-10)


@pytest.mark.parametrize("config", [PARAMETER_SHIFT, BEST], ids=lambda c: c.name)
def test_seeded_devices_repeat_their_samples(config):
    """Two devices with the same seed give the same samples and sampled gradients."""
    iface = interface("torch")

    def run():
        dev = custatevec_device(3, seed=seeded("repeat"))
        qnode = qml.set_shots(qml.QNode(differentiated, dev, **config.qnode_kwargs()), 500)
        return to_numpy(qnode(*iface.args([X, Y]))), iface.jacobian(qnode, iface.args([X, Y]))

    (first, first_jacobian), (second, second_jacobian) = run(), run()
    for a, b in zip(first + first_jacobian, second + second_jacobian, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("interface_name", ["autograd", "torch"])
def test_adjoint_with_shots_refused(interface_name):
    """An explicit adjoint with shots is refused, as on default.qubit, with an error that
    names parameter-shift."""

    def expval_circuit(x, y):
        three_qubit_gates(x, y)
        return qml.expval(qml.Z(0) @ qml.X(2))

    iface = interface(interface_name)
    ours = qml.set_shots(
        qml.QNode(expval_circuit, custatevec_device(3), diff_method="adjoint"), 100
    )
    ref = qml.set_shots(qml.QNode(expval_circuit, reference_device(3), diff_method="adjoint"), 100)
    with pytest.raises(QuantumFunctionError):
        iface.jacobian(ref, iface.args([X, Y]))
    with pytest.raises((DeviceError, QuantumFunctionError), match="parameter-shift"):
        iface.jacobian(ours, iface.args([X, Y]))
