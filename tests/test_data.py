"""trainer.loaders and trainer.prepare_data: sharding, augmentation, prepared format, downloads."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import gzip
import hashlib
import http.server
import io
import json
import os
import pickle
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torchvision.datasets.utils import extract_archive
from workflow_helpers import (
    REPO,
    child_env,
    fsync_fails_at_file,
    need,
    sighup_as_in_a_terminal,
    sigint_as_in_a_terminal,
)

from scalestudy import cli, vocab
from scalestudy.errors import ChecksumError, DownloadError, PreparedDataError, TrainConfigError
from scalestudy.trainer import dist as sdist
from scalestudy.trainer import loaders, prepare_data
from scalestudy.trainer.config import TrainConfig
from scalestudy.trainer.models import build_model
from scalestudy.trainer.train import preflight

# ------------------------------------------------------------------------------------------------
# epoch_batches / eval_indices
# ------------------------------------------------------------------------------------------------

CASES = [
    # (n, global_batch, world_size)
    (1000, 100, 4),  # R = 0
    (1002, 100, 4),  # 0 < R < world_size: the tail is dropped
    (1010, 100, 4),  # R >= world_size: the tail is dropped too
    (1013, 96, 8),  # R = 53
    (50, 64, 2),  # n < global_batch: a single small step takes all samples
    (99, 12, 3),  # R = 3 == world_size
    (101, 10, 1),  # single process
]


@pytest.mark.parametrize("n,gb,ws", CASES)
def test_epoch_batches_partition(n: int, gb: int, ws: int) -> None:
    per_rank = [loaders.epoch_batches(n, gb, ws, r, seed=3, epoch=1) for r in range(ws)]
    steps = {len(b) for b in per_rank}
    assert len(steps) == 1, f"unequal step counts {steps}"
    everything = torch.cat([torch.cat(b) for b in per_rank])
    assert everything.dtype == torch.int64
    used = everything.tolist()
    assert len(set(used)) == len(used), "a sample used twice in one epoch"
    full, rem = divmod(n, gb)
    # the rule: full steps only (the ragged tail is left out), unless there is no full step
    assert len(used) == (full * gb if full else n)
    assert len(per_rank[0]) == max(full, 1)
    # one input shape for every training step of a rank (no new shape inside the window)
    for r in range(ws):
        assert len({len(b) for b in per_rank[r]}) == 1, [len(b) for b in per_rank[r]]


def test_epoch_batches_leave_out_a_different_tail_each_epoch() -> None:
    n, gb, ws = 1010, 100, 2
    used = [
        set(
            torch.cat(
                [torch.cat(loaders.epoch_batches(n, gb, ws, r, 0, e)) for r in range(ws)]
            ).tolist()
        )
        for e in range(2)
    ]
    left_out = [set(range(n)) - u for u in used]
    assert [len(x) for x in left_out] == [10, 10]
    assert left_out[0] != left_out[1]
    assert used[0] | used[1] != used[0]  # epoch 2 trains on samples epoch 1 left out


def test_dataloader_drops_the_ragged_training_batch() -> None:
    x = torch.zeros(1010, 3, 8, 8, dtype=torch.uint8)
    y = torch.zeros(1010, dtype=torch.int64)
    common = dict(
        local_batch=100,
        world_size=2,
        rank=0,
        seed=0,
        mean=[0, 0, 0],
        std=[1, 1, 1],
        num_workers=0,
        pin_memory=False,
        persistent_workers=False,
        prefetch_factor=None,
    )
    train, _ = loaders.make_dataloader(x, y, train=True, **common)
    assert [len(b[1]) for b in train] == [100] * 5  # 505 per rank: the 5 left over are dropped
    evaluation, _ = loaders.make_dataloader(x, y, train=False, **common)
    assert sum(len(b[1]) for b in evaluation) == 505  # evaluation keeps every sample


@pytest.mark.parametrize(("n", "ws", "lb"), [(1023, 4, 128), (15, 4, 2), (7, 4, 4)])
def test_dataloader_takes_the_device_loaders_steps_without_repeats(n, ws, lb) -> None:
    """DistributedSampler's padding (drop_last=False) repeated samples for training: 1023
    images on 4 ranks of 128 were padded to 1024, two steps with sample 824 twice, where the
    device loader takes one step of 512 (train.py's floor(n / global_batch) x global_batch)."""
    x = torch.zeros(n, 3, 4, 4, dtype=torch.uint8)
    y = torch.arange(n)  # label = sample id
    kw = dict(local_batch=lb, world_size=ws, seed=0, mean=[0] * 3, std=[1] * 3, train=True)
    device = loaders.DeviceLoader(x, y, rank=0, device="cpu", **kw)
    seen, steps = [], set()
    for rank in range(ws):
        loader, sampler = loaders.make_dataloader(
            x, y, rank=rank, num_workers=0, pin_memory=False, persistent_workers=False,
            prefetch_factor=None, **kw,
        )  # fmt: skip
        sampler.set_epoch(0)
        batches = list(loader)
        steps.add(len(batches))
        seen += [i for _, yb in batches for i in yb.tolist()]
    assert steps == {device.steps_per_epoch}
    assert len(seen) == len(set(seen)), "a sample twice in one epoch"
    if n >= lb * ws:  # full steps: the very images per epoch of the device loader
        assert len(seen) == n // (lb * ws) * lb * ws


def test_dataloader_repeats_do_not_share_epoch_orders() -> None:
    """The study gives repeat r the seed train.seed + r and DistributedSampler shuffled with
    seed + epoch: repeat 1's epoch e was repeat 0's epoch e + 1, on every rank. Each rank still
    takes a disjoint shard of one permutation, so the sampler's seed is the same on every rank."""
    n, ws, lb = 256, 2, 16
    x = torch.zeros(n, 3, 4, 4, dtype=torch.uint8)
    y = torch.arange(n)  # label = sample id

    def order(seed: int, epoch: int, rank: int) -> list[int]:
        loader, sampler = loaders.make_dataloader(
            x, y, local_batch=lb, world_size=ws, rank=rank, seed=seed, train=True,
            mean=[0] * 3, std=[1] * 3, num_workers=0, pin_memory=False,
            persistent_workers=False, prefetch_factor=None,
        )  # fmt: skip
        sampler.set_epoch(epoch)
        return [i for _, yb in loader for i in yb.tolist()]

    for epoch in range(3):
        for rank in range(ws):
            assert order(1, epoch, rank) != order(0, epoch + 1, rank), (epoch, rank)
        shards = [order(0, epoch, rank) for rank in range(ws)]
        assert sorted(i for shard in shards for i in shard) == list(range(n))
    assert order(0, 0, 0) != order(0, 1, 0)  # still a new order every epoch
    assert order(3, 2, 1) == order(3, 2, 1)  # and reproducible


def test_epoch_batches_order_depends_on_seed_and_epoch_only() -> None:
    a = loaders.epoch_batches(500, 50, 2, 1, seed=7, epoch=4)
    b = loaders.epoch_batches(500, 50, 2, 1, seed=7, epoch=4)
    c = loaders.epoch_batches(500, 50, 2, 1, seed=7, epoch=5)
    d = loaders.epoch_batches(500, 50, 2, 1, seed=8, epoch=4)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(torch.cat(a), torch.cat(c))
    assert not torch.equal(torch.cat(a), torch.cat(d))
    # a global step holds the same samples whatever the world size (strong scaling)
    one = loaders.epoch_batches(500, 50, 1, 0, seed=7, epoch=4)
    two = [loaders.epoch_batches(500, 50, 2, r, seed=7, epoch=4) for r in range(2)]
    assert set(one[3].tolist()) == set(two[0][3].tolist()) | set(two[1][3].tolist())


@pytest.mark.parametrize(
    "n,gb,ws,rank",
    [(7, 8, 8, 0), (100, 2, 4, 0), (100, 10, 4, 0), (100, 8, 4, 4), (100, 8, 0, 0)],
)
def test_epoch_batches_bad_numbers(n: int, gb: int, ws: int, rank: int) -> None:
    with pytest.raises(ValueError) as e:
        loaders.epoch_batches(n, gb, ws, rank, seed=0, epoch=0)
    msg = str(e.value)
    assert str(ws) in msg and (str(n) in msg or str(rank) in msg)


@pytest.mark.parametrize(("n", "ws"), [(1003, 4), (5, 8), (1, 2)])
def test_eval_indices_cover_once(n, ws) -> None:
    parts = [loaders.eval_indices(n, ws, r) for r in range(ws)]
    assert sorted(torch.cat(parts).tolist()) == list(range(n))
    assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1


# ------------------------------------------------------------------------------------------------
# augment / normalize
# ------------------------------------------------------------------------------------------------


def _match_crop(out: torch.Tensor, src: torch.Tensor) -> list[tuple[int, int, bool] | None]:
    """For each output image, the (dy, dx, flipped) window of the zero-padded source it equals."""
    p = loaders.CROP_PAD
    h, w = src.shape[-2:]
    padded = F.pad(src, (p, p, p, p))
    found: list[tuple[int, int, bool] | None] = [None] * len(out)
    for dy in range(2 * p + 1):
        for dx in range(2 * p + 1):
            window = padded[:, :, dy : dy + h, dx : dx + w]
            for flipped, cand in ((False, window), (True, window.flip(-1))):
                hit = (cand == out).flatten(1).all(1)
                for i in hit.nonzero().flatten().tolist():
                    found[i] = (dy, dx, flipped)
    return found


@pytest.mark.parametrize(("dataset", "flips"), [("mnist", False), ("cifar10", True)])
@pytest.mark.parametrize("loader", ["device", "dataloader"])
def test_digits_are_never_mirrored(dataset, flips, loader):
    """Both input pipelines flipped every dataset's training images half the time: a mirrored
    digit is no longer its label (2, 3, 4, 5, 7, 9), so MNIST trained partly on wrong labels.
    A horizontal flip keeps CIFAR-10's (and the synthetic set's) labels: vocab.Dataset.flip.
    Each image is a stroke in its left third; the crop (4 px) cannot move it past the middle."""
    from scalestudy.trainer import loop
    from scalestudy.trainer.numerics import Numerics

    c, hw = (1, 28) if dataset == "mnist" else (3, 32)
    x = torch.zeros(64, c, hw, hw, dtype=torch.uint8)
    x[:, :, 8:20, 4:8] = 255
    y = torch.arange(64) % 10
    meta = {"mean": [0.5] * c, "std": [0.5] * c, "num_classes": 10}
    prepared = loaders.Prepared(x, y, x[:8], y[:8], meta)
    cfg = TrainConfig(dataset=dataset, loader=loader, num_workers=0, seed=3)
    numerics = Numerics(None, False, False)
    train, sampler, _, _ = loop.build_loaders(
        cfg, prepared, numerics, torch.device("cpu"), 0, 1, 16
    )
    mirrored = 0
    for epoch in range(3):
        (sampler or train).set_epoch(epoch)
        for xb, _ in train:
            right = xb[:, :, :, hw // 2 :].amax(dim=(1, 2, 3)) > xb.amin()
            mirrored += int(right.sum())
    assert (mirrored > 0) == flips, mirrored


def test_augment_shifts_and_flips() -> None:
    x = torch.randint(1, 256, (400, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator())
    out = loaders.augment(x, torch.Generator().manual_seed(1))
    assert out.shape == x.shape and out.dtype == torch.uint8
    again = loaders.augment(x, torch.Generator().manual_seed(1))
    assert torch.equal(out, again), "same generator seed -> same augmentation"
    assert not torch.equal(out, loaders.augment(x, torch.Generator().manual_seed(2)))

    found = _match_crop(out, x)
    assert all(f is not None for f in found), "every output is a window of the padded input"
    flips = sum(f[2] for f in found if f is not None)
    assert 150 < flips < 250, f"{flips}/400 flipped"
    offsets = {(f[0], f[1]) for f in found if f is not None}
    assert len(offsets) > 40, "per-sample offsets, not one offset for the batch"

    # one sample against a direct slice of the padded image
    i = next(k for k, f in enumerate(found) if f and not f[2] and f[:2] != (4, 4))
    dy, dx, _ = found[i]
    direct = F.pad(x[i], (4, 4, 4, 4))[:, dy : dy + 32, dx : dx + 32]
    assert torch.equal(out[i], direct)


def test_normalize() -> None:
    x = torch.tensor([0, 255, 51], dtype=torch.uint8).reshape(1, 3, 1, 1).expand(2, 3, 2, 2)
    y = loaders.normalize(x, [0.5, 0.5, 0.2], [0.5, 0.25, 0.1])
    assert y.dtype == torch.float32 and y.shape == x.shape
    torch.testing.assert_close(y[0, :, 0, 0], torch.tensor([-1.0, 2.0, 0.0]))


# ------------------------------------------------------------------------------------------------
# DeviceLoader / make_dataloader
# ------------------------------------------------------------------------------------------------


def test_device_loader_train_epoch_is_full_steps() -> None:
    n, ws, lb = 203, 3, 16
    x = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8)
    y = torch.arange(n)  # label = sample id, so the yielded labels show which samples came
    seen, steps = [], set()
    for r in range(ws):
        loader = loaders.DeviceLoader(
            x,
            y,
            local_batch=lb,
            world_size=ws,
            rank=r,
            seed=0,
            train=True,
            device="cpu",
            mean=[0.5] * 3,
            std=[0.25] * 3,
        )
        loader.set_epoch(2)
        batches = list(loader)
        assert len(batches) == loader.steps_per_epoch == len(loader)
        assert sum(len(b[1]) for b in batches) == loader.num_samples
        steps.add(len(batches))
        for xb, yb in batches:
            assert xb.dtype == torch.float32 and xb.shape[1:] == (3, 32, 32)
            assert yb.dtype == torch.int64 and len(xb) == len(yb)
            seen += yb.tolist()
        # reproducible: same epoch -> identical tensors; other epoch -> other order
        first = next(iter(loader))
        assert torch.equal(first[0], batches[0][0]) and torch.equal(first[1], batches[0][1])
        loader.set_epoch(3)
        assert not torch.equal(next(iter(loader))[1], batches[0][1])
    assert len(steps) == 1
    # 203 = 4 x 48 + 11: four full global steps; the 11 samples of the ragged tail wait for
    # another epoch, and nothing is used twice
    assert len(seen) == len(set(seen)) == 4 * lb * ws
    assert set(seen) <= set(range(n))


@pytest.mark.parametrize("window_at", [None, 5, loaders.AHEAD, 10 * loaders.AHEAD + 5])
def test_device_loader_augments_ahead_steps_at_once(monkeypatch, window_at) -> None:
    """The train loader's ~20 crop, flip and normalisation operations run once per AHEAD steps
    (each is a kernel launch on a GPU), and a group starts where the throughput window opens
    (window_at), so that no batch of the window is prepared before it; its batches are bit for
    bit those of one augment() per step: the same samples, the same random numbers in the same
    order. A window_at past the epoch's last step splits nothing."""
    n, lb, ws, rank, seed, epoch = 40 * loaders.AHEAD + 7, 2, 2, 1, 5, 3
    x = torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8)
    y = torch.arange(n)
    calls = []
    real = loaders.crop_flip
    monkeypatch.setattr(loaders, "crop_flip", lambda xb, *a: calls.append(len(xb)) or real(xb, *a))
    mean, std = [0.5, 0.4, 0.3], [0.25, 0.2, 0.3]
    loader = loaders.DeviceLoader(
        x, y, local_batch=lb, world_size=ws, rank=rank, seed=seed, train=True, device="cpu",
        mean=mean, std=std,
    )  # fmt: skip
    loader.set_epoch(epoch, window_at)
    batches = list(loader)
    steps = loader.steps_per_epoch  # (40 x AHEAD + 7) // 4 = 10 x AHEAD + 1
    assert len(batches) == steps == 10 * loaders.AHEAD + 1
    groups = [loaders.AHEAD * lb] * 10 + [lb]  # 11 groups, the last of one step
    if window_at == 5:  # the first group split where the window opens
        groups = [5 * lb, (loaders.AHEAD - 5) * lb, *groups[1:]]
    assert calls == groups
    # the per-step reference: epoch_batches' samples, augment() once per step
    gen = torch.Generator().manual_seed(loaders.derive_seed("augment", seed, rank, epoch))
    plan = loaders.epoch_batches(n, lb * ws, ws, rank, seed, epoch)
    for (xb, yb), idx in zip(batches, plan, strict=True):
        assert torch.equal(yb, y[idx])
        assert torch.equal(xb, loaders.normalize(loaders.augment(x[idx], gen), mean, std))


@pytest.mark.parametrize(("n", "ws", "lb"), [(101, 4, 4), (33, 2, 8), (5, 8, 2), (1, 3, 4)])
def test_device_loader_eval(n, ws, lb) -> None:
    """Each test sample once over the ranks, and every rank the same number of batches: 33
    samples over 2 ranks in batches of 16 are 17 + 16, two batches and one, and FSDP's forward
    (a collective) then hung the rank with two (its partner sat in the final all_reduce); the
    short shard's last batch is now empty. Fewer test images than ranks (train.limit_test 5
    on 8 ranks, a synthetic num_test of 1): the ranks past the last image evaluate an empty
    shard; they raised "upper bound and lower bound inconsistent with step sign" at the build,
    a traceback on that rank and "Connection closed by peer" on the others."""
    x = torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8)
    y = torch.arange(n)
    seen, counts = [], set()
    for r in range(ws):
        loader = loaders.DeviceLoader(
            x,
            y,
            local_batch=lb,
            world_size=ws,
            rank=r,
            seed=0,
            train=False,
            device="cpu",
            mean=[0.1],
            std=[0.3],
        )
        batches = list(loader)
        assert max(len(b[1]) for b in batches) <= 2 * lb  # eval_batch defaults to 2 x lb
        assert len(batches) == loader.steps_per_epoch
        counts.add(len(batches))
        assert sum(len(b[1]) for b in batches) == loader.num_samples
        for xb, yb in batches:  # no augmentation: exactly the normalized source images
            torch.testing.assert_close(xb, loaders.normalize(x[yb], [0.1], [0.3]))
            seen += yb.tolist()
    assert sorted(seen) == list(range(n))
    assert len(counts) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_device_loader_emits_the_models_dtype_and_layout(dtype, channels_last) -> None:
    """The fast path's batches: the same images as the float32 NCHW loader, rounded once to the
    autocast dtype (the very cast autocast makes in the first convolution) and laid out NHWC,
    so neither Run.place nor the model copies them again."""
    x = torch.randint(0, 256, (40, 3, 8, 8), dtype=torch.uint8)
    kw = dict(local_batch=4, world_size=2, rank=1, seed=3, device="cpu", mean=[0.4] * 3,
              std=[0.2] * 3)  # fmt: skip
    for train in (True, False):
        plain = loaders.DeviceLoader(x, torch.arange(40), train=train, **kw)
        fast = loaders.DeviceLoader(
            x, torch.arange(40), train=train, dtype=dtype, channels_last=channels_last, **kw
        )
        plain.set_epoch(1)
        fast.set_epoch(1)
        pairs = list(zip(plain, fast, strict=True))
        assert pairs
        for (xa, ya), (xb, yb) in pairs:
            assert xb.dtype == dtype and xb.shape == xa.shape and torch.equal(ya, yb)
            assert xb.is_contiguous(memory_format=torch.channels_last) == channels_last
            assert torch.equal(xb, xa.to(dtype))  # bit for bit: the same rounding


