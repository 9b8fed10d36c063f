"""Self-check on the user's own model: predicted saved bytes against one forward + loss run on
meta tensors under ``torch.autograd.graph.saved_tensors_hooks`` (no real compute).

The model runs with the plan's ``requires_grad`` and train / eval flags set the plain way
(``memplan.apply_plain`` semantics, on meta copies of its parameters: the model itself is not
changed), under :class:`~memplan.costs.observe.CpuLike` so that eval-mode batch norm saves the empty
statistics eager CPU saves. Every saved tensor is attributed to the innermost module running
when autograd packed it, and counted once (unique storages, parameters and buffers excluded),
as the prediction is. The result lists the modules where prediction and observation differ.
This checks the ``pytorch`` mode's prediction (what eager PyTorch saves).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from .costs.engine import layer_costs
from .costs.observe import CpuLike
from .graph import LayerGraph, role, select_output, train_mode
from .graph.kinds import NORM_KINDS
from .modes import get_mode
from .plan import Plan, grad_flow


@dataclass
class CheckRow:
    module: str  # qualname ("" = the model's own forward and the loss)
    predicted: int  # bytes
    observed: int  # bytes


@dataclass
class CheckResult:
    predicted: int  # saved activation bytes, pytorch mode
    observed: int  # saved bytes seen by saved_tensors_hooks on the meta run
    differing: list[CheckRow] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        return self.predicted == self.observed and not self.differing


def predicted_by_module(graph: LayerGraph, plan: Plan) -> dict[str, int]:
    """Predicted saved bytes (``pytorch`` mode) per innermost module, each storage counted once."""
    mode = get_mode("pytorch")
    by_module: dict[str, int] = {}
    counted: set[int] = set()
    for op in grad_flow(graph, plan):
        _, saved, _ = layer_costs(op, mode, "sgd", 32)
        for s in saved:
            if s.storage in graph.param_storages or (s.storage is not None and s.storage in counted):
                continue
            if s.storage is not None:
                counted.add(s.storage)
            by_module[op.node.scope] = by_module.get(op.node.scope, 0) + s.nbytes
    return by_module


def observed_by_module(model: nn.Module, graph: LayerGraph, plan: Plan) -> dict[str, int]:
    """Saved bytes per innermost module of one meta forward + cross-entropy under ``plan``."""
    names = {id(m): q for q, m in model.named_modules()}
    trains: dict[str, bool] = {}
    norm_flags: dict[str, bool] = {}
    for node in graph.nodes:
        t = plan.of(node)
        for pname, qual in node.uses.items():
            trains[qual] = trains.get(qual, False) or (t.weight > 0 if role(pname) == "weight" else t.bias)
        if node.kind in NORM_KINDS:
            norm_flags[node.layer or node.scope] = plan.uses_batch_stats(node)
    state = {q: torch.empty_like(p, device="meta").requires_grad_(trains.get(q, False))
             for q, p in model.named_parameters(remove_duplicate=False)}
    state.update({q: torch.empty_like(b, device="meta") for q, b in model.named_buffers(remove_duplicate=False)})
    own = {t.untyped_storage()._cdata for t in state.values()}
    stack: list[str] = [""]
    seen: set[int] = set()
    by_module: dict[str, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage()._cdata
        if key not in own and key not in seen:
            seen.add(key)
            by_module[stack[-1]] = by_module.get(stack[-1], 0) + t.untyped_storage().nbytes()
        return t

    def pre(m: nn.Module, args: tuple) -> None:
        stack.append(names.get(id(m), stack[-1]))

    def post(m: nn.Module, args: tuple, out: object) -> None:
        stack.pop()

    x = torch.empty(graph.input_shape, dtype=graph.nodes[0].out.dtype, device="meta")
    y = torch.empty((graph.batch,), dtype=torch.int64, device="meta")
    hooks = [nn.modules.module.register_module_forward_pre_hook(pre),
             nn.modules.module.register_module_forward_hook(post)]
    try:
        with train_mode(model):
            for qual, flag in norm_flags.items():
                model.get_submodule(qual).train(flag)
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), CpuLike():
                out = torch.func.functional_call(model, state, (x,))
                logits, _ = select_output(out, graph.output or None, graph.model_name)
                stack[:] = [""]
                F.cross_entropy(logits, y)
    finally:
        for h in hooks:
            h.remove()
    return by_module


def check(model: nn.Module, graph: LayerGraph, plan: Plan) -> CheckResult:
    """Compare the predicted saved bytes of ``plan`` on ``graph`` (traced from ``model``) with a
    meta run of ``model``; rows for every module where they differ."""
    predicted = predicted_by_module(graph, plan)
    observed = observed_by_module(model, graph, plan)
    rows = [CheckRow(m, predicted.get(m, 0), observed.get(m, 0)) for m in sorted(set(predicted) | set(observed))
            if predicted.get(m, 0) != observed.get(m, 0)]
    return CheckResult(sum(predicted.values()), sum(observed.values()), rows)
