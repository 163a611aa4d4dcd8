"""Small circuits of a known structure, run directly: a call in two backend calls.

The compiled torch path (``pennylane_custatevec.compiled``) runs the same structures call
after call with new parameter values. Where a structure is small enough to run as one gate
sequence (``sequences``: at most ``Backend.sequence_amplitudes`` amplitudes) and measures
expectation values of Pauli sentences only, a call needs no tape and no batching (and,
where every parametrized gate is read by an angle rule, no compilation): ``DirectPlan``
holds, built once per structure, the forward and sweep sequences, where each rotation's
angle comes from (the structure's angle rules), the measured Pauli words ``P_k`` with the
weights ``W`` of each measurement and the gradient columns.

Forward, for parameters theta (``forward``):

    a_s     = the angle of rotation slot s, read from theta by its rule
    psi     = U(a) |0>
    <O_m>   = sum_k W[m, k] <psi|P_k|psi>
                                    (both: Backend.run_sequence_measured, one call)

VJP, for cotangent rows dy_r (``vjp``; the bras as ``gradients.bras`` builds them):

    bra_r   = sum_k c_rk P_k psi,  c_rk = 2 sum_m dy_rm W[m, k]
    g_rj    = Re <bra_r| dU/dtheta_j ... |0>            (deferred sweep)

both in one call (Backend.sweep_sequence_from_words; the CPU backend builds the bras and
sweeps in one numba call, the base class composes add_pauli_sum and sweep_sequence).

The numbers are those of the general path (``execution.run_tapes``,
``gradients.deferred.vjps``), which runs the same sequences for such circuits; what a
structure or a call does not fit (another measurement, a larger circuit, the eager
mode's sweep) takes the general path. A structure whose parametrized gates are not all
read by angle rules (an operation rebuilt with its parameters, a state preparation)
``recompiles``: a call compiles its tape from the structure (``Structure.compile``) and
takes the angles, the matrix slots' matrices and the initial state from it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
from pennylane.tape import QuantumScript

from . import measure, sequences, simulate
from .backends.base import Backend
from .backends.primitives import StateBatch
from .gradients.cotangents import checked_cotangents, cotangent_batch, stacked_gradients
from .gradients.differentiated import DifferentiatedTape
from .gradients.fused_sweep import sequence_sweep_plan
from .instructions import Kind
from .kept import KeptState
from .program import Compilation
from .rotations import real_angles
from .structures import Structure

_DIRECT = ("direct", "plan")
"""The key of a structure's ``DirectPlan`` (or None: it has none) in its memo."""
_DIRECT_SWEEP = ("direct", "sweep")
"""The key of its direct sweep's sequence (``DirectPlan.sweep``; None: none)."""
_DIRECT_JACOBIAN = ("direct", "jacobian")
"""The key of its ``ForwardJacobian`` (``forward_jacobian_of``)."""


@dataclasses.dataclass(frozen=True)
class _AngleSource:
    """Where one rotation slot of the sequence takes its angle: element ``element`` of
    operation parameter ``parameter`` (per vector where ``broadcast``), or the
    ``constant`` angles (1 or B,) of a gate without a parameter."""

    parameter: int
    element: int
    broadcast: bool
    name: str
    constant: np.ndarray | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class DirectPlan:
    """How one structure's calls run directly (module docstring); built once per
    structure (``plan_of``)."""

    structure: Structure
    forward: sequences.SequencePlan
    sources: tuple[_AngleSource, ...]
    """Per rotation slot of the sequences, where its angle comes from (empty where the
    plan ``recompiles``)."""
    recompiles: bool
    """Whether a call compiles its tape (``Structure.compile``: an operation rebuilt with
    its parameters, or a state preparation): then the angles, the matrices of the
    sequence's matrix slots and the initial state come from that compilation."""
    rows: int
    """1, or the broadcast's B: the rows of the angles and of the results."""
    pauli: measure.PauliPlan
    """The measured words and each measurement's terms."""
    weights: np.ndarray
    """(M, K) complex128: measurement m is sum_k weights[m, k] P_k (``pauli``'s terms)."""
    circuit: DifferentiatedTape
    """The template as the adjoint method sees it: columns, cotangent checks, ``fold``."""

    def sweep(self, backend: Backend) -> sequences.SequencePlan | None:
        """The deferred sweep's sequence (kept in the structure's memo), or None where the
        sweep takes the general path. Planned at the first VJP, not with the plan: a
        structure run for another gradient method (parameter-shift's tapes) may have
        trainable gates without a generator, which only the adjoint method refuses."""
        memo = self.structure.compilation.memo
        if _DIRECT_SWEEP not in memo:
            sweep = sequence_sweep_plan(backend, self.structure.compilation, self.circuit.columns)
            same_slots = sweep is not None and (sweep.angle_sources, sweep.matrix_sources) == (
                self.forward.angle_sources,
                self.forward.matrix_sources,
            )
            memo[_DIRECT_SWEEP] = sweep if same_slots else None
        return memo[_DIRECT_SWEEP]

    def angles(self, parameters: Sequence) -> np.ndarray:
        """(1 or B, slots) float64: each rotation's angle for ``parameters`` (one value
        per operation parameter, in tape order, as ``Structure.compile`` takes them)."""
        angles = np.empty((self.rows, len(self.sources)))
        for slot, source in enumerate(self.sources):
            if source.constant is not None:
                angles[:, slot] = source.constant
                continue
            value = parameters[source.parameter]
            if (
                not source.broadcast
                and type(value) is np.ndarray
                and value.dtype.kind == "f"
                and value.size > source.element
            ):
                angles[:, slot] = value.item(source.element)  # the usual case: real data
            elif type(value) is float and source.element == 0 and not source.broadcast:
                angles[:, slot] = value
            else:
                angles[:, slot] = _angle_rows(value, source)
        return angles


