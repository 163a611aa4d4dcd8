"""custatevec.qubit with ``mpi=True``, run under ``mpiexec -n 2`` and ``-n 4`` by
scripts/run_tests.sh (``CUSTATEVEC_TEST_MPI=1``; tests/conftest.py leaves this folder out
of other runs).

Every rank runs every test; each compares what the split device returns on that rank with
default.qubit, or with the same device in one process (``mpi=False``, same seed) where
samples must be identical. The devices split vectors of 2 local bits and more
(``min_local_qubits``), so that these small circuits run the split paths: bit swaps
between ranks, controls and Z letters on global bits, gathered readout, and operations
wider than a slice.
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import torch
from conftest import DEVICE, TOL, assert_allclose_nested, generic_layer, stable_seed
from gate_cases import GATE_WIRES, GATES, gate_forms, make_gate
from mpi4py import MPI
from reference import random_hermitian, random_state, random_unitary

from pennylane_custatevec.backends.distributed import DistributedBackend

COMM = MPI.COMM_WORLD
RANK_BITS = COMM.Get_size().bit_length() - 1


def split_device(wires, backend="cpu", **kwargs):
    """custatevec.qubit over the job's ranks, splitting vectors of >= 2 local bits."""
    dev = qml.device(DEVICE, wires=wires, backend=backend, mpi=True, **kwargs)
    assert isinstance(dev._backend, DistributedBackend)
    dev._backend.min_local_qubits = 2
    return dev


def single_device(wires, **kwargs):
    return qml.device(DEVICE, wires=wires, backend="cpu", **kwargs)


def same_on_every_rank(value) -> bool:
    """Whether every rank holds the same ``value`` (exactly)."""
    values = COMM.allgather(np.asarray(value))
    return all(np.array_equal(v, values[0]) for v in values)


def test_the_job_splits_the_test_circuits():
    assert COMM.Get_size() in (2, 4) and RANK_BITS >= 1
    backend = split_device(7)._backend
    assert backend.global_bits_for(7) == RANK_BITS
    assert backend.amplitudes_held(7) == 1 << (7 - RANK_BITS)
    state = backend.zero_state(7, 2)
    assert state.shape == (2, 128) and state.local.shape == (2, 128 >> RANK_BITS)


# --- every gate ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, form",
    [(name, form) for name in sorted(GATES) for form in gate_forms(name)],
    ids=lambda value: str(value),
)
def test_every_gate(name, form):
    """Each gate of capabilities.toml (plain, controlled, adjoint) on a random placement
    of 7 wires (so on global bits too), after a layer on every wire, against default.qubit."""
    rng = np.random.default_rng(stable_seed("mpi-gate", name, form))
    angles = rng.uniform(0, 2 * np.pi, size=(len(GATE_WIRES), 2))
    op, extra = make_gate(name, rng, extra=2 if form == "controlled" else 0)
    if form == "controlled":
        op = qml.ctrl(op, control=extra, control_values=[1, 0])
    elif form == "adjoint":
        op = qml.adjoint(op)

    def circuit():
        generic_layer(GATE_WIRES, angles)
        qml.apply(op)
        qml.CNOT([GATE_WIRES[-1], GATE_WIRES[0]])
        return qml.state()

    result = qml.QNode(circuit, split_device(GATE_WIRES))()
    expected = qml.QNode(circuit, qml.device("default.qubit", wires=GATE_WIRES))()
    assert_allclose_nested(result, expected, atol=TOL[np.complex128])


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
def test_layers_of_entanglers_and_rotations(dtype):
    """StronglyEntanglingLayers on 8 wires: rings of CNOTs over every global bit."""
    rng = np.random.default_rng(stable_seed("mpi-sel", np.dtype(dtype).name))
    weights = rng.uniform(0, 2 * np.pi, size=(3, 8, 3))

    def circuit(w):
        qml.StronglyEntanglingLayers(w, wires=range(8))
        return qml.state()

    result = qml.QNode(circuit, split_device(8, c_dtype=dtype))(weights)
    expected = qml.QNode(circuit, qml.device("default.qubit", wires=8))(weights)
    assert_allclose_nested(result, expected, atol=TOL[dtype])


# --- measurements ----------------------------------------------------------------------------

WIRES = 6


def _prepared(x):
    for w in range(WIRES):
        qml.RY(x[w], w)
        qml.RX(x[w + WIRES], w)
    for w in range(WIRES):
        qml.CNOT([w, (w + 1) % WIRES])
    qml.CRY(x[0], [5, 2])


