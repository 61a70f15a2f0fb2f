"""trainer.measure.Meter's accounting of training-loop time across checkpoints (a fake clock), and
--sync-debug's counter."""

from __future__ import annotations

import os
import statistics
import time
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from scalestudy.trainer import measure
from scalestudy.trainer.config import STEPS_BEFORE_WINDOW, TrainConfig
from scalestudy.trainer.dist import free_port
from scalestudy.trainer.state import RunState


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_checkpoints_never_count_a_second_twice(tmp_path, monkeypatch):
    """3 s of loop with checkpoints after 1 s and 2 s is train_time_s = 3 s, as without them
    (the checkpoint used to store the running total without restarting the clock: 1 + 2 + 3)."""
    clock = Clock()
    monkeypatch.setattr(measure.time, "perf_counter", clock)
    meter = measure.Meter(TrainConfig(out=str(tmp_path)), torch.device("cpu"), rank=0)
    state = RunState()
    meter.start(state)
    for _ in range(2):
        clock.now += 1.0
        meter.bank_loop_time(state)  # what a checkpoint stores
    assert state.loop_time == 2.0
    clock.now += 1.0
    assert meter.end_loop(state) == 3.0


def test_a_resumed_segment_adds_to_the_checkpointed_time(tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(measure.time, "perf_counter", clock)
    meter = measure.Meter(TrainConfig(out=str(tmp_path)), torch.device("cpu"), rank=0)
    state = RunState(loop_time=5.0)  # 5 s of earlier segments, from the checkpoint
    meter.start(state)
    clock.now += 2.5
    assert meter.end_loop(state) == 7.5


def test_sync_counter_counts_every_synchronisation_between_start_and_stop(monkeypatch, caplog):
    """--sync-debug's plumbing with a stand-in for torch.cuda.set_sync_debug_mode (CUDA only):
    every sync warning inside start()..stop() counts, the same line twice too (the "always"
    filter), other warnings and warnings outside do not, and the mode is switched back."""
    modes = []
    monkeypatch.setattr(measure.torch.cuda, "set_sync_debug_mode", modes.append)
    counter = measure.SyncCounter()
    sync = "called a synchronizing CUDA operation"
    for _ in range(2):  # two steps
        counter.start()
        for _ in range(2):
            warnings.warn(sync, UserWarning, stacklevel=1)  # the same line twice
        warnings.warn("something else", UserWarning, stacklevel=1)
        counter.stop()
    with pytest.warns(UserWarning):
        warnings.warn(sync, UserWarning, stacklevel=1)  # outside a step: not counted
    assert counter.count == 4
    assert modes == ["warn", "default"] * 2
    assert "host synchronisation inside a step: " in caplog.text  # where the first one was


def test_under_the_whole_step_graph_only_data_is_timed_and_the_window_opens_after_the_capture(
    tmp_path,
):
    """--cuda-graphs step: a replay is one step with no phase inside it, so the window's steps
    add step and data times but no busy time (null, not a sum of absent phases), and the window
    opens after the eager steps and the capture whatever --warmup-steps says."""
    cfg = TrainConfig(out=str(tmp_path), warmup_steps=2)
    step = measure.Meter(cfg, torch.device("cpu"), rank=0, graphs="step")
    plain = measure.Meter(cfg, torch.device("cpu"), rank=0)
    assert step.warmup_steps == STEPS_BEFORE_WINDOW and plain.warmup_steps == 2
    # PowerSGD all-reduces uncompressed for its first steps, in every segment: not in the window
    powersgd = TrainConfig(out=str(tmp_path), warmup_steps=2, comm_hook="powersgd")
    assert measure.Meter(powersgd, torch.device("cpu"), rank=0).warmup_steps == 10
    # only the allreduce strategy has a communication phase of its own (DDP: inside backward)
    allreduce = TrainConfig(out=str(tmp_path), strategy="allreduce")
    assert measure.Meter(allreduce, torch.device("cpu"), rank=0).timed_phases == measure.PHASES
    assert step.timed_phases == ("data",)
    assert plain.timed_phases == tuple(p for p in measure.PHASES if p != "communication")
    for meter in (step, plain):
        state = RunState()
        meter.start(state)
        meter.epoch_start()
        for i in range(STEPS_BEFORE_WINDOW + 3):
            meter.before_step(i, seen=0)
            meter.step_start()
            with meter.phase("data"):
                pass
            if meter is plain:  # an eager step's phases; a replay has none
                for name in ("forward", "backward", "optimizer"):
                    with meter.phase(name):
                        pass
            meter.step_end()
        meter.epoch_end(state, seen=0)
        meter.end_loop(state)
        windowed = 3 if meter is step else STEPS_BEFORE_WINDOW + 1
        assert len(state.window_step_times) == len(state.window_data_times) == windowed
        assert len(state.window_busy_times) == (0 if meter is step else windowed)


def test_the_data_wait_per_step_is_the_mean_not_the_median():
    """The device loader prepares loaders.AHEAD steps' batches in one step's data phase: the
    median step holds none of that work, the mean holds all of it (the waterfall's data wait)."""
    state = RunState()
    state.window_data_times = [0.016] + [0.0] * 15  # 16 ms of data work every 16 steps, in s
    state.window_step_times = [0.1] * 16
    times = measure.rank_times(state)
    assert times["data_time_ms_p50_by_rank"] == 0.0
    assert times["data_time_ms_mean_by_rank"] == pytest.approx(1.0)
    assert times["step_time_ms_p50_by_rank"] == pytest.approx(100)
    assert times["busy_time_ms_p50_by_rank"] is None  # no busy time recorded


@pytest.mark.parametrize(
    ("strategy", "busy_ms"),
    # phases of one step of two micro-batches, ms: data 1, forward 2, backward 30 (no_sync),
    # data 1, forward 2, backward 5 (synchronising under DDP), [communication 7,] optimizer 3
    [("ddp", 1 + 2 + 30 + 1 + 2), ("fsdp", 1), ("allreduce", 1 + 2 + 30 + 1 + 2 + 5)],
)
def test_busy_time_under_accumulation_ends_at_the_first_synchronising_phase(
    strategy, busy_ms, tmp_path, monkeypatch
):
    """Under gradient accumulation DDP synchronises in the last micro-batch's backward only; the
    backwards before it (no_sync) are local work that a slow rank is slow in, so they are busy
    time (they were left out: the waterfall put that imbalance in the residual). FSDP
    all-gathers in every forward, the first included; allreduce waits in its communication."""
    clock = Clock()
    monkeypatch.setattr(measure.time, "perf_counter", clock)
    cfg = TrainConfig(out=str(tmp_path), strategy=strategy, accum_steps=2, warmup_steps=0)
    meter = measure.Meter(cfg, torch.device("cpu"), rank=0)
    state = RunState()
    meter.start(state)
    meter.epoch_start()
    meter.before_step(0, seen=0)
    meter.step_start()
    phases = [("data", 1), ("forward", 2), ("backward", 30), ("data", 1), ("forward", 2)]
    phases += [("backward", 5)] + ([("communication", 7)] if strategy == "allreduce" else [])
    for name, ms in [*phases, ("optimizer", 3)]:
        with meter.phase(name):
            clock.now += ms / 1e3
    meter.step_end()
    meter.epoch_end(state, seen=0)
    assert state.window_busy_times == [pytest.approx(busy_ms / 1e3)]
    assert state.window_phase_seconds["backward"] == pytest.approx(0.035)
    labels = {"ddp": "data+forward (and the backward of each micro-batch before the last)"}
    labels |= {"fsdp": "data", "allreduce": "data+forward+backward"}
    assert meter.busy_phases == labels[strategy]


def test_the_step_time_quantiles_are_linear_between_ranks_and_p50_is_the_median():
    """round() rounds half to even: the p50 of 4 step times was the 3rd, of 6 the 3rd."""
    for n in (1, 2, 4, 5, 6, 8, 21):
        times = [0.01 * (i + 1) for i in range(n)]
        assert measure._quantile(times[::-1], 0.50) == pytest.approx(statistics.median(times))
    times = [float(i) for i in range(20)]  # p95 of 0..19: 0.95 x 19 = 18.05
    assert measure._quantile(times, 0.95) == pytest.approx(18.05)
    assert measure._quantile([3.0], 0.95) == 3.0


def test_a_resumed_runs_window_counts_and_utilisation_cover_every_segment(
    tmp_path, monkeypatch, one_rank_group
):
    """A run stopped and resumed reported host_syncs_in_window and gpu_util_mean of its last
    segment only, while its throughput summed every segment's window: 3 host syncs in the
    first segment's window and a GPU busy at 100% for most of the window vanished from
    metrics.json. Now each checkpoint carries the counts and the window's NVML samples (sum and
    count), and the run reports the syncs summed and the mean of every window sample. CUDA's
    sync-debug mode and NVML are stand-ins here (no GPU); the samples are real, timed by the
    sampler's thread; the checkpoint is RunState's round trip through its dict."""
    import dataclasses
    import time

    monkeypatch.setattr(measure.torch.cuda, "set_sync_debug_mode", lambda mode: None)
    sync = "called a synchronizing CUDA operation"
    cfg = TrainConfig(out=str(tmp_path))
    everything: list[dict] = []  # every window sample of both segments

    def segment(state: RunState, util: float, syncs: int, window_s: float):
        meter = measure.Meter(cfg, torch.device("cpu"), rank=0)
        meter.syncs = measure.SyncCounter()  # --sync-debug on a GPU
        meter.nvml = measure.NvmlSampler(
            torch.device("cpu"),
            interval_s=0.01,
            read=lambda handle: {"util_pct": util},
            lookback_s=0.0,  # the stand-in's utilisation is of its instant
        )
        meter.start(state)
        meter.nvml.open_span()
        meter.syncs.start()
        for _ in range(syncs):
            warnings.warn(sync, UserWarning, stacklevel=1)
        meter.syncs.stop()
        time.sleep(window_s)
        meter.nvml.close_span()
        return meter

    first = segment(RunState(), util=100.0, syncs=3, window_s=0.4)
    state = RunState()
    first.bank_loop_time(state)
    first.bank_segment(state)  # what the stop's checkpoint stores
    first.nvml.stop()  # the process exits 75
    everything += [s for s in first.nvml.samples if first.nvml.in_window(s["time_s"])]
    resumed = RunState(**dataclasses.asdict(state))  # what the next segment resumes with

    last = segment(resumed, util=40.0, syncs=2, window_s=0.2)
    last.end_loop(resumed)
    everything += [s for s in last.nvml.samples if last.nvml.in_window(s["time_s"])]
    assert {s["util_pct"] for s in everything} == {100.0, 40.0}
    resumed.window_images, resumed.window_time, resumed.window_step_times = 64, 1.0, [0.5, 0.5]
    resumed.history = [{"epoch_time_s": 1.0, "in_window": True}]
    m = last.reduce(resumed, world_size=1)
    assert m["host_syncs_in_window"] == 5
    assert m["gpu_util_mean"] == pytest.approx(statistics.fmean(s["util_pct"] for s in everything))
    assert m["gpu_util_mean"] > 60  # the last segment's alone: 40


def test_a_resumed_runs_recompilations_in_the_window_cover_every_segment(tmp_path, one_rank_group):
    """compile_graphs_in_window is the fast path's check (0: nothing recompiled inside the
    measurement). A run whose first segment recompiled inside its window and whose resumed
    segment did not reported 0, while its throughput summed both windows, the recompilation's
    included. Now each checkpoint carries the count, and the run reports the sum. Real dynamo
    (the eager backend: graphs without inductor's compiler) on CPU under --compile on."""
    import dataclasses

    cfg = TrainConfig(out=str(tmp_path), compile="on", warmup_steps=1)

    def segment(state: RunState, recompile: bool) -> measure.Meter:
        meter = measure.Meter(cfg, torch.device("cpu"), rank=0)
        assert meter.compiled
        meter.start(state)
        meter.epoch_start()
        for i in range(3):  # step 0 warms up, the window opens at step 1
            meter.before_step(state.step, seen=8 * i)
            if recompile and i == 2:  # a graph dynamo compiles inside the window
                torch.compile(lambda x: x * 3 - 1, backend="eager")(torch.ones(2))
            state.step += 1
        meter.epoch_end(state, seen=24)
        return meter

    state = RunState()
    first = segment(state, recompile=True)
    first.bank_loop_time(state)
    first.bank_segment(state)  # what the stop's checkpoint stores
    resumed = RunState(**dataclasses.asdict(state))  # what the next segment resumes with

    last = segment(resumed, recompile=False)
    last.end_loop(resumed)
    resumed.window_step_times = [0.5, 0.5]
    resumed.history = [{"epoch_time_s": 1.0, "in_window": True}]
    m = last.reduce(resumed, world_size=1)
    assert m["compiled"] is True
    assert m["compile_graphs_in_window"] == 1  # the last segment's alone: 0


def drive_steps(meter: measure.Meter, state: RunState, clock: Clock, steps: list[dict]) -> None:
    """One epoch of the training loop's hooks as loop.py calls them, without a model: each step
    a {phase: ms} of the stand-in clock's time (DDP's phases, in the order they run)."""
    meter.start(state)
    meter.epoch_start()
    for i, phases in enumerate(steps):
        meter.before_step(state.step, seen=8 * i)
        meter.step_start()
        for name, ms in phases.items():
            with meter.phase(name):
                clock.now += ms / 1e3
        meter.step_end()
        state.step += 1
    meter.epoch_end(state, seen=8 * len(steps))
    state.history.append({"epoch_time_s": 1.0, "in_window": False})


def test_the_busy_time_per_rank_is_the_median_over_the_window_steps(
    tmp_path, monkeypatch, one_rank_group
):
    """busy_time_ms_p50_by_rank is each rank's median over its window steps, as its step and
    data times are (train.py): one step slowed by something outside the rank's imbalance (a
    page fault, a GC pause in its data phase) moves a mean but not the median, and a rank's
    entry in the imbalance of the waterfall would carry it. With one window step (the earlier
    tests) mean and median are the same number: here 3 window steps of unequal busy time
    (DDP: data + forward) after a slow warm-up step that counts in none of them."""
    clock = Clock()
    monkeypatch.setattr(measure.time, "perf_counter", clock)
    cfg = TrainConfig(out=str(tmp_path), strategy="ddp", warmup_steps=1)
    meter = measure.Meter(cfg, torch.device("cpu"), rank=0)
    state = RunState()
    steps = [
        {"data": 500, "forward": 500, "backward": 500, "optimizer": 500},  # warm-up
        {"data": 1, "forward": 2, "backward": 5, "optimizer": 3},  # busy 3 ms
        {"data": 40, "forward": 2, "backward": 5, "optimizer": 3},  # busy 42 ms (a GC pause)
        {"data": 1, "forward": 9, "backward": 5, "optimizer": 3},  # busy 10 ms
    ]
    drive_steps(meter, state, clock, steps)
    meter.end_loop(state)
    m = meter.reduce(state, world_size=1)
    # busy: data + forward of the 3 window steps, 3, 42 and 10 ms: the median 10 (mean 18.3)
    assert m["busy_phases"] == "data+forward"
    assert m["busy_time_ms_p50_by_rank"] == [pytest.approx(10.0)]
    assert m["step_time_ms_p50_by_rank"] == [pytest.approx(18.0)]  # of 11, 50 and 18 ms
    assert m["data_time_ms_p50_by_rank"] == [pytest.approx(1.0)]  # of 1, 40 and 1 ms
    assert m["data_time_ms_mean_by_rank"] == [pytest.approx(42.0 / 3)]


def test_the_step_time_quantiles_are_rank_0s_window_steps_p50_and_p95(
    tmp_path, monkeypatch, one_rank_group
):
    """step_time_ms_p50/p95 are the 0.50 and 0.95 quantiles (linear between ranks, numpy's
    default) of the window's step times: a p95 taken at another quantile (0.90) reports a tail
    that is not the one the analysis reads. 20 window steps of 1..20 ms in shuffled order
    (after 2 warm-up steps of 900 ms that count in neither): p50 = 10.5 ms, p95 = the
    0.95 x 19 = 18.05th of the ordered times = 19.05 ms (p90 would be 18.1 ms)."""
    clock = Clock()
    monkeypatch.setattr(measure.time, "perf_counter", clock)
    meter = measure.Meter(TrainConfig(out=str(tmp_path), warmup_steps=2), torch.device("cpu"), 0)
    state = RunState()
    window_ms = [7, 19, 2, 13, 20, 1, 11, 5, 16, 9, 3, 18, 14, 6, 10, 17, 4, 12, 15, 8]
    assert sorted(window_ms) == list(range(1, 21))
    steps = [{"data": 900}] * 2 + [{"data": 0.5, "forward": ms - 0.5} for ms in window_ms]
    drive_steps(meter, state, clock, steps)
    meter.end_loop(state)
    m = meter.reduce(state, world_size=1)
    assert m["window_steps"] == 20
    # independently of measure._quantile: the stdlib's inclusive quantiles are numpy's linear
    percentiles = statistics.quantiles(window_ms, n=20, method="inclusive")  # 5%, 10%, ... 95%
    assert (percentiles[9], percentiles[18]) == (pytest.approx(10.5), pytest.approx(19.05))
    assert m["step_time_ms_p50"] == pytest.approx(10.5)
    assert m["step_time_ms_p95"] == pytest.approx(19.05)
    assert m["window_time_s"] == pytest.approx(sum(window_ms) / 1e3)  # the warm-up left out


# two ranks of one synchronous run: rank 1 is the slow one; each rank's GPU utilisation
STEP_MS, UTIL_PCT, STEPS, BATCH = (10.0, 25.0), (90.0, 30.0), 5, 8  # the 1st step warms up


def test_the_window_is_the_slowest_ranks_and_utilisation_the_mean_over_ranks(tmp_path):
    """Meter.reduce over 2 real gloo ranks whose windows differ (rank 0's steps take 10 ms of
    the stand-in clock, rank 1's 25 ms). window_time_s is the slowest rank's window, and
    throughput_img_s every rank's images over it (train.py): over the mean of the ranks'
    windows it would credit the run with the fast rank's idle wait, a throughput no step
    reached. gpu_util_mean is the mean over the ranks with NVML samples (each its own GPU,
    STAND-IN NVML at 90% and 30%): their max would report the busiest GPU as the run's."""
    results = mp.Manager().dict()
    mp.spawn(_reduce_entry, args=(2, free_port(), str(tmp_path), results), nprocs=2)
    results = [results[r] for r in range(2)]
    windows = [(STEPS - 1) * ms / 1e3 for ms in STEP_MS]  # each rank's window steps, s
    assert [r["window_time"] for r in results] == [pytest.approx(w) for w in windows]
    assert [r["gpu_util"] for r in results] == [pytest.approx(u) for u in UTIL_PCT]
    slowest = max(windows)  # rank 1's 4 window steps of 25 ms: 0.1 s (the mean: 0.07 s)
    images = 2 * (STEPS - 1) * BATCH  # both ranks' window images
    for m in (r["metrics"] for r in results):  # every rank reduces to the same numbers
        assert m["window_images"] == images
        assert m["window_time_s"] == pytest.approx(slowest)
        assert m["throughput_img_s"] == pytest.approx(images / slowest)
        assert m["throughput_img_s_per_rank"] == pytest.approx(images / slowest / 2)
        assert m["gpu_util_mean"] == pytest.approx((90.0 + 30.0) / 2)
        assert m["gpu_util_ranks"] == 2
        assert m["step_time_ms_p50_by_rank"] == [pytest.approx(ms) for ms in STEP_MS]


def _reduce_entry(rank, world, port, out, results):
    """One rank: the loop's hooks over one epoch of STEPS steps of STEP_MS[rank] each on a
    stand-in clock (perf_counter), NVML a STAND-IN reading UTIL_PCT[rank] every 10 ms of real
    time, and the window's last step 0.2 s of real time so that the sampler has samples in it."""
    os.environ.update(LOCAL_RANK=str(rank), SLURMD_NODENAME="node1")
    clock = Clock()
    measure.time = SimpleNamespace(  # this process's measure alone: perf_counter stands in
        perf_counter=clock, monotonic=time.monotonic, sleep=time.sleep, time=time.time
    )
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    cpu = torch.device("cpu")
    meter = measure.Meter(TrainConfig(out=out, warmup_steps=1), cpu, rank)
    util = UTIL_PCT[rank]
    meter.nvml = measure.NvmlSampler(
        cpu, interval_s=0.01, read=lambda handle: {"util_pct": util}, lookback_s=0.0
    )
    state = RunState()
    meter.start(state)
    meter.epoch_start()
    for i in range(STEPS):
        meter.before_step(state.step, seen=i * BATCH)
        meter.step_start()
        with meter.phase("data"):
            clock.now += STEP_MS[rank] / 1e3
            if i == STEPS - 1:
                time.sleep(0.2)
        meter.step_end()
        state.step += 1
    meter.epoch_end(state, seen=STEPS * BATCH)
    state.history.append({"epoch_time_s": clock.now - 100.0, "in_window": False})
    meter.end_loop(state)
    results[rank] = {
        "metrics": meter.reduce(state, world),
        "window_time": state.window_time,
        "gpu_util": meter.gpu_util,
    }
    dist.destroy_process_group()


class _SilentExport:
    """STAND-IN for a torch.profiler run whose chrome-trace export failed: kineto logs "Failed
    to write to log file!" (a full disk, a quota) and returns, having renamed nothing."""

    def key_averages(self):
        return _NoAverages()

    def export_chrome_trace(self, path: str) -> None:
        with open(path + ".tmp", "w") as partial:  # kineto's own temp file, left half-written
            partial.write('{"traceEvents": [')


class _NoAverages(list):
    def table(self, **_) -> str:
        return ""


def test_a_trace_export_that_wrote_nothing_is_said_not_a_missing_file(tmp_path, monkeypatch):
    """The rename of the trace kineto never wrote raised "trace_rank0.json: No such file or
    directory", and left kineto's partial file in --out/profile/."""
    monkeypatch.setattr(measure, "torch_ops_export", lambda averages: [])
    prof = measure.Profiler(TrainConfig(out=str(tmp_path)), torch.device("cpu"), 0)
    prof.prof = _SilentExport()
    with pytest.raises(OSError) as info:
        prof.export()
    assert "wrote no trace" in str(info.value) and "trace_rank0.json" in str(info.value)
    assert sorted(p.name for p in (tmp_path / "profile").iterdir()) == [
        "torch_ops_rank0.json",
        "torch_ops_rank0.txt",
    ]
