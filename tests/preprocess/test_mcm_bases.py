"""Mid-circuit measurements in other bases (``qml.ftqc``) and conditional gates under
PennyLane's gradient transforms.

* ``measure_x``, ``measure_y``, ``measure_arbitrary_basis`` and ``cond_measure`` run as
  default.qubit runs them after ``qml.ftqc.diagonalize_mcms`` (which PennyLane's
  documentation asks for before execution): the basis change, a Z-basis measurement, and
  the measured qubit left in the computational state of its outcome. Without the device's
  own diagonalization they were measured in the Z basis.
* A trainable measurement angle is differentiated by the adjoint method; PennyLane's
  gradient transforms do not see it (autograd returned 0), so they are refused by name.
* Parameter-shift with shots would differentiate a conditional gate by finite differences
  with a step of 1e-7 (shot noise / 1e-7, default.qubit alike): refused by name.
"""

from __future__ import annotations

import functools

import numpy as np
import pennylane as qml
import pytest
from pennylane import numpy as pnp
from pennylane.exceptions import DeviceError
from pennylane.ftqc import (
    ParametricMidMeasure,
    cond_measure,
    diagonalize_mcms,
    measure_arbitrary_basis,
    measure_x,
    measure_y,
    measure_z,
)

from pennylane_custatevec.preprocess.mid_circuit import measure_in_computational_bases
from pennylane_custatevec.preprocess.refusals import (
    DifferentiatedMeasurementBasisError,
    ShotNoiseFallbackError,
)

BASES = {
    "x": measure_x,
    "y": measure_y,
    "xy": functools.partial(measure_arbitrary_basis, angle=0.3, plane="XY"),
    "yz": functools.partial(measure_arbitrary_basis, angle=-1.1, plane="YZ"),
    "zx": functools.partial(measure_arbitrary_basis, angle=2.2, plane="ZX"),
}


def _basis_circuit(measure, reset=False, postselect=None):
    def circuit():
        qml.RY(0.9, 0)
        qml.RX(0.4, 1)
        qml.CNOT([0, 1])
        m = measure(0, reset=reset, postselect=postselect)
        qml.cond(m, qml.RX)(0.7, 1)
        qml.CRY(0.5, [0, 2])  # reads the measured qubit's state after the measurement
        return (
            qml.expval(qml.Z(0)),
            qml.expval(qml.Y(1)),
            qml.expval(m),
            qml.probs(wires=[0, 1, 2]),
        )

    return circuit


def _run(circuit, device, method, shots=None, diagonalize=False, **kwargs):
    node = qml.set_shots(qml.QNode(circuit, device, mcm_method=method, **kwargs), shots)
    return (diagonalize_mcms(node) if diagonalize else node)()


def _reference(circuit):
    """default.qubit after diagonalize_mcms, deferred, analytic."""
    return _run(circuit, qml.device("default.qubit"), "deferred", diagonalize=True)


def _assert_close(result, expected, atol):
    for r, e in zip(result, expected, strict=True):
        np.testing.assert_allclose(np.asarray(r, float), np.asarray(e, float), atol=atol)


@pytest.mark.parametrize("basis", list(BASES))
@pytest.mark.parametrize(("reset", "postselect"), [(False, None), (True, None), (False, 1)])
def test_other_bases_as_default_qubit_after_diagonalize_mcms(basis, reset, postselect):
    circuit = _basis_circuit(BASES[basis], reset, postselect)
    expected = _reference(circuit)
    result = _run(circuit, qml.device("custatevec.qubit"), "deferred")
    _assert_close(result, expected, atol=1e-12)
    sampled = _run(circuit, qml.device("custatevec.qubit", seed=11), "one-shot", shots=20000)
    _assert_close(sampled, expected, atol=0.03)


