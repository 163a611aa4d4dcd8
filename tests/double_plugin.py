"""A pytest plugin that puts the NumPy double of cupy and cuStateVec in place of the real
libraries for a whole session, so that suites written for the device (PennyLane's device
tests) exercise the cuStateVec backend's code without a GPU:

    PYTHONPATH=.:tests python -m pytest "$SUITE" -p double_plugin \\
        --device=custatevec.qubit --device-kwargs backend=custatevec
"""

from custatevec_double import make_libraries

from pennylane_custatevec.backends import gpu


def pytest_configure(config):
    libraries = make_libraries()
    gpu.import_libraries = lambda: libraries
    gpu.unavailable_reason.cache_clear()
