"""A tape's metric tensor on a device (``CuStateVecDevice.compute_metric_tensor``): what it
refuses by name, the tape through the device's own preprocessing (the adjoint method's
gate set and generators), the device's gradient columns related to the tape's trainable
parameters, then ``gradients.metric``.

The tape comes from ``metric_transform.metric_tensor``'s expansion (PennyLane's: gates of
several parameters become gates of one parameter each), so its trainable parameters are
the metric's rows and columns, in PennyLane's order. The device's preprocessing may gather
rotations or decompose operations; the compiled circuit's gradient columns (one gate
angle each) are read back against the tape's trainable values, in order. Where they are
the same values, the columns are the parameters; where a decomposition shares, rescales
or combines them, the metric of the columns is composed with their Jacobian by the
parameters, taken by autograd through the same preprocessing (``device_circuit``).
Trainable global phases have zero rows (``global_phase_positions``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import pennylane as qml
from pennylane import numpy as pnp
from pennylane.exceptions import DeviceError
from pennylane.ops import Conditional, MidMeasure, Projector
from pennylane.tape import QuantumScript
from pennylane.wires import Wires

from .backends.base import Backend
from .entrywise import EntrywiseState, EntrywiseUnitary
from .gradients.differentiated import DifferentiatedTape
from .gradients.metric import block_diagonal_metric, full_metric, layer_mask, plan_metric
from .queuing import without_queuing
from .settings import DifferentiationOptions

APPROXIMATIONS = (None, "block-diag", "diag")
"""The ``approx`` values: the full metric, PennyLane's block-diagonal and diagonal ones."""


class MetricTensorError(DeviceError):
    """A circuit whose metric tensor the device does not compute; the message names why
    and what to use instead."""


def _refuse(reason: str) -> None:
    raise MetricTensorError(f"custatevec.qubit cannot compute this metric tensor: {reason}.")


def refusal_reason(tape: QuantumScript) -> str | None:
    """Why the device refuses ``tape``'s metric tensor before preprocessing, or None."""
    if tape.shots:
        return (
            f"it is computed from the state, and the circuit has shots={tape.shots.total_shots}; "
            "use qml.metric_tensor (its hardware method) with shots, or shots=None"
        )
    for op in tape.operations:
        if isinstance(op, (MidMeasure, Conditional)):
            return (
                f"the circuit has a mid-circuit measurement ({op.name}), whose state is not "
                "one pure state; use qml.metric_tensor on a circuit without them"
            )
        if isinstance(op, Projector):
            return f"the circuit postselects (a Projector on wires {op.wires.tolist()})"
    if tape.batch_size is not None:
        return "the circuit is broadcast; compute the metric of each entry on its own"
    n_ops = len(tape.operations)
    for index in tape.trainable_params:
        info = tape.par_info[index]
        if info["op_idx"] >= n_ops:
            return (
                f"the data of the observable {info['op'].name} is trainable; the metric is "
                "that of the state's gate parameters (make the observable's data constant)"
            )
        op = info["op"]
        if qml.math.is_abstract(op.data[info["p_idx"]]):
            return (
                f"the parameter of {op.name} is traced (jax.jit); call the metric tensor "
                "outside jax.jit"
            )
    return None


def _trainable_values(tape: QuantumScript) -> np.ndarray:
    """The tape's trainable parameters' values, flattened in order (float64)."""
    parameters = tape.get_parameters(trainable_only=False)
    values = [np.ravel(np.asarray(qml.math.unwrap(parameters[i]))) for i in tape.trainable_params]
    flat = np.concatenate(values) if values else np.zeros(0)
    if np.iscomplexobj(flat):  # a decomposition's complex dtype: real values only
        if np.any(flat.imag != 0):
            _refuse("a trainable gate parameter is complex; the metric is one of real ones")
        flat = flat.real
    return flat.astype(np.float64)