@dataclasses.dataclass(frozen=True, eq=False)
class CallData:
    """What one call of a plan runs with: the rotations' angles (1 or B, slots), the
    matrices of the sequence's matrix slots, and the call's compilation where the plan
    ``recompiles`` (its initial state; the general path's sweep reads it too)."""

    parameters: Sequence | None
    """One value per operation parameter; None for a call given by its angles only, which
    is all the direct VJP reads (the general path's needs them: ``DirectRun.
    with_parameters``)."""
    angles: np.ndarray
    matrices: tuple
    compilation: Compilation | None


def call_data(
    plan: DirectPlan, parameters: Sequence, tape: QuantumScript | None = None
) -> CallData | None:
    """The data of a call with ``parameters`` (one value per operation parameter, in tape
    order; ``tape``: the tape they are of, where there is one, whose own operations serve
    the compilation, see ``Structure.compile``), or None where the tape compiled otherwise
    than its structure (it takes the general path)."""
    plan.structure.check_count(parameters)
    if not plan.recompiles:
        return CallData(parameters, plan.angles(parameters), (), None)
    compilation = plan.structure.compile(parameters, tape)
    if compilation.memo is None:  # compiled on its own: its steps are not the plan's
        return None
    angles = plan.forward.angles(compilation)
    return CallData(parameters, angles, tuple(plan.forward.matrices(compilation)), compilation)


def slot_angle(value, source: _AngleSource) -> float:
    """The angle of a rotation slot that is not broadcast (``DirectPlan.sources``) from its
    parameter's ``value``, as ``DirectPlan.angles`` reads it."""
    return float(_angle_rows(value, source)[0])


def _angle_rows(value, source: _AngleSource) -> np.ndarray:
    """The angles of ``source`` from its parameter's ``value``, as ``Structure.compile``
    reads them (``structures._AngleRule.data``: complex values with a zero imaginary part
    taken as real, others refused)."""
    angles = real_angles(value, source.name)
    rows = angles.reshape((angles.shape[0], -1) if source.broadcast else (1, -1))
    return rows[:, source.element]


def plan_of(backend: Backend, structure: Structure) -> DirectPlan | None:
    """The structure's ``DirectPlan``, or None where its calls take the general path;
    built on the first call and kept in the structure's memo."""
    memo = structure.compilation.memo
    if _DIRECT not in memo:
        memo[_DIRECT] = _build(backend, structure)
    return memo[_DIRECT]


