"""LoRA (Hu et al., ICLR 2022) as an architecture transform: a low-rank adapter beside a frozen linear
or conv layer, built the way ``peft``'s ``LoraConfig`` builds it (``peft.tuners.lora.layer``), so
that a model with memplan's adapters computes, saves for backward and trains what ``peft``'s does:

* ``nn.Linear(in, out)``: ``base(x) + lora_B(lora_A(x)) * alpha / rank`` (``x`` cast to the
  adapter's dtype first, as peft does: a copy where it differs, under autocast) with
  ``lora_A = nn.Linear(in, rank, bias=False)``, ``lora_B = nn.Linear(rank, out, bias=False)``;
* ``nn.ConvNd``: ``lora_A`` a conv of the base's kernel, stride and padding to ``rank`` channels,
  ``lora_B`` a 1x1 conv back to the output channels in the base's groups (peft's rule: the rank a
  multiple of the groups);
* ``lora_A`` takes the Kaiming-uniform initialisation of ``nn.Linear`` (drawn from a fixed seed, the
  caller's generator left alone), ``lora_B`` starts at zero: the model computes what it did before.

:class:`LoRA` wraps the layer (``WRAP_ATTR``: ``base``, so names map back to the plain model's) and
tags its adapters (``TAG_ATTR``: :data:`LORA_ATTR`); its ``state_dict`` keeps the layer's own keys
(``q.weight``, not ``q.base.weight``) beside the adapters' (``q.lora_A.weight``), as the lite
residual's does (``memplan.nn.transforms.LiteResidual``). Real and meta-device models alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn as nn

from ..errors import BadOption
from ..graph.model import TAG_ATTR, WRAP_ATTR

#: the adapters' tag (``graph.model.TAG_ATTR``): every node captured inside one carries it
LORA_ATTR = "lora"
#: layers LoRA adapts
LORA_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
#: seed of the adapters' initialisation
LORA_SEED = 0


class LoRA(nn.Module):
    """``base(x) + lora_B(lora_A(x)) * scaling``: a linear / conv layer with its LoRA adapter."""

    def __init__(self, base: nn.Module, rank: int, alpha: float):
        super().__init__()
        self.base = base
        self.scaling = alpha / rank
        kw = {"device": base.weight.device, "dtype": base.weight.dtype, "bias": False}
        if isinstance(base, nn.Linear):
            self.lora_A = nn.Linear(base.in_features, rank, **kw)
            self.lora_B = nn.Linear(rank, base.out_features, **kw)
        else:
            conv = type(base)
            ones = (1,) * len(base.kernel_size)
            self.lora_A = conv(base.in_channels, rank, base.kernel_size, base.stride, base.padding, **kw)
            self.lora_B = conv(rank, base.out_channels, ones, ones, groups=base.groups, **kw)
        for adapter in (self.lora_A, self.lora_B):
            setattr(adapter, TAG_ATTR, LORA_ATTR)
        setattr(self, WRAP_ATTR, "base")
        if not base.weight.is_meta:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(LORA_SEED)
                nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
            nn.init.zeros_(self.lora_B.weight)
        self.register_state_dict_post_hook(_unwrap_keys)
        self.register_load_state_dict_pre_hook(_wrap_keys)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # peft casts the adapter's input to the adapter's dtype (a copy, under autocast, of a half one)
        return self.base(x) + self.lora_B(self.lora_A(x.to(self.lora_A.weight.dtype))) * self.scaling


def _unwrap_keys(module: LoRA, state: dict, prefix: str, _metadata: dict) -> None:
    """state_dict hook: the wrapped layer's entries under its own name (``prefix``), the adapters' after."""
    inner = prefix + "base."
    for k in [k for k in state if k.startswith(prefix)]:
        value = state.pop(k)
        state[prefix + k[len(inner) :] if k.startswith(inner) else k] = value
    meta = getattr(state, "_metadata", None)
    if meta is not None and inner[:-1] in meta:
        meta.pop(inner[:-1])


def _wrap_keys(_module: LoRA, state: dict, prefix: str, *_args) -> None:
    """load_state_dict pre-hook: the layer's entries given under its own name go to ``base``."""
    for k in [k for k in state if k.startswith(prefix) and not k.startswith((prefix + "lora_", prefix + "base."))]:
        state[prefix + "base." + k[len(prefix) :]] = state.pop(k)


def matches(name: str, targets: Sequence[str]) -> bool:
    """peft's rule for a list of target names: the module's qualname is one, or ends with ``.`` + one."""
    return any(name == t or name.endswith("." + t) for t in targets)


def _misfits(layer: nn.Module, rank: int) -> bool:
    """A grouped conv whose groups do not divide ``rank`` (peft adapts only those that do)."""
    return not isinstance(layer, nn.Linear) and rank % layer.groups != 0


def lora_layers(model: nn.Module, rank: int, targets: Sequence[str] | None = None) -> list[str]:
    """Qualnames of the layers ``add_lora`` adapts: those named by ``targets`` (BadOption for one that
    is no linear or conv layer, or a grouped conv whose groups do not divide ``rank``; or for none
    at all); by default every linear and conv layer but the last one (the classifier) and the
    grouped convs whose groups do not divide ``rank``."""
    layers = [(q, m) for q, m in model.named_modules() if type(m) in LORA_LAYERS and q]
    if targets is None:
        return [q for q, m in layers[:-1] if not _misfits(m, rank)]
    picked = [(q, m) for q, m in model.named_modules() if q and matches(q, targets)]
    for q, m in picked:
        if type(m) not in LORA_LAYERS:
            raise BadOption(f"lora target {q!r} is a {type(m).__name__}", "LoRA adapts nn.Linear and nn.Conv1d/2d/3d")
        if _misfits(m, rank):
            raise BadOption(f"lora target {q!r} has groups={m.groups}, which does not divide rank {rank}")
    if not picked:
        raise BadOption(
            f"no module matches the lora targets {', '.join(targets)}",
            "name linear / conv modules by qualname or its last parts (e.g. targets=query,value)",
        )
    return [q for q, _ in picked]


def add_lora(model: nn.Module, rank: int = 8, alpha: float = 8, targets: Sequence[str] | None = None) -> nn.Module:
    """Wrap the layers :func:`lora_layers` picks in :class:`LoRA` (in place); returns the model.
    ``alpha``: peft's ``lora_alpha`` (the adapter's output is scaled by ``alpha / rank``)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise BadOption(f"--rank must be a positive integer, got {rank!r}")
    for qual in lora_layers(model, rank, targets):
        parent, _, child = qual.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, child, LoRA(getattr(owner, child), rank, alpha))
    return model
