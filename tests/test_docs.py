"""The docs site builds with ``mkdocs build --strict`` (a broken link, a missing page in the nav or
an API name mkdocstrings cannot find fails), and its generated references hold what they should."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_docs_build_strict(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "MEMPLAN_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    for command in ("memplan profile", "memplan search", "memplan contrib measure", "--budget"):
        assert command in cli, f"the command-line reference lacks {command}"
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert "apply_scheme" in api and "load_scheme" in api
    assert ":class:" not in api and ":func:" not in api  # reST roles rendered as code (docs/griffe_rst.py)
    for plot in ("transfer.png", "transfer-lite2.png"):  # the benchmark plots, not dangling links
        assert (site / "img" / plot).stat().st_size > 1000
