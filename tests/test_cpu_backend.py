"""The CPU backend's kernels against dense numpy references: what is particular to it
(threaded kernels, larger registers, the Z-word and rotation-pair kernels, complex64
against complex128). The contract every backend meets is test_backend_contract.py, which
takes its references, cases and checks from here.

Conventions (backends/base.py): state index bits are little-endian; ``targets[j]`` is the
state bit that becomes bit ``j`` of a matrix index; the gate acts where every control bit
equals its control value; batched data has a leading axis of length 1 (shared) or B.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import random_state, random_unitary, stable_seed

from pennylane_custatevec.backends import _cpu_kernels
from pennylane_custatevec.backends.cpu import CPUBackend, _z_rotation_plan

PAULI = {
    "I": np.eye(2, dtype=complex),
    "X": np.array([[0, 1], [1, 0]], dtype=complex),
    "Y": np.array([[0, -1j], [1j, 0]]),
    "Z": np.diag([1.0 + 0j, -1.0]),
}
TOL = {np.complex128: 1e-12, np.complex64: 2e-5}


# --- references --------------------------------------------------------------------------


def word_matrix(word: str) -> np.ndarray:
    """Letter j acts on bit j of the matrix index (so it is the rightmost kron factor)."""
    m = np.ones((1, 1), dtype=complex)
    for letter in word:
        m = np.kron(PAULI[letter], m)
    return m


def dense_operator(n, matrix, targets, controls=(), values=()):
    """The 2**n x 2**n operator of ``matrix`` on ``targets`` under the controls."""
    k = len(targets)
    dim = 1 << n
    op = np.eye(dim, dtype=complex)
    offsets = [sum(((a >> j) & 1) << t for j, t in enumerate(targets)) for a in range(1 << k)]
    target_mask = sum(1 << t for t in targets)
    for base in range(dim):
        if base & target_mask:
            continue
        if any(((base >> c) & 1) != v for c, v in zip(controls, values, strict=True)):
            continue
        rows = [base | o for o in offsets]
        op[np.ix_(rows, rows)] = matrix
    return op


def ref_apply(psi, matrices, targets, controls=(), values=()):
    """Reference psi_b <- U_b psi_b with the dense operator (small n) of each matrix."""
    n = psi.shape[1].bit_length() - 1
    matrices = np.broadcast_to(matrices, (psi.shape[0],) + matrices.shape[1:])
    return np.stack(
        [
            dense_operator(n, m, targets, controls, values) @ v
            for m, v in zip(matrices, psi, strict=True)
        ]
    )


def ref_apply_blocks(psi, matrices, targets, controls=(), values=()):
    """The same as ref_apply by fancy indexing: usable for large n (threaded kernels)."""
    batch, dim = psi.shape
    k = len(targets)
    matrices = np.broadcast_to(matrices, (batch, 1 << k, 1 << k))
    idx = np.arange(dim)
    keep = (idx & sum(1 << t for t in targets)) == 0
    for c, v in zip(controls, values, strict=True):
        keep &= ((idx >> c) & 1) == v
    offsets = np.array(
        [sum(((a >> j) & 1) << t for j, t in enumerate(targets)) for a in range(1 << k)]
    )
    rows = idx[keep][:, None] | offsets[None, :]
    out = psi.copy()
    for b in range(batch):
        out[b, rows] = psi[b, rows] @ matrices[b].T
    return out


def ref_probs(psi, bits):
    p = np.abs(psi) ** 2
    idx = np.arange(psi.shape[1])
    outcome = np.zeros_like(idx)
    for j, bit in enumerate(bits):
        outcome |= ((idx >> bit) & 1) << j
    out = np.zeros((psi.shape[0], 1 << len(bits)))
    for b in range(psi.shape[0]):
        np.add.at(out[b], outcome, p[b])
    return out


def random_states(n, batch, rng):
    v = rng.normal(size=(batch, 1 << n)) + 1j * rng.normal(size=(batch, 1 << n))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def backend_state(backend, psi):
    state = backend.from_host(psi)
    assert state.dtype == backend.dtype and state.flags.c_contiguous
    return state


def rotation(word, angle):
    p = word_matrix(word)
    return np.cos(angle / 2) * np.eye(len(p)) - 1j * np.sin(angle / 2) * p


# --- reference self-checks ---------------------------------------------------------------


def test_reference_matches_kron_layout():
    """Bit b of the index is the (n-1-b)-th kron factor: the reference follows the convention."""
    rng = np.random.default_rng(0)
    m = random_unitary(2, rng)
    n = 4
    for t in range(n):
        factors = [np.eye(2)] * n
        factors[n - 1 - t] = m
        kron = factors[0]
        for f in factors[1:]:
            kron = np.kron(kron, f)
        np.testing.assert_allclose(dense_operator(n, m, [t]), kron, atol=1e-14)
    # CNOT: control bit 1, target bit 0 flips index 2 <-> 3
    cnot = dense_operator(2, PAULI["X"], [0], [1], [1])
    np.testing.assert_allclose(cnot[:, 2], [0, 0, 0, 1])
    psi = random_states(5, 2, rng)
    u = random_unitary(8, rng)[None]
    np.testing.assert_allclose(
        ref_apply(psi, u, [3, 0, 4], [1], [0]), ref_apply_blocks(psi, u, [3, 0, 4], [1], [0])
    )


# --- cases and checks of the backend contract (test_backend_contract.py) ------------------

N = 6
TARGET_CASES = [
    # (targets, controls, control values)
    ((0,), (), ()),
    ((5,), (), ()),
    ((2,), (0,), (1,)),
    ((3,), (5, 1), (0, 1)),
    ((0,), (1, 2), (0, 0)),  # three fixed bits all low
    ((1, 0), (), ()),
    ((0, 5), (), ()),
    ((4, 2), (3,), (0,)),
    ((2, 3), (0, 1), (1, 0)),
    ((5, 0), (2, 4), (1, 1)),
    ((0, 1, 2), (), ()),
    ((4, 0, 2), (), ()),
    ((5, 3, 1), (0,), (0,)),
    ((1, 4, 3), (5, 0), (1, 0)),
    ((3, 1, 0, 5), (2,), (1,)),
]


def _ids(case):
    targets, controls, values = case
    digits = ["".join(map(str, part)) for part in (targets, controls, values)]
    return "t{}-c{}-v{}".format(*digits)


DIAG_CASES = [
    ((0,), (), ()),
    ((5,), (2,), (0,)),
    ((3, 1), (), ()),
    ((0, 4), (5, 2), (1, 0)),
    ((2, 5, 0), (1,), (1,)),
    ((1,), (0, 2, 3), (0, 1, 0)),
    ((), (3, 4), (1, 0)),  # a phase on the control subspace only
]


PAULI_CASES = [
    ("X", (0,), (), ()),
    ("X", (4,), (1, 5), (1, 0)),
    ("Y", (5,), (1,), (0,)),
    ("Z", (3,), (0, 4), (1, 1)),
    ("I", (2,), (), ()),
    ("XX", (0, 1), (), ()),
    ("XY", (4, 1), (), ()),
    ("ZZ", (2, 5), (3,), (0,)),
    ("YZ", (0, 3), (5,), (1,)),
    ("ZX", (1, 4), (), ()),
    ("XIZ", (5, 2, 0), (), ()),
    ("YXZ", (2, 0, 5), (3,), (1,)),
    ("ZZZ", (0, 1, 2), (3,), (0,)),
    ("YYYY", (5, 3, 1, 0), (), ()),
    ("XYZX", (1, 2, 4, 5), (0, 3), (0, 1)),
    ("II", (1, 3), (0,), (1,)),
]


def _pids(case):
    word, targets, controls, values = case
    return f"{word}-{_ids((targets, controls, values))}"


def check_state_management(backend, dtype):
    """zero_state, to_host, copy, scale and available_bytes of any backend."""
    state = backend.zero_state(4, 3)
    assert state.shape == (3, 16) and state.dtype == dtype
    expected = np.zeros((3, 16))
    expected[:, 0] = 1
    np.testing.assert_array_equal(backend.to_host(state), expected)
    assert backend.to_host(state).dtype == np.complex128
    copy = backend.copy(state)
    backend.apply_pauli(copy, "X", (2,))
    np.testing.assert_array_equal(backend.to_host(state), expected)  # the copy is independent
    assert backend.to_host(copy)[0, 4] == 1
    factors = np.array([1j, -1, 0.5])
    backend.scale(copy, factors)
    np.testing.assert_allclose(backend.to_host(copy)[:, 4], factors, atol=1e-7)
    assert backend.available_bytes() > 0


# --- threaded kernels --------------------------------------------------------------------

BIG_N = 18  # 2**18 amplitudes >= _PARALLEL_THRESHOLD: the threaded kernels run


def test_big_states_use_the_threaded_kernels():
    assert (1 << BIG_N) >= _cpu_kernels._PARALLEL_THRESHOLD
    assert 5 * (1 << 16) >= _cpu_kernels._PARALLEL_THRESHOLD
    big = np.zeros((1, 1 << BIG_N), dtype=np.complex128)
    small = np.zeros((1, 1 << 6), dtype=np.complex128)
    for name, (threaded, serial) in _cpu_kernels._KERNELS.items():
        assert _cpu_kernels.kernel(name, big) is threaded
        assert _cpu_kernels.kernel(name, small) is serial


BIG_SHAPES = [(BIG_N, 1), (16, 5)]  # (qubits, batch), both over the threshold
BIG_CASES = [
    ((0,), (), ()),
    ((15 - 2,), (1, 0), (1, 0)),
    ((3, 12), (), ()),
    ((0, 1), (2,), (1,)),
    ((13, 2, 7), (), ()),
    ((1, 0, 2), (5, 3), (0, 1)),
]


@pytest.fixture(scope="module")
def big_states():
    rng = np.random.default_rng(99)
    return {shape: random_states(shape[0], shape[1], rng) for shape in BIG_SHAPES}


@pytest.mark.parametrize("shape", BIG_SHAPES, ids=lambda s: f"n{s[0]}b{s[1]}")
@pytest.mark.parametrize("case", BIG_CASES, ids=[_ids(c) for c in BIG_CASES])
def test_threaded_apply_matrix(case, shape, big_states):
    targets, controls, values = case
    n, batch = shape
    rng = np.random.default_rng(stable_seed("big", case, shape))
    mats = np.stack([random_unitary(1 << len(targets), rng) for _ in range(batch)])
    psi = big_states[shape]
    backend = CPUBackend()
    state = backend.from_host(psi)
    backend.apply_matrix(state, mats, targets, controls, values)
    np.testing.assert_allclose(
        state, ref_apply_blocks(psi, mats, targets, controls, values), atol=1e-12
    )
    shared = backend.from_host(psi)
    backend.apply_matrix(shared, mats[:1], targets, controls, values)
    np.testing.assert_allclose(
        shared, ref_apply_blocks(psi, mats[:1], targets, controls, values), atol=1e-12
    )


@pytest.mark.parametrize("shape", BIG_SHAPES, ids=lambda s: f"n{s[0]}b{s[1]}")
def test_threaded_diagonal_pauli_rotation(shape, big_states):
    n, batch = shape
    rng = np.random.default_rng(stable_seed("big-other", shape))
    psi = big_states[shape]
    backend = CPUBackend()

    diags = np.exp(1j * rng.uniform(0, 6, size=(batch, 4)))
    state = backend.from_host(psi)
    backend.apply_diagonal(state, diags, (n - 1, 2), (0,), (1,))
    mats = np.stack([np.diag(d) for d in diags])
    np.testing.assert_allclose(
        state, ref_apply_blocks(psi, mats, (n - 1, 2), (0,), (1,)), atol=1e-12
    )

    for word, targets, controls, values in [
        ("XYZ", (n - 1, 0, 5), (3,), (0,)),
        ("ZZ", (1, 7), (), ()),
        ("YX", (0, 1), (2, n - 2), (1, 1)),
    ]:
        state = backend.from_host(psi)
        backend.apply_pauli(state, word, targets, controls, values)
        expected = ref_apply_blocks(psi, word_matrix(word)[None], targets, controls, values)
        np.testing.assert_allclose(state, expected, atol=1e-12)

        angles = rng.uniform(-3, 3, size=batch)
        state = backend.from_host(psi)
        backend.apply_pauli_rotation(state, angles, word, targets, controls, values)
        mats = np.stack([rotation(word, a) for a in angles])
        expected = ref_apply_blocks(psi, mats, targets, controls, values)
        np.testing.assert_allclose(state, expected, atol=1e-12)


@pytest.mark.parametrize("shape", BIG_SHAPES, ids=lambda s: f"n{s[0]}b{s[1]}")
def test_threaded_reductions(shape, big_states):
    n, batch = shape
    psi = big_states[shape]
    backend = CPUBackend()
    state = backend.from_host(psi)

    for bits in [(0,), (n - 1, 3), (2, 0, n - 2, 5)]:
        np.testing.assert_allclose(
            backend.probabilities(state, bits), ref_probs(psi, bits), atol=1e-12
        )

    for word, targets in [("X", (n - 1,)), ("ZYX", (0, 4, 9)), ("ZZ", (3, 1))]:
        applied = ref_apply_blocks(psi, word_matrix(word)[None], targets)
        expected = np.real(np.einsum("bi,bi->b", psi.conj(), applied))
        np.testing.assert_allclose(backend.expval_pauli(state, word, targets), expected, atol=1e-12)

    rng = np.random.default_rng(1)
    for targets in [(0,), (n - 1, 2), (5, 0, 11)]:
        d = 1 << len(targets)
        m = rng.normal(size=(d, d)) + 1j * rng.normal(size=(d, d))
        applied = ref_apply_blocks(psi, m[None], targets)
        expected = np.einsum("bi,bi->b", psi.conj(), applied)
        np.testing.assert_allclose(backend.expval_matrix(state, m, targets), expected, atol=1e-12)


MANY_Z_WORDS = [
    ("ZZ", (0, 5)),
    ("Z", (3,)),
    ("", ()),
    ("ZZZ", (1, 2, 4)),
    ("ZZ", (0, 5)),
    ("ZIZZ", (5, 1, 2, 0)),
]
"""Enough Z words (one repeated, one empty) for the sums' one-diagonal path."""


