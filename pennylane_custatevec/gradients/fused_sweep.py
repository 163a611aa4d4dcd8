"""The deferred mode's sweep over fused blocks, one reduction per block (``sweep``): one
step function per kind of fused unit (``_UNIT_STEPS``), sharing a ``SweepContext``; the
steps leave ``PendingReduction``s that reach the host in one ``Backend.gather``. Which
tapes sweep as one batch is ``deferred``'s.

The eager sweep (eager.py) takes one inner product per trainable gate and brings it to
the host at once. Here the circuit is fused (fusion.py) into blocks of at most k qubits,
and the sweep walks back block by block. For a block on the bits S, with phi the state
before it and lambda a bra after it,

    T[a, c] = sum_r conj(lambda[a, r]) phi[c, r]        (a 2**k x 2**k matrix)

(a, c index the bits S, r every other bit) is one reduction, which the backend computes in
the pass that undoes the block on phi and on the bras. Every parameter theta of the block,
in its gate U_j of the block's gates U_1 .. U_L, then contributes

    d/dtheta Re <lambda|psi> = Re sum_ac D[a, c] T[a, c],
    D = dB/dtheta = (U_L ... U_{j+1}) (i G_j U_j) (U_{j-1} ... U_1),

from small matrices on the host (prefix and suffix products of the block, taken for every
block of the sweep together: ``_add_block_terms``). The reductions
stay in the backend's memory until the sweep ends and reach the host in one transfer.
An operation on more bits than k runs as in the eager sweep (its inner products do reach
the host at once)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import numpy as np
import pennylane as qml
from pennylane.operation import Operator

from .. import fused_units, fusion, measure, sequences, settings
from ..backends.base import Backend
from ..backends.gate_sequence import DenseEntry, RotationEntry
from ..backends.primitives import StateBatch
from ..entrywise import EntrywiseUnitary
from ..exact import generator_key
from ..instructions import Instruction, apply_instruction, inverse
from ..pauli import pauli_word_matrix
from ..program import Compilation, Register, Step, plain_rotation
from ..queuing import generator_of


@dataclasses.dataclass(frozen=True)
class SweepContext:
    """What every step of one sweep reads and writes: the B state vectors ``phi`` and
    their ``rows`` (R) bras each (``bras``: vector b's at rows b*R .. b*R + R - 1), walked
    back in place; the merged compilation's ``register`` and ``steps``; ``columns``
    ({step index: column} of the trainable gates, see ``differentiated.DifferentiatedTape``); and
    ``gradients``, float64 (B, R, n_columns), which the steps and the pending reductions
    fill."""

    backend: Backend
    register: Register
    steps: Sequence[Step]
    columns: dict[int, int]
    phi: StateBatch
    bras: StateBatch
    rows: int
    gradients: np.ndarray
    block_terms: list[_BlockTerm] = dataclasses.field(default_factory=list)
    """The blocks' gathered reductions, whose gradients ``_add_block_terms`` adds at the
    sweep's end, all blocks together."""

    def trainable(self, unit: fusion.Unit) -> bool:
        """Whether one of the unit's operations is a trainable gate."""
        return bool(_members(unit) & self.columns.keys())


@dataclasses.dataclass(frozen=True)
class PendingReduction:
    """A unit's reduction, computed by the backend in the pass that undid the unit and
    held in the backend's memory until the sweep's one ``Backend.gather``."""

    unit: fusion.Unit
    """The unit whose step computed the reduction."""
    add_gradients: Callable[[SweepContext, np.ndarray], None]
    """Adds to ``SweepContext.gradients`` what the gathered reduction (B, R, ...) gives the
    unit's trainable gates."""
    reduction: object
    """The backend's reduction, in its memory: an item of what ``Backend.gather`` takes."""


UnitStep = Callable[[SweepContext, fused_units.Fused], PendingReduction | None]
"""The step back through a unit that holds a trainable gate: it undoes the unit on the
vectors and their bras, and either writes the unit's gradients at once or returns the
pending reduction they come from."""


def sweep(
    backend: Backend,
    compilation: Compilation,
    columns: dict[int, int],
    n_columns: int,
    fusion_qubits: int,
    phi: StateBatch,
    bras: StateBatch,
    plan: fused_units.FusedPlan | None = None,
) -> np.ndarray:
    """d/dtheta Re <bra|psi> for every bra and column, float64 (B, R, n_columns).

    ``phi``: the B final states (consumed); ``bras``: R per vector (consumed); ``columns``:
    {step index: column} of the trainable gates (see
    ``differentiated.DifferentiatedTape``); ``plan``: a fused plan made before (the forward
    pass's), walked back where it is the plan of ``compilation`` for the width wanted here
    (``fused_units.FusedPlan.fits``), else the compilation is planned again.

    The units are walked back from the last one to the first trainable one: a unit
    without a trainable gate is undone, any other takes the step of its kind
    (``step_of``); the reductions those steps leave pending reach the host in one
    transfer at the end, and each then adds its gradients."""
    register = compilation.register
    sequence = sequence_sweep_plan(backend, compilation, columns)
    if sequence is not None:  # a small circuit: the whole sweep in one backend call
        return sequences.sweep(backend, phi, bras, sequence, compilation, n_columns)
    batch = register.batch_size
    rows = bras.shape[0] // batch
    context = SweepContext(
        backend=backend,
        register=register,
        steps=compilation.steps,
        columns=columns,
        phi=phi,
        bras=bras,
        rows=rows,
        gradients=np.zeros((batch, rows, n_columns)),
    )
    fusion_qubits = fusion.block_width(register, fusion_qubits, backend.fusion_traits)
    units = fused_units.fused_plan(compilation, fusion_qubits, backend.fusion_traits, plan).units
    trainable = [context.trainable(fused.unit) for fused in units]
    if not any(trainable):
        return context.gradients
    first = trainable.index(True)
    pending = []
    for fused, has_trainable in zip(
        reversed(units[first:]), reversed(trainable[first:]), strict=True
    ):
        if not has_trainable:
            _undo(context, fused)
        elif (reduction := step_of(fused.unit)(context, fused)) is not None:
            pending.append(reduction)
    reduced = backend.gather([reduction.reduction for reduction in pending])
    for reduction, t in zip(pending, reduced, strict=True):
        reduction.add_gradients(context, t)
    _add_block_terms(context)
    return context.gradients


def step_of(unit: fusion.Unit) -> UnitStep:
    """The step of the unit's kind (``_UNIT_STEPS``); a kind without one is an error."""
    step = _UNIT_STEPS.get(type(unit))
    if step is None:
        raise TypeError(
            f"custatevec.qubit internal error: the adjoint sweep has no step for a "
            f"{type(unit).__name__} unit (known: {', '.join(k.__name__ for k in _UNIT_STEPS)})."
        )
    return step


def _undo(context: SweepContext, fused: fused_units.Fused) -> None:
    """A unit without a trainable gate, undone on the vectors and on their bras."""
    for instruction in reversed(fused.instructions):
        undo = inverse(instruction)
        apply_instruction(context.backend, context.phi, undo)
        apply_instruction(context.backend, context.bras, _for_bras(undo, context.rows))


def _z_run_step(context: SweepContext, fused: fused_units.Fused) -> PendingReduction:
    """A run of commuting rotations exp(-i theta_j/2 Z_word_j), undone in one pass that
    also takes t[:, :, j] = <bra|Z_word_j|phi> at the run's end."""
    (instruction,) = fused.instructions
    reduction = context.backend.adjoint_z_rotations_step(
        context.phi, context.bras, instruction.data, instruction.z_masks
    )
    return PendingReduction(
        fused.unit, functools.partial(_add_rotation_gradients, fused.unit), reduction
    )


def _one_qubit_rotations_step(context: SweepContext, fused: fused_units.Fused) -> PendingReduction:
    """One-qubit rotations exp(-i theta_j/2 P_j) on distinct bits, undone in one pass that
    also takes t[:, :, j] = <bra|P_j|phi> at the unit's end."""
    (instruction,) = fused.instructions
    reduction = context.backend.adjoint_one_qubit_rotations_step(
        context.phi, context.bras, instruction.data, instruction.paulis, instruction.targets
    )
    return PendingReduction(
        fused.unit, functools.partial(_add_rotation_gradients, fused.unit), reduction
    )


def _add_rotation_gradients(
    unit: fusion.ZRun | fusion.OneQubitRotations, context: SweepContext, t: np.ndarray
) -> None:
    """Every rotation of the unit commutes with the others, so each one's generator
    G_j = -P_j/2 acts at the unit's end: d/dtheta_j Re <bra|psi> = Re(-i/2 t[:, :, j])."""
    trainable = [
        (j, context.columns[m]) for j, m in enumerate(unit.members) if m in context.columns
    ]
    if not trainable:
        return
    positions, columns = zip(*trainable, strict=True)
    _add_to_columns(context.gradients, list(columns), np.real(-0.5j * t[:, :, list(positions)]))


def _add_to_columns(gradients: np.ndarray, columns: list[int], values: np.ndarray) -> None:
    """gradients[:, :, columns[n]] += values[:, :, n] for every n, a column that repeats
    adding every value it gets (``np.add.at``; a plain indexed add keeps one of them)."""
    if len(set(columns)) == len(columns):
        gradients[:, :, columns] += values
    else:
        np.add.at(np.moveaxis(gradients, 2, 0), columns, np.moveaxis(values, 2, 0))


def _block_step(context: SweepContext, fused: fused_units.Fused) -> PendingReduction | None:
    """A block on the bits S, undone in the pass that takes the dense reduction
    T[a, c] = sum_r conj(lambda[a, r]) phi[c, r] (``_add_block_gradients``); a block of
    one plain Pauli rotation takes the rotation step of an operation wider than the
    blocks instead where that pays (``_pauli_rotation_step_pays``)."""
    unit = fused.unit
    if _pauli_rotation_step_pays(context, fused) or _too_wide_for_a_dense_step(fused):
        (member,) = unit.members
        _operation_step(context, member)
        return None
    block, matrices = fused_units.block_matrices(context.steps, fused)
    reduction = context.backend.adjoint_block_step(context.phi, context.bras, block, unit.targets)
    return PendingReduction(
        unit, functools.partial(_add_block_gradients, unit, matrices), reduction
    )


def _add_block_gradients(
    block: fusion.Block, matrices: list, context: SweepContext, t: np.ndarray
) -> None:
    """Keeps the block's reduction ``t`` (B, R, d, d) with its operations' ``matrices``
    for ``_add_block_terms``, which adds the gradients of every block at the sweep's end."""
    context.block_terms.append(_BlockTerm(block, matrices, t))


BLOCK_TERMS_BYTES = 1 << 24
"""The most bytes of one array of ``_block_derivatives`` (its operations' matrices, and as
many prefix and suffix products): blocks of one shape are taken in chunks that stay under
it (16 MiB: a minibatch of 1024 vectors through blocks of 4 qubits and 8 gates takes 32 MiB
per block, and 50 such blocks at once would take 1.6 GiB per array)."""


@dataclasses.dataclass(frozen=True)
class _BlockTerm:
    """A block of the sweep with its gathered reduction: what its trainable gates'
    gradients come from."""

    block: fusion.Block
    matrices: Sequence[np.ndarray]
    """U_1 .. U_L, its operations' matrices on its bits, (1 or B, d, d) each."""
    t: np.ndarray
    """T (B, R, d, d), the block's reduction."""


def _add_block_terms(context: SweepContext) -> None:
    """d/dtheta Re <lambda|psi> = Re sum_ac D[a, c] T[a, c] for each trainable gate of
    every block the sweep reduced, D = dB/dtheta (``_block_derivatives``). The blocks of
    one width and one number of operations are taken together, a few array operations for
    all of them: one block at a time, its products and contractions cost more host time
    than the block's pass at 14 qubits (a VJP of 4 StronglyEntanglingLayers, 56 blocks:
    2.1 ms of a 4.4 ms sweep)."""
    groups: dict[tuple[int, int], list[_BlockTerm]] = {}
    for term in context.block_terms:
        groups.setdefault((term.t.shape[-1], len(term.matrices)), []).append(term)
    chunks = []
    for (d, length), terms in groups.items():
        rows = max(matrix.shape[0] for term in terms for matrix in term.matrices)
        per_block = length * rows * d * d * np.dtype(np.complex128).itemsize
        size = max(1, BLOCK_TERMS_BYTES // per_block)
        chunks.extend(terms[start : start + size] for start in range(0, len(terms), size))
    for terms in chunks:
        differentiated = _block_derivatives(context, terms)
        if differentiated is None:
            continue
        columns, derivatives, reductions = differentiated
        batch = reductions.shape[0]
        if derivatives.shape[1] == 1:  # the same matrices for every vector
            contributions = np.einsum("nac,brnac->brn", derivatives[:, 0], reductions)
        else:
            contributions = np.einsum("nbac,brnac->brn", derivatives[:, :batch], reductions)
        _add_to_columns(context.gradients, list(columns), np.real(contributions))
    context.block_terms.clear()


def _block_derivatives(
    context: SweepContext, terms: Sequence[_BlockTerm]
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(columns (n,), D (n, 1 or B, d, d), T (B, R, n, d, d)) for the n trainable gates of
    ``terms`` (blocks of one width d and one number L of operations; None: no trainable
    gate): D = (U_L ... U_{j+1}) (i G_j U_j) (U_{j-1} ... U_1) of gate j of its block, from
    the prefix and suffix products of every block at once, and its block's T."""
    selected = [
        (position, k, context.columns[member])
        for k, term in enumerate(terms)
        for position, member in enumerate(term.block.members)
        if member in context.columns
    ]
    if not selected:
        return None
    d, length = terms[0].t.shape[-1], len(terms[0].matrices)
    lead = max(matrix.shape[0] for term in terms for matrix in term.matrices)
    matrices = np.empty((length, len(terms), lead, d, d), dtype=np.complex128)
    for k, term in enumerate(terms):
        for position, matrix in enumerate(term.matrices):
            matrices[position, k] = matrix  # a leading 1 repeated for every vector
    prefixes = np.empty_like(matrices)  # U_{j-1} ... U_1
    prefixes[0] = np.eye(d)
    for position in range(1, length):
        prefixes[position] = np.matmul(matrices[position - 1], prefixes[position - 1])
    suffixes = np.empty_like(matrices)  # U_L ... U_{j+1}
    suffixes[length - 1] = np.eye(d)
    for position in range(length - 2, -1, -1):
        suffixes[position] = np.matmul(suffixes[position + 1], matrices[position + 1])
    positions, blocks, columns = (np.array(values) for values in zip(*selected, strict=True))
    generators = np.stack(
        [
            _generator(
                context.register, context.steps[terms[k].block.members[p]], terms[k].block.targets
            )[0]
            for p, k, _ in selected
        ]
    )  # (n, d, d)
    at = (positions, blocks)
    derivatives = np.matmul(
        suffixes[at],
        np.matmul(1j * generators[:, None], np.matmul(matrices[at], prefixes[at])),
    )
    reductions = np.stack([terms[k].t for k in blocks], axis=2)  # (B, R, n, d, d)
    return columns, derivatives, reductions


def _tiled_run_step(context: SweepContext, fused: fused_units.Fused) -> PendingReduction:
    """A tiled run of one-bit blocks, undone tile by tile in one pass that takes every
    block's 2x2 reduction T_j (block j's bra after it, phi before it: the T of
    ``adjoint_block_step`` for each block in turn)."""
    (instruction,) = fused.instructions
    reduction = context.backend.adjoint_tiled_matrices_step(
        context.phi, context.bras, instruction.data, instruction.targets
    )
    return PendingReduction(
        fused.unit, functools.partial(_add_tiled_run_gradients, fused), reduction
    )


def _add_tiled_run_gradients(
    fused: fused_units.Fused, context: SweepContext, t: np.ndarray
) -> None:
    """Each block j of the run adds its gradients from its reduction t[:, :, j]
    (``_add_block_gradients``, with the matrices of its operations: a block of one
    operation has the run's gate j)."""
    gates = fused.instructions[0].data
    for j, (block, part) in enumerate(zip(fused.unit.blocks, fused.parts, strict=True)):
        if context.trainable(block):
            matrices = part.member_matrices or [gates[:, j]]
            _add_block_gradients(block, matrices, context, t[:, :, j])


def _single_step(context: SweepContext, fused: fused_units.Fused) -> None:
    """An operation wider than the blocks, run as its own instructions: the eager step
    (``_operation_step``); nothing pending."""
    _operation_step(context, fused.unit.member)


def _permutation_run_step(context: SweepContext, fused: fused_units.Fused) -> None:
    """A run of bit flips has no trainable gate (``SweepContext.trainable`` is False for
    it, and the sweep undoes it): reaching this is an internal error."""
    raise TypeError(
        "custatevec.qubit internal error: a BitPermutationRun holds no trainable gate; "
        "the sweep undoes it"
    )


_UNIT_STEPS: dict[type, UnitStep] = {
    fusion.Block: _block_step,
    fusion.Single: _single_step,
    fusion.ZRun: _z_run_step,
    fusion.OneQubitRotations: _one_qubit_rotations_step,
    fusion.BitPermutationRun: _permutation_run_step,
    fusion.TiledRun: _tiled_run_step,
}
"""The step of each kind of ``fusion.Unit`` (complete over the kinds: a test checks)."""


def _pauli_rotation_step_pays(context: SweepContext, fused: fused_units.Fused) -> bool:
    """Whether a block of one Pauli rotation takes the backend's fused rotation step (one
    pass, real arithmetic) rather than a dense reduction: on backends whose traits ask for
    it (the CPU, whose dense 2**k products are compute-bound). For a batch of several
    vectors (which the rotation step takes one by one) only from 3 bits on, where a dense
    product costs several passes (``CPU_FUSION_TRAITS.block_costs``)."""
    wanted = context.backend.fusion_traits.pauli_rotation_step_for_lone_rotations
    if fused.member_matrices or not wanted:
        return False
    if context.register.batch_size > 1 and len(fused.unit.targets) <= 2:
        return False
    step = context.steps[fused.unit.members[0]]
    return plain_rotation(step.operation, step.instructions) is not None


def _too_wide_for_a_dense_step(fused: fused_units.Fused) -> bool:
    """Whether a block of one operation is wider than any fused block
    (``settings.MAX_FUSION_QUBITS``): the planner keeps a wide operation (a MultiRZ on 12
    wires) as a block of its own, and its dense step would reduce over 4**k entries per
    amplitude group and multiply 2**k x 2**k matrices on the host (a 12-bit rotation of a
    broadcast took a minute); its own step takes one pass per instruction."""
    unit = fused.unit
    return (
        not fused.member_matrices
        and len(unit.members) == 1
        and len(unit.targets) > settings.MAX_FUSION_QUBITS
    )


def _members(unit: fusion.Unit) -> set[int]:
    return {unit.member} if isinstance(unit, fusion.Single) else set(unit.members)


def _for_bras(instruction: Instruction, rows: int) -> Instruction:
    """An instruction of the vectors' batch for their bras: per-vector data repeated for
    each vector's R bras."""
    data = instruction.data
    if data is None or data.shape[0] == 1 or rows == 1:
        return instruction
    return instruction.with_data(np.repeat(data, rows, axis=0))


def _operation_step(context: SweepContext, member: int) -> None:
    """The eager step through one operation (step ``member``), vector by vector: its
    gradients Re(i <bra|G|phi>) per bra (B, R) written at once, then the operation undone."""
    backend, register, rows = context.backend, context.register, context.rows
    phi, bras = context.phi, context.bras
    op, instructions = context.steps[member].operation, context.steps[member].instructions
    column = context.columns[member]
    batch = register.batch_size
    rotation = plain_rotation(op, instructions)
    if rotation is not None and batch == 1:
        step_products = backend.adjoint_pauli_rotation_step(
            phi, bras, rotation.data, rotation.paulis, rotation.targets
        )
        context.gradients[:, :, column] = np.real(-0.5j * step_products)[None]
        return
    products = np.empty((batch, rows), dtype=np.complex128)
    for b in range(batch):
        phi_b = backend.vectors(phi, b, b + 1)
        bras_b = backend.vectors(bras, b * rows, (b + 1) * rows)
        if rotation is not None:
            angles = _entry(rotation.data, b)
            step_products = backend.adjoint_pauli_rotation_step(
                phi_b, bras_b, angles, rotation.paulis, rotation.targets
            )
            products[b] = -0.5 * step_products
            continue
        products[b] = measure.transition(backend, bras_b, phi_b, register, generator_of(op))
        for instruction in reversed(instructions):
            undo = inverse(instruction)
            if undo.data is not None:
                undo = undo.with_data(_entry(undo.data, b))
            apply_instruction(backend, phi_b, undo)
            apply_instruction(backend, bras_b, undo)
    context.gradients[:, :, column] = np.real(1j * products)


def _entry(data: np.ndarray, b: int) -> np.ndarray:
    """Vector b's data (a leading axis of 1 serves every vector)."""
    return data if data.shape[0] == 1 else data[b : b + 1]


def _generator(register: Register, step: Step, targets: tuple[int, ...]) -> np.ndarray:
    """G of the operation, exp(i theta G) (PennyLane's convention), on the block's bits."""
    op = step.operation
    rotation = plain_rotation(op, step.instructions)
    if rotation is not None:
        return _pauli_rotation_generator(rotation.paulis, tuple(rotation.targets), targets)
    return fused_units.embed(_generator_matrix(op)[None], register.targets(op.wires), targets)


@functools.lru_cache(maxsize=1024)
def _pauli_rotation_generator(
    paulis: str, bits: tuple[int, ...], targets: tuple[int, ...]
) -> np.ndarray:
    """-P/2 of a Pauli rotation on ``bits``, on the block's bits ``targets``, (1, d, d)
    (cached, read-only: every call of a structure asks for the same ones)."""
    matrix = fused_units.embed(-0.5 * pauli_word_matrix(paulis)[None], bits, targets)
    matrix.flags.writeable = False
    return matrix


def sequence_sweep_plan(
    backend: Backend, compilation: Compilation, columns: dict[int, int]
) -> sequences.SequencePlan | None:
    """The compilation's deferred sweep as one gate sequence (``sequences.sweep_plan``,
    kept in the compilation's memo), or None where it is not one."""
    register = compilation.register
    return sequences.sweep_plan(
        backend, compilation, columns, lambda step: _sequence_generator(register, step)
    )


def _sequence_generator(register: Register, step: Step) -> DenseEntry | RotationEntry | None:
    """A trainable step's generator for a gate sequence (``sequences.sweep_plan``), as
    ``_generator`` has it: -P/2 of a plain rotation, else G on the operation's bits."""
    op = step.operation
    if isinstance(op, EntrywiseUnitary):  # no generator: the eager sweep takes it
        return None
    rotation = plain_rotation(op, step.instructions)
    if rotation is not None:
        return RotationEntry(rotation.paulis, tuple(rotation.targets), (), (), -1)
    targets = register.targets(op.wires)
    if len(targets) > sequences.MAX_DENSE_BITS:
        return None
    return DenseEntry(targets, np.asarray(_generator_matrix(op), dtype=np.complex128))


def _generator_matrix(op: Operator) -> np.ndarray:
    """The generator's matrix on the operation's wires (first wire most significant)."""
    key = generator_key(op, with_wire_labels=False)
    matrix = _GENERATORS.get(key)
    if matrix is None:
        matrix = qml.matrix(generator_of(op), wire_order=op.wires)
        if len(_GENERATORS) < _MAX_GENERATORS:
            _GENERATORS[key] = matrix
    return matrix


_GENERATORS: dict = {}
_MAX_GENERATORS = 1024
"""Generator matrices on the operation's wires, by ``exact.generator_key`` (the gate type,
its number of wires, its hyperparameters exactly, not its parameter): built once
(qml.matrix of a generator costs far more than a small block)."""
