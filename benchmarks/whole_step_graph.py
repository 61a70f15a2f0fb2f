"""How fast one training step can go when the whole step is one CUDA graph: the measurement that
made it the trainer's default on CUDA (docs/benchmarks.md, "Trainer speed").

torch.compile's "reduce-overhead" mode (the trainer's `--cuda-graphs on`, its default on CUDA
until the whole-step graph) replays one CUDA graph per compiled piece, but between the replays
the host still runs autograd, DDP's reducer and the optimizer: at local batch 64 that host time
(4.9 ms per step on the H200 node) is the step's time. Capturing forward, backward (with DDP's
all-reduces, which NCCL lets a graph hold) and the fused SGD step as one graph leaves the host
one replay per step: `--cuda-graphs step`, which `auto` (the default) now picks where it fits
(trainer/compiling.py). This script measures, on the same network, data and optimizer as the
trainer, in one process per variant, one run each (no repeats: a ratio between variants of one
run, without a spread):

    eager            plain step: batch -> forward -> backward -> fused SGD step
    compiled         the step with torch.compile (default mode)
    compiled-graphs  torch.compile "reduce-overhead": the trainer's `--cuda-graphs on`
    whole-eager      the eager step captured once as one CUDA graph, replayed
    whole-compiled   the compiled step captured once as one CUDA graph, replayed: the
                     trainer's `--cuda-graphs step` (auto's pick on CUDA where it fits)

The whole-* variants wrap the step in the trainer's own StepGraph (trainer/step_graph.py, what
--cuda-graphs step runs): WARM_STEPS eager steps on a side stream, one capture, then replays,
the learning rate filled into the graph's tensors before each replay.

and reports images per second (CUDA events over the timed steps), host milliseconds per step
(how long the host takes to queue a step) and the mean loss over the first and the last tenth
of the timed steps (the network learns a fixed random labelling of random images, so the loss
must fall). With --check K, whole-eager also trains K steps beside a plain eager copy of the
same network from the same seed on the same batches and reports the largest parameter
difference (the graph replays the same kernels, so it should be ~0).

The recipe as the trainer's (recipe.py): SGD with Nesterov momentum 0.9, weight decay on
weights only, fused kernel; under a graph the learning rate is StepGraph's device tensor (a
graph holds the tensor's address, so a new value is a fill_, not a new graph). DDP as
wrap_model builds it, over one NCCL rank unless torchrun starts more. `check` also runs on a
CPU over gloo with a stand-in for the CUDA graph (tests/test_step_graph.py).

    python benchmarks/whole_step_graph.py --local-batch 64 --steps 300 --json OUT.json \
        [--variants eager,compiled-graphs,whole-eager,whole-compiled] [--check 30]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from scalestudy import files  # noqa: E402
from scalestudy.cli import Parser  # noqa: E402
from scalestudy.trainer.models import resnet18, training_flops_per_image  # noqa: E402
from scalestudy.trainer.parallel import NO_FORWARD_BUFFER_SYNC  # noqa: E402
from scalestudy.trainer.step_graph import WARM_STEPS, StepGraph  # noqa: E402

VARIANTS = ("eager", "compiled", "compiled-graphs", "whole-eager", "whole-compiled")
POOL = 16  # distinct batches on the device, cycled


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(prog="whole_step_graph.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated, of: %(default)s"
    )
    p.add_argument("--variant", help=argparse.SUPPRESS)  # one variant, in this process
    p.add_argument("--local-batch", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--precision", choices=("bf16", "fp32", "tf32"), default="bf16")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--warmup", type=int, default=30, help="steps before the capture/timing")
    p.add_argument("--steps", type=int, default=300, help="timed steps")
    p.add_argument("--check", type=int, default=0, help="steps of the whole-eager check")
    p.add_argument("--timeout", type=float, default=240, help="seconds per variant")
    p.add_argument("--json")
    args = p.parse_args(argv)
    # in one line, not a traceback in every variant's process (--steps 0: a ZeroDivisionError)
    at_least = {"local_batch": 1, "width": 1, "steps": 1, "warmup": 0, "check": 0}
    for flag, least in at_least.items():
        if getattr(args, flag) < least:
            p.error(f"--{flag.replace('_', '-')} must be >= {least}, got {getattr(args, flag)}")
    for flag in ("bucket_cap_mb", "timeout"):
        if not getattr(args, flag) > 0:  # nan too
            p.error(f"--{flag.replace('_', '-')} must be > 0, got {getattr(args, flag)}")
    # a misspelt name ran the eager step (whole-eager's for whole*) under its own label
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if args.variant is not None and args.variant not in VARIANTS:  # main's, one per process
        unknown.append(args.variant)
    if unknown:
        p.error(
            f"unknown variant(s) {', '.join(map(repr, unknown))}: --variants takes some of "
            f"{','.join(VARIANTS)}"
        )
    whole = any(v.startswith("whole") for v in (args.variant or args.variants).split(","))
    if whole and args.warmup <= WARM_STEPS:
        p.error(
            f"--warmup {args.warmup}: the whole-* variants capture after {WARM_STEPS} eager "
            f"steps, inside the warm-up: use --warmup {WARM_STEPS + 1} or more"
        )
    try:  # before the first variant, not after the last
        files.check_outputs([args.json] if args.json and not args.variant else [], ValueError)
    except ValueError as exc:
        p.error(f"--json: {exc}")
    return args


def init_dist() -> tuple[int, int, torch.device]:
    if "RANK" not in os.environ:  # one rank without torchrun
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    return dist.get_rank(), dist.get_world_size(), device


def batches(args, device: torch.device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """POOL batches of random images labelled by a fixed random linear map: learnable."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(POOL * args.local_batch, 3, 32, 32, device=device, generator=g)
    w = torch.randn(
        3 * 32 * 32, 10, device=device, generator=torch.Generator(device).manual_seed(7)
    )
    y = (x.flatten(1) @ w).argmax(1)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    x = x.to(dtype).contiguous(memory_format=memory_format(device))
    return x.view(POOL, args.local_batch, 3, 32, 32), y.view(POOL, args.local_batch)


