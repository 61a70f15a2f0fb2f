"""The category (schema.CATEGORIES) of a GPU kernel or torch.profiler op name."""

from __future__ import annotations

import re

# kernel / op categories. First match wins: NCCL kernels contain "reduce" and "copy", cuDNN
# convolutions contain "gemm", so the specific patterns come before the generic ones.
# Decisions on names that fit two classes:
# - cuDNN's direct and explicit-GEMM convolutions (cudnn::detail::wgrad_alg0_engine,
#   dgrad_engine, explicit_convolve_sgemm, precomputed_convolve_sgemm) and its cudnn::gemm::
#   helpers (computeOffsetsKernel: im2col offsets) are conv: PyTorch calls cuDNN for
#   convolutions, never for a plain matrix product.
# - DDP's reducer bookkeeping (torch.distributed.ddp.reducer::..., bucket views and unused-parameter
#   search on the CPU) is no collective and no reduction: "reducer" falls through to other.
# - pooling (max, average, adaptive average and their gradients) reduces a window: reduce.
# - kernels torch.compile generated (the default on CUDA): inductor names them by kind and by the
#   aten ops it fused (triton_poi_fused_add_relu_3, triton_red_fused_native_batch_norm_...;
#   cpp_fused_... on a CPU): one that fuses a batch norm is batchnorm, a convolution conv
#   (its convolutions stay cuDNN's), then a pointwise kernel (poi) is elementwise, a reduction
#   (red, per: persistent reduction) reduce, a template (tem: a generated matmul) gemm. The
#   batch-norm rule comes before the convolution patterns: a pointwise kernel fusing
#   native_batch_norm_backward with the pointwise tail of convolution_backward computes no
#   convolution (9.8 % of the H200's compiled bf16 step, tests/fixtures/gpu-h200/).
#   With torch._inductor.config.cpp.enable_kernel_profile on when it compiled, inductor names a
#   CPU kernel graph_<n>_cpp_fused_... (torch 2.14): the graph_<n>_ prefix is dropped first.
# - compiled: `## Call CompiledFxGraph <hash> ##`, the call of a graph torch.compile made, whose
#   self time on a CPU is its fused C++ kernels' (no profiler events of their own by default):
#   the graph's time, not broken down (torch_ops.py counts it; GPU kernels are their own rows).
# - cuDNN's bundled CUTLASS and XMMA kernels (namespaces and names with `_5x_cudnn`: implicit-GEMM
#   fprop/dgrad/wgrad, their split-K reduction ReduceSplitK) and its layout helpers
#   (nchwToNhwc, nhwcAddPaddingKernel) are conv: PyTorch calls cuDNN for convolutions only.
#   So are cuDNN 8's: its CUTLASS kernels by their CUTLASS convolution operation
#   (cutlass::Kernel<cutlass_tensorop_s1688wgrad_...>, ..._dgrad_...; CUTLASS names its GEMMs
#   ...gemm...), its implicit-GEMM helpers (namespace cask_cudnn: computeOffsetsKernel), and
#   cuDNN 7/8's own kernels, named <arch>_[<type>_]<precision letter>[<MMA shape>]cudnn_<tile>
#   (volta_scudnn_128x64, volta_h884cudnn_256x128, turing_fp16_s1688cudnn_fp16_128x128,
#   volta_hcudnn_128x128): a letter right before "cudnn_", so aten::cudnn_batch_norm stays
#   a batch norm.
# - NCCL's kernels (ncclDevKernel_*, older ncclKernel_*, and older still
#   nccl<Collective><Algo><Proto>Kernel_*: any mangled name starting nccl) are nccl wherever the
#   name holds them:
#   as an Itanium symbol (`_Z43ncclDevKernel_ReduceScatter_...`, nsys's :mangled names or one
#   the profiler could not demangle) they start with _Z<length>, and as reduce or other
#   schema.top_kernels would hand one to ncu, whose serialised launch waits for its peers.
# - FSDP2's record_function ranges (FSDP::..., fsdp::...) by what they do, not by the words
#   they share with the generic rules: the gradients' reduce-scatter and its wait
#   (FSDP::post_backward_reduce, post_backward_rs_wait; "reduce" made it a reduction) start or
#   wait for a collective: nccl, as the c10d calls (FSDP::all_gather is, by the generic rule;
#   torch_ops.py counts their self time outside the collective's span on gloo's thread);
#   the copies into and out of the collectives' buffers (fsdp::all_gather_copy_in,
#   FSDP::all_gather_copy_out, fsdp::split_with_sizes_copy, fsdp::chunk_cat; "all_gather" made
#   them collectives) are memcpy, and so are their CUDA kernels (chunk_cat_cuda_kernel,
#   split_with_sizes_copy_out_*, _foreach_copy_'s multi_tensor_apply_kernel<..., Copy<...>>:
#   "other" and "optimizer" by the generic rules). The rest is FSDP's bookkeeping: other.
# - only the name is read, not its parameter list: "cudnn::reduced_divisor" among a layout
#   kernel's parameters made it a reduction.

