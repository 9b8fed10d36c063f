"""Mixed precision (``torch.autocast`` on the CPU) made explicit in a captured graph.

Autocast changes dtypes inside the dispatcher, which meta tensors never reach (they are not CPU
tensors), so capture records instead *where* autocast was on: the tracer and the recorder mark
every node created while ``torch.is_autocast_enabled("cpu")`` (:func:`mark`: the autocast dtype
and the region, one per entry into autocast), whether the autocast is the caller's (``--amp``,
the capture runs inside it) or the model's own (``with torch.autocast(...)`` in ``forward``).
:func:`make_explicit` then writes the casts autocast would make as nodes of the graph
(:func:`autocast_cast`, kind ``cast``), so that shape propagation on meta gives every tensor the
dtype autocast produces and the cost rules count saved tensors in it:

* ops on CPU autocast's lower-precision list (conv, linear, matmul / mm / bmm / addmm / baddbmm,
  scaled dot-product attention, ``prelu``, transposed convs): every floating operand is cast to
  the autocast dtype; a module call of a conv or linear layer becomes its functional form
  (``F.conv2d(x, weight, bias, ...)``), as its ``forward`` runs it, so that the weight's cast is a
  node too;
* ops on its fp32 list that memplan costs by rule (reflect / replicate padding): lower-precision
  operands are cast to float32 (the cross-entropy loss: ``memplan.graph.build``);
* a parameter's cast is made once per autocast region and shared by its uses (autocast's weight
  cast cache: a float32 leaf that requires grad), so a low-precision weight copy that an op saves
  is counted once; an activation is cast at every use, as autocast does.

Facts of torch 2.13's CPU autocast (``aten/src/ATen/autocast_mode.cpp``), checked against real
CPU steps under ``saved_tensors_hooks`` by tests/test_amp.py.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

#: the ``--amp`` names and the autocast dtype of each
AMP_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: key of an fx node's meta holding (autocast dtype, region) where it was created under autocast
AMP_META = "memplan_autocast"

#: calls on CPU autocast's lower-precision list (functions, and Tensor methods by name)
LOWER_FUNCTIONS: frozenset[object] = frozenset(
    {
        F.conv1d,
        F.conv2d,
        F.conv3d,
        F.conv_transpose1d,
        F.conv_transpose2d,
        F.conv_transpose3d,
        F.linear,
        F.prelu,
        F.scaled_dot_product_attention,
        torch.matmul,
        operator.matmul,
        torch.mm,
        torch.bmm,
        torch.addmm,
        torch.baddbmm,
        torch.addbmm,
    }
)
LOWER_METHODS = frozenset({"matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "__matmul__"})
#: the layers whose module calls become their functional form under autocast (their ``forward``, unchanged)
STOCK_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
#: pad modes whose kernels are on CPU autocast's float32 list
FP32_PAD_MODES = frozenset({"reflect", "replicate"})


def autocast_cast(x: Any, dtype: torch.dtype) -> Any:
    """What autocast does to one operand of an op it casts: a floating tensor other than float64
    and ``dtype`` becomes a copy in ``dtype``; anything else is returned as it is."""
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype not in (torch.float64, dtype):
        return x.to(dtype)
    return x


def cast_operands(func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The operands of a torch call as CPU autocast (when on) would cast them, for the recorder's eager
    run on meta (``memplan.graph.record``): so that what the model reads from a tensor (``x.dtype``
    in ``torch.rand(..., dtype=x.dtype)``) is what it reads under autocast."""
    if not torch.is_autocast_enabled("cpu"):
        return args, kwargs
    to = _call_policy(func, args, kwargs, torch.get_autocast_dtype("cpu"))
    if to is None:
        return args, kwargs
    cast = lambda v: autocast_cast(v, to)  # noqa: E731
    return fx.node.map_aggregate(args, cast), fx.node.map_aggregate(kwargs, cast)


def _call_policy(func: Any, args: tuple, kwargs: dict, low: torch.dtype) -> torch.dtype | None:
    """The dtype autocast casts the operands of a torch call (a function or a Tensor method) to:
    ``low`` on its lower-precision list, float32 on its float32 list, None elsewhere."""
    name = getattr(func, "__name__", "")
    if func in LOWER_FUNCTIONS or (name in LOWER_METHODS and getattr(torch.Tensor, name, None) is func):
        return low
    if func is F.pad and kwargs.get("mode", args[2] if len(args) > 2 else "constant") in FP32_PAD_MODES:
        return torch.float32
    return None


class Regions:
    """Numbers the autocast regions met while a graph is built (a new one at each entry)."""

    def __init__(self) -> None:
        self.count = 0
        self.inside = False

    def mark(self, node: fx.Node) -> None:
        """Record on ``node`` the CPU autocast dtype and region in force now (nothing outside autocast)."""
        enabled = torch.is_autocast_enabled("cpu")
        if enabled and not self.inside:
            self.count += 1
        self.inside = enabled
        if enabled:
            node.meta[AMP_META] = (torch.get_autocast_dtype("cpu"), self.count)


