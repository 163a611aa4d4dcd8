"""A NumPy double of the cupy subset the cuStateVec backend uses, as strict as cupy and a GPU
where a mistake would pass on numpy and fail (or race) on a GPU.

* **Device memory** is :class:`DeviceArray`, a wrapper of numpy memory that is *not* a
  numpy array: like a cupy array it has ``.data.ptr``, refuses implicit conversion to
  numpy (``__array__`` raises TypeError with cupy's message, so ``np.asarray``,
  ``np.array`` and numpy functions fed a mix of both refuse it) and refuses host arrays
  in its arithmetic; ``asnumpy``/``.get()`` are the explicit reads. Allocations are
  256-byte aligned, as cudaMalloc's and cupy's pool's are.
* **Streams**: every operation runs on the current stream (the null stream, 0, unless a
  :class:`FakeStream` is entered). An allocation remembers the stream whose work on it
  the host has not waited for; an operation on another stream (a non-blocking stream and
  the null stream do not wait for each other), a host read on another stream, or an
  outside reader of its memory (``__cuda_array_interface__``: CUDA-aware MPI reads the
  memory without any stream order) raises :class:`StreamRaceError`. Work is waited for
  by ``Stream.synchronize``, ``Device.synchronize`` and a blocking host read
  (``asnumpy``, ``.get()``, ``float()``...) on that stream; each counts in
  ``synchronizations``.
* **Records**: allocations (bytes, stream), the stream-ordered pool's calls, streams,
  pinned host allocations and the copies through them, release thresholds; ``gpus=0``
  pretends no GPU is visible, ``driver_error`` makes the device count raise,
  ``free_bytes`` is what memGetInfo reports and the limit of an allocation.

``tests/custatevec_double.py`` resolves the library's pointers through :func:`find_memory`
and orders its calls on the handle's stream with :func:`touch`.
"""

from __future__ import annotations

import ctypes
import itertools
import types
import weakref
from collections.abc import Callable

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

ALIGNMENT = 256
"""Bytes an allocation's start is a multiple of (cudaMalloc; cupy's pool rounds to 512)."""
NULL_STREAM = 0

_allocations: dict[int, weakref.ref] = {}
"""Every live allocation of every double, by id: pointers are real addresses, unique."""
_blocking_streams: set[int] = {NULL_STREAM}
"""Streams made without non_blocking: they and the null stream wait for each other."""


class StreamRaceError(AssertionError):
    """Device memory used on a stream, or read by the host or an outside reader, while
    another stream's work on it has not been waited for: a race on a GPU."""


class _Allocation:
    """One allocation: ``nbytes`` aligned bytes, and the stream with pending work on it."""

    def __init__(self, nbytes: int):
        raw = np.zeros(nbytes + ALIGNMENT, dtype=np.uint8)
        offset = (-raw.ctypes.data) % ALIGNMENT
        self.bytes = raw[offset : offset + nbytes]
        self.start = self.bytes.ctypes.data
        self.pending: int | None = None
        key = id(self)
        _allocations[key] = weakref.ref(self, lambda _, key=key: _allocations.pop(key, None))


def find_memory(ptr: int, nbytes: int) -> tuple[_Allocation, np.ndarray] | None:
    """(allocation, uint8 view of ``nbytes`` at ``ptr``), or None if not device memory."""
    for ref in list(_allocations.values()):
        allocation = ref()
        if allocation is None:
            continue
        start = allocation.start
        if start <= ptr and ptr + nbytes <= start + allocation.bytes.size:
            return allocation, allocation.bytes[ptr - start : ptr - start + nbytes]
    return None


def _ordered(first: int, second: int) -> bool:
    """Whether work on stream ``second`` waits for work on stream ``first``."""
    return first == second or (first in _blocking_streams and second in _blocking_streams)


def touch(allocation: _Allocation, stream: int, what: str = "used") -> None:
    """Work on ``allocation`` enqueued on ``stream``: refused where another stream's work
    on it is pending (a race), then pending on ``stream``."""
    if allocation.pending is not None and not _ordered(allocation.pending, stream):
        raise StreamRaceError(
            f"device memory {what} on stream {stream:#x} while stream "
            f"{allocation.pending:#x}'s work on it has not been waited for: synchronise "
            "that stream first, or run on it"
        )
    allocation.pending = stream