def check_add_pauli_sum(backend, words):
    """dst += sum_k c_k P_k src with src unchanged, against the dense operator."""
    rng = np.random.default_rng(stable_seed("pauli_sum", str(words)))
    dst, src = random_states(N, 3, rng), random_states(N, 1, rng)
    coefficients = rng.normal(size=len(words)) + 1j * rng.normal(size=len(words))
    state, source = backend.from_host(dst), backend.from_host(src)
    backend.add_pauli_sum(state, source, words, coefficients)
    operator = sum(
        c * dense_operator(N, word_matrix(w), t)
        for (w, t), c in zip(words, coefficients, strict=True)
    )
    np.testing.assert_allclose(backend.to_host(state), dst + (operator @ src[0])[None], atol=1e-12)
    np.testing.assert_array_equal(backend.to_host(source), src)


@pytest.mark.parametrize("n", [1, 7, 10])
def test_add_pauli_sum_of_many_z_words_on_other_registers(n):
    """The diagonal factored over the high and low index bits, for odd and even n."""
    rng = np.random.default_rng(stable_seed("z_sum_registers", n))
    masks = [int(m) for m in rng.integers(0, 1 << n, size=9)]
    words = [("Z" * bin(m).count("1"), [b for b in range(n) if (m >> b) & 1]) for m in masks]
    coefficients = rng.normal(size=9) + 1j * rng.normal(size=9)
    dst, src = random_states(n, 2, rng), random_states(n, 1, rng)
    state = CPUBackend().from_host(dst)
    CPUBackend().add_pauli_sum(state, src, words, coefficients)
    x = np.arange(1 << n)
    parity = np.array([[bin(int(i) & m).count("1") % 2 for m in masks] for i in x])
    diagonal = (1 - 2 * parity) @ coefficients
    np.testing.assert_allclose(state, dst + diagonal[None] * src, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64], ids=["c128", "c64"])
