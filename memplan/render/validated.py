"""Rich view of the validation stage (``memplan search --validate``): every candidate's best
configuration on the validation split, and the chosen scheme."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..plan import Training, Validation
from ..search.rules import margin_over
from ..search.stage import Validated
from ..units import fmt_bytes


def rates_text(tr: Training) -> str:
    """``training``'s rates as text: one rate, or the rate of each family it trains."""
    return f"{tr.lr:g}" if not tr.rates else ", ".join(f"{f} {v:g}" for f, v in tr.rates.items())


def print_validated(v: Validated, console: Console) -> None:
    """The candidates ranked by validation accuracy (mean ± SE over seeds, %), their memory in the
    search's mode (bytes) and rate; then the choice."""
    grid = ", ".join(map(str, v.lrs))
    t = Table(title=f"validation stage: {len(v.candidates)} candidates, rates {grid}, seeds {v.seeds}")
    for col in ("candidate", "memory", "lr", "validation acc %", "seeds"):
        t.add_column(col, justify="left" if col == "candidate" else "right")
    for r in v.table():
        acc = "diverged" if r["accuracy"] is None else accuracy_text(r["accuracy"], r["se"], len(r["seeds"]))
        name = r["name"] + (" (baseline)" if r["baseline"] else "")
        lr = r["lr"] or ""
        t.add_row(name, f"{fmt_bytes(r['memory_bytes'])} ({r['memory_bytes']:,} B)", lr, acc, str(len(r["seeds"])))
    console.print(t)
    val, tr = v.scheme.validation, v.scheme.training
    console.print(
        f"chosen: [bold]{v.chosen.name}[/] at lr {rates_text(tr)} ({tr.optimizer}, {tr.epochs} epochs of batch "
        f"{tr.batch_size}): {accuracy_text(val.accuracy, val.se, len(val.seeds), '%')} on validation over seeds "
        f"{val.seeds}; {v.runs_trained} runs trained now, the rest from {v.checkpoint}; {v.seconds:.0f} s"
    )
    if kept := kept_baseline(v):
        console.print(kept, markup=False)
    warning = margin_warning(val, v.chosen.baseline)
    if warning:
        console.print(f"[yellow]warning:[/] {warning}")
    if sampled := images_warning(val):
        console.print(f"[yellow]warning:[/] {sampled}")
    if v.at_edge:
        console.print(
            "[yellow]warning:[/] the chosen rate is still at an edge of the grid after widening it as far as "
            "--validate-widen allows: widen --validate-lrs or raise --validate-widen"
        )
    if len(v.seeds) == 1:
        console.print(
            "one validation seed gives no error bar: the ranking may be seed noise (give two or more seeds, "
            "e.g. --validate-seeds 0,1)",
            markup=False,
        )


def kept_baseline(v: Validated) -> str | None:
    """Why the rule chose a baseline below the best on validation (``--validate-rule resolved``),
    in words; None when the choice is the best on validation."""
    top = v.halving.best
    if v.config is None or top is None or v.config is top:
        return None
    name = next(c.name for c in v.candidates if c.key == top.candidate)
    margin = margin_over(top, v.config, v.chosen.name)
    return (
        f"the best on validation, {name} ({top.mean:.2f}%), is {margin} above {v.chosen.name}: inside twice its "
        f"SE, so the rule {v.rule!r} keeps the baseline (--validate-rule best would take {name})"
    )


def margin_warning(val: Validation, chosen_baseline: bool) -> str | None:
    """A choice that is not itself a baseline (a searched scheme, or a union of two baselines) that
    validation does not separate from the best baseline that fits
    (:meth:`memplan.plan.Validation.margin`: inside twice its SE), said; None otherwise."""
    margin = val.margin()
    if chosen_baseline or margin is None or margin.resolved:
        return None
    return (
        f"the choice is {margin} from the best baseline that fits, "
        f"{margin.baseline}, on validation: inside twice its SE, so validation does not separate them and on "
        "test either may come out ahead (more --validate-seeds or a larger validation split would)"
    )


def images_warning(val: Validation) -> str | None:
    """A choice whose margin over the best baseline among the runners-up (:meth:`Validation.margin`,
    baseline or not the choice) is no more than twice what the validation images' sampling alone
    gives a difference (:attr:`memplan.plan.Margin.within_images`), said; None otherwise, or when
    the split's size is not recorded. The seeds' SE leaves that error out, so a margin it resolves
    can still be the images'."""
    margin = val.margin()
    if margin is None or not margin.within_images:
        return None
    return (
        f"the choice is {margin.points:+.2f} points from {margin.baseline} on validation, and sampling its "
        f"{val.images:,} images alone moves a difference of two accuracies by up to {margin.images_se:.2f} points "
        "(SE, binomial; the seeds' SE leaves it out): on test either may come out ahead (a larger validation "
        "split would separate them)"
    )


def accuracy_text(mean: float, se: float, seeds: int, unit: str = "") -> str:
    """``mean ± se`` (%, points) over two or more seeds; over one, the mean and that one seed gives no
    error bar (its SE of 0 is no measurement)."""
    return f"{mean:.2f} ± {se:.2f}{unit}" if seeds > 1 else f"{mean:.2f}{unit} (1 seed: no error bar)"
