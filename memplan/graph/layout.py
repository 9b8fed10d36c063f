"""Eager CPU memory layouts for meta-device shape propagation.

Whether a later reshape (linear / matmul on >2-dim inputs) is a view or a copy depends on
strides, so the meta run must lay tensors out as eager CPU does. This module holds the rules:
the outputs the capture computes itself (shortcuts past slow Python meta kernels) and the
corrections where meta kernels differ from CPU. :class:`~memplan.graph.meta_runner._MetaRunner`
applies them while it runs a traced model on meta tensors; the recorder uses the same shortcuts.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import sdpa_output
from .conv import conv_padding
from .kinds import ACTIVATIONS, NORM_KINDS, module_kind, with_trait

# Layouts. Whether a later reshape (linear / matmul on >2-dim inputs) is a view or a copy
# depends on strides, so the meta run must lay tensors out as eager CPU does. Some meta kernels
# (and the shortcuts below) differ; these rules correct them, one per op kind, each checked
# against eager strides by tests/test_fuzz.py.

#: TensorIterator ops (their output layout follows _elementwise_output): the kinds of that trait
ELEMENTWISE = with_trait("elementwise")
#: exceptions: hardtanh / ReLU6 allocate ``empty_like(input)`` (the input's strides), feature
#: dropout multiplies by a broadcast mask (its meta kernel lays the output out as CPU does)
LIKE_INPUT_MODULES = (nn.Hardtanh,)  # ReLU6 too
LIKE_INPUT_FUNCTIONS = (F.hardtanh, F.relu6)
META_LAYOUT_MODULES = (nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)
#: adaptive pooling modules -> spatial dims
ADAPTIVE_POOL_DIMS = {
    nn.AdaptiveAvgPool1d: 1,
    nn.AdaptiveMaxPool1d: 1,
    nn.AdaptiveAvgPool2d: 2,
    nn.AdaptiveMaxPool2d: 2,
    nn.AdaptiveAvgPool3d: 3,
    nn.AdaptiveMaxPool3d: 3,
}
#: out-of-place binary arithmetic whose meta kernels are Python references (their first call
#: imports torch._dynamo, about a second of a cold start): see ``_binary_output``
BINARY_FUNCTIONS = frozenset(
    {operator.add, operator.sub, operator.mul, operator.truediv, torch.add, torch.sub, torch.mul, torch.div}
)


def _channels_last(t: torch.Tensor) -> bool:
    """Whether ``t.suggest_memory_format()`` is channels-last: c10's stride-order test for a
    4-dim tensor (C, W, H, N from the fastest; ambiguous size-1 cases count as contiguous)."""
    if t.dim() != 4 or t.stride(1) == 0:
        return False
    low = 0
    for d in (1, 3, 2, 0):
        size, stride = t.shape[d], t.stride(d)
        if size == 0 or stride < low or (d == 0 and low == t.stride(1)):
            return False
        low = stride * size if size > 1 else stride
    return True


def _empty(shape: Sequence[int], like: torch.Tensor, channels_last: bool) -> torch.Tensor:
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty(tuple(shape), dtype=like.dtype, device="meta", memory_format=fmt)


def _norm_output(x: torch.Tensor, kind: str) -> torch.Tensor:
    """A norm's output without running its meta kernel (BatchNorm's would import
    torch._dynamo, about a second on first use): group norm takes the input's suggested memory
    format; batch norm is channels-last for a channels-last input that is not also contiguous;
    layer norm is contiguous."""
    if kind == "groupnorm":
        return _empty(x.shape, x, _channels_last(x))
    last = kind == "batchnorm" and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    return _empty(x.shape, x, last)


def mean_output(args: Sequence[Any], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """``x.mean(dim, keepdim)`` of a floating tensor: a new contiguous tensor, whatever the input's
    layout (as on CPU), without its Python meta kernel (which imports torch._dynamo: seconds of a
    cold start); None for any other form of the call."""
    x = args[0] if args else kwargs.get("input")
    if (
        not isinstance(x, torch.Tensor)
        or not x.is_floating_point()
        or len(args) > 3
        or set(kwargs) - {"dim", "keepdim"}
    ):
        return None
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    dims = tuple(range(x.dim())) if dim is None else (dim,) if isinstance(dim, int) else tuple(dim)
    if (
        not dims
        or not isinstance(keepdim, bool)
        or not all(isinstance(d, int) and -x.dim() <= d < x.dim() for d in dims)
    ):
        return None
    dims = tuple(d % x.dim() for d in dims)
    shape = [1 if i in dims else s for i, s in enumerate(x.shape) if keepdim or i not in dims]
    return torch.empty(shape, dtype=x.dtype, device="meta")


def _fast_elementwise(out_shape: Sequence[int], ts: list[torch.Tensor]) -> torch.Tensor | None:
    """TensorIterator's fast path: same-shaped inputs that are all contiguous (or all
    channels-last) give a new output with the standard strides of that format; None otherwise."""
    if not ts or any(t.shape != tuple(out_shape) for t in ts):
        return None
    for last, fmt in ((False, torch.contiguous_format), (True, torch.channels_last)):
        if all(t.is_contiguous(memory_format=fmt) for t in ts):
            return _empty(out_shape, ts[0], last)
    return None


def _elementwise_output(out: torch.Tensor, inputs: list[Any]) -> torch.Tensor:
    """A TensorIterator op's meta output, laid out as on CPU: some meta kernels keep the
    input's strides where the fast path gives standard ones (they differ at size-1 dims)."""
    ts = [t for t in inputs if isinstance(t, torch.Tensor)]
    if any(t.untyped_storage()._cdata == out.untyped_storage()._cdata for t in ts):
        return out  # in place
    std = _fast_elementwise(out.shape, ts)
    return out if std is None or std.stride() == out.stride() else std


