"""The scaling model of a DDP step, its held-out validation and the bucket advisor (pure: numpy,
scipy; no torch).

Input: rows of results/csv/runs.csv. Only strategy ddp runs without gradient accumulation and
with a measured grad_sync_bytes are modelled; every other run is listed with the reason
(`points`), and a modelled run's cell that collect cannot have written (MODELLED_CELLS: a bucket
cap outside the trainer's range, a grad_sync_bytes past 16 GiB), or cells that disagree (more
nodes than ranks, a world_size no multiple of its nodes, a global_batch not local_batch x
world_size: `_check_placement`), is refused in one line. A configuration (precision, local
batch b, world size N, nodes, bucket_cap_mb, P) is one point: its step time
T = global_batch / X (s, steady state, train.py), X the mean throughput_img_s over its repeats
(the harmonic mean of the repeats' step times, not their mean: results/analyze.py step_time,
the documents' definition), and its std T s_X / X to first order (s_X: the sample std of the
repeats' throughputs; none with one repeat).

Compute, per precision, from the 1-rank points (`fit_compute`):
    C_p(b) = c0 + c1 * b               bounded least squares (c0, c1 >= 0), relative residuals
    one local batch only: c0 = 0, c1 = T / b (compute taken proportional to the batch; said so)
    t_b(b) = f_bwd * C_p(b)            backward time; f_bwd = mean phase_frac_backward of them,
                                       else of another precision's 1-rank runs (F_BWD_DONORS)

f_bwd, the backward's share of the step, is measured only where the trainer times its phases:
under cuda_graphs_mode "step" (the whole step one CUDA graph, which cuda_graphs auto picks on
CUDA for DDP in bf16, tf32 and fp32, not in fp16: trainer/compiling.py graphs_mode)
phase_frac_backward is null (trainer/train.py), so of the paper's GPU study (config/config.yaml)
only the fp16 runs measure it. A precision whose 1-rank runs have none takes the mean of the
1-rank runs of the closest precision that has one, in the fixed order of F_BWD_DONORS (the same
operand width first), and its Compute's note says so (model.csv: the note of its compute_c0_s
row). The share is set by the network more than by the arithmetic (a convolution's backward
computes two gradients, about twice its forward's work, in every precision; the H100's bf16
1-rank runs that timed their phases measured 0.52-0.56, docs/gpu-runs), so a borrowed share is
close, not exact. With none in any precision's 1-rank runs the precision has no compute, and
the reason (`backward_share_fix`) says to add a 1-rank fp16 configuration (the precision
family's, with its fp32 one: it adds runs and changes none), train.cuda_graphs: false being
study-wide (every run again without CUDA graphs).

Communication: DDP's bucketed ring all-reduce. P = grad_sync_bytes, B = bucket_cap_mb * 2^20
(DDP's MiB; with bucket_cap_mb given, torch 2.14 caps the first bucket at B too, distributed.py
_BucketCapacityConfig). Under the fp16 / bf16 comm hooks P is the bytes of the fp32 gradients
DDP's buckets hold (the cap counts those: 2 x grad_sync_bytes, HOOK_WIRE), and each bucket is
sent as 16 bits: w = 1/2 of its bytes on the wire (w = 1 without a hook). DDP fills buckets in
the order gradients become ready, so the buckets are m = ceil(P / B), m - 1 of B bytes and the
last, ready last, of the rest r = P - (m-1) B.

One bucket of x bytes costs (ring all-reduce: 2(N-1) steps, each rank sends 2(N-1)/N of x)

    c(x) = 2(N-1) alpha + s w x / beta,   s = 2(N-1)/N,
           beta = beta_intra (1 node), else beta_inter
    t_c  = m 2(N-1) alpha + s w P / beta   (all buckets)

Gradients arrive uniformly over t_b, so bucket k is ready at t_b S_k / P (S_k: bytes of buckets
1..k), and the buckets are reduced one after the other on one stream. The last one finishes at
max_k (t_b S_k / P + sum_{j>=k} c_j), so the communication that backward does not hide is

    exposed = max_k (t_b S_k / P + sum_{j>=k} c_j) - t_b    (>= c(r): the last bucket is exposed)

With equal buckets this is max(c(r), t_c - t_b (1 - min(B, P) / P)): small buckets pay m
latencies, large ones leave a large last bucket unhidden; that is what gives B an optimum.
The model assumes gradients of equal byte rate over backward and buckets of exactly B bytes
(DDP closes a bucket at the parameter that crosses B, so real buckets are larger by up to one
tensor, 9.4 MB for ResNet-18's largest).

    T(N) = C_p(b) + exposed(N, nodes, B, P, t_b(b))

Fit (`fit_points`): alpha, 1/beta_intra, 1/beta_inter (>= 0) to every multi-rank point with
scipy.optimize.least_squares (bounds; relative residuals T_model / T - 1: step times span
orders of magnitude and timing noise is proportional). A parameter no point depends on (no
multi-node run: beta_inter) or that the points cannot separate from another (e.g. alpha and
beta_intra when every point has one bucket at one N) is not identified: reported without a
value, never a number. With J the Jacobian of the relative residuals, rank k, n points:

    dof = n - k,   s^2 = sum r^2 / dof,   Cov = s^2 (J^T J)^+

The model's T >= C_p(b): a multi-rank point measured shorter than the compute of the 1-rank runs
beyond noise (`below_compute`) is one it cannot describe, e.g. a 1-rank run slowed by something
else on the machine, or superlinear scaling; the fit pins alpha and 1/beta at their bound 0 and
ignores communication (the CPU demo: 2-rank steps of 0.024-0.026 s against C(16) = 0.055 s, fit
errors +110% and +132%). Noise: the relative sd of T (its repeats) and of C_p(b) (the compute
fit's variance and residuals) together, 2 sd, at least SHORTER_FLOOR; only at local batches
inside the 1-rank runs' (beyond them C_p(b) is extrapolated itself). The fit keeps these points
(`Fit.below_compute`, `Fit.misfit` says why), the held-out rows say their error is no
validation, and the advisor gives no advice.

Prediction at a new point (`Fit.predict`): T as above; when its gradient g = dT/dtheta lies in
the span the fit measured (else "not identified"), a 95% interval by the delta method:

    sd^2 = g^T Cov g + (dT/dC)^2 Var C_p(b) + (s^2 + v_1) T^2,    T +- t_{0.975, dof} sd

with Var C_p(b) from the compute fit when it has dof > 0, and dT/dC = 1 - f_bwd (1 - S_k / P)
(k: the bucket whose finish is the latest; T depends on C directly and through t_b). The
interval is of one run, the job the planner sizes: s comes from the configurations' means over
their repeats, which vary less than one run does, so v_1 = s_w^2 (1 - 1/n) adds what a single
run varies more (`single_run_var`: s_w^2 the runs' pooled relative variance within their
configurations, 1 - 1/n the points' mean of 1 - 1/n_i, n_i their repeats; 0 without a
configuration of two repeats): without v_1, with 3 repeats, a single new run fell inside the
interval 78-88% of the time. The rows of model.csv that compare a configuration's mean (fitted
and held-out) take the interval of such a mean (one_run False: without v_1).
dof <= 0: no interval (None, None, and `no_interval` says why: no degree of freedom left).
extrapolated (`Fit.beyond_fitted`): N above the largest fitted N with the same kind of link (one
node, or several: beta_intra and beta_inter are fitted from different runs), more ranks per node
than any fitted run had (a study measured on 4-GPU nodes priced again for 8-GPU nodes), a bucket
count m outside the range of m of the fitted multi-rank points (the m alpha terms and the last
bucket's exposure carried beyond the caps measured: fitted on 25 MiB runs, 2 buckets, a 1 MiB
run's 43 were priced 45% short, the truth 66% above the interval), or a local batch outside the
1-rank runs' (C_p(b) is extrapolated itself there).

Held-out validation (`holdout`): for each family with >= 3 world sizes, fit without every point
at its largest world size (any family's: another family's run there would measure it for the
fit) and predict the family's points there: rel_error = predicted / measured - 1.
Three, because with the largest left out the fit still needs the family's 1-rank point (compute)
and a multi-rank one (communication). Families with fewer: "not validated", with the reason.

Bucket advisor (`advise`): at each multi-rank (N, nodes) of the study and each (precision, local
batch) of the bucket family, the predicted T over the candidate caps (`candidate_caps`):
CANDIDATE_CAPS_MB, one bucket (B >= P), every cap a multi-rank run of that (precision, local
batch, P) measured, and for each bucket count m from 1 to the largest those runs measured the
cap of m equal buckets (P / m, rounded up to 3 significant digits where that keeps m); without
the last two, a P below 1 MiB (the CPU demo's 0.67 MiB) was one bucket at every candidate and
the advisor could never recommend the 0.25 MiB its own sweep measured fastest.
Recommended = argmin (DDP's default 25 MiB on a tie), gain = T(25 MiB) / T(best) - 1;
extrapolated (the note says why) where the recommendation rests on what no run of that
(precision, local batch) measured: its bucket count m outside the range of m of the multi-rank
runs (any family), no bucket-sweep run at that (N, nodes), or the prediction itself
extrapolated (above). "not enough data" without
a fit identifying alpha and the needed beta, when the model cannot describe the runs
(`Fit.misfit`), or when the bucket sweep has fewer than 2 distinct bucket counts m (then no
measurement shows a bucket-size effect: a sweep of 1 and 25 MiB of a width-8 ResNet-18's
P = 0.7 MB is one bucket at every cap), or when the fit has no degree of freedom (as many
fitted configurations as free parameters: no std tells its noise from a gain), or when neither
alpha nor the needed 1/beta is resolved from 0 (`Fit.resolved`: the fit finds no communication
cost, and a "gain" between caps would be its noise).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from scalestudy import files
from scalestudy.errors import AnalysisError
from scalestudy.trainer.config import BUCKET_CAP_MB

# scipy is imported inside the three functions that fit, not here: every snakemake call imports
# this module while it parses the workflow (common.smk -> study.plan), each Slurm job's inner
# snakemake too, and scipy.optimize + scipy.stats take 1.2 s of that on 2 cores (python -X
# importtime), for a fit that only the plan's calibration, analyze and model ever run.

MIB = 2**20  # DDP's bucket_cap_mb unit (distributed.py: _MB_TO_BYTES = 1024 * 1024)
DEFAULT_BUCKET_MB = 25.0  # DDP's default bucket_cap_mb
CANDIDATE_CAPS_MB = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0)
# the advisor's equal-bucket caps: every bucket count up to this many, beyond it this many
# counts spread geometrically (a 0.01 MiB sweep of 44 MB would be 4,263 predictions per row)
MAX_BUCKET_COUNTS = 256
PARAMS = ("alpha_s", "inv_beta_intra_s_per_B", "inv_beta_inter_s_per_B")
# the fit's working units: 1 us latency, 1e-10 s/B (10 GB/s), so the solver sees numbers ~1
SCALE = np.array([1e-6, 1e-10, 1e-10])
LEVEL = 0.95  # two-sided prediction interval
# what a prediction's `extrapolated` means (Fit.predict, Fit.beyond_fitted), as plan.md says it
EXTRAPOLATED = (
    "beyond the measured runs: a world size above the largest measured on its kind of link "
    "(one node, or several), more ranks per node than any measured run, a bucket count "
    "(gradient bytes / bucket_cap_mb, rounded up) outside the multi-rank runs', or a local "
    "batch outside the 1-rank runs'"
)
RANK_RTOL = 1e-9  # singular values below this share of the largest: a direction not measured
# a multi-rank step more than this share shorter than its 1-rank compute C(b) is beyond the noise
# of one unrepeated run (below_compute: 2 sd where repeats and the compute fit measure more)
SHORTER_FLOOR = 0.05
CANNOT_DESCRIBE = (
    "the multi-rank steps are shorter than the 1-rank compute: the model cannot describe these runs"
)
REQUIRED_COLUMNS = (
    "run",
    "strategy",
    "world_size",
    "nodes",
    "local_batch",
    "global_batch",
    "precision",
    "bucket_cap_mb",
    "throughput_img_s",
)
# what a modelled run's point is computed from, checked as `scalestudy model` checks runs.csv
# (results/analyze.py RUNS_CELLS: counts digits only, >= 1; sizes and rates finite, > 0). The
# plan's --runs-csv reaches the model without that check: a bucket_cap_mb of 0 was a
# ZeroDivisionError, an inf one a ValueError inside scipy, an inf grad_sync_bytes an
# OverflowError, a negative one a silent fit.
# The bucket cap within the trainer's range and the gradients within 16 GiB (ResNet-18's are
# 44.7 MB in fp32): a cap of 1e-12 MiB, or 1e300 bytes, built hundreds of billions of buckets
# (bucket_sizes), a numpy MemoryError.
BUCKET_CAP_CELL = files.Cell(
    f"a number in [{BUCKET_CAP_MB[0]}, {BUCKET_CAP_MB[1]}] (MiB: the trainer's --bucket-cap-mb)",
    *BUCKET_CAP_MB,
)
GRAD_BYTES_MAX = 2**34
GRAD_BYTES_CELL = files.Cell(
    f"a number in (0, {GRAD_BYTES_MAX}] (bytes: 16 GiB, 4e9 fp32 gradients)",
    0,
    GRAD_BYTES_MAX,
    above=True,
)
# a run's images/s, from one image in 11 days to 10^12 (10^7 GPUs at 10^5 img/s): a finite
# 1e300 underflowed the step time to 0 (the waterfall's ZeroDivisionError), a 1e-300 made the
# fit's residuals infinite
THROUGHPUT_CELL = files.Cell("a number in [1e-06, 1e+12]", 1e-6, 1e12)
MODELLED_CELLS = {
    **{c: files.count(1) for c in ("world_size", "nodes", "local_batch", "global_batch")},
    "bucket_cap_mb": BUCKET_CAP_CELL,
    "grad_sync_bytes": GRAD_BYTES_CELL,
    "throughput_img_s": THROUGHPUT_CELL,
}
# bytes sent per byte of DDP's buckets under a comm hook that casts each bucket before its
# all-reduce (trainer/parallel.py): DDP buckets the fp32 gradients (4 bytes a value, the cap
# counts them), the hook sends 2. grad_sync_bytes is what is sent, so the buckets hold
# grad_sync_bytes / w: modelling buckets of the 16-bit bytes gave half DDP's bucket count
HOOK_WIRE = {"fp16": 0.5, "bf16": 0.5}
FIX = "write it again with `scalestudy collect` (snakemake results/csv/runs.csv)"
# where a precision's 1-rank runs recorded no phase_frac_backward (cuda_graphs_mode step times
# no phases), the precisions whose 1-rank runs lend it theirs, closest first: the same operand
# width first (the same bytes per layer, so the same balance of memory-bound batch norm and
# elementwise work against the convolutions: bf16 <-> fp16, tf32 <-> fp32); then, for the 16-bit
# ones, tf32 (tensor cores, like them) before fp32; for the 32-bit ones bf16 (no GradScaler,
# like them) before fp16, whose GradScaler adds its unscale and inf check to every step
F_BWD_DONORS = {
    "bf16": ("fp16", "tf32", "fp32"),
    "fp16": ("bf16", "tf32", "fp32"),
    "tf32": ("fp32", "bf16", "fp16"),
    "fp32": ("tf32", "bf16", "fp16"),
}


# --- the measured points ---------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    """One modelled configuration: step_s = global_batch / mean throughput over its repeats
    (s), step_std = step_s s_X / X (s_X the throughputs' sample std; None with one repeat);
    grad_sync_bytes: the bytes DDP's buckets hold (runs.csv's grad_sync_bytes / wire)."""

    precision: str
    local_batch: int
    world_size: int
    nodes: int
    bucket_cap_mb: float
    grad_sync_bytes: float
    families: tuple[str, ...]
    runs: tuple[str, ...]
    step_s: float
    step_std: float | None
    backward_frac: float | None  # mean phase_frac_backward of the repeats
    graphs_modes: tuple[str, ...] = ()  # the repeats' cuda_graphs_mode (runs.csv), where given
    wire: float = 1.0  # bytes sent per byte of the buckets (HOOK_WIRE; grad_sync_bytes: held)
    backward_fracs: tuple[float, ...] = ()  # each repeat's phase_frac_backward, where given


def _num(row: dict, column: str) -> float | None:
    try:
        return files.number(row.get(column))
    except ValueError:
        raise AnalysisError(
            f"run {row.get('run')!r} has {column} = {row.get(column)!r}, not a number"
        ) from None


def _fraction(row: dict, column: str) -> float | None:
    """A share of the step in [0, 1], or None where not measured: an inf failed inside scipy
    with a traceback, a -3 gave a nonsense fit silently."""
    x = _num(row, column)
    if x is not None and not files.FRACTION.holds(x):
        raise AnalysisError(
            f"run {row.get('run')!r} has {column} = {row.get(column)!r}, not "
            f"{files.FRACTION.what}: {FIX}"
        )
    return x


def _check_modelled(row: dict) -> None:
    """A modelled run's MODELLED_CELLS and that they agree (`_check_placement`), else one
    AnalysisError naming the run, the column, the cell, what it must be and the fix."""
    for column, rule in MODELLED_CELLS.items():
        if not rule.holds(row.get(column)):
            raise AnalysisError(
                f"run {row.get('run')!r} has {column} = {row.get(column)!r}, not {rule.what}: {FIX}"
            )
    _check_placement(row)


def _check_placement(row: dict) -> None:
    """A modelled run's counts agree, else one AnalysisError as _check_modelled's (its cells
    each hold already: digits only). The model takes W / nodes ranks on every node (study/runs.py
    placement: whole nodes) and T = global_batch / X for one micro-batch per step (accum_steps
    1: `_skip_reason`); each cell alone passed, and a 2-rank run on "4 nodes" gave an
    "identified" inter-node bandwidth, a global_batch of 4 local batches at 2 ranks a step time
    twice the one measured."""
    run = row.get("run")
    n, nodes, b, g = (int(row[c]) for c in ("world_size", "nodes", "local_batch", "global_batch"))
    if nodes > n:
        raise AnalysisError(
            f"run {run!r} has nodes = {row['nodes']!r}, not <= its world_size = "
            f"{row['world_size']!r} (every node runs at least one rank): {FIX}"
        )
    if n % nodes:
        raise AnalysisError(
            f"run {run!r} has world_size = {row['world_size']!r}, not a multiple of its nodes = "
            f"{row['nodes']!r} (whole nodes of the same ranks: study/runs.py placement): {FIX}"
        )
    if g != b * n:
        raise AnalysisError(
            f"run {run!r} has global_batch = {row['global_batch']!r}, not local_batch x "
            f"world_size = {b} x {n} = {b * n} (accum_steps 1: T = global_batch / throughput): "
            f"{FIX}"
        )


def _skip_reason(row: dict) -> str:
    if row["strategy"] != "ddp":
        return f"strategy {row['strategy']}: the model is DDP's bucketed all-reduce"
    if (_num(row, "accum_steps") or 1) != 1:
        return "gradient accumulation: one all-reduce per several micro-batches is not modelled"
    if row.get("comm_hook") == "powersgd":
        return "comm hook powersgd: low-rank factors, not an all-reduce of the gradients"
    if _num(row, "grad_sync_bytes") is None:
        return "no grad_sync_bytes (metrics.json from before the trainer recorded it: rerun it)"
    for column in ("throughput_img_s", "global_batch"):  # T = global_batch / throughput
        if _num(row, column) is None:  # not measured; a bad value: _check_modelled refuses it
            return f"{column} is {row.get(column)!r}"
    return ""


def points(rows: list[dict]) -> tuple[list[Point], list[tuple[str, str]]]:
    """(the modelled configurations, [(run, why not modelled)]) of runs.csv's rows; a modelled
    run's cell that breaks MODELLED_CELLS, or disagrees with another (`_check_placement`), is an
    AnalysisError (the one reader of both `scalestudy model` and the plan's calibration)."""
    if not rows:
        raise AnalysisError("no runs")
    missing = [c for c in REQUIRED_COLUMNS if c not in rows[0]]
    if missing:
        raise AnalysisError(f"no column {', '.join(missing)}: run `collect` again")
    groups, skipped = defaultdict(list), []
    for row in rows:
        if reason := _skip_reason(row):
            skipped.append((row["run"], reason))
            continue
        _check_modelled(row)
        key = (row["precision"], *(_num(row, c) for c in ("local_batch", "world_size", "nodes")))
        wire = HOOK_WIRE.get(row.get("comm_hook"), 1.0)
        held = _num(row, "grad_sync_bytes") / wire  # the bytes DDP's buckets hold
        groups[(*key, _num(row, "bucket_cap_mb"), held, wire)].append(row)
    _one_model(rows)
    # a study has one (train.comm_hook); a hand-merged runs.csv of two: Fit.predict prices every
    # point at the commonest hook's bytes on the wire, and the others were mispredicted by 40%
    hooks = {r.get("comm_hook") or "none" for runs in groups.values() for r in runs}
    if len(hooks) > 1:
        raise AnalysisError(
            f"mixes comm_hook {sorted(hooks)} among the DDP runs it models: the scaling model "
            "fits one; model each hook's runs apart (one runs.csv each)"
        )
    return [_point(key, runs) for key, runs in sorted(groups.items())], skipped


def _one_model(rows: list[dict]) -> None:
    kinds = {tuple(r.get(c, "") for c in ("device", "model", "width")) for r in rows}
    if len(kinds) > 1:
        raise AnalysisError(
            f"mixes (device, model, width) {sorted(kinds)}: the scaling model fits one"
        )


def _point(key: tuple, runs: list[dict]) -> Point:
    # T = G / X of the mean throughput, its std T s_X / X: the step time of results/analyze.py
    xs = [_num(r, "throughput_img_s") for r in runs]
    x_mean = statistics.fmean(xs)
    step_s = _num(runs[0], "global_batch") / x_mean
    backward = [v for r in runs if (v := _fraction(r, "phase_frac_backward")) is not None]
    families = {f for r in runs for f in (r.get("families") or "").split(";") if f}
    precision, b, n, nodes, cap, p, wire = key
    return Point(
        precision=precision,
        local_batch=int(b),
        world_size=int(n),
        nodes=int(nodes),
        bucket_cap_mb=cap,
        grad_sync_bytes=p,
        families=tuple(sorted(families)),
        runs=tuple(r["run"] for r in runs),
        step_s=step_s,
        step_std=step_s * statistics.stdev(xs) / x_mean if len(xs) > 1 else None,
        backward_frac=statistics.fmean(backward) if backward else None,
        graphs_modes=tuple(sorted({m for r in runs if (m := r.get("cuda_graphs_mode"))})),
        wire=wire,
        backward_fracs=tuple(backward),
    )


# --- compute ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Compute:
    """C_p(b) = c0 + c1 b (s) of one precision, from its 1-rank points."""

    precision: str
    c0: float
    c1: float
    cov: np.ndarray | None  # of (c0, c1), s^2; None without dof
    dof: int
    resid_sd: float | None  # relative
    f_bwd: float
    batches: tuple[int, ...]
    note: str
    f_bwd_from: str = ""  # the precision whose 1-rank runs gave f_bwd ("": its own; note: why)
    run_var: float = 0.0  # v_1 of its 1-rank points (single_run_var): relative^2

    def time(self, b: float) -> float:
        return self.c0 + self.c1 * b

    def var(self, b: float) -> float:
        g = np.array([1.0, b])
        return 0.0 if self.cov is None else float(g @ self.cov @ g)


def fit_compute(pts: list[Point]) -> dict[str, Compute | str]:
    """precision -> its Compute, or why it has none. f_bwd: the mean phase_frac_backward of its
    1-rank runs, else of the 1-rank runs of the first precision of F_BWD_DONORS[precision]
    that has one (the note says so), else none. Of the runs, each repeat one value: a mean of
    the configurations' means weighed a configuration of 1 repeat as one of 3."""
    ones, fracs = defaultdict(list), defaultdict(list)
    for p in pts:
        if p.world_size == 1:
            ones[p.precision].append(p)
            if p.backward_fracs:
                fracs[p.precision].extend(p.backward_fracs)
            elif p.backward_frac is not None:  # a Point made without its repeats' values
                fracs[p.precision].append(p.backward_frac)
    out: dict[str, Compute | str] = {}
    for precision in sorted({p.precision for p in pts}):
        if not ones[precision]:
            out[precision] = f"no 1-rank run of precision {precision} to take its compute from"
            continue
        if fracs[precision]:
            f_bwd = statistics.fmean(fracs[precision])
            out[precision] = _linear_compute(precision, ones[precision], f_bwd)
            continue
        untimed = _untimed(ones[precision])
        donor = next((d for d in F_BWD_DONORS.get(precision, ()) if fracs[d]), None)
        if donor is None:
            out[precision] = (
                f"no phase_frac_backward in the 1-rank {precision} runs (they {untimed}) nor in "
                "a 1-rank run of another precision to take it from: "
                f"{backward_share_fix(precision)}"
            )
            continue
        f_bwd = statistics.fmean(fracs[donor])
        why = f"the 1-rank {precision} runs {untimed}"
        out[precision] = _linear_compute(precision, ones[precision], f_bwd, donor, why)
    return out


def backward_share_fix(precision: str) -> str:
    """How a study without any 1-rank backward share gets one. Not train.cuda_graphs: false
    alone: that key is study-wide (one run-table column, study/runs.py), so it changes the flags
    of every run and the whole study runs again without CUDA graphs. The precision family at 1
    rank adds runs and changes no other: its fp16 configuration, which under cuda_graphs auto
    runs no whole-step graph (trainer/config.py step_graph_misfit), so it times its phases, and
    every precision takes fp16's share (F_BWD_DONORS); and its fp32 one, which the family must
    have (study/config.py: it compares against fp32), unless the study has that run already."""
    whole_study = (
        "train.cuda_graphs: false gives one too, but for the whole study: every run again "
        "without CUDA graphs, about 2.8x slower at local batch 64 on an H100 (config/config.yaml)"
    )
    if precision == "fp16":  # this trainer times fp16's phases (no whole-step graph for it)
        return "run its 1-rank fp16 runs again with this trainer, which times their phases"
    return (
        "add a 1-rank fp16 configuration, which gives the model its backward share: "
        "families.precision: enabled true, gpus [1], precisions [fp32, fp16] (under "
        "train.cuda_graphs auto fp16 runs no whole-step CUDA graph, so it times its phases; the "
        "family compares with its fp32 run, which comes too unless the study has it; a family "
        f"already enabled runs each of its precisions at each of its gpus); {whole_study}"
    )


def _untimed(ones: list[Point]) -> str:
    """Why 1-rank runs have no phase_frac_backward, as far as runs.csv says."""
    if {m for p in ones for m in p.graphs_modes} == {"step"}:
        return "ran as whole-step CUDA graphs (cuda_graphs_mode step), which time no phases"
    return "recorded none"


def _linear_compute(
    precision: str, ones: list[Point], f_bwd: float, donor: str = "", why: str = ""
) -> Compute:
    """The Compute of a precision's 1-rank points; `donor` the precision whose 1-rank runs gave
    f_bwd ("": its own), `why` its own have none."""
    b = np.array([p.local_batch for p in ones], float)
    t = np.array([p.step_s for p in ones])
    batches = tuple(sorted({p.local_batch for p in ones}))
    f_note = f"f_bwd from the 1-rank {donor} runs: {why}" if donor else ""
    if len(batches) == 1:
        note = f"one local batch ({batches[0]}): compute taken proportional to it (c0 = 0)"
        note = "; ".join(filter(None, (note, f_note)))
        c1 = float(np.mean(t / b))
        return Compute(precision, 0.0, c1, None, 0, None, f_bwd, batches, note, donor)
    from scipy import optimize  # inside: see the note on scipy at the top

    a = np.column_stack([1 / t, b / t])  # relative residuals: (c0 + c1 b) / T - 1
    sol = optimize.lsq_linear(a, np.ones(len(t)), bounds=(0, np.inf))
    dof = len(t) - 2
    cov, sd = None, None
    if dof > 0:
        s2 = float(np.sum(sol.fun**2)) / dof
        cov, sd = s2 * np.linalg.pinv(a.T @ a), math.sqrt(s2)
    c0, c1 = (float(v) for v in sol.x)
    return Compute(
        precision, c0, c1, cov, dof, sd, f_bwd, batches, f_note, donor, single_run_var(ones)
    )


def single_run_var(pts: list[Point]) -> float:
    """v_1 of the module docstring: what one run's relative variance adds to that of a fit's
    residuals, which are of the configurations' means over their repeats: s_w^2 (1 - 1/n), s_w^2
    the pooled relative variance of the runs within their configurations ((step_std / step_s)^2
    weighted by repeats - 1), 1 - 1/n the mean over the points of 1 - 1/n_i (n_i its repeats:
    the share of a run's variance its mean does not hold); 0 where no point has two."""
    within = [(len(p.runs) - 1, p.step_std / p.step_s) for p in pts if p.step_std is not None]
    dof = sum(k for k, _ in within)
    if not dof:
        return 0.0
    kept = statistics.fmean(1 - 1 / len(p.runs) for p in pts)
    return sum(k * r**2 for k, r in within) / dof * kept


# --- communication ---------------------------------------------------------------------------
def bucket_sizes(p_bytes: float, cap_mb: float) -> np.ndarray:
    """Bytes of DDP's buckets in the order they are reduced: m - 1 of B, the last the rest."""
    cap = cap_mb * MIB
    m = max(1, math.ceil(p_bytes / cap))
    sizes = np.full(m, cap)
    sizes[-1] = p_bytes - (m - 1) * cap
    return sizes


def exposed(
    theta: np.ndarray,
    n: int,
    nodes: int,
    p_bytes: float,
    cap_mb: float,
    t_b: float,
    wire: float = 1.0,
) -> tuple[float, np.ndarray, float]:
    """(exposed communication in s, its gradient w.r.t. theta = PARAMS, its derivative w.r.t.
    t_b) of one step, p_bytes held in DDP's buckets and `wire` of each byte sent (Point.wire):
    with bucket k's finish the latest, d exposed / d t_b = S_k / P - 1 (a longer backward
    hides more of the buckets after k)."""
    grad = np.zeros(3)
    if n == 1:
        return 0.0, grad, 0.0
    sizes = bucket_sizes(p_bytes, cap_mb)
    s, steps, beta = 2 * (n - 1) / n, 2 * (n - 1), 1 if nodes == 1 else 2
    cost = steps * theta[0] + s * wire * sizes * theta[beta]
    finish = t_b * np.cumsum(sizes) / p_bytes + np.cumsum(cost[::-1])[::-1]
    k = int(np.argmax(finish))
    grad[0], grad[beta] = steps * (len(sizes) - k), s * wire * sizes[k:].sum()
    return float(finish[k] - t_b), grad, float(sizes[: k + 1].sum() / p_bytes - 1)


def model_step(theta: np.ndarray, c: Compute, pt: Point) -> tuple[float, np.ndarray, float]:
    """(T in s, dT/dtheta, dT/dC) of a point under parameters theta. T depends on the compute
    time C twice, as C and through t_b = f_bwd C: dT/dC = 1 + f_bwd d exposed / d t_b."""
    t = c.time(pt.local_batch)
    e, g, de_dtb = exposed(
        theta, pt.world_size, pt.nodes, pt.grad_sync_bytes, pt.bucket_cap_mb, c.f_bwd * t, pt.wire
    )
    return t + e, g, 1 + c.f_bwd * de_dtb


# --- the fit ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prediction:
    step_s: float | None  # None: not identified by the fit (basis says why)
    lo_s: float | None  # 95% prediction interval of one run (module docstring); None: no data
    hi_s: float | None
    extrapolated: bool
    basis: str
    # why there is no interval where step_s is given ('' where there is one): the fit's
    # degrees of freedom, or a compute away from the 1-rank runs' batches with unknown error
    no_interval: str = ""


@dataclass(frozen=True)
class Fit:
    compute: dict[str, Compute | str]
    theta: np.ndarray  # PARAMS in s, s/B
    std: np.ndarray  # nan where not identified or no dof
    identified: tuple[bool, bool, bool]
    cov: np.ndarray | None  # 3 x 3, None without dof
    null: np.ndarray  # 3 x k: parameter directions the points did not measure
    dof: int
    resid_sd: float | None  # relative
    points: tuple[Point, ...]  # the multi-rank points fitted
    skipped: tuple[tuple[str, str], ...]  # (point or run, why not fitted)
    # (point, its C(b) in s) of the fitted points measured shorter than their compute
    below_compute: tuple[tuple[Point, float], ...] = ()
    run_var: float = 0.0  # v_1 of the fitted points (single_run_var): relative^2

    def resolved(self, i: int) -> bool:
        """Parameter i is resolved from 0: more than 2 std above it, and at least a millionth
        of its working unit (SCALE: 1 us, 1e-10 s/B) where no std says how far from 0."""
        std = 0.0 if math.isnan(self.std[i]) else float(self.std[i])
        value = float(self.theta[i])
        return not (value <= 2 * std or value < 1e-6 * SCALE[i])

    @property
    def misfit(self) -> str:
        """Why the model cannot describe the fitted runs ('' when it can)."""
        if not self.below_compute:
            return ""
        shown = "; ".join(_shorter(p, c) for p, c in self.below_compute)
        return (
            f"{CANNOT_DESCRIBE} ({shown}), e.g. a 1-rank run slowed by something else on the "
            "machine, or superlinear scaling"
        )

    def predict(
        self,
        world_size: int,
        nodes: int,
        local_batch: int,
        precision: str,
        bucket_cap_mb: float = DEFAULT_BUCKET_MB,
        grad_sync_bytes: float | None = None,
        one_run: bool = True,
    ) -> Prediction:
        """Step time of a configuration (s) with its 95% prediction interval; extrapolated
        where it lies beyond the fitted runs (`beyond_fitted`: its placement or its bucket
        count) or its local batch outside the 1-rank runs' batches (C(b) is extrapolated there
        itself). grad_sync_bytes: the bytes DDP's buckets hold (Point.grad_sync_bytes), else the
        fitted runs'. one_run: the interval of one run (the planner's job), else of a
        configuration's mean over its repeats, as the fit's points are (the held-out and fitted
        rows of model.csv compare such means)."""
        pbytes = grad_sync_bytes or self._bytes(precision)
        buckets = len(bucket_sizes(pbytes, bucket_cap_mb))
        extrapolated = self.beyond_fitted(world_size, nodes, buckets)
        c = self.compute.get(precision) or f"no point of precision {precision}"
        if isinstance(c, str):
            return Prediction(None, None, None, extrapolated, c)
        extrapolated = extrapolated or not min(c.batches) <= local_batch <= max(c.batches)
        # the comm hook is study-wide (train.comm_hook): the fitted runs' bytes sent per byte
        wire = Counter(p.wire for p in self.points).most_common(1)[0][0]
        pt = Point(
            *(precision, local_batch, world_size, nodes, bucket_cap_mb, pbytes),
            *((), (), 0, None, None),
            wire=wire,
        )
        step, g, dt_dc = model_step(self.theta, c, pt)
        if gap := self._unmeasured(g, nodes):
            return Prediction(None, None, None, extrapolated, gap)
        lo, hi, no_interval = self._interval(step, g, dt_dc, c, local_batch, world_size, one_run)
        basis = f"fit of {len(self.points)} multi-rank configurations, dof {self.dof}"
        if c.cov is None and local_batch not in c.batches:
            # one batch: C = c1 b; two: the line through both (c0 + c1 b, no residual left)
            how = "taken proportional to" if len(c.batches) == 1 else "from the line through"
            basis += (
                f"; compute at local batch {local_batch} {how} the 1-rank runs' "
                f"{list(c.batches)}, its error unknown: no interval"
            )
        if world_size == 1:
            basis = f"compute of the 1-rank {precision} runs, local batches {list(c.batches)}"
        basis += ", extrapolated" * extrapolated
        return Prediction(step, lo, hi, extrapolated, basis, no_interval)

    def beyond_fitted(self, world_size: int, nodes: int, buckets: int | None = None) -> bool:
        """Whether a multi-rank point is beyond the fitted runs: a world size above the
        largest fitted with the same kind of link (one node: beta_intra; several: beta_inter),
        more ranks per node than any fitted run had, or `buckets` (its bucket count m; None:
        its placement alone) outside the range of the fitted points' m. Comparing world size
        and nodes with the maxima over all fitted points, each alone, missed a study measured
        on 4-GPU nodes and priced again for 8-GPU nodes (estimate.py _level_key): 8 ranks
        inside one node (a ring twice as wide as any single-node one measured) and 16 ranks on
        2 nodes (8 per node, never run) were plain predictions. Without the bucket count a
        1 MiB run (43 buckets) of a study fitted on 25 MiB runs (2) was a plain "model" in the
        plan, the truth 66% above its interval: the m alpha terms and the last bucket's
        exposure are carried past what the runs measured, as the advisor says of a bucket
        count (`_unmeasured_advice`)."""
        if world_size == 1:  # compute alone: its local batch decides (predict)
            return False
        one_node = nodes == 1
        same_link = [p.world_size for p in self.points if (p.nodes == 1) == one_node]
        per_node = max(_ranks_per_node(p.world_size, p.nodes) for p in self.points)
        counts = [len(bucket_sizes(p.grad_sync_bytes, p.bucket_cap_mb)) for p in self.points]
        return (
            not same_link
            or world_size > max(same_link)
            or _ranks_per_node(world_size, nodes) > per_node
            or (buckets is not None and not min(counts) <= buckets <= max(counts))
        )

    def _bytes(self, precision: str) -> float:
        values = [p.grad_sync_bytes for p in self.points if p.precision == precision]
        values = values or [p.grad_sync_bytes for p in self.points]
        return Counter(values).most_common(1)[0][0]

    def _unmeasured(self, g: np.ndarray, nodes: int) -> str:
        gs = g * SCALE
        if nodes > 1 and not any(p.nodes > 1 for p in self.points):
            return "not identified: no multi-node run measured beta_inter"
        # beta_intra is fitted only from single-node multi-rank runs (fit_points: held at 0
        # otherwise, which would price a run inside one node at no bandwidth cost)
        if g[1] and not any(p.nodes == 1 for p in self.points):
            return "not identified: no single-node multi-rank run measured beta_intra"
        if self.null.size and np.linalg.norm(self.null.T @ gs) > 1e-6 * np.linalg.norm(gs):
            return "not identified: the fitted runs do not separate alpha from beta here"
        return ""

    def _interval(
        self, step, g, dt_dc, c: Compute, b, n, one_run: bool = True
    ) -> tuple[float | None, float | None, str]:
        """(lo, hi, '') or (None, None, why there is no interval); one_run: predict's."""
        if c.cov is None and b not in c.batches:
            # C(b) has no variance to add (one 1-rank batch, or no dof): away from the batches
            # measured its error is unknown, and an interval of the other terms alone was
            # falsely tight (the truth outside a "95 %" interval at 4x the batch)
            return (
                None,
                None,
                (
                    f"the compute at local batch {b} comes from the 1-rank runs' batches "
                    f"{list(c.batches)} with no degree of freedom left: its error is unknown"
                ),
            )
        if n == 1:  # compute alone
            run_var = c.run_var if one_run else 0.0
            dof, var = c.dof, c.var(b) + ((c.resid_sd or 0) ** 2 + run_var) * step**2
            what = f"the 1-rank runs' compute line (local batches {list(c.batches)})"
            more = "a 1-rank run at another local batch"
        else:
            dof, what = self.dof, f"the fit of {len(self.points)} multi-rank configurations"
            more = "another multi-rank configuration"
            if self.cov is None:
                dof = min(dof, 0)
            else:
                var = float(g @ self.cov @ g) + dt_dc**2 * c.var(b)
                run_var = self.run_var if one_run else 0.0  # one run: single_run_var
                var += (self.resid_sd**2 + run_var) * step**2
        if dof <= 0:
            return None, None, f"{what} has no degree of freedom left (dof {dof}): measure {more}"
        from scipy import stats  # inside: see the note on scipy at the top

        half = float(stats.t.ppf(0.5 + LEVEL / 2, dof)) * math.sqrt(var)
        return max(0.0, step - half), step + half, ""


def fit_study(rows: list[dict]) -> Fit | None:
    """The scaling model of runs.csv's rows, or None when nothing can be fitted."""
    fit = fit_points(points(rows)[0])
    return None if isinstance(fit, str) else fit


# why there is no fit where no multi-rank point is left (results/model.py adds why the study's
# multi-rank runs were left out, where it has some)
NO_MULTI_RANK = "no multi-rank ddp configuration"


def fit_points(pts: list[Point], compute: dict | None = None) -> Fit | str:
    """The fit of the points, or why there is none; `compute`: fit_compute(pts) where the caller
    has it already."""
    compute = fit_compute(pts) if compute is None else compute
    multi = [p for p in pts if p.world_size > 1]
    used = [p for p in multi if isinstance(compute.get(p.precision), Compute)]
    skipped = tuple(without_compute(multi, compute))
    if not multi:
        return NO_MULTI_RANK
    if not used:  # why each precision of the multi-rank points has no compute
        return "; ".join(dict.fromkeys(why for _, why in skipped))
    free = np.array([True, any(p.nodes == 1 for p in used), any(p.nodes > 1 for p in used)])
    res, jac = _objective(used, compute, free)
    from scipy import optimize  # inside: see the note on scipy at the top

    best = min(
        (
            optimize.least_squares(res, np.full(free.sum(), x0), jac=jac, bounds=(0, np.inf))
            for x0 in (0.1, 1.0, 10.0, 100.0)  # piecewise linear: a few starts, keep the best
        ),
        key=lambda r: r.cost,
    )
    theta = np.zeros(3)
    theta[free] = best.x * SCALE[free]
    fit = _uncertainty(compute, theta, free, best.fun, best.jac, used, skipped)
    return dataclasses.replace(fit, below_compute=tuple(below_compute(compute, used)))


def without_compute(pts: list[Point], compute: dict) -> list[tuple[str, str]]:
    """(configuration, why) of the points whose precision has no Compute (`fit_compute`'s
    reason): the fit leaves them out and model.csv has no row of theirs but this."""
    return [(_label(p), c) for p in pts if isinstance(c := compute.get(p.precision), str)]


def _shorter(p: Point, cb: float) -> str:
    return f"{_label(p)}: {p.step_s:.3g} s against C({p.local_batch}) = {cb:.3g} s"


def below_compute(compute: dict, pts: list[Point]) -> list[tuple[Point, float]]:
    """(point, C(b) in s) of the multi-rank points measured shorter than the compute of their
    precision's 1-rank runs beyond noise: T < C(b) (1 - tol), tol = max(SHORTER_FLOOR, 2 sd),
    sd^2 = (std T / T)^2 + Var C(b) / C(b)^2 + (compute residual sd)^2 (the parts measured);
    only at a local batch inside the 1-rank runs'."""
    out = []
    for p in pts:
        c = compute.get(p.precision)
        if p.world_size == 1 or not isinstance(c, Compute):
            continue
        if not min(c.batches) <= p.local_batch <= max(c.batches):
            continue  # C(b) is an extrapolation itself there
        cb = c.time(p.local_batch)
        var = ((p.step_std or 0) / p.step_s) ** 2 + c.var(p.local_batch) / cb**2
        tol = max(SHORTER_FLOOR, 2 * math.sqrt(var + (c.resid_sd or 0) ** 2))
        if p.step_s < cb * (1 - tol):
            out.append((p, cb))
    return out


def _objective(used: list[Point], compute: dict, free: np.ndarray):
    def full(x):
        theta = np.zeros(3)
        theta[free] = x * SCALE[free]
        return theta

    def res(x):
        return np.array(
            [model_step(full(x), compute[p.precision], p)[0] / p.step_s - 1 for p in used]
        )

    def jac(x):
        grads = [model_step(full(x), compute[p.precision], p)[1] / p.step_s for p in used]
        return np.array(grads)[:, free] * SCALE[free]

    return res, jac


def _uncertainty(compute, theta, free, resid, jac, used, skipped) -> Fit:
    _, sv, vt = np.linalg.svd(jac, full_matrices=True)
    rank = int(np.sum(sv > RANK_RTOL * sv[0])) if sv.size and sv[0] > 0 else 0
    null_free = vt[rank:].T  # free x k
    null = np.zeros((3, null_free.shape[1]))
    null[free] = null_free
    identified = tuple(bool(free[i] and np.linalg.norm(null[i]) < 1e-6) for i in range(3))
    dof = len(used) - rank
    cov, std, sd = None, np.full(3, np.nan), None
    if dof > 0:
        s2 = float(np.sum(resid**2)) / dof
        cov_free = s2 * np.linalg.pinv(jac.T @ jac) * np.outer(SCALE[free], SCALE[free])
        cov = np.zeros((3, 3))
        cov[np.ix_(free, free)] = cov_free
        std = np.where(identified, np.sqrt(np.clip(np.diag(cov), 0, None)), np.nan)
        sd = math.sqrt(s2)
    return Fit(
        compute, theta, std, identified, cov, null, dof, sd, tuple(used), skipped,
        run_var=single_run_var(used),
    )  # fmt: skip


def _ranks_per_node(world_size: int, nodes: int) -> int:
    """The most ranks on one node (study/runs.py placement: whole nodes, so W / nodes)."""
    return math.ceil(world_size / nodes)


def _label(p: Point) -> str:
    return ";".join(p.runs)


# --- held-out validation ---------------------------------------------------------------------
@dataclass(frozen=True)
class HoldoutRow:
    family: str
    point: Point | None  # None: the family is not validated (note says why)
    prediction: Prediction | None
    note: str

    @property
    def rel_error(self) -> float | None:
        if self.point is None or self.prediction is None or self.prediction.step_s is None:
            return None
        return self.prediction.step_s / self.point.step_s - 1


def holdout(rows: list[dict]) -> list[HoldoutRow]:
    """Each family's largest world size predicted by a fit without it (see the docstring)."""
    return holdout_points(points(rows)[0])


def holdout_points(pts: list[Point]) -> list[HoldoutRow]:
    out = []
    for family in sorted({f for p in pts for f in p.families}):
        sizes = sorted({p.world_size for p in pts if family in p.families})
        if len(sizes) < 3:
            listed = ", ".join(map(str, sizes))
            note = f"not validated: world sizes {listed} (needs >= 3 to leave one out)"
            out.append(HoldoutRow(family, None, None, note))
            continue
        held = [p for p in pts if family in p.families and p.world_size == sizes[-1]]
        fit = fit_points([p for p in pts if p.world_size != sizes[-1]])
        for p in held:
            if isinstance(fit, str):
                out.append(HoldoutRow(family, p, None, f"not predicted: {fit}"))
                continue
            pred = fit.predict(
                p.world_size,
                p.nodes,
                p.local_batch,
                p.precision,
                p.bucket_cap_mb,
                p.grad_sync_bytes,
                one_run=False,  # the held-out point is its repeats' mean
            )
            why = _not_validated(fit, p) if pred.step_s is not None else ""
            out.append(HoldoutRow(family, p, pred, pred.basis + why))
    return out


def _not_validated(fit: Fit, held: Point) -> str:
    """'; no validation: ...' where the model cannot describe the runs, fitted or held out:
    its error then measures no model (the demo's -6.4% at 4 ranks came from a fit that
    ignored communication)."""
    if fit.misfit:
        return f"; no validation: {fit.misfit}"
    if shorter := below_compute(fit.compute, [held]):
        return f"; no validation: {CANNOT_DESCRIBE} (held out: {_shorter(*shorter[0])})"
    return ""


# --- the bucket advisor ----------------------------------------------------------------------
@dataclass(frozen=True)
class Advice:
    world_size: int | None
    nodes: int | None
    precision: str | None
    local_batch: int | None
    grad_sync_bytes: float | None
    bucket_cap_mb: float | None  # recommended; None: not enough data (note)
    buckets: int | None
    step_s: float | None  # predicted at the recommended cap
    default_step_s: float | None  # predicted at 25 MiB
    gain: float | None  # default_step_s / step_s - 1
    note: str
    # the recommendation rests on what the sweep never measured (note says what); None: no
    # recommendation
    extrapolated: bool | None = None


def advise(fit: Fit | None, pts: list[Point]) -> list[Advice]:
    """The recommended bucket_cap_mb per multi-rank (world size, nodes) and bucket-family
    (precision, local batch); rows that say "not enough data" where the data cannot tell."""
    # multi-rank runs only: a 1-rank one (a hand-made runs.csv) synchronises nothing
    sweep = [p for p in pts if "bucket" in p.families and p.world_size > 1]
    combos = sorted({_combo(p) for p in sweep})
    sizes = sorted({(p.world_size, p.nodes) for p in pts if p.world_size > 1})
    if not combos or not sizes:
        why = "no multi-rank ddp run modelled" if not sizes else "no bucket family modelled"
        return [Advice(*[None] * 10, note=f"not enough data: {why}")]
    gap = _sweep_gap(fit, sweep)
    return [_advice(fit, n, nodes, combo, gap, pts) for n, nodes in sizes for combo in combos]


def _combo(p: Point) -> tuple:
    return p.precision, p.local_batch, p.grad_sync_bytes


def _sweep_gap(fit: Fit | None, sweep: list[Point]) -> str:
    if fit is None:
        return "no scaling fit (model.csv says why)"
    if fit.misfit:
        return fit.misfit
    counts = {len(bucket_sizes(p.grad_sync_bytes, p.bucket_cap_mb)) for p in sweep}
    if len(counts) < 2:
        caps = ", ".join(f"{c:g}" for c in sorted({p.bucket_cap_mb for p in sweep}))
        mb = ", ".join(f"{b / 1e6:.2f}" for b in sorted({p.grad_sync_bytes for p in sweep}))
        return (
            # the bytes the buckets hold (Point.grad_sync_bytes): under a comm hook twice
            # runs.csv's grad_sync_bytes, which the note once named them as
            f"every bucket_cap_mb of the sweep ({caps} MiB) gives {counts.pop()} bucket(s) of "
            f"the {mb} MB of fp32 gradients DDP's buckets hold: no measurement shows a "
            "bucket-size effect"
        )
    if not fit.identified[0]:
        return "alpha (per-message latency) not identified by the fit"
    return ""


def _advice(fit: Fit | None, n: int, nodes: int, combo: tuple, gap: str, pts: list) -> Advice:
    precision, b, pbytes = combo
    head = (n, nodes, precision, b, pbytes)
    link = 1 if nodes == 1 else 2
    if not gap and not fit.identified[link]:
        gap = f"beta_{'intra' if nodes == 1 else 'inter'} not identified by the fit"
    if not gap and fit.dof <= 0:
        # as many fitted configurations as free parameters: no std, so a parameter pinned near
        # its bound 0 by the solver (alpha 5e-10 s) passed as resolved, and 1 MiB was advised
        # over DDP's 25 where the runs measured it 2% slower
        gap = (
            "the fit has no degree of freedom left (as many fitted configurations as free "
            "parameters), so a gain cannot be told from noise: measure another bucket cap or "
            "world size"
        )
    if not gap and not (fit.resolved(0) or fit.resolved(link)):
        # no latency and no bandwidth cost: a "gain" between caps is the fit's noise (5e-9 of
        # a step recommended 1 MiB over DDP's 25)
        gap = (
            "the fit finds no communication cost (alpha and 1/beta_"
            f"{'intra' if nodes == 1 else 'inter'} not resolved from 0): keep DDP's default"
        )
    if gap:
        return Advice(*head, None, None, None, None, None, note=f"not enough data: {gap}")
    caps = candidate_caps(
        pbytes, [p.bucket_cap_mb for p in pts if _combo(p) == combo and p.world_size > 1]
    )
    preds = {cap: fit.predict(n, nodes, b, precision, cap, pbytes) for cap in caps}
    if any(p.step_s is None for p in preds.values()):
        why = next(p.basis for p in preds.values() if p.step_s is None)
        return Advice(*head, None, None, None, None, None, note=f"not enough data: {why}")
    best = min(caps, key=lambda cap: (preds[cap].step_s, cap))
    default = preds[DEFAULT_BUCKET_MB].step_s
    if default <= preds[best].step_s * (1 + 1e-9):  # a tie (e.g. every cap >= P): keep DDP's
        best = DEFAULT_BUCKET_MB
    gain = default / preds[best].step_s - 1
    m = len(bucket_sizes(pbytes, best))
    pred = preds[best]
    why = _unmeasured_advice(m, n, nodes, [p for p in pts if _combo(p) == combo])
    # the prediction's own reasons (its basis ends ", extrapolated"), said once with the others;
    # of them its bucket count is said above already (these runs' range of m lies inside the
    # fitted runs'), and the placement and local batch are said here only where they hold:
    # "world size ... beyond" on a 43-bucket recommendation at a measured world size misled
    c = fit.compute[precision]  # a Compute: the prediction has a step time
    if fit.beyond_fitted(n, nodes) or not min(c.batches) <= b <= max(c.batches):
        why.append("world size on its link, ranks per node or local batch beyond the fitted runs")
    note = pred.basis.removesuffix(", extrapolated")
    note += f"; extrapolated: {'; '.join(why)}" if why else ""
    return Advice(*head, best, m, pred.step_s, default, gain, note, bool(why))


def candidate_caps(p_bytes: float, measured_caps: list[float]) -> list[float]:
    """The bucket caps (MiB) the advisor compares for gradients of p_bytes, `measured_caps` the
    caps the multi-rank runs of that (precision, local batch, P) measured: CANDIDATE_CAPS_MB,
    one bucket (ceil(P / MiB)), the measured caps, and one cap per bucket count m from 1 to the
    largest those runs measured (`equal_buckets_cap`)."""
    caps = {*CANDIDATE_CAPS_MB, float(math.ceil(p_bytes / MIB)), *map(float, measured_caps)}
    top = max((len(bucket_sizes(p_bytes, c)) for c in measured_caps), default=1)
    counts = (
        range(1, top + 1)
        if top <= MAX_BUCKET_COUNTS
        else {round(float(m)) for m in np.geomspace(1, top, MAX_BUCKET_COUNTS)}
    )
    caps.update(c for m in counts if (c := equal_buckets_cap(p_bytes, m)) is not None)
    return sorted(caps)


def equal_buckets_cap(p_bytes: float, m: int) -> float | None:
    """A cap (MiB) giving m buckets of about P / m each: P / m rounded up to 3 significant
    digits (a cap one can type), more where the rounding would give m - 1; None when no
    rounding to 12 digits keeps m (m beyond P's bytes)."""
    exact = p_bytes / m / MIB
    for digits in (3, 6, 9, 12):
        e = math.floor(math.log10(exact)) - digits + 1
        cap = round(math.ceil(exact / 10**e) * 10**e, max(0, -e))
        if len(bucket_sizes(p_bytes, cap)) == m:
            return float(cap)
    return None


def _unmeasured_advice(m: int, n: int, nodes: int, same: list[Point]) -> list[str]:
    """What of a recommendation of m buckets at (n, nodes) no run measured, `same` the points
    of its (precision, local batch, P): a bucket count outside the range of its multi-rank
    runs' (any family's: a strong run at 25 MiB measured its bucket count too), where the
    model carries its latency-bandwidth trade-off beyond them; a world size and node count
    where the bucket sweep ran no cap, so nothing there showed the cap's effect."""
    multi = [p for p in same if p.world_size > 1]
    counts = sorted({len(bucket_sizes(p.grad_sync_bytes, p.bucket_cap_mb)) for p in multi})
    why = []
    if not counts[0] <= m <= counts[-1]:
        span = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
        why.append(f"{m} buckets, outside the {span} buckets the runs measured")
    if (n, nodes) not in {(p.world_size, p.nodes) for p in multi if "bucket" in p.families}:
        where = f"{nodes} node" + "s" * (nodes != 1)
        why.append(f"no bucket-sweep run at {n} ranks on {where}")
    return why
