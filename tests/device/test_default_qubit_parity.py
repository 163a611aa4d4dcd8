"""What default.qubit does and this device did not, found by PennyLane 0.45.1's own
measurement and qnn tests run on this device: operators that only a matrix defines (a
user's operation, ``qml.pow`` with a broadcast exponent), observables that are not
Hermitian (complex expectation values; silently real before), ``counts(obs,
all_outcomes=True)`` and ``sample(obs, dtype=...)`` with finite shots (options dropped by
PennyLane's diagonalization), classical shadows, and a jax PRNG key as the seed."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import torch
from conftest import DEVICE
from pennylane.wires import Wires

TOL = 1e-10


def _pair(wires, **kwargs):
    """(this device on the CPU backend, default.qubit), both seeded alike where a seed is
    given."""
    return (
        qml.device(DEVICE, wires=wires, backend="cpu", **kwargs),
        qml.device("default.qubit", wires=wires, **kwargs),
    )


def _both(circuit, wires, shots=None, seed=None, **qnode_kwargs):
    kwargs = {} if seed is None else {"seed": seed}
    results = []
    for dev in _pair(wires, **kwargs):
        node = qml.QNode(circuit, dev, **qnode_kwargs)
        results.append(node() if shots is None else qml.set_shots(node, shots=shots)())
    return results


# ---------------------------------------------------------------------------------------
# operators defined by a matrix alone


class _MatrixOnly(qml.operation.Operation):
    """A user's rotation defined by ``compute_matrix`` alone (no decomposition)."""

    num_wires = 1
    num_params = 1

    @staticmethod
    def compute_matrix(theta):  # pylint: disable=arguments-differ
        c, s = qml.math.cos(theta / 2), qml.math.sin(theta / 2)
        return qml.math.stack([qml.math.stack([c, -1j * s]), qml.math.stack([-1j * s, c])])


class _NotUnitary(qml.operation.Operation):
    """PennyLane's qnn test operation: diag(z, z)."""

    num_wires = 1
    num_params = 1

    @staticmethod
    def compute_matrix(z):  # pylint: disable=arguments-differ
        return qml.math.diag(qml.math.stack([z, z]))


def test_user_operation_defined_by_its_matrix_runs_as_on_default_qubit():
    def circuit():
        qml.Hadamard(1)
        _MatrixOnly(0.7, wires=0)
        qml.ctrl(_MatrixOnly(1.1, wires=2), control=1)
        return qml.state(), qml.expval(qml.Y(0) @ qml.Z(2))

    ours, reference = _both(circuit, 3)
    for a, b in zip(ours, reference, strict=True):
        np.testing.assert_allclose(a, b, atol=TOL)


def test_user_operation_differentiated_by_parameter_shift_in_a_torch_layer():
    """PennyLane's ``test_vjp_is_unwrapped_for_param_shift``: the operation is not unitary
    and parameter-shift differentiates it; values and gradients as default.qubit's."""
    results = []
    for dev in _pair(1):

        @qml.qnode(dev, interface="torch", diff_method="parameter-shift")
        def circ(inputs, w0):  # pylint: disable=unused-argument
            _NotUnitary(inputs[0], wires=0)
            return qml.expval(qml.Z(0))

        layer = qml.qnn.TorchLayer(circ, {"w0": 1})
        x = torch.tensor([0.1], dtype=torch.float64, requires_grad=True)
        value = layer(x)
        (gradient,) = torch.autograd.grad(value, x)
        results.append((value.detach().numpy(), gradient.numpy()))
    np.testing.assert_allclose(results[0][0], results[1][0], atol=TOL)
    np.testing.assert_allclose(results[0][1], results[1][1], atol=1e-7)


def test_trainable_user_operation_refused_by_adjoint_by_name():
    dev = qml.device(DEVICE, wires=1, backend="cpu")

    @qml.qnode(dev, diff_method="adjoint")
    def circuit(x):
        _MatrixOnly(x, wires=0)
        return qml.expval(qml.Z(0))

    with pytest.raises(qml.exceptions.DeviceError, match="_MatrixOnly"):
        qml.grad(circuit)(qml.numpy.array(0.3, requires_grad=True))


