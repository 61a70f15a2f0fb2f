"""Where a training step's host time goes: the real trainer, timed per phase on the host.

On a GPU a step is host-bound when the CPU cannot queue kernels as fast as the GPU runs them
(docs/benchmarks.md, "GPU: one H200"): the step timer's CUDA events then measure the host's pace,
and the question is which part of the loop takes the host's time. This script runs the real
trainer (`scalestudy.trainer.train.main`, one process) with the step timer replaced by a subclass
that also reads the host clock at every mark, and reports for the steady-state window's steps,
median over steps (milliseconds of host time):

    data, forward, backward, communication, optimizer   the loop's timed phases (loop.py)
    other        the step's host time outside them (loss and accuracy sums, the timer itself)
    between      from one step's end to the next step's start (the meter's and profiler's hooks)
    host step    start to end of the step on the host
    device step  the same step timed by the CUDA events (what metrics.json's step times are)

next to the run's throughput (metrics.json). Options: a cProfile of some window steps (Python
functions by their own time; those steps are left out of the medians), and --micro: the host cost
of single CUDA operations on this node (a kernel launch, a timing event created and recorded, one
recorded again, a CUDA graph replay, a compiled one-kernel function) and a pure-Python loop, to
tell a slow host (or its sandbox) from slow code.

    python benchmarks/step_anatomy.py --json OUT.json [--cprofile-from 60 --cprofile-steps 20] \
        [--micro] -- --dataset synthetic --data-dir D --width 64 --local-batch 512 \
        --precision bf16 --epochs 3 --device cuda --out /tmp/run     # any `scalestudy train` flags
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from scalestudy import files  # noqa: E402
from scalestudy.cli import Parser  # noqa: E402
from scalestudy.errors import ScalestudyError  # noqa: E402
from scalestudy.trainer import measure  # noqa: E402
from scalestudy.trainer import train as trainer  # noqa: E402
from scalestudy.trainer.config import TrainConfig  # noqa: E402

PARTS = (*measure.PHASES, "other", "between", "host step", "device step")


class HostStepTimer(measure.StepTimer):
    """measure.StepTimer that also reads time.perf_counter at each mark (host seconds), and
    runs cProfile over the steps [cprofile_from, cprofile_from + cprofile_steps)."""

    def __init__(self, device: torch.device, cprofile_from: int = -1, cprofile_steps: int = 0):
        super().__init__(device)
        self.host: dict = {}
        self.last_stop: float | None = None
        self.index = 0  # steps started so far
        self.host_steps: list[dict] = []  # one dict of host seconds per step, warm-up included
        self.profiled = range(cprofile_from, cprofile_from + cprofile_steps)
        self.cprofile = cProfile.Profile() if cprofile_steps else None

    def start(self) -> None:
        if self.cprofile and self.index == self.profiled.start:
            self.cprofile.enable()
        now = time.perf_counter()
        gap = None if self.last_stop is None else now - self.last_stop
        self.host = {"t0": now, "between": gap}
        super().start()

    @contextlib.contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        with super().phase(name):
            yield
        self.host[name] = self.host.get(name, 0.0) + time.perf_counter() - t0

    def stop(self, in_window: bool) -> None:
        super().stop(in_window)
        now = time.perf_counter()
        self.last_stop = now
        if self.cprofile and self.index == self.profiled.stop - 1:
            self.cprofile.disable()
        host = {p: self.host.get(p, 0.0) for p in measure.PHASES}
        host["host step"] = now - self.host["t0"]
        host["other"] = host["host step"] - sum(host[p] for p in measure.PHASES)
        host["between"] = self.host["between"]
        host["_keep"] = in_window and self.index not in self.profiled
        self.host_steps.append(host)
        self.index += 1

    def collect(self, sync: tuple[str, str] | None = None) -> list[dict]:
        steps = super().collect(sync)
        # the steps collected are the last len(steps) of host_steps, in order
        for st, host in zip(steps, self.host_steps[-len(steps) :] if steps else [], strict=True):
            host["device step"] = st["total"]
        return steps


def summary(timer: HostStepTimer) -> dict:
    """Median, 10th and 90th percentile in ms of each part over the kept window steps."""
    kept = [h for h in timer.host_steps if h["_keep"] and "device step" in h]
    out: dict = {"steps": len(kept)}
    for part in PARTS:
        values = [1e3 * h[part] for h in kept if h.get(part) is not None]
        if not values:
            out[part] = None
            continue
        # the trainer's quantiles (metrics.json's step_time_ms_p95): linear between the nearest
        # ranks, never outside the values; statistics.quantiles' default extrapolated below
        # the least and above the greatest of fewer than 9 (a negative p10 of [1, 5, 9] ms)
        p10, p90 = (measure._quantile(values, q) for q in (0.10, 0.90))
        out[part] = {"median": statistics.median(values), "p10": p10, "p90": p90}
    return out


def profile_text(timer: HostStepTimer, top: int = 40) -> str | None:
    """pstats of the profiled steps by their own time; a one-line note instead when none of
    them ran (a --cprofile-from past the run's last step: the profile holds no data, and
    pstats would raise after the whole training), or when the window ran past the last step:
    the profiler, never switched off, then held the evaluation, writes and teardown after
    training too, printed as the profiled steps."""
    if not timer.cprofile:
        return None
    first, stop = timer.profiled.start, timer.profiled.stop
    if min(stop, timer.index) <= first:
        return (
            f"cProfile: no step profiled: --cprofile-from {first} is past the run's last step "
            f"({timer.index - 1}; steps count from 0)"
        )
    if stop > timer.index:
        return (
            f"cProfile: not printed: the window, steps {first}-{stop - 1}, runs past the run's "
            f"last step ({timer.index - 1}), so the profile holds what came after training "
            f"too; give --cprofile-steps {timer.index - first} or fewer"
        )
    buf = io.StringIO()
    stats = pstats.Stats(timer.cprofile, stream=buf)
    stats.sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def per_op_us(fn, n: int, cuda: bool) -> float:
    """Host microseconds per call of fn over n calls (after 10 untimed), no sync inside."""
    for _ in range(10):
        fn()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
    return 1e6 * host / n


def micro(device: torch.device) -> dict:
    """The host cost of single operations on this node (module docstring)."""
    cuda = device.type == "cuda"
    out: dict = {}
    t0 = time.perf_counter()
    sum(range(10_000_000))
    out["python_sum_range_1e7_s"] = time.perf_counter() - t0
    a = torch.zeros(1, device=device)
    out["launch_add_us"] = per_op_us(lambda: a.add_(1), 2000, cuda)
    if not cuda:
        return out
    ev = torch.cuda.Event(enable_timing=True)
    out["event_create_record_us"] = per_op_us(
        lambda: torch.cuda.Event(enable_timing=True).record(), 2000, cuda
    )
    out["event_record_us"] = per_op_us(ev.record, 2000, cuda)
    # a CUDA graph of 100 small kernels, replayed
    static = torch.zeros(1, device=device)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            static.add_(1)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(100):
            static.add_(1)
    out["graph_replay_100_kernels_us"] = per_op_us(graph.replay, 500, cuda)
    # a compiled function of one pointwise kernel: dynamo's guards + inductor's launcher
    f = torch.compile(lambda t: t * 2 + 1, dynamic=False)
    b = torch.zeros(1024, device=device)
    out["compiled_one_kernel_us"] = per_op_us(lambda: f(b), 2000, cuda)
    return out


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    argv = sys.argv[1:] if argv is None else argv
    train_flags: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, train_flags = argv[:cut], argv[cut + 1 :]
    p = Parser(prog="step_anatomy.py", description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the results here too")
    p.add_argument("--cprofile-from", type=int, default=-1, help="first profiled step (0-based)")
    p.add_argument("--cprofile-steps", type=int, default=0, help="steps under cProfile (0: none)")
    p.add_argument("--micro", action="store_true", help="also time single CUDA operations")
    args = p.parse_args(argv)
    if args.cprofile_steps < 0:
        p.error(f"--cprofile-steps must be >= 0 (0: no profile), got {args.cprofile_steps}")
    if args.cprofile_steps and args.cprofile_from < 0:  # the default -1: no step is profiled
        p.error(
            f"--cprofile-steps {args.cprofile_steps} needs --cprofile-from, the first profiled "
            f"step (>= 0), got {args.cprofile_from}: e.g. --cprofile-from 60"
        )
    try:  # before the training, not after it
        files.check_outputs([args.json] if args.json else [], ValueError)
    except ValueError as exc:
        p.error(f"--json: {exc}")
    return args, train_flags


def main(argv: list[str] | None = None) -> int:
    args, train_flags = parse_args(argv)
    tp = Parser(prog="scalestudy train")  # `-- --help`: the trainer's flags
    trainer.add_arguments(tp)
    try:  # an expected error (a flag's value, the data) is one line, as `scalestudy train` says it
        cfg = TrainConfig.from_args(tp.parse_args(train_flags))
        return anatomy(args, train_flags, cfg)
    except ScalestudyError as exc:
        print(f"step_anatomy.py: {exc}", file=sys.stderr)
        return 2


def anatomy(args: argparse.Namespace, train_flags: list[str], cfg: TrainConfig) -> int:
    """Train with the host step timer; print (and write) the host time per part."""
    timers: list[HostStepTimer] = []

    def make_timer(device: torch.device) -> HostStepTimer:
        timers.append(HostStepTimer(device, args.cprofile_from, args.cprofile_steps))
        return timers[-1]

    measure.StepTimer = make_timer  # Meter builds its timer through this name
    rc = trainer.main(cfg)
    if rc != 0 or not timers:
        print(f"training failed (exit {rc})", file=sys.stderr)
        return 1
    metrics = json.loads((Path(cfg.out) / "metrics.json").read_text())
    result = {
        "train_flags": train_flags,
        "device_names": metrics.get("device_names"),
        "torch": torch.__version__,
        "throughput_img_s": metrics["throughput_img_s"],
        "mfu": metrics.get("mfu"),
        "local_batch": metrics["local_batch"],
        "host_ms": summary(timers[0]),
        "cprofile": profile_text(timers[0]),
    }
    if args.micro:
        # the trainer's device (--device auto: CUDA when there is one, train.pick_device)
        cuda = cfg.device != "cpu" and torch.cuda.is_available()
        result["micro"] = micro(torch.device("cuda" if cuda else "cpu"))
    print(
        f"{' '.join(train_flags)}\nthroughput {result['throughput_img_s']:,.0f} img/s, "
        f"MFU {result['mfu']}, {result['host_ms']['steps']} window steps timed on the host"
    )
    print(f"{'part':<14} {'median ms':>10} {'p10':>8} {'p90':>8}")
    for part in PARTS:
        v = result["host_ms"][part]
        if v:
            print(f"{part:<14} {v['median']:>10.3f} {v['p10']:>8.3f} {v['p90']:>8.3f}")
    if result["cprofile"]:
        print(result["cprofile"])
    if args.micro:
        print(json.dumps(result["micro"], indent=1))
    if args.json:  # atomically; every number here is finite (metrics.json is strict JSON)
        files.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
