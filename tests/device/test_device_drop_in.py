"""Drop-in behaviour of the device against default.qubit (issue 14, items 3, 9, 12, 14, 15):
Hessians with diff_method="best", bad input, qml.Tracker counts, seed="global", and free
memory without /proc/meminfo."""

from __future__ import annotations

import os
import re
import sys
import types

import numpy as np
import pennylane as qml
import pytest
import torch
from conftest import DEVICE, assert_allclose_nested
from pennylane.devices import ExecutionConfig
from pennylane.exceptions import QuantumFunctionError
from reference import assert_21_qubits_refused

from pennylane_custatevec import measure, simulate
from pennylane_custatevec.backends import host
from pennylane_custatevec.backends.cpu import CPUBackend
from pennylane_custatevec.backends.custatevec import CuStateVecBackend
from pennylane_custatevec.compile_tapes import compile_tape
from pennylane_custatevec.program import Register
from pennylane_custatevec.simulate import UnnormalisedStateError

# --- item 3: Hessians -----------------------------------------------------------------------


def _two_parameter_circuit(x):
    qml.RY(x[0], wires=0)
    qml.RX(x[1], wires=0)
    qml.CNOT([0, 1])
    qml.RZ(x[0] * x[1], wires=1)
    qml.RX(x[1], wires=1)
    return qml.expval(qml.Z(0) @ qml.Z(1))


def _hessian(device, diff_method, interface):
    node = qml.QNode(
        _two_parameter_circuit, device, diff_method=diff_method, max_diff=2, interface=interface
    )
    if interface == "torch":
        x = torch.tensor([1.0, 2.0], requires_grad=True, dtype=torch.float64)
        return torch.autograd.functional.hessian(node, x).detach().numpy()
    x = qml.numpy.array([1.0, 2.0], requires_grad=True)
    return qml.jacobian(qml.grad(node))(x)


@pytest.mark.parametrize("interface", ["torch", "autograd"])
def test_hessian_best(interface):
    """diff_method="best" with max_diff=2 gave a zero Hessian (adjoint has no second
    derivatives): now it picks parameter-shift, and the Hessian is default.qubit's."""
    expected = _hessian(qml.device("default.qubit", wires=2), "best", interface)
    assert np.abs(expected).max() > 0.1
    hessian = _hessian(qml.device(DEVICE, wires=2), "best", interface)
    np.testing.assert_allclose(hessian, expected, atol=1e-10, rtol=0)


def test_best_resolves_to_parameter_shift_for_higher_derivatives():
    """How PennyLane 0.45 resolves "best": supports_derivatives with the QNode's max_diff as
    derivative_order; declining it for adjoint gives param_shift, and setup_execution_config
    leaves such a "best" alone (never "adjoint")."""
    dev = qml.device(DEVICE, wires=1)
    tape = qml.tape.QuantumScript([qml.RY(0.1, 0)], [qml.expval(qml.Z(0))])
    best = {
        order: ExecutionConfig(gradient_method="best", derivative_order=order) for order in (1, 2)
    }
    assert dev.supports_derivatives(best[1], tape)
    assert not dev.supports_derivatives(best[2], tape)
    assert not dev.supports_derivatives(best[2])
    assert dev.setup_execution_config(best[1], tape).gradient_method == "adjoint"
    assert dev.setup_execution_config(best[2], tape).gradient_method == "best"

    def circuit(x):
        qml.RY(x, 0)
        return qml.expval(qml.Z(0))

    for max_diff, method in ((1, "adjoint"), (2, qml.gradients.param_shift)):
        node = qml.QNode(circuit, dev, diff_method="best", max_diff=max_diff)
        config = qml.workflow.construct_execution_config(node, resolve=True)(qml.numpy.array(0.3))
        assert config.gradient_method == method


