"""gpu-check's verdicts, report and fixtures: pure functions of measured results.

Each `judge_*` takes what a check measured (a trainer's exit code, metrics.json, epochs.csv rows,
its log, parsed profiler rows) and returns a `Check`: pass / fail / skipped, the numbers it was
judged on, the criterion in words and, on failure, the problems and the log tail. They run no
process and read no file, so the tests feed them stand-in results; jobs/gpu_check.py runs the
processes and hands their results here. `write_report` writes gpu-check.md and gpu-check.json;
`trim_torch_ops` and `trim_ncu_csv` cut real profiler output down to fixture size.

"skipped" is only for a check this node cannot run at all (ncu not installed, one GPU for a
two-GPU check), never for a check that ran and went wrong. "not run" is a check whose only
problem is that gpu-check's budget ran out before its processes started or finished: nothing
about the node, and not proven either (the report names the `--only` command that runs them).
"""

from __future__ import annotations

import csv
import io
import math
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scalestudy import files, hardware
from scalestudy.nsight import ncu, schema
from scalestudy.nsight.torch_ops import GPU_CATEGORIES, LAUNCH_CATEGORIES, correlation
from scalestudy.trainer.measure import ENERGY_UPDATE_S, NVML_INTERVAL_S, NVML_UTIL_LOOKBACK_S
from scalestudy.vocab import ENERGY_SHORT_WINDOW

PASS, FAIL, SKIPPED, NOT_RUN = "pass", "fail", "skipped", "not run"
STATUSES = (PASS, FAIL, NOT_RUN, SKIPPED)
FORMAT = "scalestudy-gpu-check-2"  # 2: the status "not run" and its count
# every problem of a process that the budget's deadline, not its own limit, stopped or kept from
# starting says this; a check with no other problem is NOT_RUN
NO_TIME = "no time left in gpu-check's budget"

# 10 balanced classes: chance is 0.10. The trainer's own CPU test reaches 0.81 on the synthetic
# set in five short epochs (tests/test_trainer.py); 0.5 after three epochs of 4,096 images says
# the run learned, with room for the noise of a short run (gpu_check.SMALL: 0.967 on a CPU).
LEARNED_ACC = 0.5
# two ranks sharing the GPU over gloo train SMALL's 3 epochs with a global batch of 256: 48 steps,
# too few to reach LEARNED_ACC (on an H200, 2026-11-26, the eager pairs reached val acc 0.25-0.51
# and cut the train loss to 0.56-0.62 of its first epoch's; cuda-graphs-gloo2 to 0.62 with val acc
# 0.12). The two-rank CUDA-graph run must cut the train loss to at most this fraction instead.
PAIR_LOSS_FALL = 0.8
# ResNet-18's GPU time is convolutions, batch norm and element-wise kernels; when more than a
# quarter of it lands in "other", nsight/classify.py does not know this GPU's kernel names and
# the study's kernel breakdown would be mostly unexplained.
MAX_OTHER_SHARE = 0.25
# our trainer keeps the data on the GPU; the reference decodes PIL images per sample in
# DataLoader workers. Slower than the reference on the same GPU means something is broken.
MIN_RATIO = 1.0
TARGET_RATIO = 3.0  # the Trainer issue's GPU target (docs/benchmarks.md): reported, not judged
# the Trainer issue's speed targets ("Trainer speed near the hardware limit", docs/benchmarks.md)
# on one whole H100 SXM, GPU-resident synthetic data, per (precision, local batch): img/s.
# Benchmark targets: reported (met or not, "n/a" with the reason on another GPU), never judged:
# a node is not failed for missing one
# the targets' GPU: hardware.py's row of the device name (the PCIe and NVL boards have 76% and
# 84% of its bf16 peak, a MIG slice a share of it: their own rows or none, so "n/a")
TARGET_MODEL = "H100 SXM"
SPEED_TARGETS = {
    ("bf16", 512): {"target_60k_met": 60000.0, "stretch_80k_met": 80000.0},  # MFU ~20%
    ("bf16", 64): {"target_25k_met": 25000.0},  # launch overhead gone
}
LOSSES = ("train_loss", "val_loss")  # epochs.csv columns that must be finite
WINDOW_MARKER = "steady-state window opens at step"
RECOMPILE = "Recompiling function"
# inductor's warning when it runs a graph without a CUDA graph (torch/_inductor/cudagraph_utils.py:
# "skipping cudagraphs due to ..."; an override says "disabling cudagraphs due to ...")
CUDAGRAPH_SKIP = re.compile(r"(skipping|disabling) cudagraphs", re.IGNORECASE)
# the trainer's line for the first host synchronisation inside a window step (--sync-debug)
HOST_SYNC = "host synchronisation inside a step:"
# a line that says why a process failed (the trainer's "[rank r/W host] ... failed", argparse's
# "error:", a Python exception), not torchrun's own report of the failure
ERROR_LINE = re.compile(r"error:|failed|Error\b|Exception\b|non-finite|[Tt]imed? ?out")
TAIL_LINES = 40


@dataclass
class RunResult:
    """What one trainer (or reference trainer) process left behind."""

    rc: int | None  # exit status; None: stopped at its limit, or never started
    wall_s: float = 0.0
    limit_s: float = 0.0
    timed_out: bool = False
    started: bool = True  # False: no time was left in the budget to start it
    # its limit was what was left of the budget, shorter than its own (a timeout is then the
    # budget's, not the run's)
    budget_cut: bool = False
    metrics: dict | None = None  # metrics.json (the reference trainer's --out JSON)
    epochs: list[dict] = field(default_factory=list)  # epochs.csv rows (strings, as read)
    log_tail: str = ""


# check -> the check whose run it reads: `--only nvml` runs reference-bf16 first (without it
# the H200's rerun of 2026-11-26 judged no run), `--only ncu` torch-profiler, whose kernels it
# profiles (without it an H100's `--only reference-fp32,speed-tf32,ncu` of 2026-11-27 failed
# ncu with "no kernel to profile")
NEEDS = {"nvml": "reference-bf16", "ncu": "torch-profiler"}


@dataclass
class Check:
    name: str
    status: str  # PASS, FAIL, NOT_RUN or SKIPPED
    criterion: str  # what passing means, in words
    numbers: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    wall_s: float = 0.0  # seconds its processes ran
    log_tail: str = ""  # the failing process's last lines


def verdict(
    name: str,
    criterion: str,
    numbers: dict,
    problems: list[str],
    runs: Iterable[RunResult] = (),
    shown: RunResult | None = None,
) -> Check:
    """PASS without problems; NOT_RUN when every problem is the budget's (NO_TIME); else FAIL
    with the log tail of `shown`, by default of the last run that did not exit 0 (of the last
    run, when they all did)."""
    runs = list(runs)
    if shown is None:
        shown = ([r for r in runs if r.rc != 0] or runs or [None])[-1]
    status = PASS
    if problems:
        status = NOT_RUN if all(NO_TIME in p for p in problems) else FAIL
    return Check(
        name=name,
        status=status,
        criterion=criterion,
        numbers=numbers,
        problems=problems,
        wall_s=round(sum(r.wall_s for r in runs), 1),
        log_tail=shown.log_tail if shown is not None and problems else "",
    )


def skipped(name: str, criterion: str, why: str) -> Check:
    return Check(name=name, status=SKIPPED, criterion=criterion, problems=[why])


def was_cut(run: RunResult) -> bool:
    """The budget, not the run, ended it: it never started, or the deadline stopped it. What
    such a run left (no checkpoint, no kernels, no log line) is no finding: a judge says only
    run_problems of it, so the check is "not run", not failed."""
    return not run.started or (run.timed_out and run.budget_cut)


def run_problems(run: RunResult, what: str = "the run") -> list[str]:
    """Why a process that should have completed did not (empty: it did)."""
    if not run.started:
        return [f"{what} did not start: {NO_TIME}"]
    if run.timed_out and run.budget_cut:
        return [f"{what} was stopped after {run.limit_s:.0f} s: {NO_TIME}"]
    if run.timed_out:
        return [f"{what} was stopped at its limit of {run.limit_s:.0f} s"]
    if run.rc is None:
        return [f"{what} did not finish ({run.log_tail.strip()[-200:] or 'no log'})"]
    if run.rc != 0:
        return [f"{what} exited with {run.rc}"]
    if run.metrics is None:
        return [f"{what} exited 0 but wrote no metrics"]
    return []


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def loss_problems(epochs: list[dict]) -> list[str]:
    if not epochs:
        return ["epochs.csv has no rows"]
    bad = [r.get("epoch") for r in epochs if not all(_finite(r.get(k)) for k in LOSSES)]
    return [f"non-finite loss in epoch(s) {bad}"] if bad else []


