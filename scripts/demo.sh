#!/usr/bin/env bash
# The main job: the CPU demo study end to end (data -> 9 training runs -> results/csv), on
# this machine. Extra arguments go to snakemake, e.g. `--config dataset=synthetic` (offline).
set -euo pipefail
cd "$(dirname "$0")/.."
SCALESTUDY_SKIP_APT=1 bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
exec snakemake --configfile config/demo.yaml "$@"
