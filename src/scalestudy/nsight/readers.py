"""Reading the profilers' files, what the capture command checks too (jobs/profile.py: each
rank's file, the tool's SKIPPED line, a CUDA call among torch.profiler's ops) and the parsers
share: the rank in a file name, a file's text, its SKIPPED line. The parsers' numbers and tables
are nsight/tables.py's: the capture imports none of it, so that an edit there reruns the parses,
never a capture (a GPU window of every profiled run).
"""

from __future__ import annotations

import re
from pathlib import Path

from scalestudy.errors import ProfileFormatError

_RANK = re.compile(r"rank[_-]?(\d+)")


def rank_of(path: Path) -> int:
    """The rank in a file name (nsys_rank3_cuda_gpu_kern_sum.csv -> 3); 0 when none."""
    m = _RANK.search(path.name)
    return int(m.group(1)) if m else 0


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ProfileFormatError(path, None, f"cannot read: {exc.strerror or exc}") from exc


def cuda_api(name: str) -> bool:
    """Whether a torch.profiler op's name is a CUDA runtime or driver call (cudaXxx, cuXxx):
    the host's side of GPU work, which the torch.profiler parser and the capture's check both
    read (a GPU rank's export with such calls and no device time recorded nothing on the GPU)."""
    return name.startswith("cuda") or (name.startswith("cu") and name[2:3].isupper())


def skipped_line(lines: list[str]) -> str | None:
    """The tool's `SKIPPED: ...` line (nsys stats: the report has no data of that kind)."""
    return next((ln.strip() for ln in lines if ln.strip().upper().startswith("SKIPPED")), None)