def _policy(gm: fx.GraphModule, node: fx.Node, low: torch.dtype) -> torch.dtype | None:
    """The dtype autocast casts ``node``'s operands to, or None where it leaves them."""
    if node.op == "call_module":
        return low if _stock_layer(gm.get_submodule(str(node.target))) else None
    if node.op == "call_method":
        return _call_policy(getattr(torch.Tensor, str(node.target), None), node.args, node.kwargs, low)
    if node.op == "call_function":
        return _call_policy(node.target, node.args, node.kwargs, low)
    return None


def _stock_layer(mod: nn.Module) -> bool:
    """A linear / conv module (a subclass too) that runs the stock ``forward``, without hooks."""
    forwards = {cls.forward for cls in STOCK_LAYERS}
    plain = not (mod._forward_hooks or mod._forward_pre_hooks) and "forward" not in vars(mod)
    return isinstance(mod, STOCK_LAYERS) and type(mod).forward in forwards and plain


def _functional(gm: fx.GraphModule, node: fx.Node) -> list[fx.Node]:
    """Replace the call of a stock conv / linear module by what its ``forward`` runs (the weight and
    bias read as ``get_attr`` nodes), in the module's scope; returns the calls made (a padding
    first for a conv whose padding_mode is not zeros)."""
    qual = str(node.target)
    mod = gm.get_submodule(qual)
    graph = gm.graph
    stack = {**(node.meta.get("nn_module_stack") or {}), qual: (qual, type(mod))}
    made: list[fx.Node] = []
    with graph.inserting_before(node):
        w = graph.get_attr(f"{qual}.weight")
        b = graph.get_attr(f"{qual}.bias") if mod.bias is not None else None
        made += [w] + ([b] if b is not None else [])
        x = node.args[0]
        if isinstance(mod, nn.Linear):
            call = graph.call_function(F.linear, (x, w, b))
        else:
            conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[len(mod.kernel_size)]
            padding = mod.padding
            if mod.padding_mode != "zeros":
                x = graph.call_function(F.pad, (x, mod._reversed_padding_repeated_twice), {"mode": mod.padding_mode})
                made.append(x)
                padding = 0
            call = graph.call_function(conv, (x, w, b, mod.stride, padding, mod.dilation, mod.groups))
        made.append(call)
    for n in made:
        n.meta.update({k: v for k, v in node.meta.items() if k != "nn_module_stack"}, nn_module_stack=stack)
    node.replace_all_uses_with(call)
    graph.erase_node(node)
    return [n for n in made if n.op == "call_function"]


class _Casts:
    """Inserts the cast nodes of one graph; parameters' casts are shared per region (the cache)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.params = {q for q, _ in gm.named_parameters(remove_duplicate=False)}
        self.cache: dict[tuple[int, str, torch.dtype], fx.Node] = {}

    def cast(self, arg: fx.Node, dtype: torch.dtype, user: fx.Node) -> fx.Node:
        """The cast of ``arg`` to ``dtype`` for ``user`` (inserted just before it)."""
        _, region = user.meta[AMP_META]
        key = (region, str(arg.target), dtype)
        cached = arg.op == "get_attr" and str(arg.target) in self.params and dtype != torch.float32
        if cached and key in self.cache:
            return self.cache[key]
        graph, short = self.gm.graph, str(dtype).removeprefix("torch.")
        with graph.inserting_before(user):
            node = graph.create_node("call_function", autocast_cast, (arg, dtype), name=f"{arg.name}_to_{short}")
        node.meta.update(user.meta)
        if cached:
            self.cache[key] = node
        return node

    def apply(self, node: fx.Node, dtype: torch.dtype) -> None:
        """Cast every operand of ``node`` to ``dtype``."""
        fn = lambda a: self.cast(a, dtype, node)  # noqa: E731
        node.args = fx.node.map_arg(node.args, fn)
        node.kwargs = fx.node.map_arg(node.kwargs, fn)


def make_explicit(gm: fx.GraphModule) -> dict[fx.Node, fx.Node]:
    """Write the casts of every autocast region of ``gm`` (nodes marked by :class:`Regions`) as
    nodes, in place (a graph without autocast is left as it is). Returns the module calls replaced
    by their functional form (:func:`_functional`), each with the call now in its place."""
    casts = _Casts(gm)
    found = False
    replaced: dict[fx.Node, fx.Node] = {}  # module call -> the call of its functional form
    for node in list(gm.graph.nodes):
        state = node.meta.get(AMP_META)
        if state is None:
            continue
        found = True
        dtype = _policy(gm, node, state[0])
        if dtype is None:
            continue
        calls = [node]
        if node.op == "call_module":
            calls = _functional(gm, node)
            replaced[node] = calls[-1]
        for call in calls:
            to = _policy(gm, call, state[0])
            if to is not None:
                casts.apply(call, to)
    if found:
        gm.graph.lint()
        gm.recompile()
    return replaced


def amp_label(step: torch.dtype | None, casts: bool) -> str | None:
    """How a profile says its step runs autocast: ``bf16`` / ``fp16`` for the step's (``--amp``),
    ``in forward`` where only the model autocasts (its graph has casts), None for neither."""
    if step is not None:
        return next(name for name, dtype in AMP_DTYPES.items() if dtype == step)
    return "in forward" if casts else None
