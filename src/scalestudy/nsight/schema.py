"""The profile CSV schemas, the rows of them, and reading, writing and merging those CSVs.

The parsers (nsys.py, ncu.py, torch_ops.py) turn the tools' files into these rows; no tool is run
in nsight/ (jobs/profile.py runs the tools). Output schemas, one row per run, rank and name (times
are integers in nanoseconds, shares fractions in [0, 1]):

profile_kernels.csv  run, rank, tool, kernel, category, instances, total_ns, share
    kernel     GPU kernel name (nsys: cuda_gpu_kern_sum Name; memcpy/memset rows from
               cuda_gpu_mem_time_sum Operation) or torch.profiler op name (CPU self time, or
               CUDA kernel self device time when torch.profiler ran on a GPU; a CPU run's
               collectives, gloo:all_reduce ...: their time on gloo's thread, torch_ops.py)
    category   one of CATEGORIES (classify()); nccl = collective communication: NCCL kernels on a
               GPU; on a CPU the gloo collectives' time on gloo's thread and the host time of
               the calls that start or wait for them (c10d::allreduce_, FSDP::all_gather,
               FSDP::post_backward_reduce, ...) outside the collectives' spans (inside, the
               span counts it: torch_ops.py); memcpy = copies: memcpy/memset operations,
               aten::copy_, FSDP's copies into and out of its collectives' buffers
               (fsdp::all_gather_copy_in, fsdp::chunk_cat, ...); compiled = a graph
               torch.compile made on a CPU, not broken down into its fused C++ kernels (the
               self time of `## Call CompiledFxGraph <hash> ##`: torch_ops.py)
    instances  launches (kernels), operations (memcpy) or calls (torch ops) inside the window
    total_ns   summed duration inside the profiled window, ns
    share      total_ns / sum of total_ns over the same run and rank
    tool       nsys or torch.profiler
profile_ranges.csv   run, rank, tool, range, time_base, instances, total_ns, share
    range      one of RANGES (the trainer's NVTX / record_function phases), domain prefix stripped
    time_base  what total_ns measures, one of TIME_BASES (one per run and rank):
               gpu_projection  GPU time: each instance of the range projected onto the GPU, from
                               the start of the first to the end of the last GPU operation
                               launched inside it from any thread of the process (projection.py;
                               nsys: from the report's SQLite export; torch.profiler: from the
                               chrome trace)
               gpu_projection_same_thread  the same, of the GPU operations launched from the
                               range's own thread only (nsys nvtx_gpu_proj_sum, read where no
                               export is at hand): it misses what autograd's thread launches,
                               most of the backward, so it is less than the phase's GPU time
               host_range      the range's push-to-pop time on the CPU thread: on a CPU run the
                               phase's real time; on a GPU only how long the host took to enqueue
                               the phase's work (the GPU runs it asynchronously), so never GPU
                               time (an nsys capture with neither of the above)
               A phase that launched no GPU work has a gpu_projection row of 0 ns (and no
               gpu_projection_same_thread row: nvtx_gpu_proj_sum leaves such ranges out).
    total_ns   summed time of that range inside the window, ns (inclusive of nested work)
    share      total_ns / sum over the RANGES of the same run, rank and time base
profile_ncu.csv      run, kernel, launches, duration_ns, achieved_occupancy_pct,
                     dram_throughput_pct, sm_throughput_pct, flop_per_s, tensor_flop_per_s
    kernel     the profile_kernels name of the kernel (jobs/profile_ncu.py filters one kernel
               per ncu pass and labels its rows so), the join key between the two tables; ncu's
               own spelling from a by-hand `profile parse --ncu`
    launches   kernel launches ncu profiled (each value below is the mean over them)
    duration_ns  gpu__time_duration.sum (label "Duration"), ns, rounded to whole ns
    achieved_occupancy_pct  sm__warps_active.avg.pct_of_peak_sustained_active, %
    dram_throughput_pct     (gpu__)dram__throughput.avg.pct_of_peak_sustained_elapsed, %
    sm_throughput_pct       sm__throughput.avg.pct_of_peak_sustained_elapsed, % (labels
                            "Compute (SM) Throughput", "Compute (SM) [%]", "SM [%]")
    flop_per_s   (fadd + fmul + 2 ffma, for f/h/d SASS ops, + tensor ops)
                 / duration; empty when the report lacks those metrics (jobs/profile_ncu.py
                 asks for them)
    tensor_flop_per_s  the tensor-core part of flop_per_s: sm__ops_path_tensor_src_*.sum,
                       per source type its _dst_* totals, else its src-only one (nsight/ncu.py);
                       empty without those counters (not measured, not 0)
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from scalestudy import files
from scalestudy.errors import ProfileFormatError
from scalestudy.nsight.classify import classify
from scalestudy.nsight.readers import read_text

CATEGORIES = (
    "conv",
    "batchnorm",
    "gemm",
    "elementwise",
    "reduce",
    "optimizer",
    "nccl",
    "memcpy",
    "compiled",
    "other",
)
RANGES = ("data", "forward", "backward", "optimizer", "communication")
KERNEL_COLUMNS = ("run", "rank", "tool", "kernel", "category", "instances", "total_ns", "share")
RANGE_COLUMNS = ("run", "rank", "tool", "range", "time_base", "instances", "total_ns", "share")
GPU_PROJECTION, HOST_RANGE = "gpu_projection", "host_range"
GPU_PROJECTION_SAME_THREAD = "gpu_projection_same_thread"
TIME_BASES = (GPU_PROJECTION, GPU_PROJECTION_SAME_THREAD, HOST_RANGE)
NCU_COLUMNS = (
    "run",
    "kernel",
    "launches",
    "duration_ns",
    "achieved_occupancy_pct",
    "dram_throughput_pct",
    "sm_throughput_pct",
    "flop_per_s",
    "tensor_flop_per_s",
)


# ---------------------------------------------------------------------------------------------
# rows of the schemas from each rank's (name, instances, total_ns) entries


def kernel_rows(run: str, tool: str, per_rank: dict[int, list[dict]]) -> list[dict]:
    out = []
    for rank in sorted(per_rank):
        merged: dict[str, dict] = {}
        for r in per_rank[rank]:
            m = merged.setdefault(r["name"], {"instances": 0, "total_ns": 0.0})
            m["instances"] += r["instances"]
            m["total_ns"] += r["total_ns"]
        total = sum(m["total_ns"] for m in merged.values())
        for name, m in sorted(merged.items(), key=lambda kv: -kv[1]["total_ns"]):
            out.append(
                {
                    "run": run,
                    "rank": rank,
                    "tool": tool,
                    "kernel": name,
                    "category": classify(name),
                    "instances": m["instances"],
                    "total_ns": round(m["total_ns"]),
                    "share": m["total_ns"] / total if total else 0.0,
                }
            )
    return out


def range_rows(
    run: str, tool: str, per_rank: dict[int, list[dict]], time_base: dict[int, str]
) -> list[dict]:
    """Rows of profile_ranges from each rank's phase entries, whose times are of
    time_base[rank] (one of TIME_BASES)."""
    out = []
    for rank in sorted(per_rank):
        if time_base[rank] not in TIME_BASES:
            raise ValueError(f"time base {time_base[rank]!r} is none of {TIME_BASES}")
        sums = {name: [0, 0.0] for name in RANGES}
        for r in per_rank[rank]:
            if r["name"] in sums:
                sums[r["name"]][0] += r["instances"]
                sums[r["name"]][1] += r["total_ns"]
        total = sum(v[1] for v in sums.values())
        for name in RANGES:
            count, ns = sums[name]
            if count:
                out.append(
                    {
                        "run": run,
                        "rank": rank,
                        "tool": tool,
                        "range": name,
                        "time_base": time_base[rank],
                        "instances": count,
                        "total_ns": round(ns),
                        "share": ns / total if total else 0.0,
                    }
                )
    return out


def top_kernels(rows: Iterable[dict], k: int) -> list[str]:
    """The k kernels with the most time over all ranks, NCCL and memcpy rows excluded (ncu
    serialises launches, so a profiled NCCL kernel waits forever for its peers)."""
    totals: dict[str, float] = {}
    for r in rows:
        if r["category"] in ("nccl", "memcpy"):
            continue
        totals[r["kernel"]] = totals.get(r["kernel"], 0) + float(r["total_ns"])
    return [name for name, _ in sorted(totals.items(), key=lambda kv: -kv[1])[:k]]


# ---------------------------------------------------------------------------------------------
# writing and merging


def cell(value) -> str:
    """A profile CSV cell: None and NaN blank, floats to 6 significant digits."""
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.6g}"
    return str(value)


def csv_text(columns: tuple[str, ...], rows: Iterable[dict]) -> str:
    """A profile CSV (files.csv_text with the cells of cell())."""
    return files.csv_text(columns, rows, cell)


# what each cell of the profile CSVs holds (kernel_rows, range_rows, ncu.parse_ncu): a word of
# a vocabulary (WORDS), a number as CELLS says (blank only in ncu's optional metrics), or else a
# name (run, tool, kernel, never blank); anything else is a file this module did not write
WORDS = {"category": CATEGORIES, "range": RANGES, "time_base": TIME_BASES}
CELLS = {
    "rank": files.count(0),
    "instances": files.count(1),
    "launches": files.count(1),
    "total_ns": files.NON_NEGATIVE,
    "share": files.FRACTION,
    "duration_ns": files.NON_NEGATIVE,
    # None where ncu gave no value (a report without the FLOP or tensor-core counters)
    **{c: files.NON_NEGATIVE.or_blank() for c in NCU_COLUMNS[4:]},
}


def cell_problem(column: str, text: str) -> str | None:
    """Why `text` cannot be a cell of `column` in a profile CSV (None when it can)."""
    if column in WORDS:
        allowed = WORDS[column]
        return None if text in allowed else f"not one of {', '.join(allowed)}"
    rule = CELLS.get(column)
    if rule is None:  # a name
        return None if text.strip() else "blank, and this column is always filled"
    if rule.holds(text):
        return None
    return "blank, and this column is always filled" if not text.strip() else f"not {rule.what}"


# a run's CSV as the workflow writes it (profile.smk): the study's own, which snakemake makes again
_RUN_CSV = re.compile(r"(^|/)results/profile/[^/]+/(kernels|ranges|ncu)\.csv")


def read_fix(path: Path) -> str:
    """What a refusal of a per-run profile CSV tells to do: the study's own
    (results/profile/<run>/) is parsed again from its capture; one given by hand is the user's
    (delete it, said of a file of their own, lost it)."""
    if _RUN_CSV.search(path.as_posix()):
        return "delete it and run snakemake again (it parses the capture again)"
    return "fix it, or give the study's results/profile/<run>/ CSVs (`snakemake` writes them)"


def read_csv(path: str | Path, columns: tuple[str, ...]) -> list[dict]:
    """A CSV this module wrote; its header must be `columns`, its cells as cell_problem
    allows (an edited cell became a traceback or a negative share in `scalestudy analyze`)."""
    path = Path(path)
    text = read_text(path)
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None or tuple(header) != columns:
        # "header None is not [...]" named no fix: a 0-byte file, another table, another
        # version's columns
        if not header:
            what = "empty (not even a header): no CSV `scalestudy profile parse` wrote"
        else:
            what = f"header {header} is not {list(columns)}, `scalestudy profile parse`'s"
        raise ProfileFormatError(path, 1, f"{what}; {read_fix(path)}")
    rows = []
    for cells in reader:
        if len(cells) != len(columns):
            raise ProfileFormatError(
                path, reader.line_num, f"{len(cells)} cells, not {len(columns)}"
            )
        row = dict(zip(columns, cells, strict=True))
        for column, text in row.items():
            if why := cell_problem(column, text):
                raise ProfileFormatError(
                    path,
                    reader.line_num,
                    f"{column} {text!r} is {why}: not written by `scalestudy profile`; "
                    f"{read_fix(path)}",
                )
        rows.append(row)
    return rows


def merge_csvs(
    paths: Sequence[str | Path], columns: tuple[str, ...], runs: Sequence[str] | None = None
) -> str:
    """Concatenate per-run CSVs of one schema (header checked) into one CSV text. A run in two
    of them (a file given twice, or copied under another name) is refused: its rows would count
    twice in every share and sum of the analysis. `runs`, when given, is the run each input
    belongs to (the workflow's results/profile/<run>/): a row of another run is refused, else a
    CSV copied into another run's directory showed one configuration's kernels as another's."""
    if runs is not None and len(runs) != len(paths):
        raise ProfileFormatError(
            paths[0] if paths else "profile merge",
            None,
            f"{len(paths)} inputs but {len(runs)} --run: name the run of each input, in order",
        )
    rows: list[dict] = []
    came_from: dict[str, Path] = {}  # run -> the input that held it
    for i, p in enumerate(paths):
        new = read_csv(p, columns)
        for run in dict.fromkeys(r["run"] for r in new):
            if runs is not None and run != runs[i]:
                raise ProfileFormatError(
                    p,
                    None,
                    f"rows of run {run!r}, but it is run {runs[i]!r}'s CSV, copied from another "
                    "run; delete it and run snakemake again (it remakes it from this run's "
                    "capture)",
                )
            if run in came_from:
                raise ProfileFormatError(
                    p, None, f"run {run!r} is also in {came_from[run]}; merge each run's CSV once"
                )
            came_from[run] = Path(p)
        rows.extend(new)
    return csv_text(columns, rows)
