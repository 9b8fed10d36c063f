"""Accounting modes, by name. Each is a small set of per-kind rules (see ``base.Mode``)."""

from .base import MODES, Mode, Saved, register_mode
from . import pytorch as _pytorch  # noqa: F401  (registers "pytorch")
from . import ideal as _ideal  # noqa: F401  (registers "ideal")
from . import applied as _applied  # noqa: F401  (registers "applied")
from . import tinytl as _tinytl  # noqa: F401  (registers "tinytl")
from . import tinytraining as _tinytraining  # noqa: F401  (registers "tinytraining")

__all__ = ["MODES", "Mode", "Saved", "register_mode", "get_mode"]


def get_mode(name: str) -> Mode:
    from ..errors import BadOption

    if name not in MODES:
        raise BadOption(f"unknown accounting mode {name!r}", f"choose one of: {', '.join(MODES)}")
    return MODES[name]
