"""What default.qubit does and this device did not, found by PennyLane 0.45.1's own ops,
transforms and gradients tests run on this device: observables built by arithmetic
(exponentials, adjoints, controlled operators; crashes with shots) and operators that
are not observables (measured as matrices before, refused now), work wires that
decompositions allocate, tapes with wires the device lacks (a KeyError), ``dev.execute``
inside torch or jax differentiation, a trainable DiagonalQubitUnitary under the adjoint
method, and autograd Hessians that PennyLane returns as zeros."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pennylane as qml
import pytest
import torch
from conftest import DEVICE
from pennylane import numpy as pnp

from pennylane_custatevec.preprocess.refusals import SecondDerivativesError

jax.config.update("jax_enable_x64", True)

TOL = 1e-10
SHOTS = 40_000


def _ours(wires, **kwargs):
    return qml.device(DEVICE, wires=wires, backend="cpu", **kwargs)


def _prepare(x):
    qml.RY(x, 0)
    qml.RX(0.4, 1)
    qml.CNOT([0, 1])
    qml.RY(0.3, 1)


# ---------------------------------------------------------------------------------------
# observables built by arithmetic

ARITHMETIC_OBSERVABLES = {
    "exp-Z": lambda: qml.exp(qml.Z(0), 2.0),
    "exp-word": lambda: qml.exp(qml.X(0) @ qml.Y(1), 0.3),
    "adjoint-hermitian": lambda: qml.adjoint(qml.Hermitian(np.array([[1, 1j], [-1j, 2]]), 1)),
    "power": lambda: qml.pow(qml.Hadamard(1), 3),
    "controlled-Z": lambda: qml.ctrl(qml.Z(1), 0),
    "sum-with-exp": lambda: qml.exp(qml.Z(0), 0.5) + qml.X(1),
    "exp-times-word": lambda: qml.exp(qml.X(0), 0.5) @ qml.Z(1),
}


def _moments(dev, make, shots=None):
    @qml.set_shots(shots)
    @qml.qnode(dev)
    def circuit(x):
        _prepare(x)
        return qml.expval(make()), qml.var(make())

    return circuit(0.7)


@pytest.mark.parametrize("name", sorted(ARITHMETIC_OBSERVABLES))
def test_arithmetic_observable_analytic_as_default_qubit(name):
    make = ARITHMETIC_OBSERVABLES[name]
    ours = _moments(_ours(2), make)
    reference = _moments(qml.device("default.qubit", wires=2), make)
    np.testing.assert_allclose(ours, reference, atol=TOL)


@pytest.mark.parametrize("name", sorted(ARITHMETIC_OBSERVABLES))
def test_arithmetic_observable_sampled_near_the_exact_moments(name):
    """With shots PennyLane's diagonalization rebuilt Exp, Adjoint and CZ wrongly (a
    TypeError); they are rotated by their own diagonalizing gates now. Bound: five
    standard errors (eigenvalue spread / sqrt(shots)), and twice that for variances."""
    make = ARITHMETIC_OBSERVABLES[name]
    exact = _moments(_ours(2), make)
    sampled = _moments(_ours(2, seed=11), make, shots=SHOTS)
    eigenvalues = np.real(make().eigvals())
    spread = float(np.ptp(eigenvalues)) or 1.0
    bound = 5 * spread / np.sqrt(SHOTS)
    np.testing.assert_allclose(sampled[0], exact[0], atol=bound)
    np.testing.assert_allclose(sampled[1], exact[1], atol=2 * bound * spread)


def test_probabilities_and_counts_of_an_exponential_with_shots():
    make = ARITHMETIC_OBSERVABLES["exp-word"]

    @qml.set_shots(SHOTS)
    @qml.qnode(_ours(2, seed=5))
    def circuit():
        _prepare(0.7)
        return qml.probs(op=make()), qml.counts(make(), all_outcomes=True), qml.expval(make())

    @qml.qnode(qml.device("default.qubit", wires=2))
    def exact():
        _prepare(0.7)
        return qml.probs(op=make()), qml.expval(make())

    probabilities, counts, mean = circuit()
    exact_probabilities, exact_mean = exact()
    bound = 5 / np.sqrt(SHOTS)
    np.testing.assert_allclose(probabilities, exact_probabilities, atol=bound)
    assert sum(counts.values()) == SHOTS
    assert set(np.round(list(counts), 12)) == set(np.round(make().eigvals(), 12))
    np.testing.assert_allclose(mean, exact_mean, atol=5 * np.ptp(make().eigvals()) / np.sqrt(SHOTS))


def test_exponential_beside_observables_it_does_not_commute_with():
    """Exp(X0) claims wire 0 whole: Z(0) goes to another tape."""
    make = lambda: qml.exp(qml.X(0), 0.5)  # noqa: E731

    def circuit():
        _prepare(0.7)
        return qml.expval(make()), qml.expval(qml.Z(0)), qml.expval(qml.X(1))

    sampled = qml.set_shots(qml.QNode(circuit, _ours(2, seed=3)), shots=SHOTS)()
    exact = qml.QNode(circuit, qml.device("default.qubit", wires=2))()
    np.testing.assert_allclose(sampled, exact, atol=5 * 1.1 / np.sqrt(SHOTS))


@pytest.mark.parametrize("method", ["adjoint", "parameter-shift"])
@pytest.mark.parametrize("name", ["exp-times-word", "adjoint-hermitian", "controlled-Z"])
def test_arithmetic_observable_differentiated_as_default_qubit(name, method):
    make = ARITHMETIC_OBSERVABLES[name]

    def circuit(x):
        qml.RY(x[0], 0)
        qml.RX(x[1], 1)
        qml.CNOT([0, 1])
        qml.RY(0.3, 1)
        return qml.expval(make())

    x = torch.tensor([0.7, 0.4], dtype=torch.float64)
    ours = qml.QNode(circuit, _ours(2), diff_method=method)
    reference = qml.QNode(circuit, qml.device("default.qubit", wires=2), diff_method="backprop")
    np.testing.assert_allclose(
        torch.autograd.functional.jacobian(ours, x),
        torch.autograd.functional.jacobian(reference, x),
        atol=TOL,
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: qml.RX(1.23, 0),
        lambda: qml.prod(qml.RX(1.23, 0), qml.I(1)),
        lambda: qml.S(0) + qml.Z(1),
    ],
    ids=["RX", "prod-RX-I", "sum-S-Z"],
)
@pytest.mark.parametrize("shots", [None, 100])
def test_operator_that_is_not_an_observable_refused(make, shots):
    """default.qubit refuses them (no eigenbasis); they were measured as matrices."""

    @qml.set_shots(shots)
    @qml.qnode(_ours(2))
    def circuit():
        qml.X(0)
        return qml.expval(make())

    with pytest.raises(qml.exceptions.DeviceError, match="not supported on custatevec.qubit"):
        circuit()


# ---------------------------------------------------------------------------------------
# wires


def test_tape_with_a_wire_the_device_lacks_refused_by_name():
    """``dev.execute`` of a tape that skipped the preprocessing raised ``KeyError: 6``."""
    tape = qml.tape.QuantumScript([qml.H(0), qml.CNOT([0, 6])], [qml.probs(wires=[0, 6])])
    with pytest.raises(qml.exceptions.WireError, match=r"not found on the device: \[6\]"):
        _ours(6).execute(tape)


def test_allocated_work_wire_takes_a_free_device_wire():
    def circuit():
        qml.H(0)
        with qml.allocate(1) as work:
            qml.CNOT([0, work[0]])
            qml.CNOT([work[0], 1])
            qml.CNOT([0, work[0]])
        return qml.probs(wires=[0, 1])

    ours = qml.QNode(circuit, _ours(3))()
    np.testing.assert_allclose(ours, qml.QNode(circuit, qml.device("default.qubit", wires=3))())
    np.testing.assert_allclose(ours, [0.5, 0, 0, 0.5], atol=TOL)
    with pytest.raises(qml.exceptions.AllocationError, match="Not enough available wires"):
        qml.QNode(circuit, _ours(2))()


def test_temporary_and_work_wire_of_a_decomposition():
    """PennyLane's ``test_toffoli_elbow_decomposition``: a decomposition's TemporaryAnd
    allocates a work wire, which the preprocessing maps to a free device wire."""
    from pennylane.ops.op_math.controlled_ops import _toffoli_elbow

    wires = [0, 1, 2]
    with qml.queuing.AnnotatedQueue() as queue:
        for index, wire in enumerate(wires):
            qml.RX(index + 0.3, wire)
        qml.Toffoli(wires=wires)
        _toffoli_elbow(wires=wires)
        for index, wire in reversed(list(enumerate(wires))):
            qml.RX(-(index + 0.3), wire)
    tape = qml.tape.QuantumScript(queue.queue, [qml.probs(wires=wires)])
    dev = _ours(5)
    program = dev.preprocess_transforms()
    (prepared,), _ = program((tape,))
    np.testing.assert_allclose(dev.execute(prepared)[0], 1.0, atol=TOL)


# ---------------------------------------------------------------------------------------
# dev.execute inside a framework's differentiation


def _tape(x):
    return qml.tape.QuantumScript(
        [qml.RX(x[0], 0), qml.RY(x[1], 1), qml.CNOT([0, 1])],
        [qml.expval(qml.Z(0) @ qml.Z(1)), qml.probs(wires=[1])],
    )


def _flat(result):
    return qml.math.hstack([qml.math.reshape(r, (-1,)) for r in result])


def _expected_jacobian(values):
    reference = qml.device("default.qubit", wires=2)
    x = pnp.array(values, requires_grad=True)
    run = lambda x: _flat(qml.execute([_tape(x)], reference, diff_method="backprop")[0])  # noqa: E731
    return qml.jacobian(run)(x)


def test_dev_execute_inside_torch_jacobian():
    """PennyLane's gradient-transform tests call ``fn(dev.execute(tapes))`` under
    ``torch.autograd.functional.jacobian``: a crash ("Can't call numpy() on Tensor that
    requires grad"); now torch differentiates it through PennyLane's workflow."""
    dev = _ours(2)
    x = torch.tensor([0.543, -0.654], dtype=torch.float64, requires_grad=True)
    jacobian = torch.autograd.functional.jacobian(lambda x: _flat(dev.execute(_tape(x))), x)
    np.testing.assert_allclose(jacobian, _expected_jacobian([0.543, -0.654]), atol=TOL)


@pytest.mark.parametrize("jit", [False, True])
def test_dev_execute_inside_jax_jacobian(jit):
    dev = _ours(2)
    function = jax.jacobian(lambda x: _flat(dev.execute(_tape(x))))
    jacobian = (jax.jit(function) if jit else function)(jnp.array([0.543, -0.654]))
    np.testing.assert_allclose(jacobian, _expected_jacobian([0.543, -0.654]), atol=TOL)


def test_dev_execute_of_a_parameter_shift_vjp_under_torch():
    """PennyLane's ``TestVJPGradients``: the VJP's tapes executed by ``dev.execute``,
    differentiated again by torch."""
    dev = _ours(2)
    reference = qml.device("default.qubit", wires=2)
    dy = torch.tensor([1.0, 0.5, -0.5], dtype=torch.float64)

    def vjp(device, x):
        tape = _tape(x)
        tape.trainable_params = [0, 1]
        tapes, fn = qml.gradients.vjp(tape, (dy[0], dy[1:]), qml.gradients.param_shift)
        return fn(device.execute(tapes))

    x = torch.tensor([0.543, -0.654], dtype=torch.float64, requires_grad=True)
    ours = torch.autograd.functional.jacobian(lambda x: vjp(dev, x), x)
    expected = torch.autograd.functional.jacobian(lambda x: vjp(reference, x), x)
    np.testing.assert_allclose(ours, expected, atol=TOL)
    assert np.abs(expected.numpy()).max() > 0.1


# ---------------------------------------------------------------------------------------
# a trainable DiagonalQubitUnitary under the adjoint method


def _diagonal_circuit(like):
    def circuit(x):
        phases = x[..., None] * qml.math.asarray([1.0, -1.0, 0.5, 2.0], like=like)
        qml.Hadamard(0)
        qml.Hadamard(1)
        qml.DiagonalQubitUnitary(qml.math.exp(1j * phases), wires=[1, 0])
        qml.RY(0.2, 0)
        return qml.expval(qml.X(0) @ qml.X(1)), qml.expval(qml.Y(1))

    return circuit


@pytest.mark.parametrize("broadcast", [False, True], ids=["scalar", "broadcast"])
@pytest.mark.parametrize("interface", ["torch", "jax", "jax-jit", "autograd"])
def test_trainable_diagonal_unitary_by_adjoint_as_default_qubit(interface, broadcast):
    """It was refused ("has trainable parameters but no generator"); default.qubit's
    adjoint method decomposes it into gates whose angles are its phases' differences,
    and so does this device's now."""
    values = [0.654, 0.321] if broadcast else 0.654
    results = []
    for dev, method in [(_ours(2), "adjoint"), (qml.device("default.qubit", wires=2), "backprop")]:
        like = "jax" if interface.startswith("jax") else interface
        node = qml.QNode(_diagonal_circuit(like), dev, diff_method=method)
        cost = lambda x, node=node: qml.math.hstack(node(x))  # noqa: E731
        if interface == "torch":
            x = torch.tensor(values, dtype=torch.float64)
            results.append(torch.autograd.functional.jacobian(cost, x).numpy())
        elif interface == "autograd":
            results.append(qml.jacobian(cost)(pnp.array(values, requires_grad=True)))
        else:
            function = jax.jacobian(cost)
            function = jax.jit(function) if interface == "jax-jit" else function
            results.append(np.asarray(function(jnp.array(values))))
    np.testing.assert_allclose(results[0], results[1], atol=TOL)
    assert np.abs(results[1]).max() > 0.1


def test_trainable_general_unitary_taken_by_its_entries():
    """A QubitUnitary of a trainable angle's matrix: the adjoint method takes it by its
    entries (tests/gradients/test_entrywise.py), and the chain rule through RX's matrix gives RX's
    derivative, -sin(x), also at x = 0, where the matrix is the identity."""
    dev = _ours(1)

    @qml.qnode(dev, diff_method="adjoint")
    def circuit(x):
        qml.QubitUnitary(qml.RX.compute_matrix(x), wires=0)
        return qml.expval(qml.Z(0))

    for x in (0.3, 0.0):
        gradient = qml.grad(circuit)(pnp.array(x, requires_grad=True))
        np.testing.assert_allclose(gradient, -np.sin(x), atol=1e-12, rtol=0)


# ---------------------------------------------------------------------------------------
# autograd Hessians through measurements of one shape

ALIKE = {
    "expval-expval": lambda: (qml.expval(qml.Z(0)), qml.expval(qml.X(1))),
    "expval-var": lambda: (qml.expval(qml.Z(0)), qml.var(qml.X(1))),
    "probs-probs": lambda: (qml.probs(wires=0), qml.probs(wires=1)),
}
UNLIKE = {
    "probs-expval": lambda: (qml.probs(wires=0), qml.expval(qml.X(1))),
    "probs2-probs1": lambda: (qml.probs(wires=[0, 1]), qml.probs(wires=1)),
}


def _alike_circuit(measure):
    def circuit(x):
        qml.RX(x[0], 0)
        qml.RY(x[1] * 0.7, 0)
        qml.CNOT([0, 1])
        qml.RX(0.3, 1)
        return measure()

    return circuit


def _hessian_node(dev, measure, **kwargs):
    circuit = qml.QNode(_alike_circuit(measure), dev, max_diff=2, **kwargs)
    return lambda x: qml.math.hstack([qml.math.reshape(r, (-1,)) for r in circuit(x)])


@pytest.mark.parametrize("name", sorted(ALIKE))
def test_autograd_hessian_through_measurements_of_one_shape_refused(name):
    """PennyLane returns zeros here (default.qubit's parameter-shift too)."""
    x = pnp.array([1.0, 0.5], requires_grad=True)
    cost = _hessian_node(_ours(2), ALIKE[name])
    with pytest.raises(SecondDerivativesError, match="all have the shape"):
        qml.jacobian(qml.jacobian(cost))(x)
    shifted = _hessian_node(
        qml.device("default.qubit", wires=2), ALIKE[name], diff_method="parameter-shift"
    )
    assert np.all(qml.jacobian(qml.jacobian(shifted))(x) == 0)  # the zeros refused


@pytest.mark.parametrize("name", sorted(ALIKE))
def test_first_derivatives_of_alike_measurements_under_max_diff_2_pass(name):
    x = pnp.array([1.0, 0.5], requires_grad=True)
    ours = _hessian_node(_ours(2), ALIKE[name])
    reference = _hessian_node(qml.device("default.qubit", wires=2), ALIKE[name])
    # under max_diff=2 PennyLane's autograd returns the Jacobian in a box (default.qubit's
    # parameter-shift too)
    jacobian = qml.math.unwrap(qml.jacobian(ours)(x))
    np.testing.assert_allclose(jacobian, qml.jacobian(reference)(x), atol=TOL)


@pytest.mark.parametrize("name", ["expval-expval", "probs-probs"])  # none with variances
def test_hessian_transform_of_alike_measurements_passes(name):
    """``param_shift_hessian`` takes no autograd trace: not refused, right."""
    x = pnp.array([1.0, 0.5], requires_grad=True)
    hessians = [
        qml.gradients.param_shift_hessian(qml.QNode(_alike_circuit(ALIKE[name]), dev))(x)
        for dev in (_ours(2), qml.device("default.qubit", wires=2))
    ]
    np.testing.assert_allclose(np.array(hessians[0]), np.array(hessians[1]), atol=TOL)
    assert np.abs(np.array(hessians[1])).max() > 0.1


@pytest.mark.parametrize("name", sorted(UNLIKE))
def test_autograd_hessian_through_measurements_of_different_shapes_right(name):
    x = pnp.array([1.0, 0.5], requires_grad=True)
    ours = qml.jacobian(qml.jacobian(_hessian_node(_ours(2), UNLIKE[name])))(x)
    reference = qml.jacobian(
        qml.jacobian(_hessian_node(qml.device("default.qubit", wires=2), UNLIKE[name]))
    )(x)
    np.testing.assert_allclose(ours, reference, atol=1e-8)
    assert np.abs(reference).max() > 0.1


@pytest.mark.parametrize("name", sorted(ALIKE))
def test_torch_hessian_through_measurements_of_one_shape_right(name):
    x = torch.tensor([1.0, 0.5], dtype=torch.float64)
    ours = torch.autograd.functional.hessian(
        lambda x: _hessian_node(_ours(2), ALIKE[name])(x).sum(), x
    )
    reference = torch.autograd.functional.hessian(
        lambda x: _hessian_node(qml.device("default.qubit", wires=2), ALIKE[name])(x).sum(), x
    )
    np.testing.assert_allclose(ours, reference, atol=1e-8)


# ---------------------------------------------------------------------------------------
# derivatives beyond max_diff, and beyond what PennyLane's autograd interface takes


def _third_derivative_node(dev, interface, max_diff):
    @qml.qnode(dev, interface=interface, max_diff=max_diff)
    def circuit(x):
        qml.RX(x[1], wires=0)
        qml.RY(x[0], wires=0)
        qml.CNOT(wires=[0, 1])
        return qml.expval(qml.Z(1))

    return circuit


def _third_derivative(interface, node):
    values = [0.1, 0.2]
    if interface == "autograd":
        x = pnp.array(values, requires_grad=True)
        return np.asarray(qml.jacobian(qml.jacobian(qml.jacobian(node)))(x))
    if interface == "jax":
        return np.asarray(jax.jacobian(jax.jacobian(jax.jacobian(node)))(jnp.array(values)))
    x = torch.tensor(values, dtype=torch.float64)
    hessian = lambda x: torch.autograd.functional.hessian(node, x, create_graph=True)  # noqa: E731
    return torch.autograd.functional.jacobian(hessian, x).numpy()


@pytest.mark.parametrize("interface", ["autograd", "jax"])
def test_third_derivatives_under_max_diff_2_refused(interface):
    """PennyLane returns zeros (default.qubit's parameter-shift too)."""
    node = _third_derivative_node(_ours(2), interface, max_diff=2)
    with pytest.raises(SecondDerivativesError, match="order 3"):
        _third_derivative(interface, node)


def test_third_derivatives_through_autograd_refused_even_under_max_diff_3():
    node = _third_derivative_node(_ours(2), "autograd", max_diff=3)
    with pytest.raises(SecondDerivativesError, match="through autograd"):
        _third_derivative("autograd", node)
    shifted = qml.QNode(
        _third_derivative_node(qml.device("default.qubit", wires=2), "autograd", 3).func,
        qml.device("default.qubit", wires=2),
        max_diff=3,
        diff_method="parameter-shift",
    )
    assert np.all(_third_derivative("autograd", shifted) == 0)  # the zeros refused


@pytest.mark.parametrize("interface", ["torch", "jax"])
def test_third_derivatives_under_max_diff_3_as_default_qubit(interface):
    ours = _third_derivative(interface, _third_derivative_node(_ours(2), interface, 3))
    reference = _third_derivative(
        interface, _third_derivative_node(qml.device("default.qubit", wires=2), interface, 3)
    )
    np.testing.assert_allclose(ours, reference, atol=1e-8)
    assert np.abs(reference).max() > 0.1


# ---------------------------------------------------------------------------------------
# SpecialUnitary under jax.jit (PennyLane's test_special_unitary.py::test_jax_jit): the
# adjoint method decomposes a trainable SpecialUnitary into Pauli rotations, and its
# decomposition compares the angles with zero: jax's TracerBoolConversionError came from
# inside the preprocessing, for the forward pass too ("best" took the adjoint method)

_SU_THETA = (0.4, 0.1, -0.3)


def _special_unitary_qnode(dev, **kwargs):
    @qml.qnode(dev, interface="jax", **kwargs)
    def circuit(x):
        qml.SpecialUnitary(x, 0)
        return qml.probs(wires=[0])

    return circuit


@pytest.mark.parametrize("diff_method", ["best", "adjoint"])
@pytest.mark.parametrize("differentiated", [False, True], ids=["values", "jacobian"])
def test_special_unitary_under_jit_refused_by_name(diff_method, differentiated):
    from pennylane_custatevec.preprocess.decompose import TracedDecompositionError

    circuit = jax.jit(_special_unitary_qnode(_ours(1), diff_method=diff_method))
    call = jax.jacobian(circuit) if differentiated else circuit
    with pytest.raises(TracedDecompositionError, match="SpecialUnitary.*without jax.jit"):
        call(jnp.array(_SU_THETA))


def test_special_unitary_without_jit_and_values_under_jit_as_default_qubit():
    """The ways out the refusal names give default.qubit's (backpropagation's) numbers."""
    theta = jnp.array(_SU_THETA)
    reference = _special_unitary_qnode(qml.device("default.qubit", wires=1))
    np.testing.assert_allclose(
        jax.jacobian(_special_unitary_qnode(_ours(1)))(theta),
        jax.jacobian(reference)(theta),
        atol=TOL,
    )
    values = jax.jit(_special_unitary_qnode(_ours(1), diff_method=None))(theta)
    np.testing.assert_allclose(values, reference(theta), atol=TOL)


# ---------------------------------------------------------------------------------------
# a pulse broadcast over its intermediate times (stoch_pulse_grad with
# use_broadcasting=True builds them; PennyLane's test_pulse_gradient.py): its parameters
# are scalars, so the device took it as not broadcast and returned one result for the
# batch (and crashed where two such tapes ran as one batch)


def _pulse_tape(amplitude, times=(0.0, 0.1, 0.25, 0.4)):
    hamiltonian = qml.pulse.constant * qml.Y(0) + qml.pulse.constant * (qml.X(0) @ qml.Z(1))
    ops = [
        qml.RX(0.3, 1),
        qml.evolve(hamiltonian)([amplitude, 0.7], jnp.array(times), return_intermediate=True),
        qml.CNOT([0, 1]),
        qml.RY(-0.2, 0),
    ]
    return qml.tape.QuantumScript(ops, [qml.probs(wires=[0]), qml.expval(qml.Z(0) @ qml.Y(1))])


def test_pulse_broadcast_over_its_times_as_default_qubit():
    tapes = [_pulse_tape(jnp.array(0.4)), _pulse_tape(jnp.array(-0.9))]
    expected = qml.device("default.qubit", wires=2).execute(tapes)
    for results in (_ours(2).execute(tapes), [_ours(2).execute(t) for t in tapes]):
        for result, reference in zip(results, expected, strict=True):
            assert np.shape(result[0]) == (4, 2)  # one entry per time
            for value, exact in zip(result, reference, strict=True):
                np.testing.assert_allclose(value, exact, atol=1e-8)  # the ODE solver's


def test_stoch_pulse_grad_with_broadcasting_as_default_qubit():
    hamiltonian = qml.pulse.constant * qml.Y(0)
    gradient = {"num_split_times": 3, "use_broadcasting": True, "sampler_seed": 3}

    def jacobian(dev):
        @qml.qnode(
            dev,
            interface="jax",
            diff_method=qml.gradients.stoch_pulse_grad,
            **{"gradient_kwargs": gradient},
        )
        def circuit(params):
            qml.evolve(hamiltonian)(params, 0.2)
            return qml.probs(wires=0), qml.expval(qml.Z(0))

        return jax.jacobian(circuit)([jnp.array(0.4)])

    for ours, reference in zip(
        jax.tree_util.tree_leaves(jacobian(_ours(1))),
        jax.tree_util.tree_leaves(jacobian(qml.device("default.qubit", wires=1))),
        strict=True,
    ):
        np.testing.assert_allclose(ours, reference, atol=1e-8)
