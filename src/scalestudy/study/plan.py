"""Node-hours and GPU-hours of a study before it runs, calibrated from the runs that finished.

The estimate of one training run (seconds), with the `plan:` section of the study config:

    T = epochs * (N_train / X + N_test / (X * eval_speedup)) + startup_s
    X = x_rank * W                         images/s of the whole run (all W ranks)
    x_rank = throughput_img_s_per_gpu[precision] * eta(W)    (default)
    eta(W) = 1 (W = 1), efficiency_intra_node (one node), efficiency_inter_node (several nodes)

    node-hours = nodes * T / 3600          GPU-hours = GPUs * T / 3600 (0 on cpu)
    Slurm time limit = max(hardware.runtime_min, ceil(T * safety_factor / 60)) minutes

N_train / N_test: images per epoch (train.limit_train / limit_test when set, else the dataset's
size); evaluation runs on the whole test set after every epoch, spread over the ranks.

Calibration (plan.calibrate, when results/csv/runs.csv exists): measured runs of the same device,
model, width, strategy, loader and compile setting replace the default x_rank, taking the first
level that has measurements (mean of the measured throughput_img_s_per_rank):

    1. run        the same configuration (run id without its repeat), e.g. repeats 1, 2 of r0
    2. batch      the same precision, world size and local_batch
    3. world size the same precision and world size
    4. precision  the same precision at other world sizes, as x_rank / eta(W_measured) * eta(W)

startup_s is calibrated too when Snakemake's job wall times exist (benchmarks/train/<run>.tsv):
the median of wall_s - epochs * (N_train / X + N_test / (X * eval_speedup)) over measured runs of
the same world size (else over all measured runs), with X the run's measured throughput_img_s.
It absorbs interpreter and torch start-up, data loading, process-group set-up, the slower
warm-up steps, the communication probe and writing outputs.

Dry-runs: the training rule's Slurm `runtime` comes from study.resources.TrainingPlan, which
calls `register(...)` when Snakemake first evaluates it (not at parse time); the Snakemake logger
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
import math
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path

from scalestudy import files, log, vocab
from scalestudy.errors import PlanError, StudyConfigError
from scalestudy.study.runs import RUN_COLUMNS, build_run_table, same

logger = log.get(__name__)

RUNS_CSV = "results/csv/runs.csv"
BENCHMARKS_DIR = "benchmarks/train"
PLAN_MD = "reports/plan.md"
PLAN_CSV = "results/plan.csv"
# measured runs must match the estimated run in these columns to calibrate it at all
BASE_KEY = ("device", "model", "width", "strategy", "loader", "compile", "comm_hook", "accum_steps")
# ... and in the image size: MNIST's 28x28x1 images cost less than CIFAR-10's (synthetic has
# CIFAR-10's shape, so offline runs calibrate a CIFAR-10 study)
LEVELS = ("run", "batch", "world size", "precision")
# numeric columns of results/csv/runs.csv the calibration reads
MEASURED_NUMBERS = (
    "world_size",
    "nodes",
    "local_batch",
    "epochs",
    "limit_train",
    "limit_test",
    "throughput_img_s",
    "throughput_img_s_per_rank",
)

PLAN_COLUMNS = (
    "run",
    "families",
    "nodes",
    "world_size",
    "gpus",
    "precision",
    "local_batch",
    "epochs",
    "train_images",
    "test_images",
    "throughput_img_s",
    "throughput_basis",
    "startup_s",
    "startup_basis",
    "runtime_s",
    "slurm_runtime_min",
    "node_hours",
    "gpu_hours",
    "done",
)


@dataclasses.dataclass(frozen=True, slots=True)
class Estimate:
    """What one job costs. rule: the Snakemake rule; basis: where the throughput came from."""

    rule: str
    run: str
    families: str
    nodes: int
    gpus: int
    runtime_s: float
    throughput_basis: str = "default"
    startup_basis: str = "default"
    world_size: int = 0
    precision: str = ""
    local_batch: int = 0
    epochs: int = 0
    train_images: int = 0
    test_images: int = 0
    throughput_img_s: float = 0.0
    startup_s: float = 0.0
    slurm_runtime_min: int = 0
    done: bool = False

    @property
    def node_hours(self) -> float:
        return self.nodes * self.runtime_s / 3600

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.runtime_s / 3600

    @property
    def calibrated(self) -> bool:
        return self.throughput_basis != "default" or self.startup_basis != "default"


# ---------------------------------------------------------------------------------------------
# the model


def dataset_sizes(config: dict, row: dict) -> tuple[int, int]:
    """(training, test) images per epoch of a run."""
    dataset = row["dataset"]
    if dataset == "synthetic":
        n_train, n_test = config["synthetic"]["num_train"], config["synthetic"]["num_test"]
    else:
        n_train, n_test = vocab.DATASETS[dataset].train, vocab.DATASETS[dataset].test
    limit_train, limit_test = int(row["limit_train"]), int(row["limit_test"])
    if 0 < limit_train < n_train:
        n_train = limit_train
    if 0 < limit_test < n_test:
        n_test = limit_test
    return n_train, n_test


def efficiency(plan: dict, world_size: int, nodes: int) -> float:
    """Expected scaling efficiency eta(W): per-rank throughput at W relative to one rank."""
    if world_size <= 1:
        return 1.0
    return plan["efficiency_intra_node"] if nodes <= 1 else plan["efficiency_inter_node"]


def compute_seconds(epochs: int, n_train: int, n_test: int, throughput: float, plan: dict):
    """Training plus per-epoch evaluation time at `throughput` images/s (all ranks)."""
    return epochs * (n_train / throughput + n_test / (throughput * plan["eval_speedup"]))


def slurm_runtime_min(runtime_s: float, config: dict) -> int:
    """Slurm time limit (minutes) of a job estimated at runtime_s: safety factor, then floor."""
    limit = math.ceil(runtime_s * config["plan"]["safety_factor"] / 60)
    return max(config["hardware"]["runtime_min"], limit)


# ---------------------------------------------------------------------------------------------
# measured runs


def _num(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _text(value) -> str:
    return str(value).strip().lower() if value is not None else ""


def _base(row: dict) -> tuple:
    shape = (
        vocab.DATASETS[row["dataset"]].shape if row.get("dataset") in vocab.DATASETS else "32x32x3"
    )
    return (*(_text(row.get(k)) for k in BASE_KEY), shape)


def _level_key(level: str, row: dict) -> tuple:
    w, lb, p = int(float(row["world_size"])), int(float(row["local_batch"])), row["precision"]
    if level == "run":
        return (row["run"].rsplit("_r", 1)[0],)
    if level == "batch":
        return (p, w, lb)
    if level == "world size":
        return (p, w)
    return (p,)


def read_wall_seconds(path: Path) -> float | None:
    """Snakemake's benchmark file of a job: the `s` column of its first row (None if absent)."""
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
    except FileNotFoundError:
        return None
    return _num(rows[0].get("s")) if rows else None


