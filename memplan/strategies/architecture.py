"""Architecture transforms every strategy accepts (``memplan.strategies.base.TRANSFORMS``).

The seeds compare strategies on changed networks; each change is an option of any method,
applied to the model before tracing (and by ``apply_strategy`` on a real model):

* ``remove_se=true``: drop every squeeze-and-excitation module (MobileTL Table 4, "remove-SE");
* ``activation=relu``: every activation module but gates becomes ReLU (or relu6, hardswish,
  ...; TinyTL uses ReLU, MobileTL Table 4's "ReLU" row swaps MobileNetV3's h-swish);
* ``lite=true``: TinyTL's lite residual branches (``lite_kernel`` 5, ``lite_groups`` 2,
  ``lite_downsample`` 2, ``lite_norm`` batch / group) in every block but the first, or in the
  last ``lite_blocks`` blocks (MobileTL Table 5's patches on its three trained blocks).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch.nn as nn

from ..errors import BadOption
from ..graph import find_blocks
from ..nn import transforms
from ..nn.transforms import DEFAULT_SAMPLE_SHAPE, LITE_ATTR
from .base import architecture, positive

#: options of the lite residual branches (``lite_transform``)
LITE_OPTIONS = ("lite_kernel", "lite_groups", "lite_downsample", "lite_norm", "lite_blocks")


@architecture("remove_se", "remove_se=true: drop every squeeze-and-excitation module", ("remove_se",))
def remove_se_option(model: nn.Module, remove_se: bool = False) -> nn.Module:
    return transforms.remove_se(model) if flag("remove_se", remove_se) else model


@architecture(
    "activation", "activation=NAME: every activation module but gates becomes NAME (e.g. relu)", ("activation",)
)
def activation_option(model: nn.Module, activation: str | None = None) -> nn.Module:
    return model if activation is None else transforms.swap_activation(model, activation)


def lite_transform(
    model: nn.Module,
    lite_kernel: int = 5,
    lite_groups: int = 2,
    lite_downsample: int = 2,
    lite_norm: str | None = None,
    lite_blocks: int | None = None,
    input_shape: Sequence[int] = DEFAULT_SAMPLE_SHAPE,
) -> nn.Module:
    """``add_lite_residual`` under the strategies' option names; ``lite_blocks`` = K puts the
    branches in the last K blocks (default: every block but the first). ``input_shape``: the
    per-sample input the block shapes are traced at (the pipeline passes the model's)."""
    names = None
    if lite_blocks is not None:
        blocks = find_blocks(model)
        names = blocks[-positive("lite_blocks", lite_blocks, len(blocks) or None) :]
    return transforms.add_lite_residual(
        model,
        kernel=lite_kernel,
        groups=lite_groups,
        downsample=lite_downsample,
        norm=lite_norm,
        blocks=names,
        input_shape=input_shape,
    )


def lite_added(lite: bool = True, **options: Any) -> dict[str, Any] | None:
    """The record of the lite residual branches built with ``options`` (``Plan.added``,
    ``Scheme.added_modules``): the ``lite`` transform with every option, defaults filled in, so
    that a later change of a default does not change what a scheme builds. None for ``lite=false``."""
    if not flag("lite", lite):
        return None
    defaults = {k: p.default for k, p in inspect.signature(lite_transform).parameters.items() if k in LITE_OPTIONS}
    return {"architecture": "lite", "options": {"lite": True, **defaults, **options}, "tag": LITE_ATTR}


@architecture(
    "lite",
    "lite=true: TinyTL lite residual branches (lite_kernel, lite_groups, lite_downsample, "
    "lite_norm; lite_blocks=K: in the last K blocks only)",
    ("lite", *LITE_OPTIONS),
    added=lambda lite=False, **options: lite_added(lite, **options),
)
def lite_option(
    model: nn.Module, lite: bool = False, input_shape: Sequence[int] = DEFAULT_SAMPLE_SHAPE, **options
) -> nn.Module:
    return lite_transform(model, input_shape=input_shape, **options) if flag("lite", lite) else model


def flag(name: str, value: object) -> bool:
    """``value`` of the boolean option ``name``; anything but true / false is a one-line BadOption."""
    if not isinstance(value, bool):
        raise BadOption(f"--{name.replace('_', '-')} must be true or false, got {value!r}")
    return value
