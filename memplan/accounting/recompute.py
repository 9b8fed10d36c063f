"""Activation checkpointing, accounted per segment (``LayerGraph.checkpoints``, from
``memplan.graph.checkpoint``); the cost rules stay per op.

What eager PyTorch does with a checkpointed segment, and how it is counted here:

* the forward keeps the tensors passed to the call (non-reentrant: always, ``_NoopSaveInputs``
  saves them; reentrant: when one of them needs a gradient, as ``CheckpointFunction`` is recorded
  only then), counted at the segment's first node; what the segment's own ops save is not kept;
* the backward recomputes the segment when it reaches it (at the backward of its last recorded
  node): what its ops save is alive again from there until each op's backward has run (and, for a
  segment inside another one, its inputs from the enclosing segment's recomputation until its own
  backward); the recomputation's forward FLOPs are counted again (non-reentrant checkpointing with
  early stop, torch's default, stops after the last op that saves a tensor);
* a reentrant segment's backward (``CheckpointFunction.backward``) holds its recomputed outputs and
  their gradients until it returns;
* a reentrant segment none of whose inputs needs a gradient runs under ``no_grad`` and is never
  recomputed: its parameters get no gradient (``memplan.plan.grad_flow`` freezes it, and the
  profile says so);
* a call memplan does not model (``CheckpointSegment.exact`` False: selective checkpointing) is
  counted as if not checkpointed (an upper bound of its saved bytes) and reported as not exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..costs.records import Saved
from ..graph import CheckpointSegment, LayerGraph
from ..modes import get_mode
from ..plan import OpView

#: what a segment keeps in the forward, in ``LayerCost.saved``
KEPT = "checkpoint input"
#: kinds that save only their inputs (and weight), packed before their kernel runs: early stop ends a
#: recomputation whose last saved tensor is theirs before their own forward is computed again
INPUTS_ONLY = frozenset({"conv", "linear", "matmul"})


@dataclass
class Recomputation:
    """The forward's saved tensors with checkpointing applied, and what the backward recomputes.

    ``forward[i]``: what node i's forward keeps for backward (its rule's items outside segments,
    the segment's inputs at a segment's first node); ``again``: (node whose backward recomputes,
    node whose backward frees it, item) for every tensor saved again by a recomputation;
    ``runs[i]``: how many times node i's forward runs again in the backward; ``not_modelled``:
    checkpoint calls counted as not checkpointed, by why; ``no_gradient``: the scopes of reentrant
    segments whose parameters get no gradient; ``segments``: segments modelled; ``keepers``: the
    node whose ``forward`` items hold a top-level segment's kept inputs -> the segment's id;
    ``held_gradients``: (node, node) the gradient of the first one's output lives until the second
    one's backward (``PeakOptions.held_gradients``)."""

    forward: list[list[Saved]]
    again: list[tuple[int, int, Saved]] = field(default_factory=list)
    runs: list[int] = field(default_factory=list)
    not_modelled: dict[str, int] = field(default_factory=dict)
    no_gradient: list[str] = field(default_factory=list)
    segments: int = 0
    keepers: dict[int, int] = field(default_factory=dict)
    held_gradients: list[tuple[int, int]] = field(default_factory=list)


def _members(graph: LayerGraph) -> dict[int, list[int]]:
    """Segment id -> the indices of the nodes running in it (at any depth), modelled segments only."""
    out: dict[int, list[int]] = {}
    for node in graph.nodes:
        for sid in node.segments:
            if graph.checkpoints[sid].exact:
                out.setdefault(sid, []).append(node.index)
    return out


def _innermost(graph: LayerGraph, segments: tuple[int, ...]) -> int | None:
    modelled = [s for s in segments if graph.checkpoints[s].exact]
    return modelled[-1] if modelled else None


def _parent(graph: LayerGraph, seg: CheckpointSegment) -> int | None:
    """The nearest enclosing modelled segment."""
    parent = seg.parent
    while parent is not None and not graph.checkpoints[parent].exact:
        parent = graph.checkpoints[parent].parent
    return parent


def _packs(op: OpView) -> bool:
    """Whether the op saves any tensor in eager PyTorch (parameters included): non-reentrant early
    stop counts these. An op no rule covers is assumed to."""
    saved = get_mode("pytorch").saved(op)
    return saved is None or bool(saved)


def _last_pack(
    graph: LayerGraph, views: list[OpView], seg: CheckpointSegment, nodes: list[int], members: dict[int, list[int]]
) -> tuple[int, bool] | None:
    """Where the last tensor packed into ``seg``'s own hooks is: (node, whether that node's kernel has
    run by then). Its own ops pack what they save (an op saving only its inputs before its kernel);
    a segment inside it packs its inputs into ``seg``'s hooks as it starts, before its first node."""
    points = [
        (i, views[i].kind not in INPUTS_ONLY)
        for i in nodes
        if _innermost(graph, graph.nodes[i].segments) == seg.id and views[i].req_out and _packs(views[i])
    ]
    for sid, inner in members.items():
        child = graph.checkpoints[sid]
        if _parent(graph, child) == seg.id and (child.kind == "non-reentrant" or _kept(graph, views, child)):
            points.append((inner[0], False))
    return max(points) if points else None


