"""A NumPy test double of the ``cuquantum.bindings.custatevec`` calls the backend makes, over
the cupy double of ``tests/cupy_double.py``.

``make_libraries()`` returns a ``Libraries`` that ``CuStateVecBackend`` runs on unchanged:

* :class:`FakeCuStateVec` has exactly the functions the backend calls, with the real
  binding's names and positional parameters (checked against a snapshot of
  cuquantum-python 26.9 in ``data/custatevec_bindings.json``), and NVIDIA's documented
  semantics: pointers are ints resolved to the memory they point at (state vectors must be
  device memory, outputs documented as host memory must be host memory), ``0`` is NULL and
  ``None`` a TypeError, numpy arrays passed for int32 / int64 / float64 arrays must have that
  item size (else AssertionError, as ``get_resource_ptr`` asserts), state index bits are
  little-endian, ``targets[j]`` is bit j of the matrix index, NULL control values mean all
  ones, ``apply_pauli_rotation`` applies exp(+i theta P), ``compute_expectation`` writes the
  value into its output buffer, ``abs2sum`` and the sampler order output bits by
  ``bit_ordering``, the sampler scales its random numbers by the squared norm;
* every call runs on its handle's stream (``set_stream``; the null stream before): device
  memory that another stream's work is pending on is a race (``cupy_double.
  StreamRaceError``), and a call that writes host memory waits for the stream (it counts
  in the cupy double's ``synchronizations``);
* as on Blackwell GPUs, ``compute_expectation`` and the batched calls refuse state vectors
  that are not 128-byte aligned (each vector of a batch: the pointer and the stride in
  bytes), with INVALID_VALUE;
* ``created`` counts the handles made, so that tests see one handle per GPU.

Where the real library's behaviour is undocumented the double is stricter (it raises on
length mismatches or unknown pointers rather than reading garbage).
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import itertools
import operator

import numpy as np
from cupy_double import DeviceArray, FakeCupy, find_memory, touch, wait_for

from pennylane_custatevec.backends.gpu import Libraries

# --- enums (values of cuquantum-python 26.9) -----------------------------------------------


class cudaDataType(enum.IntEnum):  # noqa: N801 - the real name
    CUDA_R_64F = 1
    CUDA_C_32F = 4
    CUDA_C_64F = 5


class Status(enum.IntEnum):
    SUCCESS = 0
    NOT_INITIALIZED = 1
    ALLOC_FAILED = 2
    INVALID_VALUE = 3
    ARCH_MISMATCH = 4
    EXECUTION_FAILED = 5
    INTERNAL_ERROR = 6
    NOT_SUPPORTED = 7
    INSUFFICIENT_WORKSPACE = 8
    SAMPLER_NOT_PREPROCESSED = 9
    NO_DEVICE_ALLOCATOR = 10
    DEVICE_ALLOCATOR_ERROR = 11
    COMMUNICATOR_ERROR = 12
    LOADING_LIBRARY_FAILED = 13
    INVALID_CONFIGURATION = 14
    ALREADY_INITIALIZED = 15
    INVALID_WIRE = 16
    SYSTEM_ERROR = 17
    CUDA_ERROR = 18
    NUMERICAL_ERROR = 19
    RESOURCES_NOT_ACCESSIBLE = 20
    MAX_VALUE = 21


class Pauli(enum.IntEnum):
    I = 0  # noqa: E741 - the real name
    X = 1
    Y = 2
    Z = 3


class MatrixLayout(enum.IntEnum):
    COL = 0
    ROW = 1


class MatrixMapType(enum.IntEnum):
    BROADCAST = 0
    MATRIX_INDEXED = 1


class SamplerOutput(enum.IntEnum):
    RANDNUM_ORDER = 0
    ASCENDING_ORDER = 1


class ComputeType(enum.IntEnum):
    COMPUTE_DEFAULT = 0
    COMPUTE_32F = 4
    COMPUTE_64F = 16
    COMPUTE_TF32 = 4096


class cuStateVecError(Exception):  # noqa: N801, N818 - the real name
    """As the real one: derives from Exception (not RuntimeError) and carries a status;
    the double adds what it found wrong."""

    def __init__(self, status, detail: str = ""):
        self.status = status
        super().__init__(
            f"{Status(status).name} ({int(status)})" + (f": {detail}" if detail else "")
        )


_SV_DTYPES = {cudaDataType.CUDA_C_64F: np.complex128, cudaDataType.CUDA_C_32F: np.complex64}
_VALID_TYPES = {
    # (state vector, matrix) -> compute type, the table of custatevec.h
    (cudaDataType.CUDA_C_64F, cudaDataType.CUDA_C_64F): ComputeType.COMPUTE_64F,
    (cudaDataType.CUDA_C_32F, cudaDataType.CUDA_C_64F): ComputeType.COMPUTE_32F,
    (cudaDataType.CUDA_C_32F, cudaDataType.CUDA_C_32F): ComputeType.COMPUTE_32F,
}
PAULI_2X2 = {
    Pauli.I: np.eye(2),
    Pauli.X: np.array([[0, 1], [1, 0]]),
    Pauli.Y: np.array([[0, -1j], [1j, 0]]),
    Pauli.Z: np.diag([1, -1]),
}
CONTEXT_WORKSPACE_TARGETS = 5
"""Above this many targets a matrix call needs extra workspace (NULL: from the handler)."""


# --- memory: the library's view of pointers ----------------------------------------------

VECTOR_ALIGNMENT = 128
"""Bytes each state vector of compute_expectation and the batched calls must be aligned to
(custatevec.h: "For Blackwell architecture, ... has to be 128-byte aligned")."""


def _intptr(value) -> int:
    """An intptr_t argument: ints only (Cython raises TypeError for None and floats)."""
    if value is None or isinstance(value, float):
        raise TypeError(f"an integer is required, not {type(value).__name__}")
    return operator.index(value)


def device_buffer(ptr, dtype, count: int, stream: int) -> np.ndarray:
    """``count`` elements at a device pointer (a state vector must live on the device),
    used by work on ``stream``."""
    ptr = _intptr(ptr)
    if ptr == 0:
        raise cuStateVecError(Status.INVALID_VALUE)
    nbytes = count * np.dtype(dtype).itemsize
    found = find_memory(ptr, nbytes)
    if found is None:
        raise AssertionError(f"pointer {ptr:#x} ({nbytes} bytes) is not device memory")
    touch(found[0], stream)
    return found[1].view(dtype)


def host_buffer(ptr, dtype, count: int) -> np.ndarray:
    """``count`` elements at a host pointer (outputs documented as host memory)."""
    ptr = _intptr(ptr)
    if ptr == 0:
        raise cuStateVecError(Status.INVALID_VALUE)
    nbytes = count * np.dtype(dtype).itemsize
    if find_memory(ptr, nbytes) is not None:
        raise AssertionError(f"pointer {ptr:#x} is device memory; the library wants host memory")
    raw = ctypes.cast(ptr, ctypes.POINTER(ctypes.c_uint8))
    return np.ctypeslib.as_array(raw, shape=(nbytes,)).view(dtype)


def any_buffer(ptr, dtype, count: int, stream: int) -> tuple[np.ndarray, bool]:
    """(``count`` elements at a host or device pointer, whether on the device)."""
    ptr = _intptr(ptr)
    nbytes = count * np.dtype(dtype).itemsize
    if ptr and find_memory(ptr, nbytes) is not None:
        return device_buffer(ptr, dtype, count, stream), True
    return host_buffer(ptr, dtype, count), False


def host_values(obj, dtype, count: int) -> np.ndarray | None:
    """An array argument of the binding (``get_resource_ptr``): a numpy array of exactly the
    item size, a Python sequence, or an int pointer; NULL (0) gives None."""
    dtype = np.dtype(dtype)
    if isinstance(obj, DeviceArray):
        raise TypeError("a device array where the binding wants a host array or a pointer")
    if isinstance(obj, np.ndarray):
        assert obj.dtype.itemsize == dtype.itemsize
        assert obj.flags.c_contiguous, "the binding reads the array's memory as it lies"
        values = obj.reshape(-1).view(dtype)
    elif isinstance(obj, (list, tuple)):
        if dtype.kind == "i":
            obj = [operator.index(v) for v in obj]
        values = np.array(obj, dtype=dtype)
    else:
        ptr = _intptr(obj)
        if ptr == 0:
            return None
        values = host_buffer(ptr, dtype, count)
    if len(values) != count:
        raise AssertionError(f"{len(values)} values given where {count} are read")
    return values


def _uint32(value) -> int:
    value = operator.index(value)
    if not 0 <= value < 1 << 32:
        raise OverflowError(f"{value} does not fit uint32_t")
    return value


# --- cuStateVec --------------------------------------------------------------------------------


class _Handle:
    def __init__(self, device: int):
        self.device = device
        self.stream = 0
        self.mem_handler = None
        self.handler_sets = 0


class _Sampler:
    def __init__(self, handle: _Handle, state: np.ndarray, max_shots: int):
        self.handle, self.state, self.max_shots = handle, state, max_shots
        self.cumulative = None
        self.workspace = None  # (ptr, size) taken from the memory handler


class FakeCuStateVec:
    """The ``cuquantum.bindings.custatevec`` functions the backend calls.

    ``create_error``: "" (works), "cublas" (RuntimeError, as cuda.pathfinder raises when
    libcublas is missing), or a Status name (cuStateVecError, e.g. "ARCH_MISMATCH").
    """

    Pauli = Pauli
    MatrixLayout = MatrixLayout
    MatrixMapType = MatrixMapType
    SamplerOutput = SamplerOutput
    ComputeType = ComputeType
    Status = Status
    cuStateVecError = cuStateVecError

    def __init__(self, cupy: FakeCupy, create_error: str = ""):
        self._cupy = cupy
        self.create_error = create_error
        self.handles: dict[int, _Handle] = {}
        self.created = 0  # handles created, over the double's life
        self.destroyed: list[int] = []
        self.samplers: dict[int, _Sampler] = {}
        self.calls: list[str] = []
        self._pointers = itertools.count(0x1000)

    # handle, stream, memory handler

    def create(self):
        if self.create_error == "cublas":
            raise RuntimeError("Failure finding 'libcublas.so': no library found")
        if self.create_error:
            raise cuStateVecError(Status[self.create_error])
        handle = next(self._pointers)
        self.handles[handle] = _Handle(self._cupy.current_device)
        self.created += 1
        return handle

    def destroy(self, handle):
        self._handle(handle)
        del self.handles[handle]
        self.destroyed.append(handle)

    def set_stream(self, handle, stream_id):
        self._handle(handle).stream = _intptr(stream_id)

    def set_device_mem_handler(self, handle, handler):
        if not isinstance(handler, (list, tuple)) or len(handler) != 3:
            raise NotImplementedError("the double takes the (malloc, free, name) form only")
        assert callable(handler[0]) and callable(handler[1])
        if len(handler[2].encode("ascii")) > 64:
            raise ValueError("the handler name is too long")
        state = self._handle(handle)
        state.mem_handler = tuple(handler)
        state.handler_sets += 1

    # gates

    def apply_matrix(
        self,
        handle,
        sv,
        sv_data_type,
        n_index_bits,
        matrix,
        matrix_data_type,
        layout,
        adjoint,
        targets,
        n_targets,
        controls,
        control_bit_values,
        n_controls,
        compute_type,
        extra_workspace,
        extra_workspace_size_in_bytes,
    ):
        state = self._handle(handle)
        vectors = _state(sv, sv_data_type, n_index_bits, state.stream)
        _check_types(sv_data_type, matrix_data_type, compute_type)
        targets, controls, values = _bits(
            n_index_bits, targets, n_targets, controls, control_bit_values, n_controls
        )
        with self._workspace(state, n_targets, extra_workspace, extra_workspace_size_in_bytes):
            m = _matrices(matrix, matrix_data_type, layout, adjoint, n_targets, 1, state.stream)[0]
            _apply(vectors[0], m, targets, controls, values, compute_type)
        self.calls.append("apply_matrix")

    def apply_matrix_batched(
        self,
        handle,
        batched_sv,
        sv_data_type,
        n_index_bits,
        n_svs,
        sv_stride,
        map_type,
        matrix_indices,
        matrices,
        matrix_data_type,
        layout,
        adjoint,
        n_matrices,
        targets,
        n_targets,
        controls,
        control_bit_values,
        n_controls,
        compute_type,
        extra_workspace,
        extra_workspace_size_in_bytes,
    ):
        state = self._handle(handle)
        vectors = _state(
            batched_sv, sv_data_type, n_index_bits, state.stream, n_svs, sv_stride, aligned=True
        )
        _check_types(sv_data_type, matrix_data_type, compute_type)
        targets, controls, values = _bits(
            n_index_bits, targets, n_targets, controls, control_bit_values, n_controls
        )
        stack = _matrices(
            matrices, matrix_data_type, layout, adjoint, n_targets, n_matrices, state.stream
        )
        if MatrixMapType(map_type) is MatrixMapType.BROADCAST:
            indices = np.zeros(n_svs, dtype=np.int32)
        else:
            indices = host_values(matrix_indices, np.int32, n_svs)
            if indices is None:
                raise cuStateVecError(Status.INVALID_VALUE)
            assert np.all((indices >= 0) & (indices < n_matrices)), "matrix index out of range"
        with self._workspace(state, n_targets, extra_workspace, extra_workspace_size_in_bytes):
            for vector, index in zip(vectors, indices, strict=True):
                _apply(vector, stack[index], targets, controls, values, compute_type)
        self.calls.append("apply_matrix_batched")

    def apply_pauli_rotation(
        self,
        handle,
        sv,
        sv_data_type,
        n_index_bits,
        theta,
        paulis,
        targets,
        n_targets,
        controls,
        control_bit_values,
        n_controls,
    ):
        state = self._handle(handle)
        vectors = _state(sv, sv_data_type, n_index_bits, state.stream)
        if n_targets < 1:  # "at least one target and a corresponding Pauli basis"
            raise cuStateVecError(Status.INVALID_VALUE)
        codes = host_values(paulis, np.int32, n_targets)  # custatevecPauli_t is an int
        targets, controls, values = _bits(
            n_index_bits, targets, n_targets, controls, control_bit_values, n_controls
        )
        word = _word_matrix([Pauli(int(code)) for code in codes])
        rotation = np.cos(theta) * np.eye(len(word)) + 1j * np.sin(theta) * word
        compute = ComputeType.COMPUTE_32F if vectors.dtype == np.complex64 else None
        _apply(vectors[0], rotation, targets, controls, values, compute)
        self.calls.append("apply_pauli_rotation")

    def apply_generalized_permutation_matrix(
        self,
        handle,
        sv,
        sv_data_type,
        n_index_bits,
        permutation,
        diagonals,
        diagonals_data_type,
        adjoint,
        targets,
        n_targets,
        controls,
        control_bit_values,
        n_controls,
        extra_workspace,
        extra_workspace_size_in_bytes,
    ):
        state = self._handle(handle)
        vectors = _state(sv, sv_data_type, n_index_bits, state.stream)
        dim = 1 << n_targets
        table = host_values(permutation, np.int64, dim)
        diagonal_ptr = _intptr(diagonals)
        if table is None and diagonal_ptr == 0:
            raise cuStateVecError(Status.INVALID_VALUE)
        if (sv_data_type, diagonals_data_type) not in _VALID_TYPES:
            raise cuStateVecError(Status.INVALID_VALUE)
        d = (
            np.ones(dim)
            if diagonal_ptr == 0
            else any_buffer(diagonal_ptr, _SV_DTYPES[diagonals_data_type], dim, state.stream)[0]
        )
        targets, controls, values = _bits(
            n_index_bits, targets, n_targets, controls, control_bit_values, n_controls
        )
        # A = D P with (A psi)[r] = d[r] psi[table[r]]; the backend passes involutions only,
        # for which reading the table the other way gives the same matrix.
        matrix = np.zeros((dim, dim), dtype=np.complex128)
        rows = np.arange(dim)
        matrix[rows, rows if table is None else table] = d
        if adjoint:
            matrix = matrix.conj().T
        with self._workspace(state, n_targets, extra_workspace, extra_workspace_size_in_bytes):
            _apply(vectors[0], matrix, targets, controls, values, None)
        self.calls.append("apply_generalized_permutation_matrix")

    # expectations

    def compute_expectation(
        self,
        handle,
        sv,
        sv_data_type,
        n_index_bits,
        expectation_value,
        expectation_data_type,
        matrix,
        matrix_data_type,
        layout,
        basis_bits,
        n_basis_bits,
        compute_type,
        extra_workspace,
        extra_workspace_size_in_bytes,
    ):
        state = self._handle(handle)
        vectors = _state(sv, sv_data_type, n_index_bits, state.stream, aligned=True)
        _check_types(sv_data_type, matrix_data_type, compute_type)
        bits, _, _ = _bits(n_index_bits, basis_bits, n_basis_bits, 0, 0, 0)
        m = _matrices(matrix, matrix_data_type, layout, 0, n_basis_bits, 1, state.stream)[0]
        with self._workspace(state, n_basis_bits, extra_workspace, extra_workspace_size_in_bytes):
            value = _expectation(vectors[0], m, bits)
        if expectation_data_type == cudaDataType.CUDA_C_64F:
            host_buffer(expectation_value, np.complex128, 1)[0] = value
        elif expectation_data_type == cudaDataType.CUDA_R_64F:
            host_buffer(expectation_value, np.float64, 1)[0] = value.real
        else:
            raise cuStateVecError(Status.INVALID_VALUE)
        self._host_written(state)
        self.calls.append("compute_expectation")
        return 0.0  # the residual norm ("not available in this version"), not the value

    def compute_expectation_batched(
        self,
        handle,
        batched_sv,
        sv_data_type,
        n_index_bits,
        n_svs,
        sv_stride,
        expectation_values,
        matrices,
        matrix_data_type,
        layout,
        n_matrices,
        basis_bits,
        n_basis_bits,
        compute_type,
        extra_workspace,
        extra_workspace_size_in_bytes,
    ):
        state = self._handle(handle)
        vectors = _state(
            batched_sv, sv_data_type, n_index_bits, state.stream, n_svs, sv_stride, aligned=True
        )
        _check_types(sv_data_type, matrix_data_type, compute_type)
        bits, _, _ = _bits(n_index_bits, basis_bits, n_basis_bits, 0, 0, 0)
        stack = _matrices(
            matrices, matrix_data_type, layout, 0, n_basis_bits, n_matrices, state.stream
        )
        out, on_device = any_buffer(
            expectation_values, np.complex128, n_svs * n_matrices, state.stream
        )
        with self._workspace(state, n_basis_bits, extra_workspace, extra_workspace_size_in_bytes):
            for v, vector in enumerate(vectors):
                for m, matrix in enumerate(stack):
                    out[v * n_matrices + m] = _expectation(vector, matrix, bits)
        if not on_device:
            self._host_written(state)
        self.calls.append("compute_expectation_batched")

    def compute_expectations_on_pauli_basis(
        self,
        handle,
        sv,
        sv_data_type,
        n_index_bits,
        expectation_values,
        pauli_operators_array,
        n_pauli_operator_arrays,
        basis_bits_array,
        n_basis_bits_array,
    ):
        state = self._handle(handle)
        vectors = _state(sv, sv_data_type, n_index_bits, state.stream)
        if not all(isinstance(a, (list, tuple)) for a in pauli_operators_array):
            raise NotImplementedError("the double takes nested Python sequences only")
        lengths = host_values(n_basis_bits_array, np.uint32, n_pauli_operator_arrays)
        out = host_buffer(expectation_values, np.float64, n_pauli_operator_arrays)
        for k in range(n_pauli_operator_arrays):
            count = int(lengths[k])
            codes = host_values(list(pauli_operators_array[k]), np.int32, count)
            bits, _, _ = _bits(n_index_bits, list(basis_bits_array[k]), count, 0, 0, 0)
            word = _word_matrix([Pauli(int(code)) for code in codes])
            out[k] = _expectation(vectors[0], word, bits).real
        self._host_written(state)
        self.calls.append("compute_expectations_on_pauli_basis")

    # probabilities

    def abs2sum_array(
        self,
        handle,
        sv,
        sv_data_type,
        n_index_bits,
        abs2sum,
        bit_ordering,
        bit_ordering_len,
        mask_bit_string,
        mask_ordering,
        mask_len,
    ):
        state = self._handle(handle)
        vectors = _state(sv, sv_data_type, n_index_bits, state.stream)
        ordering, mask_bits, mask_values = _bits(
            n_index_bits, bit_ordering, bit_ordering_len, mask_ordering, mask_bit_string, mask_len
        )
        out, on_device = any_buffer(abs2sum, np.float64, 1 << bit_ordering_len, state.stream)
        out[:] = _abs2sum(vectors[0], ordering, mask_bits, mask_values)
        if not on_device:
            self._host_written(state)
        self.calls.append("abs2sum_array")

    def abs2sum_array_batched(
        self,
        handle,
        batched_sv,
        sv_data_type,
        n_index_bits,
        n_svs,
        sv_stride,
        abs2sum_arrays,
        abs2sum_array_stride,
        bit_ordering,
        bit_ordering_len,
        mask_bit_strings,
        mask_ordering,
        mask_len,
    ):
        state = self._handle(handle)
        vectors = _state(
            batched_sv, sv_data_type, n_index_bits, state.stream, n_svs, sv_stride, aligned=True
        )
        ordering, mask_bits, _ = _bits(
            n_index_bits, bit_ordering, bit_ordering_len, mask_ordering, 0, mask_len
        )
        strings = host_values(mask_bit_strings, np.int64, n_svs) if mask_len else None
        size = 1 << bit_ordering_len
        assert abs2sum_array_stride >= size, "abs2sum_array_stride is below the array size"
        out, on_device = any_buffer(
            abs2sum_arrays, np.float64, (n_svs - 1) * abs2sum_array_stride + size, state.stream
        )
        for v, vector in enumerate(vectors):
            values = [] if strings is None else [(strings[v] >> j) & 1 for j in range(mask_len)]
            start = v * abs2sum_array_stride
            out[start : start + size] = _abs2sum(vector, ordering, mask_bits, values)
        if not on_device:
            self._host_written(state)
        self.calls.append("abs2sum_array_batched")

    # sampler

    def sampler_create(self, handle, sv, sv_data_type, n_index_bits, n_max_shots):
        state = self._handle(handle)
        vectors = _state(sv, sv_data_type, n_index_bits, state.stream)
        sampler = next(self._pointers)
        self.samplers[sampler] = _Sampler(state, vectors[0], _uint32(n_max_shots))
        return sampler, 1 << 10  # the workspace size

    def sampler_preprocess(self, handle, sampler, extra_workspace, extra_workspace_size_in_bytes):
        state = self._handle(handle)
        entry = self.samplers[_intptr(sampler)]
        if _intptr(extra_workspace) == 0:
            if state.mem_handler is None:
                raise cuStateVecError(Status.INSUFFICIENT_WORKSPACE)
            entry.workspace = (state.mem_handler[0](1 << 10, state.stream), 1 << 10)
        elif extra_workspace_size_in_bytes < 1 << 10:
            raise cuStateVecError(Status.INSUFFICIENT_WORKSPACE)
        entry.cumulative = np.cumsum(np.abs(entry.state.astype(np.complex128)) ** 2)

    def sampler_sample(
        self,
        handle,
        sampler,
        bit_strings,
        bit_ordering,
        bit_string_len,
        randnums,
        n_shots,
        output,
    ):
        state = self._handle(handle)
        entry = self.samplers[_intptr(sampler)]
        if entry.cumulative is None:
            raise cuStateVecError(Status.SAMPLER_NOT_PREPROCESSED)
        if n_shots > entry.max_shots:
            raise cuStateVecError(Status.INVALID_VALUE)
        n_index_bits = len(entry.state).bit_length() - 1
        ordering, _, _ = _bits(n_index_bits, bit_ordering, bit_string_len, 0, 0, 0)
        draws = np.clip(host_values(randnums, np.float64, n_shots), 0.0, np.nextafter(1.0, 0.0))
        # The random numbers are scaled by the squared norm: unnormalised states sample right.
        indices = np.searchsorted(entry.cumulative, draws * entry.cumulative[-1], side="right")
        indices = np.minimum(indices, len(entry.state) - 1)
        strings = sum(((indices >> bit) & 1) << j for j, bit in enumerate(ordering))
        if SamplerOutput(output) is SamplerOutput.ASCENDING_ORDER:
            strings = np.sort(strings)
        host_buffer(bit_strings, np.int64, n_shots)[:] = strings
        self._host_written(state)
        assert entry.handle is state
        self.calls.append("sampler_sample")

    def sampler_destroy(self, sampler):
        entry = self.samplers.pop(_intptr(sampler))
        if entry.workspace is not None:
            ptr, size = entry.workspace
            entry.handle.mem_handler[1](ptr, size, entry.handle.stream)

    # bookkeeping

    def _handle(self, handle) -> _Handle:
        state = self.handles.get(_intptr(handle))
        if state is None:
            raise cuStateVecError(Status.NOT_INITIALIZED)
        if state.device != self._cupy.current_device:
            raise AssertionError(
                f"handle of GPU {state.device} used while GPU {self._cupy.current_device} "
                "is current"
            )
        return state

    def _host_written(self, state: _Handle) -> None:
        """A call that wrote host memory returns once its stream's work is done."""
        wait_for(state.stream)
        self._cupy.synchronizations += 1

    @contextlib.contextmanager
    def _workspace(self, state: _Handle, n_targets: int, extra_workspace, size):
        """Large operators need extra workspace: given, or (NULL) from the memory handler,
        taken and given back on the handle's stream."""
        if n_targets <= CONTEXT_WORKSPACE_TARGETS or _intptr(extra_workspace):
            yield
            return
        if state.mem_handler is None:
            raise cuStateVecError(Status.INSUFFICIENT_WORKSPACE)
        malloc, free, _ = state.mem_handler
        ptr = malloc(1 << 12, state.stream)
        try:
            yield
        finally:
            free(ptr, 1 << 12, state.stream)