@pytest.mark.parametrize("diff_method", ["adjoint", "device"])
@pytest.mark.parametrize("interface", ["torch", "autograd"])
def test_explicit_adjoint_hessian_raises(diff_method, interface):
    """An explicit adjoint method with max_diff > 1 is refused by name (default.qubit and
    lightning.qubit return a zero Hessian)."""
    with pytest.raises(QuantumFunctionError, match="first derivatives only") as info:
        _hessian(qml.device(DEVICE, wires=2), diff_method, interface)
    message = str(info.value)
    assert "max_diff=2" in message
    assert "diff_method='parameter-shift'" in message and "max_diff=1" in message


def test_explicit_adjoint_higher_order_raises_in_execute():
    dev = qml.device(DEVICE, wires=1)
    x = qml.numpy.array(0.3, requires_grad=True)
    tape = qml.tape.QuantumScript([qml.RY(x, 0)], [qml.expval(qml.Z(0))])
    with pytest.raises(QuantumFunctionError, match="first derivatives only"):
        qml.execute([tape], dev, diff_method="adjoint", max_diff=2)
    # max_diff=1 is served as before
    (result,) = qml.execute([tape], dev, diff_method="adjoint", max_diff=1)
    assert result == pytest.approx(np.cos(0.3))


# --- item 9: bad input ----------------------------------------------------------------------


def _unordered_wires_cases():
    """(operations, measurements) whose wires a device without wires must order as
    default.qubit does (PennyLane's map_to_standard_wires): integers 0..n-1 used out of
    order, other labels by first use, measurement-only and work-only wires."""
    return [
        ([qml.RY(0.3, 2), qml.RY(0.5, 3), qml.CNOT([0, 2]), qml.RX(0.7, 1)], [qml.state()]),
        ([qml.RX(0.3, 1), qml.CNOT([1, 0]), qml.RY(0.4, 1)], [qml.probs()]),
        ([qml.RX(0.3, "b"), qml.CNOT(["b", "a"]), qml.RY(0.2, 5)], [qml.state()]),
        ([qml.RX(0.3, 1), qml.CNOT([1, 0])], [qml.state(), qml.probs(wires=[3])]),
        ([qml.RX(0.3, 1), qml.CNOT([1, 0])], [qml.probs(wires=[2]), qml.probs()]),
        ([qml.RX(0.3, 1), qml.MultiControlledX(wires=[1, 0, 2], work_wires=[3])], [qml.probs()]),
        ([qml.RX(0.3, 1), qml.MultiControlledX(wires=[1, 0, 2], work_wires=[5])], [qml.probs()]),
    ]


@pytest.mark.parametrize("case", range(7))
def test_device_without_wires_orders_them_as_default_qubit(case):
    """state(), probs() and sample() of every wire on a device without wires: in
    default.qubit's (and lightning.qubit's) order, where integer wires 0..n-1 are positions
    0..n-1 whatever order the circuit uses them in. The device used to take the circuit's
    order of first use (RX(x, 1); CNOT([1, 0]); state(): amplitudes permuted), wrong
    numbers without an error. Through ``execute``, a QNode, and with shots."""
    operations, measurements = _unordered_wires_cases()[case]
    tape = qml.tape.QuantumScript(operations, measurements)
    dev, ref = qml.device(DEVICE), qml.device("default.qubit")
    assert_allclose_nested(dev.execute(tape), ref.execute(tape), atol=1e-12)

    def circuit():
        for op in operations:
            qml.apply(op)
        return [qml.apply(mp) for mp in measurements]

    assert_allclose_nested(qml.QNode(circuit, dev)(), qml.QNode(circuit, ref)(), atol=1e-12)
    sampled = qml.tape.QuantumScript(operations, [qml.sample()], shots=50)
    ours = qml.device(DEVICE, seed=5).execute(sampled)
    reference = qml.device("default.qubit", seed=5).execute(
        qml.tape.QuantumScript(operations, [qml.state()])
    )
    assert ours.shape == (50, int(np.log2(len(reference))))
    allowed = {
        tuple(int(b) for b in np.binary_repr(i, ours.shape[1]))
        for i in np.flatnonzero(np.abs(reference) > 1e-12)
    }
    assert {tuple(row) for row in ours} <= allowed  # every sample has nonzero amplitude