@pytest.mark.parametrize("exponents", [[1, 2], [0.5, 1, 3]])
def test_power_with_a_broadcast_exponent(exponents):
    """``qml.pow(op, z=[...])`` is broadcast over its exponent (a hyperparameter): each
    entry its own power (the device ran the first exponent's alone before)."""

    def circuit():
        qml.pow(qml.X(0), z=exponents)
        qml.pow(qml.RY(0.4, wires=1), z=exponents)
        qml.CNOT([0, 1])
        return qml.probs(wires=[0, 1]), qml.expval(qml.Z(1))

    ours, reference = _both(circuit, 2)
    assert ours[0].shape == (len(exponents), 4)
    for a, b in zip(ours, reference, strict=True):
        np.testing.assert_allclose(a, b, atol=TOL)


def test_power_with_a_broadcast_exponent_and_counts():
    """PennyLane's ``test_batched_all_outcomes``: one dictionary per exponent."""

    def circuit():
        qml.pow(qml.X(0), z=[1, 2])
        return qml.counts(qml.Z(0), all_outcomes=True)

    ours, reference = _both(circuit, 1, shots=10, seed=3)
    assert ours == reference == [{1: 0, -1: 10}, {1: 10, -1: 0}]


# ---------------------------------------------------------------------------------------
# observables that are not Hermitian


def _rotated_state(x=0.3):
    qml.RX(x, 0)
    qml.RY(0.5, 1)
    qml.CNOT([0, 1])


def _exact_moments(obs, wires):
    """<O> and <O^dagger O> - |<O>|^2 from default.qubit's state and O's matrix."""
    dev = qml.device("default.qubit", wires=wires)

    @qml.qnode(dev)
    def state():
        _rotated_state()
        return qml.state()

    psi = state()
    matrix = qml.matrix(obs, wire_order=range(wires))
    mean = np.vdot(psi, matrix @ psi)
    return mean, np.real(np.vdot(matrix @ psi, matrix @ psi)) - abs(mean) ** 2


NON_HERMITIAN = {
    "imaginary_word": lambda: 1j * qml.Z(0),
    "complex_word": lambda: (1 + 1j) * (qml.X(0) @ qml.Y(1)),
    "complex_sum": lambda: qml.Hamiltonian([0.5j, -0.25], [qml.Z(0), qml.X(1)]),
    "imaginary_hermitian": lambda: qml.s_prod(
        2j, qml.Hermitian(np.array([[1.0, 0.5j], [-0.5j, -0.3]]), wires=1)
    ),
}


@pytest.mark.parametrize("name", sorted(NON_HERMITIAN))
def test_expectation_of_a_non_hermitian_observable_is_complex(name):
    """<psi|O|psi> whole: the device took the real part (0.0 for ``1j * Z``)."""
    obs = NON_HERMITIAN[name]
    dev = qml.device(DEVICE, wires=2, backend="cpu")

    @qml.qnode(dev)
    def circuit():
        _rotated_state()
        return qml.expval(obs()), qml.var(obs())

    mean, variance = circuit()
    expected_mean, expected_variance = _exact_moments(obs(), 2)
    assert abs(np.imag(expected_mean)) > 0.1  # the case at hand is complex
    assert np.iscomplexobj(mean)
    np.testing.assert_allclose(mean, expected_mean, atol=TOL)
    assert np.isrealobj(variance)
    np.testing.assert_allclose(variance, expected_variance, atol=TOL)


def test_hermitian_observables_keep_real_results():
    dev = qml.device(DEVICE, wires=2, backend="cpu")

    @qml.qnode(dev)
    def circuit():
        _rotated_state()
        return (
            qml.expval(qml.Hamiltonian([0.5, -0.25], [qml.Z(0), qml.X(1)])),
            qml.expval(qml.Hermitian(np.array([[1.0, 0.5j], [-0.5j, -0.3]]), wires=1)),
            qml.expval((1 + 0j) * qml.Z(0)),
        )

    for value in circuit():
        assert np.isrealobj(value)


def test_expectation_of_a_complex_product_with_shots_as_on_default_qubit():
    def circuit():
        _rotated_state()
        return qml.expval(1j * qml.Z(0)), qml.sample((1 + 1j) * qml.Z(1))

    ours, reference = _both(circuit, 2, shots=4000, seed=11)
    np.testing.assert_allclose(ours[0], reference[0], atol=TOL)
    np.testing.assert_array_equal(ours[1], reference[1])


