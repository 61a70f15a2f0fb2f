"""`scalestudy parse-ncu --input <details csv or dir> --run R --out ncu.csv`.

Reads `ncu --csv --page details` output (one file, or every *.csv of a directory) and writes the
profile_ncu schema of scalestudy.nsight.schema: per kernel the mean duration, achieved occupancy,
DRAM and SM throughput and FLOP/s (tensor-core paths included) over the profiled launches.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scalestudy.errors import ProfileFormatError
from scalestudy.nsight import ncu, schema


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="ncu details CSV, or a directory of them")
    parser.add_argument("--run", required=True, help="run id written into every row")
    parser.add_argument("--out", required=True, help="CSV to write (profile_ncu schema)")


def run(args: argparse.Namespace) -> int:
    src = Path(args.input)
    files = sorted(src.glob("*.csv")) if src.is_dir() else [src]
    try:
        if not files:
            raise ProfileFormatError(src, None, "no ncu details CSV in this directory")
        rows = []
        for f in files:
            rows.extend(ncu.parse_ncu(f, args.run))
    except ProfileFormatError as exc:
        print(f"scalestudy parse-ncu: {exc}", file=sys.stderr)
        return 2
    files.write_text(args.out, schema.csv_text(schema.NCU_COLUMNS, rows))
    print(f"{args.run}: {len(rows)} kernels -> {args.out}")
    return 0