def _state(
    ptr, sv_data_type, n_index_bits, stream: int, n_svs=1, sv_stride=None, aligned=False
) -> np.ndarray:
    """The state vectors at a device pointer, (n_svs, 2**n) with the given element stride,
    used on ``stream``; ``aligned``: each vector must start on a 128-byte boundary."""
    dtype = _SV_DTYPES.get(sv_data_type)
    if dtype is None:
        raise cuStateVecError(Status.INVALID_VALUE)
    dim = 1 << _uint32(n_index_bits)
    stride = dim if sv_stride is None else sv_stride
    if stride < dim:
        raise cuStateVecError(Status.INVALID_VALUE)
    flat = device_buffer(ptr, dtype, (_uint32(n_svs) - 1) * stride + dim, stream)
    if aligned and (
        _intptr(ptr) % VECTOR_ALIGNMENT or (n_svs > 1 and stride * flat.itemsize % VECTOR_ALIGNMENT)
    ):
        raise cuStateVecError(
            Status.INVALID_VALUE,
            f"state vectors at {_intptr(ptr):#x}, stride {stride * flat.itemsize} bytes, are not "
            f"{VECTOR_ALIGNMENT}-byte aligned (required on Blackwell)",
        )
    return np.lib.stride_tricks.as_strided(
        flat, shape=(n_svs, dim), strides=(stride * flat.itemsize, flat.itemsize)
    )


