"""Small circuits as one backend call (``sequences.py``): the forward pass and the deferred
sweep of a gate sequence give what the gate-by-gate path gives, for every gate of
capabilities.toml in its plain, controlled and adjoint forms, for broadcasts, single
precision and state preparations; the device takes the sequence path where it may and
nowhere else."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import torch
from gate_cases import (
    GATES,
    NON_UNITARY,
    SAME_HYPERPARAMETERS_EXPECTED_DIFFERENT,
    gate_forms,
    gate_pair,
    tape_around,
)

import pennylane_custatevec
from pennylane_custatevec import sequences, simulate
from pennylane_custatevec.backends.cpu import CPUBackend
from pennylane_custatevec.backends.gate_sequence import (
    DenseEntry,
    DerivativeEntry,
    GateSequence,
    RotationEntry,
)
from pennylane_custatevec.gradients import fused_sweep
from pennylane_custatevec.gradients.differentiated import DifferentiatedTape
from pennylane_custatevec.instructions import Instruction, Kind, apply_instruction
from pennylane_custatevec.program import flatten
from pennylane_custatevec.structures import Structure, StructureKey

ATOL = 1e-12


def _gate_by_gate(dtype=np.complex128) -> CPUBackend:
    backend = CPUBackend(dtype)
    backend.sequence_amplitudes = 0  # the per-gate path, as a reference
    return backend


def _random_state(rng, n: int, batch: int) -> np.ndarray:
    state = rng.normal(size=(batch, 1 << n)) + 1j * rng.normal(size=(batch, 1 << n))
    return state / np.linalg.norm(state, axis=1, keepdims=True)


# --- the kernels against the backend's own gate calls ---------------------------------


def _random_unitary(rng, d: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(d, d)) + 1j * rng.normal(size=(d, d)))
    return q * (np.diag(r) / np.abs(np.diag(r)))


def _random_instructions(rng, n: int, batch: int) -> list[Instruction]:
    """Dense gates on 0 to 3 bits (one controlled), Pauli rotations of every letter with and
    without controls, angles per vector."""
    out = []
    for _ in range(12):
        bits = [int(b) for b in rng.permutation(n)]
        kind = rng.integers(3)
        if kind == 0:
            k = int(rng.integers(0, 4))
            out.append(
                Instruction(
                    Kind.MATRIX, targets=tuple(bits[:k]), data=_random_unitary(rng, 1 << k)[None]
                )
            )
        elif kind == 1:
            out.append(
                Instruction(
                    Kind.MATRIX,
                    targets=(bits[0],),
                    controls=(bits[1], bits[2]),
                    control_values=(1, 0),
                    data=_random_unitary(rng, 2)[None],
                )
            )
        else:
            k = int(rng.integers(1, 4))
            paulis = "".join(rng.choice(list("IXYZ"), size=k))
            controls = (bits[k],) if rng.integers(2) else ()
            out.append(
                Instruction(
                    Kind.PAULI_ROTATION,
                    targets=tuple(bits[:k]),
                    controls=controls,
                    control_values=(0,) * len(controls),
                    paulis=paulis,
                    data=rng.uniform(-3, 3, size=batch),
                )
            )
    return out


def _entries(instructions: list[Instruction]) -> tuple[list, np.ndarray]:
    entries, angles = [], []
    for ins in instructions:
        if ins.kind is Kind.PAULI_ROTATION:
            entries.append(
                RotationEntry(
                    ins.paulis, ins.targets, ins.controls, ins.control_values, len(angles)
                )
            )
            angles.append(ins.data)
        else:
            matrix = ins.data[0]
            if ins.controls:  # as instruction_matrix gives it: controls above the targets
                matrix = np.eye(8, dtype=complex)
                matrix[2:4, 2:4] = ins.data[0]  # control values (1, 0): index bits 1, 2
            entries.append(DenseEntry((*ins.targets, *ins.controls), matrix))
    return entries, np.stack(angles, axis=1)


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
def test_run_sequence_applies_the_gates_the_backend_applies_one_by_one(dtype):
    rng = np.random.default_rng(11)
    n, batch = 5, 3
    instructions = _random_instructions(rng, n, batch)
    entries, angles = _entries(instructions)
    backend = CPUBackend(dtype)
    start = _random_state(rng, n, batch)
    expected = backend.from_host(start)
    for ins in instructions:
        apply_instruction(backend, expected, ins)
    got = backend.from_host(start)
    prepared = backend.prepare_sequence(GateSequence(n, tuple(entries), angles.shape[1], 0))
    backend.run_sequence(got, prepared, angles, [])
    tolerance = ATOL if dtype == np.complex128 else 1e-5
    np.testing.assert_allclose(got, expected, atol=tolerance, rtol=0)


def test_a_sequence_takes_the_calls_matrices_at_their_slots():
    rng = np.random.default_rng(5)
    backend = CPUBackend()
    u, v = _random_unitary(rng, 2), _random_unitary(rng, 4)
    sequence = GateSequence(
        3, (DenseEntry((1,), None, 1), DenseEntry((0, 2), None, 0)), n_slots=0, n_matrices=2
    )
    prepared = backend.prepare_sequence(sequence)
    start = _random_state(rng, 3, 1)
    got = backend.from_host(start)
    backend.run_sequence(got, prepared, np.zeros((1, 0)), [v, u])
    expected = backend.from_host(start)
    backend.apply_matrix(expected, u[None], (1,))
    backend.apply_matrix(expected, v[None], (0, 2))
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0)


def test_a_dense_gate_wider_than_the_kernels_scratch_is_refused():
    backend = CPUBackend()
    wide = DenseEntry(tuple(range(7)), np.eye(128, dtype=complex))
    with pytest.raises(ValueError, match="at most 6 bits"):
        backend.prepare_sequence(GateSequence(7, (wide,), 0, 0))


# --- runs of one-bit gates: one pass forward, one reduction in the sweep -------------------

_PAULI = {
    "I": np.eye(2),
    "X": np.array([[0, 1], [1, 0]]),
    "Y": np.array([[0, -1j], [1j, 0]]),
    "Z": np.diag([1, -1]),
}


def _apply_on_bits(matrix: np.ndarray, bits: tuple, vec: np.ndarray, n: int) -> np.ndarray:
    """``matrix`` applied to the state bits ``bits`` of ``vec`` (bit j of the matrix index
    on state bit bits[j]; little-endian state indices), by a tensor contraction."""
    k = len(bits)
    tensor = vec.reshape((2,) * n)  # axis i: state bit n - 1 - i
    m = matrix.reshape((2,) * (2 * k))  # axes: out bits k-1 .. 0, in bits k-1 .. 0
    out = np.tensordot(
        m, tensor, axes=([2 * k - 1 - j for j in range(k)], [n - 1 - b for b in bits])
    )
    out = np.moveaxis(out, [k - 1 - j for j in range(k)], [n - 1 - b for b in bits])
    return out.reshape(-1)


def _holds(entry: RotationEntry, n: int) -> np.ndarray:
    index = np.arange(1 << n)
    holds = np.ones(1 << n, dtype=bool)
    for c, v in zip(entry.controls, entry.control_values, strict=True):
        holds &= ((index >> c) & 1) == v
    return holds


def _apply_word(entry: RotationEntry, vec: np.ndarray, n: int) -> np.ndarray:
    """P vec where the rotation's controls hold, 0 elsewhere."""
    word = np.eye(1)
    for letter in reversed(entry.paulis):  # targets[0] is the matrix index's lowest bit
        word = np.kron(word, _PAULI[letter])
    return _apply_on_bits(word, entry.targets, vec, n) * _holds(entry, n)


