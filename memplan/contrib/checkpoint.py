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
    """JSONL file: a header line ``{"identity": ...}``, then one ``{"run": record}`` line per finished
    run. ``fields``: what every run record holds, by key, with its JSON type(s) (a line of another
    shape is refused in one line naming the file and the line)."""

    def __init__(self, path: Path, identity: dict[str, Any], fields: dict[str, type | tuple[type, ...]] | None = None):
        self.path, self.identity = path, identity
        self.fields = {"id": str, **(fields or {})}

    def finished(self, repair: bool = True) -> dict[str, dict[str, Any]] | None:
        """Records already in the file (None when there is no usable header). A torn last line
        (a kill during a write) is cut off with ``repair``, else only skipped (a reader beside
        processes that append to the file must not cut a line being written); a header for
        another configuration is an error, and so is a line that is not JSON or not of the
        checkpoint's shape."""
        if not self.path.is_file():
            return None
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            raise MemplanError(f"cannot read checkpoint {self.path}: {exc.strerror or exc}") from None
        lines = raw.split(b"\n")
        good = len(raw) if raw.endswith(b"\n") else len(raw) - len(lines[-1])
        rows = []
        for i, line in enumerate(lines[:-1] if not raw.endswith(b"\n") else lines):
            if line.strip():
                rows.append((i + 1, self._row(line, i + 1, header=not rows)))
        if repair and good != len(raw):  # drop the torn tail so the next append starts a fresh line
            self.writable()
            with open(self.path, "r+b") as f:
                f.truncate(good)
        if not rows or "identity" not in rows[0][1]:
            return None
        if rows[0][1]["identity"] != self.identity:
            diff = sorted(k for k in self.identity if rows[0][1]["identity"].get(k) != self.identity[k])
            raise MemplanError(
                f"checkpoint {self.path} was written for another configuration (differs in: "
                f"{', '.join(diff) or 'keys'})",
                "delete it, or write to another --out",
            )
        return {row["run"]["id"]: row["run"] for _, row in rows[1:] if "run" in row}

    def _row(self, line: bytes, number: int, header: bool) -> dict[str, Any]:
        """Line ``number`` read and checked: the header ``{"identity": {...}}`` (first), else
        ``{"run": {...}}`` with :attr:`fields`."""
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            row, problem = None, "not JSON"
        else:
            problem = self._problem(row, header)
        if problem is not None:
            raise MemplanError(
                f"checkpoint {self.path} is corrupt at line {number}: {problem}", "delete it to start over"
            ) from None
        return row

    def _problem(self, row: Any, header: bool) -> str | None:
        """What is wrong with a parsed line (None: nothing)."""
        if not isinstance(row, dict):
            return f"a JSON {type(row).__name__}, not an object"
        if header and "identity" in row:
            return None if isinstance(row["identity"], dict) else "its identity is not an object"
        if header and "run" not in row:
            return None  # no usable header: the file is started over
        run = row.get("run")
        if not isinstance(run, dict):
            return 'not a {"run": {...}} record'
        for key, kind in self.fields.items():
            value = run.get(key)
            if value is None or isinstance(value, bool) or not isinstance(value, kind):
                names = "/".join(t.__name__ for t in (kind if isinstance(kind, tuple) else (kind,)))
                return f"its run has no {names} {key!r}"
        return None

    def writable(self) -> None:
        """A one-line error unless the checkpoint (or its folder, before it exists) can be written:
        checked before any run trains, so no finished run is lost to a refused append. A file
        without any write permission bit is read-only even where this process could write it
        (root)."""
        try:
            if self.path.exists():
                if not self.path.stat().st_mode & 0o222:
                    raise PermissionError(13, "read-only")
                with open(self.path, "ab"):
                    pass
            elif not os.access(self.path.parent, os.W_OK):
                raise PermissionError(13, "Permission denied")
        except OSError as exc:
            raise MemplanError(
                f"cannot write checkpoint {self.path}: {exc.strerror or exc}",
                "make it writable, or delete it to start over",
            ) from None

    def _append(self, obj: dict[str, Any], mode: str = "a") -> None:
        try:
            with open(self.path, mode, encoding="utf-8") as f:
                f.write(json.dumps(obj) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise MemplanError(f"cannot write checkpoint {self.path}: {exc.strerror or exc}") from None

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
