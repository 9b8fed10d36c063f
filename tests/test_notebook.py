"""notebooks/quickstart.ipynb runs top to bottom in well under a minute (nbclient, the python3
kernel of this environment) and is committed with its outputs stripped."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "quickstart.ipynb"


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


def test_notebook_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMPLAN_NUM_THREADS", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    t0 = time.perf_counter()
    nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    assert time.perf_counter() - t0 < 60
