"""The adjoint method through postselection (a postselected mid-circuit measurement under
``mcm_method="deferred"``, or a ``qml.Projector`` applied as a gate), compared with
default.qubit's backpropagation.

The result of a postselecting circuit is a ratio N/D of the unnormalised expectation and
the kept probability; PennyLane's parameter-shift rule does not hold for it (PennyLane
issue #5943: default.qubit's parameter-shift gives -0.242 where the derivative is -0.767
for ``_circuit``'s first parameter). The eager sweep steps back through each projector,
removing from each bra its part along the renormalised state (``eager.
_back_through_postselection``; a state's Jacobian in forward mode, ``common.
_renormalised_derivatives``): exact, in both accumulation modes (the deferred mode hands
such tapes to the eager sweep), with and without device VJPs.
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from conftest import DEVICE
from pennylane.exceptions import DeviceError

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
jnp = jax.numpy

pytestmark = pytest.mark.usefixtures("jax_float64")

MODES = pytest.mark.parametrize("mode", ["deferred", "eager"])
ATOL = 1e-10


def _measured(kind: str):
    if kind == "expval":
        return [qml.expval(qml.Z(1) @ qml.X(2) + 0.3 * qml.Y(0))]
    if kind == "var":
        return [qml.var(qml.X(1) + 0.5 * qml.Z(2))]
    if kind == "probs":
        return [qml.probs(wires=[1, 2])]
    return [qml.expval(qml.Y(2)), qml.var(qml.Z(1)), qml.probs(wires=[0])]


def _one_postselection(x, kind):
    qml.RX(x[0], 0)
    qml.CNOT([0, 1])
    qml.RY(x[1], 1)
    qml.H(2)
    qml.CRX(x[2], [2, 0])
    qml.measure(0, postselect=1)
    qml.RY(x[3], 1)
    qml.CNOT([1, 2])
    return _measured(kind)


def _two_postselections(x, kind):
    qml.RY(x[0], 0)
    qml.IsingXY(x[1], [0, 1])
    qml.H(2)
    qml.measure(1, postselect=0)
    qml.CRY(x[2], [2, 1])
    qml.CNOT([0, 2])
    qml.RX(0.8, 0)
    qml.measure(0, postselect=1, reset=True)
    qml.RZ(x[3], 2)
    qml.IsingZZ(x[0], [1, 2])
    qml.H(2)
    return _measured(kind)


def _projector_gates(x, kind):
    """A user's projectors applied as gates: onto a basis state and onto a state vector
    (default.qubit renormalises after them too)."""
    qml.RY(x[0], 0)
    qml.RX(x[1], 1)
    qml.CNOT([0, 2])
    qml.CRY(0.7, [1, 0])
    qml.IsingXX(x[2], [1, 2])
    qml.Projector([1], wires=[0])
    qml.RY(x[3], 1)
    qml.CNOT([1, 2])
    qml.Projector(np.array([0.6, 0.8]), wires=[2])
    qml.RX(0.3, 0)
    qml.CRX(0.5, [1, 2])
    return _measured(kind)


CIRCUITS = {
    "one": _one_postselection,
    "two": _two_postselections,
    "projectors": _projector_gates,
}
X = np.array([0.7, -0.4, 1.1, 0.5])


def _flat(qnode, kind):
    return lambda x: jnp.hstack([jnp.ravel(r) for r in qnode(x, kind)])


def _reference_jacobian(body, kind, x=X):
    ref = qml.QNode(body, qml.device("default.qubit"), diff_method="backprop")
    return np.asarray(jax.jacobian(_flat(ref, kind))(jnp.array(x)))


@MODES
@pytest.mark.parametrize("circuit", sorted(CIRCUITS))
@pytest.mark.parametrize("kind", ["expval", "var", "probs", "several"])
@pytest.mark.parametrize("device_vjp", [False, True])
def test_jax_jacobian_equals_backpropagation(each_backend, mode, circuit, kind, device_vjp):
    body = CIRCUITS[circuit]
    want = _reference_jacobian(body, kind)
    assert np.abs(want).max() > 0.05
    dev = qml.device(DEVICE, wires=6, backend=each_backend, grad_accumulation=mode)
    for diff_method in ("adjoint", "best"):
        qnode = qml.QNode(body, dev, diff_method=diff_method, device_vjp=device_vjp)
        got = jax.jacobian(_flat(qnode, kind))(jnp.array(X))
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


@MODES
@pytest.mark.parametrize("circuit", sorted(CIRCUITS))
def test_torch_and_autograd_gradients_equal_backpropagation(mode, circuit):
    body = CIRCUITS[circuit]
    want = _reference_jacobian(body, "expval")[0]
    dev = qml.device(DEVICE, wires=6, grad_accumulation=mode)
    x = torch.tensor(X, requires_grad=True)
    qml.QNode(body, dev, diff_method="adjoint")(x, "expval")[0].backward()
    np.testing.assert_allclose(x.grad.numpy(), want, atol=ATOL, rtol=0)
    node = qml.QNode(lambda x: body(x, "expval")[0], dev, diff_method="adjoint")
    got = qml.grad(node)(qml.numpy.array(X, requires_grad=True))
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def test_under_jax_jit_values_and_derivatives():
    """PennyLane's TestPostselection::test_postselection_valid_analytic with jax.jit: "best"
    took parameter-shift, whose refusal (PennyLane issue #5943) met the forward pass too,
    where jax.jit makes every parameter trainable; now "best" is the adjoint method."""
    body = CIRCUITS["one"]
    dev = qml.device(DEVICE, wires=6)
    qnode = qml.QNode(body, dev)
    ref = qml.QNode(body, qml.device("default.qubit"), diff_method="backprop")
    x = jnp.array(X)
    np.testing.assert_allclose(
        jax.jit(_flat(qnode, "several"))(x), _flat(ref, "several")(x), atol=ATOL, rtol=0
    )
    got = jax.jit(jax.jacobian(_flat(qnode, "several")))(x)
    np.testing.assert_allclose(got, _reference_jacobian(body, "several"), atol=ATOL, rtol=0)


@MODES
def test_with_trainable_matrix_and_prepared_state(mode):
    """Postselection beside the parts taken by their entries (a trainable StatePrep and
    QubitUnitary): the sweep runs back to the start through the projector."""

    def body(state, unitary, x):
        qml.StatePrep(state, wires=[0, 1])
        qml.RY(x, 2)
        qml.QubitUnitary(unitary, wires=[1])
        qml.CNOT([1, 2])
        qml.measure(2, postselect=0)
        qml.CRY(0.4, [0, 1])
        return qml.expval(qml.X(1) @ qml.Z(0))

    state = jnp.array([0.5, 0.5j, -0.5, 0.5])
    unitary = jnp.array(qml.matrix(qml.Rot(0.3, -0.8, 1.2, wires=0)))
    args = (state, unitary, jnp.array(0.9))
    ref = qml.QNode(body, qml.device("default.qubit"), diff_method="backprop")
    want = jax.grad(ref, argnums=(0, 1, 2))(*args)
    qnode = qml.QNode(body, qml.device(DEVICE, wires=4, grad_accumulation=mode))
    got = jax.grad(qnode, argnums=(0, 1, 2))(*args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=0)


@MODES
def test_broadcast_postselecting_circuit(mode):
    """A broadcast postselecting circuit is expanded first (the eager sweep takes one
    vector)."""

    def body(x, y):
        qml.RX(x, 0)
        qml.CRY(y, [0, 1])
        qml.measure(1, postselect=1)
        qml.RX(0.2, 0)
        return qml.expval(qml.Z(0))

    x, y = jnp.array([0.3, 1.2, 2.0]), jnp.array(0.8)
    ref = qml.QNode(body, qml.device("default.qubit"), diff_method="backprop")
    qnode = qml.QNode(body, qml.device(DEVICE, wires=3, grad_accumulation=mode))
    for argnums in (0, 1):
        want = jax.jacobian(ref, argnums=argnums)(x, y)
        np.testing.assert_allclose(jax.jacobian(qnode, argnums=argnums)(x, y), want, atol=ATOL)


def test_an_impossible_postselection_gives_nan_derivatives():
    def body(x):
        qml.RX(x, 0)
        qml.X(1)
        qml.measure(1, postselect=0)
        return qml.expval(qml.Z(0))

    qnode = qml.QNode(body, qml.device(DEVICE, wires=3), diff_method="adjoint")
    assert np.isnan(jax.grad(qnode)(jnp.array(0.4)))


def _state_after_projector(x):
    qml.RX(x[0], 0)
    qml.CNOT([0, 1])
    qml.RY(x[1], 1)
    qml.Projector([1], wires=[0])
    qml.RY(x[2], 0)
    qml.CRX(x[3], [1, 2])
    return qml.state()


def _measured_through_the_state(x):
    qml.RX(x[0], 0)
    qml.CNOT([0, 1])
    qml.RY(x[1], 1)
    qml.measure(0, postselect=1)
    qml.RY(x[2], 1)
    qml.CRX(x[3], [1, 2])
    return qml.density_matrix(wires=[1]), qml.purity(wires=[1]), qml.vn_entropy(wires=[1])


def _real_parts(qnode):
    return lambda x: jnp.hstack([jnp.ravel(jnp.real(r)) for r in qnode(x)])


@MODES
def test_the_state_of_a_postselecting_circuit(mode):
    """The state's Jacobian in forward mode through a projector (``common.
    _renormalised_derivatives``), and what the preprocessing measures from the state
    (density matrix, purity, entropy): default.qubit's backprop; also under jax.jit (which
    PennyLane's TestPostselection asks of density matrices and entropies)."""
    dev = qml.device(DEVICE, wires=3, grad_accumulation=mode)
    x = jnp.array(X)
    ref = qml.QNode(_state_after_projector, qml.device("default.qubit"), diff_method="backprop")
    qnode = qml.QNode(_state_after_projector, dev, diff_method="adjoint")
    want = jax.jacfwd(ref)(x)
    assert np.abs(want).max() > 0.1
    np.testing.assert_allclose(jax.jacfwd(qnode)(x), want, atol=ATOL, rtol=0)
    ref = qml.QNode(_measured_through_the_state, qml.device("default.qubit"))
    qnode = qml.QNode(_measured_through_the_state, dev)
    want = jax.jacobian(_real_parts(ref))(x)
    assert np.abs(want).max() > 0.1
    np.testing.assert_allclose(jax.jacobian(_real_parts(qnode))(x), want, atol=ATOL, rtol=0)
    np.testing.assert_allclose(
        jax.jit(_real_parts(qnode))(x), _real_parts(ref)(x), atol=ATOL, rtol=0
    )


