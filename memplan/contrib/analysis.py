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
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from ..errors import BadOption, MemplanError
from ..graph import conv_table
from ..io import validation_error
from ..plan import fingerprint
from ..units import ratio_label
from .checkpoint import Checkpoint
from .data import DEFAULT_VALIDATION, Data, Validation
from .executors import EXECUTORS, default_threads, execute, num_threads
from .profile import ContribProfile, Resolution, assemble
from .protocol import Protocol, grid
from .runner import Context, linear_probe, resolve_device
from .setup import build_setup
from .weights import save_state


def _protocol(options: dict[str, Any]) -> Protocol:
    try:
        return Protocol(**{k: v for k, v in options.items() if v is not None})
    except ValidationError as exc:
        where, msg = validation_error(exc)
        raise BadOption(f"bad contribution option {'protocol' if where == '(top level)' else where}: {msg}") from None


def describe(name: str, shape: Sequence[int], data: Data, protocol: Protocol, n_layers: int, cache: bool) -> str:
    p = protocol
    ks = "all k = 1..L" if p.bias_ks is None else f"k in {list(p.bias_ks)} and those the weight runs need"
    wl = "every conv" if p.weight_layers is None else f"the last {p.weight_layers} convs"
    ratios = ", ".join(ratio_label(r) for r in p.ratios)
    cache_text = (
        "feature cache of the frozen prefix " + ("exact fp32" if p.bits is None else f"quantised to {p.bits} bits")
        if cache
        else "no feature cache (every step runs the whole model)"
    )
    where = (
        f"the validation split ({data.x_val.shape[0]} images carved from the training data; the "
        f"{data.x_test.shape[0]} test images are left for final evaluations)"
        if data.x_val is not None
        else f"the test split ({data.x_test.shape[0]} images)"
    )
    return (
        f"Contribution analysis (Lin et al., NeurIPS 2022, Sec. 2.2 / Fig. 5) of {name} "
        f"(L = {n_layers} convs) at input {'x'.join(map(str, shape))} on {data.name} "
        f"({data.x_train.shape[0]} train images, {data.classes} classes); accuracies on {where}. "
        f"Linear probe first: classifier from zero, {p.probe_epochs} epochs {p.optimizer} lr {p.probe_lr}, "
        f"cosine decay; every run starts from that head. Runs: classifier only (k = 0); biases of the last "
        f"k convs ({ks}; a conv's bias is the BN shift after it, norms in eval mode) + classifier; weight "
        f"of conv i at ratios {ratios} (select {p.select}) for {wl}, + biases of convs i..L-1 + classifier. "
        f"Each run: {p.epochs} epochs of {p.optimizer}, batch {p.batch_size}, cosine decay to 0, "
        f"lr classifier {p.lr_classifier} / biases {p.lr_bias} / analysed weight {p.lr_weight}, no augmentation, "
        f"seeds {list(p.seeds)} (data order). Δacc in accuracy points, paired by seed: bias k vs classifier "
        f"only, weight (i, r) vs bias k = L - i; mean and std over seeds. {cache_text}."
    )