def rebound(tape: QuantumScript, values: Sequence[np.ndarray], flat) -> QuantumScript:
    """``tape`` with the parameters ``values`` (numpy, in order), its trainable ones read
    from ``flat`` instead (their values flattened in order: an autograd tensor, a box or
    a tracer), reshaped as they are."""
    trainable = set(tape.trainable_params)
    new = []
    at = 0
    for index, value in enumerate(values):
        if index in trainable:
            new.append(qml.math.reshape(flat[at : at + value.size], value.shape))
            at += value.size
        else:
            new.append(value)
    with without_queuing():
        return tape.bind_new_parameters(new, list(range(len(values))))


def _tagged(tape: QuantumScript, flat) -> QuantumScript:
    """The tape's operations measuring the state, its constant parameters as numpy
    values and its trainable ones read from ``flat`` (their values in order, an autograd
    tensor that requires gradients, or traced), so that the device's preprocessing tells
    them by PennyLane's workflow's rule (``get_trainable_indices``)."""
    parameters = tape.get_parameters(trainable_only=False)
    bound = rebound(tape, [np.asarray(qml.math.unwrap(value)) for value in parameters], flat)
    with without_queuing():
        script = QuantumScript(bound.operations, [qml.state()])
    script.trainable_params = sorted(i for i in tape.trainable_params if i < script.num_params)
    return script


def _preprocessed(tape: QuantumScript, preprocess: Callable, flat) -> QuantumScript:
    """``_tagged`` through the device's preprocessing: its one tape."""
    tapes, _ = preprocess((_tagged(tape, flat),))
    if len(tapes) != 1:
        _refuse(
            f"the device's preprocessing splits the circuit into {len(tapes)} circuits "
            "(a broadcast or a split measurement)"
        )
    return tapes[0]


def _column_values(device_tape: QuantumScript, origins: Sequence) -> list:
    """The value each gradient column reads (``origins``: its step's origin, by column)."""
    values = []
    for origin in origins:
        value = device_tape.operations[origin.operation].data[origin.parameter]
        values.append(qml.math.reshape(value, (-1,))[origin.element])
    return values


@dataclasses.dataclass(frozen=True)
class DeviceCircuit:
    """A tape as the device differentiates it, and how its gradient columns (one gate
    angle each) depend on the tape's trainable parameters."""

    circuit: DifferentiatedTape
    jacobian: np.ndarray | None
    """J[k, j] = d(column k)/d(parameter j), float64; None where each column is one
    parameter, as it is (the identity: the device's preprocessing kept every trainable
    gate)."""


def device_circuit(tape: QuantumScript, preprocess: Callable, wires: Wires | None) -> DeviceCircuit:
    """The tape through the device's preprocessing, compiled; where its columns are not
    the tape's trainable parameters one for one (a decomposition shares, rescales or
    combines them: FermionicSWAP, a power of a rotation), their Jacobian, by autograd
    through the same preprocessing."""
    expected = _trainable_values(tape)
    device_tape = _preprocessed(tape, preprocess, pnp.tensor(expected, requires_grad=True))
    parameters = device_tape.get_parameters(trainable_only=False)
    device_tape.trainable_params = qml.math.get_trainable_indices(parameters)
    for index in device_tape.trainable_params:
        op = device_tape.par_info[index]["op"]
        if isinstance(op, (EntrywiseUnitary, EntrywiseState)):
            _refuse(
                f"{op.name} is a trainable matrix or state taken by its entries, which has "
                "no generator; the metric tensor takes gates with a generator (rotations, "
                "phase shifts, ...)"
            )
    circuit = DifferentiatedTape(device_tape, wires)
    by_column = sorted(circuit.columns.items(), key=lambda item: item[1])
    if [c for _, c in by_column] != list(range(circuit.n_columns)):
        _refuse("a trainable operation of the circuit has no one gradient column per value")
    origins = [circuit.steps[index].origin for index, _ in by_column]
    found = np.array([np.asarray(qml.math.unwrap(v)) for v in _column_values(device_tape, origins)])
    if found.size == expected.size and np.array_equal(found, expected):
        return DeviceCircuit(circuit, None)

    def column_values(flat):
        traced = _preprocessed(tape, preprocess, flat)
        if len(traced.operations) != len(device_tape.operations):
            raise RuntimeError("the device's preprocessing is not deterministic")
        return qml.math.stack(_column_values(traced, origins))

    jacobian = qml.jacobian(column_values)(pnp.tensor(expected, requires_grad=True))
    return DeviceCircuit(circuit, np.asarray(jacobian, dtype=np.float64).reshape(-1, expected.size))


