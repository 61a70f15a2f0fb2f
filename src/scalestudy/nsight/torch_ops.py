"""torch.profiler: the trainer's key_averages export (profile/torch_ops_rank{r}.json) ->
profile_kernels and profile_ranges rows (schemas: schema.py)."""

from __future__ import annotations

import json
from pathlib import Path

from scalestudy.errors import ProfileFormatError
from scalestudy.nsight import schema
from scalestudy.nsight.readers import rank_of, read_text


def parse_torch(input_path: str | Path, run: str) -> tuple[list[dict], list[dict]]:
    """torch_ops_rank{r}.json files (a file or a directory) -> (kernels rows, ranges rows).

    Each JSON holds {"ops": [{"name", "count", "self_cpu_us", "cpu_total_us", "self_device_us",
    "device_total_us", "device_type", "user_annotation"}]} (trainer/measure.py,
    torch_ops_export; the last two keys are missing from older exports). Kernels: on a GPU (any
    self_device_us) the CUDA-side entries by self device time; on a CPU the ops by self CPU time
    (self time: no double counting of nested ops); the device-side entries of record_function
    ranges (user annotations) are not kernels: their time spans kernels counted themselves.
    Phase ranges (schema.RANGES, the trainer's record_function ranges): on a GPU their
    device-side entries, whose time is the range projected onto the GPU (time_base
    gpu_projection); where there are none (a CPU run), the host entries' inclusive CPU time
    (host_range: the phase's real time on a CPU, only enqueue time on a GPU).
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
    for f in files:
        ops = [_entry(f, i, op) for i, op in enumerate(_ops(f))]
        rank = rank_of(f)
        rank_kernels = _kernels(ops)
        if rank_kernels:
            kernels[rank] = rank_kernels
        phases, time_base[rank] = _phases(ops)
        if phases:
            ranges[rank] = phases
    return (
        schema.kernel_rows(run, "torch.profiler", kernels),
        schema.range_rows(run, "torch.profiler", ranges, time_base),
    )


def _ops(f: Path) -> list:
    try:
        ops = json.loads(read_text(f))["ops"]
    except json.JSONDecodeError as exc:
        raise ProfileFormatError(f, exc.lineno, f"malformed JSON ({exc.msg}); truncated?") from exc
    except (KeyError, TypeError) as exc:
        raise ProfileFormatError(f, None, "no 'ops' list (not a torch_ops export)") from exc
    if not ops:
        raise ProfileFormatError(f, None, "no profiled ops: the window recorded nothing")
    return ops


def _entry(f: Path, i: int, op) -> dict:
    """One export entry, checked; times in us."""
    try:
        self_dev = float(op.get("self_device_us") or 0)
        device_type = str(op.get("device_type") or "").upper()
        return {
            "name": str(op["name"]),
            "count": int(op["count"]),
            "self_cpu": float(op["self_cpu_us"]),
            "cpu_total": float(op["cpu_total_us"]),
            "self_dev": self_dev,
            # a device-side entry's total is its self time (older exports have only the latter)
            "dev_total": float(op.get("device_total_us", self_dev) or 0),
            "cuda": device_type in ("CUDA", "DEVICETYPE.CUDA"),
            "annotation": bool(op.get("user_annotation", False)),
        }
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProfileFormatError(f, None, f"op {i}: bad entry {op!r} ({exc})") from exc


def _kernels(ops: list[dict]) -> list[dict]:
    on_gpu = any(op["self_dev"] > 0 for op in ops)
    out = []
    for op in ops:
        name = op["name"]
        if name in schema.RANGES or (op["annotation"] and op["cuda"]):
            continue  # a device-side range spans kernels that are counted themselves
        if name.startswith("ProfilerStep") or name.startswith("## "):
            continue
        if on_gpu and not op["cuda"]:
            continue  # on a GPU the CUDA kernels carry the time; their CPU launchers do not
        t = op["self_dev"] if on_gpu else op["self_cpu"]
        if t > 0:
            out.append({"name": name, "instances": op["count"], "total_ns": t * 1e3})
    return out


def _phases(ops: list[dict]) -> tuple[list[dict], str]:
    """(the phase entries, their time base): device-side when there are any, else host."""
    device = [op for op in ops if op["name"] in schema.RANGES and op["cuda"]]
    if device:
        rows = [(op, op["dev_total"]) for op in device]
        base = schema.GPU_PROJECTION
    else:
        host = [op for op in ops if op["name"] in schema.RANGES and not op["cuda"]]
        rows = [(op, op["cpu_total"]) for op in host]
        base = schema.HOST_RANGE
    entries = [
        {"name": op["name"], "instances": op["count"], "total_ns": us * 1e3} for op, us in rows
    ]
    return entries, base
