"""The search chooses recomputed segments jointly with the update (``recompute``, issue 38 item 6).

Truth here is independent of the search: every candidate of a small space under every recompute
set of ``memplan.search.execution.execution_family``, costed by ``compute()`` directly (brute
force), and the saved activations of the written scheme measured on a real step with
``saved_tensors_hooks`` after ``apply_scheme``. Contribution profiles are SYNTHETIC
(``tests.test_search.synthetic_profile``).
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import replace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from rich.console import Console

from memplan.accounting.engine import compute
from memplan.api import capture
from memplan.apply import apply_scheme
from memplan.errors import BadOption
from memplan.modes import get_mode
from memplan.plan import load_scheme
from memplan.render.reports import print_search
from memplan.search import run_search
from memplan.search.execution import execution_family
from memplan.search.space import Candidate, build_space, contributions_of
from memplan.verify.measure import saved_bytes

from .test_search import synthetic_profile

torch.set_num_threads(1)
SHAPE = (3, 16, 16)
BATCH = 8
MODE = "applied"


class Block(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.a, self.na = nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout)
        self.b, self.nb = nn.Conv2d(cout, cout, 1, bias=False), nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.nb(self.b(F.relu(self.na(self.a(x))))))


class BlockNet(nn.Module):
    """A stem conv, three blocks in an nn.Sequential, a head."""

    def __init__(self, classes: int = 4):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.Sequential(Block(8, 8), Block(8, 8), Block(8, 8))
        self.fc = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(F.relu(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@pytest.fixture(scope="module")
def small():
    """BlockNet's graph, synthetic profile, and every (candidate, recompute set) with its memory
    and its bounded FLOPs (backward + recomputed) from compute() itself."""
    torch.manual_seed(0)
    graph = capture(BlockNet(), batch=BATCH, input_shape=SHAPE).graph
    profile = synthetic_profile(graph, seed=2, layers=3, classes=4)
    space = build_space(graph, contributions_of(profile), model="blocknet", ratios=(0.5, 1.0))
    cands = [Candidate(0)]
    for k in space.ks[1:]:
        layers = [c for c in space.layers if c.conv_index >= space.first(k)]
        options = [[None, *((c.conv_index, r) for r in c.ratios)] for c in layers]
        cands += [Candidate(k, tuple(w for w in pick if w)) for pick in itertools.product(*options)]
    truth = {}
    for segments in execution_family(graph, (1, 2)):
        for cand in cands:
            plan = replace(space.to_plan(cand), recompute=segments)
            t = compute(graph, plan, get_mode(MODE)).totals
            truth[cand, segments] = (space.value(cand), t.total_bytes, t.backward_flops + t.recompute_flops)
    return graph, profile, truth


def _best(truth, budget, flops=None, joint=True):
    fits = [
        v[0]
        for (cand, seg), v in truth.items()
        if v[1] <= budget and (flops is None or v[2] <= flops) and (joint or not seg)
    ]
    return max(fits)


def _search(profile, budget, **options):
    return run_search(
        BlockNet(), budget, profile=profile, input_shape=SHAPE, batch=BATCH, mode=MODE, ratios=(0.5, 1.0), **options
    )


def test_family(small):
    graph, _, _ = small
    family = execution_family(graph, (1, 2))
    assert family[0] == () and len(family) == len(set(family)) == 6  # none; from each block in 1s; from 0, 1 in 2s
    assert (("blocks.0", "blocks.1"), ("blocks.2",)) in family


def test_family_only_what_apply_scheme_runs():
    """Blocks in an nn.ModuleList run by the model's own loop: one block a segment, never several."""

    class ListNet(BlockNet):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(list(self.blocks))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = F.relu(self.stem(x))
            for block in self.blocks:
                x = block(x)
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    cap = capture(ListNet(), batch=BATCH, input_shape=SHAPE)
    family = execution_family(cap.graph, (1, 2), cap.model)
    assert len(family) == 4 and all(len(seg) == 1 for segments in family for seg in segments)


def test_joint_optimum_and_measured_saving(small, tmp_path):
    """At budgets between the floors, the joint search returns the brute-force joint optimum,
    never less than the update alone, and somewhere more; the written scheme's saved activations,
    measured on a real step of the applied model, are those it predicts."""
    graph, profile, truth = small
    memories = sorted({v[1] for v in truth.values()})
    gainful = [b for b in memories[::4] if _best(truth, b) > _best(truth, b, joint=False) + 1e-9]
    gained = False
    for budget in [gainful[0], memories[len(memories) // 2]]:
        out = tmp_path / f"s{budget}.json"
        r = _search(profile, budget, recompute=(1, 2), out=out)
        assert r.objective_value == pytest.approx(_best(truth, budget))
        alone = _best(truth, budget, joint=False)
        assert r.objective_value >= alone - 1e-9
        gained |= r.objective_value > alone + 1e-9
        scheme = load_scheme(out)
        if scheme.execution is None:
            continue
        console = Console(record=True, width=200)
        print_search(r, console)
        assert "recomputed in the backward" in console.export_text()
        torch.manual_seed(0)
        model = apply_scheme(BlockNet(), scheme)
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(BATCH, *SHAPE, generator=g), torch.randint(0, 4, (BATCH,), generator=g)
        assert saved_bytes(model, x, y).bytes == scheme.predicted["saved_activation_bytes"]
    assert gained


def test_flops_budget_bounds_recomputation(small):
    graph, profile, truth = small
    budget = sorted({v[1] for v in truth.values()})[-1]
    flops = sorted({v[2] for v in truth.values()})
    fbudget = flops[len(flops) // 2]
    r = _search(profile, budget, recompute=(1, 2), flops_budget=fbudget)
    assert r.objective_value == pytest.approx(_best(truth, budget, fbudget))
    assert r.backward_flops <= fbudget
    assert r.scheme.predicted.get("recompute_flops", 0) + r.scheme.predicted["backward_flops"] >= r.backward_flops


def test_off_by_default(small):
    _, profile, truth = small
    budget = sorted({v[1] for v in truth.values()})[-1]
    r = _search(profile, budget)
    assert r.scheme.execution is None and "recompute_flops" not in r.scheme.predicted


def test_refused_in_a_mode_without_recomputation(small):
    _, profile, _ = small
    with pytest.raises(BadOption, match="does not model recomputed segments"):
        run_search(BlockNet(), 10**9, profile=profile, input_shape=SHAPE, mode="mcu", recompute=(1,))


def test_refused():
    class Own(BlockNet):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.utils.checkpoint.checkpoint(self.blocks, F.relu(self.stem(x)), use_reentrant=False)
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    graph = capture(Own(), batch=BATCH, input_shape=SHAPE).graph
    with pytest.raises(BadOption, match="checkpoint calls of its own"):
        execution_family(graph, (1,))
    with pytest.raises(Exception, match="segment sizes must be positive"):
        run_search(copy.deepcopy(Own()), 10**9, recompute=(0,))
