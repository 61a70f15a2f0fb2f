"""Our trainer against the plain reference (benchmarks/reference_train.py), same machine, one run.

Both train the same network (scalestudy.trainer.models.resnet18 at --width), at the same local
batch, precision, world size and data, launched with torchrun; both measure throughput the same way
(images of all ranks / wall seconds over the steady-state window after --warmup-steps).
The ratio ours / reference is what the Trainer issue sets targets for (docs/benchmarks.md).

    python benchmarks/compare.py --data-dir results/data --dataset synthetic --nproc 2 \
        --width 16 --local-batch 64 --epochs 2 --precision fp32
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def torchrun(nproc: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--dataset", default="cifar10")
    p.add_argument("--nproc", type=int, default=2, help="ranks (GPUs, or CPU processes)")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--local-batch", type=int, default=512)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "fp16", "bf16"])
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--limit-train", type=int, default=0)
    p.add_argument("--ref-workers", type=int, default=2, help="DataLoader workers per rank")
    p.add_argument("--threads-per-rank", type=int, default=1, help="OMP_NUM_THREADS (CPU)")
    p.add_argument("--compile", action="store_true", help="torch.compile our trainer")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()

    meta = Path(args.data_dir) / args.dataset / "meta.json"
    if not meta.exists():
        sys.exit(
            f"missing {meta}: run `scalestudy prepare-data --dataset {args.dataset} "
            f"--data-dir {args.data_dir}` first"
        )
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads_per_rank), PYTHONUNBUFFERED="1")
    common = [
        "--data-dir",
        args.data_dir,
        "--dataset",
        args.dataset,
        "--width",
        str(args.width),
        "--local-batch",
        str(args.local_batch),
        "--epochs",
        str(args.epochs),
        "--precision",
        args.precision,
        "--warmup-steps",
        str(args.warmup_steps),
        "--limit-train",
        str(args.limit_train),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        ours_dir, ref_json = Path(tmp) / "ours", Path(tmp) / "reference.json"
        ours_cmd = [
            *torchrun(args.nproc),
            "-m",
            "scalestudy",
            "train",
            *common,
            "--comm-probe-steps",
            "0",
            "--out",
            str(ours_dir),
            *(["--compile"] if args.compile else []),
        ]
        ref_cmd = [
            *torchrun(args.nproc),
            str(HERE / "reference_train.py"),
            *common,
            "--num-workers",
            str(args.ref_workers),
            "--out",
            str(ref_json),
        ]
        for name, cmd in (("ours", ours_cmd), ("reference", ref_cmd)):
            print(f"--- {name}: {' '.join(cmd)}", flush=True)
            subprocess.run(cmd, env=env, check=True)
        ours = json.loads((ours_dir / "metrics.json").read_text())
        ref = json.loads(ref_json.read_text())

    ratio = ours["throughput_img_s"] / ref["throughput_img_s"]
    result = {
        "ours_img_s": ours["throughput_img_s"],
        "reference_img_s": ref["throughput_img_s"],
        "ratio": ratio,
        "device": ours["device"],
        "world_size": args.nproc,
        "width": args.width,
        "local_batch": args.local_batch,
        "precision": args.precision,
        "epochs": args.epochs,
        "ours_best_val_acc": ours["best_val_acc"],
        "torch_version": ours["torch_version"],
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    print(f"\nours      {result['ours_img_s']:12,.0f} img/s")
    print(f"reference {result['reference_img_s']:12,.0f} img/s")
    print(
        f"ratio     {ratio:12.2f}x  ({args.nproc} ranks, {ours['device']['name']}, "
        f"width {args.width}, local batch {args.local_batch}, {args.precision})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
