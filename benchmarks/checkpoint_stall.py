"""Stall of a checkpoint save: ours, asynchronous and synchronous, vs a plain torch.save.

The stall is the time a save keeps the training loop waiting. The state is what the trainer
saves for a replicated strategy: ResNet-18 (width 64, 11.2 M parameters) state_dict plus SGD
momentum buffers, on the device given (cpu or cuda). Three modes, interleaved (each repeat runs
each once, in turn, so a slower minute of a shared machine falls on all three), none while
another's background write runs:
  plain  the plain reference: torch.save to one file, flush, fsync, in the loop
  sync   `Checkpointer(async_write=False).save`: a CPU copy, then serialise, write, fsync,
         sha256, manifest, rename, prune, in the loop
  async  `Checkpointer(async_write=True).save`: the copy off the device in the loop, the rest in
         a thread while training goes on

    mkdir -p /tmp/ckpt-bench
    python benchmarks/checkpoint_stall.py --device cpu --repeats 5 --dir /tmp/ckpt-bench

Prints each mode's mean and standard deviation (from 2 repeats) of the stall (s) and its file
size (MB), then the ratios against the plain reference: async / plain and sync / plain.
"""

from __future__ import annotations

import argparse
import functools
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


MODES = ("plain", "sync", "async")


def plain_save(st: dict, path: Path) -> None:
    """The plain reference: one torch.save, flushed and fsynced (a save a crash cannot lose)."""
    with open(path, "wb") as f:
        torch.save(st, f)
        f.flush()
        os.fsync(f.fileno())


def timed(save) -> float:
    """Seconds `save()` keeps the caller waiting (the device idle first)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    save()
    return time.perf_counter() - t0


def measure(st: dict, directory: str, repeats: int) -> tuple[dict, dict]:
    """({mode: stalls}, {mode: size in bytes}) of MODES, interleaved: repeat i runs them in
    turn from mode i, and each ends (its background write waited for) before the next."""
    savers = {
        mode: ck.Checkpointer(
            f"{directory}/{mode}",
            keep=2,
            identity={"config_hash": "bench", "world_size": 1},
            rank=0,
            async_write=mode == "async",
        )
        for mode in ("sync", "async")
    }
    plain = Path(directory) / "plain.pt"
    stalls: dict[str, list[float]] = {mode: [] for mode in MODES}
    for epoch in range(1, repeats + 1):
        turn = MODES[(epoch - 1) % len(MODES) :] + MODES[: (epoch - 1) % len(MODES)]
        for mode in turn:
            if mode == "plain":
                save = functools.partial(plain_save, st, plain)
            else:
                save = functools.partial(savers[mode].save, epoch, st)
            stalls[mode].append(timed(save))
            time.sleep(0.5)  # training would go on here
            for saver in savers.values():  # no write of one mode beside another's save
                if saver.wait() is not None:
                    raise saver.error
    sizes = {"plain": plain.stat().st_size}
    for mode in savers:
        last = ck.list_checkpoints(f"{directory}/{mode}")[-1]
        sizes[mode] = sum(f.stat().st_size for f in last.iterdir())
    return stalls, sizes


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
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        stalls, sizes = measure(st, d, args.repeats)
    means = {}
    for mode in MODES:
        sd = f" sd={statistics.stdev(stalls[mode]):.4f}" if len(stalls[mode]) > 1 else ""
        means[mode] = statistics.fmean(stalls[mode])
        print(
            f"{mode:5s} device={args.device} stall_s mean={means[mode]:.4f}{sd} "
            f"n={len(stalls[mode])} size_mb={sizes[mode] / 1e6:.1f}"
        )
    # the ratios against the plain reference, printed, not worked out by hand
    for mode in ("async", "sync"):
        ratio = means[mode] / means["plain"] if means["plain"] else float("nan")
        less = f" ({1 / ratio:.1f}x less)" if 0 < ratio < 1 else ""
        print(f"{mode} / plain stall: {ratio:.3f}{less}")
    print(f"torch {torch.__version__}")


if __name__ == "__main__":
    main()
