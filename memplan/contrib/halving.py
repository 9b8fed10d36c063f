"""Successive halving over (candidate, learning rate) configurations, one seed per rung.

A learning rate here is any hashable setting: one rate, or rates per parameter family
(:class:`memplan.rates.Rates`); ``lrs`` gives the same settings to every candidate, or, as a
mapping, each candidate its own.

Rung i trains every configuration still in at seed ``seeds[i]``; then the configurations are
ranked by their mean accuracy over the seeds so far, and the better ``KEEP`` fraction (at least
``MIN_KEEP``) goes on, together with the best configuration of every *protected* candidate (the
baselines: they are never halved away, so the winner has been compared with each of them on
the same seeds). A run whose accuracy is not finite is diverged and drops its configuration.
After the last rung the configuration of highest mean wins.

The function is pure: ``train(candidate, lr, seed) -> accuracy`` does the work (and may read a
checkpoint), so the schedule is tested on its own.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: the fraction of configurations a rung keeps, and the fewest it keeps
KEEP, MIN_KEEP = 0.5, 2


@dataclass
class Config:
    """One candidate at one learning rate, with its accuracy (%) per seed trained."""

    candidate: Hashable
    lr: Hashable  # a rate, or rates per family
    accuracy: dict[int, float] = field(default_factory=dict)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.accuracy.values()) if self.accuracy else -math.inf

    @property
    def se(self) -> float:
        """Standard error of the mean over seeds, points (0 with one seed)."""
        xs = list(self.accuracy.values())
        return statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0

    @property
    def diverged(self) -> bool:
        return any(not math.isfinite(a) for a in self.accuracy.values())


@dataclass
class Halving:
    """Every configuration with what it measured, the rungs (which configurations each seed
    trained) and the winner (None when every configuration diverged)."""

    configs: list[Config]
    rungs: list[list[tuple[Hashable, Hashable]]]
    best: Config | None

    def best_of(self, candidate: Hashable) -> Config | None:
        """The configuration of ``candidate`` that went furthest, best mean first."""
        mine = [c for c in self.configs if c.candidate == candidate and not c.diverged and c.accuracy]
        return max(mine, key=lambda c: (len(c.accuracy), c.mean), default=None)


def successive_halving(
    candidates: Iterable[Hashable],
    lrs: Sequence[Hashable] | Mapping[Hashable, Sequence[Hashable]],
    seeds: Sequence[int],
    train: Callable[[Hashable, Any, int], float],
    *,
    protected: Iterable[Hashable] = (),
    on_run: Callable[[], None] | None = None,
    on_rung: Callable[[list[tuple[Hashable, Any, int]]], None] | None = None,
) -> Halving:
    """Run the schedule (module docstring); ``on_run`` is called after every run (a progress bar),
    ``on_rung`` with every ``(candidate, lr, seed)`` of a rung before it trains (a trainer that
    runs them in parallel: ``train`` then reads their results)."""
    own = lrs if isinstance(lrs, Mapping) else dict.fromkeys(dict.fromkeys(candidates), lrs)
    if not seeds or not all(own.get(c) for c in dict.fromkeys(candidates)):
        raise ValueError("successive halving needs at least one seed and one learning rate per candidate")
    protected = set(protected)
    configs = [Config(c, lr) for c in dict.fromkeys(candidates) for lr in dict.fromkeys(own[c])]
    alive = list(configs)
    rungs = []
    for seed in seeds:
        rungs.append([(c.candidate, c.lr) for c in alive])
        if on_rung is not None:
            on_rung([(c.candidate, c.lr, seed) for c in alive])
        for c in alive:
            c.accuracy[seed] = float(train(c.candidate, c.lr, seed))
            if on_run is not None:
                on_run()
        ranked = sorted((c for c in alive if not c.diverged), key=lambda c: -c.mean)
        survivors = ranked[: max(MIN_KEEP, math.ceil(len(ranked) * KEEP))]
        for cand in protected:
            own = next((c for c in ranked if c.candidate == cand), None)
            if own is not None and own not in survivors:
                survivors.append(own)
        alive = survivors
    last = [c for c in alive if len(c.accuracy) == len(seeds) and not c.diverged]
    best = max(last, key=lambda c: c.mean, default=None)
    return Halving(configs, rungs, best)


def planned_runs(n_configs: int, n_seeds: int, keep: float = KEEP, min_keep: int = MIN_KEEP) -> int:
    """Runs of the schedule without protection and divergence (each protected candidate adds at most one
    run per later seed)."""
    total, alive = 0, n_configs
    for _ in range(n_seeds):
        total += alive
        alive = min(alive, max(min_keep, math.ceil(alive * keep)))
    return total
