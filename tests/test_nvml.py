"""NVML time series of a GPU run (issue: profiling, item 5). There is no GPU or NVML here, so the
NVML library is replaced by a clearly named stand-in (StandInNVML) with NVML's own units; the
real path (pynvml on a GPU node) is the same NvmlSampler and nvml_read."""

from __future__ import annotations

import csv
import time
from types import SimpleNamespace

import pytest
import torch

from scalestudy.trainer.measure import GPU_SAMPLE_COLUMNS, NvmlSampler, nvml_read


class StandInNVML:
    """pynvml's calls used by nvml_read, answering in NVML's units (bytes, MHz, mW)."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

    def __init__(self):
        self.calls = 0

    def nvmlDeviceGetUtilizationRates(self, handle):
        self.calls += 1
        return SimpleNamespace(gpu=[90, 70][self.calls % 2], memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=3 * 2**30)

    def nvmlDeviceGetClockInfo(self, handle, which):
        return {1: 1980, 2: 2619}[which]

    def nvmlDeviceGetPowerUsage(self, handle):
        return 612_345  # mW


def test_nvml_read_converts_to_the_columns_units():
    sample = nvml_read(StandInNVML(), handle=None)
    assert sample == {
        "util_pct": 70,
        "mem_util_pct": 40,
        "mem_used_mb": 3072.0,  # MiB
        "sm_clock_mhz": 1980,
        "mem_clock_mhz": 2619,
        "power_w": pytest.approx(612.345),
    }


def test_sampler_writes_the_time_series_and_returns_the_mean(tmp_path):
    nvml = StandInNVML()
    sampler = NvmlSampler(
        torch.device("cpu"),
        interval_s=0.02,
        out=tmp_path,
        rank=3,
        read=lambda h: nvml_read(nvml, h),
    )
    sampler.start()
    time.sleep(0.3)
    mean = sampler.stop()
    with (tmp_path / "gpu_samples_rank3.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == GPU_SAMPLE_COLUMNS
    assert len(rows) >= 4
    times = [float(r["time_s"]) for r in rows]
    assert times == sorted(times) and times[0] > 0
    assert {r["rank"] for r in rows} == {"3"}
    assert all(float(r["power_w"]) == pytest.approx(612.345) for r in rows)
    util = [float(r["util_pct"]) for r in rows]
    assert mean == pytest.approx(sum(util) / len(util))


def test_a_failing_query_ends_sampling_not_training(tmp_path, capfd):
    def broken(handle):
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    sampler = NvmlSampler(torch.device("cpu"), interval_s=0.01, out=tmp_path, read=broken)
    sampler.start()
    time.sleep(0.1)
    assert sampler.stop() is None  # no sample: null, never a made-up 0
    assert "NVML sampling stopped: NVML_ERROR_GPU_IS_LOST" in capfd.readouterr().err
    assert (tmp_path / "gpu_samples_rank0.csv").read_text().strip() == ",".join(GPU_SAMPLE_COLUMNS)
