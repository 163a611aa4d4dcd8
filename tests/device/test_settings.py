"""The device's differentiation options and their context-local overrides.

``grad_accumulation`` and ``fusion_qubits`` are validated when the device or an
``options(...)`` override is built; overrides apply to a block (``with``) or a call
(decorator), nest, restore on exit (errors included), stay in their thread or asyncio
task, and are recorded in the execution config, so that a backward pass run later uses
the options of its forward pass.
"""

from __future__ import annotations

import asyncio
import sys
import threading

import numpy as np
import pennylane as qml
import pytest
import torch
from pennylane.devices import ExecutionConfig
from spies import calls, swept_batches

import pennylane_custatevec
import pennylane_custatevec.fused_units
import pennylane_custatevec.fusion
import pennylane_custatevec.gradients.deferred
import pennylane_custatevec.gradients.eager
from pennylane_custatevec import options
from pennylane_custatevec.backends import CPUBackend, CuStateVecBackend
from pennylane_custatevec.preprocess.config import ADJOINT_VALIDATED_IN_PREPROCESSING
from pennylane_custatevec.settings import DifferentiationOptions

CPU_DEFAULT = DifferentiationOptions("deferred", CPUBackend.fusion_traits.default_width)
THREADS_INHERIT_CONTEXT = bool(getattr(sys.flags, "thread_inherit_context", 0))
"""Python 3.14 can start threads in a copy of the caller's context (off by default on
the GIL build): then a thread started inside a block sees its overrides."""


def cpu_device(**kwargs):
    return qml.device("custatevec.qubit", wires=3, backend="cpu", **kwargs)


def in_force(dev):
    return dev.options_in_force()


# ---------------------------------------------------------------------------------------
# 1. Validation


def test_defaults():
    assert CPUBackend.fusion_traits.default_width == 2
    assert in_force(cpu_device()) == CPU_DEFAULT
    assert in_force(cpu_device()).as_device_options() == {
        "grad_accumulation": "deferred",
        "fusion_qubits": 2,
    }


def test_custatevec_default_fusion(gpu_double):
    dev = qml.device("custatevec.qubit", wires=3, backend="custatevec")
    default_width = CuStateVecBackend.fusion_traits.default_width
    assert in_force(dev) == DifferentiationOptions("deferred", default_width)
    assert default_width == 4


@pytest.mark.parametrize("k", range(7))
@pytest.mark.parametrize("mode", ["deferred", "eager"])
def test_valid_device_options(mode, k):
    dev = cpu_device(grad_accumulation=mode, fusion_qubits=k)
    assert in_force(dev) == DifferentiationOptions(mode, k)


@pytest.mark.parametrize("value", ["lazy", "Eager", "", None, 0, True])
def test_invalid_grad_accumulation(value):
    with pytest.raises(ValueError, match=r"choose one of 'deferred', 'eager'") as info:
        cpu_device(grad_accumulation=value)
    assert f"grad_accumulation={value!r} is not valid" in str(info.value)


@pytest.mark.parametrize("value", [-1, 7, 2.0, True, False, "2", np.float64(3.0)])
def test_invalid_fusion_qubits(value):
    with pytest.raises(ValueError, match=r"use an int from 0 to 6") as info:
        cpu_device(fusion_qubits=value)
    assert f"fusion_qubits={value!r} is not valid" in str(info.value)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"fusion": 3}, r"unknown option\(s\) \['fusion'\]"),
        ({"grad_accumulation": "eager", "c_dtype": np.complex64}, r"\['c_dtype'\]"),
        ({"grad_accumulation": "lazy"}, r"choose one of 'deferred', 'eager'"),
        ({"fusion_qubits": 7}, r"use an int from 0 to 6"),
        ({"fusion_qubits": -1}, r"use an int from 0 to 6"),
        ({"fusion_qubits": 2.0}, r"use an int from 0 to 6"),
        ({"fusion_qubits": True}, r"use an int from 0 to 6"),
    ],
)
def test_invalid_overrides_fail_when_built(values, message):
    with pytest.raises(ValueError, match=message) as info:
        options(**values)
    if "unknown" in message:
        assert "fusion_qubits, grad_accumulation" in str(info.value)


def test_repr():
    assert repr(options(grad_accumulation="eager", fusion_qubits=3)) == (
        "pennylane_custatevec.options(grad_accumulation='eager', fusion_qubits=3)"
    )


# ---------------------------------------------------------------------------------------
# 2. The context manager


