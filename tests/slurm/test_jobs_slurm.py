"""Array jobs on the real local Slurm cluster: refused for training before any job, and by the
launcher inside an array task.

snakemake-executor-plugin-slurm's `slurm-array-jobs` submits all jobs of a rule as one array
with the FIRST job's nodes, tasks, GPUs and time limit (its run_array_jobs), wrong for every
other training run. The workflow refuses the setting in `onstart:` (after the DAG, before any
job, local ones included); `scalestudy launch` refuses to run in an array task
(SLURM_ARRAY_TASK_ID), for a workflow started some other way. A job whose config was
edited while it queued stops before its command.

A run is also refused in `onstart:` while Slurm jobs of an earlier snakemake run in the same
working directory are still in the queue (jobs/slurm_queue.py, with the real squeue here).
"""

from __future__ import annotations

import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from workflow_helpers import BIN, copy_repo, env, write_config  # noqa: E402

from scalestudy.jobs import slurm_queue  # noqa: E402

pytestmark = pytest.mark.slurm


def _two_runs(work: Path) -> None:
    cfg = yaml.safe_load((work / "config/demo.yaml").read_text())
    cfg["dataset"] = "synthetic"
    cfg["synthetic"] = {"num_train": 128, "num_test": 64}
    cfg["hardware"].update(gpus_per_node=2, mem_mb_per_rank=500, runtime_min=10)
    cfg["families"] = {
        "strong": {"enabled": False},
        "weak": {"enabled": True, "gpus": [1, 2], "local_batch": 32},  # 1 and 2 ranks
        "precision": {"enabled": False},
        "bucket": {"enabled": False},
    }
    cfg["profiling"] = {"enabled": False}
    write_config(work / "arrays.yaml", cfg)


def _study(cluster, work: Path, *args: str) -> dict:
    """subprocess keywords of `snakemake results/csv/runs.csv` of arrays.yaml in `work` on the
    cluster (profiles/local-slurm), `args` added."""
    argv = [str(BIN / "snakemake"), "results/csv/runs.csv", "--profile", "profiles/local-slurm"]
    argv += [*args, "--configfile", "arrays.yaml"]
    return dict(args=argv, cwd=work, env=env(SLURM_CONF=cluster.env["SLURM_CONF"]), text=True)


