"""`scalestudy proposal`: the allocation proposal and the 5-slide pitch, every number a CSV cell.

First results/csv/proposal.csv (tidy: section, item, quantity, value, unit, source), the numbers
the proposal computes that no other CSV holds; then reports/proposal.md, proposal.tex and
slides.tex from it plus the analysis CSVs (render_report's formats and its honesty check).

    chosen scale     the largest strong-scaling world size W with E_s(w) >= threshold for every
                     measured w <= W (the efficiency "stays at or above" it); E_s from scaling.csv
    thin evidence    fewer than MIN_WORLD_SIZES strong world sizes, a point with n < MIN_REPEATS
                     (the two are proposal.csv's "bar" cells), or no measured run at the chosen
                     scale: the documents say so and price the runs that would fix it
                     (NEXT_REPEATS repeats each, its "runs to add" cell; new world sizes double
                     the largest, else halve the smallest) that the study's own run table does
                     not hold (those are priced in its rows, once), or that there are none
    hours per run    the planner's estimate (study/estimate.py, calibrated from results/csv/runs.csv
                     and benchmarks/train/ where a measured run matches, its defaults where none
                     does or plan.calibrate is false: each source cell and the text say which,
                     planner_source; counted as plan.md counts, calibrated in throughput, and
                     apart those with the default throughput and a measured start-up, "in
                     start-up only") averaged over a row's runs, rounded UP to 3 significant
                     digits, so that the printed table (its products and sums printed as the
                     cells hold them, render_report's `exact`) recomputes exactly:
    node-hours       = runs x hours per run x nodes;   GPU-hours = runs x hours per run x GPUs
    basis            a planner row's throughput bases (estimate.py's words, "; "-joined): the
                     documents name the rows the scaling model prices ("model", "model,
                     extrapolated") and say whether a held-out point validates it, or why not
                     (model.csv absent, without held-out rows, or none of them validated:
                     validation_rows), and those priced from another world size's runs by the
                     plan's efficiency guesses ("precision")
    energy_basis     a planner row's energy bases (estimate.py's words, "; "-joined): the
                     documents name the rows whose J/img is over the window's wall span
                     (evaluations and checkpoints between its epochs included), for all
                     their runs or some
    profiling        profiled runs x their Slurm time limit (study/profiling.py job_minutes:
                     the run's start-up and window, x top_k for profile_ncu, x safety_factor,
                     at least hardware.runtime_min), per job of profile_capture (and
                     profile_ncu when Nsight Compute runs): requested, not estimated
    request          = sum of the rows + contingency x that sum (rounded up), in Decimal from
                     the cells; periods share it by months, the last one the rest: the printed
                     cells add up exactly
    energy           the planner's GPU kWh of the training rows (measured J/img), else unmeasured
                     ("not used" with plan.calibrate false: the planner reads no measured run);
                     each row's sum rounded UP to 3 significant digits, like hours (the
                     J/img it is from is measured to no more), the total their exact sum

    scalestudy proposal --config config/demo.yaml --csv-dir results/csv --out-dir reports
"""

from __future__ import annotations

import argparse
import copy
import csv
import io
import json
import math
from collections import defaultdict
from decimal import ROUND_CEILING, Context, Decimal
from pathlib import Path

import jinja2

from scalestudy import files, log, vocab
from scalestudy.errors import AnalysisError
from scalestudy.results import render_report as report
from scalestudy.results.analyze import cell, check_cell, read_csv
from scalestudy.study import profiling
from scalestudy.study.config import (
    add_config_arguments,
    config_inputs,
    load_layers,
    semantic_problems,
)
from scalestudy.study.estimate import (
    BENCHMARKS_DIR,
    NOT_MEASURED,
    NOT_USED,
    RUNS_CSV,
    SOURCE,
    WITH_EVALUATION,
    add_measured_arguments,
    dataset_sizes,
    estimate_runs,
    given_path,
    load_measured,
    runs_done,
)
from scalestudy.study.runs import build_run_table, placement

logger = log.get(__name__)

COLUMNS = ("section", "item", "quantity", "value", "unit", "source")
DOCUMENTS = {"proposal.md": "md", "proposal.tex": "tex", "slides.tex": "tex"}
MIN_WORLD_SIZES = 4  # a knee needs points on both sides of it
MIN_REPEATS = 2  # one run gives no spread
NEXT_REPEATS = 3  # the runs named to fix thin evidence repeat this often
MODEL_CSV = "results/csv/model.csv"
PLANNER = "study/estimate.py planner"
BASIS_SOURCE = "study/estimate.py throughput_basis of its runs"  # a request row's bases
ENERGY_BASIS_SOURCE = "study/estimate.py energy_basis of its runs"  # and of its J/img
# a profiling request row's hours: each job's Slurm time limit, from its run's estimate
PROFILING_SOURCE = "Slurm time limit per profiling job: study/profiling.py job_minutes"
# why a request row's runs cannot run as priced: one job past hardware.runtime_max
CANNOT_RUN_SOURCE = "study/estimate.py split_jobs: its refusal of the row's runs"
MODEL_BASES = ("model", "model, extrapolated")  # the planner's bases of the scaling model
# the planner's basis of a run priced from another world size's measured runs, rescaled by the
# plan's efficiency guesses (study/estimate.py, level 5): the documents name these rows too
RESCALED_BASIS = "precision"
# where a dataset comes from and on what terms (what its publisher states; nothing is inferred)
DATA_TERMS = {
    "cifar10": "CIFAR-10 (Krizhevsky 2009, www.cs.toronto.edu/~kriz/cifar.html): no licence is "
    "stated by its publisher; cited as the publisher asks",
    "mnist": "MNIST (LeCun, Cortes and Burges, yann.lecun.com/exdb/mnist): the terms are those "
    "of its publisher",
    "synthetic": "a synthetic data set generated by scalestudy prepare-data: no third-party data",
}
# section order and headings of each centre style (the extras are in the templates)
STYLES = {
    "generic": [
        ("objectives", "Objectives"),
        ("method", "Method"),
        ("readiness", "Code and readiness"),
        ("evidence", "Scaling evidence"),
        ("scale", "Chosen production scale"),
        ("request", "Resource request"),
        ("data", "Data management"),
    ],
    "ncar": [
        ("objectives", "Scientific objectives"),
        ("method", "Computational experiments and methodology"),
        ("request", "Resource request: experiment x hours per run x runs = total"),
        ("evidence", "Scaling and performance evidence"),
        ("scale", "Justification of the production scale (the knee)"),
        ("readiness", "Code readiness"),
        ("data", "Data management plan"),
    ],
    "archer2": [
        ("objectives", "Science case"),
        ("readiness", "Technical assessment: code readiness"),
        ("method", "Method"),
        ("evidence", "Scaling: speedup against the smallest core count"),
        ("scale", "Production job size"),
        ("request", "Resource request by period"),
        ("data", "Data management"),
    ],
    "ercap": [
        ("objectives", "Project description"),
        ("method", "Computational approach"),
        ("readiness", "Code readiness"),
        ("evidence", "Scaling evidence"),
        ("scale", "Maximum and typical node counts, and how they were chosen"),
        ("request", "Resource request (node-hours)"),
        ("data", "Data management"),
    ],
}
NOT_ESTIMATED = "not estimated"  # profiling jobs' energy: no J/img of a profiled window
# NOT_MEASURED (no measured run of the same precision and world size has J/img) and NOT_USED
# (plan.calibrate false: the planner reads no measured J/img): the planner's words, estimate.py
ENERGY_WORDS = (NOT_ESTIMATED, NOT_MEASURED, NOT_USED)  # an energy cell that is no number
ARCHER2_PERIOD_MONTHS = 6  # ARCHER2 allocations are reported per 6-month period
# proposal.csv's (planner, calibration) counts of the priced runs, disjoint: calibrated in
# throughput, and in start-up only (the planner's default throughput)
CALIBRATION_PARTS = ("runs_calibrated", "runs_startup_only")
CELL_DIGITS = 12  # significant digits of a float cell (analyze.cell) and of render_report's exact


