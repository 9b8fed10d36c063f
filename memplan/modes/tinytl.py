"""Mode ``tinytl``: TinyTL's profiler convention (accounting.md §3; Cai et al., NeurIPS 2020,
``profile_memory_cost`` in the authors' code). Reproduces TinyTL Tables 2-3.

memory = batch x (peak activation memory of one sample) + parameter bytes, where

* parameters: trainable 4 B per element, frozen 1 B (int8); no gradients, optimizer state
  or backward workspace (``--optimizer`` and ``--frozen-bits`` do not apply);
* kept for backward (each op counts its own, shared tensors are not merged): conv / linear
  their fp32 input if the weight trains (the selected input channels for a partial update),
  norms their input if the scale trains; whenever anything besides the classifier trains,
  every ReLU / ReLU6 / LeakyReLU a 1-bit mask of its input, every h-swish / h-sigmoid /
  sigmoid / tanh / SiLU / GELU / ELU 4 B per input element, and an SE multiply its feature
  map at 4 B per element (FT-Last keeps nothing);
* working memory of a layer: conv input + output / groups, linear input + output, norm and
  activation layers their input (they run in place); other ops (adds, pooling, resizing,
  views, the loss) are not layers of TinyTL's profiler and cost nothing;
* inside a block with a shortcut (its input feeds two or more ops of the block, a lite
  residual branch not counted), the block input stays alive;
* peak = max over layers, in forward order, of working + kept by earlier layers + block input.

``totals.total_bytes`` = ``totals.peak_bytes`` = that memory. ``saved_activation_bytes`` holds
the kept tensors at the traced batch; ``weight_bytes`` / ``gradient_bytes`` keep the generic
meaning. ``extras["tinytl"]``: per-sample peak activation bytes (float: masks are fractional
bytes per sample), parameter bytes, and the layer where the peak occurs.
"""

from __future__ import annotations

from ..costs.records import Saved, Summary
from ..graph import LayerGraph, Node, sub_channels
from ..graph.kinds import MASK_ACTIVATIONS, NORM_KINDS
from ..nn.transforms import is_lite
from ..plan import OpView
from .base import Mode, mask_bits, private, register_mode

TRAINABLE_BYTES = 4
FROZEN_BYTES = 1
SMOOTH_ACTIVATIONS = frozenset({"hardswish", "hardsigmoid", "sigmoid", "tanh", "silu", "gelu", "elu"})


class TinyTLMode(Mode):
    name = "tinytl"
    description = (
        "TinyTL's profiler: batch x peak activation of one sample (forward walk, kept tensors + "
        "working memory + shortcut input) + params (trainable 4 B, frozen int8)"
    )

    def saved(self, op: OpView) -> list[Saved] | None:
        """Rules run for every op, recorded or not: ReLU masks depend on the whole plan."""
        rule = self.find_rule(op.kind)
        return None if rule is None else list(rule(op))

    def summarize(self, graph, views, saved, node_costs, totals, peak=None) -> Summary:
        """Walk the layers in forward order (see the module docstring); total = peak."""
        shortcut = shortcut_inputs(graph)
        kept = 0
        peak, where = 0, 0
        at = [0] * len(graph.nodes)
        for op, items in zip(views, saved):
            work = working_bytes(op.node)
            at[op.node.index] = (work or 0) + kept + shortcut.get(op.node.block, 0)
            if work is not None and at[op.node.index] > peak:
                peak, where = at[op.node.index], op.node.index
            kept += sum(s.nbytes for s in items)
        params = sum(
            TRAINABLE_BYTES * lc.trainable_params + FROZEN_BYTES * (lc.params - lc.trainable_params)
            for lc in node_costs
        )
        extras = {"tinytl": {"peak_activation_bytes_per_sample": peak / graph.batch, "param_bytes": params}}
        return Summary(peak + params, peak + params, where, "forward", [a + params for a in at], extras)


tinytl = register_mode(TinyTLMode())
rule = tinytl.rule


def working_bytes(node: Node) -> int | None:
    """Working memory of one TinyTL layer (bytes at the traced batch); None for non-layers."""
    if node.kind == "conv":
        return node.in_tensors[0].nbytes + node.out.nbytes // (node.attrs.get("groups", 1) or 1)
    if node.kind == "linear":
        return node.in_tensors[0].nbytes + node.out.nbytes
    if node.kind in NORM_KINDS or node.kind in MASK_ACTIVATIONS or node.kind in SMOOTH_ACTIVATIONS:
        return node.in_tensors[0].nbytes
    return None


def shortcut_inputs(graph: LayerGraph) -> dict[str, int]:
    """{block: bytes of its input} for blocks whose input feeds two or more of their ops
    (identity or projection shortcut), not counting the ops of a lite residual branch."""
    out: dict[str, int] = {}
    for b in graph.blocks:
        first, last = graph.block_range(b)
        uses: dict[int, list[int]] = {}
        for n in graph.nodes[first : last + 1]:
            if n.block != b or is_lite(n):
                continue
            for i, t in zip(n.inputs, n.in_tensors):
                if graph.nodes[i].block != b and t.storage not in graph.param_storages:
                    uses.setdefault(t.storage, []).append(n.index)
        for sid, users in uses.items():
            if len(set(users)) >= 2:
                out[b] = max(out.get(b, 0), graph.storages[sid])
    return out


def _backward(op: OpView) -> bool:
    """TinyTL's ``require_backward``: does anything besides the classifier train?"""
    head = {n.name for n in op.graph.classifier_layers}
    return any(t.any for name, t in op.plan.train.items() if name not in head)


@rule("conv", "linear")
def layer(op: OpView):
    if op.train.weight:
        x = op.node.in_tensors[0]
        channels = x.shape[1] if op.kind == "conv" else x.shape[-1]
        n = channels if op.train.weight >= 1 else sub_channels(channels, op.train.weight)
        yield private(x.nbytes // channels * n, "input" if n == channels else f"input channels {n}/{channels}")


@rule("batchnorm", "groupnorm", "layernorm")
def norm(op: OpView):
    if op.train.weight:
        yield private(op.node.in_tensors[0].nbytes, "input")


@rule(*MASK_ACTIVATIONS)
def relu(op: OpView):
    if _backward(op):
        yield mask_bits(op.node.in_tensors[0].numel)


@rule(*SMOOTH_ACTIVATIONS)
def smooth(op: OpView):
    if _backward(op):
        yield private(op.node.in_tensors[0].nbytes, "input")


@rule("mul")
def se_multiply(op: OpView):
    """The SE multiply (feature map x channel gate) keeps its feature-map operand at 4 B per
    element whenever anything besides the classifier trains. TinyTL's networks have no
    multiplies; this is the count of MobileTL's related profiler, and it reproduces both its
    MobileNetV3-Small 129.7 MB and its Table 1 MBV3 block (accounting.md §3, §6)."""
    if _backward(op) and len(op.node.in_tensors) == 2:
        feature = max(op.node.in_tensors, key=lambda t: t.numel)
        yield private(feature.numel * 4, "feature map")


@rule(
    "add",
    "sub",
    "div",
    "cat",
    "fold",
    "avgpool",
    "adaptive_avgpool",
    "maxpool",
    "adaptive_maxpool",
    "dropout",
    "interpolate",
    "pad",
    "mean",
    "view",
    "identity",
    "getitem",
    "meta",
    "input",
    "output",
    "cross_entropy",
)
def keeps_nothing(op: OpView):
    return ()
