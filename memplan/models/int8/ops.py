"""The int8 training graph's ops: the quantized forward of the 256KB paper's format, simulated in
floating point with integer values, and straight-through gradients.

Every tensor between ops holds int8 *values* (integers in [-128, 127]) as float32; weights hold
int8 values and biases int32 values as float32 Parameters, so SGD updates them in those units
(the paper's quantized graph: ``tiny-training``'s ``QuantizedConv2dDiff``). The forward is bit
for bit the format's integer arithmetic (``tests/int8_reference.py`` checks it):

* conv: ``acc = conv(round(x) - x_zero, round(W))`` (exact: int32 values in float32), plus the
  bias, then ``round(float64(acc + b) * s) + y_zero`` with ``s = float32(x_scale * w_scales /
  y_scale)`` per output channel; the clamp to [-128, 127] is the stock ``nn.Hardtanh`` that
  follows every conv (its gradient is the 0/1 mask of the clamp, as ReLU's: 0 on the bounds);
* residual add: ``round(float64((x1 - z1) * s1 + (x2 - z2) * s2) / s_y) + z_y`` (float32
  dequantized terms, as the format computes them), then the clamp;
* global average pool: the rounded mean.

Rounding is invisible to the gradient (straight-through): ``d out / d acc = s``, so the bias
gradient is ``sum(grad * s)`` and the weight gradient ``conv_weight(round(x) - x_zero, grad * s)``.

Each op saves what memplan's rule for its kind says (``memplan_kind``): the conv its input and
weight whenever autograd records it (as ``F.conv2d``), the add and the pool nothing. Rounded
weights and shifted inputs are recomputed in the backward, never kept. Quantization scales
are plain attributes and buffers, not activations.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

#: int8 value range of activations
QMIN, QMAX = -128, 127


def _shifted(x: Tensor, zero: float | Tensor) -> Tensor:
    return x.round() - zero


def _requantize(acc: Tensor, bias: Tensor, scale: Tensor, zero: float | Tensor) -> Tensor:
    """``round(float64(acc + bias) * scale) + zero`` per output channel (dim 1), back in ``acc``'s
    dtype. ``acc + bias`` is an exact integer sum in float32 (int32 values below 2**24)."""
    shape = (1, -1) + (1,) * (acc.dim() - 2)
    exact = (acc + bias.view(shape)).double()
    return (exact * scale.double().view(shape)).round_().add_(zero).to(acc.dtype)


#: the elementwise kernels of the forward: eager by default; :func:`fuse_kernels` swaps in
#: compiled versions of the same formulas
_KERNELS: dict[str, Any] = {"shifted": _shifted, "requantize": _requantize}


def fuse_kernels(enable: bool = True) -> bool:
    """Compile the forward's elementwise chains (``torch.compile``, one fused loop each instead of
    six passes over float64 copies: a training step 2-3x faster on a CPU, benchmarks/int8_kernels.py). Same
    formulas, so the same bits (``tests/test_int8.py`` checks). Returns False, changing nothing,
    where this torch cannot compile (no C++ compiler, ...). The first call of each kernel
    compiles (~30 s); later processes read torch's compile cache. ``enable=False`` restores the
    eager kernels."""
    if not enable:
        _KERNELS.update(shifted=_shifted, requantize=_requantize)
        return False
    shifted, requantize = (torch.compile(f, dynamic=True) for f in (_shifted, _requantize))
    # zero points go in as 0-dim tensors (a Python float compiles once per value), the bias as a
    # plain tensor (a Parameter's shape is compiled static); both run in autograd's no-grad mode
    fused = {
        "shifted": lambda x, zero: shifted(x, torch.tensor(zero, dtype=x.dtype)),
        "requantize": lambda acc, bias, scale, zero: requantize(
            acc, bias.detach(), scale, torch.tensor(zero, dtype=acc.dtype)
        ),
    }
    try:
        with torch.no_grad():
            probe = torch.arange(-60.0, 60.0).view(2, 3, 4, 5)
            fused["shifted"](probe, 1.0)
            fused["requantize"](probe, torch.ones(3), torch.full((3,), 0.5), 1.0)
    except Exception:  # any failure to compile leaves the eager kernels
        return False
    _KERNELS.update(fused)
    return True


class _QuantConvFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor, conv: QuantConv2d) -> Tensor:
        ctx.conv = conv
        ctx.save_for_backward(x, weight)
        shifted = _KERNELS["shifted"](x, conv.x_zero)
        acc = F.conv2d(shifted, weight.round(), None, conv.stride, conv.padding, 1, conv.groups)
        return _KERNELS["requantize"](acc, bias, conv.effective_scale, conv.y_zero)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor):
        x, weight = ctx.saved_tensors
        conv: QuantConv2d = ctx.conv
        g = grad * conv.effective_scale.to(grad.dtype).view(1, -1, 1, 1)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = torch.nn.grad.conv2d_input(x.shape, weight.round(), g, conv.stride, conv.padding, 1, conv.groups)
        if ctx.needs_input_grad[1]:
            gw = torch.nn.grad.conv2d_weight(
                _KERNELS["shifted"](x, conv.x_zero), weight.shape, g, conv.stride, conv.padding, 1, conv.groups
            )
            if conv.weight_channels is not None:
                gw = gw * conv.weight_channel_mask().to(gw.dtype)
        if ctx.needs_input_grad[2]:
            gb = g.sum((0, 2, 3))
        return gx, gw, gb, None


class QuantConv2d(nn.Conv2d):
    """An int8 conv of the format (module docstring): ``weight`` int8 values, ``bias`` int32
    values, per-output-channel ``w_scales``; input and output int8 values with their scale and
    zero point. No clamp inside: an ``nn.Hardtanh(-128, 127)`` follows it.

    ``weight_channels``: when set (:meth:`train_channels`), only those input channels (output
    channels of a depthwise conv) of the weight get a gradient: the paper's sub-channel update.
    """

    memplan_kind = "conv"

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int,
        groups: int,
        quant: dict[str, Any],
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, kernel_size // 2, groups=groups, bias=True)
        self.x_scale, self.x_zero = float(quant["x_scale"]), float(quant["x_zero"])
        self.y_scale, self.y_zero = float(quant["y_scale"]), float(quant["y_zero"])
        w_scales = np.asarray(quant["w_scales"], dtype=np.float64)
        self.register_buffer("w_scales", torch.as_tensor(w_scales.astype(np.float32)))
        # the format's effective scale: float64 product, kept as float32 (tiny-training's buffer);
        # numpy arithmetic, so a model built on the meta device costs no torch decomposition
        effective = (self.x_scale * w_scales / self.y_scale).astype(np.float32)
        self.register_buffer("effective_scale", torch.as_tensor(effective))
        self.weight_channels: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        # what one unit of each parameter is worth in real values, read by QAS (memplan.optim);
        # set at every call, so copies and loaded models carry it too
        self.weight.qas_scale, self.bias.qas_scale = self.w_scales, self.w_scales * self.x_scale
        return _QuantConvFn.apply(x, self.weight, self.bias, self)

    def train_channels(self, channels: Tensor | None) -> None:
        """Keep the weight gradient of these input channels only (None: all)."""
        self.weight_channels = None if channels is None else torch.as_tensor(channels, dtype=torch.int64)

    def weight_channel_mask(self) -> Tensor:
        """0/1 mask of the weight's shape: 1 on the trained channels."""
        mask = torch.zeros(self.weight.shape, dtype=torch.bool, device=self.weight.device)
        idx = self.weight_channels.to(self.weight.device)
        if self.groups == 1:
            mask[:, idx] = True
        else:  # depthwise: a channel is a group, its filters are the output rows of that group
            per_group = self.out_channels // self.groups
            rows = (idx[:, None] * per_group + torch.arange(per_group, device=idx.device)).reshape(-1)
            mask[rows] = True
        return mask

    def real_weight(self) -> Tensor:
        """The dequantized weight, ``weight * w_scales`` (fp32)."""
        return self.weight.detach().round() * self.w_scales.view(-1, 1, 1, 1)

    def real_bias(self) -> Tensor:
        """The dequantized bias, ``bias * x_scale * w_scales`` (fp32)."""
        return (self.bias.detach().double() * self.x_scale * self.w_scales.double()).float()


