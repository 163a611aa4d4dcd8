"""The forward-to-backward hand-off (issue 15, item 1): ``execution.run_tapes`` returns a
``RunResult`` whose ``KeptState``s (final state, compilation, fused plan) the device
hands to the adjoint sweeps; the sweep walks back the forward pass's fused plan where it
fits and plans again where it does not; no plan is shared through module state."""

from __future__ import annotations

import threading

import numpy as np
import pennylane as qml
import pytest
from conftest import stable_seed
from pennylane.devices import ExecutionConfig
from pennylane.tape import QuantumScript
from spies import calls

import pennylane_custatevec.gradients.deferred
import pennylane_custatevec.runs
from pennylane_custatevec import execution, fused_units, fusion, options, simulate
from pennylane_custatevec.backends.cpu import CPUBackend
from pennylane_custatevec.compile_tapes import compile_steps
from pennylane_custatevec.kept import KeptState
from pennylane_custatevec.program import flatten

WIRES = 4
ATOL = 1e-10
ADJOINT = ExecutionConfig(gradient_method="adjoint")


def layered_tape(angles, entangler=qml.CNOT, measurements=None) -> QuantumScript:
    """Rotations on every wire, a ring of two-qubit gates, and a trainable IsingXX."""
    ops = [qml.Hadamard(0)]
    ops += [qml.RX(angles[w], wires=w) for w in range(WIRES)]
    ops += [entangler(wires=[w, (w + 1) % WIRES]) for w in range(WIRES)]
    ops += [qml.CRY(angles[WIRES], wires=[1, 3]), qml.IsingXX(angles[WIRES + 1], wires=[3, 0])]
    measurements = measurements or [qml.expval(qml.Z(2)), qml.expval(qml.X(0) @ qml.Y(1))]
    return QuantumScript(ops, measurements, trainable_params=list(range(1, WIRES + 2)))


def random_angles(*seed) -> np.ndarray:
    return np.random.default_rng(stable_seed(*seed)).uniform(-np.pi, np.pi, WIRES + 2)


def reference_vjp(tape: QuantumScript, dy) -> tuple:
    (vjp,) = qml.device("default.qubit").compute_vjp([tape], [dy], ADJOINT)
    return vjp


def custatevec_device(k: int, mode: str = "deferred"):
    return qml.device(
        "custatevec.qubit", wires=WIRES, backend="cpu", grad_accumulation=mode, fusion_qubits=k
    )


@pytest.fixture
def plans(mocker, monkeypatch):
    """The block widths of the fused plans made (``fused_units.fuse`` plans; reuse does not).
    Small circuits of a known structure run as one gate sequence (and, measuring Pauli
    expvals, directly) without a fused plan: off here, the plans are what is tested."""
    monkeypatch.setattr(CPUBackend, "sequence_amplitudes", 0)
    spy = mocker.spy(fused_units, "fuse")

    class Plans:
        @staticmethod
        def widths() -> list[int]:
            return [call["max_qubits"] for call in calls(spy)]

    return Plans


# ---------------------------------------------------------------------------------------
# 1. run_tapes returns its results and the kept states


