"""The contribution profile: the JSON document that contribution analysis writes and the
sparse-update search reads.

Accuracies and Δacc are in accuracy points (0..100). ``bias[k]`` = Δacc_b[:k] (biases of the
last k convs vs the classifier only); ``weight[layer][ratio]`` = Δacc_W(i, r) (weight of conv
i at ratio r vs the bias-only run over convs i..L-1). Both are means over seeds of the
paired (same-seed) differences; ``*_std`` are their sample standard deviations over seeds
(0 with one seed). ``layers`` lists the convs (``memplan.graph.ConvLayer``: name, conv index,
weight shape, groups, bias carrier).
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..errors import MemplanError
from ..graph import ConvLayer
from ..io import write_text
from ..names import DEFAULT_ESTIMATOR, ESTIMATORS
from ..plan.evidence import accuracy_se
from .adaptive import paired_deltas, standard_error
from .protocol import Protocol, RunSpec

#: 2: the standard error of every Δacc entry (``bias_se`` / ``weight_se``) and the protocol's optimizer;
#: 3: the estimator that measured the entries, their units, per-channel importance
SCHEMA_VERSION = 3

#: the units of a grid profile's entries (every profile before schema 3)
DELTA_ACC_UNITS = "Δacc, accuracy points (mean over seeds of paired differences)"


def is_delta_acc(units: str) -> bool:
    """Whether entries in ``units`` are the grid's Δacc (accuracy points of the profile's protocol),
    the only entries whose sum may be called summed Δacc."""
    return units == DELTA_ACC_UNITS


class RunRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    kind: Literal["classifier", "bias", "weight"]
    k: int = Field(description="biases of the last k convs train")
    layer: str | None = None
    conv_index: int | None = None
    ratio: float | None = None
    seeds: list[int]
    accuracy: list[float] = Field(description="accuracy per seed on the profile's evaluated_on split, %")
    accuracy_mean: float
    accuracy_std: float
    reference: str | None = Field(description="id of the run Δacc is measured against")
    delta: list[float] | None = Field(description="paired Δacc per seed, points")
    delta_mean: float | None
    delta_std: float | None
    trainable_params: int
    train_s: float = Field(description="training seconds, all seeds")
    eval_s: float = Field(description="evaluation seconds, all seeds")
    cache_s: float = Field(description="seconds building this run's feature cache (0 when reused)")
    cpu_s: float = Field(description="CPU seconds of the worker process for this run, all threads")
    cache_bytes: int | None = Field(
        None,
        description="bytes of the cached features (train + test) the run read; 0 without cache, None when not recorded",
    )


class Noise(BaseModel):
    """How much a measurement moves with the seed (data order) alone."""

    accuracy_std: float = Field(description="mean over runs of the std of accuracy across seeds, points")
    delta_std: float = Field(description="mean over bias and weight runs of the std of Δacc across seeds, points")
    seeds: int


class Resolution(BaseModel):
    """Input side (px) of the runs and of the memory costing of the schemes searched from them."""

    model_config = ConfigDict(extra="forbid")

    runs: int = Field(description="input side the contribution runs trained and evaluated at")
    costing: int = Field(
        description="input side the schemes are costed at (memplan search); equal to runs "
        "unless the runs were made smaller for speed"
    )


class ContribProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1, 2, 3] = SCHEMA_VERSION
    model: str
    fingerprint: str = Field(description="memplan.plan.fingerprint of the traced layer table")
    input_shape: list[int] = Field(description="per-sample input shape")
    weights: dict[str, Any] = Field(description="where the backbone weights came from")
    dataset: dict[str, Any]
    protocol: Protocol
    description: str = Field(description="how the numbers were measured, in words")
    probe_accuracy: float = Field(
        description="accuracy (evaluated_on split) of the linear probe every run starts from, %"
    )
    layers: list[ConvLayer]
    bias: dict[int, float] = Field(description="k -> Δacc_b[:k], mean over seeds")
    bias_std: dict[int, float] = Field(default_factory=dict, description="k -> std over seeds (run-based estimators)")
    weight: dict[str, dict[float, float]] = Field(description="layer -> ratio -> Δacc_W, mean over seeds")
    weight_std: dict[str, dict[float, float]] = Field(default_factory=dict)
    bias_se: dict[int, float | None] = Field(
        default_factory=dict,
        description="k -> standard error of Δacc_b[:k]: std of the paired deltas / sqrt(seeds), points; None with "
        "one seed (version 1 files: derived from their runs on load)",
    )
    weight_se: dict[str, dict[float, float | None]] = Field(
        default_factory=dict, description="layer -> ratio -> standard error of Δacc_W, points (as bias_se)"
    )
    noise: Noise | None = Field(None, description="seed noise of the runs (None: no runs, a gradient estimator)")
    runs: list[RunRecord] = Field(default_factory=list)
    estimator: str = Field(
        DEFAULT_ESTIMATOR,
        description=f"memplan.contrib.estimators name that measured the entries ({', '.join(ESTIMATORS)})",
    )
    units: str = Field(DELTA_ACC_UNITS, description="what one entry measures, in words with its unit")
    channel_importance: dict[str, list[float]] = Field(
        default_factory=dict,
        description="conv -> importance per input channel (per channel of a depthwise conv) on the target data, "
        "in the estimator's units; what --select importance ranks (gradient estimators only)",
    )
    lr_selection: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="family (classifier, bias, weight) -> the rate chosen on validation before the grid, the run "
        "that chose it and its accuracy (%) per rate and seed (memplan.contrib.rates; empty: the given rates)",
    )
    timing: dict[str, Any] = Field(description="wall seconds and how the runs were executed")
    resolution: Resolution | None = Field(
        None, description="run and costing resolution (None: profiles before issue 13; the runs used input_shape)"
    )
    evaluated_on: Literal["validation", "test"] = Field(
        "test",
        description="the split every accuracy of the runs was measured on: a validation split carved from "
        "the training data, or (profiles before issue 13) the test split",
    )

    @model_validator(mode="after")
    def _standard_errors(self) -> ContribProfile:
        """Version 1 files hold no standard errors: they follow from the per-seed deltas of their runs."""
        if not self.bias_se and not self.weight_se:
            for r in self.runs:
                if r.kind == "bias":
                    self.bias_se[r.k] = standard_error(r.delta)
                elif r.kind == "weight":
                    self.weight_se.setdefault(r.layer, {})[r.ratio] = standard_error(r.delta)
        return self

    @property
    def run_resolution(self) -> int:
        return self.resolution.runs if self.resolution is not None else self.input_shape[-1]

    @property
    def costing_resolution(self) -> int:
        return self.resolution.costing if self.resolution is not None else self.input_shape[-1]

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically."""
        return write_text(path, self.model_dump_json(indent=1) + "\n")

    def weight_table(self) -> list[tuple[str, int, float, float]]:
        """(layer, conv index, ratio, Δacc) rows in conv order, then ratio."""
        index = {c.name: c.conv_index for c in self.layers}
        return sorted(
            ((name, index[name], r, d) for name, row in self.weight.items() for r, d in row.items()),
            key=lambda row: (row[1], row[2]),
        )


