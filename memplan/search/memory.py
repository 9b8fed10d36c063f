"""Memory of a candidate = memplan's own cost model (``memplan.accounting.engine.compute``) on its plan.

The search never costs anything itself. :class:`MemoryModel` profiles candidates (cached);
:class:`CostTable` holds per-option figures *derived from* such profiles: ``base[k]`` = the
memory of depth k without weight updates, ``extra[(i, r)]`` = what a weight update of conv i at
ratio r adds, measured at the smallest depth that covers conv i. When memory is additive in the
chosen mode and metric, ``base[k] + Σ extra`` equals ``compute()`` on every candidate, and the
exact solver and a fast table evaluation apply. Additivity is not assumed: it is checked on
probe candidates (:func:`check_additivity`) and on every result.

A FLOPs budget bounds :data:`FLOPS_FIGURE` (``MemoryModel.flops``); its per-option table is
built and checked the same way (``build_table(memory, memory.flops)``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import names
from ..accounting.engine import compute
from ..costs.records import Profile
from ..modes import get_mode
from ..registry import Registry
from .space import Candidate, SearchSpace


@dataclass(frozen=True)
class Metric:
    """What "memory" of a profile means: ``read(profile)``, the quantity the budget bounds, and its
    description; ``quick``: a mode's ``quick_total`` (where it has one, total = peak) stands for it."""

    read: Callable[[Profile], int]
    description: str
    quick: bool = True


METRICS: Registry[Metric] = Registry("memory metric", names=names.METRICS)
METRICS.add(
    "total",
    Metric(
        lambda p: p.totals.total_bytes,
        "Totals.total_bytes (the mode's total: weights, gradients, "
        "optimizer state, saved activations as the mode counts them)",
    ),
)
METRICS.add("peak", Metric(lambda p: p.totals.peak_bytes, "Totals.peak_bytes (the mode's peak of one training step)"))

#: what a FLOPs budget bounds: the backward FLOPs of one training step, FLOPs = 2 x MACs
FLOPS_FIGURE = (
    "Totals.backward_flops: backward of conv / linear / matmul (grad-input + grad-weight, 2 x MACs each, "
    "grad-weight of the updated fraction as the mode counts it; grad-bias 1 per output element), plus "
    "Totals.recompute_flops, their forward recomputed in the backward (recomputed segments, 0 without), "
    "over every micro-batch of the step; "
    "norm / activation / pooling / loss backward (Totals.backward_other_flops) is not counted"
)

#: ``Totals`` fields written into a scheme's ``predicted`` breakdown
BREAKDOWN = ("saved_activation_bytes", "weight_bytes", "gradient_bytes", "optimizer_bytes", "total_bytes", "peak_bytes")


class MemoryModel:
    """``compute()`` of candidates in one mode (cached); ``measure`` returns the chosen metric."""

    def __init__(
        self,
        space: SearchSpace,
        mode: str = names.SEARCH_MODE,
        metric: str = names.DEFAULT_METRIC,
        *,
        optimizer: str = names.DEFAULT_OPTIMIZER,
        frozen_bits: int = 32,
        mode_options: dict | None = None,
    ):
        METRICS.choose(metric)
        self.space = space
        self.mode = get_mode(mode).configure(**(mode_options or {}))
        self.metric = metric
        self.optimizer = optimizer
        self.frozen_bits = frozen_bits
        self._cache: dict[Candidate, Profile] = {}
        self._quick: dict[Candidate, int] = {}  # the mode's quick_total, where it has one

    @property
    def calls(self) -> int:
        """Distinct candidates costed so far."""
        return len(self._cache.keys() | self._quick.keys())

    def profile(self, cand: Candidate) -> Profile:
        prof = self._cache.get(cand)
        if prof is None:
            prof = compute(
                self.space.graph,
                self.space.to_plan(cand),
                self.mode,
                optimizer=self.optimizer,
                frozen_bits=self.frozen_bits,
                meta={"model": self.space.model},
            )
            self._cache[cand] = prof
        return prof

    def measure(self, cand: Candidate) -> int:
        if cand in self._quick:
            return self._quick[cand]
        plain = not self.space.recompute and self.space.micro_batches == 1  # the quick total knows neither
        if cand not in self._cache and METRICS[self.metric].quick and plain:
            quick = self.mode.quick_total(self.space.graph, self.space.to_plan(cand))
            if quick is not None:
                self._quick[cand] = quick
                return quick
        return METRICS[self.metric].read(self.profile(cand))

    def flops(self, cand: Candidate) -> int:
        """Backward FLOPs of one training step of ``cand``, recomputation included (:data:`FLOPS_FIGURE`);
        with micro-batches, those of all of them (the profile is one micro-batch's)."""
        totals = self.profile(cand).totals
        return (totals.backward_flops + totals.recompute_flops) * self.space.micro_batches

    def breakdown(self, cand: Candidate) -> dict[str, int]:
        totals = self.profile(cand).totals
        return {name: getattr(totals, name) for name in BREAKDOWN}