@pytest.mark.parametrize("wires", [0, []])
def test_device_without_wires_runs_circuits_like_default_qubit(wires):
    """wires=0 and wires=[] are devices without wires that take each circuit's wires, as
    default.qubit does (they failed with a bare KeyError on every circuit that named one)."""
    dev, ref = qml.device(DEVICE, wires=wires, seed=3), qml.device("default.qubit", wires=wires)
    assert dev.wires == ref.wires == qml.wires.Wires([])

    def circuit(x):
        qml.RX(x, 0)
        qml.CNOT([0, "a"])
        qml.RY(0.4, "a")
        return qml.expval(qml.Z("a")), qml.probs(wires=[0, "a"]), qml.expval(qml.Z(0) @ qml.X("a"))

    x = qml.numpy.array(0.7, requires_grad=True)
    expected = qml.QNode(circuit, ref)(x)
    assert_allclose_nested(qml.QNode(circuit, dev)(x), expected, atol=1e-12)

    def cost(node):
        return lambda v: qml.math.hstack(node(v))

    expected_jacobian = qml.jacobian(cost(qml.QNode(circuit, ref, diff_method="backprop")))(x)
    for diff_method in ("adjoint", "parameter-shift"):
        jacobian = qml.jacobian(cost(qml.QNode(circuit, dev, diff_method=diff_method)))(x)
        np.testing.assert_allclose(jacobian, expected_jacobian, atol=1e-12, rtol=0)

    def state():
        qml.Hadamard(1)
        return qml.state()

    np.testing.assert_allclose(qml.QNode(state, dev)(), qml.QNode(state, ref)(), atol=1e-12)
    sampled = qml.set_shots(qml.QNode(circuit, dev), shots=4000)(x)
    assert_allclose_nested(sampled, expected, atol=0.05)


@pytest.mark.parametrize("wires", [-1, -3, 2.5, 2.0, np.float64(3.0), True, 1j])
def test_bad_wires_name_the_option(wires):
    with pytest.raises(ValueError, match=r"^wires=") as info:
        qml.device(DEVICE, wires=wires)
    message = str(info.value)
    assert "int >= 0" in message and "wire labels" in message and "None" in message
    if not isinstance(wires, (bool, float, complex)):
        assert "negative" in message


@pytest.mark.parametrize("wires", [np.int64(2), 3, (0, "b"), "ab", range(2)])
def test_good_wires(wires):
    assert qml.device(DEVICE, wires=wires).wires == qml.device("default.qubit", wires=wires).wires


@pytest.mark.parametrize(
    "seed", [1.5, -1, True, "bad", [], [-1, 2], [[1]], [1.0], {}, np.bool_(1), np.array(5)]
)
def test_bad_seed_values_name_the_option(seed):
    with pytest.raises(ValueError, match=r"^seed=") as info:
        qml.device(DEVICE, wires=1, seed=seed)
    message = str(info.value)
    assert "int >= 0" in message and "None" in message and "'global'" in message
    assert "numpy.random.Generator" in message


@pytest.mark.parametrize(
    "seed",
    [
        np.int64(4),
        2**70,
        [1, 2],
        (3,),
        np.array([7, 8]),
        np.random.SeedSequence(9),
    ],
    ids=repr,
)
def test_numpy_seeds_seed_as_numpy_does(seed):
    """Every seed numpy.random.default_rng takes (as default.qubit does) is accepted, and the
    device's samples are those of a Generator seeded with it."""

    def circuit():
        qml.Hadamard(0)
        return qml.sample(wires=0)

    sampled = qml.set_shots(qml.QNode(circuit, qml.device(DEVICE, wires=1, seed=seed)), 64)()
    again = qml.set_shots(qml.QNode(circuit, qml.device(DEVICE, wires=1, seed=seed)), 64)()
    np.testing.assert_array_equal(sampled, again)
    other = qml.set_shots(qml.QNode(circuit, qml.device(DEVICE, wires=1, seed=12345)), 64)()
    assert not np.array_equal(sampled, other)


