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

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from ..api import Captured, capture_model, profile_captured
from ..costs.records import Profile
from ..modes import MODES
from ..registry import Registry
from ..strategies import get_strategy
from .figures import FIGURES, NOT_MODELED, UNIT_SCALE, PublishedFigure

TOLERANCE_OK = 0.01
TOLERANCE_CLOSE = 0.05
#: the strategy whose architecture transform builds TinyTL's network (lite residual branches)
LITE_ARCHITECTURE = "tinytl-l"
#: figure options read as plan options of the figure's strategy (when it takes them)
PLAN_OPTIONS = ("blocks", "bits", "samples", "scheme")


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


def _capture_kwargs(fig: PublishedFigure) -> dict[str, Any]:
    o = fig.options
    kw: dict[str, Any] = {"batch": o.get("batch") or 1}
    if o.get("resolution"):
        kw["resolution"] = o["resolution"]
    if o.get("num_classes"):
        kw["classes"] = o["num_classes"]
    if o.get("norm") == "group":
        kw["norm"] = "group"
    return kw


def _lite_options(fig: PublishedFigure) -> dict[str, Any]:
    """TinyTL's lite residual settings of the figure, as the lite strategies' transform options."""
    o = fig.options
    out = {}
    if "lite_residual_kernel" in o:
        out["lite_kernel"] = o["lite_residual_kernel"]
    if "lite_residual_groups" in o:
        out["lite_groups"] = o["lite_residual_groups"]
    return out


def _architecture(fig: PublishedFigure, method: str) -> tuple[str | None, dict[str, Any]]:
    """(strategy whose architecture transform builds the profiled network, its options).

    A strategy with a transform of its own uses it, with the figure's settings of its transform
    options. A strategy without transform or options (full, last, norm, bias, tinytl-b) runs on
    TinyTL's lite-residual network when the figure gives the branch settings. Strategies with
    options (lastk, mobiletl: MobileTL Table 5's patch rows) are profiled on the plain network."""
    st = get_strategy(method)
    if st.transform is not None:
        return method, {k: v for k, v in _lite_options(fig).items() if k in st.transform_options}
    lite = _lite_options(fig)
    if fig.options.get("lite_residual") and lite and not st.options:
        return LITE_ARCHITECTURE, lite
    return None, {}


@lru_cache(maxsize=64)
def _captured(model: str, kw: tuple, arch: str | None, arch_options: tuple) -> Captured:
    return capture_model(model, method=arch, method_options=dict(arch_options), **dict(kw))


def _profile(fig: PublishedFigure, mode: str | None = None, method: str | None = None) -> Profile:
    method = method or fig.method
    if method == "inference":
        method = "last"
    accepted = get_strategy(method).options
    opts = {k: fig.options[k] for k in PLAN_OPTIONS if fig.options.get(k) is not None and k in accepted}
    arch, arch_options = _architecture(fig, method)
    cap = _captured(fig.model, tuple(sorted(_capture_kwargs(fig).items())), arch, tuple(sorted(arch_options.items())))
    mode = mode or (fig.mode if fig.mode in MODES else "pytorch")
    return profile_captured(cap, method, mode=mode, **opts)


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


@evaluator("training_flops")
def training_flops(fig: PublishedFigure) -> float:
    if _block_only(fig):
        p = _profile(fig, mode="ideal", method="full")
        rows = [lc for lc in p.layers if lc.block]
        return sum(lc.forward_flops + lc.backward_flops for lc in rows)
    t = _profile(fig, mode="ideal").totals
    return t.forward_flops + t.backward_flops


@evaluator("forward_flops")
def forward_flops(fig: PublishedFigure) -> float:
    return _profile(fig, mode="ideal").totals.forward_flops


@evaluator("backward_flops")
def backward_flops(fig: PublishedFigure) -> float:
    return _profile(fig, mode="ideal").totals.backward_flops


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
        return _profile(fig).extras["train_ram_bytes"]
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
