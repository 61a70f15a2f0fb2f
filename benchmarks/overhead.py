"""Per-job overhead of a finished study: what a training job costs beyond its training loop.

For each run: Snakemake's job wall time (benchmarks/train/<run>.tsv, column `s`, measured by
Snakemake around the job's shell command, on the node for Slurm jobs) minus the trainer's own
train_time_s (results/csv/runs.csv). The difference is process start-up, torch import, data
loading, process-group set-up, the exposed-communication probe and writing outputs; Slurm queueing
and submission are not in it (see docs/benchmarks.md for the end-to-end comparison).

    python benchmarks/overhead.py [WORKDIR]

A finished run without its benchmarks/train/<run>.tsv (deleted or never copied: the workflow
allows it, resources.optional_benchmarks) is left out, and the count of them said; so is a run
resumed from a checkpoint (restarts > 0): its train_time_s sums every segment, its .tsv holds
only the last attempt's wall time (as the plan's calibration, study/estimate.py, leaves it out).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from pathlib import Path


def job_seconds(bench: Path) -> float:
    """Snakemake's wall time of the job, column `s` of its first row; an empty or damaged file
    exits with one line naming it."""
    with bench.open() as f:
        row = next(csv.DictReader(f, delimiter="\t"), None)
    try:
        seconds = float((row or {})["s"])
    except (KeyError, TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        sys.exit(
            f"{bench}: not a Snakemake benchmark (no number in column s of its first row): "
            "delete it, or copy it again from the study"
        )
    return seconds


def main() -> int:
    p = argparse.ArgumentParser(prog="overhead.py", description=__doc__.splitlines()[0])
    p.add_argument(
        "workdir", nargs="?", default=".", metavar="WORKDIR", help="the study's folder (default .)"
    )
    work = Path(p.parse_args(sys.argv[1:]).workdir)
    runs_csv = work / "results/csv/runs.csv"
    if not runs_csv.exists():
        sys.exit(f"missing {runs_csv}: run the study first (bash scripts/demo.sh)")
    with runs_csv.open() as f:
        runs = list(csv.DictReader(f))
    timed = work / "benchmarks/train"
    rows, untimed, resumed = [], [], []
    for r in runs:
        bench = timed / f"{r['run']}.tsv"
        if float(r.get("restarts") or 0) > 0:  # job_s - train_time_s would be < 0 or too small
            resumed.append(r["run"])
            continue
        if not bench.exists():
            untimed.append(r["run"])
            continue
        job_s = job_seconds(bench)
        rows.append((r["run"], job_s, float(r["train_time_s"]), job_s - float(r["train_time_s"])))
    if not rows:
        why = f"none of its {len(runs)} runs has {timed}/<run>.tsv" if runs else "no runs yet"
        if resumed:
            why = (
                f"{len(resumed)} of its {len(runs)} runs were resumed from a checkpoint and "
                f"{len(untimed)} have no {timed}/<run>.tsv"
            )
        sys.exit(f"{runs_csv}: {why}: no job time to compare (bash scripts/demo.sh runs a study)")
    print(f"{'run':32} {'job_s':>8} {'train_s':>8} {'overhead_s':>10}")
    for run, job_s, train_s, over in rows:
        print(f"{run:32} {job_s:8.1f} {train_s:8.1f} {over:10.1f}")
    overheads = [o for *_, o in rows]
    print(
        f"overhead per job: median {statistics.median(overheads):.1f} s, "
        f"min {min(overheads):.1f} s, max {max(overheads):.1f} s over {len(rows)} jobs"
    )
    if untimed:
        print(f"{len(untimed)} of {len(runs)} runs left out, no {timed}/<run>.tsv: {untimed}")
    if resumed:
        print(
            f"{len(resumed)} of {len(runs)} runs left out, resumed from a checkpoint (their .tsv "
            f"is the last attempt's wall time, their train_time_s every attempt's): {resumed}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
