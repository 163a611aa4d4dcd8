"""Deferred gradient accumulation against the eager sweep.

``grad_accumulation="deferred"`` (fused blocks, one reduction per block, batched tapes,
one transfer per batch) must agree with ``"eager"`` (the textbook sweep) to round-off
(1e-10 at complex128) on every gate, every output kind, broadcast and mixed batches,
full Jacobians, the device API, memory chunks and the cuStateVec double; and its sweep
must not synchronise with the host but once.
"""

from __future__ import annotations

import dataclasses
import functools
import typing

import numpy as np
import pennylane as qml
import pytest
import torch
from adjoint_cases import (
    COMPOSITE,
    PARAMETRIZED,
    api_tape,
    assert_same_run,
    float64_tensor,
    gate_case,
    measurements_for,
    random_loss,
    real_vector,
    surrounding_circuit,
    torch_run,
)
from conftest import DEVICE, MIXED_WIRES, TOL, assert_allclose_nested, stable_seed
from pennylane.devices import ExecutionConfig
from pennylane.ops.functions import bind_new_parameters
from pennylane.tape import QuantumScript
from reference import random_hermitian, random_state
from spies import swept_batches

import pennylane_custatevec
import pennylane_custatevec.direct
import pennylane_custatevec.gradients.deferred
import pennylane_custatevec.gradients.eager
import pennylane_custatevec.gradients.fused_sweep
from pennylane_custatevec import fusion, simulate
from pennylane_custatevec.gradients import fused_sweep
from pennylane_custatevec.simulate import RunTooLargeError

ATOL = 1e-10
REF_ATOL = 1e-8
WIRES = MIXED_WIRES  # ["a", 3, "q1", 0, "z"]
W4 = WIRES[:4]
MODES = ("deferred", "eager")
VJP = pytest.mark.parametrize("device_vjp", [False, True], ids=["jacobian", "vjp"])

ALL_GATES = PARAMETRIZED + list(COMPOSITE)
FULL_FUSION_GATES = [
    "RX",
    "CRot",
    "IsingXY",
    "MultiRZ",
    "DoubleExcitation",
    "OrbitalRotation",
    "GlobalPhase",
    "ctrl_Rot_values10",
    "ctrl_GlobalPhase_value0",
    "adjoint_U3",
]
GATE_CASES = [
    pytest.param(name, k, id=f"{name}-k{k}")
    for name in ALL_GATES
    for k in ([1, 2, 3, 4, 5] if name in FULL_FUSION_GATES else [1, 3])
]


@pytest.fixture
def paths(mocker):
    """Spies on the deferred sweep and the eager one: ``paths.check(mode)`` asserts that
    the run since the last check took that mode's sweep only."""
    deferred_sweep = mocker.spy(pennylane_custatevec.gradients.deferred, "sweep")
    eager_sweep = mocker.spy(pennylane_custatevec.gradients.eager, "_sweep")

    class Paths:
        seen = [0, 0]

        @staticmethod
        def check(mode):
            counts = [deferred_sweep.call_count, eager_sweep.call_count]
            new = [now - before for now, before in zip(counts, Paths.seen, strict=True)]
            Paths.seen = counts
            assert new[0 if mode == "deferred" else 1] > 0, f"{mode}: its sweep did not run"
            assert new[1 if mode == "deferred" else 0] == 0, f"{mode}: the other sweep ran"

        deferred = deferred_sweep

    return Paths


def device(mode, k, wires=WIRES, backend="cpu"):
    return qml.device(DEVICE, wires=wires, backend=backend, grad_accumulation=mode, fusion_qubits=k)


def run_both_modes(
    circuit, values, seed, k, device_vjp, wires=WIRES, paths=None, trainable=None, backend="cpu"
):
    """{mode: torch_run(...)} on a deferred and an eager device; asserts they agree (and,
    with ``paths``, that each took its own sweep)."""
    runs = {}
    for mode in MODES:
        runs[mode] = torch_run(
            circuit,
            device(mode, k, wires, backend),
            values,
            seed,
            trainable,
            diff_method="adjoint",
            device_vjp=device_vjp,
        )
        if paths is not None:
            paths.check(mode)
    assert_same_run(runs["deferred"], runs["eager"], atol=ATOL)
    return runs


# ---------------------------------------------------------------------------------------
# 1. Every differentiable gate, twice in a random circuit


def gate_circuit(name, seed, outputs="expval_probs"):
    """The gate twice on random wires amid random layers; (circuit, parameter values)."""
    rng = np.random.default_rng(seed)
    ops = [gate_case(name, rng) for _ in range(2)]
    first, second = surrounding_circuit(rng)
    third, fourth = surrounding_circuit(rng)
    measurements = measurements_for(outputs, rng)
    if outputs == "probs":
        measurements = [qml.probs(wires=[WIRES[i] for i in rng.permutation(len(WIRES))[:3]])]
    sizes = [len(op.data) for op in ops]
    values = list(rng.uniform(-np.pi, np.pi, size=sum(sizes)))

    def circuit(*params):
        for o in first + second:
            qml.apply(o)
        qml.apply(bind_new_parameters(ops[0], params[: sizes[0]]))
        for o in third:
            qml.apply(o)
        qml.apply(bind_new_parameters(ops[1], params[sizes[0] :]))
        for o in fourth:
            qml.apply(o)
        return tuple(qml.apply(m) for m in measurements)

    return circuit, values


@VJP
@pytest.mark.parametrize("name, k", GATE_CASES)
def test_gate(name, k, device_vjp, paths):
    circuit, values = gate_circuit(name, stable_seed("deferred-gate", name))
    runs = run_both_modes(circuit, values, stable_seed("loss", name), k, device_vjp, paths=paths)
    grads = runs["eager"][1]
    assert len(grads) == len(values) > 0
    if name != "GlobalPhase":  # a global phase changes no expectation or probability
        assert max(np.abs(g).max() for g in grads) > 1e-3  # not trivially zero


