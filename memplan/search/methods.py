"""The search methods, a registry: one small function per method, each running it on a prepared
search (space, cost table, budget) and returning its result (``ExactResult`` or ``Trace``, both
naming their best candidate ``.candidate``).

* ``exact``: the certified optimum of the cost table (``memplan.search.exact``); only where
  memory (and, with a FLOPs budget, backward FLOPs) is additive; the default there, and the
  reference every other method's gap is measured to;
* ``evolution``: DEAP evolution (``memplan.search.evolution``), repaired to the budget; the
  default where memory is not additive;
* ``random``: as many random candidates as evolution evaluated (``memplan.search.random_search``).

Adding a method is one function here, registered with ``@method("name", ...)``: the entry
(:class:`Method`) carries everything the search (``memplan.search.run``), its result
(``SearchResult.runs``) and the views (``memplan.render``) need, so none of them names a method.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from deap import base

from .. import names
from ..registry import Registry
from .evolution import evolve
from .exact import solve_exact
from .memory import CostTable, MemoryModel
from .random_search import random_search
from .space import SearchSpace
from .toolbox import Problem, make_toolbox


@dataclass
class Prepared:
    """One search ready to run: the space, memory model and cost table, the budget (bytes), the
    DEAP settings, the results of the methods run so far (by name), and with a FLOPs budget the
    backward-FLOPs table and that budget (FLOPs)."""

    space: SearchSpace
    memory: MemoryModel
    table: CostTable
    additive: bool  # memory (and FLOPs) is the tables' sum: the tables are the cost functions
    budget: int
    seed: int = 0
    generations: int = 100
    population: int = 100
    runs: dict[str, Any] = field(default_factory=dict)
    _toolbox: tuple[Problem, base.Toolbox] | None = None
    flops_table: CostTable | None = None
    flops_budget: int | None = None

    def toolbox(self) -> tuple[Problem, base.Toolbox]:
        """The DEAP problem and toolbox (made once, on first use)."""
        if self._toolbox is None:
            memory_of = self.table.estimate if self.additive else self.memory.measure
            flops_of = None
            if self.flops_budget is not None:
                flops_of = self.flops_table.estimate if self.additive else self.memory.flops
            problem = Problem(
                self.space,
                self.table,
                self.budget,
                memory_of,
                self.additive,
                self.flops_table,
                self.flops_budget,
                flops_of,
            )
            self._toolbox = (problem, make_toolbox(problem))
        return self._toolbox


def _evaluated(result: Any) -> tuple[str, str]:
    """The cells of a run that evaluated candidates: (evaluations, seconds)."""
    return str(result.evaluations), f"{result.seconds:.2f}"


@dataclass(frozen=True)
class Method:
    """A search method: ``run(prepared)`` -> its result (with ``candidate``, ``value``, ``seconds`` and
    its JSON form ``to_json()``).

    ``needs``: methods whose results it reads; ``additive_only``: applies only where memory is
    additive; ``default``: the method run when none is asked for, where memory is additive
    (``"additive"``) or where it is not (``"general"``); ``reference``: its value is the optimum the
    other methods' gaps are measured to, so it runs whenever it applies; ``curve``: the line style of
    its best-so-far curve (``best_per_evaluation``), run for the curves (the 256KB paper's Figure 13;
    None: it has none); ``cells(result)``: its (evaluations, seconds) cells in ``memplan search``'s
    table of methods."""

    run: Callable[[Prepared], Any]
    needs: tuple[str, ...] = ()
    additive_only: bool = False
    default: Literal["additive", "general"] | None = None
    reference: bool = False
    curve: str | None = None
    cells: Callable[[Any], tuple[str, str]] = _evaluated

    def applies(self, additive: bool) -> bool:
        """Whether the method applies where memory is (or is not) ``additive``."""
        return additive or not self.additive_only


METHODS: Registry[Method] = Registry("search method", names=names.SEARCH_METHODS)


def method(name: str, **fields: Any) -> Callable:
    """Decorator registering ``run(prepared) -> result`` as the search method ``name`` (``fields``:
    those of :class:`Method` besides ``run``)."""

    def decorate(run: Callable[[Prepared], Any]) -> Callable[[Prepared], Any]:
        METHODS.add(name, Method(run, **fields))
        return run

    return decorate


def default_method(additive: bool) -> str:
    """The method run when none is asked for, where memory is (or is not) ``additive``."""
    return next(n for n, m in METHODS.items() if m.default == ("additive" if additive else "general"))


def reference_method() -> str:
    """The method whose value the others' gaps are measured to."""
    return next(n for n, m in METHODS.items() if m.reference)


def general_methods() -> list[str]:
    """The methods that apply whether memory is additive or not."""
    return [n for n, m in METHODS.items() if m.applies(False)]


def wanted_methods(chosen: str, additive: bool, curves: bool) -> set[str]:
    """The methods one search runs: ``chosen``, the reference where it applies (for the gap), and
    with ``curves`` every method that has a curve."""
    return {chosen} | {
        n for n, m in METHODS.items() if m.applies(additive) and (m.reference or (curves and m.curve is not None))
    }


@method(
    "exact",
    additive_only=True,
    default="additive",
    reference=True,
    cells=lambda r: ("-", f"{r.seconds:.3f}"),
)
def exact(s: Prepared) -> Any:
    if s.flops_budget is None:
        return solve_exact(s.space, s.table, s.budget)
    return solve_exact(s.space, s.table, s.budget, s.flops_table, s.flops_budget)


@method("evolution", default="general", curve="-")
def evolution(s: Prepared) -> Any:
    problem, toolbox = s.toolbox()
    return evolve(problem, toolbox, population=s.population, generations=s.generations, seed=s.seed)


@method("random", needs=("evolution",), curve="--")
def random(s: Prepared) -> Any:
    problem, toolbox = s.toolbox()
    return random_search(problem, toolbox, evaluations=s.runs["evolution"].evaluations, seed=s.seed)


def run_methods(s: Prepared, wanted: Iterable[str], seconds: dict[str, float]) -> dict[str, Any]:
    """Run the ``wanted`` methods and those they need, in registration order; returns
    ``s.runs`` and records each method's wall time in ``seconds`` (s)."""
    todo = set(wanted)
    pending = list(todo)
    while pending:
        for need in METHODS.choose(pending.pop()).needs:
            if need not in todo:
                todo.add(need)
                pending.append(need)
    for name, m in METHODS.items():
        if name in todo:
            t0 = time.perf_counter()
            s.runs[name] = m.run(s)
            seconds[name] = time.perf_counter() - t0
    return s.runs
