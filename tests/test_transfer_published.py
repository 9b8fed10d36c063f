"""The README's real-transfer tables print what the committed transfer reports hold: every row's
memory in both columns, its test mean ± 95% CI and its learning rate; and the fair protocol's
results table (docs/benchmarks/transfer.md) its verdicts: both means, the paired difference, p,
Holm p and the stage's validation margin; and a row for every finished budget; and where the pages
quote how far each report's validation strays from test. A one-digit edit of either the page or a
report fails here."""

import json
import re
from pathlib import Path

import pytest

from memplan.plan import Validation

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Results: real transfer learning"
#: the section's tables in order, each with the report it is drawn from
REPORTS = [
    "benchmarks/transfer_results/fair/lite0-fashion-mnist/transfer.json",
    "benchmarks/transfer_results/fair/lite0-fashion-mnist-replicate/transfer.json",
    "benchmarks/transfer_results/fair/lite0-fashion-mnist-val1000/transfer.json",
    "benchmarks/transfer_results/fair/lite0-cifar10/transfer.json",
    "benchmarks/transfer_results/fair/lite2-fashion-mnist/transfer.json",
    "benchmarks/transfer_results/fair/lite2-fashion-mnist-val1000-ladder/transfer.json",
]


def cells(line: str) -> list[str]:
    """A Markdown table row's cells, stripped."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(text: str) -> list[list[list[str]]]:
    """The Markdown tables of ``text`` with a ``| method |`` header: their body rows, as cells."""
    out: list[list[list[str]]] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("| method |"):
            out.append([])
            inside = True
        elif inside and line.startswith("|") and not line.startswith("|---"):
            out[-1].append(cells(line))
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
        for row in body:
            applied, tiny, acc, lr = row[1:5]
            mean, ci = (float(x) for x in re.fullmatch(r"([\d.]+) ± ([\d.]+)", acc).groups())
            for name in row_names(row[0]):
                r = rows[name]
                assert int(applied.replace(",", "")) == r["memory"]["applied"], row
                assert int(tiny.replace(",", "")) == r["memory"]["tinytraining"], row
                assert (mean, ci) == (round(r["accuracy_mean"], 2), round(r["accuracy_ci"], 2)), row
                assert lr.rstrip("*") == r["lr"] and lr.endswith("*") == r["lr_at_grid_edge"], row


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


#: the fair-results table's settings (docs/benchmarks/transfer.md) and the report each is drawn from
FAIR = {
    "Lite0, Fashion-MNIST": "benchmarks/transfer_results/fair/lite0-fashion-mnist/transfer.json",
    "Lite0, CIFAR-10": "benchmarks/transfer_results/fair/lite0-cifar10/transfer.json",
    "Lite2, Fashion-MNIST": "benchmarks/transfer_results/fair/lite2-fashion-mnist/transfer.json",
    # its protocol's rule is 'resolved': its verdicts are that rule's, and 'best' is its replay
    "Lite0, Fashion-MNIST (replicate)": "benchmarks/transfer_results/fair/lite0-fashion-mnist-replicate/transfer.json",
    # the replicate's protocol with 1000 validation images per class
    "Lite0, Fashion-MNIST (val1000)": "benchmarks/transfer_results/fair/lite0-fashion-mnist-val1000/transfer.json",
    # the second Lite2 study: 1000 validation images per class and the size rule ladder
    "Lite2, Fashion-MNIST (val1000, ladder)": (
        "benchmarks/transfer_results/fair/lite2-fashion-mnist-val1000-ladder/transfer.json"
    ),
}
ACC = r"([\d.]+) ± ([\d.]+)%"


def printed(value: float, text: str) -> bool:
    """``text`` is ``value`` as printed: to its decimals ("0.042"), or to its significant digits
    in exponent form ("2e-5")."""
    if "e" in text:
        mantissa, exp = text.split("e")
        return abs(value - float(text)) <= 0.5 * 10 ** (int(exp) - len(mantissa.replace(".", "")) + 1)
    return abs(value - float(text)) <= 0.5 * 10 ** -len(text.partition(".")[2]) + 1e-12


def test_the_fair_results_table_is_the_committed_reports():
    """The fair-results table has a row for every finished budget of the committed reports and no
    other; each row's validated scheme's and best baseline's mean ± CI, the paired difference ± CI,
    its p and Holm p, the verdict and the stage's validation margin are as the report holds them."""
    text = (ROOT / "docs" / "benchmarks" / "transfer.md").read_text()
    body = text.split("| setting | budget |")[1].split("\n\n")[0].splitlines()[2:]
    assert body
    shown = {tuple(cells(line)[:2]) for line in body}
    finished = {
        (setting, f"{c['budget_bytes'] // 1_000_000} MB")
        for setting, path in FAIR.items()
        if (ROOT / path).exists()
        for c in json.loads((ROOT / path).read_text())["comparisons"]
    }
    assert shown == finished, f"table lacks {sorted(finished - shown)}, has unfinished {sorted(shown - finished)}"
    for line in body:
        row = cells(line)
        setting, budget, scheme, baseline, paired, verdict, margin = row
        report = json.loads((ROOT / FAIR[setting]).read_text())
        rows = {r["name"]: r for r in report["rows"]}
        name = f"validated {budget.replace(' ', '')}"
        (c,) = [c for c in report["comparisons"] if c["name"] == name]
        m = Validation(**rows[name]["validation"]).margin()
        assert margin == f"{m.points:+.2f} ± {m.se:.2f} over {m.baseline}", line
        check_verdict(line, row[2:6], rows[name], c, rows)


