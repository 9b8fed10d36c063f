"""Mode ``mcu``: peak SRAM of one training step on a microcontroller running the 256KB paper's
Tiny Training Engine (TTE; TinyEngine kernels, Lin et al., NeurIPS 2022, Sec. 2.3 and 3.1).

It builds on the ``tinytraining`` convention (its rules and :func:`.tinytraining.layer_bits`: the
8-bit kept inputs, 1-bit masks, 8-bit updated weight copies and 32-bit biases) and adds what the
paper's *measured* numbers also hold: the int8 working memory of the forward pass, the gradients
of the backward pass and the engine's runtime buffers, each alive only when the schedule needs
it. ``peak_bytes`` = ``total_bytes`` = the largest sum over the step; ``extras["mcu"]`` breaks
it down. Assumptions, each a choice where the paper is silent (docs/howto/peak.md):

===================  =========================================================================
what                 assumption (source)
===================  =========================================================================
frozen weights       in flash, not SRAM (paper Sec. 2.2: updated weights need an SRAM copy)
trainable params     SRAM for the whole step: ``tinytraining``'s 8-bit weight copies (selected
                     channels) and 32-bit biases (TinyEngine: globals, not in the arena)
forward activations  int8, one buffer per conv / linear / add / pool / concat output; BN folded
                     and activations fused into the conv (no buffer of their own); a buffer lives
                     from its producer to its last consumer (TinyEngine's liveness)
depthwise conv       in place: its output overwrites its input when it is the input's last
                     consumer (TinyEngine ``*_inplace`` kernels)
patch-based stage    ``mcu``: MCUNetV2's n x n patches (n = 2, the paper's Sec. 3.1 setting) for
                     the initial stage, which ends with the block of the third stride-2 op
                     (output stride 8, TinyEngine's default); per patch, each tensor has the
                     extent its consumers' receptive fields need; the stage output is held whole;
                     the camera image is not in SRAM (the patches read it). ``mcu-nopatch``:
                     whole tensors, the image in SRAM (TinyEngine's training demo)
runtime buffers      TinyEngine's im2col ``sbuf`` (conv: k^2 C_in x 4 B; in-place depthwise:
                     2 (H + 2p)(W + 2p) B) and ``kbuf`` (k > 1 convs: 2 x weight bytes), their
                     largest over the model, for the whole step (TinyEngine's peak formula)
saved for backward   ``tinytraining``'s kept inputs and masks, from their producer's forward to
                     their op's backward
gradients            fp32 activation gradients (the released TTE graphs cast to float), alive
                     from the backward of their last consumer to that of their producer;
                     depthwise backward in place; ReLU / BN backward in place (masks, scales)
parameter gradients  ``tte`` (default, "sparse update + reorder"): fused into the in-place
                     update, only the bias gradient (fp32) of the running op; ``standard``
                     ("sparse update", no reorder): fp32 for every trainable element, kept
                     until the end of backward
gradient accum.      ``mcu-accum``: a 32-bit buffer per trainable element for the whole step
batch                the traced batch (the paper: 1); loss / logits (fp32, classes) counted
===================  =========================================================================
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ..costs.peak import Step, in_place_update, simulate_step
from ..costs.records import LayerCost, Saved, Summary, Totals
from ..graph import LayerGraph
from ..plan import OpView, Plan, grad_flow
from .base import Rule, register_mode
from .mcu_layout import ALIAS_KINDS, McuSettings, layout
from .tinytraining import TinyTrainingMode, layer_bits, tinytraining

GRAD_BYTES = 4  # fp32 gradients


class McuMode(TinyTrainingMode):
    """``tinytraining``'s rules and extras, with the peak of the engine's schedule (module docstring)."""

    default_schedule = "tte"
    extra_only = False
    conv_update_table = False  # Figure 11a is tinytraining's own view, not the MCU peak's
    recompute = False  # the engine's schedule runs no recomputation: its peak ignores segments

    def __init__(self, name: str, settings: McuSettings, description: str):
        self.name, self.settings, self.description = name, settings, description
        super().__init__()

    def quick_total(self, graph: LayerGraph, plan: Plan) -> int:
        """The peak of the default schedule, straight from the schedule (equals ``compute``'s)."""
        return simulate(graph, grad_flow(graph, plan), self.settings, self.default_schedule)["peak"]

    def find_rule(self, kind: str) -> Rule | None:
        """``tinytraining``'s rules: the kept inputs and masks."""
        return tinytraining.find_rule(kind)

    def summarize(
        self,
        graph: LayerGraph,
        views: list[OpView],
        saved: list[list[Saved]],
        node_costs: list[LayerCost],
        totals: Totals,
        peak: Any = None,
    ) -> Summary:
        base = super().summarize(graph, views, saved, node_costs, totals)
        schedule = getattr(peak, "schedule", None) or self.default_schedule
        steps = simulate(graph, views, self.settings, schedule)
        extras = {
            **base.extras,
            "mcu": {**steps.pop("extras"), "settings": asdict(self.settings), "schedule": schedule},
        }
        return Summary(steps["peak"], steps["peak"], steps["where"], steps["phase"], steps["at"], extras)


def simulate(graph: LayerGraph, views: list[OpView], settings: McuSettings, schedule: str) -> dict[str, Any]:
    """Peak, where, phase, per-op bytes and a breakdown of one training step (module docstring),
    through the peak core :func:`memplan.costs.peak.simulate_step`."""
    n = len(graph.nodes)
    lay = layout(graph, settings)
    buf = lay.buf
    bits = [layer_bits(op) for op in views]
    trainable = sum(b.params for b in bits) // 8
    elements = sum(b.weight // 8 + b.bias // 32 for b in bits)
    static = trainable + lay.sbuf + lay.kbuf + elements * settings.accumulate_bytes
    kept = [b.input // 8 for b in bits]
    masks = [-(-b.mask // 8) for b in bits]
    kept_at = [0] * n  # forward: kept tensors so far (a kept input from after its op)
    held = 0
    for i in range(n):
        held += masks[i] + (kept[i - 1] if i else 0)
        kept_at[i] = held
    held += kept[n - 1]
    first_bwd: dict[int, int] = {}  # gradient of buffer r: from the backward of its last consumer to r's
    for node in graph.nodes:
        if views[node.index].req_out and node.kind not in ALIAS_KINDS:
            for s in node.inputs:
                r = buf.root[s]
                if r in buf.numel and views[r].req_out and r != buf.root[node.index]:
                    first_bwd[r] = max(first_bwd.get(r, -1), node.index)
    grad_at, release = [0] * n, [0] * n
    for r, i in first_bwd.items():
        grad_at[i] += buf.numel[r] * GRAD_BYTES
        release[r] += buf.numel[r] * GRAD_BYTES
    if in_place_update(schedule):  # weight gradients fused into the in-place update; the bias gradient
        param_grads = [b.bias // 32 * GRAD_BYTES for b in bits]
    else:
        param_grads = [(b.weight // 8 + b.bias // 32) * GRAD_BYTES for b in bits]
    step = Step(
        [a + k for a, k in zip(lay.activations, kept_at)],
        held,
        [m + k for m, k in zip(masks, kept)],
        grad_at,
        release,
        param_grads,
        [v.req_out for v in views],
        in_place_update=in_place_update(schedule),
    )
    result = simulate_step(step, static)
    peak, where, phase, at = result.peak, result.where, result.phase, result.at
    if phase == "backward":
        parts = {
            "gradients": result.parts["gradients"],
            "param_grads": result.parts["param_grads"],
            "kept_for_backward": result.parts["held"],
        }
    else:
        parts = {"activations": lay.activations[where], "kept_for_backward": kept_at[where]} if peak else {}
    extras = {
        "peak_kib": peak / 1024,
        "peak_op": graph.nodes[where].name,
        "phase": phase,
        "static": {
            "trainable_params": trainable,
            "sbuf": lay.sbuf,
            "kbuf": lay.kbuf,
            "accumulation": elements * settings.accumulate_bytes,
        },
        "at_peak": parts,
        "patch_stage_end": graph.nodes[lay.stage.end].name if lay.stage else None,
    }
    return {"peak": peak, "where": where, "phase": phase, "at": at, "extras": extras}


mcu = register_mode(
    McuMode(
        "mcu",
        McuSettings(),
        "peak SRAM on a microcontroller under the Tiny Training Engine: "
        "int8 forward (2x2 patch-based first stage), fp32 gradients, in-place updates, "
        "tinytraining's kept tensors and weight copies",
    )
)
mcu_nopatch = register_mode(
    McuMode(
        "mcu-nopatch",
        McuSettings(patches=1, image_in_sram=True),
        "mcu without the patch-based first stage (whole tensors, image in SRAM)",
    )
)
mcu_accum = register_mode(
    McuMode(
        "mcu-accum",
        McuSettings(accumulate_bytes=4),
        "mcu with gradient accumulation (a 32-bit buffer per trainable element)",
    )
)
