"""Nsight Compute: `ncu --csv --page details` output -> profile_ncu rows.

Per kernel the mean duration, achieved occupancy, DRAM and SM throughput and FLOP/s (tensor-core
paths included) over the profiled launches; schema and units in schema.py. Robust to ncu's rule
rows, trailing commas, labels that changed between versions and metric names instead of labels.
"""

from __future__ import annotations

import re
from pathlib import Path

from scalestudy import files
from scalestudy.errors import ProfileFormatError
from scalestudy.nsight import schema
from scalestudy.nsight.tables import col, parse_number, rows_after_header, to_ns

# the tensor-core totals this parser sums, ncu_metrics.TENSOR_METRIC's rule (the counters the ncu
# job asks for), written again here (tests/test_resources.py holds the two equal): imported, an
# edit to ncu_metrics.py reran the parse (and the kernels step) first, and Snakemake, which
# checks nothing below a rerun job whose one file from it is ancient, left Nsight Compute, a
# whole run per kernel, to the next snakemake, unpriced by this one's dry-run
TENSOR_METRIC = re.compile(r"^sm__ops_path_tensor_src_([a-z0-9]+)(_dst_[a-z0-9]+)?\.sum$")

_NCU_DURATION = ("gpu__time_duration.sum", "Duration")
_NCU_OCCUPANCY = ("sm__warps_active.avg.pct_of_peak_sustained_active", "Achieved Occupancy")
_NCU_DRAM = (
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "DRAM Throughput",
)
# the label of the SM throughput changed between ncu versions ("SM [%]", "Compute (SM) [%]",
# "Compute (SM) Throughput"); the metric name did not
_NCU_SM = (
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "Compute (SM) Throughput",
    "Compute (SM) [%]",
    "SM [%]",
)
# the SASS FLOP counters per SM (sm__) or per SM sub-partition (smsp__: what profile ncu asks
# for), the same GPU-wide sums: both in one launch count once (the smsp__ one)
_SASS = re.compile(
    r"^(?P<unit>sm|smsp)__sass_thread_inst_executed_op_(?P<type>[hfd])(?P<op>add|mul|fma)"
    r"_pred_on\.sum$"
)


_NCU_NAMED = frozenset((*_NCU_DURATION, *_NCU_OCCUPANCY, *_NCU_DRAM, *_NCU_SM))
REPROFILE = "not as ncu writes it: profile again with `scalestudy profile ncu`"
# what remakes a damaged details CSV (an error's fixing command): jobs/profile_ncu.py's import
REEXPORT = (
    "export it again with `ncu --import <report>.ncu-rep --csv --page details --print-units "
    "base --print-metric-name name > <file>.csv`, or profile again with `scalestudy profile ncu`"
)
# what fixes a pass whose CSV holds launches of other kernels than the one it was for: its name
# filter matched them, and neither a new export nor a new ncu pass (the same filter) changes that
FILTER_FIX = (
    "its name filter (the kernel_regex of `profile ncu`'s --kernels file, the workflow's "
    "results/profile/<run>/ncu_kernels.json) matches them too: make that file again with "
    "`scalestudy profile ncu-kernels --kernels <the run's kernels.csv> --out <it>` and profile "
    "again with `scalestudy profile ncu`, or lower profiling.ncu.top_k to <i> of this "
    "ncu_k<i>.csv to leave the kernel out"
)


def _is_ncu_header(cells: list[str]) -> bool:
    return "Kernel Name" in cells and "Metric Name" in cells and "Metric Value" in cells


