"""The execution choices a search tries jointly with the update (``--recompute``): which segments
(runs of consecutive blocks, ``memplan.graph.execution``) the backward recomputes.

The candidate sets are none, and for every segment size asked for and every block b, every block
from b on in segments of that size (``grouped``): recomputation pays where the backward reaches, the
last blocks, and a longer segment keeps fewer inputs for a higher peak and the same FLOPs. Each set
is searched as the update alone is (its cost table, additivity check and method: the exact solver
where memory is additive under it), and the best candidate over the sets is kept
(``memplan.search.run``). Recomputation changes neither what trains nor the gradients, so a
candidate's gain is the profile's whatever the set.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn as nn

from ..errors import BadOption
from ..graph import LayerGraph
from ..graph.execution import grouped
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