def _refused(cluster, work: Path, *args: str) -> str:
    """The output of that snakemake, which must fail (within 180 s)."""
    proc = subprocess.run(**_study(cluster, work, *args), capture_output=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    return out


def _queued(cluster) -> list[str]:
    """Every job id squeue still lists, finished ones too."""
    return cluster.run(["squeue", "-h", "-t", "all", "-o", "%i"]).stdout.split()


@pytest.mark.parametrize("setting", ["train", "all"])
def test_array_jobs_for_training_are_refused_before_any_job(slurm_cluster, tmp_path, setting):
    cluster = slurm_cluster(2)
    work = copy_repo(tmp_path / "w")
    _two_runs(work)
    before = _queued(cluster)
    out = _refused(cluster, work, f"--slurm-array-jobs={setting}")
    refusals = [line for line in out.splitlines() if line.startswith("slurm-array-jobs=")]
    assert refusals == [
        f"slurm-array-jobs={setting!r} would submit training runs as one Slurm array with the "
        "first run's nodes, GPUs and time limit: take train, profile_capture, profile_ncu and "
        "`all` out of --slurm-array-jobs (slurm-array-jobs: in the profile)"
    ], out[-4000:]
    # no job at all: nothing submitted, not even the local matrix / prepare_data
    assert _queued(cluster) == before
    assert not (work / "results").exists()


def test_the_launcher_refuses_to_run_in_an_array_task(slurm_cluster, tmp_path):
    cluster = slurm_cluster(2)
    launch = f"{BIN / 'scalestudy'} launch --nodes 1 --ranks-per-node 1 -- --epochs 1"
    job = cluster.sbatch(
        "--array=1-2",
        "-t",
        "2",
        "--mem=200",
        "-o",
        str(tmp_path / "task-%a.out"),
        "--wrap",
        launch,
    )
    for task in (1, 2):
        assert cluster.wait_gone(f"{job}_{task}", timeout=90) == "FAILED"
        state = cluster.run(["scontrol", "show", "job", f"{job}_{task}"]).stdout
        assert "ExitCode=2:0" in state, state
        lines = (tmp_path / f"task-{task}.out").read_text().strip().splitlines()
        assert len(lines) == 1, lines  # one line, no traceback, no trainer started
        assert f"task {task} of Slurm array job {job}" in lines[0], lines
        assert "--slurm-array-jobs" in lines[0], lines


def test_a_run_while_an_earlier_runs_jobs_are_queued_is_refused_before_any_job(
    slurm_cluster, tmp_path
):
    """A snakemake that died leaves its Slurm jobs training; after --unlock, rerun-incomplete
    would submit their runs again into the same directories (jobs/slurm_queue.py)."""
    cluster = slurm_cluster(2)
    work = copy_repo(tmp_path / "w")
    _two_runs(work)
    # what the earlier run left: a job as the executor plugin submits one (--comment, -D)
    earlier = cluster.sbatch(
        "--comment",
        "rule_train_wildcards_w2_lb32_fp32_ddp_bk25_r0",
        "-D",
        str(work),
        "-t",
        "5",
        "--mem=100",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 300",
    )
    try:
        before = _queued(cluster)
        out = _refused(cluster, work)
        refusals = [line for line in out.splitlines() if line.startswith("scalestudy: 1 Slurm")]
        assert len(refusals) == 1, out[-4000:]
        assert f"an earlier snakemake run in {work} is still queued or running: " in refusals[0]
        assert f"{earlier} (train w2_lb32_fp32_ddp_bk25_r0, " in refusals[0]
        assert f"(`scancel {earlier}`)" in refusals[0]
        assert _queued(cluster) == before  # nothing submitted, nothing run, no output deleted
        assert not (work / "results").exists()
    finally:
        cluster.run(["scancel", earlier])
    cluster.wait_gone(earlier)
    assert slurm_queue.refusal(str(work), cluster.env) == ""  # gone: a run may start


def test_an_earlier_runs_job_in_a_hidden_partition_is_found(slurm_cluster):
    """squeue leaves out the jobs of a Hidden=YES partition unless asked (--all), even its own
    user's (root sees them all: the job is a user's here, `nobody`'s): a profile whose
    slurm_partition is one (a site's, known by name) hid the earlier run's jobs, and the rerun
    submitted the same runs again into the same directories."""
    cluster = slurm_cluster(2)
    hidden, user = "scalestudy_hidden", pwd.getpwnam("nobody")
    as_user = ["runuser", "-u", user.pw_name, "--"]
    work = Path(tempfile.mkdtemp(prefix="scalestudy-hidden-"))  # the user's to enter
    work.chmod(0o755)
    nodes = ",".join(cluster.nodes)
    cluster.run(["scontrol", "create", f"PartitionName={hidden}", f"Nodes={nodes}", "Hidden=YES"])
    try:
        job = cluster.run(
            [*as_user, "sbatch", "--parsable", "-p", hidden, "-D", str(work), "-t", "5",
             "--comment", "rule_train_wildcards_w2_lb32_fp32_ddp_bk25_r0", "--mem=100",
             "-o", "/dev/null", "--wrap", "sleep 300"],
            cwd=work,
        ).stdout.strip().split(";")[0]  # fmt: skip
        try:
            command = [*as_user, *slurm_queue.squeue_command(uid=user.pw_uid)]
            listed = slurm_queue.parse_squeue(cluster.run(command, cwd=work).stdout)
            found = slurm_queue.earlier_run_jobs(listed, str(work))
            assert [(j.job_id, j.what) for j in found] == [(job, "train w2_lb32_fp32_ddp_bk25_r0")]
            # without --all its own user's squeue shows nothing: what the check saw before
            plain = [word for word in command if word != "--all"]
            assert cluster.run(plain, cwd=work).stdout.strip() == ""
        finally:
            cluster.run(["scancel", job])
        cluster.wait_gone(job)
    finally:
        cluster.run(["scontrol", "delete", f"PartitionName={hidden}"])
        shutil.rmtree(work, ignore_errors=True)


def test_a_job_started_after_its_config_was_edited_stops_before_training(slurm_cluster, tmp_path):
    """A Slurm job's snakemake reads the config files again when the job starts: edited while
    the job queued, it trained other settings under the limits planned for the old ones. The
    main snakemake's plan reaches the job in its environment (study/resources.py)."""
    cluster = slurm_cluster(2)
    work = copy_repo(tmp_path / "w")
    _two_runs(work)
    cfg = yaml.safe_load((work / "arrays.yaml").read_text())
    cfg["checkpointing"]["retries"] = 0  # one failure ends the workflow
    write_config(work / "arrays.yaml", cfg)
    # both nodes taken: the training jobs queue until the config is edited
    blocker = cluster.sbatch(
        "-N2", "--exclusive", "-t", "5", "-o", "/dev/null", "--wrap", "sleep 300"
    )
    proc = subprocess.Popen(
        **_study(cluster, work), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            queued = cluster.run(["squeue", "-h", "-o", "%k"]).stdout.split()
            if sum(c.startswith("rule_train") for c in queued) == 2:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the training jobs were not queued")
        cfg["train"]["epochs"] += 1
        write_config(work / "arrays.yaml", cfg)
    finally:
        cluster.run(["scancel", blocker])
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0, out[-4000:]
    logs = sorted((work / ".snakemake/slurm_logs/rule_train").glob("*/*.log"))
    assert len(logs) == 2, out[-4000:]
    for log in logs:
        run = log.parent.name
        lines = log.read_text().splitlines()
        assert (
            "scalestudy: the study config or the venv's training software (torch, torchvision, "
            "triton, nvidia-*) changed after snakemake submitted this job: train of "
            f"run {run} would now run other settings"
        ) in "\n".join(lines), lines
        assert not (work / "results/runs" / run / "metrics.json").exists()
    # no job reached its shell command (Snakemake creates the log files empty)
    assert all(f.stat().st_size == 0 for f in (work / "logs/train").iterdir())
