"""Options objects: every option of a workflow is one field of a frozen pydantic model, declared
once with its default and its description, and a workflow's options are nested groups of them
(``memplan.contrib.options.ContribOptions``, ``memplan.search.options.SearchOptions``).

* the command line derives one typer option per field (``memplan.cli_common.options_command``:
  flag, default and help from the field; :func:`option` adds another spelling, a parser of the
  option's text, or keeps a field off the command line);
* the entry points take the object, or its options by name as keywords (:meth:`Options.of`:
  flat names, each option's name being unique across the groups);
* the objects are never changed: :meth:`Options.replace` returns a new one;
* an option that several workflows take (the accounting mode, the batch, ...) is one annotated
  type below (``mode: Mode = None``): its flags and help are written once, each group states only
  its default.

Nothing here imports torch: the command line reads the fields before any command runs.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import BadOption
from .names import DEFAULT_OPTIMIZER, MODES, OPTIMIZERS, PROFILE_MODE, SEARCH_MODE, choices

OptionsT = TypeVar("OptionsT", bound="Options")
F = TypeVar("F", bound=Callable[..., Any])


def option(default: Any = None, description: str = "", *, flags: tuple[str, ...] = (), **cli: Any) -> Any:
    """A field that is one option. ``flags``: its command-line spellings (default ``--name`` with
    ``-`` for ``_``); ``cli``: ``parse="ints" | "floats" | ...`` (how the command line reads its text,
    ``memplan.cli_common.PARSERS``), ``negate=True`` (a flag that turns the option off, ``--no-cache``),
    ``hidden=True`` or ``cli=False`` (an option of the Python API only)."""
    extra = {**({"flags": tuple(flags)} if flags else {}), **cli}
    return Field(default, description=description, json_schema_extra=extra or None)


def cli_extra(field: Any) -> dict[str, Any]:
    """The command-line settings :func:`option` gave a field."""
    return dict(field.json_schema_extra or {}) if isinstance(field.json_schema_extra, dict) else {}


def takes_none(annotation: Any) -> bool:
    """Whether a field of this annotation accepts None."""
    if annotation is None or annotation is type(None) or annotation is Any:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(takes_none(a) for a in typing.get_args(annotation))
    return False


def _group(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


class Options(BaseModel):
    """A frozen group of options (module docstring); a field whose type is a pydantic model is a
    group of options itself."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    #: names the options in error messages (``bad <what> option x: ...``)
    what: typing.ClassVar[str] = ""

    @classmethod
    def leaves(cls) -> dict[str, tuple[tuple[str, ...], Any]]:
        """Every option (a field that is no group), by name: (the groups it lies in, its field)."""
        return _leaves(cls)

    @classmethod
    def of(cls: type[OptionsT], **options: Any) -> OptionsT:
        """From options by name (flat; a group may also be given whole, by its name). An option
        given as None takes its default where it does not accept None (None counts as not given)."""
        leaves = cls.leaves()
        nested: dict[str, Any] = {}
        for name, value in options.items():
            if name in cls.model_fields and _group(cls.model_fields[name].annotation) is not None:
                nested[name] = value if isinstance(value, BaseModel) else {**nested.get(name, {}), **value}
                continue
            if name not in leaves:
                raise TypeError(f"{cls.__name__} has no option {name!r}")
            path, field = leaves[name]
            if value is None and not takes_none(field.annotation):
                continue
            into = nested
            for group in path:
                into = into.setdefault(group, {})
                if isinstance(into, BaseModel):  # a group given whole, then one of its options
                    raise TypeError(f"option {name!r} given both alone and in its group {group!r}")
            into[name] = value
        return cls.checked(nested)

    @classmethod
    def checked(cls: type[OptionsT], data: dict[str, Any]) -> OptionsT:
        """``cls(**data)``, a validation error told in one line naming the option."""
        try:
            return cls(**data)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = next((str(p) for p in reversed(err["loc"]) if isinstance(p, str) and p in cls.leaves()), None)
            where = where or ".".join(str(p) for p in err["loc"]) or "(top level)"
            raise BadOption(f"bad {cls.what + ' ' if cls.what else ''}option {where}: {err['msg']}") from None

    def replace(self: OptionsT, **options: Any) -> OptionsT:
        """A copy with ``options`` (by name, as in :meth:`of`) changed; this object is never changed."""
        return type(self).of(**{**self.flat(), **options})

    def flat(self) -> dict[str, Any]:
        """Every option by name (values as held)."""
        out: dict[str, Any] = {}
        for name, (path, _) in self.leaves().items():
            value: Any = self
            for group in path:
                value = getattr(value, group)
            out[name] = getattr(value, name)
        return out


