"""The compiled path's direct lane (``compiled.lanes.DirectLane``): a replayed call of a
small circuit whose rotation angles are all elements of trainable inputs runs in one
backend call and a plain backward pass takes the direct VJP; every other backward pass
(batched cotangents, torch.func, create_graph, a second pass over one call) gets the
general path's run. Each case against the plain QNode and default.qubit, on several calls
of a key, with a spy showing which path ran."""

from __future__ import annotations

import dataclasses

import numpy as np
import pennylane as qml
import pytest
import torch

import pennylane_custatevec
from pennylane_custatevec import CuStateVecDevice
from pennylane_custatevec.compiled import lanes

ATOL = 1e-10


def _compiled(func, wires, **device_kwargs):
    device = qml.device("custatevec.qubit", wires=wires, backend="cpu", **device_kwargs)
    qnode = qml.QNode(func, device, interface="torch", diff_method="adjoint", device_vjp=True)
    return pennylane_custatevec.compile(qnode)


def _reference(func, wires):
    device = qml.device("default.qubit", wires=wires)
    return qml.QNode(func, device, interface="torch", diff_method="backprop")


@dataclasses.dataclass
class LaneCalls:
    """Spies of the device class's calls that show which path a call took, for one kind
    of lane: ``"vjp"`` (the forward in ``run_direct``, a plain backward pass in
    ``vjp_direct``) or ``"jacobian"`` (the forward and the Jacobian in
    ``run_direct_jacobian``, the backward passes a product with it)."""

    kind: str
    run_direct: object
    run_direct_jacobian: object
    vjp_direct: object
    vjp_structures: object

    @property
    def forwards(self) -> int:
        """Forward passes in the lane."""
        return self.run_direct.call_count + self.run_direct_jacobian.call_count

    def assert_lane(self, forwards: int, plain_backwards: int) -> None:
        """``forwards`` forward passes in the lane, each of the kind's, and
        ``plain_backwards`` plain backward passes of them: direct VJPs in a VJP lane, none
        in a Jacobian lane (its forward took the Jacobian)."""
        jacobian = self.kind == "jacobian"
        assert self.run_direct_jacobian.call_count == (forwards if jacobian else 0)
        assert self.run_direct.call_count == (0 if jacobian else forwards)
        assert self.vjp_direct.call_count == (0 if jacobian else plain_backwards)


@pytest.fixture(params=["vjp", "jacobian"])
def lane_calls(request, mocker, monkeypatch):
    """The ``LaneCalls`` of both kinds of lane: the small circuits here take the Jacobian
    on the forward pass; with ``JACOBIAN_ON_FORWARD_WORK`` 0 none does."""
    if request.param == "vjp":
        monkeypatch.setattr(lanes, "JACOBIAN_ON_FORWARD_WORK", 0)
    return LaneCalls(
        request.param,
        mocker.spy(CuStateVecDevice, "run_direct"),
        mocker.spy(CuStateVecDevice, "run_direct_jacobian"),
        mocker.spy(CuStateVecDevice, "vjp_direct"),
        mocker.spy(CuStateVecDevice, "vjp_structures"),
    )


def _inputs(rng, shapes):
    return [torch.tensor(rng.uniform(-3, 3, size=s), requires_grad=True) for s in shapes]


def _scalar_loss(result):
    if isinstance(result, (tuple, list)):
        return sum((k + 1.5) * r for k, r in enumerate(result))
    return (1.7 * result).sum()


