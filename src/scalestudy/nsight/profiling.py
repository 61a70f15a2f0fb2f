"""Profile files -> tidy CSVs: Nsight Systems stats, Nsight Compute details, torch.profiler ops.

Pure parsing and classification (no tool is run here; capture.py runs the tools). Output schemas,
one row per run, rank and name (times are integers in nanoseconds, shares fractions in [0, 1]):

profile_kernels.csv  run, rank, tool, kernel, category, instances, total_ns, share
    kernel     GPU kernel name (nsys: cuda_gpu_kern_sum Name; memcpy/memset rows from
               cuda_gpu_mem_time_sum Operation) or torch.profiler op name (CPU self time, or
               CUDA kernel self device time when torch.profiler ran on a GPU)
    category   one of CATEGORIES (classify()); nccl = collective communication: NCCL kernels on a
               GPU, gloo/nccl collectives recorded by torch.profiler on a CPU
    instances  launches (kernels), operations (memcpy) or calls (torch ops) inside the window
    total_ns   summed duration inside the profiled window, ns
    share      total_ns / sum of total_ns over the same run and rank
    tool       nsys or torch.profiler
profile_ranges.csv   run, rank, tool, range, instances, total_ns, share
    range      one of RANGES (the trainer's NVTX / record_function phases), domain prefix stripped
    total_ns   summed wall time of that range inside the window, ns (inclusive of nested work)
    share      total_ns / sum over the RANGES of the same run and rank
profile_ncu.csv      run, kernel, launches, duration_ns, achieved_occupancy_pct,
                     dram_throughput_pct, sm_throughput_pct, flop_per_s, tensor_flop_per_s
    kernel     the profile_kernels name of the kernel (capture.py filters one kernel per ncu
               pass and labels its rows so), the join key between the two tables
    launches   kernel launches ncu profiled (each value below is the mean over them)
    duration_ns  gpu__time_duration.sum (label "Duration"), ns
    achieved_occupancy_pct  sm__warps_active.avg.pct_of_peak_sustained_active, %
    dram_throughput_pct     (gpu__)dram__throughput.avg.pct_of_peak_sustained_elapsed, %
    sm_throughput_pct       sm__throughput.avg.pct_of_peak_sustained_elapsed, % (labels
                            "Compute (SM) Throughput", "Compute (SM) [%]", "SM [%]")
    flop_per_s   (fadd + fmul + 2 ffma, for f/h/d SASS ops, + sm__ops_path_tensor_src_*_dst_*.sum)
                 / duration; empty when the report lacks those metrics (capture.py requests them)
    tensor_flop_per_s  the tensor-core part of flop_per_s (sm__ops_path_tensor_src_*_dst_*.sum)

Robust to what the tools really print (notes: /work/shared/notes/nsight-formats.md): the tool's
noise lines before the header, old (gpukernsum) and new (cuda_gpu_kern_sum) report names (a file
is recognised by its header, not its name), quoted names with commas, `--timeunit` other than ns,
thousands separators and unit suffixes in numbers, ncu rule rows and trailing commas. A malformed
or truncated file is a ProfileFormatError naming the file and line, never an empty CSV.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterable
from pathlib import Path

from scalestudy.errors import ProfileFormatError

CATEGORIES = (
    "conv",
    "batchnorm",
    "gemm",
    "elementwise",
    "reduce",
    "optimizer",
    "nccl",
    "memcpy",
    "other",
)
RANGES = ("data", "forward", "backward", "optimizer", "communication")
KERNEL_COLUMNS = ("run", "rank", "tool", "kernel", "category", "instances", "total_ns", "share")
RANGE_COLUMNS = ("run", "rank", "tool", "range", "instances", "total_ns", "share")
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
# kernel / op categories. First match wins: NCCL kernels contain "reduce" and "copy", cuDNN
# convolutions contain "gemm", so the specific patterns come before the generic ones.
# Decisions on names that fit two classes:
# - cuDNN's direct and explicit-GEMM convolutions (cudnn::detail::wgrad_alg0_engine,
#   dgrad_engine, explicit_convolve_sgemm, precomputed_convolve_sgemm) and its cudnn::gemm::
#   helpers (computeOffsetsKernel: im2col offsets) are conv: PyTorch calls cuDNN for
#   convolutions, never for a plain matrix product.
# - DDP's reducer bookkeeping (torch.distributed.ddp.reducer::..., bucket views and unused-parameter
#   search on the CPU) is no collective and no reduction: "reducer" falls through to other.
# - pooling (max, average, adaptive average and their gradients) reduces a window: reduce.

_CATEGORY_PATTERNS = [
    ("nccl", r"^nccl|^gloo:|^c10d::|allreduce|all_reduce|allgather|all_gather|reduce_scatter"),
    ("memcpy", r"memcpy|memset|^aten::copy_$|^aten::_to_copy$"),
    (
        "conv",
        r"xmma_(fprop|dgrad|wgrad)|implicit_gemm|convolve|scudnn|winograd|cutlass_cudnn"
        r"|reduce_wgrad|fft2d|convolution|conv2d|cudnn::ops::nchwtonhwc|cudnn::ops::nhwctonchw"
        r"|nchwtonhwc|nhwctonchw|dgrad2d|wgrad2d|fprop|(dgrad|wgrad)_(alg\d|engine)|cudnn::gemm::",
    ),
    ("batchnorm", r"bn_fw|bn_bw|batch_norm|batchnorm"),
    ("gemm", r"gemm|gemv|nvjet|splitkreduce|^aten::(addmm|mm|bmm|matmul|linear)$|cublas"),
    (
        "optimizer",
        r"multi_tensor_apply|_foreach_|foreach_tensor|fused_sgd|fused_adam|optimizer\.step|sgd\.step",
    ),
    (
        "reduce",
        r"reduce(?!r)|max_pool|avg_pool|adaptive_avg|adaptive_average|pool2d|pooling|softmax"
        r"|nll_loss|cross_entropy|^aten::(sum|mean|argmax|max|amax|norm)$",
    ),
    (
        "elementwise",
        r"elementwise|^aten::(add|add_|mul|mul_|div|div_|relu|relu_|threshold_backward|sub|sub_"
        r"|neg|clamp|clamp_|clamp_min|clamp_min_|clamp_max|clamp_max_|fill_|zero_|zeros|cat|flip"
        r"|where|pad|constant_pad_nd|lerp_|addcmul_"
        r"|addcdiv_|sqrt|rsub|exp|log|log_softmax|_log_softmax|eq|ne|lt|gt|index|index_select"
        r"|gather|scatter|masked_fill_|contiguous|clone|empty_like|ones_like|_unsafe_view)$",
    ),
]
_COMPILED = [(cat, re.compile(pat, re.IGNORECASE)) for cat, pat in _CATEGORY_PATTERNS]


def classify(name: str) -> str:
    """Category (CATEGORIES) of a kernel or op name; a leading `void ` is ignored."""
    text = name.strip()
    if text.lower().startswith("void "):
        text = text[5:].lstrip()
    for category, pattern in _COMPILED:
        if pattern.search(text):
            return category
    return "other"


# ---------------------------------------------------------------------------------------------
# numbers

_TIME_UNITS_NS = {
    "ns": 1.0,
    "nsecond": 1.0,
    "nsec": 1.0,
    "usec": 1e3,
    "msec": 1e6,
    "us": 1e3,
    "usecond": 1e3,
    "µs": 1e3,
    "ms": 1e6,
    "msecond": 1e6,
    "s": 1e9,
    "sec": 1e9,
    "second": 1e9,
}
_NUMBER = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(\S*)\s*$")
_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(,\d{3})+(\.\d*)?(\s|$)")


def parse_number(text: str) -> tuple[float, str]:
    """'1,234.5' -> (1234.5, ''); '12.3 ms' -> (12.3, 'ms'); '45 %' -> (45.0, '%')."""
    cleaned = text.strip().replace("\u202f", "").replace("\xa0", "")
    if _THOUSANDS.match(cleaned):
        cleaned = cleaned.replace(",", "")
    m = _NUMBER.match(cleaned)
    if not m:
        raise ValueError(f"not a number: {text!r}")
    return float(m.group(1)), m.group(2)


def to_ns(value: float, unit: str) -> float:
    """A duration in `unit` (ns, us/usecond, ms/msecond, s/second, plurals too) -> ns."""
    key = unit.strip().lower()
    if key not in _TIME_UNITS_NS and key.endswith("s") and key[:-1] in _TIME_UNITS_NS:
        key = key[:-1]  # "nseconds", "msecs"
    if key not in _TIME_UNITS_NS:
        raise ValueError(f"unknown time unit {unit!r}")
    return value * _TIME_UNITS_NS[key]


# ---------------------------------------------------------------------------------------------
# CSV reading shared by the parsers


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ProfileFormatError(path, None, f"cannot read: {exc.strerror or exc}") from exc


def _full_width(header: list[str], cells: list[str]) -> bool:
    return len(cells) >= len(header)


def _skipped_line(lines: list[str]) -> str | None:
    """The tool's `SKIPPED: ...` line (nsys stats: the report has no data of that kind)."""
    return next((ln.strip() for ln in lines if ln.strip().upper().startswith("SKIPPED")), None)