def memory_format(device: torch.device) -> torch.memory_format:
    """channels_last on a GPU, as the trainer; NCHW on a CPU (torch's CPU convolution backward
    crashes in NHWC: trainer/numerics.py)."""
    return torch.channels_last if device.type == "cuda" else torch.contiguous_format


class Step:
    """One network, its DDP wrapper and optimizer; `__call__(x, y)` is one training step.
    `whole`: the step a graph captures (its gradients are zeroed, never freed)."""

    def __init__(self, args, device, compiled: str | None, side, whole: bool = False):
        torch.manual_seed(0)
        self.whole = whole
        self.device = device
        net = resnet18(width=args.width).to(device, memory_format=memory_format(device))
        # DDP built on the side stream of the capture (torch's CUDA graphs notes, "DDP")
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            self.model = DDP(
                net,
                device_ids=[device.index] if device.type == "cuda" else None,
                bucket_cap_mb=args.bucket_cap_mb,
                gradient_as_bucket_view=True,
                static_graph=True,
                **NO_FORWARD_BUFFER_SYNC,
            )
        decay = [p for p in net.parameters() if p.ndim > 1]
        no_decay = [p for p in net.parameters() if p.ndim <= 1]
        self.opt = torch.optim.SGD(
            [{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0.0}],
            lr=0.05,
            momentum=0.9,
            nesterov=True,
            fused=True,
        )
        self.forward = self.model
        if compiled:
            self.forward = torch.compile(self.model, dynamic=False, mode=compiled)
        self.amp = args.precision == "bf16"

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            loss = F.cross_entropy(self.forward(x), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=not self.whole)  # the trainer's set_to_none otherwise
        return loss.detach()


def whole_graph(step: Step, side, graph_type=None) -> StepGraph:
    """The trainer's StepGraph around `step`: `graph(None, x, y)[0]` is the step's loss (eager
    for the first WARM_STEPS calls, captured on the next, replayed after)."""
    return StepGraph(
        lambda meter, x, y: (step(x, y),), step.opt, step.device, side=side, graph_type=graph_type
    )


