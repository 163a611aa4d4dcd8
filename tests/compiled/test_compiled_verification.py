"""What a compiled QNode replays, and when it checks it again: the leaves of the replayed
expressions (arguments, random draws made again on every call, constants proven by two
equal traces), the verification schedule (``verify_every``), and the generators left as
the QNode leaves them (``compiled.randomness``)."""

from __future__ import annotations

import warnings

import numpy as np
import pennylane as qml
import pytest
import torch
from compiled_support import assert_same_call

import pennylane_custatevec


def _device():
    return qml.device("custatevec.qubit", wires=2, backend="cpu")


def _pair(func, **compile_options):
    compiled = pennylane_custatevec.compile(
        qml.QNode(func, _device(), interface="torch", diff_method="adjoint"), **compile_options
    )
    return compiled, qml.QNode(func, _device(), interface="torch", diff_method="adjoint")


def _x(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64, requires_grad=True)


def _mode(compiled) -> str:
    (mode,) = compiled.modes().values()
    return mode


def _same_seeded_call(compiled, qnode, x, seed: int, generator=None):
    """The compiled call and the QNode's from the same seeds give the same results and
    gradients, and leave torch's generators (and ``generator``) in the same state."""

    def seed_all():
        torch.manual_seed(seed)
        np.random.seed(seed)
        if generator is not None:
            generator.manual_seed(1000 + seed)

    def states():
        extra = [] if generator is None else [generator.get_state()]
        return [torch.default_generator.get_state(), *extra]

    seed_all()
    got = compiled(x)
    got_states = states()
    seed_all()
    want = qnode(x)
    want_states = states()
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    (got_grad,) = torch.autograd.grad(got, x)
    (want_grad,) = torch.autograd.grad(want, x)
    torch.testing.assert_close(got_grad, want_grad, atol=1e-10, rtol=0)
    for got_state, want_state in zip(got_states, want_states, strict=True):
        assert torch.equal(got_state, want_state), "the generators were left in another state"


# --- the leaves of a replayed expression ----------------------------------------------

_GENERATOR = torch.Generator()
_GLOBAL = {"tensor": torch.tensor(0.7, dtype=torch.float64), "float": 0.7}

_EXPRESSIONS = {
    "x + torch.rand(())": lambda x: x + torch.rand(()),
    "x * torch.randn(())": lambda x: x * torch.randn(()),
    "x + torch.rand(1)[0]": lambda x: x + torch.rand(1)[0],
    "a draw from an explicit generator": lambda x: (
        x + torch.rand((), generator=_GENERATOR, dtype=torch.float64)
    ),
    "a draw nothing uses": lambda x: (torch.randn(5), x)[1],
    "dropout (a draw of another name)": lambda x: torch.nn.functional.dropout(
        torch.stack([x, 2 * x]), 0.5
    )[1],
    "x * torch.stack([g, g])[0], g a global changing": lambda x: (
        x * torch.stack([_GLOBAL["tensor"], _GLOBAL["tensor"]])[0]
    ),
    "x + torch.tensor(np.random.rand())": lambda x: x + torch.tensor(np.random.rand()),
    "x * a global float changing": lambda x: x * _GLOBAL["float"],
    "a constant tensor": lambda x: x * torch.tensor(0.5, dtype=torch.float64),
}
_REPLAYED = {
    "x + torch.rand(())",
    "x * torch.randn(())",
    "x + torch.rand(1)[0]",
    "a draw from an explicit generator",
    "a draw nothing uses",
    "dropout (a draw of another name)",
    "a constant tensor",
}


@pytest.mark.parametrize("name", list(_EXPRESSIONS))
def test_every_leaf_of_a_gate_parameter_is_accounted_for(name):
    """Each call from the same seeds equals the QNode's, draws and all, and leaves the
    generators where the QNode leaves them: draws are made again on every replayed call,
    constants replay only where two traces prove them constant (a global that changes
    between calls makes the key re-record). Before, calls from the third on repeated the
    second call's draw (0.8956 where the QNode gave 0.2505)."""
    expression = _EXPRESSIONS[name]

    def circuit(x):
        qml.RX(expression(x), 0)
        qml.RY(0.3 * x, 1)
        qml.CNOT([0, 1])
        return qml.expval(qml.Z(1))

    compiled, qnode = _pair(circuit)
    for call in range(12):
        _GLOBAL["tensor"] = torch.tensor(0.7 + 0.01 * call, dtype=torch.float64)
        _GLOBAL["float"] = 0.7 + 0.01 * call
        _same_seeded_call(compiled, qnode, _x(0.3 + 0.1 * call), call, _GENERATOR)
    assert _mode(compiled) == ("REPLAY" if name in _REPLAYED else "RERECORD")


