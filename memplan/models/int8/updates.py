"""What a run of the paper's setting trains, on either form of a shipped backbone: the hand-made
updates a user picks (classifier only, biases of the last k convs, weights and biases of the last
k convs, the last blocks) and the paper's own sparse schemes, as ``requires_grad`` flags and
sub-channel selections. Convs are counted in forward order without the classifier, as
tiny-training's ``get_all_conv_ops`` counts them (mcunet-5fps: 42).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .ops import QuantConv2d


@dataclass(frozen=True)
class Update:
    """Biases of the last ``bias_last`` convs, weights of the listed convs at their input-channel
    ratios (channels chosen by weight magnitude, ``magnitude+``), the last ``blocks`` blocks whole,
    and always the classifier. ``full`` trains everything."""

    bias_last: int = 0
    weights: tuple[tuple[int, float], ...] = ()
    blocks: int = 0
    full: bool = False
    description: str = ""


def convs(model: nn.Module) -> list[nn.Conv2d]:
    """The backbone's convs in forward (registration) order, the classifier left out."""
    head = getattr(model, "classifier", None)
    skip = {id(m) for m in head.modules()} if head is not None else set()
    return [m for m in model.modules() if isinstance(m, nn.Conv2d) and id(m) not in skip]


def magnitude_channels(weight: torch.Tensor, groups: int, ratio: float) -> torch.Tensor:
    """The ``max(1, int(C_in * ratio))`` input channels with the largest L2 weight norm (ties to the
    lower index), sorted: tiny-training's ``magnitude+`` selection."""
    c_in = weight.shape[1] * groups
    per_channel = weight.detach().transpose(0, 1).reshape(c_in, -1) if groups == 1 else weight.reshape(c_in, -1)
    n = max(1, int(c_in * ratio))
    norms = torch.linalg.vector_norm(per_channel.double().cpu(), dim=1)
    return torch.argsort(norms, descending=True, stable=True)[:n].sort().values


def apply_update(model: nn.Module, update: Update) -> nn.Module:
    """Set ``requires_grad`` (and sub-channel selections) of ``model`` for ``update``; in place."""
    for p in model.parameters():
        p.requires_grad_(update.full)
    for p in model.classifier.parameters():
        p.requires_grad_(True)
    if update.full:
        return model
    cs = convs(model)
    for conv in cs[len(cs) - update.bias_last :] if update.bias_last else []:
        conv.bias.requires_grad_(True)
    for index, ratio in update.weights:
        conv = cs[index]
        conv.weight.requires_grad_(True)
        conv.bias.requires_grad_(True)
        if ratio < 1:
            if not isinstance(conv, QuantConv2d):
                raise NotImplementedError("sub-channel updates here are realised by the int8 graph's convs")
            conv.train_channels(magnitude_channels(conv.weight, conv.groups, ratio))
    for block in list(model.blocks)[len(model.blocks) - update.blocks :] if update.blocks else []:
        for p in block.parameters():
            p.requires_grad_(True)
    return model


def last_k_weights(n_convs: int, k: int) -> tuple[tuple[int, float], ...]:
    """Whole weights of the last ``k`` convs."""
    return tuple((i, 1.0) for i in range(n_convs - k, n_convs))


def backward_config(update: Update, n_convs: int, per_block: int = 3) -> dict:
    """tiny-training's ``backward_config`` of ``update`` on a net of ``n_convs`` convs (memplan reads it
    as a scheme); ``per_block``: convs per block of the last blocks (expand, dw, project)."""
    if update.full:
        return {"n_bias_update": n_convs, "manual_weight_idx": list(range(n_convs)), "weight_update_ratio": 1}
    if update.blocks:
        k = per_block * update.blocks
        return backward_config(Update(bias_last=k, weights=last_k_weights(n_convs, k)), n_convs)
    return {
        "n_bias_update": update.bias_last,
        "manual_weight_idx": [i for i, _ in update.weights],
        "weight_update_ratio": [r for _, r in update.weights] or None,
        "weight_select_criteria": "magnitude+",
    }


#: the 256KB paper's own schemes (its Figure 9 / README: mcunet-5fps, Flowers-102, 100 KB):
#: biases of the last 22 convs, weights of convs 21, 24, 27, 30, 36, 39 at ratios 1, 1, 1, 1, 1/8, 1/4
PAPER_SCHEMES: dict[str, Update] = {
    "mcunet-5fps-paper-100KB": Update(
        bias_last=22,
        weights=((21, 1.0), (24, 1.0), (27, 1.0), (30, 1.0), (36, 0.125), (39, 0.25)),
        description="the 256KB paper's 100 KB scheme",
    ),
}


def trained(model: nn.Module) -> Sequence[nn.Parameter]:
    """The parameters that train."""
    return [p for p in model.parameters() if p.requires_grad]
