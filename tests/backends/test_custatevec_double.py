"""The NumPy double of cuStateVec is faithful where the backend's correctness depends on it:
the real binding's signatures and enum values, and NVIDIA's documented semantics, each
checked against a dense-matrix reference."""

from __future__ import annotations

import inspect
import json
import re
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
from conftest import AUTO_BACKEND
from custatevec_double import (
    ComputeType,
    DeviceArray,
    MatrixLayout,
    MatrixMapType,
    Pauli,
    SamplerOutput,
    Status,
    cudaDataType,
    cuStateVecError,
    make_libraries,
)
from reference import dense_operator, random_state, random_unitary, word_matrix

from pennylane_custatevec.backends import custatevec, custatevec_calls, gpu

SNAPSHOT = json.loads((Path(__file__).parents[1] / "data" / "custatevec_bindings.json").read_text())
C64F, R64F = cudaDataType.CUDA_C_64F, cudaDataType.CUDA_C_32F
ROW, COMPUTE_64F = MatrixLayout.ROW, ComputeType.COMPUTE_64F


@pytest.fixture
def lib():
    """(cupy double, cuStateVec double, handle)."""
    libraries = make_libraries()
    handle = libraries.custatevec.create()
    return libraries.cupy, libraries.custatevec, handle


def device(cp, vector):
    return cp.asarray(np.asarray(vector, dtype=np.complex128))


# --- the real binding's surface ------------------------------------------------------------


def test_signatures_and_enums_match_the_real_binding_snapshot():
    """Positional parameters of every function the backend calls, and the enum values, as
    cuquantum-python 26.9 has them (tests/data/custatevec_bindings.json, recorded with
    inspect.signature from the wheel)."""
    cusv = make_libraries().custatevec
    for name, parameters in SNAPSHOT["functions"].items():
        assert list(inspect.signature(getattr(cusv, name)).parameters) == parameters, name
    for name, members in SNAPSHOT["enums"].items():
        assert {m.name: int(m) for m in getattr(cusv, name)} == members, name
    assert {m.name: int(m) for m in cudaDataType} == SNAPSHOT["cudaDataType"]


BINDING_USERS = (custatevec, custatevec_calls, gpu)
"""The modules that call the binding: the backend, its calls and the GPU contexts."""


def binding_names_the_backend_uses() -> set[str]:
    """Every ``cusv.NAME``, ``self._cusv.NAME`` and ``owner.custatevec.NAME`` in the
    modules that call the binding (``BINDING_USERS``)."""
    names = set()
    for module in BINDING_USERS:
        source = Path(module.__file__).read_text(encoding="utf-8")
        names |= set(re.findall(r"\b(?:_?cusv|\w+\.custatevec)\.([A-Za-z_]\w*)", source))
    return names


def test_the_snapshot_has_every_binding_name_the_backend_uses():
    """Each name the backend takes from the binding is a function or an enum of the snapshot
    (or the error class), so that the double and the live check below cover every call."""
    used = binding_names_the_backend_uses()
    assert {"create", "apply_matrix", "sampler_sample", "MatrixLayout"} <= used
    known = set(SNAPSHOT["functions"]) | set(SNAPSHOT["enums"]) | {"cuStateVecError"}
    assert sorted(used - known) == []


# --- the installed binding (CI installs the real library; no GPU needed) ------------------
# scripts/gpu_check.sh runs these by their common keyword, installed_binding.


def test_snapshot_matches_the_installed_binding():
    """Where cuquantum is installed, the snapshot is still what it has: the positional
    parameters of every function the backend calls, every enum, the cudaDataType values."""
    cusv = pytest.importorskip("cuquantum.bindings.custatevec")
    from cuquantum import cudaDataType as installed_data_type

    for name, parameters in SNAPSHOT["functions"].items():
        assert list(inspect.signature(getattr(cusv, name)).parameters) == parameters, name
    for name, members in SNAPSHOT["enums"].items():
        assert {m.name: int(m) for m in getattr(cusv, name)} == members, name
    assert {
        name: int(getattr(installed_data_type, name)) for name in SNAPSHOT["cudaDataType"]
    } == SNAPSHOT["cudaDataType"]


