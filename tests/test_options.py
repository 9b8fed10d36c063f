"""Each option declared once (``memplan.options``): every command's typer options are derived from
its options object's fields, the Python entry points take the same fields as keywords, and the
options several workflows share (mode, batch, ...) are one annotated type each."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch
import typer
from pydantic import ValidationError

import memplan
from memplan import api
from memplan.accounting.devices import DEVICES_DIR
from memplan.cli import app
from memplan.contrib.options import ContribOptions
from memplan.errors import MemplanError
from memplan.options import Options, cli_extra
from memplan.profile_options import CalibrateOptions, CompareOptions, ProfileOptions, VerifyOptions
from memplan.search.options import SearchCommand, ValidateOptions

torch.set_num_threads(1)

ROOT = Path(memplan.__file__).parent
COMMANDS: dict[tuple[str, ...], type[Options]] = {
    ("profile",): ProfileOptions,
    ("compare",): CompareOptions,
    ("verify",): VerifyOptions,
    ("calibrate",): CalibrateOptions,
    ("search",): SearchCommand,
    ("contrib", "measure"): ContribOptions,
    ("contrib", "validate"): ValidateOptions,
}


def _command(path: tuple[str, ...]):
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return cmd


@pytest.mark.parametrize("path", list(COMMANDS), ids=" ".join)
def test_every_field_is_one_option_of_its_command(path):
    """Each command-line option of the object is a flag of the command, with the field's help."""
    cmd, cls = _command(path), COMMANDS[path]
    params = {p.name: p for p in cmd.params}
    for name, (_, field) in cls.leaves().items():
        if cli_extra(field).get("cli") is False:
            assert name not in params, name
            continue
        assert name in params, f"{' '.join(path)}: no option for field {name}"
        flags = cli_extra(field).get("flags") or (f"--{name.replace('_', '-')}",)
        assert set(flags) <= set(params[name].opts) | set(params[name].secondary_opts), name
        assert params[name].help.startswith(field.description), name


#: the modules that hold options objects (a field there is an option; elsewhere a pydantic field is
#: a record of a file format, e.g. the mode a scheme was planned under)
OPTION_MODULES = ("options.py", "profile_options.py", "search/options.py", "contrib/options.py")


def _declares(node: ast.AST, name: str, holds_options: bool) -> bool:
    """Whether ``node`` declares the option ``name`` (see :func:`_declarations`)."""
    flag = "--" + name.replace("_", "-")
    if isinstance(node, ast.Assign) and getattr(getattr(node.value, "value", None), "id", None) == "Annotated":
        return [getattr(t, "id", None) for t in node.targets] == [name.title().replace("_", "")]
    if isinstance(node, ast.AnnAssign) and holds_options and getattr(node.target, "id", None) == name:
        return isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) in ("option", "Field")
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Option":
        return any(isinstance(a, ast.Constant) and a.value == flag for a in node.args)
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "option":
        return any(kw.arg == "flags" and flag in ast.literal_eval(kw.value) for kw in node.keywords)
    return False


