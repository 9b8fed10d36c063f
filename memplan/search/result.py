"""What one search produced, as plain data: :class:`SearchResult` (``memplan.render`` draws and
prints it; ``to_dict`` is its JSON form)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..accounting.devices import Device
from ..contrib.profile import is_delta_acc
from ..plan import Scheme
from .memory import Additivity, CostTable
from .methods import METHODS, reference_method
from .objective import DEFAULT_OBJECTIVE
from .space import SearchSpace


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
    # with a device: its flash and the frozen model's deployed size (accounting.devices.flash_fit), bytes
    flash: dict[str, Any] | None
    profile_path: str | None
    profile_hash: str
    scheme: Scheme
    summed: float  # the profile's means of the scheme's entries, summed, in ``units``
    units: str  # what the profile's entries are (Δacc points for a grid profile, else its estimator's units)
    memory_bytes: int  # compute() of the scheme, the bounded metric
    breakdown: dict[str, int]
    additive: bool  # memory (and backward FLOPs, with a FLOPs budget) is the tables' sum: exact applies
    additivity: Additivity  # its ``flops``: the FLOPs table's check, with a FLOPs budget
    space_size: dict[str, Any]
    table: CostTable
    # the result of every method run (``memplan.search.methods.METHODS``: its name), in registration order;
    # also read as attributes (``result.exact``: None when the method did not run)
    runs: dict[str, Any] = field(default_factory=dict)
    gap_to_exact: float | None = None  # 1 - value / the reference method's value (0 = optimal); None without it
    compute_calls: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    out: str | None = None
    warnings: list[str] = field(default_factory=list)
    objective: str = DEFAULT_OBJECTIVE  # what the search maximised (memplan.search.objective)
    objective_value: float | None = None  # the scheme's summed gains under that objective (points)
    # backward FLOPs of one training step of the scheme, compute() (memplan.search.memory.FLOPS_FIGURE)
    backward_flops: int | None = None
    flops_budget: int | None = None  # the bound on backward_flops (FLOPs = 2 x MACs); None: memory only
    flops_budget_text: str | None = None  # as given
    flops_table: CostTable | None = None  # per-option backward FLOPs (with a FLOPs budget)

    def __getattr__(self, name: str) -> Any:
        """A method's result by the method's name (None when it did not run)."""
        if name in METHODS:
            return self.__dict__.get("runs", {}).get(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def reference(self) -> Any:
        """The result of the reference method (the optimum gaps are measured to), or None."""
        return self.runs.get(reference_method())

    @property
    def summed_delta_acc(self) -> float | None:
        """:attr:`summed` when the profile's entries are the grid's Δacc (points), else None."""
        return self.summed if is_delta_acc(self.units) else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the scheme as its JSON object, candidates as text, the cost table as rows."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "runs"}
        data["scheme"] = self.scheme.model_dump(mode="json")
        data["device"] = self.device.model_dump() if self.device else None
        data["additivity"] = asdict(self.additivity)
        data["table"] = _table_rows(self.table)
        if self.flops_table is not None:
            data["flops_table"] = _table_rows(self.flops_table)
        for name in METHODS:
            run = self.runs.get(name)
            data[name] = None if run is None else run.to_json()
        return data


def space_size(space: SearchSpace) -> dict[str, Any]:
    """The size of the space: convs, bias depths, weight layers and options, ratios."""
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


def _table_rows(table: CostTable) -> dict[str, Any]:
    """A cost table as JSON: ``base`` by depth, ``extra`` as [conv index, ratio, value] rows."""
    return {
        "base": {str(k): v for k, v in table.base.items()},
        "extra": [[i, r, v] for (i, r), v in table.extra.items()],
    }
