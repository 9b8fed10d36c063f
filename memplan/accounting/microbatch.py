"""Micro-batching (gradient accumulation): a batch of B samples trained as M micro-batches of B / M,
each a forward and a backward whose parameter gradients add up before one optimizer step.

Memory: weights, gradients and optimizer state are those of the whole step (the gradients
accumulate in place); saved activations are those of one micro-batch, which is what
``memplan profile --micro-batch M`` captures, and the peak that of a micro-batch after the
first, which holds the accumulated gradients from its start (``memplan.costs.peak``). FLOPs of
the profile are one micro-batch's; an optimizer step runs M of them (the same total as the
whole batch at once).

What the model computes is unchanged, except where a norm normalises with the statistics of its
batch (a BatchNorm in train mode, or one without running statistics): it then sees B / M samples,
so the micro-batched step computes something else (:func:`micro_batch_extras` warns).
"""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import AssumptionWarning, BadOption
from ..graph import LayerGraph
from ..plan import Plan


def micro_batch_size(batch: int, micro_batches: int) -> int:
    """Samples per micro-batch of a batch of ``batch`` split into ``micro_batches``."""
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise BadOption(f"--micro-batch must be a positive integer, got {micro_batches!r}")
    if batch % micro_batches:
        raise BadOption(
            f"--micro-batch {micro_batches} does not divide --batch {batch}",
            "give a batch that is a multiple of the number of micro-batches",
        )
    return batch // micro_batches


def batch_statistic_norms(graph: LayerGraph, plan: Plan) -> list[str]:
    """The BatchNorm layers of ``graph`` that normalise with their batch's statistics under ``plan``
    (``Plan.batch_statistic_norms``)."""
    return plan.batch_statistic_norms(graph)


def micro_batch_extras(graph: LayerGraph, plan: Plan, micro_batches: int, batch: int) -> dict[str, Any]:
    """``Profile.extras["micro_batch"]``: the split, and how many norms compute something else with it
    (``batch_statistic_norms``; an ``AssumptionWarning`` names them)."""
    norms = batch_statistic_norms(graph, plan)
    out: dict[str, Any] = {
        "micro_batches": micro_batches,
        "micro_batch_size": batch // micro_batches,
        "batch": batch,
        "note": (
            f"gradient accumulation: saved activations of one micro-batch of {batch // micro_batches}, peak of a "
            f"later one (the accumulated gradients held from its start); FLOPs per micro-batch ({micro_batches} per "
            "optimizer step); weights, gradients and optimizer state of the whole step"
        ),
        "batch_statistic_norms": len(norms),
    }
    if norms:
        more = f" and {len(norms) - 3} more" if len(norms) > 3 else ""
        text = (
            f"micro-batching changes what the model computes: {len(norms)} BatchNorm layer(s) normalise with "
            f"the statistics of {batch // micro_batches} samples, not {batch} ({', '.join(norms[:3])}{more}); "
            "freeze their statistics (eval mode) or use GroupNorm to train the same model"
        )
        warnings.warn(text, AssumptionWarning, stacklevel=3)
    return out
