"""Sphinx configuration of the pennylane-custatevec documentation.

Build with ``bash scripts/build_docs.sh`` (warnings are errors).
"""

import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent
ROOT = DOC.parent
sys.path.insert(0, str(DOC / "_ext"))
sys.path.insert(0, str(ROOT))

import pennylane_custatevec  # noqa: E402

project = "pennylane-custatevec"
author = "pennylane-custatevec contributors"
copyright = "pennylane-custatevec contributors"
release = pennylane_custatevec.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "capabilities_table",
    "plain_docstrings",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_ext"]

myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_mock_imports = ["cupy", "cuquantum"]
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_inherit_docstrings = False
autodoc_default_options = {"members": True, "show-inheritance": False}

html_theme = "furo"
html_title = f"pennylane-custatevec {release}"
