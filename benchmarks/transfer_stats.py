"""Statistics of the transfer benchmark (benchmarks/transfer.py), accuracies in % (points):

* ``mean_ci``: the mean over seeds with its Student-t confidence interval (the table's ± and the
  plot's error bars); ``compare``: the CI verdict (two rows apart when their intervals do not
  overlap);
* ``paired``: the per-seed difference of two rows trained on the same seeds (same data order, same
  probe head), its mean, Student-t interval and two-sided paired-t p-value;
* ``holm``: Holm's step-down adjustment of the p-values of one backbone's budgets (a family of
  tests: the familywise error stays at the level whatever the number of budgets);
* ``pareto_front``: the rows nothing cheaper beats;
* ``validation_error``: how far the benchmark's validation accuracies stray from its test
  accuracies, measured on its own rows.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

CONFIDENCE = 0.95
#: the level of the Holm-corrected verdicts
ALPHA = 0.05


def mean_ci(xs: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Mean and the half-width of its Student-t confidence interval (0 with one value)."""
    from scipy import stats

    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, 0.0
    half = stats.t.ppf(0.5 + confidence / 2, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, float(half)


def compare(r: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    """``r`` against ``b`` on test accuracy: apart when the 95% CIs do not overlap."""
    if r["accuracy_mean"] - r["accuracy_ci"] > b["accuracy_mean"] + b["accuracy_ci"]:
        return "BEATS (CIs apart)"
    if b["accuracy_mean"] - b["accuracy_ci"] > r["accuracy_mean"] + r["accuracy_ci"]:
        return "LOSES (CIs apart)"
    return "ties (CIs overlap)"


def paired(a: Mapping[int, float], b: Mapping[int, float], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """``a - b`` seed by seed over the seeds both have (accuracy points): ``difference`` (the mean),
    ``ci`` (the half-width of its Student-t interval), ``p`` (two-sided paired t test of a zero
    mean difference; 1.0 when every difference is 0, NaN with fewer than two seeds), ``seeds``."""
    from scipy import stats

    seeds = sorted(set(a) & set(b))
    d = [a[s] - b[s] for s in seeds]
    out: dict[str, Any] = {"seeds": seeds, "difference": statistics.fmean(d) if d else math.nan}
    if len(d) < 2:
        return out | {"ci": math.nan, "p": math.nan}
    mean, half = mean_ci(d, confidence)
    sd = statistics.stdev(d)
    if sd == 0:
        return out | {"ci": 0.0, "p": 1.0 if mean == 0 else 0.0}
    t = mean / (sd / math.sqrt(len(d)))
    return out | {"ci": half, "p": float(2 * stats.t.sf(abs(t), len(d) - 1)), "t": t}


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the i-th smallest of m p-values is
    multiplied by m - i (i from 0), made non-decreasing along that order and capped at 1. A NaN
    stays NaN and is not counted in m."""
    order = sorted((p, i) for i, p in enumerate(ps) if not math.isnan(p))
    m = len(order)
    out = [math.nan] * len(ps)
    running = 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def holm_verdict(difference: float, p_holm: float, alpha: float = ALPHA) -> str:
    """In words: better / worse at the familywise level ``alpha``, or no significant difference."""
    if math.isnan(p_holm) or p_holm >= alpha:
        return "no significant difference"
    return "BEATS" if difference > 0 else "LOSES"


#: points below the median of a row's other seeds that mark a seed as unstable (:func:`unstable_seeds`)
UNSTABLE_POINTS = 5.0


def unstable_seeds(rows: Sequence[Mapping[str, Any]], points: float = UNSTABLE_POINTS) -> list[dict[str, Any]]:
    """Each seed of a row (``accuracy``: per seed, in ``seeds`` order; points) that fell more than
    ``points`` below the median of the row's other seeds: a training that went wrong without
    diverging (its loss stayed finite, it beat chance). It counts in the mean and CI like any
    seed; the report lists it so that a reader sees where a wide CI comes from."""
    out = []
    for r in rows:
        acc = list(r["accuracy"])
        for i, (seed, a) in enumerate(zip(r["seeds"], acc)):
            others = acc[:i] + acc[i + 1 :]
            if len(others) >= 2 and (median := statistics.median(others)) - a > points:
                out.append({"name": r["name"], "seed": seed, "accuracy": a, "others_median": median})
    return out


def validation_error(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """How far validation strays from test on these rows (accuracy points): each row with test
    seeds and at least two validation runs at its chosen rate (``grid_validation[lr]``) gives its
    validation mean there minus its test mean. ``offset``: the mean of those differences (the
    validation images are another sample than the test split, and easier or harder); ``sd``: their
    standard deviation around it, what one training's validation accuracy errs by as a predictor of
    its test accuracy; ``difference_sd``: ``sd`` x sqrt(2), what the validation difference of two
    trainings errs by when their errors are independent; ``rows``: how many rows counted. None with
    fewer than 3 rows. Pass each training once (no two rows with the same runs). The rate was chosen
    on those same validation runs, so each mean carries the optimism of a maximum over its grid
    (more with more settings): an error the validation stage meets too."""
    gaps = []
    for r in rows:
        val = (r.get("grid_validation") or {}).get(r["lr"]) or []
        if len(val) >= 2 and r.get("accuracy"):
            gaps.append(statistics.fmean(val) - r["accuracy_mean"])
    if len(gaps) < 3:
        return None
    sd = statistics.stdev(gaps)
    return {"rows": len(gaps), "offset": statistics.fmean(gaps), "sd": sd, "difference_sd": sd * math.sqrt(2)}


def pareto_front(rows: Sequence[Mapping[str, Any]]) -> list[str]:
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
