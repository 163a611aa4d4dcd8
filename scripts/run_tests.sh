#!/usr/bin/env bash
# Run the project's tests, then PennyLane's shipped device test suite against
# custatevec.qubit (analytic, then with shots). Every part runs; the script exits non-zero
# if any part failed. Expects .venv from scripts/setup_env.sh.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PY="$ROOT/.venv/bin/python"
if [ ! -x "$PY" ]; then
    echo "run_tests.sh: $PY not found; run 'bash scripts/setup_env.sh' first" >&2
    exit 1
fi

SUITE="$("$PY" -c 'import pennylane.devices.tests as t, os; print(os.path.dirname(t.__file__))')" || {
    echo "run_tests.sh: cannot locate PennyLane's device test suite" >&2
    exit 1
}

LOGDIR="$(mktemp -d)"
trap 'rm -rf "$LOGDIR"' EXIT

names=()
codes=()
summaries=()

run_part() {
    local name="$1"
    shift
    local log="$LOGDIR/part${#names[@]}.log"
    echo
    echo "==> $name: $*"
    "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    # pytest's closing line, e.g. "398 passed, 52 skipped, 9 xfailed in 120.30s"
    local line
    line="$(grep -E '^=*[ ]*[0-9]+ (passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?)' "$log" \
        | grep -E ' in [0-9.]+s' | tail -n 1 | sed -E 's/^=+ //; s/ =+$//')"
    # Exit code 5 (no tests collected) counts as a failure too.
    names+=("$name")
    codes+=("$rc")
    summaries+=("${line:-no pytest summary line}")
}

count() {  # count WORD "SUMMARY" -> the number before WORD (0 if absent)
    local n
    n="$(printf '%s\n' "$2" | grep -oE "[0-9]+ $1" | head -n 1 | cut -d' ' -f1)"
    echo "${n:-0}"
}

run_part "project tests" "$PY" -m pytest tests -n 2 -q --no-flaky-report
run_part "PennyLane device suite (analytic)" \
    "$PY" -m pytest "$SUITE" --device=custatevec.qubit -q -p no:cacheprovider -n 2 --no-flaky-report
run_part "PennyLane device suite (shots=20000)" \
    "$PY" -m pytest "$SUITE" --device=custatevec.qubit --shots=20000 -q -p no:cacheprovider -n 2 --no-flaky-report

echo
echo "==> summary"
failed=0
total_passed=0
total_failed=0
total_skipped=0
for i in "${!names[@]}"; do
    if [ "${codes[$i]}" -eq 0 ]; then
        status="ok"
    else
        status="FAILED (pytest exit code ${codes[$i]})"
        failed=1
    fi
    echo "  ${names[$i]}: $status; ${summaries[$i]}"
    total_passed=$((total_passed + $(count passed "${summaries[$i]}")))
    total_failed=$((total_failed + $(count failed "${summaries[$i]}") + $(count errors? "${summaries[$i]}")))
    total_skipped=$((total_skipped + $(count skipped "${summaries[$i]}")))
done
if [ "$failed" -ne 0 ] && [ "$total_failed" -eq 0 ]; then
    total_failed=1  # a part failed without failing tests (collection error, no tests, crash)
fi
echo "total: $total_passed passed, $total_failed failed, $total_skipped skipped"
exit "$failed"
