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
  head sizes but not across backbones;
* layers an architecture transform added (tagged, ``graph.model.TAG_ATTR``: TinyTL's lite
  residual branches) are not the backbone's: the fingerprint, the conv index and every layer name
  of a scheme are those of the model before the transform (tagged layers skipped, wrapper
  children dropped from names: ``LayerGraph.original_name``). The scheme's ``added_modules`` name
  them, by tag: every parameter of theirs trains, their norms in train mode (batch statistics),
  and the added layer table must be the one the scheme was planned with (``added_fingerprint``).

The scheme is read by its fields (``memplan.plan.scheme.Scheme``), so this module sits below
the format.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, NamedTuple

from ..errors import MemplanError, SchemeError
from ..graph import LayerGraph, Node, bias_carrier, channel_index_problem, conv_layers, role
from ..graph.execution import check_recompute
from ..graph.kinds import ACTIVATIONS, NORM_KINDS
from .plan import Plan, Train


class NormSetting(NamedTuple):
    """What a norm mode trains: scale, shift, batch statistics (train mode), and whether its running
    statistics are re-estimated on the target data before training (then frozen, eval mode)."""

    scale: bool
    shift: bool
    batch_stats: bool
    reestimate: bool = False


#: per-norm override -> :class:`NormSetting`
NORM_MODES: dict[str, NormSetting] = {
    "frozen": NormSetting(False, False, False),  # eval mode, nothing trains
    "shift": NormSetting(False, True, False),  # eval mode, shift only (MobileTL's internal norms)
    "affine": NormSetting(True, True, False),  # eval mode, scale + shift
    "train": NormSetting(True, True, True),  # train mode (batch statistics), scale + shift
    # eval mode, scale + shift, running statistics re-estimated on the target data first (a norm with them only)
    "reestimate": NormSetting(True, True, False, True),
}


def is_added(node: Node) -> bool:
    """Whether ``node`` runs inside a module an architecture transform added (it carries a tag)."""
    return bool(node.tags)


def _table(graph: LayerGraph, nodes: list[Node]) -> str:
    rows = [
        (graph.original_name(n.name), n.kind, list(n.params["weight"].shape) if "weight" in n.params else None)
        for n in nodes
    ]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def fingerprint(graph: LayerGraph) -> str:
    """16 hex digits of SHA-256 over [(name, kind, weight shape)] of the conv / linear / norm layers,
    classifier excluded (so schemes transfer across head sizes), of the backbone: layers an
    architecture transform added skipped, names as before it (``LayerGraph.original_name``)."""
    head = set(graph.classifier_layers)
    return _table(graph, [n for n in graph.param_nodes() if n not in head and not is_added(n)])


def added_fingerprint(graph: LayerGraph, tag: str) -> str:
    """16 hex digits of SHA-256 over [(name, kind, weight shape)] of the layers tagged ``tag``."""
    return _table(graph, added_layers(graph, tag))


def added_layers(graph: LayerGraph, tag: str) -> list[Node]:
    """The parameter layers inside modules tagged ``tag``, in forward order."""
    return [n for n in graph.param_nodes() if tag in n.tags]


def backbone_convs(graph: LayerGraph) -> list[Node]:
    """:func:`memplan.graph.conv_layers` of the backbone (added layers skipped): the scheme's conv index."""
    return [c for c in conv_layers(graph) if not is_added(c)]


def _whole(node: Node) -> Train:
    roles = {role(p) for p in node.params}
    return Train(1.0 if "weight" in roles else 0.0, "bias" in roles)


def scheme_to_plan(graph: LayerGraph, scheme: Any, method: str = "sparse") -> Plan:
    """The plan of ``scheme`` (a ``memplan.plan.scheme.Scheme``) on ``graph``; raises SchemeError
    when they do not fit."""
    if scheme.fingerprint != fingerprint(graph):
        raise SchemeError(
            f"scheme was planned for {scheme.model}; this model's layer table differs", "plan a scheme for this model"
        )
    plan = Plan(method)
    _added_to_plan(graph, getattr(scheme, "added_modules", []), plan)
    _updates_to_plan(graph, scheme, plan.train)
    names = _backbone_names(graph)
    for name, mode in scheme.norm_modes.items():
        node = _layer(names, name, NORM_KINDS, "norm_modes")
        setting = NORM_MODES[mode]
        if setting.reestimate and not node.attrs.get("running_stats"):
            raise SchemeError(f"scheme norm_modes re-estimates {name!r}, a {node.kind} without running statistics")
        plan.train[node.name] = Train(
            float(setting.scale and "weight" in node.params), setting.shift and "bias" in node.params
        )
        if setting.batch_stats:
            plan.norm_train.add(node.name)
        if setting.reestimate:
            plan.reestimate.add(node.name)
    plan.approx = {_layer(names, name, ACTIVATIONS, "activation_approx").name for name in scheme.activation_approx}
    plan.train.update({n.name: _whole(n) for n in graph.classifier_layers})
    execution = getattr(scheme, "execution", None)
    if execution is not None:
        segments = tuple(tuple(seg) for seg in execution.recompute)
        try:
            check_recompute(graph, segments)
        except MemplanError as exc:
            raise SchemeError(f"scheme execution: {exc.args[0]}") from None
        plan.recompute = segments
        plan.micro_batches = _micro_batches(graph, plan, execution.micro_batches)
    return plan


