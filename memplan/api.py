"""Python API: ``profile`` and ``compare`` return plain data (:class:`~memplan.costs.Profile`).

It also holds the one capture pipeline every entry point goes through (``profile``,
``compare``, ``apply_strategy``, ``verify``, ``reproduce``, ``search``):

1. :func:`build_model`: resolve the spec (zoo name, import spec or module), fix the per-sample
   input shape, swap the norms (``norm="group"``);
2. :func:`capture_built`: the architecture transform of a strategy (``Strategy.transform``
   from the strategy registry, with its options), then the meta-device trace.

:func:`capture_model` is both steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch.nn as nn

from .check import CHECK_BATCH, check as self_check
from .costs.engine import compute
from .costs.extras import strategy_extras
from .costs.records import Profile
from .errors import BadOption
from .graph import LayerGraph, capture
from .models import resolve, sample_shape, zoo
from .modes import get_mode
from .modes.tinytraining import ConvUpdateCost, conv_update_costs
from .nn.transforms import swap_norm
from .optim import OPTIMIZERS
from .strategies import DEFAULT_K, changes_architecture, make_plan, transform_model


@dataclass
class Built:
    """A model ready to trace: the module, its name and per-sample input shape."""

    name: str
    model: nn.Module
    sample_shape: tuple[int, ...]  # per-sample input shape (no batch)
    resolution: int | None  # None when the input shape was given explicitly
    block_names: Sequence[str] | None = None  # explicit blocks of the model (None: the structural rule)


@dataclass
class Captured:
    """A traced model at one input shape, reusable across strategies and modes."""

    graph: LayerGraph
    name: str
    resolution: int | None
    classes: int
    model: nn.Module  # the (transformed) module the graph was traced from


def _positive(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or value < 1):
        raise BadOption(f"--{name} must be a positive integer, got {value!r}")


def build_model(
    model: str | nn.Module,
    *,
    resolution: int | None = None,
    classes: int | None = None,
    input_shape: Sequence[int] | None = None,
    norm: str | None = None,
    meta: bool = True,
) -> Built:
    """Step 1 of the pipeline: resolve ``model`` (zoo models on the meta device unless
    ``meta=False``) and its per-sample input shape; ``input_shape`` (no batch) by default
    (3, r, r) at the zoo's resolution, or 224 for models outside the zoo. ``norm="group"``
    swaps every BatchNorm for GroupNorm (TinyTL's setting; ``memplan.nn.transforms``)."""
    _positive("resolution", resolution)
    _positive("classes", classes)
    spec = resolve(model, classes, meta=meta)
    res = resolution or spec.resolution or 224
    shape = tuple(input_shape) if input_shape is not None else sample_shape(model, res)
    if norm is not None:
        spec.model = swap_norm(spec.model, norm)
    return Built(spec.name, spec.model, shape, None if input_shape is not None else res, spec.block_names)


def capture_built(
    built: Built,
    *,
    batch: int = 1,
    method: str | None = None,
    method_options: dict[str, Any] | None = None,
    leaf_modules: Iterable[str | type] = (),
    block_names: Sequence[str] | None = None,
    output: str | int | None = None,
) -> Captured:
    """Step 2 of the pipeline: ``method``'s architecture transform (if it has one; the model is
    changed in place) and the capture at ``batch`` x the per-sample shape. ``output`` names the
    entry of a tuple / dict / namedtuple output that holds the logits (default: the first tensor)."""
    _positive("batch", batch)
    model = built.model
    if method is not None:
        model = transform_model(model, method, **(method_options or {}))
    blocks = block_names if block_names is not None else built.block_names
    graph = capture(
        model,
        (batch, *built.sample_shape),
        leaf_modules=leaf_modules,
        block_names=list(blocks) if blocks is not None else None,
        name=built.name,
        output=output,
    )
    return Captured(graph, built.name, built.resolution, graph.classes, model)


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
    output: str | int | None = None,
) -> Captured:
    """Trace ``model`` (zoo name, import spec or module) at ``batch`` x per-sample shape: the
    whole pipeline (:func:`build_model`, then :func:`capture_built`).

    ``input_shape`` is the per-sample shape (no batch). With ``method``, that strategy's
    architecture transform (if any) is applied before tracing.
    """
    _positive("batch", batch)
    built = build_model(model, resolution=resolution, classes=classes, input_shape=input_shape, norm=norm)
    return capture_built(
        built,
        batch=batch,
        method=method,
        method_options=method_options,
        leaf_modules=leaf_modules,
        block_names=block_names,
        output=output,
    )


