"""``memplan reproduce``: every published figure of the seed papers next to memplan's value.

Each figure in :mod:`memplan.published` names a zoo model, a strategy, its options and the
accounting convention (mode) expected to rebuild it. This module translates those options
into one ``memplan`` profile and reads the figure's quantity off it: one small evaluator per
quantity, registered in ``EVALUATORS``. A figure no evaluator can rebuild is reported as
"not modelled" with the best explanation, never silently dropped.

Status: ``ok`` within 1%, or within the printed precision (a figure printed "23" stands for
[22.5, 23.5)), or, for the 256KB paper's scheme labels, when the label equals the computed
KiB rounded down (how the authors label schemes); ``close`` within 5%; ``differs`` otherwise.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any, Callable

from .api import Captured, capture_model, profile_captured
from .costs import Profile
from .published import FIGURES, NOT_MODELED, UNIT_SCALE, PublishedFigure

TOLERANCE_OK = 0.01
TOLERANCE_CLOSE = 0.05


class NotModelled(Exception):
    """The figure cannot be rebuilt by memplan; the message says why."""


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
    status: str  # ok | close | differs | not modelled
    note: str


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
    o = fig.options
    out = {}
    if "lite_residual_kernel" in o:
        out["lite_kernel"] = o["lite_residual_kernel"]
    if "lite_residual_groups" in o:
        out["lite_groups"] = o["lite_residual_groups"]
    return out


@lru_cache(maxsize=64)
def _captured(model: str, kw: tuple, lite: tuple, method: str | None, mopts: tuple) -> Captured:
    kwargs = dict(kw)
    if model.startswith("mobiletl-block-"):
        return _block_capture(model, kwargs.get("batch", 8))
    if lite:
        from .transforms import add_lite_residual, swap_norm
        from .loading import resolve

        spec = resolve(model, kwargs.get("classes"))
        net = spec.model
        if kwargs.pop("norm", None) == "group":
            net = swap_norm(net, "group")
        res = kwargs.get("resolution") or spec.resolution or 224
        opts = dict(lite)
        net = add_lite_residual(net, kernel=opts.get("lite_kernel", 5), groups=opts.get("lite_groups", 2),
                                input_shape=(3, res, res))
        cap = capture_model(net, **kwargs)
        cap.name = model
        return cap
    return capture_model(model, method=method, method_options=dict(mopts) if method else None, **kwargs)


def _block_capture(model: str, batch: int) -> Captured:
    from .zoo import mobiletl_blocks as mb

    net = mb.mobiletl_block_net(model.removeprefix("mobiletl-block-"))
    cap = capture_model(net, batch=batch, input_shape=mb.BLOCK_INPUT, block_names=[mb.BLOCK_NAME])
    cap.name = model
    return cap


def _profile(fig: PublishedFigure, mode: str | None = None, method: str | None = None) -> Profile:
    method = method or fig.method
    if method == "inference":
        method = "last"
    opts: dict[str, Any] = {k: fig.options[k] for k in ("blocks", "bits", "samples") if fig.options.get(k) is not None
                            and k in _strategy_options(method)}
    if method == "sparse":
        opts["scheme"] = fig.options["scheme"]
    lite = fig.options.get("lite_residual") and method in ("full", "last", "norm", "bias", "tinytl-b")
    mopts = {**_lite_options(fig), **opts} if method.startswith("tinytl-l") else {}
    cap = _captured(fig.model, tuple(sorted(_capture_kwargs(fig).items())),
                    tuple(sorted(_lite_options(fig).items())) if lite else (),
                    method if mopts or method.startswith("tinytl-l") else None,
                    tuple(sorted((k, v) for k, v in mopts.items() if not isinstance(v, (dict, list)))))
    mode = mode or (fig.mode if fig.mode in ("tinytl", "tinytraining", "pytorch", "ideal") else "pytorch")
    return profile_captured(cap, method, mode=mode, **{k: v for k, v in opts.items()
                                                       if k in _strategy_options(method)})


def _strategy_options(method: str) -> tuple[str, ...]:
    from .strategies import get_strategy

    st = get_strategy(method)
    return st.options


# --------------------------------------------------------------------------- evaluators

Evaluator = Callable[[PublishedFigure], float]
EVALUATORS: dict[str, Evaluator] = {}


def evaluator(*quantities: str) -> Callable[[Evaluator], Evaluator]:
    def register(fn: Evaluator) -> Evaluator:
        for q in quantities:
            EVALUATORS[q] = fn
        return fn
    return register


@evaluator("memory")
def memory(fig: PublishedFigure) -> float:
    return _profile(fig).totals.total_bytes


@evaluator("trainable_params")
def trainable_params(fig: PublishedFigure) -> float:
    return _profile(fig, mode="ideal").totals.trainable_params


@evaluator("training_flops")
def training_flops(fig: PublishedFigure) -> float:
    if fig.model.startswith("mobiletl-block-"):
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
    if fig.model.startswith("mobiletl-block-"):
        return sum(lc.saved_activation_bytes for lc in p.layers if lc.block)
    return p.totals.saved_activation_bytes


@evaluator("activation_over_model_size")
def activation_over_model_size(fig: PublishedFigure) -> float:
    p = _profile(fig, mode="tinytl", method="full")
    return p.totals.saved_activation_bytes / (4 * p.totals.params)


@evaluator("params")
def params(fig: PublishedFigure) -> float:
    p = _profile(fig, method="last")
    if fig.model.startswith("mobiletl-block-"):
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
        value = fn(fig) / UNIT_SCALE[fig.unit]
    except NotModelled as why:
        return Reproduction(**base, ours=None, error=None, status="not modelled", note=str(why))
    error = (value - fig.value) / fig.value if fig.value else None
    label = fig.mode == "tinytraining" and fig.unit == "KiB" and math.floor(value) == fig.value
    if label or abs(value - fig.value) <= _half_unit(fig.value) or (error is not None and abs(error) <= TOLERANCE_OK):
        status = "ok"
    elif error is not None and abs(error) <= TOLERANCE_CLOSE:
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


def to_dicts(rows: list[Reproduction]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]
