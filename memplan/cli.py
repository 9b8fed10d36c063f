"""``memplan`` command line: a thin typer layer over the Python API.

Every error caused by the input ends in one line ``error: ...`` on stderr and exit code 2
(1 for an internal error; set MEMPLAN_DEBUG=1 for its traceback; 130 when interrupted):
:func:`memplan.cli_common.run_command`. Options and parsers shared by commands: :mod:`memplan.cli_common`.
"""

from __future__ import annotations

import signal
import sys

import typer

from . import cli_peak, cli_search
from .cli_common import (
    BinaryOpt,
    ModelArg,
    OldTargetOpt,
    console,
    emit,
    options_command,
    run_command,
    target_option,
)
from .cli_contrib import app as contrib_app
from .errors import MemplanError
from .profile_options import CompareOptions, ProfileOptions, StrategyOptions, VerifyOptions
from .version import __version__

# Nothing above imports torch: help, --version and usage errors answer at once (benchmarks/cold_start.py);
# every command imports the layers it runs on (the api, strategies, render) in its body.

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Memory / FLOP profiler and sparse-update planner for on-device transfer learning.",
)
app.add_typer(contrib_app, name="contrib")
app.command()(cli_search.search)


def _print_version(value: bool) -> None:
    if value:
        print(f"memplan {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="print memplan's version and exit"
    ),
) -> None:
    """Memory / FLOP profiler and sparse-update planner for on-device transfer learning."""


@app.command()
@options_command(ProfileOptions)
def profile(  # typer command: its own parameters (the views), then one per option of ProfileOptions
    model: str = ModelArg,
    per_layer: bool = typer.Option(
        False,
        "--per-layer",
        help="print the per-layer table (and, for sparse / "
        "tinytraining, the cost of updating each conv: the 256KB paper's Figure 11a)",
    ),
    plot: str | None = typer.Option(None, "--plot", help="draw the per-conv update costs (Figure 11a) to PATH"),
    json_out: str | None = typer.Option(
        None, "--json", help="write the profile as JSON to PATH ('-' = stdout, JSON only)"
    ),
    csv_out: str | None = typer.Option(None, "--csv", help="write the per-layer table as CSV to PATH ('-' = stdout)"),
    binary: bool = BinaryOpt,
    old_target: str | None = OldTargetOpt,
    *,
    opts: ProfileOptions,
) -> None:
    """Memory and FLOPs of fine-tuning MODEL with one strategy."""
    from . import api
    from .render import export, tables

    quiet = json_out == "-" or csv_out == "-"
    out = console(quiet)
    opts = opts.replace(target=target_option(opts.costing.target, old_target, "profile"))
    p = api.profile(model, opts)
    if json_out:
        emit(export.to_json(p), json_out, out)
    if csv_out:
        emit(export.layers_csv([p]), csv_out, out)
    if not quiet:
        tables.print_profile(p, out, per_layer=per_layer, binary=binary)
    if plot or (per_layer and not quiet and _conv_update_table(opts.method, p.mode)):
        cli_peak.conv_update_costs(model, opts.capture, p.model, out, table=per_layer and not quiet, plot=plot)
    if opts.check and (p.check["predicted"] != p.check["observed"] or p.check["differing"]):
        raise typer.Exit(1)


def _conv_update_table(method: str, mode: str) -> bool:
    """Whether ``--per-layer`` also prints each conv's update cost (a property of the strategy or the mode)."""
    from .modes import get_mode
    from .strategies import STRATEGIES

    return STRATEGIES.choose(method).conv_update_table or get_mode(mode).conv_update_table


@app.command()
@options_command(VerifyOptions)
def verify(model: str = ModelArg, *, opts: VerifyOptions) -> None:
    """Apply the strategy to a real model, train a few steps on random data, and compare
    predicted with measured saved bytes and peak, plain PyTorch vs `applied` side by side.
    Exits 1 when measured saved bytes differ from the prediction by more than --tolerance."""
    from .render.reports import print_verify
    from .verify import EXIT_MISMATCH, verify as run_verify

    report = run_verify(model, opts)
    print_verify(report, console())
    if not report.ok:
        raise typer.Exit(EXIT_MISMATCH)


@app.command()
def schema() -> None:
    """Print the JSON Schema of memplan's update-scheme format (a copy is in schema/)."""
    from .plan import schema_json

    text = schema_json()
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


@app.command()
@options_command(CompareOptions)
def compare(  # typer command: its own parameters (the strategies, the views), then one per option of CompareOptions
    model: str = ModelArg,
    methods: str | None = typer.Option(
        None,
        "--methods",
        help="comma-separated strategies, method:K sets --blocks K, "
        "e.g. full,bias,lastk:3,mobiletl:3 (default: the strategies registered to be compared, Strategy.compare)",
    ),
    json_out: str | None = typer.Option(None, "--json", help="write all profiles as JSON to PATH ('-' = stdout)"),
    csv_out: str | None = typer.Option(None, "--csv", help="write one totals row per strategy as CSV to PATH"),
    binary: bool = BinaryOpt,
    *,
    opts: CompareOptions,
) -> None:
    """One row per strategy: trainable params, saved activations, weights, memory, FLOPs."""
    from . import api
    from .render import export, tables

    quiet = json_out == "-" or csv_out == "-"
    out = console(quiet)
    items = None
    if methods:
        items = []
        for tok in (t.strip() for t in methods.split(",") if t.strip()):
            name, _, k = tok.partition(":")
            if k and not k.isdigit():
                raise MemplanError(f"cannot read {tok!r} in --methods", "write a method, or method:K for K blocks")
            items.append((name, {"blocks": int(k)} if k else {}))
    profiles = api.compare(model, items, opts)
    if json_out:
        emit(export.many_to_json(profiles), json_out, out)
    if csv_out:
        emit(export.totals_csv(profiles), csv_out, out)
    if not quiet:
        tables.print_compare(profiles, out, binary=binary)


@app.command()
def reproduce(
    only: str | None = typer.Option(None, "--only", help="figure key prefix, e.g. tinytl.table2 or mobiletl"),
    json_out: str | None = typer.Option(None, "--json", help="write the rows as JSON to PATH ('-' = stdout)"),
    hide_not_modelled: bool = typer.Option(False, "--hide-not-modelled", help="omit figures memplan cannot model"),
) -> None:
    """Published figures of the seed papers next to memplan's values, with the mode used."""
    from .render.reports import print_reproduction, reproduction_json
    from .reproduce import reproduce as run_reproduce

    quiet = json_out == "-"
    out = console(quiet)
    rows = run_reproduce(only or "", include_not_modelled=not hide_not_modelled)
    if json_out:
        emit(reproduction_json(rows), json_out, out)
    if not quiet:
        print_reproduction(rows, out)


app.command(name="calibrate")(cli_peak.calibrate)


@app.command()
def methods() -> None:
    """The fine-tuning strategies and their options."""
    from .render import tables
    from .strategies import STRATEGIES, TRANSFORMS

    tables.print_methods(STRATEGIES.values(), console(), TRANSFORMS.values(), flags=StrategyOptions.flags())


@app.command()
def models() -> None:
    """The model zoo with parameters and MACs at each model's default resolution."""
    from . import api
    from .render import tables

    tables.print_models(api.describe_models(), console())


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the app; every failure ends in one line and an exit code."""
    code = run_command(typer.main.get_command(app), argv)
    if code == 130:  # told once: a second Ctrl-C while the interpreter shuts down must not kill it by signal
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


if __name__ == "__main__":
    main()