def load_measured(
    runs_csv: str | Path = RUNS_CSV, benchmarks_dir: str | Path = BENCHMARKS_DIR
) -> list[dict]:
    """Rows of results/csv/runs.csv (none if it does not exist) with `wall_s` added from
    benchmarks/train/<run>.tsv (None when there is no benchmark file)."""
    path = Path(runs_csv)
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    fix = "delete it: the collect rule of `snakemake` writes it again from results/runs"
    needed = {"run", "precision", "dataset", *BASE_KEY, *MEASURED_NUMBERS}
    if rows and not needed <= set(rows[0]):
        raise PlanError(
            f"{path} lacks the columns {sorted(needed - set(rows[0]))}: it is not written by "
            f"this version of `scalestudy collect`; {fix}"
        )
    measured = []
    for row in rows:
        for column in MEASURED_NUMBERS:
            if _num(row[column]) is None:
                raise PlanError(
                    f"{path}, run {row['run']!r}: {column} is {row[column]!r}, not a number; {fix}"
                )
        if row["dataset"] not in vocab.DATASETS:
            raise PlanError(
                f"{path}, run {row['run']!r}: unknown dataset {row['dataset']!r}; {fix}"
            )
        if float(row["throughput_img_s_per_rank"]) <= 0:
            continue  # a run without a steady-state window calibrates nothing
        row = dict(row, wall_s=read_wall_seconds(Path(benchmarks_dir) / f"{row['run']}.tsv"))
        measured.append(row)
    return measured


