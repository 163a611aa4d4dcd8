"""``mpi=`` in one process: its errors, and the distributed backend on a job of one rank
(vectors replicated, nothing to swap). The split paths run under ``mpiexec`` (tests/mpi/
and the backend contract, from scripts/run_tests.sh)."""

from __future__ import annotations

import sys

import numpy as np
import pennylane as qml
import pytest
from conftest import DEVICE

from pennylane_custatevec.backends.cpu import CPUBackend
from pennylane_custatevec.backends.distributed import DistributedBackend


class _Ranks:
    """A stand-in communicator that only says how many ranks it has."""

    def __init__(self, size: int):
        self.size = size

    def Get_size(self) -> int:  # noqa: N802 (mpi4py's name)
        return self.size

    def Get_rank(self) -> int:  # noqa: N802
        return 0


@pytest.mark.parametrize("size", [3, 6, 12])
def test_rank_counts_that_are_not_powers_of_two_are_refused(size):
    with pytest.raises(ValueError, match=rf"power-of-two number of MPI ranks .* has {size}"):
        DistributedBackend(CPUBackend(), _Ranks(size))


@pytest.mark.parametrize("value", ["yes", 1.5, object()])
def test_mpi_option_rejects_what_is_not_a_communicator(value):
    with pytest.raises(ValueError, match="use False .*True .*mpi4py communicator"):
        qml.device(DEVICE, wires=2, backend="cpu", mpi=value)


def test_mpi_without_mpi4py_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(ImportError, match=r"pip install '\.\[mpi\]'"):
        qml.device(DEVICE, wires=2, backend="cpu", mpi=True)


def test_one_rank_job_replicates_and_matches_default_qubit():
    """Under one rank (a script run without mpiexec) mpi=True works as the plain device."""
    dev = qml.device(DEVICE, wires=12, backend="cpu", mpi=True, seed=3)
    assert isinstance(dev._backend, DistributedBackend) and dev._backend.ranks == 1
    assert dev._backend.global_bits_for(12) == 0
    assert "mpi ranks=1" in repr(dev)
    x = np.linspace(0.1, 1.2, 12)

    def circuit(x):
        qml.AngleEmbedding(x, wires=range(12))
        qml.BasicEntanglerLayers(x.reshape(1, 12), wires=range(12))
        return qml.expval(qml.X(11) @ qml.Z(0)), qml.probs(wires=[11, 3])

    result = qml.QNode(circuit, dev)(x)
    expected = qml.QNode(circuit, qml.device("default.qubit", wires=12))(x)
    for r, e in zip(result, expected, strict=True):
        np.testing.assert_allclose(r, e, atol=1e-10)


def test_the_memory_check_counts_a_rank_share():
    """A split backend holds 2**(n - g) amplitudes per vector; a replicated one all."""
    backend = DistributedBackend(CPUBackend(), _Ranks(4))
    backend.min_local_qubits = 10
    assert backend.global_bits_for(12) == 2 and backend.amplitudes_held(12) == 1 << 10
    assert backend.global_bits_for(11) == 0 and backend.amplitudes_held(11) == 1 << 11
    assert CPUBackend().amplitudes_held(12) == 1 << 12


@pytest.mark.parametrize("value", ["no", 0, None])
def test_mpi_gather_takes_booleans(value):
    with pytest.raises(ValueError, match="mpi_gather=.* is not valid; use True"):
        qml.device(DEVICE, wires=2, backend="cpu", mpi=True, mpi_gather=value)


def test_mpi_gather_false_needs_mpi():
    with pytest.raises(ValueError, match="mpi_gather=False needs mpi=True"):
        qml.device(DEVICE, wires=2, backend="cpu", mpi_gather=False)


def test_whole_results_too_large_for_host_memory_are_refused(monkeypatch):
    """Gathering whole vectors or distributions on every rank checks the host memory
    first and names mpi_gather=False."""
    from pennylane_custatevec.backends import distributed, rank_layouts

    backend = DistributedBackend(CPUBackend(), _Ranks(2))
    monkeypatch.setattr(backend.local, "available_host_bytes", lambda: 1 << 10)
    monkeypatch.setattr(distributed, "UNCHECKED_HOST_BYTES", 0)
    state = rank_layouts.DistributedState(
        np.zeros((1, 1 << 15), np.complex128), [tuple(range(16))], 0, 1, 16, 1
    )
    with pytest.raises(distributed.ResultTooLargeError, match="mpi_gather=False"):
        backend.to_host(state)
    with pytest.raises(distributed.ResultTooLargeError, match="probabilities of 16 qubits"):
        backend.probabilities(state, tuple(range(16)))


