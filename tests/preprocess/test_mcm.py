"""Mid-circuit measurements on custatevec.qubit against default.qubit.

Statistics of the one-shot method are checked against default.qubit's exact (deferred,
analytic) values; default.qubit's own one-shot runs (slow: a Python loop per shot) are used
with few shots, for the nesting, shapes, dtypes and keys of the results only.
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from conftest import assert_allclose_nested, assert_same_structure, make_devices

W = ["q0", "q1", "q2", 7, 8, 9]  # 8 and 9: the wires the deferred method adds
PARAMS = np.array([1.4, 2.1, 1.3, 0.7, -0.9])
SHOTS = 5000
STAT_TOL = 0.05


def body(x, postselect=None):
    """A circuit with two measurements, a reset, and conditionals of every kernel kind."""
    qml.RX(x[0], "q0")
    qml.RY(x[1], "q1")
    qml.CNOT(["q0", "q1"])
    qml.Hadamard("q2")
    m0 = qml.measure("q0", postselect=postselect)
    qml.cond(m0, qml.RY)(x[2], wires="q2")  # Pauli rotation
    qml.cond(~m0, qml.PauliX)("q1")  # Pauli
    m1 = qml.measure("q1", reset=True)
    qml.cond(m0 & m1, qml.Hadamard)("q1")  # dense matrix
    qml.cond(m1, qml.PhaseShift)(x[3], wires="q2")  # diagonal
    qml.cond(m0 + m1 == 1, qml.CRX)(x[4], wires=["q2", 7])  # two-qubit matrix
    qml.cond(m1, qml.RX, qml.RZ)(x[4], wires="q0")  # with a false branch
    qml.Hadamard("q2")
    return m0, m1


def _node(dev, measure, method, shots=None, postselect=None, postselect_mode=None):
    def circuit(x):
        m0, m1 = body(x, postselect)
        return measure(m0, m1)

    kwargs = {"mcm_method": method}
    if postselect_mode is not None:
        kwargs["postselect_mode"] = postselect_mode
    node = qml.QNode(circuit, dev, **kwargs)
    return qml.set_shots(node, shots=shots) if shots is not None else node


def exact(measure, postselect=None):
    """default.qubit's exact result (deferred measurements, analytic)."""
    ref = qml.device("default.qubit", wires=W)
    return _node(ref, measure, "deferred", postselect=postselect)(PARAMS)


def analytic_measurements(m0, m1):
    return (
        qml.expval(qml.Z("q2")),
        qml.probs(wires=["q1", "q2"]),
        qml.expval(m0),
        qml.probs(op=m1),
        qml.var(qml.X(7)),
        qml.expval(qml.Y("q0") @ qml.Z(7)),
    )


def deferred_measurements(m0, m1):
    """analytic_measurements without expval/var of a measurement value."""
    return (
        qml.expval(qml.Z("q2")),
        qml.probs(wires=["q1", "q2"]),
        qml.probs(op=m0),
        qml.probs(op=m1),
        qml.var(qml.X(7)),
        qml.expval(qml.Y("q0") @ qml.Z(7)),
        qml.probs(op=[m0, m1]),
    )


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64], ids=["c128", "c64"])
def test_deferred_analytic(dtype):
    dev, _ = make_devices(W, c_dtype=dtype)
    result = _node(dev, deferred_measurements, "deferred")(PARAMS)
    expected = exact(deferred_measurements)
    assert_allclose_nested(result, expected, atol=1e-10 if dtype == np.complex128 else 1e-5)
    assert 0.05 < result[2][1] < 0.95  # the measurement is not deterministic


def test_deferred_default_method_without_shots():
    """Without shots, mcm_method=None runs (deferred) and matches default.qubit."""
    dev, _ = make_devices(W)
    result = _node(dev, deferred_measurements, None)(PARAMS)
    assert_allclose_nested(result, exact(deferred_measurements), atol=1e-10)


@pytest.mark.parametrize(
    "measure",
    [
        lambda m0, m1: qml.expval(m0),
        lambda m0, m1: qml.var(m1),
        lambda m0, m1: qml.expval(2 * m0 + m1),
    ],
    ids=["expval_m0", "var_m1", "expval_2m0_plus_m1"],
)
def test_deferred_analytic_expval_var_of_measurement_value(measure):
    """Analytic expval / var of a mid-circuit measurement value (an ExpectationMP or
    VarianceMP without an observable) weight its eigenvalues by their probabilities."""
    dev, _ = make_devices(W)
    result = _node(dev, measure, "deferred")(PARAMS)
    assert_allclose_nested(result, exact(measure), atol=1e-10)