def test_a_trainable_projector_basis_is_refused_by_name():
    def body(basis, x):
        qml.RX(x, 0)
        qml.Projector(basis, wires=[0])
        return qml.expval(qml.Z(0))

    qnode = qml.QNode(body, qml.device(DEVICE, wires=1), diff_method="adjoint")
    with pytest.raises(DeviceError, match="basis of the Projector"):
        jax.grad(qnode, argnums=(0, 1))(jnp.array([0.6, 0.8]), jnp.array(0.3))


def _reached_by_x_alone(x):
    """PennyLane issue #5943's circuit: x[0] changes the postselection's probability, and
    so <Z0>, but reaches no measured wire (every gradient transform takes its derivative to
    be 0; it is 0.49 at x[0] = 0.7)."""
    qml.Hadamard(0)
    qml.CNOT([0, 1])
    qml.RX(x[0], 1)
    qml.measure(1, postselect=1)
    qml.RX(x[1], 0)
    return qml.expval(qml.Z(0))


def _projected(x):
    """<Z0> does not change where x[0] = x[1], but each alone changes it (+-1.43 at 0.7);
    default.qubit's parameter-shift gives -0.07 and 0."""
    qml.RY(x[0], 0)
    qml.CNOT([0, 1])
    qml.RX(x[1], 1)
    qml.Projector([1], wires=1)
    qml.RX(x[2], 0)
    return qml.expval(qml.Z(0))


@pytest.mark.parametrize("circuit", [_reached_by_x_alone, _projected])
@pytest.mark.parametrize("diff_method", ["adjoint", "best"])
def test_the_circuits_where_gradient_transforms_are_wrong(circuit, diff_method):
    x = qml.numpy.array([0.7, 0.7, 0.4][: 2 if circuit is _reached_by_x_alone else 3])
    ref = qml.QNode(circuit, qml.device("default.qubit"), diff_method="backprop")
    shifted = qml.QNode(circuit, qml.device("default.qubit"), diff_method="parameter-shift")
    want = qml.grad(ref)(x)
    assert np.abs(qml.grad(shifted)(x) - want).max() > 0.3  # PennyLane's transform is wrong
    qnode = qml.QNode(circuit, qml.device(DEVICE, wires=3), diff_method=diff_method)
    np.testing.assert_allclose(qml.grad(qnode)(x), want, atol=ATOL, rtol=0)