def _row(section, item, quantity, value, unit="", source=""):
    return dict(zip(COLUMNS, (section, item, quantity, cell(value), unit, source), strict=True))


def ceil3(x: float) -> float:
    """x rounded up to 3 significant digits (hours and kWh asked for, never fewer than
    estimated)."""
    if x <= 0:
        return 0.0
    d = 2 - math.floor(math.log10(x))
    return round(math.ceil(round(x * 10**d, 9)) / 10**d, max(d, 0))


# --- the evidence --------------------------------------------------------------------------------
# config keys no number of the proposal reads, left out of its rerun trigger (settings_json):
# where the checkpoints go, how often and how many, and how long a hung collective may wait
NOT_PROPOSAL = {
    "checkpointing": ("dir", "every_epochs", "keep"),
    "train": ("pg_timeout_s",),
    "hardware": ("mem_mb_per_rank",),  # the jobs' Slurm request only
}
# ... and these too without hardware.runtime_max: they set the jobs' time limits only, which
# the request does not price (it prices what the jobs hold: Estimate.held_s); past it they set
# how many jobs a run takes (the retries too: too few, and a production run is priced as one
# job, estimate.split_jobs with refuse False)
SPLIT_ONLY = {"checkpointing": ("enabled", "signal_lead_s", "retries")}


def settings_json(config: dict) -> str:
    """The config the proposal reads, as JSON: the proposal rules' param (a change reruns them
    only), all of it but NOT_PROPOSAL, the container's keys while it is off, and but
    SPLIT_ONLY where hardware.runtime_max is null:
    past it a run goes on in as many jobs as checkpointing (on, its warning lead) leaves room
    for, each with its start-up, and the request prices them."""
    left_out = {key: set(names) for key, names in NOT_PROPOSAL.items()}
    if (config.get("hardware") or {}).get("runtime_max") is None:
        for key, names in SPLIT_ONLY.items():
            left_out[key] |= set(names)
    container = config.get("container") or {}
    if not container.get("enabled"):  # its image and definition are read only while it is on
        left_out["container"] = set(container) - {"enabled"}
    settings = {
        key: (
            {k: v for k, v in value.items() if k not in left_out[key]}
            if key in left_out and isinstance(value, dict)
            else value
        )
        for key, value in config.items()
    }
    return json.dumps(settings, sort_keys=True, default=str)


def strong_points(scaling: list[dict], enabled: bool = False) -> list[dict]:
    """The strong family's rows of scaling.csv, by world size, numbers parsed; `enabled`:
    families.strong is (the refusal's advice: run it, not enable it)."""
    rows = [r for r in scaling if r["family"] == "strong"]
    if not rows:
        fix = (
            "no strong-scaling run is measured yet (run the study's strong runs: `snakemake`)"
            if enabled
            else "enable families.strong"
        )
        raise AnalysisError(
            "scaling.csv has no strong-scaling rows: a proposal's production scale comes from the "
            f"strong family ({fix})"
        )
    out = []
    for r in rows:
        out.append(
            dict(
                r,
                w=int(r["world_size"]),
                n_=int(r["n"]),
                e=files.number(r["strong_efficiency"]),
            )
        )
    return sorted(out, key=lambda r: r["w"])


def choose_scale(points: list[dict], threshold: float) -> tuple[dict, dict | None]:
    """(chosen point, the first point below the threshold or None): E_s stays >= threshold up
    to the chosen world size; the smallest world size (E_s = 1 by definition) is the floor."""
    chosen, below = points[0], None
    for p in points[1:]:
        if p["e"] is None or p["e"] < threshold:
            below = p
            break
        chosen = p
    return chosen, below


# the columns of model.csv that name each row (holdout() and the documents select rows by them)
MODEL_KEYS = ("kind", "name")
# the cells of model.csv that holdout() computes with, by (kind, name; None: any name), column
MODEL_CELLS = {
    ("holdout", None): {"rel_error": files.NUMBER.or_blank()},
    ("parameter", "fit_residual_rel_sd"): {"value": files.NUMBER.or_blank()},
    ("parameter", "fit_below_compute"): {"value": files.count(0).or_blank()},
}


# ncar's scale heading names the knee, which a fall with an efficient scale past it is not
KNEE = " (the knee)"


def section_titles(style: str, above_again: bool) -> list[tuple[str, str]]:
    """The (key, heading) of each section of `style`, in its order; without the knee where
    E_s is back at or above the threshold past its first fall (above_again)."""
    return [
        (key, title.removesuffix(KNEE) if above_again else title) for key, title in STYLES[style]
    ]


def above_again(points: list[dict], below: dict, threshold: float) -> dict | None:
    """The largest world size past `below` (choose_scale's first fall) whose E_s is at or
    above the threshold again, or None: a fall between efficient scales (noise in a few
    repeats, or a placement effect such as the step to a second node) is not a knee. None too
    where the first fall is no measured E_s (a blank cell): no fall to call noise."""
    if below["e"] is None:
        return None
    again = [
        p for p in points if p["w"] > below["w"] and p["e"] is not None and p["e"] >= threshold
    ]
    return again[-1] if again else None


def checked_model(path: str | Path) -> list[dict]:
    """model.csv's rows, refused in one line where holdout() could not read them: no rows
    (`scalestudy model` writes one for every study: a 0-byte file is a write cut short) or a
    cell of MODEL_CELLS that is not a number. A hand-given --model-csv with "x" there was a
    ValueError traceback."""
    fix = files.input_fix(Path(path), MODEL_CSV, "--model-csv")
    rows = read_csv(path, "", MODEL_CSV, "--model-csv")
    if not rows:
        raise AnalysisError(
            f"{path} has no rows: `scalestudy model` writes rows for every study that ran; {fix}"
        )
    # the columns every row is read by (a hand-written table may leave out the others): a
    # foreign CSV said "a CSV lacks the column 'kind'", naming no file
    if missing := [c for c in MODEL_KEYS if c not in rows[0]]:
        raise AnalysisError(
            f"{path} has no column {', '.join(missing)}: not a model.csv of `scalestudy "
            f"model`; {fix}"
        )
    for i, row in enumerate(rows, start=2):  # line 1 is the header
        kind = row.get("kind")
        rules = MODEL_CELLS.get((kind, None)) or MODEL_CELLS.get((kind, row.get("name")), {})
        for column, rule in rules.items():
            check_cell(path, i, column, row.get(column), rule, fix)
    return rows


