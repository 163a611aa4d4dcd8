"""The compiled layer's per-call shortcuts keep the QNode's results and gradients: the
C-level Function apply on plain calls (torch's ``Function.apply`` under torch.func
transforms), the plain backward without a second Function (the ``CircuitsVJP`` Function
with ``create_graph=True``), arguments whose integer-indexed views are gate parameters
passed to the Function as they are (their gradients stacked or scattered, also batched),
keyword arguments bound by name in any order, the options in force resolved per context,
and the device's post-processing skipped only where it passes its results through."""

from __future__ import annotations

import functools

import numpy as np
import pennylane as qml
import pytest
import torch
from compiled_support import assert_same_call

import pennylane_custatevec
from pennylane_custatevec import options
from pennylane_custatevec.compiled import replay as compiled_replay
from pennylane_custatevec.compiled.function import Circuits, CircuitsVJP
from pennylane_custatevec.device import CuStateVecDevice


def _device(wires=3):
    return qml.device("custatevec.qubit", wires=wires, backend="cpu")


def _t(values, requires_grad=True):
    return torch.tensor(values, dtype=torch.float64, requires_grad=requires_grad)


def _rows(seed: int, n: int, shape) -> list[torch.Tensor]:
    generator = np.random.default_rng(seed)
    return [_t(generator.uniform(-np.pi, np.pi, shape)) for _ in range(n)]


def _angles_circuit():
    """W4's shape on 3 wires: each angle an RX parameter ``x[i]``."""

    @qml.qnode(_device(), interface="torch", diff_method="adjoint")
    def circuit(x):
        for i in range(3):
            qml.RX(x[i], wires=i)
        qml.CNOT([0, 1])
        qml.CNOT([1, 2])
        return qml.expval(qml.Z(2)), qml.probs(wires=[0, 1])

    return circuit


@pytest.fixture
def torch_applies(monkeypatch):
    """How often torch's own ``Function.apply`` runs per Function class."""
    counts = {Circuits: 0, CircuitsVJP: 0}
    for function in counts:

        def spy(cls, *args, _original=function.apply.__func__, **kwargs):
            counts[cls] += 1
            return _original(cls, *args, **kwargs)

        monkeypatch.setattr(function, "apply", classmethod(spy))
    return counts


def test_plain_calls_apply_without_torchs_apply_and_torch_func_uses_it(torch_applies):
    circuit = _angles_circuit()
    compiled = pennylane_custatevec.compile(circuit)
    for x in _rows(1, 3, 3):
        assert_same_call(compiled, circuit, x)
    assert list(compiled.modes().values()) == ["REPLAY"]
    assert torch_applies == {Circuits: 0, CircuitsVJP: 0}

    x = _rows(2, 1, 3)[0]
    expected = torch.autograd.functional.jacobian(
        lambda v: torch.cat([r.reshape(-1) for r in circuit(v)]), x
    )
    jacobian = torch.func.jacrev(lambda v: torch.cat([r.reshape(-1) for r in compiled(v)]))(x)
    torch.testing.assert_close(jacobian, expected, atol=1e-10, rtol=0)
    # torch.func runs torch's apply (its transforms call it again one level down)
    assert torch_applies[Circuits] >= 1 and torch_applies[CircuitsVJP] >= 1


_VIEWS = {
    "in order": lambda x: (x[0], x[1], x[2], x[3]),
    "negative, repeated, partial": lambda x: (x[-1], x[0], x[3], x[0]),
    "a view and an expression of it": lambda x: (x[1], x[1] * 2.0, torch.sin(x[2]), x[1]),
    "views of a matrix": lambda x: (x[1, 2], x[0, 0], x[1, 0], x[0, 1]),
}


def _views_circuit(views):
    @qml.qnode(_device(), interface="torch", diff_method="adjoint")
    def circuit(x, y):
        a, b, c, d = views(x)
        qml.RX(a, wires=0)
        qml.RY(b, wires=1)
        qml.CRZ(c, wires=[1, 2])
        qml.IsingXX(d, wires=[0, 2])
        qml.RZ(y[1], wires=2)
        qml.CNOT([2, 0])
        return qml.expval(qml.Z(0) @ qml.Y(2)), qml.probs(wires=[1, 2])

    return circuit


@pytest.mark.parametrize("views", [None, "a view and an expression of it"])
def test_a_second_derivative_is_refused_by_name(views):
    """Also where the gate parameters are expressions of the inputs (torch differentiates
    those twice; the circuit's second derivatives it cannot: refused, never partial)."""
    circuit = _angles_circuit() if views is None else _views_circuit(_VIEWS[views])
    compiled = pennylane_custatevec.compile(circuit)
    for x in _rows(3, 3, 3 if views is None else 4):
        args = (x,) if views is None else (x, _t([0.1, 0.2]))
        expval, _ = compiled(*args)
        (gradient,) = torch.autograd.grad(expval, x, create_graph=True)
        with pytest.raises(RuntimeError, match="first derivatives only"):
            torch.autograd.grad(gradient.sum(), x)


