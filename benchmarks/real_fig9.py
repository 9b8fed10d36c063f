"""Figure 9 of the 256KB paper on real weights: the searched sparse-update schemes of a real
contribution profile (default: EfficientNet-Lite0 ImageNet -> Fashion-MNIST, shipped in
``memplan/data/profiles``) against the simple baselines, on the **test** split.

Configurations, every one trained end to end from the profile's setup with the profile's own
protocol (``memplan.contrib.final.Evaluator``: same backbone, data, linear-probe head, SGD without
momentum, per-role learning rates, epochs, batch; nothing tuned, nothing chosen on the test split):

* ``sparse (searched)``: ``memplan search`` at each budget (exact solver, mode tinytraining, at
  the profile's costing resolution), checked equal to the shipped scheme file when there is one;
* ``classifier only``; ``bias-only last k`` for several k; ``weights+biases last k`` (the whole
  weights and biases of the last k convs) for several k; ``full fine-tuning`` (every parameter,
  norms in train mode) for reference.

Memory (x axis) is the tinytraining analytic memory at the costing resolution. For each searched
scheme the script prints the best baseline (full fine-tuning is a reference, not a baseline) *at
equal or higher memory* (the issue's acceptance test) and the best baseline *within* the scheme's
memory, with the verdicts.

Run: python benchmarks/real_fig9.py [--profile P] [--budgets 40KB,100KB,250KB] [--seeds 0,1]
[--json out.json] [--plot out.png]   (results: benchmarks/real_results/)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from memplan.api import capture, profile_captured
from memplan.contrib.final import Evaluator
from memplan.contrib.profile import load_profile
from memplan.graph import conv_layers
from memplan.io import write_text
from memplan.plan import Scheme, fingerprint, load_scheme
from memplan.render.figures import plot_accuracy_memory
from memplan.search import run_search

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "memplan" / "data" / "profiles" / "efficientnet-lite0-fashion-mnist.json"
SCHEMES = ROOT / "memplan" / "data" / "schemes"
BIAS_KS = (1, 2, 4, 8, 16, 32, 49)
FULL_KS = (1, 2, 3, 4, 6, 9)


def baseline(cap, k: int, weights: bool) -> Scheme:
    """Biases of the last k convs, and with ``weights`` their whole weights too."""
    convs = conv_layers(cap.graph)
    updates = (
        [dict(layer=c.name, conv_index=i, ratio=1.0) for i, c in enumerate(convs) if i >= len(convs) - k]
        if weights
        else []
    )
    return Scheme(
        model=cap.name,
        fingerprint=fingerprint(cap.graph),
        input_shape=list(cap.graph.input_shape[1:]),
        bias_update=k,
        weight_updates=updates,
        mode="tinytraining",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default=str(PROFILE))
    ap.add_argument("--budgets", default="40KB,100KB,250KB")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args()
    t_start = time.perf_counter()
    path = Path(os.path.relpath(args.profile))
    prof = load_profile(path)
    classes = prof.dataset["classes"]
    cap = capture(prof.model, resolution=prof.costing_resolution, classes=classes)
    seeds = [int(s) for s in args.seeds.split(",")]
    ev = Evaluator(prof, seeds=seeds)
    print(ev.describe())
    print(
        f"memory: tinytraining analytic at {'x'.join(map(str, cap.graph.input_shape[1:]))} (the profile's costing "
        f"resolution; runs at {prof.run_resolution} px)"
    )

    configs: list[tuple[str, str, Scheme | None]] = []
    for b in args.budgets.split(","):
        r = run_search(prof.model, b, profile_path=path)
        shipped = SCHEMES / f"{prof.model}-fashion-mnist-{b}.json"
        if shipped.is_file():
            ref = load_scheme(shipped)
            same = ref.bias_update == r.scheme.bias_update and [
                (w.conv_index, w.ratio) for w in ref.weight_updates
            ] == [(w.conv_index, w.ratio) for w in r.scheme.weight_updates]
            print(f"budget {b}: searched scheme {'equals' if same else 'DIFFERS FROM'} {shipped.relative_to(ROOT)}")
        configs.append(("sparse (searched)", f"budget {b}", r.scheme))
    configs.append(("classifier only", "k=0", baseline(cap, 0, False)))
    configs += [("bias-only last k", f"k={k}", baseline(cap, k, False)) for k in BIAS_KS]
    configs += [("weights+biases last k", f"k={k}", baseline(cap, k, True)) for k in FULL_KS]
    configs.append(("full fine-tuning", "all", None))

    rows = []
    print(f"\n{'method':<24}{'config':<15}{'memory':>12}{'test acc %':>18}{'Δ vs cls':>10}{'Δacc sum':>10}{'s':>7}")
    for method, label, scheme in configs:
        if scheme is None:
            mem = profile_captured(cap, "full", mode="tinytraining").totals.total_bytes
            res = ev.strategy(label, "full")
        else:
            mem = profile_captured(cap, "sparse", mode="tinytraining", scheme=scheme).totals.total_bytes
            res = ev.scheme(label, scheme)
        rows.append(
            {
                "method": method,
                "config": label,
                "memory_bytes": mem,
                "accuracy": res.accuracy,
                "accuracy_mean": res.mean,
                "accuracy_std": res.std,
                "trainable_params": res.trainable_params,
                "bias_update": scheme.bias_update if scheme else None,
                "weights": [[w.conv_index, w.ratio] for w in scheme.weight_updates] if scheme else None,
                "summed_delta_acc": scheme.summed_delta_acc if scheme else None,
                "seconds": round(res.seconds, 1),
            }
        )
        ref = next((r["accuracy_mean"] for r in rows if r["method"] == "classifier only"), None)
        sd = f"{scheme.summed_delta_acc:+.2f}" if scheme is not None and scheme.summed_delta_acc is not None else "-"
        delta = f"{res.mean - ref:+.2f}" if ref is not None else "-"
        print(
            f"{method:<24}{label:<15}{mem / 1000:>10.1f}kB{res.mean:>11.2f} ± {res.std:<4.2f}{delta:>10}{sd:>10}"
            f"{res.seconds:>7.0f}",
            flush=True,
        )

    verdicts = []
    base_rows = [r for r in rows if r["method"] not in ("sparse (searched)", "full fine-tuning")]
    print(
        "\nsearched scheme vs the baselines (classifier only, bias-only last k, weights+biases last k; "
        "full fine-tuning is for reference), test split:"
    )
    for r in (x for x in rows if x["method"] == "sparse (searched)"):
        above = [b for b in base_rows if b["memory_bytes"] >= r["memory_bytes"]]
        within = [b for b in base_rows if b["memory_bytes"] <= r["memory_bytes"]]
        best_above = max(above, key=lambda b: b["accuracy_mean"]) if above else None
        best_within = max(within, key=lambda b: b["accuracy_mean"]) if within else None
        v = {"config": r["config"], "accuracy_mean": r["accuracy_mean"], "memory_bytes": r["memory_bytes"]}
        for name, best in (("equal_or_higher_memory", best_above), ("within_memory", best_within)):
            if best is None:
                continue
            ok = r["accuracy_mean"] >= best["accuracy_mean"]
            v[name] = {
                "method": best["method"],
                "config": best["config"],
                "accuracy_mean": best["accuracy_mean"],
                "memory_bytes": best["memory_bytes"],
                "searched_at_least_as_accurate": ok,
            }
            print(
                f"  {r['config']}: {r['accuracy_mean']:.2f}% at {r['memory_bytes'] / 1000:.1f} kB vs the best baseline "
                f"{'at equal or higher' if name.startswith('equal') else 'within its'} memory, {best['method']} "
                f"{best['config']}: {best['accuracy_mean']:.2f}% at {best['memory_bytes'] / 1000:.1f} kB -> "
                f"{'at least as accurate' if ok else 'LESS accurate'}"
            )
        verdicts.append(v)
    wall = time.perf_counter() - t_start
    print(f"\nwall time {wall:.0f} s")
    if args.json:
        write_text(
            args.json,
            json.dumps(
                {
                    "profile": str(path),
                    "description": ev.describe(),
                    "seeds": seeds,
                    "costing_input_shape": list(cap.graph.input_shape[1:]),
                    "rows": rows,
                    "verdicts": verdicts,
                    "wall_s": round(wall, 1),
                },
                indent=1,
            )
            + "\n",
        )
    if args.plot:
        plot_accuracy_memory(
            rows,
            args.plot,
            title=f"{prof.model} on Fashion-MNIST: sparse update vs baselines (Fig. 9, test split)",
            xlabel=f"extra training memory, kB (tinytraining, {cap.graph.input_shape[-1]} px)",
            ylabel="test accuracy, %",
        )


if __name__ == "__main__":
    main()
