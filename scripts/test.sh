#!/usr/bin/env bash
# The test suite: set up (scripts/setup.sh), then pytest. Extra arguments go to pytest.
# The Slurm tests start a real local cluster (scripts/local-slurm.sh) and need root; under
# CI=true they fail, not skip, when it cannot start. -n 2: two test processes (pytest-xdist;
# the Slurm tests all in one of them, tests/conftest.py), `-n 0` for one, a later -n wins.
# --durations: the 30 slowest tests, to keep CI within its time budget.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
exec python -m pytest -ra --durations=30 -n 2 "$@"
