"""Rich view of the validation stage (``memplan search --validate``): every candidate's best
configuration on the validation split, and the chosen scheme."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..search.select import Validated
from ..units import fmt_bytes


def print_validated(v: Validated, console: Console) -> None:
    """The candidates ranked by validation accuracy (mean ± SE over seeds, %), their memory in the
    search's mode (bytes) and rate; then the choice."""
    t = Table(title=f"validation stage: {len(v.candidates)} candidates, rates {v.lrs}, seeds {v.seeds}")
    for col in ("candidate", "memory", "lr", "validation acc %", "seeds"):
        t.add_column(col, justify="left" if col == "candidate" else "right")
    for r in v.table():
        acc = "diverged" if r["accuracy"] is None else f"{r['accuracy']:.2f} ± {r['se']:.2f}"
        name = r["name"] + (" (baseline)" if r["baseline"] else "")
        lr = "" if r["lr"] is None else f"{r['lr']:g}"
        t.add_row(name, f"{fmt_bytes(r['memory_bytes'])} ({r['memory_bytes']:,} B)", lr, acc, str(len(r["seeds"])))
    console.print(t)
    val, tr = v.scheme.validation, v.scheme.training
    console.print(
        f"chosen: [bold]{v.chosen.name}[/] at lr {tr.lr:g} ({tr.optimizer}, {tr.epochs} epochs of batch "
        f"{tr.batch_size}): {val.accuracy:.2f} ± {val.se:.2f}% on validation over seeds {val.seeds}; "
        f"{v.runs_trained} runs trained now, the rest from {v.checkpoint}; {v.seconds:.0f} s"
    )
