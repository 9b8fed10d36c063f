#!/usr/bin/env bash
# The whole path from nothing to a validated scheme, timed on this machine (issue 26, item 6):
#   1. a Fisher contribution profile of EfficientNet-Lite0 (ImageNet weights) on Fashion-MNIST at
#      64 px, with the transfer benchmark's data and protocol (what fisher-all.json holds);
#   2. `memplan search B --validate 2` over it, its runs on a 2-worker process pool.
# Wall and CPU seconds of each step go to OUT/wall.txt; the scheme to OUT/scheme.json.
# Usage: benchmarks/validate_wall.sh [BUDGET] [OUT]    (default 30MB benchmarks/transfer_results/wall)
# Needs Debian's dataset-fashion-mnist and the '.[imagenet]' extra; resumable only per step.
set -euo pipefail
budget=${1:-30MB}
out=${2:-benchmarks/transfer_results/wall}
memplan=${MEMPLAN:-memplan}
mkdir -p "$out"
export MEMPLAN_NUM_THREADS=1
timed() { # label, command...: one line "label: W s wall, U s user, S s system" in wall.txt
    local label=$1
    shift
    /usr/bin/time -f "$label: %e s wall, %U s user, %S s system" -a -o "$out/wall.txt" "$@"
}
: >"$out/wall.txt"
timed profile "$memplan" contrib measure efficientnet-lite0 --weights zoo --data fashion-mnist -r 64 \
    --train-per-class 300 --validation 50 --epochs 5 --batch-size 32 --optimizer adam \
    --probe-epochs 20 --probe-lr 0.01 --lr-classifier 5e-4 --lr-bias 5e-4 --lr-weight 5e-4 \
    --estimator fisher --out "$out/fisher.json"
timed "search $budget --validate 2" "$memplan" search efficientnet-lite0 --profile "$out/fisher.json" \
    --budget "$budget" --mode applied --batch 32 --optimizer adam \
    --validate 2 --validate-workers 2 --validate-dir "$out/validate" --out "$out/scheme.json"
cat "$out/wall.txt"
