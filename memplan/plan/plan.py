"""A strategy's plan (what trains, which norms use batch statistics) and backward reachability.

Data flows one way: a strategy turns a :class:`~memplan.graph.LayerGraph` into a :class:`Plan`;
:func:`grad_flow` derives, for every node, whether autograd records it and which of its
inputs need a gradient; cost rules then see one :class:`OpView` per node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..graph import LayerGraph, Node, sub_channels
from ..graph.kinds import NORM_KINDS


@dataclass(frozen=True)
class Train:
    """What of one layer trains. For norms ``weight`` is the scale and ``bias`` the shift.

    ``weight`` is the fraction of the weight updated: 0 frozen, 1 full, r in (0, 1) a
    sub-channel update of ``max(1, int(C_in * r))`` input channels (output channels for
    depthwise), chosen by ``select`` (one of ``memplan.graph.SELECT_RULES``).
    """

    weight: float = 0.0
    bias: bool = False
    select: str = "magnitude+"

    @property
    def any(self) -> bool:
        return self.weight > 0 or self.bias


FROZEN = Train()


@dataclass
class Plan:
    """Per-layer training decisions of one strategy, keyed by layer name."""

    method: str
    train: dict[str, Train] = field(default_factory=dict)
    norm_train: set[str] = field(default_factory=set)  # norms in train mode (batch statistics)
    approx: set[str] = field(default_factory=set)  # activations with sign-approximated 1-bit backward
    options: dict[str, Any] = field(default_factory=dict)

    def of(self, node: Node) -> Train:
        """What trains at ``node``; every call of a module shares its first call's decision."""
        if node.name in self.train:
            return self.train[node.name]
        return self.train.get(node.scope, FROZEN) if node.op == "call_module" else FROZEN


@dataclass
class OpView:
    """Everything a cost rule may read about one node under one plan."""

    node: Node
    graph: LayerGraph
    train: Train
    norm_train: bool
    approx: bool
    req_in: tuple[bool, ...]  # does each tensor input require grad
    req_out: bool  # does the output require grad (= autograd records this op)
    plan: Plan | None = field(default=None, repr=False, compare=False)  # the plan the view comes from

    @property
    def kind(self) -> str:
        return self.node.kind

    @property
    def recorded(self) -> bool:
        return self.req_out

    @property
    def grad_input(self) -> bool:
        return any(self.req_in)


def grad_flow(graph: LayerGraph, plan: Plan) -> list[OpView]:
    """Forward requires-grad propagation: an output needs grad iff an input does or a
    parameter of the node trains. Nodes below the earliest trainable parameter therefore
    run forward only; residual DAGs need nothing special."""
    req: list[bool] = [False] * len(graph.nodes)
    views: list[OpView] = []
    for n in graph.nodes:
        t = plan.of(n)
        # a module's parameters are listed at its first call only; later calls still use them
        owned = set(n.params) | ({p for p, _ in n.module.named_parameters(recurse=False)} if n.module is not None else set())
        if t.any and not owned:
            raise ValueError(f"plan trains {n.name!r}, which has no parameters")
        if t.weight and "weight" not in owned:
            t = Train(0.0, t.bias, t.select)
        if t.bias and "bias" not in owned:
            t = Train(t.weight, False, t.select)
        req_in = tuple(req[i] for i in n.inputs)
        req[n.index] = any(req_in) or t.any
        if "param_of" in n.attrs:  # functional use of a parameter: requires grad if it trains
            owner, pname = n.attrs["param_of"]
            owner_train = plan.train.get(owner, FROZEN)
            req[n.index] = owner_train.weight > 0 if pname == "weight" else (pname == "bias" and owner_train.bias)
        views.append(OpView(n, graph, t, n.kind in NORM_KINDS and n.name in plan.norm_train,
                            n.name in plan.approx, req_in, req[n.index], plan))
    return views


def updated_weight_numel(shape: tuple[int, ...], groups: int, fraction: float) -> int:
    """Elements of a weight of ``shape`` updated at ``fraction``: ``sub_channels(C_in, r)`` input
    channels of every output channel; output channels for a depthwise conv."""
    if fraction <= 0:
        return 0
    total = 1
    for s in shape:
        total *= s
    if fraction >= 1:
        return total
    if len(shape) > 2 and shape[1] == 1 and groups == shape[0] and groups > 1:  # depthwise
        return sub_channels(shape[0], fraction) * (total // shape[0])
    return total // shape[1] * sub_channels(shape[1], fraction)
