"""The adjoint method on var, on the measurements PennyLane computes from the state, and on
trainable observable data (issue 14, item 10), against default.qubit.

References: default.qubit's ``diff_method="backprop"`` with the same interface where it
is right; where it is not (it gives zero gradients for the matrix of a ``Hermitian``
under ``var``), the results computed from default.qubit's state by backprop
(``state_reference``): <O> = Re <psi|O|psi> with O = ``qml.matrix`` of the observable.
Every test runs in both accumulation modes (the autouse fixture).
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import torch
from conftest import assert_allclose_nested, stable_seed
from pennylane import numpy as pnp
from pennylane.devices import ExecutionConfig
from pennylane.exceptions import DeviceError
from pennylane.measurements import ExpectationMP, StateMP, VarianceMP
from pennylane.tape import QuantumScript
from pennylane.wires import Wires
from reference import random_hermitian

import pennylane_custatevec
from pennylane_custatevec.gradients import differentiated, observables
from pennylane_custatevec.preprocess.through_state import measure_through_state

ATOL = 1e-9
WIRES = ["a", 3, "q1"]
VJP = pytest.mark.parametrize("device_vjp", [False, True], ids=["jacobian", "vjp"])
ERROR_PREFIX = "custatevec.qubit cannot differentiate this circuit by adjoint"
GATE_PARAMETERS = [0, 3]
"""The tape parameters of RX(x) and PhaseShift(y) in ``gates`` (trainable at the device
level; the second RX(y) is not)."""


@pytest.fixture(autouse=True, params=["deferred", "eager"])
def grad_accumulation(request):
    with pennylane_custatevec.options(grad_accumulation=request.param):
        yield request.param


@pytest.fixture(params=["cpu", "custatevec"])
def backend(request):
    """The CPU backend, or the cuStateVec backend on its NumPy double."""
    if request.param == "custatevec":
        request.getfixturevalue("gpu_double")
    return request.param


def gates(x, y):
    """Two trainable angles among fixed gates; a rotation, a gate with a generator that is
    not a Pauli word (PhaseShift, IsingXY) and entanglers, on ``WIRES``."""
    qml.RX(x, "a")
    qml.RY(0.7, 3)
    qml.CNOT(["a", 3])
    qml.RY(-0.4, "q1")
    qml.PhaseShift(y, 3)
    qml.IsingXY(0.9, [3, "q1"])
    qml.RX(y, "q1")
    qml.CRY(0.3, ["q1", "a"])


def _operations(x, y) -> list:
    with qml.queuing.AnnotatedQueue() as queue:
        gates(x, y)
    return queue.queue


def _torch(value, requires_grad=True):
    return torch.tensor(value, dtype=torch.float64, requires_grad=requires_grad)


def _flat_real(out) -> torch.Tensor:
    parts = out if isinstance(out, (tuple, list)) else (out,)
    flat = []
    for part in parts:
        t = torch.as_tensor(part)
        flat += [t.real.reshape(-1), t.imag.reshape(-1)] if t.is_complex() else [t.reshape(-1)]
    return torch.cat(flat)


def torch_jacobian(qnode, *values):
    """The full Jacobian of every real output of ``qnode`` by ``values`` (tensors)."""
    return torch.autograd.functional.jacobian(lambda *v: _flat_real(qnode(*v)), values)


def _numpy(value):
    if isinstance(value, (tuple, list)):
        return type(value)(_numpy(v) for v in value)
    if isinstance(value, torch.Tensor):
        return value.detach().numpy()
    return np.asarray(value)


# ---------------------------------------------------------------------------------------
# References from default.qubit's state


def result_from_state(mp, state, wire_order):
    """``mp``'s result from the state, with qml.math (autograd, torch)."""
    if isinstance(mp, (ExpectationMP, VarianceMP)):
        matrix = qml.math.cast_like(qml.matrix(mp.obs, wire_order=wire_order), state)
        applied = qml.math.tensordot(matrix, state, axes=[[1], [-1]])
        mean = qml.math.real(qml.math.sum(qml.math.conj(state) * applied, axis=-1))
        if isinstance(mp, ExpectationMP):
            return mean
        twice = qml.math.tensordot(matrix, applied, axes=[[1], [0]])
        return qml.math.real(qml.math.sum(qml.math.conj(state) * twice, axis=-1)) - mean**2
    return mp.process_state(state, wire_order=wire_order)


def state_reference(tape: QuantumScript, values: list):
    """The results of ``tape`` with its trainable parameters replaced by ``values``
    (autograd), computed from default.qubit's state by backprop, concatenated as
    one flat real vector."""
    bound = tape.bind_new_parameters(values, tape.trainable_params)
    wires = Wires(WIRES)
    state_tape = bound.copy(measurements=[qml.state()])
    dev = qml.device("default.qubit", wires=WIRES)
    (state,) = qml.execute([state_tape], dev, diff_method="backprop")
    parts = [
        qml.math.reshape(result_from_state(mp, state, wires), (-1,)) for mp in bound.measurements
    ]
    # autograd's own hstack: qml.math's dispatches on the first part, which may not depend
    # on the trainable values (a plain array) and would drop the others' gradients
    return pnp.hstack([qml.math.real(p) for p in parts])


def qnode_state_reference(measurements):
    """A function of (x, y, *data) like a QNode of ``gates(x, y)`` that returns
    ``measurements(*data)``, computed from default.qubit's state by backprop."""
    dev = qml.device("default.qubit", wires=WIRES)

    def state(x, y):
        gates(x, y)
        return qml.state()

    qnode = qml.QNode(state, dev, diff_method="backprop")

    def results(x, y, *data):
        psi = qnode(x, y)
        out = [result_from_state(mp, psi, Wires(WIRES)) for mp in measurements(*data)]
        return out[0] if len(out) == 1 else tuple(out)

    return results


