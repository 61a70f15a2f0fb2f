"""NVML time series of a GPU run (issue: profiling, item 5). There is no GPU or NVML here, so the
NVML library is replaced by a clearly named stand-in (StandInNVML) with NVML's own units; the
real path (pynvml on a GPU node) is the same NvmlSampler and nvml_read."""

from __future__ import annotations

import csv
import functools
import os
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from scalestudy import log
from scalestudy.trainer import measure
from scalestudy.trainer.config import TrainConfig
from scalestudy.trainer.dist import free_port
from scalestudy.trainer.measure import (
    GPU_SAMPLE_COLUMNS,
    EnergyCounter,
    NvmlSampler,
    energy_total,
    nvml_handle,
    nvml_read,
)
from scalestudy.trainer.state import RunState


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

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        """mJ since the driver loaded, monotonic: this stand-in's GPU uses 50 J between reads."""
        self.energy_mj = getattr(self, "energy_mj", 7_000_000) + 50_000
        return self.energy_mj


class StandInNVMLOld(StandInNVML):
    """A pre-Volta GPU: NVML answers NotSupported for the energy counter."""

    class NVMLError_NotSupported(Exception):
        pass

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        raise self.NVMLError_NotSupported("Not Supported")


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
        lookback_s=0.0,  # the stand-in's utilisation is of its instant
    )
    sampler.start()
    time.sleep(0.15)  # compiling, warm-up: sampled, not in the mean
    sampler.open_span()
    time.sleep(0.15)
    sampler.close_span()
    time.sleep(0.15)  # evaluation
    mean = sampler.stop()
    ((start, end),) = sampler.spans
    with (tmp_path / "gpu_samples_rank3.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == GPU_SAMPLE_COLUMNS
    assert len(rows) >= 12
    times = [float(r["time_s"]) for r in rows]
    assert times == sorted(times) and times[0] > 0
    assert times[0] < start < end < times[-1]
    assert {r["rank"] for r in rows} == {"3"}
    assert all(float(r["power_w"]) == pytest.approx(612.345) for r in rows)
    # the wall clock to the millisecond, not 6 significant digits (10^4 s at 1.8e9 s)
    unix = [float(r["unix_time_s"]) for r in rows]
    assert unix == sorted(unix) and abs(unix[0] - time.time()) < 60 and len(set(unix)) == len(unix)
    inside = [s["util_pct"] for s in sampler.samples if start <= s["time_s"] <= end]
    assert 2 <= len(inside) < len(rows)
    assert mean == pytest.approx(sum(inside) / len(inside))


def test_a_sample_whose_look_back_reaches_before_the_window_is_left_out():
    """NVML's utilisation is the share of its past sample period (up to 1 s) with a kernel
    running: a sample early in a span measured mostly the time before it (compilation, the
    evaluation and join between epochs). Counted, gpu_util_mean read 4% for a run whose steps
    filled 97% of its window. STAND-IN for NVML: busy (100) exactly inside the span, idle
    before, each sample the busy share of its look-back."""
    lookback, opened = 0.1, []

    def read(handle) -> dict:
        now = time.monotonic() - sampler.t0
        if not opened:
            return {"util_pct": 0.0}
        busy = min(lookback, max(0.0, now - opened[0]))
        return {"util_pct": 100.0 * busy / lookback}

    sampler = NvmlSampler(torch.device("cpu"), interval_s=0.01, read=read, lookback_s=lookback)
    sampler.start()
    time.sleep(0.15)
    sampler.open_span()
    opened.append(sampler.spans[0][0])
    time.sleep(0.4)
    sampler.close_span()
    mean = sampler.stop()
    assert any(0 < s["util_pct"] < 100 for s in sampler.samples)  # partly before the window
    assert mean == pytest.approx(100.0)
    # a span shorter than the look-back holds no sample that measured it alone: null
    short = NvmlSampler(torch.device("cpu"), interval_s=0.01, read=read, lookback_s=1.0)
    short.start()
    short.open_span()
    time.sleep(0.2)
    short.close_span()
    assert short.stop() is None and short.samples


def test_utilisation_without_a_window_sample_is_null(tmp_path):
    """A window shorter than the sampling interval has no sample: null, not the run's mean."""
    nvml = StandInNVML()
    sampler = NvmlSampler(torch.device("cpu"), interval_s=0.02, read=lambda h: nvml_read(nvml, h))
    sampler.start()
    time.sleep(0.1)
    assert sampler.stop() is None and len(sampler.samples) >= 2


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


# --- energy: NVML's total-energy counter over the throughput window -------------------------

EPOCHS, STEPS, BATCH = 2, 4, 8  # per rank; the 1 warm-up step is the first of the segment


def drive_window(meter, state) -> None:
    """The training loop's hooks as loop.py calls them, without a model (nothing to train)."""
    meter.start(state)
    for _ in range(EPOCHS):
        meter.epoch_start()
        for i in range(STEPS):
            meter.before_step(state.step, seen=i * BATCH)
            state.step += 1
        meter.epoch_end(state, seen=STEPS * BATCH)


def reduce_energy_over_ranks(tmp_path, gpus: list[str | None]) -> list[dict]:
    """Real gloo ranks, one per entry of `gpus`: the stand-in GPU's UUID, or None (a CPU rank)."""
    results = mp.Manager().dict()
    mp.spawn(
        _energy_entry,
        args=(len(gpus), free_port(), gpus, str(tmp_path), results),
        nprocs=len(gpus),
    )
    return [results[r] for r in range(len(gpus))]


def _energy_entry(rank, world, port, gpus, out, results):
    """One rank: its Meter reads its GPU's counter through the NVML stand-in (Meter.start sets
    the counter from NvmlSampler on a real GPU; here the test sets it)."""
    state = RunState()
    os.environ.update(LOCAL_RANK=str(rank), SLURMD_NODENAME="node1")
    measure.ENERGY_UPDATE_S = 1e-9  # the stand-in's counter changes on every read
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    meter = measure.Meter(TrainConfig(out=out, warmup_steps=1), torch.device("cpu"), rank)
    nvml = StandInNVML()
    if gpus[rank] is not None:
        read = functools.partial(nvml.nvmlDeviceGetTotalEnergyConsumption, None)
        meter.energy = EnergyCounter(read, gpus[rank])
    drive_window(meter, state)
    results[rank] = {**meter.reduce_energy(world), "window_images": state.window_images}
    dist.destroy_process_group()


@pytest.mark.parametrize(
    ("gpus", "readers"),
    [(["GPU-same", "GPU-same"], 1), (["GPU-a", "GPU-b"], 2)],
    ids=["two-ranks-one-gpu", "two-ranks-two-gpus"],
)
def test_energy_is_counted_once_per_gpu(tmp_path, gpus, readers):
    """2 real gloo ranks; each reads its stand-in counter at 2 window opens and 2 epoch ends (50 J
    between reads: 100 J per reader). Ranks sharing a GPU each see the whole GPU's counter, so
    it is counted once; on two GPUs both count."""
    results = reduce_energy_over_ranks(tmp_path, gpus)
    assert results[0] == results[1]  # every rank gets the same metrics
    images = 2 * results[0]["window_images"]  # both ranks' window images
    assert results[0]["window_images"] == (EPOCHS * STEPS - 1) * BATCH
    expected_j = readers * EPOCHS * 50.0
    assert results[0]["energy_j"] == pytest.approx(expected_j)
    assert results[0]["energy_j_per_img"] == pytest.approx(expected_j / images)
    assert results[0]["energy_source"] == "nvml_total_energy"
    # the wall span: the first open to the last end, 2 * EPOCHS - 1 reads apart (the reads
    # between the epochs stand for their evaluations), each GPU once, over the same images
    wall_j = readers * (2 * EPOCHS - 1) * 50.0
    assert results[0]["energy_wall_j"] == pytest.approx(wall_j)
    assert results[0]["energy_wall_j_per_img"] == pytest.approx(wall_j / images)
    assert results[0]["energy_wall_s"] > 0 and results[0]["energy_wall_unmeasured"] is None


def test_energy_is_null_on_cpu(tmp_path):
    """A CPU run has no counter: null with the reason, never an estimate (RAPL is not read)."""
    (result,) = reduce_energy_over_ranks(tmp_path, [None])
    assert result["window_images"] == (EPOCHS * STEPS - 1) * BATCH  # the window was there
    del result["window_images"]
    assert result == {
        "energy_j": None,
        "energy_j_per_img": None,
        "energy_source": None,
        "energy_unmeasured": "no GPU",
        "energy_wall_j": None,
        "energy_wall_j_per_img": None,
        "energy_wall_s": None,
        "energy_wall_unmeasured": "no GPU",
    }


def test_energy_is_null_when_the_counter_is_not_supported():
    nvml = StandInNVMLOld()
    counter = EnergyCounter(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(None), "GPU-old")
    counter.open()
    counter.close(seconds=600.0, images=10_000)
    result = counter.result()
    assert result["joules"] is None
    assert result["reason"] == "NVML energy counter unavailable: Not Supported"


def test_one_gpu_without_a_counter_makes_the_total_null():
    """A partial sum over GPUs would be a guess about the missing one: null instead."""
    good = {"joules": 100.0, "images": 50, "reason": None, "key": ("n", "GPU-a", 0)}
    bad = measure.energy_unmeasured("NVML unavailable") | {"key": ("n", "GPU-b", 1)}
    total = energy_total([good, bad])
    assert total["energy_j"] is None and total["energy_unmeasured"] == "NVML unavailable"


def test_a_rank_that_does_not_count_its_shared_gpu_cannot_blank_it():
    """Two ranks on one GPU (gloo): the lowest local rank's reading is the GPU's; the other's,
    refused against its own slightly shorter window (10 spans of 9.9 s: error bound 2.02%),
    blanked the GPU's measured joules."""
    readings = []
    for local_rank, span_s in enumerate([10.0, 9.9]):
        nvml, clock = StandInNVML(), FakeClock()
        read = functools.partial(nvml.nvmlDeviceGetTotalEnergyConsumption, None)
        counter = EnergyCounter(read, "GPU-a", clock)
        for _ in range(10):
            counter.open()
            clock.t += span_s
            counter.close(seconds=span_s, images=1000)
        readings.append(counter.result() | {"key": ("n", "GPU-a", local_rank)})
    assert readings[0]["reason"] is None and "window too short" in readings[1]["reason"]
    total = energy_total(readings)
    assert total["energy_j"] == pytest.approx(readings[0]["joules"]) and readings[0]["joules"]
    assert total["energy_j_per_img"] == pytest.approx(readings[0]["joules"] / 20_000)
    assert total["energy_unmeasured"] is None
    # the reader's own refusal still blanks it
    total = energy_total([readings[1] | {"key": ("n", "GPU-a", 0)}, readings[0]])
    assert total["energy_j"] is None and "window too short" in total["energy_unmeasured"]
    # and so does the other rank's read error: its images stop counting at the error, and
    # J/img over them came out a third too high, the wall's twice, with no reason given
    nvml, clock, fail = StandInNVML(), FakeClock(), [False]

    def failing() -> int:  # the other rank's reads: one fails
        if fail[0]:
            raise RuntimeError("NVMLError_Unknown")
        return nvml.nvmlDeviceGetTotalEnergyConsumption(None)

    read = functools.partial(nvml.nvmlDeviceGetTotalEnergyConsumption, None)
    counters = [EnergyCounter(read, "GPU-a", clock), EnergyCounter(failing, "GPU-a", clock)]
    for epoch in range(4):
        for counter in counters:
            counter.open()
        clock.t += 100.0
        fail[0] = epoch == 2
        for counter in counters:
            counter.close(seconds=100.0, images=1000)
        fail[0] = False
    results = [c.result() | {"key": ("n", "GPU-a", i)} for i, c in enumerate(counters)]
    assert results[0]["reason"] is None and results[1]["images"] < 4000
    total = energy_total(results)
    assert total["energy_j"] is None and total["energy_j_per_img"] is None
    assert "NVMLError_Unknown" in total["energy_unmeasured"]


def test_a_window_too_short_for_the_counter_is_refused():
    """Each read may lag by one update (ENERGY_UPDATE_S): 2 spans of 1 s with 0.1 s updates
    bound the error at 2 * 2 * 0.1 / 2 = 20% > ENERGY_MAX_ERROR: refused, not reported."""
    nvml = StandInNVML()
    counter = EnergyCounter(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(None), "GPU-a")
    for _ in range(2):
        counter.open()
        counter.close(seconds=1.0, images=100)
    bound = 2 * 2 * measure.ENERGY_UPDATE_S / 2.0
    assert bound > measure.ENERGY_MAX_ERROR
    result = counter.result()
    assert result["joules"] is None and "window too short" in result["reason"]
    # the same spans over a long enough window are reported: 50 J per span
    long_enough = 2 * 2 * measure.ENERGY_UPDATE_S / measure.ENERGY_MAX_ERROR
    counter.seconds = long_enough
    assert counter.result()["joules"] == pytest.approx(100.0)


def test_a_counter_that_does_not_advance_is_unmeasured_not_zero_joules():
    """A read that succeeds with the same value every time: the run recorded energy_j 0.0 and
    energy_j_per_img 0.0 from "nvml_total_energy", which collect refuses as damage (J/img must
    be > 0), and a rerun wrote 0 again. Now it is null with the reason, the wall span too."""
    clock = FakeClock()
    counter = EnergyCounter(lambda: 123_456, "GPU-a", clock)
    for _ in range(10):
        counter.open()
        clock.t += 60.0
        counter.close(seconds=60.0, images=50_000)
    result = counter.result()
    assert result["joules"] is None and "did not advance in 600.0 s" in result["reason"]
    assert result["wall"]["joules"] is None and "did not advance" in result["wall"]["reason"]
    total = energy_total([result | {"key": ("n", "GPU-a", 0)}])
    assert total["energy_j"] is None and total["energy_j_per_img"] is None
    assert "did not advance" in total["energy_unmeasured"]


class FakeClock:
    """perf_counter for an EnergyCounter: the test moves it."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_short_gpu_epochs_are_measured_over_the_wall_span():
    """30 epochs of 1.7 s training and 0.3 s evaluation (a CIFAR-10 epoch of one GPU): the 30
    training spans are bound at 2 * 30 * 0.1 / 51 = 12% and refused; the wall span (two reads,
    59.7 s) at 0.3%, measured: the counter from the first open to the last end."""
    nvml, clock = StandInNVML(), FakeClock()
    counter = EnergyCounter(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(None), "GPU-a", clock)
    for _ in range(30):
        counter.open()
        clock.t += 1.7
        counter.close(seconds=1.7, images=50_000)
        clock.t += 0.3  # the evaluation
    result = counter.result()
    assert result["joules"] is None and "30 spans, error bound 11.8%" in result["reason"]
    wall = result["wall"]
    assert wall["seconds"] == pytest.approx(30 * 2.0 - 0.3)
    assert wall["joules"] == pytest.approx((2 * 30 - 1) * 50.0)  # 59 reads apart
    assert wall["reason"] is None
    total = energy_total([result | {"key": ("n", "GPU-a", 0)}])
    assert total["energy_j"] is None and "window too short" in total["energy_unmeasured"]
    assert total["energy_wall_j_per_img"] == pytest.approx(59 * 50.0 / (30 * 50_000))
    assert total["energy_source"] == "nvml_total_energy"


def test_a_wall_span_too_short_for_the_counter_is_refused():
    nvml, clock = StandInNVML(), FakeClock()
    counter = EnergyCounter(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(None), "GPU-a", clock)
    counter.open()
    clock.t += 5.0  # 2 * 0.1 / 5 = 4% > 2%
    counter.close(seconds=5.0, images=100)
    wall = counter.result()["wall"]
    assert wall["joules"] is None and wall["seconds"] == pytest.approx(5.0)
    assert "a wall span of 5.0 s, error bound 4.0% > 2%" in wall["reason"]
    total = energy_total([counter.result() | {"key": ("n", "GPU-a", 0)}])
    assert total["energy_wall_j"] is None and total["energy_source"] is None


def test_a_counter_that_goes_backwards_is_refused():
    """A driver reload between a span's reads: refused by name. One span alone could not tell
    (its negative sum is refused as a counter that did not advance too); among spans that did
    advance, the reload's negative span was summed into a smaller total."""
    # +10 kJ, the reload (10,000,000 mJ -> 1,000), then +20 kJ
    reads = iter([0, 10_000_000, 10_000_000, 1_000, 1_000, 20_000_000])
    counter = EnergyCounter(lambda: next(reads), "GPU-a")
    for _ in range(3):
        counter.open()
        counter.close(seconds=600.0, images=100)
    result = counter.result()
    assert result["joules"] is None and "went backwards" in result["reason"], result


def test_sampler_gives_its_gpus_energy_counter_by_uuid():
    """On a GPU node NvmlSampler.start() keeps pynvml and the handle; the counter reads that
    handle's nvmlDeviceGetTotalEnergyConsumption and names the GPU by UUID."""
    sampler = NvmlSampler(torch.device("cpu"))
    assert sampler.energy_counter().result()["reason"] == "NVML unavailable"
    nvml = StandInNVML()
    sampler.pynvml, sampler.handle, sampler.uuid = nvml, "handle", "1111bbbb"
    counter = sampler.energy_counter()
    counter.open()
    counter.close(seconds=600.0, images=10)
    assert counter.gpu == "1111bbbb" and counter.result()["joules"] == pytest.approx(50.0)


def resumed_energy_over_ranks(tmp_path, layouts: list[list[str]]) -> list[dict]:
    """Real gloo ranks that train one segment per entry of `layouts` (each segment's GPU per
    rank), stopping after each but the last with the stop's checkpoint: the checkpoint's
    split of RunState (rank 0's progress, each rank's own PER_RANK fields) is what the next
    segment resumes with."""
    results = mp.Manager().dict()
    world = len(layouts[0])
    mp.spawn(
        _resumed_energy_entry,
        args=(world, free_port(), layouts, str(tmp_path), results),
        nprocs=world,
    )
    return [results[r] for r in range(world)]


def _resumed_energy_entry(rank, world, port, layouts, out, results):
    import dataclasses

    from scalestudy.trainer.state import PER_RANK

    os.environ.update(LOCAL_RANK=str(rank), SLURMD_NODENAME="node1")
    measure.ENERGY_UPDATE_S = 1e-9  # the stand-in's counter changes on every read
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    state = RunState()
    for number, gpus in enumerate(layouts):
        meter = measure.Meter(TrainConfig(out=out, warmup_steps=1), torch.device("cpu"), rank)
        # each segment's counter reads its own NVML (a restart may land on another node)
        nvml = StandInNVML()
        meter.energy = EnergyCounter(
            functools.partial(nvml.nvmlDeviceGetTotalEnergyConsumption, None), gpus[rank]
        )
        drive_window(meter, state)
        if number == len(layouts) - 1:
            meter.end_loop(state)
            break
        meter.bank_loop_time(state)  # Checkpointing.after_epoch on the stop, then _save
        meter.bank_segment(state)
        progress = [dataclasses.asdict(state)]
        dist.broadcast_object_list(progress, src=0)  # the checkpoint's "progress": rank 0's
        mine = {key: getattr(state, key) for key in PER_RANK}  # its "ranks" entry
        state = RunState(**progress[0])  # Checkpointing.resume
        for key, value in mine.items():
            setattr(state, key, value)
    results[rank] = {**meter.reduce_energy(world), "window_images": state.window_images}
    dist.destroy_process_group()


def test_a_resumed_runs_energy_covers_every_segment(tmp_path):
    """A run stopped after its first segment and resumed reported the energy of its last
    segment only (the counter lived in the process), beside a window and a throughput of both:
    energy_j half the run's, and resources.csv's kWh of a GPU-hour budget with it. Now the
    checkpoint carries each rank's counter sums, and energy_j, energy_wall_j and their J/img
    cover both segments: 2 real gloo ranks on 2 stand-in GPUs, 2 segments of 2 epochs each."""
    layout = ["GPU-a", "GPU-b"]
    results = resumed_energy_over_ranks(tmp_path, [layout, layout])
    assert results[0] == results[1]
    segment_images = (EPOCHS * STEPS - 1) * BATCH  # one warm-up step per segment
    assert results[0]["window_images"] == 2 * segment_images
    images = 2 * results[0]["window_images"]  # both ranks'
    energy_j = 2 * 2 * EPOCHS * 50.0  # 2 GPUs x 2 segments x 2 spans of 50 J
    assert results[0]["energy_j"] == pytest.approx(energy_j)
    assert results[0]["energy_j_per_img"] == pytest.approx(energy_j / images)
    # each segment's wall span (2 x EPOCHS - 1 reads apart), summed: the restart is in none
    wall_j = 2 * 2 * (2 * EPOCHS - 1) * 50.0
    assert results[0]["energy_wall_j"] == pytest.approx(wall_j)
    assert results[0]["energy_wall_j_per_img"] == pytest.approx(wall_j / images)
    assert results[0]["energy_wall_unmeasured"] is None


def test_a_resumed_run_whose_ranks_shared_gpus_differently_has_no_energy(tmp_path):
    """Each GPU is counted by one rank (the lowest local rank on it). A run whose first segment
    gave each rank a GPU and whose resumed segment put both on one would count the first
    segment's second GPU by the reader of the last segment's layout, or not at all: null,
    with the reason, never a guess."""
    results = resumed_energy_over_ranks(tmp_path, [["GPU-a", "GPU-b"], ["GPU-c", "GPU-c"]])
    assert results[0] == results[1]
    assert results[0]["energy_j"] is None and results[0]["energy_wall_j"] is None
    assert "shared GPUs differently" in results[0]["energy_unmeasured"]


def test_the_wall_spans_seconds_are_the_longest_ranks():
    """energy_wall_s is the wall span's time, the longest rank's (train.py), not the sum over
    ranks: two ranks each on its own GPU, read over the same window, are one span of time, and
    the sum reported twice the seconds the joules were spent in. STAND-IN clocks: rank 0's 3
    epochs of 10 s, rank 1's of 12 s, each with 2 s of evaluation between them: spans of
    3 x 10 + 2 x 2 = 34 s and 3 x 12 + 2 x 2 = 40 s."""
    readings = []
    for local_rank, (gpu, epoch_s) in enumerate([("GPU-a", 10.0), ("GPU-b", 12.0)]):
        nvml, clock = StandInNVML(), FakeClock()
        read = functools.partial(nvml.nvmlDeviceGetTotalEnergyConsumption, None)
        counter = EnergyCounter(read, gpu, clock)
        for epoch in range(3):
            if epoch:
                clock.t += 2.0  # the evaluation between the window's epochs
            counter.open()
            clock.t += epoch_s
            counter.close(seconds=epoch_s, images=1000)
        readings.append(counter.result() | {"key": ("node1", gpu, local_rank)})
    assert [r["wall"]["seconds"] for r in readings] == [pytest.approx(34.0), pytest.approx(40.0)]
    total = energy_total(readings)
    assert total["energy_wall_s"] == pytest.approx(40.0)
    # both GPUs' counters, 5 reads apart (50 J each), over both ranks' images
    assert total["energy_wall_j"] == pytest.approx(2 * 5 * 50.0)
    assert total["energy_wall_j_per_img"] == pytest.approx(2 * 5 * 50.0 / (2 * 3 * 1000))
    assert total["energy_wall_unmeasured"] is None