@VJP
@pytest.mark.parametrize("k", [0, 6])
@pytest.mark.parametrize("name", ["CRot", "DoubleExcitation", "ctrl_IsingXX_value0"])
def test_gate_no_fusion_and_widest_blocks(name, k, device_vjp, paths):
    circuit, values = gate_circuit(name, stable_seed("deferred-gate-k", name))
    run_both_modes(circuit, values, stable_seed("loss", name), k, device_vjp, paths=paths)


# ---------------------------------------------------------------------------------------
# 2. State and probabilities outputs


@VJP
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("outputs", ["state", "probs"])
@pytest.mark.parametrize("name", ["RX", "CRot", "ctrl_RY_value0", "IsingXY", "GlobalPhase"])
def test_state_and_probs_outputs(name, outputs, k, device_vjp):
    circuit, values = gate_circuit(name, stable_seed("deferred-out", name, outputs), outputs)
    runs = run_both_modes(circuit, values, stable_seed("loss-out", name), k, device_vjp)
    out = runs["deferred"][0]
    if outputs == "state":
        assert np.iscomplexobj(out[0]) and np.shape(out[0]) == (2 ** len(WIRES),)
    else:
        assert np.shape(out[0]) == (8,)


@VJP
@pytest.mark.parametrize("k", [1, 3])
def test_state_preparation_first(k, device_vjp):
    """A prepared initial state (the program's initial state, not a gate)."""
    psi = random_state(len(WIRES), np.random.default_rng(stable_seed("deferred-prep")))
    gates, values = gate_circuit("CRot", stable_seed("deferred-prep-gates"))

    def circuit(*params):
        qml.StatePrep(psi, wires=WIRES)
        return gates(*params)

    run_both_modes(circuit, values, 41, k, device_vjp)


@VJP
@pytest.mark.parametrize("name", ["CRot", "IsingXY", "ctrl_Rot_values10"])
def test_complex64(name, device_vjp):
    circuit, values = gate_circuit(name, stable_seed("deferred-c64", name))
    runs = {}
    for mode in MODES:
        dev = qml.device(
            DEVICE,
            wires=WIRES,
            backend="cpu",
            c_dtype=np.complex64,
            grad_accumulation=mode,
            fusion_qubits=3,
        )
        runs[mode] = torch_run(
            circuit, dev, values, 43, diff_method="adjoint", device_vjp=device_vjp
        )
    assert_same_run(runs["deferred"], runs["eager"], atol=TOL[np.complex64])


# ---------------------------------------------------------------------------------------
# 3. Broadcast batches


def broadcast_circuit(x, weights, outputs="expval_probs"):
    qml.AngleEmbedding(x, wires=WIRES)
    qml.IsingXX(x[..., 0], wires=["z", 0])  # a broadcast gate on two wires
    qml.StronglyEntanglingLayers(weights, wires=WIRES)
    qml.CRX(weights[0, 0, 0], wires=["a", "q1"])
    if outputs == "state":
        return qml.state()
    if outputs == "expvals":  # the VJP's bras are built for the whole batch at once
        return qml.expval(qml.Z("a") @ qml.Z(3)), qml.expval(0.3 * qml.X("q1") - qml.Y("z"))
    return qml.expval(qml.Z("a") @ qml.Z(3)), qml.probs(wires=["q1", "z"])


def broadcast_values(seed, batch):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-np.pi, np.pi, size=(batch, len(WIRES)))
    return [x, rng.uniform(-np.pi, np.pi, size=(2, len(WIRES), 3))]


@VJP
@pytest.mark.parametrize("outputs", ["expval_probs", "expvals"])
@pytest.mark.parametrize("k", [1, 2, 5])
@pytest.mark.parametrize("x_trainable", [False, True], ids=["x_const", "x_trainable"])
def test_broadcast(x_trainable, k, outputs, device_vjp, paths, monkeypatch):
    # the general path's batching is tested: Pauli expvals of a known structure would run
    # tape by tape (direct.py), each in a few backend calls
    monkeypatch.setattr(pennylane_custatevec.direct, "plan_of", lambda backend, structure: None)
    values = broadcast_values(stable_seed("deferred-broadcast", x_trainable), 6)
    trainable = [x_trainable, True]
    circuit = functools.partial(broadcast_circuit, outputs=outputs)
    runs = run_both_modes(circuit, values, 17, k, device_vjp, paths=paths, trainable=trainable)
    # the six entries (a broadcast, or the tapes it expands into) sweep as one batch
    assert [batch for batch, _ in swept_batches(paths.deferred)] == [6]
    ref = qml.device("default.qubit", wires=WIRES)
    reference = torch_run(circuit, ref, values, 17, trainable, diff_method="backprop")
    assert_same_run(runs["deferred"], reference, atol=REF_ATOL)
    assert np.shape(runs["deferred"][0][1]) == ((6, 4) if outputs == "expval_probs" else (6,))
    assert (runs["deferred"][1][0] is None) is not x_trainable


@VJP
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("x_trainable", [False, True], ids=["x_const", "x_trainable"])
def test_broadcast_state(x_trainable, k, device_vjp):
    values = broadcast_values(stable_seed("deferred-broadcast-state", x_trainable), 4)

    def circuit(x, weights):
        return broadcast_circuit(x, weights, "state")

    trainable = [x_trainable, True]
    runs = run_both_modes(circuit, values, 5, k, device_vjp, trainable=trainable)
    ref = qml.device("default.qubit", wires=WIRES)
    reference = torch_run(circuit, ref, values, 5, trainable, diff_method="backprop")
    assert_same_run(runs["deferred"], reference, atol=REF_ATOL)
    assert np.shape(runs["deferred"][0]) == (4, 2 ** len(WIRES))