def test_bf16_batches_train_exactly_like_autocast_casting_them() -> None:
    """A bf16 batch from the loader and the float32 batch autocast casts itself give the same
    gradients, bit for bit (CPU autocast, the run's own recipe of one step)."""
    torch.manual_seed(0)
    x32 = torch.randn(8, 3, 16, 16)
    grads = []
    for batch in (x32, x32.to(torch.bfloat16)):
        torch.manual_seed(1)
        model = build_model("resnet18", num_classes=10, width=4, in_channels=3)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(batch), torch.arange(8) % 10)
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_make_dataloader() -> None:
    n = 21
    x = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8)
    y = torch.arange(n)
    kw = dict(world_size=2, seed=0, mean=[0.5] * 3, std=[0.5] * 3, num_workers=0)
    # persistent_workers/prefetch_factor with num_workers=0 would make DataLoader raise
    loader, sampler = loaders.make_dataloader(
        x,
        y,
        local_batch=4,
        rank=1,
        train=True,
        pin_memory=False,
        persistent_workers=True,
        prefetch_factor=2,
        **kw,
    )
    sampler.set_epoch(0)
    batches = list(loader)
    assert len(sampler) == 10  # 21 // 2: training leaves a sample out rather than repeat one
    assert [len(b[1]) for b in batches] == [4, 4]  # the ragged third batch (3) is dropped
    assert batches[0][0].dtype == torch.float32 and batches[0][0].shape[1:] == (3, 32, 32)
    loader, _ = loaders.make_dataloader(
        x,
        y,
        local_batch=4,
        rank=0,
        train=False,
        pin_memory=False,
        persistent_workers=False,
        prefetch_factor=None,
        **kw,
    )
    xb, yb = next(iter(loader))
    torch.testing.assert_close(xb, loaders.normalize(x[yb], [0.5] * 3, [0.5] * 3))


def test_dataloader_ranks_augment_independently_and_reproducibly() -> None:
    # one image 8 times: the batches of two ranks differ only by their crops and flips
    x = torch.randint(0, 256, (1, 3, 32, 32), dtype=torch.uint8).repeat(8, 1, 1, 1)
    kw = dict(world_size=2, seed=0, mean=[0.5] * 3, std=[0.5] * 3, num_workers=0)
    kw |= dict(local_batch=4, train=True, pin_memory=False, persistent_workers=False)

    def first_batch(rank: int) -> torch.Tensor:
        torch.manual_seed(0)  # the trainer's shared draw of the initial weights
        loaders.seed_rank_draws(0, rank)
        loader, sampler = loaders.make_dataloader(
            x, torch.zeros(8, dtype=torch.long), rank=rank, prefetch_factor=None, **kw
        )
        sampler.set_epoch(0)
        return next(iter(loader))[0]

    assert torch.equal(first_batch(0), first_batch(0))  # reproducible per rank
    assert not torch.equal(first_batch(0), first_batch(1))  # not the same crops on every rank


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_loader_cuda() -> None:
    x = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    gen = torch.Generator(device="cuda").manual_seed(0)
    out = loaders.augment(x.cuda(), gen)
    assert out.is_cuda and out.dtype == torch.uint8
    assert all(f is not None for f in _match_crop(out.cpu(), x))
    loader = loaders.DeviceLoader(
        x, torch.arange(64), local_batch=8, world_size=2, rank=1, seed=0, train=True,
        device="cuda", mean=[0.5] * 3, std=[0.25] * 3,
    )  # fmt: skip
    xb, yb = next(iter(loader))
    assert xb.is_cuda and yb.is_cuda and xb.dtype == torch.float32 and len(yb) == 8


# ------------------------------------------------------------------------------------------------
# synthetic + prepared format
# ------------------------------------------------------------------------------------------------


def test_synthetic_deterministic_and_learnable(tmp_path: Path) -> None:
    a = prepare_data.prepare("synthetic", tmp_path / "a", num_train=2000, num_test=500, seed=5)
    b = prepare_data.prepare("synthetic", tmp_path / "b", num_train=2000, num_test=500, seed=5)
    meta_a = json.loads((a / "meta.json").read_text())
    meta_b = json.loads((b / "meta.json").read_text())
    assert meta_a["sha256"] == meta_b["sha256"]
    assert (a / "data.pt").read_bytes() == (b / "data.pt").read_bytes()
    c = prepare_data.prepare("synthetic", tmp_path / "c", num_train=2000, num_test=500, seed=6)
    assert json.loads((c / "meta.json").read_text())["sha256"] != meta_a["sha256"]

    p = loaders.load_prepared("synthetic", tmp_path / "a")
    assert p.train_x.shape == (2000, 3, 32, 32) and p.train_x.dtype == torch.uint8
    assert p.test_y.dtype == torch.int64 and p.num_classes == 10
    assert torch.bincount(p.train_y, minlength=10).tolist() == [200] * 10
    # class-dependent: nearest class mean on raw pixels, chance is 10%
    xtr, xte = p.train_x.float().flatten(1), p.test_x.float().flatten(1)
    means = torch.stack([xtr[p.train_y == k].mean(0) for k in range(10)])
    acc = (torch.cdist(xte, means).argmin(1) == p.test_y).float().mean().item()
    assert acc > 0.5, acc
    # mean/std in meta are the train split's, per channel, 0-1 scale
    ref = p.train_x.double() / 255
    torch.testing.assert_close(
        torch.tensor(p.mean, dtype=torch.float64), ref.mean(dim=(0, 2, 3)), atol=1e-9, rtol=0
    )
    torch.testing.assert_close(
        torch.tensor(p.std, dtype=torch.float64),
        ref.std(dim=(0, 2, 3), correction=0),
        atol=1e-9,
        rtol=0,
    )


