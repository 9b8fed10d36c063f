"""Certified optimum of Eq. 5 when memory is additive: a multiple-choice knapsack per bias depth k.

For depth k the convs in range each take one option (bias only, or a weight ratio) with cost
``extra[(i, r)]`` and gain ``Δacc_W(i, r)``; the capacity is ``budget - base[k]``, and an
optional cap bounds the number of weight updates. One dynamic programme over the convs, from
the last one backwards, solves every k at once: after conv ``L - k`` has been added, the
frontier holds exactly the options of depth k. The frontier is the Pareto staircase of
(bytes, Δacc) pairs — no pair kept costs more and gains less than another — so the DP is exact
for any budget in integer bytes, with no capacity grid. Per count of weight updates, one
staircase is kept when a cap is set.

With a FLOPs budget too (a second additive table, ``flops_table``), the same DP keeps the Pareto
set of (bytes, FLOPs, Δacc) triples instead — no triple kept costs at least as many bytes and
FLOPs as another and gains no more (:func:`_pareto3`, a sweep over a (FLOPs, Δacc) staircase) —
after dropping what exceeds either capacity; it is exact for both budgets. Without one, the
one-capacity DP above runs unchanged.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_right
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .memory import CostTable
from .space import Candidate, SearchSpace


@dataclass
class ExactResult:
    candidate: Candidate
    value: float  # summed Δacc
    estimate: int  # memory from the cost table, bytes
    seconds: float
    frontier_max: int  # largest staircase kept (a size measure of the DP)
    flops_estimate: int | None = None  # backward FLOPs from the FLOPs table (with a FLOPs budget only)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready, the candidate as text."""
        return {**asdict(self), "candidate": self.candidate.describe()}


@dataclass
class _Stair:
    cost: np.ndarray  # int64, ascending
    value: np.ndarray  # float64, strictly ascending
    parent: np.ndarray  # index into the previous step's staircase of count ``parent_count``
    parent_count: np.ndarray  # count of weight updates of the parent entry
    choice: np.ndarray  # option index into the layer's ratios, -1 = bias only
    flops: np.ndarray | None = None  # int64, backward FLOPs (with a FLOPs budget only)


def relative_gap(value: float, optimum: float) -> float:
    """Shortfall of ``value`` from ``optimum`` relative to |optimum| (0 = optimal; float noise
    of a differently ordered sum counts as 0)."""
    if math.isclose(value, optimum, rel_tol=1e-9, abs_tol=1e-12):
        return 0.0
    return (optimum - value) / abs(optimum) if optimum else math.inf


