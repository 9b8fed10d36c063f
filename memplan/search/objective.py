"""What the search maximises: a registry of objectives, each turning a contribution profile's
Δacc entries (mean over seeds, accuracy points) and their standard errors into the per-entry
gains the solvers add up. Every objective is per entry, so the objective stays a sum and the
exact solver still certifies its optimum.

* ``mean``: the measured mean (the 256KB paper's summed Δacc); chases noise when entries are
  the size of their standard error (the largest of many noisy sums is biased upward);
* ``lcb``: mean - z x SE (z = 1): an entry counts only as far as it is measured above its noise;
* ``shrink``: empirical-Bayes shrinkage toward 0 (normal prior N(0, tau^2) per family, bias and
  weight entries, tau^2 = max(0, var(means) - mean(SE^2)) by the method of moments): mean x
  tau^2 / (tau^2 + SE^2).

An entry measured with one seed has no SE; ``lcb`` and ``shrink`` then use the family's pooled SE
(root mean square of the others); a profile with no SE at all is refused by both, in one line.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from .. import names
from ..errors import BadOption
from ..registry import Registry

#: z of the ``lcb`` objective (one standard error)
LCB_Z = 1.0


@dataclass(frozen=True)
class Objective:
    """``gains(means, ses)`` of one family of entries; ``needs_se``: whether it reads the SEs (one
    that reads none gains the means themselves); ``nothing_gains``: why a search under it keeps the
    classifier only although an update fits the budget (``memplan search``'s scheme line);
    ``summary``: what the gains are, in a few words (``--objective``'s help)."""

    name: str
    gains: Callable[[list[float], list[float]], list[float]]
    needs_se: bool
    nothing_gains: str = ""
    summary: str = ""


#: objective name -> how a family's (means, standard errors) become the gains the search adds
OBJECTIVES: Registry[Objective] = Registry("search objective", names=names.OBJECTIVES)


def objective(name: str, *, summary: str, needs_se: bool = True, nothing_gains: str = ""):
    """Decorator registering ``gains(means, ses)`` as objective ``name``."""

    def decorate(fn: Callable[[list[float], list[float]], list[float]]):
        OBJECTIVES.add(name, Objective(name, fn, needs_se, nothing_gains, summary))
        return fn

    return decorate


@objective(
    "mean",
    summary="the Δacc entries as measured",
    needs_se=False,
    nothing_gains="nothing that fits has a positive measured gain",
)
def mean(means: list[float], ses: list[float]) -> list[float]:
    return list(means)


@objective(
    "lcb",
    summary="minus one standard error",
    nothing_gains="nothing measured above noise fits (lcb counts an entry only as far as it lies above one "
    "standard error)",
)
def lower_bound(means: list[float], ses: list[float]) -> list[float]:
    return [m - LCB_Z * s for m, s in zip(means, ses, strict=True)]


@objective(
    "shrink",
    summary="shrunk toward 0 by their standard errors",
    nothing_gains="nothing that fits keeps a gain once shrunk toward 0 by its standard error",
)
def shrink(means: list[float], ses: list[float]) -> list[float]:
    if len(means) < 2:
        return list(means)
    tau2 = max(0.0, statistics.pvariance(means) - statistics.fmean(s * s for s in ses))
    return [m * tau2 / (tau2 + s * s) if tau2 + s * s > 0 else m for m, s in zip(means, ses, strict=True)]


def apply_objective(name: str, means: list[float], ses: list[float | None]) -> list[float]:
    """The gains of objective ``name`` for one family of entries (``ses``: None where one seed)."""
    obj = OBJECTIVES.choose(name)
    if not obj.needs_se:
        return obj.gains(means, [0.0] * len(means))
    known = [s for s in ses if s is not None]
    if not known:
        raise BadOption(
            f"objective {name!r} needs standard errors; this profile measured every entry with one seed",
            "measure it with several seeds (memplan contrib --seeds 0,1,2) or use --objective mean",
        )
    pooled = math.sqrt(statistics.fmean(s * s for s in known))
    return obj.gains(means, [pooled if s is None else s for s in ses])


#: the objective of ``memplan search`` when none is asked for (docs/howto/search.md, "What the search maximises"):
#: per entry, so one strongly measured gain survives among many noisy ones (``shrink`` pools a
#: family and, where most entries are noise, shrinks every one to 0)
DEFAULT_OBJECTIVE = "lcb"
#: the objective of a profile without standard errors (the search warns that it chases noise)
PLAIN_OBJECTIVE = "mean"


def objectives_help() -> str:
    """The objectives as ``--objective``'s help names them: ``name (summary) | ...``."""
    return " | ".join(f"{n} ({o.summary})" for n, o in OBJECTIVES.items())


def default_objective(bias_se: dict[int, float | None], weight_se: dict[str, dict[float, float | None]]) -> str:
    """:data:`DEFAULT_OBJECTIVE` when the profile has standard errors, else :data:`PLAIN_OBJECTIVE` (the
    caller warns)."""
    known = [s for s in bias_se.values() if s is not None]
    known += [s for row in weight_se.values() for s in row.values() if s is not None]
    return DEFAULT_OBJECTIVE if known else PLAIN_OBJECTIVE
