"""``pennylane_custatevec.metric_tensor`` with ``mpi=True``, run under ``mpiexec -n 2`` and
``-n 4`` by scripts/run_tests.sh (``CUSTATEVEC_TEST_MPI=1``): every differentiable gate
against default.qubit's metrics on every rank (both accumulation modes), and the deferred
mode's products summed over ranks in one collective."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from adjoint_cases import WIRES
from conftest import DEVICE
from metric_cases import GATE_NAMES, gate_circuit, layered_circuit, reference_metrics
from mpi4py import MPI
from pennylane import numpy as pnp

import pennylane_custatevec as pc
from pennylane_custatevec.backends.distributed import DistributedBackend

COMM = MPI.COMM_WORLD
ATOL = 1e-10


def split(wires, mode):
    """custatevec.qubit over the job's ranks, splitting vectors of >= 2 local bits."""
    dev = qml.device(DEVICE, wires=wires, backend="cpu", mpi=True, grad_accumulation=mode)
    assert isinstance(dev._backend, DistributedBackend)
    dev._backend.min_local_qubits = 2
    return dev


@pytest.mark.parametrize("mode", ["deferred", "eager"])
@pytest.mark.parametrize("name", GATE_NAMES)
def test_every_gate(name, mode):
    circuit, x = gate_circuit(name)
    qnode = qml.QNode(circuit, split(WIRES, mode))
    references = reference_metrics(name)
    np.testing.assert_allclose(pc.metric_tensor(qnode)(x), references["adjoint"], atol=ATOL)
    for approx in ("block-diag", "diag"):
        got = pc.metric_tensor(qnode, approx=approx)(x)
        np.testing.assert_allclose(got, references[approx], atol=ATOL, err_msg=approx)


@pytest.mark.parametrize("mode", ["deferred", "eager"])
def test_layers_on_eight_wires(mode):
    """Strongly entangling layers over every global bit, against the device in one
    process; the deferred mode sums its products over ranks in one collective."""
    circuit, weights, scale = layered_circuit(n_wires=8, layers=2)
    args = (pnp.array(weights, requires_grad=True), pnp.array(scale, requires_grad=True))
    dev = split(8, mode)
    sums = dev._backend.messages.traffic.sums
    got = pc.metric_tensor(qml.QNode(circuit, dev))(*args)
    if mode == "deferred":
        assert dev._backend.messages.traffic.sums - sums == 1
    single = qml.device(DEVICE, wires=8, backend="cpu", grad_accumulation=mode)
    expected = pc.metric_tensor(qml.QNode(circuit, single))(*args)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, atol=ATOL)
    assert all(np.array_equal(v, COMM.allgather(got[0])[0]) for v in COMM.allgather(got[0]))
