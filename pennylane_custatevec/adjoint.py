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

The bra encodes what is differentiated, one cotangent dy per measurement:

    expval(O):     lambda += 2 dy O psi           (d<O> = 2 Re <O psi | d psi>)
    probs(wires):  lambda += 2 D psi, D = diag(dy) on the wires (sum_x dy_x dp_x)
    state():       lambda += conj(dy)             (Re sum_i dy_i d psi_i)

A VJP is one bra. A Jacobian is one bra per output (one-hot cotangents) in one batch, so
one sweep serves every output. The Jacobian of a state output is computed forward
instead: d psi/d theta_j = U_N ... U_{j+1} i G_j phi_j, one vector per parameter.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np
import pennylane as qml
from pennylane.exceptions import DeviceError
from pennylane.measurements import (
    DensityMatrixMP,
    ExpectationMP,
    MeasurementProcess,
    ProbabilityMP,
    StateMP,
)
from pennylane.operation import Operator, StatePrepBase
from pennylane.ops import Conditional, MidMeasure, Projector
from pennylane.tape import QuantumScript
from pennylane.wires import Wires

from . import measure, simulate
from .backends.base import Backend, StateBatch
from .program import (
    Program,
    compile_steps,
    compiles_by_gate,
    flatten,
    inverse,
    is_broadcast,
    plain_rotation,
    tape_batch_size,
)
from .queuing import generator_of


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
    for index in trainable:
        info = tape.par_info[index]
        if info["op_idx"] >= n_ops:
            return (
                f"a parameter of the observable {info['op'].name} is trainable; the adjoint "
                "method differentiates gate parameters only (make the observable's "
                "coefficients non-trainable, or use diff_method='parameter-shift')"
            )
        trainable_ops.add(info["op_idx"])
    for position, op in enumerate(tape.operations):
        reason = _operation_reason(op, position in trainable_ops)
        if reason:
            return reason
    return None


def _measurement_reason(mp: MeasurementProcess) -> str | None:
    supported = "it supports expval, probs (of wires) and state"
    if isinstance(mp, DensityMatrixMP) or not isinstance(
        mp, (ExpectationMP, ProbabilityMP, StateMP)
    ):
        return f"{supported}, not {type(mp).__name__}"
    if mp.mv is not None:
        return f"{supported}, not measurements of mid-circuit measurement values"
    if isinstance(mp, ProbabilityMP) and mp.obs is not None:
        return f"{supported}, not probs of an observable ({mp.obs.name})"
    return None


def _operation_reason(op: Operator, trainable: bool) -> str | None:
    if isinstance(op, (MidMeasure, Conditional, Projector)):
        return (
            f"{op.name} is not unitary; with mid-circuit measurements use "
            "mcm_method='deferred' without postselection, or diff_method='parameter-shift'"
        )
    if not trainable:
        return None
    if isinstance(op, StatePrepBase):
        return (
            f"the parameters of the state preparation {op.name} are trainable; the adjoint "
            "method cannot differentiate a prepared state (use diff_method='backprop' on "
            "default.qubit, or prepare the state with parametrized gates)"
        )
    if compiles_by_gate(op):
        return None
    if op.num_params != 1 or not op.has_generator:
        return (
            f"{op.name} has trainable parameters but no generator; the adjoint method "
            "differentiates gates with one parameter and a generator (rotations, phase "
            "shifts, ...); use those, or diff_method='parameter-shift'"
        )
    return None


def _trainable_positions(tape: QuantumScript) -> dict[tuple[int, int], int]:
    """{(operation index, parameter position): parameter column} of the trainable
    parameters of the operations."""
    n_ops = len(tape.operations)
    positions = {}
    for column, index in enumerate(tape.trainable_params):
        info = tape.par_info[index]
        if info["op_idx"] < n_ops:
            positions[info["op_idx"], info["p_idx"]] = column
    return positions


def _require_supported(tape: QuantumScript, broadcast: bool | None, batched: bool) -> None:
    reason = unsupported_reason(tape, broadcast=broadcast, batched=batched)
    if reason:
        raise DeviceError(
            f"custatevec.qubit cannot differentiate this circuit by adjoint: {reason}."
        )