def test_installed_binding_has_every_name_the_backend_uses():
    cusv = pytest.importorskip("cuquantum.bindings.custatevec")
    assert sorted(n for n in binding_names_the_backend_uses() if not hasattr(cusv, n)) == []


def _cublas_installed() -> bool:
    try:
        metadata.version("nvidia-cublas")
    except metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(AUTO_BACKEND == "custatevec", reason="a GPU is usable here")
def test_installed_binding_create_fails_as_the_fallback_expects(monkeypatch):
    """Without a GPU the real create() raises what ``unavailable_reason`` catches: with cuBLAS
    installed cuStateVecError NOT_INITIALIZED, which it reports as the GPU's problem; without
    cuBLAS cuda-pathfinder's DynamicLibNotFoundError for libcublasLt, a RuntimeError, which
    it reports as cuBLAS's. The double's cupy, which sees a GPU, makes the probe reach
    create()."""
    cusv = pytest.importorskip("cuquantum.bindings.custatevec")
    from cuquantum import cudaDataType as installed_data_type

    cublas = _cublas_installed()
    with pytest.raises(cusv.cuStateVecError if cublas else RuntimeError) as info:
        cusv.create()
    if cublas:
        assert "NOT_INITIALIZED" in str(info.value)
    sees_a_gpu = make_libraries().cupy  # the double's cupy, with its one GPU
    libraries = gpu.Libraries(sees_a_gpu, cusv, installed_data_type)
    monkeypatch.setattr(gpu, "import_libraries", lambda: libraries)
    gpu.unavailable_reason.cache_clear()
    try:
        reason = gpu.unavailable_reason()
    finally:
        gpu.unavailable_reason.cache_clear()
    expected = (
        r"cuStateVec could not start on the GPU \(NOT_INITIALIZED.*compute capability"
        if cublas
        else r"cuBLAS could not be loaded \(.*libcublasLt.*nvidia-cublas"
    )
    assert re.match(expected, reason, re.DOTALL), reason


@pytest.mark.skipif(AUTO_BACKEND == "custatevec", reason="a GPU is usable here")
def test_installed_binding_probe_names_the_missing_gpu():
    """With cupy and cuquantum installed and no GPU, "auto"'s reason is the GPU, not a
    package (cupy's runtime finds no driver, or no device)."""
    pytest.importorskip("cuquantum.bindings.custatevec")
    pytest.importorskip("cupy")
    gpu.unavailable_reason.cache_clear()
    try:
        reason = gpu.unavailable_reason()
    finally:
        gpu.unavailable_reason.cache_clear()
    assert re.match(r"no CUDA GPU is (usable|visible) ", reason), reason


# --- semantics -----------------------------------------------------------------------------


def test_apply_pauli_rotation_is_exp_plus_i_theta_p(lib):
    cp, cusv, handle = lib
    rng = np.random.default_rng(1)
    psi, theta = random_state(4, rng), 0.37
    sv = device(cp, psi)
    paulis, targets = [Pauli.X, Pauli.Y, Pauli.Z], [2, 0, 3]
    cusv.apply_pauli_rotation(handle, sv.data.ptr, C64F, 4, theta, paulis, targets, 3, 0, 0, 0)
    expected = scipy.linalg.expm(1j * theta * dense_operator(4, word_matrix("XYZ"), targets)) @ psi
    np.testing.assert_allclose(cp.asnumpy(sv), expected, atol=1e-12)


