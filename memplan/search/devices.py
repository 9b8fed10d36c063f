"""Device profiles (package data ``memplan/data/profiles/devices/*.json``): memory of a target device and the reserve kept
for its runtime, stack and forward buffers; the search budget is ``sram_bytes - reserve_bytes``.

Fields: ``name``, ``description``, ``sram_bytes`` (on-chip SRAM of a microcontroller, main memory of
a Linux board), ``flash_bytes`` (null without on-board flash), ``reserve_bytes``, ``notes`` (sources
and what the reserve covers). All sizes are integers in bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import BadOption
from ..io import read_json, shipped, validated

#: the shipped profiles (contribution profiles here, devices in ``devices/``); package data
PROFILES_DIR = shipped("profiles")
DEVICES_DIR = PROFILES_DIR / "devices"


class Device(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    sram_bytes: int = Field(gt=0)
    flash_bytes: int | None = Field(None, gt=0)
    reserve_bytes: int = Field(ge=0)
    notes: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _fits(self) -> "Device":
        if self.reserve_bytes >= self.sram_bytes:
            raise ValueError("reserve_bytes must be smaller than sram_bytes")
        return self

    @property
    def budget_bytes(self) -> int:
        """Memory left to training: SRAM (main memory) less the reserve, bytes."""
        return self.sram_bytes - self.reserve_bytes


def device_names(directory: str | os.PathLike = DEVICES_DIR) -> list[str]:
    return sorted(p.stem for p in Path(directory).glob("*.json"))


def load_device(name_or_path: str | os.PathLike, directory: str | os.PathLike = DEVICES_DIR) -> Device:
    """A device by name (``stm32f746``; case-insensitive) or by the path of its JSON file."""
    path = Path(name_or_path)
    if path.suffix != ".json":
        path = Path(directory) / f"{str(name_or_path).strip().lower()}.json"
        if not path.is_file():
            raise BadOption(f"unknown device {str(name_or_path)!r}",
                            f"known devices: {', '.join(device_names(directory)) or 'none'}; or give a JSON file")
    data = read_json(path, "device profile")
    return validated(lambda: Device.model_validate(data), f"device profile {path}", BadOption)
