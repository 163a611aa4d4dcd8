"""The CPU backend's kernels against dense numpy references: what is particular to it
(threaded kernels, larger registers, the Z-word and rotation-pair kernels, complex64
against complex128). The contract every backend meets is test_backend_contract.py; the
references, cases and checks both use are in reference.py.

Conventions (backends/base.py): state index bits are little-endian; ``targets[j]`` is the
state bit that becomes bit ``j`` of a matrix index; the gate acts where every control bit
equals its control value; batched data has a leading axis of length 1 (shared) or B.
"""

from __future__ import annotations

import dataclasses
import itertools
import types

import numpy as np
import pennylane as qml
import pytest
from conftest import stable_seed
from reference import (
    BACKEND_TOL,
    BLOCK_STEP_TARGETS,
    MANY_Z_WORDS,
    PAULI,
    N,
    dense_operator,
    flip_sources,
    random_states,
    random_unitary,
    ref_apply,
    ref_apply_blocks,
    ref_block_apply,
    ref_block_reduction,
    ref_probs,
    rotation,
    target_case_id,
    word_matrix,
)

from pennylane_custatevec.backends import _cpu_kernels
from pennylane_custatevec.backends.cpu import CPUBackend
from pennylane_custatevec.backends.cpu_arguments import permutation_groups_of, z_rotation_plan
from pennylane_custatevec.backends.cpu_sequences import pauli_word_rows
from pennylane_custatevec.backends.gate_sequence import (
    DenseEntry,
    DerivativeEntry,
    GateSequence,
    RotationEntry,
)

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


# --- threaded kernels --------------------------------------------------------------------

BIG_N = 18  # 2**18 amplitudes >= _PARALLEL_THRESHOLD: the threaded kernels run


def test_big_states_use_the_threaded_kernels():
    assert (1 << BIG_N) >= _cpu_kernels._PARALLEL_THRESHOLD
    assert 5 * (1 << 16) >= _cpu_kernels._PARALLEL_THRESHOLD
    big = np.zeros((1, 1 << BIG_N), dtype=np.complex128)
    small = np.zeros((1, 1 << 6), dtype=np.complex128)
    for kernel in _cpu_kernels.ALL_KERNELS:
        assert kernel.for_size(big) is kernel.threaded
        assert kernel.for_size(small) is kernel.serial


