"""Python API: ``profile`` and ``compare`` return plain data (:class:`~memplan.costs.Profile`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch.nn as nn

from .costs import OPTIMIZER_STATES, Profile, compute
from .errors import BadOption
from .graph import LayerGraph, capture
from .loading import resolve, sample_shape
from .modes import get_mode
from .strategies import get_strategy, make_plan, transform_model

DEFAULT_METHODS = ("full", "last", "norm", "bias", "lastk")


@dataclass
class Captured:
    """A traced model at one input shape, reusable across strategies and modes."""

    graph: LayerGraph
    name: str
    resolution: int | None
    classes: int


def _positive(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or value < 1):
        raise BadOption(f"--{name} must be a positive integer, got {value!r}")


def capture_model(
    model: str | nn.Module,
    *,
    batch: int = 1,
    resolution: int | None = None,
    classes: int | None = None,
    input_shape: Sequence[int] | None = None,
    leaf_modules: Iterable[str | type] = (),
    block_names: Sequence[str] | None = None,
    method: str | None = None,
    method_options: dict[str, Any] | None = None,
    norm: str | None = None,
) -> Captured:
    """Trace ``model`` (zoo name, import spec or module) at ``batch`` x per-sample shape.

    ``input_shape`` is the per-sample shape (no batch); by default (3, r, r) at the zoo's
    resolution, or 224 for models outside the zoo. With ``method``, that strategy's
    architecture transform (if any) is applied before tracing. ``norm="group"`` swaps every
    BatchNorm for GroupNorm first (TinyTL's setting; see ``memplan.transforms``).
    """
    _positive("batch", batch)
    _positive("resolution", resolution)
    _positive("classes", classes)
    spec = resolve(model, classes)
    res = resolution or spec.resolution or 224
    shape = tuple(input_shape) if input_shape is not None else sample_shape(model, res)
    if norm is not None:
        from .transforms import swap_norm

        spec.model = swap_norm(spec.model, norm)
    if method is not None:
        spec.model = transform_model(spec.model, method, **(method_options or {}))
    graph = capture(spec.model, (batch, *shape), leaf_modules=leaf_modules, block_names=block_names, name=spec.name)
    classes_out = graph.nodes[-2].in_tensors[0].shape[-1]
    return Captured(graph, spec.name, None if input_shape is not None else res, classes_out)


def profile_captured(cap: Captured, method: str = "full", *, mode: str = "pytorch", optimizer: str = "sgd",
                     frozen_bits: int = 32, **options: Any) -> Profile:
    """Profile one strategy on an already captured model."""
    if optimizer not in OPTIMIZER_STATES:
        raise BadOption(f"unknown optimizer {optimizer!r}", f"choose one of: {', '.join(OPTIMIZER_STATES)}")
    if frozen_bits not in (8, 16, 32):
        raise BadOption(f"--frozen-bits must be 8, 16 or 32, got {frozen_bits}")
    acc = get_mode(mode)
    plan = make_plan(cap.graph, method, **options)
    prof = compute(cap.graph, plan, acc, optimizer=optimizer, frozen_bits=frozen_bits,
                   meta={"model": cap.name, "resolution": cap.resolution, "classes": cap.classes})
    extras = get_strategy(method).extras
    if extras is not None:
        prof.extras.update(extras(cap.graph, plan, prof))
    return prof


def profile(
    model: str | nn.Module,
    method: str = "full",
    *,
    mode: str = "pytorch",
    batch: int = 1,
    resolution: int | None = None,
    classes: int | None = None,
    input_shape: Sequence[int] | None = None,
    optimizer: str = "sgd",
    frozen_bits: int = 32,
    leaf_modules: Iterable[str | type] = (),
    block_names: Sequence[str] | None = None,
    norm: str | None = None,
    **options: Any,
) -> Profile:
    """Memory and FLOPs of fine-tuning ``model`` with ``method``, layer by layer.

    ``model``: zoo name (``memplan.zoo.names()``), ``package.module:attr``, ``file.py:attr``
    or an ``nn.Module``. ``mode``: accounting convention (``memplan.modes.MODES``).
    ``options``: strategy options, e.g. ``blocks=3`` for ``lastk``.
    """
    cap = capture_model(model, batch=batch, resolution=resolution, classes=classes, input_shape=input_shape,
                        leaf_modules=leaf_modules, block_names=block_names, method=method, method_options=options,
                        norm=norm)
    return profile_captured(cap, method, mode=mode, optimizer=optimizer, frozen_bits=frozen_bits, **options)


def compare(
    model: str | nn.Module,
    methods: Sequence[str | tuple[str, dict[str, Any]]] | None = None,
    *,
    mode: str = "pytorch",
    optimizer: str = "sgd",
    frozen_bits: int = 32,
    **capture_options: Any,
) -> list[Profile]:
    """One profile per strategy. ``methods`` items are names or (name, options). The model is
    traced once, plus once per strategy that transforms the architecture."""
    cap = capture_model(model, **capture_options)
    items = methods if methods is not None else default_methods(cap)
    out = []
    for item in items:
        name, opts = (item, {}) if isinstance(item, str) else item
        this = cap
        if get_strategy(name).transform is not None:
            this = capture_model(model, method=name, method_options=opts, **capture_options)
        out.append(profile_captured(this, name, mode=mode, optimizer=optimizer, frozen_bits=frozen_bits, **opts))
    return out


def default_methods(cap: Captured) -> list[tuple[str, dict[str, Any]]]:
    """The strategies ``compare`` shows when none are named: the basic ones, TinyTL's, and
    (for models with blocks) lastk and MobileTL on the last min(3, #blocks) blocks. TinyTL's
    lite residual branches need inputs of at least 64 px (their pooling has no padding)."""
    items: list[tuple[str, dict[str, Any]]] = [(m, {}) for m in ("full", "last", "norm", "bias", "tinytl-b")]
    k = min(3, len(cap.graph.blocks))
    if k and min(cap.graph.input_shape[2:], default=0) >= 64:
        items += [("tinytl-l", {}), ("tinytl-lb", {})]
    if k:
        items += [("lastk", {"blocks": k}), ("mobiletl", {"blocks": k})]
    return items