def _pareto(cost: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Indices of the staircase: sorted by cost, then by value descending; keep strict value rises."""
    order = np.lexsort((-value, cost))
    v = value[order]
    best_before = np.concatenate(([-np.inf], np.maximum.accumulate(v)[:-1]))
    return order[v > best_before]


def _empty() -> _Stair:
    e = np.empty(0, dtype=np.int64)
    return _Stair(e, np.empty(0), e, e, e)


def solve_exact(  # long: the one-capacity DP, unchanged since the FLOPs budget came (dispatches to _solve_two)
    space: SearchSpace,
    table: CostTable,
    budget: int,
    flops_table: CostTable | None = None,
    flops_budget: int | None = None,
) -> ExactResult | None:
    """The candidate of largest summed Δacc with ``table.estimate <= budget`` (and
    ``flops_table.estimate <= flops_budget`` when both are given); None if even ``k = 0`` does
    not fit. Ties go to the smaller memory, then to the smaller k (with FLOPs: smaller memory,
    smaller FLOPs, smaller k)."""
    if (flops_table is None) != (flops_budget is None):
        raise ValueError("give both flops_table and flops_budget, or neither")
    if flops_table is not None:
        return _solve_two(space, table, budget, flops_table, flops_budget)
    t0 = time.perf_counter()
    ks = [k for k in space.ks if table.base[k] <= budget]
    if not ks:
        return None
    capacity = budget - min(table.base[k] for k in ks)
    cap = space.max_weight_layers
    n_counts = 1 if cap is None else cap + 1
    by_index = {c.conv_index: c for c in space.layers}
    stairs = [
        _Stair(
            np.zeros(1, dtype=np.int64),
            np.zeros(1),
            np.zeros(1, dtype=np.int64),
            np.zeros(1, dtype=np.int64),
            np.full(1, -1),
        )
    ] + [_empty() for _ in range(n_counts - 1)]
    history: list[list[_Stair]] = []
    best: tuple[float, int, int, int, int, int] | None = None  # (value, -memory, -k, step, count, index)
    largest = 1
    steps_by_k = {}
    for conv in range(space.n_convs - 1, -1, -1):
        layer = by_index.get(conv)
        if layer is not None:
            stairs = _add_layer(stairs, layer, table, capacity, cap)
            largest = max(largest, max(len(s.cost) for s in stairs))
        history.append(stairs)
        steps_by_k[space.n_convs - conv] = len(history) - 1
    for k in ks:
        room = budget - table.base[k]
        level = (
            [
                _Stair(
                    np.zeros(1, dtype=np.int64),
                    np.zeros(1),
                    np.zeros(1, dtype=np.int64),
                    np.zeros(1, dtype=np.int64),
                    np.full(1, -1),
                )
            ]
            if k == 0
            else history[steps_by_k[k]]
        )
        for count, s in enumerate(level):
            j = int(np.searchsorted(s.cost, room, side="right")) - 1
            if j < 0:
                continue
            total = space.bias_gain[k] + float(s.value[j])
            key = (total, -(table.base[k] + int(s.cost[j])), -k, steps_by_k.get(k, -1), count, j)
            if best is None or key[:3] > best[:3]:
                best = key
    assert best is not None  # k = 0 with no weights fits
    value, neg_mem, neg_k, step, count, j = best
    weights = _trace(history, step, count, j, space) if step >= 0 else []
    cand = Candidate(-neg_k, tuple(sorted(weights)))
    return ExactResult(cand, space.value(cand), -neg_mem, time.perf_counter() - t0, largest)


def _add_layer(stairs: list[_Stair], layer, table: CostTable, capacity: int, cap: int | None) -> list[_Stair]:
    """Next staircases: each entry keeps bias only or adds one ratio of ``layer``."""
    costs = np.array([table.extra[(layer.conv_index, r)] for r in layer.ratios], dtype=np.int64)
    gains = np.array(layer.gains, dtype=float)
    out = []
    for count in range(len(stairs)):
        parts_c, parts_v, parts_p, parts_n, parts_ch = [], [], [], [], []
        prev = stairs[count]  # bias only: same count
        idx = np.arange(len(prev.cost))
        parts_c.append(prev.cost)
        parts_v.append(prev.value)
        parts_p.append(idx)
        parts_n.append(np.full(len(idx), count))
        parts_ch.append(np.full(len(idx), -1))
        src = count - 1 if cap is not None else count
        if src >= 0:
            base = stairs[src]
            idx = np.arange(len(base.cost))
            for o, (c, g) in enumerate(zip(costs, gains)):
                parts_c.append(base.cost + c)
                parts_v.append(base.value + g)
                parts_p.append(idx)
                parts_n.append(np.full(len(idx), src))
                parts_ch.append(np.full(len(idx), o))
        cost, value = np.concatenate(parts_c), np.concatenate(parts_v)
        parent, pcount, choice = np.concatenate(parts_p), np.concatenate(parts_n), np.concatenate(parts_ch)
        fits = cost <= capacity
        cost, value, parent, pcount, choice = cost[fits], value[fits], parent[fits], pcount[fits], choice[fits]
        keep = _pareto(cost, value) if len(cost) else np.empty(0, dtype=np.int64)
        out.append(_Stair(cost[keep], value[keep], parent[keep], pcount[keep], choice[keep]))
    return out


def _trace(history: list[list[_Stair]], step: int, count: int, j: int, space: SearchSpace) -> list[tuple[int, float]]:
    """Walk the back-pointers from (step, count, j) to the first conv processed (the last conv)."""
    by_index = {c.conv_index: c for c in space.layers}
    weights = []
    while step >= 0:
        conv = space.n_convs - 1 - step
        s = history[step][count]
        if conv in by_index:
            o = int(s.choice[j])
            if o >= 0:
                weights.append((conv, by_index[conv].ratios[o]))
            j, count = int(s.parent[j]), int(s.parent_count[j])
        step -= 1
    return weights


# ------------------------------------------------------------------ memory and FLOPs budgets


def _pareto3(cost: np.ndarray, flops: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Indices of the (cost, flops, value) triples no other kept triple dominates (cost <=,
    flops <=, value >=; of identical triples one is kept). Sweep by cost ascending (value
    descending, flops ascending on ties) over a (flops ascending, value ascending) staircase of
    the triples kept so far: a triple is dominated iff the staircase holds value >= its own at
    flops <= its own."""
    order = np.lexsort((flops, -value, cost))
    stair_f: list[int] = []
    stair_v: list[float] = []
    keep = []
    for idx, f, v in zip(order.tolist(), flops[order].tolist(), value[order].tolist()):
        p = bisect_right(stair_f, f)
        if p and stair_v[p - 1] >= v:
            continue
        q = p
        while q < len(stair_f) and stair_v[q] <= v:
            q += 1
        stair_f[p:q] = [f]
        stair_v[p:q] = [v]
        keep.append(idx)
    return np.array(keep, dtype=np.int64)


def _start_stair(n_counts: int) -> list[_Stair]:
    one = np.zeros(1, dtype=np.int64)
    first = _Stair(one, np.zeros(1), one, one, np.full(1, -1), one.copy())
    e = np.empty(0, dtype=np.int64)
    return [first] + [_Stair(e, np.empty(0), e, e, e, e) for _ in range(n_counts - 1)]


def _solve_two(  # the two-capacity DP: staircases of (bytes, FLOPs, Δacc)
    space: SearchSpace, table: CostTable, budget: int, flops_table: CostTable, flops_budget: int
) -> ExactResult | None:
    t0 = time.perf_counter()
    ks = [k for k in space.ks if table.base[k] <= budget and flops_table.base[k] <= flops_budget]
    if not ks:
        return None
    capacity = budget - min(table.base[k] for k in ks)
    fcapacity = flops_budget - min(flops_table.base[k] for k in ks)
    cap = space.max_weight_layers
    n_counts = 1 if cap is None else cap + 1
    by_index = {c.conv_index: c for c in space.layers}
    stairs = _start_stair(n_counts)
    history: list[list[_Stair]] = []
    steps_by_k = {}
    largest = 1
    for conv in range(space.n_convs - 1, -1, -1):
        layer = by_index.get(conv)
        if layer is not None:
            stairs = _add_layer_two(stairs, layer, table, flops_table, capacity, fcapacity, cap)
            largest = max(largest, max(len(s.cost) for s in stairs))
        history.append(stairs)
        steps_by_k[space.n_convs - conv] = len(history) - 1
    best: tuple | None = None  # (value, -memory, -flops, -k, step, count, index)
    for k in ks:
        room, froom = budget - table.base[k], flops_budget - flops_table.base[k]
        level = _start_stair(n_counts) if k == 0 else history[steps_by_k[k]]
        for count, s in enumerate(level):
            fits = np.flatnonzero((s.cost <= room) & (s.flops <= froom))
            if not len(fits):
                continue
            j = int(fits[np.lexsort((s.flops[fits], s.cost[fits], -s.value[fits]))[0]])
            total = space.bias_gain[k] + float(s.value[j])
            memory = table.base[k] + int(s.cost[j])
            flops = flops_table.base[k] + int(s.flops[j])
            key = (total, -memory, -flops, -k, steps_by_k.get(k, -1) if k else -1, count, j)
            if best is None or key[:4] > best[:4]:
                best = key
    assert best is not None  # k = 0 with no weights fits
    value, neg_mem, neg_flops, neg_k, step, count, j = best
    weights = _trace(history, step, count, j, space) if step >= 0 else []
    cand = Candidate(-neg_k, tuple(sorted(weights)))
    return ExactResult(cand, space.value(cand), -neg_mem, time.perf_counter() - t0, largest, -neg_flops)


def _add_layer_two(  # _add_layer with a second cost (FLOPs) and the 3-D Pareto pruning
    stairs: list[_Stair],
    layer,
    table: CostTable,
    flops_table: CostTable,
    capacity: int,
    fcapacity: int,
    cap: int | None,
) -> list[_Stair]:
    costs = [table.extra[(layer.conv_index, r)] for r in layer.ratios]
    fcosts = [flops_table.extra[(layer.conv_index, r)] for r in layer.ratios]
    out = []
    for count in range(len(stairs)):
        prev = stairs[count]  # bias only: same count
        idx = np.arange(len(prev.cost))
        parts = [(prev.cost, prev.flops, prev.value, idx, np.full(len(idx), count), np.full(len(idx), -1))]
        src = count - 1 if cap is not None else count
        if src >= 0:
            base = stairs[src]
            idx = np.arange(len(base.cost))
            for o, (c, f, g) in enumerate(zip(costs, fcosts, layer.gains)):
                n = len(idx)
                parts.append((base.cost + c, base.flops + f, base.value + g, idx, np.full(n, src), np.full(n, o)))
        cost, flops, value, parent, pcount, choice = (np.concatenate(col) for col in zip(*parts))
        fits = (cost <= capacity) & (flops <= fcapacity)
        cost, flops, value = cost[fits], flops[fits], value[fits]
        parent, pcount, choice = parent[fits], pcount[fits], choice[fits]
        keep = _pareto3(cost, flops, value) if len(cost) else np.empty(0, dtype=np.int64)
        out.append(_Stair(cost[keep], value[keep], parent[keep], pcount[keep], choice[keep], flops[keep]))
    return out
