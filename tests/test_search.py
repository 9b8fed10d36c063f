"""Sparse-update search: exact optimum against brute force (memory from compute()) and against an
independent MILP (scipy.optimize.milp), every written scheme within its budget when re-profiled
through the public API, the paper's 100KB scheme under the table, DEAP operators, budgets,
devices, errors.

The contribution profiles here are SYNTHETIC (made-up Δacc with the paper's qualitative shape:
gains grow with depth and ratio, pw1 convs gain most); they test the search, not the models.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.optimize import Bounds, LinearConstraint, milp

import memplan
from memplan.accounting.devices import DEVICES_DIR, device_names, load_device
from memplan.accounting.engine import compute
from memplan.api import capture
from memplan.contrib import ContribProfile, Protocol
from memplan.contrib.profile import Noise
from memplan.errors import MemplanError
from memplan.graph import conv_layers, conv_table, is_pw1
from memplan.modes import get_mode
from memplan.plan import fingerprint, load_scheme, scheme_to_plan
from memplan.render.figures import plot_search
from memplan.search import BudgetError, budget_convention, run_search
from memplan.search.evolution import evolve
from memplan.search.exact import solve_exact
from memplan.search.memory import MemoryModel, build_table, check_additivity, probe_candidates
from memplan.search.random_search import random_search
from memplan.search.space import Candidate, ProfileError, build_space, contributions_of, load_contributions
from memplan.search.toolbox import Problem, make_toolbox, seeded

from .test_scheme import SmallNet

torch.set_num_threads(1)


def synthetic_profile(
    graph, seed: int = 0, layers: int | None = None, max_k: int | None = None, classes: int = 10
) -> ContribProfile:
    """A SYNTHETIC contribution profile (not measured): Δacc in points, quantised to 0.04
    (one test image in 2,500), bias gains saturating in k, weight gains growing with depth and
    ratio, largest for pw1 convs, small noise. ``layers``: weight entries for the last N convs
    only; ``max_k``: bias depths up to that k only."""
    rng = random.Random(seed)
    convs = conv_layers(graph)
    n = len(convs)
    q = lambda x: round(round(x / 0.04) * 0.04, 6)  # noqa: E731
    bias = {k: q(12 * (1 - math.exp(-k / 5)) + rng.uniform(-0.3, 0.3)) for k in range(1, (max_k or n) + 1)}
    weight = {}
    for i, c in enumerate(convs[-(layers or n) :]):
        pos = (n - (layers or n) + i + 1) / n
        peak = (3.0 if is_pw1(c) else 0.8) * pos**1.5
        weight[c.name] = {
            r: q(peak * (1 - math.exp(-4 * r)) / (1 - math.exp(-4)) + rng.uniform(-0.1, 0.1))
            for r in (0.125, 0.25, 0.5, 1.0)
        }
    layer_rows = conv_table(graph)
    return ContribProfile(
        model=graph.model_name,
        fingerprint=fingerprint(graph),
        input_shape=list(graph.input_shape[1:]),
        weights={"source": "SYNTHETIC (tests/test_search.py)"},
        dataset={"name": "synthetic", "classes": classes},
        protocol=Protocol(),
        description="SYNTHETIC: made-up Δacc for testing the search; nothing was measured",
        probe_accuracy=0.0,
        layers=layer_rows,
        bias=bias,
        bias_std={k: 0.0 for k in bias},
        weight=weight,
        weight_std={name: {r: 0.0 for r in row} for name, row in weight.items()},
        noise=Noise(accuracy_std=0.0, delta_std=0.0, seeds=1),
        runs=[],
        timing={},
    )


@pytest.fixture(scope="module")
def mcunet():
    """MCUNet-5FPS at 128 px, 10 classes, its synthetic profile, space, memory model and table."""
    cap = capture("mcunet-5fps", resolution=128, classes=10)
    profile = synthetic_profile(cap.graph)
    space = build_space(cap.graph, contributions_of(profile), model=cap.name)
    memory = MemoryModel(space, "tinytraining")
    return cap, profile, space, memory, build_table(memory)


def milp_optimum(space, table, budget: int, *more: tuple) -> float:
    """Eq. 5 as one MILP (k one-hot, binary options, "in range" and budget constraints): an
    independent formulation of what the DP solves. ``more``: further (table, budget) rows, e.g.
    the backward-FLOPs table and its budget."""
    ks, opts = list(space.ks), [(c.conv_index, r, g) for c in space.layers for r, g in zip(c.ratios, c.gains)]
    nk, no = len(ks), len(opts)
    c = -np.array([space.bias_gain[k] for k in ks] + [g for _, _, g in opts])
    rows, lo, hi = [], [], []
    rows.append([1] * nk + [0] * no)
    lo.append(1)
    hi.append(1)
    for tab, cap in ((table, budget), *more):
        rows.append([tab.base[k] for k in ks] + [tab.extra[(i, r)] for i, r, _ in opts])
        lo.append(-np.inf)
        hi.append(cap)
    for layer in space.layers:  # at most one ratio, and only if depth k reaches the layer
        row = [-1 if space.first(k) <= layer.conv_index else 0 for k in ks] + [
            1 if i == layer.conv_index else 0 for i, _, _ in opts
        ]
        rows.append(row)
        lo.append(-np.inf)
        hi.append(0)
    res = milp(
        c,
        constraints=LinearConstraint(np.array(rows, dtype=float), lo, hi),
        integrality=np.ones(nk + no),
        bounds=Bounds(0, 1),
        options={"mip_rel_gap": 0},
    )
    assert res.status == 0
    return -res.fun


# ------------------------------------------------------------------ exact solver


def test_exact_matches_brute_force_with_compute_memory():
    """Tiny space on SmallNet: enumerate every candidate, memory from compute() directly."""
    graph = capture(SmallNet(), input_shape=(3, 8, 8)).graph
    profile = synthetic_profile(graph, seed=3)
    space = build_space(graph, contributions_of(profile), model="smallnet", ratios=(0.5, 1.0))
    memory = MemoryModel(space, "tinytraining")
    table = build_table(memory)
    mode = get_mode("tinytraining")
    cands = []
    for k in space.ks:
        layers = [c for c in space.layers if c.conv_index >= space.first(k)]
        for choice in itertools.product(*[(None, *c.ratios) for c in layers]):
            cands.append(Candidate(k, tuple((c.conv_index, r) for c, r in zip(layers, choice) if r is not None)))
    mem = {c: compute(graph, space.to_plan(c), mode).totals.total_bytes for c in cands}
    for budget in sorted({mem[c] for c in cands})[:: max(1, len(cands) // 25)] + [10**9]:
        best = max(space.value(c) for c in cands if mem[c] <= budget)
        ex = solve_exact(space, table, budget)
        assert ex.value == pytest.approx(best, abs=1e-9)
        assert mem[ex.candidate] <= budget


def test_exact_matches_milp_on_mcunet(mcunet):
    _, _, space, _, table = mcunet
    for budget in (table.base[0], 30_000, 50_000, 100_000, 150_000, 400_000, 10**9):
        ex = solve_exact(space, table, budget)
        assert ex.value == pytest.approx(milp_optimum(space, table, budget), abs=1e-6)
        assert ex.estimate <= budget


def test_exact_respects_cap_and_pw1(mcunet):
    cap, profile, _, _, _ = mcunet
    space = build_space(cap.graph, contributions_of(profile), pw1_only=True, max_weight_layers=3, ratios=(0.25, 1.0))
    table = build_table(MemoryModel(space, "tinytraining"))
    ex = solve_exact(space, table, 120_000)
    convs = conv_layers(cap.graph)
    assert len(ex.candidate.weights) <= 3
    assert all(is_pw1(convs[i]) and r in (0.25, 1.0) for i, r in ex.candidate.weights)
    # brute force over the pw1 layers in range of the chosen k and of every k: nothing better under the cap
    best = -math.inf
    for k in space.ks:
        layers = [c for c in space.layers if c.conv_index >= space.first(k)]
        for n in range(4):
            for subset in itertools.combinations(layers, n):
                for ratios in itertools.product(*[c.ratios for c in subset]):
                    cand = Candidate(k, tuple((c.conv_index, r) for c, r in zip(subset, ratios)))
                    if table.estimate(cand) <= 120_000:
                        best = max(best, space.value(cand))
    assert ex.value == pytest.approx(best)


# ------------------------------------------------------------------ memory under memplan's cost model


def test_paper_100kb_scheme_under_the_table(mcunet):
    """accounting.md §4: MCUNet-5FPS, n_bias_update 22, weights of convs 21, 24, 27, 30, 36, 39 at
    1, 1, 1, 1, 1/8, 1/4 -> 99.8 KiB (published)."""
    _, _, space, memory, table = mcunet
    cand = Candidate(22, ((21, 1.0), (24, 1.0), (27, 1.0), (30, 1.0), (36, 0.125), (39, 0.25)))
    assert table.estimate(cand) / 1024 == pytest.approx(99.8, abs=0.05)
    assert table.estimate(cand) == memory.measure(cand)


def test_tinytraining_is_additive(mcunet):
    _, _, space, memory, table = mcunet
    result = check_additivity(memory, table, probe_candidates(space, n_random=10, seed=5))
    assert result.additive and result.checked > 40


def test_every_scheme_fits_its_budget_under_compute(mcunet):
    """Many random budgets: exact and evolutionary schemes re-profiled from scratch with compute()."""
    cap, _, space, memory, table = mcunet
    mode = get_mode("tinytraining")
    rng = random.Random(0)
    floor = table.base[0]
    budgets = [floor, floor + 1] + [rng.randint(floor, 400_000) for _ in range(40)]
    problem_tb = {}
    for i, budget in enumerate(budgets):
        scheme = space.to_scheme(solve_exact(space, table, budget).candidate)
        assert compute(cap.graph, scheme_to_plan(cap.graph, scheme), mode).totals.total_bytes <= budget
        if i % 8 == 0:
            problem = Problem(space, table, budget, table.estimate, True)
            problem_tb[budget] = trace = evolve(problem, make_toolbox(problem), population=12, generations=4, seed=i)
            scheme = space.to_scheme(trace.best)
            assert compute(cap.graph, scheme_to_plan(cap.graph, scheme), mode).totals.total_bytes <= budget


def test_run_search_writes_scheme_within_budget(mcunet, tmp_path):
    """End to end through the public API: the written scheme, profiled by memplan.profile, fits."""
    cap, profile, _, _, _ = mcunet
    out = tmp_path / "s.json"
    r = run_search("mcunet-5fps", "100KB", profile=profile, classes=10, out=out, command="test")
    assert r.method == "exact" and r.additive and r.gap_to_exact == 0
    assert r.budget_bytes == 100_000 and r.budget_convention.startswith("1000-based")
    scheme = load_scheme(out)
    assert scheme.budget_bytes == 100_000 and scheme.mode == "tinytraining"
    assert scheme.provenance.profile_hash == r.profile_hash
    prof = memplan.profile(
        "mcunet-5fps", method="sparse", scheme=str(out), mode="tinytraining", classes=10, resolution=128
    )
    assert prof.totals.total_bytes == r.memory_bytes == scheme.predicted["memory_bytes"] <= 100_000
    assert scheme.summed_delta_acc == pytest.approx(r.summed_delta_acc)


def test_non_additive_metric_uses_evolution_with_compute():
    """Peak memory of the ideal mode's simulated step is not a sum over options: the search says so,
    refuses the exact solver, and the evolutionary result fits under compute()."""
    graph = capture(SmallNet(), input_shape=(3, 8, 8)).graph
    profile = synthetic_profile(graph, seed=1)
    space = build_space(graph, contributions_of(profile), model="smallnet")
    memory = MemoryModel(space, "ideal", "peak")
    table = build_table(memory)
    assert not check_additivity(memory, table, probe_candidates(space)).additive
    budget = (table.base[0] + table.base[space.ks[-1]]) // 2 + 64
    with pytest.raises(MemplanError, match="not additive"):
        run_search(
            SmallNet(), budget, profile=profile, input_shape=(3, 8, 8), mode="ideal", metric="peak", method="exact"
        )
    r = run_search(
        SmallNet(),
        budget,
        profile=profile,
        input_shape=(3, 8, 8),
        mode="ideal",
        metric="peak",
        generations=3,
        population=8,
    )
    assert r.method == "evolution" and not r.additive and r.exact is None and r.gap_to_exact is None
    plan = scheme_to_plan(graph, r.scheme)
    assert compute(graph, plan, get_mode("ideal")).totals.peak_bytes == r.memory_bytes <= budget


# ------------------------------------------------------------------ DEAP operators and runs


def test_repair_always_fits_and_respects_the_cap(mcunet):
    cap, profile, _, _, _ = mcunet
    space = build_space(cap.graph, contributions_of(profile), max_weight_layers=4)
    table = build_table(MemoryModel(space, "tinytraining"))
    problem = Problem(space, table, 60_000, table.estimate, True)
    tb = make_toolbox(problem)
    with seeded(1):
        for _ in range(300):
            ind = tb.init()
            ind[0] = random.randrange(len(space.ks))
            cand = problem.decode(tb.repair(ind))
            assert table.estimate(cand) <= 60_000 and len(cand.weights) <= 4
            space.check(cand)
            assert tb.evaluate(ind)[0] == pytest.approx(space.value(cand))


def test_evolution_is_seeded_and_leaves_random_state(mcunet):
    _, _, space, _, table = mcunet
    problem = Problem(space, table, 100_000, table.estimate, True)
    random.seed(123)
    before = random.random()
    random.seed(123)
    a = evolve(problem, make_toolbox(problem), population=16, generations=5, seed=7)
    assert random.random() == before  # the caller's stream is untouched
    b = evolve(problem, make_toolbox(problem), population=16, generations=5, seed=7)
    assert a.best == b.best and a.best_per_evaluation == b.best_per_evaluation
    assert len(a.best_per_generation) == 6 and a.best_per_generation == sorted(a.best_per_generation)
    rs = random_search(problem, make_toolbox(problem), evaluations=a.evaluations, seed=7)
    assert rs.evaluations == a.evaluations == len(a.best_per_evaluation)
    exact = solve_exact(space, table, 100_000).value
    assert max(a.value, rs.value) <= exact + 1e-9


def test_plot_writes_both_figures(mcunet, tmp_path):
    _, profile, _, _, _ = mcunet
    r = run_search("mcunet-5fps", budget="50KiB", profile=profile, classes=10, curves=True, generations=3, population=8)
    plot_search(r, tmp_path / "f.png")
    assert r.budget_bytes == 51_200 and r.budget_convention.startswith("1024-based")
    assert r.evolution is not None and r.random is not None and r.random.evaluations == r.evolution.evaluations
    assert (tmp_path / "f.png").stat().st_size > 10_000


# ------------------------------------------------------------------ budgets, devices, errors


@pytest.mark.parametrize(
    "text,convention",
    [
        ("100KB", "1000-based"),
        ("100 kB", "1000-based"),
        ("100KiB", "1024-based"),
        ("0.1MB", "1000-based"),
        ("100000", "bytes"),
        (100000, "bytes"),
    ],
)
def test_budget_convention(text, convention):
    assert budget_convention(text).startswith(convention)


def test_infeasible_budget_is_one_line(mcunet):
    _, profile, _, _, table = mcunet
    with pytest.raises(BudgetError) as info:
        run_search("mcunet-5fps", budget=table.base[0] - 1, profile=profile, classes=10)
    text = str(info.value)
    assert "\n" not in text and "classifier-only" in text and str(table.base[0]) in text


def test_profile_for_another_model_is_refused(mcunet):
    _, profile, _, _, _ = mcunet
    with pytest.raises(ProfileError, match="another layer table"):
        run_search("mbv2-w0.35", "100KB", profile=profile)


def test_budget_xor_target(mcunet):
    with pytest.raises(MemplanError, match="either a budget or a target"):
        run_search("mcunet-5fps", budget="100KB", target="stm32f746", profile=mcunet[1])


def test_device_profiles():
    """Datasheet figures: STM32F746 320 KiB SRAM / 1 MiB flash; nRF52840 256 KiB / 1 MiB;
    Raspberry Pi 1 Model A 256 MiB; Jetson Nano 2GB 2 GiB."""
    expected = {
        "stm32f746": (320 * 1024, 1024**2),
        "nrf52840": (256 * 1024, 1024**2),
        "raspberry-pi-1-model-a": (256 * 1024**2, None),
        "jetson-nano-2gb": (2 * 1024**3, None),
    }
    assert sorted(device_names()) == sorted(expected)
    for name, (sram, flash) in expected.items():
        dev = load_device(name)
        assert (dev.sram_bytes, dev.flash_bytes) == (sram, flash)
        assert 0 < dev.budget_bytes == sram - dev.runtime_bytes  # the device's own mode models the whole step
        assert dev.budget_for("tinytraining") == sram - dev.reserve_bytes  # extra memory only: keep the reserve
        assert dev.mode == ("mcu" if flash else "pytorch")
        assert any("reserve" in n for n in dev.notes) and any("Source" in n for n in dev.notes)
        assert any("runtime_bytes" in n for n in dev.notes)
        raw = json.loads((DEVICES_DIR / f"{name}.json").read_text())
        assert set(raw) == {
            "name",
            "description",
            "sram_bytes",
            "flash_bytes",
            "reserve_bytes",
            "mode",
            "runtime_bytes",
            "notes",
        }
    with pytest.raises(MemplanError, match="unknown device"):
        load_device("esp32-made-up")


def test_device_sets_the_budget(mcunet):
    """With a device the search budgets the device's mode (stm32f746: mcu, the modelled peak SRAM
    of the Tiny Training Engine's step) against SRAM less the runtime; an explicit mode keeps its
    own convention (tinytraining: SRAM less the reserve for the forward it does not count)."""
    _, profile, _, _, _ = mcunet
    dev = load_device("stm32f746")
    r = run_search("mcunet-5fps", target="stm32f746", profile=profile, classes=10, generations=8, population=16)
    assert r.mode == "mcu" and r.method == "evolution" and not r.additive
    assert r.budget_bytes == dev.budget_bytes == dev.sram_bytes - dev.runtime_bytes and r.device.name == "stm32f746"
    assert r.memory_bytes <= r.budget_bytes
    assert r.memory_bytes == r.breakdown["peak_bytes"]  # the candidate's quick peak is compute()'s
    t = run_search("mcunet-5fps", target="stm32f746", profile=profile, classes=10, mode="tinytraining")
    assert t.budget_bytes == dev.sram_bytes - dev.reserve_bytes and t.memory_bytes <= t.budget_bytes


def test_profile_file_round_trip(mcunet, tmp_path):
    """A profile written by memplan.contrib reads back to the same search view and hash."""
    _, profile, _, _, _ = mcunet
    profile.save(tmp_path / "p.json")
    back = load_contributions(tmp_path / "p.json")
    assert back == contributions_of(profile, back.source)
    assert back.bias[3] == profile.bias[3] and back.weight == profile.weight and back.classes == 10


# ------------------------------------------------------------------ shipped artifacts

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "search").glob("*.json"))


def _profile_with_hash(profile_hash: str) -> Path:
    for path in sorted((ROOT / "profiles").glob("*.json")):
        if load_contributions(path).sha256 == profile_hash:
            return path
    raise AssertionError(f"no shipped profile has hash {profile_hash}")


@pytest.mark.skipif(not SHIPPED, reason="no shipped schemes in search/ (they need a measured profile in profiles/)")
def test_shipped_scheme_regenerates_identically():
    """The 100 KB scheme (or the first one) re-searched from its profile: identical but for the date."""
    path = next((p for p in SHIPPED if "100KB" in p.name), SHIPPED[0])
    shipped = load_scheme(path)
    profile = _profile_with_hash(shipped.provenance.profile_hash)
    again = run_search(
        shipped.model,
        shipped.budget_bytes,
        profile_path=profile,
        mode=shipped.mode,
        input_shape=shipped.input_shape,
        command=shipped.provenance.command,
        objective=shipped.provenance.objective,
    ).scheme
    drop: dict = {
        "provenance": {"date"}
        | ({"objective"} if shipped.provenance.objective is None else set())
        | ({"estimator"} if shipped.provenance.estimator is None else set())  # written before estimators
    }
    drop["schema_version"] = True  # a version 1 file means the same as version 2; searches write 2
    if shipped.optimizer is None:  # written before schemes recorded their optimizer
        drop["optimizer"] = True
    assert again.model_dump(exclude=drop) == shipped.model_dump(exclude=drop)


@pytest.mark.skipif(not SHIPPED, reason="no shipped schemes in search/")
def test_shipped_schemes_fit_their_budgets():
    for path in SHIPPED:
        scheme = load_scheme(path)
        prof = memplan.profile(
            scheme.model, method="sparse", scheme=str(path), mode=scheme.mode, input_shape=tuple(scheme.input_shape)
        )
        assert prof.totals.total_bytes == scheme.predicted["memory_bytes"] <= scheme.budget_bytes


def test_result_to_dict_is_json(mcunet):
    _, profile, _, _, _ = mcunet
    r = run_search(
        "mcunet-5fps", budget="80KB", profile=profile, classes=10, method="evolution", generations=2, population=6
    )
    data = json.loads(json.dumps(r.to_dict()))
    assert data["scheme"]["budget_bytes"] == 80_000 and data["method"] == "evolution"
    assert data["exact"]["value"] >= data["evolution"]["value"] and len(data["table"]["extra"]) == 168
