"""Backends own the state-vector memory; ``select_backend`` picks one by name."""

import numpy as np
from pennylane.exceptions import DeviceError

from .base import Backend
from .cpu import CPUBackend

BACKEND_CHOICES = ("auto", "cpu", "custatevec")


class BackendUnavailableError(DeviceError):
    """The requested backend cannot run on this machine."""


def select_backend(name: str, dtype: np.dtype) -> Backend:
    """The backend called ``name``; ``"auto"`` is the CPU backend until the GPU one lands."""
    if name == "custatevec":
        raise BackendUnavailableError(
            "backend='custatevec' is not available in this release: the cuStateVec GPU "
            "backend is not implemented yet. Use backend='cpu' or backend='auto'."
        )
    return CPUBackend(dtype)


__all__ = ["BACKEND_CHOICES", "Backend", "BackendUnavailableError", "CPUBackend", "select_backend"]
