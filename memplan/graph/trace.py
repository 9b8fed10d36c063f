"""torch.fx tracing: known layers (modules whose ``forward`` is a stock module's own, memplan's
lean modules, scripted modules, ``torch.nn`` modules without a rule, user-named leaves) stay
single nodes, custom autograd Functions and script functions single call nodes
(:mod:`.leafcalls`); everything else is traced into. Failures are one-line errors naming the
module that cannot be traced (capture then records an eager run instead, :mod:`.record`)."""

from __future__ import annotations

import inspect
import linecache
import operator
import os
import traceback
from collections.abc import Iterable
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

try:  # generates the forward code at its first call, not at construction (capture never calls it)
    from torch.fx._lazy_graph_module import _LazyGraphModule as GraphModule
except ImportError:  # pragma: no cover - older / newer torch without it
    GraphModule = fx.GraphModule

from ..errors import MemplanError, TraceFailure
from .autocast import Regions
from .checkpoint import SEGMENTS_META, Segments, checkpoint_calls
from .composite import is_composite_module
from .kinds import module_kind
from .layout import flatten
from .leafcalls import opaque_calls


class InPlaceProxy(fx.Proxy):
    """A Proxy that records ``x += y`` (``-=``, ``*=``, ``/=``) as the in-place ``operator.iadd`` (...)
    node, which fx generates code for as ``x += y``. fx's own Proxy has no ``__iadd__``: Python
    falls back to ``x = x + y``, a new tensor where eager PyTorch writes into ``x``'s storage
    (GhostNet's ``x += shortcut`` on a channel slice of a larger tensor then keeps that whole
    tensor alive, not a new one of the slice's size)."""


def _in_place(op: Any):
    def method(self: fx.Proxy, other: Any) -> fx.Proxy:
        return self.tracer.create_proxy("call_function", op, (self, other), {})

    return method


for _name, _op in (
    ("__iadd__", operator.iadd),
    ("__isub__", operator.isub),
    ("__imul__", operator.imul),
    ("__itruediv__", operator.itruediv),
):
    setattr(InPlaceProxy, _name, _in_place(_op))


class LeafTracer(fx.Tracer):
    """fx tracer that keeps known layers, scripted modules and user-named modules as single
    nodes, and custom autograd Functions / script functions as single call nodes.

    It records which module was being traced so that a failure can name it. With
    ``into_composites``, stock modules built of other modules (``composite.is_composite_module``:
    ``nn.MultiheadAttention``, the ``nn.Transformer`` layers) are traced into, not kept whole;
    their forwards branch on tensor properties, so symbolic tracing then fails and capture
    records them (``memplan.graph.record``).
    """

    def __init__(self, leaf_modules: Iterable[str | type] = (), into_composites: bool = False):
        super().__init__()
        self.into_composites = into_composites
        self.leaf_names = {x for x in leaf_modules if isinstance(x, str)}
        self.leaf_types = tuple(x for x in leaf_modules if isinstance(x, type))
        self.stack: list[tuple[str, str]] = []
        self.segments = Segments(
            lambda v: v.node if isinstance(v, fx.Proxy) else None, lambda: self.stack[-1][0] if self.stack else ""
        )
        self.regions = Regions()  # where autocast was on (memplan.graph.autocast)

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        """fx's node, marked with the checkpoint segments it runs in (``memplan.graph.checkpoint``) and
        the autocast region in force (``memplan.graph.autocast``)."""
        node = self.segments.tag(super().create_node(*args, **kwargs))
        self.regions.mark(node)
        return node

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return InPlaceProxy(node, self)

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if module_kind(m) is not None or isinstance(m, self.leaf_types + (torch.jit.ScriptModule,)):
            return True
        if qualname in self.leaf_names or type(m).__name__ in self.leaf_names:
            return True
        if self.into_composites and is_composite_module(m):
            return False
        # fx's rule: a torch.nn module without a cost rule stays one (observed) node; a module
        # defined elsewhere, a subclass of a known layer among them, is traced into
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

    def intercept(self, target: Any, args: tuple, kwargs: dict) -> Any:
        """Opaque calls (``memplan.leafcalls``): one node when an argument is a Proxy."""
        if not any(isinstance(a, fx.Proxy) for a in flatten((args, kwargs))):
            return NotImplemented
        return self.create_proxy("call_function", target, args, kwargs)


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def user_frame(exc: BaseException) -> str:
    """``file:line: code`` of the innermost traceback frame outside torch / memplan."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        f = frame.filename
        if "/torch/" in f or f.startswith(_PACKAGE_DIR) or f.startswith("<"):
            continue
        code = (frame.line or linecache.getline(f, frame.lineno or 0)).strip()
        return f"{f.rsplit('/', 1)[-1]}:{frame.lineno}: {code}"
    return ""


def defaulted_args(model: nn.Module) -> dict[str, Any]:
    """``forward``'s parameters after the first that have defaults (specialised to them);
    raises for a forward that needs more than one argument."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return {}
    named = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not named:
        return {}  # forward(*args): tracing decides
    required = [p.name for p in named[1:] if p.default is p.empty]
    if required:
        raise MemplanError(
            f"{type(model).__name__}.forward takes {len(required) + 1} inputs without defaults "
            f"({', '.join([named[0].name, *required])}); memplan profiles models with one input tensor",
            "wrap the model so that forward(x) fills the others",
        )
    return {p.name: p.default for p in named[1:]}


def _drop_specialised(graph: fx.Graph) -> None:
    """Remove the placeholders fx adds for ``concrete_args`` (all but the first) and the
    asserts guarding them."""
    for ph in [n for n in graph.nodes if n.op == "placeholder"][1:]:
        order, pending = [], [ph]
        while pending:
            n = pending.pop()
            order.append(n)
            pending.extend(n.users)
        for n in reversed(order):
            if not n.users:
                graph.erase_node(n)


def trace(
    model: nn.Module, leaf_modules: Iterable[str | type] = (), name: str = "model", into_composites: bool = False
) -> fx.GraphModule:
    """Symbolically trace ``model``; raise TraceFailure with a one-line explanation on failure.

    ``forward`` parameters with defaults are specialised to them; custom autograd Functions and
    script functions become single call nodes (``memplan.leafcalls``); ``into_composites``: see
    :class:`LeafTracer`.
    """
    tracer = LeafTracer(leaf_modules, into_composites)
    concrete = defaulted_args(model)
    try:
        with opaque_calls(model, tracer.intercept), checkpoint_calls(tracer.segments):
            graph = tracer.trace(model, concrete_args=concrete or None)
    except MemplanError:
        raise
    except Exception as exc:
        qual, cls = getattr(exc, "_memplan_scope", ("", type(model).__name__))
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        where = f" in module '{qual}' ({cls})" if qual else f" in {cls}.forward"
        frame = user_frame(exc)
        raise TraceFailure(
            f"cannot trace {name}: {first}{where}" + (f" at {frame}" if frame else ""),
            f"mark that module as a leaf (CLI: --leaf {cls}; Python: leaf_modules=['{cls}']) "
            "so memplan treats it as one op",
        ) from None
    if concrete:
        _drop_specialised(graph)
    gm = GraphModule(tracer.root, graph, type(model).__name__)
    gm.meta[SEGMENTS_META] = tracer.segments.records
    return gm
