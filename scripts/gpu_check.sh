#!/usr/bin/env bash
# Verify the cuStateVec GPU backend on a machine with an NVIDIA GPU: the live binding check,
# the backend contract tests on the real library, the project's tests with the custatevec
# backend, PennyLane's device suite with backend=custatevec (analytic, then with shots), and
# the GPU benchmark; print one summary line per part. Every part runs; the script exits
# non-zero if staging or any part failed.
#
#   bash scripts/gpu_check.sh install   offline, call 1: install the carried loads, exit
#   bash scripts/gpu_check.sh run       offline, last call: install the carried loads, run
#   bash scripts/gpu_check.sh           connected: a venv from the registry (the old mode)
#
# Offline (no registry; loads made by scripts/gpu_wheels.sh, README "GPU check"): each call
# carries one load, .whl/loadN, and installs its wheels with pip --no-index --no-deps into a
# staging folder, then merges them into TARGET (the custatevec and cuquantum-python wheels
# share the folder cuquantum/, which pip --target would replace). `run` checks that every
# load of the manifest is installed (a machine given back between the calls has lost the
# first), then runs the parts with the machine's own Python and packages (no venv, no torch
# or cupy install), PYTHONPATH=repository:TARGET and LD_LIBRARY_PATH naming libcustatevec's
# folder (cuda-pathfinder searches site-packages, not PYTHONPATH).
#
# Environment (offline):
#   TARGET     install folder (default: /tmp/site); kept between the calls of a warm machine
#   LOADS      folder of the carried loads (default: .whl)
#   PYTHON     the machine's Python (default: python3)
#   QUICK      1: every part under a time limit, 8 minutes in all, the benchmark's --quick
#   DRY_RUN    1: stage and run the parts that need no GPU; the others say "skipped: no GPU"
#              (as they do wherever nvidia-smi sees no GPU); the benchmark runs --dry-run
#   OUT        where the results go when set: summary.txt, parts.log, gpu_bench.md
#   PARTS      the parts to run, by key (default: all): environment bindings contract tests
#              suite suite_shots benchmark; the others say "skipped: not in PARTS"
# Environment (connected):
#   CUDA               12 (default) or 13: the extra [cuda12] or [cuda13], matching the driver
#   VENV               virtual environment to create or reuse (default: .venv-gpu)
#   PYTHON             interpreter that creates it (default: python3, >= 3.11)
#   WHEELS             a directory of wheels to install from, without a registry
#   TORCH_REQUIREMENT  torch to install when the environment has none (default: torch)
#   BENCH_ARGS         extra arguments of benchmarks/run_workloads.py (e.g. --quick)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

MODE="${1:-connected}"
PYTHON="${PYTHON:-python3}"
QUICK="${QUICK:-0}"
DRY_RUN="${DRY_RUN:-0}"
MARKERS=.gpu_check_loads  # TARGET/$MARKERS/<load>: the wheels of each installed load

# Time limits of the offline parts with QUICK=1 (seconds, 470 in all: the check must fit a
# 10-minute device call with the install around it). A pytest part also gets
# pytest-timeout's --session-timeout, 35 s less (a third less for the short parts: the
# collection and the summary), so that it ends with its summary and the failures rather
# than being killed, and --timeout=120 per test (a hung GPU call fails its test).
QUICK_LIMITS=(
    "environment 15"
    "bindings 30"
    "contract 40"
    "tests 175"
    "suite 55"
    "suite_shots 55"
    "benchmark 100"
)

limit_of() {  # limit_of PART -> its QUICK limit in seconds, 0 (none) without QUICK
    local entry
    [ "$QUICK" = 1 ] || { echo 0; return; }
    for entry in "${QUICK_LIMITS[@]}"; do
        if [ "${entry% *}" = "$1" ]; then
            echo "${entry#* }"
            return
        fi
    done
    echo "gpu_check.sh: no time limit for part $1" >&2
    exit 2
}

