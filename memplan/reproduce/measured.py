"""Evaluators of the 256KB paper's *measured* peak-SRAM figures (``data/tinytraining_measured.json``)
against the ``mcu`` mode (:mod:`memplan.modes.mcu`).

Figure options (besides batch / resolution / num_classes):

* ``plan``: a strategy's name (``"full"``: every layer trains), or the update scheme: ``scheme`` (the key of a labelled
  scheme in ``tinytraining.json``) or ``schemes`` (several keys: the setting is not stated, the row
  shows the range over them, ``reference`` names the one reported as ours);
* ``schedule``: ``standard`` (no reordering: gradients kept until the update) or ``tte``;
* ``settings``: a list of :class:`~memplan.modes.mcu.McuSettings` overrides (the range runs over
  them too; default: the ``mcu`` mode's);
* ``arena_only``: leave the trainable weights and biases out (they live outside TinyEngine's arena);
* ``tolerance``: the relative error a fully stated figure is judged at (measurements: 10%);
* ``mcu_ratio``: ``numerator`` / ``denominator`` override ``plan`` / ``schedule`` for each side, the
  same scheme on both.
"""

from __future__ import annotations

from typing import Any

from ..accounting.engine import compute
from ..modes.mcu import McuMode, McuSettings
from ..strategies import STRATEGIES, make_plan
from .base import Ranged, captured, evaluator, figure_options
from .figures import PublishedFigure, by_key


def _scheme(key: str) -> dict[str, Any]:
    return by_key(key).options["scheme"]


def _peak(fig: PublishedFigure, plan: str | dict[str, Any], schedule: str, settings: dict[str, Any]) -> int:
    """The mcu peak of ``plan``: a strategy's name (``full``) or a scheme."""
    cap = captured(fig.model, figure_options(fig, "full")[0], "full", {})
    p = make_plan(cap.graph, plan) if isinstance(plan, str) else make_plan(cap.graph, "sparse", scheme=plan)
    mode = McuMode("mcu", McuSettings(**settings), "")
    prof = compute(cap.graph, p, mode, schedule=schedule, calibration=None)
    peak = prof.totals.peak_bytes
    if fig.options.get("arena_only"):
        peak -= prof.extras["mcu"]["static"]["trainable_params"]
    return peak


def _choices(fig: PublishedFigure) -> list[tuple[str, Any, dict[str, Any]]]:
    """(label, scheme or strategy name, settings) of every plausible setting (``schemes``: figure keys of
    schemes, or a strategy's name); the first is the reference."""
    o = fig.options
    schemes = [o["scheme"]] if "scheme" in o else list(o.get("schemes", ["full"]))
    if "reference" in o:
        schemes.sort(key=lambda k: k != o["reference"])
    settings = o.get("settings") or [{}]
    return [
        (
            f"{k if k in STRATEGIES else k.split('.')[-2]}{'/' + str(s) if s else ''}",
            k if k in STRATEGIES else _scheme(k),
            s,
        )
        for k in schemes
        for s in settings
    ]


def _ranged(values: list[tuple[str, float]], over: str) -> float | Ranged:
    if len(values) == 1:
        return values[0][1]
    nums = [v for _, v in values]
    return Ranged(values[0][1], min(nums), max(nums), over, {k: v for k, v in values})


@evaluator("mcu_peak")
def mcu_peak(fig: PublishedFigure) -> float | Ranged:
    o = fig.options
    plan_override = o.get("plan")
    values = [
        (label, float(_peak(fig, plan_override or scheme, o.get("schedule", "tte"), s)))
        for label, scheme, s in _choices(fig)
    ]
    return _ranged(values, "the update schemes (and settings) the paper does not state")


@evaluator("mcu_ratio")
def mcu_ratio(fig: PublishedFigure) -> float | Ranged:
    o = fig.options
    values = []
    for label, scheme, s in _choices(fig):
        sides = []
        for side in (o["numerator"], o["denominator"]):
            plan = side.get("plan") or scheme
            sides.append(_peak(fig, plan, side.get("schedule", "tte"), s))
        values.append((label, sides[0] / sides[1]))
    return _ranged(values, "the update schemes the paper does not state")