@VJP
@pytest.mark.parametrize("x_trainable", [False, True], ids=["x_const", "x_trainable"])
def test_broadcast_of_one_entry(x_trainable, device_vjp):
    values = broadcast_values(stable_seed("deferred-broadcast-one", x_trainable), 1)
    trainable = [x_trainable, True]
    runs = run_both_modes(broadcast_circuit, values, 9, 3, device_vjp, trainable=trainable)
    ref = qml.device("default.qubit", wires=WIRES)
    reference = torch_run(broadcast_circuit, ref, values, 9, trainable, diff_method="backprop")
    assert_same_run(runs["deferred"], reference, atol=REF_ATOL)
    assert np.shape(runs["deferred"][0][1]) == (1, 4)


BROADCAST_GATES = {
    "IsingXX": lambda x: qml.IsingXX(x, wires=[3, "q1"]),
    "PauliRot": lambda x: qml.PauliRot(x, "XYZ", wires=[3, "q1", 0]),
    "MultiRZ": lambda x: qml.MultiRZ(x, wires=[3, "q1", 0]),
    "PCPhase": lambda x: qml.PCPhase(x, dim=3, wires=[3, "q1", 0]),
}


@VJP
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("x_trainable", [False, True], ids=["x_const", "x_trainable"])
@pytest.mark.parametrize("gate", list(BROADCAST_GATES))
def test_broadcast_gate_on_several_wires(gate, x_trainable, mode, device_vjp):
    """A broadcast parameter in a gate on several wires, trainable or not: each mode (the
    eager one expands every broadcast, the deferred one a trainable broadcast) gives
    default.qubit's values and gradients."""

    def circuit(x, w):
        qml.Hadamard("a")
        qml.CNOT(["a", 3])
        qml.Hadamard("q1")
        BROADCAST_GATES[gate](x)
        qml.CRX(w[0], wires=["a", 0])
        qml.RY(w[1], wires=3)
        return qml.expval(qml.X("a") @ qml.Y(0)), qml.probs(wires=[3, "q1"])

    values = [[0.1, -0.7, 1.3], [0.4, 0.9]]
    trainable = [x_trainable, True]
    run = torch_run(
        circuit,
        device(mode, 2, W4),
        values,
        31,
        trainable,
        diff_method="adjoint",
        device_vjp=device_vjp,
    )
    ref = qml.device("default.qubit", wires=W4)
    reference = torch_run(circuit, ref, values, 31, trainable, diff_method="backprop")
    assert_same_run(run, reference, atol=REF_ATOL)
    assert np.shape(run[0][1]) == (3, 4)


# ---------------------------------------------------------------------------------------
# 4. Mixed batches in one qml.execute


def mixed_tapes(p):
    def same(a, b, c, measurements=None):
        return QuantumScript(
            [
                qml.Hadamard("a"),
                qml.RX(a, "a"),
                qml.CNOT(["a", 3]),
                qml.RY(b, 3),
                qml.CRZ(c, [3, "q1"]),
                qml.IsingXX(a, ["q1", 0]),
            ],
            measurements or [qml.expval(qml.Z(3) @ qml.X("q1")), qml.probs(wires=["a", 0])],
        )

    return [
        same(p[0], p[1], p[2]),
        QuantumScript(
            [
                qml.Rot(p[4], p[5], p[6], wires="q1"),
                qml.CRY(p[0], wires=["q1", "a"]),
                qml.DoubleExcitation(p[2], wires=W4),
            ],
            [qml.probs(wires=["a"]), qml.expval(qml.X("q1") @ qml.Z("a"))],
        ),
        same(p[3], p[4], p[5]),  # the structure of the first tape, other parameters
        QuantumScript(
            [
                qml.RX(p[1], 0),
                qml.CNOT([0, "q1"]),
                qml.IsingXX(p[3], ["q1", 3]),
                qml.MultiRZ(p[5], wires=W4),
            ],
            [qml.expval(qml.Hamiltonian([0.4, -0.6], [qml.Z(3), qml.X(0) @ qml.Y("q1")]))],
        ),
        QuantumScript(
            [qml.Hadamard(0), qml.RZ(p[5], 0), qml.RX(p[6], "a"), qml.CNOT([0, "a"])],
            [qml.state()],
        ),
        same(p[1], p[0], p[6]),
        # a broadcast tape, its broadcast parameter not trainable
        QuantumScript(
            [
                qml.RY(np.array([0.3, -1.1, 2.0]), wires="a"),
                qml.CNOT(["a", 0]),
                qml.RX(p[2], 0),
                qml.CRY(p[3], [0, 3]),
            ],
            [qml.expval(qml.Z(3)), qml.probs(wires=[0])],
        ),
        QuantumScript([qml.RX(0.5, "a"), qml.CNOT(["a", 3])], [qml.expval(qml.Z(3))]),
        # the structure of the first tape, other measurements with as many outputs
        same(p[2], p[6], p[0], [qml.probs(wires=[3, "q1"]), qml.expval(qml.Y("a"))]),
    ]


def execute_run(make_tapes, values, dev, device_vjp, loss_seed, **kwargs):
    params = [float64_tensor(v) for v in values]
    results = qml.execute(
        make_tapes(params), dev, diff_method="adjoint", device_vjp=device_vjp, **kwargs
    )
    random_loss(results, loss_seed).backward()
    return _numpy(results), [p.grad.numpy() for p in params]


def _numpy(out):
    if isinstance(out, (tuple, list)):
        return type(out)(_numpy(o) for o in out)
    return out.detach().numpy() if isinstance(out, torch.Tensor) else np.asarray(out)


