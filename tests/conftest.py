"""Shared helpers for the custatevec.qubit test suite.

Every test compares ``custatevec.qubit`` against PennyLane's ``default.qubit`` (the
reference) on the same wires, with the same circuit.
"""

from __future__ import annotations

import dataclasses
import os
import zlib

import numpy as np
import pennylane as qml
import pytest

from pennylane_custatevec.backends import gpu
from pennylane_custatevec.backends.cpu import CPUBackend

DEVICE = "custatevec.qubit"

MPI_RUN = os.environ.get("CUSTATEVEC_TEST_MPI") == "1"
"""Set by scripts/run_tests.sh for the runs under ``mpiexec``: the backend contract runs
on the distributed backend, and tests/mpi/ runs at all."""

collect_ignore = [] if MPI_RUN else ["mpi"]  # tests/mpi/ runs under mpiexec only

TEST_BACKEND = os.environ.get("PLCSV_TEST_BACKEND", "")
"""``custatevec`` (set by scripts/gpu_check.sh): the session requires a usable GPU backend,
so that ``backend="auto"`` (every device test) and the backend tests run on the GPU."""

AUTO_BACKEND = "custatevec" if gpu.unavailable_reason() is None else "cpu"
"""What ``backend="auto"`` picks in this process."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "real_size_thresholds: keep the CPU backend's fusion_traits.min_fused_amplitudes, "
        "tile_bits, min_tiled_qubits and min_tiled_rotation_qubits, and its "
        "min_product_state_amplitudes",
    )


RECORD_KERNELS = os.environ.get("CUSTATEVEC_RECORD_KERNELS", "")
"""A directory (set by scripts/record_kernel_signatures.sh): each test process writes there
the CPU kernel signatures it compiled, for backends/kernel_signatures.txt."""


def pytest_sessionfinish(session):
    if RECORD_KERNELS:
        from pennylane_custatevec.backends import kernel_build

        signatures = kernel_build.compiled_signatures(kernel_build.kernels_module())
        path = os.path.join(RECORD_KERNELS, f"{os.getpid()}.txt")
        with open(path, "w") as file:
            file.writelines(signature.line() + "\n" for signature in signatures)


def pytest_sessionstart(session):
    if TEST_BACKEND == "custatevec" and AUTO_BACKEND != "custatevec":
        pytest.exit(
            "PLCSV_TEST_BACKEND=custatevec, but the cuStateVec backend cannot run here: "
            f"{gpu.unavailable_reason()}",
            returncode=3,
        )


@pytest.fixture(autouse=True)
def no_size_thresholds(request, monkeypatch):
    """The CPU backend fuses every batch and prepares every product state, however small:
    the tests' circuits are far below the sizes where these start to pay
    (``fusion_traits.min_fused_amplitudes``, ``min_product_state_amplitudes``), and both
    paths must be exercised on them. Tiled runs likewise (``min_tiled_qubits``,
    ``min_tiled_rotation_qubits``), in tiles of
    4 amplitudes (``tile_bits`` 2): the one-bit blocks on the two lowest bits run tiled,
    the others as before, so that every circuit takes both paths. Tests marked
    ``real_size_thresholds`` keep the thresholds."""
    if request.node.get_closest_marker("real_size_thresholds") is None:
        unthresholded = dataclasses.replace(
            CPUBackend.fusion_traits,
            min_fused_amplitudes=0,
            min_tiled_qubits=0,
            min_tiled_rotation_qubits=0,
            tile_bits=2,
        )
        monkeypatch.setattr(CPUBackend, "fusion_traits", unthresholded)
        monkeypatch.setattr(CPUBackend, "min_product_state_amplitudes", 0)


@pytest.fixture
def gpu_double(monkeypatch):
    """The NumPy double of cupy and cuStateVec (tests/custatevec_double.py) in place of the
    real libraries, for devices and backends built during the test; returns its Libraries."""
    from custatevec_double import make_libraries

    libraries = make_libraries()
    monkeypatch.setattr(gpu, "import_libraries", lambda: libraries)
    gpu.unavailable_reason.cache_clear()
    yield libraries
    gpu.unavailable_reason.cache_clear()


@pytest.fixture(params=["cpu", "custatevec"])
def each_backend(request) -> str:
    """Both backends by name: cuStateVec through its NumPy double (``gpu_double``)."""
    if request.param == "custatevec":
        request.getfixturevalue("gpu_double")
    return request.param


@pytest.fixture
def capture():
    """PennyLane's program capture enabled (disabled afterwards)."""
    import pennylane as qml

    qml.capture.enable()
    try:
        yield
    finally:
        qml.capture.disable()