def probe_warning(profile: ContribProfile) -> str | None:
    """A warning, in one line, when the linear probe every run starts from is at chance level: its
    accuracy (%) below chance (100 / classes) plus the larger of two standard errors of a chance
    guess on the evaluated split (binomial) and a tenth of the way from chance to 100%; None
    otherwise, or where the profile records no class or image count."""
    classes, n = profile.dataset.get("classes"), profile.dataset.get(profile.evaluated_on)
    if not isinstance(classes, int) or not isinstance(n, int) or classes < 2 or n < 1:
        return None
    chance = 100.0 / classes
    margin = max(2 * accuracy_se(chance, n), (100.0 - chance) / 10)
    if profile.probe_accuracy >= chance + margin:
        return None
    return (
        f"the linear probe reaches {profile.probe_accuracy:.2f}% on the {n} {profile.evaluated_on} images of "
        f"{classes} classes: chance level ({chance:.1f}%); the backbone's features barely separate the classes, "
        "so every entry is measured from a head that has learnt nothing: check the weights (--weights) and the "
        "data (labels, image layout)"
    )


def load_profile(path: str | os.PathLike) -> ContribProfile:
    """Read a contribution profile; a one-line MemplanError when it cannot be read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise MemplanError(f"cannot read contribution profile {path}: {exc.strerror or exc}") from None
    try:
        return ContribProfile.model_validate(json.loads(text))
    except (json.JSONDecodeError, ValidationError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise MemplanError(f"{path} is not a memplan contribution profile: {first}") from None


def _std(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def run_record(raw: dict[str, Any], reference: dict[str, Any] | None) -> RunRecord:
    """A finished run's record with its paired Δacc against ``reference`` (None for the classifier run)."""
    accs = [float(a) for a in raw["accuracy"]]
    delta = None if reference is None else paired_deltas(raw, reference)
    return RunRecord(
        id=raw["id"],
        kind=raw["kind"],
        k=raw["k"],
        layer=raw["layer"],
        conv_index=raw["conv_index"],
        ratio=raw["ratio"],
        seeds=raw["seeds"],
        accuracy=accs,
        accuracy_mean=statistics.fmean(accs),
        accuracy_std=_std(accs),
        reference=None if reference is None else reference["id"],
        delta=delta,
        delta_mean=None if delta is None else statistics.fmean(delta),
        delta_std=None if delta is None else _std(delta),
        trainable_params=raw["trainable_params"],
        train_s=raw["train_s"],
        eval_s=raw["eval_s"],
        cache_s=raw["cache_s"],
        cpu_s=raw["cpu_s"],
        cache_bytes=raw.get("cache_bytes"),
    )


