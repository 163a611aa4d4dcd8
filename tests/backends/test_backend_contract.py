"""The backend contract: every backend's primitives and compositions against dense numpy
references, in the conventions of backends/base.py.

Parametrized over the CPU backend, the cuStateVec backend on its NumPy double, the real
cuStateVec backend where a GPU is usable (skipped otherwise) and a toy backend that
implements only the abstract primitives (tests/toy_backend.py), so that the base class's
default compositions are checked on their own. Backend-specific behaviour (kernels,
threads, library calls, resources) stays in test_cpu.py and
test_custatevec.py.
"""

from __future__ import annotations

import os

import numpy as np
import pennylane as qml
import pytest
from conftest import AUTO_BACKEND, MPI_RUN, stable_seed
from custatevec_double import make_libraries
from reference import (
    BACKEND_TOL,
    DIAG_CASES,
    MANY_Z_WORDS,
    PAULI_CASES,
    TARGET_CASES,
    backend_state,
    check_add_pauli_sum,
    check_adjoint_block_step,
    check_bit_permutation,
    check_concatenate,
    check_expval_pauli_words,
    check_gather,
    check_one_qubit_rotations,
    check_product_state,
    check_state_management,
    check_tiled_matrices,
    check_z_rotations,
    dense_operator,
    pauli_case_id,
    random_states,
    random_unitary,
    ref_apply,
    ref_probs,
    rotation,
    target_case_id,
    word_matrix,
)
from toy_backend import ToyBackend

from pennylane_custatevec.backends import gpu
from pennylane_custatevec.backends.base import Backend
from pennylane_custatevec.backends.cpu import CPUBackend
from pennylane_custatevec.backends.custatevec import CuStateVecBackend
from pennylane_custatevec.backends.distributed import DistributedBackend
from pennylane_custatevec.backends.messages import SWAP_ROUTE_VARIABLE

N = 6
DTYPES = pytest.mark.parametrize("dtype", [np.complex128, np.complex64], ids=["c128", "c64"])

WIDE_CASES = [
    # more targets than custatevec.SMALL_BATCHED_TARGETS: its one call per vector
    ((5, 0, 3, 1, 2), (), ()),
    ((0, 1, 2, 3, 4), (5,), (0,)),
]
WIDE_PAULI_CASES = [
    ("XYZZY", (5, 0, 3, 1, 2), (), ()),
    ("ZZIZZ", (0, 1, 2, 3, 4), (5,), (1,)),
    ("YXIXY", (4, 3, 2, 1, 0), (5,), (0,)),
]
PHASE_CASES = [("", (), (2,), (0,)), ("", (), (), ())]  # exp(-i angle/2 I): a phase


def _gpu_backend(dtype):
    reason = gpu.unavailable_reason()
    if reason is not None:
        pytest.skip(f"the cuStateVec backend cannot run here: {reason}")
    return CuStateVecBackend(dtype)


BACKENDS = {
    "cpu": CPUBackend,
    "double": lambda dtype: CuStateVecBackend(dtype, libraries=make_libraries()),
    "gpu": _gpu_backend,
    "toy": ToyBackend,
}


def _split(make_local, swaps: str = "auto"):
    """The distributed backend over this MPI job's ranks, on local backends that
    ``make_local`` makes; vectors of N qubits are split (2 local bits suffice). ``swaps``:
    the bit-swap route (``PLCSV_MPI_SWAPS`` while it is built)."""

    def make(dtype):
        from mpi4py import MPI

        before = os.environ.get(SWAP_ROUTE_VARIABLE)
        os.environ[SWAP_ROUTE_VARIABLE] = swaps
        try:
            backend = DistributedBackend(make_local(dtype), MPI.COMM_WORLD)
        finally:
            os.environ.pop(SWAP_ROUTE_VARIABLE)
            if before is not None:
                os.environ[SWAP_ROUTE_VARIABLE] = before
        backend.min_local_qubits = 2
        return backend

    return make


if MPI_RUN:  # under mpiexec (scripts/run_tests.sh): the contract of the split backend
    # over the CPU backend (host memory) and the cuStateVec double by its two routes:
    # pinned host memory (its MPI is not CUDA-aware) and device memory, which mpi4py
    # reads through __cuda_array_interface__ (the double's is host memory)
    BACKENDS = {
        "mpi-cpu": _split(CPUBackend),
        "mpi-double": _split(BACKENDS["double"]),
        "mpi-double-device": _split(BACKENDS["double"], swaps="device"),
    } | ({"mpi-gpu": _split(_gpu_backend)} if AUTO_BACKEND == "custatevec" else {})


