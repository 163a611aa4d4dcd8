"""pennylane-custatevec: a PennyLane device that simulates circuits with cuStateVec."""

from .device import CuStateVecDevice
from .settings import options

__version__ = "0.1.0"

__all__ = ["CuStateVecDevice", "__version__", "compile", "options"]


def compile(qnode):  # noqa: A001 - the compiled path's entry point
    """``qnode`` (on ``custatevec.qubit``, torch interface) compiled: each call runs as one
    ``torch.autograd.Function`` whose backward is the device's adjoint VJP; usable as a
    decorator. See :doc:`compiled` and ``pennylane_custatevec.compiled``. (Imported here
    on first use, so that the package does not import torch.)"""
    from .compiled import compile as compile_qnode

    return compile_qnode(qnode)