def reference_jacobian(tape: QuantumScript) -> list[np.ndarray]:
    """Per trainable parameter, d(flat results)/d(parameter): (outputs, *its shape)."""
    values = [pnp.array(v, requires_grad=True) for v in tape.get_parameters()]
    argnums = list(range(len(values)))
    jac = qml.jacobian(lambda *v: state_reference(tape, list(v)), argnums=argnums)(*values)
    return [np.asarray(j) for j in (jac if isinstance(jac, tuple) else (jac,))]


def flat_device_jacobian(tape: QuantumScript, jacobian) -> list[np.ndarray]:
    """The device Jacobian in ``reference_jacobian``'s layout."""
    shapes = [np.shape(v) for v in tape.get_parameters()]
    per_measurement = (jacobian,) if len(tape.measurements) == 1 else jacobian
    if len(shapes) == 1:
        per_measurement = [(entry,) for entry in per_measurement]
    return [
        np.concatenate(
            [np.reshape(entries[p], (-1, *shape)) for entries in per_measurement], axis=0
        )
        for p, shape in enumerate(shapes)
    ]


def cotangents_for(tape: QuantumScript, rng) -> tuple:
    """Random cotangents of the results' shapes, and the same flattened."""
    # the results' shapes (default.qubit does not take var of a SparseHamiltonian)
    results = qml.device("custatevec.qubit", wires=WIRES).execute([tape])[0]
    results = (results,) if len(tape.measurements) == 1 else results
    per_measurement = [rng.normal(size=np.shape(r)) for r in results]
    flat = np.concatenate([np.reshape(d, -1) for d in per_measurement])
    return (per_measurement[0] if len(per_measurement) == 1 else tuple(per_measurement)), flat


def assert_device_derivatives(dev, tape: QuantumScript, rng, atol=ATOL) -> None:
    """The device's Jacobian and VJP of ``tape`` against ``reference_jacobian``."""
    reference = reference_jacobian(tape)
    jac = flat_device_jacobian(tape, dev.compute_derivatives([tape])[0])
    assert_allclose_nested(jac, reference, atol=atol)
    dy, flat = cotangents_for(tape, rng)
    vjp = dev.compute_vjp([tape], [dy])[0]
    expected = [np.tensordot(flat, r, axes=1) for r in reference]
    assert_allclose_nested(list(vjp), expected, atol=atol)
    assert any(np.abs(r).max() > 1e-3 for r in reference)  # the derivatives are not zero


# ---------------------------------------------------------------------------------------
# 1. The reproducer: torch Jacobians, against default.qubit's backprop

REPRODUCER = {
    "var(Z)": lambda: qml.var(qml.Z("a")),
    "var(Z)+probs": lambda: (qml.var(qml.Z("a")), qml.probs(wires=[3])),
    "var(X)": lambda: qml.var(qml.X("a")),
    "var(H)+expval": lambda: (
        qml.var(qml.Hamiltonian([0.4, -1.3], [qml.X("a") @ qml.Y(3), qml.Z("q1")])),
        qml.expval(qml.Y(3)),
    ),
    "probs": lambda: qml.probs(wires=["a", 3]),
    "expval+probs": lambda: (qml.expval(qml.Z("a")), qml.probs(wires=[3])),
    "density_matrix": lambda: qml.density_matrix(wires=["a"]),
    "purity": lambda: qml.purity(wires=["a"]),
    "vn_entropy": lambda: qml.vn_entropy(wires=["a"]),
    "mutual_info": lambda: qml.mutual_info(wires0=["a"], wires1=["q1"]),
    "expval+density_matrix+var": lambda: (
        qml.expval(qml.X(3)),
        qml.density_matrix(wires=[3, "a"]),
        qml.var(qml.Y("q1")),
    ),
}


@VJP
@pytest.mark.parametrize("measured", list(REPRODUCER))
def test_adjoint_measurements_reproducer(measured, device_vjp):
    """/work/shared/repro/adjoint_measurements.py: every measurement there (and mutual_info,
    var of a Hamiltonian, mixed tapes) differentiates by adjoint, Jacobian and VJP, as
    default.qubit's backprop."""

    def circuit(x, y):
        gates(x, y)
        return REPRODUCER[measured]()

    dev = qml.device("custatevec.qubit", wires=WIRES)
    ref = qml.device("default.qubit", wires=WIRES)
    values = (_torch(0.543), _torch(-0.654))
    ours = torch_jacobian(
        qml.QNode(circuit, dev, diff_method="adjoint", device_vjp=device_vjp), *values
    )
    expected = torch_jacobian(qml.QNode(circuit, ref, diff_method="backprop"), *values)
    assert_allclose_nested(_numpy(ours), _numpy(expected), atol=ATOL)
    assert max(float(j.abs().max()) for j in expected) > 1e-3


@pytest.mark.parametrize("measured", ["var(Z)+probs", "density_matrix", "purity"])
def test_best_takes_adjoint_for_state_measurements_and_var(measured):
    """diff_method="best" chose parameter-shift for these before."""

    def circuit(x, y):
        gates(x, y)
        return REPRODUCER[measured]()

    qnode = qml.QNode(circuit, qml.device("custatevec.qubit", wires=WIRES), diff_method="best")
    config = qml.workflow.construct_execution_config(qnode)(_torch(0.1), _torch(0.2))
    assert config.gradient_method == "adjoint"


def _purity_circuit(x):
    qml.RX(x[0], 0)
    qml.CNOT([0, 1])
    qml.RY(x[1], 1)
    qml.CRZ(x[2], [1, 0])
    return qml.expval(qml.Z(1)), qml.purity(wires=[0])


PURITY_X = [0.4, 0.9, -0.6]


