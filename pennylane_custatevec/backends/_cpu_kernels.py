"""Compiled in-place kernels over a batch of state vectors, shape ``(B, 2**n)``.

Conventions are cuStateVec's (see ``backends/base.py``): state index bits are
little-endian, ``targets[j]`` is the state bit that becomes bit ``j`` of a matrix
or diagonal index, and the gate acts only on indices whose control bits equal
``control_mask`` (the control bits set to their control values).

Every kernel walks *work items*: an index with the target and control bits removed.
``_insert_zeros`` spreads such an index back over the full register, leaving the
``fixed_bits`` (targets and controls, sorted ascending) at zero. Work is cut into
chunks, each inside one state vector, so that the batch and the amplitudes share
one parallel loop. Each kernel is a ``Kernel``, a module-level name compiled twice
from the same Python source: a threaded version for large batches and a serial one
where thread start-up would dominate. ``cpu.py`` imports the kernels by name, so that a
misspelt one fails at import.
"""

import dataclasses
import types
from collections.abc import Callable

import numba
import numpy as np

from . import kernel_cache

# before the first decoration: numba picks a function's cache directory when it is decorated
kernel_cache.register()

_FASTMATH = {"reassoc", "contract"}
"""LLVM may reassociate floating-point sums (so that it vectorises the kernels' reductions)
and fuse multiplies and adds; NaN and infinity keep their IEEE meaning (no "nnan" or
"ninf"). Results move by round-off only. Measured at 16 qubits on 2 cores, interleaved
runs: a rotation adjoint step 1.2-1.6x, a one-qubit block step with one bra 1.5-1.7x
faster."""

_PARALLEL_THRESHOLD = 1 << 14
"""Amplitudes (all vectors of a batch) from which the threaded kernels run: measured on
2 cores, a one-qubit rotation step takes 54 us serial and 44 us threaded at 2**14 amplitudes,
and the two break even at 2**13 (thread wake-up); QAOA at 16 qubits (W5) ran 10-20%
faster than with threads from 2**18."""
_CHUNKS = 64


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One kernel, compiled twice from the same Python source."""

    name: str
    """The source function's name."""
    threaded: Callable
    """The ``parallel=True`` compilation: ``numba.prange`` loops run on threads."""
    serial: Callable
    """The same loops on the calling thread."""

    @classmethod
    def compile(cls, source: types.FunctionType) -> "Kernel":
        """Both compilations of ``source`` (lazily, at the first call of each, unless
        ``kernel_build`` cached them when the package was installed). The serial one is
        compiled from a renamed copy, so that numba's on-disk cache (keyed by qualified
        name) keeps the two apart."""
        serial = types.FunctionType(
            source.__code__, source.__globals__, source.__name__ + "_serial"
        )
        serial.__qualname__ = source.__qualname__ + "_serial"
        return cls(
            name=source.__name__,
            threaded=numba.njit(parallel=True, cache=True, fastmath=_FASTMATH)(source),
            serial=numba.njit(cache=True, fastmath=_FASTMATH)(serial),
        )

    def for_size(self, array: np.ndarray) -> Callable:
        """The compilation that pays for ``array``'s size (every vector of a batch): the
        threaded one from ``_PARALLEL_THRESHOLD`` amplitudes, the serial one below."""
        return self.threaded if array.size >= _PARALLEL_THRESHOLD else self.serial


@numba.njit(cache=True, fastmath=_FASTMATH)
def _insert_zeros(index, fixed_bits):
    for bit in fixed_bits:
        low = index & ((1 << bit) - 1)
        index = ((index >> bit) << (bit + 1)) | low
    return index


@numba.njit(cache=True, fastmath=_FASTMATH)
def _low_masks(fixed_bits):
    """Masks of the bits below the two lowest fixed bits (all ones: no such bit)."""
    low0 = (1 << fixed_bits[0]) - 1 if len(fixed_bits) > 0 else -1
    low1 = (1 << fixed_bits[1]) - 1 if len(fixed_bits) > 1 else -1
    return low0, low1


@numba.njit(cache=True, fastmath=_FASTMATH)
def _spread(x, low0, low1):
    """Insert a zero bit above each low mask, lowest first."""
    x = ((x << 1) & ~((low0 << 1) | 1)) | (x & low0)
    return ((x << 1) & ~((low1 << 1) | 1)) | (x & low1)


@numba.njit(cache=True, fastmath=_FASTMATH)
def _run_length(fixed_bits, items):
    """Work items that share every fixed bit above the two lowest ones."""
    return (1 << (fixed_bits[2] - 2)) if len(fixed_bits) > 2 else items


@numba.njit(cache=True, fastmath=_FASTMATH)
def _run(i, hi, run_length, fixed_bits, control_mask):
    """(base, first, count): work items first .. first+count-1 of the run that holds
    item i sit at indices base | _spread(item). Runs are long unless three fixed bits
    are all low, so the inner loops do a few integer operations per amplitude."""
    first = i & (run_length - 1)
    base = _insert_zeros(i - first, fixed_bits) | control_mask
    return base, first, min(hi - i, run_length - first)


@numba.njit(cache=True, fastmath=_FASTMATH)
def _parity(x):
    x ^= x >> 32
    x ^= x >> 16
    x ^= x >> 8
    x ^= x >> 4
    x ^= x >> 2
    x ^= x >> 1
    return x & 1