def test_deferred_with_shots():
    def measure(m0, m1):
        return qml.expval(qml.Z("q2")), qml.probs(wires=["q1", "q2"]), qml.sample(wires=[7])

    dev, ref = make_devices(W, seed=21)
    result = _node(dev, measure, "deferred", shots=SHOTS)(PARAMS)
    expected = _node(ref, measure, "deferred", shots=SHOTS)(PARAMS)
    assert_same_structure(result, expected)
    exact_values = exact(
        lambda m0, m1: (
            qml.expval(qml.Z("q2")),
            qml.probs(wires=["q1", "q2"]),
            qml.probs(wires=[7]),
        )
    )
    assert abs(result[0] - exact_values[0]) < STAT_TOL
    np.testing.assert_allclose(result[1], exact_values[1], atol=STAT_TOL)
    assert result[2].shape == (SHOTS, 1) and result[2].dtype == expected[2].dtype
    assert abs(result[2].mean() - exact_values[2][1]) < STAT_TOL


def deferred_mv_measurements(m0, m1):
    return qml.sample(m0), qml.counts(m1), qml.probs(op=m0), qml.expval(m1)


def test_deferred_with_shots_measurement_values():
    """With deferred measurements and shots, the wires that hold measurement values are
    sampled like any other wire the measurements read."""
    dev, ref = make_devices(W, seed=22)
    result = _node(dev, deferred_mv_measurements, "deferred", shots=SHOTS)(PARAMS)
    expected = _node(ref, deferred_mv_measurements, "deferred", shots=SHOTS)(PARAMS)
    assert_same_structure(result, expected)
    reference = exact(lambda m0, m1: (qml.probs(op=m0), qml.probs(op=m1)))
    assert result[0].shape == (SHOTS,) and result[0].dtype == expected[0].dtype
    assert abs(result[0].mean() - reference[0][1]) < STAT_TOL
    assert set(result[1]) == set(expected[1])
    assert abs(result[1][1] / SHOTS - reference[1][1]) < STAT_TOL
    np.testing.assert_allclose(result[2], reference[0], atol=STAT_TOL)
    assert abs(result[3] - reference[1][1]) < STAT_TOL


def mcm_measurements(m0, m1):
    return (
        qml.expval(qml.Z("q2")),
        qml.probs(wires=["q1", "q2"]),
        qml.expval(m0),
        qml.sample(m1),
        qml.probs(op=m1),
        qml.counts(m0),
        qml.var(qml.X(7)),
        qml.sample(wires=["q2", "q0"]),
        qml.counts(wires=["q1"]),
    )


def _check_one_shot_statistics(result, postselect=None):
    reference = exact(analytic_measurements, postselect=postselect)
    n = len(result[3])
    assert abs(result[0] - reference[0]) < STAT_TOL
    np.testing.assert_allclose(result[1], reference[1], atol=STAT_TOL)
    assert abs(result[2] - reference[2]) < STAT_TOL
    assert abs(result[3].mean() - reference[3][1]) < STAT_TOL
    np.testing.assert_allclose(result[4], reference[3], atol=STAT_TOL)
    assert sum(result[5].values()) == n
    assert abs(result[5].get(1, 0) / n - reference[2]) < STAT_TOL
    assert abs(result[6] - reference[4]) < STAT_TOL * 2
    q2_probs = reference[1][[0, 2]].sum(), reference[1][[1, 3]].sum()
    assert abs(result[7][:, 0].mean() - q2_probs[1]) < STAT_TOL
    q1_one = reference[1][2] + reference[1][3]
    assert abs(result[8].get("1", 0) / n - q1_one) < STAT_TOL


def _assert_same_types(result, expected):
    assert_same_structure(
        [np.asarray(r)[:0] if isinstance(r, np.ndarray) and r.ndim else r for r in result],
        [np.asarray(e)[:0] if isinstance(e, np.ndarray) and e.ndim else e for e in expected],
    )
    for r, e in zip(result, expected, strict=True):
        if isinstance(e, dict):
            assert {type(k) for k in r} == {type(k) for k in e}
        else:
            assert np.asarray(r).dtype == np.asarray(e).dtype
            assert np.ndim(r) == np.ndim(e)


def test_one_shot_statistics():
    dev, _ = make_devices(W, seed=31)
    result = _node(dev, mcm_measurements, "one-shot", shots=SHOTS)(PARAMS)
    assert result[3].shape == (SHOTS,)
    assert result[7].shape == (SHOTS, 2)
    _check_one_shot_statistics(result)


def test_one_shot_result_types_match_default_qubit():
    dev, ref = make_devices(W, seed=32)
    result = _node(dev, mcm_measurements, "one-shot", shots=40)(PARAMS)
    expected = _node(ref, mcm_measurements, "one-shot", shots=40)(PARAMS)
    assert_same_structure(result, expected)
    _assert_same_types(result, expected)