# --- the bit-swap routes ----------------------------------------------------------------


def _split_double(monkeypatch, setting: str | None = None, cuda_aware: bool = False):
    """A one-rank distributed backend over the cuStateVec double, its route chosen under
    ``PLCSV_MPI_SWAPS=setting`` (None: unset) by an MPI library that is CUDA-aware or not."""
    from custatevec_double import make_libraries
    from mpi4py import MPI

    from pennylane_custatevec.backends import messages
    from pennylane_custatevec.backends.custatevec import CuStateVecBackend

    if setting is None:
        monkeypatch.delenv(messages.SWAP_ROUTE_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(messages.SWAP_ROUTE_VARIABLE, setting)
    monkeypatch.setattr(messages, "cuda_aware_mpi", lambda: cuda_aware)
    libraries = make_libraries()
    local = CuStateVecBackend(libraries=libraries)
    return DistributedBackend(local, MPI.COMM_WORLD), libraries


@pytest.mark.parametrize(
    ("setting", "cuda_aware", "route"),
    [
        (None, False, "pinned host memory"),
        ("auto", True, "device memory (CUDA-aware MPI)"),
        ("device", False, "device memory (CUDA-aware MPI)"),
        ("host", True, "pinned host memory"),
        (" Auto ", False, "pinned host memory"),
    ],
)
def test_a_gpu_backend_swaps_through_device_memory_where_mpi_takes_it(
    monkeypatch, caplog, setting, cuda_aware, route
):
    """The route is chosen once, named by the backend and a log record: device memory
    where the MPI library is CUDA-aware (or PLCSV_MPI_SWAPS=device), else pinned host
    memory; a CPU backend's slices are host memory already."""
    with caplog.at_level("INFO", logger="pennylane_custatevec"):
        backend, _ = _split_double(monkeypatch, setting, cuda_aware)
    assert backend.swap_route == route
    assert f"bit swaps between MPI ranks go through {route}" in caplog.text
    from mpi4py import MPI

    assert DistributedBackend(CPUBackend(), MPI.COMM_WORLD).swap_route == "host memory"


def test_an_unknown_swap_route_is_refused_by_name(monkeypatch):
    with pytest.raises(
        ValueError, match=r"PLCSV_MPI_SWAPS='pcie' is not a bit-swap route; use auto"
    ):
        _split_double(monkeypatch, "pcie")


def test_this_mpi_library_says_whether_it_is_cuda_aware():
    """Open MPI's wheel here answers MPIX_Query_cuda_support (0: no CUDA)."""
    from pennylane_custatevec.backends import messages

    assert messages.cuda_aware_mpi() is False


def test_the_device_repr_names_the_route(monkeypatch, gpu_double):
    monkeypatch.setenv("PLCSV_MPI_SWAPS", "host")
    dev = qml.device(DEVICE, wires=2, backend="custatevec", mpi=True)
    assert "device_id=0, mpi ranks=1, swaps via pinned host memory" in repr(dev)


@pytest.mark.parametrize("setting", ["host", "device"])
def test_gpu_routes_move_blocks_in_stream_order(monkeypatch, setting):
    """Both GPU routes on a partner that is this rank itself (MPI.COMM_SELF): the block
    comes back unchanged, without a stream race (the double checks each copy, and the
    device route's MPI read through __cuda_array_interface__); the pinned route copies
    through pinned memory and leaves nothing pending, the device route never touches the
    host (its last copy stays queued on the stream)."""
    from mpi4py import MPI

    from pennylane_custatevec.backends import messages

    monkeypatch.setattr(messages, "EXCHANGE_CHUNK_AMPLITUDES", 8)  # several messages
    backend, libraries = _split_double(monkeypatch, setting)
    cp, local = libraries.cupy, backend.local
    psi = np.random.default_rng(3).normal(size=(3, 64)) + 0j
    state = local.from_host(psi)
    halves = state.reshape(3, 4, 2, 8)[:, :, 1, :]  # strided, as a bit swap's
    rank_messages = messages.RankMessages(MPI.COMM_SELF, local)
    rank_messages.exchange(halves, partner=0)
    assert cp.pinned_copies == (12 if setting == "host" else 0)  # 96 amplitudes in 8s
    assert rank_messages.traffic.swaps == 1 and rank_messages.traffic.swap_bytes == 96 * 16
    if setting == "host":  # its pinned buffers are free again: the stream was waited for
        np.testing.assert_array_equal(cp.asnumpy(state), psi)  # on the null stream
    np.testing.assert_array_equal(local.to_host(state), psi)