def test_run_tapes_returns_kept_states():
    """Two tapes of one structure run as one batch (their kept states have no plan: the
    batch's plan is of the merged data), a tape of another structure alone (its kept state
    holds its plan, of its own compilation, for the width it was fused with), a tape with
    shots is sampled and keeps nothing. Each kept state is that tape's final state."""
    backend = CPUBackend()
    tapes = [
        layered_tape(random_angles("kept", 0)),
        layered_tape(random_angles("kept", 1), entangler=qml.CZ),
        layered_tape(random_angles("kept", 2)),
        QuantumScript([qml.RX(0.4, wires=0)], [qml.sample(wires=0)], shots=5),
    ]
    rng = np.random.default_rng(stable_seed("kept-run"))
    run = execution.run_tapes(backend, tapes, None, rng, keep=True, fusion_qubits=3)
    assert isinstance(run, execution.RunResult)
    assert len(run.results) == 4 and run.results[3].shape == (5, 1)
    assert sorted(run.kept) == [0, 1, 2]
    for index, kept in run.kept.items():
        assert isinstance(kept, KeptState)
        assert kept.compilation.register.wires.labels == tuple(range(WIRES))
        assert len(kept.compilation.steps) == len(tapes[index].operations)
        fresh, _ = simulate.final_state(backend, flatten(compile_steps(tapes[index], None)))
        np.testing.assert_allclose(
            backend.to_host(kept.state), backend.to_host(fresh), atol=ATOL, rtol=0
        )
        expected = qml.device("default.qubit").execute(tapes[index])
        np.testing.assert_allclose(run.results[index], expected, atol=ATOL, rtol=0)
    assert run.kept[0].plan is None and run.kept[2].plan is None  # batched together
    plan = run.kept[1].plan
    assert plan is not None and plan.compilation is run.kept[1].compilation
    assert plan.width == 3 and plan.traits == backend.fusion_traits
    replanned = fused_units.fuse(run.kept[1].compilation, 3, backend.fusion_traits)
    assert [fused.unit for fused in plan.units] == [fused.unit for fused in replanned]
    assert any(
        isinstance(fused.unit, fusion.Block) and len(fused.unit.members) > 1 for fused in plan.units
    )  # a block of several operations


def test_run_tapes_keeps_nothing_unless_asked():
    backend = CPUBackend()
    tapes = [layered_tape(random_angles("unkept", 0))]
    rng = np.random.default_rng(stable_seed("unkept"))
    run = execution.run_tapes(backend, tapes, None, rng, fusion_qubits=3)
    assert run.kept == {}
    expected = qml.device("default.qubit").execute(tapes[0])
    np.testing.assert_allclose(run.results[0], expected, atol=ATOL, rtol=0)


def test_run_tapes_without_fusion_keeps_the_plan_of_one_unit_per_step():
    """Kept, the forward pass's plan of width 1 (each step a unit of its own) travels to
    the sweep, which then plans nothing again."""
    backend = CPUBackend()
    tapes = [layered_tape(random_angles("no-fusion", 0))]
    rng = np.random.default_rng(stable_seed("no-fusion"))
    run = execution.run_tapes(backend, tapes, None, rng, keep=True, fusion_qubits=1)
    plan = run.kept[0].plan
    assert plan.width == 1 and plan.compilation is run.kept[0].compilation
    assert all(
        isinstance(fused.unit, fusion.Single) or len(fused.unit.members) == 1
        for fused in plan.units
    )
    assert len(plan.units) == len(plan.compilation.steps)


def test_a_kept_plan_belongs_to_the_kept_compilation():
    backend = CPUBackend()
    first, second = (compile_steps(layered_tape(random_angles("owner", i)), None) for i in range(2))
    plan = fused_units.fused_plan(first, 3, backend.fusion_traits)
    state, _ = simulate.final_state(backend, plan.program)
    assert KeptState(state, first, plan).plan is plan
    with pytest.raises(ValueError, match="belongs to the kept compilation"):
        KeptState(state, second, plan)


# ---------------------------------------------------------------------------------------
# 2. The sweep starts from the kept state and walks back the kept plan