@pytest.mark.parametrize("name", sorted(NON_HERMITIAN))
def test_non_hermitian_observable_refused_by_adjoint(name):
    dev = qml.device(DEVICE, wires=2, backend="cpu")

    @qml.qnode(dev, diff_method="adjoint")
    def circuit(x):
        qml.RX(x, 0)
        return qml.expval(NON_HERMITIAN[name]())

    with pytest.raises(qml.exceptions.DeviceError, match="not Hermitian"):
        circuit(qml.numpy.array(0.3, requires_grad=True))


def test_hermitian_product_on_shared_wires_differentiated_by_adjoint():
    """A product that PennyLane cannot verify Hermitian from its structure (shared
    wires) is checked by its matrix: A @ A is, and the adjoint method takes it."""
    matrix = np.array([[1.0, 0.5j], [-0.5j, -0.3]])
    gradients = []
    for dev, method in zip(_pair(1), ("adjoint", "backprop"), strict=True):

        @qml.qnode(dev, diff_method=method)
        def circuit(x):
            qml.RX(x, 0)
            return qml.expval(qml.Hermitian(matrix, 0) @ qml.Hermitian(matrix, 0))

        def real_value(x, circuit=circuit):  # default.qubit returns it complex
            return qml.math.real(circuit(x))

        gradients.append(qml.grad(real_value)(qml.numpy.array(0.3, requires_grad=True)))
    assert abs(gradients[1]) > 0.1
    np.testing.assert_allclose(gradients[0], gradients[1], atol=TOL)


def test_non_hermitian_observable_shifted_by_parameter_shift():
    dev = qml.device(DEVICE, wires=2, backend="cpu")
    tape = qml.tape.QuantumScript([qml.RX(0.3, 0)], [qml.expval(1j * qml.Z(0))])
    tape.trainable_params = [0]
    shifted, postprocess = qml.gradients.param_shift(tape)
    jacobian = postprocess(dev.execute(shifted))
    np.testing.assert_allclose(jacobian, -1j * np.sin(0.3), atol=TOL)  # d(i cos x)/dx


# ---------------------------------------------------------------------------------------
# counts and samples of observables with their options


COUNTED = {
    "Z": lambda: qml.Z(0),
    "hermitian": lambda: qml.Hermitian(np.diag([1.0, -1.0]), wires=0),
    "word": lambda: qml.X(1) @ qml.Z(0),
}


@pytest.mark.parametrize("name", sorted(COUNTED))
def test_counts_of_an_observable_with_all_outcomes(name):
    """Every eigenvalue a key, unsampled ones with 0 (PennyLane's diagonalization rebuilt
    the measurement without ``all_outcomes``)."""

    def circuit():
        return qml.counts(COUNTED[name](), all_outcomes=True)

    ours, reference = _both(circuit, 2, shots=10, seed=5)
    assert ours == reference
    assert sorted(ours) == [-1.0, 1.0]


def test_counts_with_all_outcomes_among_measurements_that_do_not_commute():
    """The same where the tape is split (a Hermitian beside Pauli words)."""

    def circuit():
        qml.Hadamard(1)
        return (
            qml.counts(qml.Z(0), all_outcomes=True),
            qml.counts(qml.Hermitian(np.diag([2.0, -1.0]), wires=0), all_outcomes=True),
            qml.counts(qml.Z(0) + qml.X(1)),
            qml.sample(qml.Z(1) + qml.X(1)),
            qml.var(qml.Z(1) + qml.X(1)),
        )

    ours, reference = _both(circuit, 2, shots=50, seed=9)
    assert ours[0] == reference[0] == {1.0: 50, -1.0: 0}
    assert ours[1] == reference[1] == {2.0: 50, -1.0: 0}
    assert ours[2] == reference[2] == {2.0: 50}
    np.testing.assert_allclose(np.unique(ours[3]), [-np.sqrt(2), np.sqrt(2)], atol=TOL)
    np.testing.assert_array_equal(ours[3], reference[3])  # seeded alike: the same draws
    np.testing.assert_allclose(ours[4], reference[4], atol=TOL)


@pytest.mark.parametrize("dtype", ["float16", "float32", "int8", "int64"])
def test_sample_dtype_is_kept(dtype):
    """``qml.sample(obs, dtype=...)`` returns that dtype (float64 before)."""

    def circuit():
        qml.Hadamard(0)
        return (
            qml.sample(qml.Z(0), dtype=dtype),
            qml.sample(dtype=dtype),
            qml.sample(qml.X(1) + qml.Z(0), dtype=dtype),
            qml.sample(qml.Y(1), dtype=dtype),
        )

    ours, reference = _both(circuit, 2, shots=7, seed=2)
    for a, b in zip(ours, reference, strict=True):
        assert a.dtype == b.dtype == np.dtype(dtype)
        assert a.shape == b.shape


