"""Costing by observation: ops without a cost rule are run, alone, on meta tensors.

For a node that no rule covers (an unknown function, method or module, a custom autograd
Function, a script function, a stochastic op), its captured call is replayed on meta tensors of
the captured shapes and strides, with ``requires_grad`` set as the plan sets it, under
``torch.autograd.graph.saved_tensors_hooks`` (:class:`memplan.graph.saved.SavedObserver`): what the
hooks receive is exactly what eager
autograd keeps (for a custom Function, its ``ctx.save_for_backward``). Saved tensors that are the
node's inputs or output refer to those storages (shared with other ops, counted once); anything
else is private to the node. FLOPs come from ``FlopCounterMode`` on the same replay (conv /
matmul family only, the ``forward_flops`` convention; convolution backward group-aware), the
backward split into grad-input, grad-weight and grad-bias runs.

Meta kernels differ from CPU ones in two known ways: eval-mode batch norm returns C-sized
statistics on meta and empty ones on CPU (:class:`CpuLike` corrects it), and attention runs the
math kernel on meta where the CPU may run the flash one (:class:`CpuKernels` asks torch's CPU
choice and sends such a node to the CPU retry). A node that cannot run
on meta is retried on CPU tensors of the same shapes (zeros; at most ``CPU_RETRY_BYTES``); if it
cannot run at all it is reported with bounds (0 to its inputs + outputs), never as zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..graph import LayerGraph, TensorInfo, flatten, role
from ..graph.attention import MATH, SDPA_ARGS, cpu_backend, sdpa_call
from ..graph.composite import COMPOSITE_FUNCTIONS, composite_body
from ..graph.saved import SavedObserver, storage_key
from ..plan import OpView
from .records import Saved

#: largest input + output size (bytes) replayed on CPU when meta fails
CPU_RETRY_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Observed:
    """What one replay of a node saw. ``saved`` is None when the node could not run; then
    ``bounds`` gives (lowest, highest) plausible saved bytes and ``error`` says why."""

    saved: tuple[Saved, ...] | None
    forward_flops: int = 0
    grad_input_flops: int = 0
    grad_weight_flops: int = 0
    grad_bias_flops: int = 0
    device: str = "meta"
    error: str = ""
    bounds: tuple[int, int] = (0, 0)


class CpuLike(TorchDispatchMode):
    """Meta kernels as eager CPU runs them: eval-mode ``native_batch_norm`` returns empty
    save_mean / save_invstd (CPU) instead of C-sized ones (meta)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.native_batch_norm.default and not args[5] and args[0].is_meta:
            return out[0], out[1].new_empty((0,)), out[2].new_empty((0,))
        return out


class MetaKernelDiffers(RuntimeError):
    """A meta replay reached a call that eager CPU runs with another kernel."""


class CpuKernels(TorchFunctionMode):
    """Watches a meta replay for calls whose kernel, and so what autograd saves, differs on the
    CPU: an attention (``F.scaled_dot_product_attention``, also inside
    ``F.multi_head_attention_forward``) that CPU runs with the flash kernel where meta runs the
    math one raises :class:`MetaKernelDiffers` (the node is then replayed on the CPU)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in COMPOSITE_FUNCTIONS:
            with self:
                return composite_body(func)(*args, **kwargs)
        if func is torch.nn.functional.scaled_dot_product_attention:
            a = sdpa_call(args, kwargs)
            specs = [
                (tuple(t.shape), t.stride(), t.dtype, t.requires_grad) if isinstance(t, torch.Tensor) else None
                for t in (a[n] for n in SDPA_ARGS[:4])
            ]
            backend = cpu_backend(specs, a["dropout_p"], a["is_causal"], a["scale"], a["enable_gqa"])
            if backend != MATH:
                raise MetaKernelDiffers(f"attention runs the {backend} kernel on the CPU, the math one on meta")
        return func(*args, **kwargs)


def _tensor(info: TensorInfo, device: str, requires_grad: bool) -> torch.Tensor:
    make = torch.zeros if device == "cpu" else torch.empty
    base = make(max(1, _extent(info)), dtype=info.dtype, device=device)
    t = base.as_strided(info.shape, info.layout)
    if requires_grad and info.dtype.is_floating_point:
        t = t.detach().requires_grad_(True).clone()  # a non-leaf: in-place ops stay legal
    return t


def _extent(info: TensorInfo) -> int:
    strides = info.layout
    return 1 + sum((s - 1) * st for s, st in zip(info.shape, strides)) if all(info.shape) else 0


class Replay:
    """One node's call rebuilt on fresh tensors."""

    def __init__(self, op: OpView, device: str):
        node = op.node
        self.node, self.device = node, device
        fxn: fx.Node = node.fx
        self.inputs: list[torch.Tensor] = []
        by_fx: dict[fx.Node, torch.Tensor] = {}
        sources = node.fx_inputs
        for i, (info, req) in enumerate(zip(node.in_tensors, op.req_in)):
            t = _tensor(info, device, req)
            self.inputs.append(t)
            if i < len(sources):
                by_fx[sources[i]] = t
        self.consts: dict[fx.Node, Any] = node.fx_consts

        def value(a: fx.Node) -> Any:
            if a in by_fx:
                return by_fx[a]
            if a in self.consts:
                return self.consts[a]
            raise LookupError(f"argument {a.name} of {node.name} is not available for replay")

        self.args = fx.node.map_arg(fxn.args, value)
        self.kwargs = fx.node.map_arg(fxn.kwargs, value)
        self.params: dict[str, torch.Tensor] = {}
        if fxn.op == "call_module":
            trains = {"weight": op.train.weight > 0, "bias": op.train.bias}
            for pname, p in node.module.named_parameters():
                self.params[pname] = torch.empty_like(p, device=device).requires_grad_(trains[role(pname)])
            self.buffers = {
                k: torch.empty_like(b, device=device) if device == "meta" else torch.zeros_like(b, device=device)
                for k, b in node.module.named_buffers()
            }

    def run(self) -> Any:
        fxn = self.node.fx
        if fxn.op == "call_function":
            return fxn.target(*self.args, **self.kwargs)
        if fxn.op == "call_method":
            return getattr(self.args[0], fxn.target)(*self.args[1:], **self.kwargs)
        return torch.func.functional_call(self.node.module, {**self.params, **self.buffers}, self.args, self.kwargs)