@pytest.fixture(params=list(BACKENDS))
def make(request):
    """make(dtype) -> the backend under test (a new one per call)."""
    return lambda dtype=np.complex128: BACKENDS[request.param](dtype)


def assert_applies(backend, psi, apply, expected):
    """``apply(backend, state)`` on ``psi`` loaded into ``backend`` leaves ``expected``
    (within the tolerance of the backend's dtype)."""
    state = backend_state(backend, psi)
    apply(backend, state)
    np.testing.assert_allclose(
        backend.to_host(state), expected, atol=BACKEND_TOL[backend.dtype.type]
    )


def test_every_backend_declares_the_base_class():
    """The three backends are Backend subclasses with nothing abstract left; the toy
    defines the primitives only, so everything else it does is the base class's."""
    for backend in (CPUBackend, CuStateVecBackend, ToyBackend):
        assert issubclass(backend, Backend) and not backend.__abstractmethods__
    primitives = set(Backend.__abstractmethods__)
    assert primitives == {
        name for name, value in vars(ToyBackend).items() if callable(value) and name[0] != "_"
    } | {"name"}
    compositions = {"product_state", "adjoint_block_step", "sample", "inner_pauli", "gather"}
    assert compositions.isdisjoint(primitives)
    assert all(getattr(ToyBackend, name) is getattr(Backend, name) for name in compositions)


# --- primitives: allocation, transfer, views -----------------------------------------------


@DTYPES
def test_state_management(make, dtype):
    backend = make(dtype)
    check_state_management(backend, dtype)
    one = backend.from_host(np.eye(16)[3])  # a single vector becomes a batch of one
    assert one.shape == (1, 16) and backend.to_host(one)[0, 3] == 1
    assert backend.available_host_bytes() > 0
    assert backend.scratch_vectors(1, 4, True) >= 0 and backend.scratch_vectors(1, 0, False) >= 0


@DTYPES
def test_read_and_write_blocks(make, dtype):
    """read_block / write_block on a strided view of a batch (what a bit swap sends and
    receives): the values, in the batch's dtype, and the write lands in the batch only
    there. Split backends: on their local backend."""
    backend = make(dtype)
    local = getattr(backend, "local", backend)
    rng = np.random.default_rng(stable_seed("blocks", np.dtype(dtype).name))
    psi = random_states(5, 2, rng).astype(dtype)
    state = local.from_host(psi)
    block = state[:, 1::2]  # the amplitudes whose bit 0 is 1
    read = local.read_block(block)
    assert isinstance(read, np.ndarray) and read.dtype == dtype
    np.testing.assert_array_equal(read, psi[:, 1::2])
    values = random_states(4, 2, rng).astype(dtype)
    local.write_block(block, values)
    expected = psi.copy()
    expected[:, 1::2] = values
    np.testing.assert_array_equal(local.to_host(state), expected.astype(np.complex128))


@DTYPES
def test_concatenate(make, dtype):
    check_concatenate(make(dtype))


@pytest.mark.parametrize("sources, factors", [(1, [2.0 - 1j]), (3, [0.5, -1.0, 1j])])
def test_add_scaled_scale_and_vector_views(make, sources, factors):
    rng = np.random.default_rng(stable_seed("add_scaled", sources))
    dst, src = random_states(N, 3, rng), random_states(N, sources, rng)
    backend = make()
    state = backend.from_host(dst)
    backend.add_scaled(state, backend.from_host(src), np.array(factors))
    expected = dst + np.asarray(factors)[:, None] * src
    np.testing.assert_allclose(backend.to_host(state), expected, atol=1e-12)
    view = backend.vectors(state, 1, 3)
    backend.scale(view, np.array([0.0, 2j]))
    assert np.all(backend.to_host(state)[1] == 0)  # the view writes through
    np.testing.assert_allclose(backend.to_host(state)[2], 2j * expected[2], atol=1e-12)
    np.testing.assert_allclose(backend.to_host(state)[0], expected[0], atol=1e-12)
    # gates and measurements on a view act on its vectors only
    before = backend.to_host(state)
    backend.apply_pauli(view, "X", (0,))
    flipped = ref_apply(before[1:], word_matrix("X")[None], (0,))
    np.testing.assert_allclose(backend.to_host(state)[1:], flipped, atol=1e-12)
    np.testing.assert_allclose(backend.to_host(state)[0], before[0], atol=1e-12)
    np.testing.assert_allclose(backend.probabilities(view, (0,)), ref_probs(flipped, (0,)))


