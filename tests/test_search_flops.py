"""Search under a memory AND a backward-FLOPs budget (``--flops-budget``).

Truth here is independent of the search: every candidate of a small space enumerated with its
memory and backward FLOPs from ``compute()`` directly (brute force), an independent MILP with two
budget rows on MCUNet, ``compute()`` re-run on what the methods return, and
``torch.utils.flop_counter.FlopCounterMode`` on a real backward of the applied scheme (a model
without grouped convs: torch's grouped-conv backward formula over-counts by the group factor).
Contribution profiles are SYNTHETIC (``tests.test_search.synthetic_profile``).
"""

from __future__ import annotations

import itertools
import json
import math
import random

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import memplan
from memplan.accounting.engine import compute
from memplan.api import capture
from memplan.apply import apply_scheme
from memplan.cli import main
from memplan.errors import BadOption
from memplan.modes import get_mode
from memplan.plan import Scheme, load_scheme, scheme_to_plan
from memplan.search import BudgetError, run_search
from memplan.search.evolution import evolve
from memplan.search.exact import solve_exact
from memplan.search.memory import MemoryModel, build_table, check_additivity, probe_candidates
from memplan.search.random_search import random_search
from memplan.search.space import Candidate, build_space, contributions_of
from memplan.search.toolbox import Problem, make_toolbox, seeded
from memplan.units import parse_flops

from .test_search import milp_optimum, synthetic_profile

torch.set_num_threads(1)

SHAPE = (3, 8, 8)


class PlainNet(nn.Module):
    """No grouped convs: c0 3->8 3x3 + BN + ReLU, c1 8->16 1x1 + BN + ReLU, c2 16->16 3x3 + BN +
    ReLU, c3 16->8 1x1 with its own bias, global pool, fc 8->classes."""

    def __init__(self, classes: int = 4):
        super().__init__()
        self.c0, self.b0 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.c1, self.b1 = nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16)
        self.c2, self.b2 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.c3 = nn.Conv2d(16, 8, 1)
        self.fc = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.b0(self.c0(x)))
        x = F.relu(self.b1(self.c1(x)))
        x = F.relu(self.b2(self.c2(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.c3(x), 1), 1))


@pytest.fixture(scope="module")
def small():
    """PlainNet: its synthetic profile (weight entries for c1..c3: C_in 8, 16, 16, so every
    ratio selects whole channels), space, memory model and both tables, and every candidate with
    its memory and backward FLOPs from compute() itself."""
    torch.manual_seed(0)
    graph = capture(PlainNet(), input_shape=SHAPE).graph
    profile = synthetic_profile(graph, seed=4, layers=3, classes=4)
    space = build_space(graph, contributions_of(profile), model="plainnet")
    memory = MemoryModel(space, "tinytraining")
    table, ftable = build_table(memory), build_table(memory, memory.flops)
    mode = get_mode("tinytraining")
    truth = {}
    for k in space.ks:
        layers = [c for c in space.layers if c.conv_index >= space.first(k)]
        for choice in itertools.product(*[(None, *c.ratios) for c in layers]):
            cand = Candidate(k, tuple((c.conv_index, r) for c, r in zip(layers, choice) if r is not None))
            totals = compute(graph, space.to_plan(cand), mode).totals
            truth[cand] = (totals.total_bytes, totals.backward_flops)
    return graph, profile, space, memory, table, ftable, truth


@pytest.fixture(scope="module")
def mcunet():
    cap = capture("mcunet-5fps", resolution=128, classes=10)
    profile = synthetic_profile(cap.graph)
    space = build_space(cap.graph, contributions_of(profile), model=cap.name)
    memory = MemoryModel(space, "tinytraining")
    return cap, profile, space, memory, build_table(memory), build_table(memory, memory.flops)


# ------------------------------------------------------------------ units


@pytest.mark.parametrize(
    ("text", "flops"),
    [
        ("5MFLOPs", 5_000_000),
        ("5 MFLOP", 5_000_000),
        ("2.5e6", 2_500_000),
        ("1G", 10**9),
        ("1.5 GFLOPs", 1_500_000_000),
        ("300k", 300_000),
        ("2T", 2 * 10**12),
        ("12", 12),
        (7, 7),
    ],
)
def test_parse_flops(text, flops):
    assert parse_flops(text) == flops


