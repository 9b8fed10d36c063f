"""The meta runner: a traced model run on meta tensors, its outputs laid out as eager CPU lays
them out (the rules of :mod:`.layout`); a node without a meta kernel runs on CPU zeros."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from .kinds import node_kind
from .layout import (
    ELEMENTWISE,
    LIKE_INPUT_FUNCTIONS,
    LIKE_INPUT_MODULES,
    META_LAYOUT_MODULES,
    _elementwise_output,
    _like_input,
    _module_output,
    _suggested_output,
    flatten,
    function_output,
)
from .readers import pad_mode

#: largest input (bytes) with which a node that fails on meta is run on CPU during capture
CPU_FALLBACK_BYTES = 256 * 2**20


class _MetaRunner(fx.Interpreter):
    """Runs a GraphModule on meta tensors, swapping in meta copies of real parameters."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm, garbage_collect_values=False)
        self._meta_cache: dict[str, dict[str, torch.Tensor]] = {}
        self.kinds = {n: node_kind(gm, n) for n in gm.graph.nodes}  # (kind, target, module) per node

    def call_module(self, target, args, kwargs):
        mod = self.fetch_attr(target)
        if len(args) == 1 and not kwargs and isinstance(args[0], torch.Tensor):
            out = _module_output(mod, args[0])
            if out is not None:
                return out
        state = dict(mod.named_parameters(recurse=True))
        state.update(mod.named_buffers(recurse=True))
        if all(t.device.type == "meta" for t in state.values()):
            return mod(*args, **kwargs)
        if target not in self._meta_cache:
            self._meta_cache[target] = {k: torch.empty_like(v, device="meta") for k, v in state.items()}
        return torch.func.functional_call(mod, self._meta_cache[target], args, kwargs)

    def call_function(self, target, args, kwargs):
        out = function_output(target, args, kwargs)
        return out if out is not None else super().call_function(target, args, kwargs)

    def call_method(self, target, args, kwargs):
        out = function_output(getattr(torch.Tensor, target, None), args, kwargs)
        return out if out is not None else super().call_method(target, args, kwargs)

    def run_node(self, n: fx.Node) -> Any:
        try:
            out = super().run_node(n)
        except Exception:
            if n.op not in ("call_module", "call_function", "call_method"):
                raise
            out = self._on_cpu(n)
        if not isinstance(out, torch.Tensor):
            return out
        kind, _, mod = self.kinds[n]
        inputs = flatten([self.env.get(a) for a in n.all_input_nodes])
        if kind in ELEMENTWISE:
            if isinstance(mod, LIKE_INPUT_MODULES) or n.target in LIKE_INPUT_FUNCTIONS:
                in_place = out.untyped_storage()._cdata == inputs[0].untyped_storage()._cdata
                return out if in_place else _like_input(inputs[0])
            return out if isinstance(mod, META_LAYOUT_MODULES) else _elementwise_output(out, inputs)
        if kind == "interpolate" or kind == "pad" and pad_mode(n, mod) in ("reflect", "replicate"):
            return _suggested_output(out, inputs[0])
        return out

    def _on_cpu(self, n: fx.Node) -> Any:
        """Run a node that cannot run on meta (a data-dependent leaf) on CPU zeros of the same
        shapes, at most ``CPU_FALLBACK_BYTES`` of inputs; its outputs come back as meta tensors.
        Re-raises the meta failure when that is not possible."""
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        tensors = [t for t in flatten((args, kwargs)) if isinstance(t, torch.Tensor)]
        if sum(t.numel() * t.element_size() for t in tensors) > CPU_FALLBACK_BYTES:
            raise
        to_cpu = lambda t: torch.zeros_like(t, device="cpu") if isinstance(t, torch.Tensor) else t  # noqa: E731
        args, kwargs = fx.node.map_aggregate(args, to_cpu), fx.node.map_aggregate(kwargs, to_cpu)
        with torch.no_grad():
            out = getattr(self, n.op)(n.target, args, kwargs)
        return fx.node.map_aggregate(
            out,
            lambda t: (
                torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
                if isinstance(t, torch.Tensor)
                else t
            ),
        )

    def get_attr(self, target, args, kwargs):
        value = super().get_attr(target, args, kwargs)
        return value.to("meta") if isinstance(value, torch.Tensor) else value