def _measurements(rng):
    hermitian = random_hermitian(4, rng)
    wide = random_hermitian(1 << 5, rng)  # wider than a slice under 4 ranks: gathered
    hamiltonian = qml.Hamiltonian(
        [0.3, -1.2, 0.7, 0.25],
        [qml.Z(5) @ qml.Z(4), qml.X(5) @ qml.Y(0), qml.Y(4) @ qml.X(3) @ qml.Z(1), qml.X(2)],
    )
    return [
        qml.expval(qml.Z(5)),
        qml.expval(qml.X(4) @ qml.X(5)),
        qml.expval(qml.Y(5) @ qml.Z(0) @ qml.X(2)),
        qml.expval(hamiltonian),
        qml.expval(qml.Hermitian(hermitian, wires=[5, 1])),
        qml.expval(qml.Hermitian(wide, wires=[0, 2, 3, 4, 5])),
        qml.expval(qml.Projector([1, 0, 1], wires=[5, 0, 3])),
        qml.var(qml.X(5) @ qml.Z(1)),
        qml.var(hamiltonian),
        qml.probs(wires=[5, 0, 4]),
        qml.probs(wires=range(WIRES)),
        qml.probs(op=qml.X(4)),
        qml.expval(
            qml.SparseHamiltonian(hamiltonian.sparse_matrix(wire_order=range(WIRES)), range(WIRES))
        ),
        qml.density_matrix(wires=[4, 1]),
        qml.purity(wires=[5, 0]),
        qml.vn_entropy(wires=[4]),
        qml.mutual_info(wires0=[5], wires1=[0, 1]),
    ]


def test_analytic_measurements():
    rng = np.random.default_rng(stable_seed("mpi-measurements"))
    x = rng.uniform(0, 2 * np.pi, size=2 * WIRES)
    measurements = _measurements(rng)

    def circuit(x):
        _prepared(x)
        return [qml.apply(m) for m in measurements]

    result = qml.QNode(circuit, split_device(WIRES))(x)
    expected = qml.QNode(circuit, qml.device("default.qubit", wires=WIRES))(x)
    assert_allclose_nested(result, expected, atol=1e-10)
    assert same_on_every_rank(np.concatenate([np.ravel(r) for r in result]))


def test_state_and_batch_of_tapes():
    rng = np.random.default_rng(stable_seed("mpi-batch"))
    tapes = []
    for k in range(3):
        x = rng.uniform(0, 2 * np.pi, size=2 * WIRES)
        with qml.queuing.AnnotatedQueue() as q:
            _prepared(x)
            qml.state() if k == 0 else qml.expval(qml.X(5) @ qml.Y(k))
        tapes.append(qml.tape.QuantumScript.from_queue(q))
    result = qml.execute(tapes, split_device(WIRES))
    expected = qml.execute(tapes, qml.device("default.qubit", wires=WIRES))
    assert_allclose_nested(result, expected, atol=1e-10)


def test_broadcasting():
    rng = np.random.default_rng(stable_seed("mpi-broadcast"))
    x = rng.uniform(0, 2 * np.pi, size=(4, 2 * WIRES))

    def circuit(x):
        _prepared(x.T)
        return qml.expval(qml.X(5) @ qml.X(4)), qml.probs(wires=[5, 1]), qml.state()

    result = qml.QNode(circuit, split_device(WIRES))(x)
    expected = qml.QNode(circuit, qml.device("default.qubit", wires=WIRES))(x)
    assert_allclose_nested(result, expected, atol=1e-10)


def test_state_preparation():
    rng = np.random.default_rng(stable_seed("mpi-prep"))
    vector = random_state(WIRES, rng)

    def circuit():
        qml.StatePrep(vector, wires=range(WIRES))
        qml.QubitUnitary(random_unitary(4, np.random.default_rng(5)), wires=[5, 4])
        return qml.state()

    result = qml.QNode(circuit, split_device(WIRES))()
    expected = qml.QNode(circuit, qml.device("default.qubit", wires=WIRES))()
    np.testing.assert_allclose(result, expected, atol=1e-10)


# --- shots and mid-circuit measurements: the same samples as one process -------------------


