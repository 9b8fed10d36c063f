"""The transfer benchmark's report (benchmarks/transfer.py): rows from the checkpoint's finished
runs, the verdicts (each validated row against the best baseline that fits its budget: the CI
verdict, the paired per-seed difference with its paired-t p-value, and the Holm-corrected verdict
across the backbone's budgets), the Markdown table and the plot."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transfer_protocol import TIES, VALIDATED, is_stage, method_grid, run_id
from transfer_runs import MEMORY_COLUMNS, Method, trains_of
from transfer_stats import (
    ALPHA,
    UNSTABLE_POINTS,
    compare,
    holm,
    holm_verdict,
    mean_ci,
    paired,
    pareto_front,
)

from memplan.io import save_figure
from memplan.optim import OPTIMIZERS
from memplan.plan import Validation
from memplan.rates import Rates
from memplan.units import parse_bytes


def chosen_lr(m: Method, a: argparse.Namespace, done: dict) -> tuple[list[Rates], Rates | None, bool]:
    """The grid ``m`` used, its rate and whether that rate is still at an edge: the stage's (its grid
    as the stage widened it), or its own grid widened while its choice lies at an edge
    (``transfer_protocol.method_grid``; the rate is None until chosen)."""
    if m.lr is not None:
        return [Rates.parse(x) for x in m.detail.get("grid", [str(m.lr)])], m.lr, m.detail.get("lr_at_grid_edge", False)
    return method_grid(m.key, m.settings(a.lrs), done, a.val_seeds, a.widen)


def grid_runs(m: Method, grid: list[Rates], done: dict, val_seeds: list[int]) -> dict[str, list[dict]]:
    """``m``'s finished validation runs by grid setting (its own grid: none for a validated row)."""
    if m.lr is not None:
        return {}
    return {str(x): [r for s in val_seeds if (r := done.get(run_id("grid", m.key, x, s)))] for x in grid}


def finished_finals(m: Method, lr: Rates | None, seeds: list[int], done: dict) -> list[dict]:
    """The finished test runs of ``m`` at rate ``lr`` (none while no rate is chosen)."""
    return [f for s in seeds if lr is not None and (f := done.get(run_id("final", m.key, lr, s)))]


def left_out(m: Method, a: argparse.Namespace, done: dict) -> str:
    """Why ``m`` has no row yet, in words: not trained, its grid under way or diverged, or how
    many of its test seeds are finished."""
    grid, lr, _ = chosen_lr(m, a, done)
    finals = finished_finals(m, lr, a.seeds, done)
    if finals:
        return f"{len(finals)} of {len(a.seeds)} test seeds finished"
    runs = [r for rs in grid_runs(m, grid, done, a.val_seeds).values() for r in rs]
    if not runs and m.lr is None:
        return "not trained"
    if runs and all(r["diverged"] for r in runs):
        return "every rate it trained diverged"
    return f"learning-rate grid under way ({len(runs)} runs finished)" if m.lr is None else "no test seed finished"


def assemble(methods: list[Method], memory: dict[str, dict[str, int]], a: argparse.Namespace, done: dict) -> list[dict]:
    """One row per method whose every test seed is finished (accuracy %, memory bytes, seconds)."""
    rows = []
    for m in methods:
        grid, lr, edge = chosen_lr(m, a, done)
        by_setting = grid_runs(m, grid, done, a.val_seeds)
        finals = finished_finals(m, lr, a.seeds, done)
        if lr is None or len(finals) < len(a.seeds):
            continue
        accs = [f["accuracy"] for f in finals]
        mean, half = mean_ci(accs)
        runs = [r for rs in by_setting.values() for r in rs] + finals
        rows.append(
            {
                "name": m.name,
                "method": m.family,
                "memory_bytes": memory[m.name]["applied"],
                "memory": memory[m.name],
                "accuracy": accs,
                "seeds": list(a.seeds),
                "accuracy_mean": mean,
                "accuracy_ci": half,  # the 95% Student-t CI half-width (the plot's error bar)
                "accuracy_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,  # over seeds
                "lr": str(lr),
                "grid": [str(x) for x in grid],  # the grid actually used (widened beyond a chosen edge)
                "lr_at_grid_edge": edge,  # still pulled to an edge of the grid it used (widening exhausted)
                "grid_validation": {k: [r["accuracy"] for r in v] for k, v in by_setting.items()},
                "grid_diverged": [k for k, v in by_setting.items() if any(r["diverged"] for r in v)],
                "final_diverged": any(f["diverged"] for f in finals),
                "trainable_params": finals[0]["trainable_params"],
                "wall_s": round(sum(r["train_s"] + r["eval_s"] + r["cache_s"] for r in runs), 1),
                "cpu_s": round(sum(r["cpu_s"] for r in runs), 1),
                "devices": sorted({r.get("device", "cpu") for r in runs}),
                "same_runs_as": m.runs_as,
                "trains": trains_of(m),
                **m.detail,
            }
        )
    return rows


