"""Progress on stderr for the steps of contribution analysis that take more than a few seconds
(rich): a bar for counted work (the grid's runs, an estimator's mini-batches), a spinner with the
elapsed time for one long step (data and model set-up, pretraining, the linear probe). Each is
left on screen when done, so the user sees where the time went; nothing is shown when disabled."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def bar(enabled: bool, label: str, total: int, done: int = 0) -> tuple[Any, Any]:
    """(rich Progress, its task): ``label``, a bar, done / total, elapsed and remaining time."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=_stderr(),
        disable=not enabled,
        transient=False,
    )
    return progress, progress.add_task(label, total=total, completed=done)


@contextmanager
def stage(enabled: bool, text: str) -> Iterator[None]:
    """A spinner, ``text`` and the elapsed time while the block runs."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(finished_text="done"),
        TextColumn(text),
        TimeElapsedColumn(),
        console=_stderr(),
        disable=not enabled,
        transient=False,
    ) as progress:
        task = progress.add_task(text, total=1)
        yield
        progress.update(task, completed=1)


def _stderr() -> Any:
    from rich.console import Console

    return Console(stderr=True)
