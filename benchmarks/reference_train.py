"""The plain reference trainer: ResNet-18 on CIFAR-10 the way it is usually written.

torchvision-style Dataset of PIL images with per-sample transforms, a DataLoader with worker
processes and a DistributedSampler, DistributedDataParallel with its defaults, SGD Nesterov,
CrossEntropyLoss, optional autocast. It trains the same network as `scalestudy train`
(scalestudy.trainer.models.resnet18) on the same prepared data, and measures throughput by the same
definition, so benchmarks/compare.py can set the two side by side.

    torchrun --nproc-per-node=2 benchmarks/reference_train.py --data-dir results/data \
        --dataset cifar10 --local-batch 128 --epochs 2 --num-workers 4 --out ref.json

Throughput (as in scalestudy/trainer/train.py): images of all ranks inside the steady-state window /
the window's wall time. The window starts after --warmup-steps optimizer steps and covers every
later training step, its batch's loading included (the device is synchronised at its edges; the
gaps between epochs, the DataLoader workers' start-up among them, are outside it); images are
summed over ranks, the window time is the maximum over ranks.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torchvision
from PIL import Image
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchvision import transforms

from scalestudy.cli import Parser
from scalestudy.files import write_json
from scalestudy.trainer.models import resnet18

AMP_DTYPES = {"fp32": None, "tf32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def set_fp32_precision(precision: str) -> dict:
    """fp32 is IEEE fp32 and tf32 is TF32, for matmuls and convolutions, as in our trainer
    (scalestudy/trainer/numerics.py). torch's cuDNN convolutions default to TF32, so a plain
    script's "fp32" would run TF32 convolutions and beat our IEEE fp32 for a reason that is not
    the trainer. The fp32_precision API (torch >= 2.9): mixing it with the older allow_tf32 flags
    makes torch raise when the setting is read. Returns the settings for the result JSON."""
    mode = "tf32" if precision == "tf32" else "ieee"
    torch.backends.cuda.matmul.fp32_precision = mode
    torch.backends.cudnn.conv.fp32_precision = mode
    return {
        "matmul_fp32_precision": torch.backends.cuda.matmul.fp32_precision,
        "cudnn_fp32_precision": torch.backends.cudnn.conv.fp32_precision,
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),  # torch's default: off
    }


class PreparedImages(Dataset):
    """Like torchvision.datasets.CIFAR10: uint8 HWC arrays in memory, a PIL image per sample."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, transform) -> None:
        self.data = x.permute(0, 2, 3, 1).contiguous().numpy()  # N x H x W x C, as CIFAR10
        if self.data.shape[-1] == 1:
            self.data = self.data[..., 0]  # greyscale: PIL mode "L"
        self.targets = y.tolist()
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int):
        return self.transform(Image.fromarray(self.data[i])), self.targets[i]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(prog="reference_train.py", description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", required=True, help="holds <dataset>/data.pt and meta.json")
    p.add_argument("--dataset", default="cifar10")
    p.add_argument("--local-batch", type=int, default=128, help="images per rank per step")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--precision", choices=sorted(AMP_DTYPES), default="fp32")
    p.add_argument("--width", type=int, default=64, help="ResNet-18 base width (64 = standard)")
    p.add_argument("--num-workers", type=int, default=4, help="DataLoader workers per rank")
    p.add_argument("--warmup-steps", type=int, default=10, help="steps before the timed window")
    p.add_argument("--limit-train", type=int, default=None, help="use the first N train images")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="JSON file written by rank 0")
    args = p.parse_args(argv)
    # in one line before the data is read (--local-batch 0 was DataLoader's traceback)
    at_least = {"local_batch": 1, "epochs": 1, "width": 1, "num_workers": 0, "warmup_steps": 0}
    for flag, least in (*at_least.items(), ("limit_train", 0)):  # None or 0: every image
        if (getattr(args, flag) or 0) < least:
            p.error(f"--{flag.replace('_', '-')} must be >= {least}, got {getattr(args, flag)}")
    for flag in ("lr", "weight_decay"):  # torch.optim's traceback in every rank otherwise
        if not (value := getattr(args, flag)) >= 0:  # NaN too
            p.error(f"--{flag.replace('_', '-')} must be a number >= 0, got {value}")
    for name in ("data.pt", "meta.json"):  # each rank's torch.load traceback otherwise
        if not (path := Path(args.data_dir) / args.dataset / name).is_file():
            p.error(
                f"--data-dir {args.data_dir}: no {path}: run `scalestudy prepare-data --dataset "
                f"{args.dataset} --data-dir {args.data_dir}` first"
            )
    return args


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    args = parse_args()
    # torchrun sets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_*; a plain `python` run is one rank
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)  # the device from LOCAL_RANK, never RANK
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10))
    try:
        train(args, device, backend)
    finally:
        dist.destroy_process_group()


