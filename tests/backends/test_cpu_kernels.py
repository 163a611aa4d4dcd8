"""The CPU kernels' span loops (``_pairs_*``, ``_quads_*`` in backends/_cpu_kernels.py)
against dense numpy references, at every target bit of a 9-bit register: bit 0 takes
its stride-2 loop, bits 1 and 2 the indexed loops, and from ``_VECTOR_BIT`` the kernels
walk spans of consecutive amplitudes (and parallel jobs start in the middle of a span). Both
compilations of each kernel (threaded and serial), one and several vectors and bras, and
single precision."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import stable_seed
from reference import (
    random_states,
    random_unitary,
    ref_block_apply,
    ref_block_reduction,
    rotation,
    word_matrix,
)

from pennylane_custatevec.backends import _cpu_kernels

N_BITS = 9
LETTERS = "IXYZ"  # the kernels' letter codes 0..3
COMPILATIONS = ("threaded", "serial")
TOLERANCE = {np.complex128: 1e-12, np.complex64: 2e-5}


def _compiled(kernel: _cpu_kernels.Kernel, compilation: str):
    return getattr(kernel, compilation)


def _jobs(batch: int, items: int) -> int:
    return batch * _cpu_kernels.chunks_per_vector(batch, items)


def test_the_span_loops_start_at_the_documented_bit():
    """The cases below cross the threshold: bits below it and bits from it."""
    assert 0 < _cpu_kernels._VECTOR_BIT < N_BITS - 1


@pytest.mark.parametrize("compilation", COMPILATIONS)
@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("target", range(N_BITS))
def test_one_bit_matrix_and_rotation(target, batch, dtype, compilation):
    rng = np.random.default_rng(stable_seed("pairs apply", target, batch))
    psi = random_states(N_BITS, batch, rng)
    matrices = np.stack([random_unitary(2, rng) for _ in range(batch)])
    fixed = np.array([target])
    state = psi.astype(dtype)
    _compiled(_cpu_kernels.apply_1q, compilation)(state, matrices, target, fixed, 0)
    expected = ref_block_apply(psi, matrices, (target,))
    np.testing.assert_allclose(state, expected, atol=TOLERANCE[dtype], rtol=0)
    for letter in range(4):
        angles = rng.uniform(-3, 3, size=batch)
        state = psi.astype(dtype)
        kernel = _compiled(_cpu_kernels.apply_1q_rotation, compilation)
        kernel(state, angles, letter, target, fixed, 0)
        gates = np.stack([rotation(LETTERS[letter], a) for a in angles])
        expected = ref_block_apply(psi, gates, (target,))
        np.testing.assert_allclose(state, expected, atol=TOLERANCE[dtype], rtol=0)


@pytest.mark.parametrize("compilation", COMPILATIONS)
@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
@pytest.mark.parametrize(("batch", "rows"), [(1, 1), (1, 3), (3, 2)])
@pytest.mark.parametrize("target", range(N_BITS))
def test_one_bit_block_step(target, batch, rows, dtype, compilation):
    """phi <- M phi, T_r of each bra (before) with phi (after), bra <- M bra."""
    rng = np.random.default_rng(stable_seed("pairs step", target, batch, rows))
    phi = random_states(N_BITS, batch, rng)
    bras = random_states(N_BITS, batch * rows, rng)
    adjoints = np.stack([random_unitary(2, rng) for _ in range(batch)])
    out = np.zeros((_jobs(batch, 1 << (N_BITS - 1)), rows, 2, 2), dtype=complex)
    phi_state, bras_state = phi.astype(dtype), bras.astype(dtype)
    kernel = _compiled(_cpu_kernels.block_step_1q, compilation)
    kernel(phi_state, bras_state, adjoints, target, out)
    phi_after = ref_block_apply(phi, adjoints, (target,))
    expected = ref_block_reduction(bras, np.repeat(phi_after, rows, axis=0), (target,))
    tol = TOLERANCE[dtype]
    sums = out.reshape(batch, -1, rows, 2, 2).sum(axis=1).reshape(batch * rows, 2, 2)
    np.testing.assert_allclose(sums, expected, atol=tol * 10, rtol=0)
    np.testing.assert_allclose(phi_state, phi_after, atol=tol, rtol=0)
    bras_after = ref_block_apply(bras, np.repeat(adjoints, rows, axis=0), (target,))
    np.testing.assert_allclose(bras_state, bras_after, atol=tol, rtol=0)


@pytest.mark.parametrize("compilation", COMPILATIONS)
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize(("target", "letter"), list(itertools.product(range(N_BITS), (1, 2, 3))))
def test_one_bit_rotation_step(target, letter, rows, compilation):
    """out[r] = <bra_r|P|phi>, then the rotation undone on phi and the bras."""
    rng = np.random.default_rng(stable_seed("rotation step", target, letter, rows))
    phi = random_states(N_BITS, 1, rng)
    bras = random_states(N_BITS, rows, rng)
    angle = rng.uniform(-3, 3)
    out = np.zeros(rows, dtype=complex)
    phi_state, bras_state = phi.copy(), bras.copy()
    kernel = _compiled(_cpu_kernels.rotation_step_1q, compilation)
    kernel(phi_state, bras_state, np.array([angle]), letter, target, np.array([target]), out)
    flipped = ref_block_apply(phi, word_matrix(LETTERS[letter])[None], (target,))
    np.testing.assert_allclose(out, bras.conj() @ flipped[0], atol=1e-12, rtol=0)
    undo = rotation(LETTERS[letter], -angle)[None]
    np.testing.assert_allclose(phi_state, ref_block_apply(phi, undo, (target,)), atol=1e-12)
    undone = ref_block_apply(bras, np.repeat(undo, rows, axis=0), (target,))
    np.testing.assert_allclose(bras_state, undone, atol=1e-12, rtol=0)


PAIR_PLACEMENTS = [(3, 8), (8, 3), (4, 5), (6, 4), (0, 7), (7, 2), (2, 3), (1, 0)]
"""Two rotations' bits: both from ``_VECTOR_BIT`` (span loops), or not (indexed loops)."""


