"""The GPU benchmark: per-gate roofline of the cuStateVec backend, and workloads against a
torch-on-CUDA peer and our own CPU backend.

    python benchmarks/gpu_bench.py [--quick | --dry-run] [--repeat 5] [--out FILE.md]

1. Gates: RX, CNOT, a dense 2-qubit unitary and fused 4- and 5-qubit blocks (dense
   unitaries, as fusion makes them) applied by the backend to one state of 26, 28 and 30
   qubits, complex128 and complex64. Effective bandwidth = the bytes the gate must read and
   write (2 x the amplitudes it changes x their size: CNOT changes the half with its
   control set) / the time per gate, against the device's copy bandwidth measured in the
   same run (a cupy device-to-device copy, bytes read plus written).
2. Workloads (``workloads.BUILDERS``) at GPU sizes: W1 at 24 and 28 qubits, W3, W5, W6;
   ours on the GPU against ``default.qubit`` backprop with torch CUDA tensors and against
   ours on the CPU backend (all cores), values and gradients cross-checked
   (``run_workloads.cross_check``); peak GPU memory of each configuration.

A markdown report (``--out``) is rewritten after every row, so that a run stopped at its
time limit keeps what it measured; a summary table ends it. Without a usable GPU the script
says why and exits 0; ``--dry-run`` runs every table at tiny sizes on the CPU backend (numpy
copies for the bandwidth, torch on the CPU) to exercise the code here.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pennylane as qml
import torch
from run_workloads import (  # the workload report's cells and helpers, shared
    Cell,
    _seconds,
    _version,
    cross_check,
    error_note,
    progress,
    table_lines,
)
from workloads import BUILDERS, Setup

from pennylane_custatevec.backends import custatevec, gpu
from pennylane_custatevec.backends.cpu import CPUBackend

SEED = 1234
GB = 1e9
MIB = 1 << 20
VERSIONS_REPORTED = (
    "pennylane",
    "torch",
    "cupy-cuda13x",
    "cuquantum-python-cu13",
    "custatevec-cu13",
)


# --- where it runs ------------------------------------------------------------------------


@dataclass
class Machine:
    """The GPU (cupy and the cuStateVec backend) or, for ``--dry-run``, the CPU backend.

    ``backend(dtype)`` makes the backend of the gate table; ``synchronize`` waits for its
    work; ``copy_bandwidth(nbytes)`` measures bytes read plus written per second of a
    device-to-device copy; ``reset_peak`` / ``peak_bytes`` bracket a configuration's GPU
    memory (None on the CPU); ``ours_options`` builds our GPU column's device;
    ``torch_device`` holds the torch peer's tensors."""

    label: str
    backend: Callable[[np.dtype], object]
    synchronize: Callable[[], None]
    copy_bandwidth: Callable[[int], float]
    reset_peak: Callable[[], None] | None = None
    peak_bytes: Callable[[], int] | None = None
    ours_options: dict = field(default_factory=dict)
    torch_device: str = "cpu"


def gpu_machine() -> Machine:
    """The GPU, or RuntimeError saying why it cannot be used."""
    reason = gpu.unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    import cupy as cp

    pool = cp.get_default_memory_pool()

    def copy_bandwidth(nbytes: int) -> float:
        source, destination = cp.ones(nbytes, dtype=cp.uint8), cp.empty(nbytes, dtype=cp.uint8)
        destination.data.copy_from_device_async(source.data, nbytes)  # cudaMemcpyAsync, D2D
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        repeat = 10
        start.record()
        for _ in range(repeat):
            destination.data.copy_from_device_async(source.data, nbytes)
        stop.record()
        stop.synchronize()
        seconds = cp.cuda.get_elapsed_time(start, stop) / 1e3 / repeat
        del source, destination
        pool.free_all_blocks()
        return 2 * nbytes / seconds

    def reset_peak() -> None:
        gc.collect()
        pool.free_all_blocks()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    def peak_bytes() -> int:
        # cupy's pool keeps freed blocks: what it holds is the high-water mark of our
        # arrays since reset_peak (an upper bound: a freed block may be the wrong size)
        return pool.total_bytes() + torch.cuda.max_memory_allocated()

    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    return Machine(
        label=f"{name} (cuStateVec backend)",
        backend=custatevec.CuStateVecBackend,
        synchronize=lambda: cp.cuda.Device().synchronize(),
        copy_bandwidth=copy_bandwidth,
        reset_peak=reset_peak,
        peak_bytes=peak_bytes,
        torch_device="cuda",
    )


