"""Execution choices on a captured graph: segments (runs of consecutive blocks) whose forward is
recomputed in the backward.

Recomputing a segment (activation checkpointing) changes neither what trains nor the gradients,
only what the step keeps alive. :func:`with_recompute` returns a copy of a graph in which each
chosen run of blocks is one segment of ``torch.utils.checkpoint.checkpoint(run, *inputs,
use_reentrant=False)`` (early stop, torch's default): the segment's inputs are the tensors made
outside the run that its nodes read, exactly what ``memplan.apply.recompute_segments`` passes to
the call. The accounting (``memplan.accounting.recompute``) then counts it as it counts a
checkpoint call the model makes itself: the inputs kept, the block's own saved tensors dropped
from the forward and saved again when the backward recomputes it, its forward FLOPs counted again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..errors import MemplanError
from .checkpoint import NON_REENTRANT
from .model import CheckpointSegment, LayerGraph


def block_nodes(graph: LayerGraph, block: str) -> list[int]:
    """Indices of the nodes running inside ``block`` (a name of ``graph.blocks``)."""
    return [n.index for n in graph.nodes if n.block == block]


def _inputs(graph: LayerGraph, inside: set[int]) -> tuple[int, ...]:
    """The nodes outside ``inside`` whose activations a node inside reads (parameters left out)."""
    found: dict[int, None] = {}
    for i in sorted(inside):
        for j in graph.nodes[i].inputs:
            out = graph.nodes[j].out
            if j not in inside and out is not None and not graph.is_weight(out.storage):
                found[j] = None
    return tuple(found)


def check_recompute(graph: LayerGraph, segments: Sequence[Sequence[str]]) -> None:
    """MemplanError unless every segment is a non-empty run of consecutive blocks of ``graph``
    (``graph.blocks`` order), no block is in two segments, and the model makes no checkpoint call of
    its own (the two would nest)."""
    named = [b for seg in segments for b in seg]
    unknown = [b for b in named if b not in graph.blocks]
    if unknown:
        shown = ", ".join(graph.blocks[:4]) + (" ..." if len(graph.blocks) > 4 else "")
        raise MemplanError(f"recompute names {unknown[0]!r}, which is no block of the model", f"blocks: {shown}")
    if len(set(named)) != len(named):
        raise MemplanError("recompute names a block in two segments")
    for seg in segments:
        at = [graph.blocks.index(b) for b in seg]
        if not at or at != list(range(at[0], at[0] + len(at))):
            raise MemplanError(f"recompute segment {list(seg)} is not a run of consecutive blocks")
    if graph.checkpoints and segments:
        raise MemplanError(
            "the model makes checkpoint calls of its own: recompute choices would nest in them",
            "profile it as it is (--method as-is) or remove its own checkpointing",
        )


def with_recompute(graph: LayerGraph, segments: Sequence[Sequence[str]]) -> LayerGraph:
    """A copy of ``graph`` in which each of ``segments`` (a run of consecutive blocks) runs as one
    non-reentrant checkpoint segment (module docstring); ``graph`` itself is unchanged. No
    segments: ``graph`` itself."""
    if not segments:
        return graph
    check_recompute(graph, segments)
    records: list[CheckpointSegment] = []
    of_node: dict[int, tuple[int, ...]] = {}
    for seg in sorted(segments, key=lambda s: graph.blocks.index(s[0])):
        inside = {i for b in seg for i in block_nodes(graph, b)}
        sid = len(records)
        records.append(CheckpointSegment(sid, NON_REENTRANT, _inputs(graph, inside), scope=seg[0]))
        of_node.update((i, (sid,)) for i in inside)
    nodes = [dataclasses.replace(n, segments=of_node.get(n.index, ())) for n in graph.nodes]
    return dataclasses.replace(graph, nodes=nodes, checkpoints=records)


def grouped(blocks: Sequence[str], size: int) -> tuple[tuple[str, ...], ...]:
    """``blocks`` (consecutive) as segments of ``size`` blocks each, the last one possibly shorter."""
    return tuple(tuple(blocks[i : i + size]) for i in range(0, len(blocks), size))