# --- primitives: gates ---------------------------------------------------------------------


def gate_data_params(cases: list, ids: list):
    """The parametrization of a gate test whose data (matrices, diagonals, angles) is one
    for the whole batch ("shared") or one per vector: dtype x shared or per-vector x batch
    of 1 or 3 x ``cases`` (named by ``ids``)."""
    marks = [
        DTYPES,
        pytest.mark.parametrize("shared", [True, False], ids=["shared", "per-vector"]),
        pytest.mark.parametrize("batch", [1, 3]),
        pytest.mark.parametrize("case", cases, ids=ids),
    ]

    def parametrized(test):
        for mark in reversed(marks):  # as decorators stacked in this order apply
            test = mark(test)
        return test

    return parametrized


@gate_data_params(TARGET_CASES + WIDE_CASES, [target_case_id(c) for c in TARGET_CASES + WIDE_CASES])
def test_apply_matrix(make, case, batch, shared, dtype):
    targets, controls, values = case
    rng = np.random.default_rng(stable_seed("apply_matrix", case, batch, shared))
    mats = np.stack([random_unitary(1 << len(targets), rng) for _ in range(1 if shared else batch)])
    psi = random_states(N, batch, rng)
    expected = ref_apply(psi, mats, targets, controls, values)
    assert_applies(make(dtype), psi, lambda b, s: b.apply_matrix(s, mats, *case), expected)


def test_apply_matrix_non_unitary(make):
    """Any matrix applies (e.g. projectors used for measurements)."""
    rng = np.random.default_rng(3)
    mats = rng.normal(size=(3, 4, 4)) + 1j * rng.normal(size=(3, 4, 4))
    psi = random_states(5, 3, rng)
    backend = make()
    state = backend.from_host(psi)
    backend.apply_matrix(state, mats, (4, 1), (2,), (0,))
    expected = ref_apply(psi, mats, (4, 1), (2,), (0,))
    np.testing.assert_allclose(backend.to_host(state), expected, atol=1e-12)


@gate_data_params(DIAG_CASES + WIDE_CASES, [target_case_id(c) for c in DIAG_CASES + WIDE_CASES])
def test_apply_diagonal(make, case, batch, shared, dtype):
    targets, controls, values = case
    rng = np.random.default_rng(stable_seed("diag", case, batch, shared))
    size = (1 if shared else batch, 1 << len(targets))
    diags = np.exp(1j * rng.uniform(0, 2 * np.pi, size=size)) * rng.uniform(0.5, 1.5, size=size)
    psi = random_states(N, batch, rng)
    expected = ref_apply(psi, np.stack([np.diag(d) for d in diags]), targets, controls, values)
    assert_applies(make(dtype), psi, lambda b, s: b.apply_diagonal(s, diags, *case), expected)


@DTYPES
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(
    "case",
    PAULI_CASES + WIDE_PAULI_CASES,
    ids=[pauli_case_id(c) for c in PAULI_CASES + WIDE_PAULI_CASES],
)
def test_apply_pauli(make, case, batch, dtype):
    word, targets, controls, values = case
    rng = np.random.default_rng(stable_seed("pauli", case, batch))
    psi = random_states(N, batch, rng)
    expected = ref_apply(psi, word_matrix(word)[None], targets, controls, values)
    assert_applies(make(dtype), psi, lambda b, s: b.apply_pauli(s, *case), expected)


ROTATION_CASES = PAULI_CASES + WIDE_PAULI_CASES + PHASE_CASES


@gate_data_params(
    ROTATION_CASES,
    [pauli_case_id(c) for c in PAULI_CASES + WIDE_PAULI_CASES] + ["phase-controlled", "phase"],
)
def test_apply_pauli_rotation(make, case, batch, shared, dtype):
    word, targets, controls, values = case
    rng = np.random.default_rng(stable_seed("rotation", case, batch, shared))
    angles = rng.uniform(-2 * np.pi, 2 * np.pi, size=1 if shared else batch)
    psi = random_states(N, batch, rng)
    expected = ref_apply(
        psi, np.stack([rotation(word, a) for a in angles]), targets, controls, values
    )
    assert_applies(
        make(dtype), psi, lambda b, s: b.apply_pauli_rotation(s, angles, *case), expected
    )


