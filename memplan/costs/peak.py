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
  ops <= i, gradient buffers of outputs whose producer has not run backward yet but some
  consumer has, and the parameter gradients of ops >= i.

Schedules (:data:`SCHEDULES`): ``standard`` keeps every parameter gradient until the optimizer
step after backward (as above); ``tte``, the 256KB paper's Tiny Training Engine (Sec. 2.3), applies
each update in place as soon as the op's backward has produced its parameter gradients and frees
them, so at backward step i only op i's parameter gradients are alive (exact for SGD without
momentum; other optimizers keep their state, which is static here). Gradients of frozen
parameters are never allocated in either schedule.

Kernel workspaces (:mod:`.workspace`), when given, are added to the op running at each step,
forward and backward. Allocator rounding is not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import BadOption
from ..graph import LayerGraph
from ..plan import OpView
from .records import Saved

#: training-step schedules of the simulation (module docstring)
SCHEDULES = ("standard", "tte")


@dataclass(frozen=True)
class PeakOptions:
    """How the step runs: ``schedule`` (:data:`SCHEDULES`) and per-node kernel workspaces
    (forward, backward bytes; None = not modelled)."""

    schedule: str = "standard"
    workspace_forward: Sequence[int] | None = None
    workspace_backward: Sequence[int] | None = None

    def __post_init__(self) -> None:
        check_schedule(self.schedule)


def check_schedule(schedule: str) -> str:
    if schedule not in SCHEDULES:
        raise BadOption(f"unknown schedule {schedule!r}", f"use one of {', '.join(SCHEDULES)}")
    return schedule


def simulate_peak(graph: LayerGraph, views: list[OpView], saved: list[list[Saved]], param_grads: list[int],
                  static: int, options: PeakOptions | None = None) -> tuple[int, int, str, list[int]]:
    """Return (peak bytes, index of the op where it occurs, "forward" | "backward", and per op
    the most memory in use while it runs, forward or backward)."""
    options = options or PeakOptions()
    n = len(graph.nodes)
    ws_f = list(options.workspace_forward or [0] * n)
    ws_b = list(options.workspace_backward or [0] * n)
    in_place_update = options.schedule == "tte"
    producer: dict[int, int] = {}
    last_use: dict[int, int] = {}
    scope_end: dict[str, int] = {}
    batch = {t.storage for node in graph.nodes if node.kind == "input" for t in node.outs}
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
        batch.update(s.storage for s in items if s.storage is not None and s.storage not in producer
                     and s.storage not in graph.param_storages)
    static += sum(graph.storages[sid] for sid in batch)
    for sid, p in producer.items():
        if sid in graph.param_storages:
            continue
        end = n - 1 if sid in first_saver else last_use[sid]
        diff[p] += graph.storages[sid]
        diff[end + 1] -= graph.storages[sid]
    best, where, phase = 0, 0, "forward"
    at = [0] * n
    live = private = 0
    for i in range(n):
        live += diff[i]
        private += private_at[i]
        at[i] = live + private + ws_f[i]
        if at[i] > best:
            best, where = at[i], i

    # backward
    saved_free = [0] * (n + 1)  # bytes of saved storages released after op i's backward
    held = 0
    for sid, i in first_saver.items():
        if sid not in graph.param_storages and sid not in batch:
            held += graph.storages[sid]
            saved_free[i] += graph.storages[sid]
    last_consumer = [-1] * n
    for node in graph.nodes:
        for src in node.inputs:
            last_consumer[src] = max(last_consumer[src], node.index)
    grad_add = [0] * n  # grad buffer of output m is alive on backward steps last_consumer(m) .. m
    grad_free = [0] * n
    for m, v in enumerate(views):
        if v.req_out and last_consumer[m] >= 0 and graph.nodes[m].out is not None:
            grad_add[last_consumer[m]] += graph.nodes[m].out.nbytes
            grad_free[m] += graph.nodes[m].out.nbytes
    private = sum(private_at)
    grads = 0
    pgrads = 0
    for i in range(n - 1, -1, -1):
        grads += grad_add[i]
        if views[i].req_out:
            pgrads += param_grads[i]
            total = held + private + grads + pgrads + ws_b[i]
            at[i] = max(at[i], total)
            if total > best:
                best, where, phase = total, i, "backward"
            if in_place_update:  # updated in place and freed before the next op's backward
                pgrads -= param_grads[i]
        held -= saved_free[i]
        private -= private_at[i]
        grads -= grad_free[i]
    return static + best, where, phase, [static + a for a in at]
