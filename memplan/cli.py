"""``memplan`` command line: a thin typer layer over the Python API.

Every error caused by the input ends in one line ``error: ...`` on stderr and exit code 2
(1 for an internal error; set MEMPLAN_DEBUG=1 for its traceback; 130 when interrupted).
"""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console

from . import api, cli_peak
from .cli_contrib import app as contrib_app, floats as _floats, key_values
from .errors import MemplanError
from .io import write_text
from .render import export, tables
from .strategies import STRATEGIES, TRANSFORMS

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Memory / FLOP profiler and sparse-update planner for on-device transfer learning.")
app.add_typer(contrib_app, name="contrib")

ModelArg = typer.Argument(..., help="zoo name (see `memplan models`), package.module:attr or path/to/file.py:attr")
BatchOpt = typer.Option(1, "--batch", "-b", help="batch size")
ResOpt = typer.Option(None, "--resolution", "-r", help="input side in px (default: the model's)")
ClassesOpt = typer.Option(None, "--classes", "-c", help="classifier outputs (default: the model's)")
ModeOpt = typer.Option("pytorch", "--mode", help="accounting convention: pytorch (eager autograd, byte-exact) or ideal")
OptimOpt = typer.Option("sgd", "--optimizer", help="sgd | sgd-momentum | adam (state counted per trainable weight)")
BitsOpt = typer.Option(32, "--frozen-bits", help="storage bits of frozen weights (8 = int8)")
LeafOpt = typer.Option(None, "--leaf", help="module class or qualname to treat as one op (repeatable)")
BlocksNamesOpt = typer.Option(None, "--block-names", help="comma-separated block module qualnames (overrides the structural rule)")
ShapeOpt = typer.Option(None, "--input-shape", help="per-sample input shape, e.g. 3,224,224 (models outside the zoo)")
BinaryOpt = typer.Option(False, "--binary", help="print sizes 1024-based (KiB/MiB) instead of 1000-based (kB/MB)")
BlocksOpt = typer.Option(None, "--blocks", "-k", help="number of last blocks that train (lastk, mobiletl, cache-reuse)")
LayersOpt = typer.Option(None, "--layers", help="number of last conv/linear layers that train (lastk)")
SchemeOpt = typer.Option(None, "--scheme", help="sparse-update scheme: memplan scheme JSON or tiny-training backward_config")
BitsCacheOpt = typer.Option(None, "--bits", help="bits per cached feature (cache-reuse, minilearn)")
SamplesOpt = typer.Option(None, "--samples", help="number of training samples (cache-reuse, minilearn)")
EpochsOpt = typer.Option(None, "--epochs", help="training epochs (cache-reuse)")
OptionOpt = typer.Option(None, "--option", "-o", help="other strategy option as key=value (repeatable), e.g. -o lite_kernel=3")
OutputOpt = typer.Option(None, "--output", help="the key / field / index of the logits when the model returns a tuple, "
                         "dict or namedtuple (default: its first tensor)")
ModeOptionOpt = typer.Option(None, "--mode-option", "-O", help="accounting-mode option as key=value (repeatable), e.g. "
                             "-O state_bits=32 -O grad_accumulation=true for tinytraining")
NormOpt = typer.Option(None, "--norm", help="replace the model's norm layers: 'group' (GroupNorm, 8 channels per group) as TinyTL does")


def _strategy_opts(blocks, layers, scheme, bits, samples, epochs, option) -> dict:
    """Strategy options from the CLI; ``-o key=value`` passes any other (ints / floats parsed)."""
    opts = dict(blocks=blocks, layers=layers, scheme=scheme, bits=bits, samples=samples, epochs=epochs)
    for item in option or ():
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise MemplanError(f"cannot read -o {item!r}", "write -o key=value")
        opts[key.strip().replace("-", "_")] = _scalar(value.strip())
    return opts


