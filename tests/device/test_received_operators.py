"""Regressions of issue 14 about the operators the device builds and receives: threads
recording while the device runs (items 5), subclasses of native templates and gates
(item 7), tuples of trainable scalars as a template's parameter (item 8), and PennyLane's
cache on gathered rotations (item 13). Each is compared with default.qubit."""

from __future__ import annotations

import threading

import numpy as np
import pennylane as qml
import pytest
import torch
from conftest import DEVICE, assert_allclose_nested
from pennylane import numpy as pnp
from pennylane.devices import ExecutionConfig
from pennylane.queuing import AnnotatedQueue, QueuingManager
from pennylane.tape import QuantumScript
from reference import SignallingLock, parameter_shift_hessian

from pennylane_custatevec.rotations import PauliRotations, gate_of
from pennylane_custatevec.templates import is_native_template

TOL = 1e-10
WAIT_S = 30
"""How long a thread of a threading test waits for the other before the test fails (an
upper bound only: when the device behaves, nothing waits for it)."""


def _cpu_device(wires=None, **kwargs):
    return qml.device(DEVICE, wires=wires, backend="cpu", **kwargs)


# ---------------------------------------------------------------------------------------
# item 5: threads


def _device_jobs() -> list:
    """(execution config, tapes) pairs whose preprocessing and execution build operators
    (gathered rotations, decompositions, a native template's gates, generators, broadcast
    expansion, a late state preparation, diagonalizing gates of sampled observables)."""
    hermitian = np.array([[1.0, 0.5 - 0.2j], [0.5 + 0.2j, -0.3]])
    gates = [
        qml.RX(0.3, 0),
        qml.RY(-0.7, 1),
        qml.RZ(0.4, 2),
        qml.IsingXX(0.2, [0, 1]),
        qml.Rot(0.1, 0.2, 0.3, 2),
        qml.CRX(0.8, [2, 0]),
        qml.PhaseShift(0.6, 1),
        qml.QFT([0, 1, 2]),
        qml.StronglyEntanglingLayers(np.full((1, 3, 3), 0.25), wires=[0, 1, 2]),
        qml.BasicEntanglerLayers(np.full((1, 3), -0.35), wires=[0, 1, 2]),
        qml.StatePrep(np.array([0.6, 0.8]), wires=2),
        qml.RY(0.9, 2),
        qml.RX(-0.2, 0),
    ]
    analytic = [
        QuantumScript(gates, [qml.expval(qml.Z(0) @ qml.X(2)), qml.probs(wires=[1])]),
        QuantumScript(
            [qml.RX(np.array([0.1, 0.5]), 0), qml.RY(0.3, 1), qml.CNOT([0, 1])],
            [qml.expval(qml.Z(1))],
        ),
    ]
    sampled = QuantumScript(
        gates[:7],
        [qml.expval(qml.X(0)), qml.expval(qml.Z(0)), qml.expval(qml.Hermitian(hermitian, 1))],
        shots=4000,
    )
    trainable = [
        qml.RX(pnp.array(0.3), 0),
        qml.RY(pnp.array(-0.7), 1),
        qml.Rot(pnp.array(0.1), pnp.array(0.2), pnp.array(0.3), 2),
        qml.CRX(pnp.array(0.8), [2, 0]),
        qml.StronglyEntanglingLayers(pnp.full((1, 3, 3), 0.25), wires=[0, 1, 2]),
        qml.PhaseShift(pnp.array(0.6), 1),
        qml.RZ(pnp.array(0.4), 1),
    ]
    differentiated = QuantumScript(trainable, [qml.expval(qml.Z(0) @ qml.X(2))])
    return [
        (ExecutionConfig(), analytic),
        (ExecutionConfig(gradient_method="adjoint"), [differentiated]),
        (ExecutionConfig(), [sampled]),
    ]


def _run_device_jobs(dev, jobs) -> list:
    """What the device returns for each job: results, and for adjoint its Jacobians."""
    outputs = []
    for config, tapes in jobs:
        config = dev.setup_execution_config(config, tapes[0])
        batch, postprocess = dev.preprocess_transforms(config)(tapes)
        results = dev.execute(batch, config)
        outputs.append(postprocess(results))
        if config.gradient_method == "adjoint":
            outputs.append(dev.compute_derivatives(batch, config))
    return outputs