def test_the_basis_is_not_the_z_basis():
    """The measurement's own basis: Z-basis results differ (what the device gave before)."""
    circuit = _basis_circuit(BASES["y"])
    z_basis = _basis_circuit(qml.measure)
    ours = _run(circuit, qml.device("custatevec.qubit"), "deferred")
    assert abs(ours[2] - _run(z_basis, qml.device("default.qubit"), "deferred")[2]) > 0.1


def test_measured_qubit_is_left_in_its_outcome_state():
    """PennyLane's convention (its ftqc tests): after measure_x of |->, Z reads -1."""

    def circuit():
        qml.RY(-np.pi / 2, 0)  # |->: measure_x gives 1 always
        m = measure_x(0)
        qml.cond(m, qml.RX)(2.345, 1)
        return qml.expval(qml.Z(1)), qml.expval(qml.Z(0))

    result = _run(circuit, qml.device("custatevec.qubit"), "deferred")
    np.testing.assert_allclose(result, [np.cos(2.345), -1.0], atol=1e-12)


def _cond_measure_circuit(measurements):
    """A cond_measure (X or Y basis by the outcome of a Z-basis measurement) and a reset
    YZ-plane measurement; ``measurements(m0)`` makes them and returns their values."""

    def circuit():
        qml.RY(0.4, 0)
        qml.RX(0.7, 1)
        qml.CNOT([0, 1])
        m1, m2 = measurements(qml.measure(0))
        qml.cond(m1 & m2, qml.RY)(0.9, 2)
        qml.RX(0.5, 1)
        return (
            qml.expval(qml.Z(1)),
            qml.expval(m1),
            qml.expval(m2),
            qml.expval(qml.Z(2)),
            qml.probs(wires=[0, 1, 2]),
        )

    return circuit


def _by_ftqc(m0):
    m1 = cond_measure(m0, measure_x, measure_y)(1)
    return m1, measure_arbitrary_basis(0, angle=0.3, plane="YZ", reset=True)


def _by_hand(m0):
    """The same diagonalized by hand (diagonalize_mcms fails on the circuit in 0.45)."""
    qml.cond(m0, qml.Hadamard)(1)  # X basis when m0
    qml.cond(~m0, qml.adjoint(qml.S))(1)  # Y basis otherwise
    qml.cond(~m0, qml.Hadamard)(1)
    m1 = qml.measure(1)
    qml.RX(-0.3, 0)  # the YZ plane's basis change at angle 0.3
    return m1, qml.measure(0, reset=True)


def test_cond_measure_as_its_hand_diagonalized_circuit():
    circuit = _cond_measure_circuit(_by_ftqc)
    expected = _run(_cond_measure_circuit(_by_hand), qml.device("default.qubit"), "deferred")
    result = _run(circuit, qml.device("custatevec.qubit"), "deferred")
    _assert_close(result, expected, atol=1e-12)
    dev = qml.device("custatevec.qubit", seed=5)
    sampled = _run(circuit, dev, "one-shot", shots=20000)
    _assert_close(sampled, expected, atol=0.03)


def _cascading_circuit(x_rot, y_rot):
    """PennyLane's cascading cond_measure workflow (its ftqc tests)."""
    qml.RX(np.pi, 0)
    m = qml.measure(0)  # always 1
    qml.RX(np.pi / 2, 1)
    m2 = cond_measure(m == 0, measure_x, measure_y)(1)  # measure_y, always 1
    qml.RY(y_rot, 2)
    qml.RX(x_rot, 2)
    cond_measure(m2, measure_z, measure_y)(2)
    qml.cond(m2, qml.X)(3)
    return qml.expval(qml.Z(2)), qml.expval(qml.Z(3))


