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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ..errors import BadOption, MemplanError
from ..graph import conv_table
from ..io import save_state
from ..options import with_keywords
from ..plan import fingerprint
from .adaptive import merge, next_round
from .checkpoint import Checkpoint
from .data import Data
from .description import describe, rates_text
from .estimators import ESTIMATORS, Env
from .executors import check as check_execution, default_threads, execute, num_threads
from .options import ContribOptions, Execution, Protocol
from .profile import ContribProfile, Resolution
from .progress import bar as progress_bar, stage
from .protocol import RunSpec, grid, run_plan, split_layer
from .ranking import ranked_protocol, read_ranking
from .rates import select_rates
from .runner import Context, Worker, linear_probe, resolve_device
from .setup import Setup, Split, build_setup


@dataclass(frozen=True)
class _Where:
    """What :func:`run_contrib` derives from its options: the torch device (``auto`` resolved) and
    the intra-op threads per worker."""

    device: str
    threads: int


# ----------------------------------------------------------------------------- the entry point
@with_keywords(ContribOptions)
def run_contrib(model: str | nn.Module, opts: ContribOptions | None = None) -> ContribProfile:
    """Measure the contribution profile of ``model`` on ``data`` (see the module docstring).

    ``opts``: the :class:`~memplan.contrib.options.ContribOptions` (default: every option at its
    default), or its options by name as keywords (``run_contrib(model, data="digits", seeds=(0, 1))``;
    given with ``opts``, they change a copy of it); each option's field says what it does: the data
    and splits (``inputs``), the :class:`~memplan.contrib.options.Protocol` (``protocol``), where the
    runs execute and the profile is written (``execution``: ``out``, the profile JSON with the
    checkpoint and head beside it; None keeps nothing on disk and cannot resume) and what fills the
    entries (``estimate``: :data:`memplan.contrib.estimators.ESTIMATORS`, grid, probe, fisher, rgn).
    """
    opts = opts or ContribOptions()
    ex = opts.execution
    if ex.threads is not None and (not isinstance(ex.threads, int) or ex.threads < 1):
        raise BadOption(f"threads must be a positive integer, got {ex.threads!r}")
    device = resolve_device(ex.device)
    check_execution(ex.workers, ex.executor, ex.address)  # a bad executor or estimator fails before any work
    ESTIMATORS.choose(opts.estimate.estimator)
    batches = opts.estimate.batches
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
        raise BadOption(f"batches must be a positive integer, got {batches!r}")
    costing = opts.inputs.costing_resolution
    if costing is not None and (not isinstance(costing, int) or costing < 1):
        raise BadOption(f"costing_resolution must be a positive integer, got {costing!r}")
    ranking = read_ranking(opts.estimate.rank_by, opts.protocol)
    with num_threads(ex.threads or default_threads(1)):  # pretraining and the probe run here, before any worker
        return _measure(model, opts, _Where(device, ex.threads or default_threads(ex.workers)), ranking)


def _setup(model: str | nn.Module, opts: ContribOptions) -> Setup:
    """:func:`build_setup` under ``opts``, with progress (data, and pretraining where the data asks for
    it, can take minutes)."""
    i = opts.inputs
    split = Split(i.validation, i.train_per_class, i.test_per_class, i.split_seed)
    with stage(opts.execution.progress, "contrib: data, model, backbone weights"):
        return build_setup(model, i.weights, i.data, resolution=i.resolution, split=split, cache_dir=i.cache_dir)


