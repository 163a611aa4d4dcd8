"""simulate and the instruction kinds' operations against dense matrices on 3 qubits.

Every gate kind is applied to a batch of two random states on the CPU backend and on the
cuStateVec backend over its NumPy double (``gpu_double``), and compared with the dense
matrix of the PennyLane operators it stands for (built here, independently of the
package's matrices). Conventions (program.py): with wires (0, 1, 2), state bit b is wire
2 - b; ``targets[j]`` is bit j of a matrix index; ``paulis[j]`` acts on ``targets[j]``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pennylane as qml
import pytest
from conftest import stable_seed
from pennylane.wires import Wires
from reference import random_state, random_unitary

from pennylane_custatevec import fused_units, simulate
from pennylane_custatevec.backends.cpu import CPUBackend
from pennylane_custatevec.backends.custatevec import CuStateVecBackend
from pennylane_custatevec.instructions import (
    Instruction,
    Kind,
    apply_instruction,
    instruction_matrix,
    inverse,
    masked,
)
from pennylane_custatevec.program import Program, Register

N = 3
WIRES = (0, 1, 2)
BATCH = 2
ATOL = 1e-10


def wire(bit: int) -> int:
    return N - 1 - bit


def dense(op: qml.operation.Operator) -> np.ndarray:
    return qml.matrix(op, wire_order=WIRES)


def pauli_word(paulis: str, targets: tuple[int, ...]) -> qml.operation.Operator:
    letters = {"X": qml.X, "Y": qml.Y, "Z": qml.Z}
    return qml.prod(*(letters[p](wire(t)) for p, t in zip(paulis, targets, strict=True)))


def pauli_rotation(angle: float, paulis: str, targets: tuple[int, ...]):
    wires = [wire(t) for t in targets]
    return qml.PauliRot(angle, paulis, wires=wires)


def case(kind: Kind, rng: np.random.Generator) -> tuple[Instruction, list[np.ndarray]]:
    """An instruction of ``kind`` with per-vector data (B = 2) where the kind has data, and
    the dense 8x8 matrix it applies to each vector."""
    if kind is Kind.MATRIX:
        u = np.stack([random_unitary(4, rng) for _ in range(BATCH)])
        ins = Instruction(kind, targets=(0, 2), controls=(1,), control_values=(1,), data=u)
        # targets (0, 2): bit 2 (wire 0) is the most significant bit of u's index
        refs = [
            qml.ctrl(qml.QubitUnitary(u[b], wires=[wire(2), wire(0)]), control=wire(1))
            for b in range(BATCH)
        ]
        return ins, [dense(r) for r in refs]
    if kind is Kind.DIAGONAL:
        d = np.exp(1j * rng.uniform(-np.pi, np.pi, size=(BATCH, 2)))
        ins = Instruction(kind, targets=(1,), controls=(2,), control_values=(0,), data=d)
        refs = [
            qml.ctrl(qml.DiagonalQubitUnitary(d[b], wires=wire(1)), wire(2), control_values=0)
            for b in range(BATCH)
        ]
        return ins, [dense(r) for r in refs]
    if kind is Kind.PAULI:
        ins = Instruction(kind, targets=(0, 2), controls=(1,), control_values=(0,), paulis="XY")
        ref = qml.ctrl(pauli_word("XY", (0, 2)), wire(1), control_values=0)
        return ins, [dense(ref)] * BATCH
    if kind is Kind.PAULI_ROTATION:
        angles = rng.uniform(-np.pi, np.pi, size=BATCH)
        ins = Instruction(kind, targets=(2, 0), paulis="ZX", data=angles)
        return ins, [dense(pauli_rotation(a, "ZX", (2, 0))) for a in angles]
    if kind is Kind.Z_ROTATIONS:
        masks = (0b011, 0b110, 0b100)
        angles = rng.uniform(-np.pi, np.pi, size=(BATCH, len(masks)))
        ins = Instruction(kind, z_masks=masks, data=angles)
        refs = []
        for b in range(BATCH):
            matrix = np.eye(2**N)
            for j, mask in enumerate(masks):
                bits = tuple(t for t in range(N) if mask >> t & 1)
                matrix = dense(pauli_rotation(angles[b, j], "Z" * len(bits), bits)) @ matrix
            refs.append(matrix)
        return ins, refs
    if kind is Kind.ONE_QUBIT_ROTATIONS:
        # a pair: the CPU backend's rotations_per_pass
        angles = rng.uniform(-np.pi, np.pi, size=(BATCH, 2))
        ins = Instruction(kind, targets=(2, 0), paulis="YX", data=angles)
        refs = []
        for b in range(BATCH):
            matrix = np.eye(2**N)
            for j, (letter, bit) in enumerate(zip("YX", (2, 0), strict=True)):
                matrix = dense(pauli_rotation(angles[b, j], letter, (bit,))) @ matrix
            refs.append(matrix)
        return ins, refs
    if kind is Kind.PHASE:
        factors = np.exp(1j * rng.uniform(-np.pi, np.pi, size=BATCH))
        return Instruction(kind, data=factors), [f * np.eye(2**N) for f in factors]
    raise AssertionError(f"no case for {kind}")


GATE_KINDS = [
    Kind.MATRIX,
    Kind.DIAGONAL,
    Kind.PAULI,
    Kind.PAULI_ROTATION,
    Kind.Z_ROTATIONS,
    Kind.ONE_QUBIT_ROTATIONS,
    Kind.PHASE,
]
"""The kinds that run as gates (all but MID_MEASURE and POSTSELECT)."""


@pytest.fixture(params=["cpu", "gpu_double"])
def backend(request):
    if request.param == "gpu_double":
        request.getfixturevalue("gpu_double")
        return CuStateVecBackend()
    return CPUBackend()


def _states(rng) -> np.ndarray:
    return np.stack([random_state(N, rng) for _ in range(BATCH)])


def _applied(backend, vectors: np.ndarray, instruction: Instruction) -> np.ndarray:
    state = backend.from_host(vectors)
    apply_instruction(backend, state, instruction)
    return backend.to_host(state)


@pytest.mark.parametrize("kind", GATE_KINDS, ids=lambda k: k.name)
def test_apply_matches_the_dense_matrix(backend, kind):
    rng = np.random.default_rng(stable_seed("apply", kind.name))
    instruction, matrices = case(kind, rng)
    vectors = _states(rng)
    result = _applied(backend, vectors, instruction)
    for b in range(BATCH):
        np.testing.assert_allclose(result[b], matrices[b] @ vectors[b], atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", GATE_KINDS, ids=lambda k: k.name)
def test_inverse_undoes_the_instruction(backend, kind):
    rng = np.random.default_rng(stable_seed("inverse", kind.name))
    instruction, matrices = case(kind, rng)
    vectors = _states(rng)
    result = _applied(backend, vectors, inverse(instruction))
    for b in range(BATCH):
        expected = matrices[b].conj().T @ vectors[b]
        np.testing.assert_allclose(result[b], expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", GATE_KINDS, ids=lambda k: k.name)
def test_masked_acts_on_the_selected_vectors_only(backend, kind):
    """Vector 0 selected, vector 1 not: every gate kind has a masked form (Z_ROTATIONS and
    ONE_QUBIT_ROTATIONS had none before the kinds' tables)."""
    rng = np.random.default_rng(stable_seed("masked", kind.name))
    instruction, matrices = case(kind, rng)
    vectors = _states(rng)
    selection = masked(instruction, np.array([True, False]))
    assert selection.condition is None
    result = _applied(backend, vectors, selection)
    np.testing.assert_allclose(result[0], matrices[0] @ vectors[0], atol=ATOL, rtol=0)
    np.testing.assert_allclose(result[1], vectors[1], atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "kind",
    [k for k in GATE_KINDS if k not in (Kind.Z_ROTATIONS, Kind.ONE_QUBIT_ROTATIONS)],
    ids=lambda k: k.name,
)
def test_instruction_matrix_is_the_dense_matrix(kind):
    """The matrix on the instruction's targets then controls, embedded on all three bits."""
    rng = np.random.default_rng(stable_seed("matrix", kind.name))
    instruction, matrices = case(kind, rng)
    matrix, bits = instruction_matrix(instruction)
    full = fused_units.embed(matrix, bits, tuple(range(N)))
    for b in range(BATCH):
        np.testing.assert_allclose(full[b % full.shape[0]], matrices[b], atol=ATOL, rtol=0)


def test_final_state_runs_the_instructions_in_order(backend):
    """final_state from |000> (through the product-state preparation of the leading
    one-qubit gates) equals the product of the dense matrices, per vector."""
    rng = np.random.default_rng(stable_seed("final_state"))
    register = Register(wires=Wires(WIRES), batch_size=BATCH, broadcast=True)
    one_qubit = Instruction(Kind.PAULI_ROTATION, targets=(1,), paulis="Y", data=np.array([0.4]))
    instructions, matrices = [one_qubit], [dense(pauli_rotation(0.4, "Y", (1,)))] * BATCH
    for kind in GATE_KINDS:
        instruction, dense_matrices = case(kind, rng)
        instructions.append(instruction)
        matrices = [d @ m for d, m in zip(dense_matrices, matrices, strict=True)]
    state, kept = simulate.final_state(backend, Program(register, tuple(instructions)))
    assert kept is None
    vectors = backend.to_host(state)
    for b in range(BATCH):
        np.testing.assert_allclose(vectors[b], matrices[b][:, 0], atol=ATOL, rtol=0)


def test_postselection_renormalises_and_returns_the_probability(backend):
    """POSTSELECT is a step of final_state, not a gate: the projector, then the norm."""
    rng = np.random.default_rng(stable_seed("postselect"))
    vectors = _states(rng)
    register = Register(wires=Wires(WIRES), batch_size=BATCH, initial_state=vectors)
    projector = np.diag([0.0, 1.0])[None].astype(np.complex128)  # bit 0 (wire 2) is 1
    program = Program(register, (Instruction(Kind.POSTSELECT, targets=(0,), data=projector),))
    state, kept = simulate.final_state(backend, program)
    kept_amplitudes = vectors * (np.arange(2**N) & 1)
    probabilities = (np.abs(kept_amplitudes) ** 2).sum(axis=1)
    np.testing.assert_allclose(kept, probabilities, atol=ATOL, rtol=0)
    expected = kept_amplitudes / np.sqrt(probabilities)[:, None]
    np.testing.assert_allclose(backend.to_host(state), expected, atol=ATOL, rtol=0)


def test_conditional_instruction_acts_per_shot(backend):
    """final_state_per_shot: an X conditioned on a mid-circuit measurement flips exactly
    the shots whose outcome is 1 (the masked PAULI kind)."""
    register = Register(wires=Wires(WIRES))
    with qml.queuing.AnnotatedQueue():
        measured = qml.measure(0)
    (mid,) = measured.measurements
    program = Program(
        register,
        (
            Instruction(Kind.PAULI_ROTATION, targets=(2,), paulis="Y", data=np.array([1.1])),
            Instruction(Kind.MID_MEASURE, targets=(2,), source=mid),
            dataclasses.replace(
                Instruction(Kind.PAULI, targets=(1,), paulis="X"), condition=measured
            ),
        ),
    )
    shots = 64
    state, outcomes = simulate.final_state_per_shot(
        backend, program, shots, np.random.default_rng(stable_seed("one-shot"))
    )
    (outcome,) = outcomes.values()
    assert 0 < outcome.sum() < shots
    vectors = backend.to_host(state)
    for shot in range(shots):
        expected = np.zeros(2**N)
        expected[(outcome[shot] << 2) | (outcome[shot] << 1)] = 1.0
        np.testing.assert_allclose(np.abs(vectors[shot]), expected, atol=ATOL, rtol=0)
