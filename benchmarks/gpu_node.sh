#!/bin/bash
# The trainer-speed benchmarks of one GPU node in one command (docs/benchmarks.md, "Trainer
# speed"); for a short lease, STEPS picks some.
#
#   bash benchmarks/gpu_node.sh OUT        # on a node with one CUDA GPU; writes OUT/*.json|log|txt
#
#   compare           ours (defaults: compiled, the whole step one CUDA graph) vs the reference,
#                     bf16, local batch 512, REPEATS interleaved runs each
#   compare-compiled-graphs  the same with --cuda-graphs on (torch.compile's graphs, what fp16
#                     and gloo runs get): what the whole-step graph wins over them
#   compare-nographs  the same with --cuda-graphs off (the compiled path of FSDP, comm hooks and
#                     gradient accumulation): what the graphs win
#   compare-eager     the same with --compile off: what compiling wins
#   compare-tf32      ours (defaults) vs the reference in tf32 (TF32 tensor cores for fp32 math)
#   compare-fp32      the same in fp32 (IEEE: no TF32), the Trainer issue's figures beside bf16
#   buckets           our trainer alone at local batch 64 for each DDP bucket size in BUCKETS
#                     (MiB, default 1 5 25) and each --cuda-graphs mode in BUCKET_GRAPHS (default
#                     auto on off): whether the bucket family's small buckets time torch's host
#                     overhead (one compiled graph per bucket under --cuda-graphs on) instead of
#                     the all-reduce; one line per finished run in OUT/buckets.txt (emptied
#                     when the step starts)
#   ddp-buffers       DDP's per-step buffer broadcast, one NCCL rank (ddp_buffers.py)
#   anatomy-lb64      the host time of our step per phase at local batch 64 (step_anatomy.py)
# STEPS picks some of them (default: all, in this order); a name not among them is refused
# before anything runs. A failed step is logged, leaves no result of an earlier session in OUT,
# and the next one runs; the script then ends with one line naming the failed ones, exit 1. A
# failed data preparation ends the script in one line (its log: OUT/prepare-data.log).
# The package runs from this checkout (PYTHONPATH=src): no install, no Snakemake, no
# internet. The sizes are variables so that a CPU test runs the same script small: WIDTH
# LOCAL_BATCH PRECISION EPOCHS NUM_TRAIN REPEATS REF_WORKERS DEVICE (cuda or cpu, for
# ddp_buffers.py and step_anatomy.py; compare.py uses the GPU when there is one). REPEATS below 3
# gives no spread: the comparisons refuse it (before anything runs) unless SMOKE=1, a test of
# the script (compare.py --smoke).
set -euo pipefail
out=${1:?usage: bash benchmarks/gpu_node.sh OUT}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
export PYTHONPATH="$here/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
width=${WIDTH:-64} batch=${LOCAL_BATCH:-512} precision=${PRECISION:-bf16} epochs=${EPOCHS:-3}
repeats=${REPEATS:-3} workers=${REF_WORKERS:-8} device=${DEVICE:-cuda}
all="compare compare-compiled-graphs compare-nographs compare-eager compare-tf32 compare-fp32"
all+=" buckets ddp-buffers anatomy-lb64"
steps=${STEPS:-$all}
for step in $steps; do # a typo found only when the loop reached it cost the steps before it
    if [[ " $all " != *" $step "* ]]; then
        echo "gpu_node.sh: unknown step '$step' in STEPS; the steps: $all" >&2
        exit 2
    fi
done
smoke=()
if [ "${SMOKE:-0}" = 1 ]; then
    smoke=(--smoke)
elif ((repeats < 3)) && [[ " $steps " == *" compare"* ]]; then # each comparison would refuse it
    echo "gpu_node.sh: REPEATS=$repeats: a comparison's spread needs >= 3 runs of each" \
        "trainer; set REPEATS=3, or SMOKE=1 for a test of the script without a spread" >&2
    exit 2
fi

rc=0
failed=() # the steps (bucket runs) that failed: the exit status says so at the end
"$py" -m scalestudy prepare-data --dataset synthetic --data-dir "$data" \
    --num-train "${NUM_TRAIN:-16384}" --num-test 1024 >"$out/prepare-data.log" 2>&1 || rc=$?
if [ "$rc" != 0 ]; then
    echo "prepare-data failed (exit $rc): $(tail -n 1 "$out/prepare-data.log"); see" \
        "$out/prepare-data.log" >&2
    exit "$rc"
fi
common=(--data-dir "$data" --dataset synthetic --nproc 1 --width "$width" --local-batch "$batch"
    --precision "$precision" --epochs "$epochs" --ref-workers "$workers" --repeats "$repeats"
    ${smoke[@]+"${smoke[@]}"})
