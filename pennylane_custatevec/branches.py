"""Mid-circuit measurements by tree traversal: the analytic results of a circuit with
native mid-circuit measurements (``mcm_method="tree-traversal"`` without shots), exact.

A mid-circuit measurement on a batch of B branch vectors makes up to 2B branches: each
vector projected onto each outcome and renormalised, its weight (the probability of its
outcomes so far) multiplied by the outcome's probability. A branch of probability 0 is
dropped (as PennyLane's tree traversal does, ``PROBS_TOL = 0``); a postselecting
measurement keeps its outcome's branches only; a reset flips the outcome-1 branches back;
a conditional operation acts on the branches where its condition holds (``masked``). At
the end, with weights :math:`w_b` and :math:`W = \\sum_b w_b` (1, or the probability of
the postselected outcomes), the results are the weighted means over the branches:

.. math::

    \\langle O \\rangle = \\frac{1}{W}\\sum_b w_b \\langle O \\rangle_b, \\qquad
    \\mathrm{Var}(O) = \\frac{1}{W}\\sum_b w_b \\left(\\mathrm{Var}_b(O) +
    \\langle O \\rangle_b^2\\right) - \\langle O \\rangle^2,

probabilities and density matrices likewise linear; a measured mid-circuit value is a
constant in each branch. ``W = 0`` (an impossible postselection) gives NaN, as
default.qubit. Results that are not means over the branches (``state()``, entropies,
purity, classical shadows) are refused.

Memory: the branches of one measurement are taken as one batch while the doubled batch
fits ``batching.BATCH_BYTES`` and free memory; past that, each outcome's branches are
followed to the end one after the other (depth first), one extra vector per level. So a
circuit of ``k`` measurements holds at most about ``k + 1`` vectors where the batch does
not fit, against the deferred method's ``2**k``-fold state.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np
from pennylane.exceptions import DeviceError
from pennylane.measurements import (
    DensityMatrixMP,
    ExpectationMP,
    MeasurementProcess,
    ProbabilityMP,
    VarianceMP,
)
from pennylane.queuing import QueuingManager

from . import batching, measure, simulate
from .backends.base import Backend
from .backends.primitives import StateBatch
from .instructions import Kind, apply_instruction, masked
from .program import Program, Register

_LINEAR = (ExpectationMP, ProbabilityMP, DensityMatrixMP)
"""Measurements whose result is linear in the state's density matrix: the mean over the
branches."""


@dataclasses.dataclass
class Branches:
    """A batch of branch vectors and what each one followed."""

    state: StateBatch
    """One vector per branch, normalised."""
    weights: np.ndarray
    """(B,) the probability of each branch's outcomes."""
    outcomes: dict
    """{MidMeasure: int array (B,)}: each branch's outcome of every measurement so far."""

    @property
    def size(self) -> int:
        return int(self.weights.shape[0])


def require_branchable(measurements: Sequence[MeasurementProcess]) -> None:
    """Refuse, before simulating, a measurement that is not a mean over branches."""
    for mp in measurements:
        if mp.mv is not None:
            if not isinstance(mp, (ExpectationMP, VarianceMP, ProbabilityMP)):
                raise DeviceError(
                    f"{type(mp).__name__} of a mid-circuit measurement needs shots; with "
                    "mcm_method='tree-traversal' and no shots the device returns expval, var "
                    "and probs of mid-circuit measurements."
                )
            continue
        if not isinstance(mp, (*_LINEAR, VarianceMP)) or (
            isinstance(mp, VarianceMP) and mp.obs is None
        ):
            raise DeviceError(
                f"{mp} is not a mean over the branches of mid-circuit measurements, which "
                "mcm_method='tree-traversal' returns (expval, var, probs, density_matrix); "
                "use mcm_method='deferred', which measures the whole state."
            )


def measure_tree(
    backend: Backend, program: Program, measurements: Sequence[MeasurementProcess]
) -> list:
    """The analytic results of ``measurements`` (one per measurement, not batched) of a
    program with mid-circuit measurements, every branch followed."""
    register = program.register
    if register.batch_size != 1:
        raise DeviceError(
            "mcm_method='tree-traversal' follows the branches of one state: expand the "
            "broadcast first (the device's preprocessing does)."
        )
    require_branchable(measurements)
    totals = _Totals(measurements)
    state = simulate.initial_state(backend, register, 1)
    _follow(backend, program, 0, Branches(state, np.ones(1), {}), totals)
    return totals.results()


