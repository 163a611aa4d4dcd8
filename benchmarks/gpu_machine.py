"""Where the GPU benchmark (``gpu_bench.py``) runs: the GPU, through cupy and the cuStateVec
backend, or, for ``--dry-run``, the CPU backend; and what it reads of the GPU's memory.

GPU memory is read from the driver (``cupy.cuda.runtime.memGetInfo``: free bytes), so
that a configuration's figure counts everything it took: our arrays in cupy's pool, the
cuStateVec handle's own memory and its workspaces in the stream-ordered pool (whose
release threshold the backend raises to the maximum, so that it keeps what it took), and
torch's caching allocator. Each pool's own figure is reported beside it.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from pennylane_custatevec.backends import custatevec, gpu
from pennylane_custatevec.backends.cpu import CPUBackend

MIB = 1 << 20


@dataclass(frozen=True)
class GPUMemory:
    """A reading of the GPU's memory."""

    free: int
    """What the driver has free (memGetInfo)."""
    cupy_pool: int
    """Bytes cupy's default pool holds (freed blocks included)."""
    stream_pool: int
    """The stream-ordered pool's high watermark of reserved bytes (cuStateVec's workspaces)."""
    torch_peak: int
    """torch's peak allocation."""


def memory_note(before: GPUMemory, after: GPUMemory) -> str:
    """What a configuration took between two readings: the drop of the driver's free
    memory (everything, pools included), then each pool's figure."""
    taken = (before.free - after.free) / MIB
    return (
        f"GPU +{taken:.0f} MiB (memGetInfo; pools: cupy {after.cupy_pool / MIB:.0f}, "
        f"stream-ordered {after.stream_pool / MIB:.0f}, torch {after.torch_peak / MIB:.0f})"
    )


@dataclass
class Machine:
    """The GPU (cupy and the cuStateVec backend) or, for ``--dry-run``, the CPU backend.

    ``backend(dtype)`` makes the backend of the gate tables; ``synchronize`` waits for its
    work; ``copy_bandwidth(nbytes)`` measures bytes read plus written per second of a
    device-to-device copy; ``reset_memory`` empties the pools and returns a reading,
    ``memory`` reads again (both None on the CPU); ``create_seconds`` times one cuStateVec
    ``create()`` and ``destroy()`` (None on the CPU); ``ours_options`` builds our GPU
    column's device; ``torch_device`` holds the torch peer's tensors."""

    label: str
    backend: Callable[[np.dtype], object]
    synchronize: Callable[[], None]
    copy_bandwidth: Callable[[int], float]
    reset_memory: Callable[[], GPUMemory] | None = None
    memory: Callable[[], GPUMemory] | None = None
    create_seconds: Callable[[], float] | None = None
    ours_options: dict = field(default_factory=dict)
    torch_device: str = "cpu"


def gpu_machine() -> Machine:
    """The GPU, or RuntimeError saying why it cannot be used."""
    reason = gpu.unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    libraries = gpu.import_libraries()
    cp, cusv = libraries.cupy, libraries.custatevec
    runtime = cp.cuda.runtime
    pool = cp.get_default_memory_pool()
    stream_pool = runtime.deviceGetDefaultMemPool(cp.cuda.Device().id)

    def copy_bandwidth(nbytes: int) -> float:
        source, destination = cp.ones(nbytes, dtype=cp.uint8), cp.empty(nbytes, dtype=cp.uint8)
        destination.data.copy_from_device_async(source.data, nbytes)  # cudaMemcpyAsync, D2D
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        repeat = 10
        start.record()
        for _ in range(repeat):
            destination.data.copy_from_device_async(source.data, nbytes)
        stop.record()
        stop.synchronize()
        seconds = cp.cuda.get_elapsed_time(start, stop) / 1e3 / repeat
        del source, destination
        pool.free_all_blocks()
        return 2 * nbytes / seconds

    def memory() -> GPUMemory:
        free, _total = runtime.memGetInfo()
        high = runtime.memPoolGetAttribute(stream_pool, runtime.cudaMemPoolAttrReservedMemHigh)
        return GPUMemory(
            int(free), pool.total_bytes(), int(high), torch.cuda.max_memory_allocated()
        )

    def reset_memory() -> GPUMemory:
        gc.collect()
        cp.cuda.Device().synchronize()
        pool.free_all_blocks()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        runtime.memPoolTrimTo(stream_pool, 0)
        runtime.memPoolSetAttribute(stream_pool, runtime.cudaMemPoolAttrReservedMemHigh, 0)
        return memory()

    def create_seconds() -> float:
        start = time.perf_counter()
        handle = cusv.create()
        cusv.destroy(handle)
        return time.perf_counter() - start

    name = runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    return Machine(
        label=f"{name} (cuStateVec backend)",
        backend=custatevec.CuStateVecBackend,
        synchronize=lambda: cp.cuda.Device().synchronize(),
        copy_bandwidth=copy_bandwidth,
        reset_memory=reset_memory,
        memory=memory,
        create_seconds=create_seconds,
        torch_device="cuda",
    )


def torch_machine() -> Machine:
    """The GPU through torch alone, for the peers of the workload table (default.qubit on
    torch CUDA tensors, our CPU backend): the GPU check runs them before the cuStateVec
    library is installed. RuntimeError where torch sees no GPU."""
    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA GPU")

    def memory() -> GPUMemory:
        free, _total = torch.cuda.mem_get_info()
        return GPUMemory(int(free), 0, 0, torch.cuda.max_memory_allocated())

    def reset_memory() -> GPUMemory:
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return memory()

    return Machine(
        label=f"{torch.cuda.get_device_name()} (torch; the cuStateVec backend not installed)",
        backend=CPUBackend,
        synchronize=torch.cuda.synchronize,
        copy_bandwidth=lambda nbytes: float("nan"),
        reset_memory=reset_memory,
        memory=memory,
        torch_device="cuda",
    )


def cpu_machine() -> Machine:
    """--dry-run: the CPU backend for the gates and for our 'GPU' column, torch on the CPU."""

    def copy_bandwidth(nbytes: int) -> float:
        source, destination = np.ones(nbytes, dtype=np.uint8), np.empty(nbytes, dtype=np.uint8)
        start = time.perf_counter()
        np.copyto(destination, source)
        return 2 * nbytes / (time.perf_counter() - start)

    return Machine(
        label="dry run: CPU backend, numpy copy",
        backend=CPUBackend,
        synchronize=lambda: None,
        copy_bandwidth=copy_bandwidth,
        ours_options={"backend": "cpu"},
    )
