"""Activation checkpointing in the captured graph: every ``torch.utils.checkpoint`` call made while
a model is captured becomes a *segment* of the graph.

Both forms of ``torch.utils.checkpoint.checkpoint`` (and so ``checkpoint_sequential``, Hugging
Face's ``gradient_checkpointing_enable()`` and timm's ``set_grad_checkpointing()``, which call it)
are followed: the reentrant one through ``CheckpointFunction.apply``, the other through
``_checkpoint_without_reentrant_generator``, both looked up when the call runs. While a model is
captured (:func:`checkpoint_calls`) a call with capture values among its arguments does not run
torch's machinery: its function is traced (or recorded) in place, and every node created inside
carries the ids of the segments it runs in (``node.meta[SEGMENT_META]``, outermost first); the
GraphModule lists the segments (``gm.meta[SEGMENTS_META]``: :class:`Segment`, with the fx nodes
of the tensors passed to the call). Cost rules stay per op; the accounting
(``memplan.accounting.recompute``) keeps each segment's inputs, drops what its ops save from the
forward and saves it again when the backward recomputes the segment.

A call memplan does not model exactly (``context_fn``: selective checkpointing, which keeps some
of the segment's tensors) is a segment with ``exact=False``: counted as if not checkpointed (an
upper bound of its saved bytes) and reported as not exact.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch.fx as fx
import torch.utils.checkpoint as tuc

from .layout import flatten

#: fx ``node.meta`` key: the ids of the checkpoint segments a node runs in, outermost first
SEGMENT_META = "memplan_checkpoint"
#: ``GraphModule.meta`` key: the :class:`Segment` records of a capture
SEGMENTS_META = "memplan_checkpoints"

REENTRANT, NON_REENTRANT = "reentrant", "non-reentrant"


@dataclass(frozen=True)
class Segment:
    """One checkpoint call: ``kind`` (``REENTRANT`` / ``NON_REENTRANT``), the fx nodes of the
    tensors passed to it (what its backward keeps), the enclosing segment (None: top level),
    whether non-reentrant recomputation stops after the last saved tensor (``early_stop``), and
    whether memplan models it exactly (``exact``; ``note`` says why not); ``scope``: the module
    whose forward made the call."""

    id: int
    kind: str
    inputs: tuple[fx.Node, ...]
    parent: int | None = None
    early_stop: bool = True
    exact: bool = True
    note: str = ""
    scope: str = ""


class Segments:
    """The segments of one capture. ``node_of(value)``: the fx node of a capture value (a Proxy, a
    tensor the recorder tracks), None for anything else; a call whose arguments hold none runs as
    torch runs it. ``scope()``: the qualname of the module whose forward is running."""

    def __init__(self, node_of: Callable[[Any], fx.Node | None], scope: Callable[[], str]):
        self.node_of, self.scope = node_of, scope
        self.stack: list[int] = []
        self.records: list[Segment] = []

    def inputs(self, args: Any) -> tuple[fx.Node, ...]:
        nodes = [self.node_of(a) for a in flatten(args)]
        return tuple(dict.fromkeys(n for n in nodes if n is not None))

    @contextlib.contextmanager
    def segment(
        self, kind: str, inputs: tuple[fx.Node, ...], early_stop: bool = True, note: str = ""
    ) -> Iterator[None]:
        """A segment of ``kind`` open while the checkpointed function runs (``note``: why not exact)."""
        parent = self.stack[-1] if self.stack else None
        seg = Segment(len(self.records), kind, inputs, parent, early_stop, not note, note, self.scope())
        self.records.append(seg)
        self.stack.append(seg.id)
        try:
            yield
        finally:
            self.stack.pop()

    def tag(self, node: fx.Node) -> fx.Node:
        """Mark ``node`` with the segments running (no mark outside them)."""
        if self.stack:
            node.meta[SEGMENT_META] = tuple(self.stack)
        return node


def follow_replaced(gm: fx.GraphModule, replaced: dict[fx.Node, fx.Node]) -> None:
    """Point the segments of ``gm`` at the nodes that replaced their inputs' nodes (``replaced``: a
    graph pass's old node -> new node; ``memplan.graph.autocast.make_explicit``'s module calls)."""
    segments = gm.meta.get(SEGMENTS_META)
    if segments and replaced:
        gm.meta[SEGMENTS_META] = [
            dataclasses.replace(s, inputs=tuple(replaced.get(n, n) for n in s.inputs)) for s in segments
        ]


_ORIGINAL_GENERATOR = tuc._checkpoint_without_reentrant_generator
_GENERATOR_SIGNATURE = inspect.signature(_ORIGINAL_GENERATOR)


def _early_stop(given: bool) -> bool:
    """Whether non-reentrant recomputation stops early: the global switch
    (``set_checkpoint_early_stop``) when set, else the call's own."""
    forced = getattr(tuc, "_enable_checkpoint_early_stop", None)
    return given if forced is None else bool(forced)


@contextlib.contextmanager
def checkpoint_calls(segments: Segments) -> Iterator[None]:
    """While active, checkpoint calls with capture values among their arguments open a segment of
    ``segments`` and run their function in place (module docstring); restored on exit."""

    def generator(fn: Any, *rest: Any, **kw: Any) -> Iterator[None]:
        bound = _GENERATOR_SIGNATURE.bind(fn, *rest, **kw)
        bound.apply_defaults()
        a = bound.arguments
        inputs = segments.inputs((a.get("args", ()), a.get("kwargs", {})))
        if not inputs:
            yield from _ORIGINAL_GENERATOR(fn, *rest, **kw)
            return
        context_fn = a.get("context_fn", tuc.noop_context_fn)
        note = "" if context_fn is tuc.noop_context_fn else "context_fn (selective checkpointing)"
        with segments.segment(NON_REENTRANT, inputs, _early_stop(a.get("early_stop", True)), note):
            yield

    def apply(cls: type, function: Any, preserve: Any, *args: Any) -> Any:
        inputs = segments.inputs(args)
        if not inputs:
            return original_apply.__get__(None, cls)(function, preserve, *args)
        with segments.segment(REENTRANT, inputs, early_stop=False):
            return function(*args)

    cf = tuc.CheckpointFunction
    own = cf.__dict__.get("apply")
    original_apply = own if own is not None else inspect.getattr_static(cf, "apply")
    tuc._checkpoint_without_reentrant_generator = generator
    cf.apply = classmethod(apply)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        tuc._checkpoint_without_reentrant_generator = _ORIGINAL_GENERATOR
        if own is not None:
            cf.apply = own  # type: ignore[method-assign]
        else:
            del cf.apply
