"""The arithmetic of a run: autocast dtype, fp32 matmul/convolution precision, memory format and
cuDNN autotuning, set in one place and recorded as they were in effect (metrics.json).

- fp32 means IEEE fp32 everywhere and tf32 means TF32 for matmuls and convolutions, so the
  precision family compares the two cleanly. cuDNN convolutions default to TF32 in torch
  (`torch.backends.cudnn.conv.fp32_precision` is "tf32" out of the box; its parents
  `torch.backends.cudnn.fp32_precision` and `torch.backends.fp32_precision` are "none"), so
  "fp32" must switch it off explicitly. Set through the `fp32_precision` API (torch >= 2.9);
  the older `allow_tf32` flags are deprecated, and mixing the two APIs makes torch raise when
  the setting is read.
- bf16/fp16 run under autocast; their fp32 leftovers (BN statistics, the loss) follow the fp32
  setting above, i.e. IEEE.
- channels_last (NHWC) is the fast layout for convolutions on tensor cores. FSDP2's
  `fully_shard` refuses non-contiguous parameters ("FSDP does not support non-contiguous
  parameters yet", torch 2.14), so under FSDP only the inputs are NHWC and the weights stay
  NCHW: a convolution with an NHWC input still runs in NHWC (torch picks channels_last when the
  input or the weight is channels_last) at the price of reordering the weight each call.
  NHWC is refused on the CPU, where torch's convolution backward crashes with it.
- cudnn.benchmark autotunes each new input shape once, which is why the throughput window never
  contains a new shape (loaders.epoch_batches drops the ragged tail).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scalestudy.errors import TrainingError
from scalestudy.trainer.config import TrainConfig

AMP_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Numerics:
    amp_dtype: torch.dtype | None  # autocast's dtype; None: no autocast
    channels_last_inputs: bool  # batches are NHWC
    channels_last_weights: bool  # convolution weights are NHWC (never under FSDP)

    @property
    def input_dtype(self) -> torch.dtype:
        """The dtype of the batches the model gets: autocast's (the loader rounds once, as the
        first convolution would), else float32."""
        return self.amp_dtype or torch.float32


def configure(cfg: TrainConfig, device: torch.device) -> Numerics:
    """Set the process-wide switches for this run; returns what the model and batches use."""
    cuda = device.type == "cuda"
    fp32 = "tf32" if cfg.precision == "tf32" else "ieee"
    torch.backends.cuda.matmul.fp32_precision = fp32
    torch.backends.cudnn.conv.fp32_precision = fp32
    torch.backends.cudnn.benchmark = cuda
    if cfg.channels_last == "on" and not cuda:
        raise TrainingError(
            "--channels-last on needs CUDA: NHWC training crashes torch's CPU convolution "
            "backward (SIGSEGV / 'double free or corruption', reproduced with torch 2.14.1 on "
            "x86 with DDP and FSDP); use --channels-last auto or off on CPU",
            scope="node",  # the node's device: its local rank 0 says it
        )
    channels_last = cfg.channels_last == "on" or (cfg.channels_last == "auto" and cuda)
    return Numerics(
        amp_dtype=AMP_DTYPES.get(cfg.precision),
        channels_last_inputs=channels_last,
        channels_last_weights=channels_last and cfg.strategy != "fsdp",
    )


def in_effect(numerics: Numerics) -> dict:
    """The settings as torch reports them now, for metrics.json (read back, not assumed)."""
    return {
        "matmul_fp32_precision": _resolved(
            torch.backends.cuda.matmul.fp32_precision, torch.backends.fp32_precision
        ),
        "cudnn_fp32_precision": _resolved(
            torch.backends.cudnn.conv.fp32_precision,
            torch.backends.cudnn.fp32_precision,
            torch.backends.fp32_precision,
        ),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "autocast_dtype": str(numerics.amp_dtype).removeprefix("torch.")
        if numerics.amp_dtype
        else None,
        "channels_last_inputs": numerics.channels_last_inputs,
        "channels_last_weights": numerics.channels_last_weights,
    }


def _resolved(*chain: str) -> str:
    """torch's inheritance of fp32_precision: the first value that is not "none"; IEEE if all
    are "none" (the documented default of the generic setting)."""
    return next((value for value in chain if value != "none"), "ieee")
