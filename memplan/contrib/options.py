"""The options of contribution analysis (``run_contrib``, ``memplan contrib``), each declared once
(:mod:`memplan.options`): :class:`ContribOptions` groups

* ``protocol``: :class:`Protocol`, everything that determines the measured numbers (the
  checkpoint's identity);
* ``inputs``: :class:`DataOptions`, the data, the backbone weights, the input and the splits;
* ``execution``: :class:`Execution`, where and how the runs execute and where the profile goes;
* ``estimate``: :class:`Estimate`, what fills the profile's entries.

No torch import: the command line derives its options from these fields before any command runs
(registries are read by the validators, when an object is built).
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..names import (
    DATA_SOURCES,
    DEFAULT_DATA,
    DEFAULT_ESTIMATOR,
    DEFAULT_EXECUTOR,
    DEFAULT_OPTIMIZER,
    DEFAULT_SELECT,
    ESTIMATORS,
    EXECUTORS,
    OPTIMIZERS,
    SELECT_RULES,
    choices,
)
from ..options import Options, Resolution, option
from ..rates import Rates

#: protocol fields added after checkpoints were written, with the value those checkpoints imply
LATER_FIELDS = {"lr_grid": None, "weight_reference": "depth", "lr_norm": None, "weight_convs": None}
PAPER_RATIOS = (0.125, 0.25, 0.5, 1.0)
#: images per class (an int) or fraction (a float) of the training data carved out as the validation split
Validation = int | float
DEFAULT_VALIDATION = 0.2


class Protocol(BaseModel):
    """Everything that determines the measured numbers (the checkpoint's identity)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seeds: tuple[int, ...] = Field(
        (0, 1), min_length=1, description="seeds per run, one training run each (data order), e.g. 0,1,2"
    )
    max_seeds: int | None = Field(
        None,
        ge=1,
        description="adaptive sampling: an entry whose |Δacc| is below adaptive_z standard errors gets one more seed "
        "per round (and its reference run too) until it has max_seeds; None: the seeds only",
    )
    adaptive_z: float = Field(
        2.0, gt=0, description="z of adaptive sampling: entries with |mean| < z x SE are sampled again"
    )
    epochs: int = Field(4, ge=1, description="epochs of every grid run")
    batch_size: int = Field(32, ge=1, description="training batch size of every run")
    lr_classifier: float = Field(0.05, gt=0, description="learning rate of the classifier, in every run")
    lr_bias: float = Field(0.02, gt=0, description="learning rate of biases / norm shifts, in every run")
    lr_weight: float = Field(0.1, gt=0, description="learning rate of the analysed conv weight (weight runs)")
    lr_norm: float | None = Field(None, gt=0, description="learning rate of norm scales; None: lr_bias")
    optimizer: str = Field(
        DEFAULT_OPTIMIZER,
        description=f"{choices(OPTIMIZERS)} (memplan.optim): the one optimizer of the linear probe and every run "
        "(its state is what memplan search counts for schemes searched from this profile)",
    )
    probe_epochs: int = Field(20, ge=1, description="epochs of the linear probe that every run starts from")
    probe_lr: float = Field(0.05, gt=0, description="learning rate of the linear probe")
    ratios: tuple[float, ...] = Field(
        PAPER_RATIOS, min_length=1, description="channel ratios of weight runs, e.g. 1/8,1/4,1/2,1"
    )
    bias_ks: tuple[int, ...] | None = Field(None, description="bias-run depths k, e.g. 1,2,4,8; None = every k in 1..L")
    weight_layers: int | None = Field(
        None, ge=1, description="weight runs for the last N convs (with --rank-by: the N it ranks highest); None = all"
    )
    weight_convs: tuple[int, ...] | None = Field(
        None,
        description="weight runs for these convs only (0-based conv indices, e.g. 47,4,35); None: --weight-layers "
        "decides",
    )
    select: str = Field(
        DEFAULT_SELECT, description=f"channel selection rule of sub-channel updates: {choices(SELECT_RULES)}"
    )
    lr_grid: tuple[float, ...] | None = Field(
        None,
        description="choose lr_classifier, lr_bias and lr_weight on validation from these rates before the grid, "
        "e.g. 5e-4,2.5e-3,1.25e-2 (memplan.contrib.rates; None: the given rates)",
    )
    weight_reference: Literal["depth", "all-biases"] = Field(
        "depth",
        description="what a weight run (i, r) trains besides its weight: the biases of convs i..L-1 (depth, the "
        "256KB paper's: Δacc over bias L - i) or all L biases (all-biases, Δacc over bias L)",
    )
    bits: int | None = Field(None, ge=1, le=8, description="feature-cache quantisation bits; None = exact fp32")

    @field_validator("lr_grid")
    @classmethod
    def _lr_grid(cls, v: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if v is not None and (not v or any(not x > 0 for x in v)):
            raise ValueError("lr_grid must be positive learning rates")
        return None if v is None else tuple(sorted(set(v)))

    @field_validator("weight_convs")
    @classmethod
    def _weight_convs(cls, v: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if v is not None and (not v or min(v) < 0 or len(set(v)) != len(v)):
            raise ValueError(f"weight_convs must be distinct conv indices >= 0, got {list(v)}")
        return None if v is None else tuple(sorted(v))

    @model_validator(mode="after")
    def _one_weight_subset(self) -> Protocol:
        if self.weight_layers is not None and self.weight_convs is not None:
            raise ValueError("give weight_layers or weight_convs, not both")
        return self

    @field_validator("ratios")
    @classmethod
    def _ratios(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if any(not 0 < r <= 1 for r in v):
            raise ValueError("ratios must lie in (0, 1]")
        return tuple(sorted(set(v)))

    @model_validator(mode="before")
    @classmethod
    def _legacy_momentum(cls, data: Any) -> Any:
        """Profiles written before the optimizer table stored ``momentum`` (0: plain SGD)."""
        if isinstance(data, dict) and "momentum" in data:
            from ..optim import LEGACY_MOMENTUM

            data = dict(data)
            momentum = data.pop("momentum")
            if momentum not in LEGACY_MOMENTUM:
                raise ValueError(f"momentum {momentum} is none of memplan's optimizers")
            data.setdefault("optimizer", LEGACY_MOMENTUM[momentum])
        return data

    @field_validator("optimizer")
    @classmethod
    def _optimizer(cls, v: str) -> str:
        if v not in OPTIMIZERS:  # the registry's names (memplan.names)
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}")
        return v

    @field_validator("select")
    @classmethod
    def _select(cls, v: str) -> str:
        if v not in SELECT_RULES:  # importance names channels per layer, which a protocol cannot
            raise ValueError(f"select must be one of {', '.join(SELECT_RULES)}")
        return v

    def identity(self, exclude: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
        """The JSON form a checkpoint is identified by: fields added later (:data:`LATER_FIELDS`) are
        left out while at their default, so checkpoints written before them resume."""
        data = self.model_dump(mode="json", exclude=set(exclude))
        return {k: v for k, v in data.items() if k not in LATER_FIELDS or v != LATER_FIELDS[k]}

    @property
    def rates(self) -> Rates:
        """The learning rate of each parameter family (:mod:`memplan.rates`)."""
        norm = self.lr_bias if self.lr_norm is None else self.lr_norm
        return Rates(classifier=self.lr_classifier, bias=self.lr_bias, norm=norm, weight=self.lr_weight)

    def at(self, rates: Rates | float, seed: int | None = None) -> Protocol:
        """This protocol at ``rates`` (one rate: every family), and at the one ``seed`` if given."""
        r = Rates.of(rates)
        update: dict[str, Any] = dict(lr_classifier=r.classifier, lr_bias=r.bias, lr_weight=r.weight)
        update["lr_norm"] = None if r.norm == r.bias else r.norm
        if seed is not None:
            update["seeds"] = (seed,)
        return self.model_copy(update=update)


class DataOptions(Options):
    """The data, the backbone weights, the input of the runs and the splits."""

    data: str = option(DEFAULT_DATA, f"the data, the first of these that reads it: {choices(DATA_SOURCES)}")
    weights: str | os.PathLike | None = option(
        None,
        "local state_dict (.pt, loaded with weights_only=True), or 'zoo' for the published weights of the zoo entry",
    )
    resolution: Resolution = None  # of the runs (not given: the data source's for zoo models, 32 for digits)
    costing_resolution: int | None = option(
        None,
        "input side the schemes will be costed at (default: the run resolution), recorded so that memplan search "
        "can warn when they differ",
    )
    train_per_class: int | None = option(
        None, "training images kept per class (default: the data source's, 100 for digits)"
    )
    validation: Validation | None = option(
        DEFAULT_VALIDATION,
        "validation split carved from the training data, which every accuracy is measured on: images per class "
        "(100) or a fraction (0.2); none: no split, the test split (the pre-issue-13 protocol)",
        parse="validation",
    )
    test_per_class: int | None = option(
        None, "test images kept per class (the test split is only used by final evaluations, never seen by a run)"
    )
    split_seed: int = option(
        0,
        "seed of the splits: which training images become the validation split and which are kept (another seed: "
        "a fresh replicate of the same task; the test split is always the source's own)",
    )
    cache_dir: str | os.PathLike | None = option(
        None, "folder of the data sources' downloads and pretrained backbones", cli=False
    )


class Execution(Options):
    """Where and how the runs execute, and where the profile is written."""

    out: str | os.PathLike | None = option(
        None,
        "contribution profile JSON (a .runs.jsonl checkpoint and the probe's head live beside it; rerun to "
        "resume); none: nothing kept on disk",
    )
    workers: int = option(1, "parallel runs (a local process pool, or Ray tasks)", flags=("--workers", "-j"))
    executor: str = option(DEFAULT_EXECUTOR, f"where the runs train: {choices(EXECUTORS)}")
    address: str | None = option(None, "Ray cluster address (with --executor ray)")
    cache: bool = option(
        True,
        "cache the frozen prefix's features once (the feature cache); --no-cache recomputes the prefix in every run",
        flags=("--no-cache",),
        negate=True,
    )
    threads: int | None = option(
        None, "intra-op threads per worker (default: the available cores / workers, or $MEMPLAN_NUM_THREADS)"
    )
    device: str = option(
        "cpu", "cpu | cuda | auto (cuda where torch sees a GPU); not part of the checkpoint's identity"
    )
    progress: bool = option(False, "progress on stderr for every long step", cli=False)


class Estimate(Options):
    """What fills the profile's entries (``memplan.contrib.estimators``)."""

    estimator: str = option(
        DEFAULT_ESTIMATOR,
        f"{choices(ESTIMATORS)}; the profile records which, with its units",
    )
    batches: int = option(8, "mini-batches of an estimator's gradients (and of the probe's one epoch)")
    rank_by: str | os.PathLike | None = option(
        None,
        "a profile of the same model (an estimator's, in seconds): with --weight-layers N the weight runs are for "
        "the N convs it ranks highest (largest entry over ratios), not the last N; the profile says which",
    )


class ContribOptions(Options):
    """Every option of :func:`memplan.contrib.analysis.run_contrib` and ``memplan contrib``."""

    what: ClassVar[str] = "contribution"

    inputs: DataOptions = DataOptions()
    protocol: Protocol = Protocol()
    execution: Execution = Execution()
    estimate: Estimate = Estimate()