@pytest.mark.parametrize("layout", [MatrixLayout.ROW, MatrixLayout.COL])
@pytest.mark.parametrize("adjoint", [0, 1])
def test_apply_matrix_target_order_layout_and_adjoint(lib, layout, adjoint):
    """targets[j] is bit j of the matrix index (a non-symmetric matrix on targets (3, 1))."""
    cp, cusv, handle = lib
    rng = np.random.default_rng(2)
    psi, m = random_state(4, rng), random_unitary(4, rng)
    sv = device(cp, psi)
    stored = np.ascontiguousarray(m if layout is MatrixLayout.ROW else m.T)
    cusv.apply_matrix(
        handle, sv.data.ptr, C64F, 4, stored.ctypes.data, C64F, layout, adjoint,
        [3, 1], 2, 0, 0, 0, COMPUTE_64F, 0, 0,
    )  # fmt: skip
    applied = m.conj().T if adjoint else m
    np.testing.assert_allclose(cp.asnumpy(sv), dense_operator(4, applied, (3, 1)) @ psi, atol=1e-12)


def test_null_control_values_mean_all_ones(lib):
    cp, cusv, handle = lib
    rng = np.random.default_rng(3)
    psi, m = random_state(3, rng), random_unitary(2, rng)
    results = []
    for values in (0, [1, 1]):
        sv = device(cp, psi)
        cusv.apply_matrix(
            handle, sv.data.ptr, C64F, 3, m.ctypes.data, C64F, ROW, 0,
            [1], 1, [0, 2], values, 2, COMPUTE_64F, 0, 0,
        )  # fmt: skip
        results.append(cp.asnumpy(sv))
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_allclose(results[0], dense_operator(3, m, (1,), (0, 2), (1, 1)) @ psi)


def test_apply_matrix_batched_maps_matrices_to_vectors(lib):
    cp, cusv, handle = lib
    rng = np.random.default_rng(4)
    psi = np.stack([random_state(3, rng) for _ in range(3)])
    mats = np.stack([random_unitary(2, rng) for _ in range(2)])
    sv = cp.asarray(psi)
    cusv.apply_matrix_batched(
        handle, sv.data.ptr, C64F, 3, 3, 8, MatrixMapType.MATRIX_INDEXED,
        np.array([1, 0, 1], dtype=np.int32), mats.ctypes.data, C64F, ROW, 0, 2,
        [2], 1, 0, 0, 0, COMPUTE_64F, 0, 0,
    )  # fmt: skip
    for vector, index in enumerate([1, 0, 1]):
        expected = dense_operator(3, mats[index], (2,)) @ psi[vector]
        np.testing.assert_allclose(cp.asnumpy(sv)[vector], expected, atol=1e-12)


def test_apply_matrix_batched_adjoint_conjugates_each_indexed_matrix(lib):
    """adjoint = 1 applies M^dagger of the matrix each vector's index picks (the backend's
    adjoint block step relies on it), and BROADCAST gives every vector matrix 0."""
    cp, cusv, handle = lib
    rng = np.random.default_rng(5)
    psi = np.stack([random_state(3, rng) for _ in range(4)])
    mats = np.stack([random_unitary(4, rng) for _ in range(2)])
    for map_type, indices in [
        (MatrixMapType.MATRIX_INDEXED, np.array([0, 0, 1, 1], dtype=np.int32)),
        (MatrixMapType.BROADCAST, 0),
    ]:
        sv = cp.asarray(psi)
        cusv.apply_matrix_batched(
            handle, sv.data.ptr, C64F, 3, 4, 8, map_type, indices, mats.ctypes.data, C64F,
            ROW, 1, 2, [2, 0], 2, 0, 0, 0, COMPUTE_64F, 0, 0,
        )  # fmt: skip
        chosen = [0, 0, 1, 1] if map_type is MatrixMapType.MATRIX_INDEXED else [0] * 4
        for vector, index in enumerate(chosen):
            expected = dense_operator(3, mats[index].conj().T, (2, 0)) @ psi[vector]
            np.testing.assert_allclose(cp.asnumpy(sv)[vector], expected, atol=1e-12)


