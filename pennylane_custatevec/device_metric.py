"""A tape's metric tensor on a device (``CuStateVecDevice.compute_metric_tensor``): what it
refuses by name, the tape through the device's own preprocessing (the adjoint method's
gate set and generators), the check that the device's trainable gate parameters are the
tape's one for one, then ``gradients.metric``.

The tape comes from ``metric_transform.metric_tensor``'s expansion (PennyLane's: trainable
multi-parameter gates become gates of one parameter each), so its trainable parameters are
the metric's rows and columns, in PennyLane's order. The device's preprocessing may gather
rotations or decompose constant operations; it must leave each trainable parameter one
gate's angle, as it is: the compiled circuit's gradient columns are read back against the
tape's trainable values, in order, and a mismatch is refused (never a silently wrong
metric).
"""

from __future__ import annotations

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
from .gradients.metric import block_diagonal_metric, full_metric, plan_metric
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


def _tagged(tape: QuantumScript) -> tuple[QuantumScript, np.ndarray]:
    """The tape's operations with numpy parameters, its trainable ones as autograd tensors
    that require gradients (so that the trainable ones are known after the device's
    preprocessing by the same rule as PennyLane's workflow), measuring the state; and the
    trainable values in order."""
    parameters = tape.get_parameters(trainable_only=False)
    trainable = set(tape.trainable_params)
    values = []
    new = []
    for index, value in enumerate(parameters):
        plain = np.asarray(qml.math.unwrap(value))
        if index in trainable:
            values.append(plain)
            new.append(pnp.tensor(plain, requires_grad=True))
        else:
            new.append(plain)
    with without_queuing():
        bound = tape.bind_new_parameters(new, list(range(len(parameters))))
        script = QuantumScript(bound.operations, [qml.state()])
    script.trainable_params = qml.math.get_trainable_indices(new[: script.num_params])
    flat = np.concatenate([np.ravel(v) for v in values]) if values else np.zeros(0)
    return script, flat.astype(np.float64) if np.isrealobj(flat) else flat


def _device_circuit(
    tape: QuantumScript, preprocess: Callable, wires: Wires | None
) -> DifferentiatedTape:
    """The tape through the device's preprocessing, compiled, its gradient columns checked
    against the tape's trainable parameters one for one."""
    script, expected = _tagged(tape)
    tapes, _ = preprocess((script,))
    if len(tapes) != 1:
        _refuse(
            f"the device's preprocessing splits the circuit into {len(tapes)} circuits "
            "(a broadcast or a split measurement)"
        )
    (device_tape,) = tapes
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
    columns = sorted(circuit.columns.items(), key=lambda item: item[1])
    found = np.array(
        [
            np.ravel(qml.math.unwrap(_step_parameter(device_tape, circuit.steps[index])))[0]
            for index, _ in columns
        ]
    )
    if (
        circuit.n_columns != expected.size
        or len(columns) != expected.size
        or [c for _, c in columns] != list(range(expected.size))
        or not np.array_equal(found, expected)
    ):
        _refuse(
            "the device's preprocessing does not keep each trainable parameter as one "
            "gate's angle (a decomposition combines or rescales them); use "
            "qml.adjoint_metric_tensor on default.qubit for this circuit"
        )
    return circuit


def _step_parameter(tape: QuantumScript, step):
    origin = step.origin
    value = tape.operations[origin.operation].data[origin.parameter]
    return np.ravel(np.asarray(qml.math.unwrap(value)))[origin.element]


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
    if not tape.trainable_params:
        return np.zeros((0, 0))
    circuit = _device_circuit(tape, preprocess, wires)
    deferred = in_force.grad_accumulation == "deferred"
    if approx is None:
        return full_metric(backend, circuit, plan_metric(backend, circuit, deferred))
    return block_diagonal_metric(backend, circuit, layers, approx == "diag", deferred)


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
