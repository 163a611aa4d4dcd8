"""mcm_method="tree-traversal": every branch of the mid-circuit measurements followed and
weighted (``branches.py``) without shots, the one-shot method with shots; against
default.qubit's deferred method (exact)."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from pennylane.exceptions import DeviceError

from pennylane_custatevec import batching

WIRES = ["a", "b", "c"]
X = 0.7


def _reference(circuit, **kwargs):
    """default.qubit's deferred method (wires added as needed)."""
    return qml.QNode(circuit, qml.device("default.qubit"), mcm_method="deferred", **kwargs)


def _ours(circuit, c_dtype=np.complex128, **kwargs):
    device = qml.device("custatevec.qubit", wires=WIRES, c_dtype=c_dtype)
    return qml.QNode(circuit, device, mcm_method="tree-traversal", **kwargs)


def _every_measurement(x):
    """Resets, conditions on composite values, and every measurement the traversal
    returns."""
    qml.RX(x, "a")
    qml.CNOT(["a", "c"])
    m0 = qml.measure("a")
    qml.cond(m0, qml.RY)(0.3, "b")
    qml.CNOT(["b", "c"])
    m1 = qml.measure("b", reset=True)
    qml.cond(m0 & m1, qml.RX)(x / 2, "c")
    qml.cond(~m0, qml.Hadamard)("b")
    qml.RZ(0.2, "b")
    qml.IsingXX(0.4, ["b", "c"])
    m2 = qml.measure("c")
    qml.cond(m2 != m0, qml.PauliX)("a")
    return (
        qml.expval(qml.Z("c")),
        qml.var(qml.X("b") @ qml.Z("c")),
        qml.expval(qml.Hamiltonian([0.5, -1.2], [qml.Y("a"), qml.Z("a") @ qml.X("b")])),
        qml.probs(wires=["b", "a"]),
        qml.probs(op=m0),
        qml.expval(m0 + 2 * m1),
        qml.var(m1 - m2),
        qml.probs(op=[m0, m1, m2]),
        qml.density_matrix(["c"]),
    )


@pytest.mark.parametrize(("c_dtype", "tolerance"), [(np.complex128, 1e-12), (np.complex64, 2e-6)])
def test_values_equal_the_deferred_method(c_dtype, tolerance):
    expected = _reference(_every_measurement)(X)
    result = _ours(_every_measurement, c_dtype)(X)
    assert len(result) == len(expected)
    for ours, theirs in zip(result, expected, strict=True):
        assert np.shape(ours) == np.shape(theirs)
        np.testing.assert_allclose(ours, theirs, atol=tolerance)


def test_depth_first_where_the_branches_do_not_fit_one_batch(monkeypatch):
    """With a batch budget below two vectors, every measurement follows its outcomes one
    after the other: the same results."""
    expected = _reference(_every_measurement)(X)
    monkeypatch.setattr(batching, "BATCH_BYTES", 16)
    result = _ours(_every_measurement)(X)
    for ours, theirs in zip(result, expected, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=1e-12)


@pytest.mark.parametrize("batch_bytes", [None, 16])
def test_on_the_custatevec_backend(gpu_double, monkeypatch, batch_bytes):
    """The cuStateVec backend (its NumPy double) follows the branches in one batch and
    depth first, with the CPU backend's results."""
    if batch_bytes is not None:
        monkeypatch.setattr(batching, "BATCH_BYTES", batch_bytes)
    expected = _ours(_every_measurement)(X)
    device = qml.device("custatevec.qubit", wires=WIRES, backend="custatevec")
    result = qml.QNode(_every_measurement, device, mcm_method="tree-traversal")(X)
    for ours, theirs in zip(result, expected, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=1e-12)
    assert {"abs2sum_array", "apply_generalized_permutation_matrix"} <= set(
        gpu_double.custatevec.calls
    )


def _postselecting(x, postselect):
    qml.RX(x, "a")
    qml.CNOT(["a", "b"])
    m0 = qml.measure("b", postselect=postselect)
    qml.cond(m0, qml.RY)(0.5, "c")
    qml.Hadamard("a")
    return qml.expval(qml.Z("c")), qml.probs(wires=["a"]), qml.expval(m0)


@pytest.mark.parametrize("postselect", [0, 1, True])  # True: PennyLane takes bools
def test_postselection(postselect):
    expected = _reference(_postselecting)(X, postselect)
    result = _ours(_postselecting)(X, postselect)
    for ours, theirs in zip(result, expected, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=1e-12)


def test_impossible_postselection_gives_nan():
    """As default.qubit: every result NaN where no branch survives."""

    def impossible(x):
        qml.RX(x, "a")
        qml.measure("b", postselect=1)
        return qml.expval(qml.Z("a")), qml.probs(wires=["a"])

    for value in _ours(impossible)(X):
        assert np.all(np.isnan(value))
    for value in _reference(impossible)(X):
        assert np.all(np.isnan(value))


def test_projector_gate_postselects_branches():
    def projected(x):
        qml.RX(x, "a")
        m0 = qml.measure("a")
        qml.cond(m0, qml.RY)(0.9, "b")
        qml.CNOT(["b", "c"])
        qml.Projector([1], wires="c")
        return qml.expval(qml.Z("a")), qml.probs(op=m0)

    expected = _reference(projected)(X)
    for ours, theirs in zip(_ours(projected)(X), expected, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=1e-12)