def _measure(
    model: str | nn.Module, opts: ContribOptions, where: _Where, ranking: ContribProfile | None
) -> ContribProfile:
    """Setup, probe, grid and profile (module docstring, steps 1-4); ``where``: the device and
    threads; ``ranking``: the profile that picks the weight runs' convs (``rank_by``), or None."""
    t_start = time.perf_counter()
    out, batches = opts.execution.out, opts.estimate.batches
    setup = _setup(model, opts)
    protocol, ranked = ranked_protocol(opts.protocol, opts.estimate.rank_by, ranking, fingerprint(setup.graph))
    seen = setup.task.validation_task() if setup.task.x_val is not None else setup.task  # what the runs see
    identity = {**setup.identity(), "protocol": protocol.identity()}
    est = ESTIMATORS.choose(opts.estimate.estimator)
    if est.runs != "protocol":  # the grid's checkpoint identity is what it was before estimators
        identity["estimator"] = {"name": est.name, "batches": batches}
    ckpt, head_path, finished = _resume(out, identity)
    t_probe = time.perf_counter()
    with stage(opts.execution.progress, f"contrib: linear probe ({protocol.probe_epochs} epochs)"):
        probe_acc = _probe(setup, seen, protocol, where.device, ckpt, head_path, bool(finished))
    key = identity["backbone"] + identity["data"]["digest"]
    executed = 0

    def run_grid(ctx: Context, todo: list) -> dict[str, dict[str, Any]]:
        nonlocal executed
        executed += _run_rounds(ctx, todo, opts.execution, key, finished, ckpt)
        return merge(finished)

    measured, selection = protocol, {}
    if protocol.lr_grid is not None and est.runs == "protocol":
        measured, selection = _select_rates(setup, seen, protocol, opts, where, identity)
    env = _env(setup, seen, measured, opts, where, run_grid)
    t_est = time.perf_counter()
    estimate = est.fn(env)
    timing = {
        "wall_s": round(time.perf_counter() - t_start, 2),
        "probe_wall_s": round(t_est - t_probe, 2),
        "estimator_wall_s": round(time.perf_counter() - t_est, 2),
        **_execution(opts.execution, where, finished, executed),
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
        resolution=Resolution(runs=setup.shape[-1], costing=opts.inputs.costing_resolution or setup.shape[-1]),
        evaluated_on="validation" if setup.task.x_val is not None else "test",
        description=describe(
            setup.name, setup.shape, setup.task, measured, len(env.layers), opts.execution.cache, est, batches
        )
        + (f" Weight convs: {ranked}." if ranked else "")
        + (f" Rates chosen on validation per family first: {rates_text(selection)}." if selection else ""),
        probe_accuracy=probe_acc,
        timing=timing,
    )
    if out is not None:
        profile.save(out)
    return profile


def _select_rates(
    setup: Setup, seen: Data, protocol: Protocol, opts: ContribOptions, where: _Where, identity: dict[str, Any]
) -> tuple[Protocol, dict[str, dict[str, Any]]]:
    """:func:`memplan.contrib.rates.select_rates` in this process, checkpointed beside ``out``."""
    out = opts.execution.out
    worker = Worker(Context(setup.name, setup.net, seen, protocol, opts.execution.cache, where.threads, where.device))
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


def _env(setup: Setup, seen: Data, protocol: Protocol, opts: ContribOptions, where: _Where, run_grid: Any) -> Env:
    """What the estimator reads (:class:`memplan.contrib.estimators.Env`)."""
    layers, cache = conv_table(setup.graph), opts.execution.cache
    return Env(
        net=setup.net,
        seen=seen,
        layers=layers,
        specs=grid(layers, protocol),
        protocol=protocol,
        batches=opts.estimate.batches,
        context=lambda d, p: Context(setup.name, setup.net, d, p, cache, where.threads, where.device),
        run_grid=run_grid,
        progress=opts.execution.progress,
    )


def _execution(ex: Execution, where: _Where, finished: dict[str, dict[str, Any]], executed: int) -> dict[str, Any]:
    """How the runs were executed (``executed`` of them in this call) and their summed seconds (the
    profile's ``timing``)."""
    return {
        "runs_executed": executed,
        "runs_resumed": len(finished) - executed,
        "workers": ex.workers,
        "threads_per_worker": where.threads,
        "executor": ex.executor,
        "cache": ex.cache,
        "device": where.device,
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
    ckpt.writable()  # before any run trains: a refused append would lose a finished run
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
    opts: Execution,
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
    opts: Execution,
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
