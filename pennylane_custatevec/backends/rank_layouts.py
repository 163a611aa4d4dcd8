"""The layouts of the distributed backend's vectors and the MPI plumbing beneath it:
``DistributedState`` (a rank's slices of a batch and each vector's layout), ``RankLayouts``
(the base class of ``distributed.DistributedBackend``: the bit swaps between ranks that
change a layout, layouts aligned, controls, Pauli words and Z words as they act on a rank's
slice, sums over ranks), and helpers on layouts and Pauli words. The scheme is described in
``distributed``'s module text."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from .base import Backend
from .primitives import StateBatch

Layout = tuple[int, ...]
"""``layout[q]``: the physical bit that holds state bit ``q`` (a permutation of 0..n-1)."""


@dataclasses.dataclass(eq=False)
class DistributedState:
    """A batch of vectors split over the ranks: this rank's slices (a local backend's
    batch of ``rows`` vectors of ``2**(n - global_bits)`` amplitudes) and each vector's
    layout. Views (``Backend.vectors``) share the slices and the list of layouts of the
    batch they come from (their rows start at ``offset``)."""

    local: StateBatch
    layouts: list[Layout]
    offset: int
    rows: int
    num_qubits: int
    global_bits: int
    """g, the physical bits spelled by the rank index; 0: replicated on every rank."""

    @property
    def shape(self) -> tuple[int, int]:
        """(vectors, amplitudes of the whole vector), as the algorithms see a batch."""
        return (self.rows, 1 << self.num_qubits)

    @property
    def dtype(self) -> np.dtype:
        return self.local.dtype

    @property
    def flags(self):
        """The local slices' array flags (contiguity)."""
        return self.local.flags

    @property
    def local_bits(self) -> int:
        """L, the bits a rank's slice spans."""
        return self.num_qubits - self.global_bits

    def own_layouts(self) -> list[Layout]:
        return self.layouts[self.offset : self.offset + self.rows]


def identity_layout(num_qubits: int) -> Layout:
    return tuple(range(num_qubits))


