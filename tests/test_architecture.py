"""The layout enforces the architecture: imports only point down (the import-linter contract in
pyproject.toml) and run in no circle, no module of memplan/ grows past 400 lines (data files
aside), no function is past ruff's complexity / argument / statement limits without a reviewed
exception naming it, and there is one public capture."""

from __future__ import annotations

import ast
import graphlib
import json
import re
import subprocess
import sys
from pathlib import Path

import grimp
from importlinter.cli import lint_imports

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400


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


SIZE_RULES = ("C901", "PLR0913", "PLR0915")  # complexity, arguments, statements (limits: pyproject [tool.ruff.lint])


def _size_violations() -> list[dict]:
    """ruff's size rules over the tree with the reviewed exceptions switched off (JSON records)."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", ",".join(SIZE_RULES), "--output-format", "json",
         "--config", "lint.per-file-ignores = {}", "--exit-zero", "memplan", "benchmarks", "tests"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def _function_at(path: Path, line: int) -> str:
    """The name of the function defined on ``line`` of ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return next(
        n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.lineno == line
    )


def _exceptions() -> dict[str, tuple[set[str], str]]:
    """pyproject's per-file exceptions: file -> (rules, the reason written beside them)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    block = text.split("[tool.ruff.lint.per-file-ignores]", 1)[1].split("\n[", 1)[0]
    out = {}
    for line in block.splitlines():
        if m := re.match(r'^"([^"]+)"\s*=\s*\[([^\]]*)\]\s*#\s*(.+)$', line):
            out[m[1]] = ({r.strip().strip('"') for r in m[2].split(",")}, m[3])
    return out


def test_size_exceptions_name_each_violation_and_none_is_stale():
    """ruff C901 / PLR0913 / PLR0915 (run by ``ruff check``) pass through reviewed per-file
    exceptions only: each function over a limit is named in its file's reason, under the rule it
    breaks, and every exception still excuses something."""
    exceptions = _exceptions()
    assert exceptions, "no per-file exceptions parsed from pyproject.toml"
    used: set[tuple[str, str]] = set()
    unexplained = []
    for v in _size_violations():
        path = Path(v["filename"])
        rel = path.relative_to(ROOT).as_posix()
        name = _function_at(path, v["location"]["row"])
        rules, reason = exceptions.get(rel, (set(), ""))
        if v["code"] not in rules or not re.search(rf"(?<![\w.]){re.escape(name)}\b|\.{re.escape(name)}\b", reason):
            unexplained.append(f"{rel}:{v['location']['row']} {name}: {v['code']} {v['message']}")
        used.add((rel, v["code"]))
    assert not unexplained
    stale = [f"{f} {r}" for f, (rules, _) in exceptions.items() for r in rules if (f, r) not in used]
    assert not stale


def test_no_import_circle():
    """No circle in grimp's import graph (function-level imports included), at any level: inside
    each package, its children (modules, and subpackages taken whole) import each other in one
    direction only. A circle between two modules, or between a subpackage and a module beside it
    (``contrib.data`` -> ``contrib.weights`` -> ``contrib.data``), shows at their common package."""
    graph = grimp.build_graph("memplan", cache_dir=None)
    circles = {}
    for package in sorted(m for m in graph.modules if graph.find_children(m)):
        prefix = package + "."

        def child(module: str, prefix: str = prefix) -> str | None:
            return prefix + module[len(prefix) :].split(".")[0] if module.startswith(prefix) else None

        edges: dict[str, set[str]] = {}
        for a in graph.modules:
            if (ca := child(a)) is not None:
                edges.setdefault(ca, set()).update(
                    cb for b in graph.find_modules_directly_imported_by(a) if (cb := child(b)) not in (None, ca)
                )
        try:
            tuple(graphlib.TopologicalSorter(edges).static_order())
        except graphlib.CycleError as exc:
            circles[package] = exc.args[1]
    assert not circles


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
