#!/usr/bin/env bash
# Build the HTML documentation (doc/ -> doc/_build/html) with Sphinx, warnings as errors.
# Expects .venv from scripts/setup_env.sh (the docs extra: sphinx, myst-parser, furo).
#
# Environment:
#   PY  Python interpreter with Sphinx installed (default: .venv/bin/python)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PY="${PY:-$ROOT/.venv/bin/python}"
if [ ! -x "$PY" ] && ! command -v "$PY" >/dev/null 2>&1; then
    echo "build_docs.sh: $PY not found; run 'bash scripts/setup_env.sh' first or set PY" >&2
    exit 1
fi

# -E: a fresh environment each time, so that warnings of unchanged pages are not hidden
"$PY" -m sphinx -E -W --keep-going -b html doc doc/_build/html
echo "build_docs.sh: HTML in $ROOT/doc/_build/html/index.html"
