"""The candidates of the validation stage (``memplan search --validate``,
:mod:`memplan.search.stage`): the search's scheme and more from the search, every baseline that
fits the budget (of a sized baseline, the sizes its size rule names), and the unions of two of
them that fit; each with its memory in the search's mode and metric (bytes) and the parameter
families it trains.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..api import capture, profile_captured
from ..errors import BadOption, MemplanError, SchemeError
from ..names import DEFAULT_SIZE_RULE
from ..plan import Scheme, scheme_to_plan
from ..rates import Rates, distinct
from ..strategies import changes_architecture
from .baselines import BASELINES, SIZE_RULES, Baseline, largest, sized_name
from .memory import METRICS
from .objective import OBJECTIVES
from .result import SearchResult

#: budget fractions the extra searched candidates are taken at
FRACTIONS = (1.0, 0.5, 0.25)


@dataclass(frozen=True)
class Candidate:
    """A scheme to train, with its memory in the search's mode and metric (bytes)."""

    name: str
    scheme: Scheme
    memory_bytes: int
    baseline: bool
    families: frozenset[str] = frozenset()  # the parameter families it trains (memplan.rates.FAMILIES)
    in_unions: bool = True  # False: a sized baseline's smaller size, which enters no union (union_candidates)

    def settings(self, grid: Sequence[Rates]) -> list[Rates]:
        """The distinct trainings of ``grid`` for this candidate (:func:`memplan.rates.distinct`)."""
        return distinct(grid, self.families)

    @property
    def key(self) -> str:
        """What it trains, hashed: runs of the same training share their checkpoint lines."""
        return trains_key(self.scheme)


def trains_key(scheme: Scheme) -> str:
    """16 hex digits over what ``scheme`` trains (biases, weights, norms, approximations, and the
    added modules of a scheme that has them)."""
    fields = {"bias_update", "weight_updates", "norm_modes", "activation_approx"}
    data = scheme.model_dump(mode="json", include=fields | ({"added_modules"} if scheme.added_modules else set()))
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def capture_scheme(result: SearchResult, scheme: Scheme, classes: int | None) -> Any:
    """The capture of ``result``'s model at its input shape and batch with ``scheme``'s added
    modules built (``--method sparse --scheme``: the pipeline adds them)."""
    options = {"scheme": scheme} if scheme.added_modules else None
    return capture(
        result.model, result.input_shape, batch=scheme.batch, classes=classes, method="sparse", method_options=options
    )


def searched_candidates(result: SearchResult, n: int, search: Callable[[str, int], SearchResult]) -> list[Candidate]:
    """The search's scheme, then the optimum of ``search(objective, budget_bytes)`` for every
    objective at every budget fraction, until ``n`` distinct ones (what they train) are found."""
    out = [Candidate(f"searched ({result.objective})", result.scheme, result.memory_bytes, False)]
    for fraction in FRACTIONS:
        for objective in OBJECTIVES:
            if len(out) >= n:
                return out
            if fraction == 1 and objective == result.objective:
                continue  # that search is ``result`` itself
            budget = int(result.budget_bytes * fraction)
            try:
                r = search(objective, budget)
            except MemplanError:  # below the classifier-only floor
                continue
            if r.scheme is not None and trains_key(r.scheme) not in {c.key for c in out}:
                label = f"searched ({objective}{'' if fraction == 1 else f', {fraction:g} x budget'})"
                out.append(Candidate(label, r.scheme, r.memory_bytes, False))
    return out


def memory_of(result: SearchResult, cap: Any, scheme: Scheme, options: dict[str, Any]) -> int:
    """Bytes of ``scheme`` on ``cap`` in the search's mode and metric (``options``: optimizer,
    frozen_bits, mode_options of :func:`memplan.api.profile_captured`)."""
    prof = profile_captured(cap, "sparse", mode=result.mode, scheme=scheme, **options)
    return METRICS[result.metric].read(prof)


def baseline_candidates(
    result: SearchResult, cap: Any, options: dict[str, Any], sizes: str = DEFAULT_SIZE_RULE
) -> list[Candidate]:
    """Every baseline that fits ``result``'s budget, costed like the search costs (``options``:
    optimizer, frozen_bits, mode_options of :func:`memplan.api.profile_captured`); of a sized
    baseline, the sizes that the size rule ``sizes`` names (:func:`sized_candidates`). ``cap``: the
    plain model's capture; a baseline that changes the architecture (TinyTL's lite residual
    branches) is planned on a capture with its transform."""
    out = []
    memory = lambda own, scheme: memory_of(result, own, scheme, options)  # noqa: E731
    for name, baseline in BASELINES.items():
        try:
            if baseline.sized is not None:
                out += sized_candidates(
                    name, baseline, cap.graph, lambda s: memory(cap, s), result.budget_bytes, result.mode, sizes
                )
                continue
            own = cap
            if changes_architecture(baseline.method, {}):
                shape, batch = cap.graph.input_shape[1:], cap.graph.batch
                own = capture(result.model, shape, batch=batch, classes=cap.classes, method=baseline.method)
            scheme = Scheme.from_plan(own.graph, baseline.plan(own.graph), model=result.model, mode=result.mode)
        except (SchemeError, BadOption):  # not a point of this model's space (e.g. no blocks)
            continue
        bytes_ = memory(own, scheme)
        if bytes_ <= result.budget_bytes:
            out.append(Candidate(name, scheme, bytes_, True))
    return out


