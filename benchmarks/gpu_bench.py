"""The GPU benchmark: per-gate latency and roofline of the cuStateVec backend, what it
takes of GPU memory, and workloads against a torch-on-CUDA peer and our own CPU backend.

    python benchmarks/gpu_bench.py [--quick | --check | --dry-run] [--part PART]
        [--columns all|ours|peers] [--save FILE] [--peers FILE] [--repeat 5] [--out FILE.md]

Parts (``--part``; ``all``, the default, runs every one):

* ``latency``: RX, CNOT and a dense 2-qubit unitary at 8 to 20 qubits (complex128 and
  complex64), each the mean of many applications, where launch and call overhead
  dominate; and the time of cuStateVec's ``create()`` and of building a device.
* ``gates``: the same gates and fused 4- and 5-qubit blocks (dense unitaries, as fusion
  makes them) on one state of 26, 28 and 30 qubits. Effective bandwidth = the bytes the
  gate must read and write (2 x the amplitudes it changes x their size: CNOT changes the
  half with its control set) / the time per gate, against the device's copy bandwidth
  measured in the same run (a device-to-device copy, bytes read plus written).
* ``workloads``: W1, W3, W5, W6 (``workloads.BUILDERS``) at GPU sizes; ours on the GPU
  against ``default.qubit`` backprop with torch CUDA tensors and against ours on the CPU
  backend, values and gradients cross-checked (``run_workloads.cross_check``), and what
  each configuration took of GPU memory. ``--columns peers --save FILE`` runs the peers
  only and keeps their cells; ``--columns ours --peers FILE`` runs ours and cross-checks
  against them (the GPU check splits the table over its two calls so).
* ``memory``: what a cuStateVec handle, a 26-qubit state, a 5-qubit gate's workspace and
  a W1 step take, as drops of the driver's free memory (``memGetInfo``: everything,
  the handle's workspace and the stream-ordered pool included), beside each pool's own
  figure (``gpu_machine.memory_note``).

A markdown report (``--out``) is rewritten after every row, so that a run stopped at its
time limit keeps what it measured. Without a usable GPU the script says why and exits 0;
``--dry-run`` runs every table at tiny sizes on the CPU backend (numpy copies for the
bandwidth, torch on the CPU) to exercise the code here.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import pickle
import platform
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pennylane as qml
import torch
from gpu_machine import Machine, cpu_machine, gpu_machine, memory_note, torch_machine
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

from pennylane_custatevec.backends import gpu

SEED = 1234
GB = 1e9
VERSIONS_REPORTED = (
    "pennylane",
    "torch",
    "cupy-cuda13x",
    "cuquantum-python-cu13",
    "custatevec-cu13",
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


LATENCY_GATES = 3
"""The latency table's gates: the first three of :func:`gates` (RX, CNOT, 2-qubit dense)."""