def test_one_shot_reproducible_with_seed():
    runs = []
    for seed in (1234, 1234, 999):
        dev, _ = make_devices(W, seed=seed)
        runs.append(_node(dev, lambda m0, m1: qml.sample(m0), "one-shot", shots=300)(PARAMS))
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])


def test_one_shot_shot_vector():
    def measure(m0, m1):
        return qml.sample(m0), qml.expval(qml.Z("q2"))

    dev, ref = make_devices(W, seed=33)
    result = _node(dev, measure, "one-shot", shots=[20, (5, 2)])(PARAMS)
    expected = _node(ref, measure, "one-shot", shots=[20, (5, 2)])(PARAMS)
    assert_same_structure(result, expected)
    assert [r[0].shape for r in result] == [(20,), (5,), (5,)]


def test_one_shot_default_method_with_shots():
    """With shots and mcm_method=None the device picks a method that gives right statistics."""
    dev, _ = make_devices(W, seed=34)
    result = _node(dev, analytic_measurements, None, shots=SHOTS)(PARAMS)
    expected = exact(analytic_measurements)
    assert abs(result[0] - expected[0]) < STAT_TOL
    assert abs(result[2] - expected[2]) < STAT_TOL


@pytest.mark.parametrize("postselect", [0, 1])
def test_one_shot_postselect_hw_like(postselect):
    dev, _ = make_devices(W, seed=40 + postselect)
    node = _node(dev, mcm_measurements, "one-shot", SHOTS, postselect, "hw-like")
    result = node(PARAMS)
    p_keep = exact(lambda m0, m1: qml.probs(op=m0))[postselect]
    kept = len(result[3])
    # hw-like keeps only the shots whose measurement gave the postselected value
    assert abs(kept / SHOTS - p_keep) < STAT_TOL
    assert result[7].shape == (kept, 2)
    assert np.all(result[2] == postselect)
    assert set(result[5]) == {postselect}
    _check_one_shot_statistics(result, postselect=postselect)


@pytest.mark.parametrize("postselect", [0, 1])
def test_one_shot_postselect_fill_shots_is_refused(postselect):
    """One-shot cannot fill the shots a postselection discards: the mode is refused with
    an error naming it and the alternatives, as default.qubit does, never silently run
    as "hw-like"."""
    dev, _ = make_devices(W, seed=50 + postselect)
    node = _node(dev, mcm_measurements, "one-shot", SHOTS, postselect, "fill-shots")
    with pytest.raises(qml.exceptions.DeviceError, match="fill-shots.*deferred.*hw-like"):
        node(PARAMS)


def test_one_shot_conditional_on_several_measurements_exactly():
    """Deterministic circuit: conditionals must act exactly on the selected shots."""
    dev, _ = make_devices(W, seed=60)

    def circuit():
        qml.Hadamard("q0")
        m0 = qml.measure("q0")
        qml.cond(m0, qml.PauliX)("q1")  # q1 copies m0
        qml.cond(m0, qml.GlobalPhase)(0.3)
        m1 = qml.measure("q1", reset=True)
        qml.cond(m1, qml.PauliX)("q2")  # q2 copies m0 too
        qml.cond(~m1, qml.RX)(np.pi, wires=7)  # q7 = not m0
        return qml.sample(m0), qml.sample(wires=["q1", "q2", 7])

    node = qml.set_shots(qml.QNode(circuit, dev, mcm_method="one-shot"), shots=500)
    m0, bits = node()
    assert 100 < m0.sum() < 400
    np.testing.assert_array_equal(bits[:, 0], 0)  # reset
    np.testing.assert_array_equal(bits[:, 1], m0)
    np.testing.assert_array_equal(bits[:, 2], 1 - m0)


def test_unsupported_mcm_method_is_refused_naming_the_supported_ones():
    """mcm_method="device" (a device's own method) is refused naming the three this
    device runs (tree-traversal: tests/preprocess/test_tree_traversal.py)."""
    dev = qml.device("custatevec.qubit", wires=W)

    @qml.set_shots(shots=10)
    @qml.qnode(dev, mcm_method="device")
    def circuit():
        qml.Hadamard("q0")
        m = qml.measure("q0")
        return qml.expval(m)

    with pytest.raises(
        qml.exceptions.QuantumFunctionError, match='"one-shot", "tree-traversal", "deferred"'
    ):
        circuit()


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64], ids=["c128", "c64"])
@pytest.mark.parametrize("postselect", [0, 1])
def test_deferred_postselect_analytic(postselect, dtype):
    dev, _ = make_devices(W, c_dtype=dtype)
    result = _node(dev, deferred_measurements, "deferred", postselect=postselect)(PARAMS)
    expected = exact(deferred_measurements, postselect=postselect)
    assert_allclose_nested(result, expected, atol=1e-10 if dtype == np.complex128 else 1e-5)
    np.testing.assert_allclose(result[2][postselect], 1.0, atol=1e-6)