def test_sample_dtype_under_jax_jit():
    """PennyLane's ``test_jitting_with_dtype``: the callback's result dtype is checked."""
    jax = pytest.importorskip("jax")
    dev = qml.device(DEVICE, wires=1, backend="cpu", seed=4)

    @jax.jit
    @qml.set_shots(5)
    @qml.qnode(dev, interface="jax")
    def circuit():
        qml.Hadamard(0)
        return qml.sample(qml.Z(0), dtype="float32")

    assert circuit().dtype == np.float32


# ---------------------------------------------------------------------------------------
# classical shadows


def _shadowed(x):
    qml.RX(x, 0)
    qml.Hadamard(1)
    qml.CNOT([1, 2])


def test_classical_shadows_as_default_qubit_measures_them():
    """Each shot in a Pauli basis of its own, from the final state: the same seeds give
    default.qubit's bits, recipes and estimates exactly."""
    observables = [qml.Z(0), qml.X(1) @ qml.X(2), qml.Z(1)]

    def circuit():
        _shadowed(0.4)
        return (
            qml.shadow_expval(observables, seed=3),
            qml.expval(qml.Z(0)),
            qml.classical_shadow(wires=[0, 2], seed=5),
        )

    ours, reference = _both(circuit, 3, shots=2000, seed=7)
    np.testing.assert_allclose(ours[0], reference[0], atol=TOL)
    np.testing.assert_allclose(ours[1], reference[1], atol=TOL)
    np.testing.assert_array_equal(ours[2], reference[2])
    assert ours[2].shape == (2, 2000, 2)
    np.testing.assert_allclose(ours[0], [np.cos(0.4), 1.0, 0.0], atol=0.1)


def test_classical_shadows_broadcast_and_with_a_shot_vector():
    def broadcast():
        _shadowed(np.array([0.1, 0.2, 0.3]))
        return qml.classical_shadow(wires=[0, 1], seed=2)

    ours, reference = _both(broadcast, 3, shots=50, seed=1)
    assert ours.shape == (3, 2, 50, 2)
    np.testing.assert_array_equal(ours, reference)

    def partitioned():
        qml.Hadamard(0)
        return qml.classical_shadow(wires=[0], seed=2), qml.expval(qml.X(0))

    ours, reference = _both(partitioned, 1, shots=[100, 200], seed=1)
    assert [np.shape(part[0]) for part in ours] == [(2, 100, 1), (2, 200, 1)]
    for part, expected in zip(ours, reference, strict=True):
        np.testing.assert_array_equal(part[0], expected[0])
        np.testing.assert_allclose(part[1], expected[1], atol=TOL)


def test_classical_shadows_refused_analytically_and_with_one_shot_mid_measurements():
    dev = qml.device(DEVICE, wires=2, backend="cpu")

    @qml.qnode(dev)
    def analytic():
        qml.Hadamard(0)
        return qml.classical_shadow(wires=[0])

    with pytest.raises(qml.exceptions.DeviceError, match="not accepted for analytic"):
        analytic()

    @qml.set_shots(10)
    @qml.qnode(dev, mcm_method="one-shot")
    def one_shot():
        qml.Hadamard(0)
        qml.measure(0)
        return qml.classical_shadow(wires=[1])

    with pytest.raises(TypeError, match="does not support ClassicalShadowMP"):  # PennyLane's
        one_shot()
    tape = qml.tape.QuantumScript(
        [qml.Hadamard(0), qml.ops.MidMeasure(0)], [qml.classical_shadow(wires=[1])], shots=10
    )
    with pytest.raises(qml.exceptions.DeviceError, match="mcm_method='deferred'"):
        dev.execute(tape)  # not preprocessed: the device's own check


# ---------------------------------------------------------------------------------------
# a jax PRNG key as the seed


