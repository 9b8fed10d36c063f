"""``run_search``: budget -> searched sparse-update scheme, as plain data (:class:`SearchResult`;
``memplan.render`` draws and prints it). The CLI (``memplan search``) is a thin layer over these.

Steps: trace the model; read its contribution profile; build the space; derive the per-option
cost table from ``memplan.costs.engine.compute`` and check additivity on probe candidates; then

* ``method="exact"`` (the default when memory is additive): the certified optimum
  (``memplan.search.exact``);
* ``method="evolution"`` (the default otherwise) or ``"random"``: DEAP search with the same
  operators; with additive memory the exact optimum is also computed to report the gap.

The returned scheme is re-profiled with ``compute()``: its memory must fit the budget, and, when
the table was used, equal the table's estimate (else the mode is declared non-additive for this
run and the search is redone with ``compute()`` as the memory function).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch.nn as nn

from ..api import capture
from ..contrib.profile import ContribProfile
from ..errors import BadOption, MemplanError
from ..io import read_json
from ..plan import Scheme, fingerprint, new_provenance
from ..units import fmt_bytes, parse_bytes
from .devices import PROFILES_DIR, Device, load_device
from .evolution import Trace, evolve
from .exact import ExactResult, relative_gap, solve_exact
from .memory import Additivity, CostTable, MemoryModel, build_table, check_additivity, probe_candidates
from .random_search import random_search
from .space import DEFAULT_RATIOS, ProfileError, SearchSpace, build_space, contributions_of, load_contributions
from .toolbox import Problem, make_toolbox

#: the default microcontroller model (the 256KB paper's MCUNet-5FPS at 128 px)
DEFAULT_MODEL = "mcunet-5fps"
DEFAULT_RESOLUTION = 128
METHODS = ("exact", "evolution", "random")


class BudgetError(MemplanError):
    """No scheme fits the budget."""


@dataclass
class SearchResult:
    """Everything one search produced. Bytes are integers; Δacc is in the profile's units."""

    model: str
    input_shape: list[int]
    mode: str
    metric: str  # which Profile figure the budget bounds (memplan.search.memory.METRICS)
    method: str  # the method that produced ``scheme``
    budget_bytes: int
    budget_text: str  # as given ("100KB", or the device name)
    budget_convention: str  # how the text was read
    device: Device | None
    profile_path: str | None
    profile_hash: str
    scheme: Scheme
    summed_delta_acc: float  # measured means of the scheme's entries, summed (points)
    memory_bytes: int  # compute() of the scheme, the bounded metric
    breakdown: dict[str, int]
    additive: bool
    additivity: Additivity
    space_size: dict[str, Any]
    table: CostTable
    exact: ExactResult | None = None
    gap_to_exact: float | None = None  # 1 - value / exact value (0 = optimal); None without exact
    evolution: Trace | None = None
    random: Trace | None = None
    compute_calls: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    out: str | None = None
    warnings: list[str] = field(default_factory=list)
    objective: str = "mean"  # what the search maximised (memplan.search.objective)
    objective_value: float | None = None  # the scheme's summed gains under that objective (points)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the scheme as its JSON object, candidates as text, the cost table as rows."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["scheme"] = self.scheme.model_dump(mode="json")
        data["device"] = self.device.model_dump() if self.device else None
        data["additivity"] = asdict(self.additivity)
        data["table"] = {
            "base": {str(k): v for k, v in self.table.base.items()},
            "extra": [[i, r, v] for (i, r), v in self.table.extra.items()],
        }
        if self.exact is not None:
            data["exact"] = {**asdict(self.exact), "candidate": self.exact.candidate.describe()}
        for name in ("evolution", "random"):
            trace = getattr(self, name)
            if trace is not None:
                data[name] = {**asdict(trace), "best": trace.best.describe()}
        return data


