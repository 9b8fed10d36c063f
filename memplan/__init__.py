"""memplan: analytical memory / FLOP profiler and sparse-update planner for on-device
transfer learning.

    >>> import memplan
    >>> p = memplan.profile("mcunet-5fps", method="bias", mode="ideal")
    >>> p.totals.saved_activation_bytes
"""

from .api import capture_model, compare, profile, profile_captured
from .apply import apply_plan, apply_scheme, apply_strategy
from .costs import LayerCost, Profile, Totals
from .errors import MemplanError
from .graph import LayerGraph, capture, trace
from . import models
from .modes import MODES
from .nn import train
from .plan import Plan, Scheme, Train, load_scheme, shipped_scheme
from .strategies import STRATEGIES, make_plan
from .version import __version__

__all__ = [
    "profile", "compare", "capture_model", "profile_captured", "Profile", "LayerCost", "Totals",
    "MemplanError", "LayerGraph", "capture", "trace", "MODES", "Plan", "Train", "STRATEGIES", "make_plan",
    "apply_plan", "apply_strategy", "apply_scheme", "Scheme", "load_scheme", "shipped_scheme", "train", "models",
    "__version__",
]
