"""`scalestudy plot --figure NAME`: one figure of the study (PNG and PDF) from the analysis CSVs.

Every plotted value is a cell of results/csv/scaling.csv (or epochs.csv, profile_shares.csv,
waterfall.csv);
nothing is typed in by hand. Error bars are one sample standard deviation over the repeats (none
drawn when a configuration ran once; of an efficiency, analyze's first-order propagation, none at
the baseline). A world size without a measurement breaks its line; a cell of the bucket heat map
without one is left blank and labelled "not measured". Colours: the Okabe-Ito palette, safe for
colour-blind readers; markers differ too, so the figures also read in greyscale.

    scalestudy plot --figure throughput --device cpu --scaling results/csv/scaling.csv \
        --out results/plots
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from pathlib import Path

from scalestudy import files, log, vocab
from scalestudy.errors import AnalysisError
from scalestudy.files import check_outputs, number
from scalestudy.results.analyze import PROFILE_CATEGORIES, check_targets, read_csv, read_table
from scalestudy.results.collect import epoch_cell
from scalestudy.results.printed import fmt_pct_apart
from scalestudy.study.estimate import WITH_EVALUATION

logger = log.get(__name__)

# Okabe & Ito (2008), "Color universal design"
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
FAMILY_STYLE = {"strong": (PALETTE[0], "o"), "weak": (PALETTE[1], "s")}


def figures(families: dict, device: str, profiled: bool) -> list[str]:
    """The figures a study has: only those whose data a run of it can produce."""
    enabled = {name for name, fam in families.items() if fam.get("enabled")}
    out = []
    if enabled & {"strong", "weak"}:
        out += ["throughput", "efficiency", "epoch_time", "comm_fraction"]
    if any(_several_world_sizes(families[name]) for name in enabled):
        out.append("waterfall")  # a family above its smallest world size has a loss to split
    if "precision" in enabled:
        out.append("precision")
    if "bucket" in enabled:
        out.append("bucket")
    out.append("accuracy")
    if device == "cuda":  # NVML's: no CPU run measures them
        out += ["gpu_util", "energy"]
    if profiled:
        out.append("profile")
    return out


def _several_world_sizes(family: dict) -> bool:
    gpus = family.get("gpus")
    return isinstance(gpus, list) and len(set(gpus)) > 1


# --- data helpers --------------------------------------------------------------------------------
def family_series(scaling: list[dict], family: str, column: str):
    """(world sizes, means, stds) of a family's column, sorted by world size."""
    rows = sorted((r for r in scaling if r["family"] == family), key=lambda r: int(r["world_size"]))
    xs = [int(r["world_size"]) for r in rows]
    ys = [number(r[f"{column}_mean"] if f"{column}_mean" in r else r[column]) for r in rows]
    stds = [_no_bar(number(r.get(f"{column}_std"))) for r in rows]
    return xs, ys, stds


def _no_bar(std: float | None) -> float:
    """An error bar's half-length: NaN where there is no spread (one repeat), which matplotlib
    draws as nothing; 0 would still draw the caps, a zero spread that was never measured."""
    return math.nan if std is None else std


def ideal_throughput(xs: list[int], ys: list[float]) -> list[float]:
    """Perfect linear scaling from the smallest world size: X(N0) N / N0."""
    return [ys[0] * x / xs[0] for x in xs]


def _drawn(xs_all: list[int], what: str, scaling: list[dict]) -> list[int]:
    """xs_all, refused when empty: a figure with empty axes would pass for a result. The fix
    names which is missing: the families (enable one), or the value in each of their rows."""
    if xs_all:
        return xs_all
    if any(r["family"] in FAMILY_STYLE for r in scaling):
        raise AnalysisError(
            f"none of scaling.csv's strong and weak rows has {what}: nothing to draw (no run "
            "measured it: see results/csv/runs.csv, which `scalestudy analyze` reads)"
        )
    raise AnalysisError(
        f"scaling.csv has no strong or weak rows with {what}: nothing to draw (run "
        "`snakemake results/csv/scaling.csv` with family strong or weak enabled)"
    )


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    # matplotlib's defaults first: a matplotlibrc in the study's directory or the user's config
    # (a serif font, savefig.bbox tight) drew other figures from the same CSVs, other bytes
    matplotlib.rcdefaults()
    plt.rcParams.update({"figure.dpi": 110, "savefig.dpi": 150, "font.size": 9})
    return plt