def trainings(rows: list[dict]) -> list[dict]:
    """Each training of ``rows`` once: the methods' rows, without a stage's row (its candidate's
    runs) or a row trained by the runs of another row shown."""
    names = {r["name"] for r in rows}
    return [r for r in rows if not is_stage(r["method"]) and r.get("same_runs_as") not in names]


def comparisons(rows: list[dict], missing: Sequence[dict] = (), family: str = VALIDATED) -> list[dict[str, Any]]:
    """Each validated row against the best baseline (highest mean) whose applied memory fits its
    budget: the CI verdict, the paired per-seed difference (points) with its 95% CI and paired-t
    p-value, and the Holm-adjusted p-value and verdict over the report's budgets (one backbone's);
    ``loses_to``: every baseline with no more memory than the validated row that beats it with the
    CIs apart (the acceptance check: it should be empty; a baseline below the best mean can be apart
    where the best is not, by a narrower CI).

    ``missing``: the methods without a row yet (``name``, ``method``, ``memory_bytes``). A baseline
    among them that fits a budget is listed in that comparison's ``pending`` (its verdict is
    provisional), and every unfinished stage counts in Holm's family at p = 1, so that an adjusted
    p-value never shrinks when the stage finishes (``holm_family``: how many p-values it counts).
    ``family``: the validated rows compared (one choice rule's: :func:`stage_family`), a Holm family
    of their own."""
    base = [r for r in rows if not is_stage(r["method"]) and r["method"] != "scheme"]
    waiting = [m for m in missing if not is_stage(m["method"]) and m["method"] != "scheme"]
    unfinished = sum(m["method"] == family for m in missing)
    out = []
    for r in (x for x in rows if x["method"] == family):
        budget = parse_bytes(r["budget"])
        fits = [b for b in base if b["memory_bytes"] <= budget]
        c: dict[str, Any] = {"name": r["name"], "budget_bytes": budget, "baseline": None}
        c["loses_to"] = [
            b["name"] for b in base if b["memory_bytes"] <= r["memory_bytes"] and compare(r, b).startswith("LOSES")
        ]
        c["pending"] = [m["name"] for m in waiting if m["memory_bytes"] <= budget]
        if fits:
            best = max(fits, key=lambda b: b["accuracy_mean"])
            d = paired(dict(zip(r["seeds"], r["accuracy"])), dict(zip(best["seeds"], best["accuracy"])))
            c |= {"baseline": best["name"], "ci_verdict": compare(r, best), **d}
        out.append(c)
    tested = [c for c in out if c["baseline"] is not None]
    adjusted = holm([c["p"] for c in tested] + [1.0] * unfinished)
    for c, p in zip(tested, adjusted):
        c["p_holm"], c["holm_verdict"] = p, holm_verdict(c["difference"], p)
        c["holm_family"] = len(tested) + unfinished
    return out