@numba.njit(cache=True, fastmath=_FASTMATH)
def _chunks_per_vector(batch, items):
    return max(1, min(items, _CHUNKS // batch))


@numba.njit(cache=True, fastmath=_FASTMATH)
def _work_layout(batch, dim, fixed_bits):
    """How a kernel walks its work items: (items per vector, chunks per vector, run
    length, the two low masks, span). ``span`` work items sit at consecutive indices:
    those below the lowest fixed bit (every item when no bit is fixed)."""
    items = dim >> len(fixed_bits)
    span = (1 << fixed_bits[0]) if len(fixed_bits) > 0 else items
    low0, low1 = _low_masks(fixed_bits)
    return items, _chunks_per_vector(batch, items), _run_length(fixed_bits, items), low0, low1, span


@numba.njit(cache=True, fastmath=_FASTMATH)
def _job_range(job, per, items):
    """(vector, first item, end item) of parallel job ``job``: each vector's work items
    are cut into ``per`` consecutive ranges."""
    b = job // per
    c = job - b * per
    return b, c * items // per, (c + 1) * items // per


_STEP_BLOCK = 1 << 11
"""Amplitude pairs an adjoint step takes through the ket and then every bra before the
next block: 64 KiB of each vector, so that the ket's block is read from cache by the bras
after the first."""

_VECTOR_BIT = 3
"""The lowest target bit whose pairs the ``_pairs_*`` loops walk as spans (2**bit
consecutive amplitudes and their partners): from 8 amplitudes a span is long enough for
LLVM's vectorised loop (measured at 16 qubits: a one-bit block step with 16 bras 2.3-2.8
-> 0.46-0.87 ns per amplitude and bra at bits 3-15, ``benchmarks/layout_probe.py``). Bit 0
has a stride-2 loop of its own, also vectorised (a 2x2 gate 1.0 -> 0.30 ns per amplitude,
a step 2.1 -> 0.54); bits 1 and 2 keep the indexed loop (their interleaved
pairs 2 and 4 amplitudes apart stay scalar in every form tried), except in the adjoint
block step, which swaps them with bit 0 around the bit-0 loop (``_swap_with_bit_zero``)."""


@numba.njit(cache=True, fastmath=_FASTMATH)
def _vectorised(bit):
    """Whether the ``_pairs_*`` loops run vectorised on ``bit`` (``_VECTOR_BIT``)."""
    return bit == 0 or bit >= _VECTOR_BIT


@numba.njit(cache=True, fastmath=_FASTMATH)
def _pair_index(item, bit):
    """The lower index of amplitude pair ``item`` on ``bit``: ``item`` with a zero bit
    inserted at ``bit``."""
    low = item & ((1 << bit) - 1)
    return ((item - low) << 1) | low


@numba.njit(cache=True, fastmath=_FASTMATH)
def _span_count(item, end, bit):
    """How many pairs from ``item`` (before ``end``) have consecutive lower indices."""
    step = 1 << bit
    return min(step - (item & (step - 1)), end - item)


# The ``_pairs_*`` loops take one vector as two arguments (``low`` and ``high``, the same
# array passed twice) and slice each span from its own argument. LLVM then checks at run
# time that a span and its partner do not overlap and runs the vectorised loop; slices of
# one argument are one object at two symbolic offsets to it, and it keeps those loops
# scalar (measured: a 2x2 gate at 16 qubits 1.0 ns per amplitude with one argument, 0.18-0.25
# with two, ``benchmarks/layout_probe.py``). They are not inlined for the same reason.


@numba.njit(cache=True, fastmath=_FASTMATH)
def _pairs_2x2(low, high, bit, first, end, m00, m01, m10, m11):
    """(v[j], v[j + 2**bit]) <- M (v[j], v[j + 2**bit]) for the amplitude pairs ``first``
    .. ``end - 1`` on ``bit`` (j = ``_pair_index``) of the vector v = ``low`` = ``high``."""
    step = 1 << bit
    if bit == 0:  # pairs (2i, 2i + 1): a stride-2 loop over a slice, which LLVM vectorises
        span = low[2 * first : 2 * end]
        for k in range(end - first):  # written out: through _update_pair it stays scalar
            a = span[2 * k]
            b = span[2 * k + 1]
            span[2 * k] = m00 * a + m01 * b
            span[2 * k + 1] = m10 * a + m11 * b
        return
    if bit < _VECTOR_BIT:
        for item in range(first, end):
            _update_pair(low, _pair_index(item, bit), step, m00, m01, m10, m11)
        return
    item = first
    while item < end:
        count = _span_count(item, end, bit)
        j = _pair_index(item, bit)
        lo = low[j : j + count]
        hi = high[j + step : j + step + count]
        for k in range(count):
            a, b = lo[k], hi[k]
            lo[k] = m00 * a + m01 * b
            hi[k] = m10 * a + m11 * b
        item += count


@numba.njit(cache=True, fastmath=_FASTMATH)
def _swap_with_bit_zero(span, bit):
    """Swap index bit ``bit`` (1 or 2) with bit 0 in ``span`` (contiguous amplitudes, a
    whole number of groups of 2**(bit + 1)): then the pairs on ``bit`` are those on bit 0,
    whose loop is vectorised. Measured at 16 qubits, a block step with 16 bras on bits 1
    and 2: 2.1 ns per amplitude and bra in the indexed loop, 1.2 with the swaps around the
    bit-0 loop (a swap: 0.25 ns per amplitude)."""
    step = 1 << bit
    for base in range(0, span.shape[0], 2 * step):
        for j in range(1, step, 2):  # bit 0 set, ``bit`` clear <-> bit 0 clear, ``bit`` set
            a = span[base + j]
            span[base + j] = span[base + step + j - 1]
            span[base + step + j - 1] = a


@numba.njit(cache=True, fastmath=_FASTMATH)
def _swaps_pay(bit, first, end):
    """Whether a one-bit step on ``bit`` over the pairs ``first`` .. ``end - 1`` takes
    ``_swap_with_bit_zero``: bits 1 and 2, on whole groups of pairs."""
    group = 1 << bit
    return (bit == 1 or bit == 2) and first % group == 0 and end % group == 0


@numba.njit(cache=True, inline="always", fastmath=_FASTMATH)
def _update_pair(vec, j, step, m00, m01, m10, m11):
    """(vec[j], vec[j + step]) <- M (vec[j], vec[j + step])."""
    a, b = vec[j], vec[j + step]
    vec[j] = m00 * a + m01 * b
    vec[j + step] = m10 * a + m11 * b


@numba.njit(cache=True, inline="always", fastmath=_FASTMATH)
def _add_pair_products(a, b, p0, p1, t00, t01, t10, t11):
    """T + conj((a, b)) (x) (p0, p1): one pair's terms of ``_pairs_step``'s T."""
    c0, c1 = np.conj(a), np.conj(b)
    return t00 + c0 * p0, t01 + c0 * p1, t10 + c1 * p0, t11 + c1 * p1


@numba.njit(cache=True, fastmath=_FASTMATH)
def _pairs_step(ket_low, ket_high, bra_low, bra_high, bit, first, end, m00, m01, m10, m11, update):
    """T[a, c] = sum over the pairs ``first`` .. ``end - 1`` on ``bit`` of
    conj(bra[a]) ket[c], a and c the pair's values of ``bit`` (<bra|A|ket> = sum_ac A[a, c]
    T[a, c] for any 2x2 A on that bit), returned as (T00, T01, T10, T11); then, where
    ``update``, bra <- M bra on the same pairs, in the same pass."""
    step = 1 << bit
    t00, t01, t10, t11 = 0j, 0j, 0j, 0j
    if bit == 0:  # pairs (2i, 2i + 1): a stride-2 loop over slices, which LLVM vectorises
        kets, bras = ket_low[2 * first : 2 * end], bra_low[2 * first : 2 * end]
        for k in range(end - first):
            j = 2 * k
            a, b = bras[j], bras[j + 1]
            t00, t01, t10, t11 = _add_pair_products(a, b, kets[j], kets[j + 1], t00, t01, t10, t11)
            if update:  # written out: through _update_pair it stays scalar
                bras[j] = m00 * a + m01 * b
                bras[j + 1] = m10 * a + m11 * b
        return t00, t01, t10, t11
    if bit < _VECTOR_BIT:
        for item in range(first, end):
            j = _pair_index(item, bit)
            a, b = bra_low[j], bra_low[j + step]
            t00, t01, t10, t11 = _add_pair_products(
                a, b, ket_low[j], ket_low[j + step], t00, t01, t10, t11
            )
            if update:
                _update_pair(bra_low, j, step, m00, m01, m10, m11)
        return t00, t01, t10, t11
    item = first
    while item < end:
        count = _span_count(item, end, bit)
        j = _pair_index(item, bit)
        k0, k1 = ket_low[j : j + count], ket_high[j + step : j + step + count]
        l0, l1 = bra_low[j : j + count], bra_high[j + step : j + step + count]
        for k in range(count):
            a, b = l0[k], l1[k]
            t00, t01, t10, t11 = _add_pair_products(a, b, k0[k], k1[k], t00, t01, t10, t11)
            if update:
                l0[k] = m00 * a + m01 * b
                l1[k] = m10 * a + m11 * b
        item += count
    return t00, t01, t10, t11


@numba.njit(cache=True, fastmath=_FASTMATH)
def _pauli_phase(index, z_mask, i_power):
    """<P|index> phase factor: i**n_Y * (-1)**popcount(index & z_mask)."""
    sign = 1.0 - 2.0 * _parity(index & z_mask)
    return i_power * sign


@numba.njit(cache=True, fastmath=_FASTMATH)
def _target_offsets(targets):
    d = 1 << len(targets)
    offsets = np.zeros(d, dtype=np.uint64)
    for a in range(d):
        off = 0
        for j in range(len(targets)):
            if (a >> j) & 1:
                off |= 1 << targets[j]
        offsets[a] = np.uint64(off)
    return offsets


@numba.njit(cache=True, inline="always", fastmath=_FASTMATH)
def _times_2x2(m00, m01, m10, m11, a0, a1):
    """(m00 a0 + m01 a1, m10 a0 + m11 a1): a 2x2 matrix times an amplitude pair."""
    return m00 * a0 + m01 * a1, m10 * a0 + m11 * a1


@numba.njit(cache=True, inline="always", fastmath=_FASTMATH)
def _gather(vec, i0, offsets, out):
    """out[a] <- vec[i0 + offsets[a]]: the d amplitudes of one work item."""
    for a in range(offsets.shape[0]):
        out[a] = vec[i0 + offsets[a]]


@numba.njit(cache=True, inline="always", fastmath=_FASTMATH)
def _row_times(m, a, x):
    """sum_c m[a, c] x[c]: row a of a dense d x d matrix times d amplitudes, returned as a
    scalar (a product stored in a buffer first measured 1.3-1.5x slower in inner_matrix,
    k = 3 at 20 qubits on 2 cores)."""
    acc = m[a, 0] * x[0]
    for c in range(1, x.shape[0]):
        acc += m[a, c] * x[c]
    return acc


@numba.njit(cache=True, inline="always", fastmath=_FASTMATH)
def _store_product(vec, i0, offsets, m, x):
    """vec[i0 + offsets[a]] <- sum_c m[a, c] x[c]: a work item's amplitudes become m x."""
    for a in range(offsets.shape[0]):
        vec[i0 + offsets[a]] = _row_times(m, a, x)


@numba.njit(cache=True, inline="always", fastmath=_FASTMATH)
def _apply_dense(vec, i0, offsets, m, old):
    """The d amplitudes vec[i0 + offsets[a]] of one work item <- m times them; ``old``
    holds them as they were."""
    _gather(vec, i0, offsets, old)
    _store_product(vec, i0, offsets, m, old)


@Kernel.compile
def apply_1q(state, mats, target, fixed_bits, control_mask):
    batch, dim = state.shape
    items, per, run_length, low0, low1, span = _work_layout(batch, dim, fixed_bits)
    shared = mats.shape[0] == 1
    step = np.uint64(1 << target)
    uncontrolled = len(fixed_bits) == 1
    for job in numba.prange(batch * per):
        b, i, hi = _job_range(job, per, items)
        m = mats[0] if shared else mats[b]
        m00, m01, m10, m11 = m[0, 0], m[0, 1], m[1, 0], m[1, 1]
        vec = state[b]
        if uncontrolled:
            _pairs_2x2(vec, vec, target, i, hi, m00, m01, m10, m11)
            continue
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, control_mask)
            for item in range(first, first + length):
                i0 = np.uint64(base | _spread(item, low0, low1))
                i1 = i0 + step
                vec[i0], vec[i1] = _times_2x2(m00, m01, m10, m11, vec[i0], vec[i1])
            i += length


@numba.njit(cache=True, inline="always", fastmath=_FASTMATH)
def _rotated(a0, a1, cos, sin, letter):
    """exp(-i angle/2 P) applied to the amplitude pair (a0, a1), letter 0: I, 1: X, 2: Y,
    3: Z, in real arithmetic."""
    x0, y0 = a0.real, a0.imag
    x1, y1 = a1.real, a1.imag
    if letter == 0:  # (c - is) I
        return (
            complex(cos * x0 + sin * y0, cos * y0 - sin * x0),
            complex(cos * x1 + sin * y1, cos * y1 - sin * x1),
        )
    if letter == 1:  # [[c, -is], [-is, c]]
        return (
            complex(cos * x0 + sin * y1, cos * y0 - sin * x1),
            complex(cos * x1 + sin * y0, cos * y1 - sin * x0),
        )
    if letter == 2:  # [[c, -s], [s, c]]
        return (
            complex(cos * x0 - sin * x1, cos * y0 - sin * y1),
            complex(sin * x0 + cos * x1, sin * y0 + cos * y1),
        )
    return (  # diag(c - is, c + is)
        complex(cos * x0 + sin * y0, cos * y0 - sin * x0),
        complex(cos * x1 - sin * y1, cos * y1 + sin * x1),
    )


@numba.njit(cache=True, fastmath=_FASTMATH)
def _rotation_2x2(cos, sin, letter):
    """exp(-i angle/2 P) for the letter 0: I, 1: X, 2: Y, 3: Z, as its 2x2 matrix
    (``_cos_minus_i_sin`` of the letter's); ``_rotated`` applies the same in real
    arithmetic."""
    p00, p01, p10, p11 = _letter_2x2(letter)
    return _cos_minus_i_sin(cos, sin, p00, p01, p10, p11)


@numba.njit(cache=True, fastmath=_FASTMATH)
def _cos_minus_i_sin(cos, sin, p00, p01, p10, p11):
    """cos I - i sin P for the 2x2 matrix P, entries (g00, g01, g10, g11): the matrix of
    exp(-i angle/2 P) with cos and sin of angle/2, for any one-bit Pauli word P."""
    minus_i_sin = -1j * sin
    return cos + minus_i_sin * p00, minus_i_sin * p01, minus_i_sin * p10, cos + minus_i_sin * p11


@numba.njit(cache=True, fastmath=_FASTMATH)
def _letter_2x2(letter):
    """The 2x2 matrix (p00, p01, p10, p11) of the Pauli letter 0: I, 1: X, 2: Y, 3: Z."""
    if letter == 0:
        return 1.0 + 0j, 0j, 0j, 1.0 + 0j
    if letter == 1:
        return 0j, 1.0 + 0j, 1.0 + 0j, 0j
    if letter == 2:
        return 0j, -1j, 1j, 0j
    return 1.0 + 0j, 0j, 0j, -1.0 + 0j


@numba.njit(cache=True, fastmath=_FASTMATH)
def _rotate_pair(vec, i0, i1, cos, sin, letter):
    """exp(-i angle/2 P) on the amplitude pair (i0, i1) for the letter 0: I, 1: X, 2: Y, 3: Z."""
    vec[i0], vec[i1] = _rotated(vec[i0], vec[i1], cos, sin, letter)


@numba.njit(cache=True, inline="always", fastmath=_FASTMATH)
def _letter_product(l0, l1, k0, k1, letter):
    """<l|P|k> on one amplitude pair, P the letter 1: X, 2: Y, 3: Z."""
    if letter == 1:
        return np.conj(l0) * k1 + np.conj(l1) * k0
    if letter == 2:
        return 1j * (np.conj(l1) * k0 - np.conj(l0) * k1)
    return np.conj(l0) * k0 - np.conj(l1) * k1


@numba.njit(cache=True, fastmath=_FASTMATH)
def _span_length(item, end, span):
    """How many items from ``item`` (before ``end``) sit at consecutive indices: those
    below the lowest fixed bit, ``span`` of them per block."""
    return min(span - (item & (span - 1)), end - item)


_MIN_SPAN = 8
"""Below this many consecutive amplitudes an index is computed per work item instead."""


@Kernel.compile
def apply_1q_rotation(state, angles, letter, target, fixed_bits, control_mask):
    """exp(-i angle/2 P) for one Pauli letter (0: I, 1: X, 2: Y, 3: Z). Without controls
    and on a bit the span loops vectorise (``_vectorised``), as its 2x2 matrix
    (``_pairs_2x2``); otherwise in real arithmetic: cos and sin enter as real factors, half
    the multiplications of a dense 2x2, which pays in the scalar loops."""
    batch, dim = state.shape
    items, per, run_length, low0, low1, span = _work_layout(batch, dim, fixed_bits)
    shared = angles.shape[0] == 1
    step = np.uint64(1 << target)
    uncontrolled = len(fixed_bits) == 1
    for job in numba.prange(batch * per):
        b, i, hi = _job_range(job, per, items)
        half = 0.5 * (angles[0] if shared else angles[b])
        cos = np.cos(half)
        sin = np.sin(half)
        vec = state[b]
        if uncontrolled and _vectorised(target):  # else the real arithmetic pays
            g00, g01, g10, g11 = _rotation_2x2(cos, sin, letter)
            _pairs_2x2(vec, vec, target, i, hi, g00, g01, g10, g11)
            continue
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, control_mask)
            item, end = first, first + length
            if span < _MIN_SPAN:
                for item in range(first, end):
                    i0 = np.uint64(base | _spread(item, low0, low1))
                    _rotate_pair(vec, i0, i0 + step, cos, sin, letter)
            else:
                while item < end:
                    count = _span_length(item, end, span)
                    start = np.uint64(base | _spread(item, low0, low1))
                    for k in range(count):
                        i0 = start + np.uint64(k)
                        _rotate_pair(vec, i0, i0 + step, cos, sin, letter)
                    item += count
            i += length


@Kernel.compile
def rotation_step_1q(phi, bras, angles, letter, target, fixed_bits, out):
    """One adjoint step through exp(-i angle/2 P), P one letter (1: X, 2: Y, 3: Z), in
    a single pass: out[r] = <bra_r|P|phi> first, then the inverse rotation on phi and on
    every bra (phi is one vector, bras a batch)."""
    rows, dim = bras.shape
    items, per, run_length, low0, low1, span = _work_layout(1, dim, fixed_bits)
    step = np.uint64(1 << target)
    half = -0.5 * angles[0]
    cos = np.cos(half)
    sin = np.sin(half)
    fused = rows == 1  # one bra: phi is undone in the bra's loop, one pass over both
    uncontrolled = len(fixed_bits) == 1 and _vectorised(target)
    # Without controls: phi <- G phi first (G the inverse rotation), then T_r of each bra
    # against it (``_pairs_step``), so <bra_r|P|phi> = sum_ac (P G^dagger)[a, c] T_r[a, c].
    g00, g01, g10, g11 = _rotation_2x2(cos, sin, letter)
    p00, p01, p10, p11 = _letter_2x2(letter)
    a00, a01, a10, a11 = _product_2x2(
        p00, p01, p10, p11, np.conj(g00), np.conj(g10), np.conj(g01), np.conj(g11)
    )
    partial = np.zeros((per, rows), dtype=np.complex128)
    ket = phi[0]
    for c in numba.prange(per):
        sums = np.zeros(rows, dtype=np.complex128)
        _, i, hi = _job_range(c, per, items)
        while uncontrolled and i < hi:  # in blocks that stay in cache across the bras
            end = min(hi, i + _STEP_BLOCK)
            _pairs_2x2(ket, ket, target, i, end, g00, g01, g10, g11)
            for r in range(rows):
                t00, t01, t10, t11 = _pairs_step(
                    ket, ket, bras[r], bras[r], target, i, end, g00, g01, g10, g11, True
                )
                sums[r] += a00 * t00 + a01 * t01 + a10 * t10 + a11 * t11
            i = end
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, 0)
            item, end = first, first + length
            while item < end:
                count = _span_length(item, end, span)
                start = np.uint64(base | _spread(item, low0, low1))
                for r in range(rows):
                    bra = bras[r]
                    term = 0.0 + 0.0j
                    for k in range(count):
                        i0 = start + np.uint64(k)
                        i1 = i0 + step
                        k0, k1 = ket[i0], ket[i1]
                        l0, l1 = bra[i0], bra[i1]
                        term += _letter_product(l0, l1, k0, k1, letter)
                        bra[i0], bra[i1] = _rotated(l0, l1, cos, sin, letter)
                        if fused:
                            ket[i0], ket[i1] = _rotated(k0, k1, cos, sin, letter)
                    sums[r] += term
                if not fused:  # after every bra's product with phi
                    for k in range(count):
                        i0 = start + np.uint64(k)
                        _rotate_pair(ket, i0, i0 + step, cos, sin, letter)
                item += count
            i += length
        partial[c] = sums
    for r in range(rows):
        out[r] = partial[:, r].sum()