def _purity_jacobian(qnode, interface: str) -> np.ndarray:
    """The (2, 3) Jacobian of ``_purity_circuit``'s expval and purity at ``PURITY_X``."""
    if interface == "torch":
        x = torch.tensor(PURITY_X, requires_grad=True)
        return torch.autograd.functional.jacobian(lambda v: torch.stack(qnode(v)), x).numpy()
    if interface == "jax":
        import jax
        import jax.numpy as jnp

        return np.asarray(jax.jacobian(lambda v: jnp.stack(qnode(v)))(jnp.array(PURITY_X)))
    x = pnp.array(PURITY_X, requires_grad=True)
    return qml.jacobian(lambda v: qml.math.stack(qnode(v)))(x)


@pytest.mark.parametrize("interface", ["autograd", "torch", "jax"])
@pytest.mark.parametrize(
    "diff_method", ["parameter-shift", "hadamard", "reversed-hadamard", "direct-hadamard"]
)
def test_shift_rules_on_purity_are_refused(diff_method, interface):
    """The purity is quadratic in the state: PennyLane's parameter-shift gives it wrong
    derivatives (shown on default.qubit below), direct-hadamard zeros, and hadamard and
    reversed-hadamard crash in PennyLane. Refused by name where a derivative is taken
    (but for the two crashes under jax, which happen before the device sees a tape); the
    forward evaluation is default.qubit's."""
    import jax

    jax.config.update("jax_enable_x64", True)
    ours = qml.QNode(
        _purity_circuit,
        qml.device("custatevec.qubit", wires=3),
        diff_method=diff_method,
        interface=interface,
    )
    reference = qml.QNode(_purity_circuit, qml.device("default.qubit", wires=3))
    np.testing.assert_allclose(
        [float(v) for v in ours(np.array(PURITY_X))], reference(np.array(PURITY_X)), atol=1e-12
    )
    if interface == "jax" and diff_method in ("hadamard", "reversed-hadamard"):
        # jax's interface applies the transform before any execution, and PennyLane's
        # transform fails on the purity there, before the device sees a tape (as on
        # default.qubit): an error, never a number
        with pytest.raises((TypeError, AttributeError, NotImplementedError)):
            _purity_jacobian(ours, interface)
        return
    with pytest.raises(DeviceError, match=r"cannot differentiate qml\.purity\(wires=\[0\]\)"):
        _purity_jacobian(ours, interface)
    if diff_method == "parameter-shift" and interface == "autograd":
        wrong = _purity_jacobian(
            qml.QNode(
                _purity_circuit, qml.device("default.qubit", wires=3), diff_method=diff_method
            ),
            interface,
        )
        exact = _purity_jacobian(
            qml.QNode(
                _purity_circuit, qml.device("default.qubit", wires=3), diff_method="backprop"
            ),
            interface,
        )
        assert np.max(np.abs(wrong[1] - exact[1])) > 0.3  # why it is refused


def test_purity_is_differentiated_by_adjoint_and_by_differences_of_values():
    """The adjoint method ("best") gives backprop's derivatives of the purity; finite
    differences and SPSA, which difference values, run and give default.qubit's numbers."""
    exact = _purity_jacobian(
        qml.QNode(_purity_circuit, qml.device("default.qubit", wires=3), diff_method="backprop"),
        "autograd",
    )
    assert np.max(np.abs(exact[1])) > 0.3
    for method in ("best", "adjoint"):
        ours = qml.QNode(
            _purity_circuit, qml.device("custatevec.qubit", wires=3), diff_method=method
        )
        np.testing.assert_allclose(_purity_jacobian(ours, "autograd"), exact, atol=ATOL)
    differenced = {}
    for method, kwargs in (("finite-diff", {}), ("spsa", {"sampler_rng": 5, "num_directions": 4})):
        got, want = (
            _purity_jacobian(
                qml.QNode(
                    _purity_circuit,
                    qml.device(name, wires=3),
                    diff_method=method,
                    gradient_kwargs=dict(kwargs),
                ),
                "autograd",
            )
            for name in ("custatevec.qubit", "default.qubit")
        )
        np.testing.assert_allclose(got, want, atol=1e-9)
        differenced[method] = got
    np.testing.assert_allclose(differenced["finite-diff"], exact, atol=1e-5)


# ---------------------------------------------------------------------------------------
# 2. var of every kind of observable, at the device level

VARIANCE_OBSERVABLES = {
    "pauli_word": lambda rng: qml.X("a") @ qml.Z("q1"),
    "scaled_word": lambda rng: qml.s_prod(-1.7, qml.Y(3)),
    "hamiltonian": lambda rng: qml.Hamiltonian(
        [0.3, -0.8, 1.1], [qml.Z("a") @ qml.X(3), qml.Y("q1"), qml.X("a") @ qml.X("q1")]
    ),
    "hermitian": lambda rng: qml.Hermitian(random_hermitian(4, rng), wires=["q1", "a"]),
    "sparse": lambda rng: qml.SparseHamiltonian(
        qml.Hamiltonian([0.5, -0.2], [qml.Z("a") @ qml.Y(3), qml.X("q1")]).sparse_matrix(
            wire_order=WIRES
        ),
        wires=WIRES,
    ),
    "projector": lambda rng: qml.Projector([1, 0], wires=[3, "q1"]),
    "hermitian_times_pauli": lambda rng: qml.prod(
        qml.Hermitian(random_hermitian(2, rng), wires=["a"]), qml.X("q1")
    ),
}


@pytest.mark.parametrize("mixed", [False, True], ids=["alone", "mixed"])
@pytest.mark.parametrize("kind", list(VARIANCE_OBSERVABLES))
def test_var_device_derivatives(kind, mixed, backend, rng):
    """Jacobian and VJP of var(O) (alone, and with expval and probs in one tape), against
    the derivative of <O^2> - <O>^2 from default.qubit's state."""
    obs = VARIANCE_OBSERVABLES[kind](rng)
    measurements = [qml.var(obs)]
    if mixed:
        measurements = [qml.expval(qml.Z(3)), qml.var(obs), qml.probs(wires=["q1"])]
    tape = QuantumScript(_operations(0.8, -1.1), measurements)
    tape.trainable_params = GATE_PARAMETERS
    dev = qml.device("custatevec.qubit", wires=WIRES, backend=backend)
    assert_device_derivatives(dev, tape, rng)


