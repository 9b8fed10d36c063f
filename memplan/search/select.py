"""The validation stage of ``memplan search --validate N``: train before choosing.

The search's optimum is the optimum of a model of accuracy (summed profile entries). This stage
trains, on the held-aside **validation** split of the profile's own setup (same backbone, data,
linear-probe head, optimizer, epochs and batch: ``memplan.contrib.setup.setup_of``), the
candidates:

* the search's scheme and up to N - 1 more from the search (the optimum under every objective,
  then at 1/2 and 1/4 of the budget), distinct in what they train;
* every baseline of :data:`memplan.search.baselines.BASELINES` whose memory (the search's mode,
  metric, optimizer and options) fits the budget;

each at every rate of a small learning-rate grid (one rate for every trained tensor), by
successive halving over the validation seeds (:mod:`memplan.search.halving`). Baselines are
never halved away, so the returned scheme's validation accuracy is at least that of every
baseline that fits, on the same seeds. The scheme records the rate and optimizer it was
validated with (``training``) and its validation accuracy ± SE with the runners-up
(``validation``). Runs are checkpointed (JSONL, one line per finished run, keyed by what the
candidate trains, so budgets and reruns share them): an interrupted stage resumes where it was.
Runs execute one after another in this process (``threads`` torch threads).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..api import capture, profile_captured
from ..contrib.checkpoint import Checkpoint
from ..contrib.executors import num_threads
from ..contrib.profile import load_profile
from ..contrib.runner import Context, Worker, first_trained, linear_probe
from ..contrib.setup import setup_of
from ..errors import BadOption, MemplanError, SchemeError
from ..plan import Scheme, Training, Validation, scheme_to_plan
from .baselines import BASELINES
from .halving import Halving, planned_runs, successive_halving
from .objective import OBJECTIVES
from .result import SearchResult

#: the learning-rate grid of the stage (one rate for every trained tensor)
DEFAULT_LRS = (5e-4, 2.5e-3, 1.25e-2)
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
    lrs: list[float]
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
                    "lr": None if best is None else best.lr,
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
        memory = prof.totals.peak_bytes if result.metric == "peak" else prof.totals.total_bytes
        if memory <= result.budget_bytes:
            out.append(Candidate(name, scheme, memory, True))
    return out


def dedupe(candidates: Sequence[Candidate]) -> list[Candidate]:
    """One candidate per training (a searched scheme that is a baseline takes the baseline's name)."""
    by_key: dict[str, Candidate] = {}
    for c in sorted(candidates, key=lambda c: not c.baseline):
        by_key.setdefault(c.key, c)
    return list(by_key.values())


def validate_search(  # the stage's knobs, one keyword each
    result: SearchResult,
    n: int,
    search: Callable[[str, int], SearchResult],
    *,
    lrs: Sequence[float] = DEFAULT_LRS,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    checkpoint_dir: str | Path = ".memplan-validate",
    threads: int = 1,
    on_start: Callable[[int], None] | None = None,
    on_run: Callable[[], None] | None = None,
    options: dict[str, Any] | None = None,
) -> Validated:
    """Run the stage (module docstring) on ``result`` (a search over a profile that records its
    setup). ``search(objective, budget_bytes)``: the same search under another objective or budget.
    ``on_start(total)`` / ``on_run()``: progress (planned runs, then one call per run)."""
    if n < 1:
        raise BadOption(f"--validate needs at least 1 searched candidate, got {n}")
    if len(set(seeds)) != len(seeds) or not seeds or not lrs or any(not (lr > 0) for lr in lrs):
        raise BadOption("the validation stage needs distinct seeds and positive learning rates")
    if result.profile_path is None:
        raise BadOption("the validation stage trains from the profile's setup: search with a profile file")
    t0 = time.perf_counter()
    profile = load_profile(result.profile_path)
    cap = capture(result.model, result.input_shape, classes=profile.dataset.get("classes"))
    found = searched_candidates(result, n, search) + baseline_candidates(result, cap, options or {})
    candidates = sorted(dedupe(found), key=lambda c: c.memory_bytes)  # a tie goes to the cheaper candidate
    with num_threads(threads):
        setup = setup_of(profile)
        protocol = profile.protocol
        folder = Path(checkpoint_dir)
        folder.mkdir(parents=True, exist_ok=True)
        identity = {**setup.identity(), "protocol": protocol.model_dump(mode="json", exclude={"seeds"})}
        ckpt = Checkpoint(folder / "validate.runs.jsonl", identity)
        done = ckpt.finished()
        if done is None:
            ckpt.start()
            done = {}
        linear_probe(setup.net, setup.head, setup.task.validation_task(), protocol)
        worker = Worker(Context(setup.name, setup.net, setup.task.validation_task(), protocol, True, threads))
        by_key = {c.key: c for c in candidates}
        trained = 0

        def train(key: str, lr: float, seed: int) -> float:
            nonlocal trained
            rid = f"{key}|{lr:g}|{seed}"
            if rid not in done:
                scheme = by_key[key].scheme
                make = lambda g: scheme_to_plan(g, scheme, method="sparse")  # noqa: E731
                proto = protocol.model_copy(update=dict(lr_classifier=lr, lr_bias=lr, lr_weight=lr, seeds=(seed,)))
                rec = worker.train_plan(make, first_trained(worker.graph, make(worker.graph)), proto)
                ok = math.isfinite(rec["final_loss"][0])
                done[rid] = {"id": rid, "accuracy": rec["accuracy"][0] if ok else math.nan, "train_s": rec["train_s"]}
                ckpt.append(done[rid])
                trained += 1
            return done[rid]["accuracy"]

        if on_start is not None:
            n_protected = sum(c.baseline for c in candidates)
            on_start(planned_runs(len(candidates) * len(lrs), len(seeds)) + n_protected * (len(seeds) - 1))
        halving = successive_halving(
            list(by_key),
            list(lrs),
            list(seeds),
            train,
            protected=[c.key for c in candidates if c.baseline],
            on_run=on_run,
        )
    if halving.best is None:
        raise MemplanError("every candidate diverged at every learning rate of the validation stage", "give --lrs")
    chosen = by_key[halving.best.candidate]
    validated = Validated(
        chosen.scheme, chosen, candidates, halving, list(lrs), list(seeds), trained, 0.0, str(ckpt.path)
    )
    runners = [r for r in validated.table() if r["name"] != chosen.name]
    scheme = chosen.scheme.model_copy(
        update={
            "training": Training(
                optimizer=protocol.optimizer, lr=halving.best.lr, epochs=protocol.epochs, batch_size=protocol.batch_size
            ),
            "validation": Validation(
                name=chosen.name,
                accuracy=round(halving.best.mean, 3),
                se=round(halving.best.se, 3),
                seeds=sorted(halving.best.accuracy),
                data=setup.task.description.split(" [")[0] + " (validation split)",
                runners_up=runners,
            ),
            "budget_bytes": result.budget_bytes,
            "provenance": result.scheme.provenance,
        }
    )
    validated.scheme, validated.seconds = scheme, time.perf_counter() - t0
    return validated
