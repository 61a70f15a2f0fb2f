#!/bin/bash
# The trainer-speed benchmarks of one GPU node, in one command of about 6 minutes, for a short
# lease (docs/benchmarks.md, "Trainer speed"): what the first H200 run left open.
#
#   bash benchmarks/gpu_node.sh OUT        # on a node with one CUDA GPU; writes OUT/*.json|log|txt
#
#   1. compare: ours vs the reference, bf16, local batch 512, 2 interleaved runs each
#   2. compare-eager: the same with our trainer eager (--compile off): does compiling pay here?
#   3. compare-graphs: the same with --cuda-graphs: does it remove the host bound at batch 512?
#   4. ddp-buffers: DDP's per-step buffer broadcast, one NCCL rank (ddp_buffers.py)
# A failed step is logged and the next one runs. The package runs from this checkout
# (PYTHONPATH=src): no install, no Snakemake, no internet. The sizes are variables so that a
# CPU test runs the same script small: WIDTH LOCAL_BATCH PRECISION EPOCHS NUM_TRAIN REPEATS
# REF_WORKERS DEVICE (cuda or cpu, for ddp_buffers.py; compare.py uses the GPU when there is one).
set -euo pipefail
out=${1:?usage: bash benchmarks/gpu_node.sh OUT}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
export PYTHONPATH="$here/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
width=${WIDTH:-64} batch=${LOCAL_BATCH:-512} precision=${PRECISION:-bf16} epochs=${EPOCHS:-3}
repeats=${REPEATS:-2} workers=${REF_WORKERS:-8} device=${DEVICE:-cuda}

"$py" -m scalestudy prepare-data --dataset synthetic --data-dir "$data" \
    --num-train "${NUM_TRAIN:-16384}" --num-test 1024 >"$out/prepare-data.log" 2>&1
common=(--data-dir "$data" --dataset synthetic --nproc 1 --width "$width" --local-batch "$batch"
    --precision "$precision" --epochs "$epochs" --ref-workers "$workers" --repeats "$repeats")
run() { # name, extra compare.py flags: OUT/<name>.json and .log
    local name=$1
    shift
    echo "== $name"
    "$py" "$here/benchmarks/compare.py" "${common[@]}" "$@" --json "$out/$name.json" \
        >"$out/$name.log" 2>&1 || echo "$name failed: see $out/$name.log"
    tail -n 4 "$out/$name.log"
}
run compare
run compare-eager --ours-flags="--compile off"
run compare-graphs --ours-flags=--cuda-graphs
echo "== ddp-buffers"
"$py" "$here/benchmarks/ddp_buffers.py" --device "$device" --nproc 1 --width "$width" \
    --batch "$batch" --steps 30 --repeats "$repeats" >"$out/ddp-buffers.txt" 2>&1 ||
    echo "ddp-buffers failed: see $out/ddp-buffers.txt"
tail -n 3 "$out/ddp-buffers.txt"