def _rows_after_header(
    path: Path, is_header, what: str, row_complete=_full_width
) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """(header, [(line number, cells), ...]) of the first CSV table whose header is_header()
    accepts; lines before it (tool noise) are skipped. Blank lines end nothing (skipped).
    row_complete(header, cells) says whether a row has all the cells its kind needs (ncu metric
    rows stop after Metric Value); it judges the last row of a file with no final newline."""
    text = _read_text(path)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.strip() or "," not in line:
            continue
        try:
            cells = next(csv.reader([line]))
        except (csv.Error, StopIteration):
            continue
        if is_header([c.strip() for c in cells]):
            header = [c.strip() for c in cells]
            rows = []
            body = lines[i + 1 :]
            reader = csv.reader(io.StringIO("\n".join(body)))
            last_start = 0  # body line where the last record began
            try:
                for cells_ in reader:
                    rows.append((i + 1 + reader.line_num, cells_))
                    if reader.line_num < len(body):
                        last_start = reader.line_num
            except csv.Error as exc:
                raise ProfileFormatError(
                    path, i + 1 + reader.line_num, f"malformed CSV ({exc}); truncated file?"
                ) from exc
            if text and not text.endswith("\n") and rows:
                # the file may have been cut mid-write. Python's csv reader accepts an open
                # quote at the end of the data, so a cut inside a quoted name (names with
                # commas are quoted, ncu quotes every cell) leaves an odd number of quotes;
                # a cut between cells leaves fewer cells than the row's kind has
                last_line, last = rows[-1]
                raw = "\n".join(body[last_start:])
                if raw.count('"') % 2 or not row_complete(header, last):
                    raise ProfileFormatError(
                        path, last_line, f"truncated row (no newline at end of file): {raw[:200]}"
                    )
            return header, [(n, c) for n, c in rows if any(x.strip() for x in c)]
    skipped = _skipped_line(lines)
    hint = f" (the tool said: {skipped})" if skipped else ""
    raise ProfileFormatError(path, None, f"no {what} header found{hint}")


