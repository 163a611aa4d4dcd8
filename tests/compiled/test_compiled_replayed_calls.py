"""Adversarial checks of ``pennylane_custatevec.compile``: a compiled QNode against the
torch QNode on ``custatevec.qubit`` (and ``default.qubit`` with backprop) in the ways a
training loop uses it, on the third and later calls of a key (the first records, the
second traces, later calls replay): several backward passes over one call, outputs used
twice, several calls in one graph, two compiled QNodes on one device, calls without grad
mode, views and partial ``requires_grad``, keyword arguments, broadcasts of changing size,
multi-measurement returns, the eager mode, TorchLayer, torch.func; and the regressions
found by these checks (an adjoint rotation whose template angle is zero; torch.func's
wrapped arguments under jacrev; jacrev on a key's first call)."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import torch
from compiled_support import assert_same_result, tensors_in, weighted_loss

import pennylane_custatevec

ATOL = 1e-10


def _device(wires, **kwargs):
    return qml.device("custatevec.qubit", wires=wires, backend="cpu", **kwargs)


def _t(values, requires_grad=True, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype, requires_grad=requires_grad)


def _pair(func, wires, **device_kwargs):
    """(the compiled QNode, the plain QNode) of ``func``, each on its own device."""
    compiled = pennylane_custatevec.compile(
        qml.QNode(func, _device(wires, **device_kwargs), interface="torch", diff_method="adjoint")
    )
    qnode = qml.QNode(
        func, _device(wires, **device_kwargs), interface="torch", diff_method="adjoint"
    )
    return compiled, qnode


def _reference(func, wires):
    return qml.QNode(
        func, qml.device("default.qubit", wires=wires), interface="torch", diff_method="backprop"
    )


def _close(got, want, message=""):
    np.testing.assert_allclose(
        got.detach().numpy(), want.detach().numpy(), atol=ATOL, rtol=0, err_msg=message
    )


def _grads(result, inputs, seed=7):
    return torch.autograd.grad(weighted_loss(result, seed), inputs, allow_unused=True)


def _assert_same(compiled, qnode, *args, **kwargs):
    """The compiled call gives the QNode's result and gradients (every input that requires
    grad)."""
    got, want = compiled(*args, **kwargs), qnode(*args, **kwargs)
    assert_same_result(got, want)
    inputs = list({id(t): t for t in tensors_in((args, kwargs)) if t.requires_grad}.values())
    if inputs:
        for i, (g, w) in enumerate(zip(_grads(got, inputs), _grads(want, inputs), strict=True)):
            assert (g is None) == (w is None), f"gradient {i}"
            if w is not None:
                _close(g, w, f"gradient {i}")


# --- regressions ----------------------------------------------------------------------


_ADJOINT_ROTATIONS = {
    "adjoint RX": lambda x: qml.adjoint(qml.RX(x, 0)),
    "adjoint CRX": lambda x: qml.adjoint(qml.CRX(x, [1, 0])),
    "adjoint IsingZZ": lambda x: qml.adjoint(qml.IsingZZ(x, [0, 1])),
}


def _adjoint_rotation_circuit(rotation):
    def circuit(x):
        qml.Hadamard(1)
        qml.RY(0.4, 0)
        rotation(x)
        return qml.expval(qml.X(0)), qml.expval(qml.Y(0))

    return circuit


@pytest.mark.parametrize("name", sorted(_ADJOINT_ROTATIONS))
def test_an_adjoint_rotation_first_called_at_zero_angle(name):
    """Regression: a structure built from a template whose adjoint rotation had angle 0
    took the angle rule ``angle = parameter`` for the step's negated angle (-0.0 == 0.0),
    so every later call ran the rotation the other way round: <X0> 0.2477 where the QNode
    gives -0.2477 (structures._AngleRule.matches compares bit for bit now)."""
    func = _adjoint_rotation_circuit(_ADJOINT_ROTATIONS[name])
    compiled, _ = _pair(func, 2)
    reference = _reference(func, 2)
    for value in (0.0, 0.3, 0.7, -1.1):
        x = _t(value)
        got, want = compiled(x), reference(x)
        for g, w in zip(got, want, strict=True):
            _close(g, w, f"{name} at {value}")
        (g,) = torch.autograd.grad(got[0] + 2 * got[1], x)
        (w,) = torch.autograd.grad(want[0] + 2 * want[1], x)
        _close(g, w, f"{name} gradient at {value}")


def test_an_adjoint_rotation_at_zero_angle_on_the_qnodes_second_call():
    """The same on the plain QNode: the device's structure cache builds a structure on the
    second tape of a key, here one with a zero angle."""
    func = _adjoint_rotation_circuit(_ADJOINT_ROTATIONS["adjoint RX"])
    _, qnode = _pair(func, 2)
    reference = _reference(func, 2)
    for value in (0.3, 0.0, 0.7, 1.1):
        x = _t(value)
        for g, w in zip(qnode(x), reference(x), strict=True):
            _close(g, w, f"at {value}")


def _stacked(function):
    return lambda x: torch.stack(function(x))


def _embedding(x):
    qml.AngleEmbedding(x, wires=range(3))
    qml.CNOT([0, 2])
    return qml.expval(qml.Z(0)), qml.expval(qml.X(1) @ qml.Z(2))


def test_jacrev_after_one_ordinary_call_of_the_key():
    """Regression: doc/compiled.md says torch.func.jacrev runs on the calls of a key from
    its second (traced) call; after one ordinary call, jacrev's traced call failed in
    ``_traced`` (``as_numpy`` of a torch.func-wrapped value: "Cannot access data pointer
    of Tensor that doesn't have storage"), the key stayed SEEN_ONCE, and every later
    jacrev call failed the same way (``plans.as_numpy`` reads wrapped data now)."""
    compiled, qnode = _pair(_embedding, 3)
    x = _t([0.1, 0.2, 0.3])
    want = torch.autograd.functional.jacobian(_stacked(qnode), x)
    compiled(x)  # the key's recorded call
    for _ in range(3):
        got = torch.func.jacrev(_stacked(compiled))(x.detach())
        _close(got, want)


def test_jacrev_on_a_fresh_key_gives_the_qnodes_jacobian():
    """jacrev from a key's first call: the recorded call reads its parameters below
    torch.func's wrappers (PennyLane's numpy conversion cannot: it used to raise "Cannot
    access data pointer of Tensor that doesn't have storage" on every call, the failed
    first call never remembered). Each call, recorded, traced and replayed, gives the
    QNode's Jacobian."""
    compiled, qnode = _pair(_embedding, 3)
    x = _t([0.4, -0.2, 0.9], requires_grad=False)
    want = torch.autograd.functional.jacobian(_stacked(qnode), x)
    for _ in range(3):
        _close(torch.func.jacrev(_stacked(compiled))(x), want)


