#!/usr/bin/env bash
# Record the signatures the project's tests call the CPU kernels with, as
# pennylane_custatevec/backends/kernel_signatures.txt: the list that kernel_build compiles
# when the package is installed. Run it after a change to the kernels or their arguments
# (tests/backends/test_kernel_build.py fails while the list lacks what the first calls of
# common circuits need). Takes as long as the project tests (about 10 minutes on 2 cores).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PY:-$ROOT/.venv/bin/python}"
RECORDED="$(mktemp -d)"
trap 'rm -rf "$RECORDED"' EXIT

# a failing test does not stop the recording: what the other tests compiled is recorded
status=0
CUSTATEVEC_RECORD_KERNELS="$RECORDED" "$PY" -m pytest tests -n 2 -q -p no:cacheprovider \
    --no-flaky-report || status=$?
"$PY" -m pennylane_custatevec.backends.kernel_build --merge "$RECORDED"
exit "$status"
