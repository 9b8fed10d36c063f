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


@BASELINES.register("classifier only")
def _classifier(graph: LayerGraph) -> Plan:
    return make_plan(graph, "last")


@BASELINES.register("bias only")
def _bias(graph: LayerGraph) -> Plan:
    return make_plan(graph, "bias")


@BASELINES.register("norm + bias, running statistics")
def _norm_running(graph: LayerGraph) -> Plan:
    """Every norm's scale and shift train, each norm in eval mode: it keeps the running statistics
    the backbone (and the linear-probe head) were fit with."""
    plan = make_plan(graph, "norm")
    return Plan("norm-running", plan.train, set(), plan.approx)


@BASELINES.register("norm + bias")
def _norm(graph: LayerGraph) -> Plan:
    """Norms in train mode (batch statistics), as the ``norm`` strategy."""
    return make_plan(graph, "norm")


@BASELINES.register("last blocks")
def _lastk(graph: LayerGraph) -> Plan:
    return make_plan(graph, "lastk")


@BASELINES.register("MobileTL")
def _mobiletl(graph: LayerGraph) -> Plan:
    return make_plan(graph, "mobiletl")


@BASELINES.register("full fine-tuning")
def _full(graph: LayerGraph) -> Plan:
    return make_plan(graph, "full")
