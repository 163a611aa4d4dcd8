"""Broadcast tapes re-expanded at derivative time: PennyLane binds broadcast parameters
into preprocessed tapes after the preprocessing (``jax.vmap`` over a QNode with
``device_vjp=True``), where the sweep of the mode in force does not take a broadcast tape
whole; their derivatives are those of their entries, stacked or summed as the
preprocessing's expansion would give them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pennylane.tape import QuantumScript

from .preprocess.broadcast import expand_broadcasts
from .program import is_broadcast, tape_batch_size
from .settings import DifferentiationOptions


def _rebound_broadcast(tape: QuantumScript, in_force: DifferentiationOptions) -> bool:
    """Whether ``tape`` is broadcast where the sweep of the mode in force does not take a
    broadcast tape whole (a trainable parameter broadcast, or the eager mode): the
    preprocessing expands such tapes, but PennyLane binds broadcast parameters into
    preprocessed tapes afterwards (``jax.vmap`` over a QNode with ``device_vjp=True``)."""
    if tape_batch_size(tape) is None:
        return False
    if in_force.grad_accumulation == "eager":
        return True
    return any(is_broadcast(tape.par_info[index]["op"]) for index in tape.trainable_params)


def each_rebound_expanded(circuits, per_tape, in_force, expanded, alone) -> tuple | None:
    """None where no tape is ``_rebound_broadcast`` (the derivative method goes on as
    usual); else each tape's derivative, ``expanded(tape, per_tape[i])`` for a rebound
    tape and ``alone(tape, per_tape[i])`` for the others. One check per tape."""
    rebound = [_rebound_broadcast(tape, in_force) for tape in circuits]
    if not any(rebound):
        return None
    return tuple(
        expanded(tape, extra) if expand else alone(tape, extra)
        for tape, extra, expand in zip(circuits, per_tape, rebound, strict=True)
    )


def _broadcast_parameters(tape: QuantumScript) -> list[bool]:
    """Per trainable parameter of a broadcast tape: whether it is broadcast (has the batch
    axis first, beyond its own dimensions)."""
    parameters = tape.get_parameters(trainable_only=False)
    flags = []
    for index in tape.trainable_params:
        info = tape.par_info[index]
        own_ndim = info["op"].ndim_params[info["p_idx"]]
        flags.append(is_broadcast(info["op"]) and np.ndim(parameters[index]) > own_ndim)
    return flags


def broadcast_entries(tape: QuantumScript, tangents) -> tuple[list, list]:
    """The entries of a broadcast tape and the tangents of each: a broadcast parameter's
    tangent split by entry, another's the same for every entry."""
    entries, _ = expand_broadcasts(tape)
    flags = _broadcast_parameters(tape)

    def entry_tangents(b: int) -> tuple:
        return tuple(
            t[b] if broadcast and t is not None and np.ndim(t) else t
            for t, broadcast in zip(tangents, flags, strict=True)
        )

    return list(entries), [entry_tangents(b) for b in range(len(entries))]


def stacked(per_entry: Sequence):
    """Results of the entries of a broadcast tape (nested tuples alike) stacked into the
    broadcast tape's: the batch axis first in every leaf."""
    first = per_entry[0]
    if isinstance(first, (tuple, list)):
        return tuple(stacked([entry[i] for entry in per_entry]) for i in range(len(first)))
    return np.stack([np.asarray(entry) for entry in per_entry])


def broadcast_vjp(tape: QuantumScript, cotangent, vjps) -> tuple:
    """The VJP of a broadcast tape from the VJPs of its entries (``vjps(tapes,
    cotangents)``), as the preprocessing's expansion would give it: a broadcast parameter's
    gradient has one entry per broadcast entry, another parameter's is their sum. The
    cotangent of each result has the batch axis first (or is a scalar or None)."""
    entries, _ = expand_broadcasts(tape)
    single = len(tape.measurements) == 1
    per_measurement = (cotangent,) if single else tuple(cotangent)

    def entry_cotangent(b: int):
        split = tuple(dy if dy is None or np.ndim(dy) == 0 else dy[b] for dy in per_measurement)
        return split[0] if single else split

    gradients = vjps(list(entries), [entry_cotangent(b) for b in range(len(entries))])
    return tuple(
        np.stack(per_entry) if broadcast else np.sum(per_entry, axis=0)
        for per_entry, broadcast in zip(
            ([np.asarray(g[k]) for g in gradients] for k in range(len(tape.trainable_params))),
            _broadcast_parameters(tape),
            strict=True,
        )
    )
