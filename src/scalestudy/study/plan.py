"""Node-hours and GPU-hours of a study before it runs, calibrated from the runs that finished.

The estimate of each run and its calibration: study/estimate.py (formula in its docstring).
This module sums them per rule, family and study, prints the dry-run table and writes the plan.

Dry-runs: the training rule's Slurm `runtime` comes from study.resources.TrainingPlan, which
calls `register(...)` on first use (in the main process when common.smk is parsed: its
`refusal()`, so a refused measured file stops in one line before any job); the Snakemake logger
plugin `snakemake_logger_plugin_scalestudy` (same process) reads `registered()` when Snakemake
closes its loggers and prints `format_table` for the jobs the dry-run would run.

    scalestudy plan --config config/config.yaml     # -> reports/plan.md, results/plan.csv
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import io
import json
import math
import os
from collections.abc import Callable, Iterable
from decimal import Decimal
from pathlib import Path

from scalestudy import files, log, vocab
from scalestudy.errors import PlanError, StudyConfigError
from scalestudy.study import model, profiling
from scalestudy.study.estimate import (
    BASE_KEY,
    BENCHMARKS_DIR,
    NOT_MEASURED,
    NOT_USED,
    OTHER_CAP,
    PLAN_COLUMNS,
    PLAN_CSV,
    PLAN_MD,
    RUNS_CSV,
    Estimate,
    add_measured_arguments,
    as_float,
    calibrating,
    calibration_check,
    estimate_runs,
    load_measured,
    measured_paths,
    on_measured,
    run_base,
    same_gpu,
)
from scalestudy.study.runs import build_run_table

logger = log.get(__name__)

# ---------------------------------------------------------------------------------------------
# totals and the dry-run table


@dataclasses.dataclass(frozen=True, slots=True)
class Total:
    jobs: int
    node_hours: float
    gpu_hours: float
    energy_kwh: float | None = None  # training runs' GPU energy; None when any is unmeasured


def _sum(estimates: Iterable[Estimate]) -> Total:
    estimates = list(estimates)
    return Total(
        len(estimates),
        sum(e.node_hours for e in estimates),
        sum(e.gpu_hours for e in estimates),
        _energy(e for e in estimates if e.rule == "train"),
    )


def _energy(estimates: Iterable[Estimate]) -> float | None:
    """Sum of the runs' estimated kWh; None when any run has no measured J/img to estimate it
    from (a partial sum would pass for the whole), or when there is no run."""
    kwh = [e.energy_kwh for e in estimates]
    return sum(kwh) if kwh and None not in kwh else None


def kwh_cell(kwh: float | None, calibrate: bool = True) -> str:
    """A kWh total; without one, why: no measured J/img, or none read (plan.calibrate false)."""
    if kwh is None:
        return NOT_MEASURED if calibrate else NOT_USED
    return f"{kwh:.3g}"


def totals(estimates: list[Estimate]) -> dict:
    """{"rule": {rule: Total}, "family": {family: Total}, "total": Total}. A run shared by
    several families counts in each family's subtotal, and once in the total."""
    rules = sorted({e.rule for e in estimates})
    families = [f for f in vocab.FAMILIES if any(f in e.families.split(";") for e in estimates)]
    return {
        "rule": {r: _sum(e for e in estimates if e.rule == r) for r in rules},
        "family": {f: _sum(e for e in estimates if f in e.families.split(";")) for f in families},
        "total": _sum(estimates),
    }


