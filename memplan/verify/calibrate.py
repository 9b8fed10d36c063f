"""``memplan calibrate``: measure the kernel workspaces of this machine (:mod:`memplan.costs.workspace`).

Each distinct kernel configuration of a graph under a plan runs once, alone, on fresh tensors
of the captured shapes (the replay of :mod:`memplan.costs.observe`, on the real device), with
``requires_grad`` and norm train / eval flags as the plan sets them:

* forward: every allocation and free during the call (torch.profiler memory records on CPU,
  ``torch.cuda.max_memory_allocated`` on CUDA); workspace = the most in use during the call
  less what is in use after it (output, private saved tensors);
* backward: ``torch.autograd.grad`` of the outputs (with a gradient of their shape) with
  respect to the inputs and parameters that need one; workspace = the most in use during it
  less the gradients it returns.

Both are clamped at 0. Entries shared with an earlier model or strategy are not measured again,
so calibrating the whole zoo costs about one step per distinct configuration.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..api import capture, default_methods
from ..costs.observe import Replay
from ..costs.workspace import Calibration, empty_calibration, kernel_key, kernel_label
from ..errors import BadOption, MemplanError, ModelNotFound
from ..graph import LayerGraph, flatten
from ..graph.kinds import NORM_KINDS
from ..options import with_keywords
from ..plan import OpView, Plan, grad_flow
from ..profile_options import CalibrateOptions
from ..strategies import get_strategy, make_plan


@dataclass
class CalibrationRun:
    """What one ``calibrate`` call did: configurations seen, measured now, failed, seconds."""

    path: str
    configs: int
    measured: int
    failed: dict[str, str]  # label -> why the op could not run
    seconds: float
    skipped: dict[str, str] = field(default_factory=dict)  # "model method" -> why it has no plan


# --------------------------------------------------------------------------- measuring

LABEL = "memplan::calibrate::"


def _prepare(op: OpView, device: torch.device) -> tuple[list[torch.Tensor], Callable[[], Any]]:
    """Fresh tensors for one op (inputs and parameters with the plan's requires_grad flags) and its call."""
    if op.node.fx is None and op.node.kind == "cross_entropy":
        x_info, t = op.node.in_tensors[0], op.node.attrs["target"]
        x = torch.zeros(x_info.shape, dtype=x_info.dtype, device=device).requires_grad_(op.req_in[0])
        target = torch.zeros(t.shape, dtype=t.dtype, device=device)
        return [x], lambda: torch.nn.functional.cross_entropy(x, target)
    rp = Replay(op, device.type)
    if op.node.module is not None:
        op.node.module.train(op.norm_train if op.node.kind in NORM_KINDS else True)
    return [*rp.inputs, *rp.params.values()], rp.run


def _storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _run_one(op: OpView, device: torch.device, region: Callable[[str], Any]) -> int | None:
    """Forward, then backward of one op, each inside ``region(name)``; the bytes of the gradients
    the backward returns (None: no backward)."""
    tensors, run = _prepare(op, device)
    with torch.enable_grad():
        with region("f"):
            out = run()
        roots = [t for t in flatten(out) if isinstance(t, torch.Tensor) and t.requires_grad and t.grad_fn is not None]
        wrt = [t for t in tensors if t.requires_grad]
        if not roots or not wrt:
            return None
        grads = [torch.ones_like(t) for t in roots]
        with region("b"):
            got = torch.autograd.grad(roots, wrt, grads, allow_unused=True)
    return _storage_bytes(got)


def _peak_end(sizes: list[int]) -> tuple[int, int]:
    live = peak = 0
    for s in sizes:
        live += s
        peak = max(peak, live)
    return peak, live


def _cpu_regions(prof: Any) -> dict[str, list[int]]:
    """Allocation (+) and free (-) sizes in time order, per labelled region of a profiler run."""
    from torch._C._profiler import _EventType

    found: dict[str, list[tuple[int, int]]] = {}
    stack = [(e, None) for e in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        event, label = stack.pop()
        if event.name.startswith(LABEL):
            label = event.name
        if event.tag == _EventType.Allocation and label is not None:
            found.setdefault(label, []).append((event.start_time_ns, event.extra_fields.alloc_size))
        stack.extend((c, label) for c in event.children)
    return {k: [s for _, s in sorted(v)] for k, v in found.items()}


#: KINETO_LOG_LEVEL above kineto's highest level (USDT = 5): no log lines on stderr
KINETO_QUIET = 6


def measure_ops(ops: Sequence[OpView], device: torch.device | str = "cpu") -> list[tuple[int, int] | Exception]:
    """(forward, backward) workspace bytes of each op, run alone (module docstring); an op that
    cannot run gets its exception. On CPU all ops share one torch.profiler session (its start and
    stop cost more than most ops), each op's forward and backward in a labelled region."""
    device = torch.device(device)
    results: list[tuple[int, int] | Exception] = [(0, 0)] * len(ops)
    if device.type == "cuda":
        for j, op in enumerate(ops):
            spans: dict[str, tuple[int, int]] = {}
            try:
                produced = _run_one(op, device, lambda part, spans=spans: _CudaRegion(device, spans, part))
            except Exception as exc:  # user code
                results[j] = exc
                continue
            results[j] = _workspaces(spans.get("f"), spans.get("b"), produced)
        return results
    from torch.profiler import ProfilerActivity, profile, record_function

    # kineto prints a "USDT: ... profiler_start / profiler_stop" pair on stderr for every session; its
    # levels go VERBOSE 0 .. USDT 5, so only 6 quiets them (its ERROR lines too: a session that fails
    # raises here anyway). Read when kineto starts; a level the user set is left alone.
    os.environ.setdefault("KINETO_LOG_LEVEL", str(KINETO_QUIET))
    produced: dict[int, int | None] = {}
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for j, op in enumerate(ops):
            try:
                produced[j] = _run_one(op, device, lambda part, j=j: record_function(f"{LABEL}{j}:{part}"))
            except Exception as exc:  # user code
                results[j] = exc
    regions = _cpu_regions(prof)
    for j, made in produced.items():
        results[j] = _workspaces(
            _peak_end(regions.get(f"{LABEL}{j}:f", [])), _peak_end(regions.get(f"{LABEL}{j}:b", [])), made
        )
    return results


def _workspaces(fwd: tuple[int, int] | None, bwd: tuple[int, int] | None, produced: int | None) -> tuple[int, int]:
    """Forward: peak less what stays; backward: peak less the gradients returned (both >= 0)."""
    f = max(0, fwd[0] - fwd[1]) if fwd else 0
    b = max(0, bwd[0] - produced) if bwd and produced is not None else 0
    return f, b


class _CudaRegion:
    """(most bytes allocated above the start, bytes allocated at the end above the start) of a region."""

    def __init__(self, device: torch.device, spans: dict[str, tuple[int, int]], part: str):
        self.device, self.spans, self.part = device, spans, part

    def __enter__(self) -> None:
        torch.cuda.synchronize(self.device)
        self.base = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)

    def __exit__(self, *exc: Any) -> None:
        torch.cuda.synchronize(self.device)
        self.spans[self.part] = (
            torch.cuda.max_memory_allocated(self.device) - self.base,
            torch.cuda.memory_allocated(self.device) - self.base,
        )


def measure_op(op: OpView, device: torch.device | str = "cpu") -> tuple[int, int]:
    """(forward, backward) workspace bytes of one op (:func:`measure_ops`); raises if it cannot run."""
    result = measure_ops([op], device)[0]
    if isinstance(result, Exception):
        raise result
    return result


# --------------------------------------------------------------------------- driving


def calibrate_views(
    views: Sequence[OpView], cal: Calibration, device: str = "cpu", failed: dict[str, str] | None = None
) -> int:
    """Measure every configuration of ``views`` that ``cal`` lacks; returns how many were measured."""
    todo: dict[str, OpView] = {}
    for op in views:
        key = kernel_key(op)
        if key is not None and key not in cal.entries:
            todo.setdefault(key, op)
    for (key, op), result in zip(todo.items(), measure_ops(list(todo.values()), device)):
        label, err = kernel_label(op) or "", {}
        if isinstance(result, Exception):
            err = {"error": f"{type(result).__name__}: {' '.join(str(result).split())[:160]}"}
            if failed is not None:
                failed[label[:160]] = err["error"]
            result = (0, 0)
        cal.entries[key] = {"forward": int(result[0]), "backward": int(result[1]), "label": label[:300], **err}
    return len(todo)


@with_keywords(CalibrateOptions, positional=("methods",))
def calibrate(models: Sequence[str], opts: CalibrateOptions | None = None, **options: Any) -> CalibrationRun:
    """``memplan calibrate``: the kernel workspaces of every model x strategy (default: the
    strategies ``memplan compare`` shows for the model) at one batch and resolution, into this
    machine's calibration file (another batch or resolution: call again; what is calibrated already
    is kept and not measured again). ``opts``: :class:`~memplan.profile_options.CalibrateOptions`,
    or its options by name (``methods`` also by position); ``options``: the strategies' other options."""
    o = opts or CalibrateOptions()
    methods, batch, res, classes = o.methods, o.batch, o.resolution, o.classes
    options = o.strategy.given(**options)
    for name, value in (("batch", batch), ("resolution", res), ("threads", o.threads)):
        if value is not None and value < 1:
            raise BadOption(f"--{name} must be a positive integer")
    skipped: dict[str, str] = {}
    for name in methods or ():
        get_strategy(name)  # an unknown name is an error, not a skip

    def items() -> Iterable[tuple[LayerGraph, Plan]]:
        for model in models:
            try:
                cap = capture(model, batch=batch, resolution=res, classes=classes)
            except ModelNotFound:
                raise  # a model that does not exist is an error, not a skip
            except MemplanError as exc:  # e.g. a resolution a fixed-input model cannot take
                skipped[f"{model} batch {batch} resolution {res}"] = str(exc)
                continue
            names = [(m, {}) for m in methods] if methods else default_methods(cap)
            for name, own in names:
                this, st = cap, get_strategy(name)
                if st.transform is not None:
                    topts = {k: v for k, v in {**own, **options}.items() if k in st.transform_options}
                    this = capture(
                        model, batch=batch, resolution=res, classes=classes, method=name, method_options=topts
                    )
                accepted = st.options
                kw = {**own, **{k: v for k, v in options.items() if k in accepted and v is not None}}
                try:
                    plan = make_plan(this.graph, name, **kw)
                except MemplanError as exc:  # e.g. a block strategy on a model without blocks
                    skipped[f"{cap.name} {name}"] = str(exc)
                    continue
                yield this.graph, plan

    run = calibrate_graphs(items(), o.backend, o.threads)
    run.skipped = skipped
    return run


def calibrate_graphs(
    items: Iterable[tuple[LayerGraph, Plan]], device: str = "cpu", threads: int | None = None, save: bool = True
) -> CalibrationRun:
    """Calibrate every (graph, plan) pair into this machine's calibration file."""
    start = time.perf_counter()
    old = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        cal = empty_calibration(device)
        seen: set[str] = set()
        failed: dict[str, str] = {}
        measured = 0
        try:
            for graph, plan in items:
                views = grad_flow(graph, plan)
                seen.update(k for k in (kernel_key(op) for op in views) if k is not None)
                measured += calibrate_views(views, cal, device, failed)
        finally:  # what was measured is kept, even when a later model fails or the run is interrupted
            path = cal.save() if save and cal.entries else cal.path
    finally:
        torch.set_num_threads(old)
    return CalibrationRun(str(path), len(seen), measured, failed, time.perf_counter() - start)