def _col(header: list[str], *names: str, prefix: bool = False) -> int | None:
    for j, h in enumerate(header):
        for name in names:
            if h == name or (prefix and h.startswith(name)):
                return j
    return None


# ---------------------------------------------------------------------------------------------
# nsys stats CSVs


def nsys_table_kind(header: list[str]) -> str | None:
    """kern (cuda_gpu_kern_sum / gpukernsum), mem (cuda_gpu_mem_time_sum / gpumemtimesum),
    nvtx (nvtx_sum / nvtxsum), or None."""
    has_time = any(h.startswith("Total Time (") for h in header)
    if not has_time:
        return None
    if "Instances" in header and "Name" in header:
        return "kern"
    if "Operation" in header and ("Count" in header or "Instances" in header):
        return "mem"
    if "Range" in header and ("Instances" in header or "Count" in header):
        return "nvtx"
    return None


def _is_nsys_header(cells: list[str]) -> bool:
    return nsys_table_kind(cells) is not None


def read_nsys_table(path: str | Path) -> tuple[str, list[dict]]:
    """One nsys stats CSV -> (kind, [{"name", "instances", "total_ns"}]); see nsys_table_kind."""
    path = Path(path)
    header, rows = _rows_after_header(path, _is_nsys_header, "nsys stats")
    kind = nsys_table_kind(header)
    j_time = _col(header, "Total Time (", prefix=True)
    unit = header[j_time][len("Total Time (") : -1]
    j_count = _col(header, "Instances", "Count")
    j_name = _col(header, {"kern": "Name", "mem": "Operation", "nvtx": "Range"}[kind])
    out = []
    for line, cells in rows:
        if len(cells) > len(header) and all(not c.strip() for c in cells[len(header) :]):
            cells = cells[: len(header)]  # trailing commas
        if len(cells) != len(header):
            raise ProfileFormatError(
                path,
                line,
                f"{len(cells)} cells, the header has {len(header)} (truncated or unquoted comma?)",
            )
        try:
            total = to_ns(*_value_unit(cells[j_time], unit))
            count = parse_number(cells[j_count])[0]
        except ValueError as exc:
            raise ProfileFormatError(path, line, str(exc)) from exc
        name = cells[j_name].strip()
        if not name:
            raise ProfileFormatError(path, line, "empty name")
        out.append({"name": name, "instances": int(count), "total_ns": total})
    return kind, out


