"""What is particular to the cuStateVec backend: agreement with the CPU backend on a
random gate sequence, device-resident reductions, and its use of resources (handle,
stream, memory handler, GPU choice) through the double's records.

Runs on the NumPy double of cupy and cuStateVec (custatevec_double.py) everywhere, and
also on the real libraries when a GPU is usable. The contract every backend meets (each
primitive and composition against dense references) is test_backend_contract.py.
"""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest
from conftest import AUTO_BACKEND, stable_seed
from custatevec_double import make_libraries
from reference import random_states, random_unitary

from pennylane_custatevec.backends import gpu
from pennylane_custatevec.backends.cpu import CPUBackend
from pennylane_custatevec.backends.custatevec import CuStateVecBackend

N = 6
IMPLEMENTATIONS = ["double"] + (["gpu"] if AUTO_BACKEND == "custatevec" else [])


@pytest.fixture(params=IMPLEMENTATIONS)
def libraries(request):
    """The double, and the real cupy and cuStateVec where a GPU is usable."""
    if request.param == "gpu":
        return gpu.import_libraries()
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


# --- gates ---------------------------------------------------------------------------------


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


# --- memory layout: every vector 128-byte aligned --------------------------------------


@pytest.mark.parametrize(
    ("dtype", "n_qubits"),
    [(np.complex64, 1), (np.complex64, 3), (np.complex64, 4), (np.complex128, 2)]
    + [(np.complex128, 3)],
)
def test_every_vector_of_a_batch_starts_128_byte_aligned(double, dtype, n_qubits):
    """compute_expectation and the batched calls need 128-byte-aligned vectors on
    Blackwell GPUs (the double refuses others): a batch of vectors smaller than 128 bytes
    is padded to a stride of 128 bytes, whichever way it was made, and computes as the
    CPU backend does."""
    backend, cpu = CuStateVecBackend(dtype, libraries=double), CPUBackend(dtype)
    rng = np.random.default_rng(stable_seed("aligned", n_qubits))
    psi = random_states(n_qubits, 3, rng)
    made = {"zero_state": backend.zero_state(n_qubits, 3), "from_host": backend.from_host(psi)}
    made["copy"] = backend.copy(made["from_host"])
    made["concatenate"] = backend.concatenate(
        [backend.vectors(made["from_host"], 0, 1), backend.vectors(made["copy"], 1, 3)]
    )
    made["vectors"] = backend.vectors(made["concatenate"], 1, 3)
    padded = (1 << n_qubits) * np.dtype(dtype).itemsize < 128
    for name, state in made.items():
        assert state.shape[1] == 1 << n_qubits, name
        assert state.data.ptr % 128 == 0 and state.strides[0] % 128 == 0, name
        assert (state.strides[0] > state.shape[1] * state.itemsize) == padded, name
    np.testing.assert_array_equal(
        backend.to_host(made["concatenate"]), backend.to_host(made["copy"])
    )
    tol = 1e-5 if dtype == np.complex64 else 1e-12
    matrices = np.stack([random_unitary(2, rng) for _ in range(3)])
    observable = random_unitary(2, rng)
    results = []
    for b in (backend, cpu):
        state = b.from_host(psi)
        b.apply_matrix(state, matrices, (0,))
        results.append(
            (
                b.to_host(state),
                b.expval_matrix(state, observable, (0,)),
                b.probabilities(state, (0,)),
            )
        )
    for ours, theirs in zip(*results, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=tol)
    assert {"apply_matrix_batched", "compute_expectation_batched"} <= set(double.custatevec.calls)


# --- batches: few calls, no synchronisation inside ---------------------------------------


def test_wide_operators_the_same_for_every_vector_run_on_runs_of_vectors(double):
    """A diagonal, Pauli word or rotation on more than 4 targets, the same for every vector
    of a batch of B, runs as one call per binary digit of B (2**j adjacent vectors are one
    vector of n + j bits); with a parameter per vector, one call per vector; no
    synchronisation either way. The results are the CPU backend's."""
    cusv = double.custatevec
    backend, cpu = CuStateVecBackend(libraries=double), CPUBackend()
    rng = np.random.default_rng(stable_seed("runs"))
    psi = random_states(N, 5, rng)  # 5 = 0b101: runs of 4 and 1
    on_gpu, on_cpu = backend.from_host(psi), cpu.from_host(psi)
    targets, controls, values = (0, 2, 3, 4, 5), (1,), (1,)
    diagonal = np.exp(1j * rng.uniform(0, 6, size=(1, 32)))
    calls = [
        ("apply_pauli", ("XYZZY",), "apply_generalized_permutation_matrix", 2),
        ("apply_diagonal", (diagonal,), "apply_generalized_permutation_matrix", 2),
        ("apply_pauli_rotation", (np.array([0.3]), "XXYZY"), "apply_pauli_rotation", 2),
        ("apply_pauli_rotation", (rng.uniform(0, 3, size=5), "YZXZX"), "apply_pauli_rotation", 5),
    ]
    before = double.cupy.synchronizations
    for name, arguments, library_call, count in calls:
        made = len(cusv.calls)
        for b, state in ((backend, on_gpu), (cpu, on_cpu)):
            getattr(b, name)(state, *arguments, targets, controls, values)
        assert cusv.calls[made:] == [library_call] * count, name
    assert double.cupy.synchronizations == before
    np.testing.assert_allclose(backend.to_host(on_gpu), on_cpu, atol=1e-12)


