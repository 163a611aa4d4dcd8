"""The compiled path against the QNode where it must step aside or share the device: every
fallback (one warning per reason, the QNode's own results), every differentiable gate in
seeded random circuits, two threads at once, and the cuStateVec backend on its double."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pennylane as qml
import pytest
import torch
from adjoint_cases import COMPOSITE, PARAMETRIZED, gate_case
from compiled_support import assert_same_call, assert_same_result
from pennylane.queuing import AnnotatedQueue

import pennylane_custatevec
from pennylane_custatevec import options
from pennylane_custatevec.compiled import CompiledQNode

COMPILE_WARNING = "pennylane_custatevec.compile"


def _t(values, requires_grad=True):
    return torch.tensor(values, dtype=torch.float64, requires_grad=requires_grad)


def _device(wires=2, **kwargs):
    return qml.device("custatevec.qubit", wires=wires, backend="cpu", **kwargs)


def _body(x):
    qml.RX(x[0], wires=0)
    qml.CNOT([0, 1])
    qml.RY(x[1], wires=1)


def _plain(device, **qnode_kwargs):
    @qml.qnode(device, **qnode_kwargs)
    def circuit(x):
        _body(x)
        return qml.expval(qml.Z(0) @ qml.Z(1)), qml.probs(wires=[1])

    return circuit


def _with_mcm(device, measure=lambda: qml.measure(0)):
    """A mid-circuit measurement (``measure``: a Z-basis one, or a Pauli product's) and a
    gate conditioned on it."""

    @qml.qnode(device, interface="torch")
    def circuit(x):
        _body(x)
        m = measure()
        qml.cond(m, qml.RX)(x[1], wires=1)
        return qml.expval(qml.Z(1))

    return circuit


def _with_projector_gate(device):
    @qml.qnode(device, interface="torch")
    def circuit(x):
        _body(x)
        qml.Projector([1], wires=[1])
        qml.RX(x[0], wires=0)
        return qml.expval(qml.Z(0))

    return circuit


FALLBACKS = {
    "shots (set_shots)": (
        lambda: qml.set_shots(_plain(_device(seed=11), interface="torch"), shots=50),
        "has shots",
    ),
    "mid-circuit measurements": (lambda: _with_mcm(_device()), "mid-circuit measurements"),
    "Pauli product measurements": (
        lambda: _with_mcm(_device(wires=3), lambda: qml.pauli_measure("XY", [0, 1])),
        "mid-circuit measurements",
    ),
    "Projector gate": (lambda: _with_projector_gate(_device()), "postselects"),
    "user transform": (
        lambda: qml.transforms.merge_rotations(_plain(_device(), interface="torch")),
        "transforms of its own",
    ),
    "parameter-shift": (
        lambda: _plain(_device(), interface="torch", diff_method="parameter-shift"),
        "diff_method='parameter-shift'",
    ),
    "max_diff 2": (
        lambda: _plain(_device(), interface="torch", diff_method="best", max_diff=2),
        "max_diff > 1",
    ),
    "autograd interface": (lambda: _plain(_device(), interface="autograd"), "interface"),
    "another device": (
        lambda: _plain(qml.device("default.qubit", wires=2), interface="torch"),
        "not custatevec.qubit",
    ),
}


@pytest.mark.parametrize("case", list(FALLBACKS))
def test_each_fallback_warns_once_and_gives_the_qnodes_results(case):
    build, reason = FALLBACKS[case]
    compiled, reference = pennylane_custatevec.compile(build()), build()
    x = (
        qml.numpy.array([0.4, -0.9], requires_grad=True)
        if case == "autograd interface"
        else _t([0.4, -0.9])
    )
    with pytest.warns(UserWarning) as caught:
        for _ in range(3):
            if case == "autograd interface":
                assert_same_result(compiled(x), reference(x))
            else:
                assert_same_call(compiled, reference, x)
    ours = [str(w.message) for w in caught if COMPILE_WARNING in str(w.message)]
    assert len(ours) == 1 and reason in ours[0], ours


def test_an_auto_interface_without_torch_arguments_runs_the_qnode():
    compiled = pennylane_custatevec.compile(_plain(_device(), interface="auto"))
    reference = _plain(_device(), interface="auto")
    x = np.array([0.4, -0.9])
    with pytest.warns(UserWarning, match="without torch arguments"):
        assert_same_result(compiled(x), reference(x))
    # with torch arguments, "auto" is torch: compiled, no warning
    for _ in range(3):
        assert_same_call(compiled, reference, _t([0.2, 0.5]))


# --- every differentiable gate, in seeded random circuits ---------------------------


GATE_NAMES = sorted([*PARAMETRIZED, *COMPOSITE])
CIRCUIT_SIZE = 6
VALUE_DEPENDENT = {"C(Rot)"}
"""Operations whose preprocessing reads parameter values (in the seeded circuits)."""


def _random_circuits(seed: int) -> list[list]:
    rng = np.random.default_rng(seed)
    names = [GATE_NAMES[i] for i in rng.permutation(len(GATE_NAMES))]
    return [
        [gate_case(name, rng) for name in names[i : i + CIRCUIT_SIZE]]
        for i in range(0, len(names), CIRCUIT_SIZE)
    ]


def _flat_parameters(ops) -> np.ndarray:
    return np.concatenate(
        [np.ravel(np.asarray(d, dtype=np.float64)) for op in ops for d in op.data]
    )


def _circuit_of(ops, device):
    """A QNode applying ``ops`` with their parameters read from one flat torch input."""
    wires = device.wires

    @qml.qnode(device, interface="torch", diff_method="adjoint")
    def circuit(flat):
        start = 0
        for op in ops:
            data = []
            for d in op.data:
                shape = np.shape(d)
                size = int(np.prod(shape))
                data.append(flat[start : start + size].reshape(shape))
                start += size
            qml.apply(qml.ops.functions.bind_new_parameters(op, data))
        return qml.expval(qml.Z(wires[0]) @ qml.X(wires[2])), qml.probs(wires=wires[1:3])

    return circuit


@pytest.mark.parametrize("accumulation", ["deferred", "eager"])
def test_random_circuits_over_every_differentiable_gate(accumulation):
    from adjoint_cases import WIRES

    rng = np.random.default_rng(2024)
    covered = 0
    with options(grad_accumulation=accumulation):
        for ops in _random_circuits(17):
            circuit = _circuit_of(ops, qml.device("custatevec.qubit", wires=WIRES, backend="cpu"))
            compiled = pennylane_custatevec.compile(circuit)
            n = _flat_parameters(ops).size
            for _ in range(3):  # recorded, traced, replayed
                assert_same_call(compiled, circuit, _t(rng.uniform(-np.pi, np.pi, n)))
            names = {op.name for op in ops}
            (mode,) = compiled.modes().values()
            # PennyLane decomposes a multi-controlled Rot by whether its matrix is in SU(2)
            # (numpy on the values): that circuit records on each call
            assert mode == ("RERECORD" if names & VALUE_DEPENDENT else "REPLAY"), names
            covered += len(ops)
    assert covered == len(GATE_NAMES)


# --- threads -------------------------------------------------------------------------


def _threaded_calls(compiled_qnodes, inputs):
    """Each compiled QNode called from its own thread on its inputs, all starting at once;
    returns the results (values, gradients) per thread."""
    barrier = threading.Barrier(len(compiled_qnodes))
    results: list = [None] * len(compiled_qnodes)
    errors: list = []

    def work(i):
        try:
            barrier.wait()
            out = []
            for x in inputs[i]:
                y = compiled_qnodes[i](x)
                (g,) = torch.autograd.grad(y[0] + y[1].sum() * 0.5, x)
                out.append((y[0].detach(), y[1].detach(), g))
            results[i] = out
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    threads = [
        threading.Thread(target=work, args=(i,), daemon=True) for i in range(len(compiled_qnodes))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)  # a deadlock fails the test rather than hanging the run
        assert not thread.is_alive(), "the threads' calls did not finish: a deadlock"
    assert not errors, errors
    return results


def _expected(qnode, xs):
    out = []
    for x in xs:
        y = qnode(x)
        (g,) = torch.autograd.grad(y[0] + y[1].sum() * 0.5, x)
        out.append((y[0].detach(), y[1].detach(), g))
    return out


@pytest.mark.parametrize("devices", ["one device", "two devices"])
def test_two_threads_calling_compiled_qnodes_get_correct_results(devices):
    first = _device()
    second = first if devices == "one device" else _device()

    def other(device):
        @qml.qnode(device, interface="torch")
        def circuit(x):
            qml.RY(x[0], wires=1)
            qml.CRX(x[1], wires=[1, 0])
            qml.Hadamard(0)
            return qml.expval(qml.X(0)), qml.probs(wires=[0])

        return circuit

    qnodes = [_plain(first, interface="torch"), other(second)]
    rng = np.random.default_rng(12)
    inputs = [[_t(rng.uniform(-3, 3, 2)) for _ in range(12)] for _ in qnodes]
    expected = [_expected(q, xs) for q, xs in zip(qnodes, inputs, strict=True)]
    got = _threaded_calls([pennylane_custatevec.compile(q) for q in qnodes], inputs)
    for thread_got, thread_expected in zip(got, expected, strict=True):
        for g, e in zip(thread_got, thread_expected, strict=True):
            for a, b in zip(g, e, strict=True):
                torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_one_compiled_qnode_from_two_threads():
    qnode = _plain(_device(), interface="torch")
    compiled = pennylane_custatevec.compile(qnode)
    rng = np.random.default_rng(13)
    inputs = [[_t(rng.uniform(-3, 3, 2)) for _ in range(12)] for _ in range(2)]
    expected = [_expected(qnode, xs) for xs in inputs]
    got = _threaded_calls([compiled, compiled], inputs)
    for thread_got, thread_expected in zip(got, expected, strict=True):
        for g, e in zip(thread_got, thread_expected, strict=True):
            for a, b in zip(g, e, strict=True):
                torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_a_trace_never_holds_what_a_recording_thread_waits_for(monkeypatch):
    """A call tracing a key waits for PennyLane's queue locks while another thread records
    (here: this thread, holding them as the device's preprocessing does, ``without_queuing``);
    meanwhile that thread can still reach the compiled QNode's caches. Holding the cache
    lock while tracing deadlocked the two (seen as a hung CI run)."""
    from pennylane_custatevec.compiled import qnode as compiled_qnode_module
    from pennylane_custatevec.queuing import without_queuing

    compiled = pennylane_custatevec.compile(_plain(_device(), interface="torch"))
    x = _t([0.3, -0.7])
    compiled(x)  # the key's first call: recorded; its second traces
    tracing = threading.Event()
    record_call = compiled_qnode_module.record_call

    def announced(*args, **kwargs):
        tracing.set()
        return record_call(*args, **kwargs)

    monkeypatch.setattr(compiled_qnode_module, "record_call", announced)
    results: list = []
    with without_queuing():  # this thread holds the queue locks
        caller = threading.Thread(target=lambda: results.append(compiled(x)), daemon=True)
        caller.start()
        assert tracing.wait(timeout=60), "the second call did not trace"
        reader = threading.Thread(target=lambda: results.append(compiled.modes()), daemon=True)
        reader.start()
        reader.join(timeout=30)
        blocked = reader.is_alive()
    caller.join(timeout=120)
    reader.join(timeout=120)
    assert not blocked, "the compiled QNode's caches were locked by a call waiting to trace"
    assert not caller.is_alive()
    modes, (value, probs) = results
    assert modes == {next(iter(modes)): "SEEN_ONCE"}
    expected = _plain(_device(), interface="torch")(x)
    torch.testing.assert_close(value, expected[0], atol=1e-12, rtol=0)
    torch.testing.assert_close(probs, expected[1], atol=1e-12, rtol=0)


# --- the cuStateVec backend on its NumPy double ----------------------------------------


@pytest.mark.parametrize("accumulation", ["deferred", "eager"])
def test_the_custatevec_backend_serves_the_compiled_path(gpu_double, accumulation):
    device = qml.device("custatevec.qubit", wires=3, backend="custatevec")
    assert device.backend_name == "custatevec"

    @qml.qnode(device, interface="torch")
    def circuit(x, weights):
        qml.AngleEmbedding(x, wires=[0, 1, 2])
        qml.StronglyEntanglingLayers(weights, wires=[0, 1, 2])
        return qml.expval(qml.Z(0) @ qml.Y(2)), qml.probs(wires=[1]), qml.state()

    compiled = pennylane_custatevec.compile(circuit)
    assert isinstance(compiled, CompiledQNode)
    rng = np.random.default_rng(14)
    with options(grad_accumulation=accumulation):
        for _ in range(3):
            x, w = _t(rng.uniform(0, 1, 3)), _t(rng.uniform(0, 1, (2, 3, 3)))
            assert_same_call(compiled, circuit, x, w)
    assert list(compiled.modes().values()) == ["REPLAY"]
    assert gpu_double.custatevec.calls  # the circuits ran on the double


def test_operators_built_by_another_thread_never_enter_a_compiled_recording():
    """A thread that builds operators outside any recording of its own (as PennyLane's
    workflow does when it converts a tape's parameters) while a compiled QNode records,
    traces and replays in another: PennyLane's queue is process-global, and without the
    compiled path's own recording those operators landed in its tape (a wrong circuit)."""
    device = _device()
    qnode = _plain(device, interface="torch")
    rng = np.random.default_rng(31)
    inputs = [_t(rng.uniform(-3, 3, 2)) for _ in range(40)]
    expected = _expected(qnode, inputs)
    compiled = pennylane_custatevec.compile(qnode)
    done = threading.Event()

    def build_operators():
        while not done.is_set():
            qml.RX(0.3, wires=0)
            qml.CNOT(wires=[1, 0])

    builder = threading.Thread(target=build_operators)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads take turns often: recordings overlap builds
    builder.start()
    try:
        got = _threaded_calls([compiled], [inputs])[0]
    finally:
        done.set()
        builder.join()
        sys.setswitchinterval(interval)
    for g, e in zip(got, expected, strict=True):
        for a, b in zip(g, e, strict=True):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_the_compiled_path_builds_no_operator_into_a_recording():
    """Operators the compiled path builds (rebinding a tape's parameters rebuilds a product
    observable's factors) never land in a recording: another thread's would get them (a
    wrong circuit); here one open around the calls in this thread stays empty."""
    compiled = pennylane_custatevec.compile(_plain(_device(), interface="torch"))
    x = _t([0.4, -1.2])
    with AnnotatedQueue() as outer:
        for _ in range(3):  # recorded, traced, replayed
            compiled(x)
    assert outer.queue == []
