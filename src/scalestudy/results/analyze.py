"""`scalestudy analyze`: results/csv/runs.csv (+ profile_kernels.csv) -> the derived tables.

Every number the plots and the documents show is a cell of one of these CSVs (the documents only
format cells; tests/test_report.py checks that):

    scaling.csv    one row per family and configuration (mean / std / n over repeats of MEASURES,
                   model_tflops = model_flops_per_s / 1e12 for the documents, and the ratios below)
    verdicts.csv   each target of the study (config `report.targets`) with the measured value
    resources.csv  node-hours and GPU-hours spent per family (preempted training redone included,
                   where the runs measured it: resources()), projected at k x the largest scale,
                   and GPU energy in kWh per family and study (measured J/img: resources())
    system.csv     system, software and study facts (key, value); study repeats: the distinct
                   repeat indices of the runs, repeats_min / repeats_max: the fewest and most
                   measured repeats of a configuration (scaling.csv's n; a failed repeat is
                   none), what "repeats per configuration" may say; ("profiling", "kernel
                   table"): the --profile table the shares are from, or NOT_PROFILED
    waterfall.csv  the efficiency lost at each world size above a family's smallest, split into
                   exposed communication, data wait, imbalance between ranks and a residual
    profile_shares.csv  the share of kernel time per category of each profiled run (--profile);
                   no rows both without --profile and from a table without kernels: system.csv's
                   ("profiling", "kernel table") tells the two apart, for the documents to say

Definitions (X = throughput_img_s, the steady-state images/s of a run summed over ranks, see
train.py; a configuration's value is the mean over its repeats; N0 = the family's smallest
world size, 1 in a usual study):

    step time             T(N)   = global_batch / X(N)      s per optimizer step, steady state;
                                                            its std T s_X / X (first order)
    strong speedup        S(N)   = T(N0) / T(N)             (fixed global batch, so T ~ epoch time)
    strong efficiency     E_s(N) = N0 T(N0) / (N T(N))      = T(1) / (N T(N)) when N0 = 1
    Karp-Flatt fraction   e(N)   = (1/S - 1/p) / (1 - 1/p)  with p = N / N0 > 1
    weak efficiency       E_w(N) = T(N0) / T(N)             (fixed local batch)
    weak deviation        D(N)   = T(N) / T(N0) - 1
    precision speedup     P      = X(precision) / X(fp32)  at the same world size
    bucket sensitivity    B      = X(cell) / max X over the bucket_cap_mb x local_batch grid
    model FLOP rate       R      = X F                      FLOP/s (model_flops_per_s)
    model FLOPs util.     MFU    = X F / (P N)              (mfu)
    GPU energy per image  J      = energy of the GPUs / images trained   J/img, summed over GPUs

F = flops_per_img, the FLOPs of one training image, forward + backward, counted by
torch.utils.flop_counter on the run's network; P = peak_flops, the dense peak FLOP/s of ONE device
at the run's precision from the published table in hardware.py; N = mfu_gpus, the distinct
GPUs the run's ranks ran on (world_size, unless ranks shared a GPU over gloo). Both are each
run's own (train.py, measure.efficiency()), averaged over repeats here like the other measures.
A run without a published peak (a CPU, a GPU or precision not in the table) has mfu null and the
reason in mfu_unmeasured: a configuration where no repeat has an MFU keeps mfu_mean blank, never
0, and system.csv says why (the distinct mfu_unmeasured of the runs, and how many runs of an
older trainer recorded neither: mfu_unmeasured()). Every measure's mean and std are over all n
repeats of a configuration: one that some repeat lacks (GPU utilisation of a window too short to
sample, a probe that was off, an MFU a trainer before MFU never wrote) is blank, never a mean of
fewer.

J (energy_j_per_img_mean / _std) is each run's measured J/img (NVML's total-energy counter over
its steady-state window, train.py): over the window's training spans, or where those were too
short for the counter, over its wall span with the evaluations and checkpoints between its
epochs (estimate.measured_energy_per_img); energy_basis says which ("training", "evaluation
included"). A configuration's mean needs every repeat's J/img on one basis: one without a J/img
leaves it blank, and so do repeats on both bases (energy_basis "mixed: ..." counts them), whose
mean would average two different quantities. GPUs only: no CPU, network or cooling. J at N
against J at N0 on one basis is the energy cost of scaling out: at perfect scaling it stays the
same. Across bases it is not: a family's epochs shorten with N (strong and weak alike), which
can move its larger world sizes to the wall span (plot.energy_series draws each basis as its
own line).

The weak-scaling time is the step time, not the epoch time: an epoch is one pass over the fixed
dataset shared by all ranks, so a weak-scaling epoch shortens as ranks are added. The spread of
the efficiencies and of the precision speedup (precision_speedup_std: X_p / X_fp32) is propagated
from the repeats' standard deviations (relative errors added in quadrature).
std is the sample standard deviation (n - 1); with one repeat it is left blank, never 0, and so is
the spread of a ratio one of whose sides ran once.

The efficiency-loss waterfall (waterfall()): for each family and configuration at a world size
N > N0, against the family's N0 configuration with the same precision and the same global batch
(strong) or local batch (the other families), with G its global batch, X its mean throughput:

    T = G / X,  X_ideal = X(N0) N / N0,  T_ideal = G / X_ideal,  k = T_ideal / T(N0)
    total loss (img/s)   L = X_ideal - X = G (T - T_ideal) / (T T_ideal)
    extra time per step  dT = T - T_ideal = comm + data + imbalance + residual, seconds:
      comm      = c(N) T(N) - c(N0) T(N0) k         c = comm_exposed_frac (the probe's share)
      data      = d(N) - d(N0) k                    d = median over ranks of data_time_ms_mean
      imbalance = s(N) - s(N0) k                    s = max_r busy_r - median_r busy_r
      residual  = dT - comm - data - imbalance      (compute slowed by sharing the machine or
                                                     the network; shown, never hidden, may be < 0)
    each part in img/s = part G / (T T_ideal), so the parts sum to L exactly; as a fraction of
    X_ideal they sum to loss_frac = L / X_ideal = 1 - efficiency; check = sum of parts - L,
    which the residual makes 0 by definition: it shows the floating-point rounding only (not a
    test of the measurement; a reader re-deriving the parts from the CSV can compare with it).

k scales the baseline's own overheads to the ideal step: at perfect scaling every part of the
step shrinks (strong) or stays (weak) with it, so only overhead beyond that counts as loss.
busy_r is rank r's median time before its first collective that waits for the other ranks
(busy_time_ms_p50_by_rank, train.py); the median of an even count of ranks is the lower middle
one, so with two ranks s is the slowest minus the other. A rank's whole step time cannot show an
imbalance: the slowest rank paces them all. c is the probe's share of a forward+backward pass
applied to the whole step, an approximation where data or optimizer time is large. Values per
configuration are means over its repeats; a part whose input a run lacks (results of an older
trainer, the probe off) is blank, never 0, and lands in the residual, which the note says (the
probe off by name, train.comm_probe_steps 0, not as runs without the column). So
does imbalance under cuda_graphs_mode "step" (the whole step one CUDA graph, what cuda_graphs
auto chooses on a GPU where it fits): the busy phases are inside the graph's replay, which the
trainer cannot time phase by phase, so it writes busy_time_ms_p50_by_rank null (train.py); the
note names the graph, not the column.
So does comm under gradient accumulation: the probe's pass is one micro-batch, and of a step's k
passes only the last synchronises, so c T would count the exposed all-reduce about k times; and
comm of a multi-rank run under cuda_graphs_mode "step": its probe times eager passes, host-bound
where the replayed step is not, so c of such a pass times the replay's T is no part of that step
(STEP_GRAPH_COMM; comm_exposed_frac itself stays in runs.csv and the comm figure).
"""

from __future__ import annotations

import argparse
import html
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path

from scalestudy import files, hardware, log, vocab
from scalestudy.errors import AnalysisError
from scalestudy.nsight.schema import CATEGORIES, KERNEL_COLUMNS, cell_problem
from scalestudy.study import estimate, model, paths
from scalestudy.study.runs import RUN_COLUMNS, same

logger = log.get(__name__)

# per-run measurements averaged over repeats: column in runs.csv -> prefix in scaling.csv
MEASURES = (
    "throughput_img_s",
    "epoch_time_s",
    "step_time_s",
    "final_val_acc",
    "comm_exposed_frac",
    "gpu_util_mean",
    "train_time_s",
    "model_flops_per_s",
    "mfu",
)
TFLOPS = 1e12  # model_tflops_mean / _std: the FLOP rate in the unit the documents print
GROUP_KEYS = ("family", "world_size", "local_batch", "precision", "bucket_cap_mb")
SCALING_COLUMNS = (
    *GROUP_KEYS,
    "nodes",
    "global_batch",
    "n",
    *(f"{m}_{s}" for m in MEASURES for s in ("mean", "std")),
    "model_tflops_mean",
    "model_tflops_std",
    "energy_j_per_img_mean",
    "energy_j_per_img_std",
    "energy_basis",
    "speedup",
    "strong_efficiency",
    "strong_efficiency_std",
    "karp_flatt",
    "weak_efficiency",
    "weak_efficiency_std",
    "weak_deviation",
    "precision_speedup",
    "precision_speedup_std",
    "acc_diff_vs_fp32",
    "acc_within_tolerance",
    "bucket_rel_throughput",
    "runs",
)
# the profiling stage's schema (results/csv/profile_kernels.csv), defined in nsight/schema.py
PROFILE_COLUMNS, PROFILE_CATEGORIES = KERNEL_COLUMNS, CATEGORIES
DEFAULT_TARGETS = {
    "strong_efficiency": 0.70,
    "strong_efficiency_gpus": 8,
    "weak_deviation": 0.10,
    "optimisation_speedup": 0.20,
    "accuracy_tolerance": 0.01,
}
SCALE_FACTORS = (2, 4)


# --- reading -------------------------------------------------------------------------------------
def read_csv(
    path: str | Path, what: str = "", target: str = "", flag: str = "", own: str = ""
) -> list[dict]:
    """The rows of an input CSV; missing or damaged: one AnalysisError, whose fix is
    files.input_fix's (`target`, `flag`, `own`: the study's path of it and the option that
    gave it), one wording for both."""
    path = Path(path)
    if not path.exists():
        fix = files.input_fix(path, target, flag, own, missing=True)
        raise AnalysisError(f"missing {path}{what}: {fix}")
    return files.read_csv_rows(path, AnalysisError, files.input_fix(path, target, flag, own))


