"""Rich view of the validation stage (``memplan search --validate``): every candidate's best
configuration on the validation split, and the chosen scheme."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..plan import Training
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
        acc = "diverged" if r["accuracy"] is None else f"{r['accuracy']:.2f} ± {r['se']:.2f}"
        name = r["name"] + (" (baseline)" if r["baseline"] else "")
        lr = r["lr"] or ""
        t.add_row(name, f"{fmt_bytes(r['memory_bytes'])} ({r['memory_bytes']:,} B)", lr, acc, str(len(r["seeds"])))
    console.print(t)
    val, tr = v.scheme.validation, v.scheme.training
    console.print(
        f"chosen: [bold]{v.chosen.name}[/] at lr {rates_text(tr)} ({tr.optimizer}, {tr.epochs} epochs of batch "
        f"{tr.batch_size}): {val.accuracy:.2f} ± {val.se:.2f}% on validation over seeds {val.seeds}; "
        f"{v.runs_trained} runs trained now, the rest from {v.checkpoint}; {v.seconds:.0f} s"
    )
