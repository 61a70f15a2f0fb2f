"""Per-job overhead of a finished study: what a training job costs beyond its training loop.

For each run: Snakemake's job wall time (benchmarks/train/<run>.tsv, column `s`, measured by
Snakemake around the job's shell command, on the node for Slurm jobs) minus the trainer's own
train_time_s (results/csv/runs.csv). The difference is process start-up, torch import, data
loading, process-group set-up, the exposed-communication probe and writing outputs; Slurm queueing
and submission are not in it (see docs/benchmarks.md for the end-to-end comparison).

    python benchmarks/overhead.py [WORKDIR]
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path


def main() -> int:
    work = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    runs_csv = work / "results/csv/runs.csv"
    if not runs_csv.exists():
        sys.exit(f"missing {runs_csv}: run the study first (bash scripts/demo.sh)")
    with runs_csv.open() as f:
        runs = list(csv.DictReader(f))
    rows = []
    for r in runs:
        bench = work / "benchmarks/train" / f"{r['run']}.tsv"
        with bench.open() as f:
            job_s = float(next(csv.DictReader(f, delimiter="\t"))["s"])
        rows.append((r["run"], job_s, float(r["train_time_s"]), job_s - float(r["train_time_s"])))
    print(f"{'run':32} {'job_s':>8} {'train_s':>8} {'overhead_s':>10}")
    for run, job_s, train_s, over in rows:
        print(f"{run:32} {job_s:8.1f} {train_s:8.1f} {over:10.1f}")
    overheads = [o for *_, o in rows]
    print(
        f"overhead per job: median {statistics.median(overheads):.1f} s, "
        f"min {min(overheads):.1f} s, max {max(overheads):.1f} s over {len(rows)} jobs"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