def _startup_overhead(config: dict, row: dict) -> float | None:
    """wall_s minus the modelled compute time at the run's own measured throughput."""
    if row.get("wall_s") is None:
        return None
    n_train, n_test = dataset_sizes(config, row)
    throughput = float(row["throughput_img_s"])
    epochs = int(float(row["epochs"]))
    return row["wall_s"] - compute_seconds(epochs, n_train, n_test, throughput, config["plan"])


@dataclasses.dataclass
class Calibration:
    """Measured per-rank throughput and start-up per level, ready to look runs up in."""

    config: dict
    measured: list[dict]

    def __post_init__(self) -> None:
        plan = self.config["plan"]
        self._levels: dict[tuple, list[float]] = {}
        self._startup: dict[tuple, list[float]] = {}
        for row in self.measured if plan["calibrate"] else []:
            base = _base(row)
            w, nodes = int(float(row["world_size"])), int(float(row["nodes"]))
            per_rank = float(row["throughput_img_s_per_rank"])
            for level in LEVELS:
                value = per_rank / efficiency(plan, w, nodes) if level == "precision" else per_rank
                self._levels.setdefault((base, level, _level_key(level, row)), []).append(value)
            overhead = _startup_overhead(self.config, row)
            if overhead is not None:
                self._startup.setdefault((base, w), []).append(overhead)
                self._startup.setdefault((base, None), []).append(overhead)

    def throughput_per_rank(self, row: dict) -> tuple[float, str]:
        plan = self.config["plan"]
        eta = efficiency(plan, row["world_size"], row["nodes"])
        for level in LEVELS:
            values = self._levels.get((_base(row), level, _level_key(level, row)))
            if values:
                mean = statistics.fmean(values)
                return (mean * eta if level == "precision" else mean), level
        return plan["throughput_img_s_per_gpu"][row["precision"]] * eta, "default"

    def startup(self, row: dict) -> tuple[float, str]:
        for key, basis in (
            ((_base(row), row["world_size"]), "world size"),
            ((_base(row), None), "all"),
        ):
            values = self._startup.get(key)
            if values:
                return max(0.0, statistics.median(values)), basis
        return float(self.config["plan"]["startup_s"]), "default"


def estimate_run(config: dict, row: dict, calibration: Calibration, done: bool = False):
    """The Estimate of one run-table row."""
    per_rank, basis = calibration.throughput_per_rank(row)
    startup, startup_basis = calibration.startup(row)
    n_train, n_test = dataset_sizes(config, row)
    throughput = per_rank * row["world_size"]
    runtime = compute_seconds(row["epochs"], n_train, n_test, throughput, config["plan"]) + startup
    return Estimate(
        rule="train",
        run=row["run"],
        families=row["families"],
        nodes=row["nodes"],
        gpus=row["gpus"],
        runtime_s=runtime,
        throughput_basis=basis,
        startup_basis=startup_basis,
        world_size=row["world_size"],
        precision=row["precision"],
        local_batch=row["local_batch"],
        epochs=row["epochs"],
        train_images=n_train,
        test_images=n_test,
        throughput_img_s=throughput,
        startup_s=startup,
        slurm_runtime_min=slurm_runtime_min(runtime, config),
        done=done,
    )


def estimate_runs(config: dict, rows: Iterable[dict], measured: list[dict]) -> list[Estimate]:
    """Estimates of every run-table row, in table order; `done`: the run has a measurement."""
    calibration = Calibration(config, measured)
    finished = {m["run"]: m for m in measured}
    return [estimate_run(config, r, calibration, is_done(r, finished.get(r["run"]))) for r in rows]


