"""Keys that decide batching and caching hold everything the result depends on, exactly.

Three silent wrong results of issue 14, each with the regression tests named after its
reproducer (../shared/repro/):

- tapes whose different gates compile to the same kernels swept as one deferred batch and
  differentiated with the first tape's generators (``deferred_lookalike_gates_*``);
- tapes batched by ``MeasurementProcess.hash``, which is equal for different large
  observables (``observable_hash_*``);
- the kept final state handed to a tape with the same gates but other measured wires
  (``final_state_cache_ignores_measurements``).

Every value is compared with default.qubit's.
"""

from __future__ import annotations

import functools
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pennylane as qml
import pytest
import scipy.sparse
import torch
from conftest import DEVICE, stable_seed
from pennylane import numpy as pnp
from pennylane.devices import ExecutionConfig
from pennylane.measurements import MeasurementProcess
from pennylane.operation import Operation, Operator
from reference import random_unitary
from spies import swept_batches

import pennylane_custatevec
import pennylane_custatevec.execution
import pennylane_custatevec.gradients.deferred
import pennylane_custatevec.gradients.fused_sweep
import pennylane_custatevec.preprocess.sampled
from pennylane_custatevec import exact
from pennylane_custatevec.gradients.differentiated import DifferentiatedTape

ATOL = 1e-10
W = ["a", 3, "q1", 0]
GATE_WIRES = {1: ["q1"], 2: ["q1", "a"], 4: [0, "q1", "a", 3]}
CAPABILITIES = Path(pennylane_custatevec.__file__).parent / "capabilities.toml"


@pytest.fixture(params=["cpu", "custatevec"], ids=["cpu", "gpu_double"])
def backend(request):
    """The CPU backend, and the cuStateVec backend on its NumPy double."""
    if request.param == "custatevec":
        request.getfixturevalue("gpu_double")
    return request.param


def adjoint_config(dev):
    return dev.setup_execution_config(ExecutionConfig(gradient_method="adjoint"))


def preprocessed(dev, config, tapes):
    processed, _ = dev.preprocess_transforms(config)(tapes)
    assert len(processed) == len(tapes)
    return processed


# ---------------------------------------------------------------------------------------
# 1. Deferred batching of look-alike gates


def _fixed_width_gates() -> dict[int, list]:
    """{wires: [(label, build(x, wires))]} of the gates in capabilities.toml with one
    parameter, a generator and a fixed number of wires."""
    names = tomllib.loads(CAPABILITIES.read_text())["operators"]["gates"]
    gates: dict[int, list] = {1: [], 2: [], 4: []}
    variable = set()
    for name in names:
        cls = getattr(qml, name)
        if not isinstance(cls.num_wires, int):
            if cls in (qml.GlobalPhase, qml.PauliRot, qml.MultiRZ, qml.PCPhase):
                variable.add(name)
            continue
        if cls.num_params != 1:
            continue
        op = cls(0.3, wires=range(cls.num_wires))
        if op.has_generator:
            gates[cls.num_wires].append((name, lambda x, wires, cls=cls: cls(x, wires=wires)))
    # the gates of any width get their variants below: a new one must be added there
    assert variable == {"GlobalPhase", "PauliRot", "MultiRZ", "PCPhase"}
    return gates


