"""The trainer, for real: torchrun with 2 gloo ranks on CPU, ResNet-18 at width 4."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import PYTHON, SMALL, child_env, read_epochs, read_metrics, train

from scalestudy import vocab
from scalestudy.errors import TrainConfigError
from scalestudy.results import collect
from scalestudy.trainer import loaders
from scalestudy.trainer.config import TrainConfig
from scalestudy.trainer.models import training_flops_per_image


@pytest.fixture(scope="module")
def ddp_run(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    proc = train(data_dir, out, "--strategy", "ddp", "--bucket-cap-mb", "1")
    return out, proc


def test_metrics_has_every_key_and_sane_values(ddp_run):
    out, proc = ddp_run
    m = read_metrics(out)
    missing = [k for k in collect.REQUIRED_METRICS if k not in m]
    assert not missing, missing
    # every flag is recorded too
    for flag in ("strategy", "bucket_cap_mb", "precision", "local_batch", "seed", "lr"):
        assert flag in m
    assert m["world_size"] == 2 and m["nodes"] == 1 and m["ranks_per_node"] == 2
    assert m["launcher"] == "torchrun"
    assert m["net_interface"] == ["lo (auto)"]  # MASTER_ADDR=localhost routes through lo
    assert m["global_batch"] == 64 and m["local_batch"] == 32
    assert m["device"]["type"] == "cpu"
    assert m["gpu_util_mean"] is None  # no GPU: null, never a made-up 0
    assert m["cuda_version"] is None and m["nccl_version"] is None
    assert m["throughput_img_s"] > 0
    assert m["throughput_img_s_per_rank"] == pytest.approx(m["throughput_img_s"] / 2)
    # window accounting: images over both ranks / window seconds
    assert m["window_images"] == pytest.approx(m["throughput_img_s"] * m["window_time_s"])
    assert m["window_steps"] == 2 * m["steps_per_epoch"] - 2  # all steps after 2 warm-up steps
    assert m["window_warmup_steps"] == m["warmup_steps"] == 2  # the flag's, nothing longer
    # the window is the slowest rank's wall time inside its training loop, not a sum over ranks
    # (which would be ~2x the window, longer than the loop itself)
    assert 0 < m["window_time_s"] <= m["train_time_s"]
    # the window's images are summed over the ranks: every window step, a global batch (images
    # of one rank would be half)
    assert m["window_images"] == m["window_steps"] * m["global_batch"]
    # ... and its throughput is about global_batch / the median step (0.996 of it measured):
    # the step times are measured apart (each rank's own steps, not the window's edges; the
    # window's mean step is above the median where a loaded machine slows some), so a loose
    # factor, a sanity check: the exact checks are the two above
    per_step = m["global_batch"] / (m["step_time_ms_p50"] / 1e3)
    assert 0.3 <= m["throughput_img_s"] / per_step <= 1.5, (m["throughput_img_s"], per_step)
    assert 0 < m["step_time_ms_p50"] <= m["step_time_ms_p95"]
    assert 0 <= m["data_time_frac"] < 1
    assert 0 <= m["comm_exposed_frac"] < 1
    # the probe's two medians, from which it is computed (before the clip at 0)
    t_sync, t_nosync = m["comm_probe_sync_ms_p50"], m["comm_probe_nosync_ms_p50"]
    assert t_sync > 0 and t_nosync > 0
    assert m["comm_exposed_frac"] == pytest.approx(max(0.0, 1 - t_nosync / t_sync), abs=1e-12)
    assert m["peak_mem_mb"] > 0
    assert len(m["param_checksums"]) == 2
    assert m["time_to_target_s"] is None  # no --target-acc: null, not the whole run's time
    # a warm-up of 1 of the 2 epochs: the LR reaches its peak and decays, nothing to warn of
    assert m["lr_max_reached"] == m["peak_lr"] and "does not decay" not in proc.stderr
    assert m["checkpoint_stall_s"] == 0.0  # no --checkpoint-dir: no save to wait for
    # the data as the run read it: data.pt's sha256 with meta.json's mean, std, ... (none before)
    meta = json.loads((Path(m["data_dir"]) / "synthetic" / "meta.json").read_text())
    assert m["data_sha256"] == loaders.data_sha256(meta) != meta["sha256"]
    # what was in effect, read back from torch: gloo on CPU, IEEE fp32 (no TF32) for "fp32"
    assert m["backend"] == "gloo"
    assert m["matmul_fp32_precision"] == m["cudnn_fp32_precision"] == "ieee"
    assert m["autocast_dtype"] is None and m["cudnn_benchmark"] is False
    assert m["gpu_util_ranks"] == 0
    # no GPU energy counter on a CPU: null with the reason, never estimated (RAPL is not read)
    assert (m["energy_j"], m["energy_j_per_img"], m["energy_source"]) == (None, None, None)
    assert m["energy_unmeasured"] == "no GPU"
    assert (m["energy_wall_j"], m["energy_wall_j_per_img"], m["energy_wall_s"]) == (None,) * 3
    assert m["energy_wall_unmeasured"] == "no GPU"
    phases = [m[f"phase_frac_{p}"] for p in ("data", "forward", "backward", "optimizer")]
    assert all(0 < f < 1 for f in phases) and sum(phases) <= 1 + 1e-9
    # DDP communicates inside backward: no phase of its own, so null, not a measured 0
    assert m["phase_frac_communication"] is None
    assert m["phase_frac_data"] == pytest.approx(m["data_time_frac"])
    assert m["phase_time_source"] == "host_clock"
    # FLOPs counted on the network (width 4 here), the FLOP rate it implies, and no MFU on a CPU:
    # null with the reason, never a guessed peak (hardware.py)
    assert m["flops_per_img"] == training_flops_per_image(
        "resnet18", num_classes=10, width=4, image_shape=(3, 32, 32)
    )
    assert m["model_flops_per_s"] == pytest.approx(m["throughput_img_s"] * m["flops_per_img"])
    assert (m["mfu"], m["peak_flops"], m["peak_flops_source"]) == (None, None, None)
    assert m["mfu_unmeasured"].startswith("cpu: no published peak")
    assert m["mfu_gpus"] is None  # no GPU to count
    assert len(m["device_names"]) == 1 and m["device_names"][0] == m["device"]["name"]
    # --compile auto is off on a CPU; nothing compiled, nothing counted
    assert m["compile"] == "auto" and m["compiled"] is False
    assert m["cuda_graphs"] == "auto" and m["cuda_graphs_used"] is False  # CUDA only
    assert m["compile_graphs"] is None and m["compile_graphs_in_window"] is None
    assert m["host_syncs_in_window"] is None  # --sync-debug is off (and CUDA only)
    assert json.dumps(m)  # plain JSON, no NaN
    assert "epoch   2/2" in proc.stdout  # one progress line per epoch, rank 0 only
    assert proc.stdout.count("epoch   1/2") == 1


def test_epochs_csv(ddp_run):
    out, _ = ddp_run
    rows = read_epochs(out)
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    assert tuple(rows[0]) == vocab.EPOCH_COLUMNS
    for r in rows:
        assert all(math.isfinite(float(v)) for v in r.values())
    assert collect.load_epochs(out / "epochs.csv") == rows  # what collect accepts
    m = read_metrics(out)
    assert m["final_val_acc"] == pytest.approx(float(rows[-1]["val_acc"]), rel=1e-5)


def test_each_epoch_row_has_the_learning_rate_its_last_step_used(ddp_run):
    """epochs.csv's lr was read after the epoch's last scheduler step: the next step's (the last
    epoch of a schedule decaying to 0 showed 0, the warm-up epoch its peak)."""
    from scalestudy.trainer.recipe import LR_REFERENCE_BATCH, lr_factor

    m, rows = read_metrics(ddp_run[0]), read_epochs(ddp_run[0])
    spe, epochs = m["steps_per_epoch"], len(rows)
    warmup = round(m["warmup_epochs"] * spe)
    peak = m["lr"] * m["global_batch"] / LR_REFERENCE_BATCH
    for i, row in enumerate(rows):
        last = (i + 1) * spe - 1  # the epoch's last optimizer step
        want = peak * lr_factor(last, spe * epochs, warmup, m["schedule"])
        assert float(row["lr"]) == pytest.approx(want, rel=1e-6), (i, row["lr"], want)
    assert float(rows[-1]["lr"]) > 0
    # by hand: 1024 images over 2 ranks x 32 = 16 steps an epoch, 2 epochs = 32 steps, warm-up
    # 1 epoch = 16 steps (onecycle); epoch 1's last step 15 is the warm-up's last, (15 + 1) / 16
    # = 1; epoch 2's last step 31 is (31 - 16) / 16 = 15/16 into the decay: 1 - 15/16 = 1/16
    assert (spe, epochs, warmup, m["schedule"]) == (16, 2, 16, "onecycle")
    assert [float(r["lr"]) / peak for r in rows] == pytest.approx([1.0, 1 / 16], rel=1e-6)


@pytest.mark.parametrize(
    ("schedule", "after_warmup"),
    [
        # 24 steps, 4 of warm-up: progress = (step - 4) / 20 at steps 4, 9, 14, 19, 24, 30
        ("onecycle", [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]),  # 1 - progress, at least 0
        # 0.5 (1 + cos(pi progress)), progress at most 1: cos(pi/4) = 0.70710678
        ("cosine", [1.0, 0.85355339, 0.5, 0.14644661, 0.0, 0.0]),
    ],
)
def test_the_lr_factor_by_hand(schedule, after_warmup):
    """recipe.lr_factor against literal values: linear warm-up (step + 1) / warmup to 1, then
    the decay at its start, a quarter, the middle, three quarters, the end and past it."""
    from scalestudy.trainer.recipe import lr_factor

    warm = [lr_factor(step, 24, 4, schedule) for step in range(4)]
    assert warm == pytest.approx([0.25, 0.5, 0.75, 1.0], abs=1e-12)
    decay = [lr_factor(step, 24, 4, schedule) for step in (4, 9, 14, 19, 24, 30)]
    assert decay == pytest.approx(after_warmup, abs=1e-8)
    # no warm-up: the decay starts at step 0 (progress 0 -> 1, 10 -> 0.5 of 20 steps)
    assert lr_factor(0, 20, 0, schedule) == pytest.approx(1.0)
    assert lr_factor(10, 20, 0, schedule) == pytest.approx(0.5)


def test_ranks_hold_identical_parameters(ddp_run):
    m = read_metrics(ddp_run[0])
    assert len(set(m["param_checksums"])) == 1


def test_the_param_checksum_tells_parameters_apart():
    """Equal checksums across ranks prove equal weights only if the checksum sees the values:
    one element 1 ulp apart, or two elements swapped, gives another checksum."""
    from scalestudy.trainer.models import build_model
    from scalestudy.trainer.parallel import param_checksum

    torch.manual_seed(0)
    net = build_model("resnet18", num_classes=10, width=4, in_channels=3)
    twin = copy.deepcopy(net)
    same = param_checksum(net)
    assert re.fullmatch("[0-9a-f]{16}", same) and param_checksum(twin) == same
    # the last element of the largest parameter (every byte counts, not a prefix)
    big = max(twin.parameters(), key=lambda p: p.numel()).view(-1)
    with torch.no_grad():
        kept = big[-1].clone()
        big[-1] = torch.nextafter(kept, torch.tensor(math.inf))
        assert big[-1] != kept  # 1 ulp up
    assert param_checksum(twin) != same
    with torch.no_grad():
        big[-1] = kept
        assert param_checksum(twin) == same  # restored
        weight = list(twin.parameters())[-2].view(-1)  # the classifier's, 32 x 10
        assert weight[-1] != weight[-2]
        weight[[-2, -1]] = weight[[-1, -2]].clone()  # the same values, elsewhere
    assert param_checksum(twin) != same


def test_the_param_checksum_of_fsdp_shards_is_the_full_models(one_rank_group):
    """Under FSDP2 every parameter is a DTensor shard: the checksum gathers them
    (full_tensor), so it is the unsharded model's. One rank: the gather is local; two ranks'
    shards agree in test_strategies_follow_the_ddp_loss_trajectory[fsdp]."""
    from torch.distributed.tensor import DTensor

    from scalestudy.trainer.models import build_model
    from scalestudy.trainer.parallel import param_checksum, wrap_model

    torch.manual_seed(0)
    net = build_model("resnet18", num_classes=10, width=4, in_channels=3)
    plain = param_checksum(copy.deepcopy(net))
    sharded, _ = wrap_model(net, TrainConfig(strategy="fsdp", width=4), torch.device("cpu"))
    assert all(isinstance(p, DTensor) for p in sharded.parameters())
    assert param_checksum(sharded) == plain


@pytest.mark.parametrize("strategy", ["allreduce", "fsdp"])
def test_strategies_follow_the_ddp_loss_trajectory(ddp_run, data_dir, tmp_path, strategy):
    """fp32: DDP, the flat all-reduce and FSDP compute the same averaged gradient; only the
    summation order differs, so losses agree to 1e-3 relative over two epochs."""
    train(data_dir, tmp_path, "--strategy", strategy)
    ref = [float(r["train_loss"]) for r in read_epochs(ddp_run[0])]
    got = [float(r["train_loss"]) for r in read_epochs(tmp_path)]
    assert got == pytest.approx(ref, rel=1e-3)
    assert len(set(read_metrics(tmp_path)["param_checksums"])) == 1


class _ScriptedBackward(torch.autograd.Function):
    """Identity whose backward advances a fake clock by the next scripted duration of its kind:
    a pass with gradient synchronisation or one under no_sync()."""

    @staticmethod
    def forward(ctx, x, probe):
        ctx.probe = probe
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        probe = ctx.probe
        probe.order.append(probe.sync)
        probe.now += probe.durations[probe.sync].pop(0)
        return grad, None


def test_the_comm_probe_is_one_minus_the_median_ratio_of_unsynchronised_to_synchronised(
    one_rank_group, monkeypatch
):
    """measure.comm_probe on a real 1-rank gloo group, with a clock only the passes advance:
    its passes take known times, so the exposed share is known. A run cannot make it known on a
    shared 2-core machine (2 gloo ranks on CPU expose a few % of a pass, below the noise, and
    the probe clamps at 0), so the arithmetic is checked here.

    Warm-up: one pass of each (1000 s, 500 s, left out). Then 3 with sync: 40, 40, 100 ms
    (median 40) and 3 without: 10, 10, 70 ms (median 10): 1 - 10 / 40 = 0.75. (Means, 60 and
    30 ms, would give 0.5; the warm-ups counted, medians 70 and 40 ms, 0.43; the arms swapped,
    0 after the clamp.) The passes of the two arms alternate."""
    from types import SimpleNamespace

    from scalestudy.trainer import measure

    probe = SimpleNamespace(
        now=0.0,
        sync=True,
        order=[],
        durations={True: [1000.0, 0.040, 0.040, 0.100], False: [500.0, 0.010, 0.010, 0.070]},
    )
    monkeypatch.setattr(measure, "time", SimpleNamespace(perf_counter=lambda: probe.now))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return _ScriptedBackward.apply(self.fc(x), probe)

    @contextlib.contextmanager
    def no_sync():
        probe.sync = False
        try:
            yield
        finally:
            probe.sync = True

    batch = (torch.randn(2, 4), torch.tensor([0, 2]))
    cfg = TrainConfig(loader="dataloader", comm_probe_steps=3)
    got = measure.comm_probe(
        Net(), no_sync, [batch], cfg, torch.device("cpu"), lambda x, y: (x, y),
        contextlib.nullcontext, 1, lambda: None,
    )  # fmt: skip
    assert got == pytest.approx((0.75, 40.0, 10.0), abs=1e-9)  # the share, the medians in ms
    # the warm-ups, then the arms interleaved: a drift over the probe falls on both alike (all
    # of one arm, then the other, put it between them)
    assert probe.order == [True, False, True, False, True, False, True, False]
    assert probe.durations == {True: [], False: []}  # every scripted pass ran


def test_a_ragged_epoch_leaves_its_tail_out_of_the_window(data_dir, tmp_path):
    """1000 images at global batch 64: the 40 of the ragged tail are left out of each epoch, so
    every window step is a full global batch (one input shape: no autotuning, no recompile).
    129 test images in batches of 64 are two batches on rank 0 (65) and one on rank 1 (64):
    FSDP's evaluation hung there (its forward is a collective) until every rank ran as many."""
    train(data_dir, tmp_path, "--strategy", "fsdp", "--limit-train", "1000", "--limit-test", "129")
    m = read_metrics(tmp_path)
    assert round(m["final_val_acc"] * 129, 6).is_integer()  # each test image counted once
    assert m["steps_per_epoch"] == 1000 // 64
    assert m["window_steps"] == 2 * m["steps_per_epoch"] - 2
    assert m["window_images"] == m["window_steps"] * m["global_batch"]
    assert len(set(m["param_checksums"])) == 1