@VJP
def test_var_autograd_qnode(device_vjp):
    def circuit(x, y):
        gates(x, y)
        hamiltonian = qml.Hamiltonian([0.5, 0.9], [qml.Y("a") @ qml.Z(3), qml.X("q1")])
        return qml.var(hamiltonian), qml.probs(wires=[3]), qml.var(qml.Z("a"))

    values = (pnp.array(0.4), pnp.array(1.3))

    def jacobian(device, **kwargs):
        qnode = qml.QNode(circuit, device, **kwargs)
        return qml.jacobian(lambda x, y: qml.math.hstack(qnode(x, y)))(*values)

    ours = jacobian(
        qml.device("custatevec.qubit", wires=WIRES), diff_method="adjoint", device_vjp=device_vjp
    )
    expected = jacobian(qml.device("default.qubit", wires=WIRES), diff_method="backprop")
    assert_allclose_nested(ours, expected, atol=ATOL)


def test_var_of_pauli_word_bra_is_minus_four_mean_o_psi():
    """For a Pauli word the var bra is -4 dy <O> O psi: where <O> = 0 the gradient of the
    variance vanishes although that of <O> does not."""

    def circuit(x):
        qml.RX(x, 0)
        return qml.var(qml.Z(0)), qml.expval(qml.Z(0))

    dev = qml.device("custatevec.qubit", wires=1)
    qnode = qml.QNode(circuit, dev, diff_method="adjoint")
    jac = qml.jacobian(lambda x: qml.math.hstack(qnode(x)))(pnp.array(np.pi / 2))
    assert abs(jac[0]) < 1e-12 and abs(jac[1] + 1.0) < 1e-12


# ---------------------------------------------------------------------------------------
# 3. Measurements of the state: the preprocessing measures the state instead


@VJP
@pytest.mark.parametrize("broadcast", [False, True], ids=["single", "broadcast"])
def test_state_measurements_autograd(device_vjp, broadcast):
    """density_matrix, purity, vn_entropy and mutual_info with expval and var in one tape,
    autograd, broadcast inputs included, as default.qubit's backprop."""

    def circuit(x, y):
        gates(x, y)
        return (
            qml.expval(qml.Z("a")),
            qml.density_matrix(wires=[3]),
            qml.purity(wires=["a"]),
            qml.vn_entropy(wires=["q1"]),
            qml.mutual_info(wires0=["a"], wires1=[3]),
            qml.var(qml.X(3)),
        )

    x = pnp.array([0.4, -1.2, 2.0] if broadcast else 0.4, requires_grad=not broadcast)
    y = pnp.array(1.3)

    def loss(device, **kwargs):
        qnode = qml.QNode(circuit, device, **kwargs)

        def f(x, y):
            out = qnode(x, y)
            rho = out[1]
            return (
                qml.math.sum(out[0])
                + qml.math.sum(qml.math.real(rho) * np.arange(4).reshape(2, 2))
                + qml.math.sum(qml.math.imag(rho) * 0.3)
                + 0.5 * qml.math.sum(out[2])
                - 0.7 * qml.math.sum(out[3])
                + 0.2 * qml.math.sum(out[4])
                + 1.1 * qml.math.sum(out[5])
            )

        argnums = [1] if broadcast else [0, 1]
        return qml.grad(f, argnums=argnums)(x, y)

    ours = loss(
        qml.device("custatevec.qubit", wires=WIRES), diff_method="adjoint", device_vjp=device_vjp
    )
    expected = loss(qml.device("default.qubit", wires=WIRES), diff_method="backprop")
    assert_allclose_nested(ours, expected, atol=ATOL)


def _preprocessed(tape: QuantumScript, device_vjp: bool, device=None):
    dev = device or qml.device("custatevec.qubit", wires=WIRES)
    config = dev.setup_execution_config(
        ExecutionConfig(gradient_method="adjoint", use_device_jacobian_product=device_vjp)
    )
    tapes, postprocess = dev.preprocess_transforms(config)((tape,))
    return tapes, postprocess


@VJP
def test_tapes_the_sweep_serves_pass_unchanged(device_vjp):
    """Tapes of only expval, var, probs and state (and non-trainable observable data) are
    not converted: the transform hands back the very tape."""
    measurements = [
        qml.expval(qml.Z("a")),
        qml.var(qml.X(3) @ qml.Y("q1")),
        qml.probs(wires=[3]),
        qml.expval(qml.Hamiltonian([0.2, 0.4], [qml.Z(3), qml.X("a")])),
        qml.expval(qml.Hermitian(np.eye(2), wires=["a"])),
    ]
    for tape in (
        QuantumScript(_operations(0.1, 0.2), measurements),
        QuantumScript(_operations(0.1, 0.2), [qml.state()]),
        QuantumScript(_operations(0.1, 0.2), [qml.expval(qml.Z("a"))]),
    ):
        (out,), _ = measure_through_state((tape,), Wires(WIRES), device_vjp)
        assert out is tape
        (run,), _ = _preprocessed(tape, device_vjp)  # the device's preprocessing
        assert [type(m) for m in run.measurements] == [type(m) for m in tape.measurements]


