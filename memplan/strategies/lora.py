"""LoRA as a strategy (``--method lora -o rank=R -o targets=query,value -o alpha=A``) and as an
architecture option every strategy accepts (``-o lora=true -o lora_rank=R ...``: the adapters built,
the strategy deciding what trains; what a scheme's ``added_modules`` records).

The transform (``memplan.nn.lora.add_lora``) adds peft's adapters to the linear and conv layers
named by ``targets`` (peft's ``target_modules`` rule: a qualname or its last parts; default: every
linear and conv layer but the classifier); the strategy trains the adapters and the classifier (a
``peft`` model: ``LoraConfig(modules_to_save=[classifier])``), the base stays frozen, its norms
included (eval mode: running statistics, as every memplan strategy with a frozen backbone keeps
them; a peft model whose BatchNorms are put in eval mode). A scheme carries the adapters as
``added_modules`` (architecture ``lora``, with every option), so ``apply_scheme`` builds them again
on the plain model.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch.nn as nn

from ..errors import BadOption
from ..graph import LayerGraph
from ..nn.lora import LORA_ATTR, add_lora
from ..plan import Plan
from .architecture import flag
from .base import architecture, full_train, strategy, train_classifier

#: options of the ``lora`` strategy, and of the ``lora`` architecture option under its names
LORA_OPTIONS = ("rank", "targets", "alpha")
ARCHITECTURE_OPTIONS = ("lora", "lora_rank", "lora_targets", "lora_alpha")


def _targets(targets: str | Sequence[str] | None) -> list[str] | None:
    """Target names from ``-o targets=a,b`` or a list; None for the default."""
    if targets is None:
        return None
    names = targets.split(",") if isinstance(targets, str) else list(targets)
    names = [str(n).strip() for n in names if str(n).strip()]
    if not names:
        raise BadOption("--targets names no module", "e.g. -o targets=query,value")
    return names


def lora_transform(
    model: nn.Module, rank: int = 8, targets: str | Sequence[str] | None = None, alpha: float = 8
) -> nn.Module:
    """LoRA adapters of rank ``rank`` (scaled by ``alpha / rank``) on the layers ``targets`` names."""
    return add_lora(model, rank=rank, alpha=alpha, targets=_targets(targets))


def lora_added(**options: Any) -> dict[str, Any]:
    """The record of the adapters ``lora_transform`` builds with ``options`` (``Plan.added``,
    ``Scheme.added_modules``): the ``lora`` architecture option with every option filled in."""
    defaults = {k: p.default for k, p in inspect.signature(lora_transform).parameters.items() if k in LORA_OPTIONS}
    given = {**defaults, **options}
    return {
        "architecture": "lora",
        "options": {
            "lora": True,
            "lora_rank": given["rank"],
            "lora_targets": _targets(given["targets"]),
            "lora_alpha": given["alpha"],
        },
        "tag": LORA_ATTR,
    }


@architecture(
    "lora",
    "lora=true: LoRA adapters as peft builds them (lora_rank 8, lora_alpha 8, lora_targets: module names; "
    "default every linear and conv layer but the classifier)",
    ARCHITECTURE_OPTIONS,
    added=lambda lora=False, **o: (
        lora_added(**{k.removeprefix("lora_"): v for k, v in o.items()}) if flag("lora", lora) else None
    ),
)
def lora_option(
    model: nn.Module,
    lora: bool = False,
    lora_rank: int = 8,
    lora_targets: str | Sequence[str] | None = None,
    lora_alpha: float = 8,
) -> nn.Module:
    return lora_transform(model, lora_rank, lora_targets, lora_alpha) if flag("lora", lora) else model


@strategy(
    "lora",
    "LoRA: low-rank adapters (peft's) on linear / conv layers (-o rank=8, -o targets=a,b, -o alpha=8) + "
    "classifier; the base frozen, norms in eval mode (frozen statistics)",
    transform=lora_transform,
    transform_options=LORA_OPTIONS,
    added=lora_added,
)
def lora(graph: LayerGraph) -> Plan:
    adapters = [n for n in graph.param_nodes() if LORA_ATTR in n.tags]
    if not adapters:
        raise BadOption(
            "method 'lora' found no LoRA adapter in the model",
            "profile it through memplan.profile / the CLI, which add the adapters first",
        )
    if LORA_ATTR in graph.classifier.tags:
        raise BadOption(
            f"lora target {graph.classifier.name.rpartition('.')[0]!r} is the classifier, which trains whole",
            "leave it out of -o targets",
        )
    train = train_classifier(graph, {n.name: full_train(n) for n in adapters})
    return Plan("lora", train)
