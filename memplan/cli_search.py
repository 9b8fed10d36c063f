"""``memplan search``: budget -> searched sparse-update scheme (a thin typer layer over
:func:`memplan.search.command.search_and_validate`: search, validate, write; printing and plots
are :mod:`memplan.render` views)."""

from __future__ import annotations

import sys
from typing import Any

import typer
from rich.console import Console

from .cli_common import OldTargetOpt, console, options_command, target_option
from .errors import MemplanError
from .search.options import SearchCommand


@options_command(SearchCommand)
def search(  # typer command: its own parameters, then one per option of SearchCommand (search, stage)
    model: str | None = typer.Argument(
        None,
        help="model (default: mcunet-5fps-int8, the 256KB paper's int8 backbone with ImageNet weights, with its "
        "shipped CIFAR-10 + QAS profile)",
    ),
    old_target: str | None = OldTargetOpt,
    plot: str | None = typer.Option(None, "--plot", help="draw Figure 13 (evolution vs random) and 11b to PATH"),
    *,
    opts: SearchCommand,
) -> None:
    """Search the sparse-update scheme of largest summed (noise-aware) Δacc under a memory (and FLOPs) budget."""
    from .render.figures import plot_search
    from .search.command import search_and_validate
    from .search.space import ProfileError

    accounting = opts.search.accounting
    target = target_option(accounting.target, old_target, "search")
    if accounting.budget is None and target is None:
        raise MemplanError("give --budget (e.g. 100KB) or --target NAME (e.g. stm32f746)")
    opts = opts.replace(target=target, curves=plot is not None, command="memplan " + " ".join(sys.argv[1:]))
    out_console = console()
    try:
        with _StageView(out_console) as progress:
            done = search_and_validate(model, opts, progress)
    except ProfileError as exc:
        if opts.search.inputs.profile_path is not None:
            raise
        name = model or "MODEL"
        raise MemplanError(
            exc.message,
            f"measure one with `memplan contrib {name} --data DATA --out profile.json` and pass it: "
            f"`memplan search {name} --profile profile.json ...`",
        ) from None
    if done.validated is not None:
        from .render.validated import print_validated

        print_validated(done.validated, out_console)
    else:
        print_evidence(done, out_console)
    if plot:
        plot_search(done.result, plot)
        out_console.print(f"plot written to {plot}")
    if done.out is not None:
        what = "validated scheme" if done.validated is not None else "scheme"
        out_console.print(f"{what} written to {done.out}", markup=False)
    else:
        out_console.print("not saved: add --out scheme.json to write the scheme (for apply_scheme / memplan verify)")


def print_searched(done: Any, out: Console) -> None:
    """The search (``memplan.render.reports.print_search``) and its scheme's applied-mode cost, or
    why that cost is missing."""
    from .render.reports import print_search
    from .units import fmt_bytes

    result, applied = done.result, done.applied
    print_search(result, out)
    if applied is None:
        out.print(f"warning: the scheme's applied-mode cost was not computed: {done.applied_error}", markup=False)
        return
    cost = {
        mode: f"{fmt_bytes(t.total_bytes)} in all ({fmt_bytes(t.saved_activation_bytes)} saved activations)"
        for mode, t in applied.totals.items()
    }
    execution = result.scheme.execution
    micro = f" in {execution.micro_batches} micro-batches" if execution and execution.micro_batches > 1 else ""
    out.print(
        f"the same scheme at {applied.source} batch {applied.batch}{micro}: applied mode (PyTorch after "
        f"memplan.apply_scheme) {cost['applied']}; pytorch mode {cost['pytorch']} (the budget bounds "
        f"{result.mode} mode at batch {result.scheme.batch})",
        markup=False,
    )
    print_fit(done, out)


def print_fit(done: Any, out: Console) -> None:
    """Whether training fits the device (``Searched.device_fit``), one line."""
    from .render.reports import device_fit_line

    if done.device_fit is not None:
        out.print(device_fit_line(done.device_fit), markup=False)


def print_evidence(done: Any, out: Console) -> None:
    """The shipped training evidence of the scheme found (``Searched.shipped``), or that none ships."""
    from .render.reports import evidence_line

    if done.shipped is not None:
        out.print(evidence_line(done.shipped), markup=False)
        return
    out.print(
        "validated by training: not this scheme (no shipped scheme equal to it records training evidence; "
        "--validate N trains it against the hand-picked baselines that fit)",
        markup=False,
    )


class _StageView:
    """The search's :class:`memplan.search.stage.Progress`: the search printed as soon as it is done,
    then a progress bar over the validation stage's runs on stderr (from when they are planned)."""

    def __init__(self, out: Console):
        self.out, self.bar = out, None

    def __enter__(self) -> Any:
        from .search.stage import Progress

        return Progress(searched=self._searched, waiting=self._waiting, start=self._start, run=self._run)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def _searched(self, done: Any) -> None:
        print_searched(done, self.out)

    def _waiting(self, lock: str) -> None:
        console(stderr=True).print(
            f"another memplan run holds {lock}: waiting for it to finish, then its runs are reused", markup=False
        )

    def _start(self, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns = (TextColumn("validating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        self.bar = Progress(*columns, console=console(stderr=True))
        self.bar.start()
        self.task = self.bar.add_task("runs", total=total)

    def _run(self) -> None:
        if self.bar is not None:
            self.bar.advance(self.task)