def csv_header(path: str | Path, rows: list[dict], fix: str) -> list[str]:
    """The columns of a CSV read_csv read as `rows`: the first row's, or, without rows, the
    header files.read_csv_table reads (read_csv read it whole: a small file, read again)."""
    return list(rows[0]) if rows else files.read_csv_table(path, AnalysisError, fix)[0]


# a cell of analyze's tables (read_table): the ratios and means it writes are finite (an inf,
# edited in, was drawn nowhere: matplotlib leaves the point out, and the report showed a blank)
TABLE_NUMBER = files.NUMBER.or_blank()
# counts of ranks, nodes, images and repeats: a 0 edited in was a ZeroDivisionError traceback in
# the throughput figure and the proposal (int() reads them)
TABLE_COUNT = files.count(1).or_blank()
# rates, times and sizes no configuration has at 0 or below: the means of RUNS_POSITIVE's
# measures, the step time, the waterfall's throughputs and step times. A 0 or -5 edited into
# throughput_img_s_mean was drawn on the log axis of the throughput figure as nothing (the
# family's ideal line, 0 x N, with it), exit 0
TABLE_POSITIVE = files.POSITIVE.or_blank()


def read_table(path: str | Path, table: str, flag: str, own: str = "") -> list[dict]:
    """One of the CSVs this module writes (`table`, a key of TABLE_COLUMNS), refused in one
    line when it lacks a column or a cell is not what the figures and documents read: a
    number or blank outside TABLE_TEXT's columns, digits in COUNT_COLUMNS, no blank in
    TABLE_FILLED's. A CSV of an older version, or edited by hand, ended in a KeyError,
    ValueError or TypeError traceback. `flag` gave the path (`own`: read_csv)."""
    target = f"results/csv/{table}.csv"
    rows = read_csv(path, "", target, flag, own)
    fix = files.input_fix(path, target, flag, own)
    spec = (TABLE_COLUMNS[table], TABLE_TEXT[table], TABLE_FILLED[table])
    check_table(path, rows, spec, fix, "scalestudy analyze")
    if table == "resources":
        check_kinds(path, rows, fix)
    return rows


def check_kinds(path: str | Path, rows: list[dict], fix: str) -> None:
    """resources.csv's cells that `resources` fills on every row of a kind, as RESOURCES_FILLED
    lists them: a blank one was printed as an empty cell, or as "nan" in a sentence of the
    documents."""
    for i, row in enumerate(rows, start=2):
        for column in RESOURCES_FILLED.get(row["kind"], ()):
            if files.number(row[column]) is None:
                raise AnalysisError(
                    f"{path}, line {i}: {column} is blank in a {row['kind']} row, and "
                    f"`scalestudy analyze` always fills it: not written by scalestudy; {fix}"
                )


def check_table(
    path: str | Path,
    rows: list[dict],
    spec: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]],
    fix: str,
    writer: str,
) -> None:
    """read_table's checks of a table read_csv read as `rows`, against `spec` (its columns, the
    ones of words, the ones never blank); `writer` the command that always fills those."""
    columns, text, filled = spec
    # the header of a table without rows too: an empty file, or another table's header, passed
    # for "no rows" (the documents then said "waterfall.csv has no rows", "no kernels")
    header = csv_header(path, rows, fix)
    if not header:  # 0 bytes: a truncated copy
        raise AnalysisError(f"{path} has no rows (not even a header); {fix}")
    missing = [c for c in columns if c not in header]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise AnalysisError(
            f"{path} has no column {', '.join(missing[:3])}{more}: it is older than this "
            f"version of scalestudy, or not written by it; {fix}"
        )
    numbers = [c for c in columns if c not in text]
    for i, row in enumerate(rows, start=2):  # line 1 is the header
        for column in numbers:
            rule = TABLE_COUNT if column in COUNT_COLUMNS else TABLE_NUMBER
            rule = TABLE_POSITIVE if column in POSITIVE_COLUMNS else rule
            check_cell(path, i, column, row[column], rule, fix)
            # a "nan", "None" or "null" reads as blank (files.number), and is made one: the
            # documents print a blank as "n/a" (not measured), and printed such a word as it was
            if files.number(row[column]) is None:
                row[column] = ""
        for column in filled:
            value = row[column]
            if files.number(value) is None if column in numbers else not str(value).strip():
                raise AnalysisError(
                    f"{path}, line {i}: {column} is blank, and `{writer}` always "
                    f"fills it: not written by scalestudy; {fix}"
                )


def check_cell(path: str | Path, line: int, column: str, value, rule: files.Cell, fix: str):
    """A cell of a CSV scalestudy writes against its `rule` (one that allows a blank): an
    AnalysisError naming the file, the line, the column and `fix` where it breaks it."""
    if not rule.holds(value):
        raise AnalysisError(
            f"{path}, line {line}: {column} = {value!r} is not {rule.what} or blank: not "
            f"written by scalestudy; {fix}"
        )


def run_measures(row: dict) -> dict:
    """The per-run measurements of MEASURES (step_time_s derived: global_batch / throughput)."""
    out = {m: files.number(row.get(m)) for m in MEASURES if m != "step_time_s"}
    x, gb = out["throughput_img_s"], files.number(row.get("global_batch"))
    if x is None or x <= 0:
        raise AnalysisError(
            f"run {row.get('run')}: throughput_img_s is {row.get('throughput_img_s')!r}"
        )
    out["step_time_s"] = gb / x
    return out


def step_time(global_batch: int, x_mean: float, x_std: float | None) -> tuple:
    """(T, its std) of a configuration: T = G / X with X its mean throughput over the repeats
    (the definition the documents state, so S(N) = X(N) / X(N0) of the printed throughputs, and
    the waterfall's loss is 1 - E_s), its std to first order T s_X / X; None with one repeat."""
    t = global_batch / x_mean
    return t, None if x_std is None else t * x_std / x_mean


# --- statistics ----------------------------------------------------------------------------------
def mean_std(values: list[float | None]) -> tuple[float | None, float | None, int]:
    """(mean, sample std or None when n < 2, n) over the repeats; (None, None, 0) when any
    repeat lacks the value: a mean of fewer would pass for all of them."""
    if not values or None in values:
        return None, None, 0
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else None
    return mean, std, len(values)


def ratio_std(a: float, sa: float | None, b: float, sb: float | None) -> float | None:
    """Spread of a/b from the spreads of a and b (relative errors in quadrature); None when
    either side has none (one repeat): its unknown spread is not 0."""
    if sa is None or sb is None:
        return None
    rel = math.hypot(sa / a, sb / b)
    return abs(a / b) * rel


def karp_flatt(speedup: float, p: float) -> float | None:
    """Experimentally determined serial fraction (Karp & Flatt 1990); undefined for p <= 1."""
    if p <= 1:
        return None
    return (1.0 / speedup - 1.0 / p) / (1.0 - 1.0 / p)