def budget_convention(text: str | int | float) -> str:
    """How ``memplan.units.parse_bytes`` reads the unit of ``text``."""
    unit = re.search(r"([A-Za-z]*)\s*$", str(text)).group(1).lower() if isinstance(text, str) else ""
    if unit in ("", "b"):
        return "bytes"
    return "1024-based (KiB, MiB, GiB)" if unit.endswith("ib") else "1000-based (kB, MB, GB; KB read as kB)"


def find_profile(graph_fingerprint: str, directory: str | os.PathLike = PROFILES_DIR) -> Path:
    """The shipped contribution profile (``profiles/*.json``) measured on this layer table."""
    for path in sorted(Path(directory).glob("*.json")):
        try:
            data = read_json(path, "contribution profile")
        except MemplanError:
            continue
        if data.get("fingerprint") == graph_fingerprint and "bias" in data:
            return path
    raise ProfileError(
        f"no shipped contribution profile in {directory} matches this model (fingerprint {graph_fingerprint})",
        "measure one with memplan contrib and pass it as profile",
    )


def _budget(
    budget: str | int | float | None, device: str | os.PathLike | None, mode: str
) -> tuple[int, str, str, Device | None]:
    if (budget is None) == (device is None):
        raise BadOption("give either a budget or a device", 'e.g. budget="100KB" or device="stm32f746"')
    if device is not None:
        dev = load_device(device)
        return dev.budget_for(mode), f"device {dev.name}", dev.budget_text(mode), dev
    return parse_bytes(budget), str(budget), budget_convention(budget), None


