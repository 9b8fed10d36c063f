"""``memplan reproduce``: every published figure of the seed papers next to memplan's value.

Each figure in the data files of :mod:`.figures` names a zoo model, a strategy, its options
and the accounting convention (mode) expected to rebuild it. This package (:mod:`.base`) translates those
options into one ``memplan`` profile, captured through the one pipeline of ``memplan.api``
(architecture transforms from the strategy registry), and reads the figure's quantity off
it: one small evaluator per quantity, registered in ``EVALUATORS``. A figure no evaluator can
rebuild is reported as "not modelled" with the best explanation, never silently dropped.

Status: ``ok`` within 1%, or within the printed precision (a figure printed "23" stands for
[22.5, 23.5)), or, for the 256KB paper's scheme labels, when the label equals the computed
KiB rounded down (how the authors label schemes); ``close`` within 5% (or within the figure's
own ``tolerance`` option: 10% for hardware measurements); ``differs`` otherwise. Where the paper
does not state a setting, an evaluator returns a :class:`Ranged` value (ours for a reference
choice and the range over the plausible ones) and the status says whether the published value
lies ``in range`` or ``outside range``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..costs.records import Profile
from . import measured  # noqa: F401  (registers the measured-SRAM evaluators)
from .base import EVALUATORS, NotModelled, Ranged, block_only, evaluator, profile_of
from .figures import FIGURE_MODES, FIGURES, NOT_MODELED, UNIT_SCALE, PublishedFigure, figure_method

TOLERANCE_OK = 0.01
TOLERANCE_CLOSE = 0.05


@dataclass
class Reproduction:
    key: str
    source: str
    quantity: str
    model: str
    method: str
    mode: str
    unit: str
    published: float  # as printed, in ``unit``
    ours: float | None  # in ``unit``
    error: float | None  # (ours - published) / published
    status: str  # ok | close | differs | not modelled | in range | outside range
    note: str
    low: float | None = None  # range over plausible settings (Ranged evaluators), in ``unit``
    high: float | None = None


# --------------------------------------------------------------------------- evaluators


@evaluator("memory")
def memory(fig: PublishedFigure) -> float:
    return profile_of(fig).totals.total_bytes


@evaluator("trainable_params")
def trainable_params(fig: PublishedFigure) -> float:
    return profile_of(fig, mode="ideal").totals.trainable_params


def _flops(fig: PublishedFigure, costs: Any, direction: str) -> int:
    """Forward or backward FLOPs of ``costs``: conv / linear / matmul, plus every other op where
    the figure counts them (``other_ops``)."""
    return getattr(costs, f"{direction}_flops") + (
        getattr(costs, f"{direction}_other_flops") if fig.options.get("other_ops") else 0
    )


@evaluator("training_flops")
def training_flops(fig: PublishedFigure) -> float:
    if block_only(fig):
        p = profile_of(fig, mode="ideal", method="full")
        return sum(_flops(fig, lc, "forward") + _flops(fig, lc, "backward") for lc in p.layers if lc.block)
    t = profile_of(fig, mode="ideal").totals
    return _flops(fig, t, "forward") + _flops(fig, t, "backward")


@evaluator("forward_flops")
def forward_flops(fig: PublishedFigure) -> float:
    return _flops(fig, profile_of(fig, mode="ideal").totals, "forward")


@evaluator("backward_flops")
def backward_flops(fig: PublishedFigure) -> float:
    return _flops(fig, profile_of(fig, mode="ideal").totals, "backward")


@evaluator("activation_memory")
def activation_memory(fig: PublishedFigure) -> float:
    p = profile_of(fig, mode="tinytl", method="full")
    if block_only(fig):
        return sum(lc.saved_activation_bytes for lc in p.layers if lc.block)
    return p.totals.saved_activation_bytes


@evaluator("activation_over_model_size")
def activation_over_model_size(fig: PublishedFigure) -> float:
    p = profile_of(fig, mode="tinytl", method="full")
    return p.totals.saved_activation_bytes / (4 * p.totals.params)


@evaluator("params")
def params(fig: PublishedFigure) -> float:
    p = profile_of(fig, method="last")
    if block_only(fig):
        return sum(lc.params for lc in p.layers if lc.block)
    if fig.options.get("include_classifier") is False:
        return p.totals.params - _classifier(p).params
    return p.totals.params


def _classifier(p: Profile):
    return [lc for lc in p.layers if lc.kind == "linear"][-1]


def _table_layer(fig: PublishedFigure):
    """MiniLearn Table 1 rows: input, then every conv / max-pool / linear layer in order."""
    p = profile_of(fig, method="last")
    rows = [lc for lc in p.layers if lc.kind in ("conv", "maxpool", "linear")]
    return p, rows[fig.options["layer_index"] - 1]


@evaluator("macs")
def macs(fig: PublishedFigure) -> float:
    if "layer_index" in fig.options:
        _, layer = _table_layer(fig)
        if layer.kind == "maxpool":
            raise NotModelled(
                "memplan counts pooling as other FLOPs, not MACs; the paper's pooling MACs follow no stated rule"
            )
        return layer.macs
    return profile_of(fig, method="last").totals.macs


@evaluator("output_bytes")
def output_bytes(fig: PublishedFigure) -> float:
    p = profile_of(fig, method="last")
    if fig.options["layer_index"] == 0:
        return math.prod(p.input_shape[1:])
    _, layer = _table_layer(fig)
    return math.prod(layer.output_shape[1:])  # int8: one byte per element and sample


@evaluator("num_layers")
def num_layers(fig: PublishedFigure) -> float:
    return sum(1 for lc in profile_of(fig, method="last").layers if lc.kind in ("conv", "linear"))


@evaluator("cache_bytes")
def cache_bytes(fig: PublishedFigure) -> float:
    return profile_of(fig, mode="pytorch").extras["cache_bytes"]


@evaluator("frozen_forward_share", "frozen_forward_flops_share")
def frozen_share(fig: PublishedFigure) -> float:
    return profile_of(fig, method="cache-reuse", mode="ideal").extras["single_stage_frozen_forward_share"]


@evaluator("storage")
def storage(fig: PublishedFigure) -> float:
    return profile_of(fig, method="minilearn").extras["storage_bytes"]


@evaluator("ram")
def ram(fig: PublishedFigure) -> float:
    """MiniLearn's RAM: of training (``ram_bytes``), or of the plain network's inference (``model_bytes``)."""
    extras = profile_of(fig, method="minilearn").extras
    return extras["ram_bytes" if figure_method(fig.method).trains else "model_bytes"]


# --------------------------------------------------------------------------- driver


def reproduce_figure(fig: PublishedFigure) -> Reproduction:
    base = dict(
        key=fig.key,
        source=fig.source,
        quantity=fig.quantity,
        model=fig.model,
        method=fig.method,
        mode=fig.mode,
        unit=fig.unit,
        published=fig.value,
    )
    fn = EVALUATORS.get(fig.quantity)
    try:
        if fn is None or fig in NOT_MODELED:
            raise NotModelled(fig.note if fig in NOT_MODELED else f"no rule for the quantity {fig.quantity!r}")
        value = fn(fig)
    except NotModelled as why:
        return Reproduction(**base, ours=None, error=None, status="not modelled", note=str(why))
    if isinstance(value, Ranged):
        scale = UNIT_SCALE[fig.unit]
        low, high, ours = value.low / scale, value.high / scale, value.value / scale
        inside = low * (1 - TOLERANCE_OK) <= fig.value <= high * (1 + TOLERANCE_OK)
        return Reproduction(
            **base,
            ours=ours,
            error=(ours - fig.value) / fig.value if fig.value else None,
            status="in range" if inside else "outside range",
            note=f"{fig.note}; range over {value.over}",
            low=low,
            high=high,
        )
    value = value / UNIT_SCALE[fig.unit]
    error = (value - fig.value) / fig.value if fig.value else None
    close = fig.options.get("tolerance", TOLERANCE_CLOSE)
    label = FIGURE_MODES[fig.mode].floor_unit == fig.unit and math.floor(value) == fig.value
    if label or abs(value - fig.value) <= _half_unit(fig.value) or (error is not None and abs(error) <= TOLERANCE_OK):
        status = "ok"
    elif error is not None and abs(error) <= close:
        status = "close"
    else:
        status = "differs"
    return Reproduction(**base, ours=value, error=error, status=status, note=fig.note)


def _half_unit(value: float) -> float:
    """Half a unit of the last printed digit: 23 -> 0.5, 0.306 -> 0.0005, 29.0 -> 0.05."""
    text = repr(value)
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10**-decimals


def reproduce(prefix: str = "", include_not_modelled: bool = True) -> list[Reproduction]:
    """Reproduce every published figure whose key starts with ``prefix``."""
    figures = FIGURES + (NOT_MODELED if include_not_modelled else [])
    return [reproduce_figure(f) for f in figures if f.key.startswith(prefix)]