@pytest.mark.parametrize("complex_coefficients", [False, True], ids=["real", "complex"])
def test_add_pauli_sum_of_many_z_words(dtype, complex_coefficients):
    """The summed diagonal in the state's precision, real or complex."""
    rng = np.random.default_rng(stable_seed("pauli_sum_many", complex_coefficients))
    dst, src = random_states(N, 2, rng), random_states(N, 1, rng)
    coefficients = rng.normal(size=len(MANY_Z_WORDS))
    if complex_coefficients:
        coefficients = coefficients + 1j * rng.normal(size=len(MANY_Z_WORDS))
    backend = CPUBackend(dtype)
    state = backend.from_host(dst)
    backend.add_pauli_sum(state, backend.from_host(src), MANY_Z_WORDS, coefficients)
    operator = sum(
        c * dense_operator(N, word_matrix(w), t)
        for (w, t), c in zip(MANY_Z_WORDS, coefficients, strict=True)
    )
    expected = dst.astype(dtype) + (operator @ src.astype(dtype)[0])[None]
    np.testing.assert_allclose(backend.to_host(state), expected, atol=TOL[dtype] * 10)


def check_expval_pauli_words(backend, words, dtype):
    """<P_k> of every word for each of 3 vectors, (3, K) float64, against dense operators."""
    rng = np.random.default_rng(stable_seed("expval_pauli_words", str(words)))
    psi = random_states(N, 3, rng)
    out = backend.expval_pauli_words(backend.from_host(psi), words)
    assert out.dtype == np.float64 and out.shape == (3, len(words))
    for k, (word, targets) in enumerate(words):
        op = dense_operator(N, word_matrix(word), targets)
        expected = np.real(np.einsum("bi,ij,bj->b", psi.conj(), op, psi))
        np.testing.assert_allclose(out[:, k], expected, atol=TOL[dtype] * 10)


