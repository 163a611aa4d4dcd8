"""The shape of one result of a measurement, which its cotangent has (``output_size``,
``output_shape``), and whether a cotangent or tangent is zero (``is_zero``)."""

from __future__ import annotations

import numpy as np
from pennylane.measurements import (
    ExpectationMP,
    MeasurementProcess,
    ProbabilityMP,
    StateMP,
    VarianceMP,
)

from ..program import Register


def is_zero(value: object) -> bool:
    return value is None or not np.any(np.asarray(value))


def output_size(mp: MeasurementProcess, register: Register) -> int:
    if isinstance(mp, (ProbabilityMP, StateMP)):
        return 2 ** len(mp.wires or register.wires)
    return 1


def output_shape(mp: MeasurementProcess, register: Register) -> tuple:
    """The shape of one (not broadcast) result of ``mp``."""
    return () if isinstance(mp, (ExpectationMP, VarianceMP)) else (output_size(mp, register),)