def run_search(
    model: str | nn.Module | None = None,
    budget: str | int | float | None = None,
    *,
    profile_path: str | os.PathLike | None = None,
    profile: ContribProfile | None = None,
    device: str | os.PathLike | None = None,
    mode: str | None = None,
    metric: str = "total",
    method: str | None = None,
    generations: int = 100,
    population: int = 100,
    seed: int = 0,
    out: str | os.PathLike | None = None,
    curves: bool = False,
    ratios: Iterable[float] = DEFAULT_RATIOS,
    pw1_only: bool = False,
    max_weight_layers: int | None = None,
    classes: int | None = None,
    resolution: int | None = None,
    input_shape: Sequence[int] | None = None,
    optimizer: str | None = None,
    objective: str = "mean",
    frozen_bits: int = 32,
    command: str | None = None,
    mode_options: dict[str, Any] | None = None,
) -> SearchResult:
    """Search the sparse-update scheme of largest summed Δacc whose memory fits ``budget``.

    ``model``: zoo name, import spec or module (default: mcunet-5fps at 128 px). ``budget``:
    "100KB" (1000-based), "100KiB" (1024-based), "0.1MB", or bytes; or ``device``: a device
    profile name / JSON path (its budget for the mode, ``Device.budget_for``). Contribution profile: ``profile_path``,
    a ``profile`` dict, or the shipped profile whose fingerprint matches the model. ``mode`` /
    ``metric``: memplan's accounting mode (default: the device's, else ``tinytraining``) and which
    figure the budget bounds (``"total"``, ``"peak"``). ``method``: exact | evolution | random (default: exact
    when memory is additive,
    else evolution). ``generations`` / ``population`` / ``seed``: the DEAP run (random search
    gets as many evaluations). ``ratios``, ``pw1_only``, ``max_weight_layers``: the space.
    ``classes`` / ``resolution`` / ``input_shape`` (per sample): the traced model (classes default
    to the profile's). ``out``: write the scheme JSON. ``curves``: also run evolution and random
    search for their best-so-far curves (the 256KB paper's Figure 13, ``memplan.render.figures.plot_search``).
    ``optimizer`` / ``mode_options``: the optimizer whose state the mode counts (default: the one the
    profile's runs trained with) and the mode's options
    (``Mode.configure``, e.g. ``{"grad_accumulation": True}`` for ``tinytraining``). With neither
    ``resolution`` nor ``input_shape``, a model is costed at its profile's costing resolution; a
    warning is recorded when the costing input differs from the one the profile's runs used.
    """
    if method is not None and method not in METHODS:
        raise BadOption(f"unknown search method {method!r}", f"choose one of: {', '.join(METHODS)}")
    for name, value in (("generations", generations), ("population", population)):
        if not isinstance(value, int) or value < 1:
            raise BadOption(f"{name} must be a positive integer, got {value!r}")
    if mode is None:
        mode = load_device(device).mode if device is not None and budget is None else "tinytraining"
    budget_bytes, budget_text, convention, dev = _budget(budget, device, mode)
    seconds: dict[str, float] = {}

    t0 = time.perf_counter()
    if model is None:
        model, resolution = DEFAULT_MODEL, resolution or DEFAULT_RESOLUTION
    contributions = None
    if profile is not None:
        contributions = contributions_of(profile, "contribution profile (given)")
    elif profile_path is not None:
        contributions = load_contributions(profile_path)
    if contributions is not None and resolution is None and input_shape is None:
        resolution = contributions.costing_resolution
    cap = capture(
        model,
        batch=1,
        resolution=resolution,
        input_shape=input_shape,
        classes=classes or (contributions.classes if contributions else None),
    )
    seconds["capture"] = time.perf_counter() - t0
    if contributions is None:
        profile_path = find_profile(fingerprint(cap.graph))
        contributions = load_contributions(profile_path)
        own = resolution is None and input_shape is None and contributions.costing_resolution is not None
        if own:
            resolution = contributions.costing_resolution
        if own or (classes is None and contributions.classes and contributions.classes != cap.classes):
            cap = capture(
                model, batch=1, resolution=resolution, input_shape=input_shape, classes=classes or contributions.classes
            )
    warnings = []
    costed = tuple(cap.graph.input_shape[1:])
    if contributions.run_shape is not None and tuple(contributions.run_shape) != costed:
        warnings.append(
            f"the contribution runs were made at input {'x'.join(map(str, contributions.run_shape))}; "
            f"this search costs memory at {'x'.join(map(str, costed))}: its Δacc were measured at "
            f"another resolution"
        )
    space = build_space(
        cap.graph,
        contributions,
        model=cap.name,
        ratios=ratios,
        pw1_only=pw1_only,
        max_weight_layers=max_weight_layers,
        objective=objective,
    )
    optimizer = optimizer or contributions.optimizer  # count the state of the optimizer that trains
    memory = MemoryModel(space, mode, metric, optimizer=optimizer, frozen_bits=frozen_bits, mode_options=mode_options)

    t0 = time.perf_counter()
    table = build_table(memory)
    seconds["table"] = time.perf_counter() - t0
    floor = table.base[0]
    if budget_bytes < floor:
        raise BudgetError(
            f"budget {budget_text} = {budget_bytes} B is below the classifier-only memory "
            f"{floor} B ({fmt_bytes(floor)}) of {cap.name} under mode {mode} ({metric})",
            "raise the budget",
        )
    t0 = time.perf_counter()
    additivity = check_additivity(memory, table, probe_candidates(space, seed=seed))
    seconds["additivity"] = time.perf_counter() - t0
    method = method or ("exact" if additivity.additive else "evolution")
    if method == "exact" and not additivity.additive:
        raise BadOption(
            f"memory is not additive under mode {mode} ({metric}): the exact solver does not apply",
            "use method evolution or random",
        )

    runs = _search(
        space,
        memory,
        table,
        additivity,
        budget_bytes,
        method,
        curves,
        seed=seed,
        generations=generations,
        population=population,
        seconds=seconds,
    )
    best = {"exact": runs.get("exact"), "evolution": runs.get("evolution"), "random": runs.get("random")}[method]
    cand = best.candidate if isinstance(best, ExactResult) else best.best
    measured = memory.measure(cand)
    if additivity.additive:
        additivity.record(cand, table.estimate(cand), measured)
        if not additivity.additive:  # the table misled: search again with compute() itself
            method = "evolution"
            runs = _search(
                space,
                memory,
                table,
                additivity,
                budget_bytes,
                method,
                curves,
                seed=seed,
                generations=generations,
                population=population,
                seconds=seconds,
            )
            cand, measured = runs["evolution"].best, memory.measure(runs["evolution"].best)
    if measured > budget_bytes:  # repair guarantees feasibility; this is a bug, never a user error
        raise RuntimeError(f"search returned {cand.describe()} using {measured} B > budget {budget_bytes} B")

    value = space.value(cand)
    summed = space.summed_delta_acc(cand)
    breakdown = memory.breakdown(cand)
    scheme = space.to_scheme(
        cand,
        mode=mode,
        budget_bytes=budget_bytes,
        predicted={**breakdown, "memory_bytes": measured},
        summed_delta_acc=summed,
        provenance=new_provenance(command, contributions.sha256),
    )
    exact = runs.get("exact")
    result = SearchResult(
        model=cap.name,
        input_shape=list(cap.graph.input_shape[1:]),
        mode=mode,
        metric=metric,
        method=method,
        budget_bytes=budget_bytes,
        budget_text=budget_text,
        budget_convention=convention,
        device=dev,
        profile_path=str(profile_path) if profile_path is not None else None,
        profile_hash=contributions.sha256,
        scheme=scheme,
        summed_delta_acc=summed,
        memory_bytes=measured,
        breakdown=breakdown,
        additive=additivity.additive,
        additivity=additivity,
        space_size=_space_size(space),
        table=table,
        exact=exact,
        gap_to_exact=relative_gap(value, exact.value) if exact is not None and additivity.additive else None,
        evolution=runs.get("evolution"),
        random=runs.get("random"),
        compute_calls=memory.calls,
        seconds=seconds,
        warnings=warnings,
        objective=objective,
        objective_value=value,
    )
    if out is not None:
        scheme.save(out)
        result.out = str(out)
    return result