def _ink(rgba) -> str:
    """Black or white, whichever stands out more from a cell of colour `rgba` (WCAG 2 relative
    luminance and contrast ratio; the better of the two is at least 4.58:1 on any colour):
    white numbers on cividis' bright end, the fastest cells, read at 1.25:1."""
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgba[:3]]
    lum = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    return "black" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "white"


def _unit(device: str) -> str:
    """What a world size counts: GPUs, or a CPU study's ranks."""
    return "GPUs" if device == "cuda" else "ranks"


def _gpu_axis(ax, xs_all, device):
    ax.set_xscale("log", base=2)
    ticks = sorted(set(xs_all))
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("GPUs (world size)" if device == "cuda" else "ranks (CPU processes)")
    ax.grid(alpha=0.3)


def _family_errorbars(ax, scaling, series, scale: float = 1) -> list[int]:
    """One error-bar line per (family, column, label) that has data, in the family's style, means
    and stds times `scale` (100: a percentage); returns the world sizes drawn, for _gpu_axis."""
    xs_all = []
    for family, column, label in series:
        colour, marker = FAMILY_STYLE[family]
        xs, ys, stds = family_series(scaling, family, column)
        if all(y is None for y in ys):
            continue
        # a world size whose mean is blank (not measured) has no point, not a point at 0, and
        # the line breaks there (NaN) instead of bridging it as if it had been measured
        xs_all += [x for x, y in zip(xs, ys, strict=True) if y is not None]
        ax.errorbar(
            xs,
            [math.nan if y is None else scale * y for y in ys],
            # a spread of exactly 0 is the baseline's ratio to itself (analyze._std_vs_base):
            # by definition, so no bar, as where there is no spread
            yerr=[math.nan if s == 0 else scale * s for s in stds],
            color=colour,
            marker=marker,
            capsize=3,
            label=label,
        )
    return xs_all


# --- figures -------------------------------------------------------------------------------------
def plot_throughput(ax, scaling, device, **_):
    xs_all = []
    for family, (colour, marker) in FAMILY_STYLE.items():
        xs, ys, stds = family_series(scaling, family, "throughput_img_s")
        if not xs:
            continue
        xs_all += xs
        ax.errorbar(xs, ys, yerr=stds, color=colour, marker=marker, capsize=3, label=family)
        ax.plot(
            xs,
            ideal_throughput(xs, ys),
            color=colour,
            ls="--",
            lw=1,
            label=f"{family}: ideal X(N0) N / N0",
        )
    _gpu_axis(ax, _drawn(xs_all, "a throughput", scaling), device)
    ax.set_yscale("log")
    ax.set_ylabel("throughput (images/s, all ranks)")
    ax.legend()


def plot_efficiency(ax, scaling, device, targets, **_):
    series = (
        ("strong", "strong_efficiency", "strong E_s = N0 T(N0) / (N T(N))"),
        ("weak", "weak_efficiency", "weak E_w = T(N0) / T(N)"),
    )
    xs_all = _drawn(_family_errorbars(ax, scaling, series, scale=100), "an efficiency", scaling)
    # a family's target where it ran (targets.csv holds both always), said where the verdicts
    # judge it (analyze: strong at its world size, weak at the largest)
    present = {r["family"] for r in scaling}
    if "strong_efficiency" in targets and "strong" in present:
        n = int(targets["strong_efficiency_gpus"])
        ax.axhline(
            100 * targets["strong_efficiency"],
            color=FAMILY_STYLE["strong"][0],
            ls=":",
            label=f"strong target (judged at {n} {vocab.plural(_unit(device), n)})",
        )
    if "weak_deviation" in targets and "weak" in present:
        ax.axhline(
            100 / (1 + targets["weak_deviation"]),
            color=FAMILY_STYLE["weak"][0],
            ls="-.",
            label="weak target: 1 / (1 + D_max), judged at the largest world size",
        )
    ax.axhline(100, color="grey", lw=0.8)
    _gpu_axis(ax, xs_all, device)
    ax.set_ylabel("parallel efficiency (%)")
    ax.legend()


def plot_epoch_time(ax, scaling, device, **_):
    xs_all = _family_errorbars(ax, scaling, [(f, "epoch_time_s", f) for f in FAMILY_STYLE])
    _gpu_axis(ax, _drawn(xs_all, "an epoch time", scaling), device)
    ax.set_yscale("log")
    ax.set_ylabel("time per epoch (s, median epoch, training only)")
    ax.legend()


