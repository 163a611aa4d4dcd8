"""Broadcast tapes expanded into one tape per entry where a sweep cannot take them whole:
``broadcast_expand`` for operators broadcast by their hyperparameters (a power's exponent,
a pulse's times) and for PennyLane's stale batch sizes."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import pennylane as qml
from pennylane import math
from pennylane.exceptions import DeviceError
from pennylane.operation import Operator
from pennylane.pytrees import flatten, unflatten
from pennylane.tape import QuantumScript
from pennylane.transforms import broadcast_expand
from pennylane.transforms.core import transform

from ..entrywise import EntrywiseState, EntrywiseUnitary
from ..program import (
    is_broadcast,
    is_broadcast_by_hyperparameters,
    is_broadcast_power,
    tape_batch_size,
)
from .common import first_result


@transform
def expand_broadcasts(
    tape: QuantumScript, trainable_only: bool = False, mid_measurements_only: bool = False
):
    """``broadcast_expand``, with ``trainable_only`` only for a tape in which a broadcast
    parameter is trainable (its gradient has one entry per broadcast entry): the deferred
    mode differentiates other broadcast tapes whole, as one batch, but for a tape with an
    ``EntrywiseUnitary`` or a postselection, which the eager sweep differentiates (one
    vector); with
    ``mid_measurements_only`` only for an analytic tape with mid-circuit measurements (the
    tree traversal follows the branches of one state).

    The expanded tapes' operations are rebuilt where PennyLane's parameter binding kept a
    stale batch size (MultiRZ, PCPhase, their controlled and adjoint forms in 0.45), so
    that no expanded tape claims to be broadcast."""
    if tape_batch_size(tape) is None:
        return (tape,), first_result
    if mid_measurements_only and (
        tape.shots or not any(isinstance(op, qml.ops.MidMeasure) for op in tape.operations)
    ):
        return (tape,), first_result
    if trainable_only and not any(
        (is_broadcast(op) and any(math.requires_grad(d) for d in op.data))
        or isinstance(op, (EntrywiseUnitary, EntrywiseState, qml.Projector))  # eager's only
        for op in tape.operations
    ):
        return (tape,), first_result
    tapes, recombine = split_broadcast(tape)
    rebuilt = [
        t.copy(
            operations=[_rebuilt(op) for op in t.operations], trainable_params=t.trainable_params
        )
        for t in tapes
    ]
    return rebuilt, recombine


def split_broadcast(tape: QuantumScript) -> tuple[Sequence[QuantumScript], Callable]:
    """PennyLane's ``broadcast_expand``, with each operator broadcast by its
    hyperparameters (a power over its exponent, a pulse over its times) written as its
    matrices first: the expansion splits operators' parameters, and an exponent or a time
    is not one (the expansion recursed without end)."""
    if any(map(is_broadcast_by_hyperparameters, tape.operations)):
        tape = tape.copy(operations=[_broadcast_as_matrix(op) for op in tape.operations])
    if any(_lacks_parameter_dimensions(op) for op in tape.operations):
        tape = tape.copy(operations=[_with_parameter_dimensions(op) for op in tape.operations])
    return broadcast_expand(tape)


def _lacks_parameter_dimensions(op: Operator) -> bool:
    """Whether PennyLane's expansion cannot split ``op``: a broadcast ``qml.exp`` has no
    ``ndim_params`` in 0.45 (AttributeError)."""
    if op.batch_size is None:
        return False
    try:
        op.ndim_params  # noqa: B018
    except AttributeError:
        return isinstance(op, qml.ops.op_math.Exp)
    return False


def _with_parameter_dimensions(op: Operator) -> Operator:
    """A copy of a broadcast ``qml.exp`` that knows its parameters' dimensions (its scalar
    coefficient, then its base's), which the expansion reads to split it."""
    if not _lacks_parameter_dimensions(op):
        return op
    op = copy.copy(op)
    op._ndim_params = (0, *op.base.ndim_params)
    return op


def _broadcast_as_matrix(op):
    if not is_broadcast_by_hyperparameters(op):
        return op
    if any(math.requires_grad(d) for d in op.data):
        kind, over, entry = (
            ("a power", "exponent", "exponents; write one power per exponent")
            if is_broadcast_power(op)
            else ("a pulse", "intermediate times", "times; write one pulse per time")
        )
        raise DeviceError(
            f"custatevec.qubit cannot differentiate {op.name}, {kind} broadcast over its "
            f"{over} with trainable parameters: the adjoint method expands it into one "
            f"circuit per entry, and PennyLane's expansion splits parameters, not {entry}."
        )
    return qml.QubitUnitary(op.matrix(), wires=op.wires)


def _rebuilt(op):
    return op if op.batch_size is None else unflatten(*flatten(op))
