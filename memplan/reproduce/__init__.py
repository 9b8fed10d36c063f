"""``memplan reproduce``: every published figure of the seed papers next to memplan's value.

Each figure in the data files of :mod:`.figures` names a zoo model, a strategy, its options
and the accounting convention (mode) expected to rebuild it. This module translates those
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

import json
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..api import Captured, capture_model, profile_captured
from ..costs.records import Profile
from ..modes import MODES
from ..registry import Registry
from ..strategies import get_strategy, split_options
from ..strategies.base import transform_option_names
from .figures import (
    CAPTURE_OPTIONS,
    DESCRIPTIVE_OPTIONS,
    EVALUATOR_OPTIONS,
    FIGURES,
    NOT_MODELED,
    UNIT_SCALE,
    PublishedFigure,
)

TOLERANCE_OK = 0.01
TOLERANCE_CLOSE = 0.05
#: captured models kept for reuse across figures (a capture costs up to seconds)
CACHE_SIZE = 64


class NotModelled(Exception):
    """The figure cannot be rebuilt by memplan; the message says why."""


@dataclass
class Ranged:
    """An evaluator's answer where the paper leaves a setting open: ``value`` for the reference
    choice, ``low`` / ``high`` over every plausible choice (``values``: per choice), in base units."""

    value: float
    low: float
    high: float
    over: str  # what was varied
    values: dict[str, float]


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


# --------------------------------------------------------------------------- profiles


def _options(fig: PublishedFigure, method: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(capture keyword arguments, strategy options) of ``fig`` profiled with ``method``.

    Every figure option is read: by the capture (``CAPTURE_OPTIONS``), by the evaluator
    (``EVALUATOR_OPTIONS``), declared as changing nothing memplan builds (``DESCRIPTIVE_OPTIONS``,
    with the reason), or as an option of ``method`` or of the architecture transforms every method
    accepts (the strategy registry). Anything else makes the figure "not modelled": memplan never
    profiles a configuration other than the figure's."""
    st = get_strategy(method)
    accepted = set(st.options) | set(st.transform_options) | set(transform_option_names())
    capture: dict[str, Any] = {"batch": 1}
    strategy: dict[str, Any] = {}
    for key, value in fig.options.items():
        if key in CAPTURE_OPTIONS:
            if value is not None:
                capture[CAPTURE_OPTIONS[key]] = value
        elif key in accepted:
            strategy[key] = value
        elif key not in EVALUATOR_OPTIONS and key not in DESCRIPTIVE_OPTIONS:
            raise NotModelled(f"memplan cannot build the figure's {key}={value!r} with method {method!r}")
    return capture, strategy


_CAPTURES: OrderedDict[tuple, Captured] = OrderedDict()


def _captured(model: str, capture: dict[str, Any], method: str, options: dict[str, Any]) -> Captured:
    """The capture of ``model`` transformed for ``method`` with ``options``, shared by every
    figure whose network is the same (same capture, same transforms)."""
    shaping = split_options(method, options)[1]
    own = method if get_strategy(method).transform is not None else None
    key = (model, _frozen(capture), own, _frozen(shaping))
    if key not in _CAPTURES:
        _CAPTURES[key] = capture_model(model, method=method, method_options=shaping, **capture)
        if len(_CAPTURES) > CACHE_SIZE:
            _CAPTURES.popitem(last=False)
    return _CAPTURES[key]


def _frozen(options: dict[str, Any]) -> str:
    return json.dumps(options, sort_keys=True)


def _profile(fig: PublishedFigure, mode: str | None = None, method: str | None = None) -> Profile:
    method = method or fig.method
    if method == "inference":
        method = "last"
    capture, options = _options(fig, method)
    cap = _captured(fig.model, capture, method, options)
    mode = mode or (fig.mode if fig.mode in MODES else "pytorch")
    return profile_captured(cap, method, mode=mode, **options)


def _block_only(fig: PublishedFigure) -> bool:
    """A figure of one block (MobileTL Table 1): its quantities are sums over that block's layers."""
    return bool(fig.options.get("block"))


# --------------------------------------------------------------------------- evaluators

Evaluator = Callable[[PublishedFigure], "float | Ranged"]
EVALUATORS: Registry[Evaluator] = Registry("quantity")
evaluator = EVALUATORS.register


@evaluator("memory")
def memory(fig: PublishedFigure) -> float:
    return _profile(fig).totals.total_bytes


@evaluator("trainable_params")
def trainable_params(fig: PublishedFigure) -> float:
    return _profile(fig, mode="ideal").totals.trainable_params


def _flops(fig: PublishedFigure, costs: Any, direction: str) -> int:
    """Forward or backward FLOPs of ``costs``: conv / linear / matmul, plus every other op where
    the figure counts them (``other_ops``)."""
    return getattr(costs, f"{direction}_flops") + (getattr(costs, f"{direction}_other_flops")
                                                   if fig.options.get("other_ops") else 0)