def plot_comm_fraction(ax, scaling, device, **_):
    series = [(f, "comm_exposed_frac", f) for f in FAMILY_STYLE]
    # a 1-rank run synchronises nothing: the trainer writes 0.0 without probing (loop.py), a
    # definition, not a measurement, so it is no point here (the figure and the captions say so)
    one = [r for r in scaling if r["family"] in FAMILY_STYLE and int(r["world_size"]) == 1]
    probed = [r for r in scaling if r not in one]
    xs_all = _family_errorbars(ax, probed, series, scale=100)
    if not xs_all:  # the documents say so in words and leave this figure out
        what = "no multi-rank run measured its exposed communication"
        ax.text(0.5, 0.5, what, ha="center", va="center")
        ax.set_axis_off()
        return
    if one:
        ax.set_title("1-rank runs left out: one rank synchronises nothing", fontsize=8)
    _gpu_axis(ax, xs_all, device)
    ax.set_ylim(bottom=0)
    # the probe's share (train.py): of one forward-backward pass, with and without gradient
    # sync; under gradient accumulation of one micro-batch pass, not of a step
    ax.set_ylabel("exposed communication (% of a forward-backward pass)")
    ax.legend()


def plot_precision(ax, scaling, device, targets=None, **_):
    """Speedup over fp32 per precision and world size; each bar's label the accuracy difference
    in percentage points, printed apart from the tolerance (fmt_pct_apart), with (!) where it
    is a loss beyond it: what disqualifies a precision (analyze._lost_accuracy; a gain beyond
    it does not)."""
    tolerance = (targets or {}).get("accuracy_tolerance")
    rows = [r for r in scaling if r["family"] == "precision"]
    if not rows:
        raise AnalysisError("scaling.csv has no precision rows (family precision did not run)")
    if all(number(r["precision_speedup"]) is None for r in rows):
        # no fp32 run at any of the family's world sizes (the config check refuses such a
        # family now): say it in the figure, not with empty axes beside a line at 1.0
        ax.text(0.5, 0.5, "no precision has an fp32 baseline at its world size", ha="center")
        ax.set_axis_off()
        return
    worlds = sorted({int(r["world_size"]) for r in rows})
    precisions = list(dict.fromkeys(r["precision"] for r in rows))
    width = 0.8 / len(worlds)
    unit = _unit(device)
    for i, w in enumerate(worlds):
        xs, ys, errs, labels = [], [], [], []
        for j, p in enumerate(precisions):
            match = [r for r in rows if int(r["world_size"]) == w and r["precision"] == p]
            if not match or number(match[0]["precision_speedup"]) is None:
                continue
            r = match[0]
            xs.append(j + (i - (len(worlds) - 1) / 2) * width)
            ys.append(number(r["precision_speedup"]))
            # the spread over repeats (analyze: relative errors in quadrature); none for one
            # repeat, and none for fp32's 1 against itself (0 by definition)
            std = number(r.get("precision_speedup_std"))
            errs.append(std or math.nan)
            diff = number(r["acc_diff_vs_fp32"])
            lost = r["acc_within_tolerance"] == "false" and diff is not None and diff < 0
            shown = fmt_pct_apart(diff, tolerance, signed=True)
            labels.append("" if diff is None else f"{shown} pp{' (!)' if lost else ''}")
        bars = ax.bar(
            xs,
            ys,
            width,
            yerr=errs,
            capsize=3,
            color=PALETTE[i % len(PALETTE)],
            label=f"{w} {vocab.plural(unit, w)}",
        )
        ax.bar_label(bars, labels, fontsize=7, padding=2)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(precisions)), precisions)
    ax.set_xlabel("precision (bar labels: final accuracy minus fp32's, percentage points)")
    ax.set_ylabel("throughput speedup over fp32 (x)")
    ax.legend(title="world size")