def _apply_entry(entry, angles: np.ndarray, vec: np.ndarray, n: int, inverse=False):
    if isinstance(entry, DenseEntry):
        matrix = entry.matrix.conj().T if inverse else entry.matrix
        return _apply_on_bits(matrix, entry.bits, vec, n)
    angle = -angles[entry.slot] if inverse else angles[entry.slot]
    rotated = np.cos(angle / 2) * vec - 1j * np.sin(angle / 2) * _apply_word(entry, vec, n)
    return np.where(_holds(entry, n), rotated, vec)


def _reference_sweep(entries, angles, n, phi, bras, n_columns) -> np.ndarray:
    """The sequence's sweep entry by entry, by tensor contractions (GateSequence's
    meaning)."""
    first = next(i for i, e in enumerate(entries) if isinstance(e, DerivativeEntry))
    out = np.zeros((len(bras), n_columns))
    bras = list(bras)
    for i in range(len(entries) - 1, first - 1, -1):
        entry = entries[i]
        if isinstance(entry, DerivativeEntry):
            g = entry.generator
            if isinstance(g, DenseEntry):
                g_phi = _apply_on_bits(g.matrix, g.bits, phi, n)
            else:
                g_phi = -0.5 * _apply_word(g, phi, n)
            for r, bra in enumerate(bras):
                out[r, entry.column] += np.real(1j * np.vdot(bra, g_phi))
        elif i > first:
            phi = _apply_entry(entry, angles, phi, n, inverse=True)
            bras = [_apply_entry(entry, angles, bra, n, inverse=True) for bra in bras]
    return out