def cpu_machine() -> Machine:
    """--dry-run: the CPU backend for the gates and for our 'GPU' column, torch on the CPU."""

    def copy_bandwidth(nbytes: int) -> float:
        source, destination = np.ones(nbytes, dtype=np.uint8), np.empty(nbytes, dtype=np.uint8)
        start = time.perf_counter()
        np.copyto(destination, source)
        return 2 * nbytes / (time.perf_counter() - start)

    return Machine(
        label="dry run: CPU backend, numpy copy",
        backend=CPUBackend,
        synchronize=lambda: None,
        copy_bandwidth=copy_bandwidth,
        ours_options={"backend": "cpu"},
    )


# --- 1. gates -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Gate:
    """A gate of the table: a ``matrix`` on ``len(matrix)`` bits (log2), ``controls``
    control bits set to 1."""

    name: str
    matrix: np.ndarray
    controls: int = 0

    @property
    def n_targets(self) -> int:
        return int(self.matrix.shape[0]).bit_length() - 1


def _random_unitary(dimension: int, rng: np.random.Generator) -> np.ndarray:
    z = rng.normal(size=(dimension, dimension)) + 1j * rng.normal(size=(dimension, dimension))
    q, r = np.linalg.qr(z)
    return q * (np.diag(r) / np.abs(np.diag(r)))


def gates(seed: int = SEED) -> list[Gate]:
    """RX(0.3), CNOT (X with one control), random unitaries on 2, 4 and 5 bits."""
    rng = np.random.default_rng(seed)
    c, s = np.cos(0.15), np.sin(0.15)
    return [
        Gate("RX", np.array([[c, -1j * s], [-1j * s, c]])),
        Gate("CNOT", np.array([[0, 1], [1, 0]], dtype=complex), controls=1),
        Gate("2-qubit dense", _random_unitary(4, rng)),
        Gate("fused 4-qubit", _random_unitary(16, rng)),
        Gate("fused 5-qubit", _random_unitary(32, rng)),
    ]


def gate_bytes(n_qubits: int, gate: Gate, itemsize: int) -> int:
    """What the gate must read and write: 2 x the amplitudes it changes (those with every
    control set) x ``itemsize``."""
    return 2 * (1 << (n_qubits - gate.controls)) * itemsize