def _build(backend: Backend, structure: Structure) -> DirectPlan | None:
    compilation = structure.compilation
    register = compilation.register
    if structure.has_mid_measurements or any(
        ins.kind is Kind.POSTSELECT for step in compilation.steps for ins in step.instructions
    ):  # a postselection: the eager sweep alone steps back through it
        return None
    forward = sequences.forward_plan(backend, compilation)
    if forward is None:
        return None
    pauli = measure.pauli_plan(register, structure.template.measurements, compilation.memo)
    if None in pauli.terms or any(
        isinstance(coefficient, complex) for terms in pauli.terms for _, coefficient in terms
    ):  # the general path refuses to differentiate what is not Hermitian
        return None
    circuit = DifferentiatedTape(structure.template, structure.device_wires, compilation)
    if circuit.entry_columns or circuit.state_columns is not None:
        return None  # differentiated by entries, which the eager sweep alone takes
    recompiles = bool(structure.rebuilt_operations) or register.initial_state is not None
    rules = structure.angle_rules
    sources = []
    for step_index, instruction_index in () if recompiles else forward.angle_sources:
        step = compilation.steps[step_index]
        rule = rules.get(step_index)
        if rule is not None:
            sources.append(_AngleSource(rule.parameter, rule.element, rule.broadcast, rule.name))
        elif step.origin.parameter is None or not step.operation.data:
            constant = np.asarray(step.instructions[instruction_index].data, dtype=np.float64)
            sources.append(_AngleSource(-1, 0, False, step.operation.name, constant))
        else:
            return None
    rows = register.batch_size if forward.broadcast_angles else 1
    weights = np.zeros((len(pauli.terms), len(pauli.words)), dtype=np.complex128)
    for m, sentence in enumerate(pauli.terms):
        for column, coefficient in sentence:
            weights[m, column] += coefficient
    return DirectPlan(structure, forward, tuple(sources), recompiles, rows, pauli, weights, circuit)


@dataclasses.dataclass(eq=False)
class DirectRun:
    """What ``forward`` hands to ``vjp``: per structure its plan, the call's data and its
    final state (consumed by the first VJP; a second one simulates again)."""

    plans: tuple[DirectPlan, ...]
    calls: tuple[CallData, ...]
    states: list[StateBatch | None]

    def with_parameters(self, parameters: Sequence[Sequence]) -> DirectRun:
        """This run (its states with it) with each call's parameters set (a run of
        ``CuStateVecDevice.run_direct`` has its angles only), for the general path."""
        calls = tuple(
            dataclasses.replace(call, parameters=values)
            for call, values in zip(self.calls, parameters, strict=True)
        )
        return DirectRun(self.plans, calls, self.states)

    def take_state(self, index: int) -> StateBatch | None:
        state, self.states[index] = self.states[index], None
        return state

    def kept_state(self, index: int) -> KeptState:
        """Structure ``index``'s final state (None where a VJP took it) with its
        compilation, for the general path's sweep (which simulates a missing state)."""
        call = self.calls[index]
        compilation = call.compilation
        if compilation is None:
            compilation = self.plans[index].structure.compile(call.parameters)
        return KeptState(self.take_state(index), compilation)


@dataclasses.dataclass(frozen=True, eq=False)
class DirectKept:
    """One tape's part of a ``DirectRun``, which the device keeps between ``execute`` and
    the derivatives that follow (as it keeps a ``KeptState`` for the general path)."""

    run: DirectRun
    index: int

    @property
    def broadcast(self) -> bool:
        return self.run.plans[self.index].structure.compilation.register.broadcast

    # ``runs.Kept``: what the backward pass asks of a kept tape, either path

    def general(self) -> KeptState:
        """As the general path's sweeps take it (``DirectRun.kept_state``)."""
        return self.run.kept_state(self.index)

    def direct_vjp(self, backend: Backend, cotangents) -> tuple | None:
        """``vjp`` of this tape (None: the general path's)."""
        return vjp(backend, self.run, self.index, cotangents)

    def spent(self) -> DirectKept:
        """Itself: the run gives its state once and simulates again afterwards."""
        return self


def plans_of(backend: Backend, structures: Sequence[Structure]) -> tuple[DirectPlan, ...] | None:
    """The plans of ``structures``, or None where one of them has none (then the call
    takes the general path, which batches its structures as it does tapes)."""
    plans = []
    for structure in structures:
        plan = plan_of(backend, structure)
        if plan is None:
            return None
        plans.append(plan)
    return tuple(plans)


