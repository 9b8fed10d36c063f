"""What capture records of one call, per op kind: the attribute readers that the kinds' entries
name (``memplan.graph.kinds.Kind.module_attrs`` / ``call_attrs`` / ``layer_attrs``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

Attrs = dict[str, Any]

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


def arg(node: fx.Node, at: int, name: str, default: Any) -> Any:
    """Argument ``name`` of a call, given at position ``at`` or by keyword."""
    return node.args[at] if len(node.args) > at else node.kwargs.get(name, default)


def per_dim(value: Any, nd: int) -> tuple:
    return tuple(value) if isinstance(value, (list, tuple)) else (value,) * nd


def conv_layer(args: dict[str, Any]) -> Attrs:
    w = args["weight"]
    nd = len(w.shape) - 2
    padding = args.get("padding", 0)
    return dict(
        kernel_size=tuple(w.shape[2:]),
        stride=per_dim(args.get("stride", 1), nd),
        padding=padding if isinstance(padding, str) else per_dim(padding, nd),
        dilation=per_dim(args.get("dilation", 1), nd),
        groups=int(args.get("groups", 1)),
        padding_mode="zeros",
        weight_shape=tuple(w.shape),
    )


def layernorm_layer(args: dict[str, Any]) -> Attrs:
    shape = args["normalized_shape"]
    return {"normalized_shape": tuple(shape) if isinstance(shape, (list, tuple)) else (shape,)}


def sequence_index_bytes(index: Any) -> tuple[int, ...]:
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


def getitem_call(node: fx.Node) -> Attrs:
    return {"sequence_index_bytes": sequence_index_bytes(node.args[1])} if len(node.args) > 1 else {}


def dropout_module(mod: nn.Module) -> Attrs:
    # captured in train mode, unless traced under the model's own flags
    return {"training": mod.training, "feature": isinstance(mod, (nn.Dropout1d, nn.Dropout2d, nn.Dropout3d))}


def dropout_call(node: fx.Node) -> Attrs:
    return {"p": arg(node, 1, "p", 0.5), "training": arg(node, 2, "training", True), "feature": False}


def pad_module(mod: nn.Module) -> Attrs:
    """The ``F.pad`` mode of a padding module."""
    return {"mode": next((PAD_MODES[c] for c in type(mod).__mro__ if c in PAD_MODES), None)}


def pad_call(node: fx.Node) -> Attrs:
    """The mode of an ``F.pad(x, pad, mode, value)`` call."""
    return {"mode": arg(node, 2, "mode", "constant")}


def pad_mode(node: fx.Node, mod: nn.Module | None) -> str | None:
    """The ``F.pad`` mode of a padding module or of an ``F.pad`` call."""
    return (pad_module(mod) if mod is not None else pad_call(node))["mode"]
