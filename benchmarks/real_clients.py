"""memplan on real clients: models built by packages nobody at memplan wrote (tests/corpus.py).

Run: ``python benchmarks/real_clients.py`` (one model per family, a few minutes), ``--all`` for the
whole corpus (about 120 models), ``--models a,b`` / ``--families f,g`` for a selection,
``--no-apply`` to skip the ``apply_strategy`` checks, ``--out DIR``. Models marked heavy (the three
EfficientNet-L2s: minutes and 13 GB each) are listed as skipped unless ``--heavy`` or ``--models``
names them. Needs the corpus packages:
``pip install --no-deps -r requirements-corpus.txt``.

For every model x strategy (full, last, norm, bias, lastk; ``memplan.apply.apply_plain`` sets
``requires_grad`` and norm modes the plain way), at the corpus' small input (batch 2, 32 px):

* saved bytes: ``memplan.profile``'s ``pytorch`` mode against ``memplan.verify.measure.saved_bytes``
  (saved-tensor hooks on one real CPU forward + loss, unique storages, parameters and buffers
  excluded): exact, or off and flagged (the report lists ops without a cost rule as observed /
  unknown), or off and silent;
* FLOPs: forward and backward (grad-input + grad-weight) conv / linear / matmul FLOPs against
  FlopCounterMode (backward with the group-aware ``convolution_backward`` formula);
* ``apply_strategy`` on a copy: eval outputs bit-identical to plain PyTorch's under the same plan, gradients of the
  trainable parameters allclose to plain autograd's, ``applied`` prediction == saved-tensor hooks.

Per library: models captured, capture path (symbolic ``torch.fx`` or recorded eager-on-meta),
exact pairs, worst error, and time: warm ``memplan.profile`` of one strategy (``full``, capture
included) against measuring by running (one real CPU forward + backward under saved-tensor
hooks), both at ``--timing-batch`` x ``--timing-resolution`` (default 8 x 224 px, the size a user
profiles at; the checks run at the small size). Results: a printed table, and
``real_clients_results/real_clients.json`` / ``.md`` (written atomically; a partial JSON is kept
up to date while ``--all`` runs).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # tests/corpus.py holds the corpus and the checks
    sys.path.insert(0, str(ROOT))

import memplan  # noqa: E402
from memplan.apply import apply_plain  # noqa: E402
from memplan.io import write_text  # noqa: E402
from memplan.strategies import make_plan  # noqa: E402
from memplan.verify.measure import model_modules, saved_bytes  # noqa: E402  # noqa: E402
from tests import corpus  # noqa: E402

RESULTS = Path(__file__).with_name("real_clients_results")
PACKAGES = {
    "geffnet": "geffnet",
    "efficientnet_pytorch": "efficientnet_pytorch",
    "efficientnet_lite_pytorch": "efficientnet-lite-pytorch",
    "ofa": "ofa",
    "mcunet": "mcunet",
}
TIMING_METHOD = "full"


@dataclass
class ModelResult:
    family: str
    model: str
    shape: list[int]
    params: int = 0
    capture: str = ""  # symbolic / recorded / "" when capture failed
    capture_error: str = ""
    capture_seconds: float | None = None
    pairs: list[dict] = field(default_factory=list)
    profile_seconds: float | None = None  # warm memplan.profile (full, pytorch) at the timing size
    measure_seconds: float | None = None  # one real forward + backward under saved-tensor hooks
    timing_shape: list[int] = field(default_factory=list)
    timing_error: str = ""
    seconds: float = 0.0  # wall time of everything above for this model
    skipped: str = ""  # why the model was not run (heavy models without --heavy)


def pair_dict(r: corpus.PairResult) -> dict:
    d = asdict(r)
    d.update(
        bytes_exact=r.bytes_exact,
        flagged=r.flagged,
        rel_error=r.rel_error,
        flops_exact=r.flops_exact,
        applied_exact=r.applied_exact,
        ok=r.ok,
    )
    return d


def best_of(fn, n: int) -> float:
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def time_model(base: torch.nn.Module, shape: Sequence[int], repeat: int) -> tuple[float, float]:
    """(warm memplan.profile seconds, real forward + backward seconds) at ``shape``."""
    batch, sample = shape[0], tuple(shape[1:])

    def prof() -> None:
        memplan.profile(base, TIMING_METHOD, mode="pytorch", batch=batch, input_shape=sample)

    prof()  # warm: first-call costs of this model's code paths
    profile_s = best_of(prof, repeat)
    model = copy.deepcopy(base)
    graph = memplan.capture(copy.deepcopy(base), tuple(shape)[1:], batch=shape[0]).graph
    model_modules(model, graph)
    apply_plain(model, graph, make_plan(graph, TIMING_METHOD))
    x, y = corpus.data(tuple(shape))
    measure_s = best_of(lambda: saved_bytes(model, x, y, backward=True), 1)
    return profile_s, measure_s


def run_model(
    entry: corpus.Entry,
    *,
    apply_checks: bool,
    timing_shape: Sequence[int] | None,
    repeat: int,
    timing_max_params: int = 0,
    log=print,
) -> ModelResult:
    start = time.perf_counter()
    res = ModelResult(entry.family, entry.name, list(entry.shape))
    base = entry.build()
    res.params = sum(p.numel() for p in base.parameters())
    t = time.perf_counter()
    try:
        graph = corpus.capture_entry(base, entry.shape)
        res.capture, res.capture_seconds = graph.capture, time.perf_counter() - t
    except Exception as exc:  # a capture failure is a result
        res.capture_error = corpus.one_line(exc)
        res.seconds = time.perf_counter() - start
        log(f"  {entry.id}: capture failed: {res.capture_error}")
        return res
    for method in corpus.STRATEGIES:
        r = corpus.check_pair(base, graph, entry.shape, method, entry.name, apply_checks=apply_checks)
        res.pairs.append(pair_dict(r))
    del graph
    if timing_shape is not None and timing_max_params and res.params > timing_max_params:
        res.timing_error = f"not timed: {res.params / 1e6:.0f}M parameters (--timing-max-params)"
    elif timing_shape is not None:
        shape = (timing_shape[0], entry.shape[1], *timing_shape[1:])
        res.timing_shape = list(shape)
        try:
            res.profile_seconds, res.measure_seconds = time_model(base, shape, repeat)
        except Exception as exc:
            res.timing_error = corpus.one_line(exc)
    res.seconds = time.perf_counter() - start
    log(model_line(res))
    return res


# --------------------------------------------------------------------------- rendering
def _pct(e: float | None) -> str:
    if e is None:
        return "n/a"
    if e == 0:
        return "exact"
    return f"{100 * e:+.2f}%" if abs(e) >= 5e-4 else f"{100 * e:+.4f}%"


def pair_status(p: dict) -> str:
    """What went wrong for a pair, "+"-joined (or ok)."""
    bad = ["error:" + ",".join(p["errors"])] if p["errors"] else []
    if p["predicted_bytes"] is not None and p["measured_bytes"] is not None:
        if not p["bytes_exact"]:
            bad.append("bytes(flagged)" if p["flagged"] else "bytes(silent)")
        if not p["flops_exact"]:
            bad.append("flops")
    if p["eval_identical"] is False:
        bad.append("eval")
    if p["loss_identical"] is False or p["grads_close"] is False:
        bad.append("grads")
    if p["applied_predicted"] is not None and not p["applied_exact"]:
        bad.append("applied")
    if p.get("check_observed") is not None and p["check_observed"] != p["measured_bytes"]:
        bad.append("check")
    return "+".join(bad) or "ok"


def model_line(m: ModelResult) -> str:
    if m.capture_error:
        return f"  {m.family}:{m.model}: capture failed: {m.capture_error}"
    cells = [
        f"{p['method']}={pair_status(p)}" + ("" if p["bytes_exact"] else f"({_pct(p['rel_error'])})") for p in m.pairs
    ]
    timing = ""
    if m.profile_seconds is not None:
        timing = f" profile {m.profile_seconds:.2f}s real {m.measure_seconds:.2f}s"
    return f"  {m.family}:{m.model} [{m.capture} {m.capture_seconds:.1f}s]{timing} ({m.seconds:.0f}s): " + " ".join(
        cells
    )


@dataclass
class FamilySummary:
    family: str
    models: int = 0
    captured: int = 0
    symbolic: int = 0
    recorded: int = 0
    pairs: int = 0
    exact: int = 0
    flagged: int = 0  # not exact, but listed as observed / unknown
    silent: int = 0  # not exact and nothing flagged
    worst: float | None = None
    worst_where: str = ""
    flops_exact: int = 0
    eval_identical: int = 0
    grads_ok: int = 0
    applied_exact: int = 0
    apply_checked: int = 0
    check_agrees: int = 0  # memplan.check's meta observation == the real measurement
    check_run: int = 0
    errors: int = 0
    skipped: int = 0  # heavy models not run
    observed_models: int = 0  # models with at least one op costed by observation
    profile_seconds: float | None = None  # median over the family
    measure_seconds: float | None = None
    ratio: float | None = None  # median of real / profile


def summarise(results: Sequence[ModelResult], family: str) -> FamilySummary:
    s = FamilySummary(family)
    mine = [m for m in results if m.family == family and not m.skipped]
    s.skipped = sum(m.family == family and bool(m.skipped) for m in results)
    s.models = len(mine)
    ratios = []
    for m in mine:
        if m.capture_error:
            continue
        s.captured += 1
        s.symbolic += m.capture == "symbolic"
        s.recorded += m.capture == "recorded"
        s.observed_models += any(p["observed_ops"] for p in m.pairs)
        for p in m.pairs:
            s.pairs += 1
            s.errors += bool(p["errors"])
            if p["predicted_bytes"] is None:
                continue
            if p["bytes_exact"]:
                s.exact += 1
            elif p["flagged"]:
                s.flagged += 1
            else:
                s.silent += 1
            e = p["rel_error"]
            if e is not None and e != 0 and (s.worst is None or abs(e) > abs(s.worst)):
                s.worst, s.worst_where = e, f"{m.model} / {p['method']}"
            s.flops_exact += p["flops_exact"]
            if p.get("check_observed") is not None:
                s.check_run += 1
                s.check_agrees += p["check_observed"] == p["measured_bytes"]
            if p["applied_predicted"] is not None or p["eval_identical"] is not None:
                s.apply_checked += 1
                s.eval_identical += bool(p["eval_identical"])
                s.grads_ok += bool(p["grads_close"]) and bool(p["loss_identical"])
                s.applied_exact += p["applied_exact"]
        if m.profile_seconds and m.measure_seconds:
            ratios.append((m.profile_seconds, m.measure_seconds))
    if ratios:
        s.profile_seconds = statistics.median(r[0] for r in ratios)
        s.measure_seconds = statistics.median(r[1] for r in ratios)
        s.ratio = statistics.median(r[1] / r[0] for r in ratios)
    return s


SUMMARY_COLUMNS = (
    "library",
    "captured",
    "symbolic / recorded",
    "bytes exact",
    "flagged",
    "silent",
    "worst error",
    "FLOPs exact",
    "--check agrees",
    "eval identical",
    "grads ok",
    "applied exact",
    "profile s",
    "real s",
    "real / profile",
)


def summary_cells(s: FamilySummary) -> list[str]:
    def frac(a: int, b: int) -> str:
        return f"{a}/{b}" if b else "n/a"

    worst = "none" if s.worst is None else f"{_pct(s.worst)} ({s.worst_where})"
    captured = frac(s.captured, s.models) + (f" ({s.skipped} heavy skipped)" if s.skipped else "")
    return [
        s.family,
        captured,
        f"{s.symbolic} / {s.recorded}",
        frac(s.exact, s.pairs),
        str(s.flagged),
        str(s.silent),
        worst,
        frac(s.flops_exact, s.pairs),
        frac(s.check_agrees, s.check_run),
        frac(s.eval_identical, s.apply_checked),
        frac(s.grads_ok, s.apply_checked),
        frac(s.applied_exact, s.apply_checked),
        "n/a" if s.profile_seconds is None else f"{s.profile_seconds:.2f}",
        "n/a" if s.measure_seconds is None else f"{s.measure_seconds:.2f}",
        "n/a" if s.ratio is None else f"{s.ratio:.1f}x",
    ]


def problem_rows(results: Sequence[ModelResult]) -> list[list[str]]:
    """Every model x strategy that is not fully ok (and every capture failure)."""
    rows = []
    for m in results:
        if m.skipped:
            rows.append([f"{m.family}:{m.model}", "all", "skipped", m.skipped])
            continue
        if m.capture_error:
            rows.append([f"{m.family}:{m.model}", "all", "capture failed", m.capture_error])
            continue
        for p in m.pairs:
            status = pair_status(p)
            if status == "ok":
                continue
            detail = []
            if p["errors"]:
                detail += [f"{k}: {v}" for k, v in p["errors"].items()]
            if not p["bytes_exact"] and p["predicted_bytes"] is not None:
                detail.append(f"bytes {p['predicted_bytes']} vs {p['measured_bytes']} ({_pct(p['rel_error'])})")
            if p["flagged"]:
                detail.append("observed " + json.dumps(p["observed_ops"]) if p["observed_ops"] else "")
                detail.append("unknown " + json.dumps(p["unknown_ops"]) if p["unknown_ops"] else "")
            if not p["flops_exact"] and p["predicted_fwd_flops"] is not None:
                detail.append(
                    f"fwd {p['predicted_fwd_flops']} vs {p['measured_fwd_flops']}, "
                    f"bwd {p['predicted_bwd_flops']} vs {p['measured_bwd_flops']}"
                )
            if p["eval_identical"] is False:
                detail.append(f"eval max diff {p['eval_max_diff']:.3g}")
            if p["grads_close"] is False or p["loss_identical"] is False:
                detail.append(f"loss identical {p['loss_identical']}; {p['grad_mismatch']}")
            if p["applied_predicted"] is not None and not p["applied_exact"]:
                detail.append(f"applied {p['applied_predicted']} vs {p['applied_measured']}")
            if p.get("check_observed") is not None and p["check_observed"] != p["measured_bytes"]:
                detail.append(
                    f"--check observes {p['check_observed']} vs measured {p['measured_bytes']}: "
                    + ", ".join(p["check_differing"])
                )
            rows.append([f"{m.family}:{m.model}", p["method"], status, "; ".join(d for d in detail if d)])
    return rows


def _text_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths))]
    lines.append("-" * len(lines[0]))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in body]
    return "\n".join(lines)


def _md_table(header: Sequence[str], body: Sequence[Sequence[str]], left: int) -> list[str]:
    esc = [[str(c).replace("|", "\\|") for c in r] for r in body]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i < left else "---:" for i in range(len(header))) + "|",
    ]
    return lines + ["| " + " | ".join(r) + " |" for r in esc]


def timing_text(settings: dict) -> str:
    if not settings["timing_shape"]:
        return "Time: not measured (--no-timing)."
    return (
        "Time: warm `memplan.profile` (full, capture included) vs one real CPU forward + backward under "
        f"saved-tensor hooks, at batch {settings['timing_shape'][0]}, {settings['timing_shape'][-1]} px "
        f"(median per library; models over {settings['timing_max_params'] / 1e6:.0f}M parameters not timed)."
    )


def render_markdown(results: Sequence[ModelResult], summaries: Sequence[FamilySummary], settings: dict) -> str:
    pkgs = ", ".join(f"{k} {v}" for k, v in settings["packages"].items())
    lines = [
        "# memplan on real clients",
        "",
        f"Generated by `python benchmarks/real_clients.py{' --all' if settings['all'] else ''}` "
        f"({settings['torch']}, 1 CPU thread; {pkgs}; total {settings['seconds']:.0f} s). Checks at batch 2, "
        "3x32x32, 10 classes, strategies full / last / norm / bias / lastk (2 blocks, or 3 layers without "
        "blocks). bytes: `pytorch`-mode saved activation bytes vs saved-tensor hooks on a real CPU step "
        "(exact / flagged: off, but the report lists ops costed by observation or unknown / silent: off, "
        "nothing flagged); worst error = (predicted - measured) / measured. FLOPs: forward and backward "
        "conv / linear / matmul vs FlopCounterMode (group-aware). --check agrees: `memplan.check` (the "
        "meta-device self-check of `memplan profile --check`) observes the measured bytes (informational). "
        "eval identical / grads ok / applied exact: "
        "after `apply_strategy`. " + timing_text(settings),
        "",
        "## Per library",
        "",
        *_md_table(SUMMARY_COLUMNS, [summary_cells(s) for s in summaries], 1),
        "",
        "## Not fully ok",
        "",
    ]
    problems = problem_rows(results)
    lines += _md_table(["model", "strategy", "status", "detail"], problems, 4) if problems else ["none"]
    lines += [
        "",
        "## Every model",
        "",
        *_md_table(
            [
                "model",
                "capture",
                "capture s",
                "params (M)",
                "full",
                "last",
                "norm",
                "bias",
                "lastk",
                "profile s",
                "real s",
            ],
            [
                [
                    f"{m.family}:{m.model}",
                    "skipped" if m.skipped else m.capture or "failed",
                    "" if m.capture_seconds is None else f"{m.capture_seconds:.2f}",
                    f"{m.params / 1e6:.2f}" if m.params else "",
                    *(
                        [pair_status(p) + ("" if p["bytes_exact"] else f" ({_pct(p['rel_error'])})") for p in m.pairs]
                        or [m.skipped or m.capture_error, "", "", "", ""]
                    ),
                    "" if m.profile_seconds is None else f"{m.profile_seconds:.2f}",
                    "" if m.measure_seconds is None else f"{m.measure_seconds:.2f}",
                ]
                for m in results
            ],
            2,
        ),
    ]
    return "\n".join(lines) + "\n"


def versions() -> dict[str, str]:
    out = {}
    for fam, dist in PACKAGES.items():
        try:
            out[fam] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[fam] = "not installed"
    return out


def select(args, ap) -> list[corpus.Entry]:
    if args.models:
        try:
            return [corpus.get(n) for n in args.models.split(",")]
        except KeyError as exc:
            ap.error(f"unknown corpus model {exc}; see tests/corpus.py")
    fams = args.families.split(",") if args.families else None
    if fams and set(fams) - set(corpus.FAMILIES):
        ap.error(f"unknown family; choose from {', '.join(corpus.FAMILIES)}")
    if args.all or fams:
        return corpus.entries(fams)
    return list(corpus.ONE_PER_FAMILY)


def save(out: Path, results, settings, final: bool) -> list[FamilySummary]:
    families = list(dict.fromkeys(m.family for m in results))
    summaries = [summarise(results, f) for f in families]
    data = {
        "settings": settings,
        "complete": final,
        "summary": [asdict(s) for s in summaries],
        "models": [asdict(m) for m in results],
        "missing_packages": corpus.MISSING,
    }
    write_text(out / "real_clients.json", json.dumps(data, indent=1, default=str) + "\n")
    if final:
        write_text(out / "real_clients.md", render_markdown(results, summaries, settings))
    return summaries


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="the whole corpus (default: one model per family)")
    ap.add_argument("--families", help="comma-separated families (all their models)")
    ap.add_argument("--models", help="comma-separated model names or family:name ids")
    ap.add_argument(
        "--heavy",
        action="store_true",
        help="also run the models marked heavy (listed as skipped otherwise; named with --models they run)",
    )
    ap.add_argument("--no-apply", action="store_true", help="skip the apply_strategy checks")
    ap.add_argument("--no-timing", action="store_true", help="skip the profile vs real-step timing")
    ap.add_argument("--timing-batch", type=int, default=8)
    ap.add_argument("--timing-resolution", type=int, default=224)
    ap.add_argument(
        "--timing-max-params",
        type=float,
        default=30e6,
        help="time only models with at most this many parameters (0: all)",
    )
    ap.add_argument("--repeat", type=int, default=2, help="memplan.profile timing repeats (best of)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for real_clients.json and .md")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if corpus.MISSING:
        print("corpus packages missing (" + corpus.INSTALL + "):", file=sys.stderr)
        for fam, err in corpus.MISSING.items():
            print(f"  {fam}: {err}", file=sys.stderr)
    todo = select(args, ap)
    args.out.mkdir(parents=True, exist_ok=True)
    timing = None if args.no_timing else (args.timing_batch, args.timing_resolution, args.timing_resolution)
    settings = {
        "torch": f"torch {torch.__version__}",
        "python": platform.python_version(),
        "threads": 1,
        "all": bool(args.all),
        "models": [e.id for e in todo],
        "apply_checks": not args.no_apply,
        "timing_shape": list(timing or ()),
        "timing_method": TIMING_METHOD,
        "timing_max_params": int(args.timing_max_params),
        "repeat": args.repeat,
        "packages": versions(),
        "seconds": 0.0,
    }
    start = time.perf_counter()
    memplan.profile(
        corpus.ONE_PER_FAMILY[-1].build() if corpus.ONE_PER_FAMILY else "mcunet-5fps",
        "full",
        batch=2,
        input_shape=(3, 32, 32),
    )  # cold start (torch's meta-kernel imports), not timed
    results: list[ModelResult] = []
    print(f"{len(todo)} models x {len(corpus.STRATEGIES)} strategies")
    for entry in todo:
        if entry.heavy and not (args.heavy or args.models):
            results.append(ModelResult(entry.family, entry.name, list(entry.shape), skipped=f"heavy: {entry.note}"))
            print(f"  {entry.id}: skipped (heavy; --heavy runs it)")
            continue
        results.append(
            run_model(
                entry,
                apply_checks=not args.no_apply,
                timing_shape=timing,
                repeat=args.repeat,
                timing_max_params=int(args.timing_max_params),
            )
        )
        settings["seconds"] = time.perf_counter() - start
        save(args.out, results, settings, final=False)
        gc.collect()
    settings["seconds"] = time.perf_counter() - start
    summaries = save(args.out, results, settings, final=True)
    print()
    print(_text_table(SUMMARY_COLUMNS, [summary_cells(s) for s in summaries]))
    problems = problem_rows(results)
    print(f"\n{len(problems)} model x strategy rows not fully ok" + (":" if problems else ""))
    for row in problems:
        print("  " + " | ".join(row))
    print(f"\ntotal {settings['seconds']:.0f} s; results in {args.out}/real_clients.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
