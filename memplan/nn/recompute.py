"""Recomputed segments on a real model: each segment (a run of consecutive blocks, by module
qualname) runs under non-reentrant ``torch.utils.checkpoint.checkpoint`` (early stop, torch's
default), as ``memplan.graph.execution.with_recompute`` counts it.

The model keeps its modules, names and ``state_dict``: only the instance ``forward`` of a
segment's blocks is replaced. The first block's runs the whole segment under ``checkpoint`` (the
blocks called one after another, each through its own ``__call__``, so hooks and capture scopes are
as before); the others pass their input on, as the first block has run them already. A segment of
several blocks therefore needs them to be consecutive children of one ``nn.Sequential``, which calls
each on the previous one's output. What the model computes, and its gradients, are unchanged; so
are the running statistics of norms in train mode, which the recomputation would otherwise update
a second time.
"""

from __future__ import annotations

import contextvars
import types
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _NormBase
from torch.utils.checkpoint import checkpoint

from ..errors import BadOption

#: instance attribute of a block in a segment: (its position in the segment, the segment's blocks)
SEGMENT_ATTR = "_memplan_recompute"
#: set while a segment runs its blocks (inside the checkpoint, and again when the backward recomputes it)
_RUNNING: contextvars.ContextVar[bool] = contextvars.ContextVar("memplan_recompute_running", default=False)


def _statistics(blocks: Sequence[nn.Module]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(buffer, its value now) of every norm in train mode that updates running statistics."""
    norms = [m for b in blocks for m in b.modules() if isinstance(m, _NormBase) and m.training]
    return [(t, t.detach().clone()) for m in norms if m.track_running_stats for t in m.buffers()]


def _run(ran: list[bool], blocks: Sequence[nn.Module], *args: Any, **kwargs: Any) -> Any:
    """The segment's blocks one after another; run again (the backward's recomputation), the
    running statistics of norms in train mode are put back as the first run left them, so they are
    updated once per step, as without recomputation."""
    kept = _statistics(blocks) if ran[0] else []
    ran[0] = True
    token = _RUNNING.set(True)
    try:
        out = blocks[0](*args, **kwargs)
        for block in blocks[1:]:
            out = block(out)
    finally:
        _RUNNING.reset(token)
        with torch.no_grad():
            for buffer, value in kept:
                buffer.copy_(value)
    return out


def _forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The instance forward of a block in a segment (module docstring)."""
    position, blocks = self.__dict__[SEGMENT_ATTR]
    if _RUNNING.get():
        return type(self).forward(self, *args, **kwargs)
    if position:
        return args[0]
    return checkpoint(_run, [False], blocks, *args, use_reentrant=False, **kwargs)


def runs_together(model: nn.Module, names: Sequence[str]) -> bool:
    """Whether the modules ``names`` can run as one segment: a single module, or consecutive
    children of one ``nn.Sequential`` (module docstring)."""
    if len(names) < 2:
        return True
    modules = dict(model.named_modules())
    parents = {n.rpartition(".")[0] for n in names}
    parent = modules.get(parents.pop()) if len(parents) == 1 else None
    children = list(parent.children()) if isinstance(parent, nn.Sequential) else []
    at = [next((i for i, c in enumerate(children) if c is modules.get(n)), -1) for n in names]
    return -1 not in at and at == list(range(at[0], at[0] + len(at)))


def _check_segment(model: nn.Module, names: Sequence[str]) -> list[nn.Module]:
    """The modules of one segment; BadOption where it cannot run as one (module docstring)."""
    modules = dict(model.named_modules())
    missing = [n for n in names if n not in modules]
    if missing:
        raise BadOption(f"recompute names {missing[0]!r}, which is no module of the model")
    blocks = [modules[n] for n in names]
    if any(SEGMENT_ATTR in b.__dict__ for b in blocks):
        raise BadOption(f"block {names[0]!r} is recomputed already", "realise a plan's recompute choices once")
    if not runs_together(model, names):
        raise BadOption(
            f"recompute segment {list(names)} is not a run of consecutive children of one nn.Sequential",
            "recompute each of these blocks on its own",
        )
    return blocks


def recompute_segments(model: nn.Module, segments: Sequence[Sequence[str]]) -> nn.Module:
    """Run each of ``segments`` (module qualnames of consecutive blocks) under non-reentrant
    checkpointing (module docstring); returns ``model``, changed in place."""
    checked = [_check_segment(model, names) for names in segments]
    for blocks in checked:
        for position, block in enumerate(blocks):
            block.__dict__[SEGMENT_ATTR] = (position, tuple(blocks))
            block.forward = types.MethodType(_forward, block)
    return model


def restore_segments(model: nn.Module) -> nn.Module:
    """Undo :func:`recompute_segments`: every block runs its own forward again; returns ``model``."""
    for m in model.modules():
        if m.__dict__.pop(SEGMENT_ATTR, None) is not None:
            m.__dict__.pop("forward", None)
    return model