def profile_captured(
    cap: Captured,
    method: str = "full",
    *,
    mode: str = "pytorch",
    optimizer: str = "sgd",
    frozen_bits: int = 32,
    check: bool = False,
    schedule: str | None = None,
    calibration: Any = "cpu",
    mode_options: dict[str, Any] | None = None,
    **options: Any,
) -> Profile:
    """Profile one strategy on an already captured model. ``check=True`` adds ``Profile.check``:
    predicted saved bytes (``pytorch`` mode) against a real CPU run of ``cap.model`` at the graph's
    batch under saved_tensors_hooks
    (:mod:`memplan.check`). ``schedule`` / ``calibration``: the simulated peak's training step
    and kernel workspaces (:func:`memplan.costs.engine.compute`). ``mode_options``: options of
    the mode (``Mode.configure``)."""
    OPTIMIZERS.choose(optimizer)
    if frozen_bits not in (8, 16, 32):
        raise BadOption(f"--frozen-bits must be 8, 16 or 32, got {frozen_bits}")
    acc = get_mode(mode).configure(**(mode_options or {}))
    plan = make_plan(cap.graph, method, **options)
    prof = compute(
        cap.graph,
        plan,
        acc,
        optimizer=optimizer,
        frozen_bits=frozen_bits,
        schedule=schedule,
        calibration=calibration,
        meta={"model": cap.name, "resolution": cap.resolution, "classes": cap.classes},
    )
    prof.extras.update(strategy_extras(cap.graph, plan, prof))
    if check:
        prof.check = asdict(self_check(cap.model, cap.graph, plan))
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
    output: str | int | None = None,
    check: bool = False,
    schedule: str | None = None,
    calibration: Any = "cpu",
    mode_options: dict[str, Any] | None = None,
    **options: Any,
) -> Profile:
    """Memory and FLOPs of fine-tuning ``model`` with ``method``, layer by layer.

    ``model``: zoo name (``memplan.models.zoo.names()``), ``package.module:attr``, ``file.py:attr``
    or an ``nn.Module``. ``mode``: accounting convention (``memplan.modes.MODES``).
    ``options``: strategy options, e.g. ``blocks=3`` for ``lastk``. ``output``: the key, field or
    index of the logits in a tuple / dict / namedtuple output (default: its first tensor).
    ``check=True``: compare the prediction with one real CPU forward + loss of the model at batch
    ``min(batch, memplan.check.CHECK_BATCH)`` under saved_tensors_hooks (``Profile.check``).
    ``schedule``: ``standard`` or ``tte`` (in-place update during backward; default: the mode's).
    ``calibration``: kernel workspaces in the peak (``"cpu"`` / ``"cuda"``: this machine's
    ``memplan calibrate`` file; a path; None: none). ``Profile.workspace`` says what was used.
    ``mode_options``: options of the mode, e.g. ``{"state_bits": 32}`` for ``tinytraining``.
    """
    cap = capture_model(
        model,
        batch=batch,
        resolution=resolution,
        classes=classes,
        input_shape=input_shape,
        leaf_modules=leaf_modules,
        block_names=block_names,
        method=method,
        method_options=options,
        norm=norm,
        output=output,
    )
    prof = profile_captured(
        cap,
        method,
        mode=mode,
        optimizer=optimizer,
        frozen_bits=frozen_bits,
        schedule=schedule,
        calibration=calibration,
        mode_options=mode_options,
        **options,
    )
    if check:
        small = cap
        if isinstance(model, str) or cap.graph.batch > CHECK_BATCH:  # a real model at a small batch
            if isinstance(model, str):
                built = build_model(
                    model, resolution=resolution, classes=classes, input_shape=input_shape, norm=norm, meta=False
                )
                real = transform_model(built.model, method, **options)
            else:
                built, real = None, cap.model  # already transformed
            shape = (min(batch, CHECK_BATCH), *cap.graph.input_shape[1:])
            blocks = block_names if block_names is not None else (built.block_names if built else None)
            graph = capture(
                real,
                shape,
                leaf_modules=leaf_modules,
                name=cap.name,
                output=output,
                block_names=list(blocks) if blocks is not None else None,
            )
            small = Captured(graph, cap.name, cap.resolution, graph.classes, real)
        prof.check = asdict(self_check(small.model, small.graph, make_plan(small.graph, method, **options)))
    return prof


