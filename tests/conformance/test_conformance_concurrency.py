"""QNodes whose passes interleave, on custatevec.qubit against default.qubit: two QNodes
with the same gates and different measurements (or one QNode called twice) run forward
before either backward pass; two threads executing torch QNodes on one device or on two;
a thread recording a circuit while another executes on the device.

The thread tests are deterministic: either every circuit is recorded before the threads
start (the threads only execute and differentiate, truly concurrently), or the threads
take turns, sequenced by events. Two threads *recording* at the same moment is outside
what any device can make right: PennyLane's queuing context is process-global, so each
thread's operators can land in the other's tape (default.qubit and lightning.qubit too).
What a device must do is build its own operators without queuing, so that its
execution never adds operators to a circuit another thread is recording.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pennylane as qml
import pytest
import torch
from conformance_support import (
    ADJOINT_CONFIGS,
    ADJOINT_JACOBIAN,
    ADJOINT_VJP,
    ATOL,
    BEST,
    PARAMETER_SHIFT,
    config_mode_params,
    custatevec_device,
    reference_device,
)
from pennylane import numpy as pnp
from pennylane.devices import ExecutionConfig
from reference import SignallingLock

import pennylane_custatevec

N_WIRES = 4  # the gates act on wires 0-2: wire 3 is only measured
TIMEOUT = 60  # seconds; a thread that waits longer has deadlocked (the test fails)


def _t(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def gates(x):
    qml.RX(x[0], wires=0)
    qml.CNOT(wires=[0, 1])
    qml.RY(x[1], wires=1)
    qml.IsingXX(x[0] * x[1], wires=[1, 2])
    qml.Rot(x[1], 0.3, x[0], wires=2)


MEASUREMENTS = {
    "state": qml.state,
    "expval": lambda: qml.expval(qml.Z(1) @ qml.X(2)),
    "probs_01": lambda: qml.probs(wires=[0, 1]),
    "probs_2": lambda: qml.probs(wires=[2]),
    "probs_30": lambda: qml.probs(wires=[3, 0]),
    "expval_probs": lambda: (qml.expval(qml.Y(0)), qml.probs(wires=[2, 0])),
}


def measuring(name):
    def circuit(x):
        gates(x)
        return MEASUREMENTS[name]()

    return circuit


def loss(result):
    """A real scalar of any result (a state's probabilities weighted by their index)."""
    parts = result if isinstance(result, tuple) else (result,)
    total = 0
    for part in parts:
        if part.is_complex():
            part = part.abs() ** 2
        total = total + (part.reshape(-1) * torch.arange(1, part.numel() + 1)).sum()
    return total


def reference_gradient(circuit, x):
    ref = qml.QNode(circuit, reference_device(N_WIRES), interface="torch")
    xr = _t(x)
    value = loss(ref(xr))
    value.backward()
    return value.detach().numpy(), xr.grad.numpy()


INTERLEAVED_PAIRS = [
    ("state", "expval"),
    ("expval", "state"),
    ("expval", "probs_01"),
    ("probs_01", "probs_2"),
    ("probs_2", "probs_30"),
    ("expval_probs", "state"),
]
INTERLEAVED_CONFIGS = config_mode_params([*ADJOINT_CONFIGS, BEST])


INTERLEAVED_POINT = np.array([0.4, 0.9])


def interleaved_passes(dev, pair, config) -> list:
    """The QNodes of ``pair`` on ``dev`` (torch, ``config``) both run forward at
    ``INTERLEAVED_POINT``, then each backward in turn: [(name, loss value, gradient)]."""
    qnodes = [
        qml.QNode(measuring(name), dev, interface="torch", **config.qnode_kwargs()) for name in pair
    ]
    xs = [_t(INTERLEAVED_POINT), _t(INTERLEAVED_POINT)]
    values = [loss(q(xi)) for q, xi in zip(qnodes, xs, strict=True)]
    passes = []
    for name, value, xi in zip(pair, values, xs, strict=True):
        value.backward()
        passes.append((name, value.detach().numpy(), xi.grad.numpy()))
    return passes


@pytest.mark.parametrize(("config", "mode"), INTERLEAVED_CONFIGS)
@pytest.mark.parametrize("pair", INTERLEAVED_PAIRS, ids="-".join)
def test_interleaved_qnodes_same_gates(pair, config, mode):
    """final_state_cache_ignores_measurements.py: two QNodes on one device, same gates and
    parameters, different measurements; both forward, then the first's backward, then
    the second's: each gradient is default.qubit's."""
    dev = custatevec_device(N_WIRES, mode)
    for name, value, grad in interleaved_passes(dev, pair, config):
        expected_value, expected_grad = reference_gradient(measuring(name), INTERLEAVED_POINT)
        np.testing.assert_allclose(value, expected_value, atol=ATOL)
        np.testing.assert_allclose(grad, expected_grad, atol=ATOL, err_msg=name)


@pytest.mark.parametrize("config", [ADJOINT_JACOBIAN, ADJOINT_VJP], ids=lambda c: c.name)
@pytest.mark.parametrize("pair", [("state", "expval"), ("probs_2", "probs_30")], ids="-".join)
def test_interleaved_qnodes_on_gpu_backend(pair, config, gpu_double):
    """The same on the cuStateVec backend (its NumPy double), deferred."""
    dev = custatevec_device(N_WIRES, "deferred", backend="custatevec")
    assert dev.backend_name == "custatevec"
    for name, _, grad in interleaved_passes(dev, pair, config):
        expected_grad = reference_gradient(measuring(name), INTERLEAVED_POINT)[1]
        np.testing.assert_allclose(grad, expected_grad, atol=ATOL, err_msg=name)


@pytest.mark.parametrize(("config", "mode"), INTERLEAVED_CONFIGS)
@pytest.mark.parametrize("name", ["state", "expval_probs"])
def test_one_qnode_called_twice_before_backward(name, config, mode):
    """One QNode at two points, both forward before the backward passes (in the reverse
    order): each gradient is default.qubit's at its own point."""
    dev = custatevec_device(N_WIRES, mode)
    qnode = qml.QNode(measuring(name), dev, interface="torch", **config.qnode_kwargs())
    points = [np.array([0.4, 0.9]), np.array([-1.2, 0.25])]
    xs = [_t(p) for p in points]
    values = [loss(qnode(xi)) for xi in xs]
    for point, value, xi in reversed(list(zip(points, values, xs, strict=True))):
        value.backward()
        np.testing.assert_allclose(
            xi.grad.numpy(), reference_gradient(measuring(name), point)[1], atol=ATOL
        )


# ---------------------------------------------------------------------------------------
# threads

THREAD_CONFIGS = [ADJOINT_JACOBIAN, ADJOINT_VJP, PARAMETER_SHIFT]
THREAD_WIRES = 6
STEPS = 4


def thread_tape(x, seed):
    """A 6-qubit circuit of the torch parameters ``x``, recorded in the calling thread.
    Its gates are native with a generator on both devices: no preprocessing decomposes
    (and so records) anything while the threads run. (PennyLane records decompositions
    in its process-global queue: two threads decomposing at once can swap operators, on
    default.qubit too; a Rot here makes default.qubit's adjoint fail this test.)"""
    rng = np.random.default_rng(seed)
    ops = []
    for layer in range(2):
        ops += [qml.RY(x[(w + layer) % 3] * (w + 1) / 3, wires=w) for w in range(THREAD_WIRES)]
        ops += [qml.CNOT([w, w + 1]) for w in range(THREAD_WIRES - 1)]
        ops += [qml.RZ(rng.uniform(-1, 1), wires=w) for w in range(0, THREAD_WIRES, 2)]
        ops += [qml.IsingXX(rng.uniform(-1, 1), wires=[w, w + 1]) for w in (1, 3)]
    return qml.tape.QuantumScript(
        ops, [qml.expval(qml.Z(THREAD_WIRES - 1)), qml.probs(wires=[0, 2])]
    )


def thread_points(seed):
    return [np.random.default_rng((seed, step)).uniform(-2, 2, 3) for step in range(STEPS)]


def execute_and_differentiate(tape_x_pairs, dev, kwargs, barrier=None):
    """(value, gradient) of ``loss`` for each (tape, x) in turn; ``barrier``: wait for the
    other thread before each step, so that the two threads' steps overlap."""
    out = []
    for tape, x in tape_x_pairs:
        if barrier is not None:
            barrier.wait(TIMEOUT)
        value = loss(tuple(qml.execute([tape], dev, **kwargs)[0]))
        (grad,) = torch.autograd.grad(value, x)
        out.append((value.detach().numpy(), grad.numpy()))
    return out


@pytest.mark.parametrize("one_device", [True, False], ids=["one_device", "two_devices"])
@pytest.mark.parametrize(("config", "mode"), config_mode_params(THREAD_CONFIGS))
def test_threads_execute_recorded_tapes(config, mode, one_device):
    """threads_preprocessing_queues_operators.py, without overlapping recordings: every
    tape is recorded before the threads start; two threads then execute and
    differentiate theirs at the same time (each step starts together): every value and
    gradient is default.qubit's."""
    seeds = (1, 2)
    work = {}
    for seed in seeds:
        xs = [_t(p) for p in thread_points(seed)]
        work[seed] = [(thread_tape(x, seed), x) for x in xs]
    expected = {
        seed: execute_and_differentiate(
            [(thread_tape(x, seed), x) for x in (_t(p) for p in thread_points(seed))],
            reference_device(THREAD_WIRES),
            {"diff_method": "backprop"},
        )
        for seed in seeds
    }
    shared = custatevec_device(THREAD_WIRES, mode)
    devices = {
        seed: shared if one_device else custatevec_device(THREAD_WIRES, mode) for seed in seeds
    }
    barrier = threading.Barrier(2)
    with ThreadPoolExecutor(2) as pool:
        futures = {
            seed: pool.submit(
                execute_and_differentiate, work[seed], devices[seed], config.qnode_kwargs(), barrier
            )
            for seed in seeds
        }
        results = {seed: future.result(TIMEOUT) for seed, future in futures.items()}
    for seed in seeds:
        for step, ((value, grad), (ev, eg)) in enumerate(
            zip(results[seed], expected[seed], strict=True)
        ):
            np.testing.assert_allclose(value, ev, atol=ATOL, err_msg=f"thread {seed} {step}")
            np.testing.assert_allclose(grad, eg, atol=ATOL, err_msg=f"thread {seed} {step}")


@pytest.mark.parametrize(("config", "mode"), config_mode_params([ADJOINT_JACOBIAN, ADJOINT_VJP]))
def test_threads_take_turns_on_one_device(config, mode):
    """Two threads with QNodes on one device take turns (sequenced by events): the first
    thread's forward pass, the second's (under an options override local to its thread:
    the other accumulation mode), the first's backward pass, the second's. Each gets
    default.qubit's gradient; the override does not leak into the first thread."""
    dev = custatevec_device(N_WIRES, mode)
    other_mode = "eager" if mode == "deferred" else "deferred"
    turns = [threading.Event() for _ in range(4)]
    names = ("expval_probs", "state")
    points = (np.array([0.4, 0.9]), np.array([-0.7, 1.3]))
    out = {}

    def run(index):
        qnode = qml.QNode(measuring(names[index]), dev, interface="torch", **config.qnode_kwargs())
        x = _t(points[index])
        if index == 0:
            value = loss(qnode(x))
            turns[0].set()
            assert turns[1].wait(TIMEOUT)
            out["mode_in_first"] = dev.options_in_force().grad_accumulation
            value.backward()
            turns[2].set()
        else:
            assert turns[0].wait(TIMEOUT)
            with pennylane_custatevec.options(grad_accumulation=other_mode):
                value = loss(qnode(x))
                turns[1].set()
                assert turns[2].wait(TIMEOUT)
                value.backward()
            turns[3].set()
        out[index] = x.grad.numpy()

    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(run, i) for i in (0, 1)]:
            future.result(TIMEOUT)
    assert out["mode_in_first"] == mode
    for index in (0, 1):
        expected = reference_gradient(measuring(names[index]), points[index])[1]
        np.testing.assert_allclose(out[index], expected, atol=ATOL, err_msg=names[index])