@VJP
@pytest.mark.parametrize("k", [1, 3])
def test_mixed_batch(k, device_vjp, paths):
    values = list(np.random.default_rng(stable_seed("mixed")).uniform(-np.pi, np.pi, size=7))
    runs = {}
    for mode in MODES:
        runs[mode] = execute_run(mixed_tapes, values, device(mode, k, W4), device_vjp, 23)
        paths.check(mode)
    assert_same_run(runs["deferred"], runs["eager"], atol=ATOL)
    # one sweep for the four tapes of one structure (and as many bras), one for the
    # broadcast tape's three entries, one for each other tape with trainable parameters
    # (the state's Jacobian is computed forward)
    sizes = sorted(batch for batch, _ in swept_batches(paths.deferred))
    assert sizes == ([1, 1, 1, 3, 4] if device_vjp else [1, 1, 3, 4])
    ref = qml.device("default.qubit", wires=W4)
    params = [float64_tensor(v) for v in values]
    results = qml.execute(mixed_tapes(params), ref, diff_method="backprop")
    random_loss(results, 23).backward()
    reference = (_numpy(results), [p.grad.numpy() for p in params])
    assert_same_run(runs["deferred"], reference, atol=REF_ATOL)


# ---------------------------------------------------------------------------------------
# 5. Several observables and Hamiltonians: full Jacobians


H4 = random_hermitian(4, np.random.default_rng(stable_seed("deferred-hermitian")))


def observables_circuit(weights, extra):
    for i, w in enumerate(W4):
        qml.RY(weights[i, 0], wires=w)
        qml.RZ(weights[i, 1], wires=w)
    for w0, w1 in zip(W4[:-1], W4[1:], strict=True):
        qml.CNOT([w0, w1])
    qml.CRX(extra[0], wires=["q1", "a"])
    qml.Rot(extra[1], extra[2], extra[3], wires=3)
    qml.IsingZZ(extra[4], wires=[0, "q1"])
    qml.MultiRZ(extra[0], wires=W4)
    qml.SingleExcitation(extra[1], wires=["a", 0])
    hamiltonian = qml.Hamiltonian(
        [0.3, -1.2, 0.5], [qml.X("a") @ qml.Z(0), qml.Y(3), qml.Z("q1") @ qml.Z(3)]
    )
    sum_sprod = qml.sum(qml.s_prod(0.7, qml.X("a")), qml.prod(qml.Z(3), qml.Y(0)))
    return (
        qml.expval(qml.Z("a")),
        qml.expval(qml.X(3) @ qml.Y("q1")),
        qml.expval(hamiltonian),
        qml.expval(sum_sprod),
        qml.expval(qml.Hermitian(H4, wires=["q1", "a"])),
        qml.probs(wires=[0, 3]),
    )


N_OUTPUTS = 5 + 4


@VJP
@pytest.mark.parametrize("k", [1, 2, 4])
def test_full_jacobian_several_observables(k, device_vjp, paths):
    rng = np.random.default_rng(stable_seed("deferred-observables"))
    inputs = (
        float64_tensor(rng.uniform(-np.pi, np.pi, size=(4, 2))),
        float64_tensor(rng.uniform(-np.pi, np.pi, 5)),
    )
    jacobians = {}
    for mode in MODES:
        qnode = qml.QNode(
            observables_circuit,
            device(mode, k, W4),
            interface="torch",
            diff_method="adjoint",
            device_vjp=device_vjp,
        )
        jac = torch.autograd.functional.jacobian(lambda *p, q=qnode: real_vector(q(*p)), inputs)
        jacobians[mode] = tuple(j.numpy() for j in jac)
        if mode == "deferred" and not device_vjp:
            # every output's bra in one batch: the Jacobian is one sweep
            assert swept_batches(paths.deferred) == [(1, N_OUTPUTS)]
        paths.check(mode)
    assert jacobians["deferred"][0].shape == (N_OUTPUTS, 4, 2)
    assert_allclose_nested(jacobians["deferred"], jacobians["eager"], atol=ATOL)
    assert np.abs(jacobians["eager"][1]).max() > 1e-3


# ---------------------------------------------------------------------------------------
# 6. The device API, with a broadcast tape


def api_tapes():
    """Tapes with trainable_params set, the second broadcast (its broadcast parameter not
    trainable), and each tape's trainable parameter indices."""
    plain = api_tape("two_expvals_three_params")
    broadcast = QuantumScript(
        [
            qml.RY(np.array([0.3, -1.1, 2.0]), wires="a"),
            qml.Hadamard(3),
            qml.CRX(0.8, wires=["a", 3]),
            qml.RZ(-0.4, wires="a"),
            qml.CNOT(["a", 3]),
            qml.IsingYY(1.3, wires=[3, "a"]),
        ],
        [qml.expval(qml.X(3)), qml.probs(wires=["a", 3])],
    )
    single = QuantumScript(
        [qml.Hadamard("q1"), qml.RX(0.9, "q1"), qml.CNOT(["q1", 0]), qml.RY(-0.3, 0)],
        [qml.expval(qml.Hamiltonian([0.2, -1.5], [qml.X(0) @ qml.Z("q1"), qml.Y(0)]))],
    )
    trainable = [[1, 2, 3], [1]]
    for tape, params in zip((broadcast, single), trainable, strict=True):
        tape.trainable_params = params
    return [plain, broadcast, single]


def config(mode, k):
    return ExecutionConfig(
        gradient_method="adjoint",
        device_options={"grad_accumulation": mode, "fusion_qubits": k},
    )


def expand(tapes):
    """Each tape, a broadcast one as its entries (trainable_params kept), and for each
    tape the number of entries (None: not broadcast)."""
    expanded, entries = [], []
    for tape in tapes:
        if tape.batch_size is None:
            expanded.append(tape)
            entries.append(None)
            continue
        parts, _ = qml.transforms.broadcast_expand(tape)
        for part in parts:
            part.trainable_params = tape.trainable_params
        expanded.extend(parts)
        entries.append(len(parts))
    return expanded, entries


def split_cotangent(tape, dy, b):
    """Entry b of a broadcast tape's cotangent (one per measurement)."""
    if len(tape.measurements) == 1:
        return np.asarray(dy)[b]
    return tuple(np.asarray(d)[b] for d in dy)