def _micro_batches(graph: LayerGraph, plan: Plan, count: int) -> int:
    """``count``, the scheme's micro-batches; SchemeError where a norm normalises with its batch's
    statistics under ``plan``, which micro-batching would change (``Plan.batch_statistic_norms``)."""
    norms = plan.batch_statistic_norms(graph) if count > 1 else []
    if norms:
        raise SchemeError(
            f"scheme execution: micro_batches {count} changes what the model computes, {len(norms)} norm(s) "
            f"normalise with their batch's statistics ({norms[0]}{', ...' if len(norms) > 1 else ''})",
            "freeze those norms (norm mode frozen, shift or affine: eval mode) or train the whole batch at once",
        )
    return count


def _updates_to_plan(graph: LayerGraph, scheme: Any, train: dict[str, Train]) -> None:
    """``bias_update`` and ``weight_updates`` of ``scheme`` into ``train``."""
    convs = backbone_convs(graph)
    if scheme.bias_update > len(convs):
        raise SchemeError(
            f"scheme updates the biases of the last {scheme.bias_update} convs; the model has {len(convs)}"
        )
    first = len(convs) - scheme.bias_update
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
        if graph.original_name(conv.name) != w.layer:
            known = {graph.original_name(c.name) for c in convs}
            detail = (
                f"conv {w.conv_index} is {graph.original_name(conv.name)!r}"
                if w.layer in known
                else "no conv has that name"
            )
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


def _added_to_plan(graph: LayerGraph, added: list[Any], plan: Plan) -> None:
    """The scheme's ``added_modules`` into ``plan``: each one's layers train whole, norms in train
    mode; SchemeError unless the graph holds exactly those added layers."""
    wanted = {a.tag: a for a in added}
    present = {t for n in graph.param_nodes() for t in n.tags}
    missing, extra = sorted(wanted.keys() - present), sorted(present - wanted.keys())
    if missing:
        raise SchemeError(
            f"scheme adds {missing[0]} modules (added_modules: architecture {wanted[missing[0]].architecture!r}) "
            "this model lacks",
            "memplan.apply_scheme builds them on the plain model; profile it with --method sparse --scheme",
        )
    if extra:
        raise SchemeError(
            f"the model has added {extra[0]} layers the scheme does not name", "apply the scheme to the plain model"
        )
    for tag, a in wanted.items():
        if a.layers != added_fingerprint(graph, tag):
            raise SchemeError(
                f"this model's {tag} layers differ from those the scheme was planned with (added_modules layers)",
                f"build them on the plain model at the scheme's input shape with its {a.architecture!r} options as "
                "written (apply_scheme does); an edited option builds other layers",
            )
        for node in added_layers(graph, tag):
            plan.train[node.name] = _whole(node)
            if node.kind in NORM_KINDS:
                plan.norm_train.add(node.name)
        plan.added.append({"architecture": a.architecture, "options": dict(a.options), "tag": tag})


def _backbone_names(graph: LayerGraph) -> dict[str, Node]:
    """Original name (``LayerGraph.original_name``) -> the first backbone node of that name."""
    names: dict[str, Node] = {}
    for n in graph.nodes:
        if not is_added(n):
            names.setdefault(graph.original_name(n.name), n)
    return names


def _layer(names: dict[str, Node], name: str, kinds: frozenset[str], field: str) -> Node:
    node = names.get(name)
    if node is None:
        raise SchemeError(f"scheme {field} names unknown layer {name!r}")
    if node.kind not in kinds:
        raise SchemeError(f"scheme {field} names {name!r}, a {node.kind} layer")
    return node


