"""Sphinx directive ``capabilities-table``: a section of the device's capabilities file as a
table, generated from the TOML at build time.

In a MyST page::

    ```{capabilities-table} operators.gates
    ```

The argument is one of :data:`capabilities_data.SECTIONS`. The file is the config value
``capabilities_toml`` (default: the package's ``capabilities.toml``); the pages that use
it are rebuilt when it changes.
"""

from __future__ import annotations

from pathlib import Path

import capabilities_data
from docutils import nodes
from sphinx.util.docutils import SphinxDirective


def table_node(table: capabilities_data.Table, name_column_literal: bool = True) -> nodes.table:
    """A docutils table of ``table``; the first column as inline code."""
    node = nodes.table(classes=["capabilities-table"])
    group = nodes.tgroup(cols=len(table.header))
    node += group
    for column, title in enumerate(table.header):
        width = max([len(title)] + [len(cells[column]) for cells in table.rows])
        group += nodes.colspec(colwidth=width + 2)
    head = nodes.thead()
    group += head
    head += _row(table.header, literal_first=False)
    body = nodes.tbody()
    group += body
    for cells in table.rows:
        body += _row(cells, literal_first=name_column_literal)
    return node


def _row(cells, literal_first: bool) -> nodes.row:
    row = nodes.row()
    for index, text in enumerate(cells):
        entry = nodes.entry()
        paragraph = nodes.paragraph()
        if text:
            paragraph += (
                nodes.literal(text=text) if index == 0 and literal_first else nodes.Text(text)
            )
        entry += paragraph
        row += entry
    return row


class CapabilitiesTable(SphinxDirective):
    """The table of one section of the capabilities file."""

    required_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        path = Path(self.config.capabilities_toml)
        self.env.note_dependency(str(path))
        try:
            table = capabilities_data.table(capabilities_data.load(path), name)
        except (OSError, KeyError, ValueError) as exc:
            raise self.error(f"capabilities-table {name}: {exc!r} ({path})") from exc
        return [table_node(table)]


def setup(app):
    app.add_config_value(
        "capabilities_toml", str(capabilities_data.CAPABILITIES_TOML), "env", types=[str]
    )
    app.add_directive("capabilities-table", CapabilitiesTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