def test_jax_key_seeds_the_device():
    """A key (raw or typed) seeds numpy's generator with its words: reproducible, and a
    different key gives different samples."""
    jax = pytest.importorskip("jax")

    def samples(seed):
        dev = qml.device(DEVICE, wires=1, backend="cpu", seed=seed)

        @qml.set_shots(64)
        @qml.qnode(dev)
        def circuit():
            qml.Hadamard(0)
            return qml.sample(wires=0)

        return circuit()

    raw = jax.random.PRNGKey(3)
    words = np.asarray(raw).tolist()
    np.testing.assert_array_equal(samples(raw), samples(words))
    np.testing.assert_array_equal(samples(jax.random.key(3)), samples(words))
    assert not np.array_equal(samples(raw), samples(jax.random.PRNGKey(4)))
    with pytest.raises(ValueError, match="jax PRNG key"):
        qml.device(DEVICE, wires=1, seed=jax.numpy.array([1.5]))


@pytest.mark.parametrize("seed_kind", ["key", "int"])
def test_jax_key_gives_the_same_samples_on_every_execution(seed_kind):
    """As default.qubit, which samples under a key that it never advances (PennyLane's
    ``test_sample_with_prng_key``): with a key, every call returns the same samples and
    mid-circuit outcomes; with an int the device's generator runs on, call after call."""
    jax = pytest.importorskip("jax")

    seed = jax.random.PRNGKey(5) if seed_kind == "key" else 5
    dev = qml.device(DEVICE, wires=2, backend="cpu", seed=seed)

    @qml.set_shots(200)
    @qml.qnode(dev, mcm_method="one-shot")
    def circuit():
        qml.Hadamard(0)
        m = qml.measure(0, postselect=1)
        qml.Hadamard(1)
        return qml.sample(wires=1), qml.sample(m)

    first, second = circuit(), circuit()
    same = len(first[0]) == len(second[0]) and np.array_equal(first[0], second[0])
    assert same == (seed_kind == "key")


@pytest.mark.parametrize("mode", ["deferred", "eager"])
def test_power_with_a_broadcast_exponent_under_adjoint(mode):
    """The adjoint method differentiates the other gates of a circuit with a broadcast
    power (the eager mode expands the broadcast: PennyLane's expansion recursed without
    end on the exponent), and refuses a trainable broadcast power by name."""
    gradients = []
    for dev, method in (
        (qml.device(DEVICE, wires=2, backend="cpu", grad_accumulation=mode), "adjoint"),
        (qml.device("default.qubit", wires=2), "backprop"),
    ):

        @qml.qnode(dev, diff_method=method, interface="torch")
        def circuit(x):
            qml.RX(x, 0)
            qml.pow(qml.RY(0.4, 1), z=[1, 2, 3])
            qml.CNOT([0, 1])
            return qml.expval(qml.Z(1))

        x = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
        circuit(x).sum().backward()
        gradients.append(x.grad.item())
    np.testing.assert_allclose(gradients[0], gradients[1], atol=TOL)

    dev = qml.device(DEVICE, wires=2, backend="cpu", grad_accumulation=mode)

    @qml.qnode(dev, diff_method="adjoint", interface="torch")
    def trainable_power(x):
        qml.pow(qml.RY(x, 1), z=[1, 2])
        return qml.expval(qml.Z(1))

    with pytest.raises(qml.exceptions.DeviceError, match=r"RY\*\*\[1, 2\], a power broadcast"):
        trainable_power(torch.tensor(0.3, dtype=torch.float64, requires_grad=True))


# ---------------------------------------------------------------------------------------
# second derivatives under max_diff=1: zero Hessians (found with PennyLane's
# TestJaxArgnums::test_hessian tests, which take jax.hessian of a QNode with "best")


def _hessian_circuit(x):
    qml.RY(x[0], wires=0)
    qml.RX(x[1], wires=0)
    return qml.expval(qml.Z(0))


_ANGLES = (1.0, 2.0)
_EXPECTED_HESSIAN = np.array(  # of cos(a) cos(b)
    [
        [-np.cos(1.0) * np.cos(2.0), np.sin(1.0) * np.sin(2.0)],
        [np.sin(1.0) * np.sin(2.0), -np.cos(1.0) * np.cos(2.0)],
    ]
)


def _hessian(interface, node):
    if interface == "torch":
        angles = torch.tensor(_ANGLES, dtype=torch.float64, requires_grad=True)
        return torch.autograd.functional.hessian(node, angles).numpy()
    if interface == "autograd":
        return qml.jacobian(qml.grad(node))(qml.numpy.array(_ANGLES, requires_grad=True))
    jax = pytest.importorskip("jax")
    return np.asarray(jax.hessian(node)(jax.numpy.array(_ANGLES)))


