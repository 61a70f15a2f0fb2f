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

    Each JSON holds {"ops": [{"name", "count", "self_cpu_us", "cpu_total_us",
    "self_device_us", "device_type"}]}. Kernels: on a GPU (any self_device_us) the CUDA-side
    entries by self device time; on a CPU the ops by self CPU time (self time: no double counting
    of nested ops). The phase ranges (schema.RANGES) come from their record_function entries
    (inclusive).
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
            doc = json.loads(read_text(f))
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
            if name in schema.RANGES:
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
    return schema.kernel_rows(run, "torch.profiler", kernels), schema.range_rows(
        run, "torch.profiler", ranges
    )
