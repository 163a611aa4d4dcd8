"""Measurements of a batch of final states, analytic and sampled.

Analytic expectation values reduce every observable to one of three forms:

* a Pauli sentence ``sum_k c_k P_k``: <O> = sum_k c_k <P_k>, the words' expectations
  measured by the backend in one call (for all the Pauli observables of a tape at once);
* a dense matrix on at most ``DENSE_OBSERVABLE_WIRES`` wires: <O> = <psi|M|psi>;
* a sparse matrix on the whole register (large Hamiltonians without Pauli form),
  evaluated on the host.

Variances use Var(O) = <O^2> - <O>^2 in the same form. An observable that is not
Hermitian (a non-real coefficient, as in ``qml.expval(1j * qml.Z(0))``) has the complex
expectation value <psi|O|psi> (default.qubit's for such a product) and the variance
<O^dagger O> - |<O>|^2, the variance of its sampled eigenvalues (what finite shots
estimate; equal to the above for a Hermitian O). Sampled measurements draw
computational-basis outcomes from the backend and let PennyLane's measurement
processes turn them into samples, counts, expectations and probabilities; the
device's preprocessing has already rotated every observable into that basis.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import numpy as np
import pennylane as qml
from pennylane.exceptions import DeviceError
from pennylane.measurements import (
    ClassicalShadowMP,
    ExpectationMP,
    MeasurementProcess,
    ProbabilityMP,
    ShadowExpvalMP,
    StateMeasurement,
    StateMP,
    VarianceMP,
)
from pennylane.operation import Operator
from pennylane.ops import CompositeOp, SymbolicOp
from pennylane.queuing import QueuingManager
from pennylane.wires import Wires

from . import simulate
from .backends.base import Backend
from .backends.primitives import StateBatch
from .compile_ops import compile_operation
from .exact import operator_key
from .instructions import apply_instruction
from .program import Register
from .queuing import diagonalizing_gates_of, matrix_of
from .simulate import require_normalised

DENSE_OBSERVABLE_WIRES = 10

SHADOW_MEASUREMENTS = (ClassicalShadowMP, ShadowExpvalMP)
"""Measurements that rotate each shot into a basis of its own (``qml.classical_shadow``,
``qml.shadow_expval``): measured from the final state by PennyLane's
``process_state_with_shots``, as default.qubit measures them (execution.py), each on a
tape of its own (``preprocess.sampled.rotate_sampled_measurements``)."""


HERMITIAN_TOLERANCE = 1e-12
"""A dense or sparse observable M counts as Hermitian where max |M - M^dagger| is at most
this times max(1, max |M|): rounding in the products and sums that built the matrix."""


@dataclasses.dataclass(frozen=True)
class _ObservableForm:
    """One of: pauli (PauliSentence), dense (matrix, wires), sparse (csr on the register)."""

    pauli: qml.pauli.PauliSentence | None = None
    matrix: np.ndarray | None = None
    wires: qml.wires.Wires | None = None
    sparse: object | None = None

    @functools.cached_property
    def hermitian(self) -> bool:
        """Whether the observable is Hermitian (its expectation value is real)."""
        if self.pauli is not None:
            return real_sentence(self.pauli)
        matrix = self.matrix if self.matrix is not None else self.sparse
        difference = abs(matrix - matrix.conj().T).max()
        return difference <= HERMITIAN_TOLERANCE * max(1.0, abs(matrix).max())


def real_valued(value) -> bool:
    """Whether a coefficient is real: a real dtype, or a concrete complex value with no
    imaginary part (a traced complex value may not be: False)."""
    if "complex" not in qml.math.get_dtype_name(value):
        return True
    if qml.math.is_abstract(value):
        return False
    return bool(np.all(np.imag(qml.math.unwrap(value)) == 0))


def real_sentence(sentence: qml.pauli.PauliSentence) -> bool:
    """Whether a Pauli sentence is Hermitian: every coefficient real (``real_valued``)."""
    return all(real_valued(c) for c in sentence.values())


def is_hermitian(obs: Operator) -> bool:
    """Whether ``obs`` is Hermitian: a Pauli sentence whose coefficients are real; else
    where PennyLane verifies it from the operator's structure (``is_verified_hermitian``);
    else, on at most ``DENSE_OBSERVABLE_WIRES`` wires with concrete data, by its matrix
    (``qml.is_hermitian``, e.g. a product of operators on shared wires); else False."""
    if obs.pauli_rep is not None:
        return real_sentence(obs.pauli_rep)
    if obs.is_verified_hermitian:
        return True
    if len(obs.wires) > DENSE_OBSERVABLE_WIRES or any(map(qml.math.is_abstract, obs.data)):
        return False
    return bool(qml.is_hermitian(obs))


def measurable(obs: Operator, named: Callable[[str], bool]) -> bool:
    """Whether the device measures ``obs``, default.qubit's rule: arithmetic (sums,
    products, scalar products, powers, adjoints, exponentials) of observables that each
    have an eigenbasis (diagonalizing gates: what sampling rotates by) or a ``named`` one
    (the capabilities' list: Hermitian and SparseHamiltonian are measured by their
    matrices). An operator such as RX(0.3) is not an observable: refused, not measured
    as a matrix."""
    if isinstance(obs, CompositeOp):
        return all(measurable(operand, named) for operand in obs.operands)
    if isinstance(obs, SymbolicOp):
        return measurable(obs.base, named)
    return named(obs.name) or obs.has_diagonalizing_gates


def _form(obs: Operator, register: Register) -> _ObservableForm:
    if obs.pauli_rep is not None:
        return _ObservableForm(pauli=obs.pauli_rep)
    if len(obs.wires) <= DENSE_OBSERVABLE_WIRES and not isinstance(obs, qml.SparseHamiltonian):
        return _ObservableForm(matrix=matrix_of(obs, wire_order=obs.wires), wires=obs.wires)
    return _ObservableForm(sparse=obs.sparse_matrix(wire_order=register.wires, format="csr"))


def _squared(form: _ObservableForm) -> _ObservableForm:
    """O^dagger O (O^2 for a Hermitian O)."""
    if form.pauli is not None:
        adjoint = form.pauli
        if not form.hermitian:
            adjoint = qml.pauli.PauliSentence({w: np.conj(c) for w, c in form.pauli.items()})
        square = adjoint @ form.pauli
        square.simplify()
        return _ObservableForm(pauli=square)
    if form.matrix is not None:
        return _ObservableForm(matrix=form.matrix.conj().T @ form.matrix, wires=form.wires)
    return _ObservableForm(sparse=form.sparse.conj().T @ form.sparse)


def _backend_words(sentence: qml.pauli.PauliSentence, register: Register) -> list[tuple]:
    """(letters, state bits, coefficient) of each word: letter j acts on bits[j]."""
    terms = []
    for word, coefficient in sentence.items():
        wires = list(word.keys())
        terms.append(("".join(word[w] for w in wires), register.bits(wires), coefficient))
    return terms


def _expectation(
    backend: Backend, state: StateBatch, register: Register, form: _ObservableForm
) -> np.ndarray:
    """<psi_b|O|psi_b> for each vector of the batch, of shape (B,): float64, complex128
    for an observable that is not Hermitian."""
    if form.pauli is not None:
        return pauli_values(backend, state, _sentence_plan(register, [form.pauli]))[0]
    if form.matrix is not None:
        values = backend.expval_matrix(state, form.matrix, register.targets(form.wires))
    else:
        vectors = backend.to_host(state)
        values = np.einsum("bi,bi->b", vectors.conj(), (form.sparse @ vectors.T).T)
    return np.real(values) if form.hermitian else np.asarray(values, dtype=np.complex128)


def transition(
    backend: Backend, bra: StateBatch, ket: StateBatch, register: Register, obs: Operator
) -> np.ndarray:
    """<bra_b|O|ket_b> for each bra, complex of shape (B,); a single ket serves every bra."""
    form = _form(obs, register)
    if form.pauli is not None:
        total = np.zeros(1, dtype=np.complex128)
        for letters, bits, coefficient in _backend_words(form.pauli, register):
            total = total + coefficient * backend.inner_pauli(bra, ket, letters, bits)
        return total
    if form.matrix is not None:
        return backend.inner_matrix(bra, ket, form.matrix, register.targets(form.wires))
    bras, kets = backend.to_host(bra), backend.to_host(ket)
    return np.einsum("bi,bi->b", bras.conj(), np.broadcast_to((form.sparse @ kets.T).T, bras.shape))


def expval(backend: Backend, state: StateBatch, register: Register, obs: Operator) -> np.ndarray:
    """<O> for each vector of the batch."""
    return _expectation(backend, state, register, _form(obs, register))


def expvals(
    backend: Backend, state: StateBatch, register: Register, observables: list[Operator]
) -> list[np.ndarray]:
    """<O> of each observable for each vector, float64 (B,) each: the Pauli ones' words
    in one backend call."""
    plan = _sentence_plan(register, [obs.pauli_rep for obs in observables])
    values = pauli_values(backend, state, plan)
    return [
        expval(backend, state, register, obs) if value is None else value
        for obs, value in zip(observables, values, strict=True)
    ]


def reduced_products(
    backend: Backend, kets: StateBatch, bras: StateBatch, register: Register, wires: Wires
) -> np.ndarray:
    """R_b[c, d] = sum_r ket_b[c, r] conj(bra_b[d, r]) on ``wires``, complex (B, 2**k,
    2**k): c and d index the values of ``wires`` (the first most significant), r those of
    every other wire. With bra = ket = psi it is the reduced density matrix of psi. On
    the host: the vectors come back whole."""
    positions = [register.wires.index(w) for w in wires]
    others = [p for p in range(len(register.wires)) if p not in positions]
    dimension = 2 ** len(positions)

    def grouped(state):
        vectors = backend.to_host(state)
        batch = vectors.shape[0]
        tensor = vectors.reshape((batch,) + (2,) * len(register.wires))
        order = [0] + [1 + p for p in positions] + [1 + p for p in others]
        return tensor.transpose(order).reshape(batch, dimension, -1)

    return np.einsum("bcr,bdr->bcd", grouped(kets), grouped(bras).conj())


def var(backend: Backend, state: StateBatch, register: Register, obs: Operator) -> np.ndarray:
    """<O^2> - <O>^2 for each vector of the batch (<O^dagger O> - |<O>|^2 for an O that
    is not Hermitian, the variance of its sampled eigenvalues)."""
    form = _form(obs, register)
    mean = _expectation(backend, state, register, form)
    return np.real(_expectation(backend, state, register, _squared(form))) - np.abs(mean) ** 2


def probs(backend: Backend, state: StateBatch, register: Register, mp: ProbabilityMP) -> np.ndarray:
    """Marginal probabilities of ``mp``'s wires (first wire most significant), (B, 2**k)."""
    wires = mp.wires if len(mp.wires) else register.wires
    if mp.obs is not None:
        state = backend.copy(state)
        for gate in diagonalizing_gates_of(mp.obs):
            apply_operator(backend, state, register, gate)
    elif len(wires) == register.num_qubits:  # every wire: a split backend may give a share
        return backend.probabilities_result(state, register.targets(wires))
    return backend.probabilities(state, register.targets(wires))


