"""The documentation's examples run, and the README's options table is the device's.

Every ```python block of README.md and doc/*.md that uses the device
(``custatevec.qubit`` or ``pennylane_custatevec``) runs here, in a fresh namespace, in
the order of its page. A block is left out only by a marker on the line above its fence:

- ``<!-- docs-test: skip (reason) -->``: not a program (a signature, a fragment that uses
  the reader's names); always skipped, with the reason;
- ``<!-- docs-test: long (reason) -->``: a real program too long or too large for the tests
  (30 wires, a launcher such as mpiexec or torchrun); runs with ``DOCS_TEST_LONG=1``.

A block that imports torch, jax or mpi4py is skipped where that package is not installed.
"""

from __future__ import annotations

import inspect
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from pennylane_custatevec import CuStateVecDevice

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "doc").glob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
MARKER = re.compile(r"<!-- docs-test: (skip|long) \((.+?)\) -->\s*$")
OPTIONAL = ("torch", "jax", "mpi4py")


def _blocks():
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            body = match.group(1)
            if "custatevec.qubit" not in body and "pennylane_custatevec" not in body:
                continue
            line = text.count("\n", 0, match.start()) + 1
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = MARKER.search(before)
            yield pytest.param(
                body,
                marker.groups() if marker else None,
                id=f"{page.relative_to(ROOT)}:{line}",
            )


BLOCKS = list(_blocks())


def test_the_pages_have_examples():
    ids = [block.id for block in BLOCKS]
    assert any(i.startswith("README.md") for i in ids)
    assert any(i.startswith("doc/quickstart.md") for i in ids)


@pytest.mark.parametrize(("code", "marker"), BLOCKS)
def test_example_runs(code, marker, tmp_path, monkeypatch):
    if marker is not None:
        kind, reason = marker
        if kind == "skip":
            pytest.skip(f"marked skip: {reason}")
        if os.environ.get("DOCS_TEST_LONG") != "1":
            pytest.skip(f"marked long ({reason}): set DOCS_TEST_LONG=1")
    for name in OPTIONAL:
        if re.search(rf"^\s*(import|from) {name}\b", code, re.MULTILINE):
            pytest.importorskip(name)
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CPU fallback's warning, on machines without a GPU
        exec(compile(code, "<doc example>", "exec"), {"__name__": "__doc_example__"})  # noqa: S102


def _readme_options() -> dict[str, str]:
    """{option: its default cell} from the README's table under "## Options"."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Options", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[2]
    return rows


def test_readme_options_are_the_device_options():
    parameters = inspect.signature(CuStateVecDevice.__init__).parameters
    options = {
        name
        for name, p in parameters.items()
        if name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD
    }
    assert set(_readme_options()) == options


def test_readme_defaults_are_the_code_defaults():
    parameters = inspect.signature(CuStateVecDevice.__init__).parameters
    for name, cell in _readme_options().items():
        written = re.match(r"`([^`]+)`", cell)
        assert written, f"{name}: its default cell does not start with the value: {cell!r}"
        value = eval(written.group(1), {"numpy": np, "np": np})  # noqa: S307
        assert value == parameters[name].default, (name, value, parameters[name].default)


def test_readme_options_cells_are_one_line():
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Options", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        if line.startswith("| `"):
            for cell in line.strip("|").split("|"):
                assert len(cell.strip()) <= 100, cell


def test_readme_keeps_the_commands_ci_runs():
    """CI (.ci/run) runs these two commands; the README shows them verbatim."""
    text = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/setup_env.sh && .venv/bin/python demos/torchlayer_classifier.py" in text
    assert "bash scripts/setup_env.sh && bash scripts/run_tests.sh" in text
    assert "bash scripts/setup_env.sh" in ci and "bash scripts/run_tests.sh" in ci
