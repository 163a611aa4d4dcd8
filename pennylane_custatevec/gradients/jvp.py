"""Jacobian-vector products: the forward-mode derivative of a tape's results.

For a tape with trainable parameters theta_1 .. theta_P and tangents t_1 .. t_P (one per
trainable parameter, of that parameter's shape: a native template's weight array has an
array tangent), the JVP of measurement m is

    JVP_m = sum_j J_mj . t_j,        J_mj = d result_m / d theta_j,

where "." sums over the parameter's own axes (the Jacobian of an array parameter carries
them last, after the result's axes; for a scalar parameter it is a product). JVP_m has the
shape of result m: a broadcast tape's batch axis first, complex for a state. As PennyLane
nests results, one measurement's JVP is returned bare, several as a tuple.

The Jacobian is the device's own adjoint Jacobian (eager.py or deferred.py, whichever
``grad_accumulation`` is in force): every output of a tape in one reverse sweep, and in the
deferred mode tapes that share a structure in one batch. Parameters whose tangent is zero
are left out of it (fewer columns to sweep), and a tape whose tangents are all zero gets
zeros without a sweep.

Why a contraction and not a forward sweep of one tangent vector
(d psi = sum_j t_j U_N .. U_{j+1} i G_j phi_j): the forward sweep cannot start from the
final state that the execution kept, so it simulates the circuit again, with a second
vector; for expectation values that costs what the reverse sweep costs, and the reverse
sweep already exists in both modes, batched and fused in the deferred one. It would save
memory for ``state()`` outputs, whose Jacobian is one vector per parameter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from pennylane.exceptions import DeviceError
from pennylane.measurements import StateMP
from pennylane.tape import QuantumScript
from pennylane.wires import Wires

from ..compile_tapes import compile_steps
from ..kept import KeptState
from ..program import Compilation
from .results import is_zero, output_shape


@dataclasses.dataclass
class TangentPlan:
    """One tape's JVP: ``tape`` is the tape to differentiate, its trainable parameters
    reduced to those with a nonzero tangent; ``tangents`` and ``shapes`` are theirs, in
    ``tape.trainable_params`` order."""

    tape: QuantumScript
    tangents: list[np.ndarray]
    shapes: list[tuple]


def plan(tape: QuantumScript, tangents) -> TangentPlan | None:
    """The tape's tangents checked (one per trainable parameter, each of the parameter's
    shape, or a zero, or None), and the parameters they leave to differentiate; None when
    every tangent is zero."""
    if not isinstance(tangents, (tuple, list)) and np.ndim(tangents) == 0:
        raise DeviceError(
            f"custatevec.qubit got the tangent {tangents!r} for a tape; give a sequence with "
            "one tangent per trainable parameter."
        )
    tangents = tuple(tangents)
    trainable = list(tape.trainable_params)
    if len(tangents) != len(trainable):
        raise DeviceError(
            f"custatevec.qubit got {len(tangents)} tangent(s) for a tape with "
            f"{len(trainable)} trainable parameter(s); give one tangent per trainable "
            "parameter."
        )
    parameters = tape.get_parameters()
    kept_params, kept_tangents, shapes = [], [], []
    for index, value, tangent in zip(trainable, parameters, tangents, strict=True):
        if is_zero(tangent):
            continue
        tangent = np.asarray(tangent)
        shape = np.shape(value)
        if tangent.shape != shape:
            raise DeviceError(
                f"custatevec.qubit got a tangent of shape {tangent.shape} for the parameter "
                f"{index} of the tape, whose shape is {shape}; a tangent has its parameter's "
                "shape."
            )
        kept_params.append(index)
        kept_tangents.append(tangent)
        shapes.append(shape)
    if not kept_params:
        return None
    reduced = tape
    if len(kept_params) < len(trainable):
        reduced = tape.copy()
        reduced.trainable_params = kept_params
    return TangentPlan(reduced, kept_tangents, shapes)


def contract(tangent_plan: TangentPlan, jacobian):
    """JVP_m = sum_j J_mj . t_j for every measurement m (module docstring), from the
    Jacobian of ``tangent_plan.tape`` as the device returns it (measurement x parameter,
    one measurement or one parameter unwrapped)."""
    tape = tangent_plan.tape
    n_params = len(tangent_plan.tangents)
    per_measurement = (jacobian,) if len(tape.measurements) == 1 else jacobian
    jvps = []
    for entry in per_measurement:
        columns = (entry,) if n_params == 1 else entry
        total = 0
        for derivative, tangent, shape in zip(
            columns, tangent_plan.tangents, tangent_plan.shapes, strict=True
        ):
            derivative = np.asarray(derivative)
            if not np.iscomplexobj(derivative):
                # a real result's JVP is real, as its primal (jax checks the dtypes): the
                # device differentiates along the parameter's real axis, so of a complex
                # tangent (a parameter given as complex) only the real part enters, as in
                # default.qubit's adjoint JVP
                tangent = np.real(tangent)
            if shape:
                total = total + np.tensordot(derivative, tangent, axes=len(shape))
            else:
                total = total + derivative * tangent
        jvps.append(np.asarray(total))
    return jvps[0] if len(jvps) == 1 else tuple(jvps)


def zeros(tape: QuantumScript, device_wires: Wires | None, compiled: Compilation | None = None):
    """The JVP of a tape whose tangents are all zero: zeros shaped as its results
    (``compiled``: the tape's compilation if the execution kept it). The device refuses a
    tape the sweep could not differentiate before it gets here, whatever the tangents."""
    register = (compiled or compile_steps(tape, device_wires)).register
    batch = (register.batch_size,) if register.broadcast else ()
    jvps = [
        np.zeros(
            batch + output_shape(mp, register),
            dtype=np.complex128 if isinstance(mp, StateMP) else np.float64,
        )
        for mp in tape.measurements
    ]
    return jvps[0] if len(jvps) == 1 else tuple(jvps)


def jvps(
    tapes: Sequence[QuantumScript],
    tangents: Sequence,
    kept: Sequence[KeptState | None],
    jacobians,
    zero_jvp,
) -> tuple:
    """The JVP of each tape. ``kept[i]``: what the execution kept for tape i, or None (as
    the Jacobians take it); ``jacobians(tapes, kept)``: the device Jacobians of a batch of
    tapes; ``zero_jvp(tape, kept[i])``: the JVP of a tape whose tangents are all zero."""
    if len(tangents) != len(tapes):
        raise DeviceError(
            f"custatevec.qubit got tangents for {len(tangents)} tape(s) and {len(tapes)} "
            "tape(s); give one tuple of tangents per tape."
        )
    plans = [plan(tape, t) for tape, t in zip(tapes, tangents, strict=True)]
    swept = [i for i, p in enumerate(plans) if p is not None]
    results: list = [None] * len(tapes)
    if swept:
        computed = jacobians([plans[i].tape for i in swept], [kept[i] for i in swept])
        for i, jacobian in zip(swept, computed, strict=True):
            results[i] = contract(plans[i], jacobian)
    for i, p in enumerate(plans):
        if p is None:
            results[i] = zero_jvp(tapes[i], kept[i])
    return tuple(results)
