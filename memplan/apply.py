"""Turn a plan into a real training setup: ``apply_plan``, ``apply_strategy``, ``apply_scheme``.

``apply_plan(model, plan)`` changes ``model`` **in place** and returns the same object, ready
for an ordinary training loop (``memplan.train``): ``requires_grad`` and norm train / eval
flags set per plan (as ``memplan.measure.apply_plain`` does), then the memory-lean modules of
``memplan.lean`` swapped in, by ``setattr`` on the parent module, wherever they save memory:

===================================================  ==================  ==================
op (module), under the plan                          replaced by         keeps for backward
===================================================  ==================  ==================
Conv1d/2d, frozen weight, recorded by autograd       ``FrozenConv``      nothing
Conv1d/2d, weight fraction r in (0, 1)               ``SubChannelConv``  selected channels
BatchNorm, eval (frozen stats), frozen scale         ``ShiftOnlyNorm``   nothing
ReLU / ReLU6 / Hardtanh / LeakyReLU                  ``Masked*``         1-bit mask
Hardswish in ``plan.approx``                         ``SignHardswish``   1-bit mask
Dropout, 0 < p < 1, out of place                     ``MaskedDropout``   1-bit mask
AvgPool2d                                            ``LeanAvgPool2d``   nothing
===================================================  ==================  ==================

Activations, dropout and pooling are swapped where their input needs a gradient, norms where
autograd records them; a ReLU is not, where a consumer keeps its output anyway (a conv or
linear whose whole weight trains): PyTorch's ReLU then shares that tensor, a mask would add
``numel / 8`` bytes. A ReLU6 / ReLU in ``plan.approx`` keeps its exact 1-bit mask (its
derivative is 0 or 1 already); only h-swish gets MobileTL's sign approximation. Everything
else is left alone: a frozen prefix (nothing recorded) saves nothing anyway, a trainable conv
needs its input, and a Linear with a frozen weight already keeps no activation
in eager PyTorch (so ``FrozenLinear`` would save nothing). Conventions:

* the whole model is put in train mode (dropout active), norms outside ``plan.norm_train``
  in eval mode; the sub-channel selection uses ``Train.select`` (seed 0 for ``random``);
* a sub-channel layer trains ``SubChannelConv.weight_sel`` (a new Parameter); its shared
  ``weight`` stays frozen and stale until :func:`write_back`;
* the graph passed in must be traced from ``model`` itself; after the swap it describes the
  model as it was (trace again to profile the applied model: the lean modules are leaves
  of the same kinds, registered with ``memplan.graph.register_module_kind``).

``lean_class`` is the single decision "which lean module does apply_plan put here"; the
``applied`` accounting mode (``memplan.modes.applied``) predicts memory from it.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import torch.nn as nn

from .errors import BadOption
from .graph import LayerGraph, capture, register_module_kind
from .lean import (FrozenConv, FrozenLinear, LeanAvgPool2d, MaskedDropout, MaskedHardtanh, MaskedLeakyReLU,
                   MaskedReLU, MaskedReLU6, ShiftOnlyNorm, SignHardswish, SubChannelConv)
from .measure import apply_plain
from .ops import FREE_KINDS, MASK_ACTIVATIONS, PARAM_KINDS
from .plan import OpView, Plan, Train, grad_flow

__all__ = ["apply_plan", "apply_strategy", "apply_scheme", "plan_strategy", "plan_scheme", "lean_class", "write_back",
           "LEAN_KINDS", "DEFAULT_INPUT_SHAPE"]

#: input shape (batch first) used to trace a model when none is given
DEFAULT_INPUT_SHAPE = (1, 3, 224, 224)

#: op kind of every lean module (they stay fx leaves, costed like the op they replace)
LEAN_KINDS: dict[type[nn.Module], str] = {
    FrozenConv: "conv", SubChannelConv: "conv", FrozenLinear: "linear", ShiftOnlyNorm: "batchnorm",
    MaskedReLU: "relu", MaskedHardtanh: "hardtanh", MaskedReLU6: "hardtanh", MaskedLeakyReLU: "leaky_relu",
    SignHardswish: "hardswish", MaskedDropout: "dropout", LeanAvgPool2d: "avgpool",
}
for _cls, _kind in LEAN_KINDS.items():
    register_module_kind(_cls, _kind)

LeanChoice = Callable[[OpView, nn.Module], "type[nn.Module] | None"]


def _conv(op: OpView, m: nn.Module) -> type[nn.Module] | None:
    if type(m) not in (nn.Conv1d, nn.Conv2d) or m.padding_mode != "zeros" or isinstance(m.padding, str):
        return None
    if 0 < op.train.weight < 1:
        return SubChannelConv
    return FrozenConv if op.train.weight == 0 and op.recorded else None


def _batchnorm(op: OpView, m: nn.Module) -> type[nn.Module] | None:
    frozen = op.train.weight == 0 and not op.norm_train
    has_stats = isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None
    return ShiftOnlyNorm if frozen and has_stats and op.recorded else None


def _output_kept_anyway(op: OpView) -> bool:
    """Does a consumer keep ``op``'s output storage for its own backward (a conv, or a linear
    with a contiguous input, whose whole weight trains), directly or through views?"""
    if op.plan is None:
        return False
    storage = op.node.out.storage
    frontier, seen = [op.node.index], set()
    while frontier:
        i = frontier.pop()
        for n in op.graph.nodes[i + 1:]:
            if i not in n.inputs or n.index in seen:
                continue
            seen.add(n.index)
            x = n.in_tensors[n.inputs.index(i)]
            if x.storage != storage or op.plan.of(n).weight < 1:
                if n.kind in FREE_KINDS and n.out is not None and n.out.storage == storage:
                    frontier.append(n.index)
                continue
            if n.kind == "conv" or (n.kind == "linear" and (x.contiguous or len(x.shape) <= 2)):
                return True
    return False


def _relu(op: OpView, m: nn.Module) -> type[nn.Module] | None:
    # PyTorch's ReLU keeps its output: free when a trainable consumer keeps that tensor anyway
    return MaskedReLU if type(m) is nn.ReLU and op.grad_input and not _output_kept_anyway(op) else None


def _hardtanh(op: OpView, m: nn.Module) -> type[nn.Module] | None:
    if not (isinstance(m, nn.Hardtanh) and op.grad_input):
        return None
    return MaskedReLU6 if (m.min_val, m.max_val) == (0.0, 6.0) else MaskedHardtanh


def _leaky_relu(op: OpView, m: nn.Module) -> type[nn.Module] | None:
    return MaskedLeakyReLU if type(m) is nn.LeakyReLU and op.grad_input else None


def _hardswish(op: OpView, m: nn.Module) -> type[nn.Module] | None:
    return SignHardswish if type(m) is nn.Hardswish and op.approx and op.grad_input else None


def _dropout(op: OpView, m: nn.Module) -> type[nn.Module] | None:
    ok = type(m) is nn.Dropout and 0 < m.p < 1 and not m.inplace
    return MaskedDropout if ok and op.grad_input else None


def _avgpool(op: OpView, m: nn.Module) -> type[nn.Module] | None:
    return LeanAvgPool2d if type(m) is nn.AvgPool2d and op.grad_input else None


CHOICES: dict[str, LeanChoice] = {
    "conv": _conv, "batchnorm": _batchnorm, "relu": _relu, "hardtanh": _hardtanh, "leaky_relu": _leaky_relu,
    "hardswish": _hardswish, "dropout": _dropout, "avgpool": _avgpool,
}


def _calls(op: OpView) -> list[OpView]:
    """The views of every call of ``op``'s module, in forward order (just ``op`` when it is
    called once)."""
    uses = [n.index for n in op.graph.nodes if n.module is op.node.module]
    if len(uses) == 1 or op.plan is None:
        return [op]
    views = grad_flow(op.graph, op.plan)
    return [views[i] for i in uses]


def lean_class(op: OpView) -> type[nn.Module] | None:
    """The lean module class ``apply_plan`` puts in place of ``op``'s module (or that module's
    own class when it already is one); None when the op is left alone.

    One decision per module, whatever call ``op`` is: a module called several times (a shared
    ReLU) is swapped for all its calls. Convs and norms follow their first call (the one the
    plan names); activations, dropout and pooling, whose lean versions compute the same thing,
    are swapped when any call would be."""
    m = op.node.module
    if op.node.op != "call_module" or m is None:
        return None
    if type(m) in LEAN_KINDS:
        return type(m)
    choose = CHOICES.get(op.kind)
    if choose is None:
        return None
    choices = [choose(v, m) for v in _calls(op)]
    if op.kind in PARAM_KINDS:
        return choices[0]
    return next((c for c in choices if c is not None), None)


def _build(cls: type[nn.Module], m: nn.Module, train: Train) -> nn.Module:
    if cls is SubChannelConv:
        return SubChannelConv.from_module(m, train.weight, train.select)
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
            raise BadOption(f"the graph was not traced from this model (layer {node.name!r} differs)",
                            "trace it with memplan.capture(model, input_shape) or pass graph=None")
        names[id(node.module)] = node.name
    return names


def _check_plan(graph: LayerGraph, plan: Plan) -> None:
    """Refuse what no lean module can realise (one-line errors)."""
    for node in graph.nodes:
        t = plan.of(node)
        if node.kind == "linear" and 0 < t.weight < 1:
            raise BadOption(f"plan updates {t.weight:g} of linear layer {node.name!r}; memplan has no "
                            "sub-channel linear op", "update a linear layer whole (ratio 1) or not at all")
        if node.name in plan.approx and node.kind not in MASK_ACTIVATIONS | {"hardswish"}:
            raise BadOption(f"no sign-approximated backward for {node.kind} layer {node.name!r}",
                            "approximate hardswish layers only (ReLU-style layers keep exact 1-bit masks)")


def apply_plan(model: nn.Module, plan: Plan, graph: LayerGraph | None = None, *,
               input_shape: Sequence[int] = DEFAULT_INPUT_SHAPE) -> nn.Module:
    """Set up ``model`` in place for training under ``plan``; returns the same object.

    ``graph``: a trace of ``model`` (``memplan.capture``); traced at ``input_shape`` (batch
    first) on the meta device when not given. See the module docstring for what changes.
    Raises ``BadOption`` for what cannot be realised (a fractional linear update, a
    sub-channel update of a grouped non-depthwise conv, an approximation without lean op)
    and for a model that was applied already.
    """
    applied = next((m for m in model.modules() if type(m) in LEAN_KINDS), None)
    if applied is not None:
        raise BadOption(f"the model already holds memplan lean modules ({type(applied).__name__})",
                        "apply a plan once, to a model without them")
    if graph is None:
        graph = capture(model, tuple(input_shape))
    names = _module_names(model, graph)
    _check_plan(graph, plan)
    apply_plain(model, graph, plan)
    swaps: dict[str, nn.Module] = {}
    for op in grad_flow(graph, plan):
        cls = lean_class(op)
        qual = names.get(id(op.node.module), "")
        if cls is None or type(op.node.module) is cls or qual in swaps:
            continue
        try:
            swaps[qual] = _build(cls, op.node.module, op.train)
        except NotImplementedError as exc:
            raise BadOption(f"cannot apply {cls.__name__} to {op.node.name!r}: {exc}") from None
    for qual, lean in swaps.items():
        parent, _, child = qual.rpartition(".")
        setattr(model.get_submodule(parent), child, lean)
    return model


def plan_strategy(model: nn.Module, method: str, *, input_shape: Sequence[int] = DEFAULT_INPUT_SHAPE,
                  leaf_modules: Iterable[str | type] = (), block_names: Sequence[str] | None = None,
                  **options: Any) -> tuple[nn.Module, LayerGraph, Plan]:
    """``method``'s architecture transform (if any) on ``model``, a meta-device trace at
    ``input_shape`` (batch first) and the plan: (model, graph, plan). Nothing is swapped yet."""
    from .strategies import make_plan, transform_model  # strategies import costs, which imports this module

    model = transform_model(model, method, **options)
    graph = capture(model, tuple(input_shape), leaf_modules=leaf_modules, block_names=block_names)
    return model, graph, make_plan(graph, method, **options)


def apply_strategy(model: nn.Module, method: str, *, input_shape: Sequence[int] = DEFAULT_INPUT_SHAPE,
                   leaf_modules: Iterable[str | type] = (), block_names: Sequence[str] | None = None,
                   **options: Any) -> nn.Module:
    """Transform (if ``method`` has a transform) + trace + plan + :func:`apply_plan`.

    Returns the model ready for training (the same object unless the transform returns a new
    one). ``options`` are the strategy's options (``blocks=3`` for ``lastk`` ...); give the
    real ``input_shape`` for strategies whose plan depends on it (memory budgets).
    """
    model, graph, plan = plan_strategy(model, method, input_shape=input_shape, leaf_modules=leaf_modules,
                                       block_names=block_names, **options)
    return apply_plan(model, plan, graph)


def plan_scheme(model: nn.Module, scheme: Any, graph: LayerGraph | None = None) -> tuple[LayerGraph, Plan]:
    """(graph, plan) of a sparse-update scheme (a ``memplan.scheme.Scheme`` or the path of its
    JSON file) on ``model``, traced at the scheme's batch and input shape unless ``graph`` is given."""
    from .scheme import Scheme, load_scheme, scheme_to_plan  # scheme imports pydantic: only when needed

    if not isinstance(scheme, Scheme):
        scheme = load_scheme(scheme)
    if scheme.added_modules:
        raise BadOption("apply_scheme cannot insert the scheme's added_modules yet",
                        "apply the architecture transform (memplan.transforms) first and drop them from the scheme")
    if graph is None:
        graph = capture(model, (scheme.batch, *scheme.input_shape))
    return graph, scheme_to_plan(graph, scheme)


def apply_scheme(model: nn.Module, scheme: Any, graph: LayerGraph | None = None) -> nn.Module:
    """:func:`apply_plan` with the plan of a sparse-update scheme (a ``Scheme`` or a path to its
    JSON); refuses a scheme planned for another model (fingerprint). Returns the same model."""
    graph, plan = plan_scheme(model, scheme, graph)
    return apply_plan(model, plan, graph)


def write_back(model: nn.Module) -> nn.Module:
    """Copy every sub-channel update into its shared ``weight`` Parameter (before exporting a
    state_dict or swapping the plain modules back); returns the model."""
    for m in model.modules():
        if isinstance(m, SubChannelConv):
            m.write_back()
    return model
