"""program.py: tapes compiled to a Register, a Compilation (steps with origins) and a
Program with its kernel key.

Conventions: the wire at position p of the register is state bit n - 1 - p; targets are
little-endian (``targets[j]`` is bit j of a matrix index), so the targets of an operator
are its wires' bits reversed.
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from pennylane.wires import Wires
from reference import random_state

from pennylane_custatevec.compile_tapes import compile_steps, compile_tape
from pennylane_custatevec.instructions import Kind
from pennylane_custatevec.program import Compilation, Origin, Program, Register, flatten, merge

WIRES = ["a", 3, "q1", 0]  # mixed labels, not sorted


def test_bits_and_targets_are_reversed_wire_positions():
    register = Register(wires=Wires(WIRES))
    assert register.num_qubits == 4
    assert register.bits(["a", 3, "q1", 0]) == (3, 2, 1, 0)
    assert register.bits([0, "a"]) == (0, 3)
    assert register.targets(["a", "q1"]) == (1, 3)  # "q1" is bit 0 of the matrix index


def test_device_wires_order_the_register():
    """The register takes the device's order of the wires the tape uses; without device
    wires, the tape's."""
    tape = qml.tape.QuantumScript([qml.CNOT(["q1", "a"])], [qml.state()])
    assert list(compile_steps(tape, Wires(WIRES)).register.wires) == ["a", "q1"]
    assert list(compile_steps(tape, None).register.wires) == ["q1", "a"]


def test_compiled_instructions_act_on_the_wires_bits():
    tape = qml.tape.QuantumScript(
        [qml.CNOT(["a", 0]), qml.RX(0.3, "q1"), qml.IsingZZ(0.2, [3, 0]), qml.S(3)],
        [qml.state()],
    )
    compilation = compile_steps(tape, Wires(WIRES))
    cnot, rx, zz, s = (step.instructions for step in compilation.steps)
    ((cnot,),) = (cnot,)
    assert (cnot.kind, cnot.targets, cnot.controls, cnot.control_values, cnot.paulis) == (
        Kind.PAULI,
        (0,),
        (3,),
        (1,),
        "X",
    )
    assert rx[0].kind is Kind.PAULI_ROTATION and rx[0].targets == (1,) and rx[0].paulis == "X"
    np.testing.assert_array_equal(rx[0].data, [0.3])
    assert zz[0].kind is Kind.PAULI_ROTATION and zz[0].targets == (0, 2)
    assert s[0].kind is Kind.DIAGONAL and s[0].targets == (2,)
    np.testing.assert_allclose(s[0].data, [[1.0, 1j]])


