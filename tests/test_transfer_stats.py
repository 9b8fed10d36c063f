"""The transfer benchmark's statistics (benchmarks/transfer_stats.py) against scipy and hand
computations: the paired per-seed difference and its paired-t p-value (``scipy.stats.ttest_rel``),
Holm's step-down adjustment (worked by hand, and against its definition on random p-values)."""

import itertools
import math
import random

import pytest
from scipy import stats

from .helpers import load_benchmark


@pytest.fixture(scope="module")
def st():
    return load_benchmark("transfer_stats")


def test_paired_difference_and_p_value_are_scipys_paired_t(st):
    a = {0: 85.1, 1: 84.7, 2: 85.9, 3: 84.2, 4: 85.0, 9: 99.0}  # seed 9 has no partner: left out
    b = {0: 84.3, 1: 84.9, 2: 84.8, 3: 83.9, 4: 84.1, 5: 10.0}
    seeds = [0, 1, 2, 3, 4]
    got = st.paired(a, b)
    ref = stats.ttest_rel([a[s] for s in seeds], [b[s] for s in seeds])
    assert got["seeds"] == seeds
    assert got["difference"] == pytest.approx(sum(a[s] - b[s] for s in seeds) / 5)
    assert got["p"] == pytest.approx(ref.pvalue, rel=1e-12) and got["t"] == pytest.approx(ref.statistic)
    ci = stats.t.interval(0.95, 4, loc=got["difference"], scale=stats.sem([a[s] - b[s] for s in seeds]))
    assert got["ci"] == pytest.approx((ci[1] - ci[0]) / 2)


def test_paired_degenerate_cases(st):
    assert st.paired({0: 80.0, 1: 81.0}, {0: 80.0, 1: 81.0})["p"] == 1.0  # every difference 0
    assert st.paired({0: 81.0, 1: 82.0}, {0: 80.0, 1: 81.0})["p"] == 0.0  # every difference the same
    one = st.paired({0: 81.0}, {0: 80.0})
    assert one["difference"] == 1.0 and math.isnan(one["p"])


def test_holm_by_hand(st):
    # sorted 0.01, 0.02, 0.03, 0.04 (m = 4): 0.04, 0.06, 0.06 (non-decreasing), 0.04 -> 0.06
    assert st.holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert st.holm([0.5, 0.9]) == [1.0, 1.0]  # capped at 1
    out = st.holm([0.01, math.nan, 0.04])  # a NaN is not counted: m = 2
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)


def test_holm_rejects_what_its_step_down_definition_rejects(st):
    """Holm at level alpha rejects the hypotheses of the sorted p-values up to the first p_(i) >
    alpha / (m - i): the adjusted p-values below alpha are exactly those."""
    rng = random.Random(0)
    for m, alpha in itertools.product((1, 2, 3, 6), (0.05, 0.1)):
        ps = [rng.random() ** 3 for _ in range(m)]
        order = sorted(range(m), key=lambda i: ps[i])
        rejected = set()
        for rank, i in enumerate(order):
            if ps[i] > alpha / (m - rank):
                break
            rejected.add(i)
        assert {i for i, p in enumerate(st.holm(ps)) if p <= alpha} == rejected


def test_mean_ci_compare_and_verdicts(st):
    mean, half = st.mean_ci([80.0, 82.0, 84.0])
    assert mean == 82.0 and half == pytest.approx(stats.t.ppf(0.975, 2) * 2 / math.sqrt(3))
    row = lambda m, c: {"accuracy_mean": m, "accuracy_ci": c}  # noqa: E731
    assert st.compare(row(85, 0.4), row(84, 0.5)) == "BEATS (CIs apart)"
    assert st.compare(row(84, 0.6), row(85, 0.5)) == "ties (CIs overlap)"
    assert st.holm_verdict(0.8, 0.01) == "BEATS" and st.holm_verdict(-0.8, 0.01) == "LOSES"
    assert st.holm_verdict(0.8, 0.2) == "no significant difference"


def test_a_validated_row_is_checked_against_every_baseline_with_no_more_memory():
    """The best baseline by mean can overlap the validated row while a cheaper one with a narrow CI
    beats it with the CIs apart: the acceptance check names that one."""
    report = load_benchmark("transfer_report")
    rows = [
        {"name": "validated 30MB", "method": report.VALIDATED, "budget": "30MB", "memory_bytes": 29_000_000},
        {"name": "wide", "method": "bias only", "memory_bytes": 16_000_000, "accuracy_mean": 85.5, "accuracy_ci": 1.0},
        {"name": "narrow", "method": "last-k", "memory_bytes": 20_000_000, "accuracy_mean": 85.3, "accuracy_ci": 0.05},
        {"name": "dearer", "method": "TinyTL", "memory_bytes": 29_500_000, "accuracy_mean": 90.0, "accuracy_ci": 0.1},
    ]
    seeds = [0, 1, 2]
    for r, accs in zip(rows, ([85.0, 85.1, 84.9], [84.0, 86.5, 86.0], [85.25, 85.3, 85.35], [90.0] * 3)):
        r |= {"seeds": seeds, "accuracy": accs}
    rows[0] |= {"accuracy_mean": 85.0, "accuracy_ci": 0.1}
    (c,) = report.comparisons(rows)
    # "dearer" fits the budget but needs more memory than the validated row: the best baseline, not a loss
    assert c["baseline"] == "dearer" and c["loses_to"] == ["narrow"]


