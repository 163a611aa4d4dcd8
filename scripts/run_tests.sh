#!/usr/bin/env bash
# Check the style (ruff check, ruff format --check), run the project's tests (the demos
# included, at reduced size), the MPI tests under mpiexec, then PennyLane's shipped device test suite against
# custatevec.qubit (analytic, then with shots), then build the documentation with warnings as errors. Every part runs; the script exits non-zero if any
# part failed. Expects .venv from scripts/setup_env.sh.
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

# shellcheck source=scripts/parts.sh
source "$ROOT/scripts/parts.sh"

run_part "style (ruff check)" "$ROOT/.venv/bin/ruff" check .
run_part "style (ruff format --check)" "$ROOT/.venv/bin/ruff" format --check .
# --timeout: a test running past 20 minutes (none takes a tenth of that) is a hang: its
# threads' stacks are dumped and its worker ends, so the run reports it and goes on
HANG=(--timeout=1200 --timeout-method=thread)
run_part "project tests" "$PY" -m pytest tests -n 2 -q --no-flaky-report "${HANG[@]}"
# mpi=True: the distributed backend's contract and the split device against default.qubit
# and the one-process device, on 2 and 4 ranks (4 oversubscribe the 2 cores; there only
# over the CPU backend). mpiexec as root needs the OMPI_ALLOW_RUN_AS_ROOT pair.
MPI_RUN=(env CUSTATEVEC_TEST_MPI=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    "$ROOT/.venv/bin/mpiexec" --oversubscribe)
MPI_TESTS=(-m pytest tests/mpi tests/backends/test_backend_contract.py -q -p no:cacheprovider --no-flaky-report)
run_part_within 1500 "MPI tests (mpiexec -n 2)" "${MPI_RUN[@]}" -n 2 "$PY" "${MPI_TESTS[@]}"
run_part_within 1500 "MPI tests (mpiexec -n 4)" "${MPI_RUN[@]}" -n 4 "$PY" "${MPI_TESTS[@]}" \
    -k "not mpi-double"
# PennyLane's device suite with every device split over the ranks (tests/mpi/suite_plugin.py)
SPLIT_SUITE=(-m pytest "$SUITE" --device=custatevec.qubit -p suite_plugin -q -p no:cacheprovider
    --no-flaky-report)
run_part_within 900 "PennyLane device suite under MPI (mpiexec -n 2, analytic)" \
    env PYTHONPATH="$ROOT/tests/mpi" "${MPI_RUN[@]}" -n 2 "$PY" "${SPLIT_SUITE[@]}"
run_part_within 900 "PennyLane device suite under MPI (mpiexec -n 4, shots=20000)" \
    env PYTHONPATH="$ROOT/tests/mpi" "${MPI_RUN[@]}" -n 4 "$PY" "${SPLIT_SUITE[@]}" --shots=20000
run_part "PennyLane device suite (analytic)" \
    "$PY" -m pytest "$SUITE" --device=custatevec.qubit -q -p no:cacheprovider -n 2 --no-flaky-report \
    "${HANG[@]}"
run_part "PennyLane device suite (shots=20000)" \
    "$PY" -m pytest "$SUITE" --device=custatevec.qubit --shots=20000 -q -p no:cacheprovider -n 2 --no-flaky-report \
    "${HANG[@]}"
run_part "documentation (sphinx -W)" env PY="$PY" bash "$ROOT/scripts/build_docs.sh"

print_summary
