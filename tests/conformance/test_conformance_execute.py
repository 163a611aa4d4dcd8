"""``qml.execute`` batches on custatevec.qubit against default.qubit: tapes of different
structures, measurements and broadcasting in one batch; tapes whose different gates
compile alike (look-alike gates); tapes that differ only in large observables (Hermitians,
SparseHamiltonians, state-vector Projectors whose data numpy's and scipy's reprs
abbreviate), forward, differentiated and sampled. Each tape's result and derivatives
must be default.qubit's, whatever else is in the batch.
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import scipy.sparse as sp
import torch
from conformance_support import (
    ADJOINT_CONFIGS,
    ADJOINT_JACOBIAN,
    ADJOINT_VJP,
    BEST,
    PARAMETER_SHIFT,
    assert_same_derivatives,
    assert_same_result,
    assert_same_torch_jacobian,
    custatevec_device,
    interface,
    interface_config_params,
    reference_device,
    to_numpy,
)
from conftest import stable_seed

# ---------------------------------------------------------------------------------------
# batches mixing structures


def mixed_tapes(a, b, adjoint: bool):
    """Tapes of several structures over the trainable scalars ``a`` and ``b``: same gates
    with other parameters and measurements, other gates, a broadcast tape, a tape without
    trainable parameters and (``adjoint``) a state. PennyLane's parameter-shift rule
    differentiates neither states nor broadcast parameters: with ``adjoint`` False, no
    state and the broadcast parameter is constant."""
    gates = [qml.RX(a, 0), qml.CNOT([0, 1]), qml.RY(b, 1)]
    batch = np.array([1.0, 2.0, 3.0])
    broadcast = a * qml.math.convert_like(batch, a) if adjoint else 0.4 * batch
    tapes = [
        qml.tape.QuantumScript(gates, [qml.expval(qml.Z(0) @ qml.Z(1))]),
        qml.tape.QuantumScript(
            [qml.RX(2 * b, 0), qml.CNOT([0, 1]), qml.RY(a - b, 1)], [qml.probs(wires=[0, 1])]
        ),
        qml.tape.QuantumScript(
            [qml.IsingXX(a, [0, 1]), qml.RZ(b, 0), qml.Hadamard(1), qml.CRY(a * b, [1, 0])],
            [qml.expval(qml.X(0)), qml.probs(wires=[1])],
        ),
        qml.tape.QuantumScript(
            [
                qml.RX(broadcast, 0),
                qml.RY(b, 1),
                qml.CNOT([1, 0]),
            ],
            [qml.expval(qml.Z(0)), qml.expval(qml.Y(1))],
        ),
        qml.tape.QuantumScript([qml.RX(0.4, 0), qml.RY(-0.3, 1)], [qml.expval(qml.Z(1))]),
        qml.tape.QuantumScript(gates[::-1], [qml.expval(qml.Z(0) @ qml.Z(1))]),
    ]
    if adjoint:
        tapes.append(qml.tape.QuantumScript(gates, [qml.state()]))
    return tapes


@pytest.mark.parametrize(("interface_name", "config", "mode"), interface_config_params())
def test_execute_batch_mixing_structures(interface_name, config, mode):
    """One ``qml.execute`` of tapes of several structures: each tape's results and the
    Jacobian of all of them by the trainable scalars are default.qubit's."""
    iface = interface(interface_name)
    adjoint = config is not PARAMETER_SHIFT
    dev, ref = custatevec_device(2, mode), reference_device(2)
    kwargs = config.qnode_kwargs()

    def ours(a, b):
        return tuple(qml.execute(mixed_tapes(a, b, adjoint), dev, **kwargs))

    def expected(a, b):
        return tuple(qml.execute(mixed_tapes(a, b, adjoint), ref, diff_method="backprop"))

    values = [0.7, -0.4]
    assert_same_result(ours(*iface.args(values)), expected(*iface.args(values)))
    ref_iface = iface.for_reference_derivatives()
    key = (adjoint, ref_iface.name)
    if key not in REFERENCE_JACOBIANS:
        REFERENCE_JACOBIANS[key] = ref_iface.jacobian(expected, ref_iface.args(values))
    assert_same_derivatives(iface.jacobian(ours, iface.args(values)), REFERENCE_JACOBIANS[key])


REFERENCE_JACOBIANS: dict = {}
"""default.qubit's Jacobians of the mixed batch, by (adjoint, interface)."""


# ---------------------------------------------------------------------------------------
# look-alike gates: different gates that compile to kernels of the same shape