LARGE_REGISTER_CASES = [
    # (targets, controls, values) on a 12-bit register: low and high bits mixed
    ((9, 2), (), ()),
    ((0, 8), (10,), (1,)),
    ((11, 10), (3, 9), (0, 1)),
    ((1, 0, 10), (), ()),
]


@pytest.mark.parametrize("case", LARGE_REGISTER_CASES, ids=str)
def test_shared_diagonal_on_a_larger_register(case):
    """Runs of consecutive amplitudes longer and shorter than a kernel's inner loop."""
    targets, controls, values = case
    n = 12
    rng = np.random.default_rng(stable_seed("rows", case))
    psi = random_states(n, 2, rng)
    diagonal = np.exp(1j * rng.uniform(0, 6, size=(1, 1 << len(targets))))
    backend = CPUBackend()
    state = backend.from_host(psi)
    backend.apply_diagonal(state, diagonal, targets, controls, values)
    matrices = np.diag(diagonal[0])[None]
    np.testing.assert_allclose(
        state, ref_apply_blocks(psi, matrices, targets, controls, values), atol=1e-12
    )


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("word, targets", [("ZZ", (9, 2)), ("ZIZ", (0, 5, 11)), ("Z", (10,))])
def test_diagonal_step_on_a_larger_register(word, targets, rows):
    n = 12
    rng = np.random.default_rng(stable_seed("rows_step", word, targets, rows))
    phi, bras = random_states(n, 1, rng), random_states(n, rows, rng)
    angle = np.array([rng.uniform(-3, 3)])
    backend = CPUBackend()
    fused_phi, fused_bras = backend.from_host(phi), backend.from_host(bras)
    products = backend.adjoint_pauli_rotation_step(fused_phi, fused_bras, angle, word, targets)
    signs = np.diag(word_matrix(word))
    undo = np.diag(np.exp(0.5j * angle[0] * signs))
    z = ref_apply_blocks(phi, np.diag(signs)[None], targets)
    np.testing.assert_allclose(products, bras.conj() @ z[0], atol=1e-12)
    np.testing.assert_allclose(fused_phi, ref_apply_blocks(phi, undo[None], targets), atol=1e-12)
    np.testing.assert_allclose(fused_bras, ref_apply_blocks(bras, undo[None], targets), atol=1e-12)


