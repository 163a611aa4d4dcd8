"""Run the workloads of benchmarks/workloads.py on this device and its peers; print ratios.

    python benchmarks/run_workloads.py [--workloads W1,W4] [--quick] [--repeat 3]
                                       [--backend custatevec] [--out FILE.md] [--plot FILE.png]

Every configuration runs each workload once (warm-up) and its values and gradients are
compared with the first peer's; then each is timed, best of ``--repeat`` steps taken
round-robin across the configurations (one step of each per round, each round in another
order, ``round_order``: a configuration follows another one each round). W6 runs every
configuration in a fresh (spawned) process and reports its peak resident memory. Writes
the markdown report (``--out``), the table and below it the same-run ratios of issue 16's
targets (``TARGETS``), and a bar chart of our deferred and eager times per workload
(``--plot``). Peers: lightning.qubit, default.qubit (torch backprop and ``jax.jit``),
Catalyst ``qjit``; ours also compiled by ``pennylane_custatevec.compile`` where it exists.
"""

import argparse
import contextlib
import dataclasses
import datetime
import inspect
import math
import multiprocessing
import platform
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np
import pennylane as qml
import plots
import torch
from pennylane.devices import ExecutionConfig
from workloads import ANY_FRAMEWORK, BUILDERS, QUICK_SIZES, Arrays, Setup, Unavailable, Workload

TORCH_THREADS = 2
VERSIONS_REPORTED = (
    "pennylane",
    "pennylane_lightning",
    "torch",
    "jax",
    "pennylane_catalyst",
    "torchjd",
)
SHIFT_WORK_LIMIT = 1e10
"""Amplitude updates per step above which a parameter-shift run is skipped (roughly 10 s)."""
SKIPPED_SHIFT = "skipped: needs adjoint (issue 3)"
MEMORY_WORKLOADS = frozenset({"W6"})
JACOBIAN_WORKLOADS = frozenset({"W2"})
"""Full Jacobians: our device runs them with device Jacobians (one sweep for all outputs)
rather than one VJP per output row."""
YARDSTICKS = {"W7": "W7vjp"}
"""Workloads whose target compares them with another one: asking for the first runs both."""
EAGER_OPTIONS = (("grad_accumulation", "eager"),)
"""The options of the eager variant of our configuration (see ``eager_variant``)."""


@dataclass(frozen=True)
class Config:
    """One column: its header, how the workloads build and drive the QNode (``setup``)."""

    label: str
    setup: Setup
    options: tuple = ()
    """Overrides of custatevec.qubit's differentiation options, as (name, value) pairs,
    applied with ``pennylane_custatevec.options`` around the build and every step."""


PEERS = (
    Config("lightning.qubit adjoint + device_vjp", Setup("lightning.qubit", "adjoint", True)),
    Config("lightning.qubit adjoint (Jacobian on forward)", Setup("lightning.qubit", "adjoint")),
    Config("default.qubit backprop", Setup("default.qubit", "backprop")),
)
PEERS_BY_WORKLOAD = {"W6": PEERS[:1]}
"""W6's other peers would need more memory than these machines have, or many minutes."""
GPU_PEERS = (Config("lightning.gpu adjoint + device_vjp", Setup("lightning.gpu", "adjoint", True)),)
"""Peers added with ``--backend custatevec`` when they can be built here."""
JAX_PEERS = (
    Config(
        "default.qubit + jax.jit backprop", Setup("default.qubit", "backprop", framework="jax.jit")
    ),
    Config(
        "Catalyst qjit + lightning.qubit adjoint",
        Setup("lightning.qubit", "adjoint", framework="qjit"),
    ),
)
"""The jax peers: run on the workloads of ``workloads.ANY_FRAMEWORK``, n/a elsewhere; a
missing jax or Catalyst makes their cells say ``unavailable: ...``."""


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
        return Config(f"{name} adjoint{suffix}", Setup(device_name, "adjoint", vjp))
    return Config(f"{name} (param-shift)", Setup(device_name, "parameter-shift"))


