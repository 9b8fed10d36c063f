"""Command-line pieces of the peak-memory features (kept out of ``memplan.cli``, which registers
them): ``memplan calibrate`` and ``memplan profile``'s per-conv update costs."""

from __future__ import annotations

import typer
from rich.console import Console

from .cli_common import console, options_command
from .profile_options import CalibrateOptions, Capture


def conv_update_costs(model: str, capture: Capture, name: str, out: Console, *, table: bool, plot: str | None) -> None:
    """The cost of updating each conv (``tinytraining``, the 256KB paper's Figure 11a): printed as a
    table and / or drawn to ``plot``."""
    from .api import update_costs
    from .render.tables import print_conv_update_costs

    rows = update_costs(model, capture)
    if table:
        print_conv_update_costs(rows, out)
    if plot:
        from .render.figures import plot_layer_costs  # matplotlib only where a figure is drawn

        plot_layer_costs(rows, plot, title=f"{name}: cost of updating each conv (tinytraining)")
        out.print(f"wrote {plot}")


@options_command(CalibrateOptions)
def calibrate(
    models: list[str] = typer.Argument(..., help="zoo names, package.module:attr or file.py:attr (repeatable)"),
    *,
    opts: CalibrateOptions,
) -> None:
    """Measure this machine's kernel workspaces (each distinct kernel configuration of the models, run
    once) into its calibration file; `memplan profile` then adds them to the peak."""
    from .verify.calibrate import calibrate as run

    result = run(models, opts)
    out = console()
    out.print(
        f"{result.configs} kernel configurations, {result.measured} measured now "
        f"({result.configs - result.measured} already calibrated) in {result.seconds:.1f} s; "
        f"wrote {result.path}"
    )
    for what, why in result.skipped.items():
        out.print(f"skipped {what}: {why}", markup=False)
    for label, why in result.failed.items():
        out.print(f"[yellow]could not run (no workspace counted): {label} ({why})[/]", markup=True)
