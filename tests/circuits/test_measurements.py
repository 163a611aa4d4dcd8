"""Measurements on custatevec.qubit against default.qubit: analytic (exact) and sampled."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import scipy.sparse
from conftest import (
    MIXED_WIRES,
    TOL,
    assert_allclose_nested,
    assert_same_structure,
    generic_layer,
    make_devices,
)
from reference import random_hermitian, random_state

W = MIXED_WIRES  # ["a", 3, "q1", 0, "z"]
ANGLES = np.random.default_rng(42).uniform(0, 2 * np.pi, size=(len(W), 2))


def prepare():
    generic_layer(W, ANGLES)
    qml.CRX(0.77, wires=["z", "a"])
    qml.IsingYY(0.31, wires=[0, 3])


def both(measure, shots=None, seed=None, dtype=np.complex128, **qnode_kwargs):
    """Run prepare() then ``measure()`` on both devices."""
    kwargs = {"c_dtype": dtype}
    if seed is not None:
        kwargs["seed"] = seed
    dev, ref = make_devices(W, **kwargs)

    def circuit():
        prepare()
        return measure()

    out = []
    for d in (dev, ref):
        node = qml.QNode(circuit, d, **qnode_kwargs)
        if shots is not None:
            node = qml.set_shots(node, shots=shots)
        out.append(node())
    return tuple(out)


_H1 = random_hermitian(2, np.random.default_rng(1))
_H2 = random_hermitian(4, np.random.default_rng(2))
_PSI = random_state(2, np.random.default_rng(3))

OBSERVABLES = {
    "Z": lambda: qml.Z("q1"),
    "X": lambda: qml.X(0),
    "Y": lambda: qml.Y("z"),
    "H": lambda: qml.Hadamard(3),
    "I": lambda: qml.Identity("a"),
    "word2": lambda: qml.X("z") @ qml.Y("a"),
    "word4": lambda: qml.Z(0) @ qml.X(3) @ qml.Y("q1") @ qml.Z("a"),
    "word5": lambda: qml.Y(0) @ qml.Y(3) @ qml.X("q1") @ qml.Z("a") @ qml.X("z"),
    "hermitian1": lambda: qml.Hermitian(_H1, wires="q1"),
    "hermitian2": lambda: qml.Hermitian(_H2, wires=["z", 3]),
    "projector_basis": lambda: qml.Projector([1, 0], wires=[0, "a"]),
    "projector_basis3": lambda: qml.Projector([0, 1, 1], wires=["z", "q1", 3]),
    "projector_state": lambda: qml.Projector(_PSI, wires=[3, "z"]),
    "sum": lambda: qml.X("a") + 0.5 * qml.Z(3) @ qml.Z(0) - qml.Y("z"),
    "sprod": lambda: qml.s_prod(-1.7, qml.Y("q1") @ qml.X(0)),
    "prod": lambda: qml.prod(qml.X("a"), qml.Z("z"), qml.Hadamard(0)),
    "prod_hermitian": lambda: qml.prod(qml.Hermitian(_H1, wires="a"), qml.Z(3)),
    "sum_hermitian": lambda: 0.3 * qml.Hermitian(_H2, wires=["q1", 0]) + qml.X("z") @ qml.Z("a"),
    "linear_combination": lambda: qml.ops.LinearCombination(
        [0.2, -1.1, 0.7], [qml.X(3), qml.Z("a") @ qml.Y(0), qml.Z("q1")]
    ),
    "hamiltonian": lambda: qml.Hamiltonian(
        [1.5, 0.25, -0.5], [qml.Z("z") @ qml.Z(3), qml.X("a"), qml.Hermitian(_H1, wires=0)]
    ),
    "hamiltonian_with_identity": lambda: qml.Hamiltonian(
        [0.9, 0.4], [qml.Identity("a"), qml.X("q1") @ qml.Y(3)]
    ),
    "nested_sum_with_identity": lambda: qml.sum(qml.Z("a") + 3 * qml.I(), 0.5 * qml.X(3)),
}


def _sparse_hamiltonian():
    with qml.QueuingManager.stop_recording():  # h itself must not become a tape operation
        h = qml.Hamiltonian(
            [0.5, -0.2, 1.3, 0.7],
            [qml.X("a") @ qml.Z(0), qml.Y(3), qml.Z("q1") @ qml.Z("z"), qml.X("z")],
        )
    order = ["z", 0, "a", "q1", 3]  # not the device order
    return qml.SparseHamiltonian(h.sparse_matrix(wire_order=order), wires=order)


OBSERVABLES["sparse_hamiltonian"] = _sparse_hamiltonian


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64], ids=["c128", "c64"])
@pytest.mark.parametrize("name", list(OBSERVABLES))
def test_expval_analytic(name, dtype):
    result, expected = both(lambda: qml.expval(OBSERVABLES[name]()), dtype=dtype)
    assert np.shape(result) == ()
    assert np.asarray(result).dtype == np.float64
    assert_allclose_nested(result, expected, atol=TOL[dtype] * 10)


@pytest.mark.parametrize("name", [n for n in OBSERVABLES if n != "sparse_hamiltonian"])
def test_var_analytic(name):
    result, expected = both(lambda: qml.var(OBSERVABLES[name]()))
    assert np.shape(result) == ()
    assert_allclose_nested(result, expected, atol=1e-10)


def test_var_sparse_hamiltonian():
    """default.qubit has no analytic var of a SparseHamiltonian: compare with the dense sum."""
    sparse = OBSERVABLES["sparse_hamiltonian"]
    with qml.QueuingManager.stop_recording():
        dense = qml.Hamiltonian(
            [0.5, -0.2, 1.3, 0.7],
            [qml.X("a") @ qml.Z(0), qml.Y(3), qml.Z("q1") @ qml.Z("z"), qml.X("z")],
        )
    dev, ref = make_devices(W)

    def circuit(obs_fn):
        prepare()
        return qml.var(obs_fn()), qml.expval(obs_fn())

    result = qml.QNode(circuit, dev)(sparse)
    expected = qml.QNode(circuit, ref)(lambda: dense)
    assert_allclose_nested(result, expected, atol=1e-10)
    assert result[0] > 0.1


def test_observable_values_are_not_trivial():
    """Guard: the prepared state gives non-trivial expectation values (not all 0 or 1)."""
    values = [both(lambda n=n: qml.expval(OBSERVABLES[n]()))[1] for n in ("X", "word2", "sum")]
    assert all(0.01 < abs(v) < 0.99 for v in values[:2])


@pytest.mark.parametrize(
    "wires", [None, ["a"], [0, "a"], ["z", "q1", 3], [3, "z", "a", 0], W[::-1]], ids=str
)
def test_probs_wires(wires):
    result, expected = both(lambda: qml.probs(wires=wires))
    assert result.shape == expected.shape
    assert_allclose_nested(result, expected, atol=1e-10)
    np.testing.assert_allclose(result.sum(), 1.0, atol=1e-12)


@pytest.mark.parametrize(
    "obs",
    [
        lambda: qml.X("a"),
        lambda: qml.Y(3) @ qml.Hadamard("z"),
        lambda: qml.Hermitian(_H2, wires=[0, "q1"]),
        lambda: qml.Projector(_PSI, wires=["z", "a"]),
    ],
    ids=["X", "Y@H", "hermitian", "projector_state"],
)
def test_probs_of_observable(obs):
    result, expected = both(lambda: qml.probs(op=obs()))
    assert_allclose_nested(result, expected, atol=1e-10)


def test_state():
    result, expected = both(qml.state)
    assert result.dtype == np.complex128 and result.shape == (32,)
    assert_allclose_nested(result, expected, atol=1e-10)


@pytest.mark.parametrize("wires", [["a"], [0, "z"], ["q1", "a", 3], W], ids=str)
def test_density_matrix(wires):
    result, expected = both(lambda: qml.density_matrix(wires=wires))
    assert result.shape == (2 ** len(wires),) * 2
    assert_allclose_nested(result, expected, atol=1e-10)


def test_several_measurements_in_one_circuit():
    def measure():
        return (
            qml.expval(qml.X("a") @ qml.Y(3)),
            qml.var(qml.Hermitian(_H1, wires="q1")),
            qml.probs(wires=[0, "a"]),
            qml.expval(OBSERVABLES["hamiltonian"]()),
            qml.expval(qml.Z("a")),  # overlaps the first one
            qml.state(),
            qml.density_matrix(wires=["z"]),
            qml.var(qml.X("z") + qml.Z("z")),
        )

    result, expected = both(measure)
    assert isinstance(result, tuple) and len(result) == 8
    assert_allclose_nested(result, expected, atol=1e-10)


def test_measurement_on_unused_device_wire():
    dev, ref = make_devices(W)

    def circuit():
        qml.RX(0.4, wires="a")
        return qml.expval(qml.Z("z")), qml.probs(wires=["a", "z"]), qml.state()

    assert_allclose_nested(qml.QNode(circuit, dev)(), qml.QNode(circuit, ref)(), 1e-10)


# --- finite shots ---------------------------------------------------------------------

SHOTS = 20000
STAT_TOL = 0.05


def _assert_counts_close(result: dict, expected: dict, shots: int):
    assert set(result) == set(expected)
    assert sum(result.values()) == shots
    for key in expected:
        assert abs(result[key] - expected[key]) / shots < STAT_TOL


def _assert_same_types(result, expected):
    """Same nesting, shapes and dtypes (dict keys' types too)."""
    assert_same_structure(result, expected)
    if isinstance(expected, dict):
        assert {type(k) for k in result} == {type(k) for k in expected}
        assert {type(v) for v in result.values()} == {type(v) for v in expected.values()}
    elif isinstance(expected, (tuple, list)):
        for r, e in zip(result, expected, strict=True):
            _assert_same_types(r, e)
    else:
        assert np.asarray(result).dtype == np.asarray(expected).dtype


@pytest.mark.parametrize("wires", [None, ["a"], [3, "a"], ["z", 0, "q1"]], ids=lambda w: str(w))
def test_sample_wires(wires):
    result, expected = both(lambda: qml.sample(wires=wires), shots=SHOTS, seed=10)
    _assert_same_types(result, expected)
    n = len(wires) if wires else len(W)
    assert result.shape == (SHOTS, n)
    assert set(np.unique(result)) <= {0, 1}
    np.testing.assert_allclose(result.mean(axis=0), expected.mean(axis=0), atol=STAT_TOL)


@pytest.mark.parametrize(
    "obs",
    [
        "Z",
        "X",
        "Y",
        "H",
        "word2",
        "word4",
        "hermitian1",
        "hermitian2",
        "projector_basis",
        "projector_state",
        "prod",
    ],
)
def test_sample_observable(obs):
    result, expected = both(lambda: qml.sample(OBSERVABLES[obs]()), shots=SHOTS, seed=11)
    _assert_same_types(result, expected)
    assert result.shape == (SHOTS,)
    np.testing.assert_allclose(np.unique(result), np.unique(expected), atol=1e-8)
    assert abs(result.mean() - expected.mean()) < STAT_TOL * max(1, np.abs(expected).max())


@pytest.mark.parametrize("wires", [None, ["q1"], [0, "a", "z"]], ids=lambda w: str(w))
def test_counts_wires(wires):
    result, expected = both(lambda: qml.counts(wires=wires), shots=SHOTS, seed=12)
    _assert_same_types(result, expected)
    _assert_counts_close(result, expected, SHOTS)


def test_counts_all_outcomes():
    result, expected = both(
        lambda: qml.counts(wires=["a", 0], all_outcomes=True), shots=SHOTS, seed=12
    )
    assert list(result) == list(expected) == ["00", "01", "10", "11"]
    _assert_counts_close(result, expected, SHOTS)


@pytest.mark.parametrize("obs", ["X", "word4", "hermitian2", "projector_basis", "prod"])
def test_counts_observable(obs):
    result, expected = both(lambda: qml.counts(OBSERVABLES[obs]()), shots=SHOTS, seed=13)
    _assert_same_types(result, expected)
    _assert_counts_close(
        {round(float(k), 8): v for k, v in result.items()},
        {round(float(k), 8): v for k, v in expected.items()},
        SHOTS,
    )


SAMPLED_OBSERVABLES = [
    "Z",
    "X",
    "Y",
    "H",
    "I",
    "word2",
    "word5",
    "hermitian1",
    "hermitian2",
    "projector_basis",
    "projector_state",
    "sprod",
    "prod",
    "prod_hermitian",
]
SAMPLED_SUMS = [
    "sum",
    "linear_combination",
    "hamiltonian",
    "hamiltonian_with_identity",
    "nested_sum_with_identity",
]


def _check_sampled_against_analytic(kind, obs, seed):
    def measure():
        return kind(OBSERVABLES[obs]())

    result, expected = both(measure, shots=SHOTS, seed=seed)
    analytic, _ = both(measure)
    _assert_same_types(result, expected)
    variance = float(both(lambda: qml.var(OBSERVABLES[obs]()))[1])
    if kind is qml.var:  # the spread of a variance estimate scales with the 4th moment
        variance = variance * max(1.0, float(np.abs(qml.matrix(OBSERVABLES[obs]())).max())) ** 2
    scale = max(1.0, 2 * variance**0.5)
    assert abs(result - analytic) < STAT_TOL * scale
    assert abs(expected - analytic) < STAT_TOL * scale


@pytest.mark.parametrize("obs", SAMPLED_OBSERVABLES + SAMPLED_SUMS)
def test_expval_shots(obs):
    _check_sampled_against_analytic(qml.expval, obs, seed=14)


@pytest.mark.parametrize("obs", [o for o in SAMPLED_OBSERVABLES if o != "I"])
def test_var_shots(obs):
    _check_sampled_against_analytic(qml.var, obs, seed=14)


@pytest.mark.parametrize("obs", SAMPLED_SUMS)
def test_var_of_sum_with_shots(obs):
    """A variance needs its observable whole: it is not split term by term like an
    expectation value, and its estimate matches the analytic value."""
    _check_sampled_against_analytic(qml.var, obs, seed=14)


def test_var_of_identity_with_shots():
    """var(Identity) is 0 with shots: an Identity must not become a constant offset of 1,
    which is right for an expectation value only."""
    result, expected = both(lambda: qml.var(qml.Identity("a")), shots=100, seed=1)
    assert expected == 0.0
    assert result == 0.0


def test_expval_and_var_together_with_shots():
    def measure():
        return qml.expval(qml.X("a") @ qml.Z(3)), qml.var(qml.Hermitian(_H2, wires=["z", 0]))

    result, expected = both(measure, shots=SHOTS, seed=21)
    analytic, _ = both(measure)
    _assert_same_types(result, expected)
    assert abs(result[0] - analytic[0]) < STAT_TOL
    assert abs(result[1] - analytic[1]) < STAT_TOL * max(1, np.abs(_H2).max() ** 2)


@pytest.mark.parametrize("wires", [None, ["z"], ["q1", "a"], [0, "z", 3]], ids=str)
def test_probs_shots(wires):
    result, expected = both(lambda: qml.probs(wires=wires), shots=SHOTS, seed=15)
    analytic, _ = both(lambda: qml.probs(wires=wires))
    _assert_same_types(result, expected)
    np.testing.assert_allclose(result, analytic, atol=STAT_TOL / 2)
    np.testing.assert_allclose(result.sum(), 1.0, atol=1e-12)


def test_probs_of_observable_shots():
    result, expected = both(lambda: qml.probs(op=qml.X("a") @ qml.Y(0)), shots=SHOTS, seed=16)
    analytic, _ = both(lambda: qml.probs(op=qml.X("a") @ qml.Y(0)))
    _assert_same_types(result, expected)
    np.testing.assert_allclose(result, analytic, atol=STAT_TOL / 2)


def test_several_sampled_measurements_with_non_commuting_observables():
    def measure():
        return (
            qml.expval(qml.X("a")),
            qml.expval(qml.Z("a")),
            qml.sample(wires=[3]),
            qml.counts(qml.Y("z")),
            qml.probs(wires=["q1", 0]),
            qml.var(qml.Hermitian(_H1, wires="q1")),
        )

    def measure_analytic():
        return (
            qml.expval(qml.X("a")),
            qml.expval(qml.Z("a")),
            qml.probs(wires=[3]),
            qml.probs(wires=["q1", 0]),
            qml.var(qml.Hermitian(_H1, wires="q1")),
        )

    result, expected = both(measure, shots=SHOTS, seed=17)
    analytic, _ = both(measure_analytic)
    _assert_same_types(result, expected)
    assert abs(result[0] - analytic[0]) < STAT_TOL
    assert abs(result[1] - analytic[1]) < STAT_TOL
    assert abs(result[2].mean() - analytic[2][1]) < STAT_TOL
    assert set(result[3]) == set(expected[3])
    np.testing.assert_allclose(result[4], analytic[3], atol=STAT_TOL)
    assert abs(result[5] - analytic[4]) < STAT_TOL * 4


SHOT_VECTOR = [100, (10, 3), 1000]


def test_shot_vector_nesting():
    def measure():
        return (
            qml.expval(qml.X("a") @ qml.Z(3)),
            qml.sample(wires=["z", 0]),
            qml.probs(wires=["q1"]),
            qml.counts(wires=["a"]),
            qml.var(qml.Y("z")),
            qml.sample(qml.Hermitian(_H1, wires=3)),
        )

    result, expected = both(measure, shots=SHOT_VECTOR, seed=18)
    _assert_same_types(result, expected)
    assert len(result) == 5
    assert [r[1].shape[0] for r in result] == [100, 10, 10, 10, 1000]


def test_shot_vector_single_measurement():
    result, expected = both(lambda: qml.sample(wires=[3]), shots=SHOT_VECTOR, seed=19)
    _assert_same_types(result, expected)
    assert [r.shape for r in result] == [(100, 1), (10, 1), (10, 1), (10, 1), (1000, 1)]
    result, expected = both(lambda: qml.expval(qml.Z(3)), shots=SHOT_VECTOR, seed=19)
    _assert_same_types(result, expected)
    assert isinstance(result, tuple) and len(result) == 5


def test_sample_reproducible_with_seed():
    def measure():
        return qml.sample(wires=W), qml.expval(qml.X("a"))

    first, _ = both(measure, shots=500, seed=1234)
    second, _ = both(measure, shots=500, seed=1234)
    other, _ = both(measure, shots=500, seed=4321)
    np.testing.assert_array_equal(first[0], second[0])
    assert first[1] == second[1]
    assert not np.array_equal(first[0], other[0])


def test_same_device_draws_new_samples_each_run():
    dev = qml.device("custatevec.qubit", wires=W, seed=1234)

    @qml.set_shots(shots=500)
    @qml.qnode(dev)
    def circuit():
        prepare()
        return qml.sample(wires=W)

    a, b = circuit(), circuit()
    assert a.shape == b.shape == (500, 5)
    assert not np.array_equal(a, b)


def test_seed_generator_accepted():
    dev1 = qml.device("custatevec.qubit", wires=W, seed=np.random.default_rng(99))
    dev2 = qml.device("custatevec.qubit", wires=W, seed=np.random.default_rng(99))
    results = []
    for d in (dev1, dev2):
        node = qml.set_shots(qml.QNode(lambda: (prepare(), qml.sample(wires=W))[1], d), shots=50)
        results.append(node())
    np.testing.assert_array_equal(*results)


def test_sparse_hamiltonian_matches_dense():
    """SparseHamiltonian and the equivalent Pauli sum agree on custatevec alone."""
    h = qml.Hamiltonian([0.4, -1.2], [qml.X("a") @ qml.Y(0), qml.Z("q1")])
    sparse = qml.SparseHamiltonian(scipy.sparse.csr_matrix(h.sparse_matrix(wire_order=W)), W)
    dev = qml.device("custatevec.qubit", wires=W)

    @qml.qnode(dev)
    def circuit():
        prepare()
        return qml.expval(sparse), qml.expval(h)

    a, b = circuit()
    assert abs(a - b) < 1e-10