def _expect(metrics: dict, key: str, want: Any, problems: list[str]) -> None:
    if metrics.get(key) != want:
        problems.append(f"metrics.json {key} is {metrics.get(key)!r}, expected {want!r}")


def _device_type(metrics: dict) -> str | None:
    device = metrics.get("device")
    return device.get("type") if isinstance(device, dict) else device


def _device_name(metrics: dict) -> str:
    device = metrics.get("device")
    return str(device.get("name") or "") if isinstance(device, dict) else str(device or "")


# a Python traceback's frame line ('  File "x.py", line 3, in f', a rank's prefix before it
# too): the line after it is the frame's source, whose `raise RuntimeError(...)` or
# `shutdown_timeout(args)` is no message
FRAME_LINE = re.compile(r'^\S*\s+File ".*", line \d+')


def said_lines(lines: list[str], pattern: re.Pattern | str) -> list[str]:
    """The lines that match `pattern` (a plain string: contains it) and say something: not the
    command line gpu-check writes first ("+ ..."), nor a traceback's frame or source lines (a
    failed check's reason was `passing = _PassOn(shutdown_timeout(args))`, the source line
    above the AttributeError it named)."""
    said, source = [], False
    for line in lines:
        frame = bool(FRAME_LINE.match(line))
        found = pattern in line if isinstance(pattern, str) else pattern.search(line)
        if found and not (frame or source or line.startswith("+ ")):
            said.append(line)
        source = frame
    return said


def log_line(log: str, pattern: re.Pattern | str) -> str | None:
    """The log's first line that matches `pattern` and says something (said_lines), stripped
    and cut to 300 characters."""
    said = said_lines(log.splitlines(), pattern)
    return said[0].strip()[:300] if said else None


def failure_problems(run: RunResult, log: str, what: str = "the run") -> list[str]:
    """run_problems, and for a run that failed, the first line of its log that says why (a
    compiled run's traceback is long: the reason must be in the problems, not only the tail)."""
    problems = run_problems(run, what)
    if problems and run.started and not (run.timed_out and run.budget_cut):
        reason = log_line(log, ERROR_LINE)
        if reason:
            problems.append(f"first error line in the log: {reason}")
    return problems


def not_target_device(metrics: dict) -> str | None:
    """Why the speed targets do not apply to the run's device, or None when it is one whole
    H100 SXM: hardware.py's table resolves its name to TARGET_MODEL's row and it is no MIG
    slice (a name merely containing "H100" is not enough)."""
    name = _device_name(metrics)
    if _device_type(metrics) != "cuda":
        return f"set for one whole {TARGET_MODEL}; the run was on {name or 'no GPU'}"
    if "MIG" in name:
        return f"set for one whole {TARGET_MODEL}; {name} is a MIG slice"
    row = hardware.gpu_peaks(name)
    if row is None or row.model != TARGET_MODEL:
        model = f"hardware.py's {row.model}" if row else "not in hardware.py's table"
        return f"set for one whole {TARGET_MODEL}; {name or 'an unnamed GPU'} is {model}"
    return None


def targets_met(precision: str, local_batch: int | None, metrics: dict) -> dict[str, Any]:
    """The Trainer issue's speed targets for this precision and local batch (SPEED_TARGETS):
    each met (bool) on one whole H100 SXM, "n/a" on another device (targets_not_applicable
    says why), None when the run has no throughput. Empty where the issue sets no target."""
    img_s = files.number(metrics.get("throughput_img_s"))
    elsewhere = not_target_device(metrics)
    met: dict[str, Any] = {}
    for key, floor in SPEED_TARGETS.get((precision, local_batch), {}).items():
        if img_s is None:
            met[key] = None
        else:
            # as printed (fmt: whole img/s): 24,999.6 printed "25,000" beside "not met"
            met[key] = "n/a" if elsewhere else round(img_s) >= floor
    if elsewhere and "n/a" in met.values():
        met["targets_not_applicable"] = elsewhere
    return met


def fast_path_numbers(m: dict) -> dict[str, Any]:
    """What a compiled run says about its fast path (compiling.py and measure.py define them)."""
    return {
        "compiled": m.get("compiled"),
        "cuda_graphs_used": m.get("cuda_graphs_used"),
        "cuda_graphs_mode": m.get("cuda_graphs_mode"),
        "compile_graphs": m.get("compile_graphs"),
        "compile_graphs_in_window": m.get("compile_graphs_in_window"),
    }


# ---------------------------------------------------------------------------------------------
# the judges


def judge_versions(info: dict) -> Check:
    """info: cuda_available, device_count, device_name, torch, cuda, cudnn, nccl, driver, ..."""
    problems = []
    if not info.get("cuda_available"):
        problems.append("torch.cuda.is_available() is False")
    if not info.get("device_count"):
        problems.append("torch sees no CUDA device")
    for key in ("cuda", "cudnn", "nccl"):
        if not info.get(key) or str(info[key]).startswith(("absent", "error")):
            problems.append(f"torch reports no {key} version ({info.get(key)!r})")
    return verdict(
        "versions",
        "CUDA is available and torch reports its CUDA runtime, cuDNN and NCCL versions",
        {k: info.get(k) for k in ("device_count", "cuda", "cudnn", "nccl")},
        problems,
    )


def judge_single(name: str, precision: str, strategy: str, run: RunResult) -> Check:
    """One NCCL rank: finite losses, the synthetic set learned, the arithmetic asked for."""
    criterion = (
        f"exit 0 on cuda with backend nccl; finite losses; best val acc >= {LEARNED_ACC} (chance "
        f"0.1) and the last epoch's train loss below the first; fp32 matmul/conv precision "
        f"{'tf32' if precision == 'tf32' else 'ieee'}"
    )
    problems = run_problems(run)
    m = run.metrics or {}
    numbers: dict[str, Any] = {}
    if not problems:
        _expect(m, "precision", precision, problems)
        _expect(m, "strategy", strategy, problems)
        _expect(m, "backend", "nccl", problems)
        if _device_type(m) != "cuda":
            problems.append(f"trained on {_device_type(m)!r}, not cuda")
        fp32 = "tf32" if precision == "tf32" else "ieee"
        _expect(m, "matmul_fp32_precision", fp32, problems)
        _expect(m, "cudnn_fp32_precision", fp32, problems)
        problems += loss_problems(run.epochs)
        numbers = learning_numbers(m, run.epochs)
        problems += learning_problems(numbers)
    return verdict(name, criterion, numbers, problems, [run])


def learning_numbers(metrics: dict, epochs: list[dict]) -> dict:
    first = files.number(epochs[0].get("train_loss")) if epochs else None
    last = files.number(epochs[-1].get("train_loss")) if epochs else None
    return {
        "epochs": len(epochs),
        "train_loss_first": first,
        "train_loss_last": last,
        "best_val_acc": metrics.get("best_val_acc"),
        "throughput_img_s": metrics.get("throughput_img_s"),
    }


def learning_problems(numbers: dict) -> list[str]:
    problems = []
    best = numbers.get("best_val_acc")
    if best is None or best < LEARNED_ACC:
        problems.append(f"best val acc {best} < {LEARNED_ACC}: the synthetic set was not learned")
    first, last = numbers.get("train_loss_first"), numbers.get("train_loss_last")
    if first is not None and last is not None and not last < first:
        problems.append(f"train loss did not fall ({first} -> {last})")
    return problems


def pair_learning_problems(numbers: dict) -> list[str]:
    """Two ranks over gloo in SMALL's 48 steps: the train loss fell to PAIR_LOSS_FALL of the
    first epoch's or lower."""
    first, last = numbers.get("train_loss_first"), numbers.get("train_loss_last")
    if first is None or last is None:
        return [f"no train loss of the first and last epoch ({first}, {last})"]
    if not last <= PAIR_LOSS_FALL * first:
        return [
            f"train loss {first} -> {last}: not at most {PAIR_LOSS_FALL}x the first epoch's, "
            "the synthetic set was not being learned"
        ]
    return []


def two_rank_problems(m: dict, backend: str, run: RunResult, problems: list[str]) -> list:
    """What a 2-rank run must show (appended to `problems`): 2 ranks over `backend`, identical
    parameter checksums, finite losses; returns the checksums."""
    _expect(m, "world_size", 2, problems)
    _expect(m, "backend", backend, problems)
    sums = list(m.get("param_checksums") or [])
    if len(sums) != 2 or len(set(sums)) != 1:
        problems.append(f"parameter checksums differ or are missing: {sums}")
    problems += loss_problems(run.epochs)
    return sums