def _scalar(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def _shape(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        shape = tuple(int(s) for s in text.replace("x", ",").split(",") if s.strip())
    except ValueError:
        raise MemplanError(f"cannot read --input-shape {text!r}", "write it like 3,224,224") from None
    if not shape or min(shape) < 1:
        raise MemplanError(f"--input-shape {text!r} must be positive integers")
    return shape


def _capture_opts(batch, resolution, classes, leaf, block_names, input_shape, norm=None, output=None) -> dict:
    return dict(batch=batch, resolution=resolution, classes=classes, leaf_modules=tuple(leaf or ()), norm=norm,
                block_names=[b.strip() for b in block_names.split(",") if b.strip()] if block_names else None,
                input_shape=_shape(input_shape), output=output)


def _console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 160)


def _emit(text: str, target: str, console: Console) -> None:
    if target == "-":
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        path = write_text(target, text)
        console.print(f"wrote {path}")


@app.command()
def profile(
    ctx: typer.Context,
    model: str = ModelArg,
    method: str = typer.Option("full", "--method", "-m", help="strategy (see `memplan methods`)"),
    blocks: int | None = BlocksOpt, layers: int | None = LayersOpt, scheme: str | None = SchemeOpt,
    bits: int | None = BitsCacheOpt, samples: int | None = SamplesOpt, epochs: int | None = EpochsOpt,
    option: list[str] | None = OptionOpt, norm: str | None = NormOpt,
    batch: int = BatchOpt, resolution: int | None = ResOpt, classes: int | None = ClassesOpt,
    mode: str = ModeOpt, optimizer: str = OptimOpt, frozen_bits: int = BitsOpt, mode_option: list[str] | None = ModeOptionOpt,
    per_layer: bool = typer.Option(False, "--per-layer", help="print the per-layer table (and, for sparse / "
                                   "tinytraining, the cost of updating each conv: the 256KB paper's Figure 11a)"),
    plot: str | None = typer.Option(None, "--plot", help="draw the per-conv update costs (Figure 11a) to PATH"),
    json_out: str | None = typer.Option(None, "--json", help="write the profile as JSON to PATH ('-' = stdout, JSON only)"),
    csv_out: str | None = typer.Option(None, "--csv", help="write the per-layer table as CSV to PATH ('-' = stdout)"),
    leaf: list[str] | None = LeafOpt, block_names: str | None = BlocksNamesOpt,
    input_shape: str | None = ShapeOpt, binary: bool = BinaryOpt, output: str | None = OutputOpt,
    check: bool = typer.Option(False, "--check", help="also run one forward + loss on meta tensors under "
                               "saved_tensors_hooks and compare with the prediction (exit 1 if they differ)"),
    schedule: str | None = cli_peak.ScheduleOpt, calibration: str = cli_peak.CalibrationOpt,
    device: str | None = cli_peak.DeviceOpt,
) -> None:
    """Memory and FLOPs of fine-tuning MODEL with one strategy."""
    quiet = json_out == "-" or csv_out == "-"
    console = _console(quiet)
    strategy_opts = _strategy_opts(blocks, layers, scheme, bits, samples, epochs, option)
    capture_opts = _capture_opts(batch, resolution, classes, leaf, block_names, input_shape, norm, output)
    mode = cli_peak.device_mode(ctx, mode, device)
    p = api.profile(model, method, mode=mode, optimizer=optimizer, frozen_bits=frozen_bits, check=check,
                    schedule=schedule, calibration=cli_peak.calibration_arg(calibration),
                    mode_options=key_values(mode_option, "--mode-option"), **strategy_opts, **capture_opts)
    if device:
        cli_peak.add_fit(p, device)
    if json_out:
        _emit(export.to_json(p), json_out, console)
    if csv_out:
        _emit(export.layers_csv([p]), csv_out, console)
    if not quiet:
        tables.print_profile(p, console, per_layer=per_layer, binary=binary)
    if plot or (per_layer and not quiet and (method == "sparse" or mode == "tinytraining")):
        rows = api.update_costs(model, **capture_opts)
        if per_layer and not quiet:
            tables.print_conv_update_costs(rows, console)
        if plot:
            from .render.figures import plot_layer_costs

            plot_layer_costs(rows, plot, title=f"{p.model}: cost of updating each conv (tinytraining)")
            console.print(f"wrote {plot}")
    if check and (p.check["predicted"] != p.check["observed"] or p.check["differing"]):
        raise typer.Exit(1)


@app.command()
def verify(
    model: str = ModelArg,
    method: str = typer.Option("full", "--method", "-m", help="strategy (see `memplan methods`)"),
    blocks: int | None = BlocksOpt, layers: int | None = LayersOpt, scheme: str | None = SchemeOpt,
    option: list[str] | None = OptionOpt, norm: str | None = NormOpt,
    batch: int = typer.Option(2, "--batch", "-b", help="batch size"), resolution: int | None = ResOpt,
    classes: int | None = ClassesOpt,
    steps: int = typer.Option(2, "--steps", help="real training steps on random data"),
    optimizer: str = OptimOpt,
    device: str = typer.Option("auto", "--device", help="auto (CUDA when present), cpu or cuda"),
    tolerance: int = typer.Option(0, "--tolerance", help="allowed |measured - predicted| saved bytes"),
) -> None:
    """Apply the strategy to a real model, train a few steps on random data, and compare
    predicted with measured saved bytes and peak, plain PyTorch vs `applied` side by side.
    Exits 1 when measured saved bytes differ from the prediction by more than --tolerance."""
    from .render.reports import print_verify
    from .verify import EXIT_MISMATCH, verify as run_verify

    opts = {k: v for k, v in _strategy_opts(blocks, layers, scheme, None, None, None, option).items() if v is not None}
    report = run_verify(model, method, batch=batch, resolution=resolution, classes=classes, norm=norm, steps=steps,
                        device=device, optimizer=optimizer, tolerance=tolerance, **opts)
    print_verify(report, _console())
    if not report.ok:
        raise typer.Exit(EXIT_MISMATCH)


@app.command()
def search(
    model: str | None = typer.Argument(None, help="model (default: mcunet-5fps at 128 px with its shipped profile)"),
    budget: str | None = typer.Option(None, "--budget", help='memory budget: "100KB" (1000-based), "100KiB" '
                                         '(1024-based), "0.1MB" or bytes'),
    profile: str | None = typer.Option(None, "--profile", help="contribution profile JSON (default: the shipped one "
                                          "matching the model)"),
    device: str | None = typer.Option(None, "--device", help="device profile, e.g. stm32f746: the budget is its memory "
                                         "left to training in the mode (its default mode: mcu, the modelled peak)"),
    mode: str | None = typer.Option(None, "--mode", help="accounting mode of the budget (default: tinytraining, "
                                       "or the device's mode)"),
    optimizer: str = OptimOpt, mode_option: list[str] | None = ModeOptionOpt,
    method: str | None = typer.Option(None, "--method", help="exact | evolution | random (default: exact when "
                                         "memory is additive in the mode)"),
    generations: int = typer.Option(100, "--generations"), population: int = typer.Option(100, "--population"),
    seed: int = typer.Option(0, "--seed"),
    out: str | None = typer.Option(None, "--out", help="write the scheme JSON"),
    plot: str | None = typer.Option(None, "--plot", help="draw Figure 13 (evolution vs random) and 11b to PATH"),
    ratios: str | None = typer.Option(None, "--ratios", help="weight ratios of the space, e.g. 1/8,1/4,1/2,1"),
    pw1_only: bool = typer.Option(False, "--pw1-only", help="update weights of first pointwise convs only"),
    max_weight_layers: int | None = typer.Option(None, "--max-weight-layers", help="cap on weight-updated layers"),
    classes: int | None = ClassesOpt, resolution: int | None = ResOpt,
) -> None:
    """Search the sparse-update scheme with the largest summed Δacc under a memory budget."""
    from .render.figures import plot_search
    from .render.reports import print_search
    from .search.run import run_search

    if budget is None and device is None:
        raise MemplanError("give --budget (e.g. 100KB) or --device NAME")
    extra = {"ratios": _floats(ratios, "ratios")} if ratios else {}
    result = run_search(model, budget, profile_path=profile, device=device, mode=mode, method=method,
                        generations=generations, population=population, seed=seed, out=out, curves=plot is not None,
                        pw1_only=pw1_only, max_weight_layers=max_weight_layers, classes=classes,
                        resolution=resolution, command="memplan " + " ".join(sys.argv[1:]), optimizer=optimizer,
                        mode_options=key_values(mode_option, "--mode-option"), **extra)
    console = _console()
    print_search(result, console)
    if plot:
        plot_search(result, plot)
        console.print(f"plot written to {plot}")


@app.command()
def schema() -> None:
    """Print the JSON Schema of memplan's update-scheme format (a copy is in schema/)."""
    from .plan import schema_json

    text = schema_json()
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


@app.command()
def compare(
    model: str = ModelArg,
    methods: str | None = typer.Option(None, "--methods", help="comma-separated strategies, method:K sets --blocks K, "
                                          "e.g. full,bias,lastk:3,mobiletl:3 (default: full,last,norm,bias,lastk:3)"),
    norm: str | None = NormOpt,
    batch: int = BatchOpt, resolution: int | None = ResOpt, classes: int | None = ClassesOpt,
    mode: str = ModeOpt, optimizer: str = OptimOpt, frozen_bits: int = BitsOpt, mode_option: list[str] | None = ModeOptionOpt,
    json_out: str | None = typer.Option(None, "--json", help="write all profiles as JSON to PATH ('-' = stdout)"),
    csv_out: str | None = typer.Option(None, "--csv", help="write one totals row per strategy as CSV to PATH"),
    leaf: list[str] | None = LeafOpt, block_names: str | None = BlocksNamesOpt,
    input_shape: str | None = ShapeOpt, binary: bool = BinaryOpt, output: str | None = OutputOpt,
) -> None:
    """One row per strategy: trainable params, saved activations, weights, memory, FLOPs."""
    quiet = json_out == "-" or csv_out == "-"
    console = _console(quiet)
    items = None
    if methods:
        items = []
        for tok in (t.strip() for t in methods.split(",") if t.strip()):
            name, _, k = tok.partition(":")
            if k and not k.isdigit():
                raise MemplanError(f"cannot read {tok!r} in --methods", "write a method, or method:K for K blocks")
            items.append((name, {"blocks": int(k)} if k else {}))
    profiles = api.compare(model, items, mode=mode, optimizer=optimizer, frozen_bits=frozen_bits,
                           mode_options=key_values(mode_option, "--mode-option"),
                           **_capture_opts(batch, resolution, classes, leaf, block_names, input_shape, norm, output))
    if json_out:
        _emit(export.many_to_json(profiles), json_out, console)
    if csv_out:
        _emit(export.totals_csv(profiles), csv_out, console)
    if not quiet:
        tables.print_compare(profiles, console, binary=binary)


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
    console = _console(quiet)
    rows = run_reproduce(only or "", include_not_modelled=not hide_not_modelled)
    if json_out:
        _emit(reproduction_json(rows), json_out, console)
    if not quiet:
        print_reproduction(rows, console)


app.command(name="calibrate")(cli_peak.calibrate)


@app.command()
def methods() -> None:
    """The fine-tuning strategies and their options."""
    tables.print_methods(STRATEGIES.values(), _console(), TRANSFORMS.values())


@app.command()
def models() -> None:
    """The model zoo with parameters and MACs at each model's default resolution."""
    tables.print_models(api.describe_models(), _console())


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the app and turn every failure into one line and an exit code."""
    command = typer.main.get_command(app)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        rv = command.main(args=argv, prog_name="memplan", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
        if code == 130:  # typer turns Ctrl-C into a return value of 130
            err.print("error: interrupted", markup=False)
    except MemplanError as exc:
        err.print(f"error: {exc}", markup=False)
        code = exc.exit_code
    except typer.Exit as exc:
        code = exc.exit_code
    except (KeyboardInterrupt, typer.Abort):
        err.print("error: interrupted", markup=False)
        code = 130
    except typer.TyperException as exc:  # usage errors (bad option value, missing argument, ...)
        if type(exc).__name__ == "NoArgsIsHelpError":
            print(exc.format_message())
            code = 0
        else:
            err.print(f"error: {' '.join(exc.format_message().split())}", markup=False)
            code = getattr(exc, "exit_code", 2)
    except Exception as exc:  # an internal bug: still one line unless debugging
        if os.environ.get("MEMPLAN_DEBUG"):
            raise
        err.print(f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())} "
                  "(rerun with MEMPLAN_DEBUG=1 for the traceback)", markup=False)
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()
