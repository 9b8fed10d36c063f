"""What capture records about one call: its bound arguments, a module's or a functional layer's
attributes (kernel, stride, groups, eps, ...), and the qualified name of the parameter an operand is
read from (through views, slices and copies)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from .autocast import autocast_cast
from .kinds import function_name


def _call_args(node: fx.Node, names: Sequence[str]) -> dict[str, Any]:
    """The call's arguments by name (positional ones matched to ``names``)."""
    bound = dict(zip(names, node.args))
    bound.update(node.kwargs)
    return bound


def _module_attrs(mod: nn.Module, kind: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for key in (
        "kernel_size",
        "stride",
        "padding",
        "dilation",
        "groups",
        "inplace",
        "output_size",
        "p",
        "padding_mode",
        "num_groups",
        "normalized_shape",
    ):
        if hasattr(mod, key):
            attrs[key] = getattr(mod, key)
    if kind == "conv":
        attrs["weight_shape"] = tuple(mod.weight.shape)
    if kind == "batchnorm":
        attrs["running_stats"] = getattr(mod, "running_mean", None) is not None
    if kind == "dropout":
        attrs["training"] = mod.training  # captured in train mode, unless traced under the model's own flags
        attrs["feature"] = isinstance(mod, (nn.Dropout1d, nn.Dropout2d, nn.Dropout3d))
    return attrs


def _functional_attrs(kind: str, args: dict[str, Any]) -> dict[str, Any]:
    """Attributes of a functional layer call (``ops.FUNCTIONAL_LAYERS``), as a module would have them."""
    attrs: dict[str, Any] = {}
    if kind == "conv":
        w = args["weight"]
        nd = len(w.shape) - 2
        tup = lambda v: tuple(v) if isinstance(v, (list, tuple)) else (v,) * nd  # noqa: E731
        attrs.update(
            kernel_size=tuple(w.shape[2:]),
            stride=tup(args.get("stride", 1)),
            padding=args.get("padding", 0) if isinstance(args.get("padding", 0), str) else tup(args.get("padding", 0)),
            dilation=tup(args.get("dilation", 1)),
            groups=int(args.get("groups", 1)),
            padding_mode="zeros",
            weight_shape=tuple(w.shape),
        )
    elif kind == "batchnorm":
        attrs["running_stats"] = args.get("running_mean") is not None
    elif kind == "groupnorm":
        attrs["num_groups"] = args["num_groups"]
    elif kind == "sdpa":
        attrs.update(
            {
                k: args.get(k, d)
                for k, d in (("dropout_p", 0.0), ("is_causal", False), ("scale", None), ("enable_gqa", False))
            }
        )
    elif kind == "layernorm":
        shape = args["normalized_shape"]
        attrs["normalized_shape"] = tuple(shape) if isinstance(shape, (list, tuple)) else (shape,)
    return attrs


def _call_attrs(node: fx.Node, kind: str) -> dict[str, Any]:
    """Attributes of a function / method call read from its arguments."""
    attrs: dict[str, Any] = {}
    fn = node.target if isinstance(node.target, str) else function_name(node.target)
    attrs["inplace"] = (
        bool(node.kwargs.get("inplace", False))
        or fn.endswith("_")
        or (fn.startswith("i") and kind in {"add", "sub", "mul"})
    )
    if kind == "adaptive_avgpool":
        attrs["output_size"] = node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size")
    if kind == "dropout":
        attrs["p"] = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
        attrs["training"] = node.args[2] if len(node.args) > 2 else node.kwargs.get("training", True)
        attrs["feature"] = False
    if kind == "mean":
        attrs["keepdim"] = node.kwargs.get("keepdim", False)
    if kind == "getitem" and len(node.args) > 1:
        attrs["sequence_index_bytes"] = _sequence_index_bytes(node.args[1])
    return attrs


def _sequence_index_bytes(index: Any) -> tuple[int, ...]:
    """Bytes of the index tensor PyTorch makes, at each call, of each Python sequence of ints or
    bools in a subscript (``x[:, [2, 0, 1]]``: int64; ``x[:, [True, False]]``: bool). A tuple subscript
    holds one index per dim; a list subscript is one sequence index."""
    out = []
    for item in index if isinstance(index, tuple) else (index,):
        if not isinstance(item, (list, tuple)):
            continue
        try:
            t = torch.tensor(item)
        except (TypeError, ValueError, RuntimeError):  # slices, tensors or proxies inside: not one index
            continue
        if t.dtype in (torch.int64, torch.bool):
            out.append(t.numel() * t.element_size())
    return tuple(out)


def _param_source(node: Any, gm: fx.GraphModule) -> str | None:
    """Qualified name of the parameter an argument is, directly or through a transpose / view
    (``w.t()`` in ``addmm``); None when it is not a parameter."""
    seen = 0
    while isinstance(node, fx.Node) and seen < 4:
        if node.op == "get_attr":
            try:
                gm.get_parameter(str(node.target))
            except AttributeError:
                return None
            return str(node.target)
        if (
            node.op == "call_method"
            and node.target in ("t", "transpose", "permute", "view", "reshape")
            or (node.op == "call_function" and node.target in (torch.t, torch.transpose, autocast_cast))
        ):
            node = node.args[0]
            seen += 1
            continue
        return None
    return None
