"""The process's GPUs: cupy and cuStateVec's bindings, the probe that says whether they can
run here, and one cuStateVec handle and stream per GPU, shared by every backend of the
process on that GPU.

Importing the package never imports cupy or cuQuantum: :func:`import_libraries` does, when
a backend is built or probed, and tests replace that one function with a NumPy double of
the library (``tests/custatevec_double.py``).

A handle costs a ``create()`` (cuBLAS handles, a workspace) and a stream: PennyLane's
test suites and training loops build hundreds of devices, so :func:`gpu_context` gives
every backend on a GPU the one :class:`GPUContext` of that GPU, made at the first use and
destroyed at exit (``atexit``). Its memory handler takes workspaces from the GPU's
stream-ordered pool (``cudaMallocAsync``), whose release threshold is raised to the
maximum, as NVIDIA's ``memory_handler.py`` sample does: at the default of 0 the pool
gives its memory back to the driver at every synchronisation, and every workspace after a
host read came from the driver again. Backends on one GPU share its stream, so that their
work is ordered; calls from several threads take the context's lock in turn (a handle is
not for concurrent use).
"""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import functools
import importlib.util
import os
import threading
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Libraries:
    """What the backend uses: ``cupy``, ``cuquantum.bindings.custatevec`` and
    ``cuquantum.cudaDataType``."""

    cupy: Any
    custatevec: Any
    cuda_data_type: Any


class NoUsableGPU(Exception):  # noqa: N818 - a reason, not an error: the probe returns it
    """The NVIDIA driver sees no usable GPU (the message says why)."""


def import_libraries() -> Libraries:
    """Import cupy and cuStateVec's bindings (the seam that tests replace with a double).

    On a machine whose NVIDIA driver sees no GPU, nothing is imported: a missing package
    raises ``ModuleNotFoundError`` (found without importing), a missing GPU
    :class:`NoUsableGPU` (asked of the driver's own library, ``driver_problem``). Importing
    cupy and cuQuantum to find that out cost about 230 MiB of resident memory (their CUDA
    libraries) on a CPU-only machine (measured: 523 -> 749 MiB at the first device)."""
    for package in ("cupy", "cuquantum"):
        if importlib.util.find_spec(package) is None:
            raise ModuleNotFoundError(f"No module named {package!r}", name=package)
    problem = driver_problem()
    if problem is not None:
        raise NoUsableGPU(problem)
    import cupy
    from cuquantum import cudaDataType
    from cuquantum.bindings import custatevec

    return Libraries(cupy, custatevec, cudaDataType)


_CUDA_SUCCESS = 0
_CUDA_ERROR_NO_DEVICE = 100


def driver_problem() -> str | None:
    """Why the NVIDIA driver gives no usable GPU, or None where it sees one: the driver's
    library (``libcuda.so.1``, loaded with ctypes) is missing, ``cuInit`` fails, or it
    counts no device (``CUDA_VISIBLE_DEVICES`` hides them all)."""
    check = "check the NVIDIA driver (nvidia-smi) and CUDA_VISIBLE_DEVICES"
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return f"no CUDA GPU is usable (no NVIDIA driver: {exc}); {check}"
    status = cuda.cuInit(0)
    count = ctypes.c_int(0)
    if status == _CUDA_SUCCESS:
        status = cuda.cuDeviceGetCount(ctypes.byref(count))
    if status == _CUDA_ERROR_NO_DEVICE or (status == _CUDA_SUCCESS and count.value == 0):
        return f"no CUDA GPU is visible (0 devices); {check}"
    if status != _CUDA_SUCCESS:
        return f"no CUDA GPU is usable (the driver's CUDA error {status}); {check}"
    return None


INSTALL_HINT = (
    'from the repository\'s folder, pip install ".[cuda12]" (CUDA 12 driver) or '
    '".[cuda13]" (CUDA 13 driver)'
)


@functools.cache
def unavailable_reason() -> str | None:
    """Why the cuStateVec backend cannot run in this process, or None when it can.

    Probes in the order that tells the causes apart: the two packages, a visible GPU (the
    driver's, then cupy's), then a library handle (which loads cuBLAS and checks the GPU).
    Cached per process.
    """
    try:
        libraries = import_libraries()
    except ImportError as exc:
        return _import_problem(exc)
    except NoUsableGPU as exc:
        return str(exc)
    cp, cusv = libraries.cupy, libraries.custatevec
    if not cp.cuda.is_available():
        return _no_gpu_problem(cp)
    try:
        gpu_context(libraries)  # the current GPU's handle, kept for its backends
    except cusv.cuStateVecError as exc:
        return (
            f"cuStateVec could not start on the GPU ({exc}); it needs compute capability "
            "7.5 or newer and an NVIDIA driver >= 525.60.13 (CUDA 12) or >= 580.65.06 (CUDA 13)"
        )
    except RuntimeError as exc:
        return (
            f"cuBLAS could not be loaded ({exc}); the custatevec wheel does not install it: "
            "pip install nvidia-cublas-cu12 (CUDA 12) or nvidia-cublas (CUDA 13), or the "
            "[cuda12] / [cuda13] extra"
        )
    return None


def _import_problem(exc: ImportError) -> str:
    package = (exc.name or "").split(".")[0]
    if package == "cupy":
        return f"cupy is not installed ({INSTALL_HINT})"
    if package == "cuquantum":
        return f"cuquantum-python >= 26.9 is not installed ({exc}; {INSTALL_HINT})"
    return f"importing cupy or cuquantum failed ({type(exc).__name__}: {exc})"


