"""The validation stage of ``memplan search --validate N``: train before choosing.

The search's optimum is the optimum of a model of accuracy (summed profile entries). This stage
trains, on the held-aside **validation** split of the profile's own setup (same backbone, data,
linear-probe head, optimizer, epochs and batch: ``memplan.contrib.setup.setup_of``), the
candidates (:mod:`memplan.search.candidates`):

* the search's scheme and up to N - 1 more from the search (the optimum under every objective,
  then at 1/2 and 1/4 of the budget), distinct in what they train;
* every baseline of :data:`memplan.search.baselines.BASELINES` whose memory (the search's mode,
  metric, optimizer and options) fits the budget: of a sized one, its largest size that fits,
  and with ``Stage.validate_sizes`` ``ladder`` that size halved down to 1 too (a smaller size can
  beat a larger one);
* every union of two of those that fits the budget and trains something neither trains alone (a
  baseline extended by another or by the search: MobileTL + every bias; a sized baseline's
  smaller sizes enter none);

each at every point of a small learning-rate grid, by successive halving over the validation
seeds (:mod:`memplan.contrib.halving`; by default 100 and 101, seeds of their own: a test run
never re-scores a model the stage chose on). A point is one rate for every trained tensor or rates
per parameter family (:class:`memplan.rates.Rates`): the default grid is one rate in {5e-4,
2.5e-3, 1.25e-2} for everything, and the biases, norms and head at 1.25e-2 with the weights at
5e-4 or 2.5e-3 (schemes that mix biases with early conv weights diverge at the rate the biases
need). A candidate gets each distinct training only once: points that differ only in a family it
does not train are one. A winning rate at an edge of its grid (better than its neighbour there: a
tie is a plateau) widens the grid by one step beyond it and the schedule runs again
(``Stage.validate_widen`` times at most), so the choice is interior; a tie goes to the cheaper
candidate, then to the smaller rate. Baselines are never halved away, so the returned scheme's
validation accuracy is at least that of every baseline that fits, on the same seeds and grid. The
choice among what was trained is ``Stage.validate_rule``'s (:mod:`memplan.search.rules`): by
default the best baseline that fits, unless validation separates the best candidate from it (a
margin beyond twice its SE); ``best`` takes the best mean whatever the margin. The
scheme records the rates and optimizer it was validated with (``training``) and its validation
accuracy ± SE with the runners-up (``validation``). Runs are checkpointed (JSONL, one line per
finished run, keyed by what the candidate trains, its rates and seed, so budgets and reruns share
them): an interrupted stage resumes where it was. A stage holds its folder's lock (``LOCK``) from
reading the checkpoint to its choice, so a second run on the same folder waits and then reuses every
run (none is trained twice); a checkpoint that cannot be written is refused before any run trains.
Runs execute one after another in this process, or each rung's runs at once on contribution
analysis's executors (``Stage.validate_workers``: a local process pool or Ray).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contrib.checkpoint import Checkpoint
from ..contrib.executors import EXECUTORS, check as check_execution, default_threads, execute, num_threads
from ..contrib.halving import Config, Halving, planned_runs, successive_halving
from ..contrib.profile import ContribProfile
from ..contrib.runner import Context, SchemeRun, Worker, added_key, linear_probe, with_added_modules
from ..contrib.setup import setup_of
from ..errors import BadOption, MemplanError
from ..io import exclusive
from ..plan import Scheme, Training, Validation
from ..rates import Rates, outward
from .baselines import SIZE_RULES
from .candidates import Candidate, collect_candidates
from .options import Stage
from .result import SearchResult
from .rules import CHOICE_RULES

#: the learning-rate grid of the stage (module docstring)
DEFAULT_LRS = Stage().grid
DEFAULT_SEEDS = Stage.model_fields["validate_seeds"].default
DEFAULT_WIDEN = Stage.model_fields["validate_widen"].default
DEFAULT_RULE = Stage.model_fields["validate_rule"].default
#: the stage's files in its folder (``Stage.validate_dir``): the runs, and the lock a run holds
CHECKPOINT, LOCK = "validate.runs.jsonl", "validate.lock"
#: what every checkpointed run holds (``Checkpoint.fields``): a line without them is refused
RUN_FIELDS = {"accuracy": (int, float), "final_loss": (int, float)}


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
    at_edge: bool = False  # the chosen rate is still at an edge of ``lrs`` (widened as far as allowed)
    rule: str = ""  # the choice rule (memplan.search.rules)
    config: Config | None = None  # the configuration chosen (``halving.best`` is the best on validation)

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


class ProfileTrainer:
    """Trains candidates from a profile's setup on its validation split (the linear probe first, as
    contribution analysis does), each run checkpointed as one JSONL line keyed by what the
    candidate trains, its rates and seed. ``trainer(candidate, rates, seed)`` -> accuracy, % (NaN:
    diverged); ``trainer.prefetch(rung)`` trains a rung's missing runs on ``workers`` workers of
    ``executor`` (contribution analysis's local process pool or Ray: ``memplan.contrib.executors``)
    before the schedule reads them. Any object with this call and these attributes can stand in
    (the transfer benchmark trains through its own checkpoint); ``images`` (the validation split's
    size) may be left out, and the scheme then records none."""

    def __init__(self, profile: ContribProfile, stage: Stage):
        self.stage = stage
        self.threads = stage.validate_threads or default_threads(stage.validate_workers)
        folder = check_stage(stage)
        with num_threads(self.threads):
            setup = setup_of(profile)
            self.protocol = protocol = profile.protocol
            identity = {**setup.identity(), "protocol": protocol.identity(exclude={"seeds"})}
            self.ckpt = Checkpoint(folder / CHECKPOINT, identity, RUN_FIELDS)
            done = self.ckpt.finished()
            self.ckpt.writable()  # before any run trains: a refused append would lose a finished run
            if done is None:
                self.ckpt.start()
            self.done = done or {}
            self.seen = setup.task.validation_task()
            linear_probe(setup.net, setup.head, self.seen, protocol)
        self.name, self.net = setup.name, setup.net
        self.key = f"validate:{setup.name}:{identity.get('backbone', '')}"
        self.contexts: dict[str, Context] = {}  # "" (the plain model) and one set of added modules at a time
        self.workers: dict[str, Worker] = {}  # this process's, made on first use, the same keys
        self.optimizer, self.epochs, self.batch_size = protocol.optimizer, protocol.epochs, protocol.batch_size
        self.data = setup.task.description.split(" [")[0] + " (validation split)"
        self.images = len(self.seen.y_test)  # the validation split, in the evaluation slot
        self.classifier = setup.head
        self.checkpoint = str(self.ckpt.path)
        self.trained = 0

    @staticmethod
    def run_id(candidate: Candidate, rates: Rates, seed: int) -> str:
        return f"{candidate.key}|{rates}|{seed}"

    def _record(self, rec: dict[str, Any]) -> None:
        if not math.isfinite(rec["final_loss"]):  # diverged: no accuracy to compare
            rec = {**rec, "accuracy": math.nan}
        self.done[rec["id"]] = rec
        self.ckpt.append(rec)
        self.trained += 1

    def context_for(self, scheme: Scheme) -> tuple[str, Context]:
        """(key, context): the plain model's, or one on the model with ``scheme``'s added modules built
        (``memplan.apply.add_modules``; one such set at a time, the previous one freed first)."""
        key = added_key(scheme)
        if key not in self.contexts:
            plain = self.contexts.get("") or Context(self.name, self.net, self.seen, self.protocol, True, self.threads)
            self.contexts = {"": plain}
            self.workers = {"": self.workers[""]} if "" in self.workers else {}
            self.contexts[key] = with_added_modules(plain, scheme)
        return key, self.contexts[key]

    def worker_for(self, scheme: Scheme) -> Worker:
        """This process's worker for ``scheme`` (:meth:`context_for`)."""
        key, ctx = self.context_for(scheme)
        if key not in self.workers:
            self.workers[key] = Worker(ctx)
        return self.workers[key]

    def prefetch(self, rung: Sequence[tuple[Candidate, Rates, int]]) -> None:
        """Train the runs of ``rung`` not in the checkpoint, on the stage's workers (one worker of a local
        executor: nothing here, each run trains in this process when it is read; a remote one, Ray,
        gets its runs even with one worker)."""
        jobs = [SchemeRun(self.run_id(c, r, s), c.scheme, r, s) for c, r, s in rung]
        jobs = [j for j in dict((j.id, j) for j in jobs).values() if j.id not in self.done]
        st = self.stage
        if (st.validate_workers == 1 and not EXECUTORS[st.validate_executor].remote) or not jobs:
            return
        groups: dict[str, list[SchemeRun]] = {}
        for job in jobs:  # one pool per model: the plain one, and each set of added modules
            groups.setdefault(added_key(job.scheme), []).append(job)
        for key, group in groups.items():
            ctx = self.context_for(group[0].scheme)[1]
            tag = f"{self.key}:{hashlib.sha256(key.encode()).hexdigest()[:8]}"
            run = {"workers": st.validate_workers, "executor": st.validate_executor, "address": st.validate_address}
            for rec in execute(ctx, group, **run, key=tag):
                self._record(rec)

    def __call__(self, candidate: Candidate, rates: Rates, seed: int) -> float:
        rid = self.run_id(candidate, rates, seed)
        if rid not in self.done:
            with num_threads(self.threads):
                self._record(SchemeRun(rid, candidate.scheme, rates, seed).run_on(self.worker_for(candidate.scheme)))
        return self.done[rid]["accuracy"]


def _halve(
    candidates: Sequence[Candidate],
    trainer: Any,
    lrs: Sequence[Rates],
    seeds: Sequence[int],
    on_start: Callable[[int], None] | None,
    on_run: Callable[[], None] | None,
) -> Halving:
    """One successive halving of ``candidates`` over the grid ``lrs`` (each candidate's settings in
    ascending order: a tie goes to the smaller rate) and ``seeds`` with ``trainer``."""
    by_key = {c.key: c for c in candidates}
    settings = {c.key: sorted(c.settings(lrs)) for c in candidates}
    if on_start is not None:
        n_protected = sum(c.baseline for c in candidates)
        n_configs = sum(map(len, settings.values()))
        on_start(planned_runs(n_configs, len(seeds)) + n_protected * (len(seeds) - 1))
    prefetch = getattr(trainer, "prefetch", None)
    return successive_halving(
        list(by_key),
        settings,
        list(seeds),
        lambda key, lr, seed: trainer(by_key[key], lr, seed),
        protected=[c.key for c in candidates if c.baseline],
        on_run=on_run,
        on_rung=None if prefetch is None else lambda rung: prefetch([(by_key[k], r, s) for k, r, s in rung]),
    )


def _pulled(halving: Halving, best: Any, inner: Rates) -> bool:
    """Whether ``best`` (a configuration at an edge of its grid) beats its neighbour ``inner`` on
    the seeds both trained: a rate the data pull to the edge, not one a tie put there (a plateau,
    where the tie rule's smaller rate is at the edge). A neighbour that diverged or never ran pulls."""
    other = next((c for c in halving.configs if c.candidate == best.candidate and c.lr == inner), None)
    seeds = [s for s in best.accuracy if other is not None and s in other.accuracy]
    if not seeds:
        return True
    mine = sum(best.accuracy[s] for s in seeds) / len(seeds)
    theirs = sum(other.accuracy[s] for s in seeds) / len(seeds)
    return not theirs >= mine  # NaN (diverged) pulls


@dataclass(frozen=True)
class Progress:
    """What a long search reports as it goes (each optional): ``searched(searched)`` once the search
    is done (:class:`memplan.search.command.Searched`, before any training), ``waiting(path)``
    when another run holds the stage's folder (this one waits for it, then reuses its runs),
    ``start(total)`` the runs planned, ``run()`` after each run."""

    searched: Callable[[Any], None] | None = None
    waiting: Callable[[str], None] | None = None
    start: Callable[[int], None] | None = None
    run: Callable[[], None] | None = None


def choose(  # the stage's schedule, one keyword each
    candidates: Sequence[Candidate],
    trainer: Any,
    *,
    lrs: Sequence[Rates] = DEFAULT_LRS,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    budget_bytes: int | None = None,
    widen: int = DEFAULT_WIDEN,
    rule: str = DEFAULT_RULE,
    progress: Progress | None = None,
) -> Validated:
    """Successive halving of every candidate at each of its :meth:`Candidate.settings` of ``lrs``
    over ``seeds`` with ``trainer`` (baselines protected); the winner as a scheme with
    ``training`` and ``validation`` filled in. A winning rate at an edge of its grid widens the
    grid (:func:`memplan.rates.outward`, every candidate gets the new points) and the schedule runs
    again, up to ``widen`` times; an edge that only ties its inner neighbour is a plateau and
    widens nothing (the runs already trained come from the trainer's checkpoint);
    ``Validated.lrs`` is the grid used, ``Validated.at_edge`` says whether the choice is still at
    its edge. ``rule`` (:data:`memplan.search.rules.CHOICE_RULES`) chooses among the configurations
    trained, and the widening follows its choice; ``progress``: its ``start`` and ``run`` are
    called. Ties: the cheaper candidate (``candidates`` come cheapest first), then the smaller rate
    (each candidate's settings are tried in ascending order)."""
    if len(set(seeds)) != len(seeds) or not seeds or not lrs:
        raise BadOption("the validation stage needs distinct seeds and at least one learning rate")
    t0 = time.perf_counter()
    lrs = [Rates.of(r) for r in lrs]
    by_key = {c.key: c for c in candidates}
    choice = CHOICE_RULES.choose(rule).choose
    progress = progress or Progress()
    for widened in range(widen + 1):
        halving = _halve(candidates, trainer, lrs, seeds, progress.start if widened == 0 else None, progress.run)
        if halving.best is None:
            raise MemplanError(
                "every candidate diverged at every learning rate of the validation stage", "widen the rates"
            )
        best = choice(halving, candidates)
        edges = outward(by_key[best.candidate].settings(lrs), best.lr)
        beyond = [b for b, inner in edges if b not in lrs and _pulled(halving, best, inner)]
        if not beyond or widened == widen:
            break
        lrs += beyond
    chosen = by_key[best.candidate]
    validated = Validated(chosen.scheme, chosen, list(candidates), halving, list(lrs), list(seeds), 0, 0.0, "")
    validated.checkpoint, validated.at_edge = trainer.checkpoint, bool(beyond)
    validated.rule, validated.config = rule, best
    rates: Rates = best.lr
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
        accuracy=round(best.mean, 3),
        se=round(best.se, 3),
        seeds=sorted(best.accuracy),
        rule=rule,
        data=trainer.data,
        images=getattr(trainer, "images", None),
        runners_up=[r for r in validated.table() if r["name"] != chosen.name],
    )
    update: dict[str, Any] = {"training": training, "validation": validation}
    if budget_bytes is not None:
        update["budget_bytes"] = budget_bytes
    validated.scheme = chosen.scheme.model_copy(update=update)
    validated.runs_trained, validated.seconds = trainer.trained, time.perf_counter() - t0
    return validated


