"""torch.profiler: the trainer's key_averages export (profile/torch_ops_rank{r}.json) ->
profile_kernels and profile_ranges rows (schemas: schema.py)."""

from __future__ import annotations

import bisect
import json
import math
from pathlib import Path
from typing import NamedTuple

from scalestudy.errors import ProfileFormatError
from scalestudy.nsight import projection, schema
from scalestudy.nsight.classify import classify
from scalestudy.nsight.readers import cuda_api, rank_of, read_text

RECAPTURE = "capture again with `scalestudy profile capture`"


def parse_torch(input_path: str | Path, run: str) -> tuple[list[dict], list[dict]]:
    """torch_ops_rank{r}.json files (a file or a directory) -> (kernels rows, ranges rows):
    read_torch's, without its GPU ranks."""
    profile = read_torch(input_path, run)
    return profile.kernels, profile.ranges


class TorchProfile(NamedTuple):
    """read_torch's result: the profile_kernels and profile_ranges rows, and the ranks whose
    export has device time (a GPU's: on them a host_range phase is enqueue time, not GPU time,
    where the trace beside the export was missing or had no GPU operation)."""

    kernels: list[dict]
    ranges: list[dict]
    gpu_ranks: list[int]


def read_torch(input_path: str | Path, run: str) -> TorchProfile:
    """torch_ops_rank{r}.json files (a file or a directory) -> their rows and GPU ranks.

    Each JSON holds {"ops": [{"name", "count", "self_cpu_us", "cpu_total_us", "self_device_us",
    "device_total_us", "device_type", "user_annotation"}]} (trainer/measure.py,
    torch_ops_export). The first format (scalestudy-torch-ops-1) had no device_total_us and no
    user_annotation: it is read on a CPU; on a GPU it is refused where a CUDA entry other than a
    phase range has a CPU entry of its name, for then it is kineto's device-side span of a range
    (DistributedDataParallel.forward, Optimizer.step#SGD.step), which was counted as a kernel
    (the kernels it spans twice), or a compiled run's Triton kernel (its launcher records a CPU
    entry of its name), and only the flag tells them apart. Kernels: on a GPU (any
    self_device_us) the CUDA-side entries by self device time; on a CPU the ops by self CPU time
    (self time: no double counting of nested ops), summed over every thread as a GPU's kernels
    over its streams, and each collective (gloo:all_reduce, ...: is_collective) by its time on
    gloo's thread, less the ops it ran there (nested_in_collectives, from the trace beside the
    export; without one its whole time). A wait for a collective is not counted: the
    collective's own time is its communication. DDP's wait for its all-reduce is self time of
    the backward range (not counted); the calls that start or wait for a collective, category
    nccl (c10d::allreduce_, FSDP::all_gather, FSDP::post_backward_reduce, ...), count their
    self time outside the spans of the rank's collectives on other threads (waits_in_collectives,
    from the same trace; without one their whole self time): inside a span they wait for it, or,
    sharing a core with gloo's thread, run beside it. Other ops that ran beside a collective
    (the backward's compute, overlapping DDP's all-reduce) keep their self time, as a GPU's
    kernels overlapping NCCL's do. A compiled graph's call counts its self time, its fused
    kernels' (compiled).
    The device-side entries of record_function ranges (user annotations) are not kernels: their
    time spans kernels counted themselves.
    Phase ranges (schema.RANGES, the trainer's record_function ranges): on a GPU each range
    projected onto the GPU from the chrome trace beside the export (trace_rank{r}.json:
    trace_phases; time_base gpu_projection); where the trace has no GPU operation or is missing,
    and on a CPU run (no device time in the export: its trace is read only for its
    collectives), the host entries' inclusive CPU time (host_range: the phase's real time on a
    CPU, only enqueue time on a GPU). The export's own device-side entries of the ranges are not
    used: they hold only the GPU operations launched directly under them, not under a nested
    range, nor from another thread (trace_phases).
    An export whose host called the CUDA runtime but that has no device time (CUPTI recorded
    nothing on the GPU: nsys holding it, say) is refused: read as a CPU run's, its host times
    were kernels (cudaLaunchKernel among them) and its phases enqueue time.
    """
    p = Path(input_path)
    files = sorted(p.glob("torch_ops_rank*.json")) if p.is_dir() else [p]
    if not files:
        raise ProfileFormatError(
            p, None, "no torch_ops_rank*.json (written by `scalestudy train --profile-steps A:B`)"
        )
    kernels: dict[int, list[dict]] = {}
    ranges: dict[int, list[dict]] = {}
    time_base: dict[int, str] = {}
    first: dict[int, Path] = {}
    gpu_ranks = []
    for f in files:
        rank = rank_of(f)
        if (seen := first.setdefault(rank, f)) != f:  # a copy beside it: one would replace the
            raise ProfileFormatError(  # other's kernels and phases
                f, None, f"rank {rank} has a second export, the first being {seen}: keep one"
            )
        ops = [_entry(f, i, op) for i, op in enumerate(_ops(f))]
        on_gpu = any(op["self_dev"] > 0 for op in ops)
        if on_gpu:
            gpu_ranks.append(rank)
        if not on_gpu and (api := _cuda_api_call(ops)):
            raise ProfileFormatError(
                f, None, f"no GPU activity: the host called the CUDA runtime ({api!r}) but the "
                f"export has no CUDA entry and no device time: CUPTI recorded nothing on the GPU "
                f"(another profiler holding it, nsys for one, or CUPTI unavailable), and its "
                f"host times are no kernels; {RECAPTURE}"
            )  # fmt: skip
        if on_gpu and (twin := _unflagged_twin(ops)):
            raise ProfileFormatError(
                f, None, f"a GPU export without user_annotation flags (format "
                f"scalestudy-torch-ops-1) whose CUDA entry {twin!r} has a CPU entry of its name: "
                f"a range's device-side span or a kernel, which only the flag tells; "
                f"{RECAPTURE} (this version writes the flags)"
            )  # fmt: skip
        # a CPU run's collectives: their time on gloo's thread, less the ops they ran there;
        # the calls that start or wait for them: their self time outside the collectives
        nested, waited = {}, {}
        if not on_gpu and any(is_collective(op["name"]) and op["cpu_total"] for op in ops):
            nested, waited = _trace_beside(f, _collective_times) or ({}, {})
        rank_kernels = _kernels(ops, on_gpu, nested, waited)
        if rank_kernels:
            kernels[rank] = rank_kernels
        # a CPU run (no device time in the export) has no GPU operation to project: its trace,
        # a few MB per rank, is read only for its collectives
        phases, time_base[rank] = _phases(ops, _trace_beside(f, trace_phases) if on_gpu else [])
        if phases:
            ranges[rank] = phases
    return TorchProfile(
        schema.kernel_rows(run, "torch.profiler", kernels),
        schema.range_rows(run, "torch.profiler", ranges, time_base),
        sorted(gpu_ranks),
    )