def is_done(row: dict, measured: dict | None) -> bool:
    """The run has a measurement made with this configuration: the same run id is not enough
    (run ids leave out dataset, epochs, lr, ...; a changed config reruns it under the same id)."""
    if measured is None:
        return False
    columns = [c for c in RUN_COLUMNS if c not in ("run", "families") and c in measured]
    return all(same(measured[c], row[c]) for c in columns)


def calibration_check(config: dict, measured: list[dict]) -> list[dict]:
    """Each measured run with a wall time, estimated two ways against Snakemake's measured job
    wall time: calibrated on all measured runs (what the plan says a repeat of it costs), and
    leave-one-out, from the *other* measured runs only (how well the model predicts a run it
    has not seen). error = estimate / measured - 1."""
    rows = {r["run"]: r for r in build_run_table(config)}
    everything = Calibration(config, measured)
    out = []
    for m in measured:
        if m.get("wall_s") is None or m["run"] not in rows:
            continue
        est = estimate_run(config, rows[m["run"]], everything)
        others = Calibration(config, [o for o in measured if o["run"] != m["run"]])
        loo = estimate_run(config, rows[m["run"]], others)
        out.append(
            {
                "run": m["run"],
                "measured_s": m["wall_s"],
                "estimate_s": est.runtime_s,
                "error": est.runtime_s / m["wall_s"] - 1,
                "loo_estimate_s": loo.runtime_s,
                "loo_error": loo.runtime_s / m["wall_s"] - 1,
                "loo_basis": loo.throughput_basis,
            }
        )
    return out


# ---------------------------------------------------------------------------------------------
# totals and the dry-run table


@dataclasses.dataclass(frozen=True, slots=True)
class Total:
    jobs: int
    node_hours: float
    gpu_hours: float


def _sum(estimates: Iterable[Estimate]) -> Total:
    estimates = list(estimates)
    return Total(
        len(estimates),
        sum(e.node_hours for e in estimates),
        sum(e.gpu_hours for e in estimates),
    )


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
    if e.rule != "train":
        return e.throughput_basis
    if not e.calibrated:
        return "default"
    return f"* {e.throughput_basis}" + ("" if e.startup_basis == "default" else " +startup")


