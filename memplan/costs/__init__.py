"""Costs of fine-tuning, as plain data.

* :mod:`.records`: the records (``Costs``, ``LayerCost``, ``Totals``, ``Profile``; ``Saved`` and
  ``Summary``, what accounting modes return);
* :mod:`.flops`: one FLOP formula per op kind; :mod:`.peak`: the simulated training step's peak;
* :mod:`.engine`: ``compute``, a plan on a graph under a mode (``memplan.modes``, which sit
  between the records and the engine);
* :mod:`.extras`: strategy figures beyond per-layer costs (cache bytes, stage RAM).

This package's ``__init__`` imports only the records, so the modes can build on them.
"""

from .records import CONVENTIONS, HIDDEN_KINDS, Costs, LayerCost, Profile, Saved, Summary, Totals

__all__ = ["CONVENTIONS", "HIDDEN_KINDS", "Costs", "LayerCost", "Profile", "Saved", "Summary", "Totals"]