def _recomputed(
    graph: LayerGraph, views: list[OpView], seg: CheckpointSegment, members: dict[int, list[int]], starts: dict
) -> list[int]:
    """The nodes of ``seg`` its recomputation runs (none when the backward never reaches it):
    non-reentrant with early stop, up to its last packed tensor (:func:`_last_pack`)."""
    nodes = members[seg.id]
    if seg.id not in starts:
        return []
    if seg.kind == "non-reentrant" and seg.early_stop:
        last = _last_pack(graph, views, seg, nodes, members)
        if last is None:
            return []
        return [i for i in nodes if i < last[0] or (i == last[0] and last[1])]
    return list(nodes)


def _kept(graph: LayerGraph, views: list[OpView], seg: CheckpointSegment) -> list[Saved]:
    """What the segment keeps of its inputs for its backward."""
    if seg.kind == "reentrant" and not any(views[i].req_out for i in seg.inputs):
        return []
    items = []
    for i in seg.inputs:
        t = graph.nodes[i].out
        if t is not None and not graph.is_weight(t.storage):
            items.append(Saved(graph.storages[t.storage], t.storage, KEPT))
    return items


def recompute(graph: LayerGraph, views: list[OpView], saved: list[list[Saved]]) -> Recomputation:
    """Checkpointing applied to ``saved`` (per node, the mode's items, parameters left out):
    module docstring."""
    result = Recomputation([list(items) for items in saved], runs=[0] * len(graph.nodes))
    for seg in graph.checkpoints:
        if not seg.exact:
            key = f"checkpoint with {seg.note}"
            result.not_modelled[key] = result.not_modelled.get(key, 0) + 1
    members = _members(graph)
    starts = _starts(graph, views, members, result.no_gradient)
    events: list[tuple[int, int, Saved]] = []  # (segment recomputed, node whose backward frees it, item)
    for node in graph.nodes:
        sid = _innermost(graph, node.segments)
        if sid is not None:
            events.extend((sid, node.index, s) for s in result.forward[node.index])
            result.forward[node.index] = []
    for sid, nodes in members.items():
        seg = graph.checkpoints[sid]
        result.segments += 1
        for i in _recomputed(graph, views, seg, members, starts):
            result.runs[i] += 1
        if seg.kind == "reentrant" and sid in starts:  # its backward holds its outputs and their gradients
            outputs = [m for m in _outputs(graph, nodes) if graph.nodes[m].out is not None]
            result.held_gradients.extend((m, nodes[0]) for m in outputs)
            events.extend((sid, nodes[0], _output(graph, m)) for m in outputs)
        parent, kept = _parent(graph, seg), _kept(graph, views, seg)
        if parent is None:
            result.forward[nodes[0]] = kept + result.forward[nodes[0]]
            result.keepers[nodes[0]] = sid
        else:
            events.extend((parent, nodes[0], s) for s in kept)
    result.again = _allocated(graph, members, starts, events)
    return result


def _output(graph: LayerGraph, m: int) -> Saved:
    t = graph.nodes[m].out
    return Saved(graph.storages[t.storage], t.storage, "recomputed output")


def _outputs(graph: LayerGraph, nodes: list[int]) -> list[int]:
    """The nodes of a segment whose output is used after it."""
    inside = set(nodes)
    used = {i for node in graph.nodes if node.index not in inside for i in node.inputs}
    return [i for i in nodes if i in used]


def _starts(graph: LayerGraph, views: list[OpView], members: dict[int, list[int]], no_gradient: list[str]) -> dict:
    """Segment id -> the node whose backward recomputes it (its last recorded node); a reentrant
    segment without one that holds parameters is named in ``no_gradient``."""
    starts: dict[int, int] = {}
    for sid, nodes in members.items():
        recorded = [i for i in nodes if views[i].req_out]
        if recorded:
            starts[sid] = max(recorded)
        elif graph.checkpoints[sid].kind == "reentrant" and any(graph.nodes[i].params for i in nodes):
            no_gradient.append(graph.nodes[nodes[0]].scope or graph.nodes[nodes[0]].name)
    return starts


def _allocated(
    graph: LayerGraph, members: dict[int, list[int]], starts: dict[int, int], events: list[tuple[int, int, Saved]]
) -> list[tuple[int, int, Saved]]:
    """(recomputing node, freeing node, item) of what each recomputation allocates: a storage once
    per recomputation, freed after its earliest saver's backward; one made outside the segment (its
    inputs, kept already) is not allocated again; a segment never recomputed allocates nothing."""
    producer: dict[int, int] = {}
    for node in graph.nodes:
        for t in node.outs:
            producer.setdefault(t.storage, node.index)
    inside = {sid: set(nodes) for sid, nodes in members.items()}
    out: list[tuple[int, int, Saved]] = []
    first: dict[tuple[int, int], int] = {}
    for sid, release, s in events:
        if sid not in starts:
            continue
        if s.storage is None:
            out.append((starts[sid], release, s))
            continue
        if producer.get(s.storage) not in inside[sid]:
            continue
        key = (sid, s.storage)
        if key in first:
            i = first[key]
            out[i] = (starts[sid], min(out[i][1], release), s)
        else:
            first[key] = len(out)
            out.append((starts[sid], release, s))
    return out
