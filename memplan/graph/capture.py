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

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn as nn

from ..errors import InputShapeError, MemplanError, TraceFailure
from .autocast import make_explicit
from .blocks import _assign_blocks, find_blocks
from .build import GraphBuilder
from .checkpoint import follow_replaced
from .meta_runner import _MetaRunner
from .model import LayerGraph
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


@dataclass(frozen=True)
class StepRun:
    """How the training step runs the model, as :func:`capture_graph` captures it. ``own_modes``:
    under the model's own train / eval flags (False: every module in train mode, flags restored
    after); ``amp``: under ``torch.autocast("cpu", amp)``, the loss too (None: without)."""

    own_modes: bool = False
    amp: torch.dtype | None = None


def _modes(model: nn.Module, step: StepRun) -> contextlib.AbstractContextManager[None]:
    """The train / eval flags ``step`` runs ``model`` under (:func:`train_mode` unless its own)."""
    return contextlib.nullcontext() if step.own_modes else train_mode(model)


def capture_graph(
    model: nn.Module,
    input_shape: Sequence[int],
    *,
    leaf_modules: Iterable[str | type] = (),
    block_names: Sequence[str] | None = None,
    dtype: torch.dtype = torch.float32,
    name: str = "model",
    output: str | int | None = None,
    runnable: bool = False,
    step: StepRun = StepRun(),
) -> LayerGraph:
    """Trace ``model`` and propagate an input of ``input_shape`` (batch first) on meta: the last
    step of the capture pipeline (``memplan.capture``, which everything above the engine calls).

    Capture is symbolic (``torch.fx``) where it can be, and otherwise records one eager run on
    meta tensors (``memplan.record``: shape-dependent control flow, iteration over tensors);
    ``LayerGraph.capture`` says which. The model runs in train mode (flags restored after).
    ``LayerGraph.gm`` keeps the GraphModule; ``runnable=True`` makes it one to run the model with
    (the contribution feature cache cuts it): symbolic only (a failure raises TraceFailure; a
    recording is specialised to its batch), with stock composite modules (``nn.MultiheadAttention``,
    the ``nn.Transformer`` layers) kept whole and costed by observation, and traced under the
    model's own train / eval flags. Otherwise those modules are captured through their parts
    (recorded: their forwards branch on tensor properties).
    ``step``: how the training step runs the model (:class:`StepRun`: its own train / eval flags
    instead of train mode, autocast).
    The model's own ``requires_grad`` and train / eval flags are kept in the graph
    (``LayerGraph.prepared_grad`` / ``prepared_training``: what strategy ``as-is`` plans by);
    activation checkpointing calls become segments of the graph (``LayerGraph.checkpoints``,
    ``memplan.graph.checkpoint``).
    A cross-entropy loss node over the (batch, classes) logits is appended, since every training
    step has one; it takes the model's output, or for a tuple / dict / namedtuple output its
    first tensor or the entry named by ``output``.

    An autocast in the model's own ``forward`` is honoured with or without ``step.amp``
    (``memplan.graph.autocast``: the casts become nodes, tensors get the dtypes autocast
    produces). ``LayerGraph.amp``: the step's autocast dtype.
    """
    x = torch.empty(tuple(input_shape), dtype=dtype, device="meta")
    how = "symbolic"
    prepared_grad = {q: p.requires_grad for q, p in model.named_parameters(remove_duplicate=False)}
    prepared_training = {q: m.training for q, m in model.named_modules()}
    with torch.autocast("cpu", dtype=step.amp or torch.bfloat16, enabled=step.amp is not None):
        gm = trace(model, leaf_modules, name) if runnable else None
        with _modes(model, step):
            if gm is None:
                try:
                    gm = trace(model, leaf_modules, name, into_composites=True)
                except TraceFailure:
                    gm = record(model, x, leaf_modules, name)
                    how = "recorded"
    follow_replaced(gm, make_explicit(gm))  # segment inputs made functional calls under autocast
    with _modes(model, step):
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
            raise InputShapeError(
                f"{name} fails on input shape {tuple(input_shape)}: {first}",
                "check --resolution / the model's expected input",
            ) from None
        graph = GraphBuilder(gm, runner, model, name, output, step.amp).build(tuple(input_shape))
    graph.capture = how
    graph.prepared_grad, graph.prepared_training = prepared_grad, prepared_training
    blocks = list(block_names) if block_names is not None else find_blocks(model)
    _assign_blocks(graph, blocks, explicit=block_names is not None)
    return graph
