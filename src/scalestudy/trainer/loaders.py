"""Loading prepared data, sharding it over ranks, and the two input paths of the trainer.

`load_prepared` reads what `scalestudy prepare-data` (prepare_data.py) wrote and never downloads:
it fails with the command that creates the data.

Two input paths, compared in the study:
- `DeviceLoader`: the whole uint8 split lives on the GPU; batches are gathered by index and
  augmented with batched tensor ops on the device (no worker processes, no host->device copies).
- `make_dataloader`: the conventional torch DataLoader + DistributedSampler + per-sample
  torchvision transforms in worker processes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import shlex
import signal
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from scalestudy import files, vocab
from scalestudy.errors import PreparedDataError

FORMAT_VERSION = 1  # of DIR/<dataset>/{data.pt,meta.json}; prepare_data.py writes it
CROP_PAD = 4  # px of zero padding for the random-crop augmentation (the standard CIFAR recipe)


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from labels/ints: stable across runs, machines and Python versions."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def seed_rank_draws(seed: int, rank: int) -> None:
    """Give this rank its own stream of the global torch RNG. Called once the weights, drawn
    the same on every rank from `seed`, exist: make_dataloader with num_workers=0 augments
    with the global RNG, and the same stream on every rank would crop and flip every rank's
    i-th image of a step alike."""
    torch.manual_seed(derive_seed("rank draws", seed, rank))


def prepare_command(dataset: str, data_dir: str | Path, meta: Any = None) -> str:
    """The `prepare-data` command that makes DIR/<dataset>, shell-quoted: it is pasted into a
    shell, where a --data-dir with a space was two arguments. Given the meta.json read there,
    a synthetic set's --num-train/--num-test/--seed come with it: without them the command
    made the default set (50000/10000, seed 0), not the one prepared there."""
    argv = ["scalestudy", "prepare-data", "--dataset", dataset, "--data-dir", str(data_dir)]
    if dataset == "synthetic" and isinstance(meta, dict) and meta.get("dataset") == dataset:
        for key in ("num_train", "num_test", "seed"):
            value = meta.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                argv += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join(argv)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

# What the trainer reads of meta.json (check_prepared, load_prepared, loop.build and
# build_loaders): data.pt's sha256 (verified against the file), the number of classes (the
# model's outputs), each channel's mean and std (they normalise every input) and the split
# shapes (checked against data.pt). The rest (classes' names, source, a synthetic set's sizes
# and seed) changes no number of a run.
DIGEST_KEYS = ("sha256", "num_classes", "mean", "std", "train_shape", "test_shape")


def data_sha256(meta: dict[str, Any]) -> str:
    """The identity of the data as the trainer sees it: the sha256 of DIGEST_KEYS's values in
    canonical JSON (sorted keys, mean/std as floats: 0 and 0.0 normalise alike). data.pt's own
    sha256 alone left meta.json out, so an edited mean or std, which sets every input the model
    sees, resumed a checkpoint and reported one run. Of a meta.json check_prepared accepted."""
    seen = {key: meta[key] for key in DIGEST_KEYS}
    seen["mean"], seen["std"] = ([float(v) for v in meta[k]] for k in ("mean", "std"))
    canonical = json.dumps(seen, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass
class Prepared:
    train_x: torch.Tensor  # uint8 N x C x H x W
    train_y: torch.Tensor  # int64 N
    test_x: torch.Tensor
    test_y: torch.Tensor
    meta: dict[str, Any]

    @property
    def num_classes(self) -> int:
        return int(self.meta["num_classes"])

    @property
    def mean(self) -> list[float]:
        return list(self.meta["mean"])

    @property
    def std(self) -> list[float]:
        return list(self.meta["std"])


def load_prepared(dataset: str, data_dir: str | Path, *, verify: bool = True) -> Prepared:
    """Load DIR/<dataset>/data.pt as written by prepare-data (never downloads).

    verify=True re-hashes data.pt against meta.json (about 0.5 s for CIFAR-10's 184 MB).
    """
    meta = check_prepared(dataset, data_dir, verify=verify)
    out_dir = Path(data_dir) / dataset
    data_path, meta_path = out_dir / "data.pt", out_dir / "meta.json"
    cmd = prepare_command(dataset, data_dir, meta)
    try:
        t = torch.load(data_path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises assorted types (RuntimeError, UnicodeDecodeError, ...)
        raise PreparedDataError(
            f"{data_path} cannot be read ({e!r}); recreate: {cmd} --force"
        ) from e
    if not isinstance(t, dict):
        raise PreparedDataError(
            f"{data_path} holds a {type(t).__name__}, not a dict of tensors; recreate: "
            f"{cmd} --force"
        )
    for split in ("train", "test"):
        x, y = t.get(f"{split}_x"), t.get(f"{split}_y")
        if (
            not isinstance(x, torch.Tensor)  # a split converted by hand (a list): its .dtype
            or not isinstance(y, torch.Tensor)  # was an AttributeError traceback
            or x.dtype != torch.uint8
            or y.dtype != torch.int64
            or list(x.shape) != meta[f"{split}_shape"]
            or y.shape != (x.shape[0],)
        ):
            raise PreparedDataError(
                f"{data_path}: {split} tensors do not match {meta_path}; recreate: {cmd} --force"
            )
        # a label outside 0..num_classes-1 was an IndexError ("Target 7 is out of bounds") at
        # the first training step
        k = meta["num_classes"]
        if y.numel() and not (int(y.min()) >= 0 and int(y.max()) < k):
            raise PreparedDataError(
                f"{data_path}: {split} labels span {int(y.min())}..{int(y.max())}, but "
                f"{meta_path} has num_classes {k} (labels 0..{k - 1}); recreate: {cmd} --force"
            )
    return Prepared(t["train_x"], t["train_y"], t["test_x"], t["test_y"], meta)


def _meta_if_readable(meta_path: Path) -> Any:
    """meta.json's content, or None where it is missing or no JSON (check_prepared then names
    that): a data.pt gone next to a synthetic set's meta.json is recreated with its sizes and
    seed, not as the default set."""
    try:
        return json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return None


def check_prepared(
    dataset: str, data_dir: str | Path, *, verify: bool = True, expect: tuple[int, int] = (0, 0)
) -> dict:
    """meta.json of DIR/<dataset> once data.pt and meta.json exist and agree, and hold the
    (training, test) images `expect`s (0: not checked); PreparedDataError naming the file and
    the `prepare-data` command otherwise, with the expected sizes where given. verify=False
    skips the sha256 (the cheap check the trainer makes before its process group starts)."""
    out_dir = Path(data_dir) / dataset
    meta_path, data_path = out_dir / "meta.json", out_dir / "data.pt"
    wanted = {"dataset": dataset, "num_train": expect[0], "num_test": expect[1]}

    def command(meta: Any) -> str:
        """The set to make: the expected one where the study says (a synthetic set's sizes),
        else the one `meta` (meta.json's) describes."""
        return prepare_command(dataset, data_dir, wanted if all(expect) else meta)

    cmd = command(_meta_if_readable(meta_path))
    for path in (meta_path, data_path):
        if not path.is_file() and (Path(data_dir) / "meta.json").is_file():
            # --data-dir names the prepared dataset itself, not the directory above it
            raise PreparedDataError(
                f"{path} does not exist, but {Path(data_dir) / 'meta.json'} does: --data-dir "
                f"takes the directory given to prepare-data, here {Path(data_dir).parent}"
            )
        if path.is_dir():  # "does not exist" named a command that failed on it
            raise PreparedDataError(
                f"{path} is in the way (a directory, not prepare-data's file): remove it, then "
                f"create the data with: {cmd}"
            )
        if not path.is_file():
            raise PreparedDataError(
                f"{path} does not exist: {dataset} is not prepared (or preparation did not "
                f"finish). Create it with: {cmd}"
            )
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError as e:
        raise PreparedDataError(
            f"{meta_path} is not valid JSON ({e}); recreate: {cmd} --force"
        ) from e
    if not isinstance(meta, dict):
        raise PreparedDataError(
            f"{meta_path} holds {json.dumps(meta)[:40]}, not prepare-data's object; recreate: "
            f"{cmd} --force"
        )
    cmd = command(meta)  # a synthetic set's sizes and seed
    if meta.get("dataset") != dataset or meta.get("format_version") != FORMAT_VERSION:
        raise PreparedDataError(
            f"{meta_path} describes dataset {meta.get('dataset')!r} format "
            f"{meta.get('format_version')!r}, expected {dataset!r} format {FORMAT_VERSION}; "
            f"recreate: {cmd} --force"
        )
    shape = "a list of 4 whole numbers >= 1"
    shapes = {
        "num_classes": "a whole number",
        "mean": "a list of numbers",
        "std": "a list of numbers > 0",  # a 0 divides to inf/NaN inputs
        "train_shape": shape,
        "test_shape": shape,
    }
    wrong = [key for key in shapes if not _meta_value_ok(key, meta.get(key))]
    if wrong:  # what the trainer reads of it (an edit by hand: a KeyError or TypeError later)
        raise PreparedDataError(
            f"{meta_path}: {', '.join(f'{k} is not {shapes[k]}' for k in wrong)}; recreate: "
            f"{cmd} --force"
        )
    channels = meta["train_shape"][1]
    if not len(meta["mean"]) == len(meta["std"]) == channels:
        # normalize broadcasts them over the channels: a RuntimeError for 2 of 3, and a single
        # value silently normalised every channel alike
        raise PreparedDataError(
            f"{meta_path}: mean has {len(meta['mean'])} values and std {len(meta['std'])}, but "
            f"the images have {channels} channels (train_shape); recreate: {cmd} --force"
        )
    held = (meta["train_shape"][0], meta["test_shape"][0])
    if any(want and want != have for want, have in zip(expect, held, strict=True)):
        raise PreparedDataError(
            f"{meta_path} holds {held[0]} training and {held[1]} test images, the study prepares "
            f"{expect[0] or held[0]} and {expect[1] or held[1]} (--expect-train, --expect-test); "
            f"recreate: {cmd} --force"
        )
    if verify and (actual := files.sha256(data_path)) != meta.get("sha256"):
        raise PreparedDataError(
            f"{data_path} has sha256 {actual} but {meta_path} records {meta.get('sha256')}: "
            f"the file was changed or is incomplete; recreate: {cmd} --force"
        )
    return meta


def _meta_value_ok(key: str, value) -> bool:
    def whole(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 1

    if key == "num_classes":
        return whole(value)
    if key.endswith("_shape"):  # N x C x H x W
        return isinstance(value, list) and len(value) == 4 and all(whole(v) for v in value)

    def finite(v) -> bool:  # a 401-digit integer is no float: isfinite's OverflowError
        try:
            return math.isfinite(v)
        except OverflowError:
            return False

    numbers = isinstance(value, list) and value
    return bool(numbers) and all(
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and finite(v)
        and (key != "std" or v > 0)
        for v in value
    )


# ---------------------------------------------------------------------------------------------
# Sharding
# ---------------------------------------------------------------------------------------------


def _global_slices(n: int, global_batch: int, world_size: int) -> list[tuple[int, int]]:
    """[start, stop) of each global step in the epoch permutation (see epoch_batches)."""
    if world_size < 1 or n < world_size or global_batch < world_size or global_batch % world_size:
        raise ValueError(
            f"need n >= world_size >= 1 and global_batch a multiple of world_size >= world_size; "
            f"got n={n}, global_batch={global_batch}, world_size={world_size}"
        )
    full = n // global_batch
    if full == 0:
        return [(0, n)]  # fewer samples than one global batch: one step takes them all
    # The ragged tail (n % global_batch samples) is dropped: a smaller last step is a new input
    # shape, which re-runs cuDNN autotuning and recompiles under torch.compile (with automatic
    # dynamic shapes, every later step would then run the slower dynamic-shape graph).
    return [(i * global_batch, (i + 1) * global_batch) for i in range(full)]


def _check_rank(world_size: int, rank: int) -> None:
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1} (world_size={world_size})")


def epoch_batches(
    n: int, global_batch: int, world_size: int, rank: int, seed: int, epoch: int
) -> list[torch.Tensor]:
    """This rank's batches (int64 index tensors into 0..n-1) for one epoch.

    Rule: every rank draws the same permutation of range(n) from a torch.Generator seeded with
    `derive_seed("epoch_batches", seed, epoch)`, cuts it into consecutive global slices of
    `global_batch`, and rank r takes `slice[r::world_size]` of each. The last n % global_batch
    samples of the permutation (the ragged tail) are not used in that epoch, so every step has
    the same shape: each sample is used at most once per epoch, and a different tail is left out
    each epoch (the permutation changes). Only when n < global_batch does the one step take all
    n samples (per-rank sizes then differ by at most 1). All ranks take the same number of steps.
    The samples of global step i depend only on (n, global_batch, seed, epoch), not on
    world_size, so strong-scaling runs see the same global batches.

    ValueError unless n >= world_size, global_batch >= world_size and global_batch %
    world_size == 0.
    """
    bounds = _global_slices(n, global_batch, world_size)
    _check_rank(world_size, rank)
    g = torch.Generator().manual_seed(derive_seed("epoch_batches", seed, epoch))
    perm = torch.randperm(n, generator=g)
    return [perm[start:stop][rank::world_size] for start, stop in bounds]


def eval_indices(n: int, world_size: int, rank: int) -> torch.Tensor:
    """This rank's evaluation samples: arange(rank, n, world_size); each exactly once overall.
    Empty for a rank past the last sample (fewer test images than ranks: train.limit_test)."""
    _check_rank(world_size, rank)
    return torch.arange(min(rank, n), n, world_size)


# ---------------------------------------------------------------------------------------------
# Batched augmentation and the device-resident loader
# ---------------------------------------------------------------------------------------------


def augment(x_u8: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random crop (zero padding CROP_PAD px, per-sample offset) + random horizontal flip (p=0.5).

    Batched: pad the batch once, then gather every sample's window with one advanced-indexing op.
    `generator` must be on x_u8's device. Draws offsets (y, x) then flips, in that order.
    """
    return crop_flip(x_u8, *augment_draws(len(x_u8), generator, x_u8.device))


def augment_draws(
    b: int, generator: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """augment's random numbers for a batch of b: crop offsets (2 x b x 1), then flips (b x 1)."""
    off = torch.randint(0, 2 * CROP_PAD + 1, (2, b, 1), generator=generator, device=device)
    flip = torch.rand(b, 1, generator=generator, device=device) < 0.5
    return off, flip


def crop_flip(x_u8: torch.Tensor, off: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """Each sample's CROP_PAD-padded window at its offsets, its columns reversed where flipped."""
    b, c, h, w = x_u8.shape
    dev = x_u8.device
    padded = F.pad(x_u8, (CROP_PAD, CROP_PAD, CROP_PAD, CROP_PAD))
    rows = off[0] + torch.arange(h, device=dev)  # b x h
    cols = off[1] + torch.arange(w, device=dev)  # b x w
    # flipping the crop = reading its columns backwards
    cols = torch.where(flip, cols.flip(1), cols)
    bi = torch.arange(b, device=dev)[:, None, None, None]
    ci = torch.arange(c, device=dev)[None, :, None, None]
    return padded[bi, ci, rows[:, None, :, None], cols[:, None, None, :]]


def _channel_tensor(values: Sequence[float] | torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.float32, device=device).reshape(-1, 1, 1)


def normalize(
    x_u8: torch.Tensor,
    mean: Sequence[float] | torch.Tensor,
    std: Sequence[float] | torch.Tensor,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
) -> torch.Tensor:
    """uint8 (B x)C x H x W -> (x/255 - mean) / std; mean/std per channel, 0-1 scale.

    Computed in float32, then rounded once to `dtype` (the run's autocast dtype: exactly the
    cast autocast would make in the first convolution, so the numbers are the same) and laid out
    NHWC when `channels_last`: the batch leaves the loader as the model consumes it."""
    m, s = _channel_tensor(mean, x_u8.device), _channel_tensor(std, x_u8.device)
    x = x_u8.to(torch.float32).div_(255).sub_(m).div_(s)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    return x.to(dtype=dtype, memory_format=layout)  # no copy when both already hold


# training steps whose batches the device loader prepares at once (at most AHEAD local batches of
# images in memory: 48 MiB of bf16 at local batch 512 on CIFAR-10, twice that in float32 while
# they are normalised)
AHEAD = 16


class DeviceLoader:
    """Batches from a uint8 split held on `device`: (x normalized, y int64), on the device; x in
    `dtype` (the run's autocast dtype, else float32) and NHWC when `channels_last` (normalize).

    train=True: call set_epoch(epoch) before iterating; batches follow epoch_batches(n,
    local_batch * world_size, world_size, rank, seed, epoch) and are augmented with a device
    generator seeded from (seed, rank, epoch), so a run is reproducible for a given world size;
    AHEAD steps' batches are prepared at once, bit for bit as one augment() call per step, and
    a group starts where the throughput window opens (set_epoch's window_at).
    train=False: this rank's eval_indices in chunks of eval_batch (default 2 * local_batch), no
    augmentation; only that subset is moved to the device. Every rank yields as many chunks as the
    largest shard (ceil(n / world_size) samples) needs; a rank's last chunk holds what is left of
    its shard, which may be short, and is empty only where a shorter shard divides evenly by
    eval_batch (33 images on 2 ranks in chunks of 16: 16 + 1 and 16 + 0; 35: 16 + 2 and
    16 + 1): under FSDP every forward is a collective, and a rank with one chunk more waited
    forever for the others (which had gone on to the evaluation's all_reduce).
    """

    def __init__(
        self,
        x_u8: torch.Tensor,
        y: torch.Tensor,
        *,
        local_batch: int,
        world_size: int,
        rank: int,
        seed: int,
        train: bool,
        device: torch.device | str,
        mean: Sequence[float],
        std: Sequence[float],
        eval_batch: int | None = None,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
        flip: bool = True,
    ) -> None:
        if local_batch < 1:
            raise ValueError(f"local_batch must be >= 1, got {local_batch}")
        self.device = torch.device(device)
        self.local_batch, self.world_size, self.rank = local_batch, world_size, rank
        self.seed, self.train, self.epoch, self.window_at = seed, train, 0, None
        self.dtype, self.channels_last = dtype, channels_last
        self.flip = flip  # random horizontal flips in training (vocab.Dataset.flip)
        self.n = len(x_u8)
        if train:
            self._bounds = _global_slices(self.n, local_batch * world_size, world_size)
            _check_rank(world_size, rank)
        else:
            idx = eval_indices(self.n, world_size, rank)
            x_u8, y = x_u8[idx], y[idx]
            self.eval_batch = eval_batch or 2 * local_batch
        self.x = x_u8.to(self.device)  # moved once; indexing then happens on the device
        self.y = y.to(self.device)
        self.mean = _channel_tensor(mean, self.device)
        self.std = _channel_tensor(std, self.device)

    def set_epoch(self, epoch: int, window_at: int | None = None) -> None:
        """`window_at`: the epoch's batch at which the throughput window opens (None: not in
        this epoch). A group of AHEAD batches starts there, so that the window's data time holds
        the preparation of every batch it trains on: at --warmup-steps 5 the first group's
        was made at step 0, and the window's mean data time lacked 11 of 27 steps' (0.58x)."""
        self.epoch, self.window_at = epoch, window_at

    @property
    def steps_per_epoch(self) -> int:
        if self.train:
            return len(self._bounds)
        return math.ceil(math.ceil(self.n / self.world_size) / self.eval_batch)

    def __len__(self) -> int:
        return self.steps_per_epoch

    @property
    def num_samples(self) -> int:
        """Samples this rank yields per epoch."""
        if self.train:
            return sum(len(range(a + self.rank, b, self.world_size)) for a, b in self._bounds)
        return len(self.x)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not self.train:
            for i in range(self.steps_per_epoch):  # the same count on every rank (docstring)
                s = i * self.eval_batch
                xb = self._out(self.x[s : s + self.eval_batch])
                yield xb, self.y[s : s + self.eval_batch]
            return
        batches = epoch_batches(
            self.n,
            self.local_batch * self.world_size,
            self.world_size,
            self.rank,
            self.seed,
            self.epoch,
        )
        # one host->device copy of this epoch's indices instead of one per step
        all_idx = torch.cat(batches).to(self.device, non_blocking=True)
        gen = torch.Generator(device=self.device)
        gen.manual_seed(derive_seed("augment", self.seed, self.rank, self.epoch))
        sizes = [len(b) for b in batches]
        starts = [0, *itertools.accumulate(sizes)]
        # AHEAD steps' batches gathered, cropped, flipped and normalised at once, then handed
        # out as views: each of those ~20 small operations is a kernel launch (7 us of host
        # time on the H200 node), per AHEAD steps instead of per step. The random numbers are
        # drawn step by step as augment() draws them, so the batches are bit for bit those of
        # one augment() per step (training runs are the same as with a per-step loader)
        firsts = sorted(
            f for f in {*range(0, len(sizes), AHEAD), self.window_at or 0} if f < len(sizes)
        )
        for first, end in zip(firsts, [*firsts[1:], len(sizes)], strict=True):
            group = sizes[first:end]
            idx = all_idx[starts[first] : starts[first + len(group)]]
            offs, flips = zip(*(augment_draws(b, gen, self.device) for b in group), strict=True)
            # without flips the draws are made all the same: the crops are those with flips
            flip = torch.cat(flips) & self.flip
            xs = self._out(crop_flip(self.x[idx], torch.cat(offs, 1), flip))
            yield from zip(xs.split(group), self.y[idx].split(group), strict=True)

    def _out(self, x_u8: torch.Tensor) -> torch.Tensor:
        return normalize(x_u8, self.mean, self.std, self.dtype, self.channels_last)


# ---------------------------------------------------------------------------------------------
# The conventional DataLoader path (for comparison)
# ---------------------------------------------------------------------------------------------


class _TensorImages(Dataset):
    """uint8 images + labels with a per-sample transform (run in DataLoader workers)."""

    def __init__(self, x_u8: torch.Tensor, y: torch.Tensor, transform: Any) -> None:
        self.x, self.y, self.transform = x_u8, y, transform

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.transform(self.x[i]), self.y[i]


# The signals the rank stops at (checkpoint.StopFlag, cli's Stopped): Slurm sends a time
# limit's SIGTERM and --signal's USR1 to every process of the job step, a closed terminal SIGHUP
# to its foreground group, and a DataLoader worker that died of one failed the rank mid-step
# ("DataLoader worker (pid N) is killed by signal"), its training since the last checkpoint
# lost. The rank acts on them; its workers must not die of them, yet end on the SIGTERM their
# parent sends them (torch's shutdown, multiprocessing's at exit: ignored, the rank waited for
# them for ever). So each worker ignores SIGHUP and USR1 (its parent never sends them), and
# takes SIGTERM in a thread of its own (sigwaitinfo: a Python handler is not told the sender),
# which ends the worker when its parent sent it, as torch's own handler does, and ignores it
# otherwise. The rank forks its workers with the three blocked (StopSafeDataLoader), so one that
# comes before the worker's set-up waits for it instead of killing the worker.
WORKER_STOPS = vocab.RANK_STOP_SIGNALS


def _worker_ignores_stops(_worker_id: int) -> None:
    """worker_init_fn: the worker's stop signals as WORKER_STOPS' comment says (they are
    blocked here, from the rank's fork)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_STOPS)
    for signum in WORKER_STOPS:
        if signum != signal.SIGTERM:
            signal.signal(signum, signal.SIG_IGN)  # a pending one is dropped on unblocking
    threading.Thread(
        target=_end_on_parents_sigterm, args=(os.getppid(),), name="sigterm", daemon=True
    ).start()  # started with SIGTERM blocked, as sigwaitinfo needs it
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [s for s in WORKER_STOPS if s != signal.SIGTERM])


def _end_on_parents_sigterm(parent: int) -> None:
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
            os._exit(0)  # torch's worker handler's exit on its parent's SIGTERM


class StopSafeDataLoader(DataLoader):
    """A DataLoader whose workers are forked with WORKER_STOPS blocked (inherited by the fork,
    set up by _worker_ignores_stops); in this process a signal that comes meanwhile is handled
    on unblocking."""

    def __iter__(self):
        before = signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_STOPS)
        try:
            return super().__iter__()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)


def make_dataloader(
    x_u8: torch.Tensor,
    y: torch.Tensor,
    *,
    local_batch: int,
    world_size: int,
    rank: int,
    seed: int,
    train: bool,
    mean: Sequence[float],
    std: Sequence[float],
    num_workers: int,
    pin_memory: bool,
    persistent_workers: bool,
    prefetch_factor: int | None,
    flip: bool = True,
) -> tuple[DataLoader, DistributedSampler]:
    """DataLoader + DistributedSampler with per-sample torchvision.transforms.v2 (CPU workers).

    Differences from DeviceLoader, by design of DistributedSampler: it shuffles with its own
    (s + epoch) order, s = derive_seed("sampler", seed), the same on every rank (seed itself
    gave seeds k and k + 1, two repeats of the study, all but one epoch's order alike), and for
    evaluation (drop_last=False) it PADS the epoch by repeating samples until n divides by
    world_size (eval then counts up to world_size-1 test samples twice; the trainer evaluates
    with the DeviceLoader). For training it drops the last
    n % world_size samples of its order instead (drop_last=True), and the DataLoader the ragged
    last batch (as in epoch_batches: one input shape for every step) unless it would be the only
    batch: each sample at most once per epoch, and floor(n / (local_batch x world_size)) steps
    as the device loader takes. Call sampler.set_epoch(epoch) every epoch.
    Augmentation randomness comes from the worker seeds, which derive from the loader's
    generator seeded from (seed, rank); with num_workers=0 it uses the global torch RNG instead,
    seeded per rank by seed_rank_draws. persistent_workers/prefetch_factor are passed only when
    num_workers > 0 (DataLoader rejects them otherwise). The workers ignore the stop signals
    (WORKER_STOPS; the parent's SIGTERM ends them): the rank acts on them.
    """
    from torchvision.transforms import v2

    h, w = x_u8.shape[-2:]
    # the flip only where it keeps the label (vocab.Dataset.flip)
    flips = [v2.RandomHorizontalFlip()] if flip else []
    steps = [v2.RandomCrop((h, w), padding=CROP_PAD), *flips] if train else []
    transform = v2.Compose(
        [*steps, v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]
    )
    dataset = _TensorImages(x_u8, y, transform)
    # training pads nothing: a repeated sample was trained on twice in an epoch, and 1023
    # images on 4 ranks of 128 padded to 1024, two steps where the device loader takes one
    # DistributedSampler shuffles with seed + epoch, and repeat r runs with seed train.seed + r
    # (study/runs.py): the plain seed made repeat r+1's epoch e repeat r's epoch e+1. A derived
    # seed, the same on every rank (their shards cut one permutation)
    sampler = DistributedSampler(
        dataset,
        num_replicas=world_size,
        rank=rank,
        shuffle=train,
        seed=derive_seed("sampler", seed),
        drop_last=train,
    )
    drop_tail = train and len(sampler) >= local_batch
    extra: dict[str, Any] = {}
    if num_workers > 0:
        extra["persistent_workers"] = persistent_workers
        extra["worker_init_fn"] = _worker_ignores_stops
        if prefetch_factor is not None:
            extra["prefetch_factor"] = prefetch_factor
    loader = (StopSafeDataLoader if num_workers > 0 else DataLoader)(
        dataset,
        batch_size=local_batch,
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory,
        drop_last=drop_tail,
        generator=torch.Generator().manual_seed(derive_seed("dataloader", seed, rank)),
        **extra,
    )
    return loader, sampler