def test_pauli_expectations_of_a_batch_are_grouped_and_read_once(double):
    """Words on a batch: grouped on at most 4 bits, one compute_expectation_batched per
    group into device memory (the norm for the identity word from abs2sum), one transfer
    for all; only words on more than 4 bits go vector by vector."""
    cusv, cp = double.custatevec, double.cupy
    backend, cpu = CuStateVecBackend(libraries=double), CPUBackend()
    rng = np.random.default_rng(stable_seed("grouped words"))
    psi = random_states(N, 3, rng)
    narrow = [("ZZ", (0, 1)), ("XX", (2, 3)), ("YIY", (0, 4, 3)), ("Z", (5,)), ("XZ", (5, 1))]
    narrow += [("II", (2, 3)), ("X", (0,))]
    for words, batched, per_vector in ((narrow, 2, 0), (narrow + [("XYZXY", range(5))], 2, 3)):
        state = backend.from_host(psi)
        made, before = len(cusv.calls), cp.synchronizations
        values = backend.expval_pauli_words(state, words)
        issued = cusv.calls[made:]
        assert issued.count("compute_expectation_batched") == batched
        assert issued.count("abs2sum_array_batched") == 1  # the identity word
        assert issued.count("compute_expectations_on_pauli_basis") == per_vector
        assert cp.synchronizations == before + 1 + per_vector
        expected = cpu.expval_pauli_words(cpu.from_host(psi), words)
        np.testing.assert_allclose(values, expected, atol=1e-12)


def test_a_batch_samples_its_marginals_on_the_device(double):
    """Sampling a batch: the marginals into device memory, their cumulative sums and one
    search per vector on the device, one transfer (no sampler, no other synchronisation);
    the same outcomes as the base class's sampling from the marginal with the same draws.
    A lone vector, and marginals over more than BATCHED_SAMPLING_BITS bits, take the
    library's sampler."""
    from pennylane_custatevec.backends.base import Backend

    cusv, cp = double.custatevec, double.cupy
    backend = CuStateVecBackend(libraries=double)
    psi = random_states(N, 4, np.random.default_rng(stable_seed("marginals")))
    state = backend.from_host(psi * np.array([[1.0], [2.0], [1.0], [0.5]]))  # norms vary
    made, before = len(cusv.calls), cp.synchronizations
    samples = backend.sample(state, (4, 1, 0), 200, np.random.default_rng(9))
    assert cusv.calls[made:] == ["abs2sum_array_batched"] and cp.synchronizations == before + 1
    reference = backend.from_host(psi)  # normalised: the base class normalises the marginal
    expected = Backend.sample(backend, reference, (4, 1, 0), 200, np.random.default_rng(9))
    np.testing.assert_array_equal(samples, expected)
    made = len(cusv.calls)
    backend.sample(backend.vectors(state, 1, 2), (4, 1, 0), 5, np.random.default_rng(9))
    assert "sampler_sample" in cusv.calls[made:]


# --- deferred adjoint: reductions on the device ------------------------------------------


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


# --- resources: handle, stream, memory handler, GPU choice (the double records them) --------


def test_free_memory_counts_what_the_workspace_pool_keeps_unused(double, make):
    """The stream-ordered pool keeps cuStateVec's workspaces across synchronisations,
    where cupy's arrays cannot use them: before free memory is read (only ahead of a
    large allocation) the pool of the backend's GPU gives back what it holds unused. The
    real library: the figure is a number of bytes."""
    cp = double.cupy
    backend = CuStateVecBackend(np.complex128, libraries=double)
    assert cp.pool_trims == []
    assert backend.available_bytes() == cp.free_bytes + cp.get_default_memory_pool().free_bytes()
    assert cp.pool_trims == [(0, 0)]
    assert make().available_bytes() > 0


