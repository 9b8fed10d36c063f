"""Costs of one plan on one traced graph under one accounting mode, as plain data
(:mod:`memplan.costs.records`).

All sizes are in bytes, all counts are integers. FLOP conventions are those of
``memplan.costs.flops``; memory conventions are those of the mode (``memplan.modes``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .. import optim
from ..costs.flops import Flops, flops_of
from ..costs.observe import observe
from ..costs.peak import PeakOptions, check_schedule, in_place_update
from ..costs.records import CONVENTIONS, HIDDEN_KINDS, LayerCost, Profile, Saved, Totals
from ..costs.workspace import Calibration, load_calibration, workspaces
from ..errors import BadOption
from ..graph import LayerGraph, role
from ..graph.execution import with_recompute
from ..graph.kinds import MAC_KINDS
from ..modes import Mode
from ..names import DEFAULT_OPTIMIZER
from ..plan import OpView, Plan, grad_flow, updated_weight_numel
from .recompute import Recomputation, recompute


def _weight_bytes(numel: int, trained: int, itemsize: int, frozen_bits: int) -> int:
    frozen = numel - trained
    return trained * itemsize + (frozen * frozen_bits + 7) // 8


def layer_costs(op: OpView, mode: Mode, optimizer: str, frozen_bits: int) -> tuple[LayerCost, list[Saved], str]:
    """Costs of one op and what it keeps for backward; the third value says how it was costed:
    ``rule``, ``observed`` (no rule: replayed on meta, :mod:`.observe`) or ``bounded``
    (could not be replayed: the upper bound of its saved bytes is counted)."""
    n = op.node
    wf = mode.weight_fraction(op.weight_grad)
    fl = flops_of(op, wf)
    saved = mode.saved(op)
    how = "rule"
    lc = LayerCost(
        name=n.name,
        kind=n.kind,
        target=n.target,
        output_shape=list(n.out.shape) if n.out else [],
        block=n.block,
        grad_input=op.grad_input,
        grad_weight=op.weight_grad,
        grad_bias=op.bias_grad,
    )
    if saved is None or fl is None:
        obs = observe(op)
        how = "observed" if obs.saved is not None else "bounded"
        if saved is None:
            saved = list(obs.saved) if obs.saved is not None else [Saved(obs.bounds[1], None, "upper bound")]
        if fl is None:
            fl = Flops(
                forward=obs.forward_flops,
                grad_input=obs.grad_input_flops,
                grad_weight=obs.grad_weight_flops,
                grad_bias=obs.grad_bias_flops,
            )
            lc.macs = fl.forward // 2
            lc.forward_flops = fl.forward
            lc.backward_grad_input_flops, lc.backward_grad_weight_flops = fl.grad_input, fl.grad_weight
            lc.backward_grad_bias_flops, lc.backward_flops = fl.grad_bias, fl.backward
            fl = None
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
            trained = updated_weight_numel(p.shape, groups, wf if op.train.weight else 0.0)
        elif role(pname) == "weight":
            trained = p.numel if op.train.weight else 0
        else:
            trained = p.numel if op.train.bias else 0
        lc.params += p.numel
        lc.trainable_params += trained
        lc.weight_bytes += _weight_bytes(p.numel, trained, p.dtype.itemsize, min(frozen_bits, 8 * p.dtype.itemsize))
        lc.gradient_bytes += trained * p.dtype.itemsize
        lc.optimizer_bytes += optim.states(optimizer) * trained * p.dtype.itemsize
    return lc, saved, how


def compute(  # the one accounting entry point: costs, peak and totals in order
    graph: LayerGraph,
    plan: Plan,
    mode: Mode,
    *,
    optimizer: str = DEFAULT_OPTIMIZER,
    frozen_bits: int = 32,
    meta: dict[str, Any] | None = None,
    schedule: str | None = None,
    calibration: Calibration | str | None = "cpu",
    accumulated: bool = False,
) -> Profile:
    """Profile ``plan`` on ``graph`` under ``mode``. ``meta`` fills the descriptive fields.

    ``schedule``: the training step of the simulated peak (``memplan.costs.peak.SCHEDULES``:
    ``standard`` or ``tte``, updates applied in place during backward; None: the mode's default). ``calibration``: the
    kernel workspaces added to the peak in modes that model eager PyTorch kernels: this
    machine's calibration for a backend (``"cpu"`` / ``"cuda"``, :mod:`.workspace`), a file, a
    :class:`Calibration`, or None for none; ``Profile.workspace`` says what was used.
    ``accumulated``: the peak of a later micro-batch of gradient accumulation (the parameter
    gradients held from the start; ``memplan.costs.peak.PeakOptions``). ``plan.recompute``: those
    runs of blocks are checkpoint segments (``memplan.graph.execution.with_recompute``).
    ``plan.micro_batches`` > 1: ``graph`` is one micro-batch's, and the peak is ``accumulated``'s."""
    schedule = check_schedule(schedule or mode.default_schedule)
    accumulated = accumulated or plan.micro_batches > 1
    if accumulated and in_place_update(schedule):
        raise BadOption(
            f"gradient accumulation keeps the gradients until the optimizer step; schedule {schedule!r} applies "
            "each update in place during backward",
            "give --schedule standard",
        )
    graph = with_recompute(graph, plan.recompute)
    views = grad_flow(graph, plan)
    totals = Totals()
    layers: list[LayerCost] = []
    unknown: dict[str, int] = {}
    observed: dict[str, int] = {}
    costed = [layer_costs(op, mode, optimizer, frozen_bits) for op in views]
    for op, (_, _, how) in zip(views, costed):
        if how != "rule":
            tally = observed if how == "observed" else unknown
            tally[op.node.target] = tally.get(op.node.target, 0) + 1
    # parameters are not activations; checkpointed segments keep their inputs, their ops' items come back
    rc = recompute(graph, views, [[s for s in saved if not graph.is_weight(s.storage)] for _, saved, _ in costed])
    for k, v in rc.not_modelled.items():
        unknown[k] = unknown.get(k, 0) + v
    all_layers = [lc for lc, _, _ in costed]
    _count_saved(all_layers, rc.forward)
    for op, lc, runs in zip(views, all_layers, rc.runs):
        lc.recompute_flops, lc.recompute_other_flops = runs * lc.forward_flops, runs * lc.forward_other_flops
        totals.add(lc)
        if op.node.kind not in HIDDEN_KINDS:
            layers.append(lc)
    peak, workspace = _peak_options(views, mode, schedule, calibration)
    peak = replace(peak, recomputed=tuple(rc.again), held_gradients=tuple(rc.held_gradients), accumulated=accumulated)
    summary = mode.summarize(graph, views, rc.forward, all_layers, totals, peak)
    totals.total_bytes, totals.peak_bytes = summary.total_bytes, summary.peak_bytes
    for lc, op in zip(all_layers, views):
        lc.total_bytes = lc.weight_bytes + lc.gradient_bytes + lc.optimizer_bytes + lc.saved_activation_bytes
        lc.peak_bytes = summary.at[op.node.index]
    if graph.checkpoints:
        summary.extras["activation checkpointing"] = _checkpoint_note(rc, totals)
    meta = dict(meta or {})
    return Profile(
        model=meta.pop("model", graph.model_name),
        method=plan.method,
        mode=mode.name,
        batch=graph.batch,
        resolution=meta.pop("resolution", None),
        classes=meta.pop("classes", graph.classes),
        input_shape=list(graph.input_shape),
        optimizer=optimizer,
        frozen_bits=frozen_bits,
        options=dict(plan.options),
        totals=totals,
        layers=layers,
        peak_layer=graph.nodes[summary.peak_index].name,
        peak_phase=summary.peak_phase,
        unknown_ops=unknown,
        observed_ops=observed,
        capture=graph.capture,
        schedule=schedule,
        workspace=workspace,
        conventions={
            **CONVENTIONS,
            "mode": mode.description,
            **(_observed_convention(mode) if observed or unknown else {}),
        },
        extras={**meta, **summary.extras},
    )


def _count_saved(layers: list[LayerCost], saved: list[list[Saved]]) -> None:
    """Each layer's saved activation bytes: a shared storage counted once, at the first op keeping it."""
    counted: set[int] = set()
    for lc, items in zip(layers, saved):
        for s in items:
            if s.storage is None or s.storage not in counted:
                lc.saved_activation_bytes += s.nbytes
                lc.saved.append(f"{s.what} {s.nbytes} B")
                if s.storage is not None:
                    counted.add(s.storage)


def _checkpoint_note(rc: Recomputation, totals: Totals) -> str:
    """``Profile.extras["activation checkpointing"]``: the segments, what is recomputed, and what torch
    does that is no checkpointing (a reentrant segment whose parameters get no gradient)."""
    again = sum(s.nbytes for _, _, s in rc.again)
    text = (
        f"{rc.segments} segments: their inputs kept, {again:,} B saved again when the backward recomputes them; "
        f"recomputation {totals.recompute_flops:,} FLOPs (+{totals.recompute_other_flops:,} other)"
    )
    if rc.no_gradient:
        text += (
            f"; reentrant checkpoint with no input needing a gradient (torch runs it under no_grad): "
            f"no gradient reaches the parameters of {', '.join(rc.no_gradient)}"
        )
    return text


def _peak_options(
    views: list, mode: Mode, schedule: str, calibration: Calibration | str | None
) -> tuple[PeakOptions, dict[str, Any]]:
    """The simulated step's options and ``Profile.workspace``."""
    if not mode.kernel_workspaces:
        return PeakOptions(schedule), {
            "status": "not modelled",
            "source": f"mode {mode.name!r} does not run PyTorch kernels",
        }
    if calibration is None:
        return PeakOptions(schedule), {"status": "not modelled", "source": "no calibration requested"}
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    ws = workspaces(views, cal)
    if ws.status == "missing":
        return PeakOptions(schedule), ws.describe()
    return PeakOptions(schedule, ws.forward, ws.backward), ws.describe()


def _observed_convention(mode: Mode) -> dict[str, str]:
    text = (
        "ops without a cost rule (observed_ops) are costed by replaying them alone on meta tensors: what eager "
        "PyTorch saves for them, FLOPs of their conv / matmul work"
    )
    if not mode.eager_saved:
        text += f"; mode {mode.name!r} uses those observed bytes too"
    return {
        "observed": text + "; unknown_ops could not be replayed and count the upper bound of their inputs + outputs"
    }
