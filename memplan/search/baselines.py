"""The hand-picked baselines a plan must beat, each one point of the scheme space.

One entry per baseline: a function of the traced graph returning the plan a user would pick by
hand (a strategy's, ``memplan.strategies``); ``Scheme.from_plan`` writes it as a scheme, so the
validation stage (``memplan.search.select``) trains it, costs it and returns it exactly like a
searched scheme. TinyTL's lite residual branches change the architecture (``added_modules``),
which a scheme applied by ``apply_scheme`` does not build yet: it is not in this table.
"""

from __future__ import annotations

from collections.abc import Callable

from ..graph import LayerGraph
from ..plan import Plan
from ..registry import Registry
from ..strategies import make_plan

#: name -> plan of the graph
BASELINES: Registry[Callable[[LayerGraph], Plan]] = Registry("baseline")


def _strategy(name: str) -> Callable[[LayerGraph], Plan]:
    return lambda graph: make_plan(graph, name)


def _norm_running(graph: LayerGraph) -> Plan:
    """Every norm's scale and shift train, each norm in eval mode: it keeps the running statistics
    the backbone (and the linear-probe head) were fit with."""
    plan = make_plan(graph, "norm")
    return Plan("norm-running", plan.train, set(), plan.approx)


for _name, _plan in (
    ("classifier only", _strategy("last")),
    ("bias only", _strategy("bias")),
    ("norm + bias, running statistics", _norm_running),
    ("norm + bias", _strategy("norm")),  # norms in train mode (batch statistics)
    ("last blocks", _strategy("lastk")),
    ("MobileTL", _strategy("mobiletl")),
    ("full fine-tuning", _strategy("full")),
):
    BASELINES.add(_name, _plan)