def _check_types(sv_data_type, matrix_data_type, compute_type) -> None:
    if _VALID_TYPES.get((sv_data_type, matrix_data_type)) != compute_type:
        raise cuStateVecError(Status.INVALID_VALUE)


def _matrices(
    ptr, matrix_data_type, layout, adjoint, n_targets, n_matrices, stream: int
) -> np.ndarray:
    """Square matrices in one chunk of host or device memory, as row-major complex128."""
    dim = 1 << n_targets
    flat, _ = any_buffer(ptr, _SV_DTYPES[matrix_data_type], n_matrices * dim * dim, stream)
    stack = flat.reshape(n_matrices, dim, dim).astype(np.complex128)
    if MatrixLayout(layout) is MatrixLayout.COL:
        stack = stack.transpose(0, 2, 1)
    return stack.conj().transpose(0, 2, 1) if adjoint else stack


def _bits(n_index_bits, targets, n_targets, controls, control_bit_values, n_controls):
    """Validated (targets, controls, control values); NULL control values mean all ones."""
    targets = host_values(targets, np.int32, n_targets)
    controls = host_values(controls, np.int32, n_controls)
    values = host_values(control_bit_values, np.int32, n_controls)
    if targets is None:
        if n_targets:
            raise cuStateVecError(Status.INVALID_VALUE)
        targets = []
    targets = [int(t) for t in targets]
    if controls is None:
        if n_controls:
            raise cuStateVecError(Status.INVALID_VALUE)
        controls = []
    controls = [int(c) for c in controls]
    values = [1] * len(controls) if values is None else [int(v) for v in values]
    every = targets + controls
    if len(set(every)) != len(every) or not all(0 <= b < n_index_bits for b in every):
        raise cuStateVecError(Status.INVALID_VALUE)
    return targets, controls, values