@numba.njit(cache=True, inline="always", fastmath=_FASTMATH)
def _rotated_quad(a00, a01, a10, a11, cos0, sin0, letter0, cos1, sin1, letter1):
    """Two one-qubit rotations on the four amplitudes of a work item, ``a<x1><x0>`` with
    x0 the bit of rotation 0 and x1 that of rotation 1 (the rotations commute)."""
    a00, a01 = _rotated(a00, a01, cos0, sin0, letter0)
    a10, a11 = _rotated(a10, a11, cos0, sin0, letter0)
    a00, a10 = _rotated(a00, a10, cos1, sin1, letter1)
    a01, a11 = _rotated(a01, a11, cos1, sin1, letter1)
    return a00, a01, a10, a11


@numba.njit(cache=True, inline="always", fastmath=_FASTMATH)
def _rotate_quad(vec, i0, s0, s1, cos0, sin0, letter0, cos1, sin1, letter1):
    """``_rotated_quad`` in place on the amplitudes i0, i0 + s0, i0 + s1, i0 + s0 + s1."""
    s01 = s0 | s1
    vec[i0], vec[i0 + s0], vec[i0 + s1], vec[i0 + s01] = _rotated_quad(
        vec[i0], vec[i0 + s0], vec[i0 + s1], vec[i0 + s01],
        cos0, sin0, letter0, cos1, sin1, letter1,
    )  # fmt: skip


@numba.njit(cache=True, fastmath=_FASTMATH)
def _quad_index(item, low_bit, high_bit):
    """The lowest index of amplitude quadruple ``item`` on two bits (``low_bit`` <
    ``high_bit``): ``item`` with a zero bit inserted at each."""
    return _pair_index(_pair_index(item, low_bit), high_bit)


@numba.njit(cache=True, inline="always", fastmath=_FASTMATH)
def _quad_spans(v0, v1, v2, v3, j, s0, s1, count):
    """The ``count`` consecutive amplitudes from j, j + s0, j + s1 and j + s0 + s1, each
    sliced from its own argument (the vector passed four times)."""
    s01 = s0 + s1
    return (
        v0[j : j + count],
        v1[j + s0 : j + s0 + count],
        v2[j + s1 : j + s1 + count],
        v3[j + s01 : j + s01 + count],
    )


@numba.njit(cache=True, inline="always", fastmath=_FASTMATH)
def _rotation_pair_on_quad(g0, g1, c0, c1, c2, c3):
    """G_1 G_0 on one quadruple: c0 .. c3 the amplitudes where (bit of rotation 1, bit of
    rotation 0) is 00, 01, 10, 11; ``g0``, ``g1`` the two 2x2 matrices as tuples (scalars,
    not array reads: LLVM cannot prove an array of matrices apart from the vector, and
    re-reading it in the loop keeps the loop scalar, measured 2x slower)."""
    c0, c1 = g0[0] * c0 + g0[1] * c1, g0[2] * c0 + g0[3] * c1
    c2, c3 = g0[0] * c2 + g0[1] * c3, g0[2] * c2 + g0[3] * c3
    c0, c2 = g1[0] * c0 + g1[1] * c2, g1[2] * c0 + g1[3] * c2
    c1, c3 = g1[0] * c1 + g1[1] * c3, g1[2] * c1 + g1[3] * c3
    return c0, c1, c2, c3


@numba.njit(cache=True, fastmath=_FASTMATH)
def _quads_rotation_pair_step(k0, k1, k2, k3, l0, l1, l2, l3, bits, first, end, g, p, sums):
    """One adjoint step back through two one-bit rotations (on ``bits[0]`` and ``bits[1]``)
    over the amplitude quadruples ``first`` .. ``end - 1``: ``sums[j]`` +=
    <bra|P_j|ket>, then bra <- (G_1 G_0) bra. ``k0`` .. ``k3`` are the ket and ``l0`` ..
    ``l3`` the bra, each passed four times (the ``_pairs_*`` loops' reason); ``g[j]`` and
    ``p[j]``: rotation j's inverse and its Pauli letter as 2x2 matrices (flat, row-major).
    The lower bit is at least ``_VECTOR_BIT``."""
    s0, s1 = 1 << bits[0], 1 << bits[1]
    low_bit, high_bit = min(bits[0], bits[1]), max(bits[0], bits[1])
    g0, g1 = (g[0, 0], g[0, 1], g[0, 2], g[0, 3]), (g[1, 0], g[1, 1], g[1, 2], g[1, 3])
    p00, p01, p10, p11 = p[0, 0], p[0, 1], p[0, 2], p[0, 3]
    q00, q01, q10, q11 = p[1, 0], p[1, 1], p[1, 2], p[1, 3]
    term0, term1 = 0j, 0j
    item = first
    while item < end:
        count = _span_count(item, end, low_bit)
        j = _quad_index(item, low_bit, high_bit)
        x0, x1, x2, x3 = _quad_spans(k0, k1, k2, k3, j, s0, s1, count)
        y0, y1, y2, y3 = _quad_spans(l0, l1, l2, l3, j, s0, s1, count)
        for k in range(count):
            c0, c1, c2, c3 = x0[k], x1[k], x2[k], x3[k]
            d0, d1, d2, d3 = y0[k], y1[k], y2[k], y3[k]
            e0, e1, e2, e3 = np.conj(d0), np.conj(d1), np.conj(d2), np.conj(d3)
            term0 += e0 * (p00 * c0 + p01 * c1) + e1 * (p10 * c0 + p11 * c1)
            term0 += e2 * (p00 * c2 + p01 * c3) + e3 * (p10 * c2 + p11 * c3)
            term1 += e0 * (q00 * c0 + q01 * c2) + e2 * (q10 * c0 + q11 * c2)
            term1 += e1 * (q00 * c1 + q01 * c3) + e3 * (q10 * c1 + q11 * c3)
            y0[k], y1[k], y2[k], y3[k] = _rotation_pair_on_quad(g0, g1, d0, d1, d2, d3)
        item += count
    sums[0] += term0
    sums[1] += term1


@numba.njit(cache=True, fastmath=_FASTMATH)
def _quads_rotation_pair(v0, v1, v2, v3, bits, first, end, g):
    """v <- (G_1 G_0) v over the amplitude quadruples ``first`` .. ``end - 1`` on ``bits``
    (``v0`` .. ``v3`` the same vector, ``g`` as in ``_quads_rotation_pair_step``)."""
    s0, s1 = 1 << bits[0], 1 << bits[1]
    low_bit, high_bit = min(bits[0], bits[1]), max(bits[0], bits[1])
    g0, g1 = (g[0, 0], g[0, 1], g[0, 2], g[0, 3]), (g[1, 0], g[1, 1], g[1, 2], g[1, 3])
    item = first
    while item < end:
        count = _span_count(item, end, low_bit)
        j = _quad_index(item, low_bit, high_bit)
        x0, x1, x2, x3 = _quad_spans(v0, v1, v2, v3, j, s0, s1, count)
        for k in range(count):
            x0[k], x1[k], x2[k], x3[k] = _rotation_pair_on_quad(g0, g1, x0[k], x1[k], x2[k], x3[k])
        item += count


@numba.njit(cache=True, fastmath=_FASTMATH)
def _half_angle_cos_sin(angles, sign):
    """cos and sign * sin of angles[0] / 2 and angles[1] / 2."""
    return (
        np.cos(0.5 * angles[0]),
        sign * np.sin(0.5 * angles[0]),
        np.cos(0.5 * angles[1]),
        sign * np.sin(0.5 * angles[1]),
    )


@numba.njit(cache=True, fastmath=_FASTMATH)
def _rotation_pair_matrices(cos0, sin0, letter0, cos1, sin1, letter1):
    """The two rotations as 2x2 matrices (rows of (2, 4), ``_rotation_2x2``)."""
    g = np.empty((2, 4), dtype=np.complex128)
    g[0, 0], g[0, 1], g[0, 2], g[0, 3] = _rotation_2x2(cos0, sin0, letter0)
    g[1, 0], g[1, 1], g[1, 2], g[1, 3] = _rotation_2x2(cos1, sin1, letter1)
    return g


@Kernel.compile
def apply_rotation_pair(state, angles, letters, targets, fixed_bits):
    """exp(-i angles[b, j]/2 P_j) for two one-qubit rotations on distinct bits (letters
    1: X, 2: Y, 3: Z), in one pass: each work item's four amplitudes stay in registers.
    ``angles``: (1 or B, 2)."""
    batch, dim = state.shape
    items, per, run_length, low0, low1, span = _work_layout(batch, dim, fixed_bits)
    shared = angles.shape[0] == 1
    s0, s1 = np.uint64(1 << targets[0]), np.uint64(1 << targets[1])
    letter0, letter1 = letters[0], letters[1]
    spans = len(fixed_bits) == 2 and fixed_bits[0] >= _VECTOR_BIT
    for job in numba.prange(batch * per):
        b, i, hi = _job_range(job, per, items)
        cos0, sin0, cos1, sin1 = _half_angle_cos_sin(angles[0] if shared else angles[b], 1.0)
        vec = state[b]
        if spans:
            g = _rotation_pair_matrices(cos0, sin0, letter0, cos1, sin1, letter1)
            _quads_rotation_pair(vec, vec, vec, vec, targets, i, hi, g)
            continue
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, 0)
            item, end = first, first + length
            while item < end:
                count = _span_length(item, end, span)
                start = np.uint64(base | _spread(item, low0, low1))
                for k in range(count):
                    i0 = start + np.uint64(k)
                    _rotate_quad(vec, i0, s0, s1, cos0, sin0, letter0, cos1, sin1, letter1)
                item += count
            i += length


@Kernel.compile
def rotation_pair_step(phi, bras, angles, letters, targets, fixed_bits, out):
    """One adjoint step back through ``apply_rotation_pair``, in one pass: out[job, r, j]
    sums <bra_r|P_j|phi> over the job's work items (both at the pair's end: the rotations
    commute), then both rotations are undone on phi_b and on its bras (rows b*R .. b*R+R-1)."""
    batch, dim = phi.shape
    rows = bras.shape[0] // batch
    items, per, run_length, low0, low1, span = _work_layout(batch, dim, fixed_bits)
    shared = angles.shape[0] == 1
    s0, s1 = np.uint64(1 << targets[0]), np.uint64(1 << targets[1])
    s01 = s0 | s1
    letter0, letter1 = letters[0], letters[1]
    fused = rows == 1  # one bra: phi is undone in the bra's loop, one pass over both
    spans = len(fixed_bits) == 2 and fixed_bits[0] >= _VECTOR_BIT
    letter_matrices = np.empty((2, 4), dtype=np.complex128)
    for j in range(2):
        p = letter_matrices[j]
        p[0], p[1], p[2], p[3] = _letter_2x2(letters[j])
    for job in numba.prange(batch * per):
        b, i, hi = _job_range(job, per, items)
        cos0, sin0, cos1, sin1 = _half_angle_cos_sin(angles[0] if shared else angles[b], -1.0)
        ket = phi[b]
        sums = np.zeros((rows, 2), dtype=np.complex128)
        g = _rotation_pair_matrices(cos0, sin0, letter0, cos1, sin1, letter1)
        while spans and i < hi:  # in blocks that stay in cache across the bras
            end = min(hi, i + _STEP_BLOCK)
            for r in range(rows):
                bra = bras[b * rows + r]
                _quads_rotation_pair_step(
                    ket, ket, ket, ket, bra, bra, bra, bra, targets, i, end, g,
                    letter_matrices, sums[r],
                )  # fmt: skip
            _quads_rotation_pair(ket, ket, ket, ket, targets, i, end, g)
            i = end
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, 0)
            item, end = first, first + length
            while item < end:
                count = _span_length(item, end, span)
                start = np.uint64(base | _spread(item, low0, low1))
                for r in range(rows):
                    bra = bras[b * rows + r]
                    term0 = term1 = 0.0 + 0.0j
                    for k in range(count):
                        i0 = start + np.uint64(k)
                        k00, k01, k10, k11 = ket[i0], ket[i0 + s0], ket[i0 + s1], ket[i0 + s01]
                        l00, l01, l10, l11 = bra[i0], bra[i0 + s0], bra[i0 + s1], bra[i0 + s01]
                        term0 += _letter_product(l00, l01, k00, k01, letter0)
                        term0 += _letter_product(l10, l11, k10, k11, letter0)
                        term1 += _letter_product(l00, l10, k00, k10, letter1)
                        term1 += _letter_product(l01, l11, k01, k11, letter1)
                        bra[i0], bra[i0 + s0], bra[i0 + s1], bra[i0 + s01] = _rotated_quad(
                            l00, l01, l10, l11, cos0, sin0, letter0, cos1, sin1, letter1
                        )
                        if fused:
                            ket[i0], ket[i0 + s0], ket[i0 + s1], ket[i0 + s01] = _rotated_quad(
                                k00, k01, k10, k11, cos0, sin0, letter0, cos1, sin1, letter1
                            )
                    sums[r, 0] += term0
                    sums[r, 1] += term1
                if not fused:  # after every bra's products with phi
                    for k in range(count):
                        i0 = start + np.uint64(k)
                        _rotate_quad(ket, i0, s0, s1, cos0, sin0, letter0, cos1, sin1, letter1)
                item += count
            i += length
        out[job] = sums


