"""Circuit structures: what a preprocessed tape's parameter values do not decide.

A ``Structure`` stands for every tape that differs from its template tape only in the
values of its operations' parameters: the same gate types, wires and hyperparameters, the
same parameter shapes and dtypes, the same trainable parameters and the same measurements
(exactly, observables' data included). The device's compiled path
(``pennylane_custatevec.compiled``) records a quantum function once, preprocesses its
tape, and then runs the structure with new parameter values on every call
(``CuStateVecDevice.execute_structures``), without building tapes or operators.

``StructureKey`` decides which tapes share a structure: it compares exactly (``exact``),
never by ``hash``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from pennylane.tape import QuantumScript

from .exact import gate_key, generator_key, measurements_key
from .kept import KeptState
from .program import compiles_by_gate


@dataclasses.dataclass(frozen=True)
class StructureKey:
    """Equal for tapes that differ at most in the values of their operations'
    parameters (module docstring)."""

    wires: tuple
    """The tape's wire labels, in tape order."""
    gates: tuple
    """Per operation: its type, wires and hyperparameters exactly, the data its generator
    depends on (``_operation_key``: none for PennyLane's qubit gates), and the dtypes and
    shapes of its parameters."""
    measurements: tuple
    """The measurements exactly (``exact.measurements_key``)."""
    trainable: tuple[int, ...]
    """``tape.trainable_params``."""

    @classmethod
    def of(cls, tape: QuantumScript) -> StructureKey:
        return cls(
            wires=tuple(tape.wires.labels),
            gates=tuple(
                (_operation_key(op), tuple(map(_value_shape, op.data))) for op in tape.operations
            ),
            measurements=measurements_key(tape.measurements),
            trainable=tuple(tape.trainable_params),
        )


def _operation_key(op) -> tuple:
    """What of an operation its structure holds: its ``generator_key``; for a native
    template or a run of rotations, whose steps are its gates (each a rotation with a
    generator fixed by its type), its ``gate_key``."""
    return gate_key(op) if compiles_by_gate(op) else generator_key(op)


def _value_shape(value) -> tuple:
    array = np.asarray(value)
    return array.dtype.str, array.shape


@dataclasses.dataclass(frozen=True, eq=False)
class Structure:
    """A preprocessed, analytic tape standing for its structure (module docstring)."""

    template: QuantumScript
    """The tape the structure was made from; its parameter values are not used."""
    n_parameters: int
    """How many parameters its operations have (what ``parameters`` holds per call)."""

    @classmethod
    def of(cls, tape: QuantumScript) -> Structure:
        if tape.shots:
            raise ValueError(
                "a Structure is analytic: the tape has shots; run it through the QNode."
            )
        parameters = tape.get_parameters(trainable_only=False, operations_only=True)
        n_ops_params = len(parameters)
        observable_trainable = [index for index in tape.trainable_params if index >= n_ops_params]
        if observable_trainable:
            raise ValueError(
                "a Structure differentiates gate parameters only; the tape's trainable "
                f"parameters {observable_trainable} belong to its observables."
            )
        return cls(tape, n_ops_params)

    def bind(self, parameters: Sequence) -> QuantumScript:
        """The template with ``parameters`` (one per operation parameter, in tape order)."""
        if len(parameters) != self.n_parameters:
            raise ValueError(
                f"the structure takes {self.n_parameters} operation parameters, got "
                f"{len(parameters)}."
            )
        return self.template.bind_new_parameters(list(parameters), list(range(self.n_parameters)))


@dataclasses.dataclass(eq=False)
class StructureRun:
    """What ``execute_structures`` hands to ``vjp_structures``: the results, and for each
    structure the tape it ran and its kept final state (consumed by the VJP, once:
    ``take_kept``)."""

    results: tuple
    """One result per structure, as ``execute`` returns it for its tape."""
    tapes: tuple[QuantumScript, ...]
    """The tapes that ran (each structure's template with the call's parameters)."""
    kept: list[KeptState | None]
    """The final state the forward pass kept of each tape, or None (not kept: memory,
    or taken already)."""

    def take_kept(self) -> list[KeptState | None]:
        """The kept states, handed out once (a sweep consumes them); None afterwards."""
        kept, self.kept = self.kept, [None] * len(self.kept)
        return kept