def loss_fell_problems(numbers: dict) -> list[str]:
    """The last epoch's train loss below the first's: identical checksums and finite losses
    passed a pair whose gradients were wrong alike on both ranks (an all-reduce or hook
    returning zeros: the loss stayed at chance). Not PAIR_LOSS_FALL: healthy PowerSGD pairs
    ended at 0.85-0.91x their first epoch's loss on the H100 and H200 (docs/gpu-runs)."""
    first, last = numbers.get("train_loss_first"), numbers.get("train_loss_last")
    if first is None or last is None or not last < first:
        return [f"train loss did not fall ({first} -> {last}): the ranks learned nothing"]
    return []


def judge_pair(name: str, strategy: str, hook: str, run: RunResult) -> Check:
    """Two ranks sharing one GPU over gloo: the same parameters on both at the end, and
    learned."""
    criterion = (
        "exit 0; 2 ranks on cuda over gloo; both ranks' parameter checksums identical; "
        "finite losses; the last epoch's train loss below the first's"
    )
    problems = run_problems(run)
    numbers: dict[str, Any] = {}
    if not problems:
        m = run.metrics or {}
        sums = two_rank_problems(m, "gloo", run, problems)
        _expect(m, "strategy", strategy, problems)
        _expect(m, "comm_hook", hook, problems)
        if _device_type(m) != "cuda":
            problems.append(f"trained on {_device_type(m)!r}, not cuda")
        learned = learning_numbers(m, run.epochs)
        problems += loss_fell_problems(learned)
        numbers = {
            "param_checksums": sums,
            "train_loss_first": learned["train_loss_first"],
            "train_loss_last": learned["train_loss_last"],
            "best_val_acc": m.get("best_val_acc"),
        }
    return verdict(name, criterion, numbers, problems, [run])


NCCL2 = "nccl2-ddp"  # the one check that trains between two GPUs


def judge_two_gpus(device_count: int, run: RunResult | None) -> Check:
    """Two ranks on two GPUs over NCCL, the trainer's default path on CUDA: what cannot_prove
    drops when it passes (NCCL between GPUs, the whole step one CUDA graph with DDP's
    all-reduces inside it), so each of those is required, not only that some graph ran:
    compiled, cuda_graphs_mode "step", and the probe's finite comm_exposed_frac (null when
    the probe did not run)."""
    name = NCCL2
    criterion = (
        "exit 0; 2 ranks on 2 GPUs over NCCL with the default path (compiled, the whole step one "
        "CUDA graph: cuda_graphs_mode step) and the communication probe (comm_exposed_frac "
        "finite); identical parameter checksums; the last epoch's train loss below the first's"
    )
    if device_count < 2 or run is None:
        return skipped(name, criterion, f"{device_count} GPU visible: NCCL needs a GPU per rank")
    problems = run_problems(run)
    numbers: dict[str, Any] = {}
    if not problems:
        m = run.metrics or {}
        sums = two_rank_problems(m, "nccl", run, problems)
        _expect(m, "compiled", True, problems)
        _expect(m, "cuda_graphs_used", True, problems)
        _expect(m, "cuda_graphs_mode", "step", problems)
        if not _finite(m.get("comm_exposed_frac")):
            problems.append(
                f"metrics.json comm_exposed_frac is {m.get('comm_exposed_frac')!r}, expected a "
                "finite number (the communication probe, --comm-probe-steps)"
            )
        learned = learning_numbers(m, run.epochs)
        problems += loss_fell_problems(learned)
        numbers = {
            "param_checksums": sums,
            **fast_path_numbers(m),
            "train_loss_first": learned["train_loss_first"],
            "train_loss_last": learned["train_loss_last"],
            "throughput_img_s": m.get("throughput_img_s"),
            "comm_exposed_frac": m.get("comm_exposed_frac"),
        }
    return verdict(name, criterion, numbers, problems, [run])


def recompiles_after_marker(log: str) -> tuple[int | None, int, list[str]]:
    """(the step the window opened at, recompilations before it, the recompilation lines after
    it) of a merged stdout+stderr log under TORCH_LOGS=recompiles; step None: no marker."""
    lines = log.splitlines()
    at = next((i for i, line in enumerate(lines) if WINDOW_MARKER in line), None)
    if at is None:
        return None, sum(RECOMPILE in line for line in lines), []
    step = re.search(re.escape(WINDOW_MARKER) + r" (\d+)", lines[at])
    before = sum(RECOMPILE in line for line in lines[:at])
    after = [line.strip() for line in lines[at + 1 :] if RECOMPILE in line]
    return int(step.group(1)) if step else None, before, after


def judge_compile(strategy: str, run: RunResult, log: str) -> Check:
    """One rank, bf16, --compile on, TORCH_LOGS=recompiles: the compiled path of `strategy`
    trains like the eager one and compiles nothing once the window is open."""
    # the CUDA graphs --cuda-graphs auto gives it (compiling.graphs_mode): the whole step's for
    # ddp and allreduce, none for fsdp; no other one-GPU check proves auto still picks them
    graphs = "off" if strategy == "fsdp" else "step"
    criterion = (
        f"exit 0 under --compile on, bf16, {strategy}, on cuda with TORCH_LOGS=recompiles; "
        f"metrics.json compiled true, cuda_graphs_mode {graphs} (--cuda-graphs auto) and "
        f"compile_graphs_in_window 0 (where counted); the log has "
        f"'{WINDOW_MARKER} N' and no '{RECOMPILE}' line after it; finite losses; best val acc "
        f">= {LEARNED_ACC} and the train loss fell"
    )
    problems = failure_problems(run, log)
    step, before, after = recompiles_after_marker(log)
    numbers: dict[str, Any] = {
        "window_opens_at_step": step,
        "recompiles_before_window": before,
        "recompiles_in_window": len(after),
    }
    if not problems:
        m = run.metrics or {}
        _expect(m, "compile", "on", problems)
        _expect(m, "strategy", strategy, problems)
        _expect(m, "cuda_graphs_mode", graphs, problems)
        problems += compiled_problems(m, allow_uncounted=True)
        problems += loss_problems(run.epochs)
        learned = learning_numbers(m, run.epochs)
        problems += learning_problems(learned)
        numbers |= fast_path_numbers(m)
        numbers |= {k: learned[k] for k in ("best_val_acc", "throughput_img_s")}
    problems += window_recompile_problems(step, after, problems)
    return verdict(f"compile-{strategy}", criterion, numbers, problems, [run])


def compiled_problems(m: dict, allow_uncounted: bool = False) -> list[str]:
    """A run on cuda that ran compiled and compiled no graph inside the window
    (compile_graphs_in_window null: dynamo's counter absent, a problem unless allowed)."""
    problems = []
    if _device_type(m) != "cuda":
        problems.append(f"trained on {_device_type(m)!r}, not cuda")
    if m.get("compiled") is not True:
        problems.append(f"metrics.json compiled is {m.get('compiled')!r}: the model ran eager")
    in_window = m.get("compile_graphs_in_window")
    if in_window is None and not allow_uncounted:
        problems.append("compile_graphs_in_window is null: graphs compiled in the window unknown")
    elif in_window:
        problems.append(
            f"compile_graphs_in_window is {in_window}: dynamo compiled inside the measurement"
        )
    return problems


def window_recompile_problems(step: int | None, after: list[str], problems: list[str]) -> list:
    """The log's verdict (recompiles_after_marker) on the recompilations inside the window."""
    found = []
    if step is None and not any(NO_TIME in p for p in problems):
        found.append(f"no '{WINDOW_MARKER}' line in the log: cannot place recompilations")
    if after:
        found.append(f"{len(after)} recompilation(s) inside the window, first: {after[0]}")
    return found


