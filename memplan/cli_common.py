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

import functools
import inspect
import os
import sys
import types
import typing
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console

from .errors import AssumptionWarning, MemplanError
from .io import write_text
from .options import Options, cli_extra, takes_none

OptionsT = TypeVar("OptionsT", bound=Options)
F = TypeVar("F", bound=Callable[..., Any])

ModelArg = typer.Argument(..., help="zoo name (see `memplan models`), package.module:attr or path/to/file.py:attr")
BinaryOpt = typer.Option(False, "--binary", help="print sizes 1024-based (KiB/MiB) instead of 1000-based (kB/MB)")
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


def validation_arg(text: str, name: str = "validation") -> Any:
    """``--validation``: images per class (an int), a fraction (a float), or ``none`` (no split)."""
    if text.strip().lower() == "none":
        return None
    value = scalar(text)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MemplanError(f"cannot read --{name} {text!r}", "an integer per class (100) or a fraction (0.2)")
    return value


#: how the command line reads an option's text (``memplan.options.option(parse=...)``; a tuple of
#: ints or floats is read by ``ints`` / ``floats`` without saying so): ``parser(text, name)``
PARSERS: dict[str, Callable[[Any, str], Any]] = {
    "ints": ints,
    "floats": floats,
    "text": lambda text, name: text,
    "texts": lambda text, name: [t.strip() for t in text.split(",") if t.strip()],
    "validation": validation_arg,
    "key_values": lambda items, name: key_values(items, f"--{name}"),
    "repeated": lambda items, name: tuple(items),
    "shape": lambda text, name: shape(text),
    "scheme": lambda text, name: scheme_arg(text),
    "none": lambda text, name: None if text.strip().lower() == "none" else text,
}
#: parsers of a repeatable option (``--leaf A --leaf B``): typer hands them the list of texts
REPEATABLE = ("key_values", "repeated")


def _cli_type(name: str, field: Any) -> tuple[Any, str | None]:
    """(the type typer reads, the parser of its text or None) of one option."""
    extra = cli_extra(field)
    if "parse" in extra:
        return (list[str] | None if extra["parse"] in REPEATABLE else str | None), extra["parse"]
    union = typing.get_origin(field.annotation) in (typing.Union, types.UnionType)
    args = [a for a in typing.get_args(field.annotation) if a is not type(None)] if union else [field.annotation]
    base = args[0] if len(args) == 1 else None
    if typing.get_origin(base) is tuple:
        element = typing.get_args(base)[0]
        return str | None, {int: "ints", float: "floats"}.get(element, "text")
    if base in (bool, int, float, str):
        return (base | None if takes_none(field.annotation) else base), None
    return str | None, None  # a union (a path, a budget) or a literal: read as given, validated by the field


def option_parameters(cls: type[Options]) -> list[inspect.Parameter]:
    """One typer option per option of ``cls`` (``memplan.options``): its flags, its default and its
    help from the field (an option whose text is parsed defaults to None: not given)."""
    params = []
    for name, (_, field) in cls.leaves().items():
        extra = cli_extra(field)
        if extra.get("cli") is False:
            continue
        kind, parse = _cli_type(name, field)
        flags = extra.get("flags") or (f"--{name.replace('_', '-')}",)
        default = False if extra.get("negate") else None if parse else field.default
        help_text = field.description
        if parse and field.default is not None:  # a parsed option shows the field's default as it is written
            shown = ",".join(map(str, field.default)) if isinstance(field.default, tuple) else str(field.default)
            help_text += f"  [default: {shown}]"
        info = typer.Option(default, *flags, help=help_text, hidden=extra.get("hidden", False))
        params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=info, annotation=kind))
    return params


def options_of(cls: type[OptionsT], values: dict[str, Any]) -> OptionsT:
    """The options object of the typer values of :func:`option_parameters` (a parsed option that
    was not given keeps the field's default)."""
    given = {}
    for name, value in values.items():
        field = cls.leaves()[name][1]
        extra, (_, parse) = cli_extra(field), _cli_type(name, field)
        flag = (extra.get("flags") or (f"--{name.replace('_', '-')}",))[0].lstrip("-")
        if extra.get("negate"):
            given[name] = not value
        elif parse is None:
            given[name] = value
        elif value not in (None, [], ""):  # a parsed option not given (or given empty) keeps its default
            given[name] = PARSERS[parse](value, flag)
    return cls.of(**given)


def options_command(cls: type[Options]) -> Callable[[F], F]:
    """Decorator of a typer command ``fn(..., opts: cls)``: the command takes one option per field of
    ``cls`` besides its own parameters (:func:`option_parameters`: a new option is one field), and
    ``fn`` receives them as ``opts``."""

    def decorate(fn: F) -> F:
        hints = typing.get_type_hints(fn)
        sig = inspect.signature(fn)
        own = [p.replace(annotation=hints[p.name]) for p in sig.parameters.values() if p.name != "opts"]
        derived = option_parameters(cls)
        clash = {p.name for p in own} & {p.name for p in derived}
        if clash:
            raise ValueError(f"{fn.__name__}: parameters named like options: {', '.join(sorted(clash))}")

        @functools.wraps(fn)
        def command(**values: Any) -> Any:
            opts = options_of(cls, {p.name: values.pop(p.name) for p in derived})
            return fn(**values, opts=opts)

        params = [*own, *derived]
        command.__signature__ = sig.replace(parameters=params, return_annotation=None)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command  # type: ignore[return-value]

    return decorate


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
