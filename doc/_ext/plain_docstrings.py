"""Render the package's plain-text docstrings as reStructuredText.

The docstrings of ``pennylane_custatevec`` are written for ``help()`` and for readers of
the source: kets and inner products as ``|psi>`` and ``<bra|P|ket>``, formulas on indented
lines under a paragraph. Read as reStructuredText, ``|...|`` is a substitution reference
(an error for an undefined one) and an indented block is a block quote that loses the
formulas' line breaks and alignment. This extension, connected to
``autodoc-process-docstring``, reads the Google-style sections (``Args:``) of modules,
classes and functions with napoleon, then changes two things and nothing else:

* an indented block that follows a plain paragraph (not a field, list item, directive or
  a paragraph already ending in ``::``) becomes a literal block, shown as written;
* ``|`` outside literal blocks and inline literals is escaped.
"""

from __future__ import annotations

import re

from sphinx.ext.napoleon.docstring import GoogleDocstring

_INLINE_LITERAL = re.compile(r"(``.+?``)")
_STRUCTURED_START = re.compile(r"^(:|\.\. |[-*+] |\d+\. |>>> )")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def escape_bars(line: str) -> str:
    """``line`` with every ``|`` outside inline literals escaped."""
    parts = _INLINE_LITERAL.split(line)
    return "".join(
        part
        if part.startswith("``") and part.endswith("``") and len(part) > 4
        else part.replace("|", r"\|")
        for part in parts
    )


def render(lines: list[str]) -> list[str]:
    """The docstring ``lines`` (as autodoc gives them) in reStructuredText."""
    out: list[str] = []
    paragraph: list[int] = []  # indices into out of the current paragraph's lines
    literal_indent: int | None = None  # a literal block runs while lines are deeper than this
    previous_blank = True
    for line in lines:
        blank = not line.strip()
        if literal_indent is not None:
            if blank or _indent(line) > literal_indent:
                out.append(line)
                previous_blank = blank
                continue
            literal_indent = None
        if blank:
            out.append(line)
            previous_blank = True
            continue
        if previous_blank and paragraph:
            first, last = out[paragraph[0]], out[paragraph[-1]]
            if _indent(line) > _indent(first) and not _STRUCTURED_START.match(first.lstrip()):
                # a formula or a listing under a plain paragraph: show it as written
                out[paragraph[-1]] = last.rstrip() + (":" if last.rstrip().endswith(":") else " ::")
                literal_indent = _indent(first)
                out.append(line)
                paragraph = []
                previous_blank = False
                continue
        if previous_blank:
            paragraph = []
        first = out[paragraph[0]] if paragraph else line
        paragraph.append(len(out))
        out.append(line if first.lstrip().startswith(">>>") else escape_bars(line))
        if line.rstrip().endswith("::"):
            literal_indent = _indent(out[paragraph[0]])
            paragraph = []
        previous_blank = False
    return out


_GOOGLE_STYLE = frozenset({"module", "class", "exception", "function", "method"})
"""What napoleon reads as Google style. Not properties and attributes: napoleon takes a
first line "The backend in use: ..." as a type and a description."""


def _process(app, what, name, obj, options, lines: list[str]) -> None:
    if what in _GOOGLE_STYLE:
        lines[:] = GoogleDocstring(lines, app.config, app, what, name, obj, options).lines()
    lines[:] = render(lines)


def _napoleon_off(app, config) -> None:
    config.napoleon_google_docstring = False
    config.napoleon_numpy_docstring = False


def setup(app):
    app.setup_extension("sphinx.ext.autodoc")
    app.setup_extension("sphinx.ext.napoleon")  # its settings; its own handler switched off
    app.connect("config-inited", _napoleon_off)
    app.connect("autodoc-process-docstring", _process)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
