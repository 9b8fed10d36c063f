"""Independent measurements (the truth the cost model is checked against).

``saved_bytes`` runs one real forward + loss under ``torch.autograd.graph.saved_tensors_hooks``
and sums the unique storages of the tensors autograd keeps, excluding the model's own
parameters and buffers; ``step_peak_bytes`` replays torch.profiler's allocation records of one
step; ``conv_backward_flops`` is a group-aware FLOP formula for ``FlopCounterMode``. Nothing
here uses memplan's cost model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..graph import LayerGraph


@dataclass
class SavedMeasurement:
    bytes: int  # unique storages, parameters and buffers excluded
    tensors: list[tuple[tuple[int, ...], str, int]] = field(default_factory=list)  # (shape, dtype, storage bytes)


def model_modules(model: nn.Module, graph: LayerGraph) -> None:
    """Point the graph's nodes at ``model``'s modules (the graph may come from a meta copy)."""
    for node in graph.nodes:
        if node.op == "call_module":
            node.module = model.get_submodule(node.scope)


def saved_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor, backward: bool = False) -> SavedMeasurement:
    """Bytes autograd saves during forward + cross-entropy loss (unique storages)."""
    own = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    kept: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(model(x), y)
    seen: set[int] = set()
    total = 0
    rows = []
    for t in kept:
        ptr = t.untyped_storage().data_ptr()
        nbytes = t.untyped_storage().nbytes()
        if ptr in own or (ptr in seen and nbytes > 0):
            continue
        seen.add(ptr)
        total += nbytes
        rows.append((tuple(t.shape), str(t.dtype).removeprefix("torch."), nbytes))
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


def conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                        *args, out_shape=None, **kwargs) -> int:
    """Group-aware FLOPs of ``aten.convolution_backward`` for ``FlopCounterMode(custom_mapping=...)``.

    torch 2.13's own formula over-counts the weight gradient of grouped / depthwise convs by
    the group factor. Here each requested gradient (``output_mask``) costs what the forward
    costs: 2 x out_numel x (C_in / groups) x kernel elements, computed from the shapes the
    autograd engine really passes.
    """
    from torch.utils.flop_counter import conv_flop_count

    output_mask = args[-1]
    fwd = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed=transposed)
    return fwd * int(bool(output_mask[0])) + fwd * int(bool(output_mask[1]))
