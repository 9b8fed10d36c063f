"""The optimizers memplan trains with and counts, in one table: a name maps to how the optimizer
is built and how much state it keeps.

``states``: fp32 state tensors the optimizer keeps per trainable element between steps (SGD
without momentum none, SGD with momentum its velocity, Adam its two moments). Training
(:func:`make_optimizer`: contribution runs, the linear probe, ``verify``, benchmarks) and
accounting (``memplan.accounting.engine``: ``optimizer_bytes``, ``tinytraining``'s state bits) read the
same entry, so a profile never counts another optimizer than the one that trains.

Given a model and a scheme, :func:`make_optimizer` trains each parameter family at the scheme's
rate for it (:mod:`memplan.rates`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from . import names
from .errors import BadOption
from .rates import FAMILIES, Rates, param_groups
from .registry import Registry

#: SGD momentum of ``sgd-momentum``
MOMENTUM = 0.9
#: the ``momentum`` that contribution profiles written before ``optimizer`` stored -> the optimizer it meant
LEGACY_MOMENTUM = {0.0: "sgd", MOMENTUM: "sgd-momentum"}


@dataclass(frozen=True)
class OptimizerSpec:
    """One optimizer: ``build(param_groups, lr, weight_decay)`` and its ``states`` per trainable element."""

    name: str
    states: int
    build: Callable[[list[Any], float, float], torch.optim.Optimizer]
    description: str


#: optimizer name -> how it is built and the state it keeps
OPTIMIZERS: Registry[OptimizerSpec] = Registry("optimizer", names=names.OPTIMIZERS)


def register(name: str, states: int, description: str):
    """Decorator registering ``build(groups, lr, weight_decay)`` under ``name``."""

    def decorate(build: Callable[[list[Any], float, float], torch.optim.Optimizer]):
        OPTIMIZERS.add(name, OptimizerSpec(name, states, build, description))
        return build

    return decorate


@register("sgd", 0, "SGD without momentum (the 256KB paper's choice): no state")
def _sgd(groups: list[Any], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(groups, lr=lr, momentum=0.0, weight_decay=weight_decay)


@register("sgd-momentum", 1, f"SGD with momentum {MOMENTUM}: one velocity buffer per trainable element")
def _sgd_momentum(groups: list[Any], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(groups, lr=lr, momentum=MOMENTUM, weight_decay=weight_decay)


class QASSGD(torch.optim.SGD):
    """SGD with Quantization-Aware Scaling (Lin et al., NeurIPS 2022, section 2.1): before each
    step, the gradient of every quantized tensor is divided by ``s ** 2``, ``s`` being what one
    unit of it is worth in real values (``qas_scale``, per output channel: ``w_scales`` for an
    int8 weight, ``w_scales * x_scale`` for an int32 bias; set by
    :class:`memplan.models.int8.QuantConv2d`). The weight/gradient norm ratio of the int8 graph
    then matches the fp32 graph's. Tensors without a scale (the fp32 head) are left as they are."""

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        for group in self.param_groups:
            for p in group["params"]:
                scale = getattr(p, "qas_scale", None)
                if p.grad is not None and scale is not None:
                    p.grad.div_(scale.to(p.grad).view(-1, *[1] * (p.dim() - 1)).square())
        return super().step(closure)


@register("sgd-qas", 0, "SGD without momentum + QAS (the 256KB paper's main setting): no state")
def _sgd_qas(groups: list[Any], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    return QASSGD(groups, lr=lr, momentum=0.0, weight_decay=weight_decay)


@register("sgd-momentum-qas", 1, f"SGD with momentum {MOMENTUM} + QAS: one velocity buffer per trainable element")
def _sgd_momentum_qas(groups: list[Any], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    return QASSGD(groups, lr=lr, momentum=MOMENTUM, weight_decay=weight_decay)


@register("adam", 2, "Adam (betas 0.9, 0.999): two moment buffers per trainable element")
def _adam(groups: list[Any], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(groups, lr=lr, weight_decay=weight_decay)


def states(name: str) -> int:
    """State tensors per trainable element of optimizer ``name`` (a one-line error when unknown)."""
    return OPTIMIZERS.choose(name).states


def make_optimizer(
    params: torch.nn.Module | Iterable[Tensor] | Iterable[dict[str, Any]],
    name: str | None = None,
    lr: float | None = None,
    *,
    weight_decay: float = 0.0,
    scheme: Any = None,
) -> torch.optim.Optimizer:
    """Optimizer ``name`` (:data:`OPTIMIZERS`) over the parameters of ``params`` that require grad
    (the others are left out, so they never change). ``params``: a model, tensors, or torch
    parameter groups (dicts with ``params`` and, say, their own ``lr``). ``scheme``: a
    ``memplan.plan.Scheme`` whose ``training`` (what ``memplan search --validate`` measured) gives
    the optimizer and rate that ``name`` / ``lr`` leave out; given a model, its per-family rates
    too (:func:`param_groups`: the scheme's ``training.rates``, the head ``training.classifier``).
    Without a scheme: ``sgd`` at 0.01."""
    training = getattr(scheme, "training", None)
    recorded = (training.optimizer if training else None) or getattr(scheme, "optimizer", None)
    name = name or recorded or names.DEFAULT_OPTIMIZER
    spec = OPTIMIZERS.choose(name)
    if isinstance(params, torch.nn.Module):
        if lr is None and training is not None and training.rates:
            rates = Rates(**{f: training.rates.get(f, training.lr) for f in FAMILIES})
            items: list[Any] = param_groups(params, rates, training.classifier)
        else:
            items = list(params.parameters())
    else:
        items = list(params)
    lr = lr if lr is not None else (training.lr if training else 0.01)
    if items and isinstance(items[0], dict):
        groups: list[Any] = [{**g, "params": [p for p in g["params"] if p.requires_grad]} for g in items]
        groups = [g for g in groups if g["params"]]
    else:
        groups = [p for p in items if p.requires_grad]
    if not groups:
        raise BadOption("nothing to train: no parameter requires grad")
    return spec.build(groups, lr, weight_decay)
