"""Backbone weights: a local state_dict loaded safely.

``load_weights`` reads with ``torch.load(path, weights_only=True)``: a pickle that would run
code is refused, never executed. The classifier is not loaded (contribution analysis always
trains a new head for the task), so a checkpoint with another head size fits; every other
key must match the model's names and shapes.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ..errors import MemplanError


class BadWeights(MemplanError):
    """``--weights`` cannot be read or does not fit the model."""


def _examples(keys: Sequence[str], n: int = 2) -> str:
    shown = ", ".join(list(keys)[:n])
    return shown + (", ..." if len(keys) > n else "")


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A state_dict from ``path`` (also ``{'state_dict': ...}`` / ``{'model': ...}`` wrappers)."""
    p = Path(path)
    if not p.is_file():
        raise BadWeights(f"no such weights file {str(path)!r}")
    try:
        obj: Any = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for code-running pickles, RuntimeError for non-checkpoints
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise BadWeights(
            f"cannot load {p} with torch.load(weights_only=True): {type(exc).__name__}: {first}",
            "save a plain state_dict (torch.save(model.state_dict(), path))",
        ) from None
    if isinstance(obj, dict):
        for key in ("state_dict", "model"):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        kind = type(obj).__name__ if not isinstance(obj, dict) else "dict that is not name -> tensor"
        raise BadWeights(
            f"{p} holds a {kind}, not a state_dict", "save a plain state_dict (torch.save(model.state_dict(), path))"
        )
    if all(k.startswith("module.") for k in obj):  # DataParallel checkpoints
        obj = {k.removeprefix("module."): v for k, v in obj.items()}
    return obj


def load_weights(
    model: nn.Module, path: str | os.PathLike, classifier: str, state: dict[str, torch.Tensor] | None = None
) -> str:
    """Load ``path`` (or ``state``, already read from it) into ``model`` except the ``classifier``
    module's tensors; returns a SHA-256 prefix of the file."""
    state = read_state_dict(path) if state is None else state
    own = model.state_dict()
    head = classifier + "."
    missing = [k for k in own if k not in state and not k.startswith(head)]
    unexpected = [k for k in state if k not in own and not k.startswith(head)]
    mismatched = [
        f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
        for k in state
        if k in own and not k.startswith(head) and state[k].shape != own[k].shape
    ]
    if missing or unexpected or mismatched:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing ({_examples(missing)})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected ({_examples(unexpected)})")
        if mismatched:
            parts.append(f"{len(mismatched)} of another shape ({_examples(mismatched, 1)})")
        raise BadWeights(
            f"{Path(path).name} does not match the model: {'; '.join(parts)}",
            "give a state_dict saved from this architecture",
        )
    with torch.no_grad():
        for k, v in state.items():
            if not k.startswith(head):
                own[k].copy_(v)
    return file_digest(path)


def file_digest(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]
