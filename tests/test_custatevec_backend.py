"""The cuStateVec backend against the dense references of test_cpu_backend.py.

Runs on the NumPy double of cupy and cuStateVec (custatevec_double.py) everywhere, and
also on the real libraries when a GPU is usable. The protocol expectations are those the
CPU backend meets; tests marked ``double_only`` check the backend's use of resources
through the double's records.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from conftest import AUTO_BACKEND, random_unitary, stable_seed
from custatevec_double import make_libraries
from test_cpu_backend import (
    DIAG_CASES,
    MANY_Z_WORDS,
    PAULI_CASES,
    TARGET_CASES,
    TOL,
    _ids,
    _pids,
    check_add_pauli_sum,
    check_adjoint_block_step,
    check_concatenate,
    check_expval_pauli_words,
    check_gather,
    check_product_state,
    check_rotations,
    check_state_management,
    check_z_rotations,
    dense_operator,
    random_states,
    ref_apply,
    ref_probs,
    rotation,
    word_matrix,
)

from pennylane_custatevec.backends import custatevec
from pennylane_custatevec.backends.cpu import CPUBackend
from pennylane_custatevec.backends.custatevec import CuStateVecBackend

N = 6
DTYPES = pytest.mark.parametrize("dtype", [np.complex128, np.complex64], ids=["c128", "c64"])
IMPLEMENTATIONS = ["double"] + (["gpu"] if AUTO_BACKEND == "custatevec" else [])


@pytest.fixture(params=IMPLEMENTATIONS)
def libraries(request):
    """The double, and the real cupy and cuStateVec where a GPU is usable."""
    if request.param == "gpu":
        return custatevec.import_libraries()
    return make_libraries()


@pytest.fixture
def double():
    return make_libraries()


@pytest.fixture
def make(libraries):
    """make(dtype) -> a CuStateVecBackend on the implementation under test."""
    return lambda dtype=np.complex128, **options: CuStateVecBackend(
        dtype, libraries=libraries, **options
    )


def load(backend, psi):
    state = backend.from_host(psi)
    assert state.dtype == backend.dtype and state.flags.c_contiguous
    return state


# --- gates ---------------------------------------------------------------------------------

BIG_CASES = [
    # more targets than SMALL_BATCHED_TARGETS: one specialised call per vector
    ((5, 0, 3, 1, 2), (), ()),
    ((0, 1, 2, 3, 4), (5,), (0,)),
]
BIG_PAULI_CASES = [
    ("XYZZY", (5, 0, 3, 1, 2), (), ()),
    ("ZZIZZ", (0, 1, 2, 3, 4), (5,), (1,)),
    ("YXIXY", (4, 3, 2, 1, 0), (5,), (0,)),
]


@DTYPES
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per-vector"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("case", TARGET_CASES, ids=[_ids(c) for c in TARGET_CASES])
def test_apply_matrix(make, case, batch, shared, dtype):
    targets, controls, values = case
    rng = np.random.default_rng(stable_seed("apply_matrix", case, batch, shared))
    mats = np.stack([random_unitary(1 << len(targets), rng) for _ in range(1 if shared else batch)])
    psi = random_states(N, batch, rng)
    backend = make(dtype)
    state = load(backend, psi)
    backend.apply_matrix(state, mats, targets, controls, values)
    expected = ref_apply(psi, mats, targets, controls, values)
    np.testing.assert_allclose(backend.to_host(state), expected, atol=TOL[dtype])


def test_apply_matrix_non_unitary(make):
    rng = np.random.default_rng(3)
    mats = rng.normal(size=(3, 4, 4)) + 1j * rng.normal(size=(3, 4, 4))
    psi = random_states(5, 3, rng)
    backend = make()
    state = backend.from_host(psi)
    backend.apply_matrix(state, mats, (4, 1), (2,), (0,))
    expected = ref_apply(psi, mats, (4, 1), (2,), (0,))
    np.testing.assert_allclose(backend.to_host(state), expected, atol=1e-12)


@DTYPES
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per-vector"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(
    "case", DIAG_CASES + BIG_CASES, ids=[_ids(c) for c in DIAG_CASES + BIG_CASES]
)
def test_apply_diagonal(make, case, batch, shared, dtype):
    targets, controls, values = case
    rng = np.random.default_rng(stable_seed("diag", case, batch, shared))
    size = (1 if shared else batch, 1 << len(targets))
    diags = np.exp(1j * rng.uniform(0, 2 * np.pi, size=size)) * rng.uniform(0.5, 1.5, size=size)
    psi = random_states(N, batch, rng)
    backend = make(dtype)
    state = load(backend, psi)
    backend.apply_diagonal(state, diags, targets, controls, values)
    expected = ref_apply(psi, np.stack([np.diag(d) for d in diags]), targets, controls, values)
    np.testing.assert_allclose(backend.to_host(state), expected, atol=TOL[dtype])


@DTYPES
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(
    "case", PAULI_CASES + BIG_PAULI_CASES, ids=[_pids(c) for c in PAULI_CASES + BIG_PAULI_CASES]
)
def test_apply_pauli(make, case, batch, dtype):
    word, targets, controls, values = case
    rng = np.random.default_rng(stable_seed("pauli", case, batch))
    psi = random_states(N, batch, rng)
    backend = make(dtype)
    state = load(backend, psi)
    backend.apply_pauli(state, word, targets, controls, values)
    expected = ref_apply(psi, word_matrix(word)[None], targets, controls, values)
    np.testing.assert_allclose(backend.to_host(state), expected, atol=TOL[dtype])


@DTYPES
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per-vector"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(
    "case",
    PAULI_CASES + BIG_PAULI_CASES + [("", (), (2,), (0,)), ("", (), (), ())],
    ids=[_pids(c) for c in PAULI_CASES + BIG_PAULI_CASES] + ["phase-controlled", "phase"],
)
def test_apply_pauli_rotation(make, case, batch, shared, dtype):
    word, targets, controls, values = case
    rng = np.random.default_rng(stable_seed("rotation", case, batch, shared))
    angles = rng.uniform(-2 * np.pi, 2 * np.pi, size=1 if shared else batch)
    psi = random_states(N, batch, rng)
    backend = make(dtype)
    state = load(backend, psi)
    backend.apply_pauli_rotation(state, angles, word, targets, controls, values)
    expected = ref_apply(
        psi, np.stack([rotation(word, a) for a in angles]), targets, controls, values
    )
    np.testing.assert_allclose(backend.to_host(state), expected, atol=TOL[dtype])


def test_random_gate_sequence_matches_the_cpu_backend(make):
    """Forty gates of every kind on a batch: the two backends agree to round-off."""
    rng = np.random.default_rng(5)
    psi = random_states(N, 3, rng)
    cpu, gpu = CPUBackend(), make()
    on_cpu, on_gpu = cpu.from_host(psi), gpu.from_host(psi)
    for step in range(40):
        bits = [int(b) for b in rng.permutation(N)]
        k = 1 + step % 5
        targets, controls = bits[:k], bits[k : k + step % 2]
        values = [int(v) for v in rng.integers(0, 2, size=len(controls))]
        word = "".join(rng.choice(list("IXYZ"), size=k))
        calls = [
            ("apply_matrix", np.stack([random_unitary(1 << k, rng) for _ in range(3)])),
            ("apply_diagonal", np.exp(1j * rng.uniform(0, 6, size=(1, 1 << k)))),
            ("apply_pauli_rotation", rng.uniform(-3, 3, size=3), word),
            ("apply_pauli", word),
        ][step % 4]
        for backend, state in ((cpu, on_cpu), (gpu, on_gpu)):
            getattr(backend, calls[0])(state, *calls[1:], targets, controls, values)
    np.testing.assert_allclose(gpu.to_host(on_gpu), on_cpu, atol=1e-12)


# --- expectations, inner products, probabilities -------------------------------------------


@DTYPES
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(
    "word, targets",
    [("Z", (0,)), ("X", (5,)), ("I", (1,)), ("", ()), ("XY", (3, 0)), ("YXZ", (1, 4, 2)),
     ("XIYZ", (0, 1, 2, 3)), ("YYYYYY", (5, 4, 3, 2, 1, 0))],
)  # fmt: skip
def test_expval_pauli(make, word, targets, batch, dtype):
    rng = np.random.default_rng(stable_seed("expval_pauli", word, targets, batch))
    psi = random_states(N, batch, rng)
    backend = make(dtype)
    state = load(backend, psi)
    out = backend.expval_pauli(state, word, targets)
    assert out.dtype == np.float64 and out.shape == (batch,)
    op = dense_operator(N, word_matrix(word), targets)
    expected = np.real(np.einsum("bi,ij,bj->b", psi.conj(), op, psi))
    np.testing.assert_allclose(out, expected, atol=TOL[dtype] * 10)
    np.testing.assert_allclose(backend.to_host(state), psi, atol=TOL[dtype])


@DTYPES
@pytest.mark.parametrize(
    "words",
    [MANY_Z_WORDS, [("X", (0,)), ("ZY", (1, 4)), ("I", (3,)), ("YY", (2, 5))], []],
    ids=["many-z-words", "mixed", "none"],
)
def test_expval_pauli_words(make, words, dtype):
    """Every word of every vector from one library call per vector."""
    check_expval_pauli_words(make(dtype), words, dtype)


@DTYPES
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("targets", [(0,), (5,), (3, 1), (0, 5), (4, 0, 2)], ids=str)
def test_expval_matrix(make, targets, batch, dtype):
    rng = np.random.default_rng(stable_seed("expval_matrix", targets, batch))
    d = 1 << len(targets)
    m = rng.normal(size=(d, d)) + 1j * rng.normal(size=(d, d))  # not Hermitian: complex result
    psi = random_states(N, batch, rng)
    backend = make(dtype)
    out = backend.expval_matrix(load(backend, psi), m, targets)
    assert out.dtype == np.complex128 and out.shape == (batch,)
    expected = np.einsum("bi,ij,bj->b", psi.conj(), dense_operator(N, m, targets), psi)
    np.testing.assert_allclose(out, expected, atol=TOL[dtype] * 10)


@DTYPES
@pytest.mark.parametrize("kets", [1, 3], ids=["one-ket", "ket-per-bra"])
@pytest.mark.parametrize(
    "word, targets", [("X", (5,)), ("", ()), ("YXZ", (1, 4, 2)), ("ZIZ", (1, 4, 2))]
)
def test_inner_pauli(make, word, targets, kets, dtype):
    rng = np.random.default_rng(stable_seed("inner_pauli", word, targets, kets))
    bras, ket_vectors = random_states(N, 3, rng), random_states(N, kets, rng)
    backend = make(dtype)
    ket = load(backend, ket_vectors)
    out = backend.inner_pauli(load(backend, bras), ket, word, targets)
    assert out.dtype == np.complex128 and out.shape == (3,)
    applied = ket_vectors @ dense_operator(N, word_matrix(word), targets).T
    expected = np.einsum("bi,bi->b", bras.conj(), np.broadcast_to(applied, bras.shape))
    np.testing.assert_allclose(out, expected, atol=TOL[dtype] * 10)
    np.testing.assert_allclose(backend.to_host(ket), ket_vectors, atol=TOL[dtype])


@DTYPES
@pytest.mark.parametrize("kets", [1, 3], ids=["one-ket", "ket-per-bra"])
@pytest.mark.parametrize("targets", [(0,), (3, 1), (4, 0, 2)], ids=str)
def test_inner_matrix(make, targets, kets, dtype):
    rng = np.random.default_rng(stable_seed("inner_matrix", targets, kets))
    d = 1 << len(targets)
    m = rng.normal(size=(d, d)) + 1j * rng.normal(size=(d, d))
    bras, ket_vectors = random_states(N, 3, rng), random_states(N, kets, rng)
    backend = make(dtype)
    out = backend.inner_matrix(load(backend, bras), load(backend, ket_vectors), m, targets)
    applied = ket_vectors @ dense_operator(N, m, targets).T
    expected = np.einsum("bi,bi->b", bras.conj(), np.broadcast_to(applied, bras.shape))
    np.testing.assert_allclose(out, expected, atol=TOL[dtype] * 10)


@DTYPES
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize(
    "word, targets", [("X", (0,)), ("ZZ", (3, 5)), ("ZIZ", (4, 3, 5)), ("XY", (2, 0))]
)
def test_adjoint_rotation_step(make, word, targets, rows, dtype):
    """<bra_r|P|phi>, then exp(+i angle/2 P) on phi and on every bra."""
    rng = np.random.default_rng(stable_seed("rotation_step", word, targets, rows))
    phi, bras = random_states(N, 1, rng), random_states(N, rows, rng)
    angle = np.array([rng.uniform(-3, 3)])
    backend = make(dtype)
    on_phi, on_bras = load(backend, phi), load(backend, bras)
    products = backend.adjoint_rotation_step(on_phi, on_bras, angle, word, targets)
    pauli = dense_operator(N, word_matrix(word), targets)
    np.testing.assert_allclose(
        products, np.einsum("ri,ij,j->r", bras.conj(), pauli, phi[0]), atol=TOL[dtype] * 10
    )
    undo = dense_operator(N, rotation(word, -angle[0]), targets)
    np.testing.assert_allclose(backend.to_host(on_phi), phi @ undo.T, atol=TOL[dtype])
    np.testing.assert_allclose(backend.to_host(on_bras), bras @ undo.T, atol=TOL[dtype])


@pytest.mark.parametrize(
    "words",
    [
        [("Z", (0,)), ("ZZ", (1, 4)), ("", ())],
        [("X", (0,)), ("ZY", (1, 4)), ("XYZXY", (0, 1, 2, 3, 5))],
    ],
    ids=["z-and-identity", "mixed"],
)  # fmt: skip
def test_add_pauli_sum(make, words):
    check_add_pauli_sum(make(), words)


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


@DTYPES
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("bits", [(), (0,), (5,), (3, 0, 5), (1, 0), (0, 1), (2, 4, 1, 3)], ids=str)
def test_probabilities(make, bits, batch, dtype):
    rng = np.random.default_rng(stable_seed("probs", bits, batch))
    psi = random_states(N, batch, rng)
    backend = make(dtype)
    out = backend.probabilities(load(backend, psi), bits)
    assert out.dtype == np.float64 and out.shape == (batch, 1 << len(bits))
    np.testing.assert_allclose(out, ref_probs(psi, bits), atol=TOL[dtype] * 10)


# --- sampling ------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("bits", [(0,), (4, 1), (2, 5, 0), tuple(range(N))], ids=str)
def test_sample_frequencies_and_seed(make, bits, batch):
    rng = np.random.default_rng(stable_seed("sample", bits, batch))
    psi = random_states(N, batch, rng)
    backend = make()
    state = load(backend, psi)
    shots = 40000
    samples = backend.sample(state, bits, shots, np.random.default_rng(7))
    assert samples.shape == (batch, shots) and samples.dtype == np.int64
    probs = ref_probs(psi, bits)
    for b in range(batch):
        freq = np.bincount(samples[b], minlength=1 << len(bits)) / shots
        np.testing.assert_allclose(freq, probs[b], atol=0.015)
    np.testing.assert_array_equal(
        samples, backend.sample(state, bits, shots, np.random.default_rng(7))
    )
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


# --- deferred adjoint: block step, gather, concatenate; product states ------------------


@DTYPES
@pytest.mark.parametrize(
    "check",
    [
        check_adjoint_block_step,
        check_z_rotations,
        check_rotations,
        check_gather,
        check_concatenate,
        check_product_state,
    ],
    ids=lambda check: check.__name__.removeprefix("check_"),
)
def test_deferred_sweep_methods(make, dtype, check):
    check(make(dtype))


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per-vector"])
def test_block_steps_stay_on_the_device_until_one_gather(double, shared):
    """adjoint_block_step leaves T in device memory without synchronising; gather brings
    several back with one transfer. The adjoints run as the library's adjoint flag on M."""
    cp, cusv = double.cupy, double.custatevec
    backend = CuStateVecBackend(np.complex128, libraries=double)
    rng = np.random.default_rng(stable_seed("block_sync", shared))
    phi = backend.from_host(random_states(N, 3, rng))
    bras = backend.from_host(random_states(N, 6, rng))
    before = cp.synchronizations
    outputs = []
    for targets in [(2, 0), (5,), (), (1, 4, 3)]:
        d = 1 << len(targets)
        matrices = np.stack([random_unitary(d, rng) for _ in range(1 if shared else 3)])
        outputs.append(backend.adjoint_block_step(phi, bras, matrices, targets))
    assert cp.synchronizations == before
    assert all(type(out) is type(phi) for out in outputs)  # device arrays
    assert "apply_matrix_batched" in cusv.calls
    gathered = backend.gather(outputs)
    assert cp.synchronizations == before + 1
    assert [g.shape for g in gathered] == [(3, 2, 4, 4), (3, 2, 2, 2), (3, 2, 1, 1), (3, 2, 8, 8)]
    assert all(type(g) is np.ndarray and g.dtype == np.complex128 for g in gathered)
    assert backend.gather([]) == [] and cp.synchronizations == before + 1


