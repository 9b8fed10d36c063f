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
from .kinds import KINDS, function_name

#: kinds whose ``operator.i*`` form (``x += y``) writes into its first operand
INPLACE = frozenset({"add", "sub", "mul"})


def _call_args(node: fx.Node, names: Sequence[str]) -> dict[str, Any]:
    """The call's arguments by name (positional ones matched to ``names``)."""
    bound = dict(zip(names, node.args))
    bound.update(node.kwargs)
    return bound


#: attributes of a module that every kind records where the module has them (a kind's own: its
#: ``Kind.module_attrs``)
MODULE_ATTRS = (
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
)


def _module_attrs(mod: nn.Module, kind: str) -> dict[str, Any]:
    attrs = {key: getattr(mod, key) for key in MODULE_ATTRS if hasattr(mod, key)}
    entry = KINDS.get(kind)
    if entry is not None and entry.module_attrs is not None:
        attrs.update(entry.module_attrs(mod))
    return attrs


def _functional_attrs(kind: str, args: dict[str, Any]) -> dict[str, Any]:
    """Attributes of a functional layer call (``kinds.FUNCTIONAL_LAYERS``), as a module would have them."""
    read = KINDS[kind].layer_attrs
    return read(args) if read is not None else {}


def _call_attrs(node: fx.Node, kind: str) -> dict[str, Any]:
    """Attributes of a function / method call read from its arguments."""
    fn = node.target if isinstance(node.target, str) else function_name(node.target)
    inplace = bool(node.kwargs.get("inplace", False)) or fn.endswith("_") or (fn.startswith("i") and kind in INPLACE)
    attrs: dict[str, Any] = {"inplace": inplace}
    entry = KINDS.get(kind)
    if entry is not None and entry.call_attrs is not None:
        attrs.update(entry.call_attrs(node))
    return attrs


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
