"""DDP's BN buffers on real gloo ranks: no broadcast in the training step, rank 0's statistics
on every rank before evaluation (parallel.wrap_model, sync_buffers)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from scalestudy.trainer.config import TrainConfig
from scalestudy.trainer.dist import free_port
from scalestudy.trainer.models import build_model
from scalestudy.trainer.parallel import sync_buffers, wrap_model

STEPS = 3


def _flat_buffers(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([b.detach().double().flatten() for b in model.buffers()])


def _entry(rank: int, world: int, port: int, results) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    torch.manual_seed(0)  # the same initial weights and buffers on both ranks
    model = build_model("resnet18", num_classes=10, width=4, in_channels=3)
    ddp, _ = wrap_model(model, TrainConfig(strategy="ddp"), torch.device("cpu"))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches

    def step() -> None:
        x = torch.randn(8, 3, 32, 32, generator=data)
        y = torch.randint(0, 10, (8,), generator=data)
        F.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # DDP broadcasts its rebuilt bucket order once: in the second step, with static_graph (on
    # by default) in the third
    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS):
            step()
    ops = {e.key for e in prof.key_averages()}
    before = _flat_buffers(model)
    gathered = [torch.zeros_like(before) for _ in range(world)]
    dist.all_gather(gathered, before)
    sync_buffers(model)
    after = [torch.zeros_like(before) for _ in range(world)]
    dist.all_gather(after, _flat_buffers(model))
    results[rank] = {
        "broadcasts": sorted(op for op in ops if "broadcast" in op.lower()),
        "allreduces": sorted(op for op in ops if "allreduce" in op.lower().replace("_", "")),
        "differ_before": not torch.equal(gathered[0], gathered[1]),
        "same_after": torch.equal(after[0], after[1]),
        "after_is_rank0s": torch.equal(after[rank], gathered[0]),
    }
    dist.destroy_process_group()


def test_ddp_steps_broadcast_no_buffers_and_evaluation_gets_rank_0s():
    """On an H200 DDP's per-step buffer broadcast was a collective and 60 copies per step; BN
    in training mode never reads the running statistics, so none is broadcast in a step. Each
    rank's statistics then come from its own batches (they differ), and sync_buffers, before
    every evaluation, gives every rank rank 0's, as the per-step broadcast left them."""
    results = mp.Manager().dict()
    mp.spawn(_entry, args=(2, free_port(), results), nprocs=2)
    for rank in (0, 1):
        r = results[rank]
        assert r["broadcasts"] == [], r  # no broadcast in the training steps
        assert r["allreduces"], r  # while the gradients were all-reduced (the profiler sees c10d)
        assert r["differ_before"] and r["same_after"] and r["after_is_rank0s"], r