def applied_observable(
    backend: Backend, state: StateBatch, register: Register, obs: Operator
) -> StateBatch:
    """A new batch O psi_b (O need not be unitary: a generator, a Hamiltonian, ...)."""
    form = _form(obs, register)
    if form.pauli is not None:
        result = backend.copy(state)
        backend.scale(result, np.zeros(1))
        add_pauli_sentence(backend, result, state, register, form.pauli)
        return result
    if form.matrix is not None:
        result = backend.copy(state)
        backend.apply_matrix(result, form.matrix[None], register.targets(form.wires))
        return result
    vectors = backend.to_host(state)
    return backend.from_host((form.sparse @ vectors.T).T)


def add_pauli_sentence(
    backend: Backend,
    dst: StateBatch,
    src: StateBatch,
    register: Register,
    sentence: qml.pauli.PauliSentence,
    weight: complex = 1.0,
) -> None:
    """dst += weight * (sum_k c_k P_k) src, ``src`` unchanged."""
    terms = _backend_words(sentence, register)
    if terms:
        words = [(letters, bits) for letters, bits, _ in terms]
        coefficients = np.array([weight * coefficient for _, _, coefficient in terms])
        backend.add_pauli_sum(dst, src, words, coefficients)


def apply_operator(backend: Backend, state: StateBatch, register: Register, op: Operator) -> None:
    """Apply one PennyLane operator (e.g. a diagonalizing gate) to the batch."""
    for instruction in compile_operation(op, register):
        apply_instruction(backend, state, instruction)


