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
    with pytest.raises(ImportError, match=r"pennylane-custatevec\[mpi\]"):
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
    from pennylane_custatevec.backends import distributed

    backend = DistributedBackend(CPUBackend(), _Ranks(2))
    monkeypatch.setattr(backend.local, "available_host_bytes", lambda: 1 << 10)
    monkeypatch.setattr(distributed, "UNCHECKED_HOST_BYTES", 0)
    state = distributed.DistributedState(
        np.zeros((1, 1 << 15), np.complex128), [tuple(range(16))], 0, 1, 16, 1
    )
    with pytest.raises(distributed.ResultTooLargeError, match="mpi_gather=False"):
        backend.to_host(state)
    with pytest.raises(distributed.ResultTooLargeError, match="probabilities of 16 qubits"):
        backend.probabilities(state, tuple(range(16)))