def wait_for(stream: int | None) -> None:
    """The host waits for ``stream``'s work (None: every stream's, a device synchronise)."""
    for ref in list(_allocations.values()):
        allocation = ref()
        if allocation is not None and (stream is None or allocation.pending == stream):
            allocation.pending = None


class _MemoryPointer:
    def __init__(self, ptr: int):
        self.ptr = ptr


IMPLICIT_CONVERSION = (
    "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a "
    "NumPy array explicitly."
)
"""cupy's message (cupy/_core/core.pyx, ndarray.__array__)."""


class DeviceArray(NDArrayOperatorsMixin):
    """GPU memory stand-in (see the module's text): a view of an allocation's bytes."""

    __array_priority__ = 1000  # a numpy array on the left defers to us (and is refused)

    def __init__(
        self,
        cupy: FakeCupy,
        allocation: _Allocation,
        view: np.ndarray,
        base: DeviceArray | None = None,
    ):
        self._cupy, self._allocation, self._view = cupy, allocation, view
        self.base = base  # as cupy's: the array a view was made from (kept alive by it)

    # --- what it is -------------------------------------------------------------------

    shape = property(lambda self: self._view.shape)
    dtype = property(lambda self: self._view.dtype)
    ndim = property(lambda self: self._view.ndim)
    size = property(lambda self: self._view.size)
    nbytes = property(lambda self: self._view.nbytes)
    itemsize = property(lambda self: self._view.itemsize)
    strides = property(lambda self: self._view.strides)
    flags = property(lambda self: self._view.flags)
    data = property(lambda self: _MemoryPointer(self._view.ctypes.data))
    T = property(lambda self: self._derived(self._view.T))
    real = property(lambda self: self._derived(self._view.real))
    imag = property(lambda self: self._derived(self._view.imag))

    def __len__(self) -> int:
        return len(self._view)

    def __repr__(self) -> str:  # no stream check: a debugging aid, not a read
        return f"DeviceArray({self._view!r})"

    @property
    def __cuda_array_interface__(self) -> dict:
        """What a CUDA-aware reader (mpi4py) takes: it reads the memory outside any stream,
        so every stream's work on it must have been waited for."""
        if self._allocation.pending is not None:
            raise StreamRaceError(
                "device memory read by an outside reader (CUDA-aware MPI) while stream "
                f"{self._allocation.pending:#x}'s work on it has not been waited for: "
                "synchronise the stream first"
            )
        view = self._view
        return {
            "shape": view.shape,
            "typestr": view.dtype.str,
            "data": (view.ctypes.data, False),
            "version": 3,
            "strides": None if view.flags.c_contiguous else view.strides,
        }

    # --- conversions: explicit only ---------------------------------------------------

    def __array__(self, dtype=None, copy=None):
        raise TypeError(IMPLICIT_CONVERSION)

    def get(self, stream=None, order="C", out=None, blocking=True) -> np.ndarray:
        return self._cupy.asnumpy(self, stream=stream, order=order, out=out, blocking=blocking)

    def set(self, arr: np.ndarray, stream=None) -> None:
        """Host to device (cupy's ndarray.set): same shape, on ``stream`` or the current."""
        if isinstance(arr, DeviceArray) or np.shape(arr) != self.shape:
            raise ValueError("set() takes a host array of the same shape")
        touch(self._allocation, self._cupy._stream_of(stream), "written")
        self._view[...] = arr

    def item(self):
        return self.get().item()

    def tolist(self):
        return self.get().tolist()

    def __float__(self) -> float:
        return float(self.get())

    def __complex__(self) -> complex:
        return complex(self.get())

    def __int__(self) -> int:
        return int(self.get())

    def __bool__(self) -> bool:
        return bool(self.get())

    # --- views and copies -------------------------------------------------------------

    def _derived(self, view: np.ndarray) -> DeviceArray:
        """``view`` of our memory as a DeviceArray, or a new allocation if numpy copied."""
        if np.shares_memory(view, self._allocation.bytes):
            return DeviceArray(
                self._cupy, self._allocation, view, self.base if self.base is not None else self
            )
        self._cupy._enqueue([self], "read")
        return self._cupy._adopt(view)

    def __getitem__(self, key) -> DeviceArray:
        return self._derived(self._view[self._cupy._index(key)])

    def __setitem__(self, key, value) -> None:
        key = self._cupy._index(key)
        if isinstance(value, DeviceArray):
            self._cupy._enqueue([value], "read")
            value = value._view
        self._cupy._enqueue([self], "written")
        self._view[key] = value  # a host value: an implicit host-to-device copy, as cupy

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def reshape(self, *shape, order="C") -> DeviceArray:
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return self._derived(self._view.reshape(shape, order=order))

    def transpose(self, *axes) -> DeviceArray:
        return self._derived(self._view.transpose(*axes))

    def swapaxes(self, first: int, second: int) -> DeviceArray:
        return self._derived(self._view.swapaxes(first, second))

    def ravel(self, order="C") -> DeviceArray:
        return self._derived(self._view.ravel(order))

    def view(self, dtype) -> DeviceArray:
        return self._derived(self._view.view(dtype))

    def copy(self, order="C") -> DeviceArray:
        self._cupy._enqueue([self], "read")
        return self._cupy._adopt(self._view.copy(order=order))

    def astype(self, dtype, copy=True) -> DeviceArray:
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        self._cupy._enqueue([self], "read")
        return self._cupy._adopt(self._view.astype(dtype))

    def conj(self) -> DeviceArray:
        return np.conj(self)

    conjugate = conj

    def fill(self, value) -> None:
        self._cupy._enqueue([self], "written")
        self._view.fill(value)

    def sum(self, *args, **kwargs):
        return self._cupy._call(np.sum, (self, *args), kwargs)

    # --- arithmetic and numpy functions: device arrays only ---------------------------

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        if out is not None:
            kwargs["out"] = out
        return self._cupy._call(getattr(ufunc, method), inputs, kwargs)

    def __array_function__(self, func, types_, args, kwargs):
        return self._cupy._call(func, args, kwargs)