def _progress(enabled: bool, total: int, done: int):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(
        TextColumn("contrib"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        disable=not enabled,
        transient=False,
    )
    task = bar.add_task("runs", total=total, completed=done)
    return bar, task


# ----------------------------------------------------------------------------- the entry point
def run_contrib(
    model: str,
    weights: str | os.PathLike | None = None,
    data: str = "digits",
    out: str | os.PathLike | None = None,
    *,
    workers: int = 1,
    executor: str = "process",
    address: str | None = None,
    cache: bool = True,
    bits: int | None = None,
    seeds: Sequence[int] | None = None,
    epochs: int | None = None,
    batch_size: int | None = None,
    lr_classifier: float | None = None,
    lr_bias: float | None = None,
    lr_weight: float | None = None,
    optimizer: str | None = None,
    probe_epochs: int | None = None,
    probe_lr: float | None = None,
    ratios: Sequence[float] | None = None,
    bias_ks: Sequence[int] | None = None,
    weight_layers: int | None = None,
    select: str | None = None,
    resolution: int | None = None,
    costing_resolution: int | None = None,
    train_per_class: int | None = None,
    validation: Validation | None = DEFAULT_VALIDATION,
    test_per_class: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    threads: int | None = None,
    device: str = "cpu",
    progress: bool = False,
) -> ContribProfile:
    """Measure the contribution profile of ``model`` on ``data`` (see the module docstring).

    Options left as None take the :class:`~memplan.contrib.protocol.Protocol` defaults.
    ``out``: the profile JSON (with the checkpoint and head beside it); None keeps nothing
    on disk and cannot resume. ``train_per_class`` keeps that many training images per class
    (digits: 100 unless given); ``validation``: images per class (int) or fraction (float) of the
    training data carved out as the validation split every accuracy is measured on (None: the
    test split, the pre-issue-13 protocol); ``test_per_class`` limits the test split (kept for
    final evaluations, never seen by a run). ``resolution``: input side of the runs (default: the
    zoo's, 32 for digits); ``costing_resolution``: the side the schemes will be costed at (default:
    the run resolution), recorded so that ``memplan search`` can warn when they differ.
    ``threads``: intra-op threads per worker (default: the available cores / workers, or
    ``$MEMPLAN_NUM_THREADS``). ``device``: torch device of the probe and the runs (``cpu``,
    ``cuda``, ``auto``); not part of the checkpoint's identity.
    """
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise BadOption(f"threads must be a positive integer, got {threads!r}")
    device = resolve_device(device)
    EXECUTORS.choose(executor)  # an unknown executor fails before any work
    protocol = _protocol(
        dict(
            seeds=None if seeds is None else tuple(seeds),
            epochs=epochs,
            batch_size=batch_size,
            lr_classifier=lr_classifier,
            lr_bias=lr_bias,
            lr_weight=lr_weight,
            optimizer=optimizer,
            probe_epochs=probe_epochs,
            probe_lr=probe_lr,
            ratios=None if ratios is None else tuple(ratios),
            bias_ks=None if bias_ks is None else tuple(bias_ks),
            weight_layers=weight_layers,
            select=select,
            bits=bits,
        )
    )
    with num_threads(threads or default_threads(1)):  # pretraining and the probe run here, before any worker
        return _measure(
            model,
            weights,
            data,
            out,
            protocol,
            workers=workers,
            executor=executor,
            address=address,
            cache=cache,
            resolution=resolution,
            costing_resolution=costing_resolution,
            split=dict(train_per_class=train_per_class, validation=validation, test_per_class=test_per_class),
            cache_dir=cache_dir,
            threads=threads or default_threads(workers),
            device=device,
            progress=progress,
        )


def _measure(
    model: str,
    weights: str | os.PathLike | None,
    data: str,
    out: str | os.PathLike | None,
    protocol: Protocol,
    *,
    workers: int,
    executor: str,
    address: str | None,
    cache: bool,
    resolution: int | None,
    costing_resolution: int | None,
    split: dict[str, Any],
    cache_dir: str | os.PathLike | None,
    threads: int,
    device: str,
    progress: bool,
) -> ContribProfile:
    t_start = time.perf_counter()
    if costing_resolution is not None and (not isinstance(costing_resolution, int) or costing_resolution < 1):
        raise BadOption(f"costing_resolution must be a positive integer, got {costing_resolution!r}")
    setup = build_setup(model, weights, data, resolution=resolution, cache_dir=cache_dir, **split)
    name, net, task, graph, head, shape = setup.name, setup.net, setup.task, setup.graph, setup.head, setup.shape
    source = setup.weights
    seen = task.validation_task() if task.x_val is not None else task  # what the runs train and measure on
    layers = conv_table(graph)
    specs = grid(layers, protocol)
    identity = {**setup.identity(), "protocol": protocol.model_dump(mode="json")}
    runs_res = shape[-1]
    resolution_record = Resolution(runs=runs_res, costing=costing_resolution or runs_res)

    finished: dict[str, dict[str, Any]] = {}
    ckpt = head_path = None
    if out is not None:
        out = Path(out)
        if not out.parent.is_dir():
            raise MemplanError(f"cannot write {out}: directory {out.parent} does not exist")
        ckpt, head_path = Checkpoint(out.with_suffix(".runs.jsonl"), identity), out.with_suffix(".head.pt")
        previous = ckpt.finished()
        if previous and head_path.is_file():
            finished = previous
    if finished:
        stored = torch.load(head_path, map_location="cpu", weights_only=True)
        net.get_submodule(head).load_state_dict(stored["head"])
        probe_acc = float(stored["accuracy"])
    else:
        probe_acc = linear_probe(net, head, seen, protocol, device)
        if ckpt is not None:
            save_state(head_path, {"head": net.get_submodule(head).state_dict(), "accuracy": torch.tensor(probe_acc)})
            ckpt.start()
    todo = [s for s in specs if s.id not in finished]
    ctx = Context(name, net, seen, protocol, cache, threads, device)
    bar, bar_task = _progress(progress, len(specs), len(specs) - len(todo))
    t_grid = time.perf_counter()
    with bar:
        for record in execute(
            ctx,
            todo,
            workers=workers,
            executor=executor,
            address=address,
            key=identity["backbone"] + identity["data"]["digest"],
        ):
            finished[record["id"]] = record
            if ckpt is not None:
                ckpt.append(record)
            bar.advance(bar_task)
    wall = time.perf_counter() - t_start
    profile = assemble(
        specs,
        finished,
        layers,
        model=name,
        fingerprint=fingerprint(graph),
        input_shape=list(shape),
        weights=source,
        dataset=setup.dataset,
        protocol=protocol,
        resolution=resolution_record,
        evaluated_on="validation" if task.x_val is not None else "test",
        description=describe(name, shape, task, protocol, len(layers), cache),
        probe_accuracy=probe_acc,
        timing={
            "wall_s": round(wall, 2),
            "grid_wall_s": round(time.perf_counter() - t_grid, 2),
            "runs_executed": len(todo),
            "runs_resumed": len(specs) - len(todo),
            "workers": workers,
            "threads_per_worker": threads,
            "executor": executor,
            "cache": cache,
            "device": device,
            "run_seconds": round(sum(r["train_s"] + r["eval_s"] + r["cache_s"] for r in finished.values()), 2),
            "run_cpu_seconds": round(sum(r["cpu_s"] for r in finished.values()), 2),
        },
    )
    if out is not None:
        profile.save(out)
    return profile