def lookalike(name):
    """Pairs of different one-parameter gates on the same wires."""
    return {
        "IsingXY-SingleExcitation": (
            lambda x: qml.IsingXY(x, wires=[0, 1]),
            lambda x: qml.SingleExcitation(x, wires=[0, 1]),
        ),
        "PhaseShift-ctrl_GlobalPhase": (
            lambda x: qml.PhaseShift(x, wires=0),
            lambda x: qml.ctrl(qml.GlobalPhase(x), control=0),
        ),
        "RZ-PhaseShift": (lambda x: qml.RZ(x, wires=0), lambda x: qml.PhaseShift(x, wires=0)),
        "RX-RY": (lambda x: qml.RX(x, wires=1), lambda x: qml.RY(x, wires=1)),
        "IsingXX-IsingYY": (
            lambda x: qml.IsingXX(x, wires=[0, 1]),
            lambda x: qml.IsingYY(x, wires=[0, 1]),
        ),
        "CRX-CRY": (lambda x: qml.CRX(x, wires=[0, 1]), lambda x: qml.CRY(x, wires=[0, 1])),
        "ControlledPhaseShift-CRZ": (
            lambda x: qml.ControlledPhaseShift(x, wires=[0, 1]),
            lambda x: qml.CRZ(x, wires=[0, 1]),
        ),
        "SingleExcitationPlus-SingleExcitationMinus": (
            lambda x: qml.SingleExcitationPlus(x, wires=[0, 1]),
            lambda x: qml.SingleExcitationMinus(x, wires=[0, 1]),
        ),
    }[name]


LOOKALIKE_PAIRS = [
    "IsingXY-SingleExcitation",
    "PhaseShift-ctrl_GlobalPhase",
    "RZ-PhaseShift",
    "RX-RY",
    "IsingXX-IsingYY",
    "CRX-CRY",
    "ControlledPhaseShift-CRZ",
    "SingleExcitationPlus-SingleExcitationMinus",
]
SWEEPS = [
    pytest.param("deferred", None, id="deferred"),
    pytest.param("deferred", 0, id="deferred-unfused"),
    pytest.param("eager", None, id="eager"),
]


def lookalike_tapes(pair, x):
    """Both gates of ``pair`` after the same gates, measured alike, in both orders."""
    first, second = lookalike(pair)
    before = [qml.Hadamard(0), qml.RY(0.4, wires=1), qml.CNOT([1, 0])]
    measurements = [qml.expval(qml.Z(0) @ qml.X(1)), qml.expval(qml.X(0))]
    return [
        qml.tape.QuantumScript([*before, gate(x), qml.RX(0.3, 0)], measurements)
        for gate in (first, second, second, first)
    ]


def run_lookalikes(pair, dev, **kwargs):
    def run(x):
        results = qml.execute(lookalike_tapes(pair, x), dev, **kwargs)
        return torch.stack([torch.stack(r) for r in results])

    return run


@pytest.mark.parametrize(("mode", "fusion_qubits"), SWEEPS)
@pytest.mark.parametrize("config", [ADJOINT_JACOBIAN, ADJOINT_VJP], ids=lambda c: c.name)
@pytest.mark.parametrize("pair", LOOKALIKE_PAIRS)
def test_lookalike_gates_execute(pair, config, mode, fusion_qubits):
    """deferred_lookalike_gates_execute.py, deferred_lookalike_gates_phase.py: each tape
    gets its own gate's derivative, whichever tapes share its batch."""
    dev = custatevec_device(2, mode, fusion_qubits=fusion_qubits)
    x = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    ours = run_lookalikes(pair, dev, **config.qnode_kwargs())
    ref = run_lookalikes(pair, reference_device(2), diff_method="backprop")
    assert_same_result(ours(x), ref(x))
    assert_same_torch_jacobian(ours, ref, x)


@pytest.mark.parametrize("config", [ADJOINT_JACOBIAN, ADJOINT_VJP], ids=lambda c: c.name)
@pytest.mark.parametrize("pair", ["IsingXY-SingleExcitation", "PhaseShift-ctrl_GlobalPhase"])
def test_lookalike_gates_execute_gpu_backend(pair, config, gpu_double):
    """The same on the cuStateVec backend (its NumPy double), deferred, fused."""
    dev = custatevec_device(2, "deferred", backend="custatevec")
    assert dev.backend_name == "custatevec"
    x = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    ours = run_lookalikes(pair, dev, **config.qnode_kwargs())
    ref = run_lookalikes(pair, reference_device(2), diff_method="backprop")
    assert_same_torch_jacobian(ours, ref, x)


# ---------------------------------------------------------------------------------------
# large observables: equal in their abbreviated reprs, different in their data


def large_observables(kind):
    """(wires, two observables that differ only in data their reprs leave out)."""
    if kind == "hermitian":
        n = 6
        h1, h2 = np.zeros((2**n, 2**n)), np.zeros((2**n, 2**n))
        h1[10, 10] = 1.0  # projector on |001010>
        h2[20, 21] = h2[21, 20] = 1.0  # couples |010100> and |010101>
        return n, qml.Hermitian(h1, wires=range(n)), qml.Hermitian(h2, wires=range(n))
    if kind == "sparse_hamiltonian":
        n = 6
        d1 = np.arange(2**n, dtype=float) / 2**n
        d2 = d1.copy()
        d2[30] += 0.5  # an entry scipy's str (50 stored entries at most) leaves out
        return (
            n,
            qml.SparseHamiltonian(sp.csr_matrix(np.diag(d1)), wires=range(n)),
            qml.SparseHamiltonian(sp.csr_matrix(np.diag(d2)), wires=range(n)),
        )
    n = 10
    v1, v2 = np.zeros(2**n), np.zeros(2**n)
    v1[100], v2[200] = 1.0, 1.0
    return n, qml.Projector(v1, wires=range(n)), qml.Projector(v2, wires=range(n))