@pytest.mark.parametrize("shots", [200, (100, 50, 100)], ids=["shots", "shot-vector"])
def test_samples_equal_one_process(shots):
    rng = np.random.default_rng(stable_seed("mpi-samples"))
    x = rng.uniform(0, 2 * np.pi, size=2 * WIRES)

    def circuit(x):
        _prepared(x)
        return (
            qml.sample(wires=[5, 0, 3]),
            qml.counts(wires=[4, 5]),
            qml.expval(qml.X(5) @ qml.Z(1)),
            qml.sample(qml.Y(4)),
            qml.probs(wires=[5]),
        )

    run = qml.set_shots(shots)
    result = run(qml.QNode(circuit, split_device(WIRES, seed=42)))(x)
    expected = run(qml.QNode(circuit, single_device(WIRES, seed=42)))(x)
    assert_allclose_nested(result, expected, atol=1e-12)


def test_unseeded_ranks_draw_the_same_samples():
    """Each rank seeds numpy's global state differently: the device takes rank 0's
    generator, so every rank returns the same samples."""
    np.random.seed(COMM.Get_rank())
    dev = split_device(WIRES)

    @qml.set_shots(50)
    @qml.qnode(dev)
    def circuit():
        for w in range(WIRES):
            qml.Hadamard(w)
        return qml.sample(wires=range(WIRES))

    assert same_on_every_rank(circuit())


@pytest.mark.parametrize(
    "method, shots", [("one-shot", 300), ("deferred", None), ("tree-traversal", None)]
)
def test_mid_circuit_measurements_equal_one_process(method, shots):
    x = np.array([1.1, 0.4, 2.3, -0.7])

    def circuit(x):
        qml.RX(x[0], 5)
        qml.CNOT([5, 0])
        qml.RY(x[1], 4)
        m0 = qml.measure(5)
        qml.cond(m0, qml.RY)(x[2], wires=4)
        m1 = qml.measure(4, reset=True)
        qml.cond(m0 & m1, qml.CRX)(x[3], wires=[1, 5])
        return qml.expval(qml.Z(5) @ qml.X(4)), qml.probs(wires=[5, 1])

    run = qml.set_shots(shots)
    kwargs = {"mcm_method": method}
    wires = WIRES + 2  # room for the deferred method's two extra wires
    result = run(qml.QNode(circuit, split_device(wires, seed=7), **kwargs))(x)
    expected = run(qml.QNode(circuit, single_device(wires, seed=7), **kwargs))(x)
    assert_allclose_nested(result, expected, atol=1e-10)


@pytest.mark.parametrize(
    "method, shots", [("one-shot", 300), ("deferred", None), ("tree-traversal", None)]
)
def test_pauli_product_measurements_equal_one_process(method, shots):
    """qml.pauli_measure over wires on global and local bits: its basis change and CNOT
    parity run as gates, its measurement as a Z-basis one (transforms)."""

    def circuit():
        for w in range(WIRES):
            qml.RY(0.3 + 0.4 * w, w)
        qml.CNOT([1, 5])
        m0 = qml.pauli_measure("XYZ", [0, 5, 3])
        qml.cond(m0, qml.RX)(0.8, wires=2)
        qml.pauli_measure("ZX", [2, 1], postselect=1 if method != "one-shot" else None)
        return qml.expval(qml.Y(5) @ qml.X(0)), qml.probs(wires=[2, 1]), qml.expval(m0)

    run = qml.set_shots(shots)
    kwargs = {"mcm_method": method}
    wires = WIRES + 2  # room for the deferred method's two extra wires
    result = run(qml.QNode(circuit, split_device(wires, seed=7), **kwargs))()
    expected = run(qml.QNode(circuit, single_device(wires, seed=7), **kwargs))()
    assert_allclose_nested(result, expected, atol=1e-10)


# --- derivatives -----------------------------------------------------------------------------


@pytest.mark.parametrize("grad_accumulation", ["deferred", "eager"])
def test_adjoint_jacobian(grad_accumulation):
    rng = np.random.default_rng(stable_seed("mpi-jacobian", grad_accumulation))
    x = qml.numpy.array(rng.uniform(0, 2 * np.pi, size=2 * WIRES), requires_grad=True)
    hermitian = random_hermitian(4, rng)

    def circuit(x):
        _prepared(x)
        qml.IsingXY(x[3], [5, 4])
        qml.MultiRZ(x[4], [5, 4, 0])
        return (
            qml.expval(qml.X(5) @ qml.Y(4)),
            qml.expval(qml.Hermitian(hermitian, wires=[4, 2])),
            qml.expval(qml.Z(0)),
        )

    def jacobian(dev, method):
        node = qml.QNode(circuit, dev, diff_method=method)
        return qml.jacobian(lambda x: qml.numpy.stack(node(x)))(x)

    split = split_device(WIRES, grad_accumulation=grad_accumulation)
    result = jacobian(split, "adjoint")
    expected = jacobian(qml.device("default.qubit", wires=WIRES), "backprop")
    np.testing.assert_allclose(result, expected, atol=1e-10)


