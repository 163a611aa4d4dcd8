"""One tape through the layers: compile, simulate, measure, and nest results as PennyLane expects.

Nesting: one measurement is returned bare, several as a tuple; a shot vector adds an
outer tuple over its partitions; a broadcast tape adds a trailing batch axis to each
measurement's result (tape -> shot partition -> measurement -> batch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
from pennylane.exceptions import DeviceError
from pennylane.measurements import CountsMP, MeasurementProcess, ProbabilityMP
from pennylane.tape import QuantumScript
from pennylane.wires import Wires

from . import batching, branches, fused_units, fusion, measure, sequences, simulate
from .backends.base import Backend
from .compile_tapes import compile_steps
from .exact import measurements_key
from .instructions import Kind
from .kept import KeptState
from .program import Compilation, Program, Register, flatten, merge, tape_batch_size


@dataclasses.dataclass(frozen=True, eq=False)
class PreparedTape:
    """A tape compiled before ``run_tapes`` (by its structure, ``structures.Structure``),
    with the key that decides which prepared tapes run as one forward batch."""

    compilation: Compilation
    """The tape's ``compile_steps``, or an equal compilation."""
    batch_key: object
    """Equal for prepared tapes that may run as one batch: their programs' kernel keys and
    their measurements are equal exactly (``_batch_key``, or a key that decides less,
    such as the structure's)."""


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What ``run_tapes`` returns."""

    results: tuple
    """The results of the tapes, in order, nested as PennyLane expects."""
    kept: Mapping[int, KeptState]
    """{tape index: its KeptState} for every analytic tape, when asked for and when the
    final states of all of them fit in free memory together; else empty."""


def run_tapes(
    backend: Backend,
    tapes: Sequence[QuantumScript],
    device_wires: Wires | None,
    rng: np.random.Generator,
    postselect_mode: str | None = None,
    keep: bool = False,
    fusion_qubits: int = 0,
    prepared: Sequence[PreparedTape | None] | None = None,
) -> RunResult:
    """The results of ``tapes``, in order, and with ``keep`` the state of each analytic
    tape for the derivatives.

    Analytic tapes whose programs share a structure and whose measurements are equal
    exactly (``exact.measurements_key``: the batch is measured with the first tape's
    measurements), such as parameter-shift tapes or several QNode calls in one
    ``qml.execute``, run as one batch of state vectors (``batching``: grouped by
    ``_batch_key``, in chunks of at most ``batching.BATCH_BYTES``); the others run one
    by one. With ``keep``, ``RunResult.kept`` holds a ``KeptState`` of every analytic
    tape (its final state, a view into its batch; its ``program.Compilation``; the fused
    plan where its batch was that tape alone), if the final states of all of them fit in
    free memory together; otherwise it stays empty (the derivatives simulate them again,
    in chunks that fit) and the batches run in chunks of at most the free memory too, as
    without ``keep`` (``batching.FORWARD``, ``batching.FORWARD_KEPT``).
    Analytic batches run fused into blocks of at most ``fusion_qubits`` qubits (see
    ``fusion``; 0 or 1: gate by gate). ``prepared[i]``: tape i compiled already (an analytic
    tape without mid-circuit measurements, by its structure), or None: compiled here.
    """
    prepared = [None] * len(tapes) if prepared is None else prepared
    results: list = [None] * len(tapes)
    items: list[PreparedTape] = []
    analytic = []
    for index, (tape, ready) in enumerate(zip(tapes, prepared, strict=True)):
        if ready is None:
            compilation = compile_steps(tape, device_wires)
            program = flatten(compilation)
            if tape.shots:
                results[index] = _run_sampled(backend, program, tape, rng, postselect_mode)
            elif program.has_mid_measurements:  # mcm_method="tree-traversal"
                values = branches.measure_tree(backend, program, tape.measurements)
                results[index] = _nest(tape, values)
            ready = PreparedTape(compilation, _BatchKey(program, tape))
        items.append(ready)
        if results[index] is None:
            analytic.append(index)
    compiled = [item.compilation for item in items]
    groups = batching.group_by(items, _prepared_key, analytic)
    registers = [c.register for c in compiled]
    state_bytes = batching.Sum(
        lambda register: simulate.state_bytes(backend, register.num_qubits, register.batch_size)
    )
    keep = keep and simulate.fits(
        backend, batching.tally_of(state_bytes, registers, analytic).bytes()
    )
    budget = batching.FORWARD_KEPT if keep else batching.FORWARD
    kept: dict[int, KeptState] = {}
    for group in groups:
        for chunk in batching.chunk_by_memory(backend, group, registers, state_bytes, budget):
            batch, states = _run_analytic_batch(
                backend,
                [tapes[i] for i in chunk.indices],
                [compiled[i] for i in chunk.indices],
                fusion_qubits,
                keep,
            )
            for position, (i, result) in enumerate(zip(chunk.indices, batch, strict=True)):
                results[i] = result
                if keep:
                    kept[i] = states[position]
    return RunResult(tuple(results), kept)


class _BatchKey:
    """The batch key of a tape compiled on its own: what the tapes of one forward batch
    share, the kernel key and the measurements exactly (the batch is measured with its
    first tape's measurements); built only when compared (``batching.group_by`` builds no
    key for a lone tape). Equal to the same pair as a structure's ``batch_key``, so that
    tapes compiled either way batch together."""

    __slots__ = ("_program", "_tape", "_key")

    def __init__(self, program: Program, tape: QuantumScript):
        self._program, self._tape, self._key = program, tape, None

    @property
    def key(self) -> tuple:
        if self._key is None:
            self._key = (self._program.kernel_key, measurements_key(self._tape.measurements))
        return self._key

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other) -> bool:
        # equal to a prepared tape's key too (a structure's, ``Structure.batch_key``)
        return self.key == (other.key if isinstance(other, _BatchKey) else other)


def _prepared_key(item: PreparedTape) -> object:
    """A prepared tape's batch key (``PreparedTape.batch_key``)."""
    return item.batch_key


