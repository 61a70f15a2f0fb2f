"""FLOPs per training image (models.training_flops_per_image) against an independent count, and
metrics.json's MFU block (measure.efficiency) for the devices the table knows and does not."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from scalestudy import hardware
from scalestudy.trainer import measure
from scalestudy.trainer.config import TrainConfig
from scalestudy.trainer.dist import free_port
from scalestudy.trainer.measure import efficiency
from scalestudy.trainer.models import build_model, training_flops_per_image


def hand_count(name: str, width: int, shape: tuple[int, int, int]) -> tuple[int, int]:
    """(forward FLOPs, training FLOPs) of one image from the layers' shapes, by the textbook
    rule: a convolution costs 2 x C_out x C_in/groups x k_h x k_w x H_out x W_out, a linear
    layer 2 x in x out; backward computes the input gradient (not for the first layer, whose
    input is the data) and the weight gradient, each as costly as the forward."""
    model = build_model(name, num_classes=10, width=width, in_channels=shape[0])
    costs: list[int] = []

    def hook(module, inputs, output):
        if isinstance(module, nn.Conv2d):
            k_h, k_w = module.kernel_size
            per_out = module.in_channels // module.groups * k_h * k_w
            costs.append(2 * per_out * output.numel())  # batch of 1: numel = C x H x W
        else:
            costs.append(2 * module.in_features * module.out_features)

    for module in model.modules():
        if isinstance(module, nn.Conv2d | nn.Linear):
            module.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.zeros(1, *shape))
    forward = sum(costs)
    return forward, 3 * forward - costs[0]  # costs[0]: the first layer, no input gradient


@pytest.mark.parametrize(
    ("name", "width", "shape"),
    [("resnet18", 64, (3, 32, 32)), ("resnet18", 8, (3, 32, 32)), ("cnn", 32, (1, 28, 28))],
)
def test_counted_flops_match_the_layer_arithmetic(name, width, shape):
    _, training = hand_count(name, width, shape)
    assert training_flops_per_image(name, num_classes=10, width=width, image_shape=shape) == (
        training
    )


def test_cifar_resnet18_is_the_published_workload():
    """555.4 M multiply-adds per 32x32 image forward (shared/notes/performance-anchors.md):
    1.111 GFLOP forward, 3.329 GFLOP to train on it."""
    forward, _ = hand_count("resnet18", 64, (3, 32, 32))
    assert forward == pytest.approx(2 * 555.4e6, rel=1e-3)
    counted = training_flops_per_image(
        "resnet18", num_classes=10, width=64, image_shape=(3, 32, 32)
    )
    assert counted == pytest.approx(3.329e9, rel=1e-3)


@pytest.mark.parametrize("width", [64, 8])
def test_the_network_is_torchvisions_resnet18_block_for_block(monkeypatch, width):
    """models.BasicBlock is written out (importing torchvision costs the trainer 2.7 s): the same
    seed gives bit-equal weights and outputs to the network built from torchvision's own
    BasicBlock, and at width 64 the state_dict is torchvision's resnet18's, stem aside."""
    import torchvision
    from torchvision.models.resnet import BasicBlock as TorchvisionBlock

    from scalestudy.trainer import models

    def build(block):
        monkeypatch.setattr(models, "BasicBlock", block)
        torch.manual_seed(0)
        return models.resnet18(num_classes=10, width=width)

    ours, theirs = build(models.BasicBlock), build(TorchvisionBlock)
    assert isinstance(theirs.layer1[0], TorchvisionBlock)  # the patch took
    assert not isinstance(ours.layer1[0], TorchvisionBlock)
    mine, reference = ours.state_dict(), theirs.state_dict()
    assert list(mine) == list(reference)
    assert all(torch.equal(mine[k], reference[k]) for k in mine)
    x = torch.randn(4, 3, 32, 32)
    outputs = []
    for model in (ours, theirs):
        y = model(x)
        y.square().sum().backward()
        outputs.append((y, [p.grad for p in model.parameters()]))
    (y1, g1), (y2, g2) = outputs
    assert torch.equal(y1, y2) and all(torch.equal(a, b) for a, b in zip(g1, g2, strict=True))
    if width == 64:
        tv = torchvision.models.resnet18(num_classes=10).state_dict()
        assert {k: v.shape for k, v in tv.items() if k != "conv1.weight"} == {
            k: v.shape for k, v in mine.items() if k != "conv1.weight"
        }
        assert (tv["conv1.weight"].shape, mine["conv1.weight"].shape) == (
            (64, 3, 7, 7),
            (64, 3, 3, 3),  # the CIFAR stem
        )


def test_mfu_on_a_known_gpu():
    m = efficiency(60_000.0, 3_329_000_000, "cuda", ["NVIDIA H100 80GB HBM3"], "bf16", 1)
    assert m["peak_flops"] == 989.5e12
    assert m["mfu"] == pytest.approx(60_000 * 3.329e9 / 989.5e12)
    assert m["model_flops_per_s"] == pytest.approx(60_000 * 3.329e9)
    assert "H100 SXM" in m["peak_flops_source"] and m["mfu_unmeasured"] is None
    # two ranks: the peak of two devices
    two = efficiency(120_000.0, 3_329_000_000, "cuda", ["NVIDIA H100 80GB HBM3"], "bf16", 2)
    assert two["mfu"] == pytest.approx(m["mfu"])


def _gpus_entry(rank, world, port, gpus, out, results):
    """One gloo rank whose device is the stand-in GPU gpus[rank] (a CUDA UUID; None: a CPU)."""
    os.environ.update(LOCAL_RANK=str(rank), SLURMD_NODENAME="node1")
    measure.gpu_identity = lambda device: gpus[rank]  # no GPU here: its UUID stands in
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    meter = measure.Meter(TrainConfig(out=out), torch.device("cpu"), rank)
    results[rank] = meter.reduce_gpus(world)
    dist.destroy_process_group()


@pytest.mark.parametrize(
    ("gpus", "counted"),
    [(["GPU-same", "GPU-same"], 1), (["GPU-a", "GPU-b"], 2), ([None, None], None)],
    ids=["two-ranks-one-gpu", "two-ranks-two-gpus", "cpu"],
)
def test_mfu_divides_by_the_gpus_the_ranks_ran_on(tmp_path, gpus, counted):
    """2 real gloo ranks: ranks sharing one GPU (--backend gloo, one visible GPU) count it
    once, as the energy counter does, so the shared GPU's MFU is what one rank on it alone
    would get at the same img/s, not half of it (world_size peaks)."""
    results = mp.Manager().dict()
    mp.spawn(_gpus_entry, args=(2, free_port(), gpus, str(tmp_path), results), nprocs=2)
    assert results[0] == results[1] == {"mfu_gpus": counted}
    if counted is None:
        return
    name, flops = "NVIDIA H100 80GB HBM3", 3_328_997_376
    m = efficiency(60_000.0, flops, "cuda", [name], "bf16", results[0]["mfu_gpus"])
    assert m["mfu"] == pytest.approx(60_000.0 * flops / (counted * 989.5e12))
    alone = efficiency(60_000.0, flops, "cuda", [name], "bf16", 1)
    assert (m["mfu"] == pytest.approx(alone["mfu"])) is (counted == 1)


@pytest.mark.parametrize(
    ("device_type", "names", "precision", "why"),
    [
        ("cpu", ["AMD EPYC"], "fp32", "cpu: no published peak"),
        ("cuda", ["NVIDIA GeForce RTX 4090"], "bf16", "not in the table"),
        ("cuda", ["Tesla T4"], "bf16", "T4 has no bf16 units"),
        (
            "cuda",
            ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"],
            "bf16",
            "(NVIDIA A100-SXM4-80GB 312 TFLOP/s; NVIDIA H100 80GB HBM3 989.5 TFLOP/s at bf16)",
        ),
        ("cuda", ["NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090"], "bf16", "not in the table"),
    ],
)
def test_no_mfu_without_a_published_peak(device_type, names, precision, why):
    m = efficiency(1000.0, 10, device_type, names, precision, len(names))
    assert m["mfu"] is None and m["peak_flops"] is None and why in m["mfu_unmeasured"]
    assert m["model_flops_per_s"] == 10_000.0  # the FLOP rate is measured all the same


@pytest.mark.parametrize(
    ("names", "precision", "models"),
    [
        (["NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB"], "bf16", {"A100"}),
        (["NVIDIA H100 80GB HBM3", "NVIDIA H200"], "bf16", {"H100 SXM", "H200 SXM"}),
    ],
)
def test_ranks_on_devices_of_one_peak_have_an_mfu(names, precision, models):
    """Names that differ but whose table figure is the same (A100 40 and 80 GB: one row; the
    H100 and H200 SXM datasheets: the same bf16 figure) share that peak: an MFU, not null."""
    rows = [hardware.gpu_peaks(name) for name in names]
    assert {row.model for row in rows} == models
    assert len({row.tflops[precision] for row in rows}) == 1  # the premise: one figure
    mixed = efficiency(40_000.0, 3_329_000_000, "cuda", names, precision, 8)
    first = efficiency(40_000.0, 3_329_000_000, "cuda", names[:1], precision, 8)
    assert mixed["mfu_unmeasured"] is None and mixed["mfu"] == pytest.approx(first["mfu"])
    assert mixed["peak_flops"] == rows[0].tflops[precision] * hardware.TFLOPS
    assert all(row.source in mixed["peak_flops_source"] for row in rows)


def test_peak_table_is_what_efficiency_uses():
    row = hardware.gpu_peaks("NVIDIA A100-SXM4-80GB")
    m = efficiency(1.0, 1, "cuda", ["NVIDIA A100-SXM4-80GB"], "tf32", 1)
    assert m["peak_flops"] == row.tflops["tf32"] * hardware.TFLOPS