def test_generalized_permutation_is_d_times_p(lib):
    """(D P psi)[r] = d[r] psi[perm[r]]: with the table of a Pauli word (an involution) and
    d from the dense word matrix, it applies the word."""
    cp, cusv, handle = lib
    rng = np.random.default_rng(5)
    psi = random_state(4, rng)
    word = word_matrix("YZX")  # letter j on bit j: x mask 0b101
    table = np.arange(8, dtype=np.int64) ^ 0b101
    diagonal = np.ascontiguousarray(word[np.arange(8), table])
    sv = device(cp, psi)
    cusv.apply_generalized_permutation_matrix(
        handle, sv.data.ptr, C64F, 4, table, diagonal.ctypes.data, C64F, 0,
        [0, 3, 1], 3, 0, 0, 0, 0, 0,
    )  # fmt: skip
    np.testing.assert_allclose(cp.asnumpy(sv), dense_operator(4, word, (0, 3, 1)) @ psi)


def test_compute_expectation_writes_the_value_into_the_output_buffer(lib):
    cp, cusv, handle = lib
    rng = np.random.default_rng(6)
    psi = random_state(3, rng)
    m = rng.normal(size=(4, 4)) + 1j * rng.normal(size=(4, 4))
    expected = np.vdot(psi, dense_operator(3, m, (2, 0)) @ psi)
    sv = device(cp, psi)  # kept: a temporary's pointer would dangle, on a GPU too
    out = np.zeros(2, dtype=np.complex128)
    returned = cusv.compute_expectation(
        handle, sv.data.ptr, C64F, 3, out.ctypes.data, C64F, m.ctypes.data, C64F,
        ROW, [2, 0], 2, COMPUTE_64F, 0, 0,
    )  # fmt: skip
    np.testing.assert_allclose(out[0], expected, atol=1e-12)
    assert out[1] == 0 and returned != pytest.approx(expected.real)
    real = np.zeros(2, dtype=np.float64)
    cusv.compute_expectation(
        handle, sv.data.ptr, C64F, 3, real.ctypes.data, cudaDataType.CUDA_R_64F,
        m.ctypes.data, C64F, ROW, [2, 0], 2, COMPUTE_64F, 0, 0,
    )  # fmt: skip
    assert real[0] == pytest.approx(expected.real) and real[1] == 0


def test_abs2sum_orders_output_bits_by_bit_ordering(lib):
    cp, cusv, handle = lib
    psi = np.zeros(8, dtype=np.complex128)
    psi[0b101] = 1.0
    sv, out = device(cp, psi), np.zeros(4)
    cusv.abs2sum_array(handle, sv.data.ptr, C64F, 3, out.ctypes.data, [2, 1], 2, 0, 0, 0)
    # output bit 0 is state bit 2 (1), output bit 1 is state bit 1 (0): index 0b01
    np.testing.assert_array_equal(out, [0, 1, 0, 0])


def test_sampler_scales_by_the_norm_keeps_randnum_order_and_uses_the_handler(lib):
    cp, cusv, handle = lib
    psi = np.array([0, 1, 0, 1j], dtype=np.complex128) * 3.0  # |01> and |11>, unnormalised
    sv = device(cp, psi)
    sampler, _ = cusv.sampler_create(handle, sv.data.ptr, C64F, 2, 4)
    out = np.zeros(4, dtype=np.int64)
    args = (out.ctypes.data, [1, 0], 2, np.array([0.9, 0.1, 0.6, 0.2]), 4)
    with pytest.raises(cuStateVecError, match="SAMPLER_NOT_PREPROCESSED"):
        cusv.sampler_sample(handle, sampler, *args, SamplerOutput.RANDNUM_ORDER)
    with pytest.raises(cuStateVecError, match="INSUFFICIENT_WORKSPACE"):
        cusv.sampler_preprocess(handle, sampler, 0, 0)  # NULL workspace and no handler
    cusv.set_device_mem_handler(
        handle,
        (cp.cuda.runtime.mallocAsync, lambda p, s, st: cp.cuda.runtime.freeAsync(p, st), "t"),
    )
    cusv.sampler_preprocess(handle, sampler, 0, 0)
    assert len(cp.pool_allocations) == 1
    cusv.sampler_sample(handle, sampler, *args, SamplerOutput.RANDNUM_ORDER)
    # index 1 (bits 1,0 = 0,1 -> output 0b10) below 0.5, index 3 (-> 0b11) above
    np.testing.assert_array_equal(out, [0b11, 0b10, 0b11, 0b10])
    cusv.sampler_sample(handle, sampler, *args, SamplerOutput.ASCENDING_ORDER)
    np.testing.assert_array_equal(out, [0b10, 0b10, 0b11, 0b11])
    cusv.sampler_destroy(sampler)
    assert cp.pool_allocations == {}


