"""``run_contrib``: contribution analysis end to end, resumable.

1. model (zoo name, ``module:attr`` or ``file.py:attr``) with its classifier sized for the
   data and its backbone weights, and the task with a validation split carved from the
   training data (:mod:`memplan.contrib.setup`);
2. a linear probe trains the classifier from zero on frozen features; every run starts
   from that head. The probe and every run train on the training split and are measured on
   the validation split; the test split is never given to them (it is kept for the final
   evaluations of :mod:`memplan.contrib.final`);
3. the grid (:mod:`memplan.contrib.protocol`) runs on the chosen executor, each finished run
   appended to the JSONL checkpoint ``<out stem>.runs.jsonl`` (flushed and fsynced) beside
   ``out``, the probe head saved as ``<out stem>.head.pt``; rerunning the same call skips
   finished runs, so a kill (even SIGKILL) loses at most the runs in flight;
4. the profile is assembled and written atomically to ``out``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from pydantic import ValidationError

from ..errors import BadOption, MemplanError
from ..graph import conv_table
from ..io import save_state, validation_error
from ..plan import fingerprint
from .adaptive import merge, next_round
from .checkpoint import Checkpoint
from .data import DEFAULT_VALIDATION, Data, Validation
from .description import describe, rates_text
from .estimators import ESTIMATORS, Env
from .executors import EXECUTORS, default_threads, execute, num_threads
from .profile import ContribProfile, Resolution
from .progress import bar as progress_bar, stage
from .protocol import Protocol, RunSpec, grid, run_plan, split_layer
from .rates import select_rates
from .runner import Context, Worker, linear_probe, resolve_device
from .setup import Setup, build_setup


def _protocol(opts: ContribOptions) -> Protocol:
    """The protocol of the options that name its fields (None: the protocol's default; sequences as tuples)."""
    values = {f.name: getattr(opts, f.name) for f in fields(opts) if f.name in Protocol.model_fields}
    values = {k: tuple(v) if isinstance(v, Sequence) and not isinstance(v, str) else v for k, v in values.items()}
    try:
        return Protocol(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        where, msg = validation_error(exc)
        raise BadOption(f"bad contribution option {'protocol' if where == '(top level)' else where}: {msg}") from None


# ----------------------------------------------------------------------------- the entry point
@dataclass
class ContribOptions:
    """The keywords of :func:`run_contrib`, in its order (see its docstring for each)."""

    workers: int = 1
    executor: str = "process"
    address: str | None = None
    cache: bool = True
    bits: int | None = None
    seeds: Sequence[int] | None = None
    max_seeds: int | None = None
    adaptive_z: float | None = None
    epochs: int | None = None
    batch_size: int | None = None
    lr_classifier: float | None = None
    lr_bias: float | None = None
    lr_weight: float | None = None
    optimizer: str | None = None
    probe_epochs: int | None = None
    probe_lr: float | None = None
    ratios: Sequence[float] | None = None
    bias_ks: Sequence[int] | None = None
    weight_layers: int | None = None
    weight_reference: str | None = None
    lr_grid: Sequence[float] | None = None
    select: str | None = None
    resolution: int | None = None
    costing_resolution: int | None = None
    train_per_class: int | None = None
    validation: Validation | None = DEFAULT_VALIDATION
    test_per_class: int | None = None
    cache_dir: str | os.PathLike | None = None
    threads: int | None = None
    device: str = "cpu"
    progress: bool = False
    estimator: str = "grid"
    batches: int = 8


def run_contrib(
    model: str | nn.Module,
    weights: str | os.PathLike | None = None,
    data: str = "digits",
    out: str | os.PathLike | None = None,
    **options: Any,
) -> ContribProfile:
    """Measure the contribution profile of ``model`` on ``data`` (see the module docstring).

    ``options``: the keywords of :class:`ContribOptions`; the protocol's (``seeds``, ``epochs``,
    ... ``bits``) left as None take the :class:`~memplan.contrib.protocol.Protocol` defaults.
    ``out``: the profile JSON (with the checkpoint and head beside it); None keeps nothing
    on disk and cannot resume. ``train_per_class`` keeps that many training images per class
    (default: the data source's, 100 for digits); ``validation``: images per class (int) or
    fraction (float) of the training data carved out as the validation split every accuracy is
    measured on (None: the test split, the pre-issue-13 protocol); ``test_per_class`` limits the
    test split (kept for final evaluations, never seen by a run). ``resolution``: input side of
    the runs (default: the data source's for zoo models, 32 for digits, else the zoo's);
    ``costing_resolution``: the side the schemes will be costed at (default: the run
    resolution), recorded so that ``memplan search`` can warn when they differ. ``workers`` /
    ``executor`` / ``address``: where the grid runs (``memplan.contrib.executors``); ``cache``:
    the feature cache of the frozen prefix. ``threads``: intra-op threads per worker (default:
    the available cores / workers, or ``$MEMPLAN_NUM_THREADS``). ``device``: torch device of the
    probe and the runs (``cpu``, ``cuda``, ``auto``); not part of the checkpoint's identity.
    ``progress``: progress on stderr for every long step (:mod:`memplan.contrib.progress`).
    ``estimator``: what measures the entries (:data:`memplan.contrib.estimators.ESTIMATORS`: grid,
    probe, fisher, rgn); ``batches``: the gradient estimators' mini-batches (the probe's steps).
    """
    opts = ContribOptions(**options)
    if opts.threads is not None and (not isinstance(opts.threads, int) or opts.threads < 1):
        raise BadOption(f"threads must be a positive integer, got {opts.threads!r}")
    device = resolve_device(opts.device)
    EXECUTORS.choose(opts.executor)  # an unknown executor or estimator fails before any work
    ESTIMATORS.choose(opts.estimator)
    if isinstance(opts.batches, bool) or not isinstance(opts.batches, int) or opts.batches < 1:
        raise BadOption(f"batches must be a positive integer, got {opts.batches!r}")
    protocol = _protocol(opts)
    if opts.costing_resolution is not None and (
        not isinstance(opts.costing_resolution, int) or opts.costing_resolution < 1
    ):
        raise BadOption(f"costing_resolution must be a positive integer, got {opts.costing_resolution!r}")
    with num_threads(opts.threads or default_threads(1)):  # pretraining and the probe run here, before any worker
        opts = replace(opts, device=device, threads=opts.threads or default_threads(opts.workers))
        return _measure(model, weights, data, out, protocol, opts)


def _setup(model: str | nn.Module, weights: str | os.PathLike | None, data: str, opts: ContribOptions) -> Setup:
    """:func:`build_setup` under ``opts``, with progress (data, and pretraining where the data asks for
    it, can take minutes)."""
    split = dict(train_per_class=opts.train_per_class, validation=opts.validation, test_per_class=opts.test_per_class)
    with stage(opts.progress, "contrib: data, model, backbone weights"):
        return build_setup(model, weights, data, resolution=opts.resolution, cache_dir=opts.cache_dir, **split)


def _measure(
    model: str | nn.Module,
    weights: str | os.PathLike | None,
    data: str,
    out: str | os.PathLike | None,
    protocol: Protocol,
    opts: ContribOptions,
) -> ContribProfile:
    """Setup, probe, grid and profile (module docstring, steps 1-4); ``opts`` with device and threads resolved."""
    t_start = time.perf_counter()
    setup = _setup(model, weights, data, opts)
    seen = setup.task.validation_task() if setup.task.x_val is not None else setup.task  # what the runs see
    identity = {**setup.identity(), "protocol": protocol.identity()}
    est = ESTIMATORS.choose(opts.estimator)
    if est.runs != "protocol":  # the grid's checkpoint identity is what it was before estimators
        identity["estimator"] = {"name": est.name, "batches": opts.batches}
    ckpt, head_path, finished = _resume(out, identity)
    t_probe = time.perf_counter()
    with stage(opts.progress, f"contrib: linear probe ({protocol.probe_epochs} epochs)"):
        probe_acc = _probe(setup, seen, protocol, opts.device, ckpt, head_path, bool(finished))
    key = identity["backbone"] + identity["data"]["digest"]
    executed = 0

    def run_grid(ctx: Context, todo: list) -> dict[str, dict[str, Any]]:
        nonlocal executed
        executed += _run_rounds(ctx, todo, opts, key, finished, ckpt)
        return merge(finished)

    measured, selection = protocol, {}
    if protocol.lr_grid is not None and est.runs == "protocol":
        measured, selection = _select_rates(setup, seen, protocol, opts, out, identity)
    env = _env(setup, seen, measured, opts, run_grid)
    t_est = time.perf_counter()
    estimate = est.fn(env)
    timing = {
        "wall_s": round(time.perf_counter() - t_start, 2),
        "probe_wall_s": round(t_est - t_probe, 2),
        "estimator_wall_s": round(time.perf_counter() - t_est, 2),
        **_execution(opts, finished, executed),
    }
    profile = ContribProfile(
        layers=list(env.layers),
        **vars(estimate),
        estimator=est.name,
        units=est.units,
        model=setup.name,
        fingerprint=fingerprint(setup.graph),
        input_shape=list(setup.shape),
        weights=setup.weights,
        dataset=setup.dataset,
        protocol=measured,
        lr_selection=selection,
        resolution=Resolution(runs=setup.shape[-1], costing=opts.costing_resolution or setup.shape[-1]),
        evaluated_on="validation" if setup.task.x_val is not None else "test",
        description=describe(
            setup.name, setup.shape, setup.task, measured, len(env.layers), opts.cache, est, opts.batches
        )
        + (f" Rates chosen on validation per family first: {rates_text(selection)}." if selection else ""),
        probe_accuracy=probe_acc,
        timing=timing,
    )
    if out is not None:
        profile.save(out)
    return profile


def _select_rates(
    setup: Setup, seen: Data, protocol: Protocol, opts: ContribOptions, out: Any, identity: dict[str, Any]
) -> tuple[Protocol, dict[str, dict[str, Any]]]:
    """:func:`memplan.contrib.rates.select_rates` in this process, checkpointed beside ``out``."""
    worker = Worker(Context(setup.name, setup.net, seen, protocol, opts.cache, opts.threads, opts.device))
    ckpt = None if out is None else Checkpoint(Path(out).with_suffix(".lr.jsonl"), identity)
    done = (ckpt.finished() if ckpt is not None else None) or {}
    if ckpt is not None and not done:
        ckpt.start()
    layers = conv_table(setup.graph)
    return select_rates(
        protocol,
        grid(layers, protocol),
        lambda spec, proto: worker.train_plan(
            lambda g: run_plan(spec, g, setup.name, proto), split_layer(spec, layers, setup.graph), proto
        ),
        done,
        ckpt.append if ckpt is not None else lambda rec: None,
    )


def _env(setup: Setup, seen: Data, protocol: Protocol, opts: ContribOptions, run_grid: Any) -> Env:
    """What the estimator reads (:class:`memplan.contrib.estimators.Env`)."""
    layers = conv_table(setup.graph)
    return Env(
        net=setup.net,
        seen=seen,
        layers=layers,
        specs=grid(layers, protocol),
        protocol=protocol,
        batches=opts.batches,
        context=lambda d, p: Context(setup.name, setup.net, d, p, opts.cache, opts.threads, opts.device),
        run_grid=run_grid,
        progress=opts.progress,
    )


def _execution(opts: ContribOptions, finished: dict[str, dict[str, Any]], executed: int) -> dict[str, Any]:
    """How the runs were executed (``executed`` of them in this call) and their summed seconds (the
    profile's ``timing``)."""
    return {
        "runs_executed": executed,
        "runs_resumed": len(finished) - executed,
        "workers": opts.workers,
        "threads_per_worker": opts.threads,
        "executor": opts.executor,
        "cache": opts.cache,
        "device": opts.device,
        "run_seconds": round(sum(r["train_s"] + r["eval_s"] + r["cache_s"] for r in finished.values()), 2),
        "run_cpu_seconds": round(sum(r["cpu_s"] for r in finished.values()), 2),
    }


def _resume(
    out: str | os.PathLike | None, identity: dict[str, Any]
) -> tuple[Checkpoint | None, Path | None, dict[str, dict[str, Any]]]:
    """(checkpoint, probe head path, finished runs by id) beside ``out``; nothing without ``out``."""
    if out is None:
        return None, None, {}
    out = Path(out)
    if not out.parent.is_dir():
        raise MemplanError(f"cannot write {out}: directory {out.parent} does not exist")
    ckpt, head_path = Checkpoint(out.with_suffix(".runs.jsonl"), identity), out.with_suffix(".head.pt")
    previous = ckpt.finished()
    return ckpt, head_path, (previous if previous and head_path.is_file() else {})


def _probe(
    setup: Setup,
    seen: Data,
    protocol: Protocol,
    device: str,
    ckpt: Checkpoint | None,
    head_path: Path | None,
    resumed: bool,
) -> float:
    """The linear probe's accuracy (%): its head loaded when resuming, else trained (and saved
    with a fresh checkpoint beside the profile)."""
    head = setup.net.get_submodule(setup.head)
    if resumed:
        stored = torch.load(head_path, map_location="cpu", weights_only=True)
        head.load_state_dict(stored["head"])
        return float(stored["accuracy"])
    probe_acc = linear_probe(setup.net, setup.head, seen, protocol, device)
    if ckpt is not None:
        save_state(head_path, {"head": head.state_dict(), "accuracy": torch.tensor(probe_acc)})
        ckpt.start()
    return probe_acc


def _run_rounds(
    ctx: Context,
    specs: list[RunSpec],
    opts: ContribOptions,
    key: str,
    finished: dict[str, dict[str, Any]],
    ckpt: Checkpoint | None,
) -> int:
    """The grid's unfinished runs, then rounds of adaptive seeding (:mod:`memplan.contrib.adaptive`)
    until no entry asks for another seed; returns how many runs were executed."""
    todo = [s for s in specs if s.id not in finished]
    executed = 0
    while todo:
        _run_grid(ctx, todo, len(todo), opts, key, finished, ckpt)
        executed += len(todo)
        todo = [s for s in next_round(specs, merge(finished), ctx.protocol) if s.id not in finished]
    return executed


def _run_grid(  # the grid's context and its bookkeeping, each used once
    ctx: Context,
    todo: list[RunSpec],
    total: int,
    opts: ContribOptions,
    key: str,
    finished: dict[str, dict[str, Any]],
    ckpt: Checkpoint | None,
) -> None:
    """Run ``todo`` on the executor, each record added to ``finished`` and appended to the checkpoint."""
    bar, bar_task = progress_bar(opts.progress, "contrib runs", total, total - len(todo))
    with bar:
        for record in execute(ctx, todo, workers=opts.workers, executor=opts.executor, address=opts.address, key=key):
            finished[record["id"]] = record
            if ckpt is not None:
                ckpt.append(record)
            bar.advance(bar_task)
