"""``memplan search``: budget -> searched sparse-update scheme (a thin typer layer over
:func:`memplan.search.run.run_search`; printing and plots are :mod:`memplan.render` views)."""

from __future__ import annotations

import sys
from typing import Any

import typer
from rich.console import Console

from .cli_common import OldTargetOpt, console, options_command, target_option
from .errors import MemplanError
from .search.options import SearchCommand, SearchOptions


@options_command(SearchCommand)
def search(  # typer command: its own parameters, then one per option of SearchCommand (search, stage)
    model: str | None = typer.Argument(
        None, help="model (default: efficientnet-lite0, ImageNet weights, with its shipped Fashion-MNIST profile)"
    ),
    old_target: str | None = OldTargetOpt,
    plot: str | None = typer.Option(None, "--plot", help="draw Figure 13 (evolution vs random) and 11b to PATH"),
    *,
    opts: SearchCommand,
) -> None:
    """Search the sparse-update scheme of largest summed (noise-aware) Δacc under a memory (and FLOPs) budget."""
    from .render.figures import plot_search
    from .render.reports import print_search
    from .search.run import run_search
    from .search.space import ProfileError

    stage, opts = opts.stage, opts.search
    target = target_option(opts.accounting.target, old_target, "search")
    if opts.accounting.budget is None and target is None:
        raise MemplanError("give --budget (e.g. 100KB) or --target NAME (e.g. stm32f746)")
    validate = stage.validate_candidates
    if validate is not None:  # a bad executor is refused before any work
        from .contrib.executors import check

        check(stage.validate_workers, stage.validate_executor, stage.validate_address)
    out = opts.output.out
    opts = opts.replace(
        target=target,
        out=None if validate else out,
        curves=plot is not None,
        command="memplan " + " ".join(sys.argv[1:]),
    )
    try:
        result = run_search(model, opts=opts)
    except ProfileError as exc:
        if opts.inputs.profile_path is not None:
            raise
        name = model or "MODEL"
        raise MemplanError(
            exc.message,
            f"measure one with `memplan contrib {name} --data DATA --out profile.json` and pass it: "
            f"`memplan search {name} --profile profile.json ...`",
        ) from None
    out_console = console()
    print_search(result, out_console)
    try:
        print_applied_cost(result, opts.inputs.classes, out_console)
    except MemplanError as exc:  # the search itself is done (and saved): say why this line is missing
        out_console.print(f"warning: the scheme's applied-mode cost was not computed: {exc}", markup=False)
    if validate is not None:
        from .render.validated import print_validated

        validated = _validate(result, validate, opts, stage)
        print_validated(validated, out_console)
        if out:
            validated.scheme.save(out)
            out_console.print(f"validated scheme written to {out}")
    if plot:
        plot_search(result, plot)
        out_console.print(f"plot written to {plot}")
    if not out:
        out_console.print("not saved: add --out scheme.json to write the scheme (for apply_scheme / memplan verify)")


def print_applied_cost(result: Any, classes: int | None, out: Console) -> None:
    """The searched scheme's memory in ``applied`` mode (eager PyTorch after ``memplan.apply_scheme``)
    and plain ``pytorch`` mode at the training batch (the profile's runs'), beside the budget's mode."""
    from .api import capture, profile_captured
    from .contrib.profile import load_profile
    from .search.space import load_contributions
    from .units import fmt_bytes

    batch, source = result.scheme.batch, "the scheme's"
    if result.profile_path is not None:
        batch, source = load_profile(result.profile_path).protocol.batch_size, "the profile's training"
        classes = classes or load_contributions(result.profile_path).classes
    cap = capture(result.model, tuple(result.input_shape), batch=batch, classes=classes)
    costs = {
        mode: profile_captured(cap, "sparse", mode=mode, scheme=result.scheme).totals for mode in ("applied", "pytorch")
    }
    cost = {
        mode: f"{fmt_bytes(t.total_bytes)} in all ({fmt_bytes(t.saved_activation_bytes)} saved activations)"
        for mode, t in costs.items()
    }
    out.print(
        f"the same scheme at {source} batch {batch}: applied mode (PyTorch after memplan.apply_scheme) "
        f"{cost['applied']}; pytorch mode {cost['pytorch']} (the budget bounds {result.mode} mode at batch "
        f"{result.scheme.batch})",
        markup=False,
    )


def _validate(result, n: int, opts: SearchOptions, stage):  # noqa: ANN001, ANN202
    """The validation stage with a progress bar (``memplan.search.stage.validate_search``)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .search.run import run_search
    from .search.stage import validate_search

    def again(objective: str, budget: int):  # noqa: ANN202
        return run_search(result.model, opts=opts.replace(objective=objective, budget=budget, out=None, curves=False))

    with Progress(
        TextColumn("validating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console(stderr=True)
    ) as bar:
        task = bar.add_task("runs", total=None)
        validated = validate_search(
            result,
            n,
            again,
            stage=stage,
            on_start=lambda total: bar.update(task, total=total),
            on_run=lambda: bar.advance(task),
            options={
                "optimizer": result.scheme.optimizer,
                "frozen_bits": opts.accounting.frozen_bits,
                "mode_options": opts.accounting.mode_options,
            },
        )
    return validated