# --- primitives: inner product, probabilities ----------------------------------------------


@DTYPES
@pytest.mark.parametrize("kets", [1, 3], ids=["one-ket", "ket-per-bra"])
def test_braket(make, kets, dtype):
    """<bra_b|ket_b> for three bras, against one ket or one ket per bra."""
    rng = np.random.default_rng(stable_seed("braket", kets))
    bras, ket_vectors = random_states(N, 3, rng), random_states(N, kets, rng)
    backend = make(dtype)
    on_bras = backend_state(backend, bras)
    out = backend.braket(on_bras, backend_state(backend, ket_vectors))
    assert out.dtype == np.complex128 and out.shape == (3,)
    expected = np.einsum("bi,bi->b", bras.conj(), np.broadcast_to(ket_vectors, bras.shape))
    np.testing.assert_allclose(out, expected, atol=BACKEND_TOL[dtype] * 10)
    np.testing.assert_allclose(backend.to_host(on_bras), bras, atol=BACKEND_TOL[dtype])  # bras kept


@DTYPES
def test_gram(make, dtype):
    """G[r, c] = <bras_r|kets_c> of two views of one batch (rows overlapping) and of two
    batches, a backend array until ``gather``; neither operand changes."""
    rng = np.random.default_rng(stable_seed("gram"))
    vectors, others = random_states(N, 5, rng), random_states(N, 2, rng)
    backend = make(dtype)
    batch, other = backend_state(backend, vectors), backend_state(backend, others)
    bras, kets = backend.vectors(batch, 0, 3), backend.vectors(batch, 1, 5)
    same, across = backend.gather([backend.gram(bras, kets), backend.gram(batch, other)])
    assert same.dtype == np.complex128 and same.shape == (3, 4) and across.shape == (5, 2)
    np.testing.assert_allclose(same, vectors[:3].conj() @ vectors[1:5].T, atol=BACKEND_TOL[dtype])
    np.testing.assert_allclose(across, vectors.conj() @ others.T, atol=BACKEND_TOL[dtype])
    np.testing.assert_allclose(backend.to_host(batch), vectors, atol=BACKEND_TOL[dtype])
    assert backend.gram_scratch_vectors(3, 4) >= 0


@DTYPES
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(
    "bits", [(), (0,), (5,), (3, 0, 5), (1, 0), (0, 1), (5, 4, 3, 2, 1, 0), (2, 4, 1, 3)], ids=str
)
def test_probabilities(make, bits, batch, dtype):
    rng = np.random.default_rng(stable_seed("probs", bits, batch))
    psi = random_states(N, batch, rng)
    backend = make(dtype)
    out = backend.probabilities(backend_state(backend, psi), bits)
    assert out.dtype == np.float64 and out.shape == (batch, 1 << len(bits))
    np.testing.assert_allclose(out, ref_probs(psi, bits), atol=BACKEND_TOL[dtype] * 10)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=BACKEND_TOL[dtype] * 10)


# --- compositions: preparation, runs of rotations -------------------------------------------


@DTYPES
@pytest.mark.parametrize(
    "check",
    [
        check_product_state,
        check_z_rotations,
        check_one_qubit_rotations,
        check_bit_permutation,
        check_tiled_matrices,
    ],
    ids=lambda check: check.__name__.removeprefix("check_"),
)
def test_preparation_and_rotation_runs(make, dtype, check):
    """product_state, apply_z_rotations / apply_one_qubit_rotations and their sweep steps,
    apply_bit_permutation (the CPU kernel; the base class's gather on the double),
    apply_tiled_matrices and its sweep step (tiled on the CPU, the base class's gate by gate
    elsewhere)."""
    check(make(dtype))


# --- compositions: expectation values, inner products, Pauli sums ---------------------------