@VJP
def test_state_conversion_and_complex_parameters(device_vjp):
    """A tape with density_matrix and expval keeps the expval, measures the state in place
    of the density matrix, and post-processes; with device Jacobians the trainable
    parameters become complex (the state's Jacobian is complex), with device VJPs not."""
    x, y = pnp.array(0.3), pnp.array(-0.8)
    tape = QuantumScript(_operations(x, y), [qml.expval(qml.Z("a")), qml.density_matrix(wires=[3])])
    (converted,), postprocess = _preprocessed(tape, device_vjp)
    assert isinstance(converted.measurements[0], ExpectationMP)
    assert type(converted.measurements[1]) is StateMP
    assert converted.measurements[1].wires == Wires(WIRES)
    trainable = [p for p in converted.get_parameters(False) if qml.math.requires_grad(p)]
    assert len(trainable) == 3
    complex_params = {"complex" in qml.math.get_dtype_name(p) for p in trainable}
    assert complex_params == {not device_vjp}
    dev = qml.device("custatevec.qubit", wires=WIRES)
    (result,) = postprocess(dev.execute([converted]))
    expected = qml.execute([tape], qml.device("default.qubit", wires=WIRES))[0]
    assert_allclose_nested(_numpy(result), _numpy(expected), atol=ATOL)


# ---------------------------------------------------------------------------------------
# 4. Trainable observable data


COEFFICIENT_OBSERVABLES = {
    "hamiltonian": lambda c: qml.Hamiltonian([c[0], c[1]], [qml.Z("a") @ qml.X(3), qml.Y("q1")]),
    "sum_of_sprods": lambda c: qml.sum(
        qml.s_prod(c[0], qml.X(3)), qml.s_prod(c[1], qml.Z("a") @ qml.Z("q1"))
    ),
    "nested": lambda c: qml.s_prod(
        c[0], qml.sum(qml.s_prod(c[1], qml.prod(qml.Y(3), qml.X("q1"))), qml.Z("a"))
    ),
    "with_hermitian": lambda c: qml.sum(
        qml.s_prod(c[0], qml.Hermitian(np.array([[1.0, 0.5], [0.5, -1.0]]), wires=[3])),
        qml.s_prod(c[1], qml.X("a")),
    ),
}


@VJP
@pytest.mark.parametrize("statistic", ["expval", "var"])
@pytest.mark.parametrize("kind", list(COEFFICIENT_OBSERVABLES))
def test_trainable_coefficients_torch(kind, statistic, device_vjp):
    """Coefficients of Hamiltonians, LinearCombinations and Sums train with the gates:
    d<H>/dc_k = <O_k>, and for var 2 Re<H psi|O_k|psi> - 2<H><O_k>."""
    measure = qml.expval if statistic == "expval" else qml.var

    def measurements(c):
        return measure(COEFFICIENT_OBSERVABLES[kind](c)), qml.expval(qml.Z(3))

    def circuit(x, y, c):
        gates(x, y)
        return measurements(c)

    values = (_torch(0.5), _torch(-0.9), _torch([0.7, -1.3]))
    dev = qml.device("custatevec.qubit", wires=WIRES)
    qnode = qml.QNode(circuit, dev, diff_method="adjoint", device_vjp=device_vjp)
    ours = torch_jacobian(qnode, *values)
    if statistic == "expval":
        ref = qml.device("default.qubit", wires=WIRES)
        expected = torch_jacobian(qml.QNode(circuit, ref, diff_method="backprop"), *values)
    else:  # default.qubit's backprop fails on the eigenvalues of a trainable Hamiltonian
        expected = torch_jacobian(qnode_state_reference(measurements), *values)
    assert_allclose_nested(_numpy(ours), _numpy(expected), atol=ATOL)
    assert float(expected[2].abs().max()) > 1e-2
    best = qml.QNode(circuit, dev, diff_method="best")
    assert qml.workflow.construct_execution_config(best)(*values).gradient_method == "adjoint"


@VJP
def test_trainable_coefficients_with_state_measurements(device_vjp):
    """Trainable coefficients in a tape that the preprocessing also measures through the
    state (with device Jacobians its parameters, the coefficients among them, become
    complex), with a var: torch gradients as default.qubit's backprop."""

    def circuit(x, c):
        gates(x, 0.3)
        hamiltonian = qml.Hamiltonian(c, [qml.Z("a") @ qml.X(3), qml.Y("q1")])
        return (
            qml.expval(hamiltonian),
            qml.density_matrix(wires=[3]),
            qml.var(qml.s_prod(c[0], qml.X("a"))),
        )

    def grads(device, **kwargs):
        x, c = _torch(0.4), _torch([0.5, -1.2])
        out = qml.QNode(circuit, device, **kwargs)(x, c)
        rho = out[1]
        loss = out[0] + 0.7 * torch.real(rho[0, 1]) + 0.3 * torch.imag(rho[0, 1]) + out[2]
        loss.backward()
        return [x.grad, c.grad]

    ours = grads(
        qml.device("custatevec.qubit", wires=WIRES), diff_method="adjoint", device_vjp=device_vjp
    )
    expected = grads(qml.device("default.qubit", wires=WIRES), diff_method="backprop")
    assert_allclose_nested(_numpy(ours), _numpy(expected), atol=ATOL)
    assert float(expected[1].abs().max()) > 1e-2


@VJP
def test_trainable_coefficients_autograd(device_vjp):
    def circuit(x, coefficients):
        gates(x, 0.3)
        hamiltonian = qml.Hamiltonian(coefficients, [qml.X("a"), qml.Z(3) @ qml.Y("q1")])
        return qml.expval(hamiltonian)

    values = (pnp.array(0.8), pnp.array([1.5, -0.4]))
    ours = qml.grad(
        qml.QNode(
            circuit,
            qml.device("custatevec.qubit", wires=WIRES),
            diff_method="adjoint",
            device_vjp=device_vjp,
        )
    )(*values)
    expected = qml.grad(
        qml.QNode(circuit, qml.device("default.qubit", wires=WIRES), diff_method="backprop")
    )(*values)
    assert_allclose_nested(ours, expected, atol=ATOL)