def recorded_while_executing(run_on_device, monkeypatch):
    """Thread A opens a recording; thread B then runs ``run_on_device()``; A records one
    gate and closes its recording once B has finished or waits for the recording to end
    (asks for its lock). Returns (A's recorded operators, B's return value).

    Deterministic: a device that builds operators while the recording is open without
    waiting (the defect) runs to its end first, and so adds them to A's recording; a
    device that waits resumes when A closes it."""
    lock = SignallingLock()
    monkeypatch.setattr(qml.queuing.AnnotatedQueue, "_lock", lock)
    recording, may_close = threading.Event(), lock.asked  # B finishing also sets it

    def record():
        with qml.queuing.AnnotatedQueue() as queue:
            recording.set()
            assert may_close.wait(TIMEOUT)
            qml.Hadamard(0)
        return [type(op).__name__ for op in queue.queue]

    def execute():
        assert recording.wait(TIMEOUT)
        try:
            return run_on_device()
        finally:
            may_close.set()

    with ThreadPoolExecutor(2) as pool:
        recorder, executor = pool.submit(record), pool.submit(execute)
        return recorder.result(TIMEOUT), executor.result(TIMEOUT)


def preprocessed_tape():
    """Gates the device's preprocessing rewrites: a trainable Rot (decomposed for the
    adjoint method), rotations it gathers, a template, a gate it decomposes (QFT)."""
    trainable = [pnp.array(v, requires_grad=True) for v in (0.3, 0.5, 0.7, -0.4)]
    ops = [
        qml.Rot(*trainable[:3], wires=0),
        qml.RX(0.5, wires=1),
        qml.RY(0.7, wires=2),
        qml.CNOT([0, 1]),
        qml.StronglyEntanglingLayers(np.full((1, 3, 3), 0.2), wires=range(3)),
        qml.QFT(wires=range(3)),
        qml.RZ(trainable[3], wires=1),
    ]
    return qml.tape.QuantumScript(ops, [qml.expval(qml.Z(0) @ qml.Z(2)), qml.probs(wires=[1])])


