"""What a sparse-update scheme given as a path, a dict or a :class:`~memplan.plan.scheme.Scheme` records
about where it was planned: the per-sample input shape, the optimizer and the micro-batches; and
:func:`planned_for`, the guard that names a model failing at that input shape as not the one the
scheme was planned for."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import InputShapeError, SchemeError
from ..io import read_json
from .scheme import Scheme


def scheme_data(scheme: Any) -> dict[str, Any] | None:
    """A scheme given as a path or a dict, read as JSON (None for None or a ``Scheme``)."""
    if scheme is None or isinstance(scheme, Scheme):
        return None
    return scheme if isinstance(scheme, dict) else read_json(scheme, "scheme file", SchemeError)


def scheme_input_shape(scheme: Any) -> tuple[int, ...] | None:
    """The per-sample input shape a scheme (a path, a dict or a :class:`~memplan.plan.Scheme`) was
    planned at; None for none given and for tiny-training's backward_config, which records none."""
    if isinstance(scheme, Scheme):
        return tuple(scheme.input_shape)
    data = scheme_data(scheme)
    shape = data.get("input_shape") if data is not None else None
    if isinstance(shape, list) and shape and all(isinstance(d, int) and d > 0 for d in shape):
        return tuple(shape)
    return None


def scheme_micro_batches(scheme: Any) -> int:
    """How many micro-batches a scheme (a path, a dict or a :class:`~memplan.plan.Scheme`) trains its
    batch in (``execution.micro_batches``); 1 for none recorded."""
    if isinstance(scheme, Scheme):
        return scheme.execution.micro_batches if scheme.execution is not None else 1
    data = scheme_data(scheme)
    execution = data.get("execution") if data is not None else None
    count = execution.get("micro_batches", 1) if isinstance(execution, dict) else 1
    return count if isinstance(count, int) and count > 0 else 1


@contextmanager
def planned_for(scheme: Any, *, shape_given: bool = False) -> Iterator[None]:
    """A model failing at a scheme's recorded input shape is not the one it was planned for (that one ran
    there): such a failure in the block is raised as a ``SchemeError`` ("scheme was planned for X"); with
    ``shape_given`` (the shape is not the scheme's), without a scheme or a recorded shape, as it is."""
    try:
        yield
    except InputShapeError as exc:
        if shape_given or scheme_input_shape(scheme) is None:
            raise
        planned = scheme.model if isinstance(scheme, Scheme) else (scheme_data(scheme) or {}).get("model")
        raise SchemeError(
            f"scheme was planned for {planned or 'another model'} at input "
            f"{'x'.join(map(str, scheme_input_shape(scheme)))}; {exc.message}",
            "use a scheme planned for this model (memplan search MODEL --out FILE), or give the input shape "
            "(--input-shape C,H,W) if it is this model's",
        ) from None


def scheme_optimizer(scheme: Any) -> str | None:
    """The optimizer a scheme (a path or a :class:`~memplan.plan.Scheme`) records, if any."""
    if isinstance(scheme, Scheme):
        return scheme.optimizer
    data = scheme_data(scheme)
    if data is None:
        return None
    value = data.get("optimizer")  # memplan's scheme JSON; tiny-training's backward_config has none
    return value if isinstance(value, str) else None