def judge_cuda_graphs(name: str, ranks: int, run: RunResult, log: str) -> Check:
    """--cuda-graphs on (torch.compile mode reduce-overhead), bf16: one NCCL rank, or two DDP
    ranks sharing the GPU over gloo (ranks 2); cuda-graphs-step: --cuda-graphs step, the whole
    step one graph (step_graph.py), one NCCL rank: the graphs were used, nothing recompiled
    inside the window, it learned."""
    step = name == "cuda-graphs-step"
    mode = "step" if step else "compiled"
    criterion = (
        f"exit 0 on cuda under --cuda-graphs {'step' if step else 'on'}, bf16, "
        f"TORCH_LOGS=recompiles; metrics.json compiled, cuda_graphs_mode {mode!r}, "
        + (
            "phase_frac_forward null (one replay: no per-phase time) "
            if step
            else "cuda_graph_skips 0 (a skip: inductor ran a graph without a CUDA graph) "
        )
        + "and compile_graphs_in_window 0; no recompilation after the window opens; finite "
        "losses; "
    )
    if ranks == 2:
        criterion += (
            f"the last epoch's train loss at most {PAIR_LOSS_FALL}x the first's (48 steps of "
            "global batch 256: too few for a val acc criterion); 2 DDP ranks over gloo with "
            "identical parameter checksums"
        )
    else:
        criterion += f"best val acc >= {LEARNED_ACC} and the train loss fell"
    problems = failure_problems(run, log)
    at, _, after = recompiles_after_marker(log)
    numbers: dict[str, Any] = {"recompiles_in_window": len(after)}
    if not problems:
        m = run.metrics or {}
        _expect(m, "cuda_graphs_used", True, problems)
        _expect(m, "cuda_graphs_mode", mode, problems)
        problems += compiled_problems(m)
        if step:
            _expect(m, "phase_frac_forward", None, problems)
        else:
            problems += cudagraph_skip_problems(m, log)
        if ranks == 2:
            _expect(m, "strategy", "ddp", problems)
            numbers["param_checksums"] = two_rank_problems(m, "gloo", run, problems)
        else:
            problems += loss_problems(run.epochs)
        learned = learning_numbers(m, run.epochs)
        problems += pair_learning_problems(learned) if ranks == 2 else learning_problems(learned)
        numbers |= fast_path_numbers(m) | {"cuda_graph_skips": m.get("cuda_graph_skips")}
        if ranks == 2:
            numbers |= {k: learned[k] for k in ("train_loss_first", "train_loss_last")}
        numbers |= {k: learned[k] for k in ("best_val_acc", "throughput_img_s")}
    problems += window_recompile_problems(at, after, problems)
    return verdict(name, criterion, numbers, problems, [run])


def cudagraph_skip_problems(m: dict, log: str) -> list[str]:
    skips = m.get("cuda_graph_skips")
    if skips is None:
        return ["cuda_graph_skips is null: whether the CUDA graphs were used is unknown"]
    if skips == 0:
        return []
    why = log_line(log, CUDAGRAPH_SKIP)
    return [
        f"cuda_graph_skips is {skips}: inductor ran {skips} graph(s) without a CUDA graph"
        + (f" ({why})" if why else " (no 'skipping cudagraphs' line in the log)")
    ]


def judge_host_syncs(precision: str, run: RunResult, log: str) -> Check:
    """One DDP rank under --sync-debug: no host synchronisation inside the window's steps (each
    one stalls the CPU until the GPU drains, and the launch queue runs dry)."""
    criterion = (
        f"exit 0 on cuda under --sync-debug, ddp, {precision}; metrics.json host_syncs_in_window "
        "0 (torch.cuda.set_sync_debug_mode over the window's training steps); finite losses"
    )
    problems = failure_problems(run, log)
    numbers: dict[str, Any] = {}
    if not problems:
        m = run.metrics or {}
        _expect(m, "precision", precision, problems)
        _expect(m, "sync_debug", True, problems)
        if _device_type(m) != "cuda":
            problems.append(f"trained on {_device_type(m)!r}, not cuda")
        problems += loss_problems(run.epochs)
        syncs = m.get("host_syncs_in_window")
        first = log_line(log, HOST_SYNC)
        where = first.split(HOST_SYNC, 1)[1].strip() if first else None
        if syncs is None:
            problems.append("host_syncs_in_window is null: the synchronisations were not counted")
        elif syncs:
            problems.append(
                f"{syncs} host synchronisation(s) inside the window's steps"
                + (f", the first at {where}" if where else "")
            )
        numbers = {
            "host_syncs_in_window": syncs,
            "first_sync_at": where,
            "window_steps": m.get("window_steps"),
            "compiled": m.get("compiled"),
        }
    return verdict(f"host-syncs-{precision}", criterion, numbers, problems, [run])


def judge_checkpoint(
    strategy: str, stop: RunResult, after_stop: dict, resume: RunResult, epochs: int
) -> Check:
    """stop: the run signalled with SIGUSR1 after its first epoch; after_stop: what was on disk
    then (`checkpoints`: names, `dcp`: the newest has DCP shards, `metrics_json`: written);
    resume: the same command again."""
    name = f"checkpoint-{strategy}"
    criterion = (
        "SIGUSR1 after epoch 1 -> a checkpoint on disk (DCP shards for fsdp), exit 75, no "
        "metrics.json; the same command resumes to exit 0 with restarts >= 1 and epochs "
        f"1..{epochs}"
    )
    problems = []  # the stopped run's first, then the resume's
    if not stop.started or stop.timed_out:
        problems += run_problems(stop, "the stopped run")
    elif stop.rc != 75:
        landed = " (the signal landed after the last epoch's stop check?)" if stop.rc == 0 else ""
        problems.append(f"the signalled run exited {stop.rc}, not 75{landed}")
    if after_stop.get("metrics_json"):
        problems.append("the stopped run wrote metrics.json: a stop must not look complete")
    if was_cut(stop):
        pass  # no checkpoint to expect from a run the budget stopped or never started
    elif not after_stop.get("checkpoints"):
        problems.append("no checkpoint on disk after the stop")
    elif strategy == "fsdp" and not after_stop.get("dcp"):
        problems.append("the fsdp checkpoint has no dcp/.metadata (torch.distributed.checkpoint)")
    # the log shown is the stopped run's where it went wrong (it exits 75 by design: not "the
    # last run that did not exit 0"), else the resume's
    tail_of = stop if problems else resume
    problems += run_problems(resume, "the resumed run")
    m = resume.metrics or {}
    done = [r.get("epoch") for r in resume.epochs]
    if not run_problems(resume):
        if not (m.get("restarts") or 0) >= 1:
            problems.append(f"metrics.json restarts is {m.get('restarts')!r}, expected >= 1")
        if done != [str(e) for e in range(1, epochs + 1)]:
            problems.append(f"epochs.csv holds epochs {done}, expected 1..{epochs}")
        problems += loss_problems(resume.epochs)
    numbers = {
        "stop_exit": stop.rc,
        "checkpoints_after_stop": after_stop.get("checkpoints"),
        "resume_exit": resume.rc,
        "restarts": m.get("restarts"),
        "resumed_from_epochs": m.get("resumed_from_epochs"),
    }
    return verdict(name, criterion, numbers, problems, [stop, resume], shown=tail_of)


# the counter's update period the probe may show before measure.py's bound is too optimistic
ENERGY_UPDATE_MAX_S = 1.25 * ENERGY_UPDATE_S
# mean power of one GPU over the throughput window, from NVML's energy counter (W): below the
# lower bound the counter did not advance (or the window is mistimed); above the upper one no
# single GPU of our targets draws it (H100/H200 SXM: 700 W board limit, nvidia-smi -q)
ENERGY_POWER_W = (20.0, 1000.0)
# energy's mean power vs the mean sampled power_w: the samples also cover evaluation and warm-up
# (0.5 s apart), the counter only the window, so only a gross disagreement is a failure
ENERGY_VS_SAMPLES = (0.5, 1.5)


