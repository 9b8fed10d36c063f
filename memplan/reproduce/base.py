"""What every evaluator of ``memplan reproduce`` shares: the figure -> profile translation
(:func:`figure_options`, :func:`captured`, :func:`profile_of`), the :class:`Ranged` answer,
:class:`NotModelled` and the evaluator registry (quantity -> function)."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import api
from ..api import Captured, profile_captured
from ..costs.records import Profile
from ..registry import Registry
from ..strategies import changes_architecture, get_strategy, split_options
from ..strategies.base import transform_option_names
from .figures import (
    CAPTURE_OPTIONS,
    DESCRIPTIVE_OPTIONS,
    EVALUATOR_OPTIONS,
    FIGURE_MODES,
    PublishedFigure,
    figure_method,
)

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


# --------------------------------------------------------------------------- profiles


def figure_options(fig: PublishedFigure, method: str) -> tuple[dict[str, Any], dict[str, Any]]:
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


def captured(model: str, capture: dict[str, Any], method: str, options: dict[str, Any]) -> Captured:
    """The capture of ``model`` transformed for ``method`` with ``options``, shared by every
    figure whose network is the same (same capture, same transforms)."""
    arch = changes_architecture(method, options)
    shaping = split_options(method, options)[1] if arch else {}
    own = method if arch and get_strategy(method).transform is not None else None
    key = (model, _frozen(capture), own, _frozen(shaping))
    if key not in _CAPTURES:
        _CAPTURES[key] = api.capture(model, method=method, method_options=shaping, **capture)
        if len(_CAPTURES) > CACHE_SIZE:
            _CAPTURES.popitem(last=False)
    return _CAPTURES[key]


def _frozen(options: dict[str, Any]) -> str:
    return json.dumps(options, sort_keys=True)


def profile_of(fig: PublishedFigure, mode: str | None = None, method: str | None = None) -> Profile:
    method = figure_method(method or fig.method).strategy
    capture, options = figure_options(fig, method)
    cap = captured(fig.model, capture, method, options)
    return profile_captured(cap, method, mode=mode or FIGURE_MODES[fig.mode].profile_mode, **options)


def block_only(fig: PublishedFigure) -> bool:
    """A figure of one block (MobileTL Table 1): its quantities are sums over that block's layers."""
    return bool(fig.options.get("block"))


# --------------------------------------------------------------------------- evaluators

Evaluator = Callable[[PublishedFigure], "float | Ranged"]
EVALUATORS: Registry[Evaluator] = Registry("quantity")
evaluator = EVALUATORS.register
