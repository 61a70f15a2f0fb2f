"""Nsight Systems: `nsys stats --format csv` output and the SQLite export -> profile_kernels and
profile_ranges rows.

Kernels: cuda_gpu_kern_sum and cuda_gpu_mem_time_sum (or the pre-2023.1 gpukernsum,
gpumemtimesum, whose 2021.x count column is Operations: a file is recognised by its header, not
its name) of one run, one file or a directory of them (rank from `rank<r>` in the file name).
Schemas: schema.py. Not read: cuda_gpu_sum / cuda_api_gpu_sum, kernels and memory operations
in one table (a Category column), the time of those two summaries again; where it would be the
only source of kernels it is refused by name.

The phase ranges of a rank, the first of these the directory holds for it:
  nsys_rank<r>.sqlite  the report's SQLite export (`nsys export --type sqlite`, or `nsys stats
                       --sqlite`): each range projected onto the GPU by projection.project from
                       the launches of every thread (time_base gpu_projection; export_phases)
  nvtx_gpu_proj_sum    nsys's own projection, "Total Proj Time": only the GPU work launched from
                       the range's own thread, which misses what autograd's thread launches,
                       most of the backward (time_base gpu_projection_same_thread; projection.py)
  nvtx_sum / nvtxsum   "Total Time", the host's push-to-pop time: how long the CPU took to
                       enqueue the phase, never GPU time (time_base host_range)
Columns of nvtx_gpu_proj_sum (Nsight Systems' stats report documentation; seen in real output of
2025.x): Range, Style, Total Proj Time, Total Range Time, Range Instances, Proj
Avg/Med/Min/Max/StdDev, Total GPU Ops, Avg GPU Ops, Avg Range Lvl, Avg Num Child (times with the
`--timeunit` suffix).
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
from pathlib import Path

from scalestudy import files
from scalestudy.errors import ProfileFormatError
from scalestudy.nsight import projection, schema
from scalestudy.nsight.readers import rank_of, read_text, skipped_line
from scalestudy.nsight.tables import col, parse_number, rows_after_header, to_ns


def nsys_table_kind(header: list[str]) -> str | None:
    """kern (cuda_gpu_kern_sum / gpukernsum), mem (cuda_gpu_mem_time_sum / gpumemtimesum),
    nvtx (nvtx_sum / nvtxsum), proj (nvtx_gpu_proj_sum), or None (another report; among them
    the combined summaries, is_combined_summary)."""
    if "Category" in header:  # cuda_gpu_sum / cuda_api_gpu_sum: its kernels would count twice
        return None
    if any(h.startswith("Total Proj Time (") for h in header):
        return "proj" if "Range" in header and "Range Instances" in header else None
    has_time = any(h.startswith("Total Time (") for h in header)
    if not has_time:
        return None
    if "Instances" in header and "Name" in header:
        return "kern"
    # the count of a memory summary: Count (2022+), Operations (2021.x's gpumemtimesum)
    if "Operation" in header and any(c in header for c in ("Count", "Instances", "Operations")):
        return "mem"
    if "Range" in header and ("Instances" in header or "Count" in header):
        return "nvtx"
    return None


def is_combined_summary(header: list[str]) -> bool:
    """Whether header is that of cuda_gpu_sum / cuda_api_gpu_sum: kernels and memory
    operations in one table, told apart by a Category column (the Nsight Systems Analysis
    Guide); the same time as the kernel and memory summaries, so never read beside them."""
    has_time = any(h.startswith("Total Time (") for h in header)
    return has_time and "Category" in header and "Operation" in header


def _is_nsys_header(cells: list[str]) -> bool:
    return nsys_table_kind(cells) is not None


# how to make the tables read here (an error's fixing command)
MAKE_STATS = (
    "make them with `nsys stats --report cuda_gpu_kern_sum --report cuda_gpu_mem_time_sum "
    "--report nvtx_sum --format csv --output <dir>/nsys_rank<r> --sqlite "
    "<dir>/nsys_rank<r>.sqlite <report>.nsys-rep` (or "
    "`scalestudy profile capture`)"
)
COMBINED = (
    "nsys stats' cuda_gpu_sum / cuda_api_gpu_sum (kernels and memory operations in one table, "
    "a Category column) is not read; the summaries read here: "
)


class CombinedSummaryError(ProfileFormatError):
    """A cuda_gpu_sum / cuda_api_gpu_sum table where a table read here was expected."""


def read_nsys_table(path: str | Path) -> tuple[str, list[dict]]:
    """One nsys stats CSV -> (kind, [{"name", "instances", "total_ns"}]); see nsys_table_kind.
    total_ns: "Total Time" (kernels, memory operations, host NVTX ranges) or, of proj,
    "Total Proj Time" (the ranges' GPU time)."""
    path = Path(path)
    header, rows = rows_after_header(
        path, lambda cells: _is_nsys_header(cells) or is_combined_summary(cells), "nsys stats"
    )
    if is_combined_summary(header):
        raise CombinedSummaryError(path, None, COMBINED + MAKE_STATS)
    kind = nsys_table_kind(header)
    time_col = "Total Proj Time (" if kind == "proj" else "Total Time ("
    j_time = col(header, time_col, prefix=True)
    unit = header[j_time][len(time_col) : -1]
    j_count = col(
        header, "Range Instances" if kind == "proj" else "Instances", "Count", "Operations"
    )
    j_name = col(header, {"kern": "Name", "mem": "Operation"}.get(kind, "Range"))
    for line, cells in rows:  # `nsys stats` with several --report and no --output: stdout
        stripped = [c.strip() for c in cells]
        if _is_nsys_header(stripped) or is_combined_summary(stripped):
            raise ProfileFormatError(
                path, line, "another nsys stats table begins here: one CSV holds one report "
                f"(the console output of several --report?); {MAKE_STATS}"
            )  # fmt: skip
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
        # a negative time or count became a negative share or count in the profile CSVs, an
        # overflowing one (1e400: inf) a traceback
        if not (math.isfinite(total) and total >= 0):
            raise ProfileFormatError(
                path, line, f"{header[j_time]} {cells[j_time]!r} is not a finite time >= 0"
            )
        if not files.is_count(count, 1):
            raise ProfileFormatError(
                path, line, f"{header[j_count]} {cells[j_count]!r} is not a whole number >= 1"
            )
        name = cells[j_name].strip()
        if not name:
            raise ProfileFormatError(path, line, "empty name")
        out.append({"name": name, "instances": int(count), "total_ns": total})
    if kind == "kern" and not out:  # the rank's kernels would be missing without a word
        raise ProfileFormatError(
            path, None, "a kernel summary with a header and no rows: truncated? (nsys stats "
            "writes SKIPPED where a report holds no kernels)"
        )  # fmt: skip
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
        found = sorted(p.glob("*.csv"))
        if not found:
            raise ProfileFormatError(p, None, f"no nsys stats CSV here; {MAKE_STATS}")
        return found
    if not p.exists():
        raise ProfileFormatError(p, None, "no such file (made by `scalestudy profile capture`)")
    return [p]


# the nsys stats reports read here, by the names nsys gives their CSVs (<output>_<report>.csv);
# a directory may hold others (`nsys stats` writes cuda_api_sum, osrt_sum, ... by default)
READ_REPORTS = ("cuda_gpu_kern_sum", "gpukernsum", "cuda_gpu_mem_time_sum", "gpumemtimesum")
READ_REPORTS += ("nvtx_sum", "nvtxsum", "nvtx_gpu_proj_sum")
# the reports whose SKIPPED file is an empty table: all read here but the kernel summary
SKIPPABLE_REPORTS = ("cuda_gpu_mem_time_sum", "gpumemtimesum", "nvtx_sum", "nvtxsum")
SKIPPABLE_REPORTS += ("nvtx_gpu_proj_sum",)
KIND_NAMES = {"kern": "kernel summary", "mem": "memory-operation summary", "nvtx": "NVTX range"}
KIND_NAMES["proj"] = "NVTX GPU projection"


def _names(f: Path, reports: tuple[str, ...]) -> bool:
    """Whether the CSV f is named after one of `reports` (nsys stats: <output>_<report>.csv)."""
    return any(report in f.name.lower() for report in reports)


def parse_nsys(input_path: str | Path, run: str) -> tuple[list[dict], list[dict]]:
    """nsys stats CSVs (a file or a directory), and the SQLite exports in that directory ->
    (profile_kernels rows, profile_ranges rows). Of a directory, a CSV named after another
    report and of no table read here is left out (a file given outright is refused), a memory
    or NVTX table that nsys stats SKIPPED (no such data in the window) is an empty one, and no
    kernel summary at all, or a skipped one, is refused (naming a combined cuda_gpu_sum left
    out); a second table of one kind for one rank (a copy, or an old nsys's names beside a new
    one's) is refused: it would count twice."""
    kernels: dict[int, list[dict]] = {}
    ranges: dict[str, dict[int, list[dict]]] = {"export": {}, "proj": {}, "nvtx": {}}
    kinds: dict[int, dict[str, Path]] = {}
    given_file = Path(input_path).is_file()  # a file given outright must be a table read here
    combined: list[Path] = []  # cuda_gpu_sum / cuda_api_gpu_sum left out
    for f in nsys_stats_files(input_path):
        try:
            kind, rows = read_nsys_table(f)
        except ProfileFormatError as exc:
            # nsys stats says "SKIPPED: ... does not contain NVTX data" when the window recorded
            # no NVTX range (no ranges: `scalestudy profile parse` warns), "... GPU memory data"
            # when it made no memcpy or memset: that table is empty, as if its file were
            # missing, not a broken capture. A skipped kernel summary stays an error (no kernels)
            if _names(f, SKIPPABLE_REPORTS) and skipped_line(read_text(f).splitlines()):
                continue
            if not given_file and not _names(f, READ_REPORTS):
                if isinstance(exc, CombinedSummaryError):
                    combined.append(f)
                continue  # another report (cuda_api_sum, osrt_sum, ...): not read here
            raise exc.with_fix(MAKE_STATS) from exc.__cause__
        rank = rank_of(f)
        first = kinds.setdefault(rank, {}).setdefault(kind, f)
        if first != f:
            raise ProfileFormatError(
                f, None, f"rank {rank} has a second {KIND_NAMES[kind]} table, the first being "
                f"{first}: keep one (both would be counted)"
            )  # fmt: skip
        if kind in ("kern", "mem"):
            kernels.setdefault(rank, []).extend(rows)
        else:
            named = ({**r, "name": strip_domain(r["name"])} for r in rows)
            ranges[kind].setdefault(rank, []).extend(named)
    # only other reports, or a skipped NVTX table: 0 kernels is no profile
    missing = [f"rank {rank}: " for rank, seen in kinds.items() if "kern" not in seen]
    if not kinds or missing:
        where = (missing or [""])[0]
        # a combined summary left out: the kernels are there, in a table not read
        also = f"; {combined[0].name}: {COMBINED}{MAKE_STATS}" if combined else ""
        raise ProfileFormatError(
            input_path, None, f"{where}no kernel summary (cuda_gpu_kern_sum / gpukernsum){also}"
        )
    if Path(input_path).is_dir():
        exports: dict[int, Path] = {}
        for f in sorted(Path(input_path).glob("*.sqlite")):
            # its rank from its name, as a CSV's (none: rank 0); nsys stats leaves
            # <report>.sqlite beside each report, so two of one rank are refused as two tables
            rank = rank_of(f)
            if rank in exports:
                raise ProfileFormatError(
                    f, None, f"rank {rank} has a second SQLite export, the first being "
                    f"{exports[rank]}: keep one, named nsys_rank<r>.sqlite"
                )  # fmt: skip
            if rank not in kinds:
                raise ProfileFormatError(
                    f, None, f"rank {rank}'s export, and no kernel summary of rank {rank} here: "
                    "name it nsys_rank<r>.sqlite for the rank whose report it exports"
                )  # fmt: skip
            exports[rank] = f
            phases = export_phases(f)
            if phases:
                ranges["export"][rank] = phases
    phases, time_base = phase_ranges(ranges)
    return (
        schema.kernel_rows(run, "nsys", kernels),
        schema.range_rows(run, "nsys", phases, time_base),
    )


# what each source of phase entries measures, best first (the module docstring)
PHASE_SOURCES = (
    ("export", schema.GPU_PROJECTION),
    ("proj", schema.GPU_PROJECTION_SAME_THREAD),
    ("nvtx", schema.HOST_RANGE),
)


def phase_ranges(ranges: dict[str, dict[int, list[dict]]]):
    """(each rank's phase entries, each rank's time base): of the sources a rank has
    (ranges[source][rank]), the first in PHASE_SOURCES."""
    phases, time_base = {}, {}
    for source, base in PHASE_SOURCES:
        for rank, entries in ranges.get(source, {}).items():
            if entries and rank not in phases:
                phases[rank], time_base[rank] = entries, base
    return phases, time_base


# The nsys SQLite export (its schema reference in the Nsight Systems user guide; the columns
# read here are those nsys's own nvtx_gpu_proj_trace report reads). Times are integer ns.
# NVTX_EVENTS.eventType of the ranges: push/pop 59, start/end 60 (70 and 71: the same, imported
# from NVTXT files); globalTid packs the process id above bit 24, so masking the thread bits off
# gives the globalPid the GPU operation tables carry.
NVTX_RANGE_TYPES = (59, 60, 70, 71)
GPU_OP_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
)
LAUNCH_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"  # the CUDA API calls (runtime and driver)
PID_MASK = 0xFFFFFFFFFF000000


