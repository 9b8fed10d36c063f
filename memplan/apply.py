"""Turn a plan into a real training setup: ``apply_plan``, ``apply_strategy``, ``apply_scheme``;
and back: ``unapply``.

``apply_plan(model, plan)`` changes ``model`` **in place** and returns the same object, ready
for an ordinary training loop (``memplan.train``): ``requires_grad`` and norm train / eval
flags set per plan (as :func:`apply_plain` does), then the memory-lean modules of
``memplan.nn.lean`` swapped in, by ``setattr`` on the parent module, wherever they save memory
(``memplan.nn.choice`` decides where and lists them).

Conventions:

* the whole model is put in train mode (dropout active), norms outside ``plan.norm_train``
  in eval mode; the sub-channel selection uses ``Train.select`` (seed 0 for ``random``), or
  exactly ``Train.channels`` for ``importance``;
* a sub-channel layer trains ``SubChannelConv.weight_sel`` (a new Parameter); its shared
  ``weight`` stays frozen and stale until :func:`write_back`;
* checkpoints are the plain model's: ``model.state_dict()`` of an applied model has exactly the
  plain model's keys with the trained values (``weight_sel`` folded into ``weight``), loads
  strictly into a freshly built plain model, and a plain checkpoint loads into an applied
  model; :func:`unapply` puts the plain modules back (same Parameters, trained values);
* the graph passed in must be traced from ``model`` itself; after the swap it describes the
  model as it was (trace again to profile the applied model: the lean modules are leaves
  of the same kinds, declared by their ``memplan_kind``);
* ``plan.recompute`` (a scheme's ``execution``): each segment of consecutive blocks runs under
  non-reentrant ``torch.utils.checkpoint`` (``memplan.nn.recompute``), names and ``state_dict``
  unchanged, outputs and gradients the same;
* a scheme with ``added_modules`` (TinyTL's lite residual branches): :func:`apply_scheme` first
  builds them (:func:`add_modules`: the scheme's architecture transform, at its input shape, with
  torch's generator seeded 0 inside, so two builds hold the same branch weights), which leaves
  what the model computes unchanged (the branches' last norm has scale 0). Such a model's
  ``state_dict()`` holds the plain model's keys plus the branches' (``<block>.lite_residual.*``):
  a strict load into a plain model refuses those extra keys by name; ``strict=False`` loads the
  backbone and returns them as ``unexpected_keys`` (the branch weights have no place in the plain
  model); the whole checkpoint loads strictly into ``add_modules(plain_model, scheme)``.
  :func:`unapply` restores the lean modules only: the added modules stay.

``memplan.nn.choice.lean_class`` is the single decision "which lean module does apply_plan put
here"; the ``applied`` accounting mode (``memplan.modes.applied``) predicts memory from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.nn as nn

from .api import Captured, capture, planned_for
from .errors import BadOption
from .graph import LayerGraph, channel_index_problem, role
from .graph.kinds import MASK_ACTIVATIONS, NORM_KINDS
from .nn.choice import lean_class
from .nn.lean import LEAN_MODULES, SubChannelConv, restore
from .nn.lean.conv import select_channels
from .nn.recompute import recompute_segments, restore_segments
from .nn.transforms import replace_module
from .plan import Plan, Train, grad_flow, scheme_to_plan
from .strategies import add_architecture, make_plan

__all__ = [
    "apply_plain",
    "apply_plan",
    "apply_strategy",
    "apply_scheme",
    "add_modules",
    "plan_strategy",
    "plan_scheme",
    "write_back",
    "unapply",
    "DEFAULT_INPUT_SHAPE",
]

#: input shape (batch first) used to trace a model when none is given
DEFAULT_INPUT_SHAPE = (1, 3, 224, 224)


def apply_plain(model: nn.Module, graph: LayerGraph, plan: Plan) -> nn.Module:
    """Set ``requires_grad`` and train / eval flags for ``plan`` the way plain PyTorch code does:
    every parameter a node reads trains when the plan trains its role (weight / bias) at that
    node's layer; norms (modules, or the module running a functional norm) use batch statistics
    where the plan says so. Everything else runs in train mode (dropout active).

    Sub-channel ratios cannot be expressed this way: a partially updated weight trains whole.
    """
    model.train()
    for p in model.parameters():
        p.requires_grad_(False)
    for node in graph.nodes:
        t = plan.of(node)
        for pname, qual in node.uses.items():
            if t.weight > 0 if role(pname) == "weight" else t.bias:
                model.get_parameter(qual).requires_grad_(True)
        if node.kind in NORM_KINDS:
            owner = node.module if node.module is not None else model.get_submodule(node.layer or node.scope)
            owner.train(plan.uses_batch_stats(node))
    return model


def _capture(model: nn.Module, input_shape: Sequence[int], **options: Any) -> Captured:
    """The capture pipeline (``memplan.capture``) on a built model at ``input_shape`` (batch first)."""
    shape = tuple(input_shape)
    return capture(model, shape[1:], batch=shape[0], name="model", **options)


def _sub_channels_in_place(op: Any) -> None:
    """A sub-channel update of a conv no lean module replaces but that trains a channel subset itself
    (``train_channels(indices)``: the int8 graph's ``QuantConv2d`` masks the other channels' weight
    gradient), with memplan's channel selection."""
    m, t = op.node.module, op.train
    channels = t.channels if t.channels is not None else select_channels(m.weight, m.groups, t.weight, t.select)
    m.train_channels(torch.as_tensor(channels, dtype=torch.int64))


