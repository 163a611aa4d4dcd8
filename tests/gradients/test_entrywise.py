"""Trainable unitary matrices under the adjoint method, taken by their entries.

The derivative of a QNode by a ``QubitUnitary``'s matrix (or a ``ControlledQubitUnitary``'s,
or a ``BlockEncode``'s data) is compared with default.qubit's backpropagation through the
matrix product, in every interface, both accumulation modes and both backends; the
directional derivatives along the unitary directions are compared with finite differences
of the circuit at matrices where the rotation-angle decomposition that PennyLane's
gradient transforms (and default.qubit's adjoint method) differentiate is degenerate: the
identity and diagonal matrices, where that decomposition's derivative is wrong.
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import scipy.linalg
from conftest import make_devices, stable_seed
from pennylane.exceptions import DeviceError
from pennylane.tape import QuantumScript
from scipy.stats import unitary_group

from pennylane_custatevec.entrywise import (
    MAX_ENTRYWISE_CONTROLLED_QUBITS,
    MAX_ENTRYWISE_QUBITS,
    MAX_ENTRYWISE_STATE_QUBITS,
    MAX_JIT_ENTRYWISE_QUBITS,
    EntrywiseUnitary,
)
from pennylane_custatevec.preprocess.adjoint import entrywise_trainable_operators

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy

ATOL = 1e-10
WIRES = ["a", 3, "q1"]
MODES = pytest.mark.parametrize("mode", ["deferred", "eager"])
PAULIS = [np.eye(2), qml.matrix(qml.X(0)), qml.matrix(qml.Y(0)), qml.matrix(qml.Z(0))]


pytestmark = pytest.mark.usefixtures("jax_float64")


@pytest.fixture
def backend(each_backend):
    return each_backend


def _matrices(kind: str, dimension: int) -> np.ndarray:
    if kind == "identity":
        return np.eye(dimension, dtype=np.complex128)
    if kind == "diagonal":
        phases = np.linspace(0.2, -0.9, dimension)
        return np.diag(np.exp(1j * phases))
    return unitary_group.rvs(dimension, random_state=stable_seed("entrywise", dimension) % 2**31)


def _body(kind: str, measurement: str):
    """A circuit around a trainable matrix gate ``kind`` on WIRES, with ``measurement``."""

    def circuit(U, x):
        qml.RX(x, wires="a")
        qml.Hadamard(wires=3)
        qml.RY(0.3, wires="q1")
        if kind == "one":
            qml.QubitUnitary(U, wires=[3])
        elif kind == "two":
            qml.QubitUnitary(U, wires=["q1", "a"])
        elif kind == "controlled":
            qml.ControlledQubitUnitary(U, wires=["a", "q1", 3], control_values=[1, 0])
        qml.CNOT(wires=["a", 3])
        qml.RZ(0.2, wires=3)
        qml.CRY(0.4, wires=[3, "q1"])
        return _measured(measurement)

    return circuit


def _weights(size: int) -> np.ndarray:
    return np.linspace(0.3, 1.1, size)


def _torch_gradients(qnode, U, x):
    U = torch.tensor(U, requires_grad=True)
    x = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    out = qnode(U, x)
    out = torch.hstack(out) if isinstance(out, tuple) else out
    if out.is_complex():
        out = torch.cat([out.real, out.imag])
    (out * torch.tensor(_weights(out.numel())).reshape(out.shape)).sum().backward()
    # torch's gradient of a complex parameter is the conjugate of jax's and autograd's
    return np.conj(U.grad.numpy()), x.grad.numpy()


def _jax_gradients(qnode, U, x, jit: bool = False):
    def loss(U, x):
        out = qnode(U, x)
        out = jnp.hstack(out) if isinstance(out, tuple) else out
        if jnp.iscomplexobj(out):
            out = jnp.concatenate([out.real, out.imag])
        return (out * jnp.array(_weights(out.size)).reshape(out.shape)).sum()

    gradient = jax.grad(loss, argnums=(0, 1))
    if jit:
        gradient = jax.jit(gradient)
    return tuple(np.asarray(g) for g in gradient(jnp.array(U), jnp.array(x)))


def _autograd_gradients(qnode, U, x):
    def loss(U, x):
        out = qnode(U, x)
        out = qml.math.hstack(out) if isinstance(out, tuple) else out
        if np.iscomplexobj(qml.math.unwrap(out)):
            out = qml.math.concatenate([qml.math.real(out), qml.math.imag(out)])
        return qml.math.sum(out * _weights(qml.math.size(out)).reshape(qml.math.shape(out)))

    values = (qml.numpy.array(U, requires_grad=True), qml.numpy.array(x, requires_grad=True))
    return tuple(np.asarray(g) for g in qml.grad(loss, argnums=[0, 1])(*values))


GRADIENTS = {
    "torch": _torch_gradients,
    "jax": _jax_gradients,
    "jax-jit": lambda qnode, U, x: _jax_gradients(qnode, U, x, jit=True),
    "autograd": _autograd_gradients,
}


def _compare(backend, mode, interface, kind, measurement, point, device_vjp):
    dimension = 4 if kind == "two" else 2
    body = _body(kind, measurement)
    _compare_with_backpropagation(
        backend, mode, interface, body, _matrices(point, dimension), device_vjp
    )


def _compare_with_backpropagation(backend, mode, interface, body, argument, device_vjp):
    """The device's adjoint gradients of ``body(argument, 0.4)`` equal default.qubit's
    backpropagation's (and are finite)."""
    dev, ref = make_devices(WIRES, backend=backend, grad_accumulation=mode)
    framework = "jax" if interface.startswith("jax") else interface
    qnode = qml.QNode(body, dev, interface=framework, diff_method="adjoint", device_vjp=device_vjp)
    expected = GRADIENTS[interface](
        qml.QNode(body, ref, interface=framework, diff_method="backprop"), argument, 0.4
    )
    got = GRADIENTS[interface](qnode, argument, 0.4)
    for g, e in zip(got, expected, strict=True):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, e, atol=ATOL, rtol=0)


