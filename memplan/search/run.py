"""``run_search``: budget -> searched sparse-update scheme, as plain data (:class:`SearchResult`;
``memplan.render`` draws and prints it). The CLI (``memplan search``) is a thin layer over these.

Steps (one function each): capture the model (``memplan.capture``) and read its contribution
profile; build the space; derive the per-option cost table from ``memplan.accounting.engine.compute``
and check additivity on probe candidates; then run the method (``memplan.search.methods``, a
registry):

* ``method="exact"`` (the default when memory is additive): the certified optimum
  (``memplan.search.exact``);
* ``method="evolution"`` (the default otherwise) or ``"random"``: DEAP search with the same
  operators; with additive memory the exact optimum is also computed to report the gap.

Which method is the default, which one the gap is measured to and which ones draw curves are
fields of the methods' entries (``memplan.search.methods.Method``); this module names none.

The returned scheme is re-profiled with ``compute()``: its memory must fit the budget, and, when
the table was used, equal the table's estimate (else the mode is declared non-additive for this
run and the search is redone with ``compute()`` as the memory function).

With ``recompute`` (segment sizes), the search also chooses which segments the backward
recomputes (``memplan.search.execution``): every recompute set it tries is searched as above and
the best candidate over them kept; the scheme records the set (``Scheme.execution``). So is each
micro-batch count of ``micro_batches`` (gradient accumulation; ``memplan.search.execution``).

An optional FLOPs budget (``flops_budget``) bounds the backward FLOPs of one training step
(``memplan.search.memory.FLOPS_FIGURE``: conv / linear / matmul backward, FLOPs = 2 x MACs)
besides the memory: a FLOPs table is built and checked the same way, every method keeps both
budgets, and the result is re-profiled for both. Without one, nothing changes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch.nn as nn

from ..accounting.devices import Device, deployed_bytes, flash_fit, load_device
from ..api import Captured
from ..errors import BadOption, SchemeError
from ..options import with_keywords
from ..plan import new_provenance
from ..units import fmt_bytes, parse_flops
from .budgets import BudgetError, all_additive, flops_table, memory_budget
from .exact import relative_gap
from .execution import Segments, check_execution, execution_family, micro_captures
from .inputs import capture_inputs, profile_training, resolution_warnings
from .memory import Additivity, MemoryModel, build_table, check_additivity, probe_candidates
from .methods import METHODS, Prepared, default_method, general_methods, run_methods, wanted_methods
from .objective import OBJECTIVES, default_objective
from .options import SearchOptions
from .result import SearchResult, space_size
from .space import (
    Contributions,
    build_space,
)


@dataclass
class _Search:
    """What the steps of one search share: the options as given (never changed) and what the steps
    derive from them (the mode, the budgets; the objective and the optimizer, from the profile where
    the options leave them open)."""

    opts: SearchOptions
    mode: str
    budget_bytes: int
    budget_text: str
    convention: str
    device: Device | None
    flash: dict[str, Any] | None = None  # with a device: accounting.devices.flash_fit of the model
    flops_budget: int | None = None  # backward FLOPs per training step (memory.FLOPS_FIGURE)
    flops_text: str | None = None  # as given
    objective: str = ""  # what is maximised: the option, else the profile's default (_prepare)
    optimizer: str = ""  # whose state is counted: the option, else the one the profile's runs trained with
    seconds: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Read:
    """What the search read: the model's capture, its contribution profile and that profile's file
    (None: given as an object)."""

    cap: Captured
    contributions: Contributions
    profile_path: Any


@dataclass
class _Found:
    """What the method found: its name, the results by method (``memplan.search.methods``) and the
    measured memory of the best candidate, bytes."""

    method: str
    runs: dict[str, Any]
    measured: int


@with_keywords(SearchOptions, positional=("budget",))
def run_search(model: str | nn.Module | None = None, opts: SearchOptions | None = None) -> SearchResult:
    """Search the sparse-update scheme of largest summed Δacc whose memory fits ``budget``.

    ``model``: zoo name, import spec or module (default: :data:`DEFAULT_MODEL`). ``opts``: the
    :class:`~memplan.search.options.SearchOptions` (default: every option at its default), or its
    options by name as keywords, ``budget`` also second by position (``run_search("mcunet-5fps",
    "100KB", classes=10)``; given with ``opts``, they change a copy of it); each option's field says
    what it does. ``budget``: "100KB" (1000-based), "100KiB" (1024-based), "0.1MB", or bytes; or
    ``target``: a device profile name / JSON path (its budget for the mode, ``Device.budget_for``). Contribution
    profile: ``profile_path``, a ``profile`` (object or dict), or the shipped profile whose
    fingerprint matches the model. ``method``: a search method (``memplan.search.methods``; default:
    exact when memory is additive, else evolution). ``curves``: also run evolution and random search
    for their best-so-far curves (the 256KB paper's Figure 13, ``memplan.render.figures.plot_search``).
    ``optimizer``: the optimizer whose state the mode counts (default: the one the profile's runs
    trained with); ``objective``: what is maximised (``memplan.search.objective``) over the profile's
    entries in its estimator's units (grid: Δacc; fisher / rgn: importance, summed alike; default: lcb,
    or mean for a profile without standard errors). With neither ``resolution`` nor ``input_shape``,
    a model is costed at its profile's costing resolution; a warning is recorded when it differs from
    the input the runs used.
    """
    search = _start(opts or SearchOptions())
    t0 = time.perf_counter()
    read = _Read(*capture_inputs(model, search.opts.inputs))
    search.seconds["capture"] = time.perf_counter() - t0
    search.warnings += resolution_warnings(read.cap, read.contributions)
    _check_flash(search, read.cap)
    prepared, additivity, found = _joint(search, read)
    return _result(search, read, prepared, additivity, found)


def _start(opts: SearchOptions) -> _Search:
    """Checked options, the mode and the budget."""
    solver, acc = opts.solver, opts.accounting
    budget = acc.budget
    if solver.method is not None:
        METHODS.choose(solver.method)
    for name, value in (("generations", solver.generations), ("population", solver.population)):
        if not isinstance(value, int) or value < 1:
            raise BadOption(f"{name} must be a positive integer, got {value!r}")
    mode = acc.mode
    if mode is None:
        mode = load_device(acc.target).mode if acc.target is not None and budget is None else "tinytraining"
    search = _Search(opts, mode, *memory_budget(budget, acc.target, mode))
    if acc.flops_budget is not None:
        search.flops_budget, search.flops_text = parse_flops(acc.flops_budget), str(acc.flops_budget)
    return search


def _check_flash(search: _Search, cap: Captured) -> None:
    """With a device: whether the frozen model, as the mode deploys it, fits its flash
    (``search.flash``); a warning when it does not (not refused: ``accounting.devices``)."""
    if search.device is None:
        return
    search.flash = flash_fit(search.device, deployed_bytes(cap.graph, search.mode))
    if search.flash["flash_fits"] is False:
        search.warnings.append(
            f"the frozen model ({search.flash['flash_needed_bytes']} B as mode {search.mode} deploys it) does not "
            f"fit the {search.flash['flash_bytes']} B flash of {search.device.name}: the scheme fits its SRAM, "
            "but the model cannot be deployed there as it is"
        )


def _joint(search: _Search, read: _Read) -> tuple[Prepared, Additivity, _Found]:
    """The search of every execution set (each micro-batch count, 1 first, with each recompute set of
    ``execution_family``), the best kept: largest gain, then least memory, FLOPs, micro-batches,
    segments. A set whose floor exceeds the budget is passed over (refused when every set's does), and
    so is one under which the method asked for does not apply (a warning says so)."""
    acc = search.opts.accounting
    check_execution(search.mode, acc.recompute, acc.micro_batches)
    best: tuple[tuple, Prepared, Additivity, _Found] | None = None
    refused: list[BudgetError] = []
    for micro, cap in micro_captures(read.cap, acc.micro_batches):
        for segments in execution_family(cap.graph, acc.recompute, cap.model):
            searched = _search_set(search, cap, read.contributions, segments, micro, refused)
            if searched is not None and (best is None or searched[0] > best[0]):
                best = searched
    search.warnings[:] = list(dict.fromkeys(search.warnings))  # each set's search may warn alike
    if best is None:  # the set that needs the least memory says by how much
        raise min(refused, key=lambda exc: (exc.floor is None, exc.floor or 0))
    return best[1], best[2], best[3]


def _search_set(
    search: _Search,
    cap: Captured,
    contributions: Contributions,
    segments: Segments,
    micro: int,
    refused: list[BudgetError],
) -> tuple[tuple, Prepared, Additivity, _Found] | None:
    """The search under one execution set (``_joint``): (its ranking key, prepared, additivity,
    found), or None where it is passed over (its BudgetError appended to ``refused``)."""
    try:
        prepared, additivity = _prepare(search, cap, contributions, segments, micro)
    except BudgetError as exc:
        refused.append(exc)
        return None
    except SchemeError as exc:  # micro-batches where a norm uses batch statistics
        raise BadOption(exc.message.removeprefix("scheme execution: "), exc.hint) from None
    try:
        found = _run(search, prepared, additivity)
    except BadOption as exc:  # the method asked for does not apply under this set
        if not segments and micro == 1:
            raise
        what = f"recompute set from {segments[0][0]} in {len(segments)} segments" if segments else "set"
        search.warnings.append(f"{what} with {micro} micro-batch(es) left out: {exc}")
        return None
    cand = found.runs[found.method].candidate
    memory = prepared.memory
    key = (prepared.space.value(cand), -found.measured, -memory.flops(cand), -micro, -len(segments))
    return key, prepared, additivity, found


def _prepare(
    search: _Search, cap: Captured, contributions: Contributions, recompute: Segments = (), micro_batches: int = 1
) -> tuple[Prepared, Additivity]:
    """The space (every candidate recomputing the segments ``recompute``, in ``micro_batches``
    micro-batches of ``cap``'s batch), the memory model, the
    cost table (refusing a budget below the classifier-only memory) and the additivity check on
    probe candidates; with a FLOPs budget the FLOPs table and its check too
    (``Prepared.flops_table``, ``Additivity.flops``)."""
    sp, acc, seconds = search.opts.space, search.opts.accounting, search.seconds
    search.objective = sp.objective or default_objective(contributions.bias_se, contributions.weight_se)
    if sp.objective is None and not OBJECTIVES[search.objective].needs_se:  # the default ignores noise
        search.warnings.append(
            "the profile has no standard errors (one seed per entry): the search maximises the measured "
            "summed Δacc, which chases noise; measure with several seeds for a noise-aware objective"
        )
    space = build_space(
        cap.graph,
        contributions,
        model=cap.name,
        ratios=sp.ratios,
        pw1_only=sp.pw1_only,
        max_weight_layers=sp.max_weight_layers,
        objective=search.objective,
        select=sp.select,
    )
    space.recompute = recompute
    space.micro_batches = micro_batches
    search.optimizer = acc.optimizer or contributions.optimizer  # count the state of the optimizer that trains
    memory = MemoryModel(
        space,
        search.mode,
        acc.metric,
        optimizer=search.optimizer,
        frozen_bits=acc.frozen_bits,
        mode_options=acc.mode_options,
    )
    t0 = time.perf_counter()
    table = build_table(memory)
    seconds["table"] = time.perf_counter() - t0
    floor = table.base[0]
    if search.budget_bytes < floor:
        raise BudgetError(
            f"budget {search.budget_text} = {search.budget_bytes} B is below the classifier-only memory "
            f"{floor} B ({fmt_bytes(floor)}) of {cap.name} under mode {search.mode} ({acc.metric})",
            "raise the budget",
            floor=floor,
        )
    t0 = time.perf_counter()
    solver = search.opts.solver
    probes = probe_candidates(space, seed=solver.seed)
    additivity = check_additivity(memory, table, probes)
    ftable = flops_table(memory, search.flops_budget, search.flops_text, probes, additivity)  # None: no budget
    seconds["additivity"] = time.perf_counter() - t0  # with a FLOPs budget: its table and check too
    prepared = Prepared(
        space,
        memory,
        table,
        all_additive(additivity),
        search.budget_bytes,
        solver.seed,
        solver.generations,
        solver.population,
        flops_table=ftable,
        flops_budget=search.flops_budget,
    )
    return prepared, additivity


def _run(search: _Search, prepared: Prepared, additivity: Additivity) -> _Found:
    """The method, the results by method and the measured memory of the best candidate. The table's
    estimate of the best is checked against ``compute()`` (and the FLOPs table's, with a FLOPs
    budget); where they differ the mode is declared non-additive for this run and the search
    redone with ``compute()`` as the memory (and FLOPs) function."""
    opts = search.opts
    method = opts.solver.method or default_method(prepared.additive)
    if not METHODS[method].applies(prepared.additive):
        what = "memory is" if not additivity.additive else "backward FLOPs are"
        metric = opts.accounting.metric
        raise BadOption(
            f"{what} not additive under mode {search.mode} ({metric}): the {method} solver does not apply",
            f"use method {' or '.join(general_methods())}",
        )
    runs = run_methods(prepared, wanted_methods(method, prepared.additive, opts.solver.curves), search.seconds)
    cand = runs[method].candidate
    measured = prepared.memory.measure(cand)
    if prepared.additive:
        additivity.record(cand, prepared.table.estimate(cand), measured)
        if additivity.flops is not None:
            additivity.flops.record(cand, prepared.flops_table.estimate(cand), prepared.memory.flops(cand))
        if not all_additive(additivity):
            method = default_method(False)  # the table misled: search again with compute() itself
            prepared = replace(prepared, additive=False, runs={}, _toolbox=None)
            runs = run_methods(prepared, wanted_methods(method, False, opts.solver.curves), search.seconds)
            cand = runs[method].candidate
            measured = prepared.memory.measure(cand)
    if measured > search.budget_bytes:  # repair guarantees feasibility; this is a bug, never a user error
        raise RuntimeError(f"search returned {cand.describe()} using {measured} B > budget {search.budget_bytes} B")
    if search.flops_budget is not None and prepared.memory.flops(cand) > search.flops_budget:
        raise RuntimeError(
            f"search returned {cand.describe()} using {prepared.memory.flops(cand)} backward FLOPs "
            f"> FLOPs budget {search.flops_budget}"
        )
    return _Found(method, runs, measured)


def _result(search: _Search, read: _Read, prepared: Prepared, additivity: Additivity, found: _Found) -> SearchResult:
    """The scheme of the best candidate (saved to ``out`` if given) and the :class:`SearchResult`."""
    opts, space, memory = search.opts, prepared.space, prepared.memory
    cap, contributions, profile_path = read.cap, read.contributions, read.profile_path
    method, runs, measured = found.method, found.runs, found.measured
    cand = runs[method].candidate
    value = space.value(cand)
    summed = space.summed(cand)
    delta_acc = contributions.is_delta_acc
    breakdown = memory.breakdown(cand)
    flops = memory.flops(cand)  # compute() of the scheme, never the table
    bounded = {} if search.flops_budget is None else {"flops_budget": search.flops_budget}
    recomputed = (
        {"recompute_flops": memory.profile(cand).totals.recompute_flops * space.micro_batches}
        if space.recompute
        else {}
    )
    scheme = space.to_scheme(
        cand,
        mode=search.mode,
        budget_bytes=search.budget_bytes,
        predicted={
            **breakdown,
            "memory_bytes": measured,
            **({"backward_flops": flops} if bounded else {}),
            **recomputed,
        },
        **bounded,
        summed_delta_acc=summed if delta_acc else None,
        summed_estimate=None if delta_acc else summed,
        optimizer=search.optimizer,
        provenance=new_provenance(opts.output.command, contributions.sha256, search.objective, contributions.estimator),
        training=profile_training(contributions, cand, search.optimizer),
    )
    result = SearchResult(
        model=cap.name,
        input_shape=list(cap.graph.input_shape[1:]),
        mode=search.mode,
        metric=opts.accounting.metric,
        method=method,
        budget_bytes=search.budget_bytes,
        budget_text=search.budget_text,
        budget_convention=search.convention,
        device=search.device,
        flash=search.flash,
        profile_path=str(profile_path) if profile_path is not None else None,
        profile_hash=contributions.sha256,
        scheme=scheme,
        summed=summed,
        units=contributions.units,
        memory_bytes=measured,
        breakdown=breakdown,
        additive=all_additive(additivity),
        additivity=additivity,
        space_size=space_size(space),
        table=prepared.table,
        runs=dict(runs),
        compute_calls=memory.calls,
        seconds=search.seconds,
        warnings=search.warnings,
        objective=search.objective,
        objective_value=value,
        backward_flops=flops,
        flops_budget=search.flops_budget,
        flops_budget_text=search.flops_text,
        flops_table=prepared.flops_table,
    )
    if result.reference is not None and result.additive:
        result.gap_to_exact = relative_gap(value, result.reference.value)
    if opts.output.out is not None:
        scheme.save(opts.output.out)
        result.out = str(opts.output.out)
    return result
