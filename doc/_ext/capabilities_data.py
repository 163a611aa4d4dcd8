"""The tables of the device's capabilities file (``pennylane_custatevec/capabilities.toml``).

Pure functions of the parsed TOML, kept apart from Sphinx so that the tests can check them
without building the documentation: :func:`table` gives the header and the rows of one
section, and the ``capabilities-table`` directive (``capabilities_table.py``) renders them.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

CAPABILITIES_TOML = (
    Path(__file__).resolve().parents[2] / "pennylane_custatevec" / "capabilities.toml"
)

SECTIONS = (
    "operators.gates",
    "operators.observables",
    "measurement_processes",
    "compilation",
)
"""The sections of the capabilities file (PennyLane's schema 3) that the tables show."""

PROPERTY_ORDER = ("invertible", "controllable", "differentiable")
"""PennyLane's operator properties, in the order of the columns; others follow by name."""

CONDITIONS = {
    "analytic": "analytic execution only",
    "finiteshots": "finite shots only",
    "terms-commute": "only if the terms commute",
}
"""How the table words PennyLane's condition strings."""

YES, NO = "yes", "no"


@dataclasses.dataclass(frozen=True)
class Table:
    """One section: the column titles and one row of cell texts per entry."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def load(path: Path | str = CAPABILITIES_TOML) -> dict:
    """The parsed capabilities file."""
    with open(path, "rb") as file:
        return tomllib.load(file)


def section(data: dict, name: str) -> dict:
    """The section ``name`` (dotted: ``operators.gates``) of the parsed file."""
    value = data
    for part in name.split("."):
        value = value[part]
    return value


def property_columns(entries: dict) -> list[str]:
    """The properties that the entries of a section use, in ``PROPERTY_ORDER`` first."""
    used = {prop for entry in entries.values() for prop in entry.get("properties", ())}
    known = [prop for prop in PROPERTY_ORDER if prop in used]
    return known + sorted(used - set(PROPERTY_ORDER))


NO_CONDITIONS = "none"


def describe_conditions(conditions) -> str:
    """The cell text of an entry's ``conditions``."""
    if not conditions:
        return NO_CONDITIONS
    return ", ".join(CONDITIONS.get(condition, condition) for condition in conditions)


def entry_table(entries: dict) -> Table:
    """Name, one column per property used, and a conditions column if any entry has one."""
    columns = property_columns(entries)
    with_conditions = any(entry.get("conditions") for entry in entries.values())
    header = ("name", *columns) + (("conditions",) if with_conditions else ())
    rows = []
    for name, entry in entries.items():
        properties = set(entry.get("properties", ()))
        row = (name, *(YES if prop in properties else NO for prop in columns))
        if with_conditions:
            row += (describe_conditions(entry.get("conditions", ())),)
        rows.append(row)
    return Table(header, tuple(rows))


def format_value(value) -> str:
    """A compilation flag or list as cell text."""
    if isinstance(value, bool):
        return YES if value else NO
    if isinstance(value, list):
        return ", ".join(str(item) for item in value)
    return str(value)


def compilation_table(options: dict) -> Table:
    """One row per compilation option of the file, with its value."""
    return Table(
        ("option", "value"), tuple((key, format_value(value)) for key, value in options.items())
    )


def table(data: dict, name: str) -> Table:
    """The table of the section ``name``, one of ``SECTIONS``."""
    if name not in SECTIONS:
        raise ValueError(f"unknown section {name!r}; choose one of {', '.join(SECTIONS)}")
    if name == "compilation":
        return compilation_table(section(data, name))
    return entry_table(section(data, name))