def _variants() -> dict[int, list]:
    """Gates of any width, other hyperparameters of one type, and controlled and adjoint
    forms: the look-alikes that share kernels with other gates."""
    return {
        1: [
            ("GlobalPhase", lambda x, w: qml.GlobalPhase(x, wires=w)),
            ("PauliRot-X", lambda x, w: qml.PauliRot(x, "X", wires=w)),
            ("PauliRot-Y", lambda x, w: qml.PauliRot(x, "Y", wires=w)),
            ("PauliRot-Z", lambda x, w: qml.PauliRot(x, "Z", wires=w)),
            ("MultiRZ", lambda x, w: qml.MultiRZ(x, wires=w)),
            ("PCPhase-1", lambda x, w: qml.PCPhase(x, dim=1, wires=w)),
            ("ctrl-GlobalPhase", lambda x, w: qml.ctrl(qml.GlobalPhase(x), control=w[0])),
            ("adjoint-RX", lambda x, w: qml.adjoint(qml.RX(x, wires=w))),
            ("adjoint-PhaseShift", lambda x, w: qml.adjoint(qml.PhaseShift(x, wires=w))),
        ],
        2: [
            ("PauliRot-XY", lambda x, w: qml.PauliRot(x, "XY", wires=w)),
            ("PauliRot-YX", lambda x, w: qml.PauliRot(x, "YX", wires=w)),
            ("PauliRot-ZZ", lambda x, w: qml.PauliRot(x, "ZZ", wires=w)),
            ("PauliRot-XI", lambda x, w: qml.PauliRot(x, "XI", wires=w)),
            ("MultiRZ", lambda x, w: qml.MultiRZ(x, wires=w)),
            ("PCPhase-1", lambda x, w: qml.PCPhase(x, dim=1, wires=w)),
            ("PCPhase-2", lambda x, w: qml.PCPhase(x, dim=2, wires=w)),
            ("PCPhase-3", lambda x, w: qml.PCPhase(x, dim=3, wires=w)),
            ("ctrl-RY", lambda x, w: qml.ctrl(qml.RY(x, wires=w[1]), control=w[0])),
            (
                "ctrl-RY-value0",
                lambda x, w: qml.ctrl(qml.RY(x, wires=w[1]), control=w[0], control_values=0),
            ),
            ("ctrl-PhaseShift", lambda x, w: qml.ctrl(qml.PhaseShift(x, wires=w[1]), w[0])),
            ("ctrl-GlobalPhase", lambda x, w: qml.ctrl(qml.GlobalPhase(x), control=w)),
            ("adjoint-SingleExcitation", lambda x, w: qml.adjoint(qml.SingleExcitation(x, w))),
            ("adjoint-IsingXY", lambda x, w: qml.adjoint(qml.IsingXY(x, wires=w))),
        ],
        4: [
            ("PauliRot-XYZX", lambda x, w: qml.PauliRot(x, "XYZX", wires=w)),
            ("PauliRot-ZZZZ", lambda x, w: qml.PauliRot(x, "ZZZZ", wires=w)),
            ("MultiRZ", lambda x, w: qml.MultiRZ(x, wires=w)),
            ("PCPhase-5", lambda x, w: qml.PCPhase(x, dim=5, wires=w)),
            ("PCPhase-10", lambda x, w: qml.PCPhase(x, dim=10, wires=w)),
            ("ctrl-IsingXY", lambda x, w: qml.ctrl(qml.IsingXY(x, wires=w[2:]), control=w[:2])),
            ("adjoint-DoubleExcitation", lambda x, w: qml.adjoint(qml.DoubleExcitation(x, w))),
        ],
    }


def _gates() -> dict[int, list]:
    fixed, variants = _fixed_width_gates(), _variants()
    return {width: fixed[width] + variants[width] for width in fixed}


GATES = _gates()
_UNITARIES = [
    random_unitary(16, np.random.default_rng(stable_seed("lookalike", i))) for i in (0, 1)
]


def _angle(index: int) -> float:
    return 0.3 + 0.37 * index


def _gate_tape(width: int, index: int, x) -> qml.tape.QuantumScript:
    """A generic state, the gate ``GATES[width][index]`` with the trainable angle ``x``,
    another generic unitary; an expval and probs: tapes that differ in the gate only."""
    _, build = GATES[width][index]
    ops = [
        qml.QubitUnitary(_UNITARIES[0], wires=W),
        build(x, GATE_WIRES[width]),
        qml.QubitUnitary(_UNITARIES[1], wires=W),
    ]
    measurements = [qml.expval(qml.Z("a") @ qml.X(0)), qml.probs(wires=["q1", 3])]
    return qml.tape.QuantumScript(ops, measurements, trainable_params=[1])


