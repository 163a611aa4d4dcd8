"""The benchmark reports: markdown tables, plots, and the scripts that write them.

The pure functions get made-up timings; two end-to-end runs at tiny sizes check that
``scaling.py`` and ``run_workloads.py`` write their report and a valid PNG of the right
series.
"""

import argparse
import math
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import plots  # noqa: E402
import run_workloads  # noqa: E402
import scaling  # noqa: E402
import workloads  # noqa: E402
from run_workloads import EAGER_OPTIONS, Cell, Config  # noqa: E402
from workloads import Setup  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

OURS = Config("ours adjoint + device_vjp", Setup("custatevec.qubit", "adjoint", True))
EAGER = Config(
    "ours adjoint, eager + device_vjp", Setup("custatevec.qubit", "adjoint", True), EAGER_OPTIONS
)
LIGHTNING = Config("lightning adjoint + device_vjp", Setup("lightning.qubit", "adjoint", True))
BACKPROP = Config("default backprop", Setup("default.qubit", "backprop"))
PEERS = (EAGER, LIGHTNING, BACKPROP)
COMPILED = Config("ours compiled", Setup("custatevec.qubit", "adjoint", True, compiled=True))
LIGHTNING_JACOBIAN = Config("lightning adjoint", Setup("lightning.qubit", "adjoint"))
JAX = Config("jax.jit", Setup("default.qubit", "backprop", framework="jax.jit"))
QJIT = Config("qjit", Setup("lightning.qubit", "adjoint", framework="qjit"))


def assert_png(path: Path, width: int, height: int) -> None:
    """``path`` is a PNG file that decodes to an image of this size."""
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    assert matplotlib.image.imread(path).shape[:2] == (height, width)


def tables(report: str) -> list[list[str]]:
    """The markdown tables in ``report``, each as its lines."""
    found: list[list[str]] = []
    previous = ""
    for line in report.splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                found.append([])
            found[-1].append(line)
        previous = line
    return found


def table(report: str) -> list[str]:
    """The lines of the first markdown table in ``report``."""
    return tables(report)[0]


def test_scaling_table_has_a_row_per_size_with_ratios_and_notes():
    rows = {
        4: [Cell(seconds=0.002), Cell(seconds=0.003), Cell(seconds=0.010), Cell(seconds=1.5)],
        22: [
            Cell(seconds=2.0),
            Cell(seconds=3.0, note="**MISMATCH** (values: max abs diff 1.0e-03)", mismatch=True),
            Cell(seconds=8.0),
            Cell(note="n/a (n > 20)"),
        ],
    }
    args = argparse.Namespace(repeat=3, layers=4)

    report = scaling.render(rows, OURS.label, PEERS, args, ["ours: a note"])

    assert table(report) == [
        "| n (qubits) | ours adjoint + device_vjp | ours adjoint, eager + device_vjp | ratio "
        "| lightning adjoint + device_vjp | ratio | default backprop | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        "| 4 | 2 ms | 3 ms | 1.50x | 10 ms | 5.00x | 1.5 s | 750.00x |",
        "| 22 | 2 s | 3 s, **MISMATCH** (values: max abs diff 1.0e-03) | 1.50x | 8 s | 4.00x "
        "| n/a (n > 20) | - |",
    ]
    assert "![time of one step against the number of qubits](plots/time_vs_qubits.png)" in report
    assert "- step: W1 of workloads.py, n_layers=4: StronglyEntanglingLayers," in report
    assert "- times: best of 3 after one warm-up, configurations round-robin" in report
    assert report.endswith("ours: a note\n")


def test_workloads_table_keeps_its_format():
    rows = {
        "W1": [Cell(seconds=0.632), Cell(seconds=0.799), Cell(note="n/a")],
        "W6": [Cell(seconds=2.67, peak_mib=958.2, start_mib=332.4), Cell(seconds=3.83), Cell()],
    }
    args = argparse.Namespace(repeat=5, quick=True, device="custatevec.qubit")

    report = run_workloads.render(rows, OURS, args, (EAGER, BACKPROP))

    assert table(report) == [
        "| workload | ours adjoint + device_vjp | ours adjoint, eager + device_vjp | ratio "
        "| default backprop | ratio |",
        "| --- | --- | --- | --- | --- | --- |",
        "| W1 (n_wires=8, n_layers=4) | 632 ms | 799 ms | 1.26x | n/a | - |",
        "| W6 (n_wires=12, n_layers=1) | 2.67 s, peak 958 MiB (at start 332) | 3.83 s | 1.43x "
        "|  | - |",
    ]
    assert "- sizes: --quick (smoke test)" in report