@pytest.mark.parametrize("derivative", ["vjp", "jacobian"])
def test_the_sweep_reuses_the_kept_compilation_and_plan(derivative, plans, mocker):
    """Forward then backward with the same fusion width: the sweep gets the compilation
    object that run_tapes kept, and no second plan is made (one plan in all, the
    forward's)."""
    dev = custatevec_device(3)
    run_tapes = mocker.spy(pennylane_custatevec.runs, "run_tapes")
    sweep = mocker.spy(pennylane_custatevec.gradients.deferred, "sweep")
    tape = layered_tape(random_angles("reuse", derivative))
    dev.execute([tape], ADJOINT)
    kept = run_tapes.spy_return.kept[0]
    assert kept.plan is not None and kept.plan.width == 3
    if derivative == "vjp":
        dy = (0.7, -1.3)
        (result,) = dev.compute_vjp([tape], [dy], ADJOINT)
        expected = reference_vjp(tape, dy)
    else:
        (result,) = dev.compute_derivatives([tape], ADJOINT)
        (expected,) = qml.device("default.qubit").compute_derivatives([tape], ADJOINT)
    (call,) = calls(sweep)
    assert call["compilation"] is kept.compilation
    assert call["plan"] is kept.plan
    assert plans.widths() == [3]  # the forward's plan only
    np.testing.assert_allclose(np.array(result), np.array(expected), atol=ATOL, rtol=0)


def test_without_a_kept_state_the_sweep_plans_itself(plans):
    """A VJP with no execution before it: the sweep simulates and plans on its own."""
    dev = custatevec_device(3)
    tape = layered_tape(random_angles("unkept-sweep"))
    dy = (0.2, 0.9)
    (result,) = dev.compute_vjp([tape], [dy], ADJOINT)
    assert plans.widths() == [3]  # the sweep's own
    np.testing.assert_allclose(result, reference_vjp(tape, dy), atol=ATOL, rtol=0)


def test_a_batch_of_tapes_is_planned_again_for_the_merged_sweep(plans):
    """Two tapes of one structure: the forward plans their merged batch, whose plan no
    single tape keeps; the sweep plans its own merged batch (two plans in all)."""
    dev = custatevec_device(3)
    tapes = [layered_tape(random_angles("merged", i)) for i in range(2)]
    dys = [(0.5, -0.4), (1.1, 0.3)]
    dev.execute(tapes, ADJOINT)
    result = dev.compute_vjp(tapes, dys, ADJOINT)
    assert plans.widths() == [3, 3]
    for tape, dy, vjp in zip(tapes, dys, result, strict=True):
        np.testing.assert_allclose(vjp, reference_vjp(tape, dy), atol=ATOL, rtol=0)


def test_another_width_in_the_backward_plans_again(plans):
    """An options override between the forward and the backward: the sweep wants blocks
    of 2, the kept plan has blocks of 3, so the sweep plans again (and the gradient
    matches)."""
    dev = custatevec_device(3)
    tape = layered_tape(random_angles("override"))
    dy = (-0.6, 0.8)
    dev.execute([tape], ADJOINT)
    with options(fusion_qubits=2):
        (result,) = dev.compute_vjp([tape], [dy], ADJOINT)
    assert plans.widths() == [3, 2]
    np.testing.assert_allclose(result, reference_vjp(tape, dy), atol=ATOL, rtol=0)


