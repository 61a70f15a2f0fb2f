"""Stall of a checkpoint save: asynchronous (copy off the device, write in a thread) vs synchronous.

The stall is the time `Checkpointer.save` keeps the training loop waiting. The state is what the
trainer saves for a replicated strategy: ResNet-18 (width 64, 11.2 M parameters) state_dict plus
SGD momentum buffers, on the device given (cpu or cuda).

    mkdir -p /tmp/ckpt-bench
    python benchmarks/checkpoint_stall.py --device cpu --repeats 5 --dir /tmp/ckpt-bench

Prints mean and standard deviation (from 2 repeats) of the stall (s) and the checkpoint size (MB),
then async / sync: the ratio against the plain reference, a synchronous save.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from scalestudy.cli import Parser
from scalestudy.trainer import checkpoint as ck
from scalestudy.trainer.models import build_model


def state(device: str) -> dict:
    model = build_model("resnet18", num_classes=10, width=64, in_channels=3).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, 3, 32, 32, device=device)).sum().backward()
    opt.step()  # creates the momentum buffers
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "progress": {"step": 1}}


def measure(st: dict, directory: str, async_write: bool, repeats: int) -> list[float]:
    saver = ck.Checkpointer(
        directory,
        keep=2,
        identity={"config_hash": "bench", "world_size": 1},
        rank=0,
        async_write=async_write,
    )
    stalls = []
    for epoch in range(1, repeats + 1):
        saver.wait()  # the previous write is not part of this save's stall
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        saver.save(epoch, st)
        stalls.append(time.perf_counter() - t0)
        time.sleep(0.5)  # training would go on here
    if saver.wait() is not None:
        raise saver.error
    return stalls


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(prog="checkpoint_stall.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu"
    )
    parser.add_argument("--repeats", type=int, default=5, help="saves per mode (sd from 2)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    # in one line before the model is built (each was torch's or tempfile's traceback)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here; use --device cpu")
    if args.dir is not None:
        where = Path(args.dir)
        if not where.is_dir():
            why = "is not a directory" if where.exists() else "does not exist"
            parser.error(f"--dir {args.dir} {why}: create it, or leave --dir out (a temp dir)")
        if not os.access(where, os.W_OK | os.X_OK):
            parser.error(f"--dir {args.dir}: no permission to write there: pick another")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    st = state(args.device)
    means = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        for mode, async_write in (("sync", False), ("async", True)):
            stalls = measure(st, f"{d}/{mode}", async_write, args.repeats)
            size = sum(f.stat().st_size for f in ck.list_checkpoints(f"{d}/{mode}")[-1].iterdir())
            sd = f" sd={statistics.stdev(stalls):.4f}" if len(stalls) > 1 else ""  # one run: none
            means[mode] = statistics.fmean(stalls)
            print(
                f"{mode:5s} device={args.device} stall_s mean={means[mode]:.4f}{sd} "
                f"n={len(stalls)} size_mb={size / 1e6:.1f}"
            )
    # the ratio against the plain reference (a synchronous save), printed, not worked out by hand
    ratio = means["async"] / means["sync"] if means["sync"] else float("nan")
    print(f"async / sync stall: {ratio:.3f} ({1 / ratio:.1f}x less)" if ratio else "")
    print(f"torch {torch.__version__}")


if __name__ == "__main__":
    main()
