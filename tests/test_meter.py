"""trainer.measure.Meter's accounting of training-loop time across checkpoints (a fake clock), and
--sync-debug's counter."""

from __future__ import annotations

import warnings

import pytest
import torch

from scalestudy.trainer import measure
from scalestudy.trainer.config import TrainConfig
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
