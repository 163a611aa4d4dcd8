"""Adjoint differentiation, eager mode (Jones and Gacon, arXiv:2009.02823).

A trainable gate is U_j = exp(i theta_j G_j) (PennyLane's generator convention), so
dU_j/dtheta_j = i G_j U_j. For |psi> = U_N ... U_1 |psi_0> and a bra |lambda>:

    phi_j    = U_j ... U_1 |psi_0>                          (the state after gate j)
    lambda_j = U_{j+1}^dagger ... U_N^dagger |lambda>       (the bra carried back to gate j)
    d/dtheta_j Re <lambda|psi> = Re( i <lambda_j| G_j |phi_j> )

The sweep starts from phi_N = psi and lambda_N = lambda and walks the gates backwards: at
a trainable gate, one inner product with its generator applied (no temporary vector);
then U_j^dagger on both vectors. For a Pauli rotation (G = -P/2) the backend does the
three in one step. The sweep stops at the first trainable gate. Beyond the final state,
which becomes phi, it holds the bras and at most one temporary vector; all of it is
checked against free memory before anything is allocated (``SweepMemory``).

A VJP is one bra. A Jacobian is one bra per output (one-hot cotangents) in one batch, so
one sweep serves every output. The Jacobian of a state output is computed forward
instead: d psi/d theta_j = U_N ... U_{j+1} i G_j phi_j, one vector per parameter.

The bras that encode what is differentiated, and the derivatives of trainable observable
data, are shared with the deferred sweep: see ``bras`` and ``observables``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pennylane.measurements import (
    StateMP,
)
from pennylane.tape import QuantumScript
from pennylane.wires import Wires

from .. import measure, simulate
from ..backends.base import Backend
from ..backends.primitives import StateBatch
from ..instructions import Instruction, Kind, apply_instruction, inverse
from ..kept import KeptState
from ..program import Program, plain_rotation
from ..queuing import generator_of
from .bras import add_cotangent_terms
from .cotangents import (
    checked_cotangents,
    cotangent_batch,
    format_jacobian,
    one_hot_rows,
    stacked_gradients,
)
from .differentiated import DifferentiatedTape
from .forward import state_derivatives
from .memory import eager_sweep_memory, require_sweep_memory
from .results import is_zero, output_shape, output_size


def _require_eager_memory(
    backend: Backend, circuit: DifferentiatedTape, held: bool, rows: int, kind: str
) -> None:
    """Refuse, before allocating, an eager sweep with ``rows`` bras that does not fit,
    naming device_vjp=True (one bra) for a Jacobian of several outputs. (The deferred
    mode needs as many bras for one tape: it is no alternative here.)"""
    if not circuit.columns and circuit.state_columns is None:
        return  # no sweep
    n = circuit.register.num_qubits
    alternatives = []
    if rows > 1:
        alternatives.append(
            simulate.Alternative(
                "device_vjp=True",
                "a VJP sweeps one bra instead of one per output",
                eager_sweep_memory(backend, held, 1).bytes(backend, n),
            )
        )
    memory = eager_sweep_memory(backend, held, rows)
    require_sweep_memory(backend, n, memory, f"the eager adjoint {kind} of a circuit", alternatives)


def jacobian(
    backend: Backend,
    tape: QuantumScript,
    device_wires: Wires | None,
    kept: KeptState | None = None,
):
    """The Jacobian of ``tape``'s results with respect to its trainable parameters, shaped as
    PennyLane expects. ``kept``, what the forward pass kept of the tape if anything: its
    final state is consumed, its compilation reused (the eager sweep runs gate by gate, so
    its fused plan is not read)."""
    circuit = DifferentiatedTape(tape, device_wires, kept.compilation if kept else None)
    state = kept.state if kept else None
    measurements = tape.measurements
    per_measurement: list = [None] * len(measurements)
    swept = [i for i, mp in enumerate(measurements) if not isinstance(mp, StateMP)]
    if swept:
        rows = one_hot_rows(circuit, swept)
        gradients = _row_gradients(backend, circuit, rows, state, "Jacobian")
        start = 0
        for i in swept:
            mp = measurements[i]
            size = output_size(mp, circuit.register)
            block = gradients[start : start + size]
            start += size
            shape = output_shape(mp, circuit.register)
            per_measurement[i] = circuit.fold(
                [block[:, c].reshape(shape) for c in range(circuit.n_columns)]
            )
    if len(swept) < len(measurements):
        derivatives = state_derivatives(backend, circuit)
        for i, mp in enumerate(measurements):
            if isinstance(mp, StateMP):
                wires = circuit.register.wires
                per_measurement[i] = circuit.fold(
                    [mp.process_state(d[0], wire_order=wires) for d in derivatives]
                )
    return format_jacobian(per_measurement, circuit.n_params)


def vjp(
    backend: Backend,
    tape: QuantumScript,
    cotangents,
    device_wires: Wires | None,
    kept: KeptState | None = None,
):
    """The vector-Jacobian product of ``tape`` with ``cotangents`` (PennyLane's per-tape
    cotangent: one value per measurement, not wrapped for a single measurement), a tuple
    with one entry per trainable parameter. ``kept`` as in ``jacobian``.
    A batch of cotangents (``cotangent_batch``) gives a batch of VJPs."""
    circuit = DifferentiatedTape(tape, device_wires, kept.compilation if kept else None)
    state = kept.state if kept else None
    rows = cotangent_batch(circuit, cotangents)
    if rows is not None:
        return batched_vjp(backend, circuit, rows, state)
    per_measurement = checked_cotangents(circuit, cotangents)
    if circuit.n_params == 0:
        return ()
    if all(is_zero(dy) for dy in per_measurement):
        return tuple(circuit.fold(np.zeros(circuit.n_columns)))
    gradients = _row_gradients(backend, circuit, [per_measurement], state, "VJP")
    return tuple(circuit.fold(gradients[0]))


def _row_gradients(
    backend: Backend, circuit: DifferentiatedTape, rows: Sequence[tuple], state, kind: str
) -> np.ndarray:
    """The eager gradients of the cotangent ``rows`` (each one value per measurement),
    shaped ``(len(rows), columns)``: one adjoint sweep of that many bras from the final
    state, plus the part of the observables' trainable data, which reads the final state
    before the sweep consumes it. ``state``, the final state if already known, is
    consumed; ``kind`` names the product in a memory refusal."""
    _require_eager_memory(backend, circuit, state is not None, len(rows), kind)
    if state is None:
        state = circuit.final_state(backend)
    observable = circuit.observable_gradients(backend, state, [rows])
    gradients = _sweep(backend, circuit, state, rows)
    return gradients if observable is None else gradients + observable[0]


def batched_vjp(
    backend: Backend, circuit: DifferentiatedTape, rows: Sequence[tuple], state=None
) -> tuple:
    """The VJPs of the cotangent ``rows`` (each one value per measurement) in one sweep,
    stacked on a leading axis: per trainable parameter, an array of shape
    ``(K, *parameter_shape)``. Rows that are all zero are not swept."""
    if circuit.n_params == 0:
        return ()
    live = [k for k, row in enumerate(rows) if not all(is_zero(dy) for dy in row)]
    if not live:
        return stacked_gradients(circuit, np.zeros((len(rows), circuit.n_columns)))
    swept = _row_gradients(backend, circuit, [rows[k] for k in live], state, "VJP")
    gradients = np.zeros((len(rows), circuit.n_columns), dtype=swept.dtype)
    gradients[live] = swept
    return stacked_gradients(circuit, gradients)


def _sweep(backend: Backend, circuit: DifferentiatedTape, state: StateBatch, rows: Sequence[tuple]):
    """d/dtheta of the real cotangent products of every row, float64 (rows, columns)."""
    gradients = np.zeros((len(rows), circuit.n_columns))
    if not circuit.columns and circuit.state_columns is None:
        return gradients
    bras = _bras(backend, circuit, state, rows)
    phi = state
    # a trainable initial state: every step is undone, the bras then read at the start
    first = -1 if circuit.state_columns is not None else min(circuit.columns)
    for index in range(len(circuit.steps) - 1, max(first, 0) - 1, -1):
        op, instructions = circuit.steps[index].operation, circuit.steps[index].instructions
        column = circuit.columns.get(index)
        rotation = plain_rotation(op, instructions)
        entry_columns = circuit.entry_columns.get(index)
        if entry_columns is not None:
            _entrywise_step(backend, phi, bras, instructions, entry_columns, gradients)
            if index == first:
                break
            continue
        if instructions and instructions[0].kind is Kind.POSTSELECT:
            phi = _back_through_postselection(backend, circuit, index, phi, bras)
            continue
        if column is not None and rotation is not None:
            # G = -P/2: the inner product and both undos in one backend step
            products = -0.5 * backend.adjoint_pauli_rotation_step(
                phi, bras, rotation.data, rotation.paulis, rotation.targets
            )
            gradients[:, column] = np.real(1j * products)
            continue
        if column is not None:
            products = measure.transition(backend, bras, phi, circuit.register, generator_of(op))
            gradients[:, column] = np.real(1j * products)
        if index == first:
            break
        for instruction in reversed(instructions):
            undo = inverse(instruction)
            apply_instruction(backend, phi, undo)
            apply_instruction(backend, bras, undo)
    if circuit.state_columns is not None:
        _add_state_gradients(backend.to_host(bras), circuit.state_columns, gradients)
    return gradients


def _back_through_postselection(
    backend: Backend, circuit: DifferentiatedTape, index: int, phi: StateBatch, bras: StateBatch
) -> StateBatch:
    r"""The step back through the postselection at step ``index`` (a Projector: deferred
    measurements' postselection), which the simulation renormalises after: it cannot be
    undone, so the state before it, :math:`\chi`, is simulated again from the start, and
    returned. ``phi`` is the state after it, :math:`\psi = \Pi\chi / \sqrt{p}` with
    :math:`p = \|\Pi\chi\|^2`.

    A result g of :math:`\psi` has :math:`dg = \mathrm{Re}\langle b|d\psi\rangle` for
    its bra b (each row's), and :math:`d\psi = (\Pi d\chi - \psi\,
    \mathrm{Re}\langle\psi|\Pi d\chi\rangle) / \sqrt{p}`, so the bra of :math:`\chi`
    is :math:`\Pi (b - c\,\psi) / \sqrt{p}` with :math:`c = \mathrm{Re}\langle\psi|b
    \rangle`: the part of b along the state, which renormalisation takes away, is removed
    (it is what makes :math:`d(N/D) = (dN - f\,dD)/D` for a ratio of postselected
    expectations), then projected and scaled. Parameter-shift's rule does not hold for
    that ratio (PennyLane issue #5943); this is exact."""
    (instruction,) = circuit.steps[index].instructions
    overlaps = np.real(backend.braket(bras, backend.copy(phi)))  # <b_r|psi>, real part
    backend.add_scaled(bras, phi, -overlaps)
    backend.apply_matrix(bras, instruction.data, instruction.targets)
    del phi  # its memory, before the state before the projector is simulated again
    prefix = tuple(ins for step in circuit.steps[:index] for ins in step.instructions)
    chi, _ = simulate.final_state(backend, Program(circuit.register, prefix))
    projected = backend.copy(chi)
    backend.apply_matrix(projected, instruction.data, instruction.targets)
    probability = backend.probabilities(projected, ())[:, 0]
    del projected
    backend.scale(bras, simulate.renormalising_factors(probability))
    return chi


def _add_state_gradients(bras: np.ndarray, state_columns: tuple, gradients: np.ndarray) -> None:
    """The gradients by a trainable initial state's parts, from the bras carried back to
    the start (R, 2**n): psi_0[i_k] = v_k, so d/d Re v_k = Re lambda_0[i_k] and
    d/d Im v_k = Re(i conj(lambda_0[i_k])) = Im lambda_0[i_k]."""
    columns, indices = state_columns
    amplitudes = bras[:, indices]  # (R, 2**k)
    parts = np.empty((bras.shape[0], 2 * len(indices)))
    parts[:, 0::2] = amplitudes.real
    parts[:, 1::2] = amplitudes.imag
    live = columns >= 0
    np.add.at(gradients.T, columns[live], parts[:, live].T)


def _entrywise_step(
    backend: Backend,
    phi: StateBatch,
    bras: StateBatch,
    instructions: Sequence[Instruction],
    entry_columns: np.ndarray,
    gradients: np.ndarray,
) -> None:
    """The step back through an ``EntrywiseUnitary`` U (its one dense instruction): U^dagger
    on phi and on the bras in the pass that takes T[r, a, c] = sum_rest conj(bra_r[a, rest])
    phi_before[c, rest] (``Backend.adjoint_block_step``), then for its entry (a, c)

        d/d Re U_ac = Re T[r, a, c],    d/d Im U_ac = Re(i T[r, a, c])

    in the columns of its trainable real parts (``entry_columns``, row by row, real part
    first; -1 for a constant)."""
    (instruction,) = instructions
    reduction = backend.adjoint_block_step(phi, bras, instruction.data, instruction.targets)
    (t,) = backend.gather([reduction])
    t = t[0].reshape(t.shape[1], -1)  # (R, d * d), one vector
    parts = np.empty((t.shape[0], 2 * t.shape[1]))
    parts[:, 0::2] = t.real
    parts[:, 1::2] = -t.imag
    live = entry_columns >= 0
    np.add.at(gradients.T, entry_columns[live], parts[:, live].T)


def _bras(backend: Backend, circuit: DifferentiatedTape, psi: StateBatch, rows: Sequence[tuple]):
    """One bra per row (module docstring), in a new batch."""
    bras = backend.zero_state(circuit.register.num_qubits, len(rows))
    backend.scale(bras, np.zeros(1))
    add_cotangent_terms(
        backend,
        bras,
        psi,
        circuit.register,
        circuit.tape.measurements,
        rows,
        circuit.compilation.memo,
    )
    return bras