@pytest.mark.parametrize("c_dtype", ["foo", "complex32", object(), None, "float64"])
def test_bad_c_dtype_names_the_option(c_dtype):
    with pytest.raises(ValueError, match=r"^c_dtype=") as info:
        qml.device(DEVICE, wires=1, c_dtype=c_dtype)
    assert "numpy.complex128" in str(info.value) and "numpy.complex64" in str(info.value)


@pytest.mark.parametrize("c_dtype", ["complex64", "complex128", np.complex64])
def test_c_dtype_by_name(c_dtype):
    assert qml.device(DEVICE, wires=1, c_dtype=c_dtype).c_dtype == np.dtype(c_dtype)


def _unnormalised_prep():
    qml.StatePrep(np.array([1.0, 1.0, 0, 0]), wires=[0, 1], normalize=False, validate_norm=False)


def _zero_prep():
    qml.StatePrep(np.zeros(4), wires=[0, 1], normalize=False, validate_norm=False)


def _nan_prep():
    qml.StatePrep(np.array([np.nan, 0, 0, 0]), wires=[0, 1], normalize=False, validate_norm=False)


def _non_unitary():
    qml.QubitUnitary(np.diag([2.0, 1.0]), wires=0, unitary_check=False)
    qml.Hadamard(1)


def _zero_matrix():
    qml.Hadamard(1)
    qml.QubitUnitary(np.zeros((2, 2)), wires=0, unitary_check=False)


def _nan_matrix():
    qml.QubitUnitary(np.full((2, 2), np.nan), wires=0, unitary_check=False)


BAD_STATES = {
    "unnormalised StatePrep": (_unnormalised_prep, "2"),
    "zero StatePrep": (_zero_prep, "0"),
    "NaN StatePrep": (_nan_prep, "nan"),
    "non-unitary QubitUnitary": (_non_unitary, "4"),
    "zero QubitUnitary": (_zero_matrix, "0"),
    "NaN QubitUnitary": (_nan_matrix, "nan"),
}
"""Ways to a state that cannot be sampled through public API: preparation, squared norm."""


@pytest.fixture(params=["cpu", "custatevec"])
def backend_name(request):
    """Both backends: the CPU one, and cuStateVec's on its NumPy double."""
    if request.param == "custatevec":
        request.getfixturevalue("gpu_double")
    return request.param


@pytest.mark.parametrize("mcm_method", ["deferred", "one-shot"])
@pytest.mark.parametrize("case", sorted(BAD_STATES))
def test_sampling_a_state_that_is_not_normalised_raises(backend_name, case, mcm_method):
    """Counts of a NaN, zero-norm or unnormalised state were drawn (differently on the two
    backends); now both refuse before sampling, where default.qubit raises (for a NaN state
    default.qubit returns all-zero samples: a wrong number, refused here too)."""
    prepare, norm = BAD_STATES[case]

    def circuit():
        prepare()
        if mcm_method == "one-shot":  # sampled shot by shot, first at the mid-measurement
            qml.measure(1)
        return qml.counts(wires=[0, 1])

    dev = qml.device(DEVICE, wires=3, backend=backend_name, seed=1)
    node = qml.set_shots(qml.QNode(circuit, dev, mcm_method=mcm_method), shots=100)
    with pytest.raises(UnnormalisedStateError, match="Cannot sample") as info:
        node()
    assert re.search(f"squared norm is {re.escape(norm)}[ ,]", str(info.value))
    assert isinstance(info.value, ValueError)  # as default.qubit's "probabilities do not sum to 1"
    if norm != "nan" and mcm_method == "deferred":
        ref = qml.device("default.qubit", wires=3, seed=1)
        with pytest.raises(ValueError, match="probabilities do not sum to 1"):
            qml.set_shots(qml.QNode(circuit, ref, mcm_method=mcm_method), shots=100)()