def test_load_prepared_errors(tmp_path: Path) -> None:
    with pytest.raises(PreparedDataError) as e:
        loaders.load_prepared("cifar10", tmp_path / "nowhere")
    msg = str(e.value)
    assert str(tmp_path / "nowhere" / "cifar10") in msg
    assert f"scalestudy prepare-data --dataset cifar10 --data-dir {tmp_path / 'nowhere'}" in msg

    out = prepare_data.prepare("synthetic", tmp_path, num_train=50, num_test=20, seed=0)
    tensors = torch.load(out / "data.pt", weights_only=True)
    tensors["train_y"][0] = (tensors["train_y"][0] + 1) % 10  # a changed label, valid file
    torch.save(tensors, out / "data.pt")
    with pytest.raises(PreparedDataError, match="sha256") as e:
        loaders.load_prepared("synthetic", tmp_path)
    assert str(out / "data.pt") in str(e.value) and "scalestudy prepare-data" in str(e.value)
    loaders.load_prepared("synthetic", tmp_path, verify=False)  # the check is what caught it
    (out / "data.pt").write_bytes((out / "data.pt").read_bytes()[:-200])  # truncated
    with pytest.raises(PreparedDataError, match="cannot be read"):
        loaders.load_prepared("synthetic", tmp_path, verify=False)

    # meta.json of another dataset
    (tmp_path / "mnist").mkdir()
    for name in ("data.pt", "meta.json"):
        (tmp_path / "mnist" / name).write_bytes((out / name).read_bytes())
    with pytest.raises(PreparedDataError, match="'synthetic'"):
        loaders.load_prepared("mnist", tmp_path, verify=False)

    # a tampered file is not "already prepared": prepare redoes it
    prepare_data.prepare("synthetic", tmp_path, num_train=50, num_test=20, seed=0)
    loaders.load_prepared("synthetic", tmp_path)

    # a split converted by hand into a list (meta.json's sha256 updated with it): an
    # AttributeError traceback ('list' object has no attribute 'dtype')
    tensors = torch.load(out / "data.pt", weights_only=True)
    tensors["train_y"] = tensors["train_y"].tolist()
    torch.save(tensors, out / "data.pt")
    meta = json.loads((out / "meta.json").read_text())
    meta["sha256"] = hashlib.sha256((out / "data.pt").read_bytes()).hexdigest()
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PreparedDataError, match="train tensors do not match") as e:
        loaders.load_prepared("synthetic", tmp_path)
    assert str(e.value).endswith("--num-train 50 --num-test 20 --seed 0 --force"), e.value


def test_a_prepared_set_of_other_sizes_than_the_study_prepares_is_refused(tmp_path: Path) -> None:
    """A data.pt prepared by hand (the README's `prepare-data --data-dir results/data`: the
    default 50,000 / 10,000 synthetic images) under a study of synthetic.num_train 2048: the
    workflow's train jobs trained on it as it was (Snakemake's params trigger does not see a
    file it has no metadata for, nor under --rerun-triggers mtime), 24x the images the plan
    and the Slurm time limits were made for. The launch rules pass the study's sizes
    (--expect-train, --expect-test); a set of other sizes is refused before the rendezvous,
    naming both and the command that makes the study's, which an unreadable meta.json names
    too (it named the default set's)."""
    data_dir = tmp_path / "data"
    prepare_data.prepare("synthetic", data_dir, num_train=50, num_test=20, seed=3)
    denv = sdist.DistEnv("torchrun", 0, 2, 0, 2, 0, 1, "localhost", 29500)
    cfg = TrainConfig(dataset="synthetic", data_dir=str(data_dir), out=str(tmp_path / "out"))
    preflight(cfg, denv)  # nothing expected: nothing checked (a run by hand)
    preflight(dataclasses.replace(cfg, expect_train=50, expect_test=20), denv)
    meta = data_dir / "synthetic" / "meta.json"
    fix = f"scalestudy prepare-data --dataset synthetic --data-dir {data_dir} --num-train 40 "
    for train, test in ((40, 20), (50, 30), (40, 30)):
        with pytest.raises(PreparedDataError) as e:
            preflight(dataclasses.replace(cfg, expect_train=train, expect_test=test), denv)
        assert str(e.value) == (
            f"{meta} holds 50 training and 20 test images, the study prepares {train} and "
            f"{test} (--expect-train, --expect-test); recreate: scalestudy prepare-data "
            f"--dataset synthetic --data-dir {data_dir} --num-train {train} --num-test {test} "
            "--force"
        )
    meta.write_text("{")  # unreadable: the study's sizes, not the default set's
    with pytest.raises(PreparedDataError, match="not valid JSON") as e:
        preflight(dataclasses.replace(cfg, expect_train=40, expect_test=20), denv)
    assert str(e.value).endswith(f"recreate: {fix}--num-test 20 --force"), e.value
    for flag in ("expect_train", "expect_test"):  # not the experiment's: no rerun, no resume
        assert flag in __import__("scalestudy.trainer.config").trainer.config.NOT_IDENTITY


def test_cli_synthetic_end_to_end(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "scalestudy", "prepare-data", "--dataset", "synthetic"]
    cmd += ["--data-dir", str(tmp_path), "--num-train", "2000", "--num-test", "500"]
    first = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "wrote" in first.stdout and "2000x3x32x32" in first.stdout
    meta = json.loads((tmp_path / "synthetic" / "meta.json").read_text())
    assert set(meta) >= {
        "format_version", "dataset", "classes", "num_classes", "train_shape", "test_shape",
        "mean", "std", "sha256", "source", "num_train", "num_test", "seed",
    }  # fmt: skip
    assert meta["train_shape"] == [2000, 3, 32, 32] and meta["test_shape"] == [500, 3, 32, 32]
    assert meta["num_classes"] == len(meta["classes"]) == 10 and meta["source"] == "synthetic"
    assert (meta["format_version"], meta["seed"]) == (1, 0)
    mtime = (tmp_path / "synthetic" / "data.pt").stat().st_mtime_ns
    second = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "nothing to do" in second.stdout
    assert (tmp_path / "synthetic" / "data.pt").stat().st_mtime_ns == mtime


def test_a_synthetic_set_larger_than_memory_is_one_line(tmp_path: Path) -> None:
    """2 * 10**6 images (5.7 GB) in a process limited to 4 GB of address space (a small node, or
    a job's limit): torch's allocator failure was a traceback; nothing is written. (Past the
    machine's memory the set is refused before any allocation: the next test.)"""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))

    cmd = [sys.executable, "-m", "scalestudy", "prepare-data", "--dataset", "synthetic"]
    cmd += ["--data-dir", str(tmp_path), "--num-train", str(2 * 10**6), "--num-test", "10"]
    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limit, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "scalestudy prepare-data: synthetic: 2,000,000 train images need 5,875 MB of "
        "memory, more than this process could allocate; prepare fewer (--num-train / "
        "--num-test, the config's synthetic.num_train / num_test)"
    ]
    assert not (tmp_path / "synthetic" / "data.pt").exists()


def test_a_synthetic_set_larger_than_the_machine_is_refused_before_it_is_made(tmp_path, capsys):
    """--num-train 10**23 was torch.arange's OverflowError traceback; 3 * 10**9 allocated its
    labels (24 GB of int64) and its permutation, and the kernel killed the process for it.
    Past this machine's memory it is one line, before any allocation."""
    argv = ["prepare-data", "--dataset", "synthetic", "--data-dir", str(tmp_path)]
    for n in (10**23, 3 * 10**12):
        assert cli.main([*argv, "--num-train", str(n), "--num-test", "10"]) == 2
        (err,) = capsys.readouterr().err.strip().splitlines()
        assert f"synthetic: {n:,} train and 10 test images need " in err, err
        assert "MB of memory, more than this machine's " in err, err
    assert not (tmp_path / "synthetic" / "data.pt").exists()


