"""Calls that capture keeps as single opaque nodes: custom ``torch.autograd.Function``\\ s and
TorchScript functions.

Autograd saves what a custom Function's ``ctx.save_for_backward`` holds, not what the ops of
its ``forward`` would save one by one, and a scripted function cannot be traced at all. So
while a model is captured, ``Function.apply`` and every ``torch.jit.ScriptFunction`` reachable
from a module's ``forward`` globals are patched: a call whose arguments hold a capture value
(a Proxy, or a tensor the recorder tracks) becomes one node whose target is a
:class:`FunctionApply` or the script function itself. Such nodes have no cost rule; they are
costed by observation (``memplan.observe``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn


class FunctionApply:
    """Call target standing for ``cls.apply`` of a custom ``torch.autograd.Function``."""

    def __init__(self, cls: type[torch.autograd.Function]):
        self.cls = cls
        self.__name__ = f"{cls.__name__}.apply"
        self.__qualname__ = self.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _ORIGINAL_APPLY(self.cls, *args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FunctionApply) and other.cls is self.cls

    def __hash__(self) -> int:
        return hash(self.cls)

    def __repr__(self) -> str:
        return self.__name__


_APPLY_DESCRIPTOR = torch.autograd.Function.__dict__["apply"]
_ORIGINAL_APPLY = _APPLY_DESCRIPTOR.__func__

#: intercept(target, args, kwargs) returns the node's value, or NotImplemented to run the call
Intercept = Callable[[Callable[..., Any], tuple, dict], Any]


def script_functions(model: nn.Module) -> dict[int, tuple[dict, str, Any]]:
    """Every ``torch.jit.ScriptFunction`` in the globals of the model's ``forward`` methods:
    id -> (globals dict, name, function)."""
    found: dict[int, tuple[dict, str, Any]] = {}
    seen: set[int] = set()
    for m in model.modules():
        fn = getattr(type(m), "forward", None)
        glob = getattr(fn, "__globals__", None)
        if glob is None or id(glob) in seen:
            continue
        seen.add(id(glob))
        for name, value in list(glob.items()):
            if isinstance(value, torch.jit.ScriptFunction):
                found[id(value)] = (glob, name, value)
    return found


def _script_wrapper(fn: Any, intercept: Intercept) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        out = intercept(fn, args, kwargs)
        return fn(*args, **kwargs) if out is NotImplemented else out

    call.__name__ = getattr(fn, "name", "script_function")
    return call


@contextlib.contextmanager
def opaque_calls(model: nn.Module, intercept: Intercept) -> Iterator[None]:
    """Route custom-Function and script-function calls made while ``model`` runs through
    ``intercept``; everything is restored on exit."""

    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        out = intercept(FunctionApply(cls), args, kwargs)
        return _ORIGINAL_APPLY(cls, *args, **kwargs) if out is NotImplemented else out

    patched = [(glob, name, value) for glob, name, value in script_functions(model).values()]
    torch.autograd.Function.apply = classmethod(apply)  # type: ignore[method-assign,assignment]
    for glob, name, value in patched:
        glob[name] = _script_wrapper(value, intercept)
    try:
        yield
    finally:
        torch.autograd.Function.apply = _APPLY_DESCRIPTOR  # type: ignore[method-assign]
        for glob, name, value in patched:
            glob[name] = value