def _ops(f: Path) -> list:
    try:
        ops = json.loads(read_text(f))["ops"]
    except json.JSONDecodeError as exc:
        raise ProfileFormatError(f, exc.lineno, f"malformed JSON ({exc.msg}); truncated?") from exc
    except (KeyError, TypeError) as exc:
        raise ProfileFormatError(f, None, "no 'ops' list (not a torch_ops export)") from exc
    if not isinstance(ops, list):
        raise ProfileFormatError(f, None, f"'ops' is {ops!r}, not a list (not a torch_ops export)")
    if not ops:
        raise ProfileFormatError(f, None, "no profiled ops: the window recorded nothing")
    return ops


def measured(value, what: str, least: float | None = 0, whole: bool = False) -> float:
    """A time or count of a profiler file: a finite JSON number, >= least unless least is None
    (whole: an integer), else ValueError. A negative, infinite or NaN time became a negative
    share or a traceback (round(nan)) in the profile CSVs; true counted as 1."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not (ok and (least is None or value >= least) and (not whole or value == int(value))):
        kind = "a whole number" if whole else "a finite number"
        raise ValueError(
            f"{what} is {value!r}, not {kind}{'' if least is None else f' >= {least}'}"
        )
    return value


def _entry(f: Path, i: int, op) -> dict:
    """One export entry, checked; times in us."""
    if not isinstance(op, dict):  # was "'int' object has no attribute 'get'"
        raise ProfileFormatError(f, None, f"op {i} is {op!r}, not an object; {RECAPTURE}")
    try:
        self_dev = op.get("self_device_us")
        device_type = str(op.get("device_type") or "").upper()
        annotation = op.get("user_annotation", False)
        if not isinstance(annotation, bool):
            raise ValueError(f"user_annotation is {annotation!r}, not true or false")
        return {
            "name": str(op["name"]),
            "count": int(measured(op["count"], "count", least=1, whole=True)),
            "self_cpu": float(measured(op["self_cpu_us"], "self_cpu_us")),
            "cpu_total": float(measured(op["cpu_total_us"], "cpu_total_us")),
            # absent (None) from the entries of older exports that ran no device code
            "self_dev": 0.0 if self_dev is None else float(measured(self_dev, "self_device_us")),
            "cuda": device_type in ("CUDA", "DEVICETYPE.CUDA"),
            "annotation": annotation,
            "flagged": "user_annotation" in op,  # absent from format 1
        }
    except KeyError as exc:  # was "bad entry {...} ('count')": the repr of the KeyError
        why = f"op {i} has no {exc.args[0]!r} ({op!r})"
        raise ProfileFormatError(f, None, f"{why}; {RECAPTURE}") from exc
    except (TypeError, ValueError, AttributeError) as exc:
        raise ProfileFormatError(f, None, f"op {i}: bad entry {op!r} ({exc}); {RECAPTURE}") from exc


def _cuda_api_call(ops: list[dict]) -> str | None:
    """The CUDA runtime or driver call (cudaLaunchKernel, cudaGraphLaunch, cuLaunchKernel, ...)
    of most host self time, None where the host made none: a CPU run's."""
    calls = [op for op in ops if not op["cuda"] and cuda_api(op["name"])]
    return max(calls, key=lambda op: op["self_cpu"])["name"] if calls else None


