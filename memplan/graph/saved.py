"""The one saved-storage observer: what autograd keeps for backward, seen through
``torch.autograd.graph.saved_tensors_hooks``, one entry per storage.

De-duplication rule (the same everywhere: the self-check, costing by observation, the
independent measurement): a saved tensor stands for the whole storage it views
(``untyped_storage().nbytes()`` bytes), a storage is counted the first time any tensor of it
is packed, and the excluded storages (a model's parameters and buffers) are never counted.
Storages are identified by their ``StorageImpl`` (``untyped_storage()._cdata``), which tells
storages apart on the meta device as on the CPU; the observer keeps every counted tensor
alive while it exists, so an identity is never reused by a later allocation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch


def storage_key(t: torch.Tensor) -> int:
    """The identity of the storage ``t`` views (shared by all views of it; meta and CPU alike)."""
    return t.untyped_storage()._cdata


@dataclass
class SavedStorage:
    """One storage autograd keeps: ``nbytes`` is the whole storage; ``shape`` / ``dtype`` are those
    of the first tensor packed from it; ``where`` is the observer's label when it was packed."""

    key: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    where: Any
    tensor: torch.Tensor

    def describe(self) -> str:
        """``(2, 17, 32) float32 4352 B``."""
        return f"{tuple(self.shape)} {str(self.dtype).removeprefix('torch.')} {self.nbytes} B"


class SavedObserver:
    """Context manager: records every storage packed for backward while it is active (unique
    storages, ``exclude``'s storages left out). ``where`` (optional) labels each record with
    what was running when it was packed (a module name, an op)."""

    def __init__(self, exclude: Iterable[torch.Tensor] = (), where: Callable[[], Any] | None = None):
        self.excluded = {storage_key(t) for t in exclude}
        self.where = where
        self.records: list[SavedStorage] = []
        self._seen: set[int] = set()
        self._hooks: Any = None

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key not in self.excluded and key not in self._seen:
            self._seen.add(key)
            self.records.append(
                SavedStorage(
                    key,
                    t.untyped_storage().nbytes(),
                    tuple(t.shape),
                    t.dtype,
                    self.where() if self.where is not None else None,
                    t,
                )
            )
        return t

    @property
    def total(self) -> int:
        """Bytes of the unique storages recorded."""
        return sum(r.nbytes for r in self.records)

    def __enter__(self) -> SavedObserver:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, _unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
        self._hooks = None


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t
