"""Device profiles (package data ``memplan/data/profiles/devices/*.json``): the memory of a target
device, the accounting mode that models training on it, and what lies outside that mode's peak.

Fields: ``name``, ``description``, ``sram_bytes`` (on-chip SRAM of a microcontroller, main memory of
a Linux board), ``flash_bytes`` (null without on-board flash), ``mode`` (the accounting mode whose
peak is the device's training memory: ``mcu`` for microcontrollers, ``pytorch`` for Linux boards),
``runtime_bytes`` (memory that mode's peak leaves out: stack, runtime, OS; an assumption, stated in
``notes``), ``reserve_bytes`` (for modes that count only the *extra* memory of training, such as
``tinytraining``: runtime + the forward working memory those modes leave out), ``notes`` (sources
and assumptions). All sizes are integers in bytes.

Budget (:meth:`Device.budget_for`): ``sram_bytes - runtime_bytes`` for a mode whose peak is the
whole step (``mcu``, ``pytorch``, ...), ``sram_bytes - reserve_bytes`` for an extra-only mode.

Flash (:func:`deployed_bytes`, :func:`fit`): the frozen model as the mode deploys it must also fit
``flash_bytes``. A model too large for flash is reported (``flash_fits`` False, a warning in the
search), not refused: the SRAM verdict of training is still meaningful, and the deployed form
(another quantisation, external flash) is the user's choice.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..costs.records import Profile
from ..errors import BadOption
from ..graph import LayerGraph, role
from ..io import read_json, shipped, validated
from ..modes import MODES, get_mode
from ..names import DEVICE_MODE

#: the shipped device profiles (package data)
DEVICES_DIR = shipped("profiles") / "devices"


class Device(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    sram_bytes: int = Field(gt=0)
    flash_bytes: int | None = Field(None, gt=0)
    reserve_bytes: int = Field(ge=0)
    mode: str = DEVICE_MODE
    runtime_bytes: int = Field(0, ge=0)
    notes: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _fits(self) -> Device:
        if self.reserve_bytes >= self.sram_bytes or self.runtime_bytes >= self.sram_bytes:
            raise ValueError("reserve_bytes and runtime_bytes must be smaller than sram_bytes")
        if self.mode not in MODES:
            raise ValueError(f"unknown accounting mode {self.mode!r}; known: {', '.join(MODES)}")
        return self

    @property
    def budget_bytes(self) -> int:
        """Memory left to training in the device's own mode, bytes (:meth:`budget_for`)."""
        return self.budget_for(self.mode)

    def budget_for(self, mode: str) -> int:
        """Memory left to what ``mode`` counts: SRAM less the runtime for a whole-step mode, SRAM
        less the reserve for an extra-only mode (``Mode.extra_only``), bytes."""
        return self.sram_bytes - (self.reserve_bytes if get_mode(mode).extra_only else self.runtime_bytes)

    def budget_text(self, mode: str) -> str:
        if get_mode(mode).extra_only:
            return f"SRAM {self.sram_bytes} B - reserve {self.reserve_bytes} B (mode {mode} counts extra memory only)"
        return f"SRAM {self.sram_bytes} B - runtime {self.runtime_bytes} B (mode {mode} models the whole step)"


def deployed_bytes(graph: LayerGraph, mode: str) -> int:
    """Bytes of the frozen model as ``mode`` deploys it (what must fit flash), from the captured
    graph's parameters (each counted once): in a mode with ``Mode.deployed_bits`` (``tinytraining``,
    ``mcu``: int8 weights, int32 biases) every bias (a conv / linear bias, a norm's shift) at the
    bias bits and every other parameter (conv / linear weights, a norm's scale) at the weight bits,
    as those modes charge an updated parameter; in another mode each parameter at its own dtype's
    itemsize. Buffers (running statistics, quantisation scales) are left out."""
    bits = get_mode(mode).deployed_bits
    total_bits = 0
    for node in graph.nodes:
        for name, param in node.params.items():
            if bits is None:
                total_bits += param.numel * param.dtype.itemsize * 8
            else:
                total_bits += param.numel * bits[role(name) == "bias"]
    return -(-total_bits // 8)


def flash_fit(dev: Device, needed: int) -> dict[str, Any]:
    """``flash_bytes`` (None: the device has none), ``flash_needed_bytes`` (``needed``, bytes) and
    ``flash_fits`` (None without flash)."""
    fits = None if dev.flash_bytes is None else needed <= dev.flash_bytes
    return {"flash_bytes": dev.flash_bytes, "flash_needed_bytes": needed, "flash_fits": fits}


def fit(p: Profile, dev: Device, graph: LayerGraph | None = None) -> dict[str, Any]:
    """Whether ``p``'s peak fits ``dev``'s SRAM in ``p``'s mode: budget, peak and margin (budget -
    peak; negative: does not fit), ``fits`` (the SRAM verdict); with ``graph`` (the profiled
    model's), whether its frozen model fits the flash (:func:`flash_fit` of :func:`deployed_bytes`).
    All sizes in bytes."""
    budget = dev.budget_for(p.mode)
    peak = p.totals.peak_bytes
    flash = {} if graph is None else flash_fit(dev, deployed_bytes(graph, p.mode))
    return {
        "name": dev.name,
        "mode": p.mode,
        "budget_bytes": budget,
        "budget": dev.budget_text(p.mode),
        "peak_bytes": peak,
        "margin_bytes": budget - peak,
        "fits": peak <= budget,
        **flash,
    }


def device_names(directory: str | os.PathLike = DEVICES_DIR) -> list[str]:
    return sorted(p.stem for p in Path(directory).glob("*.json"))


def load_device(name_or_path: str | os.PathLike, directory: str | os.PathLike = DEVICES_DIR) -> Device:
    """A device by name (``stm32f746``; case-insensitive) or by the path of its JSON file."""
    path = Path(name_or_path)
    if path.suffix != ".json":
        path = Path(directory) / f"{str(name_or_path).strip().lower()}.json"
        if not path.is_file():
            raise BadOption(
                f"unknown device {str(name_or_path)!r}",
                f"known devices: {', '.join(device_names(directory)) or 'none'}; or give a JSON file",
            )
    data = read_json(path, "device profile")
    return validated(lambda: Device.model_validate(data), f"device profile {path}", BadOption)