def hms(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _mark(e: Estimate) -> str:
    if e.rule != "train" or e.throughput_basis in ("requested", "local"):  # no estimate
        return e.throughput_basis
    if not e.calibrated:
        return "default"
    # of the runtime column's time (held_s: the resumptions' start-ups too), not of runtime_s,
    # which fell outside it: 4:31:45 [3:38:34-4:22:55] (32 jobs)
    extra = e.held_s - e.runtime_s
    interval = (
        ""
        if e.runtime_lo_s is None
        else f" [{hms(e.runtime_lo_s + extra)}-{hms(e.runtime_hi_s + extra)}]"
    )
    startup = "" if e.startup_basis == "default" else " +startup"
    return f"* {e.throughput_basis}{interval}{startup}"


def format_table(estimates: list[Estimate], note: str = "", gpu: bool | None = None) -> str:
    """The dry-run table: one row per job, then totals per rule, per family and overall. A CPU
    study (no job on a GPU) prints n/a for GPUs and GPU-hours, as plan.md and the proposal do,
    not a counted 0. `gpu`: whether the study is on GPUs (None: whether any job has GPUs; a GPU
    study's dry-run of its local rules alone has none, and prints 0)."""
    t = totals(estimates)
    gpu = any(e.gpus for e in estimates) if gpu is None else gpu

    def gpus(n: int, width: int) -> str:
        return f"{n:{width}d}" if gpu else f"{'n/a':>{width}}"

    def gpu_h(x: float, width: int, unit: str = "") -> str:
        return f"{x:{width}.3f}{unit}" if gpu else f"{'n/a':>{width}}{unit}"

    width = max([len(e.run) for e in estimates] + [3])
    rwidth = max([len(e.rule) for e in estimates] + [4])
    lines = [
        "",
        "Node-hour plan (scalestudy): jobs this run would start, estimated runtime per job",
        "(* = calibrated from measured runs in results/csv/runs.csv; "
        "formula: scalestudy/study/estimate.py;",
        " [lo-hi]: the scaling model's 95% interval of the runtime; totals add unrounded hours)",
        f"{'rule':<{rwidth}}  {'run':<{width}}  nodes  GPUs   runtime  node-hours  GPU-hours  "
        "basis",
    ]
    for e in estimates:
        # a run past hardware.runtime_max: its jobs' time together, resumptions' start-ups too
        jobs = f" ({e.jobs} jobs)" if e.jobs > 1 else ""
        lines.append(
            f"{e.rule:<{rwidth}}  {e.run:<{width}}  {e.nodes:5d}  {gpus(e.gpus, 4)}  "
            f"{hms(e.held_s):>8}  {e.node_hours:10.3f}  {gpu_h(e.gpu_hours, 9)}  "
            f"{_mark(e)}{jobs}"
        )
    # one column for every name in the totals, rule or family, 14 wide at least
    nwidth = max([len(name) for name in [*t["rule"], *t["family"]]] + [14])
    lines.append("per rule:")
    for name, s in t["rule"].items():
        lines.append(
            f"  {name:<{nwidth}} {s.jobs:4d} jobs  {s.node_hours:10.3f} node-hours  "
            f"{gpu_h(s.gpu_hours, 10, ' GPU-hours')}"
        )
    if t["family"]:
        lines.append("per family (a run shared by several families counts in each):")
        for name, s in t["family"].items():
            lines.append(
                f"  {name:<{nwidth}} {s.jobs:4d} runs  {s.node_hours:10.3f} node-hours  "
                f"{gpu_h(s.gpu_hours, 10, ' GPU-hours')}"
            )
    s = t["total"]
    # counted as plan.md counts: in throughput, and apart in start-up only (`default +startup`)
    train = [e for e in estimates if e.rule == "train"]
    calibrated = sum(e.throughput_calibrated for e in train)
    startup = sum(e.startup_only for e in train)
    more = sum(e.jobs - 1 for e in estimates)
    resubmitted = f" (+{more} resubmissions past hardware.runtime_max)" if more else ""
    lines.append(
        f"total: {s.jobs} jobs{resubmitted}, {s.node_hours:.3f} node-hours, "
        f"{f'{s.gpu_hours:.3f}' if gpu else 'n/a'} GPU-hours "
        f"({calibrated} of {len(train)} training estimates calibrated in throughput, {startup} "
        "more in start-up only)"
    )
    if note:
        lines.append(note)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# registration (the training jobs' runtime -> the logger plugin, same process)


@dataclasses.dataclass
class Registered:
    config: dict
    estimates: dict[str, Estimate]
    is_local: Callable[[str], bool]


_REGISTERED: Registered | None = None


def register(
    config: dict, rows: Iterable[dict], measured: list[dict], is_local: Callable[[str], bool]
) -> dict[str, Estimate]:
    """The estimates of every run, kept for the logger plugin (study.resources.TrainingPlan calls
    this on first use: common.smk's `PLAN.refusal()` in the main process, else a training job's
    runtime). is_local(rule name) -> True for rules that run on the submitting host."""
    global _REGISTERED
    estimates = {e.run: e for e in estimate_runs(config, rows, measured)}
    _REGISTERED = Registered(config, estimates, is_local)
    return estimates


def registered() -> Registered | None:
    return _REGISTERED


def _int(value, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def gpus_from_resources(resources: dict) -> int:
    """GPUs a job asks for: gres gpu[:type]:N per node, else the `gpu` resource (job total)."""
    gres = str(resources.get("gres") or "")
    for part in gres.split(","):
        fields = part.split(":")
        if fields[0] == "gpu" and len(fields) >= 2:
            return _int(fields[-1], 1) * max(1, _int(resources.get("nodes"), 1))
    return _int(resources.get("gpu"))


def job_estimate(reg: Registered | None, rule: str, wildcards: dict, resources: dict) -> Estimate:
    """The Estimate of one job a dry-run lists. Training jobs: the run's estimate (a done run's
    as trained again: its retrain_jobs). Rules that run on the submitting host (localrules,
    `all`): 0 node-hours. Any other rule: its Slurm request (runtime resource x nodes), marked
    `requested`; no rule makes this fail."""
    run = str(wildcards.get("run", "")) if wildcards else ""
    if reg is not None and rule == "train" and run in reg.estimates:
        e = reg.estimates[run]
        return dataclasses.replace(e, jobs=e.retrain_jobs) if e.done else e
    label = run or ",".join(f"{k}={v}" for k, v in (wildcards or {}).items()) or "-"
    try:
        local = reg is not None and reg.is_local(rule)
    except Exception:  # a rule the registered workflow does not know
        local = False
    nodes = max(1, _int(resources.get("nodes"), 1))
    if local:
        return Estimate(rule, label, "", 0, 0, 0.0, throughput_basis="local")
    runtime_min = as_float(resources.get("runtime")) or 0.0
    return Estimate(
        rule,
        label,
        "",
        nodes,
        gpus_from_resources(resources),
        runtime_min * 60,
        throughput_basis="requested",
    )


# ---------------------------------------------------------------------------------------------
# plan export: reports/plan.md and results/plan.csv


def plan_csv_text(estimates: list[Estimate], done_known: bool = True) -> str:
    """plan.csv; its done cells blank where not known (plan.calibrate false reads no run)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(PLAN_COLUMNS)
    for e in estimates:
        values = dataclasses.asdict(e)
        values.update(
            node_hours=round(e.node_hours, 6),
            gpu_hours=round(e.gpu_hours, 6),
            runtime_s=round(e.runtime_s, 3),
            throughput_img_s=round(e.throughput_img_s, 3),
            startup_s=round(e.startup_s, 3),
            # significant digits, not decimal places: a demo run's 2.5e-07 kWh was 0.0
            energy_kwh=None if e.energy_kwh is None else float(f"{e.energy_kwh:.6g}"),
            runtime_lo_s=None if e.runtime_lo_s is None else round(e.runtime_lo_s, 3),
            runtime_hi_s=None if e.runtime_hi_s is None else round(e.runtime_hi_s, 3),
            extrapolated=str(e.extrapolated).lower(),
            done=str(e.done).lower() if done_known else "",
        )
        writer.writerow([values[c] for c in PLAN_COLUMNS])
    return out.getvalue()


def plan_digest(estimates: list[Estimate], config: dict, measured: Iterable[dict] = ()) -> str:
    """sha256 (16 hex digits) of plan_csv_text and of what else reports/plan.md prints from the
    config (the study's name, repeats, hardware, `plan:` (its contingency is in no estimate),
    `profiling:` (its jobs) and proposal.contingency) and from the measured runs (read_measured:
    runs.csv's rows with their benchmarks' wall times, which "How good the estimates are" and
    the scaling model's check print): changes whenever any does, so the plan rule reruns (a new
    contingency or profiling left plan.md at the old one, and a job's wall time of 40 s become
    400 s its "largest error 22%" where it was 92%)."""
    shown = {k: config.get(k) for k in ("study", "repeats", "hardware", "plan", "profiling")}
    shown["proposal.contingency"] = (config.get("proposal") or {}).get("contingency")
    runs = sorted(measured, key=lambda r: str(r.get("run")))
    text = plan_csv_text(estimates) + json.dumps([shown, runs], sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _count(n: int, unit: str) -> str:
    """ "1 repeat", "2 repeats": a count with its unit as it reads (vocab.plural)."""
    return f"{n} {vocab.plural(unit, n)}"


def plan_markdown(
    config: dict,
    estimates: list[Estimate],
    check: list[dict],
    holdout: list[model.HoldoutRow] = (),
    runs_csv: str | Path = RUNS_CSV,
    benchmarks_dir: str | Path = BENCHMARKS_DIR,
    measured: list[dict] = (),
) -> str:
    """The allocation-proposal page: formula, parameters, per family with contingency.
    runs_csv, benchmarks_dir: the measured files the estimates were calibrated from, named on
    the page (measured: their runs, for those left out for their GPU); the training jobs'
    Slurm limits are these estimates only where they are the study's own
    (resources.TrainingPlan reads nothing else), or where none is read.

    Long because it is the page itself, section after section in reading order; splitting it
    would scatter one document over helpers that are used nowhere else."""
    plan, t = config["plan"], totals(estimates)
    c, other = plan["contingency"], proposal_contingency(config)
    remaining = _sum(e for e in estimates if not e.done)
    throughput = sum(e.throughput_calibrated for e in estimates)
    startup_only = sum(e.startup_only for e in estimates)
    x = plan["throughput_img_s_per_gpu"]
    gpu = config["hardware"]["device"] == "cuda"
    unit = "GPU" if gpu else "rank (CPU process)"
    # a CPU study's runs use no GPU: its GPUs and GPU-hours are n/a, not a counted 0 (as in the
    # proposal), and so is GPU energy, which no CPU run can measure
    na = "n/a"
    bench = f"{benchmarks_dir}/<run>.tsv"
    own = _same_path(runs_csv, RUNS_CSV) and _same_path(benchmarks_dir, BENCHMARKS_DIR)
    lines = [
        f"# Node-hour plan: {config['study']}",
        "",
        f"{_count(len(estimates), 'training runs')} ({_count(config['repeats'], 'repeats')}), "
        f"device {config['hardware']['device']}, "
        f"{_count(config['hardware']['gpus_per_node'], 'ranks')} per node. "
        "Written by `scalestudy plan` (src/scalestudy/study/plan.py). "
        + (
            f"Calibrated from {runs_csv} and {bench} (measured runs and Snakemake's job wall "
            "times, where they exist)"
            if plan["calibrate"]
            else "Not calibrated (plan.calibrate false)"
        )
        + (
            "; the same estimates set each training job's Slurm time limit and are printed by "
            "`snakemake --dry-run`."
            if own or not plan["calibrate"]
            else f", not the study's own {RUNS_CSV} and {BENCHMARKS_DIR}/<run>.tsv: each "
            "training job's Slurm time limit and `snakemake --dry-run` come from those, not "
            "these estimates."
        )
        + ("" if gpu else " A CPU study uses no GPUs: its GPUs, GPU-hours and GPU energy are n/a."),
        "",
        "## Formula",
        "",
        "For a run of W ranks on `nodes` nodes, `epochs` epochs of N_train training images, with "
        "evaluation on N_test images after each epoch:",
        "",
        "    T = epochs * (N_train / X + N_test / (X * eval_speedup)) + N_probe / X + startup_s",
        "    X = x_rank * W,   x_rank = throughput_img_s_per_gpu[precision] * eta(W)",
        "    N_probe = 2 * (comm_probe_steps + 1) * W * local_batch   (0 for one rank)",
        "    node-hours = sum over runs of nodes * T / 3600,   GPU-hours = sum of GPUs * T / 3600",
        "    (a run past hardware.runtime_max: T + (jobs - 1) * startup_s, its resumptions)",
        f"    request = node-hours * (1 + contingency),   contingency = {c:g}",
        "",
        "N_probe: the images of the exposed-communication probe after training (a warm-up and "
        "train.comm_probe_steps forward-backward passes with gradient sync, as many without). "
        "eta(W) = 1 for one rank, efficiency_intra_node within one node, efficiency_inter_node "
        "across nodes. Calibrated runs (basis other than `default`) take x_rank from measured "
        f"runs ({runs_csv}) of the same base ({', '.join(BASE_KEY)}, image shape, num_workers "
        "with loader dataloader, threads per rank, and the GPU family hardware.gpu_type names, "
        "where it names one of hardware.py's table; any other measured run calibrates nothing): "
        "the same configuration, else the same precision, world size "
        "and local batch, else the same precision and world size (each on as many nodes) at the "
        "nearest measured local batch, a larger one at its step time (x_rank x local_batch / "
        "its local batch), else "
        "the scaling model "
        "(basis `model`: x_rank = local_batch / T_step, study/model.py, fitted to the measured "
        "DDP runs; runtime with its 95% prediction interval; `model, extrapolated` "
        f"{model.EXTRAPOLATED}), else the same precision at the nearest measured "
        "world size, rescaled by eta, at its nearest measured local batch as above; the batch "
        "and world-size levels take runs of the run's own bucket cap before the model and of "
        "any cap after it. startup_s "
        "comes from Snakemake's measured job wall times wherever there are some, for a run of "
        "basis `default` too (`+startup` in the Runs table).",
        "",
        "## Parameters (`plan:` in the study config)",
        "",
        "| parameter | value |",
        "|---|---|",
        *[f"| images/s per {unit}, {p} | {x[p]:g} |" for p in x],
        f"| efficiency_intra_node | {plan['efficiency_intra_node']:g} |",
        f"| efficiency_inter_node | {plan['efficiency_inter_node']:g} |",
        f"| eval_speedup | {plan['eval_speedup']:g} |",
        f"| startup_s | {plan['startup_s']:g} |",
        f"| safety_factor (Slurm time limit) | {plan['safety_factor']:g} |",
        f"| contingency (request{'; ' + other if other else ''}) | {c:g} |",
        "",
        "## Per family",
        "",
        "A run shared by several families counts in each family; the total counts it once. "
        "Node-hours = nodes x hours: a run on fewer GPUs than a node (hardware.gpus_per_node) "
        "counts its whole node (what a machine that allocates whole nodes charges, an upper "
        "bound where nodes are shared); GPU-hours count its GPUs.",
        "",
        "GPU energy (kWh, training runs, no contingency) = sum of J/img x epochs x N_train / "
        "3.6e6, J/img measured (NVML) on runs of the same precision and world size (over "
        "their training spans, else over the window's wall span, the evaluations between its "
        "epochs included: the "
        "run's energy basis says which; of another local batch, the nearest measured one's "
        "power, J/img x img/s, over the run's img/s, and of another DDP bucket cap alike, the "
        f"basis saying `{OTHER_CAP}`); `not measured` when any run of the row "
        "has no such "
        "measurement; `not used (plan.calibrate false)` when the plan reads no measured run.",
        "",
        "| family | runs | node-hours | GPU-hours | node-hours with contingency | "
        "GPU-hours with contingency | GPU energy kWh |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in [*t["family"].items(), ("**total**", t["total"])]:
        lines.append(
            f"| {name} | {s.jobs} | {up(s.node_hours)} | {up(s.gpu_hours) if gpu else na} | "
            f"{up(s.node_hours * (1 + c))} | {up(s.gpu_hours * (1 + c)) if gpu else na} | "
            f"{kwh_cell(s.energy_kwh, plan['calibrate']) if gpu else na} |"
        )
    lines += ["", *_profiling_lines(config, estimates, t["total"], gpu)]
    lines += [
        (
            # done = a row in runs.csv, which collect writes once every run has finished: mid-
            # study every run was "not yet run" here while the dry-run listed the unfinished
            f"Not yet measured (no row in {runs_csv}, which `collect` writes once every run has "
            "finished: `snakemake -n` lists the training jobs left): "
            f"{_count(remaining.jobs, 'runs')}, {up(remaining.node_hours)} "
            "node-hours"
            + (
                f", {up(remaining.gpu_hours)} GPU-hours ({up(remaining.node_hours * (1 + c))} "
                f"/ {up(remaining.gpu_hours * (1 + c))} with contingency)."
                if gpu
                else f" ({up(remaining.node_hours * (1 + c))} with contingency)."
            )
            if plan["calibrate"]
            # no measured run read, none known to be done (read_measured)
            else "Not yet measured: not known (plan.calibrate false: the plan reads no measured "
            "run)."
        ),
        f"Calibrated estimates: {throughput} of {len(estimates)} in throughput (basis other "
        f"than `default`), {startup_only} more in start-up only (basis `default +startup`)."
        + _other_gpus(config, measured),
        "",
    ]
    if check:
        worst = max(abs(r["error"]) for r in check)
        worst_loo = max(abs(r["loo_error"]) for r in check)
        measured_sum = sum(r["measured_s"] for r in check)
        estimate_sum = sum(r["estimate_s"] for r in check)
        loo_sum = sum(r["loo_estimate_s"] for r in check)
        lines += [
            "## How good the estimates are",
            "",
            "Each finished run against Snakemake's measured job wall time "
            f"({bench}): estimated with the calibration from all finished runs "
            "(what a repeat of it is planned at), and leave-one-out, from the finished runs of "
            "the other configurations only, its own repeats left out too (basis: the "
            "calibration level used). Runs measured under another configuration and resumed "
            "runs (their wall time is one attempt's) are not checked.",
            "",
            "| run | measured | calibrated estimate | error | leave-one-out | error | basis |",
            "|---|---|---|---|---|---|---|",
            *[
                f"| {r['run']} | {r['measured_s']:.1f} s | {r['estimate_s']:.1f} s | "
                f"{r['error']:+.0%} | {r['loo_estimate_s']:.1f} s | {r['loo_error']:+.0%} | "
                f"{r['loo_basis']} |"
                for r in check
            ],
            "",
            f"Largest error over {_count(len(check), 'runs')}: {worst:.0%} calibrated, "
            f"{worst_loo:.0%} leave-one-out. Sum over these runs: measured {measured_sum:.1f} s, "
            f"calibrated {estimate_sum:.1f} s ({estimate_sum / measured_sum - 1:+.0%}), "
            f"leave-one-out {loo_sum:.1f} s ({loo_sum / measured_sum - 1:+.0%}).",
            "",
        ]
    lines += model_section(holdout)
    lines += [
        "## Runs",
        "",
        "Runtime: the run's hours on its nodes (node-hours = nodes x runtime), as the dry-run "
        "prints it: a run past hardware.runtime_max goes on in several jobs (`(N jobs)`), each "
        "resumption's start-up included. Runtime interval: the scaling model's 95% prediction "
        "interval of the training (basis `model`); "
        f"`extrapolated`: {model.EXTRAPOLATED}. Basis: where x_rank came "
        "from; `+startup`: startup_s from measured job wall times. A run's Slurm time limit "
        "(results/plan.csv, slurm_runtime_min) is its runtime, or the interval's upper end where "
        "there is one, x safety_factor plus checkpointing.signal_lead_s and 60 s (checkpointing "
        "on: Slurm may send the USR1 warning up to 60 s before its lead, man sbatch --signal), "
        "at least hardware.runtime_min, so the warning never comes before runtime x "
        "safety_factor. Hours are to the nearest 0.001 here; the totals above add the unrounded "
        "hours (rounded up), so the rows' printed sum may differ from them by rounding.",
        "",
        "| run | families | nodes | GPUs | runtime | interval | node-hours | GPU-hours | basis "
        "| done |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *[
            f"| {e.run} | {e.families} | {e.nodes} | {e.gpus if gpu else na} | "
            f"{hms(e.held_s)}{f' ({e.jobs} jobs)' if e.jobs > 1 else ''} | {_interval(e)} | "
            f"{e.node_hours:.3f} | "
            f"{f'{e.gpu_hours:.3f}' if gpu else na} | {_basis(e)} | "
            f"{('yes' if e.done else '') if plan['calibrate'] else na} |"
            for e in estimates
        ],
        "",
        *_no_interval(estimates),
        *_split_lines(estimates, config),
    ]
    return "\n".join(lines)


def _split_lines(estimates: list[Estimate], config: dict) -> list[str]:
    """The runs whose time limit is past hardware.runtime_max: how many jobs each takes (a
    measured one, if trained again)."""
    split = [e for e in estimates if e.jobs > 1]
    again = [e for e in estimates if e.done and e.retrain_jobs > 1]
    most = config["hardware"].get("runtime_max")
    lines = []
    if again:
        lines += [
            f"Measured runs past hardware.runtime_max ({most} min) took one job; trained again "
            "(a trainer update, a deleted output, -R) each asks for runtime_max and goes on in "
            "further jobs (slurm_runtime_min): "
            + "; ".join(f"{e.run} ({e.retrain_jobs} jobs)" for e in again)
            + ".",
            "",
        ]
    if not split:
        return lines
    return lines + [
        f"Runs past hardware.runtime_max ({most} min) go on in further jobs (results/plan.csv, "
        "jobs), each resubmitted after its USR1 warning and resuming "
        "from its checkpoint (checkpointing.retries), its start-up counted again in the "
        "node-hours: "
        + "; ".join(
            f"{jobs} jobs of {most} min: {', '.join(e.run for e in split if e.jobs == jobs)}"
            for jobs in sorted({e.jobs for e in split})
        )
        + ".",
        "",
    ]


def profiling_total(config: dict, estimates: Iterable[Estimate]) -> Total:
    """The study's profiling jobs (profiling.profiling_jobs), priced as the dry-run table and
    the proposal price them: each at its Slurm time limit, from its run's training estimate
    (`estimates`), on the run's nodes and GPUs."""
    by_run = {e.run: e for e in estimates}
    jobs = profiling.profiling_jobs(config, build_run_table(config), by_run)
    return Total(
        len(jobs),
        sum(j.nodes * j.runtime_s for j in jobs) / 3600,
        sum(j.gpus * j.runtime_s for j in jobs) / 3600,
    )


def _profiling_lines(
    config: dict, estimates: list[Estimate], training: Total, gpu: bool
) -> list[str]:
    """The profiling jobs, and training and profiling together: the hours to ask for."""
    prof = profiling_total(config, estimates)
    if not prof.jobs:
        return []
    runs = len(profiling.profiled_runs(config, build_run_table(config)))
    c = config["plan"]["contingency"]

    def hours(t: Total, factor: float = 1.0) -> str:
        gpu_h = f", {up(t.gpu_hours * factor)} GPU-hours" if gpu else ""
        return f"{up(t.node_hours * factor)} node-hours{gpu_h}"

    def both(factor: float = 1.0) -> str:  # the sum of the two printed totals
        node_h, gpu_h = (printed_sum(training, prof, kind, factor) for kind in ("node", "gpu"))
        return f"{node_h} node-hours" + (f", {gpu_h} GPU-hours" if gpu else "")

    rules = "profile_capture and profile_ncu" if prof.jobs > runs else "profile_capture"
    ncu = (
        f" (profile_ncu: once per kernel, ncu.top_k = {config['profiling']['ncu']['top_k']}, "
        f"each with its launches at {profiling.NCU_LAUNCH_S:g} s)"
        if prof.jobs > runs
        else ""
    )
    other = proposal_contingency(config)
    return [
        f"Profiling jobs ({rules} of {_count(runs, 'profiled runs')}, each at its Slurm time "
        "limit, as the dry-run and the proposal price them: its run's start-up and profiled "
        f"window{ncu} x safety_factor, at least hardware.runtime_min = "
        f"{config['hardware']['runtime_min']:g} min; no energy estimate): "
        f"{_count(prof.jobs, 'jobs')}, {hours(prof)} ({hours(prof, 1 + c)} with contingency).",
        f"Training and profiling together: {both()} ({both(1 + c)} with contingency: "
        + (f"this plan's request; {other})." if other else "the request)."),
        "",
    ]


def proposal_contingency(config: dict) -> str:
    """ "" where the proposal's request uses plan.contingency too, else what it uses: the
    proposal (results/proposal.py) prices its request with proposal.contingency where set."""
    own = (config.get("proposal") or {}).get("contingency")
    if own is None or own == config["plan"]["contingency"]:
        return ""
    return f"the proposal's request uses proposal.contingency = {own:g}"


def up(hours: float) -> str:
    """Node- or GPU-hours as plan.md prints them: rounded up to 0.01, never below what they
    total (printed to the nearest, the request 0.46391 was 0.46)."""
    return f"{math.ceil(round(hours * 100, 9)) / 100:.2f}"


def printed_sum(training: Total, prof: Total, kind: str, factor: float = 1.0) -> str:
    """Training's and profiling's node- or GPU-hours (`kind`) x factor, each printed (up), added
    as printed: their sum as a reader adds the two lines (0.05 + 0.33 was printed 0.39)."""
    parts = (getattr(t, f"{kind}_hours") * factor for t in (training, prof))
    return f"{sum(Decimal(up(x)) for x in parts):.2f}"


def _same_path(path: str | Path, default: str) -> bool:
    """Whether `path` names the study's own `default` (relative to the working directory, as
    resources.TrainingPlan reads it), by whatever path."""
    return os.path.realpath(path) == os.path.realpath(default)


def _no_interval(estimates: list[Estimate]) -> list[str]:
    """Why the model-priced runs marked n/a in the interval column have none (plan.csv
    interval_note): their time limit rests on the point estimate alone."""
    why: dict[str, list[str]] = {}
    for e in estimates:
        if e.interval_note:
            why.setdefault(e.interval_note, []).append(e.run)
    if not why:
        return []
    return [
        "Interval n/a: the scaling model prices these runs without a 95% interval, so their "
        "Slurm time limit rests on the runtime alone (results/plan.csv, interval_note):",
        "",
        *[f"- {', '.join(runs)}: {note}." for note, runs in why.items()],
        "",
    ]


def _basis(e: Estimate) -> str:
    """The Runs table's basis: the throughput's, `+startup` where startup_s is measured."""
    return e.throughput_basis + ("" if e.startup_basis == "default" else " +startup")


def _interval(e: Estimate) -> str:
    if e.runtime_lo_s is None:
        return "n/a" if e.throughput_basis.startswith("model") else ""
    return f"{hms(e.runtime_lo_s)}-{hms(e.runtime_hi_s)}"


def model_section(rows: list[model.HoldoutRow]) -> list[str]:
    """How well the scaling model predicts a world size it was not fitted to (held out)."""
    lines = [
        "## How good the scaling model is",
        "",
        "For each family with >= 3 world sizes, the model (study/model.py) is fitted without any "
        "run at the family's largest world size (of any family) and predicts it: error = "
        "predicted / measured step time - 1.",
        "",
    ]
    if not rows:
        return [*lines, "No measured DDP runs to validate the model on.", ""]
    lines += [
        "| family | held out | measured step | predicted | 95% interval | error | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.point is None:
            lines.append(f"| {r.family} | | | | | | {r.note} |")
            continue
        p, pred = r.point, r.prediction
        step = pred.step_s if pred else None
        interval = (
            f"{pred.lo_s * 1e3:.1f}-{pred.hi_s * 1e3:.1f} ms" if pred and pred.lo_s is not None
            else "n/a"
        )  # fmt: skip
        lines.append(
            f"| {r.family} | {p.world_size} ranks, local batch {p.local_batch}, {p.precision} | "
            f"{p.step_s * 1e3:.1f} ms | {'n/a' if step is None else f'{step * 1e3:.1f} ms'} | "
            f"{interval} | {'n/a' if r.rel_error is None else f'{r.rel_error:+.0%}'} | "
            f"{r.note or (pred.basis if pred and step is None else '')} |"
        )
    return [*lines, ""]


def _other_gpus(config: dict, measured: list[dict]) -> str:
    """The sentence on the measured runs left out for their GPU (estimate.same_gpu), or ""."""
    other = [m for m in measured if not same_gpu(config, m)]
    if not other:
        return ""
    cells = (m.get("device_names") or m.get("device_name") or "" for m in other)
    names = sorted({name for cell in cells for name in str(cell).split(";") if name})
    return (
        f" {_count(len(other), 'measured runs')} ran on other GPUs than hardware.gpu_type "
        f"`{config['hardware']['gpu_type']}` ({', '.join(names)}): "
        + (
            "it calibrates nothing (nor checks the estimates or validates the model)."
            if len(other) == 1
            else "they calibrate nothing (nor check the estimates or validate the model)."
        )
    )


def read_measured(config: dict, runs_csv: str | Path, benchmarks_dir: str | Path) -> list[dict]:
    """The measured runs the plan calibrates from: none under plan.calibrate false, which reads
    no measured run (a runs.csv row load_measured refuses stopped the plan and the workflow)."""
    return load_measured(runs_csv, benchmarks_dir) if config["plan"]["calibrate"] else []


def write_plan(
    config: dict,
    out_md: str | Path = PLAN_MD,
    out_csv: str | Path = PLAN_CSV,
    runs_csv: str | Path = RUNS_CSV,
    benchmarks_dir: str | Path = BENCHMARKS_DIR,
) -> list[Estimate]:
    """Estimate every run of the study and write the plan files atomically, both or neither: a
    path that cannot be written is refused before the work (PlanError), and a write that fails
    (a full disk) leaves both old, never a new plan.md beside an old plan.csv."""
    files.check_outputs([out_md, out_csv], PlanError)
    measured = read_measured(config, runs_csv, benchmarks_dir)
    estimates = estimate_runs(config, build_run_table(config), measured)
    check = calibration_check(config, measured) if config["plan"]["calibrate"] else []
    files.write_texts(
        {
            out_md: plan_markdown(
                config,
                estimates,
                check,
                model_holdout(config, measured),
                runs_csv,
                benchmarks_dir,
                measured,
            ),
            out_csv: plan_csv_text(estimates, config["plan"]["calibrate"]),
        }
    )
    return estimates


def model_holdout(config: dict, measured: list[dict]) -> list[model.HoldoutRow]:
    """The scaling model's held-out validation on the measured runs that calibrate the plan
    (estimate.calibrating; none without runs), of the study's own base (estimate.run_base: device,
    model, width, strategy, loader, compile, graphs, comm hook, ...), as the calibration keeps
    them apart: a --runs-csv with another width's runs too stopped the plan (the model fits
    one), another loader's were merged into the study's points as more repeats."""
    own = {run_base(r) for r in build_run_table(config)}
    rows = [r for r in calibrating(config, measured) if run_base(r) in own]
    return on_measured(model.holdout, rows) if rows else []


# ---------------------------------------------------------------------------------------------
# CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from scalestudy.study.config import add_config_arguments

    add_config_arguments(parser)
    add_measured_arguments(parser)
    parser.add_argument("--out-md", default=PLAN_MD, help="%(default)s")
    parser.add_argument("--out-csv", default=PLAN_CSV, help="%(default)s")


def run(args: argparse.Namespace) -> int:
    from scalestudy.study.config import config_inputs, load_layers

    log.setup()
    try:
        config = load_layers(args.config, overrides=args.set)
        runs_csv, benchmarks = measured_paths(args.runs_csv, args.benchmarks)
        # the two outputs one file (the CSV written over the Markdown), or an output one of the
        # inputs (the measured runs the plan is calibrated on, a config file): before any work
        outputs = {"--out-md": args.out_md, "--out-csv": args.out_csv}
        # the runs.csv read, given or the study's own (replaced, every snakemake call stopped)
        inputs = {"--runs-csv" if args.runs_csv else "runs.csv the plan reads": runs_csv}
        files.check_distinct(outputs, inputs | config_inputs(args.config), PlanError)
        estimates = write_plan(config, args.out_md, args.out_csv, runs_csv, benchmarks)
    except (StudyConfigError, PlanError) as e:
        logger.error(f"scalestudy plan: {e}")
        return 2
    training, prof = totals(estimates)["total"], profiling_total(config, estimates)
    c = config["plan"]["contingency"]
    gpu = config["hardware"]["device"] == "cuda"  # a CPU study: no GPU-hours (n/a), not 0

    def hours(kind: str, factor: float = 1.0) -> str:  # plan.md's figures
        return printed_sum(training, prof, kind, factor)

    logger.info(
        f"{_count(len(estimates), 'runs')}"
        + (f" and {_count(prof.jobs, 'profiling jobs')}" if prof.jobs else "")
        + f": {hours('node')} node-hours"
        + (f", {hours('gpu')} GPU-hours" if gpu else "")
        + f"; with contingency {c:g}: {hours('node', 1 + c)} node-hours"
        + (f", {hours('gpu', 1 + c)} GPU-hours" if gpu else " (a CPU study: no GPU-hours)")
        + f" -> {args.out_md}, {args.out_csv}"
    )
    return 0
