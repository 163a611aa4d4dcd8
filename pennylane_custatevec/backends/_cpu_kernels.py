"""Compiled in-place kernels over a batch of state vectors, shape ``(B, 2**n)``.

Conventions are cuStateVec's (see ``backends/base.py``): state index bits are
little-endian, ``targets[j]`` is the state bit that becomes bit ``j`` of a matrix
or diagonal index, and the gate acts only on indices whose control bits equal
``control_mask`` (the control bits set to their control values).

Every kernel walks *work items*: an index with the target and control bits removed.
``_insert_zeros`` spreads such an index back over the full register, leaving the
``fixed_bits`` (targets and controls, sorted ascending) at zero. Work is cut into
chunks, each inside one state vector, so that the batch and the amplitudes share
one parallel loop. Each kernel is compiled twice from the same Python source: a
threaded version for large batches and a serial one where thread start-up would
dominate.
"""

import types

import numba
import numpy as np

_PARALLEL_THRESHOLD = 1 << 15
_CHUNKS = 64


@numba.njit(cache=True)
def _insert_zeros(index, fixed_bits):
    for bit in fixed_bits:
        low = index & ((1 << bit) - 1)
        index = ((index >> bit) << (bit + 1)) | low
    return index


@numba.njit(cache=True)
def _low_masks(fixed_bits):
    """Masks of the bits below the two lowest fixed bits (all ones: no such bit)."""
    low0 = (1 << fixed_bits[0]) - 1 if len(fixed_bits) > 0 else -1
    low1 = (1 << fixed_bits[1]) - 1 if len(fixed_bits) > 1 else -1
    return low0, low1


@numba.njit(cache=True)
def _spread(x, low0, low1):
    """Insert a zero bit above each low mask, lowest first."""
    x = ((x << 1) & ~((low0 << 1) | 1)) | (x & low0)
    return ((x << 1) & ~((low1 << 1) | 1)) | (x & low1)


@numba.njit(cache=True)
def _run_length(fixed_bits, items):
    """Work items that share every fixed bit above the two lowest ones."""
    return (1 << (fixed_bits[2] - 2)) if len(fixed_bits) > 2 else items


@numba.njit(cache=True)
def _run(i, hi, run_length, fixed_bits, control_mask):
    """(base, first, count): work items first .. first+count-1 of the run that holds
    item i sit at indices base | _spread(item). Runs are long unless three fixed bits
    are all low, so the inner loops do a few integer operations per amplitude."""
    first = i & (run_length - 1)
    base = _insert_zeros(i - first, fixed_bits) | control_mask
    return base, first, min(hi - i, run_length - first)


@numba.njit(cache=True)
def _parity(x):
    x ^= x >> 32
    x ^= x >> 16
    x ^= x >> 8
    x ^= x >> 4
    x ^= x >> 2
    x ^= x >> 1
    return x & 1


@numba.njit(cache=True)
def _chunks_per_vector(batch, items):
    return max(1, min(items, _CHUNKS // batch))


@numba.njit(cache=True)
def _pauli_phase(index, z_mask, i_power):
    """<P|index> phase factor: i**n_Y * (-1)**popcount(index & z_mask)."""
    sign = 1.0 - 2.0 * _parity(index & z_mask)
    return i_power * sign


@numba.njit(cache=True)
def _target_offsets(targets):
    d = 1 << len(targets)
    offsets = np.zeros(d, dtype=np.int64)
    for a in range(d):
        off = 0
        for j in range(len(targets)):
            if (a >> j) & 1:
                off |= 1 << targets[j]
        offsets[a] = off
    return offsets


def _apply_1q(state, mats, target, fixed_bits, control_mask):
    batch, dim = state.shape
    items = dim >> len(fixed_bits)
    per = _chunks_per_vector(batch, items)
    run_length = _run_length(fixed_bits, items)
    low0, low1 = _low_masks(fixed_bits)
    shared = mats.shape[0] == 1
    step = 1 << target
    for job in numba.prange(batch * per):
        b = job // per
        c = job - b * per
        m = mats[0] if shared else mats[b]
        m00, m01, m10, m11 = m[0, 0], m[0, 1], m[1, 0], m[1, 1]
        vec = state[b]
        i, hi = c * items // per, (c + 1) * items // per
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, control_mask)
            for item in range(first, first + length):
                i0 = base | _spread(item, low0, low1)
                a0 = vec[i0]
                a1 = vec[i0 + step]
                vec[i0] = m00 * a0 + m01 * a1
                vec[i0 + step] = m10 * a0 + m11 * a1
            i += length


def _apply_2q(state, mats, targets, fixed_bits, control_mask):
    batch, dim = state.shape
    items = dim >> len(fixed_bits)
    per = _chunks_per_vector(batch, items)
    run_length = _run_length(fixed_bits, items)
    low0, low1 = _low_masks(fixed_bits)
    shared = mats.shape[0] == 1
    s0 = 1 << targets[0]
    s1 = 1 << targets[1]
    s01 = s0 | s1
    for job in numba.prange(batch * per):
        b = job // per
        c = job - b * per
        m = mats[0] if shared else mats[b]
        vec = state[b]
        i, hi = c * items // per, (c + 1) * items // per
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, control_mask)
            for item in range(first, first + length):
                i0 = base | _spread(item, low0, low1)
                a0 = vec[i0]
                a1 = vec[i0 + s0]
                a2 = vec[i0 + s1]
                a3 = vec[i0 + s01]
                vec[i0] = m[0, 0] * a0 + m[0, 1] * a1 + m[0, 2] * a2 + m[0, 3] * a3
                vec[i0 + s0] = m[1, 0] * a0 + m[1, 1] * a1 + m[1, 2] * a2 + m[1, 3] * a3
                vec[i0 + s1] = m[2, 0] * a0 + m[2, 1] * a1 + m[2, 2] * a2 + m[2, 3] * a3
                vec[i0 + s01] = m[3, 0] * a0 + m[3, 1] * a1 + m[3, 2] * a2 + m[3, 3] * a3
            i += length