def test_block_overrides_and_restores():
    dev = cpu_device()
    with options(grad_accumulation="eager") as entered:
        assert isinstance(entered, options)
        assert in_force(dev) == DifferentiationOptions("eager", 2)
    assert in_force(dev) == CPU_DEFAULT


def test_overrides_apply_to_every_device():
    devs = [cpu_device(), cpu_device(grad_accumulation="eager", fusion_qubits=5)]
    with options(fusion_qubits=0):
        assert [in_force(d) for d in devs] == [
            DifferentiationOptions("deferred", 0),
            DifferentiationOptions("eager", 0),
        ]
    assert in_force(devs[1]) == DifferentiationOptions("eager", 5)


def test_empty_override_changes_nothing():
    dev = cpu_device(fusion_qubits=4)
    with options():
        assert in_force(dev) == DifferentiationOptions("deferred", 4)


def test_nesting():
    dev = cpu_device()
    with options(grad_accumulation="eager", fusion_qubits=5):
        with options(fusion_qubits=3):  # the outer grad_accumulation stays
            assert in_force(dev) == DifferentiationOptions("eager", 3)
            with options(grad_accumulation="deferred"):
                assert in_force(dev) == DifferentiationOptions("deferred", 3)
            assert in_force(dev) == DifferentiationOptions("eager", 3)
        assert in_force(dev) == DifferentiationOptions("eager", 5)
    assert in_force(dev) == CPU_DEFAULT


def test_same_object_reentered():
    dev = cpu_device()
    eager = options(grad_accumulation="eager")
    with eager:
        with options(grad_accumulation="deferred", fusion_qubits=5):
            with eager:
                assert in_force(dev) == DifferentiationOptions("eager", 5)
                with eager:
                    assert in_force(dev) == DifferentiationOptions("eager", 5)
                assert in_force(dev) == DifferentiationOptions("eager", 5)
            assert in_force(dev) == DifferentiationOptions("deferred", 5)
        assert in_force(dev) == DifferentiationOptions("eager", 2)
    assert in_force(dev) == CPU_DEFAULT
    with eager:  # and again after it was left
        assert in_force(dev) == DifferentiationOptions("eager", 2)
    assert in_force(dev) == CPU_DEFAULT


def test_exception_in_block_restores():
    dev = cpu_device()
    with options(fusion_qubits=6):
        with pytest.raises(RuntimeError, match="inside"):
            with options(grad_accumulation="eager", fusion_qubits=1):
                assert in_force(dev) == DifferentiationOptions("eager", 1)
                raise RuntimeError("inside")
        assert in_force(dev) == DifferentiationOptions("deferred", 6)
    assert in_force(dev) == CPU_DEFAULT


# ---------------------------------------------------------------------------------------
# 3. The decorator


def test_decorated_function():
    dev = cpu_device()

    @options(grad_accumulation="eager", fusion_qubits=4)
    def read(extra=None):
        return in_force(dev), extra

    assert in_force(dev) == CPU_DEFAULT
    assert read(extra=1) == (DifferentiationOptions("eager", 4), 1)
    assert in_force(dev) == CPU_DEFAULT
    with options(fusion_qubits=0):
        assert read()[0] == DifferentiationOptions("eager", 4)  # the decorator is inner
        assert in_force(dev) == DifferentiationOptions("deferred", 0)
    assert read()[0] == DifferentiationOptions("eager", 4)  # called again


def test_decorated_function_that_raises():
    dev = cpu_device()

    @options(fusion_qubits=5)
    def fail():
        assert in_force(dev).fusion_qubits == 5
        raise KeyError("raised")

    with pytest.raises(KeyError):
        fail()
    assert in_force(dev) == CPU_DEFAULT


def test_decorated_recursive_function():
    dev = cpu_device()
    seen = []

    @options(grad_accumulation="eager")
    def recurse(depth):
        seen.append(in_force(dev))
        if depth:
            with options(fusion_qubits=depth):
                recurse(depth - 1)
                seen.append(in_force(dev))

    recurse(2)
    assert seen == [
        DifferentiationOptions("eager", 2),
        DifferentiationOptions("eager", 2),  # the decorator sets grad_accumulation only
        DifferentiationOptions("eager", 1),
        DifferentiationOptions("eager", 1),
        DifferentiationOptions("eager", 2),
    ]
    assert in_force(dev) == CPU_DEFAULT