@functools.cache
def _reference(width: int, index: int) -> np.ndarray:
    """default.qubit's Jacobian (backprop) of the gate tape's outputs [expval, probs...]."""
    ref = qml.device("default.qubit", wires=W)

    def outputs(x):
        expval, probs = qml.execute([_gate_tape(width, index, x)], ref, diff_method="backprop")[0]
        return qml.math.hstack([qml.math.reshape(expval, (1,)), probs])

    with warnings.catch_warnings():  # autograd through default.qubit casts complex to real
        warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
        return np.asarray(qml.jacobian(outputs)(pnp.array(_angle(index), requires_grad=True)))


def _flat_jacobian(jacobian) -> np.ndarray:
    expval, probs = jacobian
    return np.hstack([np.reshape(expval, (1,)), probs])


def _cotangents(count: int) -> list:
    rng = np.random.default_rng(stable_seed("lookalike-cotangents"))
    return [(rng.normal(), rng.normal(size=4)) for _ in range(count)]


def _check_products(products, order, kind, cotangents, width, label):
    """Each tape's Jacobian or VJP against default.qubit's; ``order``: the gates' indices."""
    for position, index in enumerate(order):
        name = f"{label}: {GATES[width][index][0]}"
        reference = _reference(width, index)
        if kind == "jacobian":
            np.testing.assert_allclose(
                _flat_jacobian(products[position]), reference, atol=ATOL, err_msg=name
            )
        else:
            dy_expval, dy_probs = cotangents[index]
            expected = dy_expval * reference[0] + dy_probs @ reference[1:]
            (value,) = products[position]
            np.testing.assert_allclose(value, expected, atol=ATOL, err_msg=name)


@pytest.mark.parametrize("width", sorted(GATES))
@pytest.mark.parametrize("kind", ["jacobian", "vjp"])
@pytest.mark.parametrize("fusion", ["off", "default", "other"])
def test_lookalike_gate_pairs(width, kind, fusion, backend):
    """Every pair of native one-parameter gates on ``width`` wires (and hyperparameter,
    controlled and adjoint variants), as tapes that differ in the gate only: deferred =
    eager = default.qubit, Jacobian and VJP. All the group's tapes go into one batch (in
    both orders, with kept final states and without): the grouping is over the whole
    batch, so one batch puts every pair of look-alikes together."""
    label = f"{width} wires, {kind}, fusion {fusion}"
    fusion_qubits = {"off": 0, "default": None, "other": 4 if backend == "cpu" else 2}[fusion]
    devices = {
        mode: qml.device(
            DEVICE, wires=W, backend=backend, grad_accumulation=mode, fusion_qubits=fusion_qubits
        )
        for mode in ("deferred", "eager")
    }
    count = len(GATES[width])
    cotangents = _cotangents(count)
    forward = list(range(count))
    backward = forward[::-1]
    for mode, dev in devices.items():
        config = adjoint_config(dev)
        tapes = preprocessed(dev, config, [_gate_tape(width, i, _angle(i)) for i in forward])
        assert all(tape.trainable_params == [1] for tape in tapes)
        if kind == "jacobian":
            _, products = dev.execute_and_compute_derivatives(tapes, config)
            again = dev.compute_derivatives(tapes[::-1], config)
        else:
            _, products = dev.execute_and_compute_vjp(tapes, cotangents, config)
            again = dev.compute_vjp(tapes[::-1], cotangents[::-1], config)
        _check_products(products, forward, kind, cotangents, width, f"{label}, {mode}")
        _check_products(again, backward, kind, cotangents, width, f"{label}, {mode}, reversed")


def test_lookalike_gate_groups_are_not_vacuous():
    """The groups hold the look-alikes of the issue: gates with the same kernels."""
    names = {width: {name for name, _ in gates} for width, gates in GATES.items()}
    assert {"IsingXY", "SingleExcitation", "adjoint-IsingXY", "FermionicSWAP"} <= names[2]
    assert {"PhaseShift", "ctrl-GlobalPhase", "RX", "adjoint-RX", "U1"} <= names[1]
    assert {"DoubleExcitation", "OrbitalRotation", "MultiRZ", "PauliRot-ZZZZ"} <= names[4]


