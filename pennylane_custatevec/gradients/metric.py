r"""The Fubini-Study metric tensor of a circuit's trainable gate parameters, on the
device (Jones, arXiv:2011.02991; the adjoint method's generators and steps).

For :math:`|\psi\rangle = U_N \cdots U_1 |\psi_0\rangle` with trainable gates
:math:`U_k = e^{i\theta_k G_k}` (PennyLane's generator convention, the adjoint sweep's),
:math:`a_k = U_k \cdots U_1 |\psi_0\rangle` the state after gate :math:`k` and
:math:`x_k = i G_k a_k`,

.. math::

    |\partial_k\psi\rangle = U_N \cdots U_{k+1}\, x_k, \qquad
    g_{ij} = \mathrm{Re}\langle\partial_i\psi|\partial_j\psi\rangle
        - \mathrm{Re}\,\langle\partial_i\psi|\psi\rangle\langle\psi|\partial_j\psi\rangle .

The gates after both :math:`i` and :math:`j` cancel in an inner product, so a derivative
vector :math:`x_k`, made at gate :math:`k` and carried forward through the gates after
it beside :math:`\psi`, meets :math:`\psi` and any other carried vector at any later
point: the metric is the Gram matrix of :math:`\psi` and the carried vectors,
:math:`\langle\psi|\partial_j\psi\rangle = i\langle G_j\rangle` its first row.

``full_metric`` carries them in batches of state vectors (vector 0 the state, then the
derivative vectors), each gate applied to a whole batch in one backend call. Where the
derivative vectors of all :math:`p` trainable gates fit, the deferred mode takes every
product in the frame of the middle trainable gate m (``_two_sided_pass``): the vectors
of the gates up to m carried forward to m, those after m made on the way back from the
last trainable gate and carried back to m, about :math:`pN/4` vector-gate applications
for :math:`N` gates (the eager mode carries every vector forward, about :math:`pN/2`).
Where the derivative vectors do not fit, they go in blocks of
:math:`B`: pass :math:`b` simulates the circuit from the start, carries block
:math:`b`'s vectors and, for the gates after the block, a second block of :math:`B`
"column" vectors, whose products with the first are taken whenever it is full (then it is
refilled): :math:`\lceil p/B \rceil` passes on at most :math:`2B + 1` vectors.

Two accumulation modes, the device's ``grad_accumulation``:

* ``deferred``: the products are Gram matrices (``Backend.gram``: one matrix product,
  rank-local under MPI), left in the backend's memory; one ``gather`` brings them all
  to the host at the end (one transfer, one sum over ranks);
* ``eager``: at each trainable gate its new vector's products with the state and the
  block's vectors (``braket``) reach the host at once; the column vectors are not kept.

Both pass the same vectors through the same gates and agree to round-off.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .. import measure, simulate
from ..backends.base import Backend
from ..backends.primitives import StateBatch
from ..instructions import apply_instruction, inverse
from ..queuing import generator_of
from .differentiated import DifferentiatedTape


@dataclasses.dataclass(frozen=True)
class MetricPlan:
    """How ``full_metric`` computes a metric: the trainable steps in circuit order, the
    block size, the mode."""

    trainable: tuple[int, ...]
    """The steps with a trainable parameter, in circuit order."""
    block: int
    """B, the derivative vectors carried per pass (all of them: one pass)."""
    deferred: bool

    @property
    def passes(self) -> int:
        return -(-len(self.trainable) // self.block)

    def vectors(self) -> int:
        """The state vectors of one pass's batch: the state, a block and, in the deferred
        mode with several passes, a block of column vectors."""
        return work_vectors(len(self.trainable), self.block, self.deferred)


def work_vectors(trainable: int, block: int, deferred: bool) -> int:
    """The batches of a pass (``MetricPlan.vectors``) for ``trainable`` gates in blocks of
    ``block``: in the deferred mode's one pass (``_two_sided_pass``) the state twice and
    every derivative vector; in its blocked passes the state, a block and a block of
    column vectors; in the eager mode the state and a block."""
    if not deferred:
        return 1 + block
    return 2 + trainable if block >= trainable else 1 + 2 * block


def metric_vectors(backend: Backend, trainable: int, block: int, deferred: bool) -> int:
    """Every state vector a pass holds at once: its batch, the vector a generator is
    applied into, and the backend's temporaries of a Gram product (deferred) or of an
    inner product with a copied ket (eager)."""
    held = work_vectors(trainable, block, deferred)
    if deferred:
        return held + 1 + backend.gram_scratch_vectors(block + 1, block)
    return held + 2 + backend.scratch_vectors(1, block + 1, False)


def plan_metric(
    backend: Backend, circuit: DifferentiatedTape, deferred: bool, block: int | None = None
) -> MetricPlan:
    """The plan of ``circuit``'s metric: one pass where every derivative vector fits in
    free memory, else the largest block that fits; refused (``simulate.RunTooLargeError``,
    before anything is allocated) where not even a block of one fits. ``block`` forces a
    block size (tests)."""
    trainable = tuple(sorted(circuit.columns))
    p = len(trainable)
    if block is not None:
        return MetricPlan(trainable, max(1, min(block, p)), deferred)
    n = circuit.register.num_qubits
    vector = simulate.state_bytes(backend, n, 1)
    if p == 0 or simulate.fits(backend, vector * metric_vectors(backend, p, p, deferred)):
        return MetricPlan(trainable, max(p, 1), deferred)
    smallest = vector * metric_vectors(backend, p, 1, deferred)
    simulate.require_total(
        backend,
        smallest,
        f"the metric tensor of a circuit on {n} qubits ({p:,} trainable gates, in blocks "
        f"of one derivative vector: {metric_vectors(backend, p, 1, deferred)} state vectors)",
        simulate.single_precision(backend, smallest // 2),
    )
    available = backend.available_bytes()
    fitting = 1
    while fitting < p and vector * metric_vectors(backend, p, fitting + 1, deferred) <= available:
        fitting += 1
    return MetricPlan(trainable, fitting, deferred)


@dataclasses.dataclass
class _Products:
    """The products gathered so far: M[i, j] = <d_i psi|d_j psi> and T[j] = <psi|d_j psi>
    by column, and the pending (deferred) Gram matrices with the columns of their rows
    and columns (a row -1: the state)."""

    inner: np.ndarray
    overlaps: np.ndarray
    pending: list = dataclasses.field(default_factory=list)
    places: list = dataclasses.field(default_factory=list)

    def defer(self, reduction, rows: Sequence[int], columns: Sequence[int]) -> None:
        self.pending.append(reduction)
        self.places.append((tuple(rows), tuple(columns)))

    def store(self, values: np.ndarray, rows: Sequence[int], columns: Sequence[int]) -> None:
        """``values[r, c]``, the product of row ``rows[r]`` with column ``columns[c]``,
        in place (and its conjugate at the transposed place)."""
        rows, columns = np.asarray(rows, dtype=np.int64), np.asarray(columns, dtype=np.int64)
        state = rows < 0
        if state.any():
            self.overlaps[columns] = values[np.flatnonzero(state)[0]]
        gates = rows[~state]
        if gates.size:
            self.inner[np.ix_(gates, columns)] = values[~state]
            self.inner[np.ix_(columns, gates)] = np.conj(values[~state]).T

    def settle(self, backend: Backend) -> None:
        """The pending Gram matrices, in one transfer (``gather``), stored."""
        for values, (rows, columns) in zip(backend.gather(self.pending), self.places, strict=True):
            self.store(np.asarray(values), rows, columns)
        self.pending, self.places = [], []

    def metric(self) -> np.ndarray:
        """g = Re M - Re conj(T) T^T."""
        return np.real(self.inner) - np.real(np.outer(np.conj(self.overlaps), self.overlaps))


def full_metric(backend: Backend, circuit: DifferentiatedTape, plan: MetricPlan) -> np.ndarray:
    """The metric tensor of ``circuit``'s trainable gate parameters, float64 (p, p) by
    column (module docstring)."""
    p = circuit.n_columns
    products = _Products(np.zeros((p, p), dtype=np.complex128), np.zeros(p, dtype=np.complex128))
    context = _Context(backend, circuit, plan, products)
    if plan.deferred and plan.passes == 1:
        _two_sided_pass(context)
    else:
        for start in range(0, len(plan.trainable), plan.block):
            (_deferred_pass if plan.deferred else _eager_pass)(context, start)
    products.settle(backend)
    return products.metric()


def _fresh_batch(backend: Backend, circuit: DifferentiatedTape, size: int) -> StateBatch:
    """A batch of ``size`` vectors, vector 0 the register's initial state."""
    register = circuit.register
    batch = backend.zero_state(register.num_qubits, size)
    if register.initial_state is not None:
        first = backend.vectors(batch, 0, 1)
        backend.scale(first, np.zeros(1))
        backend.add_scaled(first, backend.from_host(register.initial_state), np.ones(1))
    return batch