# --- the scaling table ---------------------------------------------------------------------------
def group_runs(runs: list[dict]) -> dict[tuple, list[dict]]:
    """(family, world_size, local_batch, precision, bucket_cap_mb) -> the runs (its repeats).

    A run shared by several families (`families` = "bucket;strong;weak") counts in each."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in runs:
        for family in filter(None, str(row["families"]).split(";")):
            key = (
                family,
                int(row["world_size"]),
                int(row["local_batch"]),
                row["precision"],
                float(row["bucket_cap_mb"]),
            )
            groups[key].append(row)
    return groups


def scaling_table(runs: list[dict], acc_tolerance: float = 0.01) -> list[dict]:
    """The rows of scaling.csv (see the module docstring for every formula)."""
    rows = []
    for key, members in sorted(group_runs(runs).items(), key=lambda kv: _order(kv[0])):
        row = dict(zip(GROUP_KEYS, key, strict=True))
        row["nodes"] = int(members[0]["nodes"])
        row["global_batch"] = int(members[0]["global_batch"])
        per_run = [run_measures(r) for r in members]
        for m in MEASURES:
            row[f"{m}_mean"], row[f"{m}_std"], _ = mean_std([p[m] for p in per_run])
        row["step_time_s_mean"], row["step_time_s_std"] = step_time(
            row["global_batch"], row["throughput_img_s_mean"], row["throughput_img_s_std"]
        )
        for stat in ("mean", "std"):
            flops = row[f"model_flops_per_s_{stat}"]
            row[f"model_tflops_{stat}"] = None if flops is None else flops / TFLOPS
        row["energy_j_per_img_mean"], row["energy_j_per_img_std"], row["energy_basis"] = (
            energy_per_img(members)
        )
        row["n"] = len(members)
        row["runs"] = ";".join(sorted(r["run"] for r in members))
        rows.append(row)
    _add_strong(rows)
    _add_weak(rows)
    _add_precision(rows, acc_tolerance)
    _add_bucket(rows)
    return [{c: r.get(c) for c in SCALING_COLUMNS} for r in rows]


def energy_per_img(members: list[dict]) -> tuple[float | None, float | None, str | None]:
    """(mean, std, basis) of the repeats' measured J/img (the module docstring): all None where
    a repeat has none; the mean and std None and the basis counted ("mixed: 1 training, 1
    evaluation included") where the repeats measured it over different spans."""
    measured = [estimate.measured_energy_per_img(r) for r in members]
    values, scopes = [v for v, _ in measured], [s for _, s in measured]
    if None in values:
        return None, None, None
    if len(set(scopes)) > 1:
        return None, None, _scope_counts(scopes)
    mean, std, _ = mean_std(values)
    return mean, std, scopes[0]


def _scope_counts(scopes: list[str]) -> str:
    """The runs of each J/img basis, e.g. "mixed: 3 training, 1 evaluation included"."""
    kinds = [k for k in ("training", estimate.WITH_EVALUATION) if k in scopes]
    return "mixed: " + ", ".join(f"{scopes.count(k)} {k}" for k in kinds)


def _order(key):
    family, world_size, local_batch, precision, bucket = key
    return (vocab.FAMILIES.index(family), world_size, local_batch, precision, bucket)


def _family(rows, family):
    return [r for r in rows if r["family"] == family]


def _std_vs_base(is_base: bool, t0, s0, t, s) -> float | None:
    """Spread of t0 / t. The baseline against itself is 1 by definition: no spread (0, or blank
    when n = 1), not its own spread counted twice."""
    if is_base:
        return 0.0 if s is not None else None
    return ratio_std(t0, s0, t, s)


def _add_strong(rows):
    fam = _family(rows, "strong")
    if not fam:
        return
    base = min(fam, key=lambda r: r["world_size"])
    n0, t0, s0 = base["world_size"], base["step_time_s_mean"], base["step_time_s_std"]
    for r in fam:
        n, t, s = r["world_size"], r["step_time_s_mean"], r["step_time_s_std"]
        r["speedup"] = t0 / t
        r["strong_efficiency"] = n0 * t0 / (n * t)
        std = _std_vs_base(r is base, t0, s0, t, s)
        r["strong_efficiency_std"] = None if std is None else std * n0 / n
        r["karp_flatt"] = karp_flatt(r["speedup"], n / n0)


def _add_weak(rows):
    fam = _family(rows, "weak")
    if not fam:
        return
    base = min(fam, key=lambda r: r["world_size"])
    t0, s0 = base["step_time_s_mean"], base["step_time_s_std"]
    for r in fam:
        t, s = r["step_time_s_mean"], r["step_time_s_std"]
        r["weak_efficiency"] = t0 / t
        r["weak_efficiency_std"] = _std_vs_base(r is base, t0, s0, t, s)
        r["weak_deviation"] = t / t0 - 1.0


def _add_precision(rows, tolerance):
    fam = _family(rows, "precision")
    for r in fam:
        base = [
            b
            for b in fam
            if b["precision"] == "fp32"
            and b["world_size"] == r["world_size"]
            and b["local_batch"] == r["local_batch"]
        ]
        if not base:  # no fp32 baseline at this world size: no speedup claimed
            continue
        b = base[0]
        x, x0 = r["throughput_img_s_mean"], b["throughput_img_s_mean"]
        r["precision_speedup"] = x / x0
        r["precision_speedup_std"] = _std_vs_base(
            r is b, x, r["throughput_img_s_std"], x0, b["throughput_img_s_std"]
        )
        if r["final_val_acc_mean"] is not None and b["final_val_acc_mean"] is not None:
            diff = r["final_val_acc_mean"] - b["final_val_acc_mean"]
            r["acc_diff_vs_fp32"] = diff
            # compared at 1e-9: accuracies are multiples of 1/limit_test, so a change of exactly
            # the tolerance is common, and 0.926 - 0.916 is 0.010000000000000009 in binary
            r["acc_within_tolerance"] = round(abs(diff), 9) <= tolerance


def _add_bucket(rows):
    fam = _family(rows, "bucket")
    if not fam:
        return
    best = max(r["throughput_img_s_mean"] for r in fam)
    for r in fam:
        r["bucket_rel_throughput"] = r["throughput_img_s_mean"] / best


# --- the efficiency-loss waterfall --------------------------------------------------------------
WATERFALL_PARTS = ("comm", "data", "imbalance", "residual")
WATERFALL_COLUMNS = (
    *GROUP_KEYS,
    "nodes",
    "global_batch",
    "baseline_world_size",
    "n",
    "x_ideal",
    "x_measured",
    "step_time_s",
    "step_time_ideal_s",
    "loss_img_s",
    "loss_frac",
    *(f"{p}_img_s" for p in WATERFALL_PARTS),
    *(f"{p}_frac" for p in WATERFALL_PARTS),
    "check",
    "note",
    "runs",
)
# the per-run inputs of a part (runs.csv column): a part is blank when a run lacks its input
PART_INPUTS = {
    "comm": "comm_exposed_frac",
    "data": "data_time_ms_mean_by_rank",
    "imbalance": "busy_time_ms_p50_by_rank",
}
# why a run under cuda_graphs_mode "step" (cuda_graphs auto on a GPU) has no busy times: the
# trainer writes them null (trainer/train.py), as it cannot time the phases of one graph replay
STEP_GRAPH_BUSY = "whole-step CUDA graph: the busy phases are inside the replay"
# why a multi-rank run under cuda_graphs_mode "step" has no comm part in the waterfall: its
# probe times eager (compiled, graph-free) passes, host-bound where the replay is not (2.6x the
# replay's time at local batch 64 on an H100: trainer/compiling.py), so its share of such a
# pass, multiplied by the replay's step time, measures no part of the step that was timed
STEP_GRAPH_COMM = (
    "whole-step CUDA graph: the communication probe times eager passes, not the replay"
)
# why a run with train.comm_probe_steps 0 has no comm_exposed_frac: the trainer writes it null,
# the 1-rank run's too (trainer/loop.py); "runs without" it read as an older trainer's results
PROBE_OFF = "the communication probe was off: train.comm_probe_steps 0"


def _per_rank(value) -> list[float] | None:
    """A per-rank list of runs.csv (collect joins it with ';') -> numbers; None when absent, or
    when any rank did not measure it: a median or maximum of fewer ranks would be a guess about
    the missing ones (as mean_std: never a summary of fewer)."""
    values = [files.number(v) for v in str(value or "").split(";")]
    return values if None not in values else None


def step_overheads(row: dict) -> dict:
    """One run's seconds per step of exposed communication share c, data wait d (the median
    rank's) and busy spread s (the slowest rank minus the median one); None when not recorded."""
    # the mean step's data wait, not the median's: the device loader does several steps' data
    # work in one step (measure.rank_times)
    data = _per_rank(row.get("data_time_ms_mean_by_rank"))
    busy = _per_rank(row.get("busy_time_ms_p50_by_rank"))
    return {
        # the probe's share is of one synchronised micro-batch pass (trainer/train.py): of a
        # step of k accumulated passes, only the last synchronises, so c x T would count it k x;
        # nor of a replayed whole-step graph (STEP_GRAPH_COMM)
        "comm": None
        if _accumulates(row) or _graph_probe(row)
        else files.number(row.get("comm_exposed_frac")),
        # the lower middle one, as for s: a slow rank's extra data wait is in its busy time,
        # so in s; the plain median of two ranks counted half of it again here
        "data": statistics.median_low(data) / 1e3 if data else None,  # ms -> s
        "imbalance": (max(busy) - statistics.median_low(busy)) / 1e3 if busy else None,
    }


def _graph_probe(row: dict) -> bool:
    """Whether a run's communication probe timed other passes than its steps (STEP_GRAPH_COMM):
    a multi-rank run whose steps were one replayed CUDA graph (one rank's probe is 0.0)."""
    return row.get("cuda_graphs_mode") == "step" and (files.number(row.get("world_size")) or 1) > 1


def _accumulates(row: dict) -> bool:
    """Whether a run accumulated gradients over several micro-batches per optimizer step."""
    return (files.number(row.get("accum_steps")) or 1) > 1  # blank, None, nan: not recorded


def _waterfall_configs(runs: list[dict]) -> dict[tuple, dict]:
    """Configuration key (GROUP_KEYS) -> its throughput and overheads, means over repeats."""
    configs = {}
    for key, members in group_runs(runs).items():
        per_run = [run_measures(r) | step_overheads(r) for r in members]
        configs[key] = {
            "x": statistics.fmean(p["throughput_img_s"] for p in per_run),
            "global_batch": int(members[0]["global_batch"]),
            "nodes": int(members[0]["nodes"]),
            "n": len(members),
            "runs": ";".join(sorted(r["run"] for r in members)),
            "accumulates": any(_accumulates(r) for r in members),
            # why a repeat has no busy spread: its trainer's whole-step CUDA graph or no column
            "busy_gaps": {
                STEP_GRAPH_BUSY if r.get("cuda_graphs_mode") == "step" else "absent"
                for r, p in zip(members, per_run, strict=True)
                if p["imbalance"] is None
            },
            # why a repeat has no comm share (accumulation aside: "accumulates" says that one)
            "comm_gaps": {
                STEP_GRAPH_COMM
                if _graph_probe(r)
                else PROBE_OFF
                if files.number(r.get("comm_probe_steps")) == 0
                else "absent"
                for r, p in zip(members, per_run, strict=True)
                if p["comm"] is None and not _accumulates(r)
            },
            **{part: mean_std([p[part] for p in per_run])[0] for part in PART_INPUTS},
        }
    return configs


def _waterfall_baseline(key: tuple, configs: dict[tuple, dict]) -> tuple | None:
    """The family's configuration at its smallest world size N0 that this one is compared with:
    the same precision and global batch (strong) or local batch (the others), the same
    bucket_cap_mb when one ran; None when there is none, or when this one is at N0."""
    family, _, local_batch, precision, bucket = key
    n0 = min(k[1] for k in configs if k[0] == family)

    def same_batch(k: tuple) -> bool:
        if family == "strong":  # strong scaling keeps the global batch
            return configs[k]["global_batch"] == configs[key]["global_batch"]
        return k[2] == local_batch

    candidates = [
        k
        for k in sorted(configs, key=_order)
        if k[:2] == (family, n0) and k[3] == precision and same_batch(k)
    ]
    if key[1] == n0 or not candidates:
        return None
    return next((k for k in candidates if k[4] == bucket), candidates[0])


def waterfall_row(key: tuple, c: dict, base_key: tuple, b: dict) -> dict:
    """One row of waterfall.csv: configuration c against its baseline b (module docstring)."""
    n, n0 = key[1], base_key[1]
    g, x = c["global_batch"], c["x"]
    x_ideal = b["x"] * n / n0
    t, t_ideal, t0 = g / x, g / x_ideal, b["global_batch"] / b["x"]
    k = t_ideal / t0
    comm_n = None if c["comm"] is None else c["comm"] * t  # the share -> seconds per step
    comm_n0 = None if b["comm"] is None else b["comm"] * t0
    seconds = {
        "comm": _difference(comm_n, comm_n0, k),
        "data": _difference(c["data"], b["data"], k),
        "imbalance": _difference(c["imbalance"], b["imbalance"], k),
    }
    seconds["residual"] = (t - t_ideal) - sum(v for v in seconds.values() if v is not None)
    per_second = g / (t * t_ideal)  # img/s lost per second of extra step time
    row = dict(zip(GROUP_KEYS, key, strict=True)) | {
        "nodes": c["nodes"],
        "global_batch": g,
        "baseline_world_size": n0,
        "n": c["n"],
        "x_ideal": x_ideal,
        "x_measured": x,
        "step_time_s": t,
        "step_time_ideal_s": t_ideal,
        "loss_img_s": x_ideal - x,
        "loss_frac": (x_ideal - x) / x_ideal,
        "runs": c["runs"],
    }
    for part, value in seconds.items():
        img_s = None if value is None else value * per_second
        row[f"{part}_img_s"] = img_s
        row[f"{part}_frac"] = None if img_s is None else img_s / x_ideal
    parts = [row[f"{p}_img_s"] for p in WATERFALL_PARTS if row[f"{p}_img_s"] is not None]
    row["check"] = sum(parts) - row["loss_img_s"]
    missing = [p for p, v in seconds.items() if v is None]
    if missing:
        accumulated = "comm" in missing and (c["accumulates"] or b["accumulates"])
        busy_gaps = c["busy_gaps"] | b["busy_gaps"]  # empty unless imbalance is missing
        comm_gaps = c["comm_gaps"] | b["comm_gaps"]  # empty unless comm is missing
        without = [
            PART_INPUTS[p]
            for p in missing
            if not (p == "comm" and (accumulated or "absent" not in comm_gaps))
            and not (p == "imbalance" and "absent" not in busy_gaps)
        ]
        why = [f"runs without {', '.join(without)}"] * bool(without) + [
            "gradient accumulation: comm_exposed_frac is of one micro-batch pass, not a step"
        ] * accumulated
        why += [PROBE_OFF] * (PROBE_OFF in comm_gaps and not accumulated)
        why += [STEP_GRAPH_COMM] * (STEP_GRAPH_COMM in comm_gaps and not accumulated)
        why += [STEP_GRAPH_BUSY] * (STEP_GRAPH_BUSY in busy_gaps)
        row["note"] = (
            f"{', '.join(missing)} not measured ({'; '.join(why)}): included in the residual"
        )
    return row


def _difference(at_n: float | None, at_n0: float | None, k: float) -> float | None:
    """A part's extra seconds per step: its value at N minus the baseline's scaled by k."""
    if at_n is None or at_n0 is None:
        return None
    return at_n - at_n0 * k


def waterfall(runs: list[dict]) -> list[dict]:
    """The rows of waterfall.csv (module docstring): every configuration above its family's
    smallest world size that has a baseline there."""
    configs = _waterfall_configs(runs)
    rows = []
    for key in sorted(configs, key=_order):
        base = _waterfall_baseline(key, configs)
        if base is not None:
            rows.append(waterfall_row(key, configs[key], base, configs[base]))
    return [{c: r.get(c) for c in WATERFALL_COLUMNS} for r in rows]


# --- verdicts ------------------------------------------------------------------------------------
VERDICT_COLUMNS = (
    "target",
    "description",
    "threshold",
    "world_size",
    "measured",
    "verdict",
    "note",
)


def verdicts(scaling: list[dict], targets: dict, unit: str = "GPUs") -> list[dict]:
    """One row per target: pass / fail / not measured (with what was measured instead).

    A value is judged as its cell writes it (`_as_written`): 1.2 / 1.0 - 1 is 0.19999999999999996
    in binary, written and printed as 0.2, and failed a threshold of 0.2. unit names what the
    world size counts in the descriptions: GPUs, or CPU ranks on a CPU study.
    """
    out = []
    strong = _family(scaling, "strong")
    want = int(targets["strong_efficiency_gpus"])
    at = [r for r in strong if r["world_size"] == want]
    # E_s is against the family's smallest world size N0: say which when it is not one rank
    n0 = min((r["world_size"] for r in strong), default=1)
    against = f" against {n0} {unit}" if n0 != 1 else ""
    row = {
        "target": "strong_efficiency",
        "description": f"strong-scaling efficiency E_s at {want} {unit}{against}",
        "threshold": targets["strong_efficiency"],
        "world_size": want,
    }
    if strong and want <= n0:
        # E_s(N0) = 1 by definition: judging it passed a family that measured no scaling
        row["verdict"] = "not measured"
        row["note"] = (
            f"E_s is measured above the strong family's smallest world size, {n0} {unit} "
            f"(E_s = 1 there by definition); the target's {want} {unit} is not above it"
        )
    elif at:
        row["measured"] = at[0]["strong_efficiency"]
        row["verdict"] = "pass" if _as_written(row["measured"]) >= row["threshold"] else "fail"
        if _as_written(row["measured"]) > 1 + SUPERLINEAR_MARGIN:
            row["note"] = _superlinear("E_s above 1", unit)
    elif strong:
        largest = max(strong, key=lambda r: r["world_size"])
        row["verdict"] = "not measured"
        row["note"] = (
            f"the strong family has no run at {want} {unit}; its largest world size is "
            f"{largest['world_size']}"
        )
    else:
        row["verdict"], row["note"] = "not measured", "the strong family did not run"
    out.append(row)

    weak = _family(scaling, "weak")
    # D is against the weak family's N0, as E_s against the strong family's: said when not 1
    n0 = min((r["world_size"] for r in weak), default=1)
    against = f" against {n0} {unit}" if n0 != 1 else ""
    row = {
        "target": "weak_deviation",
        "description": f"weak-scaling step-time deviation D{against} at the largest world size",
        "threshold": targets["weak_deviation"],
    }
    if len(weak) > 1:
        largest = max(weak, key=lambda r: r["world_size"])
        row["world_size"] = largest["world_size"]
        row["measured"] = largest["weak_deviation"]
        row["verdict"] = "pass" if _as_written(row["measured"]) <= row["threshold"] else "fail"
        notes = []
        if _as_written(row["measured"]) < -SUPERLINEAR_MARGIN:
            notes.append(_superlinear("a step shorter than the baseline's", unit))
        # the target is judged where it is written, at the largest world size; a smaller one
        # above the threshold (a step across a node boundary) passed without a word
        over = [
            r["world_size"]
            for r in weak
            if r is not largest and _as_written(r["weak_deviation"]) > row["threshold"]
        ]
        if over:
            at = ", ".join(str(w) for w in sorted(over))
            notes.append(
                f"D is above the threshold at {at} {unit} too, which "
                "this verdict, at the largest world size, does not judge"
            )
        if notes:
            row["note"] = "; ".join(notes)
    else:
        row["verdict"] = "not measured"
        row["note"] = (
            f"the weak family ran one world size ({weak[0]['world_size']}); D needs two or more"
            if weak
            else "the weak family did not run"
        )
    out.append(row)
    out.append(_optimisation_verdict(scaling, targets))
    return [{c: r.get(c) for c in VERDICT_COLUMNS} for r in out]


# how far past ideal scaling (E_s = 1, D = 0) a result is flagged as superlinear: timing noise
# of a few % is not, a baseline that ran slow is (the CPU demo, its 1-rank runs beside another
# job: E_s 106%, D -52%)
SUPERLINEAR_MARGIN = 0.05


def _superlinear(what: str, unit: str) -> str:
    return (
        f"superlinear, {what}: a larger world size can be faster per image (each rank's share "
        "fits a cache), but check first that the baseline's runs were not slowed (another job "
        f"beside them, a cold start; their epochs.csv), since a slow baseline flatters the "
        f"larger {unit}"
    )


def _as_written(value: float) -> float:
    """The value as its CSV cell holds it (12 significant digits), and as the documents and the
    proposal read it: a verdict judged on the unrounded float failed where they showed a pass."""
    return float(cell(value))


def _optimisation_verdict(scaling: list[dict], targets: dict) -> dict:
    """The best precision speedup over fp32 among the precisions whose accuracy was measured
    and not lower than fp32's by more than the tolerance."""
    fam = _family(scaling, "precision")
    others = [r for r in fam if r["precision"] != "fp32" and r["precision_speedup"] is not None]

    def names(rows) -> str:
        return ", ".join(sorted({f"{r['precision']} at {r['world_size']}" for r in rows}))

    def unmeasured_names(rows) -> str:
        """Whose accuracy is blank: the precision's, or its fp32 baseline's (bf16 was named
        where fp32's accuracy was the one not measured)."""
        return ", ".join(
            sorted(
                {
                    f"{r['precision']} at {r['world_size']}"
                    if r["final_val_acc_mean"] is None
                    else f"the fp32 baseline at {r['world_size']}"
                    for r in rows
                }
            )
        )

    # Only an accuracy loss beyond the tolerance disqualifies an optimisation; a gain is flagged in
    # the precision table (acc_within_tolerance is two-sided) but does not make it invalid. An
    # accuracy not measured cannot show the speedup kept it, so it qualifies nothing either.
    unmeasured = [r for r in others if r["acc_within_tolerance"] is None]
    lost = [r for r in others if _lost_accuracy(r)]
    candidates = [r for r in others if r not in unmeasured and r not in lost]
    why_not = []
    if lost:
        why_not.append(f"lost accuracy beyond the tolerance: {names(lost)}")
    if unmeasured:
        why_not.append(f"accuracy not measured: {unmeasured_names(unmeasured)}")
    row = {
        "target": "optimisation_speedup",
        "description": (
            # measured is P - 1, the gain the threshold is a share of (P = X / X(fp32), the
            # precision table's): the documents printed -87.4% beside P = 0.126, no formula
            "best precision gain over the fp32 baseline, P - 1 with P = X / X(fp32) "
            "(accuracy not lower by more than the tolerance)"
        ),
        "threshold": targets["optimisation_speedup"],
    }
    if candidates:
        best = max(candidates, key=lambda r: r["precision_speedup"])
        row["world_size"] = best["world_size"]
        row["measured"] = best["precision_speedup"] - 1.0
        row["verdict"] = "pass" if _as_written(row["measured"]) >= row["threshold"] else "fail"
        row["note"] = "; ".join([f"best: {best['precision']}", *why_not])
    elif lost and not unmeasured:
        row["verdict"] = "fail"
        row["note"] = f"every other precision lost accuracy beyond the tolerance: {names(lost)}"
    elif others:
        row["verdict"] = "not measured"
        row["note"] = "; ".join(why_not)
    elif not fam:
        row["verdict"], row["note"] = "not measured", "the precision family did not run"
    elif not any(r["precision"] == "fp32" for r in fam):
        row["verdict"] = "not measured"
        row["note"] = "the precision family ran no fp32 baseline"
    else:
        row["verdict"] = "not measured"
        row["note"] = (
            "no precision other than fp32 ran at a world size and local batch of an fp32 run"
        )
    return row


def _lost_accuracy(row: dict) -> bool:
    """Final accuracy below fp32's by more than the tolerance (outside it, and lower)."""
    return row["acc_within_tolerance"] is False and row["acc_diff_vs_fp32"] < 0


# --- resources -----------------------------------------------------------------------------------
RESOURCE_COLUMNS = (
    "kind",
    "family",
    "scale_factor",
    "world_size",
    "nodes",
    "runs",
    "node_hours",
    "gpu_hours",
    "node_hours_ideal",
    "lost_node_hours",
    "runs_lost_unmeasured",
    "energy_kwh",
    "energy_basis",
)
J_PER_KWH = 3.6e6


def energy_kwh(members: list[dict]) -> float | None:
    """GPU energy of the runs' training in kWh, from each run's measured J/img (NVML's counter
    over its steady-state window, train.py) x the images it trained:

        kWh = sum over runs of J/img x epochs x train_images_per_epoch / 3.6e6

    train_images_per_epoch: the trainer's count (all ranks). A runs.csv of an older trainer
    lacks it: then steps_per_epoch x global_batch, which equals it without gradient
    accumulation; with it, a short last group trains fewer images, so such a run's is None.

    J/img: energy_j_per_img (the training spans) where measured, else energy_wall_j_per_img
    (the window's wall span, the evaluations and checkpoints between its epochs included:
    estimate.measured_energy_per_img).
    GPUs only (no CPU, network or cooling); warm-up is charged at the window's rate. The sum
    counts training images only, so evaluation is left out with the training spans' J/img and
    included with the wall span's (each training image's energy with its share of the
    evaluations and checkpoints in that span); energy_basis says which. Training a preempted
    run redid (lost_time_s, which the node-hours count) is left out: the images counted once,
    the documents say so. None when any run lacks a measured J/img: a partial sum would be a
    guess about the missing runs."""
    total = 0.0
    for r in members:
        per_img, _ = estimate.measured_energy_per_img(r)
        if per_img is None:
            return None
        # a count check_runs took as blank (blank, None, nan: not measured) prices nothing, nor
        # does one runs.csv lacks (an optional column: r["epochs"] was a KeyError traceback)
        images, epochs = (
            files.number(r.get("train_images_per_epoch")),
            files.number(r.get("epochs")),
        )
        if images is None and not _accumulates(r):
            steps, batch = files.number(r.get("steps_per_epoch")), files.number(r["global_batch"])
            images = None if steps is None or batch is None else steps * batch
        if images is None or epochs is None:
            return None
        total += per_img * epochs * images
    return total / J_PER_KWH


def energy_basis(members: list[dict]) -> str | None:
    """Which J/img energy_kwh summed: "training" (every run's training spans), "evaluation
    included" (every run's wall span), or both counted, e.g. "mixed: 3 training, 1 evaluation
    included"; None where energy_kwh is None (a run lacks a measured J/img)."""
    scopes = [estimate.measured_energy_per_img(r)[1] for r in members]
    if energy_kwh(members) is None:
        return None
    return scopes[0] if len(set(scopes)) == 1 else _scope_counts(scopes)


def lost_seconds(run: dict) -> float | None:
    """The run's lost_time_s (train.py: loop seconds of preempted attempts past the checkpoint
    their successor resumed from, redone), None where not recorded: trained without
    --checkpoint-dir, or by a trainer before lost_time_s (no column, or blank)."""
    return files.number(run.get("lost_time_s"))


def resources(runs: list[dict], gpus_per_node: int) -> list[dict]:
    """Measured node-/GPU-hours per family, the study total (each run once), and projections
    of each family's largest-scale runs at k x that scale:

        node_hours (measured) = sum over runs of nodes x (train_time_s + lost_time_s) / 3600
        gpu_hours  (measured) = the same with world_size for nodes
        lost_node_hours       = sum over runs of nodes x lost_time_s / 3600  (in node_hours)
        runs_lost_unmeasured  = the runs with lost_time_s blank, counted there as 0
        node_hours(k)         = sum over those runs of ceil(k N / gpus_per_node) x t  (no speedup)
        node_hours_ideal(k)   = the same / k                                          (ideal)

    lost_time_s: the training that preempted attempts redid (train.py), so the spent hours hold
    what the allocation paid for it; measured to an epoch, a lower bound, and not at all for a
    run without checkpoints or of an older trainer (runs_lost_unmeasured). Start-up is in
    neither, nor the communication probe after training (train.comm_probe_steps: timed apart,
    the plan prices it as N_probe / X). t = the run's train_time_s / 3600: a projection prices
    running the runs again, not their accidents. The truth lies between the two bounds, nearer
    the first the lower the measured scaling efficiency."""
    rows = []
    by_family: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        for family in filter(None, str(r["families"]).split(";")):
            by_family[family].append(r)

    def spent(members):
        lost = [(lost_seconds(r) or 0.0) / 3600.0 for r in members]
        hours = [
            files.number(r["train_time_s"]) / 3600.0 + x for r, x in zip(members, lost, strict=True)
        ]
        return {
            "node_hours": sum(int(r["nodes"]) * h for r, h in zip(members, hours, strict=True)),
            "gpu_hours": sum(int(r["world_size"]) * h for r, h in zip(members, hours, strict=True)),
            "lost_node_hours": sum(int(r["nodes"]) * x for r, x in zip(members, lost, strict=True)),
            "runs_lost_unmeasured": sum(lost_seconds(r) is None for r in members),
        }

    for family in vocab.FAMILIES:
        members = by_family.get(family)
        if not members:
            continue
        rows.append(
            {
                "kind": "measured",
                "family": family,
                "runs": len(members),
                **spent(members),
                "energy_kwh": energy_kwh(members),
                "energy_basis": energy_basis(members),
            }
        )
    rows.append(
        {
            "kind": "measured",
            "family": "all (each run once)",
            "runs": len(runs),
            **spent(runs),
            "energy_kwh": energy_kwh(runs),
            "energy_basis": energy_basis(runs),
        }
    )
    for family in vocab.FAMILIES:
        members = by_family.get(family)
        if not members:
            continue
        n_max = max(int(r["world_size"]) for r in members)
        largest = [r for r in members if int(r["world_size"]) == n_max]
        for k in SCALE_FACTORS:
            world = k * n_max
            nodes = math.ceil(world / gpus_per_node)
            hours = sum(files.number(r["train_time_s"]) / 3600.0 for r in largest)
            rows.append(
                {
                    "kind": "projected",
                    "family": family,
                    "scale_factor": k,
                    "world_size": world,
                    "nodes": nodes,
                    "runs": len(largest),
                    "node_hours": nodes * hours,
                    "gpu_hours": world * hours,
                    "node_hours_ideal": nodes * hours / k,
                }
            )
    return [{c: r.get(c) for c in RESOURCE_COLUMNS} for r in rows]


# --- system and software -------------------------------------------------------------------------
SYSTEM_KEYS = (
    ("device_type", "device type"),
    ("device_names", "device"),  # every rank's (device_rows): device_name is rank 0's alone
    ("hostnames", "hosts"),
    ("torch_version", "PyTorch"),
    ("cuda_version", "CUDA"),
    ("nccl_version", "NCCL"),
    ("container_digest", "container image"),
    ("git_commit", "git commit of the runs"),
    ("flops_per_img", "FLOPs per training image"),
    ("peak_flops_source", "peak FLOP/s source (MFU)"),
    ("mfu_unmeasured", "why MFU is not measured"),
    ("energy_unmeasured", "why GPU energy is not measured"),
)
# what a SYSTEM_KEYS column says when the runs recorded it but left it blank in every run (a
# column no run has, from an older trainer, is "not recorded"); these are sentences, not lists
# that collect joined with ';', so a ';' inside one does not split it
SYSTEM_BLANK = {
    "peak_flops_source": "none: no run has a published peak",
    "mfu_unmeasured": "n/a: every run has an MFU",
}
# the trainer records these only on CUDA (trainer/measure.py): blank in a CPU run is not a gap
CUDA_ONLY = ("cuda_version", "nccl_version")
STUDY_KEYS = (
    "dataset",
    "model",
    "width",
    "epochs",
    "strategy",
    "loader",
    "lr",
    "schedule",
    "warmup_epochs",
    "warmup_steps",
    "window_warmup_steps",  # the report's "the window starts after N warm-up steps"
    "comm_probe_steps",
    "limit_train",
    "limit_test",
    "compiled",
)


# how many runs measured what a mean or a sum may leave blank: a configuration's mean needs every
# repeat's value and a family's kWh every run's (mean_std, energy_kwh), so one run without it
# blanks them, and the documents told "no run recorded it" of a study where most runs had
# (the documents' name, system.csv's key, whether a run has it)
MEASURED_COUNTS = (
    ("gpu_util", "runs with GPU utilisation", lambda r: files.number(r.get("gpu_util_mean"))),
    ("energy", "runs with GPU energy", lambda r: estimate.measured_energy_per_img(r)[0]),
    ("mfu", "runs with MFU", lambda r: files.number(r.get("mfu"))),
)


def system_table(runs: list[dict], study: dict) -> list[dict]:
    """(section, key, value): what ran where, each value the distinct values over all runs."""
    rows = [{"section": "study", "key": k, "value": v} for k, v in study.items()]
    rows.append({"section": "study", "key": "runs", "value": len(runs)})
    repeats = {int(r["repeat"]) for r in runs}
    rows.append({"section": "study", "key": "repeats", "value": len(repeats)})
    # per configuration (scaling.csv's n): "3 repeats" above while a failed pair left n = 1
    per_configuration = [len(members) for members in group_runs(runs).values()] or [0]
    rows.append({"section": "study", "key": "repeats_min", "value": min(per_configuration)})
    rows.append({"section": "study", "key": "repeats_max", "value": max(per_configuration)})
    for column in STUDY_KEYS:
        value = window_warmup(runs) if column == "window_warmup_steps" else _distinct(runs, column)
        rows.append({"section": "run settings", "key": column, "value": value})
    for column, label in SYSTEM_KEYS:
        if column == "mfu_unmeasured":
            value = mfu_unmeasured(runs)
        elif column == "energy_unmeasured":
            value = energy_unmeasured(runs)
        elif column in SYSTEM_BLANK:
            blank = SYSTEM_BLANK[column] if any(column in r for r in runs) else "not recorded"
            value = _distinct(runs, column, blank, split=False)
        elif column in CUDA_ONLY and runs and all(r.get("device_type") == "cpu" for r in runs):
            value = "n/a: every run ran on cpu"
        elif column == "device_names":
            value = _distinct(device_rows(runs), column)
        else:
            value = _distinct(runs, column)
        rows.append({"section": "system", "key": label, "value": value})
    for _, label, value in MEASURED_COUNTS:
        count = sum(value(r) is not None for r in runs)
        rows.append({"section": "measured", "key": label, "value": count})
    return rows


def mfu_unmeasured(runs: list[dict]) -> str:
    """system.csv's "why MFU is not measured": the distinct reasons the runs recorded
    (mfu_unmeasured, each a sentence: kept whole), and the runs that recorded neither an MFU nor
    a reason, counted: a trainer before MFU (a repeat kept from an older checkout, README "What
    reruns"). "n/a: every run has an MFU" only when every run's mfu is a number."""
    if not runs:
        return "not recorded"
    reasons = _distinct(runs, "mfu_unmeasured", "", split=False)
    older = sum(
        files.number(r.get("mfu")) is None and not _cell_text(r.get("mfu_unmeasured")) for r in runs
    )
    said = [reasons] * bool(reasons)
    if older:
        said.append(_older(older))
    return "; ".join(said) or "n/a: every run has an MFU"


def _older(runs: int) -> str:
    """What system.csv says of `runs` runs that recorded neither a value nor its reason."""
    return f"not recorded by {runs} {vocab.plural('runs', runs)} of an older trainer"


# the trainer's energy reasons that carry a run's own seconds: counted, not listed
COUNTED_ENERGY_REASONS = (vocab.ENERGY_SHORT_WINDOW, vocab.ENERGY_FROZEN)


def energy_unmeasured(runs: list[dict]) -> str:
    """system.csv's "why GPU energy is not measured": of the runs without a measured energy per
    image (estimate.measured_energy_per_img: neither the training spans' nor the wall span's),
    the distinct reasons the trainer recorded for the two (energy_unmeasured,
    energy_wall_unmeasured: each GPU's a sentence, kept whole, but those whose seconds make each
    run's its own, COUNTED_ENERGY_REASONS: the runs of each counted), and those that recorded
    none counted (a trainer before them). "n/a: every run has a GPU energy" only when each has
    one. The documents said "no run recorded NVML's energy counter (it needs a GPU and
    nvidia-ml-py)" of runs whose windows were too short for the counter."""
    if not runs:
        return "not recorded"
    missing = [r for r in runs if estimate.measured_energy_per_img(r)[0] is None]
    reasons: list[str] = []
    older = 0
    counted = dict.fromkeys(COUNTED_ENERGY_REASONS, 0)  # {reason: runs that gave it}
    for r in missing:
        said = [_cell_text(r.get(c)) for c in ("energy_unmeasured", "energy_wall_unmeasured")]
        # a cell holds each GPU's reason, "; "-joined; a window too short and a counter that
        # did not advance give their seconds (no two alike: a sentence per run): counted here,
        # their details in runs.csv
        parts = [p for why in said for p in why.split("; ") if p]
        for reason in counted:
            counted[reason] += any(p.startswith(reason) for p in parts)
        reasons += [
            p
            for p in dict.fromkeys(parts)
            if not p.startswith(COUNTED_ENERGY_REASONS) and p not in reasons
        ]
        older += not any(said)
    reasons[:0] = [
        f"{reason} ({n} {vocab.plural('runs', n)}, {'its' if n == 1 else 'their'} seconds in "
        "runs.csv)"
        for reason, n in counted.items()
        if n
    ]
    if older:
        reasons.append(_older(older))
    return "; ".join(reasons) or "n/a: every run has a GPU energy"


def window_warmup(runs: list[dict]) -> str:
    """The optimizer steps the runs' windows left out (metrics.json window_warmup_steps: the
    flag warmup_steps, or more under PowerSGD or the whole-step CUDA graph), their distinct
    values; a run of an older trainer recorded the flag alone: "at least" the flag."""
    values = []
    for r in runs:
        value = _cell_text(r.get("window_warmup_steps"))
        if not value and (flag := _cell_text(r.get("warmup_steps"))):
            value = f"at least {flag}"
        if value and value not in values:
            values.append(value)
    return "; ".join(values) if values else "not recorded"


def device_rows(runs: list[dict]) -> list[dict]:
    """Each run's devices as {"device_names": ...}: every rank's (metrics.json device_names,
    measure.py; ';'-joined by collect), else rank 0's device_name, from a trainer that did not
    record them. rank 0's alone called a run on a mixed partition (A100 + H100) an A100 run."""
    return [
        {"device_names": _cell_text(r.get("device_names")) or _cell_text(r.get("device_name"))}
        for r in runs
    ]


def _cell_text(value) -> str:
    """A runs.csv cell as text, "" for a blank one (None, "", "None")."""
    text = "" if value is None else str(value)
    return "" if text == "None" else text


def _distinct(runs, column, blank: str = "not recorded", split: bool = True) -> str:
    """The distinct values of a column over the runs ("; "-joined); a cell is a ';'-joined list
    (collect) unless split is False; `blank` when no run has a value."""
    values = []
    for r in runs:
        text = str(r.get(column) or "")
        for v in text.split(";") if split else [text]:
            if v not in ("", "None") and v not in values:
                values.append(v)
    return "; ".join(values) if values else blank


# --- profiling (optional input from the profiling stage) -----------------------------------------
# system.csv's row naming the kernel table the shares are from (--profile), NOT_PROFILED without
# one: profile_shares.csv has no rows then, as it has from a table without kernels, and the
# documents said "no kernel table was produced" of either, a claim no cell held (false where
# the study profiled and analyze ran by hand without --profile)
PROFILING_KEY = ("profiling", "kernel table")
NOT_PROFILED = "not profiled: scalestudy analyze ran without --profile"
SHARE_COLUMNS = ("run", "tool", "rank", "category", "total_ns", "share")
PROFILE_KERNELS = "results/csv/profile_kernels.csv"  # the profiling stage's, analyze --profile
SYSTEM_COLUMNS = ("section", "key", "value")
TARGET_COLUMNS = ("target", "value")
# every table run() writes, as results/csv/<name>.csv and results/tables/<name>.html: its
# columns and the title of its HTML copy. run() writes these and only these, and TABLE_NAMES,
# what render-report, the proposal and the workflow (ANALYSIS_TABLES: the analyze rule's
# outputs) read, is their names: a second list kept in step by hand let a table be written and
# never read, or read when no longer written (a stale file, or a missing input)
TABLES = {
    "scaling": (SCALING_COLUMNS, "Scaling per family and configuration"),
    "verdicts": (VERDICT_COLUMNS, "Targets and verdicts"),
    "resources": (RESOURCE_COLUMNS, "Resources spent and projected"),
    "system": (SYSTEM_COLUMNS, "System, software and study"),
    "targets": (TARGET_COLUMNS, "Targets of the study"),
    "profile_shares": (SHARE_COLUMNS, "Kernel time per category"),
    "waterfall": (WATERFALL_COLUMNS, "Efficiency-loss waterfall"),
}
TABLE_NAMES = tuple(TABLES)  # scaling first: the workflow's rules name its path apart
# the tables read_table checks (system.csv's and targets.csv's cells are read as they are):
# their columns of words (names, notes, true/false); every other cell is a number or blank
TABLE_TEXT = {
    "scaling": ("family", "precision", "energy_basis", "acc_within_tolerance", "runs"),
    "verdicts": ("target", "description", "verdict", "note"),
    "resources": ("kind", "family", "energy_basis"),
    "profile_shares": ("run", "tool", "category"),
    "waterfall": ("family", "precision", "note", "runs"),
}
# their columns, TABLES' (a second copy of them could drift from what run() writes)
TABLE_COLUMNS = {name: TABLES[name][0] for name in TABLE_TEXT}
# their cells that are never blank: from runs.csv's required columns (RUNS_KEYS, RUNS_NUMBERS)
_CONFIGURATION = (*GROUP_KEYS, "nodes", "global_batch", "n")
TABLE_FILLED = {
    "scaling": (*_CONFIGURATION, "throughput_img_s_mean", "step_time_s_mean", "runs"),
    "verdicts": ("target", "verdict"),
    "resources": ("kind", "family", "runs"),
    "profile_shares": SHARE_COLUMNS,
    "waterfall": (
        *_CONFIGURATION,
        *("baseline_world_size", "x_ideal", "x_measured", "step_time_s", "step_time_ideal_s"),
        *("loss_img_s", "loss_frac", "runs"),
    ),
}
# ... and resources.csv's of one kind of row (`resources`: a measured family's redone count,
# a projection's scale)
RESOURCES_FILLED = {
    "measured": ("runs_lost_unmeasured",),
    "projected": ("scale_factor", "world_size", "nodes"),
}


def profile_shares(path: str | Path) -> list[dict]:
    """results/csv/profile_kernels.csv (--profile) -> share of kernel time per (run, tool,
    category), rank 0 when present, else the lowest rank. Columns are checked, categories must
    be known."""
    fix = files.input_fix(path, PROFILE_KERNELS, "--profile")
    rows = read_csv(path, " (the profiling stage's kernel table)", PROFILE_KERNELS, "--profile")
    # the header of a table without rows too: another table's header alone (analyze's own
    # profile_shares.csv of a study not profiled) passed for a kernel table without kernels
    missing = [c for c in PROFILE_COLUMNS if c not in csv_header(path, rows, fix)]
    if missing:
        raise AnalysisError(
            f"{path} lacks the columns {missing}; expected {PROFILE_COLUMNS}; {fix}"
        )
    totals: dict[tuple, float] = defaultdict(float)
    first_rank: dict[tuple, int] = {}
    for line, r in enumerate(rows, start=2):  # line 1 is the header
        for column in PROFILE_COLUMNS:
            # the per-run CSVs are checked when merged; this one, edited since, was a ValueError
            # traceback (a word as rank or total_ns) or a negative share
            if why := cell_problem(column, r[column]):
                raise AnalysisError(
                    f"{path}, line {line}: {column} {r[column]!r} (kernel {r['kernel']!r}) is "
                    f"{why}; {fix}"
                )
        key = (r["run"], r["tool"])
        first_rank[key] = min(first_rank.get(key, int(r["rank"])), int(r["rank"]))
    for r in rows:
        if int(r["rank"]) == first_rank[(r["run"], r["tool"])]:
            totals[(r["run"], r["tool"], r["category"])] += float(r["total_ns"])
    out = []
    for run, tool in sorted(first_rank):
        total = sum(v for (ru, to, _), v in totals.items() if (ru, to) == (run, tool))
        for cat in PROFILE_CATEGORIES:
            ns = totals.get((run, tool, cat), 0.0)
            share = ns / total if total else 0.0
            values = (run, tool, first_rank[(run, tool)], cat, ns, share)
            out.append(dict(zip(SHARE_COLUMNS, values, strict=True)))
    return out


# --- writing -------------------------------------------------------------------------------------
def cell(value) -> str:
    """How a value is written to a CSV cell: None -> blank; floats to 12 significant digits
    (not decimal places: the model's 1/beta, ~1e-11 s/B on a 100 GB/s link, must not become
    0.0)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(float(f"{value:.12g}"))
    return str(value)


def html_text(title: str, rows: list[dict], columns) -> str:
    """A CSV as a small standalone HTML table, readable inside `snakemake --report`."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "\n".join(
        "<tr>" + "".join(f"<td>{html.escape(cell(r.get(c)))}</td>" for c in columns) + "</tr>"
        for r in rows
    )
    return (
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>table{border-collapse:collapse;font:13px sans-serif}"
        "td,th{border:1px solid #999;padding:2px 6px;text-align:right}</style></head><body>"
        f"<h3>{html.escape(title)}</h3><table><tr>{head}</tr>\n{body}</table></body></html>\n"
    )


