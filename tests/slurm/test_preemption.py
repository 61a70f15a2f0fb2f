"""Preemption on the real local Slurm cluster: USR1 mid-run, checkpoint, retry, same results.

One 2-rank run (synthetic data, 4 epochs) goes through `snakemake --executor slurm` up to
results/csv/runs.csv (no profiling, analysis, plots or report). Once its first epoch is written,
the job gets `scancel --signal=USR1`: what `sbatch --signal=USR1@<lead>` sends before the time
limit, to the job steps (the ranks started by srun), not to the batch shell. Checkpoints are
taken only on a signal (every_epochs: 0), so a run that says restarts == 1 proves that the ranks
got USR1, agreed, saved, exited 75, and that Snakemake's retry resumed from that checkpoint.

The unsignalled reference is the trainer command the Slurm job ran (the `+ srun ... scalestudy
train ...` line `scalestudy launch` writes into the job's log), started again with
`scalestudy launch` outside Slurm (torchrun, same rank count) on the same prepared data, with only
--out and --checkpoint-dir pointing elsewhere: its epochs.csv (losses, accuracies, lr) must equal
the resumed run's, each epoch exactly once. (Its first run here differed from epoch 1 on, before
any signal: Snakemake's shell sets MKL_NUM_THREADS etc. to the rule's threads, all ranks' cores,
and MKL's results depend on its thread count; `scalestudy launch` now sizes every thread pool
to one rank's cores, tests/test_launch.py.)

Why an earlier version saw the retry with the signalled job's id: not Slurm. A job submitted with
--requeue is requeued only on a node failure, a preemption by Slurm or `scontrol requeue`, never
for a non-zero exit (no RequeueExit in slurm.conf; checked by hand: a --requeue job whose tasks
exit 75 on USR1 ends FAILED, Restarts=0). It was the executor's inner `snakemake --execute` in the
job: it honours a rule's `retries:` despite the `--retries 0` it is given
(snakemake-executor-plugin-slurm issue #284) and reran the trainer inside the same allocation,
the one whose time limit USR1 announces. get_train_retries (common.smk) now gives the rule its
retries in the main process only, so the signalled job ends FAILED (exit 1 of the inner
snakemake, Restarts=0) and the retry is a new job with a new id, both asserted below.
"""

from __future__ import annotations

import csv
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from workflow_helpers import BIN, copy_repo, env, write_config  # noqa: E402

pytestmark = pytest.mark.slurm

# 2 ranks: srun starts the ranks as the job step's tasks, so USR1 reaches them. A 1-rank job's
# step task is the executor's own `srun -n1` wrapper, which USR1 ends before the trainer can
# save (README: its retry resumes from the last periodic checkpoint instead); not tested here.
RUN = "w2_lb32_fp32_ddp_bk25_r0"
EPOCHS = 4
SAME = ("epoch", "train_loss", "train_acc", "val_loss", "val_acc", "lr")


def _config(work: Path) -> Path:
    cfg = yaml.safe_load((work / "config/demo.yaml").read_text())
    cfg["dataset"] = "synthetic"
    cfg["synthetic"] = {"num_train": 128, "num_test": 64}
    cfg["hardware"].update(gpus_per_node=2, mem_mb_per_rank=500, runtime_min=10)
    cfg["train"].update(
        epochs=EPOCHS, limit_train=128, limit_test=64, warmup_steps=1, comm_probe_steps=1
    )
    cfg["families"] = {
        "strong": {"enabled": False},
        "weak": {"enabled": True, "gpus": [2], "local_batch": 32},
        "precision": {"enabled": False},
        "bucket": {"enabled": False},
    }
    cfg["profiling"] = {"enabled": False}
    cfg["checkpointing"] = {"every_epochs": 0, "retries": 1, "signal_lead_s": 120}
    return write_config(work / "preempt.yaml", cfg)


def _epochs(out: Path) -> list[dict]:
    with (out / "epochs.csv").open() as f:
        return [{k: r[k] for k in SAME} for r in csv.DictReader(f)]


def _rows(path: Path) -> int:
    return len(path.read_text().splitlines()) - 1 if path.exists() else 0