def _build(cls: type[nn.Module], m: nn.Module, train: Train) -> nn.Module:
    if cls is SubChannelConv:
        return SubChannelConv.from_module(m, train.weight, train.select, channels=train.channels)
    return cls.from_module(m)


def _module_names(model: nn.Module, graph: LayerGraph) -> dict[int, str]:
    """id(module) -> qualname for every module node (the first use carries the qualname);
    refuses a graph traced from another model instance."""
    names: dict[int, str] = {}
    for node in graph.nodes:
        if node.op != "call_module" or id(node.module) in names:
            continue
        try:
            same = model.get_submodule(node.name) is node.module
        except AttributeError:
            same = False
        if not same:
            raise BadOption(
                f"the graph was not traced from this model (layer {node.name!r} differs)",
                "capture it with memplan.capture(model, input_shape).graph or pass graph=None",
            )
        names[id(node.module)] = node.name
    return names


def _check_plan(graph: LayerGraph, plan: Plan) -> None:
    """Refuse what no lean module can realise (one-line errors)."""
    for node in graph.nodes:
        t = plan.of(node)
        if node.kind == "linear" and 0 < t.weight < 1:
            raise BadOption(
                f"plan updates {t.weight:g} of linear layer {node.name!r}; memplan has no sub-channel linear op",
                "update a linear layer whole (ratio 1) or not at all",
            )
        if node.kind == "conv" and 0 < t.weight < 1 and node.op != "call_module":
            raise BadOption(
                f"plan updates {t.weight:g} of conv {node.name!r}, which is not a stock Conv1d / Conv2d "
                "(its module computes the conv in its own forward)",
                "update that conv whole (ratio 1) or not at all",
            )
        if node.kind == "conv" and 0 < t.weight < 1 and t.channels is not None and "weight" in node.params:
            c_in = node.params["weight"].shape[1] * int(node.attrs.get("groups", 1))
            problem = channel_index_problem(t.channels, c_in, t.weight)
            if problem is not None:
                raise BadOption(f"plan trains listed channels of conv {node.name!r}: {problem}")
        if node.name in plan.approx and node.kind not in MASK_ACTIVATIONS | {"hardswish"}:
            raise BadOption(
                f"no sign-approximated backward for {node.kind} layer {node.name!r}",
                "approximate hardswish layers only (ReLU-style layers keep exact 1-bit masks)",
            )


def apply_plan(
    model: nn.Module, plan: Plan, graph: LayerGraph | None = None, *, input_shape: Sequence[int] = DEFAULT_INPUT_SHAPE
) -> nn.Module:
    """Set up ``model`` in place for training under ``plan``; returns the same object.

    ``graph``: a trace of ``model`` (``memplan.capture(model, ...).graph``); traced at ``input_shape`` (batch
    first) on the meta device when not given. See the module docstring for what changes.
    Raises ``BadOption`` for what cannot be realised (a fractional linear update, a
    sub-channel update of a grouped non-depthwise conv, an approximation without lean op)
    and for a model that was applied already.
    """
    applied = next((m for m in model.modules() if type(m) in LEAN_MODULES), None)
    if applied is not None:
        raise BadOption(
            f"the model already holds memplan lean modules ({type(applied).__name__})",
            "apply a plan once, to a model without them",
        )
    if graph is None:
        graph = _capture(model, input_shape).graph
    names = _module_names(model, graph)
    _check_plan(graph, plan)
    ops = list(grad_flow(graph, plan))
    apply_plain(model, graph, plan)
    swaps: dict[str, nn.Module] = {}
    for op in ops:
        cls = lean_class(op)
        qual = names.get(id(op.node.module), "")
        if cls is None and 0 < op.train.weight < 1 and hasattr(op.node.module, "train_channels"):
            _sub_channels_in_place(op)
            continue
        if cls is None or type(op.node.module) is cls or qual in swaps:
            continue
        try:
            swaps[qual] = _build(cls, op.node.module, op.train)
        except NotImplementedError as exc:
            raise BadOption(f"cannot apply {cls.__name__} to {op.node.name!r}: {exc}") from None
    for qual, lean in swaps.items():
        replace_module(model, qual, lean)
    return recompute_segments(model, plan.recompute)


def plan_strategy(
    model: nn.Module,
    method: str,
    *,
    input_shape: Sequence[int] = DEFAULT_INPUT_SHAPE,
    leaf_modules: Iterable[str | type] = (),
    block_names: Sequence[str] | None = None,
    **options: Any,
) -> tuple[nn.Module, LayerGraph, Plan]:
    """``method``'s architecture transform (if any) on ``model``, a meta-device trace at
    ``input_shape`` (batch first) and the plan: (model, graph, plan), through the capture
    pipeline of ``memplan.api``. Nothing is swapped yet."""
    cap = _capture(
        model, input_shape, method=method, method_options=options, leaf_modules=leaf_modules, block_names=block_names
    )
    return cap.model, cap.graph, make_plan(cap.graph, method, **options)


