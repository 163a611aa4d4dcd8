"""Forward simulation: run a Program's instructions on a backend's batch of states.

Each instruction runs through its kind's operations (instructions.py: apply, matrix for
the product-state preparation, masked for conditional operations); mid-circuit
measurements and postselection, which sample or renormalise, are steps of the runs here.

A batch holds one state vector per broadcast entry, or, for circuits with native
mid-circuit measurements (the "one-shot" method), one per shot: each vector follows
its own measurement outcomes and conditional operations act only where their
condition holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
from pennylane.exceptions import DeviceError

from . import advice
from .backends.base import Backend
from .backends.primitives import StateBatch
from .instructions import (
    Instruction,
    Kind,
    apply_instruction,
    has_matrix,
    instruction_matrix,
    masked,
)
from .pauli import pauli_word_matrix
from .program import Program, Register


class StateTooLargeError(DeviceError, MemoryError):
    """The state vectors a run needs do not fit in the backend's free memory."""


class UnnormalisedStateError(DeviceError, ValueError):
    """A state to sample from has a norm other than 1 (NaN, zero, or off by more than
    round-off): its samples would mean nothing."""


NORM_TOLERANCE = {np.dtype(np.complex128): 1e-6, np.dtype(np.complex64): 1e-3}
"""How far the squared norm of a state to sample may be from 1: default.qubit's cutoff at
complex128; at complex64 the round-off of float32 amplitudes grows with the circuit's depth
(about 6e-8 per gate), and an unnormalised input is off by far more."""


def require_normalised(backend: Backend, norms: np.ndarray, register: Register) -> None:
    """Refuse to sample from states whose squared norms (one per vector of the batch, the
    sum of all probabilities) are not 1 within ``NORM_TOLERANCE``: default.qubit refuses
    them too, and each backend would draw different samples from them. The tolerance is
    single precision's where the register's operations have single-precision data
    (``Register.single_precision_data``: their round-off, not an unnormalised input;
    default.qubit samples a jax state without a check)."""
    norms = np.asarray(norms, dtype=np.float64).reshape(-1)
    dtype = np.dtype(np.complex64) if register.single_precision_data else backend.dtype
    tolerance = max(NORM_TOLERANCE[backend.dtype], NORM_TOLERANCE[dtype])
    bad = ~(np.abs(norms - 1.0) <= tolerance)  # NaN is bad
    if not bad.any():
        return
    vector = int(np.argmax(bad))
    where = f" (vector {vector} of a batch of {norms.size})" if norms.size > 1 else ""
    raise UnnormalisedStateError(
        f"Cannot sample from a state whose squared norm is {norms[vector]:.10g}{where}, not 1 "
        f"within {tolerance:g}. "
        "Such states come from a postselected mid-circuit measurement outcome of probability "
        "0, a non-unitary matrix with its check turned off (QubitUnitary with "
        "unitary_check=False), or an unnormalised qml.StatePrep(..., normalize=False, "
        "validate_norm=False): make the circuit's operations unitary and its prepared state "
        "normalised (or use normalize=True)."
    )


class RunTooLargeError(StateTooLargeError):
    """What a run needs in total (the bras of an adjoint sweep beside its final states, the
    samples of a sampled circuit) does not fit in free memory; the message says what was
    needed, what is available, and which option would fit."""


def state_bytes(backend: Backend, num_qubits: int, batch_size: int) -> int:
    """Bytes of ``batch_size`` state vectors of ``num_qubits`` qubits (in this process:
    a backend split over processes holds a share)."""
    return batch_size * backend.amplitudes_held(num_qubits) * backend.dtype.itemsize


UNCHECKED_BYTES = 1 << 24
"""Requests up to this size (16 MiB, 20 qubits at complex128) skip the free-memory query,
which costs more than simulating a small circuit."""


@dataclasses.dataclass(frozen=True)
class Alternative:
    """An option the user could take instead, and the bytes the run would need with it."""

    option: str
    """What to change, as the user writes it (``device_vjp=True``, ``shots=1000``)."""
    reason: str
    """Why it needs less, in a few words."""
    needed: int


def free_bytes(backend: Backend, host: bool = False) -> int:
    """The backend's free memory, or with ``host`` the host's (where samples live)."""
    return backend.available_host_bytes() if host else backend.available_bytes()


def fits(backend: Backend, needed: int, host: bool = False) -> bool:
    """Whether ``needed`` bytes fit in free memory; requests up to ``UNCHECKED_BYTES``
    fit without asking."""
    return needed <= UNCHECKED_BYTES or needed <= free_bytes(backend, host)


