#!/usr/bin/env bash
# Lint: ruff, snakefmt, and `snakemake --lint`. One Snakemake lint is accepted by design and
# only that one: "Specify a conda environment or container for each rule". The software of every
# rule is the pinned .venv (requirements.txt) or, with container.enabled, the Apptainer image,
# which training takes as an explicit input so that a rebuilt image marks training stale;
# Snakemake's `container:` directive hashes only the image URL and cannot express that
# (docs/design.md). Any other lint fails.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
# Lint this checkout's workflow with this checkout's package (src/ first on sys.path), installed
# or not: a clean clone lints, and Snakemake finds the logger plugin the profile names (it looks
# for top-level modules snakemake_logger_plugin_* on sys.path).
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
# a fresh clone before setup: one line with the fix, not bash's "ruff: command not found"
for tool in ruff snakefmt snakemake; do
    if ! command -v "$tool" >/dev/null; then
        echo "lint: $tool is not installed here (no .venv): run \`bash scripts/setup.sh\` first" >&2
        exit 1
    fi
done
ruff check .
ruff format --check .
snakefmt --check workflow/Snakefile workflow/rules/*.smk
rc=0
out=$(snakemake --lint --configfile config/demo.yaml 2>&1) || rc=$?
echo "$out"
# exit 1 means "lints found" only when it printed lints; anything else is snakemake failing
if ((rc != 0)) && ! { ((rc == 1)) && grep -q '^Lints for rule' <<<"$out"; }; then
    echo "lint: snakemake --lint did not run (exit $rc)" >&2
    exit 1
fi
other=$(grep -E '^\s+\* ' <<<"$out" | grep -v 'Specify a conda environment or container' || true)
if [[ -n "$other" ]]; then
    echo "lint: snakemake --lint found:" >&2
    echo "$other" >&2
    exit 1
fi
echo "lint: clean (accepted: the conda/container lint, see scripts/lint.sh)"