def judge_nvml(
    run: RunResult, samples: list[dict], probe: dict | None, probe_run: RunResult | None = None
) -> Check:
    """samples: the rows of the run's gpu_samples_rank0.csv (the run has one GPU); probe: the
    JSON of jobs/energy_probe.py on this GPU (None when it did not run or printed nothing);
    probe_run: the probe's process (where it failed, its problems and reason are the check's,
    not "printed nothing", and its log tail is shown unless the sampled run failed too)."""
    criterion = (
        "gpu_samples_rank0.csv has samples and metrics.json gpu_util_mean is not null (or null "
        f"because the window's spans, one per epoch, are shorter than {SHORT_UTIL_SPAN_S:g} s: "
        f"a sample counts where its {NVML_UTIL_LOOKBACK_S:g} s look-back lies inside one, and "
        f"samples come every {NVML_INTERVAL_S:g} s); the energy "
        "probe saw NVML's total-energy counter advance every <= "
        f"{ENERGY_UPDATE_MAX_S:g} s, its median and longest interval alike (measure.py's error "
        f"bound assumes {ENERGY_UPDATE_S:g} s) "
        f"with a power within {ENERGY_POWER_W[0]:.0f}-{ENERGY_POWER_W[1]:.0f} W and "
        f"{ENERGY_VS_SAMPLES[0]:g}-{ENERGY_VS_SAMPLES[1]:g}x nvmlDeviceGetPowerUsage's; the run's "
        "energy_j likewise, or null only because its window is too short for the counter "
        "(gpu-check's epochs last about 0.2 s); energy_wall_j measured or null for that "
        "reason only"
    )
    run_failed = run_problems(run, "the sampled run")
    problems = list(run_failed)
    m = run.metrics or {}
    util = [files.number(s.get("util_pct")) for s in samples]
    power = [files.number(s.get("power_w")) for s in samples]
    clock = [files.number(s.get("sm_clock_mhz")) for s in samples]
    energy_j, window_s = m.get("energy_j"), m.get("window_time_s")
    energy_w = energy_j / window_s if energy_j is not None and window_s else None
    sampled_w = [p for p in power if p is not None]
    sampled_mean_w = sum(sampled_w) / len(sampled_w) if sampled_w else None
    probe = probe or {}
    numbers = {
        "samples": len(samples),
        "gpu_util_mean": m.get("gpu_util_mean"),
        "util_pct_max": _max(util),
        "sm_clock_mhz_max": _max(clock),
        "power_w_max": _max(power),
        "power_w_mean_sampled": sampled_mean_w,
        "energy_j": energy_j,
        "energy_j_per_img": m.get("energy_j_per_img"),
        "power_w_from_energy": energy_w,
        # the wall span (evaluations included: its power is not compared with the samples')
        "energy_wall_j": m.get("energy_wall_j"),
        "energy_wall_s": m.get("energy_wall_s"),
        "probe_updates": probe.get("updates"),
        "probe_interval_s_median": probe.get("interval_s_median"),
        "probe_interval_s_min": probe.get("interval_s_min"),
        "probe_interval_s_max": probe.get("interval_s_max"),
        "probe_power_w_from_counter": probe.get("power_w_from_counter"),
        "probe_power_w_nvml": probe.get("power_w_nvml"),
    }
    probe_failed = probe_run is not None and (was_cut(probe_run) or probe_run.rc != 0)
    if probe_failed:
        problems += probe_run_problems(probe_run)
    else:
        problems += probe_problems(probe)
    if not run_failed:
        if not samples:
            problems.append("no NVML samples (gpu_samples_rank0.csv missing or empty)")
        if m.get("gpu_util_mean") is None:
            why = util_unmeasured(window_s, m.get("epochs"), util)
            if why:
                numbers["gpu_util_unmeasured"] = why
            else:
                problems.append("gpu_util_mean is null")
        problems += energy_problems(m, energy_w, sampled_mean_w)
        wall_why = m.get("energy_wall_unmeasured")
        if m.get("energy_wall_j") is None and not str(wall_why).startswith(ENERGY_SHORT_WINDOW):
            problems.append(f"energy_wall_j is null ({wall_why or 'no reason recorded'})")
    # the log tail shown: the sampled run's where it failed, else the failed probe's
    runs = [probe_run, run] if probe_failed else [run]
    return verdict("nvml", criterion, numbers, problems, runs)


# a span of the throughput window (one per epoch) shorter than this may hold no NVML sample
# whose look-back lies inside it (measure.NVML_UTIL_LOOKBACK_S; samples every NVML_INTERVAL_S):
# gpu_util_mean null there is no failure where NVML gave utilisation samples (reference-bf16's
# window is 0.54 s in three spans)
SHORT_UTIL_SPAN_S = NVML_UTIL_LOOKBACK_S + 2 * NVML_INTERVAL_S


def util_unmeasured(
    window_s: float | None, epochs: int | None, util: list[float | None]
) -> str | None:
    """Why a null gpu_util_mean is no failure, or None where it is one: the window's spans
    (about window_s / epochs each) too short for a sample to measure one alone."""
    if window_s is None or not any(u is not None for u in util):
        return None
    span_s = window_s / (epochs if isinstance(epochs, int) and epochs >= 1 else 1)
    if span_s >= SHORT_UTIL_SPAN_S:
        return None
    return (
        f"no NVML sample's {NVML_UTIL_LOOKBACK_S:g} s look-back lay inside one of the window's "
        f"spans (about {span_s:.2f} s each, {window_s:.2f} s in all); "
        f"{sum(u is not None for u in util)} utilisation samples outside them"
    )


# the energy probe's own one-line refusal (energy_probe.main), else a line that says why
PROBE_REASON = re.compile(rf"^energy_probe: |{ERROR_LINE.pattern}")


def probe_run_problems(probe_run: RunResult) -> list[str]:
    """Why the energy probe's process gave no result: run_problems, and the line of its log
    that says why (its one-line refusal: no GPU, NVML's NotSupported, a counter that went
    backwards), unless the budget cut it."""
    problems = run_problems(probe_run, "the energy probe")
    if not was_cut(probe_run):
        reason = log_line(probe_run.log_tail, PROBE_REASON)
        problems.append(f"its reason: {reason}" if reason else "its log says no reason")
    return problems


def probe_problems(probe: dict) -> list[str]:
    if not probe:
        return ["the energy probe printed nothing (see logs/energy-probe.log)"]
    interval = probe.get("interval_s_median")
    if interval is None or (probe.get("updates") or 0) < 5:
        return [f"the energy counter advanced {probe.get('updates')} times in the probe"]
    problems = []
    # every interval, not the median alone: measure.py's bound assumes a read lags the true
    # count by at most one update, which one stall breaks (its window's edge may fall in it)
    longest = probe.get("interval_s_max")
    if interval > ENERGY_UPDATE_MAX_S:
        problems.append(
            f"the energy counter advances every {interval:.3f} s (median), more than "
            f"{ENERGY_UPDATE_MAX_S:g} s: measure.ENERGY_UPDATE_S ({ENERGY_UPDATE_S:g} s) "
            "understates energy_j's error on this GPU"
        )
    elif longest is None:
        problems.append("the energy probe gave no longest interval (interval_s_max)")
    elif longest > ENERGY_UPDATE_MAX_S:
        problems.append(
            f"the energy counter stalled: its longest interval is {longest:.3f} s (median "
            f"{interval:.3f} s), more than {ENERGY_UPDATE_MAX_S:g} s: measure.ENERGY_UPDATE_S "
            f"({ENERGY_UPDATE_S:g} s) understates energy_j's error on this GPU"
        )
    problems += power_problems(
        "the probe's counter", probe.get("power_w_from_counter"), probe.get("power_w_nvml")
    )
    return problems


def power_problems(what: str, watts: float | None, reference_w: float | None) -> list[str]:
    lo, hi = ENERGY_POWER_W
    if watts is None:
        return [f"{what} gave no power"]
    if not lo <= watts <= hi:
        return [f"mean power from {what} {watts:.0f} W is outside {lo:.0f}-{hi:.0f} W"]
    if reference_w:
        ratio = watts / reference_w
        if not ENERGY_VS_SAMPLES[0] <= ratio <= ENERGY_VS_SAMPLES[1]:
            return [
                f"mean power from {what} {watts:.0f} W vs {reference_w:.0f} W sampled "
                f"({ratio:.2f}x)"
            ]
    return []


def energy_problems(m: dict, energy_w: float | None, sampled_mean_w: float | None) -> list[str]:
    if m.get("energy_j") is None:
        why = m.get("energy_unmeasured") or "no reason recorded"
        if why.startswith(ENERGY_SHORT_WINDOW):
            return []  # the counter was read; the window's spans are too short to bound its error
        return [f"energy_j is null ({why})"]
    if energy_w is None:
        return ["energy_j without a window_time_s: no mean power"]
    return power_problems("energy_j", energy_w, sampled_mean_w)


