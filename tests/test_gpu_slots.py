"""Local GPU slots (jobs/gpu_slots.py): real flock(2) locks held by real processes.

No GPU is needed: the machine's GPUs are named by CUDA_VISIBLE_DEVICES, which is what the slots
are taken from, and the "ranks" are shells started by `scalestudy launch` through --rank-prefix
that record the environment they were given."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from workflow_helpers import need

from scalestudy import vocab
from scalestudy.errors import LaunchError
from scalestudy.jobs import gpu_slots

HOLD = textwrap.dedent(
    """
    import os, sys, time
    from scalestudy.jobs import gpu_slots
    env = {**os.environ}
    ids = gpu_slots.acquire(int(sys.argv[1]), env, poll_s=0.05)
    print(",".join(ids), flush=True)
    time.sleep(float(sys.argv[2]))
    """
)


def slot_env(tmp_path: Path, gpus: str) -> dict[str, str]:
    return {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": gpus,
        "SCALESTUDY_GPU_SLOTS_DIR": str(tmp_path / "slots"),
    }


def hold(env: dict[str, str], n: int, seconds: float) -> subprocess.Popen:
    """A process that takes n slots, prints them and keeps them for `seconds`."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(n), str(seconds)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc


def test_visible_gpus_are_cuda_visible_devices_entries():
    assert gpu_slots.visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 3"}) == ["2", "3"]
    uuid = "GPU-5ad8c3c4-0e5a-4b1e-9f1a-1c2b3d4e5f60"
    assert gpu_slots.visible_gpus({"CUDA_VISIBLE_DEVICES": uuid}) == [uuid]
    assert gpu_slots.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []


UUID = "GPU-5ad8c3c4-0e5a-4b1e-9f1a-1c2b3d4e5f60"
MIG = "MIG-5ad8c3c4-0e5a-4b1e-9f1a-1c2b3d4e5f61"


@pytest.mark.parametrize(
    ("value", "gpus"),
    [
        ("-1", []),  # the usual "no GPU"
        ("NoDevFiles", []),
        ("0,-1,1", ["0"]),  # CUDA stops at the first invalid entry
        ("1,,2", ["1"]),
        ("2,x,3", ["2"]),
        ("0,0", []),  # a repeated device: CUDA shows none
        ("1,01", []),
        ("01,2gpu", ["1", "2"]),  # read as strtoul: one GPU, one slot name
        (f"{UUID},{MIG}", [UUID]),  # the first entry says the kind
        (f"{UUID},{UUID}", []),
        (f"{MIG},0", [MIG]),
    ],
)
def test_visible_gpus_are_what_cuda_makes_of_cuda_visible_devices(value, gpus):
    """Each entry was one GPU: '-1' and 'NoDevFiles' counted one, '0,-1,1' three, and '0,0'
    two, on which a 2-rank run waited forever for the second slot."""
    assert gpu_slots.visible_gpus({"CUDA_VISIBLE_DEVICES": value}) == gpus


def test_a_run_wider_than_the_machine_is_refused_in_one_line():
    four = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert gpu_slots.refusal([1, 2, 4], ["0", "1", "2", "3"], four) == ""
    line = gpu_slots.refusal([1, 8], ["0", "1"], {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert "\n" not in line
    assert "needs 8 GPUs" in line and "shows 2" in line and "families.*.gpus" in line
    assert "(CUDA_VISIBLE_DEVICES='0,1')" in line
    # the variable unset: the GPUs are those torch counts, and the line says so
    line = gpu_slots.refusal([2], ["0"], {})
    assert "needs 2 GPUs" in line and "(CUDA_VISIBLE_DEVICES is unset and torch counts 1)" in line
    with pytest.raises(LaunchError, match="needs 3 GPUs"):
        gpu_slots.acquire(3, {"CUDA_VISIBLE_DEVICES": "0,1"})


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({}, "CUDA_VISIBLE_DEVICES is unset and torch counts 0"),
        ({"CUDA_VISIBLE_DEVICES": ""}, "CUDA_VISIBLE_DEVICES=''"),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, "CUDA_VISIBLE_DEVICES='-1'"),
    ],
)
def test_no_gpu_at_all_is_said_so_not_lower_the_world_sizes_to_zero(env, said):
    """`launch -- --device cuda` on a machine showing no GPU said "a run of this study needs 1
    GPUs ... shows 0 (CUDA_VISIBLE_DEVICES=(none)) ... lower the study's world sizes to at most
    0", with the variable unset."""
    line = gpu_slots.refusal([1], [], env)
    assert line == (
        f"no CUDA GPU is visible on this machine ({said}), and a cuda run of 1 rank needs 1 GPU: "
        "use --device cpu (a study: hardware.device cpu), or run it on a GPU node"
    )
    assert "2 ranks needs 2 GPUs" in gpu_slots.refusal([1, 2], [], env)


