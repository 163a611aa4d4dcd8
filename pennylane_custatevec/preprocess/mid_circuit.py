"""Mid-circuit measurements and snapshots: measurements in other bases as Z-basis ones,
measured values as observables on the wires that hold them (for the adjoint method, after
``defer_measurements``), the one-shot method where there are shots, and ``qml.Snapshot``
as circuits of their own under ``qml.snapshots``."""

from __future__ import annotations

import copy

import numpy as np
import pennylane as qml
from pennylane.exceptions import DeviceError
from pennylane.measurements import (
    ExpectationMP,
    MeasurementValue,
    ProbabilityMP,
    StateMP,
    VarianceMP,
)
from pennylane.operation import Operator
from pennylane.ops import Conditional, MidMeasure, PauliMeasure
from pennylane.queuing import QueuingManager
from pennylane.tape import QuantumScript
from pennylane.transforms import defer_measurements
from pennylane.transforms.core import transform
from pennylane.wires import Wires

from .common import first_result, is_dynamic_type, is_in_other_basis


@transform
def measure_in_computational_bases(tape: QuantumScript):
    r"""Mid-circuit measurements in other bases (``qml.ftqc``'s ``ParametricMidMeasure``:
    ``measure_x``, ``measure_y``, ``measure_arbitrary_basis``; Pauli product measurements,
    ``qml.pauli_measure``) as Z-basis measurements.

    A measurement in the eigenbasis of :math:`U^\dagger Z U` (U: the measurement's
    ``diagonalizing_gates``) is U, then a Z-basis measurement. The measured qubit is left in
    the computational basis state of the outcome, :math:`|m\rangle`, not rotated back: that is
    PennyLane's convention (``qml.ftqc.diagonalize_mcms``, which its documentation asks for
    before execution, and default.qubit's one-shot and tree-traversal methods without it; its
    ftqc tests read ``Z`` of the measured wire afterwards and expect the outcome's sign).

    A Pauli product measurement of P (``_pauli_product_as_parity``) is V, a Z-basis
    measurement of one of its wires, then :math:`V^\dagger`, where V takes P to Z on that
    wire: the state is projected onto P's eigenspace of the outcome
    (:math:`(I + (-1)^m P)/2`, renormalised), as ``pauli_measure`` documents. PennyLane
    0.45 executes it nowhere (default.qubit: a KeyError in ``defer_measurements``
    without shots, "not supported" with shots).

    ``qml.ftqc.cond_measure`` records two conditionals on one wire, the true branch's
    measurement under its condition and the false branch's under the inverse: they become
    each branch's basis change under its condition and one Z-basis measurement. A measurement
    value that names replaced measurements is rebuilt over their replacements, a measurement
    it names twice (both branches of one ``cond_measure``) once, so the deferred method does
    not see the same measurement twice.

    This is ``diagonalize_mcms`` without its two faults for a device: it writes the new
    measurements into the original tape's measurement values (a shallow copy), and a value
    built over both branches of a ``cond_measure`` names the new measurement twice. Without
    the transform the deferred method would measure such a measurement in the Z basis:
    silently wrong (default.qubit's deferred method rejects it only by an unrelated wire
    error).
    """
    if not _needs_computational_bases(tape):
        return (tape,), first_result
    replacements: list[tuple[MidMeasure, MidMeasure]] = []  # (original, Z-basis), by identity

    def rebuilt(value):
        if isinstance(value, list | tuple):
            return [rebuilt(v) for v in value]
        return _over_replacements(value, replacements)

    operations: list[Operator] = []
    ops = tape.operations
    index = 0
    with QueuingManager.stop_recording():
        while index < len(ops):
            op = ops[index]
            if isinstance(op, Conditional) and isinstance(op.base, MidMeasure):
                if index + 1 == len(ops) or not _pairs_with(op, ops[index + 1]):
                    raise DeviceError(
                        f"A mid-circuit measurement applied conditionally ({op.base}) must come "
                        "from qml.ftqc.cond_measure, which measures the same wire in both "
                        "branches; measure unconditionally, or use cond_measure."
                    )
                branches = (op, ops[index + 1])
                measured = _z_measurement(op.base)
                for branch in branches:
                    condition = rebuilt(branch.meas_val)
                    operations.extend(Conditional(condition, g) for g in _basis_change(branch))
                operations.append(measured)
                replacements.extend((branch.base, measured) for branch in branches)
                index += 2
                continue
            if is_in_other_basis(op):
                measured = _z_measurement(op)
                operations.extend(op.diagonalizing_gates())
                operations.append(measured)
                replacements.append((op, measured))
            elif isinstance(op, PauliMeasure):
                to_parity, measured = _pauli_product_as_parity(op)
                operations.extend(to_parity)
                operations.append(measured)
                operations.extend(qml.adjoint(g, lazy=False) for g in reversed(to_parity))
                replacements.append((op, measured))
            elif isinstance(op, Conditional):
                condition = rebuilt(op.meas_val)
                operations.append(
                    op if condition is op.meas_val else Conditional(condition, op.base)
                )
            else:
                operations.append(op)
            index += 1
        measurements = []
        for mp in tape.measurements:
            if mp.mv is None:
                measurements.append(mp)
                continue
            value = rebuilt(mp.mv)
            if value is mp.mv:
                measurements.append(mp)
                continue
            renamed = copy.copy(mp)  # its options (all_outcomes, dtype) stay; mv is replaced
            renamed.mv = value
            measurements.append(renamed)
    return (tape.copy(operations=operations, measurements=measurements),), first_result


