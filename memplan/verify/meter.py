"""Peak memory of a real training step: ``torch.cuda.max_memory_allocated`` on CUDA, the
process's resident-set high-water mark on Linux CPUs (see ``memplan.verify`` for the method
and its glibc settings). Sizes in bytes."""

from __future__ import annotations

import ctypes
import re

import torch
import torch.nn as nn

M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


class PeakMeter:
    """Growth of memory in use during a step, in bytes (see the module docstring)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.base = 0
        if device.type == "cuda":
            self.source = "torch.cuda.max_memory_allocated"
        elif _proc_status("VmHWM") is not None and _can_reset_hwm():
            self.source = "process RSS high-water mark (/proc/self/status VmHWM)"
            _glibc("mallopt", M_MMAP_THRESHOLD, 128 * 1024)
        else:
            self.source = "not measured on this platform"

    @property
    def available(self) -> bool:
        return not self.source.startswith("not")

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        elif self.available:
            _glibc("malloc_trim", 0)
            _reset_hwm()
            self.base = _proc_status("VmRSS") or 0

    def growth(self) -> int | None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) - self.base
        if not self.available:
            return None
        return max(0, (_proc_status("VmHWM") or 0) - self.base)


def _proc_status(key: str) -> int | None:
    """A ``kB`` field of /proc/self/status, in bytes (None off Linux)."""
    try:
        with open("/proc/self/status") as f:
            m = re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


def _reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def _can_reset_hwm() -> bool:
    try:
        _reset_hwm()
    except OSError:
        return False
    return True


def _glibc(fn: str, *args: int) -> None:
    """Call a glibc malloc tuning function; nothing on other C libraries."""
    try:
        getattr(ctypes.CDLL("libc.so.6"), fn)(*args)
    except (OSError, AttributeError):
        pass


def resident_bytes(model: nn.Module, optimizer: torch.optim.Optimizer, *batch: torch.Tensor) -> int:
    """Unique storages of parameters, buffers, optimizer state and the batch."""
    tensors = [*model.parameters(), *model.buffers(), *batch]
    tensors += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())