# --- CLI -----------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", default="results/csv/runs.csv")
    parser.add_argument("--profile", default="", help="profile_kernels.csv (optional)")
    parser.add_argument("--out-dir", default="results/csv", help="where the CSVs go")
    parser.add_argument("--html-dir", default="results/tables", help="HTML copies of the tables")
    parser.add_argument(
        "--gpus-per-node",
        type=files.whole_number(1),
        required=True,
        help="hardware.gpus_per_node (>= 1)",
    )
    parser.add_argument(
        "--study",
        default="unnamed",
        help="study name (config `study`; the documents' title; default %(default)s)",
    )
    # the documents' reproduce commands print it: blank, they read `snakemake --configfile `
    parser.add_argument(
        "--configfile",
        default=paths.DEFAULT_CONFIG,
        help="the study's config file(s) for the documents' reproduce commands (the workflow "
        "passes its own; default %(default)s, what snakemake reads without --configfile)",
    )
    for key, value in DEFAULT_TARGETS.items():
        flag = "--" + key.replace("_", "-")
        parser.add_argument(flag, type=_target(key), default=value, help=f"default {value}")


# the ranges of the config schema's report.targets (workflow/schemas/config.schema.yaml), each
# as (the test, what it reads as)
TARGET_RANGES = {
    "strong_efficiency": (lambda x: 0 < x <= 1, "in (0, 1]"),
    "strong_efficiency_gpus": (lambda x: x >= 2, "a whole number >= 2"),
    "weak_deviation": (lambda x: 0 <= x <= 1, "in [0, 1]"),
    "optimisation_speedup": (lambda x: x >= 0, "a number >= 0"),
    "accuracy_tolerance": (lambda x: 0 <= x < 1, "in [0, 1)"),
}