def _kernel_args(name, state, rng):
    """Arguments (after the state) of kernel ``name``, the way CPUBackend builds them."""
    n = state.shape[1].bit_length() - 1
    batch = state.shape[0]
    sort = lambda bits: np.sort(np.asarray(bits, dtype=np.int64))  # noqa: E731
    if name == "apply_1q":
        return (random_unitary(2, rng)[None], 3, sort([3, 0]), 1 << 0)
    if name == "apply_1q_rotation":
        return (np.array([0.7] * batch), 2, n - 1, sort([n - 1, 1]), 1 << 1)
    if name == "apply_2q":
        return (
            np.stack([random_unitary(4, rng)] * batch),
            np.array([n - 1, 1]),
            sort([n - 1, 1, 2]),
            0,
        )
    if name == "apply_kq":
        return (random_unitary(8, rng)[None], np.array([2, 0, 6]), sort([2, 0, 6]), 0)
    if name == "apply_diagonal":
        return (
            np.exp(1j * rng.uniform(0, 6, size=(1, 4))),
            np.array([0, 4]),
            sort([0, 4, 5]),
            1 << 5,
        )
    if name == "inner_diagonal":
        d = rng.normal(size=4) + 1j * rng.normal(size=4)
        ket = state[:1].copy()
        return (ket, d, np.array([2, n - 1]), sort([2, n - 1]), np.empty(batch, dtype=complex))
    if name == "apply_pauli_rotation":
        x, z = (1 << 2) | (1 << 7), (1 << 7) | (1 << 1)
        return (np.array([0.7] * batch), x, z, 1j, sort([7]), 0)
    if name == "apply_pauli":
        return ((1 << 2) | (1 << 7), (1 << 7), 1j, sort([7, 0]), 1)
    if name == "inner_pauli":
        ket = state[::-1].copy()
        return (ket, (1 << 3), (1 << 3) | 1, 1j, sort([3]), np.empty(batch, dtype=complex))
    if name == "inner_matrix":
        m = rng.normal(size=(4, 4)) + 1j * rng.normal(size=(4, 4))
        ket = state[:1].copy()
        return (ket, m, np.array([1, n - 1]), sort([1, n - 1]), np.empty(batch, dtype=complex))
    if name == "rotation_step_1q":
        bras = state[::-1].copy()
        return (bras, np.array([0.7]), 2, 4, sort([4]), np.empty(batch, dtype=complex))
    if name == "diagonal_step":
        bras = state[::-1].copy()
        diagonal = np.exp(1j * rng.uniform(0, 6, size=4))
        signs = np.array([1, -1, -1, 1], dtype=complex)
        return (
            bras,
            diagonal,
            signs,
            np.array([3, n - 1]),
            sort([3, n - 1]),
            np.empty(batch, dtype=complex),
        )

    if name == "add_z_sum":
        masks = np.array([(1 << 3) | 1, 1 << (n - 1), 0], dtype=np.uint64)
        return (state[::-1].copy(), masks, np.array([0.5, -1.25j, 2.0]))
    if name == "add_scaled":
        return (state[::-1].copy(), np.array([0.5 - 0.25j]))
    if name == "add_z_sum_by_blocks":
        low = 7
        signs = 1.0 - 2.0 * rng.integers(0, 2, size=(3, 1 << low))
        coefficients = rng.normal(size=(state.shape[1] >> low, 3)) * (1 - 0.5j)
        return (state[::-1].copy(), coefficients, signs, low)
    if name == "low_sign_sums":
        low = 7
        signs = 1.0 - 2.0 * rng.integers(0, 2, size=(3, 1 << low))
        return (signs, low, np.empty((batch, state.shape[1] >> low, 3)))
    if name == "marginal_probs":
        return (np.array([4, 0, n - 1]), np.empty((batch, 8)))
    if name in ("apply_z_phases", "z_rotations_step"):  # as CPUBackend builds them
        masks = [(1 << 0) | (1 << (n - 1)), 0b110, 1 << 3, (1 << 2) | (1 << (n - 2))]
        angles = rng.normal(size=(batch, len(masks)))
        plan = _z_rotation_plan(angles, masks, state.shape[1])
        if name == "apply_z_phases":
            return (plan.counts, plan.low_signs, plan.tables, plan.low)
        rows, groups = 2, plan.low_signs.shape[0]
        bras = np.repeat(state[::-1], rows, axis=0) * (1 - 0.5j)
        out = np.empty((batch * (state.shape[1] >> plan.low), rows, groups), dtype=complex)
        return (bras, plan.counts, plan.low_signs, plan.tables, plan.low, out)
    if name == "block_step":  # the state is phi; then bras, M^dagger, placement, partials
        rows, targets = 2, [n - 1, 0, 3]
        bras = np.repeat(state[::-1], rows, axis=0) * (1 - 0.5j)
        adjoints = np.stack([random_unitary(8, rng) for _ in range(batch)])
        per = _cpu_kernels.chunks_per_vector(batch, state.shape[1] >> len(targets))
        partial = np.empty((batch * per, rows, 8, 8), dtype=complex)
        return (bras, adjoints, np.array(targets), sort(targets), partial)
    if name == "block_step_2q":  # as block_step, on two bits
        rows, targets = 2, [n - 1, 1]
        bras = np.repeat(state[::-1], rows, axis=0) * (1 - 0.5j)
        adjoints = np.stack([random_unitary(4, rng) for _ in range(batch)])
        per = _cpu_kernels.chunks_per_vector(batch, state.shape[1] >> 2)
        partial = np.empty((batch * per, rows, 4, 4), dtype=complex)
        return (bras, adjoints, np.array(targets), sort(targets), partial)
    if name == "block_step_1q":  # as block_step, on one bit
        rows, target = 3, n - 2
        bras = np.repeat(state[::-1], rows, axis=0) * (1 - 0.5j)
        adjoints = np.stack([random_unitary(2, rng) for _ in range(batch)])
        per = _cpu_kernels.chunks_per_vector(batch, state.shape[1] >> 1)
        partial = np.empty((batch * per, rows, 2, 2), dtype=complex)
        return (bras, adjoints, target, sort([target]), partial)
    if name == "apply_rotation_pair":
        return (
            rng.uniform(-3, 3, size=(batch, 2)),
            np.array([1, 2]),
            np.array([n - 1, 0]),
            sort([n - 1, 0]),
        )
    if name == "rotation_pair_step":  # the state is phi; then bras, angles, placement, sums
        rows, targets = 2, [2, n - 2]
        bras = np.repeat(state[::-1], rows, axis=0) * (1 - 0.5j)
        per = _cpu_kernels.chunks_per_vector(batch, state.shape[1] >> 2)
        partial = np.empty((batch * per, rows, 2), dtype=complex)
        angles = rng.uniform(-3, 3, size=(1, 2))
        return (bras, angles, np.array([3, 1]), np.array(targets), sort(targets), partial)
    if name == "product_state":  # the state is overwritten; tables of the set bits
        zero_bits = sort([2, n - 1])
        low_count = (n - 2) // 2
        low = rng.normal(size=(batch, 1 << low_count)) + 1j
        high = rng.normal(size=(batch, 1 << (n - 2 - low_count))) - 1j
        return (low, high, low_count, zero_bits)
    raise AssertionError(f"no arguments for new kernel {name}; add them to this test")


@pytest.mark.parametrize("shape", BIG_SHAPES, ids=lambda s: f"n{s[0]}b{s[1]}")
@pytest.mark.parametrize("name", list(_cpu_kernels._KERNELS))
def test_threaded_kernel_equals_serial_kernel(name, shape, big_states):
    """Every kernel, compiled threaded and serial, gives the same result on a big batch."""
    threaded, serial = _cpu_kernels._KERNELS[name]
    psi = big_states[shape]
    args = _kernel_args(name, psi, np.random.default_rng(stable_seed(name)))
    outputs, extras = [], []
    for fn in (threaded, serial):
        state = np.array(psi, order="C")
        fn_args = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
        fn(state, *fn_args)
        out = fn_args[-1] if name.startswith(("inner", "marginal", "low_sign")) else state
        outputs.append(out)
        if name.startswith("block_step") or name in ("z_rotations_step", "rotation_pair_step"):
            extras.append((fn_args[0], fn_args[-1]))
    np.testing.assert_allclose(outputs[0], outputs[1], atol=1e-12)
    for threaded_out, serial_out in zip(*extras, strict=True):
        np.testing.assert_allclose(threaded_out, serial_out, atol=1e-12)
    if not name.startswith(("inner", "marginal", "low_sign")):
        assert not np.allclose(outputs[0], psi)  # the kernel did something