def forward(
    backend: Backend,
    plans: Sequence[DirectPlan],
    calls: Sequence[CallData],
    keep: bool = True,
) -> tuple[tuple, DirectRun]:
    """The results of each plan's structure for its call's data (``call_data``), as
    ``execute`` gives them for the tapes, and the run for ``vjp`` (holding the final
    states where ``keep``; the caller checked that they fit in memory together,
    ``state_bytes``)."""
    results, states = [], []
    for plan, call in zip(plans, calls, strict=True):
        state = _initial_state(backend, plan, call)
        words = backend.run_sequence_measured(
            state, plan.forward.prepared, call.angles, call.matrices, plan.pauli.words
        )
        results.append(_results(plan, measure.sentence_values(plan.pauli, words, len(words))))
        states.append(state if keep else None)
    return tuple(results), DirectRun(tuple(plans), tuple(calls), states)


def state_bytes(backend: Backend, plans: Sequence[DirectPlan]) -> int:
    """The bytes of the final states of ``plans``, all kept."""
    return sum(
        simulate.state_bytes(backend, register.num_qubits, register.batch_size)
        for register in (plan.structure.compilation.register for plan in plans)
    )


def _initial_state(backend: Backend, plan: DirectPlan, call: CallData) -> StateBatch:
    """|0...0>, or the call's prepared state; the memory checked first."""
    register = (call.compilation or plan.structure.compilation).register
    return simulate.initial_state(backend, register, register.batch_size)


def _final_state(backend: Backend, plan: DirectPlan, call: CallData) -> StateBatch:
    state = _initial_state(backend, plan, call)
    backend.run_sequence(state, plan.forward.prepared, call.angles, call.matrices)
    return state


def _results(plan: DirectPlan, values: list[np.ndarray]):
    """One tape's results from its measurements' values (B,) each: bare for one
    measurement, a tuple for several; a scalar each unless broadcast (``execution``)."""
    broadcast = plan.structure.compilation.register.broadcast
    per_measurement = [value if broadcast else value[0] for value in values]
    return per_measurement[0] if len(per_measurement) == 1 else tuple(per_measurement)


def vjp(backend: Backend, run: DirectRun, index: int, cotangents) -> tuple | None:
    """The VJP of structure ``index`` of ``run`` for its cotangents (as ``compute_vjp``
    takes them for its tape: a batch of K with a leading axis K), in the deferred mode
    (the eager mode's sweep is the general path's); None where the sweep is not one gate
    sequence (``DirectPlan.sweep``): the general path's then."""
    plan = run.plans[index]
    circuit = plan.circuit
    sweep = plan.sweep(backend) if circuit.n_params else None
    if circuit.n_params and sweep is None:
        return None
    dy = _plain_cotangents(plan, cotangents)
    batched = False
    if dy is not None:  # one cotangent: c[b, 0, k] = 2 sum_m dy[m, b] W[m, k]
        if circuit.n_params == 0:
            return ()
        coefficients = (2.0 * dy.T @ plan.weights)[:, None, :]
    else:
        rows = cotangent_batch(circuit, cotangents)
        batched = rows is not None
        if not batched:
            rows = [checked_cotangents(circuit, cotangents)]
        if circuit.n_params == 0:
            return ()
        coefficients = _bra_coefficients(plan, rows)
    gradients = _swept(backend, run, index, sweep, coefficients)
    if batched:
        return stacked_gradients(circuit, gradients)
    return tuple(circuit.fold(gradients[0]))


@dataclasses.dataclass(frozen=True, eq=False)
class ForwardJacobian:
    """``forward`` of one plan on one vector and the Jacobian of its M measurements by
    gradient column, (M, columns), in one backend call with everything but the angles
    bound once per structure (``Backend.bind_sequence_jacobian``, ``forward_jacobian_of``):
    the forward pass, then one deferred sweep of the M bras of the unit cotangents (bra
    m: c_mk = 2 W[m, k]), which consumes the final state. For a structure with trainable
    parameters whose sweep is one gate sequence (``DirectPlan.sweep``)."""

    backend: Backend
    plan: DirectPlan
    run: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    """The bound backend call: angles (1, slots) -> the words' values (K,), (M, columns)."""

    def __call__(self, angles: np.ndarray) -> tuple[object, np.ndarray]:
        """The results for the rotation angles ``angles`` (1, slots), as ``forward``
        gives them, and the Jacobian (M, columns); the memory checked first (the vector
        and the M bras, and a scratch)."""
        plan = self.plan
        register = plan.structure.compilation.register
        simulate.require_memory(self.backend, register.num_qubits, len(plan.pauli.terms) + 2)
        values, jacobian = self.run(angles)
        measured = measure.sentence_values(plan.pauli, values[None, :], 1)
        return _results(plan, measured), jacobian


