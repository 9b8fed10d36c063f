"""Strategy ``mobiletl``: MobileTL (Chiang et al., AAAI 2023), block-wise fine-tuning of
inverted-residual blocks with shift-only internal norms and sign-approximated activations.

* the top K blocks train, plus everything after them (feature-mix conv and its norm in train
  mode, classifier), as ``lastk --blocks K``; blocks below are frozen and run forward only;
* inside the K blocks every conv trains fully (SE convs included); the *internal* norms train
  the shift only, with frozen scale and frozen statistics (eval mode: keep nothing); the norms
  chosen by ``full_norms`` train scale + shift in train mode. The paper's MobileTL trains the
  block's last norm (after the projection) fully: ``full_norms="last"``;
* ReLU6 and h-swish inside the K blocks get a sign-approximated backward (``Plan.approx``:
  a 1-bit mask). Activations after the blocks (feature mix) stay exact.

``full_norms`` reproduces the norm ablation of the paper's Figure 6: ``"last"`` (MobileTL,
= MobileTL-proj-bn), ``"expand"`` (-exp-bn: the norm after the 1x1 expansion conv), ``"dw"``
(-dw-bn: the norm after the depthwise conv), ``"all"`` (-all-bn) and ``"none"`` (-all-bn-shift).
In the -exp-bn / -dw-bn variants the other norms, the last one included, train the shift only.

Model patches (the paper's Table 5): with ``lite=true`` (an option of every method,
``memplan.strategies.architecture``; ``lite_blocks=K`` puts them in the K trained blocks) the
lite residual branches inside the K blocks train fully (norms in train mode) and the rules
above apply to the blocks' own layers; ``train_main=false`` freezes those (the patches, the
feature mix and the classifier still train; activations stay sign-approximated, since the
gradient passes through them to the patches below).
"""

from __future__ import annotations

from ..errors import BadOption
from ..graph import LayerGraph, Node
from ..graph.kinds import NORM_KINDS
from ..nn.transforms import is_lite
from ..plan import Plan, Train
from .architecture import flag
from .base import DEFAULT_K, full_train, lastk_start, on_blocks, strategy

#: activation kinds whose backward MobileTL approximates by a sign (ReLU6, h-swish)
APPROX_KINDS = frozenset({"hardtanh", "hardswish"})
FULL_NORMS = ("last", "expand", "dw", "all", "none")


def _producer_conv(graph: LayerGraph, norm: Node) -> Node | None:
    src = graph.nodes[norm.inputs[0]] if norm.inputs else None
    return src if src is not None and src.kind == "conv" else None


def _is_depthwise(conv: Node) -> bool:
    groups = conv.attrs.get("groups", 1) or 1
    return groups > 1 and groups == conv.in_tensors[0].shape[1]


def full_norms_of(graph: LayerGraph, norms: list[Node], which: str) -> list[Node]:
    """The norms of one block (forward order) that train fully under ``full_norms=which``."""
    if which == "all":
        return norms
    if which == "last":
        return norms[-1:]
    if which == "dw":
        return [n for n in norms if (c := _producer_conv(graph, n)) is not None and _is_depthwise(c)]
    if which == "expand":  # the first norm, after a non-depthwise 1x1 conv, when it is not the last one
        conv = _producer_conv(graph, norms[0]) if len(norms) > 1 else None
        if conv is None or _is_depthwise(conv) or any(k != 1 for k in conv.attrs["kernel_size"]):
            return []
        return norms[:1]
    return []


@strategy(
    "mobiletl",
    "top K blocks train with shift-only internal norms (frozen scale and statistics), the "
    "block's last norm fully, sign-approximated ReLU6 / h-swish backward; feature mix and classifier train; "
    "lite branches in the blocks train fully (train_main=false: only they do)",
    ("blocks", "full_norms", "train_main"),
    compare=(8, on_blocks),
)
def mobiletl(graph: LayerGraph, blocks: int | None = None, full_norms: str = "last", train_main: bool = True) -> Plan:
    if blocks is None:
        if not graph.blocks:
            raise BadOption("no blocks found in this model", "name the blocks with --block-names (module qualnames)")
        blocks = min(DEFAULT_K, len(graph.blocks))
    if full_norms not in FULL_NORMS:
        raise BadOption(f"unknown full_norms {full_norms!r}", f"use one of: {', '.join(FULL_NORMS)}")
    start = lastk_start(graph, blocks=blocks)
    tail = [n for n in graph.param_nodes() if n.index >= start]
    train = {n.name: full_train(n) for n in tail}
    norm_train = {n.name for n in tail if n.kind in NORM_KINDS}
    approx: set[str] = set()
    for block in graph.blocks[-blocks:]:
        inside = [n for n in graph.nodes if n.block == block and not is_lite(n)]
        norms = [n for n in inside if n.kind in NORM_KINDS and n.params]
        full = {n.name for n in full_norms_of(graph, norms, full_norms)}
        for n in norms:
            if n.name not in full:
                train[n.name] = Train(0.0, "bias" in n.params)
                norm_train.discard(n.name)
        if not flag("train_main", train_main):
            for n in inside:
                train.pop(n.name, None)
                norm_train.discard(n.name)
        approx |= {n.name for n in inside if n.kind in APPROX_KINDS}
    return Plan("mobiletl", train, norm_train, approx)