def _needs_computational_bases(tape: QuantumScript) -> bool:
    """A measurement in another basis, a conditional measurement, or a measurement value
    that names one measurement twice (``diagonalize_mcms``'s output for a
    ``cond_measure``, applied by the user: its ``v1 or v2`` takes scalars, and one-shot
    evaluates values over arrays of outcomes). Every tape passes here: one lookup by
    type per operation."""
    dynamic = [op for op in tape.operations if is_dynamic_type(type(op))]
    values = [op.meas_val for op in dynamic if isinstance(op, Conditional)]
    for mp in tape.measurements:
        if isinstance(mp.mv, list | tuple):
            values.extend(mp.mv)
        elif mp.mv is not None:
            values.append(mp.mv)
    if not dynamic and not values:
        return False
    return any(_measures_off_z(op) for op in dynamic) or any(map(_names_twice, values))


def _names_twice(value: MeasurementValue) -> bool:
    return len({id(m) for m in value.measurements}) < len(value.measurements)


def _measures_off_z(op: Operator) -> bool:
    """A measurement in another basis (a Pauli product's too), or a conditional
    measurement (cond_measure's)."""
    if isinstance(op, Conditional):
        return isinstance(op.base, MidMeasure)
    return isinstance(op, PauliMeasure) or is_in_other_basis(op)


def _pairs_with(true_branch: Conditional, false_branch: Operator) -> bool:
    """cond_measure's two conditionals: measurements of one wire with the same reset and
    postselection."""
    return (
        isinstance(false_branch, Conditional)
        and isinstance(false_branch.base, MidMeasure)
        and false_branch.base.wires == true_branch.base.wires
        and false_branch.base.reset == true_branch.base.reset
        and false_branch.base.postselect == true_branch.base.postselect
    )


def _pauli_product_as_parity(op: PauliMeasure) -> tuple[list[Operator], MidMeasure]:
    r"""The gates V that take the Pauli word P of ``op`` to Z on its last wire t
    (:math:`V P V^\dagger = Z_t`), and the Z-basis measurement of t that stands for ``op``
    (same postselection and uid). Each X becomes Z by H, each Y by :math:`H S^\dagger`
    (:math:`S^\dagger Y S = X`); then CNOTs from the other wires onto t take
    :math:`Z_1 \cdots Z_k` to :math:`Z_t`, so t's outcome is the word's parity: 0 for the
    eigenvalue +1, 1 for -1, PennyLane's convention."""
    to_z: list[Operator] = []
    for pauli, wire in zip(op.pauli_word, op.wires, strict=True):
        if pauli == "Y":
            to_z.append(qml.adjoint(qml.S(wire)))
        if pauli in "XY":
            to_z.append(qml.H(wire))
    target = op.wires[-1]
    to_z.extend(qml.CNOT([wire, target]) for wire in op.wires[:-1])
    return to_z, MidMeasure(target, postselect=op.postselect, meas_uid=op.meas_uid)


def _z_measurement(op: MidMeasure) -> MidMeasure:
    """The Z-basis measurement that stands for ``op``: same wire, reset, postselection and
    uid (results keyed by it keep their keys)."""
    return MidMeasure(op.wires, reset=op.reset, postselect=op.postselect, meas_uid=op.meas_uid)


