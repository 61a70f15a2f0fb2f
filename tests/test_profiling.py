"""Profiling: parsers on fixtures in the tools' real formats (tests/fixtures/nsight, hand-built from
the recorded formats: no GPU was available), the kernel classifier on real kernel names, the exact
nsys/ncu commands a cluster runs, the run selection and config checks, a real torch.profiler
capture of a 2-rank gloo run, the nsys path through the nsys stand-in (tests/stand-ins/nsys), and
the DAG of the GPU study via Snakemake's dry-run.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import logging
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import PYTHON
from workflow_helpers import (
    STAND_INS,
    child_env,
    copy_repo,
    fsync_fails_at_file,
    planned_jobs,
    running,
    snakemake,
    write_config,
)

from scalestudy import cli, log
from scalestudy.errors import ProfileError, ProfileFormatError
from scalestudy.jobs import container, container_exec, gpu_check_report, launch, ncu_kernels
from scalestudy.jobs import profile as capture
from scalestudy.jobs import profile_ncu as ncu_job
from scalestudy.jobs import profile_parse as parse_job
from scalestudy.nsight import ncu, nsys, projection, schema, tables, torch_ops
from scalestudy.nsight.classify import classify
from scalestudy.study import profiling as study_profiling
from scalestudy.study.config import StudyConfigError, load_and_validate
from scalestudy.study.runs import build_run_table, trainer_args

FIX = Path(__file__).parent / "fixtures" / "nsight"
REPO = Path(__file__).resolve().parents[1]


# --- classifier on real kernel / op names -----
@pytest.mark.parametrize(
    "name, category",
    [
        (
            "sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x32",
            "conv",
        ),
        (
            "sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64",
            "conv",
        ),
        (
            "sm90_xmma_wgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize64x128x64",
            "conv",
        ),
        (
            "void cutlass_cudnn_train::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized>"
            "(T1::Params)",
            "conv",
        ),
        (
            "void cudnn::cnn::reduce_wgrad_nchw_helper<float, float>(int, int, float *, float *)",
            "conv",
        ),
        (
            "void cudnn::ops::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, false, true>",
            "conv",
        ),
        (
            "void cudnn::bn_fw_tr_1C11_kernel_NCHW<__nv_bfloat16, float, int, 512, true, 1, true>",
            "batchnorm",
        ),
        (
            "void cudnn::bn_bw_1C11_kernel_new<__nv_bfloat16, float, float2, 512, true, 1, true>",
            "batchnorm",
        ),
        (
            "void at::native::batch_norm_collect_statistics_kernel<float, float, float, int>",
            "batchnorm",
        ),
        ("ampere_sgemm_128x64_tn", "gemm"),
        ("ampere_fp16_s1688gemm_fp16_64x128_sliced1x2_ldg8_f2f_tn", "gemm"),
        ("cutlass_80_tensorop_f16_s16816gemm_relu_f16_64x64_64x4_nn_align8", "gemm"),
        ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN", "gemm"),
        ("void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false>", "gemm"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
            "elementwise",
        ),
        (
            "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>",
            "elementwise",
        ),
        (
            "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<AddFunctor>>",
            "elementwise",
        ),
        (
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, MeanOps<float>>>",
            "reduce",
        ),
        ("void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>", "reduce"),
        (
            "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float>",
            "reduce",
        ),
        (
            "void (anonymous namespace)::softmax_warp_forward<float, float, float, 4, true>",
            "reduce",
        ),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel"
            "<TensorListMetadata<2>>",
            "optimizer",
        ),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096>)", "nccl"),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "nccl"),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "nccl"),  # "reduce" must not win
        ("[CUDA memcpy Host-to-Device]", "memcpy"),
        ("[CUDA memcpy HtoD]", "memcpy"),
        ("[CUDA memset]", "memcpy"),
        # torch.profiler op names (CPU fallback)
        ("aten::mkldnn_convolution", "conv"),
        ("aten::convolution_backward", "conv"),
        ("aten::native_batch_norm", "batchnorm"),
        ("aten::addmm", "gemm"),
        ("aten::threshold_backward", "elementwise"),
        ("aten::add_", "elementwise"),
        ("aten::_foreach_add_", "optimizer"),
        ("Optimizer.step#SGD.step", "optimizer"),
        ("c10d::allreduce_", "nccl"),
        ("gloo:all_reduce", "nccl"),
        ("aten::empty", "other"),
        # cuDNN's direct / explicit-GEMM convolutions and their GEMM helpers: conv, not gemm
        (
            "void cudnn::detail::wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, true, 512>(int, int, "
            "int, float const*, int, float*, float const*, kernel_grad_params, int, float, int, "
            "int, int, int)",
            "conv",
        ),
        ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>", "conv"),
        (
            "void explicit_convolve_sgemm<float, int, 128, 6, 7, 3, 3, 5, 0, false>(int, int, int, "
            "float const*, int, float const*, int, float*, kernel_conv_params, unsigned long long, "
            "int, unsigned long long, int, float, float, int, float const*, float const*)",
            "conv",
        ),
        (
            "void cudnn::gemm::computeOffsetsKernel<false, false>"
            "(cudnn::gemm::ComputeOffsetsParams)",
            "conv",
        ),
        # DDP bookkeeping is neither a collective nor a reduction
        ("torch.distributed.ddp.reducer::copy_bucket_to_grad", "other"),
        ("torch.distributed.ddp.reducer::search_unused_parameters", "other"),
        ("torch::distributed::reducer::mul_out", "other"),
        ("aten::clamp_min_", "elementwise"),  # ReLU on the CPU
        ("aten::clamp_min", "elementwise"),
        # an op and its GPU kernel in one category (real names: cpu-compiled/, gpu-h200/): the
        # CPU op was elementwise, its kernel "other"
        (
            "void at::native::(anonymous namespace)::CatArrayBatchedCopy_alignedK_contig<at::"
            "native::(anonymous namespace)::OpaqueType<8u>, unsigned int, 1, 128, 1, 16>(at::"
            "native::(anonymous namespace)::OpaqueType<8u>*, int, unsigned int)",
            "elementwise",
        ),
        (
            "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, "
            "long, long, long, bool)",
            "elementwise",
        ),
        ("aten::masked_fill", "elementwise"),
        ("aten::bitwise_not", "elementwise"),
        (
            "void at::native::(anonymous namespace)::adaptive_average_gradient<float>(float *, "
            "const float *, int, int, int, int)",
            "reduce",
        ),
        ("void at::native::(anonymous namespace)::adaptive_average_pool<float>", "reduce"),
        ("aten::_adaptive_avg_pool2d_backward", "reduce"),
        # torch.compile's kernels (inductor's names: kind, then the aten ops it fused)
        ("triton_poi_fused_add_relu_threshold_backward_12", "elementwise"),
        ("triton_poi_fused__native_batch_norm_legit_functional_relu_3", "batchnorm"),
        ("triton_red_fused_native_batch_norm_backward_threshold_backward_7", "batchnorm"),
        ("triton_per_fused_mean_view_21", "reduce"),
        ("triton_red_fused_sum_4", "reduce"),
        ("triton_tem_fused_addmm_0", "gemm"),
        ("triton_poi_fused_convolution_backward_5", "conv"),
        ("cpp_fused_add_relu_1", "elementwise"),
        # a CPU's compiled graph: its call (the fused kernels' time), and the kernels' names
        # under torch._inductor.config.cpp.enable_kernel_profile (torch 2.14, a small CNN)
        (
            "## Call CompiledFxGraph fdaoup6hr56abgm2jbuxjnwdqx4wvaokkuf47vaowhd474learm2 ##",
            "compiled",
        ),
        (
            "graph_0_cpp_fused_convolution_backward_native_batch_norm_backward_threshold_backward_1",
            "batchnorm",
        ),
        ("graph_0_cpp_fused__native_batch_norm_legit_functional_copy__relu_1", "batchnorm"),
        ("graph_0_cpp_fused_add_copy__0", "elementwise"),
        # a pointwise kernel fusing a batch norm's backward with convolution_backward's
        # pointwise tail (H200, compiled bf16): no convolution in it
        (
            "triton_poi_fused__native_batch_norm_legit_functional_convolution_backward_native_"
            "batch_norm_backward_threshold_backward_13",
            "batchnorm",
        ),
        # cuDNN's bundled CUTLASS (H200, eager bf16): a dgrad, the split-K step of a conv
        (
            "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816dgrad_optimized_bf16_"
            "256x64_32x4_nhwc_align8>(T1::Params)",
            "conv",
        ),
        (
            "void cutlass__5x_cudnn::Kernel<cutlass__5x_cudnn::reduction::kernel::ReduceSplitK<"
            "cutlass__5x_cudnn::MatrixShape<4, 256>, cutlass__5x_cudnn::epilogue::thread::"
            "LinearCombination<float, 4, float, float>, cutlass__5x_cudnn::reduction::thread::"
            "ReduceAdd<float, float, 4>>>(cutlass__5x_cudnn::reduction::kernel::ReduceSplitK<"
            "cutlass__5x_cudnn::MatrixShape<4, 256>>::Params)",
            "conv",
        ),
        # cuDNN's padding of NHWC inputs; "reduced_divisor" in its parameters is no reduction
        (
            "void nhwcAddPaddingKernel<__nv_bfloat16, __nv_bfloat16, float, true, "
            "(cudnnKernelDataType_t)0>(int, int, int, int, int, int, int, int, __nv_bfloat16 "
            "const*, __nv_bfloat16*, int, int, cudnn::reduced_divisor, int)",
            "conv",
        ),
        ("void my_kernel<float>(float*, cudnn::reduced_divisor, int)", "other"),
        ("void (anonymous namespace)::softmax_warp_forward<float>(float*, int)", "reduce"),
        # cuDNN 7/8's half-precision and tensor-core convolutions (Volta, Turing; the
        # single-precision volta_scudnn_ was conv already)
        ("volta_h884cudnn_256x128_ldg8_relu_exp_small_nhwc_tn_v1", "conv"),
        ("volta_fp16_s884cudnn_fp16_128x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1", "conv"),
        ("turing_fp16_s1688cudnn_fp16_128x128_ldg8_relu_f2f_exp_medium_nhwc_gelu_tn_v1", "conv"),
        ("volta_hcudnn_128x128_relu_interior_nn_v1", "conv"),
        ("volta_scudnn_128x64_relu_interior_nn_v1", "conv"),
        # cuDNN 8's CUTLASS weight- and data-gradient convolutions (TF32) and its implicit-GEMM
        # offset helper (cask_cudnn: the cuDNN 9 twin is cask__5x_cudnn)
        (
            "void cutlass::Kernel<cutlass_tensorop_s1688wgrad_analytic_tf32_64x64_16x10>"
            "(cutlass_tensorop_s1688wgrad_analytic_tf32_64x64_16x10::Params)",
            "conv",
        ),
        (
            "void cutlass::Kernel<cutlass_tensorop_s1688dgrad_optimized_tf32_64x64_16x10_nhwc_"
            "align4>(cutlass_tensorop_s1688dgrad_optimized_tf32_64x64_16x10_nhwc_align4::Params)",
            "conv",
        ),
        (
            "void cask_cudnn::computeOffsetsKernel<false, false>(cask_cudnn::ComputeOffsetsParams)",
            "conv",
        ),
        # ... and what those patterns must leave alone: cuDNN's batch norm, a CUTLASS GEMM
        ("aten::cudnn_batch_norm", "batchnorm"),
        ("aten::cudnn_batch_norm_backward", "batchnorm"),
        ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>", "gemm"),
        # FSDP2's record_function ranges (a real 2-rank CPU capture, torch 2.14): the
        # gradients' reduce-scatter and its wait are communication, not a reduction; the copies
        # into and out of the collectives' buffers are copies, not collectives
        ("FSDP::post_backward_reduce (layer1.0)", "nccl"),
        ("FSDP::post_backward_reduce", "nccl"),
        ("FSDP::post_backward_rs_wait (layer1.0)", "nccl"),
        ("FSDP::all_gather (layer1.0)", "nccl"),
        ("c10d::_reduce_scatter_base_", "nccl"),
        ("fsdp::all_gather_copy_in", "memcpy"),
        ("FSDP::all_gather_copy_out (layer1.0)", "memcpy"),
        ("FSDP::all_gather_copy_out", "memcpy"),
        ("fsdp::split_with_sizes_copy", "memcpy"),
        ("fsdp::chunk_cat", "memcpy"),
        # and their CUDA kernels (names from PyTorch's TensorShape.cu and ForeachUnaryOp.cu, in
        # no capture here yet): the gradients' copy into the reduce-scatter buffer was "other",
        # the all-gather's copy out too, its copy in (_foreach_copy_) "optimizer"
        (
            "void at::native::detail::chunk_cat_cuda_kernel<float, c10::BFloat16>(T2 **, T1 *, "
            "long *, long *, long *, long *, long, long)",
            "memcpy",
        ),
        (
            "void at::native::(anonymous namespace)::split_with_sizes_copy_out_contiguous_no_cast"
            "_kernel(char **, char **, long *, long *, long *, long *, long *, long *, long *)",
            "memcpy",
        ),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
            "(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::"
            "UnaryOpFunctor<float, 2, 1, 1>, at::native::Copy<float, float> >(T1, T2, T3...)",
            "memcpy",
        ),
        (  # the optimizer's own multi-tensor kernels stay its
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
            "(anonymous namespace)::TensorListMetadata<3>, at::native::(anonymous namespace)::"
            "FusedSgdMathFunctor<float, 3>, double, float *, bool>(T1, T2, T3...)",
            "optimizer",
        ),
        ("FSDP::post_backward_accumulate (layer1.0)", "other"),  # FSDP's bookkeeping
        ("FSDP::pre_forward (layer1.0)", "other"),
    ],
)
def test_classifier_on_real_names(name, category):
    assert classify(name) == category


@pytest.mark.parametrize(
    "name",
    [
        # NCCL's kernels as Itanium symbols (nsys `cuda_gpu_kern_sum:mangled`, or a name the
        # profiler could not demangle: jobs/profile.ncu_name_base expects them), mangled by hand
        # from NCCL 2.19+'s ncclDevKernel_*(ncclDevKernelArgsStorage<4096ul>) and older NCCL's
        # ncclKernel_*(ncclWorkElem); the prefix is the name's length
        "_Z43ncclDevKernel_ReduceScatter_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE",
        "_Z31ncclDevKernel_Broadcast_RING_LL24ncclDevKernelArgsStorageILm4096EE",
        "_Z21ncclDevKernel_Generic24ncclDevKernelArgsStorageILm4096EE",
        "_Z39ncclKernel_Broadcast_RING_LL_Sum_int8_t12ncclWorkElem",
        # older NCCL's nccl<Collective><Algo><Proto>Kernel_<op>_<type>(ncclColl), which
        # neither rule held mangled (a system NCCL preloaded under an older torch)
        "_Z32ncclBroadcastRingLLKernel_copy_i8P8ncclColl",
        "_Z29ncclReduceRingLLKernel_sum_f32P8ncclColl",
        "_Z37ncclReduceScatterRingLLKernel_sum_f32P8ncclColl",
    ],
)
def test_a_mangled_nccl_kernel_is_nccl_and_never_a_top_kernel(name):
    """The NCCL rule was anchored (^nccl): mangled, these were reduce or other, and top_kernels
    handed them to ncu, which serialises launches (a profiled NCCL kernel waits for its peers
    forever)."""
    assert classify(name) == "nccl"
    conv = "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64"
    rows = [
        {"kernel": name, "category": classify(name), "total_ns": 9e6},
        {"kernel": conv, "category": classify(conv), "total_ns": 3e6},
    ]
    assert schema.top_kernels(rows, 2) == [conv]


@pytest.mark.parametrize(
    "text, value, unit",
    [
        ("1,234.5", 1234.5, ""),
        ("150,336", 150336.0, ""),
        ("12.3 ms", 12.3, "ms"),
        ("45 %", 45.0, "%"),
        ("2,619,000,000", 2.619e9, ""),
        ("1e3", 1000.0, ""),
        ("0.5", 0.5, ""),
    ],
)
def test_numbers_with_separators_and_units(text, value, unit):
    assert tables.parse_number(text) == (pytest.approx(value), unit)
    with pytest.raises(ValueError):
        tables.parse_number("n/a")


@pytest.mark.parametrize(
    "text",
    ["1.234.567", "1,23", "1,234,56", "1.2.3", "12 3", "7,5 %", "0,125 ms", "-0,250", "00,500"],
)
def test_other_locales_numbers_are_not_read_as_a_number_and_a_unit(text):
    # a thousands dot, a decimal comma: the leftover was taken for the unit, the value kept
    with pytest.raises(ValueError, match="not a number"):
        tables.parse_number(text)


# --- nsys stats -----
def test_nsys_new_report_names_two_ranks():
    kernels, ranges = nsys.parse_nsys(FIX / "nsys-2024.5", "w2_run")
    assert {r["rank"] for r in kernels} == {0, 1}
    rank0 = [r for r in kernels if r["rank"] == 0]
    assert sum(r["share"] for r in rank0) == pytest.approx(1.0)
    by_cat: dict[str, int] = {}
    for r in rank0:
        by_cat[r["category"]] = by_cat.get(r["category"], 0) + r["total_ns"]
    assert by_cat == {
        "conv": 65_000_000,
        "batchnorm": 18_000_000,
        "nccl": 7_000_000,
        "elementwise": 5_000_000,
        "reduce": 2_500_000,
        "gemm": 1_500_000,
        "optimizer": 1_000_000,
        "memcpy": 500_000,  # from cuda_gpu_mem_time_sum
    }
    # quoted names with commas survive whole
    assert any(
        r["kernel"].startswith("void cudnn::bn_fw_tr_1C11_kernel_NCHW<__nv_bfloat16, float")
        for r in rank0
    )
    rank1_nccl = [r for r in kernels if r["rank"] == 1 and r["category"] == "nccl"]
    assert rank1_nccl[0]["total_ns"] == 9_000_000
    r0 = {r["range"]: r for r in ranges if r["rank"] == 0}
    assert set(r0) == {"data", "forward", "backward", "optimizer"}  # NCCL:ncclAllReduce is no phase
    # no SQLite export here: nvtx_gpu_proj_sum's Total Proj Time (the launches of the range's
    # own thread), not nvtx_sum's host 55 ms, and labelled so
    assert r0["backward"]["total_ns"] == 62_000_000 and r0["backward"]["instances"] == 10
    assert {r["time_base"] for r in ranges} == {"gpu_projection_same_thread"}
    assert sum(r["share"] for r in r0.values()) == pytest.approx(1.0)
    assert {r["rank"]: r["total_ns"] for r in ranges if r["range"] == "backward"} == {
        0: 62_000_000,
        1: 64_000_000,
    }
    assert all(r["tool"] == "nsys" for r in kernels + ranges)


def test_nsys_phases_without_the_gpu_projection_are_host_ranges(tmp_path):
    """A capture without an export or nvtx_gpu_proj_sum (older nsys, older capture) still
    parses; its phase times are nvtx_sum's host times and say so, rank by rank."""
    for f in (FIX / "nsys-2024.5").glob("*.csv"):
        if f.name != "nsys_rank1_nvtx_gpu_proj_sum.csv":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    _, ranges = nsys.parse_nsys(tmp_path, "mixed")
    bases = {(r["rank"], r["time_base"]) for r in ranges}
    assert bases == {(0, "gpu_projection_same_thread"), (1, "host_range")}
    r1 = {r["range"]: r for r in ranges if r["rank"] == 1}
    assert r1["backward"]["total_ns"] == 55_000_000  # nvtx_sum's push-to-pop time
    assert sum(r["share"] for r in r1.values()) == pytest.approx(1.0)


def test_nsys_gpu_projection_header_is_recognised():
    header = (FIX / "nsys-2024.5" / "nsys_rank0_nvtx_gpu_proj_sum.csv").read_text()
    header = header.splitlines()[2].split(",")
    assert nsys.nsys_table_kind(header) == "proj"
    assert "Total Range Time (ns)" in header and "Total GPU Ops" in header
    assert nsys.nsys_table_kind([h for h in header if h != "Range Instances"]) is None


def test_nsys_old_report_names_and_grid_columns():
    kernels, ranges = nsys.parse_nsys(FIX / "nsys-2022.4", "old")
    cats = {r["kernel"][:20]: r["category"] for r in kernels}
    assert list(cats.values()).count("memcpy") == 1
    assert {r["category"] for r in kernels} == {"conv", "gemm", "nccl", "elementwise", "memcpy"}
    assert {r["range"] for r in ranges} == {"forward", "backward"}
    assert {r["time_base"] for r in ranges} == {"host_range"}  # no nvtx_gpu_proj_sum there


def test_nsys_2021_memory_summary_counts_operations():
    """nsys 2021.x's gpumemtimesum (the report the capture asks an nsys before 2023.1 for)
    names its count column Operations: the whole parse failed with "no nsys stats header
    found". Fixture nsys-2021-handmade: HAND-MADE from that documented header, not a capture."""
    stats = FIX / "nsys-2021-handmade"
    mem = stats / "nsys_rank0_gpumemtimesum.csv"
    header = mem.read_text().splitlines()[0].split(",")
    assert "Operations" in header and "Count" not in header and "Instances" not in header
    assert nsys.nsys_table_kind(header) == "mem"
    with mem.open(newline="") as f:
        want = {
            r["Operation"]: (int(r["Operations"]), float(r["Total Time (ns)"]))
            for r in csv.DictReader(f)
        }
    kernels, ranges = nsys.parse_nsys(stats, "r2021")
    got = {
        r["kernel"]: (r["instances"], r["total_ns"]) for r in kernels if r["category"] == "memcpy"
    }
    assert got == want and len(kernels) == len(want) + 3 and ranges == []


def test_nsys_timeunit_ms_and_domain_prefix(tmp_path):
    kernels, ranges = nsys.parse_nsys(FIX / "nsys-2025.1-ms", "ms")
    assert kernels[0]["total_ns"] == 12_500_000 and kernels[0]["category"] == "conv"
    assert kernels[1]["total_ns"] == 4_166_667
    # "Total Proj Time (ms)" of nvtx_gpu_proj_sum
    assert {r["range"]: r["total_ns"] for r in ranges} == {
        "forward": 6_000_000,
        "backward": 10_250_000,
    }
    for name in ("stats_cuda_gpu_kern_sum.csv", "stats_nvtx_sum.csv"):
        (tmp_path / name).write_bytes((FIX / "nsys-2025.1-ms" / name).read_bytes())
    _, host = nsys.parse_nsys(tmp_path, "ms")
    assert {r["range"]: (r["total_ns"], r["time_base"]) for r in host} == {
        "forward": (15_000_000, "host_range"),
        "backward": (25_000_000, "host_range"),
    }


EXPORT_SQL = FIX / "nsys-export" / "nsys_rank0.sql"


def write_export(path: Path, sql: str | None = None) -> Path:
    """A HAND-MADE stand-in of an nsys SQLite export at path, from SQL text (by default the
    fixture tests/fixtures/nsight/nsys-export/nsys_rank0.sql; no nsys runs here)."""
    with sqlite3.connect(path) as con:
        con.executescript(EXPORT_SQL.read_text() if sql is None else sql)
    con.close()
    return path


# the fixture export's phases, (instances, ns): its header says two steps; the backward's
# kernels come from autograd's thread, the NCCL domain's range is no phase, the step-2
# optimizer is named by text
EXPORT_PHASES = {
    "data": (2, 20_000),
    "forward": (2, 360_000),
    "backward": (2, 876_000),
    "optimizer": (2, 40_000),
}


def phases_of(db: Path) -> dict[str, tuple[int, float]]:
    return {p["name"]: (p["instances"], p["total_ns"]) for p in nsys.export_phases(db)}


