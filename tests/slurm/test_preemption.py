"""Preemption on the real local Slurm cluster: USR1 mid-run, checkpoint, retry, same results;
and a job that Slurm itself requeues (`scontrol requeue`) finishes once, resumed.

One run (synthetic data, 4 epochs; 2 ranks, and 1 rank, as two workflows side by side) goes
through `snakemake --executor slurm` up to results/csv/runs.csv (no profiling, analysis, plots
or report). Once its first epoch is written, the job gets `scancel --signal=USR1`: what `sbatch
--signal=USR1@<lead>` sends before the time limit, to the job steps (the ranks started by srun),
not to the batch shell. Checkpoints are taken only on a signal (every_epochs: 0), so a run that
says restarts == 1 proves that the ranks got USR1, agreed, saved, exited 75, and that
Snakemake's retry resumed from that checkpoint. A 1-rank run gets the warning only because
`scalestudy launch` starts its rank with srun too: the in-job executor (jobstep 0.6.1) runs a
job with an `mpi` resource in the batch shell, without its `srun -n1` wrapper (jobs/launch.py),
and the trainer it once started directly there never saw USR1.

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

--requeue comes from the profile's `slurm-requeue: true` (the executor's sbatch call, asserted
from its --verbose log); `Requeue=1` alone would prove nothing here, since it is Slurm's default
(JobRequeue=1) on this cluster.
"""

from __future__ import annotations

import concurrent.futures
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

# epochs of ~0.1 s each on a CPU: the signal sent once epoch 1 is written (after squeue and
# scancel, each slow on a loaded machine) must land before the last epoch, where the run
# finishes instead of stopping; at 4 epochs it landed there once (CI at 405883f)
EPOCHS = 24
SAME = ("epoch", "train_loss", "train_acc", "val_loss", "val_acc", "lr")


def _run_id(ranks: int) -> str:
    return f"w{ranks}_lb32_fp32_ddp_bk25_r0"


def _config(work: Path, ranks: int, every_epochs: int = 0, retries: int = 1) -> Path:
    cfg = yaml.safe_load((work / "config/demo.yaml").read_text())
    cfg["dataset"] = "synthetic"
    cfg["synthetic"] = {"num_train": 128, "num_test": 64}
    cfg["hardware"].update(gpus_per_node=2, mem_mb_per_rank=500, runtime_min=10)
    cfg["train"].update(
        epochs=EPOCHS, limit_train=128, limit_test=64, warmup_steps=1, comm_probe_steps=1,
        lr=0.1,  # the demo's 3.2 on 128 images swung val loss to 585 in 4 epochs: 24 stay finite
    )  # fmt: skip
    cfg["families"] = {
        "strong": {"enabled": False},
        "weak": {"enabled": True, "gpus": [ranks], "local_batch": 32},
        "precision": {"enabled": False},
        "bucket": {"enabled": False},
    }
    cfg["profiling"] = {"enabled": False}
    cfg["checkpointing"] = {"every_epochs": every_epochs, "retries": retries, "signal_lead_s": 120}
    return write_config(work / "preempt.yaml", cfg)


def _epochs(out: Path) -> list[dict]:
    with (out / "epochs.csv").open() as f:
        return [{k: r[k] for k in SAME} for r in csv.DictReader(f)]


def _rows(path: Path) -> int:
    return len(path.read_text().splitlines()) - 1 if path.exists() else 0


def _launched(log: Path) -> list[str]:
    """The command `scalestudy launch` ran (its `+ ` line in the job's log)."""
    for line in log.read_text().splitlines():
        if line.startswith("+ "):
            return shlex.split(line[2:])
    raise AssertionError(f"no launched command in {log}:\n{log.read_text()[-3000:]}")


def _trainer_args(argv: list[str]) -> list[str]:
    """The `scalestudy train` arguments of a launched command."""
    i = argv.index("scalestudy")
    assert argv[i - 1] == "-m" and argv[i + 1] == "train", argv
    return argv[i + 2 :]


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


