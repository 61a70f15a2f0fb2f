"""What DDP's per-step BN-buffer broadcast costs: our DDP wrapper without it and with it.

torch's DDP broadcasts rank 0's buffers (BN running statistics) at the start of every forward;
`scalestudy.trainer.parallel.wrap_model` turns that off (training never reads them) and
broadcasts them once before each evaluation. This times the training step both ways (the same
wrapper otherwise: buckets, gradients as bucket views) on real gloo ranks (NCCL, one GPU each,
with --device cuda; one rank broadcasts too), interleaved (A B B A ...) so drift hits both
alike, and prints the medians and the ratio. The point is the per-step cost, which on a GPU is
host time in a host-bound step; on a CPU it is lost in the step's compute (docs/benchmarks.md).

    python benchmarks/ddp_buffers.py [--nproc 2] [--width 8] [--batch 8] [--steps 40]
    python benchmarks/ddp_buffers.py --device cuda --nproc 1 --width 64 --batch 512 (a GPU node)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from scalestudy.cli import Parser  # noqa: E402
from scalestudy.trainer.config import TrainConfig  # noqa: E402
from scalestudy.trainer.dist import free_port  # noqa: E402
from scalestudy.trainer.models import build_model  # noqa: E402
from scalestudy.trainer.parallel import wrap_model  # noqa: E402


def step_ms(model: torch.nn.Module, args: argparse.Namespace, device, seed: int) -> float:
    """The median wall time of one training step in ms (the device synchronised at both ends),
    after 5 untimed steps."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = torch.Generator().manual_seed(seed)
    times = []
    for i in range(5 + args.steps):
        x = torch.randn(args.batch, 3, 32, 32, generator=data).to(device)
        y = torch.randint(0, 10, (args.batch,), generator=data).to(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()  # the ranks start each step together: the step, not the skew, is timed
        t0 = time.perf_counter()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 5:
            times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def entry(rank: int, world: int, port: int, args: argparse.Namespace, results) -> None:
    torch.set_num_threads(1)
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
    )
    measured: dict[str, list[float]] = {"broadcast": [], "ours": []}
    order = ["broadcast", "ours", "ours", "broadcast"] * args.repeats
    cfg = TrainConfig(strategy="ddp", static_graph=False)
    for i, which in enumerate(order[: 2 * args.repeats]):
        torch.manual_seed(0)
        net = build_model("resnet18", num_classes=10, width=args.width, in_channels=3)
        net = net.to(device)
        if which == "ours":
            model, _ = wrap_model(net, cfg, device)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # wrap_model's arguments but torch's default buffer broadcast in every forward
                model = DDP(
                    net,
                    device_ids=[device.index] if cuda else None,
                    bucket_cap_mb=cfg.bucket_cap_mb,
                    gradient_as_bucket_view=True,
                )
        measured[which].append(step_ms(model, args, device, seed=100 * i + rank))
    results[rank] = measured
    dist.destroy_process_group()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(prog="ddp_buffers.py", description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2, help="ranks (default 2; one per GPU)")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="cpu: gloo; cuda: NCCL"
    )
    parser.add_argument("--width", type=int, default=8, help="ResNet-18 width (default 8)")
    parser.add_argument("--batch", type=int, default=8, help="images per rank (default 8)")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per run (default 40)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each (default 3)")
    args = parser.parse_args(argv)
    # in one line before the ranks start (--steps 0 was a StatisticsError in every rank)
    for flag in ("nproc", "width", "batch", "steps", "repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    # one GPU per rank: a rank without one was a CUDA traceback in every rank
    if args.device == "cuda" and (gpus := torch.cuda.device_count()) < args.nproc:
        fix = f"use --nproc {gpus}" if gpus else "use --device cpu"
        parser.error(f"--device cuda --nproc {args.nproc}: {gpus} CUDA devices here; {fix}")
    return args


def main() -> None:
    args = parse_args()
    results = mp.Manager().dict()
    mp.spawn(entry, args=(args.nproc, free_port(), args, results), nprocs=args.nproc)
    rank0 = results[0]  # every rank times the same synchronised steps
    backend = "NCCL" if args.device == "cuda" else "gloo"
    ref, ours = (statistics.median(rank0[k]) for k in ("broadcast", "ours"))
    print(
        f"{args.nproc} {backend} ranks, ResNet-18 width {args.width}, batch {args.batch} per rank, "
        f"{args.steps} timed steps, {args.repeats} interleaved runs each (rank 0, median step):"
    )
    for name, runs in rank0.items():
        print(
            f"  {name:10s} {statistics.median(runs):7.2f} ms  runs: "
            + ", ".join(f"{r:.2f}" for r in runs)
        )
    print(f"ours / per-step broadcast: {ours / ref:.3f} of the step time ({ref / ours:.3f}x)")


if __name__ == "__main__":
    main()