def test_the_export_projects_every_threads_launches(tmp_path):
    assert phases_of(write_export(tmp_path / "nsys_rank0.sqlite")) == EXPORT_PHASES
    # beside the stats CSVs: rank 0's phases from its export, rank 1 (none) from
    # nvtx_gpu_proj_sum, each labelled with what it measures
    for f in (FIX / "nsys-2024.5").glob("*.csv"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    _, ranges = nsys.parse_nsys(tmp_path, "mixed")
    bases = {(r["rank"], r["time_base"]) for r in ranges}
    assert bases == {(0, "gpu_projection"), (1, "gpu_projection_same_thread")}
    r0 = {r["range"]: r["total_ns"] for r in ranges if r["rank"] == 0}
    assert r0 == {name: ns for name, (_, ns) in EXPORT_PHASES.items()}


def test_a_second_sqlite_export_of_one_rank_is_refused_not_taken_for_it(tmp_path):
    """nsys stats writes <report>.sqlite beside each report: report1.sqlite and report2.sqlite
    (no rank in either name) were both rank 0's, the one sorting last taken without a word, as
    was a copy nsys_rank0-old.sqlite; the stats CSVs of a rank refuse a second table."""
    for f in (FIX / "nsys-2024.5").glob("*.csv"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    write_export(tmp_path / "report1.sqlite")
    write_export(tmp_path / "report2.sqlite")
    with pytest.raises(ProfileFormatError, match=r"rank 0 has a second SQLite export, the first "
                       r"being .*report1\.sqlite"):  # fmt: skip
        nsys.parse_nsys(tmp_path, "r")
    (tmp_path / "report2.sqlite").unlink()
    write_export(tmp_path / "nsys_rank7.sqlite")  # a rank with no kernel summary here
    with pytest.raises(ProfileFormatError, match=r"rank 7's export, and no kernel summary of rank"):
        nsys.parse_nsys(tmp_path, "r")
    (tmp_path / "nsys_rank7.sqlite").unlink()
    _, ranges = nsys.parse_nsys(tmp_path, "r")  # one export, rank 0 (no rank named: as a CSV)
    assert {r["time_base"] for r in ranges if r["rank"] == 0} == {"gpu_projection"}


def test_operations_and_launches_without_a_correlation_id_join_nothing(tmp_path):
    """correlationId may be NULL in the export (a column without NOT NULL): every such launch
    and every such GPU operation were one key, (process, None), so a NULL launch in each phase
    gave each phase every NULL operation's time, a 400 us kernel counted in all four. They
    join nothing: no launch names them."""
    sql = EXPORT_SQL.read_text() + (
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES "
        "(1000500000, 1000900000, 0, 1, 7, NULL, 71168950272, 20, 20);\n"
        + "".join(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES "
            f"({t}, {t + 100}, 1, 71168954514, NULL, 11, 0, NULL);\n"
            for t in (1000001000, 1000061000, 1000211000, 1000411000)  # one in each phase
        )
    )
    assert phases_of(write_export(tmp_path / "nulls.sqlite", sql)) == EXPORT_PHASES


def test_an_old_export_and_exports_without_what_is_projected(tmp_path):
    sql = EXPORT_SQL.read_text()
    # no textId (names in `text` only) and no globalPid in the GPU tables: still projected
    old = sql.replace("textId INTEGER REFERENCES StringIds (id), ", "").replace(
        "globalPid INTEGER, ", ""
    )
    old_lines = []
    for line in old.splitlines():
        if line.startswith("INSERT INTO NVTX_EVENTS"):
            # drop the textId value (second to last), naming the range by text instead
            head, values = line.split("VALUES (", 1)
            cells = values.rstrip(");").split(", ")
            names = {"1": "'data'", "2": "'forward'", "3": "'backward'", "4": "'optimizer'"}
            if cells[9] in names:
                cells[6] = names[cells[9]]
            line = f"{head}VALUES ({', '.join(cells[:9] + cells[10:])});"
        elif line.startswith("INSERT INTO CUPTI_ACTIVITY_KIND_") and "RUNTIME" not in line:
            head, values = line.split("VALUES (", 1)
            cells = values.rstrip(");").split(", ")
            line = f"{head}VALUES ({', '.join(cells[:6] + cells[7:])});"
        old_lines.append(line)
    db = write_export(tmp_path / "old.sqlite", "\n".join(old_lines))
    assert {p["name"]: p["total_ns"] for p in nsys.export_phases(db)}["backward"] == 876_000
    # no NVTX, or no GPU operation: nothing to project (the parser falls back)
    bare = write_export(
        tmp_path / "bare.sqlite",
        sql.split("INSERT")[0].replace("CREATE TABLE NVTX_EVENTS", "CREATE TABLE OTHER"),
    )
    assert nsys.export_phases(bare) == []
    idle = "\n".join(
        ln
        for ln in sql.splitlines()
        if "KIND_KERNEL VALUES" not in ln
        and "KIND_MEMCPY VALUES" not in ln
        and "KIND_MEMSET VALUES" not in ln
    )
    assert nsys.export_phases(write_export(tmp_path / "idle.sqlite", idle)) == []
    # phase ranges of two processes in one report: refused, by name
    two = sql + (
        "INSERT INTO NVTX_EVENTS VALUES (1000000000, 1000000100, 59, NULL, NULL, NULL, "
        f"'forward', {(77 << 24) | 77}, NULL, NULL, 0);\n"
    )
    with pytest.raises(ProfileFormatError, match=r"two\.sqlite: phase ranges of 2 processes"):
        nsys.export_phases(write_export(tmp_path / "two.sqlite", two))
    # a GPU operation or a phase that ends before it starts: a negative time in the phase's sum
    for row, bad, table in [
        ("(1000080000, 1000150000, 0, 1, 7, 2,", "(1000080000, 1000070000, 0, 1, 7, 2,", "KERNEL"),
        ("(1000000000, 1000050000, 59,", "(1000000000, 'late', 59,", "NVTX_EVENTS (data)"),
    ]:
        assert row in sql
        db = write_export(tmp_path / f"{table[:6]}.sqlite", sql.replace(row, bad, 1))
        with pytest.raises(ProfileFormatError, match=rf"{re.escape(table)}: a row from 1000"):
            nsys.export_phases(db)
    # not a SQLite file: one line naming it and what makes it
    junk = tmp_path / "nsys_rank0.sqlite"
    junk.write_text("not a database")
    with pytest.raises(ProfileFormatError, match=r"nsys_rank0\.sqlite: not an nsys SQLite export"):
        nsys.export_phases(junk)
    # a 0-byte file (it opens as an empty database) or another program's database: refused, not
    # read as an export without phases (parse then warned the rank had no SQLite export)
    for sql_text, what in [("", "empty"), ("CREATE TABLE foo (x);", r"its tables \(foo\) are")]:
        junk.unlink()
        write_export(junk, sql_text)
        with pytest.raises(ProfileFormatError, match=rf"rank0\.sqlite: not an nsys SQLite export "
                           rf"\({what}"):  # fmt: skip
            nsys.export_phases(junk)


def nsys_export_of_trace(doc: dict, path: Path) -> Path:
    """A STAND-IN nsys SQLite export of a torch.profiler chrome trace's events (no nsys ran):
    its record_function phase ranges as NVTX push/pop ranges of their thread, its CUDA API
    calls and GPU operations as the export's tables, pid and tid packed into globalTid (and the
    host's pid into the GPU operations' globalPid)."""
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    # a GPU operation's pid in the trace is its device; in the export, its host process's
    host_pid = next(int(e["pid"]) for e in events if e.get("cat") == "user_annotation")
    # the trace's GPU categories -> the export's table and its columns beyond the shared ones
    gpu_tables = {
        "kernel": ("KERNEL", "demangledName, shortName", "20, 20"),
        "gpu_memcpy": ("MEMCPY", "bytes, copyKind", "0, 0"),
        "gpu_memset": ("MEMSET", "value, bytes", "0, 0"),
    }
    with sqlite3.connect(path) as con:
        con.executescript(EXPORT_SQL.read_text().split("INSERT")[0])
        for e in events:
            corr = (e.get("args") or {}).get("correlation")
            span = (round(e["ts"] * 1e3), round((e["ts"] + e["dur"]) * 1e3))  # us -> ns
            gtid = (int(e["pid"]) << 24) | (int(e["tid"]) & 0xFFFFFF)
            if e.get("cat") == "user_annotation" and e["name"] in schema.RANGES:
                con.execute(
                    "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) "
                    "VALUES (?, ?, 59, ?, ?, 0)",
                    (*span, e["name"], gtid),
                )
            elif e.get("cat") in torch_ops.LAUNCH_CATEGORIES and corr is not None:
                con.execute(
                    "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 1, ?, ?, 11, 0, NULL)",
                    (*span, gtid, corr),
                )
            elif e.get("cat") in gpu_tables and corr is not None:
                table, columns, values = gpu_tables[e["cat"]]
                con.execute(
                    f"INSERT INTO CUPTI_ACTIVITY_KIND_{table} (start, end, deviceId, contextId, "
                    f"streamId, correlationId, globalPid, {columns}) "
                    f"VALUES (?, ?, 0, 1, 7, ?, ?, {values})",
                    (*span, corr, host_pid << 24),
                )
    con.close()
    return path


def test_the_h100_captures_events_project_alike_through_both_parsers(tmp_path):
    """The real H100 capture's events (tests/fixtures/gpu-h100/trace_rank0.json) written as an
    nsys export: the export's projection equals the chrome trace's, and is the GPU time of
    every thread's launches; one thread's launches alone (nsys's nvtx_gpu_proj_sum) hold almost
    none of the backward: autograd launched it from its own thread."""
    doc = json.loads((FIX.parent / "gpu-h100" / "trace_rank0.json").read_text())
    db = nsys_export_of_trace(doc, tmp_path / "nsys_rank0.sqlite")
    from_export = {p["name"]: p for p in nsys.export_phases(db)}
    from_trace = {p["name"]: p for p in torch_ops.trace_phases(doc)}
    assert from_export.keys() == from_trace.keys() >= {"forward", "backward", "optimizer"}
    for name, p in from_trace.items():
        assert from_export[name]["instances"] == p["instances"]
        assert from_export[name]["total_ns"] == pytest.approx(p["total_ns"], abs=2)
    # the main thread's launches only
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    ops = {}
    for e in events:
        if e.get("cat") in torch_ops.GPU_CATEGORIES and torch_ops.correlation(e) is not None:
            ops.setdefault(torch_ops.correlation(e), []).append((e["ts"], e["ts"] + e["dur"]))
    backward = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == "backward"]
    own = [
        (e["ts"], torch_ops.correlation(e))
        for e in events
        if e.get("cat") in torch_ops.LAUNCH_CATEGORIES and e["tid"] == backward[0]["tid"]
    ]
    ranges = [(e["name"], e["ts"], e["ts"] + e["dur"]) for e in backward]
    same_thread_us = projection.project(ranges, own, ops)[0]["total_ns"]
    assert from_trace["backward"]["total_ns"] > 50 * same_thread_us * 1e3 > 0


def test_single_stats_file_is_accepted():
    kernels, _ = nsys.parse_nsys(FIX / "nsys-2024.5" / "nsys_rank1_cuda_gpu_kern_sum.csv", "one")
    assert {r["rank"] for r in kernels} == {1} and len(kernels) == 11


@pytest.mark.parametrize(
    "report, column, value, says",
    [
        ("cuda_gpu_kern_sum", "Total Time (ns)", "-5", "is not a finite time >= 0"),
        ("cuda_gpu_kern_sum", "Total Time (ns)", "1e400", "is not a finite time >= 0"),
        ("cuda_gpu_kern_sum", "Instances", "0", "is not a whole number >= 1"),
        ("cuda_gpu_kern_sum", "Instances", "2.5", "is not a whole number >= 1"),  # read as 2
        ("nvtx_gpu_proj_sum", "Total Proj Time (ns)", "-5", "is not a finite time >= 0"),
        ("nvtx_gpu_proj_sum", "Range Instances", "1e400", "is not a whole number >= 1"),
    ],
)
def test_an_nsys_stats_cell_no_capture_can_have_is_named(tmp_path, report, column, value, says):
    """A negative time or count was a negative share or count in the profile CSVs; 1e400 (inf)
    a traceback."""
    path = tmp_path / f"nsys_rank0_{report}.csv"
    rows = list(csv.reader((FIX / "nsys-2024.5" / path.name).read_text().splitlines()))
    top = next(i for i, row in enumerate(rows) if column in row)  # lines above: nsys's notices
    rows[top + 1][rows[top].index(column)] = value
    with path.open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    line = top + 2
    with pytest.raises(
        ProfileFormatError, match=rf"{path.name}, line {line}: {re.escape(column)} "
    ):
        nsys.read_nsys_table(path)
    with pytest.raises(ProfileFormatError, match=re.escape(f"{value!r} {says}")):
        nsys.read_nsys_table(path)


def test_truncated_nsys_file_names_file_and_line(tmp_path):
    bad = FIX / "broken" / "nsys_rank0_cuda_gpu_kern_sum.csv"
    with pytest.raises(ProfileFormatError, match=r"nsys_rank0_cuda_gpu_kern_sum\.csv, line 10"):
        nsys.read_nsys_table(bad)
    # the CLI fails and writes no CSV (never a silently empty one)
    out = tmp_path / "k.csv"
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "scalestudy",
            "profile",
            "parse",
            "--nsys-stats",
            str(bad),
            "--run",
            "r",
            "--out-kernels",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert proc.returncode == 2 and "line 10" in proc.stderr and not out.exists()


def test_two_nsys_stats_reports_in_one_file_are_named_so(tmp_path):
    """`nsys stats --report cuda_gpu_kern_sum --report nvtx_sum --format csv rep > f.csv` prints
    both tables, each after its "Processing [...]" line, into one file. Its second table's
    lines were read as kernel rows: "1 cells, the header has 9 (truncated or unquoted comma?)",
    which sent the user looking for a damaged file."""
    both = tmp_path / "nsys_rank0_cuda_gpu_kern_sum.csv"
    kern = (FIX / "nsys-2024.5" / "nsys_rank0_cuda_gpu_kern_sum.csv").read_text()
    nvtx = (FIX / "nsys-2024.5" / "nsys_rank0_nvtx_sum.csv").read_text()
    both.write_text(kern + "\n" + nvtx)
    second = (
        len(kern.splitlines())
        + 1
        + next(i + 1 for i, line in enumerate(nvtx.splitlines()) if line.startswith("Time (%)"))
    )
    with pytest.raises(ProfileFormatError) as err:
        nsys.read_nsys_table(both)
    said = str(err.value)
    assert f"line {second}:" in said and "another nsys stats table" in said, said
    assert "unquoted comma" not in said and "--output" in said, said


def test_skipped_report_is_an_error_that_quotes_the_tool():
    with pytest.raises(ProfileFormatError, match="does not contain CUDA kernel data"):
        nsys.read_nsys_table(FIX / "broken" / "skipped_cuda_gpu_kern_sum.csv")


def test_a_skipped_memory_table_is_an_empty_one_and_a_skipped_kernel_summary_an_error(tmp_path):
    """A window without memcpy or memset: nsys stats writes SKIPPED for cuda_gpu_mem_time_sum
    (as for nvtx_sum without ranges). It killed the whole parse, kernels included, although a
    missing memory table was accepted."""
    stats = tmp_path / "stats"
    shutil.copytree(FIX / "nsys-2024.5", stats)
    without_mem = nsys.parse_nsys(stats, "r")  # rank 1 has no memory table at all
    for report, data in (
        ("cuda_gpu_mem_time_sum", "GPU memory data"),
        ("nvtx_gpu_proj_sum", "NVTX data"),
    ):
        (stats / f"nsys_rank1_{report}.csv").write_text(
            f"Processing [nsys_rank1.sqlite] with [/opt/nvidia/nsight-systems/2024.5.1/"
            f"host-linux-x64/reports/{report}.py]... \n"
            f"SKIPPED: nsys_rank1.sqlite does not contain {data}.\n"
        )
        kernels, ranges = nsys.parse_nsys(stats, "r")
        assert [r for r in kernels if r["rank"] == 1] == [
            r for r in without_mem[0] if r["rank"] == 1
        ]
        assert {r["rank"] for r in ranges} == {0, 1}
    # rank 1's memory table skipped, rank 0's read: its memcpy rows are still there
    assert any(r["category"] == "memcpy" and r["rank"] == 0 for r in kernels)
    (stats / "nsys_rank1_cuda_gpu_kern_sum.csv").write_bytes(
        (FIX / "broken" / "skipped_cuda_gpu_kern_sum.csv").read_bytes()
    )
    with pytest.raises(ProfileFormatError, match="does not contain CUDA kernel data"):
        nsys.parse_nsys(stats, "r")


def test_missing_kernel_summary_is_an_error(tmp_path):
    (tmp_path / "nsys_rank0_nvtx_sum.csv").write_bytes(
        (FIX / "nsys-2024.5/nsys_rank0_nvtx_sum.csv").read_bytes()
    )
    with pytest.raises(ProfileFormatError, match="no kernel summary"):
        nsys.parse_nsys(tmp_path, "r")
    with pytest.raises(ProfileFormatError, match="no such file"):
        nsys.parse_nsys(tmp_path / "does_not_exist", "r")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProfileFormatError, match="nsys stats"):
        nsys.parse_nsys(tmp_path / "empty", "r")
    # a directory of other reports only, and a file named outright that is no table read here
    # (empty, or another CSV): each gave 0 kernel rows, exit 0, and a header-only kernels CSV
    other = tmp_path / "other"
    other.mkdir()
    (other / "nsys_rank0_cuda_api_sum.csv").write_text("Time (%),Total Time (ns),Name\n1,2,x\n")
    with pytest.raises(ProfileFormatError, match="no kernel summary"):
        nsys.parse_nsys(other, "r")
    (tmp_path / "e.csv").write_text("")
    (tmp_path / "f.csv").write_text("a,b\n1,2\n")
    for named in (tmp_path / "e.csv", tmp_path / "f.csv", other / "nsys_rank0_cuda_api_sum.csv"):
        with pytest.raises(ProfileFormatError, match=re.escape(str(named))):
            nsys.parse_nsys(named, "r")


GPU_SUM_HEADER = (
    "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),"
    "Category,Operation"
)


def write_gpu_sum(path: Path, stats: Path) -> None:
    """A HAND-MADE `nsys stats --report cuda_gpu_sum` table (columns from the Nsight Systems
    Analysis Guide; no capture): the kernel and memory summaries' rows in stats, in one table."""
    rows = [GPU_SUM_HEADER.split(",")]
    for name, category in (("cuda_gpu_kern_sum", "CUDA_KERNEL"), ("mem_time_sum", "MEMORY_OPER")):
        table = list(csv.reader(next(stats.glob(f"*_{name}.csv")).read_text().splitlines()))
        top = next(i for i, row in enumerate(table) if row[:1] == ["Time (%)"])
        rows += [row[:8] + [category, row[-1]] for row in table[top + 1 :]]
    with path.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)


def test_the_combined_gpu_summary_is_left_out_or_refused_by_name(tmp_path):
    """cuda_gpu_sum / cuda_api_gpu_sum hold kernels and memory operations in one table (a
    Category column): read as a memory summary, its kernel rows were added to the kernel
    summary's (every kernel counted twice), or it was blamed as a second memory summary."""
    stats = tmp_path / "stats"
    stats.mkdir()
    for f in (FIX / "nsys-2024.5").glob("nsys_rank0_*.csv"):
        (stats / f.name).write_bytes(f.read_bytes())
    alone = nsys.parse_nsys(stats, "r")
    assert nsys.nsys_table_kind(GPU_SUM_HEADER.split(",")) is None
    for report in ("cuda_gpu_sum", "cuda_api_gpu_sum"):
        write_gpu_sum(stats / f"nsys_rank0_{report}.csv", stats)
    # beside the kernel and memory summaries: another report, left out
    assert nsys.parse_nsys(stats, "r") == alone
    # where it would be the only source of kernels: refused in one line naming it
    given = stats / "nsys_rank0_cuda_gpu_sum.csv"
    for where in (given, stats):
        if where == stats:
            (stats / "nsys_rank0_cuda_gpu_kern_sum.csv").unlink()
        with pytest.raises(ProfileFormatError) as err:
            nsys.parse_nsys(where, "r")
        message = str(err.value)
        assert "\n" not in message and "cuda_gpu_sum" in message and "cuda_gpu_kern_sum" in message
        assert "Category" in message


def _profile_parse(*argv: str) -> argparse.Namespace:
    """The arguments of `scalestudy profile parse ARGV...`, as the CLI parses them."""
    words = ["profile", "parse", *argv]
    return cli.build_parser(words).parse_args(words)


def test_cli_parse_nsys_writes_both_schemas(tmp_path):
    args = _profile_parse(
        "--nsys-stats",
        str(FIX / "nsys-2024.5"),
        "--run",
        "w2",
        "--out-kernels",
        str(tmp_path / "k.csv"),
        "--out-ranges",
        str(tmp_path / "r.csv"),
    )
    assert parse_job.parse(args) == 0
    k = list(csv.DictReader((tmp_path / "k.csv").open()))
    assert tuple(k[0]) == schema.KERNEL_COLUMNS and len(k) == 25
    r = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert tuple(r[0]) == schema.RANGE_COLUMNS and len(r) == 8