def test_peers_over_their_size_limit_are_not_run():
    assert scaling.row_configs(20, OURS, PEERS) == [OURS, *PEERS]
    assert scaling.row_configs(21, OURS, PEERS) == [OURS, EAGER, LIGHTNING, "n/a (n > 20)"]
    assert scaling.row_configs(23, "unavailable: no GPU", PEERS) == [
        "unavailable (see below)",
        EAGER,
        "n/a (n > 22)",
        "n/a (n > 20)",
    ]


def test_series_take_each_column_where_it_has_a_time():
    rows = {
        4: [Cell(seconds=0.1), Cell(seconds=0.2)],
        6: [Cell(seconds=0.3), Cell(note="n/a (n > 4)")],
    }

    assert scaling.series(rows, ["ours", "peer"]) == {
        "ours": {4: 0.1, 6: 0.3},
        "peer": {4: 0.2},
    }


def test_deferred_and_eager_pairs_our_column_with_the_eager_one():
    rows = {
        "W1": [Cell(seconds=1.0), Cell(seconds=9.0), Cell(seconds=2.0)],
        "W2": [Cell(seconds=1.0), Cell(seconds=9.0), Cell(note="ERROR: ...")],
        "W3": [Cell(note="ERROR: ..."), Cell(seconds=9.0), Cell(seconds=2.0)],
    }

    assert run_workloads.deferred_and_eager(rows, (LIGHTNING, EAGER)) == {"W1": (1.0, 2.0)}
    assert run_workloads.deferred_and_eager(rows, (LIGHTNING, BACKPROP)) == {}


def test_time_vs_qubits_plots_one_log_scale_line_per_configuration(tmp_path):
    series = {"ours": {8: 0.4, 4: 0.01, 6: 0.05}, "peer": {4: 0.02}, "none": {}}
    path = tmp_path / "plots" / "time_vs_qubits.png"

    figure = plots.plot_time_vs_qubits(series, path, "a title")

    (axes,) = figure.axes
    lines = axes.get_lines()
    assert [line.get_label() for line in lines] == ["ours", "peer", "none"]
    assert list(lines[0].get_xdata()) == [4, 6, 8]
    assert list(lines[0].get_ydata()) == [0.01, 0.05, 0.4]
    assert list(lines[1].get_xdata()) == [4]
    assert len(lines[2].get_xdata()) == 0
    assert axes.get_yscale() == "log"
    assert axes.get_title() == "a title"
    assert_png(path, 8 * plots.DPI, 5 * plots.DPI)


def test_deferred_vs_eager_plots_grouped_bars_and_the_ratio(tmp_path):
    times = {"W1": (0.5, 1.0), "W3": (0.02, 0.4), "W4": (0.06, 0.05)}
    path = tmp_path / "deferred_vs_eager.png"

    figure = plots.plot_deferred_vs_eager(times, path, "a title")

    (axes,) = figure.axes
    deferred, eager = axes.containers
    assert deferred.get_label() == "deferred (default)"
    assert eager.get_label() == "eager"
    assert [bar.get_height() for bar in deferred] == [0.5, 0.02, 0.06]
    assert [bar.get_height() for bar in eager] == [1.0, 0.4, 0.05]
    centres = [bar.get_x() + bar.get_width() / 2 for bar in deferred]
    assert np.all(np.diff(centres) > 0)
    assert [label.get_text() for label in axes.get_xticklabels()] == ["W1", "W3", "W4"]
    assert [text.get_text() for text in axes.texts] == ["2.00x", "20.00x", "0.83x"]
    assert axes.get_yscale() == "log"
    bottom, top = axes.get_ylim()
    assert bottom < 0.02 and top > 1.0  # every bar and every ratio inside the axes
    assert_png(path, int(figure.get_figwidth() * plots.DPI), 5 * plots.DPI)