def _value_unit(text: str, header_unit: str) -> tuple[float, str]:
    value, unit = parse_number(text)
    return value, unit or header_unit


_RANK = re.compile(r"rank[_-]?(\d+)")


def rank_of(path: Path) -> int:
    """The rank in a file name (nsys_rank3_cuda_gpu_kern_sum.csv -> 3); 0 when none."""
    m = _RANK.search(path.name)
    return int(m.group(1)) if m else 0


def strip_domain(name: str) -> str:
    """nsys 2025 nvtx_sum prefixes the domain (':forward', 'NCCL:ncclAllReduce')."""
    return name.split(":", 1)[1] if ":" in name else name


def nsys_stats_files(input_path: str | Path) -> list[Path]:
    """A stats CSV, or every *.csv under a report directory (sorted)."""
    p = Path(input_path)
    if p.is_dir():
        files = sorted(p.glob("*.csv"))
        if not files:
            raise ProfileFormatError(
                p,
                None,
                "no nsys stats CSV here; make them with `nsys stats --report cuda_gpu_kern_sum "
                "--report cuda_gpu_mem_time_sum --report nvtx_sum --format csv --output "
                "<dir>/nsys_rank<r> <report>.nsys-rep` (or `scalestudy profile capture`)",
            )
        return files
    if not p.exists():
        raise ProfileFormatError(p, None, "no such file (made by `scalestudy profile capture`)")
    return [p]


def parse_nsys(input_path: str | Path, run: str) -> tuple[list[dict], list[dict]]:
    """nsys stats CSVs (a file or a directory) -> (profile_kernels rows, profile_ranges rows)."""
    kernels: dict[int, list[dict]] = {}
    ranges: dict[int, list[dict]] = {}
    kinds: dict[int, set[str]] = {}
    for f in nsys_stats_files(input_path):
        try:
            kind, rows = read_nsys_table(f)
        except ProfileFormatError:
            # nsys stats says "SKIPPED: ... does not contain NVTX data" when the window recorded
            # no NVTX range: no ranges (capture.parse warns), not a broken capture
            if "nvtx" in f.name.lower() and _skipped_line(_read_text(f).splitlines()):
                continue
            raise
        rank = rank_of(f)
        kinds.setdefault(rank, set()).add(kind)
        if kind in ("kern", "mem"):
            kernels.setdefault(rank, []).extend(rows)
        else:
            ranges.setdefault(rank, []).extend({**r, "name": strip_domain(r["name"])} for r in rows)
    for rank, seen in kinds.items():
        if "kern" not in seen:
            raise ProfileFormatError(
                input_path, None, f"rank {rank}: no kernel summary (cuda_gpu_kern_sum / gpukernsum)"
            )
    return (
        _kernel_rows(run, "nsys", kernels),
        _range_rows(run, "nsys", ranges),
    )


def _kernel_rows(run: str, tool: str, per_rank: dict[int, list[dict]]) -> list[dict]:
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


def _range_rows(run: str, tool: str, per_rank: dict[int, list[dict]]) -> list[dict]:
    out = []
    for rank in sorted(per_rank):
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
                        "instances": count,
                        "total_ns": round(ns),
                        "share": ns / total if total else 0.0,
                    }
                )
    return out