def conv_backward_flops(  # the conv's geometry, one argument per dimension
    grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed, *args, out_shape=None, **kwargs
) -> int:
    """Group-aware FLOPs of ``aten.convolution_backward`` for ``FlopCounterMode(custom_mapping=...)``.

    torch 2.13's own formula over-counts the weight gradient of grouped / depthwise convs by
    the group factor. Here each requested gradient (``output_mask``) costs what the forward
    costs: 2 x out_numel x (C_in / groups) x kernel elements, computed from the shapes the
    autograd engine really passes.
    """
    from torch.utils.flop_counter import conv_flop_count  # heavy: only when counting

    output_mask = args[-1]
    fwd = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed=transposed)
    return fwd * int(bool(output_mask[0])) + fwd * int(bool(output_mask[1]))


def flash_cpu_flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of ``aten._scaled_dot_product_flash_attention_for_cpu`` (torch 2.13's FlopCounterMode
    has no formula for it and counts 0): torch's own SDPA formula, QK^T and PV."""
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(q_shape, k_shape, v_shape)


def flash_cpu_backward_flops(grad_shape, q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of its backward: torch's SDPA backward formula (5 matmuls: QK^T recomputed, dV, dP, dQ, dK)."""
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_shape, q_shape, k_shape, v_shape)


#: formulas FlopCounterMode lacks or gets wrong on the CPU
FLOP_FORMULAS = {
    torch.ops.aten.convolution_backward: conv_backward_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: flash_cpu_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: flash_cpu_backward_flops,
}


def flop_counter():
    """``FlopCounterMode`` with the group-aware convolution backward and the CPU flash attention kernels."""
    from torch.utils.flop_counter import FlopCounterMode  # heavy: only when counting

    return FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS)


def _replay(op: OpView, device: str) -> Observed:
    rp = Replay(op, device)
    counter = flop_counter()
    own = [*rp.params.values(), *getattr(rp, "buffers", {}).values()]
    with torch.enable_grad(), SavedObserver(exclude=own) as seen, CpuLike(), counter:
        if device == "meta":
            with CpuKernels():
                out = rp.run()
        else:
            out = rp.run()
    forward = counter.get_total_flops()
    outs = [t for t in flatten(out) if isinstance(t, torch.Tensor)]
    node, graph = op.node, op.graph
    known: dict[int, int] = {}
    for t, info in zip(rp.inputs, node.in_tensors):
        known.setdefault(storage_key(t), info.storage)
    for t, info in zip(outs, node.outs):
        known.setdefault(storage_key(t), info.storage)
    saved: list[Saved] = []
    for r in seen.records:
        if r.key in known:
            sid = known[r.key]
            saved.append(Saved(graph.storages[sid], sid, "observed"))
        else:
            saved.append(Saved(r.nbytes, None, f"observed {r.shape}"))
    flops = {"input": 0, "weight": 0, "bias": 0}
    roots = [t for t in outs if t.requires_grad and t.grad_fn is not None]
    if roots:
        wrt = {
            "input": [t for t in rp.inputs if t.requires_grad],
            "weight": [p for n, p in rp.params.items() if p.requires_grad and role(n) == "weight"],
            "bias": [p for n, p in rp.params.items() if p.requires_grad and role(n) == "bias"],
        }
        grads = [torch.ones_like(t) if device == "cpu" else torch.empty_like(t) for t in roots]
        for key, tensors in wrt.items():
            if tensors:
                counter = flop_counter()
                with counter:
                    torch.autograd.grad(roots, tensors, grads, retain_graph=True, allow_unused=True)
                flops[key] = counter.get_total_flops()
    return Observed(tuple(saved), forward, flops["input"], flops["weight"], flops["bias"], device)


def observe(op: OpView) -> Observed:
    """Replay ``op``'s node under its plan's ``requires_grad`` flags (cached per graph)."""
    graph: LayerGraph = op.graph
    key = (op.node.index, op.req_in, op.train.weight > 0, op.train.bias)
    cache = graph.observed
    if key in cache:
        return cache[key]
    if op.node.fx is None:
        result = _unbounded(op, "nothing to replay")
    else:
        try:
            result = _replay(op, "meta")
        except Exception as exc:  # any failure of user code: retry, then bound
            size = sum(t.nbytes for t in op.node.in_tensors) + sum(t.nbytes for t in op.node.outs)
            result = _unbounded(op, f"{type(exc).__name__}: {exc}")
            if size <= CPU_RETRY_BYTES:
                try:
                    result = _replay(op, "cpu")
                except Exception:
                    pass
    cache[key] = result
    return result


def _unbounded(op: OpView, error: str) -> Observed:
    hi = sum(
        {
            t.storage: t.nbytes
            for t in [*op.node.in_tensors, *op.node.outs]
            if t.storage not in op.graph.param_storages
        }.values()
    )
    return Observed(None, error=" ".join(error.split())[:200], bounds=(0, hi))