@pytest.mark.parametrize("compilation", COMPILATIONS)
@pytest.mark.parametrize(("batch", "rows"), [(1, 1), (1, 3), (2, 2)])
@pytest.mark.parametrize("targets", PAIR_PLACEMENTS)
def test_rotation_pair_and_its_step(targets, batch, rows, compilation):
    rng = np.random.default_rng(stable_seed("rotation pair", *targets, batch, rows))
    letters = rng.integers(1, 4, size=2)
    angles = rng.uniform(-3, 3, size=(batch, 2))
    fixed = np.sort(np.array(targets))
    psi = random_states(N_BITS, batch, rng)

    def both(vectors, per_vector_angles, sign):
        for j in range(2):
            gates = np.stack(
                [rotation(LETTERS[letters[j]], sign * a[j]) for a in per_vector_angles]
            )
            vectors = ref_block_apply(vectors, gates, (targets[j],))
        return vectors

    state = psi.copy()
    kernel = _compiled(_cpu_kernels.apply_rotation_pair, compilation)
    kernel(state, angles, letters, np.array(targets), fixed)
    np.testing.assert_allclose(state, both(psi, angles, 1.0), atol=1e-12, rtol=0)

    bras = random_states(N_BITS, batch * rows, rng)
    out = np.zeros((_jobs(batch, 1 << (N_BITS - 2)), rows, 2), dtype=complex)
    phi_state, bras_state = psi.copy(), bras.copy()
    kernel = _compiled(_cpu_kernels.rotation_pair_step, compilation)
    kernel(phi_state, bras_state, angles, letters, np.array(targets), fixed, out)
    sums = out.reshape(batch, -1, rows, 2).sum(axis=1)
    for j in range(2):
        flipped = ref_block_apply(psi, word_matrix(LETTERS[letters[j]])[None], (targets[j],))
        for b in range(batch):
            expected = bras[b * rows : (b + 1) * rows].conj() @ flipped[b]
            np.testing.assert_allclose(sums[b, :, j], expected, atol=1e-12, rtol=0)
    np.testing.assert_allclose(phi_state, both(psi, angles, -1.0), atol=1e-12, rtol=0)
    per_bra = np.repeat(angles, rows, axis=0)
    np.testing.assert_allclose(bras_state, both(bras, per_bra, -1.0), atol=1e-12, rtol=0)