def check_stage(stage: Stage) -> Path:
    """The stage's folder (made if missing), after one-line errors for what would fail later: an
    executor that cannot run (a bad worker count, a package it needs missing), a folder that is a
    file or cannot be made, a checkpoint that is read-only, an unknown choice or size rule. Cheap: called
    before any work."""
    check_execution(stage.validate_workers, stage.validate_executor, stage.validate_address)
    CHOICE_RULES.choose(stage.validate_rule)
    SIZE_RULES.choose(stage.validate_sizes)
    folder = Path(stage.validate_dir)
    if folder.exists() and not folder.is_dir():
        raise BadOption(f"--validate-dir {folder} is a file, not a folder", "name a folder (made if missing)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadOption(f"cannot make --validate-dir {folder}: {exc.strerror or exc}") from None
    Checkpoint(folder / CHECKPOINT, {}).writable()
    return folder


def validate_search(  # the stage's inputs, then keywords
    result: SearchResult,
    n: int,
    search: Callable[[str, int], SearchResult],
    profile: ContribProfile,
    *,
    stage: Stage | None = None,
    options: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> Validated:
    """Run the stage (module docstring) on ``result``, a search over ``profile`` (a contribution
    profile that records its setup). ``search(objective, budget_bytes)``: the same search under
    another objective or budget. ``options``: how baselines are costed (``profile_captured``'s
    optimizer, frozen_bits, mode_options: the search's). The stage holds its folder's lock
    (``LOCK``) from reading the checkpoint to the choice: a second run on the same folder waits,
    then reuses every run the first trained (none is trained twice)."""
    stage = stage or Stage()
    progress = progress or Progress()
    folder = check_stage(stage)
    classes = profile.dataset.get("classes")
    candidates = collect_candidates(result, n, search, options or {}, classes, stage.validate_sizes)
    lock = folder / LOCK
    with exclusive(lock, None if progress.waiting is None else lambda: progress.waiting(str(lock))):
        trainer = ProfileTrainer(profile, stage)
        return choose(
            candidates,
            trainer,
            lrs=stage.grid,
            seeds=stage.validate_seeds,
            budget_bytes=result.budget_bytes,
            widen=stage.validate_widen,
            rule=stage.validate_rule,
            progress=progress,
        )