def _workflow(cluster, work: Path, run: str, ready, act, verbose: bool = False) -> tuple:
    """Run the workflow up to runs.csv; once `ready(out_dir)`, call `act(job)` on the run's
    running job, once. Returns (snakemake's output, the job acted on)."""
    # the target first: --configfile takes every word after it
    cmd = [str(BIN / "snakemake"), "results/csv/runs.csv", "--profile", "profiles/local-slurm"]
    cmd += ["--verbose"] if verbose else []
    cmd += ["--configfile", "preempt.yaml"]
    proc = subprocess.Popen(
        cmd,
        cwd=work,
        env=env(SLURM_CONF=cluster.env["SLURM_CONF"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out_dir = work / "results/runs" / run
    acted = None
    deadline = time.monotonic() + 240
    try:
        while acted is None and proc.poll() is None:
            assert time.monotonic() < deadline, "the run never got ready on Slurm"
            queue = cluster.run(["squeue", "-h", "-t", "R", "-o", "%i|%k"]).stdout
            for line in queue.split():
                job, _, comment = line.partition("|")
                if run in comment and ready(out_dir):
                    act(job)
                    acted = job
            time.sleep(0.2)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-6000:]
    assert acted is not None, f"the job was never acted on:\n{out[-4000:]}"
    return out, acted


def _after_epoch_1(out_dir: Path) -> bool:
    return _rows(out_dir / "epochs.csv") >= 1


def _usr1_mid_run(cluster, tmp_path: Path, ranks: int) -> None:
    """The signalled run of `ranks` ranks resumes in Snakemake's retry and ends with the epochs
    of an unsignalled run (the module docstring)."""
    run = _run_id(ranks)
    work = copy_repo(tmp_path / "slurm")
    _config(work, ranks)
    out, signalled = _workflow(
        cluster,
        work,
        run,
        _after_epoch_1,
        lambda job: cluster.run(["scancel", "--signal=USR1", job]),
    )
    # the signalled job ended (the trainer's exit 75 fails the rule); Slurm did not requeue it
    first = _job_state(cluster, signalled)
    assert (first["JobState"], first["Restarts"], first["Requeue"]) == ("FAILED", "0", "1"), first

    out_dir = work / "results/runs" / run
    metrics = json.loads((out_dir / "metrics.json").read_text())
    # a retry that started over would say restarts 0; the signal came after epoch 1
    assert metrics["restarts"] == 1, metrics["resumed_from_epochs"]
    assert 1 <= metrics["resumed_from_epochs"][0] < EPOCHS
    # the retry is Snakemake's new submission, a job of its own that completed
    retry = metrics["slurm_job_id"]
    assert retry.isdigit() and retry != signalled, (retry, signalled)
    assert _job_state(cluster, retry)["JobState"] == "COMPLETED"
    assert not (work / "results/checkpoints" / run).exists()  # removed once the run finished

    # every rank, one rank too, was a task of the launcher's srun step
    launched = _launched(work / "logs/train" / f"{run}.log")
    tasks = [f"--ntasks={ranks}", f"--ntasks-per-node={ranks}"]
    assert launched[:4] == ["srun", "--nodes=1", *tasks], launched

    # the unsignalled reference: the same trainer arguments, outside Slurm
    args = _replace(_trainer_args(launched), "--out", str(tmp_path / "ref"))
    args = _replace(args, "--checkpoint-dir", str(tmp_path / "ref-checkpoints"))
    layout = ["--nodes", "1", "--ranks-per-node", str(ranks), "--cpus-per-rank", "1"]
    ref = subprocess.run(
        [str(BIN / "scalestudy"), "launch", *layout, "--", *args],
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
    assert [(r["run"], r["restarts"]) for r in runs] == [(run, "1")]

    # the inventory, written in the rule's shell (the jobstep stripped SLURM_* there but the job
    # id), has the job's fields as Slurm states them
    system = json.loads((work / "results/system" / f"{run}.json").read_text())["slurm"]
    state = _job_state(cluster, retry)
    assert system["SLURM_JOB_ID"] == retry
    assert (system["SLURM_JOB_NODELIST"], system["SLURM_JOB_PARTITION"]) == (
        state["NodeList"],
        state["Partition"],
    )
    assert system["SLURM_NNODES"] == state["NumNodes"] == "1"


def test_usr1_mid_run_of_two_ranks_and_of_one_ends_with_the_unsignalled_results(
    slurm_cluster, tmp_path
):
    """2 ranks: srun starts the ranks as the job step's tasks, so USR1 reaches them. 1 rank: a
    job step of its own too (`srun --nodes=1 --ntasks-per-node=1`), not the batch shell, which
    USR1 never reaches. The two workflows run side by side on the cluster (most of each is
    waiting on Slurm and the executor's status checks); a failure names its rank count."""
    cluster = slurm_cluster(2)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {
            ranks: pool.submit(_usr1_mid_run, cluster, tmp_path / f"ranks{ranks}", ranks)
            for ranks in (2, 1)
        }
    for ranks, future in futures.items():
        try:
            future.result()
        except AssertionError as exc:
            raise AssertionError(f"the {ranks}-rank run: {exc}") from exc


def test_a_job_slurm_requeues_finishes_once_resumed(slurm_cluster, tmp_path):
    """`scontrol requeue` of the running training job (what Slurm does after a node failure or
    a preemption with PreemptMode=REQUEUE): Slurm restarts the same job id, the executor waits
    for it (slurm-requeue: true), and with no retries the workflow succeeds only if that one job
    finished: one metrics.json, resumed from the periodic checkpoint."""
    cluster = slurm_cluster(2)
    run = _run_id(1)
    work = copy_repo(tmp_path / "slurm")
    _config(work, 1, every_epochs=1, retries=0)
    checkpoint = work / "results/checkpoints" / run / "epoch-0001"  # renamed into place whole
    out, requeued = _workflow(
        cluster,
        work,
        run,
        lambda out_dir: checkpoint.is_dir(),
        lambda job: cluster.run(["scontrol", "requeue", job]),
        verbose=True,
    )
    # --requeue came from the executor setting of the profile, once, not from slurm_extra
    calls = [line for line in out.splitlines() if "sbatch call:" in line]
    assert calls and all(c.count(" --requeue") == 1 for c in calls), calls
    state = _job_state(cluster, requeued)
    assert (state["JobState"], state["Restarts"], state["Requeue"]) == ("COMPLETED", "1", "1")

    metrics = json.loads((work / "results/runs" / run / "metrics.json").read_text())
    assert metrics["slurm_job_id"] == requeued  # the same job, not a resubmission
    assert metrics["restarts"] == 1 and metrics["resumed_from_epochs"][0] >= 1, metrics
    epochs = _epochs(work / "results/runs" / run)
    assert [r["epoch"] for r in epochs] == [str(e) for e in range(1, EPOCHS + 1)]
    assert len(list((work / "results/runs").glob("*/metrics.json"))) == 1
