"""Sparse-update search (the 256KB paper's Eq. 5): budget -> scheme of largest summed Δacc.

``run_search`` is the entry point (plain-data :class:`SearchResult`; ``memplan.render`` prints
and draws it). Pieces: ``space`` (candidates, scheme / plan mapping), ``memory`` (costs via
``memplan.accounting.engine.compute``, additivity check), ``exact`` (certified optimum), ``toolbox``
/ ``evolution`` / ``random_search`` (DEAP), ``devices`` (device budgets), ``budgets`` (reading the
memory and FLOPs budgets), ``methods`` (the search methods, a registry).
"""

from .budgets import BudgetError, budget_convention
from .devices import Device, device_names, load_device
from .inputs import DEFAULT_MODEL, SearchOptions
from .methods import METHODS
from .result import SearchResult
from .run import run_search
from .space import DEFAULT_RATIOS, Candidate, Contributions, ProfileError, load_contributions

__all__ = [
    "run_search",
    "SearchResult",
    "BudgetError",
    "ProfileError",
    "Device",
    "load_device",
    "device_names",
    "Candidate",
    "Contributions",
    "load_contributions",
    "DEFAULT_RATIOS",
    "DEFAULT_MODEL",
    "METHODS",
    "SearchOptions",
    "budget_convention",
]
