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
