"""One operation -> backend kernel instructions (``compile_operation``), given the
``program.Register`` it acts on; the gates of an operation that compiles by gate
(``gate_instructions``: a native template or a run of rotations).

Dispatch is on operator types, most specific first: controlled operations keep their
controls and compile their base; adjoints compile their base and invert it; Pauli
words, Pauli rotations and diagonal gates get their own kernels; native templates
(templates.py) become their gates; everything else is a dense matrix. Parameters may be
broadcast: batched data has a leading batch axis.
"""

from __future__ import annotations

import dataclasses
from functools import singledispatch

import numpy as np
import pennylane as qml
from pennylane.exceptions import DeviceError
from pennylane.operation import Operator
from pennylane.ops import Conditional, MidMeasure
from pennylane.ops.op_math import Adjoint, Controlled

from .instructions import Instruction, Kind, inverse
from .program import Register
from .queuing import matrix_of
from .rotations import PauliRotations, real_angles, rotation_word, structure
from .templates import angles_by_element, is_native_template, template_gates


def gate_instructions(
    op: Operator, register: Register
) -> list[tuple[Instruction, int | None, int]]:
    """One instruction per gate of ``op`` (``compiles_by_gate``), its ``source`` the gate,
    with the step's parameter position and element (see ``Origin``)."""
    if isinstance(op, PauliRotations):
        gates = structure(op.hyperparameters["gates"])
        try:
            stacked = np.asarray(op.data)
        except ValueError:
            # broadcast angles beside single ones: jax.vmap binds its batch into a run
            # that the preprocessing gathered from unbatched angles; each gate its own
            stacked = None
        if stacked is None or np.iscomplexobj(stacked):  # a complex angle named by its gate
            pairs = zip(op.data, gates, strict=True)
            per_gate = [real_angles(angle, gate.name) for angle, gate in pairs]
        else:
            per_gate = real_angles(stacked, op.name)
        return [
            (_gate_rotation(gate, _batched(per_gate[j], 0), register), j, 0)
            for j, gate in enumerate(gates)
        ]
    angles = angles_by_element(op)
    return [
        (compile_operation(gate, register)[0], None, 0)
        if element is None
        else (_gate_rotation(gate, angles[element], register), 0, element)
        for gate, element in template_gates(op)
    ]


def _gate_rotation(gate: Operator, angles: np.ndarray, register: Register) -> Instruction:
    """The rotation ``gate`` (standing for its structure) with ``angles`` (1 or B,)."""
    return Instruction(
        Kind.PAULI_ROTATION,
        targets=register.targets(gate.wires),
        paulis=rotation_word(gate)[::-1],
        data=angles,
        source=gate,
    )


def _batched(values, trailing_dims: int) -> np.ndarray:
    """Values with a leading batch axis (length 1 when not broadcast)."""
    array = np.asarray(values)
    return array.reshape((-1,) + array.shape[array.ndim - trailing_dims :])


@singledispatch
def compile_operation(op: Operator, register: Register) -> list[Instruction]:
    """Instructions that apply ``op``; the fallback is its dense matrix."""
    if isinstance(op, qml.operation.StatePrepBase):
        raise DeviceError(
            f"{op.name} is supported only as the first operation; it should have been "
            "decomposed by the device's preprocessing."
        )
    return [_matrix_instruction(op, register)]


def _matrix_instruction(op: Operator, register: Register) -> Instruction:
    # op.matrix() skips qml.matrix's wire-order handling, which costs more than the
    # matrix of a small gate; qml.matrix also covers operators defined by a decomposition
    matrix = op.matrix() if op.has_matrix else matrix_of(op, wire_order=op.wires)
    return Instruction(
        Kind.MATRIX, targets=register.targets(op.wires), data=_batched(matrix, 2), source=op
    )


_PAULI_LETTERS = {"PauliX": "X", "PauliY": "Y", "PauliZ": "Z"}


