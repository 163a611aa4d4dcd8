"""What the forward pass keeps of a tape for the adjoint pass that usually follows.

``execution.run_tapes`` returns one ``KeptState`` per analytic tape when asked to (and when
the final states of all of them fit in free memory together); the device holds them until
the derivatives, which start their sweeps from the kept state instead of simulating the
circuit, compiling it or planning its fusion again.
"""

from __future__ import annotations

import dataclasses

from .backends.primitives import StateBatch
from .fused_units import FusedPlan
from .program import Compilation


@dataclasses.dataclass(frozen=True, eq=False)
class KeptState:
    """A tape's final state with what the forward pass computed to reach it."""

    state: StateBatch
    """The tape's final state vectors: a view into the batch that the forward pass
    simulated (so the batch lives while a kept state of it does); the sweep consumes it."""
    compilation: Compilation
    """The tape's ``compile_tapes.compile_steps``: the steps the sweep walks back."""
    plan: FusedPlan | None = None
    """The forward pass's fused plan of ``compilation`` (``plan.compilation is
    compilation``) with the block width it was planned for (1: one unit per step); None
    where the forward pass planned a merged batch of several tapes (a plan of other
    data)."""

    def __post_init__(self):
        if self.plan is not None and self.plan.compilation is not self.compilation:
            raise ValueError("a kept plan belongs to the kept compilation")

    # ``runs.Kept``: what the backward pass asks of a kept tape, either path

    @property
    def broadcast(self) -> bool:
        return self.compilation.register.broadcast

    def general(self) -> KeptState:
        return self

    def direct_vjp(self, backend, cotangents) -> None:
        return None  # the general path's

    def spent(self) -> KeptState:
        return KeptState(None, self.compilation)