def test_deferred_lookalike_gates_execute():
    """IsingXY and SingleExcitation (both one 4x4 matrix) in one torch ``qml.execute``."""
    x = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)

    def tapes():
        prep = [qml.Hadamard(0), qml.RY(0.4, wires=1)]
        measured = [qml.expval(qml.Z(0) @ qml.X(1))]
        return [
            qml.tape.QuantumScript(prep + [qml.IsingXY(x, wires=[0, 1])], measured),
            qml.tape.QuantumScript(prep + [qml.SingleExcitation(x, wires=[0, 1])], measured),
        ]

    def gradients(dev, diff_method):
        results = qml.execute(tapes(), dev, diff_method=diff_method)
        first = torch.autograd.grad(results[0], x, retain_graph=True)[0].item()
        return first, torch.autograd.grad(results[1], x)[0].item()

    expected = gradients(qml.device("default.qubit", wires=2), "backprop")
    assert abs(expected[1]) > 0.4  # -0.4697: the batch bug gave 0.0
    for mode in ("deferred", "eager"):
        dev = qml.device(DEVICE, wires=2, backend="cpu", grad_accumulation=mode)
        np.testing.assert_allclose(gradients(dev, "adjoint"), expected, atol=ATOL, err_msg=mode)


@pytest.mark.parametrize("fusion_qubits", [0, 2])
def test_deferred_lookalike_gates_phase(fusion_qubits, backend):
    """PhaseShift and ctrl(GlobalPhase) (both one diagonal), alone and batched in both
    orders, through the device API."""
    x = 0.3

    def tape(gate):
        ops = [qml.Hadamard(0), gate(pnp.array(x, requires_grad=True))]
        return qml.tape.QuantumScript(ops, [qml.expval(qml.X(0))])

    phase = tape(lambda v: qml.PhaseShift(v, wires=0))
    controlled = tape(lambda v: qml.ctrl(qml.GlobalPhase(v), control=0))
    ref = qml.device("default.qubit", wires=1)
    ref_config = ref.setup_execution_config(ExecutionConfig(gradient_method="adjoint"))
    expected = {}
    for name, t in (("phase", phase), ("controlled", controlled)):
        (processed,), _ = ref.preprocess_transforms(ref_config)([t])
        expected[name] = float(ref.compute_derivatives([processed], ref_config)[0])
    assert np.isclose(expected["controlled"], -np.sin(x))  # the bug gave +sin(x)
    for order in (["controlled"], ["phase", "controlled"], ["controlled", "phase"]):
        dev = qml.device(
            DEVICE,
            wires=1,
            backend=backend,
            grad_accumulation="deferred",
            fusion_qubits=fusion_qubits,
        )
        config = adjoint_config(dev)
        batch = {"phase": phase, "controlled": controlled}
        tapes = preprocessed(dev, config, [batch[name] for name in order])
        _, jacobians = dev.execute_and_compute_derivatives(tapes, config)
        np.testing.assert_allclose(
            [float(j) for j in jacobians], [expected[name] for name in order], atol=ATOL
        )


def test_same_gates_still_sweep_together(mocker):
    """Tapes with the same gates and other angles keep sweeping as one batch."""
    sweeps = mocker.spy(pennylane_custatevec.gradients.deferred, "_sweep_chunk")
    dev = qml.device(DEVICE, wires=W, backend="cpu", grad_accumulation="deferred")
    config = adjoint_config(dev)
    index = [name for name, _ in GATES[2]].index("SingleExcitation")
    tapes = preprocessed(dev, config, [_gate_tape(2, index, v) for v in (0.1, 0.2, 0.3)])
    dev.execute_and_compute_derivatives(tapes, config)
    assert [batch for batch, _ in swept_batches(sweeps)] == [3]


