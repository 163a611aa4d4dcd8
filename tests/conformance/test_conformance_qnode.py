"""QNodes on custatevec.qubit against default.qubit, in every interface (autograd, torch,
jax) and differentiation configuration (adjoint computing Jacobians on execution or
afterwards, adjoint VJPs, parameter-shift, "best"), in both gradient accumulation modes:
results of every shape (single expectation values, tuples, probabilities, ragged tuples,
states, variances, density matrices, entropies), their array types and dtypes, and their
Jacobians; classical processing inside the QNode, arguments that are not trainable, gates
that must be decomposed to be differentiated, and trainable observable data.

The reference is default.qubit with ``diff_method="backprop"`` in the same interface.
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from conformance_support import (
    ADJOINT_CONFIGS,
    ADJOINT_JACOBIAN,
    ADJOINT_JACOBIAN_ON_EXECUTION,
    ADJOINT_VJP,
    ATOL,
    BEST,
    GRAD_MODES,
    INTERFACE_NAMES,
    PARAMETER_SHIFT,
    DiffConfig,
    assert_qnode_conforms,
    assert_same_derivatives,
    assert_same_result,
    assert_same_types,
    config_mode_params,
    custatevec_device,
    interface,
    interface_config_params,
    reference_device,
    reference_qnode,
    three_qubit_gates,
)
from pennylane import numpy as pnp
from pennylane.devices import ExecutionConfig
from pennylane.exceptions import DeviceError

N_WIRES = 3
X = 0.543
Y = np.array([-0.654, 0.321])

HERMITIAN = np.array(
    [
        [1.2, 0.3 - 0.4j, 0.0, 0.1j],
        [0.3 + 0.4j, -0.5, 0.2, 0.0],
        [0.0, 0.2, 0.7, -0.6 + 0.1j],
        [-0.1j, 0.0, -0.6 - 0.1j, 0.1],
    ]
)

RETURNS = {
    "expval": lambda: qml.expval(qml.Z(0)),
    "expval_tuple": lambda: (qml.expval(qml.Z(0)), qml.expval(qml.Y(1) @ qml.X(2))),
    "probs": lambda: qml.probs(wires=[0, 1]),
    "probs_ragged": lambda: (qml.probs(wires=0), qml.probs(wires=[2, 1])),
    "expval_probs": lambda: (qml.expval(qml.Z(2)), qml.probs(wires=[0, 1])),
    "state": qml.state,
    "observables": lambda: (
        qml.expval(qml.Hamiltonian([0.3, -0.7], [qml.Z(0) @ qml.Z(1), qml.X(2)])),
        qml.expval(qml.Hermitian(HERMITIAN, wires=[2, 0])),
        qml.expval(qml.Projector([0, 1], wires=[0, 1])),
    ),
    "var": lambda: (qml.var(qml.X(1)), qml.var(qml.Hermitian(HERMITIAN, wires=[0, 2]))),
    "var_expval_probs": lambda: (
        qml.var(qml.Z(0) @ qml.Z(2)),
        qml.expval(qml.X(2)),
        qml.probs(wires=1),
    ),
    "density_matrix_entropies": lambda: (
        qml.density_matrix(wires=[0]),
        qml.purity(wires=[1]),
        qml.vn_entropy(wires=[0]),
        qml.mutual_info(wires0=[0], wires1=[2]),
    ),
}
STATE_RETURNS = {"state", "density_matrix_entropies"}
"""Returns computed from the state, which PennyLane's parameter-shift rule refuses to
differentiate (on default.qubit as here)."""


def circuit_returning(returns: str):
    """A generic 3-qubit circuit of a scalar ``x`` and a 2-vector ``y``."""

    def circuit(x, y):
        three_qubit_gates(x, y)
        qml.RY(x, wires=2)
        return RETURNS[returns]()

    return circuit


def qnodes(circuit, interface_name, config, mode, wires=N_WIRES, **ours_kwargs):
    """(custatevec QNode with ``config``, default.qubit's reference QNode) of ``circuit``."""
    ours = qml.QNode(
        circuit,
        custatevec_device(wires, mode, **ours_kwargs),
        interface=interface_name,
        **config.qnode_kwargs(),
    )
    return ours, reference_qnode(circuit, wires)


@pytest.mark.parametrize("returns", RETURNS)
@pytest.mark.parametrize(("interface_name", "config", "mode"), interface_config_params())
def test_qnode_returns_and_jacobian(interface_name, config, mode, returns):
    iface = interface(interface_name)
    ours, ref = qnodes(circuit_returning(returns), interface_name, config, mode)
    if config is PARAMETER_SHIFT and returns in STATE_RETURNS:
        assert_state_refused_by_parameter_shift(ours, ref, iface, interface_name)
        return
    assert_qnode_conforms(ours, ref, iface, [X, Y], reference_key=("returns", returns))


def assert_state_refused_by_parameter_shift(ours, ref, iface, interface_name):
    """PennyLane's parameter-shift rule refuses to differentiate a state or what is
    computed from it (as on default.qubit); the forward pass is default.qubit's."""
    values = [X, Y]
    result, expected = ours(*iface.args(values)), ref(*iface.args(values))
    assert_same_types(result, expected, iface.array_types)
    assert_same_result(result, expected)
    ref_shift = qml.QNode(
        ref.func, reference_device(N_WIRES), interface=interface_name, diff_method="parameter-shift"
    )
    for qnode in (ref_shift, ours):
        with pytest.raises(ValueError, match="return the state with the parameter-shift rule"):
            iface.jacobian(qnode, iface.args(values))


FORWARD_MODE_CASES = [
    pytest.param(config, mode, returns, id=f"{param.id}-{returns}")
    for param in config_mode_params([ADJOINT_JACOBIAN, PARAMETER_SHIFT, BEST])
    for config, mode in [param.values]
    for returns in ("expval_tuple", "probs_ragged", "var", "state")
    if not (config is PARAMETER_SHIFT and returns == "state")  # refused: see above
]


@pytest.mark.parametrize(("config", "mode", "returns"), FORWARD_MODE_CASES)
def test_jax_forward_mode_jacobian(config, mode, returns):
    """jax.jacfwd (forward mode: Jacobian-vector products) equals default.qubit's."""
    iface = interface("jax")
    ours, ref = qnodes(circuit_returning(returns), "jax", config, mode)
    values = [X, Y]
    jacobian = iface.jacobian(ours, iface.args(values), forward=True)
    ref_iface = iface.for_reference_derivatives()
    assert_same_derivatives(jacobian, ref_iface.jacobian(ref, ref_iface.args(values)))


@pytest.mark.parametrize("mode", GRAD_MODES)
def test_device_jvp_matches_default_qubit(mode):
    """The device's own Jacobian-vector products (``supports_jvp``, ``compute_jvp``,
    ``execute_and_compute_jvp``) equal default.qubit's adjoint ones."""
    ops = [qml.RX(X, 0), qml.RY(Y[0], 1), qml.CNOT([0, 1]), qml.RX(Y[1], 2), qml.CNOT([1, 2])]
    tapes = (
        qml.tape.QuantumScript(ops, [qml.expval(qml.Z(0)), qml.expval(qml.X(1) @ qml.Z(2))]),
        qml.tape.QuantumScript(ops[:3], [qml.expval(qml.X(1))], trainable_params=[0, 1]),
    )
    tangents = ((0.3, -1.1, 0.7), (0.5, 2.0))
    dev, ref = custatevec_device(N_WIRES, mode), reference_device(N_WIRES)
    config = ExecutionConfig(gradient_method="adjoint")
    ours_config = dev.setup_execution_config(config)
    ref_config = ref.setup_execution_config(config)
    assert dev.supports_jvp(ours_config, tapes[0])
    expected = ref.execute_and_compute_jvp(tapes, tangents, ref_config)
    assert_same_result(dev.execute_and_compute_jvp(tapes, tangents, ours_config), expected)
    assert_same_result(dev.compute_jvp(tapes, tangents, ours_config), expected[1])


@pytest.mark.parametrize(("interface_name", "config", "mode"), interface_config_params())
def test_classical_processing(interface_name, config, mode):
    """Arguments combined and transformed before they reach the gates (one argument in
    several gates, products, a sine), and the outputs processed after the QNode."""

    def circuit(x, y):
        qml.RY(x * y[0], wires=0)
        qml.RX(qml.math.sin(y[1]), wires=1)
        qml.CNOT(wires=[0, 1])
        qml.RZ(x, wires=1)
        qml.RX(y[1] + x, wires=1)
        return qml.expval(qml.Z(0) @ qml.Y(1)), qml.probs(wires=[1])

    iface = interface(interface_name)
    ours, ref = qnodes(circuit, interface_name, config, mode, wires=2)

    def processed(qnode):
        def cost(x, y):
            e, p = qnode(x, y)
            return qml.math.stack([e**2, p[0] * x, p[1] - e])

        return cost

    assert_qnode_conforms(
        processed(ours), processed(ref), iface, [X, Y], reference_key="classical_processing"
    )


@pytest.mark.parametrize(("interface_name", "config", "mode"), interface_config_params())
def test_untrainable_arguments(interface_name, config, mode):
    """An argument that is not trainable (a constant of the interface) gets no derivative,
    a QubitUnitary matrix included, and the trainable one gets default.qubit's."""

    def circuit(x, y, unitary):
        qml.QubitUnitary(unitary, wires=[0, 1])
        qml.RX(x, wires=0)
        qml.RY(y[0], wires=1)
        qml.CNOT(wires=[0, 1])
        qml.RZ(y[1], wires=0)
        return qml.expval(qml.X(0) @ qml.Z(1)), qml.probs(wires=[0])

    unitary = qml.matrix(qml.Rot(0.2, -0.9, 1.3, 0) @ qml.IsingXY(0.7, [0, 1]), wire_order=[0, 1])
    iface = interface(interface_name)
    ours, ref = qnodes(circuit, interface_name, config, mode, wires=2)
    assert_qnode_conforms(
        ours,
        ref,
        iface,
        [X, Y, unitary],
        trainable=[True, False, False],
        reference_key="untrainable",
    )


@pytest.mark.parametrize(("interface_name", "config", "mode"), interface_config_params())
def test_no_trainable_parameters(interface_name, config, mode):
    """Every argument constant: the results are default.qubit's, of the same type."""
    iface = interface(interface_name)
    ours, ref = qnodes(circuit_returning("expval_probs"), interface_name, config, mode)
    args = (iface.constant(X), iface.constant(Y))
    result, expected = ours(*args), ref(*args)
    assert_same_types(result, expected, iface.array_types)
    assert_same_result(result, expected)


class UserRot(qml.operation.Operation):
    """A user's three-parameter gate known only by its decomposition (no matrix, no
    generator): it must be decomposed before it runs or is differentiated."""

    num_wires = 1
    num_params = 3
    grad_method = None

    @staticmethod
    def compute_decomposition(phi, theta, omega, wires):
        return [qml.RZ(phi, wires), qml.RY(theta, wires), qml.RZ(omega, wires)]


@pytest.mark.parametrize(("interface_name", "config", "mode"), interface_config_params())
def test_gates_decomposed_for_differentiation(interface_name, config, mode):
    """Trainable gates with several parameters (Rot, U3, CRot) and a user's gate defined
    by its decomposition."""

    def circuit(x, y):
        qml.Hadamard(wires=1)
        qml.Rot(x, y[0], y[1], wires=0)
        qml.CRot(y[1], x, y[0], wires=[1, 0])
        UserRot(y[0], y[1], x, wires=1)
        qml.U3(x, y[1], y[0], wires=1)
        return qml.expval(qml.Z(0) @ qml.X(1)), qml.expval(qml.Y(1))

    iface = interface(interface_name)
    ours, ref = qnodes(circuit, interface_name, config, mode, wires=2)
    assert_qnode_conforms(ours, ref, iface, [X, Y], reference_key="decomposed")


def observable_data_circuit(x, coefficients, matrix):
    qml.RX(x, wires=0)
    qml.RY(0.4, wires=1)
    qml.CNOT(wires=[0, 1])
    hamiltonian = qml.Hamiltonian(coefficients, [qml.Z(0) @ qml.X(1), qml.Y(1)])
    return qml.expval(hamiltonian), qml.expval(qml.Hermitian(matrix, wires=1))


COEFFICIENTS = np.array([0.8, -1.3])
MATRIX = np.array([[0.7, 0.2], [0.2, -0.4]])  # real: default.qubit's backprop reference


@pytest.mark.parametrize(
    ("interface_name", "config", "mode"), interface_config_params(configs=[*ADJOINT_CONFIGS, BEST])
)
def test_trainable_observable_data(interface_name, config, mode):
    """Trainable coefficients of a Hamiltonian and a trainable Hermitian matrix,
    differentiated by the adjoint method: their derivatives are default.qubit's (the
    terms' expectation values; the reduced density matrix on the Hermitian's wires,
    transposed)."""
    iface = interface(interface_name)
    ours, ref = qnodes(observable_data_circuit, interface_name, config, mode, wires=2)
    assert_qnode_conforms(
        ours, ref, iface, [X, COEFFICIENTS, MATRIX], reference_key="observable_data"
    )


@pytest.mark.parametrize("interface_name", INTERFACE_NAMES)
def test_trainable_hamiltonian_coefficients_parameter_shift(interface_name):
    """Parameter-shift with trainable Hamiltonian coefficients (PennyLane's rule cannot
    differentiate a Hermitian's matrix: it stays constant here)."""
    iface = interface(interface_name)
    ours, ref = qnodes(observable_data_circuit, interface_name, PARAMETER_SHIFT, "deferred", 2)
    assert_qnode_conforms(
        ours, ref, iface, [X, COEFFICIENTS, MATRIX], trainable=[True, True, False]
    )


def postselecting_circuit(x, y):
    qml.RX(x, wires=0)
    qml.CNOT(wires=[0, 1])
    qml.measure(0, postselect=1)
    qml.RY(y[0], wires=1)
    qml.RX(y[1], wires=1)
    return qml.expval(qml.Z(1)), qml.probs(wires=[1])


@pytest.mark.parametrize(
    ("interface_name", "config", "mode"), interface_config_params(configs=[PARAMETER_SHIFT])
)
def test_postselection_differentiation_is_refused(interface_name, config, mode):
    """A mid-circuit measurement with postselection under parameter-shift: its values
    (constant parameters) are default.qubit's; its derivatives are refused by name, as
    PennyLane's gradient transforms give wrong ones
    (``test_gradient_transforms_are_wrong_on_postselection``)."""
    iface = interface(interface_name)
    ours, ref = qnodes(postselecting_circuit, interface_name, config, mode, wires=2)
    constants = [iface.constant(X), iface.constant(Y)]
    assert_same_result(ours(*constants), ref(*constants))
    with pytest.raises(DeviceError, match="probability of the postselection on wire 0.*#5943"):
        iface.jacobian(ours, iface.args([X, Y]))


def after_postselection_circuit(x, y):
    """Postselects wire 1; ``x`` acts after it and ``y`` on a wire it never reaches, so
    neither changes the postselection's probability."""
    qml.Hadamard(0)
    qml.CNOT(wires=[0, 1])
    qml.RX(y[0], wires=2)
    qml.measure(1, postselect=1)
    qml.CNOT(wires=[2, 0])
    qml.RX(x, wires=0)
    qml.RY(y[1], wires=2)
    return qml.expval(qml.Z(0)), qml.probs(wires=[2])


@pytest.mark.parametrize("interface_name", INTERFACE_NAMES)
@pytest.mark.parametrize(
    ("circuit", "diff_method", "wires"),
    [
        (postselecting_circuit, "finite-diff", 2),
        (after_postselection_circuit, "finite-diff", 3),
        (after_postselection_circuit, "parameter-shift", 3),
        (after_postselection_circuit, "best", 3),
    ],
    ids=["reaching-finite-diff", "after-finite-diff", "after-parameter-shift", "after-best"],
)
def test_postselection_differentiated_where_the_transform_is_right(
    interface_name, circuit, diff_method, wires
):
    """The transforms that are right on a postselecting circuit run: finite differences
    where every trainable gate reaches a measured wire (``postselecting_circuit``'s ``x``
    also changes the postselection's probability), and parameter-shift ("best" takes it)
    where no trainable gate reaches the postselection. The derivatives are default.qubit's
    backprop derivatives (finite differences: to their truncation error)."""
    iface = interface(interface_name)
    config = DiffConfig(diff_method, diff_method)
    ours, ref = qnodes(circuit, interface_name, config, "deferred", wires=wires)
    values = [X, Y]
    assert_same_result(ours(*iface.args(values)), ref(*iface.args(values)))
    jacobian = iface.jacobian(ours, iface.args(values))
    reference = iface.for_reference_derivatives()
    expected = reference.jacobian(ref, reference.args(values))
    assert_same_derivatives(jacobian, expected, atol=1e-6 if diff_method == "finite-diff" else ATOL)
    assert max(np.abs(e).max() for e in expected) > 0.1  # not all 0: the check can fail


@pytest.mark.parametrize("diff_method", ["parameter-shift", "finite-diff", "spsa"])
def test_gradient_transforms_are_wrong_on_postselection(diff_method):
    """Why the device refuses them (PennyLane issue #5943): on default.qubit, every
    gradient transform gives d<Z0>/dx = 0 for this circuit, whose postselection on wire 1
    makes <Z0> depend on x (backprop's derivative, and a finite difference of the values,
    are 0.49). Where this fails, PennyLane has fixed them: the refusal can go."""

    def circuit(x):
        qml.Hadamard(0)
        qml.CNOT([0, 1])
        qml.RX(x, 1)
        qml.measure(1, postselect=1)
        return qml.expval(qml.Z(0))

    x = pnp.array(0.512, requires_grad=True)
    device = qml.device("default.qubit", wires=2)
    backprop = qml.grad(qml.QNode(circuit, device, diff_method="backprop"))(x)
    values = qml.QNode(circuit, device, diff_method=None)
    difference = (values(0.512 + 1e-6) - values(0.512 - 1e-6)) / 2e-6
    np.testing.assert_allclose([backprop, difference], 0.489921758, atol=1e-6)
    transformed = qml.grad(qml.QNode(circuit, device, diff_method=diff_method))(x)
    assert abs(transformed - backprop) > 0.4


def test_shift_rules_are_wrong_where_a_parameter_reaches_the_postselection():
    """Why the device refuses parameter-shift and Hadamard gradients, but not finite
    differences, where a trainable gate reaches both a postselection and a measured wire
    (PennyLane issue #5943): the result is a ratio N(x) / D(x) whose denominator, the
    postselection's probability, depends on x, and the shift rules assume a result linear
    in the state. On default.qubit the transforms are off by 0.31 and 0.06 here."""

    def circuit(x):
        qml.RY(x, 0)
        qml.RY(0.3, 1)
        qml.CNOT([0, 1])
        qml.measure(1, postselect=1)
        return qml.expval(qml.Z(0))

    x = pnp.array(0.7, requires_grad=True)
    device = qml.device("default.qubit", wires=3)
    backprop = qml.grad(qml.QNode(circuit, device, diff_method="backprop"))(x)
    finite = qml.grad(qml.QNode(circuit, device, diff_method="finite-diff"))(x)
    np.testing.assert_allclose(finite, backprop, atol=1e-6)
    for method, kwargs, error in (
        ("parameter-shift", {}, 0.31),
        ("hadamard", {"gradient_kwargs": {"aux_wire": 2}}, 0.059),
    ):
        shifted = qml.grad(qml.QNode(circuit, device, diff_method=method, **kwargs))(x)
        assert abs(shifted - backprop) > error


@pytest.mark.parametrize(
    ("interface_name", "config", "mode"),
    interface_config_params(configs=[*ADJOINT_CONFIGS, BEST]),
)
def test_postselection_differentiated_by_the_adjoint_method(interface_name, config, mode):
    """The adjoint method (and "best", which takes it) steps back through the
    postselecting projector: default.qubit's backprop derivatives, where parameter-shift
    is wrong (tests/preprocess/test_postselection_adjoint.py)."""
    iface = interface(interface_name)
    ours, ref = qnodes(postselecting_circuit, interface_name, config, mode, wires=2)
    values = [X, Y]
    assert_same_result(ours(*iface.args(values)), ref(*iface.args(values)))
    jacobian = iface.jacobian(ours, iface.args(values))
    reference = iface.for_reference_derivatives()
    expected = reference.jacobian(ref, reference.args(values))
    assert_same_derivatives(jacobian, expected, atol=ATOL)
    assert max(np.abs(e).max() for e in expected) > 0.1


@pytest.mark.parametrize("interface_name", INTERFACE_NAMES)
@pytest.mark.parametrize("config", [ADJOINT_VJP, PARAMETER_SHIFT, BEST], ids=lambda c: c.name)
def test_no_operations(interface_name, config):
    """A QNode without gates: |0...0>'s results, of default.qubit's types."""

    def circuit():
        return qml.expval(qml.Z(0)), qml.probs(wires=[1]), qml.state()

    iface = interface(interface_name)
    ours, ref = qnodes(circuit, interface_name, config, "deferred", wires=2)
    result, expected = ours(), ref()
    assert_same_types(result, expected, iface.array_types)
    assert_same_result(result, expected)


@pytest.mark.parametrize("returns", ["expval_probs", "state", "var"])
@pytest.mark.parametrize(
    ("config", "mode"), config_mode_params([ADJOINT_JACOBIAN_ON_EXECUTION, ADJOINT_VJP])
)
def test_qnode_returns_on_gpu_backend(config, mode, returns, gpu_double):
    """Key cases on the cuStateVec backend (its NumPy double): torch QNodes' results and
    Jacobians are default.qubit's."""
    iface = interface("torch")
    ours, ref = qnodes(circuit_returning(returns), "torch", config, mode, backend="custatevec")
    assert ours.device.backend_name == "custatevec"
    assert_qnode_conforms(ours, ref, iface, [X, Y], reference_key=("returns", returns))
