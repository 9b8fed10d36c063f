"""The options of a search (``run_search``, ``memplan search``), each declared once
(:mod:`memplan.options`): :class:`SearchOptions` groups

* ``inputs``: :class:`Inputs`, the contribution profile and the model's capture;
* ``accounting``: :class:`Accounting`, how a candidate's memory (and FLOPs) is counted and bounded;
* ``space``: :class:`Space`, the candidates and what they gain;
* ``solver``: :class:`Solver`, the search method and its settings;
* ``output``: :class:`Output`, the scheme written and its provenance;

and :class:`Stage`, the validation stage's schedule (``--validate``, ``memplan.search.stage``);
``memplan search`` takes both (:class:`SearchCommand`).

No torch import: the command line derives its options from these fields before any command runs.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from pydantic import field_validator

from ..names import (
    CHOICE_RULES,
    DEFAULT_CHOICE_RULE,
    DEFAULT_EXECUTOR,
    DEFAULT_METRIC,
    DEFAULT_SELECT,
    DEFAULT_SIZE_RULE,
    EXECUTORS,
    EXPLICIT_SELECT,
    METRICS,
    SEARCH_METHODS,
    SEARCH_MODE,
    SELECT_RULES,
    SIZE_RULES,
    choices,
    listed,
)
from ..options import (
    Batch,
    Classes,
    FrozenBits,
    InputShape,
    Mode,
    ModeOptions,
    Optimizer,
    Options,
    Resolution,
    Target,
    option,
)
from ..rates import FAMILIES, Rates
from .objective import DEFAULT_OBJECTIVE, PLAIN_OBJECTIVE, objectives_help

#: the fewest seeds of the additivity check: with fewer, seed-to-seed agreement (its ceiling) is too loose
MIN_CHECK_SEEDS = 4
#: the paper's channel ratios (0 = bias only is always allowed)
DEFAULT_RATIOS = (0.125, 0.25, 0.5, 1.0)


class Inputs(Options):
    """The contribution profile and the model's capture (``memplan.search.inputs.capture_inputs``)."""

    profile_path: str | os.PathLike | None = option(
        None, "contribution profile JSON (default: the shipped one matching the model)", flags=("--profile",)
    )
    profile: Any = option(
        None, "a contribution profile (ContribProfile or its JSON object) instead of a file", cli=False
    )
    classes: Classes = None
    resolution: Resolution = None  # not given: the profile's costing resolution (a warning when the runs used another)
    input_shape: InputShape = None
    batch: Batch = 1


