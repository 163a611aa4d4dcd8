#!/usr/bin/env bash
# Verify the cuStateVec GPU backend on a machine with an NVIDIA GPU: install the project with
# its GPU extra, run the project's tests on the GPU backend, PennyLane's device suite with
# backend=custatevec (analytic, then with shots), and the benchmark workloads (lightning.gpu
# as a peer when it is installed); print one summary. Every part runs; the script exits
# non-zero if the install failed or any part failed.
#
# Environment:
#   CUDA               12 (default) or 13: the extra [cuda12] or [cuda13], matching the driver
#   VENV               virtual environment to create or reuse (default: .venv-gpu)
#   PYTHON             interpreter that creates it (default: python3, >= 3.11)
#   WHEELS             a directory of wheels to install from, without a registry
#   TORCH_REQUIREMENT  torch to install when the environment has none (default: torch)
#   BENCH_ARGS         extra arguments of benchmarks/run_workloads.py (e.g. --quick)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

CUDA="${CUDA:-12}"
VENV="${VENV:-$ROOT/.venv-gpu}"
PYTHON="${PYTHON:-python3}"
TORCH_REQUIREMENT="${TORCH_REQUIREMENT:-torch}"
read -r -a BENCH_EXTRA <<< "${BENCH_ARGS:-}"
PY="$VENV/bin/python"

if [ "$CUDA" != 12 ] && [ "$CUDA" != 13 ]; then
    echo "gpu_check.sh: CUDA=$CUDA; use CUDA=12 or CUDA=13 (the driver's CUDA major version)" >&2
    exit 1
fi
PIP_SOURCE=()
if [ -n "${WHEELS:-}" ]; then
    PIP_SOURCE=(--no-index --find-links "$WHEELS")
fi

install() {
    if [ ! -x "$PY" ]; then
        echo "==> creating virtual environment $VENV"
        "$PYTHON" -m venv "$VENV" || return 1
    fi
    if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
        echo "==> installing $TORCH_REQUIREMENT"
        "$PY" -m pip install "${PIP_SOURCE[@]}" "$TORCH_REQUIREMENT" || return 1
    fi
    echo "==> installing pennylane-custatevec (editable) with extras test,bench,cuda$CUDA"
    "$PY" -m pip install "${PIP_SOURCE[@]}" -e ".[test,bench,cuda$CUDA]" || return 1
    if [ "$CUDA" = 12 ]; then  # lightning.gpu's wheels are CUDA 12: no peer with CUDA 13
        "$PY" -m pip install "${PIP_SOURCE[@]}" "pennylane-lightning-gpu>=0.45,<0.46" \
            || echo "==> lightning.gpu not installed: the benchmarks run without it"
    fi
}

if ! install; then
    echo "gpu_check.sh: installing the project failed (see above)" >&2
    exit 1
fi

echo
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi
else
    echo "==> nvidia-smi not found"
fi
echo "==> cuStateVec backend: $("$PY" -c 'from pennylane_custatevec.backends import custatevec as c
print(c.unavailable_reason() or "usable")')"

SUITE="$("$PY" -c 'import pennylane.devices.tests as t, os; print(os.path.dirname(t.__file__))')" || {
    echo "gpu_check.sh: cannot locate PennyLane's device test suite" >&2
    exit 1
}

# shellcheck source=scripts/parts.sh
source "$ROOT/scripts/parts.sh"

run_part "project tests (custatevec backend)" \
    env PLCSV_TEST_BACKEND=custatevec "$PY" -m pytest tests -n 2 -q --no-flaky-report
run_part "PennyLane device suite (analytic, backend=custatevec)" \
    "$PY" -m pytest "$SUITE" --device=custatevec.qubit --device-kwargs backend=custatevec \
    -q -p no:cacheprovider -n 2 --no-flaky-report
run_part "PennyLane device suite (shots=20000, backend=custatevec)" \
    "$PY" -m pytest "$SUITE" --device=custatevec.qubit --device-kwargs backend=custatevec \
    --shots=20000 -q -p no:cacheprovider -n 2 --no-flaky-report
run_part "benchmarks (custatevec, lightning.gpu if installed)" \
    "$PY" benchmarks/run_workloads.py --backend custatevec \
    --out benchmarks/results/workloads-gpu.md \
    --plot benchmarks/results/plots/deferred_vs_eager-gpu.png "${BENCH_EXTRA[@]}"

print_summary
