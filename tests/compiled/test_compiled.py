"""``pennylane_custatevec.compile``: a compiled QNode gives the QNode's results (types,
nesting, dtypes) and torch gradients on every call, first (recorded), second (traced) and
later (replayed) alike, serves each signature key in the mode its circuit allows, and
never reuses a structure for a circuit it does not stand for."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import torch
from compiled_support import assert_same_call

import pennylane_custatevec
from pennylane_custatevec import options
from pennylane_custatevec.compiled import CompiledQNode
from pennylane_custatevec.compiled.trace import Trace, TraceRefused


def _device(wires=3, **kwargs):
    return qml.device("custatevec.qubit", wires=wires, backend="cpu", **kwargs)


def _t(values, requires_grad=True, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype, requires_grad=requires_grad)


def _calls(seed: int, n: int, shape) -> list[torch.Tensor]:
    generator = np.random.default_rng(seed)
    return [_t(generator.uniform(-np.pi, np.pi, shape)) for _ in range(n)]


def _modes(compiled: CompiledQNode) -> list[str]:
    return sorted(compiled.modes().values())


def _mixed_circuit(device, interface="torch", diff_method="adjoint"):
    @qml.qnode(device, interface=interface, diff_method=diff_method)
    def circuit(x, weights):
        qml.RX(x[0], wires=0)
        qml.RY(x[1] * 2 - weights[0, 0, 1], wires=1)
        qml.CNOT([0, 1])
        qml.StronglyEntanglingLayers(weights, wires=[0, 1, 2])
        qml.Rot(*torch.sin(x), wires=2)
        qml.CRZ(weights[0, 1, 2] + x[0], wires=[2, 0])
        return qml.expval(qml.Z(0) @ qml.X(2)), qml.probs(wires=[1, 2])

    return circuit


@pytest.mark.parametrize("accumulation", ["deferred", "eager"])
def test_every_call_equals_the_qnode_and_later_calls_replay(accumulation):
    circuit = _mixed_circuit(_device())
    compiled = pennylane_custatevec.compile(circuit)
    xs, ws = _calls(1, 4, 3), _calls(2, 4, (1, 3, 3))
    with options(grad_accumulation=accumulation):
        for x, w in zip(xs, ws, strict=True):
            assert_same_call(compiled, circuit, x, w)
    assert _modes(compiled) == ["REPLAY"]


def test_compile_is_a_decorator_and_keeps_the_qnodes_name():
    @pennylane_custatevec.compile
    @qml.qnode(_device(1), interface="torch")
    def single(x):
        qml.RX(x, 0)
        return qml.expval(qml.Z(0))

    assert isinstance(single, CompiledQNode)
    assert single.__name__ == "single"
    x = _t(0.3)
    for _ in range(3):
        result = single(x)
        assert result.shape == () and result.dtype == torch.float64
        torch.testing.assert_close(result, torch.cos(x), atol=1e-12, rtol=0)
    (gradient,) = torch.autograd.grad(single(x), x)
    torch.testing.assert_close(gradient, -torch.sin(x), atol=1e-12, rtol=0)


def test_compile_refuses_what_is_not_a_qnode():
    with pytest.raises(TypeError, match="takes a QNode"):
        pennylane_custatevec.compile(lambda x: x)


@pytest.mark.parametrize(
    "measure",
    [
        lambda: qml.expval(qml.Z(0)),
        lambda: qml.probs(wires=[0, 2]),
        lambda: qml.state(),
        lambda: qml.expval(qml.Hamiltonian([0.3, -0.7], [qml.Z(0) @ qml.Z(1), qml.X(2)])),
        lambda: [qml.expval(qml.Z(0)), qml.var(qml.X(1))],
        lambda: (qml.probs(wires=[1]), (qml.expval(qml.Y(2)), qml.expval(qml.Z(1)))),
        lambda: {"z": qml.expval(qml.Z(0)), "p": qml.probs(wires=[2])},
    ],
    ids=["expval", "probs", "state", "hamiltonian", "list", "nested", "dict"],
)
def test_measurements_and_their_nesting_equal_the_qnodes(measure):
    @qml.qnode(_device(), interface="torch")
    def circuit(x):
        qml.RX(x[0], 0)
        qml.IsingXY(x[1], wires=[0, 2])
        qml.CRY(x[2], wires=[2, 1])
        return measure()

    compiled = pennylane_custatevec.compile(circuit)
    for x in _calls(3, 3, 3):
        assert_same_call(compiled, circuit, x)


def test_value_dependent_control_flow_is_never_replayed_stale():
    @qml.qnode(_device(2), interface="torch")
    def circuit(x):
        if x[0] > 0:
            qml.RX(x[0], wires=0)
        else:
            qml.RY(x[0], wires=0)
            qml.CNOT([0, 1])
        qml.RZ(x[1], wires=1)
        return qml.expval(qml.X(0) @ qml.Y(1)), qml.expval(qml.Z(0))

    compiled = pennylane_custatevec.compile(circuit)
    for sign in (1, -1, -1, 1, 1, -1):
        assert_same_call(compiled, circuit, _t([sign * 0.7, 0.4]))
    assert _modes(compiled) == ["RERECORD"]


def test_python_values_are_part_of_the_key():
    @qml.qnode(_device(2), interface="torch")
    def circuit(x, layers, flip=False):
        for _ in range(layers):
            qml.RX(x, wires=0)
            qml.CNOT([0, 1])
        if flip:
            qml.PauliX(1)
        return qml.expval(qml.Z(1))

    compiled = pennylane_custatevec.compile(circuit)
    for layers, flip in [(1, False), (2, False), (1, True), (2, True)] * 3:
        assert_same_call(compiled, circuit, _t(0.3 * layers), layers, flip=flip)
    assert _modes(compiled) == ["REPLAY"] * 4


def test_numpy_arguments_are_keyed_by_value():
    @qml.qnode(_device(2), interface="torch")
    def circuit(x, data):
        qml.RY(data[0], wires=0)
        qml.RX(x * data[1], wires=1)
        return qml.expval(qml.Z(0) @ qml.Z(1))

    compiled = pennylane_custatevec.compile(circuit)
    for data in [np.array([0.1, 0.2]), np.array([0.3, -0.5])] * 3:
        assert_same_call(compiled, circuit, _t(0.8), data)
    assert _modes(compiled) == ["REPLAY", "REPLAY"]


def test_torch_data_without_grad_and_float32():
    @qml.qnode(_device(2), interface="torch")
    def circuit(features, weights):
        qml.AngleEmbedding(features, wires=[0, 1])
        qml.BasicEntanglerLayers(weights, wires=[0, 1])
        return qml.expval(qml.Z(0)), qml.probs(wires=[1])

    compiled = pennylane_custatevec.compile(circuit)
    generator = np.random.default_rng(4)
    for _ in range(4):
        features = _t(generator.uniform(0, 1, 2), requires_grad=False, dtype=torch.float32)
        weights = _t(generator.uniform(0, 1, (2, 2)))
        assert_same_call(compiled, circuit, features, weights)
    assert _modes(compiled) == ["REPLAY"]


def test_broadcast_minibatches_equal_the_qnode():
    @qml.qnode(_device(3), interface="torch")
    def circuit(features, weights):
        qml.AngleEmbedding(features, wires=[0, 1, 2])
        qml.StronglyEntanglingLayers(weights, wires=[0, 1, 2])
        return qml.expval(qml.Z(0)), qml.probs(wires=[2])

    compiled = pennylane_custatevec.compile(circuit)
    generator = np.random.default_rng(5)
    for _ in range(4):
        features = _t(generator.uniform(0, 1, (6, 3)), requires_grad=False)
        weights = _t(generator.uniform(0, 1, (2, 3, 3)))
        assert_same_call(compiled, circuit, features, weights)
    # a minibatch of features that require grad too
    features = _t(generator.uniform(0, 1, (6, 3)))
    for _ in range(3):
        assert_same_call(compiled, circuit, features, weights)


def test_calls_without_grad_mode_and_without_trainable_inputs():
    circuit = _mixed_circuit(_device())
    compiled = pennylane_custatevec.compile(circuit)
    x, w = _calls(6, 1, 3)[0], _calls(7, 1, (1, 3, 3))[0]
    with torch.no_grad():
        for _ in range(3):
            result = assert_same_call(compiled, circuit, x, w)
            assert not any(r.requires_grad for r in result)
    constant = (x.detach(), w.detach())
    for _ in range(3):
        assert_same_call(compiled, circuit, *constant)


def test_trainable_hamiltonian_coefficients_run_the_qnode():
    """Trainable observable data: the device's structures refuse them, the QNode runs
    (one warning naming the reason)."""

    @qml.qnode(_device(2), interface="torch")
    def circuit(x, coefficients):
        qml.RX(x, 0)
        qml.CNOT([0, 1])
        return qml.expval(qml.Hamiltonian(coefficients, [qml.Z(0), qml.X(1) @ qml.Z(0)]))

    compiled = pennylane_custatevec.compile(circuit)
    with pytest.warns(UserWarning, match="belong to its observables") as caught:
        for x, c in zip(_calls(8, 3, ()), _calls(9, 3, 2), strict=True):
            assert_same_call(compiled, circuit, x, c)
    assert len(caught) == 1
    assert _modes(compiled) == ["FALLBACK"]
    # coefficients that do not require grad are observable data of the structure
    for x, c in zip(_calls(8, 3, ()), _calls(9, 3, 2), strict=True):
        assert_same_call(compiled, circuit, x, c.detach())
    assert _modes(compiled) == ["FALLBACK", "RERECORD"]


def test_randomness_inside_the_quantum_function_is_not_replayed():
    """A quantum function that draws its own numbers: the first two calls of a key give
    other circuits, so every call records (same draws, same results as the QNode)."""

    @qml.qnode(_device(2), interface="torch")
    def circuit(x):
        angle = np.random.uniform(0, np.pi)
        qml.RX(x, 0)
        qml.RY(angle, 1)
        qml.CNOT([1, 0])
        return qml.expval(qml.Z(0))

    compiled = pennylane_custatevec.compile(circuit)
    for seed, x in enumerate(_calls(10, 4, ())):
        np.random.seed(seed)
        got = compiled(x)
        np.random.seed(seed)
        torch.testing.assert_close(got, circuit(x), atol=1e-12, rtol=0)
    assert _modes(compiled) == ["RERECORD"]


def test_a_global_torch_tensor_is_read_fresh_and_differentiated():
    weight = _t(0.4)

    @qml.qnode(_device(1), interface="torch")
    def circuit(x):
        qml.RX(x, 0)
        qml.RY(weight, 0)
        return qml.expval(qml.Z(0))

    compiled = pennylane_custatevec.compile(circuit)
    x = _t(0.2)
    for value in (0.4, 0.9, -0.3, 1.5):
        with torch.no_grad():
            weight.copy_(torch.tensor(value))
        got, want = compiled(x), circuit(x)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
        got_grad = torch.autograd.grad(got, (x, weight))
        want_grad = torch.autograd.grad(want, (x, weight))
        for g, w in zip(got_grad, want_grad, strict=True):
            torch.testing.assert_close(g, w, atol=1e-10, rtol=0)
    # a tensor the quantum function names is part of the key by its version counter: each
    # in-place change is a key of its own, recorded
    assert _modes(compiled) == ["SEEN_ONCE"] * 4


def test_the_trace_refuses_values_leaving_torch():
    for leave in (
        bool,
        float,
        int,
        lambda t: t.item(),
        lambda t: t.tolist(),
        lambda t: t.numpy(),
        np.asarray,
        lambda t: t[t > 0],
        torch.nonzero,
        lambda t: t.add_(1),
    ):
        trace = Trace()
        tracer = trace.tracer_of(torch.tensor([0.5]))
        with pytest.raises(TraceRefused):
            leave(tracer * 2)
    trace = Trace()
    tracer = trace.tracer_of(torch.tensor([0.5, 1.0]))
    out = torch.sin(tracer)[1] * 3
    trace.close()
    with pytest.raises(TraceRefused, match="after its trace closed"):
        out + 1
    # the replay gives the expression on new values
    slot = trace.slot_of(out)
    values = trace.replay([torch.tensor([0.1, 0.2])])
    torch.testing.assert_close(values[slot], torch.sin(torch.tensor(0.2)) * 3)


@pytest.mark.parametrize("measurement", ["probs", "expval"])
def test_a_second_backward_pass_over_one_call_differentiates_that_call(measurement):
    """Two gradients over one call's graph (``retain_graph=True``): the second VJP of a
    run simulates that call's circuit again. It used to sweep the structure's template,
    the first call's parameters: a wrong gradient from the second call on (probs, the
    general path); the direct path (expvals) re-simulates from the call's angles."""

    def make():
        device = qml.device("custatevec.qubit", wires=2, backend="cpu")

        @qml.qnode(device, interface="torch", diff_method="adjoint")
        def circuit(x):
            qml.RX(x[0], wires=0)
            qml.RY(x[1], wires=1)
            qml.CNOT([0, 1])
            if measurement == "probs":
                return qml.probs(wires=[0, 1])
            return qml.expval(qml.Z(1)), qml.expval(qml.X(0) @ qml.Y(1))

        return circuit

    qnode, compiled = make(), pennylane_custatevec.compile(make())
    for step in range(3):
        x = torch.tensor([0.3 + step, 0.5 * step + 0.1], dtype=torch.float64, requires_grad=True)
        got, want = [], []
        for function, out in ((compiled, got), (qnode, want)):
            y = function(x)
            first, second = (y[0], y[3]) if measurement == "probs" else y
            out.append(torch.autograd.grad(first, x, retain_graph=True)[0])
            out.append(torch.autograd.grad(second, x)[0])
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
