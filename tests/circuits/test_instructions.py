"""The instruction kinds' tables (instructions.py): complete, explicit where an operation
does not exist, and the one place a new kind is added.

The numerical meaning of each entry is tested against dense matrices in test_simulate.py.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np
import pennylane as qml
import pytest
from pennylane.wires import Wires

from pennylane_custatevec import fused_units, fusion, instructions, simulate
from pennylane_custatevec.backends.cpu import CPUBackend
from pennylane_custatevec.instructions import Instruction, Kind, Unsupported
from pennylane_custatevec.program import Compilation, Origin, Program, Register, Step

OPERATIONS = {
    "apply": lambda ins: instructions.apply_instruction(
        CPUBackend(), CPUBackend().zero_state(3, 1), ins
    ),
    "matrix": instructions.instruction_matrix,
    "inverse": instructions.inverse,
    "masked": lambda ins: instructions.masked(ins, np.array([True])),
}
"""Each table's public operation, called on one instruction."""

WITHOUT = {
    "apply": {Kind.MID_MEASURE, Kind.POSTSELECT},
    "matrix": {
        Kind.Z_ROTATIONS,
        Kind.ONE_QUBIT_ROTATIONS,
        Kind.BIT_PERMUTATION,
        Kind.TILED_MATRICES,
        Kind.MID_MEASURE,
        Kind.POSTSELECT,
    },
    "inverse": {Kind.MID_MEASURE, Kind.POSTSELECT},
    "masked": {Kind.BIT_PERMUTATION, Kind.TILED_MATRICES, Kind.MID_MEASURE, Kind.POSTSELECT},
}
"""The kinds that do not have each operation (pinned: a change here is a decision)."""


@pytest.mark.parametrize("operation", sorted(instructions.TABLES))
def test_every_kind_has_an_entry_in_every_table(operation):
    """Every member of Kind is in every table, as a function or as Unsupported with a
    reason; nothing else is."""
    table = instructions.TABLES[operation]
    assert set(table) == set(Kind)
    for kind, entry in table.items():
        assert callable(entry) or (isinstance(entry, Unsupported) and entry.reason), kind
    unsupported = {kind for kind, entry in table.items() if isinstance(entry, Unsupported)}
    assert unsupported == WITHOUT[operation]


def test_the_tables_are_the_four_operations():
    assert set(instructions.TABLES) == set(OPERATIONS) == set(WITHOUT)


@pytest.mark.parametrize(
    "operation, kind",
    [(operation, kind) for operation, kinds in WITHOUT.items() for kind in sorted(kinds, key=str)],
    ids=str,
)
def test_an_unsupported_operation_raises_its_reason(operation, kind):
    reason = instructions.TABLES[operation][kind].reason
    with pytest.raises(ValueError, match=f"{kind} has no {operation}: it ") as error:
        OPERATIONS[operation](Instruction(kind, targets=(0,)))
    assert reason in str(error.value)


def test_has_matrix_is_what_fusion_may_fuse():
    fusible = {kind for kind in Kind if instructions.has_matrix(kind)}
    assert fusible == {Kind.MATRIX, Kind.DIAGONAL, Kind.PAULI, Kind.PAULI_ROTATION, Kind.PHASE}
    register = Register(wires=Wires([0]))
    measure = qml.ops.MidMeasure(0)
    unfusable = [Instruction(Kind.MID_MEASURE, targets=(0,), source=measure)]
    assert fusion.step_bits(register, measure, unfusable) is None


# ---------------------------------------------------------------------------------------
# A toy kind, added from the test: entries in the four tables of instructions.py only


class ToyKind(enum.Enum):
    """A kind outside ``Kind``: it exists only through the entries registered below."""

    SWAP = "swap"


SWAP = np.array([[1, 0, 0, 0], [0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 1]], dtype=np.complex128)


