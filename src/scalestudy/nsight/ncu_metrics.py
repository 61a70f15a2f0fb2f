"""The counters `profile ncu` asks Nsight Compute for beyond --set full's details page (the FLOP
counters), and the rule by which it counts the tensor-core ones (ncu.py, the parser, holds a
copy: tests/test_resources.py keeps the two equal).

A module of its own: the ncu job (jobs/profile_ncu.py) imports this and none of the parsers, so
an edit to a parser reruns the parse of the reports (the workflow's profile_ncu_parse), never
Nsight Compute, a whole training run per kernel; an edit here changes what ncu measures, and
reruns it.
"""

from __future__ import annotations

import re

# tensor-core operations: per source type, its per-destination totals (..._src_bf16_dst_fp32.sum)
# where the GPU has them, else its src-only total (..._src_fp16.sum): asked for every per-dest
# total, an H100's ncu 2025.3 gave bf16 and tf32, no fp16 (tests/fixtures/gpu-h100-ncu), so an
# fp16 run's tensor operations can only be in the src-only total (not captured yet). A src-only
# total beside its per-destination ones, and the _sparsity_on/_off breakdowns, count the same
# operations again (ncu.py sums by this rule).
# (ncu.py, the parser, has its own copy: it imports nothing of the ncu job's)
TENSOR_METRIC = re.compile(r"^sm__ops_path_tensor_src_([a-z0-9]+)(_dst_[a-z0-9]+)?\.sum$")

# FLOP counters that --set full does not print in the details page: SASS f/h/d add, mul, fma
# (a fma is 2 FLOP) and the tensor-core paths (TENSOR_METRIC: the per-(source, destination) and
# src-only totals, not the _sparsity_on/_off breakdowns). A regex, not a list: a name the GPU
# lacks (bf16 before Ampere, fp16 per destination on an H100) would fail the whole ncu run, a
# regex just matches fewer.
NCU_METRICS = ",".join(
    [
        f"smsp__sass_thread_inst_executed_op_{p}{op}_pred_on.sum"
        for p in "hfd"
        for op in ("add", "mul", "fma")
    ]
    + ["regex:" + TENSOR_METRIC.pattern]
)
