"""A strategy's plan (what trains, which norms use batch statistics) and backward reachability.

Data flows one way: a strategy turns a :class:`~memplan.graph.LayerGraph` into a :class:`Plan`;
:func:`grad_flow` derives, for every node, whether autograd records it and which of its
inputs need a gradient; cost rules then see one :class:`OpView` per node.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import BadOption
from ..graph import EXPLICIT_SELECT, LayerGraph, Node, TensorInfo, channel_index_problem, role, sub_channels
from ..graph.kinds import NORM_KINDS
from ..names import DEFAULT_SELECT


@dataclass(frozen=True)
class Train:
    """What of one layer trains. For norms ``weight`` is the scale and ``bias`` the shift.

    ``weight`` is the fraction of the weight updated: 0 frozen, 1 full, r in (0, 1) a
    sub-channel update of ``max(1, int(C_in * r))`` input channels (output channels for
    depthwise), chosen by ``select`` (one of ``memplan.graph.SELECT_RULES``). ``channels``: the
    sorted, unique indices of those channels, given with (and only with) ``select ==
    "importance"``; memory and FLOP costs depend on the count only, never on which channels.
    """

    weight: float = 0.0
    bias: bool = False
    select: str = DEFAULT_SELECT
    channels: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if (self.select == EXPLICIT_SELECT) != (self.channels is not None):
            raise BadOption(
                f"Train: explicit channels go with select {EXPLICIT_SELECT!r} only (select {self.select!r})"
            )
        if self.channels is not None:
            object.__setattr__(self, "channels", tuple(self.channels))
            problem = channel_index_problem(self.channels)
            if problem is not None:
                raise BadOption(f"Train: {problem}")

    @property
    def any(self) -> bool:
        return self.weight > 0 or self.bias


FROZEN = Train()


@dataclass
class Plan:
    """Per-layer training decisions of one strategy, keyed by layer name.

    ``added``: the architecture additions the graph was traced with, one record per transform
    that added modules (``architecture``: its ``memplan.strategies`` transform, ``options``: every
    option, ``tag``: the ``TAG_ATTR`` of what it adds; ``Scheme.added_modules`` without the layer
    fingerprint), filled in by ``memplan.strategies.make_plan``. ``reestimate``: norms (eval mode,
    not in ``norm_train``) whose running statistics are re-estimated on the target data before
    training (a forward-only pass: ``memplan.nn.train.reestimate_norm_stats``); they cost what
    any eval-mode norm costs, since training itself never updates them. ``recompute``: segments,
    each a run of consecutive blocks (names of ``LayerGraph.blocks``), whose forward the backward
    recomputes, an execution choice that changes neither what trains nor the gradients
    (``memplan.graph.execution``; ``apply_scheme`` realises it with non-reentrant
    ``torch.utils.checkpoint``). ``micro_batches``: M, gradient accumulation over M micro-batches
    (the graph it is costed on is then one micro-batch's; ``accounting.engine.compute`` counts the
    peak of a later one), an execution choice only where no norm uses batch statistics
    (:meth:`batch_statistic_norms`)."""

    method: str
    train: dict[str, Train] = field(default_factory=dict)
    norm_train: set[str] = field(default_factory=set)  # norms in train mode (batch statistics)
    approx: set[str] = field(default_factory=set)  # activations with sign-approximated 1-bit backward
    options: dict[str, Any] = field(default_factory=dict)
    added: list[dict[str, Any]] = field(default_factory=list)  # architecture additions (docstring)
    reestimate: set[str] = field(default_factory=set)  # norms whose running statistics are re-estimated first
    recompute: tuple[tuple[str, ...], ...] = ()  # segments recomputed in the backward (docstring)
    micro_batches: int = 1  # gradient accumulation over this many micro-batches (docstring)

    def of(self, node: Node) -> Train:
        """What trains at ``node``: the decision for its layer (every use of a module's or a
        functional layer's parameters shares the first use's decision)."""
        if node.name in self.train:
            return self.train[node.name]
        return self.train.get(node.layer, FROZEN) if node.layer else FROZEN

    def families(self, graph: LayerGraph) -> frozenset[str]:
        """The parameter families (``memplan.rates.FAMILIES``) this plan trains in ``graph``: the
        classifier's layers, biases and norm shifts, norm scales, and the other weights."""
        head = set(graph.classifier_layers)
        out = set()
        for node in graph.param_nodes():
            t = self.of(node)
            if node in head:
                out |= {"classifier"} if t.any else set()
                continue
            if t.bias:
                out.add("bias")
            if t.weight > 0:
                out.add("norm" if node.kind in NORM_KINDS else "weight")
        return frozenset(out)

    def uses_batch_stats(self, node: Node) -> bool:
        return node.kind in NORM_KINDS and (node.name in self.norm_train or node.layer in self.norm_train)

    def batch_statistic_norms(self, graph: LayerGraph) -> list[str]:
        """The BatchNorm layers of ``graph`` that normalise with their batch's statistics under this
        plan (train mode, or no running statistics): what micro-batching changes."""
        names: dict[str, None] = {}
        for node in graph.nodes:
            if node.kind == "batchnorm" and (self.uses_batch_stats(node) or not node.attrs.get("running_stats", True)):
                names[node.layer or node.name] = None
        return list(names)


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
        """Does the layer input need a gradient (any tensor input, for ops without operands)."""
        if "operands" in self.node.attrs:
            return self.operand_grad("input")
        return any(self.req_in)

    def operand(self, name: str) -> TensorInfo | None:
        """The tensor passed as argument ``name`` (``input``, ``weight``, ``bias``) of a
        functional layer; for a module, ``input`` only."""
        i = self.node.attrs.get("operands", {"input": 0}).get(name)
        return self.node.in_tensors[i] if i is not None and i < len(self.node.in_tensors) else None

    def operand_grad(self, name: str) -> bool:
        """Does argument ``name`` need a gradient (False when it is not a tensor argument)."""
        i = self.node.attrs.get("operands", {"input": 0}).get(name)
        return i is not None and i < len(self.req_in) and self.req_in[i]

    @property
    def weight_grad(self) -> float:
        """Fraction of the weight whose gradient is needed: the plan's for a parameter weight,
        1 for a computed weight tensor that needs a gradient."""
        if "weight" in self.node.uses or self.operand("weight") is None:
            return self.train.weight
        return 1.0 if self.operand_grad("weight") else 0.0

    @property
    def bias_grad(self) -> bool:
        return self.train.bias or ("bias" not in self.node.uses and self.operand_grad("bias"))


