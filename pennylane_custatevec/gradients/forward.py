"""Forward-mode derivatives of a state (``state_derivatives``): d psi/d theta_j for every
trainable column, carried through the circuit beside the state (through postselections
renormalised, from the entries of an ``EntrywiseUnitary`` by their matrix units); the
adjoint Jacobian of a ``state()`` measurement."""

from __future__ import annotations

import numpy as np

from .. import measure, simulate
from ..backends.base import Backend
from ..backends.primitives import StateBatch
from ..instructions import Kind, apply_instruction
from ..queuing import generator_of
from .differentiated import DifferentiatedTape
from .memory import eager_sweep_memory


def state_derivatives(backend: Backend, circuit: DifferentiatedTape) -> list[np.ndarray]:
    """Forward mode: d psi/d theta_j = U_N ... U_{j+1} (i G_j) phi_j for every trainable
    j, as host arrays (B, 2**n), one per column (the Jacobian of a state is that big)."""
    register = circuit.register
    n, batch = register.num_qubits, register.batch_size
    differentiated = len(circuit.columns) + sum(
        int(np.count_nonzero(columns >= 0)) - 1 for columns in circuit.entry_columns.values()
    )
    if circuit.state_columns is not None:
        differentiated += int(np.count_nonzero(circuit.state_columns[0] >= 0))
    vectors = (1 + differentiated) * batch
    vjp = eager_sweep_memory(backend, False, 1).bytes(backend, n) * batch
    simulate.require_total(
        backend,
        simulate.state_bytes(backend, n, vectors),
        f"the adjoint Jacobian of a state on {n} qubits ({vectors:,} state vectors: each "
        f"state and its derivative by each of {len(circuit.columns):,} trainable gates)",
        [
            simulate.Alternative(
                "device_vjp=True",
                "a VJP sweeps one bra per state instead of a derivative per gate",
                vjp,
            ),
            *simulate.single_precision(backend, simulate.state_bytes(backend, n, vectors) // 2),
        ],
    )
    state = simulate.initial_state(backend, register, batch)
    derivatives: list[StateBatch | None] = [None] * circuit.n_columns
    if circuit.state_columns is not None:  # d psi_0/d Re v_k = e_(i_k), d/d Im v_k = i e_(i_k)
        columns, indices = circuit.state_columns
        for part, column in enumerate(columns):
            if column >= 0:
                basis = np.zeros((batch, 2**n), dtype=np.complex128)
                basis[:, indices[part // 2]] = 1.0 if part % 2 == 0 else 1j
                derivatives[int(column)] = backend.from_host(basis)
    for index, step in enumerate(circuit.steps):
        entry_columns = circuit.entry_columns.get(index)
        fresh = {}  # derivatives that start after this step (from the state before it)
        if entry_columns is not None:
            fresh = _entry_derivatives(backend, state, step, entry_columns)
        for instruction in step.instructions:
            if instruction.kind is Kind.POSTSELECT:
                _renormalised_derivatives(backend, state, instruction, derivatives)
                continue
            apply_instruction(backend, state, instruction)
            for d in derivatives:
                if d is not None:
                    apply_instruction(backend, d, instruction)
        for column, derivative in fresh.items():
            derivatives[column] = derivative
        column = circuit.columns.get(index)
        if column is not None and entry_columns is None:
            generator = generator_of(step.operation)
            derivative = measure.applied_observable(backend, state, register, generator)
            backend.scale(derivative, np.full(1, 1j))
            derivatives[column] = derivative
    # the columns of observable data: the state does not depend on them
    zero = np.zeros((register.batch_size, 2**register.num_qubits), dtype=np.complex128)
    return [zero if d is None else backend.to_host(d) for d in derivatives]


def _renormalised_derivatives(
    backend: Backend, state: StateBatch, instruction, derivatives: list
) -> None:
    r"""A postselection in forward mode: ``state`` :math:`\chi` becomes
    :math:`\psi = \Pi\chi/\sqrt{p}` (``simulate.postselect``) and each derivative
    :math:`d\chi` becomes :math:`d\psi = (\Pi\,d\chi - \psi\,
    \mathrm{Re}\langle\psi|\Pi\,d\chi\rangle)/\sqrt{p}`, the derivative of the
    renormalised state (``eager._back_through_postselection`` is its transpose)."""
    scale = simulate.renormalising_factors(simulate.postselect(backend, state, instruction))
    for d in derivatives:
        if d is None:
            continue
        backend.apply_matrix(d, instruction.data, instruction.targets)
        backend.scale(d, scale)
        overlaps = np.real(backend.braket(state, backend.copy(d)))  # Re <psi_b|d_b>
        backend.add_scaled(d, state, -overlaps)


def _entry_derivatives(
    backend: Backend, phi: StateBatch, step, entry_columns: np.ndarray
) -> dict[int, StateBatch]:
    """{column: the derivative of the state after an ``EntrywiseUnitary`` U by that
    trainable real part}, from the state ``phi`` before it: d psi/d Re U_ac = E_ac phi and
    d psi/d Im U_ac = i E_ac phi (E_ac = |a><c| on U's bits); the later steps apply to
    them."""
    (instruction,) = step.instructions
    d = instruction.data.shape[-1]
    derivatives = {}
    for part, column in enumerate(entry_columns):
        if column < 0:
            continue
        entry = np.zeros((1, d, d), dtype=np.complex128)
        entry[0].flat[part // 2] = 1.0 if part % 2 == 0 else 1j
        derivative = backend.copy(phi)
        backend.apply_matrix(derivative, entry, instruction.targets)
        derivatives[int(column)] = derivative
    return derivatives
