"""Adaptive seeding of a contribution grid: more seeds where an entry is not yet told apart from
its noise.

Every Δacc entry (a bias run against the classifier-only run, a weight run against its bias
reference) is a mean of deltas paired by seed, with a standard error SE = std / sqrt(n). After
the protocol's seeds, each round gives one more seed to every entry whose ``|mean| <
adaptive_z x SE`` (or that has fewer than 2 paired seeds) and fewer than ``max_seeds``, and to
its reference run when the reference lacks that seed. Rounds repeat until no entry asks for
more. An extra seed is its own checkpointed run (``<run id>#seed<N>``), so resuming never loses
one; :func:`merge` folds them into the run they belong to before the profile is assembled.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from .protocol import Protocol, RunSpec

SEP = "#seed"
_SUMMED = ("train_s", "eval_s", "cache_s", "cpu_s")


def base_id(run_id: str) -> str:
    return run_id.split(SEP, 1)[0]


def merge(records: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Records by run id with each extra-seed run folded into its run (seeds in ascending order;
    seconds summed)."""
    out: dict[str, dict[str, Any]] = {k: dict(v) for k, v in records.items() if SEP not in k}
    for key, rec in records.items():
        if SEP not in key:
            continue
        base = out.get(base_id(key))
        if base is None:
            continue
        pairs = dict(zip(base["seeds"], base["accuracy"], strict=True))
        pairs.update(zip(rec["seeds"], rec["accuracy"], strict=True))
        base["seeds"], base["accuracy"] = list(sorted(pairs)), [pairs[s] for s in sorted(pairs)]
        for k in _SUMMED:
            base[k] = round(base.get(k, 0.0) + rec.get(k, 0.0), 4)
    return out


def paired_deltas(run: dict[str, Any], reference: dict[str, Any]) -> list[float]:
    """Accuracy of ``run`` minus its reference's, for each seed both have (points)."""
    ref = dict(zip(reference["seeds"], reference["accuracy"], strict=True))
    return [a - ref[s] for s, a in zip(run["seeds"], run["accuracy"], strict=True) if s in ref]


def standard_error(deltas: list[float] | None) -> float | None:
    """Standard error of the mean of paired deltas (sample std / sqrt(n), points); None below 2 seeds."""
    if deltas is None or len(deltas) < 2:
        return None
    return statistics.stdev(deltas) / math.sqrt(len(deltas))


def unresolved(deltas: list[float], z: float) -> bool:
    """Whether an entry is still inside its noise: fewer than 2 paired seeds, or ``|mean| < z x SE``."""
    se = standard_error(deltas)
    return se is None or abs(statistics.fmean(deltas)) < z * se


def next_round(specs: Iterable[RunSpec], records: dict[str, dict[str, Any]], protocol: Protocol) -> list[RunSpec]:
    """The extra-seed runs of the next round (empty: sampling is done). ``records``: the finished
    runs as :func:`merge` returns them."""
    if protocol.max_seeds is None:
        return []
    specs = list(specs)
    by_id = {s.id: s for s in specs}
    wanted: dict[str, set[int]] = {}
    for s in specs:
        if s.reference is None:
            continue
        run, ref = records[s.id], records[s.reference]
        deltas = paired_deltas(run, ref)
        if len(deltas) >= protocol.max_seeds or not unresolved(deltas, protocol.adaptive_z):
            continue
        seed = max(run["seeds"]) + 1
        wanted.setdefault(s.id, set()).add(seed)
        if seed not in ref["seeds"]:
            wanted.setdefault(s.reference, set()).add(seed)
    order = {s.id: i for i, s in enumerate(specs)}  # the grid's order: split points stay together
    return [replace(by_id[i], seeds=(seed,)) for i in sorted(wanted, key=order.get) for seed in sorted(wanted[i])]
