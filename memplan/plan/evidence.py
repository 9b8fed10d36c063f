"""What training showed about a scheme: its validation-stage evidence (``memplan search
--validate``, or a benchmark that trained it) and, where measured, its test accuracy. Accuracies
in % (0..100)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class TestAccuracy(BaseModel):
    """Accuracy on a test split after every choice was made on validation: %, per seed, mean and
    95% confidence half-width (Student t over seeds)."""

    __test__ = False  # a data class named Test*, not a pytest test class
    model_config = ConfigDict(extra="forbid", frozen=True)

    accuracy: float = Field(description="mean test accuracy over seeds, %")
    ci95: float = Field(ge=0, description="95% confidence half-width of the mean, points")
    seeds: list[int]
    per_seed: list[float] = Field(description="test accuracy of each seed, %")
    diverged: int = Field(
        0, ge=0, description="seeds whose run diverged or ended at chance accuracy (counted in the mean)"
    )
    data: str = Field(description="the data and split")
    where: str = Field(description="what trained and measured it (a benchmark and its rows)")


class Validation(BaseModel):
    """The validation stage's evidence (``memplan search --validate``): accuracy on the held-aside
    validation split, in % (0..100), mean and standard error over seeds; the candidates it beat."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="the candidate chosen: a baseline's name or 'searched ...'")
    accuracy: float = Field(description="mean validation accuracy over seeds, %")
    se: float = Field(ge=0, description="standard error of the mean over seeds, points (0 with one seed)")
    seeds: list[int]
    data: str = Field(description="the data and split it was measured on")
    images: int | None = Field(None, ge=1, description="images in the validation split (None: not recorded)")
    rule: str | None = Field(
        None, description="how the stage chose (memplan.search.rules); None: written before rules, the best mean"
    )
    runners_up: list[dict[str, Any]] = Field(
        default_factory=list, description="the other candidates: name, lr, accuracy (%), se, seeds, memory bytes"
    )
    test: TestAccuracy | None = Field(
        None, description="the chosen scheme's accuracy on a test split over seeds no choice saw (None: not tested)"
    )

    def margin(self) -> Margin | None:
        """How far the chosen candidate is above the best baseline among the runners-up, on
        validation; None with one seed, or when no runner-up is a baseline with a mean and SE
        (a scheme written before runners-up recorded both)."""
        rivals = [r for r in self.runners_up if r.get("baseline") and None not in (r.get("accuracy"), r.get("se"))]
        if not rivals or len(self.seeds) < 2:
            return None
        best = max(rivals, key=lambda r: r["accuracy"])
        chosen, base = (self.accuracy, self.se), (best["accuracy"], best["se"])
        return Margin.between(best["name"], chosen, base, self.images)


def accuracy_se(accuracy: float, images: int) -> float:
    """The standard error, in points, that sampling ``images`` images gives an ``accuracy`` (%)
    measured on them (binomial)."""
    return math.sqrt(accuracy * (100 - accuracy) / images)


def images_se(a: float, b: float, images: int) -> float:
    """The standard error, in points, that sampling ``images`` validation images gives the
    difference of two accuracies ``a`` and ``b`` (%) measured on them, their errors taken as
    independent (:func:`accuracy_se` of each). Two fine-tuned models of one backbone err mostly on
    the same images, so the paired error is smaller: this is an upper estimate. No number of seeds
    shrinks it."""
    return math.hypot(accuracy_se(a, images), accuracy_se(b, images))


@dataclass(frozen=True)
class Margin:
    """The chosen candidate's validation accuracy minus the best baseline's (``baseline``), in
    points, and the standard error of that difference (the two seed SEs combined, unpaired);
    ``images_se``: what the validation images' sampling adds (:func:`images_se`, points; None:
    their number not recorded), which ``se`` leaves out and :attr:`resolved` does not read."""

    baseline: str
    points: float
    se: float
    images_se: float | None = None

    @classmethod
    def between(
        cls, baseline: str, chosen: tuple[float, float], base: tuple[float, float], images: int | None = None
    ) -> Margin:
        """The margin of ``chosen`` over ``base``, each (mean %, SE points), the baseline named
        ``baseline``, measured on ``images`` validation images (None: not recorded)."""
        sampled = None if images is None else images_se(chosen[0], base[0], images)
        return cls(baseline, chosen[0] - base[0], math.hypot(chosen[1], base[1]), sampled)

    @property
    def resolved(self) -> bool:
        """The margin is more than twice its standard error (the usual 95% two-sided level with many seeds;
        with two seeds even that is optimistic). A margin inside it means validation does not
        separate the choice from the baseline: on test either may come out ahead."""
        return self.points > 2 * self.se

    @property
    def within_images(self) -> bool:
        """The margin is no more than twice :attr:`images_se`: the validation images' sampling alone
        could have made it (False when their number is not recorded)."""
        return self.images_se is not None and self.points <= 2 * self.images_se

    def __str__(self) -> str:
        return f"{self.points:+.2f} ± {self.se:.2f} points (SE)"
