"""Statistics of the additivity check (``memplan.search.additivity``): how well summed Δacc agrees
with the real gain, and what bounds that agreement. Accuracies and gains in accuracy points.

How high a correlation can go is bounded by the measurement itself: with few seeds, the measured
gains are noisy. ``ceiling`` measures that bound from the same runs: the Spearman correlation of
one seed's gains with another's over the distinct schemes (averaged over seed pairs), raised to the
reliability of the mean over all seeds (Spearman-Brown), and its square root: the correlation a
predictor that knew every scheme's expected gain would reach, by the attenuation bound (exact for
Pearson, close for Spearman).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import BadOption

CONFIDENCE = 0.95
#: a seed this many accuracy points below classifier only's worst seed is reported as collapsed
COLLAPSE_POINTS = 10.0


def correlations(
    x: Sequence[float], y: Sequence[float], *, bootstrap: int = 2000, seed: int = 0, confidence: float = CONFIDENCE
) -> dict[str, Any]:
    """Pearson and Spearman correlation of paired samples with percentile bootstrap intervals
    (pairs resampled with replacement; resamples where a correlation is undefined are skipped)."""
    from scipy import stats

    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3:
        raise BadOption(f"a correlation needs at least 3 points, got {len(x)}")

    def both(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
        if np.ptp(a) == 0 or np.ptp(b) == 0:
            return math.nan, math.nan
        return float(stats.pearsonr(a, b)[0]), float(stats.spearmanr(a, b)[0])

    rng = np.random.default_rng(seed)
    samples = [both(x[i], y[i]) for i in (rng.integers(0, len(x), len(x)) for _ in range(bootstrap))]
    lo, hi = (1 - confidence) / 2 * 100, (1 + confidence) / 2 * 100
    out: dict[str, Any] = {}
    for j, name in enumerate(("pearson", "spearman")):
        vals = np.asarray([s[j] for s in samples if not math.isnan(s[j])])
        out[name] = both(x, y)[j]
        out[f"{name}_ci"] = (
            (float(np.percentile(vals, lo)), float(np.percentile(vals, hi))) if len(vals) else (math.nan, math.nan)
        )
    return out


def ceiling(reference: Sequence[float], accuracy: Mapping[Any, Sequence[float]]) -> dict[str, Any] | None:
    """How far the measured gains themselves allow any predictor to correlate with them (module
    docstring). ``reference``: classifier-only test accuracy per seed; ``accuracy``: scheme -> its
    test accuracy per seed (same seed order; a scheme that fits several budgets counts once). Returns ``seed_spearman``
    (mean over seed pairs of the Spearman correlation between the two seeds' paired gains),
    ``reliability`` of the mean over ``seeds`` seeds (Spearman-Brown), ``ceiling`` (its square root;
    0 when the seeds do not agree at all), ``schemes`` and ``seeds``; None with one seed or fewer than
    three distinct schemes."""
    from itertools import combinations

    from scipy import stats

    rows = list(accuracy.values())
    n = len(reference)
    if n < 2 or len(rows) < 3:
        return None
    gains = np.asarray(rows, float) - np.asarray(reference, float)
    pairs = [stats.spearmanr(gains[:, a], gains[:, b])[0] for a, b in combinations(range(n), 2)]
    pairs = [r for r in pairs if not math.isnan(r)]
    if not pairs:
        return None
    r1 = float(np.mean(pairs))
    rel = n * r1 / (1 + (n - 1) * r1) if r1 > 0 else 0.0
    return {"seed_spearman": r1, "reliability": rel, "ceiling": math.sqrt(rel), "schemes": len(rows), "seeds": n}


def noise_readings(
    reference: list[float], points: Sequence[Any], bootstrap: int, seed: int
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, list[str]]:
    """The additivity check's ``ceiling`` over its stable ``points`` (each with ``candidate``,
    ``accuracy`` per seed, %, ``summed`` and ``gain``, points): a scheme that collapsed (a seed
    more than ``COLLAPSE_POINTS`` below ``reference``'s worst seed) ranks last on that seed
    whatever the noise elsewhere, and would make the seeds look as if they agreed; its ``stable``
    correlations (None when no scheme collapsed) and notes on both."""
    low = min(reference) - COLLAPSE_POINTS
    collapsed = [p for p in points if min(p.accuracy) < low]
    kept = [p for p in points if min(p.accuracy) >= low]
    bound = ceiling(reference, {p.candidate: p.accuracy for p in kept})
    notes = []
    if bound is not None and bound["ceiling"] < 0.7:
        notes.append(
            f"the seeds agree little: one seed's gains rank the {bound['schemes']} stable schemes like another's at "
            f"Spearman {bound['seed_spearman']:+.2f}, so no predictor can correlate above about {bound['ceiling']:.2f} "
            f"with the mean over {bound['seeds']} seeds; more seeds raise the ceiling"
        )
    stable = None
    if collapsed:
        notes.append(
            f"{len(collapsed)} scheme(s) have a seed more than {COLLAPSE_POINTS:g} points below classifier only "
            f"({', '.join(f'{min(p.accuracy):.1f}%' for p in collapsed)}): training them collapsed at the "
            "profile's rates; they are counted as measured, `stable` correlates the others alone, and the ceiling "
            "is theirs"
        )
        if len(kept) >= 3:
            x, y = [p.summed for p in kept], [p.gain for p in kept]
            stable = {"schemes": len(kept)} | correlations(x, y, bootstrap=bootstrap, seed=seed)
            stable["ceiling"] = bound
    return bound, stable, notes