@pytest.mark.parametrize("interface", ["torch", "autograd", "jax"])
@pytest.mark.parametrize("method", ["best", "adjoint", "parameter-shift", "finite-diff"])
def test_second_derivatives_under_max_diff_1_refused(interface, method):
    """PennyLane's interfaces differentiate the device's first derivatives as constants
    there: the Hessian came out all zeros with no error (default.qubit's "best" is
    backpropagation, which gives it; its gradient transforms give the zeros too)."""
    dev = qml.device(DEVICE, wires=1, backend="cpu")
    node = qml.QNode(_hessian_circuit, dev, interface=interface, diff_method=method)
    with pytest.raises(qml.exceptions.DeviceError, match="max_diff=2"):
        _hessian(interface, node)


@pytest.mark.parametrize("interface", ["torch", "autograd", "jax"])
def test_second_derivatives_with_max_diff_2(interface):
    dev = qml.device(DEVICE, wires=1, backend="cpu")
    node = qml.QNode(_hessian_circuit, dev, interface=interface, max_diff=2)
    np.testing.assert_allclose(_hessian(interface, node), _EXPECTED_HESSIAN, atol=1e-8)


def test_torch_gradient_with_create_graph_refused_and_without_it_kept():
    """A gradient penalty (``create_graph=True``) would differentiate constants; the
    plain backward pass still runs, with the Jacobian taken in it (torch's default
    ``grad_on_execution=False`` here), equal to default.qubit's."""
    gradients = []
    for dev in _pair(1):
        node = qml.QNode(_hessian_circuit, dev, interface="torch")
        angles = torch.tensor(_ANGLES, dtype=torch.float64, requires_grad=True)
        (gradient,) = torch.autograd.grad(node(angles), angles)
        gradients.append(gradient.numpy())
    np.testing.assert_allclose(gradients[0], gradients[1], atol=TOL)
    dev = qml.device(DEVICE, wires=1, backend="cpu")
    for device_vjp in (False, True):
        node = qml.QNode(_hessian_circuit, dev, interface="torch", device_vjp=device_vjp)
        angles = torch.tensor(_ANGLES, dtype=torch.float64, requires_grad=True)
        with pytest.raises(qml.exceptions.DeviceError, match="create_graph=True"):
            torch.autograd.grad(node(angles), angles, create_graph=True)


def test_first_derivatives_through_jax_transforms_still_run():
    """Batching and jit tracers are not derivatives: vmap and jit of a gradient run."""
    jax = pytest.importorskip("jax")
    dev = qml.device(DEVICE, wires=1, backend="cpu")
    node = qml.QNode(_hessian_circuit, dev, interface="jax", device_vjp=True)
    angles = jax.numpy.array(_ANGLES)
    expected = [-np.sin(1.0) * np.cos(2.0), -np.cos(1.0) * np.sin(2.0)]
    np.testing.assert_allclose(jax.grad(node)(angles), expected, atol=TOL)
    np.testing.assert_allclose(jax.jit(jax.grad(node))(angles), expected, atol=TOL)
    batched = jax.vmap(jax.grad(node))(jax.numpy.stack([angles, angles]))
    np.testing.assert_allclose(batched, [expected, expected], atol=TOL)


def test_classical_fisher_under_torch():
    """PennyLane's ``classical_fisher`` takes torch's Jacobian with ``create_graph=True``
    (so that the matrix is differentiable): refused under adjoint, whose derivatives
    are not; with max_diff=2 and parameter-shift it equals default.qubit's."""

    def circuit(x):
        qml.RY(x[0], wires=0)
        qml.RX(x[1], wires=0)
        qml.CNOT([0, 1])
        return qml.probs(wires=[0, 1])

    angles = torch.tensor(_ANGLES, dtype=torch.float64, requires_grad=True)
    ours, reference = _pair(2)
    with pytest.raises(qml.exceptions.DeviceError, match="create_graph=True"):
        qml.gradients.classical_fisher(qml.QNode(circuit, ours, interface="torch"))(angles)
    shifted = qml.QNode(circuit, ours, interface="torch", diff_method="parameter-shift", max_diff=2)
    expected = qml.gradients.classical_fisher(qml.QNode(circuit, reference, interface="torch"))
    np.testing.assert_allclose(
        qml.gradients.classical_fisher(shifted)(angles).detach().numpy(),
        expected(angles).detach().numpy(),
        atol=1e-8,
    )


