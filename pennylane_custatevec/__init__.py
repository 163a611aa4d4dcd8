"""pennylane-custatevec: a PennyLane device that simulates circuits with cuStateVec."""

from .device import CuStateVecDevice
from .metric_transform import metric_tensor
from .settings import VERIFY_EVERY, options

__version__ = "0.1.0"

__all__ = [
    "CuStateVecDevice",
    "QNGTorch",
    "__version__",
    "compile",
    "metric_tensor",
    "options",
]


def compile(qnode=None, *, verify_every: int | None = VERIFY_EVERY):  # noqa: A001 - the entry point
    """``qnode`` (on ``custatevec.qubit``, torch interface) compiled: each call runs as one
    ``torch.autograd.Function`` whose backward is the device's adjoint VJP; usable as a
    decorator, with or without arguments. ``verify_every``: a replaying key is traced
    again and compared at its calls 4, 8, ..., ``verify_every``, then every
    ``verify_every``-th call (None: never after its third call). See :doc:`compiled` and
    ``pennylane_custatevec.compiled``. (Imported here on first use, so that the package
    does not import torch.)"""
    from .compiled import compile as compile_qnode

    return compile_qnode(qnode, verify_every=verify_every)


def __getattr__(name: str):
    """``QNGTorch`` (the quantum natural gradient for torch parameters, ``qng``), imported
    on first use so that the package does not import torch."""
    if name == "QNGTorch":
        from .qng import QNGTorch

        return QNGTorch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