def _search(
    space: SearchSpace,
    memory: MemoryModel,
    table: CostTable,
    additivity: Additivity,
    budget: int,
    method: str,
    curves: bool,
    *,
    seed: int,
    generations: int,
    population: int,
    seconds: dict[str, float],
) -> dict[str, Any]:
    """Run the requested method, exact too when additive (for the gap), evolution + random for curves."""
    runs: dict[str, Any] = {}
    if additivity.additive:
        t0 = time.perf_counter()
        runs["exact"] = solve_exact(space, table, budget)
        seconds["exact"] = time.perf_counter() - t0
    wanted = {"evolution", "random"} if curves else set()
    wanted |= {method} - {"exact"}
    if wanted:
        problem = Problem(
            space, table, budget, table.estimate if additivity.additive else memory.measure, additivity.additive
        )
        toolbox = make_toolbox(problem)
        if "evolution" in wanted or "random" in wanted:
            t0 = time.perf_counter()
            runs["evolution"] = evolve(problem, toolbox, population=population, generations=generations, seed=seed)
            seconds["evolution"] = time.perf_counter() - t0
        if "random" in wanted:
            t0 = time.perf_counter()
            runs["random"] = random_search(problem, toolbox, evaluations=runs["evolution"].evaluations, seed=seed)
            seconds["random"] = time.perf_counter() - t0
    return runs


def _space_size(space: SearchSpace) -> dict[str, Any]:
    options = sum(len(c.ratios) for c in space.layers)
    return {
        "convs": space.n_convs,
        "bias_depths": len(space.ks),
        "weight_layers": len(space.layers),
        "weight_options": options,
        "ratios": list(space.ratio_set),
        "pw1_only": space.pw1_only,
        "max_weight_layers": space.max_weight_layers,
    }