def test_a_partial_report_marks_pending_baselines_and_counts_unfinished_stages_in_holm():
    """While runs are under way: a baseline that fits a budget but has no row yet makes that
    budget's verdict provisional (``pending``), and each unfinished stage counts in Holm's family
    at p = 1, so the adjusted p-value can only fall when it finishes (a smaller p of its own ranks
    first and lowers the others' multiplier); with nothing missing the family is the rows'."""
    from scipy import stats

    report = load_benchmark("transfer_report")
    st = load_benchmark("transfer_stats")
    seeds = list(range(5))
    v = {"name": "validated 15MB", "method": report.VALIDATED, "budget": "15MB", "memory_bytes": 14_000_000,
         "seeds": seeds, "accuracy": [84.0, 84.3, 84.1, 84.6, 84.2]}  # fmt: skip
    b = {"name": "head", "method": "classifier only", "memory_bytes": 13_000_000, "seeds": seeds,
         "accuracy": [83.0, 83.9, 83.6, 83.7, 83.1]}  # fmt: skip
    for r in (v, b):
        r["accuracy_mean"], r["accuracy_ci"] = st.mean_ci(r["accuracy"])
    missing = [
        {"name": "biases of the last 39", "method": "biases of the last k convs", "memory_bytes": 14_900_000},
        {"name": "bias only", "method": "bias only", "memory_bytes": 16_100_000},
        {"name": "validated 20MB", "method": report.VALIDATED, "memory_bytes": None},
        {"name": "validated 30MB", "method": report.VALIDATED, "memory_bytes": None},
    ]
    p = stats.ttest_rel(v["accuracy"], b["accuracy"]).pvalue
    (c,) = report.comparisons([v, b], missing)
    assert c["pending"] == ["biases of the last 39"]  # bias only does not fit 15 MB
    assert c["holm_family"] == 3 and c["p_holm"] == pytest.approx(min(1.0, 3 * p))
    (c,) = report.comparisons([v, b])
    assert c["pending"] == [] and c["holm_family"] == 1 and c["p_holm"] == pytest.approx(p)
    assert any(
        "PROVISIONAL" in line for line in report.verdicts([v | {"chosen": "x"}, b], report.comparisons([v, b], missing))
    )


def test_a_stage_that_chose_the_best_baseline_says_so():
    """A validated row trained as the best baseline that fits (the same runs) is stated as that
    choice, not as a tie of a comparison with itself."""
    report = load_benchmark("transfer_report")
    seeds = [0, 1, 2]
    b = {"name": "biases of the last 39", "method": "biases of the last k convs", "memory_bytes": 14_900_000,
         "seeds": seeds, "accuracy": [83.9, 84.0, 83.95], "accuracy_mean": 83.95, "accuracy_ci": 0.1}  # fmt: skip
    v = b | {"name": "validated 15MB", "method": report.VALIDATED, "budget": "15MB", "chosen": b["name"],
             "same_runs_as": b["name"]}  # fmt: skip
    (line,) = report.verdicts([v, b], report.comparisons([v, b]))
    assert "the stage chose the best baseline that fits 15,000,000 B, biases of the last 39" in line
    assert "ties" not in line and "Holm" not in line


def test_a_seed_far_below_its_rows_others_is_listed_as_unstable(st):
    """CIFAR-10's 20 MB scheme had one seed 11 points below the other nine: listed, with the others'
    median; a row that is wide everywhere, or a seed 5 points or less below, is not."""
    rows = [
        {"name": "one bad seed", "seeds": [0, 1, 2, 3, 4], "accuracy": [65.0, 66.0, 54.0, 65.5, 64.0]},
        {"name": "wide everywhere", "seeds": [0, 1, 2, 3, 4], "accuracy": [51.0, 59.0, 53.0, 56.0, 52.0]},
        {"name": "just inside", "seeds": [0, 1, 2], "accuracy": [70.0, 65.0, 70.0]},
    ]
    assert st.unstable_seeds(rows) == [{"name": "one bad seed", "seed": 2, "accuracy": 54.0, "others_median": 65.25}]


def test_validation_error_by_hand(st):
    """Validation minus test per row, at each row's chosen rate: offset = their mean, sd = their
    sample SD, worked by hand on differences +1, +2, +3 (a fourth row has one validation run at its
    rate and a fifth no test seeds: neither counts)."""

    def row(lr, val, test):
        return {
            "lr": lr,
            "grid_validation": {lr: val, "other": [0.0, 0.0]},
            "accuracy": test,
            "accuracy_mean": (sum(test) / len(test) if test else None),
        }

    rows = [
        row("0.1", [85.0, 87.0], [85.0, 85.0]),  # 86 - 85 = +1
        row("0.2", [90.0, 90.0], [88.0]),  # +2
        row("0.3", [70.0, 72.0], [68.0, 68.0]),  # 71 - 68 = +3
        row("0.4", [99.0], [50.0]),  # one validation run: left out
        row("0.5", [99.0, 99.0], []),  # no test seed: left out
    ]
    got = st.validation_error(rows)
    assert got["rows"] == 3 and got["offset"] == pytest.approx(2.0)
    assert got["sd"] == pytest.approx(1.0)  # sqrt(((1-2)^2 + 0 + (3-2)^2) / 2)
    assert got["difference_sd"] == pytest.approx(math.sqrt(2))
    assert st.validation_error(rows[:2]) is None  # fewer than three rows
