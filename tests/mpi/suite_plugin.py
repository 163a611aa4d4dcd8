"""A pytest plugin (``-p suite_plugin``) for PennyLane's device test suite under
``mpiexec`` (scripts/run_tests.sh): every custatevec.qubit device the suite builds is split
over the job's ranks, vectors of 2 local bits and more (the suite's circuits are small)."""

from __future__ import annotations

from pennylane_custatevec.device import CuStateVecDevice

_plain_init = CuStateVecDevice.__init__


def _split_init(self, *args, **kwargs):
    kwargs.setdefault("mpi", True)
    _plain_init(self, *args, **kwargs)
    self._backend.min_local_qubits = 2


CuStateVecDevice.__init__ = _split_init