# ---------------------------------------------------------------------------------------
# sampling a tape that has not been through the preprocessing (dev.execute directly, as
# PennyLane's gradient-transform tests do): measurements that read a wire another
# observable rotates were sampled from the rotated state (then refused); now the device
# samples them apart, as its preprocessing and default.qubit do


def _rotated_pair_tape(measurements, shots=100_000):
    ops = [qml.RX(0.543, 0), qml.RY(-0.654, 1), qml.CNOT([0, 1])]
    return qml.tape.QuantumScript(ops, measurements, shots=shots)


_NON_COMMUTING = {
    "probs-word": [qml.probs(wires=[0, 1]), qml.expval(qml.Z(0) @ qml.X(1))],
    "Z-X": [qml.expval(qml.Z(1)), qml.expval(qml.X(1))],
    "var-Y-Z": [qml.var(qml.Y(1)), qml.expval(qml.Z(1)), qml.probs(wires=[1])],
    "hermitian-probs": [
        qml.expval(qml.Hermitian(np.array([[1.0, 0.5j], [-0.5j, -0.3]]), 0)),
        qml.probs(wires=[0]),
    ],
}


@pytest.mark.parametrize("name", sorted(_NON_COMMUTING))
@pytest.mark.parametrize("entry", ["dev.execute", "qml.execute"])
def test_measurements_that_do_not_commute_sampled_apart(name, entry):
    """Within five standard errors of 100,000 shots of the exact values."""
    measurements = _NON_COMMUTING[name]
    dev = qml.device(DEVICE, wires=2, backend="cpu", seed=1)
    exact = qml.device("default.qubit", wires=2).execute(
        _rotated_pair_tape(measurements, shots=None)
    )
    tape = _rotated_pair_tape(measurements)
    if entry == "dev.execute":
        sampled = dev.execute(tape)
    else:
        sampled = qml.execute([tape], dev, diff_method=None)[0]
    bound = 5 * 2 / np.sqrt(100_000)  # eigenvalues within [-1.3, 1]
    for value, expected in zip(sampled, exact, strict=True):
        np.testing.assert_allclose(value, expected, atol=bound)


def test_sampled_apart_with_a_shot_vector_and_samples():
    dev = qml.device(DEVICE, wires=2, backend="cpu", seed=2)
    tape = _rotated_pair_tape(
        [qml.sample(wires=[1]), qml.expval(qml.X(1)), qml.counts(qml.Y(1))],
        shots=(20_000, 30_000),
    )
    exact = qml.device("default.qubit", wires=2).execute(
        _rotated_pair_tape([qml.probs(wires=[1]), qml.expval(qml.X(1)), qml.expval(qml.Y(1))], None)
    )
    results = dev.execute(tape)
    assert len(results) == 2
    for (samples, x_mean, y_counts), shots in zip(results, (20_000, 30_000), strict=True):
        bound = 5 * 2 / np.sqrt(shots)
        assert samples.shape == (shots, 1)
        np.testing.assert_allclose(np.mean(samples), exact[0][1], atol=bound)
        np.testing.assert_allclose(x_mean, exact[1], atol=bound)
        assert sum(y_counts.values()) == shots
        y_mean = (y_counts.get(1, 0) - y_counts.get(-1, 0)) / shots
        np.testing.assert_allclose(y_mean, exact[2], atol=bound)


def test_commuting_words_that_share_a_rotated_wire_sampled_apart():
    """PennyLane's ``test_jacobian_products`` shot tests: ``Y(0) @ Y(2)`` beside
    ``X(1) @ Y(2)`` commute qubit-wise but share wire 2, which the device rotates per
    observable at execution; ``dev.execute`` rotates them per wire first now."""
    measurements = [qml.expval(qml.Y(0) @ qml.Y(2)), qml.expval(qml.X(1) @ qml.Y(2))]
    ops = [qml.RX(0.4, 0), qml.RY(0.7, 1), qml.RX(-0.3, 2), qml.CNOT([0, 2])]
    tape = qml.tape.QuantumScript(ops, measurements, shots=100_000)
    exact = qml.device("default.qubit", wires=3).execute(tape.copy(shots=None))
    sampled = qml.device(DEVICE, wires=3, backend="cpu", seed=3).execute(tape)
    np.testing.assert_allclose(sampled, exact, atol=5 * 2 / np.sqrt(100_000))