@MODES
@pytest.mark.parametrize("interface", ["torch", "jax", "autograd"])
@pytest.mark.parametrize("measurement", ["expval", "var", "probs", "several", "state"])
@pytest.mark.parametrize("device_vjp", [True, False])
def test_equals_backpropagation(backend, mode, interface, measurement, device_vjp):
    """The gradient by every entry of U (and by the angle beside it) is default.qubit's
    backpropagation's, at the identity, where the decompositions' derivatives are wrong."""
    _compare(backend, mode, interface, "one", measurement, "identity", device_vjp)


@pytest.mark.parametrize("interface", ["torch", "jax", "jax-jit"])
@pytest.mark.parametrize("kind", ["one", "two", "controlled"])
@pytest.mark.parametrize("point", ["identity", "diagonal", "random"])
def test_gates_and_points(interface, kind, point):
    """One- and two-qubit unitaries on unordered wires and a controlled unitary with a
    control value 0 (PennyLane cannot build a ControlledQubitUnitary of an autograd
    array), at the identity, a diagonal matrix and a random unitary."""
    _compare("cpu", "deferred", interface, kind, "expval", point, True)


@pytest.mark.parametrize("diff_method", ["adjoint", "best"])
@pytest.mark.parametrize("point", ["identity", "diagonal"])
def test_directional_derivatives_along_unitary_directions(diff_method, point):
    """d/dt f(U exp(i t P)) at t = 0 for every Pauli P, from the device's gradient, equals the
    finite difference of the circuit. Before, "best" (parameter-shift through the ZYZ
    decomposition) gave 0 along X at the identity, where the value changes; the adjoint
    method refused."""
    U = _matrices(point, 2)
    dev, ref = make_devices(WIRES)
    body = _body("one", "expval")
    matrix = torch.tensor(U, requires_grad=True)
    qml.QNode(body, dev, interface="torch", diff_method=diff_method)(matrix, 0.4).backward()
    gradient = np.conj(matrix.grad.numpy())  # jax's convention: df = Re sum g dU

    def value(matrix):
        return float(qml.QNode(body, ref)(matrix, 0.4))

    for pauli in PAULIS:
        direction = U @ (1j * pauli)
        step = 1e-5
        difference = (
            value(U @ scipy.linalg.expm(1j * step * pauli))
            - value(U @ scipy.linalg.expm(-1j * step * pauli))
        ) / (2 * step)
        assert np.real(np.sum(gradient * direction)) == pytest.approx(difference, abs=1e-8)
    # at the identity the value is not stationary along X: a zero gradient is wrong there
    assert np.abs(gradient).max() > 0.1