def _map(function, *nested):
    if isinstance(nested[0], (tuple, list)):
        return tuple(_map(function, *parts) for parts in zip(*nested, strict=True))
    return function(*nested)


def eager_vjps(dev, tapes, dys, k):
    """Eager VJPs, a broadcast tape's as the sum of its entries' VJPs."""
    expanded, entries = expand(tapes)
    cotangents = []
    for tape, dy, n in zip(tapes, dys, entries, strict=True):
        cotangents += [dy] if n is None else [split_cotangent(tape, dy, b) for b in range(n)]
    vjps = iter(dev.compute_vjp(expanded, cotangents, config("eager", k)))
    result = []
    for n in entries:
        parts = [next(vjps) for _ in range(1 if n is None else n)]
        result.append(parts[0] if n is None else _map(lambda *v: np.sum(v, axis=0), *parts))
    return tuple(result)


def eager_jacobians(dev, tapes, k):
    """Eager Jacobians, a broadcast tape's entries stacked along a first axis."""
    expanded, entries = expand(tapes)
    jacobians = iter(dev.compute_derivatives(expanded, config("eager", k)))
    result = []
    for n in entries:
        parts = [next(jacobians) for _ in range(1 if n is None else n)]
        result.append(parts[0] if n is None else _map(lambda *v: np.stack(v), *parts))
    return tuple(result)


def eager_results(dev, tapes, k):
    return tuple(dev.execute(tapes, config("eager", k)))


def cotangents(tapes, rng):
    dys = []
    for tape in tapes:
        batch = () if tape.batch_size is None else (tape.batch_size,)
        per = [
            rng.normal(size=batch)
            if isinstance(mp, qml.measurements.ExpectationMP)
            # probs: one weight per outcome
            else rng.normal(size=(*batch, 2 ** len(mp.wires)))
            for mp in tape.measurements
        ]
        dys.append(per[0] if len(per) == 1 else tuple(per))
    return dys


@pytest.mark.parametrize("k", [1, 2, 3])
def test_device_api(k):
    tapes = api_tapes()
    dys = cotangents(tapes, np.random.default_rng(stable_seed("deferred-api")))
    dev = device("deferred", k, W4)
    eager = device("eager", k, W4)
    expected_vjps = eager_vjps(eager, tapes, dys, k)
    expected_jacobians = eager_jacobians(eager, tapes, k)
    expected_results = eager_results(eager, tapes, k)
    deferred = config("deferred", k)

    assert_allclose_nested(dev.compute_vjp(tapes, dys, deferred), expected_vjps, atol=ATOL)
    assert_allclose_nested(dev.compute_derivatives(tapes, deferred), expected_jacobians, ATOL)
    results, vjps = dev.execute_and_compute_vjp(tapes, dys, deferred)
    assert_allclose_nested(results, expected_results, atol=ATOL)
    assert_allclose_nested(vjps, expected_vjps, atol=ATOL)
    results, jacobians = dev.execute_and_compute_derivatives(tapes, deferred)
    assert_allclose_nested(results, expected_results, atol=ATOL)
    assert_allclose_nested(jacobians, expected_jacobians, atol=ATOL)
    # the broadcast tape's Jacobian: (entries, outcomes) per measurement and parameter
    assert np.shape(jacobians[1][1][0]) == (3, 4)
    assert np.abs(np.asarray(vjps[1])).max() > 1e-3


def test_device_api_zero_cotangents():
    """Zero cotangents (for one measurement, or a whole tape) give the eager results."""
    tapes = api_tapes()
    dys = cotangents(tapes, np.random.default_rng(stable_seed("deferred-api-zero")))
    dys[0] = (np.zeros(()), dys[0][1])
    dys[1] = (np.zeros(3), dys[1][1])  # the broadcast tape's expval
    dys[2] = np.zeros(())
    dev, eager = device("deferred", 2, W4), device("eager", 2, W4)
    vjps = dev.compute_vjp(tapes, dys, config("deferred", 2))
    assert_allclose_nested(vjps, eager_vjps(eager, tapes, dys, 2), atol=ATOL)
    assert vjps[2] == (0.0,)
    assert np.abs(np.asarray(vjps[1])).max() > 1e-3


# ---------------------------------------------------------------------------------------
# 7. Memory chunks


def chunk_tapes(rng):
    """Tapes of one structure: three plain ones and a broadcast one of three entries."""

    def tape(ry):
        a, b, c = rng.uniform(-np.pi, np.pi, size=3)
        t = QuantumScript(
            [
                qml.RY(ry, wires="a"),
                qml.Hadamard(3),
                qml.CRX(a, wires=["a", 3]),
                qml.IsingZZ(b, wires=[3, "q1"]),
                qml.CNOT(["q1", 0]),
                qml.RX(c, wires=0),
            ],
            [qml.expval(qml.Z(0) @ qml.X("a")), qml.probs(wires=["q1"])],
        )
        t.trainable_params = [1, 2, 3]
        return t

    return [tape(0.4), tape(np.array([0.1, -0.7, 2.2])), tape(1.3), tape(-0.6)]


PER_STATE = 16 * 16  # four qubits, complex128
REDUCTIONS_PER_BRA = 16 * (3 * 4**2 + 6)
"""The memory check's bound on the reductions a sweep holds per bra (deferred._ChunkTally):
complex128, 4**k per trainable gate (three, k = 2) and one per operation (six)."""