def test_merge_joins_runs_and_refuses_a_run_given_twice(tmp_path, capsys):
    """`profile merge` of the same run's CSV twice (or a copy of it) doubled its rows, and with
    them every kernel share and sum of the analysis."""
    from scalestudy import cli

    made = []
    for run in ("w1", "w2"):
        args = _profile_parse(
            *("--nsys-stats", str(FIX / "nsys-2024.5"), "--run", run),
            *("--out-kernels", str(tmp_path / f"{run}.csv")),
            *("--out-ranges", str(tmp_path / f"{run}-ranges.csv")),
        )
        assert parse_job.parse(args) == 0
        made.append(tmp_path / f"{run}.csv")
    out = tmp_path / "all.csv"
    argv = ["profile", "merge", "--schema", "kernels", "--out", str(out)]
    assert cli.main([*argv, *map(str, made)]) == 0
    merged = list(csv.DictReader(out.open()))
    assert [r["run"] for r in merged] == ["w1"] * 25 + ["w2"] * 25
    copy = tmp_path / "copy.csv"
    copy.write_bytes(made[1].read_bytes())
    for twice in ([made[0], made[0]], [*made, copy]):
        out.unlink(missing_ok=True)
        capsys.readouterr()  # the parse's warnings (no SQLite export) when logging is set up
        assert cli.main([*argv, *map(str, twice)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{twice[-1]}: run " in err[0], err
        assert f"is also in {twice[-2]}; merge each run's CSV once" in err[0]
        assert not out.exists()
    # no input at all: a header-only CSV, exit 0, was a profile of no run
    with pytest.raises(SystemExit):
        cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the following arguments are required: inputs" in err[0], err
    assert not out.exists()


def test_profile_outputs_that_are_one_file_or_an_input_are_refused(tmp_path, capsys):
    """`profile parse --out-kernels k.csv --out-ranges ./k.csv` wrote the ranges over the
    kernels and logged "25 kernel rows", exit 0 (the two spellings made two keys of one file);
    `profile merge --out` naming one of its inputs replaced it, and `profile ncu` writing its
    --kernels would have after every pass. Each is now one line, exit 2, before any work,
    the inputs as they were."""
    kernels = tmp_path / "k.csv"
    argv = ["--nsys-stats", str(FIX / "nsys-2024.5"), "--run", "w1", "--out-kernels", str(kernels)]
    with pytest.raises(ProfileError, match="--out-kernels and --out-ranges are one file"):
        parse_job.parse(_profile_parse(*argv, "--out-ranges", str(tmp_path / "." / "k.csv")))
    assert not kernels.exists()
    stats = tmp_path / "stats.csv"  # an nsys stats CSV given as the file, then written over
    shutil.copy(next((FIX / "nsys-2024.5").glob("*cuda_gpu_kern_sum*.csv")), stats)
    before = stats.read_bytes()
    with pytest.raises(ProfileError, match="--out-kernels is the input --nsys-stats"):
        parse_job.parse(
            _profile_parse("--nsys-stats", str(stats), "--run", "w1", "--out-kernels", str(stats))
        )
    assert stats.read_bytes() == before
    assert parse_job.parse(_profile_parse(*argv)) == 0
    made = kernels.read_bytes()
    capsys.readouterr()
    merge = ["profile", "merge", "--schema", "kernels", "--run", "w1", "--out", str(kernels)]
    assert cli.main([*merge, str(kernels)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out is the input CSV 1" in err[0], err
    assert kernels.read_bytes() == made
    listing = ["profile", "ncu-kernels", "--kernels", str(kernels), "--out", str(kernels)]
    assert cli.main(listing) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out is the input --kernels" in err[0], err
    assert kernels.read_bytes() == made
    # the ncu job's manifest, its --out-dir's tool.json, is no input either
    listed = tmp_path / "n" / "tool.json"
    listed.parent.mkdir()
    assert (
        cli.main(["profile", "ncu-kernels", "--kernels", str(kernels), "--out", str(listed)]) == 0
    )
    made = listed.read_bytes()
    assert [k["kernel"] for k in json.loads(made)] == schema.top_kernels(
        schema.read_csv(kernels, schema.KERNEL_COLUMNS), 100
    )  # rank 0's kernels by time, NCCL left out
    ncu_argv = ["profile", "ncu", "--kernels", str(listed), "--out-dir", str(listed.parent)]
    ncu_argv += ["--run", "w1", "--device", "cpu", "--", "--epochs", "1"]
    assert cli.main(ncu_argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tool.json of --out-dir is the input --kernels" in err[0], err
    assert listed.read_bytes() == made


def test_merge_refuses_a_csv_that_holds_another_runs_rows(tmp_path, capsys):
    """A per-run CSV copied into another run's directory (results/profile/w2/kernels.csv holding
    w1's rows, or two runs' files swapped) was merged under the run its rows name: the report
    then showed one configuration's kernels as another's. The workflow names the run of each
    input (`--run`, in input order), and a row of any other run is refused."""
    from scalestudy import cli

    made = {}
    for run in ("w1", "w2"):
        args = _profile_parse(
            *("--nsys-stats", str(FIX / "nsys-2024.5"), "--run", run),
            *("--out-kernels", str(tmp_path / f"{run}.csv")),
        )
        assert parse_job.parse(args) == 0
        made[run] = tmp_path / f"{run}.csv"
    out = tmp_path / "all.csv"
    argv = ["profile", "merge", "--schema", "kernels", "--out", str(out)]
    named = ["--run", "w1", "--run", "w2"]
    assert cli.main([*argv, *named, str(made["w1"]), str(made["w2"])]) == 0
    assert [r["run"] for r in csv.DictReader(out.open())] == ["w1"] * 25 + ["w2"] * 25
    # (the inputs, the one refused, the run its rows name)
    swapped = ([made["w2"], made["w1"]], made["w2"], "w2")
    copied = ([made["w1"], made["w1"]], made["w1"], "w1")  # w1's CSV as w2's
    for inputs, wrong, got in (swapped, copied):
        out.unlink(missing_ok=True)
        capsys.readouterr()
        assert cli.main([*argv, *named, *map(str, inputs)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{wrong}: rows of run {got!r}, but it is run " in err[0], err
        assert "delete it and run snakemake again" in err[0]
        assert not out.exists()
    # one --run per input, or none (a hand merge)
    assert cli.main([*argv, "--run", "w1", str(made["w1"]), str(made["w2"])]) == 2
    assert "2 inputs but 1 --run" in capsys.readouterr().err
    assert cli.main([*argv, str(made["w2"]), str(made["w1"])]) == 0


@pytest.mark.parametrize(
    "columns, column, value, why",
    [
        (schema.KERNEL_COLUMNS, "total_ns", "abc", "not a number >= 0"),
        (schema.KERNEL_COLUMNS, "total_ns", "-5", "not a number >= 0"),  # a share < 0
        (schema.KERNEL_COLUMNS, "rank", "1.5", "not a whole number >= 0"),
        # re-saved as floats: the ncu job's int() of them was a ValueError traceback
        (schema.KERNEL_COLUMNS, "instances", "3.0", "not a whole number >= 1"),
        (schema.KERNEL_COLUMNS, "rank", "0.0", "not a whole number >= 0"),
        (schema.KERNEL_COLUMNS, "instances", "", "blank, and this column is always filled"),
        (schema.KERNEL_COLUMNS, "category", "copies", "not one of conv, batchnorm"),
        (schema.KERNEL_COLUMNS, "run", " ", "blank"),  # refused by the plot, naming analyze
        (schema.RANGE_COLUMNS, "time_base", "gpu", "not one of gpu_projection"),
        (schema.RANGE_COLUMNS, "share", "2", "not a fraction in [0, 1]"),
        (schema.NCU_COLUMNS, "duration_ns", "inf", "not a number >= 0"),
        (schema.NCU_COLUMNS, "launches", "0", "not a whole number >= 1"),
    ],
)
def test_a_profile_csv_cell_the_parser_cannot_have_written_is_refused(
    tmp_path, columns, column, value, why
):
    """A per-run kernels.csv edited by hand was merged as it was, and `scalestudy analyze`
    then ended in a ValueError traceback (a word) or drew a negative share."""
    good = {
        "run": "w1", "rank": "0", "tool": "nsys", "kernel": "k", "category": "conv",
        "range": "forward", "time_base": "gpu_projection", "instances": "3",
        "total_ns": "1000", "share": "1", "launches": "3", "duration_ns": "2000",
    }  # fmt: skip
    row = {c: good.get(c, "") for c in columns}  # the ncu rates: blank where ncu gave none
    path = tmp_path / "w1.csv"
    path.write_text(schema.csv_text(columns, [row]))
    assert schema.read_csv(path, columns) == [row]
    path.write_text(schema.csv_text(columns, [row | {column: value}]))
    with pytest.raises(ProfileFormatError, match=rf"w1\.csv, line 2: {column} '{value}' is"):
        schema.read_csv(path, columns)
    with pytest.raises(ProfileFormatError, match=re.escape(why)):
        schema.merge_csvs([path], columns)


def test_a_profile_csv_without_the_parsers_header_names_the_fix_by_whose_it_is(
    tmp_path, monkeypatch, capsys
):
    """`profile merge` of a 0-byte per-run CSV said "header None is not [...]", of another
    table "header ['a', 'b'] is not [...]", and named no fix. The study's own
    results/profile/<run>/ CSV is parsed again from its capture (delete it); a path given by
    hand is the user's file, never to be deleted."""
    from scalestudy import cli

    monkeypatch.chdir(tmp_path)  # the study directory
    own = Path("results/profile/w1/kernels.csv")
    own.parent.mkdir(parents=True)
    mine = Path("mine.csv")
    for text, says in [
        ("", "line 1: empty (not even a header): no CSV `scalestudy profile parse` wrote"),
        ("a,b\n1,2\n", "line 1: header ['a', 'b'] is not ['run', 'rank', 'tool', 'kernel',"),
    ]:
        for path in (own, mine):
            path.write_text(text)
            argv = ["profile", "merge", "--schema", "kernels", "--out", "m.csv", str(path)]
            assert cli.main(argv) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and f"{path}, {says}" in err[0], err
            if path == own:
                assert err[0].endswith(
                    "delete it and run snakemake again (it parses the capture again)"
                ), err
            else:
                assert "delete" not in err[0] and err[0].endswith(
                    "fix it, or give the study's results/profile/<run>/ CSVs (`snakemake` "
                    "writes them)"
                ), err
            assert not Path("m.csv").exists()


def test_cli_parse_ncu_writes_the_ncu_schema(tmp_path):
    out = tmp_path / "n.csv"
    args = _profile_parse("--ncu", str(FIX / "ncu-2022.4"), "--run", "old", "--out-ncu", str(out))
    assert parse_job.parse(args) == 0
    (row,) = csv.DictReader(out.open())
    assert tuple(row) == schema.NCU_COLUMNS and row["kernel"] == "ampere_sgemm_128x64_tn"
    with pytest.raises(ProfileError, match="--out-ncu"):
        parse_job.parse(_profile_parse("--ncu", str(out), "--run", "r", "--out-kernels", "k.csv"))


def test_parse_of_an_ncu_directory_labels_each_csv_with_its_manifests_kernel(tmp_path):
    """`profile parse --ncu DIR` of a `profile ncu` directory (the workflow's profile_ncu_parse):
    each details CSV its tool.json names, under the kernel named with it (the kernels table's
    name, the join key with profile_kernels, not ncu's spelling), no other file of the directory;
    tool "none" (ncu skipped) an empty CSV. A manifest that does not pair each CSV of the
    directory with a kernel is one line, and nothing is written."""
    real = REPO / "tests" / "fixtures" / "gpu-h100-ncu"
    d = tmp_path / "ncu"
    d.mkdir()
    shutil.copyfile(real / "ncu_k0.csv", d / "ncu_k0.csv")
    shutil.copyfile(real / "ncu_k1.csv", d / "ncu_k2.csv")  # k1 never launched under ncu
    (d / "ncu_k1.csv").write_text("an earlier run's, not named: never read\n")
    out = tmp_path / "n.csv"

    def parse(manifest) -> list[dict]:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        (d / "tool.json").write_text(text)
        parse_job.parse(_profile_parse("--ncu", str(d), "--run", "w1", "--out-ncu", str(out)))
        return list(csv.DictReader(out.open()))

    pair = {"tool": "ncu", "why": "/usr/bin/ncu", "kernels": ["conv<A>", "bn<B>"],
            "csv": ["ncu_k0.csv", "ncu_k2.csv"], "not_launched": ["gemm<C>"]}  # fmt: skip
    assert sorted(r["kernel"] for r in parse(pair)) == ["bn<B>", "conv<A>"]
    assert parse({"tool": "none", "why": "auto: no GPU", "not_launched": []}) == []
    out.unlink()
    for manifest, says in [
        ({**pair, "kernels": ["conv<A>"]}, "not the manifest of `scalestudy profile ncu`"),
        ({**pair, "kernels": ["conv<A>", " "]}, "not the manifest"),  # a kernel without a name
        ({**pair, "kernels": ["conv<A>", "conv<A>"]}, "not the manifest"),
        ({**pair, "csv": ["ncu_k0.csv", "ncu_k0.csv"]}, "not the manifest"),  # one report twice
        ({**pair, "kernels": [], "csv": []}, "not the manifest"),  # ncu wrote tool none then
        ({**pair, "csv": ["ncu_k0.csv", "../ncu/ncu_k2.csv"]}, "not the manifest"),
        ({**pair, "csv": ["ncu_k0.csv", "ncu_k3.csv"]}, "ncu_k3.csv: missing (tool.json names"),
        ({k: v for k, v in pair.items() if k != "csv"}, "not the manifest"),  # an older job's
        ({"tool": "nsys", "input": "stats", "why": ""}, "not the manifest"),
        ("{not json", "not JSON"),
    ]:
        with pytest.raises((ProfileError, ProfileFormatError), match=re.escape(says)):
            parse(manifest)
        assert not out.exists()


def test_an_ncu_directory_of_another_run_is_refused(tmp_path, capsys):
    """`profile parse --ncu DIR --run B` of a `profile ncu` directory copied from run A's wrote
    A's kernels as B's, exit 0: tool.json did not record the run (the capture's does, and its
    parse refuses another --run). Now profile ncu records it, under tool ncu and tool none, and
    the parse refuses another run in one line naming tool.json and both runs, nothing written;
    a tool.json from before the run was recorded is parsed as before."""
    # profile ncu's manifest names its run: where ncu is skipped (no GPU) ...
    skipped = tmp_path / "skipped"
    argv = ["profile", "ncu", "--run", "w1_a", "--kernels", str(tmp_path / "k.json"),
            "--out-dir", str(skipped), "--device", "cpu", "--", "--epochs", "1"]  # fmt: skip
    assert cli.main(argv) == 0
    assert json.loads((skipped / "tool.json").read_text())["run"] == "w1_a"
    # ... and where it profiled (the writer of tool ncu: the stand-in test below runs it too)
    d = tmp_path / "ncu"
    d.mkdir()
    shutil.copyfile(REPO / "tests" / "fixtures" / "gpu-h100-ncu" / "ncu_k0.csv", d / "ncu_k0.csv")
    made = {"tool": "ncu", "why": "/usr/bin/ncu", "kernels": ["conv<A>"], "csv": ["ncu_k0.csv"]}
    out = tmp_path / "n.csv"
    capsys.readouterr()
    for directory, manifest in ((d, {"run": "w1_a", **made}), (skipped, None)):
        if manifest:
            (directory / "tool.json").write_text(json.dumps(manifest))
        parse = ["profile", "parse", "--ncu", str(directory), "--out-ncu", str(out)]
        assert cli.main([*parse, "--run", "w1_b"]) == 2
        (err,) = capsys.readouterr().err.strip().splitlines()
        assert err == (
            f"scalestudy profile parse: {directory / 'tool.json'}: the ncu profile of run "
            "'w1_a', not of --run 'w1_b' (copied from another run's directory?): profile this "
            "run again with `scalestudy profile ncu`"
        )
        assert not out.exists()
        assert cli.main([*parse, "--run", "w1_a"]) == 0  # its own run: parsed
        assert {r["run"] for r in csv.DictReader(out.open())} <= {"w1_a"}
        out.unlink()
    # a tool.json without the run (a profile ncu before it was recorded): read as before
    (d / "tool.json").write_text(json.dumps(made))
    assert cli.main(["profile", "parse", "--ncu", str(d), "--run", "w1_b", "--out-ncu",
                     str(out)]) == 0  # fmt: skip
    assert [r["kernel"] for r in csv.DictReader(out.open())] == ["conv<A>"]


def test_one_kernel_in_two_ncu_csvs_is_refused(tmp_path, capsys):
    """--ncu DIR without a tool.json reads every *.csv of DIR, each averaged on its own: one
    kernel in two of them (a report exported twice) was two profile_ncu rows of one run and
    kernel, exit 0. Now one line naming both files, nothing written; kernels apart are read."""
    d = tmp_path / "ncu"
    d.mkdir()
    _ncu_csv(d / "a.csv", [("0", "gemm", "Duration", "nsecond", "2000")])
    _ncu_csv(d / "b.csv", [("0", "conv", "Duration", "nsecond", "1000")])
    out = tmp_path / "n.csv"
    argv = ["profile", "parse", "--ncu", str(d), "--run", "r", "--out-ncu", str(out)]
    assert cli.main(argv) == 0
    assert sorted(r["kernel"] for r in csv.DictReader(out.open())) == ["conv", "gemm"]
    out.unlink()
    _ncu_csv(d / "c.csv", [("0", "conv", "Duration", "nsecond", "3000"),
                           ("1", "relu", "Duration", "nsecond", "5")])  # fmt: skip
    capsys.readouterr()
    assert cli.main(argv) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err == (
        f"scalestudy profile parse: {d / 'c.csv'}: kernel 'conv' again, also in {d / 'b.csv'}: "
        "each file's launches are averaged on their own, so one kernel would be two "
        f"profile_ncu rows; move one of the two out of {d}"
    )
    assert not out.exists()


def test_an_ncu_csv_of_two_kernels_names_the_filter_not_a_new_export(tmp_path):
    """A `profile ncu` pass whose CSV holds launches of another kernel too: its name filter
    (ncu_kernels.json's kernel_regex) matched both. The parse added "export it again ... or
    profile again", which makes the same file; now the line names the filter and what makes
    another (a new kernels file, or a lower top_k), and no export."""
    d = tmp_path / "ncu"
    d.mkdir()
    rows = [
        ("0", "gemm<1>", "Duration", "nsecond", "1"),
        ("1", "gemm<2>", "Duration", "nsecond", "1"),
    ]
    _ncu_csv(d / "ncu_k0.csv", rows)
    manifest = {"run": "r", "tool": "ncu", "why": "", "kernels": ["gemm<1>"], "csv": ["ncu_k0.csv"]}
    (d / "tool.json").write_text(json.dumps(manifest))
    args = _profile_parse("--ncu", str(d), "--run", "r", "--out-ncu", str(tmp_path / "n.csv"))
    with pytest.raises(ProfileFormatError) as err:
        parse_job.parse(args)
    assert str(err.value) == (
        f"{d / 'ncu_k0.csv'}: launches of 2 kernels, the filter selected 'gemm<1>': "
        "['gemm<1>', 'gemm<2>']; its name filter (the kernel_regex of `profile ncu`'s --kernels "
        "file, the workflow's results/profile/<run>/ncu_kernels.json) matches them too: make "
        "that file again with `scalestudy profile ncu-kernels --kernels <the run's kernels.csv> "
        "--out <it>` and profile again with `scalestudy profile ncu`, or lower "
        "profiling.ncu.top_k to <i> of this ncu_k<i>.csv to leave the kernel out"
    )
    assert "export" not in str(err.value) and not (tmp_path / "n.csv").exists()


@pytest.mark.parametrize("damage", ["", "Time (%),Total Time (ns)\n", "garbage\x00\n"])
def test_a_damaged_stats_or_details_csv_names_what_makes_it_again(tmp_path, damage):
    """A damaged nsys stats CSV ("no nsys stats header found") or ncu details CSV said what
    was wrong, not what to run: `profile parse` adds the command that makes the file again,
    once (an error that names one already keeps its own)."""
    stats, details = tmp_path / "stats", tmp_path / "ncu"
    shutil.copytree(FIX / "nsys-2024.5", stats)
    (stats / "nsys_rank0_cuda_gpu_kern_sum.csv").write_text(damage)
    details.mkdir()
    (details / "ncu_k0.csv").write_text(damage)
    for argv, fix in [
        (["--nsys-stats", str(stats), "--out-kernels", str(tmp_path / "k.csv")], nsys.MAKE_STATS),
        (["--ncu", str(details), "--out-ncu", str(tmp_path / "n.csv")], ncu.REEXPORT),
    ]:
        with pytest.raises(ProfileFormatError) as err:
            parse_job.parse(_profile_parse(*argv, "--run", "r"))
        message = str(err.value)
        assert message.endswith(f"; {fix}") and message.count("`") == fix.count("`"), message
        assert "\n" not in message and "header found" in message, message
    assert not list(tmp_path.glob("*.csv"))  # nothing written
    # a file that cannot be read (a directory named *.csv): no command remakes it
    (details / "ncu_k0.csv").unlink()
    (details / "ncu_k0.csv").mkdir()
    out = tmp_path / "n.csv"
    with pytest.raises(ProfileFormatError) as err:
        parse_job.parse(_profile_parse("--ncu", str(details), "--out-ncu", str(out), "--run", "r"))
    assert str(err.value).endswith("ncu_k0.csv: cannot read: Is a directory"), str(err.value)
    # a problem that names its command already is left as it is
    named = ProfileFormatError("f.csv", 3, "cut: run `x` again")
    assert named.with_fix("run `y`") is named and str(named) == "f.csv, line 3: cut: run `x` again"


# --- ncu -----
def test_ncu_details_2025_rule_rows_trailing_commas_separators():
    rows = {r["kernel"][:30]: r for r in ncu.parse_ncu(FIX / "ncu-2025.1" / "ncu_k0.csv", "w1")}
    conv = rows["sm90_xmma_fprop_implicit_gemm_"]
    assert conv["launches"] == 1
    assert conv["duration_ns"] == pytest.approx(150336)
    assert conv["dram_throughput_pct"] == pytest.approx(35.12)
    assert conv["sm_throughput_pct"] == pytest.approx(78.40)
    assert conv["achieved_occupancy_pct"] == pytest.approx(24.61)
    tensor = 1_503_360_000_000 / 150336e-9
    assert conv["tensor_flop_per_s"] == pytest.approx(tensor)
    assert conv["flop_per_s"] == pytest.approx(tensor + (2 * 1_000_000 + 500_000) / 150336e-9)
    ew = rows["void at::native::vectorized_el"]
    assert ew["duration_ns"] == pytest.approx(5120)  # "us" unit converted
    assert ew["flop_per_s"] == pytest.approx(1_048_576 / 5.12e-6)
    # no tensor-core counter in its rows (an H100's report has them, 0, for every kernel): not
    # measured, blank, not "0 tensor FLOP/s"
    assert ew["tensor_flop_per_s"] is None


def test_ncu_duration_is_whole_nanoseconds(tmp_path):
    """The mean duration over launches is written as whole ns (the schema's times are integers):
    1,234,567 and 1,234,568 ns were the cell 1.23457e+06."""
    head = (
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
        '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
        '"Metric Value"\n'
    )
    rows = "".join(
        f'"{i}","1","p","h","k","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","S",'
        f'"gpu__time_duration.sum","ns","{ns}"\n'
        for i, ns in enumerate(("1,234,567", "1,234,568"))
    )
    (tmp_path / "ncu_k0.csv").write_text(head + rows)
    (row,) = ncu.parse_ncu(tmp_path / "ncu_k0.csv", "r")
    assert row["launches"] == 2 and row["duration_ns"] == 1234568
    text = schema.csv_text(schema.NCU_COLUMNS, [row])
    assert list(csv.DictReader(text.splitlines()))[0]["duration_ns"] == "1234568"


def test_ncu_details_old_format_metric_names_mean_over_launches():
    (row,) = ncu.parse_ncu(FIX / "ncu-2022.4" / "ncu_details.csv", "old")
    assert row["kernel"] == "ampere_sgemm_128x64_tn" and row["launches"] == 2
    assert row["duration_ns"] == pytest.approx(41000)
    assert row["achieved_occupancy_pct"] == pytest.approx(12.4)
    assert row["flop_per_s"] is None  # no FLOP counters in that report: empty, not 0


def test_truncated_ncu_file_is_an_error_naming_the_file():
    with pytest.raises(ProfileFormatError, match=r"ncu_truncated\.csv, line \d+"):
        ncu.parse_ncu(FIX / "broken" / "ncu_truncated.csv", "r")


NCU_HEADER = (FIX / "ncu-2025.1" / "ncu_k0.csv").read_text().splitlines()[3]


def _ncu_csv(path, rows, *, final_newline=True):
    """A `ncu --csv --page details` file (2025 layout) of (launch, kernel, metric, unit, value)
    metric rows: every cell quoted, the rule columns left off with one trailing comma."""
    lines = [NCU_HEADER]
    for launch_id, kernel, metric, unit, value in rows:
        ids = [launch_id, "41234", "python3.11", "127.0.0.1", kernel, "1", "7", "(128, 1, 1)"]
        cells = [*ids, "(64, 8, 1)", "0", "9.0", "Command line profiler metrics"]
        lines.append(",".join(f'"{c}"' for c in [*cells, metric, unit, value]) + ",")
    path.write_text("\n".join(lines) + ("\n" if final_newline else ""))
    return path


def test_ncu_tensor_flops_count_each_operation_once(tmp_path):
    k = "sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x32"
    tensor = "sm__ops_path_tensor_src_fp16_dst_fp32"
    f = _ncu_csv(
        tmp_path / "ncu_k0.csv",
        [
            ("0", k, "gpu__time_duration.sum", "nsecond", "1,000"),
            ("0", k, f"{tensor}.sum", "", "1,000,000"),
            # the same operations again: sparsity breakdowns and the src-only total
            ("0", k, f"{tensor}_sparsity_off.sum", "", "1,000,000"),
            ("0", k, f"{tensor}_sparsity_on.sum", "", "0"),
            ("0", k, "sm__ops_path_tensor_src_fp16.sum", "", "1,000,000"),
            ("0", k, "sm__ops_path_tensor_src_bf16_dst_fp32.sum", "", "500,000"),
            ("0", k, f"{tensor}.sum.peak_sustained", "", "4,096"),
        ],
    )
    (row,) = ncu.parse_ncu(f, "r")
    assert row["tensor_flop_per_s"] == pytest.approx(1_500_000 / 1e-6)
    assert row["flop_per_s"] == pytest.approx(1_500_000 / 1e-6)
    # what capture.py asks ncu for is what the parser sums
    assert ncu.TENSOR_METRIC.match(f"{tensor}.sum")
    assert not ncu.TENSOR_METRIC.match(f"{tensor}_sparsity_off.sum")


def test_ncu_sass_flops_under_either_counter_prefix_count_once(tmp_path):
    """The SASS FLOP counters exist per SM (sm__, the shared notes' names, an ncu run by hand)
    and per SM sub-partition (smsp__, what profile ncu asks for), the same GPU-wide sums. The
    pattern matched smsp__ only: sm__ counters gave no flop_per_s, or beside a tensor counter
    the tensor FLOPs alone. Both in one launch count once."""
    k = "void at::native::vectorized_elementwise_kernel<4>"
    rows = [("0", k, "gpu__time_duration.sum", "nsecond", "1,000")]
    sass = "sass_thread_inst_executed_op_{}_pred_on.sum"
    for unit in ("sm", "smsp"):
        counters = [(f"{unit}__{sass.format('ffma')}", "1,000,000")]
        counters += [(f"{unit}__{sass.format('fadd')}", "500,000")]
        f = _ncu_csv(tmp_path / f"{unit}.csv", rows + [("0", k, m, "", v) for m, v in counters])
        (row,) = ncu.parse_ncu(f, "r")
        assert row["flop_per_s"] == pytest.approx(2_500_000 / 1e-6), unit
    both = rows + [("0", k, f"{u}__{sass.format('ffma')}", "", "1,000,000") for u in ("sm", "smsp")]
    (row,) = ncu.parse_ncu(_ncu_csv(tmp_path / "both.csv", both), "r")
    assert row["flop_per_s"] == pytest.approx(2_000_000 / 1e-6)
    bad = rows + [("0", k, f"sm__{sass.format('dmul')}", "", "-5")]  # checked as the smsp__ ones
    with pytest.raises(ProfileFormatError, match="is not a number >= 0"):
        ncu.parse_ncu(_ncu_csv(tmp_path / "bad.csv", bad), "r")


def test_ncu_tensor_flops_of_a_type_with_only_its_src_total(tmp_path):
    """An H100's or H200's ncu 2025.3 lists no sm__ops_path_tensor_src_fp16_dst_* (the real
    captures under tests/fixtures/gpu-h*/ asked for every _dst_ total and got bf16 and tf32
    only): an fp16 run's tensor-core operations are in the src-only total, which the parser
    dropped as a double count, so fp16 convolutions read 0 tensor FLOP/s."""
    k = "sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x32"
    f = _ncu_csv(
        tmp_path / "ncu_k0.csv",
        [
            ("0", k, "gpu__time_duration.sum", "nsecond", "1,000"),
            ("0", k, "sm__ops_path_tensor_src_fp16.sum", "", "2,000,000"),
            ("0", k, "sm__ops_path_tensor_src_fp16_sparsity_off.sum", "", "2,000,000"),
            ("0", k, "sm__ops_path_tensor_src_bf16_dst_fp32.sum", "", "0"),
            ("0", k, "sm__ops_path_tensor_src_tf32_dst_fp32.sum", "", "0"),
        ],
    )
    (row,) = ncu.parse_ncu(f, "r")
    assert row["tensor_flop_per_s"] == pytest.approx(2_000_000 / 1e-6)
    # and jobs/profile_ncu.py asks ncu for the src-only totals too (a regex: what the GPU has)
    assert ncu.TENSOR_METRIC.match("sm__ops_path_tensor_src_fp16.sum")


@pytest.mark.parametrize(
    "label",
    [
        "Compute (SM) Throughput",
        "Compute (SM) [%]",
        "SM [%]",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    ],
)
def test_ncu_sm_throughput_under_every_label(tmp_path, label):
    f = _ncu_csv(
        tmp_path / "ncu.csv",
        [("0", "k", "Duration", "nsecond", "2000"), ("0", "k", label, "%", "42.5")],
    )
    assert ncu.parse_ncu(f, "r")[0]["sm_throughput_pct"] == pytest.approx(42.5)


def test_ncu_duration_in_an_unknown_unit_names_file_and_line(tmp_path):
    f = _ncu_csv(tmp_path / "ncu.csv", [("0", "k", "Duration", "cycle", "2000")])
    with pytest.raises(ProfileFormatError, match=r"ncu\.csv, line 2: Duration: .*cycle"):
        ncu.parse_ncu(f, "r")


def test_an_ncu_duration_without_a_unit_is_an_error(tmp_path):
    """With the unit column under another name (or empty) a duration was read as ns: 67.9 us
    as 67.9 ns, 1000x off."""
    f = tmp_path / "ncu.csv"
    f.write_text(
        '"ID","Kernel Name","Metric Name","Units","Metric Value"\n'
        '"0","k","gpu__time_duration.sum","usecond","67.9"\n'
    )
    with pytest.raises(ProfileFormatError, match=r"ncu\.csv, line 2: Duration 67\.9 has no unit"):
        ncu.parse_ncu(f, "r")
    f = _ncu_csv(tmp_path / "empty-unit.csv", [("0", "k", "Duration", "", "2000")])
    with pytest.raises(ProfileFormatError, match="--print-units base"):
        ncu.parse_ncu(f, "r")


@pytest.mark.parametrize(
    "metric, value, says",
    [
        ("gpu__time_duration.sum", "-5", "not a number > 0"),  # a negative duration
        ("gpu__time_duration.sum", "0", "not a number > 0"),  # a rate of None
        ("gpu__time_duration.sum", "1e400", "not a number > 0"),  # float: inf
        ("sm__warps_active.avg.pct_of_peak_sustained_active", "-5", ">= 0"),
        ("sm__ops_path_tensor_src_bf16_dst_fp32.sum", "-5", ">= 0"),  # negative FLOP/s
        ("smsp__sass_thread_inst_executed_op_ffma_pred_on.sum", "1e400", ">= 0"),  # inf FLOP/s
    ],
)
def test_an_ncu_value_no_kernel_can_have_is_named(tmp_path, metric, value, says):
    rows = [("0", "k", "gpu__time_duration.sum", "nsecond", "2000")]
    rows += [("0", "k", "sm__warps_active.avg.pct_of_peak_sustained_active", "%", "42.5")]
    assert ncu.parse_ncu(_ncu_csv(tmp_path / "good.csv", rows), "r")[0]["duration_ns"] == 2000
    rows = [r for r in rows if r[2] != metric] + [("0", "k", metric, "nsecond", value)]
    with pytest.raises(ProfileFormatError, match=rf"line \d: {re.escape(metric)}: '{value}' is"):
        ncu.parse_ncu(_ncu_csv(tmp_path / "ncu.csv", rows), "r")
    # a metric the parser does not read keeps whatever value ncu gave it
    rows = rows[:-1] + [("0", "k", metric, "nsecond", "2000"), ("0", "k", "other", "", "-5")]
    assert ncu.parse_ncu(_ncu_csv(tmp_path / "other.csv", rows), "r")


def test_ncu_rows_carry_the_kernels_csv_name(tmp_path):
    # ncu's demangler may spell the name differently from nsys: the pass's target name wins
    f = _ncu_csv(
        tmp_path / "ncu_k1.csv",
        [
            ("0", VECTORIZED.replace("char *", "char*"), "Duration", "nsecond", "2000"),
            ("1", VECTORIZED.replace("char *", "char*"), "Duration", "nsecond", "4000"),
        ],
    )
    (row,) = ncu.parse_ncu(f, "r", kernel=VECTORIZED)
    assert row["kernel"] == VECTORIZED and row["launches"] == 2
    assert row["duration_ns"] == pytest.approx(3000)
    two = _ncu_csv(
        tmp_path / "ncu_k2.csv",
        [("0", "a", "Duration", "nsecond", "1"), ("1", "b", "Duration", "nsecond", "1")],
    )
    with pytest.raises(ProfileFormatError, match="launches of 2 kernels"):
        ncu.parse_ncu(two, "r", kernel="a")


def test_a_file_without_its_final_newline_is_truncated(tmp_path):
    """nsys and ncu end every line with a newline. A file cut inside the last row's unquoted
    name was read as whole (complete files without the newline were accepted), its kernel
    counted under a shorter name: 0.6 and 0.4 shares instead of 0.30 and 0.20."""
    rows = [("0", "k", "Duration", "nsecond", "2000"), ("0", "k", "SM [%]", "%", "50")]
    f = _ncu_csv(tmp_path / "ncu.csv", rows, final_newline=False)
    with pytest.raises(ProfileFormatError, match=r"ncu\.csv, line 3: truncated row"):
        ncu.parse_ncu(f, "r")
    src = (FIX / "nsys-2024.5" / "nsys_rank0_cuda_gpu_kern_sum.csv").read_text()
    cut = tmp_path / "nsys_rank0_cuda_gpu_kern_sum.csv"
    for text in (src.rstrip("\n"), src[:700]):  # whole but for the newline; inside a name
        cut.write_text(text)
        with pytest.raises(ProfileFormatError, match=r"kern_sum\.csv, line \d+: truncated row"):
            nsys.read_nsys_table(cut)
    cut.write_text(src)
    assert nsys.read_nsys_table(cut) == nsys.read_nsys_table(FIX / "nsys-2024.5" / cut.name)
    # cut right after the header: that rank's kernels were left out without a word
    cut.write_text(src[: src.index("\n", src.index("Time (%)")) + 1])
    with pytest.raises(ProfileFormatError, match="a kernel summary with a header and no rows"):
        nsys.read_nsys_table(cut)


def test_a_file_cut_inside_a_quoted_name_is_truncated(tmp_path):
    src = (FIX / "nsys-2024.5" / "nsys_rank0_cuda_gpu_kern_sum.csv").read_text()
    # cut inside the quoted bn_fw name: the row still has all 9 cells
    name = "void cudnn::bn_fw_tr_1C11_kernel_NCHW<__nv_bfloat16, float"
    cut = tmp_path / "nsys_rank0_cuda_gpu_kern_sum.csv"
    cut.write_text(src[: src.index(name) + len(name)])
    with pytest.raises(ProfileFormatError, match=r"kern_sum\.csv, line 9: truncated"):
        nsys.read_nsys_table(cut)
    f = _ncu_csv(tmp_path / "ncu.csv", [("0", "k", "Duration", "nsecond", "2,000")])
    f.write_text(f.read_text().rstrip("\n")[:-5])  # cut inside the quoted "2,000"
    with pytest.raises(ProfileFormatError, match=r"ncu\.csv, line 2: truncated"):
        ncu.parse_ncu(f, "r")


def _nsys_capture(tmp_path, *stats):
    cap = tmp_path / "capture"
    (cap / "stats").mkdir(parents=True)
    for name in stats:
        (cap / "stats" / name).write_bytes((FIX / "nsys-2024.5" / name).read_bytes())
    manifest = {"run": "w2_test", "tool": "nsys", "why": "test", "ranks": "all", "input": "stats"}
    (cap / "tool.json").write_text(json.dumps(manifest))
    return cap


@pytest.fixture
def command_logging():
    """The logging of a `scalestudy` command (cli.main calls log.setup()), undone afterwards."""
    logger = log.setup()
    yield
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    logger.propagate = True
    logger.setLevel(logging.NOTSET)


def test_parse_warns_when_kernels_have_no_phase_ranges(tmp_path, capsys, command_logging):
    cap = _nsys_capture(tmp_path, "nsys_rank0_cuda_gpu_kern_sum.csv")
    # what nsys stats leaves when the window recorded no NVTX range
    (cap / "stats" / "nsys_rank0_nvtx_sum.csv").write_text(
        "SKIPPED: nsys_rank0.sqlite does not contain NVTX data.\n"
    )
    kernels, ranges = _parse(cap, tmp_path)
    assert kernels and ranges == []
    assert (tmp_path / "r.csv").read_text() == ",".join(schema.RANGE_COLUMNS) + "\n"
    err = capsys.readouterr().err
    assert "WARNING w2_test: rank(s) 0 have kernels but none of the phase ranges" in err
    assert "data, forward, backward, optimizer, communication" in err and "nvtx_sum" in err
    # host ranges only (no export, no nvtx_gpu_proj_sum): parsed, labelled host_range, and said
    host = _nsys_capture(
        tmp_path / "host", "nsys_rank0_cuda_gpu_kern_sum.csv", "nsys_rank0_nvtx_sum.csv"
    )
    _, ranges = _parse(host, tmp_path)
    assert ranges and {r["time_base"] for r in ranges} == {"host_range"}
    err = capsys.readouterr().err
    assert "WARNING w2_test: rank(s) 0 have no SQLite export" in err and "not GPU time" in err
    assert "nsys export --type sqlite" in err  # the command that mends it
    # nsys's own projection: GPU time of one thread's launches, labelled and said so
    proj = _nsys_capture(
        tmp_path / "proj",
        "nsys_rank0_cuda_gpu_kern_sum.csv",
        "nsys_rank0_nvtx_sum.csv",
        "nsys_rank0_nvtx_gpu_proj_sum.csv",
    )
    _, ranges = _parse(proj, tmp_path)
    assert {r["time_base"] for r in ranges} == {"gpu_projection_same_thread"}
    err = capsys.readouterr().err
    assert "WARNING w2_test: rank(s) 0 have no SQLite export" in err
    assert "misses the backward's kernels" in err
    # with the export there, the GPU projection of every thread, and no warning
    write_export(proj / "stats" / "nsys_rank0.sqlite")
    _, ranges = _parse(proj, tmp_path)
    assert {r["time_base"] for r in ranges} == {"gpu_projection"}
    assert ranges and "WARNING" not in capsys.readouterr().err


# --- torch.profiler export -----
def test_torch_export_malformed_json_names_file_and_line(tmp_path):
    f = tmp_path / "torch_ops_rank0.json"
    f.write_text('{"ops": [\n{"name": "aten::add_", "count": 3,\n')
    with pytest.raises(ProfileFormatError, match=r"torch_ops_rank0\.json, line 3"):
        torch_ops.parse_torch(tmp_path, "r")
    f.write_text('{"ops": []}')
    with pytest.raises(ProfileFormatError, match="recorded nothing"):
        torch_ops.parse_torch(tmp_path, "r")


def _op(name, count, device_type, self_cpu=0.0, cpu_total=0.0, self_dev=0.0, **extra):
    """One entry of the trainer's torch_ops export (trainer/measure.py torch_ops_export)."""
    return {
        "name": name,
        "count": count,
        "self_cpu_us": self_cpu,
        "cpu_total_us": cpu_total,
        "self_device_us": self_dev,
        "device_type": device_type,
        **extra,
    }


# what key_averages() gives on a GPU, in the form of torch_ops_export (hand-made, in the shape of
# the real exports in tests/fixtures/gpu-h100/: a record_function range is a CPU entry and, on
# the device, a CUDA entry flagged user_annotation)
GPU_OPS = [
    _op("aten::cudnn_convolution", 2, "CPU", 50, 60, device_total_us=300, user_annotation=False),
    _op(
        "sm90_xmma_fprop_implicit_gemm_bf16",
        2,
        "CUDA",
        self_dev=300,
        device_total_us=300,
        user_annotation=False,
    ),
    _op(
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        1,
        "CUDA",
        self_dev=100,
        device_total_us=100,
        user_annotation=False,
    ),
    # the phase: host enqueue time 400 us; its device-side entry (kineto's span of the kernels
    # whose innermost annotation it was) 350 us
    _op("forward", 2, "CPU", 5, 400, device_total_us=300, user_annotation=True),
    _op("forward", 2, "CUDA", self_dev=350, device_total_us=350, user_annotation=True),
    _op("backward", 2, "CPU", 5, 90, device_total_us=100, user_annotation=True),
    _op("backward", 2, "CUDA", self_dev=150, device_total_us=150, user_annotation=True),
    # another range on the device (DDP's): it spans kernels counted themselves, so no kernel
    _op(
        "DistributedDataParallel.forward",
        2,
        "CUDA",
        self_dev=360,
        device_total_us=360,
        user_annotation=True,
    ),
]


def test_torch_export_on_gpu_counts_device_time_of_kernels(tmp_path):
    (tmp_path / "torch_ops_rank3.json").write_text(json.dumps({"ops": GPU_OPS}))
    kernels, ranges = torch_ops.parse_torch(tmp_path, "g")
    assert [(r["kernel"], r["category"], r["total_ns"], r["rank"]) for r in kernels] == [
        ("sm90_xmma_fprop_implicit_gemm_bf16", "conv", 300_000, 3),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "nccl", 100_000, 3),
    ]
    # no trace beside the export: the host's times, labelled as such; never the device-side
    # entries of the ranges (they miss what nested ranges and other threads launched)
    assert [(r["range"], r["time_base"], r["total_ns"], r["instances"]) for r in ranges] == [
        ("forward", "host_range", 400_000, 2),
        ("backward", "host_range", 90_000, 2),
    ]


def _format_1(ops: list[dict]) -> dict:
    """An export of the first format: no user_annotation, no device_total_us."""
    old = ("user_annotation", "device_total_us")
    ops = [{k: v for k, v in op.items() if k not in old} for op in ops]
    return {"format": "scalestudy-torch-ops-1", "time_unit": "us", "ops": ops}


def test_a_gpu_export_before_the_annotation_flag_is_refused(tmp_path):
    """On a GPU, the first format's device-side spans of DDP's and the optimizer's ranges could
    not be told from kernels: the real H100 export so written gave 21.3 ms of "kernels" for
    12.3 ms. Refused in one line; read where no CUDA entry but a phase range (known by name) has
    a CPU twin, and on a CPU (no device-side entries)."""
    real = json.loads((FIX.parent / "gpu-h100" / "torch_ops_rank0.json").read_text())
    f = tmp_path / "torch_ops_rank0.json"
    f.write_text(json.dumps(_format_1(real["ops"])))
    with pytest.raises(ProfileFormatError, match="without user_annotation flags") as err:
        torch_ops.parse_torch(tmp_path, "g")
    message = str(err.value)
    assert str(f) in message and "scalestudy profile capture" in message and "\n" not in message
    assert "'Optimizer.step#SGD.step'" in message or "'DistributedDataParallel.forward'" in message
    # the phase ranges' device-side entries are known by name: the kernels, the host times
    f.write_text(json.dumps(_format_1(GPU_OPS[:5])))
    kernels, ranges = torch_ops.parse_torch(tmp_path, "g")
    assert [r["kernel"] for r in kernels] == [
        "sm90_xmma_fprop_implicit_gemm_bf16",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
    ]
    assert [(r["range"], r["time_base"], r["total_ns"]) for r in ranges] == [
        ("forward", "host_range", 400_000)
    ]
    cpu_ops = [{**op, "self_device_us": 0} for op in GPU_OPS if op["device_type"] == "CPU"]
    f.write_text(json.dumps(_format_1(cpu_ops)))
    kernels, ranges = torch_ops.parse_torch(tmp_path, "c")
    assert [r["kernel"] for r in kernels] == ["aten::cudnn_convolution"]
    assert [(r["range"], r["time_base"], r["total_ns"]) for r in ranges] == [
        ("forward", "host_range", 400_000),
        ("backward", "host_range", 90_000),
    ]


def test_a_second_export_of_one_rank_is_refused_not_taken_for_the_first(tmp_path):
    """torch_ops_rank0.json and a copy beside it (torch_ops_rank0_old.json) are both rank 0's:
    the one that sorted last replaced the other's kernels and phases without a word (nsys's
    reader refuses a second table of one rank)."""
    conv = _op("aten::convolution", 2, "CPU", 900, 900, user_annotation=False)
    add = _op("aten::add", 2, "CPU", 5, 5, user_annotation=False)
    (tmp_path / "torch_ops_rank0.json").write_text(json.dumps({"ops": [conv]}))
    (tmp_path / "torch_ops_rank0_old.json").write_text(json.dumps({"ops": [add]}))
    with pytest.raises(ProfileFormatError, match=r"rank 0 has a second export, the first being"):
        torch_ops.parse_torch(tmp_path, "c")
    (tmp_path / "torch_ops_rank0_old.json").unlink()
    kernels, _ = torch_ops.parse_torch(tmp_path, "c")
    assert [r["kernel"] for r in kernels] == ["aten::convolution"]


def _x(cat, name, ts, dur, tid=1, corr=None):
    """One complete event of a chrome trace (torch.profiler's export_chrome_trace), times in us."""
    e = {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}
    if corr is not None:
        e["args"] = {"correlation": corr, "External id": 99}
    return e


# Two steps in the shape of the H100 trace (tests/fixtures/gpu-h100/), hand-made so that every
# projection is known: the main thread (tid 1) opens the phases; the backward's kernels are
# launched from autograd's device thread (tid 2); a nested range (DDP's) inside forward; a CUDA
# graph launch whose two kernels share its correlation id; a memset; a launch outside any phase.
TRACE_EVENTS = [
    # step 1
    _x("user_annotation", "data", 0, 10),
    _x("user_annotation", "forward", 10, 40),
    _x("user_annotation", "DistributedDataParallel.forward", 12, 30),
    _x("cuda_runtime", "cudaGraphLaunch", 15, 2, corr=1),
    _x("kernel", "triton_poi_fused_0", 100, 20, tid=7, corr=1),
    _x("kernel", "triton_poi_fused_1", 125, 25, tid=7, corr=1),
    _x("cuda_runtime", "cudaLaunchKernel", 45, 1, corr=2),  # the loss, outside DDP's range
    _x("kernel", "nll_loss_forward", 160, 5, tid=7, corr=2),
    _x("user_annotation", "backward", 50, 100),
    _x("cuda_runtime", "cudaLaunchKernel", 60, 1, tid=2, corr=3),
    _x("kernel", "conv_dgrad", 170, 50, tid=7, corr=3),
    _x("cuda_runtime", "cudaMemsetAsync", 70, 1, tid=2, corr=4),
    _x("gpu_memset", "Memset (Device)", 230, 2, tid=7, corr=4),
    _x("user_annotation", "optimizer", 150, 20),
    _x("user_annotation", "Optimizer.step#SGD.step", 151, 18),
    _x("cuda_runtime", "cudaLaunchKernel", 155, 1, corr=5),
    _x("kernel", "multi_tensor_apply_kernel", 240, 10, tid=7, corr=5),
    _x("cuda_runtime", "cudaLaunchKernel", 175, 1, corr=6),  # between steps: no phase
    _x("kernel", "lr_fill", 255, 1, tid=7, corr=6),
    # step 2: the backward launches nothing that reaches the GPU; the optimizer one kernel
    _x("user_annotation", "data", 300, 10),
    _x("user_annotation", "forward", 310, 20),
    _x("cuda_runtime", "cudaGraphLaunch", 315, 2, corr=7),
    _x("kernel", "triton_poi_fused_0", 400, 30, tid=7, corr=7),
    _x("user_annotation", "backward", 330, 20),
    _x("cuda_runtime", "cudaStreamIsCapturing", 335, 1, tid=2, corr=8),  # launches nothing
    _x("user_annotation", "optimizer", 350, 20),
    _x("cuda_runtime", "cudaLaunchKernel", 355, 1, corr=9),
    _x("kernel", "multi_tensor_apply_kernel", 440, 12, tid=7, corr=9),
    # a GPU operation without a correlation id: attributed to nothing
    _x("kernel", "orphan_kernel", 320, 500, tid=7),
    # kineto's own device-side span of a range: not read
    _x("gpu_user_annotation", "forward", 160, 5, tid=7),
    {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "python"}},
]


def test_trace_phases_project_each_range_onto_the_gpu():
    phases = {
        p["name"]: (p["instances"], p["total_ns"])
        for p in torch_ops.trace_phases({"traceEvents": TRACE_EVENTS})
    }
    # forward: 100..165 (the graph's kernels and the loss) + 400..430; backward: 170..232
    # (another thread's launches) + nothing; optimizer: 240..250 + 440..452; data: nothing
    assert phases == {
        "data": (2, 0.0),
        "forward": (2, 95_000.0),
        "backward": (2, 62_000.0),
        "optimizer": (2, 22_000.0),
    }
    # the bare-list form of a chrome trace reads the same
    assert torch_ops.trace_phases(TRACE_EVENTS) == torch_ops.trace_phases(
        {"traceEvents": TRACE_EVENTS}
    )
    # a CPU trace (no GPU operation): nothing projected
    cpu = [e for e in TRACE_EVENTS if e.get("cat") not in torch_ops.GPU_CATEGORIES]
    assert torch_ops.trace_phases({"traceEvents": cpu}) == []


def test_parse_torch_reads_the_trace_beside_the_export(tmp_path):
    (tmp_path / "torch_ops_rank1.json").write_text(json.dumps({"ops": GPU_OPS}))
    (tmp_path / "trace_rank1.json").write_text(json.dumps({"traceEvents": TRACE_EVENTS}))
    kernels, ranges = torch_ops.parse_torch(tmp_path / "torch_ops_rank1.json", "g")
    assert len(kernels) == 2  # the kernels still come from the export
    assert [(r["range"], r["time_base"], r["rank"], r["total_ns"]) for r in ranges] == [
        ("data", "gpu_projection", 1, 0),
        ("forward", "gpu_projection", 1, 95_000),
        ("backward", "gpu_projection", 1, 62_000),
        ("optimizer", "gpu_projection", 1, 22_000),
    ]
    assert sum(r["share"] for r in ranges) == pytest.approx(1.0)
    # a CPU run's trace has no GPU operation: the host times, as without a trace
    cpu = [e for e in TRACE_EVENTS if e.get("cat") not in torch_ops.GPU_CATEGORIES]
    (tmp_path / "trace_rank1.json").write_text(json.dumps({"traceEvents": cpu}))
    _, ranges = torch_ops.parse_torch(tmp_path, "g")
    assert {r["time_base"] for r in ranges} == {"host_range"}


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"traceEvents": [', "malformed JSON"),
        (
            json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "args": {"correlation": 1}}]}),
            "bad event",
        ),
        (json.dumps("a string"), "not a torch.profiler chrome trace"),
    ],
)
def test_a_broken_trace_is_named(tmp_path, text, why):
    (tmp_path / "torch_ops_rank0.json").write_text(json.dumps({"ops": GPU_OPS}))
    (tmp_path / "trace_rank0.json").write_text(text)
    with pytest.raises(ProfileFormatError, match=rf"trace_rank0\.json.*{why}"):
        torch_ops.parse_torch(tmp_path, "g")


