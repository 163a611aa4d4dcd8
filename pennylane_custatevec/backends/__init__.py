"""Backends own the state-vector memory; ``select_backend`` picks one by name."""

import warnings

import numpy as np
from pennylane.exceptions import DeviceError

from . import gpu
from .base import Backend
from .cpu import CPUBackend
from .custatevec import CuStateVecBackend

BACKEND_CHOICES = ("auto", "cpu", "custatevec")


class BackendUnavailableError(DeviceError):
    """The requested backend cannot run on this machine."""


_fallbacks_reported: set[str] = set()
"""The reasons already given for falling back to the CPU: one warning per process, not one
per device (test suites and training loops build many devices)."""


def select_backend(
    name: str, dtype: np.dtype, device_id: int | None = None, rank_on_node: int | None = None
) -> Backend:
    """The backend called ``name``. ``"auto"`` is custatevec when cupy, cuQuantum and a GPU
    are usable, else the CPU backend with a warning saying why; ``"custatevec"`` where it
    cannot run raises :class:`BackendUnavailableError` naming what is missing.
    ``device_id`` picks the GPU, else an MPI rank's ``rank_on_node`` modulo the visible
    GPUs (``gpu.resolve_device_id``; both ignored by the CPU backend)."""
    if name == "cpu":
        return CPUBackend(dtype)
    reason = gpu.unavailable_reason()
    if reason is None:
        return CuStateVecBackend(dtype, device_id, rank_on_node=rank_on_node)
    if name == "custatevec":
        raise BackendUnavailableError(
            f"backend='custatevec' is not available on this machine: {reason}. "
            "Use backend='auto' or backend='cpu' to run on the CPU."
        )
    if reason not in _fallbacks_reported:
        _fallbacks_reported.add(reason)
        warnings.warn(
            f"custatevec.qubit runs on the CPU backend: the cuStateVec GPU backend is not "
            f"usable here: {reason}. Pass backend='cpu' to choose the CPU explicitly.",
            UserWarning,
            stacklevel=2,
        )
    return CPUBackend(dtype)


__all__ = [
    "BACKEND_CHOICES",
    "Backend",
    "BackendUnavailableError",
    "CPUBackend",
    "CuStateVecBackend",
    "select_backend",
]