def _follow(
    backend: Backend, program: Program, start: int, branches: Branches, totals: _Totals
) -> None:
    """Run ``program.instructions[start:]`` on ``branches``, adding their results to
    ``totals`` (depth first where the doubled batch does not fit)."""
    instructions = program.instructions
    register = program.register
    for index in range(start, len(instructions)):
        instruction = instructions[index]
        if instruction.kind is Kind.MID_MEASURE:
            outcome_rows, together = _outcome_rows(backend, register, branches, instruction)
            if not together:  # depth first: each outcome's branches to the end in turn
                for position, pair in enumerate(outcome_rows):
                    last = position == len(outcome_rows) - 1
                    child = _child(backend, register, branches, instruction, [pair], last)
                    _follow(backend, program, index + 1, child, totals)
                return
            branches = _child(backend, register, branches, instruction, outcome_rows, True)
        elif instruction.kind is Kind.POSTSELECT:
            branches = _projected(backend, branches, instruction)
        else:
            if instruction.condition is not None:
                selected = np.asarray(instruction.condition.concretize(branches.outcomes))
                instruction = masked(instruction, selected.astype(bool).reshape(-1))
            apply_instruction(backend, branches.state, instruction)
        if branches.size == 0:
            return
    totals.add(backend, register, branches)


def _outcome_rows(
    backend: Backend, register: Register, branches: Branches, instruction
) -> tuple[list, bool]:
    """([(outcome, probabilities (B,), rows)]: the branches that have each outcome with a
    nonzero probability, the postselected outcome only where the measurement postselects;
    whether they all fit in one batch)."""
    op = instruction.source
    probabilities = backend.probabilities(branches.state, instruction.targets)
    norms = probabilities.sum(axis=1)
    simulate.require_normalised(backend, norms, register)
    probabilities = probabilities / norms[:, None]
    outcomes = (0, 1) if op.postselect is None else (int(op.postselect),)
    pairs = [(o, probabilities[:, o], np.flatnonzero(probabilities[:, o] > 0.0)) for o in outcomes]
    pairs = [pair for pair in pairs if pair[2].size]
    count = sum(rows.size for _, _, rows in pairs)
    needed = simulate.state_bytes(backend, register.num_qubits, count)
    together = len(pairs) < 2 or (needed <= batching.BATCH_BYTES and simulate.fits(backend, needed))
    return pairs, together


def _child(
    backend: Backend,
    register: Register,
    branches: Branches,
    instruction,
    pairs: list,
    may_reuse: bool,
) -> Branches:
    """The branches of ``pairs`` (``_outcome_rows``), projected onto their outcomes and
    renormalised; in the vectors of ``branches`` where they are all of them, in order, and
    ``may_reuse``, else in new ones (refused before allocating where they do not fit)."""
    if not pairs:
        return Branches(branches.state, np.zeros(0), {})
    rows = np.concatenate([r for _, _, r in pairs])
    outcome = np.concatenate([np.full(r.size, o, dtype=np.int64) for o, _, r in pairs])
    chosen = np.concatenate([p[r] for _, p, r in pairs])
    if may_reuse and len(pairs) == 1 and rows.size == branches.size:
        child = Branches(branches.state, branches.weights * chosen, dict(branches.outcomes))
    else:
        simulate.require_memory(backend, register.num_qubits, rows.size)
        child = _rows_of(backend, branches, rows, chosen)
    simulate.project_onto_outcomes(backend, child.state, instruction, outcome, chosen)
    child.outcomes[instruction.source] = outcome
    return child


def _rows_of(backend: Backend, branches: Branches, rows: np.ndarray, factors) -> Branches:
    """New branches from the vectors ``rows`` of ``branches`` (copied), their weights
    multiplied by ``factors`` (one per row)."""
    state = backend.concatenate([backend.vectors(branches.state, int(r), int(r) + 1) for r in rows])
    outcomes = {m: values[rows] for m, values in branches.outcomes.items()}
    return Branches(state, branches.weights[rows] * factors, outcomes)