# --- state management ----------------------------------------------------------------------


@DTYPES
def test_state_management(make, dtype):
    backend = make(dtype)
    check_state_management(backend, dtype)
    one = backend.from_host(np.eye(16)[3])  # a single vector becomes a batch of one
    assert one.shape == (1, 16) and backend.to_host(one)[0, 3] == 1


# --- resources: handle, stream, memory handler, GPU choice (the double records them) --------


def test_one_handle_stream_and_memory_handler_per_backend(double):
    cp, cusv = double.cupy, double.custatevec
    backend = CuStateVecBackend(np.complex128, libraries=double)
    (handle,) = cusv.handles
    (stream,) = cp.streams
    assert cusv.handles[handle].stream == stream.ptr
    assert cusv.handles[handle].handler_sets == 1
    rng = np.random.default_rng(0)
    state = backend.from_host(random_states(7, 3, rng))
    backend.apply_matrix(state, random_unitary(64, rng)[None], (0, 1, 2, 3, 4, 5))
    backend.apply_pauli(state, "XYZXYZ", (0, 1, 2, 3, 4, 5))
    backend.sample(state, (0, 1), 10, rng)
    backend.expval_matrix(state[:1], random_unitary(64, rng), (1, 2, 3, 4, 5, 6))
    assert len(cusv.handles) == 1 and len(cp.streams) == 1
    # workspace came from the stream-ordered pool, on the backend's stream, and went back
    assert cp.pool_calls and cp.pool_allocations == {}
    assert {stream_ptr for _, _, stream_ptr in cp.pool_calls} == {stream.ptr}
    assert {stream_ptr for _, stream_ptr in cp.allocations} == {stream.ptr}
    assert cusv.samplers == {}
    del backend, state
    gc.collect()
    assert cusv.destroyed == [handle] and cusv.handles == {}