def plot_bucket(ax, scaling, device, **_):
    rows = [r for r in scaling if r["family"] == "bucket"]
    if not rows:
        raise AnalysisError("scaling.csv has no bucket rows (family bucket did not run)")
    # the family's one placement (families.bucket.gpus), which no text of the figure named
    unit = _unit(device)
    placed = sorted({(int(r["world_size"]), int(r["nodes"])) for r in rows})
    ax.set_title(
        ", ".join(f"at {n} {vocab.plural(unit, n)} on {k} {vocab.plural('nodes', k)}"
                  for n, k in placed),
        fontsize=8,
    )  # fmt: skip
    buckets = sorted({float(r["bucket_cap_mb"]) for r in rows})
    batches = sorted({int(r["local_batch"]) for r in rows})
    # NaN: a cell of the grid without a measurement (its run failed or has not run yet)
    grid = [[math.nan] * len(buckets) for _ in batches]
    for r in rows:
        x = number(r["throughput_img_s_mean"])
        grid[batches.index(int(r["local_batch"]))][buckets.index(float(r["bucket_cap_mb"]))] = (
            math.nan if x is None else x
        )
    image = ax.imshow(grid, cmap="cividis", aspect="auto", origin="lower")
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            # imshow leaves a NaN cell blank (white): said in words there, never "nan"
            text, colour = (
                ("not\nmeasured", "black")
                if math.isnan(value)
                else (f"{value:.0f}", _ink(image.cmap(image.norm(value))))
            )
            ax.text(j, i, text, ha="center", va="center", color=colour, fontsize=8)
    ax.set_xticks(range(len(buckets)), [f"{b:g}" for b in buckets])
    ax.set_yticks(range(len(batches)), [str(b) for b in batches])
    ax.set_xlabel("bucket_cap_mb (MiB per all-reduce bucket)")
    ax.set_ylabel("local_batch (images per rank per step)")
    ax.figure.colorbar(image, ax=ax, label="throughput (images/s, all ranks)")


# the waterfall's parts, bottom to top, and their colours; the residual is hatched: what the
# measured causes leave unexplained
WATERFALL_STYLE = {
    "comm": ("exposed communication", PALETTE[0], None),
    "data": ("data wait", PALETTE[1], None),
    "imbalance": ("imbalance between ranks", PALETTE[2], None),
    "residual": ("residual (shared machine, network, ...)", "#BBBBBB", "//"),
}


def _waterfall_label(r: dict, unit: str) -> str:
    """A bar's label: the family and world size, and what tells a family's configurations at
    one world size apart (the precision; the bucket size and local batch)."""
    label = f"{r['family']}\n{r['world_size']} {unit}"
    if r["family"] == "precision":
        return f"{label}\n{r['precision']}"
    if r["family"] == "bucket":
        return f"{label}\n{number(r['bucket_cap_mb']):g} MiB, b {r['local_batch']}"
    return label


def plot_waterfall(ax, waterfall, device, **_):
    """Stacked bars per family and world size: each part's share of the ideal throughput in %,
    positive parts up from 0, negative ones down; a black tick marks the total loss."""
    if not waterfall:
        raise AnalysisError("waterfall.csv is empty: no family ran above its smallest world size")
    unit = _unit(device)
    labels = [_waterfall_label(r, unit) for r in waterfall]
    # 0.7 inch a bar, room for its 3-line label and its note: the default study's 12 bars in
    # the 5.6-inch figure overlapped both
    fig = ax.figure
    fig.set_size_inches(max(fig.get_figwidth(), 0.7 * (len(labels) + 1) + 1.2), fig.get_figheight())
    up, down = [0.0] * len(waterfall), [0.0] * len(waterfall)
    for part, (label, colour, hatch) in WATERFALL_STYLE.items():
        values = [100 * (number(r[f"{part}_frac"]) or 0.0) for r in waterfall]
        bottoms = [u if v >= 0 else d for v, u, d in zip(values, up, down, strict=True)]
        ax.bar(
            range(len(values)),
            values,
            0.6,
            bottom=bottoms,
            color=colour,
            hatch=hatch,
            edgecolor="black",
            linewidth=0.4,
            label=label,
        )
        up = [u + max(v, 0.0) for u, v in zip(up, values, strict=True)]
        down = [d + min(v, 0.0) for d, v in zip(down, values, strict=True)]
    losses = [100 * number(r["loss_frac"]) for r in waterfall]
    ax.scatter(
        range(len(losses)),
        losses,
        marker="_",
        s=300,
        color="black",
        zorder=3,
        label="total loss = sum of the parts",
    )
    # a part left blank (its input not measured) is drawn as nothing and its time sits in the
    # residual (analyze.waterfall_row): say so on the bar, not only in waterfall.csv's note
    noted = False
    for i, r in enumerate(waterfall):
        missing = [p for p in WATERFALL_STYLE if p != "residual" and number(r[f"{p}_frac"]) is None]
        if missing:
            noted = True
            ax.annotate(
                "not measured:\n" + "\n".join(missing) + "\n(in residual)",
                (i, max(up[i], losses[i])),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=6,
            )
    if noted:  # room above the tallest bar for its note
        low, high = ax.get_ylim()
        ax.set_ylim(low, high + 0.3 * (high - low))
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_xlim(-1, len(labels))  # a lone bar stays a bar, not the whole axis
    ax.set_ylabel("throughput lost (% of ideal X(N0) N / N0)")
    ax.legend(ncols=2, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18))