def test_scaling_parses_sizes():
    assert scaling.parse_args([]).qubits == list(scaling.DEFAULT_QUBITS)
    assert scaling.parse_args(["--quick"]).qubits == list(scaling.QUICK_QUBITS)
    assert scaling.parse_args(["--quick", "--qubits", "8, 4,6,4"]).qubits == [4, 6, 8]
    for bad in ("4,x", "0,4", ","):
        with pytest.raises(SystemExit):
            scaling.parse_args(["--qubits", bad])


def test_scaling_script_writes_the_report_and_plot(tmp_path, monkeypatch, mocker):
    monkeypatch.setattr(scaling, "MAX_QUBITS", {"default.qubit": 2})
    plot = mocker.spy(plots, "plot_time_vs_qubits")

    status = scaling.main(
        ["--qubits", "2,3", "--layers", "1", "--repeat", "1", "--out-dir", str(tmp_path)]
    )

    assert status == 0  # every configuration agreed with the first peer
    lines = table((tmp_path / "scaling.md").read_text(encoding="utf-8"))
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| 2", "| 3"]
    assert lines[3].endswith("| n/a (n > 2) | - |")
    assert "MISMATCH" not in "".join(lines)
    series = plot.call_args.args[0]
    assert list(series) == [
        "custatevec.qubit adjoint + device_vjp",
        "custatevec.qubit adjoint, eager + device_vjp",
        "lightning.qubit adjoint + device_vjp",
        "default.qubit backprop",
    ]
    assert [sorted(times) for times in series.values()] == [[2, 3], [2, 3], [2, 3], [2]]
    assert_png(tmp_path / "plots" / "time_vs_qubits.png", 8 * plots.DPI, 5 * plots.DPI)


def test_workloads_script_writes_the_deferred_vs_eager_plot(tmp_path, mocker):
    plot = mocker.spy(plots, "plot_deferred_vs_eager")
    out, png = tmp_path / "w.md", tmp_path / "plots" / "d.png"

    status = run_workloads.main(
        ["--workloads", "W4", "--quick", "--repeat", "1", "--out", str(out), "--plot", str(png)]
    )

    assert status == 0
    header, _, row = (line.split(" | ") for line in table(out.read_text(encoding="utf-8")))
    times = plot.call_args.args[0]
    assert list(times) == ["W4"]
    deferred, eager = times["W4"]
    assert row[1:3] == [run_workloads._seconds(deferred), run_workloads._seconds(eager)]
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    # the jax.jit column ran (jax comes with the test extra) and agreed with the first peer
    jax_cell = row[header.index("default.qubit + jax.jit backprop")]
    assert re.fullmatch(r"[\d.]+ ms", jax_cell)


