"""End-to-end evidence (the 256KB paper's Figure 9): on the digits benchmark of ``memplan.contrib``,
train the searched sparse-update schemes at three budgets and two baselines over a range of k —
bias-only of the last k convs, and weights + biases of the last k convs — and print test
accuracy against memory.

Setup, shared with the contribution profile the search used (``profile.protocol``): the backbone
pretrained on digits 0-4 (``memplan.contrib.weights.pretrain_digits``, cached), the linear-probe
head (``memplan.contrib.runner.linear_probe``), the transfer task digits 5-9 at the profile's input
shape (32 px), SGD without momentum, the profile's epochs / batch / learning rates per parameter
role (classifier, biases, conv weights: ``memplan.contrib.runner.param_groups``), one run per seed,
test accuracy in %. With ``--lr-scales``, every configuration (searched and baselines alike) is
trained with each multiplier of those learning rates and its best mean test accuracy is kept: a
tuning on the test set, equally optimistic for all (the paper's "upper bound" baseline is chosen
the same way); the chosen multiplier is printed.
Every configuration is a scheme, applied with ``memplan.apply_scheme`` and trained by plain
PyTorch on the whole applied model.

Accuracy is reported on the test split (the one contribution analysis measured Δacc on, so the
search has seen it) and on the transfer task's training images that contribution analysis never
used ("held-out"; the learning-rate choice is made on the test split).

Memory (x axis) is the tinytraining analytic memory at the search's resolution (128 px, the
budgets' setting), from ``memplan.profile_captured(..., "sparse", mode="tinytraining")``; the
memory at the training resolution is printed too.

Run: python benchmarks/sparse_vs_baselines.py [--profile P] [--seeds 0,1,2] [--lr-scales 0.3,1,3]
[--plot fig9.png] [--json rows.json]
(the shipped evidence in benchmarks/sparse_vs_baselines_results/ used --lr-scales 0.3,1,3)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from pathlib import Path

import torch

import memplan
from memplan.api import capture, profile_captured
from memplan.contrib.data import TRANSFER_DIGITS, digits_arrays, load_data, make_data
from memplan.contrib.profile import load_profile
from memplan.contrib.runner import accuracy, linear_probe, param_groups
from memplan.contrib.setup import default_cache_dir
from memplan.contrib.weights import pretrain_digits
from memplan.graph import conv_layers
from memplan.graph.capture import capture_graph
from memplan.models.zoo import build
from memplan.nn.train import fit
from memplan.optim import make_optimizer
from memplan.plan import Scheme, fingerprint
from memplan.search import run_search
from memplan.search.run import DEFAULT_MODEL, DEFAULT_RESOLUTION, find_profile
from memplan.search.space import profile_hash
from memplan.units import parse_bytes

torch.set_num_threads(1)
BIAS_KS = (2, 4, 8, 12, 16, 22, 28, 34, 42)
FULL_KS = (1, 2, 3, 4, 5, 6, 8, 10, 12)


def scheme_of(cap, k: int, weights: bool, model: str) -> Scheme:
    """Baseline: biases of the last k convs, and with ``weights`` their whole weights too."""
    convs = conv_layers(cap.graph)
    first = len(convs) - k
    updates = (
        [dict(layer=c.name, conv_index=i, ratio=1.0) for i, c in enumerate(convs) if i >= first] if weights else []
    )
    return Scheme(
        model=model,
        fingerprint=fingerprint(cap.graph),
        input_shape=list(cap.graph.input_shape[1:]),
        bias_update=k,
        weight_updates=updates,
        mode="tinytraining",
    )


def memory(cap, scheme: Scheme) -> int:
    return profile_captured(cap, "sparse", mode="tinytraining", scheme=scheme).totals.total_bytes


def heldout(shape: tuple[int, ...], per_class: int):
    """The transfer task's training images that contribution analysis left unused (its runs train on
    ``per_class`` per digit and test on the test split), standardised like the training split: a
    test set the search never saw."""
    full, used = digits_arrays(TRANSFER_DIGITS), digits_arrays(TRANSFER_DIGITS, per_class)
    seen = {x.tobytes() for x in used[0]}
    keep = [i for i, x in enumerate(full[0]) if x.tobytes() not in seen]
    return make_data(
        "digits-heldout",
        "transfer-task training images unused by contribution analysis",
        used[0],
        used[1],
        full[0][keep],
        full[1][keep],
        shape,
    )


def train_eval(
    base: torch.nn.Module, head: str, scheme: Scheme, data, extra, protocol, seeds: list[int]
) -> tuple[list[float], list[float]]:
    """Accuracy (%) per seed on the test split and on ``extra``'s test split, of ``scheme`` applied to
    a copy of ``base`` and trained on ``data``'s training split."""
    shape = (1, *data.x_train.shape[1:])
    accs, accs_extra = [], []
    for seed in seeds:
        model = copy.deepcopy(base)
        memplan.apply_scheme(model, scheme, capture_graph(model, shape))
        opt = make_optimizer(param_groups(model, head, protocol), protocol.optimizer, protocol.lr_classifier)
        fit(
            model,
            opt,
            data.x_train,
            data.y_train,
            epochs=protocol.epochs,
            batch_size=protocol.batch_size,
            seed=seed,
            cosine=True,
        )
        model.eval()
        accs.append(accuracy(model, lambda idx: [data.x_test[idx]], data.y_test))
        accs_extra.append(accuracy(model, lambda idx: [extra.x_test[idx]], extra.y_test))
    return accs, accs_extra


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--profile", default=None, help="contribution profile (default: the shipped one)")
    ap.add_argument("--budgets", default="50KB,100KB,150KB")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=None, help="override the profile's epochs")
    ap.add_argument(
        "--lr-scales",
        default="1",
        help="learning-rate multipliers tried for every configuration "
        "(all roles scaled together); the best mean test accuracy is kept, e.g. 0.3,1,3",
    )
    ap.add_argument("--plot", default=None)
    ap.add_argument("--json", default=None, help="write the rows as JSON")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    scales = [float(s) for s in args.lr_scales.split(",")]
    t_start = time.perf_counter()

    cap = capture(args.model, resolution=DEFAULT_RESOLUTION)
    path = Path(os.path.relpath(args.profile or find_profile(fingerprint(cap.graph))))
    prof = load_profile(path)
    protocol = prof.protocol if args.epochs is None else prof.protocol.model_copy(update={"epochs": args.epochs})
    classes = prof.dataset["classes"]
    cap = capture(args.model, resolution=DEFAULT_RESOLUTION, classes=classes)
    shape = tuple(prof.input_shape)
    cap_train = capture(args.model, input_shape=shape, classes=classes)

    data = load_data("digits", shape, prof.dataset["train"] // classes)
    held = heldout(shape, prof.dataset["train"] // classes)
    net = build(args.model, classes)
    head = cap_train.graph.classifier.name
    key = f"{fingerprint(cap_train.graph)}-{'x'.join(map(str, shape))}"
    pre = pretrain_digits(net, shape, key, default_cache_dir())
    probe = linear_probe(net, head, data, protocol)
    print(
        f"{cap.name}: backbone pretrained on digits 0-4 (test {pre['test_accuracy']:.1f}%), linear probe on digits "
        f"5-9 {probe:.2f}% (profile says {prof.probe_accuracy:.2f}%); profile {path}"
    )
    print(
        f"training: {data.x_train.shape[0]} images at {'x'.join(map(str, shape))}, {protocol.epochs} epochs, batch "
        f"{protocol.batch_size}, lr classifier {protocol.lr_classifier} / biases {protocol.lr_bias} / weights "
        f"{protocol.lr_weight} (x {', '.join(map(str, scales))}), seeds {seeds}; "
        f"memory: tinytraining at {DEFAULT_RESOLUTION} px (and at {shape[-1]} px)"
    )

    configs: list[tuple[str, str, Scheme]] = []
    for b in args.budgets.split(","):
        r = run_search(args.model, parse_bytes(b), profile_path=path)
        configs.append(("sparse (searched)", f"budget {b}", r.scheme))
    configs += [("bias-only last k", f"k={k}", scheme_of(cap, k, False, cap.name)) for k in BIAS_KS]
    configs += [("weights+biases last k", f"k={k}", scheme_of(cap, k, True, cap.name)) for k in FULL_KS]
    configs.append(("classifier only", "k=0", scheme_of(cap, 0, False, cap.name)))

    rows = []
    print(
        f"\n{'method':<24}{'config':<16}{'memory':>12}{'@train res':>12}{'lr x':>7}{'test acc %':>19}"
        f"{'held-out':>9}{'Δacc sum':>9}"
    )
    for method, label, scheme in configs:
        mem, mem_train = memory(cap, scheme), memory(cap_train, scheme)
        best = None
        for scale in scales:  # every configuration gets the same learning-rate choices
            lrs = {f"lr_{role}": getattr(protocol, f"lr_{role}") * scale for role in ("classifier", "bias", "weight")}
            accs, accs_held = train_eval(net, head, scheme, data, held, protocol.model_copy(update=lrs), seeds)
            if best is None or statistics.fmean(accs) > statistics.fmean(best[1]):
                best = (scale, accs, accs_held)
        scale, accs, accs_held = best
        mean, std = statistics.fmean(accs), statistics.stdev(accs) if len(accs) > 1 else 0.0
        held_mean = statistics.fmean(accs_held)
        rows.append(
            {
                "method": method,
                "config": label,
                "bias_update": scheme.bias_update,
                "weights": [[w.conv_index, w.ratio] for w in scheme.weight_updates],
                "memory_bytes": mem,
                "memory_bytes_train_res": mem_train,
                "lr_scale": scale,
                "accuracy": accs,
                "accuracy_mean": mean,
                "accuracy_std": std,
                "heldout_accuracy": accs_held,
                "heldout_accuracy_mean": held_mean,
                "summed_delta_acc": scheme.summed_delta_acc,
            }
        )
        sd = f"{scheme.summed_delta_acc:.2f}" if scheme.summed_delta_acc is not None else "-"
        print(
            f"{method:<24}{label:<16}{mem / 1000:>10.1f}kB{mem_train / 1000:>10.1f}kB{scale:>7g}"
            f"{mean:>11.2f} ± {std:<5.2f}{held_mean:>9.2f}{sd:>9}",
            flush=True,
        )

    for key, what in (("accuracy_mean", "test split"), ("heldout_accuracy_mean", "held-out images")):
        print(f"\nsearched scheme vs the best baseline within its memory (baseline memory <= scheme memory), {what}:")
        for r in rows[: len(args.budgets.split(","))]:
            baselines = [b for b in rows if b["method"] != "sparse (searched)"]
            best = max((b for b in baselines if b["memory_bytes"] <= r["memory_bytes"]), key=lambda b: b[key])
            match = min((b for b in baselines if b[key] >= r[key]), key=lambda b: b["memory_bytes"], default=None)
            verdict = "at least as accurate" if r[key] >= best[key] else "LESS accurate"
            match_text = (
                (
                    f"; the cheapest baseline as accurate: {match['method']} {match['config']} at "
                    f"{match['memory_bytes'] / 1000:.1f} kB"
                )
                if match
                else "; no baseline is as accurate"
            )
            print(
                f"  {r['config']}: {r[key]:.2f}% at {r['memory_bytes'] / 1000:.1f} kB vs {best['method']} "
                f"{best['config']} {best[key]:.2f}% at {best['memory_bytes'] / 1000:.1f} kB: {verdict}{match_text}"
            )
    print(f"\nwall time {time.perf_counter() - t_start:.0f} s")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "profile": str(path),
                    "profile_hash": profile_hash(prof),
                    "seeds": seeds,
                    "lr_scales": scales,
                    "rows": rows,
                },
                indent=1,
            )
            + "\n"
        )
    if args.plot:
        plot(rows, args.plot, cap.name)


def plot(rows: list[dict], path: str, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    styles = {
        "sparse (searched)": "*-",
        "bias-only last k": "o-",
        "weights+biases last k": "s-",
        "classifier only": "D",
    }
    for method, style in styles.items():
        pts = sorted(
            (r["memory_bytes"] / 1000, r["accuracy_mean"], r["accuracy_std"]) for r in rows if r["method"] == method
        )
        if pts:
            xs, ys, es = zip(*pts)
            ax.errorbar(xs, ys, yerr=es, fmt=style, capsize=2, label=method, ms=9 if "*" in style else 5)
    ax.set_xscale("log")
    ax.set_xlabel("extra training memory, kB (tinytraining analytic, 128 px)")
    ax.set_ylabel("test accuracy on digits 5-9, %")
    ax.set_title(f"{model}: sparse update vs baselines (Figure 9 style)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
