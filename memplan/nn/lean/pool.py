"""Dropout keeping a bit-packed keep mask, and average pooling keeping nothing for backward."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from .bits import packbits, unpackbits
from .restore import remember


class _DropoutFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, p: float) -> Tensor:
        # the same draw as PyTorch's CPU dropout: bernoulli_(1 - p) on an empty_like(x) tensor
        keep = torch.empty_like(x).bernoulli_(1 - p)
        ctx.shape, ctx.p = x.shape, p
        ctx.save_for_backward(packbits(keep.bool()))
        return x * keep.div_(1 - p)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor):
        (packed,) = ctx.saved_tensors
        keep = unpackbits(packed, math.prod(ctx.shape)).view(ctx.shape)
        return grad_out * keep.to(grad_out.dtype).div_(1 - ctx.p), None


class MaskedDropout(nn.Module):
    """nn.Dropout (0 < p < 1, out of place) keeping a bit-packed keep mask: ``ceil(numel / 8)``
    bytes instead of PyTorch's float mask (CPU). Same random draw as ``F.dropout`` on CPU, so
    outputs and gradients are bit-identical under the same RNG state. Eval mode, or an input
    that needs no gradient, runs plain ``F.dropout``."""

    memplan_kind = "dropout"

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 < p < 1.0:
            raise NotImplementedError(f"MaskedDropout needs 0 < p < 1, got p={p}")
        self.p = float(p)

    @classmethod
    def from_module(cls, m: nn.Dropout) -> MaskedDropout:
        if type(m) is not nn.Dropout or m.inplace:
            raise NotImplementedError(f"MaskedDropout wraps an out-of-place nn.Dropout, not {m!r}")
        return remember(cls(m.p), m)

    def forward(self, x: Tensor) -> Tensor:
        if not (self.training and torch.is_grad_enabled() and x.requires_grad):
            return F.dropout(x, self.p, self.training)
        return _DropoutFn.apply(x, self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


# ----------------------------------------------------------------------------- average pooling
def _pair(v: Any) -> list[int]:
    return [v, v] if isinstance(v, int) else list(v)


class _AvgPoolFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, mod: LeanAvgPool2d) -> Tensor:
        ctx.input_shape, ctx.mod = x.shape, mod
        return F.avg_pool2d(
            x, mod.kernel_size, mod.stride, mod.padding, mod.ceil_mode, mod.count_include_pad, mod.divisor_override
        )

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor):
        m = ctx.mod
        shape_only = grad_out.new_empty(1).expand(ctx.input_shape)
        gi = torch.ops.aten.avg_pool2d_backward(
            grad_out,
            shape_only,
            _pair(m.kernel_size),
            _pair(m.stride),
            _pair(m.padding),
            m.ceil_mode,
            m.count_include_pad,
            m.divisor_override,
        )
        return gi, None


class LeanAvgPool2d(nn.AvgPool2d):
    """nn.AvgPool2d that saves nothing (0 bytes): its backward needs only the input shape.
    Same forward (PyTorch's kernel) and the same grad-input kernel as PyTorch."""

    memplan_kind = "avgpool"

    @classmethod
    def from_module(cls, m: nn.AvgPool2d) -> LeanAvgPool2d:
        lean = cls(m.kernel_size, m.stride, m.padding, m.ceil_mode, m.count_include_pad, m.divisor_override)
        return remember(lean, m)

    def forward(self, x: Tensor) -> Tensor:
        if not (torch.is_grad_enabled() and x.requires_grad):
            return super().forward(x)
        return _AvgPoolFn.apply(x, self)