def _declarations(name: str) -> list[str]:
    """Where memplan's source declares an option called ``name``: an annotated alias of one
    (``Mode = Annotated[..., option(...)]``), a field of an options object assigned ``option(...)`` /
    ``Field(...)``, an ``option(...)`` spelled ``--name``, or a ``typer.Option`` spelled ``--name``."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        holds_options = str(path.relative_to(ROOT)) in OPTION_MODULES
        aliases = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Subscript)]
        inside = {id(c) for a in aliases for c in ast.walk(a.value) if isinstance(c, ast.Call)}
        for node in ast.walk(tree):  # the option(...) of an alias is not counted again: the alias declares it
            if id(node) not in inside and _declares(node, name, holds_options):
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    return found


def test_the_options_several_workflows_take_are_declared_once():
    """The issue's evidence: ``lr_bias``, ``budget`` and ``mode`` each have one declaration; the
    shared ones (mode, batch, ...) are the annotated types of memplan.options, used by every group."""
    assert len(_declarations("lr_bias")) == 1, _declarations("lr_bias")
    assert len(_declarations("budget")) == 1, _declarations("budget")
    (mode,) = _declarations("mode")  # the annotated type: every group says `mode: Mode = ...`
    assert mode.startswith("memplan/options.py:")
    for name in ("target", "mode_options", "frozen_bits", "classes", "input_shape", "norm"):
        assert len(_declarations(name)) == 1, (name, _declarations(name))
    groups = [ProfileOptions, CompareOptions, VerifyOptions, SearchCommand, ValidateOptions, ContribOptions]
    for name in ("mode", "batch", "resolution", "classes", "optimizer", "mode_options", "frozen_bits", "target"):
        # contrib's optimizer is another option: the one its runs train with (Protocol.optimizer)
        taken = [cls.leaves()[name][1] for cls in groups if name in cls.leaves()]
        taken = [f for f in taken if not (name == "optimizer" and f is ContribOptions.leaves()[name][1])]
        assert len(taken) >= 2, name  # shared: taken by at least two commands
        assert len({(f.description, str(f.json_schema_extra)) for f in taken}) == 1, name  # one declaration
    taking_mode = {cls.__name__ for cls in groups if "mode" in cls.leaves()}
    assert taking_mode == {"ProfileOptions", "CompareOptions", "SearchCommand", "ValidateOptions"}


def test_a_flag_means_one_thing_on_every_command():
    """A command-line spelling that several commands take is one option everywhere: the same field
    name and the same kind of value (one value, a comma-separated list or a repeatable option), so
    ``--batch 8`` is one batch size wherever it is written (``memplan calibrate`` included)."""
    from memplan.cli_common import REPEATABLE, _cli_type

    def kind(name: str, field) -> str:
        parse = _cli_type(name, field)[1]
        return "repeatable" if parse in REPEATABLE else "list" if parse in ("ints", "floats", "texts") else "one"

    meaning: dict[str, set[tuple[str, str]]] = {}
    for cls in COMMANDS.values():
        for name, (_, field) in cls.leaves().items():
            extra = cli_extra(field)
            if extra.get("cli") is False:
                continue
            for flag in extra.get("flags") or (f"--{name.replace('_', '-')}",):
                meaning.setdefault(flag, set()).add((name, kind(name, field)))
    assert {flag: m for flag, m in meaning.items() if len(m) > 1} == {}
    for name in ("batch", "resolution"):  # the shared annotated types of memplan.options, nothing else
        (where,) = _declarations(name)
        assert where.startswith("memplan/options.py:"), where


def test_profile_keywords_and_the_object_are_one_thing():
    """``profile(m, "bias", mode=..., batch=...)`` is ``profile(m, ProfileOptions(...))``; a keyword
    that is no option is a strategy option (a wrong one is refused by the strategy)."""
    kw = memplan.profile("mcunet-5fps", "bias", mode="applied", batch=2, resolution=32, classes=10)
    opts = ProfileOptions.of(method="bias", mode="applied", batch=2, resolution=32, classes=10)
    assert memplan.profile("mcunet-5fps", opts).totals == kw.totals
    assert kw.totals != memplan.profile("mcunet-5fps", "bias", batch=2, resolution=32, classes=10).totals
    lastk = memplan.profile("mcunet-5fps", "lastk", blocks=2, resolution=32).totals
    assert memplan.profile("mcunet-5fps", "lastk", strategy_options={"blocks": 2}, resolution=32).totals == lastk
    with pytest.raises(MemplanError):
        memplan.profile("mcunet-5fps", "lastk", blokcs=2, resolution=32)


def test_a_target_sets_the_mode_and_says_whether_it_fits():
    """``target``: the device's mode unless ``mode`` is given, and ``extras["device"]``, in the API
    as on the command line."""
    p = memplan.profile("mcunet-5fps", "bias", resolution=64, classes=10, target="stm32f746")
    dev = json.loads((DEVICES_DIR / "stm32f746.json").read_text())  # the datasheet's SRAM less the runtime
    fit = p.extras["device"]
    assert p.mode == "mcu" and fit["budget_bytes"] == dev["sram_bytes"] - dev["runtime_bytes"]
    assert fit["peak_bytes"] == p.totals.peak_bytes and fit["fits"] == (p.totals.peak_bytes <= fit["budget_bytes"])
    q = memplan.profile("mcunet-5fps", "bias", resolution=64, classes=10, target="stm32f746", mode="tinytraining")
    assert q.mode == "tinytraining" and "device" in q.extras
    assert "device" not in memplan.profile("mcunet-5fps", "bias", resolution=64, classes=10).extras


def test_compare_counts_as_profile_does():
    """``compare`` takes the same counting options as ``profile`` (one Costing group)."""
    kw = dict(resolution=32, classes=10, batch=2)
    rows = api.compare("mcunet-5fps", ["bias", ("lastk", {"blocks": 2})], mode="applied", optimizer="adam", **kw)
    for row, (method, extra) in zip(rows, [("bias", {}), ("lastk", {"blocks": 2})], strict=True):
        one = memplan.profile("mcunet-5fps", method, mode="applied", optimizer="adam", **kw, **extra)
        assert row.totals == one.totals


def test_options_objects_are_never_changed():
    opts = ProfileOptions.of(method="bias", batch=2)
    other = opts.replace(batch=4, mode="applied")
    assert (opts.capture.batch, opts.costing.mode) == (2, None)
    assert (other.capture.batch, other.costing.mode, other.method) == (4, "applied", "bias")
    with pytest.raises(ValidationError):
        opts.capture.batch = 3  # frozen


#: every family memplan.names declares -> its registry (a Registry bound to the names, or a table)
def _families() -> dict[str, tuple[tuple[str, ...], object]]:
    from memplan import names
    from memplan.contrib.data import SOURCES
    from memplan.contrib.estimators import ESTIMATORS
    from memplan.contrib.executors import EXECUTORS
    from memplan.costs.peak import SCHEDULES
    from memplan.graph.conv import COMPUTED_SELECT_RULES
    from memplan.modes import MODES
    from memplan.optim import OPTIMIZERS
    from memplan.search.baselines import SIZE_RULES
    from memplan.search.memory import METRICS
    from memplan.search.methods import METHODS
    from memplan.search.objective import OBJECTIVES
    from memplan.search.rules import CHOICE_RULES

    return {
        "MODES": (tuple(names.MODES), MODES),
        "OPTIMIZERS": (tuple(names.OPTIMIZERS), OPTIMIZERS),
        "EXECUTORS": (tuple(names.EXECUTORS), EXECUTORS),
        "ESTIMATORS": (tuple(names.ESTIMATORS), ESTIMATORS),
        "SEARCH_METHODS": (tuple(names.SEARCH_METHODS), METHODS),
        "OBJECTIVES": (tuple(names.OBJECTIVES), OBJECTIVES),
        "METRICS": (tuple(names.METRICS), METRICS),
        "SCHEDULES": (tuple(names.SCHEDULES), SCHEDULES),
        "SELECT_RULES": (tuple(names.SELECT_RULES), COMPUTED_SELECT_RULES),
        "DATA_SOURCES": (tuple(names.DATA_SOURCES), SOURCES),
        "CHOICE_RULES": (tuple(names.CHOICE_RULES), CHOICE_RULES),
        "SIZE_RULES": (tuple(names.SIZE_RULES), SIZE_RULES),
    }


def test_the_names_help_shows_are_the_registries():
    """Help texts name each family from memplan.names (no torch import); each registry holds exactly
    those names, in order, and every registry bound to memplan.names is one of them (a registry
    bound to them refuses any other name at import)."""
    import sys

    from memplan.registry import Registry

    families = _families()
    for family, (declared, registry) in families.items():
        assert declared == tuple(registry), family
    bound = {
        id(v)
        for m in list(sys.modules.values())
        if getattr(m, "__name__", "").startswith("memplan")
        for v in vars(m).values()
        if isinstance(v, Registry) and v.names is not None
    }
    assert bound <= {id(r) for _, r in families.values()}
    with pytest.raises(ValueError, match="not declared"):
        Registry("optimizer", names=("sgd",)).add("sgd-typo", object())


def _option_texts(tree: ast.AST):
    """The string constants of every option's description and every typer help in ``tree`` (a part
    of an f-string that is computed is no constant: a list derived from memplan.names is not one)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        if fn in ("option", "Field"):
            texts = [kw.value for kw in node.keywords if kw.arg == "description"] + node.args[1:2]
        elif fn in ("Option", "Argument"):
            texts = [kw.value for kw in node.keywords if kw.arg == "help"]
        else:
            continue
        yield from (c for t in texts for c in ast.walk(t) if isinstance(c, ast.Constant) and isinstance(c.value, str))