@dataclass
class CostTable:
    """Per-option memory derived from ``compute()`` (bytes of the chosen metric; or backward FLOPs
    for a FLOPs table)."""

    base: dict[int, int]  # k -> memory (FLOPs) of (k, no weights)
    extra: dict[tuple[int, float], int]  # (conv index, ratio) -> memory (FLOPs) added at the smallest covering k

    def estimate(self, cand: Candidate) -> int:
        return self.base[cand.k] + sum(self.extra[w] for w in cand.weights)


def build_table(memory: MemoryModel, measure: Callable[[Candidate], int] | None = None) -> CostTable:
    """One ``compute()`` per allowed depth and per (conv, ratio) option, of ``measure`` (default:
    ``memory.measure``, the bounded memory metric; ``memory.flops`` for a FLOPs table)."""
    space = memory.space
    measure = measure or memory.measure
    base = {k: measure(Candidate(k)) for k in space.ks}
    extra = {}
    for c in space.layers:
        k = space.min_k(c.conv_index)
        for r in c.ratios:
            extra[(c.conv_index, r)] = measure(Candidate(k, ((c.conv_index, r),))) - base[k]
    return CostTable(base, extra)


@dataclass
class Additivity:
    """Result of comparing table estimates with ``compute()`` on probe candidates."""

    additive: bool
    checked: int
    mismatches: list[tuple[str, int, int]] = field(default_factory=list)  # (candidate, estimate, computed)
    flops: Additivity | None = None  # the same check of the backward-FLOPs table (with a FLOPs budget)

    def record(self, cand: Candidate, estimate: int, computed: int) -> None:
        self.checked += 1
        if estimate != computed:
            self.additive = False
            self.mismatches.append((cand.describe(), estimate, computed))


def probe_candidates(space: SearchSpace, n_random: int = 16, seed: int = 0) -> list[Candidate]:
    """Candidates that stress additivity: at the deepest k, every option at its largest and at its
    smallest ratio (capped like the space), adjacent layer pairs, and ``n_random`` random ones."""
    rng = random.Random(seed)
    k = space.ks[-1]
    layers = [c for c in space.layers if c.conv_index >= space.first(k)]
    cap = space.max_weight_layers if space.max_weight_layers is not None else len(layers)
    probes = [
        Candidate(k, tuple((c.conv_index, c.ratios[-1]) for c in layers[-cap:] if cap)),
        Candidate(k, tuple((c.conv_index, c.ratios[0]) for c in layers[:cap])),
    ]
    if cap >= 2:
        probes += [
            Candidate(k, ((a.conv_index, a.ratios[-1]), (b.conv_index, b.ratios[-1])))
            for a, b in zip(layers, layers[1:])
        ]
    for _ in range(n_random):
        kk = rng.choice(space.ks)
        pool = [c for c in space.layers if c.conv_index >= space.first(kk)]
        chosen = rng.sample(pool, min(len(pool), rng.randint(0, cap)))
        probes.append(Candidate(kk, tuple(sorted((c.conv_index, rng.choice(c.ratios)) for c in chosen))))
    return probes


def check_additivity(
    memory: MemoryModel,
    table: CostTable,
    candidates: list[Candidate],
    measure: Callable[[Candidate], int] | None = None,
) -> Additivity:
    """Compare ``table.estimate`` with ``measure`` (default ``memory.measure``) on ``candidates``."""
    measure = measure or memory.measure
    result = Additivity(True, 0)
    for cand in candidates:
        result.record(cand, table.estimate(cand), measure(cand))
    return result
