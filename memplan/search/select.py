"""The validation stage of ``memplan search --validate N``: train before choosing.

The search's optimum is the optimum of a model of accuracy (summed profile entries). This stage
trains, on the held-aside **validation** split of the profile's own setup (same backbone, data,
linear-probe head, optimizer, epochs and batch: ``memplan.contrib.setup.setup_of``), the
candidates:

* the search's scheme and up to N - 1 more from the search (the optimum under every objective,
  then at 1/2 and 1/4 of the budget), distinct in what they train;
* every baseline of :data:`memplan.search.baselines.BASELINES` whose memory (the search's mode,
  metric, optimizer and options) fits the budget;

each at every point of a small learning-rate grid, by successive halving over the validation
seeds (:mod:`memplan.contrib.halving`). A point is one rate for every trained tensor or rates
per parameter family (:class:`memplan.rates.Rates`): the default grid is one rate in {5e-4,
2.5e-3, 1.25e-2} for everything, and the biases, norms and head at 1.25e-2 with the weights at
5e-4 or 2.5e-3 (schemes that mix biases with early conv weights diverge at the rate the biases
need). A candidate gets each distinct training only once: points that differ only in a family
it does not train are one. Baselines are never halved away, so the returned scheme's
validation accuracy is at least that of every baseline that fits, on the same seeds and grid.
The scheme records the rates and optimizer it was validated with (``training``) and its
validation accuracy ± SE with the runners-up (``validation``). Runs are checkpointed (JSONL,
one line per finished run, keyed by what the candidate trains, its rates and seed, so budgets
and reruns share them): an interrupted stage resumes where it was.
Runs execute one after another in this process, or each rung's runs at once on contribution
analysis's executors (``Stage.workers``: a local process pool or Ray).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..api import capture, profile_captured
from ..contrib.checkpoint import Checkpoint
from ..contrib.executors import EXECUTORS, execute, num_threads
from ..contrib.halving import Halving, planned_runs, successive_halving
from ..contrib.profile import load_profile
from ..contrib.runner import Context, SchemeRun, Worker, linear_probe
from ..contrib.setup import setup_of
from ..errors import BadOption, MemplanError, SchemeError
from ..plan import Scheme, Training, Validation, scheme_to_plan
from ..rates import Rates
from .baselines import BASELINES
from .memory import METRICS
from .objective import OBJECTIVES
from .result import SearchResult

#: the learning-rate grid of the stage (module docstring)
DEFAULT_LRS = tuple(map(Rates.parse, ("5e-4", "2.5e-3", "1.25e-2", "1.25e-2/weight=5e-4", "1.25e-2/weight=2.5e-3")))
DEFAULT_SEEDS = (0, 1)
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

    def settings(self, grid: Sequence[Rates]) -> list[Rates]:
        """The distinct trainings of ``grid`` for this candidate (rates of untrained families dropped)."""
        return list(dict.fromkeys(r.restrict(self.families) for r in grid))

    @property
    def key(self) -> str:
        """What it trains, hashed: runs of the same training share their checkpoint lines."""
        return trains_key(self.scheme)


@dataclass
class Validated:
    """The validation stage's outcome: the chosen scheme (with ``training`` and ``validation``)."""

    scheme: Scheme
    chosen: Candidate
    candidates: list[Candidate]
    halving: Halving
    lrs: list[Rates]
    seeds: list[int]
    runs_trained: int  # runs trained now (the rest came from the checkpoint)
    seconds: float
    checkpoint: str

    def table(self) -> list[dict[str, Any]]:
        """One row per candidate: its best configuration (rate, accuracy %, SE, seeds), memory."""
        rows = []
        for c in self.candidates:
            best = self.halving.best_of(c.key)
            rows.append(
                {
                    "name": c.name,
                    "baseline": c.baseline,
                    "memory_bytes": c.memory_bytes,
                    "lr": None if best is None else str(best.lr),
                    "accuracy": None if best is None else round(best.mean, 3),
                    "se": None if best is None else round(best.se, 3),
                    "seeds": [] if best is None else sorted(best.accuracy),
                }
            )
        return sorted(rows, key=lambda r: -(r["accuracy"] if r["accuracy"] is not None else -math.inf))


def trains_key(scheme: Scheme) -> str:
    """16 hex digits over what ``scheme`` trains (biases, weights, norms, approximations)."""
    data = scheme.model_dump(mode="json", include={"bias_update", "weight_updates", "norm_modes", "activation_approx"})
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


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


def baseline_candidates(result: SearchResult, cap: Any, options: dict[str, Any]) -> list[Candidate]:
    """Every baseline that fits ``result``'s budget, costed like the search costs (``options``:
    optimizer, frozen_bits, mode_options of :func:`memplan.api.profile_captured`)."""
    out = []
    for name, make in BASELINES.items():
        try:
            scheme = Scheme.from_plan(cap.graph, make(cap.graph), model=result.model, mode=result.mode)
        except (SchemeError, BadOption):  # not a point of this model's space (e.g. no blocks)
            continue
        prof = profile_captured(cap, "sparse", mode=result.mode, scheme=scheme, **options)
        memory = METRICS[result.metric].read(prof)
        if memory <= result.budget_bytes:
            out.append(Candidate(name, scheme, memory, True))
    return out


