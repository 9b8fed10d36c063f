"""Capture by execution: when symbolic tracing fails, run the model once on meta tensors and
record every call into an ``fx.Graph`` with the same conventions as the symbolic tracer.

Symbolic tracing cannot follow shape-dependent Python control flow, iteration over a tensor or
a scripted call; eager execution can. On meta tensors the run costs no compute and no memory.
Recorded are:

* calls of leaf modules (the same leaves as the symbolic tracer: known stock modules, lean
  modules, scripted modules, ``torch.nn`` modules without a rule, user-named leaves) as
  ``call_module`` nodes, found with global module forward hooks;
* every other torch function and Tensor method (a ``TorchFunctionMode``) as ``call_function`` /
  ``call_method`` nodes, parameters and buffers as ``get_attr`` nodes;
* custom autograd Functions and script functions as single call nodes (``memplan.leafcalls``);
* a tensor the model reads from outside itself (a module-level cache filled by an earlier run, a
  constant built once) as a constant of the graph (a ``get_attr`` of the GraphModule, as
  ``torch.export`` lifts constants), so capture does not depend on what ran before it.

The graph is specialised to the recorded input shape (control flow taken as it ran), which is
what capture needs: one input shape at a time.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from ..errors import TraceFailure
from .autocast import Regions, cast_operands
from .checkpoint import SEGMENTS_META, Segments, checkpoint_calls
from .composite import COMPOSITE_FUNCTIONS, composite_body
from .layout import flatten, function_output
from .leafcalls import opaque_calls
from .saved import storage_key
from .trace import GraphModule, LeafTracer, user_frame

#: Tensor dunder methods and the operator fx records for them (reflected ones swap operands)
_DUNDERS: dict[str, tuple[Any, bool]] = {
    **{
        f"__{n.rstrip('_')}__": (getattr(operator, n), False)
        for n in (
            "add",
            "sub",
            "mul",
            "truediv",
            "floordiv",
            "matmul",
            "pow",
            "mod",
            "and_",
            "or_",
            "xor",
            "getitem",
            "setitem",
            "neg",
            "pos",
            "abs",
            "invert",
            "lt",
            "le",
            "gt",
            "ge",
            "eq",
            "ne",
            "lshift",
            "rshift",
        )
    },
    **{
        f"__r{n.rstrip('_')}__": (getattr(operator, n), True)
        for n in ("add", "sub", "mul", "truediv", "floordiv", "matmul", "pow", "mod", "and_", "or_", "xor")
    },
    **{
        f"__i{n}__": (getattr(operator, f"i{n}"), False)
        for n in ("add", "sub", "mul", "truediv", "floordiv", "matmul", "pow", "mod", "and", "or", "xor")
    },
}


def _tensors(obj: Any) -> list[torch.Tensor]:
    return [t for t in flatten(obj) if isinstance(t, torch.Tensor)]


def _call(func: Any, args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)``; where meta tensors meet CPU ones the model made itself (a mask
    built in ``forward`` without a device) and the meta kernel refuses, again with those on meta."""
    try:
        return func(*args, **kwargs)
    except RuntimeError:
        tensors = _tensors((args, kwargs))
        if not any(t.is_meta for t in tensors) or all(t.is_meta for t in tensors):
            raise
    to_meta = lambda v: v.to("meta") if isinstance(v, torch.Tensor) else v  # noqa: E731
    return func(*fx.node.map_aggregate(args, to_meta), **fx.node.map_aggregate(kwargs, to_meta))


