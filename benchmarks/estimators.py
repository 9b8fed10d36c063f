"""Contribution estimators against the grid (issue 20), on the transfer benchmark's backbone and data.

Default: EfficientNet-Lite0 (ImageNet weights) -> Fashion-MNIST at 64 px, the shipped grid profile
``memplan/data/profiles/efficientnet-lite0-fashion-mnist.json`` as the reference. Steps:

1. ``estimate``: ``memplan contrib --estimator E`` for each of ``--estimators`` (fisher, rgn, probe)
   with the grid profile's setup and protocol (same model, weights, data split, bias depths, layers,
   ratios, optimizer, linear probe); each profile written to ``--out``; wall and CPU seconds of the
   whole call (setup, linear probe, estimator) and of the estimator alone. The grid's own seconds
   are read from its profile (``timing.run_seconds``: its runs, one thread each, on this machine),
   and printed beside them;
2. ``rank``: Spearman (and Pearson) of each estimator's entries against the grid's Δacc, per family
   (bias depths; weight layer x ratio), over the entries whose grid SE is at most the family's
   median SE ("low SE") and over all entries; 95% bootstrap CIs;
3. ``search``: ``memplan search`` at each of ``--budgets`` on every profile (the grid's with its
   default objective, lcb; each estimator's with ``mean``: its importance as measured), and on the
   best gradient estimator with ``--select importance`` (its top channels instead of magnitude+);
   schemes written to ``--out``/schemes;
4. ``train`` (``--train``): every scheme trained and tested by ``benchmarks/transfer.py`` (same
   protocol, LR grid, checkpoint: a scheme that trains what another method trains shares its
   runs) with ``--seeds``; results in ``transfer_results/estimators_e2e.*``;
5. ``report``: ``estimators.json`` / ``.md`` / ``.png`` in ``--out``: times, rank correlations, and
   test accuracy (mean +- 95% CI) per budget and source; a source whose runs are not finished is
   reported as missing.

Run: python benchmarks/estimators.py [--train] [--report]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from memplan.contrib import load_profile, run_contrib
from memplan.contrib.profile import ContribProfile
from memplan.errors import MemplanError
from memplan.io import save_figure, write_text
from memplan.search import run_search
from memplan.search.agreement import correlations

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "memplan" / "data" / "profiles" / "efficientnet-lite0-fashion-mnist.json"
GRADIENT = ("fisher", "rgn")


def _transfer():
    if str(ROOT / "benchmarks") not in sys.path:  # its modules (transfer_*.py) import each other
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("transfer", ROOT / "benchmarks" / "transfer.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("transfer", mod)  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------- 1. estimate
def contrib_options(grid: ContribProfile) -> dict[str, Any]:
    """``run_contrib`` keywords that reproduce the grid profile's setup and protocol."""
    p, d = grid.protocol, grid.dataset
    return dict(
        weights="zoo" if str(grid.weights.get("source", "")).startswith("zoo:") else None,
        data=d["spec"],
        resolution=grid.run_resolution,
        costing_resolution=grid.costing_resolution,
        train_per_class=d["train_per_class"],
        validation=d["validation_split"],
        test_per_class=d["test_per_class"],
        split_seed=d.get("split_seed", 0),
        seeds=p.seeds,
        epochs=p.epochs,
        batch_size=p.batch_size,
        lr_classifier=p.lr_classifier,
        lr_bias=p.lr_bias,
        lr_weight=p.lr_weight,
        optimizer=p.optimizer,
        probe_epochs=p.probe_epochs,
        probe_lr=p.probe_lr,
        ratios=p.ratios,
        bias_ks=p.bias_ks,
        weight_layers=p.weight_layers,
        select=p.select,
    )