def test_deferred_postselect_impossible_gives_nan():
    dev, ref = make_devices(W)

    def circuit():
        qml.PauliX("q0")
        qml.measure("q0", postselect=0)
        return qml.expval(qml.Z("q1")), qml.probs(wires=["q1"])

    result = qml.QNode(circuit, dev, mcm_method="deferred")()
    expected = qml.QNode(circuit, ref, mcm_method="deferred")()
    assert_same_structure(result, expected)
    assert np.all(np.isnan(result[0])) and np.all(np.isnan(result[1]))
    assert np.all(np.isnan(expected[0]))


@pytest.mark.parametrize("mode", ["hw-like", "fill-shots"])
@pytest.mark.parametrize("postselect", [0, 1])
def test_deferred_postselect_with_shots(postselect, mode):
    def measure(m0, m1):
        return qml.expval(qml.Z("q2")), qml.probs(wires=["q1", "q2"]), qml.sample(wires=["q2"])

    dev, ref = make_devices(W, seed=70 + postselect)
    result = _node(dev, measure, "deferred", SHOTS, postselect, mode)(PARAMS)
    expected = _node(ref, measure, "deferred", SHOTS, postselect, mode)(PARAMS)
    assert_same_structure(result[:2], expected[:2])
    reference = exact(
        lambda m0, m1: (qml.expval(qml.Z("q2")), qml.probs(wires=["q1", "q2"]), qml.probs(op=m0)),
        postselect=postselect,
    )
    assert abs(result[0] - reference[0]) < STAT_TOL
    np.testing.assert_allclose(result[1], reference[1], atol=STAT_TOL)
    kept = result[2].shape[0]
    if mode == "fill-shots":
        assert kept == SHOTS == expected[2].shape[0]
    else:
        p_keep = exact(lambda m0, m1: qml.probs(op=m0))[postselect]
        assert abs(kept / SHOTS - p_keep) < STAT_TOL
        assert abs(expected[2].shape[0] / SHOTS - p_keep) < STAT_TOL


def test_one_shot_without_shots_is_rejected():
    dev = qml.device("custatevec.qubit", wires=W)

    @qml.qnode(dev, mcm_method="one-shot")
    def circuit():
        qml.Hadamard("q0")
        return qml.expval(qml.measure("q0"))

    with pytest.raises(ValueError, match="one-shot"):
        circuit()


def _postselecting(x):
    """``x[0]`` changes the postselection's probability and reaches the measured wire:
    the result N(x) / D(x) has a denominator that depends on it."""
    qml.RY(x[0], "q0")
    qml.RY(0.3, "q1")
    qml.CNOT(["q0", "q1"])
    m0 = qml.measure("q1", postselect=1)
    qml.cond(m0, qml.RY)(x[1], wires="q2")
    qml.RX(x[2], "q2")
    return qml.expval(qml.Z("q0")), qml.expval(qml.Y("q2"))


def _postselection_reached_by_x_alone(x):
    """PennyLane issue #5943's circuit: ``x[0]`` changes the postselection's probability,
    and so <Z0>, but reaches no measured wire."""
    qml.Hadamard("q0")
    qml.CNOT(["q0", "q1"])
    qml.RX(x[0], "q1")
    qml.measure("q1", postselect=1)
    qml.RX(x[1], "q0")
    return qml.expval(qml.Z("q0"))


TRANSFORMS = ["parameter-shift", "finite-diff", "spsa", "hadamard"]
SHIFT_RULES = ("parameter-shift", "hadamard")


@pytest.mark.parametrize("diff_method", TRANSFORMS)
@pytest.mark.parametrize(("mcm_method", "shots"), [("deferred", None), ("one-shot", 200)])
def test_wrong_gradient_transforms_of_a_postselecting_circuit_are_refused(
    diff_method, mcm_method, shots
):
    """PennyLane's gradient transforms give wrong derivatives of a circuit whose trainable
    gate changes a postselection's probability (conformance's
    ``test_gradient_transforms_are_wrong_on_postselection`` and
    ``test_shift_rules_are_wrong_where_a_parameter_reaches_the_postselection``): refused by
    name, with or without shots. Every transform where that gate reaches no measured wire
    (``_postselection_reached_by_x_alone``); parameter-shift and Hadamard also where it
    does (``_postselecting``'s ``x[0]``). The values of constant parameters are
    default.qubit's."""
    from pennylane import numpy as pnp
    from pennylane.exceptions import DeviceError

    device = qml.device("custatevec.qubit", wires=W, shots=shots, seed=11)
    circuits = [_postselection_reached_by_x_alone]
    if diff_method in SHIFT_RULES:
        circuits.append(_postselecting)
    for circuit in circuits:
        qnode = qml.QNode(circuit, device, diff_method=diff_method, mcm_method=mcm_method)
        trainable = pnp.array(PARAMS[:3], requires_grad=True)
        match = (
            r"parameter 0 \(R[XY] on wires \['q[01]'\]\) changes the "
            r"probability of the postselection on wire q1.*#5943"
        )
        if shots and diff_method == "parameter-shift" and circuit is _postselecting:
            # its conditional RY has no shift rule: with shots, the finite-difference
            # fallback is refused first (tests/preprocess/test_mcm_bases.py)
            match = r"would differentiate Conditional\(RY\) by finite differences"
        with pytest.raises(DeviceError, match=match):
            qml.jacobian(qnode)(trainable)
        if shots is None:
            reference = qml.QNode(circuit, qml.device("default.qubit", wires=W))
            np.testing.assert_allclose(qnode(PARAMS[:3]), reference(PARAMS[:3]), atol=1e-12)


