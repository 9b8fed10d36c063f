"""Resolve a model spec: a zoo name, ``package.module:attr`` or ``path/to/file.py:attr``.

``attr`` may be an ``nn.Module`` instance, an ``nn.Module`` subclass or a zero-argument
factory. Zoo models are built on the meta device (no weights are allocated).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import pickle
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
import torch.nn as nn

from ..errors import ModelNotFound
from . import zoo


@dataclass
class ModelSpec:
    """A built model and what its spec says about it."""

    name: str
    model: nn.Module
    resolution: int | None  # default input side in px (zoo models)
    classes: int | None
    block_names: tuple[str, ...] | None = None  # explicit blocks (None: the structural rule)


#: modules imported from a user's file (``file.py:attr``): module name -> absolute path, so that
#: another process can import them again before it unpickles their objects (:func:`portable`)
USER_FILES: dict[str, str] = {}


def load_file(path: str) -> ModuleType:
    """Import the Python file ``path`` as module ``memplan_user_<stem>`` (recorded in
    :data:`USER_FILES`)."""
    mod_name = "memplan_user_" + os.path.splitext(os.path.basename(path))[0]
    spec_obj = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec_obj)
    sys.modules[mod_name] = module
    try:
        spec_obj.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[mod_name]
        raise ModelNotFound(f"importing {path} failed: {type(exc).__name__}: {exc}") from None
    USER_FILES[mod_name] = os.path.abspath(path)
    return module


class _Portable:
    """An object that pickles as (the user files it may need, its own pickle): unpickled, it imports
    those files first (where they are not yet), then is the object itself."""

    def __init__(self, obj: Any, files: dict[str, str]):
        self.obj, self.files = obj, files

    def __reduce__(self) -> tuple[Any, tuple[dict[str, str], bytes]]:
        return _restore, (self.files, pickle.dumps(self.obj))


def _restore(files: dict[str, str], data: bytes) -> Any:
    for name, path in files.items():
        if name not in sys.modules:
            load_file(path)
    return pickle.loads(data)


def portable(obj: Any) -> Any:
    """``obj`` ready to be pickled to another process (a spawned pool worker, a Ray task): where a
    model was given as ``file.py:attr``, its class lives in a module no other process can import
    by name, so the object travels with the files to import first (:func:`load_file`); ``obj``
    itself otherwise."""
    return _Portable(obj, dict(USER_FILES)) if USER_FILES else obj


def import_attr(spec: str) -> Any:
    path, _, attr = spec.rpartition(":")
    if not path or not attr:
        raise ModelNotFound(
            f"cannot read model spec {spec!r}", "use a zoo name (memplan models), package.module:attr or file.py:attr"
        )
    if path.endswith(".py"):
        if not os.path.isfile(path):
            raise ModelNotFound(f"no such file {path!r}")
        module = load_file(path)
    else:
        try:
            module = importlib.import_module(path)
        except Exception as exc:
            raise ModelNotFound(f"cannot import module {path!r}: {type(exc).__name__}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ModelNotFound(f"{path} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _instantiate(obj: Any, spec: str, classes: int | None) -> nn.Module:
    if isinstance(obj, nn.Module):
        return obj
    if not callable(obj):
        raise ModelNotFound(f"{spec} is a {type(obj).__name__}, not an nn.Module, class or factory")
    kwargs: dict[str, Any] = {}
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        params = {}
    if classes is not None and "num_classes" in params:
        kwargs["num_classes"] = classes
    required = [
        p
        for p in params.values()
        if p.default is p.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in kwargs
    ]
    if required:
        raise ModelNotFound(
            f"{spec} needs arguments ({', '.join(p.name for p in required)})",
            "point to a zero-argument factory that builds the model",
        )
    try:
        model = obj(**kwargs)
    except Exception as exc:
        raise ModelNotFound(f"building {spec} failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise ModelNotFound(f"{spec} returned a {type(model).__name__}, not an nn.Module")
    return model


def resolve(spec: str | nn.Module, classes: int | None = None, *, meta: bool = True) -> ModelSpec:
    """Build the model named by ``spec``. With ``meta`` zoo models are built on the meta device."""
    if isinstance(spec, nn.Module):
        return ModelSpec(type(spec).__name__, spec, None, classes)
    if ":" not in spec:
        try:
            entry = zoo.get_entry(spec)
        except KeyError as exc:
            raise ModelNotFound(
                str(exc.args[0]) if exc.args else f"unknown model {spec!r}",
                "run `memplan models` for the zoo, or pass package.module:attr / file.py:attr",
            ) from None
        n = entry.num_classes if classes is None else classes
        if meta:
            with torch.device("meta"):
                model = entry.build(num_classes=n)
        else:
            model = entry.build(num_classes=n)
        return ModelSpec(spec, model, entry.resolution, n, entry.block_names)
    model = _instantiate(import_attr(spec), spec, classes)
    return ModelSpec(spec, model, None, classes)


def sample_shape(spec: str | nn.Module, resolution: int) -> tuple[int, ...]:
    """Per-sample input shape for a zoo model at ``resolution`` (3 x r x r otherwise)."""
    if isinstance(spec, str) and ":" not in spec:
        return tuple(zoo.get_entry(spec).input_shape(resolution))
    return (3, resolution, resolution)


def recorded_shape(recorded: Sequence[int] | None, resolution: int | None = None) -> tuple[int, ...] | None:
    """A recorded per-sample input shape (a scheme's or a contribution profile's, e.g. ``(1, 28, 28)``)
    at ``resolution`` px: its channels kept, its last two sides set to ``resolution``; the shape itself
    when ``resolution`` is None or its last side already; None when nothing is recorded."""
    if recorded is None:
        return None
    shape = tuple(int(d) for d in recorded)
    if resolution is None or len(shape) < 2 or shape[-1] == resolution:
        return shape
    return (*shape[:-2], resolution, resolution)