@pytest.mark.parametrize(
    "budget_vectors, expected_sizes",
    [(100, [6]), (3, [1, 3, 2]), (4, [4, 2]), (1, None)],
    ids=["one_chunk", "three", "two", "broadcast_refused"],
)
@pytest.mark.parametrize("derivative", ["vjp", "jacobian"])
def test_memory_chunks(derivative, budget_vectors, expected_sizes, mocker, monkeypatch):
    """available_bytes fits ``budget_vectors`` vectors (a final state, its bras and their
    reductions): consecutive tapes are cut into chunks of at most that many (a broadcast
    tape of three entries larger than that alone, and refused before any sweep if it does
    not fit: ``expected_sizes`` None); every chunk gives the eager results."""
    rng = np.random.default_rng(stable_seed("deferred-chunks"))
    tapes = chunk_tapes(rng)
    dys = cotangents(tapes, rng)
    rows = 1 if derivative == "vjp" else 1 + 2  # one bra, or one per output
    dev = device("deferred", 2, W4)
    budget = budget_vectors * (PER_STATE * (1 + rows) + REDUCTIONS_PER_BRA * rows)
    monkeypatch.setattr(dev._backend, "available_bytes", lambda: budget)
    monkeypatch.setattr(simulate, "UNCHECKED_BYTES", 0)  # these vectors are tiny
    sweeps = mocker.spy(pennylane_custatevec.gradients.deferred, "sweep")
    eager = device("eager", 2, W4)
    deferred = config("deferred", 2)
    if expected_sizes is None:
        with pytest.raises(RunTooLargeError, match='grad_accumulation="eager"'):
            if derivative == "vjp":
                dev.compute_vjp(tapes, dys, deferred)
            else:
                dev.compute_derivatives(tapes, deferred)
        assert sweeps.call_args_list == []
        return
    if derivative == "vjp":
        result = dev.compute_vjp(tapes, dys, deferred)
        expected = eager_vjps(eager, tapes, dys, 2)
    else:
        result = dev.compute_derivatives(tapes, deferred)
        expected = eager_jacobians(eager, tapes, 2)
    assert [batch for batch, _ in swept_batches(sweeps)] == expected_sizes
    assert_allclose_nested(result, expected, atol=ATOL)


# ---------------------------------------------------------------------------------------
# 8. On the cuStateVec double


@VJP
@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("name", ["CRot", "DoubleExcitation", "ctrl_Rot_values10", "MultiRZ"])
def test_double_gate(name, k, device_vjp, gpu_double, paths):
    circuit, values = gate_circuit(name, stable_seed("double-gate", name))
    runs = run_both_modes(
        circuit, values, stable_seed("loss", name), k, device_vjp, paths=paths, backend="custatevec"
    )
    cpu = torch_run(
        circuit,
        device("deferred", k),
        values,
        stable_seed("loss", name),
        diff_method="adjoint",
        device_vjp=device_vjp,
    )
    assert_same_run(runs["deferred"], cpu, atol=ATOL)


@VJP
def test_double_broadcast(device_vjp, gpu_double, paths):
    rng = np.random.default_rng(stable_seed("double-broadcast"))
    x = rng.uniform(-np.pi, np.pi, size=(6, len(WIRES)))
    weights = rng.uniform(-np.pi, np.pi, size=(2, len(WIRES), 3))
    run_both_modes(
        broadcast_circuit,
        [x, weights],
        19,
        4,
        device_vjp,
        paths=paths,
        trainable=[False, True],
        backend="custatevec",
    )
    assert [batch for batch, _ in swept_batches(paths.deferred)] == [6]


@VJP
def test_double_mixed_batch(device_vjp, gpu_double, paths):
    values = list(np.random.default_rng(stable_seed("double-mixed")).uniform(-3, 3, size=7))
    runs = {}
    for mode in MODES:
        dev = device(mode, 3, W4, backend="custatevec")
        runs[mode] = execute_run(mixed_tapes, values, dev, device_vjp, 29)
        paths.check(mode)
    assert_same_run(runs["deferred"], runs["eager"], atol=ATOL)


def test_double_device_api(gpu_double):
    tapes = api_tapes()
    dys = cotangents(tapes, np.random.default_rng(stable_seed("double-api")))
    dev = device("deferred", 3, W4, backend="custatevec")
    eager = device("eager", 3, W4, backend="custatevec")
    deferred = config("deferred", 3)
    assert_allclose_nested(
        dev.compute_vjp(tapes, dys, deferred), eager_vjps(eager, tapes, dys, 3), atol=ATOL
    )
    assert_allclose_nested(
        dev.compute_derivatives(tapes, deferred), eager_jacobians(eager, tapes, 3), atol=ATOL
    )


# ---------------------------------------------------------------------------------------
# 9. No host synchronisation inside a sweep


def _counting_sweeps(monkeypatch, cupy):
    """Wrap deferred.sweep: the list receives each sweep's number of synchronisations."""
    original = pennylane_custatevec.gradients.deferred.sweep
    counts = []

    def counted(*args, **kwargs):
        before = cupy.synchronizations
        result = original(*args, **kwargs)
        counts.append(cupy.synchronizations - before)
        return result

    monkeypatch.setattr(pennylane_custatevec.gradients.deferred, "sweep", counted)
    return counts


def sync_circuit(weights, x):
    """Gates on at most three wires, a batch of two broadcast entries."""
    qml.RY(x, wires="a")
    for i, w in enumerate(W4):
        qml.RX(weights[i], wires=w)
    qml.CNOT(["a", 3])
    qml.CRY(weights[4], wires=[3, "q1"])
    qml.Toffoli(wires=["a", "q1", 0])
    qml.IsingXY(weights[5], wires=[0, "a"])
    qml.ctrl(qml.RZ(weights[6], wires=0), control=["a", 3], control_values=[0, 1])
    qml.Hadamard("q1")
    qml.RZ(weights[7], wires="q1")
    return qml.expval(qml.Z("a") @ qml.X(0)), qml.probs(wires=["q1", 3])


