"""tiny-training's ``backward_config`` (mit-han-lab/tiny-training): reading it into scheme fields
and writing a scheme back, losslessly.

Conv indices follow ``memplan.graph.conv`` (forward order, stem = 0, classifier not counted),
as tiny-training's do.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from ..errors import SchemeError
from ..graph import COMPUTED_SELECT_RULES, EXPLICIT_SELECT, LayerGraph, conv_layers, is_pw1

#: backward_config keys memplan reads; ``freeze_fc`` is accepted and ignored, as tiny-training does
BACKWARD_CONFIG_KEYS = (
    "enable_backward_config",
    "n_bias_update",
    "n_weight_update",
    "manual_weight_idx",
    "weight_update_ratio",
    "weight_select_criteria",
    "pw1_weight_only",
    "quantize_gradient",
    "train_scale",
    "freeze_fc",
)


class BackwardFlags(BaseModel):
    """tiny-training ``backward_config`` flags, kept for a lossless round trip: ``pw1_weight_only`` is
    already applied to the weight updates at import; the other two are training options with no
    memory effect here."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pw1_weight_only: bool = False
    quantize_gradient: bool = False
    train_scale: bool = False


def is_backward_config(data: dict[str, Any]) -> bool:
    """tiny-training's dict has ``n_bias_update`` and no ``schema_version``."""
    return "schema_version" not in data and "n_bias_update" in data


def backward_config_fields(config: dict[str, Any], graph: LayerGraph) -> dict[str, Any]:
    """The scheme fields ``bias_update``, ``weight_updates`` and ``backward_flags`` of tiny-training's
    ``backward_config`` for the traced ``graph``.

    Accepts the forms tiny-training's parser does: ``n_bias_update`` int or ``"all"``;
    ``manual_weight_idx`` list / int / dash-joined string, or absent with ``n_weight_update``
    (int or ``"all"``: the last n convs); ``weight_update_ratio`` list / dash-joined string /
    one number / None (= 1). ``pw1_weight_only`` drops non-pw1 indices as tiny-training does.
    Indices at ratio 0 update their bias only, which ``bias_update`` already covers, so they
    are dropped."""
    convs = conv_layers(graph)
    unknown = sorted(set(config) - set(BACKWARD_CONFIG_KEYS))
    if unknown:
        raise SchemeError(
            f"backward_config has unknown key {unknown[0]!r}", f"known keys: {', '.join(BACKWARD_CONFIG_KEYS)}"
        )
    n_bias = _count(config.get("n_bias_update", 0), len(convs), "n_bias_update")
    idx = config.get("manual_weight_idx")
    if idx is None:
        n_weight = _count(config.get("n_weight_update") or 0, n_bias, "n_weight_update")
        idx = list(range(len(convs) - n_weight, len(convs)))
    idx = [int(i) for i in _items(idx, "manual_weight_idx")]
    if idx != sorted(idx):
        raise SchemeError(
            f"backward_config manual_weight_idx {idx} is not sorted",
            "tiny-training pairs the ratios with the sorted indices; sort both lists",
        )
    flags = BackwardFlags(**{k: bool(config.get(k, 0)) for k in BackwardFlags.model_fields})
    if flags.pw1_weight_only:
        idx = [i for i in idx if 0 <= i < len(convs) and is_pw1(convs[i])]
    ratios = config.get("weight_update_ratio")
    if ratios is None or isinstance(ratios, (int, float)):
        ratios = [1.0 if ratios is None else float(ratios)] * len(idx)
    ratios = [float(r) for r in _items(ratios, "weight_update_ratio")]
    if len(ratios) != len(idx):
        raise SchemeError(
            f"backward_config pairs {len(idx)} manual_weight_idx with {len(ratios)} weight_update_ratio values",
            "give one ratio per index",
        )
    select = config.get("weight_select_criteria", "magnitude+")
    if select not in COMPUTED_SELECT_RULES:
        raise SchemeError(
            f"unknown weight_select_criteria {select!r}", f"use one of {', '.join(COMPUTED_SELECT_RULES)}"
        )
    updates = []
    for i, r in zip(idx, ratios):
        if not 0 <= i < len(convs):
            raise SchemeError(f"manual_weight_idx {i} is out of range", f"the model has {len(convs)} convs")
        if r != 0:
            updates.append(dict(layer=convs[i].name, conv_index=i, ratio=r, select=select))
    return {"bias_update": n_bias, "weight_updates": updates, "backward_flags": flags}


def to_backward_config(scheme: Any) -> dict[str, Any]:
    """tiny-training's ``backward_config`` dict of a ``memplan.plan.scheme.Scheme`` (lists, not its
    CLI's dash-joined strings).

    Refuses what that format cannot hold: norm overrides, activation approximations, added
    modules, execution choices (recomputation, micro-batches), weight updates with different
    channel selection rules, or explicit channel indices (``importance`` selection: tiny-training
    selects channels itself, by weight norm or at random, so exporting the ratio alone would train
    other channels)."""
    for field in ("norm_modes", "activation_approx", "added_modules", "execution"):
        if getattr(scheme, field):
            raise SchemeError(
                f"scheme has {field}, which tiny-training's backward_config cannot hold",
                "export it as memplan scheme JSON",
            )
    explicit = [w for w in scheme.weight_updates if w.select == EXPLICIT_SELECT]
    if explicit:
        raise SchemeError(
            f"weight update of conv {explicit[0].conv_index} ({explicit[0].layer}) lists its channels "
            f"({EXPLICIT_SELECT} selection); tiny-training's backward_config has no explicit channel indices",
            "export it as memplan scheme JSON",
        )
    selects = {w.select for w in scheme.weight_updates}
    if len(selects) > 1:
        raise SchemeError(
            "scheme mixes channel selection rules; tiny-training's backward_config has one weight_select_criteria"
        )
    updates = sorted(scheme.weight_updates, key=lambda w: w.conv_index)
    flags = scheme.backward_flags
    return {
        "enable_backward_config": 1,
        "n_bias_update": scheme.bias_update,
        "manual_weight_idx": [w.conv_index for w in updates],
        "weight_update_ratio": [w.ratio for w in updates],
        "weight_select_criteria": selects.pop() if selects else "magnitude+",
        "pw1_weight_only": int(flags.pw1_weight_only),
        "quantize_gradient": int(flags.quantize_gradient),
        "train_scale": int(flags.train_scale),
    }


def _count(value: Any, limit: int, key: str) -> int:
    if value == "all":
        return limit
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemeError(f"backward_config {key} must be a non-negative integer or 'all', got {value!r}")
    return value


def _items(value: Any, key: str) -> list[Any]:
    """A list, one number, or tiny-training's dash-joined string ("21-24-0.125")."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value]
    if isinstance(value, str):
        try:
            return [float(p) if "." in p else int(p) for p in value.split("-") if p]
        except ValueError:
            pass
    raise SchemeError(f"cannot read backward_config {key} {value!r}", "give a list of numbers")