def _circuit(w):
    qml.Hadamard(0)
    qml.RX(w[0], wires=0)
    qml.CNOT([0, 1])
    qml.CRY(w[1], wires=[1, 2])
    qml.IsingXX(w[2], wires=[2, 0])
    return qml.expval(qml.Z(2) @ qml.X(0))


def _weights():
    return torch.tensor([0.3, -0.8, 1.2], dtype=torch.float64, requires_grad=True)


@pytest.fixture
def spies(mocker, monkeypatch):
    # these tests watch the options reach fusion and the sweeps gate by gate: a small
    # circuit of a known structure would otherwise run as one gate sequence (sequences.py)
    monkeypatch.setattr(CPUBackend, "sequence_amplitudes", 0)
    mod = pennylane_custatevec
    return {
        "fuse": mocker.spy(mod.fused_units, "fuse"),
        "eager_vjp": mocker.spy(mod.gradients.eager, "vjp"),
        "deferred_vjps": mocker.spy(mod.gradients.deferred, "vjps"),
        "eager_jacobian": mocker.spy(mod.gradients.eager, "jacobian"),
        "deferred_jacobians": mocker.spy(mod.gradients.deferred, "jacobians"),
        "sweep": mocker.spy(mod.gradients.deferred, "sweep"),
    }


def _fusion_used(spy):
    """The widths the calls fused with: a plan of width 0 or 1 fuses nothing (each step a
    unit of its own; the forward pass plans it to keep it for the sweep)."""
    return [call["max_qubits"] for call in calls(spy) if call["max_qubits"] > 1]


def test_decorated_qnode_calling_function(spies):
    dev = cpu_device()
    qnode = qml.QNode(_circuit, dev, interface="torch", diff_method="adjoint", device_vjp=True)

    @options(grad_accumulation="eager", fusion_qubits=3)
    def loss(w):
        assert in_force(dev) == DifferentiationOptions("eager", 3)
        return qnode(w)

    w = _weights()
    loss(w).backward()  # the backward pass runs outside the call
    assert _fusion_used(spies["fuse"]) == [3]
    assert spies["eager_vjp"].call_count == 1 and spies["deferred_vjps"].call_count == 0

    v = _weights()
    qnode(v).backward()  # outside: the device's own options
    assert _fusion_used(spies["fuse"]) == [3, 2]
    assert spies["eager_vjp"].call_count == 1 and spies["deferred_vjps"].call_count == 1
    np.testing.assert_allclose(w.grad.numpy(), v.grad.numpy(), atol=1e-10, rtol=0)


def test_decorated_qnode(spies):
    """The override object applied to a QNode itself: its forward and its backward (run
    after the call returned) use the override."""
    dev = cpu_device()
    qnode = qml.QNode(_circuit, dev, interface="torch", diff_method="adjoint", device_vjp=True)
    decorated = options(grad_accumulation="eager", fusion_qubits=3)(qnode)
    w = _weights()
    decorated(w).backward()
    assert _fusion_used(spies["fuse"]) == [3]
    assert spies["eager_vjp"].call_count == 1 and spies["deferred_vjps"].call_count == 0
    assert in_force(dev) == DifferentiationOptions("deferred", 2)
    v = _weights()
    qnode(v).backward()
    np.testing.assert_allclose(w.grad.numpy(), v.grad.numpy(), atol=1e-10, rtol=0)


# ---------------------------------------------------------------------------------------
# 4. Threads and asyncio tasks


def _join(threads):
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()


def test_thread_started_in_block_does_not_see_the_override():
    dev = cpu_device()
    seen = {}
    with options(grad_accumulation="eager", fusion_qubits=5):
        _join([threading.Thread(target=lambda: seen.update(thread=in_force(dev)))])
        seen["block"] = in_force(dev)
    overridden = DifferentiationOptions("eager", 5)
    assert seen["block"] == overridden
    assert seen["thread"] == (overridden if THREADS_INHERIT_CONTEXT else CPU_DEFAULT)