def test_steps_and_origins():
    """A leading state preparation is the register's initial state, not a step; an
    operation is one step with origin (its index, parameter 0, element 0); a native
    template is one step per gate, each rotation reading its element of the weights,
    each entangler reading nothing."""
    state = random_state(2, np.random.default_rng(3))
    weights = np.array([[[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]])
    ops = [
        qml.StatePrep(state, wires=[0, 1]),
        qml.RX(0.7, 0),
        qml.StronglyEntanglingLayers(weights, wires=[0, 1]),
        qml.Hadamard(1),
    ]
    compilation = compile_steps(qml.tape.QuantumScript(ops, [qml.state()]), None)
    np.testing.assert_allclose(compilation.register.initial_state, state[None])
    origins = [step.origin for step in compilation.steps]
    assert origins[0] == Origin(1, 0, 0)
    assert origins[-1] == Origin(3, 0, 0)
    template = origins[1:-1]
    assert all(origin.operation == 2 for origin in template)
    rotations = [o.element for o in template if o.parameter is not None]
    assert sorted(rotations) == list(range(weights.size))
    assert sum(o.parameter is None for o in template) == 2  # the two CNOTs of one layer
    assert compilation.steps[0].operation is ops[1]
    assert all(len(step.instructions) == 1 for step in compilation.steps)


def test_flatten_keeps_the_register_and_the_steps_instructions_in_order():
    tape = qml.tape.QuantumScript(
        [qml.Hadamard(0), qml.Toffoli([0, 1, 2]), qml.adjoint(qml.T(1))], [qml.state()]
    )
    compilation = compile_steps(tape, None)
    program = flatten(compilation)
    assert isinstance(program, Program) and program.register is compilation.register
    assert program.instructions == tuple(
        ins for step in compilation.steps for ins in step.instructions
    )
    assert compile_tape(tape, None).kernel_key == program.kernel_key


def _key(ops, device_wires=None) -> tuple:
    return compile_tape(qml.tape.QuantumScript(ops, [qml.state()]), device_wires).kernel_key


def test_kernel_key_is_equal_for_tapes_of_one_structure():
    """Other angles, matrices, or a broadcast (the batch axis is not in the key): the same
    kernels on the same bits."""
    rng = np.random.default_rng(5)

    def ops(x, u):
        return [qml.RX(x, 0), qml.CNOT([0, 1]), qml.QubitUnitary(u, wires=1), qml.PhaseShift(x, 0)]

    u1, u2 = (np.linalg.qr(rng.normal(size=(2, 2)))[0] for _ in range(2))
    assert _key(ops(0.3, u1)) == _key(ops(-1.2, u2)) == _key(ops(np.array([0.1, 0.2]), u1))


@pytest.mark.parametrize(
    "first, second",
    [
        (qml.IsingXY(0.4, [0, 1]), qml.SingleExcitation(0.4, [0, 1])),  # one 4x4 matrix each
        (qml.PhaseShift(0.4, 0), qml.ctrl(qml.GlobalPhase(-0.4), control=0)),  # one diagonal
    ],
    ids=["IsingXY-SingleExcitation", "PhaseShift-ctrl(GlobalPhase)"],
)
def test_kernel_key_of_lookalike_gates_with_the_same_kernels_is_equal(first, second):
    """The forward pass runs the same kernels for these: one batch (the sweep key, not the
    kernel key, tells them apart for the derivative: test_exact_keys.py)."""
    assert _key([qml.Hadamard(1), first]) == _key([qml.Hadamard(1), second])


@pytest.mark.parametrize(
    "first, second",
    [
        ([qml.RX(0.4, 0)], [qml.RY(0.4, 0)]),  # other Pauli letter
        ([qml.CNOT([0, 1])], [qml.CZ([0, 1])]),  # other Pauli letter under a control
        ([qml.CNOT([0, 1])], [qml.CNOT([1, 0])]),  # other bits
        ([qml.RX(0.4, 0)], [qml.QubitUnitary(qml.matrix(qml.RX(0.4, 0)), wires=0)]),  # kind
        ([qml.CNOT([0, 1])], [qml.ctrl(qml.X(1), 0, control_values=0)]),  # control value
        ([qml.Hadamard(0), qml.S(1)], [qml.S(1), qml.Hadamard(0)]),  # order
        ([qml.RX(0.4, 0)], [qml.StatePrep(np.array([0, 1, 0, 0]), [0, 1]), qml.RX(0.4, 0)]),
    ],
    ids=["letter", "controlled-letter", "bits", "kind", "control-value", "order", "prepared"],
)
def test_kernel_key_differs_where_the_kernels_differ(first, second):
    wires = Wires([0, 1])
    assert _key(first + [qml.Identity(1)], wires) != _key(second + [qml.Identity(1)], wires)


def test_kernel_key_differs_for_another_wire_order():
    ops = [qml.RX(0.4, 0), qml.CNOT([0, 1])]
    assert _key(ops, Wires([0, 1])) != _key(ops, Wires([1, 0]))


def test_merge_concatenates_the_batches():
    """Compilations of one structure become one batch: per-vector data concatenated,
    data that every compilation shares left shared, the first's operations and origins."""
    tapes = [
        qml.tape.QuantumScript([qml.Hadamard(0), qml.RX(x, 0)], [qml.expval(qml.Z(0))])
        for x in (0.1, np.array([0.2, 0.3]))
    ]
    compilations = [compile_steps(tape, None) for tape in tapes]
    merged = merge(compilations)
    assert isinstance(merged, Compilation)
    assert merged.register.batch_size == 3
    hadamard, rx = merged.steps
    assert hadamard.instructions[0].data is compilations[0].steps[0].instructions[0].data
    np.testing.assert_array_equal(rx.instructions[0].data, [0.1, 0.2, 0.3])
    assert rx.operation is compilations[0].steps[1].operation
    assert rx.origin == compilations[0].steps[1].origin
    assert merge(compilations[:1]) is compilations[0]