def from_runs(specs: list[RunSpec], raw: dict[str, dict[str, Any]], layers: list[ConvLayer]) -> dict[str, Any]:
    """The entry fields of a profile (``bias``, ``weight``, their std and SE, ``noise``, ``runs``)
    from a finished grid: ``raw`` maps run ids to worker records."""
    runs = [run_record(raw[s.id], None if s.reference is None else raw[s.reference]) for s in specs]
    runs.sort(key=lambda r: (r.kind != "classifier", r.kind == "weight", -r.k, r.ratio or 0))
    bias = {r.k: r for r in runs if r.kind == "bias"}
    weight: dict[str, dict[float, RunRecord]] = {}
    for r in runs:
        if r.kind == "weight":
            weight.setdefault(r.layer, {})[r.ratio] = r
    by_conv = sorted(weight, key=lambda name: next(c.conv_index for c in layers if c.name == name))
    deltas = [r.delta_std for r in runs if r.delta_std is not None]
    noise = Noise(
        accuracy_std=statistics.fmean(r.accuracy_std for r in runs),
        delta_std=statistics.fmean(deltas) if deltas else 0.0,
        seeds=len(runs[0].seeds),
    )
    return dict(
        bias={k: bias[k].delta_mean for k in sorted(bias)},
        bias_std={k: bias[k].delta_std for k in sorted(bias)},
        weight={name: {r: weight[name][r].delta_mean for r in sorted(weight[name])} for name in by_conv},
        weight_std={name: {r: weight[name][r].delta_std for r in sorted(weight[name])} for name in by_conv},
        bias_se={k: standard_error(bias[k].delta) for k in sorted(bias)},
        weight_se={name: {r: standard_error(weight[name][r].delta) for r in sorted(weight[name])} for name in by_conv},
        noise=noise,
        runs=runs,
    )
