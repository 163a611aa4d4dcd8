"""The package's layering, as doc/architecture.md's layer table states it: every module is
in exactly one layer, and a module imports only from layers below its own (never from its
own layer or above); only the backends import numba, cupy or cuquantum. The table is read
from the documentation, so the page and the code cannot drift apart."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pennylane_custatevec"
ARCHITECTURE = ROOT / "doc" / "architecture.md"
MEMORY_LIBRARIES = frozenset({"cupy", "cuquantum", "numba"})
"""Libraries that touch state-vector memory or compile kernels: backends only."""


def layer_table(text: str) -> dict[str, int]:
    """{module: layer} from the table of the "## Layers" section (rows ``| n | `a`, `b` |
    ...``; module names relative to the package, ``pennylane_custatevec`` for its
    ``__init__``)."""
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers: dict[str, int] = {}
    for line in section.splitlines():
        row = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
        if row is None:
            continue
        for module in re.findall(r"`([\w.]+)`", row.group(2)):
            assert module not in layers, f"{module} is in two layers of the table"
            layers[module] = int(row.group(1))
    return layers


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "pennylane_custatevec"


def imports_of(path: pathlib.Path) -> tuple[set[str], set[str]]:
    """(the package's modules that ``path`` imports, the top-level external packages it
    imports), relative imports resolved; an imported name that is a module of the package
    counts as that module."""
    package = list(path.relative_to(PACKAGE).parts[:-1])
    internal, external = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top, _, rest = alias.name.partition(".")
                if top == "pennylane_custatevec":
                    internal.add(rest or top)
                else:
                    external.add(top)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                top, _, rest = (node.module or "").partition(".")
                if top != "pennylane_custatevec":
                    external.add(top)
                    continue
                base = rest.split(".") if rest else []
            else:
                base = package[: len(package) - node.level + 1]
                base += node.module.split(".") if node.module else []
            for alias in node.names:
                candidate = [*base, alias.name]
                is_module = (PACKAGE.joinpath(*candidate).with_suffix(".py")).exists() or (
                    PACKAGE.joinpath(*candidate, "__init__.py").exists()
                )
                internal.add(".".join(candidate if is_module else base) or "pennylane_custatevec")
    return internal, external


def upward(module: str, imported: set[str], layers: dict[str, int]) -> list[str]:
    """The modules of ``imported`` in ``module``'s layer or above it."""
    return sorted(
        f"{target} (layer {layers[target]})"
        for target in imported - {module}
        if layers[target] >= layers[module]
    )


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
LAYERS = layer_table(ARCHITECTURE.read_text())


def test_the_table_names_every_module_once():
    assert sorted(LAYERS) == sorted(MODULES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module):
    internal, _ = imports_of(MODULES[module])
    found = upward(module, internal, LAYERS)
    assert not found, f"{module} (layer {LAYERS[module]}) imports from its layer or above: {found}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_backends_touch_memory(module):
    _, external = imports_of(MODULES[module])
    if not (module == "backends" or module.startswith("backends.")):
        assert not external & MEMORY_LIBRARIES, f"{module} imports {external & MEMORY_LIBRARIES}"


def test_the_checks_can_fail(tmp_path):
    """The table parser, the import reader and the direction check see what they must: a
    made-up table, the imports of two real modules, an import sideways and one upward."""
    text = "## Layers\n| layer | modules |\n| --- | --- |\n| 1 | `a`, `b` |\n| 2 | `c` |\n"
    layers = layer_table(text)
    assert layers == {"a": 1, "b": 1, "c": 2}
    assert upward("c", {"a", "b"}, layers) == []
    assert upward("a", {"b", "c"}, layers) == ["b (layer 1)", "c (layer 2)"]
    probe = PACKAGE / "simulate.py"
    internal, external = imports_of(probe)
    assert "program" in internal and "backends.base" in internal
    assert "numpy" in external
    kernels_internal, kernels_external = imports_of(PACKAGE / "backends" / "_cpu_kernels.py")
    assert "numba" in kernels_external
