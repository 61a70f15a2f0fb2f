"""The table of published peaks (hardware.py): device names as CUDA reports them -> the right
row, the dense figure, and no peak where none is published."""

from __future__ import annotations

import re

import pytest

from scalestudy import hardware, vocab

TF = hardware.TFLOPS


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),  # how the SXM5 board names itself
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A30", "A30"),
        ("NVIDIA A40", "A40"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L4", "L4"),
        ("Tesla V100-SXM2-32GB", "V100 SXM2"),
        ("Tesla V100-PCIE-16GB", "V100 PCIe"),
        ("Tesla V100S-PCIE-32GB", "V100S PCIe"),
        ("Tesla T4", "T4"),
    ],
)
def test_device_names_find_their_row(name, model):
    row = hardware.gpu_peaks(name)
    assert row is not None and row.model == model


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA H100",
        "NVIDIA A10G",
        "NVIDIA GeForce RTX 4090",
        "NVIDIA B200",
        "Tesla V100-SXM3-32GB",  # DGX-2
        "Tesla V100-SXM3-32GB-H",  # DGX-2H
        "",
    ],
)
def test_names_not_in_the_table_have_no_row(name):
    """An H100 that does not say its form factor, a cousin (A10G), an unlisted GPU, a board the
    datasheet has no column for (V100 SXM3: never the SXM2 column's figure): no row."""
    assert hardware.gpu_peaks(name) is None
    got = hardware.peak("cuda", name, "bf16")
    assert got.flops is None and got.source is None
    assert "not in the table" in got.why


def test_dense_figures_are_half_the_sparse_datasheet_figures():
    """The table holds dense rates: H100 SXM's datasheet prints 1,979 TFLOP/s bf16 *with
    sparsity*; MFU of dense training is measured against 989.5."""
    h100 = hardware.peak("cuda", "NVIDIA H100 80GB HBM3", "bf16")
    assert h100.flops == 989.5 * TF
    assert "H100 SXM" in h100.source and "bf16 dense" in h100.source
    assert hardware.peak("cuda", "NVIDIA H100 80GB HBM3", "fp32").flops == 67.0 * TF
    a100 = hardware.peak("cuda", "NVIDIA A100-SXM4-80GB", "tf32")
    assert a100.flops == 156.0 * TF


def test_every_row_is_sane():
    for row in hardware.GPU_PEAKS:
        assert set(row.tflops) <= set(vocab.PRECISIONS), row.model
        assert "fp32" in row.tflops and "datasheet" in row.source
        re.compile(row.pattern)
        for precision, value in row.tflops.items():
            # tensor cores at 16 bits are never slower than the fp32 CUDA cores
            assert value >= row.tflops["fp32"], (row.model, precision)


@pytest.mark.parametrize(
    ("name", "precision", "needle"),
    [
        ("Tesla V100-SXM2-32GB", "bf16", "V100 SXM2 has no bf16 units"),
        ("Tesla T4", "tf32", "T4 has no tf32 units"),
        ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "bf16", "MIG slice"),
    ],
)
def test_no_peak_where_none_is_published(name, precision, needle):
    got = hardware.peak("cuda", name, precision)
    assert got.flops is None and needle in got.why


@pytest.mark.parametrize(
    "name",
    [
        "GRID A100-4C",  # 4 GB of an A100 40GB, time-sliced with the other VMs
        "GRID A100-4-20C",  # MIG-backed: 4 of the 7 slices, 20 GB
        "NVIDIA A30-1-6C",  # MIG-backed: 1 of 4 slices
        "GRID T4-1Q",  # 1/16 of a T4
        "NVIDIA L4-6Q",
        "NVIDIA L40S-48C",  # the whole frame buffer, yet time-sliced: no published share
        "GRID V100S-8Q",
        # MIG-backed with an attribute after the series letter (+me: the media engines): the
        # whole GPU's peak (an H200 NVL slice the H200 SXM's, its name saying no NVL)
        "NVIDIA A100-1-5CME",
        "NVIDIA A30-1-6CME",
        "NVIDIA H200-1-18CME",
        "NVIDIA A100-1-5CNOME",
        "NVIDIA A100-7-40CMEALL",
    ],
)
def test_a_vgpu_profile_has_no_peak(name):
    """An NVIDIA vGPU (a virtual machine's share of a GPU) names itself by its profile, which
    carries the GPU's model: "GRID A100-4-20C", a MIG slice whose name says no MIG, got the
    whole A100's 312 TFLOP/s, a T4-1Q the whole T4's, and MFU came out up to 16x too low."""
    got = hardware.peak("cuda", name, "fp16")
    assert got.flops is None and got.source is None
    assert f"{name}: a vGPU profile" in got.why


def test_a_cpu_has_no_peak():
    got = hardware.peak("cpu", "AMD EPYC", "fp32")
    assert got.flops is None and got.why.startswith("cpu:")


def test_mfu_formula():
    # 60,000 img/s x 3.329 GFLOP on one H100 at 989.5 TFLOP/s: ~20% (the target)
    value = hardware.mfu(60_000, 3.329e9, 989.5e12, 1)
    assert value == pytest.approx(60_000 * 3.329e9 / 989.5e12)
    assert 0.2 < value < 0.21
    # the peak scales with the devices: the same per-device rate on 8 GPUs is the same MFU
    assert hardware.mfu(8 * 60_000, 3.329e9, 989.5e12, 8) == pytest.approx(value)


@pytest.mark.parametrize(
    ("name", "family"),
    [
        # CUDA device names
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100", "h100"),  # no row of peaks, still an H100
        ("NVIDIA H100 NVL", "h100"),
        ("NVIDIA GH200 480GB", "gh200"),  # not an H200
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("Tesla V100S-PCIE-32GB", "v100s"),
        ("Tesla V100-SXM3-32GB", "v100"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        # Slurm's typed GRES names (hardware.gpu_type): by hand, or NVML's autodetected ones
        ("h100", "h100"),
        ("a100_80g", "a100"),
        ("nvidia_a100-sxm4-80gb", "a100"),
        ("A100", "a100"),
        # not a family of the table, or not one word of the name: not judged
        ("NVIDIA A10G", None),  # not an A10
        ("NVIDIA B200", None),
        ("h100nvl", None),
        ("gpu", None),
        ("", None),
    ],
)
def test_gpu_family_names_the_table_model_a_name_or_gres_type_is_of(name, family):
    """hardware.gpu_family: the model (first word of a table row's, lower case) standing as a
    word of the name, the longest first (V100S before V100), for the planner to tell an H100
    run from an A100 study (hardware.gpu_type); None where the name says none."""
    assert hardware.gpu_family(name) == family