def test_a_cuda_launch_without_a_visible_gpu_is_that_one_line(tmp_path):
    """By hand, as the audit found it: the rank is never started."""
    env = {**slot_env(tmp_path, "-1"), "PATH": os.environ["PATH"]}
    env.pop("SLURM_JOB_ID", None)
    proc = subprocess.run(
        [sys.executable, "-m", "scalestudy", "launch", "--", "--device", "cuda", "--epochs", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "scalestudy launch: no CUDA GPU is visible on this machine (CUDA_VISIBLE_DEVICES='-1'), "
        "and a cuda run of 1 rank needs 1 GPU: use --device cpu (a study: hardware.device cpu), "
        "or run it on a GPU node"
    ]


def test_two_runs_get_different_gpus_and_a_third_waits_for_one(tmp_path):
    env = slot_env(tmp_path, "0,1")
    a, b = hold(env, 1, 3.0), hold(env, 1, 3.0)
    got = {a.stdout.readline().strip(), b.stdout.readline().strip()}
    assert got == {"0", "1"}  # never the same GPU twice
    started = time.monotonic()
    c = hold(env, 1, 0.0)
    assert c.stdout.readline().strip() in {"0", "1"}
    assert time.monotonic() - started > 1.0  # it waited until a or b exited
    for proc in (a, b, c):
        assert proc.wait(timeout=30) == 0


def test_slots_are_all_or_nothing_and_freed_when_the_holder_dies(tmp_path):
    env = slot_env(tmp_path, "0,1,2")
    one = hold(env, 1, 60.0)
    assert one.stdout.readline().strip() == "0"
    three = hold(env, 3, 0.0)  # needs every GPU: waits, holding none meanwhile
    two = hold(env, 2, 0.0)
    assert set(two.stdout.readline().strip().split(",")) == {"1", "2"}
    assert two.wait(timeout=30) == 0
    one.kill()  # a crashed run: the kernel drops its lock
    one.wait(timeout=30)
    assert three.stdout.readline().strip() == "0,1,2"
    assert three.wait(timeout=30) == 0


def test_launch_gives_the_ranks_a_free_gpu_and_holds_it_while_they_run(tmp_path):
    env = slot_env(tmp_path, "3,5")
    holder = hold(env, 1, 60.0)
    assert holder.stdout.readline().strip() == "3"
    seen, probe = tmp_path / "env.txt", tmp_path / "probe.txt"
    # the "rank" records its environment, then whether slot 5 is taken while it runs (a new
    # open file description conflicts with the one the rank inherited)
    script = tmp_path / "probe.py"
    script.write_text(
        "import fcntl, os\n"
        f"fd = os.open({str(tmp_path / 'slots' / 'gpu-5.lock')!r}, os.O_RDONLY)\n"
        "try:\n"
        "    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "    print('free')\n"
        "except BlockingIOError:\n"
        "    print('held')\n"
    )
    prefix = f"sh -c 'env > {seen}; {sys.executable} {script} > {probe}' sh"
    proc = subprocess.run(
        [sys.executable, "-m", "scalestudy", "launch", "--rank-prefix", prefix]
        + ["--", "--device", "cuda", "--epochs", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    holder.kill()
    holder.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr
    rank_env = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert rank_env["CUDA_VISIBLE_DEVICES"] == "5"
    assert probe.read_text().strip() == "held"
    assert "GPU slots: 5 of 3,5" in proc.stdout + proc.stderr
    # after the run the slot is free again
    assert gpu_slots.acquire(2, env) == ["3", "5"]


def test_mig_ids_with_slashes_are_slots_too(tmp_path):
    mig = "MIG-GPU-5ad8c3c4-0e5a-4b1e-9f1a-1c2b3d4e5f60/1/0"
    assert gpu_slots.acquire(1, slot_env(tmp_path, mig)) == [mig]
    assert [p.name for p in (tmp_path / "slots").glob("gpu-*")] == [
        "gpu-MIG-GPU-5ad8c3c4-0e5a-4b1e-9f1a-1c2b3d4e5f60_1_0.lock"
    ]


@pytest.mark.parametrize("name", ["allocate.lock", "gpu-0.lock"])
def test_a_lock_file_that_is_a_dangling_symlink_is_one_error_not_a_spin(tmp_path, name):
    """A link to nothing in the slot directory: opening it fails (no file), creating it too
    (the name exists), and _open_lock tried both again for ever, at 100% CPU, the slot's spin
    under the allocation lock, so every other launch on the machine waited behind it."""
    import multiprocessing

    env = slot_env(tmp_path, "0")
    (tmp_path / "slots").mkdir()
    (tmp_path / "slots" / name).symlink_to(tmp_path / "gone")
    with multiprocessing.get_context("fork").Pool(1) as pool:  # a spin fails the wait below
        result = pool.apply_async(_acquire_or_error, (env,))
        said = result.get(timeout=20)
    assert said.startswith(f"cannot lock GPU slots in {tmp_path / 'slots'} ({name} is a "), said
    assert f"symlink to missing {tmp_path / 'gone'}: remove it)" in said, said


def _acquire_or_error(env: dict) -> str:
    try:
        return f"acquired {gpu_slots.acquire(1, env)}"
    except gpu_slots.LaunchError as exc:
        return str(exc)


def test_the_lock_directory_is_shared_like_tmp(tmp_path):
    env = slot_env(tmp_path, "0")
    assert gpu_slots.acquire(1, env) == ["0"]
    assert (tmp_path / "slots").stat().st_mode & 0o7777 == 0o1777


def test_lock_files_are_readable_by_every_user_under_any_umask(tmp_path):
    """Under umask 077 the lock files were 0600: every other user of the machine got EACCES
    ("cannot lock GPU slots"), and could not delete them from the sticky directory."""
    old = os.umask(0o077)
    try:
        assert gpu_slots.acquire(1, slot_env(tmp_path, "0")) == ["0"]
    finally:
        os.umask(old)
    for name in ("gpu-0.lock", "allocate.lock"):
        assert (tmp_path / "slots" / name).stat().st_mode & 0o777 == 0o644, name


def test_an_unusable_lock_directory_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {"CUDA_VISIBLE_DEVICES": "0", "SCALESTUDY_GPU_SLOTS_DIR": str(blocker / "slots")}
    with pytest.raises(LaunchError, match="SCALESTUDY_GPU_SLOTS_DIR"):
        gpu_slots.acquire(1, env)


def test_cpu_runs_and_slurm_jobs_take_no_slots(tmp_path):
    env = slot_env(tmp_path, "0")
    holder = hold(env, 1, 60.0)
    assert holder.stdout.readline().strip() == "0"
    seen = tmp_path / "env.txt"
    try:
        # --device auto (the default) on a machine without a GPU is a CPU run too
        for device, visible in (("cpu", "0"), (None, "-1")):
            args = ["--device", device] if device else []
            proc = subprocess.run(
                [sys.executable, "-m", "scalestudy", "launch", "--rank-prefix"]
                + [f"sh -c 'env > {seen}' sh", "--", *args, "--epochs", "1"],
                env={**env, "CUDA_VISIBLE_DEVICES": visible},
                capture_output=True,
                text=True,
                timeout=30,  # would block (the only GPU is taken) if it asked for a slot
            )
            assert proc.returncode == 0, proc.stderr
            assert f"CUDA_VISIBLE_DEVICES={visible}\n" in seen.read_text()  # left as it was
    finally:
        holder.kill()
        holder.wait(timeout=30)


@pytest.mark.parametrize("device", [["--dev", "cuda"], ["--device", "auto"], [], ["--device=cuda"]])
def test_every_spelling_of_a_cuda_run_takes_a_slot(tmp_path, device):
    """Only `--device cuda` and `--device=cuda` took a slot: the trainer also reads `--dev cuda`
    (argparse's abbreviations) and trains on the GPU with --device auto, its default, so such
    runs shared GPUs. The rank records the CUDA_VISIBLE_DEVICES it was given."""
    seen = tmp_path / "env.txt"
    proc = subprocess.run(
        [sys.executable, "-m", "scalestudy", "launch", "--rank-prefix"]
        + [f"sh -c 'env > {seen}' sh", "--", *device, "--epochs", "1"],
        env=slot_env(tmp_path, "3,5"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "CUDA_VISIBLE_DEVICES=3\n" in seen.read_text()  # one slot, not both GPUs


@pytest.mark.parametrize("action", ["capture", "ncu"])
def test_profiling_jobs_take_gpu_slots_as_launch_does(tmp_path, monkeypatch, action):
    """`profile capture` and `profile ncu` started their ranks without a slot, beside training
    jobs that do not wait for them: on a workstation they profiled on a timed run's GPU. The
    ranks' command is replaced by a record of what they would get, and whether slot 5 is held
    while they run (a new open file description conflicts with the command's)."""
    from scalestudy import cli
    from scalestudy.jobs import ncu_kernels, profile
    from scalestudy.nsight import schema

    env = slot_env(tmp_path, "3,5")
    for key in ("CUDA_VISIBLE_DEVICES", "SCALESTUDY_GPU_SLOTS_DIR"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    holder = hold(env, 1, 60.0)  # a training run holds GPU 3
    assert holder.stdout.readline().strip() == "3"
    seen: dict = {}

    class Started(Exception):
        pass

    def ranks(argv, env, *_, **__):
        fd = os.open(tmp_path / "slots" / "gpu-5.lock", os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen["gpu 5"] = "free"
        except BlockingIOError:
            seen["gpu 5"] = "held"
        finally:
            os.close(fd)
        seen["CUDA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"]
        raise Started

    monkeypatch.setattr(profile, "run_launch", ranks)
    monkeypatch.setattr(profile, "run_logged", ranks)
    monkeypatch.setattr(profile.shutil, "which", lambda name, *_, **__: f"/opt/bin/{name}")
    if action == "capture":
        argv = ["profile", "capture", "--tool", "torch", "--out", str(tmp_path / "cap")]
    else:
        table = Path(__file__).parent / "fixtures" / "profile_kernels.csv"
        kernels = tmp_path / "ncu_kernels.json"  # what `profile ncu-kernels` makes of it
        chosen = ncu_kernels.candidates(schema.read_csv(table, schema.KERNEL_COLUMNS))
        kernels.write_text(json.dumps(chosen))
        argv = ["profile", "ncu", "--kernels", str(kernels), "--out-dir", str(tmp_path / "n")]
    argv += ["--run", "r", "--device", "cuda", "--", "--device", "cuda", "--epochs", "1"]
    argv += ["--profile-steps", "0:1"]  # the window profile capture and ncu require
    try:
        with pytest.raises(Started):
            profile.run(cli.build_parser(argv).parse_args(argv))
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert seen == {"gpu 5": "held", "CUDA_VISIBLE_DEVICES": "5"}


def test_onstart_does_not_judge_this_host_inside_a_slurm_allocation(monkeypatch):
    """The Snakefile's onstart refused, inside salloc, what `scalestudy launch` starts there with
    srun on the allocation's nodes: a GPU study from salloc's shell on a host without CUDA, and
    a 2-node run wider than this host's 4 GPUs. Outside an allocation both stand."""
    import torch

    sizes, four, demo = [1, 8], {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "config/demo.yaml"
    for cuda in (False, True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        assert gpu_slots.host_refusal(sizes, "cuda", {**four, "SLURM_JOB_ID": "4242"}, demo) == ""
        assert gpu_slots.host_refusal(sizes, "cpu", four, demo) == ""
        line = gpu_slots.host_refusal(sizes, "cuda", four, demo)
        if cuda:
            assert line == gpu_slots.refusal(sizes, ["0", "1", "2", "3"], four) != ""
        else:
            assert "has no CUDA device" in line and "--configfile config/demo.yaml" in line
    assert gpu_slots.host_refusal([4], "cuda", four, demo) == ""  # fits (torch: a GPU)
    # a run wider than one node outside an allocation: refused, after the missing CUDA (a
    # laptop's user running the paper study was told about Slurm, not about the CPU demo)
    wide = "1 run(s) need more than one node"
    assert gpu_slots.host_refusal(sizes, "cpu", four, demo, wide) == wide
    assert gpu_slots.host_refusal(sizes, "cuda", four, demo, wide) == wide  # CUDA: True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "has no CUDA device" in gpu_slots.host_refusal(sizes, "cuda", four, demo, wide)


def test_onstart_inside_an_srun_step_refuses_what_launch_refuses_there(monkeypatch):
    """snakemake typed in `srun --pty bash` (a task of step 0): the onstart skipped judging
    the host (SLURM_JOB_ID set), yet launch starts no run wider than one rank there (a nested
    srun would wait forever), nor one rank of a step of several tasks: every job of the study
    failed in turn, each retried checkpointing.retries times. Now onstart refuses with
    launch's own line; the one-rank runs are judged on the step's own GPUs."""
    import torch

    demo = "config/demo.yaml"
    step = {"SLURM_JOB_ID": "123", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "1"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for device in ("cpu", "cuda"):
        env = {**step, "CUDA_VISIBLE_DEVICES": "0"}
        line = gpu_slots.host_refusal([1, 2, 4], device, env, demo)
        assert line == gpu_slots.step_refusal(4, env), line  # the widest run's
        assert "this run needs 4 ranks, and this shell is already a task of step 0" in line
        assert gpu_slots.host_refusal([1], device, env, demo) == ""  # its one task: it runs
        several = {**env, "SLURM_NTASKS": "2", "SLURM_PROCID": "1"}
        assert "task 1 of the 2 tasks of step 0" in gpu_slots.host_refusal(
            [1], device, several, demo
        )
    # the one-rank cuda runs on the step's GPUs: none visible is refused as on a plain host
    none = {**step, "CUDA_VISIBLE_DEVICES": ""}
    assert "no CUDA GPU is visible" in gpu_slots.host_refusal([1], "cuda", none, demo)
    # salloc's shell (no step, or its interactive step): not judged, launch srun's the ranks
    for env in ({"SLURM_JOB_ID": "123"}, {**step, "SLURM_STEP_ID": vocab.SLURM_INTERACTIVE_STEP}):
        assert (
            gpu_slots.host_refusal([1, 4], "cuda", {**env, "CUDA_VISIBLE_DEVICES": ""}, demo) == ""
        )


LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from pathlib import Path
    from scalestudy.jobs import launch
    env = dict(os.environ)
    launch.hold_local_gpus(env, 2, ["--device", "cuda"])
    # a rank as torchrun starts one: no descriptor inherited (close_fds); rank 1 of 2, whose
    # refused --data-dir keeps it alive for the report grace, holding what train.run took
    rank_env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                "SCALESTUDY_REPORT_GRACE_S": "60"}
    rank = subprocess.Popen([sys.executable, "-m", "scalestudy", "train", *sys.argv[1:]],
                            env={**env, **rank_env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # our pipes would outlive us
    slots = {str(p) for p in Path(env["SCALESTUDY_GPU_SLOTS_DIR"]).glob("gpu-*.lock")}

    def opened():
        try:
            return {os.readlink(fd) for fd in Path(f"/proc/{rank.pid}/fd").iterdir()}
        except OSError:  # a descriptor closed meanwhile
            return set()

    end = time.monotonic() + 20
    while time.monotonic() < end and rank.poll() is None and not slots <= opened():
        time.sleep(0.05)  # until the rank holds both slots
    print(rank.pid, flush=True)
    os._exit(0)  # the launcher (torchrun) killed; its rank trains on
    """
)


def test_the_ranks_hold_the_slots_when_the_launcher_is_gone(tmp_path):
    """With 2+ local ranks launch execs torchrun, whose ranks inherit no descriptor: the slots
    were held by torchrun alone, so killing it freed the GPUs its ranks still trained on. Each
    rank now holds them too (a shared lock on the files SCALESTUDY_GPU_SLOT_LOCKS names)."""
    env = slot_env(tmp_path, "0,1")
    env.pop("SLURM_JOB_ID", None)
    flags = ["--device", "cpu", "--data-dir", str(tmp_path / "no-data"), "--out", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCHER, *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    rank = int(proc.stdout.split()[-1])
    slots = [tmp_path / "slots" / f"gpu-{gpu}.lock" for gpu in ("0", "1")]

    def free() -> list[bool]:
        result = []
        for path in slots:
            fd = os.open(path, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a second run tries
                result.append(True)
            except BlockingIOError:
                result.append(False)
            finally:
                os.close(fd)
        return result

    try:
        assert Path(f"/proc/{rank}").exists()
        assert free() == [False, False]  # the launcher is gone, its rank holds both
    finally:
        os.kill(rank, 9)
    end = time.monotonic() + 10
    while any(not f for f in free()) and time.monotonic() < end:
        time.sleep(0.05)
    assert free() == [True, True]  # the last holder gone: the kernel freed them


def test_a_slot_the_rank_cannot_hold_is_one_line_not_fatal(tmp_path):
    """files.hold_shared_locks (each rank, at start): a slot another run holds exclusively, or
    a lock file not there (a container without the lock directory), is a line each."""
    from scalestudy import files

    taken, held, gone = (tmp_path / n for n in ("taken.lock", "held.lock", "gone.lock"))
    taken.write_text("")
    held.write_text("")
    other = os.open(taken, os.O_RDONLY)
    fcntl.flock(other, fcntl.LOCK_EX)
    try:
        problems = files.hold_shared_locks(os.pathsep.join(map(str, (taken, held, gone))))
    finally:
        os.close(other)
    assert problems == [f"{taken}: locked by another run", f"{gone}: No such file or directory"]
    fd = os.open(held, os.O_RDONLY)
    with pytest.raises(BlockingIOError):  # held by this process until it exits
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)
    assert files.hold_shared_locks("") == []


# tests/stand-ins/nvidia-smi: CANNED GPUs (NVIDIA_SMI_STAND_IN_GPUS), no driver, no GPU
NVIDIA_SMI = Path(__file__).parent / "stand-ins" / "nvidia-smi"
UUIDS = ("GPU-8f3e1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5b", "GPU-1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d")
H100 = "NVIDIA H100 80GB HBM3"


def smi_env(tmp_path: Path, gpus: str, names: tuple[str, str] = (H100, H100)) -> dict[str, str]:
    """slot_env with the nvidia-smi stand-in first on PATH, listing two GPUs (index, UUID, name)
    in the PCI bus order nvidia-smi reports, and CUDA's default device order."""
    env = slot_env(tmp_path, gpus)
    env["PATH"] = f"{NVIDIA_SMI}{os.pathsep}{env['PATH']}"
    env["NVIDIA_SMI_STAND_IN_GPUS"] = ";".join(
        f"{i},{uuid},{name}" for i, (uuid, name) in enumerate(zip(UUIDS, names, strict=True))
    )
    env.pop("CUDA_DEVICE_ORDER", None)
    env.pop("SLURM_JOB_ID", None)
    return env


def test_a_gpu_named_by_index_and_by_uuid_is_one_slot(tmp_path):
    """The slot was keyed by the name CUDA_VISIBLE_DEVICES gives the GPU: a study with '0,1' took
    gpu-0.lock and one with the UUIDs took gpu-GPU-8f3e....lock for the same GPU 0, so both
    trained on it, each reporting a fraction of its throughput. Both are now its UUID's slot
    (nvidia-smi's index -> uuid), and an abbreviated UUID, which CUDA accepts, is too."""
    by_index = hold(smi_env(tmp_path, "0,1"), 1, 60.0)
    try:
        assert by_index.stdout.readline().strip() == "0"
        by_uuid = hold(smi_env(tmp_path, ",".join(UUIDS)), 1, 60.0)
        try:
            assert by_uuid.stdout.readline().strip() == UUIDS[1]  # GPU 0 is taken
            slots = tmp_path / "slots"
            assert sorted(p.name for p in slots.glob("gpu-*")) == sorted(
                f"gpu-{uuid}.lock" for uuid in UUIDS
            )
            # the launch's ranks see the GPU as the study names it, and hold its UUID's slot
            seen = tmp_path / "env.txt"
            by_uuid.kill()
            by_uuid.wait(timeout=30)
            proc = subprocess.run(
                [sys.executable, "-m", "scalestudy", "launch", "--rank-prefix"]
                + [f"sh -c 'env > {seen}' sh", "--", "--device", "cuda", "--epochs", "1"],
                env=smi_env(tmp_path, f"{UUIDS[0][:12]},{UUIDS[1][:12]}"),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert proc.returncode == 0, proc.stderr
            lines = seen.read_text().splitlines()
            rank_env = dict(line.split("=", 1) for line in lines if "=" in line)
            assert rank_env["CUDA_VISIBLE_DEVICES"] == UUIDS[1][:12]
            assert rank_env["SCALESTUDY_GPU_SLOT_LOCKS"] == str(slots / f"gpu-{UUIDS[1]}.lock")
        finally:
            by_uuid.kill()
            by_uuid.wait(timeout=30)
    finally:
        by_index.kill()
        by_index.wait(timeout=30)


def test_where_no_uuid_is_known_a_gpu_is_keyed_by_its_name_and_the_line_says_why(tmp_path):
    """CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, nvidia-smi by PCI
    bus: on GPUs of different models index 0 may be two different GPUs, and keying it by the
    wrong UUID would let two runs share one. There, and without a working nvidia-smi, the old
    keys (the name as written) stay, and the reason is said."""
    mixed = smi_env(tmp_path, "0,1", names=(H100, "NVIDIA RTX A2000"))
    keys, why = gpu_slots.slot_keys(mixed, ["0", "1"])
    assert keys == ["0", "1"]
    assert "CUDA_DEVICE_ORDER=FASTEST_FIRST on GPUs of different models" in why
    # UUIDs need no order
    assert gpu_slots.slot_keys(mixed, [UUIDS[1][:8]]) == ([UUIDS[1]], "")
    assert gpu_slots.slot_keys({**mixed, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, ["1", "0"]) == (
        [UUIDS[1], UUIDS[0]],
        "",
    )
    same = smi_env(tmp_path, "0,1")
    # an index nvidia-smi does not list, and an abbreviation naming both GPUs, are not guessed
    assert gpu_slots.slot_keys(same, ["0", "7"]) == (
        [UUIDS[0], "7"],
        "nvidia-smi lists no GPU 7",
    )
    assert gpu_slots.slot_keys(same, ["GPU-"])[0] == ["GPU-"]
    mig = "MIG-5ad8c3c4-0e5a-4b1e-9f1a-1c2b3d4e5f61"
    assert gpu_slots.slot_keys(same, [mig]) == ([mig], "")  # an instance is its own slot
    failing = {**same, "NVIDIA_SMI_STAND_IN_FAIL": "NVIDIA-SMI has failed because it couldn't"}
    keys, why = gpu_slots.slot_keys(failing, ["0"])
    assert keys == ["0"]
    assert why == "nvidia-smi failed: exit 9: NVIDIA-SMI has failed because it couldn't"
    assert gpu_slots.slot_keys({"PATH": str(tmp_path)}, ["0"]) == (["0"], "nvidia-smi is absent")
    # the launch's line says it
    proc = subprocess.run(
        [sys.executable, "-m", "scalestudy", "launch", "--rank-prefix", "true", "--"]
        + ["--device", "cuda", "--epochs", "1"],
        env=mixed,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout + proc.stderr
    assert "GPU slots: 0 of 0,1 (" in said
    assert "; keyed by name as written: CUDA_DEVICE_ORDER=FASTEST_FIRST on GPUs" in said


def test_a_gpu_run_started_directly_in_a_slurm_step_takes_a_slot_of_the_steps_gpus(tmp_path):
    """snakemake (local executor) in `srun --pty bash` with 4 GPUs: a 1-rank run starts
    directly in that step (launch.build_command), and every one of them trained on the step's
    first GPU, each measuring a share of it. They take GPU slots of the step's GPUs (by UUID:
    other jobs' GPUs on the node are other slots)."""
    env = {**slot_env(tmp_path, "3,5"), "SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0"}
    holder = hold(env, 1, 60.0)
    assert holder.stdout.readline().strip() == "3"
    seen = tmp_path / "env.txt"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "scalestudy", "launch", "--rank-prefix"]
            + [f"sh -c 'env > {seen}' sh", "--", "--device", "cuda", "--epochs", "1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "CUDA_VISIBLE_DEVICES=5\n" in seen.read_text()  # the free one, not both


@pytest.fixture
def protected_regular():
    """fs.protected_regular=1 (systemd's default since v241) for the test: no O_CREAT open of
    another user's file in a sticky, world-writable directory unless the directory's owner
    owns it, root included. Skipped where this process cannot set it (not root, read-only
    /proc/sys) or the kernel does not enforce it (checked on a file of uid 65534)."""
    knob = Path("/proc/sys/fs/protected_regular")
    try:
        old = knob.read_text()
        knob.write_text("1")
    except OSError as exc:
        need(f"a writable {knob}", f"run the tests as root, /proc/sys writable (CI): {exc}")
    try:
        yield
    finally:
        knob.write_text(old)


def test_a_lock_file_another_user_made_can_be_locked_under_protected_regular(
    tmp_path, protected_regular
):
    """The lock files were opened with O_CREAT, which protected_regular refuses for a file of
    another user in the sticky lock directory: once a second user had taken a GPU, its slot
    was "cannot lock GPU slots (Permission denied)" for everyone else, for good."""
    env = slot_env(tmp_path, "0")
    directory = tmp_path / "slots"
    directory.mkdir(mode=0o1777)
    directory.chmod(0o1777)
    for path in (gpu_slots.slot_file(directory, "0"), directory / "allocate.lock"):
        path.touch()
        os.chown(path, 65534, 65534)  # another user's (nobody's)
    try:
        os.close(os.open(directory / "allocate.lock", os.O_RDONLY | os.O_CREAT))
    except PermissionError:
        pass
    else:
        pytest.skip("this kernel does not enforce fs.protected_regular")
    assert gpu_slots.acquire(1, env) == ["0"]
