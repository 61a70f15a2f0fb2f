"""`scalestudy parse-nsys --input <stats csv or dir> --run R --out kernels.csv [--out-ranges ..]`.

Reads `nsys stats --format csv` output (cuda_gpu_kern_sum, cuda_gpu_mem_time_sum, nvtx_sum, or the
pre-2023.1 gpukernsum, gpumemtimesum, nvtxsum; recognised by header) of one run, one file or a
directory of them (rank from `rank<r>` in the file name), and writes the profile_kernels and
profile_ranges schemas of scalestudy.nsight.schema (columns and units documented there).
"""

from __future__ import annotations

import argparse
import sys

from scalestudy import files
from scalestudy.errors import ProfileFormatError
from scalestudy.nsight import nsys, schema


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="nsys stats CSV, or a directory of them")
    parser.add_argument("--run", required=True, help="run id written into every row")
    parser.add_argument("--out", required=True, help="kernels CSV (profile_kernels schema)")
    parser.add_argument("--out-ranges", default=None, help="NVTX ranges CSV (profile_ranges)")


def run(args: argparse.Namespace) -> int:
    try:
        kernels, ranges = nsys.parse_nsys(args.input, args.run)
    except ProfileFormatError as exc:
        print(f"scalestudy parse-nsys: {exc}", file=sys.stderr)
        return 2
    files.write_text(args.out, schema.csv_text(schema.KERNEL_COLUMNS, kernels))
    if args.out_ranges:
        files.write_text(args.out_ranges, schema.csv_text(schema.RANGE_COLUMNS, ranges))
    print(f"{args.run}: {len(kernels)} kernel rows, {len(ranges)} range rows -> {args.out}")
    return 0