def _stacked_jacobian(qnode, x):
    return qml.jacobian(lambda v: qml.math.stack(qnode(v)))(x)


@pytest.mark.parametrize("diff_method", ["finite-diff", "spsa"])
def test_value_differencing_transforms_of_a_postselecting_circuit(diff_method):
    """Finite differences and SPSA difference the values, which are right: where every
    trainable gate reaches a measured wire (``_postselecting``: RY(x[0]) also changes the
    postselection's probability), they run, and give default.qubit's backprop
    derivatives (finite differences to their truncation error; SPSA is a stochastic
    estimate, seeded, compared with default.qubit's SPSA of the same seed)."""
    from pennylane import numpy as pnp

    trainable = pnp.array(PARAMS[:3], requires_grad=True)
    device = qml.device("custatevec.qubit", wires=W)
    reference_device = qml.device("default.qubit", wires=W)
    if diff_method == "finite-diff":
        ours = qml.QNode(_postselecting, device, diff_method=diff_method)
        expected = _stacked_jacobian(qml.QNode(_postselecting, reference_device), trainable)
        tolerance = 1e-5
    else:
        kwargs = {"gradient_kwargs": {"sampler_rng": 5, "num_directions": 4}}
        ours = qml.QNode(_postselecting, device, diff_method=diff_method, **kwargs)
        reference = qml.QNode(_postselecting, reference_device, diff_method=diff_method, **kwargs)
        expected = _stacked_jacobian(reference, trainable)
        tolerance = 1e-10
    np.testing.assert_allclose(_stacked_jacobian(ours, trainable), expected, atol=tolerance)
    assert np.abs(expected[0][0]) > 0.1  # x[0] changes <Z0>: the check can fail


@pytest.mark.parametrize("diff_method", ["parameter-shift", "finite-diff"])
def test_gradient_transforms_without_postselection(diff_method):
    """The same circuit without postselection is differentiated by the transforms, as on
    default.qubit (SPSA is stochastic; PennyLane's Hadamard test needs generators, and a
    Conditional has none)."""
    from pennylane import numpy as pnp

    def without_postselection(x):
        qml.RX(x[0], "q0")
        qml.CNOT(["q0", "q1"])
        m0 = qml.measure("q1")
        qml.cond(m0, qml.RY)(x[1], wires="q2")
        qml.RX(x[2], "q2")
        return qml.expval(qml.Z("q0") @ qml.X("q2"))

    trainable = pnp.array(PARAMS[:3], requires_grad=True)
    device = qml.device("custatevec.qubit", wires=W)
    ours = qml.QNode(without_postselection, device, diff_method=diff_method)
    reference = qml.QNode(without_postselection, qml.device("default.qubit", wires=W))
    tolerance = 1e-5 if diff_method == "finite-diff" else 1e-10
    np.testing.assert_allclose(
        qml.jacobian(ours)(trainable), qml.jacobian(reference)(trainable), atol=tolerance
    )


