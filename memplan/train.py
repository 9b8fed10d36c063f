"""Small training helpers: an optimizer by name and a few training steps on one batch.

Optimizer names are those the profiler counts state for (``memplan.costs.OPTIMIZER_STATES``):
``sgd`` (no momentum: no state, the 256KB paper's choice and the default), ``sgd-momentum``
(one state tensor per trainable element) and ``adam`` (two).
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .costs import OPTIMIZER_STATES
from .errors import BadOption

MOMENTUM = 0.9


def make_optimizer(params: Iterable[torch.Tensor], name: str = "sgd", lr: float = 0.01) -> torch.optim.Optimizer:
    """An optimizer over the parameters of ``params`` that require grad (the others are left
    out, so they never change). ``name``: ``sgd`` | ``sgd-momentum`` (momentum 0.9) | ``adam``."""
    if name not in OPTIMIZER_STATES:
        raise BadOption(f"unknown optimizer {name!r}", f"choose one of: {', '.join(OPTIMIZER_STATES)}")
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise BadOption("nothing to train: no parameter requires grad")
    if name == "adam":
        return torch.optim.Adam(trainable, lr=lr)
    return torch.optim.SGD(trainable, lr=lr, momentum=MOMENTUM if name == "sgd-momentum" else 0.0)


def train_steps(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int,
                optimizer: torch.optim.Optimizer) -> list[float]:
    """``steps`` steps of cross-entropy training on the batch (x, y); returns the loss of each
    step, measured before its update. Train / eval flags are left as they are (``apply_*`` set
    them per norm layer); gradients are released (set to None) before each step."""
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
