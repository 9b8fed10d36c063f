"""The hand-picked baselines a plan must beat, each one point of the scheme space.

One entry per baseline: the plan a user would pick by hand, a strategy's (``memplan.strategies``)
on the model as that strategy's architecture transform builds it (TinyTL's lite residual
branches), changed by ``adjust`` where the baseline is a variant. ``Scheme.from_plan`` writes it as
a scheme (added modules as ``added_modules``), so the validation stage
(``memplan.search.stage``) trains it, costs it and returns it exactly like a searched scheme.

A *sized* baseline is a family of plans, one per size k = 1 .. the model's convs, each training
more than the one before (``Baseline.sized``): "every bias + the weights of the last k convs"
and "the biases of the last k convs", the natural hand-made schemes of the sparse-update space.
Where it competes at a budget it is the largest k that fits (:func:`largest`); a size rule
(:data:`SIZE_RULES`) says which smaller sizes compete beside it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .. import names
from ..graph import LayerGraph, conv_layers
from ..plan import Plan, Scheme, WeightUpdate, fingerprint, scheme_to_plan
from ..registry import Registry
from ..strategies import make_plan


@dataclass(frozen=True)
class Baseline:
    """Strategy ``method``'s plan on the graph of the model captured with ``method`` (its
    architecture transform, if any, applied), changed by ``adjust(graph, plan)`` (None: as it is).
    ``sized(graph, k)``: instead, the k-th plan of a sized baseline (module docstring), k = 1 ..
    :meth:`sizes`."""

    method: str
    adjust: Callable[[LayerGraph, Plan], Plan] | None = None
    sized: Callable[[LayerGraph, int], Plan] | None = None

    def sizes(self, graph: LayerGraph) -> int:
        """How many plans a sized baseline has on ``graph`` (its convs); 0 for a plain one."""
        return 0 if self.sized is None else len(conv_layers(graph))

    def plan(self, graph: LayerGraph, k: int | None = None) -> Plan:
        """The plan (a sized baseline's k-th, its largest when ``k`` is None)."""
        if self.sized is not None:
            return self.sized(graph, self.sizes(graph) if k is None else k)
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


def _bias_scheme(graph: LayerGraph, bias_update: int, weights: int) -> Plan:
    """The plan of the scheme that trains the biases of the last ``bias_update`` convs and the whole
    weights of the last ``weights`` convs (and the classifier)."""
    convs = conv_layers(graph)
    first = len(convs) - weights
    scheme = Scheme(
        model=graph.model_name,
        fingerprint=fingerprint(graph),
        input_shape=list(graph.input_shape[1:]),
        bias_update=bias_update,
        weight_updates=[WeightUpdate(layer=c.name, conv_index=i, ratio=1.0) for i, c in enumerate(convs) if i >= first],
    )
    return scheme_to_plan(graph, scheme)


def _biases_and_last_weights(graph: LayerGraph, k: int) -> Plan:
    """Every bias (and norm shift) and the whole weights of the last ``k`` convs."""
    return _bias_scheme(graph, len(conv_layers(graph)), k)


def _last_biases(graph: LayerGraph, k: int) -> Plan:
    """The biases (and norm shifts) of the last ``k`` convs."""
    return _bias_scheme(graph, k, 0)


def sized_name(name: str, k: int) -> str:
    """The name of the k-th plan of the sized baseline registered as ``name``: ``name (k=4)``."""
    return f"{name} (k={k})"


def largest(fits: Callable[[int], bool], n: int) -> int:
    """The largest k in 1 .. ``n`` with ``fits(k)`` (0 when none), by bisection: a sized
    baseline's memory grows with k (each size trains a superset of the one before), so what fits is
    a prefix of the sizes. ``fits`` is asked about log2(n) + 1 sizes."""
    lo, hi = 0, n  # fits(lo) (or lo == 0); the answer is in lo .. hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _largest_only(k: int) -> list[int]:
    return [k]


def _ladder(k: int) -> list[int]:
    """``k``, then halved (rounding down) until 1: 45 -> 45, 22, 11, 5, 2, 1; log2(k) + 1 sizes."""
    out = []
    while k >= 1:
        out.append(k)
        k //= 2
    return out


#: name -> the sizes of a sized baseline that compete at a budget, from the largest k that fits it
#: (k >= 1), largest first: ``largest`` (that k alone) or ``ladder`` (k, k // 2, ..., 1)
SIZE_RULES: Registry[Callable[[int], list[int]]] = Registry("size rule", names=names.SIZE_RULES)
SIZE_RULES.add("largest", _largest_only)
SIZE_RULES.add("ladder", _ladder)


for _name, _baseline in (
    ("classifier only", Baseline("last")),
    ("bias only", Baseline("bias")),
    ("norm + bias, running statistics", Baseline("norm", _running)),
    ("norm + bias, re-estimated statistics", Baseline("norm", _reestimated)),
    ("norm + bias", Baseline("norm")),  # norms in train mode (batch statistics)
    ("last blocks", Baseline("lastk")),
    ("TinyTL lite-residual + bias", Baseline("tinytl-lb")),
    ("MobileTL", Baseline("mobiletl")),
    ("full fine-tuning", Baseline("full")),
    ("every bias + last-k conv weights", Baseline("bias", sized=_biases_and_last_weights)),
    ("biases of the last k convs", Baseline("bias", sized=_last_biases)),
):
    BASELINES.add(_name, _baseline)