@pytest.mark.parametrize("batch", [1, 2, 5])
def test_many_random_gates_complex64_vs_complex128(batch):
    """A random sequence of every kernel: complex64 tracks complex128 within round-off."""
    rng = np.random.default_rng(stable_seed("sequence", batch))
    psi = random_states(N, batch, rng)
    b64, b128 = CPUBackend(np.complex64), CPUBackend(np.complex128)
    s64, s128 = b64.from_host(psi), b128.from_host(psi)
    expected = psi.copy()
    for step in range(40):
        bits = [int(b) for b in rng.permutation(N)]
        kind = step % 4
        k = 1 + step % 3
        targets, controls = bits[:k], bits[k : k + step % 2 + 1]
        values = [int(v) for v in rng.integers(0, 2, size=len(controls))]
        if kind == 0:
            m = np.stack([random_unitary(1 << k, rng) for _ in range(batch)])
            for b, s in ((b64, s64), (b128, s128)):
                b.apply_matrix(s, m, targets, controls, values)
        elif kind == 1:
            m = np.exp(1j * rng.uniform(0, 6, size=(1, 1 << k)))
            for b, s in ((b64, s64), (b128, s128)):
                b.apply_diagonal(s, m, targets, controls, values)
            m = np.stack([np.diag(d) for d in m])
        elif kind == 2:
            word = "".join(rng.choice(list("IXYZ"), size=k))
            angles = rng.uniform(-3, 3, size=batch)
            for b, s in ((b64, s64), (b128, s128)):
                b.apply_pauli_rotation(s, angles, word, targets, controls, values)
            m = np.stack([rotation(word, a) for a in angles])
        else:
            word = "".join(rng.choice(list("XYZ"), size=k))
            for b, s in ((b64, s64), (b128, s128)):
                b.apply_pauli(s, word, targets, controls, values)
            m = word_matrix(word)[None]
        expected = ref_apply(expected, m, targets, controls, values)
    np.testing.assert_allclose(b128.to_host(s128), expected, atol=1e-12)
    np.testing.assert_allclose(b64.to_host(s64), expected, atol=1e-4)


def test_all_target_layouts_two_qubit_small():
    """Every ordered pair of targets with every third bit as a 0/1 control on 4 qubits."""
    rng = np.random.default_rng(12)
    backend = CPUBackend()
    psi = random_states(4, 2, rng)
    for t0, t1 in itertools.permutations(range(4), 2):
        m = random_unitary(4, rng)[None]
        for c in set(range(4)) - {t0, t1}:
            for v in (0, 1):
                state = backend.from_host(psi)
                backend.apply_matrix(state, m, (t0, t1), (c,), (v,))
                np.testing.assert_allclose(
                    state, ref_apply(psi, m, (t0, t1), (c,), (v,)), atol=1e-12
                )


# --- deferred adjoint: block step, gather, concatenate -----------------------------------

BLOCK_STEP_TARGETS = [(), (0,), (5,), (3, 1), (0, 5), (0, 1, 2), (4, 0, 2), (1, 5, 3)]


def _axis_letters(n):
    """Letter i names axis i of a (2,) * n state tensor, which is state bit n - 1 - i."""
    return list("abcdefghijklmnop"[:n])


def ref_block_apply(psi, matrices, targets):
    """psi_v <- M_v psi_v by einsum over the (2,) * n tensor of each vector: ``matrices``
    (V, d, d) reshaped to (2,) * 2k, row bits then column bits, most significant first."""
    n, k = psi.shape[1].bit_length() - 1, len(targets)
    state = _axis_letters(n)
    new = list("qrstuvwx"[:k])
    rows = [new[j] for j in reversed(range(k))]
    cols = [state[n - 1 - targets[j]] for j in reversed(range(k))]
    out = list(state)
    for j, bit in enumerate(targets):
        out[n - 1 - bit] = new[j]
    spec = "Z{},Z{}->Z{}".format("".join(rows + cols), "".join(state), "".join(out))
    tensors = np.einsum(
        spec, matrices.reshape((len(matrices),) + (2,) * 2 * k), psi.reshape((-1,) + (2,) * n)
    )
    return tensors.reshape(psi.shape)


def ref_block_reduction(bras, phi, targets):
    """T[v, a, c] = sum_rest conj(bra_v[a, rest]) phi_v[c, rest] by einsum, one phi per bra."""
    n, k = phi.shape[1].bit_length() - 1, len(targets)
    state = _axis_letters(n)
    a_bits, c_bits = list("qrstuvwx"[:k]), list("QRSTUVWX"[:k])
    bra_axes, phi_axes = list(state), list(state)
    for j, bit in enumerate(targets):
        bra_axes[n - 1 - bit], phi_axes[n - 1 - bit] = a_bits[j], c_bits[j]
    out = "".join(a_bits[::-1] + c_bits[::-1])  # bit j of a (and c) is targets[j]
    spec = "Z{},Z{}->Z{}".format("".join(bra_axes), "".join(phi_axes), out)
    tensors = np.einsum(spec, bras.conj().reshape((-1,) + (2,) * n), phi.reshape((-1,) + (2,) * n))
    return tensors.reshape(len(bras), 1 << k, 1 << k)


def test_block_step_references_follow_the_conventions():
    """The einsum references agree with the dense operator (targets[j] = bit j of a)."""
    rng = np.random.default_rng(stable_seed("block_references"))
    psi, bras = random_states(N, 2, rng), random_states(N, 2, rng)
    for targets in BLOCK_STEP_TARGETS:
        d = 1 << len(targets)
        m = np.stack([random_unitary(d, rng) for _ in range(2)])
        np.testing.assert_allclose(
            ref_block_apply(psi, m, targets), ref_apply(psi, m, targets), atol=1e-12
        )
        t = ref_block_reduction(bras, psi, targets)
        for a, c in itertools.product(range(d), repeat=2):
            unit = np.zeros((d, d))
            unit[a, c] = 1  # |a><c| on the targets: <bra|unit|phi> = T[a, c]
            op = dense_operator(N, unit, targets)
            expected = np.einsum("vi,ij,vj->v", bras.conj(), op, psi)
            np.testing.assert_allclose(t[:, a, c], expected, atol=1e-12)