def time_gates(
    machine: Machine, sizes: Sequence[int], repeat: int, first: int | None = None
) -> Iterator[GateTiming]:
    """Each gate of :func:`gates` (the ``first`` ones) on one state per size and dtype:
    mean of ``repeat`` applications after two warm-ups, synchronised once around them."""
    for n_qubits in sizes:
        for dtype in (np.complex128, np.complex64):
            backend = machine.backend(dtype)
            state = backend.zero_state(n_qubits, 1)
            for gate in gates()[:first]:
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
    "check": (  # scripts/gpu_check.sh: our CPU column within a minute or so on 16 cores
        Row("W1", {"n_wires": 20}),
        Row("W1", {"n_wires": 28}, {1: BACKPROP_MEMORY, 2: CPU_TIME}),
        Row("W3", {"n_wires": 16, "batch": 64}),
        Row("W5", {"n_wires": 20, "depth": 2}),
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
GATE_QUBITS = {
    "full": (26, 28, 30),
    "quick": (26, 28, 30),
    "check": (26, 28, 30),
    "dry-run": (6, 8),
}
LATENCY_QUBITS = {"dry-run": (3, 5)}
"""Sizes of the latency table; every mode but the dry run: 8, 12, 16 and 20 qubits."""
COPY_BYTES = {"dry-run": 1 << 20}
"""Bytes of the copy that measures the bandwidth; every mode but the dry run: 4 GiB."""
MEMORY_QUBITS = {"dry-run": 6}
"""The memory table's state; every mode but the dry run: 26 qubits (1 GiB at complex128)."""


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
    note what the configuration took of GPU memory."""
    measure_gpu = column.on_gpu and machine.reset_memory is not None
    try:
        with torch.device(column.torch_device):
            before = machine.reset_memory() if measure_gpu else None
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
            if before is not None:
                cell.note = memory_note(before, machine.memory())
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


PEER_COLUMNS = (1, 2)
"""The workload table's peers (default.qubit on torch, ours on the CPU): ``--columns``."""


def run_row(
    machine: Machine, row: Row, repeat: int, run: Sequence[int], saved: list[Cell] | None
) -> list[Cell]:
    """The row's cells: the columns ``run`` runs, the others from ``saved`` (an earlier
    run's cells of this row) or noted as not run here; then the cross-check."""
    cells = []
    for index, column in enumerate(columns(machine)):
        if index in row.skip:
            cells.append(Cell(note=row.skip[index]))
        elif index not in run:
            cells.append(saved[index] if saved else Cell(note="not run in this call"))
        else:
            progress(f"{row.label}: {column.label}")
            cells.append(run_cell(machine, row, column, repeat))
    cross_check(cells)
    return cells


# --- 3. memory ----------------------------------------------------------------------------


def memory_rows(machine: Machine, mode: str) -> Iterator[tuple[str, str]]:
    """(what, ``memory_note``) for a cuStateVec handle, a state, a 5-qubit gate on it (its
    workspace) and a W1 step, each from emptied pools."""
    n = MEMORY_QUBITS.get(mode, 26)
    libraries = gpu.import_libraries()
    before = machine.reset_memory()
    handle = libraries.custatevec.create()
    yield "a cuStateVec handle (create())", memory_note(before, machine.memory())
    libraries.custatevec.destroy(handle)
    before = machine.reset_memory()
    backend = machine.backend(np.complex128)
    state = backend.zero_state(n, 1)
    machine.synchronize()
    yield f"a state of {n} qubits, complex128", memory_note(before, machine.memory())
    backend.apply_matrix(state, gates()[-1].matrix[None], tuple(range(5)))
    machine.synchronize()
    yield "and a fused 5-qubit gate on it", memory_note(before, machine.memory())
    del state, backend
    row = ROWS[mode][0]
    cell = run_cell(machine, row, columns(machine)[0], repeat=1)
    yield f"a {row.label} step, ours", cell.note


# --- the report ---------------------------------------------------------------------------

PARTS = ("latency", "gates", "workloads", "memory")


@dataclass
class Report:
    machine_label: str
    mode: str
    repeat: int
    gate_repeat: int
    parts: tuple[str, ...] = PARTS
    copy_bandwidth: float | None = None
    latency: list[GateTiming] = field(default_factory=list)
    create_seconds: list[float] = field(default_factory=list)
    """cuStateVec create() + destroy() of a handle of its own, each time."""
    device_seconds: list[float] = field(default_factory=list)
    """Building a custatevec.qubit device (the GPU's shared handle: after the first)."""
    gates: list[GateTiming] = field(default_factory=list)
    rows: dict[str, list[Cell]] = field(default_factory=dict)
    memory: list[tuple[str, str]] = field(default_factory=list)
    note: str = ""


def render(report: Report, labels: Sequence[str]) -> str:
    """The markdown report: environment, then each part's table, then a summary."""
    versions = ", ".join(f"{name} {_version(name)}" for name in VERSIONS_REPORTED)
    lines = [
        "# GPU benchmark",
        "",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- machine: {report.machine_label}; {platform.platform()}",
        f"- python {platform.python_version()}, {versions}",
        f"- sizes: {report.mode}; times: gates the mean of {report.gate_repeat} after two warm-ups"
        f" (latency: of {latency_repeat(report.mode)}), workloads the best of {report.repeat}"
        " steps after one"
        " warm-up",
    ]
    if report.note:
        return "\n".join([*lines, "", report.note]) + "\n"
    if "latency" in report.parts:
        lines += ["", "## Latency", "", *create_lines(report), ""]
        lines += gate_lines(report.latency, None)
    copy = report.copy_bandwidth
    if "gates" in report.parts:
        lines += ["", "## Gates", ""]
        lines.append(
            f"Copy bandwidth (device-to-device, read + written): {_gb_per_s(copy)}."
            if copy
            else "Copy bandwidth: not measured yet."
        )
        lines += ["", *gate_lines(report.gates, copy)]
    if "workloads" in report.parts:
        lines += ["", "## Workloads", ""]
        if report.rows:
            peers = [_Labelled(x) for x in labels[1:]]
            lines += table_lines("workload", labels[0], peers, report.rows)
    if "memory" in report.parts:
        lines += ["", "## Memory", "", "| what | GPU memory taken |", "| --- | --- |"]
        lines += [f"| {what} | {note} |" for what, note in report.memory]
        if not report.memory:
            lines.append("| - | not measured: no GPU memory to read |")
    lines += ["", "## Summary", "", *summary_lines(report, labels)]
    lines += [
        "",
        "ratio = peer time / our GPU time. Every configuration's values and gradients are",
        "compared with the first peer that ran (np.allclose, atol 1e-6): **MISMATCH** if not.",
        "GPU memory: the drop of the driver's free memory (memGetInfo) from emptied pools to",
        "after the steps, which counts cuStateVec's handle and the stream-ordered pool too;",
        "then what each pool holds (cupy's with its freed blocks, the stream-ordered pool's",
        "high watermark, torch's peak).",
    ]
    return "\n".join(lines) + "\n"


def create_lines(report: Report) -> list[str]:
    """cuStateVec's create() and a device's construction, first and later ones."""

    def times(values: list[float]) -> str:
        return ", ".join(_seconds(v) for v in values) or "not measured"

    return [
        f"- cuStateVec create() + destroy(), a handle of its own: {times(report.create_seconds)}",
        "- qml.device('custatevec.qubit') (the GPU's shared handle): "
        + times(report.device_seconds),
    ]


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

LATENCY_REPEAT = 200
DEVICE_BUILDS = 5


def latency_repeat(mode: str) -> int:
    return 2 if mode == "dry-run" else LATENCY_REPEAT


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="fewer peers at the largest sizes")
    sizes.add_argument("--check", action="store_true", help="the GPU check's sizes")
    sizes.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU backend")
    parser.add_argument("--part", choices=("all", *PARTS), default="all")
    parser.add_argument("--columns", choices=("all", "ours", "peers"), default="all")
    parser.add_argument("--save", type=Path, help="keep the workload cells run here (pickle)")
    parser.add_argument("--peers", type=Path, help="the peers' cells of an earlier --save")
    parser.add_argument("--repeat", type=int, default=None, help="timed steps (default 5, 2)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_bench.md"))
    return parser.parse_args(argv)