def _adjoint_custatevec(ours: Config | str) -> bool:
    return (
        isinstance(ours, Config)
        and ours.setup.diff_method == "adjoint"
        and ours.setup.device.startswith("custatevec")
    )


def eager_variant(ours: Config | str) -> tuple[Config, ...]:
    """Our configuration with ``grad_accumulation="eager"``, whose column gives the
    deferred/eager ratio; none when ours is not an adjoint custatevec.qubit."""
    if not _adjoint_custatevec(ours):
        return ()
    label = ours.label.replace(" adjoint", " adjoint, eager", 1)
    return (dataclasses.replace(ours, label=label, options=EAGER_OPTIONS),)


def compiled_variant(ours: Config | str) -> tuple[Config, ...]:
    """Our QNode wrapped by ``pennylane_custatevec.compile`` (its cells say ``unavailable``
    where the package has none); none when ours is not an adjoint custatevec.qubit."""
    if not _adjoint_custatevec(ours):
        return ()
    label = ours.label.split(" adjoint", 1)[0] + " compiled"
    return (
        dataclasses.replace(
            ours, label=label, setup=dataclasses.replace(ours.setup, compiled=True)
        ),
    )


def usable_peers(backend: str | None) -> tuple[Config, ...]:
    """PEERS, and with ``backend="custatevec"`` the GPU peers that can be built here."""
    if backend != "custatevec":
        return PEERS
    usable = []
    for peer in GPU_PEERS:
        try:
            qml.device(peer.setup.device, wires=1)
        except Exception as exc:  # not installed, or no GPU: left out, and said why
            progress(f"{peer.setup.device} left out: {type(exc).__name__}: {exc}")
            continue
        usable.append(peer)
    return PEERS + tuple(usable)


COMPILED_EXTRA_WARM_UP = 3
"""Steps after the warm-up before a compiled configuration is timed: a compiled key
records its first call, traces its second and third and verifies its fourth (the
compile's own work, as jax.jit's compilation in its warm-up), then replays."""


def prepare(workload_id: str, config: Config, sizes: dict) -> tuple[Workload | None, Cell]:
    """Build the workload and run its warm-up step (under jax.jit or qjit the compilation),
    which gives the cross-check arrays (or its ``check`` does, where it has one)."""
    try:
        build = BUILDERS[workload_id]
        with _overrides(config):
            workload = build(config.setup, **sizes)
        shift = config.setup.diff_method == "parameter-shift"
        if shift and workload.shift_work > SHIFT_WORK_LIMIT:
            return None, Cell(note=SKIPPED_SHIFT)
        if config.options:
            workload = dataclasses.replace(workload, step=_with_overrides(config, workload.step))
        arrays = workload.step()
        if config.setup.compiled:  # a key traces at its calls 2 and 3, verifies at 4
            for _ in range(COMPILED_EXTRA_WARM_UP):
                workload.step()
        return workload, Cell(arrays=workload.check() if workload.check else arrays)
    except Unavailable as exc:
        return None, Cell(note=f"unavailable: {exc}")
    except Exception as exc:  # reported in the table, the traceback on stderr
        traceback.print_exc()
        return None, Cell(note=error_note(exc))