@MODES
def test_a_real_matrix_gets_a_real_gradient(mode):
    """A float64 orthogonal matrix (torch): its imaginary parts are zeros that the
    framework differentiates away; the gradient is real and backpropagation's."""
    angle = 0.7
    U = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    dev, ref = make_devices(WIRES, grad_accumulation=mode)
    body = _body("one", "expval")
    gradients = []
    for device, method in ((dev, "adjoint"), (ref, "backprop")):
        matrix = torch.tensor(U, requires_grad=True)
        qml.QNode(body, device, interface="torch", diff_method=method)(matrix, 0.4).backward()
        assert matrix.grad.dtype == torch.float64
        gradients.append(matrix.grad.numpy())
    np.testing.assert_allclose(gradients[0], gradients[1], atol=ATOL, rtol=0)


@MODES
def test_a_broadcast_matrix(mode):
    """A batch of unitaries (a broadcast trainable parameter): one circuit per entry."""
    batch = np.stack([_matrices(point, 2) for point in ("identity", "diagonal", "random")])
    dev, ref = make_devices(WIRES, grad_accumulation=mode)
    body = _body("one", "expval")
    gradients = []
    for device, method in ((dev, "adjoint"), (ref, "backprop")):
        matrix = torch.tensor(batch, requires_grad=True)
        qml.QNode(body, device, interface="torch", diff_method=method)(matrix, 0.4).sum().backward()
        gradients.append(matrix.grad.numpy())
    np.testing.assert_allclose(gradients[0], gradients[1], atol=ATOL, rtol=0)


def test_block_encoding():
    """A trainable BlockEncode: its matrix, a function of its data that jax
    differentiates; before, "best" took parameter-shift, which leaked a jax tracer
    (default.qubit's parameter-shift does too)."""
    dev, ref = make_devices(2)

    def body(a):
        qml.BlockEncode(a, wires=[0, 1])
        return qml.expval(qml.Z(0) + 0.5 * qml.X(1))

    a = jnp.array([[0.2, 0.1], [0.3, -0.4]])
    got = jax.grad(qml.QNode(body, dev))(a)
    expected = jax.grad(qml.QNode(body, ref, diff_method="backprop"))(a)
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0)


def test_the_preprocessing_takes_a_trainable_unitary_by_its_entries():
    """Only where it is trainable; a constant one stays a QubitUnitary."""
    U = torch.tensor(_matrices("random", 2), requires_grad=True)
    operations = [
        qml.QubitUnitary(U, wires=[0]),
        qml.QubitUnitary(torch.tensor(_matrices("diagonal", 2)), wires=[1]),
    ]
    tape = QuantumScript(operations, [qml.expval(qml.Z(0))])
    (tape,), _ = entrywise_trainable_operators(tape)
    first, second = tape.operations
    assert isinstance(first, EntrywiseUnitary) and len(first.data) == 8
    assert all(value.requires_grad for value in first.data)
    assert type(second) is qml.QubitUnitary
    np.testing.assert_allclose(first.matrix().detach().numpy(), U.detach().numpy(), atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["unitary", "state"])