def dedupe(candidates: Sequence[Candidate]) -> list[Candidate]:
    """One candidate per training (a searched scheme that is a baseline takes the baseline's name)."""
    by_key: dict[str, Candidate] = {}
    for c in sorted(candidates, key=lambda c: not c.baseline):
        by_key.setdefault(c.key, c)
    return list(by_key.values())


class ProfileTrainer:
    """Trains candidates from a profile's setup on its validation split (the linear probe first, as
    contribution analysis does), each run checkpointed as one JSONL line keyed by what the
    candidate trains, its rates and seed. ``trainer(candidate, rates, seed)`` -> accuracy, % (NaN:
    diverged); ``trainer.prefetch(rung)`` trains a rung's missing runs on ``workers`` workers of
    ``executor`` (contribution analysis's local process pool or Ray: ``memplan.contrib.executors``)
    before the schedule reads them. Any object with this call and these attributes can stand in
    (the transfer benchmark trains through its own checkpoint)."""

    def __init__(self, profile_path: str | Path, checkpoint_dir: str | Path, stage: Stage):
        self.stage = stage
        with num_threads(stage.threads):
            profile = load_profile(profile_path)
            setup = setup_of(profile)
            self.protocol = protocol = profile.protocol
            folder = Path(checkpoint_dir)
            folder.mkdir(parents=True, exist_ok=True)
            identity = {**setup.identity(), "protocol": protocol.identity(exclude={"seeds"})}
            self.ckpt = Checkpoint(folder / "validate.runs.jsonl", identity)
            done = self.ckpt.finished()
            if done is None:
                self.ckpt.start()
            self.done = done or {}
            linear_probe(setup.net, setup.head, setup.task.validation_task(), protocol)
        self.ctx = Context(setup.name, setup.net, setup.task.validation_task(), protocol, True, stage.threads)
        self.key = f"validate:{setup.name}:{identity['backbone'] if 'backbone' in identity else ''}"
        self.worker: Worker | None = None  # this process's, made on first use
        self.optimizer, self.epochs, self.batch_size = protocol.optimizer, protocol.epochs, protocol.batch_size
        self.data = setup.task.description.split(" [")[0] + " (validation split)"
        self.classifier = setup.head
        self.checkpoint = str(self.ckpt.path)
        self.trained = 0

    @staticmethod
    def run_id(candidate: Candidate, rates: Rates, seed: int) -> str:
        return f"{candidate.key}|{rates}|{seed}"

    def _record(self, rec: dict[str, Any]) -> None:
        self.done[rec["id"]] = rec
        self.ckpt.append(rec)
        self.trained += 1

    def prefetch(self, rung: Sequence[tuple[Candidate, Rates, int]]) -> None:
        """Train the runs of ``rung`` not in the checkpoint, on the stage's workers (one worker: nothing
        here, each run trains when it is read)."""
        jobs = [SchemeRun(self.run_id(c, r, s), c.scheme, r, s) for c, r, s in rung]
        jobs = [j for j in dict((j.id, j) for j in jobs).values() if j.id not in self.done]
        if self.stage.workers == 1 or not jobs:
            return
        st = self.stage
        for rec in execute(self.ctx, jobs, workers=st.workers, executor=st.executor, address=st.address, key=self.key):
            self._record(rec)

    def __call__(self, candidate: Candidate, rates: Rates, seed: int) -> float:
        rid = self.run_id(candidate, rates, seed)
        if rid not in self.done:
            with num_threads(self.stage.threads):
                if self.worker is None:
                    self.worker = Worker(self.ctx)
                self._record(SchemeRun(rid, candidate.scheme, rates, seed).run_on(self.worker))
        return self.done[rid]["accuracy"]


def collect_candidates(
    result: SearchResult,
    n: int,
    search: Callable[[str, int], SearchResult],
    options: dict[str, Any],
    classes: int | None,
) -> list[Candidate]:
    """The searched candidates and the baselines that fit, one per training, cheapest first (a tie
    on validation goes to the cheaper one), each with the parameter families it trains."""
    if n < 1:
        raise BadOption(f"--validate needs at least 1 searched candidate, got {n}")
    cap = capture(result.model, result.input_shape, batch=result.scheme.batch, classes=classes)
    found = searched_candidates(result, n, search) + baseline_candidates(result, cap, options)
    found = [replace(c, families=scheme_to_plan(cap.graph, c.scheme).families(cap.graph)) for c in dedupe(found)]
    return sorted(found, key=lambda c: c.memory_bytes)


