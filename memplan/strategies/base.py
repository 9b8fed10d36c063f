"""The strategy registry and the basic strategies (full, last, norm, bias, lastk).

A strategy turns a traced graph into a :class:`~memplan.plan.Plan`: what trains and which
norms use batch statistics. It knows nothing of memory or FLOPs (those come from the modes),
so every strategy works under every mode. A strategy that changes the architecture (TinyTL's
lite residual branches, MiniLearn's pruning) also declares a ``transform`` applied to the
model before tracing; the same transform is what ``apply_strategy`` uses on a real model.
Architecture changes any strategy can be combined with (remove SE, swap the activation, add
lite residual branches: ``memplan.strategies.architecture``) are registered in
``TRANSFORMS``; their options are accepted by every strategy and applied first.
Figures of a strategy beyond per-layer costs (cache bytes, FLOPs per epoch) are costs, in
``memplan.accounting.extras``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch.nn as nn

from ..errors import BadOption
from ..graph import LayerGraph, Node, role
from ..graph.kinds import NORM_KINDS
from ..plan import Plan, Train
from ..registry import Registry

StrategyFn = Callable[..., Plan]
TransformFn = Callable[..., nn.Module]
#: the options a strategy is compared with on a graph (``memplan compare`` naming no strategy); None: not there
CompareFn = Callable[[LayerGraph], "dict[str, Any] | None"]


def always(graph: LayerGraph) -> dict[str, Any]:
    """Compared on every model, with its default options."""
    return {}


def on_blocks(graph: LayerGraph) -> dict[str, Any] | None:
    """Compared on models with blocks, on the last ``DEFAULT_K`` of them (all where there are fewer)."""
    k = min(DEFAULT_K, len(graph.blocks))
    return {"blocks": k} if k else None


#: ``added(**transform_options)`` -> the record of the modules a transform adds with those options
#: (``architecture``: a ``TRANSFORMS`` name that rebuilds them, ``options``: every option of it,
#: ``tag``: their ``TAG_ATTR``; ``Plan.added``), or None when it adds none
AddedFn = Callable[..., "dict[str, Any] | None"]


@dataclass(frozen=True)
class Strategy:
    name: str
    fn: StrategyFn  # fn(graph, **plan_options) -> Plan
    description: str
    options: tuple[str, ...] = ()  # plan options accepted by fn
    transform: TransformFn | None = None  # transform(model, **transform_options) -> model, before tracing
    transform_options: tuple[str, ...] = ()
    conv_update_table: bool = False  # profile --per-layer also prints each conv's update cost (Figure 11a)
    # ``memplan compare`` naming no strategy: (its place in the list, the options on a graph); None: not shown
    compare: tuple[int, CompareFn] | None = None
    added: AddedFn | None = None  # the record of the modules ``transform`` adds (``AddedFn``)
    #: ``changes(**transform_options)``: whether ``transform`` changes the model with those options
    #: (``sparse``: only for a scheme with added modules); None: always
    changes: Callable[..., bool] | None = None
    #: the model is captured (and ``--check`` runs it) under its own train / eval flags, not in train mode
    as_prepared: bool = False


STRATEGIES: Registry[Strategy] = Registry("method")


@dataclass(frozen=True)
class Transform:
    """An architecture change every strategy accepts: ``fn(model, **options) -> model``, a no-op
    when its options are left at their defaults."""

    name: str
    fn: TransformFn
    description: str
    options: tuple[str, ...]
    added: AddedFn | None = None  # the record of the modules it adds (``AddedFn``); None: it adds none


TRANSFORMS: Registry[Transform] = Registry("architecture transform")


def architecture(
    name: str, description: str, options: tuple[str, ...], added: AddedFn | None = None
) -> Callable[[TransformFn], TransformFn]:
    """Decorator registering a model transform whose ``options`` every strategy accepts; ``added``:
    the record of the modules it adds (``AddedFn``), for transforms that add modules."""

    def register(fn: TransformFn) -> TransformFn:
        TRANSFORMS.add(name, Transform(name, fn, description, options, added))
        return fn

    return register


def added_records(method: str, options: dict[str, Any]) -> list[dict[str, Any]]:
    """The records of the modules ``method``'s transforms add with ``options`` (``Plan.added``):
    the registered transforms' first, then the strategy's own; one per tag."""
    st = get_strategy(method)
    _, topts = split_options(method, options)
    found = [t.added(**{k: v for k, v in topts.items() if k in t.options}) for t in TRANSFORMS.values() if t.added] + (
        [st.added(**{k: v for k, v in topts.items() if k in st.transform_options})] if st.added else []
    )
    records: dict[str, dict[str, Any]] = {}
    for r in found:
        if r is not None:
            records.setdefault(r["tag"], r)
    return list(records.values())


def add_architecture(model: nn.Module, added: Sequence[Any], input_shape: Sequence[int] | None = None) -> nn.Module:
    """Build the added modules of ``added`` (``Scheme.added_modules`` or ``Plan.added`` records) on
    ``model``: each record's transform (``TRANSFORMS``) with its options, at the per-sample
    ``input_shape`` for a transform that traces the model. Returns the model; BadOption for an
    unknown transform or option."""
    for record in added:
        architecture, options = (
            (record["architecture"], record["options"])
            if isinstance(record, dict)
            else (record.architecture, record.options)
        )
        t = TRANSFORMS.choose(architecture)
        unknown = sorted(set(options) - set(t.options))
        if unknown:
            raise BadOption(
                f"architecture {architecture!r} has no option {unknown[0]!r}", f"its options: {', '.join(t.options)}"
            )
        model = t.fn(model, **options, **_shape_of(t.fn, input_shape))
    return model


def transform_option_names() -> tuple[str, ...]:
    """The options of every registered architecture transform, in registration order."""
    return tuple(o for t in TRANSFORMS.values() for o in t.options)


def strategy(
    name: str, description: str, options: tuple[str, ...] = (), **fields: Any
) -> Callable[[StrategyFn], StrategyFn]:
    """Decorator registering a plan function as strategy ``name`` (``fields``: the other fields of
    :class:`Strategy`)."""

    def register(fn: StrategyFn) -> StrategyFn:
        STRATEGIES.add(name, Strategy(name, fn, description, options, **fields))
        return fn

    return register


def compared(graph: LayerGraph) -> list[tuple[str, dict[str, Any]]]:
    """The strategies ``memplan compare`` shows on ``graph`` when none are named, with their options
    (``Strategy.compare``)."""
    shown = sorted((s for s in STRATEGIES.values() if s.compare is not None), key=lambda s: s.compare[0])
    return [(s.name, opts) for s in shown if (opts := s.compare[1](graph)) is not None]


def as_prepared(method: str | None) -> bool:
    """Whether ``method`` plans the model under its own train / eval flags (``Strategy.as_prepared``)."""
    st = STRATEGIES.get(method) if method is not None else None
    return st is not None and st.as_prepared


def get_strategy(method: str) -> Strategy:
    """The strategy named ``method`` (one-line error listing the known ones)."""
    return STRATEGIES.choose(method)


def positive(name: str, value: Any, high: int | None = None) -> int:
    """``value`` as a positive int (at most ``high``), else a one-line BadOption naming option ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (high is not None and value > high):
        bound = f" in 1..{high}" if high is not None else ""
        raise BadOption(f"--{name.replace('_', '-')} must be an integer{bound}, got {value!r}")
    return value