def _listed_by_hand(text: str, families: dict[str, set[str]]) -> dict[str, list[str]]:
    """The families of which ``text`` lists two or more names (``a | b``, ``a, b``, each name
    the first or last word of its piece); examples (``e.g. ...``) are no list of choices."""
    text = re.sub(r"e\.g\.[^);]*", "", text)
    pieces = [re.findall(r"[\w+\-]+", p) for p in re.split(r"\s*[|,]\s*", text)]
    ends = [{p[0], p[-1]} for p in pieces if p]
    found = {f: [e for e in ends if e & fam] for f, fam in families.items()}
    return {f: [sorted(e)[0] for e in hit] for f, hit in found.items() if len(hit) >= 2}


def test_help_texts_take_registered_names_from_their_registry():
    """No option description or command help in memplan/ lists registered names by hand (it writes
    ``choices(OPTIMIZERS)`` from memplan.names, so a new optimizer shows up in every help); the
    rule catches the lists written before (`"sgd | sgd-momentum | adam"`)."""
    from memplan.strategies.base import STRATEGIES

    families = {f: set(declared) for f, (declared, _) in _families().items()}
    families["STRATEGIES"] = set(STRATEGIES)
    assert _listed_by_hand("sgd | sgd-momentum | adam, whose state is counted", families) == {
        "OPTIMIZERS": ["sgd", "sgd-momentum", "adam"]
    }
    assert _listed_by_hand("number of last blocks (lastk, mobiletl); e.g. full,bias", families) == {
        "STRATEGIES": ["lastk", "mobiletl"]
    }
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for const in _option_texts(ast.parse(path.read_text(encoding="utf-8"))):
            if hit := _listed_by_hand(const.value, families):
                found.append(f"{path.relative_to(ROOT)}:{const.lineno} {hit}")
    assert not found, f"registered names listed by hand (use memplan.names' choices / listed): {found}"