@pytest.mark.parametrize(
    "field, value, why",
    [
        ("count", float("inf"), "count is inf, not a whole number >= 1"),  # was a traceback
        ("count", -1, "count is -1, not a whole number >= 1"),  # a row of -1 instances
        ("count", 2.5, "count is 2.5, not a whole number >= 1"),  # read as 2
        ("count", True, "count is True"),  # read as 1
        ("self_device_us", -1, "self_device_us is -1, not a finite number >= 0"),
        ("self_device_us", float("inf"), "self_device_us is inf"),  # round(inf): a traceback
        ("self_device_us", [], "self_device_us is []"),  # read as 0
        ("cpu_total_us", float("nan"), "cpu_total_us is nan"),  # round(nan): a traceback
        ("user_annotation", "no", "user_annotation is 'no', not true or false"),  # read as true
    ],
)
def test_an_export_entry_the_trainer_cannot_have_written_is_named(tmp_path, field, value, why):
    """Each value became a wrong profile CSV row (a negative share or count) or a traceback."""
    ops = [dict(op) for op in GPU_OPS]
    ops[1][field] = value  # the bf16 kernel
    (tmp_path / "torch_ops_rank0.json").write_text(json.dumps({"ops": ops}))
    with pytest.raises(ProfileFormatError, match=re.escape(why)) as info:
        torch_ops.parse_torch(tmp_path, "g")
    assert "op 1: bad entry" in str(info.value) and str(info.value).endswith(torch_ops.RECAPTURE)
    (tmp_path / "torch_ops_rank0.json").write_text(json.dumps({"ops": 1}))
    with pytest.raises(ProfileFormatError, match="'ops' is 1, not a list"):
        torch_ops.parse_torch(tmp_path, "g")  # was a TypeError traceback
    # a key left out, an entry that is no object: named in words, not "bad entry ... ('count')"
    # (a KeyError's repr) or "'int' object has no attribute 'get'"
    ops[1] = {k: v for k, v in GPU_OPS[1].items() if k != "count"}
    for bad, said in [(ops[1], "op 1 has no 'count' ("), (7, "op 1 is 7, not an object; ")]:
        (tmp_path / "torch_ops_rank0.json").write_text(json.dumps({"ops": [ops[0], bad]}))
        with pytest.raises(ProfileFormatError, match=re.escape(said)) as info:
            torch_ops.parse_torch(tmp_path, "g")
        assert str(info.value).endswith(torch_ops.RECAPTURE), str(info.value)


@pytest.mark.parametrize(
    "cat, field, value",
    [
        ("kernel", "dur", float("nan")),  # was a traceback
        ("kernel", "dur", -3.0),  # a negative projected phase time
        ("cuda_runtime", "ts", float("inf")),
        ("user_annotation", "dur", "abc"),
    ],
)
def test_a_trace_event_without_a_finite_time_is_named(tmp_path, cat, field, value):
    events = [dict(e) for e in TRACE_EVENTS]
    event = next(e for e in events if e.get("cat") == cat and e.get("ph") == "X")
    event[field] = value
    (tmp_path / "torch_ops_rank0.json").write_text(json.dumps({"ops": GPU_OPS}))
    (tmp_path / "trace_rank0.json").write_text(json.dumps({"traceEvents": events}))
    with pytest.raises(ProfileFormatError, match=rf"bad event: '.*': {field} is {value!r}"):
        torch_ops.parse_torch(tmp_path, "g")
    # a trace without its event list was read as one without GPU operations (host times)
    (tmp_path / "trace_rank0.json").write_text(json.dumps({"schemaVersion": 1}))
    with pytest.raises(ProfileFormatError, match="traceEvents is None, not a list of events"):
        torch_ops.parse_torch(tmp_path, "g")


def test_a_cpu_run_without_collectives_never_reads_its_trace(tmp_path):
    """A CPU export (no device time) has nothing to project: the trace beside it, megabytes per
    rank in a study, is not read without a collective, so even a broken one does not matter;
    the host times."""
    cpu_ops = [op for op in GPU_OPS if op["device_type"] == "CPU"]
    cpu_ops = [{**op, "self_device_us": 0, "device_total_us": 0} for op in cpu_ops]
    (tmp_path / "torch_ops_rank0.json").write_text(json.dumps({"ops": cpu_ops}))
    (tmp_path / "trace_rank0.json").write_text('{"traceEvents": [')
    kernels, ranges = torch_ops.parse_torch(tmp_path, "c")
    assert [r["kernel"] for r in kernels] == ["aten::cudnn_convolution"]  # by self CPU time
    assert [(r["range"], r["time_base"], r["total_ns"]) for r in ranges] == [
        ("forward", "host_range", 400_000),
        ("backward", "host_range", 90_000),
    ]


def test_a_compiled_cpu_run_keeps_its_graphs_time():
    """A compiled run on a CPU (tests/fixtures/cpu-compiled/, the trainer's export): inductor's
    fused C++ kernels are no profiler events; their time, the self time of `## Call
    CompiledFxGraph <hash> ##`, was dropped with the profiler's markers (18 % of the window's
    op time here). Every op's self time is a row now, the graphs' as category compiled."""
    fixture = FIX.parent / "cpu-compiled" / "torch_ops_rank0.json"
    ops = json.loads(fixture.read_text())["ops"]
    kernels, ranges = torch_ops.parse_torch(fixture, "c")
    graphs = [r for r in kernels if r["kernel"].startswith("## Call CompiledFxGraph")]
    assert len(graphs) == 2 and {r["category"] for r in graphs} == {"compiled"}  # fwd, bwd
    # every op's self time once: all entries but the phase ranges (their self time is the
    # host's between ops; no profiler marker here), the one rank's gloo all-reduce (no trace
    # beside the fixture) by its whole time
    counted = [op for op in ops if op["name"] not in schema.RANGES]
    assert not any(op["name"].startswith("ProfilerStep") for op in counted)
    us = sum(
        op["cpu_total_us" if op["name"] == "gloo:all_reduce" else "self_cpu_us"] for op in counted
    )
    assert sum(r["total_ns"] for r in kernels) == pytest.approx(us * 1e3, abs=len(counted))
    compiled_share = sum(r["share"] for r in graphs)
    assert 0.1 < compiled_share < 0.3
    assert {r["time_base"] for r in ranges} == {"host_range"}


# One gloo all-gather of a real 2-rank FSDP capture on a CPU (torch 2.14, trainer --strategy
# fsdp; times in us, shifted to 0): c10d records the collective on gloo's thread (tid 2) as a
# user annotation whose export entry has no self time, only its inclusive time; gloo ran ATen ops
# inside it there (the output copies), which the export counts by their own self time. The main
# thread (tid 1) computed and enqueued meanwhile.
GLOO_SPAN = (0.0, 221.581)
GLOO_TRACE = [
    _x("user_annotation", "forward", -50.0, 400.0),
    _x("cpu_op", "c10d::_allgather_base_", -10.0, 12.0),
    _x("cpu_op", "aten::convolution_backward", 5.0, 300.0),  # overlaps, another thread
    _x("user_annotation", "gloo:all_gather", *GLOO_SPAN, tid=2),
    _x("cpu_op", "aten::view", 3.185, 1.803, tid=2),
    _x("cpu_op", "aten::empty", 6.470, 1.382, tid=2),
    _x("cpu_op", "aten::select", 201.841, 3.696, tid=2),
    _x("cpu_op", "aten::as_strided", 203.975, 0.58, tid=2),  # inside the select
    _x("cpu_op", "aten::copy_", 206.098, 2.413, tid=2),
    _x("cpu_op", "aten::select", 209.072, 1.022, tid=2),
    _x("cpu_op", "aten::as_strided", 209.473, 0.22, tid=2),
    _x("cpu_op", "aten::copy_", 210.284, 0.681, tid=2),
    _x("cpu_op", "aten::add_", 230.0, 4.0, tid=2),  # after the collective
]
GLOO_OPS = [
    _op("forward", 1, "CPU", 88.0, 400.0, user_annotation=True),
    _op("c10d::_allgather_base_", 1, "CPU", 12.0, 12.0, user_annotation=False),
    _op("aten::convolution_backward", 1, "CPU", 300.0, 300.0, user_annotation=False),
    _op("gloo:all_gather", 1, "CPU", 0.0, 221.581, user_annotation=True),
    _op("aten::view", 1, "CPU", 1.803, 1.803, user_annotation=False),
    _op("aten::empty", 1, "CPU", 1.382, 1.382, user_annotation=False),
    _op("aten::select", 2, "CPU", 3.918, 4.718, user_annotation=False),
    _op("aten::as_strided", 2, "CPU", 0.8, 0.8, user_annotation=False),
    _op("aten::copy_", 2, "CPU", 3.094, 3.094, user_annotation=False),
    _op("aten::add_", 1, "CPU", 4.0, 4.0, user_annotation=False),
]


def test_a_cpu_collective_counts_its_time_on_gloos_thread_once(tmp_path):
    """A CPU run's gloo collective has no self time in the export: it was dropped, and the
    "nccl" category held only the c10d call's enqueue time, 1 process or 2. Now it counts its
    time on gloo's thread less the ops it ran there, which count by their own self time: every
    microsecond of both threads once."""
    export = tmp_path / "torch_ops_rank0.json"
    export.write_text(json.dumps({"ops": GLOO_OPS}))
    (tmp_path / "trace_rank0.json").write_text(json.dumps({"traceEvents": GLOO_TRACE}))
    kernels, _ = torch_ops.parse_torch(tmp_path, "c")
    rows = {r["kernel"]: r for r in kernels}
    # the ops gloo ran inside, each instant once (as_strided inside its select)
    nested = 1.803 + 1.382 + 3.696 + 2.413 + 1.022 + 0.681
    gloo = rows["gloo:all_gather"]
    assert gloo["category"] == "nccl" and gloo["instances"] == 1
    assert gloo["total_ns"] == round((GLOO_SPAN[1] - nested) * 1e3)
    # both threads' busy time, once: the main thread's ops and gloo's whole span plus the add_;
    # the c10d call's last 2 us ran beside the collective (its span counts them), the
    # convolution's 300 us beside it are compute overlapping it, counted as such
    main = 12.0 - 2.0 + 300.0
    assert rows["c10d::_allgather_base_"]["total_ns"] == 10_000
    assert rows["aten::convolution_backward"]["total_ns"] == 300_000
    assert sum(r["total_ns"] for r in kernels) == pytest.approx((main + GLOO_SPAN[1] + 4.0) * 1e3)
    assert sum(r["share"] for r in kernels if r["category"] == "nccl") == pytest.approx(
        (10.0 + GLOO_SPAN[1] - nested) / (main + GLOO_SPAN[1] + 4.0)
    )
    # without the trace: the collective's whole time (its nested ops then count twice)
    (tmp_path / "trace_rank0.json").unlink()
    kernels, _ = torch_ops.parse_torch(tmp_path, "c")
    assert {r["kernel"]: r["total_ns"] for r in kernels}["gloo:all_gather"] == 221_581
    # an export of the first format (no user_annotation flag): the collective is known by name
    unflagged = [{k: v for k, v in op.items() if k != "user_annotation"} for op in GLOO_OPS]
    export.write_text(json.dumps({"ops": unflagged}))
    kernels, _ = torch_ops.parse_torch(tmp_path, "c")
    assert {r["kernel"]: r["total_ns"] for r in kernels}["gloo:all_gather"] == 221_581


