"""The fast path on a CPU: torch.compile (--compile on; auto leaves it off on CPU, compiling.py)
compiles once, and it learns what eager learns.

One rank, ResNet-18 at width 8, the session's synthetic set cut to 1,000 images (a ragged
epoch: 31 steps of 32 and 8 images left out, which must not recompile), 8 epochs of onecycle
annealed to lr 0: both runs end on the plateau (eager 99.0% and compiled 98.7% measured on
2026-11-25), where the compiled arithmetic's small differences in rounding cannot move the
final accuracy by a percentage point. The compiled run costs ~40 s of inductor compilation.
"""

from __future__ import annotations

import pytest
from conftest import read_metrics, train

FLAGS = [
    *("--width", "8", "--epochs", "8", "--lr", "2.0", "--limit-train", "1000"),
    *("--comm-probe-steps", "0", "--no-tensorboard"),
]


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    out = {}
    for switch in ("off", "on"):
        path = tmp_path_factory.mktemp(f"compile-{switch}")
        train(data_dir, path, *FLAGS, "--compile", switch, nproc=1, timeout=900)
        out[switch] = read_metrics(path)
    return out


def test_compiled_run_learns_what_eager_learns(runs):
    eager, compiled = runs["off"], runs["on"]
    assert eager["final_val_acc"] > 0.9 and compiled["final_val_acc"] > 0.9
    assert abs(compiled["final_val_acc"] - eager["final_val_acc"]) <= 0.01


def test_compiled_once_and_never_inside_the_window(runs):
    compiled = runs["on"]
    assert compiled["compile"] == "on" and compiled["compiled"] is True
    assert compiled["compile_graphs"] >= 1  # dynamo compiled the model
    assert compiled["compile_graphs_in_window"] == 0  # ragged epochs, eval: no recompilation
    assert compiled["steps_per_epoch"] == 1000 // 32
    eager = runs["off"]
    assert eager["compiled"] is False and eager["compile_graphs"] is None
