"""Sparse-update schemes: memplan's versioned JSON format (schema version 1), import / export
of tiny-training's ``backward_config`` dict, and the scheme -> :class:`~memplan.plan.Plan` mapping.

Conventions (the 256KB paper, accounting.md §4):

* convs are indexed in forward order, stem = 0; a classifier that is a conv (fully
  convolutional nets) is not counted (:func:`conv_layers`);
* ``bias_update = n``: the biases of the last n convs update. In the paper's models BN is folded
  into the conv, which then carries a bias. In a conv -> BN model the conv has no bias and the
  BN shift right after it plays that role: it trains (shift only) with the norm in eval mode
  (frozen statistics, frozen scale) -- :func:`bias_carrier`;
* every weight update lies within the bias-update range (tiny-training asserts the same);
* the classifier always trains (weight and bias);
* the fingerprint hashes the layer table without the classifier, so a scheme transfers across
  head sizes but not across backbones.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import MemplanError
from .graph import LayerGraph, Node
from .io import write_text
from .ops import ACTIVATIONS, NORM_KINDS
from .plan import SELECT_RULES, Plan, Train

SCHEMA_VERSION = 1

Select = Literal["magnitude+", "magnitude-", "random"]
#: per-norm override: (scale trains, shift trains, batch statistics)
NORM_MODES: dict[str, tuple[bool, bool, bool]] = {
    "frozen": (False, False, False),  # eval mode, nothing trains
    "shift": (False, True, False),  # eval mode, shift only (MobileTL's internal norms)
    "affine": (True, True, False),  # eval mode, scale + shift
    "train": (True, True, True),  # train mode (batch statistics), scale + shift
}
NormMode = Literal["frozen", "shift", "affine", "train"]
#: backward_config keys memplan reads; ``freeze_fc`` is accepted and ignored, as tiny-training does
BACKWARD_CONFIG_KEYS = ("enable_backward_config", "n_bias_update", "n_weight_update", "manual_weight_idx",
                        "weight_update_ratio", "weight_select_criteria", "pw1_weight_only", "quantize_gradient",
                        "train_scale", "freeze_fc")


class SchemeError(MemplanError):
    """A scheme that cannot be read, or does not fit the model."""


class WeightUpdate(BaseModel):
    """One conv whose weight trains: ``int(C_in * ratio)`` input channels (output channels for a
    depthwise conv), chosen by ``select``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layer: str = Field(description="conv layer name (module qualname)")
    conv_index: int = Field(ge=0, description="forward-order index among convs, stem = 0, classifier not counted")
    ratio: float = Field(gt=0, le=1, description="fraction of input channels updated, in (0, 1]")
    select: Select = Field("magnitude+", description="channel selection: largest / smallest weight norm, random")