@DTYPES
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(
    "word, targets",
    [("Z", (0,)), ("X", (5,)), ("Y", (2,)), ("I", (1,)), ("", ()), ("XY", (3, 0)),
     ("ZZ", (5, 1)), ("YXZ", (1, 4, 2)), ("XIYZ", (0, 1, 2, 3)), ("YYYYYY", (5, 4, 3, 2, 1, 0))],
)  # fmt: skip
def test_expval_pauli(make, word, targets, batch, dtype):
    rng = np.random.default_rng(stable_seed("expval_pauli", word, targets, batch))
    psi = random_states(N, batch, rng)
    backend = make(dtype)
    state = backend_state(backend, psi)
    out = backend.expval_pauli(state, word, targets)
    assert out.dtype == np.float64 and out.shape == (batch,)
    op = dense_operator(N, word_matrix(word), targets)
    expected = np.real(np.einsum("bi,ij,bj->b", psi.conj(), op, psi))
    np.testing.assert_allclose(out, expected, atol=BACKEND_TOL[dtype] * 10)
    np.testing.assert_allclose(backend.to_host(state), psi, atol=BACKEND_TOL[dtype])  # unchanged


@DTYPES
@pytest.mark.parametrize(
    "words",
    [
        MANY_Z_WORDS,
        [("Z", (b,)) for b in range(N)],
        [("X", (0,)), ("ZY", (1, 4)), ("Z", (3,)), ("YY", (2, 5)), ("", ())],
        [],
    ],
    ids=["many-z-words", "every-z", "mixed", "none"],
)
def test_expval_pauli_words(make, words, dtype):
    check_expval_pauli_words(make(dtype), words, dtype)


@DTYPES
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("targets", [(0,), (5,), (3, 1), (0, 5), (4, 0, 2), (1, 2, 3, 0)], ids=str)
def test_expval_matrix(make, targets, batch, dtype):
    rng = np.random.default_rng(stable_seed("expval_matrix", targets, batch))
    d = 1 << len(targets)
    m = rng.normal(size=(d, d)) + 1j * rng.normal(size=(d, d))  # not Hermitian: complex result
    psi = random_states(N, batch, rng)
    backend = make(dtype)
    out = backend.expval_matrix(backend_state(backend, psi), m, targets)
    assert out.dtype == np.complex128 and out.shape == (batch,)
    expected = np.einsum("bi,ij,bj->b", psi.conj(), dense_operator(N, m, targets), psi)
    np.testing.assert_allclose(out, expected, atol=BACKEND_TOL[dtype] * 10)


@DTYPES
@pytest.mark.parametrize("kets", [1, 3], ids=["one-ket", "ket-per-bra"])
@pytest.mark.parametrize(
    "word, targets",
    [("X", (5,)), ("Z", (0,)), ("", ()), ("XY", (3, 0)), ("YXZ", (1, 4, 2)), ("ZZ", (0, 5)),
     ("ZIZ", (1, 4, 2)), ("ZZZZZ", (5, 0, 3, 1, 2))],
)  # fmt: skip
def test_inner_pauli(make, word, targets, kets, dtype):
    """<bra_b|P|ket_b> for three bras, against one ket or one ket per bra; kets kept."""
    rng = np.random.default_rng(stable_seed("inner_pauli", word, targets, kets))
    bras, ket_vectors = random_states(N, 3, rng), random_states(N, kets, rng)
    backend = make(dtype)
    ket = backend_state(backend, ket_vectors)
    out = backend.inner_pauli(backend_state(backend, bras), ket, word, targets)
    assert out.dtype == np.complex128 and out.shape == (3,)
    applied = ket_vectors @ dense_operator(N, word_matrix(word), targets).T
    expected = np.einsum("bi,bi->b", bras.conj(), np.broadcast_to(applied, bras.shape))
    np.testing.assert_allclose(out, expected, atol=BACKEND_TOL[dtype] * 10)
    np.testing.assert_allclose(backend.to_host(ket), ket_vectors, atol=BACKEND_TOL[dtype])


@DTYPES
@pytest.mark.parametrize("kets", [1, 3], ids=["one-ket", "ket-per-bra"])
@pytest.mark.parametrize("targets", [(0,), (5,), (3, 1), (4, 0, 2)], ids=str)
def test_inner_matrix(make, targets, kets, dtype):
    rng = np.random.default_rng(stable_seed("inner_matrix", targets, kets))
    d = 1 << len(targets)
    m = rng.normal(size=(d, d)) + 1j * rng.normal(size=(d, d))
    bras, ket_vectors = random_states(N, 3, rng), random_states(N, kets, rng)
    backend = make(dtype)
    ket = backend_state(backend, ket_vectors)
    out = backend.inner_matrix(backend_state(backend, bras), ket, m, targets)
    assert out.dtype == np.complex128 and out.shape == (3,)
    applied = ket_vectors @ dense_operator(N, m, targets).T
    expected = np.einsum("bi,bi->b", bras.conj(), np.broadcast_to(applied, bras.shape))
    np.testing.assert_allclose(out, expected, atol=BACKEND_TOL[dtype] * 10)
    np.testing.assert_allclose(backend.to_host(ket), ket_vectors, atol=BACKEND_TOL[dtype])


