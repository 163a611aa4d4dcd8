"""Whether the adjoint method differentiates a tape: which measurements the sweeps
differentiate (``is_swept``), why a tape is refused (``unsupported_reason``; its trainable
observable data by ``observables.observable_data_derivatives``), the DeviceError that
refuses it (``require_adjoint_serves``), and ``has_a_generator`` without asking ``bool``
of a traced angle."""

from __future__ import annotations

import pennylane as qml
from pennylane.exceptions import DeviceError
from pennylane.measurements import (
    ExpectationMP,
    MeasurementProcess,
    ProbabilityMP,
    StateMP,
    VarianceMP,
)
from pennylane.operation import Operator, StatePrepBase
from pennylane.ops import Conditional, MidMeasure, Projector
from pennylane.tape import QuantumScript

from .. import measure
from ..entrywise import (
    ENTRYWISE_SOURCES,
    MAX_ENTRYWISE_CONTROLLED_QUBITS,
    MAX_ENTRYWISE_QUBITS,
    MAX_ENTRYWISE_STATE_QUBITS,
    EntrywiseState,
    EntrywiseUnitary,
    too_wide,
)
from ..program import compiles_by_gate, is_broadcast, tape_batch_size
from .observables import observable_data_derivatives


def is_swept(mp: MeasurementProcess) -> bool:
    """Whether the sweep differentiates ``mp``'s kind: expval, var, probs, or the state
    itself (a ``DensityMatrixMP`` is a ``StateMP`` but not the state: the device's
    preprocessing measures the state for it, see preprocess/through_state.py)."""
    return isinstance(mp, (ExpectationMP, VarianceMP, ProbabilityMP)) or type(mp) is StateMP


def unsupported_reason(
    tape: QuantumScript,
    trainable: set[int] | None = None,
    broadcast: bool | None = None,
    batched: bool = False,
) -> str | None:
    """Why the adjoint method cannot differentiate ``tape``, or None if it can.

    ``trainable`` holds the indices (into ``tape.get_parameters(trainable_only=False)``) of
    the trainable parameters; by default ``tape.trainable_params``. ``broadcast`` says
    whether the tape is broadcast where that is already known.
    ``batched``: the sweep runs a broadcast tape as one batch (the deferred mode), which
    it can when no trainable parameter is broadcast.
    """
    trainable = set(tape.trainable_params) if trainable is None else trainable
    for mp in tape.measurements:
        reason = _measurement_reason(mp)
        if reason:
            return reason
        if trainable and _not_hermitian(mp):
            return (
                f"the observable {mp.obs} of {type(mp).__name__} is not Hermitian (a non-real "
                "coefficient), so its expectation value is complex and its derivative is not "
                "the adjoint method's real one; use diff_method='parameter-shift' or "
                "'finite-diff', or a real coefficient"
            )
    if tape.shots:
        return (
            f"it needs analytic execution and the circuit has shots={tape.shots.total_shots}; "
            "use diff_method='parameter-shift' with shots"
        )
    if tape_batch_size(tape) is not None if broadcast is None else broadcast:
        if not batched:
            return "broadcast circuits are expanded by the device's preprocessing first"
        if any(is_broadcast(tape.par_info[index]["op"]) for index in trainable):
            return (
                "a trainable parameter is broadcast; such circuits are expanded by the "
                "device's preprocessing first"
            )
    n_ops = len(tape.operations)
    trainable_ops = set()
    observed = False
    for index in trainable:
        op_index = tape.par_info[index]["op_idx"]
        if op_index < n_ops:
            trainable_ops.add(op_index)
        else:
            observed = True
    if observed:
        for derivatives in observable_data_derivatives(tape, trainable).values():
            for derivative in derivatives.values():
                if isinstance(derivative, str):
                    return (
                        f"{derivative}; it differentiates gate parameters, scalar "
                        "coefficients of observables and Hermitian matrices (QNodes get "
                        "other trainable observables from the state through the device's "
                        "preprocessing; or make the observable's data non-trainable)"
                    )
    for position, op in enumerate(tape.operations):
        reason = _operation_reason(op, position in trainable_ops)
        if reason:
            return reason
    return None


def require_adjoint_serves(
    tape: QuantumScript,
    trainable: set[int] | None = None,
    broadcast: bool | None = None,
    batched: bool = False,
) -> None:
    """Refuse a tape that the adjoint method cannot differentiate (``unsupported_reason``,
    with the same arguments) with a DeviceError naming the reason. The device's
    preprocessing calls it for every differentiated tape
    (``preprocess.adjoint.validate_adjoint_differentiation``); the derivative entry points call
    it only for tapes that did not come through that preprocessing (device.py,
    ``ADJOINT_VALIDATED_IN_PREPROCESSING``)."""
    reason = unsupported_reason(tape, trainable, broadcast=broadcast, batched=batched)
    if reason:
        raise DeviceError(
            f"custatevec.qubit cannot differentiate this circuit by adjoint: {reason}."
        )