def test_same_seed_same_world_size_same_losses(ddp_run, data_dir, tmp_path):
    train(data_dir, tmp_path, "--strategy", "ddp", "--bucket-cap-mb", "1")
    a, b = read_epochs(ddp_run[0]), read_epochs(tmp_path)
    for key in ("train_loss", "train_acc", "val_loss", "val_acc"):
        assert [r[key] for r in a] == [r[key] for r in b]


def test_synthetic_data_is_learned_far_above_chance(data_dir, tmp_path):
    """One process (no launcher): 10 classes, chance is 10%; five short epochs reach > 60%
    (75.7% measured at width 8, lr 2.0 for a global batch of 512 -> peak 0.125 at 32, label
    smoothing 0.5; val_loss 1.10 at the end, the training loss 1.92 over its floor of 1.68)."""
    smoothing = 0.5
    flags = ("--epochs", "5", "--width", "8", "--lr", "2.0", "--target-acc", "0.3")
    train(data_dir, tmp_path, *flags, "--label-smoothing", str(smoothing), nproc=1)
    m = read_metrics(tmp_path)
    assert m["launcher"] == "none" and m["world_size"] == 1
    assert m["comm_exposed_frac"] == 0.0  # 1 rank: nothing to synchronise, the probe is skipped
    assert m["comm_probe_sync_ms_p50"] is None and m["comm_probe_nosync_ms_p50"] is None
    assert m["peak_lr"] == pytest.approx(2.0 * 32 / 512)
    assert m["best_val_acc"] > 0.6, m["best_val_acc"]
    # time to accuracy: the training time (no evaluation) of the epochs up to the first one
    # that reached --target-acc (train.py)
    rows = read_epochs(tmp_path)
    first = next(i for i, r in enumerate(rows) if float(r["val_acc"]) >= 0.3)
    upto = sum(float(r["epoch_time_s"]) for r in rows[: first + 1])
    assert m["time_to_target_s"] == pytest.approx(upto, rel=1e-5)
    # label smoothing: the training loss is the cross-entropy against targets of 1 - s + s/10 on
    # the label and s/10 on each other class, so it cannot fall below their entropy (1.68 nats at
    # s = 0.5); val_loss is the plain cross-entropy (loop.py), which a net this accurate takes
    # below that floor
    targets = [1 - smoothing + smoothing / 10] + [smoothing / 10] * 9
    floor = -sum(q * math.log(q) for q in targets)
    assert m["label_smoothing"] == smoothing
    assert min(float(r["train_loss"]) for r in rows) >= floor - 1e-6, (floor, rows)
    assert float(rows[-1]["val_loss"]) < floor, (floor, rows[-1])


