"""Independent measurements (the truth the cost model is checked against).

``saved_bytes`` runs one real forward + loss under ``torch.autograd.graph.saved_tensors_hooks``
and sums the unique storages of the tensors autograd keeps, excluding the model's own
parameters and buffers (:class:`memplan.graph.saved.SavedObserver`); ``step_peak_bytes`` replays
torch.profiler's allocation records of one
step. Nothing here uses memplan's cost model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..graph import LayerGraph, select_output
from ..graph.saved import SavedObserver


@dataclass
class SavedMeasurement:
    bytes: int  # unique storages, parameters and buffers excluded
    tensors: list[tuple[tuple[int, ...], str, int]] = field(default_factory=list)  # (shape, dtype, storage bytes)


def model_modules(model: nn.Module, graph: LayerGraph) -> None:
    """Point the graph's nodes at ``model``'s modules (the graph may come from a meta copy)."""
    for node in graph.nodes:
        if node.op == "call_module":
            node.module = model.get_submodule(node.scope)


def saved_bytes(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, backward: bool = False, output: str | int | None = None
) -> SavedMeasurement:
    """Bytes autograd saves during forward + cross-entropy loss (unique storages). The loss takes
    the model's output, or the first tensor / the ``output`` entry of a tuple, dict or namedtuple."""
    with SavedObserver(exclude=[*model.parameters(), *model.buffers()]) as seen:
        loss = F.cross_entropy(select_output(model(x), output, type(model).__name__)[0], y)
    rows = [(r.shape, str(r.dtype).removeprefix("torch."), r.nbytes) for r in seen.records]
    total = seen.total
    del seen
    if backward and loss.requires_grad:
        loss.backward()
    return SavedMeasurement(total, rows)


def step_peak_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Peak of CPU memory allocated during one forward + cross-entropy + backward, above what
    was allocated before it (weights, buffers, ``x`` and ``y`` already exist), in bytes.

    Replays every allocation and free that torch.profiler records (``profile_memory=True``)
    in time order. Parameter gradients should be None before the call.
    """
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        F.cross_entropy(model(x), y).backward()
    records: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.tag == _EventType.Allocation:
            records.append((event.start_time_ns, event.extra_fields.alloc_size))
        stack.extend(event.children)
    live = peak = 0
    for _, size in sorted(records, key=lambda r: r[0]):
        live += size
        peak = max(peak, live)
    return peak
