"""Feature cache vs naive: the same contribution runs with and without the cache.

    python benchmarks/contrib_cache.py [--model mbv2-w0.35] [--layers 8] [--seeds 0,1]

Runs the digits grid restricted to the last ``--layers`` convs (their weight runs at every
ratio, the bias runs they need, the classifier run) twice in one process with one thread
(``workers=1``): ``cache=False`` (every step runs the whole model, the plain way) and
``cache=True`` (the frozen prefix runs once per split point). Prints both wall times and
their ratio, and how far the accuracies of the two agree compared with the seed noise (the
fp32 cache is exact, so only float summation order may differ).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("MEMPLAN_NUM_THREADS", "1")

import torch

from memplan.contrib import run_contrib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mbv2-w0.35")
    ap.add_argument("--layers", type=int, default=8, help="weight runs for the last N convs")
    ap.add_argument("--seeds", default="0,1")
    args = ap.parse_args()
    torch.set_num_threads(1)
    seeds = tuple(int(s) for s in args.seeds.split(","))
    opts = dict(data="digits", seeds=seeds, weight_layers=args.layers, bias_ks=(args.layers,), workers=1)
    with tempfile.TemporaryDirectory() as tmp:
        run_contrib(
            args.model,
            cache_dir=tmp,
            **{**opts, "seeds": seeds[:1], "bias_ks": (1,), "weight_layers": 1, "ratios": (1.0,), "epochs": 1},
        )  # warm-up: pretraining, imports
        timings, profiles = {}, {}
        for cache in (False, True):
            t0 = time.perf_counter()
            profiles[cache] = run_contrib(args.model, cache=cache, cache_dir=tmp, **opts)
            timings[cache] = time.perf_counter() - t0
    naive, cached = profiles[False], profiles[True]
    n_runs = len(cached.runs)
    print(
        f"{args.model} on digits, {n_runs} runs (last {args.layers} convs x ratios "
        f"{list(cached.protocol.ratios)}, their bias runs, classifier), seeds {list(seeds)}, 1 thread"
    )
    print(f"naive  (cache=False): {timings[False]:8.1f} s wall, {naive.timing['run_cpu_seconds']:8.1f} s CPU in runs")
    print(f"cached (cache=True) : {timings[True]:8.1f} s wall, {cached.timing['run_cpu_seconds']:8.1f} s CPU in runs")
    print(
        f"speed-up: {timings[False] / timings[True]:.2f}x wall, "
        f"{naive.timing['run_cpu_seconds'] / cached.timing['run_cpu_seconds']:.2f}x CPU"
    )
    acc_n = {r.id: r.accuracy for r in naive.runs}
    diffs = [abs(a - b) for r in cached.runs for a, b in zip(r.accuracy, acc_n[r.id])]
    identical = sum(d == 0 for d in diffs)
    noise = cached.noise.accuracy_std
    print(
        f"accuracy, cached vs naive: max |diff| {max(diffs):.3f} points, mean {sum(diffs) / len(diffs):.3f}, "
        f"{identical}/{len(diffs)} identical; seed noise (std across seeds) {noise:.3f} points -> "
        f"{'within' if max(diffs) <= max(noise, 1e-9) or max(diffs) == 0 else 'NOT within'} seed noise"
    )


if __name__ == "__main__":
    main()
