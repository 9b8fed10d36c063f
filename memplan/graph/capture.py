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

import torch
import torch.nn as nn

from ..errors import MemplanError, TraceFailure
from .autocast import make_explicit
from .blocks import _assign_blocks, find_blocks
from .build import GraphBuilder
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
    amp: torch.dtype | None = None,
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
    A cross-entropy loss node over the (batch, classes) logits is appended, since every training
    step has one; it takes the model's output, or for a tuple / dict / namedtuple output its
    first tensor or the entry named by ``output``.

    ``amp``: the training step runs under ``torch.autocast("cpu", amp)`` (the loss too); an
    autocast in the model's own ``forward`` is honoured either way (``memplan.graph.autocast``:
    the casts become nodes, tensors get the dtypes autocast produces). ``LayerGraph.amp``: the
    step's autocast dtype.
    """
    x = torch.empty(tuple(input_shape), dtype=dtype, device="meta")
    how = "symbolic"
    with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
        gm = trace(model, leaf_modules, name) if runnable else None
        with train_mode(model):
            if gm is None:
                try:
                    gm = trace(model, leaf_modules, name, into_composites=True)
                except TraceFailure:
                    gm = record(model, x, leaf_modules, name)
                    how = "recorded"
    make_explicit(gm)
    with train_mode(model):
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
        graph = GraphBuilder(gm, runner, model, name, output, amp).build(tuple(input_shape))
    graph.capture = how
    blocks = list(block_names) if block_names is not None else find_blocks(model)
    _assign_blocks(graph, blocks, explicit=block_names is not None)
    return graph
