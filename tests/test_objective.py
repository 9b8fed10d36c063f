"""Search objectives that do not chase noise (memplan.search.objective), checked against hand
computations, and the search using them end to end on a synthetic profile with standard errors."""

import math

import pytest

from memplan.api import capture
from memplan.errors import BadOption
from memplan.search import run_search
from memplan.search.objective import apply_objective
from memplan.search.space import build_space, contributions_of

from .test_search import synthetic_profile


def test_lcb_is_the_mean_minus_one_standard_error():
    assert apply_objective("lcb", [2.0, 0.5, -1.0], [0.5, 1.0, 0.25]) == [1.5, -0.5, -1.25]


def test_shrink_is_the_normal_normal_posterior_mean_with_a_moment_prior():
    means, ses = [3.0, 1.0, -1.0, 0.0], [1.0, 1.0, 2.0, 0.5]
    # by hand: population variance of the means = (3.0^2 + 1 + 1 + 0)/4 - 0.75^2 = 2.75 - 0.5625
    var = (9 + 1 + 1 + 0) / 4 - 0.75**2
    tau2 = var - (1 + 1 + 4 + 0.25) / 4  # minus the mean squared SE
    want = [m * tau2 / (tau2 + s * s) for m, s in zip(means, ses)]
    assert apply_objective("shrink", means, ses) == pytest.approx(want)
    # entries all inside their noise: tau^2 = 0, everything shrinks to 0
    assert apply_objective("shrink", [0.1, -0.1], [1.0, 1.0]) == [0.0, -0.0]


def test_one_seed_entries_take_the_pooled_standard_error_and_no_se_at_all_is_refused():
    pooled = math.sqrt((0.3**2 + 0.4**2) / 2)
    assert apply_objective("lcb", [1.0, 1.0, 1.0], [0.3, None, 0.4]) == pytest.approx([0.7, 1 - pooled, 0.6])
    with pytest.raises(BadOption, match="needs standard errors"):
        apply_objective("shrink", [1.0], [None])
    assert apply_objective("mean", [1.0], [None]) == [1.0]


def test_noise_aware_search_drops_an_entry_that_is_all_noise():
    cap = capture("mcunet-5fps", resolution=128, classes=10)
    profile = synthetic_profile(cap.graph, layers=4)
    bias_se = {k: 0.05 for k in profile.bias}
    weight_se = {n: {r: 0.05 for r in row} for n, row in profile.weight.items()}
    noisy = next(iter(profile.weight))  # the earliest analysed conv: one huge, very uncertain entry
    profile.weight[noisy][0.125] = 20.0
    weight_se[noisy][0.125] = 40.0
    profile = profile.model_copy(update={"bias_se": bias_se, "weight_se": weight_se})
    space_mean = build_space(cap.graph, contributions_of(profile), objective="mean")
    space_lcb = build_space(cap.graph, contributions_of(profile), objective="lcb")
    i = next(c.conv_index for c in space_mean.layers if c.conv.name == noisy)
    r_mean = run_search("mcunet-5fps", "100KB", profile=profile, resolution=128, objective="mean")
    r_lcb = run_search("mcunet-5fps", "100KB", profile=profile, resolution=128, objective="lcb")
    chosen_mean = {(u.conv_index, u.ratio) for u in r_mean.scheme.weight_updates}
    chosen_lcb = {(u.conv_index, u.ratio) for u in r_lcb.scheme.weight_updates}
    assert (i, 0.125) in chosen_mean and (i, 0.125) not in chosen_lcb
    # the reported summed Δacc is the measured means, whatever the objective
    assert r_lcb.summed_delta_acc == pytest.approx(space_lcb.summed(_cand(r_lcb)))
    assert r_lcb.objective == "lcb" and r_lcb.objective_value < r_lcb.summed_delta_acc


def _cand(result):
    from memplan.search.space import Candidate

    s = result.scheme
    return Candidate(s.bias_update, tuple((u.conv_index, u.ratio) for u in s.weight_updates))


def test_default_objective_is_noise_aware_and_says_so_when_it_cannot_be():
    cap = capture("mcunet-5fps", resolution=128, classes=10)
    profile = synthetic_profile(cap.graph, layers=4)  # no standard errors: one seed per entry
    r = run_search("mcunet-5fps", "100KB", profile=profile, resolution=128)
    assert r.objective == "mean" and any("no standard errors" in w for w in r.warnings)
    ses = {k: 0.1 for k in profile.bias}, {n: {q: 0.1 for q in row} for n, row in profile.weight.items()}
    profile = profile.model_copy(update={"bias_se": ses[0], "weight_se": ses[1]})
    r = run_search("mcunet-5fps", "100KB", profile=profile, resolution=128)
    assert r.objective == "lcb" and not any("standard errors" in w for w in r.warnings)
