"""The derivatives of trainable observable data.

Trainable observable data (tape parameters after the operations' ones) needs no sweep:
its derivative is read off the final state psi, before the sweep consumes it
(``ObservableColumns``). Sums, scalar products and products of observables are linear in
each of their data entries separately (``observable_derivatives``), so for a scalar
coefficient x with dO/dx = D (an observable itself),

    d<O>/dx  = <D>                                  (a coefficient c_k: <O_k>)
    d var/dx = <D O + O D> - 2<O><D> = 2 Re <O psi|D|psi> - 2<O><D>.

For a Hermitian matrix M weighted by w in O, dO/dM_ab = w |a><b| on M's wires, so with
the reduced products R(u, v)[c, d] = sum_r u[c, r] conj(v[d, r]) on those wires
(rho = R(psi, psi), the reduced density matrix)

    d<O>/dM_ab  = w rho_ba                                   (w rho^T)
    d var/dM_ab = w (R(psi, O psi) + R(psi, O psi)^dagger - 2<O> rho)_ba.

For a real matrix the gradient is the real part (PennyLane's convention: the gradient of
a real parameter is real); a complex one keeps both parts, as autograd's."""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np
import pennylane as qml
from pennylane.measurements import MeasurementProcess, VarianceMP
from pennylane.operation import Operator
from pennylane.ops import Hermitian, Prod, SProd, Sum
from pennylane.queuing import QueuingManager
from pennylane.tape import QuantumScript
from pennylane.wires import Wires

from .. import measure
from ..backends.base import Backend
from ..backends.primitives import StateBatch
from ..program import Register


@dataclasses.dataclass(frozen=True)
class CoefficientDerivative:
    """dO/dx = ``operator`` for a scalar coefficient x of the observable O (an SProd's
    scalar, a Hamiltonian's coefficient), on which O depends linearly."""

    operator: Operator


@dataclasses.dataclass(frozen=True)
class MatrixDerivative:
    """dO/dM_ab = ``weight`` |a><b| on ``wires`` for the matrix M of a Hermitian in O
    (``weight``: the product of the scalars above it in O; None for 1)."""

    weight: complex | None
    wires: Wires


ObservableDerivative = CoefficientDerivative | MatrixDerivative


def observable_derivatives(
    obs: Operator, indices: Sequence[int]
) -> dict[int, ObservableDerivative | str]:
    """The derivative of ``obs`` by each of its data entries ``indices`` (into
    ``obs.data``), or the reason (a phrase) why the adjoint method has none.

    Sums (Hamiltonians and LinearCombinations among them) and products hold their
    operands' data in order, a scalar product its scalar and then its base's data: the
    walk goes down to the operands that hold the entries, once for all of them (a
    composite's ``data`` is rebuilt on every access: one walk per entry would cost
    K**2 for K terms). An observable is linear in each entry separately there:
    d(sum_k O_k) = dO_j, d(c B)/dc = B, d(c B) = c dB, d(A_1 ... A_n) = A_1 ... dA_j ... A_n.
    """
    with QueuingManager.stop_recording():
        return _derivatives(obs, list(indices), None)


def observable_data_derivatives(tape: QuantumScript, trainable: Iterable[int]) -> dict[int, dict]:
    """{measurement index: ``observable_derivatives`` of its observable's entries} for the
    trainable observable data among ``trainable`` (indices into the tape's parameters)."""
    n_ops = len(tape.operations)
    entries: dict[int, list[int]] = {}
    for index in sorted(trainable):
        info = tape.par_info[index]
        if info["op_idx"] >= n_ops:
            entries.setdefault(info["op_idx"] - n_ops, []).append(info["p_idx"])
    return {
        m: observable_derivatives(tape.measurements[m].obs, indices)
        for m, indices in entries.items()
    }