@pytest.mark.parametrize("interface", ["autograd", "torch", "jax"])
def test_forward_evaluation_of_a_postselecting_circuit_under_a_gradient_transform(interface):
    """A postselecting circuit evaluated with trainable parameters but no derivative taken
    (autograd's ``requires_grad=True`` default, torch under ``no_grad``, jax without a
    transform) gives default.qubit's value under parameter-shift; its derivative is still
    refused (autograd's ``qml.jacobian``, torch's backward, ``jax.jacobian``)."""
    from pennylane.exceptions import DeviceError

    device = qml.device("custatevec.qubit", wires=W)
    qnode = qml.QNode(_postselection_reached_by_x_alone, device, diff_method="parameter-shift")
    reference = qml.QNode(_postselection_reached_by_x_alone, qml.device("default.qubit", wires=W))
    expected = reference(PARAMS[:2])
    refused = r"parameter 0 \(RX on wires \['q1'\]\) changes the probability.*#5943"
    if interface == "autograd":
        from pennylane import numpy as pnp

        x = pnp.array(PARAMS[:2], requires_grad=True)
        np.testing.assert_allclose(qnode(x), expected, atol=1e-12)
        with pytest.raises(DeviceError, match=refused):
            qml.jacobian(qnode)(x)
    elif interface == "torch":
        torch = pytest.importorskip("torch")

        x = torch.tensor(PARAMS[:2], requires_grad=True)
        with torch.no_grad():
            np.testing.assert_allclose(qnode(x).numpy(), expected, atol=1e-12)
        with pytest.raises(DeviceError, match=refused):
            qnode(x).backward()
    else:
        jax = pytest.importorskip("jax")
        jax.config.update("jax_enable_x64", True)

        x = jax.numpy.array(PARAMS[:2])
        np.testing.assert_allclose(qnode(x), expected, atol=1e-12)
        with pytest.raises(DeviceError, match=refused):
            jax.jacobian(qnode)(x)


def _projected(a, b, c):
    """A ``qml.Projector`` applied as a gate renormalises the state (here and on
    default.qubit): <Z0> does not depend on ``a`` and ``b`` where they are equal, but
    separately they change it (+-1.43 at 0.7); PennyLane's parameter-shift gives -0.07 and
    0, finite differences -1.43 and 0 (RX(b) reaches no measured wire and is skipped), on
    default.qubit."""
    qml.RY(a, "q0")
    qml.CNOT(["q0", "q1"])
    qml.RX(b, "q1")
    qml.Projector([1], wires="q1")
    qml.RX(c, "q0")
    return qml.expval(qml.Z("q0"))


@pytest.mark.parametrize(
    ("diff_method", "refused_parameter"),
    [
        ("parameter-shift", r"parameter 0 \(RY on wires \['q0'\]\)"),
        ("finite-diff", r"parameter 1 \(RX on wires \['q1'\]\)"),
    ],
)
def test_projector_gates_are_postselections_for_gradient_transforms(diff_method, refused_parameter):
    """A Projector gate's renormalisation breaks the gradient transforms as a
    postselection does: refused by name (default.qubit's numbers are asserted to be
    wrong, so the test notices a PennyLane fix), the value is default.qubit's, and with
    only the parameter after the Projector trainable the transform runs and is right."""
    from pennylane import numpy as pnp
    from pennylane.exceptions import DeviceError

    args = [pnp.array(0.7), pnp.array(0.7), pnp.array(0.4)]
    every = [0, 1, 2]
    device = qml.device("custatevec.qubit", wires=W)
    reference_device = qml.device("default.qubit", wires=W)
    ours = qml.QNode(_projected, device, diff_method=diff_method)
    backprop = qml.QNode(_projected, reference_device, diff_method="backprop")
    theirs = qml.QNode(_projected, reference_device, diff_method=diff_method)
    exact = np.array(qml.jacobian(backprop, argnums=every)(*args))
    wrong = np.array(qml.jacobian(theirs, argnums=every)(*args))
    assert np.max(np.abs(wrong[:2] - exact[:2])) > 0.3  # default.qubit's are wrong
    np.testing.assert_allclose(ours(*args), backprop(*args), atol=1e-12)
    match = refused_parameter + r" changes the probability of the postselection by the "
    with pytest.raises(DeviceError, match=match + r"Projector gate on wires \['q1'\]"):
        qml.jacobian(ours, argnums=every)(*args)

    constants = [pnp.array(0.7, requires_grad=False), pnp.array(0.7, requires_grad=False)]
    tolerance = 1e-6 if diff_method == "finite-diff" else 1e-10
    np.testing.assert_allclose(
        qml.grad(ours)(*constants, args[2]), qml.grad(backprop)(*constants, args[2]), atol=tolerance
    )
    assert abs(qml.grad(backprop)(*constants, args[2])) > 0.1


def _constant_reaches_postselection(x):
    """Only a constant gate (RY(0.3)) reaches the postselection: the postselection's
    probability does not depend on ``x``, and parameter-shift is right."""
    qml.Hadamard("q0")
    qml.RY(0.3, "q1")
    qml.CNOT(["q0", "q1"])
    qml.measure("q1", postselect=1)
    qml.RX(x, "q0")
    return qml.expval(qml.Z("q0"))