def grad_flow(graph: LayerGraph, plan: Plan) -> list[OpView]:
    """Forward requires-grad propagation: an output needs grad iff an input does or a
    parameter of the node trains. Nodes below the earliest trainable parameter therefore
    run forward only; residual DAGs need nothing special. A reentrant checkpoint none of whose
    inputs needs a gradient records nothing (torch runs it under ``no_grad``; its parameters get
    no gradient): its nodes are frozen here (:func:`_no_grad_segment`)."""
    req: list[bool] = [False] * len(graph.nodes)
    views: list[OpView] = []
    unrecorded: dict[int, bool] = {}
    for n in graph.nodes:
        t = plan.of(n)
        if n.segments and _no_grad_segment(graph, n, req, unrecorded):
            views.append(
                OpView(n, graph, FROZEN, plan.uses_batch_stats(n), False, tuple(req[i] for i in n.inputs), False, plan)
            )
            continue
        roles = {role(p) for p in n.uses}
        if t.any and not roles:
            raise ValueError(f"plan trains {n.name!r}, which has no parameters")
        if t.weight and "weight" not in roles:
            t = replace(t, weight=0.0)
        if t.bias and "bias" not in roles:
            t = replace(t, bias=False)
        req_in = tuple(req[i] for i in n.inputs)
        req[n.index] = any(req_in) or t.any
        if "param_of" in n.attrs:  # a parameter read by a functional op: requires grad if it trains
            layer, prole = n.attrs["param_of"]
            owner = plan.train.get(layer, FROZEN)
            req[n.index] = owner.weight > 0 if prole == "weight" else owner.bias
        views.append(OpView(n, graph, t, plan.uses_batch_stats(n), n.name in plan.approx, req_in, req[n.index], plan))
    return views


def _no_grad_segment(graph: LayerGraph, node: Node, req: list[bool], cache: dict[int, bool]) -> bool:
    """Whether ``node`` runs in a reentrant checkpoint segment (``LayerGraph.checkpoints``) none of
    whose inputs needs a gradient (``req``: per node so far); ``cache``: segment id -> answer."""
    for sid in node.segments:
        if sid not in cache:
            seg = graph.checkpoints[sid]
            cache[sid] = seg.exact and seg.kind == "reentrant" and not any(req[i] for i in seg.inputs)
        if cache[sid]:
            return True
    return False


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
