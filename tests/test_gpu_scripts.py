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

ROOT = Path(__file__).resolve().parents[1]
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

ISSUE_WHEELS = {  # the cp312 wheels gpu_wheels.sh downloaded on 2026-12-01, in bytes
    "custatevec_cu13-1.15.0-py3-none-manylinux2014_x86_64.whl": 59908671,
    "pennylane_lightning-0.45.0-cp312-cp312-manylinux_2_28_x86_64.whl": 25531143,
    "cuquantum_python_cu13-26.9.0-cp312-cp312-manylinux2014_x86_64.whl": 10588514,
    "scipy_openblas32-0.3.34.481.3-py3-none-manylinux_2_28_x86_64.whl": 7885409,
    "pennylane-0.45.1-py3-none-any.whl": 5414360,
    "nvmath_python-1.0.0-cp312-cp312-manylinux_2_28_x86_64.whl": 5320781,
    "flaky-3.8.1-py2.py3-none-any.whl": 19139,
}


def test_split_loads_puts_custatevec_alone_and_packs_the_rest_first_fit_decreasing():
    sizes = {"custatevec_cu13.whl": 57 * MIB, "a.whl": 30 * MIB, "b.whl": 20 * MIB}
    sizes |= {"c.whl": 9 * MIB, "d.whl": 1 * MIB}
    loads = split_loads(sizes, capacity=58 * MIB, alone=["custatevec_cu13"])
    assert loads == [
        Load("load1", ("custatevec_cu13.whl",), 57 * MIB),
        Load("load2", ("a.whl", "b.whl", "d.whl"), 51 * MIB),
        Load("load3", ("c.whl",), 9 * MIB),
    ]


def test_split_loads_keeps_an_alone_wheel_alone_even_where_others_would_fit():
    loads = split_loads({"custatevec_cu13.whl": 10, "a.whl": 5}, 100, ["custatevec_cu13"])
    assert [load.wheels for load in loads] == [("custatevec_cu13.whl",), ("a.whl",)]


def test_the_issue_wheels_travel_in_two_calls_beside_a_small_repository():
    repo = int(1.7 * MIB)
    loads = split_loads(ISSUE_WHEELS, 60 * MIB - repo, ["custatevec_cu13"])
    assert [load.name for load in loads] == ["load1", "load2"]
    assert loads[0].wheels == ("custatevec_cu13-1.15.0-py3-none-manylinux2014_x86_64.whl",)
    assert all(load.size + repo <= 60 * MIB for load in loads)
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
        "call 1: command 'bash scripts/gpu_check.sh install', carry [\".whl/load1\"]",
        "call 2: command 'QUICK=1 bash scripts/gpu_check.sh run', carry [\".whl/load2\"]",
    ]


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


def test_gpu_check_stages_the_loads_and_runs_its_parts_without_a_gpu(two_loads):
    installed = gpu_check("install", two_loads, "call1")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    site = two_loads / "site"
    assert (site / "shared" / "one.py").read_text() == "ONE = 1\n"
    assert "installed into" in installed.stdout

    out = two_loads / "out"
    parts = "environment contract tests suite suite_shots"  # not the two slow CPU parts
    ran = gpu_check("run", two_loads, "call2", DRY_RUN="1", OUT=str(out), PARTS=parts)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    # the second load merged into the first's folders, not over them
    assert (site / "shared" / "one.py").is_file() and (site / "shared" / "two.py").is_file()
    assert (site / ".gpu_check_loads" / "load1").read_text() == "load1 first-1.0-py3-none-any.whl\n"
    summary = [line for line in (out / "summary.txt").read_text().splitlines() if line]
    assert summary[0] == "==> summary"
    assert summary[1].startswith("  environment: ok; ")
    assert summary[2:8] == [
        f"  live binding check (real cuquantum): skipped: not in PARTS ({parts})",
        "  backend contract (real library): skipped: no GPU (DRY_RUN=1)",
        "  project tests (custatevec backend): skipped: no GPU (DRY_RUN=1)",
        "  PennyLane device suite (analytic, backend=custatevec): skipped: no GPU (DRY_RUN=1)",
        "  PennyLane device suite (shots=20000, backend=custatevec): skipped: no GPU (DRY_RUN=1)",
        f"  GPU benchmark (--dry-run): skipped: not in PARTS ({parts})",
    ]
    assert summary[8] == "total: 0 passed, 0 failed, 0 skipped"
    assert f"  pennylane {metadata.version('pennylane')}\n" in (out / "parts.log").read_text()


def test_gpu_check_run_refuses_a_target_without_the_earlier_loads(two_loads):
    ran = gpu_check("run", two_loads, "call2", DRY_RUN="1")
    assert ran.returncode == 3
    assert "load1 neither installed in" in ran.stderr
    assert "make the install calls again" in " ".join(ran.stderr.split())


def test_gpu_check_install_without_a_load_says_what_to_carry(tmp_path):
    (tmp_path / "empty").mkdir()
    ran = gpu_check("install", tmp_path, "empty")
    assert ran.returncode == 1
    assert "no load under" in ran.stderr and "carry .whl/load1" in ran.stderr


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
    assert text.rstrip().endswith("both reset before the build.")


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
