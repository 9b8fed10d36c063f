"""TinyTL's strategies (Cai et al., NeurIPS 2020, Table 2): ``tinytl-b``, ``tinytl-l``, ``tinytl-lb``.

* ``tinytl-b``: every bias and norm shift + classifier, norms in eval mode (the ``bias``
  strategy under TinyTL's name);
* ``tinytl-l``: the lite residual branches train fully (convs, norm scale + shift, norms in
  train mode) + classifier; the backbone is frozen;
* ``tinytl-lb``: ``tinytl-l`` plus every bias and norm shift of the backbone.

The ``-l`` variants add the branches first (``memplan.nn.transforms.add_lite_residual``) with the
transform options ``lite_kernel`` (5), ``lite_groups`` (2), ``lite_downsample`` (2),
``lite_norm`` ("batch" / "group"; default: the kind the block uses) and ``lite_blocks``
(``memplan.strategies.architecture``). TinyTL's own setting also
swaps every BatchNorm for GroupNorm: ``--norm group``.
"""

from __future__ import annotations

from typing import Any

from ..errors import BadOption
from ..graph import LayerGraph
from ..graph.kinds import NORM_KINDS
from ..nn.transforms import is_lite
from ..plan import Plan, Train
from .architecture import LITE_OPTIONS, lite_added, lite_transform
from .base import always, bias, full_train, on_blocks, strategy, train_classifier


def _lite_plan(graph: LayerGraph, method: str, biases: bool) -> Plan:
    lite = [n for n in graph.param_nodes() if is_lite(n)]
    if not lite:
        raise BadOption(
            f"method {method!r} found no lite residual branch in the model",
            "profile it through memplan.profile / the CLI, which add the branches first",
        )
    train = {n.name: Train(0.0, True) for n in graph.param_nodes() if biases and "bias" in n.params}
    train.update({n.name: full_train(n) for n in lite})
    return Plan(method, train_classifier(graph, train), {n.name for n in lite if n.kind in NORM_KINDS})


def _lite_fits(graph: LayerGraph) -> dict[str, Any] | None:
    """Compared on models with blocks whose input is at least 64 px (the branches' pooling has no padding)."""
    return {} if on_blocks(graph) is not None and min(graph.input_shape[2:], default=0) >= 64 else None


@strategy(
    "tinytl-b",
    "TinyTL-B: every bias and norm shift + classifier; norms in eval mode (frozen statistics)",
    compare=(4, always),
)
def tinytl_b(graph: LayerGraph) -> Plan:
    plan = bias(graph)
    plan.method = "tinytl-b"
    return plan


@strategy(
    "tinytl-l",
    "TinyTL-L: lite residual branches (added to every block but the first) + classifier; "
    "backbone frozen, branch norms use batch statistics",
    transform=lite_transform,
    transform_options=LITE_OPTIONS,
    compare=(5, _lite_fits),
    added=lite_added,
)
def tinytl_l(graph: LayerGraph) -> Plan:
    return _lite_plan(graph, "tinytl-l", biases=False)


@strategy(
    "tinytl-lb",
    "TinyTL-L+B: lite residual branches + every bias and norm shift + classifier; "
    "backbone norms in eval mode, branch norms use batch statistics",
    transform=lite_transform,
    transform_options=LITE_OPTIONS,
    compare=(6, _lite_fits),
    added=lite_added,
)
def tinytl_lb(graph: LayerGraph) -> Plan:
    return _lite_plan(graph, "tinytl-lb", biases=True)