class Accounting(Options):
    """How a candidate's memory (and backward FLOPs) is counted and what bounds it."""

    budget: str | int | float | None = option(
        None, 'memory budget: "100KB" (1000-based), "100KiB" (1024-based), "0.1MB" or bytes', parse="text"
    )
    target: Target = None  # the budget: its memory left to training in the mode (mcu: the modelled peak)
    mode: Mode = None
    metric: str = option(
        DEFAULT_METRIC, f"which figure the budget bounds: {choices(METRICS)} (memplan.search.memory.METRICS)", cli=False
    )
    optimizer: Optimizer = None
    frozen_bits: FrozenBits = 32
    mode_options: ModeOptions = None
    flops_budget: str | int | float | None = option(
        None,
        'also bound the backward FLOPs of one training step: "5MFLOPs", "2.5e6", "1G" (k, M, G, T 1000-based; '
        "a bare number is FLOPs). FLOPs = 2 x MACs of the backward of conv / linear / matmul (grad-input, "
        "grad-weight of the updated fraction as the mode counts it; grad-bias 1 per output element); norm / "
        "activation / pooling / loss backward is not counted (default: memory only)",
        parse="text",
    )
    recompute: tuple[int, ...] = option(
        (),
        "also choose, jointly with the update, segments whose forward the backward recomputes (activation "
        "checkpointing: the same gradients, less memory, more FLOPs): segment sizes in blocks, e.g. 1,2; each "
        "candidate set (none, or every block from one on in segments of one size) is searched and the best kept; "
        "the scheme records it (execution) and apply_scheme realises it (default: none)",
        parse="ints",
    )

    @field_validator("recompute")
    @classmethod
    def _sizes(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(size < 1 for size in v):
            raise ValueError(f"segment sizes must be positive, got {list(v)}")
        return tuple(sorted(set(v)))

    micro_batches: tuple[int, ...] = option(
        (),
        "also choose, jointly with the update, how many micro-batches the batch is trained in (gradient "
        "accumulation: the same gradients where every norm is frozen, one micro-batch's activations, the same "
        "FLOPs per step): counts that divide --batch, e.g. 2,4; the whole batch at once and each count are "
        "searched and the best kept; refused where a norm uses batch statistics; the scheme records it "
        "(execution) and memplan.train.fit_scheme realises it (default: the whole batch at once)",
        parse="ints",
    )

    @field_validator("micro_batches")
    @classmethod
    def _counts(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(count < 1 for count in v):
            raise ValueError(f"micro-batch counts must be positive, got {list(v)}")
        return tuple(sorted(set(v) - {1}))


class Space(Options):
    """The candidates (``memplan.search.space.build_space``) and what each one gains."""

    ratios: tuple[float, ...] = option(DEFAULT_RATIOS, "weight ratios of the space, e.g. 1/8,1/4,1/2,1")
    pw1_only: bool = option(False, "update weights of first pointwise convs only")
    max_weight_layers: int | None = option(None, "cap on weight-updated layers")
    objective: str | None = option(
        None,
        f"how the profile's Δacc entries become gains: {objectives_help()} (default: {DEFAULT_OBJECTIVE}; "
        f"{PLAIN_OBJECTIVE} for a profile without standard errors)",
    )
    select: str = option(
        DEFAULT_SELECT,
        f"channels of a weight update: {choices(SELECT_RULES)}, or {EXPLICIT_SELECT} (the top channels of a "
        "gradient estimator's per-channel importance, listed in the scheme)",
    )


class Solver(Options):
    """The search method (``memplan.search.methods``) and its settings."""

    method: str | None = option(
        None,
        f"{choices(SEARCH_METHODS)} (default: the exact solver where memory is additive in the mode, else the "
        "evolutionary search)",
    )
    generations: int = option(100, "generations of the evolutionary search")
    population: int = option(100, "population of the evolutionary search")
    seed: int = option(0, "seed of the evolutionary and random searches and of the additivity probes")
    curves: bool = option(
        False, "also run evolution and random search for their best-so-far curves (Figure 13)", cli=False
    )


class Output(Options):
    """The scheme written, and the command recorded in its provenance."""

    out: str | os.PathLike | None = option(None, "write the scheme JSON")
    command: str | None = option(None, "the command line recorded in the scheme's provenance", cli=False)


class SearchOptions(Options):
    """Every option of :func:`memplan.search.run.run_search` and ``memplan search``."""

    what: ClassVar[str] = "search"

    inputs: Inputs = Inputs()
    accounting: Accounting = Accounting()
    space: Space = Space()
    solver: Solver = Solver()
    output: Output = Output()


#: the validation stage's learning-rate grid (memplan.rates.Rates, as text): one rate for every
#: tensor, then the biases, norms and head at 1.25e-2 with the weights slower
DEFAULT_GRID = ("5e-4", "2.5e-3", "1.25e-2", "1.25e-2/weight=5e-4", "1.25e-2/weight=2.5e-3")


class Stage(Options):
    """The validation stage's schedule (``memplan.search.stage``): its candidates, the
    learning-rate grid and seeds of the successive halving, its checkpoint and where it runs."""

    what: ClassVar[str] = "validation stage"

    validate_candidates: int | None = option(
        None,
        "train the search's N best candidates and every baseline that fits on the profile's validation split "
        "(successive halving over seeds and a learning-rate grid) and return the choice of --validate-rule",
        flags=("--validate",),
    )
    validate_lrs: tuple[str, ...] = option(
        DEFAULT_GRID,
        "learning-rate grid of --validate, comma-separated points: one rate for every tensor (2.5e-3) or rates per "
        f"family, a bare rate for the rest (1.25e-2/weight=5e-4; families: {listed(FAMILIES)})",
        parse="texts",
    )
    validate_seeds: tuple[int, ...] = option(
        (100, 101),
        "seeds of --validate (one rung each); their own, never a seed the test runs use (0-9 by convention)",
        parse="ints",
    )
    validate_widen: int = option(
        4,
        "times a chosen rate at an edge of its grid may widen the grid by one step beyond it (the schedule runs "
        "again); 0 keeps the grid as given",
    )
    validate_rule: str = option(
        DEFAULT_CHOICE_RULE,
        f"how --validate chooses among what it trained: {choices(CHOICE_RULES)} (memplan.search.rules)",
    )
    validate_sizes: str = option(
        DEFAULT_SIZE_RULE,
        "which sizes of a sized baseline (every bias + the last k convs' weights; the last k convs' biases) "
        f"--validate trains: {choices(SIZE_RULES)} (memplan.search.baselines)",
    )
    validate_dir: str | os.PathLike = option(
        ".memplan-validate", "checkpoint folder of --validate (reruns resume from it)"
    )
    validate_workers: int = option(
        1, "runs of --validate trained at once (each rung's runs on contribution analysis's executors)"
    )
    validate_executor: str = option(DEFAULT_EXECUTOR, f"where --validate's runs train: {choices(EXECUTORS)}")
    validate_address: str | None = option(None, "Ray cluster address (with --validate-executor ray)")
    validate_threads: int | None = option(
        None, "torch threads per worker (default: the cores this process may use, shared by the workers)", cli=False
    )

    @field_validator("validate_candidates")
    @classmethod
    def _n(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"--validate needs at least 1 searched candidate, got {v}")
        return v

    @field_validator("validate_lrs")
    @classmethod
    def _grid(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("the validation stage needs at least one learning rate")
        return tuple(str(Rates.parse(x)) for x in v)  # a one-line error for a point it cannot read

    @field_validator("validate_seeds")
    @classmethod
    def _seeds(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or len(set(v)) != len(v):
            raise ValueError(f"the validation stage's seeds must be distinct, got {list(v)}")
        return v

    @field_validator("validate_widen")
    @classmethod
    def _widen(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"--validate-widen must be >= 0, got {v}")
        return v

    @field_validator("validate_workers")
    @classmethod
    def _workers(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"--validate-workers must be a positive integer, got {v}")
        return v

    @property
    def grid(self) -> tuple[Rates, ...]:
        """The learning-rate grid's points."""
        return tuple(Rates.parse(x) for x in self.validate_lrs)


class SearchCommand(Options):
    """Every option of ``memplan search``: the search's and the validation stage's."""

    what: ClassVar[str] = "search"

    search: SearchOptions = SearchOptions()
    stage: Stage = Stage()


class ValidateOptions(Options):
    """The options of the additivity check (``memplan.search.additivity.validate_profile``,
    ``memplan contrib validate``)."""

    what: ClassVar[str] = "additivity check"

    budgets: tuple[str | int, ...] | None = option(
        None,
        'memory budgets, e.g. "20KB,50KB,100KB" (default: 4 spread over the profile\'s range)',
        parse="texts",
    )
    per_budget: int = option(5, "random schemes per budget")
    searched: bool = option(
        True,
        "the searched optimum of each budget is trained too (the default); --no-searched leaves it out",
        flags=("--no-searched",),
        negate=True,
    )
    mode: Mode = SEARCH_MODE
    seeds: tuple[int, ...] = option(
        (100, 101, 102, 103),
        "training seeds, at least 4 (seed-to-seed agreement bounds the check: ceiling); the default ones are "
        "neither the profile's nor the test runs'",
        parse="ints",
    )
    split: str = option(
        "validation",
        "where the schemes are measured: validation (the profile's validation split: the check is made while "
        "choosing, so it never looks at test) | test",
    )
    bootstrap: int = option(2000, "bootstrap resamples of the confidence intervals")
    seed: int = option(0, "seed of the random schemes and the bootstrap")
    threads: int = option(1, "torch threads of each training run", cli=False)
    workers: int = option(
        1,
        "runs trained at once, one per scheme and seed (contribution analysis's executors); results do not "
        "depend on it",
        flags=("--workers", "-j"),
    )
    executor: str = option(DEFAULT_EXECUTOR, f"where the runs train: {choices(EXECUTORS)}")
    address: str | None = option(None, "Ray cluster address (with --executor ray)")
    device: str = option("cpu", "cpu | cuda | auto")
    checkpoint: str | os.PathLike | None = option(
        None,
        "JSONL of the trained schemes (one fsync'ed line each) to resume from: a rerun with the same options "
        "skips them (default: beside --json, .runs.jsonl)",
    )
    progress: Any = option(None, "called with each line of progress", cli=False)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if len(v) < MIN_CHECK_SEEDS or len(set(v)) != len(v):
            raise ValueError(f"the additivity check needs at least {MIN_CHECK_SEEDS} distinct seeds, got {list(v)}")
        return v

    @field_validator("split")
    @classmethod
    def _split(cls, v: str) -> str:
        if v not in ("validation", "test"):
            raise ValueError(f"--split must be validation or test, got {v!r}")
        return v