class Circuit:
    """A tape compiled for the sweep: its program, its gates, its trainable gates.
    ``batched``: a broadcast tape is differentiated as one batch (the deferred mode).

    The sweeps differentiate by gate: ``columns`` maps each trainable step to its column,
    one per scalar parameter and one per element of a native template's parameter
    (``n_columns`` in all); ``fold`` turns per-column values into per-parameter ones."""

    def __init__(
        self, tape: QuantumScript, device_wires: Wires | None, compiled=None, batched=False
    ):
        # a compilation kept from the forward pass knows whether the tape is broadcast
        _require_supported(tape, compiled[0].broadcast if compiled else None, batched)
        self.tape = tape
        self.compiled = compiled or compile_steps(tape, device_wires)
        self.program, self.steps = self.compiled
        parameters = tape.get_parameters()
        self.n_params = len(parameters)
        self.shapes = [getattr(value, "shape", ()) for value in parameters]
        starts = [0]
        for shape in self.shapes:
            starts.append(starts[-1] + math.prod(shape))
        self.n_columns = starts[-1]
        self._starts = starts
        trainable = _trainable_positions(tape)
        self.columns = {
            step: starts[trainable[index, position]] + element
            for step, (index, position, element) in enumerate(self.program.origins)
            if (index, position) in trainable
        }

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
        state, _ = simulate.final_state(backend, flatten(self.program, self.steps))
        return state


@dataclasses.dataclass(frozen=True)
class SweepMemory:
    """What an adjoint sweep allocates beside the final states it is handed, counted in
    state vectors of the register (the deferred sweep's reductions in bytes), for the
    memory check before it allocates anything.

    The final states and the bras live through the whole sweep; the temporaries of
    building the bras are gone before the first step; the reductions accumulate during
    the steps, beside the temporaries of one step at a time."""

    states: int
    """Final states simulated again for the sweep, or copied into one batch."""
    bras: int
    """R per state vector (one for a VJP, one per output for a Jacobian)."""
    build_scratch: int
    """Temporary vectors while the bras are built (a cotangent term, the backend's)."""
    step_scratch: int
    """Temporary vectors of one sweep step (the backend's ``scratch_vectors``)."""
    reduction_bytes: int = 0
    """The deferred sweep's reductions, held until the sweep ends (an upper bound)."""

    def bytes(self, backend: Backend, num_qubits: int) -> int:
        return self._bytes(simulate.state_bytes(backend, num_qubits, 1))

    def _bytes(self, vector: int) -> int:
        during_steps = vector * self.step_scratch + self.reduction_bytes
        return vector * (self.states + self.bras) + max(vector * self.build_scratch, during_steps)

    def single_precision(self, backend: Backend, num_qubits: int) -> list[simulate.Alternative]:
        """``c_dtype=numpy.complex64`` as an alternative: half the bytes per vector (the
        reductions stay complex128)."""
        half = self._bytes(simulate.state_bytes(backend, num_qubits, 1) // 2)
        return simulate.single_precision(backend, half)

    def described(self) -> str:
        """What the vectors are, for an error message."""
        parts = [f"{self.bras:,} bra{'s' if self.bras != 1 else ''}"]
        if self.states:
            parts.insert(0, f"{self.states:,} final state{'s' if self.states != 1 else ''}")
        scratch = max(self.build_scratch, self.step_scratch)
        if scratch:
            parts.append(f"up to {scratch:,} temporary vector{'s' if scratch != 1 else ''}")
        if self.reduction_bytes:
            parts.append(f"{self.reduction_bytes:,} bytes of reductions")
        return ", ".join(parts)


def bra_build_scratch(backend: Backend) -> int:
    """Temporary vectors while one bra's cotangent terms are added (``add_cotangent_terms``):
    one term at a time (a copy of psi, O psi, or a state cotangent), and the backend's
    temporary of adding it."""
    return 1 + backend.scratch_vectors(1, 1, False)


def eager_sweep_memory(backend: Backend, held: bool, rows: int) -> SweepMemory:
    """The eager sweep of one (not broadcast) tape with ``rows`` bras; ``held``: its final
    state is handed over (kept from the forward pass), else simulated again."""
    return SweepMemory(
        states=0 if held else 1,
        bras=rows,
        build_scratch=bra_build_scratch(backend),
        step_scratch=backend.scratch_vectors(1, rows, False),
    )


def require_sweep_memory(
    backend: Backend,
    num_qubits: int,
    memory: SweepMemory,
    what: str,
    alternatives: Sequence[simulate.Alternative] | Callable = (),
) -> None:
    """Refuse a sweep whose ``memory`` does not fit, naming the ``alternatives`` (or a
    function of the available bytes that finds them) and single precision that would."""

    def found(available: int) -> list[simulate.Alternative]:
        named = alternatives(available) if callable(alternatives) else alternatives
        return [*named, *memory.single_precision(backend, num_qubits)]

    simulate.require_total(
        backend,
        memory.bytes(backend, num_qubits),
        f"{what} on {num_qubits} qubits ({memory.described()})",
        found,
    )


def _require_eager_memory(
    backend: Backend, circuit: Circuit, held: bool, rows: int, kind: str
) -> None:
    """Refuse, before allocating, an eager sweep with ``rows`` bras that does not fit,
    naming device_vjp=True (one bra) for a Jacobian of several outputs. (The deferred
    mode needs as many bras for one tape: it is no alternative here.)"""
    if not circuit.columns:
        return  # no sweep
    n = circuit.program.num_qubits
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
    backend: Backend, tape: QuantumScript, device_wires: Wires | None, state=None, compiled=None
):
    """The Jacobian of ``tape``'s results with respect to its trainable parameters, shaped as
    PennyLane expects. ``state``, the final state if already known, is consumed;
    ``compiled``, the tape's ``compile_steps`` if already known, is reused."""
    circuit = Circuit(tape, device_wires, compiled)
    measurements = tape.measurements
    per_measurement: list = [None] * len(measurements)
    swept = [i for i, mp in enumerate(measurements) if not isinstance(mp, StateMP)]
    if swept:
        rows = one_hot_rows(circuit, swept)
        _require_eager_memory(backend, circuit, state is not None, len(rows), "Jacobian")
        if state is None:
            state = circuit.final_state(backend)
        gradients = _sweep(backend, circuit, state, rows)
        start = 0
        for i in swept:
            mp = measurements[i]
            size = output_size(mp, circuit.program)
            block = gradients[start : start + size]
            start += size
            shape = output_shape(mp, circuit.program)
            per_measurement[i] = circuit.fold(
                [block[:, c].reshape(shape) for c in range(circuit.n_columns)]
            )
    if len(swept) < len(measurements):
        derivatives = state_derivatives(backend, circuit)
        for i, mp in enumerate(measurements):
            if isinstance(mp, StateMP):
                wires = circuit.program.wires
                per_measurement[i] = circuit.fold(
                    [mp.process_state(d[0], wire_order=wires) for d in derivatives]
                )
    return format_jacobian(per_measurement, circuit.n_params)


