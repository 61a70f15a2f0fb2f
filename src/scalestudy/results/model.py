"""`scalestudy model`: results/csv/runs.csv -> results/csv/{model,bucket_advice}.csv.

The scaling model, its held-out validation and the bucket advisor are study/model.py (formulas
in its docstring); this command writes them as two tidy tables, every number a cell:

model.csv, one row per fact, `kind` says which (blank cells: not applicable or not known):
    kind          name                        what
    parameter     alpha_s, beta_intra_Bps,    value, std (1 sigma), unit; note "not identified"
                  beta_inter_Bps              (no value) when the runs cannot tell it; "not
                  (inv_beta_*_s_per_B)        resolved from 0" when alpha or 1/beta is within
                                              2 std of 0 (beta then has no value: no upper
                                              bound)
    parameter     compute_c0_s,               per precision: C_p(b) = c0 + c1 b from 1-rank runs
                  compute_c1_s_per_img,       and the backward share of the step, another
                  backward_frac               precision's where its own 1-rank runs timed none
                                              (whole-step CUDA graphs: backward_frac's note
                                              says whose, compute_c0_s's why)
    parameter     fit_points, fit_dof,        the fit's size and its relative residual sd
                  fit_residual_rel_sd,        and the level of the lo-hi intervals
                  interval_level
    parameter     fit_below_compute           the multi-rank configurations measured shorter
                                              than their 1-rank compute C(b) beyond noise
                                              (study/model.py below_compute); > 0: the note
                                              says the model cannot describe these runs, the
                                              held-out notes "no validation", no advice
    fit           the configuration's runs    measured: T = global_batch / X (s), X the mean
                                              throughput over the n repeats; measured_std:
                                              T s_X / X (s_X their sample std; blank with one
                                              repeat); vs predicted, lo, hi (95%), rel_error
    holdout       the family                  its largest world size predicted by a fit without
                                              any run there; note "not validated: ..." when it
                                              cannot be
    not_modelled  the run, or the             note: why (strategy, no grad_sync_bytes, ..., or
                  configuration's runs        no compute of its precision: the 1-rank runs'
                                              reason, e.g. no phase_frac_backward); the log
                                              line counts them
    columns: MODEL_COLUMNS. rel_error = predicted / measured - 1.

bucket_advice.csv, one row per multi-rank (world_size, nodes) x bucket-family (precision,
local_batch, grad_sync_bytes: the bytes DDP's buckets hold, twice runs.csv's under the fp16 and
bf16 comm hooks, which send each fp32 bucket as 16 bits): the recommended bucket_cap_mb, its
bucket count, the predicted step time there and at DDP's default 25 MiB, gain = default / best
- 1, extrapolated (true / false: the recommended bucket count is outside those the runs
measured, the bucket sweep has no run at that world_size and nodes, or the prediction is beyond
the measured runs: a world size above the largest measured on its kind of link, more ranks per
node than any measured run, or a local batch outside the 1-rank runs', study/model.py
EXTRAPOLATED; the note says which); or note "not enough data: ..." and blanks.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from scalestudy import files, log
from scalestudy.errors import AnalysisError
from scalestudy.results.analyze import (
    RUNS_COUNTS,
    RUNS_CSV,
    RUNS_FIX,
    RUNS_OPTIONAL,
    cell,
    check_runs,
    read_csv,
)
from scalestudy.study import model

logger = log.get(__name__)

POINT_COLUMNS = ("precision", "local_batch", "world_size", "nodes", "bucket_cap_mb")
MODEL_COLUMNS = (
    "kind",
    "name",
    *POINT_COLUMNS,
    "measured",
    "measured_std",
    "n",
    "predicted",
    "lo",
    "hi",
    "rel_error",
    "value",
    "std",
    "unit",
    "note",
)
ADVICE_COLUMNS = (
    "world_size",
    "nodes",
    "precision",
    "local_batch",
    "grad_sync_bytes",
    "bucket_cap_mb",
    "buckets",
    "predicted_step_s",
    "default_bucket_cap_mb",
    "default_step_s",
    "gain",
    "extrapolated",
    "note",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", default="results/csv/runs.csv")
    parser.add_argument("--out-dir", default="results/csv", help="where the two CSVs go")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out_dir)
    model_csv, advice_csv = out / "model.csv", out / "bucket_advice.csv"
    outputs = {f"{path.name} of --out-dir": path for path in (model_csv, advice_csv)}
    # the runs given as --out-dir's model.csv: replaced by the model of themselves, said done
    files.check_distinct(outputs, {"--runs": args.runs}, AnalysisError)
    rows = read_csv(args.runs, " (one row per run)", RUNS_CSV, "--runs")
    if not rows:
        raise AnalysisError(f"{args.runs} has no runs: {RUNS_FIX}")
    # damage names this file, not a truncated fit
    numbers = (*RUNS_COUNTS, "throughput_img_s", "bucket_cap_mb")
    optional = (*RUNS_OPTIONAL, "grad_sync_bytes")  # blank: the run is not modelled
    check_runs(rows, args.runs, ("strategy", "precision"), numbers, optional)
    try:  # a cell only the model reads: one line naming the file, before anything is written
        pts, skipped = model.points(rows)
    except AnalysisError as exc:
        raise AnalysisError(f"{args.runs}: {exc}") from None
    compute = model.fit_compute(pts)  # once: the fit, its rows and the left-out list read it
    fit = model.fit_points(pts, compute)
    if fit == model.NO_MULTI_RANK:
        fit = _left_out_why(fit, rows, skipped)
    # configurations without a compute of their precision: no fit row, a not_modelled one
    unmodelled = model.without_compute(pts, compute)
    table = model_table(pts, [*skipped, *unmodelled], fit, compute)
    advice = [vars(a) for a in model.advise(None if isinstance(fit, str) else fit, pts)]
    files.check_outputs(outputs.values(), AnalysisError)
    files.write_texts(  # both or neither: a full disk at the second leaves both old
        {
            model_csv: files.csv_text(MODEL_COLUMNS, table, cell),
            advice_csv: files.csv_text(ADVICE_COLUMNS, map(_advice_row, advice), cell),
        }
    )
    logger.info(
        f"modelled {len(pts) - len(unmodelled)} configurations ({len(skipped)} runs and "
        f"{len(unmodelled)} configurations not: model.csv's not_modelled rows say why) -> {out}"
    )
    if isinstance(fit, str):
        logger.warning(f"no scaling fit: {fit}")
    return 0


def _left_out_why(why: str, rows: list[dict], skipped: list[tuple[str, str]]) -> str:
    """`why` with the reasons the study's multi-rank runs were left out (model.points), where it
    has some: "no multi-rank ddp configuration" alone stood in both documents beside their
    table of 2- and 4-rank DDP runs."""
    left = dict(skipped)
    multi = [left[r["run"]] for r in rows if r["run"] in left and int(r["world_size"]) > 1]
    return f"{why} modelled: {'; '.join(dict.fromkeys(multi))}" if multi else why


def model_table(pts: list, not_modelled: list, fit, compute: dict) -> list[dict]:
    """model.csv's rows; `not_modelled`: (run or configuration, why), the runs model.points
    skipped and the configurations without a compute of their precision (1-rank ones too,
    with or without a fit: model.without_compute); `compute`: model.fit_compute(pts)."""
    rows = [_param_rows(fit), _compute_rows(compute), _fit_rows(pts, fit), _holdout_rows(pts)]
    rows.append([dict(kind="not_modelled", name=run, note=why) for run, why in not_modelled])
    return [row for group in rows for row in group]


def _point(p) -> dict:
    return {c: getattr(p, c) for c in POINT_COLUMNS}


def _param_rows(fit) -> list[dict]:
    if isinstance(fit, str):
        return [dict(kind="parameter", name="fit", note=f"no fit: {fit}")]
    rows = [_alpha(fit)]
    for i, where in ((1, "intra"), (2, "inter")):
        rows += [_inv_beta(fit, i, f"inv_beta_{where}_s_per_B"), _beta(fit, i, f"beta_{where}_Bps")]
    resid = dict(value=fit.resid_sd, unit="1", note="relative: T_model / T - 1")
    return [
        *[dict(kind="parameter", **r) for r in rows],
        dict(kind="parameter", name="fit_points", value=len(fit.points), unit="configurations"),
        dict(kind="parameter", name="fit_dof", value=fit.dof, unit="1"),
        dict(kind="parameter", name="fit_residual_rel_sd", **resid),
        dict(kind="parameter", name="fit_below_compute", value=len(fit.below_compute),
             unit="configurations", note=fit.misfit),
        dict(kind="parameter", name="interval_level", value=model.LEVEL, unit="1",
             note="two-sided prediction intervals (lo, hi)"),
    ]  # fmt: skip


def _std(fit, i: int) -> float | None:
    return None if math.isnan(fit.std[i]) else float(fit.std[i])


def _alpha(fit) -> dict:
    """alpha as fitted, its value and std; the note says when it is not resolved from 0 (the
    demo's fit pinned it at its bound: 1.9e-18 s, std 0.025 s, printed with no word)."""
    if not fit.identified[0]:
        return dict(name="alpha_s", unit="s", note=_unidentified(fit, 0))
    note = UNRESOLVED + ": the runs show no per-message latency" if not fit.resolved(0) else ""
    return dict(name="alpha_s", value=float(fit.theta[0]), std=_std(fit, 0), unit="s", note=note)


def _inv_beta(fit, i: int, name: str) -> dict:
    """1/beta as fitted (s per byte): the parameter itself, linear in the model."""
    if not fit.identified[i]:
        return dict(name=name, unit="s/B", note=_unidentified(fit, i))
    note = UNRESOLVED + ": the runs show no bandwidth cost" if not fit.resolved(i) else ""
    return dict(name=name, value=float(fit.theta[i]), std=_std(fit, i), unit="s/B", note=note)


def _beta(fit, i: int, name: str) -> dict:
    """beta = 1 / (1/beta), its std by the delta method: std(1/beta) / (1/beta)^2; only when
    1/beta is resolved from 0 (else beta has no upper bound)."""
    inv, std = float(fit.theta[i]), _std(fit, i)
    if not fit.identified[i]:
        return dict(name=name, unit="B/s", note=_unidentified(fit, i))
    if not fit.resolved(i):
        note = "1/beta is not resolved from 0 (see inv_beta): beta has no upper bound here"
        return dict(name=name, unit="B/s", note=note)
    return dict(name=name, value=1 / inv, std=None if std is None else std / inv**2, unit="B/s")


UNRESOLVED = "not resolved from 0 (within 2 std of it, or at the bound 0 of the fit)"


def _unidentified(fit, i: int) -> str:
    if i == 2 and not any(p.nodes > 1 for p in fit.points):
        return "not identified: no multi-node run"
    if i == 1 and not any(p.nodes == 1 for p in fit.points):
        return "not identified: no single-node multi-rank run"
    return "not identified: the fitted runs cannot separate it from the other parameters"


def _compute_rows(compute: dict) -> list[dict]:
    """model.csv's compute rows of model.fit_compute's result (precision -> Compute or why)."""
    rows = []
    for precision, c in compute.items():
        if isinstance(c, str):
            rows.append(dict(kind="parameter", name="compute", precision=precision, note=c))
            continue
        std = [None, None] if c.cov is None else [math.sqrt(max(v, 0)) for v in c.cov.diagonal()]
        base = dict(kind="parameter", precision=precision)
        rows += [
            dict(base, name="compute_c0_s", value=c.c0, std=std[0], unit="s", note=c.note),
            dict(base, name="compute_c1_s_per_img", value=c.c1, std=std[1], unit="s/img"),
            dict(base, name="backward_frac", value=c.f_bwd, unit="1", note=_backward_note(c)),
        ]
    return rows


def _backward_note(c) -> str:
    """Whose 1-rank runs f_bwd is the mean of: its own, or another precision's
    (study/model.py F_BWD_DONORS; the compute_c0_s row's note says why)."""
    if c.f_bwd_from:
        return f"mean of the 1-rank {c.f_bwd_from} runs (compute_c0_s says why)"
    return "mean of 1-rank runs"


def _fit_rows(pts: list, fit) -> list[dict]:
    if isinstance(fit, str):
        return []
    rows = []
    for p in pts:
        if isinstance(fit.compute.get(p.precision), str):
            continue
        pred = fit.predict(
            *(p.world_size, p.nodes, p.local_batch, p.precision, p.bucket_cap_mb),
            p.grad_sync_bytes,
            one_run=False,  # the point is its repeats' mean: that mean's interval
        )
        row = _compared("fit", ";".join(p.runs), p, pred)
        for q, cb in fit.below_compute:
            if q == p:
                row["note"] += f"; shorter than the 1-rank compute C({p.local_batch}) = {cb:.3g} s"
        rows.append(row)
    return rows


def _holdout_rows(pts: list) -> list[dict]:
    rows = []
    for h in model.holdout_points(pts):
        if h.point is None:
            rows.append(dict(kind="holdout", name=h.family, note=h.note))
        else:
            rows.append(dict(_compared("holdout", h.family, h.point, h.prediction), note=h.note))
    return rows


def _compared(kind: str, name: str, p, pred) -> dict:
    row = dict(kind=kind, name=name, **_point(p), unit="s")
    row.update(measured=p.step_s, measured_std=p.step_std, n=len(p.runs))
    if pred is not None and pred.step_s is not None:
        row.update(predicted=pred.step_s, lo=pred.lo_s, hi=pred.hi_s)
        row["rel_error"] = pred.step_s / p.step_s - 1 + 0.0  # + 0.0: no "-0.0" cells
    row["note"] = "" if pred is None else pred.basis
    return row


def _advice_row(a: dict) -> dict:
    # the default the gain is measured against, a cell so the documents can name it
    return dict(a, predicted_step_s=a["step_s"], default_bucket_cap_mb=model.DEFAULT_BUCKET_MB)