@pytest.mark.parametrize("grad_accumulation", ["deferred", "eager"])
def test_adjoint_jacobian_through_postselection(grad_accumulation):
    """The eager sweep's step back through a postselection (on a global and a local
    bit): default.qubit's backpropagation."""
    rng = np.random.default_rng(stable_seed("mpi-postselection", grad_accumulation))
    x = qml.numpy.array(rng.uniform(0, 2 * np.pi, size=2 * WIRES), requires_grad=True)

    def circuit(x):
        _prepared(x)
        qml.measure(5, postselect=1)
        qml.IsingXY(x[3], [5, 4])
        qml.Projector([0], wires=[1])
        qml.MultiRZ(x[4], [5, 4, 0])
        return qml.expval(qml.X(5) @ qml.Y(4)), qml.probs(wires=[0, 2])

    def jacobian(dev, method):
        node = qml.QNode(circuit, dev, diff_method=method)
        return qml.jacobian(lambda x: qml.numpy.hstack(node(x)))(x)

    wires = WIRES + 1  # the deferred measurement's wire: wire 5 is used after it
    split = split_device(wires, grad_accumulation=grad_accumulation)
    result = jacobian(split, "adjoint")
    expected = jacobian(qml.device("default.qubit", wires=wires), "backprop")
    np.testing.assert_allclose(result, expected, atol=1e-10)
    assert np.abs(expected).max() > 0.05


@pytest.mark.parametrize("grad_accumulation", ["deferred", "eager"])
def test_torch_vjp_with_broadcasting(grad_accumulation):
    rng = np.random.default_rng(stable_seed("mpi-vjp", grad_accumulation))
    weights = rng.uniform(0, 2 * np.pi, size=(2, WIRES, 3))
    inputs = rng.uniform(0, np.pi, size=(3, WIRES))

    def circuit(inputs, weights):
        qml.AngleEmbedding(inputs, wires=range(WIRES))
        qml.StronglyEntanglingLayers(weights, wires=range(WIRES))
        return [qml.expval(qml.Z(w)) for w in (5, 4, 0)] + [qml.expval(qml.X(5) @ qml.X(3))]

    def gradient(dev, method, **kwargs):
        w = torch.tensor(weights, requires_grad=True)
        node = qml.QNode(circuit, dev, interface="torch", diff_method=method, **kwargs)
        out = torch.stack(node(torch.tensor(inputs), w))
        (
            out * torch.arange(1.0, 1.0 + out.numel(), dtype=out.dtype).reshape(out.shape)
        ).sum().backward()
        return out.detach().numpy(), w.grad.numpy()

    split = split_device(WIRES, grad_accumulation=grad_accumulation)
    result = gradient(split, "adjoint", device_vjp=True)
    expected = gradient(qml.device("default.qubit", wires=WIRES), "backprop")
    assert_allclose_nested(result, expected, atol=1e-10)
    assert same_on_every_rank(result[1])


@pytest.mark.parametrize("grad_accumulation", ["deferred", "eager"])
def test_trainable_unitary_by_its_entries(grad_accumulation):
    """A trainable QubitUnitary on global and local bits (the eager sweep's dense step on
    split vectors), at the identity and a random matrix: backpropagation's gradient."""
    rng = np.random.default_rng(stable_seed("mpi-entrywise", grad_accumulation))
    one = random_unitary(2, rng)

    def circuit(one, two, x):
        qml.RX(x, wires=0)
        qml.Hadamard(wires=5)
        qml.QubitUnitary(one, wires=[5])
        qml.QubitUnitary(two, wires=[4, 1])
        qml.CNOT(wires=[5, 4])
        return qml.expval(qml.X(5) @ qml.Z(1) + 0.3 * qml.Y(4)), qml.probs(wires=[0, 4])

    _split_gradients_equal_backpropagation(
        circuit, (one, np.eye(4, dtype=np.complex128), 0.4), grad_accumulation
    )