def top_kernels(kernel_rows: Iterable[dict], k: int) -> list[str]:
    """The k kernels with the most time over all ranks, NCCL and memcpy rows excluded (ncu
    serialises launches, so a profiled NCCL kernel waits forever for its peers)."""
    totals: dict[str, float] = {}
    for r in kernel_rows:
        if r["category"] in ("nccl", "memcpy"):
            continue
        totals[r["kernel"]] = totals.get(r["kernel"], 0) + float(r["total_ns"])
    return [name for name, _ in sorted(totals.items(), key=lambda kv: -kv[1])[:k]]


# ---------------------------------------------------------------------------------------------
# ncu --csv --page details

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
_SASS = re.compile(r"^smsp?__sass_thread_inst_executed_op_([hfd])(add|mul|fma)_pred_on\.sum$")
# tensor-core operations: the per-(source, destination type) totals only. The src-only totals
# (sm__ops_path_tensor_src_fp16.sum) and the _sparsity_on/_off breakdowns count the same
# operations again. capture.py requests exactly these.
TENSOR_METRIC = re.compile(r"^sm__ops_path_tensor_src_[a-z0-9]+_dst_[a-z0-9]+\.sum$")


def _is_ncu_header(cells: list[str]) -> bool:
    return "Kernel Name" in cells and "Metric Name" in cells and "Metric Value" in cells


