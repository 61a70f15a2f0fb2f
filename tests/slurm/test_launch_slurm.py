"""`scalestudy launch` inside an allocation (salloc's shell, the local executor on a cluster):
its srun ends the ranks on one Ctrl-C.

srun's own answer to a single SIGINT is a status line ("srun: interrupt (one more within 1 sec
to abort)") and nothing for the tasks: the ranks trained on. A terminal's Ctrl-C reaches srun
only (the ranks run on the nodes, outside the terminal's process group), and `scalestudy
profile` passes a stop on to its launch once (profile.run_launch), so both left the ranks
training; profile killed srun 90 s later. The launch's srun has --disable-status: one SIGINT is
sent on to the ranks, whose end is rank 0's one `interrupted` line.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from workflow_helpers import BIN  # noqa: E402

from scalestudy.jobs.local_ranks import children  # noqa: E402

pytestmark = pytest.mark.slurm


def test_one_sigint_to_the_launchs_srun_ends_its_ranks(slurm_cluster, data_dir, tmp_path):
    cluster = slurm_cluster(2)
    train = ["--dataset", "synthetic", "--width", "4", "--local-batch", "32", "--epochs", "1000"]
    train += ["--warmup-steps", "1", "--comm-probe-steps", "0", "--device", "cpu"]
    train += ["--data-dir", str(data_dir), "--out", str(tmp_path / "run")]
    errors = tmp_path / "stderr"
    with errors.open("w") as err:
        proc = subprocess.Popen(
            ["salloc", "-N1", "-n2", "--cpus-per-task=1", "--mem=1000", "-t", "5"]
            + [str(BIN / "scalestudy"), "launch", "--ranks-per-node", "2"]
            + ["--cpus-per-rank", "1", "--", *train],
            env=cluster.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    try:
        for line in proc.stdout:
            if line.startswith("[rank 0/2"):  # the ranks are under way
                break
        else:
            pytest.fail(f"the ranks never started: {errors.read_text()[-3000:]}")
        (srun,) = children(proc.pid)  # salloc's command: the launch, which became srun
        assert Path(f"/proc/{srun}/cmdline").read_bytes().startswith(b"srun\0")
        os.kill(srun, signal.SIGINT)  # once, as profile.run_launch passes a stop on
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the ranks trained on 30 s after one SIGINT:\n{errors.read_text()}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            granted = re.search(r"Granted job allocation (\d+)", errors.read_text())
            if granted:
                cluster.run(["scancel", granted[1]], check=False)
        proc.stdout.close()
    said = errors.read_text()
    assert "one more within 1 sec" not in said, said
    assert re.search(r"^\[rank 0/2 \S+\] scalestudy train: interrupted$", said, re.M), said


def test_runs_in_sallocs_interactive_step_get_their_ranks_from_its_srun(
    slurm_cluster, data_dir, tmp_path
):
    """Where a site sets LaunchParameters=use_interactive_step (scripts/local-slurm.sh does),
    salloc's shell is a task of the job's interactive step (SLURM_STEP_ID 4294967290, Slurm's
    SLURM_INTERACTIVE_STEP), which holds no resources: srun starts steps from it. A 2-rank run
    there was refused ("would wait forever"); a 1-rank run started directly read the job's
    SLURM_NTASKS (srun --preserve-env) as its world size (tests/test_dist.py). And srun reads
    SLURM_NTASKS (`salloc -n`, `sbatch -n`) as its --ntasks, which wins over
    --ntasks-per-node: in `salloc -n1 -c2` a 2-rank run's step had one task, and the run
    trained as 1 rank, recorded as the 2-rank run, with no warning."""
    cluster = slurm_cluster(2)
    train = ["--dataset", "synthetic", "--width", "4", "--local-batch", "32", "--epochs", "1"]
    train += ["--limit-train", "256", "--limit-test", "64", "--warmup-steps", "1"]
    train += ["--comm-probe-steps", "0", "--device", "cpu", "--pg-timeout-s", "30"]
    train += ["--data-dir", str(data_dir)]
    shell = tmp_path / "shell"  # what salloc's interactive step runs: $SHELL, no arguments
    lines = ["#!/bin/bash", f"cd {shlex.quote(str(tmp_path))}"]
    lines.append('echo "$SLURM_STEP_ID $SLURM_NTASKS" > step')
    for name, ranks in (("two", "2"), ("one", "1")):
        launch = [str(BIN / "scalestudy"), "launch", "--ranks-per-node", ranks]
        launch += ["--cpus-per-rank", "1", "--", *train, "--out", str(tmp_path / name)]
        lines.append(f"{shlex.join(launch)} > {name}.log 2>&1; echo $? > {name}.rc")
    shell.write_text("\n".join(lines) + "\n")
    shell.chmod(0o755)
    subprocess.run(
        ["salloc", "-N1", "-n1", "--cpus-per-task=2", "--mem=1000", "-t", "5"],
        env={**cluster.env, "SHELL": str(shell)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert (tmp_path / "step").read_text().split() == ["4294967290", "1"]  # step id, job's tasks
    for name, world_size in (("two", 2), ("one", 1)):
        said = (tmp_path / f"{name}.log").read_text()
        assert (tmp_path / f"{name}.rc").read_text().strip() == "0", said[-3000:]
        metrics = json.loads((tmp_path / name / "metrics.json").read_text())
        assert metrics["world_size"] == world_size, said[-3000:]
