"""Which runs of a study are profiled, and the trainer flags of their profiling window.

Pure functions of the study config and its run table (no torch): the workflow's profiling rules
(workflow/rules/profile.smk) and the config checks (study/config.py) call them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scalestudy import vocab
from scalestudy.errors import PlanError
from scalestudy.study.estimate import (
    LONGEST_LIMIT_MIN,
    compute_seconds,
    short,
    slurm_runtime_min,
)
from scalestudy.study.runs import prepared_sizes, trainer_args
from scalestudy.trainer.config import POWERSGD_START_ITER


def profiled_runs(config: dict, rows: list[dict]) -> list[dict]:
    """Rows of the run table the `profiling:` config selects, one per (world size, precision).

    World sizes `profiling.gpus` (null: 1 and one full node, hardware.gpus_per_node) x
    `profiling.precisions`, repeat 0. Several runs can match (strong, weak, bucket variants):
    the one with train.local_batch and train.bucket_cap_mb is preferred, else the first in table
    order. Pairs with no run in the table are skipped (profiling.gpus/precisions are filters).
    """
    prof = config.get("profiling") or {}
    if not prof.get("enabled"):
        return []
    train = config["train"]
    sizes = prof.get("gpus") or sorted({1, config["hardware"]["gpus_per_node"]})
    chosen = []
    for w in sizes:
        for precision in prof["precisions"]:
            match = [
                r
                for r in rows
                if r["world_size"] == w and r["precision"] == precision and r["repeat"] == 0
            ]
            if not match:
                continue
            preferred = [
                r
                for r in match
                if r["local_batch"] == train["local_batch"]
                and r["bucket_cap_mb"] == train["bucket_cap_mb"]
            ]
            chosen.append((preferred or match)[0])
    return chosen


# Nsight Compute's time per profiled kernel launch (--set full replays each launch ~40 times),
# an allowance in s, not a model: one ncu pass that profiled one launch took about 28 s and 25 s
# on an H100, its run's start-up included (docs/gpu-runs/2026-11-27-h100-gpu-check-all: the ncu
# check's 39.1 s in call2, one pass then 11 s of a second; its 49.5 s for two in call3)
NCU_LAUNCH_S = 30.0

# the profiling rules (workflow/rules/profile.smk) that start the ranks, each its own Slurm job
CAPTURE, NCU = "profile_capture", "profile_ncu"


@dataclass(frozen=True, slots=True)
class ProfilingJob:
    """A profiling job as plan.md and the proposal price it: its Slurm time limit (seconds;
    job_minutes, the rule's runtime) on its run's nodes and GPUs, no energy estimate (no J/img
    of a profiled window)."""

    rule: str
    run: str
    nodes: int
    gpus: int
    runtime_s: float
    energy_kwh: None = None

    @property
    def held_s(self) -> float:
        """Seconds it holds its nodes (Estimate.held_s): its time limit, one job."""
        return self.runtime_s


def job_seconds(config: dict, row: dict, estimate) -> dict[str, float]:
    """Estimated seconds of the profiling jobs of a run, from its training estimate (its start-up
    S and images/s X, study/estimate.py): profile_capture starts the run once for one epoch of
    (start_step + steps + 1) global batches G and evaluates one (window_flags):

        T_capture = S + (start_step + steps + 1) G / X + G / (X eval_speedup)

    profile_ncu starts it once per kernel, ncu.top_k times, each profiling launch_count launches:
    T_ncu = top_k (T_capture + launch_count NCU_LAUNCH_S). The profiler's own overhead on the
    window is left to plan.safety_factor."""
    prof = config["profiling"]
    g, x = row["global_batch"], estimate.throughput_img_s
    steps = prof["start_step"] + prof["steps"] + 1
    capture = estimate.startup_s + compute_seconds(1, steps * g, g, x, config["plan"])
    ncu = prof["ncu"]["top_k"] * (capture + prof["ncu"]["launch_count"] * NCU_LAUNCH_S)
    return {CAPTURE: capture, NCU: ncu}


# what shortens each profiling job, for its refusal past hardware.runtime_max or a year
SHORTER = {
    CAPTURE: "profiling.start_step and profiling.steps",
    NCU: "profiling.ncu.top_k (a run per kernel) and profiling.ncu.launch_count",
}


def job_minutes(config: dict, row: dict, estimate, rule: str) -> int:
    """Slurm time limit of a profiling job (`rule`), minutes: job_seconds x plan.safety_factor,
    at least hardware.runtime_min; no USR1 lead, as the job gets no --signal (train's only).
    Past a year (LONGEST_LIMIT_MIN, as a training run's: no sbatch takes it) or past
    hardware.runtime_max a PlanError: a profiling job takes no checkpoints, so it cannot go on
    in another job as a training run does (estimate.split_jobs)."""
    minutes = slurm_runtime_min(job_seconds(config, row, estimate)[rule], config, warned=False)
    if minutes > LONGEST_LIMIT_MIN:
        # before runtime_max's refusal: raising runtime_max (at most a year) cannot fit it
        key, value = _longest_key(config, row, estimate, rule)
        raise PlanError(
            f"config key '{key}': value {short(value)} is not allowed: the {rule} job of run "
            f"{row['run']} needs a Slurm time limit of {short(minutes)} min, more than a year "
            f"({LONGEST_LIMIT_MIN} min), which no sbatch takes, and a profiling job cannot go "
            f"on in another job (no checkpoints): lower {SHORTER[rule]}"
        )
    most = config["hardware"].get("runtime_max")
    if most is not None and minutes > most:
        raise PlanError(
            f"config key 'hardware.runtime_max': value {most} is not allowed: the {rule} job "
            f"of run {row['run']} needs a Slurm time limit of {minutes} min, and a profiling "
            f"job cannot go on in another job (no checkpoints): lower {SHORTER[rule]}, or "
            "profile fewer runs (profiling.gpus, profiling.precisions)"
        )
    return minutes


def _longest_key(config: dict, row: dict, estimate, rule: str) -> tuple[str, int]:
    """The key of SHORTER[rule] that makes the profiling job long, and its value: of
    profile_capture's window (start_step + steps + 1 steps) the larger part; of profile_ncu's
    top_k x (T_capture + launch_count x NCU_LAUNCH_S) the factor whose lowest value (1)
    shortens the job the more (top_k 200000 is 200000 runs, launch_count 10**6 is 10**6
    launches per kernel)."""
    prof = config["profiling"]
    if rule == CAPTURE:
        key = "steps" if prof["steps"] >= prof["start_step"] else "start_step"
        return f"profiling.{key}", prof[key]
    top_k, count = prof["ncu"]["top_k"], prof["ncu"]["launch_count"]
    capture = job_seconds(config, row, estimate)[CAPTURE]  # s, one run of the job
    at_one_kernel = capture + count * NCU_LAUNCH_S  # s: the job at top_k 1
    at_one_launch = top_k * (capture + NCU_LAUNCH_S)  # s: the job at launch_count 1
    if at_one_kernel <= at_one_launch:
        return "profiling.ncu.top_k", top_k
    return "profiling.ncu.launch_count", count


def profiling_jobs(config: dict, rows: list[dict], estimates: Mapping) -> list[ProfilingJob]:
    """One per profiling job of the study: profile_capture (and profile_ncu where Nsight
    Compute runs, ncu_enabled) of each profiled run, at the time limit job_minutes gives the
    rule from the run's training estimate (`estimates`: run -> Estimate); none when profiling
    is off."""
    rules = (CAPTURE, NCU) if ncu_enabled(config) else (CAPTURE,)
    return [
        ProfilingJob(
            rule,
            r["run"],
            r["nodes"],
            r["gpus"],
            60 * job_minutes(config, r, estimates[r["run"]], rule),
        )
        for r in profiled_runs(config, rows)
        for rule in rules
    ]


def window_flags(row: dict, start_step: int, steps: int) -> dict[str, str]:
    """Trainer flags of a profiling job: one short epoch that covers warm-up + the window.

    --profile-steps A:B profiles optimizer steps A..B-1; the epoch holds B + 1 steps (the data
    limited to (B + 1) x global batch images), the exposed-communication probe is off, the
    throughput-window warm-up ends before A, and evaluation uses one global batch of images.
    A run that replays its whole step as one CUDA graph (cuda_graphs step) is profiled under
    auto, which never picks the whole-step graph with a profile window: a replay runs none of
    the loop's host code, so none of the phase ranges the breakdown reads would be recorded
    (trainer/compiling.py); the kernels are the same.
    """
    end = start_step + steps
    global_batch = row["global_batch"]
    graphs = {"--cuda-graphs": "auto"} if row.get("cuda_graphs") == "step" else {}
    return {
        **graphs,
        "--epochs": "1",
        "--limit-train": str((end + 1) * global_batch),
        "--limit-test": str(global_batch),
        "--warmup-steps": str(min(row["warmup_steps"], start_step)),
        "--comm-probe-steps": "0",
        "--profile-steps": f"{start_step}:{end}",
    }


def ncu_enabled(config: dict) -> bool:
    """Nsight Compute runs on GPU studies unless profiling.ncu.enabled is false."""
    return config["profiling"]["ncu"]["enabled"] is not False and (
        config["hardware"]["device"] == "cuda"
    )


def profile_targets(config: dict, profiled: Iterable) -> list[str]:
    """The merged profile CSVs of the study (`rule all`); none when no run is profiled."""
    if not list(profiled):
        return []
    targets = ["results/csv/profile_kernels.csv", "results/csv/profile_ranges.csv"]
    return targets + (["results/csv/profile_ncu.csv"] if ncu_enabled(config) else [])


def merge_flags(profiled: Iterable[str]) -> list[str]:
    """`scalestudy profile merge`'s --run of each input, in the order of the rule's expand()
    over the same runs: a per-run CSV holding another run's rows is refused."""
    return [x for run in profiled for x in ("--run", run)]


def profile_flags(row: dict, profiling: dict) -> list[str]:
    """The run's trainer flags but those the window sets, then the window's: each flag once,
    so that a setting the window overrides (train.epochs, comm_probe_steps) changes neither
    the profiling jobs' flags param nor their launch plan, and reruns no profiling job."""
    window = window_flags(row, profiling["start_step"], profiling["steps"])
    argv = trainer_args(row)  # flag, value pairs
    kept = [
        x
        for flag, value in zip(argv[::2], argv[1::2], strict=True)
        if flag not in window
        for x in (flag, value)
    ]
    return [*kept, *(x for kv in window.items() for x in kv)]


def tool_settings(config: dict) -> dict:
    """`scalestudy profile capture` settings: the tool, which ranks, what nsys traces. The
    nsys settings only where nsys may run (a GPU study, tool auto or nsys), else the capture's
    defaults: the rule's param, they reran every torch.profiler capture they change nothing of."""
    prof = config["profiling"]
    device = config["hardware"]["device"]
    nsys = device == "cuda" and prof["tool"] != "torch"
    return {
        "tool": prof["tool"],
        "ranks": prof["nsys_ranks"] if nsys else vocab.NSYS_RANKS[0],
        "trace": prof["nsys_trace"] if nsys else vocab.NSYS_TRACE,
        "device": device,
    }


def ncu_settings(profiling: dict) -> dict:
    """`scalestudy profile ncu` settings (enabled: "true" forces it, "auto" skips without ncu)."""
    ncu = profiling["ncu"]
    return {
        "enabled": "true" if ncu["enabled"] is True else "auto",
        "top_k": ncu["top_k"],
        "skip": ncu["launch_skip"],
        "count": ncu["launch_count"],
    }


def config_problems(config: dict, rows: list[dict]) -> list[str]:
    """Checks of the `profiling:` section a schema cannot express (study/config.py calls this
    with the study's run table, `rows`)."""
    prof = config.get("profiling") or {}
    if not prof.get("enabled"):
        return []
    problems = []
    cpu = config["hardware"]["device"] == "cpu"
    if cpu and prof["tool"] == "nsys":
        problems.append(
            "config key 'profiling.tool': value \"nsys\" is not allowed: Nsight Systems needs a "
            'GPU and hardware.device is "cpu"; use auto or torch'
        )
    if cpu and prof["ncu"]["enabled"] is True:
        problems.append(
            "config key 'profiling.ncu.enabled': value true is not allowed: Nsight Compute needs "
            'a GPU and hardware.device is "cpu"; use auto or false'
        )
    problems += nsys_trace_problems(prof)
    problems += window_problems(config, rows)
    if not profiled_runs(config, rows):
        problems.append(selection_problem(config, rows))
    return problems


def selection_problem(config: dict, rows: list[dict]) -> str:
    """Why no run is profiled, naming the key that selects none: profiling.gpus where no run has
    its world sizes (null: 1 and one full node), else profiling.precisions, which no run of those
    world sizes has; each with what the study's runs have."""
    prof = config["profiling"]
    sizes = prof["gpus"] or sorted({1, config["hardware"]["gpus_per_node"]})
    sized = [r for r in rows if r["world_size"] in sizes]
    null = " null: 1 and hardware.gpus_per_node" if prof["gpus"] is None else ""
    fix = "pick from them, or set profiling.enabled: false"
    if not sized:
        have = sorted({r["world_size"] for r in rows})
        return (
            f"config key 'profiling.gpus': value {json.dumps(prof['gpus'])} is not allowed: no "
            f"run of the study has world size in {sizes}{f' ({null.strip()})' if null else ''}; "
            f"its world sizes are {have}: {fix}"
        )
    have = sorted({r["precision"] for r in sized})
    return (
        f"config key 'profiling.precisions': value {json.dumps(prof['precisions'])} is not "
        f"allowed: no run of the study with world size in {sizes} (profiling.gpus{null}) has "
        f"one of them; those runs have precision in {json.dumps(have)}: {fix}"
    )


# what `scalestudy profile parse` reads of an nsys capture: the kernels (traced with cuda) and
# the trainer's phase ranges (nvtx); without cuda the parse of the GPU job's capture fails (no
# kernels), without nvtx the report has no phase breakdown
NSYS_TRACE_NEEDS = ("cuda", "nvtx")
_NSYS_TRACE_WORD = re.compile(r"[a-z0-9][a-z0-9-]*")  # cuda, osrt, cuda-hw, python-gil


def nsys_trace_problems(prof: dict) -> list[str]:
    """profiling.nsys_trace (nsys profile --trace): comma-separated API words, with cuda and
    nvtx; not read when profiling.tool is torch."""
    text = prof["nsys_trace"]
    words = text.split(",")
    if prof["tool"] == "torch" or (
        all(_NSYS_TRACE_WORD.fullmatch(w) for w in words)
        and all(need in words for need in NSYS_TRACE_NEEDS)
    ):
        return []
    return [
        f"config key 'profiling.nsys_trace': value {json.dumps(text)} is not allowed: nsys "
        "--trace APIs, comma-separated without spaces, with cuda (the kernels `scalestudy "
        "profile parse` reads) and nvtx (the trainer's phase ranges), e.g. "
        '"cuda,nvtx,osrt,cudnn,cublas"'
    ]


def window_problems(config: dict, rows: list[dict]) -> list[str]:
    """The window must fit the data: a profiled epoch holds start_step + steps + 1 steps."""
    prof = config["profiling"]
    # the profiling job sets its own --limit-train, so only the dataset itself bounds it
    n_train = prepared_sizes(config)[0]
    synthetic = config["dataset"] == "synthetic"
    source = "synthetic.num_train" if synthetic else f"the {config['dataset']} set"
    problems = []
    if config["train"]["comm_hook"] == "powersgd" and prof["start_step"] < POWERSGD_START_ITER:
        # the trainer's throughput window opens after them too: a profile epoch of fewer
        # steps is refused in every profiling job
        problems.append(
            f"config key 'profiling.start_step': value {prof['start_step']} is not allowed with "
            f"train.comm_hook powersgd: at least {POWERSGD_START_ITER}, PowerSGD's uncompressed "
            "steps (a window before them profiles plain all-reduces)"
        )
    window = prof["start_step"] + prof["steps"] + 1  # steps of the profiled epoch
    too_long = [r for r in profiled_runs(config, rows) if window * r["global_batch"] > n_train]
    # one line, for the run of the largest global batch: its epoch is the shortest, so the fix
    # it names fits every profiled run (a line per run gave start_step at most 184 and at most
    # 37, and who followed the first was refused again)
    if not too_long:
        return problems
    row = max(too_long, key=lambda r: r["global_batch"])
    need = window * row["global_batch"]
    others = len(too_long) - 1
    also = f" (and {others} more profiled {vocab.plural('runs', others)})" if others else ""
    # the key that can change: start_step cannot go below 0, nor with PowerSGD below its
    # uncompressed steps (refused above)
    earliest = POWERSGD_START_ITER if config["train"]["comm_hook"] == "powersgd" else 0
    movable = prof["start_step"] > earliest
    in_epoch = n_train // row["global_batch"]  # steps of one epoch
    most = in_epoch - prof["start_step"] - 1  # steps from this start
    latest = in_epoch - prof["steps"] - 1  # start of these steps
    # the key named is the one its fix changes
    if movable and latest >= earliest:
        key, fix = "start_step", f"start_step at most {latest}, or fewer steps"
    elif most >= 1:
        key, fix = "steps", f"at most {most} steps"
    elif movable and in_epoch - earliest - 1 >= 1:  # a step fits from the earliest
        fits = in_epoch - earliest - 1  # steps from the earliest start
        key = "start_step"
        fix = f"fewer steps from an earlier start_step: at most {fits} from {earliest}"
    else:  # not a step from the earliest start before the epoch's last (an epoch of 1)
        key, fix = "steps", "no window fits: a smaller batch"
    problems.append(
        f"config key 'profiling.{key}': value {prof[key]} is not allowed: "
        f"run {row['run']}{also} would need (start_step {prof['start_step']} + steps "
        f"{prof['steps']} + 1) x global batch {row['global_batch']} = {need} training "
        f"images, more than the {n_train} of {source}; {fix}"
    )
    return problems
