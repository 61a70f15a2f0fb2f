"""Which device and backend a rank takes (trainer/train.py pick_device, pick_backend).

There is no GPU here: `StandInCuda` answers torch.cuda's three questions (is_available,
device_count, set_device) as a node with N visible GPUs would. The real path on a GPU node is the
same pick_device; `scalestudy gpu-check` runs it there."""

from __future__ import annotations

import socket

import pytest
import torch

from scalestudy.errors import TrainingError
from scalestudy.trainer.config import TrainConfig
from scalestudy.trainer.dist import DistEnv
from scalestudy.trainer.train import pick_backend, pick_device


class StandInCuda:
    def __init__(self, visible: int) -> None:
        self.visible, self.current = visible, None

    def install(self, monkeypatch) -> StandInCuda:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: self.visible > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.visible)
        monkeypatch.setattr(torch.cuda, "set_device", lambda i: setattr(self, "current", i))
        return self


def rank(local_rank: int, local_world_size: int = 4) -> DistEnv:
    return DistEnv("srun", local_rank, 4, local_rank, local_world_size, 0, 1, "h", 1)


def test_one_visible_gpu_is_cuda0_for_every_local_rank(monkeypatch):
    """Sites that bind one GPU per task (--gpus-per-task=1) show each rank a single device."""
    cuda = StandInCuda(visible=1).install(monkeypatch)
    assert pick_device(TrainConfig(device="cuda"), rank(3)) == torch.device("cuda", 0)
    assert cuda.current == 0


def test_several_visible_gpus_are_picked_by_local_rank(monkeypatch):
    cuda = StandInCuda(visible=4).install(monkeypatch)
    assert pick_device(TrainConfig(), rank(2)) == torch.device("cuda", 2)
    assert cuda.current == 2


def test_a_local_rank_beyond_the_visible_gpus_names_the_numbers(monkeypatch):
    StandInCuda(visible=2).install(monkeypatch)
    with pytest.raises(TrainingError) as e:
        pick_device(TrainConfig(device="cuda"), rank(3))
    msg = str(e.value)
    assert "local rank 3 needs GPU 3 but only 2 GPUs are visible" in msg
    assert socket.gethostname() in msg and "--ntasks-per-node" in msg


def test_device_cuda_without_cuda_names_host_and_the_check(monkeypatch):
    StandInCuda(visible=0).install(monkeypatch)
    with pytest.raises(TrainingError) as e:
        pick_device(TrainConfig(device="cuda"), rank(0))
    assert f"torch.cuda.is_available() is False on {socket.gethostname()}" in str(e.value)
    # auto never fails: it is the bare command line's CPU fallback
    assert pick_device(TrainConfig(device="auto"), rank(0)) == torch.device("cpu")


@pytest.mark.parametrize(
    "backend, device, expected",
    [
        ("auto", "cuda", "nccl"),
        ("auto", "cpu", "gloo"),
        ("gloo", "cuda", "gloo"),  # ranks sharing one GPU
        ("nccl", "cuda", "nccl"),
    ],
)
def test_backend(backend, device, expected):
    assert pick_backend(TrainConfig(backend=backend), torch.device(device)) == expected


def test_nccl_without_cuda_is_one_clear_error():
    with pytest.raises(TrainingError, match="--backend nccl needs CUDA.*use --backend gloo"):
        pick_backend(TrainConfig(backend="nccl"), torch.device("cpu"))


# what torch raises at DDP's first collective when two ranks share a GPU (torch's DistBackendError
# carries NCCL's ncclInvalidUsage and its "Last error:" line; NCCL 2.18-2.21 as reported)
NCCL_REFUSAL = (
    "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1333, invalid usage "
    "(run with NCCL_DEBUG=WARN for details), NCCL version 2.21.5\n"
    "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
    "Last error:\n"
    "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000"
)


@pytest.mark.parametrize("backend", ["auto", "nccl"])
def test_ranks_sharing_one_gpu_over_nccl_is_one_line_naming_gloo(monkeypatch, backend):
    """One visible GPU and several local ranks is a GPU bound to each task (NCCL works) or one
    GPU they share, which --backend auto also sent to NCCL: its refusal was a traceback on
    every rank, inside DDP. Now one line naming --backend gloo. Here every rank's set-up is
    a stand-in (no GPU, no process group) and the training raises NCCL's refusal."""
    from scalestudy.trainer import train as train_mod

    StandInCuda(visible=1).install(monkeypatch)
    monkeypatch.setattr(train_mod, "preflight", lambda cfg, denv: None)
    monkeypatch.setattr(train_mod, "preload_dynamo", lambda: None)
    picked = []
    monkeypatch.setattr(train_mod.sdist, "init_process_group", lambda d, b, t: picked.append(b))
    monkeypatch.setattr(train_mod.progress, "start", lambda *args: None)

    def ddp_refused(*args):
        raise torch.distributed.DistBackendError(NCCL_REFUSAL)

    monkeypatch.setattr(train_mod, "train", ddp_refused)
    with pytest.raises(TrainingError) as e:
        train_mod.main(TrainConfig(backend=backend), rank(1, local_world_size=2))
    assert picked == ["nccl"]
    message = str(e.value)
    assert "\n" not in message and "run them over --backend gloo" in message
    assert message.startswith(f"--backend {backend}")
    assert "(Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000)" in message
