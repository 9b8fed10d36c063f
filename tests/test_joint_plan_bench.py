"""benchmarks/joint_plan.py (issue 38, item 7), cheaply: the transfer rows it rebuilds cost what the
transfer benchmark recorded (an earlier, independent run), full fine-tuning with recomputed segments
needs at most a third of that, and the fronts it compares are built right."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from .helpers import load_benchmark

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
bench = load_benchmark("joint_plan")


def _rows() -> dict[str, dict]:
    data = json.loads((ROOT / "benchmarks" / "transfer_results" / "transfer.json").read_text())
    return {r["name"]: r for r in data["rows"]}


def test_rebuilt_rows_cost_what_the_benchmark_recorded_and_full_fits_a_third():
    graphs = bench.Graphs()
    rows = _rows()
    for name in ("validated 30MB", "MobileTL", "norm + bias, running statistics"):
        plan_at = lambda g, row=rows[name]: bench.plan_of(row, g)  # noqa: E731
        assert bench.cost(graphs, None, plan_at, 1, ()).total == rows[name]["memory_bytes"]
    a = argparse.Namespace(sizes=2, micro_batches=[1], max_overhead=None)
    full = lambda g: bench.plan_of(rows["full fine-tuning"], g)  # noqa: E731
    base, recomputed, best = bench.best_execution(graphs, None, full, a)
    assert base.total == rows["full fine-tuning"]["memory_bytes"]
    assert best.micro_batches == 1  # its norms use batch statistics: never micro-batched
    assert 3 * recomputed.total <= base.total and recomputed.segments and 0 < recomputed.overhead < 1


def test_fronts_and_verdicts():
    rows = [
        {"name": "a", "accuracy": 80.0, "without": {"total_bytes": 10}, "with": {"total_bytes": 5}},
        {"name": "b", "accuracy": 79.0, "without": {"total_bytes": 20}, "with": {"total_bytes": 4}},
        {"name": "c", "accuracy": 90.0, "without": {"total_bytes": 100}, "with": {"total_bytes": 30}},
    ]
    assert [r["name"] for r in bench.front(rows, "without")] == ["a", "c"]
    assert [r["name"] for r in bench.front(rows, "with")] == ["b", "a", "c"]
    budgets = [{"budget_bytes": b, **{k: bench.best_at(rows, b, k) for k in ("without", "with")}} for b in (6, 40)]
    assert budgets[0]["without"] is None and budgets[1]["with"]["name"] == "c"
    assert "dominates" in bench._dominance(budgets, "with", "x") and "higher at 2 of 2" in bench._dominance(
        budgets, "with", "x"
    )


def test_committed_results_meet_the_acceptance():
    report = json.loads((ROOT / "benchmarks" / "joint_results" / "joint_plan.json").read_text())
    assert not report["skipped"]
    assert all(" dominates " in v for v in report["verdicts"][:2])
    full = next(r for r in report["methods"] if r["name"] == "full fine-tuning")
    assert 3 * full["with"]["total_bytes"] <= full["without"]["total_bytes"]
