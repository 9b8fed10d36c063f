"""Shared parameters of lean ops: a lean module shares the Parameters of the module it replaces
(its weight frozen), and the tensors its backward reads are held by reference, not saved; these
helpers share them and check that they were not changed behind the op's back."""

from __future__ import annotations

from typing import Any

import torch.nn as nn
from torch import Tensor


def share_frozen(mod: nn.Module, m: nn.Module) -> None:
    """Give ``mod`` the ``weight`` and ``bias`` Parameters of ``m`` (the same objects, so optimisers
    and state_dicts keep working); the weight gets ``requires_grad=False``."""
    mod.weight = m.weight
    if mod.weight is not None:
        mod.weight.requires_grad_(False)
    mod.bias = m.bias


def check_frozen(mod: nn.Module) -> None:
    """Refuse to run when the shared frozen weight had ``requires_grad`` switched back on."""
    if mod.weight is not None and mod.weight.requires_grad:
        raise RuntimeError(f"{type(mod).__name__}: weight.requires_grad was switched back on")


def versions(*tensors: Tensor | None) -> tuple[int, ...]:
    """Version counters of ``tensors`` (-1 for None)."""
    return tuple(-1 if t is None else t._version for t in tensors)


def check_versions(ctx: Any, *tensors: Tensor | None) -> None:
    """Raise if ``tensors`` changed in place since ``ctx.versions`` was recorded in forward."""
    if versions(*tensors) != ctx.versions:
        raise RuntimeError(
            "a parameter or buffer used by a memplan lean op was modified in place between "
            "forward and backward (e.g. optimizer.step() before backward())"
        )
