"""Activations whose backward needs only a bit-packed 1-bit mask (``ceil(numel / 8)`` bytes):
ReLU, Hardtanh / ReLU6, LeakyReLU, and MobileTL's sign-approximated h-swish."""

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


class _MaskActFn(torch.autograd.Function):
    """y = fn(x); saves a bit-packed mask; backward = dy where mask else (dy * slope)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, mod: _MaskedActivation) -> Tensor:
        mask = mod.grad_mask(x)
        ctx.shape, ctx.slope = x.shape, mod.off_slope
        ctx.save_for_backward(packbits(mask))
        del mask
        if mod.inplace:
            ctx.mark_dirty(x)
        return mod.fn(x)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor):
        (packed,) = ctx.saved_tensors
        mask = unpackbits(packed, math.prod(ctx.shape)).view(ctx.shape)
        if ctx.slope == 0.0:
            return grad_out.masked_fill(~mask, 0), None
        return torch.where(mask, grad_out, grad_out * ctx.slope), None


class _MaskedActivation(nn.Module):
    """Base: an elementwise activation whose backward needs only a 1-bit mask.

    Saves ``ceil(numel / 8)`` bytes (uint8, bit-packed by :func:`packbits`).
    """

    off_slope: float = 0.0  # gradient factor where the mask is 0
    inplace: bool = False

    def fn(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def grad_mask(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        if not (torch.is_grad_enabled() and x.requires_grad):
            return self.fn(x)  # nothing to save: plain forward
        return _MaskActFn.apply(x, self)


class MaskedReLU(_MaskedActivation):
    """ReLU; gradient passes where ``not (x <= 0)`` (as PyTorch: x > 0, and NaN)."""

    memplan_kind = "relu"

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    @classmethod
    def from_module(cls, m: nn.ReLU) -> MaskedReLU:
        return remember(cls(inplace=m.inplace), m)

    def fn(self, x: Tensor) -> Tensor:
        return x.relu_() if self.inplace else x.relu()

    def grad_mask(self, x: Tensor) -> Tensor:
        return ~(x <= 0)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class MaskedHardtanh(_MaskedActivation):
    """Hardtanh(min_val, max_val); gradient passes strictly inside: ``min_val < x < max_val``,
    PyTorch's ``hardtanh_backward`` convention (0 at both bounds). For NaN inputs PyTorch's
    own CPU kernel is inconsistent (its vectorised path blocks, its scalar tail passes);
    here NaN blocks, as on the vectorised path."""

    memplan_kind = "hardtanh"

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
        super().__init__()
        self.min_val, self.max_val, self.inplace = float(min_val), float(max_val), inplace

    @classmethod
    def from_module(cls, m: nn.Hardtanh) -> MaskedHardtanh:
        return remember(cls(m.min_val, m.max_val, m.inplace), m)

    def fn(self, x: Tensor) -> Tensor:
        return F.hardtanh(x, self.min_val, self.max_val, self.inplace)

    def grad_mask(self, x: Tensor) -> Tensor:
        return (x > self.min_val) & (x < self.max_val)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}" + (", inplace=True" if self.inplace else "")


class MaskedReLU6(MaskedHardtanh):
    """ReLU6 = Hardtanh(0, 6); gradient passes for 0 < x < 6 (strict, as PyTorch)."""

    def __init__(self, inplace: bool = False):
        super().__init__(0.0, 6.0, inplace)

    @classmethod
    def from_module(cls, m: nn.Hardtanh) -> MaskedHardtanh:
        """nn.ReLU6 -> MaskedReLU6; any other nn.Hardtanh -> MaskedHardtanh."""
        if (m.min_val, m.max_val) == (0.0, 6.0):
            return remember(cls(m.inplace), m)
        return MaskedHardtanh.from_module(m)


class MaskedLeakyReLU(_MaskedActivation):
    """LeakyReLU; gradient is dy where x > 0, dy * negative_slope elsewhere (NaN included)."""

    memplan_kind = "leaky_relu"

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False):
        super().__init__()
        self.negative_slope, self.inplace = float(negative_slope), inplace
        self.off_slope = self.negative_slope

    @classmethod
    def from_module(cls, m: nn.LeakyReLU) -> MaskedLeakyReLU:
        return remember(cls(m.negative_slope, m.inplace), m)

    def fn(self, x: Tensor) -> Tensor:
        return F.leaky_relu(x, self.negative_slope, self.inplace)

    def grad_mask(self, x: Tensor) -> Tensor:
        return x > 0

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class SignHardswish(_MaskedActivation):
    """Hardswish with MobileTL's sign-approximated backward (Chiang et al., "MobileTL:
    On-Device Transfer Learning with Inverted Residual Blocks", AAAI 2023, Table 2, Fig. 3,
    appendix Eq. 9).

    Forward is exact ``F.hardswish``. The backward replaces the true derivative
    (0 for x <= -3, (2x + 3) / 6 in between, 1 for x >= 3) by a step of the input's sign::

        d hswish / dx  ~=  1  if x > threshold  else  0        (threshold = 0)

    so only a 1-bit mask of ``x > threshold`` is kept: ``ceil(numel / 8)`` bytes.

    NOTE: the seed text of the paper available to memplan lost its equations; the step at
    0 with values {0, 1} is reconstructed from the prose ("approximated as a signed
    function", "only a binary mask is stored", approximated derivative bounded by 1 in
    Propositions 1-2). ``threshold`` is a parameter so that it can be changed if Eq. 9 says
    otherwise.
    """

    memplan_kind = "hardswish"

    def __init__(self, inplace: bool = False, threshold: float = 0.0):
        super().__init__()
        self.inplace, self.threshold = inplace, float(threshold)

    @classmethod
    def from_module(cls, m: nn.Hardswish, threshold: float = 0.0) -> SignHardswish:
        return remember(cls(m.inplace, threshold), m)

    def fn(self, x: Tensor) -> Tensor:
        return F.hardswish(x, self.inplace)

    def grad_mask(self, x: Tensor) -> Tensor:
        return x > self.threshold

    def extra_repr(self) -> str:
        return f"threshold={self.threshold}" + (", inplace=True" if self.inplace else "")