# --- scenarios checked and found right --------------------------------------------------


def _layers(n, measure="expval"):
    def circuit(x, w):
        qml.AngleEmbedding(x, wires=range(n))
        qml.StronglyEntanglingLayers(w, wires=range(n))
        if measure == "phase":  # a gate compiled to a matrix: the general path
            qml.PhaseShift(w[0, 0, 0], 0)
        if measure == "probs":
            return qml.probs(wires=[0, 1])
        # a word on two wires (X(1) @ Y(1) at n=2 would be iZ, which is not Hermitian)
        return qml.expval(qml.Z(0)), qml.expval(qml.X(n - 2) @ qml.Y(n - 1))

    return circuit


@pytest.mark.parametrize(
    ("n", "measure", "accumulation"),
    [
        (2, "expval", "deferred"),
        (3, "phase", "deferred"),
        (3, "probs", "eager"),
        (3, "expval", "eager"),
        (12, "expval", "deferred"),
    ],
)
def test_several_backward_passes_over_one_call(n, measure, accumulation):
    """retain_graph: two losses of one call's outputs, then the first again, per call."""
    compiled, qnode = _pair(_layers(n, measure), n)
    rng = np.random.default_rng(1)
    for call in range(3 if n == 12 else 4):
        x = _t(rng.uniform(-2, 2, n))
        w = _t(rng.uniform(-2, 2, (1, n, 3)))
        with pennylane_custatevec.options(grad_accumulation=accumulation):
            got, want = compiled(x, w), qnode(x, w)
        want1, want2 = _grads(want, (x, w), 1), _grads(want, (x, w), 2)
        first = torch.autograd.grad(weighted_loss(got, 1), (x, w), retain_graph=True)
        second = torch.autograd.grad(weighted_loss(got, 2), (x, w), retain_graph=True)
        again = torch.autograd.grad(weighted_loss(got, 1), (x, w))
        for g, w_ in zip(first + second + again, want1 + want2 + want1, strict=True):
            _close(g, w_, f"call {call}")


