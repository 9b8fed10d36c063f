"""Command-line pieces of the peak-memory features (kept out of ``memplan.cli``, which registers
them): ``memplan calibrate``, the ``--schedule`` / ``--calibration`` / ``--target`` options of
``memplan profile`` and its per-conv update costs."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from .cli_common import scheme_arg
from .errors import MemplanError

if TYPE_CHECKING:
    from .costs.records import Profile

ScheduleOpt = typer.Option(
    None,
    "--schedule",
    help="training step of the simulated peak: standard (gradients kept "
    "until the optimizer step) or tte (the Tiny Training Engine: each update applied in place "
    "during backward); default: the mode's",
)
CalibrationOpt = typer.Option(
    "cpu",
    "--calibration",
    help="kernel workspaces in the peak: this machine's "
    "calibration for cpu or cuda (see memplan calibrate), a calibration JSON file, or none",
)
TargetOpt = typer.Option(
    None,
    "--target",
    help="hardware profile (e.g. stm32f746): say whether the peak fits it; the mode defaults to the target's",
)


def calibration_arg(text: str) -> str | None:
    """``--calibration``: ``none`` -> None, anything else as given."""
    return None if text.strip().lower() == "none" else text


def target_mode(ctx: typer.Context, mode: str, target: str | None) -> str:
    """The mode of ``memplan profile``: ``--mode`` when given, else the target's default mode."""
    source = ctx.get_parameter_source("mode")
    if target is None or getattr(source, "name", "DEFAULT") != "DEFAULT":  # typer may bundle its own click
        return mode
    from .search.devices import load_device

    return load_device(target).mode


def add_fit(p: Profile, target: str) -> dict:
    """Put the fit of ``p`` on the hardware profile ``target`` into ``p.extras["device"]`` and return it."""
    from .search.devices import fit, load_device

    p.extras["device"] = fit(p, load_device(target))
    return p.extras["device"]


def conv_update_costs(
    model: str, capture_opts: dict[str, Any], name: str, out: Console, *, table: bool, plot: str | None
) -> None:
    """The cost of updating each conv (``tinytraining``, the 256KB paper's Figure 11a): printed as a
    table and / or drawn to ``plot``."""
    from .api import update_costs
    from .render.tables import print_conv_update_costs

    rows = update_costs(model, **capture_opts)
    if table:
        print_conv_update_costs(rows, out)
    if plot:
        from .render.figures import plot_layer_costs  # matplotlib only where a figure is drawn

        plot_layer_costs(rows, plot, title=f"{name}: cost of updating each conv (tinytraining)")
        out.print(f"wrote {plot}")


def calibrate(  # typer command: one parameter per CLI option
    models: list[str] = typer.Argument(..., help="zoo names, package.module:attr or file.py:attr (repeatable)"),
    method: list[str] | None = typer.Option(
        None, "--method", "-m", help="strategy to calibrate (repeatable; default: the strategies memplan compare shows)"
    ),
    batch: list[int] | None = typer.Option(None, "--batch", "-b", help="batch size (repeatable; default 1)"),
    resolution: list[int] | None = typer.Option(
        None, "--resolution", "-r", help="input side in px (repeatable; default: the model's)"
    ),
    classes: int | None = typer.Option(None, "--classes", "-c", help="classifier outputs"),
    blocks: int | None = typer.Option(None, "--blocks", "-k", help="blocks for lastk / mobiletl"),
    scheme: str | None = typer.Option(None, "--scheme", help="sparse-update scheme for the sparse strategy"),
    backend: str = typer.Option("cpu", "--backend", help="cpu or cuda"),
    threads: int | None = typer.Option(
        None,
        "--threads",
        help="torch threads to measure with (default: torch's); "
        "profiles look up the workspaces of their own thread count",
    ),
) -> None:
    """Measure this machine's kernel workspaces (each distinct kernel configuration of the models, run
    once) into its calibration file; `memplan profile` then adds them to the peak."""
    from .verify.calibrate import calibrate as run

    for name, values in (("batch", batch), ("resolution", resolution)):
        if any(v < 1 for v in values or ()):
            raise MemplanError(f"--{name} must be a positive integer")
    if threads is not None and threads < 1:
        raise MemplanError("--threads must be a positive integer")
    result = run(
        models,
        method,
        batches=tuple(batch or (1,)),
        resolutions=tuple(resolution or (None,)),
        classes=classes,
        backend=backend,
        threads=threads,
        blocks=blocks,
        scheme=scheme_arg(scheme),
    )
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(
        f"{result.configs} kernel configurations, {result.measured} measured now "
        f"({result.configs - result.measured} already calibrated) in {result.seconds:.1f} s; "
        f"wrote {result.path}"
    )
    for what, why in result.skipped.items():
        console.print(f"skipped {what}: {why}", markup=False)
    for label, why in result.failed.items():
        console.print(f"[yellow]could not run (no workspace counted): {label} ({why})[/]", markup=True)