def _split_gradients_equal_backpropagation(circuit, values, grad_accumulation: str) -> None:
    """The split device's adjoint gradients of ``circuit`` at ``values`` are
    backpropagation's on default.qubit, and the same on every rank."""
    split = split_device(WIRES, grad_accumulation=grad_accumulation)
    result = _weighted_gradients(circuit, split, "adjoint", values)
    reference = qml.device("default.qubit", wires=WIRES)
    expected = _weighted_gradients(circuit, reference, "backprop", values)
    assert_allclose_nested(result, expected, atol=1e-10)
    assert all(same_on_every_rank(gradient) for gradient in result)


def _weighted_gradients(circuit, dev, method: str, values) -> list[np.ndarray]:
    """torch's gradients by ``values`` of sum_i (i + 1) out_i, the QNode's outputs stacked."""
    arguments = [torch.tensor(np.asarray(value), requires_grad=True) for value in values]
    node = qml.QNode(circuit, dev, interface="torch", diff_method=method)
    out = torch.hstack(node(*arguments))
    (out * torch.arange(1.0, 1.0 + out.numel(), dtype=out.dtype)).sum().backward()
    return [a.grad.numpy() for a in arguments]


@pytest.mark.parametrize("grad_accumulation", ["deferred", "eager"])
def test_trainable_state_preparation_by_its_amplitudes(grad_accumulation):
    """A trainable StatePrep on a global and a local wire, with zero amplitudes: the bras
    carried back to the start are read where its amplitudes sit on split vectors."""

    def circuit(v, x):
        qml.StatePrep(v, wires=[5, 0])
        qml.RX(x, wires=4)
        qml.CNOT(wires=[0, 4])
        qml.CNOT(wires=[5, 1])
        return qml.expval(qml.X(0) @ qml.Z(4) + 0.3 * qml.Y(5)), qml.probs(wires=[1, 0])

    arguments = (np.array([0.6, 0.0, 0.8j, 0.0]), 0.4)
    _split_gradients_equal_backpropagation(circuit, arguments, grad_accumulation)


def test_small_circuits_run_replicated():
    """A circuit with fewer local bits than the threshold runs whole on every rank."""
    dev = qml.device(DEVICE, wires=3, backend="cpu", mpi=True)
    assert dev._backend.global_bits_for(3) == 0

    @qml.qnode(dev)
    def circuit(x):
        qml.RX(x, 2)
        qml.CNOT([2, 0])
        return qml.expval(qml.Z(0)), qml.state()

    value, state = circuit(0.3)
    np.testing.assert_allclose(value, np.cos(0.3), atol=1e-12)
    assert state.shape == (8,)


def test_compiled_qnode():
    """pennylane_custatevec.compile on a split device: values and gradients of a
    broadcast minibatch equal default.qubit's."""
    import pennylane_custatevec

    rng = np.random.default_rng(stable_seed("mpi-compiled"))
    inputs = torch.tensor(rng.uniform(0, np.pi, size=(3, WIRES)))
    weights = rng.uniform(0, 2 * np.pi, size=(2, WIRES, 3))

    def circuit(x, w):
        qml.AngleEmbedding(x, wires=range(WIRES))
        qml.StronglyEntanglingLayers(w, wires=range(WIRES))
        return qml.expval(qml.Z(5) @ qml.X(4)), qml.probs(wires=[5, 0])

    def run(function):
        w = torch.tensor(weights, requires_grad=True)
        value, probs = function(inputs, w)
        (value.sum() + (probs * torch.arange(4.0, dtype=probs.dtype)).sum()).backward()
        return value.detach().numpy(), probs.detach().numpy(), w.grad.numpy()

    node = qml.QNode(
        circuit, split_device(WIRES), interface="torch", diff_method="adjoint", device_vjp=True
    )
    result = run(pennylane_custatevec.compile(node))
    expected = run(qml.QNode(circuit, qml.device("default.qubit", wires=WIRES), interface="torch"))
    assert_allclose_nested(result, expected, atol=1e-10)


