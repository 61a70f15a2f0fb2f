"""The fast path on a CPU: torch.compile (--compile on; auto leaves it off on CPU, compiling.py)
compiles once, and it learns what eager learns.

One rank, ResNet-18 at width 8, the demo's recipe (global batch 32, lr 3.2 at 512, half an
epoch of warm-up, onecycle to 0) for 6 epochs of 2,048 synthetic images, evaluated on 1,000:
both runs end on the plateau (eager 99.6% and compiled 99.9% measured on 2026-11-25; 99.0% and
100.0%, 10 images apart, in a CI run of 2026-12-01 on an AVX-512 machine), where the compiled
arithmetic's different rounding (gradients agree to ~1e-5 relative after one step) moves the
final accuracy by a percentage point at most. A shorter recipe that ends mid-climb
(1,000 images, 8 epochs, lr 2.0) differed by 3.3 points: there the runs had not converged, and
any rounding difference shows. The training set is cut to 2,000 images: 62 steps of 32 and a
ragged tail of 16 left out per epoch, which must not recompile. The compiled run costs ~40 s
of inductor compilation on a cold cache.
"""

from __future__ import annotations

import concurrent.futures
import subprocess

import pytest
import torch
from conftest import PYTHON, child_env, read_metrics, train

from scalestudy.errors import TrainConfigError, TrainingError
from scalestudy.trainer import compiling
from scalestudy.trainer.config import STEPS_BEFORE_WINDOW, TrainConfig

FLAGS = [
    *("--width", "8", "--epochs", "6", "--local-batch", "32", "--lr", "3.2"),
    *("--warmup-epochs", "0.5", "--limit-train", "2000"),
    *("--comm-probe-steps", "0", "--no-tensorboard"),
]
TEST_IMAGES = 1000  # the evaluation set: 1 percentage point is 10 of its images


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    data = tmp_path_factory.mktemp("fastpath-data")
    prepare = [PYTHON, "-m", "scalestudy", "prepare-data", "--dataset", "synthetic"]
    prepare += ["--data-dir", str(data), "--num-train", "2048", "--num-test", str(TEST_IMAGES)]
    subprocess.run(prepare, check=True, env=child_env(), capture_output=True, timeout=300)
    paths = {switch: tmp_path_factory.mktemp(f"compile-{switch}") for switch in ("off", "on")}

    def run(switch: str) -> dict:
        train(data, paths[switch], *FLAGS, "--compile", switch, nproc=1, timeout=900)
        return read_metrics(paths[switch])

    # side by side, one core each: the eager run ends while the other still compiles
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(zip(paths, pool.map(run, paths), strict=True))


def test_compiled_run_learns_what_eager_learns(runs):
    eager, compiled = runs["off"], runs["on"]
    assert eager["final_val_acc"] > 0.95 and compiled["final_val_acc"] > 0.95
    # in images, not as a difference of two fractions: 1.0 - 0.99 is 0.010000000000000009 in
    # floating point, and a run 10 images apart (1 point, within the target) failed on it
    right = {name: round(m["final_val_acc"] * TEST_IMAGES) for name, m in runs.items()}
    assert abs(right["on"] - right["off"]) <= TEST_IMAGES // 100, right


def test_compiled_once_and_never_inside_the_window(runs):
    compiled = runs["on"]
    assert compiled["compile"] == "on" and compiled["compiled"] is True
    assert compiled["compile_graphs"] >= 1  # dynamo compiled the model
    assert compiled["compile_graphs_in_window"] == 0  # ragged epochs, eval: no recompilation
    assert compiled["steps_per_epoch"] == 2000 // 32
    eager = runs["off"]
    assert eager["compiled"] is False and eager["compile_graphs"] is None


@pytest.mark.parametrize(
    ("flags", "device", "mode"),
    [
        # the default on a GPU: ddp, no hook, no accumulation, bf16/tf32/fp32 over NCCL
        ({}, "cuda", "step"),
        ({}, "cpu", "off"),  # CUDA graphs need CUDA
        ({"compile": "off"}, "cuda", "step"),  # the whole-step graph holds eager kernels too
        ({"strategy": "allreduce"}, "cuda", "step"),
        ({"precision": "fp16"}, "cuda", "compiled"),  # the GradScaler: not in a whole graph
        ({"precision": "fp16", "compile": "off"}, "cuda", "off"),
        ({"backend": "gloo"}, "cuda", "compiled"),  # gloo's all-reduce runs on the CPU
        ({"diag_data_delay_ms": 5.0}, "cuda", "compiled"),  # a host sleep: not in a graph
        ({"profile_steps": "20:30"}, "cuda", "compiled"),  # a replay records no phase ranges
        ({"strategy": "fsdp"}, "cuda", "off"),  # FSDP2's hooks between graphs: unproven
        ({"comm_hook": "powersgd"}, "cuda", "off"),
        ({"accum_steps": 2}, "cuda", "off"),  # several forwards per step
        ({"cuda_graphs": "off"}, "cuda", "off"),
        ({"cuda_graphs": "on", "strategy": "fsdp"}, "cuda", "compiled"),  # asked: the user's call
        ({"cuda_graphs": "on"}, "cuda", "compiled"),
        ({"cuda_graphs": "step", "compile": "off"}, "cuda", "step"),
    ],
)
def test_cuda_graphs_auto_picks_the_mode_where_it_is_proven(flags, device, mode):
    cfg = TrainConfig(**flags)
    assert compiling.graphs_mode(cfg, torch.device(device)) == mode


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        ({"precision": "fp16"}, "precision fp16"),
        ({"accum_steps": 2}, "accum_steps 2"),
        ({"strategy": "fsdp"}, "strategy fsdp"),
        ({"comm_hook": "powersgd"}, "comm_hook powersgd"),
        ({"backend": "gloo"}, "backend gloo"),
        ({"diag_slow_rank": "1:50"}, "a diagnostic delay"),
        ({"profile_steps": "20:30"}, "a --profile-steps window"),
    ],
)
def test_cuda_graphs_step_refuses_what_a_whole_step_graph_cannot_hold(flags, why):
    with pytest.raises(TrainConfigError, match=f"--cuda-graphs step .*not with {why}"):
        TrainConfig(cuda_graphs="step", **flags)


def test_a_run_too_short_for_the_whole_step_graph_gets_the_compiled_graphs():
    """The whole-step graph needs its 11 eager steps, the capture and a window after them."""
    cuda, before = torch.device("cuda"), STEPS_BEFORE_WINDOW
    assert compiling.graphs_mode(TrainConfig(), cuda, total_steps=before + 1) == "step"
    assert compiling.graphs_mode(TrainConfig(), cuda, total_steps=before) == "compiled"
    eager = TrainConfig(compile="off")
    assert compiling.graphs_mode(eager, cuda, total_steps=before) == "off"
    with pytest.raises(TrainingError, match="--cuda-graphs step: 12 optimizer steps leave no"):
        compiling.graphs_mode(TrainConfig(cuda_graphs="step"), cuda, total_steps=before)
