"""``ShiftOnlyNorm``: BatchNorm with frozen statistics and scale and a trainable shift, keeping
nothing for backward (MobileTL's internal norms)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from .checks import check_frozen, check_versions, share_frozen, versions
from .restore import remember


class _ShiftNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, bias: Tensor | None, mod: ShiftOnlyNorm) -> Tensor:
        ctx.mod = mod
        ctx.versions = versions(mod.weight, mod.running_var)
        # PyTorch's own eval-mode kernel: y = x * s + (beta - mean * s), bit-identical to nn.BatchNorm
        return F.batch_norm(x, mod.running_mean, mod.running_var, mod.weight, bias, False, 0.0, mod.eps)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor):
        mod = ctx.mod
        check_versions(ctx, mod.weight, mod.running_var)
        gi = gb = None
        if ctx.needs_input_grad[0]:
            shape = (1, -1) + (1,) * (grad_out.dim() - 2)
            # dy * invstd * gamma, in the order (and precision of invstd) of PyTorch's CPU kernel
            gi = grad_out * mod.invstd().to(grad_out.dtype).reshape(shape)
            if mod.weight is not None:
                gi = gi * mod.weight.reshape(shape)
        if ctx.needs_input_grad[1]:
            gb = grad_out.sum([d for d in range(grad_out.dim()) if d != 1])
        return gi, gb, None


class ShiftOnlyNorm(nn.Module):
    """BatchNorm with frozen statistics and scale, trainable shift (MobileTL, Chiang et al.,
    AAAI 2023). Saves nothing (0 bytes).

    ``y = x * s + (beta - mean * s)`` with ``s = gamma / sqrt(var + eps)``; always uses the
    running statistics (eval semantics, never updated, whatever ``self.training`` is).
    grad-input = dy * s; grad-beta = sum of dy over all dims but the channel dim.
    """

    memplan_kind = "batchnorm"
    _version = 2  # BatchNorm's state_dict version (num_batches_tracked), so its checkpoints load as BatchNorm's

    def __init__(self, m: nn.modules.batchnorm._BatchNorm):
        super().__init__()
        if not isinstance(m, nn.modules.batchnorm._BatchNorm) or m.running_mean is None:
            raise NotImplementedError("ShiftOnlyNorm wraps a BatchNorm with running statistics")
        self.num_features, self.eps = m.num_features, m.eps
        share_frozen(self, m)
        self.register_buffer("running_mean", m.running_mean)
        self.register_buffer("running_var", m.running_var)
        self.register_buffer("num_batches_tracked", m.num_batches_tracked)

    @classmethod
    def from_module(cls, m: nn.modules.batchnorm._BatchNorm) -> ShiftOnlyNorm:
        """Wrap ``m`` sharing its Parameters and buffers; the scale gets requires_grad=False."""
        return remember(cls(m), m)

    @torch.no_grad()
    def invstd(self) -> Tensor:
        """``1 / sqrt(running_var + eps)``, computed in float64 (C floats)."""
        return 1.0 / torch.sqrt(self.running_var.double() + self.eps)

    def forward(self, x: Tensor) -> Tensor:
        check_frozen(self)
        return _ShiftNormFn.apply(x, self.bias, self)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}"
