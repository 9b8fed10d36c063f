"""memplan: analytical memory / FLOP profiler and sparse-update planner for on-device
transfer learning.

    >>> import memplan
    >>> p = memplan.profile("mcunet-5fps", method="bias", mode="ideal")
    >>> p.totals.saved_activation_bytes

The names below load on first use (module ``__getattr__``): ``import memplan`` itself imports
neither torch nor any other dependency, so a command line that is interrupted while torch
loads still ends cleanly, and code that only needs one part never pays for the others.
"""

from importlib import import_module
from typing import Any

from .errors import MemplanError
from .version import __version__

#: public name -> the module that defines it
EXPORTS = {
    **dict.fromkeys(("capture", "profile", "compare", "profile_captured"), "api"),
    **dict.fromkeys(("apply_plan", "apply_strategy", "apply_scheme", "unapply", "write_back"), "apply"),
    **dict.fromkeys(("LayerCost", "Profile", "Totals"), "costs"),
    "LayerGraph": "graph",
    "MODES": "modes",
    **dict.fromkeys(("Plan", "Train", "Scheme", "load_scheme", "shipped_scheme"), "plan"),
    **dict.fromkeys(("STRATEGIES", "make_plan"), "strategies"),
}


def __getattr__(name: str) -> Any:
    """A public name of :data:`EXPORTS`, or a subpackage (``memplan.models``), imported on first use."""
    if name in EXPORTS:
        value = getattr(import_module(f"{__name__}.{EXPORTS[name]}"), name)
    elif not name.startswith("_"):
        try:
            value = import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *EXPORTS, "train"})


__all__ = ["MemplanError", "__version__", *EXPORTS, "models", "train"]
