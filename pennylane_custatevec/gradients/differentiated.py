"""``DifferentiatedTape``, a tape as the adjoint method sees it, and its column layout
(``_ColumnLayout``: where each trainable parameter's scalars go, kept in the compilation's
memo); the gradients of its observable data are read off the final state
(``observables``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from pennylane.operation import Operator
from pennylane.tape import QuantumScript
from pennylane.wires import Wires

from .. import simulate
from ..backends.base import Backend
from ..backends.primitives import StateBatch
from ..compile_tapes import compile_steps
from ..entrywise import EntrywiseState, EntrywiseUnitary, selected_block
from ..program import Compilation, Register, flatten
from .observables import ObservableColumns, observable_data_derivatives, observable_values
from .results import is_zero

_LAYOUT = ("gradients", "layout")
"""The start of the key of a ``_ColumnLayout`` in ``program.Compilation.memo`` (then the
tape's trainable parameters)."""


def _part_columns(
    operation: Operator, position: int, trainable: dict, starts: list
) -> np.ndarray | None:
    """The column of each part (parameter) of an ``entrywise`` operation at ``position``
    in the tape, -1 for a constant one; None when none is trainable. A controlled
    ``EntrywiseUnitary``'s are laid out over its whole matrix's parts, as the sweep
    reduces the whole dense block: its parts in the selected block, -1 elsewhere."""
    at = np.array(
        [
            starts[trainable[position, p]] if (position, p) in trainable else -1
            for p in range(len(operation.data))
        ]
    )
    if not bool((at >= 0).any()):
        return None
    control_values = getattr(operation, "control_values", ())
    if not control_values:
        return at
    block = int(round(np.sqrt(len(at) / 2)))
    full = block * 2 ** len(control_values)
    rows = selected_block(control_values, block) + np.arange(block)
    # entry (a, c) of the block is entry (offset + a, offset + c) of the whole matrix
    entries = (rows[:, None] * full + rows[None, :]).reshape(-1)
    whole = np.full(2 * full * full, -1)
    whole[2 * entries] = at[0::2]
    whole[2 * entries + 1] = at[1::2]
    return whole


@dataclasses.dataclass(frozen=True)
class _ColumnLayout:
    """Where each trainable parameter's scalars go (``DifferentiatedTape``'s columns): a
    function of the tape's structure alone (its trainable parameters' shapes, which
    operation each belongs to, its steps' origins, its observables)."""

    n_params: int
    shapes: list
    n_columns: int
    starts: list
    observable_columns: tuple
    columns: dict
    entry_columns: dict
    state_columns: tuple | None

    @classmethod
    def of(cls, tape: QuantumScript, steps: Sequence, register: Register) -> _ColumnLayout:
        # all of them, then the trainable: with trainable_only, PennyLane rebuilds an
        # observable's data for each of its entries (K**2 for a sum of K terms)
        every = tape.get_parameters(trainable_only=False)
        parameters = [every[index] for index in tape.trainable_params]
        shapes = [getattr(value, "shape", ()) for value in parameters]
        starts = [0]
        for shape in shapes:
            starts.append(starts[-1] + math.prod(shape))
        n_ops = len(tape.operations)
        trainable = {}
        observed = []
        for p, index in enumerate(tape.trainable_params):
            info = tape.par_info[index]
            if info["op_idx"] < n_ops:
                trainable[info["op_idx"], info["p_idx"]] = p
            else:
                observed.append((p, info["op_idx"] - n_ops, info["p_idx"]))
        observable_columns: tuple[ObservableColumns, ...] = ()
        if observed:
            derivatives = observable_data_derivatives(tape, tape.trainable_params)
            observable_columns = tuple(
                ObservableColumns(
                    measurement=m,
                    start=starts[p],
                    stop=starts[p + 1],
                    derivative=derivatives[m][entry],
                    complex_gradient=bool(np.iscomplexobj(parameters[p])),
                )
                for p, m, entry in observed
            )
        columns = {}
        entry_columns = {}
        for index, step in enumerate(steps):
            origin = step.origin
            if isinstance(step.operation, EntrywiseUnitary):
                at = _part_columns(step.operation, origin.operation, trainable, starts)
                if at is not None:
                    entry_columns[index] = at
                    columns[index] = int(at[at >= 0].min())
            elif (origin.operation, origin.parameter) in trainable:
                p = trainable[origin.operation, origin.parameter]
                columns[index] = starts[p] + origin.element
        state_columns = None
        operations = tape.operations
        if operations and isinstance(operations[0], EntrywiseState):
            at = _part_columns(operations[0], 0, trainable, starts)
            if at is not None:
                state_columns = (at, _amplitude_indices(operations[0], register))
        return cls(
            len(parameters),
            shapes,
            starts[-1],
            starts,
            observable_columns,
            columns,
            entry_columns,
            state_columns,
        )


def _amplitude_indices(preparation: Operator, register: Register) -> np.ndarray:
    """Where amplitude k of ``preparation``'s state (its wires, the first most significant)
    sits in the register's vectors, the other wires in |0>: sum_j bit_j(k) 2**bit(w_j)."""
    bits = register.bits(preparation.wires)
    k = np.arange(2 ** len(bits))
    indices = np.zeros_like(k)
    for j, bit in enumerate(bits):
        indices |= ((k >> (len(bits) - 1 - j)) & 1) << bit
    return indices


class DifferentiatedTape:
    """A tape as the adjoint method sees it: its compilation (register and steps), the
    columns of its trainable gates and the data of its observables. Named for what it is:
    the tape that is differentiated, not a circuit in general (the forward pass knows
    the same tape as a ``Compilation`` and a ``Program``).
    It does not validate: the tape comes from the device's preprocessing, or the entry
    point validated it (``require_adjoint_serves``).

    One column per scalar of the trainable parameters (``n_columns`` in all), in
    ``tape.trainable_params`` order: a scalar parameter has one, an array parameter (a
    native template's weights, a Hermitian's matrix) one per element. The sweeps
    differentiate by gate: ``columns`` maps each trainable step to its column; an
    ``EntrywiseUnitary``'s step, one column per trainable real part, has them in
    ``entry_columns`` (an array per step, -1 for a constant part), and its first in
    ``columns``, which only the eager sweep reads for it. A trainable ``EntrywiseState``
    that opens the tape (the register's initial state, not a step) has ``state_columns``:
    (its parts' columns, -1 for a constant; where each amplitude sits in the register's
    vectors), else None. The trainable data of observables, which come after the
    operations' parameters, have ``observable_columns``, read off the final state
    (``observable_gradients``). ``fold`` turns per-column values into per-parameter ones."""

    def __init__(
        self,
        tape: QuantumScript,
        device_wires: Wires | None,
        compilation: Compilation | None = None,
    ):
        self.tape = tape
        self.compilation = compilation or compile_steps(tape, device_wires)
        self.register = self.compilation.register
        self.steps = self.compilation.steps
        # a structure's memo: the layout is its structure's for these trainable parameters
        # (a caller may differentiate fewer of them than the structure's tapes, as the JVP)
        memo, key = self.compilation.memo, (*_LAYOUT, tuple(tape.trainable_params))
        layout = memo.get(key) if memo is not None else None
        if layout is None:
            layout = _ColumnLayout.of(tape, self.steps, self.register)
            if memo is not None:
                memo[key] = layout
        self.n_params = layout.n_params
        self.shapes = layout.shapes
        self.n_columns = layout.n_columns
        self._starts = layout.starts
        self.observable_columns = layout.observable_columns
        self.columns = layout.columns
        self.entry_columns = layout.entry_columns
        self.state_columns = layout.state_columns

    def fold(self, values: Sequence) -> list:
        """Per trainable parameter, from one value per column: a scalar parameter's value,
        or an array parameter's values stacked on trailing axes of its shape."""
        folded = []
        for p, shape in enumerate(self.shapes):
            start = self._starts[p]
            if not shape:
                folded.append(values[start])
                continue
            stacked = np.stack(values[start : self._starts[p + 1]], axis=-1)
            folded.append(stacked.reshape(stacked.shape[:-1] + shape))
        return folded

    def final_state(self, backend: Backend) -> StateBatch:
        state, _ = simulate.final_state(backend, flatten(self.compilation))
        return state

    def observable_gradients(
        self, backend: Backend, psi: StateBatch, rows: Sequence[Sequence[tuple]]
    ) -> np.ndarray | None:
        """The observable columns' part of the gradients of ``rows`` (rows[b]: the R
        cotangent rows of vector b of the final states ``psi``, which stay unchanged), as
        (B, R, n_columns), zero in the gate columns; None without observable columns.
        Called before the sweep, which consumes ``psi``."""
        if not self.observable_columns:
            return None
        values = observable_values(
            backend, psi, self.register, self.tape.measurements, self.observable_columns
        )
        complex_gradient = any(c.complex_gradient for c in self.observable_columns)
        gradients = np.zeros(
            (len(rows), len(rows[0]), self.n_columns),
            dtype=np.complex128 if complex_gradient else np.float64,
        )
        for column, value in zip(self.observable_columns, values, strict=True):
            for b, vector_rows in enumerate(rows):
                for r, row in enumerate(vector_rows):
                    dy = row[column.measurement]
                    if not is_zero(dy):
                        gradients[b, r, column.start : column.stop] += float(dy) * value[b]
        return gradients