@pytest.mark.parametrize(
    "words",
    [
        [("Z", (0,)), ("ZZ", (1, 4)), ("ZIZ", (5, 2, 3))],
        [("Z", (2,)), ("", ())],
        [("X", (0,)), ("ZY", (1, 4)), ("Z", (3,))],
        [("X", (0,)), ("ZY", (1, 4)), ("XYZXY", (0, 1, 2, 3, 5))],
        MANY_Z_WORDS,
    ],
    ids=["z-words", "z-and-identity", "mixed", "wide-mixed", "many-z-words"],
)
def test_add_pauli_sum(make, words):
    check_add_pauli_sum(make(), words)


# --- compositions: sampling ----------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("bits", [(0,), (4, 1), (2, 5, 0), tuple(range(N))], ids=str)
def test_sample_frequencies_and_seed(make, bits, batch):
    rng = np.random.default_rng(stable_seed("sample", bits, batch))
    psi = random_states(N, batch, rng)
    backend = make()
    state = backend_state(backend, psi)
    shots = 40000
    samples = backend.sample(state, bits, shots, np.random.default_rng(7))
    assert samples.shape == (batch, shots) and samples.dtype == np.int64
    assert samples.min() >= 0 and samples.max() < 1 << len(bits)
    probs = ref_probs(psi, bits)
    for b in range(batch):
        freq = np.bincount(samples[b], minlength=1 << len(bits)) / shots
        np.testing.assert_allclose(freq, probs[b], atol=0.015)
    again = backend.sample(state, bits, shots, np.random.default_rng(7))
    np.testing.assert_array_equal(samples, again)
    assert not np.array_equal(samples, backend.sample(state, bits, shots, np.random.default_rng(8)))


def test_sample_bit_order_unnormalised_and_edge_cases(make):
    backend = make()
    psi = np.zeros((2, 8), dtype=complex)
    psi[0, 5] = 2.0  # bits 0 and 2 set; norm 4: the sampler scales by the squared norm
    psi[1, 2] = 1j
    state = backend.from_host(psi)
    samples = backend.sample(state, (2, 1, 0), 100, np.random.default_rng(0))
    np.testing.assert_array_equal(samples[0], 0b101)  # outcome bit j is state bit bits[j]
    np.testing.assert_array_equal(samples[1], 0b010)
    assert backend.sample(state, (), 4, np.random.default_rng(0)).tolist() == [[0] * 4] * 2
    assert backend.sample(state, (0,), 0, np.random.default_rng(0)).shape == (2, 0)


# --- compositions: the adjoint sweeps' steps, gather ----------------------------------------


@DTYPES
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize(
    "word, targets",
    [("X", (0,)), ("Y", (4,)), ("Z", (5,)), ("I", (2,)), ("ZZ", (0, 1)), ("ZIZ", (4, 3, 5)),
     ("ZZZ", (1, 4, 0)), ("XY", (2, 0)), ("ZZZZZ", (0, 1, 2, 3, 4))],
)  # fmt: skip
def test_adjoint_pauli_rotation_step(make, word, targets, rows, dtype):
    """<bra_r|P|phi>, then exp(+i angle/2 P) on phi and on every bra."""
    rng = np.random.default_rng(stable_seed("rotation_step", word, targets, rows))
    phi, bras = random_states(N, 1, rng), random_states(N, rows, rng)
    angle = np.array([rng.uniform(-3, 3)])
    backend = make(dtype)
    on_phi, on_bras = backend_state(backend, phi), backend_state(backend, bras)
    products = backend.adjoint_pauli_rotation_step(on_phi, on_bras, angle, word, targets)
    pauli = dense_operator(N, word_matrix(word), targets)
    np.testing.assert_allclose(
        products, np.einsum("ri,ij,j->r", bras.conj(), pauli, phi[0]), atol=BACKEND_TOL[dtype] * 10
    )
    undo = dense_operator(N, rotation(word, -angle[0]), targets)
    np.testing.assert_allclose(backend.to_host(on_phi), phi @ undo.T, atol=BACKEND_TOL[dtype])
    np.testing.assert_allclose(backend.to_host(on_bras), bras @ undo.T, atol=BACKEND_TOL[dtype])