# One FSDP reduce-scatter of the real 2-rank FSDP capture on a CPU (torch 2.14, trainer --strategy
# fsdp --cpus-per-rank 1, rank 0's FSDP::post_backward_reduce (layer4.1); times in us, shifted to
# its start; the main thread's (tid 1) direct children of the range and of the c10d call, gloo's
# thread (tid 2) whole): FSDP copies the gradients in, calls c10d, which hands the reduce-scatter
# to gloo's thread (gloo:all_reduce, from 172.798 us, while the c10d call still runs: one core per
# rank) and returns; the range then waits for it, as self time (no event), until it ends at
# 1725.004 us, and copies the shards out.
RS_SPAN = (172.798, 172.798 + 1552.206)
RS_TRACE = [
    _x("user_annotation", "FSDP::post_backward_reduce (layer4.1)", 0.0, 1857.592),
    _x("cpu_op", "aten::empty", 45.357, 1.022),
    _x("cpu_op", "aten::view", 49.104, 2.724),
    _x("cpu_op", "fsdp::chunk_cat", 62.293, 37.766),
    _x("cpu_op", "aten::_chunk_cat", 73.459, 24.627),
    _x("cpu_op", "aten::empty", 105.237, 0.861),
    _x("cpu_op", "c10d::_reduce_scatter_base_", 131.566, 99.068),
    _x("cpu_op", "aten::clone", 137.436, 7.211),
    _x("user_annotation", "gloo:all_reduce", RS_SPAN[0], 1552.206, tid=2),
    _x("cpu_op", "aten::div_", 1688.561, 24.276, tid=2),
    _x("cpu_op", "aten::div_", 1694.068, 18.407, tid=2),
    _x("cpu_op", "aten::to", 1697.413, 10.996, tid=2),
    _x("cpu_op", "aten::chunk", 1732.766, 9.725),
    _x("cpu_op", "aten::copy_", 1742.811, 2.424),
    _x("cpu_op", "aten::as_strided", 1770.372, 2.463),
    _x("cpu_op", "aten::as_strided", 1807.247, 0.47),
    _x("cpu_op", "aten::as_strided", 1816.301, 0.341),
    _x("cpu_op", "aten::as_strided", 1822.69, 0.811),
    _x("cpu_op", "aten::as_strided", 1829.039, 0.381),
    _x("cpu_op", "aten::as_strided", 1834.507, 0.251),
]
# the export's entries of that window (self time: the span less its direct children's)
RS_CHILDREN = 1.022 + 2.724 + 37.766 + 0.861 + 99.068 + 9.725 + 2.424
RS_CHILDREN += 2.463 + 0.47 + 0.341 + 0.811 + 0.381 + 0.251
RS_OPS = [
    _op("FSDP::post_backward_reduce (layer4.1)", 1, "CPU", 1857.592 - RS_CHILDREN, 1857.592,
        user_annotation=True),
    _op("c10d::_reduce_scatter_base_", 1, "CPU", 99.068 - 7.211, 99.068, user_annotation=False),
    _op("gloo:all_reduce", 1, "CPU", 0.0, 1552.206, user_annotation=True),
    _op("fsdp::chunk_cat", 1, "CPU", 37.766 - 24.627, 37.766, user_annotation=False),
    _op("aten::_chunk_cat", 1, "CPU", 24.627, 24.627, user_annotation=False),
    _op("aten::div_", 2, "CPU", 24.276 - 10.996, 42.683, user_annotation=False),
    _op("aten::to", 1, "CPU", 10.996, 10.996, user_annotation=False),
]  # fmt: skip


def test_a_wait_for_a_cpu_collective_is_not_counted_beside_it(tmp_path):
    """The main thread's calls that start or wait for a collective (category nccl) counted their
    whole self time: inside gloo's span that is the collective again, counted by its own time on
    gloo's thread (39 % of a real FSDP run's counted time was counted twice). They count their
    self time outside the spans of the rank's collectives now: the collective once."""
    (tmp_path / "torch_ops_rank0.json").write_text(json.dumps({"ops": RS_OPS}))
    (tmp_path / "trace_rank0.json").write_text(json.dumps({"traceEvents": RS_TRACE}))
    kernels, _ = torch_ops.parse_torch(tmp_path, "c")
    rows = {r["kernel"]: r for r in kernels}
    self_us = {op["name"]: op["self_cpu_us"] for op in RS_OPS}
    # the c10d call ran 57.836 us beside the collective (to 230.634), the range waited the rest
    c10d_inside = 131.566 + 99.068 - RS_SPAN[0]
    fsdp, c10d = "FSDP::post_backward_reduce (layer4.1)", "c10d::_reduce_scatter_base_"
    assert rows[c10d]["total_ns"] == round((self_us[c10d] - c10d_inside) * 1e3)
    wait = RS_SPAN[1] - RS_SPAN[0] - c10d_inside
    assert rows[fsdp]["total_ns"] == round((self_us[fsdp] - wait) * 1e3)
    assert rows[fsdp]["category"] == rows[c10d]["category"] == "nccl"
    # gloo's own time less the ops it ran (the outer div_ holds the rest)
    assert rows["gloo:all_reduce"]["total_ns"] == round((1552.206 - 24.276) * 1e3)
    # the collective's span counted once: the main thread's calls lose exactly its length
    nccl = sum(r["total_ns"] for r in kernels if r["category"] == "nccl")
    assert nccl == pytest.approx(
        (self_us[fsdp] + self_us[c10d] + self_us["gloo:all_reduce"] + 1552.206 - 24.276) * 1e3
        - (RS_SPAN[1] - RS_SPAN[0]) * 1e3,
        abs=3,
    )
    # the copies and the ops on gloo's thread keep their self time
    assert rows["fsdp::chunk_cat"]["category"] == "memcpy"
    for name in ("fsdp::chunk_cat", "aten::_chunk_cat", "aten::div_", "aten::to"):
        assert rows[name]["total_ns"] == round(self_us[name] * 1e3)
    # without the trace: every call's whole self time, the collective's whole span
    (tmp_path / "trace_rank0.json").unlink()
    rows = {r["kernel"]: r for r in torch_ops.parse_torch(tmp_path, "c")[0]}
    assert rows[fsdp]["total_ns"] == round(self_us[fsdp] * 1e3)
    assert rows["gloo:all_reduce"]["total_ns"] == 1_552_206


def test_trim_trace_keeps_what_the_projection_reads():
    doc = {"schemaVersion": 1, "traceEvents": TRACE_EVENTS, "deviceProperties": [{"id": 0}]}
    one = gpu_check_report.trim_trace(doc, steps=1)
    assert "deviceProperties" not in one and one["schemaVersion"] == 1
    # the first step's projections, untouched by the cut
    assert {p["name"]: p["total_ns"] for p in torch_ops.trace_phases(one)} == {
        "data": 0.0,
        "forward": 65_000.0,
        "backward": 62_000.0,
        "optimizer": 10_000.0,
    }
    assert all(set(e.get("args", {})) <= {"correlation"} for e in one["traceEvents"])
    both = gpu_check_report.trim_trace(doc, steps=2)
    assert torch_ops.trace_phases(both) == torch_ops.trace_phases(doc)


# --- commands a cluster runs -----
def test_tool_choice_auto_and_explicit():
    assert capture.choose_tool("auto", "cuda", "/opt/nsys/bin/nsys")[0] == "nsys"
    tool, why = capture.choose_tool("auto", "cuda", None)
    assert tool == "torch" and "not on PATH" in why
    assert capture.choose_tool("auto", "cpu", "/opt/nsys")[0] == "torch"
    with pytest.raises(ProfileError, match="module load"):
        capture.choose_tool("nsys", "cuda", None)
    with pytest.raises(ProfileError, match="hardware.device: cpu"):
        capture.choose_tool("nsys", "cpu", "/opt/nsys")


CONFIG_SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
# dotted words of the profiling messages that are no config key (the tool, by its module name)
NOT_CONFIG_KEYS = {"torch.profiler"}


def _config_key(path: str) -> dict | None:
    """The schema of study config key `path` (profiling.ncu.enabled), None where there is none."""
    node = CONFIG_SCHEMA
    for part in path.split("."):
        node = node.get("properties", {}).get(part)
        if node is None:
            return None
    return node


def test_profiling_messages_name_real_config_keys(tmp_path, capsys):
    """The errors and tool.json's `why` of `profile capture` and `profile ncu` name the study
    config key a user changes; a module split rewrote them to `schema.tool` and
    `schema.ncu.enabled`, keys no study has (`--config schema.tool=torch` is refused). Every
    dotted key they name must be a key of workflow/schemas/config.schema.yaml, and every value
    they state or offer for it one that key allows."""
    messages = [
        capture.choose_tool(*a)[1]
        for a in [("torch", "cuda", None), ("nsys", "cuda", "/opt/nsys"), ("auto", "cpu", None),
                  ("auto", "cuda", None), ("auto", "cuda", "/opt/nsys")]
    ]  # fmt: skip
    for a in [("nsys", "cpu", "/opt/nsys"), ("nsys", "cuda", None)]:
        with pytest.raises(ProfileError) as exc:
            capture.choose_tool(*a)
        messages.append(str(exc.value))
    messages.append(ncu_job.ncu_refusal("==ERROR== ERR_NVGPUCTRPERM - no permission"))
    # the command's own line where ncu cannot run at all (no GPU): before anything runs
    argv = ["profile", "ncu", "--run", "r", "--kernels", str(tmp_path / "k.csv"),
            "--enabled", "true", "--out-dir", str(tmp_path / "n"), "--device", "cpu",
            "--", "--epochs", "1"]  # fmt: skip
    assert cli.main(argv) == 2
    messages.append(capsys.readouterr().err.strip().splitlines()[-1])
    key = r"[a-z_]{2,}(?:\.[a-z_]{2,})+"
    named = set()
    for message in messages:
        for word in set(re.findall(rf"\b{key}\b", message)) - NOT_CONFIG_KEYS:
            assert _config_key(word) is not None, f"{word!r} is no study config key: {message}"
            named.add(word)
        # "KEY is VALUE", "KEY: VALUE", "use KEY VALUE or VALUE"
        offered = re.findall(rf"\b({key})(?: is|:) ([a-z]+)\b", message)
        for word, first, second in re.findall(rf"use ({key}) ([a-z]+)(?: or ([a-z]+))?", message):
            offered += [(word, first), *([(word, second)] if second else [])]
        for word, value in offered:
            allowed = {str(v).lower() for v in _config_key(word)["enum"]}
            assert value in allowed, f"{word} {value!r} is not allowed ({allowed}): {message}"
    assert {"profiling.tool", "profiling.ncu.enabled", "hardware.device"} <= named


@pytest.mark.parametrize(
    "manifest",
    [
        {"tool": "torch", "input": "trace_rank0.json", "why": "no GPU", "world_size": 1},
        {"tool": "nsys", "input": "nsys_rank0.sqlite", "why": ""},
        "not json",
    ],
)
def test_ncu_refuses_an_out_dir_holding_another_tools_manifest(tmp_path, capsys, manifest):
    """`profile ncu --out-dir <a capture's directory>` removed the capture's tool.json (its
    completion marker: the capture could no longer be parsed) and wrote ncu's in its place."""
    out_dir = tmp_path / "cap"
    out_dir.mkdir()
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    (out_dir / "tool.json").write_text(text)
    argv = ["profile", "ncu", "--run", "r", "--kernels", str(tmp_path / "k.csv"),
            "--out-dir", str(out_dir), "--device", "cpu", "--", "--epochs", "1"]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not ncu's" in err[0], err
    assert (out_dir / "tool.json").read_text() == text
    (out_dir / "tool.json").write_text(json.dumps({"tool": "none", "why": "auto: no GPU"}))
    assert cli.main(argv) == 0  # an earlier run of ncu's own: replaced


def test_nsys_commands():
    cmd = capture.nsys_profile_command(
        "d/nsys_rank3", "cuda,nvtx", ["python", "-m", "scalestudy", "train"]
    )
    assert cmd[:2] == ["nsys", "profile"]
    assert "--capture-range=cudaProfilerApi" in cmd and "--capture-range-end=stop" in cmd
    assert "--cuda-graph-trace=node" in cmd  # CUDA graphs' kernels, one row each
    assert "--output=d/nsys_rank3" in cmd and cmd[-4:] == ["python", "-m", "scalestudy", "train"]
    new = capture.nsys_stats_command(
        "r.nsys-rep",
        "s/nsys_rank0",
        capture.nsys_version("NVIDIA Nsight Systems version 2024.5.1.113-245134619542v0"),
        "s/nsys_rank0.sqlite",
    )
    assert [new[i + 1] for i, a in enumerate(new) if a == "--report"] == list(
        capture.NSYS_REPORTS_NEW
    )
    old = capture.nsys_stats_command("r.nsys-rep", "s/x", (2022, 4), "s/x.sqlite")
    assert [old[i + 1] for i, a in enumerate(old) if a == "--report"] == [
        "gpukernsum",
        "gpumemtimesum",
        "nvtxsum",
    ]
    assert new[-1] == "r.nsys-rep" and "csv" in new
    # the SQLite export the phases' GPU time is read from, where the parser looks for it
    assert new[new.index("--sqlite") + 1] == "s/nsys_rank0.sqlite" and "--force-export=true" in new
    assert "nvtx_gpu_proj_sum" not in new + old  # one thread's launches only: not asked
    # the profiler given by path (the host's installation, bound into the container)
    exe = "/opt/nvidia/nsight-systems/2025.1.1/bin/nsys"
    assert capture.nsys_profile_command("d/x", "cuda", ["python"], exe)[:2] == [exe, "profile"]


MULTI_TENSOR = (
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
    "namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor"
    "<float, 2, 2, 0>, std::plus<float>, float>(T1, T2, T3...)"
)
VECTORIZED = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
    "std::array<char *, 1>>(int, T2, T3)"
)


@pytest.mark.parametrize(
    "name, other",
    [
        # the function base name of this one is empty ('(anonymous namespace)' comes first)
        (MULTI_TENSOR, MULTI_TENSOR.replace("TensorListMetadata<2>", "TensorListMetadata<3>")),
        # templated: a base name would also match every other functor's instantiation
        (VECTORIZED, VECTORIZED.replace("FillFunctor<float>", "FillFunctor<c10::BFloat16>")),
        (
            "void cutlass_cudnn_train::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized>"
            "(T1::Params)",
            "void cutlass_cudnn_train::Kernel<cutlass_tensorop_bf16_s16816dgrad_optimized>"
            "(T1::Params)",
        ),
        (
            "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64",
            "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize64x128x64",
        ),
    ],
)
def test_ncu_filter_is_the_whole_demangled_name(name, other):
    regex = ncu_kernels.ncu_kernel_regex(name)
    assert regex not in ("", "^$") and re.fullmatch(regex, name)
    assert not re.search(regex, other)  # one instantiation, not its siblings
    # ncu's demangler may print 'char*' for 'char *' and omit the return type
    assert re.search(regex, name.replace("char *", "char*").removeprefix("void "))
    entry = ncu_kernels.candidate(name, 10)
    assert ncu_job.kernel_problem(entry) is None  # what the ncu job reads
    cmd = ncu_job.ncu_command("d/ncu_k0", entry, 7, 3, ["python", "t.py"])
    assert cmd[cmd.index("--kernel-name-base") + 1] == "demangled"
    assert cmd[cmd.index("--kernel-name") + 1] == f"regex:{regex}"
    # the filter survives the per-rank wrapper's shell quoting
    prefix = capture.rank_prefix(tool="ncu", ranks="0", dir="d", index=0, kernel=name)
    argv = shlex.split(prefix)
    assert argv[argv.index("--kernel") + 1] == name


def test_ncu_filter_takes_ncu_casts_of_negative_template_arguments():
    # ncu prints a literal template argument with its type, (int)4; a negative one as (int)-1
    regex = ncu_kernels.ncu_kernel_regex("void foo<-1, 3ul>(int)")
    assert re.fullmatch(regex, "void foo<-1, 3ul>(int)")
    assert re.fullmatch(regex, "void foo<(int)-1, (unsigned long)3>(int)")
    assert not re.search(regex, "void foo<(int)1, (unsigned long)3>(int)")


def test_ncu_command_and_import():
    entry = ncu_kernels.candidate(VECTORIZED, 20)
    cmd = ncu_job.ncu_command("d/ncu_k0", entry, 10, 3, ["python", "t.py"])
    joined = shlex.join(cmd)
    for part in (
        "--profile-from-start off",
        "--clock-control none",  # the clocks the timed runs see, not ncu's locked base clocks
        "--set full",
        "--launch-skip 10",
        "--launch-count 3",
        "--export d/ncu_k0",
    ):
        assert part in joined
    assert cmd[-2:] == ["python", "t.py"]
    assert cmd.index("--clock-control") < cmd.index("python")  # an ncu option, not the app's
    metrics = cmd[cmd.index("--metrics") + 1].split(",")
    assert f"regex:{ncu.TENSOR_METRIC.pattern}" in metrics
    imp = ncu_job.ncu_import_command("d/ncu_k0.ncu-rep")
    assert imp[imp.index("--print-metric-name") + 1] == "name" and "--csv" in imp
    with pytest.raises(ProfileError, match="empty"):
        ncu_kernels.ncu_kernel_regex("  ")