def export_phases(path: str | Path) -> list[dict]:
    """The trainer's phase ranges (schema.RANGES) in one rank's nsys SQLite export, projected
    onto the GPU by projection.project (launches from any thread of the rank's process);
    [] when the export has no NVTX range, no CUDA API call or no GPU operation, refused when the
    database is no nsys export (NSYS_TABLE_PREFIXES)."""
    path = Path(path)
    try:
        con = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise ProfileFormatError(path, None, f"cannot open the SQLite export ({exc})") from exc
    try:
        with contextlib.closing(con):
            return _export_phases(con, path)
    except sqlite3.Error as exc:
        raise ProfileFormatError(
            path, None, f"not an nsys SQLite export ({exc}); made by `nsys export --type sqlite`"
        ) from exc


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in con.execute(f"PRAGMA table_info({table})")}


def _check_span(path: Path, table: str, start, end) -> None:
    """A row's start and end (ns): integers, the end not before the start; else the projection
    summed a negative or meaningless time into the phase."""
    if not (isinstance(start, int) and isinstance(end, int) and end >= start):
        raise ProfileFormatError(
            path, None, f"{table}: a row from {start!r} to {end!r} ns, not an interval; export "
            "the report again with `nsys export --type sqlite`"
        )  # fmt: skip