def test_a_warm_up_longer_than_the_run_is_warned_of_and_its_highest_lr_recorded(data_dir, tmp_path):
    """--warmup-epochs >= --epochs was silent: the LR rose through the whole run, never decayed
    and never reached peak_lr, which metrics.json reported as the run's. Not refused (the tests'
    and the tiny study's 1-epoch runs warm up for 1 epoch): a warning, and lr_max_reached."""
    flags = ("--epochs", "1", "--warmup-epochs", "2", "--limit-train", "256")
    proc = train(data_dir, tmp_path, *flags, nproc=1)  # 8 steps, warm-up 16
    m = read_metrics(tmp_path)
    assert m["peak_lr"] == pytest.approx(0.4 * 32 / 512)
    assert m["lr_max_reached"] == pytest.approx(m["peak_lr"] / 2)
    assert float(read_epochs(tmp_path)[-1]["lr"]) == pytest.approx(m["lr_max_reached"], rel=1e-5)
    warned = [line for line in proc.stderr.splitlines() if "does not decay" in line]
    assert len(warned) == 1 and "--warmup-epochs 2 warms the learning rate up for 16" in warned[0]
    assert "never reaches its peak peak_lr 0.025 (at most 0.0125)" in warned[0]
    # a warm-up exactly as long as the run reaches the peak at its last step, and never decays
    from scalestudy.trainer.loop import lr_max_reached

    assert lr_max_reached(TrainConfig(epochs=1, warmup_epochs=1), 0.4, 8, 8, 1) == 0.4


