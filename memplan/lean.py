"""Memory-lean drop-in modules: keep only what backward really needs.

Eager PyTorch saves more than backward needs (accounting.md §1): a Conv2d with a frozen
weight still saves its input and weight, ReLU saves a full float tensor, BatchNorm saves its
input even with a frozen scale. The modules below replace those ops with custom
``torch.autograd.Function``\\ s that keep the ideal minimum (accounting.md §2).

Rules every class here follows:

* every saved activation goes through ``ctx.save_for_backward`` so that
  ``torch.autograd.graph.saved_tensors_hooks`` sees it (memplan measures memory that way);
  parameters and buffers are reached through plain references held on ``ctx`` (they are
  resident anyway, not activations), and backward checks that they were not modified in
  place since forward;
* ``LeanX.from_module(m, ...)`` shares ``m``'s Parameter and buffer objects under the same
  attribute names, so optimisers and state_dicts keep working as far as possible.
  ``from_module`` of a frozen-weight op sets ``requires_grad=False`` on the shared weight
  and ``forward`` refuses to run if it was switched back on;
* forward outputs equal the plain module's; gradients equal PyTorch's (same boundary
  conventions), except ``SignHardswish`` whose backward is approximated on purpose.

What each op saves for backward, in bytes (``numel`` = elements of the activation):

=====================  ===============================================================
``FrozenConv``         0
``FrozenLinear``       0
``SubChannelConv``     B x n x spatial x itemsize (the n selected input channels only)
``ShiftOnlyNorm``      0
``MaskedReLU``         ceil(numel / 8)  (1-bit mask, uint8)
``MaskedHardtanh``     ceil(numel / 8)  (``MaskedReLU6`` too)
``MaskedLeakyReLU``    ceil(numel / 8)
``SignHardswish``      ceil(numel / 8)
``MaskedDropout``      ceil(numel / 8)  (the keep mask; PyTorch's CPU dropout keeps a float one)
``LeanAvgPool2d``      0  (PyTorch's avg-pool keeps its input, though backward needs only its shape)
=====================  ===============================================================
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from memplan.errors import BadOption

__all__ = [
    "packbits", "unpackbits", "select_channels",
    "FrozenConv", "FrozenLinear", "SubChannelConv", "ShiftOnlyNorm",
    "MaskedReLU", "MaskedHardtanh", "MaskedReLU6", "MaskedLeakyReLU", "SignHardswish",
    "MaskedDropout", "LeanAvgPool2d", "SELECTION_RULES",
]

SELECTION_RULES = ("magnitude+", "magnitude-", "random")


# ----------------------------------------------------------------------------- bit packing
def packbits(mask: Tensor) -> Tensor:
    """Pack a bool tensor into a flat uint8 tensor of ``ceil(numel / 8)`` bytes.

    Bit ``i`` of the flattened mask goes to byte ``i // 8``, bit position ``i % 8``
    (least significant bit first, numpy's ``bitorder='little'``); padding bits are 0.
    """
    if mask.dtype != torch.bool:
        raise TypeError(f"packbits expects a bool tensor, got {mask.dtype}")
    flat = mask.reshape(-1)
    pad = (-flat.numel()) % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    bits = flat.view(torch.uint8).view(-1, 8)
    shifts = torch.arange(8, dtype=torch.uint8, device=mask.device)
    # distinct bits never carry, so the sum is the bitwise OR
    return (bits << shifts).sum(dim=1, dtype=torch.uint8)


def unpackbits(packed: Tensor, numel: int) -> Tensor:
    """Inverse of :func:`packbits`: a flat bool tensor of ``numel`` elements."""
    if packed.dtype != torch.uint8 or packed.dim() != 1:
        raise TypeError("unpackbits expects a 1-D uint8 tensor")
    if packed.numel() != (numel + 7) // 8:
        raise ValueError(f"{packed.numel()} bytes cannot hold exactly {numel} bits")
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (packed.unsqueeze(1) >> shifts) & 1
    return bits.reshape(-1)[:numel].bool()


# ----------------------------------------------------------------------------- helpers
def _versions(*tensors: Optional[Tensor]) -> tuple[int, ...]:
    return tuple(-1 if t is None else t._version for t in tensors)


def _check_versions(ctx: Any, *tensors: Optional[Tensor]) -> None:
    if _versions(*tensors) != ctx.versions:
        raise RuntimeError(
            "a parameter or buffer used by a memplan lean op was modified in place between "
            "forward and backward (e.g. optimizer.step() before backward())")


def _conv_padding(m: nn.Module) -> tuple[int, ...]:
    """Integer padding of a Conv1d/2d module (zeros mode only, 'same' only if symmetric)."""
    if m.padding_mode != "zeros":
        raise NotImplementedError(f"padding_mode={m.padding_mode!r}: only 'zeros' is supported")
    if isinstance(m.padding, str):
        if m.padding == "valid":
            return (0,) * len(m.kernel_size)
        pads = []
        for k, d in zip(m.kernel_size, m.dilation):
            total = d * (k - 1)
            if total % 2:
                raise NotImplementedError("padding='same' with asymmetric padding is not supported")
            pads.append(total // 2)
        return tuple(pads)
    return tuple(m.padding)


class _ConvGeometry(nn.Module):
    """Shared conv metadata (mirrors nn.ConvNd's attribute names) and batch handling."""

    def _init_geometry(self, m: nn.Module) -> None:
        if not isinstance(m, (nn.Conv1d, nn.Conv2d)) or m.transposed:
            raise NotImplementedError(f"{type(m).__name__}: only Conv1d / Conv2d are supported")
        self.in_channels: int = m.in_channels
        self.out_channels: int = m.out_channels
        self.kernel_size: tuple[int, ...] = tuple(m.kernel_size)
        self.stride: tuple[int, ...] = tuple(m.stride)
        self.padding: tuple[int, ...] = _conv_padding(m)
        self.dilation: tuple[int, ...] = tuple(m.dilation)
        self.groups: int = m.groups
        self.nd: int = len(m.kernel_size)

    def _conv(self, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        fn = F.conv1d if self.nd == 1 else F.conv2d
        return fn(x, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def _batched(self, x: Tensor) -> tuple[Tensor, bool]:
        unbatched = x.dim() == self.nd + 1
        return (x.unsqueeze(0) if unbatched else x), unbatched

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"groups={self.groups}")


def _conv_input_bias_grads(ctx: Any, grad_out: Tensor, weight: Tensor, need_input: bool,
                           need_bias: bool) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """grad-input (needs only the input *shape* and the weight) and grad-bias of a conv."""
    if not (need_input or need_bias):
        return None, None
    shape_only = grad_out.new_empty(1).expand(ctx.input_shape)
    gi, _, gb = torch.ops.aten.convolution_backward(
        grad_out, shape_only, weight, [weight.shape[0]] if need_bias else None,
        ctx.stride, ctx.padding, ctx.dilation, False, [0] * len(ctx.stride), ctx.groups,
        [need_input, False, need_bias])
    return gi, gb


def _store_geometry(ctx: Any, mod: _ConvGeometry, x: Tensor) -> None:
    ctx.input_shape = x.shape
    ctx.stride, ctx.padding = mod.stride, mod.padding
    ctx.dilation, ctx.groups = mod.dilation, mod.groups


# ----------------------------------------------------------------------------- FrozenConv
class _FrozenConvFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, bias: Optional[Tensor], weight: Tensor,
                mod: "FrozenConv") -> Tensor:
        _store_geometry(ctx, mod, x)
        ctx.weight = weight  # a parameter reference, not an activation
        ctx.versions = _versions(weight)
        return mod._conv(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor):
        _check_versions(ctx, ctx.weight)
        gi, gb = _conv_input_bias_grads(ctx, grad_out, ctx.weight,
                                        ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        return gi, gb, None, None


class FrozenConv(_ConvGeometry):
    """Conv1d / Conv2d with a frozen weight. Saves nothing (0 bytes).

    Backward computes grad-input from the weight and the input shape, and grad-bias as the
    sum of the output gradient over batch and spatial dims (when the bias trains).
    """

    def __init__(self, m: nn.Module):
        super().__init__()
        self._init_geometry(m)
        self.weight = m.weight
        self.weight.requires_grad_(False)
        self.bias = m.bias

    @classmethod
    def from_module(cls, m: nn.Module) -> "FrozenConv":
        """Wrap ``m`` (sharing its weight/bias Parameters; the weight gets requires_grad=False)."""
        return cls(m)

    def forward(self, x: Tensor) -> Tensor:
        if self.weight.requires_grad:
            raise RuntimeError("FrozenConv: weight.requires_grad was switched back on")
        xb, unbatched = self._batched(x)
        y = _FrozenConvFn.apply(xb, self.bias, self.weight, self)
        return y.squeeze(0) if unbatched else y


# ----------------------------------------------------------------------------- FrozenLinear
class _FrozenLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, bias: Optional[Tensor], weight: Tensor) -> Tensor:
        ctx.weight = weight
        ctx.versions = _versions(weight)
        return F.linear(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor):
        _check_versions(ctx, ctx.weight)
        gi = grad_out @ ctx.weight if ctx.needs_input_grad[0] else None
        gb = None
        if ctx.needs_input_grad[1]:
            gb = grad_out.reshape(-1, grad_out.shape[-1]).sum(0)
        return gi, gb, None


class FrozenLinear(nn.Module):
    """nn.Linear with a frozen weight. Saves nothing (0 bytes).

    grad-input = grad_out @ W; grad-bias = grad_out summed over all leading dims.
    """

    def __init__(self, m: nn.Linear):
        super().__init__()
        if not isinstance(m, nn.Linear):
            raise NotImplementedError(f"{type(m).__name__}: FrozenLinear wraps nn.Linear")
        self.in_features, self.out_features = m.in_features, m.out_features
        self.weight = m.weight
        self.weight.requires_grad_(False)
        self.bias = m.bias

    @classmethod
    def from_module(cls, m: nn.Linear) -> "FrozenLinear":
        """Wrap ``m`` (sharing its Parameters; the weight gets requires_grad=False)."""
        return cls(m)

    def forward(self, x: Tensor) -> Tensor:
        if self.weight.requires_grad:
            raise RuntimeError("FrozenLinear: weight.requires_grad was switched back on")
        return _FrozenLinearFn.apply(x, self.bias, self.weight)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


# ----------------------------------------------------------------------------- SubChannelConv
def select_channels(weight: Tensor, groups: int, ratio: float, rule: str = "magnitude+",
                    seed: int = 0) -> Tensor:
    """Sorted int64 indices of the ``n = max(1, int(C_in * ratio))`` channels to update.

    For a plain conv (groups == 1) these are input channels, ranked by the L2 norm of
    ``weight[:, c]`` over (out, *kernel). For a depthwise conv (groups == C_in) they are the
    channels/groups, ranked by the norm of the filters of that group. Rules (tiny-training's
    ``weight_select_criteria``): ``magnitude+`` largest norms, ``magnitude-`` smallest,
    ``random`` a seeded random subset. Ties go to the lower index.
    """
    if not 0.0 < ratio <= 1.0:
        raise BadOption(f"sub-channel ratio {ratio} is not in (0, 1]")
    if rule not in SELECTION_RULES:
        raise BadOption(f"unknown channel selection rule {rule!r}",
                        f"use one of {', '.join(SELECTION_RULES)}")
    c_in = weight.shape[1] * groups
    if groups == 1:
        per_channel = weight.detach().transpose(0, 1).reshape(c_in, -1)
    elif weight.shape[1] == 1:  # depthwise: groups == C_in
        per_channel = weight.detach().reshape(c_in, -1)
    else:
        raise NotImplementedError("sub-channel update supports groups == 1 or depthwise convs")
    n = max(1, int(c_in * ratio))
    if rule == "random":
        gen = torch.Generator().manual_seed(seed)
        chosen = torch.randperm(c_in, generator=gen)[:n]
    else:
        norms = torch.linalg.vector_norm(per_channel.double(), dim=1).cpu()
        chosen = torch.argsort(norms, descending=(rule == "magnitude+"), stable=True)[:n]
    return chosen.sort().values.to(weight.device)


class _SubChannelConvFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight_sel: Tensor, bias: Optional[Tensor],
                mod: "SubChannelConv") -> Tensor:
        _store_geometry(ctx, mod, x)
        ctx.mod, ctx.weight_sel = mod, weight_sel
        ctx.versions = _versions(mod.weight, weight_sel, mod.idx)
        if ctx.needs_input_grad[1]:
            # only the selected input channels are kept (no copy when all are selected)
            ctx.save_for_backward(x if mod.all_selected else x.index_select(1, mod.idx))
        return mod._conv(x, mod.merged_weight(), bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor):
        mod = ctx.mod
        _check_versions(ctx, mod.weight, ctx.weight_sel, mod.idx)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        gi, gb = _conv_input_bias_grads(ctx, grad_out, mod.merged_weight(), need_x, need_b)
        gw = None
        if need_w:
            (x_sel,) = ctx.saved_tensors
            if mod.groups == 1:  # weight_sel = W[:, idx]: a dense conv over the n channels
                dy, groups = grad_out, 1
            else:  # depthwise: weight_sel = W[rows], one group per selected channel
                dy, groups = grad_out.index_select(1, mod.rows), mod.idx.numel()
            gw = torch.ops.aten.convolution_backward(
                dy, x_sel, ctx.weight_sel, None, ctx.stride, ctx.padding, ctx.dilation, False,
                [0] * len(ctx.stride), groups, [False, True, False])[1]
        return gi, gw, gb, None


class SubChannelConv(_ConvGeometry):
    """Sub-channel weight update of the 256KB paper (Lin et al., NeurIPS 2022).

    Only ``n = max(1, int(C_in * ratio))`` input channels of the weight train:
    ``weight_sel = W[:, idx]`` (shape ``C_out x n x k...``) for a plain conv; for a depthwise
    conv (groups == C_in) the n selected channels' filters, ``weight_sel = W[rows]`` with
    ``rows`` = the output channels of the selected groups (the paper's n x k^2 copy).
    ``weight`` is the original Parameter, frozen (requires_grad False): its entries outside
    the selection never change; inside it they are stale until :meth:`write_back`.

    Saves: the selected input channels ``x[:, idx]``, B x n x spatial x itemsize bytes
    (nothing when ``weight_sel`` does not require grad). grad-input uses the merged weight;
    grad-bias is computed when the bias trains.
    """

    def __init__(self, m: nn.Module, ratio: float, rule: str = "magnitude+", seed: int = 0):
        super().__init__()
        self._init_geometry(m)
        if self.groups not in (1, self.in_channels):
            raise NotImplementedError("sub-channel update supports groups == 1 or depthwise convs")
        self.ratio, self.rule = ratio, rule
        self.weight = m.weight
        self.weight.requires_grad_(False)
        self.bias = m.bias
        idx = select_channels(m.weight, self.groups, ratio, rule, seed)
        self.register_buffer("idx", idx)
        self.all_selected: bool = idx.numel() == self.in_channels
        with torch.no_grad():
            sel = m.weight.index_select(*self._sel_dim_index()).clone()
        self.weight_sel = nn.Parameter(sel)

    @classmethod
    def from_module(cls, m: nn.Module, ratio: float, rule: str = "magnitude+",
                    seed: int = 0) -> "SubChannelConv":
        """Wrap ``m``: shares its weight (frozen) and bias; ``weight_sel`` is a new Parameter."""
        return cls(m, ratio, rule, seed)

    @property
    def rows(self) -> Tensor:
        """Depthwise only: the weight rows (output channels) of the selected channels."""
        per_group = self.out_channels // self.groups  # the depthwise multiplier
        offsets = torch.arange(per_group, device=self.idx.device)
        return (self.idx[:, None] * per_group + offsets).reshape(-1)

    def _sel_dim_index(self) -> tuple[int, Tensor]:
        return (1, self.idx) if self.groups == 1 else (0, self.rows)

    def merged_weight(self) -> Tensor:
        """The full weight with ``weight_sel`` in its slots (a new tensor, no autograd)."""
        with torch.no_grad():
            return self.weight.index_copy(*self._sel_dim_index(), self.weight_sel)

    @torch.no_grad()
    def write_back(self) -> None:
        """Copy ``weight_sel`` into the shared ``weight`` Parameter in place."""
        self.weight.index_copy_(*self._sel_dim_index(), self.weight_sel)

    def forward(self, x: Tensor) -> Tensor:
        if self.weight.requires_grad:
            raise RuntimeError("SubChannelConv: weight.requires_grad was switched back on")
        xb, unbatched = self._batched(x)
        y = _SubChannelConvFn.apply(xb, self.weight_sel, self.bias, self)
        return y.squeeze(0) if unbatched else y

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, ratio={self.ratio}, rule={self.rule!r}, n={self.idx.numel()}"


# ----------------------------------------------------------------------------- ShiftOnlyNorm
class _ShiftNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, bias: Optional[Tensor], mod: "ShiftOnlyNorm") -> Tensor:
        ctx.mod = mod
        ctx.versions = _versions(mod.weight, mod.running_var)
        # PyTorch's own eval-mode kernel: y = x * s + (beta - mean * s), bit-identical to nn.BatchNorm
        return F.batch_norm(x, mod.running_mean, mod.running_var, mod.weight, bias, False, 0.0, mod.eps)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor):
        mod = ctx.mod
        _check_versions(ctx, mod.weight, mod.running_var)
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

    def __init__(self, m: nn.modules.batchnorm._BatchNorm):
        super().__init__()
        if not isinstance(m, nn.modules.batchnorm._BatchNorm) or m.running_mean is None:
            raise NotImplementedError("ShiftOnlyNorm wraps a BatchNorm with running statistics")
        self.num_features, self.eps = m.num_features, m.eps
        self.weight = m.weight
        if self.weight is not None:
            self.weight.requires_grad_(False)
        self.bias = m.bias
        self.register_buffer("running_mean", m.running_mean)
        self.register_buffer("running_var", m.running_var)
        self.register_buffer("num_batches_tracked", m.num_batches_tracked)

    @classmethod
    def from_module(cls, m: nn.modules.batchnorm._BatchNorm) -> "ShiftOnlyNorm":
        """Wrap ``m`` sharing its Parameters and buffers; the scale gets requires_grad=False."""
        return cls(m)

    @torch.no_grad()
    def invstd(self) -> Tensor:
        """``1 / sqrt(running_var + eps)``, computed in float64 (C floats)."""
        return 1.0 / torch.sqrt(self.running_var.double() + self.eps)

    @torch.no_grad()
    def scale_shift(self) -> tuple[Tensor, Tensor]:
        """Per-channel ``s = gamma * invstd`` and ``beta - mean * s`` (shape ``C``)."""
        s = self.invstd().to(self.running_var.dtype)
        if self.weight is not None:
            s = self.weight * s
        shift = -self.running_mean * s if self.bias is None else self.bias - self.running_mean * s
        return s, shift

    def forward(self, x: Tensor) -> Tensor:
        if self.weight is not None and self.weight.requires_grad:
            raise RuntimeError("ShiftOnlyNorm: weight.requires_grad was switched back on")
        return _ShiftNormFn.apply(x, self.bias, self)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}"