def _ncu_need(header: list[str]) -> int:
    """Cells a metric row needs: it ends after Metric Value (the rule columns stay empty)."""
    cols = [_col(header, n) for n in ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value")]
    return max(j for j in cols if j is not None) + 1


def parse_ncu(path: str | Path, run: str, kernel: str | None = None) -> list[dict]:
    """`ncu --csv --page details` output -> profile_ncu rows (mean over profiled launches).

    kernel: the kernels CSV name the file's ncu pass was filtered to (capture.ncu runs one pass
    per kernel). Its rows then carry that name, so profile_ncu joins profile_kernels exactly
    whatever ncu's demangler prints; a file with launches of two kernel names is an error (the
    filter was not specific)."""
    path = Path(path)
    header, rows = _rows_after_header(
        path, _is_ncu_header, "ncu details", lambda h, c: len(c) >= _ncu_need(h)
    )
    j_id = _col(header, "ID")
    j_kernel = _col(header, "Kernel Name")
    j_name, j_unit, j_value = (
        _col(header, "Metric Name"),
        _col(header, "Metric Unit"),
        _col(header, "Metric Value"),
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
        key = (cells[j_id] if j_id is not None else "", cells[j_kernel].strip())
        try:
            value, suffix = parse_number(raw)
        except ValueError:
            if metric in (*_NCU_DURATION, *_NCU_OCCUPANCY, *_NCU_DRAM, *_NCU_SM):
                raise ProfileFormatError(path, line, f"{metric}: {raw!r} is not a number") from None
            continue  # text-valued metrics (e.g. "Cache Control") are not needed
        launches.setdefault(key, {})[metric] = (value, unit or suffix, line)
    if not launches:
        raise ProfileFormatError(path, None, "no metric rows (did ncu profile any kernel?)")
    if kernel is not None:
        names = sorted({name for _, name in launches})
        if len(names) > 1:
            raise ProfileFormatError(
                path,
                None,
                f"launches of {len(names)} kernels, the filter selected {kernel!r}: {names}",
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
        try:
            duration_ns = to_ns(dur[0], dur[1] or "ns")
        except ValueError as exc:  # e.g. "cycle": a duration ncu did not give in time units
            raise ProfileFormatError(path, dur[2], f"Duration: {exc}") from exc
        flop = tensor = None
        sass = {n: v for n, (v, _, _) in metrics.items() if _SASS.match(n)}
        tens = [v for n, (v, _, _) in metrics.items() if TENSOR_METRIC.match(n)]
        if sass or tens:
            tensor = sum(tens)
            flop = tensor
            for n, v in sass.items():
                flop += 2 * v if _SASS.match(n).group(2) == "fma" else v
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
        for col in NCU_COLUMNS[3:]:
            vals = [it[col] for it in items if it[col] is not None]
            row[col] = sum(vals) / len(vals) if vals else None
        out.append(row)
    out.sort(key=lambda r: -r["duration_ns"] * r["launches"])
    return out


# ---------------------------------------------------------------------------------------------
# torch.profiler (the trainer's key_averages export, profile/torch_ops_rank{r}.json)


def parse_torch(input_path: str | Path, run: str) -> tuple[list[dict], list[dict]]:
    """torch_ops_rank{r}.json files (a file or a directory) -> (kernels rows, ranges rows).

    Each JSON holds {"ops": [{"name", "count", "self_cpu_us", "cpu_total_us",
    "self_device_us", "device_type"}]}. Kernels: on a GPU (any self_device_us) the CUDA-side
    entries by self device time; on a CPU the ops by self CPU time (self time: no double counting
    of nested ops). The phase ranges (RANGES) come from their record_function entries (inclusive).
    """
    p = Path(input_path)
    files = sorted(p.glob("torch_ops_rank*.json")) if p.is_dir() else [p]
    if not files:
        raise ProfileFormatError(
            p, None, "no torch_ops_rank*.json (written by `scalestudy train --profile-steps A:B`)"
        )
    kernels: dict[int, list[dict]] = {}
    ranges: dict[int, list[dict]] = {}
    for f in files:
        try:
            doc = json.loads(_read_text(f))
            ops = doc["ops"]
        except json.JSONDecodeError as exc:
            raise ProfileFormatError(
                f, exc.lineno, f"malformed JSON ({exc.msg}); truncated?"
            ) from exc
        except (KeyError, TypeError) as exc:
            raise ProfileFormatError(f, None, "no 'ops' list (not a torch_ops export)") from exc
        if not ops:
            raise ProfileFormatError(f, None, "no profiled ops: the window recorded nothing")
        on_gpu = any(float(op.get("self_device_us") or 0) > 0 for op in ops)
        rank = rank_of(f)
        for i, op in enumerate(ops):
            try:
                name, count = str(op["name"]), int(op["count"])
                self_cpu, inclusive = float(op["self_cpu_us"]), float(op["cpu_total_us"])
                self_dev = float(op.get("self_device_us") or 0)
            except (KeyError, TypeError, ValueError) as exc:
                raise ProfileFormatError(f, None, f"op {i}: bad entry {op!r} ({exc})") from exc
            if name in RANGES:
                ranges.setdefault(rank, []).append(
                    {"name": name, "instances": count, "total_ns": inclusive * 1e3}
                )
                continue
            if name.startswith("ProfilerStep") or name.startswith("## "):
                continue
            t = self_dev if on_gpu else self_cpu
            if on_gpu and (op.get("device_type") or "").upper() not in ("CUDA", "DEVICETYPE.CUDA"):
                continue  # on a GPU the CUDA kernels carry the time; their CPU launchers do not
            if t > 0:
                kernels.setdefault(rank, []).append(
                    {"name": name, "instances": count, "total_ns": t * 1e3}
                )
    return _kernel_rows(run, "torch.profiler", kernels), _range_rows(run, "torch.profiler", ranges)


# ---------------------------------------------------------------------------------------------
# writing and merging


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.6g}"
    return str(value)


def csv_text(columns: tuple[str, ...], rows: Iterable[dict]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow([_fmt(r[c]) for c in columns])
    return out.getvalue()


def read_csv(path: str | Path, columns: tuple[str, ...]) -> list[dict]:
    """A CSV this module wrote; its header must be `columns`."""
    path = Path(path)
    text = _read_text(path)
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None or tuple(header) != columns:
        raise ProfileFormatError(path, 1, f"header {header} is not {list(columns)}")
    rows = []
    for cells in reader:
        if len(cells) != len(columns):
            raise ProfileFormatError(
                path, reader.line_num, f"{len(cells)} cells, not {len(columns)}"
            )
        rows.append(dict(zip(columns, cells, strict=True)))
    return rows


def merge_csvs(paths: Iterable[str | Path], columns: tuple[str, ...]) -> str:
    """Concatenate per-run CSVs of one schema (header checked) into one CSV text."""
    rows: list[dict] = []
    for p in paths:
        rows.extend(read_csv(p, columns))
    return csv_text(columns, rows)


# ---------------------------------------------------------------------------------------------
# which runs are profiled