@VJP
@pytest.mark.parametrize("k", [3, 4])
def test_one_transfer_per_sweep(k, device_vjp, gpu_double, monkeypatch):
    """With every gate inside a block, a sweep (VJP or Jacobian, a broadcast batch) brings
    its reductions to the host in one transfer and synchronises nowhere else."""
    counts = _counting_sweeps(monkeypatch, gpu_double.cupy)
    rng = np.random.default_rng(stable_seed("sync"))
    weights = float64_tensor(rng.uniform(-np.pi, np.pi, size=8))
    x = float64_tensor([0.3, -1.2], requires_grad=False)
    dev = device("deferred", k, W4, backend="custatevec")
    qnode = qml.QNode(
        sync_circuit, dev, interface="torch", diff_method="adjoint", device_vjp=device_vjp
    )
    random_loss(qnode(weights, x), 3).backward()
    assert counts == [1]
    assert np.abs(weights.grad.numpy()).max() > 1e-3


def test_wide_gate_synchronises_in_its_own_step(gpu_double, monkeypatch):
    """A trainable gate wider than the blocks takes the eager step: its inner product comes
    to the host at once (one more transfer than the gather)."""
    counts = _counting_sweeps(monkeypatch, gpu_double.cupy)
    weights = float64_tensor([0.3, -0.8, 1.1])
    dev = device("deferred", 2, W4, backend="custatevec")

    def circuit(w):
        qml.RX(w[0], wires="a")
        qml.CNOT(["a", 3])
        qml.MultiRZ(w[1], wires=W4)
        qml.RY(w[2], wires="q1")
        return qml.expval(qml.Z("a") @ qml.X("q1"))

    qml.QNode(circuit, dev, interface="torch", diff_method="adjoint", device_vjp=True)(
        weights
    ).backward()
    assert counts == [2]


# ---------------------------------------------------------------------------------------
# Runs of commuting Z-word rotations (QAOA cost layers), one pass each on the CPU


EDGES = [("a", 3), (3, "q1"), ("q1", 0), (0, "z"), ("z", "a"), ("a", "q1")]


def qaoa_circuit(gammas, betas, shared=True, broadcast_x=None):
    """Cost layers of IsingZZ (and a MultiRZ and an RZ) between RX mixers; with ``shared``
    the cost layer's rotations share one angle (the same table of phases), else each has
    its own multiple of it."""
    for w in WIRES:
        qml.Hadamard(w)
    if broadcast_x is not None:
        qml.RY(broadcast_x, wires="a")
    for layer in range(2):
        for i, edge in enumerate(EDGES):
            qml.IsingZZ(gammas[layer] * (1.0 if shared else 0.5 + i), wires=edge)
        qml.MultiRZ(gammas[layer], wires=["a", 0, "z"])
        qml.RZ(gammas[layer], wires="q1")
        for w in WIRES:
            qml.RX(betas[layer], wires=w)
    cost = qml.Hamiltonian([1.0] * len(EDGES), [qml.Z(a) @ qml.Z(b) for a, b in EDGES])
    return qml.expval(cost), qml.probs(wires=[3, "z"])


LAYER_VALUES = [[0.4, -0.9], [0.3, 1.2]]


def assert_modes_match_backprop(circuit, seed, k, device_vjp, paths):
    """Deferred equals eager (run_both_modes) and default.qubit's backprop."""
    runs = run_both_modes(circuit, LAYER_VALUES, seed, k, device_vjp, paths=paths)
    ref = qml.device("default.qubit", wires=WIRES)
    reference = torch_run(circuit, ref, LAYER_VALUES, seed, diff_method="backprop")
    assert_same_run(runs["deferred"], reference, atol=REF_ATOL)


@VJP
@pytest.mark.parametrize("shared", [True, False], ids=["shared_angle", "own_angles"])
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_z_rotation_runs(k, shared, device_vjp, paths, mocker):
    spy = mocker.spy(pennylane_custatevec.backends.cpu.CPUBackend, "adjoint_z_rotations_step")
    circuit = functools.partial(qaoa_circuit, shared=shared)
    assert_modes_match_backprop(circuit, 23, k, device_vjp, paths)
    # with fusion on, each cost layer is one run in the sweep
    assert spy.call_count == (0 if k <= 1 else 2)


def mixer_circuit(angles, entangling, broadcast_x=None):
    """Layers of a CRZ ring and a mixer of RX and RY on every wire: the mixer's adjacent
    lone rotations on distinct wires run in pairs on the CPU."""
    for w in WIRES:
        qml.Hadamard(w)
    if broadcast_x is not None:
        qml.RZ(broadcast_x, wires=WIRES[0])
    for layer in range(2):
        for i, w in enumerate(WIRES):
            qml.CRZ(entangling[layer], wires=[w, WIRES[(i + 1) % len(WIRES)]])
        for i, w in enumerate(WIRES):
            (qml.RX if i % 2 == 0 else qml.RY)(angles[layer] * (0.5 + i), wires=w)
    return qml.expval(qml.Z(WIRES[0]) @ qml.X(WIRES[2])), qml.probs(wires=[3, "z"])


@VJP
@pytest.mark.parametrize("k", [1, 2, 4])
def test_one_qubit_rotation_pairs(k, device_vjp, paths, mocker):
    """With fusion on, each pair of the mixer's lone rotations is one step of the sweep
    (5 wires: the rotations on bits 0 and 1 are a tiled run in the tests' tiles, see
    conftest; of the other three, one pair and a lone rotation per layer)."""
    cpu = pennylane_custatevec.backends.cpu.CPUBackend
    spy = mocker.spy(cpu, "adjoint_one_qubit_rotations_step")
    tiled = mocker.spy(cpu, "adjoint_tiled_matrices_step")
    assert_modes_match_backprop(mixer_circuit, 31, k, device_vjp, paths)
    assert spy.call_count == (0 if k <= 1 else 2)
    assert tiled.call_count == (0 if k <= 1 else 2)