@pytest.mark.parametrize("diagonalize", [False, True])
@pytest.mark.parametrize(("method", "shots"), [("deferred", None), ("one-shot", 20000)])
def test_cascading_cond_measure_with_and_without_the_users_diagonalize_mcms(
    diagonalize, method, shots
):
    """With the user's diagonalize_mcms, a cond_measure's value names one measurement twice
    and processes scalars (``v1 or v2``): one-shot crashed on it (arrays of outcomes)."""
    dev = qml.device("custatevec.qubit", seed=2)
    node = qml.set_shots(qml.QNode(_cascading_circuit, dev, mcm_method=method), shots)
    node = diagonalize_mcms(node) if diagonalize else node
    x, y = 1.23, 3.45
    atol = 1e-12 if shots is None else 0.03
    np.testing.assert_allclose(node(x, y), [np.cos(x) * np.cos(y), -1.0], atol=atol)


def test_the_callers_tape_is_not_changed():
    """diagonalize_mcms writes its new measurements into the original measurement values;
    the device's transform leaves the tape it is given as it was."""
    with qml.queuing.AnnotatedQueue() as queue:
        qml.RY(0.3, 0)
        m = measure_x(0)
        qml.expval(m)
    tape = qml.tape.QuantumScript.from_queue(queue)
    (new_tape,), _ = measure_in_computational_bases(tape)
    assert isinstance(tape.measurements[0].mv.measurements[0], ParametricMidMeasure)
    assert type(new_tape.measurements[0].mv.measurements[0]) is qml.ops.MidMeasure
    assert [op.name for op in new_tape.operations] == ["RY", "Hadamard", "MidMeasureMP"]


def test_unpreprocessed_tapes_are_refused_by_name():
    with qml.queuing.AnnotatedQueue() as queue:
        qml.RY(0.3, 0)
        m = measure_y(0)
        qml.expval(m)
    tape = qml.tape.QuantumScript.from_queue(queue)
    with pytest.raises(DeviceError, match="measure_in_computational_bases"):
        qml.device("custatevec.qubit", wires=1).execute(tape)


def test_a_conditional_measurement_outside_cond_measure_is_refused():
    m = qml.measure(0)
    lone = qml.ops.Conditional(m, qml.ops.MidMeasure(1))
    tape = qml.tape.QuantumScript([qml.RX(0.2, 0), *m.measurements, lone], [qml.probs([1])])
    with pytest.raises(DeviceError, match="cond_measure"):
        measure_in_computational_bases(tape)


def _angle_circuit(x, a):
    qml.RY(x, 0)
    qml.CNOT([0, 1])
    m = measure_arbitrary_basis(0, angle=a, plane="XY")
    qml.cond(m, qml.RX)(x * 0.5, 1)
    return qml.expval(qml.Z(1) @ qml.Z(0) + 0.5 * qml.Y(1))


def _angle_reference():
    """Value and gradient by backpropagation through default.qubit after diagonalize_mcms
    (the basis change is then a gate of the QNode's tape)."""
    node = diagonalize_mcms(
        qml.QNode(_angle_circuit, qml.device("default.qubit"), diff_method="backprop")
    )
    x, a = pnp.array(0.7, requires_grad=True), pnp.array(0.4, requires_grad=True)
    return node(x, a), np.array(qml.grad(node)(x, a))


def _gradient(interface, diff_method, shots=None, **kwargs):
    dev = qml.device("custatevec.qubit", seed=7)
    node = qml.QNode(_angle_circuit, dev, diff_method=diff_method, interface=interface, **kwargs)
    node = qml.set_shots(node, shots)
    if interface == "autograd":
        x, a = pnp.array(0.7, requires_grad=True), pnp.array(0.4, requires_grad=True)
        return np.array(qml.grad(node)(x, a))
    if interface == "torch":
        torch = pytest.importorskip("torch")
        x = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
        a = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
        node(x, a).backward()
        return np.array([x.grad.item(), a.grad.item()])
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    return np.array(jax.grad(node, argnums=(0, 1))(0.7, 0.4))


INTERFACES = ["autograd", "torch", "jax"]