def _ncu_need(header: list[str]) -> int:
    """Cells a metric row needs: it ends after Metric Value (the rule columns stay empty)."""
    cols = [col(header, n) for n in ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value")]
    return max(j for j in cols if j is not None) + 1


def parse_ncu(path: str | Path, run: str, kernel: str | None = None) -> list[dict]:
    """`ncu --csv --page details` output -> profile_ncu rows (mean over profiled launches).

    kernel: the kernels CSV name the file's ncu pass was filtered to (`scalestudy profile ncu`
    runs one pass per kernel). Its rows then carry that name, so profile_ncu joins
    profile_kernels exactly whatever ncu's demangler prints; a file with launches of two kernel
    names is an error (the filter was not specific: FILTER_FIX).

    One function from header to rows on purpose: each metric has its old and new labels and
    units, and keeping the lookup, the unit conversion and the per-launch mean together is what
    makes a format change of ncu a one-place edit."""
    path = Path(path)
    header, rows = rows_after_header(path, _is_ncu_header, "ncu details")
    j_id = col(header, "ID")
    if j_id is None:  # every launch one key: the last one's values were the kernel's mean
        raise ProfileFormatError(
            path, None, f"no ID column: the launches of a kernel cannot be told apart; {REPROFILE}"
        )
    j_kernel = col(header, "Kernel Name")
    j_name, j_unit, j_value = (
        col(header, "Metric Name"),
        col(header, "Metric Unit"),
        col(header, "Metric Value"),
    )
    need = _ncu_need(header)
    launches: dict[tuple[str, str], dict[str, tuple[float, str, int]]] = {}
    for line, cells in rows:
        if len(cells) < need:
            raise ProfileFormatError(
                path, line, f"{len(cells)} cells, a metric row needs at least {need} (truncated?)"
            )
        metric = cells[j_name].strip()
        if not metric:
            continue  # a rule row (Rule Name/Description filled, no metric)
        raw = cells[j_value].strip()
        unit = cells[j_unit].strip() if j_unit is not None else ""
        key = (cells[j_id], cells[j_kernel].strip())
        used = metric in _NCU_NAMED or bool(_SASS.match(metric) or TENSOR_METRIC.match(metric))
        try:
            value, suffix = parse_number(raw)
        except ValueError:
            if used:
                raise ProfileFormatError(path, line, f"{metric}: {raw!r} is not a number") from None
            continue  # text-valued metrics (e.g. "Cache Control") are not needed
        # a negative or overflowing (1e400) value became a negative or infinite duration, rate
        # or percentage in profile_ncu.csv; a kernel of 0 ns a rate of None
        cell = files.POSITIVE if metric in _NCU_DURATION else files.NON_NEGATIVE
        if used and not cell.holds(value):
            raise ProfileFormatError(
                path, line, f"{metric}: {raw!r} is not {cell.what}; {REPROFILE}"
            )
        launches.setdefault(key, {})[metric] = (value, unit or suffix, line)
    if not launches:
        raise ProfileFormatError(path, None, "no metric rows (did ncu profile any kernel?)")
    if kernel is not None:
        names = sorted({name for _, name in launches})
        if len(names) > 1:
            raise ProfileFormatError(
                path,
                None,
                f"launches of {len(names)} kernels, the filter selected {kernel!r}: {names}; "
                f"{FILTER_FIX}",
            )
        launches = {(launch_id, kernel): m for (launch_id, _), m in launches.items()}

    def first(metrics: dict, names: tuple) -> tuple[float, str, int] | None:
        for n in names:
            if n in metrics:
                return metrics[n]
        return None

    per_kernel: dict[str, list[dict]] = {}
    for (launch_id, name), metrics in launches.items():
        dur = first(metrics, _NCU_DURATION)
        if dur is None:
            raise ProfileFormatError(
                path, None, f"launch {launch_id} ({name}): no Duration / gpu__time_duration.sum"
            )
        if not dur[1]:
            # read as ns it was 1000x off for a file whose unit column ncu named otherwise
            raise ProfileFormatError(
                path,
                dur[2],
                f"Duration {dur[0]:g} has no unit (no 'Metric Unit' column, none in the value); "
                "export with `ncu -i R --csv --page details --print-units base`",
            )
        try:
            duration_ns = to_ns(dur[0], dur[1])
        except ValueError as exc:  # e.g. "cycle": a duration ncu did not give in time units
            raise ProfileFormatError(path, dur[2], f"Duration: {exc}") from exc
        flop = tensor = None
        sass: dict[tuple[str, str], float] = {}  # (type, op) -> instructions, smsp__ preferred
        for n, (v, _, _) in sorted(metrics.items()):  # sm__ sorts before smsp__
            if m := _SASS.match(n):
                sass[m["type"], m["op"]] = v
        tens = _tensor_ops(metrics)
        if sass or tens is not None:
            # a launch without a tensor-core counter: its tensor rate is not measured (blank),
            # its FLOP rate the SASS instructions' (a GPU without tensor cores has no other)
            tensor = tens
            flop = (tens or 0.0) + sum(2 * v if op == "fma" else v for (_, op), v in sass.items())
        pct = {
            "achieved_occupancy_pct": first(metrics, _NCU_OCCUPANCY),
            "dram_throughput_pct": first(metrics, _NCU_DRAM),
            "sm_throughput_pct": first(metrics, _NCU_SM),
        }
        per_kernel.setdefault(name, []).append(
            {
                "duration_ns": duration_ns,
                **{k: (v[0] if v else None) for k, v in pct.items()},
                "flop_per_s": flop / (duration_ns * 1e-9)
                if flop is not None and duration_ns
                else None,
                "tensor_flop_per_s": tensor / (duration_ns * 1e-9)
                if tensor is not None and duration_ns
                else None,
            }
        )
    out = []
    for name, items in per_kernel.items():
        row = {"run": run, "kernel": name, "launches": len(items)}
        for column in schema.NCU_COLUMNS[3:]:
            vals = [it[column] for it in items if it[column] is not None]
            row[column] = sum(vals) / len(vals) if vals else None
        row["duration_ns"] = round(row["duration_ns"])  # whole ns, as the schema's times
        out.append(row)
    out.sort(key=lambda r: -r["duration_ns"] * r["launches"])
    return out


def _tensor_ops(metrics: dict) -> float | None:
    """The tensor-core operations of one launch (TENSOR_METRIC's rule), None without a counter."""
    per_dst: dict[str, float] = {}
    src_only: dict[str, float] = {}
    for name, (value, _, _) in metrics.items():
        m = TENSOR_METRIC.match(name)
        if m:
            total = per_dst if m.group(2) else src_only
            total[m.group(1)] = total.get(m.group(1), 0.0) + value
    if not per_dst and not src_only:
        return None
    return sum(per_dst.values()) + sum(v for t, v in src_only.items() if t not in per_dst)


def ncu_files(input_path: str | Path) -> list[Path]:
    """A details CSV, or every *.csv of a directory (sorted)."""
    p = Path(input_path)
    found = sorted(p.glob("*.csv")) if p.is_dir() else [p]
    if not found:
        raise ProfileFormatError(p, None, "no ncu details CSV in this directory")
    return found