def require_total(
    backend: Backend,
    needed: int,
    what: str,
    alternatives: Sequence[Alternative] | Callable[[int], Sequence[Alternative]] = (),
    host: bool = False,
) -> None:
    """Refuse, before allocating, a run that needs ``needed`` bytes in total for ``what``
    (a phrase: "the adjoint Jacobian of ..."), naming the ``alternatives`` that fit (or a
    function of the available bytes that finds them)."""
    if needed <= UNCHECKED_BYTES:
        return
    available = free_bytes(backend, host)
    if needed <= available:
        return
    where = "host" if host else backend.name
    if callable(alternatives):
        alternatives = alternatives(available)
    fitting = [a for a in alternatives if a.needed <= available]
    if fitting:
        advice = "These would fit: " + "; ".join(_described(a) for a in fitting) + "."
    elif alternatives:
        advice = (
            "None of the alternatives fits either ("
            + "; ".join(_described(a) for a in alternatives)
            + "): use fewer wires."
        )
    else:
        advice = "Use fewer wires."
    raise RunTooLargeError(
        f"{what[0].upper()}{what[1:]} needs {needed:,} bytes of {where} memory; "
        f"{available:,} bytes are available. {advice}"
    )


def _described(alternative: Alternative) -> str:
    if not alternative.needed:
        return f"{alternative.option} ({alternative.reason})"
    return f"{alternative.option} ({alternative.reason}: {alternative.needed:,} bytes)"


def single_precision(backend: Backend, needed: int) -> list[Alternative]:
    """``c_dtype=numpy.complex64`` as an alternative that would need ``needed`` bytes (none
    where the backend runs complex64 already)."""
    if backend.dtype != np.complex128:
        return []
    return [Alternative("c_dtype=numpy.complex64", "half the bytes per amplitude", needed)]


def require_memory(backend: Backend, num_qubits: int, batch_size: int, copies: int = 1) -> None:
    """Refuse, before allocating, a run whose states would not fit in free memory."""
    needed = copies * state_bytes(backend, num_qubits, batch_size)
    if needed <= UNCHECKED_BYTES:
        return
    available = backend.available_bytes()
    if needed > available:
        raise StateTooLargeError(
            advice.state_too_large(
                num_qubits, batch_size, backend.dtype.name, backend.name, needed, available
            )
        )


def initial_state(backend: Backend, register: Register, batch_size: int) -> StateBatch:
    """|0...0> or the register's prepared state, one copy per vector of the batch."""
    require_memory(backend, register.num_qubits, batch_size)
    if register.initial_state is None:
        return backend.zero_state(register.num_qubits, batch_size)
    vectors = register.initial_state
    if vectors.shape[0] != batch_size:
        vectors = np.broadcast_to(vectors, (batch_size, vectors.shape[1]))
    return backend.from_host(vectors)


def final_state(backend: Backend, program: Program) -> tuple[StateBatch, np.ndarray | None]:
    """The batch of states after every instruction (no mid-circuit measurements).

    Also returns, when the program postselects, the probability of the kept outcomes per
    vector (the states are renormalised; a zero probability leaves NaN amplitudes, so
    that every result of an impossible postselection is NaN, as in default.qubit).
    """
    state, prepared = _prepared_state(backend, program)
    kept = None
    for instruction in program.instructions[prepared:]:
        if instruction.kind is Kind.POSTSELECT:
            probability = postselect(backend, state, instruction)
            kept = probability if kept is None else kept * probability
        else:
            apply_instruction(backend, state, instruction)
    return state, kept


def _prepared_state(backend: Backend, program: Program) -> tuple[StateBatch, int]:
    """The state after the program's leading one-qubit gates, and how many they are: from
    |0...0> they prepare a product state, which the backend builds in one pass instead of
    one pass per gate. Batches under the backend's ``min_product_state_amplitudes`` start
    from |0...0>."""
    register = program.register
    amplitudes = register.batch_size << register.num_qubits
    if register.initial_state is not None or amplitudes < backend.min_product_state_amplitudes:
        return initial_state(backend, register, register.batch_size), 0
    factors: dict[int, np.ndarray] = {}
    count = 0
    for instruction in program.instructions:
        if not _is_one_qubit_gate(instruction):
            break
        for gate in _one_qubit_gates(instruction):
            (bit,) = gate.targets
            matrix, _ = instruction_matrix(gate)
            ket = factors.get(bit, _ZERO_KET)
            factors[bit] = np.matmul(matrix, ket[..., None])[..., 0]
        count += 1
    if count == 0:
        return initial_state(backend, register, register.batch_size), 0
    require_memory(backend, register.num_qubits, register.batch_size)
    bits = sorted(factors)
    batch = register.batch_size
    stacked = np.stack([np.broadcast_to(factors[bit], (batch, 2)) for bit in bits], axis=1)
    return backend.product_state(register.num_qubits, stacked, bits), count


