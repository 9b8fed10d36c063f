"""What the ``memplan`` commands share: the parsers of sizes, lists and scalars, the options several
commands declare, and the console / output helpers. One rule each:

* a scalar (``-o key=value``, ``-O key=value``) is an int, else a float, else ``true`` /
  ``false`` (a bool, any case), else the text as given: ``-o full_norms=none`` is the choice
  "none". No spelling means None: an option left at its default is omitted (None counts as not
  given everywhere, so a parsed None would silently drop a choice);
* a list is comma-separated; a fraction may be written ``1/8``;
* a size (``--budget``, ``--budgets``: 100KB, 100KiB, 0.1MB, bytes) is read by the workflow with
  :func:`memplan.units.parse_bytes`, a FLOP count (``--flops-budget``: 5MFLOPs, 2.5e6, 1G) with
  :func:`memplan.units.parse_flops`, so the Python API takes the same strings;
* ``--device`` is a torch device (``cpu`` / ``cuda`` / ``auto``); a budget's hardware profile
  (stm32f746, ...) is ``--target``.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import typer
from rich.console import Console

from .errors import AssumptionWarning, MemplanError
from .io import write_text

ModelArg = typer.Argument(..., help="zoo name (see `memplan models`), package.module:attr or path/to/file.py:attr")
MethodOpt = typer.Option("full", "--method", "-m", help="strategy (see `memplan methods`)")
BatchOpt = typer.Option(1, "--batch", "-b", help="batch size")
ResOpt = typer.Option(None, "--resolution", "-r", help="input side in px (default: the model's)")
ClassesOpt = typer.Option(None, "--classes", "-c", help="classifier outputs (default: the model's)")
#: the accounting modes of ``memplan.modes.MODES``, named here so that help never imports torch
#: (tests/test_cli.py checks that the two agree)
MODE_NAMES = ("pytorch", "applied", "ideal", "tinytraining", "mcu", "mcu-nopatch", "mcu-accum", "tinytl")
MODES_HELP = " | ".join(MODE_NAMES)
ModeOpt = typer.Option(
    "pytorch",
    "--mode",
    help=f"accounting convention: {MODES_HELP} (pytorch: eager autograd, byte-exact; README: Accounting modes)",
)
OptimOpt = typer.Option("sgd", "--optimizer", help="sgd | sgd-momentum | adam (state counted per trainable weight)")
#: --optimizer where the input records one (a scheme's, a contribution profile's)
OwnOptimOpt = typer.Option(
    None,
    "--optimizer",
    help="sgd | sgd-momentum | adam whose state is counted (default: the scheme's / profile's, else sgd)",
)
BudgetOpt = typer.Option(
    None, "--budget", help='memory budget: "100KB" (1000-based), "100KiB" (1024-based), "0.1MB" or bytes'
)
FlopsBudgetOpt = typer.Option(
    None,
    "--flops-budget",
    help='also bound the backward FLOPs of one training step: "5MFLOPs", "2.5e6", "1G" (k, M, G, T 1000-based; '
    "a bare number is FLOPs). FLOPs = 2 x MACs of the backward of conv / linear / matmul (grad-input, grad-weight "
    "of the updated fraction as the mode counts it; grad-bias 1 per output element); norm / activation / pooling "
    "/ loss backward is not counted (default: memory only)",
)
SelectOpt = typer.Option(
    "magnitude+",
    "--select",
    help="channels of a weight update: magnitude+ | magnitude- | random, or importance (the top channels of a "
    "fisher / rgn profile's per-channel importance, listed in the scheme)",
)
BitsOpt = typer.Option(32, "--frozen-bits", help="storage bits of frozen weights (8 = int8)")
LeafOpt = typer.Option(None, "--leaf", help="module class or qualname to treat as one op (repeatable)")
BlocksNamesOpt = typer.Option(
    None, "--block-names", help="comma-separated block module qualnames (overrides the structural rule)"
)
ShapeOpt = typer.Option(None, "--input-shape", help="per-sample input shape, e.g. 3,224,224 (models outside the zoo)")
BinaryOpt = typer.Option(False, "--binary", help="print sizes 1024-based (KiB/MiB) instead of 1000-based (kB/MB)")
BlocksOpt = typer.Option(None, "--blocks", "-k", help="number of last blocks that train (lastk, mobiletl, cache-reuse)")
LayersOpt = typer.Option(None, "--layers", help="number of last conv/linear layers that train (lastk)")
SchemeOpt = typer.Option(
    None,
    "--scheme",
    help="sparse-update scheme: memplan scheme JSON, tiny-training backward_config, or the name of a shipped "
    "scheme (e.g. mcunet-5fps-100KB); the model is traced at the scheme's input shape unless "
    "--resolution / --input-shape say otherwise",
)
BitsCacheOpt = typer.Option(None, "--bits", help="bits per cached feature (cache-reuse, minilearn)")
SamplesOpt = typer.Option(None, "--samples", help="number of training samples (cache-reuse, minilearn)")
EpochsOpt = typer.Option(None, "--epochs", help="training epochs (cache-reuse)")
OptionOpt = typer.Option(
    None, "--option", "-o", help="other strategy option as key=value (repeatable), e.g. -o lite_kernel=3"
)
OutputOpt = typer.Option(
    None,
    "--output",
    help="the key / field / index of the logits when the model returns a tuple, "
    "dict or namedtuple (default: its first tensor)",
)
ModeOptionOpt = typer.Option(
    None,
    "--mode-option",
    "-O",
    help="accounting-mode option as key=value (repeatable), e.g. "
    "-O state_bits=32 -O grad_accumulation=true for tinytraining",
)
NormOpt = typer.Option(
    None, "--norm", help="replace the model's norm layers: 'group' (GroupNorm, 8 channels per group) as TinyTL does"
)
#: the old spelling of ``--target`` on ``profile`` / ``search`` (deprecated: ``--device`` is a torch device)
OldTargetOpt = typer.Option(None, "--device", hidden=True, help="deprecated spelling of --target")


def target_option(target: str | None, old: str | None, command: str) -> str | None:
    """``--target``, or its deprecated spelling ``--device`` (one warning line on stderr)."""
    if old is None:
        return target
    if target is not None:
        raise MemplanError(
            f"give --target {target} or --device {old}, not both", "--device is the deprecated spelling of --target"
        )
    sys.stderr.write(
        f"warning: `memplan {command} --device {old}` is deprecated: write --target {old} "
        "(--device names a torch device)\n"
    )
    return old


def scalar(text: str) -> Any:
    """The one scalar rule (module docstring): int, float, true / false, else the text."""
    text = text.strip()
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def key_values(items: list[str] | None, flag: str) -> dict[str, Any]:
    """``key=value`` items as a dict (values by :func:`scalar`; ``-`` in keys read as ``_``)."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise MemplanError(f"cannot read {flag} {item!r}", f"write {flag} key=value")
        out[key.strip().replace("-", "_")] = scalar(value)
    return out


