"""Gate fusion (pennylane_custatevec/fusion.py), a pure transformation of compiled circuits.

The plan is checked on hand-written bit lists (exact plans and the invariants every plan
keeps), the fused matrices against PennyLane's own matrices, and the order of the fused
circuit by simulation: for every block size the state equals default.qubit's and the
unfused program's.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pennylane as qml
import pytest
import torch
from conftest import make_devices, stable_seed
from pennylane import numpy as pnp
from pennylane.wires import Wires
from reference import random_state, random_unitary
from spies import calls

from pennylane_custatevec import fused_units, fusion, simulate
from pennylane_custatevec.backends import CPUBackend
from pennylane_custatevec.backends.primitives import FusionTraits
from pennylane_custatevec.compile_ops import compile_operation
from pennylane_custatevec.compile_tapes import compile_steps, compile_tape
from pennylane_custatevec.instructions import Instruction, Kind, apply_instruction, inverse
from pennylane_custatevec.program import Register, flatten

ATOL = 1e-10
WIRES6 = ["a", 3, "q1", 0, "z", 11]  # mixed labels, not sorted
Block, Single = fusion.Block, fusion.Single

# ---------------------------------------------------------------------------------------
# 1. The plan, on hand-written bit lists

EXACT_PLANS = {
    "ladder_k2": (
        [(0,), (1,), (2,), (3,), (0, 1), (1, 2), (2, 3), (0, 3)],
        2,
        (
            Block((0, 1), (0, 1, 4)),
            Block((2, 3), (2, 3)),
            Block((1, 2), (5,)),
            Block((2, 3), (6,)),
            Block((0, 3), (7,)),
        ),
    ),
    "ladder_k4": (
        [(0,), (1,), (2,), (3,), (0, 1), (1, 2), (2, 3), (0, 3)],
        4,
        (Block((0, 1, 2, 3), tuple(range(8))),),
    ),
    # an operation commutes past a block on other bits and joins the block of its bits
    "commute_past_other_bits": (
        [(0, 1), (2, 3), (0,)],
        2,
        (Block((0, 1), (0, 2)), Block((2, 3), (1,))),
    ),
    # an unfusable operation is a barrier: nothing moves across it
    "barrier": (
        [(0,), (1,), None, (0,), (1,)],
        2,
        (Block((0, 1), (0, 1)), Single(2), Block((0, 1), (3, 4))),
    ),
    # a wide operation is a Single, and what shares its bits stays on its side
    "wide_shares_bits": (
        [(0,), (0, 1, 2), (0,)],
        2,
        (Block((0,), (0,)), Single(1), Block((0,), (2,))),
    ),
    # ... what does not share its bits may join a block before it
    "wide_other_bits": (
        [(0,), (1, 2, 3), (0,)],
        2,
        (Block((0,), (0, 2)), Single(1)),
    ),
    "no_fusion_k1": (
        [(0,), (0,), (1,), (0, 1)],
        1,
        (Block((0,), (0,)), Block((0,), (1,)), Block((1,), (2,)), Single(3)),
    ),
    "no_fusion_k0": (
        [(0,), (0,), (1,), (0, 1)],
        0,
        (Block((0,), (0,)), Block((0,), (1,)), Block((1,), (2,)), Single(3)),
    ),
    "no_bits": ([()], 2, (Block((), (0,)),)),
    "exactly_k": ([(0, 1, 2), (1, 2), (3,)], 3, (Block((0, 1, 2), (0, 1)), Block((3,), (2,)))),
}


@pytest.mark.parametrize("name", list(EXACT_PLANS))
def test_exact_plans(name):
    bits, k, expected = EXACT_PLANS[name]
    assert fusion.plan(bits, k) == expected
    assert fusion.plan(tuple(bits), k) == expected  # a list and a tuple plan alike


def _random_bits(rng, n_steps, n_bits=6):
    steps = []
    for _ in range(n_steps):
        roll = rng.random()
        if roll < 0.06:
            steps.append(None)
        elif roll < 0.1:
            steps.append(())
        else:
            width = int(rng.choice([1, 1, 2, 2, 3, 4, 5]))
            steps.append(tuple(sorted(int(b) for b in rng.permutation(n_bits)[:width])))
    return steps


def check_plan_invariants(bits, k, units):
    width = max(k, 1)
    position = {}
    for p, unit in enumerate(units):
        members = unit.members if isinstance(unit, Block) else (unit.member,)
        for m in members:
            assert m not in position, f"step {m} is in two units"
            position[m] = p
        if isinstance(unit, Block):
            assert list(unit.members) == sorted(unit.members), "members out of circuit order"
            assert len(unit.targets) <= width
            union = sorted(set(itertools.chain.from_iterable(bits[m] for m in unit.members)))
            assert list(unit.targets) == union, "a block's targets are its members' bits"
            assert all(bits[m] is not None and len(bits[m]) <= width for m in unit.members)
            if k <= 1:
                assert len(unit.members) == 1
        else:
            step = bits[unit.member]
            assert step is None or len(step) > width, f"step {unit.member} fits but is single"
    assert sorted(position) == list(range(len(bits))), "every step in exactly one unit"
    # the fused order is a valid reordering: steps that share a bit (or one unfusable
    # step and any other) keep their order
    for i, j in itertools.combinations(range(len(bits)), 2):
        if bits[i] is None or bits[j] is None:
            assert position[i] < position[j], (i, j)
        elif set(bits[i]) & set(bits[j]):
            assert position[i] <= position[j], (i, j)
            if len(bits[i]) > width or len(bits[j]) > width:
                assert position[i] < position[j], (i, j)


@pytest.mark.parametrize("k", range(7))
@pytest.mark.parametrize("seed", range(4))
def test_plan_invariants_random(k, seed):
    rng = np.random.default_rng(stable_seed("plan", seed))
    bits = _random_bits(rng, int(rng.integers(20, 60)))
    units = fusion.plan(bits, k)
    check_plan_invariants(bits, k, units)
    if k >= 2:
        assert len(units) < len(bits)  # something was merged


def test_every_step_wider_than_k_is_single():
    bits = [(0, 1, 2), (0,), (1, 2), (0, 1, 2, 3)]
    units = fusion.plan(bits, 2)
    assert units == (Single(0), Block((0,), (1,)), Block((1, 2), (2,)), Single(3))
    check_plan_invariants(bits, 2, units)
    assert fusion.plan(bits, 3) == (Block((0, 1, 2), (0, 1, 2)), Single(3))
    assert fusion.plan(bits, 4) == (Block((0, 1, 2, 3), (0, 1, 2, 3)),)


# ---------------------------------------------------------------------------------------
# 2. Matrices: embed, step_matrix


def _wire_order(targets):
    """PennyLane's wire order (most significant first) of a block whose targets[j] is bit j
    of its index, with the bit numbers as wire labels."""
    return list(reversed(targets))


@pytest.mark.parametrize("targets", [(0, 1, 2), (1, 3, 4)])
def test_embed_two_qubit_gate(targets, rng):
    m = random_unitary(4, rng)
    for pair in itertools.permutations(targets, 2):
        # pair[0] is bit 0 of the gate's index: the least significant, PennyLane's last wire
        expected = qml.matrix(
            qml.QubitUnitary(m, wires=list(reversed(pair))), wire_order=_wire_order(targets)
        )
        embedded = fused_units.embed(m[None], pair, targets)
        assert embedded.shape == (1, 8, 8)
        np.testing.assert_allclose(embedded[0], expected, atol=ATOL, rtol=0)


def test_embed_is_kron_with_identity(rng):
    m = rng.normal(size=(4, 4)) + 1j * rng.normal(size=(4, 4))  # any matrix, not only unitaries
    eye = np.eye(2)
    swap = np.eye(4)[[0, 2, 1, 3]]
    cases = {
        (0, 1): np.kron(eye, m),  # the gate on the two low bits
        (1, 2): np.kron(m, eye),  # ... on the two high bits
        (1, 0): np.kron(eye, swap @ m @ swap),  # bits given in the other order
    }
    for bits, expected in cases.items():
        np.testing.assert_allclose(
            fused_units.embed(m[None], bits, (0, 1, 2))[0], expected, atol=ATOL
        )
    assert fused_units.embed(m[None], (0, 1), (0, 1)) is not None
    np.testing.assert_array_equal(fused_units.embed(m[None], (0, 1), (0, 1))[0], m)


def test_embed_batched(rng):
    ms = np.stack([random_unitary(2, rng) for _ in range(3)])
    embedded = fused_units.embed(ms, (2,), (0, 2, 5))
    assert embedded.shape == (3, 8, 8)
    for b in range(3):
        expected = np.kron(np.kron(np.eye(2), ms[b]), np.eye(2))
        np.testing.assert_allclose(embedded[b], expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("values", [(0,), (1,), (0, 1), (1, 0)])
def test_controlled_instruction(values, rng):
    """A MATRIX instruction with controls: the controls are the high bits of its index."""
    u = random_unitary(2, rng)
    controls = (4, 0)[: len(values)]
    instruction = Instruction(
        Kind.MATRIX, targets=(2,), controls=controls, control_values=values, data=u[None]
    )
    targets = tuple(sorted({2, *controls, 3}))  # with a spectator bit
    expected = qml.matrix(
        qml.ctrl(qml.QubitUnitary(u, wires=2), control=list(controls), control_values=values),
        wire_order=_wire_order(targets),
    )
    np.testing.assert_allclose(
        fused_units.step_matrix([instruction], targets)[0], expected, atol=ATOL, rtol=0
    )


def _operators(rng):
    a = lambda: float(rng.uniform(-np.pi, np.pi))  # noqa: E731
    w = WIRES6
    return {
        "CNOT": qml.CNOT([w[0], w[3]]),
        "Toffoli": qml.Toffoli([w[4], w[1], w[2]]),
        "ctrl_X_values01": qml.ctrl(qml.X(w[2]), control=[w[0], w[5]], control_values=[0, 1]),
        "CZ": qml.CZ([w[5], w[1]]),
        "ctrl_RY_value0": qml.ctrl(qml.RY(a(), w[3]), control=w[1], control_values=[0]),
        "ctrl_RY_value1": qml.ctrl(qml.RY(a(), w[3]), control=w[1], control_values=[1]),
        "CRX": qml.CRX(a(), wires=[w[2], w[0]]),
        "ctrl_Rot_values10": qml.ctrl(
            qml.Rot(a(), a(), a(), wires=w[4]), control=[w[0], w[2]], control_values=[1, 0]
        ),
        "ctrl_GlobalPhase_value0": qml.ctrl(
            qml.GlobalPhase(a(), wires=w[1]), control=w[4], control_values=[0]
        ),
        "ctrl_GlobalPhase_value1": qml.ctrl(
            qml.GlobalPhase(a(), wires=w[1]), control=w[4], control_values=[1]
        ),
        "ctrl_PhaseShift_value0": qml.ctrl(
            qml.PhaseShift(a(), wires=w[1]), control=w[0], control_values=[0]
        ),
        "ControlledQubitUnitary": qml.ControlledQubitUnitary(
            random_unitary(2, rng), wires=[w[3], w[5], w[0]], control_values=[0, 1]
        ),
        "adjoint_S": qml.adjoint(qml.S(w[2])),
        "PhaseShift": qml.PhaseShift(a(), wires=w[5]),
        "IsingZZ": qml.IsingZZ(a(), wires=[w[4], w[0]]),
        "IsingXY": qml.IsingXY(a(), wires=[w[1], w[3]]),
        "MultiRZ": qml.MultiRZ(a(), wires=[w[0], w[5], w[2]]),
        "PauliRot_XIY": qml.PauliRot(a(), "XIY", wires=[w[3], w[0], w[1]]),
        "SWAP": qml.SWAP([w[2], w[4]]),
        "Hadamard": qml.Hadamard(w[1]),
        "Rot": qml.Rot(a(), a(), a(), wires=w[0]),
        "GlobalPhase_on_wire": qml.GlobalPhase(a(), wires=w[3]),
        "Identity": qml.Identity(w[2]),
        "DiagonalQubitUnitary": qml.DiagonalQubitUnitary(
            np.exp(1j * rng.uniform(-3, 3, size=4)), wires=[w[5], w[2]]
        ),
        "QubitUnitary": qml.QubitUnitary(random_unitary(4, rng), wires=[w[4], w[3]]),
    }


OPERATORS = list(_operators(np.random.default_rng(0)))


@pytest.mark.parametrize("spectator", [False, True], ids=["own_bits", "with_spectator"])
@pytest.mark.parametrize("name", OPERATORS)
def test_step_matrix_of_compiled_operations(name, spectator):
    """One operation's instructions as a matrix on its block bits equal PennyLane's matrix
    (the wire at position p of the register is state bit n - 1 - p)."""
    rng = np.random.default_rng(stable_seed("step_matrix", name))
    op = _operators(rng)[name]
    register = Register(wires=Wires(WIRES6), batch_size=1)
    instructions = compile_operation(op, register)
    bits = fusion.step_bits(register, op, instructions)
    assert bits == tuple(sorted(register.bits(op.wires)))
    targets = bits
    if spectator:
        free = [b for b in range(len(WIRES6)) if b not in bits]
        targets = tuple(sorted({*bits, free[len(free) // 2]}))
    wire_of_bit = {register.bits([w])[0]: w for w in WIRES6}
    expected = qml.matrix(op, wire_order=[wire_of_bit[t] for t in reversed(targets)])
    matrix = fused_units.step_matrix(instructions, targets)
    assert matrix.shape == (1, 1 << len(targets), 1 << len(targets))
    np.testing.assert_allclose(matrix[0], expected, atol=ATOL, rtol=0)


def test_step_matrix_without_instructions_is_identity():
    np.testing.assert_array_equal(fused_units.step_matrix([], (1, 4))[0], np.eye(4))


def test_step_matrix_broadcast():
    """Batched instruction data give one matrix per entry."""
    angles = np.array([0.3, -1.2, 2.5])
    register = Register(wires=Wires([0, 1]), batch_size=3, broadcast=True)
    op = qml.CRY(angles, wires=[1, 0])
    matrix = fused_units.step_matrix(compile_operation(op, register), (0, 1))
    assert matrix.shape == (3, 4, 4)
    for b, angle in enumerate(angles):
        expected = qml.matrix(qml.CRY(angle, wires=[1, 0]), wire_order=[0, 1])
        np.testing.assert_allclose(matrix[b], expected, atol=ATOL, rtol=0)


def test_block_runs_as_the_product_in_circuit_order():
    """Operations fused into one block run as one MATRIX instruction: their product."""
    ops = [qml.RX(0.3, 0), qml.CNOT([0, 1]), qml.RY(-0.7, 1), qml.S(0), qml.IsingZZ(0.4, [1, 0])]
    tape = qml.tape.QuantumScript(ops)
    program = fused_units.fused_program(compile_steps(tape, None), 2)
    (instruction,) = program.instructions
    assert instruction.kind is Kind.MATRIX and instruction.targets == (0, 1)
    # targets (0, 1): wire 1 is bit 0, wire 0 bit 1 (the most significant, as in PennyLane)
    expected = qml.matrix(tape, wire_order=[0, 1])
    np.testing.assert_allclose(instruction.data[0], expected, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------
# 3. The fused order, by simulation


def random_operations(rng, wires, n_ops, broadcast=None):
    """Random gates on ``wires``; ``broadcast``: the number of entries of one broadcast RX."""
    n = len(wires)

    def pick(k):
        return [wires[i] for i in rng.permutation(n)[:k]]

    def angle():
        return float(rng.uniform(-np.pi, np.pi))

    def ctrl_ry():
        control, target = pick(2)
        return qml.ctrl(qml.RY(angle(), target), control=control, control_values=[0])

    factories = [
        lambda: qml.RX(angle(), pick(1)),
        lambda: qml.RY(angle(), pick(1)),
        lambda: qml.RZ(angle(), pick(1)),
        lambda: qml.Rot(angle(), angle(), angle(), wires=pick(1)),
        lambda: qml.CNOT(pick(2)),
        lambda: qml.CZ(pick(2)),
        lambda: qml.Toffoli(pick(3)),
        lambda: qml.IsingZZ(angle(), pick(2)),
        lambda: qml.CRX(angle(), pick(2)),
        lambda: qml.SWAP(pick(2)),
        lambda: qml.Hadamard(pick(1)),
        lambda: qml.PhaseShift(angle(), pick(1)),
        lambda: qml.MultiRZ(angle(), pick(4)),
        lambda: qml.GlobalPhase(angle()),
        lambda: qml.GlobalPhase(angle(), wires=pick(1)),
        ctrl_ry,
        lambda: qml.Identity(pick(1)),
    ]

    ops = [factories[int(rng.integers(len(factories)))]() for _ in range(n_ops)]
    if broadcast:
        ops.insert(
            int(rng.integers(len(ops))),
            qml.RX(rng.uniform(-np.pi, np.pi, size=broadcast), wires=pick(1)),
        )
    return ops


CIRCUIT_SEEDS = range(3)


@pytest.mark.parametrize("k", range(7))
@pytest.mark.parametrize("seed", CIRCUIT_SEEDS)
def test_device_state_equals_default_qubit(k, seed):
    rng = np.random.default_rng(stable_seed("fused-device", seed))
    n_wires = 5 + seed % 2
    wires = WIRES6[:n_wires]
    ops = random_operations(rng, wires, int(rng.integers(30, 61)))
    dev, ref = make_devices(wires, backend="cpu", fusion_qubits=k)

    def circuit():
        for op in ops:
            qml.apply(op)
        return qml.state()

    state = qml.QNode(circuit, dev)()
    expected = qml.QNode(circuit, ref)()
    np.testing.assert_allclose(state, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64], ids=["c128", "c64"])
@pytest.mark.parametrize("case", ["all_wires", "idle_wires", "broadcast", "no_leading_gate"])
def test_leading_one_qubit_gates_prepare_a_product_state(case, dtype, monkeypatch):
    """final_state builds the state after the leading one-qubit gates (several on a wire
    too) in one pass, backend.product_state; the result equals running every instruction
    from |0...0>, and only the leading one-qubit gates go into the product."""
    rng = np.random.default_rng(stable_seed("product-state", case))
    wires = WIRES6
    idle = set(wires[4:]) if case == "idle_wires" else set()
    factories = [
        lambda w: qml.RX(float(rng.uniform(-3, 3)), w),
        lambda w: qml.RY(float(rng.uniform(-3, 3)), w),
        lambda w: qml.Hadamard(w),
        lambda w: qml.PhaseShift(float(rng.uniform(-3, 3)), w),
        lambda w: qml.Rot(*rng.uniform(-3, 3, size=3), wires=w),
        lambda w: qml.PauliY(w),
        lambda w: qml.S(w),
    ]
    leading = []
    if case != "no_leading_gate":
        busy = [w for w in wires if w not in idle]
        leading = [factories[rng.integers(len(factories))](busy[i % len(busy)]) for i in range(9)]
    if case == "broadcast":
        leading.append(qml.RZ(rng.uniform(-3, 3, size=3), wires[1]))
    ops = [*leading, qml.CNOT(wires[:2]), *random_operations(rng, wires, 12)]
    program = compile_tape(qml.tape.QuantumScript(ops, [qml.state()]), None)
    backend = CPUBackend(dtype)
    calls = _record_product_states(backend, monkeypatch)
    state, _ = simulate.final_state(backend, program)
    expected = _gate_by_gate(backend, program)
    assert state.dtype == dtype and state.shape == expected.shape
    np.testing.assert_allclose(state, expected, atol=1e-5 if dtype == np.complex64 else ATOL)
    if case == "no_leading_gate":
        assert calls == []
    else:
        ((n_qubits, factors, bits),) = calls
        touched = {w for op in leading for w in op.wires}
        assert n_qubits == 6 and list(bits) == sorted(program.register.bits(touched))
        assert factors.shape == (program.register.batch_size, len(touched), 2)


@pytest.mark.real_size_thresholds
@pytest.mark.parametrize(
    "n_wires, batch, prepared", [(4, 1, False), (8, 64, False), (15, 1, True), (10, 32, True)]
)
def test_small_batches_apply_leading_gates_one_by_one(n_wires, batch, prepared, monkeypatch):
    """On the CPU a batch under min_product_state_amplitudes (2**15) applies its leading
    one-qubit gates from |0...0> (at 4 qubits gate by gate took 15 us, the product state
    127 us); from there on they prepare a product state. Both give the same state."""
    assert CPUBackend.min_product_state_amplitudes == 1 << 15
    rng = np.random.default_rng(stable_seed("product-threshold", n_wires, batch))
    size = (batch,) if batch > 1 else ()
    ops = [qml.RY(rng.uniform(-3, 3, size=size), w) for w in range(n_wires)]
    program = compile_tape(qml.tape.QuantumScript([*ops, qml.CNOT([0, 1])], [qml.state()]), None)
    backend = CPUBackend()
    calls = _record_product_states(backend, monkeypatch)
    state, _ = simulate.final_state(backend, program)
    assert len(calls) == int(prepared)
    np.testing.assert_allclose(state, _gate_by_gate(backend, program), atol=ATOL)


def _record_product_states(backend, monkeypatch) -> list:
    """The arguments of every backend.product_state call, appended as they happen."""
    calls = []
    product_state = backend.product_state
    monkeypatch.setattr(
        backend, "product_state", lambda *args: calls.append(args) or product_state(*args)
    )
    return calls


def _gate_by_gate(backend, program):
    state = backend.zero_state(program.register.num_qubits, program.register.batch_size)
    for instruction in program.instructions:
        apply_instruction(backend, state, instruction)
    return state


@pytest.mark.parametrize("k", range(7))
@pytest.mark.parametrize(
    "case", ["plain", "broadcast", "state_prep"], ids=["plain", "broadcast", "state_prep"]
)
def test_fused_program_equals_unfused(k, case):
    """fused_program(compilation, k) runs to the same states as flatten(compilation)."""
    rng = np.random.default_rng(stable_seed("fused-program", case))
    wires = WIRES6
    ops = random_operations(rng, wires, 50, broadcast=4 if case == "broadcast" else None)
    if case == "state_prep":
        ops.insert(0, qml.StatePrep(random_state(len(wires), rng), wires=wires))
    tape = qml.tape.QuantumScript(ops, [qml.state()])
    compilation = compile_steps(tape, None)
    backend = CPUBackend()
    unfused = flatten(compilation)
    fused = fused_units.fused_program(compilation, k)
    assert fused.register is unfused.register is compilation.register
    if k >= 2:
        assert len(fused.instructions) < len(unfused.instructions)
    expected, _ = simulate.final_state(backend, unfused)
    state, _ = simulate.final_state(backend, fused)
    assert state.shape == ((4 if case == "broadcast" else 1), 2 ** len(wires))
    np.testing.assert_allclose(state, expected, atol=ATOL, rtol=0)
    # compile_steps(tape, None) registers the tape's wires, in the tape's order
    reference = qml.execute([tape], qml.device("default.qubit", wires=compilation.register.wires))[
        0
    ]
    np.testing.assert_allclose(
        backend.to_host(state).reshape(np.shape(reference)), reference, atol=ATOL, rtol=0
    )


def test_wide_operation_keeps_its_own_instructions():
    ops = [qml.RX(0.1, 0), qml.CNOT([0, 1]), qml.MultiRZ(0.4, wires=[0, 1, 2]), qml.RY(0.2, 2)]
    tape = qml.tape.QuantumScript(ops)
    compilation = compile_steps(tape, None)
    steps = compilation.steps
    bits = [fusion.step_bits(compilation.register, s.operation, s.instructions) for s in steps]
    assert bits == [(2,), (1, 2), (0, 1, 2), (0,)]  # wire 0 is the most significant bit
    assert fusion.plan(bits, 2) == (Block((1, 2), (0, 1)), Single(2), Block((0,), (3,)))
    program = fused_units.fused_program(compilation, 2)
    assert len(program.instructions) == 3
    first, middle, last = program.instructions
    assert first.kind is Kind.MATRIX and first.targets == (1, 2)
    (multirz,) = steps[2].instructions
    assert middle is multirz
    assert last.targets == (0,)


def test_z_rotations_gather_into_runs():
    """Flagged Z rotations on two bits or more open a run; later ones (also on one bit) join
    the last run they may reach; with fusion off nothing gathers."""
    bits = [(0,), (1,), (2,), (0, 1), (1, 2), (0, 2), (0,), (1,), (0, 1)]
    flags = [False, False, False, True, True, True, False, False, True]
    traits = CPUBackend.fusion_traits
    units = fusion.plan(bits, 2, traits, flags)
    assert fusion.ZRun((3, 4, 5)) in units
    members = [m for u in units for m in (u.members if hasattr(u, "members") else (u.member,))]
    assert sorted(members) == list(range(9))
    assert not any(isinstance(u, fusion.ZRun) for u in fusion.plan(bits, 1, traits, flags))


def test_lone_one_qubit_rotations_pair_up():
    """Adjacent blocks of one flagged rotation each, on distinct bits, become OneQubitRotations of
    up to rotations_per_pass members; a block of several operations or of an unflagged
    one stays as it is; with fusion or pairing off nothing changes."""
    bits = [(0,), (1,), (2,), (2,), (3,), (0, 1), (1,), (0,), (3,), (2,)]
    flags = [True, True, True, True, True, False, True, True, False, True]
    costs = CPUBackend.fusion_traits.block_costs

    def per_pass(rotations_per_pass):
        return FusionTraits(block_costs=costs, rotations_per_pass=rotations_per_pass)

    OneQubitRotations = fusion.OneQubitRotations
    assert fusion.plan(bits, 2, per_pass(2), None, flags) == (
        OneQubitRotations((0, 1)),
        Block((2,), (2, 3, 9)),  # rotations on one bit: a block, as without pairing
        Block((3,), (4, 8)),
        Block((0, 1), (5,)),  # an unflagged operation
        OneQubitRotations((6, 7)),
    )
    assert fusion.plan(bits, 2, per_pass(3), None, flags)[0] == OneQubitRotations((0, 1))
    pairs = fusion.plan([(0,), (1,), (2,), (3,), (4,)], 2, per_pass(2), None, [True] * 5)
    assert pairs == (OneQubitRotations((0, 1)), OneQubitRotations((2, 3)), Block((4,), (4,)))
    triples = fusion.plan([(0,), (1,), (2,), (3,), (4,)], 2, per_pass(3), None, [True] * 5)
    assert triples == (OneQubitRotations((0, 1, 2)), OneQubitRotations((3, 4)))
    unpaired = fusion.plan(bits, 2, per_pass(1), None, flags)
    assert unpaired == fusion.plan(bits, 2, per_pass(1))
    assert not any(
        isinstance(u, OneQubitRotations) for u in fusion.plan(bits, 1, per_pass(2), None, flags)
    )


def test_adjacent_bit_flips_become_permutation_runs():
    """Runs of at least min_permutation_run adjacent one-operation units that are bit
    flips become BitPermutationRuns of at most permutation_bits flipped bits; anything
    else between them ends a run; with fusion or the trait off nothing changes."""
    costs = CPUBackend.fusion_traits.block_costs
    traits = FusionTraits(block_costs=costs, permutation_bits=3, min_permutation_run=6)
    chain = [(b, b + 1) for b in range(7)]  # CNOT bits; each flips b + 1
    bits = [*chain, (2,), *chain[:5]]
    flipped = [(b + 1,) for b in range(7)] + [None] + [(b + 1,) for b in range(5)]
    Run = fusion.BitPermutationRun
    # 3 bits: runs close at 3 flips, too few
    narrow = fusion.plan(bits, 2, traits, None, None, flipped)
    assert not any(isinstance(u, Run) for u in narrow)
    assert narrow == fusion.plan(bits, 2, FusionTraits(block_costs=costs))
    wide = FusionTraits(block_costs=costs, permutation_bits=10, min_permutation_run=6)
    units = fusion.plan(bits, 2, wide, None, None, flipped)
    assert units[0] == Run(tuple(range(7)), (1, 2, 3, 4, 5, 6, 7))
    assert not any(isinstance(u, Run) for u in units[1:])  # the second run: 5 flips
    members = sorted(m for u in units for m in (u.members if hasattr(u, "members") else ()))
    assert members == list(range(13))
    assert fusion.plan(bits, 2, traits) == fusion.plan(bits, 2, FusionTraits(block_costs=costs))
    assert not any(isinstance(u, Run) for u in fusion.plan(bits, 1, wide, None, None, flipped))
    off = FusionTraits(block_costs=costs)
    assert not any(isinstance(u, Run) for u in fusion.plan(bits, 2, off, None, None, flipped))


def test_permutation_runs_split_at_the_bit_limit():
    costs = CPUBackend.fusion_traits.block_costs
    traits = FusionTraits(block_costs=costs, permutation_bits=6, min_permutation_run=6)
    bits = [(b, b + 1) for b in range(12)]
    flipped = [(b + 1,) for b in range(12)]
    units = fusion.plan(bits, 2, traits, None, None, flipped)
    assert units == (
        fusion.BitPermutationRun((0, 1, 2, 3, 4, 5), (1, 2, 3, 4, 5, 6)),
        fusion.BitPermutationRun((6, 7, 8, 9, 10, 11), (7, 8, 9, 10, 11, 12)),
    )
    repeated = fusion.plan([(0, 1)] * 7, 2, traits, None, None, [(1,)] * 7)
    assert repeated == (fusion.BitPermutationRun(tuple(range(7)), (1,)),)
    # the traits' minimum: three flips are too few for the CPU's 6, a run at 3
    three = fusion.plan(bits[:3], 2, traits, None, None, flipped[:3])
    assert not any(isinstance(u, fusion.BitPermutationRun) for u in three)
    shorter = dataclasses.replace(traits, min_permutation_run=3)
    assert fusion.plan(bits[:3], 2, shorter, None, None, flipped[:3]) == (
        fusion.BitPermutationRun((0, 1, 2), (1, 2, 3)),
    )


def test_flipped_bits_are_those_of_x_words_with_at_most_one_control():
    x = Instruction(Kind.PAULI, targets=(2,), paulis="X")
    cnot = Instruction(Kind.PAULI, targets=(1,), controls=(0,), control_values=(0,), paulis="X")
    toffoli = Instruction(
        Kind.PAULI, targets=(1,), controls=(0, 3), control_values=(1, 1), paulis="X"
    )
    cy = Instruction(Kind.PAULI, targets=(1,), controls=(0,), control_values=(1,), paulis="Y")
    assert fusion.flipped_bits([x]) == (2,)
    assert fusion.flipped_bits([cnot]) == (1,)
    assert fusion.flipped_bits([x, x]) == ()
    assert fusion.flipped_bits([toffoli]) is None  # not affine
    assert fusion.flipped_bits([cy]) is None
    assert fusion.flipped_bits([]) is None


def test_a_permutation_run_undoes_with_its_inverse_and_equals_its_gates():
    """The realized BIT_PERMUTATION equals the run's gates one by one, and its inverse
    undoes it (CPU kernel), on a 16-qubit StronglyEntanglingLayers ring and X gates."""
    n = 16
    weights = np.random.default_rng(5).uniform(0, 2, qml.StronglyEntanglingLayers.shape(1, n))
    ops = qml.StronglyEntanglingLayers(weights, wires=range(n)).decomposition()
    ops += [qml.PauliX(3), qml.ctrl(qml.PauliX(1), 4, control_values=0), qml.CNOT([0, 9])]
    compilation = compile_steps(qml.tape.QuantumScript(ops), Wires(range(n)))
    plan = fused_units.fused_plan(compilation, 2, CPUBackend.fusion_traits)
    runs = [u for u in plan.units if isinstance(u.unit, fusion.BitPermutationRun)]
    assert len(runs) == 2  # the ring of 16 CNOTs cut at 10 moved bits; the X gates join
    psi = random_state(n, np.random.default_rng(6)).reshape(1, -1)
    for fused in runs:
        _assert_equals_its_gates_and_undoes(compilation, fused, psi, atol=0.0)


def _assert_equals_its_gates_and_undoes(compilation, fused, psi, atol) -> None:
    """The unit's one instruction on ``psi`` equals its operations' own instructions one by
    one (CPU backend), and its inverse brings ``psi`` back (within ``atol``)."""
    backend = CPUBackend()
    (instruction,) = fused.instructions
    expected = backend.from_host(psi)
    for member in fused.unit.members:
        for gate in compilation.steps[member].instructions:
            apply_instruction(backend, expected, gate)
    state = backend.from_host(psi)
    apply_instruction(backend, state, instruction)
    np.testing.assert_allclose(state, expected, atol=atol, rtol=0)
    apply_instruction(backend, state, inverse(instruction))
    np.testing.assert_allclose(state, psi, atol=atol, rtol=0)


def test_adjacent_low_one_bit_blocks_become_tiled_runs():
    """On registers of at least min_tiled_qubits, runs of at least two adjacent blocks of
    one bit each below tile_bits become TiledRuns (bits may repeat); a block on a higher
    bit, a wider block or a lone block ends or breaks a run; rotations in a run are not
    paired; with fusion, the trait or the register size off nothing changes."""
    costs = CPUBackend.fusion_traits.block_costs
    traits = FusionTraits(block_costs=costs, rotations_per_pass=2, tile_bits=3, min_tiled_qubits=6)
    bits = [(0,), (1,), (2,), (5,), (1,), (2,), (0, 4), (0,), (3,), (4,)]
    flags = [len(b) == 1 for b in bits]  # one-qubit rotations
    Run = fusion.TiledRun
    units = fusion.plan(bits, 2, traits, None, flags, None, 6)
    assert units == (
        Run((Block((0,), (0,)), Block((1,), (1, 4)), Block((2,), (2, 5)))),
        Block((5,), (3,)),  # above tile_bits
        Block((0, 4), (6,)),
        fusion.OneQubitRotations((7, 8)),  # a lone low block, then one above: paired
        Block((4,), (9,)),
    )
    assert units[0].members == (0, 1, 4, 2, 5)
    # under min_tiled_rotation_qubits, a block of one flagged rotation stays out of runs
    apart = dataclasses.replace(traits, min_tiled_rotation_qubits=7)
    flags = [b == (1,) for b in bits]  # operations 1 and 4 on bit 1: one block of two
    assert fusion.plan(bits, 2, apart, None, flags, None, 6)[0] == units[0]
    flags = [i == 2 for i in range(len(bits))]  # operation 2, alone in its block...
    assert fusion.plan(bits, 2, apart, None, flags, None, 6)[0] == Run(
        (Block((0,), (0,)), Block((1,), (1, 4)), Block((2,), (2, 5)))
    )  # ...is not alone: operation 5 joined it
    flags = [i == 0 for i in range(len(bits))]
    assert fusion.plan(bits, 2, apart, None, flags, None, 6)[:2] == (
        Block((0,), (0,)),
        Run((Block((1,), (1, 4)), Block((2,), (2, 5)))),
    )
    assert fusion.plan(bits, 2, apart, None, flags, None, 7)[0] == units[0]
    untiled = dataclasses.replace(traits, tile_bits=0)
    assert fusion.plan(bits, 2, traits, None, flags, None, 5) == fusion.plan(
        bits, 2, untiled, None, flags, None, 5
    )  # a register under min_tiled_qubits
    assert not any(isinstance(u, Run) for u in fusion.plan(bits, 1, traits, None, flags, None, 6))
    assert not any(isinstance(u, Run) for u in fusion.plan(bits, 2, untiled, None, flags, None, 6))


@pytest.mark.parametrize("broadcast", [False, True])
def test_a_tiled_run_equals_its_blocks_and_undoes_with_its_inverse(broadcast):
    """The realized TILED_MATRICES equals the run's blocks one by one (each its operations'
    own instructions), on a layer of Rot and RX gates with a block of two operations and
    broadcast angles; its inverse undoes it; its parts are the blocks as realized alone."""
    n = 6
    rng = np.random.default_rng(stable_seed("tiled-run", broadcast))
    angles = rng.uniform(-np.pi, np.pi, size=(3, 4) if broadcast else (4,))
    ops = [qml.Rot(*rng.uniform(-1, 1, 3), wires=w) for w in range(n)]
    ops += [qml.RX(angles[..., 0], wires=5), qml.RY(angles[..., 1], wires=4), qml.CNOT([4, 5])]
    ops += [qml.RX(angles[..., 2], wires=5), qml.RY(angles[..., 1], wires=4)]
    ops += [qml.PhaseShift(angles[..., 3], wires=3)]
    compilation = compile_steps(qml.tape.QuantumScript(ops), Wires(range(n)))
    traits = FusionTraits(block_costs=CPUBackend.fusion_traits.block_costs, tile_bits=4)
    plan = fused_units.fused_plan(compilation, 2, traits)
    runs = [u for u in plan.units if isinstance(u.unit, fusion.TiledRun)]
    assert [u.instructions[0].targets for u in runs] == [(3, 2, 1, 0), (0, 1)]
    # Rot; Rot and the PhaseShift after the CNOT (on other bits); Rot and RY; Rot and RX
    assert [len(block.members) for block in runs[0].unit.blocks] == [1, 2, 2, 2]
    batch = 3 if broadcast else 1
    psi = random_state(n, np.random.default_rng(6), batch).reshape(batch, -1)
    for fused in runs:
        (instruction,) = fused.instructions
        assert instruction.kind is Kind.TILED_MATRICES
        assert instruction.data.shape == (batch, len(fused.unit.blocks), 2, 2)
        assert [part.unit for part in fused.parts] == list(fused.unit.blocks)
        _assert_equals_its_gates_and_undoes(compilation, fused, psi, atol=ATOL)


def _realized_blocks(fused_units) -> list:
    """The realized blocks of several operations, those inside tiled runs too."""
    found = []
    for fused in fused_units:
        found.extend(_realized_blocks(fused.parts))
        if isinstance(fused.unit, Block) and fused.member_matrices:
            found.append(fused)
    return found


@pytest.mark.parametrize("broadcast", [False, True])
def test_blocks_of_one_bit_rotations_realize_as_their_operations(broadcast):
    """Blocks of one-letter Pauli rotations on one bit (StronglyEntanglingLayers' RZ RY RZ,
    gathered rotations of one or several instructions, broadcast angles in some), realized
    all together (``fused_units._rotation_blocks``), are the products of their operations' own
    matrices, member by member and whole; blocks with another gate take the general path
    and agree too."""
    rng = np.random.default_rng(stable_seed("rotation-blocks", broadcast))
    batch = 3 if broadcast else 1
    shape = (batch,) if broadcast else ()
    n = 6
    weights = rng.uniform(-np.pi, np.pi, size=(2, n, 3))
    ops = [qml.StronglyEntanglingLayers(weights, wires=range(n))]
    ops += [qml.RX(rng.uniform(-3, 3, shape), wires=1), qml.RY(0.4, wires=1)]
    ops += [qml.RZ(0.2, wires=2), qml.RY(rng.uniform(-3, 3, shape), wires=2), qml.RX(0.3, 2)]
    ops += [qml.Hadamard(3), qml.RY(0.7, wires=3)]  # a block with a gate that is no rotation
    ops += [qml.Rot(0.1, 0.2, 0.3, wires=4), qml.RX(0.5, wires=4)]  # Rot: one MATRIX
    tape = qml.tape.QuantumScript(ops)
    compilation = compile_steps(tape, Wires(range(n)))
    units = fusion.plan_units(compilation, 2, CPUBackend.fusion_traits)
    runs = [unit.blocks for unit in units if isinstance(unit, fusion.TiledRun)]
    fast = sum(len(fused_units._rotation_blocks(compilation.steps, u)) for u in [units, *runs])
    assert fast >= n  # most of the template's blocks (some take the gates after them)
    blocks = _realized_blocks(fused_units.realize(compilation, units))
    assert len(blocks) > fast  # some took the general path (Hadamard, Rot)
    for fused in blocks:
        expected = [
            fused_units.step_matrix(compilation.steps[m].instructions, fused.unit.targets)
            for m in fused.unit.members
        ]
        product = expected[0]
        for matrix in expected[1:]:
            product = np.matmul(matrix, product)
        (instruction,) = fused.instructions
        assert instruction.kind is Kind.MATRIX and instruction.targets == fused.unit.targets
        assert instruction.data.shape == product.shape
        np.testing.assert_allclose(instruction.data, product, atol=1e-14, rtol=0)
        for got, want in zip(fused.member_matrices, expected, strict=True):
            # one row, or the block's rows (a member's one row repeated)
            assert got.shape in (want.shape, product.shape)
            np.testing.assert_allclose(got, np.broadcast_to(want, got.shape), atol=1e-14, rtol=0)


@pytest.mark.parametrize("broadcast", [False, True])
def test_z_rotation_run_program_equals_unfused(broadcast):
    rng = np.random.default_rng(stable_seed("z-run-program", broadcast))
    wires = WIRES6
    ops = [qml.Hadamard(w) for w in wires]
    gamma = rng.uniform(-np.pi, np.pi, size=3) if broadcast else 0.7
    for a, b in [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 0)]:
        ops.append(qml.IsingZZ(gamma, wires=[wires[a], wires[b]]))
    ops += [qml.MultiRZ(0.3, wires=wires[:4]), qml.RZ(-0.2, wires=wires[2])]
    ops += [qml.RX(0.5, wires=w) for w in wires]
    tape = qml.tape.QuantumScript(ops, [qml.state()])
    compilation = compile_steps(tape, None)
    traits = FusionTraits(block_costs=CPUBackend.fusion_traits.block_costs, z_runs=True)
    fused = fused_units.fused_program(compilation, 2, traits)
    kinds = [ins.kind for ins in fused.instructions]
    assert kinds.count(Kind.Z_ROTATIONS) == 1
    backend = CPUBackend()
    expected, _ = simulate.final_state(backend, flatten(compilation))
    state, _ = simulate.final_state(backend, fused)
    np.testing.assert_allclose(state, expected, atol=ATOL, rtol=0)


@pytest.mark.real_size_thresholds
@pytest.mark.parametrize(
    "n_wires, batch, fused", [(4, 1, False), (12, 1, False), (13, 1, True), (8, 32, True)]
)
def test_small_batches_run_unfused(n_wires, batch, fused, mocker):
    """On the CPU a batch under min_fused_amplitudes (2**13) runs gate by gate, forward and
    in the deferred sweep; from there on it is fused (W1's step at 12 qubits was 13-20%
    faster unfused, at 14 qubits 22% slower)."""
    assert CPUBackend.fusion_traits.min_fused_amplitudes == 1 << 13
    fuse = mocker.spy(fused_units, "fuse")
    wires = list(range(n_wires))

    def circuit(x, weights):
        qml.AngleEmbedding(x, wires=wires)
        qml.StronglyEntanglingLayers(weights, wires=wires)
        return qml.expval(qml.Z(0))

    rng = np.random.default_rng(stable_seed("threshold", n_wires, batch))
    x = rng.uniform(size=(batch, n_wires) if batch > 1 else n_wires)
    weights = torch.tensor(rng.uniform(size=(1, n_wires, 3)), requires_grad=True)
    dev = qml.device("custatevec.qubit", wires=n_wires, backend="cpu", fusion_qubits=3)
    qml.QNode(circuit, dev, diff_method="adjoint", device_vjp=True)(x, weights).sum().backward()
    widths = {call["max_qubits"] for call in calls(fuse)}
    assert widths == ({3} if fused else {1})
    ref = qml.QNode(circuit, qml.device("default.qubit", wires=n_wires))
    weights_ref = weights.detach().clone().requires_grad_(True)
    ref(x, weights_ref).sum().backward()
    np.testing.assert_allclose(weights.grad, weights_ref.grad, atol=1e-10)


@pytest.mark.parametrize("grad_accumulation", ["deferred", "eager"])
@pytest.mark.parametrize("broadcast", [False, True])
def test_entangling_rings_run_as_permutations_with_the_same_numbers(
    broadcast, grad_accumulation, mocker
):
    """A 16-qubit StronglyEntanglingLayers circuit (fused: its rings become permutation
    runs) gives default.qubit's values, gradients and Jacobian, with the CNOT rings run by
    apply_bit_permutation forward and in the deferred sweep."""
    n = 14
    spy = mocker.spy(CPUBackend, "apply_bit_permutation")
    dev, ref = make_devices(n, backend="cpu", grad_accumulation=grad_accumulation)
    rng = np.random.default_rng(stable_seed("rings", broadcast))
    weights = torch.tensor(
        rng.uniform(0, 2, qml.StronglyEntanglingLayers.shape(2, n)), requires_grad=True
    )
    x = torch.tensor(rng.uniform(0, 2, (3, n) if broadcast else (n,)))

    def circuit(x, weights):
        qml.AngleEmbedding(x, wires=range(n))
        qml.StronglyEntanglingLayers(weights, wires=range(n))
        qml.PauliX(2)
        return [qml.expval(qml.Z(w)) for w in (0, 5, n - 1)]

    ours = qml.QNode(circuit, dev, diff_method="adjoint", device_vjp=True, interface="torch")
    theirs = qml.QNode(circuit, ref, diff_method="backprop", interface="torch")
    got, expected = torch.stack(ours(x, weights)), torch.stack(theirs(x, weights))
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    assert spy.call_count > 0
    forward_calls = spy.call_count
    (mine,) = torch.autograd.grad(got.sum(), weights)
    (reference,) = torch.autograd.grad(expected.sum(), weights)
    torch.testing.assert_close(mine, reference, atol=ATOL, rtol=0)
    if grad_accumulation == "deferred":  # its sweep walks the fused plan back
        assert spy.call_count > forward_calls
    jacobian = torch.autograd.functional.jacobian(
        lambda w: torch.stack(ours(x, w)), weights, vectorize=False
    )
    expected_jacobian = torch.autograd.functional.jacobian(
        lambda w: torch.stack(theirs(x, w)), weights, vectorize=False
    )
    torch.testing.assert_close(jacobian, expected_jacobian, atol=ATOL, rtol=0)


def test_a_device_that_ran_permutation_runs_still_copies_and_pickles():
    """The permutation kernel's buffers live outside the backend: a device pickles and
    deep-copies before and after running permutation runs, and after an adjoint execution
    that kept its states (a copy keeps none); the copies give the same numbers and
    gradients (the copy's structure cache keeps its markers: it used to take a copied
    "seen once" marker for a structure and crash; a device that had run did not pickle)."""
    import copy
    import pickle

    n = 14
    dev = qml.device("custatevec.qubit", wires=n, backend="cpu")
    weights = np.random.default_rng(8).uniform(0, 2, qml.StronglyEntanglingLayers.shape(1, n))

    def circuit(w):
        qml.StronglyEntanglingLayers(w, wires=range(n))
        return qml.expval(qml.Z(0))

    unpickled = pickle.loads(pickle.dumps(dev))
    first = qml.QNode(circuit, dev)(weights)
    for twin in (copy.deepcopy(dev), unpickled, pickle.loads(pickle.dumps(dev))):
        assert qml.QNode(circuit, twin)(weights) == pytest.approx(first, abs=1e-12)
    # after an adjoint execution that kept its states: a copy keeps none, and differentiates
    trained = qml.QNode(circuit, dev, diff_method="adjoint")
    parameters = pnp.array(weights, requires_grad=True)
    gradient = qml.grad(trained)(parameters)
    trained(parameters)
    for twin in (copy.deepcopy(dev), pickle.loads(pickle.dumps(dev))):
        again = qml.grad(qml.QNode(circuit, twin, diff_method="adjoint"))(parameters)
        np.testing.assert_allclose(again, gradient, atol=1e-12, rtol=0)
