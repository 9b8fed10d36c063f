"""File helpers with one-line errors: atomic output (write to a temporary file beside the
target, then rename over it), JSON objects in, pydantic validation errors as one line, and the
shipped data (package data under ``memplan/data``, found with ``importlib.resources``)."""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from .errors import MemplanError

T = TypeVar("T")


def shipped(*parts: str) -> Path:
    """A folder or file of memplan's package data (``memplan/data/...``): device profiles
    (``profiles/devices``), contribution profiles (``profiles``), searched schemes (``schemes``)."""
    return Path(str(importlib.resources.files("memplan").joinpath("data", *parts)))


def _umask_mode() -> int:
    """Permissions a plain ``open(path, "w")`` would give (mkstemp's default is 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0
    return True


def _temp_beside(target: Path, suffix: str = ".tmp") -> tuple[int, str]:
    """(fd, path) of a new temporary file ``.NAME.PID.XXXX<suffix>`` beside ``target``, after removing
    those a killed writer left (their PID is gone): a kill during a write leaves nothing behind
    once the output is written again. A one-line error when the folder is missing or not writable."""
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise MemplanError(f"cannot write {target}: directory {directory} does not exist")
    head = f".{target.name}."
    try:
        names = os.listdir(directory)
    except OSError:
        names = []
    for name in names:
        pid, _, rest = name[len(head) : len(name) - len(suffix)].partition(".")
        ours = name.startswith(head) and name.endswith(suffix) and rest and "." not in rest
        if ours and pid.isdigit() and not _alive(int(pid)):
            try:
                os.unlink(directory / name)
            except OSError:
                pass
    try:
        return tempfile.mkstemp(prefix=f"{head}{os.getpid()}.", suffix=suffix, dir=directory)
    except OSError as exc:
        raise MemplanError(f"cannot write {target}: {exc.strerror or exc}") from None


def _replace_from(tmp: str, target: Path, write: Callable[[], None]) -> None:
    """Run ``write`` (which fills ``tmp``), then rename ``tmp`` over ``target``; ``tmp`` removed on
    any failure (an OSError as one line)."""
    try:
        os.chmod(tmp, _umask_mode())
        write()
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise MemplanError(f"cannot write {target}: {exc.strerror or exc}") from None
        raise


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (no partial file is ever visible, and none left behind:
    :func:`_temp_beside`)."""
    target = Path(path)
    fd, tmp = _temp_beside(target)

    def write() -> None:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    _replace_from(tmp, target, write)
    return target


def save_figure(fig: Any, path: str | os.PathLike, **savefig: Any) -> Path:
    """Save a matplotlib figure atomically (format from the suffix of ``path``; ``savefig``:
    options of ``Figure.savefig`` such as ``dpi``)."""
    target = Path(path)
    fd, tmp = _temp_beside(target, target.suffix or ".png")
    os.close(fd)
    _replace_from(tmp, target, lambda: fig.savefig(tmp, format=(target.suffix.lstrip(".") or "png"), **savefig))
    return target


def save_state(path: Path, state: dict[str, Any]) -> None:
    """``torch.save`` to a temporary file beside ``path``, then rename (atomic)."""
    import torch  # this module is imported by ``import memplan``, which loads no torch

    fd, tmp = _temp_beside(Path(path))
    os.close(fd)
    _replace_from(tmp, Path(path), lambda: torch.save(state, tmp))


@contextlib.contextmanager
def exclusive(path: str | os.PathLike, on_wait: Callable[[], None] | None = None, wait: bool = True) -> Iterator[bool]:
    """Hold an exclusive lock on the file ``path`` (created if missing) inside the block, which gets
    True: a second process that asks for it waits (``on_wait()`` called first) until the first
    leaves the block or dies; with ``wait=False`` it gets False at once instead, holding nothing.
    Where the platform has no ``fcntl`` (Windows), no lock is taken."""
    try:
        import fcntl  # POSIX only
    except ImportError:
        yield True
        return
    try:
        f = open(path, "a+b")  # closed below, which releases the lock
    except OSError as exc:
        raise MemplanError(f"cannot open the lock file {path}: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                yield False
                return
            if on_wait is not None:
                on_wait()
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        yield True
    finally:
        f.close()


def read_json(path: str | os.PathLike, what: str = "file", error: type[MemplanError] = MemplanError) -> dict[str, Any]:
    """A JSON object from ``path``; ``error`` (one line, naming ``what``) for missing, empty and
    broken files and for JSON that is not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not text.strip():
        raise error(f"{what} {path} is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(
            f"{what} {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})", "is it truncated?"
        ) from None
    if not isinstance(data, dict):
        raise error(f"{what} {path} holds a JSON {type(data).__name__}, not an object")
    return data


def validation_error(exc: Exception) -> tuple[str, str]:
    """(where, message) of the first error of a pydantic ``ValidationError``; where is the
    dotted field path, ``(top level)`` for the object itself."""
    err = exc.errors()[0]
    return ".".join(str(p) for p in err.get("loc", ())) or "(top level)", err.get("msg", "invalid value")


def validated(build: Callable[[], T], source: str, error: type[MemplanError] = MemplanError) -> T:
    """Run a pydantic constructor; turn its first error into one line naming ``source`` and the field."""
    from pydantic import ValidationError  # pydantic only for the callers that validate

    try:
        return build()
    except ValidationError as exc:
        where, msg = validation_error(exc)
        raise error(f"{source}: field '{where}': {msg}") from None
