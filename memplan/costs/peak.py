"""Peak memory of one simulated training step (forward, then backward), in bytes.

Model of eager execution with ``optimizer.zero_grad(set_to_none=True)`` before the step:

* static: weights, buffers and optimizer state, and the batch (the graph's inputs and the
  loss targets, which the training loop holds for the whole step), alive throughout;
* forward at op i: every activation storage produced so far that is still referenced at i,
  or that some op up to i keeps for backward, plus private saved tensors of ops <= i. A
  tensor is referenced until its last consumer and, as in eager Python, until every module
  call it was passed into returns (the callee's argument holds it);
* backward at op i (reverse order, recorded ops only): saved storages whose earliest saver is
  <= i (they are freed once every op keeping them has run backward), private saved tensors of
  ops <= i, what a checkpointed segment saves again once the backward has reached and
  recomputed it (``PeakOptions.recomputed``), gradient buffers of outputs whose producer has not
  run backward yet but some consumer has, and the parameter gradients of ops >= i.

Schedules (:data:`SCHEDULES`): ``standard`` keeps every parameter gradient until the optimizer
step after backward (as above); ``tte``, the 256KB paper's Tiny Training Engine (Sec. 2.3), applies
each update in place as soon as the op's backward has produced its parameter gradients and frees
them, so at backward step i only op i's parameter gradients are alive (exact for SGD without
momentum; other optimizers keep their state, which is static here). Gradients of frozen
parameters are never allocated in either schedule.

Gradient accumulation (``PeakOptions.accumulated``: every micro-batch after the first) holds the
accumulated parameter gradients from the start of the step, static like the weights, and each
op's new parameter gradients only until they are added into them (freed before the next op's
backward, as the ``tte`` schedule frees them).

Kernel workspaces (:mod:`.workspace`), when given, are added to the op running at each step,
forward and backward. Allocator rounding is not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import BadOption
from ..graph import LayerGraph
from ..names import DEFAULT_SCHEDULE
from ..plan import OpView
from .records import Saved

#: training-step schedules of the simulation (module docstring) -> whether each update is applied in place
#: during backward (the op's parameter gradients freed as soon as it has run)
SCHEDULES: dict[str, bool] = {"standard": False, "tte": True}


def in_place_update(schedule: str) -> bool:
    """Whether ``schedule`` applies each update in place during backward (:data:`SCHEDULES`)."""
    return SCHEDULES[check_schedule(schedule)]


@dataclass(frozen=True)
class PeakOptions:
    """How the step runs: ``schedule`` (:data:`SCHEDULES`), per-node kernel workspaces (forward,
    backward bytes; None = not modelled) and what recomputation saves again in the backward."""

    schedule: str = DEFAULT_SCHEDULE
    workspace_forward: Sequence[int] | None = None
    workspace_backward: Sequence[int] | None = None
    #: tensors saved again by a recomputation (activation checkpointing): (node at whose backward it is
    #: allocated, node after whose backward it is freed, the item); ``saved`` holds the forward's only
    recomputed: Sequence[tuple[int, int, Saved]] = ()
    #: (node, node): the gradient of the first one's output is held until after the second one's backward,
    #: not freed after its own (a reentrant checkpoint holds its output's gradient through its backward)
    held_gradients: Sequence[tuple[int, int]] = ()
    accumulated: bool = False  # a later micro-batch of gradient accumulation: the gradients held throughout

    def __post_init__(self) -> None:
        check_schedule(self.schedule)


def check_schedule(schedule: str) -> str:
    if schedule not in SCHEDULES:
        raise BadOption(f"unknown schedule {schedule!r}", f"use one of {', '.join(SCHEDULES)}")
    return schedule


@dataclass(frozen=True)
class Step:
    """One training step as the peak core sees it: per op index (forward order), bytes in use
    apart from the static bytes. The forward pass is given whole; the backward pass runs in
    reverse order, and at op i's backward (only ops with ``runs_backward[i]``) holds:

    * ``held``: bytes kept for backward, minus what ``released`` has freed after the backward of
      ops > i;
    * activation gradients: ``grad_alloc`` of ops >= i minus ``grad_free`` of ops > i;
    * parameter gradients: ``param_grads`` of ops >= i that run backward, or only op i's when
      the update is applied in place (``in_place_update``, the Tiny Training Engine's schedule);
    * ``workspace[i]``: op i's backward kernel workspace (None: none);
    * ``acquired``: bytes that become held at op i's backward, before it runs (a checkpointed
      segment recomputed; ``released`` frees them again; None: none).
    """

    forward: Sequence[int]
    held: int
    released: Sequence[int]
    grad_alloc: Sequence[int]
    grad_free: Sequence[int]
    param_grads: Sequence[int]
    runs_backward: Sequence[bool]
    in_place_update: bool = False
    workspace: Sequence[int] | None = None
    acquired: Sequence[int] | None = None


@dataclass
class StepPeak:
    """Result of :func:`simulate_step`: the peak (static included), the op and phase where it
    occurs (the first op reaching it, forward before backward), per op the most bytes in use
    while it runs, and at a backward peak its parts (``held``, ``gradients``, ``param_grads``)."""

    peak: int
    where: int
    phase: str
    at: list[int]
    parts: dict[str, int]


def simulate_step(step: Step, static: int) -> StepPeak:
    """The peak core shared by every mode that simulates a training step (:func:`simulate_peak`,
    and the ``mcu`` mode's engine model)."""
    n = len(step.forward)
    best, where, phase, parts = 0, 0, "forward", {}
    at = list(step.forward)
    for i in range(n):
        if at[i] > best:
            best, where = at[i], i
    held, grads, pgrads = step.held, 0, 0
    for i in range(n - 1, -1, -1):
        held += step.acquired[i] if step.acquired else 0
        grads += step.grad_alloc[i]
        if step.runs_backward[i]:
            pgrads += step.param_grads[i]
            total = held + grads + pgrads + (step.workspace[i] if step.workspace else 0)
            at[i] = max(at[i], total)
            if total > best:
                best, where, phase = total, i, "backward"
                parts = {"held": held, "gradients": grads, "param_grads": pgrads}
            if step.in_place_update:  # updated in place and freed before the next op's backward
                pgrads -= step.param_grads[i]
        held -= step.released[i]
        grads -= step.grad_free[i]
    return StepPeak(static + best, where, phase, [static + a for a in at], parts)


def _lifetimes(graph: LayerGraph) -> tuple[dict[int, int], dict[int, int]]:
    """Per storage: the op producing it, and the last op it is referenced at (its last consumer,
    or the end of every module call it was passed into)."""
    producer: dict[int, int] = {}
    last_use: dict[int, int] = {}
    scope_end: dict[str, int] = {}
    for node in graph.nodes:
        for sc in node.scopes:
            scope_end[sc] = node.index
    for node in graph.nodes:
        for t in node.outs:
            producer.setdefault(t.storage, node.index)
            last_use.setdefault(t.storage, node.index)
        for src, t in zip(node.inputs, node.in_tensors):
            entered = [sc for sc in node.scopes if sc not in graph.nodes[src].scopes]
            end = max([node.index] + [scope_end[sc] for sc in entered])
            last_use[t.storage] = max(last_use.get(t.storage, end), end)
    return producer, last_use


def _activation_grads(graph: LayerGraph, views: list[OpView]) -> tuple[list[int], list[int]]:
    """(allocated, freed) gradient bytes at each op's backward: the gradient of output m is alive
    from the backward of its last consumer to that of m."""
    n = len(graph.nodes)
    last_consumer = [-1] * n
    for node in graph.nodes:
        for src in node.inputs:
            last_consumer[src] = max(last_consumer[src], node.index)
    grad_alloc, grad_free = [0] * n, [0] * n
    for m, v in enumerate(views):
        if v.req_out and last_consumer[m] >= 0 and graph.nodes[m].out is not None:
            grad_alloc[last_consumer[m]] += graph.nodes[m].out.nbytes
            grad_free[m] += graph.nodes[m].out.nbytes
    return grad_alloc, grad_free


def _recomputation(graph: LayerGraph, options: PeakOptions, released: list[int], grad_free: list[int]) -> list[int]:
    """What activation checkpointing changes in the backward (``PeakOptions.recomputed`` and
    ``held_gradients``): per op, the bytes its backward recomputes (``released`` / ``grad_free``
    updated in place to free them, and the held gradients, later)."""
    acquired = [0] * len(graph.nodes)
    for start, release, s in options.recomputed:
        acquired[start] += s.nbytes
        released[release] += s.nbytes
    for m, until in options.held_gradients:
        out = graph.nodes[m].out
        moved = out.nbytes if out is not None else 0
        if grad_free[m] >= moved > 0:
            grad_free[m] -= moved
            grad_free[until] += moved
    return acquired


def simulate_peak(  # one walk over the training step's events
    graph: LayerGraph,
    views: list[OpView],
    saved: list[list[Saved]],
    param_grads: list[int],
    static: int,
    options: PeakOptions | None = None,
) -> tuple[int, int, str, list[int]]:
    """Return (peak bytes, index of the op where it occurs, "forward" | "backward", and per op
    the most memory in use while it runs, forward or backward): eager PyTorch's step (module
    docstring) run through :func:`simulate_step`."""
    options = options or PeakOptions()
    if options.accumulated:  # the gradients accumulated by the earlier micro-batches, held throughout
        static += sum(param_grads)
    n = len(graph.nodes)
    ws_f = list(options.workspace_forward or [0] * n)
    producer, last_use = _lifetimes(graph)
    batch = {t.storage for node in graph.nodes if node.kind == "input" for t in node.outs}
    first_saver: dict[int, int] = {}
    private_at = [0] * n
    for i, items in enumerate(saved):
        for s in items:
            if s.storage is None:
                private_at[i] += s.nbytes
            else:
                first_saver[s.storage] = min(first_saver.get(s.storage, i), i)

    # forward: interval [producer, end] per storage via a difference array
    diff = [0] * (n + 1)
    for sid in batch:
        producer.pop(sid, None)
    for items in saved:  # storages kept for backward that no op produced: the targets
        batch.update(
            s.storage
            for s in items
            if s.storage is not None and s.storage not in producer and s.storage not in graph.param_storages
        )
    static += sum(graph.storages[sid] for sid in batch)
    for sid, p in producer.items():
        if sid in graph.param_storages:
            continue
        end = n - 1 if sid in first_saver else last_use[sid]
        diff[p] += graph.storages[sid]
        diff[end + 1] -= graph.storages[sid]
    forward = [0] * n
    live = private = 0
    for i in range(n):
        live += diff[i]
        private += private_at[i]
        forward[i] = live + private + ws_f[i]

    # backward: saved storages are freed after the backward of their earliest saver
    released = list(private_at) + [0]
    held = sum(private_at)
    for sid, i in first_saver.items():
        if sid not in graph.param_storages and sid not in batch:
            held += graph.storages[sid]
            released[i] += graph.storages[sid]
    grad_alloc, grad_free = _activation_grads(graph, views)
    acquired = _recomputation(graph, options, released, grad_free)
    step = Step(
        forward,
        held,
        released,
        grad_alloc,
        grad_free,
        param_grads,
        [v.req_out for v in views],
        in_place_update=in_place_update(options.schedule) or options.accumulated,
        workspace=options.workspace_backward,
        acquired=acquired,
    )
    result = simulate_step(step, static)
    return result.peak, result.where, result.phase, result.at
