"""The plan-independent side of the ``mcu`` mode's engine model (:mod:`.mcu`): which buffer each
op's int8 output lives in (aliases, in-place depthwise convs), MCUNetV2's patch-based initial stage,
TinyEngine's runtime buffers, and the forward activation bytes alive at each op. Bytes throughout."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from ..graph import LayerGraph, Node
from ..graph.kinds import ACTIVATIONS, FREE_KINDS, NORM_KINDS

#: kinds that write into their input's buffer (folded or fused on the device)
ALIAS_KINDS = NORM_KINDS | ACTIVATIONS | FREE_KINDS | {"dropout"}
#: kinds whose output is smaller in space by their stride (counted for the patch stage split)
SPATIAL_KINDS = frozenset({"conv", "avgpool", "maxpool"})


@dataclass(frozen=True)
class McuSettings:
    """Knobs of the engine model (module docstring)."""

    patches: int = 2  # n x n patch-based initial stage (1: none)
    patch_downsamples: int = 3  # the stage ends with the block of this stride-2 op
    image_in_sram: bool = False  # the input image held in SRAM (with patches: no)
    accumulate_bytes: int = 0  # gradient-accumulation buffer per trainable element


@dataclass
class Buffers:
    root: list[int]  # node -> index of the node whose buffer its output lives in
    size: dict[int, int] = field(default_factory=dict)  # root -> int8 bytes (max over aliases)
    last: dict[int, int] = field(default_factory=dict)  # root -> last forward consumer
    numel: dict[int, int] = field(default_factory=dict)  # root -> elements (for its gradient)


def buffers(graph: LayerGraph) -> Buffers:
    """Buffer of every node's output: aliases share their input's; an in-place depthwise conv
    shares its input's when it is that buffer's last consumer."""
    consumers: dict[int, list[int]] = {}
    for n in graph.nodes:
        for src in n.inputs:
            consumers.setdefault(src, []).append(n.index)
    b = Buffers(list(range(len(graph.nodes))))
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
    return (
        n.kind == "conv"
        and w is not None
        and len(w.shape) > 2
        and w.shape[1] == 1
        and (n.attrs.get("groups") or 1) == w.shape[0] > 1
    )


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


def patch_stage(graph: LayerGraph, buf: Buffers, settings: McuSettings) -> PatchStage | None:
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
    crossing = {
        buf.root[s]
        for m in graph.nodes[end + 1 :]
        for s in m.inputs
        if s <= end and graph.nodes[s].out is not None and graph.nodes[s].kind != "param"
    }
    if len(crossing) != 1:
        return None
    out = crossing.pop()
    full = _spatial(graph.nodes[out].out)
    if not full:
        return None
    need: dict[int, tuple[int, ...]] = {
        i: tuple(-(-d // settings.patches) for d in full) for i in range(end + 1) if buf.root[i] == out
    }
    for n in reversed(graph.nodes[: end + 1]):
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


@dataclass
class Layout:
    """What does not depend on the plan: buffers, patch stage, forward activation bytes per op and
    the runtime buffers (cached per graph and settings)."""

    buf: Buffers
    stage: PatchStage | None
    activations: list[int]  # int8 forward buffers alive while each op runs
    sbuf: int
    kbuf: int


_LAYOUTS: weakref.WeakKeyDictionary[LayerGraph, dict[McuSettings, Layout]] = weakref.WeakKeyDictionary()


def layout(graph: LayerGraph, settings: McuSettings) -> Layout:
    cached = _LAYOUTS.setdefault(graph, {})
    if settings in cached:
        return cached[settings]
    n = len(graph.nodes)
    buf = buffers(graph)
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
    cached[settings] = Layout(buf, stage, act[:n], sbuf, kbuf)
    return cached[settings]
