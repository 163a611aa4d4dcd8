"""Sampled measurements: observables rotated into the computational basis where the
device samples, tapes split where their measurements do not commute qubit-wise, and each
classical-shadow measurement on a tape of its own; the same split for ``dev.execute`` of
tapes that skipped the preprocessing (``sampled_apart``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pennylane.measurements import CountsMP, ExpectationMP, ProbabilityMP, SampleMP, VarianceMP
from pennylane.operation import Operator
from pennylane.ops import CompositeOp, LinearCombination, Pow, SProd, Sum, SymbolicOp
from pennylane.tape import QuantumScript
from pennylane.transforms import diagonalize_measurements, split_non_commuting
from pennylane.transforms.core import transform

from ..exact import observable_key
from ..measure import SHADOW_MEASUREMENTS
from ..program import tape_batch_size
from .broadcast import split_broadcast
from .common import first_result


def _flattened(mp):
    """An expectation value or variance of a sum of Pauli words, with its observable as
    one flat LinearCombination: PennyLane's diagonalization drops the coefficients of
    the terms of a nested Sum."""
    obs = mp.obs
    if not isinstance(mp, (ExpectationMP, VarianceMP)) or not isinstance(obs, Sum):
        return mp
    terms = obs.pauli_rep
    if not terms:
        return mp
    words = [word.operation(wire_order=obs.wires) for word in terms]
    return type(mp)(LinearCombination(list(terms.values()), words))


def _measured_bases(mp, all_wires) -> dict | None:
    """{wire: basis} a measurement reads; a non-Pauli observable claims its wires whole."""
    if mp.obs is None:
        return {w: "Z" for w in (mp.wires or all_wires)}
    if mp.obs.pauli_rep is None:
        dense = ("dense", observable_key(mp.obs))
        return dict.fromkeys(mp.obs.wires, dense)
    bases: dict = {}
    for word in mp.obs.pauli_rep:
        for wire, letter in word.items():
            if bases.setdefault(wire, letter) != letter:
                return None
    return bases


def _reads_a_rotated_wire(measurements, all_wires) -> bool:
    """Whether a wire that one measurement reads in a basis other than Z is read by
    another too (the device rotates a whole observable at execution, so that the other
    would read it rotated): a tape the preprocessing has not rotated and split, such as
    ``expval(X(0) @ Y(1))`` beside ``expval(Z(0))``, or ``Y(0) @ Y(2)`` beside
    ``X(1) @ Y(2)`` (qubit-wise commuting, rotated per wire by the preprocessing)."""
    readers: dict = {}  # {wire: {who reads it}}: "Z", or the observable that rotates it
    for mp in measurements:
        bases = _measured_bases(mp, all_wires)
        if bases is None:  # a sum whose words do not commute qubit-wise
            return True
        for wire, basis in bases.items():
            reader = "Z" if basis == "Z" else observable_key(mp.obs)
            readers.setdefault(wire, set()).add(reader)
    return any(len(who) > 1 and who != {"Z"} for who in readers.values())


def _qubit_wise_commuting(measurements, all_wires) -> bool:
    """True when one rotation per wire diagonalizes every measurement together."""
    claimed: dict = {}
    for mp in measurements:
        bases = _measured_bases(mp, all_wires)
        if bases is None:
            return False
        for wire, basis in bases.items():
            if claimed.setdefault(wire, basis) != basis:
                return False
    return True


@transform
def rotate_sampled_measurements(tape: QuantumScript):
    """For finite shots: rotate observables into the computational basis, where the
    device samples, splitting the tape where its measurements do not commute qubit-wise.

    Sums and Hamiltonians are split term by term for expectation values. Any other
    measurement of an observable (variance, samples, counts, probabilities) needs its
    observable whole: it gets a tape of its own, rotated by the observable's diagonalizing
    gates when its terms do not commute qubit-wise.
    """
    if not tape.shots:
        return (tape,), first_result
    if any(isinstance(mp, SHADOW_MEASUREMENTS) for mp in tape.measurements):
        return _shadows_apart(tape)
    if all(mp.obs is None for mp in tape.measurements):
        return (tape,), first_result
    measurements = [_flattened(mp) for mp in tape.measurements]
    tape = tape.copy(measurements=measurements)
    if _qubit_wise_commuting(measurements, tape.wires):
        return (_diagonalized(tape),), first_result
    wholes = [
        i
        for i, mp in enumerate(measurements)
        if mp.obs is not None and not isinstance(mp, ExpectationMP)
    ]
    others = [i for i in range(len(measurements)) if i not in wholes]
    pieces = []
    if others:
        groups, recombine = split_non_commuting(
            tape.copy(measurements=[measurements[i] for i in others]), grouping_strategy="qwc"
        )
        rotated = [_diagonalized(group) for group in groups]
        pieces.append((others, rotated, recombine))
    for index in wholes:
        alone = tape.copy(measurements=[measurements[index]])
        if _qubit_wise_commuting(alone.measurements, tape.wires):
            alone = _diagonalized(alone)
        pieces.append(([index], [alone], first_result))
    return [t for _, tapes, _ in pieces for t in tapes], _reassemble(tape, pieces)


def sampled_apart(circuits: Sequence[QuantumScript]):
    """For ``dev.execute`` of tapes that skipped the preprocessing (PennyLane's gradient
    tests call it so): each sampled tape with a measurement that reads a wire another
    rotates (``_reads_a_rotated_wire``) rotated and split as
    ``rotate_sampled_measurements`` does it, so that no measurement is sampled from a
    state rotated for another (default.qubit samples each group apart too). ``(tapes,
    recombine)``, or None where no tape needs it (as no preprocessed tape does)."""
    split = [
        bool(c.shots)
        and not any(isinstance(mp, SHADOW_MEASUREMENTS) for mp in c.measurements)
        and _reads_a_rotated_wire(c.measurements, c.wires)
        for c in circuits
    ]
    if not any(split):
        return None
    tapes, pieces = [], []
    for circuit, apart in zip(circuits, split, strict=True):
        parts, postprocess = (
            rotate_sampled_measurements(circuit) if apart else ((circuit,), first_result)
        )
        pieces.append((len(tapes), len(parts), postprocess))
        tapes.extend(parts)

    def recombine(results):
        return [postprocess(results[start : start + n]) for start, n, postprocess in pieces]

    return tapes, recombine


def _shadows_apart(tape: QuantumScript):
    """Each classical-shadow measurement in a tape of its own, expanded where the tape is
    broadcast (its measurement takes one state); the other measurements rotated together
    as ``rotate_sampled_measurements`` rotates them."""
    shadows = [i for i, mp in enumerate(tape.measurements) if isinstance(mp, SHADOW_MEASUREMENTS)]
    others = [i for i in range(len(tape.measurements)) if i not in shadows]
    pieces = []
    if others:
        rest = tape.copy(measurements=[tape.measurements[i] for i in others])
        tapes, postprocess = rotate_sampled_measurements(rest)
        pieces.append((others, list(tapes), postprocess))
    for index in shadows:
        alone = tape.copy(measurements=[tape.measurements[index]])
        if tape_batch_size(alone) is None:
            pieces.append(([index], [alone], first_result))
        else:
            tapes, postprocess = split_broadcast(alone)
            pieces.append(([index], list(tapes), postprocess))
    return [t for _, tapes, _ in pieces for t in tapes], _reassemble(tape, pieces)


def _diagonalized(tape: QuantumScript) -> QuantumScript:
    """PennyLane's ``diagonalize_measurements`` of a tape whose measurements commute
    qubit-wise, with the options of counts (``all_outcomes``) and samples (``dtype``) kept:
    it rebuilds the measurements of observables without them (outcomes never sampled went
    missing from the dictionaries, samples came as float64)."""
    tape = _rotated_by_own_gates(tape)
    (rotated,), _ = diagonalize_measurements(tape)
    kept = [
        _with_options_of(old, new)
        for old, new in zip(tape.measurements, rotated.measurements, strict=True)
    ]
    return rotated.copy(measurements=kept)


def _rebuildable(obs) -> bool:
    """Whether PennyLane's ``diagonalize_measurements`` can rotate ``obs``: it rebuilds a
    symbolic operator from its parameters and hyperparameters with the base rotated,
    which scalar products and powers accept and exponentials, adjoints and controlled
    operators (CZ, ...) do not (a TypeError)."""
    if isinstance(obs, CompositeOp):
        return all(map(_rebuildable, obs.operands))
    if isinstance(obs, SymbolicOp):
        return isinstance(obs, (SProd, Pow)) and _rebuildable(obs.base)
    return True


class RotatedObservable(Operator):
    """An observable after its own diagonalizing gates (``_rotated_by_own_gates``):
    diagonal in the computational basis of its wires, with the eigenvalues of the
    observable it stands for. Measured through PennyLane's observable path, which sums
    the counts of equal eigenvalues (its counts by explicit ``eigvals`` keep one of them:
    ``{eigenvalue: count}`` built from every outcome, the last equal one winning)."""

    num_params = 1
    grad_method = None

    @staticmethod
    def compute_eigvals(eigenvalues):  # pylint: disable=arguments-differ
        return eigenvalues

    @staticmethod
    def compute_diagonalizing_gates(eigenvalues, wires):  # pylint: disable=arguments-differ
        return []

    @staticmethod
    def compute_matrix(eigenvalues):  # pylint: disable=arguments-differ
        return np.diag(eigenvalues)


RotatedObservable._primitive = None  # plain Python under program capture (device.eval_jaxpr)


def _rotated_by_own_gates(tape: QuantumScript) -> QuantumScript:
    """The tape with each observable that PennyLane cannot rotate (``_rebuildable``)
    rotated by its own diagonalizing gates, once per observable, and measured as a
    ``RotatedObservable``, as default.qubit samples it (the measurements commute
    qubit-wise: such an observable claims its wires whole)."""
    measurements = list(tape.measurements)
    opaque = [i for i, mp in enumerate(measurements) if mp.obs and not _rebuildable(mp.obs)]
    if not opaque:
        return tape
    gates, rotated = [], set()
    for index in opaque:
        mp = measurements[index]
        obs = mp.obs
        if observable_key(obs) not in rotated:
            rotated.add(observable_key(obs))
            gates.extend(obs.diagonalizing_gates())
        if isinstance(mp, ProbabilityMP):
            measurements[index] = ProbabilityMP(wires=obs.wires)
        else:
            diagonal = RotatedObservable(obs.eigvals(), wires=obs.wires)
            measurements[index] = _with_options_of(mp, type(mp)(obs=diagonal))
    return tape.copy(operations=tape.operations + gates, measurements=measurements)


def _with_options_of(old, new):
    if new.obs is None or new is old:
        return new
    if isinstance(old, CountsMP) and old.all_outcomes:
        return CountsMP(obs=new.obs, all_outcomes=True)
    dtype = getattr(old, "_dtype", None)  # SampleMP's option; PennyLane has no accessor
    if isinstance(old, SampleMP) and dtype is not None:
        return SampleMP(obs=new.obs, dtype=dtype)
    return new


def _reassemble(tape: QuantumScript, pieces):
    """Post-processing that puts the pieces' results back in the tape's measurement order."""
    partitioned = tape.shots.has_partitioned_shots
    n_partitions = len(list(tape.shots)) if partitioned else 1

    def per_measurement(value, count):
        """value -> [partition][measurement] for a piece of ``count`` measurements."""
        partitions = value if partitioned else (value,)
        return [part if count > 1 else (part,) for part in partitions]

    def reassemble(results):
        table = [[None] * len(tape.measurements) for _ in range(n_partitions)]
        start = 0
        for indices, tapes, postprocess in pieces:
            value = postprocess(results[start : start + len(tapes)])
            start += len(tapes)
            for p, part in enumerate(per_measurement(value, len(indices))):
                for index, result in zip(indices, part, strict=True):
                    table[p][index] = result
        rows = [row[0] if len(row) == 1 else tuple(row) for row in table]
        return tuple(rows) if partitioned else rows[0]

    return reassemble
