"""``F.scaled_dot_product_attention`` on the CPU: which kernel torch runs, asked of torch itself.

torch 2.13 has two CPU kernels: the flash kernel (``_scaled_dot_product_flash_attention_for_cpu``)
and the math fallback (``_scaled_dot_product_attention_math``, a composite of matmul, softmax and
dropout). The choice (``torch._fused_sdp_choice`` on CPU tensors) depends on shapes, strides,
dtype, dropout, the mask and whether the mask needs a gradient, and on the global
``torch.backends`` SDPA flags at profile time (a ``torch.nn.attention.sdpa_kernel`` context that
the model enters itself is not seen). The meta device always picks the math kernel, so capture
and costing ask the CPU choice on small CPU tensors of the captured strides (batch dim 1).

The flash kernel's output is laid out like its query (dense, in the query's stride order:
``empty_like(query)``); the math kernel's is contiguous.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

FLASH, MATH = "flash", "math"
#: argument names of F.scaled_dot_product_attention in call order
SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_BACKENDS = {0: MATH, 1: FLASH}


def _probe(shape: Sequence[int], strides: Sequence[int], dtype: torch.dtype, grad: bool, batch: int) -> torch.Tensor:
    """A CPU tensor with ``shape`` / ``strides`` except a leading dim of ``batch`` shrunk to 1."""
    shape = [1 if i == 0 and s == batch and len(shape) == 4 else s for i, s in enumerate(shape)]
    extent = 1 + sum((s - 1) * st for s, st in zip(shape, strides)) if all(shape) else 0
    t = torch.empty(max(extent, 1), dtype=dtype).as_strided(shape, tuple(strides))
    return t.requires_grad_(grad) if grad and dtype.is_floating_point else t


def cpu_backend(
    tensors: Sequence[tuple[Sequence[int], Sequence[int], torch.dtype, bool] | None],
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> str:
    """The kernel eager CPU runs for query, key, value and mask given as (shape, strides, dtype,
    requires_grad) (mask None: no mask): ``flash``, ``math`` or the backend's number."""
    batch = tensors[0][0][0] if tensors[0][0] else 0
    q, k, v, m = [_probe(*t, batch) if t is not None else None for t in tensors]
    choice = torch._fused_sdp_choice(q, k, v, m, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    return _BACKENDS.get(int(choice), str(int(choice)))


def sdpa_backend(op: Any) -> str:
    """The CPU kernel of a captured F.scaled_dot_product_attention node under a plan: ``op`` is a
    ``memplan.plan.OpView`` (its operands and which of them need a gradient)."""
    specs = [
        (t.shape, t.layout, t.dtype, op.operand_grad(n)) if (t := op.operand(n)) is not None else None
        for n in SDPA_ARGS[:4]
    ]
    a = op.node.attrs
    return cpu_backend(specs, a["dropout_p"], a["is_causal"], a["scale"], a["enable_gqa"])


def sdpa_call(args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by name, with defaults."""
    bound = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
    bound.update(zip(SDPA_ARGS, args))
    bound.update(kwargs)
    return bound


def sdpa_output(args: Sequence[Any], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The output of F.scaled_dot_product_attention as eager CPU lays it out, assuming the mask
    needs no gradient (the flash kernel's query-like layout where it runs; None: the meta kernel,
    which is the math one, runs)."""
    a = sdpa_call(args, kwargs)
    q, k, v, m = (a.get(n) for n in SDPA_ARGS[:4])
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)) or (m is not None and not isinstance(m, torch.Tensor)):
        return None
    specs = [(tuple(t.shape), t.stride(), t.dtype, True) for t in (q, k, v)]
    specs.append((tuple(m.shape), m.stride(), m.dtype, False) if m is not None else None)
    try:
        backend = cpu_backend(specs, a["dropout_p"], a["is_causal"], a["scale"], a["enable_gqa"])
    except (RuntimeError, TypeError, ValueError):
        return None
    if backend != FLASH or q.shape[-1] != v.shape[-1]:
        return None
    return torch.empty_like(q, device="meta")