def test_defaults_of_registered_families_are_written_once():
    """The optimizer, executor, estimator, selection rule, schedule, metric and modes used where
    nothing names one are constants of memplan.names (each a registered name); no signature
    default, field default or ``or`` fallback in memplan/ writes a registered name of these
    families again (the registries' own registrations and the legacy-momentum table are where the
    names are defined)."""
    from memplan import names
    from memplan.search.objective import DEFAULT_OBJECTIVE, PLAIN_OBJECTIVE

    families = _families()
    registered = {n for declared, _ in families.values() for n in declared}
    defaults = {k: getattr(names, k) for k in dir(names) if k.startswith("DEFAULT_") or k.endswith("_MODE")}
    defaults |= {"DEFAULT_OBJECTIVE": DEFAULT_OBJECTIVE, "PLAIN_OBJECTIVE": PLAIN_OBJECTIVE}
    assert {k for k, v in defaults.items() if v not in registered} == set()
    assert names.DEFAULT_OPTIMIZER in families["OPTIMIZERS"][1] and names.DEFAULT_EXECUTOR in families["EXECUTORS"][1]

    def named(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Constant) and node.value in registered

    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                written = [*node.args.defaults, *node.args.kw_defaults]
            elif isinstance(node, ast.AnnAssign):
                written = [node.value]
            elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
                written = node.values
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("option", "Field"):
                written = node.args[:1]
            else:
                continue
            found += [f"{path.relative_to(ROOT)}:{d.lineno} {d.value!r}" for d in written if named(d)]
    assert not found, f"a default of a registered family written by hand (use memplan.names' constant): {found}"