class RankLayouts(Backend):
    """A backend whose vectors are split over MPI ranks (``DistributedState``): their
    layouts, the bit swaps that change them, and what a rank's slice makes of controls,
    Pauli words and sums. The subclass (``distributed.DistributedBackend``) sets ``local``
    (the rank-local backend), ``rank`` and ``messages`` (its ``messages.RankMessages``),
    and forwards the operations to ``local``."""

    local: Backend
    rank: int

    def bit_on_rank(self, position: int, low: int) -> int:
        """This rank's value of the global physical bit ``position`` (>= ``low``)."""
        return (self.rank >> (position - low)) & 1

    def uniform_layout(self, state: DistributedState) -> Layout:
        """The layout of every vector of ``state`` (first brought to that of its first
        vector, where a view's swaps left them different)."""
        layouts = state.own_layouts()
        first = layouts[0] if layouts else identity_layout(state.num_qubits)
        if any(layout != first for layout in layouts):
            for row, layout in enumerate(layouts):
                if layout != first:
                    self.align(self.vectors(state, row, row + 1), first)
        return first

    def set_layout(self, state: DistributedState, layout: Layout) -> None:
        for row in range(state.offset, state.offset + state.rows):
            state.layouts[row] = layout

    def make_local(self, state: DistributedState, bits: Sequence[int]) -> Layout:
        """Swap each of ``bits`` that sits on a global physical bit with a local bit that
        holds none of ``bits`` (the highest such), and return the layout."""
        layout = self.uniform_layout(state)
        low = state.local_bits
        wanted = set(bits)
        for bit in bits:
            if layout[bit] < low:
                continue
            holder = {p: q for q, p in enumerate(layout)}
            free = next(p for p in reversed(range(low)) if holder[p] not in wanted)
            layout = self._swap_physical(state, layout, layout[bit], free)
        return layout

    def align(self, state: DistributedState, target: Layout) -> None:
        """Bring every vector of ``state`` to the layout ``target``."""
        layout = self.uniform_layout(state)
        for position in range(state.num_qubits):
            current = layout[target.index(position)]  # where target's bit for it is now
            if current != position:
                layout = self._swap_physical(state, layout, position, current)

    def _swap_physical(
        self, state: DistributedState, layout: Layout, first: int, second: int
    ) -> Layout:
        """Exchange the physical bits ``first`` and ``second`` of every vector of ``state``
        and return (and record) the layout after it."""
        low = state.local_bits
        local_bits = sorted(p for p in (first, second) if p < low)
        if len(local_bits) == 2:
            self.local.apply_matrix(state.local, _SWAP[None], local_bits)
        elif len(local_bits) == 1:
            self._swap_global_with_local(state, max(first, second), local_bits[0])
        else:
            self._swap_two_global(state, first, second)
        swapped = tuple(second if p == first else first if p == second else p for p in layout)
        self.set_layout(state, swapped)
        return swapped

    def _swap_global_with_local(
        self, state: DistributedState, global_position: int, local_position: int
    ) -> None:
        """A bit swap between ranks: the half of the slice whose local bit differs from
        this rank's global bit goes to the partner rank (which differs in that bit), and
        the partner's matching half comes back in its place."""
        low = state.local_bits
        value = self.bit_on_rank(global_position, low)
        partner = self.rank ^ (1 << (global_position - low))
        outer = 1 << (low - 1 - local_position)
        inner = 1 << local_position
        halves = _view(state.local, (state.rows, outer, 2, inner))[:, :, 1 - value, :]
        self.messages.exchange(halves, partner)

    def _swap_two_global(self, state: DistributedState, first: int, second: int) -> None:
        """Two global bits swapped: ranks whose two bits differ trade whole slices."""
        low = state.local_bits
        if self.bit_on_rank(first, low) == self.bit_on_rank(second, low):
            return
        partner = self.rank ^ (1 << (first - low)) ^ (1 << (second - low))
        self.messages.exchange(state.local, partner)

    def local_controls(
        self,
        state: DistributedState,
        layout: Layout,
        controls: Sequence[int],
        control_values: Sequence[int],
    ) -> tuple[list[int], list[int]] | None:
        """The local controls (physical bits, values) of a gate, or None where a control
        on a global bit does not hold on this rank (the rank skips the gate)."""
        low = state.local_bits
        bits, values = [], []
        for control, value in zip(controls, control_values, strict=True):
            position = layout[control]
            if position < low:
                bits.append(position)
                values.append(int(value))
            elif self.bit_on_rank(position, low) != int(value):
                return None
        return bits, values

    def scale_where(
        self, state: DistributedState, factors: np.ndarray, bits: list[int], values: list[int]
    ) -> None:
        """psi <- factor psi where the local controls ``bits`` hold ``values``."""
        factors = np.asarray(factors, dtype=np.complex128).reshape(-1)
        if not bits:
            return self.local.scale(state.local, factors)
        diagonal = np.ones((factors.size, 1 << len(bits)), dtype=np.complex128)
        diagonal[:, sum(v << i for i, v in enumerate(values))] = factors
        return self.local.apply_diagonal(state.local, diagonal, bits)

    def pauli_on_slice(self, state, moved, paulis, targets, controls, control_values):
        """A controlled Pauli word made ready for this rank's slice: its ``moved`` bits
        made local, then (local controls, the sign of its Z letters on global bits, its
        local letters, their physical bits), or None where a global control does not hold
        on this rank (it skips the gate)."""
        layout = self.make_local(state, moved)
        where = self.local_controls(state, layout, controls, control_values)
        if where is None:
            return None
        return (where, *self._local_word(state, layout, paulis, targets))

    def _local_word(
        self, state: DistributedState, layout: Layout, paulis: str, targets: Sequence[int]
    ) -> tuple[int, str, list[int]]:
        """A Pauli word as it acts on this rank's slice: the sign of its Z letters on
        global bits, and its other letters on their physical bits (I letters dropped)."""
        low = state.local_bits
        sign, word, bits = 1, [], []
        for letter, target in zip(paulis, targets, strict=True):
            position = layout[target]
            if letter == "I":
                continue
            if position >= low:  # only Z letters stay global (see moved_bits)
                sign = -sign if self.bit_on_rank(position, low) else sign
            else:
                word.append(letter)
                bits.append(position)
        return sign, "".join(word), bits

    def local_z_words(
        self, state: DistributedState, layout: Layout, z_masks: Sequence[int]
    ) -> _LocalZWords:
        """Z words (masks of state bits) as they act on this rank's slice."""
        low = state.local_bits
        signs = np.ones(len(z_masks))
        kept, masks, phases = [], [], []
        for j, mask in enumerate(z_masks):
            local_mask = 0
            for bit in range(int(mask).bit_length()):
                if mask >> bit & 1:
                    position = layout[bit]
                    if position < low:
                        local_mask |= 1 << position
                    elif self.bit_on_rank(position, low):
                        signs[j] = -signs[j]
            if local_mask:
                kept.append(j)
                masks.append(local_mask)
            else:
                phases.append(j)
        return _LocalZWords(signs, kept, masks, phases)

    def local_expvals(self, state, layout, words, which, partial) -> None:
        local_words, signs = [], []
        for k in which:
            sign, word, bits = self._local_word(state, layout, *words[k])
            local_words.append((word, bits))
            signs.append(sign)
        values = self.local.expval_pauli_words(state.local, local_words)
        partial[:, which] = values * np.asarray(signs, dtype=np.float64)

    def summed_over_ranks(self, state: DistributedState, values) -> np.ndarray:
        values = np.asarray(values, dtype=np.complex128)
        return self.messages.sum(values) if state.global_bits else values


@dataclasses.dataclass(frozen=True)
class _LocalZWords:
    """Z words on a rank's slice: word j is ``signs[j]`` (its Z letters on global bits)
    times the Z word on the physical bits ``masks[kept.index(j)]`` or, for j in
    ``phases`` (no local letter), the constant ``signs[j]``."""

    signs: np.ndarray
    kept: list[int]
    masks: list[int]
    phases: list[int]


def mask_mapper(layout: Layout) -> Callable[[int], int]:
    """A mask of state bits -> the mask of their physical bits under ``layout``."""

    def physical(mask: int) -> int:
        out = 0
        for bit in range(int(mask).bit_length()):
            if mask >> bit & 1:
                out |= 1 << layout[bit]
        return out

    return physical


def _view(array, shape: tuple[int, ...]):
    """``array`` reshaped without a copy (a copy would lose the writes of a swap): numpy
    refuses where a view cannot be made."""
    if isinstance(array, np.ndarray):
        return np.reshape(array, shape, copy=False)
    return array.reshape(shape)  # cupy: a vector's slices split its contiguous last axis


def flipped_bits(paulis: str, targets: Sequence[int]) -> list[int]:
    """The bits of a Pauli word's X and Y letters (Z letters on global bits are signs)."""
    return [t for letter, t in zip(paulis, targets, strict=True) if letter in "XY"]


def moved_bits(paulis: str, targets: Sequence[int], state: DistributedState) -> list | None:
    """The bits of a Pauli word that must be local (``flipped_bits``), or None where they
    outnumber the local bits."""
    bits = flipped_bits(paulis, targets)
    return bits if len(bits) <= state.local_bits else None


_SWAP = np.array([[1, 0, 0, 0], [0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 1]], dtype=np.complex128)