def _trainer_args(log: Path) -> list[str]:
    """The `scalestudy train` arguments of the command `scalestudy launch` ran (its `+ ` line)."""
    for line in log.read_text().splitlines():
        if line.startswith("+ "):
            argv = shlex.split(line[2:])
            i = argv.index("scalestudy")
            assert argv[i - 1] == "-m" and argv[i + 1] == "train", argv
            return argv[i + 2 :]
    raise AssertionError(f"no launched command in {log}:\n{log.read_text()[-3000:]}")


def _replace(args: list[str], flag: str, value: str) -> list[str]:
    """args with `flag V` or `flag=V` set to value (present exactly once)."""
    hits = [i for i, a in enumerate(args) if a == flag or a.startswith(flag + "=")]
    assert len(hits) == 1, (flag, args)
    i = hits[0]
    if args[i] == flag:
        return [*args[:i], flag, value, *args[i + 2 :]]
    return [*args[:i], f"{flag}={value}", *args[i + 1 :]]


def _job_state(cluster, job: str) -> dict[str, str]:
    show = cluster.run(["scontrol", "show", "job", job]).stdout
    return dict(w.split("=", 1) for w in show.split() if "=" in w)


def test_usr1_mid_run_ends_with_the_unsignalled_results(slurm_cluster, tmp_path):
    cluster = slurm_cluster(2)
    work = copy_repo(tmp_path / "slurm")
    _config(work)
    # the target first: --configfile takes every word after it
    cmd = [str(BIN / "snakemake"), "results/csv/runs.csv", "--profile", "profiles/local-slurm"]
    cmd += ["--configfile", "preempt.yaml"]
    proc = subprocess.Popen(
        cmd,
        cwd=work,
        env=env(SLURM_CONF=cluster.env["SLURM_CONF"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out_dir = work / "results/runs" / RUN
    signalled = None  # the job id that got USR1
    deadline = time.monotonic() + 240
    try:
        while signalled is None and proc.poll() is None:
            assert time.monotonic() < deadline, "the run never reached epoch 1 on Slurm"
            queue = cluster.run(["squeue", "-h", "-t", "R", "-o", "%i|%k"]).stdout
            for line in queue.split():
                job, _, comment = line.partition("|")
                if RUN in comment and _rows(out_dir / "epochs.csv") >= 1:
                    # --requeue came through slurm_extra
                    assert _job_state(cluster, job)["Requeue"] == "1"
                    cluster.run(["scancel", "--signal=USR1", job])
                    signalled = job
            time.sleep(0.2)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-6000:]
    assert signalled is not None, f"the job was never signalled:\n{out[-4000:]}"

    # the signalled job ended (the trainer's exit 75 fails the rule); Slurm did not requeue it
    first = _job_state(cluster, signalled)
    assert (first["JobState"], first["Restarts"]) == ("FAILED", "0"), first

    metrics = json.loads((out_dir / "metrics.json").read_text())
    # a retry that started over would say restarts 0; the signal came after epoch 1
    assert metrics["restarts"] == 1, metrics["resumed_from_epochs"]
    assert 1 <= metrics["resumed_from_epochs"][0] < EPOCHS
    # the retry is Snakemake's new submission, a job of its own that completed
    retry = metrics["slurm_job_id"]
    assert retry.isdigit() and retry != signalled, (retry, signalled)
    assert _job_state(cluster, retry)["JobState"] == "COMPLETED"
    assert not (work / "results/checkpoints" / RUN).exists()  # removed once the run finished

    # the unsignalled reference: the same trainer arguments, outside Slurm
    args = _trainer_args(work / "logs/train" / f"{RUN}.log")
    args = _replace(args, "--out", str(tmp_path / "ref"))
    args = _replace(args, "--checkpoint-dir", str(tmp_path / "ref-checkpoints"))
    ranks = ["--nodes", "1", "--ranks-per-node", "2", "--cpus-per-rank", "1"]
    ref = subprocess.run(
        [str(BIN / "scalestudy"), "launch", *ranks, "--", *args],
        cwd=work,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ref.returncode == 0, (ref.stdout + ref.stderr)[-6000:]
    expected = _epochs(tmp_path / "ref")
    assert [r["epoch"] for r in expected] == [str(e) for e in range(1, EPOCHS + 1)]
    assert _epochs(out_dir) == expected  # each epoch once, the same numbers (6 digits)

    with (work / "results/csv/runs.csv").open() as f:
        runs = list(csv.DictReader(f))
    assert [(r["run"], r["restarts"]) for r in runs] == [(RUN, "1")]
