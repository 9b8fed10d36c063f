"""Canonical op kinds: every traced node (module, function or method call) maps to one kind.

Each kind is one entry of :data:`KINDS` (:func:`kind`): how capture recognises it (module
classes, functions, Tensor methods, a functional form's arguments), its traits (MAC work, norm,
trainable parameters, activation, 0/1-mask gradient, elementwise layout, free), its "other"
FLOPs per element and the attributes capture records of a call; the tables the graph layer reads
(:data:`MODULE_KINDS`, :data:`NORM_KINDS`, ...) are derived from the entries. Cost rules (FLOPs in
``memplan.costs.flops``, saved tensors in ``memplan.modes``) are registered per kind name, so a
model is never special-cased: supporting a new op means one ``kind(...)`` here and one rule per
registry (``tests/test_kinds.py`` checks that the FLOP rules and the ``pytorch`` mode cover every
kind, and that no rule names an unknown one). Anything that maps to no kind is reported as unknown,
with counts. A module class may declare its own kind with a ``memplan_kind`` class attribute
(memplan's lean modules do); :func:`module_kind` reads it first, so the kind of a module never
depends on what has been imported.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from ..registry import Registry
from .attention import SDPA_ARGS
from .autocast import autocast_cast
from .readers import (
    PAD_MODES,
    Attrs,
    arg,
    conv_layer,
    dropout_call,
    dropout_module,
    getitem_call,
    layernorm_layer,
    pad_call,
    pad_module,
)

#: the traits a kind may have (:attr:`Kind.traits`)
TRAITS = frozenset({"mac", "norm", "param", "activation", "mask", "elementwise", "free"})


@dataclass(frozen=True)
class Kind:
    """Everything the graph layer knows about one op kind, in one entry (the costs and the modes
    register their rules per kind name: ``@flop_rule("kind")``, ``@<mode>.rule("kind")``;
    ``tests/test_kinds.py`` checks that the FLOP rules and the ``pytorch`` mode cover every kind
    and that no rule names a kind that is not registered).

    * how capture recognises it: ``modules`` (``torch.nn`` classes whose forward it is; a subclass
      too, see :func:`stock_kind`), ``functions`` (callables: ``torch``, ``F``, ``operator``),
      ``methods`` (``Tensor`` method names), ``layer`` (a functional form's argument names in call
      order, for the functions that take parameters: ``F.conv2d``, ``F.linear``, ...;
      ``layer_functions`` overrides them per function, ``addmm(bias, x, w.t())``; ``input_arg``:
      the argument that is its input, whose gradient is grad_input: the query of attention);
    * ``traits``: ``mac`` (forward FLOPs = 2 x MACs), ``norm`` (scale = ``weight``, shift =
      ``bias``), ``param`` (parameters the strategies train), ``activation``, ``mask`` (its
      gradient is a 0/1 mask of the input: 1 bit suffices), ``elementwise`` (a TensorIterator op:
      its output layout follows its inputs'), ``free`` (no computation, no saved tensors);
    * ``flops``: "other" FLOPs per output element of an elementwise or reduction op (None: its
      own FLOP rule); ``kernel``: whether it runs a kernel with a workspace (calibration);
    * what capture records of a call: ``module_attrs(module)``, ``call_attrs(fx node)``,
      ``layer_attrs(bound argument values)`` of a functional form (``memplan.graph.attrs``).
    """

    name: str
    modules: tuple[type, ...] = ()
    functions: tuple[object, ...] = ()
    methods: tuple[str, ...] = ()
    traits: frozenset[str] = frozenset()
    flops: int | None = None
    kernel: bool = True
    layer: tuple[str, ...] = ()
    layer_functions: dict[object, tuple[str, ...]] = field(default_factory=dict)
    input_arg: str = "input"
    module_attrs: Callable[[nn.Module], Attrs] | None = None
    call_attrs: Callable[[fx.Node], Attrs] | None = None
    layer_attrs: Callable[[dict[str, Any]], Attrs] | None = None


#: op kind name -> its entry (:class:`Kind`)
KINDS: Registry[Kind] = Registry("op kind")


def kind(name: str, *traits: str, **fields: Any) -> Kind:
    """Register the op kind ``name`` with ``traits`` and the other fields of :class:`Kind`; a
    module class, function or method another kind claims is refused (ValueError at import)."""
    if not set(traits) <= TRAITS:
        raise ValueError(f"op kind {name!r}: unknown traits {sorted(set(traits) - TRAITS)}")
    entry = Kind(name, traits=frozenset(traits), **fields)
    for other in KINDS.values():
        for what in ("modules", "functions", "methods"):
            both = [x for x in getattr(entry, what) if x in getattr(other, what)]
            if both:
                raise ValueError(f"op kind {name!r}: {what} {both} already belong to {other.name!r}")
    return KINDS.add(name, entry)


def with_trait(trait: str) -> frozenset[str]:
    """The kinds that have ``trait``."""
    return frozenset(n for n, k in KINDS.items() if trait in k.traits)


kind(
    "conv",
    "mac",
    "param",
    modules=(nn.Conv1d, nn.Conv2d, nn.Conv3d),
    functions=(F.conv1d, F.conv2d, F.conv3d),
    layer=("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
    module_attrs=lambda m: {"weight_shape": tuple(m.weight.shape)},
    layer_attrs=conv_layer,
)
kind(
    "linear",
    "mac",
    "param",
    modules=(nn.Linear,),
    functions=(F.linear, torch.addmm),
    layer=("input", "weight", "bias"),
    layer_functions={torch.addmm: ("bias", "input", "weight")},  # addmm(bias, x, w.t()): the weight transposed
)
kind("matmul", "mac", functions=(operator.matmul, torch.matmul, torch.mm, torch.bmm), methods=("matmul",))
kind(
    "sdpa",
    "mac",
    functions=(F.scaled_dot_product_attention,),
    layer=SDPA_ARGS,
    input_arg="query",
    layer_attrs=lambda args: {
        k: args.get(k, d) for k, d in (("dropout_p", 0.0), ("is_causal", False), ("scale", None), ("enable_gqa", False))
    },
)
kind(
    "batchnorm",
    "norm",
    "param",
    modules=(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d),
    functions=(F.batch_norm,),
    layer=("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"),
    module_attrs=lambda m: {"running_stats": getattr(m, "running_mean", None) is not None},
    layer_attrs=lambda args: {"running_stats": args.get("running_mean") is not None},
)
kind(
    "groupnorm",
    "norm",
    "param",
    modules=(nn.GroupNorm,),
    functions=(F.group_norm,),
    layer=("input", "num_groups", "weight", "bias", "eps"),
    layer_attrs=lambda args: {"num_groups": args["num_groups"]},
)
kind(
    "layernorm",
    "norm",
    "param",
    modules=(nn.LayerNorm,),
    functions=(F.layer_norm,),
    layer=("input", "normalized_shape", "weight", "bias", "eps"),
    layer_attrs=layernorm_layer,
)
# activations: FLOPs per output element ("other" FLOPs); mask: the gradient is a 0/1 mask of the input
kind(
    "relu",
    "activation",
    "mask",
    "elementwise",
    flops=1,
    modules=(nn.ReLU,),
    functions=(F.relu, torch.relu, torch.relu_, F.relu_),
    methods=("relu", "relu_"),
)
kind(
    "hardtanh",
    "activation",
    "mask",
    "elementwise",
    flops=2,
    modules=(nn.ReLU6, nn.Hardtanh),
    functions=(F.relu6, F.hardtanh, F.hardtanh_, torch.clamp),
    methods=("clamp", "clamp_"),
)
kind(
    "leaky_relu",
    "activation",
    "mask",
    "elementwise",
    flops=2,
    modules=(nn.LeakyReLU,),
    functions=(F.leaky_relu, F.leaky_relu_),
)
kind("hardswish", "activation", "elementwise", flops=4, modules=(nn.Hardswish,), functions=(F.hardswish,))
kind("hardsigmoid", "activation", "elementwise", flops=3, modules=(nn.Hardsigmoid,), functions=(F.hardsigmoid,))
kind("silu", "activation", "elementwise", flops=4, modules=(nn.SiLU,), functions=(F.silu,))
kind("gelu", "activation", "elementwise", flops=8, modules=(nn.GELU,), functions=(F.gelu,))
kind(
    "sigmoid",
    "activation",
    "elementwise",
    flops=4,
    modules=(nn.Sigmoid,),
    functions=(torch.sigmoid, torch.sigmoid_, F.sigmoid),
    methods=("sigmoid", "sigmoid_"),
)
kind(
    "tanh",
    "activation",
    "elementwise",
    flops=4,
    modules=(nn.Tanh,),
    functions=(torch.tanh, torch.tanh_, F.tanh),
    methods=("tanh", "tanh_"),
)
kind("elu", "activation", "elementwise", flops=4, modules=(nn.ELU,), functions=(F.elu, F.elu_))
kind("add", "elementwise", flops=1, functions=(operator.add, operator.iadd, torch.add), methods=("add", "add_"))
kind("sub", "elementwise", flops=1, functions=(operator.sub, operator.isub, torch.sub), methods=("sub", "sub_"))
kind("mul", "elementwise", flops=1, functions=(operator.mul, operator.imul, torch.mul), methods=("mul", "mul_"))
kind("div", "elementwise", flops=1, functions=(operator.truediv, operator.itruediv, torch.div), methods=("div", "div_"))
kind(
    "dropout",
    "elementwise",
    flops=1,
    modules=(nn.Dropout, nn.Dropout1d, nn.Dropout2d),
    functions=(F.dropout,),
    module_attrs=dropout_module,
    call_attrs=dropout_call,
)
kind("softmax", flops=3, modules=(nn.Softmax,), functions=(F.softmax, torch.softmax), methods=("softmax",))
kind("log_softmax", flops=3, modules=(nn.LogSoftmax,), functions=(F.log_softmax,))
kind("maxpool", modules=(nn.MaxPool1d, nn.MaxPool2d), functions=(F.max_pool1d, F.max_pool2d))
kind("avgpool", modules=(nn.AvgPool1d, nn.AvgPool2d), functions=(F.avg_pool1d, F.avg_pool2d))
kind(
    "adaptive_avgpool",
    modules=(nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d),
    functions=(F.adaptive_avg_pool1d, F.adaptive_avg_pool2d),
    call_attrs=lambda node: {"output_size": arg(node, 1, "output_size", None)},
)
kind("adaptive_maxpool", modules=(nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d), functions=(F.adaptive_max_pool2d,))
kind(
    "mean",
    functions=(torch.mean,),
    methods=("mean",),
    call_attrs=lambda node: {"keepdim": node.kwargs.get("keepdim", False)},
)
kind("interpolate", modules=(nn.Upsample,), functions=(F.interpolate,))
# F.unfold (im2col) / F.fold (col2im); Tensor.unfold is a strided view
kind("fold", modules=(nn.Unfold, nn.Fold), functions=(F.unfold, F.fold))
kind("pad", modules=tuple(PAD_MODES), functions=(F.pad,), module_attrs=pad_module, call_attrs=pad_call)
kind("cat", functions=(torch.cat, torch.concat, torch.stack))
kind("cast", kernel=False, functions=(autocast_cast,))  # a cast autocast makes (memplan.graph.autocast)
kind("cross_entropy")  # the loss capture appends (memplan.graph.build)
kind(
    "view",
    "free",
    kernel=False,
    modules=(nn.Flatten,),
    functions=(
        *(torch.unbind, torch.flatten, torch.unflatten, torch.reshape, torch.squeeze, torch.unsqueeze),
        *(torch.transpose, torch.permute, torch.chunk, torch.split),
    ),
    methods=(
        *("view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "permute", "transpose"),
        *("contiguous", "expand", "chunk", "split", "unbind", "unfold"),
    ),
)
kind("identity", "free", kernel=False, modules=(nn.Identity,))
kind("getitem", "free", kernel=False, functions=(operator.getitem,), call_attrs=getitem_call)
kind("meta", "free", kernel=False, functions=(getattr,), methods=("size", "dim"))
kind("param", "free", kernel=False)  # the graph's boundaries and its parameters (memplan.graph.build)
kind("input", "free", kernel=False)
kind("output", "free", kernel=False)

#: kinds whose forward is multiply-accumulate work: FLOPs = 2 x MACs
MAC_KINDS = with_trait("mac")
#: norm kinds (scale = ``weight``, shift = ``bias``)
NORM_KINDS = with_trait("norm")
#: activations whose gradient is a 0/1 mask of the input (1 bit suffices)
MASK_ACTIVATIONS = with_trait("mask")
ACTIVATIONS = with_trait("activation")
#: kinds that carry parameters the strategies can train
PARAM_KINDS = with_trait("param")
#: no computation, no saved tensors (views, shape queries, constants)
FREE_KINDS = with_trait("free")
#: kinds that run no kernel of their own (no workspace to calibrate)
NO_KERNEL = frozenset(n for n, k in KINDS.items() if not k.kernel)
#: elementwise / reduction cost in FLOPs per output element (the "other FLOPs" convention)
ELEMENTWISE_FLOPS: dict[str, int] = {n: k.flops for n, k in KINDS.items() if k.flops is not None}
#: how capture recognises a kind (derived from :data:`KINDS`): module class / function / Tensor method -> kind
MODULE_KINDS: dict[type, str] = {cls: n for n, k in KINDS.items() for cls in k.modules}
FUNCTION_KINDS: dict[object, str] = {f: n for n, k in KINDS.items() for f in k.functions}
METHOD_KINDS: dict[str, str] = {m: n for n, k in KINDS.items() for m in k.methods}
#: functional forms of parametrised ops: target -> (kind, argument names in call order). Their
#: parameters are the ``get_attr`` arguments named ``weight`` / ``bias``; ``addmm(bias, x, w.t())``
#: is a linear layer whose weight is reached through the transpose.
FUNCTIONAL_LAYERS: dict[object, tuple[str, tuple[str, ...]]] = {
    f: (n, k.layer_functions.get(f, k.layer)) for n, k in KINDS.items() if k.layer for f in k.functions
}


def function_name(target: object) -> str:
    """Short printable name of an fx call target (``F.relu`` -> ``relu``, ``operator.add`` -> ``add``,
    a script function -> its name)."""
    if isinstance(target, torch.jit.ScriptFunction):
        return target.name
    return getattr(target, "__name__", None) or str(target)


#: methods a stock module's subclass may override without changing what it computes
SAFE_OVERRIDES = frozenset(
    {
        "__init__",
        "extra_repr",
        "reset_parameters",
        "reset_running_stats",
        "_check_input_dim",
        "__setstate__",
        "_load_from_state_dict",
        "__repr__",
        "_get_name",
    }
)


def stock_kind(cls: type) -> str | None:
    """The kind of a module class whose forward is a known module's own: the first class of its
    MRO in ``MODULE_KINDS``, provided no class before it overrides a method of that module
    (other than ``SAFE_OVERRIDES``) or defines a property. A BatchNorm subclass that applies an
    activation in its ``forward`` is not a batchnorm; it is traced into."""
    mro = cls.__mro__
    for i, base in enumerate(mro):
        if base in MODULE_KINDS:
            for sub in mro[:i]:
                for name, value in vars(sub).items():
                    if isinstance(value, property) or (
                        name not in SAFE_OVERRIDES and callable(value) and hasattr(base, name)
                    ):
                        return None
            return MODULE_KINDS[base]
    return None


def module_kind(m: nn.Module) -> str | None:
    """The op kind of a module memplan knows exactly: the ``memplan_kind`` of memplan's own lean
    module classes, or a module whose ``forward`` is a known stock module's (:func:`stock_kind`) with
    no hooks or forward of its own. None for anything else: such modules are traced into, or
    stay opaque leaves costed by observation."""
    declared = getattr(type(m), "memplan_kind", None)
    if declared is not None and type(m).__module__.startswith("memplan."):
        return declared
    if m._forward_hooks or m._forward_pre_hooks or "forward" in vars(m):
        return None
    return stock_kind(type(m))


def node_kind(gm: fx.GraphModule, node: fx.Node) -> tuple[str, str, nn.Module | None]:
    """(kind, printable target, module) of an fx node."""
    if node.op == "placeholder":
        return "input", "input", None
    if node.op == "output":
        return "output", "output", None
    if node.op == "get_attr":
        return "meta", str(node.target), None
    if node.op == "call_module":
        mod = gm.get_submodule(node.target)
        return module_kind(mod) or "unknown", type(mod).__name__, mod
    if node.op == "call_method":
        return METHOD_KINDS.get(node.target, "unknown"), f"Tensor.{node.target}", None
    kind = FUNCTION_KINDS.get(node.target)
    return kind or "unknown", function_name(node.target), None