def holdout(model_rows: list[dict]) -> dict | None:
    """{"points", "max_rel_error", "residual_rel_sd", "below_compute"} of model.csv: its
    kind=holdout rows' errors, and the fit's relative residual sd and count of multi-rank
    configurations shorter than their 1-rank compute (None where model.csv has no such row:
    one older than the check); None: no held-out error at all. The documents print the
    residual sd beside the error (one held-out point matching says little of a fit 172% off
    in sample) and, with below_compute > 0, that the model cannot describe the runs."""
    errors = [
        abs(x)
        for r in model_rows
        if r.get("kind") == "holdout" and (x := files.number(r.get("rel_error"))) is not None
    ]
    if not errors:
        return None
    names = ("fit_residual_rel_sd", "fit_below_compute")
    fit = {
        r["name"]: files.number(r.get("value"))
        for r in model_rows
        if r.get("kind") == "parameter" and r.get("name") in names
    }
    below = fit.get("fit_below_compute")
    return {
        "points": len(errors),
        "max_rel_error": max(errors),
        "residual_rel_sd": fit.get("fit_residual_rel_sd"),
        "below_compute": None if below is None else int(below),
    }


def holdout_rows(val: dict | None) -> list[dict]:
    """proposal.csv's rows of `holdout(...)`: the held-out points and largest error, and the
    fit's residual sd and count below the compute where model.csv has them; none without."""
    if val is None:
        return []
    rows = [
        _row("model", "holdout", "points", val["points"], "points", "model.csv kind=holdout"),
        _row("model", "holdout", "max_rel_error", val["max_rel_error"], "fraction", "model.csv"),
    ]
    fit = (
        ("residual_rel_sd", "fraction", "fit_residual_rel_sd"),
        ("below_compute", "configurations", "fit_below_compute"),
    )
    for quantity, unit, name in fit:
        if val[quantity] is not None:
            rows.append(_row("model", "fit", quantity, val[quantity], unit, f"model.csv {name}"))
    return rows


def validation_rows(model_rows: list[dict] | None) -> list[dict]:
    """proposal.csv's rows of why the model may have no held-out validation: none where
    model.csv is absent (None); else its count of held-out rows (0: none), and the strong
    family's note where its held-out row has no error (model.csv says why it could not be
    validated, e.g. "not identified: no multi-node run measured beta_inter"). The documents
    said "absent or without held-out rows" where model.csv held rows none of which was
    validated."""
    if model_rows is None:
        return []
    held = [r for r in model_rows if r.get("kind") == "holdout"]
    src = "model.csv kind=holdout"
    rows = [_row("model", "validation", "held_out_rows", len(held), "rows", src)]
    for r in held:
        if r.get("name") == "strong" and files.number(r.get("rel_error")) is None and r.get("note"):
            rows.append(_row("model", "validation", "strong_note", r["note"], "", f"{src} note"))
    return rows


def bases(members, kind: str = "throughput_basis") -> str:
    """The planner's bases of a request row's runs, each once in order, "; "-joined: their
    throughput_basis (one is "model, extrapolated": the documents name the rows the scaling
    model prices), or `kind` "energy_basis" (the level a J/img is from, ", evaluation
    included" where over the window's wall span, or why none: the documents name the rows
    whose kWh include the evaluations)."""
    return "; ".join(dict.fromkeys(getattr(e, kind) for e in members))


def cannot_run(members) -> str:
    """Why a request row's runs cannot run on the machine as priced (Estimate.cannot_split:
    one job past hardware.runtime_max, where they cannot go on in further jobs), the first
    run's reason and how many more; "" where they all can."""
    problems = [e.cannot_split for e in members if e.cannot_split]
    if len(problems) > 1:
        return f"{problems[0]} ({len(problems) - 1} more of its runs alike)"
    return "".join(problems)


def _strong_config(
    config: dict, world_sizes: list[int], repeats: int, epochs=None, whole_data: bool = False
) -> dict:
    """The study config reduced to strong-scaling runs at these world sizes (the planner prices
    them exactly as it prices the study's own runs); `whole_data`: on the whole training and
    test sets (production), not the study's train.limit_train / limit_test subset."""
    c = copy.deepcopy(config)
    if whole_data:
        c["train"] |= {"limit_train": 0, "limit_test": 0}
    for name in vocab.FAMILIES:
        c["families"][name]["enabled"] = name == "strong"
    c["families"]["strong"]["gpus"] = list(world_sizes)
    c["profiling"]["enabled"] = False  # training runs only (their profiling is priced apart)
    c["repeats"] = repeats
    if epochs is not None:
        c["train"]["epochs"] = epochs
    return c


def _fits(config: dict, w: int) -> bool:
    """A strong-scaling run of w ranks exists: the study's own checks (whole nodes, a whole
    local batch, a global batch the epoch holds) accept it."""
    return not semantic_problems(_strong_config(config, [w], NEXT_REPEATS))


def thin_reasons(points: list[dict], chosen: dict) -> dict[str, bool]:
    return {
        "few_world_sizes": len(points) < MIN_WORLD_SIZES,
        "no_repeats": min(p["n_"] for p in points) < MIN_REPEATS,
        "chosen_unmeasured": chosen["n_"] < 1,
    }


DOUBLED = "doubling the largest world size measured or configured"
HALVED = "halving the smallest world size measured or configured"