def test_one_handle_stream_and_memory_handler_per_gpu(double):
    """Every backend on a GPU shares its handle and stream (made once, at the first
    backend), whose workspaces come from the GPU's stream-ordered pool with its release
    threshold at the maximum; release_contexts (at exit) destroys the handle."""
    cp, cusv = double.cupy, double.custatevec
    backend = CuStateVecBackend(np.complex128, libraries=double)
    (handle,) = cusv.handles
    (stream,) = cp.streams
    assert cusv.handles[handle].stream == stream.ptr
    assert cusv.handles[handle].handler_sets == 1
    assert cp.release_thresholds == {0: (1 << 64) - 1}
    rng = np.random.default_rng(0)
    state = backend.from_host(random_states(7, 3, rng))
    backend.apply_matrix(state, random_unitary(64, rng)[None], (0, 1, 2, 3, 4, 5))
    backend.apply_pauli(state, "XYZXYZ", (0, 1, 2, 3, 4, 5))
    backend.sample(state, (0, 1), 10, rng)
    backend.expval_matrix(state[:1], random_unitary(64, rng), (1, 2, 3, 4, 5, 6))
    others = [CuStateVecBackend(dtype, libraries=double) for dtype in (np.complex64,) * 3]
    others[0].apply_pauli(others[0].zero_state(2, 1), "X", (0,))
    assert cusv.created == 1 and len(cusv.handles) == 1 and len(cp.streams) == 1
    # workspace came from the stream-ordered pool, on the shared stream, and went back
    assert cp.pool_calls and cp.pool_allocations == {}
    assert {stream_ptr for _, _, stream_ptr in cp.pool_calls} == {stream.ptr}
    assert {stream_ptr for _, stream_ptr in cp.allocations} == {stream.ptr}
    assert cusv.samplers == {}
    del backend, state, others
    gc.collect()
    assert cusv.destroyed == []  # the handle outlives the backends
    gpu.release_contexts(double)
    assert cusv.destroyed == [handle] and cusv.handles == {}
    CuStateVecBackend(libraries=double)  # a new one after a release
    assert cusv.created == 2


def test_threads_take_the_gpus_context_in_turn(double):
    """Backends on one GPU used from several threads: each call holds the context's lock,
    so that one handle never runs two calls at once (the double would see them interleave
    on its records)."""
    backends = [CuStateVecBackend(libraries=double) for _ in range(4)]
    context = backends[0]._context
    assert all(b._context is context for b in backends)
    inside, overlaps = [], []
    apply_matrix = double.custatevec.apply_matrix

    def recording(*args):
        inside.append(1)
        time.sleep(1e-4)  # hands the GIL to another thread: without the lock, it enters
        overlaps.append(len(inside) > 1)
        apply_matrix(*args)
        inside.pop()

    double.custatevec.apply_matrix = recording
    rng = np.random.default_rng(2)
    matrices = [random_unitary(4, rng)[None] for _ in range(4)]

    def work(backend, matrix):
        state = backend.zero_state(N, 1)
        for _ in range(20):
            backend.apply_matrix(state, matrix, (0, 3))

    threads = [
        threading.Thread(target=work, args=pair) for pair in zip(backends, matrices, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(overlaps) == 80 and not any(overlaps)


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
    assert len(libraries.custatevec.handles) == 2  # one per GPU
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


@pytest.mark.parametrize(("gpus", "ranks"), [(1, 2), (1, 4), (2, 4), (4, 4)])
def test_mpi_ranks_take_the_gpus_round_robin(monkeypatch, gpus, ranks):
    """Under MPI a rank takes GPU (its index on the node) modulo the visible GPUs: with one
    GPU visible per rank (--gpus-per-task=1, a per-rank CUDA_VISIBLE_DEVICES) every rank
    takes its GPU 0, and ranks that outnumber the GPUs share them; device_id and
    $LOCAL_RANK stay strict."""
    monkeypatch.setenv("LOCAL_RANK", str(gpus))  # not consulted under MPI
    libraries = make_libraries(gpus=gpus)
    chosen = [
        CuStateVecBackend(libraries=libraries, rank_on_node=rank).device_id for rank in range(ranks)
    ]
    assert chosen == [rank % gpus for rank in range(ranks)]
    assert len(libraries.custatevec.handles) == min(gpus, ranks)
    with pytest.raises(ValueError, match=rf"device_id={gpus} names GPU {gpus}"):
        CuStateVecBackend(libraries=libraries, device_id=gpus, rank_on_node=0)


def test_an_mpi_device_takes_its_node_rank_modulo_the_gpus(monkeypatch):
    """The device under mpi=True on the fourth rank of a node that shows it two GPUs: it
    takes GPU 3 % 2 = 1 instead of refusing GPU 3; device_id stays strict."""
    import pennylane as qml

    from pennylane_custatevec.backends import messages

    libraries = make_libraries(gpus=2)
    monkeypatch.setattr(gpu, "import_libraries", lambda: libraries)
    monkeypatch.setattr(messages, "node_rank", lambda comm: 3)
    gpu.unavailable_reason.cache_clear()
    try:
        dev = qml.device("custatevec.qubit", wires=2, backend="custatevec", mpi=True)
        assert dev._backend.local.device_id == 1
        with pytest.raises(ValueError, match="device_id=2 names GPU 2, but 2 GPU"):
            qml.device("custatevec.qubit", wires=2, backend="custatevec", mpi=True, device_id=2)
    finally:
        gpu.unavailable_reason.cache_clear()


def test_available_bytes_is_the_gpus_free_memory():
    libraries = make_libraries(free_bytes=123_456_789)
    assert CuStateVecBackend(libraries=libraries).available_bytes() == 123_456_789