HERMITIAN_MEASUREMENTS = {
    "expval": lambda m: [qml.expval(qml.Hermitian(m, wires=["q1", "a"]))],
    "var": lambda m: [qml.var(qml.Hermitian(m, wires=[3, "a"]))],
    "weighted_in_sum": lambda m: [
        qml.expval(qml.sum(qml.s_prod(-0.6, qml.Hermitian(m, wires=["a", 3])), qml.Z("q1")))
    ],
    "var_in_sum_with_others": lambda m: [
        qml.probs(wires=["a"]),
        qml.var(qml.sum(qml.Hermitian(m, wires=["q1", 3]), qml.s_prod(0.4, qml.X("a")))),
        qml.expval(qml.Y(3)),
    ],
}


@pytest.mark.parametrize("gates_trainable", [False, True], ids=["matrix_only", "with_gates"])
@pytest.mark.parametrize("complex_matrix", [False, True], ids=["real", "complex"])
@pytest.mark.parametrize("kind", list(HERMITIAN_MEASUREMENTS))
def test_trainable_hermitian_device_derivatives(kind, complex_matrix, gates_trainable, rng):
    """The device's gradient by a Hermitian matrix has the matrix's shape: w rho^T for
    <H> (rho: the reduced density matrix on H's wires), its real part for a real matrix;
    Jacobian and VJP, against the derivatives of the results from default.qubit's state."""
    matrix = random_hermitian(4, rng)
    if not complex_matrix:
        matrix = np.real(matrix) + np.real(matrix).T
    tape = QuantumScript(_operations(0.8, -1.1), HERMITIAN_MEASUREMENTS[kind](matrix))
    (index,) = [i for i, v in enumerate(tape.get_parameters(False)) if np.ndim(v) == 2]
    tape.trainable_params = (GATE_PARAMETERS if gates_trainable else []) + [index]
    dev = qml.device("custatevec.qubit", wires=WIRES)
    assert_device_derivatives(dev, tape, rng)
    vjp = dev.compute_vjp([tape], [cotangents_for(tape, rng)[0]])[0]
    assert np.shape(vjp[-1]) == (4, 4)
    assert np.iscomplexobj(vjp[-1]) == complex_matrix


def test_hermitian_gradient_is_rho_transposed(backend):
    """d<H>/dH_ab = rho_ba, exactly (a complex matrix keeps the imaginary part)."""
    rng = np.random.default_rng(stable_seed("rho-transposed"))
    matrix = random_hermitian(4, rng)
    tape = QuantumScript(_operations(0.8, -1.1), [qml.expval(qml.Hermitian(matrix, [3, "a"]))])
    tape.trainable_params = [len(tape.get_parameters(False, operations_only=True))]
    dev = qml.device("custatevec.qubit", wires=WIRES, backend=backend)
    rho = qml.execute(
        [tape.copy(measurements=[qml.density_matrix(wires=[3, "a"])])],
        qml.device("default.qubit", wires=WIRES),
    )[0]
    np.testing.assert_allclose(dev.compute_derivatives([tape])[0], rho.T, atol=ATOL)
    np.testing.assert_allclose(dev.compute_vjp([tape], [2.0])[0][0], 2.0 * rho.T, atol=ATOL)


@VJP
@pytest.mark.parametrize("gates_trainable", [False, True], ids=["matrix_only", "with_gates"])
@pytest.mark.parametrize("kind", ["expval", "var"])
def test_trainable_hermitian_torch(kind, gates_trainable, device_vjp):
    """torch QNodes with a trainable Hermitian: gradients as default.qubit's backprop
    (expval) or as the derivative of the variance from its state (var, where
    default.qubit's backprop gives zero)."""
    rng = np.random.default_rng(stable_seed("hermitian-torch", kind))
    matrix = random_hermitian(4, rng).real
    matrix = matrix + matrix.T
    measure = qml.expval if kind == "expval" else qml.var

    def circuit(x, y, m):
        gates(x, y)
        return measure(qml.Hermitian(m, wires=["q1", "a"]))

    def grads(device, **kwargs):
        x, y = _torch(0.6, gates_trainable), _torch(-0.2, gates_trainable)
        m = _torch(matrix)
        qml.QNode(circuit, device, **kwargs)(x, y, m).backward()
        return [x.grad, y.grad, m.grad] if gates_trainable else [m.grad]

    ours = grads(
        qml.device("custatevec.qubit", wires=WIRES), diff_method="adjoint", device_vjp=device_vjp
    )
    if kind == "expval":
        expected = grads(qml.device("default.qubit", wires=WIRES), diff_method="backprop")
    else:
        tape = QuantumScript(_operations(0.6, -0.2), [qml.var(qml.Hermitian(matrix, ["q1", "a"]))])
        n_ops = len(tape.get_parameters(False, operations_only=True))
        tape.trainable_params = ([0, 3, 5] if gates_trainable else []) + [n_ops]
        reference = [r[0] for r in reference_jacobian(tape)]
        # x is the RX(x) parameter; y is read by PhaseShift(y) and RX(y)
        expected = reference if not gates_trainable else [reference[0], None, reference[3]]
        if gates_trainable:
            expected[1] = reference[1] + reference[2]
    assert_allclose_nested(_numpy(ours), _numpy(expected), atol=ATOL)


@VJP
@pytest.mark.parametrize("complex_matrix", [False, True], ids=["real", "complex"])
def test_trainable_hermitian_route(complex_matrix, device_vjp):
    """Where the device hands back a matrix gradient (device VJPs, every trainable
    parameter of one shape, a real matrix) the Hermitian stays in the tape; otherwise the
    preprocessing takes <H> from the state, and the ML framework differentiates it."""
    matrix = np.array([[1.0, 0.5], [0.5, -0.3]]) + (0.2j * np.array([[0, 1], [-1, 0]]))
    matrix = matrix if complex_matrix else matrix.real
    for gates_trainable in (False, True):
        x = pnp.array(0.3, requires_grad=gates_trainable)
        tape = QuantumScript(
            _operations(x, x), [qml.expval(qml.Hermitian(pnp.array(matrix), wires=["a"]))]
        )
        (converted,), _ = _preprocessed(tape, device_vjp)
        native = device_vjp and not gates_trainable and not complex_matrix
        assert (type(converted.measurements[-1]) is StateMP) == (not native)