def plan_scheme_fields(graph: LayerGraph, plan: Plan) -> dict[str, Any]:
    """The scheme fields (``bias_update``, ``weight_updates`` as dicts, ``norm_modes``,
    ``activation_approx``, ``added_modules`` as dicts) whose :func:`scheme_to_plan` is ``plan`` on
    ``graph``: the inverse map, so that a strategy's plan (train all biases, full fine-tuning,
    TinyTL's lite residual branches, ...) is one point of the scheme space. Raises SchemeError when
    the plan trains something a scheme cannot say (a bias range that is not the last n convs, a
    layer that is neither a conv, a norm, the classifier nor an added module trained whole)."""
    convs = backbone_convs(graph)
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
    for i, conv in enumerate(convs):
        t = plan.train.get(conv.name)
        if t is not None and t.weight > 0:
            fields["weight_updates"].append(
                {"layer": graph.original_name(conv.name), "conv_index": i, "ratio": t.weight, "select": t.select}
                | ({"channels": list(t.channels)} if t.channels is not None else {})
            )
    covered = {carriers[c.name] for c in convs[len(convs) - n :]}
    norms = [x for x in graph.param_nodes() if x.kind in NORM_KINDS and x.name not in head and not is_added(x)]
    fields["norm_modes"] = _norm_modes(graph, plan, norms, covered)
    added = [x for x in graph.param_nodes() if is_added(x)]
    fields["added_modules"] = _added_fields(graph, plan, added)
    known = {c.name for c in convs} | {x.name for x in norms} | head | {x.name for x in added}
    other = sorted(name for name, t in plan.train.items() if t.any and name not in known)
    if other:
        raise SchemeError(f"plan {plan.method!r} trains layer {other[0]!r}, which a scheme cannot name")
    fields["activation_approx"] = sorted(graph.original_name(a) for a in plan.approx)
    if plan.recompute or plan.micro_batches > 1:
        fields["execution"] = {"recompute": [list(seg) for seg in plan.recompute], "micro_batches": plan.micro_batches}
    return fields


def _norm_modes(graph: LayerGraph, plan: Plan, norms: list[Node], covered: set[str | None]) -> dict[str, str]:
    """The ``norm_modes`` of ``plan``'s backbone ``norms`` (``covered``: the bias carriers in range)."""
    modes = {v: k for k, v in NORM_MODES.items()}
    out = {}
    for node in norms:
        t = plan.train.get(node.name, Train())
        key = NormSetting(t.weight > 0, t.bias, node.name in plan.norm_train, node.name in plan.reestimate)
        if key == NORM_MODES["frozen"] or (node.name in covered and key == NORM_MODES["shift"]):
            continue  # frozen, or the bias carrier of a conv in range (its shift is bias_update's)
        if key not in modes:
            raise SchemeError(f"plan {plan.method!r}: norm {node.name!r} trains in a way no norm mode names")
        out[graph.original_name(node.name)] = modes[key]
    return out


def _added_fields(graph: LayerGraph, plan: Plan, added: list[Node]) -> list[dict[str, Any]]:
    """The ``added_modules`` of ``plan`` (its ``added`` records with their layer fingerprint); SchemeError
    unless every added layer trains whole (norms in train mode) under a record of its tag."""
    records = {r["tag"]: r for r in plan.added}
    for node in added:
        tag = next((t for t in sorted(node.tags) if t in records), None)
        if tag is None:
            raise SchemeError(
                f"plan {plan.method!r} runs on added layer {node.name!r} ({', '.join(sorted(node.tags))}) but records "
                "no architecture that builds it",
                "plan with memplan.strategies.make_plan, which records the transforms of the capture",
            )
        norm_ok = node.kind not in NORM_KINDS or node.name in plan.norm_train
        if plan.train.get(node.name, Train()) != _whole(node) or not norm_ok:
            raise SchemeError(
                f"plan {plan.method!r} trains added layer {node.name!r} in part; a scheme's added modules train whole"
            )
    present = {t for n in added for t in n.tags}
    return [{**r, "layers": added_fingerprint(graph, tag)} for tag, r in records.items() if tag in present]


def check_round_trip(graph: LayerGraph, plan: Plan, scheme: Any) -> None:
    """SchemeError unless ``scheme`` (from :func:`plan_scheme_fields`) maps back to exactly ``plan``."""
    back = scheme_to_plan(graph, scheme, method=plan.method)
    same = back.train == {k: v for k, v in plan.train.items() if v.any} and back.norm_train == plan.norm_train
    if not same or back.reestimate != plan.reestimate:
        raise SchemeError(f"plan {plan.method!r} is not exactly a scheme (it trains a part of a layer no field names)")
