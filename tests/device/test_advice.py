"""Errors and warnings that name the fix (pennylane_custatevec/advice.py): the messages
verbatim, and that the device raises them where a user meets them."""

from __future__ import annotations

import inspect

import numpy as np
import pennylane as qml
import pytest

from pennylane_custatevec import CuStateVecDevice, advice, simulate
from pennylane_custatevec.backends.cpu import CPUBackend
from pennylane_custatevec.device_options import UnknownOptionError

VALID = list(advice.OPTIONS)
LISTED = (
    "custatevec.qubit got unknown option(s) {}; valid options are wires, shots, seed, "
    "c_dtype, backend, device_id, grad_accumulation, fusion_qubits, mpi, mpi_gather."
)


def test_options_are_the_device_signature():
    names = [
        name
        for name, p in inspect.signature(CuStateVecDevice.__init__).parameters.items()
        if name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    assert tuple(names) == advice.OPTIONS


def test_a_misspelt_option_gets_did_you_mean():
    assert advice.unknown_options(["c_dype"], VALID) == (
        LISTED.format("['c_dype']") + " Did you mean 'c_dtype' (not 'c_dype')?"
    )


def test_a_far_option_gets_the_list_only():
    assert advice.unknown_options(["zzz"], VALID) == LISTED.format("['zzz']")


@pytest.mark.parametrize("name", ["batch_obs", "mpi_buf_size", "kokkos_args", "use_async"])
def test_other_devices_options_say_what_does_their_job(name):
    message = advice.unknown_options([name], VALID)
    assert message == (
        LISTED.format(f"[{name!r}]")
        + f" {name!r} is an option of other PennyLane devices: "
        + advice.OTHER_DEVICES_OPTIONS[name]
        + "."
    )
    assert "not needed here" in message


def test_the_device_raises_the_advice():
    with pytest.raises(UnknownOptionError, match=r"Did you mean 'c_dtype' \(not 'c_dype'\)\?"):
        qml.device("custatevec.qubit", wires=1, backend="cpu", c_dype=np.complex64)
    with pytest.raises(UnknownOptionError, match="NUMBA_NUM_THREADS"):
        qml.device("custatevec.qubit", wires=1, backend="cpu", kokkos_args=None)


def test_single_rank_warning():
    assert advice.single_rank_warning(2) is None
    assert advice.single_rank_warning(1) == (
        "custatevec.qubit got mpi=True but runs on 1 MPI rank: the state vector is not "
        "split. Launch the script with mpiexec (mpiexec -n 4 python script.py: P ranks, P a "
        "power of two), or leave mpi out to run in one process."
    )


def test_mpi_true_on_one_rank_warns():
    pytest.importorskip("mpi4py")
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() != 1:
        pytest.skip("runs on one rank")
    with pytest.warns(UserWarning, match="mpiexec"):
        qml.device("custatevec.qubit", wires=2, backend="cpu", mpi=True)


def test_too_large_suggests_only_what_fits():
    # 40 qubits at complex128 in 24 GiB: complex64 would not fit, 30 wires would
    needed, available = 16 * 2**40, 24 * 2**30
    assert advice.state_too_large(40, 1, "complex128", "cpu", needed, available) == (
        "Simulating 40 qubits (batch of 1, complex128) needs 17,592,186,044,416 bytes of cpu "
        "memory; 25,769,803,776 bytes are available (682.7x too large, short by "
        "17,566,416,240,640 bytes). What would fit: at most 30 wires (31 with "
        "c_dtype=numpy.complex64)."
    )


def test_too_large_names_complex64_and_a_smaller_batch_where_they_fit():
    needed = 4 * 16 * 2**20  # a batch of 4 at 20 qubits
    message = advice.state_too_large(20, 4, "complex128", "custatevec", needed, needed - 1)
    assert message.endswith(
        "(1.0x too large, short by 1 bytes). What would fit: c_dtype=numpy.complex64 (half "
        "the bytes per amplitude); or a batch of at most 3 vectors; or at most 19 wires."
    )
    single = advice.state_too_large(20, 1, "complex64", "cpu", 8 * 2**20, 3 * 2**20)
    assert "complex64 (half" not in single and "batch of at most" not in single
    assert single.endswith("What would fit: at most 18 wires.")


def test_the_device_raises_the_too_large_advice(monkeypatch):
    monkeypatch.setattr(simulate, "UNCHECKED_BYTES", 0)
    monkeypatch.setattr(CPUBackend, "available_bytes", lambda self: 16 * 2**10)
    dev = qml.device("custatevec.qubit", wires=12, backend="cpu")

    @qml.qnode(dev)
    def circuit():
        for w in range(12):
            qml.Hadamard(w)
        return qml.state()

    with pytest.raises(simulate.StateTooLargeError, match=r"What would fit: at most 10 wires"):
        circuit()


def test_channels_point_to_default_mixed():
    dev = qml.device("custatevec.qubit", wires=1, backend="cpu")

    @qml.qnode(dev)
    def circuit():
        qml.AmplitudeDamping(0.1, wires=0)
        return qml.expval(qml.Z(0))

    with pytest.raises(qml.exceptions.DeviceError) as info:
        circuit()
    assert str(info.value) == (
        "custatevec.qubit simulates pure states and does not apply the noise channel "
        "AmplitudeDamping. Use qml.device('default.mixed', wires=...) for noisy circuits "
        "(density matrices), or remove the channel."
    )