def _derivatives(obs: Operator, indices: list[int], weight) -> dict:
    if isinstance(obs, SProd):
        found = {}
        if 0 in indices:
            found[0] = (
                f"the coefficient of {obs.name} is trainable and not a scalar"
                if qml.math.shape(obs.scalar) != ()
                else CoefficientDerivative(_weighted(obs.base, weight))
            )
        inner = [i - 1 for i in indices if i > 0]
        if inner:
            scale = obs.scalar if weight is None else weight * obs.scalar
            found.update((i + 1, d) for i, d in _derivatives(obs.base, inner, scale).items())
        return found
    if isinstance(obs, (Sum, Prod)):
        operands = obs.operands
        starts = [0]
        for operand in operands:
            starts.append(starts[-1] + len(operand.data))
        if starts[-1] != len(obs.data):
            return {i: f"the data of {obs.name} is not its operands' data" for i in indices}
        by_operand: dict[int, list[int]] = {}
        for i in indices:
            position = bisect.bisect_right(starts, i) - 1
            by_operand.setdefault(position, []).append(i - starts[position])
        found = {}
        for position, local in by_operand.items():
            start = starts[position]
            if isinstance(obs, Sum):
                inner = _derivatives(operands[position], local, weight)
                found.update((start + i, d) for i, d in inner.items())
                continue
            for i, d in _derivatives(operands[position], local, None).items():
                if isinstance(d, CoefficientDerivative):
                    factors = list(operands)
                    factors[position] = d.operator
                    d = CoefficientDerivative(_weighted(qml.prod(*factors), weight))
                elif isinstance(d, MatrixDerivative):
                    d = "a Hermitian matrix in a product of observables is trainable"
                found[start + i] = d
        return found
    if isinstance(obs, Hermitian) and indices == [0]:
        return {0: MatrixDerivative(weight, obs.wires)}
    return {i: f"a parameter of the observable {obs.name} is trainable" for i in indices}


def _weighted(op: Operator, weight) -> Operator:
    return op if weight is None else qml.s_prod(weight, op)


@dataclasses.dataclass(frozen=True)
class ObservableColumns:
    """The columns ``start`` .. ``stop`` of a trainable data entry of the observable of
    measurement ``measurement`` (an expval or var): one column for a coefficient, one per
    entry of a matrix (flattened in C order). ``complex_gradient``: the parameter is
    complex and its gradient keeps its imaginary part."""

    measurement: int
    start: int
    stop: int
    derivative: ObservableDerivative
    complex_gradient: bool


def observable_values(
    backend: Backend,
    psi: StateBatch,
    register: Register,
    measurements: Sequence[MeasurementProcess],
    columns: Sequence[ObservableColumns],
) -> list[np.ndarray]:
    """d(result of its measurement)/d(entry) of each of ``columns`` (module docstring), for
    each of the B vectors of the final states ``psi`` (unchanged): (B, stop - start) each.
    Each measurement's <O> and O psi are computed once, and every Pauli derivative of the
    expectation values in one backend call."""
    values: list = [None] * len(columns)
    means: dict[int, np.ndarray] = {}
    applied: dict[int, StateBatch] = {}
    coefficients = [
        c
        for c, column in enumerate(columns)
        if isinstance(column.derivative, CoefficientDerivative)
    ]
    derivative_means = measure.expvals(
        backend, psi, register, [columns[c].derivative.operator for c in coefficients]
    )
    for c, mean_of_derivative in zip(coefficients, derivative_means, strict=True):
        values[c] = mean_of_derivative
    for c, column in enumerate(columns):
        mp = measurements[column.measurement]
        derivative = column.derivative
        if isinstance(mp, VarianceMP) and column.measurement not in means:
            means[column.measurement] = measure.expval(backend, psi, register, mp.obs)
            applied[column.measurement] = measure.applied_observable(backend, psi, register, mp.obs)
        mean = means.get(column.measurement)
        if isinstance(derivative, CoefficientDerivative):
            if isinstance(mp, VarianceMP):
                cross = measure.transition(
                    backend, applied[column.measurement], psi, register, derivative.operator
                )
                values[c] = 2.0 * np.real(cross) - 2.0 * mean * values[c]
            values[c] = np.asarray(values[c], dtype=np.float64)[:, None]
            continue
        rho = measure.reduced_products(backend, psi, psi, register, derivative.wires)
        if isinstance(mp, VarianceMP):
            cross = measure.reduced_products(
                backend, psi, applied[column.measurement], register, derivative.wires
            )
            rho = cross + np.conj(np.swapaxes(cross, -1, -2)) - 2.0 * mean[:, None, None] * rho
        gradient = np.swapaxes(rho, -1, -2)
        if derivative.weight is not None:
            gradient = complex(derivative.weight) * gradient
        if not column.complex_gradient:
            gradient = np.real(gradient)
        values[c] = gradient.reshape(gradient.shape[0], -1)
    return values
