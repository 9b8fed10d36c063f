"""Atomic output: write to a temporary file beside the target, then rename over it."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import MemplanError


def _umask_mode() -> int:
    """Permissions a plain ``open(path, "w")`` would give (mkstemp's default is 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (no partial file is ever visible)."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise MemplanError(f"cannot write {target}: directory {directory} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise MemplanError(f"cannot write {target}: {exc.strerror or exc}") from None
    try:
        os.chmod(tmp, _umask_mode())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise MemplanError(f"cannot write {target}: {exc.strerror or exc}") from None
        raise
    return target


def write_json(path: str | os.PathLike, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def save_figure(fig: Any, path: str | os.PathLike) -> Path:
    """Save a matplotlib figure atomically (format from the suffix of ``path``)."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise MemplanError(f"cannot write {target}: directory {directory} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix or ".png", dir=directory)
    os.close(fd)
    try:
        os.chmod(tmp, _umask_mode())
        fig.savefig(tmp, format=(target.suffix.lstrip(".") or "png"), bbox_inches="tight")
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target