def sized_candidates(
    name: str,
    baseline: Baseline,
    graph: Any,
    memory: Callable[[Scheme], int],
    budget_bytes: int,
    mode: str,
    sizes: str = DEFAULT_SIZE_RULE,
) -> list[Candidate]:
    """The sized ``baseline``'s (registered as ``name``) candidates on ``graph`` at
    ``budget_bytes``, named ``name (k=K)``: its largest plan whose ``memory(scheme)`` (bytes,
    costed in ``mode``) fits (:func:`memplan.search.baselines.largest`), then the smaller sizes
    that the size rule ``sizes`` (:data:`memplan.search.baselines.SIZE_RULES`) names from it, which
    enter no union of two candidates; empty when not even k = 1 fits."""
    rule = SIZE_RULES.choose(sizes)
    schemes: dict[int, Scheme] = {}
    costs: dict[int, int] = {}

    def cost(k: int) -> int:
        if k not in costs:
            schemes[k] = Scheme.from_plan(graph, baseline.plan(graph, k), model=graph.model_name, mode=mode)
            costs[k] = memory(schemes[k])
        return costs[k]

    top = largest(lambda k: cost(k) <= budget_bytes, baseline.sizes(graph))
    out = []
    for k in rule(top) if top else []:
        bytes_ = cost(k)
        out.append(Candidate(sized_name(name, k), schemes[k], bytes_, True, in_unions=k == top))
    return out


def sized_candidate(
    name: str, baseline: Baseline, graph: Any, memory: Callable[[Scheme], int], budget_bytes: int, mode: str
) -> Candidate | None:
    """The sized ``baseline``'s largest candidate that fits ``budget_bytes`` (:func:`sized_candidates`
    under the size rule ``largest``); None when not even k = 1 fits."""
    found = sized_candidates(name, baseline, graph, memory, budget_bytes, mode, "largest")
    return found[0] if found else None


def union(a: Scheme, b: Scheme) -> Scheme | None:
    """The scheme that trains what ``a`` and ``b`` train: the deeper bias update, each conv's
    larger weight update, both norm modes (None when they set one norm differently, or either adds
    modules)."""
    if a.added_modules or b.added_modules:
        return None
    if any(a.norm_modes[n] != m for n, m in b.norm_modes.items() if n in a.norm_modes):
        return None
    weights = {}
    for w in [*a.weight_updates, *b.weight_updates]:
        if w.layer not in weights or weights[w.layer].ratio < w.ratio:
            weights[w.layer] = w
    return a.model_copy(
        update={
            "bias_update": max(a.bias_update, b.bias_update),
            "weight_updates": sorted(weights.values(), key=lambda w: w.conv_index),
            "norm_modes": {**a.norm_modes, **b.norm_modes},
            "activation_approx": sorted({*a.activation_approx, *b.activation_approx}),
        }
    )


def union_candidates(
    result: SearchResult, found: Sequence[Candidate], cap: Any, options: dict[str, Any]
) -> list[Candidate]:
    """Every union of two candidates (a hand-picked baseline extended by what another one or the
    search trains: MobileTL + every bias) that trains something neither does alone and fits the
    budget, costed like the search costs; a sized baseline's smaller sizes enter none."""
    known = {c.key for c in found}
    joined = [c for c in found if c.in_unions]
    out = []
    for i, a in enumerate(joined):
        for b in joined[i + 1 :]:
            u = union(a.scheme, b.scheme)
            if u is None or trains_key(u) in known:
                continue
            known.add(trains_key(u))
            memory = memory_of(result, cap, u, options)
            if memory <= result.budget_bytes:
                out.append(Candidate(f"{a.name} + {b.name}", u, memory, False))
    return out


def dedupe(candidates: Sequence[Candidate]) -> list[Candidate]:
    """One candidate per training (a searched scheme that is a baseline takes the baseline's name)."""
    by_key: dict[str, Candidate] = {}
    for c in sorted(candidates, key=lambda c: not c.baseline):
        by_key.setdefault(c.key, c)
    return list(by_key.values())


def collect_candidates(
    result: SearchResult,
    n: int,
    search: Callable[[str, int], SearchResult],
    options: dict[str, Any],
    classes: int | None,
    sizes: str = DEFAULT_SIZE_RULE,
) -> list[Candidate]:
    """The searched candidates and the baselines that fit (of a sized baseline, the sizes the size
    rule ``sizes`` names), one per training, cheapest first (a tie on validation goes to the
    cheaper one), each with the parameter families it trains."""
    if n < 1:
        raise BadOption(f"--validate needs at least 1 searched candidate, got {n}")
    cap = capture(result.model, result.input_shape, batch=result.scheme.batch, classes=classes)
    found = dedupe(searched_candidates(result, n, search) + baseline_candidates(result, cap, options, sizes))
    found += union_candidates(result, found, cap, options)
    out = []
    for c in found:
        graph = capture_scheme(result, c.scheme, classes).graph if c.scheme.added_modules else cap.graph
        out.append(replace(c, families=scheme_to_plan(graph, c.scheme).families(graph)))
    return sorted(out, key=lambda c: c.memory_bytes)