@pytest.mark.parametrize("text", ["abc", "5XFLOPs", "-1M", "0", "1e999", "5MB", "flops"])
def test_parse_flops_refuses(text):
    with pytest.raises(BadOption):
        parse_flops(text)


# ------------------------------------------------------------------ additivity and the exact solver


def test_backward_flops_are_additive_on_every_candidate(small):
    """The FLOPs table (base[k] + extra[(i, r)]) equals compute() on the whole space, and the
    probe check the search runs says so."""
    _, _, space, memory, _, ftable, truth = small
    assert all(ftable.estimate(c) == flops for c, (_, flops) in truth.items())
    check = check_additivity(memory, ftable, probe_candidates(space), memory.flops)
    assert check.additive and check.checked > 5


def _budget_grid(values: list[int], n: int) -> list[int]:
    v = sorted(set(values))
    return [v[i] for i in np.linspace(0, len(v) - 1, n).astype(int)] + [10**12]


def test_exact_matches_brute_force_under_both_budgets(small):
    """Every (memory, FLOPs) budget pair of a grid: the exact optimum equals the best value among
    the enumerated candidates that fit both (costs from compute()), and what it returns fits both."""
    _, _, space, _, table, ftable, truth = small
    mems = _budget_grid([m for m, _ in truth.values()], 9)
    flops = _budget_grid([f for _, f in truth.values()], 9)
    checked = binding = 0
    for budget, fbudget in itertools.product(mems, flops):
        feasible = [c for c, (m, f) in truth.items() if m <= budget and f <= fbudget]
        if not feasible:
            assert solve_exact(space, table, budget, ftable, fbudget) is None
            continue
        best = max(space.value(c) for c in feasible)
        ex = solve_exact(space, table, budget, ftable, fbudget)
        assert ex.value == pytest.approx(best, abs=1e-9), (budget, fbudget)
        m, f = truth[ex.candidate]
        assert m <= budget and f <= fbudget and (ex.estimate, ex.flops_estimate) == (m, f)
        memory_only = max(space.value(c) for c, (m, _) in truth.items() if m <= budget)
        binding += best < memory_only - 1e-9
        checked += 1
    assert checked > 40 and binding > 5  # the FLOPs budget decided the answer in many cases


