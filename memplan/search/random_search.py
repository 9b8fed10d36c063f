"""Random search: ``evaluations`` independent individuals from the same ``init`` + ``repair``
operators as evolution (so both search the same feasible space), best kept. With the same seed
its first samples are evolution's initial population: both curves start alike and part where
evolution begins to select and vary."""

from __future__ import annotations

import time

from deap import base

from .evolution import Recorder, Trace
from .toolbox import Problem, seeded


def random_search(problem: Problem, toolbox: base.Toolbox, *, evaluations: int, seed: int = 0) -> Trace:
    t0 = time.perf_counter()
    with seeded(seed):
        record = Recorder(toolbox, problem)
        for _ in range(evaluations):
            record([toolbox.individual()])
    best = problem.decode(record.best)
    return Trace("random", best, record.value, len(record.curve), time.perf_counter() - t0, record.curve)