# --- calling conventions -------------------------------------------------------------------


def test_item_sizes_null_and_memory_kinds_are_enforced(lib):
    cp, cusv, handle = lib
    sv = device(cp, random_state(3, np.random.default_rng(7)))
    m = np.eye(2, dtype=np.complex128)

    def apply(sv_ptr=sv.data.ptr, targets=(0,), controls=0, values=0, n_controls=0):
        cusv.apply_matrix(
            handle, sv_ptr, C64F, 3, m.ctypes.data, C64F, ROW, 0, targets, 1,
            controls, values, n_controls, COMPUTE_64F, 0, 0,
        )  # fmt: skip

    apply(targets=np.array([0], dtype=np.int32))
    with pytest.raises(AssertionError):
        apply(targets=np.array([0], dtype=np.int64))  # int32 expected
    with pytest.raises(TypeError):
        apply(controls=None)  # NULL is 0, not None
    with pytest.raises(cuStateVecError, match="INVALID_VALUE"):
        apply(controls=0, n_controls=1)  # NULL controls with a count
    with pytest.raises(cuStateVecError, match="INVALID_VALUE"):
        apply(targets=[1], controls=[1], values=[1], n_controls=1)  # overlap
    host = np.zeros(8, dtype=np.complex128)
    with pytest.raises(AssertionError, match="not device memory"):
        apply(sv_ptr=host.ctypes.data)
    on_device = cp.zeros(2, dtype=np.complex128)
    with pytest.raises(AssertionError, match="wants host memory"):
        cusv.compute_expectation(
            handle, sv.data.ptr, C64F, 3, on_device.data.ptr, C64F, m.ctypes.data, C64F, ROW,
            [0], 1, COMPUTE_64F, 0, 0,
        )  # fmt: skip
    with pytest.raises(cuStateVecError, match="INVALID_VALUE"):  # complex128 sv, 32F compute
        cusv.apply_matrix(
            handle, sv.data.ptr, C64F, 3, m.ctypes.data, C64F, ROW, 0, [0], 1, 0, 0, 0,
            ComputeType.COMPUTE_32F, 0, 0,
        )  # fmt: skip
    sampler, _ = cusv.sampler_create(handle, sv.data.ptr, C64F, 3, 2)
    cusv.sampler_preprocess(handle, sampler, cp.zeros(1024, dtype=np.uint8).data.ptr, 1024)
    out = np.zeros(2, dtype=np.int64)
    with pytest.raises(AssertionError):  # random numbers are float64
        cusv.sampler_sample(
            handle, sampler, out.ctypes.data, [0], 1, np.zeros(2, dtype=np.float32), 2, 0
        )
    assert Status.SUCCESS == 0


def test_device_arrays_refuse_host_arrays_like_cupy():
    cp = make_libraries().cupy
    on_device = cp.zeros(3, dtype=np.complex128)
    with pytest.raises(TypeError):
        on_device * np.ones(3)
    with pytest.raises(TypeError):
        np.vdot(on_device, np.ones(3))
    assert isinstance(on_device * cp.asarray(np.ones(3)), DeviceArray)