def _blocks(dim: int, targets, controls, values) -> np.ndarray:
    """Rows (one per index with the targets clear and the controls at their values) of the
    indices a 2**k x 2**k matrix mixes: column a sets bit j of a on state bit targets[j]."""
    index = np.arange(dim)
    keep = (index & sum(1 << t for t in targets)) == 0
    for control, value in zip(controls, values, strict=True):
        keep &= ((index >> control) & 1) == value
    offsets = np.array(
        [sum(((a >> j) & 1) << t for j, t in enumerate(targets)) for a in range(1 << len(targets))]
    )
    return index[keep][:, None] | offsets[None, :]


def _apply(vector, matrix, targets, controls, values, compute_type) -> None:
    """vector <- M vector in place; COMPUTE_32F rounds the matrix to single precision."""
    if compute_type == ComputeType.COMPUTE_32F:
        matrix = matrix.astype(np.complex64)
    rows = _blocks(len(vector), targets, controls, values)
    vector[rows] = vector[rows] @ matrix.T


def _expectation(vector, matrix, bits) -> complex:
    applied = np.array(vector, dtype=np.complex128)
    _apply(applied, matrix, bits, [], [], None)
    return complex(np.vdot(vector.astype(np.complex128), applied))


def _word_matrix(codes) -> np.ndarray:
    """Pauli code j acts on bit j of the matrix index (the rightmost Kronecker factor)."""
    matrix = np.ones((1, 1), dtype=np.complex128)
    for code in codes:
        matrix = np.kron(PAULI_2X2[code], matrix)
    return matrix


def _abs2sum(vector, ordering, mask_bits, mask_values) -> np.ndarray:
    """Sums of |amplitude|**2 by the bits ``ordering`` (bit j of the output index is state
    bit ordering[j]) over the indices whose mask bits hold their values."""
    index = np.arange(len(vector))
    keep = np.ones(len(vector), dtype=bool)
    for bit, value in zip(mask_bits, mask_values, strict=True):
        keep &= ((index >> bit) & 1) == value
    outcome = sum(((index >> bit) & 1) << j for j, bit in enumerate(ordering))
    outcome = np.broadcast_to(outcome, index.shape)
    probabilities = np.abs(vector.astype(np.complex128)) ** 2
    return np.bincount(outcome[keep], probabilities[keep], minlength=1 << len(ordering))


def make_libraries(**cupy_options) -> Libraries:
    """A double of cupy and cuStateVec for ``CuStateVecBackend(libraries=...)``; keyword
    options go to :class:`FakeCupy`, except ``create_error`` for :class:`FakeCuStateVec`."""
    create_error = cupy_options.pop("create_error", "")
    cupy = FakeCupy(**cupy_options)
    return Libraries(cupy, FakeCuStateVec(cupy, create_error), cudaDataType)