def test_a_synthetic_set_whose_splits_together_pass_the_machine_is_refused(
    tmp_path, capsys, monkeypatch
):
    """The check was each split's: two splits of 5 MB each passed a machine of 8 MB, though
    both are made, held and saved together (a set of 2 x 0.6 x the memory was killed)."""
    monkeypatch.setattr(prepare_data, "_machine_mb", lambda: 8)
    n = 5 * 2**20 // vocab.DATASETS["synthetic"].image_bytes  # 5 MB of images
    argv = ["prepare-data", "--dataset", "synthetic", "--data-dir", str(tmp_path)]
    assert cli.main([*argv, "--num-train", str(n), "--num-test", str(n)]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert f"synthetic: {n:,} train and {n:,} test images need 10 MB of memory" in err, err
    assert "more than this machine's 8 MB" in err, err
    assert not (tmp_path / "synthetic" / "data.pt").exists()


def test_cli_rejects_synthetic_flags_for_real_data(tmp_path: Path, capsys) -> None:
    argv = ["prepare-data", "--dataset", "cifar10", "--data-dir", str(tmp_path), "--num-train", "9"]
    rc = cli.main(argv)
    assert rc == 2 and "synthetic" in capsys.readouterr().err


def test_cli_rejects_a_mirror_for_synthetic_data(tmp_path: Path, capsys) -> None:
    """--mirror was silently ignored for --dataset synthetic (--seed for cifar10 is refused)."""
    argv = ["prepare-data", "--dataset", "synthetic", "--data-dir", str(tmp_path)]
    argv += ["--num-train", "10", "--num-test", "10", "--mirror", "https://example.org/"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "scalestudy prepare-data: --mirror applies only to --dataset cifar10 and mnist "
        "(synthetic is generated, not downloaded)"
    ]
    assert not (tmp_path / "synthetic").exists()


@pytest.mark.parametrize("blank", ["", "  "])
def test_a_blank_data_dir_is_refused_as_train_refuses_it(
    tmp_path: Path, monkeypatch, capsys, blank
):
    """`prepare-data --data-dir ''` wrote <cwd>/<dataset>/ and exited 0, while train refuses
    that --data-dir: the data was made where no run could read it. Now train's own message."""
    from scalestudy.errors import TrainConfigError
    from scalestudy.trainer.config import TrainConfig

    with pytest.raises(TrainConfigError) as refused:
        TrainConfig(data_dir=blank)
    monkeypatch.chdir(tmp_path)
    argv = ["prepare-data", "--dataset", "synthetic", "--data-dir", blank]
    assert cli.main([*argv, "--num-train", "10", "--num-test", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"scalestudy prepare-data: {refused.value}"]
    assert list(tmp_path.iterdir()) == []


def test_a_data_dir_with_a_tilde_no_shell_expanded_is_refused(
    tmp_path: Path, serve, monkeypatch, capsys
) -> None:
    """`--data-dir=~/data` (bash expands no ~ after `--flag=`): torchvision expanded it, so the
    archive was downloaded into $HOME/data/cifar10/raw, then read from ./~/data/cifar10/raw:
    "No such file or directory" after the whole download, and a directory named ~ made."""
    site, home, cwd = tmp_path / "site", tmp_path / "home", tmp_path / "cwd"
    for d in (site, home, cwd):
        d.mkdir()
    archive = _fake_cifar_archive(site)
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    monkeypatch.setitem(prepare_data.CIFAR10_FILES, "cifar-10-python.tar.gz", md5)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    argv = ["prepare-data", "--dataset", "cifar10", "--data-dir=~/data", "--mirror", serve(site)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--data-dir '~/data' starts with ~" in err[0], err
    assert err[0].endswith(f"give {home / 'data'}"), err
    assert list(home.iterdir()) == [] and list(cwd.iterdir()) == []  # nothing downloaded or made


def test_fewer_training_images_than_ranks_is_refused_before_the_rendezvous(tmp_path: Path) -> None:
    """--limit-train 1 on 2 ranks was a ValueError traceback on every rank once the loaders
    were built (epoch_batches needs a sample per rank); now one TrainConfigError, before any
    process group, that names the flag, the world size and the fix."""
    data_dir = tmp_path / "data"
    prepare_data.prepare("synthetic", data_dir, num_train=50, num_test=20, seed=0)
    denv = sdist.DistEnv("torchrun", 0, 2, 0, 2, 0, 1, "localhost", 29500)
    cfg = TrainConfig(dataset="synthetic", data_dir=str(data_dir), out=str(tmp_path / "out"))
    with pytest.raises(TrainConfigError) as e:
        preflight(dataclasses.replace(cfg, limit_train=1), denv)
    assert str(e.value) == (
        "--limit-train 1 leaves fewer training images than the 2 ranks, each of which needs "
        "one: give --limit-train 2 or more (0 = all 50)"
    )
    preflight(dataclasses.replace(cfg, limit_train=2), denv)
    # a prepared set smaller than the world: --limit-train is not what to change
    prepare_data.prepare("synthetic", data_dir, num_train=1, num_test=20, seed=0)
    for limit in (0, 5):
        with pytest.raises(TrainConfigError, match="has 1 training images, fewer than the 2 r"):
            preflight(dataclasses.replace(cfg, limit_train=limit), denv)


# ------------------------------------------------------------------------------------------------
# CIFAR-10 / MNIST raw formats, served from loopback (no internet)
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """serve(directory) -> base URL of an HTTP server on 127.0.0.1 (a thread) serving its files;
    serve(handler), a BaseHTTPRequestHandler class: one answering as that handler does."""
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    servers = []

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep pytest output clean
            pass

    def start(what: Path | type) -> str:
        files_of = functools.partial(Quiet, directory=str(what))
        handler = what if isinstance(what, type) else files_of
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _cifar_batch(n: int, offset: int) -> dict:
    rng = np.random.default_rng(offset)
    x = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    x[0, 1024 + 5 * 32 + 7] = 200 + offset  # image 0, channel G (1), row 5, col 7
    labels = [(offset + i) % 10 for i in range(n)]
    return {b"batch_label": b"fake", b"data": x, b"labels": labels, b"filenames": [b"f"] * n}


def _fake_cifar_archive(directory: Path) -> Path:
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    archive = directory / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        members = {n: _cifar_batch(4 if n != "test_batch" else 3, i) for i, n in enumerate(names)}
        label_names = [f"c{i}".encode() for i in range(10)]
        members["batches.meta"] = {b"label_names": label_names, b"num_vis": 3072}
        for name, obj in members.items():
            blob = pickle.dumps(obj, protocol=2)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return archive


def test_cifar10_md5_mismatch_and_conversion(tmp_path: Path, serve, capsys, monkeypatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    archive = _fake_cifar_archive(site)
    url = serve(site)
    out = tmp_path / "data"
    rc = cli.main(["prepare-data", "--dataset", "cifar10", "--data-dir", str(out), "--mirror", url])
    err = capsys.readouterr().err
    fake_md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    raw_file = out / "cifar10" / "raw" / "cifar-10-python.tar.gz"
    assert rc == 2
    assert str(raw_file) in err and "md5" in err
    assert "c58f30108f718f92721af3b95e74349a" in err and fake_md5 in err
    assert not (out / "cifar10" / "meta.json").exists()
    assert not raw_file.exists()  # a file with another md5 is not kept under the name

    # the conversion on the fake batches
    extract_archive(str(archive), str(tmp_path / "extracted"))
    tensors, classes = prepare_data.convert_cifar10(tmp_path / "extracted")
    assert classes == [f"c{i}" for i in range(10)]
    assert tensors["train_x"].shape == (20, 3, 32, 32) and tensors["train_x"].dtype == torch.uint8
    assert tensors["test_x"].shape == (3, 3, 32, 32)
    assert tensors["train_y"].dtype == torch.int64
    assert tensors["train_y"][:4].tolist() == [0, 1, 2, 3]  # batch 1 (offset 0)
    assert tensors["train_y"][4:8].tolist() == [1, 2, 3, 4]  # batch 2 (offset 1)
    assert tensors["test_y"].tolist() == [5, 6, 7]
    assert int(tensors["train_x"][0, 1, 5, 7]) == 200  # CHW: channel 1, row 5, col 7
    assert int(tensors["train_x"][4, 1, 5, 7]) == 201
    assert int(tensors["test_x"][0, 1, 5, 7]) == 205
    ref = _cifar_batch(4, 2)[b"data"][3]  # image 3 of data_batch_3, raw row of 3072 bytes
    assert tensors["train_x"][11].flatten().tolist() == ref.tolist()

    # with the fake archive's md5 declared official, the whole path runs and writes the format
    monkeypatch.setitem(prepare_data.CIFAR10_FILES, "cifar-10-python.tar.gz", fake_md5)
    argv = ["prepare-data", "--dataset", "cifar10", "--data-dir", str(out), "--force"]
    assert cli.main([*argv, "--mirror", url]) == 0
    p = loaders.load_prepared("cifar10", out)
    assert torch.equal(p.train_x, tensors["train_x"]) and p.meta["classes"] == classes
    assert p.meta["source"].endswith("cifar-10-python.tar.gz")
    with socket.socket() as sock:  # a mirror nobody answers: the raw file there is used
        sock.bind(("127.0.0.1", 0))
        assert cli.main([*argv, "--mirror", f"http://127.0.0.1:{sock.getsockname()[1]}/"]) == 0
    assert "is there with the right md5; not downloaded again" in capsys.readouterr().out


def _idx(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def test_mnist_conversion_and_download(tmp_path: Path, serve, monkeypatch) -> None:
    rng = np.random.default_rng(0)
    imgs = {"train": rng.integers(0, 256, (6, 28, 28)), "t10k": rng.integers(0, 256, (4, 28, 28))}
    imgs["train"][2, 3, 17] = 77
    labels = {"train": np.array([3, 1, 4, 1, 5, 9]), "t10k": np.array([2, 6, 5, 3])}
    site = tmp_path / "site"
    site.mkdir()
    for prefix in ("train", "t10k"):
        for kind, arr in (("images-idx3", imgs[prefix]), ("labels-idx1", labels[prefix])):
            (site / f"{prefix}-{kind}-ubyte.gz").write_bytes(gzip.compress(_idx(arr)))

    tensors, classes = prepare_data.convert_mnist(site)  # reads .gz directly too
    assert tensors["train_x"].shape == (6, 1, 28, 28) and tensors["test_x"].shape == (4, 1, 28, 28)
    assert tensors["train_x"].dtype == torch.uint8 and tensors["train_y"].dtype == torch.int64
    assert int(tensors["train_x"][2, 0, 3, 17]) == 77
    assert tensors["train_x"][5, 0].tolist() == imgs["train"][5].tolist()
    assert tensors["train_y"].tolist() == [3, 1, 4, 1, 5, 9] and len(classes) == 10

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x0d\x03" + bytes(12))
    with pytest.raises(ValueError, match="idx"):
        prepare_data.convert_mnist(bad)

    # download path: real md5s -> mismatch; fake md5s declared official -> the format is written
    url = serve(site)
    with pytest.raises(ChecksumError, match="train-images-idx3-ubyte.gz"):
        prepare_data.prepare("mnist", tmp_path / "data", mirror=url)
    for name in prepare_data.MNIST_FILES:
        md5 = hashlib.md5((site / name).read_bytes()).hexdigest()
        monkeypatch.setitem(prepare_data.MNIST_FILES, name, md5)
    prepare_data.prepare("mnist", tmp_path / "data", mirror=url)
    p = loaders.load_prepared("mnist", tmp_path / "data")
    assert torch.equal(p.train_x, tensors["train_x"]) and len(p.mean) == len(p.std) == 1
    assert p.meta["train_shape"] == [6, 1, 28, 28] and p.meta["source"] == url


def test_no_network_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a loopback port nobody listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(DownloadError) as e:
        prepare_data.prepare("cifar10", tmp_path, mirror=f"http://127.0.0.1:{port}/")
    assert not isinstance(e.value, ChecksumError)
    assert "cifar-10-python.tar.gz" in str(e.value) and "--mirror" in str(e.value)
    assert os.listdir(tmp_path / "cifar10") in (["raw"], [])


def test_mnist_mirrors_that_all_fail_are_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    """Each mirror's error was joined with a newline, the advice repeated after each: one line
    now, each mirror named, the advice once."""
    ports = []
    for _ in range(2):  # stand-ins for the official mirrors: loopback ports nobody listens on
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    monkeypatch.setattr(
        prepare_data, "MNIST_MIRRORS", tuple(f"http://127.0.0.1:{p}/" for p in ports)
    )
    assert cli.main(["prepare-data", "--dataset", "mnist", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert all(f"http://127.0.0.1:{p}/train-images-idx3-ubyte.gz" in err[0] for p in ports)
    assert err[0].count("Without internet") == 1 and err[0].endswith("or pass --mirror URL.")


# a chunked reply that breaks off inside its second chunk, and a server that speaks no HTTP
CUT_SHORT = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n" + bytes(1024)
CUT_SHORT += b"\r\n400\r\n" + bytes(100)
NOT_HTTP = b"SSH-2.0-OpenSSH_9.6\r\n"


@pytest.fixture
def broken_server(monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """broken_server(reply) -> base URL of a TCP server on 127.0.0.1 (a thread) that answers
    every request with the bytes `reply` and closes the connection."""
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    socks = []

    def start(reply: bytes) -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        socks.append(sock)

        def answer() -> None:
            while True:
                try:
                    conn, _ = sock.accept()
                except OSError:  # closed at the end of the test
                    return
                with conn:
                    request = b""
                    while b"\r\n\r\n" not in request and (more := conn.recv(65536)):
                        request += more  # all of it: unread bytes would make close() a reset
                    conn.sendall(reply)
                    conn.shutdown(socket.SHUT_WR)

        threading.Thread(target=answer, daemon=True).start()
        return f"http://127.0.0.1:{sock.getsockname()[1]}/"

    yield start
    for sock in socks:
        sock.close()


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (
            CUT_SHORT,
            "the transfer was cut short: 1,124 bytes arrived, not the reply's end (the server or "
            "the network ended it early); run prepare-data again, or give another --mirror",
        ),
        (NOT_HTTP, "BadStatusLine"),
    ],
    ids=["cut-short", "not-http"],
)
def test_a_download_cut_short_or_no_http_server_is_one_line(
    tmp_path: Path, broken_server, capsys, reply, says
) -> None:
    """A transfer that broke off mid-body (a chunked reply: http.client.IncompleteRead) or a
    --mirror host:port that is no HTTP server (BadStatusLine): http.client's own errors, neither
    URLError nor OSError, went past every handler as a traceback, and the part that had arrived
    stayed in raw/ under the archive's name. The chunked reply cut short then read
    "IncompleteRead(1024 bytes read) (the transfer broke off, or the server is no HTTP
    server)": the bytes of one read, not of the transfer, and none of what a reply cut short of
    its Content-Length says; now the same words, with what arrived."""
    url = broken_server(reply)
    out = tmp_path / "data"
    rc = cli.main(["prepare-data", "--dataset", "cifar10", "--data-dir", str(out), "--mirror", url])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "Traceback" not in err[0], err
    assert f"could not download {url}cifar-10-python.tar.gz" in err[0] and says in err[0], err
    assert err[0].endswith("or pass --mirror URL."), err
    raw = out / "cifar10" / "raw"
    assert not raw.exists() or not list(raw.iterdir()), list(raw.iterdir())


# a reply whose Content-Length promises 100,000 bytes, 1,000 of which arrive (no chunking)
SHORT_OF_LENGTH = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + bytes(1000)


def test_a_download_cut_short_of_its_content_length_says_so(
    tmp_path: Path, broken_server, capsys
) -> None:
    """A server that closed the connection before the Content-Length it announced (no
    chunking: http.client's read(n) returns what came, without IncompleteRead) read "md5
    mismatch ... not the official file (wrong --mirror ...?)", which blamed the mirror for a
    transfer that broke off. Now the line says it was cut short, how far, and what to do."""
    url = broken_server(SHORT_OF_LENGTH)
    out = tmp_path / "data"
    rc = cli.main(["prepare-data", "--dataset", "cifar10", "--data-dir", str(out), "--mirror", url])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "md5 mismatch" not in err[0], err
    assert f"could not download {url}cifar-10-python.tar.gz" in err[0], err
    assert "the transfer was cut short: 1,000 of 100,000 bytes arrived" in err[0], err
    assert "run prepare-data again, or give another --mirror" in err[0], err
    raw = out / "cifar10" / "raw"
    assert not raw.exists() or not list(raw.iterdir()), list(raw.iterdir())


def test_a_download_that_stalls_is_one_line_not_a_hang(tmp_path: Path, monkeypatch) -> None:
    """A server that accepts the connection and then sends nothing (a stalled mirror, a
    connection a firewall dropped mid-transfer): urllib waited without a timeout, and
    prepare-data, a local rule of the study, hung forever. A loopback socket that listens and
    never accepts: the kernel completes the handshake, no byte follows."""
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setattr(prepare_data, "DOWNLOAD_STALL_S", 1.0)
    outcome: list[BaseException | None] = []

    def attempt(url: str) -> None:
        try:
            prepare_data.prepare("cifar10", tmp_path, mirror=url)
            outcome.append(None)
        except BaseException as e:  # judged below, in the test's thread
            outcome.append(e)

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
        thread = threading.Thread(target=attempt, args=(url,), daemon=True)
        thread.start()
        thread.join(timeout=60)
        assert not thread.is_alive(), "prepare-data still waits on a server that sends nothing"
    (error,) = outcome
    assert isinstance(error, DownloadError) and not isinstance(error, ChecksumError), error
    assert f"could not download {url}cifar-10-python.tar.gz" in str(error)
    assert "nothing received for 1 s" in str(error) and "\n" not in str(error)


def _as_in_a_terminal() -> None:
    """Ctrl-C and a hang-up reach the child as they reach a terminal's job (CI runs the suite
    under nohup, in the background: both inherited ignored)."""
    sigint_as_in_a_terminal()
    sighup_as_in_a_terminal()


def _under_nohup() -> None:
    """The child as `nohup` starts it: SIGHUP ignored (Ctrl-C as in a terminal)."""
    sigint_as_in_a_terminal()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


@pytest.mark.parametrize(
    ("signame", "nohup"),
    [("SIGINT", False), ("SIGTERM", False), ("SIGHUP", False), ("SIGTERM", True)],
    ids=["SIGINT", "SIGTERM", "SIGHUP", "nohup-SIGHUP-then-SIGTERM"],
)
def test_a_download_stopped_by_a_signal_leaves_no_temp_file(tmp_path: Path, signame, nohup) -> None:
    """SIGTERM (a batch system's time limit, `timeout`, Snakemake cancelling the job) or SIGHUP
    (a closed terminal) during the CIFAR-10 download met Python's default action: instant
    death, no line, no cleanup, and the part downloaded (up to 170 MB) stayed in raw/ as
    `.cifar-10-python.tar.gz.<hex>.tmp`, which nothing ever removed. Ctrl-C already cleaned up.
    Now each ends as Ctrl-C does: one line, the temp file removed, death by that signal. A
    SIGHUP ignored from the start (`nohup scalestudy prepare-data ... &`) stays ignored."""
    announced = 170 * 2**20
    reply = f"HTTP/1.1 200 OK\r\nContent-Length: {announced}\r\n\r\n".encode()
    stop_serving = threading.Event()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)

        def stall() -> None:  # 1.5 MiB of the file, then nothing (the transfer under way)
            conn, _ = sock.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(reply + bytes(3 * 2**19))
                stop_serving.wait(120)

        threading.Thread(target=stall, daemon=True).start()
        raw = tmp_path / "data" / "cifar10" / "raw"
        argv = ["--dataset", "cifar10", "--data-dir", str(tmp_path / "data")]
        argv += ["--mirror", f"http://127.0.0.1:{sock.getsockname()[1]}/"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "scalestudy", "prepare-data", *argv],
            cwd=REPO,
            env=child_env(no_proxy="127.0.0.1", NO_PROXY="127.0.0.1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_under_nohup if nohup else _as_in_a_terminal,
        )
        try:
            for _ in range(1200):  # the temp file holds the first MiB: the download is on
                temps = list(raw.glob(".*.tmp")) if raw.is_dir() else []
                if temps and temps[0].stat().st_size >= 2**20 or proc.poll() is not None:
                    break
                threading.Event().wait(0.05)
            assert proc.poll() is None, proc.communicate()
            if nohup:  # the hang-up nohup protects the command from: it goes on
                proc.send_signal(signal.SIGHUP)
                with pytest.raises(subprocess.TimeoutExpired):
                    proc.wait(timeout=2)
            proc.send_signal(getattr(signal, signame))
            _, err = proc.communicate(timeout=60)
        finally:
            stop_serving.set()
            proc.kill()
    said = "interrupted" if signame == "SIGINT" else f"stopped by {signame}"
    assert (proc.returncode, err) == (
        -getattr(signal, signame),
        f"scalestudy prepare-data: {said}\n",
    )
    assert list(raw.iterdir()) == []  # no temp file, nor a part under the archive's name


def _mnist_site(directory: Path) -> None:
    """MNIST's four .gz files, small and made up, in `directory`, declared official (md5s)."""
    rng = np.random.default_rng(1)
    for prefix, n in (("train", 6), ("t10k", 4)):
        images, labels = rng.integers(0, 256, (n, 28, 28)), rng.integers(0, 10, n)
        for kind, arr in (("images-idx3", images), ("labels-idx1", labels)):
            (directory / f"{prefix}-{kind}-ubyte.gz").write_bytes(gzip.compress(_idx(arr)))


def _need_a_failing_read() -> None:
    """The tests' failing disk is /proc/self/mem, whose read fails at offset 0 (EIO): needed."""
    with open("/proc/self/mem", "rb") as mem:
        try:
            mem.read(1)
        except OSError:
            return
    need("/proc/self/mem that fails to read at offset 0", "a Linux /proc")


def _both_sites(site: Path, monkeypatch) -> tuple[Path, Path]:
    """(site, its archive): a mirror directory holding a made CIFAR-10 archive and the MNIST
    files, their md5s in prepare_data's tables (monkeypatched), as a served mirror is checked."""
    site.mkdir()
    archive = _fake_cifar_archive(site)
    _mnist_site(site)
    for name in [archive.name, *prepare_data.MNIST_FILES]:
        md5 = hashlib.md5((site / name).read_bytes()).hexdigest()
        table = prepare_data.CIFAR10_FILES if name == archive.name else prepare_data.MNIST_FILES
        monkeypatch.setitem(table, name, md5)
    return site, archive


def test_mnist_goes_on_to_the_next_mirror_after_a_download_cut_short(
    tmp_path: Path, serve, broken_server, monkeypatch
) -> None:
    """The first mirror's transfer broke off (http.client.IncompleteRead): a traceback, and the
    second mirror, which has every file, was never tried."""
    site = tmp_path / "site"
    site.mkdir()
    _mnist_site(site)
    for name in prepare_data.MNIST_FILES:
        md5 = hashlib.md5((site / name).read_bytes()).hexdigest()
        monkeypatch.setitem(prepare_data.MNIST_FILES, name, md5)
    good = serve(site)
    monkeypatch.setattr(prepare_data, "MNIST_MIRRORS", (broken_server(CUT_SHORT), good))
    prepare_data.prepare("mnist", tmp_path / "data")
    p = loaders.load_prepared("mnist", tmp_path / "data")
    assert p.meta["source"] == good and p.meta["train_shape"] == [6, 1, 28, 28]


def test_meta_json_names_where_the_data_came_from(tmp_path: Path, serve, monkeypatch) -> None:
    """meta.json's source named the --mirror given even when the archive already in raw/ was
    used (nothing came from the mirror, which here does not even answer), and an https mirror
    whose file came over http (the retry) was recorded as https. Now the record names the file
    in raw/, or the URL the file came from."""
    site, archive = _both_sites(tmp_path / "site", monkeypatch)
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        silent = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    data = tmp_path / "data"
    for dataset in ("cifar10", "mnist"):
        prepare_data.prepare(dataset, data, mirror=f"file://{site}")
        prepare_data.prepare(dataset, data, mirror=silent, force=True)  # raw/ has its files
    raw = data / "cifar10" / "raw"
    assert loaders.load_prepared("cifar10", data).meta["source"] == str(raw / archive.name)
    assert loaders.load_prepared("mnist", data).meta["source"] == f"{data / 'mnist' / 'raw'}/"

    # an https mirror that speaks plain http: the https transfer fails, the http retry works
    plain = serve(site)
    for dataset in ("cifar10", "mnist"):
        shutil.rmtree(data / dataset)
        prepare_data.prepare(dataset, data, mirror=plain.replace("http://", "https://"))
    assert loaders.load_prepared("cifar10", data).meta["source"] == plain + archive.name
    assert loaders.load_prepared("mnist", data).meta["source"] == plain


def test_a_meta_json_that_is_no_object_is_refused_and_prepared_again(tmp_path: Path) -> None:
    """meta.json holding a list (valid JSON, not prepare-data's object): the trainer names it
    and the fix instead of an AttributeError, and prepare-data makes the set again."""
    out = prepare_data.prepare("synthetic", tmp_path, num_train=50, num_test=20, seed=0)
    (out / "meta.json").write_text("[]")
    with pytest.raises(PreparedDataError, match=r"meta\.json holds \[\], not prepare-data's"):
        loaders.load_prepared("synthetic", tmp_path, verify=False)
    prepare_data.prepare("synthetic", tmp_path, num_train=50, num_test=20, seed=0)
    loaders.load_prepared("synthetic", tmp_path)


def test_a_hand_edited_meta_json_names_what_the_trainer_reads(tmp_path: Path) -> None:
    """A meta.json without "mean", or with "num_classes": "ten", was a KeyError or TypeError
    traceback once the model was built."""
    out = prepare_data.prepare("synthetic", tmp_path, num_train=50, num_test=20, seed=0)
    good = json.loads((out / "meta.json").read_text())
    for edit, says in (
        ({"mean": None}, "mean is not a list of numbers"),
        ({"num_classes": "ten"}, "num_classes is not a whole number"),
        ({"std": [], "num_classes": 0}, "num_classes is not a whole number, std is not a list"),
    ):
        meta = {k: v for k, v in {**good, **edit}.items() if v is not None}
        (out / "meta.json").write_text(json.dumps(meta))
        with pytest.raises(PreparedDataError) as e:
            loaders.check_prepared("synthetic", tmp_path, verify=False)
        assert str(e.value).startswith(f"{out / 'meta.json'}: ") and says in str(e.value)
        assert "scalestudy prepare-data" in str(e.value) and "--force" in str(e.value)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ({"train_shape": None}, "train_shape is not a list of 4 whole numbers"),
        ({"test_shape": [16, 3, 32]}, "test_shape is not a list of 4 whole numbers"),
        ({"mean": [0.5, 0.5]}, "mean has 2 values and std 3, but the images have 3 channels"),
        ({"std": [0.25]}, "mean has 3 values and std 1, but the images have 3 channels"),
        ({"std": [0.25, 0.0, 0.25]}, "std is not a list of numbers > 0"),
        # a 401-digit integer: math.isfinite's OverflowError traceback
        ({"mean": [10**400, 0.5, 0.5]}, "mean is not a list of numbers"),
        ({"num_classes": 5}, "train labels span 0..9, but"),
    ],
)
def test_a_meta_json_the_data_cannot_follow_is_one_line(tmp_path: Path, edit, says) -> None:
    """What the trainer does with meta.json, checked before it does it: no train_shape was a
    KeyError, a mean of 2 values for 3 channels a RuntimeError in normalize, num_classes below
    the labels an IndexError at the first step; a single std normalised every channel alike
    and a std of 0 made NaN inputs, both accepted."""
    out = prepare_data.prepare("synthetic", tmp_path, num_train=64, num_test=16, seed=0)
    good = json.loads((out / "meta.json").read_text())
    meta = {k: v for k, v in {**good, **edit}.items() if v is not None}
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PreparedDataError) as e:
        loaders.load_prepared("synthetic", tmp_path)
    msg = str(e.value)
    assert says in msg and "\n" not in msg
    assert msg.endswith(
        f"recreate: scalestudy prepare-data --dataset synthetic --data-dir {tmp_path} "
        "--num-train 64 --num-test 16 --seed 0 --force"
    )


@pytest.mark.parametrize(
    "edit", [{"mean": [0.0] * 3, "std": [1.0] * 3}, {"std": [0.25] * 3}, {"num_classes": 12}]
)
def test_a_meta_json_edited_in_what_the_trainer_reads_is_prepared_again(tmp_path, edit):
    """prepare-data checked meta.json's format, parameters and data.pt's sha256 only: a mean,
    std or num_classes edited to other valid values (every input, the model's outputs) was
    "prepared and intact; nothing to do", and every run trained with the edit. Now the stats
    are recomputed from data.pt and the set is made again."""
    out = prepare_data.prepare("synthetic", tmp_path, num_train=64, num_test=16, seed=0)
    good = json.loads((out / "meta.json").read_text())
    mtime = (out / "data.pt").stat().st_mtime_ns
    prepare_data.prepare("synthetic", tmp_path, num_train=64, num_test=16, seed=0)
    assert (out / "data.pt").stat().st_mtime_ns == mtime  # the untouched set is left alone
    (out / "meta.json").write_text(json.dumps({**good, **edit}))
    loaders.load_prepared("synthetic", tmp_path)  # a meta.json the trainer accepts
    prepare_data.prepare("synthetic", tmp_path, num_train=64, num_test=16, seed=0)
    assert json.loads((out / "meta.json").read_text()) == good  # made again


def test_a_data_dir_one_level_too_deep_names_the_one_to_give(tmp_path: Path) -> None:
    """--data-dir results/data/synthetic (the dataset itself) suggested preparing it again
    there, a nested copy (for cifar10 a second download)."""
    out = prepare_data.prepare("synthetic", tmp_path, num_train=50, num_test=20, seed=0)
    with pytest.raises(PreparedDataError) as e:
        loaders.check_prepared("synthetic", out, verify=False)
    assert f"{out / 'meta.json'} does" in str(e.value)
    assert str(e.value).endswith(
        f"--data-dir takes the directory given to prepare-data, here {tmp_path}"
    )


def test_the_recreate_command_makes_the_same_synthetic_set(tmp_path: Path) -> None:
    """A changed data.pt of a 50/20 seed-7 synthetic set: the suggested "recreate: ... --force"
    carried neither sizes nor seed, and following it made the default 50000/10000 seed-0 set."""
    out = prepare_data.prepare("synthetic", tmp_path, num_train=50, num_test=20, seed=7)
    tensors = torch.load(out / "data.pt", weights_only=True)
    tensors["train_y"][0] = (tensors["train_y"][0] + 1) % 10
    torch.save(tensors, out / "data.pt")
    with pytest.raises(PreparedDataError) as e:
        loaders.load_prepared("synthetic", tmp_path)
    cmd = str(e.value).split("recreate: ")[1]
    assert "--num-train 50 --num-test 20 --seed 7 --force" in cmd
    assert cli.main(shlex.split(cmd)[1:]) == 0  # what a user pastes
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["num_train"], meta["num_test"], meta["seed"]) == (50, 20, 7)
    loaders.load_prepared("synthetic", tmp_path)


def test_the_create_command_for_a_missing_data_pt_makes_the_same_synthetic_set(
    tmp_path: Path,
) -> None:
    """meta.json of a 50/20 seed-7 synthetic set but no data.pt (a partial copy): "Create it
    with: ..." was built before meta.json was read, so it carried neither sizes nor seed, and
    following it made the default 50000/10000 seed-0 set."""
    out = prepare_data.prepare("synthetic", tmp_path, num_train=50, num_test=20, seed=7)
    (out / "data.pt").unlink()
    with pytest.raises(PreparedDataError) as e:
        loaders.check_prepared("synthetic", tmp_path, verify=False)
    cmd = str(e.value).split("Create it with: ")[1]
    assert "--num-train 50 --num-test 20 --seed 7" in cmd
    assert cli.main(shlex.split(cmd)[1:]) == 0  # what a user pastes
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["num_train"], meta["num_test"], meta["seed"]) == (50, 20, 7)
    loaders.load_prepared("synthetic", tmp_path)