@compile_operation.register
def _(op: qml.PauliX | qml.PauliY | qml.PauliZ, register: Register) -> list[Instruction]:
    return [
        Instruction(
            Kind.PAULI,
            targets=register.targets(op.wires),
            paulis=_PAULI_LETTERS[op.name],
            source=op,
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
    register: Register,
) -> list[Instruction]:
    return [_rotation(op, rotation_word(op), register)]


@compile_operation.register
def _(op: PauliRotations, register: Register) -> list[Instruction]:
    return [instruction for instruction, _, _ in gate_instructions(op, register)]


def _rotation(op: Operator, word: str, register: Register) -> Instruction:
    if "I" not in word:  # the common case, without filtering the letters
        return Instruction(
            Kind.PAULI_ROTATION,
            targets=register.targets(op.wires),
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
        targets=register.targets(wires),
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
def _(op: qml.PhaseShift | qml.S | qml.T | qml.U1, register: Register) -> list[Instruction]:
    return [_diagonal(op, register)]


def _diagonal(op: Operator, register: Register) -> Instruction:
    diagonal = np.diagonal(op.matrix(), axis1=-2, axis2=-1)
    return Instruction(
        Kind.DIAGONAL, targets=register.targets(op.wires), data=_batched(diagonal, 1), source=op
    )


@compile_operation.register
def _(
    op: qml.StronglyEntanglingLayers | qml.BasicEntanglerLayers | qml.AngleEmbedding,
    register: Register,
) -> list[Instruction]:
    if not is_native_template(op):
        return [_matrix_instruction(op, register)]
    return [instruction for instruction, _, _ in gate_instructions(op, register)]


@compile_operation.register
def _(op: qml.Identity, register: Register) -> list[Instruction]:
    return []


@compile_operation.register
def _(op: qml.GlobalPhase, register: Register) -> list[Instruction]:
    factors = np.exp(-1j * _batched(op.data[0], 0))
    return [Instruction(Kind.PHASE, data=factors, source=op)]


@compile_operation.register
def _(op: Controlled, register: Register) -> list[Instruction]:
    controls = register.bits(op.control_wires)
    values = tuple(int(v) for v in op.control_values)
    letter = _PAULI_LETTERS.get(op.base.name)
    if letter is not None:  # CNOT, Toffoli, CZ, CY, ...: skip compiling the base
        return [
            Instruction(
                Kind.PAULI,
                targets=register.targets(op.target_wires),
                controls=controls,
                control_values=values,
                paulis=letter,
                source=op,
            )
        ]
    controlled = []
    for inner in compile_operation(op.base, register):
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
def _(op: Adjoint, register: Register) -> list[Instruction]:
    return [inverse(inner) for inner in reversed(compile_operation(op.base, register))]


@compile_operation.register
def _(op: qml.Projector, register: Register) -> list[Instruction]:
    """A projector in the circuit (deferred measurements' postselection); the
    simulation renormalises after it."""
    return [
        Instruction(
            Kind.POSTSELECT,
            targets=register.targets(op.wires),
            data=_batched(qml.matrix(op), 2),
            source=op,
        )
    ]


@compile_operation.register
def _(op: MidMeasure, register: Register) -> list[Instruction]:
    if type(op) is not MidMeasure:  # qml.ftqc's measurements in other bases, for one
        raise DeviceError(
            f"{op} measures in a basis this simulation does not apply directly; run the "
            "tape through the device's preprocessing (dev.preprocess_transforms()), whose "
            "measure_in_computational_bases makes it a Z-basis measurement."
        )
    return [Instruction(Kind.MID_MEASURE, targets=register.bits(op.wires), source=op)]


@compile_operation.register
def _(op: Conditional, register: Register) -> list[Instruction]:
    if isinstance(op.base, MidMeasure):
        raise DeviceError(
            f"A conditional mid-circuit measurement ({op.base}) needs the device's "
            "preprocessing (dev.preprocess_transforms()), whose "
            "measure_in_computational_bases makes qml.ftqc.cond_measure's pair one "
            "measurement."
        )
    return [
        dataclasses.replace(inner, condition=op.meas_val)
        for inner in compile_operation(op.base, register)
    ]