def _basis_change(branch: Conditional) -> list[Operator]:
    measurement = branch.base
    if is_in_other_basis(measurement):
        return measurement.diagonalizing_gates()
    return []


def _over_replacements(value, replacements):
    """``value`` over the replacements of its measurements, each distinct one once, its
    processing applied outcome by outcome to arrays; the value itself when it names none
    of them and no measurement twice."""
    named = [next((new for old, new in replacements if old is m), m) for m in value.measurements]
    unchanged = all(new is m for new, m in zip(named, value.measurements, strict=True))
    if unchanged and not _names_twice(value):
        return value
    distinct: list = []
    for m in named:
        if not any(m is d for d in distinct):
            distinct.append(m)
    positions = [next(i for i, d in enumerate(distinct) if d is m) for m in named]
    processing = value.processing_fn

    def over_distinct(*outcomes):
        spread = [outcomes[i] for i in positions]
        if any(np.ndim(outcome) for outcome in spread):
            # one-shot passes arrays of outcomes; cond_measure's ``v1 or v2`` takes scalars
            return np.vectorize(processing)(*spread)
        return processing(*spread)

    return MeasurementValue(distinct, over_distinct)


@transform
def snapshots_as_circuits(tape: QuantumScript, debugger, deferred: bool = False):
    """Under ``qml.snapshots`` (``debugger`` active): each ``qml.Snapshot`` becomes a
    circuit of the operations before it that measures the snapshot's measurement, analytic
    or with its shots (``"workflow"``: the tape's), with no trainable parameters; the
    results go into ``debugger.snapshots`` as default.qubit stores them (a tag seen again
    collects a list), and the tape's own result, its snapshots removed, is returned. A
    device-side split, unlike PennyLane's fallback for devices without a debugger, so
    that a state snapshot of a circuit with shots is the exact state, as on
    default.qubit.

    With ``deferred`` (``mcm_method="deferred"``) a state snapshot after mid-circuit
    measurements is the state of the deferred circuit, its measurements' wires included,
    as default.qubit records it (``_deferred_operations``): PennyLane's
    ``defer_measurements`` refuses a state measurement."""
    if debugger is None or not debugger.active:
        return (tape,), first_result
    snapshots = [i for i, op in enumerate(tape.operations) if isinstance(op, qml.Snapshot)]
    if not snapshots:
        return (tape,), first_result
    operations = [op for op in tape.operations if not isinstance(op, qml.Snapshot)]
    tapes, tags = [], []
    for count, index in enumerate(snapshots):
        op = tape.operations[index]
        shots = op.hyperparameters["shots"]
        shots = tape.shots if shots == "workflow" else shots
        before = operations[: index - count]
        measurement = op.hyperparameters["measurement"]
        if deferred and type(measurement) is StateMP and not shots:
            before = _deferred_operations(before)
        tapes.append(
            tape.copy(
                operations=before, measurements=[measurement], shots=shots, trainable_params=[]
            )
        )
        tags.append(op.tag)
    tapes.append(tape.copy(operations=operations))

    def record(results):
        for tag, snapshot in zip(tags, results[:-1], strict=True):
            _store_snapshot(debugger, tag, snapshot)
        return results[-1]

    return tapes, record


def _deferred_operations(operations: list[Operator]) -> list[Operator]:
    """``operations`` with their mid-circuit measurements deferred (PennyLane's
    ``defer_measurements``, as the device's preprocessing runs it), for a state snapshot:
    the state then spans the measurements' wires too."""
    if not any(isinstance(op, MidMeasure) for op in operations):
        return operations
    wires = Wires.all_wires([op.wires for op in operations])
    probe = QuantumScript(operations, [qml.probs(wires=wires)])
    (deferred,), _ = defer_measurements(probe, allow_postselect=True)
    return deferred.operations


def _store_snapshot(debugger, tag, snapshot) -> None:
    """default.qubit's storage (``apply_snapshot``): an untagged snapshot under the next
    index; a tag seen again collects a list."""
    if tag is None:
        debugger.snapshots[len(debugger.snapshots)] = snapshot
    elif tag not in debugger.snapshots:
        debugger.snapshots[tag] = snapshot
    elif isinstance(debugger.snapshots[tag], list):
        debugger.snapshots[tag].append(snapshot)
    else:
        debugger.snapshots[tag] = [debugger.snapshots[tag], snapshot]