@numba.njit(cache=True, fastmath=_FASTMATH)
def _low_diagonal_step(ket, bras, diag, signs, targets, out):
    """``diagonal_step`` where a target is among the three lowest bits: the factors then
    repeat every 8 amplitudes, so each block of 8 reads them (the undo factors and the real
    generator signs) from a row of 8 chosen by the targets above bit 2. A state of fewer
    than 8 amplitudes (one or two qubits) is one block of its size (it was none: the gate
    was neither undone nor differentiated)."""
    rows, dim = bras.shape
    width = min(8, dim)
    k = targets.shape[0]
    high = np.empty(k, dtype=np.int64)
    rank = np.full(k, -1)
    count = 0
    for m in range(k):
        if targets[m] >= 3:
            high[count] = targets[m]
            rank[m] = count
            count += 1
    high = high[:count]
    undo = np.empty((1 << count, width), dtype=np.complex128)
    sign = np.empty((1 << count, width))
    for h in range(1 << count):
        for j in range(width):
            a = 0
            for m in range(k):
                bit = (j >> targets[m]) & 1 if rank[m] < 0 else (h >> rank[m]) & 1
                a |= bit << m
            undo[h, j] = np.conj(diag[a])
            sign[h, j] = signs[a].real
    for r in range(rows):
        bra = bras[r]
        term = 0.0 + 0.0j
        for block in range(dim // width):
            base = block * width
            h = 0
            for m in range(count):
                h |= ((base >> high[m]) & 1) << m
            factor = undo[h]
            weight = sign[h]
            for j in range(width):
                left = bra[base + j]
                value = ket[base + j]
                term += weight[j] * (np.conj(left) * value)
                bra[base + j] = left * factor[j]
                if r == rows - 1:
                    ket[base + j] = value * factor[j]
        out[r] = term


@Kernel.compile
def diagonal_step(phi, bras, diag, signs, targets, fixed_bits, out):
    """One adjoint step through a diagonal gate whose generator is diagonal too (a
    rotation about a word of Z): out[r] = <bra_r|diag(signs)|phi>, then phi and every bra
    times conj(diag), in a single pass."""
    rows, dim = bras.shape
    items, per, run_length, low0, low1, span = _work_layout(1, dim, fixed_bits)
    offsets = _target_offsets(targets)
    partial = np.zeros((per, rows), dtype=np.complex128)
    ket = phi[0]
    if span < _MIN_SPAN:
        _low_diagonal_step(ket, bras, diag, signs, targets, out)
        return
    for c in numba.prange(per):
        _, i, hi = _job_range(c, per, items)
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, 0)
            for a in range(offsets.shape[0]):
                undo = np.conj(diag[a])
                sign = signs[a]
                offset = offsets[a]
                item, end = first, first + length
                while item < end:
                    count = _span_length(item, end, span)
                    start = np.uint64(base | _spread(item, low0, low1)) + offset
                    if rows == 1:  # a VJP: ket and bra in one loop
                        bra = bras[0]
                        term = 0.0 + 0.0j
                        for k in range(count):
                            index = start + np.uint64(k)
                            value = ket[index]
                            term += np.conj(bra[index]) * value
                            bra[index] *= undo
                            ket[index] = value * undo
                        partial[c, 0] += sign * term
                    else:
                        for r in range(rows):
                            bra = bras[r]
                            term = 0.0 + 0.0j
                            for k in range(count):
                                index = start + np.uint64(k)
                                term += np.conj(bra[index]) * ket[index]
                                bra[index] *= undo
                            partial[c, r] += sign * term
                        for k in range(count):
                            ket[start + np.uint64(k)] *= undo
                    item += count
            i += length
    for r in range(rows):
        out[r] = partial[:, r].sum()


@numba.njit(cache=True, fastmath=_FASTMATH)
def _pair_steps(targets):
    """Index offsets of the two target bits."""
    return np.uint64(1 << targets[0]), np.uint64(1 << targets[1])


@numba.njit(cache=True, inline="always", fastmath=_FASTMATH)
def _apply_4(vec, i0, s0, s1, m):
    """The four amplitudes i0, i0+s0, i0+s1, i0+s0+s1 of ``vec`` <- m times them; returns
    the new values."""
    s01 = s0 | s1
    a0, a1, a2, a3 = vec[i0], vec[i0 + s0], vec[i0 + s1], vec[i0 + s01]
    p0 = m[0, 0] * a0 + m[0, 1] * a1 + m[0, 2] * a2 + m[0, 3] * a3
    p1 = m[1, 0] * a0 + m[1, 1] * a1 + m[1, 2] * a2 + m[1, 3] * a3
    p2 = m[2, 0] * a0 + m[2, 1] * a1 + m[2, 2] * a2 + m[2, 3] * a3
    p3 = m[3, 0] * a0 + m[3, 1] * a1 + m[3, 2] * a2 + m[3, 3] * a3
    vec[i0], vec[i0 + s0], vec[i0 + s1], vec[i0 + s01] = p0, p1, p2, p3
    return p0, p1, p2, p3


@Kernel.compile
def apply_2q(state, mats, targets, fixed_bits, control_mask):
    batch, dim = state.shape
    items, per, run_length, low0, low1, span = _work_layout(batch, dim, fixed_bits)
    shared = mats.shape[0] == 1
    s0, s1 = _pair_steps(targets)
    for job in numba.prange(batch * per):
        b, i, hi = _job_range(job, per, items)
        m = mats[0] if shared else mats[b]
        vec = state[b]
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, control_mask)
            for item in range(first, first + length):
                i0 = np.uint64(base | _spread(item, low0, low1))
                _apply_4(vec, i0, s0, s1, m)
            i += length


@Kernel.compile
def apply_kq(state, mats, targets, fixed_bits, control_mask):
    batch, dim = state.shape
    items, per, run_length, low0, low1, span = _work_layout(batch, dim, fixed_bits)
    shared = mats.shape[0] == 1
    offsets = _target_offsets(targets)
    d = offsets.shape[0]
    for job in numba.prange(batch * per):
        b, i, hi = _job_range(job, per, items)
        m = mats[0] if shared else mats[b]
        vec = state[b]
        old = np.empty(d, dtype=state.dtype)
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, control_mask)
            for item in range(first, first + length):
                i0 = np.uint64(base | _spread(item, low0, low1))
                _apply_dense(vec, i0, offsets, m, old)
            i += length


@Kernel.compile
def block_step_1q(phi, bras, adjoints, target, out):
    """``block_step`` for a block on one bit (blocks have no controls), in blocks of
    ``_STEP_BLOCK`` amplitude pairs: the ket (``_pairs_2x2``), then each bra
    (``_pairs_step``), while the ket's block is in cache."""
    batch, dim = phi.shape
    rows = bras.shape[0] // batch
    items = dim >> 1
    per = _chunks_per_vector(batch, items)
    shared = adjoints.shape[0] == 1
    for job in numba.prange(batch * per):
        b, i, hi = _job_range(job, per, items)
        m = adjoints[0] if shared else adjoints[b]
        m00, m01, m10, m11 = m[0, 0], m[0, 1], m[1, 0], m[1, 1]
        ket = phi[b]
        sums = np.zeros((rows, 4), dtype=np.complex128)
        while i < hi:
            end = min(hi, i + _STEP_BLOCK)
            swaps = _swaps_pay(target, i, end)
            bit, first, last = (0, 0, end - i) if swaps else (target, i, end)
            kets = ket[2 * i : 2 * end] if swaps else ket  # the block's amplitudes
            if swaps:
                _swap_with_bit_zero(kets, target)
            _pairs_2x2(kets, kets, bit, first, last, m00, m01, m10, m11)
            for r in range(rows):
                bra = bras[b * rows + r]
                block = bra[2 * i : 2 * end] if swaps else bra
                if swaps:
                    _swap_with_bit_zero(block, target)
                t00, t01, t10, t11 = _pairs_step(
                    kets, kets, block, block, bit, first, last, m00, m01, m10, m11, True
                )
                if swaps:
                    _swap_with_bit_zero(block, target)
                sums[r, 0] += t00
                sums[r, 1] += t01
                sums[r, 2] += t10
                sums[r, 3] += t11
            if swaps:
                _swap_with_bit_zero(kets, target)
            i = end
        for r in range(rows):
            out[job, r, 0, 0] = sums[r, 0]
            out[job, r, 0, 1] = sums[r, 1]
            out[job, r, 1, 0] = sums[r, 2]
            out[job, r, 1, 1] = sums[r, 3]


@Kernel.compile
def block_step_2q(phi, bras, adjoints, targets, fixed_bits, out):
    """``block_step`` for a block on two bits, its four amplitudes in registers."""
    batch, dim = phi.shape
    rows = bras.shape[0] // batch
    items, per, run_length, low0, low1, span = _work_layout(batch, dim, fixed_bits)
    shared = adjoints.shape[0] == 1
    s0, s1 = _pair_steps(targets)
    s01 = s0 | s1
    for job in numba.prange(batch * per):
        b, i, hi = _job_range(job, per, items)
        m = adjoints[0] if shared else adjoints[b]
        ket = phi[b]
        sums = np.zeros((rows, 4, 4), dtype=np.complex128)
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, 0)
            for item in range(first, first + length):
                i0 = np.uint64(base | _spread(item, low0, low1))
                p0, p1, p2, p3 = _apply_4(ket, i0, s0, s1, m)
                for r in range(rows):
                    bra = bras[b * rows + r]
                    l0, l1, l2, l3 = bra[i0], bra[i0 + s0], bra[i0 + s1], bra[i0 + s01]
                    t = sums[r]
                    for a, la in enumerate((l0, l1, l2, l3)):
                        left = np.conj(la)
                        t[a, 0] += left * p0
                        t[a, 1] += left * p1
                        t[a, 2] += left * p2
                        t[a, 3] += left * p3
                    _apply_4(bra, i0, s0, s1, m)
            i += length
        out[job] = sums


@Kernel.compile
def block_step(phi, bras, adjoints, targets, fixed_bits, out):
    """One step of the deferred adjoint sweep back through a block M on ``targets``, in a
    single pass: phi_b <- M_b^dagger phi_b, and for each bra r of vector b (row b*R + r),
    out[job, r] += conj(bra[a]) (M_b^dagger phi_b)[c] summed over the job's work items
    before bra <- M_b^dagger bra. ``adjoints`` holds M^dagger, (1 or B, d, d)."""
    batch, dim = phi.shape
    rows = bras.shape[0] // batch
    items, per, run_length, low0, low1, span = _work_layout(batch, dim, fixed_bits)
    shared = adjoints.shape[0] == 1
    offsets = _target_offsets(targets)
    d = offsets.shape[0]
    for job in numba.prange(batch * per):
        b, i, hi = _job_range(job, per, items)
        m = adjoints[0] if shared else adjoints[b]
        ket = phi[b]
        old = np.empty(d, dtype=phi.dtype)
        new = np.empty(d, dtype=phi.dtype)
        sums = np.zeros((rows, d, d), dtype=np.complex128)
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, 0)
            for item in range(first, first + length):
                i0 = np.uint64(base | _spread(item, low0, low1))
                _gather(ket, i0, offsets, old)
                for a in range(d):  # new: M^dagger phi on the work item
                    value = _row_times(m, a, old)
                    new[a] = value
                    ket[i0 + offsets[a]] = value
                for r in range(rows):
                    bra = bras[b * rows + r]
                    _gather(bra, i0, offsets, old)
                    for a in range(d):
                        left = np.conj(old[a])
                        for c in range(d):
                            sums[r, a, c] += left * new[c]
                    _store_product(bra, i0, offsets, m, old)
            i += length
        out[job] = sums


@numba.njit(cache=True, fastmath=_FASTMATH)
def _apply_two_bit_diagonal(state, diags, t0, t1):
    """A diagonal on two bits without controls, one amplitude after the other: where a
    target is among the lowest bits, runs of consecutive amplitudes are too short to
    walk, and reading the entry from the two bits is cheaper."""
    batch, dim = state.shape
    shared = diags.shape[0] == 1
    s0 = np.uint64(t0)
    s1 = np.uint64(t1)
    one = np.uint64(1)
    for b in range(batch):
        diag = diags[0] if shared else diags[b]
        vec = state[b]
        for i in range(dim):
            u = np.uint64(i)
            vec[u] *= diag[((u >> s0) & one) | (((u >> s1) & one) << one)]


@Kernel.compile
def apply_diagonal(state, diags, targets, fixed_bits, control_mask):
    """fixed_bits holds the targets and the controls: each work item has one amplitude per
    diagonal entry, at a fixed offset, so every inner loop multiplies by one constant."""
    batch, dim = state.shape
    items, per, run_length, low0, low1, span = _work_layout(batch, dim, fixed_bits)
    shared = diags.shape[0] == 1
    offsets = _target_offsets(targets)
    if span < _MIN_SPAN and len(targets) == 2 and len(fixed_bits) == 2:
        _apply_two_bit_diagonal(state, diags, targets[0], targets[1])
        return
    for job in numba.prange(batch * per):
        b, i, hi = _job_range(job, per, items)
        diag = diags[0] if shared else diags[b]
        vec = state[b]
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, control_mask)
            for a in range(offsets.shape[0]):
                factor = diag[a]
                offset = offsets[a]
                item, end = first, first + length
                while item < end:
                    count = _span_length(item, end, span)
                    start = np.uint64(base | _spread(item, low0, low1)) + offset
                    for k in range(count):
                        vec[start + np.uint64(k)] *= factor
                    item += count
            i += length