def apply_strategy(
    model: nn.Module,
    method: str,
    *,
    input_shape: Sequence[int] = DEFAULT_INPUT_SHAPE,
    leaf_modules: Iterable[str | type] = (),
    block_names: Sequence[str] | None = None,
    **options: Any,
) -> nn.Module:
    """Transform (if ``method`` has a transform) + trace + plan + :func:`apply_plan`.

    Returns the model ready for training (the same object unless the transform returns a new
    one). ``options`` are the strategy's options (``blocks=3`` for ``lastk`` ...); give the
    real ``input_shape`` for strategies whose plan depends on it (memory budgets).
    """
    model, graph, plan = plan_strategy(
        model, method, input_shape=input_shape, leaf_modules=leaf_modules, block_names=block_names, **options
    )
    return apply_plan(model, plan, graph)


def _scheme(scheme: Any) -> Any:
    from .plan import Scheme, load_scheme  # the scheme format (pydantic) only where a scheme is read

    return scheme if isinstance(scheme, Scheme) else load_scheme(scheme)


def add_modules(model: nn.Module, scheme: Any, input_shape: Sequence[int] | None = None) -> nn.Module:
    """Build the ``added_modules`` of ``scheme`` (a ``Scheme`` or the path of its JSON) on ``model``:
    each one's architecture transform (``memplan.strategies.TRANSFORMS``) with its options, at the
    per-sample ``input_shape`` (default: the scheme's), with torch's random generators seeded 0
    inside (forked: the caller's state is left as it was), so every build holds the same initial
    weights. Returns the model (changed in place); a model that holds them already, or a scheme
    without added modules, leaves it as it is."""
    scheme = _scheme(scheme)
    if not scheme.added_modules:
        return model
    shape = tuple(input_shape) if input_shape is not None else tuple(scheme.input_shape)
    forked = torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else [])
    with forked, planned_for(scheme, shape_given=input_shape is not None):
        torch.manual_seed(0)
        return add_architecture(model, scheme.added_modules, shape)


def plan_scheme(model: nn.Module, scheme: Any, graph: LayerGraph | None = None) -> tuple[LayerGraph, Plan]:
    """(graph, plan) of a sparse-update scheme (a ``memplan.Scheme`` or the path of its
    JSON file) on ``model``, traced at the scheme's batch and input shape unless ``graph`` is given.
    A scheme with ``added_modules`` needs them in ``model`` already (:func:`add_modules`;
    :func:`apply_scheme` builds them)."""
    scheme = _scheme(scheme)
    if graph is None:
        with planned_for(scheme):  # a model that fails at the scheme's input is not the scheme's
            graph = _capture(model, (scheme.batch, *scheme.input_shape)).graph
    return graph, scheme_to_plan(graph, scheme)


def apply_scheme(model: nn.Module, scheme: Any, graph: LayerGraph | None = None) -> nn.Module:
    """:func:`apply_plan` with the plan of a sparse-update scheme (a ``Scheme`` or a path to its
    JSON), after building its ``added_modules`` (:func:`add_modules`; a ``graph`` of the model
    without them is traced again); refuses a scheme planned for another model (fingerprint).
    Returns the model (the same object)."""
    scheme = _scheme(scheme)
    if scheme.added_modules:
        model = add_modules(model, scheme)
        if graph is not None and not any(n.tags for n in graph.nodes):
            graph = None  # traced before the added modules were built
    graph, plan = plan_scheme(model, scheme, graph)
    return apply_plan(model, plan, graph)


def write_back(model: nn.Module) -> nn.Module:
    """Copy every sub-channel update into its shared ``weight`` Parameter (before exporting a
    state_dict or swapping the plain modules back); returns the model."""
    for m in model.modules():
        if isinstance(m, SubChannelConv):
            m.write_back()
    return model


def unapply(model: nn.Module) -> nn.Module:
    """Put the plain modules back in place of every lean module of ``model`` (in place; returns the
    model, or the plain module when ``model`` itself is a lean one): the modules ``apply_plan``
    replaced, holding the trained values (a sub-channel update written back into its weight, which
    then trains whole, as :func:`apply_plain` trains it) and the same Parameter objects otherwise.
    ``requires_grad`` and train / eval flags stay as the plan set them; recomputed segments run
    their blocks' own forward again."""
    restore_segments(model)
    restored: dict[int, nn.Module] = {}
    for qual, m in list(model.named_modules(remove_duplicate=False)):
        if type(m) not in LEAN_MODULES:
            continue
        if id(m) not in restored:  # a module used at several places is restored once
            restored[id(m)] = restore(m)
        plain = restored[id(m)]
        if not qual:
            return plain
        replace_module(model, qual, plain)
    return model
