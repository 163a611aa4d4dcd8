"""The memory of adjoint sweeps: ``SweepMemory``, what a sweep allocates beside the final
states it is handed, the eager sweep's (``eager_sweep_memory``), and the check that refuses
a sweep that does not fit, naming what would (``require_sweep_memory``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from .. import simulate
from ..backends.base import Backend


@dataclasses.dataclass(frozen=True)
class SweepMemory:
    """What an adjoint sweep allocates beside the final states it is handed, counted in
    state vectors of the register (the deferred sweep's reductions in bytes), for the
    memory check before it allocates anything.

    The final states and the bras live through the whole sweep; the temporaries of
    building the bras are gone before the first step; the reductions accumulate during
    the steps, beside the temporaries of one step at a time."""

    states: int
    """Final states simulated again for the sweep, or copied into one batch."""
    bras: int
    """R per state vector (one for a VJP, one per output for a Jacobian)."""
    build_scratch: int
    """Temporary vectors while the bras are built (a cotangent term, the backend's)."""
    step_scratch: int
    """Temporary vectors of one sweep step (the backend's ``scratch_vectors``)."""
    reduction_bytes: int = 0
    """The deferred sweep's reductions, held until the sweep ends (an upper bound)."""

    def bytes(self, backend: Backend, num_qubits: int) -> int:
        return self._bytes(simulate.state_bytes(backend, num_qubits, 1))

    def _bytes(self, vector: int) -> int:
        during_steps = vector * self.step_scratch + self.reduction_bytes
        return vector * (self.states + self.bras) + max(vector * self.build_scratch, during_steps)

    def single_precision(self, backend: Backend, num_qubits: int) -> list[simulate.Alternative]:
        """``c_dtype=numpy.complex64`` as an alternative: half the bytes per vector (the
        reductions stay complex128)."""
        half = self._bytes(simulate.state_bytes(backend, num_qubits, 1) // 2)
        return simulate.single_precision(backend, half)

    def described(self) -> str:
        """What the vectors are, for an error message."""
        parts = [f"{self.bras:,} bra{'s' if self.bras != 1 else ''}"]
        if self.states:
            parts.insert(0, f"{self.states:,} final state{'s' if self.states != 1 else ''}")
        scratch = max(self.build_scratch, self.step_scratch)
        if scratch:
            parts.append(f"up to {scratch:,} temporary vector{'s' if scratch != 1 else ''}")
        if self.reduction_bytes:
            parts.append(f"{self.reduction_bytes:,} bytes of reductions")
        return ", ".join(parts)


def bra_build_scratch(backend: Backend) -> int:
    """Temporary vectors while one bra's cotangent terms are added (``add_cotangent_terms``):
    one term at a time (a copy of psi, O psi, or a state cotangent), and the backend's
    temporary of adding it."""
    return 1 + backend.scratch_vectors(1, 1, False)


def eager_sweep_memory(backend: Backend, held: bool, rows: int) -> SweepMemory:
    """The eager sweep of one (not broadcast) tape with ``rows`` bras; ``held``: its final
    state is handed over (kept from the forward pass), else simulated again."""
    return SweepMemory(
        states=0 if held else 1,
        bras=rows,
        build_scratch=bra_build_scratch(backend),
        step_scratch=backend.scratch_vectors(1, rows, False),
    )


def require_sweep_memory(
    backend: Backend,
    num_qubits: int,
    memory: SweepMemory,
    what: str,
    alternatives: Sequence[simulate.Alternative] | Callable = (),
) -> None:
    """Refuse a sweep whose ``memory`` does not fit, naming the ``alternatives`` (or a
    function of the available bytes that finds them) and single precision that would."""

    def found(available: int) -> list[simulate.Alternative]:
        named = alternatives(available) if callable(alternatives) else alternatives
        return [*named, *memory.single_precision(backend, num_qubits)]

    simulate.require_total(
        backend,
        memory.bytes(backend, num_qubits),
        f"{what} on {num_qubits} qubits ({memory.described()})",
        found,
    )