@functools.cache
def _leaves(model: type[BaseModel]) -> dict[str, tuple[tuple[str, ...], Any]]:
    out: dict[str, tuple[tuple[str, ...], Any]] = {}
    for name, field in model.model_fields.items():
        group = _group(field.annotation)
        found = {name: ((), field)} if group is None else {k: ((name, *p), f) for k, (p, f) in _leaves(group).items()}
        for key, value in found.items():
            if key in out or key in model.model_fields and group is not None:
                raise ValueError(f"option {key!r} is declared twice in {model.__name__}")
            out[key] = value
    return out


def with_keywords(cls: type[Options], param: str = "opts", positional: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Decorator: ``fn(..., opts: cls | None)`` also takes each option of ``cls`` by name, as a
    keyword (a thin convenience derived from the fields: ``fn(x, seeds=(0, 1))`` is
    ``fn(x, cls.of(seeds=(0, 1)))``; given with ``opts``, they change a copy of it), and the options
    named in ``positional`` also by position, before ``opts`` (``fn(x, opts)`` still passes the
    object). Its signature lists them, each with the field's type and default; an unknown keyword is
    a TypeError, as for any function, unless ``fn`` takes ``**kwargs`` (strategy options): those go
    there."""

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn)
        leaves = cls.leaves()
        own = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        rest = [p for p in sig.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
        at = [p.name for p in own].index(param)

        def parameter(name: str, kind: Any) -> inspect.Parameter:
            field = leaves[name][1]
            return inspect.Parameter(name, kind, default=field.default, annotation=field.annotation)

        derived = sig.replace(
            parameters=[
                *own[:at],
                *(parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in positional),
                *own[at:],
                *(parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in leaves if n not in positional),
                *rest,
            ]
        )

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            given = dict(derived.bind(*args, **kwargs).arguments)
            for name in positional:  # fn(x, opts): the options object given where a positional option goes
                if isinstance(given.get(name), cls) and param not in given:
                    given[param] = given.pop(name)
            extra = given.pop(rest[0].name, {}) if rest else {}
            named = {k: v for k, v in given.items() if k in leaves}
            arguments = {k: v for k, v in given.items() if k not in leaves}
            if named:
                base = arguments.get(param)
                arguments[param] = cls.of(**named) if base is None else base.replace(**named)
            return fn(**arguments, **extra)

        call.__signature__ = derived  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return decorate


# ---- options several workflows take: each declared once, as a type (``batch: Batch = 2``) ----

Mode = Annotated[
    str | None,
    option(
        None,
        f"accounting convention: {choices(MODES)} (README: Accounting modes; not given: the --target's mode, else "
        f"{PROFILE_MODE} for profile / compare, {SEARCH_MODE} for search)",
    ),
]
ModeOptions = Annotated[
    dict[str, Any] | None,
    option(
        None,
        "accounting-mode option as key=value (repeatable), e.g. -O state_bits=32 -O grad_accumulation=true for "
        "tinytraining",
        flags=("--mode-option", "-O"),
        parse="key_values",
    ),
]
Optimizer = Annotated[
    str | None,
    option(
        None,
        f"{choices(OPTIMIZERS)}, whose state is counted per trainable weight (not given: the one the scheme or "
        f"the contribution profile records, else {DEFAULT_OPTIMIZER})",
    ),
]
FrozenBits = Annotated[int, option(32, "storage bits of frozen weights: 32, 16 or 8 (int8)")]
Target = Annotated[
    str | None,
    option(
        None,
        "hardware profile, e.g. stm32f746 (memplan/data/profiles/devices): the memory training may use on it, in "
        "its mode unless --mode says otherwise",
        flags=("--target",),
    ),
]
Batch = Annotated[int, option(1, "batch size of one training step", flags=("--batch", "-b"))]
Resolution = Annotated[
    int | None,
    option(
        None,
        "input side in px (not given: the model's; contrib: the data source's, 32 for digits; search: the "
        "contribution profile's costing resolution)",
        flags=("--resolution", "-r"),
    ),
]
Classes = Annotated[
    int | None,
    option(None, "classifier outputs (default: the model's, or the contribution profile's)", flags=("--classes", "-c")),
]
InputShape = Annotated[
    tuple[int, ...] | None,
    option(None, "per-sample input shape, e.g. 3,224,224 (models outside the zoo)", parse="shape"),
]
Norm = Annotated[
    str | None,
    option(None, "replace the model's norm layers: 'group' (GroupNorm, 8 channels per group) as TinyTL does"),
]
