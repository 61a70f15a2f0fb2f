"""trainer.measure.Meter's accounting of training-loop time across checkpoints (a fake clock)."""

from __future__ import annotations

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