def _apply_kq(state, mats, targets, fixed_bits, control_mask):
    batch, dim = state.shape
    items = dim >> len(fixed_bits)
    per = _chunks_per_vector(batch, items)
    run_length = _run_length(fixed_bits, items)
    low0, low1 = _low_masks(fixed_bits)
    shared = mats.shape[0] == 1
    offsets = _target_offsets(targets)
    d = offsets.shape[0]
    for job in numba.prange(batch * per):
        b = job // per
        c = job - b * per
        m = mats[0] if shared else mats[b]
        vec = state[b]
        buf = np.empty(d, dtype=state.dtype)
        i, hi = c * items // per, (c + 1) * items // per
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, control_mask)
            for item in range(first, first + length):
                i0 = base | _spread(item, low0, low1)
                for a in range(d):
                    buf[a] = vec[i0 + offsets[a]]
                for a in range(d):
                    acc = m[a, 0] * buf[0]
                    for a2 in range(1, d):
                        acc += m[a, a2] * buf[a2]
                    vec[i0 + offsets[a]] = acc
            i += length


def _apply_diagonal(state, diags, targets, fixed_bits, control_mask):
    """fixed_bits holds the controls only: every target index is visited."""
    batch, dim = state.shape
    items = dim >> len(fixed_bits)
    per = _chunks_per_vector(batch, items)
    run_length = _run_length(fixed_bits, items)
    low0, low1 = _low_masks(fixed_bits)
    shared = diags.shape[0] == 1
    k = len(targets)
    for job in numba.prange(batch * per):
        b = job // per
        c = job - b * per
        diag = diags[0] if shared else diags[b]
        vec = state[b]
        i, hi = c * items // per, (c + 1) * items // per
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, control_mask)
            for item in range(first, first + length):
                idx = base | _spread(item, low0, low1)
                a = 0
                for j in range(k):
                    a |= ((idx >> targets[j]) & 1) << j
                vec[idx] *= diag[a]
            i += length


def _apply_pauli_rotation(state, angles, x_mask, z_mask, i_power, fixed_bits, control_mask):
    """exp(-i angle/2 P). With x_mask != 0, fixed_bits include the pivot (top bit of x_mask)."""
    batch, dim = state.shape
    items = dim >> len(fixed_bits)
    per = _chunks_per_vector(batch, items)
    run_length = _run_length(fixed_bits, items)
    low0, low1 = _low_masks(fixed_bits)
    shared = angles.shape[0] == 1
    for job in numba.prange(batch * per):
        b = job // per
        c = job - b * per
        half = 0.5 * (angles[0] if shared else angles[b])
        cos = np.cos(half)
        minus_i_sin = -1j * np.sin(half)
        vec = state[b]
        i, hi = c * items // per, (c + 1) * items // per
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, control_mask)
            if x_mask == 0:
                for item in range(first, first + length):
                    idx = base | _spread(item, low0, low1)
                    vec[idx] *= cos + minus_i_sin * _pauli_phase(idx, z_mask, i_power)
            else:
                for item in range(first, first + length):
                    i0 = base | _spread(item, low0, low1)
                    i1 = i0 ^ x_mask
                    a0 = vec[i0]
                    a1 = vec[i1]
                    vec[i0] = cos * a0 + minus_i_sin * _pauli_phase(i1, z_mask, i_power) * a1
                    vec[i1] = cos * a1 + minus_i_sin * _pauli_phase(i0, z_mask, i_power) * a0
            i += length