def check_targets(path: str | Path, rows: list[dict], fix: str) -> dict[str, float]:
    """targets.csv's rows (read_csv's) as {target: value}, refused in one line where a row has
    no target name or numeric value, a value is outside the schema's range (TARGET_RANGES), or
    one of the strong pair comes alone: read by the figures' target lines and the documents."""
    # the header first: another table passed for it (scaling.csv) was refused row by row, each
    # message a 1.5 kB dict of 44 columns that named neither column it lacked
    missing = [c for c in TARGET_COLUMNS if c not in csv_header(path, rows, fix)]
    if missing:
        raise AnalysisError(
            f"{path} has no column {', '.join(missing)}: it is not the targets table "
            f"`scalestudy analyze` writes; {fix}"
        )
    out = {}
    for row, r in enumerate(rows, start=1):  # a row, not a line: blank lines are skipped
        try:
            value = files.number(r.get("value"))
        except ValueError:
            value = None  # a word: no number either
        if not r.get("target") or value is None:
            raise AnalysisError(
                f"{path}, row {row}: target {r.get('target')!r} with value "
                f"{r.get('value')!r}, not a target name and a number; {fix}"
            )
        # the schema's ranges, as analyze's flags take them: inf gpus was an OverflowError,
        # a weak deviation of -1 a ZeroDivisionError, a percent (70) a line drawn at 7000 %
        if r["target"] in TARGET_RANGES:
            in_range, what = TARGET_RANGES[r["target"]]
            whole = r["target"] != "strong_efficiency_gpus" or value.is_integer()
            if not (math.isfinite(value) and in_range(value) and whole):
                raise AnalysisError(
                    f"{path}: target {r['target']} is {r['value']!r}, not {what}; {fix}"
                )
        out[r["target"]] = value
    if ("strong_efficiency" in out) != ("strong_efficiency_gpus" in out):
        raise AnalysisError(
            f"{path}: strong_efficiency and strong_efficiency_gpus come together (a target "
            f"line is drawn at a world size); {fix}"
        )
    return out


