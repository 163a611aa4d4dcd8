"""Run the workloads of bench/WORKLOADS.md on this device and its peers; print ratios.

    python benchmarks/run_workloads.py [--workloads W1,W4] [--quick] [--repeat 3]
                                       [--backend custatevec] [--out FILE.md] [--plot FILE.png]

Every configuration runs each workload once (warm-up) and its values and gradients are
compared with the first peer's; then each is timed, best of ``--repeat`` steps taken
round-robin across the configurations (one step of each per round, each round starting
one configuration later). W6 runs every
configuration in a fresh (spawned) process and reports its peak resident memory. Writes
the markdown report (``--out``) and a bar chart of our deferred and eager times per
workload (``--plot``).
"""

import argparse
import contextlib
import dataclasses
import datetime
import inspect
import multiprocessing
import platform
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np
import pennylane as qml
import plots
import torch
from pennylane.devices import ExecutionConfig
from workloads import BUILDERS, QUICK_SIZES, Arrays, Workload

TORCH_THREADS = 2
SHIFT_WORK_LIMIT = 1e10
"""Amplitude updates per step above which a parameter-shift run is skipped (roughly 10 s)."""
SKIPPED_SHIFT = "skipped: needs adjoint (issue 3)"
MEMORY_WORKLOADS = frozenset({"W6"})
JACOBIAN_WORKLOADS = frozenset({"W2"})
"""Full Jacobians: our device runs them with device Jacobians (one sweep for all outputs)
rather than one VJP per output row."""
EAGER_OPTIONS = (("grad_accumulation", "eager"),)
"""The options of the eager variant of our configuration (see ``eager_variant``)."""


@dataclass(frozen=True)
class Config:
    """A device and how the QNode differentiates on it."""

    label: str
    device: str
    diff_method: str
    device_vjp: bool = False
    options: tuple = ()
    """Overrides of custatevec.qubit's differentiation options, as (name, value) pairs,
    applied with ``pennylane_custatevec.options`` around the build and every step."""


PEERS = (
    Config("lightning.qubit adjoint + device_vjp", "lightning.qubit", "adjoint", True),
    Config("lightning.qubit adjoint (Jacobian on forward)", "lightning.qubit", "adjoint"),
    Config("default.qubit backprop", "default.qubit", "backprop"),
)
PEERS_BY_WORKLOAD = {"W6": PEERS[:1]}
"""W6's other peers would need more memory than these machines have, or many minutes."""
GPU_PEERS = (Config("lightning.gpu adjoint + device_vjp", "lightning.gpu", "adjoint", True),)
"""Peers added with ``--backend custatevec`` when they can be built here."""


@dataclass
class Cell:
    """What one configuration did on one workload; ``note`` says why a figure is missing."""

    arrays: Arrays | None = None
    seconds: float | None = None
    peak_mib: float | None = None
    start_mib: float | None = None
    note: str = ""
    mismatch: bool = False


def our_config(device_name: str, backend: str | None = None) -> Config | str:
    """Adjoint (with device VJPs where supported), else parameter-shift; a str says why none.

    With ``backend``, the device must run on that backend: the workloads build devices with
    their default options, and custatevec.qubit picks the GPU itself when it is usable.
    """
    try:
        device = qml.device(device_name, wires=1)
    except Exception as exc:  # any failure means: not usable in this environment
        return f"unavailable: {type(exc).__name__}: {exc}"
    name = device_name
    if backend is not None:
        in_use = getattr(device, "backend_name", None)
        if in_use != backend:
            return f"unavailable: {device_name} runs on backend {in_use}, not {backend}"
        name = f"{device_name} [{backend}]"
    adjoint = ExecutionConfig(gradient_method="adjoint")
    if device.supports_derivatives(adjoint):
        vjp = device.supports_vjp(adjoint)
        suffix = " + device_vjp" if vjp else " (Jacobian on forward)"
        return Config(f"{name} adjoint{suffix}", device_name, "adjoint", vjp)
    return Config(f"{name} (param-shift)", device_name, "parameter-shift")