@VJP
@pytest.mark.parametrize("interface", ["autograd", "torch"])
def test_complex_hermitian_gradient_conventions(interface, device_vjp):
    """A complex trainable matrix gets each framework's own convention (torch's gradient
    is the conjugate of autograd's), as on default.qubit."""
    rng = np.random.default_rng(stable_seed("complex-hermitian"))
    matrix = random_hermitian(4, rng)

    def circuit(x, m):
        gates(x, 0.4)
        return qml.expval(qml.Hermitian(m, wires=[3, "q1"]))

    def grads(device, **kwargs):
        qnode = qml.QNode(circuit, device, **kwargs)
        if interface == "torch":
            x, m = _torch(0.7), torch.tensor(matrix, requires_grad=True)
            qnode(x, m).backward()
            return [x.grad.numpy(), m.grad.numpy()]
        return list(qml.grad(qnode)(pnp.array(0.7), pnp.array(matrix)))

    ours = grads(
        qml.device("custatevec.qubit", wires=WIRES), diff_method="adjoint", device_vjp=device_vjp
    )
    expected = grads(qml.device("default.qubit", wires=WIRES), diff_method="backprop")
    assert_allclose_nested(ours, expected, atol=ATOL)


@pytest.mark.parametrize("device_vjp", [False, True, None], ids=["jacobian", "vjp", "default"])
def test_barren_plateaus_hermitian_best_picks_adjoint(device_vjp):
    """PennyLane's barren-plateaus demo: its Hermitian comes from pennylane.numpy and so is
    trainable; diff_method="best" took parameter-shift. It takes adjoint now and agrees
    with default.qubit (whose own adjoint gets this wrong: it ignores the observable)."""
    n = 4
    hamiltonian = pnp.zeros((2**n, 2**n))
    hamiltonian[0, 0] = 1
    gate_set = [qml.RX, qml.RY, qml.RZ]
    rng = np.random.default_rng(stable_seed("barren-plateaus"))
    sequence = [gate_set[k] for k in rng.integers(0, 3, size=n)]

    def circuit(params):
        for i in range(n):
            qml.RY(np.pi / 4, wires=i)
        for i in range(n):
            sequence[i](params[i], wires=i)
        for i in range(n - 1):
            qml.CZ(wires=[i, i + 1])
        return qml.expval(qml.Hermitian(hamiltonian, range(n)))

    kwargs = {} if device_vjp is None else {"device_vjp": device_vjp}
    params = pnp.array(rng.uniform(0, 2 * np.pi, size=n), requires_grad=True)
    qnode = qml.QNode(circuit, qml.device("custatevec.qubit", wires=n), **kwargs)
    assert qml.workflow.construct_execution_config(qnode)(params).gradient_method == "adjoint"
    ours = qml.grad(qnode, argnums=0)(params)
    ref = qml.QNode(circuit, qml.device("default.qubit", wires=n))
    expected = qml.grad(ref, argnums=0)(params)
    np.testing.assert_allclose(ours, expected, atol=ATOL, rtol=0)
    assert np.abs(expected).max() > 1e-3


def test_observable_columns_are_typed_and_after_the_gates():
    """DifferentiatedTape's columns: gate columns first (in trainable order), then one per
    coefficient and one per matrix element, each naming its measurement and derivative."""
    hamiltonian = qml.Hamiltonian([0.2, -0.5], [qml.Z("a"), qml.X(3) @ qml.Y("q1")])
    hermitian = qml.Hermitian(np.diag([1.0, -1.0]), wires=[3])
    tape = QuantumScript(
        _operations(0.4, 0.9),
        [qml.probs(wires=["a"]), qml.var(hamiltonian), qml.expval(hermitian)],
    )
    n_ops = len(tape.get_parameters(False, operations_only=True))
    tape.trainable_params = [*GATE_PARAMETERS, n_ops + 1, n_ops + 2]
    circuit = differentiated.DifferentiatedTape(tape, Wires(WIRES))
    assert sorted(circuit.columns.values()) == [0, 1]
    assert circuit.n_columns == 2 + 1 + 4
    first, second = circuit.observable_columns
    assert (first.measurement, first.start, first.stop) == (1, 2, 3)
    assert isinstance(first.derivative, observables.CoefficientDerivative)
    assert first.derivative.operator.pauli_rep == (qml.X(3) @ qml.Y("q1")).pauli_rep
    assert (second.measurement, second.start, second.stop) == (2, 3, 7)
    assert second.derivative == observables.MatrixDerivative(None, Wires([3]))
    assert not second.complex_gradient
    plain = QuantumScript(_operations(0.4, 0.9), [qml.expval(qml.Z("a"))])
    assert differentiated.DifferentiatedTape(plain, Wires(WIRES)).observable_columns == ()


def test_deferred_batch_with_observable_data():
    """Tapes of one structure in one call, some with trainable coefficients and some
    without, var among them: each gets its own gradient (the observable part is each
    tape's, however the sweep batches them)."""
    rng = np.random.default_rng(stable_seed("batch-observables"))
    tapes = []
    for k in range(4):
        hamiltonian = qml.Hamiltonian([0.3 + k, -0.7], [qml.Z("a"), qml.X(3) @ qml.X("q1")])
        measure = qml.var if k == 3 else qml.expval
        tape = QuantumScript(_operations(0.2 * k, 0.5 - k), [measure(hamiltonian)])
        n_ops = len(tape.get_parameters(False, operations_only=True))
        tape.trainable_params = GATE_PARAMETERS + ([n_ops, n_ops + 1] if k % 2 else [])
        tapes.append(tape)
    dev = qml.device("custatevec.qubit", wires=WIRES)
    jacobians = dev.compute_derivatives(tapes)
    for tape, jacobian in zip(tapes, jacobians, strict=True):
        assert_allclose_nested(
            flat_device_jacobian(tape, jacobian), reference_jacobian(tape), atol=ATOL
        )
    dys = [rng.normal() for _ in tapes]
    vjps = dev.compute_vjp(tapes, dys)
    for tape, dy, vjp in zip(tapes, dys, vjps, strict=True):
        expected = [dy * r[0] for r in reference_jacobian(tape)]
        assert_allclose_nested(list(vjp), expected, atol=ATOL)