@pytest.mark.parametrize("wires", [WIRES, 3], ids=["split", "replicated"])
def test_rank_shares_of_state_and_probs(wires):
    """mpi_gather=False: state() and probs() of every wire are each rank's contiguous
    share, whose concatenation over ranks is the whole; other results stay whole."""
    x = np.linspace(0.2, 1.9, 2 * wires)

    def circuit(x):
        for w in range(wires):
            qml.RY(x[w], w)
            qml.RX(x[w + wires], w)
            qml.CNOT([w, (w + 1) % wires])
        return qml.state(), qml.probs(), qml.probs(wires=[0]), qml.expval(qml.X(0))

    dev = split_device(wires, mpi_gather=False)
    state, probs, first, value = qml.QNode(circuit, dev)(x)
    expected = qml.QNode(circuit, qml.device("default.qubit", wires=wires))(x)
    share = (1 << wires) // COMM.Get_size()
    assert state.shape == (share,) and probs.shape == (share,)
    np.testing.assert_allclose(np.concatenate(COMM.allgather(state)), expected[0], atol=1e-10)
    np.testing.assert_allclose(np.concatenate(COMM.allgather(probs)), expected[1], atol=1e-10)
    np.testing.assert_allclose(first, expected[2], atol=1e-10)
    np.testing.assert_allclose(value, expected[3], atol=1e-10)


def test_rank_shares_are_not_differentiated():
    dev = split_device(WIRES, mpi_gather=False)

    @qml.qnode(dev, diff_method="adjoint")
    def circuit(x):
        qml.RX(x, 5)
        return qml.probs()

    with pytest.raises(qml.exceptions.DeviceError, match="mpi_gather=True"):
        qml.jacobian(circuit)(qml.numpy.array(0.3, requires_grad=True))


def test_fused_runs_on_split_vectors(monkeypatch):
    """Fusion's runs under a split: CNOT rings as one bit permutation (its moved bits made
    local), QAOA cost layers as Z-word runs whose words on global bits are signs or
    phases; values and adjoint Jacobians (deferred) against default.qubit."""
    calls = {"apply_bit_permutation": 0, "apply_z_rotations": 0, "adjoint_z_rotations_step": 0}
    for name in calls:
        original = getattr(DistributedBackend, name)

        def counted(self, *args, _original=original, _name=name):
            calls[_name] += 1
            return _original(self, *args)

        monkeypatch.setattr(DistributedBackend, name, counted)
    wires = 8
    edges = [(0, 1), (1, 2), (0, 7), (3, 5), (6, 1), (4, 0)]  # (0, 1): both global on 4 ranks

    def circuit(x, w):
        for q in range(wires):
            qml.Hadamard(q)
        for layer in range(2):
            for k, (a, b) in enumerate(edges):
                qml.IsingZZ(x[layer, k], [a, b])
            qml.MultiRZ(x[layer, -1], [0, 1, 5])
            for q in range(wires):
                qml.RX(x[layer, len(edges) + q], q)
        qml.StronglyEntanglingLayers(w, wires=range(wires))
        return qml.expval(qml.Z(0) @ qml.Z(1)), qml.expval(qml.X(7) @ qml.Y(0))

    rng = np.random.default_rng(stable_seed("mpi-runs"))
    x = qml.numpy.array(rng.uniform(0, 2, size=(2, len(edges) + wires + 1)), requires_grad=True)
    w = qml.numpy.array(rng.uniform(0, 2, size=(1, wires, 3)), requires_grad=True)

    def jacobian(dev, method):
        node = qml.QNode(circuit, dev, diff_method=method)
        return node(x, w), qml.jacobian(lambda x, w: qml.numpy.stack(node(x, w)))(x, w)

    result = jacobian(split_device(wires), "adjoint")
    expected = jacobian(qml.device("default.qubit", wires=wires), "backprop")
    assert_allclose_nested(result, expected, atol=1e-10)
    assert all(count > 0 for count in calls.values()), calls


def test_each_rank_of_a_node_takes_its_own_gpu(monkeypatch):
    """With mpi and no device_id, the backend gets the rank's index on its node (every
    rank here shares one node), which it takes modulo the visible GPUs; an explicit
    device_id is kept, and no node rank is asked for."""
    from pennylane_custatevec import device as device_module

    chosen = []
    plain = device_module.select_backend

    def recording(name, dtype, device_id=None, rank_on_node=None):
        chosen.append((device_id, rank_on_node))
        return plain(name, dtype, device_id, rank_on_node)

    monkeypatch.setattr(device_module, "select_backend", recording)
    qml.device(DEVICE, wires=4, backend="cpu", mpi=True)
    qml.device(DEVICE, wires=4, backend="cpu", mpi=True, device_id=0)
    assert chosen == [(None, COMM.Get_rank()), (0, None)]


