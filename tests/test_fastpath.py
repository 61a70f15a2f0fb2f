"""The fast path on a CPU: torch.compile (--compile on; auto leaves it off on CPU, compiling.py)
compiles once, and it learns what eager learns.

One rank, ResNet-18 at width 8, the demo's recipe (global batch 32, lr 3.2 at 512, half an
epoch of warm-up, onecycle to 0) for 6 epochs of 2,048 synthetic images, evaluated on 1,000:
both runs end on the plateau (eager 99.6% and compiled 99.9% measured on 2026-11-25), where
the compiled arithmetic's different rounding (gradients agree to ~1e-5 relative after one step)
cannot move the final accuracy by a percentage point. A shorter recipe that ends mid-climb
(1,000 images, 8 epochs, lr 2.0) differed by 3.3 points: there the runs had not converged, and
any rounding difference shows. The training set is cut to 2,000 images: 62 steps of 32 and a
ragged tail of 16 left out per epoch, which must not recompile. The compiled run costs ~40 s
of inductor compilation on a cold cache.
"""

from __future__ import annotations

import subprocess

import pytest
import torch
from conftest import PYTHON, child_env, read_metrics, train

from scalestudy.trainer import compiling
from scalestudy.trainer.config import TrainConfig

FLAGS = [
    *("--width", "8", "--epochs", "6", "--local-batch", "32", "--lr", "3.2"),
    *("--warmup-epochs", "0.5", "--limit-train", "2000"),
    *("--comm-probe-steps", "0", "--no-tensorboard"),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    data = tmp_path_factory.mktemp("fastpath-data")
    prepare = [PYTHON, "-m", "scalestudy", "prepare-data", "--dataset", "synthetic"]
    prepare += ["--data-dir", str(data), "--num-train", "2048", "--num-test", "1000"]
    subprocess.run(prepare, check=True, env=child_env(), capture_output=True, timeout=300)
    out = {}
    for switch in ("off", "on"):
        path = tmp_path_factory.mktemp(f"compile-{switch}")
        train(data, path, *FLAGS, "--compile", switch, nproc=1, timeout=900)
        out[switch] = read_metrics(path)
    return out


def test_compiled_run_learns_what_eager_learns(runs):
    eager, compiled = runs["off"], runs["on"]
    assert eager["final_val_acc"] > 0.95 and compiled["final_val_acc"] > 0.95
    assert abs(compiled["final_val_acc"] - eager["final_val_acc"]) <= 0.01


def test_compiled_once_and_never_inside_the_window(runs):
    compiled = runs["on"]
    assert compiled["compile"] == "on" and compiled["compiled"] is True
    assert compiled["compile_graphs"] >= 1  # dynamo compiled the model
    assert compiled["compile_graphs_in_window"] == 0  # ragged epochs, eval: no recompilation
    assert compiled["steps_per_epoch"] == 2000 // 32
    eager = runs["off"]
    assert eager["compiled"] is False and eager["compile_graphs"] is None


@pytest.mark.parametrize(
    ("flags", "device", "on"),
    [
        ({}, "cuda", True),  # the default on a GPU: compiled, ddp, no hook, no accumulation
        ({}, "cpu", False),  # --compile auto is off on a CPU, and CUDA graphs need CUDA
        ({"compile": "off"}, "cuda", False),
        ({"strategy": "allreduce"}, "cuda", True),
        ({"strategy": "fsdp"}, "cuda", False),  # FSDP2's hooks between graphs: unproven
        ({"comm_hook": "powersgd"}, "cuda", False),
        ({"accum_steps": 2}, "cuda", False),  # several forwards per step
        ({"cuda_graphs": "off"}, "cuda", False),
        ({"cuda_graphs": "on", "strategy": "fsdp"}, "cuda", True),  # asked for: the user's call
    ],
)
def test_cuda_graphs_auto_is_on_only_where_proven(flags, device, on):
    cfg = TrainConfig(**flags)
    assert compiling.cuda_graphs_on(cfg, torch.device(device)) is on
