"""The documentation's generated capability tables, and its Sphinx extensions.

The tables of doc/supported.md are generated at build time from
pennylane_custatevec/capabilities.toml by doc/_ext/capabilities_data.py (rows) and
doc/_ext/capabilities_table.py (the ``capabilities-table`` directive). These tests check
the rows against the file as tomllib and PennyLane parse it, that they follow an edited
file, and, with Sphinx installed, that a small Sphinx build renders them into HTML.
"""

from __future__ import annotations

import dataclasses
import html.parser
import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "doc"
EXT = DOC / "_ext"
TOML = ROOT / "pennylane_custatevec" / "capabilities.toml"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"doc_ext_{name}", EXT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


capabilities_data = _load("capabilities_data")


@pytest.fixture(scope="module")
def parsed() -> dict:
    with open(TOML, "rb") as file:
        return tomllib.load(file)


def _rows_by_name(table) -> dict[str, dict[str, str]]:
    names = [row[0] for row in table.rows]
    assert len(names) == len(set(names)), f"duplicate rows: {names}"
    return {row[0]: dict(zip(table.header[1:], row[1:], strict=True)) for row in table.rows}


def test_the_generator_reads_the_package_file():
    assert capabilities_data.CAPABILITIES_TOML == TOML
    assert TOML.is_file()


def test_every_section_of_the_file_has_a_table_on_the_supported_page(parsed):
    in_file = {f"operators.{name}" for name in parsed["operators"]}
    in_file |= {name for name in parsed if name not in ("schema", "operators")}
    assert in_file == set(capabilities_data.SECTIONS)
    page = (DOC / "supported.md").read_text()
    used = re.findall(r"^```\{capabilities-table\}\s+(\S+)\s*$", page, flags=re.MULTILINE)
    assert sorted(used) == sorted(capabilities_data.SECTIONS)


def test_gate_table_matches_the_file(parsed):
    gates = parsed["operators"]["gates"]
    table = capabilities_data.table(parsed, "operators.gates")
    assert [row[0] for row in table.rows] == list(gates)  # every gate, in the file's order
    used = {prop for entry in gates.values() for prop in entry.get("properties", [])}
    assert table.header[0] == "name"
    assert set(table.header[1:]) == used  # a column per property the file uses, no other
    rows = _rows_by_name(table)
    for name, entry in gates.items():
        for prop in used:
            expected = "yes" if prop in entry.get("properties", []) else "no"
            assert rows[name][prop] == expected, (name, prop)
    assert rows["RX"] == {"invertible": "yes", "controllable": "yes"}
    assert rows["ControlledQubitUnitary"] == {"invertible": "yes", "controllable": "no"}
    assert rows["StatePrep"] == {"invertible": "no", "controllable": "no"}


def test_tables_match_the_device_capabilities_pennylane_reads():
    from pennylane_custatevec import CuStateVecDevice

    capabilities = CuStateVecDevice.capabilities
    data = capabilities_data.load()

    gates = _rows_by_name(capabilities_data.table(data, "operators.gates"))
    assert set(gates) == set(capabilities.operations)
    for name, properties in capabilities.operations.items():
        for prop, cell in gates[name].items():
            assert cell == ("yes" if getattr(properties, prop) else "no"), (name, prop)

    observables = capabilities_data.table(data, "operators.observables")
    assert {row[0] for row in observables.rows} == set(capabilities.observables)

    processes = _rows_by_name(capabilities_data.table(data, "measurement_processes"))
    assert set(processes) == set(capabilities.measurement_processes)
    for name, conditions in capabilities.measurement_processes.items():
        expected = capabilities_data.describe_conditions([c.value for c in conditions])
        assert processes[name]["conditions"] == expected, name
    assert processes["StateMP"]["conditions"] == "analytic execution only"
    assert processes["SampleMP"]["conditions"] == "finite shots only"
    assert processes["ExpectationMP"]["conditions"] == "none"

    compilation = dict(capabilities_data.table(data, "compilation").rows)
    fields = {field.name for field in dataclasses.fields(capabilities)}
    assert set(compilation) <= fields
    for name, cell in compilation.items():
        value = getattr(capabilities, name)
        if isinstance(value, bool):
            assert cell == ("yes" if value else "no"), name
        else:
            assert cell == ", ".join(value), name


