#!/usr/bin/env bash
# contrib validate under the matched protocol (issue 26, acceptance item 3): a grid profile measured
# the way the schemes are trained, then the additivity check of its entries.
#   1. the grid: EfficientNet-Lite0 (ImageNet weights) -> Fashion-MNIST at 64 px with the transfer
#      benchmark's data, Adam, 5 epochs of batch 32; learning rates chosen per family on validation
#      (5e-4, 2.5e-3, 1.25e-2, two seeds); every weight entry on top of all 49 biases; weight runs
#      for the 12 convs the Fisher profile (fisher-all.json, seconds) ranks highest, at ratios 1/4
#      and 1 (a ranked subset: every conv at 4 ratios is ~400 runs, 11-17 CPU hours here);
#   2. memplan contrib validate: random schemes over 4 budgets (5 each) plus each budget's searched
#      optimum, trained end to end at the profile's rates, seeds 0 and 1; Spearman of summed Δacc
#      against the real test gain, with a bootstrap CI.
# Usage: benchmarks/matched_validate.sh [OUT] [WORKERS]  (default benchmarks/transfer_results/matched 2)
# Resumable: every run is checkpointed; rerun the script to continue.
set -euo pipefail
out=${1:-benchmarks/transfer_results/matched}
workers=${2:-2}
memplan=${MEMPLAN:-memplan}
mkdir -p "$out"
export MEMPLAN_NUM_THREADS=1
"$memplan" contrib measure efficientnet-lite0 --weights zoo --data fashion-mnist -r 64 \
    --train-per-class 300 --validation 50 --epochs 5 --batch-size 32 --optimizer adam \
    --probe-epochs 20 --probe-lr 0.01 --lr-grid 5e-4,2.5e-3,1.25e-2 --seeds 0,1 \
    --weight-reference all-biases --bias-ks 49 --ratios 0.25,1 \
    --rank-by benchmarks/transfer_results/fisher-all.json --weight-layers 12 \
    -j "$workers" --out "$out/grid.json"
"$memplan" contrib validate "$out/grid.json" -j "$workers" --json "$out/validate.json" --plot "$out/validate.png"
