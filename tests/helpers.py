"""Shared test helpers: build a real model, its graph, and measure the truth."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch

from memplan.accounting.engine import compute
from memplan.apply import apply_plain
from memplan.graph.capture import capture_graph
from memplan.models import zoo
from memplan.modes import get_mode
from memplan.strategies import make_plan
from memplan.verify.measure import saved_bytes

from .conftest import small_shape  # noqa: F401  (re-exported: tests/test_capture.py imports it from here)

STRATEGIES = [("full", {}), ("last", {}), ("norm", {}), ("bias", {}), ("lastk", {"blocks": 2})]


def real_model(name: str, classes: int = 10, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return zoo.build(name, num_classes=classes)


def predicted_and_measured(model, shape, method, opts, mode="pytorch", classes=10):
    graph = capture_graph(model, shape)
    if method == "lastk" and not graph.blocks:
        opts = {"layers": 3}
    plan = make_plan(graph, method, **opts)
    prof = compute(graph, plan, get_mode(mode))
    apply_plain(model, graph, plan)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=g)
    y = torch.randint(0, classes, (shape[0],), generator=g)
    return prof, saved_bytes(model, x, y)


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (registered in ``sys.modules``: dataclasses resolve
    their module by name); ``benchmarks/`` goes on ``sys.path``, as when the script runs, so a
    benchmark split into modules (``transfer_*.py``) imports its siblings."""
    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    path = folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