LARGE_OBSERVABLES = ["hermitian", "sparse_hamiltonian", "projector_state_vector"]


def large_observable_tapes(kind, x):
    n, first, second = large_observables(kind)
    gates = [qml.RY(x, wires=0)] + [qml.RY(0.3 + 0.4 * i, wires=i) for i in range(1, n)]
    gates += [qml.CNOT([i, i + 1]) for i in range(0, n - 1, 2)]
    return n, [qml.tape.QuantumScript(gates, [qml.expval(obs)]) for obs in (first, second)]


@pytest.mark.parametrize("kind", LARGE_OBSERVABLES)
def test_large_observables_execute(kind):
    """observable_hash_execute.py, observable_hash_sparse_projector.py: both tapes in one
    batch get default.qubit's values, as when run one by one."""
    n, tapes = large_observable_tapes(kind, 0.5)
    dev, ref = custatevec_device(n), reference_device(n)
    expected = qml.execute(tapes, ref, diff_method=None)
    assert expected[0] != expected[1]
    assert_same_result(tuple(qml.execute(tapes, dev, diff_method=None)), tuple(expected))
    alone = tuple(qml.execute([t], dev, diff_method=None)[0] for t in tapes)
    assert_same_result(alone, tuple(expected))


@pytest.mark.parametrize("kind", LARGE_OBSERVABLES)
def test_large_observables_execute_gpu_backend(kind, gpu_double):
    """The same on the cuStateVec backend (its NumPy double)."""
    n, tapes = large_observable_tapes(kind, 0.5)
    dev = custatevec_device(n, backend="custatevec")
    assert dev.backend_name == "custatevec"
    expected = qml.execute(tapes, reference_device(n), diff_method=None)
    assert_same_result(tuple(qml.execute(tapes, dev, diff_method=None)), tuple(expected))


@pytest.mark.parametrize(("mode", "fusion_qubits"), SWEEPS)
@pytest.mark.parametrize("config", [*ADJOINT_CONFIGS, BEST], ids=lambda c: c.name)
@pytest.mark.parametrize("kind", LARGE_OBSERVABLES)
def test_large_observables_gradients(kind, config, mode, fusion_qubits):
    """The derivative of each tape's value by a gate angle, with the other tape in the
    batch: default.qubit's (parameter-shift, exact for these gates)."""

    def run(dev, **kwargs):
        def values(x):
            n, tapes = large_observable_tapes(kind, x)
            return torch.stack(qml.execute(tapes, dev, **kwargs))

        return values

    n = large_observables(kind)[0]
    dev = custatevec_device(n, mode, fusion_qubits=fusion_qubits)
    x = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    ours = run(dev, **config.qnode_kwargs())
    ref = run(reference_device(n), diff_method="parameter-shift")
    assert_same_result(ours(x), ref(x))
    assert_same_torch_jacobian(ours, ref, x)


def two_large_hermitians(x):
    n, first, second = large_observables("hermitian")
    for i in range(n):
        qml.RY(x + 0.4 * i, wires=i)
    return qml.expval(first), qml.expval(second)


def test_large_hermitians_with_shots():
    """observable_hash_shots.py: two Hermitians that do not commute on the same wires,
    sampled (20000 seeded shots): estimates within tolerance of the exact values."""
    n = large_observables("hermitian")[0]
    exact = qml.QNode(two_large_hermitians, reference_device(n))(0.3)
    dev = custatevec_device(n, seed=stable_seed("conformance-large-hermitians"))
    sampled = qml.set_shots(qml.QNode(two_large_hermitians, dev), 20000)(0.3)
    assert np.shape(sampled) == np.shape(exact)
    np.testing.assert_allclose(to_numpy(sampled), to_numpy(exact), atol=6 / np.sqrt(20000))


@pytest.mark.parametrize(
    "config", [None, ADJOINT_VJP, PARAMETER_SHIFT], ids=lambda c: getattr(c, "name", "forward")
)
def test_split_non_commuting_large_hermitians(config):
    """observable_hash_split_non_commuting.py: split_non_commuting makes one tape per
    Hermitian, with the same gates; each gets its own value (and derivative)."""
    n = large_observables("hermitian")[0]
    kwargs = {"diff_method": None} if config is None else config.qnode_kwargs()
    ours = qml.transforms.split_non_commuting(
        qml.QNode(two_large_hermitians, custatevec_device(n), interface="torch", **kwargs)
    )
    ref = qml.transforms.split_non_commuting(
        qml.QNode(two_large_hermitians, reference_device(n), interface="torch")
    )
    x = torch.tensor(0.3, dtype=torch.float64, requires_grad=config is not None)
    assert_same_result(ours(x), ref(x))
    if config is not None:
        iface = interface("torch")
        assert_same_derivatives(iface.jacobian(ours, [x]), iface.jacobian(ref, [x]))