def measure_analytic(
    backend: Backend, state: StateBatch, register: Register, mp: MeasurementProcess
):
    """The analytic result of ``mp``, with a leading batch axis."""
    if isinstance(mp, (ExpectationMP, VarianceMP)) and mp.obs is None:
        return _moment_of_eigenvalues(backend, state, register, mp)
    if isinstance(mp, ExpectationMP):
        return expval(backend, state, register, mp.obs)
    if isinstance(mp, VarianceMP):
        return var(backend, state, register, mp.obs)
    if isinstance(mp, ProbabilityMP):
        return probs(backend, state, register, mp)
    if type(mp) is StateMP and (not mp.wires or mp.wires == register.wires):
        # the register's amplitudes in its order, or a split backend's share of them
        return backend.state_result(state)
    if isinstance(mp, StateMeasurement):
        vectors = backend.to_host(state)
        on_positions, standard = measured_on_positions(mp, register.wires)
        return np.stack([on_positions.process_state(v, wire_order=standard) for v in vectors])
    raise DeviceError(f"Measurement {mp} is not supported analytically.")


def measured_on_positions(mp: MeasurementProcess, wires: Wires) -> tuple:
    """``mp`` on the positions of its wires among ``wires``, and the wire order
    ``0 .. n-1`` to process a state with. Some of PennyLane's measurements take their
    wire labels for positions in ``process_state`` (``vn_entropy``, ``mutual_info``:
    with wires ``["a", "b"]`` they failed), as default.qubit measures circuits mapped to
    standard wires."""
    positions = {wire: position for position, wire in enumerate(wires)}
    with QueuingManager.stop_recording():
        return mp.map_wires(positions), Wires(range(len(wires)))


