"""Preemption on the real local Slurm cluster: USR1 mid-run, checkpoint, retry, same results.

The study (one 2-rank run, synthetic data) is run twice: by the local executor
(unsignalled reference) and by `snakemake --executor slurm`, where each training job gets
`scancel --signal=USR1` (what `sbatch --signal=USR1@<lead>` sends before the time limit: to the
job steps, i.e. the ranks, not the batch shell) once its first epoch is written. Checkpoints are
taken only on a signal (every_epochs: 0), so a resumed run proves the ranks got USR1, agreed,
saved, exited, and Snakemake's retry resumed from that checkpoint.
"""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from workflow_helpers import BIN, copy_repo, env, snakemake, write_config  # noqa: E402

pytestmark = pytest.mark.slurm

# 2 ranks: srun starts the ranks as the job step's tasks, so USR1 reaches them. A 1-rank job's
# step task is the executor's own `srun -n1` wrapper, which USR1 ends before the trainer can
# save (README: its retry resumes from the last periodic checkpoint instead); not tested here.
RUNS = ("w2_lb32_fp32_ddp_bk25_r0",)
SAME = ("epoch", "train_loss", "train_acc", "val_loss", "val_acc", "lr")


def _config(work: Path) -> Path:
    cfg = yaml.safe_load((work / "config/demo.yaml").read_text())
    cfg["dataset"] = "synthetic"
    cfg["synthetic"] = {"num_train": 256, "num_test": 100}
    cfg["hardware"].update(gpus_per_node=2, mem_mb_per_rank=500, runtime_min=10)
    cfg["train"].update(
        epochs=4, limit_train=256, limit_test=100, warmup_steps=1, comm_probe_steps=1
    )
    cfg["families"] = {
        "strong": {"enabled": False},
        "weak": {"enabled": True, "gpus": [2], "local_batch": 32},
        "precision": {"enabled": False},
        "bucket": {"enabled": False},
    }
    cfg["checkpointing"] = {"every_epochs": 0, "retries": 1, "signal_lead_s": 120}
    return write_config(work / "preempt.yaml", cfg)


def _epochs(work: Path, run: str) -> list[dict]:
    with (work / "results/runs" / run / "epochs.csv").open() as f:
        return [{k: r[k] for k in SAME} for r in csv.DictReader(f)]


def _rows(path: Path) -> int:
    return len(path.read_text().splitlines()) - 1 if path.exists() else 0


def test_usr1_mid_run_ends_with_the_unsignalled_results(slurm_cluster, tmp_path):
    cluster = slurm_cluster(2)
    ref = copy_repo(tmp_path / "ref")
    _config(ref)
    snakemake(ref, "--configfile", "preempt.yaml", "--cores", "2")

    work = copy_repo(tmp_path / "slurm")
    _config(work)
    cmd = [str(BIN / "snakemake"), "--profile", "profiles/local-slurm"]
    cmd += ["--configfile", "preempt.yaml"]
    proc = subprocess.Popen(
        cmd,
        cwd=work,
        env=env(SLURM_CONF=cluster.env["SLURM_CONF"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    signalled: dict[str, str] = {}  # run -> the job id that got USR1
    deadline = time.monotonic() + 300
    try:
        while len(signalled) < len(RUNS) and proc.poll() is None:
            assert time.monotonic() < deadline, "the runs never reached epoch 1 on Slurm"
            queue = cluster.run(["squeue", "-h", "-t", "R", "-o", "%i|%k"]).stdout
            for line in queue.split():
                job, _, comment = line.partition("|")
                for run in RUNS:
                    epochs = work / "results/runs" / run / "epochs.csv"
                    if run in comment and run not in signalled and _rows(epochs) >= 1:
                        show = cluster.run(["scontrol", "show", "job", job]).stdout
                        assert "Requeue=1" in show, show  # --requeue came through slurm_extra
                        cluster.run(["scancel", "--signal=USR1", job])
                        signalled[run] = job
            time.sleep(0.2)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-6000:]
    assert set(signalled) == set(RUNS), f"signalled only {signalled}:\n{out[-4000:]}"

    for run in RUNS:
        metrics = yaml.safe_load((work / "results/runs" / run / "metrics.json").read_text())
        # a retry that started over would say restarts 0; 4 epochs were planned
        assert metrics["restarts"] == 1, (run, metrics["resumed_from_epochs"])
        assert 1 <= metrics["resumed_from_epochs"][0] < 4
        assert metrics["slurm_job_id"].isdigit()
        assert _epochs(work, run) == _epochs(ref, run), run
        assert not (work / "results/checkpoints" / run).exists()
    runs_csv = (work / "results/csv/runs.csv").read_text()
    assert runs_csv.count("\n") == len(RUNS) + 1