class BackwardFlags(BaseModel):
    """tiny-training ``backward_config`` flags, kept for a lossless round trip: ``pw1_weight_only`` is
    already applied to the weight updates at import; the other two are training options with no
    memory effect here."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pw1_weight_only: bool = False
    quantize_gradient: bool = False
    train_scale: bool = False


class Provenance(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    memplan_version: str
    command: str | None = Field(None, description="command line that produced the scheme")
    date: str = Field(description="ISO 8601, UTC")
    profile_hash: str | None = Field(None, description="hash of the contribution profile the search used")


def new_provenance(command: str | None = None, profile_hash: str | None = None) -> Provenance:
    from . import __version__

    date = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    return Provenance(memplan_version=__version__, command=command, date=date, profile_hash=profile_hash)


class Scheme(BaseModel):
    """A sparse-update scheme (JSON schema version 1). Byte sizes are integers in bytes."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = SCHEMA_VERSION
    model: str = Field(description="zoo name or import path (package.module:attr, file.py:attr)")
    fingerprint: str = Field(description="memplan.scheme.fingerprint of the traced layer table")
    input_shape: list[int] = Field(description="per-sample input shape, e.g. [3, 128, 128]")
    batch: int = Field(1, ge=1)
    mode: str = Field("tinytraining", description="accounting mode the scheme was planned under")
    budget_bytes: int | None = Field(None, ge=0, description="memory budget of the search, bytes")
    bias_update: int = Field(ge=0, description="the biases of the last n convs update")
    weight_updates: list[WeightUpdate] = Field(default_factory=list)
    norm_modes: dict[str, NormMode] = Field(default_factory=dict, description="per-norm overrides")
    activation_approx: list[str] = Field(default_factory=list,
                                         description="activations with sign-approximated 1-bit backward")
    added_modules: list[dict[str, Any]] = Field(default_factory=list,
                                                description="architecture additions, e.g. lite residual config")
    predicted: dict[str, float] | None = Field(None, description="predicted memory breakdown, bytes")
    summed_delta_acc: float | None = Field(None, description="sum of contribution-analysis accuracy gains")
    provenance: Provenance = Field(default_factory=new_provenance)
    backward_flags: BackwardFlags = Field(default_factory=BackwardFlags)

    @model_validator(mode="after")
    def _one_update_per_conv(self) -> "Scheme":
        seen: set[int] = set()
        for w in self.weight_updates:
            if w.conv_index in seen:
                raise ValueError(f"conv index {w.conv_index} has two weight updates")
            seen.add(w.conv_index)
        return self

    def save(self, path: str | os.PathLike) -> None:
        """Write the scheme as JSON, atomically."""
        write_text(path, self.model_dump_json(indent=2) + "\n")

    def to_backward_config(self) -> dict[str, Any]:
        """tiny-training's ``backward_config`` dict (lists, not its CLI's dash-joined strings).

        Refuses what that format cannot hold: norm overrides, activation approximations, added
        modules, or weight updates with different channel selection rules."""
        for field in ("norm_modes", "activation_approx", "added_modules"):
            if getattr(self, field):
                raise SchemeError(f"scheme has {field}, which tiny-training's backward_config cannot hold",
                                  "export it as memplan scheme JSON")
        selects = {w.select for w in self.weight_updates}
        if len(selects) > 1:
            raise SchemeError("scheme mixes channel selection rules; tiny-training's backward_config has one "
                              "weight_select_criteria")
        updates = sorted(self.weight_updates, key=lambda w: w.conv_index)
        flags = self.backward_flags
        return {
            "enable_backward_config": 1,
            "n_bias_update": self.bias_update,
            "manual_weight_idx": [w.conv_index for w in updates],
            "weight_update_ratio": [w.ratio for w in updates],
            "weight_select_criteria": selects.pop() if selects else "magnitude+",
            "pw1_weight_only": int(flags.pw1_weight_only),
            "quantize_gradient": int(flags.quantize_gradient),
            "train_scale": int(flags.train_scale),
        }

    @classmethod
    def from_backward_config(cls, config: dict[str, Any], graph: LayerGraph, **fields: Any) -> "Scheme":
        """A scheme from tiny-training's ``backward_config`` for the traced ``graph``.

        Accepts the forms tiny-training's parser does: ``n_bias_update`` int or ``"all"``;
        ``manual_weight_idx`` list / int / dash-joined string, or absent with ``n_weight_update``
        (int or ``"all"``: the last n convs); ``weight_update_ratio`` list / dash-joined string /
        one number / None (= 1). ``pw1_weight_only`` drops non-pw1 indices as tiny-training does.
        Indices at ratio 0 update their bias only, which ``bias_update`` already covers, so they
        are dropped. ``fields`` set the other scheme fields (model, provenance, ...)."""
        convs = conv_layers(graph)
        unknown = sorted(set(config) - set(BACKWARD_CONFIG_KEYS))
        if unknown:
            raise SchemeError(f"backward_config has unknown key {unknown[0]!r}",
                              f"known keys: {', '.join(BACKWARD_CONFIG_KEYS)}")
        n_bias = _count(config.get("n_bias_update", 0), len(convs), "n_bias_update")
        idx = config.get("manual_weight_idx")
        if idx is None:
            n_weight = _count(config.get("n_weight_update") or 0, n_bias, "n_weight_update")
            idx = list(range(len(convs) - n_weight, len(convs)))
        idx = [int(i) for i in _items(idx, "manual_weight_idx")]
        if idx != sorted(idx):
            raise SchemeError(f"backward_config manual_weight_idx {idx} is not sorted",
                              "tiny-training pairs the ratios with the sorted indices; sort both lists")
        flags = BackwardFlags(**{k: bool(config.get(k, 0)) for k in BackwardFlags.model_fields})
        if flags.pw1_weight_only:
            idx = [i for i in idx if 0 <= i < len(convs) and is_pw1(convs[i])]
        ratios = config.get("weight_update_ratio")
        if ratios is None or isinstance(ratios, (int, float)):
            ratios = [1.0 if ratios is None else float(ratios)] * len(idx)
        ratios = [float(r) for r in _items(ratios, "weight_update_ratio")]
        if len(ratios) != len(idx):
            raise SchemeError(f"backward_config pairs {len(idx)} manual_weight_idx with {len(ratios)} "
                              "weight_update_ratio values", "give one ratio per index")
        select = config.get("weight_select_criteria", "magnitude+")
        if select not in SELECT_RULES:
            raise SchemeError(f"unknown weight_select_criteria {select!r}", f"use one of {', '.join(SELECT_RULES)}")
        updates = []
        for i, r in zip(idx, ratios):
            if not 0 <= i < len(convs):
                raise SchemeError(f"manual_weight_idx {i} is out of range", f"the model has {len(convs)} convs")
            if r != 0:
                updates.append(dict(layer=convs[i].name, conv_index=i, ratio=r, select=select))
        base = dict(model=graph.model_name, fingerprint=fingerprint(graph), input_shape=list(graph.input_shape[1:]),
                    batch=graph.batch)
        scheme = _validated(lambda: cls(**{**base, **fields, "bias_update": n_bias, "weight_updates": updates,
                                           "backward_flags": flags}), "backward_config")
        scheme_to_plan(graph, scheme)  # refuse what does not fit the model now
        return scheme