def test_a_global_that_requires_grad_is_differentiated():
    """A tensor that requires grad and is not an argument (a parameter the quantum
    function closes over) gets the QNode's gradient: such a key re-records."""
    weight = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)

    def circuit(x):
        qml.RX(x * weight, 0)
        qml.RY(weight, 1)
        qml.CNOT([0, 1])
        return qml.expval(qml.Z(1))

    compiled, qnode = _pair(circuit)
    for call in range(5):
        x = _x(0.2 + 0.3 * call)
        got, want = compiled(x), qnode(x)
        got_grads = torch.autograd.grad(got, (x, weight))
        want_grads = torch.autograd.grad(want, (x, weight))
        torch.testing.assert_close(got_grads, want_grads, atol=1e-10, rtol=0)
    assert _mode(compiled) == "RERECORD"


def test_a_global_tensor_as_a_gate_parameter_replays_while_it_is_constant():
    """A global tensor that is a gate parameter is a constant proven by two traces; one
    that changes on every call makes the key re-record."""
    constant = torch.tensor(0.25, dtype=torch.float64)
    changing = {"value": constant}

    def circuit(x):
        qml.RX(constant, 0)
        qml.RZ(changing["value"], 1)
        qml.IsingXX(x, [0, 1])
        return qml.expval(qml.Z(0) @ qml.Z(1))

    compiled, qnode = _pair(circuit)
    for call in range(6):
        assert_same_call(compiled, qnode, _x(0.1 * call))
    assert _mode(compiled) == "REPLAY"
    for call in range(6):
        changing["value"] = torch.tensor(0.1 * call, dtype=torch.float64)
        assert_same_call(compiled, qnode, _x(0.1 * call))


def test_a_no_grad_block_of_the_quantum_function_replays_without_grad():
    """A value the quantum function computes under ``torch.no_grad()`` carries no
    gradient, in a replay too (each recorded call replays in its own grad mode). Before,
    the replay computed it with grad: a gradient 3x the QNode's (-2.80 where -0.93)."""

    def circuit(x):
        with torch.no_grad():
            doubled = x * 2
        qml.RX(doubled + x, 0)
        return qml.expval(qml.Z(0))

    compiled, qnode = _pair(circuit)
    for call in range(6):
        _same_seeded_call(compiled, qnode, _x(0.3 + 0.1 * call), call)
    assert _mode(compiled) == "REPLAY"


# --- generators ------------------------------------------------------------------------


def test_a_generator_reseeded_inside_the_quantum_function_is_not_replayed():
    """``torch.manual_seed`` is no torch call that a trace sees: a generator changed
    between two torch calls, or after the last one, refuses the trace."""

    def reseeding_first(x):
        torch.manual_seed(5)
        qml.RX(x + torch.rand(()), 0)
        return qml.expval(qml.Z(0))

    def reseeding_last(x):
        qml.RX(x + torch.rand(()), 0)
        torch.manual_seed(5)
        return qml.expval(qml.Z(0))

    for circuit in (reseeding_first, reseeding_last):
        compiled, qnode = _pair(circuit)
        for call in range(6):
            _same_seeded_call(compiled, qnode, _x(0.2 * call), call)
        assert _mode(compiled) == "RERECORD"
        (entry,) = compiled._entries.values()
        assert "changed outside torch's functions" in entry.reason


def test_a_refused_trace_leaves_the_generators_as_the_quantum_function_would():
    """A trace refused after a draw (torch's, numpy's) rewinds the generators before the
    quantum function is recorded again: each draw is made once per call."""

    def circuit(x):
        angle = x + torch.rand(()) + np.random.rand()
        if float(x) > 0.5:  # Python control flow on a value: refused
            qml.RY(angle, 0)
        else:
            qml.RX(angle, 0)
        return qml.expval(qml.Z(0))

    compiled, qnode = _pair(circuit)
    for call in range(6):
        _same_seeded_call(compiled, qnode, _x(0.2 * call), call)
    assert _mode(compiled) == "RERECORD"


def test_a_replay_refused_after_a_draw_leaves_the_generators_as_the_quantum_function_would():
    """A replay that meets an output shape other than the trace's (the one-argument
    ``torch.where``, whose length depends on values) after drawing: the generators go
    back to their states before the replay, and the call is recorded, drawing once."""

    def circuit(x):
        draw = torch.rand(())
        (above,) = torch.where(x > torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64))
        qml.RX(x + draw + 0.01 * above.sum(), 0)
        return qml.expval(qml.Z(0))

    compiled, qnode = _pair(circuit)
    for call, value in enumerate([0.5, 0.52, 0.55, 0.57, 1.2, 1.25, 0.3]):
        _same_seeded_call(compiled, qnode, _x(value), call)
    assert _mode(compiled) == "RERECORD"


def test_an_in_place_operation_on_an_argument_is_refused_before_it_runs():
    """An in-place change of an argument made by the quantum function happens once per
    call, as in the QNode: the trace refuses it before running it."""

    def circuit(x):
        with torch.no_grad():
            x.data.add_(0.125)
        qml.RX(x, 0)
        return qml.expval(qml.Z(0))

    compiled, qnode = _pair(circuit)
    x_compiled, x_qnode = _x(0.0), _x(0.0)
    for _ in range(5):
        torch.testing.assert_close(compiled(x_compiled), qnode(x_qnode), atol=1e-10, rtol=0)
        assert float(x_compiled) == float(x_qnode)
    assert float(x_compiled) == 5 * 0.125
    assert _mode(compiled) == "RERECORD"


