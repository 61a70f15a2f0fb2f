"""The trainer's phase ranges projected onto the GPU: one rule for both profilers' parsers.

A GPU operation (kernel, memcpy, memset) belongs to a range when the CUDA API call that launched
it started inside the range's host interval, on ANY thread of the process. The thread matters:
PyTorch's autograd engine runs a CUDA backward on its own device thread, which launches the
backward's kernels (and DDP's all-reduces, from its hooks) while the main thread waits in
backward(). On one H100 (torch 2.11, tests/fixtures/gpu-h100/trace_rank0.json) 79 of the 81
launches inside a backward range came from that thread.

Nsight Systems' own projection (the nvtx_gpu_proj_sum / nvtx_gpu_proj_trace reports) counts only
the launches made on the range's own thread (its query joins the CUDA API call to the range on
the thread id), so on that trace it would give the backward 127 us of GPU time instead of
8,125 us. The phases are sequential on the main thread, so a launch falls in one phase at most,
and nesting does not matter.

A range instance's projected time runs from the start of its first to the end of its last GPU
operation; a phase's time is the sum over its instances. Pure: the parsers read the files
(torch_ops.py: a chrome trace; nsys.py: an nsys SQLite export).
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable


def project(
    ranges: Iterable[tuple[str, float, float]],
    launches: Iterable[tuple[float, Hashable]],
    ops: dict[Hashable, list[tuple[float, float]]],
) -> list[dict]:
    """[{"name", "instances", "total_ns"}] per range name, in order of first appearance.

    ranges: (name, host start, host end) of each range instance; launches: (start, key) of each
    CUDA API call, any thread; ops: key -> [(start, end)] of the GPU operations that call
    launched (the key: a correlation id, with its process where several share a file). All
    times in ns. A launch without GPU operations is ignored; a range instance that launched
    nothing counts as an instance with 0 ns."""
    timed = sorted((float(ts), key) for ts, key in launches if key in ops)
    starts = [ts for ts, _ in timed]
    sums: dict[str, list] = {}
    for name, begin, end in ranges:
        inside = timed[bisect.bisect_left(starts, begin) : bisect.bisect_right(starts, end)]
        spans = [span for _, key in inside for span in ops[key]]
        entry = sums.setdefault(name, [0, 0.0])
        entry[0] += 1
        if spans:
            entry[1] += max(b for _, b in spans) - min(a for a, _ in spans)
    return [{"name": n, "instances": count, "total_ns": ns} for n, (count, ns) in sums.items()]
