#!/bin/bash
# The trainer-speed benchmarks of one GPU node, in one command of about 6 minutes, for a short
# lease (docs/benchmarks.md, "Trainer speed"): what the first H200 run left open.
#
#   bash benchmarks/gpu_node.sh OUT        # on a node with one CUDA GPU; writes OUT/*.json|txt
#
#   1. ours vs the reference, bf16, local batch 512, 2 interleaved runs each (compare.py)
#   2. the same with our trainer eager (--compile off): does compiling pay on this node?
#   3. the same with --cuda-graphs: does it remove the host bound at local batch 512?
#   4. DDP's per-step buffer broadcast, one NCCL rank (ddp_buffers.py --device cuda)
# Runs the package from this checkout (PYTHONPATH=src): no install, no Snakemake, no internet.
set -euo pipefail
out=${1:?usage: bash benchmarks/gpu_node.sh OUT}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
export PYTHONPATH="$here/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

"$py" -m scalestudy prepare-data --dataset synthetic --data-dir "$data" --num-train 16384 \
    --num-test 1024 >"$out/prepare-data.log" 2>&1
common=(--data-dir "$data" --dataset synthetic --nproc 1 --width 64 --local-batch 512
    --precision bf16 --epochs 3 --ref-workers 8 --repeats 2)
run() { # name, extra compare.py flags: one JSON, one log; a failure is logged, not fatal
    local name=$1
    shift
    echo "== $name"
    "$py" "$here/benchmarks/compare.py" "${common[@]}" "$@" --json "$out/$name.json" \
        >"$out/$name.log" 2>&1 || echo "$name failed: see $out/$name.log"
    tail -n 4 "$out/$name.log"
}
run compare-bf16-lb512
run compare-bf16-lb512-eager --ours-flags="--compile off"
run compare-bf16-lb512-graphs --ours-flags=--cuda-graphs
echo "== ddp-buffers"
"$py" "$here/benchmarks/ddp_buffers.py" --device cuda --nproc 1 --width 64 --batch 512 \
    --steps 30 >"$out/ddp-buffers.txt" 2>&1 || echo "ddp-buffers failed: see $out/ddp-buffers.txt"
tail -n 3 "$out/ddp-buffers.txt"
