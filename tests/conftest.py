"""Shared fixtures: a small synthetic dataset and real multi-process runs of the trainer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from workflow_helpers import child_env, need

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable

# scripts/test.sh runs the suite in 2 processes (pytest-xdist), a file at a time: the longest
# files start first, so that neither process is left with one at the end while the other idles
# (docs/benchmarks.md, one process at 972477c: tests/slurm/ ~6 min with its cluster's start,
# test_workflow 254 s, test_checkpoint 220 s, test_trainer 153 s, test_profiling 131 s,
# test_progress 124 s; the other 39 files 778 s)
LONGEST_FIRST = (
    "tests/slurm/",
    "tests/test_workflow.py",
    "tests/test_checkpoint.py",
    "tests/test_trainer.py",
    "tests/test_profiling.py",
    "tests/test_progress.py",
)


def _unit(nodeid: str) -> str:
    """The tests one process runs together: those of one file, and every test of the one local
    Slurm cluster (tests/slurm/), which one session starts, resizes and stops."""
    path = nodeid.split("::", 1)[0]
    return LONGEST_FIRST[0] if path.startswith(LONGEST_FIRST[0]) else path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (a stable sort: each file's own order stays)."""
    rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_unit(item.nodeid), len(rank)))


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: absent without -n
def pytest_xdist_make_scheduler(config, log):
    """Hand out whole units (_unit) in collection order. (`--dist loadgroup` would group by
    markers, but xdist 3.8 sets a node id that pytest 9 no longer reads; `--dist loadfile`
    would split tests/slurm/ across both processes, and both would start the one cluster.)"""
    from xdist.scheduler import LoadScopeScheduling

    class WholeUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    config.option.loadscopereorder = False  # xdist would sort by test count, not by time
    return WholeUnits(config, log)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """A learnable synthetic dataset, made once per session by the real CLI."""
    d = tmp_path_factory.mktemp("data")
    subprocess.run(
        [
            PYTHON,
            "-m",
            "scalestudy",
            "prepare-data",
            "--dataset",
            "synthetic",
            "--data-dir",
            str(d),
            "--num-train",
            "1024",
            "--num-test",
            "300",
        ],
        check=True,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return d


# flags of a tiny but real run: ResNet-18 at width 4, a few dozen steps
SMALL = [
    "--dataset",
    "synthetic",
    "--model",
    "resnet18",
    "--width",
    "4",
    "--epochs",
    "2",
    "--local-batch",
    "32",
    "--warmup-steps",
    "2",
    "--comm-probe-steps",
    "2",
    "--pg-timeout-s",
    "60",
]


def train(
    data_dir: Path, out: Path, *flags: str, nproc: int = 2, timeout: int = 600, check: bool = True
) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node=N -m scalestudy train ...` (1 process: no launcher)."""
    launcher = [PYTHON, "-m", "scalestudy", "train"]
    if nproc > 1:
        launcher = [
            PYTHON,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            "-m",
            "scalestudy",
            "train",
        ]
    cmd = [*launcher, *SMALL, *flags, "--data-dir", str(data_dir), "--out", str(out)]
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"train failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def read_metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def read_epochs(out: Path) -> list[dict]:
    import csv

    with (out / "epochs.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory) -> Path:
    """The tiny study (workflow_helpers.TINY) run to the end by the local executor."""
    from workflow_helpers import TINY, copy_repo, snakemake, write_config

    work = copy_repo(tmp_path_factory.mktemp("wf"))
    write_config(work / "tiny.yaml", TINY)
    snakemake(work, "--configfile", "tiny.yaml", "--cores", "2", stand_ins=True)
    return work


@pytest.fixture
def one_rank_group(tmp_path):
    """A real 1-rank gloo process group in this test's process (DDP, FSDP2 and DCP need one)."""
    import torch.distributed as dist

    store = f"file://{tmp_path / 'pg-store'}"
    dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def tiny_fs(tmp_path):
    """A real 1 MiB tmpfs: writes beyond it fail with ENOSPC, remounted read-only with EROFS."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        need("a tmpfs mounted", f"run as root ({proc.stderr.strip()})")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)
