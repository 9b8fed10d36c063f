"""The joint plan on Lite0's transfer benchmark (issue 38, item 7): what to update AND how to run the
step, with no new training.

Execution choices change neither what trains nor the gradients, so a method's measured accuracy
stays what the transfer benchmark measured (``benchmarks/transfer_results/transfer.json``:
EfficientNet-Lite0 -> Fashion-MNIST, 64 px, batch 32, Adam, test accuracy over seeds), and its
memory and FLOPs come from memplan's exact cost rules (``applied`` mode, as that benchmark counts
memory):

* **recomputed segments** (``memplan.graph.execution``; ``apply_scheme`` realises them with
  non-reentrant ``torch.utils.checkpoint``, ``memplan verify`` measures them): none, or every block
  from one on in segments of 1 to ``--sizes`` blocks;
* **micro-batching** (gradient accumulation over M micro-batches of 32 / M): only for a method whose
  norms all run in eval mode (frozen statistics), where it computes the same gradients (up to the
  order of the sum and dropout's draws); the peak is that of a later micro-batch, which holds the
  accumulated gradients.

Part 1, the measured methods (the baselines, MobileTL and full fine-tuning included, and the
validated searched schemes): each one's plan is rebuilt and costed without execution choices (the
cost must equal the applied memory the transfer benchmark recorded, else the row is left out),
then with the execution choice of least total memory (ties: fewer FLOPs, then lower peak; with
``--max-overhead``, recomputation costing at most that fraction of the step's FLOPs). For each
budget: the best measured accuracy that fits without and with execution choices. The FLOP
overhead is the recomputed forward over the step's conv / linear / matmul FLOPs (forward +
backward, FLOPs = 2 x MACs).

Part 2, the search (``memplan search --recompute``) over the shipped Lite0 contribution profile
(summed Δacc, no training): for each budget, the exact optimum of the update alone and of the
update with its recomputed segments (every recompute set's exact optimum, the best kept; each
result re-costed by ``compute()``).

Outputs (``--out``, default ``benchmarks/joint_results``): ``joint_plan.json``, ``joint_plan.md``
and ``joint_plan.png`` (the memory-accuracy fronts with and without execution choices; the
searched summed Δacc per budget). Cost evaluations only: about a minute of one CPU core.

Run: python benchmarks/joint_plan.py [--sizes 4] [--max-overhead 1.0] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from memplan.accounting.engine import compute
from memplan.accounting.microbatch import batch_statistic_norms
from memplan.api import capture
from memplan.errors import MemplanError
from memplan.graph import LayerGraph, conv_layers
from memplan.io import shipped, write_text
from memplan.modes import get_mode
from memplan.plan import Plan, Scheme, Train, WeightUpdate, fingerprint, scheme_to_plan
from memplan.search.exact import solve_exact
from memplan.search.execution import execution_family
from memplan.search.memory import MemoryModel, build_table
from memplan.search.objective import default_objective
from memplan.search.space import build_space, load_contributions
from memplan.strategies import make_plan
from memplan.units import parse_bytes

torch.set_num_threads(1)
HERE = Path(__file__).resolve().parent
MODEL, RESOLUTION, CLASSES, BATCH, OPTIMIZER, MODE = "efficientnet-lite0", 64, 10, 32, "adam", "applied"
#: the budgets compared: the transfer protocol's, then up to full fine-tuning's memory
BUDGETS = ("15MB", "20MB", "30MB", "38MB", "45MB", "48MB", "60MB", "68MB", "100MB", "150MB", "205MB")
#: the search's budgets: where the profile's space lies (its best update alone needs 26.8 MB)
SEARCH_BUDGETS = ("14MB", "14.5MB", "15MB", "16MB", "17MB", "18MB", "20MB", "22MB", "25MB", "27MB", "30MB")
#: the baselines of the transfer benchmark: row name -> (architecture transform, strategy, plan change)
STRATEGIES = {
    "classifier only": (None, "last"),
    "bias only": (None, "bias"),
    "norm + bias": (None, "norm"),
    "MobileTL": (None, "mobiletl"),
    "full fine-tuning": (None, "full"),
    "TinyTL lite-residual + bias": ("tinytl-lb", "tinytl-lb"),
}


@dataclass
class Cost:
    """One method under one execution choice: bytes, FLOPs (2 x MACs) per optimizer step."""

    total: int
    peak: int
    step_flops: int  # conv / linear / matmul forward + backward of the whole batch
    recompute_flops: int  # their forward recomputed in the backward, whole batch
    micro_batches: int = 1
    segments: tuple[tuple[str, ...], ...] = ()

    @property
    def overhead(self) -> float:
        return self.recompute_flops / self.step_flops

    def to_json(self) -> dict[str, Any]:
        return {
            "total_bytes": self.total,
            "peak_bytes": self.peak,
            "step_flops": self.step_flops,
            "recompute_flops": self.recompute_flops,
            "flop_overhead": round(self.overhead, 4),
            "micro_batches": self.micro_batches,
            "recompute": [list(s) for s in self.segments],
        }


class Graphs:
    """The model captured per (architecture transform, batch), once each."""

    def __init__(self) -> None:
        self.caps: dict[tuple[str | None, int], LayerGraph] = {}

    def __call__(self, arch: str | None, batch: int) -> LayerGraph:
        if (arch, batch) not in self.caps:
            cap = capture(MODEL, resolution=RESOLUTION, classes=CLASSES, method=arch, batch=batch)
            self.caps[arch, batch] = cap.graph
        return self.caps[arch, batch]


def _scheme(graph: LayerGraph, bias_update: int, weights: list[list[float]], norms: dict[str, str]) -> Scheme:
    convs = conv_layers(graph)
    updates = [WeightUpdate(layer=convs[int(i)].name, conv_index=int(i), ratio=r) for i, r in weights]
    return Scheme(
        model=MODEL,
        fingerprint=fingerprint(graph),
        input_shape=list(graph.input_shape[1:]),
        bias_update=bias_update,
        weight_updates=updates,
        norm_modes=norms,
    )


def _norms(graph: LayerGraph, mode: str) -> dict[str, str]:
    head = set(graph.classifier_layers)
    return {n.name: mode for n in graph.param_nodes() if n.kind in ("batchnorm",) and n not in head}


def _merged(a: Plan, b: Plan) -> Plan:
    """What either plan trains (the validation stage's "bias only + MobileTL")."""
    train = dict(a.train)
    for name, t in b.train.items():
        u = train.get(name, Train())
        train[name] = Train(max(u.weight, t.weight), u.bias or t.bias)
    return Plan("merged", train, a.norm_train | b.norm_train, a.approx | b.approx)


def plan_of(row: dict[str, Any], graph: LayerGraph) -> Plan | None:
    """The plan a transfer row trained (None: not rebuilt here); ``graph`` is its architecture's."""
    name = row["name"]
    if name in STRATEGIES:
        return make_plan(graph, STRATEGIES[name][1])
    if name.startswith("last-"):
        k = int(name.split("-")[1].split()[0])
        n = len(conv_layers(graph))
        return scheme_to_plan(graph, _scheme(graph, k, [[i, 1.0] for i in range(n - k, n)], {}))
    if name.startswith("norm + bias, running"):
        return scheme_to_plan(graph, _scheme(graph, len(conv_layers(graph)), [], _norms(graph, "affine")))
    if name.startswith("norm + bias, re-estimated"):
        return scheme_to_plan(graph, _scheme(graph, len(conv_layers(graph)), [], _norms(graph, "reestimate")))
    if "bias_update" not in row:
        return None
    plan = scheme_to_plan(graph, _scheme(graph, row["bias_update"], row["weights"], {}))
    return _merged(plan, make_plan(graph, "mobiletl")) if "MobileTL" in row["chosen"] else plan


def cost(graphs: Graphs, arch: str | None, plan_at: Any, micro: int, segments: tuple) -> Cost:
    """``plan_at(graph)``'s cost at ``micro`` micro-batches with ``segments`` recomputed."""
    graph = graphs(arch, BATCH // micro)
    plan = replace(plan_at(graph), recompute=segments)
    t = compute(graph, plan, get_mode(MODE), optimizer=OPTIMIZER, accumulated=micro > 1).totals
    return Cost(
        t.total_bytes,
        t.peak_bytes,
        micro * (t.forward_flops + t.backward_flops),
        micro * t.recompute_flops,
        micro,
        segments,
    )


def best_execution(graphs: Graphs, arch: str | None, plan_at: Any, a: argparse.Namespace) -> tuple[Cost, Cost, Cost]:
    """(the cost without execution choices, the least total memory with recomputation alone, with
    recomputation and micro-batching)."""
    base = cost(graphs, arch, plan_at, 1, ())
    graph = graphs(arch, BATCH)
    micros = [1] if batch_statistic_norms(graph, plan_at(graph)) else [m for m in a.micro_batches if BATCH % m == 0]
    best = {1: base, 0: base}  # 1: recomputation alone; 0: with micro-batching too
    for micro in sorted({1, *micros}):
        for segments in execution_family(graphs(arch, BATCH // micro), range(1, a.sizes + 1)):
            c = cost(graphs, arch, plan_at, micro, segments)
            if a.max_overhead is not None and c.overhead > a.max_overhead:
                continue
            for key in (0, 1) if micro == 1 else (0,):
                b = best[key]
                if (c.total, c.recompute_flops, c.peak) < (b.total, b.recompute_flops, b.peak):
                    best[key] = c
    return base, best[1], best[0]


def measured_rows(a: argparse.Namespace, graphs: Graphs) -> tuple[list[dict[str, Any]], list[str]]:
    """Part 1: every rebuilt transfer row with its cost without and with execution choices."""
    data = json.loads(Path(a.transfer).read_text())
    rows, skipped = [], []
    for row in data["rows"]:
        if row.get("same_runs_as") and row["name"].startswith("validated") and "(= " in row["name"]:
            continue
        arch = STRATEGIES.get(row["name"], (None,))[0]
        plan_at = lambda g, row=row: plan_of(row, g)  # noqa: E731
        if plan_at(graphs(arch, BATCH)) is None:
            skipped.append(f"{row['name']}: its plan is not rebuilt here")
            continue
        base, recomputed, best = best_execution(graphs, arch, plan_at, a)
        if base.total != row["memory_bytes"]:
            skipped.append(f"{row['name']}: rebuilt {base.total} B, the benchmark recorded {row['memory_bytes']} B")
            continue
        rows.append(
            {
                "name": row["name"],
                "accuracy": row["accuracy_mean"],
                "ci": row["accuracy_ci"],
                "without": base.to_json(),
                "recompute only": recomputed.to_json(),
                "with": best.to_json(),
            }
        )
    return rows, skipped


def best_at(rows: list[dict[str, Any]], budget: int, key: str) -> dict[str, Any] | None:
    fits = [r for r in rows if r[key]["total_bytes"] <= budget]
    return max(fits, key=lambda r: (r["accuracy"], -r[key]["total_bytes"])) if fits else None


def front(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The rows no other one beats on both memory (total) and measured accuracy."""
    ordered = sorted(rows, key=lambda r: (r[key]["total_bytes"], -r["accuracy"]))
    out: list[dict[str, Any]] = []
    for r in ordered:
        if not out or r["accuracy"] > out[-1]["accuracy"]:
            out.append(r)
    return out


def searched(a: argparse.Namespace, graphs: Graphs) -> list[dict[str, Any]]:
    """Part 2: per budget, the exact optimum of the update alone and jointly with recomputation."""
    graph = graphs(None, BATCH)
    contributions = load_contributions(a.profile)
    objective = default_objective(contributions.bias_se, contributions.weight_se)
    found: dict[int, list[dict[str, Any]]] = {parse_bytes(b): [] for b in SEARCH_BUDGETS}
    for segments in execution_family(graph, range(1, a.search_sizes + 1)):
        space = build_space(graph, contributions, model=MODEL, objective=objective)
        space.recompute = segments
        memory = MemoryModel(space, MODE, optimizer=OPTIMIZER)
        table = build_table(memory)
        for budget, results in found.items():
            r = solve_exact(space, table, budget)
            if r is None or memory.measure(r.candidate) != r.estimate:  # not additive under this set
                continue
            p = memory.profile(r.candidate).totals
            results.append(
                {
                    "segments": [list(s) for s in segments],
                    "candidate": r.candidate.describe(),
                    "objective": r.value,
                    "summed_delta_acc": space.summed(r.candidate),
                    "total_bytes": r.estimate,
                    "peak_bytes": p.peak_bytes,
                    "flop_overhead": round(p.recompute_flops / (p.forward_flops + p.backward_flops), 4),
                }
            )
    out = []
    for budget, results in found.items():
        alone = [r for r in results if not r["segments"]]
        key = lambda r: (r["objective"], -r["total_bytes"], -r["flop_overhead"])  # noqa: E731
        out.append(
            {
                "budget_bytes": budget,
                "without": max(alone, key=key) if alone else None,
                "with": max(results, key=key) if results else None,
            }
        )
    return out


# ----------------------------------------------------------------------------- report


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.1f}"


def _choice(c: dict[str, Any]) -> str:
    parts = []
    if c["recompute"]:
        sizes = sorted({len(s) for s in c["recompute"]})
        first = c["recompute"][0][0]
        parts.append(f"recompute from {first} in {'/'.join(map(str, sizes))}-block segments")
    if c["micro_batches"] > 1:
        parts.append(f"{c['micro_batches']} micro-batches of {BATCH // c['micro_batches']}")
    return "; ".join(parts) or "none"


def markdown(report: dict[str, Any]) -> str:
    """The tables of ``joint_plan.md``."""
    lines = [
        "# The joint plan on Lite0's transfer benchmark (issue 38, item 7)",
        "",
        report["description"],
        "",
        "## The measured methods, without and with execution choices",
        "",
        "| method | test acc % | total MB without | peak MB without | total MB, recomputation alone (peak, FLOP "
        "overhead) | total MB with | peak MB with | FLOP overhead | execution choice |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in sorted(report["methods"], key=lambda r: r["without"]["total_bytes"]):
        w, b, o = r["without"], r["with"], r["recompute only"]
        alone = f"{_mb(o['total_bytes'])} ({_mb(o['peak_bytes'])}, {100 * o['flop_overhead']:.1f}%)"
        lines.append(
            f"| {r['name']} | {r['accuracy']:.2f} ± {r['ci']:.2f} | {_mb(w['total_bytes'])} | {_mb(w['peak_bytes'])} "
            f"| {alone} | {_mb(b['total_bytes'])} | {_mb(b['peak_bytes'])} | {100 * b['flop_overhead']:.1f}% "
            f"| {_choice(b)} |"
        )
    lines += ["", "## Best measured accuracy per budget (total memory)", ""]
    lines += [
        "| budget | without: method | acc % | total MB | with: method | acc % | total MB | peak MB | FLOP overhead |"
    ]
    lines += ["|---:|---|---:|---:|---|---:|---:|---:|---:|"]
    for b in report["budgets"]:
        w, x = b["without"], b["with"]
        left = f"{w['name']} | {w['accuracy']:.2f} | {_mb(w['without']['total_bytes'])}" if w else "- | - | -"
        right = (
            f"{x['name']} | {x['accuracy']:.2f} | {_mb(x['with']['total_bytes'])} | {_mb(x['with']['peak_bytes'])} | "
            f"{100 * x['with']['flop_overhead']:.1f}%"
            if x
            else "- | - | - | - | -"
        )
        lines.append(f"| {_mb(b['budget_bytes'])} MB | {left} | {right} |")
    lines += ["", "## The search over the contribution profile (summed Δacc), recomputation chosen jointly", ""]
    lines += [
        "| budget | update alone: summed Δacc | total MB | joint: summed Δacc | total MB | peak MB | FLOP overhead |"
    ]
    lines += ["|---:|---:|---:|---:|---:|---:|---:|"]
    for s in report["search"]:
        w, x = s["without"], s["with"]
        left = f"{w['summed_delta_acc']:.2f} | {_mb(w['total_bytes'])}" if w else "- | -"
        right = (
            f"{x['summed_delta_acc']:.2f} | {_mb(x['total_bytes'])} | {_mb(x['peak_bytes'])} | "
            f"{100 * x['flop_overhead']:.1f}%"
            if x
            else "- | - | - | -"
        )
        lines.append(f"| {_mb(s['budget_bytes'])} MB | {left} | {right} |")
    lines += ["", "## Verdicts", "", *(f"- {v}" for v in report["verdicts"])]
    if report["skipped"]:
        lines += ["", "Rows left out: " + "; ".join(report["skipped"])]
    return "\n".join(lines) + "\n"


def _dominance(budgets: list[dict[str, Any]], key: str, what: str) -> str:
    """Whether the front ``key`` has at every budget at least the measured accuracy of the front
    without execution choices, and where more."""
    acc = lambda b, k: b[k]["accuracy"] if b[k] else 0.0  # noqa: E731
    dominates = all(acc(b, key) >= acc(b, "without") for b in budgets)
    better = [b for b in budgets if acc(b, key) > acc(b, "without")]
    return (
        f"the front {what} {'dominates' if dominates else 'does NOT dominate'} the front without: at "
        f"{'every budget at least the same' if dominates else 'some budget a lower'} measured accuracy, higher at "
        f"{len(better)} of {len(budgets)} ({', '.join(_mb(b['budget_bytes']) + ' MB' for b in better) or 'none'})"
    )


def verdicts(methods: list[dict[str, Any]], budgets: list[dict[str, Any]]) -> list[str]:
    """Whether the fronts with execution choices dominate, and full fine-tuning's accuracy at 1/3 of
    its memory."""
    out = [
        _dominance(budgets, "with", "with execution choices (recomputation and micro-batching)"),
        _dominance(budgets, "recompute only", "with recomputation alone"),
    ]
    full = next((r for r in methods if r["name"] == "full fine-tuning"), None)
    if full is not None:
        w, x = full["without"], full["with"]
        ratio = x["total_bytes"] / w["total_bytes"]
        out.append(
            f"full fine-tuning's measured accuracy ({full['accuracy']:.2f}%) at {_mb(x['total_bytes'])} MB total "
            f"({ratio:.3f}x its {_mb(w['total_bytes'])} MB; {'<=' if ratio <= 1 / 3 else '>'} 1/3), peak "
            f"{_mb(x['peak_bytes'])} MB (without: {_mb(w['peak_bytes'])} MB); FLOP overhead "
            f"{100 * x['flop_overhead']:.1f}% of the step's conv / linear / matmul FLOPs ({_choice(x)})"
        )
    return out


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    for key, style, label in (
        ("without", "o--", "without execution choices"),
        ("recompute only", "^:", "with recomputation alone"),
        ("with", "s-", "with recomputation and micro-batching"),
    ):
        pts = front(report["methods"], key)
        xs, ys = [r[key]["total_bytes"] / 1e6 for r in pts], [r["accuracy"] for r in pts]
        left.plot(xs, ys, style, drawstyle="steps-post", label=f"front {label}")
    left.scatter(
        [r["without"]["total_bytes"] / 1e6 for r in report["methods"]],
        [r["accuracy"] for r in report["methods"]],
        s=10,
        alpha=0.4,
        label="every method, without",
    )
    for r in front(report["methods"], "with"):
        left.annotate(r["name"], (r["with"]["total_bytes"] / 1e6, r["accuracy"]), fontsize=7)
    left.set_xscale("log")
    left.set(xlabel="total memory, MB (applied, batch 32, Adam)", ylabel="measured test accuracy, %")
    left.set_title("Lite0 -> Fashion-MNIST: measured methods")
    left.legend(fontsize=8)
    for key, style in (("without", "o--"), ("with", "s-")):
        pts = [(s["budget_bytes"] / 1e6, s[key]["summed_delta_acc"]) for s in report["search"] if s[key]]
        right.plot(
            *zip(*pts), style, drawstyle="steps-post", label=f"{'update alone' if key == 'without' else 'joint'}"
        )
    right.set(xlabel="budget, MB (total)", ylabel="summed Δacc of the profile, points")
    right.set_title("memplan search, exact: the update alone vs jointly with recomputation")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--transfer", default=str(HERE / "transfer_results" / "transfer.json"))
    p.add_argument("--profile", default=str(shipped("profiles", "efficientnet-lite0-fashion-mnist.json")))
    p.add_argument("--out", default=str(HERE / "joint_results"))
    p.add_argument("--sizes", type=int, default=4, help="longest recomputed segment, blocks (measured methods)")
    p.add_argument("--search-sizes", type=int, default=2, help="longest recomputed segment, blocks (the search)")
    p.add_argument("--micro-batches", type=lambda t: [int(x) for x in t.split(",")], default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--max-overhead", type=float, default=None, help="most recomputed FLOPs / step FLOPs")
    a = p.parse_args(argv)
    graphs = Graphs()
    try:
        methods, skipped = measured_rows(a, graphs)
        search = searched(a, graphs)
    except (MemplanError, OSError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    budgets = [
        {"budget_bytes": b, **{k: best_at(methods, b, k) for k in ("without", "recompute only", "with")}}
        for b in map(parse_bytes, BUDGETS)
    ]
    report = {
        "description": (
            f"{MODEL} -> Fashion-MNIST at {RESOLUTION} px, batch {BATCH}, {OPTIMIZER}: measured test accuracy from "
            f"{Path(a.transfer).name} (no new training: execution choices change neither what trains nor the "
            f"gradients); memory from memplan's {MODE} mode (total = weights + gradients + optimizer state + saved "
            "activations; peak = the simulated step's), FLOPs = 2 x MACs of conv / linear / matmul. Execution "
            f"choices: recomputed segments of 1 to {a.sizes} blocks from any block on; micro-batches "
            f"{a.micro_batches} where every norm runs in eval mode"
            + (f"; recomputation at most {a.max_overhead:.0%} of the step's FLOPs" if a.max_overhead else "")
            + ". Profile of the search: "
            + Path(a.profile).name
        ),
        "methods": methods,
        "budgets": budgets,
        "search": search,
        "skipped": skipped,
        "verdicts": verdicts(methods, budgets),
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "joint_plan.json", json.dumps(report, indent=1) + "\n")
    write_text(out / "joint_plan.md", markdown(report))
    plot(report, out / "joint_plan.png")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