def test_sweep_merge_refuses_lookalike_operations():
    """The merge of a sweep batch refuses operations that the derivative reads differently
    (whatever grouped them), naming the step."""
    prep = [qml.Hadamard(0), qml.RY(0.4, wires=1)]
    measured = [qml.expval(qml.Z(0))]
    tasks = [
        pennylane_custatevec.gradients.deferred._Task(
            i,
            DifferentiatedTape(qml.tape.QuantumScript(prep + [gate], measured), None),
            None,
            [[(1.0,)]],
        )
        for i, gate in enumerate([qml.IsingXY(0.7, [0, 1]), qml.SingleExcitation(0.7, [0, 1])])
    ]
    assert tasks[0].sweep_key.kernels == tasks[1].sweep_key.kernels  # the same kernels
    with pytest.raises(RuntimeError, match=r"internal error.*step 2: IsingXY.*SingleExcitation"):
        pennylane_custatevec.gradients.deferred._merge_for_sweep(tasks)
    compilation = pennylane_custatevec.gradients.deferred._merge_for_sweep([tasks[0], tasks[0]])
    assert compilation.register.batch_size == 2 and len(compilation.steps) == 3


class _WeightedPhase(Operation):
    """exp(i x G) with G = diag(weights[0], weights[1000]): a generator fixed by a large
    array hyperparameter whose str() abbreviates the entries that differ."""

    num_params = 1
    num_wires = 1

    def __init__(self, x, weights, wires):
        self._hyperparameters = {"weights": weights}
        super().__init__(x, wires=wires)

    def generator(self):
        weights = self.hyperparameters["weights"]
        return qml.Hermitian(np.diag([weights[0], weights[1000]]), wires=self.wires)


def test_generator_cache_is_exact():
    """The generator matrices are cached by an exact key, not by str(hyperparameters)."""
    first = np.zeros(2000)
    second = first.copy()
    second[1000] = 1.0
    ops = [_WeightedPhase(0.3, weights, wires=0) for weights in (first, second)]
    assert str(ops[0].hyperparameters) == str(ops[1].hyperparameters)
    assert exact.generator_key(ops[0]) != exact.generator_key(ops[1])
    matrices = [pennylane_custatevec.gradients.fused_sweep._generator_matrix(op) for op in ops]
    np.testing.assert_array_equal(matrices[0], np.zeros((2, 2)))
    np.testing.assert_array_equal(matrices[1], np.diag([0.0, 1.0]))


def test_generator_key_keeps_data_where_the_generator_reads_them():
    """PennyLane's gates: the angle is not in the key; an Evolution: its Hamiltonian's
    coefficients are (its generator)."""
    assert exact.generator_key(qml.CRX(0.1, [0, 1])) == exact.generator_key(qml.CRX(0.2, [0, 1]))
    assert exact.generator_key(qml.RX(0.1, 0)) != exact.generator_key(qml.RY(0.1, 0))
    evolutions = [qml.evolve(qml.Hamiltonian([c], [qml.X(0)]), 0.3) for c in (0.5, 0.7)]
    assert exact.generator_key(evolutions[0]) != exact.generator_key(evolutions[1])


# ---------------------------------------------------------------------------------------
# 2. Batches keyed by exact observables, not MeasurementProcess.hash


def _projector_matrix(n: int, index: int) -> np.ndarray:
    matrix = np.zeros((2**n, 2**n))
    matrix[index, index] = 1.0
    return matrix


def _ry_tapes(n: int, measurements) -> list:
    ops = [qml.RY(0.3 + 0.1 * i, wires=i) for i in range(n)]
    return [qml.tape.QuantumScript(ops, [mp]) for mp in measurements]


def _assert_batch_matches_default_qubit(tapes, n, backend):
    expected = qml.execute(tapes, qml.device("default.qubit", wires=n), diff_method=None)
    dev = qml.device(DEVICE, wires=n, backend=backend)
    results = qml.execute(tapes, dev, diff_method=None)
    assert not np.isclose(expected[0], expected[1])  # else the test could not fail
    np.testing.assert_allclose(np.array(results, float), np.array(expected, float), atol=ATOL)


def test_observable_hash_execute(backend):
    """Two Hermitians on 6 wires that differ beyond numpy's abbreviated repr."""
    n = 6
    measurements = [
        qml.expval(qml.Hermitian(_projector_matrix(n, index), wires=range(n))) for index in (10, 20)
    ]
    assert measurements[0].hash == measurements[1].hash  # PennyLane's hash clashes
    _assert_batch_matches_default_qubit(_ry_tapes(n, measurements), n, backend)


