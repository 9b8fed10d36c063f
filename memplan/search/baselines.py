"""The hand-picked baselines a plan must beat, each one point of the scheme space.

One entry per baseline: the plan a user would pick by hand, a strategy's (``memplan.strategies``)
on the model as that strategy's architecture transform builds it (TinyTL's lite residual
branches), changed by ``adjust`` where the baseline is a variant. ``Scheme.from_plan`` writes it as
a scheme (added modules as ``added_modules``), so the validation stage
(``memplan.search.stage``) trains it, costs it and returns it exactly like a searched scheme.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..graph import LayerGraph
from ..plan import Plan
from ..registry import Registry
from ..strategies import make_plan


@dataclass(frozen=True)
class Baseline:
    """Strategy ``method``'s plan on the graph of the model captured with ``method`` (its
    architecture transform, if any, applied), changed by ``adjust(graph, plan)`` (None: as it is)."""

    method: str
    adjust: Callable[[LayerGraph, Plan], Plan] | None = None

    def plan(self, graph: LayerGraph) -> Plan:
        plan = make_plan(graph, self.method)
        return plan if self.adjust is None else self.adjust(graph, plan)


#: name -> the baseline
BASELINES: Registry[Baseline] = Registry("baseline")


def _running(graph: LayerGraph, plan: Plan) -> Plan:
    """Every norm's scale and shift train, each norm in eval mode: it keeps the running statistics
    the backbone (and the linear-probe head) were fit with."""
    return Plan("norm-running", plan.train, set(), plan.approx)


def _reestimated(graph: LayerGraph, plan: Plan) -> Plan:
    """Every norm's scale and shift train, each norm in eval mode, with its running statistics (where
    it keeps them) re-estimated on the target data first (norm mode ``reestimate``; the
    contribution runner then re-fits the linear-probe head on them)."""
    stats = {n.name for n in graph.param_nodes() if n.name in plan.norm_train and n.attrs.get("running_stats")}
    return Plan("norm-reestimated", plan.train, set(), plan.approx, reestimate=stats)


for _name, _baseline in (
    ("classifier only", Baseline("last")),
    ("bias only", Baseline("bias")),
    ("norm + bias, running statistics", Baseline("norm", _running)),
    ("norm + bias, re-estimated statistics", Baseline("norm", _reestimated)),
    ("norm + bias", Baseline("norm")),  # norms in train mode (batch statistics)
    ("last blocks", Baseline("lastk")),
    ("TinyTL (lite residual + bias)", Baseline("tinytl-lb")),
    ("MobileTL", Baseline("mobiletl")),
    ("full fine-tuning", Baseline("full")),
):
    BASELINES.add(_name, _baseline)
