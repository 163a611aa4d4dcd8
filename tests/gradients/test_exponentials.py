"""Exponentials of operators (``qml.exp``, ``TrotterProduct``, ``QDrift``) with trainable
coefficients.

An ``Exp``'s parameter is its complex coefficient ``c``, not an angle. Three things went
wrong on this device (and on default.qubit, which returns the same wrong numbers):

* with torch, every method raised autoray's ``ImportError`` ('real_if_close') from
  PennyLane's decomposition of ``exp(c P)`` for a Pauli word ``P`` (``TrotterProduct`` and
  ``QDrift`` with a torch time, ``diff_method=None`` too);
* the adjoint method (and "best", which takes it) differentiated ``exp(c G)`` of another
  Hermitian ``G`` by its generator as if ``c`` were an angle: the derivative came out 0
  where it is -0.91;
* PennyLane's gradient transforms shift ``c`` along the real axis only: parameter-shift and
  finite differences give 0 for ``exp(c P)`` too.

The device now takes such an exponential by its real angle ``x = real(1j c)``
(``exp(c G) = exp(-i x G)``: a ``PauliRot`` or an ``Evolution``), where the framework
records, and refuses the gradient transforms by name. References: default.qubit's
backpropagation with jax (its matrix exponential is exact to round-off).
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from pennylane import numpy as pnp
from pennylane.exceptions import DeviceError

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy

pytestmark = pytest.mark.usefixtures("jax_float64")

ATOL = 1e-10
OBSERVABLE = qml.Z(0) @ qml.Y(1) + qml.Y(0) + qml.X(1)
HAMILTONIAN = qml.dot([1.23, -0.45, 0.3], [qml.X(0) @ qml.Z(1), qml.Y(0), qml.Z(0) @ qml.Z(1)])
BASES = {
    "pauli_word": qml.X(0) @ qml.Z(1),
    "sum": qml.X(0) + qml.Z(0) @ qml.Y(1),
    "hermitian": qml.Hermitian(np.array([[0.5, 0.2 - 0.1j], [0.2 + 0.1j, -0.3]]), wires=0),
}


def _exp_body(kind: str):
    def body(t):
        qml.Hadamard(1)
        qml.RX(0.3, 0)
        if kind == "trotter":
            qml.TrotterProduct(HAMILTONIAN, t, n=2, order=2)
        elif kind == "qdrift":
            qml.QDrift(HAMILTONIAN, t, n=3, seed=11)
        elif kind == "evolve":  # PennyLane's Evolution: a real angle already
            qml.evolve(BASES["sum"], 0.5 * t)
        else:
            qml.exp(BASES[kind], -0.5j * t)
        return qml.expval(OBSERVABLE)

    return body


def _reference(kind: str, t: float = 0.5):
    qnode = qml.QNode(_exp_body(kind), qml.device("default.qubit", wires=2), diff_method="backprop")
    value, grad = qnode(jnp.array(t)), jax.grad(qnode)(jnp.array(t))
    return float(value), float(grad)


def _in_interface(interface: str, qnode, t: float = 0.5):
    """The value and the derivative by ``t`` of ``qnode`` in ``interface``."""
    if interface == "torch":
        x = torch.tensor(t, dtype=torch.float64, requires_grad=True)
        value = qnode(x)
        value.backward()
        return float(value.detach()), float(x.grad)
    if interface == "autograd":
        x = pnp.array(t, requires_grad=True)
        return float(qnode(x)), float(qml.grad(qnode)(x))
    if interface == "jax-jit":
        return float(jax.jit(qnode)(jnp.array(t))), float(jax.jit(jax.grad(qnode))(jnp.array(t)))
    return float(qnode(jnp.array(t))), float(jax.grad(qnode)(jnp.array(t)))


KINDS = ["trotter", "qdrift", "pauli_word", "sum", "evolve"]
INTERFACES = ["torch", "autograd", "jax"]


@pytest.mark.parametrize("diff_method", ["best", "adjoint"])
@pytest.mark.parametrize("interface", INTERFACES)
@pytest.mark.parametrize("kind", KINDS)
def test_exponentials_by_their_angles(kind, interface, diff_method):
    """Values and derivatives equal default.qubit's backpropagation in every interface.
    Before: torch raised ImportError for the Pauli-word exponentials (Trotter and QDrift
    terms), and the derivative of the "sum" and "hermitian" exponentials came out 0."""
    want_value, want_grad = _reference(kind)
    assert abs(want_grad) > 0.05
    dev = qml.device("custatevec.qubit", wires=2)
    qnode = qml.QNode(_exp_body(kind), dev, diff_method=diff_method)
    value, grad = _in_interface(interface, qnode)
    np.testing.assert_allclose(value, want_value, atol=ATOL, rtol=0)
    np.testing.assert_allclose(grad, want_grad, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_exponentials_under_jit(kind):
    """Under jax.jit the exponentials' angles are traced: values and derivatives as
    default.qubit's. Before, the sum's exponential and ``qml.evolve`` of the sum raised
    jax's TracerBoolConversionError (PennyLane's ``Evolution.has_generator`` asks ``bool``
    of the traced angle: ``gradients.validation.has_a_generator``)."""
    want_value, want_grad = _reference(kind)
    dev = qml.device("custatevec.qubit", wires=2)
    for diff_method in ("best", "adjoint"):
        qnode = qml.QNode(_exp_body(kind), dev, diff_method=diff_method)
        value, grad = _in_interface("jax-jit", qnode)
        np.testing.assert_allclose(value, want_value, atol=ATOL, rtol=0)
        np.testing.assert_allclose(grad, want_grad, atol=ATOL, rtol=0)


@pytest.mark.parametrize("interface", INTERFACES)
def test_an_exponential_of_a_base_with_parameters_is_refused_by_the_adjoint_method(interface):
    """A base with parameters of its own (a ``qml.Hermitian``'s matrix) leaves the
    exponential with several parameters, which the adjoint method refuses by name rather
    than differentiate the coefficient as an angle (0 before, in torch)."""
    dev = qml.device("custatevec.qubit", wires=2)
    qnode = qml.QNode(_exp_body("hermitian"), dev, diff_method="adjoint")
    with pytest.raises(DeviceError, match="Exp has trainable parameters"):
        _in_interface(interface, qnode)


@pytest.mark.parametrize("diff_method", ["parameter-shift", "finite-diff"])
@pytest.mark.parametrize("interface", ["torch", "autograd"])
@pytest.mark.parametrize("kind", ["pauli_word", "sum"])
def test_gradient_transforms_refuse_complex_coefficients(kind, interface, diff_method):
    """Parameter-shift and finite differences returned exactly 0 here (default.qubit does
    too); they are refused by name, naming the gate and the ways out."""
    dev = qml.device("custatevec.qubit", wires=2)
    qnode = qml.QNode(_exp_body(kind), dev, diff_method=diff_method)
    with pytest.raises(DeviceError, match=r"complex-valued parameter .* of Exp"):
        _in_interface(interface, qnode)


def test_gradient_transforms_evaluate_and_take_complex_angles_with_zero_imaginary_part():
    """A forward evaluation with a complex coefficient runs (under torch.no_grad and with
    a plain number); an angle written as a complex number with a zero imaginary part is
    differentiated by parameter-shift, as before."""
    dev = qml.device("custatevec.qubit", wires=2)
    want_value, _ = _reference("sum")
    qnode = qml.QNode(_exp_body("sum"), dev, diff_method="parameter-shift")
    with torch.no_grad():
        value = qnode(torch.tensor(0.5, dtype=torch.float64, requires_grad=True))
    np.testing.assert_allclose(float(value), want_value, atol=ATOL, rtol=0)
    np.testing.assert_allclose(float(qnode(0.5)), want_value, atol=ATOL, rtol=0)

    def angle(t):
        qml.RX(t * (1 + 0j), 0)
        return qml.expval(qml.Y(0))

    x = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    result = qml.QNode(angle, dev, diff_method="parameter-shift")(x)
    result.backward()
    np.testing.assert_allclose(float(x.grad), -np.cos(0.7), atol=ATOL, rtol=0)


@pytest.mark.parametrize("diff_method", ["best", "parameter-shift", None])
def test_trotter_product_with_a_torch_time_evaluates(diff_method):
    """``TrotterProduct`` with a torch time raised autoray's ImportError on every method
    (PennyLane's test_qdrift.py test_execution_torch, routed): it evaluates now."""
    dev = qml.device("custatevec.qubit", wires=2)
    want_value, _ = _reference("trotter")
    qnode = qml.QNode(_exp_body("trotter"), dev, diff_method=diff_method)
    with torch.no_grad():
        value = qnode(torch.tensor(0.5, dtype=torch.float64))
    np.testing.assert_allclose(float(value), want_value, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", ["trotter", "sum", "pauli_word"])
def test_the_compiled_path_takes_exponentials_by_their_angles(kind):
    """``pennylane_custatevec.compile`` of such a QNode: the same values and derivatives."""
    import pennylane_custatevec

    want_value, want_grad = _reference(kind)
    dev = qml.device("custatevec.qubit", wires=2)
    qnode = qml.QNode(_exp_body(kind), dev, interface="torch", diff_method="adjoint")
    compiled = pennylane_custatevec.compile(qnode)
    for _ in range(2):  # the recorded structure is replayed on the second call
        value, grad = _in_interface("torch", compiled)
        np.testing.assert_allclose(value, want_value, atol=ATOL, rtol=0)
        np.testing.assert_allclose(grad, want_grad, atol=ATOL, rtol=0)
