"""Graph capture: trace a model and propagate an input shape on the meta device (no real
compute: batch 256 at 224 px costs the same as batch 1) into a :class:`LayerGraph`.

Storage ids come from the meta tensors themselves, so views (flatten, slicing) and in-place
ops (``relu_``) are recognised as sharing memory without a hand-written list.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch
import torch.fx as fx
import torch.nn as nn

from ..errors import MemplanError
from .blocks import _assign_blocks, find_blocks
from .kinds import function_name, node_kind
from .layout import _flatten, _MetaRunner, _pad_mode
from .model import LayerGraph, Node, Param, TensorInfo
from .trace import trace


def _attrs(node: fx.Node, kind: str, mod: nn.Module | None) -> dict[str, Any]:
    """Op attributes the cost rules need, read from the module or the call's arguments."""
    attrs: dict[str, Any] = {}
    if mod is not None:
        for key in ("kernel_size", "stride", "padding", "dilation", "groups", "inplace", "output_size", "p"):
            if hasattr(mod, key):
                attrs[key] = getattr(mod, key)
    else:
        fn = node.target if isinstance(node.target, str) else function_name(node.target)
        attrs["inplace"] = bool(node.kwargs.get("inplace", False)) or fn.endswith("_") or (
            fn.startswith("i") and kind in {"add", "sub", "mul"}
        )
        if kind == "adaptive_avgpool":
            attrs["output_size"] = node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size")
        if kind == "dropout":
            attrs["p"] = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
            attrs["training"] = node.args[2] if len(node.args) > 2 else node.kwargs.get("training", True)
        if kind == "mean":
            attrs["keepdim"] = node.kwargs.get("keepdim", False)
    if kind == "pad":
        attrs["mode"] = _pad_mode(node, mod)
    return attrs


def capture(
    model: nn.Module,
    input_shape: Sequence[int],
    *,
    leaf_modules: Iterable[str | type] = (),
    block_names: Sequence[str] | None = None,
    dtype: torch.dtype = torch.float32,
    name: str = "model",
    gm: fx.GraphModule | None = None,
) -> LayerGraph:
    """Trace ``model`` and propagate an input of ``input_shape`` (batch first) on meta.

    A cross-entropy loss node over the (batch, classes) logits is appended, since every
    training step has one. ``gm`` reuses an earlier trace of the same model.
    """
    gm = gm if gm is not None else trace(model, leaf_modules, name)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise MemplanError(f"{name} takes {len(placeholders)} inputs; memplan profiles models with one input tensor")
    runner = _MetaRunner(gm)
    x = torch.empty(tuple(input_shape), dtype=dtype, device="meta")
    try:
        runner.run(x)
    except MemplanError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise MemplanError(f"{name} fails on input shape {tuple(input_shape)}: {first}",
                           "check --resolution / the model's expected input") from None

    storage_ids: dict[int, int] = {}
    storages: list[int] = []
    param_storages: set[int] = set()

    def info(t: torch.Tensor, is_param: bool = False) -> TensorInfo:
        key = t.untyped_storage()._cdata
        if key not in storage_ids:
            storage_ids[key] = len(storages)
            storages.append(t.untyped_storage().nbytes())
        sid = storage_ids[key]
        if is_param:
            param_storages.add(sid)
        return TensorInfo(tuple(t.shape), t.dtype, sid, tuple(t.stride()))

    # parameters and buffers first, so an op that returns one (rare) is not mistaken for activations
    for state in runner._meta_cache.values():
        for t in state.values():
            info(t, is_param=True)

    fx_index: dict[fx.Node, int] = {}
    seen_params: set[int] = set()
    seen_modules: set[str] = set()
    nodes: list[Node] = []
    for fxn in gm.graph.nodes:
        kind, target, mod = node_kind(gm, fxn)
        value = runner.env.get(fxn)
        if fxn.op == "output":
            value = runner.env[fxn.args[0]] if isinstance(fxn.args[0], fx.Node) else None
            if not isinstance(value, torch.Tensor):
                raise MemplanError(f"{name} returns {type(fxn.args[0]).__name__} output, not a tensor",
                                   "memplan needs a model whose forward returns the logits tensor")
        outs = tuple(info(t, is_param=(fxn.op == "get_attr")) for t in _flatten(value) if isinstance(t, torch.Tensor))
        inputs: list[int] = []
        in_tensors: list[TensorInfo] = []
        for a in _flatten((fxn.args, fxn.kwargs)):
            if isinstance(a, fx.Node) and a in fx_index:
                src = nodes[fx_index[a]]
                val = runner.env.get(a)
                if isinstance(val, torch.Tensor):
                    inputs.append(src.index)
                    in_tensors.append(src.outs[0])
                elif isinstance(val, (tuple, list)) and src.outs:  # tuple producers (chunk/split)
                    inputs.append(src.index)
                    in_tensors.append(src.outs[0])
        layer_name = fxn.name
        params: dict[str, Param] = {}
        if mod is not None:
            if fxn.target not in seen_modules:
                layer_name = str(fxn.target)
                seen_modules.add(str(fxn.target))
            for pname, p in mod.named_parameters(recurse=True):
                if id(p) not in seen_params:
                    seen_params.add(id(p))
                    params[pname] = Param(f"{fxn.target}.{pname}", tuple(p.shape), p.dtype)
        attrs = _attrs(fxn, kind, mod)
        if fxn.op == "get_attr":  # a parameter used functionally: it trains with its module
            owner, _, pname = str(fxn.target).rpartition(".")
            attrs["param_of"] = (owner, pname)
        stack = fxn.meta.get("nn_module_stack") or {}
        scopes = tuple(str(v[0]) for v in stack.values())
        if fxn.op == "call_module" and (not scopes or scopes[-1] != str(fxn.target)):
            scopes += (str(fxn.target),)
        scope = scopes[-1] if scopes else ""
        fx_index[fxn] = len(nodes)
        nodes.append(Node(
            index=len(nodes), name=layer_name, op=fxn.op, kind=kind, target=target,
            inputs=inputs, in_tensors=in_tensors, outs=outs, module=mod, params=params,
            attrs=attrs, scope=scope, scopes=scopes,
        ))

    logits = nodes[-1].in_tensors[0] if nodes[-1].in_tensors else None
    if logits is None or len(logits.shape) != 2:
        shape = logits.shape if logits is not None else None
        raise MemplanError(f"{name} output has shape {shape}; expected (batch, classes) logits")
    # loss: cross-entropy over the logits with int64 class targets
    target = TensorInfo((logits.shape[0],), torch.int64, len(storages))
    storages.append(target.nbytes)
    loss_out = TensorInfo((), logits.dtype, len(storages))
    storages.append(loss_out.nbytes)
    out_node = nodes[-1]
    nodes.insert(len(nodes) - 1, Node(
        index=len(nodes) - 1, name="loss", op="call_function", kind="cross_entropy", target="cross_entropy",
        inputs=[out_node.inputs[0]], in_tensors=[logits], outs=(loss_out,), attrs={"target": target},
    ))
    out_node.index = len(nodes) - 1
    out_node.inputs, out_node.in_tensors = [len(nodes) - 2], [loss_out]

    blocks = list(block_names) if block_names is not None else find_blocks(model)
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    graph = LayerGraph(nodes, storages, frozenset(param_storages), [], tuple(input_shape), int(input_shape[0]), name,
                       buffer_bytes)
    _assign_blocks(graph, blocks, explicit=block_names is not None)
    return graph