@pytest.mark.parametrize("interface", ["autograd", "torch", "jax", "jax-jit"])
def test_parameter_shift_where_only_constants_reach_the_postselection(interface):
    """The shifted circuits of parameter-shift mark every parameter trainable; a constant
    (a Python number) is not taken for a trainable one there: the derivative runs and is
    default.qubit's backprop derivative. Under ``jax.jit`` PennyLane makes the constant a
    jax value too: refused, naming jit."""
    device = qml.device("custatevec.qubit", wires=W)
    qnode = qml.QNode(_constant_reaches_postselection, device, diff_method="parameter-shift")
    backprop = qml.QNode(
        _constant_reaches_postselection,
        qml.device("default.qubit", wires=W),
        diff_method="backprop",
    )
    from pennylane import numpy as pnp

    expected = qml.grad(backprop)(pnp.array(0.5))
    assert abs(expected) > 0.1
    if interface == "autograd":
        derivative = qml.grad(qnode)(pnp.array(0.5))
    elif interface == "torch":
        torch = pytest.importorskip("torch")

        x = torch.tensor(0.5, requires_grad=True, dtype=torch.float64)
        qnode(x).backward()
        derivative = x.grad.numpy()
    else:
        jax = pytest.importorskip("jax")
        jax.config.update("jax_enable_x64", True)

        if interface == "jax":
            derivative = jax.grad(qnode)(jax.numpy.array(0.5))
        else:
            with pytest.raises(Exception, match="differentiate such a circuit without jax.jit"):
                jax.jit(jax.grad(qnode))(jax.numpy.array(0.5))
            return
    np.testing.assert_allclose(derivative, expected, atol=1e-10)


@pytest.mark.parametrize("postselect_mode", ["fill-shots", "hw-like"])
def test_jitted_samples_of_a_postselecting_circuit_run_with_best(postselect_mode):
    """A forward jax.jit of a sampled, postselecting circuit with "best" (parameter-shift,
    with shots): under jax.jit the device's preprocessing runs inside PennyLane's callback,
    where every parameter is a jax value, and the refusal of parameter-shift through a
    postselection refused this forward evaluation (PennyLane's
    test_defer_measurements_with_jit[best] and test_hw_like_with_jax[best-True], routed).
    Integer samples are not differentiated by any framework: the circuit runs, and its
    samples are default.qubit's in kind (every kept shot has the postselected value; under
    jax.jit "fill-shots" keeps all shots, "hw-like" marks the discarded ones)."""
    import jax

    shots = 100

    def circuit(x):
        qml.RX(x, 0)
        qml.measure(0, postselect=1)
        return qml.sample(wires=[0, 1])

    results = {}
    for name in ("custatevec.qubit", "default.qubit"):
        device = qml.device(name, wires=3, seed=jax.random.PRNGKey(5))
        qnode = qml.set_shots(
            qml.QNode(
                circuit,
                device,
                diff_method="best",
                mcm_method="deferred" if postselect_mode == "fill-shots" else None,
                postselect_mode=postselect_mode,
            ),
            shots=shots,
        )
        results[name] = np.asarray(jax.jit(qnode)(jax.numpy.array(np.pi / 2)))
    ours, theirs = results["custatevec.qubit"], results["default.qubit"]
    assert ours.shape == theirs.shape == (shots, 2)
    if postselect_mode == "fill-shots":
        assert np.all(ours[:, 0] == 1) and np.all(theirs[:, 0] == 1)
    else:
        discarded = ours[:, 0] == np.iinfo(np.int32).min
        assert 0 < discarded.sum() < shots
        assert np.all(ours[~discarded] == [1, 0])


# --- measured values differentiated by the adjoint method ------------------------------

MEASURED_VALUES = {
    "var(m0)": lambda m: qml.var(m[0]),
    "var(m0+2m1-m2)": lambda m: qml.var(m[0] + 2 * m[1] - m[2]),
    "expval(m0*m1),expval(Z)": lambda m: (qml.expval(m[0] * m[1]), qml.expval(qml.Z(1))),
    "expval(2.5*m2+0.5)": lambda m: qml.expval(2.5 * m[2] + 0.5),
    "probs([m0,m2])": lambda m: qml.probs(op=[m[0], m[2]]),
    "probs(m1),var(m1)": lambda m: (qml.probs(op=m[1]), qml.var(m[1])),
}


def _measured_values_circuit(returns, reset: bool, postselect):
    def circuit(x):
        qml.RX(x[0], 0)
        qml.CNOT([0, 1])
        m0 = qml.measure(0, reset=reset)
        qml.RY(x[1], 1)
        qml.cond(m0, qml.RZ)(x[2], 1)
        qml.RY(0.3, 1)
        m1 = qml.measure(1, postselect=postselect)
        qml.CRX(x[0] * 0.5, [1, 2])
        qml.RY(x[1], 0)
        m2 = qml.measure(2)
        return returns([m0, m1, m2])

    return circuit