def eager_variant(ours: Config | str) -> tuple[Config, ...]:
    """Our configuration with ``grad_accumulation="eager"``, whose column gives the
    deferred/eager ratio; none when ours is not an adjoint custatevec.qubit."""
    if not isinstance(ours, Config) or ours.diff_method != "adjoint":
        return ()
    if not ours.device.startswith("custatevec"):
        return ()
    label = ours.label.replace(" adjoint", " adjoint, eager", 1)
    return (dataclasses.replace(ours, label=label, options=EAGER_OPTIONS),)


def usable_peers(backend: str | None) -> tuple[Config, ...]:
    """PEERS, and with ``backend="custatevec"`` the GPU peers that can be built here."""
    if backend != "custatevec":
        return PEERS
    usable = []
    for peer in GPU_PEERS:
        try:
            qml.device(peer.device, wires=1)
        except Exception as exc:  # not installed, or no GPU: left out, and said why
            progress(f"{peer.device} left out: {type(exc).__name__}: {exc}")
            continue
        usable.append(peer)
    return PEERS + tuple(usable)


def prepare(workload_id: str, config: Config, sizes: dict) -> tuple[Workload | None, Cell]:
    """Build the workload and run its warm-up step, which gives the cross-check arrays."""
    try:
        build = BUILDERS[workload_id]
        with _overrides(config):
            workload = build(config.device, config.diff_method, config.device_vjp, **sizes)
        if config.diff_method == "parameter-shift" and workload.shift_work > SHIFT_WORK_LIMIT:
            return None, Cell(note=SKIPPED_SHIFT)
        if config.options:
            workload = dataclasses.replace(workload, step=_with_overrides(config, workload.step))
        return workload, Cell(arrays=workload.step())
    except Exception as exc:  # reported in the table, the traceback on stderr
        traceback.print_exc()
        return None, Cell(note=f"ERROR: {type(exc).__name__}: {str(exc)[:80]}")


def _overrides(config: Config):
    if not config.options:
        return contextlib.nullcontext()
    import pennylane_custatevec

    return pennylane_custatevec.options(**dict(config.options))


def _with_overrides(config: Config, step: Callable[[], Arrays]) -> Callable[[], Arrays]:
    def step_with_overrides() -> Arrays:
        with _overrides(config):
            return step()

    return step_with_overrides


def best_time(step: Callable[[], object], repeat: int) -> float:
    """Best wall time of ``repeat`` calls (the warm-up has run already)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return min(times)


def measure_in_child(workload_id: str, config: Config, sizes: dict, repeat: int) -> Cell:
    """Warm up, time and report the peak RSS of this (fresh) process."""
    torch.set_num_threads(TORCH_THREADS)
    start_mib = _memory_mib("VmRSS")
    workload, cell = prepare(workload_id, config, sizes)
    if workload is not None:
        _reset_peak_memory()  # the warm-up may have compiled kernels: not the workload's memory
        cell.seconds = best_time(workload.step, repeat)
        cell.peak_mib, cell.start_mib = _memory_mib("VmHWM"), start_mib
    return cell


def _reset_peak_memory() -> None:
    """Set this process's VmHWM to its current resident memory (Linux: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
        clear_refs.write("5")


def _memory_mib(field: str) -> float:
    """A memory figure of this process from /proc/self/status, in MiB.

    The peak is VmHWM, not ru_maxrss: a spawned child's ru_maxrss starts from the RSS of
    the parent it was forked from, which holds the earlier workloads.
    """
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not found in /proc/self/status")


def run_in_fresh_process(workload_id: str, config: Config, sizes: dict, repeat: int) -> Cell:
    context = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
            return pool.submit(measure_in_child, workload_id, config, sizes, repeat).result()
    except Exception as exc:  # e.g. the child was killed for memory
        return Cell(note=f"ERROR in child process: {type(exc).__name__}: {exc}")