def verdicts(rows: list[dict], compared: list[dict[str, Any]]) -> list[str]:
    """The acceptance checks in words (``compared``: :func:`comparisons` of ``rows``), and, at <= 1/10
    of full fine-tuning's memory, each validated row's gap to full fine-tuning."""
    lines = []
    by_name = {r["name"]: r for r in rows}
    full = next((r for r in rows if r["method"] == "full fine-tuning"), None)
    for c in compared:
        r = by_name[c["name"]]
        head = (
            f"{r['name']} (chose {r['chosen']}): {r['accuracy_mean']:.2f} ± {r['accuracy_ci']:.2f}% "
            f"at {r['memory_bytes']:,} B"
        )
        if c["loses_to"]:
            lines.append(f"{r['name']} LOSES (CIs apart) to a baseline with no more memory: {', '.join(c['loses_to'])}")
        if c["pending"]:
            lines.append(
                f"{r['name']}: PROVISIONAL, baselines that fit its budget are not finished: {', '.join(c['pending'])}"
            )
        if c["baseline"] is None:
            lines.append(f"{head}; no baseline fits {c['budget_bytes']:,} B")
            continue
        b = by_name[c["baseline"]]
        if r.get("same_runs_as") == b["name"]:
            lines.append(f"{head}: the stage chose the best baseline that fits {c['budget_bytes']:,} B, {b['name']}")
        else:
            lines.append(
                f"{head} vs the best baseline that fits {c['budget_bytes']:,} B, {b['name']}: {b['accuracy_mean']:.2f} "
                f"± {b['accuracy_ci']:.2f}% at {b['memory_bytes']:,} B -> {c['ci_verdict']}; paired over "
                f"{len(c['seeds'])} seeds {c['difference']:+.2f} ± {c['ci']:.2f} points, p = {c['p']:.3g}, "
                f"Holm p = {c['p_holm']:.3g} over {c['holm_family']} budgets -> {c['holm_verdict']} (at {ALPHA:g})"
            )
        if full is not None and r["memory_bytes"] <= full["memory_bytes"] / 10:
            gap = full["accuracy_mean"] - r["accuracy_mean"]
            lines.append(
                f"{r['name']} at {r['memory_bytes'] / full['memory_bytes']:.3f}x full fine-tuning's memory: "
                f"{gap:+.2f} points behind it -> {'' if gap <= 1 else 'NOT '}within 1 point"
            )
    return lines


def _protocol_lines(header: dict[str, Any]) -> list[str]:
    """The protocol file, its hash, its notes, the tie rule and the runs redone (from ``header``)."""
    if "protocol" not in header:
        return []
    out = [
        f"Protocol: `{header['protocol']}` (sha256 `{header['protocol_sha256']}`), fixed before the runs. "
        f"Ties: {TIES}. A rate chosen at an edge of its grid widens the grid one step beyond it, at most "
        f"{header.get('widen', 0)} times (* in the LR column: still at an edge). The validation stage chooses by "
        f"the rule {header.get('rule', 'best')!r} (memplan.search.rules), whose rows make the verdicts; "
        "every other rule is replayed on the same validation runs, its rows named `[rule R]` and judged apart. "
        f"Of a sized baseline the stage trains the sizes of the size rule {header.get('stage_sizes', 'largest')!r} "
        "(memplan.search.baselines.SIZE_RULES).",
        "",
    ]
    out += [f"- note: {n}" for n in header.get("notes", [])]
    redone = header.get("redone", [])
    out += [f"- run redone: `{x['id']}`: {x['why']}" for x in redone] or ["- runs redone: none"]
    return [*out, ""]