# `scalestudy train` at local batch 64 (the launch-bound case): anatomy-lb64 and buckets
lb64=(--dataset synthetic --data-dir "$data" --width "$width" --local-batch 64
    --precision "$precision" --epochs 2 --warmup-steps 10 --limit-test 1024
    --comm-probe-steps 0 --device "$device")
compare() { # name, extra compare.py flags: OUT/<name>.json and .log
    local name=$1
    shift
    rm -f "$out/$name.json" # a failed rerun must not leave the last session's result
    "$py" "$here/benchmarks/compare.py" "${common[@]}" "$@" --json "$out/$name.json" \
        >"$out/$name.log" 2>&1 || {
        echo "$name failed: see $out/$name.log"
        failed+=("$name")
    }
    table "$out/$name.log" 'median img/s'
}
table() { # a log, the text of its result's first line: the result whole, from that line on
    # (a comparison's: then compare.py's line, where a run failed or was stopped); a fixed
    # `tail -n 4` cut the header off a table one line longer (SMOKE=1's "no spread"), `tail -n
    # 3` ddp_buffers.py's configuration off its medians. No result (a failed run): the last lines
    local at
    at=$(grep -n -F -- "$2" "$1" | tail -n 1 | cut -d: -f1) || true
    if [ -n "$at" ]; then tail -n "+$at" "$1"; else tail -n 4 "$1"; fi
}
bucket_line() { # name: the line of buckets.txt from OUT/<name>/metrics.json
    "$py" - "$out/$1/metrics.json" "$1" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
print(sys.argv[2], f"mode={m['cuda_graphs_mode']}", f"img/s={m['throughput_img_s']:.0f}",
      f"step_p50_ms={m['step_time_ms_p50']:.2f}", f"mfu={m.get('mfu')}")
PY
}
for step in $steps; do
    echo "== $step"
    case $step in
    compare) compare compare ;;
    compare-compiled-graphs) compare compare-compiled-graphs --ours-flags="--cuda-graphs on" ;;
    compare-nographs) compare compare-nographs --ours-flags="--cuda-graphs off" ;;
    compare-eager) compare compare-eager --ours-flags="--compile off" ;;
    compare-tf32) compare compare-tf32 --precision tf32 ;; # the last --precision wins
    compare-fp32) compare compare-fp32 --precision fp32 ;;
    buckets)
        : >"$out/buckets.txt" # this sweep's lines only, never a rerun's predecessors
        for mib in ${BUCKETS:-1 5 25}; do
            for graphs in ${BUCKET_GRAPHS:-auto on off}; do
                name=bucket-${mib}mib-graphs-$graphs
                rm -f "$out/$name/metrics.json" # a failed rerun must not report the last run
                if ! "$py" -m scalestudy train "${lb64[@]}" --bucket-cap-mb "$mib" \
                    --cuda-graphs "$graphs" --out "$out/$name" >"$out/$name.log" 2>&1; then
                    echo "$name failed: see $out/$name.log"
                    failed+=("$name")
                    continue
                fi
                bucket_line "$name" >>"$out/buckets.txt" || {
                    echo "$name: no line in buckets.txt, its metrics.json unread (above)"
                    failed+=("$name")
                }
            done
        done
        cat "$out/buckets.txt" 2>/dev/null || true
        ;;
    ddp-buffers)
        "$py" "$here/benchmarks/ddp_buffers.py" --device "$device" --nproc 1 --width "$width" \
            --batch "$batch" --steps 30 --repeats "$repeats" >"$out/ddp-buffers.txt" 2>&1 || {
            echo "ddp-buffers failed: see $out/ddp-buffers.txt"
            failed+=(ddp-buffers)
        }
        table "$out/ddp-buffers.txt" ' ranks, ResNet-18 width ' # its configuration's line
        ;;
    anatomy-lb64)
        rm -f "$out/anatomy-lb64.json" # as compare's: a failed rerun leaves no earlier result
        "$py" "$here/benchmarks/step_anatomy.py" --json "$out/anatomy-lb64.json" -- \
            "${lb64[@]}" --out "$out/anatomy-lb64-run" \
            >"$out/anatomy-lb64.log" 2>&1 || {
            echo "anatomy-lb64 failed: see $out/anatomy-lb64.log"
            failed+=(anatomy-lb64)
        }
        grep -A11 '^throughput' "$out/anatomy-lb64.log" || true
        ;;
    esac
done
if ((${#failed[@]})); then # exit 0 told a caller (a lease's wrapper, `&&`) that all went well
    echo "gpu_node.sh: ${#failed[@]} failed: ${failed[*]} (logs in $out)" >&2
    exit 1
fi