class _QuantAddFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x1: Tensor, x2: Tensor, add: QuantAdd) -> Tensor:
        ctx.add = add
        real = (x1.round() - add.zero1) * add.scale1 + (x2.round() - add.zero2) * add.scale2  # float32 math
        return (real.double() / add.scale_y).round_().add_(add.zero_y).to(x1.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor):
        add: QuantAdd = ctx.add
        g = grad / add.scale_y
        return g * add.scale1, g * add.scale2, None


class QuantAdd(nn.Module):
    """The format's residual add of two int8 tensors (module docstring); an ``nn.Hardtanh(-128,
    127)`` follows it. Scales are float32 values, as the format stores them."""

    memplan_kind = "add"

    def __init__(self, zero1: float, scale1: float, zero2: float, scale2: float, zero_y: float, scale_y: float):
        super().__init__()
        f32 = lambda v: float(np.float32(v))  # noqa: E731
        self.zero1, self.scale1, self.zero2, self.scale2 = float(zero1), f32(scale1), float(zero2), f32(scale2)
        self.zero_y, self.scale_y = float(zero_y), f32(scale_y)

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        return _QuantAddFn.apply(x1, x2, self)


class _QuantPoolFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.shape = x.shape
        return x.mean((-1, -2), keepdim=True).round()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor):
        h, w = ctx.shape[-2:]
        return grad.expand(ctx.shape) / (h * w)


class QuantAvgPool(nn.Module):
    """Global average pooling of int8 values: the rounded mean (1 x 1 output)."""

    memplan_kind = "adaptive_avgpool"
    output_size = 1

    def forward(self, x: Tensor) -> Tensor:
        return _QuantPoolFn.apply(x)


class Dequantize(nn.Module):
    """``(x - zero) * scale``: int8 values to real ones (the fp32 head's input). Plain ops, traced."""

    def __init__(self, zero: float, scale: float) -> None:
        super().__init__()
        self.zero, self.scale = float(zero), float(scale)

    def forward(self, x: Tensor) -> Tensor:
        return (x - self.zero) * self.scale


def clamp() -> nn.Hardtanh:
    """The clamp to the int8 range after every conv and residual add."""
    return nn.Hardtanh(float(QMIN), float(QMAX))