def test_tables_follow_an_edited_file(parsed, tmp_path):
    edited = tmp_path / "capabilities.toml"
    text = TOML.read_text()
    text = re.sub(r"^RX\s+=.*\n", "", text, count=1, flags=re.MULTILINE)
    text = text.replace(
        "[operators.observables]",
        'FakeGate = { properties = [ "differentiable" ] }\n\n[operators.observables]',
    )
    text = text.replace(
        "ExpectationMP          = {}", 'ExpectationMP = { conditions = [ "analytic" ] }'
    )
    edited.write_text(text)
    data = capabilities_data.load(edited)

    gates = capabilities_data.table(data, "operators.gates")
    names = [row[0] for row in gates.rows]
    assert "RX" not in names and "RY" in names
    assert names[-1] == "FakeGate"
    assert gates.header == ("name", "invertible", "controllable", "differentiable")
    rows = _rows_by_name(gates)
    assert rows["FakeGate"] == {"invertible": "no", "controllable": "no", "differentiable": "yes"}
    assert rows["RY"]["differentiable"] == "no"
    processes = _rows_by_name(capabilities_data.table(data, "measurement_processes"))
    assert processes["ExpectationMP"]["conditions"] == "analytic execution only"
    assert len(gates.rows) == len(parsed["operators"]["gates"])  # one removed, one added


def test_unknown_section_is_refused(parsed):
    with pytest.raises(ValueError, match="unknown section"):
        capabilities_data.table(parsed, "operators")


class _Tables(html.parser.HTMLParser):
    """The text of every cell of every <table>, as tables -> rows -> cells."""

    def __init__(self):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _sphinx_build(src: Path, out: Path, toml: Path) -> subprocess.CompletedProcess:
    (src / "conf.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(EXT)!r})\n"
        "extensions = ['capabilities_table']\n"
        f"capabilities_toml = {str(toml)!r}\n"
    )
    directives = "\n".join(
        f".. capabilities-table:: {name}\n" for name in capabilities_data.SECTIONS
    )
    (src / "index.rst").write_text(f"Capabilities\n============\n\n{directives}")
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-E", "-W", "-q", "-b", "html", str(src), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_sphinx_renders_the_tables_from_the_file(parsed, tmp_path):
    pytest.importorskip("sphinx")
    src = tmp_path / "src"
    src.mkdir()
    result = _sphinx_build(src, tmp_path / "html", TOML)
    assert result.returncode == 0, result.stderr
    parser = _Tables()
    parser.feed((tmp_path / "html" / "index.html").read_text())
    assert len(parser.tables) == len(capabilities_data.SECTIONS)
    gates, observables, processes, compilation = parser.tables

    gate_entries = parsed["operators"]["gates"]
    header, *rows = gates
    assert header == ["name", "invertible", "controllable"]
    assert [row[0] for row in rows] == list(gate_entries)
    for name, *cells in rows:
        properties = gate_entries[name].get("properties", [])
        assert cells == ["yes" if p in properties else "no" for p in header[1:]], name

    assert [row[0] for row in observables[1:]] == list(parsed["operators"]["observables"])
    process_entries = parsed["measurement_processes"]
    assert processes[0] == ["name", "conditions"]
    assert [row[0] for row in processes[1:]] == list(process_entries)
    for name, conditions in processes[1:]:
        expected = process_entries[name].get("conditions", [])
        assert conditions == capabilities_data.describe_conditions(expected), name
    assert [row[0] for row in compilation[1:]] == list(parsed["compilation"])


def test_sphinx_build_fails_without_the_file(tmp_path):
    pytest.importorskip("sphinx")
    src = tmp_path / "src"
    src.mkdir()
    result = _sphinx_build(src, tmp_path / "html", tmp_path / "missing.toml")
    assert result.returncode != 0
    assert "capabilities-table" in result.stderr


def test_plain_docstrings_escape_bars_outside_literals():
    pytest.importorskip("sphinx")
    plain = _load("plain_docstrings")
    assert (
        plain.escape_bars("<psi_b|P|psi_b> for each vector") == r"<psi_b\|P\|psi_b> for each vector"
    )
    assert plain.escape_bars("``a | b`` and |0>") == r"``a | b`` and \|0>"


def test_plain_docstrings_show_indented_formulas_as_written():
    pytest.importorskip("sphinx")
    plain = _load("plain_docstrings")
    lines = [
        "For a block on the bits S,",
        "",
        "    T[a, c] = sum_r conj(lambda[a, r]) phi[c, r]",
        "",
        "is one reduction; <lambda|psi>:",
        "",
        "    d/dtheta Re <lambda|psi> = Re sum_ac D[a, c] T[a, c],",
        "",
        ":param x: a field",
        "",
        "    not a formula |x|",
    ]
    assert plain.render(lines) == [
        "For a block on the bits S, ::",
        "",
        "    T[a, c] = sum_r conj(lambda[a, r]) phi[c, r]",
        "",
        r"is one reduction; <lambda\|psi>::",
        "",
        "    d/dtheta Re <lambda|psi> = Re sum_ac D[a, c] T[a, c],",
        "",
        ":param x: a field",
        "",
        r"    not a formula \|x\|",
    ]