def test_bf16_runs_on_cpu(data_dir, tmp_path):
    train(
        data_dir,
        tmp_path,
        "--precision",
        "bf16",
        "--epochs",
        "1",
        "--warmup-steps",
        "1",
        "--limit-train",
        "320",
        nproc=1,
    )
    m = read_metrics(tmp_path)
    assert m["precision"] == "bf16"
    assert all(math.isfinite(float(r["train_loss"])) for r in read_epochs(tmp_path))


@pytest.mark.parametrize(
    "flags",
    [
        [
            "--comm-hook",
            "bf16",
            "--accum-steps",
            "2",
            # 480 images a rank: 15 micro-batches of 32, so the epoch's last group is short
            "--limit-train",
            "960",
            "--clip-grad",
            "1.0",
            "--schedule",
            "cosine",
            "--loader",
            "dataloader",
            "--num-workers",
            "0",
        ],
        # the vocabulary's other network (no other test trains it)
        ["--comm-hook", "powersgd", "--global-batch", "64", "--model", "cnn", "--width", "8"],
    ],
)
def test_other_recipes_and_hooks_run_in_sync(data_dir, tmp_path, flags):
    train(data_dir, tmp_path, *flags, "--epochs", "1", "--warmup-steps", "1")
    m = read_metrics(tmp_path)
    assert len(set(m["param_checksums"])) == 1
    assert m["comm_hook"] == flags[1]
    if "--model" in flags:
        assert m["model"] == "cnn" and m["width"] == 8
        # the window waits for PowerSGD's 10 uncompressed steps, not --warmup-steps 1, and
        # metrics.json says so (the report printed the flag as the window's warm-up)
        assert m["warmup_steps"] == 1 and m["window_warmup_steps"] == 10
        assert m["window_steps"] == m["steps_per_epoch"] - 10
        assert m["flops_per_img"] == training_flops_per_image(
            "cnn", num_classes=10, width=8, image_shape=(3, 32, 32)
        )
        assert all(math.isfinite(float(r["train_loss"])) for r in read_epochs(tmp_path))
    if "--accum-steps" in flags:
        assert m["global_batch"] == 32 * 2 * 2  # local x world x accumulated micro-steps
        # 8 optimizer steps (7 groups of 2 and 1 of 1) of 64 images each micro-step: 960
        # images, not steps x global batch = 1024
        assert (m["steps_per_epoch"], m["train_images_per_epoch"]) == (8, 960)
        assert m["loader"] == "dataloader"
        assert m["ddp_static_graph"] is False  # incompatible with no_sync accumulation