def _unflagged_twin(ops: list[dict]) -> str | None:
    """The first CUDA entry without a user_annotation flag (format 1) that has a CPU entry of its
    name, else None. Such a twin is kineto's device-side span of a record_function range (made
    from the CPU range) or a compiled kernel (Triton's launcher records a CPU entry of the
    kernel's name): without the flag they cannot be told apart. A CUDA entry without a CPU twin
    is a kernel; the phase ranges (schema.RANGES) are known by their names."""
    cpu = {op["name"] for op in ops if not op["cuda"]} - set(schema.RANGES)  # known by name
    return next(
        (op["name"] for op in ops if op["cuda"] and not op["flagged"] and op["name"] in cpu), None
    )


def compiled(name: str) -> bool:
    """The call of a graph torch.compile made (`## Call CompiledFxGraph <hash> ##`): on a CPU its
    self time is that of inductor's fused C++ kernels, which are no profiler events of their own
    unless torch._inductor.config.cpp.enable_kernel_profile was on when the graph compiled
    (torch 2.14: 18 % of the op time of a width-4 ResNet-18's compiled CPU step,
    tests/fixtures/cpu-compiled/; 59 % of a smaller CNN's). Counted as its own row (category
    compiled: classify), so no millisecond is dropped; with kernel profiling on, its self time
    is the call's own and its kernels (graph_<n>_cpp_fused_...) are rows too."""
    return name.startswith("## Call CompiledFxGraph ")


