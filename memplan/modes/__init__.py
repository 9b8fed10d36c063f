"""Accounting modes, by name. Each is a small set of per-kind rules (see ``base.Mode``)."""

from .base import MODES, Mode, Saved, register_mode
from . import pytorch as _pytorch  # noqa: F401  (registers "pytorch")
from . import ideal as _ideal  # noqa: F401  (registers "ideal")

__all__ = ["MODES", "Mode", "Saved", "register_mode", "get_mode"]


def get_mode(name: str) -> Mode:
    from ..errors import BadOption

    if name not in MODES:
        raise BadOption(f"unknown accounting mode {name!r}", f"choose one of: {', '.join(MODES)}")
    return MODES[name]
