"""Conv-layer conventions shared by schemes, strategies, cost modes, lean ops and the search.

* conv index: the convs with parameters in forward order, stem = 0, a conv classifier not
  counted (:func:`conv_layers`; the 256KB paper's and tiny-training's numbering);
* a conv's bias: its own bias or, in a conv -> BN model, the shift of the norm that is the only
  consumer of its output (BN folded into the conv on the device): :func:`bias_carrier`;
* padding: ``(before, after)`` elements per spatial dim for integer, "valid" and "same"
  padding (:func:`conv_padding`);
* a sub-channel update at ratio r keeps ``max(1, int(C * r))`` channels
  (:func:`sub_channels`), chosen by one of :data:`SELECT_RULES`: computed from the weight
  (:data:`COMPUTED_SELECT_RULES`) or given as explicit indices (:data:`EXPLICIT_SELECT`,
  checked by :func:`channel_index_problem`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .. import names
from .kinds import NORM_KINDS
from .model import LayerGraph, Node

#: channel selections computed from the weight when a sub-channel update is applied
#: (tiny-training's ``weight_select_criteria``): largest / smallest weight norm first, or a
#: seeded random subset
COMPUTED_SELECT_RULES = names.SELECT_RULES
#: the selection that names its channels explicitly: the indices ranked highest by an
#: estimator's per-channel importance on the target data (``memplan.nn.lean.top_channels``)
EXPLICIT_SELECT = names.EXPLICIT_SELECT
#: every channel selection rule of a sub-channel update
SELECT_RULES = (*COMPUTED_SELECT_RULES, EXPLICIT_SELECT)


def sub_channels(channels: int, ratio: float) -> int:
    """Channels a sub-channel update at ``ratio`` keeps: ``int(channels * ratio)``, at least one."""
    return max(1, int(channels * ratio))


def channel_index_problem(
    channels: Sequence[int], in_channels: int | None = None, ratio: float | None = None
) -> str | None:
    """What is wrong with explicit channel indices of a sub-channel update, in words (None: nothing).

    Always: the indices are sorted, unique and non-negative. With ``in_channels``: each is below it
    (input channels of a plain conv, the channels / groups of a depthwise one). With ``ratio``
    too: there are exactly ``sub_channels(in_channels, ratio)`` of them."""
    channels = list(channels)
    if any(isinstance(c, bool) or c != int(c) or c < 0 for c in channels):
        return f"channel indices {channels} are not all non-negative integers"
    if any(b <= a for a, b in zip(channels, channels[1:])):
        return f"channel indices {channels} are not sorted and unique"
    if in_channels is None:
        return None
    if channels and channels[-1] >= in_channels:
        return f"channel index {channels[-1]} is out of range for {in_channels} channels"
    if ratio is not None and len(channels) != sub_channels(in_channels, ratio):
        n = sub_channels(in_channels, ratio)
        return f"{len(channels)} channel indices given; ratio {ratio:g} of {in_channels} channels keeps {n}"
    return None


def conv_padding(
    padding: str | Sequence[int], kernel_size: Sequence[int], dilation: Sequence[int]
) -> list[tuple[int, int]]:
    """(before, after) padding in elements per spatial dim of a conv (integer, "valid" or
    "same"; "same" puts the odd remainder after, as torch does)."""
    if padding == "valid":
        return [(0, 0)] * len(kernel_size)
    if padding == "same":
        total = [d * (k - 1) for k, d in zip(kernel_size, dilation)]
        return [(t // 2, t - t // 2) for t in total]
    return [(p, p) for p in padding]


@dataclass(frozen=True)
class ConvLayer:
    """One conv of a model under the conventions above (what contribution analysis measures,
    its profile stores and the search chooses from)."""

    __pydantic_config__ = {"extra": "forbid"}  # strict when read from a contribution profile

    name: str  # module qualname
    conv_index: int  # forward order among convs, stem = 0, classifier not counted
    weight_shape: tuple[int, ...]
    groups: int
    bias: str | None  # the layer carrying its bias: itself, the norm after it, or None


def conv_layers(graph: LayerGraph) -> list[Node]:
    """Convs with parameters in forward order (the conv index); a conv classifier is excluded."""
    head = graph.classifier
    return [n for n in graph.nodes if n.kind == "conv" and "weight" in n.params and n is not head]


def conv_table(graph: LayerGraph) -> list[ConvLayer]:
    """:class:`ConvLayer` of every conv of :func:`conv_layers`, with its bias carrier."""
    out = []
    for i, n in enumerate(conv_layers(graph)):
        carrier = bias_carrier(graph, n)
        out.append(
            ConvLayer(
                n.name,
                i,
                tuple(n.params["weight"].shape),
                int(n.attrs.get("groups", 1)),
                None if carrier is None else carrier.name,
            )
        )
    return out


def bias_carrier(graph: LayerGraph, conv: Node) -> Node | None:
    """The parameter that acts as ``conv``'s bias: its own bias, or else the shift of a norm that is
    the only consumer of its output (conv -> BN, BN folded into the conv on the device)."""
    if "bias" in conv.params:
        return conv
    consumers = [n for n in graph.nodes if conv.index in n.inputs]
    if len(consumers) == 1 and consumers[0].kind in NORM_KINDS and "bias" in consumers[0].params:
        return consumers[0]
    return None


def is_pw1(conv: Node) -> bool:
    """First pointwise conv of an inverted residual block: 1x1, more outputs than inputs (tiny-training's rule)."""
    w = conv.params["weight"].shape
    return len(w) > 2 and all(k == 1 for k in w[2:]) and w[0] > conv.in_tensors[0].shape[1]
