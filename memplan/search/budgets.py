"""The budgets of a search: memory (bytes, or a device's budget for the mode) and, optionally,
backward FLOPs per training step (``memplan.search.memory.FLOPS_FIGURE``): reading them, and the
FLOPs table with its floor and additivity check."""

from __future__ import annotations

import os
import re

from ..accounting.devices import Device, load_device
from ..errors import BadOption, MemplanError
from ..units import fmt_flops, parse_bytes
from .memory import Additivity, CostTable, MemoryModel, build_table, check_additivity
from .space import Candidate


class BudgetError(MemplanError):
    """No scheme fits the budget; ``floor``: the least memory a scheme needs under the search's
    execution set, bytes (None where a FLOPs budget is what no scheme fits)."""

    def __init__(self, message: str, hint: str | None = None, floor: int | None = None):
        super().__init__(message, hint)
        self.floor = floor


#: how a unit is written where it is not read as it may look (``kb`` could be kilobits): the spelling it is read as
_CANONICAL = {
    **{"b": "B", "kb": "kB", "mb": "MB", "gb": "GB", "tb": "TB"},
    **{"kib": "KiB", "mib": "MiB", "gib": "GiB", "tib": "TiB"},
}


def budget_convention(text: str | int | float) -> str:
    """How ``memplan.units.parse_bytes`` reads the unit of ``text``; a unit spelled otherwise than
    B, kB / KB, MB, GB, TB, KiB, MiB, GiB, TiB (``100kb``, ``1mb``) is named with what it is read as."""
    given = re.search(r"([A-Za-z]*)\s*$", str(text)).group(1) if isinstance(text, str) else ""
    unit = given.lower()
    if unit in ("", "b"):
        base = "bytes"
    else:
        base = "1024-based (KiB, MiB, GiB)" if unit.endswith("ib") else "1000-based (kB, MB, GB; KB read as kB)"
    canonical = _CANONICAL.get(unit, given)
    if given in ("", canonical, "KB"):
        return base
    return f"{base}; {given} read as {canonical} (bytes, not bits)"


def memory_budget(
    budget: str | int | float | None, device: str | os.PathLike | None, mode: str
) -> tuple[int, str, str, Device | None]:
    """(bytes, as given, how it was read, the device if one sets it)."""
    if (budget is None) == (device is None):
        raise BadOption("give either a budget or a target", 'e.g. budget="100KB" or target="stm32f746"')
    if device is not None:
        dev = load_device(device)
        return dev.budget_for(mode), f"device {dev.name}", dev.budget_text(mode), dev
    return parse_bytes(budget), str(budget), budget_convention(budget), None


def all_additive(additivity: Additivity) -> bool:
    """Memory, and backward FLOPs where a FLOPs budget is given, are their tables' sums."""
    return additivity.additive and (additivity.flops is None or additivity.flops.additive)


def flops_table(
    memory: MemoryModel, budget: int | None, text: str | None, probes: list[Candidate], additivity: Additivity
) -> CostTable | None:
    """The backward-FLOPs table of ``memory``'s space (refusing a FLOPs ``budget`` below the
    classifier-only backward FLOPs), its additivity on ``probes`` recorded in ``additivity.flops``;
    None without a FLOPs budget."""
    if budget is None:
        return None
    table = build_table(memory, memory.flops)
    floor = table.base[0]
    if budget < floor:
        raise BudgetError(
            f"FLOPs budget {text} = {budget} FLOPs is below the classifier-only backward FLOPs {floor} "
            f"({fmt_flops(floor)}, 2 x MACs) of {memory.space.model} under mode {memory.mode.name}",
            "raise the FLOPs budget",
        )
    additivity.flops = check_additivity(memory, table, probes, memory.flops)
    return table