_ROTATED_ALIKE = {
    # PennyLane's test_variance_gradients_agree_finite_differences (parameter-shift, shot
    # vectors): Z(0) reads wire 0, which Z(0) @ X(1) leaves unrotated; both were refused
    "Z-beside-ZX": [qml.expval(qml.Z(0)), qml.var(qml.Z(0) @ qml.X(1))],
    "X-beside-ZX": [qml.expval(qml.X(1)), qml.expval(qml.Z(0) @ qml.X(1))],
    "hermitian-beside-Z": [
        qml.expval(qml.Hermitian(np.array([[1.0, 0.5j], [-0.5j, -0.3]]), 0)),
        qml.expval(qml.Z(1)),
    ],
}


@pytest.mark.parametrize("name", sorted(_ROTATED_ALIKE))
@pytest.mark.parametrize("shots", [100_000, (40_000, 60_000)])
def test_measurements_rotating_wires_alike_sampled_together(name, shots):
    """A wire rotated by two observables alike (or by one, and read in Z by the other
    only where it is not rotated) is sampled in one circuit, within five standard
    errors of the exact values; ``dev.execute`` refused them before."""
    measurements = _ROTATED_ALIKE[name]
    exact = qml.device("default.qubit", wires=2).execute(
        _rotated_pair_tape(measurements, shots=None)
    )
    sampled = qml.device(DEVICE, wires=2, backend="cpu", seed=4).execute(
        _rotated_pair_tape(measurements, shots=shots)
    )
    partitions = sampled if isinstance(shots, tuple) else [sampled]
    for partition, count in zip(partitions, np.atleast_1d(shots), strict=True):
        bound = 5 * 2 / np.sqrt(count)  # eigenvalues (and squares) within [-1.3, 1.3]
        for value, expected in zip(partition, exact, strict=True):
            np.testing.assert_allclose(value, expected, atol=bound)


def test_measurements_rotating_a_wire_differently_refused():
    """What reaches the sampler with two rotations of one wire is refused by name, never
    sampled from a state rotated for one of them (the device's own entry points split
    such tapes first; this calls the sampler's rotation directly)."""
    from pennylane_custatevec import measure
    from pennylane_custatevec.backends.cpu import CPUBackend
    from pennylane_custatevec.compile_tapes import compile_tape

    tape = _rotated_pair_tape([qml.expval(qml.X(1)), qml.expval(qml.Y(1))])
    program = compile_tape(tape, Wires([0, 1]))
    backend = CPUBackend()
    state = backend.zero_state(program.register.num_qubits, 1)
    with pytest.raises(qml.exceptions.DeviceError, match=r"rotate wires \[1\] differently"):
        measure.rotate_to_eigenbases(backend, state, program.register, tape.measurements)
    probs = [qml.probs(wires=[1]), qml.expval(qml.X(1))]
    with pytest.raises(qml.exceptions.DeviceError, match="on shared wires"):
        measure.rotate_to_eigenbases(backend, state, program.register, probs)


@pytest.mark.parametrize("wires", [["a", "b", "c"], ["a", 1, 0], [0, 2, 1], [5, 3, 4]])
@pytest.mark.parametrize("diff_method", [None, "adjoint"])
def test_state_measurements_on_wire_labels_that_are_not_positions(wires, diff_method):
    """vn_entropy and mutual_info take their wire labels for positions in PennyLane's
    process_state: with labels, ``diff_method=None`` crashed ("cannot reshape"), and with
    wires [0, 2, 1] mutual_info([0], [1]) measured wire 2 (0.33 for 0.0). Measured on
    positions now (measure.measured_on_positions), as default.qubit does."""
    a, b, c = wires

    def circuit():
        qml.RY(0.4, a)
        qml.CNOT([a, b])
        qml.RX(0.3, b)
        qml.RY(1.1, c)
        return (
            qml.vn_entropy(wires=[a]),
            qml.mutual_info([a], [c]),
            qml.mutual_info([c, b], [a]),
            qml.purity([b]),
            qml.density_matrix([b, a]),
            qml.state(),
        )

    expected = qml.QNode(circuit, qml.device("default.qubit", wires=wires))()
    ours = qml.QNode(circuit, qml.device("custatevec.qubit", wires=wires), diff_method=diff_method)
    for got, want in zip(ours(), expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-12)
    dev = qml.device("custatevec.qubit", wires=wires)
    tape = qml.tape.make_qscript(circuit)()
    tapes, _ = dev.preprocess_transforms()([tape])
    for got, want in zip(dev.execute(tapes)[0], expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-12)
