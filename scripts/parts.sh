# Helpers for scripts that run several test parts and print one summary (sourced, not run).
# run_part NAME COMMAND... runs every part, tees its output, and records its exit code and
# closing line; print_summary prints one line per part and the totals, and returns non-zero
# if any part failed.

PARTS_LOGDIR="$(mktemp -d)"
trap 'rm -rf "$PARTS_LOGDIR"' EXIT

names=()
codes=()
summaries=()

run_part() {
    local name="$1"
    shift
    local log="$PARTS_LOGDIR/part${#names[@]}.log"
    echo
    echo "==> $name: $*"
    "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    # pytest's closing line, e.g. "398 passed, 52 skipped, 9 xfailed in 120.30s"; for other
    # commands, their last line
    local line
    line="$(grep -E '^=*[ ]*[0-9]+ (passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?)' "$log" \
        | grep -E ' in [0-9.]+s' | tail -n 1 | sed -E 's/^=+ //; s/ =+$//')"
    if [ -z "$line" ]; then
        line="$(grep -v '^[[:space:]]*$' "$log" | tail -n 1)"
    fi
    # Exit code 5 (no tests collected) counts as a failure too.
    names+=("$name")
    codes+=("$rc")
    summaries+=("${line:-no output}")
}

count() {  # count WORD "SUMMARY" -> the number before WORD (0 if absent)
    local n
    n="$(printf '%s\n' "$2" | grep -oE "[0-9]+ $1" | head -n 1 | cut -d' ' -f1)"
    echo "${n:-0}"
}

print_summary() {
    echo
    echo "==> summary"
    local failed=0 total_passed=0 total_failed=0 total_skipped=0 status i
    for i in "${!names[@]}"; do
        if [ "${codes[$i]}" -eq 0 ]; then
            status="ok"
        else
            status="FAILED (exit code ${codes[$i]})"
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
    return "$failed"
}