@VJP
def test_trainable_observable_in_product_goes_through_the_state(device_vjp):
    """A trainable Hermitian inside a product has no device gradient; a QNode takes it from
    the state (the device differentiates the state, torch the rest). default.qubit's
    backprop gives no gradient for the matrix here: the reference is from its state."""

    def measurements(m):
        return [qml.expval(qml.prod(qml.Hermitian(m, wires=["a"]), qml.Y("q1")))]

    def circuit(x, y, m):
        gates(x, y)
        return measurements(m)[0]

    matrix = np.array([[0.4, 1.0], [1.0, -0.6]])

    def grads(function):
        x, m = _torch(0.9), _torch(matrix)
        function(x, 0.2, m).backward()
        return [x.grad, m.grad]

    dev = qml.device("custatevec.qubit", wires=WIRES)
    ours = grads(qml.QNode(circuit, dev, diff_method="adjoint", device_vjp=device_vjp))
    expected = grads(qnode_state_reference(measurements))
    assert float(expected[1].abs().max()) > 1e-2
    assert_allclose_nested(_numpy(ours), _numpy(expected), atol=ATOL)


# ---------------------------------------------------------------------------------------
# 5. What stays refused, with the reason


def _tape_with(measurements, trainable_observable=False, shots=None):
    tape = QuantumScript(_operations(0.3, 0.4), measurements, shots=shots)
    n_ops = len(tape.get_parameters(False, operations_only=True))
    tape.trainable_params = [0] + ([n_ops] if trainable_observable else [])
    return tape


REFUSED = {
    "shots": (lambda: _tape_with([qml.expval(qml.Z("a"))], shots=100), ["shots"]),
    "sample": (lambda: _tape_with([qml.sample(wires=["a"])], shots=10), ["sample"]),
    "counts": (lambda: _tape_with([qml.counts(wires=["a"])], shots=10), ["counts"]),
    "density_matrix_at_device_level": (
        lambda: _tape_with([qml.density_matrix(wires=["a"])]),
        ["densitymatrix", "preprocessing"],
    ),
    "probs_of_observable": (lambda: _tape_with([qml.probs(op=qml.X("a"))]), ["probs"]),
    "trainable_projector": (
        lambda: _tape_with(
            [qml.expval(qml.Projector(np.array([0.6, 0.8]), wires=["a"]))],
            trainable_observable=True,
        ),
        ["projector"],
    ),
    "hermitian_in_product": (
        lambda: _tape_with(
            [qml.expval(qml.prod(qml.Hermitian(np.eye(2), ["a"]), qml.Z(3)))],
            trainable_observable=True,
        ),
        ["hermitian", "product"],
    ),
}


@VJP
@pytest.mark.parametrize("kind", list(REFUSED))
def test_still_refused_with_the_reason(kind, device_vjp):
    make, words = REFUSED[kind]
    dev = qml.device("custatevec.qubit", wires=WIRES)
    tape = make()
    with pytest.raises(DeviceError) as info:
        if device_vjp:
            dev.compute_vjp([tape], [1.0])
        else:
            dev.compute_derivatives([tape])
    message = str(info.value)
    assert message.startswith(ERROR_PREFIX), message
    for word in words:
        assert word in message.lower().replace("_", "").replace(" ", ""), message


def test_mid_circuit_measurement_values_differentiated_up_to_ten_measurements():
    """A measured value is measured on its deferred wires (tests/preprocess/test_mcm.py); a value of
    more than MAX_MEASURED_VALUE_WIRES measurements (2**k Z words) is still refused."""

    def circuit(x, n):
        values = []
        for wire in range(n):
            qml.RX(x * (wire + 1), wire)
            values.append(qml.measure(wire))
        return qml.expval(sum(values[1:], values[0]))

    x = pnp.array(0.3, requires_grad=True)
    ours = qml.QNode(circuit, qml.device("custatevec.qubit", wires=2), diff_method="adjoint")
    reference = qml.QNode(circuit, qml.device("default.qubit", wires=2), diff_method="backprop")
    np.testing.assert_allclose(qml.grad(ours)(x, 1), qml.grad(reference)(x, 1), atol=ATOL)
    too_many = qml.QNode(circuit, qml.device("custatevec.qubit", wires=22), diff_method="adjoint")
    with pytest.raises(DeviceError, match="mid-circuit measurement values"):
        qml.grad(too_many)(x, 11)


def test_a_jacobians_one_hot_rows_share_one_array():
    """A probability vector's Jacobian rows: the identity's rows, each a read-only view of
    one array (16 wires would otherwise take 2**32 floats, 32 GiB)."""
    from pennylane_custatevec.gradients.cotangents import one_hot_rows

    tape = QuantumScript(
        [qml.RX(0.3, wires=0), qml.RY(0.2, wires=1)],
        [qml.expval(qml.Z(0)), qml.probs(wires=[0, 1, 2])],
        trainable_params=[0, 1],
    )
    circuit = differentiated.DifferentiatedTape(tape, Wires([0, 1, 2]))
    rows = one_hot_rows(circuit, [0, 1])
    assert rows[0] == (1.0, None)
    vectors = [row[1] for row in rows[1:]]
    assert all(row[0] is None for row in rows[1:])
    np.testing.assert_array_equal(np.stack(vectors), np.eye(8))
    assert all(np.shares_memory(vectors[0], v) and not v.flags.writeable for v in vectors)
    assert vectors[0].base.size == 15
