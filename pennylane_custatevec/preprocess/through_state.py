"""Measuring through the state, for the adjoint method: what the sweep does not
differentiate (entropies, purity, density matrices, observables with trainable data in a
form PennyLane cannot take back) is measured as the state and computed from it in the
post-processing, where the ML framework differentiates that computation."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pennylane as qml
from pennylane import math
from pennylane.measurements import (
    DensityMatrixMP,
    ExpectationMP,
    StateMeasurement,
    StateMP,
    VarianceMP,
)
from pennylane.queuing import QueuingManager
from pennylane.tape import QuantumScript
from pennylane.transforms.core import transform
from pennylane.wires import Wires

from ..gradients.observables import MatrixDerivative, observable_derivatives
from ..gradients.validation import is_swept
from ..measure import DENSE_OBSERVABLE_WIRES, measured_on_positions
from .common import first_result


@transform
def measure_through_state(
    tape: QuantumScript, device_wires: Wires | None = None, array_gradients: bool = False
):
    """For the adjoint method: measure the state in place of what the sweep does not
    differentiate, and compute those results from it in the post-processing, where the ML
    framework differentiates that computation and the device the state (one VJP bra, or
    the state's Jacobian, for all of them).

    Taken from the state (one ``StateMP`` on all the wires, appended to the measurements
    the sweep differentiates, which stay as they are):

    * every measurement of the state other than expval, var, probs and state:
      ``density_matrix``, ``purity``, ``vn_entropy``, ``mutual_info``, ... through their
      ``process_state``;
    * an expval or var whose observable has trainable data the device cannot hand back
      in the form PennyLane needs, as Re tr(rho O) and Re tr(rho O^2) - <O>^2 with rho the
      reduced density matrix on O's wires and O = ``qml.matrix(obs)`` of the framework's
      data: data that is neither a scalar coefficient nor a Hermitian matrix
      (``common.observable_derivatives``); or a Hermitian matrix when the device's
      gradient cannot be a matrix: with device Jacobians (PennyLane's Jacobian
      contraction takes one entry per scalar), with device VJPs when the trainable
      parameters differ in shape (PennyLane's torch interface stacks a tape's VJPs, as
      for native templates, see ``decompose_templates_for_gradients``), and for a
      complex matrix (whose gradient convention is the framework's own: torch's is the
      conjugate of autograd's).

    ``array_gradients``: the device computes VJPs (``device_vjp=True``). Tapes with only
    expval, var, probs and state measurements and no trainable observable data, and
    tapes with shots (refused later: the adjoint method is analytic) pass unchanged.
    (The device's preprocessing applies it inside ``validate_adjoint_differentiation``.)
    """
    converted = measured_through_state(tape, device_wires, array_gradients)
    if converted is None:
        return (tape,), first_result
    new_tape, postprocess = converted
    return (new_tape,), postprocess


def measured_through_state(
    tape: QuantumScript, device_wires: Wires | None, array_gradients: bool
) -> tuple[QuantumScript, Callable] | None:
    """(the converted tape, its post-processing) of ``measure_through_state``, or None
    where the tape passes unchanged."""
    derived = [
        i
        for i, mp in enumerate(tape.measurements)
        if isinstance(mp, StateMeasurement) and not is_swept(mp)
    ]
    # the data of an observable with a Pauli form are its coefficients, which the device
    # differentiates: only the others may need the state (and asking a composite for its
    # data rebuilds them)
    observed = [
        i
        for i, mp in enumerate(tape.measurements)
        if isinstance(mp, _OBSERVABLE_MEASUREMENTS)
        and mp.obs is not None
        and mp.obs.pauli_rep is None
        and mp.obs.data
    ]
    if (not derived and not observed) or tape.shots:
        return None
    if observed:
        derived += _observables_through_state(tape, observed, array_gradients)
    if not derived:
        return None
    derived = sorted(derived)
    wires = Wires(device_wires) if device_wires is not None else tape.wires
    kept = [mp for i, mp in enumerate(tape.measurements) if i not in derived]
    with QueuingManager.stop_recording():
        state = StateMP(wires=wires)
    converted = tape.copy(measurements=[*kept, state])
    return converted, _from_state(tape.measurements, derived, wires)


_OBSERVABLE_MEASUREMENTS = (ExpectationMP, VarianceMP)


def _observables_through_state(
    tape: QuantumScript, observed: list[int], array_gradients: bool
) -> list[int]:
    """Those of the ``observed`` measurements (indices) whose trainable observable data
    the device does not differentiate in the form PennyLane needs (see
    ``measure_through_state``), and that are small enough to take from the state (others
    stay, and the validation names what it refuses)."""
    through_state = []
    matrices = []
    for i in observed:
        obs = tape.measurements[i].obs
        data = obs.data
        trainable = [position for position, value in enumerate(data) if math.requires_grad(value)]
        if not trainable:
            continue
        served = True
        for position, derivative in observable_derivatives(obs, trainable).items():
            if isinstance(derivative, str):
                served = False
            elif isinstance(derivative, MatrixDerivative):
                matrices.append((i, data[position]))
        if not served and len(obs.wires) <= DENSE_OBSERVABLE_WIRES:
            through_state.append(i)
    if matrices:
        parameters = tape.get_parameters(trainable_only=False)
        shapes = {math.shape(value) for value in parameters if math.requires_grad(value)}
        uniform = array_gradients and len(shapes) == 1
        for i, value in matrices:
            complex_matrix = "complex" in math.get_dtype_name(value)
            if (not uniform or complex_matrix) and i not in through_state:
                through_state.append(i)
    return through_state


def _from_state(measurements, derived: list[int], wires: Wires):
    """The post-processing of ``measure_through_state``: the results of ``measurements``
    from the converted tape's (the kept ones, then the state)."""
    derived_set = frozenset(derived)

    def postprocess(results):
        values = results[0]
        n_kept = len(measurements) - len(derived)
        values = (values,) if n_kept == 0 else tuple(values)
        state = values[-1]
        out, kept = [], iter(values[:-1])
        for i, mp in enumerate(measurements):
            out.append(_result_from_state(mp, state, wires) if i in derived_set else next(kept))
        return out[0] if len(out) == 1 else tuple(out)

    return postprocess


def _result_from_state(mp, state, wires: Wires):
    """``mp``'s result from the state on ``wires``, differentiable by the ML framework;
    a NumPy scalar as a 0-d array, as the device's other results (a scalar's reduction
    in NumPy gives ``numpy.float64``; PennyLane's results are arrays)."""
    value = _measured_from_state(mp, state, wires)
    return np.asarray(value) if isinstance(value, np.generic) else value


def _measured_from_state(mp, state, wires: Wires):
    """``mp``'s result from the state on ``wires``. Measured on the wires' positions (as
    default.qubit does): some measurements' (as ``vn_entropy``'s) ``process_state`` take
    their wire labels for positions."""
    if not isinstance(mp, _OBSERVABLE_MEASUREMENTS):
        on_positions, standard = measured_on_positions(mp, wires)
        return on_positions.process_state(state, wire_order=standard)
    positions = {wire: position for position, wire in enumerate(wires)}
    standard = Wires(range(len(wires)))
    with QueuingManager.stop_recording():
        obs = mp.obs
        on_positions = [positions[w] for w in obs.wires]
        rho = DensityMatrixMP(wires=on_positions).process_state(state, wire_order=standard)
        matrix = qml.matrix(obs, wire_order=obs.wires)
    matrix = math.cast_like(matrix, rho)
    mean = math.real(math.einsum("...ab,ba->...", rho, matrix))
    if isinstance(mp, ExpectationMP):
        return mean
    square = math.real(math.einsum("...ab,bc,ca->...", rho, matrix, matrix))
    return square - mean**2
