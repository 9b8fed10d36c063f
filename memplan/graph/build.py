"""The LayerGraph of a traced, meta-propagated GraphModule (the second half of
:func:`memplan.graph.capture.capture_graph`), one step per method of :class:`GraphBuilder`:

1. the storage table, parameters and buffers first (so an op that returns one, rare, is not
   mistaken for an activation);
2. per fx node (:meth:`GraphBuilder.add`): its output tensors, its tensor operands, the layer
   whose parameters it uses (a module, or a functional layer such as ``F.conv2d(x, self.weight)``)
   and the module scopes it runs in (with their tags, ``TAG_ATTR``);
3. parameters read by ``get_attr`` nodes (:func:`_claim_parameters`);
4. the cross-entropy loss over the (batch, classes) logits, before the output node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from ..errors import MemplanError
from .attrs import _call_args, _call_attrs, _functional_attrs, _module_attrs, _param_source
from .checkpoint import SEGMENT_META, SEGMENTS_META
from .kinds import FUNCTIONAL_LAYERS, KINDS
from .layout import flatten
from .meta_runner import _MetaRunner
from .model import TAG_ATTR, WRAP_ATTR, CheckpointSegment, LayerGraph, Node, Param, TensorInfo, role
from .saved import storage_key


@dataclass
class Operands:
    """The tensor operands of one node: producing node index, tensor and fx node of each."""

    inputs: list[int] = field(default_factory=list)
    in_tensors: list[TensorInfo] = field(default_factory=list)
    in_fx: list[fx.Node] = field(default_factory=list)

    def to_front(self, a: fx.Node) -> None:
        """Put operand ``a`` first (a functional layer's input, as for a module)."""
        i = self.in_fx.index(a)
        for lst in (self.inputs, self.in_tensors, self.in_fx):
            lst.insert(0, lst.pop(i))


@dataclass
class Layer:
    """The layer a node belongs to ("" for none), the parameters it brings first, every parameter
    it reads (local name -> qualname) and its attributes."""

    name: str = ""
    params: dict[str, Param] = field(default_factory=dict)
    uses: dict[str, str] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)


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