@pytest.mark.parametrize("interface", INTERFACES)
@pytest.mark.parametrize("diff_method", ["adjoint", "best"])
def test_measurement_angles_are_differentiated_by_the_adjoint_method(interface, diff_method):
    _, expected = _angle_reference()
    assert abs(expected[1]) > 0.1  # the angle matters
    np.testing.assert_allclose(_gradient(interface, diff_method), expected, atol=1e-10)


@pytest.mark.parametrize("interface", INTERFACES)
@pytest.mark.parametrize("diff_method", ["parameter-shift", "finite-diff", "spsa"])
def test_gradient_transforms_refuse_a_differentiated_angle(interface, diff_method):
    with pytest.raises(DifferentiatedMeasurementBasisError, match="diagonalize_mcms"):
        _gradient(interface, diff_method)


def test_a_fixed_angle_under_a_gradient_transform_runs():
    """Only a differentiated angle is refused: a constant one runs (and the other
    parameters are differentiated as default.qubit does after diagonalize_mcms)."""
    node = qml.QNode(_angle_circuit, qml.device("custatevec.qubit"), diff_method="parameter-shift")
    ref = diagonalize_mcms(
        qml.QNode(_angle_circuit, qml.device("default.qubit"), diff_method="parameter-shift")
    )
    x = pnp.array(0.7, requires_grad=True)
    got = qml.grad(lambda v: node(v, 0.4))(x)
    np.testing.assert_allclose(got, qml.grad(lambda v: ref(v, 0.4))(x), atol=1e-10)


def test_diagonalize_mcms_makes_the_angle_a_gate_parameter_for_the_transforms():
    """The refusal's advice works: diagonalize_mcms on the QNode, then parameter-shift."""
    node = diagonalize_mcms(
        qml.QNode(_angle_circuit, qml.device("custatevec.qubit"), diff_method="parameter-shift")
    )
    x, a = pnp.array(0.7, requires_grad=True), pnp.array(0.4, requires_grad=True)
    _, expected = _angle_reference()
    np.testing.assert_allclose(np.array(qml.grad(node)(x, a)), expected, atol=1e-8)


def _conditional_circuit(x):
    qml.RY(x, 0)
    qml.CNOT([0, 1])
    m = qml.measure(0)
    qml.cond(m, qml.RX)(x * 0.5, 1)
    return qml.expval(qml.Z(1))


def _conditional_gradient(dev, interface="autograd", diff_method="parameter-shift", **kwargs):
    node = qml.QNode(_conditional_circuit, dev, diff_method=diff_method, interface=interface)
    node = qml.set_shots(node, kwargs.pop("shots", None))
    if kwargs:
        node = qml.QNode(
            _conditional_circuit,
            dev,
            diff_method=diff_method,
            interface=interface,
            gradient_kwargs=kwargs,
        )
        node = qml.set_shots(node, 50000)
    if interface == "autograd":
        return qml.grad(node)(pnp.array(0.7, requires_grad=True))
    if interface == "torch":
        torch = pytest.importorskip("torch")
        x = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
        node(x).backward()
        return x.grad.item()
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    return jax.grad(node)(0.7)


EXACT_CONDITIONAL_GRADIENT = -0.5 * np.sin(0.7) * (1 + np.cos(0.35)) + 0.25 * (
    1 - np.cos(0.7)
) * np.sin(0.35)
"""d/dx of <Z(1)> = cos^2(x/2) - sin^2(x/2) cos(x/2): RY(x); CNOT; measure(0); cond RX(x/2)."""


@pytest.mark.parametrize("interface", INTERFACES)
@pytest.mark.parametrize("diff_method", ["parameter-shift", "best"])
def test_parameter_shift_with_shots_refuses_its_finite_difference_fallback(interface, diff_method):
    dev = qml.device("custatevec.qubit", seed=3)
    with pytest.raises(ShotNoiseFallbackError, match="fallback_fn"):
        _conditional_gradient(dev, interface, diff_method, shots=5000)


