"""Self-check on the user's own model: predicted saved bytes against one real CPU forward + loss
of that model under ``torch.autograd.graph.saved_tensors_hooks`` (:class:`~memplan.graph.saved.SavedObserver`).

The model runs as the user runs it, eager on the CPU, at the graph's (small) batch: the kernels
the CPU picks are the kernels observed (an attention call that dispatches to the flash kernel
is observed as flash). Its parameters take the plan's ``requires_grad`` and the modules the
plan's train / eval flags (``memplan.apply_plain`` semantics) on detached views and cloned
buffers, so the model itself is not changed; parameters still on the meta device (a zoo model
built without weights) get seeded random values. Every saved storage is attributed to the
innermost module running and the torch call packing it, and counted once (unique storages,
parameters and buffers excluded), as the prediction is. The result lists the modules where
prediction and observation differ, with the nodes predicted there and what each saved, and
what was observed. This checks the ``pytorch`` mode's prediction (what eager PyTorch saves).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .accounting.engine import layer_costs
from .accounting.recompute import KEPT, recompute
from .graph import LayerGraph, role, select_output, train_mode
from .graph.kinds import NORM_KINDS
from .graph.saved import SavedObserver
from .modes import get_mode
from .names import DEFAULT_OPTIMIZER
from .plan import Plan, grad_flow
from .strategies import as_prepared

#: batch of the real run ``memplan profile --check`` observes (the profile's own batch if smaller)
CHECK_BATCH = 2


@dataclass
class CheckRow:
    module: str  # qualname ("" = the model's own forward and the loss)
    predicted: int  # bytes
    observed: int  # bytes
    predicted_items: list[str] = field(default_factory=list)  # "node (kind): what N B"
    observed_items: list[str] = field(default_factory=list)  # "call: (shape) dtype N B"


@dataclass
class CheckResult:
    predicted: int  # saved activation bytes, pytorch mode
    observed: int  # saved bytes seen by saved_tensors_hooks on the real CPU run
    batch: int = 0  # batch of the checked graph and run
    device: str = "cpu"
    differing: list[CheckRow] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        return self.predicted == self.observed and not self.differing


def predicted_by_module(graph: LayerGraph, plan: Plan) -> dict[str, list[tuple[str, int]]]:
    """Predicted saved items (``pytorch`` mode) per innermost module, each storage counted once:
    module -> [(description, bytes)]."""
    mode = get_mode("pytorch")
    by_module: dict[str, list[tuple[str, int]]] = {}
    counted: set[int] = set()
    views = grad_flow(graph, plan)
    saved = [
        [s for s in layer_costs(op, mode, DEFAULT_OPTIMIZER, 32)[1] if not graph.is_weight(s.storage)] for op in views
    ]
    rc = recompute(graph, views, saved)  # a checkpointed segment keeps its inputs, packed by the module calling it
    for op, items in zip(views, rc.forward):
        for s in items:
            if s.storage is not None and s.storage in counted:
                continue
            if s.storage is not None:
                counted.add(s.storage)
            item = f"{op.node.name} ({op.kind}): {s.what or 'tensor'} {s.nbytes} B"
            scope = graph.checkpoints[rc.keepers[op.node.index]].scope if s.what == KEPT else op.node.scope
            by_module.setdefault(scope, []).append((item, s.nbytes))
    return by_module


class _Calls(TorchFunctionMode):
    """Names the outermost torch call running (what packs a saved tensor); observes only."""

    def __init__(self) -> None:
        super().__init__()
        self.current = "forward"

    def __torch_function__(self, func, types, args=(), kwargs=None):
        outer, self.current = self.current, getattr(func, "__name__", str(func))
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.current = outer


def _real(t: torch.Tensor, buffer: bool, gen: torch.Generator) -> torch.Tensor:
    """``t`` detached (a view of the user's tensor), a clone for a buffer (train mode updates
    running statistics in place); seeded values for a tensor on the meta device."""
    if t.is_meta:
        if not t.is_floating_point():
            return torch.zeros(t.shape, dtype=t.dtype)
        if buffer:
            return torch.ones(t.shape, dtype=t.dtype)
        return torch.randn(t.shape, generator=gen, dtype=t.dtype) * 0.02
    return t.detach().clone() if buffer else t.detach()


def observed_by_module(model: nn.Module, graph: LayerGraph, plan: Plan) -> dict[str, list[tuple[str, int]]]:
    """Saved storages per innermost module of one real CPU forward + cross-entropy of ``model`` under
    ``plan`` at the graph's input shape: module -> [(description, bytes)]."""
    names = {id(m): q for q, m in model.named_modules()}
    trains: dict[str, bool] = {}
    norm_flags: dict[str, bool] = {}
    for node in graph.nodes:
        t = plan.of(node)
        for pname, qual in node.uses.items():
            trains[qual] = trains.get(qual, False) or (t.weight > 0 if role(pname) == "weight" else t.bias)
        if node.kind in NORM_KINDS:
            norm_flags[node.layer or node.scope] = plan.uses_batch_stats(node)
    gen = torch.Generator().manual_seed(0)
    state = {
        q: _real(p, False, gen).requires_grad_(trains.get(q, False) and p.is_floating_point())
        for q, p in model.named_parameters(remove_duplicate=False)
    }
    state.update({q: _real(b, True, gen) for q, b in model.named_buffers(remove_duplicate=False)})
    stack: list[str] = [""]
    calls = _Calls()

    def pre(m: nn.Module, args: tuple) -> None:
        stack.append(names.get(id(m), stack[-1]))

    def post(m: nn.Module, args: tuple, out: object) -> None:
        stack.pop()

    dtype = graph.nodes[0].out.dtype
    x = (
        torch.randn(graph.input_shape, generator=gen).to(dtype)
        if dtype.is_floating_point
        else torch.zeros(graph.input_shape, dtype=dtype)
    )
    y = torch.zeros((graph.batch,), dtype=torch.int64)
    hooks = [
        nn.modules.module.register_module_forward_pre_hook(pre),
        nn.modules.module.register_module_forward_hook(post),
    ]
    # a constant the model reads from outside itself (a cached index) is counted where an op saves
    # it, as in the prediction (``LayerGraph.constant_storages``)
    observer = SavedObserver(exclude=state.values(), where=lambda: (stack[-1], calls.current))
    try:
        with contextlib.nullcontext() if as_prepared(plan.method) else train_mode(model):
            for qual, flag in norm_flags.items():
                model.get_submodule(qual).train(flag)
            amp = torch.autocast("cpu", dtype=graph.amp or torch.bfloat16, enabled=graph.amp is not None)
            with torch.enable_grad(), amp, observer, calls:
                out = torch.func.functional_call(model, state, (x,))
                logits, _ = select_output(out, graph.output or None, graph.model_name)
                stack[:] = [""]
                loss = F.cross_entropy(logits, y)
    finally:
        for h in hooks:
            h.remove()
    by_module: dict[str, list[tuple[str, int]]] = {}
    for r in observer.records:
        module, call = r.where
        by_module.setdefault(module, []).append((f"{call}: {r.describe()}", r.nbytes))
    del loss, out, logits, observer  # frees the autograd graph of the run
    return by_module


def check(model: nn.Module, graph: LayerGraph, plan: Plan) -> CheckResult:
    """Compare the predicted saved bytes of ``plan`` on ``graph`` (traced from ``model``) with a
    real CPU run of ``model`` at the graph's input shape; rows for every module where they differ,
    naming the nodes predicted there and what the run saved."""
    predicted = predicted_by_module(graph, plan)
    observed = observed_by_module(model, graph, plan)
    rows = []
    for m in sorted(set(predicted) | set(observed)):
        p, o = predicted.get(m, []), observed.get(m, [])
        pb, ob = sum(n for _, n in p), sum(n for _, n in o)
        if pb != ob:
            rows.append(CheckRow(m, pb, ob, [d for d, _ in p], [d for d, _ in o]))
    total_p = sum(n for items in predicted.values() for _, n in items)
    total_o = sum(n for items in observed.values() for _, n in items)
    return CheckResult(total_p, total_o, graph.batch, "cpu", rows)