def is_collective(name: str) -> bool:
    """A collective's record in torch.profiler: c10d names it by backend and operation
    (gloo:all_reduce, gloo:broadcast, gloo:all_gather, nccl:all_reduce, ...)."""
    return name.startswith(COLLECTIVE_PREFIXES)


def _kernels(
    ops: list[dict], on_gpu: bool, nested: dict[str, float], waited: dict[str, float]
) -> list[dict]:
    """Each op's time (us -> ns): on a GPU a CUDA kernel's self device time; on a CPU an op's
    self CPU time less waited[name], its self time inside the collectives' spans (a call that
    starts or waits for one: waits_in_collectives), and a collective's inclusive time less
    nested[name], the time of the ops it ran inside on its own thread (counted by their own
    self time)."""
    out = []
    for op in ops:
        name = op["name"]
        if name in schema.RANGES or (op["annotation"] and op["cuda"]):
            continue  # a device-side range spans kernels that are counted themselves
        if name.startswith("ProfilerStep") or (name.startswith("## ") and not compiled(name)):
            continue  # the profiler's markers (## process_group:init ##, ...)
        if on_gpu and not op["cuda"]:
            continue  # on a GPU the CUDA kernels carry the time; their CPU launchers do not
        if on_gpu:
            t = op["self_dev"]
        elif is_collective(name):
            # c10d's record of a collective (on gloo's thread, an async record): key_averages
            # gives it no self time and links no op to it (torch 2.14)
            t = max(op["cpu_total"] - nested.get(name, 0.0), 0.0)
        else:
            t = max(op["self_cpu"] - waited.get(name, 0.0), 0.0)
        if t > 0:
            out.append({"name": name, "instances": op["count"], "total_ns": t * 1e3})
    return out


def _trace_beside(f: Path, read):
    """read(doc) of the chrome trace the trainer wrote with the export f (trace_rank{r}.json
    beside torch_ops_rank{r}.json); [] when there is none."""
    trace = f.with_name(f.name.replace("torch_ops_", "trace_", 1))
    if trace == f or not trace.is_file():
        return []
    try:
        return read(json.loads(read_text(trace)))
    except json.JSONDecodeError as exc:
        raise ProfileFormatError(
            trace, exc.lineno, f"malformed JSON ({exc.msg}); truncated?"
        ) from exc
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProfileFormatError(
            trace, None, f"not a torch.profiler chrome trace (bad event: {exc}); {RECAPTURE}"
        ) from exc


def _phases(ops: list[dict], projected: list[dict]) -> tuple[list[dict], str]:
    """(the phase entries, their time base): the GPU projections when the trace gave any,
    else the host entries."""
    if projected:
        return projected, schema.GPU_PROJECTION
    host = [op for op in ops if op["name"] in schema.RANGES and not op["cuda"]]
    entries = [
        {"name": op["name"], "instances": op["count"], "total_ns": op["cpu_total"] * 1e3}
        for op in host
    ]
    return entries, schema.HOST_RANGE


# the prefixes of c10d's records of a collective (is_collective)
COLLECTIVE_PREFIXES = ("gloo:", "nccl:")
NS_US = 1e-3  # 1 ns in us, the chrome trace's unit
# chrome-trace categories (torch.profiler's kineto export): the host's CUDA API calls, which
# carry the correlation id of what they launched, and the GPU operations
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# the host's ops and ranges: what nested_in_collectives and waits_in_collectives read
HOST_CATEGORIES = frozenset({"cpu_op", "user_annotation"})
# the events trace_phases reads a start and a duration of: GPU operations, launches, ranges
TIMED_CATEGORIES = GPU_CATEGORIES | LAUNCH_CATEGORIES | {"user_annotation"}


def correlation(event: dict):
    """A trace event's correlation id (its launch's, for a GPU operation), or None."""
    return (event.get("args") or {}).get("correlation")


