"""Datasets: `scalestudy prepare-data`, loading prepared data, sharding, and the two input paths.

prepare-data downloads (cifar10, mnist) or generates (synthetic) a dataset ONCE and writes
`DIR/<dataset>/data.pt` (uint8 images, int64 labels) and then `DIR/<dataset>/meta.json` (written
last: its presence marks a complete, checksummed preparation). Training never downloads: it calls
`load_prepared`, which fails with the command that creates the data.

Two input paths, compared in the study:
- `DeviceLoader`: the whole uint8 split lives on the GPU; batches are gathered by index and
  augmented with batched tensor ops on the device (no worker processes, no host->device copies).
- `make_dataloader`: the conventional torch DataLoader + DistributedSampler + per-sample
  torchvision transforms in worker processes.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import pickle
import sys
import urllib.error
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from scalestudy import files, vocab
from scalestudy.errors import ChecksumError, DownloadError, PreparedDataError
from scalestudy.files import atomic_open, write_json

FORMAT_VERSION = 1
DATASETS = tuple(vocab.DATASETS)
CROP_PAD = 4  # px of zero padding for the random-crop augmentation (the standard CIFAR recipe)

# Official archives and the md5s torchvision checks (module-level so tests can substitute them).
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/"
CIFAR10_FILES = {"cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a"}
MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
MNIST_FILES = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
_DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
MNIST_CLASSES = [f"{i} - {w}" for i, w in enumerate(_DIGITS)]  # torchvision's names
SYNTHETIC_DEFAULTS = {
    "num_train": vocab.DATASETS["synthetic"].train,
    "num_test": vocab.DATASETS["synthetic"].test,
    "seed": 0,
}


def _derive_seed(*parts: object) -> int:
    """A 63-bit seed from labels/ints: stable across runs, machines and Python versions."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _prepare_command(dataset: str, data_dir: str | Path) -> str:
    return f"scalestudy prepare-data --dataset {dataset} --data-dir {data_dir}"


# ---------------------------------------------------------------------------------------------
# Download and conversion of the real datasets
# ---------------------------------------------------------------------------------------------


def _download(base_url: str, filename: str, md5: str, raw_dir: Path) -> Path:
    """Download base_url+filename into raw_dir (skipped when a file with the right md5 is there)."""
    from torchvision.datasets.utils import calculate_md5, download_url

    url = base_url.rstrip("/") + "/" + filename
    path = raw_dir / filename
    try:
        download_url(url, str(raw_dir), filename, md5)
    except RuntimeError as e:  # torchvision: "File not found or corrupted." on an md5 mismatch
        if path.is_file() and (actual := calculate_md5(path)) != md5:
            raise ChecksumError(
                f"{path}: md5 mismatch: expected {md5}, got {actual} (downloaded from {url}); "
                "not the official file (wrong --mirror, or a truncated/altered download?). "
                "It is downloaded again on the next run."
            ) from e
        raise DownloadError(f"downloading {url} to {path} failed: {e}") from e
    except (urllib.error.URLError, OSError) as e:
        raise DownloadError(
            f"could not download {url} to {path}: {e}. Without internet, place the file there "
            f"yourself (md5 {md5}) or pass --mirror URL."
        ) from e
    return path


def _download_any(mirrors: Sequence[str], filename: str, md5: str, raw_dir: Path) -> str:
    """Try each mirror in turn; returns the one that worked."""
    errors: list[DownloadError] = []
    for mirror in mirrors:
        try:
            _download(mirror, filename, md5, raw_dir)
            return mirror
        except DownloadError as e:
            errors.append(e)
    kind = ChecksumError if any(isinstance(e, ChecksumError) for e in errors) else DownloadError
    raise kind("\n".join(str(e) for e in errors))


def _unpickle(path: Path) -> dict:
    # CIFAR's batches are Python-2 pickles with bytes keys. pickle runs code, which is acceptable
    # here only because the archive they come from passed its md5 check.
    with open(path, "rb") as f:
        return pickle.load(f, encoding="bytes")


