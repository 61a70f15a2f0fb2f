"""`scalestudy launch`: each rank's thread pools are sized to its own cores; in a Slurm job
every rank is a task of a job step (the USR1 warning reaches only those); array tasks refused.
(The same on the real local cluster: tests/slurm/test_preemption.py, test_jobs_slurm.py.)"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalestudy.errors import LaunchError
from scalestudy.jobs import launch
from scalestudy.trainer.config import TrainConfig

# Snakemake's shell exports these with the rule's threads (all ranks' cores together)
SNAKEMAKE_THREADS = dict.fromkeys(launch.THREAD_VARS, "4")

REPO = Path(__file__).resolve().parents[1]


def test_rank_env_gives_every_thread_pool_the_cores_of_one_rank():
    env = launch.rank_env({"PATH": "/bin", **SNAKEMAKE_THREADS}, 1)
    assert env["PATH"] == "/bin"
    assert {k: env[k] for k in launch.THREAD_VARS} == dict.fromkeys(launch.THREAD_VARS, "1")
    assert {"MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"} <= set(launch.THREAD_VARS)


# an env:// launcher's per-rank variables, as a caller may have them (a shell inside a torchrun
# job, a notebook on a cluster): the trainer's dist.detect prefers them to SLURM_PROCID
LEAKED = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
          "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1"}  # fmt: skip


# ... and a torchrun worker's agent variable: rank 0 connected to an agent's store no one ran,
# as a client, and hung until its process-group timeout
AGENT_LEAKED = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "none"}


def test_a_launched_rank_sees_its_own_thread_counts(tmp_path):
    """A real launch (one rank, whose trainer is replaced through --rank-prefix by a shell that
    records its environment) under the variables Snakemake's shell sets. A caller's RANK and
    WORLD_SIZE reached it too: the launch of one rank waited for a second that never came
    (and srun's tasks, each told RANK 0 of 1, trained as 1-rank runs into one --out)."""
    seen = tmp_path / "env.txt"
    prefix = f"sh -c 'env > {seen}' sh"
    proc = subprocess.run(
        [sys.executable, "-m", "scalestudy", "launch", "--cpus-per-rank", "2"]
        + ["--rank-prefix", prefix, "--", "--epochs", "1"],
        env={
            "PATH": "/usr/bin:/bin",
            **SNAKEMAKE_THREADS,
            **LEAKED,
            "MASTER_PORT": "29555",
            **AGENT_LEAKED,
        },  # fmt: skip
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    got = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert {k: got.get(k) for k in launch.THREAD_VARS} == dict.fromkeys(launch.THREAD_VARS, "2")
    assert not set(LEAKED) & set(got), {k: got[k] for k in set(LEAKED) & set(got)}
    assert not set(AGENT_LEAKED) & set(got), {k: got[k] for k in set(AGENT_LEAKED) & set(got)}
    assert got["MASTER_PORT"] == "29555"  # the documented override stays


# ------------------------------------------------------------------ where the ranks start
def _argv(env: dict[str, str], *args: str, device: str = "auto") -> list[str]:
    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    train = ["--epochs", "1", *(["--device", device] if device != "auto" else [])]
    return launch.build_command(parser.parse_args([*args, "--", *train]), env)


def _fake_srun(tmp_path) -> str:
    """A PATH holding a file named srun: build_command only checks that the launcher exists."""
    (tmp_path / "srun").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "srun").chmod(0o755)
    return str(tmp_path)


def test_one_rank_in_a_slurm_job_is_a_job_step_so_usr1_reaches_it(tmp_path):
    # the rule's shell of a 1-rank job: the batch step (no SLURM_STEP_ID), mpi resource ""
    env = {"SLURM_JOB_ID": "12", "PATH": _fake_srun(tmp_path)}
    argv = _argv(env, "--mpi=", "--cpus-per-rank", "3", device="cpu")
    assert argv[:6] == [
        "srun",
        "--nodes=1",
        "--ntasks=1",
        "--ntasks-per-node=1",
        "--cpus-per-task=3",
        "--kill-on-bad-exit=1",
    ]
    assert argv[-7:] == ["-m", "scalestudy", "train", "--epochs", "1", "--device", "cpu"]


def test_a_gpu_run_in_a_slurm_job_asks_its_step_for_its_own_gpus(tmp_path):
    """srun gives a step that names no --gres all of the job's GPUs (man srun, --gres): with
    snakemake's local executor in `salloc`'s shell (4 GPUs), two 1-rank runs at once each saw
    all 4 and both trained on GPU 0, each measuring half a GPU. A CUDA run's step now asks for
    its ranks' GPUs on each node; where the job has exactly those (the Slurm executor's jobs,
    `--gres` of the run's ranks per node) it changes nothing. A CPU run asks for none."""
    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    env = {"SLURM_JOB_ID": "12", "PATH": _fake_srun(tmp_path), "CUDA_VISIBLE_DEVICES": "0,1,2,3"}

    def argv(device: str, ranks: str) -> list[str]:
        args = ["--ranks-per-node", ranks, "--", "--epochs", "1", "--device", device]
        return launch.build_command(parser.parse_args(args), env)

    assert argv("cuda", "1")[:7] == [
        "srun",
        "--nodes=1",
        "--ntasks=1",
        "--ntasks-per-node=1",
        "--cpus-per-task=1",
        "--gres=gpu:1",
        "--kill-on-bad-exit=1",
    ]
    assert "--gres=gpu:2" in argv("auto", "2")  # auto: this job shows GPUs, so CUDA
    assert not [a for a in argv("cpu", "2") if a.startswith("--gres")]


def test_device_auto_in_a_job_shell_that_shows_no_gpu_is_refused(tmp_path):
    """--device auto is decided where launch runs, but srun puts the ranks on the job's nodes:
    in salloc's shell on a submit host without GPUs auto read as CPU, so a GPU job's step asked
    for no --gres (each run got all of the job's GPUs and runs at once shared GPU 0, the
    trainer's auto choosing CUDA on the node) and a container run was not given --nv (trained
    on the CPU). Now one line asks for the device; a shell that shows GPUs still decides."""
    env = {"SLURM_JOB_ID": "77", "PATH": _fake_srun(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    with pytest.raises(LaunchError, match="--device auto .* Slurm job 77: pass --device cuda"):
        _argv(env, "--ranks-per-node", "2")
    assert "--gres=gpu:2" in _argv({**env, "CUDA_VISIBLE_DEVICES": "0,1"}, "--ranks-per-node", "2")
    outside = {"PATH": env["PATH"], "CUDA_VISIBLE_DEVICES": ""}  # the ranks run here: auto is CPU
    assert _argv(outside, "--ranks-per-node", "2")[1:3] == ["-m", launch.LOCAL_RANKS]


def test_one_rank_already_inside_a_step_or_outside_slurm_starts_directly(tmp_path):
    path = _fake_srun(tmp_path)
    for env in ({"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0", "PATH": path}, {"PATH": path}):
        assert _argv(env)[1:] == ["-m", "scalestudy", "train", "--epochs", "1"], env


def test_one_rank_inside_a_step_of_several_tasks_is_refused_not_left_waiting(tmp_path):
    """`srun --pty bash` in `salloc -n 2`: the shell is task 0 of a 2-task step, and the rank
    started directly read SLURM_PROCID 0 of SLURM_NTASKS 2 (trainer/dist.py), waiting out the
    process-group timeout for a second rank nobody starts. One line instead."""
    env = {"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0", "PATH": _fake_srun(tmp_path)}
    env |= {"SLURM_NTASKS": "2", "SLURM_PROCID": "0"}
    with pytest.raises(LaunchError, match="task 0 of the 2 tasks of step 0 of Slurm job 12"):
        _argv(env)
    assert _argv({**env, "SLURM_NTASKS": "1"})[1:3] == ["-m", "scalestudy"]


def test_several_ranks_inside_a_step_are_refused_not_left_waiting(tmp_path):
    """`srun --pty bash`, then snakemake: a nested srun would wait forever for the resources
    of the enclosing step; one line says so and what to run instead."""
    env = {"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0", "PATH": _fake_srun(tmp_path)}
    with pytest.raises(
        LaunchError, match="4 ranks, and this shell is already a task of step 0"
    ) as no:
        _argv(env, "--ranks-per-node", "4")
    # the Snakefile's onstart refuses such a study before any job with the same line
    from scalestudy.jobs import gpu_slots

    assert gpu_slots.host_refusal([1, 4], "cpu", env, "config/demo.yaml") == str(no.value)
    # the batch shell of a job (no step) starts them with srun
    batch = {"SLURM_JOB_ID": "12", "PATH": env["PATH"]}
    assert _argv(batch, "--ranks-per-node", "4", device="cpu")[0] == "srun"


def test_a_missing_srun_inside_slurm_is_one_clear_error():
    with pytest.raises(LaunchError, match="inside Slurm job 12 but 'srun' is not on PATH"):
        _argv({"SLURM_JOB_ID": "12", "PATH": "/nonexistent"}, "--mpi=")


def test_an_array_task_is_refused_with_the_setting_to_change():
    """A real launch inside what an array task's shell sees: one line, exit 2, nothing run."""
    proc = subprocess.run(
        [sys.executable, "-m", "scalestudy", "launch", "--", "--epochs", "1"],
        env={
            **os.environ,
            "SLURM_JOB_ID": "21",
            "SLURM_ARRAY_JOB_ID": "20",
            "SLURM_ARRAY_TASK_ID": "2",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "task 2 of Slurm array job 20" in lines[0], proc.stderr
    assert "--slurm-array-jobs" in lines[0] and "Traceback" not in proc.stderr


def _scalestudy(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "scalestudy", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _launch(*argv: str, path: str = "/usr/bin:/bin") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return _scalestudy("launch", *argv, env={**env, "PATH": path})


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        # with 2 local ranks, each rank's line was buried under torchrun's failure report
        (["--ranks-per-node", "2", "--", "--epochs", "0"], "--epochs must be >= 1, got 0"),
        (
            ["--ranks-per-node", "2", "--", "--learning-rate", "3"],
            "the trainer's flags after --: unrecognized arguments: --learning-rate 3",
        ),
        (["--", "--precision", "fp8"], "argument --precision: invalid choice: 'fp8'"),
        # a traceback (ValueError: No closing quotation)
        (["--rank-prefix", 'echo "unclosed', "--", "--epochs", "1"], "No closing quotation"),
    ],
)
def test_bad_trainer_flags_are_one_line_before_any_rank_starts(argv, says):
    proc = _launch(*argv)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("ranks", ["1", "2"])
def test_a_rank_prefix_program_not_on_path_is_one_line_for_any_rank_count(ranks):
    """Checked only as the command's first word, so for one rank: with two local ranks
    torchrun starts the prefix (`--no-python`), and its absence was torchrun's 63-line
    traceback, exit 1, naming no fix. Nothing is started (no GPU is taken: --device cpu)."""
    proc = _launch(
        "--ranks-per-node", ranks, "--rank-prefix", "no-such-wrapper --flag", "--",
        "--device", "cpu", "--epochs", "1",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "scalestudy launch: no-such-wrapper is not on PATH (the program of --rank-prefix "
        "'no-such-wrapper --flag')"
    ]


def test_a_container_without_apptainer_on_path_says_so(tmp_path):
    """os.exec's "b'/bin/apptainer': No such file or directory" named neither the program nor
    the fix."""
    image = tmp_path / "trainer.sif"
    image.write_bytes(b"an image")
    # --device cpu: a GPU machine refuses --device auto in a container without --gpu first
    proc = _launch("--container", str(image), "--", "--device", "cpu", "--epochs", "1")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "apptainer is not on PATH" in lines[-1], proc.stderr
    assert "module load apptainer" in lines[-1]


def test_a_container_image_that_is_not_there_names_the_build_command(tmp_path):
    """A mistyped or unbuilt --container (by hand: in the workflow the image is an input) was
    "x.sif: No such file or directory", naming no way to make it."""
    image = tmp_path / "nowhere" / "trainer.sif"
    proc = _launch("--container", str(image), "--", "--device", "cpu", "--epochs", "1")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"scalestudy launch: {image}: no such image file: build it with `scalestudy container "
        f"build {REPO / 'containers/trainer.def'} {image} --context {REPO}`"
    ]


def test_the_inventory_and_the_ranks_read_the_image_once(tmp_path, monkeypatch):
    """The rule train ran `scalestudy inventory --image IMG` and then `scalestudy launch
    --container IMG`: each read the whole image for its digest (a multi-GB .sif on a shared file
    system, twice a job). `launch --inventory OUT` writes the inventory before the ranks start
    with the digest the command carries: one read. The ranks' exec is stood in (it would start
    them), as is apptainer (tests/stand-ins)."""
    from scalestudy import files, vocab

    image = tmp_path / "trainer.sif"
    image.write_bytes(b"an image" * 1000)
    for name in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    # set by launch for the inventory (it then execs): unset again after the test
    monkeypatch.setenv(vocab.CONTAINER_DIGEST_ENV, "")
    monkeypatch.setenv("PATH", f"{REPO / 'tests' / 'stand-ins'}{os.pathsep}{os.environ['PATH']}")
    read, sha256 = [], files.sha256
    monkeypatch.setattr(files, "sha256", lambda path, **kw: (read.append(path), sha256(path))[1])

    class Started(Exception):
        pass

    def execvpe(program, argv, env):
        raise Started(argv)

    monkeypatch.setattr(launch.os, "execvpe", execvpe)
    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    out = tmp_path / "system" / "r.json"
    args = parser.parse_args(
        ["--container", str(image), "--inventory", str(out), "--", "--device", "cpu"]
    )
    with pytest.raises(Started) as started:
        launch.run(args)
    digest = "sha256:" + sha256(image)
    assert read == [str(image)], read  # once, for both
    assert f"{vocab.CONTAINER_DIGEST_ENV}={digest}" in started.value.args[0]
    info = json.loads(out.read_text())
    assert info["container_digest"] == digest
    assert "not the image's the ranks run in" in info["software_of"]
    # --inventory onto the image itself: refused before it is read or replaced
    args = parser.parse_args(
        ["--container", str(image), "--inventory", str(image), "--", "--device", "cpu"]
    )
    with pytest.raises(LaunchError, match="--inventory"):
        launch.run(args)
    assert image.read_bytes() == b"an image" * 1000


def test_gpu_and_container_go_together(tmp_path):
    """--gpu without --container was ignored (the run was in no container), and a cuda run in
    a container without --gpu failed at each rank's start: torch saw no GPU without --nv."""
    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    image = str(tmp_path / "trainer.sif")
    (tmp_path / "trainer.sif").write_bytes(b"an image")  # its digest goes to the ranks

    def command(*argv: str) -> list[str]:
        return launch.build_command(parser.parse_args(list(argv)), {"PATH": "/bin"})

    with pytest.raises(LaunchError, match="--gpu passes --nv to apptainer: it needs --container"):
        command("--gpu", "--", "--device", "cuda")
    with pytest.raises(LaunchError, match="--device cuda in a container needs --gpu"):
        command("--container", image, "--", "--device=cuda")
    argv = command("--container", image, "--gpu", "--", "--device", "cuda")
    assert argv[:2] == ["apptainer", "exec"] and "--nv" in argv[: argv.index(image)]
    argv = command("--container", image, "--", "--device", "cpu")
    assert "--nv" not in argv and image in argv


def test_a_cuda_run_in_a_container_is_found_as_the_trainer_reads_its_flags(tmp_path):
    """Only `--device cuda` and `--device=cuda` were found: `--dev cuda` (argparse takes an
    abbreviation) and --device auto on a GPU machine ran without --nv, and `--data-d /scratch/x`
    was not bound into the image."""
    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    image = str(tmp_path / "trainer.sif")
    (tmp_path / "trainer.sif").write_bytes(b"an image")
    gpu_machine = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0"}

    def command(*argv: str, env=gpu_machine) -> list[str]:
        return launch.build_command(parser.parse_args(["--container", image, *argv]), env)

    with pytest.raises(LaunchError, match="--device cuda in a container needs --gpu"):
        command("--", "--dev", "cuda")
    for auto in (["--device", "auto"], []):
        with pytest.raises(LaunchError, match="--device auto in a container needs --gpu.*cpu"):
            command("--", *auto)
    assert "--nv" not in command("--", env={"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "-1"})
    scratch = tmp_path / "scratch"
    (scratch / "data").mkdir(parents=True)
    argv = command("--gpu", "--", "--dev", "cuda", "--data-d", str(scratch / "data"))
    bound = [argv[i + 1] for i, a in enumerate(argv[: argv.index(image)]) if a == "--bind"]
    assert str(scratch / "data") in bound


def test_the_trainers_directories_outside_the_working_directory_are_bound_in(tmp_path, monkeypatch):
    """Apptainer binds only $HOME, the working directory and /tmp: an absolute --data-dir or
    --checkpoint-dir on /scratch (what config/README.md advises) was not inside the image, and
    every rank found no data. Each is bound at its own path (its nearest existing directory:
    the trainer makes the checkpoint directory), a relative one that leaves the working
    directory too; one under the working directory is not."""
    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    work, scratch = tmp_path / "study", tmp_path / "scratch"
    (work / "results/data").mkdir(parents=True)
    (scratch / "data/cifar10").mkdir(parents=True)
    (scratch / "ckpt").mkdir()
    image = work / "trainer.sif"
    image.write_bytes(b"an image")
    monkeypatch.chdir(work)

    def binds(*flags: str) -> list[str]:
        argv = launch.build_command(
            parser.parse_args(["--container", str(image), "--", "--device", "cpu", *flags]),
            {"PATH": "/bin"},
        )
        return [argv[i + 1] for i, a in enumerate(argv[: argv.index(str(image))]) if a == "--bind"]

    got = binds(
        "--data-dir", str(scratch / "data/cifar10"),
        "--checkpoint-dir", str(scratch / "ckpt/run-1"),
        f"--out={work / 'results/runs/run-1'}",
    )  # fmt: skip
    assert got[1:] == [str(scratch / "data/cifar10"), str(scratch / "ckpt")]  # [0]: src/
    assert binds("--data-dir", "results/data") == got[:1]  # inside the working directory
    assert binds("--data-dir", "./results/../results/data") == got[:1]
    # relative and leaving the working directory (a study's `data_dir: ../scratch/data`): the
    # ranks start in the bound working directory, so it is the host's work/../scratch/data
    # inside the image too; it was skipped, as only absolute paths were looked at
    rel = binds("--data-dir", "../scratch/data/cifar10", "--checkpoint-dir=../scratch/ckpt/r1")
    assert rel == got
    assert binds("--out", "results/../../scratch/new/run-1") == [*got[:1], str(scratch)]
    with pytest.raises(LaunchError, match="none of its directories exists"):
        binds("--checkpoint-dir", "/no-such-top-level-dir/ckpt")
    # a system directory, nearest or named: bound, the host's /opt hid the image's (the pytorch
    # images' Python under /opt/conda: every rank "executable file not found")
    for flag, path, there in (
        ("--checkpoint-dir", "/opt/no-such-scalestudy-dir/run-1", "/opt"),
        ("--out", "/usr/local/no-such-scalestudy-dir/r1", "/usr/local"),
        ("--data-dir", "/", "/"),
    ):
        with pytest.raises(LaunchError) as exc:
            binds(flag, path)
        assert f"its nearest existing directory is the system directory {there}, " in str(exc.value)
        assert "make the directory first, or choose one outside" in str(exc.value)


def test_a_symlink_out_of_the_working_directory_binds_its_target(tmp_path, monkeypatch):
    """`results/data -> /scratch/me/data` was judged by the path as written (inside the working
    directory) and got no bind, though inside the image the link still points at /scratch,
    which only a bind brings in. The real path decides and is bound (its nearest existing
    directory for a checkpoint directory the trainer has yet to make); a link that stays
    inside, and a working directory reached through a link, need none."""
    work, scratch = tmp_path / "study", tmp_path / "scratch"
    (work / "results/runs").mkdir(parents=True)
    (scratch / "data").mkdir(parents=True)
    (scratch / "ckpt").mkdir()
    (work / "results/data").symlink_to(scratch / "data")
    (work / "ckpt").symlink_to(scratch / "ckpt")
    (work / "out").symlink_to(work / "results/runs")  # a link that stays inside
    (tmp_path / "link-to-study").symlink_to(work)

    def binds(cwd: Path, *flags: str) -> list[str]:
        # the default --data-dir is results/data: inside unless a flag names another
        argv = ["--device", "cpu", "--data-dir", "results/runs", *flags]
        return launch.container_paths(TrainConfig.from_argv(argv), cwd)[0]

    assert binds(work, "--data-dir", "results/data") == [str(scratch / "data")]
    assert binds(work, "--checkpoint-dir", "ckpt/run-1") == [str(scratch / "ckpt")]
    assert binds(work, "--out", "out/run-1") == []
    assert binds(tmp_path / "link-to-study", "--data-dir", "results/runs") == []
    assert binds(tmp_path / "link-to-study", "--data-dir", "results/data") == [
        str(scratch / "data")
    ]


def test_a_path_through_a_symlinked_directory_reaches_the_trainer_as_its_real_path(
    tmp_path, monkeypatch
):
    """`/scratch -> /gpfs/scratch`, a cluster's usual: `--data-dir /scratch/me/data` was bound
    at its real path, /gpfs/scratch/me/data, while the trainer, given /scratch/me/data, found
    nothing there inside the image (no /scratch in it): every rank said the data was not
    prepared; so did a study link `results/ckpt -> /scratch/me/ckpt`, whose target is not in
    the image either. The trainer now gets the real path, which is what is bound."""
    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    work, real = tmp_path / "study", tmp_path / "gpfs" / "scratch"
    (work / "results").mkdir(parents=True)
    (real / "me" / "data").mkdir(parents=True)
    (real / "me" / "ckpt").mkdir()
    (tmp_path / "scratch").symlink_to(real)
    (work / "results" / "ckpt").symlink_to(tmp_path / "scratch" / "me" / "ckpt")
    image = work / "trainer.sif"
    image.write_bytes(b"an image")
    monkeypatch.chdir(work)
    flags = ["--device", "cpu", "--data-dir", str(tmp_path / "scratch/me/data")]
    flags += ["--checkpoint-dir=results/ckpt/run-1", "--out", "results/runs/run-1"]
    argv = launch.build_command(
        parser.parse_args(["--container", str(image), "--", *flags]), {"PATH": "/bin"}
    )
    bound = [argv[i + 1] for i, a in enumerate(argv[: argv.index(str(image))]) if a == "--bind"]
    assert bound[1:] == [str(real / "me" / "data"), str(real / "me" / "ckpt")], bound
    seen = TrainConfig.from_argv(argv[argv.index("train") + 1 :])  # what the trainer reads
    assert seen.data_dir == str(real / "me" / "data")
    assert seen.checkpoint_dir == str(real / "me" / "ckpt" / "run-1")
    assert seen.out == "results/runs/run-1"  # inside the working directory: as written
    # outside a container the paths are the host's own: as written
    argv = launch.build_command(parser.parse_args(["--", *flags]), {"PATH": "/bin"})
    assert TrainConfig.from_argv(argv[argv.index("train") + 1 :]).data_dir == flags[3]


def test_trainer_flags_without_the_separator_name_it():
    """`launch --epochs 1` said only argparse's "unrecognized arguments: --epochs"."""
    proc = _launch("--epochs", "1")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[-1] == (
        "scalestudy launch: error: unrecognized arguments: --epochs (the trainer's flags go "
        "after `--`: scalestudy launch ... -- --epochs 1); `scalestudy launch --help` shows the "
        "usage"
    )
    # a command that starts no trainer keeps argparse's message alone
    plan = _scalestudy("matrix", "--bogus")
    assert plan.returncode == 2
    assert plan.stderr.splitlines() == [
        "scalestudy matrix: error: unrecognized arguments: --bogus; `scalestudy matrix --help` "
        "shows the usage"
    ]
    # a command's action: its own parser lists the flags (`scalestudy profile --help` named
    # only the actions)
    parse = _scalestudy("profile", "parse", "--run", "r", "--capture", "c", "--bogus", "1")
    assert parse.returncode == 2
    assert parse.stderr.splitlines() == [
        "scalestudy profile parse: error: unrecognized arguments: --bogus 1; `scalestudy "
        "profile parse --help` shows the usage"
    ]


# ------------------------------------------------------------------ how local ranks end
def _local_run(data_dir: Path, tmp_path: Path, *flags: str) -> subprocess.Popen:
    """`scalestudy launch` of 2 local ranks (torchrun's agent) training until stopped, in its
    own process group as a terminal's foreground job is; returns once rank 0 trains."""
    from workflow_helpers import child_env, sighup_as_in_a_terminal, sigint_as_in_a_terminal

    def as_in_a_terminal() -> None:
        sigint_as_in_a_terminal()
        sighup_as_in_a_terminal()

    cmd = [sys.executable, "-m", "scalestudy", "launch", "--ranks-per-node", "2", "--"]
    cmd += ["--dataset", "synthetic", "--width", "4", "--local-batch", "32", "--epochs", "1000"]
    cmd += ["--warmup-steps", "1", "--comm-probe-steps", "0", "--device", "cpu", *flags]
    cmd += ["--data-dir", str(data_dir), "--out", str(tmp_path / "run")]
    proc = subprocess.Popen(
        cmd,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_in_a_terminal,
        start_new_session=True,
    )
    for line in proc.stdout:
        if line.startswith("[rank 0/2"):  # the ranks are under way
            return proc
    proc.kill()
    pytest.fail(f"the ranks never started: {proc.communicate(timeout=60)}")


def _ranks(proc: subprocess.Popen) -> list[int]:
    """The ranks: the children of the process `launch` became."""
    from workflow_helpers import worker_pids

    ranks = worker_pids(proc.pid)
    assert sorted(ranks) == [0, 1], ranks
    return list(ranks.values())


def test_ctrl_c_of_local_ranks_is_rank_0s_one_line(data_dir, tmp_path):
    """Ctrl-C (SIGINT to the terminal's foreground process group: torchrun and its ranks) of a
    2-rank `scalestudy launch`: after rank 0's one line, torchrun's own SignalException
    traceback (30 lines, its own process) and exit 1, so a shell loop over runs went on. Now
    rank 0's line is all, and the launch ends killed by SIGINT as the ranks do."""
    proc = _local_run(data_dir, tmp_path)
    try:
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert re.fullmatch(r"\[rank 0/2 \S+\] scalestudy train: interrupted", lines[0]), err
    assert proc.returncode == -signal.SIGINT, err


def test_ctrl_c_again_while_a_hung_rank_is_shut_down_leaves_no_rank(data_dir, tmp_path):
    """A rank hung (here: stopped), and Ctrl-C pressed again during torchrun's shutdown wait for
    it: the second SIGINT raised inside that wait, the launch exited and both ranks lived on,
    orphaned, holding their GPU slots (every later run on those GPUs waited for ever). The
    launch kills what torchrun's shutdown left before it ends."""
    from workflow_helpers import running

    proc = _local_run(data_dir, tmp_path)
    ranks = _ranks(proc)
    try:
        for line in proc.stdout:  # rank 0 then waits for rank 1 in every step's all-reduce
            if "steady-state window opens" in line:
                break
        os.kill(ranks[1], signal.SIGSTOP)
        for wait in (0.5, 1.0, 1.0):  # to the launch alone (kill -INT, a wrapper's Ctrl-C)
            time.sleep(wait)
            os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)  # not its output: a rank left holds the pipe open
        # a rank killed ends within moments (a busy machine's scheduler: up to seconds); one
        # left stays stopped. No SIGCONT: the stopped rank, woken, would end on its pending
        # signal
        deadline = time.monotonic() + 20
        while (left := [pid for pid in ranks if running(pid)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, [Path(f"/proc/{pid}/stat").read_text() for pid in left]
    finally:
        proc.kill()
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGINT


def test_a_stop_of_local_ranks_exits_75(data_dir, tmp_path):
    """A stop signal to the ranks (SIGUSR1, as Slurm sends it): each checkpoints and exits 75
    (rerun to resume), and torchrun made that its ChildFailedError report and exit 1. The
    ranks' 75 is now the launch's, with no traceback, and no torchrun error line calling it
    a failure (its "failed (exitcode: 75)" was left in)."""
    proc = _local_run(data_dir, tmp_path, "--checkpoint-dir", str(tmp_path / "ckpt"))
    try:
        for pid in _ranks(proc):
            os.kill(pid, signal.SIGUSR1)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 75, err
    assert "Traceback" not in err and "stopped on SIGUSR1 after epoch" in err, err
    assert list((tmp_path / "ckpt").glob("epoch-*")), err
    # torchrun's own "E... failed (exitcode: 75) local_rank: 1 ..." called the stop a failure
    assert "failed (exitcode" not in err, err


def test_a_failed_local_rank_is_one_line_and_its_exit_status(tmp_path):
    """A rank's expected error (no prepared data: exit 2) under torchrun was its line, then
    torchrun's 40-line ChildFailedError report and exit 1. Now one line names the rank and its
    exit status is the launch's."""
    proc = _launch(
        "--ranks-per-node", "2", "--", "--dataset", "synthetic", "--device", "cpu",
        "--epochs", "1", "--data-dir", str(tmp_path / "none"), "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "FAILED" not in proc.stderr, proc.stderr
    assert "synthetic is not prepared" in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("scalestudy launch: rank ")
    assert "exited 2 (the first to fail" in proc.stderr.splitlines()[-1]


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1], ids=["term", "hup", "usr1"]
)
def test_a_stop_signal_to_the_launch_itself_is_the_ranks_stop(data_dir, tmp_path, signum):
    """SIGTERM to the launch process alone (a batch system's or `timeout`'s stop of the
    launcher, not of its ranks): torchrun passed it on, the ranks checkpointed and exited 75,
    and the launch still ended 143 ("stopped by SIGTERM"), so a wrapper could not tell a stop
    to rerun from a crash. The ranks' end is now the launch's: 75, with their checkpoint.
    SIGHUP (a closed terminal) alike: the ranks died of it (129), their training lost. And
    SIGUSR1, the ranks' own checkpoint-and-stop: it killed the launch (its default action),
    and the ranks, in sessions of their own, trained on with no one watching."""
    proc = _local_run(data_dir, tmp_path, "--checkpoint-dir", str(tmp_path / "ckpt"))
    try:
        proc.send_signal(signum)  # the launcher only
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 75, err
    assert "Traceback" not in err and f"stopped on {signum.name} after epoch" in err, err
    assert list((tmp_path / "ckpt").glob("epoch-*")), err


def test_a_stop_signal_while_launch_writes_the_inventory_is_one_line(tmp_path):
    """launch was cli.OWN_STOP (it execs srun or torchrun's agent, which handle the signals):
    once it wrote the node record first (--inventory), a SIGTERM there killed it on the spot,
    nothing said, its nvidia-smi probe (or an srun on the job's first node) left running. Now
    one line, death by the signal, and no probe left. nvidia-smi is a stand-in that hangs."""
    bin_dir, pids = tmp_path / "bin", tmp_path / "pids"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho $$ >> {pids}\nexec sleep 60\n")
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    argv = [sys.executable, "-m", "scalestudy", "launch", "--inventory", str(tmp_path / "i.json")]
    proc = subprocess.Popen(
        [*argv, "--", "--device", "cpu"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not (pids.exists() and pids.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM, err
    assert err.splitlines()[-1] == "scalestudy launch: stopped by SIGTERM", err
    assert not (tmp_path / "i.json").exists()
    probe = int(pids.read_text().split()[0])
    time.sleep(0.5)  # subprocess.run kills its child on the way out
    assert (
        not Path(f"/proc/{probe}").exists()
        or "zombie" in Path(f"/proc/{probe}/status").read_text().lower()
    ), "the nvidia-smi probe was left running"


def test_a_stop_signal_without_checkpoints_is_the_launchs_line_alone(data_dir, tmp_path):
    """SIGTERM to the launch of ranks without checkpointing: they die of it, and torchrun's
    "E... failed (exitcode: -15) local_rank: 0 ... of binary" stayed between rank 0's line
    and the launch's, a stop the user sent called a failure. The ranks' own line and the
    launch's, 143."""
    proc = _local_run(data_dir, tmp_path)
    try:
        proc.send_signal(signal.SIGTERM)  # the launcher only
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "failed (exitcode" not in err and "Traceback" not in err, err
    assert err.splitlines()[-1] == (
        "scalestudy launch: stopped by SIGTERM: the ranks were sent SIGTERM"
    ), err


def test_ranks_that_ignore_the_launchs_stop_are_killed_after_the_grace(tmp_path):
    """The launch passes SIGTERM on to its ranks and waits for their own end; ranks that never
    end (here each rank is a shell ignoring SIGTERM, through --rank-prefix) are killed after
    torchrun's shutdown timeout, as torchrun did, in one line and 143, and none is left."""
    from workflow_helpers import child_env

    started = tmp_path / "started"
    prefix = f"sh -c 'trap \"\" TERM; echo $$ >> {started}; sleep 300' sh"
    proc = subprocess.Popen(
        [sys.executable, "-m", "scalestudy", "launch", "--ranks-per-node", "2"]
        + ["--rank-prefix", prefix, "--", "--device", "cpu", "--epochs", "1"],
        env=child_env(TORCH_ELASTIC_SHUTDOWN_TIMEOUT="2"),
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        for _ in range(600):
            if started.exists() and len(started.read_text().split()) == 2:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert "Traceback" not in err, err
    assert err.splitlines()[-1].startswith("scalestudy launch: stopped by SIGTERM"), err
    for pid in started.read_text().split():
        assert not Path(f"/proc/{pid}").exists(), f"rank {pid} outlived the launch"


def test_the_grace_under_a_torchrun_without_a_shutdown_timeout(monkeypatch):
    """torch 2.11's torchrun (the H200 session of 2026-12-04) has no --shutdown-timeout: the
    launch read args.shutdown_timeout and every multi-rank run there ended in an
    AttributeError. And the grace was torchrun's 30 s: an epoch longer than that was killed
    before its checkpoint, the launch 143 for the stop's 75."""
    from torch.distributed import run as torchrun

    from scalestudy.jobs import local_ranks, supervise
    from scalestudy.jobs.local_ranks import shutdown_timeout

    old = torchrun.parse_args(["--nproc-per-node=2", "train.py"])
    vars(old).pop("shutdown_timeout", None)  # the namespace torch 2.11's parser gives
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    # the grace is the launch's timer (_PassOn), torchrun's 30 s no limit of it: a rank's time
    # to reach its epoch's end and save, within what supervise waits for the launch
    assert shutdown_timeout(old) == local_ranks.STOP_GRACE_S < supervise.STOP_WAIT_S
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "2")
    assert shutdown_timeout(old) == 2


def _has_shutdown_timeout() -> bool:
    from torch.distributed import run as torchrun

    return hasattr(torchrun.parse_args(["train.py"]), "shutdown_timeout")


@pytest.mark.skipif(not _has_shutdown_timeout(), reason="this torchrun has no --shutdown-timeout")
def test_the_grace_is_torchruns_shutdown_timeout_where_it_has_one(monkeypatch):
    """A torchrun with the option (CI's torch): the option, else the variable, as its agent."""
    from torch.distributed import run as torchrun

    from scalestudy.jobs.local_ranks import STOP_GRACE_S, shutdown_timeout

    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    assert shutdown_timeout(torchrun.parse_args(["train.py"])) == STOP_GRACE_S
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "2")
    assert shutdown_timeout(torchrun.parse_args(["--nproc-per-node=2", "train.py"])) == 2
    given = torchrun.parse_args(["--nproc-per-node=2", "--shutdown-timeout=5", "train.py"])
    assert shutdown_timeout(given) == 5


def test_a_rank_killed_from_outside_is_not_said_to_have_printed_why(caplog):
    """A rank killed by a signal no one in the run sent (the OOM killer's SIGKILL, a `kill`)
    prints nothing, and the launch's line said "its lines above say why". Said as it is: killed
    from outside, where to look; a rank that exited with a status keeps "its lines above"."""
    import logging
    import types

    from scalestudy.jobs import local_ranks

    def failed(code: int):
        failure = types.SimpleNamespace(
            exitcode=code, signal_name=lambda: signal.Signals(-code).name if code < 0 else ""
        )
        return types.SimpleNamespace(get_first_failure=lambda: (1, failure))

    with caplog.at_level(logging.ERROR, logger="scalestudy.launch"):
        assert local_ranks._failed(failed(-signal.SIGKILL), 2) == 137
        assert local_ranks._failed(failed(3), 2) == 3
        assert local_ranks._failed(failed(-signal.SIGSEGV), 2) == 139
    killed, exited, crashed = (r.getMessage() for r in caplog.records)
    assert "SIGSEGV (the first to fail; its lines above, if any, say why, and" in crashed
    assert killed == (
        "scalestudy launch: rank 1 of 2 was killed by SIGKILL (the first to fail; from outside "
        "the run, so it printed nothing: an out-of-memory kill is in the kernel log, `dmesg`; "
        "the other ranks were stopped)"
    ), killed
    assert exited == (
        "scalestudy launch: rank 1 of 2 exited 3 (the first to fail; its lines above say why, "
        "and the other ranks were stopped)"
    ), exited