def test_default_qubit_returns_shot_noise_over_the_step_there():
    """What the refusal prevents: default.qubit's derivative is off by orders of magnitude."""
    dev = qml.device("default.qubit", seed=3)
    got = _conditional_gradient(dev, shots=2000)
    assert abs(got - EXACT_CONDITIONAL_GRADIENT) > 100


def test_parameter_shift_without_shots_or_with_a_chosen_fallback_runs():
    dev = qml.device("custatevec.qubit", seed=3)
    analytic = _conditional_gradient(dev)
    np.testing.assert_allclose(analytic, EXACT_CONDITIONAL_GRADIENT, atol=1e-6)
    fallback = functools.partial(qml.gradients.finite_diff, h=0.2, approx_order=2)
    sampled = _conditional_gradient(dev, fallback_fn=fallback)
    # central differences at h=0.2: bias ~ h^2/6 |f'''| < 0.01; noise ~ 1/(2h sqrt(N)) = 0.011
    np.testing.assert_allclose(sampled, EXACT_CONDITIONAL_GRADIENT, atol=0.06)
    node = qml.set_shots(qml.QNode(_conditional_circuit, dev, diff_method="parameter-shift"), 5000)
    assert abs(node(pnp.array(0.7, requires_grad=True)) - 0.77) < 0.05  # values run


def _jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    return jax


@pytest.mark.parametrize("wrap", ["grad(jit)", "jit(grad)", "jit"])
def test_jit_traced_conditional_parameters_are_refused_under_parameter_shift_with_shots(wrap):
    """Under jax.jit the device cannot tell whether a derivative follows:
    ``jax.grad(jax.jit(f))`` reaches it through PennyLane's JVP rule past the values it
    sees, and gave -18000 for -0.60. Refused as under jax.grad; a fallback of the user's
    runs."""
    jax = _jax()
    dev = qml.device("custatevec.qubit", seed=3)
    node = qml.set_shots(qml.QNode(_conditional_circuit, dev, diff_method="parameter-shift"), 5000)
    wrapped = {
        "grad(jit)": lambda: jax.grad(jax.jit(node)),
        "jit(grad)": lambda: jax.jit(jax.grad(node)),
        "jit": lambda: jax.jit(node),
    }[wrap]()
    with pytest.raises(ShotNoiseFallbackError, match="jax.jit" if wrap != "jit(grad)" else ""):
        wrapped(0.7)
    fallback = functools.partial(qml.gradients.finite_diff, h=0.2, approx_order=2)
    chosen = qml.QNode(
        _conditional_circuit,
        dev,
        diff_method="parameter-shift",
        gradient_kwargs={"fallback_fn": fallback},
    )
    got = jax.grad(jax.jit(qml.set_shots(chosen, 20000)))(0.7)
    np.testing.assert_allclose(got, EXACT_CONDITIONAL_GRADIENT, atol=0.06)


def test_jit_traced_measurement_angles_under_gradient_transforms_are_refused():
    """PennyLane's jax-jit interface fails on a traced angle (an escaped tracer), for
    values too: refused by name; the adjoint method differentiates it under jit."""
    jax = _jax()
    node = qml.QNode(_angle_circuit, qml.device("custatevec.qubit"), diff_method="parameter-shift")
    for wrapped in (jax.jit(node), jax.grad(jax.jit(node), argnums=(0, 1))):
        with pytest.raises(DifferentiatedMeasurementBasisError, match="jax.jit"):
            wrapped(0.7, 0.4)
    adjoint = qml.QNode(_angle_circuit, qml.device("custatevec.qubit"), diff_method="adjoint")
    _, expected = _angle_reference()
    got = jax.grad(jax.jit(adjoint), argnums=(0, 1))(0.7, 0.4)
    np.testing.assert_allclose(np.array(got), expected, atol=1e-10)