def markdown(
    rows: list[dict],
    header: dict[str, Any],
    front: list[str],
    lines: list[str],
    missing: Sequence[dict] = (),
    unstable: Sequence[dict] = (),
    replays: dict[str, list[str]] | None = None,
    strays: dict[str, Any] | None = None,
) -> str:
    """The table, the validation stages and the verdicts; ``missing``: the methods left out of the
    table (not trained, or not every test seed finished), each with its applied memory, bytes;
    ``unstable``: the seeds ``transfer_stats.unstable_seeds`` lists; ``replays``: the verdicts of
    each choice rule other than the protocol's; ``strays``: ``transfer_stats.validation_error`` of
    the rows' trainings."""
    tt = MEMORY_COLUMNS["tinytraining"][3]
    out = [
        f"# Transfer benchmark: {header['model']} -> {header['data']}",
        "",
        header["description"],
        "",
        *_protocol_lines(header),
        f"Memory, bytes, optimizer `{header['optimizer']}` ({OPTIMIZERS[header['optimizer']].description}) counted: "
        f"**applied** = memplan `applied` mode (the run as trained: memplan's lean modules, eager PyTorch on the CPU) "
        f"at the training batch {header['batch']} at {header['input']}, fp32 optimizer state; **tinytraining** = the "
        f"256KB paper's analytic memory, batch 1, {tt}. Accuracy: test split, mean ± 95% CI (Student t) over seeds "
        f"{header['seeds']}. LR: chosen on validation from {header['lrs']} with seeds {header['val_seeds']} "
        "(successive halving; * = at the edge of the grid it used). Wall: seconds of all the method's runs "
        "(grid + final), each on the device it ran on (the Machine line counts them). P = on the Pareto front "
        "(applied memory).",
        "",
        "| method | applied (B) | tinytraining (B) | test acc % | seeds | lr | trainable params | wall s | P |",
        "|---|---:|---:|---:|---:|---:|---:|---:|:-:|",
    ]
    names = {r["name"] for r in rows}
    for r in sorted(rows, key=lambda r: r["memory_bytes"]):  # "(= row)": the runs of another row (not a candidate's)
        alias = f" (= {r['same_runs_as']})" if r.get("same_runs_as") in names else ""
        out.append(
            f"| {r['name']}{alias} | {r['memory']['applied']:,} | {r['memory']['tinytraining']:,} | "
            f"{r['accuracy_mean']:.2f} ± {r['accuracy_ci']:.2f} | "
            f"{len(r['accuracy'])} | {r['lr']}{'*' if r['lr_at_grid_edge'] else ''} | {r['trainable_params']:,} | "
            f"{r['wall_s']:.0f} | {'P' if r['name'] in front else ''} |"
        )
    stage = [r for r in rows if is_stage(r["method"])]
    if stage:
        out += ["", "## Validation stage (memplan search B --validate)", ""]
        for r in stage:
            val = r["validation"]
            runners = ", ".join(
                f"{x['name']} {x['accuracy']:.2f}" for x in val["runners_up"] if x["accuracy"] is not None
            )
            margin = Validation(**val).margin()
            over = (
                ""
                if margin is None
                else f"; over the best baseline among them, {margin.baseline}: {margin}, "
                f"{'more than' if margin.resolved else 'inside'} twice its SE"
            )
            if margin is not None and margin.images_se is not None:
                over += (
                    f"; its {val['images']:,} images alone give that difference up to {margin.images_se:.2f} points "
                    f"(SE, binomial), and the margin is {'inside' if margin.within_images else 'more than'} twice that"
                )
            out.append(
                f"- {r['name']}: chose **{r['chosen']}** by rule {r.get('rule', 'best')!r} at lr {r['lr']} "
                f"(grid {', '.join(r.get('grid', []))}), "
                f"validation {val['accuracy']:.2f} ± {val['se']:.2f}% (seeds {val['seeds']}); runners-up: {runners}"
                f"{over}. The stage compared {r['stage_runs']} runs: {r['stage_run_s']:,.0f} s of training and "
                f"evaluation one after another ({r['stage_cpu_s']:,.0f} CPU s)"
            )
    if strays:
        out += [
            "",
            f"How far validation strays from test, over the {strays['rows']} methods' rows: validation at the "
            f"chosen rate minus test is {strays['offset']:+.2f} points on average, and around that it errs by "
            f"{strays['sd']:.2f} points (SD) for one training, about {strays['difference_sd']:.2f} for the "
            "difference of two (independent errors). Each margin's SE above counts the validation seeds only.",
        ]
    out += ["", "## Verdicts", "", *[f"- {x}" for x in lines], ""]
    for rule, said in (replays or {}).items():
        out += [
            f"## Verdicts under the rule {rule!r}: not the protocol's, replayed on the same validation runs",
            "",
            *[f"- {x}" for x in said or ["no budget's stage is finished under it"]],
            "",
        ]
    if unstable:
        out += [
            f"Unstable seeds (more than {UNSTABLE_POINTS:g} points below the median of the row's other seeds; "
            "not diverged: the loss stayed finite and the run beat chance; each counts in its row's mean and CI):",
            *[
                f"- {u['name']}: seed {u['seed']} at {u['accuracy']:.2f}%, "
                f"{u['others_median'] - u['accuracy']:.2f} points below the others' median ({u['others_median']:.2f}%)"
                for u in unstable
            ],
            "",
        ]
    if missing:
        said = [
            f"{m['name']} ({m['status']})"
            if m["memory_bytes"] is None
            else f"{m['name']} ({m['memory_bytes']:,} B; {m['status']})"
            for m in missing
        ]
        out += [f"Not in the table: {'; '.join(said)}", ""]
    devices = ", ".join(f"{d} {n}" for d, n in header.get("runs_by_device", {}).items())
    out += [f"Machine: {header['machine']}; runs by device: {devices or 'none yet'}", ""]
    out += _device_lines(header)
    return "\n".join(out)