def _one_bit_runs(rng, n: int) -> tuple[list, int, int]:
    """Entries with many runs of one-bit gates on one bit (rotations of every letter,
    dense 2x2 gates, each trainable one followed by its derivative), broken by two-bit
    gates and by controlled rotations."""
    entries, slot, column = [], 0, 0
    for _ in range(10):
        bit = int(rng.integers(n))
        for _ in range(int(rng.integers(1, 5))):
            if rng.integers(3):
                gate = RotationEntry(str(rng.choice(list("XYZ"))), (bit,), (), (), slot)
                slot += 1
                generator = gate
            else:
                gate = DenseEntry((bit,), _random_unitary(rng, 2))
                generator = DenseEntry((bit,), np.array([[0.3, 0.2 - 0.1j], [0.2 + 0.1j, -0.7]]))
            entries.append(gate)
            if rng.integers(4):
                entries.append(DerivativeEntry(column, generator))
                column += 1
        other = int((bit + 1 + rng.integers(n - 1)) % n)
        if rng.integers(2):
            entries.append(DenseEntry((bit, other), _random_unitary(rng, 4)))
        else:
            gate = RotationEntry("Y", (bit,), (other,), (1,), slot)
            entries.append(gate)
            entries.append(DerivativeEntry(column, gate))
            slot, column = slot + 1, column + 1
    return entries, slot, column


@pytest.mark.parametrize("batch", [1, 3, 40])  # 40 x 2**9: the threaded compilation
@pytest.mark.parametrize("seed", range(4))
def test_runs_of_one_bit_gates_run_and_sweep_as_entry_by_entry(seed, batch):
    rng = np.random.default_rng(seed)
    n, rows = (9, 2) if batch == 40 else (4, 3)
    entries, n_slots, n_columns = _one_bit_runs(rng, n)
    angles = rng.uniform(-3, 3, size=(batch, n_slots))
    backend = CPUBackend()
    prepared = backend.prepare_sequence(GateSequence(n, tuple(entries), n_slots, 0))
    start = _random_state(rng, n, batch)
    state = backend.from_host(start)
    backend.run_sequence(state, prepared, angles, [])
    gates = [e for e in entries if not isinstance(e, DerivativeEntry)]
    bras = _random_state(rng, n, batch * rows)
    swept = backend.sweep_sequence(state.copy(), bras.copy(), prepared, angles, [], n_columns)
    for b in range(batch):
        expected = start[b]
        for gate in gates:
            expected = _apply_entry(gate, angles[b], expected, n)
        np.testing.assert_allclose(state[b], expected, atol=ATOL, rtol=0)
        reference = _reference_sweep(
            entries, angles[b], n, state[b], bras[b * rows : (b + 1) * rows], n_columns
        )
        np.testing.assert_allclose(swept[b], reference, atol=1e-11, rtol=0)


# --- every gate: the sequence path equals the gate-by-gate path ------------------------


def _compiled(name: str, form: str):
    first, second = gate_pair(name, form, seed=sum(map(ord, name + form)))
    template, tape = tape_around(first), tape_around(second)
    key = StructureKey.of(template)
    if key != StructureKey.of(tape):
        assert name in SAME_HYPERPARAMETERS_EXPECTED_DIFFERENT
        tape = template
    structure = Structure(key, template, None)
    return tape, structure.compile(structure.parameters_of(tape), tape)