def _complete_events(doc) -> list[dict]:
    """The complete events ("ph": "X") of a chrome trace, in either of its forms."""
    raw = doc if isinstance(doc, list) else doc.get("traceEvents")  # both chrome forms
    if not isinstance(raw, list):
        raise ValueError(f"traceEvents is {raw!r}, not a list of events")
    return [e for e in raw if isinstance(e, dict) and e.get("ph") == "X"]


def union_length(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals: nested ops' time, each instant once."""
    total, reach = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def nested_in_collectives(doc) -> dict[str, float]:
    """Per collective name (is_collective), the time in us of the ops (cpu_op, user_annotation)
    inside its spans on the span's own thread, each instant once: on a CPU gloo runs a
    collective on its own thread, and some run ATen ops there (FSDP's all-gather copies its
    output, its reduce-scatter divides: about 1 % of their time in a 2-rank CPU capture, torch
    2.14), which the export counts by their own self time. Ops of other threads that ran
    meanwhile (the main thread's compute, its wait) are not inside."""
    events = _host_events(doc)
    threads: dict[tuple, list[tuple[float, float]]] = {}
    spans = []
    for e in events:
        start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        if is_collective(str(e.get("name"))):
            spans.append((str(e["name"]), (e.get("pid"), e.get("tid")), start, end))
        else:
            threads.setdefault((e.get("pid"), e.get("tid")), []).append((start, end))
    for intervals in threads.values():
        intervals.sort()
    out: dict[str, float] = {}
    for name, thread, start, end in spans:
        intervals = threads.get(thread, [])
        inside = []
        # the trace rounds ts and dur apart: a nested op may end a nanosecond past its span
        for a, b in intervals[bisect.bisect_left(intervals, (start - NS_US,)) :]:
            if a > end:
                break
            if b <= end + NS_US:
                inside.append((max(a, start), min(b, end)))
        out[name] = out.get(name, 0.0) + union_length(inside)
    return out


def _host_events(doc) -> list[dict]:
    """The host's ops and ranges (cpu_op, user_annotation) of a chrome trace, each with a finite
    start and a duration >= 0."""
    events = [e for e in _complete_events(doc) if e.get("cat") in HOST_CATEGORIES]
    for e in events:
        measured(e.get("ts"), f"{e.get('name')!r}: ts", least=None)
        measured(e.get("dur"), f"{e.get('name')!r}: dur")
    return events


def _collective_times(doc) -> tuple[dict[str, float], dict[str, float]]:
    """(nested_in_collectives, waits_in_collectives) of one trace."""
    return nested_in_collectives(doc), waits_in_collectives(doc)


def waits(name: str) -> bool:
    """An op or range that starts or waits for a collective (not the collective's own record):
    what classify counts as communication, c10d's calls (c10d::allreduce_, ...) and FSDP's
    (FSDP::all_gather, FSDP::post_backward_reduce, ...)."""
    return classify(name) == "nccl" and not is_collective(name)


def waits_in_collectives(doc) -> dict[str, float]:
    """Per name of an op or range that starts or waits for a collective (waits), the part in us
    of its self time (its span less the ops nested in it on its own thread, as the export counts
    it) that lies inside the spans of the process's collectives (is_collective) on other
    threads, each instant once. On a CPU gloo runs a collective on its own thread while the
    calling thread waits for it as self time of the call or of FSDP's range around it (no event
    of its own), or, one core shared, runs the call's own code beside it: time the collective's
    span counts already (nested_in_collectives walks the same trace from the other side)."""
    events = _host_events(doc)
    threads: dict[tuple, list[tuple[float, float, int]]] = {}
    spans: dict[object, list[tuple[float, float, object]]] = {}
    for i, e in enumerate(events):
        start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        threads.setdefault((e.get("pid"), e.get("tid")), []).append((start, end, i))
        if is_collective(str(e.get("name"))):
            spans.setdefault(e.get("pid"), []).append((start, end, e.get("tid")))
    out: dict[str, float] = {}
    beside: dict[tuple, list[tuple[float, float]]] = {}  # other threads' spans, merged
    for (pid, tid), intervals in threads.items():
        intervals.sort()
        for start, end, i in intervals:
            name = str(events[i].get("name"))
            if not waits(name):
                continue
            if (pid, tid) not in beside:
                others = [(a, b) for a, b, t in spans.get(pid, []) if t != tid]
                beside[(pid, tid)] = _merged(others)
            if not beside[(pid, tid)]:
                continue
            # the ops nested in it on its thread (the trace rounds ts and dur apart: one may
            # start or end a nanosecond past its parent)
            inside = []
            for a, b, j in intervals[bisect.bisect_left(intervals, (start - NS_US,)) :]:
                if a > end:
                    break
                if j != i and b <= end + NS_US and (b - a < end - start or a > start):
                    inside.append((max(a, start), min(b, end)))
            own = _gaps(start, end, _merged(inside))
            out[name] = out.get(name, 0.0) + _overlap(own, beside[(pid, tid)])
    return out


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of (start, end) intervals as sorted, disjoint intervals."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _gaps(start: float, end: float, covered: list[tuple[float, float]]) -> list[tuple]:
    """The parts of (start, end) outside the sorted, disjoint intervals covered."""
    out, reach = [], start
    for a, b in covered:
        if a > reach:
            out.append((reach, min(a, end)))
        reach = max(reach, b)
    if reach < end:
        out.append((reach, end))
    return out


def _overlap(pieces: list[tuple[float, float]], merged: list[tuple[float, float]]) -> float:
    """The length of the disjoint pieces inside the sorted, disjoint intervals merged."""
    total = 0.0
    for a, b in pieces:
        for c, d in merged[max(bisect.bisect_left(merged, (a,)) - 1, 0) :]:
            if c >= b:
                break
            total += max(0.0, min(b, d) - max(a, c))
    return total


def trace_phases(doc: dict) -> list[dict]:
    """The trainer's phase ranges in a torch.profiler chrome trace (export_chrome_trace),
    projected onto the GPU by projection.project: a GPU operation (kernel, memcpy, memset)
    belongs to a range when the CUDA API call that launched it (same `correlation` id; a CUDA
    graph's replayed kernels share their cudaGraphLaunch's) started inside the range's host
    interval, on any thread of the process. [] when the trace has no GPU operation (a CPU run).

    The export's device-side range entries (kineto's gpu_user_annotation) are not used: they
    hold only the operations whose innermost open annotation on their own thread was the
    range; on the H100 and H200 they missed DDP's forward (nested DistributedDataParallel.forward),
    most of the backward and the whole optimizer (Optimizer.step#SGD.step)."""
    events = _complete_events(doc)
    for e in events:  # complete events: a start and a duration, in us
        if e.get("cat") in TIMED_CATEGORIES:
            measured(e.get("ts"), f"{e.get('name')!r}: ts", least=None)
            measured(e.get("dur"), f"{e.get('name')!r}: dur")
    gpu: dict[object, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("cat") in GPU_CATEGORIES:
            corr = correlation(e)
            if corr is not None:  # without one it cannot be attributed to a launch
                start = float(e["ts"]) * 1e3  # us -> ns
                gpu.setdefault(corr, []).append((start, start + float(e["dur"]) * 1e3))
    if not gpu:
        return []
    launches = [
        (float(e["ts"]) * 1e3, correlation(e)) for e in events if e.get("cat") in LAUNCH_CATEGORIES
    ]
    ranges = [
        (e["name"], float(e["ts"]) * 1e3, (float(e["ts"]) + float(e["dur"])) * 1e3)
        for e in events
        if e.get("cat") == "user_annotation" and e.get("name") in schema.RANGES
    ]
    return projection.project(ranges, launches, gpu)
