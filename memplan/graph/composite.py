"""Composites: torch functions and stock modules built of ops that have rules, captured through
their parts (never as one opaque node) by the tracer (``memplan.graph.trace``), the recorder
(``memplan.graph.record``) and the observation of unknown ops (``memplan.costs.observe``)."""

from __future__ import annotations

import types
from typing import Any

import torch.nn as nn
import torch.nn.functional as F

#: Python functions of torch that compose ops with rules, recorded op by op (``memplan.graph.record``)
#: rather than observed whole: observed on meta, the attention inside would run the math kernel
#: where eager CPU runs the flash one, and the parameters it reads would be no layer's
COMPOSITE_FUNCTIONS: frozenset[object] = frozenset({F.multi_head_attention_forward})


def composite_body(func: Any) -> Any:
    """A function of ``COMPOSITE_FUNCTIONS`` without its ``__torch_function__`` dispatch: a copy
    whose ``has_torch_function`` is false, so that under a ``TorchFunctionMode`` (entered again
    by its handler) its body runs and the mode sees the calls it makes one by one."""
    glob = {**func.__globals__, "has_torch_function": lambda *_: False}
    body = types.FunctionType(func.__code__, glob, func.__name__, func.__defaults__, func.__closure__)
    body.__kwdefaults__ = func.__kwdefaults__
    return body


def is_composite_module(m: nn.Module) -> bool:
    """A stock ``torch.nn`` module built of other modules (``nn.MultiheadAttention``, the
    ``nn.Transformer`` layers): captured through its parts, which have rules and whose
    parameters the strategies train, never as one opaque node."""
    return type(m).__module__.startswith("torch.nn.modules.") and any(True for _ in m.children())