def test_threads_each_see_their_own_override():
    dev = cpu_device()
    barrier = threading.Barrier(2, timeout=30)
    seen, errors = {}, []

    def worker(name, values):
        try:
            with options(**values):
                barrier.wait()  # both are inside their blocks
                seen[name] = in_force(dev)
                barrier.wait()  # both have read
            seen[f"{name} after"] = in_force(dev)
        except Exception as error:  # noqa: BLE001 - reported in the main thread
            errors.append(error)
            barrier.abort()

    with options(fusion_qubits=1):  # the main thread's override reaches neither
        _join(
            [
                threading.Thread(target=worker, args=("a", {"grad_accumulation": "eager"})),
                threading.Thread(target=worker, args=("b", {"fusion_qubits": 6})),
            ]
        )
        assert in_force(dev) == DifferentiationOptions("deferred", 1)
    assert errors == []
    assert seen == {
        "a": DifferentiationOptions("eager", 2),
        "b": DifferentiationOptions("deferred", 6),
        "a after": CPU_DEFAULT,
        "b after": CPU_DEFAULT,
    }


def test_one_object_entered_by_two_threads():
    """Each entry keeps its own token: one thread leaving does not end the other's."""
    dev = cpu_device()
    shared = options(grad_accumulation="eager", fusion_qubits=4)
    entered, a_left = threading.Barrier(2, timeout=30), threading.Barrier(2, timeout=30)
    seen, errors = {}, []

    def first():
        try:
            with shared:
                entered.wait()
            seen["a after"] = in_force(dev)
            a_left.wait()
        except Exception as error:  # noqa: BLE001
            errors.append(error)
            entered.abort()
            a_left.abort()

    def second():
        try:
            with shared:
                entered.wait()
                a_left.wait()  # the first thread has left its block
                seen["b"] = in_force(dev)
            seen["b after"] = in_force(dev)
        except Exception as error:  # noqa: BLE001
            errors.append(error)
            entered.abort()
            a_left.abort()

    _join([threading.Thread(target=first), threading.Thread(target=second)])
    assert errors == []
    assert seen == {
        "a after": CPU_DEFAULT,
        "b": DifferentiationOptions("eager", 4),
        "b after": CPU_DEFAULT,
    }
    assert in_force(dev) == CPU_DEFAULT


def test_asyncio_tasks_each_see_their_own_override():
    dev = cpu_device()
    seen = {}

    async def task(name, values, barrier):
        with options(**values):
            await barrier.wait()  # both tasks are inside their blocks
            seen[name] = in_force(dev)
            await barrier.wait()
        seen[f"{name} after"] = in_force(dev)

    async def main():
        barrier = asyncio.Barrier(2)
        await asyncio.gather(
            task("a", {"grad_accumulation": "eager"}, barrier),
            task("b", {"fusion_qubits": 0}, barrier),
        )

    asyncio.run(main())
    assert seen == {
        "a": DifferentiationOptions("eager", 2),
        "b": DifferentiationOptions("deferred", 0),
        "a after": CPU_DEFAULT,
        "b after": CPU_DEFAULT,
    }


# ---------------------------------------------------------------------------------------
# 5. Execution configs: recorded in the forward, used by the backward


def test_setup_execution_config_records_the_options():
    dev = cpu_device(fusion_qubits=5)
    assert dev.setup_execution_config().device_options == {
        "grad_accumulation": "deferred",
        "fusion_qubits": 5,
    }
    with options(grad_accumulation="eager"):
        config = dev.setup_execution_config(ExecutionConfig(gradient_method="adjoint"))
    assert config.device_options == {
        "grad_accumulation": "eager",
        "fusion_qubits": 5,
        ADJOINT_VALIDATED_IN_PREPROCESSING: True,  # its preprocessing validates
    }
    # the recorded options outlive the block
    assert dev.options_in_force(config) == DifferentiationOptions("eager", 5)
    with options(grad_accumulation="deferred", fusion_qubits=1):
        assert dev.options_in_force(config) == DifferentiationOptions("eager", 5)


def test_config_options_win_over_the_context():
    dev = cpu_device()
    given = ExecutionConfig(device_options={"grad_accumulation": "deferred"})
    with options(grad_accumulation="eager", fusion_qubits=4):
        config = dev.setup_execution_config(given)
        assert dev.options_in_force(given) == DifferentiationOptions("deferred", 4)
    assert config.device_options == {"grad_accumulation": "deferred", "fusion_qubits": 4}
    assert given.device_options == {"grad_accumulation": "deferred"}  # not changed


@pytest.mark.parametrize(
    "device_options, message",
    [
        ({"grad_accumulation": "lazy"}, "choose one of 'deferred', 'eager'"),
        ({"fusion_qubits": 9}, "use an int from 0 to 6"),
    ],
)
def test_invalid_config_options(device_options, message):
    dev = cpu_device()
    with pytest.raises(ValueError, match=message):
        dev.setup_execution_config(ExecutionConfig(device_options=device_options))