def accuracy_curves(
    epochs: list[dict], device: str = "cpu"
) -> dict[str, list[tuple[int, float, float]]]:
    """Strong-family configuration -> [(epoch, cumulative training time s, val_acc)], the mean
    over repeats; configurations of other families when the strong family did not run
    (plot_accuracy's title says which: `_has_strong`)."""
    fix = EPOCHS_FIX
    if not epochs:
        raise AnalysisError(f"epochs.csv has no epochs: nothing to draw; {fix}")
    try:
        return _accuracy_curves(epochs, device)
    except KeyError as exc:
        raise AnalysisError(f"epochs.csv has no column {exc}: not from `collect`; {fix}") from exc
    except ValueError as exc:
        raise AnalysisError(f"epochs.csv has a cell that is not a number ({exc}); {fix}") from exc


def _has_strong(e: dict) -> bool:
    return "strong" in e["families"].split(";")


# the cells of epochs.csv the accuracy figure draws, checked as collect checks each run's file
# (collect.epoch_cell): a val_acc of -5 was drawn as -500 %, and times past the float range were
# numpy's traceback; a "nan" or blank too, which collect refuses (a nan val_acc was a gap)
EPOCH_DRAWN = ("val_acc", "epoch_time_s")
EPOCHS_FIX = "write it again: snakemake results/csv/epochs.csv"


def _accuracy_curves(epochs: list[dict], device: str) -> dict[str, list[tuple[int, float, float]]]:
    for i, e in enumerate(epochs, start=2):  # line 1 is the header
        for column in EPOCH_DRAWN:
            rule = epoch_cell(column)
            if not rule.holds(e[column]):
                raise AnalysisError(
                    f"epochs.csv, line {i}: {column} = {e[column]!r} is not {rule.what}; "
                    f"{EPOCHS_FIX}"
                )
    pick = [e for e in epochs if _has_strong(e)] or epochs
    sums: dict[tuple, list] = defaultdict(list)
    for e in pick:
        key = (int(e["world_size"]), int(e["local_batch"]), e["precision"], e["bucket_cap_mb"])
        sums[key].append(e)
    curves = {}
    for key in sorted(sums):
        by_repeat: dict[str, list] = defaultdict(list)
        for e in sums[key]:
            by_repeat[e["repeat"]].append(e)
        per_epoch: dict[int, list] = defaultdict(list)
        for rows in by_repeat.values():
            clock = 0.0
            for e in sorted(rows, key=lambda e: int(e["epoch"])):
                clock += float(e["epoch_time_s"])
                if not math.isfinite(clock):
                    raise AnalysisError(
                        f"epochs.csv: run {e['run']}'s training time is past the float range "
                        f"(epoch_time_s); {EPOCHS_FIX}"
                    )
                per_epoch[int(e["epoch"])].append((clock, float(e["val_acc"])))
        w, lb, p, bk = key
        label = f"{w} {vocab.plural(_unit(device), w)}, local batch {lb}, {p}"
        if len({k[3] for k in sums}) > 1:  # bucket runs differ only in bucket_cap_mb
            label += f", bucket {bk} MiB"
        curves[label] = [
            (ep, sum(c for c, _ in v) / len(v), sum(a for _, a in v) / len(v))
            for ep, v in sorted(per_epoch.items())
        ]
    return curves


def plot_accuracy(axes, epochs, device="cuda", **_):
    ax_epoch, ax_time = axes
    curves = accuracy_curves(epochs, device)  # first: a damaged epochs.csv is its one line
    strong = any(_has_strong(e) for e in epochs)
    ax_epoch.set_title(
        "strong-scaling runs" if strong else "every run (no strong-scaling run)", fontsize=9
    )
    for i, (label, points) in enumerate(curves.items()):
        style = {"color": PALETTE[i % len(PALETTE)], "marker": MARKERS[i % len(MARKERS)]}
        ax_epoch.plot([p[0] for p in points], [100 * p[2] for p in points], label=label, **style)
        ax_time.plot([p[1] for p in points], [100 * p[2] for p in points], label=label, **style)
    ax_epoch.set_xlabel("epoch")
    # the epochs' training time summed, evaluation excluded: not the resources' run wall time
    # (train_time_s, evaluation included)
    ax_time.set_xlabel("cumulative training time (s, sum of epochs, evaluation excluded)")
    for ax in axes:
        ax.set_ylabel("validation accuracy (%)")
        ax.grid(alpha=0.3)
    ax_epoch.legend(fontsize=7)