def _measurement_reason(mp: MeasurementProcess) -> str | None:
    supported = "it supports expval, var, probs (of wires) and state"
    if not is_swept(mp):
        return (
            f"{supported}, not {type(mp).__name__} (QNodes get density_matrix, purity, "
            "vn_entropy, mutual_info and the other measurements of the state from the "
            "state, through the device's preprocessing)"
        )
    if mp.mv is not None:
        return f"{supported}, not measurements of mid-circuit measurement values"
    if isinstance(mp, ProbabilityMP) and mp.obs is not None:
        return f"{supported}, not probs of an observable ({mp.obs.name})"
    return None


def _not_hermitian(mp: MeasurementProcess) -> bool:
    return isinstance(mp, (ExpectationMP, VarianceMP)) and not (
        mp.obs is None or measure.is_hermitian(mp.obs)
    )


def has_a_generator(op: Operator) -> bool:
    """``op.has_generator``, without asking ``bool`` of a ``jax.jit``-traced angle:
    PennyLane's ``Evolution`` (``qml.evolve(G, x)``) answers ``not real(coeff)``, a
    ``TracerBoolConversionError`` under ``jax.jit``. Its angle is real by its contract
    (``Evolution``'s ``param`` "is expected not to have any complex component"), so it has
    one where its base is Hermitian, as PennyLane's ``Exp`` answers for a traced
    coefficient."""
    if isinstance(op, qml.ops.Evolution) and qml.math.is_abstract(op.param):
        return op.base.is_verified_hermitian
    return op.has_generator


def _operation_reason(op: Operator, trainable: bool) -> str | None:
    if isinstance(op, (MidMeasure, Conditional)):
        return (
            f"{op.name} is not unitary; with mid-circuit measurements use "
            "mcm_method='deferred', or diff_method='parameter-shift'"
        )
    if isinstance(op, Projector):  # a postselection: the sweep projects its bras (eager)
        if trainable:
            return (
                f"the basis of the Projector on wires {op.wires.tolist()} is trainable; it "
                "is not a differentiable parameter (make it a constant)"
            )
        return None
    if not trainable:
        return None
    if isinstance(op, EntrywiseState):
        return None
    if isinstance(op, StatePrepBase):
        return (
            f"the parameters of the state preparation {op.name} on {len(op.wires)} wires are "
            "trainable; the adjoint method differentiates a trainable state preparation by "
            "its amplitudes where it opens the circuit on at most "
            f"{MAX_ENTRYWISE_STATE_QUBITS} wires, after the device's preprocessing (use "
            "diff_method='backprop' on default.qubit otherwise, or prepare the state with "
            "parametrized gates)" + _traced_hint(op)
        )
    if compiles_by_gate(op) or isinstance(op, EntrywiseUnitary):
        return None
    if isinstance(op, ENTRYWISE_SOURCES):
        if too_wide(op):
            return (
                f"{op.name} has a trainable matrix on {len(op.wires)} wires; the adjoint "
                f"method takes a trainable unitary on at most {MAX_ENTRYWISE_QUBITS} wires "
                "(by its entries: 2 * 4**k real parameters), a controlled one on at most "
                f"{MAX_ENTRYWISE_QUBITS} target wires and {MAX_ENTRYWISE_CONTROLLED_QUBITS} "
                "wires in all; use diff_method='backprop' on default.qubit for a wider one"
                + _traced_hint(op)
            )
        return (
            f"{op.name} has a trainable matrix, which the adjoint method takes by its "
            "entries after the device's preprocessing (device.preprocess_transforms(), "
            "which qml.execute and QNodes run); this tape did not go through it"
        )
    if op.num_params != 1 or not has_a_generator(op):
        return (
            f"{op.name} has trainable parameters but no generator; the adjoint method "
            "differentiates gates with one parameter and a generator (rotations, phase "
            "shifts, ...); use those, or diff_method='parameter-shift'" + _traced_hint(op)
        )
    return None


def _traced_hint(op: Operator) -> str:
    """Why a parameter the user does not differentiate can count as trainable: under
    ``jax.jit`` PennyLane takes every traced argument to be trainable."""
    if not any(qml.math.is_abstract(value) for value in op.data):
        return ""
    return (
        ". Under jax.jit every traced value counts as trainable: a constant "
        f"{op.name} parameter passed as an argument of the jitted function, or computed "
        "with jax inside it, is one; close over a NumPy array instead"
    )
