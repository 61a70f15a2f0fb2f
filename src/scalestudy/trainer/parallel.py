"""How the ranks share the model: DDP, FSDP2 or a hand-written flat all-reduce.

`wrap_model` returns the wrapped model and a `no_sync()` context (gradient accumulation without
synchronisation); `allreduce_gradients` is the baseline strategy's synchronisation, called by the
training loop after backward. `param_checksum` proves the ranks hold the same weights.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from scalestudy.trainer.config import POWERSGD_START_ITER, TrainConfig

# No broadcast of the BN buffers from rank 0 in every forward: on an H200 that was a collective,
# a flatten, an unflatten and 60 copies per step (torch.profiler, docs/benchmarks.md). Training
# never reads the running statistics (train-mode BN normalises with the batch's); evaluation
# broadcasts them from rank 0 once (sync_buffers), as for the other strategies, so rank 0's
# statistics, and the evaluation, are what the per-step broadcast gave. torch 2.14 names the
# switch forward_sync_buffers (broadcast_buffers is deprecated there); torch 2.11 (the GPU node
# of 2026-11) knows only broadcast_buffers.
NO_FORWARD_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
    else {"broadcast_buffers": False}
)


def wrap_model(model: torch.nn.Module, cfg: TrainConfig, device: torch.device):
    """Wrap for the strategy; returns (model, no_sync) where no_sync() skips gradient sync."""
    if cfg.strategy == "ddp":
        ddp = DDP(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=cfg.bucket_cap_mb,  # MiB of gradients per all-reduce
            gradient_as_bucket_view=True,  # grads alias the buckets: no extra copy
            # static_graph records the first iteration; if that runs under no_sync (gradient
            # accumulation) the reducer asserts (torch 2.14: "expect_autograd_hooks_"), so the
            # static graph is used only without accumulation (metrics: ddp_static_graph)
            static_graph=ddp_static_graph(cfg),
            **NO_FORWARD_BUFFER_SYNC,
        )
        register_comm_hook(ddp, cfg.comm_hook)
        return ddp, ddp.no_sync
    if cfg.strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for module in model.modules():  # shard every residual block, then the root
            if module.__class__.__name__ == "BasicBlock":
                fully_shard(module)
        fully_shard(model)

        @contextlib.contextmanager
        def fsdp_no_sync():
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

        return model, fsdp_no_sync
    # allreduce: no wrapper; same start everywhere, gradients averaged by allreduce_gradients()
    for tensor in model.state_dict().values():
        dist.broadcast(tensor, src=0)
    return model, contextlib.nullcontext


def ddp_static_graph(cfg: TrainConfig) -> bool:
    return cfg.strategy == "ddp" and cfg.static_graph and cfg.accum_steps == 1


def grad_sync(model: torch.nn.Module, cfg: TrainConfig) -> dict:
    """metrics.json's param_count and grad_sync_bytes (defined in train.py's docstring)."""
    params = [p for p in model.parameters() if p.requires_grad]
    count = sum(p.numel() for p in params)  # an FSDP2 DTensor's numel is the full tensor's
    return {"param_count": count, "grad_sync_bytes": _sync_bytes(params, count, cfg)}


def _sync_bytes(params: list, count: int, cfg: TrainConfig) -> int | None:
    if cfg.strategy == "fsdp" or cfg.comm_hook == "powersgd":
        return None  # reduce-scatter + all-gather / low-rank factors: not one all-reduce of P
    if cfg.comm_hook in ("fp16", "bf16"):
        return count * 2  # the hook casts each bucket to 16 bits before its all-reduce
    # gradients have their parameter's dtype (fp32 under autocast too): DDP's buckets and the
    # flat all-reduce move them as they are
    return sum(p.numel() * p.element_size() for p in params)


# PowerSGD's uncompressed steps before it compresses: trainer/config.py (the study checks it too)


def register_comm_hook(ddp: DDP, hook: str) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    if hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif hook == "powersgd":
        # rank-1 approximation after POWERSGD_START_ITER uncompressed steps
        state = powersgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=1,
            start_powerSGD_iter=POWERSGD_START_ITER,
        )
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)


def allreduce_gradients(model: torch.nn.Module, world_size: int) -> None:
    """The hand-written baseline: one flat all-reduce of every gradient after backward."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world_size
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


@torch.no_grad()
def param_checksum(model: torch.nn.Module) -> str:
    """sha256 of all parameters (FSDP shards gathered), to prove the ranks agree bit for bit."""
    h = hashlib.sha256()
    for p in model.parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p  # FSDP2 DTensor
        h.update(full.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def sync_buffers(model: torch.nn.Module) -> None:
    """BN running statistics from rank 0, before each evaluation (every strategy: the ranks'
    statistics drift apart during the epoch, each from its own batches)."""
    for buf in model.buffers():
        dist.broadcast(buf, src=0)
