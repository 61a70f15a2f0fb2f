"""The profilers' numbers and tables, for the nsys and ncu parsers: numbers with units and
separators, the CSV table after the tool's noise lines.

Robust to what the tools really print (notes: /work/shared/notes/nsight-formats.md): noise lines
before the header, quoted names with commas, thousands separators and unit suffixes in numbers,
`--timeunit` other than ns. A malformed or truncated file is a ProfileFormatError naming the file
and line. Not imported by the capture command (nsight/readers.py).
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from scalestudy.errors import ProfileFormatError
from scalestudy.nsight.readers import read_text, skipped_line

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
# the unit, where one follows, starts with neither a digit nor a separator: "1.234.567" (a
# thousands dot) and "1,23" (a decimal comma) were 1.234 and 1.0 with units ".567" and ",23"
_NUMBER = re.compile(
    r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*((?:[^\d\s.,][^\s]*)?)\s*$"
)
# a first group of 0 is no thousands group: "0,125 ms" is a decimal comma, not 125 ms
_THOUSANDS = re.compile(r"^[-+]?[1-9]\d{0,2}(,\d{3})+(\.\d*)?(\s|$)")


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
# CSV tables after the tool's noise


def rows_after_header(
    path: Path, is_header, what: str
) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """(header, [(line number, cells), ...]) of the first CSV table whose header is_header()
    accepts; lines before it (tool noise) are skipped. Blank lines end nothing (skipped). A
    table without a newline at the end of the file is a truncated one (nsys and ncu end every
    line with one): an error naming its last row."""
    text = read_text(path)
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
                # the file was cut mid-write: nsys and ncu end every line with a newline. A
                # cut inside the last, unquoted cell (a kernel's name) leaves a row that
                # looks whole, with a shorter name that is counted as another kernel
                last_line = rows[-1][0]
                raw = "\n".join(body[last_start:])
                raise ProfileFormatError(
                    path, last_line, f"truncated row (no newline at end of file): {raw[:200]}"
                )
            return header, [(n, c) for n, c in rows if any(x.strip() for x in c)]
    skipped = skipped_line(lines)
    hint = f" (the tool said: {skipped})" if skipped else ""
    raise ProfileFormatError(path, None, f"no {what} header found{hint}")


def col(header: list[str], *names: str, prefix: bool = False) -> int | None:
    for j, h in enumerate(header):
        for name in names:
            if h == name or (prefix and h.startswith(name)):
                return j
    return None
