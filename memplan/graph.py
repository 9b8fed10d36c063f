"""Graph capture: torch.fx trace with conv / linear / norm / activation / pooling leaves, and
shape propagation on the meta device (no real compute: batch 256 at 224 px costs the same
as batch 1).

The result is a :class:`LayerGraph`: nodes in forward (topological) order, each with its op
kind, its tensor inputs, its output shape / dtype and the id of the *storage* its output
lives in. Storage ids come from the meta tensors themselves, so views (flatten, slicing) and
in-place ops (``relu_``) are recognised as sharing memory without a hand-written list.
"""

from __future__ import annotations

import linecache
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from .errors import MemplanError, TraceFailure
from .ops import ACTIVATIONS, FUNCTION_KINDS, METHOD_KINDS, MODULE_KINDS, NORM_KINDS, PAD_MODES, PARAM_KINDS, function_name


@dataclass(frozen=True)
class TensorInfo:
    """Shape, dtype, storage and strides (in elements; empty = contiguous) of one tensor
    (storage ids index ``LayerGraph.storages``)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    storage: int
    strides: tuple[int, ...] = ()

    @property
    def contiguous(self) -> bool:
        last_unit = all(st == 1 for s, st in zip(self.shape[-1:], self.strides[-1:]) if s != 1)
        return last_unit and self.mergeable(len(self.shape))

    def mergeable(self, dims: int) -> bool:
        """Whether the first ``dims`` dims can be viewed as one (``reshape`` without a copy);
        size-1 dims do not matter, as in torch's view rule."""
        kept = [(s, st) for s, st in zip(self.shape[:dims], self.strides[:dims]) if s != 1]
        return all(st0 == st1 * s1 for (_, st0), (s1, st1) in zip(kept, kept[1:]))

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True)
class Param:
    """One parameter tensor owned by a node (counted once, at its first use)."""

    name: str  # qualified name in the model's state_dict
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(eq=False)
class Node:
    """One traced op. ``inputs[i]`` is the index of the node producing ``in_tensors[i]``."""

    index: int
    name: str  # module qualname for modules, fx node name otherwise
    op: str  # fx op: placeholder | call_module | call_function | call_method | get_attr | output
    kind: str  # canonical kind from memplan.ops, or "unknown"
    target: str  # module class or function name (what the unknown-op report shows)
    inputs: list[int]
    in_tensors: list[TensorInfo]
    outs: tuple[TensorInfo, ...]
    module: nn.Module | None = None
    params: dict[str, Param] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    scope: str = ""  # qualname of the innermost module whose forward created this node
    scopes: tuple[str, ...] = ()  # qualnames of every module call this node runs inside, outermost first
    block: str | None = None

    @property
    def out(self) -> TensorInfo | None:
        return self.outs[0] if self.outs else None

    def __repr__(self) -> str:
        shape = self.out.shape if self.out else None
        return f"Node({self.index}, {self.name!r}, {self.kind}, out={shape})"


@dataclass(eq=False)
class LayerGraph:
    """A traced model at one input shape: nodes in forward order plus the storage table."""

    nodes: list[Node]
    storages: list[int]  # nbytes per storage id
    param_storages: frozenset[int]  # storages of parameters / buffers (never activations)
    blocks: list[str]  # block module qualnames in forward order
    input_shape: tuple[int, ...]  # with batch
    batch: int
    model_name: str = ""
    buffer_bytes: int = 0  # running statistics and other buffers (part of the static memory)

    def by_name(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def param_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.kind in PARAM_KINDS and n.params]

    @property
    def classifier(self) -> Node:
        """The last linear layer in forward order (the last conv for fully convolutional nets)."""
        for kinds in (("linear",), ("conv",)):
            for n in reversed(self.nodes):
                if n.kind in kinds and n.params:
                    return n
        raise MemplanError("model has no linear or conv layer to use as classifier")

    def block_range(self, block: str) -> tuple[int, int]:
        """Index range [first, last] of the nodes inside ``block``."""
        idx = [n.index for n in self.nodes if n.block == block]
        if not idx:
            raise KeyError(block)
        return min(idx), max(idx)


# --------------------------------------------------------------------------- tracing

_extra_leaf_kinds: dict[type, str] = {}


def register_module_kind(cls: type, kind: str) -> None:
    """Declare that instances of ``cls`` are leaves costed as ``kind`` (used by lean modules)."""
    _extra_leaf_kinds[cls] = kind


