"""memplan: analytical memory / FLOP profiler and sparse-update planner for on-device
transfer learning.

    >>> import memplan
    >>> p = memplan.profile("mcunet-5fps", method="bias", mode="ideal")
    >>> p.totals.saved_activation_bytes
"""

from importlib import import_module

from .api import capture_model, compare, profile, profile_captured
from .apply import apply_plan, apply_scheme, apply_strategy
from .costs import LayerCost, Profile, Totals
from .errors import MemplanError
from .graph import LayerGraph, capture, trace
from . import models
from .modes import MODES
from .nn import train
from .plan import Plan, Train
from .strategies import STRATEGIES, make_plan
from .version import __version__


def __getattr__(name: str):
    """The scheme names (pydantic-based) load on first use: ``memplan.Scheme``, ``load_scheme``,
    ``shipped_scheme``."""
    if name in ("Scheme", "load_scheme", "shipped_scheme"):
        return getattr(import_module("memplan.plan"), name)
    raise AttributeError(f"module 'memplan' has no attribute {name!r}")


__all__ = [
    "profile", "compare", "capture_model", "profile_captured", "Profile", "LayerCost", "Totals",
    "MemplanError", "LayerGraph", "capture", "trace", "MODES", "Plan", "Train", "STRATEGIES", "make_plan",
    "apply_plan", "apply_strategy", "apply_scheme", "Scheme", "load_scheme", "shipped_scheme", "train", "models",
    "__version__",
]
