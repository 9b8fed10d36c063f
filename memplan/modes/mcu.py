"""Mode ``mcu``: peak SRAM of one training step on a microcontroller running the 256KB paper's
Tiny Training Engine (TTE; TinyEngine kernels, Lin et al., NeurIPS 2022, Sec. 2.3 and 3.1).

It builds on the ``tinytraining`` convention (its rules and :func:`.tinytraining.layer_bits`: the
8-bit kept inputs, 1-bit masks, 8-bit updated weight copies and 32-bit biases) and adds what the
paper's *measured* numbers also hold: the int8 working memory of the forward pass, the gradients
of the backward pass and the engine's runtime buffers, each alive only when the schedule needs
it. ``peak_bytes`` = ``total_bytes`` = the largest sum over the step; ``extras["mcu"]`` breaks
it down. Assumptions, each a choice where the paper is silent (README "Peak memory"):

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

import weakref
from dataclasses import asdict, dataclass, field
from typing import Any

from ..costs.peak import Step, simulate_step
from ..costs.records import LayerCost, Saved, Summary, Totals
from ..graph import LayerGraph, Node
from ..graph.kinds import ACTIVATIONS, FREE_KINDS, NORM_KINDS
from ..plan import OpView, Plan, grad_flow
from .base import Rule, register_mode
from .tinytraining import TinyTrainingMode, layer_bits, tinytraining

#: kinds that write into their input's buffer (folded or fused on the device)
ALIAS_KINDS = NORM_KINDS | ACTIVATIONS | FREE_KINDS | {"dropout"}
#: kinds whose output is smaller in space by their stride (counted for the patch stage split)
SPATIAL_KINDS = frozenset({"conv", "avgpool", "maxpool"})
GRAD_BYTES = 4  # fp32 gradients


@dataclass(frozen=True)
class McuSettings:
    """Knobs of the engine model (module docstring)."""

    patches: int = 2  # n x n patch-based initial stage (1: none)
    patch_downsamples: int = 3  # the stage ends with the block of this stride-2 op
    image_in_sram: bool = False  # the input image held in SRAM (with patches: no)
    accumulate_bytes: int = 0  # gradient-accumulation buffer per trainable element


@dataclass
class _Buffers:
    root: list[int]  # node -> index of the node whose buffer its output lives in
    size: dict[int, int] = field(default_factory=dict)  # root -> int8 bytes (max over aliases)
    last: dict[int, int] = field(default_factory=dict)  # root -> last forward consumer
    numel: dict[int, int] = field(default_factory=dict)  # root -> elements (for its gradient)


def _buffers(graph: LayerGraph) -> _Buffers:
    """Buffer of every node's output: aliases share their input's; an in-place depthwise conv
    shares its input's when it is that buffer's last consumer."""
    consumers: dict[int, list[int]] = {}
    for n in graph.nodes:
        for src in n.inputs:
            consumers.setdefault(src, []).append(n.index)
    b = _Buffers(list(range(len(graph.nodes))))
    for n in graph.nodes:
        if n.out is None or n.kind in ("param", "meta", "output") or n.out.storage in graph.param_storages:
            continue  # weights (in flash or counted as trainable copies), shape queries, the graph's end
        tensor_in = [i for i in n.inputs if graph.nodes[i].out is not None]
        if n.kind in ALIAS_KINDS and tensor_in and n.kind not in ("input",):
            b.root[n.index] = b.root[tensor_in[0]]
        elif _depthwise(n) and tensor_in:
            src = b.root[tensor_in[0]]
            later = [c for r, cs in consumers.items() if b.root[r] == src for c in cs if c > n.index]
            if not later:
                b.root[n.index] = src
        r = b.root[n.index]
        b.size[r] = max(b.size.get(r, 0), n.out.numel)
        b.numel[r] = max(b.numel.get(r, 0), n.out.numel)
    for n in graph.nodes:
        for src in n.inputs:
            r = b.root[src]
            if b.root[n.index] != r:
                b.last[r] = max(b.last.get(r, 0), n.index)
    return b


def _depthwise(n: Node) -> bool:
    w = n.params.get("weight")
    return n.kind == "conv" and w is not None and len(w.shape) > 2 and w.shape[1] == 1 and \
        (n.attrs.get("groups") or 1) == w.shape[0] > 1


def runtime_buffers(n: Node, extent: tuple[int, ...] | None = None) -> tuple[int, int]:
    """TinyEngine's (sbuf, kbuf) bytes of one op: im2col of an int8 conv (k^2 C_in x 2 columns x
    16 bit), 2 x padded input plane of an in-place depthwise conv, 16-bit weights of a k > 1 conv."""
    w = n.params.get("weight")
    if n.kind == "linear" and w is not None:
        return w.shape[1] * 4, 0
    if n.kind != "conv" or w is None or len(w.shape) < 3:
        return 0, 0
    ks = w.shape[2:]
    k = 1
    for s in ks:
        k *= s
    if _depthwise(n):
        pads = n.attrs.get("padding") or (0,) * len(ks)
        pads = pads if isinstance(pads, (tuple, list)) else (0,) * len(ks)
        dims = extent or n.in_tensors[0].shape[2:]
        plane = 1
        for d, p in zip(dims, pads):
            plane *= d + 2 * p
        return 2 * plane, 0
    return k * n.in_tensors[0].shape[1] * 4, (2 * k * w.shape[0] * w.shape[1] if k > 1 else 0)


def _spatial(t: Any) -> tuple[int, ...]:
    return tuple(t.shape[2:]) if t is not None and len(t.shape) >= 3 else ()


def _window(n: Node, extent: tuple[int, ...]) -> tuple[int, ...]:
    """Input extent a conv / pool needs for an output extent (receptive field of one op)."""
    a = n.attrs
    w = n.params.get("weight")
    ks = a.get("kernel_size") or (tuple(w.shape[2:]) if w is not None else None)
    if n.kind not in SPATIAL_KINDS or ks is None:
        return extent
    ks = ks if isinstance(ks, (tuple, list)) else (ks,) * len(extent)
    st = a.get("stride") or ks
    st = st if isinstance(st, (tuple, list)) else (st,) * len(extent)
    dil = a.get("dilation") or (1,) * len(extent)
    dil = dil if isinstance(dil, (tuple, list)) else (dil,) * len(extent)
    return tuple((e - 1) * s + (k - 1) * d + 1 for e, s, k, d in zip(extent, st, ks, dil))


@dataclass
class PatchStage:
    """The patch-based initial stage: its last node, its output buffer and per-buffer patch extents."""

    end: int
    output: int  # root of the stage output buffer (held whole)
    extent: dict[int, tuple[int, ...]]  # root -> spatial extent of one patch


def patch_stage(graph: LayerGraph, buf: _Buffers, settings: McuSettings) -> PatchStage | None:
    """MCUNetV2's initial stage under ``settings`` (None: no patches, or no single-tensor split)."""
    if settings.patches <= 1:
        return None
    count, end = 0, None
    for n in graph.nodes:
        if n.kind in SPATIAL_KINDS and _spatial(n.out) and n.out.shape[2] < n.in_tensors[0].shape[2]:
            count += 1
            if count == settings.patch_downsamples:
                end = graph.block_range(n.block)[1] if n.block else n.index
                break
    if end is None:
        return None
    crossing = {buf.root[s] for m in graph.nodes[end + 1:] for s in m.inputs if s <= end
                and graph.nodes[s].out is not None and graph.nodes[s].kind != "param"}
    if len(crossing) != 1:
        return None
    out = crossing.pop()
    full = _spatial(graph.nodes[out].out)
    if not full:
        return None
    need: dict[int, tuple[int, ...]] = {i: tuple(-(-d // settings.patches) for d in full)
                                        for i in range(end + 1) if buf.root[i] == out}
    for n in reversed(graph.nodes[:end + 1]):
        if n.index not in need:
            continue
        ext = _window(n, need[n.index])
        for s in n.inputs:
            dims = _spatial(graph.nodes[s].out)
            if len(dims) == len(ext):
                mine = tuple(min(e, d) for e, d in zip(ext, dims))
                need[s] = tuple(max(a, b) for a, b in zip(need.get(s, mine), mine))
    extent: dict[int, tuple[int, ...]] = {}
    for i, e in need.items():
        r = buf.root[i]
        extent[r] = tuple(max(a, b) for a, b in zip(extent.get(r, e), e))
    return PatchStage(end, out, extent)


class McuMode(TinyTrainingMode):
    """``tinytraining``'s rules and extras, with the peak of the engine's schedule (module docstring)."""

    default_schedule = "tte"
    extra_only = False

    def __init__(self, name: str, settings: McuSettings, description: str):
        self.name, self.settings, self.description = name, settings, description
        super().__init__()

    def quick_total(self, graph: LayerGraph, plan: Plan) -> int:
        """The peak of the default schedule, straight from the schedule (equals ``compute``'s)."""
        return simulate(graph, grad_flow(graph, plan), self.settings, self.default_schedule)["peak"]

    def find_rule(self, kind: str) -> Rule | None:
        """``tinytraining``'s rules: the kept inputs and masks."""
        return tinytraining.find_rule(kind)

    def summarize(self, graph: LayerGraph, views: list[OpView], saved: list[list[Saved]],
                  node_costs: list[LayerCost], totals: Totals, peak: Any = None) -> Summary:
        base = super().summarize(graph, views, saved, node_costs, totals)
        schedule = getattr(peak, "schedule", None) or self.default_schedule
        steps = simulate(graph, views, self.settings, schedule)
        extras = {**base.extras, "mcu": {**steps.pop("extras"), "settings": asdict(self.settings),
                                         "schedule": schedule}}
        return Summary(steps["peak"], steps["peak"], steps["where"], steps["phase"], steps["at"], extras)


@dataclass
class _Layout:
    """What does not depend on the plan: buffers, patch stage, forward activation bytes per op and
    the runtime buffers (cached per graph and settings)."""

    buf: _Buffers
    stage: PatchStage | None
    activations: list[int]  # int8 forward buffers alive while each op runs
    sbuf: int
    kbuf: int


_LAYOUTS: weakref.WeakKeyDictionary[LayerGraph, dict[McuSettings, _Layout]] = weakref.WeakKeyDictionary()


def _layout(graph: LayerGraph, settings: McuSettings) -> _Layout:
    cached = _LAYOUTS.setdefault(graph, {})
    if settings in cached:
        return cached[settings]
    n = len(graph.nodes)
    buf = _buffers(graph)
    stage = patch_stage(graph, buf, settings)
    ext = stage.extent if stage else {}

    def patch_size(r: int) -> int:
        node = graph.nodes[r]
        if r not in ext or r == stage.output or not _spatial(node.out):
            return buf.size[r]
        per = node.out.shape[0] * node.out.shape[1]
        for e in ext[r]:
            per *= e
        return min(per, buf.size[r])

    act = [0] * (n + 1)
    for r, sz in buf.size.items():
        if graph.nodes[r].kind == "input" and not settings.image_in_sram and not stage:
            continue
        start = 0 if stage and r == stage.output else r
        last = min(n - 1, max(buf.last.get(r, r), r))
        if stage and start <= stage.end:  # per-patch size inside the stage, whole after it
            split = min(last, stage.end)
            act[start] += patch_size(r)
            act[split + 1] -= patch_size(r)
            start = split + 1
        if start <= last:
            act[start] += sz
            act[last + 1] -= sz
    for i in range(1, n + 1):
        act[i] += act[i - 1]
    sbuf = kbuf = 0
    for node in graph.nodes:
        e = ext.get(buf.root[node.inputs[0]]) if node.inputs and stage and node.index <= stage.end else None
        s, k = runtime_buffers(node, e)
        sbuf, kbuf = max(sbuf, s), max(kbuf, k)
    cached[settings] = _Layout(buf, stage, act[:n], sbuf, kbuf)
    return cached[settings]


def simulate(graph: LayerGraph, views: list[OpView], settings: McuSettings, schedule: str) -> dict[str, Any]:
    """Peak, where, phase, per-op bytes and a breakdown of one training step (module docstring),
    through the peak core :func:`memplan.costs.peak.simulate_step`."""
    n = len(graph.nodes)
    lay = _layout(graph, settings)
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
    if schedule == "tte":  # weight gradients fused into the in-place update; the bias gradient
        param_grads = [b.bias // 32 * GRAD_BYTES for b in bits]
    else:
        param_grads = [(b.weight // 8 + b.bias // 32) * GRAD_BYTES for b in bits]
    step = Step([a + k for a, k in zip(lay.activations, kept_at)], held, [m + k for m, k in zip(masks, kept)],
                grad_at, release, param_grads, [v.req_out for v in views], in_place_update=schedule == "tte")
    result = simulate_step(step, static)
    peak, where, phase, at = result.peak, result.where, result.phase, result.at
    if phase == "backward":
        parts = {"gradients": result.parts["gradients"], "param_grads": result.parts["param_grads"],
                 "kept_for_backward": result.parts["held"]}
    else:
        parts = {"activations": lay.activations[where], "kept_for_backward": kept_at[where]} if peak else {}
    extras = {"peak_kib": peak / 1024, "peak_op": graph.nodes[where].name, "phase": phase,
              "static": {"trainable_params": trainable, "sbuf": lay.sbuf, "kbuf": lay.kbuf,
                         "accumulation": elements * settings.accumulate_bytes},
              "at_peak": parts, "patch_stage_end": graph.nodes[lay.stage.end].name if lay.stage else None}
    return {"peak": peak, "where": where, "phase": phase, "at": at, "extras": extras}


mcu = register_mode(McuMode("mcu", McuSettings(), "peak SRAM on a microcontroller under the Tiny Training Engine: "
                            "int8 forward (2x2 patch-based first stage), fp32 gradients, in-place updates, "
                            "tinytraining's kept tensors and weight copies"))
mcu_nopatch = register_mode(McuMode("mcu-nopatch", McuSettings(patches=1, image_in_sram=True),
                                    "mcu without the patch-based first stage (whole tensors, image in SRAM)"))
mcu_accum = register_mode(McuMode("mcu-accum", McuSettings(accumulate_bytes=4),
                                  "mcu with gradient accumulation (a 32-bit buffer per trainable element)"))