def _mode(args: argparse.Namespace) -> str:
    if args.dry_run:
        return "dry-run"
    return "quick" if args.quick else "check" if args.check else "full"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mode = _mode(args)
    repeat = args.repeat or (5 if mode == "full" else 2)
    gate_repeat = 2 if mode == "dry-run" else 10
    parts = PARTS if args.part == "all" else (args.part,)
    try:
        if args.dry_run:
            machine = cpu_machine()
        elif args.columns == "peers" and parts == ("workloads",):
            machine = torch_machine()  # the peers need no cuStateVec
        else:
            machine = gpu_machine()
    except RuntimeError as exc:
        machine = None
        note = f"No GPU: {exc}. Nothing measured; --dry-run runs the tables on the CPU."
    labels = [column.label for column in columns(machine or cpu_machine())]
    report = Report(machine.label if machine else "no GPU", mode, repeat, gate_repeat, parts)
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        args.out.write_text(render(report, labels), encoding="utf-8")

    if machine is None:
        report.note = note
        write()
        print(note)
        return 0
    torch.manual_seed(SEED)
    if "latency" in parts:
        run_latency(machine, report, write)
    if "gates" in parts:
        report.copy_bandwidth = machine.copy_bandwidth(COPY_BYTES.get(mode, 4 << 30))
        progress(f"copy bandwidth {report.copy_bandwidth / GB:.0f} GB/s")
        for timing in time_gates(machine, GATE_QUBITS[mode], gate_repeat):
            report.gates.append(timing)
            write()
    if "workloads" in parts:
        run_workloads(machine, report, args, write)
    if "memory" in parts and machine.reset_memory is not None:
        for entry in memory_rows(machine, mode):
            report.memory.append(entry)
            write()
    write()
    print(args.out.read_text(encoding="utf-8"))
    mismatches = [label for label, cells in report.rows.items() if any(c.mismatch for c in cells)]
    print(f"SUMMARY: {one_line(report, mismatches)}")  # scripts/parts.sh records it
    if mismatches:
        print(f"gpu_bench.py: MISMATCH in {', '.join(mismatches)}", file=sys.stderr)
        return 1
    return 0