def _assert_calls_agree(compiled, reference, shapes, calls=4, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(calls):
        inputs = _inputs(rng, shapes)
        got = compiled(*inputs)
        g_got = torch.autograd.grad(_scalar_loss(got), inputs, allow_unused=True)
        reference_inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
        want = reference(*reference_inputs)
        g_want = torch.autograd.grad(_scalar_loss(want), reference_inputs, allow_unused=True)
        for a, b in zip(np.atleast_1d(_numpy(got)), np.atleast_1d(_numpy(want)), strict=True):
            np.testing.assert_allclose(a, b, atol=ATOL, rtol=0)
        for a, b in zip(g_got, g_want, strict=True):
            if b is None:
                assert a is None or not a.any()
                continue
            np.testing.assert_allclose(a.numpy(), b.numpy(), atol=ATOL, rtol=0)


def _numpy(result):
    if isinstance(result, (tuple, list)):
        return np.array([r.detach().numpy() for r in result])
    return result.detach().numpy()


def _chain(angles):
    for w in range(4):
        qml.RX(angles[w], wires=w)
    for w in range(3):
        qml.CNOT(wires=[w, w + 1])
    return qml.expval(qml.Z(3))


def _mixed(x, w, s):
    """Views of two inputs in a permuted order, an element used twice and one unused, a
    2-D input's elements, a scalar input, controlled and two-qubit rotations, and Pauli
    sentences measured."""
    qml.RY(x[2], wires=0)
    qml.RX(w[1, 0], wires=1)
    qml.CRZ(x[0], wires=[0, 2])
    qml.IsingXX(w[0, 1], wires=[1, 2])
    qml.RZ(x[2], wires=2)
    qml.Rot(s, w[1, 1], x[3], wires=0)
    qml.Hadamard(wires=1)
    qml.PauliRot(w[0, 0], "XYZ", wires=[0, 1, 2])
    return qml.expval(qml.Z(0) @ qml.X(2) + 0.5 * qml.Y(1)), qml.expval(qml.Z(1))


def test_a_small_circuit_of_trainable_angles_runs_in_the_lane(lane_calls):
    compiled = _compiled(_chain, 4)
    _assert_calls_agree(compiled, _reference(_chain, 4), [(4,)], calls=5)
    # the first call records; the second traces and replays, as the others, in the lane
    lane_calls.assert_lane(forwards=4, plain_backwards=4)
    assert lane_calls.vjp_structures.call_count == 1


def test_views_of_several_inputs_in_any_order_run_in_the_lane(lane_calls):
    compiled = _compiled(_mixed, 3)
    _assert_calls_agree(compiled, _reference(_mixed, 3), [(5,), (2, 2), ()], calls=5)
    lane_calls.assert_lane(forwards=4, plain_backwards=4)


def test_a_backward_pass_through_one_output_of_several(lane_calls):
    """The other output's cotangent is torch's zeros."""
    compiled, reference = _compiled(_mixed, 3), _reference(_mixed, 3)
    rng = np.random.default_rng(9)
    for _ in range(4):
        inputs = _inputs(rng, [(5,), (2, 2), ()])
        got = torch.autograd.grad(2.5 * compiled(*inputs)[1], inputs, allow_unused=True)
        ref_inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
        want = torch.autograd.grad(2.5 * reference(*ref_inputs)[1], ref_inputs, allow_unused=True)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(
                a.numpy(), np.zeros(a.shape) if b is None else b.numpy(), atol=ATOL, rtol=0
            )
    lane_calls.assert_lane(forwards=3, plain_backwards=3)


def _with_constant(angles):
    qml.RX(angles[0], wires=0)
    qml.RY(0.3, wires=1)
    qml.CNOT(wires=[0, 1])
    return qml.expval(qml.Z(1))


def _with_data(x, angles):
    qml.RX(x[0], wires=0)
    qml.RY(angles[0], wires=1)
    qml.CNOT(wires=[0, 1])
    return qml.expval(qml.Z(1))


def _broadcast(angles):
    qml.RX(angles[:, 0], wires=0)
    qml.RY(angles[0, 1], wires=1)
    qml.CNOT(wires=[0, 1])
    return qml.expval(qml.Z(1))


@pytest.mark.parametrize(
    ("func", "shapes", "device_kwargs"),
    [
        (_chain, [(4,)], {"grad_accumulation": "eager"}),  # the eager sweep is general
        (_broadcast, [(3, 2)], {}),  # a broadcast
    ],
    ids=["eager", "broadcast"],
)
def test_what_the_lane_does_not_take_runs_the_general_path(lane_calls, func, shapes, device_kwargs):
    wires = 4 if func is _chain else 2
    compiled = _compiled(func, wires, **device_kwargs)
    _assert_calls_agree(compiled, _reference(func, wires), shapes, calls=4)
    assert lane_calls.forwards == 0


def _assert_agrees_on(compiled, reference, data: tuple, angles, atol):
    """``compiled(*data, angles)`` against ``reference`` (on float64 angles): the value
    and the gradient of the angles."""
    got = compiled(*data, angles)
    (grad,) = torch.autograd.grad(got, angles)
    reference_angles = angles.detach().double().requires_grad_(True)
    want = reference(*data, reference_angles)
    (want_grad,) = torch.autograd.grad(want, reference_angles)
    np.testing.assert_allclose(got.item(), want.item(), atol=atol, rtol=0)
    np.testing.assert_allclose(grad.numpy(), want_grad.numpy(), atol=atol, rtol=0)


def test_a_constant_angle_runs_in_the_lane(lane_calls):
    compiled = _compiled(_with_constant, 2)
    _assert_calls_agree(compiled, _reference(_with_constant, 2), [(2,)], calls=4)
    lane_calls.assert_lane(forwards=3, plain_backwards=3)


def test_data_without_grad_runs_in_the_lane_with_each_call_s_values(lane_calls):
    """An angle from an argument that does not require grad (a data sample) is read from
    each call's parameters; the general run built from such a call has that call's data."""
    compiled, reference = _compiled(_with_data, 2), _reference(_with_data, 2)
    rng = np.random.default_rng(3)
    for _ in range(4):
        x = torch.tensor(rng.uniform(-3, 3, size=2))
        (angles,) = _inputs(rng, [(2,)])
        _assert_agrees_on(compiled, reference, (x,), angles, ATOL)
    lane_calls.assert_lane(forwards=3, plain_backwards=3)
    x = torch.tensor(rng.uniform(-3, 3, size=2))
    (angles,) = _inputs(rng, [(2,)])
    got = torch.autograd.functional.jacobian(
        lambda a: compiled(x, a), angles.detach(), vectorize=True
    )
    want = torch.autograd.functional.jacobian(lambda a: reference(x, a), angles.detach())
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=ATOL, rtol=0)