def format_table(estimates: list[Estimate], note: str = "") -> str:
    """The dry-run table: one row per job, then totals per rule, per family and overall."""
    t = totals(estimates)
    width = max([len(e.run) for e in estimates] + [3])
    rwidth = max([len(e.rule) for e in estimates] + [4])
    lines = [
        "",
        "Node-hour plan (scalestudy): jobs this run would start, estimated runtime per job",
        "(* = calibrated from measured runs in results/csv/runs.csv; formula: scalestudy/plan.py)",
        f"{'rule':<{rwidth}}  {'run':<{width}}  nodes  GPUs   runtime  node-hours  GPU-hours  "
        "basis",
    ]
    for e in estimates:
        lines.append(
            f"{e.rule:<{rwidth}}  {e.run:<{width}}  {e.nodes:5d}  {e.gpus:4d}  "
            f"{hms(e.runtime_s):>8}  {e.node_hours:10.3f}  {e.gpu_hours:9.3f}  {_mark(e)}"
        )
    lines.append("per rule:")
    for name, s in t["rule"].items():
        lines.append(
            f"  {name:<14} {s.jobs:4d} jobs  {s.node_hours:10.3f} node-hours  "
            f"{s.gpu_hours:10.3f} GPU-hours"
        )
    if t["family"]:
        lines.append("per family (a run shared by several families counts in each):")
        for name, s in t["family"].items():
            lines.append(
                f"  {name:<14} {s.jobs:4d} runs  {s.node_hours:10.3f} node-hours  "
                f"{s.gpu_hours:10.3f} GPU-hours"
            )
    s = t["total"]
    calibrated = sum(1 for e in estimates if e.rule == "train" and e.calibrated)
    trains = sum(1 for e in estimates if e.rule == "train")
    lines.append(
        f"total: {s.jobs} jobs, {s.node_hours:.3f} node-hours, {s.gpu_hours:.3f} GPU-hours "
        f"({calibrated} of {trains} training estimates calibrated)"
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
    this when Snakemake first asks for a training job's runtime). is_local(rule name) -> True
    for rules that run on the submitting host."""
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
    """The Estimate of one job a dry-run lists. Training jobs: the run's estimate. Rules that
    run on the submitting host (localrules, `all`): 0 node-hours. Any other rule: its Slurm
    request (runtime resource x nodes), marked `requested`; no rule makes this fail."""
    run = str(wildcards.get("run", "")) if wildcards else ""
    if reg is not None and rule == "train" and run in reg.estimates:
        return reg.estimates[run]
    label = run or ",".join(f"{k}={v}" for k, v in (wildcards or {}).items()) or "-"
    try:
        local = reg is not None and reg.is_local(rule)
    except Exception:  # a rule the registered workflow does not know
        local = False
    nodes = max(1, _int(resources.get("nodes"), 1))
    if local:
        return Estimate(rule, label, "", 0, 0, 0.0, throughput_basis="local")
    runtime_min = _num(resources.get("runtime")) or 0.0
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


def plan_csv_text(estimates: list[Estimate]) -> str:
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
            done=str(e.done).lower(),
        )
        writer.writerow([values[c] for c in PLAN_COLUMNS])
    return out.getvalue()


def plan_digest(estimates: list[Estimate]) -> str:
    """sha256 (16 hex digits) of plan_csv_text: changes whenever an estimate does."""
    return hashlib.sha256(plan_csv_text(estimates).encode("utf-8")).hexdigest()[:16]


def plan_markdown(config: dict, estimates: list[Estimate], check: list[dict]) -> str:
    """The allocation-proposal page: formula, parameters, per family with contingency."""
    plan, t = config["plan"], totals(estimates)
    c = plan["contingency"]
    remaining = _sum(e for e in estimates if not e.done)
    x = plan["throughput_img_s_per_gpu"]
    unit = "GPU" if config["hardware"]["device"] == "cuda" else "rank (CPU process)"
    lines = [
        f"# Node-hour plan: {config['study']}",
        "",
        f"{len(estimates)} training runs ({config['repeats']} repeats), device "
        f"{config['hardware']['device']}, {config['hardware']['gpus_per_node']} ranks per node. "
        "Written by `scalestudy plan` (src/scalestudy/study/plan.py); the same estimates set each "
        "training job's Slurm time limit and are printed by `snakemake --dry-run`.",
        "",
        "## Formula",
        "",
        "For a run of W ranks on `nodes` nodes, `epochs` epochs of N_train training images, with "
        "evaluation on N_test images after each epoch:",
        "",
        "    T = epochs * (N_train / X + N_test / (X * eval_speedup)) + startup_s",
        "    X = x_rank * W,   x_rank = throughput_img_s_per_gpu[precision] * eta(W)",
        "    node-hours = sum over runs of nodes * T / 3600,   GPU-hours = sum of GPUs * T / 3600",
        f"    request = node-hours * (1 + contingency),   contingency = {c:g}",
        "",
        "eta(W) = 1 for one rank, efficiency_intra_node within one node, efficiency_inter_node "
        "across nodes. Calibrated runs (basis other than `default`) take x_rank from measured "
        "runs (results/csv/runs.csv): the same configuration, else the same precision, world size "
        "and local batch, else the same precision and world size, else the same precision "
        "rescaled by eta; startup_s then comes from Snakemake's measured job wall times.",
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
        f"| contingency (request) | {c:g} |",
        "",
        "## Per family",
        "",
        "A run shared by several families counts in each family; the total counts it once.",
        "",
        "| family | runs | node-hours | GPU-hours | node-hours with contingency | "
        "GPU-hours with contingency |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in [*t["family"].items(), ("**total**", t["total"])]:
        lines.append(
            f"| {name} | {s.jobs} | {s.node_hours:.2f} | {s.gpu_hours:.2f} | "
            f"{s.node_hours * (1 + c):.2f} | {s.gpu_hours * (1 + c):.2f} |"
        )
    lines += [
        "",
        f"Not yet run: {remaining.jobs} runs, {remaining.node_hours:.2f} node-hours, "
        f"{remaining.gpu_hours:.2f} GPU-hours ({remaining.node_hours * (1 + c):.2f} / "
        f"{remaining.gpu_hours * (1 + c):.2f} with contingency).",
        f"Calibrated estimates: {sum(e.calibrated for e in estimates)} of {len(estimates)}.",
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
            "(benchmarks/train/<run>.tsv): estimated with the calibration from all finished runs "
            "(what a repeat of it is planned at), and leave-one-out, from the other finished "
            "runs only (basis: the calibration level used).",
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
            f"Largest error over {len(check)} runs: {worst:.0%} calibrated, {worst_loo:.0%} "
            f"leave-one-out. Sum over these runs: measured {measured_sum:.1f} s, calibrated "
            f"{estimate_sum:.1f} s ({estimate_sum / measured_sum - 1:+.0%}), leave-one-out "
            f"{loo_sum:.1f} s ({loo_sum / measured_sum - 1:+.0%}).",
            "",
        ]
    lines += [
        "## Runs",
        "",
        "| run | families | nodes | GPUs | runtime | node-hours | GPU-hours | basis | done |",
        "|---|---|---|---|---|---|---|---|---|",
        *[
            f"| {e.run} | {e.families} | {e.nodes} | {e.gpus} | {hms(e.runtime_s)} | "
            f"{e.node_hours:.3f} | {e.gpu_hours:.3f} | {_mark(e)} | {'yes' if e.done else ''} |"
            for e in estimates
        ],
        "",
    ]
    return "\n".join(lines)


def write_plan(
    config: dict,
    out_md: str | Path = PLAN_MD,
    out_csv: str | Path = PLAN_CSV,
    runs_csv: str | Path = RUNS_CSV,
    benchmarks_dir: str | Path = BENCHMARKS_DIR,
) -> list[Estimate]:
    """Estimate every run of the study and write the plan files atomically."""
    measured = load_measured(runs_csv, benchmarks_dir)
    estimates = estimate_runs(config, build_run_table(config), measured)
    check = calibration_check(config, measured) if config["plan"]["calibrate"] else []
    files.write_text(out_md, plan_markdown(config, estimates, check))
    files.write_text(out_csv, plan_csv_text(estimates))
    return estimates


# ---------------------------------------------------------------------------------------------
# CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from scalestudy.study.config import add_config_arguments

    add_config_arguments(parser)
    parser.add_argument("--runs-csv", default=RUNS_CSV, help="measured runs (%(default)s)")
    parser.add_argument(
        "--benchmarks", default=BENCHMARKS_DIR, help="Snakemake job benchmarks (%(default)s)"
    )
    parser.add_argument("--out-md", default=PLAN_MD, help="%(default)s")
    parser.add_argument("--out-csv", default=PLAN_CSV, help="%(default)s")


def run(args: argparse.Namespace) -> int:
    from scalestudy.study.config import load_and_validate

    log.setup()
    try:
        config = load_and_validate(args.config, overrides=args.set)
        estimates = write_plan(config, args.out_md, args.out_csv, args.runs_csv, args.benchmarks)
    except (StudyConfigError, PlanError) as e:
        logger.error(f"scalestudy plan: {e}")
        return 2
    s, c = totals(estimates)["total"], config["plan"]["contingency"]
    logger.info(
        f"{len(estimates)} runs: {s.node_hours:.2f} node-hours, {s.gpu_hours:.2f} GPU-hours; "
        f"with contingency {c:g}: {s.node_hours * (1 + c):.2f} node-hours, "
        f"{s.gpu_hours * (1 + c):.2f} GPU-hours -> {args.out_md}, {args.out_csv}"
    )
    return 0