def _apply_step(backend: Backend, circuit: DifferentiatedTape, index: int, state) -> None:
    for instruction in circuit.steps[index].instructions:
        apply_instruction(backend, state, instruction)


def _undo_step(backend: Backend, circuit: DifferentiatedTape, index: int, state) -> None:
    for instruction in reversed(circuit.steps[index].instructions):
        apply_instruction(backend, state, inverse(instruction))


def _two_sided_pass(context: _Context) -> None:
    """The deferred mode's pass where every derivative vector fits: all products in one
    frame, the state after the trainable gate m at the middle of the trainable ones.
    Forward, the derivative vectors of the gates up to m are carried to m (one batch
    with the state); the state, copied, goes on alone to the last trainable gate; then
    backward, the vectors of the gates after m are made as the copy is taken back to m
    (one batch with it), each carried through U_j^dagger ... U_{m+1}^dagger. Products
    are frame-invariant, so the three Gram matrices of the two batches at m are the
    metric's: about half the vector-gate applications of carrying every vector to the
    last trainable gate."""
    backend, circuit, plan, products = context
    before = plan.trainable[: len(plan.trainable) // 2]
    after = plan.trainable[len(before) :]
    frame = before[-1] if before else -1
    forward = _fresh_batch(backend, circuit, 1 + len(before))
    members = set(before)
    held = 0
    for index in range(frame + 1):
        _apply_step(backend, circuit, index, backend.vectors(forward, 0, 1 + held))
        if index in members:
            held += 1
            _derivative_into(backend, circuit, index, forward, held)
    backward = backend.zero_state(circuit.register.num_qubits, 1 + len(after))
    first = backend.vectors(backward, 0, 1)
    backend.scale(first, np.zeros(1))
    backend.add_scaled(first, backend.vectors(forward, 0, 1), np.ones(1))
    for index in range(frame + 1, after[-1] + 1):
        _apply_step(backend, circuit, index, first)
    members = set(after)
    made = 0
    for index in range(after[-1], frame, -1):
        if index in members:
            made += 1
            _derivative_into(backend, circuit, index, backward, made)
        _undo_step(backend, circuit, index, backend.vectors(backward, 0, 1 + made))
    before_columns = [circuit.columns[index] for index in before]
    after_columns = [circuit.columns[index] for index in reversed(after)]
    made_vectors = backend.vectors(backward, 1, 1 + made)
    if before:
        products.defer(
            backend.gram(forward, backend.vectors(forward, 1, 1 + held)),
            [-1, *before_columns],
            before_columns,
        )
    products.defer(backend.gram(forward, made_vectors), [-1, *before_columns], after_columns)
    products.defer(backend.gram(made_vectors, made_vectors), after_columns, after_columns)


def _derivative(backend: Backend, circuit: DifferentiatedTape, index: int, psi) -> StateBatch:
    """A new batch i G psi, G the generator of step ``index``."""
    operation = circuit.steps[index].operation
    moved = measure.applied_observable(backend, psi, circuit.register, generator_of(operation))
    backend.scale(moved, np.full(1, 1j))
    return moved


def _generator_into(
    backend: Backend, circuit: DifferentiatedTape, index: int, target, psi, weight: complex
) -> None:
    """``target`` (one vector) <- weight G psi, G the generator of step ``index``: a
    Pauli sum added in place, any other generator applied to a temporary copy."""
    generator = generator_of(circuit.steps[index].operation)
    backend.scale(target, np.zeros(1))
    sentence = generator.pauli_rep
    if sentence is not None:
        measure.add_pauli_sentence(backend, target, psi, circuit.register, sentence, weight)
        return
    moved = measure.applied_observable(backend, psi, circuit.register, generator)
    backend.add_scaled(target, moved, np.full(1, weight))


def _derivative_into(
    backend: Backend, circuit: DifferentiatedTape, index: int, batch, slot: int
) -> None:
    """Vector ``slot`` of ``batch`` <- i G psi, psi its vector 0."""
    target = backend.vectors(batch, slot, slot + 1)
    _generator_into(backend, circuit, index, target, backend.vectors(batch, 0, 1), 1j)


class _Context(NamedTuple):
    """What every pass of one metric reads and fills."""

    backend: Backend
    circuit: DifferentiatedTape
    plan: MetricPlan
    products: _Products


@dataclasses.dataclass(frozen=True)
class _Pass:
    """One pass: the trainable steps of its block and those after it, and its last step
    (the passes stop there: the gates after it cancel in every product)."""

    block: tuple[int, ...]
    later: frozenset[int]
    last: int

    @classmethod
    def of(cls, plan: MetricPlan, start: int) -> _Pass:
        block = plan.trainable[start : start + plan.block]
        later = plan.trainable[start + plan.block :]
        return cls(block, frozenset(later), later[-1] if later else block[-1])


def _deferred_pass(context: _Context, start: int) -> None:
    """Pass of the block that starts at trainable gate ``start``: its Gram matrices are
    left pending (``products.defer``)."""
    backend, circuit, plan, products = context
    this = _Pass.of(plan, start)
    block, members = this.block, set(this.block)
    held_columns = [circuit.columns[index] for index in block]
    column_room = plan.block if this.later else 0
    batch = _fresh_batch(backend, circuit, 1 + len(block) + column_room)
    held, pending_columns = 0, []
    first_column_slot = 1 + len(block)
    for index in range(this.last + 1):
        used = 1 + held + len(pending_columns)
        _apply_step(backend, circuit, index, backend.vectors(batch, 0, used))
        if index in members:
            held += 1
            _derivative_into(backend, circuit, index, batch, held)
            if held == len(block):  # the state and the block, against the block
                whole = backend.vectors(batch, 0, 1 + held)
                products.defer(
                    backend.gram(whole, backend.vectors(batch, 1, 1 + held)),
                    [-1, *held_columns],
                    held_columns,
                )
        elif index in this.later:
            _derivative_into(
                backend, circuit, index, batch, first_column_slot + len(pending_columns)
            )
            pending_columns.append(circuit.columns[index])
            if len(pending_columns) == column_room or index == this.last:
                stop = first_column_slot + len(pending_columns)
                products.defer(
                    backend.gram(
                        backend.vectors(batch, 1, first_column_slot),
                        backend.vectors(batch, first_column_slot, stop),
                    ),
                    held_columns,
                    pending_columns,
                )
                pending_columns = []


def _eager_pass(context: _Context, start: int) -> None:
    """Pass of the block that starts at trainable gate ``start``, its products taken to
    the host gate by gate."""
    backend, circuit, _, products = context
    this = _Pass.of(context.plan, start)
    members = set(this.block)
    held_columns: list[int] = []
    batch = _fresh_batch(backend, circuit, 1 + len(this.block))
    for index in range(this.last + 1):
        held = len(held_columns)
        _apply_step(backend, circuit, index, backend.vectors(batch, 0, 1 + held))
        column = circuit.columns.get(index)
        if index in members:
            _derivative_into(backend, circuit, index, batch, 1 + held)
            held_columns.append(column)
            bras = backend.vectors(batch, 0, 2 + held)
            kets = backend.copy(backend.vectors(batch, 1 + held, 2 + held))
            values = backend.braket(bras, kets)
            products.store(values[:, None], [-1, *held_columns], [column])
        elif index in this.later:
            kets = _derivative(backend, circuit, index, backend.vectors(batch, 0, 1))
            values = backend.braket(backend.vectors(batch, 1, 1 + held), kets)
            products.store(values[:, None], held_columns, [column])


def block_diagonal_metric(
    backend: Backend,
    circuit: DifferentiatedTape,
    layers: Sequence[Sequence[int]],
    diagonal: bool,
    deferred: bool,
) -> np.ndarray:
    """The block-diagonal (or, with ``diagonal``, diagonal) approximation of the metric
    over the parametrized ``layers`` (each a list of columns): the exact blocks of the
    full metric, which are PennyLane's covariances of the layer's generators on the state
    before it, Re <G_i G_j> - <G_i><G_j>. PennyLane's layers are runs of consecutive
    trainable gates, so one forward pass carries the derivative vectors of one layer at a
    time, from its first gate to its last, where one Gram product of the state and them
    gives the block; then they are dropped. About N + sum over layers of their spans
    vector-gate applications, on 1 + (the widest layer) vectors. Layers that interleave
    (not PennyLane's) take the blocks of ``full_metric``. Deferred: one transfer at the
    end; eager: one per layer."""
    step_of = {column: index for index, column in circuit.columns.items()}
    ordered = sorted(sorted(step_of[c] for c in layer) for layer in layers if len(layer))
    p = circuit.n_columns
    mask = layer_mask(p, layers, diagonal)
    if any(ordered[k][-1] >= ordered[k + 1][0] for k in range(len(ordered) - 1)):
        plan = plan_metric(backend, circuit, deferred)
        return np.where(mask, full_metric(backend, circuit, plan), 0.0)
    register = circuit.register
    widest = max((len(steps) for steps in ordered), default=0)
    vector = simulate.state_bytes(backend, register.num_qubits, 1)
    vectors = 2 + widest + backend.gram_scratch_vectors(widest + 1, widest)
    simulate.require_total(
        backend,
        vector * vectors,
        f"the block-diagonal metric tensor of a circuit on {register.num_qubits} qubits "
        f"({vectors} state vectors: the state, a layer's {widest} derivative vectors, "
        "temporaries)",
        simulate.single_precision(backend, vector * vectors // 2),
    )
    products = _Products(np.zeros((p, p), dtype=np.complex128), np.zeros(p, dtype=np.complex128))
    ends = {steps[-1]: steps for steps in ordered}
    members = {step for steps in ordered for step in steps}
    batch = _fresh_batch(backend, circuit, 1 + widest)
    held = 0
    for index in range(ordered[-1][-1] + 1 if ordered else 0):
        _apply_step(backend, circuit, index, backend.vectors(batch, 0, 1 + held))
        if index not in members:
            continue
        held += 1
        _derivative_into(backend, circuit, index, batch, held)
        steps = ends.get(index)
        if steps is None:
            continue
        columns = [circuit.columns[step] for step in steps]
        products.defer(
            backend.gram(backend.vectors(batch, 0, 1 + held), backend.vectors(batch, 1, 1 + held)),
            [-1, *columns],
            columns,
        )
        held = 0
        if not deferred:
            products.settle(backend)
    products.settle(backend)
    return np.where(mask, products.metric(), 0.0)


def layer_mask(p: int, layers: Sequence[Sequence[int]], diagonal: bool) -> np.ndarray:
    """Where a block-diagonal (or diagonal) metric of ``p`` columns may be nonzero: the
    blocks of the ``layers`` (their diagonals)."""
    in_layer = np.zeros((p, p), dtype=bool)
    for layer in layers:
        in_layer[np.ix_(list(layer), list(layer))] = True
    if diagonal:
        in_layer &= np.eye(p, dtype=bool)
    return in_layer