def choose(  # the stage's schedule, one keyword each
    candidates: Sequence[Candidate],
    trainer: Any,
    *,
    lrs: Sequence[Rates] = DEFAULT_LRS,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    budget_bytes: int | None = None,
    on_start: Callable[[int], None] | None = None,
    on_run: Callable[[], None] | None = None,
) -> Validated:
    """Successive halving of every candidate at each of its :meth:`Candidate.settings` of ``lrs``
    over ``seeds`` with ``trainer`` (baselines protected); the winner as a scheme with
    ``training`` and ``validation`` filled in."""
    if len(set(seeds)) != len(seeds) or not seeds or not lrs:
        raise BadOption("the validation stage needs distinct seeds and at least one learning rate")
    t0 = time.perf_counter()
    lrs = [Rates.of(r) for r in lrs]
    by_key = {c.key: c for c in candidates}
    settings = {c.key: c.settings(lrs) for c in candidates}
    if on_start is not None:
        n_protected = sum(c.baseline for c in candidates)
        n_configs = sum(map(len, settings.values()))
        on_start(planned_runs(n_configs, len(seeds)) + n_protected * (len(seeds) - 1))
    prefetch = getattr(trainer, "prefetch", None)
    halving = successive_halving(
        list(by_key),
        settings,
        list(seeds),
        lambda key, lr, seed: trainer(by_key[key], lr, seed),
        protected=[c.key for c in candidates if c.baseline],
        on_run=on_run,
        on_rung=None if prefetch is None else lambda rung: prefetch([(by_key[k], r, s) for k, r, s in rung]),
    )
    if halving.best is None:
        raise MemplanError("every candidate diverged at every learning rate of the validation stage", "widen the rates")
    chosen = by_key[halving.best.candidate]
    validated = Validated(
        chosen.scheme, chosen, list(candidates), halving, list(lrs), list(seeds), 0, 0.0, trainer.checkpoint
    )
    rates: Rates = halving.best.lr
    training = Training(
        optimizer=trainer.optimizer,
        lr=rates.classifier,
        epochs=trainer.epochs,
        batch_size=trainer.batch_size,
        rates={} if rates.single else {f: v for f, v in rates.as_dict().items() if f in chosen.families},
        classifier=trainer.classifier,
    )
    validation = Validation(
        name=chosen.name,
        accuracy=round(halving.best.mean, 3),
        se=round(halving.best.se, 3),
        seeds=sorted(halving.best.accuracy),
        data=trainer.data,
        runners_up=[r for r in validated.table() if r["name"] != chosen.name],
    )
    update: dict[str, Any] = {"training": training, "validation": validation}
    if budget_bytes is not None:
        update["budget_bytes"] = budget_bytes
    validated.scheme = chosen.scheme.model_copy(update=update)
    validated.runs_trained, validated.seconds = trainer.trained, time.perf_counter() - t0
    return validated


@dataclass(frozen=True)
class Stage:
    """The validation stage's schedule: the learning-rate grid (module docstring), the seeds (one
    rung each), the checkpoint folder and torch threads."""

    lrs: tuple[Rates, ...] = DEFAULT_LRS
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    checkpoint_dir: str | Path = ".memplan-validate"
    threads: int = 1  # torch threads per worker
    workers: int = 1  # runs of a rung trained at once (1: one after another in this process)
    executor: str = "process"  # memplan.contrib.executors: a local process pool or ray
    address: str | None = None  # a Ray cluster (executor ray)

    def __post_init__(self) -> None:
        if not self.lrs:
            raise BadOption("the validation stage needs at least one learning rate")
        if not isinstance(self.workers, int) or self.workers < 1:
            raise BadOption(f"the validation stage's workers must be a positive integer, got {self.workers!r}")
        EXECUTORS.choose(self.executor)
        object.__setattr__(self, "lrs", tuple(Rates.of(r) for r in self.lrs))
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise BadOption(f"the validation stage's seeds must be distinct, got {list(self.seeds)}")


def validate_search(
    result: SearchResult,
    n: int,
    search: Callable[[str, int], SearchResult],
    *,
    stage: Stage = Stage(),
    options: dict[str, Any] | None = None,
    on_start: Callable[[int], None] | None = None,
    on_run: Callable[[], None] | None = None,
) -> Validated:
    """Run the stage (module docstring) on ``result`` (a search over a profile that records its
    setup). ``search(objective, budget_bytes)``: the same search under another objective or budget.
    ``options``: how baselines are costed (``profile_captured``'s optimizer, frozen_bits,
    mode_options: the search's). ``on_start(total)`` / ``on_run()``: progress."""
    if result.profile_path is None:
        raise BadOption("the validation stage trains from the profile's setup: search with a profile file")
    trainer = ProfileTrainer(result.profile_path, stage.checkpoint_dir, stage)
    classes = load_profile(result.profile_path).dataset.get("classes")
    candidates = collect_candidates(result, n, search, options or {}, classes)
    return choose(
        candidates,
        trainer,
        lrs=stage.lrs,
        seeds=stage.seeds,
        budget_bytes=result.budget_bytes,
        on_start=on_start,
        on_run=on_run,
    )