def test_srun_environment_starts_a_real_process_group(data_dir, tmp_path):
    """Two processes given only srun's variables (as srun sets them) form a 2-rank job."""
    procs = []
    for rank in range(2):
        env = child_env(
            SLURM_PROCID=str(rank),
            SLURM_NTASKS="2",
            SLURM_LOCALID=str(rank),
            SLURM_NODEID="0",
            SLURM_TASKS_PER_NODE="2",
            SLURM_JOB_ID="4242",
            SLURM_STEP_ID="0",
            SLURM_JOB_NODELIST="localhost",
            MASTER_ADDR="127.0.0.1",
        )
        cmd = [
            PYTHON,
            "-m",
            "scalestudy",
            "train",
            "--dataset",
            "synthetic",
            "--width",
            "4",
            "--epochs",
            "1",
            "--local-batch",
            "64",
            "--warmup-steps",
            "1",
            "--comm-probe-steps",
            "0",
            "--pg-timeout-s",
            "60",
            "--data-dir",
            str(data_dir),
            "--out",
            str(tmp_path),
        ]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    m = read_metrics(tmp_path)
    assert m["launcher"] == "srun" and m["world_size"] == 2
    assert m["slurm_job_id"] == "4242"
    assert m["comm_exposed_frac"] is None  # probe off


def test_missing_data_names_path_and_command(tmp_path):
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "scalestudy",
            "train",
            "--dataset",
            "cifar10",
            "--data-dir",
            str(tmp_path / "nowhere"),
            "--out",
            str(tmp_path / "out"),
        ],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert str(tmp_path / "nowhere") in proc.stderr
    assert "scalestudy prepare-data --dataset cifar10" in proc.stderr
    assert not (tmp_path / "out" / "metrics.json").exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--precision", "fp16"], "--precision fp16 needs CUDA"),
        (["--global-batch", "100"], "does not split over world_size 1 x accum_steps 3"),
        (["--lr", "1e6"], "non-finite training loss"),
        # a GPU study whose job cannot reach CUDA fails, naming the host; never a CPU run
        (["--device", "cuda"], f"torch.cuda.is_available() is False on {socket.gethostname()}"),
        (["--backend", "nccl"], "--backend nccl needs CUDA, but this rank runs on cpu"),
        (["--channels-last", "on"], "--channels-last on needs CUDA"),
        (["--cuda-graphs"], "--cuda-graphs on needs CUDA (none here)"),
        (["--cuda-graphs", "--compile", "off"], "it needs --compile auto or on, not off"),
    ],
)
def test_bad_input_fails_clearly(data_dir, tmp_path, flags, message):
    extra = ["--accum-steps", "3"] if "--global-batch" in flags else []
    proc = train(data_dir, tmp_path, *flags, *extra, nproc=1, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert not (tmp_path / "metrics.json").exists()
    if "--device" in flags or "--backend" in flags:  # refused before training: one line
        assert "Traceback" not in proc.stderr and not (tmp_path / "epochs.csv").exists()


@pytest.mark.parametrize("flags", [["--precision", "fp16"], ["--backend", "nccl"]])
def test_a_flag_this_node_cannot_run_is_one_line_per_node_and_exit_2(data_dir, tmp_path, flags):
    """A flag the node's hardware cannot run (fp16 or NCCL on a CPU) is a bad flag: it was
    caught as a failed start, "cannot start: ..." from every rank and exit 1, though it says
    its local rank 0 alone prints it (TrainingError's scope "node"), as --channels-last on
    does: exit 2, the one line of an expected error."""
    two = train(data_dir, tmp_path / "two", *flags, nproc=2, check=False)
    said = [line for line in two.stderr.splitlines() if "needs CUDA" in line]
    assert len(said) == 1 and "cannot start" not in said[0], two.stderr
    one = train(data_dir, tmp_path / "one", *flags, nproc=1, check=False)
    assert one.returncode == 2, one.stderr
    assert "] scalestudy train: " in one.stderr.strip().splitlines()[-1], one.stderr


PG_TIMEOUT = "--pg-timeout-s must be in [1, 604800] s (a week), got"
BUCKET = "--bucket-cap-mb must be in [0.001, 1000000] MiB (1 KiB to 1 TiB), got"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pg-timeout-s", "1e13"], f"{PG_TIMEOUT} 10000000000000.0"),
        (["--pg-timeout-s", "1e14"], f"{PG_TIMEOUT} 100000000000000.0"),
        (["--pg-timeout-s", "0.0004"], f"{PG_TIMEOUT} 0.0004"),
        (["--pg-timeout-s", "604800"], None),  # None: accepted (the bounds themselves)
        (["--pg-timeout-s", "1"], None),
        (["--bucket-cap-mb", "1e30"], f"{BUCKET} 1e+30"),
        (["--bucket-cap-mb", "0.0001"], f"{BUCKET} 0.0001"),
        (["--bucket-cap-mb", "1000000"], None),
        (["--diag-slow-rank", "0:inf"],
         "--diag-slow-rank must be R:MS with a rank R >= 0 and 0 < MS <= 3600000 milliseconds "
         "(an hour), got '0:inf'"),
        (["--diag-slow-rank", "0:3600000"], None),
        # recipe.warmup_steps: an OverflowError traceback in every training job
        (["--warmup-epochs", "1e308"], "--warmup-epochs must be <= 100000 (train.epochs' "
         "bound), got 1e+308"),
        (["--warmup-epochs", "100000"], None),
        (["--diag-data-delay-ms", "1e300"],
         "--diag-data-delay-ms must be in [0, 3600000] ms (an hour), got 1e+300"),
        (["--diag-data-delay-ms", "3600000"], None),
        # 100000 forked DataLoader workers ran until the job was killed
        (["--num-workers", "65"], "--num-workers must be <= 64 (train.num_workers' bound: "
         "DataLoader processes per rank), got 65"),
        (["--num-workers", "64"], None),
        # str.isdigit() took '²', int() raised a ValueError: a traceback
        (["--profile-steps", "\u00b2:5"],
         "--profile-steps must be A:B with integers 0 <= A < B, got '\u00b2:5'"),
        (["--profile-steps", "0:5"], None),
    ],
)  # fmt: skip
def test_numbers_past_their_bounds_are_refused_in_one_line(argv, message):
    """Each was accepted and failed later: gloo's "Invalid timeout", a timedelta overflow or a
    rendezvous timed out at once (--pg-timeout-s), DDP's TypeError (--bucket-cap-mb),
    time.sleep's OverflowError in the first step (the diagnostic delays). The study schema's
    bounds (config.schema.yaml) hold for the bare command line too."""
    if message is None:
        TrainConfig.from_argv(argv)
        return
    with pytest.raises(TrainConfigError) as info:
        TrainConfig.from_argv(argv)
    assert str(info.value) == message