def _apply_pauli(state, x_mask, z_mask, i_power, fixed_bits, control_mask):
    """P = i**n_Y X^x Z^z on the selected bits; the pivot rule is that of the rotation."""
    batch, dim = state.shape
    items = dim >> len(fixed_bits)
    per = _chunks_per_vector(batch, items)
    run_length = _run_length(fixed_bits, items)
    low0, low1 = _low_masks(fixed_bits)
    plain_flip = z_mask == 0
    for job in numba.prange(batch * per):
        b = job // per
        c = job - b * per
        vec = state[b]
        i, hi = c * items // per, (c + 1) * items // per
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, control_mask)
            if x_mask == 0:
                for item in range(first, first + length):
                    idx = base | _spread(item, low0, low1)
                    vec[idx] *= _pauli_phase(idx, z_mask, i_power)
            elif plain_flip:
                for item in range(first, first + length):
                    i0 = base | _spread(item, low0, low1)
                    i1 = i0 ^ x_mask
                    a0 = vec[i0]
                    vec[i0] = vec[i1]
                    vec[i1] = a0
            else:
                for item in range(first, first + length):
                    i0 = base | _spread(item, low0, low1)
                    i1 = i0 ^ x_mask
                    a0 = vec[i0]
                    vec[i0] = _pauli_phase(i1, z_mask, i_power) * vec[i1]
                    vec[i1] = _pauli_phase(i0, z_mask, i_power) * a0
            i += length


def _expval_pauli(state, x_mask, z_mask, i_power, out):
    """out[b] = Re <psi_b| P |psi_b>."""
    batch, dim = state.shape
    per = _chunks_per_vector(batch, dim)
    partial = np.zeros(batch * per)
    for job in numba.prange(batch * per):
        b = job // per
        c = job - b * per
        vec = state[b]
        acc = 0.0
        for i in range(c * dim // per, (c + 1) * dim // per):
            term = np.conj(vec[i ^ x_mask]) * _pauli_phase(i, z_mask, i_power) * vec[i]
            acc += term.real
        partial[job] = acc
    for b in range(batch):
        out[b] = partial[b * per : (b + 1) * per].sum()


def _expval_matrix(state, mat, targets, fixed_bits, out):
    """out[b] = <psi_b| M_targets |psi_b> (complex)."""
    batch, dim = state.shape
    items = dim >> len(fixed_bits)
    per = _chunks_per_vector(batch, items)
    run_length = _run_length(fixed_bits, items)
    low0, low1 = _low_masks(fixed_bits)
    offsets = _target_offsets(targets)
    d = offsets.shape[0]
    partial = np.zeros(batch * per, dtype=np.complex128)
    for job in numba.prange(batch * per):
        b = job // per
        c = job - b * per
        vec = state[b]
        buf = np.empty(d, dtype=np.complex128)
        acc = 0.0 + 0.0j
        i, hi = c * items // per, (c + 1) * items // per
        while i < hi:
            base, first, length = _run(i, hi, run_length, fixed_bits, 0)
            for item in range(first, first + length):
                i0 = base | _spread(item, low0, low1)
                for a in range(d):
                    buf[a] = vec[i0 + offsets[a]]
                for a in range(d):
                    row = 0.0 + 0.0j
                    for a2 in range(d):
                        row += mat[a, a2] * buf[a2]
                    acc += np.conj(buf[a]) * row
            i += length
        partial[job] = acc
    for b in range(batch):
        out[b] = partial[b * per : (b + 1) * per].sum()


def _marginal_probs(state, bits, out):
    """out[b, a] = sum of |psi_b[i]|^2 over i whose bits[j] give bit j of a."""
    batch, dim = state.shape
    per = _chunks_per_vector(batch, dim)
    k = len(bits)
    d = out.shape[1]
    partial = np.zeros((batch * per, d))
    for job in numba.prange(batch * per):
        b = job // per
        c = job - b * per
        vec = state[b]
        hist = partial[job]
        for i in range(c * dim // per, (c + 1) * dim // per):
            a = 0
            for j in range(k):
                a |= ((i >> bits[j]) & 1) << j
            v = vec[i]
            hist[a] += v.real * v.real + v.imag * v.imag
    for b in range(batch):
        out[b] = partial[b * per : (b + 1) * per].sum(axis=0)


def _threaded_and_serial(func):
    """Two compilations of one source; the serial one is renamed so that numba's
    on-disk cache (keyed by qualified name) keeps them apart."""
    serial = types.FunctionType(func.__code__, func.__globals__, func.__name__ + "_serial")
    serial.__qualname__ = func.__qualname__ + "_serial"
    return numba.njit(parallel=True, cache=True)(func), numba.njit(cache=True)(serial)


_KERNELS = {
    func.__name__.lstrip("_"): _threaded_and_serial(func)
    for func in (
        _apply_1q,
        _apply_2q,
        _apply_kq,
        _apply_diagonal,
        _apply_pauli_rotation,
        _apply_pauli,
        _expval_pauli,
        _expval_matrix,
        _marginal_probs,
    )
}


def kernel(name: str, state: np.ndarray):
    """The compiled kernel ``name``, threaded when the batch is large enough to pay for it."""
    threaded, serial = _KERNELS[name]
    return threaded if state.size >= _PARALLEL_THRESHOLD else serial