def test_no_synchronisation_until_the_host_reads(double):
    backend = CuStateVecBackend(np.complex128, libraries=double)
    state = backend.zero_state(3, 2)
    for word in ("X", "XY", "Z"):
        backend.apply_pauli_rotation(state, np.array([0.3]), word, (0, 1, 2)[: len(word)])
    backend.apply_matrix(state, np.eye(4)[None], (0, 1))
    backend.add_scaled(state, backend.copy(state), np.array([0.5]))
    assert double.cupy.synchronizations == 0
    backend.to_host(state)
    assert double.cupy.synchronizations == 1


def test_device_id_picks_the_gpu(monkeypatch):
    libraries = make_libraries(gpus=2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert CuStateVecBackend(libraries=libraries).device_id == 0
    backend = CuStateVecBackend(libraries=libraries, device_id=1)
    handle = list(libraries.custatevec.handles)[-1]
    assert backend.device_id == 1 and libraries.custatevec.handles[handle].device == 1
    state = backend.zero_state(2, 1)  # calls run with GPU 1 current (the double checks)
    backend.apply_pauli(state, "X", (0,))
    assert backend.probabilities(state, (0,))[0, 1] == 1
    assert libraries.cupy.current_device == 0  # and give the current device back
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert CuStateVecBackend(libraries=libraries).device_id == 1
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(ValueError, match=r"LOCAL_RANK=2 names GPU 2, but 2 GPU\(s\) are visible"):
        CuStateVecBackend(libraries=libraries)
    with pytest.raises(ValueError, match="device_id=5 names GPU 5"):
        CuStateVecBackend(libraries=libraries, device_id=5)
    monkeypatch.setenv("LOCAL_RANK", "first")
    with pytest.raises(ValueError, match="LOCAL_RANK='first' is not a GPU index"):
        CuStateVecBackend(libraries=libraries)


def test_available_bytes_is_the_gpus_free_memory():
    libraries = make_libraries(free_bytes=123_456_789)
    assert CuStateVecBackend(libraries=libraries).available_bytes() == 123_456_789