def test_concatenate_joins_device_arrays_into_a_new_one():
    cp = make_libraries().cupy
    first, second = cp.zeros((1, 4), dtype=np.complex128), cp.asarray(np.ones((2, 4)) * 1j)
    allocations = len(cp.allocations)
    joined = cp.concatenate([first, second])
    assert isinstance(joined, DeviceArray) and joined.shape == (3, 4)
    assert len(cp.allocations) == allocations + 1  # new device memory
    expected = np.concatenate([cp.asnumpy(first), cp.asnumpy(second)])
    np.testing.assert_array_equal(cp.asnumpy(joined), expected)
    joined[0] = 5
    assert cp.asnumpy(first)[0, 0] == 0
    with pytest.raises(TypeError):
        cp.concatenate([first, np.ones((1, 4))])
    with pytest.raises(ValueError):
        cp.concatenate([])


# --- what a GPU would refuse: implicit conversion, stream order, alignment ---------------


def test_device_arrays_refuse_implicit_conversion_like_cupy():
    """cupy's __array__ raises TypeError: numpy never reads device memory silently. The
    explicit reads (asnumpy, get, float of one element) work, each a synchronisation."""
    cp = make_libraries().cupy
    on_device = cp.asarray(np.arange(3.0))
    for convert in (
        np.asarray,
        np.array,
        np.ascontiguousarray,
        lambda a: np.array([a, a]),
        lambda a: np.asarray(a, dtype=complex),
    ):
        with pytest.raises(TypeError, match="Implicit conversion to a NumPy array"):
            convert(on_device)
    assert not isinstance(on_device, np.ndarray)
    before = cp.synchronizations
    np.testing.assert_array_equal(on_device.get(), [0, 1, 2])
    assert float(on_device[2]) == 2.0 and cp.asnumpy(on_device).dtype == np.float64
    assert cp.synchronizations == before + 3
    view = on_device[1:]  # views share the memory and keep their base alive
    view[0] = 7
    assert on_device.get()[1] == 7 and view.base is on_device


def test_allocations_are_256_byte_aligned_as_cudas():
    cp = make_libraries().cupy
    for size in (1, 3, 17, 1000):
        assert cp.zeros(size, dtype=np.complex64).data.ptr % 256 == 0


def test_work_on_another_stream_is_a_race_until_synchronised():
    """A non-blocking stream and the null stream do not wait for each other: an array
    written on one and used, or read by the host, on the other without a synchronisation
    races on a GPU, and the double refuses it."""
    from cupy_double import StreamRaceError

    cp = make_libraries().cupy
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        written = cp.zeros(4, dtype=np.complex128)
    with pytest.raises(StreamRaceError, match="read by the host on stream 0x0"):
        cp.asnumpy(written)  # on the null stream
    with pytest.raises(StreamRaceError, match="used on stream 0x0"):
        written + written
    with stream:
        doubled = written + written  # on its own stream: ordered
    with pytest.raises(StreamRaceError, match="outside reader"):
        assert doubled.__cuda_array_interface__  # MPI reads it outside any stream order
    assert cp.asnumpy(doubled, stream=stream).tolist() == [0j] * 4  # waits for the stream
    assert doubled.__cuda_array_interface__["data"][0] == doubled.data.ptr
    cp.asnumpy(written)  # waited for: any stream may read it now
    blocking = cp.cuda.Stream()
    with blocking:
        ordered = cp.zeros(2)
    cp.asnumpy(ordered)  # a blocking stream and the null stream wait for each other