def _recording_qfunc(x, recording: threading.Event, go_on, queued: list):
    """A quantum function that, once half recorded, waits for ``go_on`` (the other
    thread's doing) and then records the rest; ``queued`` gets what its queue holds."""
    qml.RX(x[0], 0)
    qml.RY(x[1], 1)
    recording.set()
    queued.append(go_on())
    qml.CNOT([0, 1])
    qml.RZ(x[2], 1)
    queued.extend(QueuingManager.active_context().queue)
    return qml.expval(qml.Z(0) @ qml.Y(1))


def _expected_queue(x) -> list:
    return [
        ("RX", (0,), (x[0],)),
        ("RY", (1,), (x[1],)),
        ("CNOT", (0, 1), ()),
        ("RZ", (1,), (x[2],)),
    ]


def _described(ops) -> list:
    return [(op.name, tuple(op.wires), tuple(float(d) for d in op.data)) for op in ops]


def _record_in_thread(dev, go_on, other):
    """Thread A runs a QNode on ``dev`` whose recording waits for ``go_on``; thread B
    runs ``other`` once A is recording. Returns (A's result, A's queue, go_on's answer,
    B's result)."""
    x = np.array([0.4, -1.1, 0.7])
    recording = threading.Event()
    queued: list = []
    outcome: dict = {}

    def record():
        qnode = qml.QNode(lambda x: _recording_qfunc(x, recording, go_on, queued), dev)
        outcome["a"] = qnode(x)

    def run_other():
        recording.wait(WAIT_S)
        outcome["b"] = other()

    # daemons: a thread left waiting by a failure does not keep the test process alive
    threads = [
        threading.Thread(target=record, daemon=True),
        threading.Thread(target=run_other, daemon=True),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(2 * WAIT_S)
    assert not any(thread.is_alive() for thread in threads), "a thread did not finish"
    reference = qml.QNode(
        lambda x: _recording_qfunc(x, threading.Event(), lambda: True, []),
        qml.device("default.qubit", wires=2),
    )(x)
    np.testing.assert_allclose(outcome["a"], reference, atol=TOL, rtol=0)
    assert _described(queued[1:]) == _expected_queue(x)
    return queued[0], outcome["b"]


def test_threads_preprocessing_queues_operators(monkeypatch):
    """Thread B runs the device (preprocessing, execution, adjoint Jacobians of circuits
    that build operators) while thread A records a QNode: B waits for A's recording to
    end, and A's tape and result, and B's results, are those of one thread alone."""
    jobs = _device_jobs()  # built here: thread B builds only what the device builds
    dev = _cpu_device(seed=7)
    alone = _run_device_jobs(_cpu_device(seed=7), jobs)
    lock = SignallingLock()
    monkeypatch.setattr(AnnotatedQueue, "_lock", lock)
    waited, outputs = _record_in_thread(
        _cpu_device(wires=2),
        lambda: lock.asked.wait(WAIT_S),
        lambda: _run_device_jobs(dev, jobs),
    )
    assert waited, "the device built operators while another thread was recording"
    assert_allclose_nested(outputs, alone, atol=0)


def test_threads_preprocessing_queues_operators_reference():
    """The results of the threading test's jobs, run alone, are default.qubit's (exactly
    analytic, within sampling error with shots); their Jacobians are checked elsewhere."""
    jobs = _device_jobs()
    ours = _run_device_jobs(_cpu_device(seed=7), jobs)
    reference = qml.device("default.qubit", seed=7)
    expected = [qml.execute(tapes, reference) for _, tapes in jobs]
    assert_allclose_nested(ours[0], expected[0], atol=TOL)
    assert_allclose_nested(ours[1], expected[1], atol=TOL)
    assert_allclose_nested(ours[3], expected[2], atol=0.05)


def test_threads_parameter_conversion_queues_no_rotations():
    """PennyLane's ML interfaces rebind the device's gathered rotations (converting their
    parameters) outside the device's preprocessing: done in thread B while thread A
    records, the rebuilt ``PauliRotations`` are queued nowhere."""
    gates = (gate_of(qml.RX(0.0, 0)), gate_of(qml.RY(0.0, 1)))
    with QueuingManager.stop_recording():
        tape = QuantumScript(
            [PauliRotations(torch.tensor(0.1), torch.tensor(0.2), gates=gates)],
            [qml.expval(qml.Z(0))],
        )
    converted = threading.Event()

    def convert():
        (numpy_tape,), _ = qml.transforms.convert_to_numpy_parameters(tape)
        converted.set()
        return numpy_tape

    converted_first, numpy_tape = _record_in_thread(
        _cpu_device(wires=2), lambda: converted.wait(WAIT_S), convert
    )
    assert converted_first
    assert isinstance(numpy_tape.operations[0], PauliRotations)


def test_device_builds_nothing_into_a_recording():
    """The device's preprocessing and execution, called while this thread records, put
    nothing into the recording (every operator it builds is built without queuing)."""
    jobs = _device_jobs()
    with AnnotatedQueue() as queue:
        _run_device_jobs(_cpu_device(seed=3), jobs)
    assert queue.queue == []


def test_gathered_rotations_queue_in_their_own_thread():
    """A ``PauliRotations`` built while this thread records is queued, as any operator."""
    gates = (gate_of(qml.RX(0.0, 0)), gate_of(qml.RY(0.0, 1)))
    with AnnotatedQueue() as queue:
        op = PauliRotations(0.1, 0.2, gates=gates)
    assert queue.queue == [op]


# ---------------------------------------------------------------------------------------
# item 7: subclasses


class _ParentDecomposition(qml.StronglyEntanglingLayers):
    """The reproducer's subclass: its decomposition is the parent template."""

    def decomposition(self):
        return [qml.StronglyEntanglingLayers(*self.parameters, self.wires)]


class _StronglyEntangling(qml.StronglyEntanglingLayers):
    pass


class _BasicEntangler(qml.BasicEntanglerLayers):
    pass


class _AngleEmbedding(qml.AngleEmbedding):
    pass


class _AngleEmbeddingY(qml.AngleEmbedding):
    """Overrides the decomposition: RY rotations (the parent's would be RX)."""

    def decomposition(self):
        return [qml.RY(self.data[0][i], w) for i, w in enumerate(self.wires)]


_TEMPLATE_SUBCLASSES = {
    "parent_decomposition": (lambda w: _ParentDecomposition(w.reshape(2, 2, 3), [0, 1]), 12),
    "strongly_entangling": (lambda w: _StronglyEntangling(w.reshape(1, 2, 3), [0, 1]), 6),
    "basic_entangler": (lambda w: _BasicEntangler(w.reshape(2, 2), [0, 1]), 4),
    "angle_embedding": (lambda w: _AngleEmbedding(w, [0, 1]), 2),
    "angle_embedding_own_decomposition": (lambda w: _AngleEmbeddingY(w, [0, 1]), 2),
}

_DIFF_METHODS = {
    "adjoint": {"diff_method": "adjoint"},
    "adjoint_device_vjp": {"diff_method": "adjoint", "device_vjp": True},
    "parameter_shift": {"diff_method": "parameter-shift"},
    "best": {"diff_method": "best"},
}


def _assert_as_on_default_qubit(run, method: str) -> None:
    """``run(dev, qnode_kwargs)`` on a 2-wire CPU-backend device with the QNode arguments
    of ``method`` gives default.qubit's result (default.qubit takes no ``device_vjp``)."""
    kwargs = _DIFF_METHODS[method]
    reference_kwargs = {k: v for k, v in kwargs.items() if k != "device_vjp"}
    ours = run(_cpu_device(wires=2), kwargs)
    expected = run(qml.device("default.qubit", wires=2), reference_kwargs)
    assert_allclose_nested(ours, expected, atol=TOL)


def _value_and_gradient(dev, body, weights, qnode_kwargs):
    @qml.qnode(dev, **qnode_kwargs)
    def circuit(w):
        qml.Hadamard(1)
        body(w)
        qml.CNOT([0, 1])
        return qml.expval(qml.Z(0) @ qml.X(1) + 0.3 * qml.Y(0))

    return circuit(weights), qml.grad(circuit)(weights)


@pytest.mark.parametrize("method", sorted(_DIFF_METHODS))
@pytest.mark.parametrize("subclass", sorted(_TEMPLATE_SUBCLASSES))
def test_template_subclass(subclass, method, rng):
    """A user's subclass of a native template is decomposed, as on other devices (it may
    define other gates): value and gradient equal default.qubit's."""
    body, size = _TEMPLATE_SUBCLASSES[subclass]
    weights = pnp.array(rng.uniform(-1, 1, size), requires_grad=True)
    _assert_as_on_default_qubit(
        lambda dev, kwargs: _value_and_gradient(dev, body, weights, kwargs), method
    )


@pytest.mark.parametrize("subclass", sorted(_TEMPLATE_SUBCLASSES))
def test_template_subclass_is_not_native(subclass, rng):
    """Only the exact native template classes compile natively; after preprocessing no
    subclass is left in the tape."""
    body, size = _TEMPLATE_SUBCLASSES[subclass]
    with QueuingManager.stop_recording():
        op = body(rng.uniform(-1, 1, size))
    assert not is_native_template(op)
    dev = _cpu_device(wires=2)
    (tape,), _ = dev.preprocess_transforms()((QuantumScript([op], [qml.expval(qml.Z(0))]),))
    assert not any(isinstance(o, type(op)) for o in tape.operations)


class _PlainRX(qml.RX):
    pass


class _RXOwnDecomposition(qml.RX):
    def decomposition(self):
        return [qml.RY(self.data[0], self.wires)]


class _RXOwnMatrix(qml.RX):
    """An RX whose matrix is RX(2 theta): default.qubit applies an RX subclass as RX
    (its kernels dispatch on the class) except by backpropagation."""

    @staticmethod
    def compute_matrix(theta):
        return qml.RX.compute_matrix(2 * theta)


@pytest.mark.parametrize("method", ["adjoint", "adjoint_device_vjp", "parameter_shift"])
@pytest.mark.parametrize("gate", [_PlainRX, _RXOwnDecomposition, _RXOwnMatrix])
def test_gate_subclass_runs_as_its_gate(gate, method, rng):
    """A user's subclass of a native gate runs as that gate, as on default.qubit (whose
    kernels dispatch on the class), instead of being refused as an unknown operation."""
    weights = pnp.array(rng.uniform(-1, 1, 2), requires_grad=True)

    def body(w):
        gate(w[0], wires=0)
        qml.RY(w[1], wires=1)

    _assert_as_on_default_qubit(
        lambda dev, kwargs: _value_and_gradient(dev, body, weights, kwargs), method
    )


# ---------------------------------------------------------------------------------------
# item 8: a tuple of trainable scalars


@pytest.mark.parametrize("method", sorted(_DIFF_METHODS))
@pytest.mark.parametrize("container", [tuple, list])
def test_angle_tuple(container, method):
    """``qml.AngleEmbedding((a, b), ...)`` with trainable autograd scalars: numpy makes
    an array of autograd values, which PennyLane does not take for autograd's; results
    and gradients equal default.qubit's."""

    def run(dev, kwargs):
        @qml.qnode(dev, **kwargs)
        def circuit(a, b):
            qml.AngleEmbedding(container((a, b)), wires=[0, 1])
            qml.StronglyEntanglingLayers(container([[[a, b, a], [b, 0.3, a]]]), wires=[0, 1])
            return qml.expval(qml.Z(0) @ qml.Z(1))

        a = pnp.array(0.3, requires_grad=True)
        b = pnp.array(0.7, requires_grad=True)
        return circuit(a, b), qml.grad(circuit)(a, b)

    _assert_as_on_default_qubit(run, method)


def test_angle_tuple_torch_refused_as_on_default_qubit():
    """Trainable torch scalars in a tuple: PennyLane's operator refuses them on every
    device (numpy cannot convert a tensor that requires grad), before the device runs."""
    messages = []
    for dev in (_cpu_device(wires=2), qml.device("default.qubit", wires=2)):

        @qml.qnode(dev, interface="torch", diff_method="parameter-shift")
        def circuit(a, b):
            qml.AngleEmbedding((a, b), wires=[0, 1])
            return qml.expval(qml.Z(0))

        with pytest.raises(RuntimeError) as error:
            circuit(torch.tensor(0.3, requires_grad=True), torch.tensor(0.7, requires_grad=True))
        messages.append(str(error.value))
    assert messages[0] == messages[1]


def test_angle_tuple_one_shot_refused():
    """With one-shot mid-circuit measurements the device cannot run such a circuit
    through PennyLane's autograd interface again (its tapes are already expanded per
    shot): a clear error naming the way out (default.qubit fails with numpy's message)."""
    dev = _cpu_device(wires=2, seed=1)

    @qml.set_shots(50)
    @qml.qnode(dev, diff_method="parameter-shift", mcm_method="one-shot")
    def circuit(a, b):
        qml.AngleEmbedding((a, b), wires=[0, 1])
        qml.cond(qml.measure(0), qml.RX)(0.4, 1)
        return qml.expval(qml.Z(1))

    a = pnp.array(0.3, requires_grad=True)
    b = pnp.array(0.7, requires_grad=True)
    with pytest.raises(qml.exceptions.DeviceError, match="qml.numpy.stack"):
        qml.grad(circuit)(a, b)


# ---------------------------------------------------------------------------------------
# item 13: PennyLane's cache


def test_cache_hash():
    """A parameter-shift Hessian through PennyLane's cache: the shifted tapes whose angles
    differ by rounding hit the cache as on default.qubit (the same number of executions)
    and the Hessian is default.qubit's."""
    hessian, executions = parameter_shift_hessian(_cpu_device(), [0.1, 0.2])
    expected_hessian, expected_executions = parameter_shift_hessian(
        qml.device("default.qubit"), [0.1, 0.2]
    )
    assert executions == expected_executions
    np.testing.assert_allclose(hessian, expected_hessian, atol=TOL, rtol=0)


@pytest.mark.parametrize(
    "gates, angles, other",
    [
        ((qml.RX(0.0, 0), qml.RY(0.0, 1)), (0.1, 0.2), (0.1 + np.pi / 2 - np.pi / 2, 0.2)),
        ((qml.RZ(0.0, 0), qml.RX(0.0, 0)), (0.3, -0.4), (0.3 + 2 * np.pi, -0.4)),
        (
            (qml.IsingXX(0.0, [0, 1]), qml.RX(0.0, 0)),
            (0.1, 0.2),
            (0.1 + np.pi / 2 - np.pi / 2, 0.2),
        ),
        ((qml.RX(0.0, 0), qml.RY(0.0, 1)), (0.1, 0.2), (0.1, 0.2 + 1e-6)),
    ],
)
def test_gathered_rotations_hash_as_their_gates(gates, angles, other):
    """Two runs hash alike exactly when their gates do (PennyLane rounds RX, RY and RZ
    angles modulo 2 pi, and not IsingXX's)."""
    structure = tuple(gate_of(g) for g in gates)

    def gate_hashes(values):
        return [type(g)(v, wires=g.wires).hash for g, v in zip(gates, values, strict=True)]

    same_gates = gate_hashes(angles) == gate_hashes(other)
    same_run = (
        PauliRotations(*angles, gates=structure).hash
        == PauliRotations(*other, gates=structure).hash
    )
    assert same_run == same_gates


def test_broadcast_exp_of_a_trainable_coefficient():
    """qml.exp with a broadcast trainable coefficient (PennyLane's own test_exp_batching):
    PennyLane 0.45's Exp cannot say whether it has a decomposition or a generator for a
    broadcast coefficient (ValueError), nor give its parameters' dimensions to the
    expansion (AttributeError); the device ran into both, it now runs the batch."""
    x = qml.numpy.array([1.234, 2.34, 3.456], requires_grad=True)
    results = []
    for name in ("custatevec.qubit", "default.qubit"):

        @qml.qnode(qml.device(name, wires=1))
        def circuit(x):
            qml.exp(qml.PauliX(0), 0.5j * x)
            return qml.expval(qml.PauliY(0))

        results.append(circuit(x))
    np.testing.assert_allclose(results[0], np.sin(x), atol=1e-12, rtol=0)
    np.testing.assert_allclose(results[0], results[1], atol=1e-12, rtol=0)
