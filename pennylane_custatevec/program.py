"""Tape -> Program: PennyLane operations become backend kernel instructions.

This is the one place where wire labels become bit positions. The register holds the
tape's wires in device order; the wire at position ``p`` of that order is state bit
``n - 1 - p`` (PennyLane's wire 0 is the most significant bit of the state index,
cuStateVec's bit 0 the least significant). Targets are listed little-endian
(``targets[j]`` becomes bit ``j`` of a matrix index), so an operation on wires
``(w0, ..., wk-1)`` whose PennyLane matrix has ``w0`` most significant gets targets
``[bit(wk-1), ..., bit(w0)]``.

Dispatch is on operator types, most specific first: controlled operations keep their
controls and compile their base; adjoints compile their base and invert it; Pauli
words, Pauli rotations and diagonal gates get their own kernels; native templates
(templates.py) become their gates; everything else is a dense matrix. Parameters may be
broadcast: batched data has a leading batch axis.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Sequence
from functools import singledispatch

import numpy as np
import pennylane as qml
from pennylane.exceptions import DeviceError
from pennylane.operation import Operator
from pennylane.ops import Conditional, MidMeasure
from pennylane.ops.op_math import Adjoint, Controlled
from pennylane.tape import QuantumScript
from pennylane.wires import Wires

from .queuing import matrix_of, without_queuing
from .rotations import PauliRotations, real_angles, rotation_word, structure
from .templates import angles_by_element, is_native_template, template_gates


class Kind(enum.Enum):
    """The kernel an instruction runs; see backends/base.py for each one's meaning."""

    MATRIX = "matrix"
    DIAGONAL = "diagonal"
    PAULI = "pauli"
    PAULI_ROTATION = "pauli_rotation"
    Z_ROTATIONS = "z_rotations"
    ROTATIONS = "rotations"
    PHASE = "phase"
    MID_MEASURE = "mid_measure"
    POSTSELECT = "postselect"


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One kernel call.

    ``data`` holds, by kind: MATRIX (1 or B, 2**k, 2**k) matrices; DIAGONAL (1 or B, 2**k);
    PAULI_ROTATION (1 or B,) angles of exp(-i angle/2 P); Z_ROTATIONS (1 or B, J) the
    angles of J commuting rotations exp(-i angle_j/2 Z_j), Z_j the word of Z letters on
    the bits of ``z_masks[j]``; ROTATIONS (1 or B, m) the angles of m one-qubit rotations
    exp(-i angle_j/2 P_j) on the distinct bits ``targets[j]``, P_j the letter
    ``paulis[j]``; PHASE (1 or B,) factors;
    POSTSELECT (1, 2**k, 2**k) the projector; PAULI and MID_MEASURE nothing.
    ``condition`` makes the instruction act only on the state vectors (shots) whose
    mid-circuit measurements satisfy it.
    """

    kind: Kind
    targets: tuple[int, ...] = ()
    controls: tuple[int, ...] = ()
    control_values: tuple[int, ...] = ()
    data: np.ndarray | None = None
    paulis: str = ""
    z_masks: tuple[int, ...] = ()
    source: Operator | None = None
    condition: qml.ops.MeasurementValue | None = None


@dataclasses.dataclass(frozen=True)
class Program:
    """What the backend runs for one tape."""

    wires: Wires
    instructions: tuple[Instruction, ...]
    batch_size: int
    initial_state: np.ndarray | None = None
    broadcast: bool = False
    """Whether the tape is broadcast (a broadcast of one entry has batch_size 1 too)."""
    origins: tuple[tuple[int, int | None, int], ...] = ()
    """Per step of a compilation (see ``compile_steps``): the index of the tape operation
    it comes from, the position among that operation's parameters of the one the step
    depends on (None for none), and the flat index into that parameter of the element
    the step reads (0 but for a native template's rotations)."""

    @property
    def num_qubits(self) -> int:
        return len(self.wires)

    @functools.cached_property
    def _bit_of(self) -> dict:
        n = len(self.wires)
        return {wire: n - 1 - position for position, wire in enumerate(self.wires)}

    def bits(self, wires: Sequence) -> tuple[int, ...]:
        """State bits of ``wires``, in the order given."""
        return tuple(map(self._bit_of.__getitem__, wires))

    def targets(self, wires: Sequence) -> tuple[int, ...]:
        """Little-endian targets of an operator on ``wires`` (first wire most significant)."""
        return self.bits(wires)[::-1]

    @property
    def has_mid_measurements(self) -> bool:
        return any(ins.kind is Kind.MID_MEASURE for ins in self.instructions)

    @functools.cached_property
    def structure_key(self) -> tuple:
        """Equal for programs that run the same kernels on the same bits with other data:
        such programs run as one batch of state vectors (see ``merge``)."""
        return (
            tuple(self.wires),
            self.initial_state is not None,
            tuple(
                (
                    ins.kind,
                    ins.targets,
                    ins.controls,
                    ins.control_values,
                    ins.paulis,
                    ins.z_masks,
                    None if ins.data is None else ins.data.shape[1:],
                )
                for ins in self.instructions
            ),
        )


Steps = list[tuple[Operator, list[Instruction]]]
"""Each operation of a tape with the instructions it compiled to (a native template:
each of its gates with its one instruction)."""


def merge(compiled: Sequence[tuple[Program, Steps]]) -> tuple[Program, Steps]:
    """One compilation (layout, steps) whose batch is the concatenation of the batches of
    ``compiled``: tapes that share a structure key and have no mid-circuit measurements."""
    if len(compiled) == 1:
        return compiled[0]
    layouts = [layout for layout, _ in compiled]
    sizes = [layout.batch_size for layout in layouts]
    steps = [
        (
            group[0][0],
            [
                dataclasses.replace(
                    parts[0], data=_concatenate_data([i.data for i in parts], sizes)
                )
                for parts in zip(*(instructions for _, instructions in group), strict=True)
            ],
        )
        for group in zip(*(steps for _, steps in compiled), strict=True)
    ]
    initial_state = None
    if layouts[0].initial_state is not None:
        initial_state = _concatenate_data([layout.initial_state for layout in layouts], sizes)
    layout = dataclasses.replace(layouts[0], batch_size=sum(sizes), initial_state=initial_state)
    return layout, steps


def _concatenate_data(data: list, sizes: list[int]):
    """Per-vector data of a merged batch; data the programs share stays shared."""
    if data[0] is None:
        return None
    if all(d.shape[0] == 1 and np.array_equal(d, data[0]) for d in data):
        return data[0]
    return np.concatenate(
        [np.broadcast_to(d, (size,) + d.shape[1:]) for d, size in zip(data, sizes, strict=True)]
    )


def wire_labels(op: Operator) -> Sequence:
    """The labels of ``op.wires``; for a controlled operation, without the Wires object
    PennyLane builds from its control and target wires on every access (microseconds,
    many times per circuit)."""
    if isinstance(op, Controlled):
        return (*op.hyperparameters["control_wires"], *op.base.wires)
    return op.wires


def register_wires(tape: QuantumScript, device_wires: Wires | None) -> Wires:
    """The wires the simulation needs, in device order. A device without wires (None, or
    none given: ``wires=0`` or ``[]``) takes each circuit's, as PennyLane's devices do."""
    if not device_wires:
        return tape.wires
    used = set(tape.wires)
    return Wires([w for w in device_wires if w in used])


def compile_tape(tape: QuantumScript, device_wires: Wires | None) -> Program:
    """The Program of ``tape``; a state preparation first in the tape becomes its initial state."""
    return flatten(*compile_steps(tape, device_wires))


def flatten(layout: Program, steps: Steps) -> Program:
    """``layout`` (wires, batch size, initial state) with the instructions of ``steps``."""
    instructions = tuple(ins for _, compiled in steps for ins in compiled)
    return dataclasses.replace(layout, instructions=instructions)


def tape_batch_size(tape: QuantumScript) -> int | None:
    """``tape.batch_size``, asking PennyLane only about operations that can be broadcast:
    its check of every operation takes milliseconds on a tape of a few hundred gates."""
    sizes = {op.batch_size for op in tape.operations if not scalar_parameters(op)}
    sizes.discard(None)
    if len(sizes) > 1:
        return tape.batch_size  # PennyLane's error names the sizes that do not match
    return sizes.pop() if sizes else None


def is_broadcast(op: Operator) -> bool:
    """``op.batch_size is not None``, without PennyLane's check where every parameter is a
    scalar (such an operation cannot be broadcast)."""
    return not scalar_parameters(op) and op.batch_size is not None


def scalar_parameters(op: Operator) -> bool:
    """Whether every parameter of ``op`` is a scalar (so ``op`` is not broadcast)."""
    return all(
        isinstance(d, (int, float, complex)) or getattr(d, "ndim", None) == 0 for d in op.data
    )


def compile_steps(tape: QuantumScript, device_wires: Wires | None) -> tuple[Program, Steps]:
    """The tape's Program without instructions (wires, batch size, initial state, and the
    steps' origins), and the steps: each operation after the initial state preparation with
    its instructions, and each gate of a native template (see templates.py) with its one
    instruction."""
    wires = register_wires(tape, device_wires)
    batch_size = tape_batch_size(tape)
    layout = Program(
        wires=wires,
        instructions=(),
        batch_size=batch_size or 1,
        broadcast=batch_size is not None,
    )
    operations = tape.operations
    initial_state = None
    first = 0
    if operations and isinstance(operations[0], qml.operation.StatePrepBase):
        vector = operations[0].state_vector(wire_order=wires)
        initial_state = np.asarray(vector, dtype=np.complex128).reshape(-1, 2 ** len(wires))
        first = 1
    steps: Steps = []
    origins = []
    with without_queuing():  # decompositions and matrices may build operators
        for index in range(first, len(operations)):
            op = operations[index]
            if compiles_by_gate(op):
                for instruction, position, element in _gate_instructions(op, layout):
                    steps.append((instruction.source, [instruction]))
                    origins.append((index, position, element))
            else:
                steps.append((op, compile_operation(op, layout)))
                origins.append((index, 0, 0))
    layout = dataclasses.replace(layout, initial_state=initial_state, origins=tuple(origins))
    return layout, steps


def compiles_by_gate(op: Operator) -> bool:
    """Whether ``op`` compiles to one step per gate it holds: a native template
    (templates.py) or a run of rotations (rotations.py)."""
    return isinstance(op, PauliRotations) or is_native_template(op)


def _gate_instructions(op: Operator, layout: Program) -> list[tuple[Instruction, int | None, int]]:
    """One instruction per gate of ``op`` (``compiles_by_gate``), its ``source`` the gate,
    with the step's parameter position and element (see ``Program.origins``)."""
    if isinstance(op, PauliRotations):
        angles = real_angles(op.data, op.name)
        gates = structure(op.hyperparameters["gates"])
        return [
            (_gate_rotation(gate, angles[j : j + 1], layout), j, 0) for j, gate in enumerate(gates)
        ]
    angles = angles_by_element(op)
    return [
        (compile_operation(gate, layout)[0], None, 0)
        if element is None
        else (_gate_rotation(gate, angles[element], layout), 0, element)
        for gate, element in template_gates(op)
    ]


def _gate_rotation(gate: Operator, angles: np.ndarray, layout: Program) -> Instruction:
    """The rotation ``gate`` (standing for its structure) with ``angles`` (1 or B,)."""
    return Instruction(
        Kind.PAULI_ROTATION,
        targets=layout.targets(gate.wires),
        paulis=rotation_word(gate)[::-1],
        data=angles,
        source=gate,
    )


def _batched(values, trailing_dims: int) -> np.ndarray:
    """Values with a leading batch axis (length 1 when not broadcast)."""
    array = np.asarray(values)
    return array.reshape((-1,) + array.shape[array.ndim - trailing_dims :])


@singledispatch
def compile_operation(op: Operator, layout: Program) -> list[Instruction]:
    """Instructions that apply ``op``; the fallback is its dense matrix."""
    if isinstance(op, qml.operation.StatePrepBase):
        raise DeviceError(
            f"{op.name} is supported only as the first operation; it should have been "
            "decomposed by the device's preprocessing."
        )
    return [_matrix_instruction(op, layout)]


def _matrix_instruction(op: Operator, layout: Program) -> Instruction:
    # op.matrix() skips qml.matrix's wire-order handling, which costs more than the
    # matrix of a small gate; qml.matrix also covers operators defined by a decomposition
    matrix = op.matrix() if op.has_matrix else matrix_of(op, wire_order=op.wires)
    return Instruction(
        Kind.MATRIX, targets=layout.targets(op.wires), data=_batched(matrix, 2), source=op
    )


_PAULI_LETTERS = {"PauliX": "X", "PauliY": "Y", "PauliZ": "Z"}


@compile_operation.register
def _(op: qml.PauliX | qml.PauliY | qml.PauliZ, layout: Program) -> list[Instruction]:
    return [
        Instruction(
            Kind.PAULI, targets=layout.targets(op.wires), paulis=_PAULI_LETTERS[op.name], source=op
        )
    ]


@compile_operation.register
def _(
    op: qml.RX
    | qml.RY
    | qml.RZ
    | qml.IsingXX
    | qml.IsingYY
    | qml.IsingZZ
    | qml.MultiRZ
    | qml.PauliRot,
    layout: Program,
) -> list[Instruction]:
    return [_rotation(op, rotation_word(op), layout)]


@compile_operation.register
def _(op: PauliRotations, layout: Program) -> list[Instruction]:
    return [instruction for instruction, _, _ in _gate_instructions(op, layout)]


def _rotation(op: Operator, word: str, layout: Program) -> Instruction:
    if "I" not in word:  # the common case, without filtering the letters
        return Instruction(
            Kind.PAULI_ROTATION,
            targets=layout.targets(op.wires),
            paulis=word[::-1],
            data=_real_angles(op),
            source=op,
        )
    kept = [(letter, wire) for letter, wire in zip(word, op.wires, strict=True) if letter != "I"]
    if not kept:
        angles = _batched(op.data[0], 0)
        return Instruction(Kind.PHASE, data=np.exp(-0.5j * angles), source=op)
    letters, wires = zip(*kept, strict=True)
    return Instruction(
        Kind.PAULI_ROTATION,
        targets=layout.targets(wires),
        paulis="".join(letters)[::-1],
        data=_real_angles(op),
        source=op,
    )


def _real_angles(op: Operator) -> np.ndarray:
    """The rotation angle as float64 (1 or B,). A complex angle with a zero imaginary part
    (PennyLane casts parameters to complex to differentiate a state) is taken as real."""
    value = op.data[0]
    if isinstance(value, float):  # the common cases, without numpy's dispatch
        return np.array([value])
    if type(value) is np.ndarray and value.shape == () and value.dtype == np.float64:
        return value.reshape(1)
    return real_angles(_batched(value, 0), op.name)


@compile_operation.register
def _(op: qml.PhaseShift | qml.S | qml.T | qml.U1, layout: Program) -> list[Instruction]:
    return [_diagonal(op, layout)]


def _diagonal(op: Operator, layout: Program) -> Instruction:
    diagonal = np.diagonal(op.matrix(), axis1=-2, axis2=-1)
    return Instruction(
        Kind.DIAGONAL, targets=layout.targets(op.wires), data=_batched(diagonal, 1), source=op
    )


@compile_operation.register
def _(
    op: qml.StronglyEntanglingLayers | qml.BasicEntanglerLayers | qml.AngleEmbedding,
    layout: Program,
) -> list[Instruction]:
    if not is_native_template(op):
        return [_matrix_instruction(op, layout)]
    return [instruction for instruction, _, _ in _gate_instructions(op, layout)]


@compile_operation.register
def _(op: qml.Identity, layout: Program) -> list[Instruction]:
    return []


@compile_operation.register
def _(op: qml.GlobalPhase, layout: Program) -> list[Instruction]:
    factors = np.exp(-1j * _batched(op.data[0], 0))
    return [Instruction(Kind.PHASE, data=factors, source=op)]


@compile_operation.register
def _(op: Controlled, layout: Program) -> list[Instruction]:
    controls = layout.bits(op.control_wires)
    values = tuple(int(v) for v in op.control_values)
    letter = _PAULI_LETTERS.get(op.base.name)
    if letter is not None:  # CNOT, Toffoli, CZ, CY, ...: skip compiling the base
        return [
            Instruction(
                Kind.PAULI,
                targets=layout.targets(op.target_wires),
                controls=controls,
                control_values=values,
                paulis=letter,
                source=op,
            )
        ]
    controlled = []
    for inner in compile_operation(op.base, layout):
        if inner.kind is Kind.PHASE:
            controlled.append(_controlled_phase(inner, controls, values))
        else:
            controlled.append(
                dataclasses.replace(
                    inner,
                    controls=inner.controls + controls,
                    control_values=inner.control_values + values,
                    source=op,
                )
            )
    return controlled


def _controlled_phase(phase: Instruction, controls, values) -> Instruction:
    """A phase conditioned on controls is a diagonal on the control bits."""
    dim = 2 ** len(controls)
    selected = sum(v << j for j, v in enumerate(values))
    diagonal = np.ones((phase.data.shape[0], dim), dtype=np.complex128)
    diagonal[:, selected] = phase.data
    return Instruction(Kind.DIAGONAL, targets=controls, data=diagonal, source=phase.source)


@compile_operation.register
def _(op: Adjoint, layout: Program) -> list[Instruction]:
    return [inverse(inner) for inner in reversed(compile_operation(op.base, layout))]


def inverse(instruction: Instruction) -> Instruction:
    """The instruction that undoes ``instruction``."""
    kind, data = instruction.kind, instruction.data
    if kind is Kind.MATRIX:
        data = np.conj(np.swapaxes(data, -1, -2))
    elif kind in (Kind.DIAGONAL, Kind.PHASE):
        data = np.conj(data)
    elif kind in (Kind.PAULI_ROTATION, Kind.Z_ROTATIONS, Kind.ROTATIONS):
        data = -data
    elif kind is not Kind.PAULI:
        raise ValueError(f"{kind} has no inverse")
    return dataclasses.replace(instruction, data=data)


def plain_rotation(op: Operator, instructions: list[Instruction]) -> Instruction | None:
    """The instruction of ``op`` when it is one Pauli rotation exp(-i theta/2 P) without
    controls compiled from ``op`` itself (RX, IsingZZ, PauliRot, MultiRZ, ...): its
    generator is -P/2, known without building it."""
    if len(instructions) != 1:
        return None
    (instruction,) = instructions
    if (
        instruction.kind is Kind.PAULI_ROTATION
        and instruction.source is op
        and not instruction.controls
    ):
        return instruction
    return None


@compile_operation.register
def _(op: qml.Projector, layout: Program) -> list[Instruction]:
    """A projector in the circuit (deferred measurements' postselection); the
    simulation renormalises after it."""
    return [
        Instruction(
            Kind.POSTSELECT,
            targets=layout.targets(op.wires),
            data=_batched(qml.matrix(op), 2),
            source=op,
        )
    ]


@compile_operation.register
def _(op: MidMeasure, layout: Program) -> list[Instruction]:
    return [Instruction(Kind.MID_MEASURE, targets=layout.bits(op.wires), source=op)]


@compile_operation.register
def _(op: Conditional, layout: Program) -> list[Instruction]:
    return [
        dataclasses.replace(inner, condition=op.meas_val)
        for inner in compile_operation(op.base, layout)
    ]
