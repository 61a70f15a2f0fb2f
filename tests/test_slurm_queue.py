"""jobs/slurm_queue.py: an earlier snakemake run's Slurm jobs of this working directory, read
from squeue's output, refuse a second run (the real squeue: tests/slurm/test_jobs_slurm.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from scalestudy.jobs import slurm_queue as sq


def _line(job_id: str, state: str, workdir: str | Path, comment: str) -> str:
    return sq.SEP.join([job_id, state, str(workdir), comment])


def test_the_format_is_what_parse_reads_and_a_comment_may_hold_the_separator():
    assert sq.FORMAT == "%i\x1f%T\x1f%Z\x1f%k"
    text = "\n".join(
        [
            _line("17", "RUNNING", "/w", "rule_train_wildcards_w2-fp32"),
            _line("18", "PENDING", "/w", "a\x1fb"),
            "",
            "not a job",
        ]
    )
    assert sq.parse_squeue(text) == [
        sq.QueuedJob("17", "RUNNING", "/w", "rule_train_wildcards_w2-fp32"),
        sq.QueuedJob("18", "PENDING", "/w", "a\x1fb"),
    ]


def test_only_unfinished_snakemake_jobs_of_this_directory_other_than_our_own_count(tmp_path):
    work = tmp_path / "study"
    work.mkdir()
    (tmp_path / "link").symlink_to(work)
    jobs = [
        sq.QueuedJob("1", "RUNNING", str(work), "rule_train_wildcards_a"),
        sq.QueuedJob("2", "PENDING", str(tmp_path / "link"), "rule_profile_capture_wildcards_a"),
        sq.QueuedJob("3", "RUNNING", str(tmp_path / "other"), "rule_train_wildcards_a"),
        sq.QueuedJob("4", "RUNNING", str(work), "my own sbatch"),
        sq.QueuedJob("5", "COMPLETED", str(work), "rule_train_wildcards_b"),
        sq.QueuedJob("6", "RUNNING", str(work), "rule_collect"),
        sq.QueuedJob("7", "COMPLETING", str(work), "rule_train_wildcards_c"),
    ]
    found = sq.earlier_run_jobs(jobs, str(work), own_job_id="6")
    assert [j.job_id for j in found] == ["1", "2", "7"]
    assert [j.what for j in found] == ["train a", "profile_capture a", "train c"]
    assert sq.QueuedJob("6", "RUNNING", "/", "rule_collect").what == "collect"


def test_the_refusal_names_the_jobs_and_the_commands_that_end_the_wait():
    one = [sq.QueuedJob("41", "RUNNING", "/w", "rule_train_wildcards_w2")]
    line = sq.refusal_line(one, "/w")
    assert "\n" not in line
    assert line.startswith("1 Slurm job of an earlier snakemake run in /w is still queued")
    assert "41 (train w2, RUNNING)" in line
    assert "`scancel 41`" in line and "`squeue -u $USER --all`" in line
    many = [sq.QueuedJob(str(i), "PENDING", "/w", f"rule_train_wildcards_r{i}") for i in range(7)]
    line = sq.refusal_line(many, "/w")
    assert line.startswith("7 Slurm jobs of an earlier snakemake run in /w are still queued")
    assert "4 (train r4, PENDING) and 2 more." in line and "r5," not in line
    assert "`scancel 0 1 2 3 4 5 6`" in line


def _squeue_stand_in(directory: Path, script: str) -> dict[str, str]:
    """A stand-in `squeue` (a failing or a listing one) first on PATH."""
    path = directory / "squeue"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{directory}:{os.environ['PATH']}"}


def test_squeue_that_fails_or_is_missing_refuses_with_the_reason(tmp_path):
    env = _squeue_stand_in(
        tmp_path, "echo 'squeue: error: Unable to contact slurm controller' >&2\nexit 1\n"
    )
    line = sq.refusal(str(tmp_path), env)
    assert line.startswith(f"`squeue --user={os.getuid()} --all --noheader --format ")
    assert "failed (exit 1: squeue: error: Unable to contact slurm controller)" in line
    assert "\x1f" not in line  # the format's field separator: invisible, and no command
    missing = sq.refusal(str(tmp_path), {"PATH": str(tmp_path / "empty")})
    assert missing.startswith("`squeue` is not on PATH")
    # squeue installed on a host Slurm is not configured on: no outage to wait out
    env = _squeue_stand_in(
        tmp_path,
        "echo 'squeue: fatal: Could not establish a configuration source' >&2\nexit 1\n",
    )
    line = sq.refusal(str(tmp_path), env)
    assert "Could not establish a configuration source" in line
    assert "when squeue answers" not in line and "a node that submits Slurm jobs" in line


def test_the_listing_squeue_prints_is_judged_for_this_directory(tmp_path):
    listing = _line("9", "RUNNING", tmp_path, "rule_train_wildcards_w1")
    env = _squeue_stand_in(tmp_path, f"printf '%s\\n' '{listing}'\n")
    assert sq.refusal(str(tmp_path), env).startswith("1 Slurm job of an earlier")
    assert sq.refusal(str(tmp_path / "elsewhere"), env) == ""
    assert sq.refusal(str(tmp_path), {**env, "SLURM_JOB_ID": "9"}) == ""


def test_a_squeue_that_cannot_start_refuses_in_one_line(tmp_path):
    (tmp_path / "squeue").write_text("#!/bin/sh\n")  # not executable
    line = sq.refusal(str(tmp_path), {"PATH": str(tmp_path)})
    assert line.startswith("`squeue --user=") and "could not start" in line and "\n" not in line