def compare(
    model: str | nn.Module,
    methods: Sequence[str | tuple[str, dict[str, Any]]] | None = None,
    *,
    mode: str = "pytorch",
    optimizer: str = "sgd",
    frozen_bits: int = 32,
    mode_options: dict[str, Any] | None = None,
    **capture_options: Any,
) -> list[Profile]:
    """One profile per strategy. ``methods`` items are names or (name, options). The model is
    traced once, plus once per strategy (or architecture option) that transforms it."""
    cap = capture_model(model, **capture_options)
    items = methods if methods is not None else default_methods(cap)
    out = []
    for item in items:
        name, opts = (item, {}) if isinstance(item, str) else item
        this = cap
        if changes_architecture(name, opts):
            this = capture_model(model, method=name, method_options=opts, **capture_options)
        out.append(
            profile_captured(
                this, name, mode=mode, optimizer=optimizer, frozen_bits=frozen_bits, mode_options=mode_options, **opts
            )
        )
    return out


def default_methods(cap: Captured) -> list[tuple[str, dict[str, Any]]]:
    """The strategies ``compare`` shows when none are named: the basic ones, TinyTL's, and
    (for models with blocks) lastk and MobileTL on their default K blocks. TinyTL's
    lite residual branches need inputs of at least 64 px (their pooling has no padding)."""
    items: list[tuple[str, dict[str, Any]]] = [(m, {}) for m in ("full", "last", "norm", "bias", "tinytl-b")]
    k = min(DEFAULT_K, len(cap.graph.blocks))
    if k and min(cap.graph.input_shape[2:], default=0) >= 64:
        items += [("tinytl-l", {}), ("tinytl-lb", {})]
    if k:
        items += [("lastk", {"blocks": k}), ("mobiletl", {"blocks": k})]
    return items


def update_costs(model: str | nn.Module, **capture_options: Any) -> list[ConvUpdateCost]:
    """The cost of updating each conv of ``model`` under the ``tinytraining`` convention (the
    256KB paper's Figure 11a), one row per conv in conv-index order."""
    return conv_update_costs(capture_model(model, **capture_options).graph)


def describe_models() -> list[dict[str, Any]]:
    """One row per zoo model at its default resolution and head: name, per-sample input shape,
    classes, parameters, MACs, number of blocks and description."""
    rows = []
    for name in zoo.names():
        entry = zoo.get_entry(name)
        cap = capture_model(name)
        p = profile_captured(cap, "last")
        rows.append(
            {
                "name": name,
                "input_shape": list(entry.input_shape(entry.resolution)),
                "classes": cap.classes,
                "params": p.totals.params,
                "macs": p.totals.macs,
                "blocks": len(cap.graph.blocks),
                "description": entry.description,
            }
        )
    return rows