def test_outputs_used_twice_and_calls_summed_in_one_graph():
    def circuit(x, w):
        qml.RX(x[0], 0)
        qml.RY(x[1], 1)
        qml.CNOT([0, 1])
        qml.RZ(w, 1)
        qml.RX(w * 2, 0)
        return qml.expval(qml.Z(0) @ qml.Z(1))

    compiled, qnode = _pair(circuit, 2)
    rng = np.random.default_rng(2)

    def loss(function, xs, w):
        total = 0
        for i, x in enumerate(xs):
            y = function(x, w)
            total = total + (i + 1) * (y * y + torch.sin(y))
        return total

    for _ in range(4):
        xs = [_t(rng.uniform(-2, 2, 2)) for _ in range(3)]
        w = _t(rng.uniform(-2, 2))
        got = torch.autograd.grad(loss(compiled, xs, w), (*xs, w))
        want = torch.autograd.grad(loss(qnode, xs, w), (*xs, w))
        for g, w_ in zip(got, want, strict=True):
            _close(g, w_)


def test_two_compiled_qnodes_on_one_device_interleaved():
    """Two compiled QNodes of one structure (other traces) on one device, a call without
    grad mode between, the backward passes in another order than the calls."""
    n = 3
    device = _device(n)
    first_func = _layers(n, "phase")

    def second_func(x, w):
        return first_func(2 * x, w.flip(0))

    first = pennylane_custatevec.compile(qml.QNode(first_func, device, interface="torch"))
    second = pennylane_custatevec.compile(qml.QNode(second_func, device, interface="torch"))
    first_ref, second_ref = _reference(first_func, n), _reference(second_func, n)
    rng = np.random.default_rng(3)
    for _ in range(4):
        xs = [_t(rng.uniform(-2, 2, n)) for _ in range(3)]
        w = _t(rng.uniform(-2, 2, (2, n, 3)))
        outs = [first(xs[0], w), second(xs[1], w)]
        with torch.no_grad():
            quiet = second(xs[2], w)
        outs.append(first(xs[2], w))
        wants = [first_ref(xs[0], w), second_ref(xs[1], w), first_ref(xs[2], w)]
        for g, w_ in zip(quiet, second_ref(xs[2], w), strict=True):
            _close(g, w_)
        for i in (2, 0, 1):
            for g, w_ in zip(
                _grads(outs[i], (xs[i], w), i), _grads(wants[i], (xs[i], w), i), strict=True
            ):
                _close(g, w_, f"output {i}")


def _indexed(x, w, scale=1.0, flip=False):
    for i in range(3):
        qml.RX(x[i] * scale, i)
    qml.CNOT([0, 1])
    qml.CNOT([1, 2])
    qml.Rot(w[0, 0], w[0, 1], w[0, 2], 0)
    qml.IsingXX(w[1, 0] + w[1, 1], [0, 2])
    qml.RY(x[-1], 1)
    if flip:
        qml.PauliX(1)
    return qml.expval(qml.Z(0)), qml.expval(qml.Y(1) @ qml.X(2))