def estimate(a: argparse.Namespace, grid: ContribProfile, out: Path) -> dict[str, dict[str, Any]]:
    """Each estimator's profile (measured unless already in ``out``) and its seconds."""
    times = {}
    for name in a.estimators:
        path = out / f"{name}.json"
        if not path.is_file() or a.force:
            t0, c0 = time.perf_counter(), time.process_time()
            run_contrib(
                grid.model, out=path, estimator=name, batches=a.batches, threads=a.threads, **contrib_options(grid)
            )
            timing = {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
            write_text(out / f"{name}.time.json", json.dumps(timing) + "\n")
        prof = load_profile(path)
        measured = json.loads((out / f"{name}.time.json").read_text())
        times[name] = {
            **measured,
            "probe_wall_s": prof.timing["probe_wall_s"],
            "estimator_wall_s": prof.timing["estimator_wall_s"],
            "run_cpu_seconds": prof.timing.get("run_cpu_seconds", 0.0),
        }
    return times


# ----------------------------------------------------------------------------- 2. rank
def families(prof: ContribProfile) -> dict[str, dict[Any, float]]:
    return {
        "bias": {k: v for k, v in prof.bias.items()},
        "weight": {(n, r): v for n, row in prof.weight.items() for r, v in row.items()},
    }


def ses(prof: ContribProfile) -> dict[str, dict[Any, float | None]]:
    return {
        "bias": dict(prof.bias_se),
        "weight": {(n, r): v for n, row in prof.weight_se.items() for r, v in row.items()},
    }


def rank(grid: ContribProfile, est: ContribProfile) -> dict[str, Any]:
    """Correlations of ``est``'s entries with the grid's Δacc per family, over low-SE and all entries."""
    g, e, s = families(grid), families(est), ses(grid)
    out = {}
    for fam in ("bias", "weight"):
        keys = sorted(set(g[fam]) & set(e[fam]), key=str)
        known = [s[fam][k] for k in keys if s[fam].get(k) is not None]
        cut = statistics.median(known) if known else float("inf")
        for subset, chosen in (("low_se", [k for k in keys if (s[fam].get(k) or 0.0) <= cut]), ("all", keys)):
            entry: dict[str, Any] = {"n": len(chosen), "se_cut": cut if subset == "low_se" else None}
            if len(chosen) >= 3:
                entry.update(correlations([e[fam][k] for k in chosen], [g[fam][k] for k in chosen], bootstrap=2000))
            out[f"{fam}/{subset}"] = entry
    return out


# ----------------------------------------------------------------------------- 3. search
def sources(a: argparse.Namespace, out: Path, grid_path: Path) -> list[tuple[str, Path, str, str]]:
    """(source name, profile, objective, channel selection) of every scheme family."""
    rows = [("grid", grid_path, "lcb", "magnitude+")]
    for e in a.estimators:  # each estimator's importance-ranked channels right after its magnitude+ schemes
        rows.append((e, out / f"{e}.json", "mean", "magnitude+"))
        if e in GRADIENT:
            rows.append((f"{e}+importance channels", out / f"{e}.json", "mean", "importance"))
    return rows


def search(a: argparse.Namespace, out: Path, grid_path: Path, grid: ContribProfile) -> list[dict[str, Any]]:
    """One scheme per source and budget, written to ``out``/schemes."""
    (out / "schemes").mkdir(parents=True, exist_ok=True)
    found = []
    for name, prof, objective, select in sources(a, out, grid_path):
        for b in a.budgets:
            stem = f"{name.replace('+importance channels', '-importance')}-{b}"
            path = out / "schemes" / f"{stem}.json"
            r = run_search(
                grid.model,
                b,
                profile_path=prof,
                objective=objective,
                select=select,
                out=path,
                optimizer=a.optimizer,
                resolution=grid.costing_resolution,
            )
            s = r.scheme
            found.append(
                {
                    "source": name,
                    "budget": b,
                    "scheme": str(path),
                    "method": stem,
                    "memory_bytes": r.memory_bytes,
                    "bias_update": s.bias_update,
                    "weights": [[w.conv_index, w.ratio] for w in s.weight_updates],
                }
            )
    return found


# ----------------------------------------------------------------------------- 4-5. train, report
def train_argv(a: argparse.Namespace, schemes: list[dict[str, Any]], report_only: bool) -> list[str]:
    files = ",".join(s["scheme"] for s in schemes)
    argv = ["--schemes", files, "--methods", ",".join(s["method"] for s in schemes), "--name", "estimators_e2e"]
    argv += ["--protocol", a.transfer_protocol, "--no-progress", "--workers", str(a.workers)]
    argv += ["--out", a.transfer_out] + (["--seeds", a.seeds] if a.seeds else [])
    return argv + (["--report"] if report_only else []) + a.transfer_args


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Contribution estimators against the grid",
        "",
        result["description"],
        "",
        "## Time",
        "",
        "| source | whole call wall s | linear probe s | estimator s | CPU s | speed-up over the grid (wall) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    g = result["grid_time"]
    lines.append(
        f"| grid (recorded in its profile) | {g['run_seconds']:,.0f} | - | - | {g['run_cpu_seconds']:,.0f} | 1 |"
    )
    for name, t in result["times"].items():
        lines.append(
            f"| {name} | {t['wall_s']:.1f} | {t['probe_wall_s']:.1f} | {t['estimator_wall_s']:.1f} | "
            f"{t['cpu_s']:.1f} | {g['run_seconds'] / t['wall_s']:,.0f}x |"
        )
    lines += [
        "",
        "## Rank correlation with the grid's Δacc",
        "",
        "| source | family | entries | n | Spearman [95% CI] | Pearson |",
    ]
    lines.append("|---|---|---|---:|---|---:|")
    for name, fams in result["rank"].items():
        for key, c in fams.items():
            fam, subset = key.split("/")
            if "spearman" not in c:
                lines.append(f"| {name} | {fam} | {subset} | {c['n']} | (fewer than 3) | |")
                continue
            lo, hi = c["spearman_ci"]
            lines.append(
                f"| {name} | {fam} | {subset} | {c['n']} | {c['spearman']:+.2f} [{lo:+.2f}, {hi:+.2f}] | "
                f"{c['pearson']:+.2f} |"
            )
    lines += ["", "## End to end: searched schemes, test accuracy", ""]
    lines += [
        "| budget | source | scheme | memory (B) | test acc % (mean ± 95% CI) | seeds | lr |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for s in result["schemes"]:
        acc = s.get("accuracy")
        cell = f"{acc['mean']:.2f} ± {acc['ci']:.2f}" if acc else "not finished"
        what = f"k={s['bias_update']}" + (f", W {s['weights']}" if s["weights"] else "")
        lines.append(
            f"| {s['budget']} | {s['source']} | {what} | {s['memory_bytes']:,} | {cell} | "
            f"{acc['seeds'] if acc else '-'} | {acc['lr'] if acc else '-'} |"
        )
    lines += ["", "## Verdicts", "", *[f"- {v}" for v in result["verdicts"]], ""]
    return "\n".join(lines)


def verdicts(result: dict[str, Any]) -> list[str]:
    """Fisher's time target, and per budget the best estimator's scheme against the grid's."""
    out = []
    g = result["grid_time"]["run_seconds"]
    if "fisher" in result["times"]:
        t = result["times"]["fisher"]["wall_s"]
        out.append(
            f"fisher: {t:.1f} s for the whole call (setup, probe, estimate) against the grid's {g:,.0f} s: "
            f"{'under' if t < 60 else 'NOT under'} 60 s, {g / t:,.0f}x faster ({'>=' if g / t >= 50 else '<'} 50x)"
        )
    by_budget: dict[str, list[dict[str, Any]]] = {}
    for s in result["schemes"]:
        if s.get("accuracy"):
            by_budget.setdefault(s["budget"], []).append(s)
    for b, rows in by_budget.items():
        grid = next((r for r in rows if r["source"] == "grid"), None)
        others = [r for r in rows if r["source"] != "grid"]
        if grid is None or not others:
            continue
        best = max(others, key=lambda r: r["accuracy"]["mean"])
        gap = best["accuracy"]["mean"] - grid["accuracy"]["mean"]
        within = abs(gap) <= grid["accuracy"]["ci"] + best["accuracy"]["ci"]
        out.append(
            f"{b}: best estimator scheme ({best['source']}) {best['accuracy']['mean']:.2f} ± "
            f"{best['accuracy']['ci']:.2f} "
            f"vs grid {grid['accuracy']['mean']:.2f} ± {grid['accuracy']['ci']:.2f}: {gap:+.2f} points, "
            f"{'CIs overlap' if within else 'CIs apart'}"
        )
        for e in GRADIENT:
            mag = next((r for r in rows if r["source"] == e), None)
            imp = next((r for r in rows if r["source"] == f"{e}+importance channels"), None)
            if not (mag and imp and imp["weights"]):
                continue
            if all(r == 1.0 for _, r in imp["weights"]):
                out.append(f"{b}: {e} importance-ranked channels = magnitude+ (every update at ratio 1: all channels)")
                continue
            d = imp["accuracy"]["mean"] - mag["accuracy"]["mean"]
            ci = imp["accuracy"]["ci"] + mag["accuracy"]["ci"]
            out.append(
                f"{b}: {e} importance-ranked channels vs magnitude+ (same layers and ratios): {d:+.2f} points "
                f"({'within' if abs(d) <= ci else 'beyond'} the summed CIs, ±{ci:.2f}; lr {imp['accuracy']['lr']:g} "
                f"vs {mag['accuracy']['lr']:g}, each chosen on validation)"
            )
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in sorted({s["source"] for s in result["schemes"]}):
        pts = [s for s in result["schemes"] if s["source"] == name and s.get("accuracy")]
        if pts:
            ax.errorbar(
                [p["memory_bytes"] for p in pts],
                [p["accuracy"]["mean"] for p in pts],
                yerr=[p["accuracy"]["ci"] for p in pts],
                marker="o",
                capsize=3,
                label=name,
            )
    ax.set_xscale("log")
    ax.set_xlabel("training memory, bytes (memplan tinytraining, Adam state counted; log)")
    ax.set_ylabel("test accuracy, % (mean ± 95% CI)")
    ax.set_title("schemes searched from each contribution estimator")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def accuracies(e2e: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        r["name"]: {"mean": r["accuracy_mean"], "ci": r["accuracy_ci"], "seeds": len(r["accuracy"]), "lr": r["lr"]}
        for r in e2e.get("rows", [])
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="other options are passed to benchmarks/transfer.py"
    )
    ap.add_argument("--grid", default=str(GRID), help="the grid profile every estimator is compared with")
    ap.add_argument("--estimators", default="fisher,probe,rgn")
    ap.add_argument("--batches", type=int, default=8, help="mini-batches of fisher / rgn (the probe's steps)")
    ap.add_argument("--budgets", default="20KB,100KB,800KB")
    ap.add_argument("--optimizer", default="adam")
    ap.add_argument(
        "--seeds",
        default=None,
        help="seeds of the end-to-end test runs (default: the protocol's; given, they must match)",
    )
    ap.add_argument(
        "--transfer-protocol",
        default=str(ROOT / "benchmarks" / "protocols" / "lite0-fashion-mnist.json"),
        help="benchmarks/transfer.py's protocol file (its setup, grids and seeds)",
    )
    ap.add_argument(
        "--workers", type=int, default=1, help="processes of the end-to-end runs (benchmarks/transfer.py --workers)"
    )
    ap.add_argument("--threads", type=int, default=None, help="torch threads of the estimators (default: all cores)")
    ap.add_argument("--train", action="store_true", help="train and test the searched schemes (hours)")
    ap.add_argument("--force", action="store_true", help="measure the estimator profiles again")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "estimators_results"))
    ap.add_argument(
        "--transfer-out", default=str(ROOT / "benchmarks" / "transfer_results"), help="benchmarks/transfer.py's --out"
    )
    a, a.transfer_args = ap.parse_known_args(argv)  # the rest goes to benchmarks/transfer.py
    a.estimators = [e for e in a.estimators.split(",") if e]
    a.budgets = [b for b in a.budgets.split(",") if b]
    return a


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    grid_path = Path(a.grid)
    grid = load_profile(grid_path)
    times = estimate(a, grid, out)
    ranks = {name: rank(grid, load_profile(out / f"{name}.json")) for name in a.estimators}
    schemes = search(a, out, grid_path, grid)
    transfer = _transfer()
    e2e = transfer.main(train_argv(a, schemes, report_only=not a.train))
    acc = accuracies(e2e)
    for s in schemes:
        s["accuracy"] = acc.get(s["method"])
    result = {
        "description": (
            f"{grid.model} -> {grid.dataset['name']} at {grid.run_resolution} px, the grid profile {grid_path.name} "
            f"as the reference ({len(grid.bias)} bias depths, {sum(len(r) for r in grid.weight.values())} weight "
            f"entries). Estimators with the grid's setup and linear probe; fisher / rgn over {a.batches} mini-batches "
            f"of {grid.protocol.batch_size}; probe: one epoch over {a.batches} x {grid.protocol.batch_size} images, "
            f"2 seeds. Times on this machine ({os.cpu_count()} cores, torch {torch.__version__}, CPU only). "
            "Schemes: memplan search at each budget (grid: lcb objective; estimators: mean of their importance); "
            "end to end: benchmarks/transfer.py's protocol (LR chosen on validation, test split, mean ± 95% CI)."
        ),
        "grid_time": {k: grid.timing[k] for k in ("run_seconds", "run_cpu_seconds")},
        "times": times,
        "rank": ranks,
        "schemes": schemes,
    }
    result["verdicts"] = verdicts(result)
    write_text(out / "estimators.json", json.dumps(result, indent=1, default=str) + "\n")
    write_text(out / "estimators.md", markdown(result))
    plot(result, out / "estimators.png")
    print(markdown(result))
    return result


if __name__ == "__main__":
    try:
        main()
    except MemplanError as exc:
        print(f"estimators: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