@pytest.mark.parametrize(
    "device_mode, forward_mode", [("deferred", "eager"), ("eager", "deferred")]
)
def test_backward_uses_the_forward_options(device_mode, forward_mode, spies):
    dev = cpu_device(grad_accumulation=device_mode)
    qnode = qml.QNode(_circuit, dev, interface="torch", diff_method="adjoint", device_vjp=True)
    w = _weights()
    with options(grad_accumulation=forward_mode, fusion_qubits=3):
        out = qnode(w)
    with options(grad_accumulation=device_mode, fusion_qubits=1):  # ignored by the backward
        out.backward()
    eager_calls = spies["eager_vjp"].call_count
    deferred_calls = spies["deferred_vjps"].call_count
    assert (eager_calls, deferred_calls) == ((1, 0) if forward_mode == "eager" else (0, 1))
    if forward_mode == "deferred":
        (sweep,) = calls(spies["sweep"])
        assert sweep["fusion_qubits"] == 3  # the forward's
    assert _fusion_used(spies["fuse"]) == [3]

    reference = _weights()
    qml.QNode(_circuit, qml.device("default.qubit", wires=3), diff_method="backprop")(
        reference
    ).backward()
    np.testing.assert_allclose(w.grad.numpy(), reference.grad.numpy(), atol=1e-10, rtol=0)


@pytest.mark.parametrize("forward_mode", ["eager", "deferred"])
def test_jacobian_in_the_backward_uses_the_forward_options(forward_mode, spies):
    """With grad_on_execution=False the Jacobian is computed in the backward pass."""
    dev = cpu_device(grad_accumulation="eager" if forward_mode == "deferred" else "deferred")
    qnode = qml.QNode(
        _circuit,
        dev,
        interface="torch",
        diff_method="adjoint",
        device_vjp=False,
        grad_on_execution=False,
    )
    w = _weights()
    with options(grad_accumulation=forward_mode):
        out = qnode(w)
    assert spies["eager_jacobian"].call_count == spies["deferred_jacobians"].call_count == 0
    out.backward()
    calls = (spies["eager_jacobian"].call_count, spies["deferred_jacobians"].call_count)
    assert calls == ((1, 0) if forward_mode == "eager" else (0, 1))


def test_forward_preprocessing_follows_the_override(spies):
    """A broadcast of three: the eager mode expands it into three tapes, the deferred mode
    differentiates it as one batch."""
    dev = cpu_device()

    def circuit(x, w):
        qml.RY(x, wires=0)
        qml.CNOT([0, 1])
        qml.CRX(w, wires=[1, 2])
        return qml.expval(qml.Z(2))

    x = torch.tensor([0.2, -0.9, 1.4], dtype=torch.float64)
    qnode = qml.QNode(circuit, dev, interface="torch", diff_method="adjoint", device_vjp=True)
    w = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    with options(grad_accumulation="eager"):
        out = qnode(x, w)
    out.sum().backward()
    assert spies["eager_vjp"].call_count == 3 and spies["deferred_vjps"].call_count == 0
    v = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    qnode(x, v).sum().backward()
    assert spies["deferred_vjps"].call_count == 1
    assert swept_batches(spies["sweep"]) == [(3, 1)]  # one sweep of the three entries
    np.testing.assert_allclose(w.grad.numpy(), v.grad.numpy(), atol=1e-10, rtol=0)


# ---------------------------------------------------------------------------------------
# 6. fusion_qubits reaches the forward pass


@pytest.mark.parametrize(
    "device_k, override, expected",
    [
        (None, None, [2]),
        (None, 3, [3]),
        (None, 6, [6]),
        (None, 1, []),  # 0 or 1: gate by gate, nothing fused
        (5, 0, []),
        (0, 4, [4]),
        (4, None, [4]),
    ],
)
def test_fusion_qubits_reaches_the_forward(device_k, override, expected, spies):
    kwargs = {} if device_k is None else {"fusion_qubits": device_k}
    dev = cpu_device(**kwargs)
    w = np.array([0.3, -0.8, 1.2])
    if override is None:
        value = qml.QNode(_circuit, dev)(w)
    else:
        with options(fusion_qubits=override):
            value = qml.QNode(_circuit, dev)(w)
    assert _fusion_used(spies["fuse"]) == expected
    reference = qml.QNode(_circuit, qml.device("default.qubit", wires=3))(w)
    np.testing.assert_allclose(value, reference, atol=1e-10, rtol=0)
