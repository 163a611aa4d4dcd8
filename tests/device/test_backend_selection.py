"""Choosing the backend (probe, fallback warning, clear errors, device_id) and the
custatevec.qubit device on the cuStateVec backend (run on the NumPy double)."""

from __future__ import annotations

import ctypes
import importlib.util
import re
import subprocess
import sys
import warnings

import numpy as np
import pennylane as qml
import pytest
import torch
from conftest import AUTO_BACKEND, assert_allclose_nested
from custatevec_double import make_libraries
from reference import assert_21_qubits_refused

from pennylane_custatevec import backends
from pennylane_custatevec.backends import BackendUnavailableError, gpu


@pytest.fixture
def probe_sees(monkeypatch):
    """probe_sees(outcome): the probe imports ``outcome`` (a Libraries, or an ImportError to
    raise); the fallback warning is fresh."""
    monkeypatch.setattr(backends, "_fallbacks_reported", set())

    def set_outcome(outcome):
        def import_libraries():
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        monkeypatch.setattr(gpu, "import_libraries", import_libraries)
        gpu.unavailable_reason.cache_clear()

    yield set_outcome
    gpu.unavailable_reason.cache_clear()


PROBLEMS = {
    "no-cupy": (
        lambda: ModuleNotFoundError("No module named 'cupy'", name="cupy"),
        r"cupy is not installed \(from the repository's folder, pip install \"\.\[cuda12\]\"",
    ),
    "no-cuquantum": (
        lambda: ModuleNotFoundError("No module named 'cuquantum'", name="cuquantum"),
        r"cuquantum-python >= 26.9 is not installed .*\[cuda13\]",
    ),
    "no-gpu": (lambda: make_libraries(gpus=0), r"no CUDA GPU is visible \(0 devices\)"),
    "old-driver": (
        lambda: make_libraries(driver_error="cudaErrorInsufficientDriver: CUDA driver version"),
        r"no CUDA GPU is usable \(cudaErrorInsufficientDriver.*nvidia-smi",
    ),
    "no-cublas": (
        lambda: make_libraries(create_error="cublas"),
        r"cuBLAS could not be loaded \(Failure finding 'libcublas.so'.*nvidia-cublas-cu12",
    ),
    "old-gpu": (
        lambda: make_libraries(create_error="ARCH_MISMATCH"),
        r"cuStateVec could not start on the GPU \(ARCH_MISMATCH.*compute capability 7.5",
    ),
}


@pytest.mark.parametrize("problem", list(PROBLEMS))
def test_auto_falls_back_to_the_cpu_with_one_warning_naming_the_reason(probe_sees, problem):
    outcome, message = PROBLEMS[problem]
    probe_sees(outcome())
    with pytest.warns(UserWarning, match="runs on the CPU backend") as record:
        dev = qml.device("custatevec.qubit", wires=2)
    assert dev.backend_name == "cpu"
    assert len(record) == 1
    assert re.search(message, str(record[0].message))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process, not once per device
        assert qml.device("custatevec.qubit", wires=3).backend_name == "cpu"


@pytest.mark.parametrize("problem", list(PROBLEMS))
def test_custatevec_that_cannot_run_raises_naming_what_is_missing(probe_sees, problem):
    outcome, message = PROBLEMS[problem]
    probe_sees(outcome())
    with pytest.raises(BackendUnavailableError, match="not available on this machine") as info:
        qml.device("custatevec.qubit", wires=2, backend="custatevec")
    assert re.search(message, str(info.value))
    assert "backend='cpu'" in str(info.value)


def test_probe_keeps_its_handle_for_the_backends(probe_sees):
    """The probe's handle is the current GPU's, which every backend there shares: one
    create() in the process."""
    libraries = make_libraries()
    probe_sees(libraries)
    assert gpu.unavailable_reason() is None
    assert len(libraries.custatevec.handles) == 1 and libraries.custatevec.destroyed == []
    for _ in range(3):
        qml.device("custatevec.qubit", wires=2, backend="custatevec")
    assert libraries.custatevec.created == 1


def _missing_here() -> str:
    """What the real probe must name on a machine without a usable GPU: the first missing
    package, else the GPU (CI installs cupy and the real cuStateVec bindings)."""
    if importlib.util.find_spec("cupy") is None:
        return "cupy is not installed"
    if importlib.util.find_spec("cuquantum") is None:
        return "cuquantum-python >= 26.9 is not installed"
    return "no CUDA GPU is (usable|visible)"


@pytest.mark.skipif(AUTO_BACKEND == "custatevec", reason="the GPU backend is usable here")
def test_here_auto_picks_the_cpu_and_says_why(monkeypatch):
    """This machine has no usable GPU: the real probe says what is missing."""
    monkeypatch.setattr(backends, "_fallbacks_reported", set())
    gpu.unavailable_reason.cache_clear()
    missing = _missing_here()
    with pytest.warns(UserWarning, match=missing):
        assert qml.device("custatevec.qubit", wires=1).backend_name == "cpu"
    with pytest.raises(BackendUnavailableError, match=missing):
        qml.device("custatevec.qubit", wires=1, backend="custatevec")