def test_the_replayed_rule_table_is_the_committed_reports():
    """The table of the rules replayed on the fair runs (``resolved`` on the protocols whose rule is
    ``best``, ``best`` on the replicate): a row for every replay finished in the committed reports
    and no other, each as the report's replayed comparison holds it."""
    text = (ROOT / "docs" / "benchmarks" / "transfer.md").read_text()
    body = text.split("| setting | budget | rule | chose |")[1].split("\n\n")[0].splitlines()[2:]
    shown = {tuple(cells(line)[:3]) for line in body}
    finished = {
        (setting, f"{c['budget_bytes'] // 1_000_000} MB", f"`{rule}`")
        for setting, path in FAIR.items()
        if (ROOT / path).exists()
        for rule, replay in json.loads((ROOT / path).read_text()).get("replayed_rules", {}).items()
        for c in replay["comparisons"]
    }
    assert shown == finished, f"table lacks {sorted(finished - shown)}, has unfinished {sorted(shown - finished)}"
    for line in body:
        row = cells(line)
        setting, budget, rule = row[0], row[1], row[2].strip("`")
        report = json.loads((ROOT / FAIR[setting]).read_text())
        rows = {r["name"]: r for r in report["rows"]}
        name = f"validated {budget.replace(' ', '')} [rule {rule}]"
        (c,) = [c for c in report["replayed_rules"][rule]["comparisons"] if c["name"] == name]
        check_verdict(line, row[3:7], rows[name], c, rows)


def check_verdict(line: str, published: list[str], row: dict, c: dict, rows: dict) -> None:
    """A published verdict's cells (the validated scheme, the best baseline, the paired difference,
    the verdict) against the report's row and comparison ``c``."""
    scheme, baseline, paired, verdict = published
    mean, ci = map(float, re.search(ACC, scheme).groups())
    assert (mean, ci) == (round(row["accuracy_mean"], 2), round(row["accuracy_ci"], 2)), line
    if verdict == "the baseline":  # the stage chose the best baseline (the same runs): nothing to compare
        assert row["chosen"] == row.get("same_runs_as") == c["baseline"], line
        assert baseline == "(itself)" and not paired, line
        return
    base = rows[c["baseline"]]
    assert tuple(map(float, re.search(ACC, baseline).groups())) == (
        round(base["accuracy_mean"], 2),
        round(base["accuracy_ci"], 2),
    ), line
    d, dci, p, *holm = re.fullmatch(r"([-+]?[\d.]+) ± ([\d.]+), p = ([\de.-]+)(?:, Holm ([\de.-]+))?", paired).groups()
    assert (float(d), float(dci)) == (round(c["difference"], 2), round(c["ci"], 2)), line
    assert printed(c["p"], p) and (holm[0] is None or printed(c["p_holm"], holm[0])), line
    assert ("beats" in verdict) == c["ci_verdict"].startswith("BEATS"), line
    assert ("ties" in verdict) == c["ci_verdict"].startswith("ties"), line
    assert ("loses" in verdict) == c["ci_verdict"].startswith("LOSES"), line


@pytest.mark.parametrize(
    "value,text,ok",
    [(0.0420, "0.042", True), (0.0425, "0.042", True), (0.0431, "0.042", False), (2.04e-05, "2e-5", True),
     (3.1e-05, "2e-5", False), (0.1684, "0.17", True), (0.000122, "0.0001", True)],
)  # fmt: skip
def test_printed(value, text, ok):
    assert printed(value, text) == ok


