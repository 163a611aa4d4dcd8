"""Which items run as one batch: one group-by and one chunk-by-memory, for the forward pass
and the deferred adjoint sweep alike.

The forward pass (``execution.run_tapes``) groups analytic tapes by their kernel key
(``Program.kernel_key``) together with their measurements (``exact.measurements_key``):
a group runs as one batch of state vectors. The deferred sweep (``deferred``) groups its
tasks by their ``gradients.deferred.SweepKey``, which adds what the derivative reads. Both then cut
each group into chunks whose memory fits a budget (``Budget``): a group is a set of items
that *may* share one batch, a chunk a run of them that *does*.

A group lists its items in order, and groups come in the order of their first item, so
that the results of a batched run go back in the order the items came. The caller's key
decides sameness, and it must be exact (``exact.py``): equal only for exactly equal data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, Protocol, Self, TypeVar

from . import simulate
from .backends.base import Backend

Item = TypeVar("Item")
Item_contra = TypeVar("Item_contra", contravariant=True)


@dataclasses.dataclass(frozen=True)
class Group:
    """Items that may run as one batch."""

    key: Hashable
    """What they share, as the caller's key function gives it; None for a lone item (no key
    is built: the fast path of a single tape)."""
    indices: tuple[int, ...]
    """Their positions in the caller's sequence, in order."""


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Consecutive items of one group that run as one batch."""

    indices: tuple[int, ...]
    """Their positions in the caller's sequence, in order."""


def group_by(
    items: Sequence[Item],
    key: Callable[[Item], Hashable],
    indices: Iterable[int] | None = None,
) -> list[Group]:
    """The ``items`` (those at ``indices``, by default all) grouped by ``key``: groups in
    the order of their first item, each with its items in order. A lone item is a group of
    its own whose key is not built (keys can cost more than a small circuit's run)."""
    indices = range(len(items)) if indices is None else tuple(indices)
    if len(indices) == 1:
        return [Group(None, tuple(indices))]
    groups: dict[Hashable, list[int]] = {}  # dicts keep their first-insertion order
    for index in indices:
        groups.setdefault(key(items[index]), []).append(index)
    return [Group(k, tuple(members)) for k, members in groups.items()]


class Tally(Protocol[Item_contra]):
    """What a chunk allocates, item by item (immutable: ``add`` returns a new tally). Not
    necessarily a sum: the deferred sweep's temporaries, for one, are the largest any of
    its items needs (``deferred._ChunkTally``)."""

    def add(self, item: Item_contra) -> Self:
        """The tally with ``item`` added to the chunk."""

    def bytes(self) -> int:
        """The bytes the chunk needs."""


@dataclasses.dataclass(frozen=True)
class Sum(Generic[Item]):
    """A tally that adds up each item's bytes, on top of what a chunk needs whatever its
    items (``overhead``)."""

    cost: Callable[[Item], int]
    """An item's bytes."""
    overhead: int = 0
    """The bytes of a chunk before its first item."""
    items: int = 0
    """The bytes of the items added so far."""

    def add(self, item: Item) -> Sum[Item]:
        return dataclasses.replace(self, items=self.items + self.cost(item))

    def bytes(self) -> int:
        return self.overhead + self.items


def tally_of(
    empty: Tally[Item], items: Sequence[Item], indices: Iterable[int] | None = None
) -> Tally[Item]:
    """``empty`` with the items at ``indices`` (by default all) added."""
    tally = empty
    for index in range(len(items)) if indices is None else indices:
        tally = tally.add(items[index])
    return tally


BATCH_BYTES = 1 << 30
"""Memory budget for the state vectors of one batch that merges several tapes or shots."""


@dataclasses.dataclass(frozen=True)
class Budget:
    """The bytes one chunk of a group may take: at most ``cap``, and with ``free_memory``
    at most the backend's free memory. Free memory is asked (once per group) only when
    the whole group needs more than ``simulate.UNCHECKED_BYTES``: below that the query
    costs more than simulating a small circuit, and the whole group is one chunk."""

    cap: int | None = None
    """A fixed limit (None: none)."""
    free_memory: bool = True
    """Whether the backend's free memory bounds a chunk too. False where the caller has
    checked already that every chunk of every group fits together (the forward pass's
    kept states)."""

    def limit(self, backend: Backend) -> int | None:
        """The bytes one chunk may take now (None: no limit)."""
        limits = [self.cap] if self.cap is not None else []
        if self.free_memory:
            limits.append(simulate.free_bytes(backend))
        return min(limits) if limits else None


FORWARD = Budget(cap=BATCH_BYTES)
"""A forward batch whose final states are not kept: at most ``BATCH_BYTES`` (one batch of
tapes or shots need not take all the memory there is), and at most the free memory."""
FORWARD_KEPT = Budget(cap=BATCH_BYTES, free_memory=False)
"""A forward batch whose final states are kept for the derivatives: at most
``BATCH_BYTES``; the kept states of all batches were checked to fit in free memory
together (``execution.run_tapes``), so each chunk fits."""
SWEEP = Budget()
"""A deferred sweep: at most the free memory (its final states, bras, temporaries and
reductions, ``deferred._ChunkTally``). A chunk of one task that does not fit is refused
by ``deferred._require_chunk_memory``, which names what would fit."""


def chunk_by_memory(
    backend: Backend,
    group: Group,
    items: Sequence[Item],
    empty: Tally[Item],
    budget: Budget,
) -> list[Chunk]:
    """``group`` cut into consecutive runs of its items whose tally (``empty`` with their
    items added) fits ``budget``; an item larger than the budget runs alone (the caller's
    memory check refuses it if it must). A lone item, or a whole group of at most
    ``simulate.UNCHECKED_BYTES``, is one chunk, and free memory is not asked."""
    indices = group.indices
    if len(indices) == 1:
        return [Chunk(indices)]
    if tally_of(empty, items, indices).bytes() <= simulate.UNCHECKED_BYTES:
        return [Chunk(indices)]
    limit = budget.limit(backend)
    if limit is None:
        return [Chunk(indices)]
    chunks: list[Chunk] = []
    chunk: list[int] = []
    tally = empty
    for index in indices:
        grown = tally.add(items[index])
        if chunk and grown.bytes() > limit:
            chunks.append(Chunk(tuple(chunk)))
            chunk, grown = [], empty.add(items[index])
        chunk.append(index)
        tally = grown
    chunks.append(Chunk(tuple(chunk)))
    return chunks