@transform
def one_shot_where_sampled(tape: QuantumScript, postselect_mode: str | None = None):
    """PennyLane's ``dynamic_one_shot`` for a tape with shots, and nothing for one without:
    ``mcm_method="tree-traversal"`` samples as the one-shot method (the same distribution,
    shot by shot, in memory of a chunk of shots) and follows every branch analytically
    (``branches.py``)."""
    if not tape.shots:
        return (tape,), first_result
    return qml.transforms.dynamic_one_shot(tape, postselect_mode=postselect_mode)


MAX_MEASURED_VALUE_WIRES = 10
"""The most deferred measurements a measured value of them may combine for
``measure_mid_circuit_values_on_their_wires`` (its Z sentence has up to 2**k words)."""


@transform
def measure_mid_circuit_values_on_their_wires(tape: QuantumScript):
    r"""For the adjoint method, after ``defer_measurements``: measure what a tape returns of
    mid-circuit measurement values on the wires that hold them.

    Deferred, measurement k's outcome is the computational basis value :math:`b_k` of its
    wire (which later gates only control on), so, with :math:`e_b` the value's
    eigenvalues (``mp.eigvals()``, over the measurements' wires in order):

    * ``expval(f(m))`` and ``var(f(m))`` are those of the diagonal observable
      :math:`D = \sum_b e_b |b\rangle\langle b|`, written exactly as a sum of Z words,
      :math:`D = \sum_S c_S Z_S` with :math:`c_S = 2^{-k} \sum_b e_b (-1)^{|b \cap S|}`
      (a Walsh-Hadamard transform), which the adjoint sweep differentiates;
    * ``probs(op=[m0, m1, ...])`` of bare measurements is ``probs`` of their wires.

    PennyLane's parameter-shift, which "best" took for such tapes, fails on ``var`` of a
    measured value (``AttributeError: 'NoneType' object has no attribute 'name'``, on
    default.qubit too). A tape that still holds mid-circuit measurements (another
    ``mcm_method``), a value of more than ``MAX_MEASURED_VALUE_WIRES`` measurements, and
    other measurements of values (``probs`` of a computed value, samples, counts) pass
    unchanged, and the adjoint method refuses them by name as before."""
    if not any(mp.mv is not None for mp in tape.measurements) or any(
        isinstance(op, MidMeasure) for op in tape.operations
    ):
        return (tape,), first_result
    measurements = [_on_their_wires(mp) for mp in tape.measurements]
    if all(new is old for new, old in zip(measurements, tape.measurements, strict=True)):
        return (tape,), first_result
    return (tape.copy(measurements=measurements),), first_result


def _on_their_wires(mp):
    """``mp`` measured on its values' wires (``measure_mid_circuit_values_on_their_wires``),
    or ``mp`` itself."""
    if mp.mv is None or len(mp.wires) > MAX_MEASURED_VALUE_WIRES:
        return mp
    if isinstance(mp, ProbabilityMP):
        values = mp.mv if isinstance(mp.mv, list) else [mp.mv]
        bare = all(
            isinstance(v, MeasurementValue) and not v.has_processing and len(v.measurements) == 1
            for v in values
        )
        return qml.probs(wires=mp.wires) if bare else mp
    if isinstance(mp, (ExpectationMP, VarianceMP)) and isinstance(mp.mv, MeasurementValue):
        observable = _diagonal_as_z_words(np.asarray(mp.eigvals(), dtype=float), mp.wires)
        return type(mp)(obs=observable)
    return mp


def _diagonal_as_z_words(eigenvalues: np.ndarray, wires: Wires) -> Operator:
    """The diagonal observable with ``eigenvalues`` on ``wires`` (the first wire the most
    significant bit) as a sum of Z words (``measure_mid_circuit_values_on_their_wires``)."""
    k = len(wires)
    coefficients = eigenvalues.reshape((2,) * k)
    for axis in range(k):  # Walsh-Hadamard along each bit: (e0 + e1, e0 - e1) / 2
        first, second = np.take(coefficients, 0, axis=axis), np.take(coefficients, 1, axis=axis)
        coefficients = np.stack([(first + second) / 2, (first - second) / 2], axis=axis)
    sentence = qml.pauli.PauliSentence()
    for index in np.ndindex(*coefficients.shape):
        coefficient = float(coefficients[index])
        if coefficient != 0.0:
            word = {wires[j]: "Z" for j, bit in enumerate(index) if bit}
            sentence[qml.pauli.PauliWord(word)] = coefficient
    if not sentence:
        sentence[qml.pauli.PauliWord({})] = 0.0
    return sentence.operation(wire_order=wires)