def test_the_eager_sweep_plans_nothing(plans):
    """The eager sweep runs gate by gate: the forward's plan is the only one."""
    dev = custatevec_device(3, mode="eager")
    tape = layered_tape(random_angles("eager"))
    dy = (0.4, 0.1)
    dev.execute([tape], ADJOINT)
    (result,) = dev.compute_vjp([tape], [dy], ADJOINT)
    assert plans.widths() == [3]
    np.testing.assert_allclose(result, reference_vjp(tape, dy), atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------
# 3. Context-local options in threads: each thread its own plans


def test_no_module_level_plan_cache():
    """Fusion is stateless: no dict in its module namespace holds plans (the plans of
    unit bits are ``functools.lru_cache``s keyed by bits, not by object identity)."""
    held = [
        name
        for name, value in vars(fusion).items()
        if not name.startswith("__") and isinstance(value, (dict, list, set))
    ]
    assert held == []


def test_two_threads_with_other_fusion_widths_get_their_own_plans(plans):
    """Thread A (fusion_qubits=3) runs its forward pass, then thread B (fusion_qubits=2)
    its forward and backward, then A its backward (events order them): each backward
    walks back its own forward's plan (two plans in all, 3 then 2) and gets the right
    gradient."""
    tapes = {
        "A": layered_tape(random_angles("thread", 0)),
        "B": layered_tape(random_angles("thread", 1)),
    }
    dys = {"A": (0.3, -1.2), "B": (0.9, 0.5)}
    widths = {"A": 3, "B": 2}
    results, errors = {}, []
    a_forward_done, b_done = threading.Event(), threading.Event()

    def run(name: str, before_backward: threading.Event | None, after: threading.Event | None):
        try:
            dev = custatevec_device(4)  # the device's own width is neither thread's
            with options(fusion_qubits=widths[name]):
                dev.execute([tapes[name]], ADJOINT)
                if name == "A":
                    a_forward_done.set()
                if before_backward is not None:
                    assert before_backward.wait(timeout=60)
                (results[name],) = dev.compute_vjp([tapes[name]], [dys[name]], ADJOINT)
        except BaseException as error:  # reported in the main thread
            errors.append(error)
            a_forward_done.set()
        finally:
            if after is not None:
                after.set()

    thread_a = threading.Thread(target=run, args=("A", b_done, None), daemon=True)
    thread_b = threading.Thread(target=run, args=("B", None, b_done), daemon=True)
    thread_a.start()
    assert a_forward_done.wait(timeout=60)
    thread_b.start()
    thread_b.join(timeout=60)
    thread_a.join(timeout=60)
    assert not thread_a.is_alive() and not thread_b.is_alive()
    assert errors == []
    assert plans.widths() == [3, 2]
    for name in ("A", "B"):
        np.testing.assert_allclose(
            results[name], reference_vjp(tapes[name], dys[name]), atol=ATOL, rtol=0
        )


def _vjp_after_execute(tape_to_execute, tape_to_differentiate):
    dev = qml.device("custatevec.qubit", wires=2, backend="cpu")
    config = dev.setup_execution_config(
        ExecutionConfig(gradient_method="adjoint", use_device_jacobian_product=True)
    )
    dev.execute([tape_to_execute], config)
    return dev.compute_vjp([tape_to_differentiate], [np.array(1.0)], config)[0]


def _two_parameter_tape() -> QuantumScript:
    return QuantumScript(
        [qml.RX(0.4, 0), qml.RY(-0.9, 1), qml.CNOT([0, 1])],
        [qml.expval(qml.Z(1))],
        trainable_params=[0, 1],
    )


def test_the_executed_tape_object_reuses_its_key_only_while_it_is_unchanged():
    """``runs.KeptStates.structure_key_of``: the derivative after an execution takes the
    executed tape's structure key by identity; a tape changed in place since (its trainable
    parameters, its operations) gets its own key, so no other tape's state."""
    reference = _vjp_after_execute(_two_parameter_tape(), _two_parameter_tape())
    tape = _two_parameter_tape()
    np.testing.assert_allclose(_vjp_after_execute(tape, tape), reference, atol=1e-12, rtol=0)

    tape = _two_parameter_tape()
    dev = qml.device("custatevec.qubit", wires=2, backend="cpu")
    config = dev.setup_execution_config(
        ExecutionConfig(gradient_method="adjoint", use_device_jacobian_product=True)
    )
    dev.execute([tape], config)
    assert dev._runs.kept.structure_key_of(tape) is not None  # noqa: SLF001
    tape.trainable_params = [1]
    assert dev._runs.kept.structure_key_of(tape) is None  # noqa: SLF001
    (only_ry,) = dev.compute_vjp([tape], [np.array(1.0)], config)[0]
    np.testing.assert_allclose(only_ry, reference[1], atol=1e-12, rtol=0)
    tape._ops[0] = qml.RX(1.3, 0)  # noqa: SLF001  (a new operation object in place)
    assert dev._runs.kept.structure_key_of(tape) is None  # noqa: SLF001
