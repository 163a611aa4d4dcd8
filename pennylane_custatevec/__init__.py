"""pennylane-custatevec: a PennyLane device that simulates circuits with cuStateVec."""

from .device import CuStateVecDevice
from .settings import options

__version__ = "0.1.0"

__all__ = ["CuStateVecDevice", "__version__", "options"]