def test_cpu_backend_needs_no_probe(monkeypatch):
    monkeypatch.setattr(gpu, "unavailable_reason", lambda: pytest.fail("probed"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dev = qml.device("custatevec.qubit", wires=1, backend="cpu", device_id=3)
    assert dev.backend_name == "cpu" and "device_id" not in repr(dev)


@pytest.mark.parametrize("device_id", [-1, "0", 1.0, True])
def test_bad_device_id(device_id):
    with pytest.raises(ValueError, match="device_id") as info:
        qml.device("custatevec.qubit", wires=1, backend="cpu", device_id=device_id)
    assert "GPU index" in str(info.value)


# --- the device on the cuStateVec backend (double) ----------------------------------------


def _pair(wires=3, **options):
    """(custatevec.qubit on custatevec, custatevec.qubit on cpu), same options."""
    return (
        qml.device("custatevec.qubit", wires=wires, backend="custatevec", **options),
        qml.device("custatevec.qubit", wires=wires, backend="cpu", **options),
    )


def _circuit(x, y):
    qml.RX(x, wires=0)
    qml.RY(y, wires=1)
    qml.CNOT(wires=[0, 1])
    qml.CRX(0.4 * x, wires=[1, 2])
    qml.PauliRot(y, "XYZ", wires=[0, 1, 2])
    qml.MultiRZ(0.3, wires=[0, 2])
    qml.Toffoli(wires=[0, 1, 2])
    qml.QubitUnitary(qml.matrix(qml.Rot(0.1, 0.2, 0.3, wires=0)), wires=2)


def test_device_on_custatevec_matches_the_cpu_backend(gpu_double):
    gpu, cpu = _pair(c_dtype=np.complex128)
    assert gpu.backend_name == "custatevec" and repr(gpu).endswith(
        "backend=custatevec, device_id=0, c_dtype=complex128>"
    )
    hamiltonian = qml.Hamiltonian([0.5, -1.2], [qml.X(0) @ qml.Z(2), qml.Y(1)])

    def measured(x, y):
        _circuit(x, y)
        return (
            qml.expval(qml.Z(0)),
            qml.expval(hamiltonian),
            qml.expval(qml.Hermitian(np.diag([1.0, 2.0, 3.0, 4.0]), wires=[2, 0])),
            qml.var(qml.Y(2)),
            qml.probs(wires=[2, 0]),
            qml.state(),
        )

    x, y = np.array([0.3, 1.1]), np.array([0.7, -0.2])  # broadcast: a batch of two
    results = [qml.QNode(measured, dev)(x, y) for dev in (gpu, cpu)]
    assert_allclose_nested(results[0], results[1], atol=1e-12)
    assert {"apply_matrix_batched", "compute_expectation_batched"} <= set(
        gpu_double.custatevec.calls
    )


@pytest.mark.parametrize("dtype, atol", [(np.complex128, 1e-10), (np.complex64, 1e-5)])
def test_adjoint_gradients_match_the_cpu_backend(gpu_double, dtype, atol):
    gpu, cpu = _pair(c_dtype=dtype)

    def cost(x, y):
        _circuit(x, y)
        return qml.expval(qml.Z(2) @ qml.X(0)), qml.probs(wires=[1])

    def scalar_cost(x, y):
        _circuit(x, y)
        return qml.expval(qml.Z(2) @ qml.X(0))

    grads = []
    for dev in (gpu, cpu):
        node = qml.QNode(cost, dev, diff_method="adjoint")
        x = qml.numpy.array(0.4, requires_grad=True)
        y = qml.numpy.array(-0.9, requires_grad=True)
        grads.append(qml.jacobian(lambda a, b, node=node: qml.math.hstack(node(a, b)))(x, y))
    assert_allclose_nested(grads[0], grads[1], atol=atol)

    torch_grads = []
    for dev in (gpu, cpu):
        node = qml.QNode(
            scalar_cost, dev, interface="torch", diff_method="adjoint", device_vjp=True
        )
        x = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
        y = torch.tensor(-0.9, dtype=torch.float64, requires_grad=True)
        node(x, y).backward()
        torch_grads.append([x.grad.item(), y.grad.item()])
    np.testing.assert_allclose(torch_grads[0], torch_grads[1], atol=atol)
    d_expval = [grads[1][0][0], grads[1][1][0]]  # (d/dx, d/dy) of the first output
    np.testing.assert_allclose(torch_grads[0], d_expval, atol=atol)


def test_sampling_is_seeded_and_has_the_right_statistics(gpu_double):
    def sampled():
        _circuit(0.8, 1.3)
        return qml.sample(wires=[2, 0]), qml.expval(qml.Z(1)), qml.counts(wires=[0])

    def run(dev):
        return qml.set_shots(qml.QNode(sampled, dev), shots=20000)()

    first = run(qml.device("custatevec.qubit", wires=3, backend="custatevec", seed=11))
    again = run(qml.device("custatevec.qubit", wires=3, backend="custatevec", seed=11))
    np.testing.assert_array_equal(first[0], again[0])
    assert first[0].shape == (20000, 2)
    cpu = run(qml.device("custatevec.qubit", wires=3, backend="cpu", seed=11))
    assert first[1] == pytest.approx(cpu[1], abs=0.03)
    assert first[2]["1"] / 20000 == pytest.approx(cpu[2]["1"] / 20000, abs=0.02)
    for bits in ((0, 0), (0, 1), (1, 0), (1, 1)):
        frequency = [np.mean(np.all(s == bits, axis=1)) for s in (first[0], cpu[0])]
        assert frequency[0] == pytest.approx(frequency[1], abs=0.02)


def test_one_shot_mid_circuit_measurements(gpu_double):
    """Each shot its own vector: per-vector projectors and conditional gates."""

    def circuit():
        qml.Hadamard(0)
        m = qml.measure(0, reset=True)
        qml.cond(m, qml.PauliX)(1)
        return qml.sample(wires=[0, 1]), qml.expval(m)

    dev = qml.device("custatevec.qubit", wires=2, backend="custatevec", seed=5)
    node = qml.set_shots(qml.QNode(circuit, dev, mcm_method="one-shot"), shots=400)
    samples, mean = node()
    assert np.all(samples[:, 0] == 0)  # reset
    assert 0.4 < np.mean(samples[:, 1]) < 0.6
    assert mean == pytest.approx(np.mean(samples[:, 1]))


def test_memory_is_refused_before_allocating(gpu_double):
    gpu_double.cupy.free_bytes = 1 << 20
    assert_21_qubits_refused("custatevec")
    assert gpu_double.cupy.allocations == []


# --- the driver's probe: no GPU, nothing of cupy or cuQuantum imported ------------------


class _FakeDriver:
    """libcuda.so.1 as ctypes gives it: cuInit and cuDeviceGetCount return CUresult codes."""

    def __init__(self, init_status: int, count: int = 0, count_status: int = 0):
        self.init_status, self.count, self.count_status = init_status, count, count_status

    def cuInit(self, flags):  # noqa: N802 - the C name
        assert flags == 0
        return self.init_status

    def cuDeviceGetCount(self, pointer):  # noqa: N802 - the C name
        pointer._obj.value = self.count
        return self.count_status


def _missing_driver(name):
    raise OSError(f"{name}: cannot open shared object file: No such file or directory")


DRIVERS = {
    "no driver": (_missing_driver, r"^no CUDA GPU is usable \(no NVIDIA driver: libcuda.so.1"),
    "no device": (lambda _: _FakeDriver(100), r"^no CUDA GPU is visible \(0 devices\)"),
    "none counted": (lambda _: _FakeDriver(0, count=0), r"^no CUDA GPU is visible \(0 devices\)"),
    "old driver": (
        lambda _: _FakeDriver(35),
        r"^no CUDA GPU is usable \(the driver's CUDA error 35",
    ),
    "count fails": (
        lambda _: _FakeDriver(0, count_status=999),
        r"^no CUDA GPU is usable \(the driver's CUDA error 999",
    ),
}


@pytest.mark.parametrize("case", list(DRIVERS))
def test_driver_problem_names_what_the_driver_says(monkeypatch, case):
    loader, message = DRIVERS[case]
    monkeypatch.setattr(gpu.ctypes, "CDLL", loader)
    problem = gpu.driver_problem()
    assert re.search(message, problem), problem
    assert problem.endswith("check the NVIDIA driver (nvidia-smi) and CUDA_VISIBLE_DEVICES")
    if all(importlib.util.find_spec(p) for p in ("cupy", "cuquantum")):
        with pytest.raises(gpu.NoUsableGPU, match=re.escape(problem)):
            gpu.import_libraries()  # refused before importing anything


def test_a_driver_that_counts_a_gpu_lets_the_probe_import(monkeypatch):
    monkeypatch.setattr(gpu.ctypes, "CDLL", lambda _: _FakeDriver(0, count=2))
    assert gpu.driver_problem() is None


def test_without_a_driver_the_first_device_imports_neither_cupy_nor_cuquantum():
    """On a CPU-only machine the probe asks the driver first (about 230 MiB of resident
    memory that cupy's and cuQuantum's CUDA libraries took)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        pass
    else:
        pytest.skip("an NVIDIA driver is installed here")
    script = (
        "import sys, warnings; warnings.simplefilter('ignore'); import pennylane as qml; "
        "dev = qml.device('custatevec.qubit', wires=2); "
        "print(dev.backend_name, 'cupy' in sys.modules, 'cuquantum' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["cpu", "False", "False"]