def vjp(
    backend: Backend,
    tape: QuantumScript,
    cotangents,
    device_wires: Wires | None,
    state=None,
    compiled=None,
):
    """The vector-Jacobian product of ``tape`` with ``cotangents`` (PennyLane's per-tape
    cotangent: one value per measurement, not wrapped for a single measurement), a tuple
    with one entry per trainable parameter. ``state`` and ``compiled`` as in ``jacobian``.
    A batch of cotangents (``cotangent_batch``) gives a batch of VJPs."""
    circuit = Circuit(tape, device_wires, compiled)
    rows = cotangent_batch(circuit, cotangents)
    if rows is not None:
        return batched_vjp(backend, circuit, rows, state)
    per_measurement = checked_cotangents(circuit, cotangents)
    if circuit.n_params == 0:
        return ()
    if all(is_zero(dy) for dy in per_measurement):
        return tuple(circuit.fold(np.zeros(circuit.n_columns)))
    _require_eager_memory(backend, circuit, state is not None, 1, "VJP")
    if state is None:
        state = circuit.final_state(backend)
    gradients = _sweep(backend, circuit, state, [per_measurement])
    return tuple(circuit.fold(gradients[0]))


def cotangent_batch(circuit: Circuit, cotangents) -> list[tuple] | None:
    """The K cotangents of a batch of cotangents, each as ``checked_cotangents`` gives it,
    or None for one cotangent. A batch (jax's vmap of a VJP: ``jax.jacobian`` of a QNode
    with ``device_vjp=True``) has one leading axis of size K on each measurement's
    cotangent, over its result's shape; a scalar or None serves every row."""
    tape = circuit.tape
    per_measurement = (cotangents,) if len(tape.measurements) == 1 else tuple(cotangents)
    batch = (circuit.program.batch_size,) if circuit.program.broadcast else ()
    batched, sizes = [], set()
    for mp, dy in zip(tape.measurements, per_measurement, strict=True):
        shape = np.shape(dy) if dy is not None else ()
        expected = batch + output_shape(mp, circuit.program)
        batched.append(len(shape) == len(expected) + 1 and shape[1:] == expected)
        if batched[-1]:
            sizes.add(shape[0])
    if not sizes:
        return None
    if len(sizes) > 1:
        raise DeviceError(
            f"custatevec.qubit got batches of cotangents of sizes {sorted(sizes)} for one "
            "tape; the cotangents of its measurements must batch alike."
        )
    rows = []
    for k in range(sizes.pop()):
        row = tuple(
            dy[k] if is_batched else dy
            for dy, is_batched in zip(per_measurement, batched, strict=True)
        )
        rows.append(checked_cotangents(circuit, row if len(row) > 1 else row[0]))
    return rows


