"""Grids without edges (issue 39): a rate chosen at an edge of its grid widens the grid by one step
beyond it (``memplan.rates.outward``) until the choice is interior. The validation stage is run
with a stub trainer whose accuracy peaks at a known rate outside the given grid; ties go to the
smaller rate."""

import math

import pytest

from memplan.plan import Scheme
from memplan.rates import Rates, outward
from memplan.search.candidates import Candidate
from memplan.search.stage import choose

R = Rates.parse


def test_outward_steps_beyond_an_edge_by_the_grids_own_spacing():
    grid = [R(x) for x in ("5e-4", "2.5e-3", "1.25e-2", "1.25e-2/weight=5e-4", "1.25e-2/weight=2.5e-3")]
    assert outward(grid, R("5e-4")) == [(Rates.uniform(1e-4), R("2.5e-3"))]  # (beyond, the inner neighbour)
    assert outward(grid, R("1.25e-2")) == [(Rates.uniform(6.25e-2), R("2.5e-3"))]
    assert outward(grid, R("2.5e-3")) == []  # interior
    # a per-family point: its weight line is 5e-4, 2.5e-3, 1.25e-2 (the uniform point), at the bottom
    assert outward(grid, R("1.25e-2/weight=5e-4")) == [(R("1.25e-2/weight=1e-4"), R("1.25e-2/weight=2.5e-3"))]
    assert outward(grid, R("1.25e-2/weight=2.5e-3")) == []
    assert outward([R("0.01")], R("0.01")) == []  # one rate: no edge
    two = [R("0.01"), R("0.03")]
    assert outward(two, R("0.03")) == [(Rates.uniform(0.09), R("0.01"))]
    assert outward(two, R("0.01"))[0][0].single == pytest.approx(0.01 / 3, rel=1e-5)


class Stub:
    """A trainer whose validation accuracy peaks at ``best`` (log scale), the same for every seed;
    it records every (candidate, rates, seed) it is asked to train."""

    optimizer, epochs, batch_size, classifier, data, checkpoint = "adam", 1, 8, "fc", "stub", "none"

    def __init__(self, best: float, flat: bool = False):
        self.best, self.flat, self.trained, self.calls = best, flat, 0, []

    def __call__(self, candidate, rates, seed):
        self.calls.append((candidate.name, rates, seed))
        self.trained += 1
        if self.flat:
            return 80.0
        return 90.0 - abs(math.log10(rates.classifier) - math.log10(self.best))


def candidates() -> list[Candidate]:
    def scheme(k):
        return Scheme(model="m", fingerprint="f", input_shape=[3, 8, 8], bias_update=k)

    fams = frozenset({"classifier", "bias"})
    return [Candidate("base", scheme(1), 10, True, fams), Candidate("searched", scheme(2), 20, False, fams)]


@pytest.mark.parametrize("best", [1e-4, 0.3125])  # on the widened grids
def test_the_stage_widens_its_grid_until_the_choice_is_interior(best):
    stub = Stub(best)
    grid = [R("5e-4"), R("2.5e-3"), R("1.25e-2")]
    v = choose(candidates(), stub, lrs=grid, seeds=[100, 101], widen=6)
    assert v.halving.best.lr.single == pytest.approx(best)
    assert not v.at_edge
    singles = sorted(r.single for r in v.lrs)
    assert singles[0] < best < singles[-1]  # the grid actually used has points on both sides
    assert {s for _, _, s in stub.calls} == {100, 101}


def test_widening_stops_at_its_limit_and_says_so():
    v = choose(candidates(), Stub(1e-6), lrs=[R("5e-4"), R("2.5e-3")], seeds=[100], widen=1)
    assert v.at_edge and len(v.lrs) == 3 and min(r.single for r in v.lrs) == pytest.approx(1e-4)
    assert choose(candidates(), Stub(1e-6), lrs=[R("5e-4"), R("2.5e-3")], seeds=[100], widen=0).at_edge


def test_a_tie_goes_to_the_cheaper_candidate_then_the_smaller_rate_and_a_plateau_widens_nothing():
    grid = [R("1.25e-2"), R("2.5e-3"), R("5e-4"), R("1e-4")]  # not in order: the rule does not depend on it
    v = choose(candidates(), Stub(0, flat=True), lrs=grid, seeds=[100, 101], widen=3)
    assert v.chosen.name == "base" and v.halving.best.lr == R("1e-4")
    assert sorted(v.lrs) == sorted(grid) and not v.at_edge  # 1e-4 ties 5e-4: a plateau, not an edge pull
