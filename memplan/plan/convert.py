"""Scheme -> :class:`~memplan.plan.plan.Plan` on a traced graph, and the layer-table fingerprint.

Conventions (the 256KB paper, accounting.md §4; ``memplan.graph.conv`` for conv indices and
bias carriers):

* ``bias_update = n``: the biases of the last n convs update. In a conv -> BN model the conv
  has no bias and the BN shift right after it plays that role: it trains (shift only) with the
  norm in eval mode (frozen statistics, frozen scale);
* every weight update lies within the bias-update range (tiny-training asserts the same);
* an ``importance`` weight update lists exactly ``sub_channels(C_in, ratio)`` channel indices
  below ``C_in`` (a depthwise conv: its channels / groups); the plan's ``Train.channels`` carries them;
* the classifier always trains (weight and bias);
* the fingerprint hashes the layer table without the classifier, so a scheme transfers across
  head sizes but not across backbones.

The scheme is read by its fields (``memplan.plan.scheme.Scheme``), so this module sits below
the format.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..errors import SchemeError
from ..graph import LayerGraph, Node, bias_carrier, channel_index_problem, conv_layers
from ..graph.kinds import ACTIVATIONS, NORM_KINDS
from .plan import Plan, Train

#: per-norm override: (scale trains, shift trains, batch statistics)
NORM_MODES: dict[str, tuple[bool, bool, bool]] = {
    "frozen": (False, False, False),  # eval mode, nothing trains
    "shift": (False, True, False),  # eval mode, shift only (MobileTL's internal norms)
    "affine": (True, True, False),  # eval mode, scale + shift
    "train": (True, True, True),  # train mode (batch statistics), scale + shift
}


def fingerprint(graph: LayerGraph) -> str:
    """16 hex digits of SHA-256 over [(name, kind, weight shape)] of the conv / linear / norm layers,
    classifier excluded (so schemes transfer across head sizes)."""
    head = set(graph.classifier_layers)
    rows = [
        (n.name, n.kind, list(n.params["weight"].shape) if "weight" in n.params else None)
        for n in graph.param_nodes()
        if n not in head
    ]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def scheme_to_plan(graph: LayerGraph, scheme: Any, method: str = "sparse") -> Plan:
    """The plan of ``scheme`` (a ``memplan.plan.scheme.Scheme``) on ``graph``; raises SchemeError
    when they do not fit."""
    if scheme.fingerprint != fingerprint(graph):
        raise SchemeError(
            f"scheme was planned for {scheme.model}; this model's layer table differs", "plan a scheme for this model"
        )
    convs = conv_layers(graph)
    if scheme.bias_update > len(convs):
        raise SchemeError(
            f"scheme updates the biases of the last {scheme.bias_update} convs; the model has {len(convs)}"
        )
    first = len(convs) - scheme.bias_update
    train: dict[str, Train] = {}
    for conv in convs[first:]:
        carrier = bias_carrier(graph, conv)
        if carrier is None:
            raise SchemeError(f"conv {conv.name!r} has no bias and no norm after it, so its bias cannot update")
        train[carrier.name] = Train(0.0, True)
    for w in scheme.weight_updates:
        if not 0 <= w.conv_index < len(convs):
            raise SchemeError(
                f"weight update of {w.layer!r}: conv index {w.conv_index} is out of range",
                f"the model has {len(convs)} convs (0 to {len(convs) - 1})",
            )
        conv = convs[w.conv_index]
        if conv.name != w.layer:
            known = {c.name for c in convs}
            detail = f"conv {w.conv_index} is {conv.name!r}" if w.layer in known else "no conv has that name"
            raise SchemeError(f"weight update names layer {w.layer!r}, but {detail}")
        if w.conv_index < first:
            raise SchemeError(
                f"weight update of conv {w.conv_index} ({w.layer}) lies outside the bias-update range",
                f"bias_update {scheme.bias_update} covers convs {first} to {len(convs) - 1}",
            )
        channels = getattr(w, "channels", None)
        if channels is not None:
            shape, groups = conv.params["weight"].shape, int(conv.attrs.get("groups", 1))
            problem = channel_index_problem(channels, shape[1] * groups, w.ratio)
            if problem is not None:
                raise SchemeError(f"weight update of conv {w.conv_index} ({w.layer}): {problem}")
            channels = tuple(channels)
        train[conv.name] = Train(w.ratio, "bias" in conv.params, w.select, channels)
    norm_train: set[str] = set()
    for name, mode in scheme.norm_modes.items():
        node = _layer(graph, name, NORM_KINDS, "norm_modes")
        scale, shift, stats = NORM_MODES[mode]
        train[node.name] = Train(float(scale and "weight" in node.params), shift and "bias" in node.params)
        if stats:
            norm_train.add(node.name)
    approx = {_layer(graph, name, ACTIVATIONS, "activation_approx").name for name in scheme.activation_approx}
    train.update({n.name: Train(float("weight" in n.params), "bias" in n.params) for n in graph.classifier_layers})
    return Plan(method, train, norm_train, approx)


def _layer(graph: LayerGraph, name: str, kinds: frozenset[str], field: str) -> Node:
    try:
        node = graph.by_name(name)
    except KeyError:
        raise SchemeError(f"scheme {field} names unknown layer {name!r}") from None
    if node.kind not in kinds:
        raise SchemeError(f"scheme {field} names {name!r}, a {node.kind} layer")
    return node


def plan_scheme_fields(graph: LayerGraph, plan: Plan) -> dict[str, Any]:
    """The scheme fields (``bias_update``, ``weight_updates`` as dicts, ``norm_modes``,
    ``activation_approx``) whose :func:`scheme_to_plan` is ``plan`` on ``graph``: the inverse map,
    so that a strategy's plan (train all biases, full fine-tuning, ...) is one point of the scheme
    space. Raises SchemeError when the plan trains something a scheme cannot say (a bias range that
    is not the last n convs, a layer that is neither a conv, a norm nor the classifier)."""
    convs = conv_layers(graph)
    head = {n.name for n in graph.classifier_layers}
    carriers = {}
    for conv in convs:
        carrier = bias_carrier(graph, conv)
        carriers[conv.name] = None if carrier is None else carrier.name
    trains_bias = [carriers[c.name] is not None and plan.train.get(carriers[c.name], Train()).bias for c in convs]
    n = len(convs) - next((i for i, t in enumerate(trains_bias) if t), len(convs))
    if not all(trains_bias[len(convs) - n :]):
        raise SchemeError(f"plan {plan.method!r} trains biases that are not those of the last n convs")
    fields: dict[str, Any] = {"bias_update": n, "weight_updates": [], "norm_modes": {}}
    covered = {carriers[c.name] for c in convs[len(convs) - n :]}
    for i, conv in enumerate(convs):
        t = plan.train.get(conv.name)
        if t is not None and t.weight > 0:
            fields["weight_updates"].append(
                {"layer": conv.name, "conv_index": i, "ratio": t.weight, "select": t.select}
                | ({"channels": list(t.channels)} if t.channels is not None else {})
            )
    modes = {v: k for k, v in NORM_MODES.items()}
    norms = [x for x in graph.param_nodes() if x.kind in NORM_KINDS and x.name not in head]
    for node in norms:
        t = plan.train.get(node.name, Train())
        stats = node.name in plan.norm_train
        key = (t.weight > 0, t.bias, stats)
        if key == (False, False, False) or (node.name in covered and key == (False, True, False)):
            continue  # frozen, or the bias carrier of a conv in range (its shift is bias_update's)
        if key not in modes:
            raise SchemeError(f"plan {plan.method!r}: norm {node.name!r} trains in a way no norm mode names")
        fields["norm_modes"][node.name] = modes[key]
    known = {c.name for c in convs} | {x.name for x in norms} | head
    other = sorted(name for name, t in plan.train.items() if t.any and name not in known)
    if other:
        raise SchemeError(f"plan {plan.method!r} trains layer {other[0]!r}, which a scheme cannot name")
    fields["activation_approx"] = sorted(plan.approx)
    return fields


def check_round_trip(graph: LayerGraph, plan: Plan, scheme: Any) -> None:
    """SchemeError unless ``scheme`` (from :func:`plan_scheme_fields`) maps back to exactly ``plan``."""
    back = scheme_to_plan(graph, scheme, method=plan.method)
    if back.train != {k: v for k, v in plan.train.items() if v.any} or back.norm_train != plan.norm_train:
        raise SchemeError(f"plan {plan.method!r} is not exactly a scheme (it trains a part of a layer no field names)")
