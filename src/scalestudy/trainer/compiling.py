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
  steady-state window opened: recompilations inside the measurement, 0 when the fast path holds;
  a resumed run's sums every segment's window: measure.Meter.bank_segment).
- CUDA graphs, two kinds (`graphs_mode`):
  - `--cuda-graphs on` ("compiled"): torch.compile's "reduce-overhead" mode records each
    compiled graph as a CUDA graph and replays it: one launch instead of hundreds. On the H200
    node the compiled bf16 step at local batch 512 was host-bound (12.1 ms of host time per step
    for 6.3 ms of kernels): with these graphs it ran at the GPU's pace, 76k instead of 39k img/s.
    DDP's all-reduces stay outside (dynamo's DDP optimizer cuts the graph at the buckets and the
    reducer runs between the replays), and so do autograd's and the optimizer's host work: at
    local batch 64 the step stays host-bound (5.8 ms per step, 10.7k img/s on one H100), and
    more so the smaller the buckets (1 MiB: 11.6 ms, 5.6k img/s; the whole-step graph 2.2 ms
    at either size: docs/benchmarks.md, sixth H100 session).
    Where inductor cannot use a graph it runs the code without one; `cuda_graph_skips` counts.
  - `--cuda-graphs step`: the whole step (forward, backward with DDP's all-reduces, the
    optimizer) captured once as one CUDA graph and replayed (step_graph.py): on one H100 29.6k
    img/s at local batch 64 compiled (24.7k eager) and 69.5k at 512, as fast as "compiled"
    there (docs/benchmarks.md). It needs NCCL, no fp16, no accumulation, no comm hook, no
    diagnostic delay and no --profile-steps window (TrainConfig.step_graph_misfit; config.py
    refuses the rest): a replay runs none of the loop's host code, so a profile of it would
    hold the kernels but none of the phase ranges (NVTX, record_function) its breakdown reads.
    A profiling job of a run that replays the whole step therefore profiles the same compiled
    kernels under torch.compile's graphs (study/profiling.py).
  `--cuda-graphs auto` (the default) picks step where it fits on CUDA with ddp or allreduce
  (proven on one H100 over one NCCL rank: the trainer's runs and whole_step_graph.py's check,
  equal parameters to the eager steps'), else the compiled graphs where the run compiles on CUDA
  with ddp or allreduce, no comm hook and no accumulation, else none. Across GPUs the graph
  holds NCCL's all-reduces, which torch documents for DDP (NCCL >= 2.9.6) but which no run of
  ours has yet proven (gpu-check's nccl2-ddp on a 2-GPU node does); a rank that diverged would
  fail the run's final parameter checksum, a hung one the process-group timeout. Off under
  FSDP2 (its hooks between the graphs are unproven), with a comm hook (PowerSGD keeps state
  between steps) and with accumulation (several forwards per step).
The counters are dynamo's (torch._dynamo.utils.counters): read defensively, null when absent.
"""

from __future__ import annotations

import torch

from scalestudy.errors import TrainingError
from scalestudy.trainer.config import STEP_GRAPH_WARM_STEPS, STEPS_BEFORE_WINDOW, TrainConfig


def compile_on(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether this run compiles the model (--compile auto: on CUDA only)."""
    return cfg.compile == "on" or (cfg.compile == "auto" and device.type == "cuda")


# auto picks the whole-step graph where it fits (TrainConfig.step_graph_misfit, step_graph.py)
AUTO_STEP = True


def graphs_mode(cfg: TrainConfig, device: torch.device, total_steps: int | None = None) -> str:
    """The CUDA graphs this run records: "step" (the whole step, step_graph.py), "compiled"
    (torch.compile's reduce-overhead graphs) or "off" (--cuda-graphs auto: module docstring).
    `total_steps`, when known: a run too short for the whole-step graph's warm-up and capture
    and a window after them (STEPS_BEFORE_WINDOW, trainer/config.py) gets, under auto, what it
    would without it; asked for explicitly, it is an error (study/runs.py run_problems refuses
    such a study before any job)."""
    explicit = {"on": "compiled", "off": "off", "step": "step"}
    short = total_steps is not None and total_steps <= STEPS_BEFORE_WINDOW
    if cfg.cuda_graphs == "step" and short:
        raise TrainingError(
            f"--cuda-graphs step: {total_steps} optimizer steps leave no steady-state window "
            f"after its {STEP_GRAPH_WARM_STEPS} eager steps and the capture: raise --epochs or "
            "use more data, or use --cuda-graphs auto",
            scope="run",  # the same step count on every rank
        )
    if cfg.cuda_graphs in explicit:
        return explicit[cfg.cuda_graphs]
    if not (
        device.type == "cuda"
        and cfg.strategy in ("ddp", "allreduce")
        and cfg.comm_hook == "none"
        and cfg.accum_steps == 1
    ):
        return "off"
    if AUTO_STEP and cfg.step_graph_misfit() is None and not short:
        return "step"
    return "compiled" if compile_on(cfg, device) else "off"


def compile_model(
    model: torch.nn.Module, cfg: TrainConfig, device: torch.device, cuda_graphs: bool
) -> torch.nn.Module:
    """The compiled model: one static-shape graph; torch.compile's CUDA graphs when asked
    (`cuda_graphs`: graphs_mode "compiled"; under "step" the step's own graph holds the compiled
    code). On a CPU inductor must keep NCHW: its layout optimisation turns convolutions NHWC,
    and torch's CPU convolution backward crashes in NHWC (a 1x1 stride-2 convolution, ResNet's
    downsample: SIGSEGV, or a hang inside the compiled backward; torch 2.14.1, x86; numerics.py
    refuses NHWC on CPU)."""
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


def in_effect(compiled: bool, mode: str, at_window: int | None, at_end: int | None) -> dict:
    """metrics.json's record of the fast path (module docstring): `mode` is graphs_mode's,
    `at_window`/`at_end` are graphs() when the steady-state window opened and when the training
    loop ended."""
    in_window = None
    if compiled and at_window is not None and at_end is not None:
        in_window = at_end - at_window
    return {
        "compiled": compiled,
        "compile_graphs": at_end if compiled else None,
        "compile_graphs_in_window": in_window,
        "cuda_graphs_used": mode != "off",
        "cuda_graphs_mode": mode,
        "cuda_graph_skips": counter("inductor", "cudagraph_skips") if mode == "compiled" else None,
    }
