"""Tape transforms of the device's preprocessing that PennyLane does not ship."""

from __future__ import annotations

from pennylane.operation import StatePrepBase
from pennylane.tape import QuantumScript
from pennylane.transforms import diagonalize_measurements, split_non_commuting
from pennylane.transforms.core import transform


def _first_result(results):
    return results[0]


@transform
def decompose_late_state_preps(tape: QuantumScript):
    """Replace state preparations after the first operation by their decompositions.

    The device starts from a prepared state only at the beginning of a circuit.
    """
    operations = []
    for position, op in enumerate(tape.operations):
        if position > 0 and isinstance(op, StatePrepBase):
            operations.extend(op.decomposition())
        else:
            operations.append(op)
    return (tape.copy(operations=operations),), _first_result


@transform
def rotate_sampled_measurements(tape: QuantumScript):
    """For finite shots: split into qubit-wise commuting groups and rotate each group's
    observables into the computational basis, where the device samples."""
    if not tape.shots or all(mp.obs is None for mp in tape.measurements):
        return (tape,), _first_result
    groups, recombine = split_non_commuting(tape, grouping_strategy="qwc")
    rotated = []
    for group in groups:
        (diagonal,), _ = diagonalize_measurements(group)
        rotated.append(diagonal)
    return tuple(rotated), recombine
