"""The layout enforces the architecture: imports only point down (the import-linter contract in
pyproject.toml), and no module of memplan/ grows past 400 lines (data files aside)."""

from __future__ import annotations

from pathlib import Path

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
