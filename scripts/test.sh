#!/usr/bin/env bash
# The test suite: set up (scripts/setup.sh), then pytest. Extra arguments go to pytest.
# The Slurm tests start a real local cluster (scripts/local-slurm.sh) and need root; under
# CI=true they fail, not skip, when it cannot start. --durations: the 30 slowest tests, to keep
# CI within its time budget. One process: in two (pytest-xdist) the suite took 27 min 38 s
# instead of 33 min 48 s, but a timing test (tests/test_waterfall.py) shared the 2 cores and
# failed (docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
exec python -m pytest -ra --durations=30 "$@"