@Kernel.compile
def inner_diagonal(bra, ket, diag, targets, fixed_bits, out):
    """out[b] = <bra_b| diag(d)_targets |ket_b> (complex); a single ket serves every bra."""
    batch, dim = bra.shape
    shared_ket = ket.shape[0] == 1
    items, per, run_length, low0, low1, span = _work_layout(batch, dim, fixed_bits)
    offsets = _target_offsets(targets)
    partial = np.zeros(batch * per, dtype=np.complex128)
    for job in numba.prange(batch * per):
        b, i, hi = _job_range(job, per, items)
        left = bra[b]
        right = ket[0] if shared_ket else ket[b]
        acc = 0.0 + 0.0j
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, 0)
            for a in range(offsets.shape[0]):
                offset = offsets[a]
                term = 0.0 + 0.0j
                item, end = first, first + length
                while item < end:
                    count = _span_length(item, end, span)
                    start = np.uint64(base | _spread(item, low0, low1)) + offset
                    for k in range(count):
                        index = start + np.uint64(k)
                        term += np.conj(left[index]) * right[index]
                    item += count
                acc += diag[a] * term
            i += length
        partial[job] = acc
    for b in range(batch):
        out[b] = partial[b * per : (b + 1) * per].sum()


@Kernel.compile
def apply_pauli_rotation(state, angles, x_mask, z_mask, i_power, fixed_bits, control_mask):
    """exp(-i angle/2 P). With x_mask != 0, fixed_bits include the pivot (top bit of x_mask)."""
    x_bits = np.uint64(x_mask)
    z_bits = np.uint64(z_mask)
    batch, dim = state.shape
    items, per, run_length, low0, low1, span = _work_layout(batch, dim, fixed_bits)
    shared = angles.shape[0] == 1
    for job in numba.prange(batch * per):
        b, i, hi = _job_range(job, per, items)
        half = 0.5 * (angles[0] if shared else angles[b])
        cos = np.cos(half)
        minus_i_sin = -1j * np.sin(half)
        vec = state[b]
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, control_mask)
            if x_mask == 0:
                for item in range(first, first + length):
                    idx = np.uint64(base | _spread(item, low0, low1))
                    vec[idx] *= cos + minus_i_sin * _pauli_phase(idx, z_bits, i_power)
            else:
                for item in range(first, first + length):
                    i0 = np.uint64(base | _spread(item, low0, low1))
                    i1 = i0 ^ x_bits
                    a0 = vec[i0]
                    a1 = vec[i1]
                    vec[i0] = cos * a0 + minus_i_sin * _pauli_phase(i1, z_bits, i_power) * a1
                    vec[i1] = cos * a1 + minus_i_sin * _pauli_phase(i0, z_bits, i_power) * a0
            i += length


@Kernel.compile
def apply_pauli(state, x_mask, z_mask, i_power, fixed_bits, control_mask):
    """P = i**n_Y X^x Z^z on the selected bits; the pivot rule is that of the rotation."""
    x_bits = np.uint64(x_mask)
    z_bits = np.uint64(z_mask)
    batch, dim = state.shape
    items, per, run_length, low0, low1, span = _work_layout(batch, dim, fixed_bits)
    plain_flip = z_mask == 0
    for job in numba.prange(batch * per):
        b, i, hi = _job_range(job, per, items)
        vec = state[b]
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, control_mask)
            if x_mask == 0:
                for item in range(first, first + length):
                    idx = np.uint64(base | _spread(item, low0, low1))
                    vec[idx] *= _pauli_phase(idx, z_bits, i_power)
            elif plain_flip:
                for item in range(first, first + length):
                    i0 = np.uint64(base | _spread(item, low0, low1))
                    i1 = i0 ^ x_bits
                    a0 = vec[i0]
                    vec[i0] = vec[i1]
                    vec[i1] = a0
            else:
                for item in range(first, first + length):
                    i0 = np.uint64(base | _spread(item, low0, low1))
                    i1 = i0 ^ x_bits
                    a0 = vec[i0]
                    vec[i0] = _pauli_phase(i1, z_bits, i_power) * vec[i1]
                    vec[i1] = _pauli_phase(i0, z_bits, i_power) * a0
            i += length


@Kernel.compile
def inner_pauli(bra, ket, x_mask, z_mask, i_power, fixed_bits, out):
    """out[b] = <bra_b| P |ket_b> (complex); a single ket serves every bra. With x_mask != 0,
    fixed_bits holds the pivot (top bit of x_mask) and each work item is the pair
    (i0, i1 = i0 ^ x_mask), P|i> = phase(i)|i ^ x_mask>; a word of X and I has no phase."""
    x_bits = np.uint64(x_mask)
    z_bits = np.uint64(z_mask)
    batch, dim = bra.shape
    shared_ket = ket.shape[0] == 1
    items, per, run_length, low0, low1, span = _work_layout(batch, dim, fixed_bits)
    partial = np.zeros(batch * per, dtype=np.complex128)
    for job in numba.prange(batch * per):
        b, i, hi = _job_range(job, per, items)
        left = bra[b]
        right = ket[0] if shared_ket else ket[b]
        acc = 0.0 + 0.0j
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, 0)
            item, end = first, first + length
            while item < end:
                count = _span_length(item, end, span)
                start = np.uint64(base | _spread(item, low0, low1))
                if x_mask == 0:
                    for k in range(count):
                        u = start + np.uint64(k)
                        acc += np.conj(left[u]) * _pauli_phase(u, z_bits, i_power) * right[u]
                elif z_mask == 0:
                    for k in range(count):
                        i0 = start + np.uint64(k)
                        i1 = i0 ^ x_bits
                        acc += np.conj(left[i1]) * right[i0] + np.conj(left[i0]) * right[i1]
                else:
                    for k in range(count):
                        i0 = start + np.uint64(k)
                        i1 = i0 ^ x_bits
                        acc += np.conj(left[i1]) * _pauli_phase(i0, z_bits, i_power) * right[i0]
                        acc += np.conj(left[i0]) * _pauli_phase(i1, z_bits, i_power) * right[i1]
                item += count
            i += length
        partial[job] = acc
    for b in range(batch):
        out[b] = partial[b * per : (b + 1) * per].sum()


@Kernel.compile
def inner_matrix(bra, ket, mat, targets, fixed_bits, out):
    """out[b] = <bra_b| M_targets |ket_b> (complex); a single ket serves every bra."""
    batch, dim = bra.shape
    shared_ket = ket.shape[0] == 1
    items, per, run_length, low0, low1, span = _work_layout(batch, dim, fixed_bits)
    offsets = _target_offsets(targets)
    d = offsets.shape[0]
    partial = np.zeros(batch * per, dtype=np.complex128)
    for job in numba.prange(batch * per):
        b, i, hi = _job_range(job, per, items)
        left = bra[b]
        right = ket[0] if shared_ket else ket[b]
        amplitudes = np.empty(d, dtype=np.complex128)
        acc = 0.0 + 0.0j
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, 0)
            for item in range(first, first + length):
                i0 = np.uint64(base | _spread(item, low0, low1))
                _gather(right, i0, offsets, amplitudes)
                for a in range(d):  # a sum from zero: through _row_times 1.1-1.3x slower, k = 3
                    row = 0.0 + 0.0j
                    for c in range(d):
                        row += mat[a, c] * amplitudes[c]
                    acc += np.conj(left[i0 + offsets[a]]) * row
            i += length
        partial[job] = acc
    for b in range(batch):
        out[b] = partial[b * per : (b + 1) * per].sum()


@Kernel.compile
def add_scaled(dst, src, factors):
    """dst[b] += factors[b] * src[b]; a single src vector or factor serves every dst."""
    batch, dim = dst.shape
    shared_src = src.shape[0] == 1
    shared_factor = factors.shape[0] == 1
    per = _chunks_per_vector(batch, dim)
    for job in numba.prange(batch * per):
        b, first, end = _job_range(job, per, dim)
        factor = factors[0] if shared_factor else factors[b]
        target = dst[b]
        source = src[0] if shared_src else src[b]
        for i in range(first, end):
            u = np.uint64(i)
            target[u] += factor * source[u]


@Kernel.compile
def add_z_sum(dst, src, z_masks, coefficients):
    """dst[b] += (sum_k c_k Z-word_k) src[b]: words of Z and I are diagonal, so the sum is
    one factor per amplitude, computed on the fly; a single src serves every dst."""
    batch, dim = dst.shape
    shared_src = src.shape[0] == 1
    per = _chunks_per_vector(batch, dim)
    words = z_masks.shape[0]
    for job in numba.prange(batch * per):
        b, first, end = _job_range(job, per, dim)
        target = dst[b]
        source = src[0] if shared_src else src[b]
        for i in range(first, end):
            u = np.uint64(i)
            factor = 0.0 + 0.0j
            for k in range(words):
                factor += coefficients[k] * (1.0 - 2.0 * _parity(u & z_masks[k]))
            target[u] += factor * source[u]


@Kernel.compile
def add_z_sum_by_blocks(dst, src, block_coefficients, low_signs, low):
    """dst[b] += diag(d) src[b] for d[h * 2**low + l] = sum_g block_coefficients[h, g]
    low_signs[g, l]: each block's factors are built in a small row while it is in cache,
    never as a vector of the state's length. A single src vector serves every dst."""
    batch, dim = dst.shape
    shared_src = src.shape[0] == 1
    blocks = dim >> low
    size = 1 << low
    groups = low_signs.shape[0]
    for job in numba.prange(batch * blocks):
        b = job // blocks
        h = job - b * blocks
        target = dst[b]
        source = src[0] if shared_src else src[b]
        base = h << low
        real = np.zeros(size)
        imag = np.zeros(size)
        for g in range(groups):
            coefficient = block_coefficients[h, g]
            signs = low_signs[g]
            for i in range(size):  # real arithmetic: the sign rows are real
                real[i] += coefficient.real * signs[i]
                imag[i] += coefficient.imag * signs[i]
        for i in range(size):
            target[base + i] += complex(real[i], imag[i]) * source[base + i]


@numba.njit(cache=True, fastmath=_FASTMATH)
def _signed_sum(signs, values):
    """sum_i signs[i] values[i], in four partial sums (one running sum would wait on each
    addition's latency)."""
    size = values.shape[0]
    whole = size - size % 4
    t0 = t1 = t2 = t3 = 0.0
    for i in range(0, whole, 4):
        t0 += signs[i] * values[i]
        t1 += signs[i + 1] * values[i + 1]
        t2 += signs[i + 2] * values[i + 2]
        t3 += signs[i + 3] * values[i + 3]
    for i in range(whole, size):
        t0 += signs[i] * values[i]
    return (t0 + t1) + (t2 + t3)


@Kernel.compile
def low_sign_sums(state, low_signs, low, out):
    """out[b, h, g] = sum_l low_signs[g, l] |psi_b[h * 2**low + l]|^2: each block of 2**low
    consecutive amplitudes (the high bits fixed) summed against every row of signs while
    it is in cache."""
    batch, dim = state.shape
    blocks = dim >> low
    size = 1 << low
    groups = low_signs.shape[0]
    for job in numba.prange(batch * blocks):
        b = job // blocks
        h = job - b * blocks
        vec = state[b]
        base = h << low
        probability = np.empty(size)
        for i in range(size):
            v = vec[base + i]
            probability[i] = v.real * v.real + v.imag * v.imag
        for g in range(groups):
            out[b, h, g] = _signed_sum(low_signs[g], probability)


@numba.njit(cache=True, fastmath=_FASTMATH)
def _block_phases(counts, low_signs, tables, job, blocks):
    """(vector b, first index, phases) of job's block of 2**low amplitudes (high bits h):
    phases[l] = prod_v tables[b, v, n_v + J], where n_v = sum_g counts[v, g, h]
    low_signs[g, l] is the sum of the signs of the words of angle group v at that index
    (an integer from -J to J). The sums run over l innermost, so that they vectorise."""
    b = job // blocks
    h = job - b * blocks
    table = tables[0] if tables.shape[0] == 1 else tables[b]
    groups, size = low_signs.shape
    offset = (table.shape[1] - 1) // 2
    phases = np.ones(size, dtype=np.complex128)
    index = np.empty(size)
    for v in range(counts.shape[0]):
        for i in range(size):
            index[i] = offset + 0.5
        for g in range(groups):
            c = counts[v, g, h]
            if c != 0.0:
                row = low_signs[g]
                for i in range(size):
                    index[i] += c * row[i]
        for i in range(size):
            phases[i] *= table[v, int(index[i])]
    return b, h * size, phases


@Kernel.compile
def apply_z_phases(state, counts, low_signs, tables, low):
    """Commuting Z-word rotations in one pass: each amplitude times the product over
    angle groups of exp(-i theta_v/2 n_v), looked up in ``tables`` (1 or B, V, 2J+1)."""
    batch, dim = state.shape
    blocks = dim >> low
    for job in numba.prange(batch * blocks):
        b, base, phases = _block_phases(counts, low_signs, tables, job, blocks)
        vec = state[b]
        for i in range(phases.shape[0]):
            vec[base + i] *= phases[i]


