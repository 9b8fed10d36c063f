"""Resumable contribution analysis: the JSONL checkpoint of finished runs and the digests that
identify a configuration (model weights, data) so a checkpoint is never reused for another."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from ..errors import MemplanError
from .data import Data


class Checkpoint:
    """JSONL file: a header line ``{"identity": ...}``, then one ``{"run": record}`` line per finished run."""

    def __init__(self, path: Path, identity: dict[str, Any]):
        self.path, self.identity = path, identity

    def finished(self, repair: bool = True) -> dict[str, dict[str, Any]] | None:
        """Records already in the file (None when there is no usable header). A torn last line
        (a kill during a write) is cut off with ``repair``, else only skipped (a reader beside
        processes that append to the file must not cut a line being written); a header for
        another configuration is an error."""
        if not self.path.is_file():
            return None
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        good = len(raw) if raw.endswith(b"\n") else len(raw) - len(lines[-1])
        rows = []
        for i, line in enumerate(lines[:-1] if not raw.endswith(b"\n") else lines):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise MemplanError(
                    f"checkpoint {self.path} is corrupt at line {i + 1}", "delete it to start over"
                ) from None
        if repair and good != len(raw):  # drop the torn tail so the next append starts a fresh line
            with open(self.path, "r+b") as f:
                f.truncate(good)
        if not rows or "identity" not in rows[0]:
            return None
        if rows[0]["identity"] != self.identity:
            diff = sorted(k for k in self.identity if rows[0]["identity"].get(k) != self.identity[k])
            raise MemplanError(
                f"checkpoint {self.path} was written for another configuration (differs in: "
                f"{', '.join(diff) or 'keys'})",
                "delete it, or write to another --out",
            )
        return {row["run"]["id"]: row["run"] for row in rows[1:] if "run" in row}

    def _append(self, obj: dict[str, Any], mode: str = "a") -> None:
        with open(self.path, mode, encoding="utf-8") as f:
            f.write(json.dumps(obj) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def start(self) -> None:
        self._append({"identity": self.identity}, "w")

    def append(self, record: dict[str, Any]) -> None:
        self._append({"run": record})


def state_digest(model: torch.nn.Module, skip: str) -> str:
    """SHA-256 prefix over the model's tensors (names, shapes, bytes), ``skip`` module excluded."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        if name.startswith(skip + "."):
            continue
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def data_digest(data: Data) -> str:
    h = hashlib.sha256()
    for t in (data.x_train, data.y_train, data.x_test, data.y_test, data.x_val, data.y_val):
        if t is not None:
            h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]