def test_float32_inputs_take_the_general_path(lane_calls):
    compiled, reference = _compiled(_chain, 4), _reference(_chain, 4)
    rng = np.random.default_rng(4)
    for _ in range(4):
        angles = torch.tensor(rng.uniform(-3, 3, 4), dtype=torch.float32, requires_grad=True)
        _assert_agrees_on(compiled, reference, (), angles, 1e-6)
    assert lane_calls.forwards == 0


def _warm(compiled, shapes, rng):
    for _ in range(2):  # record, trace: later calls replay
        compiled(*_inputs(rng, shapes))


def test_a_second_backward_pass_over_one_lane_call(lane_calls):
    compiled, reference = _compiled(_mixed, 3), _reference(_mixed, 3)
    rng = np.random.default_rng(5)
    _warm(compiled, [(5,), (2, 2), ()], rng)
    inputs = _inputs(rng, [(5,), (2, 2), ()])
    loss = _scalar_loss(compiled(*inputs))
    first = torch.autograd.grad(loss, inputs, retain_graph=True)
    second = torch.autograd.grad(loss, inputs)  # a VJP lane simulates again
    ref_inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
    want = torch.autograd.grad(_scalar_loss(reference(*ref_inputs)), ref_inputs)
    for a, b, c in zip(first, second, want, strict=True):
        np.testing.assert_allclose(a.numpy(), c.numpy(), atol=ATOL, rtol=0)
        np.testing.assert_allclose(b.numpy(), c.numpy(), atol=ATOL, rtol=0)
    lane_calls.assert_lane(forwards=2, plain_backwards=2)  # one forward: two backward passes


def _jacobians(function, inputs):
    return [
        torch.autograd.functional.jacobian(function, tuple(inputs), vectorize=True),
        torch.func.jacrev(function, argnums=tuple(range(len(inputs))))(*inputs),
    ]


def test_batched_backward_passes_of_lane_calls(lane_calls):
    """Jacobians by torch's legacy vmap (vectorize=True) and by torch.func.jacrev: the
    lane's forward; in a VJP lane the general path's VJP of its run (one sweep for the
    batch), in a Jacobian lane the product with the forward's Jacobian."""
    compiled, reference = _compiled(_mixed, 3), _reference(_mixed, 3)
    rng = np.random.default_rng(6)
    _warm(compiled, [(5,), (2, 2), ()], rng)
    inputs = [t.detach() for t in _inputs(rng, [(5,), (2, 2), ()])]

    def stacked(function):
        return lambda *args: torch.stack(list(function(*args)))

    got = _jacobians(stacked(compiled), inputs)
    want = torch.autograd.functional.jacobian(stacked(reference), tuple(inputs))
    for jacobian in got:
        for a, b in zip(jacobian, want, strict=True):
            np.testing.assert_allclose(a.numpy(), b.numpy(), atol=ATOL, rtol=0)
    assert lane_calls.forwards >= 1 and lane_calls.vjp_direct.call_count == 0
    general = lane_calls.vjp_structures.call_count
    assert general == 0 if lane_calls.kind == "jacobian" else general >= 1


