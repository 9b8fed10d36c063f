"""Accounting modes, by name. Each is a small set of per-kind rules (see ``base.Mode``)."""

from . import applied, ideal, mcu, pytorch, tinytl, tinytraining
from .base import MODES, Mode, Rule, get_mode, register_mode

__all__ = [
    "MODES",
    "Mode",
    "Rule",
    "get_mode",
    "register_mode",
    "applied",
    "ideal",
    "mcu",
    "pytorch",
    "tinytl",
    "tinytraining",
]