@VJP
@pytest.mark.parametrize("layers", [qaoa_circuit, mixer_circuit], ids=["z_runs", "pairs"])
def test_rotation_units_broadcast(layers, device_vjp, paths):
    """A broadcast tape (a broadcast angle before the layers): the runs' phases and the
    pairs' angles per vector."""
    circuit = functools.partial(layers, broadcast_x=np.array([0.2, -1.0, 2.5]))
    assert_modes_match_backprop(circuit, 29, 2, device_vjp, paths)


@pytest.mark.parametrize("kind", typing.get_args(fusion.Unit), ids=lambda kind: kind.__name__)
def test_every_unit_kind_has_a_sweep_step(kind):
    """The sweep's dispatch is complete over ``fusion.Unit``'s kinds: each has its step."""
    assert kind in fused_sweep._UNIT_STEPS
    assert set(fused_sweep._UNIT_STEPS) == set(typing.get_args(fusion.Unit))


def test_a_unit_kind_without_a_step_fails_clearly():
    """A new kind of unit that the sweep has no step for is refused by name, not swept
    as something else."""

    @dataclasses.dataclass(frozen=True)
    class ToyUnit:
        members: tuple[int, ...]

    with pytest.raises(TypeError, match="no step for a ToyUnit unit"):
        fused_sweep.step_of(ToyUnit((0,)))


def test_a_wide_operation_of_a_broadcast_takes_its_own_step(mocker):
    """A 12-wire MultiRZ of a broadcast: the planner keeps it as a block of its own, and
    the sweep took it as a dense 4096 x 4096 block (a minute per gradient, from a
    reduction of 4**12 entries per vector and host products of 4096 x 4096 matrices); it
    takes the operation's own step, and the Jacobian equals the eager mode's."""
    derivatives = mocker.spy(pennylane_custatevec.gradients.fused_sweep, "_block_derivatives")
    wide_steps = mocker.spy(pennylane_custatevec.gradients.fused_sweep, "_operation_step")
    n = 12

    def circuit(w):
        for i in range(n):
            qml.RY(w[..., i], i)
        for i in range(n - 1):
            qml.CNOT([i, i + 1])
        qml.MultiRZ(w[..., n], wires=range(n))
        return qml.expval(qml.Z(0) @ qml.Z(n - 1))

    w = qml.numpy.array(np.random.default_rng(5).normal(size=(2, n + 1)), requires_grad=True)
    jacobians = {}
    for mode in ("deferred", "eager"):
        device = qml.device("custatevec.qubit", wires=n, backend="cpu", grad_accumulation=mode)
        jacobians[mode] = qml.jacobian(qml.QNode(circuit, device, diff_method="adjoint"))(w)
    np.testing.assert_allclose(jacobians["deferred"], jacobians["eager"], atol=1e-12)
    widths = [
        len(term.block.targets) for call in derivatives.call_args_list for term in call.args[1]
    ]
    assert widths and all(width <= 6 for width in widths)  # no dense derivative of the wide block
    assert wide_steps.call_count >= 1


def test_gradients_of_gates_that_share_a_column_add_up():
    """The sweep adds its units' gradients column by column in one indexed add; where two
    gates share a column, both values count (a plain indexed add would keep one)."""
    rng = np.random.default_rng(stable_seed("shared-columns"))
    values = rng.normal(size=(2, 3, 3))
    gradients = np.ones((2, 3, 4))
    fused_sweep._add_to_columns(gradients, [1, 3, 1], values)
    expected = np.ones((2, 3, 4))
    expected[:, :, 1] += values[:, :, 0]  # in the order of the columns given
    expected[:, :, 3] += values[:, :, 1]
    expected[:, :, 1] += values[:, :, 2]
    np.testing.assert_allclose(gradients, expected, rtol=0, atol=1e-15)
    fused_sweep._add_to_columns(gradients, [0, 2, 3], values)
    expected[:, :, [0, 2, 3]] += values
    np.testing.assert_allclose(gradients, expected, rtol=0, atol=1e-15)


def test_block_terms_taken_in_chunks_give_the_same_gradients(mocker, monkeypatch):
    """The sweep takes its blocks' gradients in chunks under ``BLOCK_TERMS_BYTES``; one
    block per chunk gives the gradients of all blocks at once (a broadcast minibatch
    through StronglyEntanglingLayers, blocks of three rotations per wire)."""
    n = 12
    rng = np.random.default_rng(stable_seed("block-term-chunks"))
    x = rng.uniform(0, np.pi, size=(2, n))
    weights = qml.numpy.array(rng.uniform(-np.pi, np.pi, size=(2, n, 3)), requires_grad=True)

    def circuit(w):
        qml.AngleEmbedding(x, wires=range(n))
        qml.StronglyEntanglingLayers(w, wires=range(n))
        return qml.expval(qml.Z(0) @ qml.Z(n - 1))

    device = qml.device("custatevec.qubit", wires=n, backend="cpu")
    qnode = qml.QNode(circuit, device, diff_method="adjoint", device_vjp=True)
    derivatives = mocker.spy(pennylane_custatevec.gradients.fused_sweep, "_block_derivatives")
    whole = qml.jacobian(qnode)(weights)
    whole_calls = derivatives.call_count
    monkeypatch.setattr(pennylane_custatevec.gradients.fused_sweep, "BLOCK_TERMS_BYTES", 1)
    chunked = qml.jacobian(qnode)(weights)
    chunk_calls = derivatives.call_count - whole_calls
    assert 0 < whole_calls < chunk_calls  # the same blocks, one call per block
    np.testing.assert_allclose(chunked, whole, atol=1e-13, rtol=0)
    eager = qml.device("custatevec.qubit", wires=n, backend="cpu", grad_accumulation="eager")
    reference = qml.QNode(circuit, eager, diff_method="adjoint", device_vjp=True)
    np.testing.assert_allclose(whole, qml.jacobian(reference)(weights), atol=1e-10, rtol=0)