def train(args: argparse.Namespace, device: torch.device, backend: str) -> None:
    """The whole reference run, data to metrics JSON. One long function on purpose: the
    reference is the plain script a user would write (DataLoader, DDP, a loop), read top to
    bottom beside our trainer, not a second framework."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    root = Path(args.data_dir) / args.dataset
    data = torch.load(root / "data.pt")
    meta = json.loads((root / "meta.json").read_text())
    x, y = data["train_x"], data["train_y"]
    if args.limit_train:
        x, y = x[: args.limit_train], y[: args.limit_train]
    size = tuple(x.shape[2:])  # the data's own (28 x 28 for mnist), as ours crops
    transform = transforms.Compose(
        [
            transforms.RandomCrop(size, padding=4),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(meta["mean"], meta["std"]),
        ]
    )
    dataset = PreparedImages(x, y, transform)
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    pin_memory = device.type == "cuda"
    loader = DataLoader(
        dataset,
        batch_size=args.local_batch,
        sampler=sampler,
        num_workers=args.num_workers,
        pin_memory=pin_memory,
        drop_last=True,
    )
    if not len(loader):  # drop_last: each rank's share holds no whole batch
        raise SystemExit(
            f"{len(dataset)} images on {world_size} ranks ({len(sampler)} each) hold no batch of "
            f"--local-batch {args.local_batch}: lower it, use fewer ranks or more images"
        )
    total_steps = len(loader) * args.epochs
    if total_steps <= args.warmup_steps:
        raise SystemExit(
            f"{total_steps} steps ({args.epochs} epochs x {len(loader)}) leave no timed window "
            f"after --warmup-steps {args.warmup_steps}: lower it or train longer"
        )

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    num_classes = int(meta.get("num_classes", 10))
    model = resnet18(num_classes=num_classes, width=args.width, in_channels=x.shape[1])
    model = DistributedDataParallel(
        model.to(device), device_ids=[device.index] if device.type == "cuda" else None
    )
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=args.lr,
        momentum=0.9,
        nesterov=True,
        weight_decay=args.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    amp_dtype = AMP_DTYPES[args.precision]
    numerics = set_fp32_precision(args.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")

    step, window_images, window_time = 0, 0, 0.0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        loss_sum = torch.zeros((), device=device)  # kept on the device: no sync per step
        seen, window_start = 0, None
        # the workers start here, outside the window (as ours: loop.py takes iter() before the
        # epoch's first step); each batch is fetched inside its step, so a timed step's loading
        # (the first one's too, and what the workers load meanwhile) is inside the window
        batches = iter(loader)
        for _ in range(len(loader)):
            if step >= args.warmup_steps and window_start is None:
                sync(device)  # the window starts on an idle device
                window_start, images_before = time.perf_counter(), seen
            images, targets = next(batches)
            images = images.to(device, non_blocking=pin_memory)
            targets = targets.to(device, non_blocking=pin_memory)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = criterion(model(images), targets)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            loss_sum += loss.detach().float() * targets.numel()
            seen += targets.numel()
            step += 1
        sync(device)
        if window_start is not None:
            window_time += time.perf_counter() - window_start
            window_images += seen - images_before
        del batches  # its workers stop here, outside the window
        scheduler.step()
        stats = torch.stack([loss_sum.double(), torch.tensor(float(seen), device=device).double()])
        dist.all_reduce(stats)
        train_loss = (stats[0] / stats[1]).item()
        if not math.isfinite(train_loss):
            raise SystemExit(f"non-finite training loss in epoch {epoch + 1}: lower --lr")
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs} train loss {train_loss:.4f}", flush=True)

    images_all = torch.tensor([float(window_images)], dtype=torch.float64, device=device)
    dist.all_reduce(images_all)  # images: summed over ranks
    time_max = torch.tensor([window_time], dtype=torch.float64, device=device)
    dist.all_reduce(time_max, op=dist.ReduceOp.MAX)  # window: the slowest rank's wall time
    throughput = images_all.item() / time_max.item()
    if rank == 0:
        result = {
            "trainer": "reference",
            "throughput_img_s": throughput,
            "throughput_img_s_per_rank": throughput / world_size,
            "world_size": world_size,
            "local_batch": args.local_batch,
            "global_batch": args.local_batch * world_size,
            "precision": args.precision,
            "steps_timed": step - args.warmup_steps,
            "window_images": int(images_all.item()),
            "window_time_s": time_max.item(),
            "final_train_loss": train_loss,
            **{k: getattr(args, k) for k in ("dataset", "width", "epochs", "warmup_steps")},
            **{k: getattr(args, k) for k in ("num_workers", "limit_train", "lr", "seed")},
            "pin_memory": pin_memory,
            **numerics,
            "backend": backend,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch_version": torch.__version__,
            "torchvision_version": torchvision.__version__,
            "numpy_version": np.__version__,
        }
        write_json(args.out, result)
        print(
            f"reference: {throughput:,.1f} img/s over {world_size} "
            f"{'rank' if world_size == 1 else 'ranks'} "
            f"({throughput / world_size:,.1f} per rank) -> {args.out}",
            flush=True,
        )


if __name__ == "__main__":
    main()