def cross_check(cells: list[Cell]) -> None:
    """Mark every cell whose results differ from the first peer's; ``cells[0]`` is ours."""
    peers = [cell for cell in cells[1:] if cell.arrays is not None]
    if not peers:
        return
    for cell in cells:
        if cell.arrays is not None and cell is not peers[0]:
            difference = _difference(cell.arrays, peers[0].arrays)
            if difference:
                cell.note, cell.mismatch = f"**MISMATCH** ({difference})", True


def _difference(arrays: Arrays, reference: Arrays) -> str:
    """Empty when values and gradients match np.allclose(atol=1e-6), else what differs."""
    for name, a, b in zip(("values", "gradients"), arrays, reference, strict=True):
        if a.shape != b.shape:
            return f"{name}: shape {a.shape} vs {b.shape}"
        if not np.allclose(a, b, atol=1e-6):
            return f"{name}: max abs diff {np.max(np.abs(a - b)):.1e}"
    return ""


def run_workload(
    workload_id: str, ours: Config | str, sizes: dict, repeat: int, peers=PEERS
) -> list[Cell]:
    """The cells of one table row: ours, then every peer in ``peers``."""
    wanted = PEERS_BY_WORKLOAD.get(workload_id, peers)
    first = ours if isinstance(ours, Config) else "unavailable (see below)"
    jacobian_mode = (
        workload_id in JACOBIAN_WORKLOADS and isinstance(ours, Config) and ours.device_vjp
    )
    if jacobian_mode:
        first = dataclasses.replace(ours, label=f"{ours.device} adjoint", device_vjp=False)
        peers = [
            dataclasses.replace(peer, device_vjp=False) if peer.options else peer for peer in peers
        ]
    wanted = [*wanted, *(peer for peer in peers if peer.options)]
    configs = [first, *(peer if peer in wanted else "n/a" for peer in peers)]
    if workload_id in MEMORY_WORKLOADS:
        cells = [_in_child(workload_id, config, sizes, repeat) for config in configs]
        cross_check(cells)
        return cells
    cells = time_round_robin(workload_id, configs, sizes, repeat)
    if jacobian_mode:
        cells[0].note = ", ".join(filter(None, [cells[0].note, "Jacobian on forward"]))
    return cells


def time_round_robin(
    workload_id: str,
    configs: list[Config | str],
    sizes: dict,
    repeat: int,
    tag: str | None = None,
) -> list[Cell]:
    """Warm up and cross-check every configuration, then time them round-robin.

    A str in ``configs`` is not run: it becomes the note of its cell. Each cell's time is
    the best of ``repeat`` rounds, each round one step of every configuration, so that a
    slow phase of the machine hits every configuration. ``tag`` names the row in the
    progress messages (default: ``workload_id``).
    """
    tag = tag or workload_id
    prepared = [_prepare(workload_id, config, sizes, tag) for config in configs]
    cells = [cell for _, cell in prepared]
    cross_check(cells)
    timed = [(workload, cell) for workload, cell in prepared if workload is not None]
    progress(f"{tag}: timing {len(timed)} configurations, {repeat} rounds")
    times: list[list[float]] = [[] for _ in timed]
    for round_index in range(repeat):
        for index in rotated(range(len(timed)), round_index):
            times[index].append(best_time(timed[index][0].step, 1))
    for (_, cell), own in zip(timed, times, strict=True):
        cell.seconds = min(own)
    return cells


def rotated(items: Sequence, shift: int) -> list:
    """``items`` starting at position ``shift`` (mod their number), wrapping around. The
    rounds start one configuration later each: a step that runs right after another
    device's pays for that device's spinning OpenMP threads on 2 cores (W1 at 6 qubits:
    our deferred step 8.4 ms right after lightning.qubit's, 7.0 ms right after our eager
    one), and so no configuration always follows the same one."""
    items = list(items)
    shift %= max(len(items), 1)
    return items[shift:] + items[:shift]


