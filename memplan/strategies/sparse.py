"""Strategy ``sparse``: the 256KB paper's sparse update from a scheme (``memplan.plan.scheme``)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Union

from ..errors import BadOption, SchemeError
from ..graph import LayerGraph
from ..io import read_json
from ..plan import Plan, scheme_to_plan
from .base import strategy

if TYPE_CHECKING:
    from ..plan import Scheme

SchemeSource = Union[str, os.PathLike, dict[str, Any], "Scheme"]


def resolve_scheme(graph: LayerGraph, scheme: SchemeSource) -> Scheme:
    """A :class:`Scheme` from a file path, a dict or a Scheme. Files and dicts may hold memplan's
    scheme JSON or tiny-training's ``backward_config`` (told apart by their keys)."""
    from ..plan import Scheme, is_backward_config, scheme_from_dict  # pydantic only where a scheme is read

    if isinstance(scheme, Scheme):
        return scheme
    source = "scheme"
    if not isinstance(scheme, dict):
        source = f"scheme file {scheme}"
        scheme = read_json(scheme, "scheme file", SchemeError)
    if is_backward_config(scheme):
        return Scheme.from_backward_config(scheme, graph)
    return scheme_from_dict(scheme, source)


@strategy(
    "sparse",
    "sparse update from --scheme (memplan scheme JSON or tiny-training backward_config): biases "
    "of the last n convs, chosen conv weights at channel ratios, classifier",
    ("scheme",),
    conv_update_table=True,
)
def sparse(graph: LayerGraph, scheme: SchemeSource | None = None) -> Plan:
    if scheme is None:
        raise BadOption(
            "method 'sparse' needs --scheme FILE", "a memplan scheme JSON or a tiny-training backward_config"
        )
    return scheme_to_plan(graph, resolve_scheme(graph, scheme))