def module_kind(m: nn.Module) -> str | None:
    for table in (_extra_leaf_kinds, MODULE_KINDS):
        for cls in type(m).__mro__:
            if cls in table:
                return table[cls]
    return None


class LeafTracer(fx.Tracer):
    """fx tracer that keeps known layers (and user-named modules) as single nodes.

    It records which module was being traced so that a failure can name it.
    """

    def __init__(self, leaf_modules: Iterable[str | type] = ()):
        super().__init__()
        self.leaf_names = {x for x in leaf_modules if isinstance(x, str)}
        self.leaf_types = tuple(x for x in leaf_modules if isinstance(x, type))
        self.stack: list[tuple[str, str]] = []

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if module_kind(m) is not None or isinstance(m, self.leaf_types):
            return True
        if qualname in self.leaf_names or type(m).__name__ in self.leaf_names:
            return True
        return super().is_leaf_module(m, qualname)

    def call_module(self, m, forward, args, kwargs):
        self.stack.append((self.path_of_module(m) if self.root is not m else "", type(m).__name__))
        try:
            out = super().call_module(m, forward, args, kwargs)
        except Exception as exc:
            if not hasattr(exc, "_memplan_scope"):
                exc._memplan_scope = self.stack[-1]  # type: ignore[attr-defined]
            raise
        self.stack.pop()
        return out


def _user_frame(exc: BaseException) -> str:
    """``file:line: code`` of the innermost traceback frame outside torch / memplan."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        f = frame.filename
        if "/torch/" in f or "/memplan/graph.py" in f or f.startswith("<"):
            continue
        code = (frame.line or linecache.getline(f, frame.lineno or 0)).strip()
        return f"{f.rsplit('/', 1)[-1]}:{frame.lineno}: {code}"
    return ""


def trace(model: nn.Module, leaf_modules: Iterable[str | type] = (), name: str = "model") -> fx.GraphModule:
    """Symbolically trace ``model``; raise TraceFailure with a one-line explanation on failure."""
    tracer = LeafTracer(leaf_modules)
    try:
        graph = tracer.trace(model)
    except MemplanError:
        raise
    except Exception as exc:
        qual, cls = getattr(exc, "_memplan_scope", ("", type(model).__name__))
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        where = f" in module '{qual}' ({cls})" if qual else f" in {cls}.forward"
        frame = _user_frame(exc)
        raise TraceFailure(
            f"cannot trace {name}: {first}{where}" + (f" at {frame}" if frame else ""),
            f"mark that module as a leaf (CLI: --leaf {cls}; Python: leaf_modules=['{cls}']) "
            "so memplan treats it as one op",
        ) from None
    return fx.GraphModule(tracer.root, graph, type(model).__name__)


# --------------------------------------------------------------------------- shape propagation


# Layouts. Whether a later reshape (linear / matmul on >2-dim inputs) is a view or a copy
# depends on strides, so the meta run must lay tensors out as eager CPU does. Some meta kernels
# (and the shortcuts below) differ; these rules correct them, one per op kind, each checked
# against eager strides by tests/test_fuzz.py.

#: TensorIterator ops (their output layout follows _elementwise_output)
ELEMENTWISE = ACTIVATIONS | {"add", "sub", "mul", "div", "dropout"}
#: exceptions: hardtanh / ReLU6 allocate ``empty_like(input)`` (the input's strides), feature
#: dropout multiplies by a broadcast mask (its meta kernel lays the output out as CPU does)
LIKE_INPUT_MODULES = (nn.Hardtanh,)  # ReLU6 too
LIKE_INPUT_FUNCTIONS = (F.hardtanh, F.relu6)
META_LAYOUT_MODULES = (nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)


def _channels_last(t: torch.Tensor) -> bool:
    """Whether ``t.suggest_memory_format()`` is channels-last: c10's stride-order test for a
    4-dim tensor (C, W, H, N from the fastest; ambiguous size-1 cases count as contiguous)."""
    if t.dim() != 4 or t.stride(1) == 0:
        return False
    low = 0
    for d in (1, 3, 2, 0):
        size, stride = t.shape[d], t.stride(d)
        if size == 0 or stride < low or (d == 0 and low == t.stride(1)):
            return False
        low = stride * size if size > 1 else stride
    return True


def _empty(shape: Sequence[int], like: torch.Tensor, channels_last: bool) -> torch.Tensor:
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty(tuple(shape), dtype=like.dtype, device="meta", memory_format=fmt)


def _norm_output(x: torch.Tensor, kind: str) -> torch.Tensor:
    """A norm's output without running its meta kernel (BatchNorm's would import
    torch._dynamo, about a second on first use): group norm takes the input's suggested memory
    format; batch norm is channels-last for a channels-last input that is not also contiguous;
    layer norm is contiguous."""
    if kind == "groupnorm":
        return _empty(x.shape, x, _channels_last(x))
    last = kind == "batchnorm" and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    return _empty(x.shape, x, last)


def _fast_elementwise(out_shape: Sequence[int], ts: list[torch.Tensor]) -> torch.Tensor | None:
    """TensorIterator's fast path: same-shaped inputs that are all contiguous (or all
    channels-last) give a new output with the standard strides of that format; None otherwise."""
    if not ts or any(t.shape != tuple(out_shape) for t in ts):
        return None
    for last, fmt in ((False, torch.contiguous_format), (True, torch.channels_last)):
        if all(t.is_contiguous(memory_format=fmt) for t in ts):
            return _empty(out_shape, ts[0], last)
    return None


def _elementwise_output(out: torch.Tensor, inputs: list[Any]) -> torch.Tensor:
    """A TensorIterator op's meta output, laid out as on CPU: some meta kernels keep the
    input's strides where the fast path gives standard ones (they differ at size-1 dims)."""
    ts = [t for t in inputs if isinstance(t, torch.Tensor)]
    if any(t.untyped_storage()._cdata == out.untyped_storage()._cdata for t in ts):
        return out  # in place
    std = _fast_elementwise(out.shape, ts)
    return out if std is None or std.stride() == out.stride() else std