DEVICE_CALLS = ["execute", "execute_and_compute_derivatives", "execute_and_compute_vjp"]


def device_call(call, dev, tape):
    """Preprocessing and one device entry point, as PennyLane's workflow calls them (the
    parameters made numpy after preprocessing)."""

    def run():
        gradient_method = None if call == "execute" else "adjoint"
        config = dev.setup_execution_config(
            ExecutionConfig(
                gradient_method=gradient_method,
                use_device_jacobian_product=call == "execute_and_compute_vjp",
            ),
            tape,
        )
        tapes, postprocess = dev.preprocess_transforms(config)((tape,))
        tapes, _ = qml.transforms.convert_to_numpy_parameters(tapes)
        if call == "execute":
            return postprocess(dev.execute(tapes, config))
        if call == "execute_and_compute_derivatives":
            return dev.execute_and_compute_derivatives(tapes, config)
        cotangents = [(0.5, np.array([1.0, -2.0]))] * len(tapes)
        return dev.execute_and_compute_vjp(tapes, cotangents, config)

    return run


@pytest.mark.parametrize("mode", ["deferred", "eager"])
@pytest.mark.parametrize("call", DEVICE_CALLS)
def test_recording_while_the_device_executes(call, mode, monkeypatch):
    """threads_preprocessing_queues_operators.py: the device's preprocessing and
    execution build their operators without queuing (or wait for the recording to end),
    so a circuit that another thread records meanwhile gets only its own operators; the
    results are those of a run with no recording open."""
    tape = preprocessed_tape()  # recorded before the threads start
    recorded, result = recorded_while_executing(
        device_call(call, custatevec_device(N_WIRES, mode), tape), monkeypatch
    )
    assert recorded == ["Hadamard"]
    expected = device_call(call, custatevec_device(N_WIRES, mode), tape)()
    np.testing.assert_allclose(flat(result), flat(expected), atol=ATOL)
    reference = device_call("execute", reference_device(N_WIRES), tape)()
    forward = result if call == "execute" else result[0]
    np.testing.assert_allclose(flat(forward), flat(reference), atol=ATOL)


def flat(result) -> np.ndarray:
    """Every number of a nested result, in order, as one 1-d array."""
    if isinstance(result, (tuple, list)):
        return np.concatenate([flat(r) for r in result])
    return np.ravel(np.asarray(result))
