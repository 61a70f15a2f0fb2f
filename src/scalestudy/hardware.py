"""Published dense peak FLOP/s of GPUs per precision: the denominator of MFU, defined once.

    mfu = throughput_img_s x flops_per_img / (peak_flops x gpus)

(train.py defines flops_per_img: the FLOPs of one training image, forward + backward, counted by
torch.utils.flop_counter on the run's network; gpus, metrics.json's mfu_gpus, the distinct
physical GPUs the ranks ran on: world_size, unless ranks shared a GPU over gloo.) MFU is only
as good as its denominator, so:
- every figure is NVIDIA's own, from the datasheet named in its row, at the boost clock;
- the figure is the DENSE one. Datasheets quote tensor-core rates "with sparsity" (2:4
  structured sparsity doubles them, marked *); ResNet-18 training is dense, so the table holds
  the dense figure (the datasheet's dense column where it prints one, else its sparse figure / 2);
- "fp32" is IEEE fp32 on the CUDA cores (the study's fp32: numerics.py switches TF32 off), "tf32"
  the TF32 tensor cores, "bf16"/"fp16" the tensor cores with fp32 accumulation;
- a precision the GPU has no hardware for (TF32 or BF16 on V100 and T4) has no entry, a GPU that
  is not in the table has none, a MIG slice has none (its share of the peak is not published),
  nor has a vGPU profile (a virtual machine's share of a GPU, time-sliced or MIG-backed, named
  for the GPU: "GRID A100-4-20C"), and a CPU has none: their runs get mfu null with the
  reason, never a borrowed or guessed peak.
No torch here: the study and the results read this too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TFLOPS = 1e12


@dataclass(frozen=True)
class GpuPeaks:
    model: str  # the GPU model as the datasheet names it
    pattern: str  # regex searched in the CUDA device name (torch.cuda.get_device_name)
    tflops: dict[str, float]  # precision -> dense peak, TFLOP/s
    source: str  # the datasheet


# First match wins: the specific names (NVL, GH200, V100S) come before the general ones.
GPU_PEAKS: tuple[GpuPeaks, ...] = (
    GpuPeaks(
        "H100 NVL", r"\bH100 NVL\b",
        {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
        "NVIDIA H100 Tensor Core GPU datasheet, H100 NVL column (TF32 835*, BF16/FP16 1,671*)",
    ),
    GpuPeaks(
        "H100 PCIe", r"\bH100 PCIe\b",
        {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5},
        "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe column (TF32 756*, BF16/FP16 1,513*)",
    ),
    GpuPeaks(
        # "NVIDIA H100 80GB HBM3" is how the SXM5 board names itself
        "H100 SXM", r"\bH100\b.*\b(SXM|HBM3)",
        {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},
        "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column (TF32 989*, BF16/FP16 1,979*)",
    ),
    GpuPeaks(
        "GH200", r"\bGH200\b",
        {"fp32": 67.0, "tf32": 494.0, "bf16": 990.0, "fp16": 990.0},
        "NVIDIA GH200 Grace Hopper Superchip datasheet (TF32 494, BF16/FP16 990 dense)",
    ),
    GpuPeaks(
        "H200 NVL", r"\bH200 NVL\b",
        {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
        "NVIDIA H200 Tensor Core GPU datasheet, H200 NVL column (TF32 835*, BF16/FP16 1,671*)",
    ),
    GpuPeaks(
        # the SXM board names itself "NVIDIA H200" (the NVL board says NVL, matched above)
        "H200 SXM", r"\bH200\b",
        {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},
        "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column (TF32 989*, BF16/FP16 1,979*)",
    ),
    GpuPeaks(
        # SXM4 and PCIe, 40 and 80 GB: the same peaks
        "A100", r"\bA100\b",
        {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
        "NVIDIA A100 Tensor Core GPU datasheet (TF32 156, BF16/FP16 312 dense)",
    ),
    GpuPeaks(
        "A30", r"\bA30\b",
        {"fp32": 10.3, "tf32": 82.0, "bf16": 165.0, "fp16": 165.0},
        "NVIDIA A30 Tensor Core GPU datasheet (TF32 82, BF16/FP16 165 dense)",
    ),
    GpuPeaks(
        "A40", r"\bA40\b",
        {"fp32": 37.4, "tf32": 74.8, "bf16": 149.7, "fp16": 149.7},
        "NVIDIA A40 datasheet (TF32 74.8, BF16/FP16 149.7 dense)",
    ),
    GpuPeaks(
        "A10", r"\bA10\b",
        {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
        "NVIDIA A10 Tensor Core GPU datasheet (TF32 62.5, BF16/FP16 125 dense)",
    ),
    GpuPeaks(
        "L40S", r"\bL40S\b",
        {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05},
        "NVIDIA L40S datasheet (TF32 183, BF16/FP16 362.05 dense)",
    ),
    GpuPeaks(
        "L40", r"\bL40\b",
        {"fp32": 90.5, "tf32": 90.5, "bf16": 181.05, "fp16": 181.05},
        "NVIDIA L40 datasheet (TF32 90.5, BF16/FP16 181.05 dense)",
    ),
    GpuPeaks(
        "L4", r"\bL4\b",
        {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0},
        "NVIDIA L4 Tensor Core GPU datasheet (TF32 120*, BF16/FP16 242*)",
    ),
    GpuPeaks(
        # Volta: no TF32 and no BF16 units
        "V100S PCIe", r"\bV100S\b",
        {"fp32": 16.4, "fp16": 130.0},
        "NVIDIA V100 Tensor Core GPU datasheet, V100S PCIe column",
    ),
    GpuPeaks(
        # SXM2 only: the datasheet has no column for the SXM3 boards of the DGX-2/-2H
        # ("Tesla V100-SXM3-32GB[-H]"): not in the table, never a borrowed figure
        "V100 SXM2", r"\bV100-SXM2\b",
        {"fp32": 15.7, "fp16": 125.0},
        "NVIDIA V100 Tensor Core GPU datasheet, V100 SXM2 column",
    ),
    GpuPeaks(
        "V100 PCIe", r"\bV100-PCIE\b",
        {"fp32": 14.0, "fp16": 112.0},
        "NVIDIA V100 Tensor Core GPU datasheet, V100 PCIe column",
    ),
    GpuPeaks(
        # Turing: FP16 tensor cores with fp32 accumulation ("mixed precision"), no TF32/BF16
        "T4", r"\bT4\b",
        {"fp32": 8.1, "fp16": 65.0},
        "NVIDIA T4 Tensor Core GPU datasheet (mixed precision FP16/FP32 65)",
    ),
)  # fmt: skip


# An NVIDIA vGPU names itself by its profile: the GPU's model, then its frame buffer in GB and
# series letter, time-sliced with the other VMs on the GPU (A100-4C, T4-1Q), or, MIG-backed, the
# slices and the GB (A100-4-20C, A30-1-6C), a MIG-backed one with an attribute after the series
# (A100-1-5CME: "1g.5gb+me"; NOME, MEALL, GFX: NVIDIA/vgpu-device-manager's vgpu_type.go): the
# model alone would match the whole GPU's row
VGPU_PROFILE = r"-(\d+-)?\d+[ABCQ](ME|NOME|MEALL|GFX)?$"


@dataclass(frozen=True)
class Peak:
    """The peak of one device at one precision, or why there is none."""

    flops: float | None  # FLOP/s of one device; None: not known (see `why`)
    source: str | None  # the datasheet and column, when known
    why: str | None = None  # why there is no peak (None when there is)


def _family(row: GpuPeaks) -> str:
    """A table row's GPU family: its model's first word, lower case ("H100 NVL" -> h100)."""
    return row.model.split()[0].lower()


# The GPU families of the table, longest first (V100S before V100, L40S before L40)
GPU_FAMILIES = tuple(sorted({_family(row) for row in GPU_PEAKS}, key=lambda f: (-len(f), f)))


def gpu_family(name: str) -> str | None:
    """The table's GPU family a CUDA device name or a Slurm typed GRES name (hardware.gpu_type:
    h100, a100_80g, nvidia_a100_sxm4_80gb) is of: the family standing as a whole word of the
    name, letters and digits bounded by anything else, any case ("NVIDIA H100 80GB HBM3" ->
    h100). None where no family does: an unlisted GPU (B200), a cousin (A10G is not an A10),
    a name run together (h100nvl)."""
    low = name.lower()
    for family in GPU_FAMILIES:
        if re.search(rf"(?<![a-z0-9]){family}(?![a-z0-9])", low):
            return family
    return None


def family_precisions(name: str) -> set[str]:
    """The precisions the GPUs of the family a name is of (gpu_family) have units for, by the
    table (any row of the family: V100 SXM2, PCIe); empty where the name is of no family."""
    family = gpu_family(name)
    return {p for row in GPU_PEAKS if _family(row) == family for p in row.tflops}


def gpu_peaks(device_name: str) -> GpuPeaks | None:
    """The table row of a CUDA device name (torch.cuda.get_device_name), or None."""
    for row in GPU_PEAKS:
        if re.search(row.pattern, device_name):
            return row
    return None


def peak(device_type: str, device_name: str | None, precision: str) -> Peak:
    """The dense peak FLOP/s of one device of this name at this precision (module docstring)."""
    if device_type != "cuda":
        return Peak(None, None, f"{device_type}: no published peak FLOP/s in the table")
    name = device_name or "unnamed GPU"
    if "MIG" in name:
        return Peak(None, None, f"{name}: a MIG slice, whose share of the peak is not published")
    if re.search(VGPU_PROFILE, name.strip()):
        return Peak(None, None, f"{name}: a vGPU profile, whose share of the peak is not published")
    row = gpu_peaks(name)
    if row is None:
        return Peak(None, None, f"{name}: not in the table of published peaks (hardware.py)")
    if precision not in row.tflops:
        return Peak(None, None, f"{row.model} has no {precision} units (hardware.py)")
    return Peak(row.tflops[precision] * TFLOPS, f"{row.source}: {precision} dense")


def mfu(throughput_img_s: float, flops_per_img: float, peak_flops: float, gpus: int) -> float:
    """Model FLOPs utilisation: the FLOP rate the network needs at the measured throughput over
    the peak of the `gpus` devices that produced it (the distinct GPUs: ranks sharing one count
    it once)."""
    return throughput_img_s * flops_per_img / (peak_flops * gpus)


# where the CPU's model is read (tests point it elsewhere)
CPUINFO = Path("/proc/cpuinfo")


def cpu_model(lscpu: Callable[[], str]) -> str:
    """The CPU's model: /proc/cpuinfo's "model name", else lscpu's "Model name" (`lscpu()`, its
    output, asked for only then: an aarch64 cpuinfo, e.g. a Grace CPU's, has no such line), else
    "" (never platform.processor(), `uname -p`: the architecture). The inventory and the
    trainer's device name (metrics.json) both read it so; a byte that is not UTF-8 (a vendor's
    (R) in Latin-1) becomes U+FFFD, not a UnicodeDecodeError."""
    try:
        cpuinfo = CPUINFO.read_text(errors="replace")
    except OSError:
        cpuinfo = ""
    return field(cpuinfo, "model name") or field(lscpu(), "Model name")


def field(text: str, key: str) -> str:
    """The value of the first `key: value` line of `text` (indentation and the spaces before the
    colon ignored: cpuinfo's "model name\t:", lscpu's "  Model name:   "), else ""."""
    for line in text.splitlines():
        name, colon, value = line.partition(":")
        if colon and name.strip() == key:
            return value.strip()
    return ""
