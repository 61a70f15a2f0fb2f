"""torch.compile and CUDA graphs: when they are on, how the model is compiled, what was in effect.

- `--compile auto` (the default) compiles on CUDA and not on a CPU. On a GPU the eager ResNet-18
  step is hundreds of small kernels (unfused BN/ReLU/add), so compiling is the fast path; the
  first steps compile (tens of seconds), which `warmup_steps` keeps out of the throughput window.
  On a CPU the convolutions are ~90% of an eager step and already run at the machine's sgemm rate,
  so compiling gains ~8% for ~50 s of compilation per process (2-core machine, docs/benchmarks.md):
  more than a whole demo run.
- Compiled once: `dynamic=False` (one graph for the one training shape: loaders drop the ragged
  tail batch), evaluation runs the eager module (eval mode and the evaluation batch shapes would
  compile new graphs). What the counters say after the loop goes to metrics.json:
  `compile_graphs` (graphs dynamo compiled) and `compile_graphs_in_window` (compiled after the
  steady-state window opened: recompilations inside the measurement, 0 when the fast path holds).
- `--cuda-graphs auto` (the default): torch.compile's "reduce-overhead" mode, which records each
  compiled graph as a CUDA graph and replays it: one launch instead of hundreds. On the H200
  node the compiled bf16 step at local batch 512 was host-bound (12.1 ms of host time per step
  for 6.3 ms of kernels): with CUDA graphs it ran at the GPU's pace, 76k instead of 39k img/s
  (docs/benchmarks.md). auto turns them on where they are proven (`cuda_graphs_on`): a compiled
  CUDA run with ddp or allreduce, no DDP comm hook and no gradient accumulation. DDP's
  all-reduces stay outside the graphs (dynamo's DDP optimizer cuts the graph at the buckets and
  the reducer runs between the replays); a rank that diverged would fail the run's final
  parameter checksum, a hung one the process-group timeout. Off under FSDP2 (its hooks between
  the graphs are unproven), with a comm hook (PowerSGD keeps state between steps) and with
  accumulation (several forwards per step). Where inductor cannot use a graph it runs the code
  without one and says why; `cuda_graph_skips` counts those.
The counters are dynamo's (torch._dynamo.utils.counters): read defensively, null when absent.
"""

from __future__ import annotations

import torch

from scalestudy.trainer.config import TrainConfig


def compile_on(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether this run compiles the model (--compile auto: on CUDA only)."""
    return cfg.compile == "on" or (cfg.compile == "auto" and device.type == "cuda")


def cuda_graphs_on(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether this run records CUDA graphs (--cuda-graphs auto: module docstring)."""
    if cfg.cuda_graphs == "on":
        return True
    return (
        cfg.cuda_graphs == "auto"
        and compile_on(cfg, device)
        and device.type == "cuda"
        and cfg.strategy in ("ddp", "allreduce")
        and cfg.comm_hook == "none"
        and cfg.accum_steps == 1
    )


def compile_model(
    model: torch.nn.Module, cfg: TrainConfig, device: torch.device, cuda_graphs: bool
) -> torch.nn.Module:
    """The compiled model: one static-shape graph; CUDA graphs when asked. On a CPU inductor
    must keep NCHW: its layout optimisation turns convolutions NHWC, and torch's CPU convolution
    backward crashes in NHWC (a 1x1 stride-2 convolution, ResNet's downsample: SIGSEGV, or a
    hang inside the compiled backward; torch 2.14.1, x86; numerics.py refuses NHWC on CPU)."""
    if device.type == "cpu":
        import torch._inductor.config as inductor_config

        inductor_config.layout_optimization = False
    mode = "reduce-overhead" if cuda_graphs else None
    return torch.compile(model, dynamic=False, mode=mode)


def mark_step() -> None:
    """A new training iteration begins (CUDA graph trees free the previous one's outputs)."""
    torch.compiler.cudagraph_mark_step_begin()


def counter(group: str, name: str) -> int | None:
    """One of dynamo's counters (e.g. stats/unique_graphs), or None where torch has none."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    return int(counters[group][name])


def graphs() -> int | None:
    """Graphs dynamo has compiled in this process so far (None where torch has no counter)."""
    return counter("stats", "unique_graphs")


def in_effect(compiled: bool, cuda_graphs: bool, at_window: int | None, at_end: int | None) -> dict:
    """metrics.json's record of the fast path (module docstring): `at_window`/`at_end` are
    graphs() when the steady-state window opened and when the training loop ended."""
    in_window = None
    if compiled and at_window is not None and at_end is not None:
        in_window = at_end - at_window
    return {
        "compiled": compiled,
        "compile_graphs": at_end if compiled else None,
        "compile_graphs_in_window": in_window,
        "cuda_graphs_used": cuda_graphs,
        "cuda_graph_skips": counter("inductor", "cudagraph_skips") if cuda_graphs else None,
    }
