"""The costs core: records and the figures every accounting mode builds on.

* :mod:`.records`: the records (``Costs``, ``LayerCost``, ``Totals``, ``Profile``; ``Saved`` and
  ``Summary``, what accounting modes return);
* :mod:`.flops`: one FLOP formula per op kind; :mod:`.peak`: the simulated training step's peak;
* :mod:`.observe`: the cost of an op no rule covers, by observation; :mod:`.workspace`: kernel
  workspaces calibrated on the machine.

The modes (``memplan.modes``) stand on this package; the accounting that runs a plan under a
mode (``memplan.accounting``) stands on both.
"""

from .records import CONVENTIONS, HIDDEN_KINDS, Costs, LayerCost, Profile, Saved, Summary, Totals

__all__ = ["CONVENTIONS", "HIDDEN_KINDS", "Costs", "LayerCost", "Profile", "Saved", "Summary", "Totals"]