@dataclasses.dataclass(frozen=True)
class PauliPlan:
    """The expectation values of Pauli sentences among a tape's measurements, as backend
    words: what ``measure_all_analytic`` measures in one backend call and what the
    adjoint bras of those measurements apply (``gradients.bras.add_cotangent_terms``)."""

    words: tuple[tuple[str, tuple[int, ...]], ...]
    """The distinct words of all of them: (letters, state bits), letter j on bits[j]."""
    terms: tuple[tuple[tuple[int, complex], ...] | None, ...]
    """Per measurement: its sentence as (index into ``words``, coefficient) pairs, or
    None for a measurement that is not the expectation value of a Pauli sentence."""


_PAULI_PLAN = ("measure", "pauli")
"""The key of a ``PauliPlan`` in ``program.Compilation.memo``."""


def pauli_plan(register: Register, measurements, memo: dict | None = None) -> PauliPlan:
    """The ``PauliPlan`` of ``measurements``; from ``memo`` (a compilation's, see
    ``program.Compilation.memo``) where the structure planned it before."""
    plan = memo.get(_PAULI_PLAN) if memo is not None else None
    if plan is not None:
        return plan
    sentences = [
        mp.obs.pauli_rep if isinstance(mp, ExpectationMP) and mp.obs is not None else None
        for mp in measurements
    ]
    plan = _sentence_plan(register, sentences)
    if memo is not None:
        memo[_PAULI_PLAN] = plan
    return plan


def measure_all_analytic(
    backend: Backend, state: StateBatch, register: Register, measurements, memo=None
) -> list:
    """The analytic results of ``measurements``, each with a leading batch axis; the
    expectation values of Pauli observables all come from one backend call
    (``pauli_plan``; ``memo``: the compilation's, see ``program.Compilation.memo``)."""
    plan = pauli_plan(register, measurements, memo)
    values = pauli_values(backend, state, plan)
    return [
        measure_analytic(backend, state, register, mp) if value is None else value
        for mp, value in zip(measurements, values, strict=True)
    ]


def _sentence_plan(register: Register, sentences: list) -> PauliPlan:
    """The ``PauliPlan`` of Pauli sentences (None: an item that is not one)."""
    columns: dict = {}
    terms = []
    for sentence in sentences:
        if sentence is None:
            terms.append(None)
            continue
        terms.append(
            tuple(
                (columns.setdefault((letters, bits), len(columns)), _plain(coefficient))
                for letters, bits, coefficient in _backend_words(sentence, register)
            )
        )
    return PauliPlan(tuple(columns), tuple(terms))