def test_broadcast_is_expanded():
    x = np.array([0.3, 0.7, 1.9])
    expected = _reference(_every_measurement)(x)
    result = _ours(_every_measurement)(x)
    for ours, theirs in zip(result, expected, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=1e-12)


def test_zero_probability_branches_are_dropped():
    """Forty measurements of a reset qubit, each outcome certain: one branch (2**40
    without dropping the branches of probability 0)."""

    def certain(x):
        qml.RX(x, "a")
        values = []
        for _ in range(40):
            qml.PauliX("b")
            values.append(qml.measure("b", reset=True))
        qml.cond(values[-1], qml.RY)(0.4, "a")
        return qml.expval(qml.Z("a")), qml.expval(sum(values))

    z, total = _ours(certain)(X)
    np.testing.assert_allclose(z, np.cos(X) * np.cos(0.4), atol=1e-12)
    assert total == 40


@pytest.mark.parametrize(
    "measurement",
    [
        lambda m: qml.state(),
        lambda m: qml.vn_entropy(wires=["a"]),
        lambda m: qml.purity(wires=["a"]),
    ],
)
def test_results_that_are_not_means_over_branches_are_refused(measurement):
    def circuit(x):
        qml.RX(x, "a")
        m0 = qml.measure("a")
        return measurement(m0)

    with pytest.raises(DeviceError, match="not a mean over the branches.*deferred"):
        _ours(circuit)(X)


def _trainable_outside_conditions(x, first_only=False):
    qml.RX(x[0], "a")
    m0 = qml.measure("a")
    qml.cond(m0, qml.PauliX)("b")
    qml.RY(x[1], "b")
    qml.CNOT(["b", "c"])
    m1 = qml.measure("c", reset=True)
    qml.cond(m1, qml.RZ)(0.3, "a")
    qml.RX(x[2], "a")
    if first_only:
        return qml.expval(qml.Z("a") @ qml.Z("b"))
    return qml.expval(qml.Z("a") @ qml.Z("b")), qml.expval(qml.Y("a"))


@pytest.mark.parametrize("diff_method", ["best", "parameter-shift"])
def test_derivatives_by_parameter_shift(diff_method):
    """ "best" takes parameter-shift (the adjoint method does not follow branches): exact
    where no trainable gate is conditional."""
    from pennylane import numpy as pnp

    x = pnp.array([0.7, -0.4, 1.2], requires_grad=True)
    ours = _ours(_trainable_outside_conditions, diff_method=diff_method)
    reference = _reference(_trainable_outside_conditions, diff_method="backprop")
    jacobian = qml.jacobian(lambda v: qml.math.stack(ours(v)))(x)
    expected = qml.jacobian(lambda v: qml.math.stack(reference(v)))(x)
    np.testing.assert_allclose(jacobian, expected, atol=1e-10)
    assert np.max(np.abs(expected)) > 0.1


def test_derivatives_in_torch_and_jax():
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)

    values = np.array([0.7, -0.4, 1.2])
    reference = _reference(_trainable_outside_conditions, diff_method="backprop")
    expected = jax.grad(reference)(jax.numpy.array(values), first_only=True)
    ours = _ours(_trainable_outside_conditions, diff_method="parameter-shift")
    x = torch.tensor(values, requires_grad=True)
    ours(x, first_only=True).backward()
    np.testing.assert_allclose(x.grad.numpy(), expected, atol=1e-10)
    jax_grad = jax.grad(ours)(jax.numpy.array(values), first_only=True)
    np.testing.assert_allclose(jax_grad, expected, atol=1e-10)


def test_adjoint_is_refused_by_name():
    from pennylane import numpy as pnp

    ours = _ours(_trainable_outside_conditions, diff_method="adjoint")
    with pytest.raises(DeviceError, match="mcm_method='deferred'.*parameter-shift"):
        qml.jacobian(lambda v: qml.math.stack(ours(v)))(pnp.array([0.7, -0.4, 1.2]))


def test_with_shots_samples_the_same_distribution():
    """With shots the method runs one-shot: statistics within 5 standard errors of the
    exact values (seeded), postselection "hw-like"."""

    def circuit(x, sampled=True):
        qml.RX(x, "a")
        m0 = qml.measure("a")
        qml.cond(m0, qml.RY)(0.9, "b")
        m1 = qml.measure("b", postselect=0)
        if not sampled:
            return qml.expval(qml.Z("a")), qml.probs(op=m0)
        return qml.expval(qml.Z("a")), qml.probs(op=m0), qml.sample(m1)

    exact = _reference(circuit)(X, sampled=False)
    device = qml.device("custatevec.qubit", wires=WIRES, seed=17)
    qnode = qml.set_shots(qml.QNode(circuit, device, mcm_method="tree-traversal"), 20000)
    z, probabilities, samples = qnode(X)
    kept = len(samples)
    assert np.all(samples == 0)
    assert 0 < kept < 20000  # the postselection drops shots
    np.testing.assert_allclose(z, exact[0], atol=5 / np.sqrt(kept))
    np.testing.assert_allclose(probabilities, exact[1], atol=5 * 0.5 / np.sqrt(kept))