_CATEGORY_PATTERNS = [
    ("compiled", r"^## call compiledfxgraph "),
    (
        "memcpy",
        r"^fsdp::(all_gather_copy_(in|out)|split_with_sizes_copy|chunk_cat)\b"
        # their CUDA kernels (the copy in is _foreach_copy_'s multi-tensor kernel)
        r"|chunk_cat_cuda_kernel|split_with_sizes_copy_out|multi_tensor_apply_kernel<.*\bcopy<",
    ),
    (
        "nccl",
        r"^nccl|^_z\d+nccl|nccl(dev)?kernel|^gloo:|^c10d::|allreduce|all_reduce|allgather"
        r"|all_gather"
        r"|reduce_scatter|^fsdp::post_backward_(reduce|rs_wait)\b",
    ),
    ("memcpy", r"memcpy|memset|^aten::copy_$|^aten::_to_copy$"),
    ("batchnorm", r"^(triton_|cpp_fused_)\w*batch_norm"),
    (
        "conv",
        r"xmma_(fprop|dgrad|wgrad)|implicit_gemm|convolve|scudnn|(^|_)[a-z]\d*cudnn_|winograd"
        r"|cutlass_cudnn|_5x_cudnn|cask_cudnn\w*::|cutlass\w*(dgrad|wgrad)"
        r"|reduce_wgrad|fft2d|convolution|conv2d|cudnn::ops::nchwtonhwc|cudnn::ops::nhwctonchw"
        r"|nchwtonhwc|nhwctonchw|nhwcaddpadding|dgrad2d|wgrad2d|fprop"
        r"|(dgrad|wgrad)_(alg\d|engine)|cudnn::gemm::",
    ),
    ("batchnorm", r"bn_fw|bn_bw|batch_norm|batchnorm"),
    (
        "gemm",
        r"gemm|gemv|nvjet|splitkreduce|^aten::(addmm|mm|bmm|matmul|linear)$|cublas|^triton_tem_",
    ),
    (
        "optimizer",
        r"multi_tensor_apply|_foreach_|foreach_tensor|fused_sgd|fused_adam|optimizer\.step|sgd\.step",
    ),
    (
        "reduce",
        r"reduce(?!r)|max_pool|avg_pool|adaptive_avg|adaptive_average|pool2d|pooling|softmax"
        r"|nll_loss|cross_entropy|^aten::(sum|mean|argmax|max|amax|norm)$|^triton_(red|per)_",
    ),
    (
        "elementwise",
        # CatArrayBatchedCopy, gather_kernel: aten::cat's and aten::gather's CUDA kernels
        r"elementwise|catarraybatchedcopy|gather_kernel|^triton_poi_|^cpp_fused_"
        r"|^aten::(add|add_|mul|mul_|div|div_|relu|relu_"
        r"|threshold_backward|sub|sub_"
        r"|neg|clamp|clamp_|clamp_min|clamp_min_|clamp_max|clamp_max_|fill_|zero_|zeros|cat|flip"
        r"|where|pad|constant_pad_nd|lerp_|addcmul_"
        r"|addcdiv_|sqrt|rsub|exp|log|log_softmax|_log_softmax|eq|ne|lt|gt|index|index_select"
        r"|gather|scatter|masked_fill|masked_fill_|bitwise_not|contiguous|clone|empty_like"
        r"|ones_like|_unsafe_view)$",
    ),
]
_COMPILED = [(cat, re.compile(pat, re.IGNORECASE)) for cat, pat in _CATEGORY_PATTERNS]
# inductor's kernel profiling prefixes its CPU kernels' names with their graph
_GRAPH_PREFIX = re.compile(r"^graph_\d+_(?=cpp_)", re.IGNORECASE)


def parameter_list(text: str) -> int | None:
    """Where a demangled kernel signature's parameter list starts: the first '(' outside the
    template arguments; "(anonymous namespace)" starts the name or follows "::". None: no list."""
    depth = 0
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif ch == "(" and depth == 0 and i and text[i - 1] != ":":
            return i
    return None


def classify(name: str) -> str:
    """Category (CATEGORIES) of a kernel or op name, from the name and its template arguments:
    a leading `void `, inductor's `graph_<n>_` and the parameter list are ignored."""
    text = name.strip()
    if text.lower().startswith("void "):
        text = text[5:].lstrip()
    text = _GRAPH_PREFIX.sub("", text)
    text = text[: parameter_list(text)]
    for category, pattern in _COMPILED:
        if pattern.search(text):
            return category
    return "other"
