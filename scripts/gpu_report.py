"""The GPU check's own tools (scripts/gpu_check.sh): run pytest and require that the real
library's tests ran, and write the check's one markdown summary.

    python scripts/gpu_report.py pytest-real MIN [PYTEST ARGUMENT...]
    python scripts/gpu_report.py summary --work DIR --out FILE [--summary FILE...]

``pytest-real`` runs ``python -m pytest`` with the arguments given and a JUnit XML report,
then counts the tests of the real library (parameter ids with ``gpu``: ``[gpu-c128-...]``,
``[gpu]``, ``[mpi-gpu-...]``) that ran. It prints one ``SUMMARY:`` line (what
scripts/parts.sh records for the part) and exits non-zero when pytest failed, when any of
them was skipped, or when fewer than MIN ran: a part whose tests all skip (no usable GPU:
every real-library test skips) does not pass.

``summary`` writes ``gpu.md`` (for benchmarks/results/gpu.md): the GPU and its driver
(``gpu.txt``, nvidia-smi's query, in DIR), each part's last summary line (the files
``--summary`` names, oldest first: a part still running when its call was killed shows as
running), the benchmark tables (``latency.md``, ``gates.md``, ``workloads.md``,
``memory.md`` in DIR, their sections without the report's header) and the tails of the
sanitizer's and cuStateVec's logs.
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REAL_ID = re.compile(r"\[(?:[^\]]*-)?gpu(?:-[^\]]*)?\]")
"""A real-library test's node id: ``gpu`` as one of the dash-separated words of its
parameter id (not the double's ``test_...per_gpu``)."""
BENCH_PARTS = ("latency", "gates", "workloads", "memory")
LEGEND = (
    "Workloads: ratio = peer time / our GPU time; every configuration's values and gradients",
    "are compared with the first peer that ran (np.allclose, atol 1e-6): **MISMATCH** if not.",
    "GPU memory: the drop of the driver's free memory (memGetInfo) from emptied pools, which",
    "counts cuStateVec's handle and the stream-ordered pool too, then each pool's own figure.",
)


def real_tests(xml_path: Path) -> tuple[int, int, list[str]]:
    """(real-library tests that ran, those skipped, the ids of those that failed) in a JUnit
    XML report."""
    ran = skipped = 0
    failed = []
    for case in ElementTree.parse(xml_path).getroot().iter("testcase"):
        name = case.get("name", "")
        if not REAL_ID.search(name):
            continue
        if case.find("skipped") is not None:
            skipped += 1
            continue
        ran += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(name)
    return ran, skipped, failed


def pytest_real(minimum: int, arguments: list[str]) -> int:
    """Run pytest, then require ``minimum`` real-library tests run and none skipped."""
    with tempfile.TemporaryDirectory() as folder:
        xml_path = Path(folder) / "report.xml"
        code = subprocess.call(
            [sys.executable, "-m", "pytest", *arguments, f"--junitxml={xml_path}"]
        )
        if not xml_path.exists():
            print(f"SUMMARY: pytest ended with exit code {code} and no report")
            return code or 1
        ran, skipped, failed = real_tests(xml_path)
    verdict = "ok"
    if skipped or ran < minimum:
        verdict = (
            f"NOT RUN: {ran} real-library tests ran, {skipped} skipped, at least {minimum} "
            "wanted (is the GPU backend usable? see the environment part)"
        )
    elif failed:
        verdict = f"{len(failed)} failed, e.g. {failed[0]}"
    print(f"SUMMARY: real library: {ran} tests ran, {skipped} skipped; {verdict}")
    if code == 0 and verdict != "ok":
        return 1
    return code


def last_lines(summaries: list[Path]) -> dict[str, str]:
    """Each part's last line in the summary files (``name: status; summary``), in order."""
    parts: dict[str, str] = {}
    for path in summaries:
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            name, _, rest = line.partition(": ")
            if rest and not line.startswith(("==>", "total:", " ")):
                parts[name] = rest
    return parts


def _sections(markdown: str) -> list[str]:
    """A benchmark report's tables: its sections from the first to its summary (which
    repeats them), one level down."""
    lines = markdown.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    end = next((i for i, line in enumerate(lines) if line == "## Summary"), len(lines))
    return ["#" + line if line.startswith("## ") else line for line in lines[start:end]]


def _tail(path: Path, count: int) -> list[str]:
    if not path.exists():
        return ["(not written)"]
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return ["```", *lines[-count:], "```"] if lines else ["(empty)"]


def summary(work: Path, out: Path, summaries: list[Path]) -> None:
    gpu_info = work / "gpu.txt"
    device = gpu_info.read_text().strip() if gpu_info.exists() else "no GPU (nvidia-smi saw none)"
    lines = [
        "# GPU check",
        "",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- device (nvidia-smi: name, driver, memory, compute capability): {device}",
        "- made by scripts/gpu_check.sh (doc/development.md, 'The GPU check'); every figure below",
        "  was measured on that device in the calls that wrote this page",
        "",
        "## Parts",
        "",
        "| part | result |",
        "| --- | --- |",
    ]
    parts = last_lines(summaries)
    lines += [f"| {name} | {result} |" for name, result in parts.items()]
    if not parts:
        lines.append("| - | no part ran |")
    tables = [work / f"{name}.md" for name in BENCH_PARTS if (work / f"{name}.md").exists()]
    for path in tables:
        lines += ["", *_sections(path.read_text(encoding="utf-8"))]
    if tables:
        lines += ["", *LEGEND]
    lines += [
        "",
        "## compute-sanitizer (memcheck), last lines",
        "",
        *_tail(work / "sanitizer.log", 8),
    ]
    lines += [
        "",
        "## cuStateVec's log (level 3), last lines",
        "",
        *_tail(work / "custatevec.log", 20),
    ]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    if argv[:1] == ["pytest-real"] and len(argv) >= 2 and argv[1].isdigit():
        return pytest_real(int(argv[1]), argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("summary",))
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--summary", type=Path, action="append", default=[])
    args = parser.parse_args(argv)
    summary(args.work, args.out, args.summary)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
