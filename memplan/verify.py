"""``verify``: predicted vs measured memory of real training steps, plain PyTorch vs memplan-applied.

For one model and strategy, two setups are built from the same random initialisation:

* ``pytorch``: ``requires_grad`` and norm flags set the plain way (``memplan.measure.apply_plain``),
  predicted by the ``pytorch`` accounting mode;
* ``applied``: ``memplan.apply_plan`` (lean autograd ops), predicted by the ``applied`` mode.

Each runs one forward + loss under ``saved_tensors_hooks`` (``memplan.measure.saved_bytes``:
unique storages, parameters and buffers excluded) and ``steps`` training steps on one random
batch. ``ok`` holds when both measured saved-activation byte counts are within ``tolerance``
bytes of their predictions (default 0: exact).

The step peak is informational (allocator rounding, kernel workspaces and temporaries are not
modelled): measured peak = bytes of the tensors resident when a step starts (parameters,
buffers, optimizer state, the batch) + the growth during the step, which is on CUDA
``torch.cuda.max_memory_allocated`` minus the allocated bytes at the start, and on CPU the
process's resident-set high-water mark (``VmHWM`` of ``/proc/self/status``, reset through
``/proc/self/clear_refs``) minus its resident set at the start. So that freed tensors leave
the resident set, the CPU meter fixes glibc's mmap threshold at its initial 128 KiB for the
rest of the process (glibc otherwise raises it as large blocks are freed and then keeps freed
memory resident: ProxylessNAS-Mobile, bias, batch 8, 224 px measured 356 MB against 95 MB
with the fixed threshold; predicted 76 MB) and trims the heap before each step. It is
compared with memplan's ``peak_bytes``.
"""

from __future__ import annotations

import copy
import ctypes
import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from .apply import apply_plan, plan_strategy
from .costs import compute
from .errors import BadOption
from .loading import resolve, sample_shape
from .measure import apply_plain, saved_bytes
from .modes import get_mode
from .train import make_optimizer, train_steps
from .transforms import swap_norm
from .units import fmt_bytes

#: exit code of ``memplan verify`` when a measured saved-bytes count misses its prediction
EXIT_MISMATCH = 1
M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
SETUPS = ("pytorch", "applied")


@dataclass
class SetupResult:
    """One setup (``pytorch``: plain flags, ``applied``: memplan.apply_plan); all sizes in bytes."""

    mode: str  # the accounting mode of the prediction (= the setup's name)
    predicted_saved: int
    measured_saved: int
    predicted_peak: int
    measured_peak: int | None  # None where the platform offers no way to measure it
    losses: list[float] = field(default_factory=list)  # per step, before its update

    @property
    def saved_error(self) -> int:
        """measured - predicted saved-activation bytes."""
        return self.measured_saved - self.predicted_saved


@dataclass
class VerifyReport:
    model: str
    method: str
    options: dict[str, Any]
    input_shape: list[int]  # batch first
    device: str
    optimizer: str
    steps: int
    tolerance: int  # bytes
    peak_source: str  # how the peak was measured
    pytorch: SetupResult
    applied: SetupResult

    @property
    def ok(self) -> bool:
        return all(abs(r.saved_error) <= self.tolerance for r in (self.pytorch, self.applied))

    @property
    def saving(self) -> float:
        """Measured saved activations, plain PyTorch / applied (x times less)."""
        return self.pytorch.measured_saved / max(1, self.applied.measured_saved)


# --------------------------------------------------------------------------- peak measurement


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


def _resident_bytes(model: nn.Module, optimizer: torch.optim.Optimizer, *batch: torch.Tensor) -> int:
    """Unique storages of parameters, buffers, optimizer state and the batch."""
    tensors = [*model.parameters(), *model.buffers(), *batch]
    tensors += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


# --------------------------------------------------------------------------- verify