#: the studies whose validation_error the pages quote together, in the order they list them
STRAYS = ["Lite0, Fashion-MNIST", "Lite0, Fashion-MNIST (replicate)", "Lite2, Fashion-MNIST", "Lite0, CIFAR-10"]
#: the third Lite0 study (10,000 validation images), quoted on its own
VAL1000 = ["Lite0, Fashion-MNIST (val1000)"]
ALONE = r"on its 10,000\s+validation images, validation errs by an SD of ([\d.]+) points per training\s+and ([\d.]+)"
#: the second Lite2 study (10,000 validation images), quoted on its own
LADDER = ["Lite2, Fashion-MNIST (val1000, ladder)"]


@pytest.mark.parametrize(
    "page,pattern,settings",
    [
        (
            "README.md",
            r"errs by an SD of\s+([\d.]+) points per training on Lite0/Fashion-MNIST, ([\d.]+) on the replicate, "
            r"([\d.]+) on Lite2 and ([\d.]+) on\s+CIFAR-10: about ([\d.]+), ([\d.]+), ([\d.]+) and ([\d.]+) points",
            STRAYS,
        ),
        (
            "docs/benchmarks/transfer.md",
            r"an SD of ([\d.]+) points for one training on Lite0/Fashion-MNIST, ([\d.]+) on the replicate,\s+"
            r"([\d.]+) on Lite2 and ([\d.]+) on CIFAR-10: for the difference of two trainings about ([\d.]+), "
            r"([\d.]+), ([\d.]+) and\s+([\d.]+) points",
            STRAYS,
        ),
        ("README.md", ALONE, VAL1000),
        ("docs/benchmarks/transfer.md", ALONE, VAL1000),
        (
            "README.md",
            r"on the second Lite2 study's 10,000 validation\s+images, validation errs by an SD of ([\d.]+) "
            r"points per training\s+and ([\d.]+)",
            LADDER,
        ),
        (
            "docs/benchmarks/transfer.md",
            r"second Lite2 study's at any of its six, and its validation errs by an SD of ([\d.]+) points per\s+"
            r"training and ([\d.]+)",
            LADDER,
        ),
    ],
)
def test_the_quoted_validation_error_is_the_reports(page, pattern, settings):
    """The SD of validation minus test per training, and for a difference of two, as each report's
    ``validation_error`` holds them (two and one decimals)."""
    found = re.search(pattern, (ROOT / page).read_text())
    assert found, page
    sds, diffs = found.groups()[: len(settings)], found.groups()[len(settings) :]
    assert len(diffs) == len(settings), page
    for setting, sd, diff in zip(settings, sds, diffs):
        strays = json.loads((ROOT / FAIR[setting]).read_text())["validation_error"]
        assert (sd, diff) == (f"{strays['sd']:.2f}", f"{strays['difference_sd']:.1f}"), (page, setting)


#: a second Lite2 bullet quoting a smaller budget's choice against its own, seed by seed
SMALLER = (
    r"\*\*(\d+) MB\*\*(?:(?!\*\*\d+ MB\*\*).)*?The (\d+) MB choice(?:(?!\*\*\d+ MB\*\*).)*?"
    r"paired over the ten seeds ([-+][\d.]+) points, p = ([\de.-]+), from the report"
)


def test_the_quoted_smaller_choices_are_the_reports():
    """Where the README compares a smaller budget's choice with a budget's own seed by seed, the
    difference (to its printed decimals) and p are scipy's paired t test on the report's per-seed
    accuracies; every such quote is found."""
    from scipy import stats

    text = re.sub(r"\s+", " ", (ROOT / "README.md").read_text())
    found = list(re.finditer(SMALLER, text))
    assert len(found) == text.count("from the report's per-seed accuracies") >= 2
    report = json.loads((ROOT / FAIR["Lite2, Fashion-MNIST (val1000, ladder)"]).read_text())
    rows = {r["name"]: r for r in report["rows"]}
    for quote in found:
        budget, smaller, difference, p = quote.groups()
        a, b = rows[f"validated {smaller}MB"], rows[f"validated {budget}MB"]
        assert a["seeds"] == b["seeds"] and len(b["seeds"]) == 10, budget
        d = [x - y for x, y in zip(a["accuracy"], b["accuracy"])]
        assert difference == f"{sum(d) / len(d):+.{len(difference.split('.')[1])}f}", budget
        assert printed(stats.ttest_rel(a["accuracy"], b["accuracy"]).pvalue, p), budget