@pytest.mark.parametrize("name", ["meta.json", "data.pt"])
def test_a_directory_in_the_way_of_a_prepared_file_is_named_so(tmp_path: Path, name) -> None:
    """A directory where meta.json (or data.pt) belongs was reported as "does not exist: ...
    Create it with: prepare-data ...", and that command failed on the directory in the way
    (after rewriting data.pt). The line names the directory and the fix: remove it."""
    out = prepare_data.prepare("synthetic", tmp_path, num_train=50, num_test=20)
    (out / name).unlink()
    (out / name).mkdir()
    with pytest.raises(PreparedDataError) as e:
        # the study's sizes, as the training jobs pass them (meta.json's are not to be read)
        loaders.check_prepared("synthetic", tmp_path, verify=False, expect=(50, 20))
    said, _, cmd = str(e.value).partition(", then create the data with: ")
    assert said == f"{out / name} is in the way (a directory, not prepare-data's file): remove it"
    (out / name).rmdir()
    assert cli.main(shlex.split(cmd)[1:]) == 0  # what a user pastes, after removing it
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["num_train"], meta["num_test"]) == (50, 20)
    loaders.load_prepared("synthetic", tmp_path)


def test_the_suggested_command_quotes_a_data_dir_with_a_space(tmp_path: Path) -> None:
    """--data-dir "my data" was printed bare: pasted into a shell, the command got two
    arguments, "my" and "data"."""
    data_dir = tmp_path / "my data"
    with pytest.raises(PreparedDataError) as e:
        loaders.check_prepared("synthetic", data_dir, verify=False)
    argv = shlex.split(str(e.value).split("Create it with: ")[1])
    assert argv == [
        "scalestudy",
        "prepare-data",
        "--dataset",
        "synthetic",
        "--data-dir",
        str(data_dir),
    ]