def _max(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def kernel_shares(kernels: list[dict]) -> tuple[dict[str, float], dict]:
    """Kernel time per category (parse_torch's kernel rows, their shares summed) and the numbers
    both torch.profiler checks report: rows, shares by category, the share left in 'other' and
    its top names."""
    shares: dict[str, float] = {}
    for row in kernels:
        shares[row["category"]] = shares.get(row["category"], 0.0) + float(row["share"])
    numbers = {
        "kernel_rows": len(kernels),
        "share_by_category": {k: round(v, 4) for k, v in sorted(shares.items())},
        "other_share": round(shares.get("other", 0.0), 4),
        "top_other": [r["kernel"][:120] for r in kernels if r["category"] == "other"][:3],
    }
    return shares, numbers


def other_problems(shares: dict[str, float]) -> list[str]:
    """More than MAX_OTHER_SHARE of the kernel time unclassified: classify.py needs the names."""
    if shares.get("other", 0.0) <= MAX_OTHER_SHARE:
        return []
    return [
        f"{shares['other']:.0%} of kernel time is 'other' (> {MAX_OTHER_SHARE:.0%}): "
        "add the names under top_other to nsight/classify.py"
    ]


def judge_profile(run: RunResult, ops: list[dict], kernels: list[dict]) -> Check:
    """ops: the trainer's torch.profiler export (torch_ops_rank0.json "ops"); kernels: its rows
    after nsight.torch_ops.parse_torch (profile_kernels schema)."""
    criterion = (
        "torch.profiler on the GPU recorded CUDA kernels; parsed into the kernels CSV, conv "
        f"kernels recognised and at most {MAX_OTHER_SHARE:.0%} of kernel time left in 'other'"
    )
    problems = run_problems(run)
    if was_cut(run):
        return verdict("torch-profiler", criterion, {}, problems, [run])
    cuda_ops = [
        op
        for op in ops
        if str(op.get("device_type", "")).upper().endswith("CUDA")
        and (files.number(op.get("self_device_us")) or 0) > 0
    ]
    shares, kernel_numbers = kernel_shares(kernels)
    numbers = {"cuda_kernels_recorded": len(cuda_ops), **kernel_numbers}
    if not cuda_ops:
        problems.append("no CUDA kernel in the torch.profiler export (CUPTI unavailable?)")
    if not kernels:
        problems.append("parse_torch returned no kernel rows")
    elif not shares.get("conv"):
        problems.append("no kernel classified as conv: classify.py misses this GPU's conv kernels")
    problems += other_problems(shares)
    return verdict("torch-profiler", criterion, numbers, problems, [run])


def judge_profile_study(run: RunResult, kernels: list[dict], ranges: list[dict]) -> Check:
    """The study's profiling job of a compiled GPU run whose study asked for the whole-step
    graph (gpu_check.profile_study_flags); kernels and ranges: parse_torch's rows."""
    criterion = (
        "exit 0 with a profile window; metrics.json cuda_graphs_mode 'compiled' (a window never "
        "replays the whole step); inductor's kernels (triton_*) recorded, at most "
        f"{MAX_OTHER_SHARE:.0%} of kernel time left in 'other'; rank 0's phase ranges forward, "
        "backward and optimizer projected onto the GPU (from the trace), each with GPU time"
    )
    problems = run_problems(run)
    if was_cut(run):
        return verdict("torch-profiler-study", criterion, {}, problems, [run])
    m = run.metrics or {}
    if run.metrics is not None:
        _expect(m, "cuda_graphs_mode", "compiled", problems)
    shares, kernel_numbers = kernel_shares(kernels)
    triton = [r for r in kernels if str(r["kernel"]).startswith("triton_")]
    phases = {r["range"]: r for r in ranges if int(r["rank"]) == 0}
    numbers = {
        "cuda_graphs_mode": m.get("cuda_graphs_mode"),
        **kernel_numbers,
        "triton_kernels": len(triton),
        "phase_share": {k: round(float(r["share"]), 4) for k, r in sorted(phases.items())},
        "phase_time_base": sorted({r["time_base"] for r in phases.values()}),
    }
    if not triton:
        problems.append("no inductor kernel (triton_*) in the profile: the run did not compile?")
    problems += other_problems(shares)
    missing = [p for p in ("forward", "backward", "optimizer") if p not in phases]
    if missing:
        problems.append(f"no phase range {', '.join(missing)} in the profile of rank 0")
    host = sorted(p for p, r in phases.items() if r["time_base"] != schema.GPU_PROJECTION)
    if host:
        problems.append(
            f"phases {', '.join(host)} of rank 0 timed on the host ({schema.HOST_RANGE}), not "
            "projected onto the GPU: trace_rank0.json missing, or without GPU operations"
        )
    idle = [
        p
        for p in ("forward", "backward", "optimizer")
        if p in phases and p not in host and not float(phases[p]["total_ns"])
    ]
    if idle:
        problems.append(f"phases {', '.join(idle)} of rank 0 launched nothing on the GPU")
    return verdict("torch-profiler-study", criterion, numbers, problems, [run])


# why ncu has no kernel to profile when the torch-profiler run gave no reason of its own
NO_KERNELS = "the torch-profiler check found none"


def judge_ncu(ncu: str | None, attempts: list[dict], no_kernels: str = NO_KERNELS) -> Check:
    """attempts: one per kernel, {"kernel", "run": RunResult (the ncu pass), "rows": parsed
    profile_ncu rows or None, "argv": the ncu command, "error": a parse or setup error, or
    why `ncu --import` did not finish (NO_TIME in it where the budget cut the import),
    "refused": why ncu may not profile on this node (profile_ncu.ncu_refusal), if it said so};
    no_kernels: why there is no attempt (the torch-profiler run's problems, NO_TIME when the
    budget cut it)."""
    name = "ncu"
    criterion = (
        "ncu (--clock-control none) profiled each top kernel; its details CSV parsed into a "
        "profile_ncu row with a duration"
    )
    if ncu is None:
        return skipped(name, criterion, "ncu not installed")
    refused = next((a["refused"] for a in attempts if a.get("refused")), None)
    if refused:  # the study's ncu jobs skip it too (ncu.enabled auto)
        return skipped(name, criterion, refused)
    problems, numbers, runs = [], {"ncu": ncu, "kernels": []}, []
    if not attempts:
        problems.append(f"no kernel to profile ({no_kernels})")
    for a in attempts:
        label = a["kernel"][:80]
        runs.append(a["run"])
        if a.get("error"):
            problems.append(f"{label}: {a['error']}")
        elif a["run"].rc != 0 or a["run"].timed_out:
            problems += run_problems(a["run"], f"ncu on {label}")
        argv = a.get("argv", [])
        clocks = [argv[i + 1 : i + 2] for i, arg in enumerate(argv) if arg == "--clock-control"]
        if clocks != [["none"]]:  # its value too: `base` locks clocks the timed runs ran without
            problems.append(f"{label}: ncu ran without --clock-control none (base clocks)")
        rows = a.get("rows") or []
        if not rows and not a.get("error") and a["run"].rc == 0:
            problems.append(f"{label}: no profile_ncu row")
        for row in rows:
            if not row.get("duration_ns"):
                problems.append(f"{label}: no duration")
            numbers["kernels"].append(ncu_numbers(row))
    return verdict(name, criterion, numbers, problems, runs)


def ncu_numbers(row: dict) -> dict:
    def scaled(key: str, by: float) -> float | None:
        value = files.number(row.get(key))
        return None if value is None else round(value / by, 3)

    return {
        "kernel": str(row.get("kernel"))[:120],
        "duration_us": scaled("duration_ns", 1e3),
        "achieved_occupancy_pct": scaled("achieved_occupancy_pct", 1),
        "sm_throughput_pct": scaled("sm_throughput_pct", 1),
        "dram_throughput_pct": scaled("dram_throughput_pct", 1),
        "tflop_per_s": scaled("flop_per_s", 1e12),
    }


def judge_reference(
    precision: str, ours: RunResult, ref: RunResult, local_batch: int = 512
) -> Check:
    """Our trainer (compiled on CUDA by default) and benchmarks/reference_train.py, same GPU,
    width, local batch, precision; local_batch: the one both were asked for (the targets')."""
    criterion = (
        f"both exit 0 on cuda with the same width, local batch and precision; ours / reference "
        f"(to 3 decimals, as printed) >= {MIN_RATIO} (the Trainer issue's target "
        f"{TARGET_RATIO}x, and on one whole H100 SXM its img/s targets, are reported, not "
        "judged)"
    )
    problems = run_problems(ours, "our trainer") + run_problems(ref, "the reference trainer")
    m, r = ours.metrics or {}, ref.metrics or {}
    ratio = None
    if not problems:
        # the same arithmetic: IEEE fp32 in both at fp32 (reference_train.set_fp32_precision)
        same = ("width", "local_batch", "precision", "world_size", "cudnn_fp32_precision")
        for key in same:
            if m.get(key) != r.get(key):
                problems.append(f"{key} differs: ours {m.get(key)!r}, reference {r.get(key)!r}")
        if _device_type(m) != "cuda" or r.get("device") in (None, "cpu"):
            problems.append(f"not both on cuda: ours {m.get('device')}, ref {r.get('device')}")
        # judged as printed (3 decimals): unrounded, 0.99996 failed beside a printed 1
        ratio = round(m["throughput_img_s"] / r["throughput_img_s"], 3)
        if ratio < MIN_RATIO:
            problems.append(f"ours / reference = {fmt(ratio)} < {fmt(MIN_RATIO)}")
    numbers = {
        "ours_img_s": m.get("throughput_img_s"),
        "reference_img_s": r.get("throughput_img_s"),
        "ratio": ratio,
        f"target_{TARGET_RATIO:g}x_met": None if ratio is None else ratio >= TARGET_RATIO,
        "ours_data_time_frac": m.get("data_time_frac"),
        "ours_step_time_ms_p50": m.get("step_time_ms_p50"),
        "ours_gpu_util_mean": m.get("gpu_util_mean"),
        "ours_mfu": m.get("mfu"),
        "ours_model_flops_per_s": m.get("model_flops_per_s"),
        "ours_peak_flops_source": m.get("peak_flops_source"),
        "ours_compiled": m.get("compiled"),
        "ours_compile_graphs_in_window": m.get("compile_graphs_in_window"),
        **({"ours_mfu_unmeasured": m["mfu_unmeasured"]} if m.get("mfu_unmeasured") else {}),
        **targets_met(precision, local_batch, m),
        "reference_num_workers": r.get("num_workers"),
        "width": m.get("width"),
        "local_batch": m.get("local_batch"),
    }
    return verdict(f"reference-{precision}", criterion, numbers, problems, [ours, ref])


def judge_speed(
    name: str, precision: str, local_batch: int, cuda_graphs: bool, run: RunResult
) -> Check:
    """One timed run of our trainer alone on the GPU (defaults: compiled on CUDA): it must run
    the fast path cleanly; its speed is reported, with the Trainer issue's targets on one whole
    H100 SXM (not_target_device), not judged (a benchmark target missed is no broken node)."""
    criterion = (
        f"exit 0 on cuda, {precision}, local batch {local_batch}"
        + (", CUDA graphs" if cuda_graphs else ", no CUDA graphs")
        + ", alone on the GPU; finite losses; compile_graphs_in_window 0 (no compilation inside "
        "the measurement); img/s, MFU and step time reported, the targets reported, not judged"
    )
    problems = run_problems(run)
    m = run.metrics or {}
    if not problems:
        _expect(m, "precision", precision, problems)
        _expect(m, "local_batch", local_batch, problems)
        _expect(m, "cuda_graphs_used", cuda_graphs, problems)
        problems += compiled_problems(m)
        problems += loss_problems(run.epochs)
    numbers = {
        "img_s": m.get("throughput_img_s"),
        "mfu": m.get("mfu"),
        "step_time_ms_p50": m.get("step_time_ms_p50"),
        **fast_path_numbers(m),
        "cuda_graph_skips": m.get("cuda_graph_skips"),
        "window_steps": m.get("window_steps"),
        "peak_flops_source": m.get("peak_flops_source"),
        **({"mfu_unmeasured": m["mfu_unmeasured"]} if m.get("mfu_unmeasured") else {}),
        **targets_met(precision, local_batch, m),
    }
    return verdict(name, criterion, numbers, problems, [run])


# ---------------------------------------------------------------------------------------------
# the report


def cannot_prove(
    device_count: int,
    two_gpus: str | None = None,
    pending: Sequence[str] = (),
    only: Sequence[str] = (),
) -> list[str]:
    """What these checks on one node leave unproven. two_gpus: nccl2-ddp's status (None: no result:
    still `pending`, or left out by --only's `only`; an UNFINISHED report said "not among the
    checks run (--only)" of a pending nccl2-ddp, with no --only). nccl2-ddp trains plain DDP (no
    comm hook) over NCCL between two GPUs, compiled, the whole step one CUDA graph (its judge
    requires cuda_graphs_mode step and the probe), inside the correctness
    grid: its pass proves NCCL's collectives between GPUs and the CUDA graphs over them, never
    FSDP across GPUs, a hook over NCCL, NCCL's bandwidth or a speed, so those stay listed
    whatever the GPU count."""
    proven = device_count >= 2 and two_gpus == PASS
    if device_count < 2:
        nccl2 = "was skipped (one GPU)"
    elif two_gpus is None and NCCL2 in pending:
        nccl2 = "is not judged yet (pending)"
    elif two_gpus is None and only and NCCL2 not in only:
        nccl2 = "was not among the checks run (--only)"
    elif two_gpus is None:
        nccl2 = "has no result"
    else:
        nccl2 = {NOT_RUN: "was not run (the budget)", SKIPPED: "was skipped"}.get(
            two_gpus, "failed"
        )
    items = []
    if not proven:
        items.append(
            "NCCL collectives between GPUs and their bandwidth (NVLink/PCIe): one NCCL rank "
            "all-reduces with itself, and two ranks on one GPU must use gloo; nccl2-ddp, which "
            f"runs DDP's all-reduce between two GPUs, {nccl2}"
        )
    else:
        items.append(
            "NCCL's bandwidth between GPUs (NVLink/PCIe): nccl2-ddp proves DDP's all-reduce "
            "between two GPUs, in seconds of training that share them with other checks, and "
            "measures no bandwidth"
        )
    items += [
        "FSDP sharding across GPUs (reduce-scatter and all-gather over NCCL): FSDP ran on "
        "one rank, with nothing to shard",
        "DDP comm hooks over NCCL between GPUs: the gloo pair checks their arithmetic and "
        "that ranks agree, not NCCL's path"
        + ("; nccl2-ddp trains without a hook" if device_count >= 2 else ""),
        "scaling efficiency: "
        + (
            "every throughput here is one GPU's"
            if device_count < 2
            else "the one two-GPU run (nccl2-ddp) is seconds long and shares its GPUs with "
            "the other correctness checks, so its throughput says nothing about speed"
        ),
        "multi-node: NCCL over InfiniBand/RoCE, srun across nodes, MASTER_ADDR from the Slurm "
        "node list, process-group timeouts between nodes",
        "the study's numbers: each run here is seconds long, without repeats (a speed-* window "
        "is a few seconds after compilation): indicative, not a benchmark; timings of the checks "
        "that share the GPU (all but reference-*, speed-* and ncu) say nothing about speed",
    ]
    if not proven:
        items.append(
            "CUDA graphs (and torch.compile) with DDP over NCCL between GPUs, the trainer's "
            "default on CUDA (the whole step one graph, NCCL's all-reduces inside it): "
            "cuda-graphs and cuda-graphs-step train a single rank, whose NCCL all-reduce has no "
            "peer, and cuda-graphs-gloo2 two ranks sharing one GPU over gloo, whose all-reduce is "
            f"staged through the host; nccl2-ddp, which runs it between two GPUs, {nccl2}"
        )
    items += [
        "Nsight Compute on a compiled run's kernels: ncu profiles an eager run, so inductor's "
        "fused Triton kernels (triton_*) are measured only by torch.profiler "
        "(torch-profiler-study)",
    ]
    return items


def summary(checks: list[Check]) -> dict[str, int]:
    return {s: sum(c.status == s for c in checks) for s in STATUSES}


def report_json(header: dict, checks: list[Check]) -> dict:
    counts = summary(checks)
    doc = {
        "format": FORMAT,
        **header,
        "passed": counts[FAIL] == 0
        and counts[NOT_RUN] == 0
        and not header.get("pending")
        and not header.get("stopped"),
        "counts": counts,
        "not_run": [c.name for c in checks if c.status == NOT_RUN],
        "checks": [asdict(c) for c in checks],
        "cannot_prove": cannot_prove(
            int(header.get("versions", {}).get("device_count") or 0),
            next((c.status for c in checks if c.name == NCCL2), None),
            header.get("pending") or (),
            header.get("only") or (),
        ),
    }
    return json_safe(doc)


def json_safe(value: Any) -> Any:
    """NaN and infinity as the strings "nan", "inf": JSON has no such numbers, and a diverged
    run's loss must not cost the whole report."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def fmt(value: Any) -> str:
    """A number as the report prints it; None is 'unmeasured'."""
    if value is None:
        return "unmeasured"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {fmt(v)}" for k, v in value.items())
    if isinstance(value, list):
        return "; ".join(fmt(v) for v in value) or "none"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def headline(doc: dict) -> str:
    """PASSED (of --only's checks, where given), FAILED (a check failed), INCOMPLETE (none
    failed, the budget ran out first), UNFINISHED (written while checks were pending:
    gpu-check was still running, or killed), or STOPPED and why (`stopped`: gpu-check gave up
    before its checks, prepare-data failed)."""
    if doc.get("stopped"):
        return f"STOPPED before any check: {doc['stopped']}"
    if doc.get("pending") and not doc["counts"][FAIL]:
        return "UNFINISHED"
    if doc["passed"]:
        # a rerun of what failed (--only): not a whole node's proof
        return (
            "PASSED the checks of --only (the others were not run)" if doc.get("only") else "PASSED"
        )
    return "FAILED" if doc["counts"][FAIL] else "INCOMPLETE"


def rerun_command(doc: dict) -> str:
    """The command that runs the checks the budget left out (gpu-check's own flags; the same
    budget, not the default)."""
    names = ",".join(doc.get("not_run", []))
    budget = f" --budget-s {doc['budget_s']:g}" if doc.get("budget_s") else ""
    # the same --work where one was given: without it the rerun's work directory (its logs,
    # runs and data) went inside --out, which a wrapper brings back whole
    work = f" --work {shlex.quote(doc['work'])}" if doc.get("work") else ""
    return (
        f"PYTHONPATH=src python3 -m scalestudy gpu-check --out gpu-check-rest{work}{budget} "
        f"--only {names}"
    )


def report_markdown(doc: dict) -> str:
    v = doc.get("versions", {})
    counts = doc["counts"]
    not_run = f"{counts[NOT_RUN]} not run (the budget ran out), " if counts[NOT_RUN] else ""
    lines = [
        f"# gpu-check on {doc.get('host')}: {headline(doc)}",
        "",
        f"{counts[PASS]} passed, {counts[FAIL]} failed, {not_run}{counts[SKIPPED]} skipped in "
        f"{fmt(doc.get('wall_s'))} s (budget {fmt(doc.get('budget_s'))} s), "
        f"{doc.get('started_at')}, commit {doc.get('git_commit')}.",
    ]
    if only := doc.get("only"):
        # and the runs they read (NEEDS), which ran too and can fail the report
        pulled = [f"{NEEDS[c]}, whose run {c} reads" for c in only if NEEDS.get(c, c) not in only]
        ran = ", and ".join([", ".join(only), *pulled])
        lines += ["", f"Only these checks ran (--only): {ran}."]
    if doc.get("stopped"):
        lines += ["", "No check ran: gpu-check stopped before them (exit 2)."]
        if doc.get("stopped_log_tail"):
            lines += ["", "```", doc["stopped_log_tail"].rstrip(), "```"]
    if doc.get("pending"):
        lines += [
            "",
            f"Unfinished: written while gpu-check was still running (or before it was killed); "
            f"not judged yet: {', '.join(doc['pending'])}.",
        ]
    if counts[NOT_RUN]:
        lines += [
            "",
            f"Not proven: {', '.join(doc['not_run'])}, for lack of time, not for a fault. "
            f"Run them with `{rerun_command(doc)}` (a --budget-s that fits them; the wall "
            "seconds below show what the others took).",
        ]
    lines += [
        "",
        "## Device and versions",
        "",
        "| what | value |",
        "|---|---|",
    ]
    lines += [f"| {k} | {_cell(fmt(val))} |" for k, val in v.items()]
    lines += ["", "## Checks", "", "| check | status | numbers | criterion | wall s |"]
    lines.append("|---|---|---|---|---|")
    for c in doc["checks"]:
        status = c["status"].upper() if c["status"] == FAIL else c["status"]
        lines.append(
            f"| {c['name']} | {status} | {_cell(fmt(c['numbers']) or '-')} | "
            f"{_cell(c['criterion'])} | {c['wall_s']:.1f} |"
        )
    failed = [c for c in doc["checks"] if c["status"] != PASS]
    if failed:
        lines += ["", "## Failures, skips and checks not run", ""]
    for c in failed:
        lines += [f"### {c['name']} ({c['status']})", ""]
        lines += [f"- {p}" for p in c["problems"]]
        if c["log_tail"]:
            lines += ["", "```", c["log_tail"].rstrip(), "```"]
        lines.append("")
    lines += ["", "## What one GPU cannot prove", ""]
    lines += [f"- {item}" for item in doc["cannot_prove"]]
    if doc.get("fixtures"):
        lines += ["", "## Fixtures (trimmed real output, for tests/fixtures/)", ""]
        lines += [f"- `{f}`" for f in doc["fixtures"]]
    return "\n".join(lines) + "\n"


REPORT_JSON, REPORT_MD = "gpu-check.json", "gpu-check.md"


def write_report(out_dir: Path, header: dict, checks: list[Check]) -> dict:
    """gpu-check.json and gpu-check.md in out_dir, as one output (both new or both old);
    returns the JSON document."""
    doc = report_json(header, checks)
    markdown = report_markdown(doc)
    files.write_texts({out_dir / REPORT_JSON: files.json_text(doc), out_dir / REPORT_MD: markdown})
    return doc


# ---------------------------------------------------------------------------------------------
# fixtures: real output cut to fixture size (7-13 KB; the one-step chrome trace ~123 KB)


def trim_torch_ops(doc: dict, cuda_top: int = 20, cpu_top: int = 10) -> dict:
    """A torch_ops_rank<r>.json export cut down: the phase ranges, the `cuda_top` CUDA entries
    with the most self device time and the `cpu_top` CPU ops with the most self CPU time.
    parse_torch reads the result like the original."""
    ops = list(doc.get("ops", []))
    ranges = [op for op in ops if op.get("name") in schema.RANGES]
    rest = [op for op in ops if op.get("name") not in schema.RANGES]
    on_cuda = [op for op in rest if str(op.get("device_type", "")).upper().endswith("CUDA")]
    on_cpu = [op for op in rest if op not in on_cuda]
    on_cuda.sort(key=lambda op: -float(op.get("self_device_us") or 0))
    on_cpu.sort(key=lambda op: -float(op.get("self_cpu_us") or 0))
    kept = ranges + on_cuda[:cuda_top] + on_cpu[:cpu_top]
    return {**doc, "ops": kept, "trimmed": f"{len(kept)} of {len(ops)} entries"}


def trim_trace(doc: dict, steps: int = 1) -> dict:
    """A torch.profiler chrome trace (trace_rank<r>.json) cut down to what
    nsight.torch_ops.trace_phases reads, over the first `steps` steps: the phase ranges (host
    annotations named in schema.RANGES), the CUDA API calls that launched GPU operations and
    those operations, each event's args reduced to its correlation id, and kineto's own GPU
    spans of annotations (gpu_user_annotation: what the export's device-side range entries
    sum, kept to compare). The steps end at the `steps`-th "optimizer" range (all of them where
    there are fewer)."""
    events = [e for e in doc.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    phases = sorted(
        (e for e in events if e.get("cat") == "user_annotation" and e.get("name") in schema.RANGES),
        key=lambda e: e["ts"],
    )
    if not phases:
        return {**doc, "traceEvents": [], "trimmed": "no phase range"}
    ends = [e["ts"] + e["dur"] for e in phases if e["name"] == "optimizer"][:steps]
    begin = phases[0]["ts"]
    end = ends[-1] if len(ends) == steps else max(e["ts"] + e["dur"] for e in phases)

    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    launched = {correlation(e) for e in gpu}
    launches = [
        e
        for e in events
        if e.get("cat") in LAUNCH_CATEGORIES
        and begin <= e["ts"] <= end
        and correlation(e) in launched
    ]
    kept_corr = {correlation(e) for e in launches}
    fields = ("ph", "cat", "name", "pid", "tid", "ts", "dur")

    def cut(e: dict) -> dict:
        return {k: e[k] for k in fields if k in e}

    gpu = [e for e in gpu if correlation(e) in kept_corr]
    gpu_end = max((e["ts"] + e["dur"] for e in gpu), default=end)  # the GPU lags the host
    spans = [
        e for e in events if e.get("cat") == "gpu_user_annotation" and begin <= e["ts"] < gpu_end
    ]
    out = [cut(e) for e in phases if begin <= e["ts"] <= end]  # no correlation on the host
    out += [cut(e) for e in spans]
    out += [{**cut(e), "args": {"correlation": correlation(e)}} for e in launches + gpu]
    head = {k: v for k, v in doc.items() if k in ("schemaVersion", "displayTimeUnit")}
    return {**head, "traceEvents": out, "trimmed": f"{len(out)} of {len(events)} events"}


_NCU_KEEP = re.compile(
    r"^(gpu__time_duration\.sum|Duration|sm__warps_active\.avg\.pct_of_peak_sustained_active"
    r"|Achieved Occupancy|(dram__|gpu__dram_)throughput\.avg\.pct_of_peak_sustained_elapsed"
    r"|DRAM Throughput|sm__throughput\.avg\.pct_of_peak_sustained_elapsed"
    r"|Compute \(SM\) (Throughput|\[%\])|SM \[%\]"
    r"|(sm|smsp)__sass_thread_inst_executed_op_[hfd](add|mul|fma)_pred_on\.sum)$"
)


def trim_ncu_csv(text: str, preamble: int = 3, rules: int = 2, others: int = 3) -> str:
    """An `ncu --csv --page details` file cut down, lines kept verbatim: up to `preamble` tool
    lines before the header, the header, every metric row nsight/ncu.py reads, and a few rule
    rows and other metric rows, so a test meets what the parser skips too."""
    lines = text.splitlines()
    head = next(
        (i for i, line in enumerate(lines) if '"Metric Name"' in line and '"Kernel Name"' in line),
        None,
    )
    if head is None:
        return text
    header = next(csv.reader([lines[head]]))
    j = header.index("Metric Name")
    kept = lines[max(0, head - preamble) : head + 1]
    counts = {"rule": 0, "other": 0}
    for line in lines[head + 1 :]:
        cells = next(csv.reader(io.StringIO(line)), [])
        metric = cells[j].strip() if len(cells) > j else ""
        if metric and (_NCU_KEEP.match(metric) or ncu.TENSOR_METRIC.match(metric)):
            kept.append(line)
            continue
        kind = "other" if metric else "rule"
        if counts[kind] < (others if metric else rules):
            counts[kind] += 1
            kept.append(line)
    return "\n".join(kept) + "\n"
