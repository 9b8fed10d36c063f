"""memplan on the transformer corpus (tests/transformers_corpus.py): ViTs, windowed transformers
and hybrids from Hugging Face ``transformers``, built from configs (no download).

Run: ``python benchmarks/transformers_corpus.py`` (the whole corpus, every model x full / bias /
norm / last at its two resolutions, batch 2; a few minutes). For each pair: ``pytorch``-mode saved
bytes against saved_tensors_hooks on a real CPU step, FLOPs against FlopCounterMode (with torch's
SDPA formulas for the CPU flash kernel), and ``memplan.check`` (``--check``) against both. A
capture failure is a failure. Then, per pair, ``memplan.apply_strategy`` on a copy: eval outputs
bit-identical to plain PyTorch's under the same plan, train-mode loss identical, gradients close, and
the ``applied`` mode's prediction == saved_tensors_hooks on the applied model. Results:
``transformers_results/transformers.json`` / ``.md``
(written atomically).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import transformers  # noqa: E402

from memplan.io import write_text  # noqa: E402
from tests import transformers_corpus as tc  # noqa: E402
from tests.test_transformers import STRATEGIES, check_model  # noqa: E402

RESULTS = Path(__file__).with_name("transformers_results")


def main() -> int:
    torch.set_num_threads(1)
    rows = []
    for e in tc.ENTRIES:
        for r in e.resolutions:
            t = time.perf_counter()
            results: list = []
            try:
                problems = check_model(e, r, results=results)
                error = ""
            except Exception as exc:  # a capture failure is a result: a failure
                problems, error = [], f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            bad = {m for m in STRATEGIES if any(f"/{m}:" in p and ": apply: " not in p for p in problems)}
            bad_apply = {m for m in STRATEGIES if any(f"/{m}: apply: " in p for p in problems)}
            rows.append(
                {
                    "model": e.name,
                    "group": e.group,
                    "resolution": r,
                    "error": error,
                    "problems": problems,
                    "exact": [m for m in STRATEGIES if m not in bad and not error],
                    "apply_exact": [m for m in STRATEGIES if m not in bad_apply and not error],
                    "observed_ops": sorted({k for p in results for k in p.observed_ops or {}}),
                    "saved_bytes": {p.method: p.measured_bytes for p in results},
                    "applied_bytes": {p.method: p.applied_measured for p in results},
                    "seconds": round(time.perf_counter() - t, 2),
                }
            )
            print(f"{e.name}@{r}: {error or ('ok' if not problems else problems)}", flush=True)
    pairs = len(rows) * len(STRATEGIES)
    exact = sum(len(r["exact"]) for r in rows)
    apply_exact = sum(len(r["apply_exact"]) for r in rows)
    summary = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "models": len(tc.ENTRIES),
        "pairs": pairs,
        "exact": exact,
        "apply_exact": apply_exact,
        "capture_failures": sum(bool(r["error"]) for r in rows),
    }
    RESULTS.mkdir(exist_ok=True)
    write_text(RESULTS / "transformers.json", json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    lines = [
        f"# transformer corpus: {exact}/{pairs} model x strategy x resolution pairs exact "
        f"(saved bytes, FLOPs, --check), {apply_exact}/{pairs} apply: eval identical / applied exact, "
        f"{summary['capture_failures']} capture failures",
        "",
        f"torch {torch.__version__}, transformers {transformers.__version__}, batch 2",
        "",
        "| model | group | resolution | exact strategies | apply: eval identical / applied exact | seconds |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['model']} | {r['group']} | {r['resolution']} | {', '.join(r['exact']) or r['error'] or '-'} | "
        f"{', '.join(r['apply_exact']) or '-'} | {r['seconds']} |"
        for r in rows
    ]
    write_text(RESULTS / "transformers.md", "\n".join(lines) + "\n")
    print(f"{exact}/{pairs} pairs exact, {apply_exact}/{pairs} apply exact")
    return 0 if exact == apply_exact == pairs else 1


if __name__ == "__main__":
    sys.exit(main())