def metric_tensor(
    backend: Backend,
    wires: Wires | None,
    tape: QuantumScript,
    preprocess: Callable,
    approx: str | None,
    layers: Sequence[Sequence[int]] | None,
    in_force: DifferentiationOptions,
) -> np.ndarray:
    """The metric tensor of ``tape``'s trainable parameters, float64 (p, p), on
    ``backend``: ``preprocess`` the device's preprocessing program, ``layers`` the
    parametrized layers (each a list of trainable-parameter positions) of an
    approximation."""
    if approx not in APPROXIMATIONS:
        raise ValueError(
            f"Unknown value {approx!r} for approx; valid values are None, 'block-diag' and 'diag'."
        )
    reason = refusal_reason(tape)
    if reason:
        _refuse(reason)
    p = len(tape.trainable_params)
    phases = global_phase_positions(tape)
    kept = [position for position in range(p) if position not in phases]
    metric = np.zeros((p, p))
    if not kept:
        return metric
    if phases:  # their rows are zero; the others' metric without them, as constants
        tape = tape.copy()
        tape.trainable_params = [tape.trainable_params[position] for position in kept]
        renumbered = {position: k for k, position in enumerate(kept)}
        layers = layers and [[renumbered[i] for i in layer if i in renumbered] for layer in layers]
        layers = layers and [layer for layer in layers if layer]
    found = device_circuit(tape, preprocess, wires)
    circuit, jacobian = found.circuit, found.jacobian
    deferred = in_force.grad_accumulation == "deferred"
    if approx is not None and jacobian is None:
        reduced = block_diagonal_metric(backend, circuit, layers, approx == "diag", deferred)
    else:
        reduced = full_metric(backend, circuit, plan_metric(backend, circuit, deferred))
        if jacobian is not None:  # the tape's parameters' metric, J^T g J
            reduced = jacobian.T @ reduced @ jacobian
        if approx is not None:
            # the device's gates are not the tape's: the exact blocks of the full metric
            # (what the covariances give where they are)
            mask = layer_mask(reduced.shape[0], layers, approx == "diag")
            reduced = np.where(mask, reduced, 0.0)
    metric[np.ix_(kept, kept)] = reduced
    return metric


def global_phase_positions(tape: QuantumScript) -> set[int]:
    """The positions among ``tape``'s trainable parameters of global phases (a
    ``GlobalPhase``, or an exponential of an identity: ``exp(c I)`` with a complex
    ``c``, as decompositions of FermionicSWAP make them). Their rows and columns of the
    metric are zero (a global phase's derivative is a multiple of the state:
    Re<i k psi|d psi> = Re(<i k psi|psi><psi|d psi>)), and they are left out, as
    constants, of the circuit the device differentiates."""
    positions = set()
    for position, index in enumerate(tape.trainable_params):
        op = tape.par_info[index]["op"]
        if isinstance(op, qml.GlobalPhase) or (
            isinstance(op, qml.ops.Exp) and isinstance(op.base, qml.Identity)
        ):
            positions.add(position)
    return positions


def parametrized_layers(tape: QuantumScript) -> list[list[int]]:
    """PennyLane's parametrized layers of ``tape`` (``CircuitGraph.parametrized_layers``,
    which ``qml.metric_tensor``'s block-diagonal approximation reads) as positions among
    its trainable parameters."""
    position = {index: p for p, index in enumerate(tape.trainable_params)}
    layers = []
    for layer in tape.graph.parametrized_layers:
        members = [position[index] for index in layer.param_inds if index in position]
        if members:
            layers.append(members)
    return layers