def positive_int(name: str, value: int) -> None:
    if value < 1:
        raise MemplanError(f"--{name} must be a positive integer, got {value}")


def eval_fraction(text: str) -> float:
    """'1/8' or '0.125' -> 0.125."""
    num, slash, den = text.strip().partition("/")
    return float(num) / float(den) if slash else float(num)


def floats(text: str | None, name: str) -> list[float] | None:
    """Comma-separated numbers or fractions (``1/8,0.25``); None stays None."""
    if text is None:
        return None
    try:
        return [float(eval_fraction(t)) for t in text.split(",") if t.strip()]
    except ValueError:
        raise MemplanError(
            f"cannot read --{name} {text!r}", "write comma-separated numbers, e.g. 0.125,0.25,0.5,1"
        ) from None


def ints(text: str | None, name: str) -> list[int] | None:
    """Comma-separated integers; None stays None."""
    if text is None:
        return None
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise MemplanError(f"cannot read --{name} {text!r}", "write comma-separated integers, e.g. 0,1,2") from None


def shape(text: str | None) -> tuple[int, ...] | None:
    """``--input-shape`` 3,224,224 (or 3x224x224) -> (3, 224, 224)."""
    if text is None:
        return None
    try:
        dims = tuple(int(s) for s in text.replace("x", ",").split(",") if s.strip())
    except ValueError:
        raise MemplanError(f"cannot read --input-shape {text!r}", "write it like 3,224,224") from None
    if not dims or min(dims) < 1:
        raise MemplanError(f"--input-shape {text!r} must be positive integers")
    return dims


def scheme_arg(text: str | None) -> str | None:
    """``--scheme``: a file as given; a name that is no file, of a scheme shipped with memplan
    (``memplan/data/schemes``, e.g. ``mcunet-5fps-100KB``), as that scheme's path."""
    if text is None or os.path.exists(text) or os.sep in text:
        return text
    from .plan import shipped_scheme  # the scheme format only where a scheme is read

    try:
        return str(shipped_scheme(text))
    except MemplanError as exc:
        raise MemplanError(f"--scheme {text!r} is neither a file nor a shipped scheme", exc.hint) from None


def console(stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr), 160 columns wide when not a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 160)


def emit(text: str, target: str, out: Console) -> None:
    """Write ``text`` to stdout (``-``) or atomically to the file ``target`` (saying so on ``out``)."""
    if target == "-":
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        out.print(f"wrote {write_text(target, text)}")


def _usage_error(exc: Any, err: Console) -> int:
    """A typer usage error in one line on stderr (exit code 2); a command given no arguments prints its help (0)."""
    if type(exc).__name__ == "NoArgsIsHelpError":
        print(exc.format_message())
        return 0
    err.print(f"error: {' '.join(exc.format_message().split())}", markup=False)
    return getattr(exc, "exit_code", 2)


def run_command(command: Any, argv: list[str] | None) -> int:
    """Run a click command (``typer.main.get_command(app)``) and return the exit code, every failure
    told in one line on stderr: ``error: ...`` and 2 for bad input (a ``MemplanError`` or a usage
    error), 130 when interrupted, 1 and ``internal error: ...`` for a bug (its traceback with
    MEMPLAN_DEBUG=1)."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    show = warnings.showwarning

    def one_line(message: Warning | str, category: type[Warning], *rest: Any, **kw: Any) -> None:
        if issubclass(category, AssumptionWarning):
            err.print(f"warning: {' '.join(str(message).split())}", markup=False)
        else:
            show(message, category, *rest, **kw)

    warnings.showwarning = one_line
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
        code = _usage_error(exc, err)
    except Exception as exc:  # an internal bug: still one line unless debugging
        if os.environ.get("MEMPLAN_DEBUG"):
            raise
        err.print(
            f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())} "
            "(rerun with MEMPLAN_DEBUG=1 for the traceback)",
            markup=False,
        )
        code = 1
    finally:
        warnings.showwarning = show
    return code
