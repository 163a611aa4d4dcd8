# Helpers for scripts that run several test parts and print one summary (sourced, not run).
# run_part NAME COMMAND... runs every part, tees its output, and records its exit code,
# closing line and wall time; run_part_within SECONDS NAME COMMAND... does the same under `timeout`
# (0: no limit), a part stopped at its limit counting as failed ("TIMED OUT"); skip_part
# NAME REASON records a part that did not run; print_summary prints one line per part and
# the totals, and returns non-zero if any part failed.
#
# Optional, set before the first part: PARTS_LOG, a file that every part's output is
# appended to as it runs, and PARTS_SUMMARY, a file that each part's summary line is
# appended to when it ends; both survive a caller killed half-way.

PARTS_LOGDIR="$(mktemp -d)"
trap 'rm -rf "$PARTS_LOGDIR"' EXIT

names=()
codes=()
summaries=()

run_part() {
    run_part_within 0 "$@"
}

run_part_within() {
    local limit="$1" name="$2"
    shift 2
    local log="$PARTS_LOGDIR/part${#names[@]}.log"
    local timer=()
    if [ "$limit" -gt 0 ]; then
        timer=(timeout -k 10 "$limit")
    fi
    echo
    echo "==> $name: $*" | tee -a "${PARTS_LOG:-/dev/null}"
    local started=$SECONDS
    "${timer[@]}" "$@" 2>&1 | tee "$log" | tee -a "${PARTS_LOG:-/dev/null}"
    local rc=${PIPESTATUS[0]} took=$((SECONDS - started))
    # a line "SUMMARY: ..." that the command prints for itself; else pytest's closing line,
    # e.g. "398 passed, 52 skipped, 9 xfailed in 120.30s"; for other commands, their last line
    local line pytest_line
    line="$(grep '^SUMMARY: ' "$log" | tail -n 1 | sed 's/^SUMMARY: //')"
    pytest_line="$(grep -E '^=*[ ]*[0-9]+ (passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?)' "$log" \
        | grep -E ' in [0-9.]+s' | tail -n 1 | sed -E 's/^=+ //; s/ =+$//')"
    if [ -n "$line" ] && [ -n "$pytest_line" ]; then
        line="$line ($pytest_line)"
    fi
    line="${line:-$pytest_line}"
    if [ -z "$line" ]; then
        line="$(grep -v '^[[:space:]]*$' "$log" | tail -n 1)"
    fi
    if [ "$limit" -gt 0 ] && { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; }; then
        line="TIMED OUT after ${limit}s; last line: ${line:-none}"
    fi
    # Exit code 5 (no tests collected) counts as a failure too; the part's wall time last.
    record_part "$name" "$rc" "${line:-no output} [${took}s]"
}

skip_part() {  # skip_part NAME REASON: a part that did not run, not a failure
    echo
    echo "==> $1: skipped: $2" | tee -a "${PARTS_LOG:-/dev/null}"
    record_part "$1" skipped "skipped: $2"
}

record_part() {  # record_part NAME CODE SUMMARY
    names+=("$1")
    codes+=("$2")
    summaries+=("$3")
    if [ -n "${PARTS_SUMMARY:-}" ] && [ "$2" = skipped ]; then
        echo "$1: $3" >> "$PARTS_SUMMARY"  # "skipped: why"
    elif [ -n "${PARTS_SUMMARY:-}" ]; then
        echo "$1: $(part_status "$2"); $3" >> "$PARTS_SUMMARY"
    fi
}

part_status() {  # part_status CODE -> ok, skipped or FAILED (exit code CODE)
    case "$1" in
        0) echo ok ;;
        skipped) echo skipped ;;
        *) echo "FAILED (exit code $1)" ;;
    esac
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
        status="$(part_status "${codes[$i]}")"
        case "$status" in FAILED*) failed=1 ;; esac
        if [ "${codes[$i]}" = skipped ]; then
            echo "  ${names[$i]}: ${summaries[$i]}"
            continue
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