@pytest.fixture
def jax_float64():
    """jax in double precision, as the device computes (restored afterwards)."""
    import jax

    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


# Non-contiguous integer and string labels, deliberately not in sorted order.
MIXED_WIRES = ["a", 3, "q1", 0, "z"]

TOL = {np.complex128: 1e-10, np.complex64: 1e-5}


def stable_seed(*parts) -> int:
    """A seed that depends only on ``parts`` (stable across processes, unlike hash())."""
    return zlib.crc32(repr(parts).encode())


@pytest.fixture
def rng(request):
    """A numpy Generator seeded from the test's module and name: deterministic per test."""
    return np.random.default_rng(stable_seed(request.node.module.__name__, request.node.name))


def make_devices(wires, **kwargs):
    """(custatevec.qubit, default.qubit) on the same wires; kwargs go to custatevec only
    except ``seed``, which both get."""
    seed = kwargs.pop("seed", None)
    ref_kwargs = {} if seed is None else {"seed": seed}
    dev = qml.device(DEVICE, wires=wires, seed=seed if seed is not None else "global", **kwargs)
    ref = qml.device("default.qubit", wires=wires, **ref_kwargs)
    return dev, ref


def assert_same_structure(result, expected, path="result"):
    """Same nesting (tuple/list/dict), same array shapes; returns nothing."""
    if isinstance(expected, dict):
        assert isinstance(result, dict), f"{path}: {type(result)} is not a dict"
        return
    if isinstance(expected, (tuple, list)):
        assert isinstance(result, (tuple, list)), f"{path}: {type(result)} is not a sequence"
        assert type(result) is type(expected), f"{path}: {type(result)} != {type(expected)}"
        assert len(result) == len(expected), f"{path}: length {len(result)} != {len(expected)}"
        for i, (r, e) in enumerate(zip(result, expected, strict=True)):
            assert_same_structure(r, e, f"{path}[{i}]")
        return
    assert np.shape(result) == np.shape(expected), (
        f"{path}: shape {np.shape(result)} != {np.shape(expected)}"
    )


def assert_allclose_nested(result, expected, atol, path="result"):
    """Same structure and values within ``atol`` (dict values compared key by key)."""
    assert_same_structure(result, expected, path)
    if isinstance(expected, dict):
        assert set(result) == set(expected), f"{path}: keys {set(result)} != {set(expected)}"
        for key in expected:
            np.testing.assert_allclose(result[key], expected[key], atol=atol, rtol=0)
        return
    if isinstance(expected, (tuple, list)):
        for i, (r, e) in enumerate(zip(result, expected, strict=True)):
            assert_allclose_nested(r, e, atol, f"{path}[{i}]")
        return
    np.testing.assert_allclose(np.asarray(result), np.asarray(expected), atol=atol, rtol=0)


def assert_sampled_matches_exact(circuit, values, wires, seed, shots=40000, atol=0.02):
    """``circuit(*values)`` on custatevec with ``shots`` seeded shots against default.qubit's
    exact results."""
    exact = qml.QNode(circuit, qml.device("default.qubit", wires=wires))(*values)
    dev = qml.device(DEVICE, wires=wires, seed=seed)
    sampled = qml.set_shots(qml.QNode(circuit, dev), shots)(*values)
    assert_allclose_nested(sampled, exact, atol=atol)


def generic_layer(wires, angles):
    """RY/RZ on every wire, then a CNOT ladder: makes the state generic (entangled)."""
    for w, (a, b) in zip(wires, angles, strict=True):
        qml.RY(a, wires=w)
        qml.RZ(b, wires=w)
    for w0, w1 in zip(wires[:-1], wires[1:], strict=True):
        qml.CNOT([w0, w1])