_ZERO_KET = np.array([[1.0, 0.0]], dtype=np.complex128)


def _is_one_qubit_gate(instruction: Instruction) -> bool:
    """Whether the instruction is made of one-qubit gates: a gate with a matrix on one
    target, ONE_QUBIT_ROTATIONS (one-qubit rotations on distinct bits) or TILED_MATRICES
    (one-bit gates in order)."""
    return (
        (
            instruction.kind in (Kind.ONE_QUBIT_ROTATIONS, Kind.TILED_MATRICES)
            or (has_matrix(instruction.kind) and len(instruction.targets) == 1)
        )
        and not instruction.controls
        and instruction.condition is None
    )


def _one_qubit_gates(instruction: Instruction) -> list[Instruction]:
    """The one-qubit gates of a ``_is_one_qubit_gate`` instruction, in order."""
    if instruction.kind is Kind.TILED_MATRICES:
        return [
            Instruction(Kind.MATRIX, targets=(bit,), data=instruction.data[:, j])
            for j, bit in enumerate(instruction.targets)
        ]
    if instruction.kind is not Kind.ONE_QUBIT_ROTATIONS:
        return [instruction]
    return [
        Instruction(Kind.PAULI_ROTATION, targets=(bit,), paulis=letter, data=instruction.data[:, j])
        for j, (letter, bit) in enumerate(zip(instruction.paulis, instruction.targets, strict=True))
    ]


def postselect(backend: Backend, state: StateBatch, instruction: Instruction) -> np.ndarray:
    """A POSTSELECT instruction on ``state``: its projector, then renormalisation (NaN
    amplitudes where nothing is kept); returns the kept probability per vector."""
    backend.apply_matrix(state, instruction.data, instruction.targets)
    probability = backend.probabilities(state, ())[:, 0]
    backend.scale(state, renormalising_factors(probability))
    return probability


def renormalising_factors(probability: np.ndarray) -> np.ndarray:
    """1 / sqrt(p) per vector, NaN where p is 0 (to ``np.isclose``): an impossible
    postselection gives NaN results (as default.qubit), and NaN derivatives, which the
    adjoint method scales by the same factors (``gradients``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.isclose(probability, 0.0), np.nan, 1.0 / np.sqrt(probability))


def final_state_per_shot(
    backend: Backend, program: Program, shots: int, rng: np.random.Generator
) -> tuple[StateBatch, dict]:
    """One state per shot, with mid-circuit measurements sampled shot by shot.

    Returns the batch and ``{MidMeasure: outcomes}``, outcomes an int array of shape (shots,).
    """
    state = initial_state(backend, program.register, shots)
    outcomes: dict = {}
    for instruction in program.instructions:
        if instruction.kind is Kind.MID_MEASURE:
            outcomes[instruction.source] = _measure_mid_circuit(
                backend, state, instruction, rng, program.register
            )
            continue
        if instruction.condition is not None:
            selected = np.asarray(instruction.condition.concretize(outcomes), dtype=bool)
            instruction = masked(instruction, selected.reshape(-1))
        apply_instruction(backend, state, instruction)
    return state, outcomes


def _measure_mid_circuit(
    backend: Backend,
    state: StateBatch,
    instruction: Instruction,
    rng: np.random.Generator,
    register: Register,
) -> np.ndarray:
    """Sample each vector's outcome, project onto it, renormalise, and reset if asked."""
    probabilities = backend.probabilities(state, instruction.targets)
    require_normalised(backend, probabilities.sum(axis=1), register)
    p_one = probabilities[:, 1] / probabilities.sum(axis=1)
    outcome = (rng.random(p_one.shape[0]) < p_one).astype(np.int64)
    kept = np.where(outcome == 1, p_one, 1.0 - p_one)
    project_onto_outcomes(backend, state, instruction, outcome, kept)
    return outcome


def project_onto_outcomes(
    backend: Backend,
    state: StateBatch,
    instruction: Instruction,
    outcome: np.ndarray,
    probability: np.ndarray,
) -> None:
    """Project each vector of ``state`` onto its ``outcome`` (int, one per vector) of the
    mid-circuit measurement ``instruction``, renormalised by the outcome's ``probability``,
    and flip the outcome-1 vectors back to 0 where the measurement resets."""
    projector = np.zeros((outcome.shape[0], 2))
    projector[np.arange(outcome.shape[0]), outcome] = 1.0 / np.sqrt(probability)
    backend.apply_diagonal(state, projector, instruction.targets)
    if instruction.source.reset:
        flip = np.where(outcome[:, None, None] == 1, pauli_word_matrix("X"), np.eye(2))
        backend.apply_matrix(state, flip, instruction.targets)