def batched_vjp(backend: Backend, circuit: Circuit, rows: Sequence[tuple], state=None) -> tuple:
    """The VJPs of the cotangent ``rows`` (each one value per measurement) in one sweep,
    stacked on a leading axis: per trainable parameter, an array of shape
    ``(K, *parameter_shape)``. Rows that are all zero are not swept."""
    if circuit.n_params == 0:
        return ()
    gradients = np.zeros((len(rows), circuit.n_columns))
    live = [k for k, row in enumerate(rows) if not all(is_zero(dy) for dy in row)]
    if live:
        if state is None:
            state = circuit.final_state(backend)
        gradients[live] = _sweep(backend, circuit, state, [rows[k] for k in live])
    return stacked_gradients(circuit, gradients)


def stacked_gradients(circuit: Circuit, gradients: np.ndarray) -> tuple:
    """Per trainable parameter, from the rows of ``gradients`` ``(K, columns)``: an array
    of shape ``(K, *parameter_shape)``; ``()`` without trainable parameters."""
    if circuit.n_params == 0:
        return ()
    return tuple(circuit.fold(list(gradients.T)))


def checked_cotangents(circuit: Circuit, cotangents) -> tuple:
    """PennyLane's per-tape cotangent as one entry per measurement, each of its result's
    shape (with the batch axis first for a broadcast tape), or a scalar, or None."""
    tape = circuit.tape
    per_measurement = (cotangents,) if len(tape.measurements) == 1 else tuple(cotangents)
    batch = (circuit.program.batch_size,) if circuit.program.broadcast else ()
    for mp, dy in zip(tape.measurements, per_measurement, strict=True):
        expected = output_shape(mp, circuit.program)
        if dy is not None and np.shape(dy) not in (batch + expected, ()):
            batched = "(K" + "".join(f", {n}" for n in batch + expected) + ")"
            raise DeviceError(
                f"custatevec.qubit got a cotangent of shape {np.shape(dy)} for {mp}, whose "
                f"result has shape {batch + expected}; a cotangent has its result's shape, "
                f"or is a scalar, and a batch of K cotangents has the shape {batched}."
            )
    return per_measurement


def is_zero(value) -> bool:
    return value is None or not np.any(np.asarray(value))


def output_size(mp: MeasurementProcess, program: Program) -> int:
    if isinstance(mp, (ProbabilityMP, StateMP)):
        return 2 ** len(mp.wires or program.wires)
    return 1


def output_shape(mp: MeasurementProcess, program: Program) -> tuple:
    """The shape of one (not broadcast) result of ``mp``."""
    return () if isinstance(mp, ExpectationMP) else (output_size(mp, program),)


def one_hot_rows(circuit: Circuit, measured: list[int]) -> list[tuple]:
    """One cotangent row per output of the measurements ``measured`` (indices into the
    tape's): 1 at that output, None elsewhere."""
    measurements = circuit.tape.measurements
    rows = []
    for i in measured:
        size = output_size(measurements[i], circuit.program)
        for output in range(size):
            row: list = [None] * len(measurements)
            row[i] = 1.0 if isinstance(measurements[i], ExpectationMP) else np.eye(size)[output]
            rows.append(tuple(row))
    return rows


def format_jacobian(per_measurement: list[list[np.ndarray]], n_params: int):
    """measurement x parameter, with single measurements and single parameters unwrapped."""
    if n_params == 1:
        entries = [columns[0] for columns in per_measurement]
    else:
        entries = [tuple(columns) for columns in per_measurement]
    return entries[0] if len(entries) == 1 else tuple(entries)