def _binary_output(args: Sequence[Any], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """Output of ``a op b`` without the meta kernel, for float tensors of one dtype (or a float
    tensor and a Python number): same shapes through TensorIterator's fast path; a contiguous
    (N, C, 1, 1)-like operand broadcast over a 4-dim one (a squeeze-and-excitation gate) takes
    the full operand's layout when that is contiguous or channels-last. None otherwise."""
    if kwargs or len(args) != 2:
        return None
    ts = [a for a in args if isinstance(a, torch.Tensor)]
    if not ts or any(not isinstance(a, (torch.Tensor, int, float)) or isinstance(a, bool) for a in args):
        return None
    if any(t.dtype != ts[0].dtype for t in ts) or not ts[0].is_floating_point():
        return None
    if len(ts) == 1 or ts[0].shape == ts[1].shape:
        return _fast_elementwise(ts[0].shape, ts)
    full, gate = sorted(ts, key=lambda t: t.numel(), reverse=True)
    if (
        full.dim() != 4
        or gate.dim() != 4
        or tuple(gate.shape[2:]) != (1, 1)
        or not gate.is_contiguous()
        or any(g not in (1, f) for g, f in zip(gate.shape[:2], full.shape[:2]))
    ):
        return None
    return _fast_elementwise(full.shape, [full])


def _adaptive_pool_output(pool: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """An adaptive pooling module's output without its meta kernel (a Python reference that
    imports torch._dynamo): CPU allocates it in the input's suggested memory format."""
    dims = next((d for cls, d in ADAPTIVE_POOL_DIMS.items() if isinstance(pool, cls)), None)
    if dims is None or getattr(pool, "return_indices", False) or x.dim() != dims + 2:
        return None
    size = pool.output_size if isinstance(pool.output_size, tuple) else (pool.output_size,) * dims
    shape = (*x.shape[:2], *(x.shape[2 + i] if s is None else s for i, s in enumerate(size)))
    return _empty(shape, x, _channels_last(x))


def _avg_pool_output(pool: nn.AvgPool2d, x: torch.Tensor) -> torch.Tensor | None:
    """``nn.AvgPool2d`` (floor mode) of a 4-dim input without the meta kernel (whose shape checks
    import sympy): CPU allocates the output in the input's suggested memory format."""
    pairs = [v if isinstance(v, (tuple, list)) else (v, v) for v in (pool.kernel_size, pool.stride, pool.padding)]
    if x.dim() != 4 or pool.ceil_mode or any(len(p) != 2 for p in pairs):
        return None
    (kh, kw), (sh, sw), (ph, pw) = pairs
    out = [(size + 2 * p - k) // s + 1 for size, k, s, p in ((x.shape[2], kh, sh, ph), (x.shape[3], kw, sw, pw))]
    if min(out) < 1 or 2 * ph > kh or 2 * pw > kw:
        return None
    return _empty((*x.shape[:2], *out), x, _channels_last(x))


def _interpolate_output(args: Sequence[Any], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """``F.interpolate(x, size=...)`` of a 4-dim ``x`` (bilinear / nearest) without the meta kernel:
    CPU allocates the output in the input's suggested memory format. None for other calls."""
    names = ("input", "size", "scale_factor", "mode", "align_corners", "recompute_scale_factor", "antialias")
    call = {**dict(zip(names, args)), **kwargs}
    x, size = call.get("input"), call.get("size")
    if (
        not isinstance(x, torch.Tensor)
        or x.dim() != 4
        or call.get("scale_factor") is not None
        or call.get("mode", "nearest") not in ("nearest", "bilinear")
        or call.get("antialias")
    ):
        return None
    size = tuple(size) if isinstance(size, (tuple, list, torch.Size)) else (size, size)
    if len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size):
        return None
    return _empty((*x.shape[:2], *size), x, _channels_last(x))


def _batch_norm_output(args: Sequence[Any], kwargs: dict[str, Any]) -> torch.Tensor | None:
    x = args[0] if args else kwargs.get("input")
    return _norm_output(x, "batchnorm") if isinstance(x, torch.Tensor) else None


#: calls whose output the capture lays out itself, as on CPU (both capture paths: the meta
#: runner and the recorder): their meta kernels are Python references, slow, and the first one
#: in a process imports torch._dynamo. Each returns None where it does not apply.
FUNCTION_OUTPUTS: dict[Any, Callable[[Sequence[Any], dict[str, Any]], torch.Tensor | None]] = {
    **{f: _binary_output for f in BINARY_FUNCTIONS},
    F.interpolate: _interpolate_output,
    torch.mean: mean_output,
    torch.Tensor.mean: mean_output,
    F.batch_norm: _batch_norm_output,
    torch.batch_norm: _batch_norm_output,
    F.scaled_dot_product_attention: sdpa_output,  # the meta kernel is the math one; CPU may run flash
}


def function_output(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The output of ``func(*args, **kwargs)`` laid out by :data:`FUNCTION_OUTPUTS` (None: run the kernel)."""
    shortcut = FUNCTION_OUTPUTS.get(func)
    return None if shortcut is None else shortcut(args, kwargs)


def _module_output(mod: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """The output of a one-input module computed without its meta kernel (torch's Python meta
    kernels import torch._dynamo / sympy on first use: about a second of every cold start), laid
    out as on CPU; None where no shortcut applies (the meta kernel runs)."""
    kind = module_kind(mod)
    if kind in NORM_KINDS:
        return _norm_output(x, kind)
    if kind in ACTIVATIONS:
        # in place, the input itself; else TensorIterator's fast path (run_node corrects the exceptions)
        return x if getattr(mod, "inplace", False) else _fast_elementwise(x.shape, [x])
    if type(mod) is nn.Dropout and mod.training and not mod.inplace and 0 < mod.p < 1:
        return _fast_elementwise(x.shape, [x])  # input * mask: a new tensor
    if type(mod) is nn.AvgPool2d:
        return _avg_pool_output(mod, x)
    if kind in ("adaptive_avgpool", "adaptive_maxpool"):
        return _adaptive_pool_output(mod, x)
    if type(mod) is nn.Linear and x.dim() == 2 and x.shape[1] == mod.in_features and x.dtype == mod.weight.dtype:
        return _empty((x.shape[0], mod.out_features), x, False)  # addmm: a new contiguous matrix
    if type(mod) in (nn.Conv1d, nn.Conv2d):
        shape = _conv_shape(mod, x.shape)
        if shape is not None:
            # channels-last output when the (padded) input or the weight suggests it, as on CPU;
            # circular padding builds a contiguous padded input
            last = _channels_last(x) and mod.padding_mode != "circular"
            return _empty(shape, x, last or _channels_last(mod.weight))
    return None


def _like_input(x: torch.Tensor) -> torch.Tensor:
    """``empty_like(x)``: ``x``'s strides when it is non-overlapping and dense, else contiguous."""
    dims = sorted((st, s) for s, st in zip(x.shape, x.stride()) if s != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return _empty(x.shape, x, False)
        expected *= size
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")


def _suggested_output(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Ops whose CPU kernels allocate the output in the input's suggested memory format
    (interpolation, reflect / replicate padding; their meta kernels do not always)."""
    return _empty(out.shape, out, True) if _channels_last(x) else out


def _conv_shape(conv: nn.Module, x: torch.Size) -> tuple[int, ...] | None:
    """Output shape of a conv (integer, "valid" or "same" padding); None when not that
    simple (or invalid)."""
    if len(x) != conv.weight.dim():
        return None
    spatial = []
    for size, (before, after), k, s, d in zip(
        x[2:], conv_padding(conv.padding, conv.kernel_size, conv.dilation), conv.kernel_size, conv.stride, conv.dilation
    ):
        out = (size + before + after - d * (k - 1) - 1) // s + 1
        if out < 1 or (conv.padding_mode in ("reflect", "circular") and before >= size):
            return None
        spatial.append(out)
    if x[1] != conv.in_channels:
        return None
    return (x[0], conv.out_channels, *spatial)


def flatten(obj: Any) -> list[Any]:
    """The leaves of nested lists / tuples / dicts, in order."""
    if isinstance(obj, (list, tuple)):
        return [y for x in obj for y in flatten(x)]
    if isinstance(obj, dict):
        return [y for x in obj.values() for y in flatten(x)]
    return [obj]
