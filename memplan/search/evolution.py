"""Evolutionary search (DEAP): a (mu + lambda) loop over the toolbox of ``memplan.search.toolbox``
with one elite, tournament selection, and the best fitness recorded per generation and per
evaluation (the 256KB paper's Figure 13 plots the latter)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from deap import algorithms, base, tools

from .space import Candidate
from .toolbox import Problem, seeded


@dataclass
class Trace:
    """One search run: the best candidate and its history (summed Δacc; -inf before any feasible one)."""

    method: str
    best: Candidate
    value: float
    evaluations: int
    seconds: float
    best_per_evaluation: list[float] = field(default_factory=list)  # best so far after each evaluation
    best_per_generation: list[float] = field(default_factory=list)  # evolution only; entry 0 = initial population

    @property
    def candidate(self) -> Candidate:
        """The best candidate (the name ``ExactResult`` gives it)."""
        return self.best

    def to_json(self) -> dict[str, Any]:
        """JSON-ready, the best candidate as text."""
        return {**asdict(self), "best": self.best.describe()}


class Recorder:
    """Evaluates individuals through the toolbox and keeps the best-so-far curve."""

    def __init__(self, toolbox: base.Toolbox, problem: Problem):
        self.toolbox, self.problem = toolbox, problem
        self.best: list[int] | None = None
        self.value = -math.inf
        self.curve: list[float] = []

    def __call__(self, individuals) -> None:
        for ind in individuals:
            if ind.fitness.valid:
                continue
            ind.fitness.values = self.toolbox.evaluate(ind)
            if ind.fitness.values[0] > self.value:
                self.value, self.best = ind.fitness.values[0], list(ind)
            self.curve.append(self.value)


def evolve(
    problem: Problem,
    toolbox: base.Toolbox,
    *,
    population: int = 100,
    generations: int = 100,
    seed: int = 0,
    cxpb: float = 0.5,
    mutpb: float = 0.5,
) -> Trace:
    """Run ``generations`` generations of ``population`` offspring each (``deap.algorithms.varOr``:
    crossover with ``cxpb``, else mutation with ``mutpb``), each child repaired to the budget;
    the next population is the best of parents + children plus tournaments among them."""
    t0 = time.perf_counter()
    with seeded(seed):
        record = Recorder(toolbox, problem)
        pop = toolbox.population(n=population)
        record(pop)
        per_gen = [record.value]
        for _ in range(generations):
            offspring = algorithms.varOr(pop, toolbox, population, cxpb, mutpb)
            for child in offspring:
                if not child.fitness.valid:
                    toolbox.repair(child)
            record(offspring)
            pool = pop + offspring
            pop = tools.selBest(pool, 1) + toolbox.select(pool, population - 1)
            per_gen.append(record.value)
    best = problem.decode(record.best)
    return Trace("evolution", best, record.value, len(record.curve), time.perf_counter() - t0, record.curve, per_gen)