@Kernel.compile
def z_rotations_step(phi, bras, counts, low_signs, tables, low, out):
    """The deferred sweep's step back through ``apply_z_phases``: out[job, r, g] =
    sum_l low_signs[g, l] conj(bra_r[x]) phi[x] over the job's block (x = h * 2**low + l),
    before both are multiplied by the conjugate phases (``tables`` hold the forward ones)."""
    batch, dim = phi.shape
    rows = bras.shape[0] // batch
    blocks = dim >> low
    size = 1 << low
    groups = low_signs.shape[0]
    for job in numba.prange(batch * blocks):
        b, base, phases = _block_phases(counts, low_signs, tables, job, blocks)
        ket = phi[b]
        real = np.empty(size)
        imag = np.empty(size)
        for r in range(rows):
            bra = bras[b * rows + r]
            for i in range(size):
                w = np.conj(bra[base + i]) * ket[base + i]
                real[i] = w.real
                imag[i] = w.imag
                bra[base + i] *= np.conj(phases[i])
            for g in range(groups):
                out[job, r, g] = complex(
                    _signed_sum(low_signs[g], real), _signed_sum(low_signs[g], imag)
                )
        for i in range(size):
            ket[base + i] *= np.conj(phases[i])


@Kernel.compile
def marginal_probs(state, bits, out):
    """out[b, a] = sum of |psi_b[i]|^2 over i whose bits[j] give bit j of a."""
    batch, dim = state.shape
    per = _chunks_per_vector(batch, dim)
    k = len(bits)
    d = out.shape[1]
    partial = np.zeros((batch * per, d))
    for job in numba.prange(batch * per):
        b, first, end = _job_range(job, per, dim)
        vec = state[b]
        hist = partial[job]
        for i in range(first, end):
            a = 0
            for j in range(k):
                a |= ((i >> bits[j]) & 1) << j
            v = vec[i]
            hist[a] += v.real * v.real + v.imag * v.imag
    for b in range(batch):
        out[b] = partial[b * per : (b + 1) * per].sum(axis=0)


@Kernel.compile
def product_state(state, low, high, low_count, zero_bits):
    """state[b] <- the product state whose amplitude at the index with the bits
    ``zero_bits`` removed, c, is low[b, c mod 2**low_count] * high[b, c >> low_count]: the
    product of the factors of the low and of the high set bits, tabulated (one
    multiplication per amplitude). Indices with a zero bit set are left as they are."""
    batch = state.shape[0]
    n_low = low.shape[1]
    total = n_low * high.shape[1]
    per = _chunks_per_vector(batch, total)
    for job in numba.prange(batch * per):
        b, c, end = _job_range(job, per, total)
        lows, highs, vec = low[b], high[b], state[b]
        while c < end:
            vec[_insert_zeros(c, zero_bits)] = lows[c & (n_low - 1)] * highs[c >> low_count]
            c += 1


# --- bit permutations --------------------------------------------------------------------


@numba.njit(cache=True, fastmath=_FASTMATH)
def _linear_image(index, columns):
    """XOR of ``columns[j]`` over the set bits j of ``index``: a linear map of index bits
    over GF(2), given by its columns."""
    image = 0
    j = 0
    while index:
        if index & 1:
            image ^= columns[j]
        index >>= 1
        j += 1
    return image


@numba.njit(cache=True, fastmath=_FASTMATH)
def _compress(index, bits):
    """The bits ``bits`` (ascending) of ``index``, packed: bit k of the result is bit
    ``bits[k]`` of ``index``."""
    packed = 0
    for k in range(bits.shape[0]):
        packed |= ((index >> bits[k]) & 1) << k
    return packed


@numba.njit(cache=True, fastmath=_FASTMATH)
def _expand(packed, bits):
    """The inverse of ``_compress``: bit k of ``packed`` placed at ``bits[k]``."""
    index = 0
    for k in range(bits.shape[0]):
        index |= ((packed >> k) & 1) << bits[k]
    return index


@numba.njit(cache=True, fastmath=_FASTMATH)
def _xor_table(columns, size):
    """table[i] = XOR of ``columns[k]`` over the set bits k of i, for i < ``size`` (a power
    of two), one XOR per entry."""
    table = np.zeros(size, dtype=np.int64)
    for i in range(1, size):
        lowest = i & -i
        k = 0
        while (1 << k) != lowest:
            k += 1
        table[i] = table[i ^ lowest] ^ columns[k]
    return table


@Kernel.compile
def apply_bit_permutation(state, sources, group_bits, outside_bits, chunk_bits, run_bits, buffers):
    """psi(y) <- psi(src(y)) on every vector, src(y) = XOR of ``sources[j]`` over the set
    bits j of y, XOR ``sources[n]``: an affine map of the index bits (a run of CNOTs and X
    gates). The map moves only bits of ``group_bits`` (ascending; its lowest
    ``chunk_bits`` are bits 0 .. chunk_bits - 1), so the amplitudes that share every other
    bit (``outside_bits``) form a group that maps onto itself: each group is read into a
    worker's buffer (``buffers``, one row per worker, 2**len(group_bits) each) in
    contiguous chunks of 2**chunk_bits, and written back permuted. One read and one write
    per amplitude, whatever the number of gates in the run."""
    batch, dim = state.shape
    n = sources.shape[0] - 1
    workers = buffers.shape[0]
    width = group_bits.shape[0]
    chunk = 1 << chunk_bits
    run = 1 << run_bits
    chunks = 1 << (width - chunk_bits)
    groups = dim >> width
    # packed[k]: the source of group bit k's unit index, packed; the group's offset of each
    # chunk; the packed sources of each run's first amplitude in a chunk and of each chunk
    packed = np.empty(width, dtype=np.int64)
    for k in range(width):
        packed[k] = _compress(_linear_image(1 << group_bits[k], sources), group_bits)
    chunk_offsets = np.empty(chunks, dtype=np.int64)
    high_sources = _xor_table(packed[chunk_bits:], chunks)
    for h in range(chunks):
        chunk_offsets[h] = _expand(h << chunk_bits, group_bits)
    run_sources = _xor_table(packed[run_bits:chunk_bits], chunk >> run_bits)
    for worker in numba.prange(workers):
        buffer = buffers[worker]
        for job in range(worker, batch * groups, workers):
            b = job // groups
            base = _expand(job - b * groups, outside_bits)
            vec = state[b]
            for h in range(chunks):
                start = base | chunk_offsets[h]
                buffer[h << chunk_bits : (h + 1) << chunk_bits] = vec[start : start + chunk]
            # src(base | y') = base XOR expand(shift XOR packed src of y'), as src of a
            # group's fixed bits moves only group bits
            shift = _compress(_linear_image(base, sources) ^ base ^ sources[n], group_bits)
            for h in range(chunks):
                start = base | chunk_offsets[h]
                offset = high_sources[h] ^ shift
                if run == 1:
                    for low in range(chunk):
                        vec[start + low] = buffer[run_sources[low] ^ offset]
                    continue
                for r in range(chunk >> run_bits):  # runs the map leaves in order
                    source = run_sources[r] ^ offset
                    low = r << run_bits
                    vec[start + low : start + low + run] = buffer[source : source + run]


@numba.njit(cache=True, fastmath=_FASTMATH)
def _tile_start(job, tiles):
    """(vector, tile index) of parallel job ``job`` over ``tiles`` tiles per vector."""
    b = job // tiles
    return b, job - b * tiles


@Kernel.compile
def apply_tiled_2x2(state, matrices, targets, tile_bits):
    """psi <- M_{m-1} ... M_1 M_0 psi for 2x2 gates M_j (``matrices`` (1 or B, m, 2, 2)) on
    the bits ``targets[j]``, all below ``tile_bits``, tile by tile: each tile of
    2**tile_bits consecutive amplitudes takes every gate while it is in cache (one read and
    one write per amplitude for the run)."""
    size, tiles = 1 << tile_bits, state.shape[1] >> tile_bits
    for job in numba.prange(state.shape[0] * tiles):
        b, t = _tile_start(job, tiles)
        tile = state[b, t * size : (t + 1) * size]
        gates = matrices[0] if matrices.shape[0] == 1 else matrices[b]
        for j in range(gates.shape[0]):
            g = gates[j]
            _pairs_2x2(tile, tile, targets[j], 0, size >> 1, g[0, 0], g[0, 1], g[1, 0], g[1, 1])


@Kernel.compile
def tiled_2x2_step(phi, bras, adjoints, targets, tile_bits, out):
    """The deferred sweep back through the gates of ``apply_tiled_2x2`` (``adjoints``: their
    inverses A_j, (1 or B, m, 2, 2)), tile by tile: for j = m-1 .. 0, phi <- A_j phi, then
    for each of its R bras T_j[a, c] += sum over the tile's pairs on the gate's bit of
    conj(bra[a]) phi[c] (``_pairs_step``) and bra <- A_j bra. Each vector's tiles are cut
    into ``chunks_per_vector`` ranges, one parallel job each; ``out`` (B * ranges, R, m, 4):
    each job's sums."""
    rows = bras.shape[0] // phi.shape[0]
    size, tiles = 1 << tile_bits, phi.shape[1] >> tile_bits
    half = size >> 1
    per = _chunks_per_vector(phi.shape[0], tiles)
    for job in numba.prange(phi.shape[0] * per):
        b, first, end = _job_range(job, per, tiles)
        gates = adjoints[0] if adjoints.shape[0] == 1 else adjoints[b]
        sums = np.zeros((rows, gates.shape[0], 4), dtype=np.complex128)
        for t in range(first, end):
            ket = phi[b, t * size : (t + 1) * size]
            for j in range(gates.shape[0] - 1, -1, -1):
                g = gates[j]
                m00, m01, m10, m11 = g[0, 0], g[0, 1], g[1, 0], g[1, 1]
                bit = targets[j]
                _pairs_2x2(ket, ket, bit, 0, half, m00, m01, m10, m11)
                for r in range(rows):
                    bra = bras[b * rows + r, t * size : (t + 1) * size]
                    t00, t01, t10, t11 = _pairs_step(
                        ket, ket, bra, bra, bit, 0, half, m00, m01, m10, m11, True
                    )
                    sums[r, j, 0] += t00
                    sums[r, j, 1] += t01
                    sums[r, j, 2] += t10
                    sums[r, j, 3] += t11
        out[job] = sums


def chunks_per_vector(batch: int, items: int) -> int:
    """How many parallel jobs a kernel cuts each of ``batch`` vectors of ``items`` work
    items into: the first axis of a kernel's per-job partial sums is batch times this."""
    return int(_chunks_per_vector(batch, items))


# --- whole gate sequences in one call (small registers; see cpu.CpuBackend.run_sequence) ---
#
# A sequence is a table ``ops`` (N, 11) int64, one row an entry, fields by ``SEQ_*`` index,
# with its bits in ``bits`` and its matrices (dense gates, generators) in ``matrices``
# (complex128, flat, row-major). Entries: a dense gate (its matrix on its bits, bit j of the
# matrix index on state bit ``bits[start + j]``); a Pauli rotation exp(-i angle/2 P) where
# the control bits ``control_mask`` equal ``control_value``, P|i> = i**p (-1)**|i & z| |i ^ x>,
# its angle ``angles[row, slot]``; and two derivative entries that the forward pass skips:
# the sweep adds Re(i <bra|G|phi>) (a generator matrix G on bits) or Re(-i/2 <bra|P|phi>)
# (a rotation's generator -P/2 where its controls hold) to the gradient column ``column``.

SEQ_OPCODE = 0
SEQ_BITS_START = 1
SEQ_N_BITS = 2
SEQ_MATRIX_START = 3
SEQ_X_MASK = 4
SEQ_Z_MASK = 5
SEQ_I_POWER = 6
SEQ_CONTROL_MASK = 7
SEQ_CONTROL_VALUE = 8
SEQ_SLOT = 9
SEQ_COLUMN = 10
SEQ_FIELDS = 11