def _pinned_memory(size: int):
    """cupy's PinnedMemoryPointer: ``.ptr``, ``.size`` and a buffer that numpy.frombuffer
    reads (page-locked host memory on a GPU; a ctypes array here)."""
    memory = (ctypes.c_uint8 * max(size, 1))()
    memory.ptr = ctypes.addressof(memory)
    memory.size = size
    return memory


# --- cupy ----------------------------------------------------------------------------------


class CUDARuntimeError(RuntimeError):
    pass


class OutOfMemoryError(MemoryError):
    pass


class _MemoryPool:
    def free_bytes(self) -> int:
        return 0


NUMPY_FUNCTIONS = (
    "conj",
    "matmul",
    "cumsum",
    "searchsorted",
    "minimum",
    "multiply",
    "vdot",
    "stack",
    "exp",
    "abs",
)
"""The cupy functions the double has, each numpy's on device arrays (host arrays refused)."""


class FakeCupy:
    """The cupy subset the backend uses, on numpy; records what it was asked to do."""

    def __init__(self, *, gpus: int = 1, free_bytes: int = 1 << 34, driver_error: str = ""):
        self.gpus, self.free_bytes, self.driver_error = gpus, free_bytes, driver_error
        self.current_device = 0
        self.current_stream = NULL_STREAM
        self.allocations: list[tuple[int, int]] = []  # (bytes, stream ptr) of new arrays
        self.pool_allocations: dict[int, _Allocation] = {}
        self.pool_calls: list[tuple] = []
        self.streams: list[FakeStream] = []
        self.synchronizations = 0
        self.release_thresholds: dict[int, int] = {}  # GPU -> its pool's release threshold
        self.pool_trims: list[tuple[int, int]] = []  # (GPU, bytes kept) per memPoolTrimTo
        self.pinned_allocations = 0
        self.pinned_copies = 0  # device-to-host reads into pinned memory
        self._pinned: list = []
        cupy = self
        self.cuda = types.SimpleNamespace(
            is_available=lambda: cupy.gpus > 0 and not cupy.driver_error,
            Device=lambda device=None: FakeDevice(cupy, device),
            Stream=lambda non_blocking=False: FakeStream(cupy, non_blocking),
            alloc_pinned_memory=self._alloc_pinned,
            runtime=types.SimpleNamespace(
                CUDARuntimeError=CUDARuntimeError,
                getDeviceCount=self._device_count,
                memGetInfo=lambda: (cupy.free_bytes, 1 << 35),
                mallocAsync=self._malloc_async,
                freeAsync=self._free_async,
                cudaMemPoolAttrReleaseThreshold=4,  # the value of CUDA's enum
                deviceGetDefaultMemPool=self._default_pool,
                memPoolSetAttribute=self._set_pool_attribute,
                memPoolTrimTo=self._trim_pool,
            ),
            memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
        )
        self._pool = _MemoryPool()
        for name in NUMPY_FUNCTIONS:
            setattr(self, name, self._device_function(getattr(np, name)))

    # --- the driver and the pool ------------------------------------------------------

    def _device_count(self) -> int:
        if self.driver_error:
            raise CUDARuntimeError(self.driver_error)
        return self.gpus

    def _default_pool(self, device: int) -> int:
        if not 0 <= device < self.gpus:
            raise CUDARuntimeError(f"cudaErrorInvalidDevice: device {device}")
        return 0x7000 + device

    def _set_pool_attribute(self, pool: int, attribute: int, value: int) -> None:
        if attribute != self.cuda.runtime.cudaMemPoolAttrReleaseThreshold:
            raise NotImplementedError("the double models the release threshold only")
        if not 0 <= value < 1 << 64:
            raise OverflowError(f"{value} does not fit cuuint64_t")
        self.release_thresholds[pool - 0x7000] = value

    def _trim_pool(self, pool: int, keep: int) -> None:
        if not 0x7000 <= pool < 0x7000 + self.gpus:
            raise CUDARuntimeError(f"cudaErrorInvalidValue: memory pool {pool:#x}")
        self.pool_trims.append((pool - 0x7000, keep))

    def _malloc_async(self, size: int, stream: int) -> int:
        allocation = _Allocation(size)
        allocation.pending = stream  # ready in stream order
        self.pool_allocations[allocation.start] = allocation
        self.pool_calls.append(("malloc", size, stream))
        return allocation.start

    def _free_async(self, ptr: int, stream: int) -> None:
        allocation = self.pool_allocations.pop(ptr)
        touch(allocation, stream, "freed")
        self.pool_calls.append(("free", ptr, stream))

    def _alloc_pinned(self, size: int):
        memory = _pinned_memory(size)
        self._pinned.append(memory)
        self.pinned_allocations += 1
        return memory

    def get_default_memory_pool(self) -> _MemoryPool:
        return self._pool

    # --- streams ----------------------------------------------------------------------

    def _stream_of(self, stream) -> int:
        return self.current_stream if stream is None else stream.ptr

    def _enqueue(self, arrays, what: str) -> None:
        for array in arrays:
            touch(array._allocation, self.current_stream, what)

    def _synchronized(self, stream: int | None) -> None:
        wait_for(stream)
        self.synchronizations += 1

    # --- arrays -----------------------------------------------------------------------

    def _new(self, shape, dtype) -> DeviceArray:
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes > self.free_bytes:
            raise OutOfMemoryError(f"Out of memory allocating {nbytes:,} bytes")
        self.allocations.append((nbytes, self.current_stream))
        allocation = _Allocation(nbytes)
        view = allocation.bytes.view(dtype).reshape(shape) if nbytes else np.empty(shape, dtype)
        return DeviceArray(self, allocation, view)

    def _adopt(self, values) -> DeviceArray:
        """New device memory holding ``values`` (written on the current stream)."""
        values = np.asarray(values)
        array = self._new(values.shape, values.dtype)
        touch(array._allocation, self.current_stream, "written")
        array._view[...] = values
        return array

    def _index(self, key):
        """An index with device arrays in it made numpy's (cupy takes both)."""
        if isinstance(key, tuple):
            return tuple(self._index(k) for k in key)
        if isinstance(key, DeviceArray):
            self._enqueue([key], "read")
            return key._view
        return key

    def _unwrapped(self, value, found: list):
        if isinstance(value, DeviceArray):
            found.append(value)
            return value._view
        if isinstance(value, np.ndarray):
            raise TypeError(f"Unsupported type {type(value)}: a host array in a device operation")
        if isinstance(value, (list, tuple)):
            return type(value)(self._unwrapped(v, found) for v in value)
        return value

    def _call(self, function: Callable, args, kwargs):
        """``function`` (a numpy function or ufunc method) on device arrays, on the current
        stream; results that are new memory become new device arrays, views stay views."""
        found: list[DeviceArray] = []
        args = self._unwrapped(tuple(args), found)
        kwargs = {key: self._unwrapped(value, found) for key, value in kwargs.items()}
        outputs = kwargs.get("out")
        self._enqueue(found, "used")
        result = function(*args, **kwargs)
        if outputs is not None:
            return outputs[0] if isinstance(outputs, tuple) and len(outputs) == 1 else outputs
        return self._wrapped(result, found)

    def _wrapped(self, result, sources: list[DeviceArray]):
        if isinstance(result, tuple):
            return tuple(self._wrapped(r, sources) for r in result)
        if isinstance(result, np.ndarray):
            for source in sources:
                if np.shares_memory(result, source._allocation.bytes):
                    return DeviceArray(
                        self,
                        source._allocation,
                        result,
                        source.base if source.base is not None else source,
                    )
            return self._adopt(result)
        if isinstance(result, np.generic):
            return self._adopt(result)  # cupy's reductions give 0-d arrays
        return result

    def _device_function(self, function: Callable) -> Callable:
        def on_device(*args, **kwargs):
            return self._call(function, args, kwargs)

        on_device.__name__ = function.__name__
        return on_device

    def zeros(self, shape, dtype=float) -> DeviceArray:
        array = self._new(shape, dtype)
        touch(array._allocation, self.current_stream, "written")  # a memset kernel
        return array

    def empty(self, shape, dtype=float) -> DeviceArray:
        return self._new(shape, dtype)  # no kernel: no stream work

    def empty_like(self, array: DeviceArray) -> DeviceArray:
        return self.empty(array.shape, array.dtype)

    def asarray(self, values, dtype=None) -> DeviceArray:
        if isinstance(values, DeviceArray):
            return values if dtype is None else values.astype(dtype, copy=False)
        return self._adopt(np.asarray(values, dtype=dtype))

    def ascontiguousarray(self, array: DeviceArray) -> DeviceArray:
        return array if array.flags.c_contiguous else array.copy()

    def asnumpy(self, array, stream=None, order="C", out=None, blocking=True) -> np.ndarray:
        """A host copy, on ``stream`` or the current one; ``blocking`` (cupy's default)
        waits for that stream."""
        if not isinstance(array, DeviceArray):
            return np.asarray(array)
        if not blocking:
            raise NotImplementedError("the double copies to the host blocking only")
        on = self._stream_of(stream)
        touch(array._allocation, on, "read by the host")
        self._synchronized(on)
        if out is None:
            return np.array(array._view, order=order)
        if out.shape != array.shape or out.dtype != array.dtype:
            raise ValueError("asnumpy: out must have the array's shape and dtype")
        if any(np.shares_memory(out, np.frombuffer(m, np.uint8)) for m in self._pinned):
            self.pinned_copies += 1
        out[...] = array._view
        return out

    def concatenate(self, arrays, axis=0) -> DeviceArray:
        """New device memory joining device arrays (cupy refuses anything else)."""
        arrays = list(arrays)
        if not arrays:
            raise ValueError("Cannot concatenate from empty tuple")
        if not all(isinstance(array, DeviceArray) for array in arrays):
            raise TypeError("Only cupy arrays can be concatenated")
        return self._call(np.concatenate, (arrays,), {"axis": axis})