def _sweep(backend, tape, compilation, state, bras):
    circuit = DifferentiatedTape(tape, None, compilation)
    return fused_sweep.sweep(
        backend, compilation, circuit.columns, circuit.n_columns, 1, state, bras, plan=None
    )


@pytest.mark.parametrize(
    ("name", "form"), [(name, form) for name in sorted(GATES) for form in gate_forms(name)]
)
def test_every_gate_runs_and_sweeps_as_a_sequence_as_gate_by_gate(name, form):
    tape, compilation = _compiled(name, form)
    backend, reference = CPUBackend(), _gate_by_gate()
    plan = sequences.forward_plan(backend, compilation)
    expected, _ = simulate.final_state(reference, flatten(compilation))
    instructions = [i for step in compilation.steps for i in step.instructions]
    runs_gate_by_gate = any(
        i.kind in (Kind.POSTSELECT, Kind.MID_MEASURE)
        or (i.kind is not Kind.PAULI_ROTATION and len(i.targets) + len(i.controls) > 6)
        for i in instructions
    )
    assert (plan is None) == runs_gate_by_gate, name
    if plan is None:
        return
    state = simulate.initial_state(backend, compilation.register, 1)
    sequences.run(backend, state, plan, compilation)
    np.testing.assert_allclose(state, expected, atol=ATOL, rtol=0)
    if name in NON_UNITARY or not tape.trainable_params:
        return
    try:
        DifferentiatedTape(tape, None, compilation)
        swept_reference = _sweep(
            reference,
            tape,
            compilation,
            expected.copy(),
            _random_state(np.random.default_rng(2), 7, 2),
        )
    except (ValueError, TypeError, qml.operation.GeneratorUndefinedError):
        return  # not differentiable by the adjoint method (the device refuses it earlier)
    bras = _random_state(np.random.default_rng(2), 7, 2)
    swept = _sweep(backend, tape, compilation, expected.copy(), bras)
    np.testing.assert_allclose(swept, swept_reference, atol=1e-11, rtol=0)


def test_most_gates_take_the_sequence_path():
    """Not a vacuous comparison above: the gates that run gate by gate are few."""
    gate_by_gate = [
        (name, form)
        for name in GATES
        for form in gate_forms(name)
        if sequences.forward_plan(CPUBackend(), _compiled(name, form)[1]) is None
    ]
    assert len(gate_by_gate) < 10, gate_by_gate


# --- the device: the sequence path where it may, the same numbers ------------------------


def _broadcast_circuit(x, w):
    qml.AngleEmbedding(x, wires=range(4))
    qml.StronglyEntanglingLayers(w, wires=range(4))
    qml.PhaseShift(w[0, 0, 0], wires=1)
    qml.ctrl(qml.RY(w[1, 2, 1], wires=3), control=0, control_values=0)
    return qml.expval(qml.Z(0) @ qml.Y(3)), qml.probs(wires=[1, 2])


@pytest.fixture
def sequence_calls(mocker):
    return mocker.spy(pennylane_custatevec.sequences, "run"), mocker.spy(
        pennylane_custatevec.sequences, "sweep"
    )


