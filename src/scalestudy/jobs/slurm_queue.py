"""Slurm jobs an earlier snakemake run left in the queue: refused before a second run submits.

Under `--executor slurm` each job is a Slurm job that outlives the snakemake process which
submitted it. When that process dies (a closed terminal or lost ssh on the login node, a login
node reboot, kill), its jobs go on queuing and training, and the workflow stays locked; after
`snakemake --unlock` the next run finds their outputs incomplete (`rerun-incomplete: true`,
profiles/default), deletes them and submits the same runs again: two jobs training one run into
the same results/runs/{run}/ and resuming the same checkpoints, each overwriting the other's.

The Snakefile's onstart (Slurm executor only: the local executor's jobs die with it) asks
squeue for this user's queued and running jobs and refuses while one of them is a
Snakemake job of this working directory: snakemake-executor-plugin-slurm (2.x) submits every
job with `--comment rule_<rule>` or `rule_<rule>_wildcards_<wildcards>` and `-D <workdir>`
(its submit_string.get_submit_command). onstart runs after the DAG is built and before any job
is submitted or any output deleted; dry-runs never reach it, so planning still works.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

# %i job id, %T state (long form), %Z working directory, %k comment. Fields are split at the
# ASCII unit separator, which no path or comment holds; the comment is last and may hold it.
SEP = "\x1f"
FORMAT = SEP.join(["%i", "%T", "%Z", "%k"])


def squeue_command(uid: int | None = None) -> list[str]:
    """squeue for this user's jobs: --user with the uid (squeue takes names or ids), not --me,
    which Slurm before 20.11 does not know; --all, for those in hidden partitions too (squeue
    leaves them out: a profile's partition that is Hidden=YES hid the earlier run's jobs)."""
    return [
        "squeue",
        f"--user={os.getuid() if uid is None else uid}",
        "--all",
        "--noheader",
        "--format",
        FORMAT,
    ]


SQUEUE_TIMEOUT_S = 120  # squeue retries an unreachable controller for up to 60 s first
# `squeue` without --states lists pending, running, suspended and completing jobs only; with
# a long MinJobAge a finished job may still be listed under one of these (squeue -t all).
FINISHED = frozenset(
    ["BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL"]
    + ["OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT"]
)
COMMENT_PREFIX = "rule_"  # the plugin's --comment; the wildcards follow WILDCARDS
WILDCARDS = "_wildcards_"
SHOWN = 5  # jobs named in the refusal; the rest are counted


@dataclass(frozen=True)
class QueuedJob:
    job_id: str
    state: str
    workdir: str
    comment: str

    @property
    def what(self) -> str:
        """The Snakemake job it runs, from the comment: 'train w2_lb32_fp32_ddp_bk25_r0' (the
        plugin writes the wildcards' values joined by _)."""
        rule, _, wildcards = self.comment.removeprefix(COMMENT_PREFIX).partition(WILDCARDS)
        return f"{rule} {wildcards}" if wildcards else rule


def parse_squeue(text: str) -> list[QueuedJob]:
    """The jobs of `squeue --format FORMAT --noheader` output; a line without four fields is
    not a job (squeue prints nothing else with --noheader)."""
    jobs = []
    for line in text.splitlines():
        fields = line.split(SEP, 3)
        if len(fields) == 4:
            jobs.append(QueuedJob(*(f.strip() for f in fields)))
    return jobs


def earlier_run_jobs(
    jobs: list[QueuedJob], workdir: str, own_job_id: str | None = None
) -> list[QueuedJob]:
    """The unfinished Snakemake jobs (by the plugin's comment) whose working directory is
    `workdir` (both resolved: a symlinked home and its real path are one directory), not the
    job this snakemake runs in (`own_job_id`: a workflow started inside an allocation)."""
    here = os.path.realpath(workdir)
    return [
        job
        for job in jobs
        if job.comment.startswith(COMMENT_PREFIX)
        and job.state not in FINISHED
        and job.job_id != own_job_id
        and os.path.realpath(job.workdir) == here
    ]


def refusal_line(jobs: list[QueuedJob], workdir: str) -> str:
    """One line: which jobs, why a run now is refused, the commands that end the wait."""
    shown = ", ".join(f"{j.job_id} ({j.what}, {j.state})" for j in jobs[:SHOWN])
    more = f" and {len(jobs) - SHOWN} more" if len(jobs) > SHOWN else ""
    one = len(jobs) == 1
    noun, verb, them = ("job", "is", "it") if one else ("jobs", "are", "them")
    ids = " ".join(j.job_id for j in jobs)
    return (
        f"{len(jobs)} Slurm {noun} of an earlier snakemake run in {workdir} {verb} still "
        f"queued or running: {shown}{more}. A run started now would submit {them} again, into "
        "the same results and checkpoint directories. Wait until `squeue -u $USER --all` no "
        f"longer lists {them}, or cancel {them} (`scancel {ids}`), then run snakemake again."
    )


def refusal(workdir: str, env: Mapping[str, str]) -> str:
    """The Snakefile's onstart under the Slurm executor: one line when an earlier run's jobs of
    `workdir` are still in the queue, or when squeue cannot say (the executor, which needs
    squeue or sacct for every job's status, could not follow its jobs either); else ""."""
    argv = squeue_command()
    # as bash takes it back: the format's separator written $'\x1f' (invisible, as it is)
    shown_format = FORMAT.replace(SEP, "\\x1f")
    command = f"{shlex.join(argv[:-1])} $'{shown_format}'"
    unchecked = "the jobs an earlier run may have left queued cannot be checked"
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=SQUEUE_TIMEOUT_S,
            env=dict(env),
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        return (
            "`squeue` is not on PATH: run snakemake with --executor slurm (or "
            "--profile profiles/slurm) on a node that submits Slurm jobs"
        )
    except OSError as exc:  # not executable, or the environment too large to start it
        return f"`{command}` could not start ({exc}): {unchecked}"
    except subprocess.TimeoutExpired:
        return (
            f"`{command}` gave no answer in {SQUEUE_TIMEOUT_S} s: {unchecked}. Run snakemake "
            "again when squeue answers."
        )
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout or "").strip().splitlines()
        last = said[-1] if said else "no output"
        # squeue without a Slurm configuration here (slurm.conf, or configless DNS): no outage
        fix = (
            "Run snakemake with --executor slurm on a node that submits Slurm jobs"
            if "configuration" in last
            else "Run snakemake again when squeue answers"
        )
        return f"`{command}` failed (exit {proc.returncode}: {last}): {unchecked}. {fix}."
    jobs = earlier_run_jobs(parse_squeue(proc.stdout), workdir, env.get("SLURM_JOB_ID"))
    return refusal_line(jobs, workdir) if jobs else ""