def run_variant(args) -> dict:
    rank, world, device = init_dist()
    if args.precision == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    else:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    xs, ys = batches(args, device, seed=1 + rank)
    side = torch.cuda.Stream()
    compiled = {"compiled": "default", "compiled-graphs": "reduce-overhead"}.get(args.variant)
    if args.variant == "whole-compiled":
        compiled = "default"
    whole = args.variant.startswith("whole")
    step = Step(args, device, compiled, side, whole)
    graph = whole_graph(step, side) if whole else None
    t0 = time.perf_counter()
    for i in range(args.warmup):  # under a graph: WARM_STEPS eager steps, the capture, replays
        if whole:
            graph(None, xs[i % POOL], ys[i % POOL])
        else:
            if compiled == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            step(xs[i % POOL], ys[i % POOL])
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    losses = torch.zeros(args.steps, device=device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    h0 = time.perf_counter()
    for i in range(args.steps):
        x, y = xs[i % POOL], ys[i % POOL]
        if whole:
            (loss,) = graph(None, x, y)
        else:
            if compiled == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            loss = step(x, y)
        losses[i].copy_(loss)
    host_s = time.perf_counter() - h0
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3
    tenth = max(1, args.steps // 10)
    result = {
        "variant": args.variant,
        "img_s": args.steps * args.local_batch * world / seconds,
        "step_ms": 1e3 * seconds / args.steps,
        "host_ms": 1e3 * host_s / args.steps,
        "warmup_s": warm_s,
        "loss_first": losses[:tenth].mean().item(),
        "loss_last": losses[-tenth:].mean().item(),
        "world_size": world,
    }
    if args.check and args.variant == "whole-eager":
        result["check"] = check(args, device, side, xs, ys)
    dist.destroy_process_group()
    return result


def check(args, device, side, xs, ys, graph_type=None) -> dict:
    """K steps of a fresh eager Step and of a fresh Step under the whole-step graph (WARM_STEPS
    eager steps, the capture, then replays) on the same batches: the largest parameter and
    momentum difference. `graph_type(step)`: the graph for the graphed step (None: CUDA's; the
    CPU test passes its stand-in)."""
    plain = Step(args, device, None, side)
    graphed = Step(args, device, None, side, whole=True)
    graph = whole_graph(graphed, side, graph_type and (lambda: graph_type(graphed)))
    for i in range(args.check):
        x, y = xs[i % POOL], ys[i % POOL]
        plain(x, y)
        graph(None, x, y)
    if device.type == "cuda":
        torch.cuda.synchronize()
    diffs = [
        (a - b).abs().max().item()
        for a, b in zip(plain.model.parameters(), graphed.model.parameters(), strict=True)
    ]
    bufs = [
        (plain.opt.state[a]["momentum_buffer"] - graphed.opt.state[b]["momentum_buffer"])
        .abs()
        .max()
        .item()
        for a, b in zip(plain.model.parameters(), graphed.model.parameters(), strict=True)
    ]
    scale = max(p.abs().max().item() for p in plain.model.parameters())
    return {
        "steps": args.check,
        "replays": max(0, args.check - WARM_STEPS),
        "max_param_diff": max(diffs),
        "max_momentum_diff": max(bufs),
        "max_param": scale,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not torch.cuda.is_available():  # each variant's process was an NCCL/CUDA traceback
        print(
            "whole_step_graph.py: needs a CUDA GPU (NCCL, CUDA graphs); torch sees none here "
            "(its --check runs on a CPU in tests/test_step_graph.py)",
            file=sys.stderr,
        )
        return 2
    if args.variant:
        print("RESULT " + json.dumps(run_variant(args)), flush=True)
        return 0
    rows = []
    for variant in args.variants.split(","):
        cmd = [sys.executable, __file__, "--variant", variant, *(argv or sys.argv[1:])]
        env = dict(os.environ)
        row = {"variant": variant}
        for attempt in ("default", "TORCH_NCCL_ASYNC_ERROR_HANDLING=0"):
            if attempt != "default":
                env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
            t = time.time()
            try:
                p = subprocess.run(
                    cmd, env=env, capture_output=True, text=True, timeout=args.timeout
                )
                out, rc = p.stdout + p.stderr, p.returncode
            except subprocess.TimeoutExpired as e:
                out, rc = f"timeout after {args.timeout} s: {e.output or ''}", 124
            found = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
            row = {"variant": variant, "env": attempt, "rc": rc, "wall_s": time.time() - t}
            if found:
                row.update(json.loads(found[-1][len("RESULT ") :]))
                break
            row["error_tail"] = out[-3000:]
            print(f"{variant} ({attempt}) failed, rc {rc}:\n{out[-3000:]}", flush=True)
            if not variant.startswith("whole"):
                break
        rows.append(row)
        print(json.dumps(row), flush=True)
    flops = training_flops_per_image(
        "resnet18", num_classes=10, width=args.width, image_shape=(3, 32, 32)
    )
    print(
        f"\nlocal batch {args.local_batch}, {args.precision}, width {args.width}, "
        f"{flops / 1e9:.3f} GFLOP/img"
    )
    # the ratio against the plain reference, eager (when it ran), printed with each variant
    eager = next((r["img_s"] for r in rows if r["variant"] == "eager" and "img_s" in r), None)
    print(
        f"{'variant':<16} {'img/s':>9} {'vs eager':>9} {'step ms':>8} {'host ms':>8} "
        f"{'loss first->last':>18}"
    )
    for r in rows:
        if "img_s" in r:
            if eager:
                r["speedup_vs_eager"] = r["img_s"] / eager
            vs = f"{r['speedup_vs_eager']:>8.2f}x" if eager else f"{'n/a':>9}"
            print(
                f"{r['variant']:<16} {r['img_s']:>9,.0f} {vs} {r['step_ms']:>8.3f} "
                f"{r['host_ms']:>8.3f} {r['loss_first']:>8.3f} -> {r['loss_last']:.3f}"
            )
        else:
            print(f"{r['variant']:<16} failed (rc {r['rc']})")
    if args.json:  # atomically; a diverged variant's NaN loss is kept (write_json refuses NaN)
        result = {"args": vars(args), "rows": rows, "torch": torch.__version__}
        files.write_text(args.json, json.dumps(result, indent=1) + "\n")
    return 0 if all("img_s" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