NO_SHOTS_RESULTS = [  # (measurement, result, whether default.qubit gives it: else it raises)
    (lambda: qml.expval(qml.Z(1)), np.nan, True),
    (lambda: qml.var(qml.Z(1)), np.nan, True),
    (lambda: qml.sample(wires=[0, 1]), np.zeros((0, 2), dtype=np.int64), True),
    (lambda: qml.probs(wires=[0, 1]), np.full(4, np.nan), False),
    (lambda: qml.probs(op=qml.Y(1)), np.full(2, np.nan), False),
    (lambda: qml.counts(wires=[0, 1]), {}, False),
    (
        lambda: qml.counts(wires=[0, 1], all_outcomes=True),
        {"00": 0, "01": 0, "10": 0, "11": 0},
        False,
    ),
    (lambda: qml.counts(qml.Z(1), all_outcomes=True), {1.0: 0, -1.0: 0}, False),
]


@pytest.mark.parametrize(("measurement", "expected", "as_default_qubit"), NO_SHOTS_RESULTS)
@pytest.mark.parametrize("shots", [100, (10, 20)])
def test_a_postselection_of_probability_zero_leaves_no_shots(
    backend_name, measurement, expected, as_default_qubit, shots
):
    """With shots and postselect_mode="hw-like" (the default) a postselected outcome of
    probability 0 keeps none of the shots: expval and var are NaN and samples empty, as on
    default.qubit (the device raised UnnormalisedStateError, sampling the NaN state for
    no shots); probs are NaN and counts empty, where PennyLane's processing of no samples
    raises (ValueError, IndexError; default.qubit too). "fill-shots" raises, as
    default.qubit does."""

    def circuit():
        qml.PauliX(0)
        qml.measure(0, postselect=0)
        return measurement()

    dev = qml.device(DEVICE, wires=3, backend=backend_name, seed=1)
    result = qml.set_shots(qml.QNode(circuit, dev, mcm_method="deferred"), shots=shots)()
    for value in result if isinstance(shots, tuple) else [result]:
        if isinstance(expected, dict):
            assert value == expected
        else:
            np.testing.assert_array_equal(value, expected)
    filled = qml.QNode(circuit, dev, mcm_method="deferred", postselect_mode="fill-shots")
    with pytest.raises(RuntimeError, match="probability of the postselected"):
        qml.set_shots(filled, shots=shots)()
    if as_default_qubit:
        reference = qml.device("default.qubit", wires=3, seed=1)
        want = qml.set_shots(qml.QNode(circuit, reference, mcm_method="deferred"), shots=shots)()
        np.testing.assert_array_equal(result, want)


def _backend(name):
    return CPUBackend() if name == "cpu" else CuStateVecBackend()


def test_backend_level_sampling_checks_every_vector(backend_name):
    """The check sits in front of every backend's sampler (measure.computational_basis_samples):
    a batch whose second vector is unnormalised is refused, naming the vector; a norm off by
    round-off is sampled."""
    backend = _backend(backend_name)
    tape = qml.tape.QuantumScript([], [qml.counts(wires=[0, 1])])
    register = compile_tape(tape, qml.wires.Wires([0, 1])).register
    good = np.array([0.6, 0.0, 0.0, 0.8])
    rng = np.random.default_rng(0)
    for bad in (good * 1.01, good * 0.0, good * np.nan):
        state = backend.from_host(np.stack([good, bad]))
        with pytest.raises(UnnormalisedStateError, match="vector 1 of a batch of 2"):
            measure.computational_basis_samples(backend, state, register, register.wires, 10, rng)
    almost = backend.from_host(np.stack([good, good * (1 + 1e-9)]))
    samples = measure.computational_basis_samples(
        backend, almost, register, register.wires, 50, rng
    )
    assert samples.shape == (2, 50, 2)
    assert set(map(tuple, samples.reshape(-1, 2))) <= {(0, 0), (1, 1)}


