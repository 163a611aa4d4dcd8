"""The gate sequences that a backend may run in one call (``Backend.sequence_amplitudes``):
``GateSequence`` and its entries (dense gates, Pauli rotations, and where the adjoint sweep
takes a gradient). ``sequences.py`` builds them."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class DenseEntry:
    """A gate of a ``GateSequence``: a matrix on ``bits`` (bit j of its index on state bit
    ``bits[j]``; a controlled gate's controls among them, as ``instructions.
    instruction_matrix`` gives it)."""

    bits: tuple[int, ...]
    matrix: np.ndarray | None
    """(2**k, 2**k) complex128, or None: the call gives it (``matrices[slot]``)."""
    slot: int = -1


@dataclasses.dataclass(frozen=True)
class RotationEntry:
    """A gate of a ``GateSequence``: exp(-i angle/2 P), P the word ``paulis`` on
    ``targets``, where the controls equal their values; its angle per vector is column
    ``slot`` of the call's ``angles``."""

    paulis: str
    targets: tuple[int, ...]
    controls: tuple[int, ...]
    control_values: tuple[int, ...]
    slot: int


@dataclasses.dataclass(frozen=True)
class DerivativeEntry:
    """Not a gate: where the adjoint sweep of a ``GateSequence`` takes the gradient of the
    gate step just before it, d/dtheta Re <bra|psi> = Re(i <bra|G|phi>) (phi the state after
    that step), into gradient column ``column``. ``generator`` is G: a matrix on its bits
    (a ``DenseEntry`` whose matrix is set), or, for a Pauli rotation, the rotation itself
    (G = -P/2 where its controls hold)."""

    column: int
    generator: DenseEntry | RotationEntry


SequenceEntry = DenseEntry | RotationEntry | DerivativeEntry


@dataclasses.dataclass(frozen=True)
class GateSequence:
    """A whole circuit for a backend that runs it in one call (``Backend.
    sequence_amplitudes``): its gates in order, with derivative entries for the sweep.
    Made by ``sequences.py``, compiled by the backend once (``prepare_sequence``)."""

    num_qubits: int
    entries: tuple[SequenceEntry, ...]
    n_slots: int
    """Columns of the call's ``angles`` (one per rotation)."""
    n_matrices: int
    """Matrices the call gives (``DenseEntry.slot``)."""
