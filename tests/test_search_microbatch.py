"""The search chooses micro-batching (gradient accumulation) jointly with the update
(``micro_batches``, issue 38 item 6).

Truth here is independent of the search: every candidate of a small space at every micro-batch
count, costed by ``compute()`` directly on the model traced at one micro-batch (brute force); the
written scheme's saved activations measured with ``saved_tensors_hooks`` on a real step of one
micro-batch after ``apply_scheme``. Contribution profiles are SYNTHETIC
(``tests.test_search.synthetic_profile``); the model's norms are frozen (eval mode) by every
candidate, so micro-batching leaves the gradients as they are (``tests.test_microbatch_choice``).
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn as nn
from rich.console import Console

from memplan.accounting.engine import compute
from memplan.api import capture
from memplan.apply import apply_scheme
from memplan.errors import BadOption
from memplan.modes import get_mode
from memplan.plan import load_scheme
from memplan.render.reports import print_search
from memplan.search import run_search
from memplan.search.budgets import BudgetError
from memplan.search.space import Candidate, build_space, contributions_of
from memplan.verify.measure import saved_bytes

from .test_search import synthetic_profile
from .test_search_recompute import BATCH, MODE, SHAPE, BlockNet

torch.set_num_threads(1)
COUNTS = (1, 2, 4)


@pytest.fixture(scope="module")
def small():
    """The synthetic profile and, for every (candidate, micro-batch count), its gain, memory and
    bounded FLOPs (over the whole step) from compute() on the model traced at one micro-batch."""
    torch.manual_seed(0)
    graph = capture(BlockNet(), batch=BATCH, input_shape=SHAPE).graph
    profile = synthetic_profile(graph, seed=2, layers=3, classes=4)
    truth = {}
    for m in COUNTS:
        micro = capture(BlockNet(), batch=BATCH // m, input_shape=SHAPE).graph
        space = build_space(micro, contributions_of(profile), model="blocknet", ratios=(0.5, 1.0))
        space.micro_batches = m
        cands = [Candidate(0)]
        for k in space.ks[1:]:
            layers = [c for c in space.layers if c.conv_index >= space.first(k)]
            options = [[None, *((c.conv_index, r) for r in c.ratios)] for c in layers]
            cands += [Candidate(k, tuple(w for w in pick if w)) for pick in itertools.product(*options)]
        for cand in cands:
            plan = space.to_plan(cand)
            assert plan.micro_batches == m
            t = compute(micro, plan, get_mode(MODE)).totals
            truth[cand, m] = (space.value(cand), t.total_bytes, m * t.backward_flops)
    return profile, truth


def _best(truth, budget, joint=True):
    """The largest gain that fits ``budget`` (``joint``: at any count, else the whole batch at once)."""
    return max((v[0] for (_, m), v in truth.items() if (joint or m == 1) and v[1] <= budget), default=-1.0)


def _search(profile, budget, **options):
    return run_search(
        BlockNet(), budget, profile=profile, input_shape=SHAPE, batch=BATCH, mode=MODE, ratios=(0.5, 1.0), **options
    )


def test_joint_optimum_and_measured_saving(small, tmp_path):
    """Between the floors, the joint search returns the brute-force optimum over every count, never
    less than the whole batch at once, and somewhere more; the written scheme records the count and
    one micro-batch's saved activations, measured on a real step, are those it predicts."""
    profile, truth = small
    memories = sorted({v[1] for v in truth.values()})
    gainful = [b for b in memories if _best(truth, b) > _best(truth, b, joint=False) + 1e-9 >= 0]
    assert gainful
    budget = gainful[len(gainful) // 2]
    out = tmp_path / "s.json"
    r = _search(profile, budget, micro_batches=(2, 4), out=out)
    assert r.objective_value == pytest.approx(_best(truth, budget))
    scheme = load_scheme(out)
    m = scheme.execution.micro_batches
    assert m > 1 and scheme.batch == BATCH and scheme.schema_version == 5
    console = Console(record=True, width=200)
    print_search(r, console)
    assert f"in {m} micro-batches" in console.export_text()
    torch.manual_seed(0)
    model = apply_scheme(BlockNet(), scheme)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH // m, *SHAPE, generator=g), torch.randint(0, 4, (BATCH // m,), generator=g)
    assert saved_bytes(model, x, y).bytes == scheme.predicted["saved_activation_bytes"]


def test_flops_unchanged(small):
    """A FLOPs budget bounds the whole step: micro-batching neither adds nor removes FLOPs."""
    profile, truth = small
    flops = {}
    for (cand, _), v in truth.items():
        flops.setdefault(cand, set()).add(v[2])
    assert all(len(f) == 1 for f in flops.values())
    budget = max(v[1] for v in truth.values())
    r = _search(profile, budget, micro_batches=(2,), flops_budget=10**12)
    whole = _search(profile, budget, flops_budget=10**12)
    assert r.scheme.execution.micro_batches == 2 and whole.scheme.execution is None  # less memory, same gain
    assert r.backward_flops == whole.backward_flops and r.objective_value == whole.objective_value


def test_off_by_default_and_refused(small):
    profile, truth = small
    budget = max(v[1] for v in truth.values())
    assert _search(profile, budget).scheme.execution is None
    with pytest.raises(BadOption, match="--micro-batches 3 does not divide --batch 8"):
        _search(profile, budget, micro_batches=(3,))
    with pytest.raises(Exception, match="micro-batch counts must be positive"):
        _search(profile, budget, micro_batches=(0,))
    with pytest.raises(BadOption, match="no gradient is kept to accumulate"):
        run_search(BlockNet(), 10**9, profile=profile, input_shape=SHAPE, batch=BATCH, mode="mcu", micro_batches=(2,))


def test_refused_where_a_norm_uses_batch_statistics(small):
    """A BatchNorm without running statistics normalises with its batch's: micro-batching would
    change what the model computes, so the search refuses it in one line."""
    profile, truth = small

    def build():
        net = BlockNet()
        net.blocks[0].na = nn.BatchNorm2d(8, track_running_stats=False)
        return net

    budget = max(v[1] for v in truth.values())
    with pytest.raises(BadOption, match="changes what the model computes") as info:
        run_search(build(), budget, profile=profile, input_shape=SHAPE, batch=BATCH, mode=MODE, micro_batches=(2,))
    assert "\n" not in str(info.value)


def test_below_the_whole_batch_floor(small):
    """A budget under the whole batch's classifier-only memory but not under that of 4 micro-batches
    is met in 4; one under every count's is refused with the least floor of all."""
    profile, truth = small
    floors = {m: truth[Candidate(0), m][1] for m in COUNTS}
    assert floors[1] > floors[2] > floors[4]
    r = _search(profile, floors[4], micro_batches=(2, 4))
    assert r.scheme.execution.micro_batches == 4 and r.memory_bytes == floors[4]
    with pytest.raises(BudgetError, match=f"classifier-only memory {floors[4]} B"):
        _search(profile, floors[4] - 1, micro_batches=(2, 4))