class _Recorder(TorchFunctionMode):
    """Records the calls of one eager run into ``graph``."""

    def __init__(self, model: nn.Module, leaf_modules: Iterable[str | type]):
        super().__init__()
        self.is_leaf = LeafTracer(leaf_modules, into_composites=True).is_leaf_module
        self.graph = fx.Graph()
        self.nodes: dict[int, fx.Node] = {}  # id(tensor) -> node producing it
        self.alive: list[Any] = []  # keep recorded values alive: ids stay unique
        self.names = {id(m): q for q, m in model.named_modules()}
        self.attr_names: dict[int, str] = {}
        self.constants: dict[str, torch.Tensor] = {}  # tensors the model reads from outside itself
        self.real_state: dict[int, torch.Tensor] = {}  # storage of a meta state tensor -> the model's tensor
        self.stack: list[tuple[str, str]] = []  # (qualname, class) of the module calls running
        self.entries: list[tuple[nn.Module, bool]] = []  # per running module call: is it a recorded leaf
        self.depth = 0  # > 0 while inside a leaf module or an opaque call
        # checkpoint calls (memplan.graph.checkpoint)
        self.segments = Segments(self.tracked, lambda: self.stack[-1][0] if self.stack else "")
        self.regions = Regions()  # where autocast was on (memplan.graph.autocast)

    # ------------------------------------------------------------------ graph building
    def bind(self, value: Any, node: fx.Node) -> None:
        """Map every tensor of ``value`` to ``node`` (elements of a tuple through getitem nodes)."""
        self.alive.append(value)
        if isinstance(value, torch.Tensor):
            self.nodes[id(value)] = node
        elif isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                if _tensors(v):
                    item = self._node("call_function", operator.getitem, (node, i), {})
                    self.bind(v, item)

    def _node(self, op: str, target: Any, args: tuple, kwargs: dict) -> fx.Node:
        node = self.graph.create_node(op, target, args, kwargs)
        node.meta["nn_module_stack"] = {q: (q, cls) for q, cls in self.stack if q}
        self.regions.mark(node)
        return self.segments.tag(node)

    def tracked(self, value: Any) -> fx.Node | None:
        """The node of a tensor the recording tracks (None for anything else, and inside a leaf)."""
        if self.depth or not isinstance(value, torch.Tensor):
            return None
        return self.arg(value) if id(value) in self.nodes or id(value) in self.attr_names else None

    def arg(self, value: Any) -> Any:
        """An argument with tensors replaced by their nodes (parameters as get_attr)."""
        if isinstance(value, torch.Tensor):
            node = self.nodes.get(id(value))
            if node is None:
                qual = self.attr_names.get(id(value))
                if qual is None:  # read from outside the model (a module-level cache): a constant
                    qual = f"_memplan_constant{len(self.constants)}"
                    self.constants[qual] = self.outside(value)
                node = self.nodes[id(value)] = self._node("get_attr", qual, (), {})
            return node
        if isinstance(value, (list, tuple)):
            items = [self.arg(v) for v in value]
            return type(value)(items) if not hasattr(value, "_fields") else type(value)(*items)
        if isinstance(value, dict):
            return {k: self.arg(v) for k, v in value.items()}
        return value

    def outside(self, value: torch.Tensor) -> torch.Tensor:
        """The graph's constant for a tensor no recorded call made: ``value`` itself, or, where it views
        the storage of a parameter or buffer (``Variable(self.index)``: an alias made where no torch
        function sees it), the same view of the model's own tensor, as symbolic tracing lifts it."""
        real = self.real_state.get(storage_key(value))
        if real is None:
            return value
        with torch.no_grad():
            alias = torch.empty(0, dtype=value.dtype, device=real.device)
            return alias.set_(real.untyped_storage(), value.storage_offset(), value.shape, value.stride())

    def record(self, target: Any, args: tuple, kwargs: dict, out: Any, op: str = "call_function") -> Any:
        self.bind(out, self._node(op, target, self.arg(args), self.arg(kwargs)))
        return out

    # ------------------------------------------------------------------ torch functions
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__iter__" and not self.depth and self.stack:  # iteration over a tensor: unbind(0)
            return iter(self.record("unbind", (args[0],), {}, args[0].unbind(0), op="call_method"))
        if func in COMPOSITE_FUNCTIONS and not self.depth and self.stack:
            with self:  # its parts are recorded
                return composite_body(func)(*args, **kwargs)
        run_args, run_kwargs = cast_operands(func, args, kwargs)  # the dtypes autocast gives (when on)
        out = function_output(func, run_args, run_kwargs)  # laid out as on CPU, without the slow Python meta kernel
        if out is None:
            out = _call(func, run_args, run_kwargs)
        if self.depth or not self.stack:
            return out
        mutates = name.endswith("_") and not name.endswith("__") or name in ("__setitem__",) or name.startswith("__i")
        if not _tensors(out) and not mutates:
            return out  # shapes, sizes, dims: constants of the specialised graph
        if name == "__get__":  # a tensor property (x.T, x.mT): getattr(x, name)
            attr = getattr(getattr(func, "__self__", None), "__name__", "")
            return self.record(getattr, (args[0], attr), {}, out)
        if name in _DUNDERS:
            target, swap = _DUNDERS[name]
            return self.record(target, tuple(reversed(args[:2])) if swap else args, kwargs, out)
        if getattr(torch.Tensor, name, None) is func:
            return self.record(name, args, kwargs, out, op="call_method")
        return self.record(func, args, kwargs, out)

    # ------------------------------------------------------------------ opaque calls
    def intercept(self, target: Any, args: tuple, kwargs: dict) -> Any:
        if self.depth or not any(id(t) in self.nodes or id(t) in self.attr_names for t in _tensors((args, kwargs))):
            return NotImplemented
        self.depth += 1
        try:
            out = target(*args, **kwargs)
        finally:
            self.depth -= 1
        return self.record(target, args, kwargs, out)

    # ------------------------------------------------------------------ module calls
    def pre_hook(self, module: nn.Module, args: tuple) -> None:
        qual = self.names.get(id(module), "")
        leaf = not self.depth and module is not self.root and self.is_leaf(module, qual)
        self.entries.append((module, leaf))
        self.stack.append((qual, type(module).__name__))
        if leaf:
            self.pending_args = args
            self.depth += 1

    def post_hook(self, module: nn.Module, args: tuple, out: Any) -> None:
        _, leaf = self.entries.pop()
        self.stack.pop()
        if leaf:
            self.depth -= 1
            qual = self.names[id(module)]
            self.stack.append((qual, type(module).__name__))
            self.record(qual, args, {}, out, op="call_module")
            self.stack.pop()


