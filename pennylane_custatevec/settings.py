"""Differentiation options of the device, and their context-local overrides.

A device is built with ``grad_accumulation`` and ``fusion_qubits``; ``options(...)``
overrides either for a block of code or for every call of a decorated function, without
building a new device::

    with pennylane_custatevec.options(grad_accumulation="eager"):
        loss = circuit(weights)

    @pennylane_custatevec.options(fusion_qubits=3)
    def loss(weights): ...

Overrides live in a ``contextvars.ContextVar``, so threads and asyncio tasks each see their
own, and nested blocks restore the outer values on exit. The device reads them once per
execution, in ``setup_execution_config``, and records the result in the execution config's
``device_options``: the backward pass of that execution (a torch ``backward()`` called after
the block has ended) uses the options its forward pass used.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import types
from collections.abc import Mapping

import numpy as np

GRAD_ACCUMULATION_CHOICES = ("deferred", "eager")
VERIFY_EVERY = 1024
"""The default of ``compile``'s ``verify_every``: a replaying key is traced again at its
calls 4, 8, ..., 1024 and then every 1024th call. A verification costs about what a
recorded call costs (W4: 2.9-3.3 ms against 0.15 ms replayed, measured with
benchmarks/compiled_verification.py on 2 cores): every 1024th call adds about 2% on W4,
every 256th about 8%."""
MAX_FUSION_QUBITS = 6
"""The largest fused block: its dense matrix has 4**k entries per state vector."""


@dataclasses.dataclass(frozen=True)
class DifferentiationOptions:
    """``grad_accumulation``: "deferred" or "eager"; ``fusion_qubits``: the largest fused
    block in qubits, 0 or 1 for no fusion."""

    grad_accumulation: str
    fusion_qubits: int

    def as_device_options(self) -> dict:
        return dataclasses.asdict(self)


OPTION_NAMES = frozenset(field.name for field in dataclasses.fields(DifferentiationOptions))


def validate(**values) -> dict:
    """``values`` (a subset of the option names) checked; raises ValueError naming the valid
    choices for an unknown name or a bad value."""
    unknown = sorted(set(values) - OPTION_NAMES)
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown}; the options that can be overridden are "
            f"{', '.join(sorted(OPTION_NAMES))}."
        )
    if "grad_accumulation" in values:
        value = values["grad_accumulation"]
        if value not in GRAD_ACCUMULATION_CHOICES:
            raise ValueError(
                f"grad_accumulation={value!r} is not valid; choose one of "
                f"{', '.join(repr(c) for c in GRAD_ACCUMULATION_CHOICES)}."
            )
    if "fusion_qubits" in values:
        value = values["fusion_qubits"]
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, np.integer))
            or not 0 <= value <= MAX_FUSION_QUBITS
        ):
            raise ValueError(
                f"fusion_qubits={value!r} is not valid; use an int from 0 to "
                f"{MAX_FUSION_QUBITS} (0 or 1: no fusion)."
            )
        values["fusion_qubits"] = int(value)
    return dict(values)


_NO_OVERRIDES: Mapping = types.MappingProxyType({})
_OVERRIDES: contextvars.ContextVar[Mapping] = contextvars.ContextVar(
    "pennylane_custatevec_options", default=_NO_OVERRIDES
)


def current_overrides() -> Mapping:
    """The overrides in force in this context (innermost block wins)."""
    return _OVERRIDES.get()


def resolve(defaults: DifferentiationOptions, given: Mapping | None = None):
    """The options in force: ``given`` (an execution config's device_options) over the
    context's overrides over the device's ``defaults``."""
    if given and "grad_accumulation" in given and "fusion_qubits" in given:
        # the usual case: set up for this execution (membership tests, not
        # ``OPTION_NAMES <= given.keys()``: the set-like comparison with a keys view goes
        # through collections.abc, microseconds per call)
        pair = (given["grad_accumulation"], given["fusion_qubits"])
        try:
            return _validated(*pair)
        except TypeError:  # unhashable: validate says what is wrong with it
            return DifferentiationOptions(**validate(**dict(zip(_PAIR, pair, strict=True))))
    values = {**defaults.as_device_options(), **current_overrides()}
    if given:
        values.update(validate(**{k: v for k, v in given.items() if k in values}))
    return DifferentiationOptions(**values)


_PAIR = ("grad_accumulation", "fusion_qubits")


@functools.lru_cache(maxsize=64, typed=True)  # typed: True is not a valid fusion_qubits=1
def _validated(grad_accumulation, fusion_qubits) -> DifferentiationOptions:
    """The options of a config's device_options, validated once per distinct pair (every
    execution and every derivative resolves them)."""
    values = validate(grad_accumulation=grad_accumulation, fusion_qubits=fusion_qubits)
    return DifferentiationOptions(**values)


class options(contextlib.ContextDecorator):  # noqa: N801 - used like a function
    """Override device options for a block of code (``with``) or a function (decorator).

    Args:
        grad_accumulation ("deferred", "eager"): how gradient contributions are accumulated.
        fusion_qubits (int): largest fused block, 0 to ``MAX_FUSION_QUBITS``.

    Invalid values raise ValueError when the object is built. The object can be entered
    again, also from several threads: each entry keeps its own token.
    """

    def __init__(self, **values):
        self._values = validate(**values)
        self._tokens = contextvars.ContextVar(f"tokens_{id(self)}", default=())

    def __enter__(self) -> options:
        token = _OVERRIDES.set(types.MappingProxyType({**_OVERRIDES.get(), **self._values}))
        self._tokens.set(self._tokens.get() + (token,))
        return self

    def __exit__(self, *exc) -> None:
        *outer, token = self._tokens.get()
        self._tokens.set(tuple(outer))
        _OVERRIDES.reset(token)

    def __repr__(self) -> str:
        values = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        return f"pennylane_custatevec.options({values})"
