"""How often this GPU's NVML total-energy counter advances, and the power it gives, under load.

    python -m scalestudy.jobs.energy_probe [--seconds 3]   # prints one JSON object

trainer/measure.py bounds the error of energy_j by assuming the counter
(nvmlDeviceGetTotalEnergyConsumption, mJ) advances every ENERGY_UPDATE_S = 0.1 s; NVIDIA does not
document the period. gpu-check's nvml check runs this on the node to prove the assumption there:
a bf16 matrix-product loop keeps the GPU busy while the counter is polled as fast as the host
can, and every change of its value is one update. On an H200 (driver 580.159.04, 2026-11-26) the
median interval was 0.1003 s (0.097-0.103 s) and the counter gave 690 W against 696 W read from
nvmlDeviceGetPowerUsage.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable

from scalestudy.errors import GpuCheckError
from scalestudy.trainer.measure import nvml_handle

LOAD_S = 1.5  # seconds of load before the first power reading (NVML's 1 s mean, and a margin)


def updates(readings: list[tuple[float, int]]) -> dict:
    """(seconds, counter mJ) polled in time order -> the counter's updates: their median, min and
    max interval in s, and the mean power in W between the first and the last update. Pure."""
    changes = [readings[0]] if readings else []
    for t, mj in readings[1:]:
        if mj < changes[-1][1]:
            raise ValueError(f"the energy counter went backwards ({changes[-1][1]} -> {mj} mJ)")
        if mj != changes[-1][1]:
            changes.append((t, mj))
    edges = changes[1:]  # the first reading is no update: the counter was polled there first
    gaps = [b[0] - a[0] for a, b in zip(edges, edges[1:], strict=False)]
    out = {"reads": len(readings), "updates": len(edges), "interval_s_median": None}
    if gaps:
        span_s = edges[-1][0] - edges[0][0]
        out |= {
            "interval_s_median": statistics.median(gaps),
            "interval_s_min": min(gaps),
            "interval_s_max": max(gaps),
            "power_w_from_counter": (edges[-1][1] - edges[0][1]) / 1e3 / span_s,
        }
    return out


def poll(read_mj: Callable[[], int], seconds: float) -> list[tuple[float, int]]:
    """The counter read as fast as possible for `seconds`."""
    readings, end = [], time.monotonic() + seconds
    while (now := time.monotonic()) < end:
        readings.append((now, int(read_mj())))
    return readings


def probe(seconds: float) -> dict:
    """On this node's first CUDA device (found in NVML by UUID or PCI bus id)."""
    import torch

    if not torch.cuda.is_available():
        raise GpuCheckError(
            "no CUDA GPU here (torch.cuda.is_available() is False): run it on a GPU node"
        )
    try:
        import pynvml
    except ImportError as exc:  # an optional extra (pyproject.toml: gpu)
        raise GpuCheckError(
            f"nvidia-ml-py (pynvml) is not installed ({exc}): pip install nvidia-ml-py"
        ) from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise GpuCheckError(f"NVML cannot start ({exc}): is the NVIDIA driver loaded?") from exc
    try:
        handle = nvml_handle(pynvml, torch.cuda.get_device_properties(0))
    except LookupError as exc:  # one line, as the other refusals: it was a traceback
        raise GpuCheckError(
            f"{exc}: NVML does not show the GPU that CUDA uses here (a container or VM that "
            "hides it from NVML?)"
        ) from exc
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            for _ in range(20):
                a @ a
            torch.cuda.synchronize()

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        # nvmlDeviceGetPowerUsage is the mean over the last second on Ampere (but GA100) and
        # newer GPUs (NVML's API reference): read after 0.5 s of load it was half idle, 523 W in
        # gpu-check's runs on an H200 and H100s against the counter's 691-698 W. After LOAD_S it
        # is power under load.
        time.sleep(LOAD_S)
        power = [pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3]
        readings = poll(lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle), seconds)
        power.append(pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3)
    except pynvml.NVMLError as exc:  # NotSupported: a traceback, then an abort (rc 134)
        raise GpuCheckError(
            f"NVML cannot read this GPU's power or total-energy counter ({exc}): pre-Volta GPUs "
            "and some vGPUs have no counter, and energy_j is then not measured"
        ) from exc
    finally:
        # the load thread still running CUDA work when the interpreter exits aborts it
        stop.set()
        worker.join()
    try:
        counter = updates(readings)
    except ValueError as exc:  # a traceback before: a fault of the GPU, not of the probe
        raise GpuCheckError(
            f"{exc}: a GPU reset or a driver reload during the probe? Rerun it; where it "
            "recurs, the counter cannot measure energy on this GPU"
        ) from exc
    return {**counter, "power_w_nvml": statistics.fmean(power), "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="polling time (default 3)")
    try:
        print(json.dumps(probe(parser.parse_args().seconds)))
    except GpuCheckError as exc:  # one line, as the CLI's expected errors
        print(f"energy_probe: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