def _device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise BadOption(f"unknown device {device!r}", "use auto, cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BadOption("device cuda requested but no CUDA device is available", "use --device cpu")
    return dev


def _run_setup(base: nn.Module, setup: str, method: str, options: dict[str, Any], shape: tuple[int, ...],
               device: torch.device, optimizer: str, lr: float, steps: int, seed: int) -> SetupResult:
    model = copy.deepcopy(base).to(device)
    model, graph, plan = plan_strategy(model, method, input_shape=shape, **options)
    prof = compute(graph, plan, get_mode(setup), optimizer=optimizer)
    if setup == "pytorch":
        apply_plain(model, graph, plan)
    else:
        apply_plan(model, plan, graph)
    classes = graph.nodes[-2].in_tensors[0].shape[-1]
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(shape, generator=gen).to(device)
    y = torch.randint(0, classes, (shape[0],), generator=gen).to(device)
    measured = saved_bytes(model, x, y).bytes
    opt = make_optimizer(model.parameters(), optimizer, lr)
    meter = PeakMeter(device)
    losses: list[float] = []
    peak: int | None = None
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        resident = _resident_bytes(model, opt, x, y)
        meter.start()
        losses += train_steps(model, x, y, 1, opt)
        growth = meter.growth()
        if growth is not None:
            peak = max(peak or 0, resident + growth)
    return SetupResult(setup, prof.totals.saved_activation_bytes, measured, prof.totals.peak_bytes, peak, losses)


def verify(model: str | nn.Module, method: str = "full", *, batch: int = 1, resolution: int | None = None,
           classes: int | None = None, norm: str | None = None, steps: int = 2, device: str = "auto",
           optimizer: str = "sgd", lr: float = 0.01, tolerance: int = 0, seed: int = 0,
           **options: Any) -> VerifyReport:
    """Predicted vs measured saved activations (and step peak) of ``method`` on ``model``, for
    plain PyTorch and for memplan's applied setup, on one random batch.

    ``model``: zoo name, import spec or nn.Module (deep-copied, never changed); zoo models get a
    random initialisation (seeded by ``seed``). ``options``: strategy options, e.g. ``blocks=2``
    or ``scheme="scheme.json"`` for ``sparse``. ``norm="group"``: BatchNorm -> GroupNorm first
    (``memplan.transforms.swap_norm``, TinyTL's setting). ``device``: ``auto`` (CUDA when present), ``cpu``,
    ``cuda``. ``tolerance``: allowed |measured - predicted| saved bytes.
    """
    if steps < 1 or batch < 1 or tolerance < 0:
        raise BadOption("--steps and --batch must be positive and --tolerance non-negative")
    dev = _device(device)
    torch.manual_seed(seed)
    spec = resolve(model, classes, meta=False)
    base = spec.model if not isinstance(model, nn.Module) else copy.deepcopy(model)
    if norm is not None:
        base = swap_norm(base, norm)
    res = resolution or spec.resolution or 224
    shape = (batch, *sample_shape(model, res))
    results = {s: _run_setup(base, s, method, options, shape, dev, optimizer, lr, steps, seed) for s in SETUPS}
    return VerifyReport(spec.name, method, dict(options), list(shape), str(dev), optimizer, steps, tolerance,
                        PeakMeter(dev).source, **results)


# --------------------------------------------------------------------------- rendering


def print_verify(report: VerifyReport, console: Any) -> None:
    """Render ``report`` on a rich ``console``: predicted vs measured, pytorch and applied."""
    from rich.table import Table

    opts = "".join(f" {k}={v}" for k, v in report.options.items())
    console.print(f"[bold]{report.model}[/] · method [bold]{report.method}[/]{opts} · input "
                  f"{'x'.join(map(str, report.input_shape))} · {report.device} · {report.optimizer} · "
                  f"{report.steps} steps")
    table = Table(show_header=True, header_style="bold")
    table.add_column("")
    for setup in SETUPS:
        table.add_column(f"{setup} predicted", justify="right")
        table.add_column(f"{setup} measured", justify="right")
    runs = (report.pytorch, report.applied)

    def cells(pred_meas: list[tuple[int, int | None]]) -> list[str]:
        return [x for p, m in pred_meas for x in (fmt_bytes(p), "n/a" if m is None else fmt_bytes(m))]

    table.add_row("saved activations", *cells([(r.predicted_saved, r.measured_saved) for r in runs]))
    table.add_row("  exact bytes", *[str(x) for r in runs for x in (r.predicted_saved, r.measured_saved)])
    table.add_row("step peak", *cells([(r.predicted_peak, r.measured_peak) for r in runs]))
    table.add_row("loss first -> last", *[x for r in runs for x in ("", f"{r.losses[0]:.4f} -> {r.losses[-1]:.4f}")])
    console.print(table)
    console.print(f"measured saving of applied over plain PyTorch: {report.saving:.1f}x; "
                  f"peak: {report.peak_source} (informational)")
    if report.ok:
        console.print(f"[green]ok[/]: measured saved bytes match the predictions (tolerance {report.tolerance} B)")
        return
    for r in runs:
        if abs(r.saved_error) > report.tolerance:
            console.print(f"[red]mismatch[/]: {r.mode}: measured {r.measured_saved} B, predicted "
                          f"{r.predicted_saved} B ({r.saved_error:+d} B, tolerance {report.tolerance} B)")
