"""Costs of one plan on one traced graph under one accounting mode, as plain data
(:mod:`memplan.costs.records`).

All sizes are in bytes, all counts are integers. FLOP conventions are those of
``memplan.costs.flops``; memory conventions are those of the mode (``memplan.modes``).
"""

from __future__ import annotations

from typing import Any

from ..graph import LayerGraph
from ..graph.kinds import MAC_KINDS
from ..modes import Mode
from ..nn.train import OPTIMIZER_STATES
from ..plan import OpView, Plan, grad_flow, updated_weight_numel
from .flops import flops_of
from .records import CONVENTIONS, HIDDEN_KINDS, LayerCost, Profile, Saved, Totals


def _weight_bytes(numel: int, trained: int, itemsize: int, frozen_bits: int) -> int:
    frozen = numel - trained
    return trained * itemsize + (frozen * frozen_bits + 7) // 8


def layer_costs(op: OpView, mode: Mode, optimizer: str, frozen_bits: int) -> tuple[LayerCost, list[Saved] | None]:
    """Costs of one op; the saved list is None when the mode has no rule for its kind."""
    n = op.node
    wf = mode.weight_fraction(op.train.weight)
    fl = flops_of(op, wf)
    saved = mode.saved(op)
    lc = LayerCost(
        name=n.name, kind=n.kind, target=n.target, output_shape=list(n.out.shape) if n.out else [],
        block=n.block, grad_input=op.grad_input, grad_weight=op.train.weight, grad_bias=op.train.bias,
    )
    if fl is not None:
        lc.macs = fl.macs
        if n.kind in MAC_KINDS:
            lc.forward_flops = fl.forward
            lc.backward_grad_input_flops = fl.grad_input
            lc.backward_grad_weight_flops = fl.grad_weight
            lc.backward_grad_bias_flops = fl.grad_bias
            lc.backward_flops = fl.backward
        else:
            lc.forward_other_flops = fl.forward
            lc.backward_other_flops = fl.backward
    groups = n.attrs.get("groups", 1) or 1
    for pname, p in n.params.items():
        if pname == "weight":
            trained = updated_weight_numel(p.shape, groups, wf)
        else:
            trained = p.numel if (pname == "bias" and op.train.bias) else 0
        lc.params += p.numel
        lc.trainable_params += trained
        lc.weight_bytes += _weight_bytes(p.numel, trained, p.dtype.itemsize, min(frozen_bits, 8 * p.dtype.itemsize))
        lc.gradient_bytes += trained * p.dtype.itemsize
        lc.optimizer_bytes += OPTIMIZER_STATES[optimizer] * trained * p.dtype.itemsize
    return lc, saved


def compute(graph: LayerGraph, plan: Plan, mode: Mode, *, optimizer: str = "sgd", frozen_bits: int = 32,
            meta: dict[str, Any] | None = None) -> Profile:
    """Profile ``plan`` on ``graph`` under ``mode``. ``meta`` fills the descriptive fields."""
    views = grad_flow(graph, plan)
    totals = Totals()
    layers: list[LayerCost] = []
    saved_by_node: list[list[Saved]] = []
    unknown: dict[str, int] = {}
    counted: set[int] = set()
    all_layers: list[LayerCost] = []
    for op in views:
        lc, saved = layer_costs(op, mode, optimizer, frozen_bits)
        if saved is None or flops_of(op, 0.0) is None:
            unknown[op.node.target] = unknown.get(op.node.target, 0) + 1
            saved = []
        saved = [s for s in saved if s.storage not in graph.param_storages]  # parameters are not activations
        for s in saved:  # a shared storage is counted once, at the first op that keeps it
            if s.storage is None or s.storage not in counted:
                lc.saved_activation_bytes += s.nbytes
                lc.saved.append(f"{s.what} {s.nbytes} B")
                if s.storage is not None:
                    counted.add(s.storage)
        saved_by_node.append(saved)
        all_layers.append(lc)
        totals.add(lc)
        if op.node.kind not in HIDDEN_KINDS:
            layers.append(lc)
    summary = mode.summarize(graph, views, saved_by_node, all_layers, totals)
    totals.total_bytes, totals.peak_bytes = summary.total_bytes, summary.peak_bytes
    for lc, op in zip(all_layers, views):
        lc.total_bytes = lc.weight_bytes + lc.gradient_bytes + lc.optimizer_bytes + lc.saved_activation_bytes
        lc.peak_bytes = summary.at[op.node.index]
    meta = dict(meta or {})
    return Profile(
        model=meta.pop("model", graph.model_name), method=plan.method, mode=mode.name, batch=graph.batch,
        resolution=meta.pop("resolution", None), classes=meta.pop("classes", graph.classes),
        input_shape=list(graph.input_shape), optimizer=optimizer, frozen_bits=frozen_bits,
        options=dict(plan.options), totals=totals, layers=layers,
        peak_layer=graph.nodes[summary.peak_index].name, peak_phase=summary.peak_phase, unknown_ops=unknown,
        conventions={**CONVENTIONS, "mode": mode.description}, extras={**meta, **summary.extras},
    )
