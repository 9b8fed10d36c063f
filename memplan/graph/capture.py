"""Graph capture: trace a model and propagate an input shape on the meta device (no real
compute: batch 256 at 224 px costs the same as batch 1) into a :class:`LayerGraph`.

Capture is symbolic (:mod:`.trace`) where it can be, and otherwise records one eager run on
meta tensors (:mod:`.record`). Storage ids come from the meta tensors themselves, so views
(flatten, slicing) and in-place ops (``relu_``) are recognised as sharing memory without a
hand-written list. Functional layers (``F.conv2d(x, self.weight)``, ``F.batch_norm``,
``F.linear``, ``addmm``, ...) are layers like modules: their parameters are found by qualified
name and the layer is named after the module owning them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from ..errors import MemplanError, TraceFailure
from .attrs import _call_args, _call_attrs, _functional_attrs, _module_attrs, _param_source
from .blocks import _assign_blocks, find_blocks
from .kinds import FUNCTIONAL_LAYERS
from .layout import _MetaRunner, _pad_mode, flatten
from .model import LayerGraph, Node, Param, TensorInfo, role
from .record import record
from .trace import trace


@contextmanager
def train_mode(model: nn.Module) -> Iterator[None]:
    """Every module in train mode (what a training step runs), flags restored on exit."""
    flags = [(m, m.training) for m in model.modules()]
    model.train()
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


def select_output(value: Any, output: str | int | None, name: str) -> tuple[Any, str]:
    """(the logits tensor, its path) of a model output: the tensor itself, the first tensor of a
    tuple / list / dict / namedtuple, or the one named by ``output`` (key, field or index)."""
    if output is not None:
        try:
            if isinstance(value, dict):
                picked = value[output]
            elif hasattr(value, "_fields") and isinstance(output, str):
                picked = getattr(value, output)
            else:
                picked = value[int(output)]
        except (KeyError, IndexError, ValueError, AttributeError, TypeError):
            raise MemplanError(
                f"{name} output has no entry {output!r}",
                "name a key / field / index of the model's output with --output",
            ) from None
        return picked, str(output)
    if isinstance(value, torch.Tensor) or isinstance(value, fx.Node):
        return value, ""
    items = (
        list(value.items())
        if isinstance(value, dict)
        else list(zip(value._fields, value) if hasattr(value, "_fields") else enumerate(value))
        if isinstance(value, (tuple, list))
        else []
    )
    for key, v in items:
        if isinstance(v, (torch.Tensor, fx.Node)):
            return v, str(key)
    raise MemplanError(
        f"{name} returns {type(value).__name__} output without a tensor",
        "memplan needs a model whose forward returns the logits (or a structure holding them)",
    )


def capture(
    model: nn.Module,
    input_shape: Sequence[int],
    *,
    leaf_modules: Iterable[str | type] = (),
    block_names: Sequence[str] | None = None,
    dtype: torch.dtype = torch.float32,
    name: str = "model",
    gm: fx.GraphModule | None = None,
    output: str | int | None = None,
) -> LayerGraph:
    """Trace ``model`` and propagate an input of ``input_shape`` (batch first) on meta.

    Capture is symbolic (``torch.fx``) where it can be, and otherwise records one eager run on
    meta tensors (``memplan.record``: shape-dependent control flow, iteration over tensors);
    ``LayerGraph.capture`` says which. The model runs in train mode (flags restored after).
    A cross-entropy loss node over the (batch, classes) logits is appended, since every training
    step has one; it takes the model's output, or for a tuple / dict / namedtuple output its
    first tensor or the entry named by ``output``. ``gm`` reuses an earlier trace of the model.
    """
    x = torch.empty(tuple(input_shape), dtype=dtype, device="meta")
    how = "symbolic"
    with train_mode(model):
        if gm is None:
            try:
                gm = trace(model, leaf_modules, name)
            except TraceFailure:
                gm = record(model, x, leaf_modules, name)
                how = "recorded"
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != 1:
            raise MemplanError(
                f"{name} takes {len(placeholders)} inputs; memplan profiles models with one input tensor"
            )
        runner = _MetaRunner(gm)
        try:
            runner.run(x)
        except MemplanError:
            raise
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise MemplanError(
                f"{name} fails on input shape {tuple(input_shape)}: {first}",
                "check --resolution / the model's expected input",
            ) from None
        graph = _build(gm, runner, model, tuple(input_shape), name, output)
    graph.capture = how
    blocks = list(block_names) if block_names is not None else find_blocks(model)
    _assign_blocks(graph, blocks, explicit=block_names is not None)
    return graph


def _build(
    gm: fx.GraphModule,
    runner: _MetaRunner,
    model: nn.Module,
    input_shape: tuple[int, ...],
    name: str,
    output: str | int | None,
) -> LayerGraph:
    """The LayerGraph of a traced and meta-propagated GraphModule (loss node appended)."""
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

    params_of = dict(model.named_parameters())
    fx_index: dict[fx.Node, int] = {}
    seen_params: set[str] = set()
    layer_names: set[str] = set()
    claimed: dict[str, str] = {}  # parameter qualname -> layer that claims it (a functional layer)
    nodes: list[Node] = []
    out_path = ""
    for fxn in gm.graph.nodes:
        kind, target, mod = runner.kinds[fxn]
        value = runner.env.get(fxn)
        if fxn.op == "output":
            value, out_path = select_output(
                runner.env[fxn.args[0]]
                if isinstance(fxn.args[0], fx.Node)
                else fx.node.map_arg(fxn.args[0], lambda a: runner.env[a]),
                output,
                name,
            )
            if not isinstance(value, torch.Tensor):
                raise MemplanError(
                    f"{name} output {out_path or ''} is not a tensor".replace("  ", " "),
                    "memplan needs the logits tensor",
                )
        outs = tuple(info(t, is_param=(fxn.op == "get_attr")) for t in flatten(value) if isinstance(t, torch.Tensor))
        if kind == "unknown" and not outs and fxn.op in ("call_function", "call_method"):
            kind = "meta"  # Python values only (shape arithmetic: c // heads): nothing autograd could keep
        inputs: list[int] = []
        in_tensors: list[TensorInfo] = []
        in_fx: list[fx.Node] = []
        if fxn.op == "output":  # the node that produced the logits tensor (through a namedtuple node, say)
            sources = [n for n, v in runner.env.items() if v is value and n.op != "output"][-1:]
        else:
            sources = flatten((fxn.args, fxn.kwargs))
        for a in sources:
            if isinstance(a, fx.Node) and a in fx_index:
                src = nodes[fx_index[a]]
                val = runner.env.get(a)
                if isinstance(val, torch.Tensor) or (isinstance(val, (tuple, list)) and src.outs):
                    inputs.append(src.index)  # tuple producers (chunk / split): their first tensor
                    in_tensors.append(src.outs[0])
                    in_fx.append(a)
        layer = ""
        params: dict[str, Param] = {}
        uses: dict[str, str] = {}
        attrs: dict[str, Any] = {}
        if mod is not None:
            layer = str(fxn.target)
            attrs = _module_attrs(mod, kind)
            for pname, p in mod.named_parameters(recurse=True):
                qual = f"{fxn.target}.{pname}"
                uses[pname] = qual
                claimed.setdefault(qual, layer)
                if qual not in seen_params:
                    seen_params.add(qual)
                    params[pname] = Param(qual, tuple(p.shape), p.dtype)
        elif fxn.op in ("call_function", "call_method"):
            attrs = _call_attrs(fxn, kind)
            layout = FUNCTIONAL_LAYERS.get(fxn.target) if fxn.op == "call_function" else None
            if layout is not None:
                lkind, argnames = layout
                args = _call_args(fxn, argnames)
                values = {k: fx.node.map_arg(v, lambda a: runner.env[a]) for k, v in args.items()}
                attrs.update(_functional_attrs(lkind, values))
                if args.get("input") in in_fx:  # the layer input first, as for a module
                    i = in_fx.index(args["input"])
                    for lst in (inputs, in_tensors, in_fx):
                        lst.insert(0, lst.pop(i))
                attrs["operands"] = {
                    k: in_fx.index(v) for k, v in args.items() if isinstance(v, fx.Node) and v in in_fx
                }
                if lkind == "sdpa" and "query" in attrs["operands"]:  # its "input" (grad_input) is the query
                    attrs["operands"]["input"] = attrs["operands"]["query"]
                for pname in ("weight", "bias"):
                    qual = _param_source(args.get(pname), gm)
                    if qual is not None:
                        uses[pname] = qual
                owners = {q.rpartition(".")[0] for q in uses.values()}
                if uses:
                    layer = owners.pop() if len(owners) == 1 else fxn.name
                    for pname, qual in uses.items():
                        claimed.setdefault(qual, layer)
                        if qual not in seen_params:
                            seen_params.add(qual)
                            p = params_of[qual]
                            params[pname] = Param(qual, tuple(p.shape), p.dtype)
        if kind == "pad":
            attrs["mode"] = _pad_mode(fxn, mod)
        layer_name = layer if layer and layer not in layer_names else fxn.name
        layer_names.add(layer_name)
        stack = fxn.meta.get("nn_module_stack") or {}
        scopes = tuple(str(v[0]) for v in stack.values())
        if fxn.op == "call_module" and (not scopes or scopes[-1] != str(fxn.target)):
            scopes += (str(fxn.target),)
        scope = scopes[-1] if scopes else ""
        fx_index[fxn] = len(nodes)
        nodes.append(
            Node(
                index=len(nodes),
                name=layer_name,
                op=fxn.op,
                kind=kind,
                target=target,
                inputs=inputs,
                in_tensors=in_tensors,
                outs=outs,
                module=mod,
                params=params,
                attrs=attrs,
                scope=scope,
                scopes=scopes,
                layer=layer,
                uses=uses,
                fx=fxn,
                fx_inputs=tuple(in_fx),
                fx_consts={a: runner.env.get(a) for a in fxn.all_input_nodes if a not in in_fx},
            )
        )

    _claim_parameters(nodes, gm, claimed, seen_params, params_of)
    logits = nodes[-1].in_tensors[0] if nodes[-1].in_tensors else None
    if logits is None or len(logits.shape) != 2:
        shape = logits.shape if logits is not None else None
        raise MemplanError(
            f"{name} output {out_path + ' ' if out_path else ''}has shape {shape}; expected (batch, classes) logits",
            "pick the logits with --output KEY" if out_path else None,
        )
    # loss: cross-entropy over the logits with int64 class targets
    target = TensorInfo((logits.shape[0],), torch.int64, len(storages))
    storages.append(target.nbytes)
    loss_out = TensorInfo((), logits.dtype, len(storages))
    storages.append(loss_out.nbytes)
    out_node = nodes[-1]
    nodes.insert(
        len(nodes) - 1,
        Node(
            index=len(nodes) - 1,
            name="loss",
            op="call_function",
            kind="cross_entropy",
            target="cross_entropy",
            inputs=[out_node.inputs[0]],
            in_tensors=[logits],
            outs=(loss_out,),
            attrs={"target": target},
        ),
    )
    out_node.index = len(nodes) - 1
    out_node.inputs, out_node.in_tensors = [len(nodes) - 2], [loss_out]
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    graph = LayerGraph(
        nodes, storages, frozenset(param_storages), [], input_shape, int(input_shape[0]), name, buffer_bytes
    )
    graph.output = out_path
    graph.gm = gm
    return graph


def _claim_parameters(
    nodes: list[Node], gm: fx.GraphModule, claimed: dict[str, str], seen: set[str], params_of: dict[str, nn.Parameter]
) -> None:
    """``get_attr`` nodes: a parameter read by a functional layer trains with that layer
    (``attrs["param_of"]``); one read by anything else is a layer of its own (kind ``param``)
    whose training the strategies decide like any other parameter's."""
    for node in nodes:
        if node.op != "get_attr" or node.fx.target not in params_of:
            continue
        qual = str(node.fx.target)
        if qual in claimed:
            node.attrs["param_of"] = (claimed[qual], role(qual))
            continue
        node.kind, node.layer, node.name = "param", qual, qual
        node.uses = {role(qual): qual}
        node.attrs["param_of"] = (qual, role(qual))
        if qual not in seen:
            seen.add(qual)
            p = params_of[qual]
            node.params = {role(qual): Param(qual, tuple(p.shape), p.dtype)}