def test_too_wide_is_refused_by_name(kind):
    """A trainable unitary on more than MAX_ENTRYWISE_QUBITS wires, a trainable state
    preparation on more than MAX_ENTRYWISE_STATE_QUBITS: a DeviceError naming the limit."""
    limit = MAX_ENTRYWISE_QUBITS if kind == "unitary" else MAX_ENTRYWISE_STATE_QUBITS
    wires = limit + 1
    dev = qml.device("custatevec.qubit", wires=wires)
    if kind == "unitary":
        value = torch.tensor(np.eye(2**wires, dtype=np.complex128), requires_grad=True)
    else:
        value = torch.tensor(np.eye(1, 2**wires, dtype=np.complex128)[0], requires_grad=True)

    @qml.qnode(dev, interface="torch", diff_method="adjoint")
    def circuit(value):
        if kind == "unitary":
            qml.QubitUnitary(value, wires=range(wires))
        else:
            qml.StatePrep(value, wires=range(wires))
        return qml.expval(qml.Z(0))

    with pytest.raises(DeviceError, match=f"at most {limit} wires"):
        circuit(value)


def _wide_controlled_body(controls: int, targets: int):
    """A controlled unitary with ``controls`` controls (values 1, 0, 1, ...) and ``targets``
    targets, among gates on every wire; each control leans towards its control value."""
    wires = list(range(controls + targets))
    values = [(k + 1) % 2 for k in range(controls)]

    def body(U, x):
        for w in wires:
            leaning = w < controls and values[w] == 1
            qml.RY((2.2 if leaning else 0.6) + 0.1 * w, wires=w)
        qml.RX(x, wires=0)
        qml.ControlledQubitUnitary(U, wires=wires, control_values=values)
        qml.CNOT(wires=[wires[-1], 0])
        return qml.expval(qml.Z(0) @ qml.X(wires[-1]) + 0.4 * qml.Y(controls))

    return wires, body


@pytest.mark.parametrize("interface", ["torch", "jax-jit"])
@pytest.mark.parametrize("controls, targets", [(1, 2), (3, 4)])
def test_a_controlled_unitary_by_its_base_entries(interface, controls, targets):
    """A ControlledQubitUnitary is taken by its base's 2 * 4**t entries (t targets), its
    controls as control values: one wider than MAX_ENTRYWISE_QUBITS in all (7 and 8
    wires), which the adjoint method refused before, equals default.qubit's
    backpropagation; its parameters are the base's entries alone."""
    wires, body = _wide_controlled_body(controls, targets)
    U = unitary_group.rvs(2**targets, random_state=stable_seed("controlled", targets) % 2**31)
    dev, ref = make_devices(len(wires))
    framework = "jax" if interface == "jax-jit" else interface
    qnode = qml.QNode(body, dev, interface=framework, diff_method="adjoint")
    expected = GRADIENTS[interface](
        qml.QNode(body, ref, interface=framework, diff_method="backprop"), U, 0.4
    )
    got = GRADIENTS[interface](qnode, U, 0.4)
    for g, e in zip(got, expected, strict=True):
        assert np.abs(e).max() > 1e-3
        np.testing.assert_allclose(g, e, atol=ATOL, rtol=0)
    tape = QuantumScript(
        [
            qml.ControlledQubitUnitary(
                torch.tensor(U, requires_grad=True),
                wires=wires,
                control_values=[1, 0, 1][:controls],
            )
        ],
        [qml.expval(qml.Z(0))],
    )
    (tape,), _ = entrywise_trainable_operators(tape)
    (op,) = tape.operations
    assert isinstance(op, EntrywiseUnitary) and len(op.data) == 2 * 4**targets
    assert op.control_values == (1, 0, 1)[:controls]
    full = qml.matrix(
        qml.ControlledQubitUnitary(U, wires=wires, control_values=[1, 0, 1][:controls])
    )
    np.testing.assert_allclose(op.matrix().detach().numpy(), full, atol=1e-15, rtol=0)


def test_a_controlled_unitary_too_wide_in_all_is_refused_by_name():
    """Controls count toward MAX_ENTRYWISE_CONTROLLED_QUBITS (the dense block the sweep
    reduces): one control more is refused by name."""
    targets = 2
    wires, body = _wide_controlled_body(MAX_ENTRYWISE_CONTROLLED_QUBITS - targets + 1, targets)
    dev = qml.device("custatevec.qubit", wires=len(wires))
    U = torch.tensor(np.eye(2**targets, dtype=np.complex128), requires_grad=True)
    qnode = qml.QNode(body, dev, interface="torch", diff_method="adjoint")
    with pytest.raises(DeviceError, match=f"{MAX_ENTRYWISE_CONTROLLED_QUBITS} wires in all"):
        qnode(U, torch.tensor(0.4))