@pytest.fixture
def toy_kind(monkeypatch):
    """Register ToyKind.SWAP (swap the two target bits, through the backend's dense
    kernel) in instructions.py's tables and nowhere else."""
    entries = {
        "apply": lambda backend, state, ins: backend.apply_matrix(
            state, SWAP[None], ins.targets, ins.controls, ins.control_values
        ),
        "matrix": lambda ins: SWAP[None],
        "inverse": lambda ins: ins,
        "masked": lambda ins, selected: instructions.masked(
            dataclasses.replace(ins, kind=Kind.MATRIX, data=SWAP[None]), selected
        ),
    }
    for operation, entry in entries.items():
        monkeypatch.setitem(instructions.TABLES[operation], ToyKind.SWAP, entry)
    return ToyKind.SWAP


def _toy_program_parts():
    """|000>, X on wire 2 (bit 0), then the toy swap of bits 0 and 2: |100> (index 4)."""
    register = Register(wires=Wires([0, 1, 2]))
    flip = qml.X(2)
    swap = qml.SWAP(wires=[0, 2])
    steps = (
        Step(
            flip, (Instruction(Kind.PAULI, targets=(0,), paulis="X", source=flip),), Origin(0, 0, 0)
        ),
        Step(swap, (Instruction(ToyKind.SWAP, targets=(2, 0), source=swap),), Origin(1, 0, 0)),
    )
    return register, steps


def _basis(index: int) -> np.ndarray:
    vector = np.zeros(8, dtype=np.complex128)
    vector[index] = 1.0
    return vector


def test_a_toy_kind_runs_through_simulate(toy_kind):
    register, steps = _toy_program_parts()
    program = Program(register, tuple(ins for step in steps for ins in step.instructions))
    backend = CPUBackend()
    state, _ = simulate.final_state(backend, program)
    np.testing.assert_allclose(backend.to_host(state)[0], _basis(4), atol=1e-12)
    # and back: the inverses in reverse order undo the program
    for instruction in reversed(program.instructions):
        instructions.apply_instruction(backend, state, instructions.inverse(instruction))
    np.testing.assert_allclose(backend.to_host(state)[0], _basis(0), atol=1e-12)


def test_a_toy_kind_is_fused_through_its_matrix(toy_kind):
    """Its matrix entry makes it fusible: both steps become one MATRIX block."""
    register, steps = _toy_program_parts()
    program = fused_units.fused_program(Compilation(register, steps), 3)
    (block,) = program.instructions
    assert block.kind is Kind.MATRIX and block.targets == (0, 2)
    backend = CPUBackend()
    state, _ = simulate.final_state(backend, program)
    np.testing.assert_allclose(backend.to_host(state)[0], _basis(4), atol=1e-12)


def test_a_toy_kind_is_conditioned_through_its_masked_entry(toy_kind):
    """In the one-shot method a condition selects shots: the swap acts where wire 2 was
    measured 1 (the shots flipped to |001> become |100>), else nothing changes."""
    register, steps = _toy_program_parts()
    with qml.queuing.AnnotatedQueue():
        measured = qml.measure(2)
    (mid,) = measured.measurements
    hadamard = np.array([[1, 1], [1, -1]], dtype=np.complex128)[None] / np.sqrt(2)
    program = Program(
        register,
        (
            Instruction(Kind.MATRIX, targets=(0,), data=hadamard),
            Instruction(Kind.MID_MEASURE, targets=(0,), source=mid),
            dataclasses.replace(steps[1].instructions[0], condition=measured),
        ),
    )
    backend = CPUBackend()
    state, outcomes = simulate.final_state_per_shot(backend, program, 32, np.random.default_rng(7))
    (outcome,) = outcomes.values()
    assert 0 < outcome.sum() < 32
    vectors = backend.to_host(state)
    for shot, bit in enumerate(outcome):
        np.testing.assert_allclose(np.abs(vectors[shot]), _basis(4 if bit else 0), atol=1e-12)


def test_without_its_entries_a_toy_kind_is_refused():
    """The tables, not branches elsewhere, decide: an unregistered kind has no apply."""
    register, steps = _toy_program_parts()
    program = Program(register, steps[1].instructions)
    with pytest.raises(KeyError):
        simulate.final_state(CPUBackend(), program)