def _like_input(x: torch.Tensor) -> torch.Tensor:
    """``empty_like(x)``: ``x``'s strides when it is non-overlapping and dense, else contiguous."""
    dims = sorted((st, s) for s, st in zip(x.shape, x.stride()) if s != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return _empty(x.shape, x, False)
        expected *= size
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")


def _suggested_output(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Ops whose CPU kernels allocate the output in the input's suggested memory format
    (interpolation, reflect / replicate padding; their meta kernels do not always)."""
    return _empty(out.shape, out, True) if _channels_last(x) else out


def _pad_mode(node: fx.Node, mod: nn.Module | None) -> str | None:
    """The ``F.pad`` mode of a padding module or of an ``F.pad(x, pad, mode, value)`` call."""
    if mod is not None:
        return next((PAD_MODES[c] for c in type(mod).__mro__ if c in PAD_MODES), None)
    return node.args[2] if len(node.args) > 2 else node.kwargs.get("mode", "constant")


def _conv_shape(conv: nn.Module, x: torch.Size) -> tuple[int, ...] | None:
    """Output shape of a conv (integer, "valid" or "same" padding); None when not that
    simple (or invalid)."""
    if len(x) != conv.weight.dim():
        return None
    spatial = []
    for i, (size, k, s, d) in enumerate(zip(x[2:], conv.kernel_size, conv.stride, conv.dilation)):
        p = 0 if conv.padding == "valid" else d * (k - 1) // 2 if conv.padding == "same" else conv.padding[i]
        out = size if conv.padding == "same" else (size + 2 * p - d * (k - 1) - 1) // s + 1
        if out < 1 or (conv.padding_mode in ("reflect", "circular") and p >= size):
            return None
        spatial.append(out)
    if x[1] != conv.in_channels:
        return None
    return (x[0], conv.out_channels, *spatial)


class _MetaRunner(fx.Interpreter):
    """Runs a GraphModule on meta tensors, swapping in meta copies of real parameters."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm, garbage_collect_values=False)
        self._meta_cache: dict[str, dict[str, torch.Tensor]] = {}

    def call_module(self, target, args, kwargs):
        mod = self.fetch_attr(target)
        kind = module_kind(mod)
        if kind in NORM_KINDS and len(args) == 1 and isinstance(args[0], torch.Tensor):
            return _norm_output(args[0], kind)
        if kind in ACTIVATIONS and len(args) == 1 and isinstance(args[0], torch.Tensor):
            # skip the (slow, Python) meta kernel where the layout is plain (run_node corrects
            # the exceptions): in place, the input itself; else TensorIterator's fast path
            std = args[0] if getattr(mod, "inplace", False) else _fast_elementwise(args[0].shape, [args[0]])
            if std is not None:
                return std
        if type(mod) in (nn.Conv1d, nn.Conv2d) and len(args) == 1 and isinstance(args[0], torch.Tensor):
            shape = _conv_shape(mod, args[0].shape)
            if shape is not None:  # torch's meta conv imports sympy on first use (~1 s)
                # channels-last output when the (padded) input or the weight suggests it, as on
                # CPU; circular padding builds a contiguous padded input
                last = _channels_last(args[0]) and mod.padding_mode != "circular"
                return _empty(shape, args[0], last or _channels_last(mod.weight))
        state = dict(mod.named_parameters(recurse=True))
        state.update(mod.named_buffers(recurse=True))
        if all(t.device.type == "meta" for t in state.values()):
            return mod(*args, **kwargs)
        if target not in self._meta_cache:
            self._meta_cache[target] = {k: torch.empty_like(v, device="meta") for k, v in state.items()}
        return torch.func.functional_call(mod, self._meta_cache[target], args, kwargs)

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if not isinstance(out, torch.Tensor):
            return out
        kind, _, mod = _node_kind(self.module, n)
        inputs = _flatten([self.env.get(a) for a in n.all_input_nodes])
        if kind in ELEMENTWISE:
            if isinstance(mod, LIKE_INPUT_MODULES) or n.target in LIKE_INPUT_FUNCTIONS:
                in_place = out.untyped_storage()._cdata == inputs[0].untyped_storage()._cdata
                return out if in_place else _like_input(inputs[0])
            return out if isinstance(mod, META_LAYOUT_MODULES) else _elementwise_output(out, inputs)
        if kind == "interpolate" or kind == "pad" and _pad_mode(n, mod) in ("reflect", "replicate"):
            return _suggested_output(out, inputs[0])
        return out

    def get_attr(self, target, args, kwargs):
        value = super().get_attr(target, args, kwargs)
        return value.to("meta") if isinstance(value, torch.Tensor) else value


def _flatten(obj: Any) -> list[Any]:
    if isinstance(obj, (list, tuple)):
        return [y for x in obj for y in _flatten(x)]
    if isinstance(obj, dict):
        return [y for x in obj.values() for y in _flatten(x)]
    return [obj]


def _node_kind(gm: fx.GraphModule, node: fx.Node) -> tuple[str, str, nn.Module | None]:
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
        kind, target, mod = _node_kind(gm, fxn)
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


# --------------------------------------------------------------------------- blocks


def _count_layers(m: nn.Module) -> int:
    return sum(1 for sub in m.modules() if module_kind(sub) in ("conv", "linear"))


def find_blocks(model: nn.Module) -> list[str]:
    """Structural block rule.

    A block is a module that is not an ``nn.Sequential`` / ``nn.ModuleList``, contains at
    least two conv / linear layers, is a child of an ``nn.Sequential`` / ``nn.ModuleList``,
    and has no ancestor that is already a block. This finds inverted-residual / MBConv /
    ResNet units in the usual model layouts; pass explicit ``block_names`` otherwise.
    """
    containers = (nn.Sequential, nn.ModuleList)
    found: list[str] = []

    def visit(mod: nn.Module, prefix: str) -> None:
        for cname, child in mod.named_children():
            qual = f"{prefix}.{cname}" if prefix else cname
            if isinstance(mod, containers) and not isinstance(child, containers) and _count_layers(child) >= 2:
                found.append(qual)
            else:
                visit(child, qual)

    visit(model, "")
    return found


def _assign_blocks(graph: LayerGraph, blocks: Sequence[str], explicit: bool) -> None:
    ordered: list[str] = []
    for node in graph.nodes:
        scope = node.scope
        for b in blocks:
            if scope == b or scope.startswith(b + "."):
                node.block = b
                if b not in ordered:
                    ordered.append(b)
                break
    if explicit:
        missing = [b for b in blocks if b not in ordered]
        if missing:
            raise MemplanError(f"block {missing[0]!r} is not a module of the traced model",
                               "name blocks by module qualname, e.g. 'features.3'")
    graph.blocks = ordered