def _plain(coefficient) -> float | complex:
    """A coefficient as a Python number: a float where it is real, so that a Hermitian
    sentence's value stays float64 and only a non-Hermitian one's is complex."""
    value = complex(coefficient)
    return value.real if value.imag == 0 else value


def pauli_values(backend: Backend, state: StateBatch, plan: PauliPlan) -> list[np.ndarray | None]:
    """<sum_k c_k P_k> of each sentence of ``plan``, float64 (B,) each (complex128 for a
    sentence with a non-real coefficient; None for an item that is not one): the distinct
    words of all of them in one backend call."""
    values = backend.expval_pauli_words(state, list(plan.words)) if plan.words else None
    return sentence_values(plan, values, state.shape[0])


def sentence_values(
    plan: PauliPlan, values: np.ndarray | None, batch: int
) -> list[np.ndarray | None]:
    """The sentences' values of ``plan`` from its words' expectation values ``values``
    (B, K) (as ``pauli_values``)."""
    results: list = []
    for terms in plan.terms:
        if terms is None:
            results.append(None)
            continue
        total = np.zeros(batch)  # the batch measured (a vector of it, say)
        for column, coefficient in terms:  # complex only where the sentence is not Hermitian
            total = total + coefficient * values[:, column]
        results.append(total)
    return results


def _moment_of_eigenvalues(backend, state, register: Register, mp) -> np.ndarray:
    """Expectation or variance of a function of mid-circuit measurement values (held on
    the wires that deferred measurement added): its eigenvalues weighted by probabilities."""
    probabilities = backend.probabilities(state, register.targets(mp.wires))
    eigenvalues = np.asarray(mp.eigvals(), dtype=np.float64)
    mean = probabilities @ eigenvalues
    if isinstance(mp, ExpectationMP):
        return mean
    return probabilities @ eigenvalues**2 - mean**2


def rotate_to_eigenbases(
    backend: Backend, state: StateBatch, register: Register, measurements
) -> None:
    """Apply the diagonalizing gates of the observables that are not yet diagonal.

    The device's preprocessing rotates Pauli observables; what remains (Hermitian,
    projectors onto states, and the observables of a tape that skipped the preprocessing)
    is rotated here, wire by wire: each wire takes the gates of the observables that
    rotate it, once, where they rotate it alike (``X(1)`` and ``Z(0) @ X(1)`` both take a
    Hadamard on wire 1); a measurement reads every wire it reads rotated exactly as its
    own observable rotates it (``Z(0)`` reads wire 0 beside ``Z(0) @ X(1)``, unrotated),
    else the tape is refused (``probs(1)`` beside ``X(1)``: default.qubit samples such
    measurements from circuits of their own, as the preprocessing splits them).
    """
    rotations: dict = {}  # {wire: keys of the gates that rotate it, in order}
    gates: list = []
    for mp in measurements:
        own = _rotations_by_wire(mp)
        clash = [w for w, keys in own.items() if rotations.get(w, keys) != keys]
        if clash:
            rotating = [
                m.obs
                for m in measurements
                if m is not mp and set(_rotations_by_wire(m)) & set(clash)
            ]
            raise DeviceError(
                f"Cannot sample {mp.obs} together with {rotating}: they rotate wires "
                f"{clash} differently; measure them in separate circuits."
            )
        if mp.obs is None or set(own) <= set(rotations):
            continue  # nothing to rotate, or rotated alike already
        gates.extend(g for g in diagonalizing_gates_of(mp.obs) if not set(g.wires) & set(rotations))
        rotations.update(own)
    for mp in measurements:  # what reads a wire another observable rotates would read it rotated
        own = _rotations_by_wire(mp)
        read = mp.wires or register.wires
        if any(rotations.get(w, ()) != own.get(w, ()) for w in read):
            others = [m.obs for m in measurements if m.obs is not None and m is not mp]
            raise DeviceError(
                f"Cannot sample {mp} together with {others} on shared wires (a circuit that has "
                "not been through the device's preprocessing, which splits it); measure them "
                "in separate circuits."
            )
    for gate in gates:
        apply_operator(backend, state, register, gate)