def test_the_ncu_kernels_are_rank_0s_by_time_and_leave_launches_to_profile():
    def row(kernel, rank, instances, total_ns, category="conv"):
        return {"kernel": kernel, "rank": str(rank), "instances": str(instances),
                "total_ns": str(total_ns), "category": category}  # fmt: skip

    rows = [
        row("once_per_step", 0, 10, 500),  # 10-step window: skip 10 would profile nothing
        row("once_per_step", 1, 12, 9000),  # rank 1's time chooses nothing: ncu profiles rank 0
        row("many", 0, 400, 1000),
        row("rare", 0, 2, 100),
        row("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 10, 10**9, "nccl"),
        row("not_on_rank0", 1, 8, 10**6),
        row("not_on_rank0", 2, 6, 10**6),
    ]
    found = ncu_kernels.candidates(rows)
    assert [(k["kernel"], k["instances"]) for k in found] == [
        ("many", 400), ("once_per_step", 10), ("rare", 2)
    ]  # fmt: skip
    assert all(ncu_job.kernel_problem(k) is None for k in found)
    assert [ncu_job.launch_skip(k, 10, 3) for k in found] == [10, 7, 0]
    # a capture without rank 0: every rank's kernels, each with its fewest launches
    found = ncu_kernels.candidates([r for r in rows if r["rank"] != "0"])
    assert [(k["kernel"], k["instances"]) for k in found] == [
        ("not_on_rank0", 6), ("once_per_step", 12)
    ]  # fmt: skip
    assert ncu_job.launch_skip(found[0], 10, 3) == 3


def test_top_kernels_never_include_nccl():
    kernels, _ = nsys.parse_nsys(FIX / "nsys-2024.5", "r")
    top = schema.top_kernels(kernels, 6)
    assert len(top) == 6 and not any(classify(k) in ("nccl", "memcpy") for k in top)
    assert top[0].startswith("sm90_xmma_fprop")


@pytest.mark.parametrize(
    "ranks, env, profiled",
    [
        ("all", {"SLURM_PROCID": "3"}, True),
        ("0", {"SLURM_PROCID": "3"}, False),
        ("0", {"RANK": "0"}, True),
        ("0", {}, True),
        # one torchrun per node inside an allocation: RANK wins, as the trainer reads it
        # (dist.py); SLURM_PROCID first had every rank of node 0 profiled (and write one file)
        ("0", {"SLURM_PROCID": "0", "RANK": "3"}, False),
        ("all", {"SLURM_PROCID": "0", "RANK": "3"}, True),
    ],
)
def test_rank_wrapper_profiles_the_chosen_ranks(ranks, env, profiled):
    args = argparse.Namespace(
        tool="nsys",
        ranks=ranks,
        dir="out",
        trace="cuda,nvtx",
        cmd=["--", "python", "-m", "scalestudy", "train"],
    )
    cmd = capture.rank_command(args, env)
    assert (cmd[0] == "nsys") is profiled
    if profiled:
        rank = env.get("RANK", env.get("SLURM_PROCID", "0"))
        assert f"--output=out/nsys_rank{rank}" in cmd
    assert cmd[-4:] == ["python", "-m", "scalestudy", "train"]
    args.profiler = "/opt/nvidia/nsight-systems/2025.1.1/bin/nsys"
    cmd = capture.rank_command(args, env)
    assert (cmd[0] == args.profiler) is profiled


def test_rank_wrapper_without_a_command_is_one_line(capsys):
    assert cli.main(["profile", "rank", "--tool", "nsys", "--dir", "d", "--"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "scalestudy profile rank: no command after --"
    ]


def _install(root: Path, rel: str) -> Path:
    exe = root / rel
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text("#!/bin/sh\n")
    return exe


def test_profiler_install_is_the_directory_bound_into_the_image(tmp_path):
    nsys_root = tmp_path / "nvidia" / "nsight-systems" / "2025.1.1"
    nsys_exe = _install(nsys_root, "bin/nsys")
    link = tmp_path / "local-bin" / "nsys"  # /usr/local/bin/nsys -> the installation
    link.parent.mkdir()
    link.symlink_to(nsys_exe)
    assert capture.profiler_install(str(link)) == (str(nsys_exe), str(nsys_root))
    target = _install(nsys_root, "target-linux-x64/nsys")  # some modules put this on PATH
    assert capture.profiler_install(str(target)) == (str(target), str(nsys_root))
    ncu_root = tmp_path / "nvidia" / "nsight-compute" / "2025.3.0"
    assert capture.profiler_install(str(_install(ncu_root, "ncu")))[1] == str(ncu_root)
    toolkit = tmp_path / "cuda-13.0"  # the toolkit's bin/ncu reaches ../nsight-compute-*/
    assert capture.profiler_install(str(_install(toolkit, "bin/ncu")))[1] == str(toolkit)
    with pytest.raises(ProfileError, match="system directory /usr, which cannot be bound"):
        capture.profiler_install("/usr/bin/nsys")


def test_a_profile_job_reads_its_image_once(tmp_path, monkeypatch):
    """Each ncu pass's command (and the capture's inventory) hashed the whole .sif again: five
    passes, five reads of a multi-GB image on a shared file system inside the job's limit."""
    image = tmp_path / "trainer.sif"
    image.write_bytes(b"image")
    reads = []
    real = container_exec.files.sha256
    monkeypatch.setattr(container_exec.files, "sha256", lambda p: reads.append(p) or real(p))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    args = _launch_args(1, 1, None, device="cuda")
    args.container, args.gpu = str(image), True
    capture.hash_image_once(args)
    commands = [capture.launch_command(args, None) for _ in range(5)]
    assert len(reads) == 1
    digest = f"{container_exec.DIGEST_ENV}={container_exec.image_digest(image)}"
    assert all(digest in cmd for cmd in commands), commands[0]


def test_in_the_container_the_profiler_runs_inside_around_the_trainer(tmp_path, monkeypatch):
    """apptainer exec [--bind install] IMAGE python -m scalestudy profile rank --profiler P ...
    -- python -m scalestudy train: the profiler is a process of the container, the trainer its
    child; never nsys around `apptainer exec`."""
    image = tmp_path / "trainer.sif"
    image.write_bytes(b"image")
    exe = _install(tmp_path / "nsight-systems" / "2025.1.1", "bin/nsys")
    args = _launch_args(1, 1, None, device="cuda")
    args.container, args.gpu = str(image), True
    options, binds = capture.wrapper_options(args, str(exe))
    assert options == {"python": "python", "profiler": str(exe)}
    assert binds == [str(tmp_path / "nsight-systems" / "2025.1.1")]
    prefix = capture.rank_prefix(tool="nsys", ranks="all", dir="d", **options)
    (tmp_path / "srun").write_text("#!/bin/sh\n")  # an srun to find (none is run)
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    # one rank: apptainer first; a node: torchrun --no-python; Slurm: srun, each start the above
    for nodes, rpn, launcher in (
        (1, 1, "apptainer"),
        (1, 2, launch.LOCAL_RANKS),
        (2, 4, "srun"),
    ):
        if launcher == "srun":
            monkeypatch.setenv("SLURM_JOB_ID", "7")
            monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
        args.nodes, args.ranks_per_node = nodes, rpn
        cmd = capture.launch_command(args, prefix, binds)
        assert launcher in cmd[:3]
        order = [
            cmd.index("apptainer"),
            cmd.index("--bind"),
            cmd.index(str(image)),
            cmd.index("rank"),
            cmd.index("--profiler"),
            cmd.index("--"),
            cmd.index("train"),
        ]
        assert order == sorted(order), cmd
        bound = [cmd[i + 1] for i, word in enumerate(cmd) if word == "--bind"]
        code = container_exec.source_dir()  # the checkout's src/, which every rank runs
        assert bound == [f"{code}:{code}:ro", binds[0]]
        assert cmd[cmd.index(str(image)) + 1 : cmd.index(str(image)) + 3] == ["python", "-m"]
        assert cmd[cmd.index("--") + 1 : cmd.index("train")] == ["python", "-m", "scalestudy"]
        assert "nsys" not in " ".join(cmd[: cmd.index("apptainer")])  # nothing wraps apptainer
    # without a container: the host's python and the profiler as found
    args.container = None
    assert capture.wrapper_options(args, "/x/nsys") == ({"profiler": "/x/nsys"}, [])


@pytest.mark.parametrize("rerun", [False, True])
def test_in_the_container_the_reports_directory_is_bound(tmp_path, monkeypatch, rerun):
    """The wrapper writes the reports into --out itself, but only the trainer's --out
    (out/train) decided the bind: a by-hand rerun that found out/train left over bound it
    alone, and nsys wrote its reports where the host never saw them ("nsys wrote no report").
    --out is outside the working directory here, as a /scratch capture is."""
    monkeypatch.chdir(REPO)
    image = tmp_path / "trainer.sif"
    image.write_bytes(b"image")
    exe = _install(tmp_path / "nsight-systems" / "2025.1.1", "bin/nsys")
    out = tmp_path / "scratch" / "capture"
    if rerun:
        (out / "train").mkdir(parents=True)
    else:
        out.parent.mkdir(parents=True)
    args = _launch_args(1, 1, None, device="cuda")
    args.container, args.gpu = str(image), True
    args.train_args = capture.trainer_args(args, out / "train")
    options, binds = capture.wrapper_options(args, str(exe), out)
    prefix = capture.rank_prefix(
        tool="nsys", ranks="all", dir=capture.wrapper_dir(args, out), **options
    )
    cmd = capture.launch_command(args, prefix, binds)
    bound = [cmd[i + 1].split(":")[0] for i, word in enumerate(cmd) if word == "--bind"]
    assert len(bound) == len(set(bound)), bound  # each directory once
    reports = capture.wrapper_dir(args, out)
    assert any(reports.is_relative_to(b) for b in bound), (reports, bound)


def _launch_args(nodes, rpn, prefix, device="cpu"):
    # a device, not auto: launch refuses auto in a Slurm job's shell without a GPU
    return argparse.Namespace(
        mpi="srun",
        nodes=nodes,
        ranks_per_node=rpn,
        cpus_per_rank=2,
        container=None,
        gpu=False,
        rank_prefix=prefix,
        train_args=["--", "--epochs", "1", "--device", device],
    )


def test_launch_puts_the_rank_wrapper_around_each_rank():
    prefix = capture.rank_prefix(tool="nsys", ranks="all", dir="d")
    one = launch.build_command(_launch_args(1, 1, prefix), {})
    assert one[1:5] == ["-m", "scalestudy", "profile", "rank"]
    assert one[-7:] == ["-m", "scalestudy", "train", "--epochs", "1", "--device", "cpu"]
    local = launch.build_command(_launch_args(1, 2, prefix), {})
    assert "--no-python" in local and local.index("--no-python") < local.index("rank")
    slurm = (
        launch.build_command(
            _launch_args(2, 4, prefix), {"SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin"}
        )
        if Path("/usr/bin/srun").exists()
        else None
    )
    if slurm:
        assert slurm[0] == "srun" and slurm.index("rank") < slurm.index("train")
    plain = launch.build_command(_launch_args(1, 2, None), {})
    assert "--no-python" not in plain


# --- config and run selection -----
def test_default_selection_is_one_gpu_and_one_node_bf16_fp32():
    cfg = load_and_validate(REPO / "config" / "config.yaml")
    chosen = study_profiling.profiled_runs(cfg, build_run_table(cfg))
    assert [r["run"] for r in chosen] == [
        "w1_lb256_bf16_ddp_bk25_r0",
        "w1_lb256_fp32_ddp_bk25_r0",
        "w4_lb256_bf16_ddp_bk25_r0",
        "w4_lb256_fp32_ddp_bk25_r0",
    ]
    flags = study_profiling.window_flags(chosen[2], 20, 10)
    assert flags["--profile-steps"] == "20:30" and flags["--limit-train"] == str(31 * 1024)
    assert flags["--comm-probe-steps"] == "0" and flags["--epochs"] == "1"


@pytest.mark.parametrize("cuda_graphs", ["step", "auto"])
def test_a_profiled_run_never_replays_the_whole_step(cuda_graphs):
    """A replay of the whole-step graph runs none of the loop's host code, so its profile would
    hold no phase ranges: the profile job of such a run gets torch.compile's graphs instead."""
    import torch

    from scalestudy.trainer import compiling
    from scalestudy.trainer.config import TrainConfig, add_arguments

    cfg = load_and_validate(
        REPO / "config" / "config.yaml",
        # fp16 cannot be one graph (its GradScaler): a study asking for step runs without it
        overrides=[f"train.cuda_graphs={cuda_graphs}", "families.precision.precisions=[bf16,fp32]"],
    )
    row = study_profiling.profiled_runs(cfg, build_run_table(cfg))[0]
    assert row["cuda_graphs"] == cuda_graphs
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    train_cfg = TrainConfig.from_args(parser.parse_args(trainer_args(row)))
    cuda = torch.device("cuda")
    assert compiling.graphs_mode(train_cfg, cuda) == "step"  # the timed run
    flags = study_profiling.profile_flags(row, cfg["profiling"])
    profiled = TrainConfig.from_args(parser.parse_args(flags))
    assert profiled.profile_window() == (20, 30)
    assert compiling.graphs_mode(profiled, cuda) == "compiled"  # the same compiled kernels


def test_the_profile_flags_hold_no_value_the_window_overrides():
    """profile_flags was the run's whole argv, then the window's: a train.epochs or
    comm_probe_steps edit changed the profiling jobs' flags param, and they ran again, though
    the window's values (the last of each flag) were what their trainer read."""
    cfg = load_and_validate(REPO / "config" / "config.yaml")
    row = study_profiling.profiled_runs(cfg, build_run_table(cfg))[0]
    other = {**row, "epochs": row["epochs"] + 7, "comm_probe_steps": 3, "limit_test": 64}
    flags = study_profiling.profile_flags(row, cfg["profiling"])
    assert study_profiling.profile_flags(other, cfg["profiling"]) == flags
    names = flags[::2]
    assert len(names) == len(set(names)), names  # each flag once
    assert flags[names.index("--epochs") * 2 + 1] == "1"


@pytest.mark.parametrize(
    "override, message",
    [
        (["profiling.tool=nsys"], "profiling.tool"),
        (["profiling.ncu.enabled=true"], "profiling.ncu.enabled"),
        (["profiling.gpus=[3]"], "profiling.gpus"),
        # as the families' lists: [] is no "null" (1 and a node), a value is listed once, and
        # an empty precisions list is named itself (profiling.gpus was blamed for it)
        (["profiling.gpus=[]"], "'profiling.gpus': value [] is not allowed: at least 1 item"),
        (["profiling.gpus=[1,1]"], "'profiling.gpus': value [1, 1] is not allowed: no duplic"),
        (["profiling.precisions=[]"], "'profiling.precisions': value [] is not allowed: at least"),
        (["profiling.precisions=[fp32,fp32]"], '\'profiling.precisions\': value ["fp32", "fp32'),
        (["profiling.start_step=500"], "profiling.start_step"),
        (["profiling.tool=perf"], "profiling.tool"),
        # what nsys would refuse, or a capture profile parse cannot read (no kernels or phases)
        (["profiling.nsys_trace=abc"], 'profiling.nsys_trace\': value "abc"'),
        (['profiling.nsys_trace=""'], 'profiling.nsys_trace\': value ""'),
        (["profiling.nsys_trace=cuda, nvtx"], "comma-separated without spaces"),
        (["profiling.nsys_trace=cuda,osrt"], "and nvtx (the trainer's phase ranges)"),
        (["profiling.nsys_trace=nvtx,cudnn", "profiling.tool=auto"], "with cuda (the kernels"),
        # powersgd's uncompressed steps: every profiling job of the demo was refused by the
        # trainer (an epoch of 7 steps, a warm-up of 10) after the config passed
        (["train.comm_hook=powersgd"], "'profiling.start_step': value 3 is not allowed with"),
    ],
)
def test_bad_profiling_config_names_the_key(override, message):
    with pytest.raises(StudyConfigError, match=re.escape(message)):
        load_and_validate(REPO / "config" / "demo.yaml", overrides=["dataset=synthetic", *override])


def test_profiled_pairs_matching_no_run_name_the_key_to_change():
    """profiling.gpus was blamed whenever no run had the chosen world sizes and precisions, its
    default null too, when only profiling.precisions was changed: the key that selects no run is
    named, with what the study has to pick from."""
    paper = REPO / "config" / "config.yaml"
    no_fp16 = ["families.precision.enabled=false"]  # no fp16 run left in the paper study
    for gpus in ([], ["profiling.gpus=[1,8]"]):  # null (1 and a node: [1, 4]), and set
        with pytest.raises(StudyConfigError) as caught:
            load_and_validate(paper, overrides=[*no_fp16, *gpus, "profiling.precisions=[fp16]"])
        message = str(caught.value)
        assert "config key 'profiling.precisions': value [\"fp16\"] is not allowed" in message
        assert "profiling.gpus'" not in message and "\n" not in message
        # what the runs of those world sizes have (the paper's strong and weak families: bf16)
        assert 'have precision in ["bf16"]' in message, message
    # world sizes no run has: profiling.gpus, with the world sizes the study runs
    with pytest.raises(StudyConfigError) as caught:
        load_and_validate(paper, overrides=["profiling.gpus=[3]", "profiling.precisions=[fp16]"])
    message = str(caught.value)
    assert "config key 'profiling.gpus': value [3] is not allowed" in message
    assert "profiling.precisions'" not in message and "world sizes are [1, 2, 4, 8, 16]" in message
    # null's world sizes (1 and a node of 4) that no run has: null is named, and what it means
    only = ["families.strong.gpus=[2,8]", "families.weak.enabled=false", *no_fp16]
    with pytest.raises(StudyConfigError) as caught:
        load_and_validate(paper, overrides=[*only, "families.bucket.enabled=false"])
    message = str(caught.value)
    assert "config key 'profiling.gpus': value null is not allowed" in message
    assert "(null: 1 and hardware.gpus_per_node); its world sizes are [2, 8]" in message


def test_an_nsys_trace_with_cuda_and_nvtx_is_accepted_and_unread_by_the_torch_profiler():
    demo = REPO / "config" / "demo.yaml"
    for trace in ("cuda,nvtx", "nvtx,cuda-hw,cuda,python-gil"):
        overrides = ["dataset=synthetic", f"profiling.nsys_trace={trace}"]
        assert load_and_validate(demo, overrides=overrides)["profiling"]["nsys_trace"] == trace
    overrides = ["dataset=synthetic", "profiling.tool=torch", "profiling.nsys_trace=abc"]
    assert load_and_validate(demo, overrides=overrides)["profiling"]["nsys_trace"] == "abc"


# --- real captures on CPU -----
def _capture(
    data_dir, out, *extra, tool="auto", device="cpu", path_extra=None, launch=(), window="2:5"
):
    env = child_env()
    if path_extra:
        env["PATH"] = f"{path_extra}:{env['PATH']}"
    env["PATH"] = f"{Path(PYTHON).parent}:{env['PATH']}"
    cmd = [
        PYTHON,
        "-m",
        "scalestudy",
        "profile",
        "capture",
        "--run",
        "w2_test",
        "--tool",
        tool,
        "--device",
        device,
        "--out",
        str(out),
        "--inventory",
        str(out.parent / "system.json"),
        "--mpi=",
        "--nodes",
        "1",
        "--ranks-per-node",
        "2",
        "--cpus-per-rank",
        "1",
        *launch,
        "--",
        "--dataset",
        "synthetic",
        "--width",
        "4",
        "--local-batch",
        "16",
        "--epochs",
        "1",
        "--limit-train",
        "192",
        "--limit-test",
        "32",
        "--warmup-steps",
        "2",
        "--comm-probe-steps",
        "0",
        *(("--profile-steps", window) if window else ()),
        "--pg-timeout-s",
        "60",
        "--data-dir",
        str(data_dir),
        *extra,
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _profile_ncu(
    kernels: Path, enabled: str, top_k: int, out: Path, env: dict, data_dir: Path, window="1:3"
):
    """`scalestudy profile ncu-kernels` of a kernels CSV, then `scalestudy profile ncu` of one
    short CPU run on those kernels (the ncu on PATH is a stand-in), as the workflow runs them."""
    listed = out.parent / f"{out.name}-kernels.json"
    subprocess.run(
        [PYTHON, "-m", "scalestudy", "profile", "ncu-kernels", "--kernels", str(kernels),
         "--out", str(listed)],
        env=env, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    cmd = [PYTHON, "-m", "scalestudy", "profile", "ncu", "--run", "w1",
           "--kernels", str(listed), "--enabled", enabled, "--top-k", str(top_k),
           "--out-dir", str(out), "--device", "cuda",
           "--mpi=", "--nodes", "1", "--ranks-per-node", "1", "--cpus-per-rank", "1",
           "--", "--dataset", "synthetic", "--width", "4", "--local-batch", "16",
           "--epochs", "1", "--limit-train", "64", "--limit-test", "16",
           "--warmup-steps", "1", "--comm-probe-steps", "0",
           *(("--profile-steps", window) if window else ()),
           "--data-dir", str(data_dir)]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _parse_ncu(out: Path) -> Path:
    """`scalestudy profile parse --ncu` of a `profile ncu` directory (the workflow's
    profile_ncu_parse) -> the profile_ncu CSV beside it."""
    made = out.parent / f"{out.name}.csv"
    argv = [PYTHON, "-m", "scalestudy", "profile", "parse", "--ncu", str(out), "--run", "w1"]
    proc = subprocess.run(
        [*argv, "--out-ncu", str(made)], env=child_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return made


def test_ncu_on_a_node_whose_counters_are_admin_only(data_dir, tmp_path):
    """Where ncu may not read the GPU's performance counters (ERR_NVGPUCTRPERM, the driver's
    default), `profile ncu` under enabled auto says so and writes an empty profile_ncu CSV
    instead of failing the job (and with it the study); under enabled true it is an error
    naming the cause. The ncu is a stand-in printing real ncu's refusal
    (tests/stand-ins/ncu-refused)."""
    kernels = tmp_path / "kernels.csv"
    rows = schema.kernel_rows("w1", "nsys", {0: [{"name": "conv_kernel", "instances": 3,
                                                  "total_ns": 9000}]})  # fmt: skip
    kernels.write_text(schema.csv_text(schema.KERNEL_COLUMNS, rows))
    env = child_env()
    env["PATH"] = f"{STAND_INS / 'ncu-refused'}:{Path(PYTHON).parent}:{env['PATH']}"

    def ncu(enabled: str, out: Path):
        return _profile_ncu(kernels, enabled, 1, out, env, data_dir)

    proc = ncu("auto", tmp_path / "auto")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "WARNING auto: ncu may not read this node's GPU performance counters" in proc.stderr
    assert "ERR_NVGPUCTRPERM" in proc.stdout  # ncu's own output, in the job's log too
    assert _parse_ncu(tmp_path / "auto").read_text() == ",".join(schema.NCU_COLUMNS) + "\n"
    manifest = json.loads((tmp_path / "auto" / "tool.json").read_text())
    assert manifest["tool"] == "none" and "ERR_NVGPUCTRPERM" in manifest["why"]
    assert manifest["run"] == "w1"
    proc = ncu("true", tmp_path / "true")
    assert proc.returncode != 0 and not (tmp_path / "true" / "tool.json").exists()
    assert "profiling.ncu.enabled is true but ncu may not read" in proc.stderr


def test_ncu_leaves_out_a_kernel_its_process_never_launched(data_dir, tmp_path):
    """ncu's process autotunes cuDNN afresh and may choose other engines than the capture did
    (two of an H200's top 10 never launched under ncu): such a kernel is left out with a
    warning and named in tool.json, the others are profiled, and the job succeeds. The top K
    are rank 0's, the rank ncu profiles. The ncu is a stand-in that "launches" the names in
    NCU_STAND_IN_LAUNCHED (tests/stand-ins/ncu-cudnn-autotune)."""
    kernels = tmp_path / "kernels.csv"
    fprop = "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize256x64x32"
    bn = "void at::native::batch_norm_collect_statistics_channels_last_kernel<float>(float *)"
    only_rank1 = "void at::native::only_rank1_kernel<float>(float *)"
    rows = schema.kernel_rows("w1", "nsys", {
        0: [{"name": fprop, "instances": 3, "total_ns": 9000},
            {"name": bn, "instances": 3, "total_ns": 5000}],
        1: [{"name": only_rank1, "instances": 3, "total_ns": 10**9}],
    })  # fmt: skip
    kernels.write_text(schema.csv_text(schema.KERNEL_COLUMNS, rows))
    launched = tmp_path / "launched.txt"
    env = child_env(NCU_STAND_IN_LAUNCHED=str(launched))
    env["PATH"] = f"{STAND_INS / 'ncu-cudnn-autotune'}:{Path(PYTHON).parent}:{env['PATH']}"

    def ncu(enabled: str, out: Path):
        return _profile_ncu(kernels, enabled, 2, out, env, data_dir)

    # ncu's process launched the batch norm (in ncu's spelling) but another conv engine
    launched.write_text(
        "void at::native::batch_norm_collect_statistics_channels_last_kernel<float>(float *)\n"
        "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x64x64\n"
    )
    proc = ncu("true", tmp_path / "some")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"ncu k0 profiled nothing: no launch of {fprop!r}" in proc.stderr
    manifest = json.loads((tmp_path / "some" / "tool.json").read_text())
    assert manifest["kernels"] == [bn] and manifest["not_launched"] == [fprop]
    assert manifest["run"] == "w1"  # the parse refuses the directory under another --run
    assert manifest["csv"] == ["ncu_k1.csv"]  # k0, the conv engine, has no report
    got = list(csv.DictReader(_parse_ncu(tmp_path / "some").open()))
    assert got and {r["kernel"] for r in got} == {bn}
    # nothing launched: auto says so and writes an empty CSV, true fails
    launched.write_text("void another_kernel<float>(float *)\n")
    proc = ncu("auto", tmp_path / "none")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "none of the top 2 kernels" in proc.stderr
    assert _parse_ncu(tmp_path / "none").read_text() == ",".join(schema.NCU_COLUMNS) + "\n"
    manifest = json.loads((tmp_path / "none" / "tool.json").read_text())
    assert manifest["tool"] == "none" and manifest["not_launched"] == [fprop, bn]
    assert manifest["run"] == "w1"
    proc = ncu("true", tmp_path / "fail")
    assert proc.returncode == 2 and not (tmp_path / "fail" / "tool.json").exists()
    assert "profiling.ncu.enabled is true but none of the top 2" in proc.stderr.splitlines()[-1]


def test_a_capture_or_ncu_without_a_window_is_refused_before_training(data_dir, tmp_path):
    """Without --profile-steps in the trainer's flags, `profile capture` trained the whole run
    (hours on a cluster) and only then failed ("torch.profiler wrote no torch_ops_rank*.json";
    under nsys no report), having cleared the earlier capture; `profile ncu` trained the whole
    run once per kernel, and ncu, which profiles only inside the window, profiled nothing: under
    enabled auto an empty profile_ncu CSV, exit 0. Now both refuse in one line naming
    --profile-steps, before any rank starts; the earlier capture is left as it was."""
    cap = tmp_path / "capture"
    (cap / "stats").mkdir(parents=True)
    (cap / "tool.json").write_text('{"tool": "nsys"}\n')  # an earlier capture's
    proc = _capture(data_dir, cap, tool="torch", window=None)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("scalestudy profile capture: the trainer's flags after -- have no "
                           "--profile-steps A:B"), last  # fmt: skip
    assert sorted(p.name for p in cap.iterdir()) == ["stats", "tool.json"]  # no train/
    kernels = tmp_path / "kernels.csv"
    bn = "void at::native::batch_norm_collect_statistics_channels_last_kernel<float>(float *)"
    rows = schema.kernel_rows("w1", "nsys", {0: [{"name": bn, "instances": 3, "total_ns": 9}]})
    kernels.write_text(schema.csv_text(schema.KERNEL_COLUMNS, rows))
    launched = tmp_path / "launched.txt"
    launched.write_text(bn + "\n")
    env = child_env(NCU_STAND_IN_LAUNCHED=str(launched))
    env["PATH"] = f"{STAND_INS / 'ncu-cudnn-autotune'}:{Path(PYTHON).parent}:{env['PATH']}"
    out = tmp_path / "ncu"
    proc = _profile_ncu(kernels, "auto", 1, out, env, data_dir, window=None)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("scalestudy profile ncu: the trainer's flags after -- have no "
                           "--profile-steps A:B"), last  # fmt: skip
    assert not (out / "ncu_k0.log").exists() and not (out / "tool.json").exists()  # no pass


def test_a_hung_post_processing_tool_is_stopped_with_one_line(tmp_path):
    """`nsys stats` and `ncu --import` ran without a time limit: a hung one held a job outside
    Slurm forever. Beyond their limit they are stopped, and the error names the command."""
    argv = [PYTHON, "-c", "import time; time.sleep(30)"]
    t0 = time.monotonic()
    with pytest.raises(ProfileError, match=r"-c import time; .* did not finish in 0.5 s"):
        capture.run_tool(argv, child_env(), timeout=0.5)
    assert time.monotonic() - t0 < 10
    capture.run_tool([PYTHON, "-c", "pass"], child_env(), timeout=30)  # in time: no error
    # the file it read is named (the report path is argv's last word, which was cut off: of
    # an 8-rank capture, which rank's report failed was not said), and what to do
    report = "cap/nsys_rank3.nsys-rep"
    fix = "a report cut short needs the capture again"
    with pytest.raises(ProfileError, match=rf"of {report} failed with exit 3 .*; {fix}"):
        capture.run_tool([PYTHON, "-c", "raise SystemExit(3)"], child_env(), what=report, fix=fix)
    with pytest.raises(ProfileError, match=rf"of {report} did not finish in 0.5 s"):
        capture.run_tool(argv, child_env(), timeout=0.5, what=report)


def _parse(cap, tmp_path):
    args = _profile_parse(
        "--capture",
        str(cap),
        "--run",
        "w2_test",
        "--out-kernels",
        str(tmp_path / "k.csv"),
        "--out-ranges",
        str(tmp_path / "r.csv"),
    )
    assert parse_job.parse(args) == 0
    return (list(csv.DictReader((tmp_path / n).open())) for n in ("k.csv", "r.csv"))


def test_profile_parse_of_a_real_gpu_capture_gives_projected_phases(
    tmp_path, capsys, command_logging
):
    """`scalestudy profile parse --capture` over the H100's torch.profiler capture (its export
    and chrome trace, tests/fixtures/gpu-h100/): the profile CSVs the study's plots read, with
    the phases projected onto the GPU. Without the trace its phases are the host's enqueue
    times: labelled host_range, and said, as nsys's are (they went by without a word)."""
    cap = tmp_path / "capture"
    (cap / "train" / "profile").mkdir(parents=True)
    for name in ("torch_ops_rank0.json", "trace_rank0.json"):
        (cap / "train" / "profile" / name).write_bytes(
            (FIX.parent / "gpu-h100" / name).read_bytes()
        )
    manifest = {"run": "w2_test", "tool": "torch", "why": "test", "input": "train/profile"}
    (cap / "tool.json").write_text(json.dumps(manifest))
    kernels, ranges = _parse(cap, tmp_path)
    assert any(r["category"] == "conv" for r in kernels)
    assert {r["time_base"] for r in ranges} == {"gpu_projection"}
    ns = {r["range"]: int(r["total_ns"]) for r in ranges}
    assert ns["backward"] > ns["forward"] > ns["optimizer"] > 0
    assert "WARNING" not in capsys.readouterr().err
    (cap / "train" / "profile" / "trace_rank0.json").unlink()
    _, ranges = _parse(cap, tmp_path)
    assert {r["time_base"] for r in ranges} == {"host_range"}
    err = capsys.readouterr().err
    assert "WARNING w2_test: GPU rank(s) 0 have no GPU operation in a trace_rank<r>.json" in err
    assert "not GPU time" in err and "scalestudy profile capture" in err


def test_a_capture_of_another_run_is_refused(tmp_path, capsys):
    """`profile parse --capture DIR --run R` wrote the capture's kernels and phases as run R's
    whatever run its tool.json names: a capture copied into another run's directory showed one
    configuration's profile as another's, and merge's check of each CSV's run (which parse
    had labelled R) could not see it. Now one line naming both runs, and nothing written."""
    cap = tmp_path / "capture"
    (cap / "train" / "profile").mkdir(parents=True)
    for name in ("torch_ops_rank0.json", "trace_rank0.json"):
        shutil.copyfile(FIX.parent / "gpu-h100" / name, cap / "train" / "profile" / name)
    manifest = {"run": "w1_bf16", "tool": "torch", "why": "test", "input": "train/profile"}
    (cap / "tool.json").write_text(json.dumps(manifest))
    out = [str(tmp_path / "k.csv"), "--out-ranges", str(tmp_path / "r.csv")]
    argv = ["profile", "parse", "--capture", str(cap), "--run", "w1_fp32", "--out-kernels", *out]
    capsys.readouterr()
    assert cli.main(argv) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err == (
        f"scalestudy profile parse: {cap / 'tool.json'}: the capture of run 'w1_bf16', not of "
        "--run 'w1_fp32' (copied from another run's directory?): capture this run again with "
        "`scalestudy profile capture`"
    )
    assert not (tmp_path / "k.csv").exists() and not (tmp_path / "r.csv").exists()
    argv[argv.index("w1_fp32")] = "w1_bf16"  # its own run: parsed
    assert cli.main(argv) == 0
    assert {r["run"] for r in csv.DictReader((tmp_path / "k.csv").open())} == {"w1_bf16"}


def test_torch_profiler_capture_of_a_two_rank_run(data_dir, tmp_path):
    cap = tmp_path / "capture"
    proc = _capture(data_dir, cap)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tool torch (auto: no GPU" in proc.stdout  # the choice is stated
    assert json.loads((cap / "tool.json").read_text())["tool"] == "torch"
    kernels, ranges = _parse(cap, tmp_path)
    assert {r["rank"] for r in kernels} == {"0", "1"} and {r["tool"] for r in kernels} == {
        "torch.profiler"
    }
    cats = {r["category"] for r in kernels}
    assert {"conv", "batchnorm", "elementwise", "nccl"} <= cats
    for rank in ("0", "1"):
        assert sum(float(r["share"]) for r in kernels if r["rank"] == rank) == pytest.approx(
            1.0, abs=1e-3
        )
        phases = {r["range"]: int(r["instances"]) for r in ranges if r["rank"] == rank}
        assert phases == {"data": 3, "forward": 3, "backward": 3, "optimizer": 3}  # steps 2..4
    # each rank's all-reduce: its time on gloo's thread (the export's inclusive time; DDP's flat
    # buckets: gloo runs no op inside them, the trace says), not only the c10d call's enqueue
    # time. The export's time, not the trace's spans: on a loaded machine they differed (18.3 ms
    # against 21.2 ms of spans on rank 0, torch 2.14.1), two records of one span
    for rank in ("0", "1"):
        profile = cap / "train" / "profile"
        trace = json.loads((profile / f"trace_rank{rank}.json").read_text())
        spans = [e["dur"] for e in trace["traceEvents"] if e.get("name") == "gloo:all_reduce"]
        assert torch_ops.nested_in_collectives(trace)["gloo:all_reduce"] == 0
        ops = json.loads((profile / f"torch_ops_rank{rank}.json").read_text())["ops"]
        (total,) = [o["cpu_total_us"] for o in ops if o["name"] == "gloo:all_reduce"]
        (enqueue,) = [o["cpu_total_us"] for o in ops if o["name"] == "c10d::allreduce_"]
        (gloo,) = [r for r in kernels if r["rank"] == rank and r["kernel"] == "gloo:all_reduce"]
        assert gloo["category"] == "nccl" and int(gloo["instances"]) == len(spans) == 3
        # gloo's own time, not the enqueue's (no order between the two: on a loaded machine
        # the c10d call waited out the all-reduce, 63.83 ms against gloo's 63.72, CI at efe19e2)
        assert int(gloo["total_ns"]) == pytest.approx(total * 1e3, rel=1e-6) and total > 0
        assert int(gloo["total_ns"]) != pytest.approx(enqueue * 1e3, rel=1e-6)
    # a CPU run's phase times are host times, and say so; the export flags the ranges
    assert {r["time_base"] for r in ranges} == {"host_range"}
    export = json.loads((cap / "train" / "profile" / "torch_ops_rank0.json").read_text())
    forward = [op for op in export["ops"] if op["name"] == "forward"]
    assert [(op["device_type"], op["user_annotation"]) for op in forward] == [("CPU", True)]
    assert forward[0]["device_total_us"] == 0 and forward[0]["cpu_total_us"] > 0
    inv = json.loads((tmp_path / "system.json").read_text())
    assert inv["gpus"] == "absent" and inv["torch"] and inv["cpu"]["logical_cpus"] >= 1
    # the profiling job's trainer output stays under the capture directory
    assert (cap / "train" / "metrics.json").exists()
    # a rank's export lost after the capture: it was parsed without that rank's kernels
    manifest = json.loads((cap / "tool.json").read_text())
    assert (manifest["world_size"], manifest["ranks"]) == (2, "all")
    profiled = cap / "train" / "profile"
    stray = (profiled / "torch_ops_rank1.json").read_bytes()
    (profiled / "torch_ops_rank1.json").unlink()
    (tmp_path / "k.csv").unlink()
    (tmp_path / "r.csv").unlink()
    with pytest.raises(ProfileFormatError, match=r"no kernels of rank\(s\) 1, which the capture"):
        _parse(cap, tmp_path)
    assert not (tmp_path / "k.csv").exists()
    # and a rank it never profiled (a file copied in): its rows joined the run's kernels
    (profiled / "torch_ops_rank1.json").write_bytes(stray)
    (profiled / "torch_ops_rank3.json").write_bytes(stray)
    with pytest.raises(ProfileFormatError, match=r"kernels of rank\(s\) 3, which the capture did"):
        _parse(cap, tmp_path)
    assert not (tmp_path / "k.csv").exists()


def _union(intervals) -> float:
    """The length of the union of (start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for a, b in sorted(intervals):
        total += max(0.0, b - max(a, reach))
        reach = max(reach, b)
    return total


def test_torch_profiler_capture_of_a_two_rank_fsdp_run(data_dir, tmp_path):
    """A real 2-rank FSDP capture on a CPU: the main thread waits for FSDP's all-gathers and
    reduce-scatters inside FSDP::all_gather and FSDP::post_backward_reduce while gloo's thread
    runs them. That wait was counted as communication beside gloo's own time (the reduce-scatter
    as the compute category reduce): a rank's nccl time exceeded the wall time it spent
    communicating by 80 % (316.8 ms against 172.8 ms, rank 0). Each instant of communication is
    counted once now, the copies into and out of the collectives' buffers are memcpy."""
    cap = tmp_path / "capture"
    proc = _capture(data_dir, cap, "--strategy", "fsdp")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    kernels, _ = _parse(cap, tmp_path)
    for rank in ("0", "1"):
        rows = [r for r in kernels if r["rank"] == rank]
        category = {r["kernel"]: r["category"] for r in rows}
        reduce_scatters = [k for k in category if k.startswith("FSDP::post_backward_reduce")]
        assert reduce_scatters and {category[k] for k in reduce_scatters} == {"nccl"}
        copies = [k for k in category if k.startswith(("fsdp::all_gather_copy_in", "fsdp::chunk_"))]
        assert copies and {category[k] for k in copies} == {"memcpy"}
        assert not any(
            k.startswith(("FSDP::", "fsdp::")) for k in category if category[k] == "reduce"
        )
        profile = cap / "train" / "profile"
        trace = json.loads((profile / f"trace_rank{rank}.json").read_text())
        host = [
            (e["name"], e["tid"], e["ts"], e["ts"] + e["dur"])
            for e in trace["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
        ]
        spans = [(a, b) for name, _, a, b in host if name.startswith("gloo:")]
        gloo_threads = {tid for name, tid, _, _ in host if name.startswith("gloo:")}
        calls = [
            (a, b)
            for name, tid, a, b in host
            if tid not in gloo_threads and classify(name) == "nccl"
        ]
        assert spans and calls
        # the wall time the rank communicated: gloo's spans and the calls that start or wait
        # for them, each instant once; gloo's threads counted apart where their spans overlap
        wall_us = _union(spans + calls) + sum(b - a for a, b in spans) - _union(spans)
        nccl_us = sum(int(r["total_ns"]) for r in rows if r["category"] == "nccl") / 1e3
        assert 0 < nccl_us <= wall_us + 1e-3 * len(rows), (rank, nccl_us, wall_us)
        # the wait left FSDP's reduce-scatter ranges: together less than the export's self
        # time (not each: on a loaded machine gloo may finish a layer's reduce-scatter before
        # its range waits, and that range keeps all its self time: a run beside the CI failed so)
        ops = json.loads((profile / f"torch_ops_rank{rank}.json").read_text())["ops"]
        self_us = {o["name"]: o["self_cpu_us"] for o in ops if o["device_type"] == "CPU"}
        counted = sum(int(r["total_ns"]) for r in rows if r["kernel"] in reduce_scatters)
        assert counted < sum(self_us[k] for k in reduce_scatters) * 1e3, (rank, counted)


@pytest.mark.parametrize(
    ("manifest", "ranks"),
    [
        ({"tool": "torch", "ranks": "all", "world_size": 3}, [0, 1, 2]),
        ({"tool": "torch", "ranks": "0", "world_size": 2}, [0, 1]),  # torch.profiler: every rank
        ({"tool": "nsys", "ranks": "0", "world_size": 4}, [0]),
        ({"tool": "nsys", "ranks": "all", "world_size": 2}, [0, 1]),
        ({"tool": "nsys", "ranks": "all"}, []),  # a capture from before world_size was recorded
        ({"tool": "torch", "ranks": "all", "world_size": True}, []),
    ],
)
def test_the_ranks_a_capture_profiled(manifest, ranks):
    assert capture.expected_ranks(manifest) == ranks
    assert capture.missing_ranks(manifest, {0}) == ranks[1:]


def test_a_leftover_torch_profiler_setting_does_not_reach_nsys_or_ncu_ranks(tmp_path, monkeypatch):
    """SCALESTUDY_PROFILER=torch (set by capture where nsys is missing; exported by hand with
    gpu-check's commands) passed from the caller's environment to the ranks of an nsys capture
    or ncu: the trainer then never called cudaProfilerStart, so nsys captured no range and ncu
    (--profile-from-start off) profiled nothing, blamed on cuDNN's autotuning. Only the torch
    tool sets it; nsys and ncu ranks get it removed. STAND-IN for the launch: it records the
    ranks' environment."""
    monkeypatch.setenv("SCALESTUDY_PROFILER", "torch")
    seen: dict[str, str | None] = {}
    stand_in = str(STAND_INS / "nsys")
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: stand_in if name in ("nsys", "ncu") else None
    )
    monkeypatch.setattr(launch, "hold_local_gpus", lambda *a, **k: None)

    def recording_launch(argv, env, **kwargs):
        seen["capture"] = env.get("SCALESTUDY_PROFILER", "unset")
        return 0

    monkeypatch.setattr(capture, "run_launch", recording_launch)
    monkeypatch.setattr(capture, "nsys_stats", lambda out, env: ([], {"input": "stats"}))
    words = ["profile", "capture", "--run", "r", "--tool", "nsys", "--device", "cuda", "--out",
             str(tmp_path / "cap"), "--", "--device", "cuda", "--profile-steps", "2:4"]  # fmt: skip
    with contextlib.suppress(ProfileError):  # no report: the stand-in launch made none
        capture.capture(cli.build_parser(words).parse_args(words))
    assert seen["capture"] == "unset"

    rows = [{"run": "r", "rank": 0, "tool": "nsys", "kernel": "ampere_sgemm_128x64_tn",
             "category": "gemm", "instances": 20, "total_ns": 1000, "share": 1.0}]  # fmt: skip
    kernels = tmp_path / "ncu_kernels.json"
    kernels.write_text(json.dumps(ncu_kernels.candidates(rows)))

    def recording_ncu(argv, env, log_path):
        seen["ncu"] = env.get("SCALESTUDY_PROFILER", "unset")
        log_path.write_text("")
        return 0, ""

    monkeypatch.setattr(capture, "run_logged", recording_ncu)
    words = ["profile", "ncu", "--run", "r", "--kernels", str(kernels), "--device", "cuda",
             "--out-dir", str(tmp_path / "ncu"), "--",
             "--device", "cuda", "--profile-steps", "2:4"]  # fmt: skip
    with contextlib.suppress(ProfileError):
        ncu_job.ncu(cli.build_parser(words).parse_args(words))
    assert seen["ncu"] == "unset"


def test_a_capture_missing_a_ranks_profile_fails(tmp_path, monkeypatch):
    """A rank that wrote no profile (it died, or wrote elsewhere) gave a capture whose kernel
    sums silently left it out. STAND-IN for the launch: it writes rank 0's export only."""

    def launch_writing_rank0_only(argv, env):
        profile_dir = tmp_path / "cap" / "train" / "profile"
        profile_dir.mkdir(parents=True)
        (profile_dir / "torch_ops_rank0.json").write_text("{}")
        return 0

    monkeypatch.setattr(capture, "run_launch", launch_writing_rank0_only)
    words = ["profile", "capture", "--run", "r", "--tool", "torch", "--device", "cpu", "--out",
             str(tmp_path / "cap"), "--mpi=", "--nodes", "1", "--ranks-per-node", "2", "--",
             "--epochs", "1", "--profile-steps", "0:1"]  # fmt: skip
    args = cli.build_parser(words).parse_args(words)
    with pytest.raises(ProfileError, match=r"no profile of rank\(s\) 1 of 2 \(torch\)"):
        capture.capture(args)
    assert not (tmp_path / "cap" / "tool.json").exists()


@pytest.mark.parametrize(
    "table, says",
    [
        ("SKIPPED: nsys_rank0.sqlite does not contain CUDA kernel data.\n", "does not contain"),
        ('"Time (%)","Total Time (ns)","Instances","Name"\n', "no kernel row"),
    ],
)
def test_an_nsys_capture_without_kernels_fails_its_job(tmp_path, monkeypatch, table, says):
    """`nsys stats` exits 0 where it SKIPs the kernel summary (no CUDA kernel data in the
    report): the capture wrote tool.json and succeeded, and its parse then failed at every
    rerun, which reran the parse alone (the capture counted as finished). The capture reads its
    tables as the parse will and fails, so Snakemake removes it and captures again. STAND-INS
    for the launch (it writes rank 0's report) and for nsys stats (its SKIPPED table)."""
    cap = tmp_path / "cap"
    stand_in = str(STAND_INS / "nsys")
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: stand_in if name in ("nsys", "ncu") else None
    )
    monkeypatch.setattr(launch, "hold_local_gpus", lambda *a, **k: None)

    def launch_writing_a_report(argv, env, **kwargs):
        (cap / "nsys_rank0.nsys-rep").write_text("a report without kernels")
        return 0

    def stats_skipping_the_kernels(out, env):
        (out / "stats").mkdir(exist_ok=True)
        (out / "stats" / "nsys_rank0_cuda_gpu_kern_sum.csv").write_text(table)
        return [out / "nsys_rank0.nsys-rep"], {"input": "stats"}

    monkeypatch.setattr(capture, "run_launch", launch_writing_a_report)
    monkeypatch.setattr(capture, "nsys_stats", stats_skipping_the_kernels)
    words = ["profile", "capture", "--run", "r", "--tool", "nsys", "--device", "cuda", "--out",
             str(cap), "--", "--device", "cuda", "--profile-steps", "2:4"]  # fmt: skip
    with pytest.raises(ProfileError, match=r"no usable profile.*capture again") as failed:
        capture.capture(cli.build_parser(words).parse_args(words))
    assert says in str(failed.value)
    assert not (cap / "tool.json").exists()


@pytest.mark.parametrize("export", ['{"ops": []}', "{}", "not json"])
def test_a_torch_capture_that_recorded_nothing_fails_its_job(tmp_path, monkeypatch, export):
    """A torch.profiler export without ops (the window recorded nothing) made a capture that
    succeeded, and a parse that failed at every rerun. STAND-IN for the launch: it writes the
    export."""

    def launch_writing_the_export(argv, env, **kwargs):
        profile_dir = tmp_path / "cap" / "train" / "profile"
        profile_dir.mkdir(parents=True)
        (profile_dir / "torch_ops_rank0.json").write_text(export)
        return 0

    monkeypatch.setattr(capture, "run_launch", launch_writing_the_export)
    monkeypatch.setattr(launch, "hold_local_gpus", lambda *a, **k: None)
    words = ["profile", "capture", "--run", "r", "--tool", "torch", "--device", "cpu", "--out",
             str(tmp_path / "cap"), "--mpi=", "--", "--epochs", "1",
             "--profile-steps", "0:1"]  # fmt: skip
    with pytest.raises(
        ProfileError, match=r"no usable profile.*torch_ops_rank0.json.*capture again"
    ):
        capture.capture(cli.build_parser(words).parse_args(words))
    assert not (tmp_path / "cap" / "tool.json").exists()


def test_nsys_path_through_the_stand_in(data_dir, tmp_path):
    """The real nsys code path with tests/stand-ins/nsys (canned stats, no capture): per-rank
    wrapper under torchrun --no-python, one report per rank, nsys stats per report, parse."""
    cap = tmp_path / "capture"
    proc = _capture(data_dir, cap, tool="nsys", device="cuda", path_extra=STAND_INS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in cap.glob("*.nsys-rep")) == [
        "nsys_rank0.nsys-rep",
        "nsys_rank1.nsys-rep",
    ]
    assert "--capture-range=cudaProfilerApi" in (cap / "nsys_rank1.nsys-rep").read_text()
    manifest = json.loads((cap / "tool.json").read_text())
    assert manifest["nsys_version"] == "2024.5"
    assert manifest["in_container"] is False and manifest["binds"] == []
    assert (cap / "stats" / "nsys_rank1.sqlite").exists()  # the export, beside the tables
    kernels, ranges = _parse(cap, tmp_path)
    assert {r["rank"] for r in kernels} == {"0", "1"} and {r["tool"] for r in kernels} == {"nsys"}
    assert {r["time_base"] for r in ranges} == {"gpu_projection"}
    # the stand-in's canned export (tests/fixtures/nsight/nsys-export): two steps' backward
    assert {int(r["total_ns"]) for r in ranges if r["range"] == "backward"} == {876_000}
    # explicit nsys where it is missing: a clear error before any training
    proc = _capture(data_dir, tmp_path / "c2", tool="nsys", device="cuda")
    assert proc.returncode == 2 and "not on PATH" in proc.stderr


def test_nsys_in_the_container_through_the_stand_ins(data_dir, tmp_path):
    """With --container, nsys runs inside the (stand-in) container from the bound host
    installation, the trainer as its child: `apptainer exec --bind <nsys dir> IMG python -m
    scalestudy profile rank ... -- python -m scalestudy train`. The nsys stand-in refuses to run
    "inside" unless its directory was bound, and records the container it ran in."""
    image = tmp_path / "trainer.sif"
    env = child_env(PATH=f"{STAND_INS}:{Path(PYTHON).parent}:{os.environ['PATH']}")
    build = container.build_command(REPO / "containers" / "trainer.def", image, "c0ffee")
    r = subprocess.run(build, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # through a symlink (a cluster's /scratch -> /gpfs/scratch): the image binds only the real
    # path (launch.container_paths), so the wrapper's --dir, as the trainer's --out, is that one
    (tmp_path / "real").mkdir()
    (tmp_path / "lnk").symlink_to(tmp_path / "real")
    cap = tmp_path / "lnk" / "capture"
    launch_flags = ("--container", str(image), "--gpu")
    proc = _capture(
        data_dir, cap, tool="nsys", device="cuda", path_extra=STAND_INS, launch=launch_flags
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    launched = next(ln for ln in proc.stdout.splitlines() if launch.LOCAL_RANKS in ln)
    argv = shlex.split(launched.split("+ ", 1)[1])
    order = [argv.index(w) for w in ("apptainer", "--bind", str(image), "rank", "--", "train")]
    assert order == sorted(order), argv
    code = container_exec.source_dir()  # the checkout's src/, then the profiler's installation
    bound = [argv[i + 1] for i, word in enumerate(argv) if word == "--bind"]
    assert bound[:2] == [f"{code}:{code}:ro", str(STAND_INS.resolve())]
    # then the trainer's directories outside the working directory (launch.container_paths)
    assert str(data_dir) in bound[2:] and all(b.startswith(str(tmp_path.parent)) for b in bound[2:])
    assert argv[argv.index("--profiler") + 1] == str((STAND_INS / "nsys").resolve())
    assert argv[argv.index("--dir") + 1] == str(tmp_path.resolve() / "real" / "capture")
    for rank in (0, 1):
        report = (cap / f"nsys_rank{rank}.nsys-rep").read_text()
        assert f"container: {image.resolve()}" in report
        assert f"exe: {(STAND_INS / 'nsys').resolve()}" in report
    # the trainer ran as nsys's child in the container and wrote its outputs
    assert (cap / "train" / "metrics.json").exists()
    manifest = json.loads((cap / "tool.json").read_text())
    assert manifest["in_container"] is True
    # the profiler's installation, and where its reports go (outside the working directory)
    assert manifest["binds"] == [str(STAND_INS.resolve()), str(tmp_path.resolve() / "real")]
    _, ranges = _parse(cap, tmp_path)
    assert {r["time_base"] for r in ranges} == {"gpu_projection"}


# --- the DAG -----
@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory):
    return copy_repo(tmp_path_factory.mktemp("prof-wf"))


def test_gpu_study_plans_nsys_and_ncu_jobs_apart_from_training(repo_copy):
    proc = snakemake(repo_copy, "-n", "-p", timeout=300)
    jobs = planned_jobs(proc)
    assert jobs["profile_capture"] == 4 and jobs["profile_ncu"] == 4 and jobs["train"] == 75
    # the ncu job's kernels and the parse of its reports: local steps of their own
    assert jobs["profile_ncu_kernels"] == jobs["profile_ncu_parse"] == 4
    assert jobs["profile_collect"] == 1 and jobs["profile_collect_ncu"] == 1
    out = proc.stdout
    assert "scalestudy profile capture --run w4_lb256_bf16_ddp_bk25_r0 --tool auto" in out
    assert (
        "--profile-steps 20:30" in out
        and "--out results/profile/w4_lb256_bf16_ddp_bk25_r0/capture" in out
    )
    assert "scalestudy profile ncu --run w1_lb256_fp32_ddp_bk25_r0" in out
    assert "--top-k 5 --launch-skip 10 --launch-count 3" in out
    run = "w1_lb256_fp32_ddp_bk25_r0"
    assert (
        f"scalestudy profile ncu-kernels --kernels results/profile/{run}/kernels.csv "
        f"--out results/profile/{run}/ncu_kernels.json"
    ) in out
    assert f"--kernels results/profile/{run}/ncu_kernels.json" in out
    assert (
        f"scalestudy profile parse --ncu results/profile/{run}/ncu --run {run} "
        f"--out-ncu results/profile/{run}/ncu.csv"
    ) in out
    # each merge names the run of each per-run CSV, in the order of its inputs
    merges = [ln.strip() for ln in out.splitlines() if "scalestudy profile merge" in ln]
    for schema_name in ("kernels", "ranges", "ncu"):
        line = next(ln for ln in merges if f"--schema {schema_name} " in ln)
        argv = shlex.split(line.split(f"--schema {schema_name} ", 1)[1].split(" && ")[0])
        runs = [argv[i + 1] for i, word in enumerate(argv) if word == "--run"]
        inputs = [w for w in argv if w.startswith("results/profile/")]
        assert len(runs) == 4 and [Path(w).parent.name for w in inputs] == runs, line


def test_profiling_off_or_on_cpu_changes_the_dag(repo_copy):
    cfg = yaml.safe_load((repo_copy / "config" / "demo.yaml").read_text())
    cfg["dataset"] = "synthetic"
    write_config(repo_copy / "demo-syn.yaml", cfg)
    jobs = planned_jobs(snakemake(repo_copy, "--configfile", "demo-syn.yaml", "-n", timeout=300))
    assert jobs["profile_capture"] == 2 and "profile_ncu" not in jobs  # no ncu on cpu
    cfg["profiling"]["enabled"] = False
    write_config(repo_copy / "demo-off.yaml", cfg)
    jobs = planned_jobs(snakemake(repo_copy, "--configfile", "demo-off.yaml", "-n", timeout=300))
    assert not any(name.startswith("profile") for name in jobs)
    cfg["profiling"].update(enabled=True, tool="nsys")
    write_config(repo_copy / "demo-nsys.yaml", cfg)
    proc = snakemake(repo_copy, "--configfile", "demo-nsys.yaml", "-n", check=False, timeout=300)
    assert proc.returncode != 0 and "profiling.tool" in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "manifest", [{"tool": "ncu", "why": "x", "kernels": ["k"]}, {}, [1, 2]], ids=["ncu", "{}", "[]"]
)
def test_parse_of_a_directory_that_is_no_capture_is_one_line(tmp_path, manifest):
    """`profile parse --capture` on profile ncu's directory (its tool.json has no input), or
    on any other JSON: the manifest's path and what it lacks, not a KeyError."""
    cap = tmp_path / "ncu"
    cap.mkdir()
    (cap / "tool.json").write_text(json.dumps(manifest))
    with pytest.raises(ProfileFormatError, match=r"tool\.json: has no tool/input/why.*--ncu"):
        parse_job._capture_input(cap)


@pytest.mark.parametrize(
    "manifest, says",
    [
        ({"tool": "nsyss", "input": "stats", "why": "x"}, "has tool 'nsyss' and input 'stats'"),
        ({"tool": "torch", "input": 3, "why": "x"}, "has tool 'torch' and input 3"),
        (b'{"tool": "torch\xe9"}', "unreadable"),  # Latin-1, not UTF-8
        # a world size edited to a string, a float or 0 checked no rank's kernels at all
        ({"tool": "torch", "input": "t", "why": "x", "world_size": "2"}, "has world_size '2'"),
        ({"tool": "nsys", "input": "s", "why": "x", "world_size": 2.0}, "has world_size 2.0"),
        ({"tool": "nsys", "input": "s", "why": "x", "world_size": 0}, "has world_size 0"),
        ({"tool": "nsys", "input": "s", "why": "x", "world_size": True}, "has world_size True"),
    ],
    ids=["tool-typo", "input-number", "not-utf8", "ws-text", "ws-float", "ws-0", "ws-bool"],
)
def test_a_damaged_capture_manifest_is_one_line(tmp_path, manifest, says):
    """A typo in tool.json's tool was once parsed as a torch capture; a number as its input
    or bytes that are not UTF-8 were a traceback; a world size that is not a whole number of
    ranks checked none (a lost rank's file left it out of every sum)."""
    (tmp_path / "tool.json").write_bytes(
        manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    )
    with pytest.raises(ProfileFormatError, match=re.escape(says)):
        parse_job._capture_input(tmp_path)


@pytest.mark.parametrize("world_size", [1, 2, None])
def test_a_captures_own_manifest_is_read(tmp_path, world_size):
    """What `profile capture` writes passes the manifest checks: world_size nodes x ranks per
    node, 1 for a one-GPU capture (refused once a check asked for more), or none (a capture
    from before it was recorded)."""
    manifest = {"tool": "torch", "input": "train/profile", "why": "no GPU", "run": "r"}
    if world_size is not None:
        manifest["world_size"] = world_size
    (tmp_path / "tool.json").write_text(json.dumps(manifest))
    tool, source, why, read = parse_job._capture_input(tmp_path)
    assert (tool, source, why) == ("torch", tmp_path / "train/profile", "no GPU")
    assert read.get("world_size") == world_size


def test_a_stats_directory_with_other_reports_is_read_and_a_second_table_refused(tmp_path):
    """`nsys stats` with its default reports also writes cuda_api_sum, osrt_sum, and SKIPPED
    files: they failed the parse ("no nsys stats header found"). A copy of a kernel summary
    was counted twice (instances 400 for 200)."""
    shutil.copytree(FIX / "nsys-2024.5", tmp_path / "stats")
    stats = tmp_path / "stats"
    (stats / "nsys_rank0_cuda_api_sum.csv").write_text(
        "Time (%),Total Time (ns),Num Calls,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n"
        "90.0,1000,10,100.0,100.0,90,110,5.0,cudaLaunchKernel\n"
    )
    (stats / "nsys_rank0_openmp_sum.csv").write_text(
        "SKIPPED: nsys_rank0.sqlite does not contain OpenMP event data.\n"
    )
    assert nsys.parse_nsys(stats, "r") == nsys.parse_nsys(FIX / "nsys-2024.5", "r")
    copy = stats / "nsys_rank0_cuda_gpu_kern_sum (copy).csv"
    shutil.copy(stats / "nsys_rank0_cuda_gpu_kern_sum.csv", copy)
    with pytest.raises(ProfileFormatError, match=r"rank 0 has a second kernel summary table"):
        nsys.parse_nsys(stats, "r")
    copy.unlink()
    # a table of a report read here that is broken is still an error, not left out
    (stats / "nsys_rank1_cuda_gpu_kern_sum.csv").write_text("Time (%),garbage\n")
    with pytest.raises(ProfileFormatError, match="nsys_rank1_cuda_gpu_kern_sum.csv"):
        nsys.parse_nsys(stats, "r")


def test_a_capture_that_profiled_nothing_fails_and_an_earlier_capture_is_cleared(
    data_dir, tmp_path
):
    """A --profile-steps window past the run's last step exited 0 with a tool.json pointing at
    nothing (now the trainer refuses it, in one line naming the window and the run's steps,
    and the capture fails); a second capture into one --out kept the first one's rank
    reports, parsed with its own (--ranks 0 after all: rank 1 of the earlier capture)."""
    cap = tmp_path / "capture"
    (cap / "stats").mkdir(parents=True)
    (cap / "stats" / "nsys_rank1_cuda_gpu_kern_sum.csv").write_text("old\n")
    (cap / "nsys_rank1.nsys-rep").write_text("old\n")
    (cap / "tool.json").write_text('{"tool": "nsys"}\n')
    (cap / "notes.txt").write_text("the user's own\n")
    proc = _capture(data_dir, cap, "--profile-steps", "100:200", tool="torch")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    refused = "--profile-steps 100:200 profiles optimizer steps 100 to 199, but this run takes 6"
    assert refused in proc.stderr, proc.stderr[-2000:]
    assert "failed with exit" in proc.stderr.splitlines()[-1]
    # the earlier capture is gone, the user's file kept; the refused trainer wrote nothing
    assert sorted(p.name for p in cap.iterdir()) == ["notes.txt"]


def test_profile_parse_writes_both_csvs_or_neither(tmp_path, capsys, monkeypatch):
    """profile parse wrote --out-kernels, then --out-ranges: a full disk at the second left
    the new kernels beside the old ranges. Both now go to temp files first
    (files.write_texts)."""
    from scalestudy import cli

    out = tmp_path / "out"
    out.mkdir()
    old = {out / "k.csv": "old kernels\n", out / "r.csv": "old ranges\n"}
    for path, text in old.items():
        path.write_text(text)
    argv = ["profile", "parse", "--nsys-stats", str(FIX / "nsys-2024.5"), "--run", "r",
            "--out-kernels", str(out / "k.csv"), "--out-ranges", str(out / "r.csv")]  # fmt: skip
    capsys.readouterr()
    fsync_fails_at_file(monkeypatch, 2)
    assert cli.main(argv) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err == f"scalestudy profile parse: {out / 'r.csv'}: No space left on device"
    assert {p: p.read_text() for p in out.iterdir()} == old  # both old, no temp file
    monkeypatch.undo()
    assert cli.main(argv) == 0
    assert (out / "k.csv").read_text().startswith(",".join(schema.KERNEL_COLUMNS) + "\n")
    assert (out / "r.csv").read_text().startswith(",".join(schema.RANGE_COLUMNS) + "\n")


def test_profile_outputs_and_ncu_numbers_are_checked_before_anything_runs(tmp_path, capsys):
    from scalestudy import cli

    kernels, ranges = tmp_path / "k.csv", tmp_path / "ranges"
    ranges.mkdir()  # a directory where --out-ranges goes: k.csv was written, then it failed
    argv = ["profile", "parse", "--nsys-stats", str(FIX / "nsys-2024.5"), "--run", "r"]
    assert cli.main([*argv, "--out-kernels", str(kernels), "--out-ranges", str(ranges)]) == 2
    assert f"nothing written: {ranges}: is a directory" in capsys.readouterr().err
    assert not kernels.exists()
    bad = [("--top-k", "-1", "must be >= 1, got -1"), ("--launch-count", "0", "must be >= 1"),
           ("--launch-skip", "x", "must be a whole number, got 'x'")]  # fmt: skip
    for flag, value, says in bad:
        with pytest.raises(SystemExit):  # argparse's exit 2, before ncu's first pass
            cli.main(["profile", "ncu", "--kernels", str(kernels), flag, value,
                      "--out-dir", str(tmp_path / "n"),
                      "--run", "r", "--device", "cuda", "--", "--epochs", "1"])  # fmt: skip
        assert says in capsys.readouterr().err
    assert not (tmp_path / "n").exists()


def test_ncu_checks_its_outputs_before_the_first_pass(tmp_path, capsys, monkeypatch):
    """`profile ncu` ran every ncu pass (each a whole training run under ncu: hours on a
    cluster) before it found its output unwritable, then failed with an unclear line. Its
    output (--out-dir's tool.json) is checked first: one line naming the path, no pass, nothing
    written."""
    kernels = tmp_path / "ncu_kernels.json"
    kernels.write_text(json.dumps([ncu_kernels.candidate("conv_kernel", 3)]))
    monkeypatch.setenv("PATH", f"{STAND_INS / 'ncu-cudnn-autotune'}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)

    def no_pass(*_, **__):
        raise AssertionError("an ncu pass ran")

    monkeypatch.setattr(capture, "run_logged", no_pass)
    blocker, taken = tmp_path / "blocker", tmp_path / "taken"
    blocker.write_text("")
    (taken / "tool.json").mkdir(parents=True)
    cases = [
        (taken, f"{taken / 'tool.json'}: is a directory, not a file"),
        (blocker / "ncu", f"{blocker / 'ncu'}: cannot be made: {blocker}"),
    ]
    for enabled in ("true", "auto"):
        for out_dir, says in cases:
            argv = ["profile", "ncu", "--run", "w1", "--kernels", str(kernels),
                    "--enabled", enabled, "--top-k", "1", "--out-dir", str(out_dir),
                    "--device", "cuda", "--mpi=", "--", "--epochs", "1"]  # fmt: skip
            assert cli.main(argv) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and f"nothing written: {says}" in err[0], err
            assert sorted(p.name for p in taken.iterdir()) == ["tool.json"]
            assert not (blocker / "ncu").exists()


def test_the_ncu_kernels_file_is_checked_before_the_first_pass(tmp_path, capsys, monkeypatch):
    """The ncu job reads the kernels `profile ncu-kernels` chose: a damaged or foreign file is
    one line naming it, the entry and the command that makes it again, before any pass."""
    monkeypatch.setenv("PATH", f"{STAND_INS / 'ncu-cudnn-autotune'}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(capture, "run_logged", lambda *_, **__: pytest.fail("an ncu pass ran"))
    good = ncu_kernels.candidate("conv_kernel", 3)
    kernels = tmp_path / "ncu_kernels.json"
    cases = [
        ("not json", "not JSON"),
        (json.dumps({"kernel": "k"}), "not a JSON list of kernels"),
        (json.dumps([{**good, "instances": True}]), "kernel 0: its instances is True"),
        (json.dumps([good, {**good, "name_base": "full"}]), "kernel 1: its name_base is 'full'"),
        (json.dumps([{k: v for k, v in good.items() if k != "kernel_regex"}]), "not an object"),
        (json.dumps([{**good, "rank": 0}]), "not an object of the keys"),
        (json.dumps([{**good, "instances": -1}]), "kernel 0: its instances is -1"),
        (json.dumps([{**good, "kernel_regex": "^conv_kernel($"}]), "is no regex"),
        (json.dumps([good, good]), "kernel 1: 'conv_kernel' again"),
        (json.dumps([]), "no non-NCCL kernel of w1 to profile with ncu"),
    ]
    for text, says in cases:
        kernels.write_text(text)
        argv = ["profile", "ncu", "--run", "w1", "--kernels", str(kernels), "--top-k", "1",
                "--out-dir", str(tmp_path / "ncu"), "--device", "cuda", "--mpi=", "--",
                "--epochs", "1", "--profile-steps", "0:1"]  # fmt: skip
        assert cli.main(argv) == 2
        (err,) = capsys.readouterr().err.strip().splitlines()
        assert err.startswith(f"scalestudy profile ncu: {kernels}") and says in err, err
        fix = ncu_job.NO_KERNEL_FIX if says.startswith("no non-NCCL") else ncu_job.KERNELS_FIX
        assert err.endswith(fix), err


def test_profile_ncu_without_a_gpu_writes_its_manifest_whole(tmp_path, capsys, monkeypatch):
    """Without a GPU under enabled auto, profile ncu writes a tool.json of tool "none" saying
    why (the earlier run's removed), and its parse an empty profile_ncu CSV; a full disk at
    that write is one line and leaves no temp file."""
    kernels, out_dir = tmp_path / "ncu_kernels.json", tmp_path / "n"
    kernels.write_text("[]")
    out_dir.mkdir()
    (out_dir / "tool.json").write_text('{"tool": "ncu"}\n')  # the earlier run's: cleared
    argv = ["profile", "ncu", "--run", "w1", "--kernels", str(kernels), "--enabled", "auto",
            "--out-dir", str(out_dir), "--device", "cpu", "--",
            "--epochs", "1"]  # fmt: skip
    capsys.readouterr()
    fsync_fails_at_file(monkeypatch, 1)
    assert cli.main(argv) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err == f"scalestudy profile ncu: {out_dir / 'tool.json'}: No space left on device"
    assert list(out_dir.iterdir()) == []  # no temp file
    monkeypatch.undo()
    assert cli.main(argv) == 0
    manifest = json.loads((out_dir / "tool.json").read_text())
    assert manifest["tool"] == "none" and "no GPU (hardware.device: cpu)" in manifest["why"]
    assert _parse_ncu(out_dir).read_text() == ",".join(schema.NCU_COLUMNS) + "\n"


def test_ncu_clears_an_earlier_runs_results_and_writes_each_import_whole(
    tmp_path, capsys, monkeypatch
):
    """`profile ncu` never cleared its --out-dir: after a rerun with a smaller top_k (or one
    skipped under auto) the earlier run's ncu_k<i>.csv lay beside a tool.json that does not
    list them, and `profile parse --ncu DIR` (every *.csv of the directory) read them as this
    run's kernels; and an `ncu --import` that failed half-way left a half-written ncu_k<i>.csv.
    Now the earlier run's files (tool.json, ncu_k<i>.{csv,ncu-rep,log}) are removed once the
    command's checks have passed (the user's own files kept), and each import is written whole
    or not at all. The ncu passes (a training run each) are faked: the fake writes each pass's
    log and the report the stand-in ncu would (tests/stand-ins/ncu-cudnn-autotune), whose
    `ncu --import` then runs for real."""
    a = "void at::native::batch_norm_collect_statistics_channels_last_kernel<float>(float *)"
    b = "void at::native::batch_norm_backward_kernel<float>(float *)"
    kernels = tmp_path / "ncu_kernels.json"
    launched = [{"name": a, "instances": 3, "total_ns": 9000},
                {"name": b, "instances": 3, "total_ns": 5000}]  # fmt: skip
    rows = schema.kernel_rows("w1", "nsys", {0: launched})
    kernels.write_text(json.dumps(ncu_kernels.candidates(rows)))
    monkeypatch.setenv("PATH", f"{STAND_INS / 'ncu-cudnn-autotune'}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    canned = REPO / "tests" / "fixtures" / "gpu-h200" / "ncu_k0.csv"

    def ncu_pass(argv, env, log_path):  # what the stand-in's pass leaves: its log, a report
        log_path.write_text("ncu pass\n")
        shutil.copyfile(canned, log_path.with_suffix(".ncu-rep"))
        return 0, ""

    monkeypatch.setattr(capture, "run_logged", ncu_pass)
    out_dir = tmp_path / "ncu"

    def earlier_run():  # an earlier run of both kernels, and a file of the user's
        shutil.rmtree(out_dir, ignore_errors=True)
        out_dir.mkdir()
        for i in (0, 1):
            shutil.copyfile(REPO / "tests" / "fixtures" / "gpu-h100-ncu" / f"ncu_k{i}.csv",
                            out_dir / f"ncu_k{i}.csv")  # fmt: skip
            (out_dir / f"ncu_k{i}.ncu-rep").write_text("earlier\n")
            (out_dir / f"ncu_k{i}.log").write_text("earlier\n")
        (out_dir / "tool.json").write_text(json.dumps({"tool": "ncu", "kernels": [a, b]}))
        (out_dir / "notes.txt").write_text("the user's own\n")
        return {p.name: p.read_bytes() for p in out_dir.iterdir()}

    def profile_ncu(*flags, device="cuda"):
        argv = ["profile", "ncu", "--run", "w1", "--kernels", str(kernels), *flags,
                "--out-dir", str(out_dir), "--device", device,
                "--mpi=", "--", "--epochs", "1", "--profile-steps", "0:1"]  # fmt: skip
        return cli.main(argv)

    def parse_dir():
        code = cli.main(["profile", "parse", "--ncu", str(out_dir), "--run", "w1",
                         "--out-ncu", str(tmp_path / "parsed.csv")])  # fmt: skip
        return code, list(csv.DictReader((tmp_path / "parsed.csv").open())) if code == 0 else []

    # a rerun with top_k 1: only its kernel's files, and parse of the directory reads only it
    earlier_run()
    assert profile_ncu("--enabled", "auto", "--top-k", "1") == 0
    names = sorted(p.name for p in out_dir.iterdir())
    assert names == ["ncu_k0.csv", "ncu_k0.log", "ncu_k0.ncu-rep", "notes.txt", "tool.json"]
    manifest = json.loads((out_dir / "tool.json").read_text())
    assert (manifest["kernels"], manifest["csv"]) == ([a], ["ncu_k0.csv"])
    code, parsed = parse_dir()  # the kernel under the kernels table's name, not ncu's
    assert code == 0 and [r["kernel"] for r in parsed] == [a]
    assert (out_dir / "ncu_k0.csv").read_bytes() == canned.read_bytes()
    # ncu skipped under auto (no GPU): tool.json says why, no earlier kernel is left to parse
    earlier_run()
    assert profile_ncu("--enabled", "auto", device="cpu") == 0
    assert sorted(p.name for p in out_dir.iterdir()) == ["notes.txt", "tool.json"]
    assert json.loads((out_dir / "tool.json").read_text())["tool"] == "none"
    assert parse_dir() == (0, [])
    capsys.readouterr()
    # refused before anything ran (enabled true without a GPU): the earlier run is left
    before = earlier_run()
    assert profile_ncu("--enabled", "true", device="cpu") == 2
    assert {p.name: p.read_bytes() for p in out_dir.iterdir()} == before
    # an import that fails half-way (here: prints half the report, exits 1) writes no CSV
    earlier_run()
    half = [PYTHON, "-c", "import sys; sys.stdout.write(open(sys.argv[1]).read()[:400]); "
            "sys.exit(1)"]  # fmt: skip
    monkeypatch.setattr(ncu_job, "ncu_import_command", lambda report: [*half, report])
    assert profile_ncu("--enabled", "true", "--top-k", "1") == 2
    assert "failed with exit 1" in capsys.readouterr().err.strip().splitlines()[-1]
    assert not any(p.name.startswith(("ncu_k0.csv", ".ncu_k0.csv")) for p in out_dir.iterdir())


def test_a_profiler_missing_where_a_rank_runs_is_one_line(tmp_path, capsys):
    """`profile rank` exec'd a profiler that was not there: FileNotFoundError's traceback."""
    from scalestudy import cli

    argv = ["profile", "rank", "--tool", "nsys", "--dir", str(tmp_path)]
    argv += ["--profiler", str(tmp_path / "no-nsys"), "--", "true"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"scalestudy profile rank: {tmp_path / 'no-nsys'} is not on PATH here " \
                  "(inside the container, if any)"  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--ranks-per-node", "0", "--", "--epochs", "1"], "--ranks-per-node: must be >= 1, got 0"),
        (["--cpus-per-rank", "x", "--", "--epochs", "1"], "must be a whole number, got 'x'"),
        (["--", "--lr", "-1"], "the trainer's flags after --: "),
        (["--gpu", "--", "--epochs", "1"], "--gpu passes --nv to apptainer: it needs --container"),
    ],
    ids=["layout-count", "not-a-number", "trainer-flag", "gpu-without-container"],
)
def test_a_bad_capture_command_leaves_the_earlier_capture(
    tmp_path, capsys, monkeypatch, flags, says
):
    """`profile capture` removed the earlier capture in --out (and wrote --inventory) before it
    checked its layout counts and the trainer's flags: a typo destroyed the previous capture.
    Now the one line comes first, and --out and the inventory are left as they were."""
    _refused_capture_leaves_the_earlier_one(
        tmp_path, capsys, monkeypatch, tmp_path / "inv.json", flags, says
    )
    assert not (tmp_path / "inv.json").exists()


def test_a_capture_wider_than_the_machine_leaves_the_earlier_capture(tmp_path, capsys, monkeypatch):
    """The GPU slots were taken after the earlier capture was cleared and the inventory
    written: --ranks-per-node 2 on a machine showing 1 GPU was refused in one line, the
    earlier capture gone and its inventory overwritten. The slots come first now (as in
    `profile ncu`)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    flags = ["--device", "cuda", "--ranks-per-node", "2", "--"]
    flags += ["--device", "cuda", "--epochs", "1", "--profile-steps", "2:3"]
    _refused_capture_leaves_the_earlier_one(
        tmp_path, capsys, monkeypatch, tmp_path / "inv.json", flags, "needs 2 GPUs on one machine"
    )
    assert not (tmp_path / "inv.json").exists()


def test_an_unwritable_inventory_leaves_the_earlier_capture(tmp_path, capsys, monkeypatch):
    """--out was checked before the earlier capture was cleared, --inventory not: a bad
    inventory path cleared the earlier capture, then failed at the inventory's write."""
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    for inventory, says in [
        (blocker / "inv.json", f"--inventory {blocker / 'inv.json'}: {blocker}: is a file"),
        (tmp_path, f"--inventory {tmp_path}: {tmp_path}: is a directory, not a file"),
    ]:
        flags = ["--", "--epochs", "1"]
        _refused_capture_leaves_the_earlier_one(
            tmp_path, capsys, monkeypatch, inventory, flags, says
        )


def _refused_capture_leaves_the_earlier_one(tmp_path, capsys, monkeypatch, inventory, flags, says):
    """`profile capture` into a --out that holds an earlier capture, refused in one line that
    says `says`: nothing started, the earlier capture's files as they were."""
    cap = tmp_path / "cap"
    shutil.rmtree(cap, ignore_errors=True)
    (cap / "stats").mkdir(parents=True)
    (cap / "train" / "profile").mkdir(parents=True)
    (cap / "tool.json").write_text('{"run": "r1", "tool": "torch", "input": "train/profile"}\n')
    (cap / "train" / "profile" / "torch_ops_rank0.json").write_text("{}\n")
    (cap / "stats" / "nsys_rank0_cuda_gpu_kern_sum.csv").write_text("old\n")
    before = {p: p.read_bytes() for p in cap.rglob("*") if p.is_file()}
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)

    def no_ranks(*_, **__):
        raise AssertionError("the ranks were started")

    monkeypatch.setattr(capture, "run_launch", no_ranks)
    argv = ["profile", "capture", "--run", "r1", "--tool", "torch", "--device", "cpu"]
    argv += ["--out", str(cap), "--inventory", str(inventory), "--mpi=", *flags]
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own one line
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert {p: p.read_bytes() for p in cap.rglob("*") if p.is_file()} == before
    assert len(err) == 1 and says in err[0], err


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(p) for p in (task / "children").read_text().split()]
    return out


def test_a_stop_signal_to_a_capture_alone_stops_its_ranks(data_dir, tmp_path):
    """SIGTERM to `profile capture` alone (a job's own process killed: `timeout`, a batch
    system, `kill PID`): the capture died of it at once, and its launch and ranks trained on,
    orphaned, holding the device. The signal is now passed on to the launch, which stops the
    ranks, and the capture ends with them (128 + 15), leaving none behind."""
    from workflow_helpers import worker_pids

    cmd = [PYTHON, "-m", "scalestudy", "profile", "capture", "--run", "w2_test", "--tool",
           "torch", "--device", "cpu", "--out", str(tmp_path / "cap"), "--mpi=", "--nodes", "1",
           "--ranks-per-node", "2", "--cpus-per-rank", "1", "--", "--dataset", "synthetic",
           "--width", "4", "--local-batch", "16", "--epochs", "1000", "--warmup-steps", "1",
           "--comm-probe-steps", "0", "--profile-steps", "1:2",
           "--data-dir", str(data_dir)]  # fmt: skip
    log = tmp_path / "capture.log"  # a file: orphaned ranks would hold a pipe open
    with log.open("w") as f:
        proc = subprocess.Popen(
            cmd, env=child_env(), stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while "[rank 0/2" not in log.read_text():  # the ranks are under way
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        (launcher,) = _children(proc.pid)
        ranks = list(worker_pids(launcher).values())
        assert len(ranks) == 2, ranks
        proc.send_signal(signal.SIGTERM)  # the capture only
        proc.wait(timeout=120)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in ranks):
            time.sleep(0.2)
        out = log.read_text()
        alive = [p for p in ranks if Path(f"/proc/{p}").exists()]
        assert not alive, f"ranks {alive} outlived the capture:\n{out}"
        assert proc.returncode == 128 + signal.SIGTERM, out
        assert "Traceback" not in out, out
        # the launch's stop, said once: cli's own handler (the command's again after the
        # launch) adds no second line
        said = "scalestudy profile capture: stopped by SIGTERM (passed on to the ranks' launch)"
        assert out.strip().splitlines()[-1] == said, out
        assert out.count("stopped by SIGTERM") == 3, out  # rank 0, the launch, the capture
    finally:
        proc.kill()
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# the `profile capture` / `profile ncu` process of the stop test below: its ranks' launch
# replaced (a report left where the launch would leave it), then the program's own entry point
_STOPPED_TOOL_DRIVER = """
import sys
from pathlib import Path

from scalestudy import cli
from scalestudy.jobs import launch
from scalestudy.jobs import profile as capture

MAGIC = "SCALESTUDY NSYS STAND-IN REPORT"  # the nsys stand-in's report (what its stats reads)
action, out = sys.argv[1], Path(sys.argv[2])


def capture_launch(argv, env, stdout=None, stderr=None):
    (out / "nsys_rank0.nsys-rep").write_text(MAGIC + "\\n")
    return 0


def ncu_launch(argv, env, log_path):
    (out / "ncu_k0.ncu-rep").write_text("a report\\n")
    log_path.write_text("")
    return 0, ""


launch.hold_local_gpus = lambda *a, **k: None
capture.run_launch = capture_launch
capture.run_logged = ncu_launch
sys.argv = ["scalestudy", "profile", action, "--run", "r", "--device", "cuda", *sys.argv[3:]]
raise SystemExit(cli.main())
"""


@pytest.mark.parametrize("action", ["capture", "ncu"])
def test_a_stop_signal_after_the_launch_stops_the_tool_and_leaves_no_temp_file(tmp_path, action):
    """SIGTERM to `profile capture` or `profile ncu` after the ranks' launch, while it ran a
    tool (`nsys stats` of a rank's report, `ncu --import` into its CSV: up to TOOL_TIMEOUT_S
    each): no handler was left for it (the commands were in cli.OWN_STOP, and the launch's own
    was gone), so the job died on the spot, said nothing, left the import's temp file in the
    output directory, and the tool ran on, orphaned, without its time limit. Now it stops as
    every command does: the tool killed, the temp file removed, one line, death by the signal.
    STAND-INS for the launch (the driver above) and for the slow tool (a wrapper that sleeps)."""
    bin_dir, pid_file = tmp_path / "bin", tmp_path / "tool.pid"
    bin_dir.mkdir()
    tool = "nsys" if action == "capture" else "ncu"
    slow = "stats" if tool == "nsys" else "--import"
    (bin_dir / tool).write_text(
        f'#!/bin/sh\nif [ "$1" = {slow} ]; then echo $$ > {shlex.quote(str(pid_file))}; '
        f'exec sleep 60; fi\nexec {shlex.quote(str(STAND_INS / "nsys"))} "$@"\n'
    )
    (bin_dir / tool).chmod(0o755)
    out = tmp_path / "o"
    if action == "capture":
        words = ["--tool", "nsys", "--out", str(out)]
    else:
        rows = [{"run": "r", "rank": 0, "tool": "nsys", "kernel": "ampere_sgemm_128x64_tn",
                 "category": "gemm", "instances": 20, "total_ns": 1000, "share": 1.0}]  # fmt: skip
        kernels = tmp_path / "ncu_kernels.json"
        kernels.write_text(json.dumps(ncu_kernels.candidates(rows)))
        words = ["--kernels", str(kernels), "--out-dir", str(out)]
    out.mkdir()
    driver = tmp_path / "driver.py"
    driver.write_text(_STOPPED_TOOL_DRIVER)
    cmd = [PYTHON, str(driver), action, str(out), *words, "--", "--device", "cuda",
           "--profile-steps", "2:4"]  # fmt: skip
    env = child_env(PATH=os.pathsep.join([str(bin_dir), os.environ["PATH"]]))
    err = tmp_path / "stderr"  # a file: an orphaned tool would hold a pipe open
    with err.open("w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=f)
    tool_pid = None
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        tool_pid = int(pid_file.read_text())
        time.sleep(0.2)  # the tool's shell has exec'd its sleep
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        said = err.read_text()
        deadline = time.monotonic() + 5
        while running(tool_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(tool_pid), f"`{tool} {slow}` outlived the job:\n{said}"
        assert said.strip().splitlines()[-1] == f"scalestudy profile {action}: stopped by SIGTERM"
        assert proc.returncode == -signal.SIGTERM, said
        assert not [p.name for p in out.rglob("*.tmp")]
        assert "Traceback" not in said, said
    finally:
        proc.kill()
        if tool_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(tool_pid, signal.SIGKILL)


def test_every_profile_action_runs_a_function_of_its_module():
    """`scalestudy profile`'s actions are found by name when they run (capture's code input is
    not the parsers'): each names a function that exists, and every action the parser offers
    has one."""
    import importlib

    parser = cli.build_parser(["profile", "merge", "--schema", "ncu", "--out", "x", "y"])
    actions = parser.commands["profile"]._subparsers._group_actions[0].choices
    assert set(capture.ACTIONS) == set(actions)
    for target in capture.ACTIONS.values():
        module, name = target.split(":")
        assert callable(getattr(importlib.import_module(module), name))


@pytest.mark.parametrize("source", ["ncu", "nsys-stats"])
def test_a_parse_output_inside_the_directory_it_reads_is_refused_and_writes_nothing(
    tmp_path, capsys, source
):
    """`profile parse --ncu D --out-ncu D/ncu_k0.csv` replaced the raw ncu export it had just
    read (GPU time to make again) and exited 0; the next parse of D failed with "no ncu details
    header found". The same with an nsys stats CSV. An output inside a directory parse reads is
    refused before any work."""
    from scalestudy import cli

    if source == "ncu":
        d = shutil.copytree(Path(__file__).parent / "fixtures" / "gpu-h100-ncu", tmp_path / "n")
        victim = d / "ncu_k0.csv"
        argv = ["profile", "parse", "--ncu", str(d), "--run", "r", "--out-ncu", str(victim)]
        fine = [*argv[:-1], str(tmp_path / "ncu.csv")]
    else:
        d = shutil.copytree(FIX / "nsys-2024.5", tmp_path / "s")
        victim = next(d.glob("*cuda_gpu_kern_sum*.csv"))
        argv = ["profile", "parse", "--nsys-stats", str(d), "--run", "r"]
        fine = [*argv, "--out-kernels", str(tmp_path / "k.csv")]
        argv += ["--out-kernels", str(victim)]
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "nothing written: --out-" in err and f"is inside --{source} {d}" in err, err
    assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before
    assert cli.main(fine) == 0  # outside it: parsed as before


def test_an_nsys_that_left_only_its_raw_qdstrm_is_named_so(tmp_path):
    """An nsys installed without its host directory writes the raw .qdstrm and never converts it
    to a .nsys-rep (NVIDIA's guide; seen on the project's H100 machines, gpu-machine.md): the
    capture said "did the trainer reach --profile-steps?", a cause that was not it, with no fix,
    and the next capture left the old .qdstrm files beside its own."""
    out = tmp_path / "capture"
    out.mkdir()
    for r in (0, 1):
        (out / f"nsys_rank{r}.qdstrm").write_bytes(b"raw")
    with pytest.raises(ProfileError) as refused:
        capture.nsys_stats(out, {})
    said = str(refused.value)
    assert said.startswith(
        f"nsys wrote its raw capture ({out / 'nsys_rank0.qdstrm'}, 2 ranks) but no report"
    ), said
    assert "profiling.tool: torch" in said and "--profile-steps" not in said, said
    capture._clear_earlier_capture(out)  # a capture after it starts without them
    assert list(out.iterdir()) == []