def configuration_series(scaling: list[dict], column: str) -> dict[str, list[tuple]]:
    """Label -> [(world size, mean, std)] of scaling.csv's `column`_mean / _std in every
    family's rows: one series per family, per precision or per bucket x local batch cell. A row
    without it (not measured) has mean NaN, so its line breaks there instead of bridging it; a
    series none of whose rows has it is left out (no series at all: nothing was measured)."""
    series: dict[str, list] = defaultdict(list)
    for r in sorted(scaling, key=lambda r: int(r["world_size"])):
        y = number(r.get(f"{column}_mean"))
        std = _no_bar(number(r.get(f"{column}_std")))
        series[_series_label(r)].append((int(r["world_size"]), math.nan if y is None else y, std))
    return {k: v for k, v in series.items() if not all(math.isnan(p[1]) for p in v)}


def _series_label(row: dict) -> str:
    """What tells a family's scaling.csv rows at one world size apart (strong, weak: only the
    world size): the series configuration_series puts the row in."""
    return {
        "precision": f"precision: {row['precision']}",
        "bucket": f"bucket: {row['bucket_cap_mb']} MiB, local batch {row['local_batch']}",
    }.get(row["family"], row["family"])


def gpu_util_series(scaling: list[dict]) -> dict[str, list[tuple[int, float, float]]]:
    """configuration_series of NVML's GPU utilisation (%): a row without it has window spans
    too short for a sample, each of which looks back up to 1 s (train.py gpu_util_mean)."""
    return configuration_series(scaling, "gpu_util_mean")


def energy_series(scaling: list[dict]) -> dict[str, list[tuple[int, float, float]]]:
    """configuration_series of the GPU energy per training image (J), one series per basis
    (scaling.csv energy_basis), labelled with it: "strong (training)", "strong (evaluation
    included)". A line never joins two bases: the wall span's J/img holds the evaluations and
    checkpoints the training spans' leaves out, and a family's shorter epochs at larger
    world sizes move it from one to the other, a rise that is no cost of scaling. A series has
    every world size of its label, NaN where that configuration is on the other basis or has
    none (its repeats on both: the mean is blank), so its line breaks there."""
    bases = {  # (label, world size) -> the basis of its mean
        (_series_label(r), int(r["world_size"])): r["energy_basis"]
        for r in scaling
        if number(r.get("energy_j_per_img_mean")) is not None
    }
    out = {}
    for label, points in configuration_series(scaling, "energy_j_per_img").items():
        for basis in filter(None, dict.fromkeys(bases.get((label, p[0])) for p in points)):
            out[f"{label} ({basis})"] = [
                p if bases.get((label, p[0])) == basis else (p[0], math.nan, math.nan)
                for p in points
            ]
    return out


