"""trainer.measure.Meter's accounting of training-loop time across checkpoints (a fake clock), and
--sync-debug's counter."""

from __future__ import annotations

import statistics
import warnings

import pytest
import torch

from scalestudy.trainer import measure
from scalestudy.trainer.config import STEPS_BEFORE_WINDOW, TrainConfig
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