def split_options(method: str, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(plan options, transform options) of ``method``; None values count as not given."""
    st = get_strategy(method)
    given = {k: v for k, v in options.items() if v is not None}
    shaping = st.transform_options + transform_option_names()
    extra = sorted(set(given) - set(st.options) - set(shaping))
    if extra:
        accepted = st.options + st.transform_options
        raise BadOption(
            f"option --{extra[0].replace('_', '-')} does not apply to method {method!r}",
            f"{method} takes: {', '.join('--' + o.replace('_', '-') for o in accepted) or 'no options'}"
            f"; every method takes: {', '.join(transform_option_names())}",
        )
    return ({k: v for k, v in given.items() if k in st.options}, {k: v for k, v in given.items() if k in shaping})


def changes_architecture(method: str, options: dict[str, Any]) -> bool:
    """Whether ``method`` with ``options`` transforms the model before tracing: a registered
    transform's option is given, or the strategy has a transform that changes the model with them
    (``Strategy.changes``)."""
    st = get_strategy(method)
    _, topts = split_options(method, options)
    if set(topts) - set(st.transform_options):
        return True
    if st.transform is None:
        return False
    return st.changes is None or st.changes(**{k: v for k, v in topts.items() if k in st.transform_options})


def transform_model(
    model: nn.Module, method: str, *, input_shape: Sequence[int] | None = None, **options: Any
) -> nn.Module:
    """Apply the registered architecture transforms (``TRANSFORMS``, with their options) and then
    ``method``'s own transform (if any) to ``model``; returns the model. ``input_shape``: the
    per-sample input the model runs on, passed to every transform that traces the model for its
    shapes (one with an ``input_shape`` parameter: the lite residual branches)."""
    st = get_strategy(method)
    _, topts = split_options(method, options)
    for t in TRANSFORMS.values():
        model = t.fn(model, **{k: v for k, v in topts.items() if k in t.options}, **_shape_of(t.fn, input_shape))
    if st.transform is None:
        return model
    chosen = {k: v for k, v in topts.items() if k in st.transform_options}
    return st.transform(model, **chosen, **_shape_of(st.transform, input_shape))


def _shape_of(fn: TransformFn, input_shape: Sequence[int] | None) -> dict[str, tuple[int, ...]]:
    """``{"input_shape": ...}`` for a transform that takes it (and when it is known), else nothing."""
    if input_shape is None or "input_shape" not in inspect.signature(fn).parameters:
        return {}
    return {"input_shape": tuple(input_shape)}


def make_plan(graph: LayerGraph, method: str, **options: Any) -> Plan:
    """Build the plan of ``method`` on a graph traced from the (transformed) model; ``Plan.added``
    records the modules its transforms added (``added_records``), unless the plan says itself."""
    popts, topts = split_options(method, options)
    plan = get_strategy(method).fn(graph, **popts)
    plan.options = {**popts, **topts, **plan.options}
    if not plan.added:
        plan.added = added_records(method, options)
    return plan


def full_train(node: Node) -> Train:
    """Everything of one layer: its weight-role and bias-role parameters where it has them."""
    roles = {role(p) for p in node.params}
    return Train(1.0 if "weight" in roles else 0.0, "bias" in roles)


def train_classifier(graph: LayerGraph, train: dict[str, Train]) -> dict[str, Train]:
    """``train`` with the whole classifier training (``LayerGraph.classifier_layers``)."""
    train.update({n.name: full_train(n) for n in graph.classifier_layers})
    return train


def _norms(graph: LayerGraph) -> list[Node]:
    return [n for n in graph.nodes if n.kind in NORM_KINDS]


@strategy("full", "every parameter trains; norms use batch statistics", compare=(0, always))
def full(graph: LayerGraph) -> Plan:
    return Plan("full", {n.name: full_train(n) for n in graph.param_nodes()}, {n.name for n in _norms(graph)})


@strategy("last", "classifier only; everything else frozen, norms in eval mode", compare=(1, always))
def last(graph: LayerGraph) -> Plan:
    return Plan("last", train_classifier(graph, {}))


@strategy("norm", "norm scale and shift + classifier; norms use batch statistics", compare=(2, always))
def norm(graph: LayerGraph) -> Plan:
    train = {p.name: full_train(p) for n in _norms(graph) for p in graph.param_layers(n)}
    return Plan("norm", train_classifier(graph, train), {n.name for n in _norms(graph)})


@strategy("bias", "every bias and norm shift + classifier; norms in eval mode (frozen statistics)", compare=(3, always))
def bias(graph: LayerGraph) -> Plan:
    train = {n.name: Train(0.0, True) for n in graph.param_nodes() if any(role(p) == "bias" for p in n.params)}
    return Plan("bias", train_classifier(graph, train))


#: K of ``lastk`` / ``mobiletl`` when neither --blocks nor --layers is given: the last 3 blocks
#: (all of them when the model has fewer; the last 3 conv / linear layers when it has none)
DEFAULT_K = 3


def lastk_start(graph: LayerGraph, blocks: int | None = None, layers: int | None = None) -> int:
    """Index of the first node of the K-th last block, or of the K-th last conv / linear layer
    (``DEFAULT_K`` blocks when neither is given)."""
    if blocks is not None and layers is not None:
        raise BadOption("give one of --blocks K or --layers K, not both")
    if blocks is None and layers is None:
        blocks, layers = (min(DEFAULT_K, len(graph.blocks)), None) if graph.blocks else (None, DEFAULT_K)
    if blocks is not None:
        if not graph.blocks:
            raise BadOption(
                "no blocks found in this model",
                "use --layers K, or name the blocks with --block-names (module qualnames)",
            )
        if not 1 <= blocks <= len(graph.blocks):
            raise BadOption(f"--blocks {blocks} is out of range", f"the model has {len(graph.blocks)} blocks")
        return graph.block_range(graph.blocks[-blocks])[0]
    layer_nodes = [n for n in graph.nodes if n.kind in ("conv", "linear") and graph.param_layers(n)]
    if not 1 <= layers <= len(layer_nodes):
        raise BadOption(f"--layers {layers} is out of range", f"the model has {len(layer_nodes)} conv / linear layers")
    return layer_nodes[-layers].index


@strategy(
    "lastk",
    "everything from the K-th last block (or layer) on trains; norms there use batch statistics",
    ("blocks", "layers"),
    compare=(7, on_blocks),
)
def lastk(graph: LayerGraph, blocks: int | None = None, layers: int | None = None) -> Plan:
    start = lastk_start(graph, blocks, layers)
    tail = graph.nodes[start:]
    train = {p.name: full_train(p) for n in tail for p in graph.param_layers(n)}
    return Plan("lastk", train, {n.name for n in tail if n.kind in NORM_KINDS and n.params})