def _configuration_errorbars(ax, series: dict[str, list], device: str) -> None:
    """configuration_series as error-bar lines: strong and weak in their family's style (a
    label's words before " (": energy_series' basis), the others in colours no family has
    (the 9th series was drawn exactly as strong, and others in strong's blue or weak's orange
    with another marker); a series on the wall span's energy basis dashed with open markers.
    The legend goes below the axes, the figure taller by its rows: the default study's 18
    series (strong, weak, 4 precisions, 12 bucket cells) inside the axes hid 13 of its points."""
    taken = {colour for colour, _ in FAMILY_STYLE.values()}
    free = [(c, m) for m in MARKERS for c in PALETTE if c not in taken]
    others = iter(free * (1 + len(series) // len(free)))
    styles: dict[str, tuple] = {}
    for label, points in series.items():
        base = label.split(" (")[0]
        if base not in styles:
            styles[base] = FAMILY_STYLE.get(base) or next(others)
        colour, marker = styles[base]
        wall = label.endswith(f"({WITH_EVALUATION})")
        ax.errorbar(
            [p[0] for p in points],
            [p[1] for p in points],
            yerr=[p[2] for p in points],
            color=colour,
            marker=marker,
            markerfacecolor="none" if wall else colour,
            linestyle="--" if wall else "-",
            capsize=3,
            label=label,
        )
    # ticks at the measured world sizes only, as _family_errorbars gives them
    measured = [p[0] for points in series.values() for p in points if not math.isnan(p[1])]
    _gpu_axis(ax, measured, device)
    rows = math.ceil(len(series) / LEGEND_COLUMNS)
    width, height = ax.figure.get_size_inches()
    ax.figure.set_size_inches(width, height + LEGEND_ROW_IN * rows)
    ax.legend(ncols=LEGEND_COLUMNS, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15))


# the legend below _configuration_errorbars' axes: its columns, and the inches each row takes
# (7 pt text, 1.2 lines apart with the marker's height: ~0.17 in)
LEGEND_COLUMNS = 2
LEGEND_ROW_IN = 0.17


def plot_gpu_util(ax, scaling, device, **_):
    series = gpu_util_series(scaling)
    if not series:  # the documents say so in words and leave this figure out
        ax.text(0.5, 0.5, "no run recorded GPU utilisation (NVML)", ha="center", va="center")
        ax.set_axis_off()
        return
    _configuration_errorbars(ax, series, device)
    ax.set_ylim(0, 100)
    ax.set_ylabel("mean GPU utilisation (%, NVML)")


def plot_energy(ax, scaling, device, **_):
    series = energy_series(scaling)
    if not series:  # the documents say why in words and leave this figure out
        ax.text(
            0.5, 0.5, "no configuration has a GPU energy per image (NVML)", ha="center", va="center"
        )
        ax.set_axis_off()
        return
    _configuration_errorbars(ax, series, device)
    ax.set_ylim(bottom=0)  # a flat line is perfect scaling: its level is read against 0
    ax.set_ylabel("GPU energy per training image (J, NVML)")


def profile_label(category: str, device: str) -> str:
    """A category as the documents name it: on a CPU the collectives are gloo's (torch.profiler's
    op times), not NCCL kernels, though they share the category `nccl` (nsight/classify.py)."""
    return "collectives (gloo)" if category == "nccl" and device != "cuda" else category


def plot_profile(ax, shares, device="cuda", **_):
    if not shares:
        raise AnalysisError(  # which of the two, system.csv's ("profiling", "kernel table") says
            "profile_shares.csv has no rows: `scalestudy analyze` was given no kernel table "
            "(--profile), or one without kernels"
        )
    keys = list(dict.fromkeys((r["run"], r["tool"]) for r in shares))
    bottom = [0.0] * len(keys)
    for c, cat in enumerate(PROFILE_CATEGORIES):
        vals = []
        for key in keys:
            match = [r for r in shares if (r["run"], r["tool"]) == key and r["category"] == cat]
            vals.append(100 * float(match[0]["share"]) if match else 0.0)
        ax.barh(
            range(len(keys)),
            vals,
            left=bottom,
            color=PALETTE[c % len(PALETTE)],
            hatch="//" if c >= len(PALETTE) else None,
            label=profile_label(cat, device),
        )
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_yticks(range(len(keys)), [f"{run} ({tool})" for run, tool in keys], fontsize=7)
    # a CPU study's torch.profiler times ops on the host, not GPU kernels
    timed = "kernel" if device == "cuda" else "op"
    ax.set_xlabel(f"share of {timed} time (%, rank 0)")
    ax.set_xlim(0, 100)
    ax.legend(ncols=3, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15))


# the figures of `scalestudy plot` (results/plots/<name>.{png,pdf}) and what draws each; their
# order is their order in the report
PLOTTERS = {
    "throughput": plot_throughput,
    "efficiency": plot_efficiency,
    "epoch_time": plot_epoch_time,
    "comm_fraction": plot_comm_fraction,
    "waterfall": plot_waterfall,
    "precision": plot_precision,
    "bucket": plot_bucket,
    "accuracy": plot_accuracy,
    "gpu_util": plot_gpu_util,
    "energy": plot_energy,
    "profile": plot_profile,
}
# their names: the choices of `plot --figure` and render-report's --figures (a misspelt name
# reached the templates' caption table and was blamed on the CSVs). Here, not in vocab, which
# the trainer imports: a new figure retrained every run (tests/test_vocabulary.py)
FIGURES = tuple(PLOTTERS)


def make_figure(name: str, out_dir: Path, title: str = "", **data) -> list[Path]:
    """Draw figure `name` and write out_dir/name.{png,pdf}: both or neither (an OSError names
    the figure that could not be written)."""
    if name not in PLOTTERS:
        raise AnalysisError(f"unknown figure {name!r}; known: {', '.join(PLOTTERS)}")
    paths = [out_dir / f"{name}.{ext}" for ext in ("png", "pdf")]
    check_outputs(paths, AnalysisError)  # a directory in the PDF's place: no new PNG beside it
    plt = _pyplot()
    if name == "accuracy":
        fig, ax = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    else:
        fig, ax = plt.subplots(figsize=(5.6, 3.8))
    try:
        PLOTTERS[name](ax, **data)
        if title:
            fig.suptitle(title, fontsize=9, parse_math=False)  # a study name, not mathtext
        fig.tight_layout()
        out_dir.mkdir(parents=True, exist_ok=True)
        _save_both(fig, paths)
        return paths
    finally:
        plt.close(fig)


