"""Strategy ``as-is``: the model as its user prepared it.

The plan is the model's own ``requires_grad`` flags and train / eval modes, read before capture
(``LayerGraph.prepared_grad`` / ``prepared_training``): a layer trains the parameters that require a
gradient, a norm uses batch statistics when its module is in train mode. The model is captured
under its own flags (``Strategy.as_prepared``), so a dropout in eval mode keeps no mask and a
forward that branches on ``self.training`` (Hugging Face's checkpointing) runs as it will. It expresses what no other
strategy does (a model frozen by hand, a ``peft`` model, anything else); activation checkpointing
the model does is in the graph whatever the strategy (``memplan.graph.checkpoint``).
"""

from __future__ import annotations

from typing import Any

from ..graph import LayerGraph, Node, role
from ..graph.kinds import NORM_KINDS
from ..plan import Plan, Train
from .base import strategy


def prepared(graph: LayerGraph, node: Node) -> Train:
    """What of ``node``'s layer requires a gradient in the prepared model: the weight (every
    weight-role parameter counted when one of them does) and the bias."""
    grads = {role(q): False for q in node.uses.values()}
    for qual in node.uses.values():
        grads[role(qual)] = grads[role(qual)] or graph.prepared_grad.get(qual, False)
    return Train(1.0 if grads.get("weight") else 0.0, grads.get("bias", False))


def _differs(graph: LayerGraph) -> dict[str, Any] | None:
    """Compared (first) on a model prepared otherwise than everything training in train mode."""
    frozen = not all(graph.prepared_grad.values()) or not all(graph.prepared_training.values())
    return {} if frozen else None


@strategy(
    "as-is",
    "the model as prepared: its own requires_grad flags, norms in train mode use batch statistics",
    compare=(-1, _differs),
    as_prepared=True,
)
def as_is(graph: LayerGraph) -> Plan:
    train = {n.name: t for n in graph.param_nodes() if (t := prepared(graph, n)).any}
    norms = {
        n.name for n in graph.nodes if n.kind in NORM_KINDS and graph.prepared_training.get(n.layer or n.scope, True)
    }
    return Plan("as-is", train, norms)
