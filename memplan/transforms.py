"""Architecture transforms applied to a model before tracing (and by ``apply_strategy``)."""

from __future__ import annotations

import torch.nn as nn

from .errors import BadOption


def swap_norm(model: nn.Module, norm: str) -> nn.Module:
    """Replace every BatchNorm by ``norm`` in place; returns the model.

    ``"batch"`` leaves the model as it is; ``"group"`` is not implemented yet.
    """
    if norm == "batch":
        return model
    raise BadOption(f"unknown --norm {norm!r}", "use 'batch' or 'group'")