Z_RUN_CASES = [
    # (qubits, masks, angles per vector (rows: vectors), rows of bras per vector)
    (3, [0b011, 0b110, 0b101], [[0.3, 0.3, 0.3]], 1),
    (9, [0b11, 0b101000000, 0b10010, 0b110000000, 0b1], [[0.3, 0.3, -0.7, 0.3, 1.1]], 3),
    (8, [0b10000001, 0b01100000, 0b00000110], [[0.5, -0.5, 0.5], [0.5, -0.5, 0.5]], 2),
    (
        7,
        [0b1111111, 0b0000011, 0b1000000, 0b0101010],
        [[0.1, 0.2, 0.3, 0.4], [1.0, -2.0, 0.5, 0.0]],
        1,
    ),
]


def check_z_rotations(backend):
    """apply_z_rotations equals the rotations one by one (apply_pauli_rotation), and
    adjoint_z_rotations_step returns <bra|Z_j|phi> and undoes them on phi and the bras."""
    for n, masks, angles, rows in Z_RUN_CASES:
        rng = np.random.default_rng(stable_seed("z-run", n, len(masks)))
        angles = np.array(angles)
        batch = angles.shape[0]
        psi = random_state(n, rng, batch).reshape(batch, -1)
        bras = rng.normal(size=(batch * rows, 2**n)) + 1j * rng.normal(size=(batch * rows, 2**n))
        expected = backend.from_host(psi)
        words = [[bit for bit in range(n) if mask >> bit & 1] for mask in masks]
        for j, bits in enumerate(words):
            backend.apply_pauli_rotation(expected, angles[:, j], "Z" * len(bits), bits)
        state = backend.from_host(psi)
        backend.apply_z_rotations(state, angles, masks)
        tol = TOL[backend.dtype.type]
        np.testing.assert_allclose(backend.to_host(state), backend.to_host(expected), atol=tol)
        products = np.zeros((batch, rows, len(masks)), dtype=complex)
        expected_host = backend.to_host(expected)
        for j in range(len(masks)):
            parity = (np.bitwise_count(np.arange(2**n) & masks[j]) & 1).astype(float)
            flipped = expected_host * (1.0 - 2.0 * parity)
            for b in range(batch):
                products[b, :, j] = np.conj(bras[b * rows : (b + 1) * rows]) @ flipped[b]
        phi, bra_state = backend.copy(expected), backend.from_host(bras)
        got = backend.gather([backend.adjoint_z_rotations_step(phi, bra_state, angles, masks)])[0]
        np.testing.assert_allclose(got, products, atol=tol * 10)
        np.testing.assert_allclose(backend.to_host(phi), psi, atol=tol)
        undone = backend.from_host(bras)
        for j, bits in enumerate(words):
            backend.apply_pauli_rotation(
                undone, -np.repeat(angles[:, j], rows), "Z" * len(bits), bits
            )
        np.testing.assert_allclose(backend.to_host(bra_state), backend.to_host(undone), atol=tol)


ROTATION_CASES = [  # n, paulis, targets, angles (1 or B, 2), batch, rows
    (3, "XY", (0, 2), [[0.3, -1.1]], 1, 1),
    (5, "ZX", (4, 1), [[0.7, 2.0], [-0.4, 0.9]], 2, 2),
    (6, "YY", (5, 0), [[1.3, 0.2]], 2, 3),
    (7, "XZ", (3, 4), [[-2.1, 0.6], [0.5, 1.7], [0.0, -0.8]], 3, 1),
]


def check_rotations(backend):
    """apply_one_qubit_rotations equals the rotations one by one (apply_pauli_rotation), and
    adjoint_one_qubit_rotations_step returns <bra|P_j|phi> and undoes them on phi and the bras."""
    tol = TOL[backend.dtype.type]
    for n, paulis, targets, angles, batch, rows in ROTATION_CASES:
        rng = np.random.default_rng(stable_seed("rotations", n, paulis))
        angles = np.array(angles)
        per_vector = np.broadcast_to(angles, (batch, 2))
        psi = random_state(n, rng, batch).reshape(batch, -1)
        bras = rng.normal(size=(batch * rows, 2**n)) + 1j * rng.normal(size=(batch * rows, 2**n))
        expected = backend.from_host(psi)
        for j, (letter, bit) in enumerate(zip(paulis, targets, strict=True)):
            backend.apply_pauli_rotation(expected, angles[:, j], letter, (bit,))
        state = backend.from_host(psi)
        backend.apply_one_qubit_rotations(state, angles, paulis, targets)
        np.testing.assert_allclose(backend.to_host(state), backend.to_host(expected), atol=tol)
        products = np.zeros((batch, rows, 2), dtype=complex)
        for j, (letter, bit) in enumerate(zip(paulis, targets, strict=True)):
            flipped = backend.copy(expected)
            backend.apply_pauli(flipped, letter, (bit,))
            flipped = backend.to_host(flipped)
            for b in range(batch):
                products[b, :, j] = np.conj(bras[b * rows : (b + 1) * rows]) @ flipped[b]
        phi, bra_state = backend.copy(expected), backend.from_host(bras)
        step = backend.adjoint_one_qubit_rotations_step(phi, bra_state, angles, paulis, targets)
        np.testing.assert_allclose(backend.gather([step])[0], products, atol=tol * 10)
        np.testing.assert_allclose(backend.to_host(phi), psi, atol=tol)
        undone = backend.from_host(bras)
        for j, (letter, bit) in enumerate(zip(paulis, targets, strict=True)):
            backend.apply_pauli_rotation(undone, -np.repeat(per_vector[:, j], rows), letter, (bit,))
        np.testing.assert_allclose(backend.to_host(bra_state), backend.to_host(undone), atol=tol)


@pytest.mark.parametrize("paulis, targets", [("XYZ", (0, 1, 2)), ("X", (0,)), ("XI", (0, 1))])
def test_rotations_come_in_pairs_on_the_cpu(paulis, targets):
    """The CPU backend runs ONE_QUBIT_ROTATIONS of two X, Y or Z letters (rotations_per_pass)."""
    backend = CPUBackend()
    state = backend.zero_state(3, 1)
    with pytest.raises(ValueError, match="in pairs of X, Y or Z"):
        backend.apply_one_qubit_rotations(state, np.zeros((1, len(paulis))), paulis, targets)


