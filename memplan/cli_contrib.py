"""``memplan contrib``: the command group of contribution analysis (a thin typer layer).

``memplan contrib MODEL ...`` measures a profile (the ``measure`` subcommand, the default when
the first word is not a subcommand); ``memplan contrib validate PROFILE`` runs the additivity
check of the 256KB paper's Figure 5(c). Option parsers: :mod:`memplan.cli_common`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from .cli_common import console, options_command, positive_int
from .contrib.options import ContribOptions
from .search.options import ValidateOptions


class DefaultMeasure(TyperGroup):
    """A group whose first word, when it is not a subcommand (or help), selects ``measure``."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["measure", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=DefaultMeasure,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Contribution analysis (the 256KB paper's Figure 5): `memplan contrib MODEL ...` measures a "
    "profile; `memplan contrib validate PROFILE` checks that its Δacc add up (Figure 5c).",
)


@app.command()
@options_command(ContribOptions)
def measure(
    model: str = typer.Argument(..., help="zoo name, package.module:attr or path/to/file.py:attr"),
    plot: str | None = typer.Option(
        None, "--plot", help="draw Figure 5 (bias curve, per-layer Δacc per ratio) to PATH"
    ),
    *,
    opts: ContribOptions,
) -> None:
    """Measure a contribution profile: real fine-tuning runs measuring Δacc per bias depth and per
    layer x channel ratio on a validation split. Resumable: rerun to continue. Every other option is
    one of memplan.contrib.options.ContribOptions."""
    from .contrib.analysis import run_contrib
    from .contrib.estimators import ESTIMATORS
    from .contrib.profile import probe_warning
    from .render.figures import plot_contrib

    out_console = console()
    positive_int("workers", opts.execution.workers)
    positive_int("batches", opts.estimate.batches)
    prof = run_contrib(model, opts.replace(progress=sys.stderr.isatty()))
    out = opts.execution.out
    timing = prof.timing
    gradients = ESTIMATORS[prof.estimator].runs == "gradients"  # no runs: gradients on training batches
    where = "from training-data gradients" if gradients else f"on the {prof.evaluated_on} split"
    out_console.print(
        f"{len(prof.weight)} layers, {len(prof.bias)} bias depths measured by {prof.estimator} {where} in "
        f"{timing['estimator_wall_s']:.1f} s, after a linear probe of {timing['probe_wall_s']:.1f} s at "
        f"{prof.probe_accuracy:.2f}% on the {prof.evaluated_on} split" + (f"; wrote {out}" if out else ""),
        markup=False,
    )
    warning = probe_warning(prof)
    if warning is not None:
        out_console.print(f"warning: {warning}", markup=False)
    if plot:
        out_console.print(f"wrote {plot_contrib(prof, plot)}")


@app.command()
@options_command(ValidateOptions)
def validate(
    profile: str = typer.Argument(..., help="contribution profile JSON (measured with a validation split)"),
    json_out: str | None = typer.Option(None, "--json", help="write the result as JSON to PATH"),
    plot: str | None = typer.Option(None, "--plot", help="draw Figure 5(c) to PATH"),
    *,
    opts: ValidateOptions,
) -> None:
    """The additivity check (Figure 5c): train random schemes over several budgets end to end and
    correlate their summed Δacc with their real test-accuracy gain (Pearson, Spearman, bootstrap CIs)."""
    from .contrib.profile import load_profile
    from .render.figures import plot_additivity
    from .search.additivity import save, summary, validate_profile

    out_console = console()
    positive_int("bootstrap", opts.bootstrap)
    prof = load_profile(profile)
    checkpoint = opts.checkpoint or (Path(json_out).with_suffix(".runs.jsonl") if json_out else None)
    progress = lambda text: out_console.print(text, markup=False)  # noqa: E731
    check = validate_profile(prof, opts.replace(checkpoint=checkpoint, progress=progress))
    check.profile = profile
    for line in summary(check):
        out_console.print(line, markup=False)
    if json_out:
        save(check, json_out)
        out_console.print(f"wrote {json_out}")
    if plot:
        out_console.print(f"wrote {plot_additivity(check, plot)}")
