"""Nsight Systems: `nsys stats --format csv` output -> profile_kernels and profile_ranges rows.

Reads cuda_gpu_kern_sum, cuda_gpu_mem_time_sum, nvtx_gpu_proj_sum and nvtx_sum (or the pre-2023.1
gpukernsum, gpumemtimesum, nvtxsum: a file is recognised by its header, not its name) of one run,
one file or a directory of them (rank from `rank<r>` in the file name). Schemas: schema.py.

The phase ranges of a rank come from nvtx_gpu_proj_sum when it is there: "Total Proj Time" is the
GPU time of the range (time_base gpu_projection). nvtx_sum's "Total Time" is the host's push-to-pop
time, how long the CPU took to enqueue the phase; it is used only where the projection is missing
(an older capture) and then labelled host_range, never passed off as GPU time. Columns of
nvtx_gpu_proj_sum (Nsight Systems' stats report documentation; seen in real output of 2025.x):
Range, Style, Total Proj Time, Total Range Time, Range Instances, Proj Avg/Med/Min/Max/StdDev,
Total GPU Ops, Avg GPU Ops, Avg Range Lvl, Avg Num Child (times with the `--timeunit` suffix).
"""

from __future__ import annotations

from pathlib import Path

from scalestudy.errors import ProfileFormatError
from scalestudy.nsight import schema
from scalestudy.nsight.readers import (
    col,
    parse_number,
    rank_of,
    read_text,
    rows_after_header,
    skipped_line,
    to_ns,
)


def nsys_table_kind(header: list[str]) -> str | None:
    """kern (cuda_gpu_kern_sum / gpukernsum), mem (cuda_gpu_mem_time_sum / gpumemtimesum),
    nvtx (nvtx_sum / nvtxsum), proj (nvtx_gpu_proj_sum), or None."""
    if any(h.startswith("Total Proj Time (") for h in header):
        return "proj" if "Range" in header and "Range Instances" in header else None
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
    """One nsys stats CSV -> (kind, [{"name", "instances", "total_ns"}]); see nsys_table_kind.
    total_ns: "Total Time" (kernels, memory operations, host NVTX ranges) or, of proj,
    "Total Proj Time" (the ranges' GPU time)."""
    path = Path(path)
    header, rows = rows_after_header(path, _is_nsys_header, "nsys stats")
    kind = nsys_table_kind(header)
    time_col = "Total Proj Time (" if kind == "proj" else "Total Time ("
    j_time = col(header, time_col, prefix=True)
    unit = header[j_time][len(time_col) : -1]
    j_count = col(header, "Range Instances" if kind == "proj" else "Instances", "Count")
    j_name = col(header, {"kern": "Name", "mem": "Operation"}.get(kind, "Range"))
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
    ranges: dict[str, dict[int, list[dict]]] = {"proj": {}, "nvtx": {}}
    kinds: dict[int, set[str]] = {}
    for f in nsys_stats_files(input_path):
        try:
            kind, rows = read_nsys_table(f)
        except ProfileFormatError:
            # nsys stats says "SKIPPED: ... does not contain NVTX data" when the window recorded
            # no NVTX range: no ranges (`scalestudy profile parse` warns), not a broken capture
            if "nvtx" in f.name.lower() and skipped_line(read_text(f).splitlines()):
                continue
            raise
        rank = rank_of(f)
        kinds.setdefault(rank, set()).add(kind)
        if kind in ("kern", "mem"):
            kernels.setdefault(rank, []).extend(rows)
        else:
            named = ({**r, "name": strip_domain(r["name"])} for r in rows)
            ranges[kind].setdefault(rank, []).extend(named)
    for rank, seen in kinds.items():
        if "kern" not in seen:
            raise ProfileFormatError(
                input_path, None, f"rank {rank}: no kernel summary (cuda_gpu_kern_sum / gpukernsum)"
            )
    phases, time_base = phase_ranges(ranges["proj"], ranges["nvtx"])
    return (
        schema.kernel_rows(run, "nsys", kernels),
        schema.range_rows(run, "nsys", phases, time_base),
    )


def phase_ranges(proj: dict[int, list[dict]], host: dict[int, list[dict]]):
    """(each rank's phase entries, each rank's time base): the GPU projection where the rank
    has one, else the host ranges, labelled so."""
    phases = {rank: proj.get(rank) or host.get(rank, []) for rank in proj.keys() | host.keys()}
    time_base = {
        rank: schema.GPU_PROJECTION if proj.get(rank) else schema.HOST_RANGE for rank in phases
    }
    return phases, time_base