def check_adjoint_block_step(backend):
    """M_b^dagger on phi_b and its R bras, and T of each bra before with phi after, for
    blocks of 0 to 3 (unsorted, non-contiguous) bits, B of 1 and 3, R of 1 and 4, shared
    and per-vector matrices, against the einsum references."""
    dtype = backend.dtype.type
    tol = TOL[dtype]
    for targets, batch, rows, shared in itertools.product(
        BLOCK_STEP_TARGETS, (1, 3), (1, 4), (True, False)
    ):
        case = (targets, batch, rows, shared)
        rng = np.random.default_rng(stable_seed("block_step", *case))
        d = 1 << len(targets)
        phi = random_states(N, batch, rng).astype(dtype)
        bras = random_states(N, batch * rows, rng).astype(dtype)
        matrices = np.stack([random_unitary(d, rng) for _ in range(1 if shared else batch)])
        adjoints = np.broadcast_to(matrices.conj().transpose(0, 2, 1), (batch, d, d))
        phi_after = ref_block_apply(phi.astype(complex), adjoints, targets)
        bras_after = ref_block_apply(
            bras.astype(complex), np.repeat(adjoints, rows, axis=0), targets
        )
        expected = ref_block_reduction(
            bras.astype(complex), np.repeat(phi_after, rows, axis=0), targets
        ).reshape(batch, rows, d, d)
        phi_state, bras_state = backend_state(backend, phi), backend_state(backend, bras)
        out = backend.adjoint_block_step(phi_state, bras_state, matrices, targets)
        (t,) = backend.gather([out])
        assert isinstance(t, np.ndarray), case
        assert t.shape == (batch, rows, d, d) and t.dtype == np.complex128, case
        np.testing.assert_allclose(t, expected, atol=tol, err_msg=str(case))
        np.testing.assert_allclose(backend.to_host(phi_state), phi_after, atol=tol)
        np.testing.assert_allclose(backend.to_host(bras_state), bras_after, atol=tol)


def check_gather(backend):
    """Backend arrays of several shapes and dtypes come back as numpy arrays, unchanged."""
    assert backend.gather([]) == []
    rng = np.random.default_rng(stable_seed("gather", backend.dtype.name))
    hosts = [random_states(4, 3, rng), random_states(2, 1, rng), random_states(N, 2, rng)]
    arrays = [backend.from_host(host) for host in hosts]
    block = backend.adjoint_block_step(
        arrays[2], backend.from_host(hosts[2][::-1]), random_unitary(4, rng)[None], (3, 0)
    )  # a complex128 reduction of shape (2, 1, 4, 4) among states of the backend's dtype
    (alone,) = backend.gather([block])
    gathered = backend.gather([arrays[0], block, arrays[1]])
    assert len(gathered) == 3 and all(isinstance(g, np.ndarray) for g in gathered)
    assert gathered[1].shape == (2, 1, 4, 4) and gathered[1].dtype == np.complex128
    np.testing.assert_array_equal(gathered[1], alone)
    for host, out in zip(hosts[:2], (gathered[0], gathered[2]), strict=True):
        assert out.shape == host.shape and out.dtype == backend.dtype
        np.testing.assert_array_equal(out, host.astype(backend.dtype))


def check_product_state(backend):
    """Vector b is the Kronecker product of factors[b, j] on bits[j], |0> on other bits."""
    rng = np.random.default_rng(stable_seed("product-state", backend.dtype.name))
    tol = 1e-6 if backend.dtype == np.complex64 else 1e-12
    for n, bits, batch in [
        (N, (0, 2, 3, 5), 2),
        (N, tuple(range(N)), 1),
        (4, (3,), 3),
        (1, (0,), 1),
    ]:
        factors = rng.normal(size=(batch, len(bits), 2)) + 1j * rng.normal(
            size=(batch, len(bits), 2)
        )
        state = backend.to_host(backend.product_state(n, factors, bits))
        assert state.shape == (batch, 1 << n)
        for b in range(batch):
            expected = np.ones(1, dtype=np.complex128)
            for bit in reversed(range(n)):  # bit n-1 is the most significant
                one_qubit = factors[b, bits.index(bit)] if bit in bits else np.array([1, 0])
                expected = np.kron(expected, one_qubit)
            np.testing.assert_allclose(state[b], expected, atol=tol, rtol=tol)


def check_concatenate(backend):
    """The vectors of each batch one after the other, in a new batch."""
    rng = np.random.default_rng(stable_seed("concatenate", backend.dtype.name))
    hosts = [random_states(4, batch, rng).astype(backend.dtype) for batch in (1, 3, 2)]
    states = [backend.from_host(host) for host in hosts]
    joined = backend.concatenate(states)
    assert joined.shape == (6, 16) and joined.dtype == backend.dtype
    assert joined.flags.c_contiguous
    np.testing.assert_array_equal(backend.to_host(joined), np.concatenate(hosts))
    backend.apply_pauli(states[1], "X", (2,))  # the new batch shares no memory
    backend.apply_pauli(joined, "Y", (0,))
    np.testing.assert_array_equal(backend.to_host(states[0]), hosts[0])
    np.testing.assert_array_equal(
        backend.to_host(joined)[1:4], ref_apply(hosts[1], PAULI["Y"][None], (0,))
    )
    views = backend.concatenate(
        [backend.vectors(states[2], 1, 2), backend.vectors(states[1], 0, 1)]
    )
    np.testing.assert_array_equal(
        backend.to_host(views),
        np.concatenate([hosts[2][1:2], ref_apply(hosts[1][:1], PAULI["X"][None], (2,))]),
    )
    single = backend.concatenate(states[:1])
    backend.scale(single, np.array([0.0]))
    np.testing.assert_array_equal(backend.to_host(states[0]), hosts[0])
