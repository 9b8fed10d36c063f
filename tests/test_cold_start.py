"""Cold start without timing: what a fresh process imports (``benchmarks/cold_start.py`` measures
the time). Heavy dependencies load only where used, and profiling the zoo's networks never
reaches torch's Python meta kernels, whose first call imports torch._dynamo and sympy."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("pydantic", "scipy", "deap", "matplotlib", "sympy", "torch._dynamo", "typer", "rich")


def loaded_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    return done.stdout.split()


def test_import_memplan_loads_no_heavy_dependency():
    assert loaded_after("import memplan") == []


@pytest.mark.parametrize(
    "model, method",
    [
        ("mcunet-5fps", "full"),
        ("mobilenetv3-small", "mobiletl"),
        ("proxylessnas-mobile", "tinytl-l"),
        ("mobilenetv2", "bias"),
    ],
)
def test_profiling_zoo_networks_skips_torch_meta_references(model, method):
    code = f"import memplan\nmemplan.profile({model!r}, {method!r}, resolution=64)"
    assert not {"torch._dynamo", "sympy"} & set(loaded_after(code))


def torch_loaded_by_cli(*argvs: list[str]) -> bool:
    """Whether running ``memplan ARGS`` for each of ``argvs``, one after the other in one fresh
    process, imports torch (their output and exit codes aside)."""
    probe = (
        "import sys, contextlib, io\nfrom memplan.cli import main\n"
        f"for args in {list(argvs)!r}:\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        try:\n            main(args)\n        except SystemExit:\n            pass\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    return done.stdout.split()[-1] == "True"


def test_help_version_and_usage_errors_import_no_torch():
    """Answered at once (benchmarks/cold_start.py times them against a bare Python start)."""
    quick = [["--help"], ["--version"], ["profile", "--help"], ["search", "--help"], ["contrib", "--help"], ["profile"]]
    assert not torch_loaded_by_cli(*quick)


def test_a_command_that_runs_does_import_torch():
    """The probe above can fail: a real command loads torch."""
    assert torch_loaded_by_cli(["--help"], ["methods"])


def test_mode_help_lists_the_mode_registry():
    """--mode's help names the modes without importing them; the names are the registry's
    (tests/test_options.py checks every family of memplan.names likewise)."""
    from memplan.modes import MODES
    from memplan.names import MODES as MODE_NAMES
    from memplan.profile_options import Costing

    assert MODE_NAMES == tuple(MODES)
    assert " | ".join(MODES) in Costing.model_fields["mode"].description