@pytest.mark.parametrize("grad_accumulation", ["deferred", "eager"])
def test_gpu_backend_on_its_double(monkeypatch, grad_accumulation):
    """The cuStateVec backend (on its NumPy double, 4 GPUs visible) as each rank's local
    backend: each rank on the GPU of its node index; values, probabilities, the state and
    a torch VJP of a broadcast minibatch against default.qubit."""
    from custatevec_double import make_libraries

    from pennylane_custatevec.backends import gpu

    libraries = make_libraries(gpus=4)
    monkeypatch.setattr(gpu, "import_libraries", lambda: libraries)
    gpu.unavailable_reason.cache_clear()
    try:
        dev = split_device(WIRES, backend="custatevec", grad_accumulation=grad_accumulation)
        assert dev._backend.local.name == "custatevec"
        assert dev._backend.local.device_id == COMM.Get_rank()
        rng = np.random.default_rng(stable_seed("mpi-double", grad_accumulation))
        inputs = torch.tensor(rng.uniform(0, np.pi, size=(3, WIRES)))
        weights = rng.uniform(0, 2 * np.pi, size=(2, WIRES, 3))

        def circuit(x, w):
            qml.AngleEmbedding(x, wires=range(WIRES))
            qml.StronglyEntanglingLayers(w, wires=range(WIRES))
            return qml.expval(qml.X(5) @ qml.Z(0)), qml.probs(wires=[5, 4, 1])

        def run(device, method, **kwargs):
            w = torch.tensor(weights, requires_grad=True)
            node = qml.QNode(circuit, device, interface="torch", diff_method=method, **kwargs)
            value, probs = node(inputs, w)
            (value.sum() + (probs * torch.arange(8.0, dtype=probs.dtype)).sum()).backward()
            return value.detach().numpy(), probs.detach().numpy(), w.grad.numpy()

        result = run(dev, "adjoint", device_vjp=True)
        expected = run(qml.device("default.qubit", wires=WIRES), "backprop")
        assert_allclose_nested(result, expected, atol=1e-10)

        def state():
            qml.StronglyEntanglingLayers(weights, wires=range(WIRES))
            return qml.state()

        np.testing.assert_allclose(
            qml.QNode(state, dev)(),
            qml.QNode(state, qml.device("default.qubit", wires=WIRES))(),
            atol=1e-10,
        )
    finally:
        gpu.unavailable_reason.cache_clear()


@pytest.mark.parametrize(
    ("swaps", "route"),
    [("host", "pinned host memory"), ("device", "device memory (CUDA-aware MPI)")],
)
def test_gpu_bit_swap_routes_on_the_double(monkeypatch, swaps, route):
    """Both GPU bit-swap routes on the double (PLCSV_MPI_SWAPS): gates on every wire swap
    the global ones in, by pinned host memory or by device memory read by mpi4py through
    __cuda_array_interface__; the state and an expectation are default.qubit's, and only
    the pinned route copies through pinned memory."""
    from custatevec_double import make_libraries

    from pennylane_custatevec.backends import gpu

    libraries = make_libraries(gpus=2)
    monkeypatch.setattr(gpu, "import_libraries", lambda: libraries)
    monkeypatch.setenv("PLCSV_MPI_SWAPS", swaps)
    gpu.unavailable_reason.cache_clear()
    try:
        dev = split_device(WIRES, backend="custatevec")
        assert dev._backend.swap_route == route and f"swaps via {route}" in repr(dev)
        weights = np.random.default_rng(stable_seed("routes", swaps)).uniform(
            0, 2 * np.pi, size=(2, WIRES, 3)
        )

        def circuit():
            qml.StronglyEntanglingLayers(weights, wires=range(WIRES))
            return qml.state(), qml.expval(qml.X(0) @ qml.Y(WIRES - 1))

        ours = qml.QNode(circuit, dev)()
        expected = qml.QNode(circuit, qml.device("default.qubit", wires=WIRES))()
        assert_allclose_nested(ours, expected, atol=1e-10)
        assert dev._backend.messages.traffic.swaps > 0
        assert (libraries.cupy.pinned_copies > 0) == (swaps == "host")
    finally:
        gpu.unavailable_reason.cache_clear()