SEQ_DENSE = 0
SEQ_ROTATION = 1
SEQ_DENSE_DERIVATIVE = 2
SEQ_ROTATION_DERIVATIVE = 3


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_offsets(bits, start, count, offsets):
    """offsets[a]: the state index offset of matrix index a on the entry's bits."""
    for a in range(1 << count):
        offset = 0
        for j in range(count):
            if (a >> j) & 1:
                offset |= 1 << bits[start + j]
        offsets[a] = offset


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_sorted_bits(bits, start, count, out):
    for j in range(count):
        out[j] = bits[start + j]
    out[:count].sort()


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_dense(vec, matrices, mstart, count, sorted_bits, offsets, old, adjoint):
    """vec <- M vec (or M^dagger vec) on the entry's bits."""
    d = 1 << count
    for item in range(vec.shape[0] >> count):
        base = _insert_zeros(item, sorted_bits[:count])
        for a in range(d):
            old[a] = vec[base + offsets[a]]
        for a in range(d):
            acc = 0j
            for c in range(d):
                if adjoint:
                    acc += np.conj(matrices[mstart + c * d + a]) * old[c]
                else:
                    acc += matrices[mstart + a * d + c] * old[c]
            vec[base + offsets[a]] = acc


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_rotation(vec, row, angle):
    """vec <- exp(-i angle/2 P) vec where the controls hold (P and the controls: the
    entry's ``row`` of the table)."""
    x_mask, z_mask = row[SEQ_X_MASK], row[SEQ_Z_MASK]
    i_power = _SEQ_I_POWERS[row[SEQ_I_POWER]]
    control_mask, control_value = row[SEQ_CONTROL_MASK], row[SEQ_CONTROL_VALUE]
    cos = np.cos(0.5 * angle)
    minus_i_sin = -1j * np.sin(0.5 * angle)
    if x_mask == 0:  # diagonal
        for j in range(vec.shape[0]):
            if (j & control_mask) == control_value:
                vec[j] = (cos + minus_i_sin * (1.0 - 2.0 * _parity(j & z_mask))) * vec[j]
        return
    pivot = _highest_bit(x_mask)  # the pairs (j, j ^ x) with bit ``pivot`` of j clear
    low = (1 << pivot) - 1
    for item in range(vec.shape[0] >> 1):
        j = ((item >> pivot) << (pivot + 1)) | (item & low)
        if (j & control_mask) != control_value:
            continue
        k = j ^ x_mask
        a = vec[j]
        b = vec[k]
        pj = i_power * (1.0 - 2.0 * _parity(k & z_mask)) * b  # (P vec)[j]
        pk = i_power * (1.0 - 2.0 * _parity(j & z_mask)) * a  # (P vec)[k]
        vec[j] = cos * a + minus_i_sin * pj
        vec[k] = cos * b + minus_i_sin * pk


@numba.njit(cache=True, fastmath=_FASTMATH)
def _highest_bit(mask):
    bit = 0
    while mask >> (bit + 1):
        bit += 1
    return bit


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_pauli_braket(bra, ket, row):
    """<bra|P|ket> over the indices where the controls hold (as ``_seq_rotation``)."""
    x_mask, z_mask = row[SEQ_X_MASK], row[SEQ_Z_MASK]
    i_power = _SEQ_I_POWERS[row[SEQ_I_POWER]]
    control_mask, control_value = row[SEQ_CONTROL_MASK], row[SEQ_CONTROL_VALUE]
    total = 0j
    for j in range(ket.shape[0]):
        if (j & control_mask) != control_value:
            continue
        k = j ^ x_mask
        total += np.conj(bra[j]) * (i_power * (1.0 - 2.0 * _parity(k & z_mask))) * ket[k]
    return total


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_dense_braket(bra, ket, matrices, mstart, count, sorted_bits, offsets):
    """<bra|G|ket> for a matrix G on the entry's bits."""
    d = 1 << count
    total = 0j
    for item in range(ket.shape[0] >> count):
        base = _insert_zeros(item, sorted_bits[:count])
        for a in range(d):
            acc = 0j
            for c in range(d):
                acc += matrices[mstart + a * d + c] * ket[base + offsets[c]]
            total += np.conj(bra[base + offsets[a]]) * acc
    return total


_SEQ_I_POWERS = np.array([1.0 + 0.0j, 1.0j, -1.0 + 0.0j, -1.0j])


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_one_bit(row):
    """The state bit of a rotation entry whose word acts on one bit and that has no
    controls, else -1 (the generic loops take it)."""
    mask = row[SEQ_X_MASK] | row[SEQ_Z_MASK]
    if row[SEQ_CONTROL_MASK] != 0 or mask == 0 or (mask & (mask - 1)) != 0:
        return -1
    return _highest_bit(mask)


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_word_2x2(row):
    """The word of a one-bit entry as its 2x2 matrix (p00, p01, p10, p11) on that bit:
    column c goes to row c ^ x with the factor i**p (-1)**(c & z)."""
    i_power = _SEQ_I_POWERS[row[SEQ_I_POWER]]
    odd_sign = i_power * (-1.0 if row[SEQ_Z_MASK] != 0 else 1.0)  # the factor of column 1
    if row[SEQ_X_MASK] == 0:
        return i_power, 0j, 0j, odd_sign
    return 0j, odd_sign, i_power, 0j


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_2x2(vec, bit, m00, m01, m10, m11):
    """vec <- M vec for a 2x2 matrix M on one state bit: the pairs (j, j + 2**bit)."""
    _pairs_2x2(vec, vec, bit, 0, vec.shape[0] >> 1, m00, m01, m10, m11)


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_diagonal_2x2(vec, bit, d0, d1):
    """vec <- diag(d0, d1) vec on one state bit (the dense loop: vectorised, it is bound by
    memory, not by the two products it could skip)."""
    _pairs_2x2(vec, vec, bit, 0, vec.shape[0] >> 1, d0, 0j, 0j, d1)


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_braket_2x2(bra, ket, bit, p00, p01, p10, p11):
    """<bra|M|ket> for a 2x2 matrix M on one state bit."""
    t00, t01, t10, t11 = _seq_reduction_2x2(bra, ket, bit)
    return p00 * t00 + p01 * t01 + p10 * t10 + p11 * t11


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_rotation_2x2(row, angle):
    """exp(-i angle/2 P) = cos I - i sin P of a one-bit entry's word, as its 2x2 matrix
    (g00, g01, g10, g11)."""
    p00, p01, p10, p11 = _seq_word_2x2(row)
    return _cos_minus_i_sin(np.cos(0.5 * angle), np.sin(0.5 * angle), p00, p01, p10, p11)


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_one_bit_rotation(vec, row, bit, angle):
    """``_seq_rotation`` of a one-bit entry as a 2x2 product (the generic loop's
    per-amplitude parities and phases are constants here); a Z word's is diagonal."""
    g00, g01, g10, g11 = _seq_rotation_2x2(row, angle)
    if row[SEQ_X_MASK] == 0:
        _seq_diagonal_2x2(vec, bit, g00, g11)
    else:
        _seq_2x2(vec, bit, g00, g01, g10, g11)


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_is_permutation(m, source):
    """Whether the 4x4 matrix ``m`` (flat) has one entry 1 in each row and zeros elsewhere;
    then ``source[a]`` is the column of row a's 1."""
    for a in range(4):
        found = -1
        for c in range(4):
            value = m[4 * a + c]
            if value == 1.0:
                if found >= 0:
                    return False
                found = c
            elif value != 0.0:
                return False
        if found < 0:
            return False
        source[a] = found
    return True


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_dense_4x4(vec, matrices, mstart, bit0, bit1, adjoint):
    """vec <- M vec (or M^dagger vec) for a 4x4 matrix on the state bits ``bit0`` (matrix
    index bit 0) and ``bit1`` (bit 1): the quadruples of indices with both bits clear."""
    m = np.empty(16, dtype=np.complex128)
    for a in range(4):
        for c in range(4):
            m[4 * a + c] = (
                np.conj(matrices[mstart + 4 * c + a]) if adjoint else matrices[mstart + 4 * a + c]
            )
    o1, o2 = 1 << bit0, 1 << bit1
    o3 = o1 | o2
    low, high = min(bit0, bit1), max(bit0, bit1)
    source = np.empty(4, dtype=np.int64)
    if _seq_is_permutation(m, source):  # CNOT, SWAP: amplitudes move, nothing multiplies
        offsets = np.array([0, o1, o2, o3])
        for i in range(0, vec.shape[0], 2 << high):
            for j in range(i, i + (1 << high), 2 << low):
                for base in range(j, j + (1 << low)):
                    v0 = vec[base + offsets[source[0]]]
                    v1 = vec[base + offsets[source[1]]]
                    v2 = vec[base + offsets[source[2]]]
                    v3 = vec[base + offsets[source[3]]]
                    vec[base] = v0
                    vec[base + o1] = v1
                    vec[base + o2] = v2
                    vec[base + o3] = v3
        return
    for i in range(0, vec.shape[0], 2 << high):
        for j in range(i, i + (1 << high), 2 << low):
            for base in range(j, j + (1 << low)):
                v0 = vec[base]
                v1 = vec[base + o1]
                v2 = vec[base + o2]
                v3 = vec[base + o3]
                vec[base] = m[0] * v0 + m[1] * v1 + m[2] * v2 + m[3] * v3
                vec[base + o1] = m[4] * v0 + m[5] * v1 + m[6] * v2 + m[7] * v3
                vec[base + o2] = m[8] * v0 + m[9] * v1 + m[10] * v2 + m[11] * v3
                vec[base + o3] = m[12] * v0 + m[13] * v1 + m[14] * v2 + m[15] * v3


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_apply(vec, ops, i, bits, matrices, angles, row, offsets, sorted_bits, old, inverse):
    """Entry i (a gate) on one vector, or its inverse. Dense gates on one or two bits and
    one-bit rotations without controls (most gates of a circuit) take loops of their own:
    W3's forward sequence (64 vectors of 8 qubits, serial) took 4.6 ms with the generic
    loops and 2.0 ms with these."""
    opcode = ops[i, SEQ_OPCODE]
    if opcode == SEQ_DENSE:
        count = ops[i, SEQ_N_BITS]
        start = ops[i, SEQ_BITS_START]
        mstart = ops[i, SEQ_MATRIX_START]
        if count == 1:
            m00, m01 = matrices[mstart], matrices[mstart + 1]
            m10, m11 = matrices[mstart + 2], matrices[mstart + 3]
            if inverse:
                m00, m01, m10, m11 = np.conj(m00), np.conj(m10), np.conj(m01), np.conj(m11)
            _seq_2x2(vec, bits[start], m00, m01, m10, m11)
            return
        if count == 2:
            _seq_dense_4x4(vec, matrices, mstart, bits[start], bits[start + 1], inverse)
            return
        _seq_offsets(bits, start, count, offsets)
        _seq_sorted_bits(bits, start, count, sorted_bits)
        _seq_dense(vec, matrices, mstart, count, sorted_bits, offsets, old, inverse)
    elif opcode == SEQ_ROTATION:
        angle = angles[row, ops[i, SEQ_SLOT]]
        if inverse:
            angle = -angle
        bit = _seq_one_bit(ops[i])
        if bit >= 0:
            _seq_one_bit_rotation(vec, ops[i], bit, angle)
        else:
            _seq_rotation(vec, ops[i], angle)


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_word_braket(bra, ket, row):
    """<bra|P|ket> for the word of ``row`` (``_seq_pauli_braket``), one-bit words by their
    2x2 matrix."""
    bit = _seq_one_bit(row)
    if bit < 0:
        return _seq_pauli_braket(bra, ket, row)
    p00, p01, p10, p11 = _seq_word_2x2(row)
    return _seq_braket_2x2(bra, ket, bit, p00, p01, p10, p11)


@numba.njit(cache=True, fastmath=_FASTMATH)
def _first_derivative(ops):
    """The index of the first derivative entry (the sweep stops there), or N."""
    for i in range(ops.shape[0]):
        opcode = ops[i, SEQ_OPCODE]
        if opcode == SEQ_DENSE_DERIVATIVE or opcode == SEQ_ROTATION_DERIVATIVE:
            return i
    return ops.shape[0]


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_run_vector(vec, ops, bits, matrices, angles, row):
    """The gates of the sequence on one vector; a run of one-bit gates on one bit (a Rot's
    three rotations) as their product, one pass."""
    offsets = np.empty(64, dtype=np.int64)
    sorted_bits = np.empty(6, dtype=np.int64)
    old = np.empty(64, dtype=np.complex128)
    n_entries = ops.shape[0]
    i = 0
    while i < n_entries:
        bit = _seq_gate_bit(ops, i, bits)
        end = i + 1
        if bit >= 0:
            while end < n_entries and _seq_gate_bit(ops, end, bits) == bit:
                end += 1
        if end - i < 2:
            _seq_apply(vec, ops, i, bits, matrices, angles, row, offsets, sorted_bits, old, False)
            i += 1
            continue
        u00, u01, u10, u11 = 1.0 + 0j, 0j, 0j, 1.0 + 0j
        for j in range(i, end):  # U <- G_j U
            g00, g01, g10, g11 = _seq_gate_2x2(ops, j, matrices, angles, row)
            u00, u01, u10, u11 = _product_2x2(g00, g01, g10, g11, u00, u01, u10, u11)
        _seq_2x2(vec, bit, u00, u01, u10, u11)
        i = end


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_entry_bit(ops, i, bits, dense_opcode, rotation_opcode):
    """The one state bit of entry i where it has the opcode ``dense_opcode`` and a 2x2
    matrix, or ``rotation_opcode`` and a one-bit word without controls; else -1."""
    opcode = ops[i, SEQ_OPCODE]
    if opcode == dense_opcode:
        return bits[ops[i, SEQ_BITS_START]] if ops[i, SEQ_N_BITS] == 1 else -1
    if opcode == rotation_opcode:
        return _seq_one_bit(ops[i])
    return -1


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_gate_bit(ops, i, bits):
    """The bit of a one-bit gate entry without controls (a dense 2x2 or a one-bit
    rotation), else -1."""
    return _seq_entry_bit(ops, i, bits, SEQ_DENSE, SEQ_ROTATION)


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_derivative_bit(ops, i, bits):
    """As ``_seq_gate_bit`` for a derivative entry (a one-bit generator matrix or word)."""
    return _seq_entry_bit(ops, i, bits, SEQ_DENSE_DERIVATIVE, SEQ_ROTATION_DERIVATIVE)


