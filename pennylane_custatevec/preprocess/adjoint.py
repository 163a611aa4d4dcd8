"""The adjoint method's own stages: trainable matrices and state preparations taken by
their entries, the refusal of shares under ``mpi_gather=False``, and the validation (after
measuring through the state) that refuses, by name, a circuit the sweep cannot
differentiate."""

from __future__ import annotations

import functools

import pennylane as qml
from pennylane import math
from pennylane.exceptions import DeviceError
from pennylane.measurements import ProbabilityMP, StateMP
from pennylane.operation import Operator, StatePrepBase
from pennylane.tape import QuantumScript
from pennylane.transforms.core import transform
from pennylane.wires import Wires

from ..entrywise import (
    ENTRYWISE_SOURCES,
    MAX_ENTRYWISE_STATE_QUBITS,
    EntrywiseState,
    entrywise_state,
    entrywise_unitary,
    jit_whole_matrix_reason,
    left_whole_under_jit,
    too_wide,
)
from ..gradients.validation import require_adjoint_serves
from ..program import tape_batch_size
from .common import first_result
from .through_state import measured_through_state


@transform
def entrywise_trainable_operators(tape: QuantumScript):
    """For the adjoint method: a trainable ``QubitUnitary``, ``ControlledQubitUnitary`` or
    ``BlockEncode`` on at most ``entrywise.MAX_ENTRYWISE_QUBITS`` wires becomes an
    ``EntrywiseUnitary``, and a trainable state preparation that opens the circuit on at
    most ``entrywise.MAX_ENTRYWISE_STATE_QUBITS`` wires an ``EntrywiseState``: their
    parameters, the real and imaginary parts of the matrix's entries or the state's
    amplitudes, the ML framework takes from the operator here (the preprocessing runs where
    it records), so that the derivative is exact everywhere (see ``entrywise``). A wider one
    stays and is refused by name. A pulse is taken so under ``jax.jit`` too: jax's ODE solver
    for its matrix is compiled into the jitted program, beside PennyLane's callback (which
    ``results_off_the_jit_root`` keeps from aborting jaxlib 0.7.1)."""
    operations = tape.operations
    leading = bool(operations) and _entrywise_state(operations[0])
    converted = [_taken_for_adjoint(op) for op in operations]
    if not leading and all(new is op for new, op in zip(converted, operations, strict=True)):
        return (tape,), first_result
    if leading:
        converted[0] = entrywise_state(operations[0])
    return (tape.copy(operations=converted),), first_result


def _taken_for_adjoint(op: Operator) -> Operator:
    """``op`` as ``entrywise_trainable_operators`` leaves it: taken by its entries, passed
    through the refusing identity (``left_whole_under_jit``), or itself (one ``isinstance``
    for an operator that is none of ``ENTRYWISE_SOURCES``)."""
    if not isinstance(op, ENTRYWISE_SOURCES):
        return op
    if left_whole_under_jit(op):
        return _refusing_derivatives(op)
    return entrywise_unitary(op) if taken_by_entries(op) else op


def _refusing_derivatives(op: Operator) -> Operator:
    """A matrix that ``left_whole_under_jit`` leaves whole, passed through an identity
    whose derivative rule raises (``jit_whole_matrix_reason``): under
    ``jax.grad(jax.jit(f))`` jax asks for that rule only where the matrix depends on what
    is differentiated, so a matrix that jax merely computes inside the jitted function
    (PennyLane's QuantumMonteCarlo) is no obstacle, and one that is differentiated is
    refused by name before PennyLane's JVP rule fails on its shape."""
    refused = _derivative_refusing_identity()(op.data[0], jit_whole_matrix_reason(op))
    return qml.ops.functions.bind_new_parameters(op, [refused, *op.data[1:]])


@functools.cache
def _derivative_refusing_identity():
    import jax  # only reached with a jax.jit-traced value

    @functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
    def identity(value, reason: str):  # noqa: ARG001
        return value

    @identity.defjvp
    def _refuse(reason: str, primals, tangents):  # noqa: ARG001
        raise DeviceError(
            f"custatevec.qubit cannot differentiate this circuit by adjoint: {reason}."
        )

    return identity