def test_library_calls_run_on_the_handles_stream(lib):
    """A call reads its state vector on the handle's stream: memory that cupy wrote on
    another stream without a synchronisation is a race; a call that writes host memory
    waits for the stream (a synchronisation)."""
    from cupy_double import StreamRaceError

    cp, cusv, handle = lib
    stream = cp.cuda.Stream(non_blocking=True)
    cusv.set_stream(handle, stream.ptr)
    m = np.eye(2, dtype=np.complex128)
    sv = cp.zeros(8, dtype=np.complex128)  # the null stream's memset

    def apply():
        cusv.apply_matrix(
            handle, sv.data.ptr, C64F, 3, m.ctypes.data, C64F, ROW, 0, [0], 1,
            0, 0, 0, COMPUTE_64F, 0, 0,
        )  # fmt: skip

    with pytest.raises(StreamRaceError, match=f"stream {stream.ptr:#x}"):
        apply()
    cp.cuda.Device().synchronize()
    apply()
    with pytest.raises(StreamRaceError):
        cp.asnumpy(sv)  # the null stream, not the handle's
    out = np.zeros(4)
    before = cp.synchronizations
    cusv.abs2sum_array(handle, sv.data.ptr, C64F, 3, out.ctypes.data, [0, 1], 2, 0, 0, 0)
    assert cp.synchronizations == before + 1  # a host output waits for the stream
    cp.asnumpy(sv)  # nothing pending now
    with stream:
        on_device = cp.zeros(4)
    before = cp.synchronizations
    cusv.abs2sum_array(handle, sv.data.ptr, C64F, 3, on_device.data.ptr, [0, 1], 2, 0, 0, 0)
    assert cp.synchronizations == before  # a device output does not


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_expectation_and_batched_calls_need_128_byte_aligned_vectors(lib, dtype):
    """As on Blackwell: compute_expectation and the batched calls refuse a vector that does
    not start on a 128-byte boundary, a batch's stride included (2**n elements of a small
    vector are fewer than 128 bytes); the other calls take any vector."""
    cp, cusv, handle = lib
    sv_type = C64F if dtype == np.complex128 else R64F
    compute = COMPUTE_64F if dtype == np.complex128 else ComputeType.COMPUTE_32F
    n = 2
    short = 128 // np.dtype(dtype).itemsize // 2  # a stride of 64 bytes
    batch = cp.zeros(3 * 128 // np.dtype(dtype).itemsize, dtype=dtype)
    m = np.eye(2, dtype=np.complex128)
    out = np.zeros(16, dtype=np.complex128)

    def batched(stride):
        cusv.apply_matrix_batched(
            handle, batch.data.ptr, sv_type, n, 3, stride, MatrixMapType.BROADCAST, 0,
            m.ctypes.data, C64F, ROW, 0, 1, [0], 1, 0, 0, 0, compute, 0, 0,
        )  # fmt: skip

    def expectation(offset):
        cusv.compute_expectation(
            handle, batch.data.ptr + offset, sv_type, n, out.ctypes.data, C64F,
            m.ctypes.data, C64F, ROW, [0], 1, compute, 0, 0,
        )  # fmt: skip

    with pytest.raises(cuStateVecError, match="INVALID_VALUE.*not 128-byte aligned"):
        batched(short)
    batched(2 * short)  # padded to 128 bytes
    with pytest.raises(cuStateVecError, match="not 128-byte aligned"):
        expectation(64)
    expectation(128)
    cusv.apply_matrix(  # a single vector at any offset
        handle, batch.data.ptr + 64, sv_type, n, m.ctypes.data, C64F, ROW, 0, [0], 1,
        0, 0, 0, compute, 0, 0,
    )  # fmt: skip


def test_pinned_host_memory_is_recorded_with_the_copies_into_it():
    cp = make_libraries().cupy
    memory = cp.cuda.alloc_pinned_memory(64)
    host = np.frombuffer(memory, np.complex128, 4)
    assert memory.ptr == host.ctypes.data and cp.pinned_allocations == 1
    cp.asnumpy(cp.asarray(np.arange(4.0) + 1j), out=host)
    assert host.tolist() == [1j, 1 + 1j, 2 + 1j, 3 + 1j] and cp.pinned_copies == 1
    cp.asnumpy(cp.zeros(4, dtype=np.complex128), out=np.zeros(4, dtype=np.complex128))
    assert cp.pinned_copies == 1  # pageable memory is not counted