class GraphBuilder:
    """Builds the LayerGraph of ``gm`` propagated by ``runner`` (the module ``model``, named ``name``;
    ``output``: the logits entry of a structured output)."""

    def __init__(
        self,
        gm: fx.GraphModule,
        runner: _MetaRunner,
        model: nn.Module,
        name: str,
        output: str | int | None,
        amp: torch.dtype | None = None,
    ):
        self.gm, self.runner, self.model, self.name, self.output = gm, runner, model, name, output
        self.amp = amp  # the step's autocast dtype (the loss runs under it), None for none
        self.storage_ids: dict[int, int] = {}
        self.storages: list[int] = []  # nbytes per storage id
        self.param_storages: set[int] = set()
        self.constant_storages: set[int] = set()
        self.params_of = dict(model.named_parameters())
        self.state_names = {q for q, _ in model.named_parameters(remove_duplicate=False)}
        self.state_names.update(q for q, _ in model.named_buffers(remove_duplicate=False))
        self.state_storages = {storage_key(t) for t in (*model.parameters(), *model.buffers())}
        self.scope_tags = _tagger(model)
        self.fx_index: dict[fx.Node, int] = {}
        self.seen_params: set[str] = set()
        self.layer_names: set[str] = set()
        self.claimed: dict[str, str] = {}  # parameter qualname -> layer that claims it (a functional layer)
        self.nodes: list[Node] = []
        self.out_path = ""

    def build(self, input_shape: tuple[int, ...]) -> LayerGraph:
        """Steps 1-4 (module docstring) for the batch-first ``input_shape``."""
        for state in self.runner._meta_cache.values():
            for t in state.values():
                self.info(t, is_param=True)
        for fxn in self.gm.graph.nodes:
            self.add(fxn)
        _claim_parameters(self.nodes, self.gm, self.claimed, self.seen_params, self.params_of)
        self.add_loss()
        buffer_bytes = sum(b.numel() * b.element_size() for b in self.model.buffers())
        graph = LayerGraph(
            self.nodes,
            self.storages,
            frozenset(self.param_storages),
            [],
            input_shape,
            int(input_shape[0]),
            self.name,
            buffer_bytes,
        )
        graph.output = self.out_path
        graph.amp = self.amp
        graph.gm = self.gm
        graph.constant_storages = frozenset(self.constant_storages)
        graph.wrappers = {
            q: child for q, m in self.model.named_modules() if isinstance(child := getattr(m, WRAP_ATTR, None), str)
        }
        graph.checkpoints = [
            CheckpointSegment(
                s.id,
                s.kind,
                tuple(self.fx_index[n] for n in s.inputs if n in self.fx_index),
                s.parent,
                s.early_stop,
                s.exact,
                s.note,
                s.scope,
            )
            for s in self.gm.meta.get(SEGMENTS_META, [])
        ]
        return graph

    def info(self, t: torch.Tensor, is_param: bool = False) -> TensorInfo:
        """The TensorInfo of ``t``, its storage numbered on first sight."""
        key = t.untyped_storage()._cdata
        if key not in self.storage_ids:
            self.storage_ids[key] = len(self.storages)
            self.storages.append(t.untyped_storage().nbytes())
        sid = self.storage_ids[key]
        if is_param:
            self.param_storages.add(sid)
        return TensorInfo(tuple(t.shape), t.dtype, sid, tuple(t.stride()))

    def add(self, fxn: fx.Node) -> None:
        """Append the Node of ``fxn``."""
        kind, target, mod = self.runner.kinds[fxn]
        value = self.value_of(fxn)
        outs = tuple(
            self.info(t, is_param=(fxn.op == "get_attr")) for t in flatten(value) if isinstance(t, torch.Tensor)
        )
        if fxn.op == "get_attr" and self.is_constant(fxn):
            self.constant_storages.update(t.storage for t in outs)
        if kind == "unknown" and not outs and fxn.op in ("call_function", "call_method"):
            kind = "meta"  # Python values only (shape arithmetic: c // heads): nothing autograd could keep
        ops = self.operands(fxn, value)
        if kind == "cast" and outs and ops.in_tensors and outs[0].storage == ops.in_tensors[0].storage:
            kind = "identity"  # autocast leaves an operand already in its dtype as it is
        layer = self.layer_of(fxn, kind, mod, ops)
        layer_name = layer.name if layer.name and layer.name not in self.layer_names else fxn.name
        self.layer_names.add(layer_name)
        scopes = self.scopes(fxn)
        self.fx_index[fxn] = len(self.nodes)
        self.nodes.append(
            Node(
                index=len(self.nodes),
                name=layer_name,
                op=fxn.op,
                kind=kind,
                target=target,
                inputs=ops.inputs,
                in_tensors=ops.in_tensors,
                outs=outs,
                module=mod,
                params=layer.params,
                attrs=layer.attrs,
                scope=scopes[-1] if scopes else "",
                scopes=scopes,
                tags=frozenset(t for sc in scopes for t in self.scope_tags(sc)),
                segments=tuple(fxn.meta.get(SEGMENT_META, ())),
                layer=layer.name,
                uses=layer.uses,
                fx=fxn,
                fx_inputs=tuple(ops.in_fx),
                fx_consts={a: self.runner.env.get(a) for a in fxn.all_input_nodes if a not in ops.in_fx},
            )
        )

    def is_constant(self, fxn: fx.Node) -> bool:
        """Whether the ``get_attr`` node ``fxn`` reads a constant: a tensor the model reads from outside
        itself (a module-level cache). A parameter or buffer is none, nor is another tensor object on
        one's storage: fx lifts ``Variable(self.index)`` or ``self.mask.detach()`` of a buffer, evaluated
        while tracing, as a ``_tensor_constant``, but autograd saves the buffer's own storage, which
        ``saved_tensors_hooks`` measurements leave out with the model's state."""
        if fxn.target in self.state_names:
            return False
        real = [t for t in flatten(self.runner.fetch_attr(fxn.target)) if isinstance(t, torch.Tensor)]
        return any(storage_key(t) not in self.state_storages for t in real)

    def value_of(self, fxn: fx.Node) -> Any:
        """The propagated value of ``fxn``; for the output node, the logits tensor it selects."""
        env = self.runner.env
        if fxn.op != "output":
            return env.get(fxn)
        arg = fxn.args[0]
        whole = env[arg] if isinstance(arg, fx.Node) else fx.node.map_arg(arg, lambda a: env[a])
        value, self.out_path = select_output(whole, self.output, self.name)
        if not isinstance(value, torch.Tensor):
            raise MemplanError(
                f"{self.name} output {self.out_path or ''} is not a tensor".replace("  ", " "),
                "memplan needs the logits tensor",
            )
        return value

    def operands(self, fxn: fx.Node, value: Any) -> Operands:
        """The tensor operands of ``fxn`` (tuple producers such as chunk / split: their first tensor)."""
        if fxn.op == "output":  # the node that produced the logits tensor (through a namedtuple node, say)
            sources = [n for n, v in self.runner.env.items() if v is value and n.op != "output"][-1:]
        else:
            sources = flatten((fxn.args, fxn.kwargs))
        ops = Operands()
        for a in sources:
            if isinstance(a, fx.Node) and a in self.fx_index:
                src = self.nodes[self.fx_index[a]]
                val = self.runner.env.get(a)
                if isinstance(val, torch.Tensor) or (isinstance(val, (tuple, list)) and src.outs):
                    ops.inputs.append(src.index)
                    ops.in_tensors.append(src.outs[0])
                    ops.in_fx.append(a)
        return ops

    def layer_of(self, fxn: fx.Node, kind: str, mod: nn.Module | None, ops: Operands) -> Layer:
        """The layer of a module call (its qualname) or of a functional layer (the module owning
        its parameters); other calls get their attributes only."""
        if mod is not None:
            layer = Layer(str(fxn.target), attrs=_module_attrs(mod, kind))
            for pname, p in mod.named_parameters(recurse=True):
                qual = f"{fxn.target}.{pname}"
                layer.uses[pname] = qual
                self.claim(layer, pname, qual, p)
            return layer
        if fxn.op not in ("call_function", "call_method"):
            return Layer()
        layer = Layer(attrs=_call_attrs(fxn, kind))
        layout = FUNCTIONAL_LAYERS.get(fxn.target) if fxn.op == "call_function" else None
        if layout is not None:
            self.functional_layer(fxn, layout, ops, layer)
        return layer

    def functional_layer(self, fxn: fx.Node, layout: tuple[str, Any], ops: Operands, layer: Layer) -> None:
        """Fill ``layer`` for a call of a functional layer (``F.conv2d``, ``F.linear``, ...)."""
        lkind, argnames = layout
        args = _call_args(fxn, argnames)
        values = {k: fx.node.map_arg(v, lambda a: self.runner.env[a]) for k, v in args.items()}
        attrs = layer.attrs
        attrs.update(_functional_attrs(lkind, values))
        if args.get("input") in ops.in_fx:  # the layer input first, as for a module
            ops.to_front(args["input"])
        attrs["operands"] = {
            k: ops.in_fx.index(v) for k, v in args.items() if isinstance(v, fx.Node) and v in ops.in_fx
        }
        first = KINDS[lkind].input_arg
        if first != "input" and first in attrs["operands"]:  # its "input" (grad_input) is another argument
            attrs["operands"]["input"] = attrs["operands"][first]
        for pname in ("weight", "bias"):
            qual = _param_source(args.get(pname), self.gm)
            if qual is not None:
                layer.uses[pname] = qual
        owners = {q.rpartition(".")[0] for q in layer.uses.values()}
        if layer.uses:
            layer.name = owners.pop() if len(owners) == 1 else fxn.name
            for pname, qual in layer.uses.items():
                self.claim(layer, pname, qual, self.params_of.get(qual))

    def claim(self, layer: Layer, pname: str, qual: str, p: nn.Parameter | None) -> None:
        """``layer`` claims parameter ``qual`` (first claim wins) and brings it if no node has yet."""
        self.claimed.setdefault(qual, layer.name)
        if qual not in self.seen_params:
            self.seen_params.add(qual)
            p = p if p is not None else self.params_of[qual]
            layer.params[pname] = Param(qual, tuple(p.shape), p.dtype)

    @staticmethod
    def scopes(fxn: fx.Node) -> tuple[str, ...]:
        """Qualnames of every module call ``fxn`` runs inside, outermost first (a module call: itself last)."""
        stack = fxn.meta.get("nn_module_stack") or {}
        scopes = tuple(str(v[0]) for v in stack.values())
        if fxn.op == "call_module" and (not scopes or scopes[-1] != str(fxn.target)):
            scopes += (str(fxn.target),)
        return scopes

    def add_loss(self) -> None:
        """Insert the cross-entropy loss (int64 class targets) between the logits and the output node."""
        nodes, storages = self.nodes, self.storages
        logits = nodes[-1].in_tensors[0] if nodes[-1].in_tensors else None
        if logits is None or len(logits.shape) != 2:
            shape = logits.shape if logits is not None else None
            path = self.out_path
            raise MemplanError(
                f"{self.name} output {path + ' ' if path else ''}has shape {shape}; expected (batch, classes) logits",
                "pick the logits with --output KEY" if path else None,
            )
        target = TensorInfo((logits.shape[0],), torch.int64, len(storages))
        storages.append(target.nbytes)
        # under autocast the loss is on its float32 list: lower-precision logits are cast up
        low = self.amp is not None and logits.dtype in (torch.bfloat16, torch.float16)
        dtype = torch.float32 if low else logits.dtype
        loss_out = TensorInfo((), dtype, len(storages))
        storages.append(loss_out.nbytes)
        out_node = nodes[-1]
        loss = Node(
            index=len(nodes) - 1,
            name="loss",
            op="call_function",
            kind="cross_entropy",
            target="cross_entropy",
            inputs=[out_node.inputs[0]],
            in_tensors=[logits],
            outs=(loss_out,),
            attrs={"target": target, "dtype": dtype},
        )
        nodes.insert(len(nodes) - 1, loss)
        out_node.index = len(nodes) - 1
        out_node.inputs, out_node.in_tensors = [len(nodes) - 2], [loss_out]


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


def _tagger(model: nn.Module) -> Callable[[str], frozenset[str]]:
    """scope qualname -> the tags (``TAG_ATTR``) of that module and of every module above it."""
    modules = dict(model.named_modules())
    cache: dict[str, frozenset[str]] = {}

    def tags(scope: str) -> frozenset[str]:
        if scope not in cache:
            parts = scope.split(".")
            found = (getattr(modules.get(".".join(parts[:i])), TAG_ATTR, None) for i in range(1, len(parts) + 1))
            cache[scope] = frozenset(t for t in found if isinstance(t, str))
        return cache[scope]

    return tags