class FakeDevice:
    def __init__(self, cupy: FakeCupy, device: int | None):
        self._cupy = cupy
        self.id = cupy.current_device if device is None else device
        self._previous: list[int] = []

    def __enter__(self):
        if not 0 <= self.id < self._cupy.gpus:
            raise CUDARuntimeError(f"cudaErrorInvalidDevice: device {self.id}")
        self._previous.append(self._cupy.current_device)
        self._cupy.current_device = self.id
        return self

    def __exit__(self, *exc):
        self._cupy.current_device = self._previous.pop()

    def synchronize(self) -> None:
        self._cupy._synchronized(None)


class FakeStream:
    _pointers = itertools.count(0x5000)

    def __init__(self, cupy: FakeCupy, non_blocking: bool = False):
        self._cupy = cupy
        self.ptr = next(self._pointers)
        self.device_id = cupy.current_device
        self.non_blocking = non_blocking
        if not non_blocking:
            _blocking_streams.add(self.ptr)
        self._previous: list[int] = []
        cupy.streams.append(self)

    def __enter__(self):
        self._previous.append(self._cupy.current_stream)
        self._cupy.current_stream = self.ptr
        return self

    def __exit__(self, *exc):
        self._cupy.current_stream = self._previous.pop()

    def synchronize(self) -> None:
        self._cupy._synchronized(self.ptr)
