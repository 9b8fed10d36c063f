"""DEAP operators of the sparse-update search, each small and named, registered in a
``deap.base.Toolbox`` by :func:`make_toolbox`.

Genome: a list of ints ``[kpos, g_0, ..., g_{m-1}]``: ``space.ks[kpos]`` is the bias depth,
``g_j`` the weight option of ``space.layers[j]`` (0 = bias only, t = ``ratios[t - 1]``). Genes of
convs outside the bias range are kept but inactive (dormant), so a later deeper k can revive them.

* ``init``: random depth; each gene active with a per-individual density drawn in [0, 1];
* ``mutate``: move the depth by a small step or redraw it; move each gene, with a small rate, one ratio
  level or redraw it;
* ``mate``: uniform crossover (``deap.tools.cxUniform``), the depth gene included;
* ``repair``: lower weight ratios one level at a time (or make the depth shallower), always the move
  that loses the least Δacc per byte saved, until the number of weight updates respects the cap
  (weakest updates dropped first) and the memory fits the budget; then, when memory is additive,
  ``fill`` the slack greedily (most Δacc per byte first). Lamarckian: the genome is changed. Bytes
  per option come from the cost table; feasibility is checked with the problem's memory function
  (the table sum when additive, ``compute()`` otherwise). With a FLOPs budget too (backward FLOPs,
  ``flops_table`` / ``flops_of``), "per byte" becomes per share of each violated budget saved
  (bytes / budget + FLOPs / FLOPs budget; per byte while only memory is over) until both fit, and
  ``fill`` takes a move only when it fits both slacks (most Δacc per share of both budgets first);
* ``evaluate``: summed Δacc of the decoded candidate (-inf if it does not fit; repair prevents that).

DEAP's operators use the ``random`` module; :func:`seeded` seeds it for one run and restores the
caller's state afterwards, so a run is reproducible and leaves no trace.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from deap import base, tools

from .memory import CostTable
from .space import Candidate, SearchSpace

#: probability that mutation changes the bias depth, and its largest local step in ``space.ks`` positions
DEPTH_MUTATION = (0.3, 3)


class Fitness(base.Fitness):
    weights = (1.0,)  # maximise summed Δacc


class Individual(list):
    """A genome (list of ints) with a DEAP fitness."""

    def __init__(self, genes=()):
        super().__init__(genes)
        self.fitness = Fitness()


@dataclass
class Problem:
    """Everything the operators read: space, per-option bytes, budget and the feasibility test;
    with a FLOPs budget, per-option backward FLOPs, that budget and its measure too."""

    space: SearchSpace
    table: CostTable
    budget: int
    memory_of: Callable[[Candidate], int]  # the metric under the mode (table sum if additive)
    additive: bool  # memory (and backward FLOPs, with a FLOPs budget) is the tables' sum
    flops_table: CostTable | None = None
    flops_budget: int | None = None
    flops_of: Callable[[Candidate], int] | None = None  # backward FLOPs (table sum if additive)

    def __post_init__(self) -> None:
        self.convs = [c.conv_index for c in self.space.layers]
        self.gains = [(0.0, *c.gains) for c in self.space.layers]
        self.costs = [(0, *(self.table.extra[(c.conv_index, r)] for r in c.ratios)) for c in self.space.layers]
        # fill order: every (gene, level) with a positive gain, most Δacc per byte first
        moves = [(j, t) for j, gains in enumerate(self.gains) for t in range(1, len(gains)) if gains[t] > 0]
        if self.flops_budget is None:
            self.fcosts = [(0,) * len(c) for c in self.costs]
            self.fill_order = sorted(moves, key=lambda m: -_efficiency(self.gains[m[0]][m[1]], self.costs[m[0]][m[1]]))
        else:
            if self.flops_table is None or self.flops_of is None:
                raise ValueError("a FLOPs budget needs flops_table and flops_of")
            ft = self.flops_table
            self.fcosts = [(0, *(ft.extra[(c.conv_index, r)] for r in c.ratios)) for c in self.space.layers]
            both = (True, True)
            self.fill_order = sorted(
                moves,
                key=lambda m: (
                    -_efficiency(
                        self.gains[m[0]][m[1]], self.share(self.costs[m[0]][m[1]], self.fcosts[m[0]][m[1]], both)
                    )
                ),
            )

    def over(self, memory: int, flops: int) -> tuple[bool, bool]:
        """(memory over its budget, backward FLOPs over theirs)."""
        return memory > self.budget, self.flops_budget is not None and flops > self.flops_budget

    def measures(self, cand: Candidate) -> tuple[int, int]:
        """(memory, backward FLOPs; 0 without a FLOPs budget) of ``cand``."""
        return self.memory_of(cand), self.flops_of(cand) if self.flops_budget is not None else 0

    def share(self, saved: int, fsaved: int, over: tuple[bool, bool]) -> float:
        """What a move saves, of the budgets it must bring down: bytes while only memory is over
        (as without a FLOPs budget), else the summed fractions of each violated budget."""
        if not over[1]:
            return saved
        return (saved / self.budget if over[0] else 0.0) + fsaved / self.flops_budget

    def active(self, genome: list[int]) -> list[int]:
        first = self.space.first(self.space.ks[genome[0]])
        return [j for j, g in enumerate(genome[1:]) if g and self.convs[j] >= first]

    def decode(self, genome: list[int]) -> Candidate:
        weights = tuple((self.convs[j], self.space.layers[j].ratios[genome[j + 1] - 1]) for j in self.active(genome))
        return Candidate(self.space.ks[genome[0]], weights)

    def value(self, genome: list[int]) -> float:
        return self.space.bias_gain[self.space.ks[genome[0]]] + sum(
            self.gains[j][genome[j + 1]] for j in self.active(genome)
        )


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed ``random`` (which DEAP uses) for the block; restore the previous state afterwards."""
    state = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(state)


