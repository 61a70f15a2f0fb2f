#!/usr/bin/env bash
# The main job: the CPU demo study end to end (data -> 6 training runs -> results/csv ->
# analysis, figures, reports/study.md, paper.tex, paper.pdf, the proposal and slides ->
# report.html), on this machine.
# Extra arguments go to snakemake, e.g. `--config dataset=synthetic` (offline).
set -euo pipefail
cd "$(dirname "$0")/.."
# the venv, and as root TeX for reports/paper.pdf (not the Slurm packages: the demo needs none)
SCALESTUDY_SKIP_SLURM_APT=1 bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
snakemake --configfile config/demo.yaml "$@"
# the self-contained HTML report of the run (figures, tables, documents); not after a call that
# runs nothing: a dry-run (-n, also in a cluster of short flags such as -np), --lint, --unlock
runs_nothing=0
for arg in "$@"; do
    if [[ "$arg" =~ ^-[A-Za-z]*n[A-Za-z]*$ || "$arg" =~ ^--(dry-?run|lint|unlock|list)(=|$) ]]; then
        runs_nothing=1
    fi
done
if [[ $runs_nothing == 0 ]]; then
    snakemake --configfile config/demo.yaml "$@" --report report.html
    if [[ -f reports/paper.pdf ]]; then
        echo "demo: done: reports/study.md, reports/paper.pdf, report.html, results/plots/"
    else
        echo "demo: done, without reports/paper.pdf (latexmk is not installed): run" \
             "\`sudo apt-get install --no-install-recommends latexmk texlive-latex-base" \
             "texlive-latex-recommended texlive-fonts-recommended lmodern texlive-pictures\` (~40 s), then" \
             "bash scripts/demo.sh again (only the PDF is built)"
    fi
fi
