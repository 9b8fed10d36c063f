"""Feature cache (Yang et al., "Cache and Reuse: Rethinking the Efficiency of On-device
Transfer Learning", CVPRW 2023): the frozen prefix of a model runs once per split point and
its output is reused by every run, seed, epoch and evaluation that shares it.

The model is cut with ``torch.fx`` at a layer: the *prefix* computes every value that the
layer and the nodes after it read (the "frontier": usually one tensor, two inside a residual
block), the *suffix* takes those values as inputs. With the prefix frozen and its norms in
eval mode (no augmentation), the prefix output is a deterministic function of the sample,
so the fp32 cache is exact. ``bits`` compresses it with the paper's channel-wise quantile
quantisation (Eq. 2-3): per channel, ``b = Q_k``, ``s = (2^n - 1) / (Q_{1-k} - Q_k)``,
``q = clamp(round(s (y - b)), 0, 2^n - 1)`` stored as uint8, decoded as ``q / s + b``
(quantiles over all train samples and positions of the channel, k = 1 %).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn as nn
from torch import Tensor

from ..errors import MemplanError

QUANTILE = 0.01  # k of Eq. 2: the clipping quantile
EVAL_CHUNK = 512  # samples per forward when filling the cache or evaluating


def _find(gm: fx.GraphModule, layer: str) -> int:
    for i, n in enumerate(gm.graph.nodes):
        if n.op == "call_module" and n.target == layer:
            return i
    raise MemplanError(f"layer {layer!r} is not a module call of the traced model")


def split(gm: fx.GraphModule, layer: str) -> tuple[fx.Graph, fx.Graph, list[str]]:
    """(prefix graph, suffix graph, frontier names) of ``gm`` cut before the first call of ``layer``.

    The prefix returns a tuple of the frontier values; the suffix takes them as placeholders
    (same names) and returns the model output. ``get_attr`` nodes are copied into the
    suffix instead of being cached (a parameter used functionally may train).
    """
    nodes = list(gm.graph.nodes)
    cut = _find(gm, layer)
    pos = {n: i for i, n in enumerate(nodes)}
    head, tail = nodes[:cut], nodes[cut:]
    frontier = [n for n in head if n.op != "get_attr" and any(pos[u] >= cut for u in n.users)]
    attrs = [n for n in head if n.op == "get_attr" and any(pos[u] >= cut for u in n.users)]

    prefix = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in head:
        env[n] = prefix.node_copy(n, lambda a: env[a])
    prefix.output(tuple(env[n] for n in frontier))

    suffix = fx.Graph()
    env = {}
    for n in frontier:
        env[n] = suffix.placeholder(n.name)
    for n in attrs:
        env[n] = suffix.node_copy(n, lambda a: env[a])
    for n in tail:
        env[n] = suffix.node_copy(n, lambda a: env[a])
    return prefix, suffix, [n.name for n in frontier]


def submodel(root: nn.Module, graph: fx.Graph) -> fx.GraphModule:
    """A GraphModule running ``graph`` on ``root``'s modules (shared, not copied)."""
    return fx.GraphModule(root, graph)


# ----------------------------------------------------------------------------- quantisation
@dataclass
class Quantised:
    """n-bit codes of one cached tensor: ``q`` uint8 (same shape), per-channel ``scale``, ``zero``."""

    q: Tensor
    scale: Tensor  # s, broadcastable to q
    zero: Tensor  # b

    def decode(self, idx: Tensor | None = None) -> Tensor:
        q = self.q if idx is None else self.q[idx]
        return q.float() / self.scale + self.zero


def channel_ranges(x: Tensor, k: float = QUANTILE) -> tuple[Tensor, Tensor]:
    """Per-channel (dim 1) quantiles over every other dim: Q_k is the ``floor(k (m - 1))``-th
    smallest of the channel's m values (0-based), Q_{1-k} the same rank from the top."""
    flat = x.transpose(0, 1).reshape(x.shape[1], -1)
    m = flat.shape[1]
    rank = int(k * (m - 1))
    return flat.kthvalue(rank + 1, dim=1).values, flat.kthvalue(m - rank, dim=1).values


def quantise(x: Tensor, bits: int, ranges: tuple[Tensor, Tensor]) -> Quantised:
    """Eq. 2 of Cache-and-Reuse with the given per-channel ranges (from the train split)."""
    lo, hi = ranges
    shape = (1, -1) + (1,) * (x.dim() - 2) if x.dim() > 1 else (-1,)
    levels = 2**bits - 1
    scale = (levels / (hi - lo).clamp_min(1e-8)).reshape(shape)
    zero = lo.reshape(shape)
    q = torch.round((x - zero) * scale).clamp_(0, levels).to(torch.uint8)
    return Quantised(q, scale, zero)


# ----------------------------------------------------------------------------- the cache
class Features:
    """The frontier values of one split, for a whole split of the data (fp32 or n-bit)."""

    def __init__(self, values: list[Tensor] | list[Quantised]):
        self.values = values

    def batch(self, idx: Tensor | None = None) -> list[Tensor]:
        out = []
        for v in self.values:
            if isinstance(v, Quantised):
                out.append(v.decode(idx))
            else:
                out.append(v if idx is None else v[idx])
        return out

    @property
    def nbytes(self) -> int:
        total = 0
        for v in self.values:
            t = v.q if isinstance(v, Quantised) else v
            total += t.numel() * t.element_size()
        return total


@torch.no_grad()
def run_prefix(prefix: nn.Module, x: Tensor, names: list[str]) -> list[Tensor]:
    """Frontier values of every sample of ``x`` (forward in chunks of EVAL_CHUNK)."""
    parts: list[list[Tensor]] = [[] for _ in names]
    for start in range(0, x.shape[0], EVAL_CHUNK):
        chunk = x[start : start + EVAL_CHUNK]
        values = prefix(chunk)
        for i, (name, v) in enumerate(zip(names, values)):
            if not isinstance(v, Tensor) or v.dim() == 0 or v.shape[0] != chunk.shape[0]:
                raise MemplanError(
                    f"cannot cache before this layer: value {name!r} is not a per-sample tensor",
                    "run without the feature cache",
                )
            parts[i].append(v)
    return [torch.cat(p) for p in parts]


def build(
    prefix: nn.Module, names: list[str], x_train: Tensor, x_test: Tensor, bits: int | None
) -> tuple[Features, Features]:
    """(train, test) features of a split; with ``bits`` quantised with the train split's ranges."""
    train, test = run_prefix(prefix, x_train, names), run_prefix(prefix, x_test, names)
    if bits is None:
        return Features(train), Features(test)
    ranges = [channel_ranges(t) for t in train]
    return (
        Features([quantise(t, bits, r) for t, r in zip(train, ranges)]),
        Features([quantise(t, bits, r) for t, r in zip(test, ranges)]),
    )