def init(problem: Problem) -> Individual:
    density = random.random()
    genes = [random.randrange(1, len(options)) if random.random() < density else 0 for options in problem.gains]
    return Individual([random.randrange(len(problem.space.ks)), *genes])


def mutate(problem: Problem, ind: Individual, gene_rate: float) -> tuple[Individual]:
    """Depth, with probability ``DEPTH_MUTATION[0]``: half the time a step of up to
    ``DEPTH_MUTATION[1]`` positions, otherwise redrawn. Genes: each with ``gene_rate``, half the
    time one ratio level up or down, otherwise redrawn (0 = bias only included)."""
    p_depth, step = DEPTH_MUTATION
    n_ks = len(problem.space.ks)
    if random.random() < p_depth:
        if random.random() < 0.5:
            ind[0] = min(n_ks - 1, max(0, ind[0] + random.choice([s for s in range(-step, step + 1) if s])))
        else:
            ind[0] = random.randrange(n_ks)
    for j, options in enumerate(problem.gains):
        if random.random() < gene_rate:
            if random.random() < 0.5:
                ind[j + 1] = min(len(options) - 1, max(0, ind[j + 1] + random.choice((-1, 1))))
            else:
                ind[j + 1] = random.randrange(len(options))
    return (ind,)


def _efficiency(loss: float, saved: int) -> float:
    """Δacc lost per byte saved (smaller = drop first); a move that saves nothing comes last."""
    if saved <= 0:
        return math.inf
    return loss / saved


def _step_down(problem: Problem, ind: Individual, j: int, over: tuple[bool, bool] = (True, False)) -> float:
    """Δacc lost per byte (per share of the violated budgets) saved by lowering gene j one ratio level."""
    t = ind[j + 1]
    saved = problem.share(
        problem.costs[j][t] - problem.costs[j][t - 1], problem.fcosts[j][t] - problem.fcosts[j][t - 1], over
    )
    return _efficiency(problem.gains[j][t] - problem.gains[j][t - 1], saved)


def _depth_move(
    problem: Problem, ind: Individual, active: set[int], over: tuple[bool, bool] = (True, False)
) -> tuple[float, int, int, list[int]]:
    """(Δacc lost per byte (share) saved, bytes saved, FLOPs saved, genes that fall out of range)
    of one depth step down."""
    space = problem.space
    k, shallower = space.ks[ind[0]], space.ks[ind[0] - 1]
    leaving = [j for j in active if problem.convs[j] < space.first(shallower)]
    loss = space.bias_gain[k] - space.bias_gain[shallower] + sum(problem.gains[j][ind[j + 1]] for j in leaving)
    saved = problem.table.base[k] - problem.table.base[shallower] + sum(problem.costs[j][ind[j + 1]] for j in leaving)
    fsaved = 0
    if problem.flops_table is not None and problem.flops_budget is not None:
        fbase = problem.flops_table.base
        fsaved = fbase[k] - fbase[shallower] + sum(problem.fcosts[j][ind[j + 1]] for j in leaving)
    return _efficiency(loss, problem.share(saved, fsaved, over)), saved, fsaved, leaving


