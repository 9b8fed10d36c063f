"""Canonical op kinds: every traced node (module, function or method call) maps to one kind.

Cost rules (FLOPs in ``memplan.costs.flops``, saved tensors in ``memplan.modes``) are
registered per kind, so a model is never special-cased: supporting a new op means adding its
kind here and one rule per registry. Anything that maps to no kind is reported as unknown,
with counts. A module class may declare its own kind with a ``memplan_kind`` class attribute
(memplan's lean modules do); :func:`module_kind` reads it first, so the kind of a module never
depends on what has been imported.
"""

from __future__ import annotations

import operator
import types
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from .attention import SDPA_ARGS
from .autocast import autocast_cast

#: kinds whose forward is multiply-accumulate work: FLOPs = 2 x MACs
MAC_KINDS = frozenset({"conv", "linear", "matmul", "sdpa"})
#: norm kinds (scale = ``weight``, shift = ``bias``)
NORM_KINDS = frozenset({"batchnorm", "groupnorm", "layernorm"})
#: activations whose gradient is a 0/1 mask of the input (1 bit suffices)
MASK_ACTIVATIONS = frozenset({"relu", "hardtanh", "leaky_relu"})
ACTIVATIONS = MASK_ACTIVATIONS | {"hardswish", "hardsigmoid", "silu", "gelu", "sigmoid", "tanh", "elu"}
#: kinds that carry parameters the strategies can train
PARAM_KINDS = frozenset({"conv", "linear"}) | NORM_KINDS
#: no computation, no saved tensors (views, shape queries, constants)
FREE_KINDS = frozenset({"view", "identity", "getitem", "meta", "param", "input", "output"})

#: padding modules and the ``F.pad`` mode each applies
PAD_MODES: dict[type, str] = {
    **{
        cls: "constant"
        for cls in (nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d, nn.ZeroPad1d, nn.ZeroPad2d, nn.ZeroPad3d)
    },
    **{cls: "reflect" for cls in (nn.ReflectionPad1d, nn.ReflectionPad2d, nn.ReflectionPad3d)},
    **{cls: "replicate" for cls in (nn.ReplicationPad1d, nn.ReplicationPad2d, nn.ReplicationPad3d)},
    **{cls: "circular" for cls in (nn.CircularPad1d, nn.CircularPad2d, nn.CircularPad3d)},
}

MODULE_KINDS: dict[type, str] = {
    nn.Conv1d: "conv",
    nn.Conv2d: "conv",
    nn.Conv3d: "conv",
    nn.Linear: "linear",
    nn.BatchNorm1d: "batchnorm",
    nn.BatchNorm2d: "batchnorm",
    nn.BatchNorm3d: "batchnorm",
    nn.GroupNorm: "groupnorm",
    nn.LayerNorm: "layernorm",
    nn.ReLU: "relu",
    nn.ReLU6: "hardtanh",
    nn.Hardtanh: "hardtanh",
    nn.LeakyReLU: "leaky_relu",
    nn.Hardswish: "hardswish",
    nn.Hardsigmoid: "hardsigmoid",
    nn.SiLU: "silu",
    nn.GELU: "gelu",
    nn.Sigmoid: "sigmoid",
    nn.Tanh: "tanh",
    nn.ELU: "elu",
    nn.MaxPool1d: "maxpool",
    nn.MaxPool2d: "maxpool",
    nn.AvgPool1d: "avgpool",
    nn.AvgPool2d: "avgpool",
    nn.AdaptiveAvgPool1d: "adaptive_avgpool",
    nn.AdaptiveAvgPool2d: "adaptive_avgpool",
    nn.AdaptiveMaxPool1d: "adaptive_maxpool",
    nn.AdaptiveMaxPool2d: "adaptive_maxpool",
    nn.Dropout: "dropout",
    nn.Dropout1d: "dropout",
    nn.Dropout2d: "dropout",
    nn.Flatten: "view",
    nn.Unfold: "fold",
    nn.Fold: "fold",
    nn.Identity: "identity",
    nn.Upsample: "interpolate",
    nn.Softmax: "softmax",
    nn.LogSoftmax: "log_softmax",
    **{cls: "pad" for cls in PAD_MODES},
}

FUNCTION_KINDS: dict[object, str] = {
    F.relu: "relu",
    torch.relu: "relu",
    torch.relu_: "relu",
    F.relu_: "relu",
    F.relu6: "hardtanh",
    F.hardtanh: "hardtanh",
    F.hardtanh_: "hardtanh",
    torch.clamp: "hardtanh",
    F.leaky_relu: "leaky_relu",
    F.leaky_relu_: "leaky_relu",
    F.hardswish: "hardswish",
    F.hardsigmoid: "hardsigmoid",
    F.silu: "silu",
    F.gelu: "gelu",
    torch.sigmoid: "sigmoid",
    torch.sigmoid_: "sigmoid",
    F.sigmoid: "sigmoid",
    torch.tanh: "tanh",
    torch.tanh_: "tanh",
    F.tanh: "tanh",
    F.elu: "elu",
    F.elu_: "elu",
    operator.add: "add",
    operator.iadd: "add",
    torch.add: "add",
    operator.sub: "sub",
    operator.isub: "sub",
    torch.sub: "sub",
    operator.mul: "mul",
    operator.imul: "mul",
    torch.mul: "mul",
    operator.truediv: "div",
    operator.itruediv: "div",
    torch.div: "div",
    operator.matmul: "matmul",
    torch.matmul: "matmul",
    torch.mm: "matmul",
    torch.bmm: "matmul",
    torch.cat: "cat",
    torch.concat: "cat",
    torch.stack: "cat",
    torch.unbind: "view",
    torch.flatten: "view",
    torch.unflatten: "view",
    torch.reshape: "view",
    torch.squeeze: "view",
    torch.unsqueeze: "view",
    torch.transpose: "view",
    torch.permute: "view",
    torch.chunk: "view",
    torch.split: "view",
    operator.getitem: "getitem",
    F.adaptive_avg_pool1d: "adaptive_avgpool",
    F.adaptive_avg_pool2d: "adaptive_avgpool",
    F.adaptive_max_pool2d: "adaptive_maxpool",
    F.avg_pool1d: "avgpool",
    F.avg_pool2d: "avgpool",
    F.max_pool1d: "maxpool",
    F.max_pool2d: "maxpool",
    F.interpolate: "interpolate",
    F.unfold: "fold",
    F.fold: "fold",
    F.pad: "pad",
    F.dropout: "dropout",
    torch.mean: "mean",
    F.softmax: "softmax",
    torch.softmax: "softmax",
    F.log_softmax: "log_softmax",
    getattr: "meta",
    autocast_cast: "cast",  # a cast autocast makes (memplan.graph.autocast)
}

