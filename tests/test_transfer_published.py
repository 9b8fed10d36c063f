"""The README's real-transfer tables print what the committed transfer reports hold: every row's
memory in both columns, its test mean ± 95% CI and its learning rate. A one-digit edit of either
the page or a report fails here."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Results: real transfer learning"
#: the section's tables in order, each with the report it is drawn from
REPORTS = ["benchmarks/transfer_results/transfer.json", "benchmarks/transfer_results/lite2/transfer.json"]


def tables(text: str) -> list[list[list[str]]]:
    """The Markdown tables of ``text`` with a ``| method |`` header: their body rows, as cells."""
    out: list[list[list[str]]] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("| method |"):
            out.append([])
            inside = True
        elif inside and line.startswith("|") and not line.startswith("|---"):
            out[-1].append([c.strip() for c in line.strip().strip("|").split("|")])
        elif not line.startswith("|"):
            inside = False
    return out


def row_names(cell: str) -> list[str]:
    """The report rows a published name stands for: "**validated 45MB** = **validated 48MB**" is
    two; "(= bias only)" remarks are dropped."""
    plain = re.sub(r"\s*\(=[^)]*\)", "", cell.replace("**", ""))
    return [name.strip() for name in plain.split(" = ")]


def test_the_readme_tables_are_the_committed_reports():
    text = (ROOT / "README.md").read_text().split(SECTION)[1].split("\n## ")[0]
    found = tables(text)
    assert len(found) == len(REPORTS)
    for body, path in zip(found, REPORTS):
        rows = {r["name"]: r for r in json.loads((ROOT / path).read_text())["rows"]}
        assert body, path
        for cells in body:
            applied, tiny, acc, lr = cells[1:5]
            mean, ci = (float(x) for x in re.fullmatch(r"([\d.]+) ± ([\d.]+)", acc).groups())
            for name in row_names(cells[0]):
                r = rows[name]
                assert int(applied.replace(",", "")) == r["memory"]["applied"], cells
                assert int(tiny.replace(",", "")) == r["memory"]["tinytraining"], cells
                assert (mean, ci) == (round(r["accuracy_mean"], 2), round(r["accuracy_ci"], 2)), cells
                assert lr.rstrip("*") == r["lr"] and lr.endswith("*") == r["lr_at_grid_edge"], cells


@pytest.mark.parametrize(
    "cell,names",
    [
        ("**validated 20MB (= bias only)**", ["validated 20MB"]),
        ("**validated 45MB** = **validated 48MB**", ["validated 45MB", "validated 48MB"]),
        ("TinyTL lite-residual + bias = **validated 70MB**", ["TinyTL lite-residual + bias", "validated 70MB"]),
        ("norm + bias, running statistics", ["norm + bias, running statistics"]),
    ],
)
def test_published_names(cell, names):
    assert row_names(cell) == names