def _jit_traced_body(targets: int, depends_on_x: bool = True):
    """A controlled unitary whose matrix jax computes inside the jitted function (as
    PennyLane's QuantumMonteCarlo does): traced by jax.jit, trainable to PennyLane; a
    function of x (a phase exp(0.3j x) on its block) or of constants alone."""
    wires = list(range(targets + 1))
    base = unitary_group.rvs(2**targets, random_state=stable_seed("jit", targets) % 2**31)

    def body(x):
        qml.Hadamard(wires=0)
        qml.RY(x, wires=1)
        phase = jnp.exp(0.3j * x) if depends_on_x else jnp.cos(jnp.array(0.0))
        qml.ControlledQubitUnitary(jnp.array(base) * phase, wires=wires)
        return qml.expval(qml.Y(0) @ qml.X(targets) + 0.5 * qml.Z(1))

    return wires, body


def _backpropagation_gradient(body, ref, x):
    return jax.grad(qml.QNode(body, ref, interface="jax", diff_method="backprop"))(x)


def test_a_wide_jit_traced_matrix_runs_forward_and_its_derivative_is_refused_by_name():
    """Traced by jax.jit with no derivative being taken, a matrix wider than
    MAX_JIT_ENTRYWISE_QUBITS is left whole: the forward jax.jit runs and equals
    default.qubit's (before, "best" crashed in PennyLane's parameter-shift, as in PennyLane's
    QuantumMonteCarlo jit test, and taken entry by entry XLA compiled its 2 * 4**k callback
    operands for minutes). jax.grad(jax.jit(f)) differentiates the circuit where the
    matrix depends on constants alone, and is refused by name (naming
    jax.jit(jax.grad(f))) where it depends on x, before PennyLane's JVP rule fails on the
    matrix's shape; jax.jit(jax.grad(f)) differentiates it by its entries."""
    targets = MAX_JIT_ENTRYWISE_QUBITS + 1
    dev, ref = make_devices(targets + 1)
    x = jnp.array(0.7)
    for depends_on_x in (True, False):
        _, body = _jit_traced_body(targets, depends_on_x)
        expected = qml.QNode(body, ref, interface="jax")(x)
        assert abs(float(expected)) > 1e-3
        for diff_method in ("best", "adjoint"):
            qnode = qml.QNode(body, dev, interface="jax", diff_method=diff_method)
            np.testing.assert_allclose(jax.jit(qnode)(x), expected, atol=ATOL, rtol=0)
    _, constant = _jit_traced_body(targets, depends_on_x=False)
    qnode = qml.QNode(constant, dev, interface="jax", diff_method="adjoint")
    expected = _backpropagation_gradient(constant, ref, x)
    assert abs(float(expected)) > 1e-3
    np.testing.assert_allclose(jax.grad(jax.jit(qnode))(x), expected, atol=ATOL, rtol=0)
    _, varying = _jit_traced_body(targets, depends_on_x=True)
    qnode = qml.QNode(varying, dev, interface="jax", diff_method="adjoint")
    with pytest.raises(DeviceError, match=r"jax\.jit\(jax\.grad\(f\)\)"):
        jax.grad(jax.jit(qnode))(x)


def test_a_narrow_jit_traced_matrix_is_differentiated_through_the_jit():
    """At MAX_JIT_ENTRYWISE_QUBITS the matrix is taken by its entries under jax.jit too:
    jax.grad(jax.jit(f)) and jax.jit(jax.grad(f)) equal default.qubit's backpropagation
    where the matrix depends on x."""
    wires, body = _jit_traced_body(MAX_JIT_ENTRYWISE_QUBITS)
    dev, ref = make_devices(len(wires))
    x = jnp.array(0.7)
    qnode = qml.QNode(body, dev, interface="jax", diff_method="adjoint")
    expected = _backpropagation_gradient(body, ref, x)
    assert abs(float(expected)) > 1e-3
    np.testing.assert_allclose(jax.grad(jax.jit(qnode))(x), expected, atol=ATOL, rtol=0)


