"""Tape -> ``Compilation`` (``compile_steps``: the register and each operation's steps) ->
``Program`` (``compile_tape``); the instructions of each operation are ``compile_ops``'."""

from __future__ import annotations

import numpy as np
import pennylane as qml
from pennylane.operation import Operator
from pennylane.tape import QuantumScript
from pennylane.wires import Wires

from .compile_ops import compile_operation, gate_instructions
from .program import (
    Compilation,
    Origin,
    Program,
    Register,
    Step,
    compiles_by_gate,
    flatten,
    initial_state_of,
    register_wires,
    tape_batch_size,
)
from .queuing import without_queuing


def compile_tape(tape: QuantumScript, device_wires: Wires | None) -> Program:
    """The Program of ``tape``; a state preparation first in the tape becomes its initial state."""
    return flatten(compile_steps(tape, device_wires))


def compile_steps(tape: QuantumScript, device_wires: Wires | None) -> Compilation:
    """The tape's register (wires, batch size, initial state) and its steps: each
    operation after the initial state preparation with its instructions, and each gate of
    a native template (see templates.py) or of a run of rotations with its one
    instruction, each with its origin."""
    wires = register_wires(tape, device_wires)
    batch_size = tape_batch_size(tape)
    operations = tape.operations
    initial_state = None
    first = 0
    if operations and isinstance(operations[0], qml.operation.StatePrepBase):
        initial_state = initial_state_of(operations[0], wires)
        first = 1
    register = Register(
        wires=wires,
        batch_size=batch_size or 1,
        broadcast=batch_size is not None,
        initial_state=initial_state,
        single_precision_data=any(
            _single_precision(value) for op in operations for value in op.data
        ),
    )
    steps: list[Step] = []
    with without_queuing():  # decompositions and matrices may build operators
        for index in range(first, len(operations)):
            steps.extend(operation_steps(operations[index], index, register))
    return Compilation(register, tuple(steps))


_SINGLE_PRECISION = (np.dtype(np.float32), np.dtype(np.complex64))


def _single_precision(value) -> bool:
    """Whether a parameter (numpy or jax) is single precision."""
    dtype = getattr(value, "dtype", None)
    return dtype is not None and dtype in _SINGLE_PRECISION


def operation_steps(op: Operator, index: int, register: Register) -> list[Step]:
    """The steps of ``op``, operation ``index`` of its tape: one with its instructions, or
    one per gate where it ``compiles_by_gate``. Call without queuing (decompositions and
    matrices may build operators)."""
    if compiles_by_gate(op):
        return [
            Step(instruction.source, (instruction,), Origin(index, position, element))
            for instruction, position, element in gate_instructions(op, register)
        ]
    return [Step(op, tuple(compile_operation(op, register)), Origin(index, 0, 0))]