def test_create_graph_over_a_lane_call_refuses_the_second_derivative(lane_calls):
    compiled = _compiled(_chain, 4)
    rng = np.random.default_rng(7)
    _warm(compiled, [(4,)], rng)
    (angles,) = _inputs(rng, [(4,)])
    (grad,) = torch.autograd.grad(compiled(angles), angles, create_graph=True)
    reference_angles = angles.detach().clone().requires_grad_(True)
    (want,) = torch.autograd.grad(_reference(_chain, 4)(reference_angles), reference_angles)
    np.testing.assert_allclose(grad.detach().numpy(), want.numpy(), atol=ATOL, rtol=0)
    with pytest.raises(RuntimeError, match="first derivatives only"):
        grad.sum().backward()


def test_a_tracked_device_takes_the_general_path(lane_calls):
    compiled = _compiled(_chain, 4)
    rng = np.random.default_rng(8)
    with qml.Tracker(compiled.device) as tracker:
        for _ in range(4):
            (angles,) = _inputs(rng, [(4,)])
            compiled(angles).backward()
    assert lane_calls.forwards == 0
    assert tracker.totals["executions"] == 4


def _nine_wires(outputs: int):
    def circuit(angles):
        for w in range(9):
            qml.RX(angles[w], wires=w)
        for w in range(8):
            qml.CNOT(wires=[w, w + 1])
        return tuple(qml.expval(qml.Z(8 - m)) for m in range(outputs))

    return circuit


@pytest.mark.parametrize("outputs", [1, 2])
def test_the_jacobian_is_taken_on_the_forward_pass_where_its_extra_bras_are_cheap(mocker, outputs):
    """9 wires, 17 gates: a bra's sweep updates 2**9 * 17 = 8704 amplitudes, within
    ``JACOBIAN_ON_FORWARD_WORK``; a second output's bra exceeds
    ``JACOBIAN_ON_FORWARD_EXTRA_WORK`` (8192): the VJP lane."""
    assert 2**9 * 17 <= lanes.JACOBIAN_ON_FORWARD_WORK
    assert 2**9 * 17 > lanes.JACOBIAN_ON_FORWARD_EXTRA_WORK
    run_direct = mocker.spy(CuStateVecDevice, "run_direct")
    run_direct_jacobian = mocker.spy(CuStateVecDevice, "run_direct_jacobian")
    circuit = _nine_wires(outputs)
    _assert_calls_agree(_compiled(circuit, 9), _reference(circuit, 9), [(9,)], calls=3)
    if outputs == 1:
        assert (run_direct_jacobian.call_count, run_direct.call_count) == (2, 0)
    else:
        assert (run_direct_jacobian.call_count, run_direct.call_count) == (0, 2)


def _two_angles_of(x):
    qml.RX(x[3], wires=0)
    qml.RY(x[-2], wires=1)
    qml.CNOT(wires=[0, 1])
    return qml.expval(qml.Z(1))


@pytest.mark.parametrize("size", [6, 70000])
def test_an_input_too_large_for_a_jacobian_takes_the_vjp_lane(mocker, size):
    """The Jacobians' size (outputs x input elements) is bounded by
    ``JACOBIAN_ON_FORWARD_WORK`` too: a large input of which the circuit reads two
    elements takes the VJP lane."""
    assert 6 <= lanes.JACOBIAN_ON_FORWARD_WORK < 70000
    run_direct = mocker.spy(CuStateVecDevice, "run_direct")
    run_direct_jacobian = mocker.spy(CuStateVecDevice, "run_direct_jacobian")
    compiled, reference = _compiled(_two_angles_of, 2), _reference(_two_angles_of, 2)
    _assert_calls_agree(compiled, reference, [(size,)], calls=3)
    if size == 6:
        assert (run_direct_jacobian.call_count, run_direct.call_count) == (2, 0)
    else:
        assert (run_direct_jacobian.call_count, run_direct.call_count) == (0, 2)