# --- verification --------------------------------------------------------------------


def _counting_circuit(calls: list, scale: dict):
    def circuit(x):
        calls.append(1)
        qml.RX(x * scale["value"], 0)
        return qml.expval(qml.Z(0))

    return circuit


def _traced_calls(verify_every, n_calls: int) -> list[int]:
    """The calls (counted from 1) in which a compiled QNode ran its quantum function."""
    runs: list = []
    compiled, _ = _pair(_counting_circuit(runs, {"value": 1.0}), verify_every=verify_every)
    ran = []
    for call in range(1, n_calls + 1):
        before = len(runs)
        compiled(_x(0.01 * call))
        if len(runs) > before:
            ran.append(call)
    return ran


def test_the_verification_schedule():
    """Recorded at call 1, traced at 2 and 3, verified at 4, 8, ..., verify_every and
    every verify_every-th call after; verify_every=None: never after call 3."""
    assert _traced_calls(8, 40) == [1, 2, 3, 4, 8, 16, 24, 32, 40]
    assert _traced_calls(16, 70) == [1, 2, 3, 4, 8, 16, 32, 48, 64]
    assert _traced_calls(None, 40) == [1, 2, 3]


def test_a_change_outside_the_arguments_is_found_by_the_next_verification():
    """A global read by the quantum function that changes at call 10 is replayed stale
    until the verification at call 16 (the contract: doc/compiled.md), which warns once,
    naming what changed; every later call records and is right."""
    scale = {"value": 1.0}
    compiled, qnode = _pair(_counting_circuit([], scale))
    stale = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for call in range(1, 25):
            if call == 10:
                scale["value"] = 1.5
            x = _x(0.3)
            if abs(float(compiled(x)) - float(qnode(x))) > 1e-12:
                stale.append(call)
    assert stale == list(range(10, 16))
    assert _mode(compiled) == "RERECORD"
    messages = [str(w.message) for w in caught if "replayed call" in str(w.message)]
    assert len(messages) == 1
    assert "torch call mul" in messages[0] and "took other constants" in messages[0]


@pytest.mark.parametrize("verify_every", [0, 2, 3, 6, 2.0, True, "256"])
def test_verify_every_must_be_a_power_of_two_of_at_least_four(verify_every):
    qnode = qml.QNode(lambda x: qml.expval(qml.Z(0)), _device(), interface="torch")
    with pytest.raises(ValueError, match="power of two of at least 4"):
        pennylane_custatevec.compile(qnode, verify_every=verify_every)


def test_compile_as_a_decorator_with_options():
    @pennylane_custatevec.compile(verify_every=None)
    @qml.qnode(_device(), interface="torch", diff_method="adjoint")
    def circuit(x):
        qml.RX(x, 0)
        return qml.expval(qml.Z(0))

    assert circuit.verify_every is None
    torch.testing.assert_close(circuit(_x(0.5)), torch.cos(_x(0.5)), atol=1e-12, rtol=0)


# --- what the quantum function reads by name -------------------------------------------

_SCALE = 0.7
_FLAG = 1.0
_OFFSET = torch.tensor(0.2, dtype=torch.float64)


def _named_globals_circuit(x):
    if _FLAG > 0:  # read by Python only: no trace sees it
        qml.RX(x * _SCALE + _OFFSET, 0)
    else:
        qml.RY(x, 0)
    return qml.expval(qml.Z(0))


def test_globals_the_quantum_function_names_are_part_of_the_key():
    """A module global or closure variable that the quantum function names (a Python or
    numpy scalar by value, a tensor by identity and version counter) is part of the
    signature key: a change of it, even one only an ``if`` reads, is never replayed
    stale (no verification needed); going back to earlier values replays their keys."""
    global _SCALE, _FLAG, _OFFSET
    compiled, qnode = _pair(_named_globals_circuit)
    changes = {
        10: lambda: globals().update(_SCALE=0.9),
        20: lambda: globals().update(_FLAG=-1.0),
        25: lambda: globals().update(_FLAG=1.0),
        30: lambda: _OFFSET.add_(0.1),  # in place: its version counter moves
        35: lambda: globals().update(_OFFSET=torch.tensor(0.5, dtype=torch.float64)),
    }
    try:
        for call in range(1, 41):
            if call in changes:
                with torch.no_grad():
                    changes[call]()
            x = _x(0.3 + 0.01 * call)
            torch.testing.assert_close(compiled(x), qnode(x), atol=1e-12, rtol=0)
        assert len(compiled.modes()) == 5
        assert set(compiled.modes().values()) == {"REPLAY"}
    finally:
        _SCALE, _FLAG, _OFFSET = 0.7, 1.0, torch.tensor(0.2, dtype=torch.float64)
