"""The layout enforces the architecture: imports only point down (the import-linter contract in
pyproject.toml), no module of memplan/ grows past 400 lines (data files aside), no function past
60 lines or 8 parameters without a reason written beside it, and there is one public capture."""

from __future__ import annotations

import ast
from pathlib import Path

from importlinter.cli import lint_imports

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_PARAMETERS = 8  # self / cls not counted


def test_import_layers_contract_is_kept(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True) == 0


def test_layers_are_exhaustive_and_the_never_rules_are_contracts():
    """A new module must be placed in a layer; the "never" rules of ARCHITECTURE.md are forbidden contracts."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    contracts = {c["id"]: c for c in config["contracts"]}
    assert contracts["layers"]["exhaustive"] is True and contracts["layers"]["containers"] == ["memplan"]
    forbidden = {k for k, c in contracts.items() if c["type"] == "forbidden"}
    assert {"workflows-no-capture", "modes-no-apply", "strategies-no-costs"} <= forbidden


def test_no_module_is_over_400_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "memplan").rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long


def _has_reason(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A comment on the ``def`` line, or a comment line right above it (and its decorators)."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return "#" in lines[node.lineno - 1] or lines[first - 2].strip().startswith("#")


def test_long_functions_say_why():
    """Functions over 60 lines or 8 parameters carry a one-line reason (``def f(  # reason``)."""
    unexplained = []
    for p in sorted((ROOT / "memplan").rglob("*.py")):
        text = p.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
            n = len([x for x in names if x not in ("self", "cls")]) + bool(a.vararg) + bool(a.kwarg)
            long = node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
            if (long or n > MAX_PARAMETERS) and not _has_reason(lines, node):
                unexplained.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not unexplained


def test_one_public_capture():
    """``memplan.capture`` (the pipeline of ``memplan.api``) is the one public way to capture."""
    import memplan
    import memplan.api
    import memplan.graph

    assert memplan.capture is memplan.api.capture
    for gone in ("capture_model", "trace"):
        assert gone not in memplan.EXPORTS and not hasattr(memplan.api, gone)
    for name in ("capture", "trace", "record"):  # the graph layer's submodules, not functions it re-exports
        assert not callable(getattr(memplan.graph, name, None))