def test_w2_profile_runs():
    """benchmarks/w2_profile.py at 6 wires, in its own process (it wraps device methods
    with timers): both devices' steps, and our device's parts, with positive times."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "w2_profile.py"
    done = subprocess.run(
        [sys.executable, str(script), "--quick", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    lines = done.stdout.splitlines()
    for name in ("ours", "lightning"):
        (line,) = [line for line in lines if line.startswith(f"{name}: step")]
        step, in_device, rest = map(float, re.findall(r"(-?[\d.]+) ms", line))
        assert step > 0 and in_device > 0 and abs(step - in_device - rest) <= 1.0
    parts = {line.strip().split(":")[1].strip() for line in lines if line.startswith("  ours")}
    # at 6 wires a known structure runs as one gate sequence per pass (sequences.py): no
    # per-gate CNOT calls and no block steps
    assert {"forward pass", "sweep", "gate sequences, forward and sweep"} <= parts
    assert "CNOTs, forward and sweep" not in parts


def test_each_round_puts_another_configuration_before_each():
    """Every round is a permutation of the configurations; over the rounds of all strides,
    no configuration follows the same one twice (cyclically, within a round)."""
    for count in range(3, 10):
        strides = [k for k in range(1, count) if math.gcd(k, count) == 1]
        predecessors: dict[int, set] = {c: set() for c in range(count)}
        for round_index in range(len(strides)):
            order = run_workloads.round_order(count, round_index)
            assert sorted(order) == list(range(count))
            for position, config in enumerate(order):
                predecessors[config].add(order[position - 1])
        assert all(len(seen) == len(strides) for seen in predecessors.values()), count
    assert run_workloads.round_order(2, 1) == [1, 0]
    assert run_workloads.round_order(1, 4) == [0]
    assert run_workloads.round_order(0, 3) == []


# --- compare_revisions.py ----------------------------------------------------------------


class _ScriptedWorker:
    """A worker that answers from a script: its build result and one time per step."""

    def __init__(self, name: str, log: list, gradients: list, seconds: list):
        self.name, self.log, self.gradients, self.seconds = name, log, gradients, seconds

    def ask(self, request: str, workload_id: str) -> dict:
        self.log.append((self.name, request, workload_id))
        if request == "build":
            return {"values": [0.5], "gradients": self.gradients}
        if request == "time":
            return {"seconds": self.seconds.pop(0)}
        return {}


def test_compare_revisions_takes_turns_and_keeps_the_best_steps():
    import compare_revisions

    log = []
    base = _ScriptedWorker("base", log, [1.0, 2.0], [0.30, 0.10, 0.20, 0.40])
    head = _ScriptedWorker("head", log, [1.0, 2.0], [0.25, 0.35, 0.15, 0.50])
    result = compare_revisions.compare(base, head, "W4", rounds=4)
    assert (result.base, result.head, result.note) == (0.10, 0.15, "")
    assert result.round_ratios == pytest.approx((0.25 / 0.30, 3.5, 0.75, 1.25))
    assert result.median_ratio == pytest.approx((0.25 / 0.30 + 1.25) / 2)
    timed = [name for name, request, _ in log if request == "time"]
    assert timed == ["base", "head", "head", "base", "base", "head", "head", "base"]
    assert [request for name, request, _ in log if name == "base"][-1] == "drop"


def test_compare_revisions_marks_different_gradients():
    import compare_revisions

    base = _ScriptedWorker("base", [], [1.0, 2.0], [0.1])
    head = _ScriptedWorker("head", [], [1.0, 2.1], [0.1])
    assert compare_revisions.compare(base, head, "W4", rounds=1).note == "MISMATCH"


# --- issue 16: the compiled and jax columns, W2v, W7 and the targets ----------------------


def test_targets_divide_the_fastest_cells_of_each_side():
    columns = [OURS, COMPILED, LIGHTNING, LIGHTNING_JACOBIAN, JAX]
    rows = {
        "W4": [
            Cell(seconds=0.050),
            Cell(seconds=0.004),
            Cell(seconds=0.07),
            Cell(),
            Cell(seconds=0.005),
        ],
        "W2": [Cell(seconds=0.5), Cell(), Cell(seconds=1.2), Cell(seconds=0.8), Cell(note="n/a")],
        "W2v": [
            Cell(note="ERROR: ..."),
            Cell(seconds=0.3),
            Cell(note="ERROR: ..."),
            Cell(seconds=0.6),
        ],
        "W2jr": [Cell(note="ERROR: ..."), Cell(seconds=0.1), Cell(note="ERROR: ..."), Cell()],
        "W7": [Cell(note="ERROR: ..."), Cell(seconds=0.03), Cell(), Cell(), Cell()],
        "W7vjp": [Cell(seconds=0.01), Cell(seconds=0.01), Cell(), Cell(), Cell()],
    }
    targets = tuple(
        target
        for target in run_workloads.TARGETS
        if target.text.startswith(("W4: compiled >= 1.0x", "W3", "W2v: compiled", "W7"))
    )

    lines = run_workloads.target_lines(rows, columns, targets)

    assert lines == [
        "| target | measured | met | from |",
        "| --- | --- | --- | --- |",
        "| W4: compiled >= 1.0x default.qubit + jax.jit | 1.25x | yes "
        "| W4 jax.jit 5 ms / W4 ours compiled 4 ms |",
        "| W3: compiled >= 1.5x default.qubit + jax.jit | - | - | not measured in this run |",
        # lightning's fastest full Jacobian: its W2v cell without device VJPs, not its W2 ones;
        # ours the faster of W2v and W2jr
        "| W2v: compiled, one batched backward (W2v or W2jr) >= 4x lightning.qubit's Jacobian "
        "(its fastest of W2, W2v, W2jr) | 6.00x | yes "
        "| W2v lightning adjoint 600 ms / W2jr ours compiled 100 ms |",
        "| W7: torchjd step of our QNode <= 1.5x its one VJP (W7vjp) | - | - "
        "| not measured in this run |",
        "| W7: torchjd step of compiled <= 1.5x its one VJP (W7vjp) | 3.00x | no "
        "| W7 ours compiled 30 ms / W7vjp ours compiled 10 ms |",
    ]


def test_workloads_report_ends_its_tables_with_the_targets():
    rows = {
        "W2v": [Cell(note="ERROR: RuntimeError: x"), Cell(seconds=0.2)],
        "W7vjp": [Cell(seconds=0.01), Cell(seconds=0.02)],
    }
    args = argparse.Namespace(repeat=1, quick=True, device="custatevec.qubit")

    report = run_workloads.render(rows, OURS, args, (COMPILED,))

    workloads_table, targets_table = tables(report)
    assert [line.split(" | ")[0] for line in workloads_table[2:]] == [
        "| W2v (n_wires=6, n_layers=4)",
        "| W7vjp (n_wires=8, n_layers=4, n_outputs=8)",
    ]
    assert "## Targets (issue 16)" in report
    assert len(targets_table) == 2 + len(run_workloads.TARGETS)


def test_an_error_note_is_one_line_and_gives_a_compilers_failed_assertion():
    log = "catalyst failed with error code -6: warning: x\n  %1 = call\ncatalyst: /a/b.h:5: f: "
    log += "Assertion `a == b' failed.\nPLEASE submit a bug report"
    assert run_workloads.error_note(RuntimeError(log)) == (
        "ERROR: RuntimeError: Assertion 'a == b' failed."
    )
    assert run_workloads.error_note(ValueError("first\nsecond")) == "ERROR: ValueError: first"
    assert run_workloads.error_note(KeyError()) == "ERROR: KeyError: "
    assert (
        len(run_workloads.error_note(RuntimeError("x" * 200))) == len("ERROR: RuntimeError: ") + 80
    )


def test_workload_ids_are_case_blind_and_w7_brings_its_yardstick():
    args = run_workloads.parse_args(["--workloads", "w2V,W7,w4f"])
    assert args.workloads == ["W2v", "W7", "W7vjp", "W4F"]
    assert run_workloads.parse_args(["--workloads", "W7vjp,W7"]).workloads == ["W7vjp", "W7"]
    with pytest.raises(SystemExit):
        run_workloads.parse_args(["--workloads", "W8"])


def test_jax_peers_run_where_every_framework_is_built_and_variants_everywhere():
    for workload_id in workloads.BUILDERS:
        jax_runs = workload_id in {"W3", "W4", "W4F", "W5"}
        assert run_workloads.runs_on(workload_id, JAX) == jax_runs
        assert run_workloads.runs_on(workload_id, QJIT) == jax_runs
        assert run_workloads.runs_on(workload_id, COMPILED)
        assert run_workloads.runs_on(workload_id, EAGER)
        lightning, lightning_jacobian, backprop = run_workloads.PEERS
        assert run_workloads.runs_on(workload_id, lightning)
        assert run_workloads.runs_on(workload_id, lightning_jacobian) == (workload_id != "W6")
        assert run_workloads.runs_on(workload_id, backprop) == (workload_id != "W6")


def test_setup_names_the_valid_frameworks():
    with pytest.raises(ValueError, match=r"unknown framework 'jax'; choose from \('torch', "):
        Setup("default.qubit", "backprop", framework="jax")
    with pytest.raises(ValueError, match="compiled=True wraps a torch QNode"):
        Setup("custatevec.qubit", "adjoint", framework="jax.jit", compiled=True)
    with pytest.raises(ValueError, match="W7 is a torch workload"):
        workloads.BUILDERS["W7"](JAX.setup, **workloads.QUICK_SIZES["W7"])
    with pytest.raises(ValueError, match=r"unknown Jacobian method 'x'; choose from \('loop', "):
        workloads.sel_jacobian(BACKPROP.setup, method="x")


def test_w2s_three_jacobians_agree():
    """W2 (a backward call per output), W2v (vectorize=True) and W2jr (torch.func.jacrev,
    with its outputs as aux) give the same outputs and Jacobian on default.qubit."""
    sizes = {"n_wires": 4, "n_layers": 1}
    outputs, jacobian = workloads.BUILDERS["W2"](BACKPROP.setup, **sizes).step()
    assert jacobian.shape == (4, 1, 4, 3)
    for workload_id in ("W2v", "W2jr"):
        other_outputs, other_jacobian = workloads.BUILDERS[workload_id](
            BACKPROP.setup, **sizes
        ).step()
        np.testing.assert_allclose(other_outputs, outputs, atol=1e-12)
        np.testing.assert_allclose(other_jacobian, jacobian, atol=1e-12)


def test_the_compiled_column_wraps_our_qnode_with_pennylane_custatevec_compile(monkeypatch):
    import pennylane_custatevec

    wrapped = []

    def compile_spy(qnode):
        wrapped.append(qnode)
        return qnode

    monkeypatch.setattr(pennylane_custatevec, "compile", compile_spy, raising=False)
    sizes = workloads.QUICK_SIZES["W4"]

    _, compiled = run_workloads.prepare("W4", COMPILED, sizes)
    _, plain = run_workloads.prepare("W4", OURS, sizes)

    (qnode,) = wrapped
    assert qnode.device.name == "custatevec.qubit" and qnode.interface == "torch"
    assert compiled.note == "" and plain.note == ""
    np.testing.assert_array_equal(compiled.arrays[0], plain.arrays[0])
    np.testing.assert_array_equal(compiled.arrays[1], plain.arrays[1])

    monkeypatch.delattr(pennylane_custatevec, "compile")
    workload, missing = run_workloads.prepare("W4", COMPILED, sizes)
    assert workload is None and missing.note == "unavailable: no pennylane_custatevec.compile"


def test_a_missing_catalyst_makes_its_cells_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "catalyst", None)  # import catalyst raises ImportError

    workload, cell = run_workloads.prepare("W4", QJIT, workloads.QUICK_SIZES["W4"])

    assert workload is None and cell.note.startswith("unavailable: catalyst: ")


def test_w7s_step_holds_the_jacobian_of_its_losses_then_their_upgrad_aggregate():
    pytest.importorskip("torchjd")
    sizes = {"n_wires": 5, "n_layers": 2}
    jacobian_descent = workloads.BUILDERS["W7"](BACKPROP.setup, n_outputs=5, **sizes)
    full_jacobian = workloads.BUILDERS["W2"](BACKPROP.setup, **sizes)

    losses, gradients = jacobian_descent.step()
    outputs, jacobian = full_jacobian.step()

    np.testing.assert_allclose(losses, outputs, atol=1e-12)
    np.testing.assert_allclose(gradients[: jacobian.size], jacobian.ravel(), atol=1e-12)
    aggregate = gradients[jacobian.size :]
    assert aggregate.shape == (jacobian[0].size,)
    # UPGrad's aggregate conflicts with no loss: a non-negative inner product with every row
    assert np.all(jacobian.reshape(len(losses), -1) @ aggregate >= -1e-10)


def test_device_part_times_execute_and_compute_vjp():
    """benchmarks/device_part.py at small counts, in its own process: one line naming the
    device and a positive time per call."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "device_part.py"
    done = subprocess.run(
        [sys.executable, str(script), "--calls", "3", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    (line,) = done.stdout.splitlines()
    assert line.startswith("custatevec.qubit: execute + compute_vjp of W4 (4 wires)")
    assert float(re.search(r"([\d.]+) ms", line).group(1)) > 0


def _run_script(name: str, *arguments: str) -> list[str]:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / name
    done = subprocess.run(
        [sys.executable, str(script), *arguments],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return done.stdout.splitlines()


def test_sequence_sizes_reports_both_paths_per_case():
    """benchmarks/sequence_sizes.py on two small cases, in its own process: a table row per
    case with both times positive and their ratio."""
    lines = _run_script("sequence_sizes.py", "--cases", "3x1,2x4", "--rounds", "1")
    rows = [line for line in lines if re.match(r"\| \d", line)]
    assert [row.split("|")[1:3] for row in rows] == [[" 3 ", " 1 "], [" 2 ", " 4 "]]
    for row in rows:
        sequence, gate_by_gate, ratio = (
            float(x) for x in re.findall(r"([\d.]+)(?: ms)? \|", row)[3:]
        )
        assert sequence > 0 and gate_by_gate > 0
        assert ratio == pytest.approx(sequence / gate_by_gate, abs=0.01)


def test_layout_probe_times_the_four_loops():
    """benchmarks/layout_probe.py on a small vector (its own check that the four loops
    agree runs first): one row per bit, four positive times."""
    lines = _run_script("layout_probe.py", "--qubits", "8", "--bits", "1,5", "--rounds", "1")
    rows = [line for line in lines if re.match(r"\| \d", line)]
    assert len(rows) == 2
    for row in rows:
        times = [float(x) for x in row.strip("| ").split(" | ")[1:]]
        assert len(times) == 4 and all(t > 0 for t in times)


def test_w4_floor_times_each_driver_of_the_w4_step():
    """benchmarks/w4_floor.py, one round, in its own process (its own check that the
    minimal Function and jax.jit give the compiled QNode's values runs first): a row per
    driver, each time positive."""
    lines = _run_script("w4_floor.py", "--rounds", "1")
    rows = dict(
        line.strip("| ").split(" | ")
        for line in lines
        if line.startswith("| ") and "---" not in line
    )
    rows.pop("W4 step driven by")
    assert {"compiled QNode", "two backend calls in a Function", "empty Function"} <= set(rows)
    assert all(float(value) > 0 for value in rows.values())


def test_permutation_runs_times_a_ring_both_ways():
    """benchmarks/permutation_runs.py on small registers (its own check that both ways give
    the same state runs first): a row per size, positive times and their ratio."""
    lines = _run_script("permutation_runs.py", "--sizes", "8x1,11x2", "--rounds", "1")
    rows = [line for line in lines if re.match(r"\| \d", line)]
    assert len(rows) == 2
    for row in rows:
        cells = row.strip("| ").split(" | ")
        one_by_one, runs = float(cells[4]), float(cells[5])
        assert one_by_one > 0 and runs > 0
        ratio, half = float(cells[6].rstrip("x")), 0.0005  # times printed to 3 decimals
        low, high = (one_by_one - half) / (runs + half), (one_by_one + half) / (runs - half)
        assert low - 0.005 <= ratio <= high + 0.005


def test_pass_counts_counts_passes_in_each_configuration():
    """benchmarks/pass_counts.py on W2 at its quick size (6 wires: one gate sequence per
    pass, so no runs), in its own process: a row with positive counts for its three
    configurations, their ratio, and no runs."""
    lines = _run_script("pass_counts.py", "--quick", "--workloads", "W2")
    rows = [line for line in lines if line.startswith("| W2 |")]
    assert len(rows) == 1
    cells = rows[0].strip("| ").split(" | ")
    neither, permutations, both = (int(cell) for cell in cells[1:4])
    assert neither > 0 and permutations > 0 and both > 0
    assert float(cells[4].rstrip("x")) == pytest.approx(neither / both, abs=0.01)
    assert (int(cells[5]), int(cells[6])) == (0, 0)


def test_tiled_runs_times_kernels_and_circuits_both_ways():
    """benchmarks/tiled_runs.py on small registers (its own checks that tiled and untiled
    give the same states, reductions, values and gradients run first): a kernel row per
    size and bras, a circuit row per template and size, positive times."""
    lines = _run_script(
        "tiled_runs.py", "--qubits", "8,10", "--rounds", "1", "--tables", "kernels,circuits"
    )
    kernels = [line for line in lines if re.match(r"\| \d+ \| [14] \|", line)]
    circuits = [line for line in lines if re.match(r"\| (SEL|BEL-RY) \|", line)]
    assert len(kernels) == 4 and len(circuits) == 4
    for row in kernels:
        times = [float(cell.removesuffix(" ms")) for cell in row.strip("| ").split(" | ")[3:]]
        assert len(times) == 4 and all(t > 0 for t in times)
    for row in circuits:
        cells = row.strip("| ").split(" | ")
        assert float(cells[2].removesuffix(" ms")) > 0 and float(cells[3].removesuffix(" ms")) > 0