@evaluator("training_flops")
def training_flops(fig: PublishedFigure) -> float:
    if _block_only(fig):
        p = _profile(fig, mode="ideal", method="full")
        return sum(_flops(fig, lc, "forward") + _flops(fig, lc, "backward") for lc in p.layers if lc.block)
    t = _profile(fig, mode="ideal").totals
    return _flops(fig, t, "forward") + _flops(fig, t, "backward")


@evaluator("forward_flops")
def forward_flops(fig: PublishedFigure) -> float:
    return _flops(fig, _profile(fig, mode="ideal").totals, "forward")


@evaluator("backward_flops")
def backward_flops(fig: PublishedFigure) -> float:
    return _flops(fig, _profile(fig, mode="ideal").totals, "backward")


@evaluator("activation_memory")
def activation_memory(fig: PublishedFigure) -> float:
    p = _profile(fig, mode="tinytl", method="full")
    if _block_only(fig):
        return sum(lc.saved_activation_bytes for lc in p.layers if lc.block)
    return p.totals.saved_activation_bytes


@evaluator("activation_over_model_size")
def activation_over_model_size(fig: PublishedFigure) -> float:
    p = _profile(fig, mode="tinytl", method="full")
    return p.totals.saved_activation_bytes / (4 * p.totals.params)


@evaluator("params")
def params(fig: PublishedFigure) -> float:
    p = _profile(fig, method="last")
    if _block_only(fig):
        return sum(lc.params for lc in p.layers if lc.block)
    if fig.options.get("include_classifier") is False:
        return p.totals.params - _classifier(p).params
    return p.totals.params


def _classifier(p: Profile):
    return [lc for lc in p.layers if lc.kind == "linear"][-1]


def _table_layer(fig: PublishedFigure):
    """MiniLearn Table 1 rows: input, then every conv / max-pool / linear layer in order."""
    p = _profile(fig, method="last")
    rows = [lc for lc in p.layers if lc.kind in ("conv", "maxpool", "linear")]
    return p, rows[fig.options["layer_index"] - 1]


@evaluator("macs")
def macs(fig: PublishedFigure) -> float:
    if "layer_index" in fig.options:
        _, layer = _table_layer(fig)
        if layer.kind == "maxpool":
            raise NotModelled("memplan counts pooling as other FLOPs, not MACs; the paper's pooling MACs follow no stated rule")
        return layer.macs
    return _profile(fig, method="last").totals.macs


@evaluator("output_bytes")
def output_bytes(fig: PublishedFigure) -> float:
    p = _profile(fig, method="last")
    if fig.options["layer_index"] == 0:
        return math.prod(p.input_shape[1:])
    _, layer = _table_layer(fig)
    return math.prod(layer.output_shape[1:])  # int8: one byte per element and sample


@evaluator("num_layers")
def num_layers(fig: PublishedFigure) -> float:
    return sum(1 for lc in _profile(fig, method="last").layers if lc.kind in ("conv", "linear"))


@evaluator("cache_bytes")
def cache_bytes(fig: PublishedFigure) -> float:
    return _profile(fig, mode="pytorch").extras["cache_bytes"]


@evaluator("frozen_forward_share", "frozen_forward_flops_share")
def frozen_share(fig: PublishedFigure) -> float:
    return _profile(fig, method="cache-reuse", mode="ideal").extras["single_stage_frozen_forward_share"]


@evaluator("storage")
def storage(fig: PublishedFigure) -> float:
    return _profile(fig, method="minilearn").extras["storage_bytes"]


@evaluator("ram")
def ram(fig: PublishedFigure) -> float:
    if fig.method == "minilearn":
        return _profile(fig).extras["ram_bytes"]
    return _profile(fig, method="minilearn").extras["model_bytes"]


# --------------------------------------------------------------------------- driver


def reproduce_figure(fig: PublishedFigure) -> Reproduction:
    base = dict(key=fig.key, source=fig.source, quantity=fig.quantity, model=fig.model, method=fig.method,
                mode=fig.mode, unit=fig.unit, published=fig.value)
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
        return Reproduction(**base, ours=ours, error=(ours - fig.value) / fig.value if fig.value else None,
                            status="in range" if inside else "outside range",
                            note=f"{fig.note}; range over {value.over}", low=low, high=high)
    value = value / UNIT_SCALE[fig.unit]
    error = (value - fig.value) / fig.value if fig.value else None
    close = fig.options.get("tolerance", TOLERANCE_CLOSE)
    label = fig.mode == "tinytraining" and fig.unit == "KiB" and math.floor(value) == fig.value
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
    return 0.5 * 10 ** -decimals


def reproduce(prefix: str = "", include_not_modelled: bool = True) -> list[Reproduction]:
    """Reproduce every published figure whose key starts with ``prefix``."""
    figures = FIGURES + (NOT_MODELED if include_not_modelled else [])
    return [reproduce_figure(f) for f in figures if f.key.startswith(prefix)]


from . import measured  # noqa: E402,F401  (registers the measured-SRAM evaluators)