def test_powersgd_with_fp16_is_refused():
    """One fp16 step whose gradients overflow (GradScaler's own doubling makes one every few
    thousand steps) left inf/NaN in PowerSGD's error feedback: every later step's gradient
    was NaN, GradScaler skipped them all and training froze with a finite loss, no error."""
    with pytest.raises(TrainConfigError, match="--comm-hook powersgd with --precision fp16"):
        TrainConfig.from_argv(["--comm-hook", "powersgd", "--precision", "fp16"])
    TrainConfig.from_argv(["--comm-hook", "powersgd", "--precision", "bf16"])
    TrainConfig.from_argv(["--comm-hook", "fp16", "--precision", "fp16"])


def test_unknown_choice_lists_the_choices(tmp_path):
    proc = subprocess.run(
        [PYTHON, "-m", "scalestudy", "train", "--strategy", "horovod"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "invalid choice: 'horovod'" in proc.stderr and "'allreduce'" in proc.stderr


def test_profile_steps_on_cpu_saves_torch_profiler_output(data_dir, tmp_path):
    train(
        data_dir,
        tmp_path,
        "--profile-steps",
        "3:5",
        "--epochs",
        "1",
        "--warmup-steps",
        "1",
        nproc=1,
    )
    table = (tmp_path / "profile" / "torch_ops_rank0.txt").read_text()
    for phase in ("forward", "backward", "optimizer", "data"):
        assert phase in table
    trace = json.loads((tmp_path / "profile" / "trace_rank0.json").read_text())
    assert any(e.get("name") == "forward" for e in trace["traceEvents"])
    assert os.path.exists(tmp_path / "metrics.json")


def test_the_profilers_export_stays_out_of_the_throughput_window(
    data_dir, tmp_path, monkeypatch, one_rank_group
):
    """--profile-steps: torch.profiler's export (key_averages, the table, the chrome trace: on
    CPU as long as the profiled steps) ran right after step B-1, inside the steady-state window,
    so window_time_s held it (45% of a small run's window) and throughput_img_s halved. Here
    one rank in this process, its export slowed by 1 s: the window holds its steps, not that.
    """
    from scalestudy.trainer import dist as sdist
    from scalestudy.trainer import loop, measure

    slow_s, exported, step_sums = 1.0, [], []
    real_export, real_epoch_end = measure.torch_ops_export, measure.Meter.epoch_end

    def slow_export(averages):
        time.sleep(slow_s)
        exported.append(True)
        return real_export(averages)

    def epoch_end(self, state, seen):
        epoch_time = real_epoch_end(self, state, seen)
        step_sums.append(sum(state.window_step_times))
        return epoch_time

    monkeypatch.setattr(measure, "torch_ops_export", slow_export)
    monkeypatch.setattr(measure.Meter, "epoch_end", epoch_end)
    cfg = TrainConfig(
        dataset="synthetic", data_dir=str(data_dir), width=4, epochs=1, local_batch=32,
        warmup_steps=2, comm_probe_steps=0, limit_train=256, tensorboard=False,
        profile_steps="4:6", out=str(tmp_path),
    )  # fmt: skip
    denv = sdist.DistEnv("none", 0, 1, 0, 1, 0, 1, "127.0.0.1", 0)
    m = loop.train(cfg, denv, torch.device("cpu"))
    assert exported and (tmp_path / "profile" / "torch_ops_rank0.json").exists()
    assert m["window_steps"] == 8 - 2
    # the window is its steps and the loop's bookkeeping between them, far below the export
    assert m["window_time_s"] - step_sums[-1] < slow_s / 2, (m["window_time_s"], step_sums)


def test_the_windows_data_time_holds_the_preparation_of_every_batch_it_trains_on(
    data_dir, tmp_path, monkeypatch, one_rank_group
):
    """The device loader prepares 16 steps' batches in one step's data phase, from each epoch's
    first step: with --warmup-steps 5 those of window steps 5-15 were made at step 0, outside
    the window, whose mean data time lacked them (0.58x on CPU). A group now starts where the
    window opens. Here each group's preparation is slowed by 0.5 s: the window (steps 5-31 of
    two epochs of 16) trains on two groups' batches, 5-15 and 16-31, so it holds 2 x 0.5 s
    (and the real preparation: 0.02 s alone, up to 0.15 s on 2 cores busy with other work)."""
    from scalestudy.trainer import dist as sdist
    from scalestudy.trainer import loop

    slow_s, real = 0.5, loaders.crop_flip

    def slow_crop_flip(*args):
        time.sleep(slow_s)
        return real(*args)

    monkeypatch.setattr(loaders, "crop_flip", slow_crop_flip)
    cfg = TrainConfig(
        dataset="synthetic", data_dir=str(data_dir), width=4, epochs=2, local_batch=32,
        warmup_steps=5, comm_probe_steps=0, limit_train=512, limit_test=64, tensorboard=False,
        out=str(tmp_path),
    )  # fmt: skip
    assert loaders.AHEAD == 16  # one group per epoch of 16 steps, the first split at step 5
    denv = sdist.DistEnv("none", 0, 1, 0, 1, 0, 1, "127.0.0.1", 0)
    m = loop.train(cfg, denv, torch.device("cpu"))
    assert m["window_steps"] == 2 * 16 - 5
    data_s = m["data_time_ms_mean_by_rank"][0] * m["window_steps"] / 1e3
    assert data_s >= 2 * slow_s, m["data_time_ms_mean_by_rank"]
    assert data_s < 3 * slow_s  # not the group of warm-up steps 0-4


@pytest.mark.parametrize("window", ["100:102", "6:20"])
def test_a_profile_window_outside_the_runs_steps_is_refused_in_one_line(data_dir, tmp_path, window):
    """A window past the last of the run's 8 optimizer steps exited 0, profiled nothing and
    recorded the window in metrics.json as profiled; one across it (6:20) profiled 2 steps of
    14. Both silently: now the run is refused before training, naming the flag, its value and
    the run's steps."""
    flags = ("--profile-steps", window, "--limit-train", "128")
    proc = train(data_dir, tmp_path, *flags, nproc=1, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    a, b = map(int, window.split(":"))
    assert proc.stderr.splitlines()[-1].endswith(
        f"scalestudy train: --profile-steps {window} profiles optimizer steps {a} to {b - 1}, but "
        "this run takes 8 (2 epochs x 4: steps 0 to 7): give A:B with B <= 8, or raise --epochs "
        "or use more data"
    ), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "metrics.json").exists() and not (tmp_path / "profile").exists()


def test_a_profile_window_may_end_with_the_runs_last_step():
    from scalestudy.trainer.loop import check_profile_window

    check_profile_window(TrainConfig(profile_steps="6:8", epochs=2), 4, 8)  # steps 6 and 7
    check_profile_window(TrainConfig(epochs=2), 4, 8)  # no window
    with pytest.raises(TrainConfigError, match="--profile-steps 6:9 profiles optimizer steps 6"):
        check_profile_window(TrainConfig(profile_steps="6:9", epochs=2), 4, 8)


# what runs `scalestudy train` in this process, then lists this process's threads by name
_THREADS_AFTER_RUN = """
import gc, json, os, sys
from scalestudy import cli
gc.disable()  # only what reference counting frees counts: no collection may hide a cycle
code = cli.main(sys.argv[1:])
task = f"/proc/{os.getpid()}/task"
print("THREADS", json.dumps([open(f"{task}/{t}/comm").read().strip() for t in os.listdir(task)]))
sys.exit(code)
"""


def test_a_finished_run_frees_its_process_group_before_the_interpreter_exits(data_dir, tmp_path):
    """The run held itself in a reference cycle (Run.step, a partial of train_step over the
    run), so its model, DDP and with them gloo's process group, whose threads go only with it,
    outlived destroy_process_group until a later garbage collection, or the interpreter's
    finalization at exit: C++ teardown while Python is half gone (on a GPU: the device's data
    and graphs held as long). Now `train` returning frees them."""
    argv = ["train", *SMALL, "--epochs", "1", "--limit-train", "192", "--limit-test", "32"]
    argv += ["--data-dir", str(data_dir), "--out", str(tmp_path / "out")]
    proc = subprocess.run(
        [PYTHON, "-c", _THREADS_AFTER_RUN, *argv],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("THREADS ")]
    threads = json.loads(line.removeprefix("THREADS "))
    assert threads, proc.stdout
    assert not [t for t in threads if "gloo" in t], threads


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_non_finite_loss_is_said_once_and_blames_fp16_only_in_fp16(one_rank_group, precision):
    """The loss is all-reduced: every rank raised the same line (scope "rank"), and an fp32 run
    was told to "use bf16/fp32 instead of fp16"."""
    from types import SimpleNamespace

    from scalestudy.errors import TrainingError
    from scalestudy.trainer import loop

    cfg = TrainConfig(precision=precision)
    run = SimpleNamespace(cfg=cfg, device=torch.device("cpu"), recipe=SimpleNamespace(peak_lr=0.4))
    sums = (torch.tensor(float("nan"), dtype=torch.float64), torch.tensor(3), 8)
    with pytest.raises(TrainingError) as caught:
        loop.end_of_epoch(run, SimpleNamespace(), 0, sums, 1.0, 0.4, in_window=False)
    assert caught.value.scope == "run"  # rank 0 alone prints it (log.reports)
    assert str(caught.value).startswith("non-finite training loss (nan) in epoch 1: lower --lr")
    assert ("instead of fp16" in str(caught.value)) is (precision == "fp16"), caught.value


@pytest.mark.parametrize("warmup", ["0", "8"])
def test_a_run_too_short_for_powersgds_warm_up_names_it_not_warmup_steps(
    data_dir, tmp_path, warmup
):
    """--comm-hook powersgd opens the window after its 10 uncompressed steps, whatever
    --warmup-steps says: a run of 8 steps was told to "lower --warmup-steps" (already 0), and
    with --warmup-steps 8 refused before training with the same advice, which cannot help."""
    flags = ("--comm-hook", "powersgd", "--warmup-steps", warmup, "--limit-train", "128")
    proc = train(data_dir, tmp_path, *flags, nproc=1, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (
        "8 optimizer steps left (from step 0) leave no steady-state window after this "
        "segment's warm-up of 10 steps (--comm-hook powersgd's first 10 steps are "
        f"uncompressed; --warmup-steps {warmup} is not the cause" in proc.stderr
    ), proc.stderr[-3000:]
    assert proc.stderr.rstrip().endswith(": raise --epochs or use more data"), proc.stderr[-3000:]
    assert "lower --warmup-steps" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("flags", "graphs", "cause"), [
    ({"warmup_steps": 5}, "off", None),
    ({"warmup_steps": 5, "cuda_graphs": "step"}, "step",
     "(--cuda-graphs step runs 11 eager steps and the capture before the window opens; "
     "--warmup-steps 5 is not the cause"),
    ({"warmup_steps": 2}, "step",
     "(--cuda-graphs auto (here the whole step as one CUDA graph) runs 11 eager steps and the "
     "capture before the window opens; --warmup-steps 2 is not the cause"),
    ({"warmup_steps": 20, "cuda_graphs": "step"}, "step", None),
    # the flag at the mode's own warm-up: lowering it leaves the same warm-up
    ({"warmup_steps": 12, "cuda_graphs": "step"}, "step",
     "(--cuda-graphs step runs 11 eager steps and the capture before the window opens; "
     "--warmup-steps 12 is not the cause"),
    ({"warmup_steps": 10, "comm_hook": "powersgd"}, "off",
     "(--comm-hook powersgd's first 10 steps are uncompressed; --warmup-steps 10 is not the "
     "cause"),
    ({"warmup_steps": 11, "comm_hook": "powersgd"}, "off", None),
])  # fmt: skip
def test_a_segment_too_short_for_its_window_names_what_set_the_warm_up(flags, graphs, cause):
    """The warm-up is the Meter's (a real one): the flag's, or the captured step's 12 steps on
    the GPU path; only where the flag set it does lowering it help."""
    from scalestudy.trainer.loop import no_window_message
    from scalestudy.trainer.measure import Meter

    cfg = TrainConfig(**flags)
    warmup = Meter(cfg, torch.device("cpu"), rank=0, graphs=graphs).warmup_steps
    message = no_window_message(cfg, graphs, 4, warmup - 1, warmup)
    assert message.startswith(
        f"{warmup - 1} optimizer steps left (from step 4) leave no steady-state window after "
        f"this segment's warm-up of {warmup} steps"
    )
    if cause is None:  # the flag's own warm-up
        assert warmup == cfg.warmup_steps
        assert message.endswith(": lower --warmup-steps, raise --epochs or use more data")
    else:
        assert cause in message and "lower --warmup-steps" not in message
        assert message.endswith(": raise --epochs or use more data")


@pytest.mark.parametrize("num_train", ["1024", "512"])
def test_ranks_that_loaded_different_prepared_data_are_refused_before_training(
    data_dir, tmp_path, num_train
):
    """Each rank loads --data-dir itself, and a node-local copy (/tmp, node-local scratch) can
    differ: rank 1 on another seed's set trained and was evaluated on other images, and the
    run ended as usual with rank 0's data_sha256 in metrics.json; on a set of another size the
    ranks' step counts differed and gloo aborted mid-collective (NCCL waits for its timeout).
    One line before training now, naming both ranks' data."""
    other = tmp_path / "other"
    subprocess.run(
        [PYTHON, "-m", "scalestudy", "prepare-data", "--dataset", "synthetic", "--data-dir",
         str(other), "--num-train", num_train, "--num-test", "300", "--seed", "1"],
        check=True, env=child_env(), capture_output=True, timeout=300,
    )  # fmt: skip
    # rank 1 reads the other copy (the last --data-dir wins)
    prefix = f'sh -c \'[ "$LOCAL_RANK" = 1 ] && set -- "$@" --data-dir {other}; exec "$@"\' sh'
    proc = subprocess.run(
        [PYTHON, "-m", "scalestudy", "launch", "--ranks-per-node", "2", "--rank-prefix", prefix]
        + ["--", *SMALL, "--device", "cpu", "--data-dir", str(data_dir)]
        + ["--out", str(tmp_path / "run")],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and not (tmp_path / "run" / "metrics.json").exists()
    said = [ln for ln in proc.stderr.splitlines() if "different prepared data" in ln]
    assert len(said) == 1 and "rank 1" in said[0] and str(other) in said[0], proc.stderr[-3000:]
    assert "epoch   1/" not in proc.stderr  # refused before training


SLOW_ITER = """
import sys, time
import torch.utils.data as data
start = data.DataLoader.__iter__
def slow(self):  # a loader whose workers take 0.4 s to start, each epoch
    time.sleep(0.4)
    return start(self)
data.DataLoader.__iter__ = slow
from scalestudy.cli import main
sys.exit(main(["train", *sys.argv[1:]]))
"""


def test_a_dataloaders_start_each_epoch_is_timed_as_the_first_steps_data(data_dir, tmp_path):
    """--loader dataloader --no-persistent-workers starts its workers at each epoch's iter(),
    which ran before the epoch's clock: 0.4 s per epoch of input pipeline left epoch_time_s,
    throughput and data_time_frac as they were (the device loader's set-up is timed: its
    iterator starts at the first batch). Timed now as the first step's data phase."""
    script = tmp_path / "slow_iter.py"
    script.write_text(SLOW_ITER)
    out = tmp_path / "run"
    cmd = [PYTHON, str(script), *SMALL, "--epochs", "3", "--limit-train", "256"]
    cmd += ["--loader", "dataloader", "--num-workers", "0", "--warmup-steps", "1"]
    cmd += ["--data-dir", str(data_dir), "--out", str(out)]
    done = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    m = read_metrics(out)
    assert m["epoch_time_s"] >= 0.4, m["epoch_time_s"]
    # the window (epochs 2 and 3 from their first step) holds two of the 0.4 s starts
    assert m["window_time_s"] >= 0.8 and m["data_time_frac"] * m["window_time_s"] >= 0.8, m
