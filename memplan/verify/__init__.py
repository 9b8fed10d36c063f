"""``verify``: predicted vs measured memory of real training steps, plain PyTorch vs memplan-applied.

For one model and strategy, two setups are built from the same random initialisation:

* ``pytorch``: ``requires_grad`` and norm flags set the plain way (``memplan.apply.apply_plain``),
  predicted by the ``pytorch`` accounting mode;
* ``applied``: ``memplan.apply_plan`` (lean autograd ops), predicted by the ``applied`` mode.

A plan with recomputed segments (a scheme's ``execution``) runs them in both setups (non-reentrant
``torch.utils.checkpoint``, ``memplan.nn.recompute``), and each setup is measured without them
too: the saving, predicted and measured (``SetupResult.without_recompute``). A plan in M
micro-batches (gradient accumulation) is predicted and measured on one micro-batch of ``batch / M``
samples and trains in M micro-batches (``memplan.train.fit``), and each setup is measured with the
whole batch at once too (``SetupResult.whole_batch``): the saving of micro-batching.

Each runs one forward + loss under ``saved_tensors_hooks`` (:func:`.measure.saved_bytes`:
unique storages, parameters and buffers excluded) and ``steps`` training steps on one random
batch. ``ok`` holds when both measured saved-activation byte counts are within ``tolerance``
bytes of their predictions (default 0: exact).

The step peak is informational (allocator rounding is not modelled; kernel workspaces are, once
this machine is calibrated with ``memplan calibrate``; :mod:`.meter`): measured peak = bytes of
the tensors resident when a step starts (parameters, buffers, optimizer state, the batch) + the
growth during the step, which is on CUDA ``torch.cuda.max_memory_allocated`` minus the
allocated bytes at the start, and on CPU the process's resident-set high-water mark (``VmHWM``
of ``/proc/self/status``, reset through ``/proc/self/clear_refs``) minus its resident set at
the start. So that freed tensors leave the resident set, the CPU meter fixes glibc's mmap
threshold at its initial 128 KiB for the rest of the process (glibc otherwise raises it as
large blocks are freed and then keeps freed memory resident: ProxylessNAS-Mobile, bias, batch
8, 224 px measured 356 MB against 95 MB with the fixed threshold; predicted 76 MB) and trims
the heap before each step. It is compared with memplan's ``peak_bytes``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn as nn

from ..accounting.engine import compute
from ..api import Built, build_model, planned_for, scheme_input_shape
from ..apply import apply_plain, apply_plan, plan_strategy
from ..errors import BadOption
from ..graph import LayerGraph
from ..models import recorded_shape
from ..modes import get_mode
from ..names import DEFAULT_OPTIMIZER
from ..nn.recompute import recompute_segments
from ..nn.train import fit
from ..optim import make_optimizer
from ..options import with_keywords
from ..plan import Plan
from ..profile_options import VerifyOptions
from .measure import saved_bytes
from .meter import PeakMeter, resident_bytes

#: exit code of ``memplan verify`` when a measured saved-bytes count misses its prediction
EXIT_MISMATCH = 1
#: the setups verify runs, each named by the accounting mode that predicts it -> how it readies the model
SETUPS: dict[str, Callable[[nn.Module, LayerGraph, Plan], Any]] = {
    "pytorch": lambda model, graph, plan: recompute_segments(apply_plain(model, graph, plan), plan.recompute),
    "applied": lambda model, graph, plan: apply_plan(model, plan, graph),
}


@dataclass
class SetupResult:
    """One setup (``pytorch``: plain flags, ``applied``: memplan.apply_plan); all sizes in bytes."""

    mode: str  # the accounting mode of the prediction (= the setup's name)
    predicted_saved: int
    measured_saved: int
    predicted_peak: int
    measured_peak: int | None  # None where the platform offers no way to measure it
    losses: list[float] = field(default_factory=list)  # per step, before its update
    #: a plan with recomputed segments (a scheme's ``execution``): (predicted, measured) saved bytes of
    #: the same setup without them, whose difference from the above is the saving; None without
    without_recompute: tuple[int, int] | None = None
    #: a plan in micro-batches (a scheme's ``execution``): (predicted, measured) saved bytes of the same
    #: setup with the whole batch at once, whose difference from the above is the saving; None without
    whole_batch: tuple[int, int] | None = None

    @property
    def saved_error(self) -> int:
        """measured - predicted saved-activation bytes (without the execution choices too, the larger miss)."""
        errors = [self.measured_saved - self.predicted_saved]
        for other in (self.without_recompute, self.whole_batch):
            if other is not None:
                errors.append(other[1] - other[0])
        return max(errors, key=abs)


@dataclass
class VerifyReport:
    model: str
    method: str
    options: dict[str, Any]
    input_shape: list[int]  # batch first
    device: str
    optimizer: str
    steps: int
    tolerance: int  # bytes
    peak_source: str  # how the peak was measured
    pytorch: SetupResult
    applied: SetupResult

    @property
    def ok(self) -> bool:
        return all(abs(r.saved_error) <= self.tolerance for r in (self.pytorch, self.applied))

    @property
    def saving(self) -> float:
        """Measured saved activations, plain PyTorch / applied (x times less)."""
        return self.pytorch.measured_saved / max(1, self.applied.measured_saved)


# --------------------------------------------------------------------------- verify


def _device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise BadOption(f"unknown device {device!r}", "use auto, cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BadOption("device cuda requested but no CUDA device is available", "use --device cpu")
    return dev


@dataclass(frozen=True)
class _Run:
    """What every setup of one verify runs with: its options and what verify resolved from them
    (the strategy's options, the input shape with the batch, the torch device, the optimizer)."""

    opts: VerifyOptions
    options: dict[str, Any]
    shape: tuple[int, ...]
    device: torch.device
    optimizer: str


def _without_recompute(built: Built, setup: str, run: _Run, x: torch.Tensor, y: torch.Tensor) -> tuple[int, int]:
    """(predicted, measured) saved bytes of ``setup`` on ``built`` with its plan's recomputed
    segments left out, on the batch ``(x, y)`` (one micro-batch where the plan has micro-batches)."""
    model, graph, plan = _planned(built, run, x.shape[0])
    plan = replace(plan, recompute=())
    SETUPS[setup](model, graph, plan)
    return compute(graph, plan, get_mode(setup)).totals.saved_activation_bytes, saved_bytes(model, x, y).bytes


def _planned(built: Built, run: _Run, batch: int) -> tuple[nn.Module, LayerGraph, Plan]:
    """A fresh copy of ``built``'s model on the run's device, traced at ``batch`` samples, and its plan."""
    model = copy.deepcopy(built.model).to(run.device)
    shape = (batch, *run.shape[1:])
    return plan_strategy(model, run.opts.method, input_shape=shape, block_names=built.block_names, **run.options)


def _whole_batch(
    model: nn.Module, graph: LayerGraph, plan: Plan, setup: str, x: torch.Tensor, y: torch.Tensor
) -> tuple[int, int]:
    """(predicted, measured) saved bytes of ``setup`` with the whole batch ``(x, y)`` at once, on
    ``model`` traced at that batch as ``graph``, ``plan`` in micro-batches (BadOption where they
    do not divide the batch)."""
    micro, batch = plan.micro_batches, graph.batch
    if batch % micro:
        raise BadOption(
            f"the scheme trains in {micro} micro-batches, which do not divide --batch {batch}",
            f"give a batch that is a multiple of {micro}",
        )
    whole = replace(plan, micro_batches=1)
    SETUPS[setup](model, graph, whole)
    return compute(graph, whole, get_mode(setup)).totals.saved_activation_bytes, saved_bytes(model, x, y).bytes


def _run_setup(built: Built, setup: str, run: _Run) -> SetupResult:
    """Predicted and measured saved bytes (and step peak) of ``setup`` (``SETUPS``) on ``built``; with
    micro-batches, the saved bytes are those of one micro-batch (the first ``batch / M`` samples)."""
    shape, device, optimizer = run.shape, run.device, run.optimizer
    lr, steps, seed = run.opts.lr, run.opts.steps, run.opts.seed
    model, graph, plan = _planned(built, run, shape[0])
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(shape, generator=gen).to(device)
    y = torch.randint(0, graph.classes, (shape[0],), generator=gen).to(device)
    whole = None
    if plan.micro_batches > 1:
        whole = _whole_batch(model, graph, plan, setup, x, y)
        model, graph, plan = _planned(built, run, shape[0] // plan.micro_batches)
    prof = compute(graph, plan, get_mode(setup), optimizer=optimizer)
    xs, ys = x[: graph.batch].clone(), y[: graph.batch].clone()  # one micro-batch, a tensor of its own as loaded
    without = _without_recompute(built, setup, run, xs, ys) if plan.recompute else None
    SETUPS[setup](model, graph, plan)
    measured = saved_bytes(model, xs, ys).bytes
    opt = make_optimizer(model.parameters(), optimizer, lr)
    meter = PeakMeter(device)
    losses: list[float] = []
    peak: int | None = None
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        resident = resident_bytes(model, opt, x, y)
        meter.start()
        losses += fit(model, opt, x, y, steps=1, micro_batches=plan.micro_batches)
        growth = meter.growth()
        if growth is not None:
            peak = max(peak or 0, resident + growth)
    return SetupResult(
        setup, prof.totals.saved_activation_bytes, measured, prof.totals.peak_bytes, peak, losses, without, whole
    )


@with_keywords(VerifyOptions, positional=("method",))
def verify(model: str | nn.Module, opts: VerifyOptions | None = None, **options: Any) -> VerifyReport:
    """Predicted vs measured saved activations (and step peak) of a strategy on ``model``, for
    plain PyTorch and for memplan's applied setup, on one random batch. ``opts``:
    :class:`~memplan.profile_options.VerifyOptions`, or its options by name (``method`` also by
    position).

    ``model``: zoo name, import spec or nn.Module (deep-copied, never changed); zoo models get a
    random initialisation (seeded by ``seed``). ``options``: the strategy's other options (besides
    ``blocks``, ``scheme``, ...: the flags of ``StrategyOptions``). ``scheme="scheme.json"`` for
    ``sparse``. ``norm="group"``: BatchNorm -> GroupNorm first
    (``memplan.nn.transforms.swap_norm``, TinyTL's setting). The model goes through the capture
    pipeline of ``memplan.api`` (built once, transformed and traced per setup). ``device``:
    ``auto`` (CUDA when present), ``cpu``, ``cuda``. ``tolerance``: allowed |measured -
    predicted| saved bytes. A ``scheme`` option sets the input shape it was planned at unless
    ``input_shape`` is given (with ``resolution``: the scheme's channels at that side)."""
    o = opts or VerifyOptions()
    method, batch, resolution, steps, tolerance, seed = o.method, o.batch, o.resolution, o.steps, o.tolerance, o.seed
    options = o.strategy.given(**options)
    optimizer = o.optimizer or DEFAULT_OPTIMIZER
    if steps < 1 or batch < 1 or tolerance < 0:
        raise BadOption("--steps and --batch must be positive and --tolerance non-negative")
    dev = _device(o.device)
    torch.manual_seed(seed)
    scheme = options.get("scheme")
    built = build_model(
        copy.deepcopy(model) if isinstance(model, nn.Module) else model,
        resolution=resolution,
        classes=o.classes,
        input_shape=o.input_shape or recorded_shape(scheme_input_shape(scheme), resolution),
        norm=o.norm,
        meta=False,
    )
    built.warn_assumed()
    shape = (batch, *built.sample_shape)
    run = _Run(o, options, shape, dev, optimizer)
    with planned_for(scheme, shape_given=o.input_shape is not None):
        results = {s: _run_setup(built, s, run) for s in SETUPS}
    return VerifyReport(
        built.name,
        method,
        dict(options),
        list(shape),
        str(dev),
        optimizer,
        steps,
        tolerance,
        PeakMeter(dev).source,
        **results,
    )