def convert_cifar10(raw_dir: str | Path) -> tuple[dict[str, torch.Tensor], list[str]]:
    """CIFAR-10 python batches -> ({train_x, train_y, test_x, test_y}, class names).

    raw_dir holds `data_batch_1..5`, `test_batch`, `batches.meta` (directly or in
    `cifar-10-batches-py/`). Each row of b"data" is 3072 bytes: 1024 R, then G, then B, each a
    row-major 32x32 plane, so reshape(N, 3, 32, 32) is already CHW.
    """
    root = Path(raw_dir)
    if (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"

    def load(names: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = [], []
        for name in names:
            batch = _unpickle(root / name)
            data = np.asarray(batch[b"data"], dtype=np.uint8)
            labels = np.asarray(batch[b"labels"], dtype=np.int64)
            if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(labels) != len(data):
                raise ValueError(
                    f"{root / name}: expected data Nx3072 and N labels, got data {data.shape} "
                    f"and {len(labels)} labels"
                )
            xs.append(torch.from_numpy(data.reshape(-1, 3, 32, 32).copy()))
            ys.append(torch.from_numpy(labels.copy()))
        return torch.cat(xs), torch.cat(ys)

    train_x, train_y = load([f"data_batch_{i}" for i in range(1, 6)])
    test_x, test_y = load(["test_batch"])
    classes = [n.decode() for n in _unpickle(root / "batches.meta")[b"label_names"]]
    for split, y in (("train", train_y), ("test", test_y)):
        if y.numel() and not (int(y.min()) >= 0 and int(y.max()) < len(classes)):
            raise ValueError(f"{root}: {split} labels outside 0..{len(classes) - 1}")
    tensors = {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y}
    return tensors, classes


def _read_idx(path: Path) -> torch.Tensor:
    """An idx file (MNIST's format): 0, 0, type (0x08 = ubyte), ndim, ndim big-endian int32 dims."""
    if not path.is_file() and path.with_name(path.name + ".gz").is_file():
        path = path.with_name(path.name + ".gz")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte idx file (magic {raw[:4].hex()})")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    body = raw[4 + 4 * ndim :]
    if len(body) != math.prod(dims):
        raise ValueError(f"{path}: header says {dims} ({math.prod(dims)} bytes), has {len(body)}")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(dims)


def convert_mnist(raw_dir: str | Path) -> tuple[dict[str, torch.Tensor], list[str]]:
    """MNIST idx files (plain or .gz) -> ({train_x Nx1x28x28 uint8, train_y int64, ...}, names)."""
    root = Path(raw_dir)
    out = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        x = _read_idx(root / f"{prefix}-images-idx3-ubyte")
        y = _read_idx(root / f"{prefix}-labels-idx1-ubyte").to(torch.int64)
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise ValueError(f"{root}: {split} images {tuple(x.shape)} vs labels {tuple(y.shape)}")
        out[f"{split}_x"], out[f"{split}_y"] = x.unsqueeze(1).contiguous(), y
    return out, list(MNIST_CLASSES)


# ---------------------------------------------------------------------------------------------
# Synthetic data
# ---------------------------------------------------------------------------------------------


def make_synthetic(
    num_train: int, num_test: int, seed: int
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A learnable CIFAR-shaped dataset (3x32x32 uint8, 10 balanced classes), fully seeded.

    Each class has a fixed template on a 40x40 canvas: a smooth random colour field (a 4x4 grid
    upsampled) plus colour-tinted stripes with a class-specific orientation ((k + 0.5) * 9
    degrees) and period. An image is a random 32x32 window of its class template (shift of up to
    +-4 px) plus Gaussian pixel noise, rounded and clipped to 0..255. Train and test use separate
    seeded streams, so the test set does not depend on num_train.
    """
    if num_train < 1 or num_test < 1:
        raise ValueError(
            f"synthetic: num_train ({num_train}) and num_test ({num_test}) must be >= 1"
        )
    k, c, size = 10, 3, 32
    canvas = size + 2 * CROP_PAD
    g = torch.Generator().manual_seed(_derive_seed("synthetic-templates", seed))
    colour = F.interpolate(
        torch.rand(k, c, 4, 4, generator=g) * 2 - 1, size=(canvas, canvas), mode="bilinear"
    )
    # radians, one orientation per class, all in (0, 90) degrees: a horizontal flip (an
    # augmentation) maps theta to 180 - theta, which must not be another class's orientation
    theta = (torch.arange(k) + 0.5) * (math.pi / 2) / k
    period = 5 + 4 * torch.rand(k, generator=g)  # px
    phase = 2 * math.pi * torch.rand(k, generator=g)
    tint = torch.rand(k, c, generator=g) * 2 - 1
    yy, xx = torch.meshgrid(torch.arange(canvas), torch.arange(canvas), indexing="ij")
    proj = xx[None] * theta.cos()[:, None, None] + yy[None] * theta.sin()[:, None, None]
    stripes = torch.sin(2 * math.pi * proj / period[:, None, None] + phase[:, None, None])
    # 0-255 scale: mid-grey + colour field (+-15) + stripes (+-40); noise sigma 60 per pixel. Tuned
    # so a nearest-class-mean classifier on raw pixels gets ~75% (chance 10%): learnable, but the
    # stripe orientation (a conv feature) is needed to go further.
    templates = 128 + 15 * colour + 40 * stripes[:, None] * tint[:, :, None, None]

    def split(n: int, tag: str) -> tuple[torch.Tensor, torch.Tensor]:
        gs = torch.Generator().manual_seed(_derive_seed("synthetic", tag, seed))
        y = (torch.arange(n) % k)[torch.randperm(n, generator=gs)]
        x = torch.empty(n, c, size, size, dtype=torch.uint8)
        ar, ch = torch.arange(size), torch.arange(c)
        for s in range(0, n, 8192):  # chunks of 8192 images bound memory (~100 MB of float32)
            yb = y[s : s + 8192]
            b = len(yb)
            dy, dx = torch.randint(0, 2 * CROP_PAD + 1, (2, b, 1), generator=gs)
            rows, cols = dy + ar, dx + ar  # b x 32 window coordinates on the canvas
            img = templates[
                yb[:, None, None, None],
                ch[None, :, None, None],
                rows[:, None, :, None],
                cols[:, None, None, :],
            ]
            img += 60 * torch.randn(img.shape, generator=gs)
            x[s : s + b] = img.round_().clamp_(0, 255).to(torch.uint8)
        return x, y

    train_x, train_y = split(num_train, "train")
    test_x, test_y = split(num_test, "test")
    classes = [f"pattern_{i}" for i in range(k)]
    return {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y}, classes


# ---------------------------------------------------------------------------------------------
# prepare-data
# ---------------------------------------------------------------------------------------------


def _channel_stats(x: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per-channel mean and (population) std of uint8 images on the 0-1 scale.

    From a 256-bin histogram per channel (sums exact in float64, deterministic): 0.3 s for
    CIFAR-10's train split on 2 cores, against 1.3 s for summing int64 copies of the pixels.
    """
    values = torch.arange(256, dtype=torch.float64)
    mean, std = [], []
    for c in range(x.shape[1]):
        counts = torch.bincount(x[:, c].reshape(-1), minlength=256).to(torch.float64)
        m = float((counts * values).sum() / counts.sum())
        var = float((counts * (values - m) ** 2).sum() / counts.sum())
        mean.append(m / 255)
        std.append(math.sqrt(var) / 255)
    return mean, std


def _is_current(out_dir: Path, dataset: str, params: dict[str, Any]) -> bool:
    meta_path, data_path = out_dir / "meta.json", out_dir / "data.pt"
    if not (meta_path.is_file() and data_path.is_file()):
        return False
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return False
    same = meta.get("format_version") == FORMAT_VERSION and meta.get("dataset") == dataset
    same = same and all(meta.get(key) == value for key, value in params.items())
    return same and meta.get("sha256") == files.sha256(data_path)


def prepare(
    dataset: str,
    data_dir: str | Path,
    *,
    num_train: int | None = None,
    num_test: int | None = None,
    seed: int | None = None,
    mirror: str | None = None,
    force: bool = False,
) -> Path:
    """Create DIR/<dataset>/{data.pt,meta.json} (no-op when present and intact); returns the dir."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose from {', '.join(DATASETS)}")
    out_dir = Path(data_dir) / dataset
    params: dict[str, Any] = {}
    if dataset == "synthetic":
        given = {"num_train": num_train, "num_test": num_test, "seed": seed}
        params = {k: SYNTHETIC_DEFAULTS[k] if v is None else v for k, v in given.items()}
    elif any(v is not None for v in (num_train, num_test, seed)):
        raise ValueError("--num-train/--num-test/--seed apply only to --dataset synthetic")
    if not force and _is_current(out_dir, dataset, params):
        print(f"prepare-data: {out_dir} is prepared and intact; nothing to do (--force redoes it)")
        return out_dir

    meta_path, data_path = out_dir / "meta.json", out_dir / "data.pt"
    out_dir.mkdir(parents=True, exist_ok=True)
    raw_dir = out_dir / "raw"
    if dataset == "synthetic":
        tensors, classes = make_synthetic(**params)
        source = "synthetic"
    elif dataset == "cifar10":
        from torchvision.datasets.utils import extract_archive

        base = mirror or CIFAR10_URL
        ((filename, md5),) = CIFAR10_FILES.items()
        archive = _download(base, filename, md5, raw_dir)
        extract_archive(str(archive), str(raw_dir))
        tensors, classes = convert_cifar10(raw_dir)
        source = base.rstrip("/") + "/" + filename
    else:
        from torchvision.datasets.utils import extract_archive

        mirrors = [mirror] if mirror else list(MNIST_MIRRORS)
        used = set()
        for filename, md5 in MNIST_FILES.items():
            used.add(_download_any(mirrors, filename, md5, raw_dir))
            extract_archive(str(raw_dir / filename), str(raw_dir))  # .gz -> plain idx file
        tensors, classes = convert_mnist(raw_dir)
        source = " ".join(sorted(used))

    # meta.json marks completion: drop it before replacing data.pt (only now, so a failed
    # download leaves an existing preparation usable)
    meta_path.unlink(missing_ok=True)
    with atomic_open(data_path, "wb") as f:
        torch.save(tensors, f)
    mean, std = _channel_stats(tensors["train_x"])
    meta = {
        "format_version": FORMAT_VERSION,
        "dataset": dataset,
        "classes": classes,
        "num_classes": len(classes),
        "train_shape": list(tensors["train_x"].shape),
        "test_shape": list(tensors["test_x"].shape),
        "mean": mean,
        "std": std,
        "sha256": files.sha256(data_path),  # of the bytes on disk, re-read after the write
        "source": source,
        **params,
    }
    write_json(meta_path, meta)  # last: marks the preparation complete
    train_shape, test_shape = ("x".join(map(str, meta[k])) for k in ("train_shape", "test_shape"))
    print(
        f"prepare-data: wrote {data_path} and {meta_path}: {dataset} train {train_shape}, "
        f"test {test_shape}, {len(classes)} classes"
    )
    return out_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, choices=DATASETS)
    parser.add_argument("--data-dir", required=True, help="writes DATA_DIR/<dataset>/")
    d = SYNTHETIC_DEFAULTS
    parser.add_argument("--num-train", type=int, help=f"synthetic only (default {d['num_train']})")
    parser.add_argument("--num-test", type=int, help=f"synthetic only (default {d['num_test']})")
    parser.add_argument("--seed", type=int, help=f"synthetic only (default {d['seed']})")
    parser.add_argument("--mirror", help="base URL that replaces the official download location")
    parser.add_argument("--force", action="store_true", help="redo even if prepared and intact")


def run(args: argparse.Namespace) -> int:
    try:
        prepare(
            args.dataset,
            args.data_dir,
            num_train=args.num_train,
            num_test=args.num_test,
            seed=args.seed,
            mirror=args.mirror,
            force=args.force,
        )
    except (DownloadError, ValueError) as e:
        print(f"scalestudy prepare-data: error: {e}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


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
    out_dir = Path(data_dir) / dataset
    meta_path, data_path = out_dir / "meta.json", out_dir / "data.pt"
    cmd = _prepare_command(dataset, data_dir)
    for path in (meta_path, data_path):
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
    if meta.get("dataset") != dataset or meta.get("format_version") != FORMAT_VERSION:
        raise PreparedDataError(
            f"{meta_path} describes dataset {meta.get('dataset')!r} format "
            f"{meta.get('format_version')!r}, expected {dataset!r} format {FORMAT_VERSION}; "
            f"recreate: {cmd} --force"
        )
    if verify and (actual := files.sha256(data_path)) != meta.get("sha256"):
        raise PreparedDataError(
            f"{data_path} has sha256 {actual} but {meta_path} records {meta.get('sha256')}: "
            f"the file was changed or is incomplete; recreate: {cmd} --force"
        )
    try:
        t = torch.load(data_path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises assorted types (RuntimeError, UnicodeDecodeError, ...)
        raise PreparedDataError(
            f"{data_path} cannot be read ({e!r}); recreate: {cmd} --force"
        ) from e
    if not isinstance(t, dict):
        raise PreparedDataError(f"{data_path} holds a {type(t).__name__}, not a dict of tensors")
    for split in ("train", "test"):
        x, y = t.get(f"{split}_x"), t.get(f"{split}_y")
        if (
            x is None
            or y is None
            or x.dtype != torch.uint8
            or y.dtype != torch.int64
            or list(x.shape) != meta[f"{split}_shape"]
            or y.shape != (x.shape[0],)
        ):
            raise PreparedDataError(f"{data_path}: {split} tensors do not match {meta_path}")
    return Prepared(t["train_x"], t["train_y"], t["test_x"], t["test_y"], meta)


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
    full, rem = divmod(n, global_batch)
    bounds = [(i * global_batch, (i + 1) * global_batch) for i in range(full)]
    if rem >= world_size:
        bounds.append((full * global_batch, n))  # one smaller final step, >= 1 sample per rank
    elif rem:
        bounds[-1] = (bounds[-1][0], n)  # too few for every rank: the last step takes them
    return bounds


def _check_rank(world_size: int, rank: int) -> None:
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1} (world_size={world_size})")


def epoch_batches(
    n: int, global_batch: int, world_size: int, rank: int, seed: int, epoch: int
) -> list[torch.Tensor]:
    """This rank's batches (int64 index tensors into 0..n-1) for one epoch.

    Rule: every rank draws the same permutation of range(n) from a torch.Generator seeded with
    `_derive_seed("epoch_batches", seed, epoch)`, cuts it into consecutive global slices of
    `global_batch`, and rank r takes `slice[r::world_size]` of each. With R = n % global_batch:
    R >= world_size -> one extra, smaller final step; 0 < R < world_size -> the R samples join the
    last full slice (no rank ever gets an empty batch). So each sample is used exactly once per
    epoch across ranks, all ranks take the same number of steps, and within a step per-rank batch
    sizes differ by at most 1. The samples of global step i depend only on (n, global_batch, seed,
    epoch), not on world_size, so strong-scaling runs see the same global batches.

    ValueError unless n >= world_size, global_batch >= world_size and global_batch %
    world_size == 0.
    """
    bounds = _global_slices(n, global_batch, world_size)
    _check_rank(world_size, rank)
    g = torch.Generator().manual_seed(_derive_seed("epoch_batches", seed, epoch))
    perm = torch.randperm(n, generator=g)
    return [perm[start:stop][rank::world_size] for start, stop in bounds]


def eval_indices(n: int, world_size: int, rank: int) -> torch.Tensor:
    """This rank's evaluation samples: arange(rank, n, world_size); each exactly once overall."""
    _check_rank(world_size, rank)
    return torch.arange(rank, n, world_size)


# ---------------------------------------------------------------------------------------------
# Batched augmentation and the device-resident loader
# ---------------------------------------------------------------------------------------------


def augment(x_u8: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random crop (zero padding CROP_PAD px, per-sample offset) + random horizontal flip (p=0.5).

    Batched: pad the batch once, then gather every sample's window with one advanced-indexing op.
    `generator` must be on x_u8's device. Draws offsets (y, x) then flips, in that order.
    """
    b, c, h, w = x_u8.shape
    dev = x_u8.device
    padded = F.pad(x_u8, (CROP_PAD, CROP_PAD, CROP_PAD, CROP_PAD))
    off = torch.randint(0, 2 * CROP_PAD + 1, (2, b, 1), generator=generator, device=dev)
    flip = torch.rand(b, 1, generator=generator, device=dev) < 0.5
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
    x_u8: torch.Tensor, mean: Sequence[float] | torch.Tensor, std: Sequence[float] | torch.Tensor
) -> torch.Tensor:
    """uint8 (B x)C x H x W -> float32 (x/255 - mean) / std; mean/std per channel, 0-1 scale."""
    m, s = _channel_tensor(mean, x_u8.device), _channel_tensor(std, x_u8.device)
    return x_u8.to(torch.float32).div_(255).sub_(m).div_(s)


class DeviceLoader:
    """Batches from a uint8 split held on `device`: (x float32 normalized, y int64), on the device.

    train=True: call set_epoch(epoch) before iterating; batches follow epoch_batches(n,
    local_batch * world_size, world_size, rank, seed, epoch) and are augmented with a device
    generator seeded from (seed, rank, epoch), so a run is reproducible for a given world size.
    train=False: this rank's eval_indices in chunks of eval_batch (default 2 * local_batch), no
    augmentation; only that subset is moved to the device.
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
    ) -> None:
        if local_batch < 1:
            raise ValueError(f"local_batch must be >= 1, got {local_batch}")
        self.device = torch.device(device)
        self.local_batch, self.world_size, self.rank = local_batch, world_size, rank
        self.seed, self.train, self.epoch = seed, train, 0
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

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @property
    def steps_per_epoch(self) -> int:
        if self.train:
            return len(self._bounds)
        return math.ceil(len(self.x) / self.eval_batch)

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
            for s in range(0, len(self.x), self.eval_batch):
                xb = self.x[s : s + self.eval_batch]
                yield normalize(xb, self.mean, self.std), self.y[s : s + self.eval_batch]
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
        gen.manual_seed(_derive_seed("augment", self.seed, self.rank, self.epoch))
        for idx in all_idx.split([len(b) for b in batches]):
            xb = augment(self.x[idx], gen)
            yield normalize(xb, self.mean, self.std), self.y[idx]


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
) -> tuple[DataLoader, DistributedSampler]:
    """DataLoader + DistributedSampler with per-sample torchvision.transforms.v2 (CPU workers).

    Differences from DeviceLoader, by design of DistributedSampler: with drop_last=False it PADS
    the epoch by repeating samples until n divides by world_size (eval then counts up to
    world_size-1 test samples twice), and it shuffles with its own (seed + epoch) order. Call
    sampler.set_epoch(epoch) every epoch. Augmentation randomness comes from the worker seeds,
    which derive from the loader's generator seeded from (seed, rank); with num_workers=0 it uses
    the global torch RNG instead. persistent_workers/prefetch_factor are passed only when
    num_workers > 0 (DataLoader rejects them otherwise).
    """
    from torchvision.transforms import v2

    h, w = x_u8.shape[-2:]
    steps = [v2.RandomCrop((h, w), padding=CROP_PAD), v2.RandomHorizontalFlip()] if train else []
    transform = v2.Compose(
        [*steps, v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]
    )
    dataset = _TensorImages(x_u8, y, transform)
    sampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=train, seed=seed, drop_last=False
    )
    extra: dict[str, Any] = {}
    if num_workers > 0:
        extra["persistent_workers"] = persistent_workers
        if prefetch_factor is not None:
            extra["prefetch_factor"] = prefetch_factor
    loader = DataLoader(
        dataset,
        batch_size=local_batch,
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory,
        drop_last=False,
        generator=torch.Generator().manual_seed(_derive_seed("dataloader", seed, rank)),
        **extra,
    )
    return loader, sampler
