#!/usr/bin/env bash
# The main job: the CPU demo study end to end (data -> 8 training runs -> results/csv ->
# analysis, figures, reports/study.md, paper.tex, paper.pdf -> report.html), on this machine.
# Extra arguments go to snakemake, e.g. `--config dataset=synthetic` (offline).
set -euo pipefail
cd "$(dirname "$0")/.."
SCALESTUDY_SKIP_APT=1 bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
snakemake --configfile config/demo.yaml "$@"
# the self-contained HTML report of the run (figures, tables, documents); not after a dry-run
if [[ ! " $* " =~ \ (-n|--dry-run|--dryrun)\  ]]; then
    snakemake --configfile config/demo.yaml "$@" --report report.html
fi
