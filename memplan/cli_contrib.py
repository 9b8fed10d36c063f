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

from .cli_common import MODES_HELP, console, floats, ints, positive_int, scalar
from .errors import MemplanError


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


def _validation(text: str | None) -> Any:
    """``--validation``: images per class (an int), a fraction (a float), or ``none`` (no split)."""
    if text is None or text.strip().lower() == "none":
        return None
    value = scalar(text)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MemplanError(f"cannot read --validation {text!r}", "an integer per class (100) or a fraction (0.2)")
    return value


@app.command()
def measure(  # typer command: one parameter per CLI option
    model: str = typer.Argument(..., help="zoo name, package.module:attr or path/to/file.py:attr"),
    weights: str | None = typer.Option(
        None,
        "--weights",
        help="local state_dict (.pt, loaded with weights_only=True),"
        " or 'zoo' for the published weights of the zoo entry",
    ),
    data: str = typer.Option(
        "digits",
        "--data",
        help="digits (MNIST 5k), fashion-mnist (Debian's "
        "dataset-fashion-mnist), an image folder, an .npz with x_train,y_train,x_test,y_test, "
        "or module:factory",
    ),
    out: str | None = typer.Option(
        None, "--out", help="contribution profile JSON (a .runs.jsonl checkpoint lives beside it)"
    ),
    workers: int = typer.Option(1, "--workers", "-j", help="parallel runs (local process pool)"),
    executor: str = typer.Option("process", "--executor", help="process | ray"),
    address: str | None = typer.Option(None, "--address", help="Ray cluster address (with --executor ray)"),
    no_cache: bool = typer.Option(
        False, "--no-cache", help="recompute the frozen prefix in every run (no feature cache)"
    ),
    bits: int | None = typer.Option(None, "--bits", help="quantise cached features to BITS (default: fp32, exact)"),
    seeds: str | None = typer.Option(None, "--seeds", help="comma-separated seeds per run, e.g. 0,1,2"),
    max_seeds: int | None = typer.Option(
        None, "--max-seeds", help="adaptive sampling: more seeds, up to this many, where |Δacc| < --adaptive-z SE"
    ),
    adaptive_z: float | None = typer.Option(None, "--adaptive-z", help="z of adaptive sampling (default 2)"),
    bias_ks: str | None = typer.Option(None, "--bias-ks", help="bias depths k to measure, e.g. 1,2,4,8 (default all)"),
    weight_layers: int | None = typer.Option(
        None, "--weight-layers", help="weight runs for the last N convs only (default all)"
    ),
    lr_grid: str | None = typer.Option(
        None,
        "--lr-grid",
        help="choose the classifier, bias and weight rates on validation from these first, e.g. 5e-4,2.5e-3,1.25e-2",
    ),
    weight_reference: str | None = typer.Option(
        None,
        "--weight-reference",
        help="depth: a weight run trains the biases of convs i..L-1 (the 256KB paper's); all-biases: all L biases",
    ),
    epochs: int | None = typer.Option(None, "--epochs", help="epochs per run"),
    batch_size: int | None = typer.Option(None, "--batch-size", help="training batch size of every run"),
    ratios: str | None = typer.Option(None, "--ratios", help="weight ratios, e.g. 1/8,1/4,1/2,1"),
    lr_classifier: float | None = typer.Option(None, "--lr-classifier", help="learning rate of the classifier"),
    lr_bias: float | None = typer.Option(None, "--lr-bias", help="learning rate of biases"),
    lr_weight: float | None = typer.Option(None, "--lr-weight", help="learning rate of the analysed weight"),
    optimizer: str | None = typer.Option(
        None, "--optimizer", help="sgd | sgd-momentum | adam: the probe's and every run's (default sgd)"
    ),
    probe_epochs: int | None = typer.Option(None, "--probe-epochs", help="epochs of the linear probe"),
    probe_lr: float | None = typer.Option(None, "--probe-lr", help="learning rate of the linear probe"),
    resolution: int | None = typer.Option(None, "--resolution", "-r", help="input side of the runs in px"),
    costing_resolution: int | None = typer.Option(
        None, "--costing-resolution", help="input side the schemes will be costed at (default: the run resolution)"
    ),
    train_per_class: int | None = typer.Option(None, "--train-per-class", help="training images kept per class"),
    validation: str | None = typer.Option(
        None,
        "--validation",
        help="validation split carved from the training data: images per class (100) or a fraction (0.2, the default)",
    ),
    test_per_class: int | None = typer.Option(
        None, "--test-per-class", help="test images kept per class (the test split is only used by final evaluations)"
    ),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda | auto (cuda where torch sees a GPU)"),
    plot: str | None = typer.Option(
        None, "--plot", help="draw Figure 5 (bias curve, per-layer Δacc per ratio) to PATH"
    ),
    estimator: str = typer.Option(
        "grid",
        "--estimator",
        help="grid (fine-tuning runs, Δacc) | probe (one short epoch per entry) | fisher (empirical Fisher) | "
        "rgn (relative gradient norm); the profile records which, with its units",
    ),
    batches: int = typer.Option(
        8, "--batches", help="mini-batches of the fisher / rgn gradients (and of the probe's one epoch)"
    ),
) -> None:
    """Measure a contribution profile: real fine-tuning runs measuring Δacc per bias depth and per
    layer x channel ratio on a validation split. Resumable: rerun to continue."""
    from .contrib.analysis import run_contrib
    from .contrib.data import DEFAULT_VALIDATION
    from .render.figures import plot_contrib

    out_console = console()
    positive_int("workers", workers)
    positive_int("batches", batches)
    val = _validation(validation) if validation is not None else DEFAULT_VALIDATION
    prof = run_contrib(
        model,
        weights,
        data,
        out,
        workers=workers,
        executor=executor,
        address=address,
        cache=not no_cache,
        bits=bits,
        seeds=ints(seeds, "seeds"),
        max_seeds=max_seeds,
        adaptive_z=adaptive_z,
        bias_ks=ints(bias_ks, "bias-ks"),
        weight_layers=weight_layers,
        weight_reference=weight_reference,
        lr_grid=floats(lr_grid, "lr-grid"),
        epochs=epochs,
        batch_size=batch_size,
        ratios=floats(ratios, "ratios"),
        lr_classifier=lr_classifier,
        lr_bias=lr_bias,
        lr_weight=lr_weight,
        optimizer=optimizer,
        probe_epochs=probe_epochs,
        probe_lr=probe_lr,
        resolution=resolution,
        costing_resolution=costing_resolution,
        train_per_class=train_per_class,
        validation=val,
        test_per_class=test_per_class,
        device=device,
        progress=sys.stderr.isatty(),
        estimator=estimator,
        batches=batches,
    )
    out_console.print(
        f"{len(prof.weight)} layers, {len(prof.bias)} bias depths measured by {prof.estimator} on the "
        f"{prof.evaluated_on} split in {prof.timing['estimator_wall_s']:.1f} s" + (f"; wrote {out}" if out else "")
    )
    if plot:
        out_console.print(f"wrote {plot_contrib(prof, plot)}")


