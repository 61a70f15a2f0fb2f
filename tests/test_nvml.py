"""NVML time series of a GPU run (issue: profiling, item 5). There is no GPU or NVML here, so the
NVML library is replaced by a clearly named stand-in (StandInNVML) with NVML's own units; the
real path (pynvml on a GPU node) is the same NvmlSampler and nvml_read."""

from __future__ import annotations

import csv
import time
from types import SimpleNamespace

import pytest
import torch

from scalestudy import log
from scalestudy.trainer.measure import GPU_SAMPLE_COLUMNS, NvmlSampler, nvml_handle, nvml_read


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
    log.setup()  # the warning goes to stderr as in a real command (not only after another test)

    def broken(handle):
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    sampler = NvmlSampler(torch.device("cpu"), interval_s=0.01, out=tmp_path, read=broken)
    sampler.start()
    time.sleep(0.1)
    assert sampler.stop() is None  # no sample: null, never a made-up 0
    assert "NVML sampling stopped: NVML_ERROR_GPU_IS_LOST" in capfd.readouterr().err
    assert (tmp_path / "gpu_samples_rank0.csv").read_text().strip() == ",".join(GPU_SAMPLE_COLUMNS)


class StandInNVMLDevices:
    """pynvml's device lookup on a node with two GPUs (NVML indices 0 and 1, PCI order), where
    the job's only CUDA device is NVML's GPU 1: CUDA_VISIBLE_DEVICES may name it by UUID, so
    CUDA calls it device 0 and an index lookup would sample the other job's GPU."""

    class NotFound(Exception):
        pass

    devices = {
        "GPU-0000aaaa-0000-0000-0000-000000000000": ("00000000:1B:00.0", 0),
        "GPU-1111bbbb-1111-1111-1111-111111111111": ("00000000:3B:00.0", 1),
    }

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.devices:
            raise self.NotFound(f"Not Found ({uuid})")
        return uuid

    def nvmlDeviceGetHandleByPciBusId(self, bus_id):
        for uuid, (bus, _) in self.devices.items():
            if bus == bus_id:
                return uuid
        raise self.NotFound(f"Not Found ({bus_id})")

    def nvmlDeviceGetIndex(self, handle):
        return self.devices[handle][1]


def cuda_props(uuid: str, bus: int = 0x3B):
    """The fields of torch.cuda.get_device_properties that nvml_handle reads."""
    return SimpleNamespace(uuid=uuid, pci_domain_id=0, pci_bus_id=bus, pci_device_id=0)


def test_nvml_handle_matches_the_cuda_device_by_uuid_not_by_index():
    nvml = StandInNVMLDevices()
    handle = nvml_handle(nvml, cuda_props("1111bbbb-1111-1111-1111-111111111111"))
    assert nvml.nvmlDeviceGetIndex(handle) == 1  # CUDA's device 0 is NVML's GPU 1


def test_nvml_handle_falls_back_to_the_pci_bus_id():
    nvml = StandInNVMLDevices()
    handle = nvml_handle(nvml, cuda_props("ffffffff-0000-0000-0000-000000000000", bus=0x1B))
    assert nvml.nvmlDeviceGetIndex(handle) == 0


def test_nvml_handle_names_what_it_tried_when_nothing_matches():
    with pytest.raises(LookupError) as e:
        nvml_handle(StandInNVMLDevices(), cuda_props("ffffffff-0000", bus=0x99))
    msg = str(e.value)
    assert "GPU-ffffffff-0000" in msg and "MIG-ffffffff-0000" in msg and "00000000:99:00.0" in msg
