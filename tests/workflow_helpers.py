"""Run snakemake on a copy of the repository and read its own dry-run job table; and the
helpers the tests share (a full disk at the n-th file a command writes: fsync_fails_at_file;
a group to share a file with: other_group)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
COPIED = (
    "workflow",
    "config",
    "containers",
    "profiles",
    "src",
    "pyproject.toml",
    "README.md",
)
STAND_INS = REPO / "tests" / "stand-ins"


def copy_repo(dest: Path) -> Path:
    """The workflow as a user has it (results, logs, caches left behind)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(
                src,
                dest / name,
                symlinks=True,  # workflow/profiles -> ../profiles stays a link, as in a clone
                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.sif"),
            )
        else:
            shutil.copy2(src, dest / name)
    return dest


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def child_env(**extra: str) -> dict[str, str]:
    """This environment for a child process: no launcher variables of the test runner leak into
    the ranks or jobs it starts; one intra-op thread; unbuffered output."""
    launcher = ("SLURM_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_", "GROUP_")
    e = {k: v for k, v in os.environ.items() if not k.startswith(launcher)}
    e.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    e.update(extra)
    return e


def env(stand_ins: bool = False, **extra: str) -> dict[str, str]:
    """child_env with this venv's bin (snakemake, scalestudy) first on PATH."""
    path = [str(BIN), os.environ.get("PATH", "")]
    if stand_ins:  # the Apptainer stand-in (tests/stand-ins/apptainer), clearly not the real one
        path.insert(0, str(STAND_INS))
    return child_env(**{"PATH": os.pathsep.join(path), **extra})


def snakemake(
    workdir: Path,
    *args: str,
    stand_ins: bool = False,
    timeout: int = 900,
    check: bool = True,
    extra_env: dict | None = None,
) -> subprocess.CompletedProcess:
    cmd = [str(BIN / "snakemake"), *args]
    proc = subprocess.run(
        cmd,
        cwd=workdir,
        env=env(stand_ins, **(extra_env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n"
            f"{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
        )
    return proc


def planned_jobs(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """Snakemake's 'Job stats' table of a dry-run: rule -> jobs that would run ({} if none)."""
    text = proc.stdout + proc.stderr
    if "Nothing to be done" in text:
        return {}
    m = re.search(r"Job stats:\n(.*?)\n\s*total\s+(\d+)", text, re.S)
    if not m:
        raise AssertionError(f"no job table in the dry-run output:\n{text[-4000:]}")
    jobs = {}
    for line in m.group(1).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            jobs[parts[0]] = int(parts[1])
    return jobs


# A tiny CPU study: synthetic data, 4 runs (one shared by three families), 1 epoch each, and the
# Apptainer stand-in, so the image is a real node of the DAG.
TINY = {
    "study": "tiny",
    "dataset": "synthetic",
    "synthetic": {"num_train": 256, "num_test": 64},
    "hardware": {
        "device": "cpu",
        "gpus_per_node": 2,
        "cpus_per_rank": 1,
        "mem_mb_per_rank": 500,
        "runtime_min": 5,
    },
    "train": {
        "width": 4,
        "epochs": 1,
        "local_batch": 32,
        "precision": "fp32",  # set: keys left out come from config/config.yaml (bf16)
        "target_acc": None,
        "warmup_steps": 1,
        "comm_probe_steps": 1,
        "num_workers": 0,
        "pg_timeout_s": 60,
    },
    "repeats": 1,
    "families": {
        "strong": {"enabled": True, "gpus": [1, 2], "global_batch": 64},
        "weak": {"enabled": True, "gpus": [1, 2], "local_batch": 32},
        "precision": {"enabled": True, "gpus": [1], "precisions": ["fp32"]},
        "bucket": {"enabled": True, "gpus": 2, "bucket_cap_mb": [1, 25], "local_batch": [32]},
    },
    "container": {"enabled": True},
    "profiling": {"enabled": False},  # profiling is tested in tests/test_profiling.py
    # judged at the strong family's 2 ranks (config/config.yaml's 8 is refused: no run there)
    "report": {"targets": {"strong_efficiency_gpus": 2}},
}
RUN_IDS = {
    "w1_lb32_fp32_ddp_bk25_r0",
    "w1_lb64_fp32_ddp_bk25_r0",
    "w2_lb32_fp32_ddp_bk1_r0",
    "w2_lb32_fp32_ddp_bk25_r0",
}


def fsync_fails_at_file(monkeypatch, n: int, error: int = errno.ENOSPC) -> list[str]:
    """os.fsync raises ENOSPC (or `error`: EIO, a failing disk) at the n-th regular file it
    syncs (a full disk found when the n-th output is written out: NFS, or a delayed
    allocation, reports it there); directories and the files before it sync as usual. Returns
    the files' names as they were synced."""
    real, synced = os.fsync, []

    def fsync(fd):
        if stat.S_ISREG(os.fstat(fd).st_mode):
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            if len(synced) == n:
                raise OSError(error, os.strerror(error))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def other_group() -> int:
    """A group this process may give its files and is not its own: any as root, else one of
    its supplementary groups."""
    if os.geteuid() == 0:
        return 4242 if os.getegid() != 4242 else 4243
    groups = [g for g in os.getgroups() if g != os.getegid()]
    if not groups:
        need("a second group of this user, or root", "run the tests as root (CI does)")
    return groups[0]


def need(what: str, fix: str) -> None:
    """Skip a test that needs `what`; under CI=true fail it: CI has it."""
    message = f"needs {what}: {fix}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def sigint_as_in_a_terminal() -> None:
    """A child's SIGINT as a terminal's foreground job has it (Popen's preexec_fn): a job
    started in the background by a non-interactive shell (CI's `nohup bash .ci/run &`) inherits
    SIGINT ignored, and Python then installs no KeyboardInterrupt, bash no default action, for
    it: a test's Ctrl-C stopped nothing (CI at 59ad3f5 and at 38e12ae)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def sighup_as_in_a_terminal() -> None:
    """A child's SIGHUP as a terminal's job has it (Popen's preexec_fn): CI's `nohup` starts
    the suite with SIGHUP ignored, which every child inherits, so a test's hang-up reached
    nothing (CI at f7fd002)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def process_state(pid: int) -> str:
    """The state of a process or thread from /proc/PID/stat: its third field, after "(comm)",
    which may hold spaces and parentheses ("R", "S", "T" stopped, "Z" ended, not reaped), or
    "gone" when there is none."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def running(pid: int) -> bool:
    """Process `pid` exists and is no zombie (one that ended, not yet reaped)."""
    return process_state(pid) not in ("gone", "Z")


def worker_pids(launcher_pid: int) -> dict[int, int]:
    """RANK -> pid of the worker processes of a torchrun agent (`scalestudy launch`'s local
    ranks: jobs/local_ranks.py), read from Linux /proc."""
    out = {}
    for child in Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split():
        try:
            env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError):  # a short-lived child gone: no rank
            continue
        for item in env:
            if item.startswith(b"RANK="):
                out[int(item[5:])] = int(child)
    return out