def _prepare(
    workload_id: str, config: Config | str, sizes: dict, tag: str
) -> tuple[Workload | None, Cell]:
    if isinstance(config, str):
        return None, Cell(note=config)
    progress(f"{tag}: warm-up and cross-check, {config.label}")
    return prepare(workload_id, config, sizes)


def _in_child(workload_id: str, config: Config | str, sizes: dict, repeat: int) -> Cell:
    if isinstance(config, str):
        return Cell(note=config)
    progress(f"{workload_id}: {config.label} in a fresh process")
    return run_in_fresh_process(workload_id, config, sizes, repeat)


def progress(message: str) -> None:
    """Print a time-stamped progress line on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def render(
    rows: dict[str, list[Cell]], ours: Config | str, args: argparse.Namespace, peers=PEERS
) -> str:
    """The report: environment, the table, and what the columns mean."""
    ours_label = ours.label if isinstance(ours, Config) else args.device
    labelled = {}
    for workload_id, cells in rows.items():
        label = _workload_label(workload_id, args.quick)
        if isinstance(ours, Config) and ours.diff_method == "parameter-shift":
            label += " (param-shift)"
        labelled[label] = cells
    lines = [*_preamble(args), "", *table_lines("workload", ours_label, peers, labelled)]
    return "\n".join([*lines, "", *_legend(ours, args)]) + "\n"


def table_lines(
    first_header: str, ours_label: str, peers: tuple[Config, ...], rows: dict[str, list[Cell]]
) -> list[str]:
    """A markdown table: one row per label in ``rows``; after its first column our cell,
    then for every peer its cell and ``ratio`` = peer time / our time."""
    header = [first_header, ours_label]
    for peer in peers:
        header += [peer.label, "ratio"]
    lines = [_table_row(header), _table_row(["---"] * len(header))]
    for label, cells in rows.items():
        row = [label, _cell_text(cells[0])]
        for cell in cells[1:]:
            row += [_cell_text(cell), _ratio(cell, cells[0])]
        lines.append(_table_row(row))
    return lines


def _preamble(args: argparse.Namespace) -> list[str]:
    return [
        "# Workloads: this device against its peers",
        "",
        *environment_lines(args.repeat),
        f"- sizes: {'--quick (smoke test)' if args.quick else 'full (bench/WORKLOADS.md)'}",
    ]


def environment_lines(repeat: int) -> list[str]:
    """Markdown list items: date, machine, versions, the command line and how it timed."""
    versions = ", ".join(
        f"{name} {metadata.version(name)}" for name in ("pennylane", "pennylane_lightning", "torch")
    )
    return [
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- machine: {platform.platform()}, {multiprocessing.cpu_count()} CPUs",
        f"- python {platform.python_version()}, {versions}, torch threads {TORCH_THREADS}",
        f"- command: `python {' '.join(sys.argv)}`",
        f"- times: best of {repeat} after one warm-up, configurations round-robin "
        "(each round starting one configuration later)",
    ]


def _legend(ours: Config | str, args: argparse.Namespace) -> list[str]:
    lines = [
        "ratio = peer time / our time (higher is better); for the eager column it is the",
        "deferred/eager speed-up of grad_accumulation (our column is the default, deferred).",
        "Before timing, every configuration's",
        "values and gradients are compared with the first peer that ran (np.allclose, atol 1e-6);",
        "a difference is marked **MISMATCH**. W4's and W4F's times cover all their calls.",
        "W6 runs each configuration in a fresh process; peak = its peak resident memory (VmHWM)",
        "over the timed steps (reset after the warm-up step, which may compile kernels),",
        "at start = its resident memory after the imports, before the workload was built.",
        "n/a: not run for this workload (memory or time).",
        f"{SKIPPED_SHIFT}: parameter-shift would need over {SHIFT_WORK_LIMIT:.0e} amplitude",
        "updates (gate applications x 2**n) per step.",
    ]
    if isinstance(ours, str):
        lines.append(f"{args.device}: {ours}")
    return lines


def deferred_and_eager(
    rows: dict[str, list[Cell]], peers: tuple[Config, ...]
) -> dict[str, tuple[float, float]]:
    """Per workload, our (deferred) time and the eager column's, where both have one; empty
    when ``peers`` has no eager variant."""
    columns = [i for i, peer in enumerate(peers, start=1) if peer.options == EAGER_OPTIONS]
    if not columns:
        return {}
    return {
        workload_id: (cells[0].seconds, cells[columns[0]].seconds)
        for workload_id, cells in rows.items()
        if cells[0].seconds is not None and cells[columns[0]].seconds is not None
    }


def _workload_label(workload_id: str, quick: bool) -> str:
    sizes = {
        name: parameter.default
        for name, parameter in inspect.signature(BUILDERS[workload_id]).parameters.items()
        if isinstance(parameter.default, int) and not isinstance(parameter.default, bool)
    }
    sizes |= QUICK_SIZES[workload_id] if quick else {}
    return f"{workload_id} ({', '.join(f'{k}={v}' for k, v in sizes.items())})"


def _cell_text(cell: Cell) -> str:
    parts = [] if cell.seconds is None else [_seconds(cell.seconds)]
    if cell.peak_mib is not None:
        parts.append(f"peak {cell.peak_mib:.0f} MiB (at start {cell.start_mib:.0f})")
    if cell.note:
        parts.append(cell.note)
    return ", ".join(parts)


def _seconds(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


def _ratio(peer: Cell, ours: Cell) -> str:
    if peer.seconds is None or ours.seconds is None:
        return "-"
    return f"{peer.seconds / ours.seconds:.2f}x"


def _table_row(cells: list[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(BUILDERS), help="e.g. W1,W4")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--repeat", type=int, default=3, help="timed calls after the warm-up")
    parser.add_argument("--out", default="benchmarks/results/workloads.md")
    parser.add_argument(
        "--plot",
        default="benchmarks/results/plots/deferred_vs_eager.png",
        help="PNG of our deferred and eager times per workload ('' for none)",
    )
    parser.add_argument("--device", default="custatevec.qubit", help="the device under test")
    parser.add_argument(
        "--backend",
        choices=("cpu", "custatevec"),
        help="require the device under test to run on this backend (custatevec.qubit picks "
        "custatevec when a GPU is usable); custatevec also adds lightning.gpu as a peer "
        "when it can be built",
    )
    args = parser.parse_args(argv)
    args.workloads = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    unknown = sorted(set(args.workloads) - set(BUILDERS))
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {list(BUILDERS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run, print and write the report; exit status 1 if any configuration disagreed."""
    args = parse_args(argv)
    torch.set_num_threads(TORCH_THREADS)
    ours = our_config(args.device, args.backend)
    peers = eager_variant(ours) + usable_peers(args.backend)
    rows = {
        workload_id: run_workload(
            workload_id, ours, QUICK_SIZES[workload_id] if args.quick else {}, args.repeat, peers
        )
        for workload_id in args.workloads
    }
    report = render(rows, ours, args, peers)
    print(report)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report, encoding="utf-8")
    times = deferred_and_eager(rows, peers)
    if args.plot and times:
        sizes = "--quick sizes" if args.quick else "full sizes"
        title = f"{args.device}: deferred vs eager gradient accumulation\n({sizes})"
        plots.plot_deferred_vs_eager(times, Path(args.plot), title)
        progress(f"wrote {args.plot}")
    return int(any(cell.mismatch for cells in rows.values() for cell in cells))


if __name__ == "__main__":
    sys.exit(main())