def _sweep(backend: Backend, circuit: Circuit, state: StateBatch, rows: Sequence[tuple]):
    """d/dtheta of the real cotangent products of every row, float64 (rows, columns)."""
    gradients = np.zeros((len(rows), circuit.n_columns))
    if not circuit.columns:
        return gradients
    bras = _bras(backend, circuit, state, rows)
    phi = state
    first = min(circuit.columns)
    for index in range(len(circuit.steps) - 1, first - 1, -1):
        op, instructions = circuit.steps[index]
        column = circuit.columns.get(index)
        rotation = plain_rotation(op, instructions)
        if column is not None and rotation is not None:
            # G = -P/2: the inner product and both undos in one backend step
            products = -0.5 * backend.adjoint_rotation_step(
                phi, bras, rotation.data, rotation.paulis, rotation.targets
            )
            gradients[:, column] = np.real(1j * products)
            continue
        if column is not None:
            products = measure.transition(backend, bras, phi, circuit.program, generator_of(op))
            gradients[:, column] = np.real(1j * products)
        if index == first:
            break
        for instruction in reversed(instructions):
            undo = inverse(instruction)
            simulate.apply_instruction(backend, phi, undo)
            simulate.apply_instruction(backend, bras, undo)
    return gradients


def _bras(backend: Backend, circuit: Circuit, psi: StateBatch, rows: Sequence[tuple]):
    """One bra per row (module docstring), in a new batch."""
    bras = backend.zero_state(circuit.program.num_qubits, len(rows))
    backend.scale(bras, np.zeros(1))
    add_cotangent_terms(backend, bras, psi, circuit.program, circuit.tape.measurements, rows)
    return bras


def add_cotangent_terms(
    backend: Backend,
    bras: StateBatch,
    psi: StateBatch,
    program: Program,
    measurements: Sequence[MeasurementProcess],
    rows: Sequence[tuple],
) -> None:
    """bras[r] += the sum over measurements of each cotangent's term of row r (module
    docstring), for the final state ``psi`` (one vector)."""
    for r, row in enumerate(rows):
        bra = backend.vectors(bras, r, r + 1)
        # the Pauli observables' terms as one sum: one backend call however many there are
        paulis = qml.pauli.PauliSentence()
        for mp, dy in zip(measurements, row, strict=True):
            if is_zero(dy):
                continue
            if isinstance(mp, ExpectationMP) and mp.obs.pauli_rep is not None:
                paulis += (2.0 * float(dy)) * mp.obs.pauli_rep
            else:
                _add_term(backend, bra, psi, program, mp, dy)
        if paulis:
            measure.add_pauli_sentence(backend, bra, psi, program, paulis)


def _add_term(backend, bra, psi, program: Program, mp: MeasurementProcess, dy) -> None:
    """bra += the cotangent term of a state, probs, or expval of a non-Pauli observable."""
    if isinstance(mp, StateMP):
        backend.add_scaled(bra, backend.from_host(np.conj(np.asarray(dy))[None]), np.ones(1))
    elif isinstance(mp, ProbabilityMP):
        scaled = backend.copy(psi)
        weights = np.asarray(dy, dtype=np.complex128)[None]
        backend.apply_diagonal(scaled, weights, program.targets(mp.wires or program.wires))
        backend.add_scaled(bra, scaled, np.full(1, 2.0))
    else:
        applied = measure.applied_observable(backend, psi, program, mp.obs)
        backend.add_scaled(bra, applied, [2.0 * float(dy)])


def state_derivatives(backend: Backend, circuit: Circuit) -> list[np.ndarray]:
    """Forward mode: d psi/d theta_j = U_N ... U_{j+1} (i G_j) phi_j for every trainable
    j, as host arrays (B, 2**n), one per column (the Jacobian of a state is that big)."""
    program = circuit.program
    n, batch = program.num_qubits, program.batch_size
    vectors = (1 + len(circuit.columns)) * batch
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
    state = simulate.initial_state(backend, program, batch)
    derivatives: list[StateBatch | None] = [None] * circuit.n_columns
    for index, (op, instructions) in enumerate(circuit.steps):
        for instruction in instructions:
            simulate.apply_instruction(backend, state, instruction)
            for d in derivatives:
                if d is not None:
                    simulate.apply_instruction(backend, d, instruction)
        column = circuit.columns.get(index)
        if column is not None:
            derivative = measure.applied_observable(backend, state, program, generator_of(op))
            backend.scale(derivative, np.full(1, 1j))
            derivatives[column] = derivative
    return [backend.to_host(d) for d in derivatives]
