"""Lean convs and linears: ``FrozenConv`` / ``FrozenLinear`` keep nothing for backward,
``SubChannelConv`` keeps only the selected input channels (the 256KB paper's sub-channel update),
chosen by :func:`select_channels` from the weight or given explicitly (:func:`top_channels` of an
importance estimate)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from ...errors import BadOption
from ...graph import EXPLICIT_SELECT, SELECT_RULES, channel_index_problem, conv_padding, sub_channels
from ...names import DEFAULT_SELECT
from .checks import check_frozen, check_versions, share_frozen, versions
from .restore import remember


def _conv_padding(m: nn.Module) -> tuple[int, ...]:
    """Integer padding of a Conv1d/2d module (zeros mode only, 'same' only if symmetric)."""
    if m.padding_mode != "zeros":
        raise NotImplementedError(f"padding_mode={m.padding_mode!r}: only 'zeros' is supported")
    pads = conv_padding(m.padding, m.kernel_size, m.dilation)
    if any(before != after for before, after in pads):
        raise NotImplementedError("padding='same' with asymmetric padding is not supported")
    return tuple(before for before, _ in pads)


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

    def _conv(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        fn = F.conv1d if self.nd == 1 else F.conv2d
        return fn(x, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def _batched(self, x: Tensor) -> tuple[Tensor, bool]:
        unbatched = x.dim() == self.nd + 1
        return (x.unsqueeze(0) if unbatched else x), unbatched

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
            f"groups={self.groups}"
        )


def _conv_input_bias_grads(
    ctx: Any, grad_out: Tensor, weight: Tensor, need_input: bool, need_bias: bool
) -> tuple[Tensor | None, Tensor | None]:
    """grad-input (needs only the input *shape* and the weight) and grad-bias of a conv."""
    if not (need_input or need_bias):
        return None, None
    shape_only = grad_out.new_empty(1).expand(ctx.input_shape)
    gi, _, gb = torch.ops.aten.convolution_backward(
        grad_out,
        shape_only,
        weight,
        [weight.shape[0]] if need_bias else None,
        ctx.stride,
        ctx.padding,
        ctx.dilation,
        False,
        [0] * len(ctx.stride),
        ctx.groups,
        [need_input, False, need_bias],
    )
    return gi, gb


def _store_geometry(ctx: Any, mod: _ConvGeometry, x: Tensor) -> None:
    ctx.input_shape = x.shape
    ctx.stride, ctx.padding = mod.stride, mod.padding
    ctx.dilation, ctx.groups = mod.dilation, mod.groups


# ----------------------------------------------------------------------------- FrozenConv
class _FrozenConvFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, bias: Tensor | None, weight: Tensor, mod: FrozenConv) -> Tensor:
        _store_geometry(ctx, mod, x)
        ctx.weight = weight  # a parameter reference, not an activation
        ctx.versions = versions(weight)
        return mod._conv(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor):
        check_versions(ctx, ctx.weight)
        gi, gb = _conv_input_bias_grads(ctx, grad_out, ctx.weight, ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        return gi, gb, None, None


class FrozenConv(_ConvGeometry):
    """Conv1d / Conv2d with a frozen weight. Saves nothing (0 bytes).

    Backward computes grad-input from the weight and the input shape, and grad-bias as the
    sum of the output gradient over batch and spatial dims (when the bias trains).
    """

    memplan_kind = "conv"

    def __init__(self, m: nn.Module):
        super().__init__()
        self._init_geometry(m)
        share_frozen(self, m)

    @classmethod
    def from_module(cls, m: nn.Module) -> FrozenConv:
        """Wrap ``m`` (sharing its weight/bias Parameters; the weight gets requires_grad=False)."""
        return remember(cls(m), m)

    def forward(self, x: Tensor) -> Tensor:
        check_frozen(self)
        xb, unbatched = self._batched(x)
        y = _FrozenConvFn.apply(xb, self.bias, self.weight, self)
        return y.squeeze(0) if unbatched else y


# ----------------------------------------------------------------------------- FrozenLinear
class _FrozenLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, bias: Tensor | None, weight: Tensor) -> Tensor:
        ctx.weight = weight
        ctx.versions = versions(weight)
        return F.linear(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor):
        check_versions(ctx, ctx.weight)
        gi = grad_out @ ctx.weight if ctx.needs_input_grad[0] else None
        gb = None
        if ctx.needs_input_grad[1]:
            gb = grad_out.reshape(-1, grad_out.shape[-1]).sum(0)
        return gi, gb, None


class FrozenLinear(nn.Module):
    """nn.Linear with a frozen weight. Saves nothing (0 bytes).

    grad-input = grad_out @ W; grad-bias = grad_out summed over all leading dims.
    """

    memplan_kind = "linear"

    def __init__(self, m: nn.Linear):
        super().__init__()
        if not isinstance(m, nn.Linear):
            raise NotImplementedError(f"{type(m).__name__}: FrozenLinear wraps nn.Linear")
        self.in_features, self.out_features = m.in_features, m.out_features
        share_frozen(self, m)

    @classmethod
    def from_module(cls, m: nn.Linear) -> FrozenLinear:
        """Wrap ``m`` (sharing its Parameters; the weight gets requires_grad=False)."""
        return remember(cls(m), m)

    def forward(self, x: Tensor) -> Tensor:
        check_frozen(self)
        return _FrozenLinearFn.apply(x, self.bias, self.weight)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


# ----------------------------------------------------------------------------- SubChannelConv
def top_channels(importance: Tensor, ratio: float) -> list[int]:
    """The ``n = max(1, int(C * ratio))`` channels of largest ``importance`` (a vector of length C,
    one entry per input channel; per channel / group of a depthwise conv), ties to the lower
    index, sorted ascending: the ``channels`` of an ``importance`` weight update."""
    if not 0.0 < ratio <= 1.0:
        raise BadOption(f"sub-channel ratio {ratio} is not in (0, 1]")
    if importance.dim() != 1 or importance.numel() == 0:
        raise BadOption(
            f"importance must be a non-empty vector (one entry per channel), got shape {tuple(importance.shape)}"
        )
    scores = importance.detach().double().cpu()
    if not bool(torch.isfinite(scores).all()):
        raise BadOption("importance has NaN or infinite entries", "rank finite scores")
    n = sub_channels(scores.numel(), ratio)
    chosen = torch.argsort(scores, descending=True, stable=True)[:n]
    return sorted(int(c) for c in chosen)


def select_channels(weight: Tensor, groups: int, ratio: float, rule: str = DEFAULT_SELECT, seed: int = 0) -> Tensor:
    """Sorted int64 indices of the ``n = max(1, int(C_in * ratio))`` channels to update.

    For a plain conv (groups == 1) these are input channels, ranked by the L2 norm of
    ``weight[:, c]`` over (out, *kernel). For a depthwise conv (groups == C_in) they are the
    channels/groups, ranked by the norm of the filters of that group. Rules (tiny-training's
    ``weight_select_criteria``): ``magnitude+`` largest norms, ``magnitude-`` smallest,
    ``random`` a seeded random subset. Ties go to the lower index. ``importance`` names its
    channels explicitly (:func:`top_channels`; ``SubChannelConv(..., channels=...)``), so it is
    refused here.
    """
    if not 0.0 < ratio <= 1.0:
        raise BadOption(f"sub-channel ratio {ratio} is not in (0, 1]")
    if rule not in SELECT_RULES:
        raise BadOption(f"unknown channel selection rule {rule!r}", f"use one of {', '.join(SELECT_RULES)}")
    if rule == EXPLICIT_SELECT:
        raise BadOption(f"channel selection {rule!r} takes explicit channel indices", "pass channels=[...]")
    c_in = weight.shape[1] * groups
    if groups == 1:
        per_channel = weight.detach().transpose(0, 1).reshape(c_in, -1)
    elif weight.shape[1] == 1:  # depthwise: groups == C_in
        per_channel = weight.detach().reshape(c_in, -1)
    else:
        raise NotImplementedError("sub-channel update supports groups == 1 or depthwise convs")
    n = sub_channels(c_in, ratio)
    if rule == "random":
        gen = torch.Generator().manual_seed(seed)
        chosen = torch.randperm(c_in, generator=gen)[:n]
    else:
        norms = torch.linalg.vector_norm(per_channel.double(), dim=1).cpu()
        chosen = torch.argsort(norms, descending=(rule == "magnitude+"), stable=True)[:n]
    return chosen.sort().values.to(weight.device)


class _SubChannelConvFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight_sel: Tensor, bias: Tensor | None, mod: SubChannelConv) -> Tensor:
        _store_geometry(ctx, mod, x)
        ctx.mod, ctx.weight_sel = mod, weight_sel
        ctx.versions = versions(mod.weight, weight_sel, mod.idx)
        if ctx.needs_input_grad[1]:
            # only the selected input channels are kept (no copy when all are selected)
            ctx.save_for_backward(x if mod.all_selected else x.index_select(1, mod.idx))
        return mod._conv(x, mod.merged_weight(), bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor):
        mod = ctx.mod
        check_versions(ctx, mod.weight, ctx.weight_sel, mod.idx)
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
                dy,
                x_sel,
                ctx.weight_sel,
                None,
                ctx.stride,
                ctx.padding,
                ctx.dilation,
                False,
                [0] * len(ctx.stride),
                groups,
                [False, True, False],
            )[1]
        return gi, gw, gb, None


class SubChannelConv(_ConvGeometry):
    """Sub-channel weight update of the 256KB paper (Lin et al., NeurIPS 2022).

    Only ``n = max(1, int(C_in * ratio))`` input channels of the weight train, chosen by
    :func:`select_channels` under ``rule``, or with ``rule="importance"`` the sorted, unique
    ``channels`` given (exactly n of them, e.g. :func:`top_channels` of an importance estimate):
    ``weight_sel = W[:, idx]`` (shape ``C_out x n x k...``) for a plain conv; for a depthwise
    conv (groups == C_in) the n selected channels' filters, ``weight_sel = W[rows]`` with
    ``rows`` = the output channels of the selected groups (the paper's n x k^2 copy).
    ``weight`` is the original Parameter, frozen (requires_grad False): its entries outside
    the selection never change; inside it they are stale until :meth:`write_back`.

    ``state_dict()`` holds the plain conv's keys (``weight``, ``bias``), ``weight_sel`` folded into
    ``weight``; ``load_state_dict`` takes them (the selected slots of the loaded weight become
    ``weight_sel``), so checkpoints move freely between the plain and the applied model.

    Saves: the selected input channels ``x[:, idx]``, B x n x spatial x itemsize bytes
    (nothing when ``weight_sel`` does not require grad). grad-input uses the merged weight;
    grad-bias is computed when the bias trains.
    """

    memplan_kind = "conv"

    def __init__(
        self,
        m: nn.Module,
        ratio: float,
        rule: str = DEFAULT_SELECT,
        seed: int = 0,
        channels: Sequence[int] | None = None,
    ):
        super().__init__()
        self._init_geometry(m)
        if self.groups not in (1, self.in_channels):
            raise NotImplementedError("sub-channel update supports groups == 1 or depthwise convs")
        self.ratio, self.rule = ratio, rule
        if (rule == EXPLICIT_SELECT) != (channels is not None):
            raise BadOption(f"explicit channels go with channel selection {EXPLICIT_SELECT!r} only (rule {rule!r})")
        if channels is None:
            idx = select_channels(m.weight, self.groups, ratio, rule, seed)
        else:
            listed = channels.tolist() if isinstance(channels, Tensor) else list(channels)
            problem = channel_index_problem(listed, self.in_channels, ratio)
            if problem is not None:
                raise BadOption(f"sub-channel update of a {self.in_channels}-channel conv: {problem}")
            idx = torch.tensor(listed, dtype=torch.int64, device=m.weight.device)
        share_frozen(self, m)
        self.register_buffer("idx", idx, persistent=False)  # state_dict: the plain conv's keys
        self.all_selected: bool = idx.numel() == self.in_channels
        with torch.no_grad():
            sel = m.weight.index_select(*self._sel_dim_index()).clone()
        self.weight_sel = nn.Parameter(sel)

    @classmethod
    def from_module(
        cls,
        m: nn.Module,
        ratio: float,
        rule: str = DEFAULT_SELECT,
        seed: int = 0,
        channels: Sequence[int] | None = None,
    ) -> SubChannelConv:
        """Wrap ``m``: shares its weight (frozen) and bias; ``weight_sel`` is a new Parameter."""
        return remember(cls(m, ratio, rule, seed, channels), m)

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

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        """The plain conv's entries: ``weight`` is :meth:`merged_weight` (with ``keep_vars``, a
        Parameter that trains when ``weight_sel`` does), no ``weight_sel``."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination.pop(prefix + "weight_sel")
        merged = self.merged_weight()
        destination[prefix + "weight"] = nn.Parameter(merged, self.weight_sel.requires_grad) if keep_vars else merged

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        """A plain conv's entries: ``weight_sel`` is taken from the loaded ``weight``'s selected slots."""
        weight = state_dict.get(prefix + "weight")
        if prefix + "weight_sel" not in state_dict and weight is not None and weight.shape == self.weight.shape:
            dim, index = self._sel_dim_index()
            state_dict[prefix + "weight_sel"] = weight.index_select(dim, index.to(weight.device))
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(self, x: Tensor) -> Tensor:
        check_frozen(self)
        xb, unbatched = self._batched(x)
        y = _SubChannelConvFn.apply(xb, self.weight_sel, self.bias, self)
        return y.squeeze(0) if unbatched else y

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, ratio={self.ratio}, rule={self.rule!r}, n={self.idx.numel()}"