def test_a_full_disk_is_one_line_and_leaves_no_partial_file(tiny_fs, capsys) -> None:
    """torch.save on a full filesystem raised "enforce fail at inline_container.cc" as a
    traceback (a real 1 MiB tmpfs; 1000 synthetic images are 3 MB)."""
    argv = ["prepare-data", "--dataset", "synthetic", "--data-dir", str(tiny_fs)]
    assert cli.main([*argv, "--num-train", "1000", "--num-test", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert f"cannot write {tiny_fs / 'synthetic' / 'data.pt'}: no space left" in err[0], err
    assert "--data-dir" in err[0]
    assert sorted(p.name for p in (tiny_fs / "synthetic").iterdir()) == []  # no temp file


def test_a_ctrl_c_during_the_write_is_an_interrupt_not_a_failing_disk(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """torch.save turns a KeyboardInterrupt (or a stop signal's Stopped) raised in its writes
    into RuntimeError("enforce fail at inline_container.cc"), which prepare-data reported as a
    write failure naming the disk, exit 1: a shell loop went on as after a failure, not an
    interrupt. The interrupt here is raised where a signal's would be, in the file's write."""
    real = prepare_data.atomic_open

    class Interrupted(io.RawIOBase):
        def __init__(self, f):
            self.f, self.n = f, 0

        def writable(self):
            return True

        def write(self, b):
            self.n += len(b)
            if self.n > 1000:
                raise KeyboardInterrupt
            return self.f.write(b)

    @contextlib.contextmanager
    def interrupted(path, *args, **kwargs):
        with real(path, *args, **kwargs) as f:
            yield Interrupted(f) if Path(path).name == "data.pt" else f

    monkeypatch.setattr(prepare_data, "atomic_open", interrupted)
    argv = ["prepare-data", "--dataset", "synthetic", "--data-dir", str(tmp_path)]
    assert cli.main([*argv, "--num-train", "50", "--num-test", "20"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["scalestudy prepare-data: interrupted"], err
    assert not (tmp_path / "synthetic" / "data.pt").exists()


def test_a_failed_write_leaves_the_old_preparation_usable(tmp_path: Path, monkeypatch) -> None:
    """prepare-data removed meta.json before writing the new data.pt: when that write failed
    (a full disk), the old, intact preparation was gone with it ("not prepared")."""
    out = prepare_data.prepare("synthetic", tmp_path, num_train=50, num_test=20, seed=0)
    real = prepare_data.atomic_open

    def full_disk(path, *args, **kwargs):
        if Path(path).name == "data.pt":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(prepare_data, "atomic_open", full_disk)
    with pytest.raises(PreparedDataError, match="cannot write .*data.pt: .*No space left"):
        prepare_data.prepare("synthetic", tmp_path, num_train=60, num_test=20, seed=1)
    assert loaders.load_prepared("synthetic", tmp_path).meta["seed"] == 0  # the old set, whole
    assert json.loads((out / "meta.json").read_text())["num_train"] == 50


def test_a_file_mirror_and_a_mirror_that_is_no_url(tmp_path: Path, capsys) -> None:
    """--mirror file://DIR with a file there: torchvision's AttributeError traceback and a 0-byte
    archive left behind; --mirror notaurl: "unknown url type", naming neither flag nor fix."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "cifar-10-python.tar.gz").write_bytes(b"not the archive" * 50)
    out = tmp_path / "data"
    argv = ["prepare-data", "--dataset", "cifar10", "--data-dir", str(out), "--mirror"]
    for mirror, says in (
        (f"file://{site}", f"{site / 'cifar-10-python.tar.gz'}: md5 mismatch"),
        (f"file://{tmp_path / 'nowhere'}", f"{tmp_path / 'nowhere'}/cifar-10-python.tar.gz (fr"),
        (f"file://{tmp_path / 'nowhere'}", "No such file or directory; --mirror file:///DIR"),
        ("notaurl", "--mirror 'notaurl' is not a URL: give one starting with http://"),
    ):
        assert cli.main([*argv, mirror]) == 2, mirror
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0] and "Traceback" not in err[0], err
        raw = out / "cifar10" / "raw"
        assert not raw.exists() or not list(raw.iterdir()), list(raw.iterdir())


def test_a_file_mirror_that_cannot_be_read_is_one_line_naming_the_fix(
    tmp_path: Path, capsys
) -> None:
    """--mirror file://DIR whose file could not be read: a read error (EIO: a failing disk, a
    network file system; here /proc/self/mem, which fails at offset 0) was a traceback; a
    directory under the archive's name, or the archive's own path given for DIR, read "does not
    exist"; file://relative/dir took "relative" for a host and looked in /dir. Each is one line
    now: the path, the cause, and what --mirror file:// takes."""
    name = "cifar-10-python.tar.gz"
    (tmp_path / "as-dir" / name).mkdir(parents=True)
    (tmp_path / "eio").mkdir()
    (tmp_path / "eio" / name).symlink_to("/proc/self/mem")
    _need_a_failing_read()
    archive = tmp_path / "archive" / name
    archive.parent.mkdir()
    archive.write_bytes(b"not the archive" * 50)
    out = tmp_path / "data"
    argv = ["prepare-data", "--dataset", "cifar10", "--data-dir", str(out), "--mirror"]
    fix = f"--mirror file:///DIR takes the absolute path of a directory with {name}, readable here"
    for mirror, path, says in (
        (f"file://{tmp_path / 'as-dir'}", tmp_path / "as-dir" / name, "Is a directory"),
        (f"file://{tmp_path / 'eio'}", tmp_path / "eio" / name, "Input/output error"),
        (f"file://{archive}", archive / name, "Not a directory"),
    ):
        assert cli.main([*argv, mirror]) == 2, mirror
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "Traceback" not in err[0], err
        assert f"cannot read {path} (from {mirror}/{name}): {says}" in err[0], err
        assert err[0].endswith(fix), err
        raw = out / "cifar10" / "raw"
        assert not raw.exists() or not list(raw.iterdir()), list(raw.iterdir())
    relative = f"file://{str(tmp_path / 'archive').lstrip('/')}"  # two slashes: a host
    host = relative.removeprefix("file://").split("/")[0]
    assert cli.main([*argv, relative]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{relative}/{name} names the host {host!r}" in err[0], err
    assert err[0].endswith(fix), err


@pytest.fixture
def stalling_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """stalling_server(tls) -> base URL of a server on 127.0.0.1 (a thread per connection) that
    answers every request with 200, a Content-Length of 100,000 bytes and the first 1,000 of
    them, then sends nothing more (a stalled transfer) until the test ends. tls=True: https,
    with a self-signed certificate for 127.0.0.1 that this test trusts (SSL_CERT_FILE); a
    plain http request to it fails the TLS handshake (the server then closes the connection)."""
    import ssl

    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setattr(prepare_data, "DOWNLOAD_STALL_S", 1.0)
    done = threading.Event()
    socks = []

    def start(tls: bool) -> str:
        context = None
        if tls:
            if shutil.which("openssl") is None:  # outside CI a skip naming it, as elsewhere
                need("openssl", "apt-get install openssl")
            cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
            subprocess.run(
                ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                 "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                 "-keyout", str(key), "-out", str(cert)],
                check=True, capture_output=True,
            )  # fmt: skip
            monkeypatch.setenv("SSL_CERT_FILE", str(cert))
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        socks.append(sock)

        def answer(conn: socket.socket) -> None:
            with conn:
                try:
                    if context is not None:
                        conn = context.wrap_socket(conn, server_side=True)
                    request = b""
                    while b"\r\n\r\n" not in request and (more := conn.recv(65536)):
                        request += more
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + bytes(1000))
                    done.wait(30)
                except OSError:  # a plain request to the TLS port, or the client gone
                    pass

        def accept() -> None:
            while True:
                try:
                    conn, _ = sock.accept()
                except OSError:  # closed at the end of the test
                    return
                threading.Thread(target=answer, args=(conn,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        return f"{'https' if tls else 'http'}://127.0.0.1:{sock.getsockname()[1]}/"

    yield start
    done.set()
    for sock in socks:
        sock.close()


def test_a_download_that_stalls_midway_leaves_no_part_under_the_archives_name(
    tmp_path: Path, stalling_server, capsys
) -> None:
    """A transfer that stalled (or was reset) after part of the archive had arrived: that part
    stayed in raw/ under the archive's name, where the advice says to place the file by hand,
    though http.client's own errors (a chunked reply cut short) already removed theirs."""
    url = stalling_server(tls=False)
    out = tmp_path / "data"
    rc = cli.main(["prepare-data", "--dataset", "cifar10", "--data-dir", str(out), "--mirror", url])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "nothing received for 1 s" in err[0], err
    raw = out / "cifar10" / "raw"
    assert not raw.exists() or not list(raw.iterdir()), list(raw.iterdir())


def test_a_failed_https_download_names_its_cause_not_only_the_http_retrys(
    tmp_path: Path, stalling_server, capsys
) -> None:
    """After a failed https transfer, torchvision retried over http and only the retry's error
    was shown: an https download that stalled read "Connection reset by peer" (the http
    request on the TLS port), as a firewall's "connection refused on port 80" hid a TLS or
    proxy error; and a 0-byte file stayed under the archive's name. Now both causes, the
    https one first, on one line."""
    url = stalling_server(tls=True)
    out = tmp_path / "data"
    rc = cli.main(["prepare-data", "--dataset", "cifar10", "--data-dir", str(out), "--mirror", url])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    https, http = url + "cifar-10-python.tar.gz", url.replace("https", "http") + "c"
    assert f"could not download {https}" in err[0], err
    why_https = err[0].index("nothing received for 1 s")  # the https transfer's own cause
    assert why_https < err[0].index(http), err  # then the http retry's
    assert err[0].count("Without internet") == 1 and err[0].endswith("or pass --mirror URL.")
    raw = out / "cifar10" / "raw"
    assert not raw.exists() or not list(raw.iterdir()), list(raw.iterdir())


def test_an_https_mirror_with_a_query_is_not_retried_over_http(
    tmp_path: Path, serve, capsys, monkeypatch
) -> None:
    """A failed https transfer is retried over http (torchvision's habit, for the public
    archives). For a signed URL (https://host/dir/?token=abc) that sent the token in clear
    text to whatever is on the path, the proxy or TLS failure that failed https included.
    Now a URL with a query is not retried over http: one line says why; without one, the
    retry stays."""
    site = tmp_path / "site"
    site.mkdir()
    archive = _fake_cifar_archive(site)
    monkeypatch.setitem(
        prepare_data.CIFAR10_FILES, archive.name, hashlib.md5(archive.read_bytes()).hexdigest()
    )
    # an http server asked over https: the TLS handshake fails, the http retry would succeed
    port = serve(site).removeprefix("http://127.0.0.1:").rstrip("/")
    signed = f"https://127.0.0.1:{port}/?token=abc"
    argv = ["prepare-data", "--dataset", "cifar10", "--data-dir", str(tmp_path / "data")]
    assert cli.main([*argv, "--mirror", signed]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    url = f"https://127.0.0.1:{port}/{archive.name}?..."  # its query not said (_shown)
    assert f"could not download {url} to " in err, err
    assert "not retried over http: its query may hold a secret, which http sends in clear" in err
    assert "http://127.0.0.1" not in err and err.endswith("or pass --mirror URL."), err
    assert not (tmp_path / "data" / "cifar10" / "meta.json").exists()
    # no query: read over http, as before
    assert cli.main([*argv, "--mirror", f"https://127.0.0.1:{port}/"]) == 0
    source = loaders.load_prepared("cifar10", tmp_path / "data").meta["source"]
    assert source == f"http://127.0.0.1:{port}/{archive.name}"


def test_a_wrong_file_mirror_never_replaces_a_good_archive(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """--mirror file://DIR was copied over raw/'s archive before its md5 was checked: a wrong
    DIR (another version of the archive) replaced the good archive there, then the mismatch
    removed it, and the next run downloaded it again. The archive there is now used (as for an
    http mirror); with none there, the one line names the mirror's file and leaves raw/ as it
    was."""
    good, wrong = tmp_path / "good", tmp_path / "wrong"
    for d in (good, wrong):
        d.mkdir()
    archive = _fake_cifar_archive(good)
    (wrong / archive.name).write_bytes(b"another archive" * 50)
    monkeypatch.setitem(
        prepare_data.CIFAR10_FILES, archive.name, hashlib.md5(archive.read_bytes()).hexdigest()
    )
    out = tmp_path / "data"
    argv = ["prepare-data", "--dataset", "cifar10", "--data-dir", str(out), "--force"]
    assert cli.main([*argv, "--mirror", f"file://{good}"]) == 0
    raw_file = out / "cifar10" / "raw" / archive.name
    assert raw_file.read_bytes() == archive.read_bytes()
    capsys.readouterr()

    assert cli.main([*argv, "--mirror", f"file://{wrong}"]) == 0
    assert raw_file.read_bytes() == archive.read_bytes()  # kept, and used
    assert "is there with the right md5; not downloaded again" in capsys.readouterr().out

    raw_file.write_bytes(archive.read_bytes()[:100])  # a partial copy: the mirror is needed
    assert cli.main([*argv, "--mirror", f"file://{wrong}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"scalestudy prepare-data: {wrong / archive.name}: md5 mismatch"
    ), err
    assert f"not kept as {raw_file}" in err[0], err
    assert raw_file.read_bytes() == archive.read_bytes()[:100]
    assert [p.name for p in raw_file.parent.iterdir() if p.name.startswith(".")] == []


def test_a_full_disk_while_extracting_or_downloading_is_one_line(
    tiny_fs, tmp_path: Path, serve, monkeypatch, capsys
) -> None:
    """The archive fit on the disk but its contents did not (a real 1 MiB tmpfs; 2 MB of zeros
    in a small archive): tarfile's write failed with an OSError naming no file, which
    cli.main takes for a bug, a traceback after the whole download. A download that fills the
    disk read "could not download ...: No space left on device. Without internet, ..." (and
    over https was retried over http)."""
    site = tmp_path / "site"
    site.mkdir()
    archive = site / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
        info.size = 2 * 2**20
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    monkeypatch.setitem(prepare_data.CIFAR10_FILES, archive.name, md5)
    argv = ["prepare-data", "--dataset", "cifar10", "--data-dir", str(tiny_fs), "--mirror"]
    assert cli.main([*argv, f"file://{site}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    raw = tiny_fs / "cifar10" / "raw"
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert f"cannot extract {raw / archive.name} into {raw}: no space left" in err[0], err
    assert err[0].endswith("free space there or give another --data-dir"), err

    (raw / archive.name).unlink()
    shutil.rmtree(raw / "cifar-10-batches-py")
    big = site / "big"
    big.mkdir()
    (big / archive.name).write_bytes(os.urandom(2 * 2**20))  # more than the disk holds
    monkeypatch.setitem(
        prepare_data.CIFAR10_FILES,
        archive.name,
        hashlib.md5((big / archive.name).read_bytes()).hexdigest(),
    )
    assert cli.main([*argv, serve(big)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot write {raw / archive.name}: no space left" in err[0], err
    assert list(raw.iterdir()) == []  # no temp file


# write(2) fails with EIO for a file whose path holds $FAIL_WRITES (a dying disk, a dead network
# mount), loaded with LD_PRELOAD into a real prepare-data process
FAIL_WRITES_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

ssize_t write(int fd, const void *buf, size_t count) {
    static ssize_t (*real)(int, const void *, size_t);
    if (!real) real = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    const char *mark = getenv("FAIL_WRITES");
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t len = mark ? readlink(link, path, sizeof path - 1) : -1;
    if (len > 0) {
        path[len] = 0;
        if (strstr(path, mark)) {
            errno = EIO;
            return -1;
        }
    }
    return real(fd, buf, count);
}
"""


@pytest.fixture
def failing_writes(tmp_path: Path) -> Path:
    """A shared library (LD_PRELOAD) whose write(2) fails with EIO on files named by
    $FAIL_WRITES."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        need("a C compiler (cc)", "install gcc")
    source, lib = tmp_path / "fail_writes.c", tmp_path / "fail_writes.so"
    source.write_text(FAIL_WRITES_C)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(source), "-ldl"], check=True)
    return lib


def test_an_io_error_writing_a_download_is_one_line_naming_the_disk(
    tmp_path: Path, serve, failing_writes
) -> None:
    """write(2) of raw/'s temp file failed with EIO (a failing disk, a dead network mount):
    the error names no file, so a --mirror file:// copy ended in a traceback and an http
    download read "could not download URL ...: Input/output error. Without internet, ...",
    blaming the network (an https one was even retried over http). Now one line: the file,
    the cause, and what to do; no temp file is left."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "cifar-10-python.tar.gz").write_bytes(os.urandom(2 * 2**20))
    out = tmp_path / "data"
    raw = out / "cifar10" / "raw"
    target = raw / "cifar-10-python.tar.gz"
    env = {**os.environ, "LD_PRELOAD": str(failing_writes), "FAIL_WRITES": "/.cifar-10-python"}
    for mirror in (serve(site), f"file://{site}"):
        argv = ["--dataset", "cifar10", "--data-dir", str(out), "--mirror", mirror]
        proc = subprocess.run(
            [sys.executable, "-m", "scalestudy", "prepare-data", *argv],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(err) == 1, (mirror, proc.stderr)
        assert "could not download" not in err[0] and "Without internet" not in err[0], err
        assert f"cannot write {target}: OSError: [Errno 5] Input/output error" in err[0], err
        assert err[0].endswith(
            f"check the file system of {raw} (the kernel log, dmesg, names a failing disk or "
            "mount) or give another --data-dir"
        ), err
        assert list(raw.iterdir()) == []  # no temp file


def test_a_read_only_or_failing_data_dir_is_one_line_naming_its_fix(
    tiny_fs, tmp_path: Path, monkeypatch, capsys
) -> None:
    """raw/ on a file system remounted read-only (EROFS), and a temp file whose fsync failed
    with EIO, each read "...; free space there or give another --data-dir": the advice of a
    full disk, for a disk that has space. Now the fix named is the cause's."""
    site = tmp_path / "site"
    site.mkdir()
    archive = site / "cifar-10-python.tar.gz"
    archive.write_bytes(b"an archive" * 100)
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    monkeypatch.setitem(prepare_data.CIFAR10_FILES, archive.name, md5)  # fsync'd, not refused
    raw = tiny_fs / "cifar10" / "raw"
    target = raw / "cifar-10-python.tar.gz"
    argv = ["prepare-data", "--dataset", "cifar10", "--data-dir", str(tiny_fs)]
    argv += ["--mirror", f"file://{site}"]

    with monkeypatch.context() as m:
        synced = fsync_fails_at_file(m, 1, errno.EIO)
        assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(synced) == 1 and len(err) == 1, err
    assert f"cannot write {target}: OSError: [Errno 5] Input/output error" in err[0], err
    assert err[0].endswith(
        f"check the file system of {raw} (the kernel log, dmesg, names a failing disk or mount) "
        "or give another --data-dir"
    ), err
    assert list(raw.iterdir()) == []

    subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], check=True)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"cannot write {target}: no permission to write ([Errno 30] Read-only" in err[0], err
    assert err[0].endswith(f"make {raw} writable or give another --data-dir"), err
    # the first run into a data directory: its dataset directory cannot be made (it was the
    # bare "DIR/synthetic: Read-only file system", no fix)
    fresh = ["prepare-data", "--dataset", "synthetic", "--data-dir", str(tiny_fs / "fresh")]
    assert cli.main([*fresh, "--num-train", "64", "--num-test", "16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"cannot create {tiny_fs / 'fresh' / 'synthetic'}: no permission to write" in err[0]
    assert err[0].endswith(f"make {tiny_fs} writable or give another --data-dir"), err


def test_a_directory_in_the_way_or_a_bad_mirror_url_is_one_line_naming_it(tmp_path, capsys):
    """A directory where data.pt goes was called a failing disk ("check dmesg"), naming the temp
    file; a --mirror that is no URL ('http://[::1/') said "Invalid IPv6 URL" alone."""
    data = tmp_path / "data"
    (data / "synthetic" / "data.pt").mkdir(parents=True)
    argv = ["prepare-data", "--dataset", "synthetic", "--data-dir", str(data)]
    assert cli.main([*argv, "--num-train", "64", "--num-test", "16"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert f"{data / 'synthetic' / 'data.pt'} is in the way (Is a directory)" in err, err
    assert "dmesg" not in err and ".tmp" not in err and err.endswith("remove it"), err
    # a file where the dataset's directory goes (it was "DIR/synthetic: File exists")
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "synthetic").write_text("a file")
    argv = ["prepare-data", "--dataset", "synthetic", "--data-dir", str(blocked)]
    assert cli.main([*argv, "--num-train", "64", "--num-test", "16"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    in_the_way = f"{blocked / 'synthetic'} is in the way (a file, not a directory): remove it"
    assert in_the_way in err, err
    # a file as --data-dir itself, or on its way: that file is named, not the path under it
    for data_dir in (blocked / "synthetic", blocked / "synthetic" / "deeper"):
        argv = ["prepare-data", "--dataset", "synthetic", "--data-dir", str(data_dir)]
        assert cli.main([*argv, "--num-train", "64", "--num-test", "16"]) == 2
        (err,) = capsys.readouterr().err.strip().splitlines()
        assert in_the_way in err, err
    # a data directory (or its raw/) linked into scratch space since purged: "File exists",
    # with the advice to check for a failing disk
    linked = tmp_path / "linked"
    (linked / "cifar10").mkdir(parents=True)
    (linked / "synthetic").symlink_to(tmp_path / "purged" / "synthetic")
    (linked / "cifar10" / "raw").symlink_to(tmp_path / "purged" / "raw")
    for dataset, link in (("synthetic", "synthetic"), ("cifar10", "cifar10/raw")):
        argv = ["prepare-data", "--dataset", dataset, "--data-dir", str(linked)]
        # cifar10: refused at raw/, before any download (port 9: nothing would answer)
        extra = {"synthetic": ["--num-train", "64"], "cifar10": ["--mirror", "http://127.0.0.1:9/"]}
        assert cli.main([*argv, *extra[dataset]]) == 2
        (err,) = capsys.readouterr().err.strip().splitlines()
        target = tmp_path / "purged" / Path(link).name
        missing = f"{linked / link} is a symlink to missing {target}"
        assert missing in err and "dmesg" not in err, err
    argv = ["prepare-data", "--dataset", "mnist", "--data-dir", str(data)]
    assert cli.main([*argv, "--mirror", "http://[::1/"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "--mirror 'http://[::1/' is no URL (Invalid IPv6 URL)" in err, err
    # a host name no resolver takes: the codec's text alone, naming neither mirror nor fix
    for host in ("mirror..example.org", "a" * 64 + ".example.org"):
        assert cli.main([*argv, "--mirror", f"http://{host}/"]) == 2
        (err,) = capsys.readouterr().err.strip().splitlines()
        assert f"--mirror 'http://{host}/': its host name is not valid (" in err, err


def test_meta_json_names_where_a_redirect_led(tmp_path: Path, serve, monkeypatch) -> None:
    """A mirror that redirects (a moved site, a CDN): urllib follows it, and meta.json's source
    named the URL asked for, not the server the bytes came from. Now the final URL."""
    site, archive = _both_sites(tmp_path / "site", monkeypatch)
    (tmp_path / "moved" / "here").mkdir(parents=True)
    shutil.copytree(site, tmp_path / "moved" / "here", dirs_exist_ok=True)
    moved = serve(tmp_path / "moved") + "here/"

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", moved + self.path.rsplit("/", 1)[-1])
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    asked = serve(Redirect) + "old/"
    data = tmp_path / "data"
    for dataset in ("cifar10", "mnist"):
        prepare_data.prepare(dataset, data, mirror=asked)
    assert loaders.load_prepared("cifar10", data).meta["source"] == moved + archive.name
    assert loaders.load_prepared("mnist", data).meta["source"] == moved


def test_a_mirror_with_a_query_string_gets_each_file_and_meta_json_keeps_no_token(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """--mirror https://host/dir/?token=abc (a signed URL): the file name was appended to the
    URL's text, asking for dir/?token=abc/cifar-10-python.tar.gz, which a server that checks
    its token refuses (or serves dir/ for); and meta.json would have recorded the token,
    copied with the data. Now the name joins the path, the query kept, and meta.json's
    source names what was fetched without its query (a redirect's too). A fragment (#...),
    never sent to a server, is refused in one line naming the flag."""
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    site, archive = _both_sites(tmp_path / "site", monkeypatch)
    asked: list[str] = []

    class Signed(http.server.BaseHTTPRequestHandler):
        """dir/<file>?token=abc served; old/<file>?token=abc redirected to a URL signed anew
        (new/<file>?sig=xyz); anything else 403, as a bucket that checks its token does."""

        def do_GET(self) -> None:
            asked.append(self.path)
            path, _, query = self.path.partition("?")
            folder, _, name = path.strip("/").partition("/")
            if folder == "old" and query == "token=abc":
                self.send_response(302)
                self.send_header("Location", f"/new/{name}?sig=xyz")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            ok = (folder, query) in (("dir", "token=abc"), ("new", "sig=xyz"))
            if not ok or not (site / name).is_file() or "/" in name:
                self.send_error(403)
                return
            body = (site / name).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Signed)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        data = tmp_path / "data"
        for dataset in ("cifar10", "mnist"):
            argv = ["prepare-data", "--dataset", dataset, "--data-dir", str(data)]
            assert cli.main([*argv, "--mirror", f"{host}/dir/?token=abc"]) == 0, asked
        names = [archive.name, *prepare_data.MNIST_FILES]
        assert asked == [f"/dir/{name}?token=abc" for name in names]
        assert loaders.load_prepared("cifar10", data).meta["source"] == (
            f"{host}/dir/{archive.name}"
        )
        assert loaders.load_prepared("mnist", data).meta["source"] == f"{host}/dir/"
        # redirected to a URL signed anew: where it led, without its signature either
        other = tmp_path / "other"
        for dataset in ("cifar10", "mnist"):
            argv = ["prepare-data", "--dataset", dataset, "--data-dir", str(other)]
            assert cli.main([*argv, "--mirror", f"{host}/old?token=abc"]) == 0, asked
        assert loaders.load_prepared("cifar10", other).meta["source"] == (
            f"{host}/new/{archive.name}"
        )
        assert loaders.load_prepared("mnist", other).meta["source"] == f"{host}/new/"
        for meta in [*data.glob("*/meta.json"), *other.glob("*/meta.json")]:
            assert "abc" not in meta.read_text() and "xyz" not in meta.read_text(), meta
        # a fragment: refused, nothing asked
        capsys.readouterr()
        del asked[:]
        argv = ["prepare-data", "--dataset", "cifar10", "--data-dir", str(tmp_path / "third")]
        for mirror, shown in (
            (f"{host}/dir/?token=abc#part", f"{host}/dir/?...#part"),  # the token not said
            (f"{host}/dir/#", f"{host}/dir/#"),
        ):
            assert cli.main([*argv, "--mirror", mirror]) == 2
            (err,) = capsys.readouterr().err.strip().splitlines()
            assert err.startswith(f"scalestudy prepare-data: --mirror {shown!r} has a "), err
            assert asked == [] and not (tmp_path / "third").exists()
        # a token the server refuses (expired): the error lines, kept in the workflow's logs,
        # named the URL with its token; its scheme, host and path still say what failed
        for dataset in ("cifar10", "mnist"):
            argv = ["prepare-data", "--dataset", dataset, "--data-dir", str(tmp_path / "fourth")]
            assert cli.main([*argv, "--mirror", f"{host}/dir/?token=s3cret"]) == 2
            (err,) = capsys.readouterr().err.strip().splitlines()
            assert "s3cret" not in err and f"{host}/dir/" in err and "?..." in err, err
            assert "HTTP Error 403" in err, err
        # nor where the md5 is wrong: a file of another size under the name
        (site / archive.name).write_bytes(b"not the archive")
        argv = ["prepare-data", "--dataset", "cifar10", "--data-dir", str(tmp_path / "fifth")]
        assert cli.main([*argv, "--mirror", f"{host}/dir/?token=abc"]) == 2
        (err,) = capsys.readouterr().err.strip().splitlines()
        assert "md5 mismatch" in err and "token=abc" not in err, err
        assert f"{host}/dir/{archive.name}?..." in err, err
    finally:
        server.shutdown()
        server.server_close()


def test_an_archive_in_raw_that_cannot_be_read_is_one_line(tmp_path: Path, capsys) -> None:
    """The archive already in raw/ is read for its md5 before any download; a read error there
    (EIO: a failing disk, a dead network mount; here /proc/self/mem, which fails at offset 0)
    names no file, which cli.main takes for a bug: a traceback. Now one line: the file, the
    cause, and what to do."""
    _need_a_failing_read()
    raw = tmp_path / "data" / "cifar10" / "raw"
    raw.mkdir(parents=True)
    (raw / "cifar-10-python.tar.gz").symlink_to("/proc/self/mem")
    with socket.socket() as sock:  # a loopback port nobody listens on: never reached
        sock.bind(("127.0.0.1", 0))
        mirror = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    argv = ["prepare-data", "--dataset", "cifar10", "--data-dir", str(tmp_path / "data")]
    assert cli.main([*argv, "--mirror", mirror]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    path = raw / "cifar-10-python.tar.gz"
    assert f"cannot read {path}, the archive raw/ holds: Input/output error;" in err[0], err
    assert err[0].endswith(
        f"check the file system of {raw} (the kernel log, dmesg, names a failing disk or mount) "
        "or give another --data-dir"
    ), err


def test_a_mirror_with_a_user_and_password_is_refused_without_echoing_them(
    tmp_path: Path, capsys
) -> None:
    """--mirror https://user:secret@host/dir/: urllib sends no credentials from a URL (it
    looked the whole user:secret@host up as a host name: "Name or service not known"), and the
    error line printed the password, into every log that keeps stderr. Refused before any
    download, in one line that names the host and not the password."""
    argv = ["prepare-data", "--dataset", "cifar10", "--data-dir", str(tmp_path / "data")]
    mirrors = ["https://user:s3cret@127.0.0.1:9/dir/", "http://s3cret@127.0.0.1:9/"]
    for mirror in [*mirrors, "https://user:s3cret@127.0.0.1:9/#part"]:  # the fragment's line too
        assert cli.main([*argv, "--mirror", mirror]) == 2
        (err,) = capsys.readouterr().err.strip().splitlines()
        assert "s3cret" not in err, err
        assert err.startswith("scalestudy prepare-data: --mirror gives a user name"), err
        assert "127.0.0.1:9" in err and not (tmp_path / "data").exists(), err


def test_an_https_mirror_that_answers_404_is_not_retried_over_http(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """A failed https transfer is retried over http (torchvision's habit: for a TLS or proxy
    failure). An https server that answered (404: no such file) was asked again in clear
    text, a request that can only fail or reach someone else, and the line ended in the
    retry's error. Now an answer over https is the error, with no retry; a TLS failure is
    still retried (test_an_https_mirror_with_a_query_is_not_retried_over_http)."""
    import ssl

    if shutil.which("openssl") is None:
        need("openssl", "apt-get install openssl")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # this process trusts the server's cert
    asked: list[str] = []

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_error(404)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        mirror = f"https://127.0.0.1:{server.server_address[1]}/dir/"
        argv = ["prepare-data", "--dataset", "cifar10", "--data-dir", str(tmp_path / "data")]
        assert cli.main([*argv, "--mirror", mirror]) == 2
    finally:
        server.shutdown()
        server.server_close()
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert asked == ["/dir/cifar-10-python.tar.gz"], asked  # over https, once
    assert f"could not download {mirror}cifar-10-python.tar.gz to " in err, err
    assert "HTTP Error 404" in err and "http://" not in err and "nor over http" not in err, err
    assert err.endswith("or pass --mirror URL."), err


def test_a_wrong_archive_already_in_raw_is_named_when_the_download_fails(
    tmp_path: Path, serve, capsys
) -> None:
    """A truncated copy placed in raw/ by hand (an scp cut short), offline: the line said
    "place the file there yourself", where a file already was, with no word of its md5."""
    raw = tmp_path / "data" / "cifar10" / "raw"
    raw.mkdir(parents=True)
    (raw / "cifar-10-python.tar.gz").write_bytes(b"x" * 1000)
    empty = tmp_path / "site"
    empty.mkdir()
    argv = ["prepare-data", "--dataset", "cifar10", "--data-dir", str(tmp_path / "data")]
    assert cli.main([*argv, "--mirror", serve(empty)]) == 2  # 404: the mirror lacks it
    (err,) = capsys.readouterr().err.strip().splitlines()
    bad = hashlib.md5(b"x" * 1000).hexdigest()
    assert err.endswith(f"(md5 {prepare_data.CIFAR10_FILES['cifar-10-python.tar.gz']}; the one "
        f"there, 1,000 bytes, has md5 {bad}) or pass --mirror URL."), err  # fmt: skip


@pytest.mark.parametrize(
    "mirror", ["https://127.0.0.1:1/cifar/?sig=SECRET&expires=1 2", "http://127.0.0.1:1/my data/"]
)
def test_a_mirror_that_is_no_valid_url_is_said_so_without_its_query(
    tmp_path: Path, capsys, mirror
) -> None:
    """urllib's InvalidURL (a space, a control character) was printed with repr(): the
    signed URL's token the line had hidden as ?..., and "the transfer broke off, or the
    server is no HTTP server" for a URL that was never sent."""
    argv = ["prepare-data", "--dataset", "cifar10", "--data-dir", str(tmp_path / "data")]
    assert cli.main([*argv, "--mirror", mirror]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "SECRET" not in err and "broke off" not in err and "nor over http" not in err, err
    assert "not a valid URL" in err and "%20" in err, err


def test_a_mirror_that_redirects_in_a_loop_is_one_line(tmp_path: Path, serve, capsys):
    """urllib's redirect-loop error is three lines of text (a mirror behind a cookie login)."""

    class Loop(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", self.path)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    argv = ["prepare-data", "--dataset", "cifar10", "--data-dir", str(tmp_path / "data")]
    assert cli.main([*argv, "--mirror", serve(Loop) + "cifar/"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "HTTP Error 302" in err and "infinite loop" in err, err


def test_a_meta_json_that_cannot_be_written_is_one_line_with_its_fix(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """data.pt's write failing was "cannot write ...: no space left ...; free space there",
    meta.json's (the disk full just after data.pt) the bare OSError text, no fix."""

    def full(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(prepare_data, "write_json", full)
    argv = ["prepare-data", "--dataset", "synthetic", "--data-dir", str(tmp_path / "data")]
    assert cli.main([*argv, "--num-train", "20", "--num-test", "2"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    meta = tmp_path / "data" / "synthetic" / "meta.json"
    assert f"cannot write {meta}: no space left" in err, err
    assert err.endswith("free space there or give another --data-dir"), err