def test_the_threshold_counts_every_vector_of_a_batch():
    """``for_size`` picks the threaded compilation from _PARALLEL_THRESHOLD amplitudes of the
    whole batch: two vectors of half the threshold are threaded, one of them is serial."""
    threshold = _cpu_kernels._PARALLEL_THRESHOLD
    kernel = _cpu_kernels.apply_1q
    assert kernel.for_size(np.zeros((2, threshold // 2))) is kernel.threaded
    assert kernel.for_size(np.zeros((1, threshold // 2))) is kernel.serial
    assert kernel.for_size(np.zeros((1, threshold - 1))) is kernel.serial


def test_every_kernel_is_listed_once_and_compiled_twice():
    """ALL_KERNELS holds every Kernel of _cpu_kernels, each bound to its own name; no function
    of the module is left uncompiled (its one plain function is chunks_per_vector); each
    Kernel holds a threaded and a serial compilation under distinct qualified names (the
    key of numba's on-disk cache)."""
    names = vars(_cpu_kernels)
    kernels = {name: v for name, v in names.items() if isinstance(v, _cpu_kernels.Kernel)}
    assert sorted(kernel.name for kernel in _cpu_kernels.ALL_KERNELS) == sorted(kernels)
    for kernel in _cpu_kernels.ALL_KERNELS:
        assert kernels[kernel.name] is kernel
        assert kernel.threaded.targetoptions.get("parallel") is True
        assert "parallel" not in kernel.serial.targetoptions
        assert kernel.threaded.py_func.__qualname__ == kernel.name
        assert kernel.serial.py_func.__qualname__ == kernel.name + "_serial"
        assert kernel.serial.py_func.__code__ is kernel.threaded.py_func.__code__
    plain = [
        name
        for name, value in names.items()
        if isinstance(value, types.FunctionType) and value.__module__ == _cpu_kernels.__name__
    ]
    assert plain == ["chunks_per_vector"]


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
@pytest.mark.parametrize("case", BIG_CASES, ids=[target_case_id(c) for c in BIG_CASES])
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
    np.testing.assert_allclose(backend.to_host(state), expected, atol=BACKEND_TOL[dtype] * 10)


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
        plan = z_rotation_plan(angles, masks, state.shape[1])
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
        return (bras, adjoints, target, partial)
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
    if name == "apply_bit_permutation":  # a CNOT chain over the high bits, and an X
        gates = [((b + 1,), b) for b in range(n - 2, n - 8, -1)] + [((), 2)]
        sources = flip_sources(gates, n)
        groups = permutation_groups_of(tuple(int(s) for s in sources), n)
        buffers = np.empty((2, 1 << len(groups.group_bits)), dtype=complex)
        return (sources, *groups, buffers)
    if name == "apply_tiled_2x2":  # a run on the low bits, repeated, in tiles of 2**6
        targets = np.array([0, 5, 1, 2, 3, 0, 4])
        return (np.stack([np.stack([random_unitary(2, rng) for _ in targets])] * batch), targets, 6)
    if name == "tiled_2x2_step":  # the state is phi; then bras, the adjoints, tiles, sums
        rows, targets = 2, np.array([0, 5, 1, 2, 3, 0, 4])
        bras = np.repeat(state[::-1], rows, axis=0) * (1 - 0.5j)
        adjoints = np.stack([np.stack([random_unitary(2, rng) for _ in targets])] * batch)
        per = _cpu_kernels.chunks_per_vector(batch, state.shape[1] >> 6)
        out = np.empty((batch * per, rows, len(targets), 4), dtype=complex)
        return (bras, adjoints, targets, 6, out)
    if name == "product_state":  # the state is overwritten; tables of the set bits
        zero_bits = sort([2, n - 1])
        low_count = (n - 2) // 2
        low = rng.normal(size=(batch, 1 << low_count)) + 1j
        high = rng.normal(size=(batch, 1 << (n - 2 - low_count))) - 1j
        return (low, high, low_count, zero_bits)
    if name in _SEQUENCE_KERNELS:  # a sequence with one-bit runs, dense and wide entries
        prepared, n_columns = _big_sequence(n)
        angles = rng.uniform(-3, 3, size=(batch, 4))
        base = (prepared.ops, prepared.bits, prepared.matrices, angles)
        words = pauli_word_rows((("Z", (0,)), ("XY", (n - 1, 2))))
        rows = 2
        if name == "run_sequence":
            return base
        if name == "run_sequence_measured":
            return (*base, words, np.empty((batch, len(words))))
        if name == "sweep_sequence":
            bras = np.repeat(state[::-1], rows, axis=0) * (1 - 0.5j)
            return (bras, *base, np.zeros((batch, rows, n_columns)))
        coefficients = rng.normal(size=(batch, rows, len(words))) * (1 - 0.5j)
        out = np.zeros((batch, rows, n_columns))
        if name == "run_sequence_jacobian":  # the sequence as its own sweep sequence
            sequence = (prepared.ops, prepared.bits, prepared.matrices)
            values = np.empty((batch, len(words)))
            return (*sequence, *sequence, angles, words, coefficients, values, out)
        return (*base, words, coefficients, out)
    raise AssertionError(f"no arguments for new kernel {name}; add them to this test")


_SEQUENCE_KERNELS = (
    "run_sequence",
    "run_sequence_measured",
    "sweep_sequence",
    "sweep_sequence_from_words",
    "run_sequence_jacobian",
)


def _big_sequence(n: int):
    """A prepared sequence on n bits (a run of one-bit rotations and a dense 2x2 on bit 1,
    dense gates on 2 and 3 bits, a two-bit and a controlled rotation, four derivatives)
    and its number of gradient columns."""
    rng = np.random.default_rng(stable_seed("big sequence", n))
    x1 = RotationEntry("X", (1,), (), (), 0)
    y1 = RotationEntry("Y", (1,), (), (), 1)
    zz = RotationEntry("ZZ", (2, n - 1), (), (), 2)
    cx = RotationEntry("X", (3,), (0,), (1,), 3)
    entries = (
        DenseEntry((0, n - 2), random_unitary(4, rng)),
        x1,
        DerivativeEntry(0, x1),
        y1,
        DerivativeEntry(1, y1),
        DenseEntry((1,), random_unitary(2, rng)),
        zz,
        DerivativeEntry(2, zz),
        DenseEntry((1, 2, 3), random_unitary(8, rng)),
        cx,
        DerivativeEntry(3, cx),
        DenseEntry((n - 1,), random_unitary(2, rng)),
    )
    return CPUBackend().prepare_sequence(GateSequence(n, entries, 4, 0)), 4


@pytest.mark.parametrize("shape", BIG_SHAPES, ids=lambda s: f"n{s[0]}b{s[1]}")
@pytest.mark.parametrize("kernel", _cpu_kernels.ALL_KERNELS, ids=lambda kernel: kernel.name)
def test_threaded_kernel_equals_serial_kernel(kernel, shape, big_states):
    """Every kernel, compiled threaded and serial, gives the same result on a big batch."""
    name, threaded, serial = kernel.name, kernel.threaded, kernel.serial
    psi = big_states[shape]
    args = _kernel_args(name, psi, np.random.default_rng(stable_seed(name)))
    outputs, extras = [], []
    for fn in (threaded, serial):
        state = np.array(psi, order="C")
        fn_args = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
        fn(state, *fn_args)
        out = fn_args[-1] if name.startswith(("inner", "marginal", "low_sign")) else state
        outputs.append(out)
        if name == "run_sequence_jacobian":  # the values and the gradient columns
            extras.append((fn_args[-2], fn_args[-1]))
        elif name.startswith(("block_step", "sweep_sequence")) or name in (
            "z_rotations_step",
            "rotation_pair_step",
            "tiled_2x2_step",
        ):
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


@pytest.mark.parametrize("paulis, targets", [("XYZ", (0, 1, 2)), ("X", (0,)), ("XI", (0, 1))])
def test_rotations_come_in_pairs_on_the_cpu(paulis, targets):
    """The CPU backend runs ONE_QUBIT_ROTATIONS of two X, Y or Z letters (rotations_per_pass)."""
    backend = CPUBackend()
    state = backend.zero_state(3, 1)
    with pytest.raises(ValueError, match="in pairs of X, Y or Z"):
        backend.apply_one_qubit_rotations(state, np.zeros((1, len(paulis))), paulis, targets)


@pytest.mark.parametrize("n_qubits", [1, 2, 3, 4])
@pytest.mark.parametrize("rows", [1, 3])
def test_z_word_rotation_steps_on_small_registers_match_the_composition(n_qubits, rows):
    """The fused adjoint step through a rotation about a word of Z (``diagonal_step``,
    whose low-bit path walks blocks of 8 amplitudes) equals the base class's composition
    (inner product, then the inverse rotation on phi and the bras) on registers of fewer
    than 8 amplitudes too: on 2 qubits it walked no block at all (a ZZ rotation's gradient
    was 0 and the gate stayed on the vectors)."""
    from pennylane_custatevec.backends.base import Backend

    backend = CPUBackend()
    rng = np.random.default_rng(stable_seed("small z words", n_qubits, rows))
    for width in range(1, n_qubits + 1):
        for targets in itertools.permutations(range(n_qubits), width):
            phi = random_states(n_qubits, 1, rng)
            bras = random_states(n_qubits, rows, rng)
            angles = rng.uniform(-3, 3, 1)
            word = "Z" * width
            want_phi, want_bras = phi.copy(), bras.copy()
            want = Backend.adjoint_pauli_rotation_step(
                backend, want_phi, want_bras, angles, word, targets
            )
            got = backend.adjoint_pauli_rotation_step(phi, bras, angles, word, targets)
            np.testing.assert_allclose(got, want, atol=1e-12)
            np.testing.assert_allclose(phi, want_phi, atol=1e-12)
            np.testing.assert_allclose(bras, want_bras, atol=1e-12)


# --- tiled runs at their real size ----------------------------------------------------------


@pytest.mark.real_size_thresholds
@pytest.mark.parametrize("template, n", [("SEL", 16), ("SEL", 18), ("BEL-RY", 18)])
@pytest.mark.parametrize("batch", [None, 2])
def test_tiled_runs_at_their_real_size(template, n, batch, mocker):
    """From 16 qubits (the CPU's min_tiled_qubits) the one-bit blocks on bits 0..13 run as
    tiled runs in tiles of 2**14 amplitudes, forward and in the deferred sweep (lone
    rotations, as BasicEntanglerLayers' RY after a CNOT ring, from 18: the planner's test).
    Values and the Jacobian of two outputs (two bras) equal those of the same device with
    tiled runs off, to 1e-10, broadcast or not."""
    traits = CPUBackend.fusion_traits
    assert (traits.tile_bits, traits.min_tiled_qubits, traits.min_tiled_rotation_qubits) == (
        14,
        16,
        18,
    )
    rng = np.random.default_rng(stable_seed("tiled real size", template, n, batch))
    weights = rng.uniform(-np.pi, np.pi, size=(2, n, 3) if template == "SEL" else (2, n))
    x = rng.uniform(-1, 1, size=(batch, n) if batch else (n,))

    def circuit(x, weights):
        qml.AngleEmbedding(x, wires=range(n), rotation="Y")
        if template == "SEL":
            qml.StronglyEntanglingLayers(weights, wires=range(n))
        else:
            qml.BasicEntanglerLayers(weights, wires=range(n), rotation=qml.RY)
        return qml.expval(qml.Z(0) @ qml.Z(n - 1)), qml.expval(qml.X(n - 2))

    device = qml.device("custatevec.qubit", wires=n, backend="cpu")
    qnode = qml.QNode(circuit, device, diff_method="adjoint")
    forward = mocker.spy(CPUBackend, "apply_tiled_matrices")
    step = mocker.spy(CPUBackend, "adjoint_tiled_matrices_step")
    weights = qml.numpy.array(weights, requires_grad=True)

    def run():
        jacobian = qml.jacobian(lambda w: qml.math.stack(qnode(x, w)))(weights)
        return np.asarray(qml.math.stack(qnode(x, weights))), np.asarray(jacobian)

    tiled = run()
    assert forward.call_count > 0 and step.call_count > 0
    device._backend.fusion_traits = dataclasses.replace(traits, tile_bits=0)
    calls = forward.call_count + step.call_count
    untiled = run()
    assert forward.call_count + step.call_count == calls  # tiled runs off
    np.testing.assert_allclose(tiled[0], untiled[0], atol=1e-10, rtol=0)
    np.testing.assert_allclose(tiled[1], untiled[1], atol=1e-10, rtol=0)
