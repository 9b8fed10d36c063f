"""The words of a contribution profile's ``description``: how its entries were measured."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..units import ratio_label
from .data import Data
from .estimators import Estimator, probe_protocol
from .protocol import Protocol


def describe(
    name: str,
    shape: Sequence[int],
    data: Data,
    protocol: Protocol,
    n_layers: int,
    cache: bool,
    est: Estimator,
    batches: int,
) -> str:
    """The profile's ``description``: how its entries were measured, in words."""
    if est.runs == "gradients":
        return (
            f"Contribution estimate ({est.name}: {est.description}) of {name} (L = {n_layers} convs) at input "
            f"{'x'.join(map(str, shape))} on {data.name} ({data.x_train.shape[0]} train images, {data.classes} "
            f"classes). Linear probe first: classifier from zero, {protocol.probe_epochs} epochs {protocol.optimizer} "
            f"lr {protocol.probe_lr}, cosine decay; then the gradients of {batches} mini-batches of "
            f"{protocol.batch_size} training images (model in eval mode, norms frozen). Entries: {est.units}; "
            f"SE over batches. Bias depth k: the bias carriers of the last k convs; weight (i, r): the channels "
            f"a ratio-r update of conv i trains (select {protocol.select})."
        )
    p = protocol if est.runs == "protocol" else probe_protocol(protocol)
    ks = "all k = 1..L" if p.bias_ks is None else f"k in {list(p.bias_ks)} and those the weight runs need"
    wl = (
        f"convs {list(p.weight_convs)}"
        if p.weight_convs is not None
        else "every conv"
        if p.weight_layers is None
        else f"the last {p.weight_layers} convs"
    )
    ratios = ", ".join(ratio_label(r) for r in p.ratios)
    adaptive = (
        ""
        if p.max_seeds is None
        else f", then one more seed per round for every entry with |Δacc| < {p.adaptive_z:g} SE, up to {p.max_seeds}"
    )
    cache_text = (
        "feature cache of the frozen prefix " + ("exact fp32" if p.bits is None else f"quantised to {p.bits} bits")
        if cache
        else "no feature cache (every step runs the whole model)"
    )
    where = (
        f"the validation split ({data.x_val.shape[0]} images carved from the training data; the "
        f"{data.x_test.shape[0]} test images are left for final evaluations)"
        if data.x_val is not None
        else f"the test split ({data.x_test.shape[0]} images)"
    )
    return (
        f"Contribution analysis (Lin et al., NeurIPS 2022, Sec. 2.2 / Fig. 5) of {name} "
        f"(L = {n_layers} convs) at input {'x'.join(map(str, shape))} on {data.name} "
        f"({data.x_train.shape[0]} train images, {data.classes} classes); accuracies on {where}. "
        f"Linear probe first: classifier from zero, {p.probe_epochs} epochs {p.optimizer} lr {p.probe_lr}, "
        f"cosine decay; every run starts from that head. Runs: classifier only (k = 0); biases of the last "
        f"k convs ({ks}; a conv's bias is the BN shift after it, norms in eval mode) + classifier; weight "
        f"of conv i at ratios {ratios} (select {p.select}) for {wl}, + "
        + ("all L biases" if p.weight_reference == "all-biases" else "biases of convs i..L-1")
        + " + classifier. "
        f"Each run: {p.epochs} epochs of {p.optimizer}, batch {p.batch_size}, cosine decay to 0, "
        f"lr classifier {p.lr_classifier} / biases {p.lr_bias} / analysed weight {p.lr_weight}, no augmentation, "
        f"seeds {list(p.seeds)} (data order){adaptive}. Δacc in accuracy points, paired by seed: bias k vs classifier "
        f"only, weight (i, r) vs bias k = "
        + ("L" if p.weight_reference == "all-biases" else "L - i")
        + f"; mean and std over seeds. {cache_text}."
        + ("" if est.runs == "protocol" else f" Estimator {est.name}: {est.description} ({batches} batches).")
    )


def rates_text(selection: dict[str, dict[str, Any]]) -> str:
    return "; ".join(
        f"{f} {v['lr']:g} (from {len(v['accuracy'])} rates, seeds {v['seeds']})" for f, v in selection.items()
    )