def _os_error(exc: BaseException | None) -> OSError | None:
    """The OSError (with an errno) that `exc` is or was raised while handling, else None."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno is not None:
            return exc
        exc = exc.__context__
    return None


def _save_both(fig, paths: list[Path]) -> None:
    """Write the figure to each path as one output (files.write_files): temp files with the old
    figures' group and mode, synced, then renamed, so an interrupted job or a full disk leaves
    no half figure and no new PNG beside an old PDF, and no temp file. A symlinked path stays
    a link and the file it points to gets the figure."""
    files.write_files({path: _saver(fig, path) for path in paths}, "wb")


def _saver(fig, path: Path):
    """Write `fig` in `path`'s format into an open binary file, an OSError naming `path`."""
    pdf = path.suffix == ".pdf"  # no creation date: the same figure, the same bytes
    metadata = {"CreationDate": None} if pdf else None

    def save(f) -> None:
        try:
            # the figure path's format: a link may point to a name with another suffix
            fig.savefig(f, format=path.suffix[1:], metadata=metadata)
        except Exception as exc:
            # a full disk names no file, and the PDF backend's clean-up then fails on its
            # half-written stream: the AttributeError hides the OSError
            cause = _os_error(exc)
            if cause is None:
                raise
            raise OSError(cause.errno, cause.strerror, str(path)) from exc

    return save


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--figure", required=True, choices=FIGURES)
    parser.add_argument("--scaling", default="results/csv/scaling.csv")
    parser.add_argument("--epochs", default="results/csv/epochs.csv")
    parser.add_argument("--targets", default="results/csv/targets.csv")
    parser.add_argument(
        "--profile-shares",
        default="results/csv/profile_shares.csv",
        help="kernel-time shares, read by --figure profile only",
    )
    parser.add_argument("--waterfall", default="results/csv/waterfall.csv")
    parser.add_argument(
        # required: a default of cuda labelled a CPU study's figures "GPUs" when run by hand
        "--device",
        required=True,
        choices=vocab.STUDY_DEVICES,
        help="the study's hardware.device: names the axes (GPUs or ranks) and legends",
    )
    parser.add_argument("--title", default="", help="study name shown above the figure")
    parser.add_argument("--out", default="results/plots", help="directory for NAME.{png,pdf}")


def read_targets(path: str | Path) -> dict[str, float]:
    """targets.csv (analyze.py, --targets) as {target: value}; a damaged one is one line, not a
    KeyError (analyze.check_targets), and so is one without rows (0 bytes, a header alone:
    analyze writes the study's targets always), which drew the figure without its target
    lines, as render-report refuses it."""
    target, flag = "results/csv/targets.csv", "--targets"
    fix = files.input_fix(path, target, flag)
    if not (rows := read_csv(path, "", target, flag)):
        raise AnalysisError(f"{path} has no rows: `scalestudy analyze` writes the targets; {fix}")
    return check_targets(path, rows, fix)


def run(args: argparse.Namespace) -> int:
    # an AnalysisError: one line from cli.main, exit 2
    # each input read by the figures that draw it: a hand-run plot of one figure needs only its
    # own (epochs.csv: accuracy; targets.csv: efficiency's target lines; scaling.csv: all but
    # the three figures of other tables)
    data = {
        "scaling": (
            read_table(args.scaling, "scaling", "--scaling")
            if args.figure not in ("accuracy", "profile", "waterfall")
            else []
        ),
        "epochs": (
            read_csv(args.epochs, "", "results/csv/epochs.csv", "--epochs")
            if args.figure == "accuracy"
            else []
        ),
        "targets": (  # efficiency's target lines, precision's accuracy tolerance
            read_targets(args.targets) if args.figure in ("efficiency", "precision") else {}
        ),
        "shares": (  # read by its own figure only, from its results/csv path by default
            # analyze writes it, empty or not
            read_table(args.profile_shares, "profile_shares", "--profile-shares")
            if args.figure == "profile"
            else []
        ),
        "waterfall": (  # read by its own figure only: a hand-run plot needs no waterfall.csv
            read_table(args.waterfall, "waterfall", "--waterfall")
            if args.figure == "waterfall"
            else []
        ),
        "device": args.device,
    }
    paths = make_figure(args.figure, Path(args.out), args.title, **data)
    logger.info("wrote " + ", ".join(map(str, paths)))
    return 0