def placement(n_qubits: int, gate: Gate) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(targets, controls): targets from the middle bit up (or the highest bits, on a
    small state), the control on bit 0."""
    low = min(n_qubits // 2, n_qubits - gate.n_targets)
    return tuple(range(low, low + gate.n_targets)), tuple(range(gate.controls))


@dataclass(frozen=True)
class GateTiming:
    n_qubits: int
    dtype: str
    gate: str
    seconds: float
    bandwidth: float
    """Effective bytes per second (``gate_bytes`` / ``seconds``)."""


def time_gates(machine: Machine, sizes: Sequence[int], repeat: int) -> Iterator[GateTiming]:
    """Each gate of :func:`gates` on one state per size and dtype: mean of ``repeat``
    applications after two warm-ups, synchronised once around them."""
    for n_qubits in sizes:
        for dtype in (np.complex128, np.complex64):
            backend = machine.backend(dtype)
            state = backend.zero_state(n_qubits, 1)
            for gate in gates():
                moved = gate_bytes(n_qubits, gate, np.dtype(dtype).itemsize)
                seconds = _seconds_per_gate(machine, backend, state, gate, repeat)
                yield GateTiming(
                    n_qubits, np.dtype(dtype).name, gate.name, seconds, moved / seconds
                )
            del state, backend
            gc.collect()


def _seconds_per_gate(machine: Machine, backend, state, gate: Gate, repeat: int) -> float:
    targets, controls = placement(state.shape[1].bit_length() - 1, gate)
    values = (1,) * len(controls)
    for _ in range(2):
        backend.apply_matrix(state, gate.matrix[None], targets, controls, values)
    machine.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        backend.apply_matrix(state, gate.matrix[None], targets, controls, values)
    machine.synchronize()
    return (time.perf_counter() - start) / repeat


def gate_lines(timings: Sequence[GateTiming], copy_bandwidth: float | None) -> list[str]:
    """The per-gate table; the last column is the fraction of the copy bandwidth."""
    lines = [
        "| qubits | dtype | gate | time per gate | effective bandwidth | of copy bandwidth |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for t in timings:
        share = f"{t.bandwidth / copy_bandwidth:.0%}" if copy_bandwidth else "-"
        lines.append(
            f"| {t.n_qubits} | {t.dtype} | {t.gate} | {_seconds(t.seconds)} | "
            f"{_gb_per_s(t.bandwidth)} | {share} |"
        )
    return lines


# --- 2. workloads -------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """A configuration of the workload table: ``setup`` for ``workloads.BUILDERS``, extra
    ``device_options`` for its device, the torch device of its tensors (``torch_device``)."""

    label: str
    setup: Setup
    device_options: tuple = ()
    torch_device: str = "cpu"
    on_gpu: bool = False
    backend: str | None = None
    """The backend our device must run on (its GPU column must not fall back unseen)."""


def columns(machine: Machine) -> tuple[Column, ...]:
    """Ours on the GPU, default.qubit backprop with torch tensors on the GPU, ours on the CPU."""
    ours = Setup("custatevec.qubit", "adjoint", device_vjp=True)
    where = "GPU" if machine.torch_device == "cuda" else "dry run: CPU"
    return (
        Column(
            f"ours ({where})",
            ours,
            tuple(machine.ours_options.items()),
            on_gpu=True,
            backend=machine.ours_options.get("backend", "custatevec"),
        ),
        Column(
            f"default.qubit backprop, torch {machine.torch_device}",
            Setup("default.qubit", "backprop"),
            torch_device=machine.torch_device,
            on_gpu=machine.torch_device == "cuda",
        ),
        Column("ours (CPU backend)", ours, (("backend", "cpu"),), backend="cpu"),
    )


@dataclass(frozen=True)
class Row:
    """One workload row: ``workload`` of ``workloads.BUILDERS`` at ``sizes``; ``skip`` maps
    a column index to why that column does not run it."""

    workload: str
    sizes: dict
    skip: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.workload} ({', '.join(f'{k}={v}' for k, v in self.sizes.items())})"


BACKPROP_MEMORY = "n/a: backprop keeps every gate's state (GPU memory)"
CPU_TIME = "n/a: minutes per step on the CPU"
ROWS = {
    "full": (
        Row("W1", {"n_wires": 24}),
        Row("W1", {"n_wires": 28}, {1: BACKPROP_MEMORY}),
        Row("W3", {"n_wires": 20, "batch": 64}),
        Row("W5", {"n_wires": 26, "depth": 4}, {1: BACKPROP_MEMORY}),
        Row("W6", {"n_wires": 30}, {1: BACKPROP_MEMORY}),
    ),
    "quick": (
        Row("W1", {"n_wires": 24}),
        Row("W1", {"n_wires": 28}, {1: BACKPROP_MEMORY, 2: CPU_TIME}),
        Row("W3", {"n_wires": 16, "batch": 64}),
        Row("W5", {"n_wires": 22, "depth": 2}),
        Row("W6", {"n_wires": 28}, {1: BACKPROP_MEMORY, 2: CPU_TIME}),
    ),
    "dry-run": (
        Row("W1", {"n_wires": 4}),
        Row("W1", {"n_wires": 6}, {1: BACKPROP_MEMORY}),
        Row("W3", {"n_wires": 4, "batch": 4}),
        Row("W5", {"n_wires": 6, "depth": 1}),
        Row("W6", {"n_wires": 6}),
    ),
}
GATE_QUBITS = {"full": (26, 28, 30), "quick": (26, 28, 30), "dry-run": (6, 8)}
COPY_BYTES = {"full": 4 << 30, "quick": 4 << 30, "dry-run": 1 << 20}


@contextlib.contextmanager
def devices_built(device_name: str, options: dict) -> Iterator[list]:
    """In the block, ``qml.device(device_name, ...)`` gets ``options`` as keyword arguments
    (the workloads build their devices with defaults; our CPU column needs backend="cpu"),
    and the devices it builds are collected in the list yielded."""
    original, built = qml.device, []

    def device(name, *args, **kwargs):
        if name != device_name:
            return original(name, *args, **kwargs)
        built.append(original(name, *args, **{**options, **kwargs}))
        return built[-1]

    qml.device = device
    try:
        yield built
    finally:
        qml.device = original


def run_cell(machine: Machine, row: Row, column: Column, repeat: int) -> Cell:
    """Build, warm up (the cross-check's arrays), time the best of ``repeat`` steps, and
    note the configuration's peak GPU memory."""
    measure_gpu = column.on_gpu and machine.reset_peak is not None
    try:
        with torch.device(column.torch_device):
            if measure_gpu:
                machine.reset_peak()
            with devices_built(column.setup.device, dict(column.device_options)) as built:
                workload = BUILDERS[row.workload](column.setup, **row.sizes)
            if column.backend is not None:
                elsewhere = {device.backend_name for device in built} - {column.backend}
                if elsewhere:
                    return Cell(note=f"ERROR: ran on backend {', '.join(sorted(elsewhere))}")
            cell = Cell(arrays=workload.step())
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                workload.step()
                machine.synchronize()
                times.append(time.perf_counter() - start)
            cell.seconds = min(times)
            if measure_gpu:
                cell.note = f"GPU peak {machine.peak_bytes() / MIB:.0f} MiB"
            return cell
    except torch.OutOfMemoryError as exc:
        return Cell(note=f"out of GPU memory ({str(exc).splitlines()[0][:60]})")
    except Exception as exc:  # reported in the table, the traceback on stderr
        import traceback

        traceback.print_exc()
        return Cell(note=error_note(exc))
    finally:
        workload = None
        gc.collect()


def run_row(machine: Machine, row: Row, repeat: int) -> list[Cell]:
    cells = []
    for index, column in enumerate(columns(machine)):
        if index in row.skip:
            cells.append(Cell(note=row.skip[index]))
            continue
        progress(f"{row.label}: {column.label}")
        cells.append(run_cell(machine, row, column, repeat))
    cross_check(cells)
    return cells


# --- the report ---------------------------------------------------------------------------


@dataclass
class Report:
    machine_label: str
    mode: str
    repeat: int
    gate_repeat: int
    copy_bandwidth: float | None = None
    gates: list[GateTiming] = field(default_factory=list)
    rows: dict[str, list[Cell]] = field(default_factory=dict)
    note: str = ""


def render(report: Report, labels: Sequence[str]) -> str:
    """The markdown report: environment, the gate table, the workload table, a summary."""
    versions = ", ".join(
        f"{name} {_version(name)}"
        for name in (
            "pennylane",
            "torch",
            "cupy-cuda13x",
            "cuquantum-python-cu13",
            "custatevec-cu13",
        )
    )
    lines = [
        "# GPU benchmark",
        "",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- machine: {report.machine_label}; {platform.platform()}",
        f"- python {platform.python_version()}, {versions}",
        f"- sizes: {report.mode}; times: gates the mean of {report.gate_repeat} after two warm-ups,"
        f"  workloads the best of {report.repeat} steps after one warm-up",
    ]
    if report.note:
        return "\n".join([*lines, "", report.note]) + "\n"
    copy = report.copy_bandwidth
    lines += ["", "## Gates", ""]
    lines.append(
        f"Copy bandwidth (device-to-device, read + written): {_gb_per_s(copy)}."
        if copy
        else "Copy bandwidth: not measured yet."
    )
    lines += ["", *gate_lines(report.gates, copy), "", "## Workloads", ""]
    if report.rows:
        lines += table_lines("workload", labels[0], [_Labelled(x) for x in labels[1:]], report.rows)
    lines += ["", "## Summary", "", *summary_lines(report, labels)]
    lines += [
        "",
        "ratio = peer time / our GPU time. Every configuration's values and gradients are",
        "compared with the first peer that ran (np.allclose, atol 1e-6): **MISMATCH** if not.",
        "GPU peak: what cupy's pool held after the steps (freed blocks kept, an upper bound of",
        "the peak) plus torch's peak allocation, both reset before the build.",
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class _Labelled:
    """A column header for ``run_workloads.table_lines``, which reads ``.label``."""

    label: str


def summary_lines(report: Report, labels: Sequence[str]) -> list[str]:
    """One table: the gates' share of the copy bandwidth per size and dtype, then each
    workload's GPU time against each peer."""
    lines = ["| measured | result |", "| --- | --- |"]
    if report.copy_bandwidth:
        lines.append(f"| copy bandwidth | {_gb_per_s(report.copy_bandwidth)} |")
        groups: dict[tuple[int, str], list[GateTiming]] = {}
        for t in report.gates:
            groups.setdefault((t.n_qubits, t.dtype), []).append(t)
        for (n_qubits, dtype), timings in groups.items():
            shares = ", ".join(
                f"{t.gate} {t.bandwidth / report.copy_bandwidth:.0%}" for t in timings
            )
            lines.append(f"| gates, {n_qubits} qubits, {dtype}: of copy bandwidth | {shares} |")
    for label, cells in report.rows.items():
        ours = cells[0]
        parts = [f"{labels[0]} {_cell(ours)}"]
        for peer_label, peer in zip(labels[1:], cells[1:], strict=True):
            ratio = (
                f" ({peer.seconds / ours.seconds:.2f}x)"
                if peer.seconds is not None and ours.seconds is not None
                else ""
            )
            parts.append(f"{peer_label} {_cell(peer)}{ratio}")
        lines.append(f"| {label} | {'; '.join(parts)} |".replace("\n", " "))
    return lines


def _cell(cell: Cell) -> str:
    text = [_seconds(cell.seconds)] if cell.seconds is not None else []
    return ", ".join([*text, cell.note] if cell.note else text) or "-"


def _gb_per_s(bytes_per_second: float) -> str:
    value = bytes_per_second / GB
    return f"{value:.0f} GB/s" if value >= 100 else f"{value:.3g} GB/s"


# --- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="fewer peers at the largest sizes")
    sizes.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU backend")
    parser.add_argument("--repeat", type=int, default=None, help="timed steps (default 5, 2)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_bench.md"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mode = "dry-run" if args.dry_run else "quick" if args.quick else "full"
    repeat = args.repeat or (5 if mode == "full" else 2)
    gate_repeat = 2 if mode == "dry-run" else 10
    try:
        machine = cpu_machine() if args.dry_run else gpu_machine()
    except RuntimeError as exc:
        machine = None
        note = f"No GPU: {exc}. Nothing measured; --dry-run runs the tables on the CPU."
    labels = [column.label for column in columns(machine or cpu_machine())]
    report = Report(machine.label if machine else "no GPU", mode, repeat, gate_repeat)
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        args.out.write_text(render(report, labels), encoding="utf-8")

    if machine is None:
        report.note = note
        write()
        print(note)
        return 0
    torch.manual_seed(SEED)
    report.copy_bandwidth = machine.copy_bandwidth(COPY_BYTES[mode])
    progress(f"copy bandwidth {report.copy_bandwidth / GB:.0f} GB/s")
    for timing in time_gates(machine, GATE_QUBITS[mode], gate_repeat):
        report.gates.append(timing)
        write()
    for row in ROWS[mode]:
        report.rows[row.label] = run_row(machine, row, repeat)
        write()
    write()
    print(args.out.read_text(encoding="utf-8"))
    mismatches = [label for label, cells in report.rows.items() if any(c.mismatch for c in cells)]
    if mismatches:
        print(f"gpu_bench.py: MISMATCH in {', '.join(mismatches)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