def test_a_tape_that_skipped_the_preprocessing_is_refused_by_name():
    """compute_vjp on a tape with a trainable QubitUnitary that the device's preprocessing
    did not see: a clear error, not a wrong number."""
    dev = qml.device("custatevec.qubit", wires=1)
    U = qml.numpy.array(_matrices("random", 2), requires_grad=True)
    tape = QuantumScript([qml.QubitUnitary(U, wires=0)], [qml.expval(qml.Z(0))])
    tape.trainable_params = [0]
    with pytest.raises(DeviceError, match="device's preprocessing"):
        dev.compute_vjp([tape], [1.0])


# ---------------------------------------------------------------------------------------
# A trainable state preparation, taken by its amplitudes


def _state_body(kind: str, measurement: str):
    """A circuit opened by a trainable state preparation ``kind`` on two of WIRES."""

    def circuit(v, x):
        if kind == "stateprep":
            qml.StatePrep(v, wires=["q1", "a"])
        elif kind == "normalized":
            qml.StatePrep(v, wires=["q1", "a"], normalize=True)
        else:  # three features padded to four, normalised
            qml.AmplitudeEmbedding(v[..., :3], wires=[3, "q1"], pad_with=0.0, normalize=True)
        qml.RX(x, wires="a")
        qml.CNOT(wires=["a", 3])
        qml.RY(0.3, wires="q1")
        return _measured(measurement)

    return circuit


def _measured(measurement: str):
    if measurement == "expval":
        return qml.expval(qml.X("a") @ qml.Z(3) + 0.3 * qml.Y(3) + 0.2 * qml.Z("q1"))
    if measurement == "var":
        return qml.var(qml.X(3) @ qml.Y("q1"))
    if measurement == "probs":
        return qml.probs(wires=[3, "q1"])
    if measurement == "several":
        return qml.expval(qml.X("a") @ qml.Z(3)), qml.probs(wires=["a"])
    return qml.state()


STATES = {
    "basis": np.array([1.0, 0.0, 0.0, 0.0], dtype=np.complex128),
    "sparse": np.array([0.6, 0.0, 0.8j, 0.0]),
    "random": np.array([0.5, 0.5j, -0.5, 0.5]),
}


def _compare_state(backend, mode, interface, kind, measurement, point, device_vjp):
    v = STATES[point]
    if kind == "normalized":
        v = 2.5 * v
    if kind == "embedding":
        v = np.real(v) + 0.1  # real features
    body = _state_body(kind, measurement)
    _compare_with_backpropagation(backend, mode, interface, body, v, device_vjp)


@MODES
@pytest.mark.parametrize("interface", ["torch", "jax", "autograd"])
@pytest.mark.parametrize("measurement", ["expval", "var", "probs", "several", "state"])
@pytest.mark.parametrize("device_vjp", [True, False])
def test_state_preparation_equals_backpropagation(
    backend, mode, interface, measurement, device_vjp
):
    """The gradient by every amplitude of a prepared state with zero amplitudes (where the
    Mottonen decomposition that parameter-shift and default.qubit's adjoint method
    differentiate gives NaN) is default.qubit's backpropagation's."""
    _compare_state(backend, mode, interface, "stateprep", measurement, "sparse", device_vjp)


@pytest.mark.parametrize("interface", ["torch", "jax", "jax-jit"])
@pytest.mark.parametrize("kind", ["stateprep", "normalized", "embedding"])
@pytest.mark.parametrize("point", ["basis", "sparse", "random"])
def test_state_preparations_and_points(interface, kind, point):
    """StatePrep, StatePrep(normalize=True) and a padded, normalised AmplitudeEmbedding
    (whose normalisation and padding the framework differentiates), on wires out of the
    device's order, at a basis state, a state with zero amplitudes and a generic one."""
    _compare_state("cpu", "deferred", interface, kind, "expval", point, True)