def next_runs(config, points, chosen, thin, measured, table):
    """({what: [Estimate]} of the runs that would make thin evidence strong: not yet done, and
    not runs of the study's own run table (`table`), which its "scaling study" rows price
    already (a strong size configured but not measured yet was priced there and again here);
    {new world size: how it was chosen, proposal.csv's source}; the world sizes planned)."""
    planned = {r["world_size"] for r in table if "strong" in r["families"].split(";")}
    # a configured strong size is covered: the study runs it, so it is no new world size
    sizes = sorted({p["w"] for p in points} | planned)
    # {world size: how it was chosen}, proposal.csv's source cell
    new = {} if chosen["n_"] or chosen["w"] in planned else {chosen["w"]: "the chosen scale"}
    top = w = max(sizes)
    while thin["few_world_sizes"] and len(sizes) + len(new) < MIN_WORLD_SIZES:
        w *= 2
        if not _fits(config, w):
            break  # the global batch or the node size admits no larger strong-scaling run
        new[w] = f"{top} x {w // top} ({DOUBLED})"
    low = min(sizes)  # a smaller world size is a point of the curve too (32 images on 32 ranks)
    by = 2
    while thin["few_world_sizes"] and len(sizes) + len(new) < MIN_WORLD_SIZES and low // by:
        if not _fits(config, w := low // by):
            break
        new[w] = f"{low} / {by}{', rounded down' if low % by else ''} ({HALVED})"
        by *= 2
    new = dict(sorted(new.items()))
    out = {}
    if new:
        c = _strong_config(config, new, NEXT_REPEATS)
        out["new world sizes"] = estimate_runs(c, build_run_table(c), measured, refuse=False)
    if thin["no_repeats"]:
        c = _strong_config(config, sizes, NEXT_REPEATS)
        runs = estimate_runs(c, build_run_table(c), measured, refuse=False)
        out["repeats"] = [e for e in runs if not e.done]
    study = {r["run"] for r in table}
    out = {k: [e for e in v if e.run not in study] for k, v in out.items()}
    return {k: v for k, v in out.items() if v}, new, len(sizes) + len(new)


# --- the request ---------------------------------------------------------------------------------
def _grouped(experiment: str, estimates) -> list[tuple[str, list]]:
    """One request row per allocation shape (nodes, GPUs), labelled by both: the label is the
    row's key in proposal.csv and the documents, so two shapes must never share one (1, 2 and
    4 GPUs all fit one node)."""
    by_shape: dict[tuple, list] = defaultdict(list)
    for e in estimates:
        by_shape[(e.nodes, e.gpus)].append(e)
    return [(_shape(experiment, n, g), members) for (n, g), members in sorted(by_shape.items())]


def _shape(experiment: str, nodes: int, gpus: int) -> str:
    where = f"{nodes} node{'s' if nodes > 1 else ''}"
    if not gpus:  # a CPU study: ranks, not GPUs, and the nodes say it all
        return f"{experiment}, {where}"
    return f"{experiment}, {gpus} GPU{'s' if gpus > 1 else ''} on {where}"


def planner_source(members, where: str | None, calibrate: bool = True) -> str:
    """The source cell of estimates: calibrated from the measured runs only where they are (a
    proposal without a runs.csv, or whose runs match none of the config's, or with
    plan.calibrate false, is priced by the planner's defaults, and says which). Counted as
    plan.md counts: calibrated in throughput (basis other than `default`); a run with the
    default throughput and only its start-up from the measured wall times apart, "in start-up
    only" (it was once counted calibrated: 18 of 18 runs where plan.md said 5 of 6)."""
    calibrated = sum(e.throughput_calibrated for e in members)
    startup = sum(e.startup_only for e in members)
    more = f", {startup} more in start-up only" if startup else ""
    if where is None:
        return f"{PLANNER}, not calibrated: no measured runs were read (its defaults)"
    if not calibrate:  # the runs were read, and match: "no run matches" was not the reason
        return f"{PLANNER}, not calibrated: plan.calibrate is false (its defaults)"
    if calibrated == len(members):
        return f"{PLANNER}, calibrated from {where}"
    if calibrated == 0 and not startup:
        return f"{PLANNER}, not calibrated: no run of {where} matches (its defaults)"
    return (
        f"{PLANNER}, calibrated from {where} in throughput for {calibrated} of "
        f"{len(members)} runs{more}"
    )


def request_rows(item: str, members, source: str, train: bool = True, calibrate: bool = True):
    """One row of the request table: runs x hours per run x nodes = node-hours (and GPUs)."""
    runs, nodes, gpus = len(members), members[0].nodes, members[0].gpus
    # each run's hours on its nodes: its resumptions' start-ups too (Estimate.held_s)
    hours = ceil3(sum(e.held_s for e in members) / runs / 3600)
    kwh = [e.energy_kwh for e in members]
    # plan.calibrate false: the planner reads no measured run, its J/img neither
    energy = ceil3(sum(kwh)) if None not in kwh else NOT_MEASURED if calibrate else NOT_USED
    values = {
        "runs": (runs, "runs"),
        "hours_per_run": (hours, "h"),
        "nodes": (nodes, "nodes"),
        "gpus_per_run": (gpus, "GPUs"),
        "node_hours": (runs * hours * nodes, "node-hours"),
        "gpu_hours": (runs * hours * gpus, "GPU-hours"),
        "energy_kwh": (energy if train else NOT_ESTIMATED, "kWh"),
    }
    return [_row("request", item, q, v, u, source) for q, (v, u) in values.items()]


def _decimal(x: Decimal) -> str:
    """A Decimal as a cell: fixed point, no trailing zeros (str() gives 0E-12 and 1.2E+2)."""
    return format(x.normalize(), "f")


def quantum(total: Decimal) -> Decimal:
    """The last of the CELL_DIGITS significant digits a cell of `total`'s size holds."""
    return Decimal(1).scaleb(total.adjusted() - CELL_DIGITS + 1)


def ceil_cell(x: Decimal, total: Decimal) -> Decimal:
    """x rounded up at quantum(total): a part of a printed sum that adds up to it exactly,
    never below x."""
    if total <= 0:
        return x
    q = quantum(total)
    return (x / q).to_integral_value(ROUND_CEILING) * q


def totals(
    rows: list[dict], contingency: float, proposal: dict, style: str, key: str
) -> list[dict]:
    """Subtotal, contingency and request from the printed cells, in Decimal: the printed
    subtotal is the sum of the printed rows and the request the printed subtotal plus the
    printed contingency (rounded up; with floats, 0.0833 of a subtotal printed a request below
    its parts). `key`: the config key the contingency fraction is from."""
    req = [r for r in rows if r["section"] == "request"]
    fraction = Decimal(cell(contingency))
    sub = {
        q: sum((Decimal(r["value"]) for r in req if r["quantity"] == q), Decimal(0))
        for q in ("node_hours", "gpu_hours")
    }
    cont = {q: ceil_cell(x * fraction, x * (1 + fraction)) for q, x in sub.items()}
    total = {q: sub[q] + cont[q] for q in sub}
    node_h, gpu_h = (_decimal(sub[q]) for q in sub)
    kwh = [r["value"] for r in req if r["quantity"] == "energy_kwh" and r["value"] != NOT_ESTIMATED]
    words = [x for x in kwh if x in ENERGY_WORDS]  # a training row without kWh: no total
    energy = words[0] if words else _decimal(sum(map(Decimal, kwh), Decimal(0)))
    src = "sum of the request rows"
    out = [
        _row("total", "subtotal", "node_hours", node_h, "node-hours", src),
        _row("total", "subtotal", "gpu_hours", gpu_h, "GPU-hours", src),
        _row("total", "contingency", "fraction", contingency, "fraction", key),
        _row(
            "total",
            "contingency",
            "node_hours",
            _decimal(cont["node_hours"]),
            "node-hours",
            "fraction x subtotal, rounded up",
        ),
        _row(
            "total",
            "contingency",
            "gpu_hours",
            _decimal(cont["gpu_hours"]),
            "GPU-hours",
            "fraction x subtotal, rounded up",
        ),
        _row(
            "total",
            "request",
            "node_hours",
            _decimal(total["node_hours"]),
            "node-hours",
            "subtotal + contingency",
        ),
        _row(
            "total",
            "request",
            "gpu_hours",
            _decimal(total["gpu_hours"]),
            "GPU-hours",
            "subtotal + contingency",
        ),
        _row(
            "total",
            "request",
            "energy_kwh",
            energy,
            "kWh",
            "training rows' GPU kWh, no contingency",
        ),
    ]
    return out + periods((total["node_hours"], total["gpu_hours"]), proposal, style)


def periods(total: tuple[Decimal, Decimal], proposal: dict, style: str) -> list[dict]:
    """The request by period: months / total_months of it each, to a cell's digits, and the
    last one the rest, so that the printed periods add up to the printed request (each rounded
    on its own, they did not, and could fall short of it)."""
    months, key = proposal["period_months"], "proposal.period_months"
    if months is None and style == "archer2":
        months = min(ARCHER2_PERIOD_MONTHS, proposal["total_months"])
        key = f"ARCHER2's {ARCHER2_PERIOD_MONTHS}-month periods (proposal.period_months null)"
    if months is None:
        return []
    total_months, out, start = proposal["total_months"], [], 0
    count = math.ceil(total_months / months)
    given = [Decimal(0), Decimal(0)]
    digits = Context(prec=CELL_DIGITS)
    for i in range(count):
        m = min(months, total_months - start)
        # the last period: what is left of total_months
        where = key if m == months else "proposal.total_months - the earlier periods"
        if i < count - 1:
            src = "request x months / total_months"
            shares = [digits.create_decimal(t * m / total_months) for t in total]
        else:
            src = "request - the earlier periods"
            shares = [t - g for t, g in zip(total, given, strict=True)]
        given = [g + x for g, x in zip(given, shares, strict=True)]
        item = f"period {i + 1}"
        out += [
            _row("period", item, "months", m, "months", where),
            _row("period", item, "node_hours", _decimal(shares[0]), "node-hours", src),
            _row("period", item, "gpu_hours", _decimal(shares[1]), "GPU-hours", src),
        ]
        start += m
    return out


# --- proposal.csv --------------------------------------------------------------------------------
def proposal_rows(
    config: dict, scaling: list[dict], measured: list[dict], model_rows: list[dict] | None
) -> list[dict]:
    """Every number of the proposal that no other CSV holds, with its source or formula.
    model_rows: model.csv's, None where it is absent."""
    p, style = config["proposal"], config["proposal"]["style"]
    threshold = p["efficiency_threshold"]
    # the value and the key it is from (the source cells named proposal.contingency for null)
    contingency, contingency_key = (
        (config["plan"]["contingency"], "plan.contingency")
        if p["contingency"] is None
        else (p["contingency"], "proposal.contingency")
    )
    points = strong_points(scaling, config["families"]["strong"]["enabled"])
    chosen, below = choose_scale(points, threshold)
    # measured under another families.strong (the check _fits makes, its first problem named)
    if problems := semantic_problems(_strong_config(config, [chosen["w"]], NEXT_REPEATS)):
        raise AnalysisError(
            f"the chosen scale, {chosen['w']} ranks, is no strong-scaling run of this config "
            f"({problems[0]}): scaling.csv was measured with other families.strong settings; give "
            "the study's own config, or run the study again (`snakemake`)"
        )
    # measured on other nodes than this config places the chosen scale on (hardware.gpus_per_node
    # changed): the documents named scaling.csv's node count beside production rows priced on
    # this config's, two allocation shapes for one scale
    config_nodes = placement(chosen["w"], config["hardware"]["gpus_per_node"])[0]
    if files.number(chosen["nodes"]) != config_nodes:
        raise AnalysisError(
            f"the chosen scale, {chosen['w']} ranks, ran on {chosen['nodes']} "
            f"{vocab.plural('nodes', files.number(chosen['nodes']))} in scaling.csv, and this "
            f"config places it on {config_nodes} "
            f"(hardware.gpus_per_node {config['hardware']['gpus_per_node']}): scaling.csv was "
            "measured with another hardware.gpus_per_node; give the study's own config, or run "
            "the study again (`snakemake`)"
        )
    thin = thin_reasons(points, chosen)
    rows = [
        _row("evidence", "strong family", "world_sizes", len(points), "world sizes", "scaling.csv"),
        _row(
            "evidence",
            "strong family",
            "min_repeats",
            min(q["n_"] for q in points),
            "runs",
            "scaling.csv n",
        ),
        _row("evidence", "bar", "world_sizes", MIN_WORLD_SIZES, "world sizes", "proposal.py"),
        # the bar thin_reasons judges against; the next runs repeat more often (NEXT_REPEATS)
        _row("evidence", "bar", "repeats", MIN_REPEATS, "runs", "proposal.py"),
        _row("evidence", "runs to add", "repeats", NEXT_REPEATS, "runs", "proposal.py"),
        *[_row("evidence", "thin", k, "yes" if v else "no") for k, v in thin.items()],
        _row(
            "scale",
            "threshold",
            "strong_efficiency",
            threshold,
            "fraction",
            "proposal.efficiency_threshold",
        ),
        _row("scale", "chosen", "world_size", chosen["w"], "ranks", "largest E_s >= threshold"),
        _row("scale", "chosen", "nodes", chosen["nodes"], "nodes", "scaling.csv"),
        _row(
            "scale",
            "chosen",
            "gpus_per_node",
            config["hardware"]["gpus_per_node"],
            "ranks",
            "hardware.gpus_per_node",
        ),
    ]
    if below is not None:
        rows.append(_row("scale", "first below", "world_size", below["w"], "ranks", "scaling.csv"))
        # a larger world size back at or above the threshold: the rule takes the first fall
        # (every smaller scale must hold it), which the documents then say, with where E_s is
        # back, rather than call the fall a knee
        if again := above_again(points, below, threshold):
            source = "scaling.csv: the largest E_s >= threshold past the first fall"
            rows.append(_row("scale", "above again", "world_size", again["w"], "ranks", source))
    rows += holdout_rows(holdout(model_rows or []))
    rows += validation_rows(model_rows)
    table = build_run_table(config)
    nxt, new_sizes, planned = next_runs(config, points, chosen, thin, measured, table)
    for w, how in new_sizes.items():  # one item each: (section, item, quantity) keys one cell
        rows.append(_row("next", f"new world size {w}", "world_size", w, "ranks", how))
    # strong sizes of the study not measured yet: asked for in its own rows (the documents
    # said a scale beyond the measured ones "is not asked for")
    configured = {r["world_size"] for r in table if "strong" in r["families"].split(";")}
    for w in sorted(configured - {q["w"] for q in points}):
        rows.append(
            _row(
                "evidence",
                f"configured world size {w}",
                "world_size",
                w,
                "ranks",
                "families.strong.gpus, not measured yet: in the scaling study's rows",
            )
        )
    req: list[dict] = []
    priced: list = []  # every training estimate of the request, for the calibration rows
    production_images = None  # a production run's images per epoch, where one is requested
    where = measured[0].get(SOURCE, RUNS_CSV) if measured else None
    calibrate = config["plan"]["calibrate"]

    def planner_rows(item, members):  # a request row of the planner's, its source cell says how
        basis = _row("request", item, "basis", bases(members), "", BASIS_SOURCE)
        energy_basis = bases(members, "energy_basis")
        energy = _row("request", item, "energy_basis", energy_basis, "", ENERGY_BASIS_SOURCE)
        source = planner_source(members, where, calibrate)
        # a run past hardware.runtime_max that cannot go on in more jobs (no checkpoints, too
        # few retries) is priced as one job the machine would not start: said beside its row
        why = cannot_run(members)
        refused = [_row("request", item, "cannot_run", why, "", CANNOT_RUN_SOURCE)] if why else []
        return [*request_rows(item, members, source, True, calibrate), basis, energy, *refused]

    # the study's runs as plan.md has them (under plan.calibrate false the planner reads no
    # measured run, so none is done): their profiling jobs' limits, and the refusal of a run
    # not measured yet that cannot go on past hardware.runtime_max; the request rows price
    # every run again below (`again`); the evidence counts the measured runs all the same
    study = estimate_runs(config, table, measured if calibrate else [])
    # what the documents say of thin evidence the next runs cannot fix: fewer world sizes than
    # the bar even with the new ones, or gaps that the study's own runs not measured yet fill
    rows += [
        _row(
            "evidence",
            "planned",
            "world_sizes",
            planned,
            "world sizes",
            "measured, configured (families.strong.gpus) and new",
        ),
        _row(
            "evidence",
            "study",
            "runs_not_measured",
            runs_done(config, table, measured).count(False),
            "runs",
            "the run table's runs without a measurement in runs.csv",
        ),
    ]
    # the campaign trains the study again, its measured runs too: each priced as a run still to
    # train (the jobs it goes on in past hardware.runtime_max, their start-ups held; where it
    # cannot go on, said beside its row). A measured run was priced as the one job it had been:
    # a repeat cost less measured than not, and a study the machine cannot run was asked for
    # without a word
    again = estimate_runs(config, table, measured if calibrate else [], refuse=False, new=True)
    for item, members in _grouped("scaling study", again):
        req += planner_rows(item, members)
        priced += members
    for what, estimates in nxt.items():
        for item, members in _grouped(f"next runs ({what})", estimates):
            req += planner_rows(item, members)
            priced += members
    if p["production"]["runs"]:
        epochs = p["production"]["epochs"] or config["train"]["epochs"]
        key = "proposal.production.epochs" if p["production"]["epochs"] else "train.epochs"
        c = _strong_config(config, [chosen["w"]], p["production"]["runs"], epochs, True)
        rows.append(_row("production", "run", "epochs", epochs, "epochs", key))
        table = build_run_table(c)
        # the whole training set: the demo measures on 2048 of CIFAR-10's 50,000 images, and
        # production priced on those was 20x too low
        production_images = dataset_sizes(c, table[0])[0]
        rows.append(
            _row("production", "run", "train_images_per_epoch", production_images, "images",
                 "the whole training set (train.limit_train limits the study's runs only), "
                 "whole global batches: study/estimate.py N_train")
        )  # fmt: skip
        # priced on the machine (one job where it cannot go on in more), not refused as the
        # study's jobs are: a production run past hardware.runtime_max stopped the proposal
        # at its end, naming the study's run of the same id
        production = estimate_runs(c, table, measured, refuse=False, new=True)
        for shape, members in _grouped("production", production):
            # a GPU study: "production, 2 GPUs on 1 node", as the other rows; a CPU one its ranks
            ranks = f"{chosen['w']} {report.plural('ranks', chosen['w'])}"
            item = shape if members[0].gpus else f"production at {ranks}"
            req += planner_rows(item, members)
            priced += members
    # as plan.md counts: calibrated in throughput; the default throughput with a measured
    # start-up apart (the documents say "N more in start-up only")
    calibrated = sum(e.throughput_calibrated for e in priced)
    startup = sum(e.startup_only for e in priced)
    src = planner_source(priced, where, calibrate)
    rows.append(_row("planner", "calibration", "runs_priced", len(priced), "runs", src))
    rows.append(_row("planner", "calibration", "runs_calibrated", calibrated, "runs", src))
    rows.append(_row("planner", "calibration", "runs_startup_only", startup, "runs", src))
    jobs = profiling.profiling_jobs(config, build_run_table(config), {e.run: e for e in study})
    for rule in dict.fromkeys(j.rule for j in jobs):  # a row's jobs of one rule: like limits
        for item, members in _grouped(f"profiling ({rule})", [j for j in jobs if j.rule == rule]):
            req += request_rows(item, members, PROFILING_SOURCE, train=False)
    rows += req
    rows += totals(rows, contingency, p, style, contingency_key)
    if style == "ercap":
        nodes = [int(r["value"]) for r in req if r["quantity"] == "nodes"]
        node_h = defaultdict(float)
        for r in req:
            if r["quantity"] == "node_hours":
                node_h[r["item"]] = float(r["value"])
        by_item = {r["item"]: int(r["value"]) for r in req if r["quantity"] == "nodes"}
        typical = by_item[max(node_h, key=node_h.get)]
        rows += [
            _row("ercap", "nodes", "max", max(nodes), "nodes", "largest request row"),
            _row("ercap", "nodes", "typical", typical, "nodes", "row with the most node-hours"),
        ]
    rows += [
        _row(
            "time",
            "allocation",
            "total_months",
            p["total_months"],
            "months",
            "proposal.total_months",
        ),
        *_texts(config, production_images),
    ]
    return rows


def _texts(config: dict, production_images: int | None = None) -> list[dict]:
    """The configured words the documents print (their digits are claims too: cells here);
    production_images: the images per epoch of a production run (None: none requested)."""
    p, train = config["proposal"], config["train"]
    epochs = p["production"]["epochs"] or train["epochs"]
    texts = {
        "title": p["title"] or f"Allocation proposal: {config['study']}",
        "pi": p["pi"],
        "machine": p["machine"] or "the target system",
        "objectives": p["objectives"]
        or f"Measure and use the data-parallel scaling of {train['model']} training with "
        f"{vocab.STRATEGY_NAMES[train['strategy']]} on {config['dataset']}: find the largest "
        "scale that stays efficient"
        + (" and run the production training there." if p["production"]["runs"] else "."),
        "production": p["production"]["description"]
        or f"{train['model']} on {config['dataset']}"
        + (
            f" (the whole training set, in whole global batches: {production_images} images "
            "per epoch)"
            if production_images is not None
            else ""
        )
        + f", {epochs} {vocab.plural('epochs', epochs)}, "
        f"{p['production']['runs']} {vocab.plural('runs', p['production']['runs'])} at the "
        "chosen scale",
        # no container digest claimed here: the documents say what the runs recorded (a study
        # with container.enabled false records none: system.csv "not recorded")
        "data": p["data"]
        or "Results (CSV, figures, reports) are written under results/ and reports/ of the study "
        "directory (not in git: archived with the git commit each run records)"
        + (
            "; container images under containers/ are rebuilt from their definition and "
            "identified by their sha256 digest."
            if config["container"]["enabled"]
            else "."
        ),
        "dataset terms": DATA_TERMS[config["dataset"]],
        "container image": config["container"]["image"] if config["container"]["enabled"] else "",
    }
    return [_row("text", k, "text", v, "", "config proposal:") for k, v in texts.items()]


# --- rendering -----------------------------------------------------------------------------------
def _lookup(rows: list[dict]) -> dict:
    out: dict = defaultdict(dict)
    for r in rows:
        out[(r["section"], r["item"])][r["quantity"]] = r["value"]
    return out


def _calibration(cells: dict) -> str:
    """ "all", "none" or "some" of the priced runs calibrated in throughput (a run calibrated
    in start-up only is not: the documents name those apart)."""
    calibrated, priced = int(cells["runs_calibrated"]), int(cells["runs_priced"])
    return "all" if calibrated == priced else "none" if calibrated == 0 else "some"


def context(tables: dict, rows: list[dict], config: dict, figure_dir: str) -> dict:
    ctx = report.context(tables, [], figure_dir)
    v = _lookup(rows)
    items = lambda s: list(dict.fromkeys(r["item"] for r in rows if r["section"] == s))  # noqa: E731
    style = config["proposal"]["style"]
    thin = {k: v[("evidence", "thin")][k] == "yes" for k in v[("evidence", "thin")]}
    strong = [r for r in tables["scaling"] if r["family"] == "strong"]
    new_sizes = [r["value"] for r in rows if r["section"] == "next"]
    has_holdout = ("model", "holdout") in v
    held_out = v.get(("model", "validation"), {}).get("held_out_rows")  # None: no model.csv
    validation = (
        "absent" if held_out is None else "no rows" if held_out == "0" else "none validated"
    )
    asked = [(w, "next runs") for w in new_sizes] + [
        (r["value"], "the study's own runs, not measured yet")
        for r in rows
        if r["item"].startswith("configured world size")
    ]
    # the planner's request rows, and those whose kWh are over the window's wall span (its
    # evaluations included) for all their runs or for some (a row's runs of several families
    # or precisions each have their J/img): the documents name them, or, all of them so, say
    # it of the whole total
    planned = [i for i in items("request") if "energy_basis" in v[("request", i)]]
    walls = {i: [WITH_EVALUATION in b for b in v[("request", i)]["energy_basis"].split("; ")]
             for i in planned}  # fmt: skip
    evaluated = [i for i in planned if all(walls[i])]
    partly = [i for i in planned if any(walls[i]) and not all(walls[i])]
    ctx.update(
        P=v,
        text={k[1]: q["text"] for k, q in v.items() if k[0] == "text"},
        strong=strong,
        request_items=items("request"),
        # the request rows whose runs cannot run as priced, and why (cannot_run)
        refused_items=[
            (i, v[("request", i)]["cannot_run"])
            for i in items("request")
            if "cannot_run" in v[("request", i)]
        ],
        next_items=[i for i in items("request") if i.startswith("next runs")],
        periods=items("period"),
        thin=thin,
        is_thin=any(thin.values()),
        style=style,
        sections=section_titles(style, ("scale", "above again") in v),
        figure="efficiency",
        has_holdout=has_holdout,
        # the scaling model validated: held-out errors, and no configuration below the compute
        # (else its error "is no validation")
        model_validated=has_holdout and v[("model", "fit")].get("below_compute") in (None, "0"),
        # why it has none: model.csv "absent", "no rows" held out, or "none validated"
        validation=validation,
        # the rows whose kWh hold the evaluations (all their runs, some), or every row's
        evaluation_items=evaluated,
        evaluation_partly=partly,
        evaluation_all=bool(evaluated) and len(evaluated) == len(planned),
        # the request rows (item, bases) the scaling model prices: the documents name them
        model_items=[
            (i, v[("request", i)]["basis"])
            for i in items("request")
            if set(v[("request", i)].get("basis", "").split("; ")) & set(MODEL_BASES)
        ],
        rescaled_items=[
            i
            for i in items("request")
            if RESCALED_BASIS in v[("request", i)].get("basis", "").split("; ")
        ],
        has_below=("scale", "first below") in v,
        has_above_again=("scale", "above again") in v,
        has_production=("production", "run") in v,
        # thin evidence: runs of the study not measured yet, in its own request rows; fewer
        # world sizes than the bar even with the new ones (none fits the global batch)
        pending=int(v[("evidence", "study")]["runs_not_measured"]),
        short=int(v[("evidence", "planned")]["world_sizes"])
        < int(v[("evidence", "bar")]["world_sizes"]),
        # "all", "none" or "some" of the priced runs calibrated (in throughput) from the
        # measured ones; those calibrated in start-up only, and whether any run is neither
        calibration=_calibration(v[("planner", "calibration")]),
        startup_only=v[("planner", "calibration")]["runs_startup_only"],
        uncalibrated=sum(int(v[("planner", "calibration")][k]) for k in CALIBRATION_PARTS)
        < int(v[("planner", "calibration")]["runs_priced"]),
        calibrate=config["plan"]["calibrate"],  # false: "none", and the reason
        energy_words=ENERGY_WORDS,  # energy cells the documents print as words
        new_sizes=new_sizes,
        # world sizes beyond the largest measured that the request prices, and where
        larger=sorted(
            ((w, how) for w, how in asked if int(w) > max(int(r["world_size"]) for r in strong)),
            key=lambda x: int(x[0]),
        ),
        # GPU-hours and GPU energy apply to a GPU study only: a CPU study's 0 GPUs per run are
        # shown as n/a, not as a measured "0 GPU-hours"
        gpu_study=ctx["system"].get(("study", "device")) == "cuda",
    )
    return ctx


def render(
    tables: dict,
    rows: list[dict],
    config: dict,
    templates: Path,
    figure_dir: str,
    figure_missing: bool = False,
):
    """The documents; figure_missing: the slides' figure is not there (the slide says so, and
    pdfLaTeX does not fail on it)."""
    ctx = context(tables, rows, config, figure_dir)
    ctx["figure_missing"] = figure_missing
    md, tex = report.environment(templates)
    envs = {"md": md, "tex": tex}
    docs = {
        name: envs[kind].get_template(f"{name}.j2").render(ctx) for name, kind in DOCUMENTS.items()
    }
    report.warn_unsettable(tex, [name for name, kind in DOCUMENTS.items() if kind == "tex"])
    return docs


def proposal_csv(csv_dir: str | Path, out_csv: str | Path | None) -> Path:
    """Where proposal.csv goes: --out-csv, else --csv-dir's (the workflow's)."""
    return Path(out_csv) if out_csv else Path(csv_dir) / "proposal.csv"


def check_device(config: dict, system: list[dict], csv_dir: Path) -> None:
    """The study measured on the device this config prices on (hardware.device): a GPU study's
    CSVs with the CPU demo's config priced 0 GPU-hours and "not measured" energy beside its
    measured J/img, and a CPU study's with device cuda GPU-hours its documents said do not
    apply. A study of both devices, or an older system.csv without the row, is let be."""
    ran = next((r["value"] for r in system if (r["section"], r["key"]) == ("study", "device")), "")
    want = config["hardware"]["device"]
    if ran in vocab.STUDY_DEVICES and ran != want:
        raise AnalysisError(
            f"{csv_dir}/system.csv: the study ran on {ran}, and this config prices on "
            f"hardware.device {want}: give the study's own config, or run the study again "
            "(`snakemake`)"
        )


def write_proposal(
    config: dict,
    csv_dir: str | Path = "results/csv",
    out_dir: str | Path = "reports",
    templates: str | Path = report.TEMPLATES,
    model_csv: str | Path = MODEL_CSV,
    runs_csv: str | Path = RUNS_CSV,
    benchmarks_dir: str | Path = BENCHMARKS_DIR,
    figure_dir: str = "../results/plots",
    out_csv: str | Path | None = None,
) -> list[dict]:
    """proposal.csv's cells, the documents from them and the analysis CSVs (honesty checked),
    then all of it written: a failure leaves no new proposal.csv beside old documents.
    `out_csv`: where proposal.csv goes (None: `csv_dir`'s, the workflow's)."""
    csv_dir = Path(csv_dir)
    tables = report.load_tables(csv_dir, report.ANALYSIS_TABLES)  # model.csv: optional, below
    measured = load_measured(runs_csv, benchmarks_dir)
    check_device(config, tables["system"], csv_dir)
    if Path(model_csv).is_file():  # optional: without it the text says there is no validation
        tables["model"] = checked_model(model_csv)
    # None: model.csv absent (the documents say so, apart from one without held-out rows)
    rows = proposal_rows(config, tables["scaling"], measured, tables.get("model"))
    text = files.csv_text(COLUMNS, rows)
    tables["proposal"] = list(csv.DictReader(io.StringIO(text)))  # the cells as written
    missing = [
        m
        for m in report.missing_figures(Path(out_dir), figure_dir, ["efficiency"])
        if m.endswith("pdf")
    ]
    try:
        docs = render(
            tables, tables["proposal"], config, Path(templates), figure_dir, bool(missing)
        )
    except jinja2.TemplateNotFound as exc:
        raise AnalysisError(f"--templates {templates}: no template {exc.name} there") from exc
    except jinja2.UndefinedError as exc:
        raise report.stale_csvs(csv_dir, exc) from exc
    except (jinja2.TemplateError, UnicodeDecodeError) as exc:
        raise report.template_error(templates, exc) from exc
    report.check_numbers(docs, tables, (figure_dir,))
    outputs = {proposal_csv(csv_dir, out_csv): text}
    outputs.update((Path(out_dir) / name, doc) for name, doc in docs.items())
    files.check_outputs(outputs, AnalysisError)  # else a new proposal.csv beside old docs
    before = report.texts_before(outputs)
    files.write_texts(outputs)  # all or none: a full disk at slides.tex leaves every file old
    for path in outputs:
        logger.info(f"wrote {path}")
    report.drop_stale_pdfs(outputs, before)
    if missing:
        logger.warning(
            f"WARNING slides.tex: {', '.join(missing)} not found: the slide says so instead of "
            "showing it (make it with `snakemake results/plots/efficiency.png`)"
        )
    return rows


# --- CLI -----------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--csv-dir", default="results/csv", help="analysis CSVs (%(default)s)")
    parser.add_argument(
        "--model-csv",
        default=None,
        help="the scaling model's (default: model.csv of --csv-dir, if it exists)",
    )
    add_measured_arguments(
        parser,
        "runs.csv of --csv-dir",
        f"{BENCHMARKS_DIR} of the study whose results/csv --csv-dir is, else of the working "
        "directory",
    )
    parser.add_argument("--templates", default=str(report.TEMPLATES), help="%(default)s")
    parser.add_argument("--figure-dir", default="../results/plots", help="relative to --out-dir")
    parser.add_argument("--out-dir", default="reports")
    parser.add_argument(
        "--out-csv",
        default=None,
        help="where proposal.csv goes (default: --csv-dir's; give one elsewhere to leave the "
        "CSVs of the study read untouched)",
    )


def study_measured_paths(
    csv_dir: str, runs_csv: str | None, benchmarks: str | None
) -> tuple[Path, Path]:
    """(runs.csv, job benchmarks) the proposal is priced from: those given, else --csv-dir's
    runs.csv and, where --csv-dir is a study's results/csv, that study's benchmarks/train (the
    working directory's otherwise), not the working directory's: `--csv-dir B/results/csv` run
    from study A's directory priced B at A's measured throughput."""
    csv_path = Path(csv_dir)
    study = csv_path.parent.parent if csv_path.parts[-2:] == ("results", "csv") else Path()
    return (
        given_path(runs_csv, "--runs-csv", csv_path / "runs.csv"),
        given_path(benchmarks, "--benchmarks", study / BENCHMARKS_DIR, directory=True),
    )


def run(args: argparse.Namespace) -> int:
    # a StudyConfigError, PlanError or AnalysisError: one line from cli.main, exit 2
    config = load_layers(args.config, overrides=args.set)
    runs_csv, benchmarks = study_measured_paths(args.csv_dir, args.runs_csv, args.benchmarks)
    # the analysis CSVs' own model.csv, not the working directory's: a --csv-dir elsewhere
    # silently read results/csv/model.csv, or none
    model_csv = given_path(args.model_csv, "--model-csv", Path(args.csv_dir) / "model.csv")
    check_paths(args, runs_csv, model_csv)
    write_proposal(
        config,
        args.csv_dir,
        args.out_dir,
        args.templates,
        model_csv,
        runs_csv,
        benchmarks,
        args.figure_dir,
        args.out_csv,
    )
    return 0


def check_paths(args: argparse.Namespace, runs_csv: Path, model_csv: Path) -> None:
    """Before any work: two outputs one file (--out-csv inside --out-dir as proposal.md: the
    document written, proposal.csv never, and both said written), or an output one of the
    inputs (--out-csv over the study config or an analysis CSV: the config replaced by a CSV,
    every later command refused), as plan's and analyze's."""
    csv_dir, out_dir = Path(args.csv_dir), Path(args.out_dir)
    outputs = {"--out-csv": proposal_csv(csv_dir, args.out_csv)}
    outputs |= {f"{name} of --out-dir": out_dir / name for name in DOCUMENTS}
    inputs = {
        f"{name}.csv of --csv-dir": csv_dir / f"{name}.csv" for name in report.ANALYSIS_TABLES
    }
    inputs |= {"--model-csv" if args.model_csv else "model.csv of --csv-dir": model_csv}
    inputs |= {"--runs-csv" if args.runs_csv else "runs.csv of --csv-dir": runs_csv}
    inputs |= config_inputs(args.config)
    files.check_distinct(outputs, inputs, AnalysisError)
