"""The execution choices a search tries jointly with the update: which segments (runs of
consecutive blocks, ``memplan.graph.execution``) the backward recomputes (``--recompute``), and in
how many micro-batches the batch trains (``--micro-batches``: gradient accumulation).

The candidate sets are none, and for every segment size asked for and every block b, every block
from b on in segments of that size (``grouped``): recomputation pays where the backward reaches, the
last blocks, and a longer segment keeps fewer inputs for a higher peak and the same FLOPs. Each set
is searched as the update alone is (its cost table, additivity check and method: the exact solver
where memory is additive under it), and the best candidate over the sets is kept
(``memplan.search.run``). Recomputation changes neither what trains nor the gradients, so a
candidate's gain is the profile's whatever the set.

Each micro-batch count M is searched on the model traced again at ``batch / M`` (``micro_captures``):
one micro-batch's activations, the peak of a later one (the accumulated gradients held), FLOPs of
all M (``memplan.search.memory.MemoryModel.flops``). It changes what the model computes where a norm
normalises with its batch's statistics, so a scheme is refused then (``memplan.plan.convert``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn as nn

from ..api import Captured, capture
from ..costs.peak import in_place_update
from ..errors import BadOption
from ..graph import LayerGraph
from ..graph.execution import grouped
from ..modes import get_mode
from ..nn.recompute import runs_together

Segments = tuple[tuple[str, ...], ...]


def execution_family(graph: LayerGraph, sizes: Sequence[int], model: nn.Module | None = None) -> list[Segments]:
    """The recompute sets a search tries (module docstring), none first; none but that one without
    ``sizes``. With the ``model`` the graph was captured from, a set with a segment that
    ``apply_scheme`` cannot run as one (several blocks that are not consecutive children of one
    ``nn.Sequential``: ``memplan.nn.recompute.runs_together``) is left out."""
    if sizes and graph.checkpoints:
        raise BadOption(
            "the model makes checkpoint calls of its own: --recompute would nest segments in them",
            "search without --recompute",
        )
    family: list[Segments] = [()]
    for size in sizes:
        for start in range(len(graph.blocks)):
            segments = grouped(graph.blocks[start:], size)
            runs = model is None or all(runs_together(model, seg) for seg in segments)
            if runs and segments not in family:
                family.append(segments)
    return family


def micro_captures(cap: Captured, counts: Sequence[int]) -> list[tuple[int, Captured]]:
    """(micro-batch count, the model captured at one micro-batch): 1 and ``cap`` first, then each of
    ``counts``, the model traced again at ``batch / count`` (BadOption where it does not divide)."""
    batch = cap.graph.batch
    wrong = [m for m in counts if batch % m]
    if wrong:
        raise BadOption(
            f"--micro-batches {wrong[0]} does not divide --batch {batch}",
            "give counts that divide the batch (e.g. --batch 32 --micro-batches 2,4)",
        )
    again = [capture(cap.model, batch=batch // m, input_shape=cap.graph.input_shape[1:], name=cap.name) for m in counts]
    return [(1, cap), *zip(counts, again, strict=True)]


def check_execution(mode: str, recompute: Sequence[int], micro_batches: Sequence[int]) -> None:
    """BadOption where ``mode`` cannot count the execution choices asked for: recomputed segments in a
    mode whose peak is an engine's schedule, micro-batches where the update runs in place during
    the backward (no gradient is kept to accumulate)."""
    spec = get_mode(mode)
    if recompute and not spec.recompute:
        raise BadOption(
            f"mode {mode} does not model recomputed segments (its peak is the engine's schedule)",
            "search without --recompute, or in another mode",
        )
    if micro_batches and in_place_update(spec.default_schedule):
        raise BadOption(
            f"mode {mode} updates each parameter in place during the backward: no gradient is kept to accumulate "
            "over micro-batches",
            "search without --micro-batches, or in another mode",
        )