@pytest.mark.parametrize("single_data", [False, True])
@pytest.mark.parametrize(
    "dtype, off",
    [(np.complex128, 1e-5), (np.complex128, 4.7e-6), (np.complex64, 1e-2), (np.complex64, 1e-4)],
)
def test_norm_tolerance_per_dtype(dtype, off, single_data):
    """default.qubit's cutoff (1e-6) at complex128; float32 round-off grows with depth, so
    complex64 allows 1e-3, and so does a register whose operations have single-precision
    data (``Register.single_precision_data``). The refusal names the norm in full (it
    printed "1, not 1" for 1.0000047: 6 digits)."""
    backend = CPUBackend(dtype)
    register = Register(qml.wires.Wires([0]), single_precision_data=single_data)
    norms = np.array([1.0 + off])
    single = simulate.NORM_TOLERANCE[np.dtype(np.complex64)]
    tolerance = single if single_data else simulate.NORM_TOLERANCE[np.dtype(dtype)]
    if off > tolerance:
        with pytest.raises(UnnormalisedStateError, match=re.escape(f"is {1.0 + off:.10g}, not 1 ")):
            simulate.require_normalised(backend, norms, register)
    else:
        simulate.require_normalised(backend, norms, register)


def test_sampling_after_a_single_precision_matrix():
    """A QubitUnitary of complex64 data (a jax array with jax's float64 off) is unitary to
    single precision only: ten of them leave the norm off by more than default.qubit's
    1e-6, which is their round-off, not an unnormalised input; the device samples (it
    refused before; PennyLane's test_renomalization_issue, a pulse in float32, met it).
    The same data in complex128 sample as before."""
    rng = np.random.default_rng(8)
    unitary = qml.math.expm(1j * 1.3 * np.kron(qml.matrix(qml.X(0)), qml.matrix(qml.Y(0))))
    noise = 1e-6 * (rng.normal(size=(4, 4)) + 1j * rng.normal(size=(4, 4)))
    single = (unitary + noise).astype(np.complex64)  # off by round-off of float32 size

    def circuit(matrix):
        for _ in range(10):
            qml.QubitUnitary(matrix, wires=[0, 1], unitary_check=False)
        return qml.counts(wires=[0, 1])

    dev = qml.device(DEVICE, wires=2, backend="cpu", seed=3)
    counts = qml.set_shots(qml.QNode(circuit, dev), shots=1000)(single)
    assert sum(counts.values()) == 1000
    with pytest.raises(UnnormalisedStateError):
        qml.set_shots(qml.QNode(circuit, dev), shots=1000)(single.astype(np.complex128))


# --- item 12: qml.Tracker -------------------------------------------------------------------


def _tracked(dev, action):
    """(totals, history keys, history) of ``action(dev)``, the results apart (the
    devices' round-off differs): (their totals, their history)."""
    with qml.Tracker(dev) as tracker:
        action(dev)
    totals = {k: v for k, v in tracker.totals.items() if k != "results"}
    history = {k: v for k, v in tracker.history.items() if k != "results"}
    results = (tracker.totals.get("results"), tracker.history.get("results"))
    return totals, sorted(tracker.history), history, results


def _assert_tracked_alike(action, wires=2, atol=1e-10):
    ours = _tracked(qml.device(DEVICE, wires=wires, seed=5), action)
    reference = _tracked(qml.device("default.qubit", wires=wires, seed=5), action)
    assert ours[0] == reference[0]
    assert ours[1] == reference[1]
    assert ours[2] == reference[2]
    (our_total, our_results), (total, results) = ours[3], reference[3]
    assert (our_total is None) == (total is None)
    if total is not None:
        np.testing.assert_allclose(our_total, total, atol=atol)
    assert (our_results is None) == (results is None)
    if results is not None:
        assert_allclose_nested(list(our_results), list(results), atol=atol)