def test_observable_hash_sparse_projector(backend):
    """SparseHamiltonians with over 50 entries, and state-vector Projectors on 10 wires."""
    n = 6
    diagonal = np.arange(2**n, dtype=float) / 2**n
    changed = diagonal.copy()
    changed[30] += 0.5
    sparse = [
        qml.expval(qml.SparseHamiltonian(scipy.sparse.csr_matrix(np.diag(d)), wires=range(n)))
        for d in (diagonal, changed)
    ]
    assert sparse[0].hash == sparse[1].hash
    _assert_batch_matches_default_qubit(_ry_tapes(n, sparse), n, backend)
    n = 10
    vectors = [np.zeros(2**n), np.zeros(2**n)]
    vectors[0][100] = vectors[1][200] = 1.0
    projectors = [qml.expval(qml.Projector(v, wires=range(n))) for v in vectors]
    assert projectors[0].hash == projectors[1].hash
    _assert_batch_matches_default_qubit(_ry_tapes(n, projectors), n, backend)


def test_observable_hash_split_non_commuting():
    """split_non_commuting of <H1>, <H2>: two tapes with the same gates."""
    n = 6
    hermitians = [qml.Hermitian(_projector_matrix(n, index), wires=range(n)) for index in (10, 20)]

    def circuit(x):
        for i in range(n):
            qml.RY(x + 0.1 * i, wires=i)
        return qml.expval(hermitians[0]), qml.expval(hermitians[1])

    results = {}
    for name in ("default.qubit", DEVICE):
        kwargs = {"backend": "cpu"} if name == DEVICE else {}
        dev = qml.device(name, wires=n, **kwargs)
        node = qml.transforms.split_non_commuting(qml.QNode(circuit, dev))
        results[name] = np.array(node(0.3), dtype=float)
    assert not np.isclose(*results["default.qubit"])
    np.testing.assert_allclose(results[DEVICE], results["default.qubit"], atol=ATOL)


def test_observable_hash_shots():
    """With shots: two Hermitians on the same wires whose hashes clash (a valid circuit
    that was refused)."""
    n = 6
    first = _projector_matrix(n, 10)
    second = np.zeros((2**n, 2**n))
    second[20, 21] = second[21, 20] = 1.0
    assert qml.Hermitian(first, wires=range(n)).hash == qml.Hermitian(second, wires=range(n)).hash

    def circuit():
        for i in range(n):
            qml.RY(0.3 + 0.4 * i, wires=i)
        return (
            qml.expval(qml.Hermitian(first, wires=range(n))),
            qml.expval(qml.Hermitian(second, wires=range(n))),
        )

    exact_values = qml.QNode(circuit, qml.device("default.qubit", wires=n))()
    dev = qml.device(DEVICE, wires=n, seed=1, backend="cpu")
    sampled = qml.set_shots(qml.QNode(circuit, dev), 20000)()
    np.testing.assert_allclose(np.array(sampled), np.array(exact_values), atol=0.004)


def test_equal_observables_still_batch(mocker, backend):
    """Equal Hermitians held in different arrays run as one batch."""
    n = 4
    matrix = _projector_matrix(n, 3) + _projector_matrix(n, 5)
    measurements = [qml.expval(qml.Hermitian(matrix.copy(), wires=range(n))) for _ in range(3)]
    batches = mocker.spy(pennylane_custatevec.execution, "_run_analytic_batch")
    dev = qml.device(DEVICE, wires=n, backend=backend)
    results = qml.execute(_ry_tapes(n, measurements), dev, diff_method=None)
    expected = qml.execute(
        _ry_tapes(n, measurements), qml.device("default.qubit", wires=n), diff_method=None
    )
    np.testing.assert_allclose(np.array(results), np.array(expected), atol=ATOL)
    assert batches.call_count == 1