def _run_analytic_batch(
    backend,
    tapes: list[QuantumScript],
    compilations: list[Compilation],
    fusion_qubits: int,
    keep: bool,
) -> tuple[list, list[KeptState]]:
    """Results of tapes that share a structure, and with ``keep`` each tape's KeptState
    (else none, so that the batch is freed on return)."""
    compilation = merge(compilations)  # a lone tape's own compilation
    register = compilation.register
    plan = None
    sequence = sequences.forward_plan(backend, compilation)
    if sequence is not None:  # a small circuit of a known structure: one backend call
        state = simulate.initial_state(backend, register, register.batch_size)
        sequences.run(backend, state, sequence, compilation)
    else:
        plan, state = _gate_by_gate(backend, compilation, fusion_qubits, keep)
    values = measure.measure_all_analytic(
        backend, state, register, tapes[0].measurements, compilation.memo
    )
    results, kept, offset = [], [], 0
    for tape, tape_compilation in zip(tapes, compilations, strict=True):
        tape_register = tape_compilation.register
        rows = slice(offset, offset + tape_register.batch_size)
        results.append(_nest(tape, [_unbatch(tape_register, v[rows]) for v in values]))
        if keep:
            own_plan = plan if plan is not None and plan.compilation is tape_compilation else None
            kept.append(
                KeptState(backend.vectors(state, rows.start, rows.stop), tape_compilation, own_plan)
            )
        offset += tape_register.batch_size
    return results, kept


def _gate_by_gate(
    backend, compilation: Compilation, fusion_qubits: int, keep: bool
) -> tuple[fused_units.FusedPlan | None, object]:
    """(the fused plan or None, the final states) of a compilation run instruction by
    instruction, fused into blocks of at most ``fusion_qubits`` qubits."""
    fusion_qubits = fusion.block_width(compilation.register, fusion_qubits, backend.fusion_traits)
    plan = None
    if fusion_qubits > 1 or keep:  # kept, the plan of one unit per step serves the sweep
        plan = fused_units.fused_plan(compilation, fusion_qubits, backend.fusion_traits)
        program = plan.program
    else:
        program = flatten(compilation)
    state, _ = simulate.final_state(backend, program)
    return plan, state


def _run_sampled(backend, program: Program, tape: QuantumScript, rng, postselect_mode):
    if not tape.measurements:  # nothing to sample: an empty result, as default.qubit's
        return ()
    if isinstance(tape.measurements[0], measure.SHADOW_MEASUREMENTS):  # alone on its tape
        return _run_shadow(backend, program, tape, rng, postselect_mode)
    if program.has_mid_measurements:
        if postselect_mode == "fill-shots" and any(
            ins.source.postselect is not None
            for ins in program.instructions
            if ins.kind is Kind.MID_MEASURE
        ):
            raise DeviceError(
                "postselect_mode='fill-shots' is only supported with mcm_method='deferred'; "
                "with mcm_method='one-shot' (or 'tree-traversal' with shots, which runs "
                "one-shot) use postselect_mode='hw-like'."
            )
        return _run_one_shot(backend, program, tape, rng)
    state, kept = simulate.final_state(backend, program)
    register = program.register
    counts = list(tape.shots)
    if kept is not None:
        counts = _postselected_shots(register, counts, kept, postselect_mode, rng)
    measure.rotate_to_eigenbases(backend, state, register, tape.measurements)
    wires = measure.sampled_wires(register, tape.measurements)
    measure.require_sample_memory(backend, register.batch_size, wires, counts, tape.measurements)
    samples = measure.computational_basis_samples(backend, state, register, wires, sum(counts), rng)
    partitions = []
    for lower, upper in _bins(counts):
        per_measurement = [
            _stack_batch(tape, [_processed(mp, s[lower:upper], wires) for s in samples])
            for mp in tape.measurements
        ]
        partitions.append(_nest(tape, per_measurement))
    return tuple(partitions) if tape.shots.has_partitioned_shots else partitions[0]