def _train_steps(c_dtype, sequences_on: bool, monkeypatch, device_vjp: bool, batch: int):
    if not sequences_on:
        monkeypatch.setattr(CPUBackend, "sequence_amplitudes", 0)
    dev = qml.device("custatevec.qubit", wires=4, backend="cpu", c_dtype=c_dtype)
    qnode = qml.QNode(
        _broadcast_circuit, dev, interface="torch", diff_method="adjoint", device_vjp=device_vjp
    )
    rng = np.random.default_rng(3)
    out = []
    for _ in range(3):
        x = torch.tensor(rng.uniform(0, 3, (batch, 4)))
        w = torch.tensor(rng.uniform(0, 3, (2, 4, 3)), requires_grad=True)
        expval, probs = qnode(x, w)
        (expval.sum() + (probs * torch.arange(4.0)).sum()).backward()
        out.append((expval.detach().numpy(), probs.detach().numpy(), w.grad.numpy()))
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("batch", [5, 128])  # 128 x 16 amplitudes: the largest sequence
@pytest.mark.parametrize("device_vjp", [True, False])
@pytest.mark.parametrize("c_dtype", [np.complex128, np.complex64])
def test_the_device_runs_a_known_structure_as_a_sequence_with_the_same_numbers(
    c_dtype, device_vjp, batch, monkeypatch, sequence_calls
):
    reference = _train_steps(c_dtype, False, monkeypatch, device_vjp, batch)
    assert sequence_calls[0].call_count == 0 and sequence_calls[1].call_count == 0
    got = _train_steps(c_dtype, True, monkeypatch, device_vjp, batch)
    # the first call compiles the tape on its own; the structure serves the next two
    assert sequence_calls[0].call_count == 2 and sequence_calls[1].call_count == 2
    # single precision: round-off of gradients summed over the batch (|g| ~ 20 at 128)
    tolerance = 1e-11 if c_dtype == np.complex128 else 1e-4
    for mine, theirs in zip(got, reference, strict=True):
        for a, b in zip(mine, theirs, strict=True):
            np.testing.assert_allclose(a, b, atol=tolerance, rtol=0)


def test_large_registers_run_gate_by_gate(mocker):
    spies = [mocker.spy(CPUBackend, name) for name in ("run_sequence", "run_sequence_measured")]

    def sequence_runs() -> int:  # in run_tapes, or directly (direct.py: measured too)
        return sum(spy.call_count for spy in spies)

    def broadcast_on(n: int):
        dev = qml.device("custatevec.qubit", wires=n, backend="cpu")

        @qml.qnode(dev, diff_method="adjoint")
        def broadcast(x):
            qml.AngleEmbedding(x, wires=range(n))
            return qml.expval(qml.Z(0))

        return broadcast

    limit = CPUBackend.sequence_amplitudes.bit_length() - 1  # the widest register served
    x = np.random.default_rng(0).uniform(0, 3, (3, limit + 1))
    wide = broadcast_on(limit + 1)
    for _ in range(2):
        np.testing.assert_allclose(wide(x), np.cos(x[:, 0]), atol=ATOL, rtol=0)
    assert sequence_runs() == 0
    narrower, many = broadcast_on(limit), np.tile(x[:, :limit], (40, 1))  # any batch size
    for _ in range(2):
        np.testing.assert_allclose(narrower(many), np.cos(many[:, 0]), atol=ATOL, rtol=0)
    assert sequence_runs() == 1


@pytest.mark.parametrize("measure", ["hamiltonian", "state"])
def test_repeated_calls_give_the_same_bits_from_a_structures_second_run_on(measure):
    """The first run of a structure goes gate by gate, the later ones as one sequence (a
    run of one-bit gates multiplied first): the two agree to round-off, and every run
    after the first gives the same bits (PennyLane's test_vqe compares two calls with ==;
    its test_multiple_expvals_same_wires, routed, sees the first call's last bits)."""
    dev = qml.device("custatevec.qubit", wires=4, backend="cpu")
    weights = np.random.default_rng(1967).uniform(0, 2 * np.pi, (2, 4, 3))
    hamiltonian = qml.Hamiltonian([1.0, 1.0, 1.0], [qml.Z(0), qml.Y(0), qml.Z(1)])

    @qml.qnode(dev, diff_method="adjoint")
    def circuit(w):
        qml.StronglyEntanglingLayers(w, wires=range(4))
        return qml.expval(hamiltonian) if measure == "hamiltonian" else qml.state()

    runs = []
    for _ in range(4):
        w = torch.tensor(weights, requires_grad=True)
        value = circuit(w)
        if measure == "hamiltonian":
            value.backward()
            runs.append((value.detach().numpy(), w.grad.numpy()))
        else:
            runs.append((value.detach().numpy(),))
    for later in runs[2:]:
        for got, expected in zip(later, runs[1], strict=True):
            assert got.tobytes() == expected.tobytes()
    for got, expected in zip(runs[0], runs[1], strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-14, rtol=0)