def _target(key: str):
    """argparse type of a target flag: a finite number in the schema's range."""
    in_range, what = TARGET_RANGES[key]
    kind = type(DEFAULT_TARGETS[key])

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if not (math.isfinite(value) and in_range(value)):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    parse.__name__ = key  # argparse names the type in its messages
    return parse


# what every row of runs.csv needs (collect.py writes them) and which of them are numbers
RUNS_KEYS = ("run", "families", "precision")
RUNS_COUNTS = ("world_size", "nodes", "local_batch", "global_batch")  # integers >= 1
# the counts of analyze's tables (read_table), read with int(): digits only (a re-saved "2.0"
# passed as a number and failed there)
COUNT_COLUMNS = (*RUNS_COUNTS, "n", "baseline_world_size")
RUNS_NUMBERS = (*RUNS_COUNTS, "repeat", "bucket_cap_mb", "throughput_img_s", "train_time_s")
# divided by, or a size the scaling model fits (an inf or a negative one failed inside scipy)
RUNS_POSITIVE = ("throughput_img_s", "bucket_cap_mb", "grad_sync_bytes", "train_time_s")
# ... and measured rates, times and energies, which no run has at 0 or below (a negative J/img
# reached resources.csv and the proposal as negative kWh)
RUNS_POSITIVE += ("epoch_time_s", "model_flops_per_s", "energy_j_per_img", "energy_wall_j_per_img")
# ... and in analyze's tables (read_table: TABLE_POSITIVE)
POSITIVE_COLUMNS = frozenset(
    {f"{m}_mean" for m in RUNS_POSITIVE}
    | {"step_time_s_mean", "bucket_cap_mb"}
    | {"x_ideal", "x_measured", "step_time_s", "step_time_ideal_s"}
)
# measured fractions, and NVML's utilisation in percent: out of range, the report printed them
# as they were (a final accuracy of -100.0 %)
RUNS_FRACTIONS = ("final_val_acc", "comm_exposed_frac", "mfu")
RUNS_PERCENT = ("gpu_util_mean",)
# measured where the run measured them, else blank ("not measured"): a number or blank
RUNS_OPTIONAL = tuple(m for m in MEASURES if m not in RUNS_NUMBERS and m != "step_time_s")
# the J/img resources.csv multiplies into kWh (an inf there reached the report as an
# OverflowError in its number formatting)
RUNS_OPTIONAL += ("energy_j_per_img", "energy_wall_j_per_img")
# ... and the counts energy_kwh reads with int() where a run measured its energy (a re-saved
# "195.0" was a ValueError traceback); blank in a runs.csv of an older trainer
ENERGY_COUNTS = ("epochs", "steps_per_epoch", "train_images_per_epoch", "accum_steps")
RUNS_OPTIONAL += ENERGY_COUNTS
# the warm-up the window left out, which the report prints (system_table); blank in a runs.csv
# of an older trainer, which recorded only the flag warmup_steps
RUNS_OPTIONAL += ("window_warmup_steps",)
# the training preempted attempts redid, which resources.csv adds to the node-hours; blank
# without checkpoints (not measured) or in a runs.csv of an older trainer
RUNS_OPTIONAL += ("lost_time_s",)
# the probe's steps, which say why its share is blank (0: the probe was off); blank in a runs.csv
# of an older trainer
RUNS_OPTIONAL += ("comm_probe_steps",)
# the waterfall's per-rank lists (milliseconds; collect joins a list with ';'): each element a
# number >= 0, or None where a rank did not measure it (a word there was a ValueError traceback)
RUNS_PER_RANK = tuple(c for c in PART_INPUTS.values() if c.endswith("_by_rank"))
RANK_CELL = files.NON_NEGATIVE.or_blank()  # one element of such a list
# what each checked column holds (files.NUMBER, a finite number, where it is not named here);
# counts as collect writes them, digits only: a re-saved "2.0" passed as a count and failed
# int() later with a traceback
RUNS_CELLS = {
    **{c: files.count(1) for c in (*RUNS_COUNTS, *ENERGY_COUNTS)},
    "repeat": files.count(0),
    "window_warmup_steps": files.count(0),
    "comm_probe_steps": files.count(0),
    "lost_time_s": files.NON_NEGATIVE,
    **{c: files.POSITIVE for c in RUNS_POSITIVE},
    # the trainer's range, which the scaling model builds its buckets in (study/model.py; its
    # grad_sync_bytes, which analyze reads nowhere, model and plan check themselves)
    "bucket_cap_mb": model.BUCKET_CAP_CELL,
    "throughput_img_s": model.THROUGHPUT_CELL,
    **{c: files.FRACTION for c in RUNS_FRACTIONS},
    **{c: files.PERCENT for c in RUNS_PERCENT},
}


