"""Sparse-update search (the 256KB paper's Eq. 5): budget -> scheme of largest summed Δacc.

``run_search`` is the entry point (plain-data :class:`SearchResult`; ``memplan.render`` prints
and draws it). Pieces: ``space`` (candidates, scheme / plan mapping), ``memory`` (costs via
``memplan.accounting.engine.compute``, additivity check), ``exact`` (certified optimum), ``toolbox``
/ ``evolution`` / ``random_search`` (DEAP), ``budgets`` (reading the memory and FLOPs budgets: a
device's from ``memplan.accounting.devices``), ``methods`` (the search methods, a registry),
``stage`` (the validation stage of ``memplan search --validate``: candidates trained before one is
chosen), ``additivity`` (``memplan contrib validate``: does summed Δacc predict trained accuracy).
"""

from ..registry import lazy_exports

#: public name -> the module of this package that defines it (imported on first use, so that the
#: command line reads :mod:`.options` without torch)
EXPORTS = {
    "run_search": "run",
    "search_and_validate": "command",
    "Searched": "command",
    "SearchResult": "result",
    "SearchOptions": "options",
    "BudgetError": "budgets",
    "budget_convention": "budgets",
    "ProfileError": "space",
    "Candidate": "space",
    "Contributions": "space",
    "load_contributions": "space",
    "DEFAULT_RATIOS": "options",
    "DEFAULT_MODEL": "inputs",
    "METHODS": "methods",
}


__getattr__ = lazy_exports(__name__, EXPORTS, globals())

__all__ = list(EXPORTS)