@DTYPES
@pytest.mark.parametrize(
    "check", [check_adjoint_block_step, check_gather], ids=["block_step", "gather"]
)
def test_deferred_steps(make, dtype, check):
    """adjoint_block_step for blocks of 0 to 3 bits, B 1 and 3, R 1 and 4, shared and
    per-vector matrices; gather of states and reductions in one call."""
    check(make(dtype))


def test_gather_mixes_backend_and_host_reductions(make):
    """A sweep may gather the reductions of the backend's own steps with those of the base
    class's default steps (host arrays): each comes back unchanged, in order."""
    rng = np.random.default_rng(stable_seed("gather-mixed"))
    backend = make()
    phi, bras = (
        backend.from_host(random_states(4, 1, rng)),
        backend.from_host(random_states(4, 2, rng)),
    )
    own = backend.adjoint_block_step(phi, bras, random_unitary(2, rng)[None], (1,))
    default = Backend.adjoint_block_step(backend, phi, bras, random_unitary(2, rng)[None], (3,))
    assert type(default) is np.ndarray
    (own_alone,) = backend.gather([own])
    gathered = backend.gather([default, own, default])
    np.testing.assert_array_equal(gathered[0], default)
    np.testing.assert_array_equal(gathered[1], own_alone)
    np.testing.assert_array_equal(gathered[2], default)


# --- the toy backend through the device -----------------------------------------------------


@pytest.mark.parametrize("grad_accumulation", ["deferred", "eager"])
@pytest.mark.parametrize("fusion_qubits", [None, 3])
def test_toy_backend_runs_a_qnode_end_to_end(monkeypatch, grad_accumulation, fusion_qubits):
    """A backend of the primitives alone serves the device (given to it by replacing
    device.select_backend, no hook needed): a QNode's probabilities, expectation values
    and adjoint Jacobian (deferred and eager; unfused by its default traits,
    and fused into blocks of 3 qubits) equal default.qubit's."""
    import pennylane_custatevec.device as device

    monkeypatch.setattr(device, "select_backend", lambda name, dtype, *where: ToyBackend(dtype))
    dev = qml.device(
        "custatevec.qubit",
        wires=4,
        grad_accumulation=grad_accumulation,
        fusion_qubits=fusion_qubits,
    )
    assert dev.backend_name == "toy"

    def gates(weights, x):
        qml.AngleEmbedding(x, wires=range(4))
        qml.StronglyEntanglingLayers(weights, wires=range(4))
        qml.IsingZZ(x[0], wires=[0, 2])
        qml.CRX(x[1], wires=[1, 3])

    def circuit(weights, x):
        gates(weights, x)
        return qml.expval(qml.Z(0) @ qml.X(2)), qml.expval(qml.Y(1))

    def probabilities(weights, x):
        gates(weights, x)
        return qml.probs(wires=[3, 0])

    rng = np.random.default_rng(stable_seed("toy-qnode", grad_accumulation, fusion_qubits))
    weights = qml.numpy.array(rng.uniform(-np.pi, np.pi, size=(2, 4, 3)), requires_grad=True)
    x = qml.numpy.array(rng.uniform(-np.pi, np.pi, size=4), requires_grad=False)
    reference = qml.device("default.qubit", wires=4)
    got = qml.QNode(probabilities, dev)(weights, x)
    np.testing.assert_allclose(got, qml.QNode(probabilities, reference)(weights, x), atol=1e-10)
    toy = qml.QNode(circuit, dev, diff_method="adjoint")
    ref = qml.QNode(circuit, reference, diff_method="backprop")
    np.testing.assert_allclose(toy(weights, x), ref(weights, x), atol=1e-10)

    def expectations(qnode):
        return lambda w: qml.math.stack(qnode(w, x))

    jacobian = qml.jacobian(expectations(toy))(weights)
    np.testing.assert_allclose(jacobian, qml.jacobian(expectations(ref))(weights), atol=1e-10)
