"""Error and warning messages that name the fix: what a user wrote, what was meant, and
what to do instead. Plain functions of plain values (and one PennyLane transform), so that
each message is tested without the state it describes; nothing here imports the package."""

from __future__ import annotations

import difflib
import math

DEVICE = "custatevec.qubit"

OPTIONS = (
    "wires",
    "shots",
    "seed",
    "c_dtype",
    "backend",
    "device_id",
    "grad_accumulation",
    "fusion_qubits",
    "mpi",
    "mpi_gather",
)
"""The device's options, in the order of its signature (tests check them against it)."""

OTHER_DEVICES_OPTIONS = {
    "batch_obs": (
        "not needed here: every measurement of a circuit is taken from one state, and the "
        "adjoint method differentiates all of a circuit's outputs in one sweep "
        "(grad_accumulation='deferred', the default)"
    ),
    "mpi_buf_size": (
        "not needed here: with mpi=True each exchange of a bit swap sends half a slice in "
        "one message; there is no buffer size to set"
    ),
    "kokkos_args": (
        "not needed here: the CPU backend runs numba kernels; set their threads with the "
        "NUMBA_NUM_THREADS environment variable"
    ),
    "use_async": (
        "not needed here: the custatevec backend already runs on its own CUDA stream per GPU"
    ),
    "sync": "not needed here: results are synchronised before they are returned",
    "mcmc": "not supported: samples are drawn exactly from the state vector",
    "kernel_name": "not supported: samples are drawn exactly from the state vector",
    "num_burnin": "not supported: samples are drawn exactly from the state vector",
    "max_workers": (
        "not supported: a batch of tapes that share a structure already runs as one batch "
        "of state vectors; for data parallelism see doc/data_parallel.md (torch.distributed)"
    ),
    "r_dtype": "set c_dtype instead (numpy.complex128 or numpy.complex64)",
    "dtype": "set c_dtype instead (numpy.complex128 or numpy.complex64)",
    "analytic": "use shots=None (analytic, the default) or qml.set_shots on the QNode",
}
"""Options of lightning.qubit, lightning.gpu, lightning.kokkos and default.qubit that this
device does not take, and what does their job here (or why none is needed)."""


def unknown_options(unknown: list[str], valid: list[str]) -> str:
    """The message of an unknown option: for each name, the close valid option ("did you
    mean") or what does the job of another device's option here."""
    hints = []
    for name in unknown:
        hint = OTHER_DEVICES_OPTIONS.get(name)
        if hint is not None:
            hints.append(f"{name!r} is an option of other PennyLane devices: {hint}.")
            continue
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
        if close:
            hints.append(f"Did you mean {close[0]!r} (not {name!r})?")
    message = (
        f"{DEVICE} got unknown option(s) {sorted(unknown)}; valid options are {', '.join(valid)}."
    )
    return " ".join([message, *hints])


def single_rank_warning(size: int) -> str | None:
    """The warning for ``mpi=True`` in a job of ``size`` ranks, or None (more than one)."""
    if size != 1:
        return None
    return (
        f"{DEVICE} got mpi=True but runs on 1 MPI rank: the state vector is not split. "
        "Launch the script with mpiexec (mpiexec -n 4 python script.py: P ranks, P a power "
        "of two), or leave mpi out to run in one process."
    )


def state_too_large(
    num_qubits: int,
    batch_size: int,
    dtype_name: str,
    where: str,
    needed: int,
    available: int,
) -> str:
    """The message for state vectors that do not fit: by how much, and only the changes
    that would fit (fewer wires, a smaller batch, complex64)."""
    ratio = needed / max(available, 1)
    message = (
        f"Simulating {num_qubits} qubits (batch of {batch_size}, {dtype_name}) needs "
        f"{needed:,} bytes of {where} memory; {available:,} bytes are available "
        f"({ratio:,.1f}x too large, short by {needed - available:,} bytes)."
    )
    fitting = []
    # each wire fewer halves the bytes
    fewer = num_qubits - max(1, math.ceil(math.log2(ratio)))
    double = dtype_name == "complex128"
    if double and needed // 2 <= available:
        fitting.append("c_dtype=numpy.complex64 (half the bytes per amplitude)")
    if batch_size > 1:
        largest = available // max(needed // batch_size, 1)
        if largest >= 1:
            fitting.append(f"a batch of at most {largest} vectors")
    if fewer >= 1:
        wires = f"at most {fewer} wires"
        if double and not fitting:
            wires += f" ({fewer + 1} with c_dtype=numpy.complex64)"
        fitting.append(wires)
    if not fitting:
        return f"{message} Nothing smaller fits: free memory first."
    return f"{message} What would fit: {'; or '.join(fitting)}."


def channel_message(name: str) -> str:
    """The refusal of a noise channel: this is a state-vector simulator."""
    return (
        f"{DEVICE} simulates pure states and does not apply the noise channel {name}. Use "
        "qml.device('default.mixed', wires=...) for noisy circuits (density matrices), or "
        "remove the channel."
    )