@pytest.mark.parametrize("grad_on_execution", [True, False])
@pytest.mark.parametrize("device_vjp", [True, False])
def test_tracker_double_count(grad_on_execution, device_vjp):
    """A torch QNode's forward and backward count as on default.qubit (derivatives and VJPs
    were counted twice: execute_and_compute_* called the tracked compute_*)."""

    def action(dev):
        @qml.qnode(
            dev,
            diff_method="adjoint",
            grad_on_execution=grad_on_execution,
            device_vjp=device_vjp,
            interface="torch",
        )
        def circuit(x):
            qml.RX(x[0], 0)
            qml.CNOT([0, 1])
            qml.RY(x[1], 1)
            return qml.expval(qml.Z(0)), qml.expval(qml.Z(1))

        x = torch.tensor([0.3, 0.4], requires_grad=True, dtype=torch.float64)
        first, second = circuit(x)
        (first + 2 * second).backward()

    _assert_tracked_alike(action)


def _tapes():
    """Parameters as the workflow hands them to a device: numpy, not autograd."""
    x = 0.3
    return (
        qml.tape.QuantumScript(
            [qml.RX(x, 0), qml.CNOT([0, 1])], [qml.expval(qml.Z(1))], trainable_params=[0]
        ),
        qml.tape.QuantumScript(
            [qml.RY(0.5, 0), qml.RX(x, 1)],
            [qml.expval(qml.Z(0)), qml.expval(qml.Y(1))],
            trainable_params=[1],
        ),
    )


def _adjoint_config(dev):
    return dev.setup_execution_config(ExecutionConfig(gradient_method="adjoint"))


_COTANGENTS = (1.0, (0.5, -1.0))

DEVICE_CALLS = {
    "execute": lambda dev: dev.execute(_tapes(), _adjoint_config(dev)),
    "compute_derivatives": lambda dev: dev.compute_derivatives(_tapes(), _adjoint_config(dev)),
    "compute_vjp": lambda dev: dev.compute_vjp(_tapes(), _COTANGENTS, _adjoint_config(dev)),
    "execute_and_compute_derivatives": lambda dev: dev.execute_and_compute_derivatives(
        _tapes(), _adjoint_config(dev)
    ),
    "execute_and_compute_vjp": lambda dev: dev.execute_and_compute_vjp(
        _tapes(), _COTANGENTS, _adjoint_config(dev)
    ),
    "execute then compute_vjp": lambda dev: (
        dev.execute(_tapes(), _adjoint_config(dev)),
        dev.compute_vjp(_tapes(), _COTANGENTS, _adjoint_config(dev)),
    ),
    "one tape": lambda dev: dev.execute_and_compute_derivatives(_tapes()[0], _adjoint_config(dev)),
    "shots": lambda dev: dev.execute(
        [qml.tape.QuantumScript(t.operations, t.measurements, shots=(10, 20)) for t in _tapes()]
    ),
}


@pytest.mark.parametrize("call", sorted(DEVICE_CALLS))
def test_tracker_counts_every_entry_point_as_default_qubit(call):
    """totals, history keys and history (batches, executions, derivatives, vjps, resources,
    shots, ...) of each device entry point equal default.qubit's."""
    _assert_tracked_alike(DEVICE_CALLS[call], atol=1e-10 if call != "shots" else 1.0)


# --- item 14: seed="global" -----------------------------------------------------------------


def test_rng_global_stream():
    """Building the device draws from numpy's global stream exactly what default.qubit
    draws, so a script's later np.random values do not depend on the device."""

    def later_values(name):
        np.random.seed(42)
        values = []
        for _ in range(5):
            qml.device(name, wires=2)
            values.append(np.random.rand())
        return values

    assert later_values(DEVICE) == later_values("default.qubit")


