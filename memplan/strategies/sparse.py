"""Strategy ``sparse``: the 256KB paper's sparse update from a scheme (``memplan.plan.scheme``).

A scheme with ``added_modules`` (TinyTL's lite residual branches) has them built by the
strategy's transform (:func:`scheme_transform`) before the model is traced, so ``memplan profile
MODEL --method sparse --scheme FILE`` costs the plain model with the scheme's architecture.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Union

import torch.nn as nn

from ..errors import BadOption, SchemeError
from ..graph import LayerGraph
from ..io import read_json
from ..plan import Plan, scheme_to_plan
from .base import add_architecture, strategy

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


def added_modules_of(scheme: SchemeSource | None) -> list[Any]:
    """The ``added_modules`` of a scheme (a Scheme, a dict or a file; a ``backward_config`` has none)."""
    from ..plan import Scheme, is_backward_config, scheme_from_dict

    if scheme is None:
        return []
    if isinstance(scheme, Scheme):
        return list(scheme.added_modules)
    source = "scheme" if isinstance(scheme, dict) else f"scheme file {scheme}"
    data = scheme if isinstance(scheme, dict) else read_json(scheme, "scheme file", SchemeError)
    return [] if is_backward_config(data) else list(scheme_from_dict(data, source).added_modules)


def scheme_transform(
    model: nn.Module, scheme: SchemeSource | None = None, input_shape: Sequence[int] | None = None
) -> nn.Module:
    """Build the scheme's ``added_modules`` on ``model`` (``memplan.strategies.add_architecture``,
    at the per-sample ``input_shape``); the model as it is for a scheme without them."""
    added = added_modules_of(scheme)
    return add_architecture(model, added, input_shape) if added else model


@strategy(
    "sparse",
    "sparse update from --scheme (memplan scheme JSON or tiny-training backward_config): biases "
    "of the last n convs, chosen conv weights at channel ratios, norm modes, added modules (TinyTL's "
    "lite residual branches), classifier",
    ("scheme",),
    transform=scheme_transform,
    transform_options=("scheme",),
    conv_update_table=True,
    changes=lambda scheme=None: bool(added_modules_of(scheme)),
)
def sparse(graph: LayerGraph, scheme: SchemeSource | None = None) -> Plan:
    if scheme is None:
        raise BadOption(
            "method 'sparse' needs --scheme FILE", "a memplan scheme JSON or a tiny-training backward_config"
        )
    return scheme_to_plan(graph, resolve_scheme(graph, scheme))
