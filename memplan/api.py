"""Python API: ``profile`` and ``compare`` return plain data (:class:`~memplan.costs.Profile`).

It also holds the one capture pipeline, :func:`capture` (``memplan.capture``), that every entry
point goes through (``profile``, ``compare``, ``apply_strategy``, ``verify``, ``reproduce``,
``search``, ``contrib``):

1. :func:`build_model`: resolve the spec (zoo name, import spec or module), fix the per-sample
   input shape, swap the norms (``norm="group"``);
2. the architecture transform of a strategy (``Strategy.transform`` from the strategy registry,
   with its options), then the meta-device capture (``memplan.graph.capture.capture_graph``).

The result, :class:`Captured`, carries the graph, the module it was traced from and the
``torch.fx`` GraphModule (``Captured.gm``). Only the engine layers below this one (architecture
transforms that read a block's shapes, strategies that read a trace) call the graph layer's
``capture_graph`` / ``trace`` themselves: they run inside step 2.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch.fx as fx
import torch.nn as nn

from .accounting.devices import fit, load_device
from .accounting.engine import compute
from .accounting.extras import strategy_extras
from .accounting.microbatch import micro_batch_extras, micro_batch_size
from .check import CHECK_BATCH, check as self_check
from .costs.records import Profile
from .errors import AssumptionWarning, BadOption, MemplanError
from .graph import LayerGraph
from .graph.autocast import AMP_DTYPES, amp_label
from .graph.capture import StepRun, capture_graph
from .models import recorded_shape, resolve, sample_shape, zoo
from .modes import get_mode
from .modes.tinytraining import ConvUpdateCost, conv_update_costs
from .names import DEFAULT_OPTIMIZER, PROFILE_MODE
from .nn.transforms import replace_module, swap_norm
from .optim import OPTIMIZERS
from .options import with_keywords
from .plan.recorded import planned_for, scheme_input_shape, scheme_micro_batches, scheme_optimizer
from .profile_options import Capture as CaptureOptions, CompareOptions, Costing, ProfileOptions
from .strategies import as_prepared, changes_architecture, make_plan, transform_model
from .strategies.base import compared

#: input side (px) assumed for a model outside the zoo when neither an input shape nor a resolution is given
ASSUMED_RESOLUTION = 224


@dataclass
class Built:
    """A model ready to trace: the module, its name and per-sample input shape."""

    name: str
    model: nn.Module
    sample_shape: tuple[int, ...]  # per-sample input shape (no batch)
    resolution: int | None  # None when the input shape was given explicitly
    block_names: Sequence[str] | None = None  # explicit blocks of the model (None: the structural rule)
    assumed: bool = False  # the input shape was assumed (ASSUMED_RESOLUTION): no shape, resolution or zoo default

    @property
    def assumption(self) -> str:
        """What was assumed, in words (for a warning or an error's hint)."""
        return (
            f"{self.name}: no input shape given, traced at the assumed {'x'.join(map(str, self.sample_shape))} "
            "(give --input-shape C,H,W / input_shape=(C, H, W), or --resolution R)"
        )

    def warn_assumed(self) -> None:
        """An :class:`~memplan.errors.AssumptionWarning` when the input shape was assumed."""
        if self.assumed:
            warnings.warn(self.assumption, AssumptionWarning, stacklevel=3)


@dataclass
class Captured:
    """A traced model at one input shape, reusable across strategies and modes."""

    graph: LayerGraph
    name: str
    resolution: int | None
    classes: int
    model: nn.Module  # the (transformed) module the graph was traced from

    @property
    def gm(self) -> fx.GraphModule:
        """The ``torch.fx`` GraphModule the graph was built from (symbolic or recorded trace)."""
        return self.graph.gm


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
    (3, r, r) at the zoo's resolution, or :data:`ASSUMED_RESOLUTION` for models outside the zoo
    (``Built.assumed``: a capture that works says so in an ``AssumptionWarning``, one that fails
    in its error). ``norm="group"``
    swaps every BatchNorm for GroupNorm (TinyTL's setting; ``memplan.nn.transforms``).
    Callers that build once and capture several copies (``memplan.verify``) use it alone."""
    _positive("resolution", resolution)
    _positive("classes", classes)
    spec = resolve(model, classes, meta=meta)
    res = resolution or spec.resolution or ASSUMED_RESOLUTION
    shape = tuple(input_shape) if input_shape is not None else sample_shape(model, res)
    if norm is not None:
        spec.model = swap_norm(spec.model, norm)
    assumed = input_shape is None and resolution is None and spec.resolution is None
    return Built(spec.name, spec.model, shape, None if input_shape is not None else res, spec.block_names, assumed)


@with_keywords(CaptureOptions, positional=("input_shape",))
def capture(
    model: str | nn.Module,
    opts: CaptureOptions | None = None,
    *,
    method: str | None = None,
    method_options: dict[str, Any] | None = None,
    name: str | None = None,
    meta: bool = True,
    runnable: bool = False,
) -> Captured:
    """The capture pipeline: ``model`` (zoo name, import spec or module) traced at ``batch`` x
    the per-sample ``input_shape`` (no batch; default (3, r, r) at ``resolution``, the zoo's or
    224 px) on the meta device, as a :class:`Captured` (graph, module, GraphModule). ``opts``:
    :class:`~memplan.profile_options.Capture`, or its options by name (``input_shape`` also by
    position).

    ``amp``: ``"bf16"`` / ``"fp16"``, the training step under ``torch.autocast`` on the CPU
    (``memplan.graph.autocast``; an autocast in the model's forward is honoured without it).
    ``classes``: the head size of zoo / import-spec models. ``norm="group"``: BatchNorm ->
    GroupNorm first. ``method``: that strategy's architecture transform (if any) with
    ``method_options``, applied in place before tracing. ``leaf_modules`` / ``block_names`` /
    ``output``: modules traced as one op, explicit blocks, the logits entry of a tuple / dict
    output. ``name``: the model's name in the graph and messages (default: the spec, or the
    class name). ``meta=False`` builds zoo models with real (random) weights. ``runnable=True``:
    ``Captured.gm`` runs the model as it is (symbolic trace only, under the model's own train /
    eval flags; ``memplan.graph.capture.capture_graph``), for the contribution feature cache.
    """
    o = opts or CaptureOptions()
    _positive("batch", o.batch)
    if o.amp is not None and o.amp not in AMP_DTYPES:
        raise BadOption(f"--amp must be one of {', '.join(AMP_DTYPES)}, got {o.amp!r}")
    built = build_model(
        model, resolution=o.resolution, classes=o.classes, input_shape=o.input_shape, norm=o.norm, meta=meta
    )
    net = built.model
    blocks = o.block_names if o.block_names is not None else built.block_names

    def traced() -> LayerGraph:
        return capture_graph(
            net,
            (o.batch, *built.sample_shape),
            leaf_modules=o.leaf_modules,
            block_names=list(blocks) if blocks is not None else None,
            name=name or built.name,
            output=o.output,
            runnable=runnable,
            step=StepRun(own_modes=as_prepared(method), amp=AMP_DTYPES.get(o.amp) if o.amp is not None else None),
        )

    try:
        if method is not None:
            net = transform_model(net, method, input_shape=built.sample_shape, **(method_options or {}))
        graph = traced()
        if o.classes is not None and graph.classes != o.classes and isinstance(model, str):
            _rehead(net, graph, o.classes)  # a model memplan built: its classifier sized to the task
            graph = traced()
    except MemplanError as exc:
        if not built.assumed:
            raise
        raise type(exc)(exc.message, built.assumption) from None
    built.warn_assumed()
    return Captured(graph, name or built.name, built.resolution, graph.classes, net)


def _rehead(net: nn.Module, graph: LayerGraph, classes: int) -> None:
    """Re-head ``net`` (built by memplan from a spec without ``num_classes``) for ``classes`` outputs: a new
    ``nn.Linear`` in place of its classifier (a one-line error for a classifier that is no such module)."""
    head = graph.classifier
    if not isinstance(head.module, nn.Linear) or not head.name or not head.params:
        raise BadOption(
            f"{graph.model_name} outputs {graph.classes} classes, not {classes}, and its classifier "
            f"{head.name!r} is no nn.Linear module memplan can replace",
            f"give a model factory that accepts num_classes, or build the model with {classes} outputs",
        )
    old = head.module  # the new head: torch's default initialisation from its current random state
    new = nn.Linear(old.in_features, classes, old.bias is not None, old.weight.device, old.weight.dtype)
    replace_module(net, head.name, new.train(old.training))


@with_keywords(Costing, param="costing")
def profile_captured(
    cap: Captured,
    method: str = "full",
    costing: Costing | None = None,
    *,
    check: bool = False,
    accumulated: bool = False,
    **options: Any,
) -> Profile:
    """Profile one strategy on an already captured model, counted as ``costing`` says
    (:class:`~memplan.profile_options.Costing`, or its options by name: ``mode="applied"``).

    ``options``: the strategy's options. ``costing.schedule`` / ``calibration``: the simulated
    peak's training step and kernel workspaces (:func:`memplan.accounting.engine.compute`);
    ``mode_options``: options of the mode (``Mode.configure``); ``optimizer``: whose state is
    counted (default: the one a given ``scheme`` records, else ``sgd``); ``target``: a hardware
    profile (``memplan.accounting.devices``): the mode defaults to its mode and
    ``Profile.extras["device"]`` says whether the peak fits it. ``check=True`` adds
    ``Profile.check``: predicted saved bytes (``pytorch`` mode) against a real CPU run of
    ``cap.model`` at the graph's batch under saved_tensors_hooks (:mod:`memplan.check`).
    ``accumulated=True``: the peak of a later micro-batch of gradient accumulation (the gradients
    held from the start of the step)."""
    c = costing or Costing()
    optimizer = c.optimizer or scheme_optimizer(options.get("scheme")) or DEFAULT_OPTIMIZER
    OPTIMIZERS.choose(optimizer)
    if c.frozen_bits not in (8, 16, 32):
        raise BadOption(f"--frozen-bits must be 8, 16 or 32, got {c.frozen_bits}")
    device = load_device(c.target) if c.target is not None else None
    mode = c.mode or (device.mode if device is not None else PROFILE_MODE)
    acc = get_mode(mode).configure(**(c.mode_options or {}))
    plan = make_plan(cap.graph, method, **options)
    meta = {"model": cap.name, "resolution": cap.resolution, "classes": cap.classes}
    amp = amp_label(cap.graph.amp, any(n.kind == "cast" for n in cap.graph.nodes))
    if amp is not None and not acc.autocast:
        raise BadOption(f"mode {mode!r} does not cost a step under autocast (amp: {amp})", "use --mode pytorch")
    prof = compute(
        cap.graph,
        plan,
        acc,
        optimizer=optimizer,
        frozen_bits=c.frozen_bits,
        schedule=c.schedule,
        calibration=c.calibration,
        meta={**meta, "amp": amp} if amp is not None else meta,
        accumulated=accumulated,
    )
    prof.extras.update(strategy_extras(cap.graph, plan, prof))
    if device is not None:
        prof.extras["device"] = fit(prof, device, cap.graph)
    if check:
        prof.check = asdict(self_check(cap.model, cap.graph, plan))
    return prof


@with_keywords(ProfileOptions, positional=("method",))
def profile(model: str | nn.Module, opts: ProfileOptions | None = None, **options: Any) -> Profile:
    """Memory and FLOPs of fine-tuning ``model`` with a strategy, layer by layer.

    ``model``: zoo name (``memplan.models.zoo.names()``), ``package.module:attr``, ``file.py:attr``
    or an ``nn.Module``. ``opts``: :class:`~memplan.profile_options.ProfileOptions`, or its options
    by name (``method``, also by position; ``mode``, ``batch``, ``resolution``, ``blocks``, ...;
    ``mode`` is an accounting convention of ``memplan.modes.MODES``). ``options``: the strategy's
    other options, e.g. ``lite_kernel=3`` for ``tinytl-lb``. ``output``: the key, field or index of
    the logits in a tuple / dict / namedtuple output (default: its first tensor).
    ``check=True``: compare the prediction with one real CPU forward + loss of the model at batch
    ``min(batch, memplan.check.CHECK_BATCH)`` under saved_tensors_hooks (``Profile.check``).
    ``schedule``: ``standard`` or ``tte`` (in-place update during backward; default: the mode's).
    ``calibration``: kernel workspaces in the peak (``"cpu"`` / ``"cuda"``: this machine's
    ``memplan calibrate`` file; a path; None: none). ``Profile.workspace`` says what was used.
    ``mode_options``: options of the mode, e.g. ``{"state_bits": 32}`` for ``tinytraining``.
    ``target``: a hardware profile (e.g. ``stm32f746``): its mode unless ``mode`` is given, and
    ``Profile.extras["device"]`` says whether the peak fits. A ``scheme`` option sets the input
    shape it was planned at unless ``input_shape`` is given (with ``resolution``: its channels at
    that side); a model that fails there is refused as not the scheme's (:func:`planned_for`).
    ``micro_batch``: M, gradient accumulation over M micro-batches of ``batch / M``
    (``memplan.accounting.microbatch``: one micro-batch's activations, ``Profile.extras["micro_batch"]``);
    default: the count a ``scheme`` records (``execution.micro_batches``; refused where it does not
    divide ``batch``), else none.
    """
    o = opts or ProfileOptions()
    method, shaped, strategy = o.method, o.capture, o.strategy.given(**options)
    scheme = strategy.get("scheme")
    if shaped.input_shape is None:
        shaped = shaped.replace(input_shape=recorded_shape(scheme_input_shape(scheme), shaped.resolution))
    micro = _micro_batches(o.micro_batch, shaped.batch, scheme)
    if micro is not None:
        _positive("batch", shaped.batch)
        shaped = shaped.replace(batch=micro_batch_size(shaped.batch, micro))
    with planned_for(scheme, shape_given=o.capture.input_shape is not None):
        cap = capture(model, shaped, method=method, method_options=strategy)
    accumulated = micro is not None and micro > 1
    prof = profile_captured(cap, method, o.costing, accumulated=accumulated, **strategy)
    if micro is not None:
        plan = make_plan(cap.graph, method, **strategy)
        prof.extras["micro_batch"] = micro_batch_extras(cap.graph, plan, micro, o.capture.batch)
    if o.check:
        small = _checkable(model, cap, shaped, method, strategy)
        prof.check = asdict(self_check(small.model, small.graph, make_plan(small.graph, method, **strategy)))
    return prof


def _micro_batches(given: int | None, batch: int, scheme: Any) -> int | None:
    """The micro-batches counted: ``given``, else the count ``scheme`` records (if any), else None."""
    recorded = scheme_micro_batches(scheme)
    if given is not None or recorded == 1:
        return given
    _positive("batch", batch)
    if batch % recorded:
        msg = f"the scheme trains in {recorded} micro-batches, which do not divide --batch {batch}"
        raise BadOption(msg, f"give a batch that is a multiple of {recorded}, or --micro-batch")
    return recorded


def _checkable(
    model: str | nn.Module, cap: Captured, opts: CaptureOptions, method: str, strategy: dict[str, Any]
) -> Captured:
    """What ``profile(check=True)`` runs: ``cap`` itself, or the real model (a zoo / import spec
    built with weights, or the module already transformed) captured again at the check's batch."""
    if not isinstance(model, str) and cap.graph.batch <= CHECK_BATCH:
        return cap
    again = opts.replace(input_shape=cap.graph.input_shape[1:], batch=min(opts.batch, CHECK_BATCH))
    if isinstance(model, str):
        return capture(model, again, meta=False, method=method, method_options=strategy)
    # the module as transformed and traced above: its norms swapped and its head sized already
    shaped = again.replace(resolution=None, classes=None, norm=None)
    return capture(cap.model, shaped, name=cap.name, method=method if as_prepared(method) else None)


@with_keywords(CompareOptions)
def compare(
    model: str | nn.Module,
    methods: Sequence[str | tuple[str, dict[str, Any]]] | None = None,
    opts: CompareOptions | None = None,
) -> list[Profile]:
    """One profile per strategy. ``methods`` items are names or (name, options) (default:
    :func:`default_methods`). ``opts``: :class:`~memplan.profile_options.CompareOptions` (the
    capture and how it is counted), or its options by name. The model is traced once, plus once per
    strategy (or architecture option) that transforms it."""
    o = opts or CompareOptions()
    cap = capture(model, o.capture)
    items = methods if methods is not None else default_methods(cap)
    out = []
    for item in items:
        name, strategy = (item, {}) if isinstance(item, str) else item
        this = cap
        if changes_architecture(name, strategy) or (
            as_prepared(name) and not all(cap.graph.prepared_training.values())
        ):
            this = capture(model, o.capture, method=name, method_options=strategy)
        out.append(profile_captured(this, name, o.costing, **strategy))
    return out


def default_methods(cap: Captured) -> list[tuple[str, dict[str, Any]]]:
    """The strategies ``compare`` shows when none are named, with their options on this model
    (each strategy's entry says whether and where: ``Strategy.compare``): the basic ones, TinyTL's,
    and (for models with blocks) lastk and MobileTL on their default K blocks."""
    return compared(cap.graph)


def update_costs(
    model: str | nn.Module, opts: CaptureOptions | None = None, **capture_options: Any
) -> list[ConvUpdateCost]:
    """The cost of updating each conv of ``model`` under the ``tinytraining`` convention (the
    256KB paper's Figure 11a), one row per conv in conv-index order. ``opts`` / ``capture_options``:
    as :func:`capture` takes them."""
    return conv_update_costs(capture(model, opts, **capture_options).graph)


def describe_models() -> list[dict[str, Any]]:
    """One row per zoo model at its default resolution and head: name, per-sample input shape,
    classes, parameters, MACs, number of blocks and description."""
    rows = []
    for name in zoo.names():
        entry = zoo.get_entry(name)
        cap = capture(name)
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