def one_line(report: Report, mismatches: list[str]) -> str:
    """What the run measured, in one line (the GPU check's summary of the part)."""
    done = []
    if "latency" in report.parts:
        done.append(f"latency: {len(report.latency)} gate timings")
    if "gates" in report.parts:
        copy = _gb_per_s(report.copy_bandwidth) if report.copy_bandwidth else "not measured"
        done.append(f"gates: {len(report.gates)} timings, copy bandwidth {copy}")
    if "workloads" in report.parts:
        checked = "MISMATCH in " + ", ".join(mismatches) if mismatches else "values agree"
        done.append(f"workloads: {len(report.rows)} rows, {checked}")
    if "memory" in report.parts:
        done.append(f"memory: {len(report.memory)} readings")
    return "; ".join(done)


def run_latency(machine: Machine, report: Report, write) -> None:
    """The latency table, create() and device construction times."""
    sizes = LATENCY_QUBITS.get(report.mode, (8, 12, 16, 20))
    for timing in time_gates(machine, sizes, latency_repeat(report.mode), first=LATENCY_GATES):
        report.latency.append(timing)
        write()
    if machine.create_seconds is not None:
        report.create_seconds = [machine.create_seconds() for _ in range(3)]
    options = {"wires": 2, **machine.ours_options}
    for _ in range(DEVICE_BUILDS):
        start = time.perf_counter()
        qml.device("custatevec.qubit", **options)
        report.device_seconds.append(time.perf_counter() - start)
    write()


def run_workloads(machine: Machine, report: Report, args: argparse.Namespace, write) -> None:
    """The workload rows: the columns ``--columns`` names, the others from ``--peers``;
    ``--save`` keeps the cells run here."""
    run = {"all": (0, *PEER_COLUMNS), "ours": (0,), "peers": PEER_COLUMNS}[args.columns]
    saved = pickle.loads(args.peers.read_bytes()) if args.peers else {}
    for row in ROWS[report.mode]:
        report.rows[row.label] = run_row(machine, row, report.repeat, run, saved.get(row.label))
        write()
    if args.save:
        args.save.write_bytes(pickle.dumps(report.rows))


if __name__ == "__main__":
    sys.exit(main())