def _device_lines(header: dict[str, Any]) -> list[str]:
    """What the report counts when runs trained on more than one device, and the device effect."""
    counted, by = header.get("counted_device", "cpu"), header.get("runs_by_device", {})
    if set(by) <= {counted}:
        return []
    out = [
        f"The table and the verdicts count the runs on {counted} only: each device's runs are a replicate of "
        "their own (`--runs-of`), since a GPU's float kernels give another accuracy for one seed; the runs "
        "trained on two devices pair as the device effect:"
    ]
    for dev, e in header.get("device_effect", {}).items():
        out.append(f"- {dev}, final runs trained on both ({len(e['runs'])}): {_effect(e)}")
        out += [f"  - {m} ({len(x['runs'])}): {_effect(x)}" for m, x in e.get("by_method", {}).items()]
    return [*out, ""]


def _effect(e: dict[str, Any]) -> str:
    """A paired device difference as the report prints it (one run: its difference alone)."""
    if len(e["runs"]) < 2:
        return f"{e['difference']:+.2f} points"
    return f"{e['difference']:+.2f} ± {e['ci']:.2f} points (95% CI), paired p = {e['p']:.3g}"


def plot(rows: list[dict], front: list[str], path: Path, title: str, xlabels: dict[str, str]) -> None:
    """Accuracy against memory, one panel per memory column (log x), error bars = 95% CI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(xlabels), figsize=(13, 4.8), sharey=True)
    families = list(dict.fromkeys(r["method"] for r in rows))
    markers = "os^vD<>pPX*h"
    for ax, (column, xlabel) in zip(axes, xlabels.items()):
        for fam, mk in zip(families, markers * 2):
            pts = sorted(
                (r["memory"][column], r["accuracy_mean"], r["accuracy_ci"]) for r in rows if r["method"] == fam
            )
            xs, ys, es = zip(*pts)
            ax.errorbar(xs, ys, yerr=es, fmt=mk + ("-" if len(xs) > 1 else ""), capsize=3, label=fam, ms=6)
        pf = pareto_front([{**r, "memory_bytes": r["memory"][column]} for r in rows])
        fr = sorted((r["memory"][column], r["accuracy_mean"]) for r in rows if r["name"] in pf)
        if fr:
            ax.step(*zip(*fr), where="post", color="k", lw=0.8, ls="--", label="Pareto front")
        ax.set_xscale("log")
        ax.set(xlabel=xlabel)
    axes[0].set(ylabel="test accuracy, % (95% CI)")
    axes[-1].legend(fontsize=7, loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)  # atomic, a temporary file of its own: workers write it side by side
    plt.close(fig)