def _count(value: Any, limit: int, key: str) -> int:
    if value == "all":
        return limit
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemeError(f"backward_config {key} must be a non-negative integer or 'all', got {value!r}")
    return value


def _items(value: Any, key: str) -> list[Any]:
    """A list, one number, or tiny-training's dash-joined string ("21-24-0.125")."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value]
    if isinstance(value, str):
        try:
            return [float(p) if "." in p else int(p) for p in value.split("-") if p]
        except ValueError:
            pass
    raise SchemeError(f"cannot read backward_config {key} {value!r}", "give a list of numbers")


def _validated(build: Any, source: str) -> Any:
    """Run a pydantic constructor; turn its first error into one line naming the field."""
    try:
        return build()
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise SchemeError(f"{source}: field '{where}': {err['msg']}") from None


# --------------------------------------------------------------------------- files


def read_json(path: str | os.PathLike, what: str = "scheme file") -> dict[str, Any]:
    """A JSON object from ``path``, with one-line errors for missing, empty and broken files."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise SchemeError(f"{what} {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SchemeError(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not text.strip():
        raise SchemeError(f"{what} {path} is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemeError(f"{what} {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
                          "is it truncated?") from None
    if not isinstance(data, dict):
        raise SchemeError(f"{what} {path} holds a JSON {type(data).__name__}, not an object")
    return data


def is_backward_config(data: dict[str, Any]) -> bool:
    """tiny-training's dict has ``n_bias_update`` and no ``schema_version``."""
    return "schema_version" not in data and "n_bias_update" in data


def scheme_from_dict(data: dict[str, Any], source: str = "scheme") -> Scheme:
    """Validate a memplan scheme dict (any known schema version)."""
    version = data.get("schema_version")
    if version is None:
        hint = "it looks like a tiny-training backward_config" if "n_bias_update" in data else None
        raise SchemeError(f"{source} has no schema_version", hint or "is it a memplan scheme?")
    if version != SCHEMA_VERSION:
        raise SchemeError(f"{source} has schema_version {version!r}; this memplan reads version {SCHEMA_VERSION}",
                          "upgrade memplan or re-export the scheme")
    return _validated(lambda: Scheme.model_validate(data), source)


def load_scheme(path: str | os.PathLike) -> Scheme:
    """Read a memplan scheme JSON file."""
    return scheme_from_dict(read_json(path), f"scheme file {path}")


def schema_json() -> str:
    """The JSON Schema of the scheme format (``schema/scheme.schema.json`` is a copy)."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **Scheme.model_json_schema()}
    return json.dumps(schema, indent=2) + "\n"


# --------------------------------------------------------------------------- layers


def conv_layers(graph: LayerGraph) -> list[Node]:
    """Convs with parameters in forward order (the scheme's conv index); a conv classifier is excluded."""
    head = graph.classifier
    return [n for n in graph.nodes if n.kind == "conv" and n.params and n is not head]


def fingerprint(graph: LayerGraph) -> str:
    """16 hex digits of SHA-256 over [(name, kind, weight shape)] of the conv / linear / norm layers,
    classifier excluded (so schemes transfer across head sizes)."""
    head = graph.classifier
    rows = [(n.name, n.kind, list(n.params["weight"].shape) if "weight" in n.params else None)
            for n in graph.param_nodes() if n is not head]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def is_pw1(conv: Node) -> bool:
    """First pointwise conv of an inverted residual block: 1x1, more outputs than inputs (tiny-training's rule)."""
    w = conv.params["weight"].shape
    return len(w) > 2 and all(k == 1 for k in w[2:]) and w[0] > conv.in_tensors[0].shape[1]


def bias_carrier(graph: LayerGraph, conv: Node) -> Node | None:
    """The parameter that acts as ``conv``'s bias: its own bias, or else the shift of a norm that is
    the only consumer of its output (conv -> BN, BN folded into the conv on the device)."""
    if "bias" in conv.params:
        return conv
    consumers = [n for n in graph.nodes if conv.index in n.inputs]
    if len(consumers) == 1 and consumers[0].kind in NORM_KINDS and "bias" in consumers[0].params:
        return consumers[0]
    return None


def scheme_to_plan(graph: LayerGraph, scheme: Scheme, method: str = "sparse") -> Plan:
    """The plan of ``scheme`` on ``graph``; raises SchemeError when they do not fit."""
    if scheme.fingerprint != fingerprint(graph):
        raise SchemeError(f"scheme was planned for {scheme.model}; this model's layer table differs",
                          "plan a scheme for this model")
    convs = conv_layers(graph)
    if scheme.bias_update > len(convs):
        raise SchemeError(f"scheme updates the biases of the last {scheme.bias_update} convs; the model has "
                          f"{len(convs)}")
    first = len(convs) - scheme.bias_update
    train: dict[str, Train] = {}
    for conv in convs[first:]:
        carrier = bias_carrier(graph, conv)
        if carrier is None:
            raise SchemeError(f"conv {conv.name!r} has no bias and no norm after it, so its bias cannot update")
        train[carrier.name] = Train(0.0, True)
    for w in scheme.weight_updates:
        if not 0 <= w.conv_index < len(convs):
            raise SchemeError(f"weight update of {w.layer!r}: conv index {w.conv_index} is out of range",
                              f"the model has {len(convs)} convs (0 to {len(convs) - 1})")
        conv = convs[w.conv_index]
        if conv.name != w.layer:
            known = {c.name for c in convs}
            detail = f"conv {w.conv_index} is {conv.name!r}" if w.layer in known else "no conv has that name"
            raise SchemeError(f"weight update names layer {w.layer!r}, but {detail}")
        if w.conv_index < first:
            raise SchemeError(f"weight update of conv {w.conv_index} ({w.layer}) lies outside the bias-update range",
                              f"bias_update {scheme.bias_update} covers convs {first} to {len(convs) - 1}")
        train[conv.name] = Train(w.ratio, "bias" in conv.params, w.select)
    norm_train: set[str] = set()
    for name, mode in scheme.norm_modes.items():
        node = _layer(graph, name, NORM_KINDS, "norm_modes")
        scale, shift, stats = NORM_MODES[mode]
        train[node.name] = Train(float(scale and "weight" in node.params), shift and "bias" in node.params)
        if stats:
            norm_train.add(node.name)
    approx = {_layer(graph, name, ACTIVATIONS, "activation_approx").name for name in scheme.activation_approx}
    head = graph.classifier
    train[head.name] = Train(1.0, "bias" in head.params)
    return Plan(method, train, norm_train, approx)


def _layer(graph: LayerGraph, name: str, kinds: frozenset[str], field: str) -> Node:
    try:
        node = graph.by_name(name)
    except KeyError:
        raise SchemeError(f"scheme {field} names unknown layer {name!r}") from None
    if node.kind not in kinds:
        raise SchemeError(f"scheme {field} names {name!r}, a {node.kind} layer")
    return node