def error_note(exc: Exception) -> str:
    """``ERROR: Type: message``, one line, at most 80 characters of message. A compiler's
    report (Catalyst's CompileError carries its whole log) gives its failed assertion."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    assertions = [line[line.index("Assertion") :] for line in lines if "Assertion" in line]
    message = (assertions or lines or [""])[0].replace("`", "'")
    return f"ERROR: {type(exc).__name__}: {message[:80]}"


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
    """The cells of one table row: ours, then every peer in ``peers`` (``n/a`` where
    ``runs_on`` says no)."""
    first = ours if isinstance(ours, Config) else "unavailable (see below)"
    jacobian_mode = (
        workload_id in JACOBIAN_WORKLOADS and isinstance(ours, Config) and ours.setup.device_vjp
    )
    if jacobian_mode:
        first = _without_device_vjp(ours, label=f"{ours.setup.device} adjoint")
        peers = [_without_device_vjp(peer) if peer.options else peer for peer in peers]
    configs = [first, *(peer if runs_on(workload_id, peer) else "n/a" for peer in peers)]
    if workload_id in MEMORY_WORKLOADS:
        cells = [_in_child(workload_id, config, sizes, repeat) for config in configs]
        cross_check(cells)
        return cells
    cells = time_round_robin(workload_id, configs, sizes, repeat)
    if jacobian_mode:
        # device_vjp=False: one whole Jacobian per step (under torch, taken in the first
        # backward call from the state the forward kept; grad_on_execution=False)
        cells[0].note = ", ".join(filter(None, [cells[0].note, "whole Jacobian"]))
    return cells


def _without_device_vjp(config: Config, **changes) -> Config:
    setup = dataclasses.replace(config.setup, device_vjp=False)
    return dataclasses.replace(config, setup=setup, **changes)


def runs_on(workload_id: str, peer: Config) -> bool:
    """Whether ``peer`` runs ``workload_id``: our variants (eager, compiled) run everything
    ours does; the jax peers the workloads built for every framework; the torch peers all
    but those that ``PEERS_BY_WORKLOAD`` leaves out."""
    if peer.options or peer.setup.compiled:
        return True
    if peer.setup.framework != "torch":
        return workload_id in ANY_FRAMEWORK
    return workload_id not in PEERS_BY_WORKLOAD or peer in PEERS_BY_WORKLOAD[workload_id]


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
        for index in round_order(len(timed), round_index):
            times[index].append(best_time(timed[index][0].step, 1))
    for (_, cell), own in zip(timed, times, strict=True):
        cell.seconds = min(own)
    return cells


def round_order(count: int, round_index: int) -> list[int]:
    """The order in which round ``round_index`` times ``count`` configurations: from
    position ``round_index`` on, with stride k, the round's entry of the integers in
    [1, count) coprime to ``count`` (taken in turn), modulo ``count``.

    A step that runs right after another configuration's pays for that configuration's
    spinning threads (lightning.qubit's and torch's OpenMP pools, jax's thread pool) on 2
    cores: W5 at 16 qubits, our step 17 ms alone, 25-28 ms right after jax.jit's or
    default.qubit's step. Within a round, configuration a follows a - k; the strides
    change from round to round, so a configuration follows a different one each round
    (as far as ``count`` allows: with two there is only one other), and its best time is
    not that of one neighbour. (Rotating one fixed order, as this script did before,
    keeps every configuration behind the same neighbour in every round.)"""
    if count <= 2:
        return [(round_index + position) % max(count, 1) for position in range(count)]
    strides = [k for k in range(1, count) if math.gcd(k, count) == 1]
    stride = strides[round_index % len(strides)]
    return [(round_index + position * stride) % count for position in range(count)]


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


def _our_qnode(index: int, config: Config | str) -> bool:
    """Our column (the first), whatever its configuration in that row."""
    return index == 0


def _compiled(index: int, config: Config | str) -> bool:
    return isinstance(config, Config) and config.setup.compiled


def _jax_jit(index: int, config: Config | str) -> bool:
    return isinstance(config, Config) and config.setup.framework == "jax.jit"


def _lightning_qubit(index: int, config: Config | str) -> bool:
    """Either torch configuration of lightning.qubit (the faster one is taken)."""
    setup = config.setup if isinstance(config, Config) else None
    return setup is not None and setup.device == "lightning.qubit" and setup.framework == "torch"


@dataclass(frozen=True)
class Side:
    """One side of a target's ratio: the fastest cell, over the rows ``workloads``, of the
    columns that ``picks(index, config)`` selects (index 0 is ours)."""

    workloads: tuple[str, ...]
    picks: Callable[[int, Config | str], bool]


@dataclass(frozen=True)
class Target:
    """A target of issue 16: ``ratio`` = time of ``numerator`` / time of ``denominator``
    must be at least ``bound`` (a speed-up of the denominator), or with ``at_most`` at
    most ``bound`` (a slow-down it may have)."""

    text: str
    numerator: Side
    denominator: Side
    bound: float
    at_most: bool = False


def _in_one_row(workload_id: str, slower, faster, bound: float, text: str) -> Target:
    """The speed-up of column ``faster`` over column ``slower`` in one row."""
    return Target(text, Side((workload_id,), slower), Side((workload_id,), faster), bound)


OUR_COLUMNS = ((_our_qnode, "our QNode"), (_compiled, "compiled"))
BATCHED_JACOBIANS = ("W2", "W2v", "W2jr")
"""The rows that take W2's Jacobian: one backward call per output (W2), then the two that
batch the cotangents (torch's legacy vmap, torch.func.jacrev)."""
TARGETS = (
    _in_one_row("W4", _jax_jit, _compiled, 1.0, "W4: compiled >= 1.0x default.qubit + jax.jit"),
    _in_one_row("W4", _our_qnode, _compiled, 8.0, "W4: compiled >= 8x our QNode"),
    _in_one_row("W3", _jax_jit, _compiled, 1.5, "W3: compiled >= 1.5x default.qubit + jax.jit"),
    _in_one_row("W5", _our_qnode, _compiled, 1.3, "W5: compiled >= 1.3x our QNode"),
    *(
        Target(
            f"W2v: {name}, one batched backward (W2v or W2jr) >= 4x lightning.qubit's "
            "Jacobian (its fastest of W2, W2v, W2jr)",
            Side(BATCHED_JACOBIANS, _lightning_qubit),
            Side(BATCHED_JACOBIANS[1:], picks),
            4.0,
        )
        for picks, name in OUR_COLUMNS
    ),
    *(
        Target(
            f"W7: torchjd step of {name} <= 1.5x its one VJP (W7vjp)",
            Side(("W7",), picks),
            Side(("W7vjp",), picks),
            1.5,
            at_most=True,
        )
        for picks, name in OUR_COLUMNS
    ),
)
"""The same-run ratios of issue 16's targets (W6's memory target is read off its cell)."""


def _fastest(rows: dict[str, list[Cell]], columns: list[Config | str], side: Side):
    """(seconds, what) of the fastest cell on ``side`` that has a time; None if none has."""
    found = [
        (cell.seconds, f"{workload_id} {_column_label(columns[index], index)}")
        for workload_id in side.workloads
        for index, cell in enumerate(rows.get(workload_id, ()))
        if cell.seconds is not None and side.picks(index, columns[index])
    ]
    return min(found, default=None)


def _column_label(config: Config | str, index: int) -> str:
    if index == 0:
        return "our QNode"
    return config.label if isinstance(config, Config) else str(config)


def target_lines(
    rows: dict[str, list[Cell]], columns: list[Config | str], targets: tuple[Target, ...]
) -> list[str]:
    """A markdown table, one row per target: the ratio measured where both sides have a
    time (else ``-``), whether it meets the target, and the two times it divides."""
    header = ["target", "measured", "met", "from"]
    lines = [_table_row(header), _table_row(["---"] * len(header))]
    for target in targets:
        numerator = _fastest(rows, columns, target.numerator)
        denominator = _fastest(rows, columns, target.denominator)
        if numerator is None or denominator is None:
            lines.append(_table_row([target.text, "-", "-", "not measured in this run"]))
            continue
        ratio = numerator[0] / denominator[0]
        met = ratio <= target.bound if target.at_most else ratio >= target.bound
        source = (
            f"{numerator[1]} {_seconds(numerator[0])} / {denominator[1]} {_seconds(denominator[0])}"
        )
        lines.append(_table_row([target.text, f"{ratio:.2f}x", "yes" if met else "no", source]))
    return lines


def render(
    rows: dict[str, list[Cell]], ours: Config | str, args: argparse.Namespace, peers=PEERS
) -> str:
    """The report: environment, the table, and what the columns mean."""
    ours_label = ours.label if isinstance(ours, Config) else args.device
    labelled = {}
    for workload_id, cells in rows.items():
        label = _workload_label(workload_id, args.quick)
        if isinstance(ours, Config) and ours.setup.diff_method == "parameter-shift":
            label += " (param-shift)"
        labelled[label] = cells
    lines = [*_preamble(args), "", *table_lines("workload", ours_label, peers, labelled)]
    lines += ["", "## Targets (issue 16)", "", *target_lines(rows, [ours, *peers], TARGETS)]
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
        f"- sizes: {'--quick (smoke test)' if args.quick else 'full (benchmarks/workloads.py)'}",
    ]


def environment_lines(repeat: int) -> list[str]:
    """Markdown list items: date, machine, versions, the command line and how it timed."""
    versions = ", ".join(f"{name} {_version(name)}" for name in VERSIONS_REPORTED)
    import pennylane_custatevec

    return [
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- machine: {platform.platform()}, {multiprocessing.cpu_count()} CPUs",
        f"- python {platform.python_version()}, {versions}, torch threads {TORCH_THREADS}",
        # the script's folder, not the tree's root, is on sys.path: the package measured is
        # the installed one, which may be another checkout's (an editable install)
        f"- pennylane_custatevec imported from {Path(pennylane_custatevec.__file__).parent}",
        f"- command: `python {' '.join(sys.argv)}`",
        f"- times: best of {repeat} after one warm-up, configurations round-robin "
        "(each round in another order: a configuration follows another one each round)",
    ]


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def _legend(ours: Config | str, args: argparse.Namespace) -> list[str]:
    lines = [
        "ratio = peer time / our time (higher is better); for the eager column it is the",
        "deferred/eager speed-up of grad_accumulation (our column is the default, deferred);",
        "for the compiled column, compiled time / QNode time (below 1: compiled is faster);",
        f"the compiled column is timed after {COMPILED_EXTRA_WARM_UP} more untimed steps "
        "(a compiled key traces its",
        "calls 2 and 3 and verifies its call 4; its replayed calls are timed).",
        "jax.jit and qjit columns: the step was compiled in the warm-up call, which is not",
        f"timed. They run {', '.join(sorted(ANY_FRAMEWORK))}; n/a on the torch workloads and",
        "on W1, whose jax.jit compile takes minutes (benchmarks/README.md).",
        "Before timing, every configuration's",
        "values and gradients are compared with the first peer that ran (np.allclose, atol 1e-6);",
        "a difference is marked **MISMATCH**. W4's and W4F's times cover all their calls.",
        "W6 runs each configuration in a fresh process; peak = its peak resident memory (VmHWM)",
        "over the timed steps (reset after the warm-up step, which may compile kernels),",
        "at start = its resident memory after the imports, before the workload was built.",
        "n/a: not run for this workload (memory or time, or a torch workload).",
        "unavailable: a package or entry point the configuration needs is missing here.",
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
    parser.add_argument(
        "--workloads",
        default=",".join(BUILDERS),
        help="e.g. W1,W4 (any case); W7 brings W7vjp, its yardstick, along",
    )
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
    by_upper = {workload_id.upper(): workload_id for workload_id in BUILDERS}
    given = [w.strip() for w in args.workloads.split(",") if w.strip()]
    args.workloads = [by_upper.get(w.upper(), w) for w in given]
    unknown = sorted(set(args.workloads) - set(BUILDERS))
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {list(BUILDERS)}")
    for workload_id, yardstick in YARDSTICKS.items():
        if workload_id in args.workloads and yardstick not in args.workloads:
            args.workloads.insert(args.workloads.index(workload_id) + 1, yardstick)
    return args


def main(argv: list[str] | None = None) -> int:
    """Run, print and write the report; exit status 1 if any configuration disagreed."""
    args = parse_args(argv)
    torch.set_num_threads(TORCH_THREADS)
    ours = our_config(args.device, args.backend)
    peers = eager_variant(ours) + compiled_variant(ours) + usable_peers(args.backend) + JAX_PEERS
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
