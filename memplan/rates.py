"""Learning rates per parameter *family*: ``classifier`` (the head), ``bias`` (conv and linear
biases, norm shifts), ``norm`` (norm scales and other 1-D scales) and ``weight`` (conv and linear
weights).

Adam-trained shifts pay only at rates that make early conv weights diverge (EfficientNet-Lite0 ->
Fashion-MNIST: all biases best at 1.25e-2 on validation, while schemes that add early conv weights
diverge there and train at 5e-4), so a scheme that mixes families trains each at its own rate
(:class:`Rates`); :func:`param_groups` sorts a model's trainable parameters into families. No
torch import: the CLI parses rates before it loads torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

from .errors import BadOption

#: parameter families, each trained at its own rate (:class:`Rates`)
FAMILIES = ("classifier", "bias", "norm", "weight")


@dataclass(frozen=True, order=True)
class Rates:
    """Learning rate of each parameter family (module docstring). Written as text, a bare rate sets
    every family and ``family=rate`` parts joined by ``/`` override it: ``2.5e-3`` (one rate for
    every tensor), ``1.25e-2/weight=5e-4`` (weights at 5e-4, everything else at 1.25e-2). The text
    form names the classifier's rate bare and every family that differs from it."""

    classifier: float
    bias: float
    norm: float
    weight: float

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, int | float) and v > 0 and math.isfinite(v)):
                raise BadOption(f"learning rate of {f.name} must be positive and finite, got {v!r}")

    @classmethod
    def uniform(cls, lr: float) -> Rates:
        """One rate for every family."""
        return cls(lr, lr, lr, lr)

    @classmethod
    def parse(cls, text: str) -> Rates:
        """``2.5e-3`` or ``1.25e-2/weight=5e-4`` (class docstring); a one-line error otherwise."""
        bare, named = None, {}
        for part in filter(None, (p.strip() for p in str(text).split("/"))):
            family, eq, value = part.rpartition("=")
            try:
                rate = float(value)
            except ValueError:
                hint = "e.g. 2.5e-3 or 1.25e-2/weight=5e-4"
                raise BadOption(f"cannot read learning rate {part!r} in {text!r}", hint) from None
            if not eq:
                bare = rate
            elif family.strip() in FAMILIES:
                named[family.strip()] = rate
            else:
                known = ", ".join(FAMILIES)
                raise BadOption(f"unknown parameter family {family.strip()!r} in {text!r}", f"one of {known}")
        if bare is None and set(named) != set(FAMILIES):
            raise BadOption(f"learning rates {text!r} need a bare rate for the families they do not name")
        return cls(**{f: named.get(f, bare) for f in FAMILIES})

    @classmethod
    def of(cls, value: Rates | float | str) -> Rates:
        """A :class:`Rates` from itself, one rate, or its text form."""
        if isinstance(value, Rates):
            return value
        return cls.uniform(float(value)) if isinstance(value, int | float) else cls.parse(value)

    def as_dict(self) -> dict[str, float]:
        return {f: getattr(self, f) for f in FAMILIES}

    @property
    def single(self) -> float | None:
        """The one rate when every family has it, else None."""
        return self.classifier if len(set(self.as_dict().values())) == 1 else None

    def restrict(self, families: Iterable[str]) -> Rates:
        """The same training for a model that trains only ``families`` (the classifier always): every
        other family takes the classifier's rate, so settings that differ only where nothing trains
        compare (and key) equal."""
        keep = set(families) | {"classifier"}
        return replace(self, **{f: self.classifier for f in FAMILIES if f not in keep})

    def __str__(self) -> str:
        own = "".join(f"/{f}={getattr(self, f):g}" for f in FAMILIES[1:] if getattr(self, f) != self.classifier)
        return f"{self.classifier:g}{own}"


def distinct(grid: Iterable[Rates], families: Iterable[str]) -> list[Rates]:
    """The distinct trainings of ``grid`` for a model that trains ``families``: points that differ
    only in a family it does not train are one (:meth:`Rates.restrict`), in grid order."""
    families = set(families)
    return list(dict.fromkeys(r.restrict(families) for r in grid))


def family_of(name: str, param: Any, classifier: str | None) -> str:
    """The family (:data:`FAMILIES`) of parameter ``name`` (a ``named_parameters`` name) of a model
    whose head is the module ``classifier``: the head's parameters, then any ``*bias``, then any
    other 1-D parameter (a norm's scale), then the weights."""
    if classifier is not None and (name == classifier or name.startswith(classifier + ".")):
        return "classifier"
    if name.endswith("bias"):
        return "bias"
    return "norm" if param.dim() <= 1 else "weight"


def param_groups(model: Any, rates: Rates, classifier: str | None) -> list[dict[str, Any]]:
    """The trainable parameters of ``model`` as torch parameter groups, one per family
    (:func:`family_of`), each at its rate of ``rates`` (empty families left out)."""
    groups: dict[str, list[Any]] = {f: [] for f in FAMILIES}
    for name, p in model.named_parameters():
        if p.requires_grad:
            groups[family_of(name, p, classifier)].append(p)
    return [{"params": ps, "lr": getattr(rates, f), "family": f} for f, ps in groups.items() if ps]


def outward(grid: Iterable[Rates], chosen: Rates) -> list[tuple[Rates, Rates]]:
    """Where ``chosen`` lies at an edge of ``grid``: for each such edge, the point one step beyond
    it and its neighbour inside the grid (empty when ``chosen`` is interior). A grid without edges
    widens by these points until its choice is interior. A uniform point (one rate for every
    family) lies on the line of the grid's uniform points; a per-family point on one line per
    family, the points equal to it in every other family. On a line of at least two rates,
    ``chosen`` at the lowest (highest) gets the point one step lower (higher), the step being the
    ratio of that edge to its neighbour (the grid's own spacing), rounded to 6 significant
    digits; a line of one rate has no edge."""
    grid = list(grid)
    if chosen.single is not None:
        lines = {None: [r.single for r in grid if r.single is not None]}
    else:
        lines = {
            f: [getattr(r, f) for r in grid if all(getattr(r, g) == getattr(chosen, g) for g in FAMILIES if g != f)]
            for f in FAMILIES
        }
    out = []
    for family, line in lines.items():
        rates = sorted(set(line))
        at = chosen.single if family is None else getattr(chosen, family)
        if len(rates) < 2 or at not in (rates[0], rates[-1]):
            continue
        near, edge = (rates[1], rates[0]) if at == rates[0] else (rates[-2], rates[-1])
        beyond = float(f"{edge * edge / near:.6g}")  # as its text form reads back: 1e-4, not 9.999999999999999e-05
        point = Rates.uniform if family is None else (lambda v, f=family: replace(chosen, **{f: v}))
        out.append((point(beyond), point(near)))
    return out