def record(
    model: nn.Module, x: torch.Tensor, leaf_modules: Iterable[str | type] = (), name: str = "model"
) -> fx.GraphModule:
    """Record one eager run of ``model`` on the meta tensor ``x`` as an ``fx.GraphModule``.

    Raises a one-line ``TraceFailure`` naming the module that failed (for instance on
    data-dependent control flow, which meta tensors cannot decide).
    """
    rec = _Recorder(model, leaf_modules)
    rec.model_name, rec.root = name, model
    real = dict([*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)])
    state = {k: torch.empty_like(v, device="meta") for k, v in real.items()}
    for qual, t in state.items():
        rec.attr_names.setdefault(id(t), qual)
        rec.real_state[storage_key(t)] = real[qual]
    placeholder = rec._node("placeholder", "x", (), {})
    rec.bind(x, placeholder)
    hooks = [
        nn.modules.module.register_module_forward_pre_hook(rec.pre_hook),
        nn.modules.module.register_module_forward_hook(rec.post_hook),
    ]
    try:
        with opaque_calls(model, rec.intercept), checkpoint_calls(rec.segments), rec:
            out = torch.func.functional_call(model, state, (x,))
    except TraceFailure:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        qual, cls = rec.stack[-1] if rec.stack else ("", type(model).__name__)
        where = f" in module '{qual}' ({cls})" if qual else f" in {cls}.forward"
        frame = user_frame(exc)
        raise TraceFailure(
            f"cannot capture {name}: {first}{where}" + (f" at {frame}" if frame else ""),
            f"mark that module as a leaf (CLI: --leaf {cls}; Python: leaf_modules=['{cls}']) "
            "so memplan treats it as one op",
        ) from None
    finally:
        for h in hooks:
            h.remove()
    rec.graph.output(rec.arg(out))
    for qual, value in rec.constants.items():  # GraphModule copies get_attr targets from the root
        setattr(model, qual, value)
    try:
        gm = GraphModule(model, rec.graph, type(model).__name__)
        gm.meta[SEGMENTS_META] = rec.segments.records
        return gm
    finally:
        for qual in rec.constants:
            delattr(model, qual)