def repair(problem: Problem, ind: Individual) -> Individual:
    space = problem.space
    active = set(problem.active(ind))
    cap = space.max_weight_layers
    if cap is not None and len(active) > cap:
        order = sorted(active, key=lambda j: _efficiency(problem.gains[j][ind[j + 1]], problem.costs[j][ind[j + 1]]))
        for j in order[: len(active) - cap]:
            ind[j + 1] = 0
            active.discard(j)
    mem, flops = problem.measures(problem.decode(ind))
    over = problem.over(mem, flops)
    heap = [(_step_down(problem, ind, j, over), j) for j in active]
    heapq.heapify(heap)
    while any(over):
        depth = _depth_move(problem, ind, active, over) if ind[0] > 0 else (math.inf, 0, 0, [])
        if heap and (heap[0][0] <= depth[0] or ind[0] == 0):
            _, j = heapq.heappop(heap)
            t = ind[j + 1]
            saved = problem.costs[j][t] - problem.costs[j][t - 1]
            fsaved = problem.fcosts[j][t] - problem.fcosts[j][t - 1]
            ind[j + 1] = t - 1
            if t > 1:
                heapq.heappush(heap, (_step_down(problem, ind, j, over), j))
            else:
                active.discard(j)
        elif ind[0] > 0:
            _, saved, fsaved, leaving = depth
            ind[0] -= 1
            active.difference_update(leaving)
            heap = [(e, j) for e, j in heap if j in active]
            heapq.heapify(heap)
        else:
            break  # k = 0 without weights: the caller's budget check guarantees it fits
        if problem.additive:
            mem, flops = mem - saved, flops - fsaved
        else:
            mem, flops = problem.measures(problem.decode(ind))
        now = problem.over(mem, flops)
        if now != over:
            over = now
            if any(over):  # another budget to bring down: rank the moves again
                heap = [(_step_down(problem, ind, j, over), j) for j in active]
                heapq.heapify(heap)
    if problem.additive:
        fill(problem, ind, problem.budget - mem, None if problem.flops_budget is None else problem.flops_budget - flops)
    del ind.fitness.values
    return ind


def fill(problem: Problem, ind: Individual, slack: int, flops_slack: int | None = None) -> Individual:
    """Grow into the slack: one pass over the (gene, level) moves, most Δacc per byte first; a move
    is taken when it raises that gene's gain, its extra bytes (and backward FLOPs, with
    ``flops_slack``) fit and the cap allows it. Only with additive memory (the slack is exact there)."""
    first = problem.space.first(problem.space.ks[ind[0]])
    cap = problem.space.max_weight_layers
    count = len(problem.active(ind))
    for j, t in problem.fill_order:
        if problem.convs[j] < first:
            continue
        now = ind[j + 1]
        extra = problem.costs[j][t] - problem.costs[j][now]
        fextra = problem.fcosts[j][t] - problem.fcosts[j][now]
        if (
            problem.gains[j][t] <= problem.gains[j][now]
            or extra > slack
            or (flops_slack is not None and fextra > flops_slack)
            or (now == 0 and cap is not None and count >= cap)
        ):
            continue
        ind[j + 1] = t
        slack -= extra
        if flops_slack is not None:
            flops_slack -= fextra
        count += now == 0
    return ind


def evaluate(problem: Problem, ind: Individual) -> tuple[float]:
    if any(problem.over(*problem.measures(problem.decode(ind)))):
        return (-math.inf,)
    return (problem.value(ind),)


def new_individual(toolbox: base.Toolbox) -> Individual:
    """A random individual, repaired to the budget."""
    return toolbox.repair(toolbox.init())


def make_toolbox(problem: Problem, *, gene_rate: float | None = None, tournament: int = 2) -> base.Toolbox:
    """The toolbox: init, individual (init + repair), population, mate, mutate, select, repair, evaluate."""
    rate = gene_rate if gene_rate is not None else 1.5 / max(1, len(problem.gains))
    tb = base.Toolbox()
    tb.register("init", init, problem)
    tb.register("repair", repair, problem)
    tb.register("individual", new_individual, tb)
    tb.register("population", tools.initRepeat, list, tb.individual)
    tb.register("mate", tools.cxUniform, indpb=0.5)
    tb.register("mutate", mutate, problem, gene_rate=rate)
    tb.register("select", tools.selTournament, tournsize=tournament)
    tb.register("evaluate", evaluate, problem)
    return tb
