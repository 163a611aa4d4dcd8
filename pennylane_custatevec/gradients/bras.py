"""The cotangent terms of the adjoint bras (``add_cotangent_terms``).

The bra encodes what is differentiated, one cotangent dy per measurement:

    expval(O):     lambda += 2 dy O psi           (d<O> = 2 Re <O psi | d psi>)
    var(O):        lambda += 2 dy (O^2 - 2<O> O) psi
    probs(wires):  lambda += 2 D psi, D = diag(dy) on the wires (sum_x dy_x dp_x)
    state():       lambda += conj(dy)             (Re sum_i dy_i d psi_i)

The variance term: var = <O^2> - <O>^2, so d var = d<O^2> - 2<O> d<O>, and each
expectation contributes as expval does, with <O> a number taken from the final state
before the sweep (it does not depend on where in the circuit the sweep is). For a Pauli
word O^2 = I, whose <I> = 1 has no derivative: the term is -4 dy <O> O psi. Otherwise
O^2 psi is O applied twice (never O^2 built as an operator: a sum of K words would
square into K^2 products)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pennylane as qml
from pennylane.measurements import (
    ExpectationMP,
    MeasurementProcess,
    ProbabilityMP,
    StateMP,
    VarianceMP,
)
from pennylane.operation import Operator

from .. import measure
from ..backends.base import Backend
from ..backends.primitives import StateBatch
from ..program import Register
from .results import is_zero


def add_cotangent_terms(
    backend: Backend,
    bras: StateBatch,
    psi: StateBatch,
    register: Register,
    measurements: Sequence[MeasurementProcess],
    rows: Sequence[tuple],
    memo: dict | None = None,
) -> None:
    """bras[r] += the sum over measurements of each cotangent's term of row r (module
    docstring), for the final state ``psi`` (one vector, unchanged). ``memo``: the
    compilation's (``program.Compilation.memo``), which holds its Pauli plan."""
    plan = measure.pauli_plan(register, measurements, memo)
    if None not in plan.terms:  # Pauli expectation values only: one call per bra
        for r, row in enumerate(rows):
            coefficients = np.zeros(len(plan.words), dtype=np.complex128)
            for dy, terms in zip(row, plan.terms, strict=True):
                if not is_zero(dy):
                    for column, coefficient in terms:
                        coefficients[column] += 2.0 * float(dy) * coefficient
            live = np.flatnonzero(coefficients)
            if live.size:
                words = [plan.words[k] for k in live]
                backend.add_pauli_sum(
                    backend.vectors(bras, r, r + 1), psi, words, coefficients[live]
                )
        return
    for r, row in enumerate(rows):
        bra = backend.vectors(bras, r, r + 1)
        # the Pauli observables' terms as one sum: one backend call however many there are
        paulis = qml.pauli.PauliSentence()
        for mp, dy in zip(measurements, row, strict=True):
            if is_zero(dy):
                continue
            if isinstance(mp, ExpectationMP) and mp.obs.pauli_rep is not None:
                paulis += (2.0 * float(dy)) * mp.obs.pauli_rep
            elif isinstance(mp, VarianceMP):
                paulis += _add_variance_term(backend, bra, psi, register, mp.obs, float(dy))
            else:
                _add_term(backend, bra, psi, register, mp, dy)
        if paulis:
            measure.add_pauli_sentence(backend, bra, psi, register, paulis)


def _add_variance_term(
    backend, bra, psi, register: Register, obs: Operator, dy: float
) -> qml.pauli.PauliSentence:
    """bra += 2 dy (O^2 - 2<O> O) psi (module docstring), but for the part that is a
    Pauli sentence times psi, returned to join the other Pauli terms of the bra: all of
    it for a Pauli word (O^2 = c^2 I: <O^2> = c^2 <psi|psi>, whose term 2 dy c^2 psi
    vanishes for every gate with a generator, Re(i <psi|G|psi>) = 0, but not for a
    matrix's entries, which move psi off the unit sphere: ``entrywise``), -4 dy <O> O
    for a sum."""
    mean = float(measure.expval(backend, psi, register, obs)[0])
    sentence = obs.pauli_rep
    if sentence is not None and len(sentence) == 1:
        (coefficient,) = sentence.values()
        if np.imag(coefficient) == 0:
            norm = qml.pauli.PauliSentence({qml.pauli.PauliWord({}): 1.0})
            return (-4.0 * dy * mean) * sentence + (2.0 * dy * np.real(coefficient) ** 2) * norm
    applied = measure.applied_observable(backend, psi, register, obs)
    if sentence is not None:
        measure.add_pauli_sentence(backend, bra, applied, register, sentence, 2.0 * dy)
        return (-4.0 * dy * mean) * sentence
    backend.add_scaled(bra, measure.applied_observable(backend, applied, register, obs), [2 * dy])
    backend.add_scaled(bra, applied, [-4.0 * dy * mean])
    return qml.pauli.PauliSentence()


def _add_term(backend, bra, psi, register: Register, mp: MeasurementProcess, dy) -> None:
    """bra += the cotangent term of a state, probs, or expval of a non-Pauli observable."""
    if isinstance(mp, StateMP):
        backend.add_scaled(bra, backend.from_host(np.conj(np.asarray(dy))[None]), np.ones(1))
    elif isinstance(mp, ProbabilityMP):
        scaled = backend.copy(psi)
        weights = np.asarray(dy, dtype=np.complex128)[None]
        backend.apply_diagonal(scaled, weights, register.targets(mp.wires or register.wires))
        backend.add_scaled(bra, scaled, np.full(1, 2.0))
    else:
        applied = measure.applied_observable(backend, psi, register, mp.obs)
        backend.add_scaled(bra, applied, [2.0 * float(dy)])