@numba.njit(cache=True, fastmath=_FASTMATH)
def _product_2x2(a00, a01, a10, a11, b00, b01, b10, b11):
    """The 2x2 product A B, entries in row-major order."""
    return (
        a00 * b00 + a01 * b10,
        a00 * b01 + a01 * b11,
        a10 * b00 + a11 * b10,
        a10 * b01 + a11 * b11,
    )


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_gate_2x2(ops, i, matrices, angles, row):
    """The 2x2 matrix (g00, g01, g10, g11) of a one-bit gate entry (``_seq_gate_bit``)."""
    if ops[i, SEQ_OPCODE] == SEQ_DENSE:
        m = ops[i, SEQ_MATRIX_START]
        return matrices[m], matrices[m + 1], matrices[m + 2], matrices[m + 3]
    return _seq_rotation_2x2(ops[i], angles[row, ops[i, SEQ_SLOT]])


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_reduction_2x2(bra, ket, bit):
    """T[a, c] = sum over the other bits of conj(bra[a]) ket[c], a and c the values of
    ``bit``: <bra|A|ket> = sum_ac A[a, c] T[a, c] for any 2x2 A on that bit."""
    one, zero = 1.0 + 0j, 0j  # no update
    return _pairs_step(ket, ket, bra, bra, bit, 0, ket.shape[0] >> 1, one, zero, zero, one, False)


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_sweep_one_bit_run(vec, bras, ops, bits, matrices, angles, row, top, low, bit, undo, out):
    """Entries ``top`` down to ``low`` of the sweep (one-bit gates and derivatives on
    ``bit``) in one reduction pass per bra: with T_r (``_seq_reduction_2x2``) of bra r and
    vec where the run ends, and S the product of the run's gates after a derivative entry
    (S = G_top ... G_(j+1)), the entry's bra-ket is <bra_r|S D S^dagger|vec> =
    sum_ac (S D S^dagger)[a, c] T_r[a, c]; then, where ``undo``, S^dagger of the whole
    run on vec and the bras (one pass each)."""
    rows = bras.shape[0]
    t = np.empty((rows, 4), dtype=np.complex128)
    for r in range(rows):
        t[r, 0], t[r, 1], t[r, 2], t[r, 3] = _seq_reduction_2x2(bras[r], vec, bit)
    s00, s01, s10, s11 = 1.0 + 0j, 0j, 0j, 1.0 + 0j
    for i in range(top, low - 1, -1):
        opcode = ops[i, SEQ_OPCODE]
        if opcode == SEQ_DENSE or opcode == SEQ_ROTATION:  # S <- S G_i
            g00, g01, g10, g11 = _seq_gate_2x2(ops, i, matrices, angles, row)
            s00, s01, s10, s11 = _product_2x2(s00, s01, s10, s11, g00, g01, g10, g11)
            continue
        if opcode == SEQ_DENSE_DERIVATIVE:
            m = ops[i, SEQ_MATRIX_START]
            d00, d01, d10, d11 = matrices[m], matrices[m + 1], matrices[m + 2], matrices[m + 3]
            scale = -1.0  # Re(i value) = -Im(value)
        else:
            d00, d01, d10, d11 = _seq_word_2x2(ops[i])
            scale = 0.5  # Re(-i/2 value) = Im(value)/2
        e00, e01, e10, e11 = _product_2x2(s00, s01, s10, s11, d00, d01, d10, d11)
        a00, a01, a10, a11 = _product_2x2(  # A = S D S^dagger
            e00, e01, e10, e11, np.conj(s00), np.conj(s10), np.conj(s01), np.conj(s11)
        )
        column = ops[i, SEQ_COLUMN]
        for r in range(rows):
            value = a00 * t[r, 0] + a01 * t[r, 1] + a10 * t[r, 2] + a11 * t[r, 3]
            out[r, column] += scale * value.imag
    if undo:
        h00, h01, h10, h11 = np.conj(s00), np.conj(s10), np.conj(s01), np.conj(s11)
        _seq_2x2(vec, bit, h00, h01, h10, h11)
        for r in range(rows):
            _seq_2x2(bras[r], bit, h00, h01, h10, h11)


@Kernel.compile
def run_sequence(state, ops, bits, matrices, angles):
    """Every gate entry of the sequence, in order, on every vector of ``state`` (B, 2**n);
    ``angles`` (1 or B, slots): the rotations' angles per vector. A thread takes whole
    vectors: each vector's sequence runs in its own cache, and one call wakes the threads
    once (``cpu.CPUBackend`` launches the threaded compilation under a lock)."""
    stride = 1 if angles.shape[0] > 1 else 0  # angles per vector, or one row for all
    for b in numba.prange(state.shape[0]):
        _seq_run_vector(state[b], ops, bits, matrices, angles, b * stride)


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_sweep_vector(vec, bras, ops, bits, matrices, angles, row, first, out):
    """The sweep of one vector ``vec`` and its ``bras`` (R, 2**n); ``out`` (R, columns)."""
    offsets = np.empty(64, dtype=np.int64)
    sorted_bits = np.empty(6, dtype=np.int64)
    old = np.empty(64, dtype=np.complex128)
    rows = bras.shape[0]
    i = ops.shape[0] - 1
    while i >= first:
        low = _seq_one_bit_run(ops, bits, i, first)
        if low < i:
            bit = _seq_gate_bit(ops, i, bits)
            if bit < 0:
                bit = _seq_derivative_bit(ops, i, bits)
            _seq_sweep_one_bit_run(
                vec, bras, ops, bits, matrices, angles, row, i, low, bit, low > first, out
            )
            i = low - 1
            continue
        opcode = ops[i, SEQ_OPCODE]
        if opcode == SEQ_ROTATION_DERIVATIVE:
            column = ops[i, SEQ_COLUMN]
            for r in range(rows):
                value = _seq_word_braket(bras[r], vec, ops[i])
                out[r, column] += 0.5 * value.imag  # Re(-i/2 value)
        elif opcode == SEQ_DENSE_DERIVATIVE:
            column = ops[i, SEQ_COLUMN]
            count = ops[i, SEQ_N_BITS]
            start = ops[i, SEQ_BITS_START]
            _seq_offsets(bits, start, count, offsets)
            _seq_sorted_bits(bits, start, count, sorted_bits)
            mstart = ops[i, SEQ_MATRIX_START]
            for r in range(rows):
                value = _seq_dense_braket(
                    bras[r], vec, matrices, mstart, count, sorted_bits, offsets
                )
                out[r, column] -= value.imag  # Re(i value)
        elif i > first:
            _seq_apply(vec, ops, i, bits, matrices, angles, row, offsets, sorted_bits, old, True)
            for r in range(rows):
                _seq_apply(
                    bras[r], ops, i, bits, matrices, angles, row, offsets, sorted_bits, old, True
                )
        i -= 1


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_one_bit_run(ops, bits, top, first):
    """The lowest entry of the sweep's run from ``top`` down (not below ``first``) whose
    entries are one-bit gates and derivatives on one bit, where it holds at least two gates
    (what one reduction pass then serves); else ``top``."""
    bit = _seq_gate_bit(ops, top, bits)
    if bit < 0:
        bit = _seq_derivative_bit(ops, top, bits)
    if bit < 0:
        return top
    gates = 0
    low = top
    j = top
    while j >= first:
        if _seq_gate_bit(ops, j, bits) == bit:
            if j == first:  # not undone by the sweep: outside the run
                break
            gates += 1
        elif _seq_derivative_bit(ops, j, bits) != bit:
            break
        low = j
        j -= 1
    return low if gates >= 2 else top


@Kernel.compile
def sweep_sequence(phi, bras, ops, bits, matrices, angles, out):
    """The adjoint sweep of the sequence from the final states ``phi`` (B, 2**n) and their
    bras (B*R, 2**n; vector b's are rows b*R .. b*R + R - 1), both consumed: walking back
    from the last entry, each derivative entry adds its gradient for every bra to
    ``out[b, r, column]`` and each gate is undone on phi and the bras, down to the first
    derivative entry. Threads take whole vectors, as in ``run_sequence``."""
    first = _first_derivative(ops)
    rows = bras.shape[0] // phi.shape[0]
    stride = 1 if angles.shape[0] > 1 else 0  # angles per vector, or one row for all
    for b in numba.prange(phi.shape[0]):
        _seq_sweep_vector(
            phi[b],
            bras[b * rows : (b + 1) * rows],
            ops,
            bits,
            matrices,
            angles,
            b * stride,
            first,
            out[b],
        )


@Kernel.compile
def run_sequence_measured(state, ops, bits, matrices, angles, words, values):
    """``run_sequence``, then ``values[b, k]`` = Re <psi_b|P_k|psi_b> for the Pauli words
    ``words`` (K, SEQ_FIELDS): rows of the sequence table's format, their x and z masks
    and i power set (no controls). Threads take whole vectors, as in ``run_sequence``."""
    stride = 1 if angles.shape[0] > 1 else 0
    for b in numba.prange(state.shape[0]):
        _seq_run_measured_vector(
            state[b], ops, bits, matrices, angles, b * stride, words, values[b]
        )


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_run_measured_vector(vec, ops, bits, matrices, angles, row, words, values):
    """The sequence on one vector (angles of row ``row``), then values[k] = Re <vec|P_k|vec>."""
    _seq_run_vector(vec, ops, bits, matrices, angles, row)
    for k in range(words.shape[0]):
        values[k] = _seq_word_braket(vec, vec, words[k]).real


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_add_pauli(dst, src, row, coefficient):
    """dst <- dst + coefficient P src for the word ``row`` (as ``_seq_pauli_braket``)."""
    x_mask, z_mask = row[SEQ_X_MASK], row[SEQ_Z_MASK]
    factor = coefficient * _SEQ_I_POWERS[row[SEQ_I_POWER]]
    for j in range(src.shape[0]):
        k = j ^ x_mask
        dst[j] += factor * (1.0 - 2.0 * _parity(k & z_mask)) * src[k]


@Kernel.compile
def sweep_sequence_from_words(phi, ops, bits, matrices, angles, words, coefficients, out):
    """``sweep_sequence`` with its bras built here: bra r of vector b is
    sum_k coefficients[b, r, k] P_k phi_b (``words`` as in ``run_sequence_measured``);
    ``phi`` (B, 2**n) consumed, ``out`` (B, R, columns). Threads take whole vectors (each
    its own bras), as in ``run_sequence``."""
    first = _first_derivative(ops)
    stride = 1 if angles.shape[0] > 1 else 0
    for b in numba.prange(phi.shape[0]):
        bras = _seq_bras_from_words(phi[b], words, coefficients[b])
        _seq_sweep_vector(phi[b], bras, ops, bits, matrices, angles, b * stride, first, out[b])


@numba.njit(cache=True, fastmath=_FASTMATH)
def _seq_bras_from_words(vec, words, coefficients):
    """(R, 2**n): bra r = sum_k coefficients[r, k] P_k vec (``words`` as in
    ``run_sequence_measured``)."""
    bras = np.zeros((coefficients.shape[0], vec.shape[0]), dtype=vec.dtype)
    for r in range(coefficients.shape[0]):
        for k in range(words.shape[0]):
            if coefficients[r, k] != 0:
                _seq_add_pauli(bras[r], vec, words[k], coefficients[r, k])
    return bras


@Kernel.compile
def run_sequence_jacobian(
    state, ops, bits, matrices, sweep_ops, sweep_bits, sweep_matrices, angles, words,
    coefficients, values, out
):  # fmt: skip
    """``run_sequence_measured`` of the sequence (``ops``, ``bits``, ``matrices``) into
    ``values`` (B, K), then ``sweep_sequence_from_words`` of the sweep sequence (its
    derivative entries: ``sweep_ops``, ``sweep_bits``, ``sweep_matrices``, the same angle
    slots) from the final states, consumed, into ``out`` (B, R, columns): a forward pass
    and R VJPs in one call. Threads take whole vectors, as in ``run_sequence``."""
    first = _first_derivative(sweep_ops)
    stride = 1 if angles.shape[0] > 1 else 0
    for b in numba.prange(state.shape[0]):
        vec = state[b]
        _seq_run_measured_vector(vec, ops, bits, matrices, angles, b * stride, words, values[b])
        bras = _seq_bras_from_words(vec, words, coefficients[b])
        _seq_sweep_vector(
            vec, bras, sweep_ops, sweep_bits, sweep_matrices, angles, b * stride, first, out[b]
        )


ALL_KERNELS = (
    apply_1q,
    apply_1q_rotation,
    apply_2q,
    apply_bit_permutation,
    apply_tiled_2x2,
    tiled_2x2_step,
    apply_kq,
    block_step,
    block_step_1q,
    block_step_2q,
    apply_diagonal,
    apply_pauli_rotation,
    apply_pauli,
    inner_pauli,
    inner_matrix,
    inner_diagonal,
    add_scaled,
    add_z_sum,
    add_z_sum_by_blocks,
    low_sign_sums,
    apply_z_phases,
    z_rotations_step,
    rotation_step_1q,
    apply_rotation_pair,
    rotation_pair_step,
    diagonal_step,
    marginal_probs,
    product_state,
    run_sequence,
    sweep_sequence,
    run_sequence_measured,
    sweep_sequence_from_words,
    run_sequence_jacobian,
)
"""Every kernel of this module (a test checks that none is left out)."""
