"""The way back from a lean module to the module it replaced.

``LeanX.from_module(m)`` keeps ``m`` on the lean module (:func:`remember`), outside its module
tree: not a submodule, so it adds no state_dict key and no parameter. :func:`restore` gives that
module back holding the lean module's current parameters and buffers (the same objects, so an
optimiser keeps them), with a sub-channel update folded into its weight: the lean module's
``state_dict`` is the plain module's, key for key.
"""

from __future__ import annotations

import torch.nn as nn

from ...errors import BadOption

#: ``__dict__`` key of the module a lean module replaced
ORIGINAL_ATTR = "_memplan_original"


def remember(lean: nn.Module, original: nn.Module) -> nn.Module:
    """Keep ``original`` on ``lean`` for :func:`restore`; returns ``lean``."""
    lean.__dict__[ORIGINAL_ATTR] = original
    return lean


def restore(lean: nn.Module) -> nn.Module:
    """The module ``lean`` replaced, holding ``lean``'s trained state (``lean.state_dict``: a
    sub-channel update folded into the weight, which then trains whole if ``weight_sel`` did) and
    its train / eval flag. Raises ``BadOption`` for a lean module built without ``from_module``."""
    original = lean.__dict__.get(ORIGINAL_ATTR)
    if original is None:
        raise BadOption(
            f"{type(lean).__name__} was not built by from_module: there is no plain module to restore",
            "build lean modules with LeanX.from_module(module) (apply_plan does)",
        )
    state = lean.state_dict(keep_vars=True)
    expected = set(original.state_dict(keep_vars=True))
    if set(state) != expected:
        raise RuntimeError(f"{type(lean).__name__} state {sorted(state)} is not {type(original).__name__}'s")
    for name, value in state.items():
        if name in original._parameters:
            original._parameters[name] = value if isinstance(value, nn.Parameter) else nn.Parameter(value)
        else:
            original._buffers[name] = value
    original.train(lean.training)
    return original