RUNS_CSV = "results/csv/runs.csv"  # collect's, analyze's and model's --runs
RUNS_FIX = f"write it again with `scalestudy collect` (snakemake {RUNS_CSV})"


def check_runs(
    runs: list[dict],
    path: str,
    keys: tuple[str, ...] = RUNS_KEYS,
    numbers: tuple[str, ...] = RUNS_NUMBERS,
    optional: tuple[str, ...] = RUNS_OPTIONAL,
    per_rank: tuple[str, ...] = RUNS_PER_RANK,
) -> None:
    """runs.csv as `scalestudy collect` writes it: one row per run; the columns the tables
    group, count and divide by (`keys`, `numbers`), those finite numbers; the measurements
    (`optional`) a number or blank; each as RUNS_CELLS says (counts whole and >= 1,
    RUNS_POSITIVE > 0, RUNS_FRACTIONS in [0, 1], RUNS_PERCENT in [0, 100]); the per-rank lists
    (`per_rank`) numbers >= 0 joined by ';'. Else one AnalysisError naming the file, the run,
    the column and the fix."""
    fix = RUNS_FIX
    missing = [c for c in ("run", *keys, *numbers) if c not in runs[0]]
    if missing:
        raise AnalysisError(f"{path} has no column {', '.join(dict.fromkeys(missing))}: {fix}")
    seen = set()
    for row in runs:
        if row["run"] in seen:  # a second row would count as a second repeat of its cell
            raise AnalysisError(f"{path}: run {row['run']!r} has two rows: {fix}")
        seen.add(row["run"])
        if "families" in keys:  # each a family of the study's vocabulary (tables sort by it)
            named = [f for f in str(row["families"]).split(";") if f]
            unknown = [f for f in named if f not in vocab.FAMILIES]
            if unknown:
                raise AnalysisError(
                    f"{path}: run {row['run']!r} has families = {row['families']!r}, whose "
                    f"{', '.join(map(repr, unknown))} is none of {', '.join(vocab.FAMILIES)}: {fix}"
                )
            if twice := next((f for f in named if named.count(f) > 1), None):
                # group_runs puts the run in the family's cell once per name: two repeats
                raise AnalysisError(
                    f"{path}: run {row['run']!r} has families = {row['families']!r}, which "
                    f"names {twice} twice: {fix}"
                )
        if bad := run_row_problem(row, numbers, optional, per_rank):
            column, what = bad
            raise AnalysisError(
                f"{path}: run {row['run']!r} has {column} = {row[column]!r}, not {what}: {fix}"
            )
    if "families" in keys:
        check_one_configuration(runs, path)