def _processed(mp: MeasurementProcess, samples: np.ndarray, wires: Wires):
    """``mp.process_samples``, but for probs and counts of no samples (every shot discarded
    by a postselection of probability 0, ``"hw-like"``), where PennyLane 0.45's processing
    raises (ValueError "cannot reshape", IndexError; on default.qubit too): probabilities
    of no shots are NaN, as an expval of no shots is, and the counts are none (with
    ``all_outcomes=True`` every outcome's count is 0)."""
    if samples.shape[0] or not isinstance(mp, (CountsMP, ProbabilityMP)):
        return mp.process_samples(samples, wires)
    one_shot = mp.process_samples(np.zeros((1, samples.shape[1]), dtype=samples.dtype), wires)
    if isinstance(mp, ProbabilityMP):
        return np.full(np.shape(one_shot), np.nan)
    return {outcome: 0 for outcome in one_shot} if mp.all_outcomes else {}


def _run_shadow(backend, program: Program, tape: QuantumScript, rng, postselect_mode):
    """A classical-shadow measurement (``measure.SHADOW_MEASUREMENTS``; the device's
    preprocessing gives each a tape of its own, not broadcast): PennyLane's
    ``process_state_with_shots`` of the final state, as default.qubit measures it (each
    shot rotated into its own random Pauli basis: not a sample of one state's basis)."""
    if program.has_mid_measurements:
        raise DeviceError(
            f"{type(tape.measurements[0]).__name__} with mid-circuit measurements needs "
            "mcm_method='deferred' (each shot of mcm_method='one-shot' ends in a state of "
            "its own)."
        )
    state, kept = simulate.final_state(backend, program)
    register = program.register
    counts = list(tape.shots)
    if kept is not None:
        counts = _postselected_shots(register, counts, kept, postselect_mode, rng)
    tensor = backend.to_host(state)[0].reshape((2,) * register.num_qubits)
    mp = tape.measurements[0]
    results = [
        mp.process_state_with_shots(tensor, register.wires, count, rng=rng) for count in counts
    ]
    return tuple(results) if tape.shots.has_partitioned_shots else results[0]


def _unbatch(register: Register, result: np.ndarray):
    return result if register.broadcast else result[0]


def _nest(tape: QuantumScript, per_measurement: list):
    return per_measurement[0] if len(tape.measurements) == 1 else tuple(per_measurement)


def _bins(counts: list[int]):
    upper = np.cumsum(counts)
    return zip(upper - counts, upper, strict=True)


def _postselected_shots(register: Register, counts, kept, postselect_mode, rng) -> list[int]:
    """Shots left after postselection: each shot survives with the kept probability
    ("hw-like", the default), or all shots are kept ("fill-shots")."""
    if register.batch_size > 1:
        raise ValueError(
            "Cannot postselect with finite shots on a broadcast circuit; split it with "
            "qml.transforms.broadcast_expand first."
        )
    probability = float(kept[0])
    if postselect_mode == "fill-shots":
        if np.isclose(probability, 0.0):
            raise RuntimeError(
                "The probability of the postselected mid-circuit measurement outcome is 0. "
                "This leads to invalid results when using postselect_mode='fill-shots'."
            )
        return counts
    return [int(rng.binomial(count, probability)) for count in counts]


def _stack_batch(tape: QuantumScript, values: list):
    if tape_batch_size(tape) is None:
        return values[0]
    if isinstance(values[0], dict):
        return list(values)
    return np.stack(values)


def _run_one_shot(backend, program: Program, tape: QuantumScript, rng):
    """Shots of a circuit with native mid-circuit measurements (the "one-shot" method):
    the device receives a tape with shots ``[1] * N`` and returns one result per shot."""
    per_shot = []
    total = tape.shots.total_shots
    register = program.register
    chunk = max(1, batching.BATCH_BYTES // simulate.state_bytes(backend, register.num_qubits, 1))
    for start in range(0, total, chunk):
        count = min(chunk, total - start)
        state, outcomes = simulate.final_state_per_shot(backend, program, count, rng)
        measure.rotate_to_eigenbases(backend, state, register, tape.measurements)
        wires = measure.sampled_wires(register, tape.measurements)
        samples = measure.computational_basis_samples(backend, state, register, wires, 1, rng)
        for shot in range(count):
            per_shot.append(
                _nest(
                    tape,
                    [
                        _shot_result(mp, samples[shot], outcomes, shot, wires)
                        for mp in tape.measurements
                    ],
                )
            )
    return tuple(per_shot)


def _shot_result(mp: MeasurementProcess, samples, outcomes: dict, shot: int, wires: Wires):
    if mp.mv is not None:
        return outcomes[mp.mv.measurements[0]][shot]
    return mp.process_samples(samples, wire_order=wires)