def test_state_preparation_at_a_basis_state_is_not_nan():
    """ "best" took parameter-shift through Mottonen's decomposition: NaN at |00>."""
    dev, ref = make_devices(WIRES)
    body = _state_body("stateprep", "expval")
    gradients = []
    for device, method in ((dev, "best"), (ref, "backprop")):
        v = torch.tensor(STATES["basis"], requires_grad=True)
        qml.QNode(body, device, interface="torch", diff_method=method)(v, 0.4).backward()
        gradients.append(v.grad.numpy())
    assert np.all(np.isfinite(gradients[0]))
    np.testing.assert_allclose(gradients[0], gradients[1], atol=ATOL, rtol=0)


def test_block_encoding_of_torch_data_is_refused_by_name():
    """PennyLane 0.45's BlockEncode matrix loses torch's gradient (d/da of its
    sqrt(1 - a**2) entry comes out 0, on default.qubit's backpropagation too): a clear
    error rather than that 0."""
    dev = qml.device("custatevec.qubit", wires=1)

    @qml.qnode(dev, interface="torch", diff_method="adjoint")
    def circuit(a):
        qml.BlockEncode(a, wires=[0])
        return qml.expval(qml.X(0))

    with pytest.raises(DeviceError, match="BlockEncode of torch data"):
        circuit(torch.tensor(0.3, dtype=torch.float64, requires_grad=True))


def _pulse_body(return_intermediate: bool = False):
    """A two-wire pulse of two piecewise-constant amplitudes between gates."""
    hamiltonian = (
        qml.pulse.pwc((1, 6)) * qml.X(0)
        + qml.pulse.pwc((0.5, 3)) * qml.Y(1)
        + 0.3 * qml.Z(0) @ qml.Z(1)
    )
    times = jnp.linspace(0, 4, 3) if return_intermediate else (0, 4)

    def body(params):
        qml.Hadamard(0)
        qml.evolve(hamiltonian, atol=1e-13, rtol=1e-13, return_intermediate=return_intermediate)(
            params=params, t=times
        )
        qml.CNOT([0, 1])
        return qml.expval(qml.Z(0) @ qml.X(1) + 0.5 * qml.Y(0))

    return body


def _pulse_parameters():
    return [jnp.linspace(0, 0.9, 10), jnp.linspace(0.3, -0.4, 10)]


@MODES
@pytest.mark.parametrize("diff_method", ["adjoint", "best"])
@pytest.mark.parametrize("return_intermediate", [False, True])
def test_pulse_by_its_evolution(mode, diff_method, return_intermediate):
    """A pulse (qml.evolve of a parametrized Hamiltonian) by its evolution's matrix
    entries, which jax differentiates through its ODE solver: default.qubit's
    backpropagation to the solvers' tolerance (they solve different ODEs: the matrix's, the
    state's), also broadcast over intermediate times. Before, the adjoint method refused
    it, and parameter-shift has no rule."""
    body = _pulse_body(return_intermediate)

    def summed(qnode):
        return lambda params: jnp.sum(qnode(params))

    params = _pulse_parameters()
    ref = qml.QNode(body, qml.device("default.qubit", wires=2), diff_method="backprop")
    want = jax.grad(summed(ref))(params)
    dev = qml.device("custatevec.qubit", wires=2, grad_accumulation=mode)
    got = jax.grad(summed(qml.QNode(body, dev, diff_method=diff_method)))(params)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-8, rtol=0)
    assert np.abs(np.asarray(want[0])).max() > 0.1


@pytest.mark.parametrize("diff_method", ["adjoint", "best"])
def test_pulse_derivatives_under_jit(diff_method):
    """Under jax.jit the pulse's matrix (jax's ODE solver) is compiled into the jitted
    program beside the device's callback, which ``results_off_the_jit_root`` keeps from
    aborting jaxlib 0.7.1: values and ``jax.jit(jax.grad)`` and ``jax.grad(jax.jit)``
    equal default.qubit's backpropagation to the solvers' tolerance. Before, the
    derivative was refused by name (and a forward jax.jit with "adjoint" too)."""
    body, params = _pulse_body(), _pulse_parameters()
    ref = qml.QNode(body, qml.device("default.qubit", wires=2), diff_method="backprop")
    qnode = qml.QNode(body, qml.device("custatevec.qubit", wires=2), diff_method=diff_method)
    np.testing.assert_allclose(jax.jit(qnode)(params), ref(params), atol=1e-8, rtol=0)
    want = jax.grad(ref)(params)
    assert np.abs(np.asarray(want[0])).max() > 0.1
    for got in (jax.jit(jax.grad(qnode))(params), jax.grad(jax.jit(qnode))(params)):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-8, rtol=0)