def _no_gpu_problem(cp) -> str:
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except cp.cuda.runtime.CUDARuntimeError as exc:
        return (
            f"no CUDA GPU is usable ({exc}); check the NVIDIA driver (nvidia-smi) and "
            "CUDA_VISIBLE_DEVICES"
        )
    return f"no CUDA GPU is visible ({count} devices); check nvidia-smi and CUDA_VISIBLE_DEVICES"


def resolve_device_id(cp, device_id: int | None, rank_on_node: int | None = None) -> int:
    """The GPU to use: ``device_id``; else, under MPI, ``rank_on_node`` (the rank's index
    among the ranks of its node) modulo the visible GPUs, so that ranks that see one GPU
    each (``--gpus-per-task=1``, a per-rank CUDA_VISIBLE_DEVICES) or outnumber the GPUs
    share them round-robin; else $LOCAL_RANK (one process per GPU under
    torch.distributed); else the current CUDA device. A ``device_id`` or $LOCAL_RANK that
    is not a visible GPU is refused."""
    source = f"device_id={device_id}"
    if device_id is None and rank_on_node is not None:
        return rank_on_node % cp.cuda.runtime.getDeviceCount()
    if device_id is None:
        local_rank = os.environ.get("LOCAL_RANK")
        if local_rank is None:
            return cp.cuda.Device().id
        if not local_rank.isdigit():
            raise ValueError(f"LOCAL_RANK={local_rank!r} is not a GPU index; pass device_id.")
        device_id, source = int(local_rank), f"LOCAL_RANK={local_rank}"
    count = cp.cuda.runtime.getDeviceCount()
    if device_id >= count:
        raise ValueError(
            f"{source} names GPU {device_id}, but {count} GPU(s) are visible (0 to "
            f"{count - 1}); pass device_id, or check CUDA_VISIBLE_DEVICES."
        )
    return device_id


def _stream_ordered_handler(runtime) -> tuple[Callable, Callable, str]:
    """A memory handler (malloc, free, name) on the device's stream-ordered pool. It holds
    no reference to the backend, so that the binding keeping it does not keep the backend."""

    def malloc(size: int, stream: int) -> int:
        return runtime.mallocAsync(size, stream)

    def free(ptr: int, size: int, stream: int) -> None:
        runtime.freeAsync(ptr, stream)

    return malloc, free, "pennylane-custatevec stream-ordered pool"


UNLIMITED_RELEASE_THRESHOLD = (1 << 64) - 1
"""cudaMemPoolAttrReleaseThreshold: bytes the pool keeps across synchronisations (all)."""


@dataclasses.dataclass(eq=False)
class GPUContext:
    """One GPU's cuStateVec handle and its stream, shared by the process's backends on that
    GPU; ``lock`` serialises the calls of several threads on it."""

    device_id: int
    device: Any
    """The cupy Device (``with device:`` makes it current)."""
    stream: Any
    """The cupy Stream every call runs on (non-blocking: the null stream does not wait)."""
    handle: int
    lock: threading.RLock = dataclasses.field(default_factory=threading.RLock)


_contexts: dict[tuple, GPUContext] = {}
_contexts_lock = threading.Lock()
_release_at_exit: list[bool] = []  # one entry once release_contexts is registered with atexit


def gpu_context(libraries: Libraries, device_id: int | None = None) -> GPUContext:
    """The context of GPU ``device_id`` (None: the current one) in this process, made at
    the first call: ``create()`` first (its errors are the probe's), then the stream, the
    memory handler and the pool's release threshold."""
    cp = libraries.cupy
    if device_id is None:
        device_id = cp.cuda.Device().id
    key = (libraries, int(device_id), os.getpid())  # a forked child makes its own
    with _contexts_lock:
        context = _contexts.get(key)
        if context is None:
            context = _new_context(libraries, int(device_id))
            if not _release_at_exit:
                # registered after cupy's own exit handlers: it runs before them
                atexit.register(release_contexts)
                _release_at_exit.append(True)
            _contexts[key] = context
    return context


def _new_context(libraries: Libraries, device_id: int) -> GPUContext:
    cp, cusv = libraries.cupy, libraries.custatevec
    device = cp.cuda.Device(device_id)
    with device:
        handle = cusv.create()
        try:
            stream = cp.cuda.Stream(non_blocking=True)
            cusv.set_stream(handle, stream.ptr)
            runtime = cp.cuda.runtime
            pool = runtime.deviceGetDefaultMemPool(device_id)
            runtime.memPoolSetAttribute(
                pool, runtime.cudaMemPoolAttrReleaseThreshold, UNLIMITED_RELEASE_THRESHOLD
            )
            cusv.set_device_mem_handler(handle, _stream_ordered_handler(runtime))
        except BaseException:
            cusv.destroy(handle)
            raise
    return GPUContext(device_id, device, stream, handle)


def release_contexts(libraries: Libraries | None = None) -> None:
    """Destroy the handles of ``libraries`` (None: all): at exit, or in tests. A backend
    that outlives its context must not be used again."""
    with _contexts_lock:
        keys = [key for key in _contexts if libraries is None or key[0] == libraries]
        released = [(key[0], _contexts.pop(key)) for key in keys]
    for owner, context in released:
        try:
            with context.lock, context.device:
                owner.custatevec.destroy(context.handle)
        except Exception:
            if libraries is not None:  # at exit the driver may be gone already: let it be
                raise