def test_exact_matches_brute_force_with_a_cap(small):
    graph, profile, _, _, _, _, truth = small
    space = build_space(graph, contributions_of(profile), model="plainnet", max_weight_layers=1)
    memory = MemoryModel(space, "tinytraining")
    table, ftable = build_table(memory), build_table(memory, memory.flops)
    fl = sorted({f for _, f in truth.values()})
    for fbudget in fl[:: max(1, len(fl) // 12)]:
        fits = [c for c, (m, f) in truth.items() if f <= fbudget and len(c.weights) <= 1]
        ex = solve_exact(space, table, 10**9, ftable, fbudget)
        assert ex.value == pytest.approx(max(space.value(c) for c in fits), abs=1e-9)
        assert len(ex.candidate.weights) <= 1 and truth[ex.candidate][1] <= fbudget


def test_exact_matches_milp_on_mcunet(mcunet):
    cap, _, space, memory, table, ftable = mcunet
    mode = get_mode("tinytraining")
    for budget, fbudget in ((100_000, 5_000_000), (150_000, 12_000_000), (400_000, 30_000_000), (60_000, 10**12)):
        ex = solve_exact(space, table, budget, ftable, fbudget)
        assert ex.value == pytest.approx(milp_optimum(space, table, budget, (ftable, fbudget)), abs=1e-6)
        totals = compute(cap.graph, space.to_plan(ex.candidate), mode).totals
        assert totals.total_bytes <= budget and totals.backward_flops <= fbudget


def test_unbinding_flops_budget_changes_nothing(mcunet):
    """A FLOPs budget no candidate reaches: the two-budget DP returns the memory-only optimum."""
    _, _, space, _, table, ftable = mcunet
    for budget in (table.base[0], 50_000, 100_000, 250_000):
        one, two = solve_exact(space, table, budget), solve_exact(space, table, budget, ftable, 10**15)
        assert (two.candidate, two.value, two.estimate) == (one.candidate, one.value, one.estimate)


# ------------------------------------------------------------------ DEAP and random search


def test_repair_evolution_and_random_respect_both_budgets(mcunet):
    cap, _, space, memory, table, ftable = mcunet
    budget, fbudget = 150_000, 8_000_000
    problem = Problem(space, table, budget, table.estimate, True, ftable, fbudget, ftable.estimate)
    tb = make_toolbox(problem)
    with seeded(2):
        for _ in range(200):
            ind = tb.init()
            ind[0] = random.randrange(len(space.ks))
            cand = problem.decode(tb.repair(ind))
            assert table.estimate(cand) <= budget and ftable.estimate(cand) <= fbudget
            assert tb.evaluate(ind)[0] == pytest.approx(space.value(cand))
    exact = solve_exact(space, table, budget, ftable, fbudget).value
    mode = get_mode("tinytraining")
    evo = evolve(problem, tb, population=16, generations=6, seed=3)
    rnd = random_search(problem, make_toolbox(problem), evaluations=evo.evaluations, seed=3)
    for trace in (evo, rnd):
        totals = compute(cap.graph, space.to_plan(trace.best), mode).totals
        assert totals.total_bytes <= budget and totals.backward_flops <= fbudget
        assert trace.value <= exact + 1e-9
    # the FLOPs budget binds: the memory-only optimum does not fit it
    assert ftable.estimate(solve_exact(space, table, budget).candidate) > fbudget


def test_run_search_each_method_fits_both_budgets(small):
    graph, profile, space, _, table, ftable, truth = small
    budget = max(m for m, _ in truth.values())  # memory never binds: FLOPs decide
    fbudget = sorted({f for _, f in truth.values()})[len({f for _, f in truth.values()}) // 3]
    best = max(space.value(c) for c, (m, f) in truth.items() if f <= fbudget)
    for method in ("exact", "evolution", "random"):
        r = run_search(
            PlainNet(), budget, profile=profile, input_shape=SHAPE, method=method, generations=4, population=8,
            flops_budget=fbudget,
        )  # fmt: skip
        cand = Candidate(r.scheme.bias_update, tuple((w.conv_index, w.ratio) for w in r.scheme.weight_updates))
        assert truth[cand] == (r.memory_bytes, r.backward_flops)
        assert r.memory_bytes <= budget and r.backward_flops <= fbudget == r.flops_budget
        assert r.objective_value <= best + 1e-9
        if method == "exact":
            assert r.objective_value == pytest.approx(best, abs=1e-9)


def test_non_additive_memory_with_flops_budget_uses_compute():
    """Peak memory of the ideal mode is not additive: evolution runs with compute() for memory
    and backward FLOPs, and its scheme fits both when re-profiled."""
    graph = capture(PlainNet(), input_shape=SHAPE).graph
    profile = synthetic_profile(graph, seed=1, layers=3, classes=4)
    space = build_space(graph, contributions_of(profile), model="plainnet")
    memory = MemoryModel(space, "ideal", "peak")
    table, ftable = build_table(memory), build_table(memory, memory.flops)
    budget = (table.base[0] + table.base[space.ks[-1]]) // 2 + 64
    fbudget = (ftable.base[0] + ftable.base[space.ks[-1]]) // 3
    r = run_search(
        PlainNet(), budget, profile=profile, input_shape=SHAPE, mode="ideal", metric="peak",
        generations=3, population=8, flops_budget=fbudget,
    )  # fmt: skip
    assert r.method == "evolution" and not r.additive and r.additivity.flops is not None
    totals = compute(graph, scheme_to_plan(graph, r.scheme), get_mode("ideal")).totals
    assert totals.peak_bytes == r.memory_bytes <= budget and totals.backward_flops == r.backward_flops <= fbudget


# ------------------------------------------------------------------ no FLOPs budget, errors


def test_no_flops_budget_is_the_memory_only_search(mcunet, tmp_path):
    """Without a FLOPs budget: the memory-only answer (the 1-D DP, independently checked in
    test_search.py), nothing about FLOPs in the scheme, and old schemes load unchanged."""
    _, profile, space, _, table, _ = mcunet
    out = tmp_path / "s.json"
    r = run_search("mcunet-5fps", "100KB", profile=profile, classes=10, out=out)
    ex = solve_exact(space, table, 100_000)
    assert r.scheme.bias_update == ex.candidate.k and r.objective_value == pytest.approx(ex.value)
    assert r.flops_budget is None and r.additivity.flops is None and r.flops_table is None
    data = json.loads(out.read_text())
    assert data["flops_budget"] is None and "backward_flops" not in data["predicted"]
    del data["flops_budget"]  # a scheme written before the field
    assert Scheme.model_validate(data) == load_scheme(out)


def test_flops_budget_below_the_minimum_is_refused(mcunet):
    _, profile, space, memory, _, ftable = mcunet
    floor = memory.flops(Candidate(0))  # classifier only, from compute()
    with pytest.raises(BudgetError, match="below the classifier-only backward FLOPs"):
        run_search("mcunet-5fps", "100KB", profile=profile, classes=10, flops_budget=floor - 1)
    r = run_search("mcunet-5fps", "100KB", profile=profile, classes=10, flops_budget=floor)
    assert r.scheme.bias_update == 0 and not r.scheme.weight_updates and r.backward_flops == floor
    data = json.loads(json.dumps(r.to_dict()))
    assert data["flops_budget"] == floor and data["additivity"]["flops"]["additive"]
    assert data["flops_table"]["base"]["0"] == floor


@pytest.mark.parametrize(
    ("flops", "needle"), [("abc", "cannot read"), ("5XFLOPs", "unknown FLOP unit"), ("10", "classifier-only")]
)
def test_cli_bad_flops_budget_is_one_line_exit_2(flops, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["search", "mcunet-5fps", "--budget", "100KB", "--flops-budget", flops])
    cap = capsys.readouterr()
    lines = [line for line in cap.err.splitlines() if line.strip()]
    assert exc.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: ")
    assert needle.lower() in lines[0].lower() and "Traceback" not in cap.err + cap.out


def test_cli_prints_flops(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["search", "mcunet-5fps", "--budget", "100KB", "--flops-budget", "5MFLOPs"])
    out = capsys.readouterr().out
    assert exc.value.code == 0
    assert "FLOPs budget 5,000,000 FLOPs" in out and "backward FLOPs (2 x MACs)" in out


# ------------------------------------------------------------------ against a real backward


def _measured_backward(model: nn.Module, classes: int = 4) -> tuple[int, int]:
    """(FlopCounterMode's backward FLOPs, bias-gradient elements of conv / linear): one real step."""
    bias_elems = []
    hooks = [
        m.register_forward_hook(lambda _m, _i, y: bias_elems.append(y.numel()))
        for m in model.modules()
        if getattr(m, "memplan_kind", None) in ("conv", "linear") or isinstance(m, (nn.Conv2d, nn.Linear))
        if isinstance(getattr(m, "bias", None), torch.Tensor) and m.bias.requires_grad
    ]
    x, y = torch.randn(1, *SHAPE), torch.randint(0, classes, (1,))
    loss = F.cross_entropy(model(x), y)
    for h in hooks:
        h.remove()
    with FlopCounterMode(display=False) as counter:
        loss.backward()
    return counter.get_total_flops(), sum(bias_elems)


def test_reported_flops_equal_flop_counter_on_the_applied_scheme(small, tmp_path):
    """The result's backward FLOPs = FlopCounterMode's count of a real backward of PlainNet with
    the scheme applied (sub-channel weight gradients run over the selected channels only) + one
    FLOP per output element of each conv / linear whose bias trains (a reduction, which
    FlopCounterMode does not count); and = memplan.profile of the written scheme."""
    _, profile, _, _, _, _, truth = small
    fl = sorted({f for _, f in truth.values()})
    seen = set()
    for fbudget in (fl[len(fl) // 4], fl[len(fl) // 2], fl[-1]):
        out = tmp_path / f"s{fbudget}.json"
        r = run_search(PlainNet(), 10**9, profile=profile, input_shape=SHAPE, flops_budget=fbudget, out=out)
        seen.add((r.scheme.bias_update, len(r.scheme.weight_updates)))
        torch.manual_seed(0)
        model = apply_scheme(PlainNet(), load_scheme(out))
        counted, bias = _measured_backward(model)
        assert r.backward_flops == counted + bias <= fbudget
        assert r.scheme.predicted["backward_flops"] == r.backward_flops and r.scheme.flops_budget == fbudget
        prof = memplan.profile(PlainNet(), method="sparse", scheme=str(out), input_shape=SHAPE, mode="tinytraining")
        assert prof.totals.backward_flops == r.backward_flops
    assert len(seen) == 3 and not math.isnan(counted)
