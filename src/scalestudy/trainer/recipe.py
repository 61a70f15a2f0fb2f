"""The training recipe: SGD with Nesterov momentum (no weight decay on BN and biases), the linear
LR scaling rule with warm-up and a onecycle or cosine schedule (config.py), and a GradScaler that
is active only for fp16. On CUDA the SGD step is the fused kernel (fused_sgd says when and why).
Label smoothing is applied in the loss (loop.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from scalestudy.trainer.config import LR_REFERENCE_BATCH, TrainConfig


@dataclass
class Recipe:
    optimizer: torch.optim.SGD
    scheduler: torch.optim.lr_scheduler.LambdaLR  # stepped once per optimizer step
    scaler: torch.amp.GradScaler
    peak_lr: float  # cfg.lr scaled to the global batch


def build_recipe(
    model: torch.nn.Module,
    cfg: TrainConfig,
    device: torch.device,
    global_batch: int,
    steps_per_epoch: int,
    total_steps: int,
) -> Recipe:
    peak_lr = cfg.lr * global_batch / LR_REFERENCE_BATCH
    decay, no_decay = [], []
    for p in model.parameters():
        (no_decay if p.ndim <= 1 else decay).append(p)  # no weight decay on BN and biases
    optimizer = torch.optim.SGD(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=peak_lr,
        momentum=cfg.momentum,
        nesterov=cfg.momentum > 0,
        fused=fused_sgd(cfg, device),
    )
    warmup = warmup_steps(cfg, steps_per_epoch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, warmup, cfg.schedule)
    )
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.precision == "fp16")
    return Recipe(optimizer, scheduler, scaler, peak_lr)


def fused_sgd(cfg: TrainConfig, device: torch.device) -> bool:
    """The fused CUDA SGD kernel: one launch for all parameters, and with fp16 it takes the
    GradScaler's found_inf as a tensor, so scaler.step() does not sync the host every step
    (the non-fused path calls found_inf.item()). Not under FSDP2: torch 2.14 has no DTensor
    sharding rule for aten._fused_sgd_ (NotImplementedError), so FSDP keeps the foreach path
    (and, with fp16, that host sync; torch.distributed.tensor adds DTensor to the foreach
    types). Not on CPU: there torch takes the per-parameter (single-tensor) path (its foreach
    kernels are for CUDA), the one the tests verify bit for bit."""
    return device.type == "cuda" and cfg.strategy != "fsdp"


def warmup_steps(cfg: TrainConfig, steps_per_epoch: int) -> int:
    """Optimizer steps of the linear warm-up: --warmup-epochs of the run's epochs."""
    return round(cfg.warmup_epochs * steps_per_epoch)


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """LR multiplier: linear warm-up to 1, then onecycle (linear to 0) or cosine (to 0)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    if schedule == "onecycle":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