def test_no_pennylane_hash_on_execution(monkeypatch):
    """Batching, sampled bases and eigenbasis rotations never compute PennyLane's hash
    (milliseconds for a 16x16 Hermitian, and it clashes)."""
    n = 4
    rng = np.random.default_rng(stable_seed("no-hash"))
    hermitian = rng.normal(size=(16, 16))
    hermitian = hermitian + hermitian.T
    measurements = [
        qml.expval(qml.Hermitian(hermitian, wires=range(n))),
        qml.expval(qml.Z(0) @ qml.X(1) + 0.5 * qml.Y(2)),
        qml.probs(wires=[0, 2]),
    ]
    analytic = _ry_tapes(n, measurements)
    sampled = [qml.tape.QuantumScript(t.operations, t.measurements, shots=100) for t in analytic]
    dev = qml.device(DEVICE, wires=n, seed=3, backend="cpu")
    processed = {}
    for label, tapes in (("analytic", analytic), ("sampled", sampled)):
        processed[label], _ = dev.preprocess_transforms(dev.setup_execution_config())(tapes)

    def refuse(self):
        raise AssertionError("PennyLane's hash was computed")

    monkeypatch.setattr(Operator, "hash", property(refuse))
    monkeypatch.setattr(MeasurementProcess, "hash", property(refuse))
    for tapes in processed.values():
        dev.execute(tapes)
    sampled_module = pennylane_custatevec.preprocess.sampled
    assert sampled_module._qubit_wise_commuting(sampled[0].measurements, range(n))


def test_exact_value_keys():
    """Keys equal exactly when the values are: arrays by dtype, shape and bytes."""
    big = np.zeros((64, 64))
    other = big.copy()
    other[30, 30] = 1e-12
    assert exact.value_key(big) == exact.value_key(big.copy())
    assert exact.value_key(big) != exact.value_key(other)
    assert exact.value_key(big) != exact.value_key(big.astype(np.complex128))
    assert exact.value_key(big) != exact.value_key(big.reshape(16, 256))
    assert exact.value_key(0.0) != exact.value_key(-0.0)
    assert exact.value_key(1) != exact.value_key(True)
    assert exact.value_key(0.1) == exact.value_key(np.float64(0.1))
    tensor = torch.tensor([0.5, 1.5], dtype=torch.float64, requires_grad=True)
    assert exact.value_key(tensor) == exact.value_key(np.array([0.5, 1.5]))
    sparse = scipy.sparse.csr_matrix(np.diag(np.arange(64.0)))
    changed = sparse.copy()
    changed.data[40] += 1e-9
    assert exact.value_key(sparse) == exact.value_key(sparse.copy())
    assert exact.value_key(sparse) != exact.value_key(changed)


def test_exact_observable_keys():
    """Pauli sums by their words and exact coefficients; other observables by their data."""
    h = qml.Hamiltonian([0.5, 0.25], [qml.Z(0) @ qml.Z(1), qml.X(1)])
    assert exact.observable_key(h) == exact.observable_key(
        0.5 * qml.Z(0) @ qml.Z(1) + 0.25 * qml.X(1)
    )
    assert exact.observable_key(h) != exact.observable_key(
        qml.Hamiltonian([0.5, 0.25 + 1e-15], [qml.Z(0) @ qml.Z(1), qml.X(1)])
    )
    assert exact.observable_key(qml.Z(0)) != exact.observable_key(qml.Z(1))
    matrix = _projector_matrix(5, 7)
    other = _projector_matrix(5, 9)
    assert exact.observable_key(qml.Hermitian(matrix, range(5))) == exact.observable_key(
        qml.Hermitian(matrix.copy(), range(5))
    )
    assert exact.observable_key(qml.Hermitian(matrix, range(5))) != exact.observable_key(
        qml.Hermitian(other, range(5))
    )
    assert exact.measurement_key(qml.vn_entropy([0], log_base=2)) != exact.measurement_key(
        qml.vn_entropy([0])
    )


# ---------------------------------------------------------------------------------------
# 4. The kept final state belongs to the tape it was kept for


def _gates_of(x):
    qml.RX(x[0], 0)
    qml.CNOT([0, 1])
    qml.RY(x[1], 1)