def taken_by_entries(op: Operator) -> bool:
    """Whether ``entrywise_trainable_operators`` takes ``op`` by its matrix's entries: a
    trainable matrix of ``ENTRYWISE_SOURCES`` narrow enough and not left whole under
    ``jax.jit``; a pulse whose parameters or times are trainable or traced (its matrix is
    then computed where jax traces, see ``interfaces.refuse_traced_pulse_times``)."""
    if not isinstance(op, ENTRYWISE_SOURCES) or too_wide(op) or left_whole_under_jit(op):
        return False
    if isinstance(op, qml.pulse.ParametrizedEvolution):
        # its parameters or its times traced or trainable: its matrix is computed here, where
        # jax traces and differentiates (a pulse without parameters has a trainable time)
        values = op.data if op.t is None else (*op.data, op.t)
        return any(math.requires_grad(v) or math.is_abstract(v) for v in values)
    return math.requires_grad(op.data[0])


def _entrywise_state(op: Operator) -> bool:
    return (
        isinstance(op, StatePrepBase)
        and not isinstance(op, EntrywiseState)
        and len(op.wires) <= MAX_ENTRYWISE_STATE_QUBITS
        and any(math.requires_grad(d) for d in op.data)
    )


@transform
def validate_adjoint_differentiation(
    tape: QuantumScript,
    batched: bool = False,
    through_state: bool = False,
    device_wires: Wires | None = None,
    array_gradients: bool = False,
):
    """Refuse, naming the reason, a circuit the adjoint method cannot differentiate.
    Trainable parameters are those that require a gradient in the ML framework. Runs after
    ``broadcast_expand`` (the tape is not broadcast) or, with ``batched`` (the deferred
    mode), after ``expand_broadcasts(trainable_only=True)``.

    With ``through_state`` it first rewrites the tape as ``measure_through_state`` (with
    ``device_wires`` and ``array_gradients``) and validates what will run: the device's
    preprocessing does both in one transform, so that a tape which passes unchanged (the
    common one) pays no second transform call."""
    if through_state:
        converted = measured_through_state(tape, device_wires, array_gradients)
        if converted is not None:
            new_tape, postprocess = converted
            _require_served(new_tape, batched)
            return (new_tape,), postprocess
    _require_served(tape, batched)
    return (tape,), first_result


def _require_served(tape: QuantumScript, batched: bool) -> None:
    """As ``require_adjoint_serves``, with the parameters that require a gradient as the
    trainable ones, except a matrix that ``left_whole_under_jit`` left whole: the forward
    pass runs, and its derivative is refused where it is asked for (device.py)."""
    trainable = {
        index
        for index, value in enumerate(tape.get_parameters(trainable_only=False))
        if math.requires_grad(value) and not left_whole_under_jit(tape.par_info[index]["op"])
    }
    broadcast = tape_batch_size(tape) is not None if batched else False
    require_adjoint_serves(tape, trainable, broadcast=broadcast, batched=batched)


@transform
def refuse_differentiated_shares(tape: QuantumScript, device_wires: Wires | None = None):
    """Refuse the adjoint method on a tape with trainable parameters that returns
    ``qml.state()`` or ``qml.probs()`` of every wire on a device with ``mpi_gather=False``:
    those results are each rank's share, and the cotangents of a share do not make a
    vector-Jacobian product of the whole."""
    every_wire = (0, len(device_wires or tape.wires))  # no wires: every wire
    shares = [
        mp
        for mp in tape.measurements
        if len(mp.wires) in every_wire
        and (
            isinstance(mp, StateMP)
            or (isinstance(mp, ProbabilityMP) and mp.obs is None and mp.mv is None)
        )
    ]
    if shares and tape.trainable_params:
        raise DeviceError(
            f"{shares[0]} returns each rank's share under mpi_gather=False, which the adjoint "
            "method cannot differentiate; use mpi_gather=True (whole results on every rank) "
            "to differentiate it, or measure expectation values."
        )
    return (tape,), first_result
