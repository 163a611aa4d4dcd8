"""What the preprocessing stages share: the post-processing of a transform that hands back
one tape (``first_result``), and the lookups of mid-circuit operations that every tape
passes through (one cached lookup by type, not ``isinstance`` on PennyLane's classes)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence

from pennylane.operation import Operator
from pennylane.ops import Conditional, MidMeasure, PauliMeasure


def first_result(results: Sequence) -> object:
    """The post-processing of a transform that hands back one tape: its one result."""
    return results[0]


@functools.cache
def is_dynamic_type(kind: type) -> bool:
    """A mid-circuit measurement or a conditional (``isinstance`` on PennyLane's operator
    classes costs 0.3 us, a cached lookup a tenth of it)."""
    return issubclass(kind, MidMeasure | Conditional | PauliMeasure)


def is_in_other_basis(op: Operator) -> bool:
    """``qml.ftqc``'s ``ParametricMidMeasure``. Only a program that imported
    ``pennylane.ftqc`` (which ``import pennylane`` does not, and which takes 0.1 s) can
    hold one, so its class is looked up, never imported here."""
    ftqc = sys.modules.get("pennylane.ftqc")
    kind = getattr(ftqc, "ParametricMidMeasure", None)
    return kind is not None and isinstance(op, kind)