METHOD_KINDS: dict[str, str] = {
    "relu": "relu",
    "relu_": "relu",
    "sigmoid": "sigmoid",
    "sigmoid_": "sigmoid",
    "tanh": "tanh",
    "tanh_": "tanh",
    "clamp": "hardtanh",
    "clamp_": "hardtanh",
    "add": "add",
    "add_": "add",
    "sub": "sub",
    "sub_": "sub",
    "mul": "mul",
    "mul_": "mul",
    "div": "div",
    "div_": "div",
    "matmul": "matmul",
    "mean": "mean",
    "view": "view",
    "reshape": "view",
    "flatten": "view",
    "unflatten": "view",
    "squeeze": "view",
    "unsqueeze": "view",
    "permute": "view",
    "transpose": "view",
    "contiguous": "view",
    "expand": "view",
    "chunk": "view",
    "split": "view",
    "unbind": "view",
    "unfold": "view",  # Tensor.unfold(dim, size, step): a strided view (F.unfold is im2col: "fold")
    "softmax": "softmax",
    "size": "meta",
    "dim": "meta",
}

#: elementwise / reduction cost in FLOPs per output element (the "other FLOPs" convention)
ELEMENTWISE_FLOPS: dict[str, int] = {
    "relu": 1,
    "hardtanh": 2,
    "leaky_relu": 2,
    "hardswish": 4,
    "hardsigmoid": 3,
    "silu": 4,
    "gelu": 8,
    "sigmoid": 4,
    "tanh": 4,
    "elu": 4,
    "add": 1,
    "sub": 1,
    "mul": 1,
    "div": 1,
    "softmax": 3,
    "log_softmax": 3,
    "dropout": 1,
}


#: Python functions of torch that compose ops with rules, recorded op by op (``memplan.graph.record``)
#: rather than observed whole: observed on meta, the attention inside would run the math kernel
#: where eager CPU runs the flash one, and the parameters it reads would be no layer's
COMPOSITE_FUNCTIONS: frozenset[object] = frozenset({F.multi_head_attention_forward})


def composite_body(func: Any) -> Any:
    """A function of ``COMPOSITE_FUNCTIONS`` without its ``__torch_function__`` dispatch: a copy
    whose ``has_torch_function`` is false, so that under a ``TorchFunctionMode`` (entered again
    by its handler) its body runs and the mode sees the calls it makes one by one."""
    glob = {**func.__globals__, "has_torch_function": lambda *_: False}
    body = types.FunctionType(func.__code__, glob, func.__name__, func.__defaults__, func.__closure__)
    body.__kwdefaults__ = func.__kwdefaults__
    return body


def is_composite_module(m: nn.Module) -> bool:
    """A stock ``torch.nn`` module built of other modules (``nn.MultiheadAttention``, the
    ``nn.Transformer`` layers): captured through its parts, which have rules and whose
    parameters the strategies train, never as one opaque node."""
    return type(m).__module__.startswith("torch.nn.modules.") and any(True for _ in m.children())


def function_name(target: object) -> str:
    """Short printable name of an fx call target (``F.relu`` -> ``relu``, ``operator.add`` -> ``add``,
    a script function -> its name)."""
    if isinstance(target, torch.jit.ScriptFunction):
        return target.name
    return getattr(target, "__name__", None) or str(target)


#: functional forms of parametrised ops: target -> (kind, argument names in call order). Their
#: parameters are the ``get_attr`` arguments named ``weight`` / ``bias``; ``addmm(bias, x, w.t())``
#: is a linear layer whose weight is reached through the transpose.
FUNCTIONAL_LAYERS: dict[object, tuple[str, tuple[str, ...]]] = {
    **{
        f: ("conv", ("input", "weight", "bias", "stride", "padding", "dilation", "groups"))
        for f in (F.conv1d, F.conv2d, F.conv3d)
    },
    F.linear: ("linear", ("input", "weight", "bias")),
    torch.addmm: ("linear", ("bias", "input", "weight")),
    F.batch_norm: (
        "batchnorm",
        ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"),
    ),
    F.layer_norm: ("layernorm", ("input", "normalized_shape", "weight", "bias", "eps")),
    F.group_norm: ("groupnorm", ("input", "num_groups", "weight", "bias", "eps")),
    F.scaled_dot_product_attention: ("sdpa", SDPA_ARGS),
}
FUNCTION_KINDS.update({f: kind for f, (kind, _) in FUNCTIONAL_LAYERS.items()})

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