def test_views_partial_grads_float32_keywords_and_in_place_updates():
    compiled, qnode = _pair(_indexed, 3)
    rng = np.random.default_rng(4)
    for _ in range(3):  # non-contiguous views of one leaf
        big = _t(rng.uniform(-2, 2, (6, 4)))
        _assert_same(compiled, qnode, big[::2, 1], big.T[:3, :2].T)
    for _ in range(3):  # requires_grad on one argument only, then on the other
        x, w = _t(rng.uniform(-2, 2, 3), False), _t(rng.uniform(-2, 2, (2, 3)))
        _assert_same(compiled, qnode, x, w)
        _assert_same(compiled, qnode, x.detach().requires_grad_(), w.detach())
    for _ in range(3):
        x = _t(rng.uniform(-2, 2, 3), dtype=torch.float32)
        _assert_same(compiled, qnode, x, _t(rng.uniform(-2, 2, (2, 3)), dtype=torch.float32))
    for call in range(6):
        x, w = _t(rng.uniform(-2, 2, 3)), _t(rng.uniform(-2, 2, (2, 3)))
        scale = _t(0.5 + call) if call % 2 else 0.5 + call
        _assert_same(compiled, qnode, x, w=w, scale=scale, flip=bool(call % 3))
    x, w = _t(rng.uniform(-2, 2, 3)), _t(rng.uniform(-2, 2, (2, 3)))
    for _ in range(4):  # the same leaves, changed in place between calls
        _assert_same(compiled, qnode, x, w)
        with torch.no_grad():
            x.add_(0.3)
            w.mul_(1.1)


_H = qml.Hamiltonian([0.3, -1.2, 0.7], [qml.Z(0) @ qml.Z(1), qml.X(1), qml.Y(0) @ qml.X(2)])


def _measurements(x, w):
    qml.AngleEmbedding(x, wires=range(3))
    qml.StronglyEntanglingLayers(w, wires=range(3))
    return qml.expval(_H), qml.probs(wires=[0, 2]), qml.var(qml.X(1)), qml.state()


def test_broadcasts_of_changing_size_with_several_measurements():
    compiled, qnode = _pair(_measurements, 3)
    rng = np.random.default_rng(5)
    for batch in (None, None, None, 4, 4, 4, 2, 2, 2, None, 1, 1, 1):
        shape = (3,) if batch is None else (batch, 3)
        _assert_same(
            compiled, qnode, _t(rng.uniform(-2, 2, shape)), _t(rng.uniform(-2, 2, (2, 3, 3)))
        )


def test_complex64_device_agrees_to_round_off():
    """At single precision the compiled path and the QNode agree to round-off only (the
    QNode's own first and later calls differ by ~1e-8 there)."""
    compiled, qnode = _pair(_layers(3, "phase"), 3, c_dtype=np.complex64)
    rng = np.random.default_rng(6)
    for _ in range(4):
        x, w = _t(rng.uniform(-2, 2, 3)), _t(rng.uniform(-2, 2, (1, 3, 3)))
        got, want = compiled(x, w), qnode(x, w)
        for g, w_ in zip(got, want, strict=True):
            np.testing.assert_allclose(g.detach(), w_.detach(), atol=1e-6)
        for g, w_ in zip(_grads(got, (x, w)), _grads(want, (x, w)), strict=True):
            np.testing.assert_allclose(g, w_, atol=1e-5)