def _projected(backend: Backend, branches: Branches, instruction) -> Branches:
    """A ``qml.Projector`` applied as a gate: each branch projected and renormalised, its
    weight multiplied by the kept probability; branches of probability 0 dropped."""
    backend.apply_matrix(branches.state, instruction.data, instruction.targets)
    kept = backend.probabilities(branches.state, ())[:, 0]
    rows = np.flatnonzero(kept > 0.0)
    with np.errstate(divide="ignore"):
        backend.scale(branches.state, np.where(kept > 0.0, 1.0 / np.sqrt(kept), 0.0))
    if rows.size == branches.size:
        return Branches(branches.state, branches.weights * kept, branches.outcomes)
    if rows.size == 0:
        return Branches(branches.state, np.zeros(0), {})
    return _rows_of(backend, branches, rows, kept[rows])


class _Totals:
    """The weighted sums over the branches that the results are made of."""

    def __init__(self, measurements: Sequence[MeasurementProcess]):
        self.measurements = list(measurements)
        self.weight = 0.0
        self.first: list = [0.0] * len(self.measurements)  # sum of w * value
        self.second: list = [0.0] * len(self.measurements)  # sum of w * E[value**2]

    def add(self, backend: Backend, register: Register, branches: Branches) -> None:
        if branches.size == 0:
            return
        w = branches.weights
        self.weight += float(w.sum())
        observed = [mp for mp in self.measurements if mp.mv is None]
        with QueuingManager.stop_recording():
            means = [ExpectationMP(obs=mp.obs) for mp in observed if isinstance(mp, VarianceMP)]
        leaf = dataclasses.replace(register, batch_size=branches.size)
        values = measure.measure_all_analytic(backend, branches.state, leaf, observed + means)
        by_mp = dict(zip(map(id, observed), values[: len(observed)], strict=True))
        mean_of = iter(values[len(observed) :])
        for i, mp in enumerate(self.measurements):
            if mp.mv is not None:
                first, second = _mid_measured(mp, branches.outcomes, w)
            elif isinstance(mp, VarianceMP):
                mean = np.asarray(next(mean_of))
                first = _weighted(w, mean)
                second = _weighted(w, np.asarray(by_mp[id(mp)]) + np.abs(mean) ** 2)
            else:
                first, second = _weighted(w, np.asarray(by_mp[id(mp)])), 0.0
            self.first[i] = self.first[i] + first
            self.second[i] = self.second[i] + second

    def results(self) -> list:
        results = []
        for mp, first, second in zip(self.measurements, self.first, self.second, strict=True):
            first = np.asarray(first)
            if self.weight == 0.0:  # an impossible postselection: NaN, as default.qubit
                value = np.full(first.shape, np.nan)
            elif isinstance(mp, VarianceMP):
                value = np.asarray(second) / self.weight - np.abs(first / self.weight) ** 2
            else:
                value = first / self.weight
            results.append(value[()] if value.ndim == 0 else value)
        return results


def _weighted(weights: np.ndarray, values: np.ndarray):
    """sum_b weights[b] * values[b], values with a leading branch axis."""
    return np.tensordot(weights, values, axes=(0, 0))


def _mid_measured(mp: MeasurementProcess, outcomes: dict, weights: np.ndarray):
    """(sum w * value, sum w * value**2) of a measured mid-circuit value (expval, var), or
    (the weighted counts of its values, 0) for probs, in PennyLane's order of values
    (``MeasurementValue.branches``; a list of values: their product)."""
    if isinstance(mp, ProbabilityMP):
        values = mp.mv if isinstance(mp.mv, Sequence) else [mp.mv]
        columns = np.stack(
            [np.broadcast_to(np.asarray(v.concretize(outcomes)), weights.shape) for v in values],
            axis=1,
        )
        combinations = itertools.product(*(list(v.branches.values()) for v in values))
        return np.array([weights[np.all(columns == c, axis=1)].sum() for c in combinations]), 0.0
    value = np.broadcast_to(np.asarray(mp.mv.concretize(outcomes), dtype=float), weights.shape)
    return _weighted(weights, value), _weighted(weights, value**2)