# ----------------------------------------------------------------------------- 1-bit activations
class _MaskActFn(torch.autograd.Function):
    """y = fn(x); saves a bit-packed mask; backward = dy where mask else (dy * slope)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, mod: "_MaskedActivation") -> Tensor:
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

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    @classmethod
    def from_module(cls, m: nn.ReLU) -> "MaskedReLU":
        return cls(inplace=m.inplace)

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

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
        super().__init__()
        self.min_val, self.max_val, self.inplace = float(min_val), float(max_val), inplace

    @classmethod
    def from_module(cls, m: nn.Hardtanh) -> "MaskedHardtanh":
        return cls(m.min_val, m.max_val, m.inplace)

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
    def from_module(cls, m: nn.Hardtanh) -> "MaskedHardtanh":
        """nn.ReLU6 -> MaskedReLU6; any other nn.Hardtanh -> MaskedHardtanh."""
        if (m.min_val, m.max_val) == (0.0, 6.0):
            return cls(m.inplace)
        return MaskedHardtanh.from_module(m)


class MaskedLeakyReLU(_MaskedActivation):
    """LeakyReLU; gradient is dy where x > 0, dy * negative_slope elsewhere (NaN included)."""

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False):
        super().__init__()
        self.negative_slope, self.inplace = float(negative_slope), inplace
        self.off_slope = self.negative_slope

    @classmethod
    def from_module(cls, m: nn.LeakyReLU) -> "MaskedLeakyReLU":
        return cls(m.negative_slope, m.inplace)

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

    def __init__(self, inplace: bool = False, threshold: float = 0.0):
        super().__init__()
        self.inplace, self.threshold = inplace, float(threshold)

    @classmethod
    def from_module(cls, m: nn.Hardswish, threshold: float = 0.0) -> "SignHardswish":
        return cls(m.inplace, threshold)

    def fn(self, x: Tensor) -> Tensor:
        return F.hardswish(x, self.inplace)

    def grad_mask(self, x: Tensor) -> Tensor:
        return x > self.threshold

    def extra_repr(self) -> str:
        return f"threshold={self.threshold}" + (", inplace=True" if self.inplace else "")


# ----------------------------------------------------------------------------- dropout
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

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 < p < 1.0:
            raise NotImplementedError(f"MaskedDropout needs 0 < p < 1, got p={p}")
        self.p = float(p)

    @classmethod
    def from_module(cls, m: nn.Dropout) -> "MaskedDropout":
        if type(m) is not nn.Dropout or m.inplace:
            raise NotImplementedError(f"MaskedDropout wraps an out-of-place nn.Dropout, not {m!r}")
        return cls(m.p)

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
    def forward(ctx: Any, x: Tensor, mod: "LeanAvgPool2d") -> Tensor:
        ctx.input_shape, ctx.mod = x.shape, mod
        return F.avg_pool2d(x, mod.kernel_size, mod.stride, mod.padding, mod.ceil_mode,
                            mod.count_include_pad, mod.divisor_override)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor):
        m = ctx.mod
        shape_only = grad_out.new_empty(1).expand(ctx.input_shape)
        gi = torch.ops.aten.avg_pool2d_backward(
            grad_out, shape_only, _pair(m.kernel_size), _pair(m.stride), _pair(m.padding), m.ceil_mode,
            m.count_include_pad, m.divisor_override)
        return gi, None


class LeanAvgPool2d(nn.AvgPool2d):
    """nn.AvgPool2d that saves nothing (0 bytes): its backward needs only the input shape.
    Same forward (PyTorch's kernel) and the same grad-input kernel as PyTorch."""

    @classmethod
    def from_module(cls, m: nn.AvgPool2d) -> "LeanAvgPool2d":
        return cls(m.kernel_size, m.stride, m.padding, m.ceil_mode, m.count_include_pad, m.divisor_override)

    def forward(self, x: Tensor) -> Tensor:
        if not (torch.is_grad_enabled() and x.requires_grad):
            return super().forward(x)
        return _AvgPoolFn.apply(x, self)
