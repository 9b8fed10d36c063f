"""memplan's sparse-update scheme format: versioned JSON (schema versions 1-5; written as 4, or 5 with ``execution``).

A scheme names what trains (``bias_update``: the biases of the last n convs; ``weight_updates``:
conv weights at channel ratios; norm modes, activation approximations; modules an architecture
transform adds, ``added_modules``) for one backbone, identified by the fingerprint of its traced
layer table (added modules excluded: the backbone as it is before the transform).

Conventions and the mapping to a plan are in :mod:`memplan.plan.convert`; tiny-training's
``backward_config`` in :mod:`memplan.plan.tinytraining`.

Versions: 2 adds the ``importance`` channel selection (a weight update that lists its
``channels`` and, optionally, their ``importance_source``); 3 adds ``training`` (the optimizer and
learning rate the scheme was validated with) and ``validation`` (its validation accuracy and the
runners-up); 4 gives ``added_modules`` their structure (:class:`AddedModule`: the architecture
transform, its options, the tag and the fingerprint of the layers it adds; ``apply_scheme``
builds them) and adds the norm mode ``reestimate``; 5 adds ``execution`` (:class:`Execution`:
segments of consecutive blocks recomputed in the backward, a choice that changes neither what
trains nor the gradients; and ``micro_batches``, gradient accumulation where no norm uses batch
statistics). A scheme without ``execution`` is written as version 4, so memplans
that read version 4 still read it; one with it as version 5. Older documents are valid version 4
ones and mean the same (those that list free-form ``added_modules``, which no memplan ever built
or costed, are refused); they load as they are and are written back as version 4.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from ..errors import SchemeError
from ..graph import EXPLICIT_SELECT, SELECT_RULES, LayerGraph, channel_index_problem
from ..io import read_json, shipped, validated, write_text
from ..names import DEFAULT_ESTIMATOR, DEFAULT_SELECT, ESTIMATORS, OBJECTIVES, OPTIMIZERS, SEARCH_MODE, listed
from ..rates import FAMILIES
from ..version import __version__
from .convert import NORM_MODES, check_round_trip, fingerprint, plan_scheme_fields, scheme_to_plan
from .evidence import Validation
from .execution import Execution
from .plan import Plan
from .tinytraining import BackwardFlags, backward_config_fields, to_backward_config

#: 2: the ``importance`` selection with explicit ``channels``; 3: ``training`` and ``validation``;
#: 4: structured ``added_modules`` and the norm mode ``reestimate``; the version a scheme without
#: ``execution`` is written as
SCHEMA_VERSION = 4
#: 5: ``execution`` (recomputed segments); the version a scheme with it is written as
EXECUTION_VERSION = 5
#: the schema versions this memplan reads
SCHEMA_VERSIONS = (1, 2, 3, 4, 5)

Select = Literal[SELECT_RULES]
NormMode = Literal[tuple(NORM_MODES)]


class WeightUpdate(BaseModel):
    """One conv whose weight trains: ``max(1, int(C_in * ratio))`` input channels (the channels /
    groups of a depthwise conv), chosen by ``select``; with ``select == "importance"`` they are
    ``channels`` (sorted, unique; their count is checked against the conv where the scheme is
    mapped to a plan). ``channels`` and ``importance_source`` are left out of the JSON when None."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layer: str = Field(description="conv layer name (module qualname)")
    conv_index: int = Field(ge=0, description="forward-order index among convs, stem = 0, classifier not counted")
    ratio: float = Field(gt=0, le=1, description="fraction of input channels updated, in (0, 1]")
    select: Select = Field(
        DEFAULT_SELECT,
        description="channel selection: largest / smallest weight norm, random, or importance (explicit channels)",
    )
    channels: list[int] | None = Field(
        None,
        description="select importance only: the sorted, unique input-channel indices that train (depthwise: "
        "channel / group indices), max(1, int(C_in * ratio)) of them",
    )
    importance_source: str | None = Field(
        None, description="select importance only: what ranked the channels, e.g. fisher:MODEL-DATA"
    )

    @model_validator(mode="after")
    def _explicit_channels(self) -> WeightUpdate:
        if self.select == EXPLICIT_SELECT:
            if self.channels is None:
                raise ValueError(f"select {EXPLICIT_SELECT!r} needs its channels")
            problem = channel_index_problem(self.channels)
            if problem is not None:
                raise ValueError(problem)
        elif self.channels is not None or self.importance_source is not None:
            raise ValueError(f"channels and importance_source go with select {EXPLICIT_SELECT!r} only")
        return self

    @model_serializer(mode="wrap")
    def _omit_unused(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for key in ("channels", "importance_source"):
            if data.get(key) is None:
                data.pop(key, None)
        return data


class AddedModule(BaseModel):
    """Modules an architecture transform adds to the backbone (TinyTL's lite residual branches).

    ``apply_scheme`` builds them on the plain model by running the ``memplan.strategies``
    architecture transform ``architecture`` with ``options`` at the scheme's input shape, then
    checks that the layers it added are those the scheme was planned with (``layers``). Every
    parameter of theirs trains and their norms run in train mode (batch statistics), as TinyTL
    trains its branches; the backbone's layers keep their names, conv indices and fingerprint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    architecture: str = Field(description="memplan.strategies architecture transform that adds them, e.g. lite")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="every option of that transform (defaults filled in), e.g. lite=true, lite_kernel=5, "
        "lite_groups=2, lite_downsample=2, lite_norm=null, lite_blocks=null",
    )
    tag: str = Field(description="the tag (graph.model.TAG_ATTR) of the modules it adds, e.g. lite_residual")
    layers: str = Field(
        pattern="^[0-9a-f]{16}$",
        description="16 hex digits of SHA-256 over [(name, kind, weight shape)] of the added layers "
        "(memplan.plan.convert.added_fingerprint)",
    )


class Provenance(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    memplan_version: str
    command: str | None = Field(None, description="command line that produced the scheme")
    date: str = Field(description="ISO 8601, UTC")
    profile_hash: str | None = Field(None, description="hash of the contribution profile the search used")
    objective: str | None = Field(
        None,
        description=f"what the search maximised (memplan.search.objective: {listed(OBJECTIVES)}); None: not recorded",
    )
    estimator: str | None = Field(
        None,
        description=f"estimator of the profile's entries (memplan.contrib.estimators: {listed(ESTIMATORS)}); "
        f"None: not recorded ({DEFAULT_ESTIMATOR})",
    )


def new_provenance(
    command: str | None = None,
    profile_hash: str | None = None,
    objective: str | None = None,
    estimator: str | None = None,
) -> Provenance:
    date = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    return Provenance(
        memplan_version=__version__,
        command=command,
        date=date,
        profile_hash=profile_hash,
        objective=objective,
        estimator=estimator,
    )


class Training(BaseModel):
    """How the scheme trains: what its validation stage chose (``memplan search --validate``), or
    the rates its profile chose per family (``contrib --lr-grid``); training code gets it from
    ``memplan.train.make_optimizer(model, scheme=...)``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    optimizer: str = Field(description=f"memplan.optim name ({listed(OPTIMIZERS)})")
    lr: float = Field(gt=0, description="learning rate of every trained tensor whose family rates leaves out")
    epochs: int = Field(ge=1, description="epochs it was validated with (cosine decay to 0 over them)")
    batch_size: int = Field(ge=1, description="training batch it was validated with")
    rates: dict[str, float] = Field(
        default_factory=dict,
        description=f"parameter family (memplan.rates.FAMILIES: {listed(FAMILIES)}) -> its learning rate",
    )
    classifier: str | None = Field(
        None, description="the head's module name (its parameters are the classifier family); None: no head family"
    )

    @model_validator(mode="after")
    def _families(self) -> Training:
        unknown = set(self.rates) - set(FAMILIES)
        if unknown:
            raise ValueError(f"unknown parameter families {sorted(unknown)} (families: {', '.join(FAMILIES)})")
        if any(not (v > 0) for v in self.rates.values()):
            raise ValueError("learning rates must be positive")
        return self

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if data.get("classifier") is None:  # documents written before it stay as they were
            data.pop("classifier", None)
        return data


class Scheme(BaseModel):
    """A sparse-update scheme (JSON schema version 4, 5 with ``execution``; versions 1 to 3 load and
    mean the same).
    Byte sizes are integers in bytes.

    ``norm_modes``: per-norm overrides (``memplan.plan.NORM_MODES``): ``frozen``, ``shift`` (eval
    mode, shift trains), ``affine`` (eval mode, scale + shift), ``train`` (train mode, batch
    statistics, scale + shift) and ``reestimate`` (a norm with running statistics: they are
    re-estimated on the target data before training, by a forward pass in train mode without
    gradient, ``memplan.train.reestimate_norm_stats``, then frozen, eval mode; scale + shift
    train; its training costs those of ``affine``, and the linear-probe head is re-fit on the new
    statistics by the contribution runner). ``added_modules``: modules an architecture transform
    adds (:class:`AddedModule`); ``apply_scheme`` builds them on the plain model."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1, 2, 3, 4, 5] = SCHEMA_VERSION
    model: str = Field(description="zoo name or import path (package.module:attr, file.py:attr)")
    fingerprint: str = Field(description="memplan.plan.fingerprint of the traced layer table")
    input_shape: list[int] = Field(description="per-sample input shape, e.g. [3, 128, 128]")
    batch: int = Field(1, ge=1)
    mode: str = Field(SEARCH_MODE, description="accounting mode the scheme was planned under")
    optimizer: str | None = Field(
        None,
        description="optimizer whose state `predicted` counts and that training should use (memplan.optim: "
        f"{listed(OPTIMIZERS)}); None: not recorded (schemes written before it)",
    )
    budget_bytes: int | None = Field(None, ge=0, description="memory budget of the search, bytes")
    flops_budget: int | None = Field(None, ge=0, description="backward-FLOPs budget of the search (2 x MACs)")
    bias_update: int = Field(ge=0, description="the biases of the last n convs update")
    weight_updates: list[WeightUpdate] = Field(default_factory=list)
    norm_modes: dict[str, NormMode] = Field(default_factory=dict, description="per-norm overrides")
    activation_approx: list[str] = Field(
        default_factory=list, description="activations with sign-approximated 1-bit backward"
    )
    added_modules: list[AddedModule] = Field(
        default_factory=list,
        description="modules an architecture transform adds (TinyTL's lite residual branches), built by apply_scheme",
    )
    predicted: dict[str, float] | None = Field(
        None,
        description="predicted memory breakdown, bytes; under a FLOPs budget also backward_flops (FLOPs = 2 x MACs)",
    )
    summed_delta_acc: float | None = Field(
        None, description="sum of the grid profile's accuracy gains, points (None: the profile is not the grid's)"
    )
    summed_estimate: float | None = Field(
        None,
        description="sum of the profile's entries in the units of its estimator (provenance.estimator), when they "
        f"are not the {DEFAULT_ESTIMATOR} estimator's Δacc",
    )
    provenance: Provenance = Field(default_factory=new_provenance)
    backward_flags: BackwardFlags = Field(default_factory=BackwardFlags)
    training: Training | None = Field(None, description="optimizer and learning rate it was validated with")
    validation: Validation | None = Field(None, description="validation accuracy and runners-up (search --validate)")
    execution: Execution | None = Field(
        None,
        description="execution choices (schema version 5): segments recomputed in the backward, micro-batches",
    )

    @model_validator(mode="before")
    @classmethod
    def _execution_version(cls, data: Any) -> Any:
        """A scheme made with ``execution`` and no version is version 5."""
        if isinstance(data, dict) and data.get("execution") is not None and "schema_version" not in data:
            data = {**data, "schema_version": EXECUTION_VERSION}
        return data

    @model_serializer(mode="wrap")
    def _omit_execution(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if data.get("execution") is None:  # documents without it stay version 4 documents
            data.pop("execution", None)
        return data

    @model_validator(mode="after")
    def _one_update_per_conv(self) -> Scheme:
        seen: set[int] = set()
        for w in self.weight_updates:
            if w.conv_index in seen:
                raise ValueError(f"conv index {w.conv_index} has two weight updates")
            seen.add(w.conv_index)
        if self.execution is not None and self.schema_version < EXECUTION_VERSION:
            raise ValueError(f"execution needs schema_version {EXECUTION_VERSION}")
        if self.execution is not None and self.batch % self.execution.micro_batches:
            raise ValueError(
                f"execution.micro_batches {self.execution.micro_batches} does not divide batch {self.batch}"
            )
        if self.schema_version == 1 and any(w.select == EXPLICIT_SELECT for w in self.weight_updates):
            raise ValueError(f"schema_version 1 has no {EXPLICIT_SELECT!r} selection; it needs schema_version 2")
        tags = [a.tag for a in self.added_modules]
        if len(set(tags)) != len(tags):
            raise ValueError(f"added_modules lists tag {next(t for t in tags if tags.count(t) > 1)!r} twice")
        return self

    @classmethod
    def from_plan(cls, graph: LayerGraph, plan: Plan, **fields: Any) -> Scheme:
        """The scheme whose plan on ``graph`` is exactly ``plan`` (a strategy's: train all biases,
        full fine-tuning, MobileTL, TinyTL-L+B on the graph of the model with its lite residual
        branches, ...; :func:`memplan.plan.convert.plan_scheme_fields`). Added modules become
        ``added_modules`` (from ``plan.added``, which ``make_plan`` records); everything else is
        named as in the model before the transform. ``fields`` set the other fields (mode,
        provenance, ...). SchemeError when no scheme says it."""
        base = dict(model=graph.model_name, fingerprint=fingerprint(graph), input_shape=list(graph.input_shape[1:]))
        parsed = plan_scheme_fields(graph, plan)
        scheme = validated(lambda: cls(**{**base, **fields, **parsed}), f"plan {plan.method!r}", SchemeError)
        check_round_trip(graph, plan, scheme)
        return scheme

    def save(self, path: str | os.PathLike) -> None:
        """Write the scheme as JSON (schema version :data:`SCHEMA_VERSION`, also for one read from
        a version 1 file; :data:`EXECUTION_VERSION` with ``execution``), atomically."""
        version = SCHEMA_VERSION if self.execution is None else EXECUTION_VERSION
        current = self.model_copy(update={"schema_version": version})
        write_text(path, current.model_dump_json(indent=2) + "\n")

    def to_backward_config(self) -> dict[str, Any]:
        """tiny-training's ``backward_config`` dict (:func:`memplan.plan.tinytraining.to_backward_config`)."""
        return to_backward_config(self)

    @classmethod
    def from_backward_config(cls, config: dict[str, Any], graph: LayerGraph, **fields: Any) -> Scheme:
        """A scheme from tiny-training's ``backward_config`` for the traced ``graph``
        (:func:`memplan.plan.tinytraining.backward_config_fields` says which forms are read).
        ``fields`` set the other scheme fields (model, provenance, ...). Refuses a config that
        does not fit the model."""
        parsed = backward_config_fields(config, graph)
        base = dict(
            model=graph.model_name,
            fingerprint=fingerprint(graph),
            input_shape=list(graph.input_shape[1:]),
            batch=graph.batch,
        )
        scheme = validated(lambda: cls(**{**base, **fields, **parsed}), "backward_config", SchemeError)
        scheme_to_plan(graph, scheme)  # refuse what does not fit the model now
        return scheme


# --------------------------------------------------------------------------- files


def scheme_from_dict(data: dict[str, Any], source: str = "scheme") -> Scheme:
    """Validate a memplan scheme dict (any known schema version)."""
    version = data.get("schema_version")
    if version is None:
        hint = "it looks like a tiny-training backward_config" if "n_bias_update" in data else None
        raise SchemeError(f"{source} has no schema_version", hint or "is it a memplan scheme?")
    if version not in SCHEMA_VERSIONS or isinstance(version, bool):
        raise SchemeError(
            f"{source} has schema_version {version!r}; this memplan reads versions "
            f"{', '.join(map(str, SCHEMA_VERSIONS))}",
            "upgrade memplan or re-export the scheme",
        )
    return validated(lambda: Scheme.model_validate(data), source, SchemeError)


def load_scheme(path: str | os.PathLike) -> Scheme:
    """Read a memplan scheme JSON file."""
    return scheme_from_dict(read_json(path, "scheme file", SchemeError), f"scheme file {path}")


def shipped_scheme(name: str) -> Path:
    """Path of a scheme shipped with memplan (package data ``memplan/data/schemes``; the
    repository's ``search/`` links to it), e.g. ``shipped_scheme("mcunet-5fps-100KB")``."""
    path = shipped("schemes", f"{name.removesuffix('.json')}.json")
    if not path.is_file():
        names = sorted(p.stem for p in shipped("schemes").glob("*.json"))
        raise SchemeError(f"no shipped scheme {name!r}", f"shipped: {', '.join(names)}")
    return path


def schema_json() -> str:
    """The JSON Schema of the scheme format (``schema/scheme.schema.json`` is a copy)."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **Scheme.model_json_schema()}
    return json.dumps(schema, indent=2) + "\n"
