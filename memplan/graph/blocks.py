"""Blocks: the structural rule that finds inverted-residual / MBConv / ResNet units, and the
assignment of every traced node to the block it runs in."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from ..errors import MemplanError
from .model import LayerGraph


def _count_layers(m: nn.Module) -> int:
    """Layers inside ``m``: modules owning a weight of two or more dims (conv, linear, and
    custom layers that call ``F.conv2d`` with their own weight)."""
    return sum(
        1 for sub in m.modules() if isinstance(getattr(sub, "weight", None), torch.Tensor) and sub.weight.dim() >= 2
    )


def find_blocks(model: nn.Module) -> list[str]:
    """Structural block rule.

    A block is a module that is not an ``nn.Sequential`` / ``nn.ModuleList``, contains at
    least two layers (conv, linear: modules with a weight of 2+ dims), is a child of an ``nn.Sequential`` /
    ``nn.ModuleList``,
    and has no ancestor that is already a block. This finds inverted-residual / MBConv /
    ResNet units in the usual model layouts; pass explicit ``block_names`` otherwise.
    """
    containers = (nn.Sequential, nn.ModuleList)
    found: list[str] = []

    def visit(mod: nn.Module, prefix: str) -> None:
        for cname, child in mod.named_children():
            qual = f"{prefix}.{cname}" if prefix else cname
            if isinstance(mod, containers) and not isinstance(child, containers) and _count_layers(child) >= 2:
                found.append(qual)
            else:
                visit(child, qual)

    visit(model, "")
    return found


def _assign_blocks(graph: LayerGraph, blocks: Sequence[str], explicit: bool) -> None:
    ordered: list[str] = []
    for node in graph.nodes:
        scope = node.scope
        for b in blocks:
            if scope == b or scope.startswith(b + "."):
                node.block = b
                if b not in ordered:
                    ordered.append(b)
                break
    if explicit:
        missing = [b for b in blocks if b not in ordered]
        if missing:
            raise MemplanError(
                f"block {missing[0]!r} is not a module of the traced model",
                "name blocks by module qualname, e.g. 'features.3'",
            )
    graph.blocks = ordered
