"""memplan installed from its wheel (not editable) works outside the repository: the design card's
three uses, with the shipped data (profiles, devices, schemes) read as package data.

The wheel is built offline from a copy of the sources (``pip wheel --no-build-isolation``, the
running environment's setuptools) and installed into a fresh venv; its dependencies (torch,
numpy, ...) come from the running environment through a ``.pth`` line, which adds that
site-packages to ``sys.path`` without running its ``.pth`` files, so the editable memplan there
stays invisible. Every command runs from a directory outside the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from memplan.plan import load_scheme

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # builds and installs a wheel, then three cold memplan runs: minutes on a loaded machine

TRAINING_CODE = """
import memplan, torch
path = memplan.shipped_scheme("mcunet-5fps-100KB")
assert "site-packages" in str(path), path
scheme = memplan.load_scheme(path)
model = memplan.models.zoo.build(scheme.model, 10)
model = memplan.apply_scheme(model, scheme)
opt = memplan.train.make_optimizer(model.parameters(), "sgd", lr=0.01)
loss = torch.nn.functional.cross_entropy(model(torch.randn(2, 3, 128, 128)), torch.tensor([0, 1]))
loss.backward()
opt.step()
print("trained", sum(p.requires_grad for p in model.parameters()), memplan.__file__)
"""


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str], Path]:
    """(venv bin directory, environment, a working directory outside the repository)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "memplan", src / "memplan", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["MEMPLAN_NUM_THREADS"] = "1"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(tmp / "dist"),
            str(src),
        ],
        tmp,
        env,
    )
    wheel = next((tmp / "dist").glob("memplan-*.whl"))
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, env)
    python = venv / "bin" / "python"
    site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, env).stdout.strip()
    )
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_memplan_test_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index", str(wheel)], tmp, env)
    outside = tmp / "work"
    outside.mkdir()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return venv / "bin", env, outside


def test_memplan_comes_from_the_wheel(installed):
    bin_dir, env, cwd = installed
    where = _run([str(bin_dir / "python"), "-c", "import memplan; print(memplan.__file__)"], cwd, env).stdout
    assert where.startswith(str(bin_dir.parent)) and str(ROOT) not in where


def test_profile_mobilenetv2_mobiletl(installed):
    bin_dir, env, cwd = installed
    out = _run([str(bin_dir / "memplan"), "profile", "mobilenetv2", "--method", "mobiletl", "--json", "-"], cwd, env)
    assert '"method": "mobiletl"' in out.stdout


@pytest.mark.parametrize("budget", [["--budget", "100KB"], ["--target", "stm32f746"]])
def test_search_with_the_shipped_profile(installed, budget):
    bin_dir, env, cwd = installed
    out = cwd / f"scheme{len(budget[1])}.json"
    _run([str(bin_dir / "memplan"), "search", *budget, "--out", str(out)], cwd, env)
    scheme = load_scheme(out)
    assert scheme.model == "efficientnet-lite0" and scheme.predicted["memory_bytes"] <= scheme.budget_bytes


def test_shipped_scheme_in_training_code(installed):
    bin_dir, env, cwd = installed
    out = _run([str(bin_dir / "python"), "-c", TRAINING_CODE], cwd, env).stdout
    assert out.startswith("trained") and str(bin_dir.parent) in out