_WEIGHTS = torch.arange(32, dtype=torch.float64)
FIRST_MEASUREMENTS = {
    "state": (lambda: qml.state(), lambda out: (out.abs() ** 2 * _WEIGHTS).sum()),
    "probs": (lambda: qml.probs(wires=[0, 4]), lambda out: (out * _WEIGHTS[:4]).sum()),
    "expval": (lambda: qml.expval(qml.Z(0) @ qml.Z(4)), lambda out: out),
}


@pytest.mark.parametrize("mode", ["deferred", "eager"])
@pytest.mark.parametrize("first", sorted(FIRST_MEASUREMENTS))
def test_final_state_cache_ignores_measurements(mode, first):
    """Two torch QNodes with the same gates and parameters, other measured wires, both run
    forward before the first one's backward."""
    measure, loss = FIRST_MEASUREMENTS[first]

    def first_circuit(x):
        _gates_of(x)
        return measure()

    def second_circuit(x):
        _gates_of(x)
        return qml.expval(qml.Z(1))

    def node(circuit, dev, diff_method, **kwargs):
        return qml.QNode(circuit, dev, interface="torch", diff_method=diff_method, **kwargs)

    x = np.array([0.4, 0.9])
    ref = qml.device("default.qubit", wires=5)
    expected = []
    for circuit in (first_circuit, second_circuit):
        xr = torch.tensor(x, requires_grad=True)
        out = node(circuit, ref, "backprop")(xr)
        (loss(out) if circuit is first_circuit else out).backward()
        expected.append(xr.grad.numpy())
    assert np.abs(expected[0]).max() > 0.1
    dev = qml.device(DEVICE, wires=5, backend="cpu", grad_accumulation=mode)
    first_node = node(first_circuit, dev, "adjoint", device_vjp=True)
    second_node = node(second_circuit, dev, "adjoint", device_vjp=True)
    xa, xb = torch.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out = first_node(xa)
    other = second_node(xb)
    loss(out).backward()
    other.backward()
    np.testing.assert_allclose(xa.grad.numpy(), expected[0], atol=ATOL)
    np.testing.assert_allclose(xb.grad.numpy(), expected[1], atol=ATOL)


@pytest.mark.parametrize("mode", ["deferred", "eager"])
def test_final_state_cache_keys_by_register(mode, backend, mocker):
    """Device level: two tapes with the same gates and parameters on other registers,
    executed together, differentiated in the other order: each gets its own kept state
    (none is simulated again), and the VJPs equal default.qubit's."""
    x = np.array([0.4, 0.9])
    ops = [qml.RX(x[0], 0), qml.CNOT([0, 1]), qml.RY(x[1], 1)]
    tapes = [
        qml.tape.QuantumScript(ops, [qml.probs(wires=[0, 4])]),
        qml.tape.QuantumScript(ops, [qml.expval(qml.Z(1))]),
    ]
    cotangents = [np.array([0.5, -1.0, 2.0, 0.25]), 1.5]
    ref = qml.device("default.qubit", wires=5)
    expected = []
    for tape, dy in zip(tapes, cotangents, strict=True):

        def output(params, tape=tape):
            bound = tape.bind_new_parameters(params, [0, 1])
            return qml.execute([bound], ref, diff_method="backprop")[0]

        jacobian = qml.jacobian(output)(pnp.array(x, requires_grad=True))
        expected.append(np.tensordot(dy, jacobian, axes=np.ndim(dy)))
    dev = qml.device(DEVICE, wires=5, backend=backend, grad_accumulation=mode)
    config = adjoint_config(dev)
    tapes = preprocessed(dev, config, tapes)
    simulated = mocker.spy(DifferentiatedTape, "final_state")
    dev.execute(tapes, config)
    vjps = dev.compute_vjp(tapes[::-1], cotangents[::-1], config)
    for vjp, reference in zip(vjps, expected[::-1], strict=True):
        np.testing.assert_allclose(np.array(vjp), reference, atol=ATOL)
    assert simulated.call_count == 0
    # a second VJP finds no kept state (each is handed out once) and simulates again
    again = dev.compute_vjp(tapes, cotangents, config)
    for vjp, reference in zip(again, expected, strict=True):
        np.testing.assert_allclose(np.array(vjp), reference, atol=ATOL)