@pytest.mark.parametrize("views", list(_VIEWS), ids=list(_VIEWS))
def test_argument_views_as_gate_parameters_equal_the_qnode(views):
    circuit = _views_circuit(_VIEWS[views])
    compiled = pennylane_custatevec.compile(circuit)
    shape = (2, 3) if views == "views of a matrix" else (4,)
    for x, y in zip(_rows(4, 4, shape), _rows(5, 4, 2), strict=True):
        assert_same_call(compiled, circuit, x, y)
    assert list(compiled.modes().values()) == ["REPLAY"]
    (entry,) = compiled._entries.values()
    assert any(index is not None for _, index in entry.replay.plan.sources)


@pytest.mark.parametrize("views", list(_VIEWS), ids=list(_VIEWS))
def test_argument_views_under_batched_backward_passes(views):
    """Legacy vmap (``jacobian(..., vectorize=True)``) and torch.func (``jacrev``): the
    views' gradients stacked or scattered with the batch axis first."""
    circuit = _views_circuit(_VIEWS[views])
    compiled = pennylane_custatevec.compile(circuit)
    shape = (2, 3) if views == "views of a matrix" else (4,)
    x, y = _rows(6, 1, shape)[0], _rows(7, 1, 2)[0]
    for _ in range(3):  # recorded, traced, traced again: replays from here on
        compiled(x, y)
    assert list(compiled.modes().values()) == ["REPLAY"]

    def flat(function):
        return lambda u, v: torch.cat([r.reshape(-1) for r in function(u, v)])

    expected = torch.autograd.functional.jacobian(flat(circuit), (x, y))
    legacy = torch.autograd.functional.jacobian(flat(compiled), (x, y), vectorize=True)
    functorch = torch.func.jacrev(flat(compiled), argnums=(0, 1))(x, y)
    for got in (legacy, functorch):
        for g, w in zip(got, expected, strict=True):
            torch.testing.assert_close(g, w, atol=1e-10, rtol=0)


def test_keyword_arguments_in_another_order_are_bound_by_name():
    @qml.qnode(_device(2), interface="torch", diff_method="adjoint")
    def circuit(a, b):
        qml.RX(a * 1.0, wires=0)
        qml.RY(b * 1.0, wires=1)
        qml.CNOT([0, 1])
        return qml.expval(qml.Z(0)), qml.expval(qml.Z(1))

    compiled = pennylane_custatevec.compile(circuit)
    values = _rows(8, 6, ())
    for a, b in [(values[0], values[1]), (values[2], values[3])]:
        assert_same_call(compiled, circuit, a=a, b=b)
    for _ in range(2):
        assert_same_call(compiled, circuit, b=values[4], a=values[5])
        assert_same_call(compiled, circuit, a=values[1], b=values[4])


def test_each_options_context_is_its_own_key(monkeypatch):
    seen = []
    original = CuStateVecDevice.vjp_structures

    def spy(self, run, cotangents, config=None):
        seen.append(self.options_in_force(config).grad_accumulation)
        return original(self, run, cotangents, config)

    monkeypatch.setattr(CuStateVecDevice, "vjp_structures", spy)
    circuit = _angles_circuit()
    compiled = pennylane_custatevec.compile(circuit)
    asked = ["deferred", "eager", "eager", "deferred", "eager", "deferred", "deferred"]
    for x, accumulation in zip(_rows(9, len(asked), 3), asked, strict=True):
        with options(grad_accumulation=accumulation):
            assert_same_call(compiled, circuit, x)
    assert seen == asked
    assert sorted(compiled.modes().values()) == ["REPLAY", "REPLAY"]


def _post_processing(circuit, *args):
    tape = qml.workflow.construct_tape(circuit)(*args)
    config = qml.workflow.construct_execution_config(circuit)(*args)
    return circuit.device.preprocess_transforms(config)((tape,))[1]


def test_post_processing_is_skipped_only_where_it_passes_results_through():
    circuit = _angles_circuit()
    plain = _post_processing(circuit, _rows(10, 1, 3)[0])
    assert compiled_replay._passes_through(plain)
    # a broadcast trainable parameter: the device expands the tape into one per row, its
    # post-processing stacks the rows' results
    assert not compiled_replay._passes_through(_post_processing(circuit, _rows(11, 1, (3, 2))[0]))
    assert not compiled_replay._passes_through(lambda results: results)

    stack = plain.keywords["postprocessing_stack"]
    first = stack[0].keywords["individual_fns"][0]
    for fns, slices in [
        ([first], [slice(0, 2)]),
        ([lambda results: results[0]], [slice(0, 1)]),
        ([first], [0]),
    ]:
        stage = functools.partial(
            compiled_replay._batch_postprocessing, individual_fns=fns, slices=slices
        )
        changed = functools.partial(plain.func, postprocessing_stack=[*stack, stage])
        assert not compiled_replay._passes_through(changed)
    same = functools.partial(plain.func, postprocessing_stack=[*stack, stack[0]])
    assert compiled_replay._passes_through(same)
