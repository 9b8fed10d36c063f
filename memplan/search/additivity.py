"""The additivity check of the 256KB paper's Figure 5(c): does the search's objective, the summed
Δacc of a scheme, predict the accuracy that training the scheme end to end really gives?

``validate_profile`` draws random sparse-update schemes that fit several memory budgets (memory:
memplan's cost model in the chosen mode at the profile's costing resolution), optionally adds
the searched optimum of each budget, trains every scheme end to end from the profile's setup
(``memplan.contrib.final.Evaluator``: same backbone, data, linear-probe head and protocol) and
measures its accuracy on the profile's **validation** split (``split``; the check is made while
choosing, so it never looks at test), over at least 4 seeds of its own (default 100-103), and
the classifier-only scheme as the reference. Each scheme is trained once: a draw that repeats a
scheme already picked (at this budget or another) is drawn again. The real gain of a scheme is
its accuracy minus the classifier-only one (accuracy points). Pearson and
Spearman correlations between summed Δacc and real gain come with percentile bootstrap
confidence intervals over the schemes (resampled with replacement). The statistics, with the
seed-noise ceiling (over the stable schemes: a collapsed run says nothing about how seeds rank
the others) and the schemes that collapsed, are in ``memplan.search.agreement``.

Random schemes: a bias depth k drawn uniformly from the profile's depths > 0, every conv in
range given a weight update with probability d (d drawn uniformly per scheme) at a uniformly
drawn ratio; weight updates are then dropped at random until the memory fits the budget (a
depth whose bias-only memory exceeds the budget is redrawn).
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..api import capture
from ..contrib.checkpoint import Checkpoint
from ..contrib.executors import check as check_execution
from ..contrib.final import Evaluator, Result
from ..contrib.profile import DELTA_ACC_UNITS, ContribProfile, is_delta_acc, load_profile
from ..errors import BadOption
from ..io import write_text
from ..models import recorded_shape
from ..names import SEARCH_MODE
from ..options import with_keywords
from ..units import parse_bytes
from .agreement import CONFIDENCE, correlations, noise_readings
from .exact import solve_exact
from .memory import MemoryModel, build_table, check_additivity, probe_candidates
from .objective import OBJECTIVES
from .options import ValidateOptions
from .space import Candidate, SearchSpace, build_space, contributions_of, profile_hash

#: draws of a random scheme before giving up on one that was not picked yet
REDRAWS = 50


@dataclass
class Point:
    """One trained scheme: its memory, summed Δacc, accuracy per seed and gain over classifier-only."""

    kind: str  # "random" | "searched"
    budget_bytes: int
    candidate: str
    bias_update: int
    weights: list[list[float]]  # [conv index, ratio]
    memory_bytes: int
    summed: float  # the profile's entries summed (AdditivityCheck.units)
    accuracy: list[float]  # per seed, on the check's split (validation by default), %
    gain: float  # mean accuracy - classifier-only mean accuracy, points
    objectives: dict[str, float] = field(default_factory=dict)  # the scheme's summed gains per search objective


@dataclass
class AdditivityCheck:
    """Result of :func:`validate_profile` (accuracy points; bytes)."""

    model: str
    profile: str
    mode: str
    costing_input_shape: list[int]
    description: str
    reference_accuracy: list[float]  # classifier-only, the check's split, per seed
    points: list[Point]
    pearson: float
    pearson_ci: tuple[float, float]
    spearman: float
    spearman_ci: tuple[float, float]
    bootstrap: int
    confidence: float = CONFIDENCE
    #: objective -> its correlations with the real gain (pearson, spearman and their CIs), as above
    by_objective: dict[str, dict[str, Any]] = field(default_factory=dict)
    units: str = DELTA_ACC_UNITS  # what the profile's entries (a point's ``summed``) are
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    #: the measurement's own bound on the correlation (``agreement.ceiling``), over the stable schemes (none
    #: collapsed); None with one seed or < 3 such schemes
    ceiling: dict[str, Any] | None = None
    #: when some schemes collapsed (a seed ``COLLAPSE_POINTS`` below classifier only): the correlations
    #: (as above) and the ceiling over the other ``schemes`` alone; None otherwise
    stable: dict[str, Any] | None = None

    @property
    def is_delta_acc(self) -> bool:
        return is_delta_acc(self.units)

    def to_json(self) -> str:
        import json

        return json.dumps(asdict(self), indent=1) + "\n"


def draw(
    space: SearchSpace, memory: Callable[[Candidate], int], budget: int, rng: random.Random, tries: int = 200
) -> Candidate | None:
    """One random candidate that fits ``budget`` (module docstring); None if none was found."""
    ks = [k for k in space.ks if k > 0]
    for _ in range(tries):
        k = rng.choice(ks)
        if memory(Candidate(k)) > budget:
            continue
        pool = [c for c in space.layers if c.conv_index >= space.first(k)]
        density = rng.random()
        chosen = [(c.conv_index, rng.choice(c.ratios)) for c in pool if rng.random() < density]
        if space.max_weight_layers is not None:
            rng.shuffle(chosen)
            chosen = chosen[: space.max_weight_layers]
        while chosen and memory(Candidate(k, tuple(sorted(chosen)))) > budget:
            chosen.pop(rng.randrange(len(chosen)))
        return Candidate(k, tuple(sorted(chosen)))
    return None


@with_keywords(ValidateOptions, positional=("budgets",))
def validate_profile(
    profile: str | os.PathLike | ContribProfile, opts: ValidateOptions | None = None
) -> AdditivityCheck:
    """Train ``per_budget`` random schemes per budget (and the searched optimum of each with
    ``searched``) end to end and correlate their summed Δacc with their real accuracy gain
    (module docstring). ``opts``: the :class:`~memplan.search.options.ValidateOptions`, or its
    options by name as keywords, ``budgets`` also second by position (default: 4 spread over the
    profile's range, :func:`default_budgets`). ``seeds``: training seeds (at least 4); ``split``:
    where the schemes are measured (validation, or test).
    ``checkpoint``: a JSONL file of the trained schemes (one fsync'ed line each); a rerun with the
    same options skips them. The summed gains under every search objective
    (``memplan.search.objective``) the profile allows are correlated too (``by_objective``)."""
    t0 = time.perf_counter()
    o = opts or ValidateOptions()
    prof = profile if isinstance(profile, ContribProfile) else load_profile(profile)
    source = "(given)" if isinstance(profile, ContribProfile) else str(profile)
    budgets = default_budgets(prof, o.mode) if o.budgets is None else o.budgets
    if o.per_budget < 0 or not budgets:
        raise BadOption("give at least one budget and per_budget >= 0")
    check_execution(o.workers, o.executor, o.address)
    budget_bytes = sorted({parse_bytes(b) for b in budgets})
    contributions = contributions_of(prof, f"contribution profile {source}")
    cap = capture(prof.model, costing_shape(prof), batch=1, classes=contributions.classes)
    space = build_space(cap.graph, contributions, model=cap.name)
    memory = MemoryModel(space, o.mode, optimizer=contributions.optimizer)
    picks = _picks(space, memory, budget_bytes, o)
    if len(picks) < 3:  # before any training: a correlation needs three schemes
        raise BadOption(
            f"{len(picks)} scheme(s) fit the budgets; a correlation needs at least 3",
            "raise --per-budget or give more budgets",
        )
    mode, bootstrap, seed = o.mode, o.bootstrap, o.seed
    spaces = _objective_spaces(cap.graph, contributions)
    evaluator = Evaluator(prof, seeds=o.seeds, threads=o.threads, device=o.device, split=o.split)
    say = o.progress or (lambda text: None)
    ckpt, done = _checkpoint(o.checkpoint, prof, evaluator, mode, budget_bytes, o.per_budget, o.searched, seed)
    schemes = [("reference", Candidate(0))] + [(f"{kind}|{b}", cand) for kind, b, cand in picks]
    _train(evaluator, space, o, ckpt, done, schemes, say)
    ref = _result(done, "reference", Candidate(0))
    say(f"classifier only: {ref.mean:.2f}%")
    points = []
    for kind, b, cand in picks:
        r = _result(done, f"{kind}|{b}", cand)
        points.append(
            Point(
                kind,
                b,
                cand.describe(),
                cand.k,
                [[i, q] for i, q in cand.weights],
                memory.measure(cand),
                space.value(cand),
                r.accuracy,
                r.mean - ref.mean,
                {name: sp.value(cand) for name, sp in spaces.items()},
            )
        )
        say(
            f"{kind} {cand.describe()} ({points[-1].memory_bytes} B <= {b} B): summed "
            f"{points[-1].summed:+.4g}, {o.split} {r.mean:.2f}% (gain {points[-1].gain:+.2f})"
        )
    stats = correlations([p.summed for p in points], [p.gain for p in points], bootstrap=bootstrap, seed=seed)
    by_objective = {
        name: correlations(
            [p.objectives[name] for p in points], [p.gain for p in points], bootstrap=bootstrap, seed=seed
        )
        for name in spaces
    }
    bound, stable, notes = noise_readings(ref.accuracy, points, bootstrap, seed)
    if o.split == "test":
        notes.append("measured on the test split: a check made while choosing should measure on validation")
    if prof.evaluated_on != "validation":
        notes.append("the profile measured Δacc on the test split: the check is not independent of it")
    if len(points) < 12:
        notes.append(f"only {len(points)} schemes: the intervals are wide")
    return AdditivityCheck(
        prof.model,
        source,
        mode,
        list(cap.graph.input_shape[1:]),
        evaluator.describe(),
        ref.accuracy,
        points,
        stats["pearson"],
        stats["pearson_ci"],
        stats["spearman"],
        stats["spearman_ci"],
        bootstrap,
        by_objective=by_objective,
        units=prof.units,
        seconds=round(time.perf_counter() - t0, 1),
        notes=notes,
        ceiling=bound,
        stable=stable,
    )


def _picks(space: SearchSpace, memory: MemoryModel, budget_bytes: list[int], o: ValidateOptions) -> list[Any]:
    """(kind, budget, candidate) of the schemes the check trains: per budget the searched optimum
    (where memory is additive and ``searched``) and ``per_budget`` random schemes that fit."""
    table = build_table(memory)
    additive = check_additivity(memory, table, probe_candidates(space, seed=o.seed)).additive
    rng = random.Random(o.seed)
    picks: list[tuple[str, int, Candidate]] = []
    seen = {Candidate(0).describe()}  # the reference, classifier only, is trained apart
    for b in budget_bytes:
        if o.searched and additive:
            best = solve_exact(space, table, b)
            if best is not None and best.candidate.describe() not in seen:
                seen.add(best.candidate.describe())
                picks.append(("searched", b, best.candidate))
        for _ in range(o.per_budget):
            cand = _draw_new(space, memory.measure, b, rng, seen)
            if cand is not None:
                seen.add(cand.describe())
                picks.append(("random", b, cand))
    return picks


def _draw_new(
    space: SearchSpace, memory: Callable[[Candidate], int], budget: int, rng: random.Random, seen: set[str]
) -> Candidate | None:
    """A random candidate that fits ``budget`` (:func:`draw`) and is none of ``seen`` (its
    ``describe()``), drawn again up to ``REDRAWS`` times; None if none was found."""
    for _ in range(REDRAWS):
        cand = draw(space, memory, budget, rng)
        if cand is None or cand.describe() not in seen:
            return cand
    return None


def _objective_spaces(graph: Any, contributions: Any) -> dict[str, SearchSpace]:
    """The search space under every objective the profile allows (those needing standard errors
    are left out when it has none)."""
    out = {}
    for name in OBJECTIVES:
        try:
            out[name] = build_space(graph, contributions, objective=name)
        except BadOption:
            continue
    return out


def _checkpoint(
    path: str | os.PathLike | None,
    prof: ContribProfile,
    evaluator: Evaluator,
    mode: str,
    budgets: list[int],
    per_budget: int,
    searched: bool,
    seed: int,
) -> tuple[Checkpoint | None, dict[str, dict[str, Any]]]:
    if path is None:
        return None, {}
    identity = {
        "profile": profile_hash(prof),
        "seeds": list(evaluator.protocol.seeds),
        "mode": mode,
        "budgets": budgets,
        "per_budget": per_budget,
        "searched": searched,
        "seed": seed,
        "split": evaluator.split,
    }
    ckpt = Checkpoint(Path(path), identity)
    done = ckpt.finished()
    ckpt.writable()  # before any run trains
    if done is None:
        ckpt.start()
    return ckpt, done or {}


def _train(
    evaluator: Evaluator,
    space: SearchSpace,
    o: ValidateOptions,
    ckpt: Checkpoint | None,
    done: dict[str, dict[str, Any]],
    schemes: list[tuple[str, Candidate]],
    say: Callable[[str], None],
) -> None:
    """Train every ``(key, candidate)`` not in ``done`` (on ``o.workers`` workers of ``o.executor``)
    and record each, in ``done`` and the checkpoint, as it finishes."""
    todo = {f"{key}|{cand.describe()}": cand for key, cand in schemes}
    todo = {rid: cand for rid, cand in todo.items() if rid not in done}
    jobs = [(rid, space.to_scheme(cand, mode=o.mode)) for rid, cand in todo.items()]
    run = {"workers": o.workers, "executor": o.executor, "address": o.address}
    for n, r in enumerate(evaluator.schemes(jobs, **run), 1):
        done[r.label] = {"id": r.label, "accuracy": r.accuracy, "trainable_params": r.trainable_params, "s": r.seconds}
        if ckpt is not None:
            ckpt.append(done[r.label])
        say(f"trained {n}/{len(jobs)}: {r.label.split('|')[0]} {todo[r.label].describe()}, {r.mean:.2f}%")


def _result(done: dict[str, dict[str, Any]], key: str, cand: Candidate) -> Result:
    rec = done[f"{key}|{cand.describe()}"]
    return Result(cand.describe(), rec["accuracy"], rec["trainable_params"], rec["s"])


def save(check: AdditivityCheck, path: str | os.PathLike) -> None:
    """Write the check as JSON, atomically."""
    write_text(path, check.to_json())


def costing_shape(profile: ContribProfile) -> tuple[int, ...]:
    """The per-sample input the profile's schemes are costed at: its runs' shape (their channels) at
    its costing resolution."""
    return recorded_shape(profile.input_shape, profile.costing_resolution)


def default_budgets(profile: ContribProfile, mode: str = SEARCH_MODE, n: int = 4) -> list[int]:
    """``n`` budgets spaced geometrically between twice the cheapest bias-only memory and half the
    memory of the deepest bias depth with every weight at ratio 1 (bytes)."""
    contributions = contributions_of(profile)
    cap = capture(profile.model, costing_shape(profile), batch=1, classes=contributions.classes)
    space = build_space(cap.graph, contributions, model=cap.name)
    memory = MemoryModel(space, mode, optimizer=contributions.optimizer)
    k = space.ks[-1]
    lo = 2 * memory.measure(Candidate(min(x for x in space.ks if x > 0)))
    hi = memory.measure(Candidate(k, tuple((c.conv_index, c.ratios[-1]) for c in space.layers))) / 2
    hi = max(hi, 2 * lo)
    return [int(round(lo * (hi / lo) ** (i / (n - 1)))) for i in range(n)] if n > 1 else [int(lo)]


def summary(check: AdditivityCheck) -> list[str]:
    """Plain-text lines of the result."""
    ref = statistics.fmean(check.reference_accuracy)
    lines = [
        check.description,
        f"classifier only (reference): {ref:.2f}% accuracy",
        f"{len(check.points)} schemes ({sum(p.kind == 'random' for p in check.points)} random, "
        f"{sum(p.kind == 'searched' for p in check.points)} searched), memory in mode {check.mode} at "
        f"{'x'.join(map(str, check.costing_input_shape))}",
        f"Pearson r = {check.pearson:+.3f} ({check.confidence:.0%} CI {check.pearson_ci[0]:+.3f} .. "
        f"{check.pearson_ci[1]:+.3f}); Spearman rho = {check.spearman:+.3f} (CI {check.spearman_ci[0]:+.3f} .. "
        f"{check.spearman_ci[1]:+.3f}); {check.bootstrap} bootstrap resamples",
    ]
    if check.ceiling is not None:
        c = check.ceiling
        lines.append(
            f"ceiling from seed noise: seeds agree at Spearman {c['seed_spearman']:+.3f} over {c['schemes']} "
            f"distinct stable schemes; reliability of the {c['seeds']}-seed mean {c['reliability']:.3f}, so any "
            f"predictor correlates at most about {c['ceiling']:.3f}"
        )
    if check.stable is not None:
        c, bound = check.stable, check.stable["ceiling"]
        lines.append(
            f"without the collapsed schemes ({c['schemes']} left): Spearman {c['spearman']:+.3f} (CI "
            f"{c['spearman_ci'][0]:+.3f} .. {c['spearman_ci'][1]:+.3f})"
            + (f", ceiling from seed noise {bound['ceiling']:.3f}" if bound else "")
        )
    for name, c in check.by_objective.items():
        p, sp = c["pearson_ci"], c["spearman_ci"]
        if math.isnan(c["pearson"]):
            lines.append(f"  objective {name}: undefined (every scheme sums to the same value under it)")
            continue
        lines.append(
            f"  objective {name}: Pearson {c['pearson']:+.3f} (CI {p[0]:+.3f} .. {p[1]:+.3f}), "
            f"Spearman {c['spearman']:+.3f} (CI {sp[0]:+.3f} .. {sp[1]:+.3f})"
        )
    return lines + [f"note: {n}" for n in check.notes]
