"""One tape through the layers: compile, simulate, measure, and nest results as PennyLane expects.

Nesting: one measurement is returned bare, several as a tuple; a shot vector adds an
outer tuple over its partitions; a broadcast tape adds a trailing batch axis to each
measurement's result (tape -> shot partition -> measurement -> batch).
"""

from __future__ import annotations

import numpy as np
from pennylane.measurements import MeasurementProcess
from pennylane.tape import QuantumScript
from pennylane.wires import Wires

from . import measure, simulate
from .backends.base import Backend
from .program import Kind, Program, compile_tape

SHOT_BATCH_BYTES = 1 << 30
"""Memory budget for the state vectors of one chunk of shots with mid-circuit measurements."""


def run_tape(
    backend: Backend, tape: QuantumScript, device_wires: Wires | None, rng: np.random.Generator
):
    """The result of ``tape``."""
    program = compile_tape(tape, device_wires)
    if any(ins.kind is Kind.MID_MEASURE for ins in program.instructions):
        return _run_one_shot(backend, program, tape, rng)
    state = simulate.final_state(backend, program)
    if tape.shots:
        return _sampled_results(backend, state, program, tape, rng)
    results = [measure.measure_analytic(backend, state, program, mp) for mp in tape.measurements]
    return _nest(tape, [_unbatch(tape, r) for r in results])


def _unbatch(tape: QuantumScript, result: np.ndarray):
    return result if tape.batch_size is not None else result[0]


def _nest(tape: QuantumScript, per_measurement: list):
    return per_measurement[0] if len(tape.measurements) == 1 else tuple(per_measurement)


def _sampled_results(backend, state, program: Program, tape: QuantumScript, rng):
    measure.rotate_to_eigenbases(backend, state, program, tape.measurements)
    samples = measure.computational_basis_samples(
        backend, state, program, tape.shots.total_shots, rng
    )
    partitions = []
    for lower, upper in tape.shots.bins():
        per_measurement = [
            _stack_batch(tape, [_process(mp, s[lower:upper], program) for s in samples])
            for mp in tape.measurements
        ]
        partitions.append(_nest(tape, per_measurement))
    return tuple(partitions) if tape.shots.has_partitioned_shots else partitions[0]


def _process(mp: MeasurementProcess, samples: np.ndarray, program: Program):
    return mp.process_samples(samples, wire_order=program.wires)


def _stack_batch(tape: QuantumScript, values: list):
    if tape.batch_size is None:
        return values[0]
    if isinstance(values[0], dict):
        return tuple(values)
    return np.stack(values)


def _run_one_shot(backend, program: Program, tape: QuantumScript, rng):
    """Shots of a circuit with native mid-circuit measurements (the "one-shot" method):
    the device receives a tape with shots ``[1] * N`` and returns one result per shot."""
    per_shot = []
    total = tape.shots.total_shots
    chunk = max(1, SHOT_BATCH_BYTES // simulate.state_bytes(backend, program.num_qubits, 1))
    for start in range(0, total, chunk):
        count = min(chunk, total - start)
        state, outcomes = simulate.final_state_per_shot(backend, program, count, rng)
        measure.rotate_to_eigenbases(backend, state, program, tape.measurements)
        samples = measure.computational_basis_samples(backend, state, program, 1, rng)
        for shot in range(count):
            per_shot.append(
                _nest(
                    tape,
                    [
                        _shot_result(mp, samples[shot], outcomes, shot, program)
                        for mp in tape.measurements
                    ],
                )
            )
    return tuple(per_shot)


def _shot_result(mp: MeasurementProcess, samples, outcomes: dict, shot: int, program: Program):
    if mp.mv is not None:
        return outcomes[mp.mv.measurements[0]][shot]
    return _process(mp, samples, program)