pytest_limits() {  # pytest_limits PART -> pytest-timeout's options for the part's limit
    local limit
    limit="$(limit_of "$1")"
    if [ "$limit" -gt 0 ] && "$PYTHON" -c 'import pytest_timeout as t, sys
sys.exit(not hasattr(t, "SESSION_TIMEOUT_KEY"))' >/dev/null 2>&1; then  # pytest-timeout >= 2.3
        echo "--session-timeout=$((limit > 105 ? limit - 35 : limit * 2 / 3)) --timeout=120"
    fi
}

# --- offline: the loads ---------------------------------------------------------------

carried_loads() {  # the load folders present under LOADS, each with its manifest
    local dir
    for dir in "$LOADS"/load*/; do
        [ -f "$dir/LOADS.txt" ] && echo "${dir%/}"
    done
}

install_load() {  # install_load DIR: pip --target into a stage, merged into TARGET
    local dir="$1" name stage
    name="$(basename "$dir")"
    if [ -f "$TARGET/$MARKERS/$name" ] \
        && diff -q "$TARGET/$MARKERS/$name" <(grep "^$name " "$dir/LOADS.txt") >/dev/null; then
        echo "==> $name already installed in $TARGET"
        return 0
    fi
    stage="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_stage.XXXXXX")"
    echo "==> installing $name ($(grep -c "^$name " "$dir/LOADS.txt") wheels) into $TARGET"
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
        --disable-pip-version-check --target "$stage" "$dir"/*.whl || { rm -rf "$stage"; return 1; }
    mkdir -p "$TARGET/$MARKERS"
    cp -a "$stage/." "$TARGET/" || { rm -rf "$stage"; return 1; }
    rm -rf "$stage"
    grep "^$name " "$dir/LOADS.txt" > "$TARGET/$MARKERS/$name"
}

stage_loads() {  # install every carried load; with `run`, every load of the manifest must be in
    local loads dir manifest="" missing=()
    mapfile -t loads < <(carried_loads)
    if [ "$MODE" = install ] && [ "${#loads[@]}" -eq 0 ]; then
        echo "gpu_check.sh install: no load under $LOADS (carry .whl/load1, made by scripts/gpu_wheels.sh)" >&2
        return 1
    fi
    for dir in "${loads[@]}"; do
        install_load "$dir" || { echo "gpu_check.sh: installing $dir failed" >&2; return 1; }
        manifest="$dir/LOADS.txt"
    done
    "$PYTHON" scripts/gpu_site.py register "$TARGET" || return 1
    [ "$MODE" = run ] || return 0
    if [ -z "$manifest" ]; then
        manifest="$(ls "$TARGET/$MARKERS"/* 2>/dev/null | head -n 1)"
    fi
    if [ -z "$manifest" ]; then
        echo "gpu_check.sh run: nothing installed in $TARGET and no load under $LOADS" >&2
        return 1
    fi
    local name
    for name in $(cut -d' ' -f1 "$manifest" | sort -u); do
        [ -f "$TARGET/$MARKERS/$name" ] || missing+=("$name")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "gpu_check.sh run: ${missing[*]} neither installed in $TARGET nor carried: a" \
            "machine given back between the calls loses what the earlier ones installed;" \
            "make the install calls again, each within the machine's warm time after the one" \
            "before, then this one" >&2
        return 3
    fi
}

# --- offline: the parts ---------------------------------------------------------------

has_gpu() {
    [ "$DRY_RUN" != 1 ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}

offline_part() {  # offline_part KEY cpu|gpu NAME COMMAND...: run it, or say why not
    local key="$1" needs="$2" name="$3"
    shift 3
    if [ -n "${PARTS:-}" ] && [[ " $PARTS " != *" $key "* ]]; then
        skip_part "$name" "not in PARTS ($PARTS)"
    elif [ "$needs" = gpu ] && [ -n "$NO_GPU" ]; then
        skip_part "$name" "no GPU ($NO_GPU)"
    else
        run_part_within "$(limit_of "$key")" "$name" "$@"
    fi
}

offline_check() {
    export PYTHONPATH="$ROOT:$TARGET${PYTHONPATH:+:$PYTHONPATH}"
    export LD_LIBRARY_PATH="$TARGET/cuquantum/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # jax on the CPU: a jax on the GPU takes 75% of its memory per process (xdist workers);
    # one thread per worker for numba, OpenMP and torch, the workers filling the cores.
    export JAX_PLATFORMS=cpu XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
    local workers=() single_threads=()
    if "$PYTHON" -c 'import xdist' >/dev/null 2>&1; then
        workers=(-n "$(nproc)")
        single_threads=(env OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 MKL_NUM_THREADS=1)
    fi
    NO_GPU=""
    if [ "$DRY_RUN" = 1 ]; then
        NO_GPU="DRY_RUN=1"
    elif ! has_gpu; then
        NO_GPU="nvidia-smi sees none"
    fi
    local results="${OUT:-}"
    if [ -n "$results" ]; then
        mkdir -p "$results"
        PARTS_LOG="$results/parts.log" PARTS_SUMMARY="$results/summary.txt"
        : > "$PARTS_LOG"
        : > "$PARTS_SUMMARY"
    fi
    local suite
    suite="$("$PYTHON" -c 'import pennylane.devices.tests as t, os; print(os.path.dirname(t.__file__))')" || {
        echo "gpu_check.sh: cannot locate PennyLane's device test suite" >&2
        return 1
    }
    local pytest=("${single_threads[@]}" "$PYTHON" -m pytest -q -p no:cacheprovider --no-flaky-report)
    local on_gpu=(--device=custatevec.qubit --device-kwargs backend=custatevec)
    local bench_out="${results:-benchmarks/results}/gpu_bench.md" report=(report --strict)
    if [ -n "$NO_GPU" ] && [ -z "$results" ]; then
        bench_out="${TMPDIR:-/tmp}/gpu_bench-dry-run.md"  # not over the committed results
    fi
    if [ -n "$NO_GPU" ]; then
        report=(report)  # without a GPU the bindings are reported, not required
    fi

    if [ -n "$NO_GPU" ]; then
        echo "==> no GPU: $NO_GPU"
    else
        nvidia-smi 2>&1 | tee -a "${PARTS_LOG:-/dev/null}"
    fi
    offline_part environment cpu "environment" "$PYTHON" scripts/gpu_site.py "${report[@]}"
    offline_part bindings cpu "live binding check (real cuquantum)" \
        "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_custatevec_double.py -k installed_binding
    local key
    local -A limited
    for key in contract tests suite suite_shots; do
        limited[$key]="$(pytest_limits "$key")"
    done
    # one process: ~700 short tests, less than the workers' start (imports) would cost
    # shellcheck disable=SC2086 # limited[...]: options split on purpose
    offline_part contract gpu "backend contract (real library)" \
        "${pytest[@]}" ${limited[contract]} tests/test_backend_contract.py -k gpu
    # shellcheck disable=SC2086
    offline_part tests gpu "project tests (custatevec backend)" \
        env PLCSV_TEST_BACKEND=custatevec "${pytest[@]}" "${workers[@]}" ${limited[tests]} tests
    # shellcheck disable=SC2086
    offline_part suite gpu "PennyLane device suite (analytic, backend=custatevec)" \
        "${pytest[@]}" "${workers[@]}" ${limited[suite]} "$suite" "${on_gpu[@]}"
    # shellcheck disable=SC2086
    offline_part suite_shots gpu "PennyLane device suite (shots=20000, backend=custatevec)" \
        "${pytest[@]}" "${workers[@]}" ${limited[suite_shots]} "$suite" "${on_gpu[@]}" \
        --shots=20000
    local bench_mode=()
    if [ -n "$NO_GPU" ]; then
        bench_mode=(--dry-run)
    elif [ "$QUICK" = 1 ]; then
        bench_mode=(--quick)
    fi
    offline_part benchmark cpu "GPU benchmark (${bench_mode[*]:-full})" \
        "$PYTHON" benchmarks/gpu_bench.py "${bench_mode[@]}" --out "$bench_out"

    if [ -n "$results" ]; then
        print_summary | tee "$results/summary.txt"
        return "${PIPESTATUS[0]}"
    fi
    print_summary
}

# --- connected: a venv from the registry ------------------------------------------------

connected_install() {
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

connected_check() {
    CUDA="${CUDA:-12}"
    VENV="${VENV:-$ROOT/.venv-gpu}"
    TORCH_REQUIREMENT="${TORCH_REQUIREMENT:-torch}"
    read -r -a BENCH_EXTRA <<< "${BENCH_ARGS:-}"
    PY="$VENV/bin/python"
    if [ "$CUDA" != 12 ] && [ "$CUDA" != 13 ]; then
        echo "gpu_check.sh: CUDA=$CUDA; use CUDA=12 or CUDA=13 (the driver's CUDA major version)" >&2
        return 1
    fi
    PIP_SOURCE=()
    if [ -n "${WHEELS:-}" ]; then
        PIP_SOURCE=(--no-index --find-links "$WHEELS")
    fi
    if ! connected_install; then
        echo "gpu_check.sh: installing the project failed (see above)" >&2
        return 1
    fi
    echo
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi
    else
        echo "==> nvidia-smi not found"
    fi
    echo "==> cuStateVec backend: $("$PY" -c 'from pennylane_custatevec.backends import custatevec as c
print(c.unavailable_reason() or "usable")')"
    local suite
    suite="$("$PY" -c 'import pennylane.devices.tests as t, os; print(os.path.dirname(t.__file__))')" || {
        echo "gpu_check.sh: cannot locate PennyLane's device test suite" >&2
        return 1
    }
    run_part "project tests (custatevec backend)" \
        env PLCSV_TEST_BACKEND=custatevec "$PY" -m pytest tests -n 2 -q --no-flaky-report
    run_part "PennyLane device suite (analytic, backend=custatevec)" \
        "$PY" -m pytest "$suite" --device=custatevec.qubit --device-kwargs backend=custatevec \
        -q -p no:cacheprovider -n 2 --no-flaky-report
    run_part "PennyLane device suite (shots=20000, backend=custatevec)" \
        "$PY" -m pytest "$suite" --device=custatevec.qubit --device-kwargs backend=custatevec \
        --shots=20000 -q -p no:cacheprovider -n 2 --no-flaky-report
    run_part "benchmarks (custatevec, lightning.gpu if installed)" \
        "$PY" benchmarks/run_workloads.py --backend custatevec \
        --out benchmarks/results/workloads-gpu.md \
        --plot benchmarks/results/plots/deferred_vs_eager-gpu.png "${BENCH_EXTRA[@]}"
    run_part "GPU benchmark" "$PY" benchmarks/gpu_bench.py --out benchmarks/results/gpu_bench.md
    print_summary
}

# shellcheck source=scripts/parts.sh
source "$ROOT/scripts/parts.sh"

case "$MODE" in
    install | run)
        TARGET="${TARGET:-/tmp/site}"
        LOADS="${LOADS:-.whl}"
        stage_loads || exit $?
        if [ "$MODE" = install ]; then
            echo "==> installed into $TARGET; the next call: the next load, or run"
            exit 0
        fi
        offline_check
        ;;
    connected)
        connected_check
        ;;
    *)
        echo "gpu_check.sh: unknown mode '$MODE'; use install, run, or none (connected)" >&2
        exit 2
        ;;
esac