def test_a_forward_pass_without_grad_takes_no_jacobian(lane_calls):
    compiled, reference = _compiled(_chain, 4), _reference(_chain, 4)
    rng = np.random.default_rng(10)
    _warm(compiled, [(4,)], rng)
    lane_calls.run_direct.reset_mock()
    lane_calls.run_direct_jacobian.reset_mock()
    for _ in range(4):  # grad mode is in the key: the first call records, the others replay
        (angles,) = _inputs(rng, [(4,)])
        with torch.no_grad():
            got = compiled(angles)
        assert not got.requires_grad
        want = reference(angles.detach())
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=ATOL, rtol=0)
    assert lane_calls.run_direct_jacobian.call_count == 0
    assert lane_calls.run_direct.call_count == 3


@pytest.mark.parametrize(
    "func, wires, shapes", [(_chain, 4, [(4,)]), (_mixed, 3, [(5,), (2, 2), ()])]
)
def test_a_jacobian_lane_call_runs_as_one_lane_jacobian_function(func, wires, shapes):
    """A replayed call of a Jacobian lane with grad mode on and no torch.func transform is
    one ``LaneJacobian`` Function (torch's older Function form); its plain backward pass
    of one output (a numpy product with the Jacobian; a float32 cotangent, which torch
    casts) and its other backward passes (one output of several: two cotangents;
    ``is_grads_batched``: a batched one), delegated to ``Circuits``'s, give default.qubit's
    gradients; under ``torch.func.jacrev`` (a ``Circuits`` call) the same Jacobian."""
    compiled, reference = _compiled(func, wires), _reference(func, wires)
    rng = np.random.default_rng(11)
    _warm(compiled, shapes, rng)
    inputs = _inputs(rng, shapes)
    result = compiled(*inputs)
    outputs = result if isinstance(result, tuple) else (result,)
    assert {type(out.grad_fn).__name__ for out in outputs} == {"LaneJacobianBackward"}
    reference_inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
    want = reference(*reference_inputs)
    wants = want if isinstance(want, tuple) else (want,)
    for k, (out, out_want) in enumerate(zip(outputs, wants, strict=True)):
        got = torch.autograd.grad(out, inputs, retain_graph=True, allow_unused=True)
        expected = torch.autograd.grad(
            out_want, reference_inputs, retain_graph=True, allow_unused=True
        )
        for a, b in zip(got, expected, strict=True):
            if b is None:
                assert a is None or not a.any()
            else:
                np.testing.assert_allclose(a.numpy(), b.numpy(), atol=ATOL, rtol=0, err_msg=k)
    cotangent = torch.tensor(0.75, dtype=torch.float32)
    got = torch.autograd.grad(outputs[0], inputs, cotangent, retain_graph=True, allow_unused=True)
    expected = torch.autograd.grad(
        wants[0],
        reference_inputs,
        0.75 * torch.ones((), dtype=torch.float64),
        retain_graph=True,
        allow_unused=True,
    )
    for a, b in zip(got, expected, strict=True):
        if b is not None:
            np.testing.assert_allclose(a.numpy(), b.numpy(), atol=ATOL, rtol=0)
    rows = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    batched = torch.autograd.grad(
        outputs[0], inputs, rows, is_grads_batched=True, allow_unused=True
    )
    for a, b in zip(batched, expected, strict=True):
        if b is not None:
            want_rows = torch.stack([row / 0.75 * b for row in rows])
            np.testing.assert_allclose(a.numpy(), want_rows.numpy(), atol=ATOL, rtol=0)
    jacobians = torch.func.jacrev(lambda *args: compiled(*args), argnums=0)(
        *[t.detach() for t in inputs]
    )
    want_jacobians = torch.autograd.functional.jacobian(
        lambda *args: reference(*args), tuple(t.detach() for t in inputs)
    )
    firsts = jacobians if isinstance(jacobians, tuple) else (jacobians,)  # by input 0
    want_firsts = (
        tuple(per_output[0] for per_output in want_jacobians)
        if isinstance(want, tuple)
        else (want_jacobians[0],)
    )
    for a, b in zip(firsts, want_firsts, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=ATOL, rtol=0)
