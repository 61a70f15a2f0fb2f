"""The arithmetic of a run (trainer/numerics.py): what is set, what is recorded, and FSDP with
channels_last (FSDP2 refuses non-contiguous parameters)."""

from __future__ import annotations

import pytest
import torch

from scalestudy import vocab
from scalestudy.errors import TrainingError
from scalestudy.trainer import numerics
from scalestudy.trainer.config import TrainConfig
from scalestudy.trainer.models import build_model
from scalestudy.trainer.parallel import wrap_model

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize(
    "precision, fp32, amp",
    [("fp32", "ieee", None), ("tf32", "tf32", None), ("bf16", "ieee", "bfloat16")],
)
def test_the_fp32_precision_in_effect_is_recorded(precision, fp32, amp):
    # the switches are process-wide; CUDA's are settable (and readable) without a GPU
    num = numerics.configure(TrainConfig(precision=precision), CPU)
    got = numerics.in_effect(num)
    assert got["matmul_fp32_precision"] == got["cudnn_fp32_precision"] == fp32
    assert got["autocast_dtype"] == amp
    assert torch.backends.cuda.matmul.fp32_precision == fp32  # set, not only reported


def test_fp32_switches_tf32_off_whatever_was_set_before():
    """cuDNN convolutions default to TF32 in torch: "fp32" must say IEEE explicitly."""
    torch.backends.cudnn.conv.fp32_precision = "tf32"
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    got = numerics.in_effect(numerics.configure(TrainConfig(precision="fp32"), CPU))
    assert got["cudnn_fp32_precision"] == got["matmul_fp32_precision"] == "ieee"
    assert numerics._resolved("none", "tf32", "none") == "tf32"  # torch's inheritance
    assert numerics._resolved("none", "none") == "ieee"


def test_fsdp_keeps_nchw_weights_under_channels_last():
    """On CUDA with channels_last, DDP gets NHWC weights and FSDP NCHW weights (with NHWC
    inputs). The configure() decision is checked for a CUDA device (no GPU needed to decide)."""
    ddp = numerics.configure(TrainConfig(strategy="ddp", channels_last="on"), CUDA)
    fsdp = numerics.configure(TrainConfig(strategy="fsdp", channels_last="on"), CUDA)
    assert ddp.channels_last_inputs and ddp.channels_last_weights
    assert fsdp.channels_last_inputs and not fsdp.channels_last_weights
    auto = numerics.configure(TrainConfig(strategy="fsdp"), CUDA)
    assert auto.channels_last_inputs and not auto.channels_last_weights


def test_fully_shard_accepts_the_fsdp_layout_and_refuses_nhwc_weights(one_rank_group):
    """The real fully_shard on a 1-rank gloo group: the layout configure() picks for FSDP is
    accepted and runs forward on NHWC inputs; NHWC weights (the old behaviour) are refused."""
    cfg = TrainConfig(strategy="fsdp", width=4)
    model = build_model("resnet18", num_classes=10, width=4, in_channels=3)
    wrapped, _ = wrap_model(model, cfg, CPU)
    x = torch.randn(4, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    assert torch.isfinite(wrapped(x)).all()
    nhwc = build_model("resnet18", num_classes=10, width=4, in_channels=3)
    nhwc = nhwc.to(memory_format=torch.channels_last)
    with pytest.raises(NotImplementedError, match="non-contiguous"):
        wrap_model(nhwc, cfg, CPU)


def test_channels_last_on_cpu_is_refused_with_the_reason():
    with pytest.raises(TrainingError, match="--channels-last on needs CUDA.*auto or off"):
        numerics.configure(TrainConfig(channels_last="on"), CPU)
    assert not numerics.configure(TrainConfig(channels_last="auto"), CPU).channels_last_inputs


@pytest.mark.parametrize("precision", vocab.PRECISIONS)
def test_the_grad_scaler_is_on_for_fp16_only(precision):
    """fp16's gradients underflow without loss scaling; bf16 has fp32's exponent range and
    needs none (a scaler there adds a host sync per step and skipped steps for nothing), fp32
    and tf32 neither. Nothing else shows which: metrics.json records no scaler, and a CPU bf16
    run's losses are finite either way. The optimizer is the fused kernel on CUDA only."""
    from scalestudy.trainer.recipe import build_recipe

    model = torch.nn.Linear(4, 2)
    recipe = build_recipe(model, TrainConfig(precision=precision), CPU, 32, 10, 100)
    assert recipe.scaler.is_enabled() == (precision == "fp16")
    assert recipe.optimizer.defaults["fused"] in (None, False)
    # on CUDA the fused kernel (no host sync per step under fp16's scaler), not under FSDP2
    # (torch has no DTensor rule for it): the rule alone, which needs no GPU
    from scalestudy.trainer.recipe import fused_sgd

    cuda = torch.device("cuda", 0)
    assert fused_sgd(TrainConfig(precision=precision), cuda)
    assert not fused_sgd(TrainConfig(precision=precision, strategy="fsdp"), cuda)
    assert not fused_sgd(TrainConfig(precision=precision), CPU)