def _flat_jacobian(qnode, interface: str):
    x = PARAMS[:3]
    if interface == "torch":
        import torch

        def flat(v):
            result = qnode(v)
            parts = result if isinstance(result, tuple) else (result,)
            return torch.hstack([torch.atleast_1d(p) for p in parts])

        t = torch.tensor(x, requires_grad=True)
        return flat(t).detach().numpy(), torch.autograd.functional.jacobian(flat, t).numpy()
    if interface == "jax-jit":
        import jax
        import jax.numpy as jnp

        def flat(v):
            result = qnode(v)
            parts = result if isinstance(result, tuple) else (result,)
            return jnp.hstack([jnp.atleast_1d(p) for p in parts])

        jacobian = jax.jit(jax.jacobian(flat))(jnp.array(x))
        return np.asarray(flat(jnp.array(x))), np.asarray(jacobian)
    from pennylane import numpy as pnp

    def flat(v):
        result = qnode(v)
        return qml.math.hstack(result if isinstance(result, tuple) else [result])

    v = pnp.array(x, requires_grad=True)
    return np.asarray(flat(v)), np.asarray(qml.jacobian(flat)(v))


@pytest.mark.parametrize("interface", ["autograd", "torch", "jax-jit"])
@pytest.mark.parametrize(("reset", "postselect"), [(False, None), (True, None), (False, 1)])
@pytest.mark.parametrize("returns", list(MEASURED_VALUES))
def test_measured_values_are_differentiated_by_adjoint(returns, reset, postselect, interface):
    """expval and var of functions of mid-circuit measurement values, and probs of bare
    ones, are measured on the deferred wires (a Z sentence, probs of wires) and
    differentiated by the adjoint method: "best" takes it (it took parameter-shift, which
    fails on var of a measured value with an AttributeError, on default.qubit too), and the
    values and Jacobians are default.qubit's backprop's."""
    if interface == "jax-jit":
        import jax

        jax.config.update("jax_enable_x64", True)
    circuit = _measured_values_circuit(MEASURED_VALUES[returns], reset, postselect)
    ours = qml.QNode(
        circuit,
        qml.device("custatevec.qubit", wires=6),  # 3, 4, 5: the deferred measurements'
        diff_method="best",
        interface=interface.replace("-jit", ""),
    )
    reference = qml.QNode(circuit, qml.device("default.qubit", wires=6), diff_method="backprop")
    config = qml.workflow.construct_execution_config(ours, resolve=True)(PARAMS[:3])
    assert config.gradient_method == "adjoint"
    got, want = _flat_jacobian(ours, interface), _flat_jacobian(reference, "autograd")
    np.testing.assert_allclose(got[0], want[0], atol=1e-10)
    np.testing.assert_allclose(got[1], want[1], atol=1e-9)
    if not (postselect is not None and returns == "probs(m1),var(m1)"):  # m1 is then 1
        assert np.max(np.abs(want[1])) > 1e-2


def test_a_diagonal_written_as_z_words_has_its_eigenvalues():
    from pennylane_custatevec.preprocess.mid_circuit import _diagonal_as_z_words

    rng = np.random.default_rng(4)
    for k in range(4):
        eigenvalues = rng.integers(-3, 4, 2**k).astype(float) * 0.5
        wires = qml.wires.Wires(["a", 3, "b", 0][:k])
        observable = _diagonal_as_z_words(eigenvalues, wires)
        matrix = (
            qml.matrix(observable, wire_order=wires)
            if k
            else np.eye(1) * float(observable.pauli_rep.get(qml.pauli.PauliWord({}), 0.0))
        )
        np.testing.assert_allclose(matrix, np.diag(eigenvalues), atol=1e-15)


def test_a_value_of_too_many_measurements_is_left_to_the_refusal():
    """Beyond MAX_MEASURED_VALUE_WIRES measurements (2**k Z words) the tape passes
    unchanged, and the adjoint method refuses it by name."""
    from pennylane_custatevec.preprocess.mid_circuit import (
        MAX_MEASURED_VALUE_WIRES,
        measure_mid_circuit_values_on_their_wires,
    )

    n = MAX_MEASURED_VALUE_WIRES + 1
    dev = qml.device("custatevec.qubit", wires=2 * n)

    def circuit(x):
        values = []
        for wire in range(n):
            qml.RX(x, wire)
            values.append(qml.measure(wire))
        return qml.expval(sum(values[1:], values[0]))

    tape = qml.workflow.construct_tape(qml.QNode(circuit, dev))(0.3)
    (deferred,), _ = qml.defer_measurements(tape)
    (same,), _ = measure_mid_circuit_values_on_their_wires(deferred)
    assert same is deferred
    small = deferred.copy(measurements=[qml.expval(deferred.measurements[0].mv)])
    assert len(small.measurements[0].wires) == n