# the run-table columns in which the repeats of one configuration differ
REPEAT_COLUMNS = ("run", "families", "repeat", "seed")
# what the runs of one family may differ in (study/runs.py _requests): their world size, its
# placement and batches (the efficiencies are per image and per step), but for the batch the
# family keeps (FAMILY_KEEPS), and the family's own sweep; every other column (precision,
# dataset, model, strategy, ...) is its baseline's
VARY_IN_A_FAMILY = ("nodes", "ranks_per_node", "world_size", "gpus") + (
    "local_batch",
    "global_batch",
    "accum_steps",
)
# the strong family's T = G / X compares one global batch, the weak family's one local batch: a
# runs.csv merged by hand with a strong run of global batch 128 beside 32 divided step times of
# other batches (efficiencies 0.84 and 0.42 at 2 ranks from one throughput)
FAMILY_KEEPS = {"strong": ("global_batch",), "weak": ("local_batch",)}
FAMILY_VARIES = {
    "strong": (),
    "weak": (),
    "precision": ("precision",),
    "bucket": ("bucket_cap_mb",),
}


def _differing(first: dict, other: dict, skip: tuple[str, ...]) -> str | None:
    """The first run-table column, not in `skip`, in which two runs that both record it
    differ; else DEVICE_MODELS where both record the devices they trained on and those differ
    (the run table's `device` is cpu or cuda: an A100 run and an H100 run of one configuration,
    on a partition of mixed GPUs without hardware.gpu_type, were averaged as repeats, and one
    was the other's baseline)."""
    for column in RUN_COLUMNS:
        if column in skip or column not in first or column not in other:
            continue
        values = first[column], other[column]
        if "" not in values and None not in values and not same(*values):
            return column
    models = gpu_models(first), gpu_models(other)
    if all(models) and models[0] != models[1]:
        return DEVICE_MODELS
    return None


# the pseudo-column _differing names for runs on different GPU models
DEVICE_MODELS = "device_names"


def device_names(row: dict) -> str:
    """The devices a run of runs.csv trained on: device_names (every rank's), else device_name
    (rank 0's, an older trainer's); "" where neither is recorded."""
    return str(row.get("device_names") or row.get("device_name") or "")


def gpu_models(row: dict) -> frozenset[str]:
    """The GPU models a cuda run trained on (gpu_model of each); empty for a CPU run (its nodes'
    CPU models are not compared) and for one that records no device."""
    if row.get("device") != "cuda" or not (names := device_names(row)):
        return frozenset()
    return frozenset(gpu_model(n) for n in names.split(";"))


def gpu_model(name: str) -> str:
    """One GPU model per row of the peaks table, as the MFU peak takes it (an A100 40GB and
    80GB are one row, an H100 PCIe and SXM two, with two peaks); a MIG slice, a vGPU profile
    (no peak: hardware.peak) and a GPU of no row by their name, less the vendor's word a driver
    may put first or not ("GeForce RTX 3090", "NVIDIA GeForce RTX 3090")."""
    name = name.strip()
    if hardware.peak("cuda", name, "fp32").flops is not None:
        return hardware.gpu_peaks(name).model
    return re.sub(r"^(NVIDIA|Tesla)\s+", "", name)


def _shown(row: dict, column: str) -> str:
    return device_names(row) if column == DEVICE_MODELS else row[column]


def _fix(column: str, one_study: str) -> str:
    """What a refusal of two runs differing in `column` tells to do."""
    if column != DEVICE_MODELS:
        return one_study
    return (
        "a study's runs train on one GPU model: set hardware.gpu_type to it (Slurm then "
        "gives every job that model) and train the runs of the other again (delete their "
        "results/runs/<run> and run `snakemake`)"
    )


def check_one_configuration(runs: list[dict], path: str) -> None:
    """The runs group_runs takes as the repeats of one configuration differ in no other
    run-table column (strategy, nodes, comm_hook, ...) than REPEAT_COLUMNS, nor in the device
    model they trained on (_differing), where both record it: a runs.csv merged by hand of a
    DDP and an FSDP study averaged the two, its spread the gap between them."""
    one_study = "analyze the runs of one study (one runs.csv of `scalestudy collect`)"
    for key, members in group_runs(runs).items():
        first = members[0]
        for other in members[1:]:
            if column := _differing(first, other, REPEAT_COLUMNS):
                family, world_size, local_batch, precision, bucket = key
                cell = (
                    f"family {family}, world size {world_size}, local batch {local_batch}, "
                    f"precision {precision}, bucket {bucket:g} MiB"
                )
                raise AnalysisError(
                    f"{path}: runs {first['run']!r} and {other['run']!r} are of one "
                    f"configuration ({cell}) but differ in {column} "
                    f"({_shown(first, column)!r} and {_shown(other, column)!r}): the tables "
                    f"would average them as repeats; {_fix(column, one_study)}"
                )
    # and the runs of a family are one experiment swept over its world sizes and own values:
    # a runs.csv merged by hand with fp32 at 1 GPU and bf16 at 4 (or another dataset, model)
    # gave a strong efficiency against the other run as its baseline
    for family, varies in FAMILY_VARIES.items():
        members = [r for r in runs if family in str(r["families"]).split(";")]
        if not members:
            continue
        base = min(members, key=lambda r: int(r["world_size"]))
        keeps = FAMILY_KEEPS.get(family, ())
        skip = REPEAT_COLUMNS + tuple(c for c in VARY_IN_A_FAMILY if c not in keeps) + varies
        for other in members:
            if column := _differing(base, other, skip):
                raise AnalysisError(
                    f"{path}: runs {base['run']!r} and {other['run']!r} are of family "
                    f"{family} but differ in {column} ({_shown(base, column)!r} and "
                    f"{_shown(other, column)!r}), which the family keeps one value: its figures "
                    f"would compare them as one experiment; {_fix(column, one_study)}"
                )


def run_row_problem(
    row: dict,
    numbers: tuple[str, ...] = RUNS_NUMBERS,
    optional: tuple[str, ...] = RUNS_OPTIONAL,
    per_rank: tuple[str, ...] = RUNS_PER_RANK,
) -> tuple[str, str] | None:
    """(column, what it must be) of the first of the row's cells that breaks RUNS_CELLS (the
    `optional` ones may be blank; the `per_rank` lists numbers >= 0 joined by ';'), else None.
    Only the columns the row has: check_runs makes sure runs.csv has them all, collect checks a
    run's metrics.json with it before its values reach runs.csv."""
    for column in (c for c in (*numbers, *optional) if c in row):
        rule = RUNS_CELLS.get(column, files.NUMBER)
        if column in optional:
            rule = rule.or_blank()  # not measured
        if not rule.holds(row[column]):
            return column, rule.what
    for column in (c for c in per_rank if c in row):
        ranks = [v for v in str(row[column] or "").split(";") if v != "None"]
        if not all(RANK_CELL.holds(v) for v in ranks):
            return column, "numbers >= 0 joined by ';' (one per rank)"
    return None


def run(args: argparse.Namespace) -> int:
    targets = {k: getattr(args, k) for k in DEFAULT_TARGETS}
    out, html_dir = Path(args.out_dir), Path(args.html_dir)
    # an input among the outputs: the header-only profile_shares.csv of a study not profiled,
    # given as --profile, passed for a kernel table without kernels and was written over
    outputs = {f"{name}.csv of --out-dir": out / f"{name}.csv" for name in TABLE_NAMES}
    outputs |= {f"{name}.html of --html-dir": html_dir / f"{name}.html" for name in TABLE_NAMES}
    files.check_distinct(outputs, {"--runs": args.runs, "--profile": args.profile}, AnalysisError)
    # an AnalysisError: one line from cli.main, exit 2, before any table is written
    runs = read_csv(args.runs, " (one row per run)", RUNS_CSV, "--runs")
    if not runs:
        raise AnalysisError(f"{args.runs} has no runs: {RUNS_FIX}")
    check_runs(runs, args.runs)
    scaling = scaling_table(runs, targets["accuracy_tolerance"])
    study = {"name": args.study, "device": _distinct(runs, "device")}
    unit = "GPUs" if study["device"] == "cuda" else "CPU ranks"
    verdict_rows = verdicts(scaling, targets, unit)
    resource_rows = resources(runs, args.gpus_per_node)
    system_rows = system_table(runs, study)
    profile = profile_shares(args.profile) if args.profile else []
    profiled = dict(zip(("section", "key"), PROFILING_KEY, strict=True))
    system_rows.append({**profiled, "value": args.profile or NOT_PROFILED})
    system_rows.append({"section": "reproduce", "key": "configfile", "value": args.configfile})
    rows = {
        "scaling": scaling,
        "verdicts": verdict_rows,
        "resources": resource_rows,
        "system": system_rows,
        "targets": [{"target": k, "value": v} for k, v in targets.items()],
        "profile_shares": profile,
        "waterfall": waterfall(runs),
    }
    if rows.keys() != TABLES.keys():  # a table written and never read, or read and not written
        raise RuntimeError(f"analyze.run writes {list(rows)}, and TABLES names {list(TABLES)}")
    titles = {name: title for name, (_, title) in TABLES.items()}
    if not profile:  # the HTML copy, what `snakemake --report` shows, says why it is empty
        why = NOT_PROFILED if not args.profile else f"none in {args.profile}"
        titles["profile_shares"] += f" ({why})"
    texts = {
        out / f"{name}.csv": files.csv_text(columns, rows[name], cell)
        for name, (columns, _) in TABLES.items()
    }
    texts |= {
        html_dir / f"{name}.html": html_text(titles[name], rows[name], columns)
        for name, (columns, _) in TABLES.items()
    }
    files.check_outputs(texts, AnalysisError)  # one table new beside old ones otherwise
    files.write_texts(texts)  # and a write that fails (a full disk) leaves every one old
    logger.info(f"analyzed {len(runs)} runs -> {len(scaling)} scaling rows in {out}")
    return 0