def test_torch_layer_training_equals_the_qnodes():
    n = 3

    def circuit(inputs, weights, bias):
        qml.AngleEmbedding(inputs, wires=range(n))
        qml.StronglyEntanglingLayers(weights, wires=range(n))
        qml.RY(bias, 0)
        return [qml.expval(qml.Z(i)) for i in range(n)]

    compiled, qnode = _pair(circuit, n)
    shapes = {"weights": (2, n, 3), "bias": ()}
    torch.manual_seed(0)
    models = []
    for function in (compiled, qnode):
        torch.manual_seed(0)
        layer = qml.qnn.TorchLayer(function, shapes)
        torch.manual_seed(1)
        models.append(torch.nn.Sequential(torch.nn.Linear(2, n), layer, torch.nn.Linear(n, 1)))
    for model in models:
        model.double()
    optimizers = [torch.optim.SGD(model.parameters(), lr=0.1) for model in models]
    rng = np.random.default_rng(7)
    for _ in range(5):
        batch = torch.as_tensor(rng.uniform(-1, 1, (4, 2)))
        for model, optimizer in zip(models, optimizers, strict=True):
            optimizer.zero_grad()
            (model(batch) ** 2).mean().backward()
            optimizer.step()
    states = (model.state_dict().values() for model in models)
    for got, want in zip(*states, strict=True):
        _close(got, want)


def _stacked_of_two(function):
    """``function(x, w)``'s outputs stacked into one tensor."""
    return lambda x, w: torch.stack(function(x, w))


def _replaying_pair(seed: int):
    """(compiled, qnode, rng, w) of ``_layers(3)``, the compiled key (x without grad, w
    with) called twice: it replays from the next call."""
    compiled, qnode = _pair(_layers(3), 3)
    rng = np.random.default_rng(seed)
    w = _t(rng.uniform(-2, 2, (2, 3, 3)))
    for _ in range(2):
        compiled(_t(rng.uniform(-2, 2, 3), False), w)
    return compiled, qnode, rng, w


def test_torch_func_after_warm_up():
    """vmap over the inputs, jacrev in the weights and the legacy vectorized jacobian, on a
    key that replays (two ordinary calls of the key first: x without grad, the weights
    with). Regression: jacrev wraps the argument it does not differentiate too, and its
    replayed calls failed on it in ``_Replay.bind`` ("Cannot access data pointer of Tensor
    that doesn't have storage")."""
    compiled, qnode, rng, _ = _replaying_pair(8)
    stacked = _stacked_of_two
    for _ in range(2):
        xs = torch.as_tensor(rng.uniform(-2, 2, (3, 3)))
        w = torch.as_tensor(rng.uniform(-2, 2, (2, 3, 3)))
        rows = [stacked(qnode)(x, w) for x in xs]
        _close(torch.func.vmap(stacked(compiled), in_dims=(0, None))(xs, w), torch.stack(rows))
        for x in xs:
            want = torch.autograd.functional.jacobian(lambda v, x=x: stacked(qnode)(x, v), w)
            _close(torch.func.jacrev(stacked(compiled), argnums=1)(x, w), want)
            legacy = torch.autograd.functional.jacobian(
                lambda v, x=x: stacked(compiled)(x, v), w, vectorize=True
            )
            _close(legacy, want)


def test_vmap_of_jacrev_over_a_batched_argument():
    """Regression: ``vmap(jacrev(compiled, argnums=1), in_dims=(0, None))`` (per-sample
    jacobians), even on a key that replays, failed in ``_Replay.bind`` (``as_numpy`` of
    the vmap-batched ``x``: "Cannot access data pointer of Tensor that doesn't have
    storage"). Expected: the per-sample jacobians, or an error naming the alternative (the
    error now)."""
    compiled, qnode, rng, w = _replaying_pair(9)
    stacked = _stacked_of_two
    xs = torch.as_tensor(rng.uniform(-2, 2, (3, 3)))
    w = w.detach()
    want = torch.stack(
        [torch.autograd.functional.jacobian(lambda v, x=x: stacked(qnode)(x, v), w) for x in xs]
    )
    try:
        got = torch.func.vmap(torch.func.jacrev(stacked(compiled), argnums=1), (0, None))(xs, w)
    except RuntimeError as error:
        assert "broadcast" in str(error), f"an unclear error: {error}"
        return
    _close(got, want)