def test_global_seed_is_default_qubits_draw():
    """seed="global" seeds the device with np.random.randint(0, high=10_000_000), as
    default.qubit does: its samples are those of a device given that seed."""

    def circuit():
        qml.Hadamard(0)
        qml.Hadamard(1)
        return qml.sample(wires=[0, 1])

    np.random.seed(11)
    drawn = np.random.randint(0, high=10_000_000)
    np.random.seed(11)
    global_dev = qml.device(DEVICE, wires=2, seed="global")
    sampled = qml.set_shots(qml.QNode(circuit, global_dev), shots=50)()
    expected = qml.set_shots(qml.QNode(circuit, qml.device(DEVICE, wires=2, seed=drawn)), 50)()
    np.testing.assert_array_equal(sampled, expected)


# --- item 15: free memory without /proc/meminfo ----------------------------------------------


@pytest.fixture
def no_meminfo(monkeypatch, tmp_path):
    """A platform without /proc/meminfo (macOS, Windows) and without psutil."""
    monkeypatch.setattr(host, "MEMINFO_PATH", str(tmp_path / "no-meminfo"))
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil raises ImportError


def _fake_sysconf(monkeypatch, values: dict):
    names = {name: i for i, name in enumerate(values)}
    calls = []

    def sysconf(name):
        calls.append(name)
        return values[name]

    monkeypatch.setattr(os, "sysconf_names", names, raising=False)
    monkeypatch.setattr(os, "sysconf", sysconf, raising=False)
    return calls


def test_available_bytes_reads_proc_meminfo_where_it_exists(monkeypatch, tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  999 kB\nMemFree:  5 kB\nMemAvailable:   1234 kB\n")
    monkeypatch.setattr(host, "MEMINFO_PATH", str(meminfo))
    assert CPUBackend().available_bytes() == 1234 * 1024


def test_available_bytes_without_proc_meminfo_uses_sysconf(no_meminfo, monkeypatch):
    calls = _fake_sysconf(monkeypatch, {"SC_PAGE_SIZE": 4096, "SC_AVPHYS_PAGES": 1000})
    available = CPUBackend().available_bytes()
    assert type(available) is int and available == 4096 * 1000
    assert "SC_AVPHYS_PAGES" in calls


def test_available_bytes_without_free_page_count_takes_half_the_memory(no_meminfo, monkeypatch):
    """macOS: os.sysconf knows the physical pages, not the free ones."""
    _fake_sysconf(monkeypatch, {"SC_PAGE_SIZE": 16384, "SC_PHYS_PAGES": 1 << 20})
    assert CPUBackend().available_bytes() == 16384 * (1 << 20) // 2


def test_available_bytes_without_sysconf_is_the_documented_default(no_meminfo, monkeypatch):
    """Windows without psutil: no os.sysconf."""
    monkeypatch.setattr(os, "sysconf_names", {}, raising=False)
    available = CPUBackend().available_bytes()
    assert available == host.UNKNOWN_PLATFORM_BYTES > 0


def test_available_bytes_without_proc_meminfo_uses_psutil(monkeypatch, tmp_path):
    monkeypatch.setattr(host, "MEMINFO_PATH", str(tmp_path / "no-meminfo"))
    fake = types.SimpleNamespace(
        virtual_memory=lambda: types.SimpleNamespace(available=7 * 2**30, total=16 * 2**30)
    )
    monkeypatch.setitem(sys.modules, "psutil", fake)
    assert CPUBackend().available_bytes() == 7 * 2**30


def test_too_large_circuit_refused_without_proc_meminfo(no_meminfo, monkeypatch):
    """With the fallback's figure (here 1 MiB free), a 21-qubit circuit (32 MiB) is refused
    before any state is allocated."""
    _fake_sysconf(monkeypatch, {"SC_PAGE_SIZE": 4096, "SC_AVPHYS_PAGES": 256})
    allocations = []
    for method in ("zero_state", "product_state", "from_host"):
        original = getattr(CPUBackend, method)

        def spy(self, *args, _original=original, **kwargs):
            allocations.append(args)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(CPUBackend, method, spy)
    assert_21_qubits_refused("cpu")
    assert allocations == []