# table names every nsys SQLite export has some of (its string table, its activity, NVTX,
# target info and enum tables): a database with none is not an export (a 0-byte file opens as an
# empty one), refused, not read as an export without phases (the parse's warning then said the
# rank had no export)
NSYS_TABLE_PREFIXES = ("StringIds", "NVTX_", "CUPTI_", "TARGET_INFO_", "ENUM_")


def _export_phases(con: sqlite3.Connection, path: Path) -> list[dict]:
    tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not any(t.startswith(NSYS_TABLE_PREFIXES) for t in tables):
        what = "empty" if not tables else f"its tables ({', '.join(sorted(tables))}) are not nsys's"
        raise ProfileFormatError(
            path, None, f"not an nsys SQLite export ({what}); made by `nsys export --type sqlite`"
        )
    op_tables = [t for t in GPU_OP_TABLES if t in tables]
    if "NVTX_EVENTS" not in tables or LAUNCH_TABLE not in tables or not op_tables:
        return []
    # an old export without globalPid in a GPU table: correlation ids alone (one process),
    # every thread's process then 0 (mask 0)
    by_pid = all("globalPid" in _columns(con, t) for t in op_tables)
    pid, mask = ("globalPid", PID_MASK) if by_pid else ("0", 0)
    ops: dict[tuple, list[tuple[float, float]]] = {}
    for table in op_tables:
        for start, end, corr, gpid in con.execute(
            # an operation without a correlation id joins no launch (all of them were one key,
            # and a launch without one gave its phase every such operation's time)
            f"SELECT start, end, correlationId, {pid} FROM {table} "
            "WHERE end IS NOT NULL AND correlationId IS NOT NULL"
        ):
            _check_span(path, table, start, end)
            ops.setdefault((gpid, corr), []).append((start, end))
    if not ops:
        return []
    named = "textId" in _columns(con, "NVTX_EVENTS") and "StringIds" in tables
    name = "coalesce(s.value, e.text)" if named else "e.text"
    join = "LEFT JOIN StringIds AS s ON e.textId = s.id" if named else ""
    types = ", ".join(map(str, NVTX_RANGE_TYPES))
    ranges, processes = [], set()
    for text, start, end, gtid in con.execute(
        f"SELECT {name}, e.start, e.end, coalesce(e.globalTid, 0) FROM NVTX_EVENTS AS e {join} "
        f"WHERE e.eventType IN ({types}) AND e.end IS NOT NULL"
    ):
        if text in schema.RANGES:  # the export keeps the domain apart: no prefix to strip
            _check_span(path, f"NVTX_EVENTS ({text})", start, end)
            ranges.append((text, start, end))
            processes.add(gtid & mask)
    if len(processes) > 1:
        raise ProfileFormatError(
            path, None, f"phase ranges of {len(processes)} processes: one rank per report expected"
        )
    launches = [
        (start, (gtid & mask, corr))
        for start, corr, gtid in con.execute(
            f"SELECT start, correlationId, coalesce(globalTid, 0) FROM {LAUNCH_TABLE} "
            "WHERE correlationId IS NOT NULL"
        )
        if (gtid & mask) in processes
    ]
    return projection.project(ranges, launches, ops) if ranges else []