def _rotations_by_wire(mp) -> dict:
    """{wire: the exact keys of the diagonalizing gates of ``mp``'s observable that act on
    it, in order}; a gate on several wires is in each of theirs."""
    if mp.obs is None:
        return {}
    rotations: dict = {}
    for gate in diagonalizing_gates_of(mp.obs):
        for wire in gate.wires:
            rotations[wire] = (*rotations.get(wire, ()), operator_key(gate))
    return rotations


def sampled_wires(register: Register, measurements) -> Wires:
    """The register wires the measurements read, in register order (all if any reads all)."""
    read = [mp.wires for mp in measurements]
    if any(len(wires) == 0 for wires in read):
        return register.wires
    used = set(Wires.all_wires(read))
    return Wires([w for w in register.wires if w in used])


_SAMPLE_BYTES = 8
"""Bytes of one sampled bit (int64, the dtype PennyLane's measurement processes take)."""


def sampling_bytes(backend: Backend, batch: int, wires: Wires, shots: int, measurements) -> int:
    """Host bytes that sampling ``shots`` per vector of ``wires`` allocates at most: the
    backend's outcomes with their temporaries (``sample_host_bytes``); then the outcomes
    and their bits (``computational_basis_samples``); then the bits and what each
    measurement process takes of them (an estimate: a copy of its columns, its indices and
    eigenvalues)."""
    width = len(wires)
    processing = sum(len(mp.wires or wires) + 2 for mp in measurements)
    per_shot = max(
        backend.sample_host_bytes, _SAMPLE_BYTES * (1 + width), _SAMPLE_BYTES * (width + processing)
    )
    return batch * shots * per_shot


def require_sample_memory(
    backend: Backend, batch: int, wires: Wires, counts: list[int], measurements
) -> None:
    """Refuse, before sampling, ``sum(counts)`` shots (a shot vector's partitions are
    sampled together) whose samples would not fit in the host's free memory, naming the
    largest number of shots that would, and analytic execution where every measurement
    has an exact value."""
    shots = sum(counts)
    needed = sampling_bytes(backend, batch, wires, shots, measurements)
    per_shot = needed // max(shots, 1)

    def alternatives(available: int) -> list:
        found = []
        fitting = available // per_shot if per_shot else 0
        if fitting:
            found.append(
                simulate.Alternative(
                    f"shots={fitting:,}"
                    if len(counts) == 1
                    else f"at most {fitting:,} shots in all",
                    "fewer samples",
                    fitting * per_shot,
                )
            )
        if all(isinstance(mp, _EXACT_MEASUREMENTS) for mp in measurements):
            found.append(
                simulate.Alternative(
                    "shots=None", "exact expectation values and probabilities, no samples", 0
                )
            )
        return found

    partitions = (
        f", a shot vector of {len(counts):,} partitions sampled together" if len(counts) > 1 else ""
    )
    simulate.require_total(
        backend,
        needed,
        f"sampling {shots:,} shots of {len(wires):,} wire{'s' if len(wires) != 1 else ''} "
        f"from {batch:,} state vector{'s' if batch != 1 else ''}{partitions}",
        alternatives,
        host=True,
    )


_EXACT_MEASUREMENTS = (ExpectationMP, VarianceMP, ProbabilityMP)


def computational_basis_samples(
    backend: Backend,
    state: StateBatch,
    register: Register,
    wires: Wires,
    shots: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """``shots`` samples per vector, int64 (B, shots, len(wires)): column j is wire j's bit.
    The states must be normalised (``simulate.require_normalised``: one pass for the norms),
    unless no sample is drawn: a postselection of probability 0 leaves a NaN state and, in
    ``"hw-like"`` mode, no shots, whose results are NaN or empty (default.qubit's)."""
    if shots == 0:
        return np.zeros((register.batch_size, 0, len(wires)), dtype=np.int64)
    require_normalised(backend, backend.probabilities(state, ())[:, 0], register)
    outcomes = backend.sample(state, register.targets(wires), shots, rng)
    shifts = np.arange(len(wires) - 1, -1, -1, dtype=np.int64)
    bits = outcomes[..., None] >> shifts
    bits &= 1  # in place: one array of samples, not two
    return bits