def forward_jacobian_of(backend: Backend, plan: DirectPlan) -> ForwardJacobian:
    """The plan's ``ForwardJacobian`` (kept in its structure's memo)."""
    memo = plan.structure.compilation.memo
    bound = memo.get(_DIRECT_JACOBIAN)
    if bound is not None:
        return bound
    sweep = plan.sweep(backend)
    register = plan.structure.compilation.register
    if sweep is None or not plan.circuit.n_params or register.broadcast or plan.recompiles:
        raise ValueError(
            "direct.forward_jacobian: the structure has no direct sweep from |0...0> (its "
            "parameters are read by angle rules, one vector)"
        )
    run = backend.bind_sequence_jacobian(
        register.num_qubits,
        plan.forward.prepared,
        sweep.prepared,
        plan.pauli.words,
        (2.0 * plan.weights)[None, :, :],
        plan.circuit.n_columns,
    )
    bound = memo[_DIRECT_JACOBIAN] = ForwardJacobian(backend, plan, run)
    return bound


def forward_jacobian(
    backend: Backend, plan: DirectPlan, call: CallData
) -> tuple[object, DirectRun, np.ndarray]:
    """``ForwardJacobian`` of ``plan`` for ``call`` (its angles; no prepared state, no
    matrices): the results, the run (holding no state: a VJP of it simulates again) and
    the Jacobian (M, columns)."""
    result, jacobian = forward_jacobian_of(backend, plan)(call.angles)
    return result, DirectRun((plan,), (call,), [None]), jacobian


def _swept(
    backend: Backend,
    run: DirectRun,
    index: int,
    sweep: sequences.SequencePlan,
    coefficients: np.ndarray,
) -> np.ndarray:
    """(R, columns): the gradient columns of the R bras of ``coefficients`` (B, R, K)
    (module docstring), summed over the vectors of a broadcast; structure ``index``'s
    final state taken from ``run`` (simulated again where an earlier sweep took it)."""
    plan = run.plans[index]
    circuit = plan.circuit
    if not coefficients.any():
        return np.zeros((coefficients.shape[1], circuit.n_columns))
    call = run.calls[index]
    phi = run.take_state(index)
    if phi is None:  # taken by an earlier VJP of this run: simulated again
        phi = _final_state(backend, plan, call)
    register = plan.structure.compilation.register
    rows_swept = register.batch_size * (coefficients.shape[1] + 1)  # bras, and a scratch
    simulate.require_memory(backend, register.num_qubits, rows_swept)
    swept = backend.sweep_sequence_from_words(
        phi,
        sweep.prepared,
        call.angles,
        call.matrices,
        plan.pauli.words,
        coefficients,
        circuit.n_columns,
    )
    return swept[0] if swept.shape[0] == 1 else swept.sum(axis=0)


def _plain_cotangents(plan: DirectPlan, cotangents) -> np.ndarray | None:
    """dy[m, b]: one real cotangent per measurement (each a scalar, or one per vector of
    a broadcast: its result's shape), or None (None entries, a batch of cotangents,
    anything else: what ``cotangent_batch`` and ``checked_cotangents`` read or refuse).
    The usual backward pass, read without the general checks."""
    batch = plan.structure.compilation.register.batch_size
    per_measurement = (cotangents,) if len(plan.pauli.terms) == 1 else cotangents
    if any(value is None for value in per_measurement):
        return None
    try:
        dy = np.asarray(per_measurement)
    except ValueError:  # ragged shapes
        return None
    shape = (len(plan.pauli.terms),) + ((batch,) if batch > 1 else ())
    if dy.shape != shape or dy.dtype.kind not in "fi":
        return None
    return dy.reshape(shape[0], batch).astype(np.float64, copy=False)


def _bra_coefficients(plan: DirectPlan, rows: list[tuple]) -> np.ndarray:
    """c[b, r, k] = 2 sum_m dy_rm[b] W[m, k]: the weight of P_k psi_b in bra r of vector
    b (b over a broadcast's vectors, else one), (B, R, K) complex128."""
    batch = plan.structure.compilation.register.batch_size
    dy = np.zeros((len(rows), len(plan.pauli.terms), batch))
    for r, row in enumerate(rows):
        for m, value in enumerate(row):
            if value is not None:
                dy[r, m] = value  # a scalar, or one per vector of a broadcast
    return 2.0 * np.einsum("rmb,mk->brk", dy, plan.weights)
