#!/usr/bin/env bash
# The test suite: set up (scripts/setup.sh), then pytest. Extra arguments go to pytest.
# The Slurm tests start a real local cluster (scripts/local-slurm.sh) and need root; under
# CI=true they fail, not skip, when it cannot start. --durations: the 30 slowest tests, to keep
# CI within its time budget.
# Two passes: every test but the `serial` ones in SCALESTUDY_TEST_PROCESSES processes (default
# 2, pytest-xdist; tests/conftest.py hands each a whole file, and all of tests/slurm/ to one),
# then the `serial` ones alone: they assert on the wall-clock parts of a real run, which the
# other process's tests would distort (docs/benchmarks.md: in two processes with them the
# suite once lost test_a_throttled_input_lands_in_data_wait to the shared cores).
# SCALESTUDY_TEST_PROCESSES=0 (or -n 0): one pass, in this process.
set -euo pipefail
# a test path of the caller's (`bash ../scripts/test.sh test_plan.py` in tests/, a node id
# `test_plan.py::test_x` too) is read from their directory, as demo.sh reads its config files:
# pytest, started in the repository root, found no such file (exit 4). A test file (*.py), or a
# directory not given as an option's value: `-m workflow` and `-k slurm` name a marker and
# words, though workflow/ and tests/slurm/ exist
caller_args=() prev=""
for arg in "$@"; do
    path=${arg%%::*}
    if [[ $arg != -* && $arg != /* && -e "$PWD/$path" ]] &&
        [[ $path == *.py || ($prev != -* && -d "$PWD/$path") ]]; then
        arg="$PWD/$arg"
    fi
    caller_args+=("$arg")
    prev=$arg
done
set -- ${caller_args[@]+"${caller_args[@]}"}
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
processes=${SCALESTUDY_TEST_PROCESSES:-2}
whole_args=("$@")
# a marker expression of the caller's (-m EXPR) joins each pass's own; a number of processes
# (-n N) is the first pass's (the serial pass stays in one)
args=() marks=""
while (($#)); do
    case $1 in
        -m) marks=${2:?-m needs an expression}; shift 2 ;;
        -m*) marks=${1#-m}; shift ;;
        -n | --numprocesses) processes=${2:?$1 needs a number}; shift 2 ;;
        -n?*) processes=${1#-n}; shift ;;
        --numprocesses=*) processes=${1#*=}; shift ;;
        *) args+=("$1"); shift ;;
    esac
done
if [[ ! $processes =~ ^[0-9]+$ ]]; then
    echo "scripts/test.sh: $processes processes is not a whole number" \
        "(SCALESTUDY_TEST_PROCESSES or -n; 0: one pass in this process; 2: the default)" >&2
    exit 2
fi
if ((processes == 0)); then
    exec python -m pytest -ra --durations=30 "${whole_args[@]}"
fi
both() { [[ -n $marks ]] && echo "($marks) and $1" || echo "$1"; }
# pytest exits 5 when a pass selects no test (arguments naming only serial tests, or none):
# that pass then did its part
status=0
python -m pytest -ra --durations=30 -n "$processes" -m "$(both "not serial")" "${args[@]}" ||
    status=$?
first=$status
# 2 interrupted (Ctrl-C), 3 an internal error, 4 a usage error: no second pass
if ((first >= 2 && first <= 4)); then
    exit "$first"
fi
status=0
python -m pytest -ra --durations=5 -m "$(both serial)" "${args[@]}" || status=$?
second=$status
if ((first == 5 && second == 5)); then
    exit 5
fi
for rc in "$first" "$second"; do
    if ((rc != 0 && rc != 5)); then
        exit "$rc"
    fi
done