@app.command()
def validate(  # typer command: one parameter per CLI option
    profile: str = typer.Argument(..., help="contribution profile JSON (measured with a validation split)"),
    budgets: str | None = typer.Option(
        None,
        "--budgets",
        help='comma-separated memory budgets, e.g. "20KB,50KB,100KB" (default: 4 spread over the profile\'s range)',
    ),
    per_budget: int = typer.Option(5, "--per-budget", help="random schemes per budget"),
    no_searched: bool = typer.Option(False, "--no-searched", help="leave out the searched optimum of each budget"),
    mode: str = typer.Option("tinytraining", "--mode", help=f"accounting mode of the budgets: {MODES_HELP}"),
    seeds: str | None = typer.Option(None, "--seeds", help="training seeds (default: the profile's)"),
    bootstrap: int = typer.Option(2000, "--bootstrap", help="bootstrap resamples of the confidence intervals"),
    seed: int = typer.Option(0, "--seed", help="seed of the random schemes and the bootstrap"),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda | auto"),
    json_out: str | None = typer.Option(None, "--json", help="write the result as JSON to PATH"),
    plot: str | None = typer.Option(None, "--plot", help="draw Figure 5(c) to PATH"),
    checkpoint: str | None = typer.Option(
        None, "--checkpoint", help="JSONL of trained schemes to resume from (default: beside --json, .runs.jsonl)"
    ),
) -> None:
    """The additivity check (Figure 5c): train random schemes over several budgets end to end and
    correlate their summed Δacc with their real test-accuracy gain (Pearson, Spearman, bootstrap CIs)."""
    from .contrib.profile import load_profile
    from .render.figures import plot_additivity
    from .search.validate import default_budgets, save, summary, validate_profile

    out_console = console()
    positive_int("bootstrap", bootstrap)
    prof = load_profile(profile)
    chosen: list[Any] = [b.strip() for b in budgets.split(",") if b.strip()] if budgets else default_budgets(prof, mode)
    check = validate_profile(
        prof,
        chosen,
        per_budget=per_budget,
        searched=not no_searched,
        mode=mode,
        seeds=ints(seeds, "seeds"),
        bootstrap=bootstrap,
        seed=seed,
        device=device,
        progress=lambda text: out_console.print(text, markup=False),
        checkpoint=checkpoint or (Path(json_out).with_suffix(".runs.jsonl") if json_out else None),
    )
    check.profile = profile
    for line in summary(check):
        out_console.print(line, markup=False)
    if json_out:
        save(check, json_out)
        out_console.print(f"wrote {json_out}")
    if plot:
        out_console.print(f"wrote {plot_additivity(check, plot)}")
