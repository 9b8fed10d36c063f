"""torch.fx tracing with conv / linear / norm / activation / pooling leaves (and user-named
modules), and one-line errors naming the module that cannot be traced."""

from __future__ import annotations

import linecache
import traceback
from typing import Iterable

import torch.fx as fx
import torch.nn as nn

from ..errors import MemplanError, TraceFailure
from .kinds import module_kind


class LeafTracer(fx.Tracer):
    """fx tracer that keeps known layers (and user-named modules) as single nodes.

    It records which module was being traced so that a failure can name it.
    """

    def __init__(self, leaf_modules: Iterable[str | type] = ()):
        super().__init__()
        self.leaf_names = {x for x in leaf_modules if isinstance(x, str)}
        self.leaf_types = tuple(x for x in leaf_modules if isinstance(x, type))
        self.stack: list[tuple[str, str]] = []

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if module_kind(m) is not None or isinstance(m, self.leaf_types):
            return True
        if qualname in self.leaf_names or type(m).__name__ in self.leaf_names:
            return True
        return super().is_leaf_module(m, qualname)

    def call_module(self, m, forward, args, kwargs):
        self.stack.append((self.path_of_module(m) if self.root is not m else "", type(m).__name__))
        try:
            out = super().call_module(m, forward, args, kwargs)
        except Exception as exc:
            if not hasattr(exc, "_memplan_scope"):
                exc._memplan_scope = self.stack[-1]  # type: ignore[attr-defined]
            raise
        self.stack.pop()
        return out


def _user_frame(exc: BaseException) -> str:
    """``file:line: code`` of the innermost traceback frame outside torch / memplan."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        f = frame.filename
        if "/torch/" in f or "/memplan/graph/" in f or f.startswith("<"):
            continue
        code = (frame.line or linecache.getline(f, frame.lineno or 0)).strip()
        return f"{f.rsplit('/', 1)[-1]}:{frame.lineno}: {code}"
    return ""


def trace(model: nn.Module, leaf_modules: Iterable[str | type] = (), name: str = "model") -> fx.GraphModule:
    """Symbolically trace ``model``; raise TraceFailure with a one-line explanation on failure."""
    tracer = LeafTracer(leaf_modules)
    try:
        graph = tracer.trace(model)
    except MemplanError:
        raise
    except Exception as exc:
        qual, cls = getattr(exc, "_memplan_scope", ("", type(model).__name__))
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        where = f" in module '{qual}' ({cls})" if qual else f" in {cls}.forward"
        frame = _user_frame(exc)
        raise TraceFailure(
            f"cannot trace {name}: {first}{where}" + (f" at {frame}" if frame else ""),
            f"mark that module as a leaf (CLI: --leaf {cls}; Python: leaf_modules=['{cls}']) "
            "so memplan treats it as one op",
        ) from None
    return fx.GraphModule(tracer.root, graph, type(model).__name__)