@pytest.mark.parametrize("diff_method", ["best", "adjoint"])
def test_a_pulse_without_parameters_by_its_times(diff_method):
    """A pulse without parameters (``qml.evolve(H)([], t)``, PennyLane's test_rydberg.py)
    whose times are traced or differentiated is taken by its matrix's entries too: values
    and derivatives by the time, with and without jax.jit, equal default.qubit's
    backpropagation (before, its traced times were refused by name)."""
    hamiltonian = qml.pulse.rydberg_interaction([[0, 0], [0, 5], [5, 0]]) + (
        qml.pulse.rydberg_drive(3, 2, 4, [0, 1, 2])
    )

    def body(t):
        qml.evolve(hamiltonian, atol=1e-12, rtol=1e-12)([], t)
        return qml.expval(qml.Z(0) + 0.5 * qml.Y(1))

    ref = qml.QNode(body, qml.device("default.qubit", wires=3), diff_method="backprop")
    dev = qml.device("custatevec.qubit", wires=3)
    qnode = qml.QNode(body, dev, interface="jax", diff_method=diff_method)
    np.testing.assert_allclose(jax.jit(qnode)(0.7), ref(0.7), atol=1e-9, rtol=0)
    want = jax.grad(ref)(0.7)
    assert abs(want) > 1.0
    for got in (jax.grad(qnode)(0.7), jax.jit(jax.grad(qnode))(0.7)):
        np.testing.assert_allclose(got, want, atol=1e-8, rtol=0)


@pytest.mark.parametrize("diff_method", ["best", "adjoint", "parameter-shift", None])
def test_a_pulse_with_jit_traced_times(diff_method):
    """With the adjoint method (and "best") a pulse is computed where jax traces, its
    jit-traced times too: values and derivatives by parameters and times equal
    default.qubit's backpropagation. Where it would reach PennyLane's jit callback
    (gradient transforms, diff_method=None), which receives the pulse's parameters but
    leaves its times traced (jax's UnexpectedTracerError came from inside the callback:
    PennyLane's test_rydberg.py), it is refused by name where jax.jit traces; with times
    closed over it runs."""
    hamiltonian = qml.pulse.pwc((0, 2)) * qml.X(0) + 0.4 * qml.Z(0) @ qml.Z(1)
    dev = qml.device("custatevec.qubit", wires=2)

    def body(params, t):
        qml.evolve(hamiltonian, atol=1e-12, rtol=1e-12)(params, t)
        return qml.expval(qml.Z(0) @ qml.Z(1) + qml.Y(0))

    params = [jnp.linspace(0.2, 1.0, 4)]
    qnode = qml.QNode(body, dev, diff_method=diff_method)
    ref = qml.QNode(body, qml.device("default.qubit", wires=2), diff_method="backprop")
    if diff_method in ("best", "adjoint"):
        np.testing.assert_allclose(jax.jit(qnode)(params, 1.5), ref(params, 1.5), atol=1e-9)
        got = jax.jit(jax.grad(qnode, argnums=(0, 1)))(params, 1.5)
        want = jax.grad(ref, argnums=(0, 1))(params, 1.5)
        np.testing.assert_allclose(got[0][0], want[0][0], atol=1e-8, rtol=0)
        np.testing.assert_allclose(got[1], want[1], atol=1e-8, rtol=0)
        assert abs(want[1]) > 0.01
        return
    with pytest.raises(DeviceError, match="under jax.jit with traced times"):
        jax.jit(qnode)(params, 1.5)
    closed_over = jax.jit(lambda p: qnode(p, 1.5))
    np.testing.assert_allclose(closed_over(params), ref(params, 1.5), atol=1e-9)
