"""PennyLane's cotangents of a ``DifferentiatedTape``, checked against its measurements'
result shapes (``checked_cotangents``) and split into rows (``cotangent_batch``: a batch of
K cotangents; ``one_hot_rows``: a Jacobian's rows), and the gradients put back into
PennyLane's layout (``stacked_gradients``, ``format_jacobian``)."""

from __future__ import annotations

from typing import Any

import numpy as np
from pennylane.exceptions import DeviceError
from pennylane.measurements import ExpectationMP, VarianceMP

from .differentiated import DifferentiatedTape
from .results import output_shape, output_size


def cotangent_batch(circuit: DifferentiatedTape, cotangents: Any) -> list[tuple] | None:
    """The K cotangents of a batch of cotangents, each as ``checked_cotangents`` gives it,
    or None for one cotangent. A batch (jax's vmap of a VJP: ``jax.jacobian`` of a QNode
    with ``device_vjp=True``) has one leading axis of size K on each measurement's
    cotangent, over its result's shape; a scalar or None serves every row."""
    tape = circuit.tape
    per_measurement = (cotangents,) if len(tape.measurements) == 1 else tuple(cotangents)
    batch = (circuit.register.batch_size,) if circuit.register.broadcast else ()
    batched, sizes = [], set()
    for mp, dy in zip(tape.measurements, per_measurement, strict=True):
        shape = np.shape(dy) if dy is not None else ()
        expected = batch + output_shape(mp, circuit.register)
        batched.append(len(shape) == len(expected) + 1 and shape[1:] == expected)
        if batched[-1]:
            sizes.add(shape[0])
    if not sizes:
        return None
    if len(sizes) > 1:
        raise DeviceError(
            f"custatevec.qubit got batches of cotangents of sizes {sorted(sizes)} for one "
            "tape; the cotangents of its measurements must batch alike."
        )
    rows = []
    for k in range(sizes.pop()):
        row = tuple(
            dy[k] if is_batched else dy
            for dy, is_batched in zip(per_measurement, batched, strict=True)
        )
        rows.append(checked_cotangents(circuit, row if len(row) > 1 else row[0]))
    return rows


def stacked_gradients(circuit: DifferentiatedTape, gradients: np.ndarray) -> tuple:
    """Per trainable parameter, from the rows of ``gradients`` ``(K, columns)``: an array
    of shape ``(K, *parameter_shape)``; ``()`` without trainable parameters."""
    if circuit.n_params == 0:
        return ()
    return tuple(circuit.fold(list(gradients.T)))


def checked_cotangents(circuit: DifferentiatedTape, cotangents: Any) -> tuple:
    """PennyLane's per-tape cotangent as one entry per measurement, each of its result's
    shape (with the batch axis first for a broadcast tape), or a scalar, or None."""
    tape = circuit.tape
    per_measurement = (cotangents,) if len(tape.measurements) == 1 else tuple(cotangents)
    batch = (circuit.register.batch_size,) if circuit.register.broadcast else ()
    for mp, dy in zip(tape.measurements, per_measurement, strict=True):
        expected = output_shape(mp, circuit.register)
        if dy is not None and np.shape(dy) not in (batch + expected, ()):
            batched = "(K" + "".join(f", {n}" for n in batch + expected) + ")"
            raise DeviceError(
                f"custatevec.qubit got a cotangent of shape {np.shape(dy)} for {mp}, whose "
                f"result has shape {batch + expected}; a cotangent has its result's shape, "
                f"or is a scalar, and a batch of K cotangents has the shape {batched}."
            )
    return per_measurement


def one_hot_rows(circuit: DifferentiatedTape, measured: list[int]) -> list[tuple]:
    """One cotangent row per output of the measurements ``measured`` (indices into the
    tape's): 1 at that output, None elsewhere. A vector measurement's rows are read-only
    views of one array of ``2 * size - 1`` entries (row ``k`` starts ``k`` entries before
    its single 1), so that ``size`` rows take ``O(size)`` memory, not ``size**2``."""
    measurements = circuit.tape.measurements
    rows = []
    for i in measured:
        size = output_size(measurements[i], circuit.register)
        scalar = isinstance(measurements[i], (ExpectationMP, VarianceMP))
        shifted_one = np.zeros(2 * size - 1)
        shifted_one[size - 1] = 1.0
        shifted_one.flags.writeable = False
        for output in range(size):
            row: list = [None] * len(measurements)
            start = size - 1 - output
            row[i] = 1.0 if scalar else shifted_one[start : start + size]
            rows.append(tuple(row))
    return rows


def format_jacobian(per_measurement: list[list[np.ndarray]], n_params: int) -> np.ndarray | tuple:
    """measurement x parameter, with single measurements and single parameters unwrapped."""
    if n_params == 1:
        entries = [columns[0] for columns in per_measurement]
    else:
        entries = [tuple(columns) for columns in per_measurement]
    return entries[0] if len(entries) == 1 else tuple(entries)
