"""What ``mcu_transfer.py`` reports from its runs: each row's memory and STM32F746 fit, the rows
(mean ± 95% CI over test seeds), Figure 9's claims, the plot and Markdown tables, the contribution
profile document, and the evidence written into the shipped schemes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from mcu_protocol import (
    BIASES_LAST_K,
    MODEL,
    N_CONVS,
    SCHEME_GLOB,
    SEARCHED,
    WEIGHTS_LAST_K,
    collapsed,
    fig9_rows,
    job_id,
    methods,
    select,
)
from mcu_runs import build, trained_elements

from memplan.io import write_text
from memplan.models.int8.updates import Update, backward_config

# ----------------------------------------------------------------------------- memory
STM32F746 = "stm32f746"


def memory(update: Update, optimizer: str) -> dict:
    """The int8 graph's training memory at batch 1, 128 px: ``tinytraining`` (the paper's analytic
    extra memory, with the optimizer's real state) and the ``mcu`` mode's peak SRAM, and whether
    the STM32F746 holds it (SRAM less its runtime; the int8 model in its 1 MiB flash). Bytes."""
    import memplan
    from memplan.accounting.devices import fit, load_device
    from memplan.models.int8 import int8_model

    cfg = backward_config(update, N_CONVS)
    kw = {"method": "sparse", "scheme": cfg, "batch": 1, "classes": 10, "optimizer": optimizer}
    tt = memplan.profile(f"{MODEL}-int8", mode="tinytraining", **kw)
    mcu = memplan.profile(f"{MODEL}-int8", mode="mcu", **kw)
    dev = load_device(STM32F746)
    flash = int8_model(MODEL, 10).flash_bytes()
    return {"tinytraining_bytes": tt.totals.total_bytes, "mcu_peak_bytes": mcu.totals.peak_bytes,
            "sram_fits": fit(mcu, dev)["margin_bytes"] >= 0, "flash_bytes": flash,
            "flash_fits": flash <= dev.flash_bytes}  # fmt: skip


# ----------------------------------------------------------------------------- the profile
PROFILE_MODEL = f"{MODEL}-int8"


def finished_entries(runs: dict[str, dict], p: dict) -> dict | None:
    """The protocol's profile grid cut to what has run on every selection seed: its bias depths, and
    the weight convs whose every ratio and reference ran; None before the classifier, one bias
    depth and one weight conv."""
    q = p["profile"]

    def ran(name: str) -> bool:
        return all(job_id("profile", name, q["lr"], s) in runs for s in p["selection_seeds"])

    ks = [k for k in q["bias_ks"] if ran(f"bias {k}")]
    convs = [i for i in q["weight_convs"]
             if ran(f"bias {N_CONVS - i}") and all(ran(f"weight {i}@{r:g}") for r in q["ratios"])]  # fmt: skip
    if not ran("classifier") or not ks or not convs:
        return None
    return {**q, "bias_ks": ks, "weight_convs": convs}


def profile_document(runs: dict[str, dict], p: dict) -> dict | None:
    """The ``profile`` experiment's runs as a memplan contribution profile (the JSON ``memplan
    search`` reads: Δacc in accuracy points on the validation split, one selection seed), over the
    entries finished so far (:func:`finished_entries`); None before any weight conv has finished."""
    from memplan.api import capture
    from memplan.contrib.options import Protocol
    from memplan.contrib.profile import ContribProfile, Resolution, from_runs
    from memplan.contrib.protocol import grid
    from memplan.graph.conv import conv_table
    from memplan.plan import fingerprint

    q, res = finished_entries(runs, p), p["resolution"]
    if q is None:
        return None
    graph = capture(PROFILE_MODEL, resolution=res, classes=10).graph
    layers = conv_table(graph)
    protocol = Protocol(
        seeds=tuple(p["selection_seeds"]), epochs=p["epochs"], batch_size=p["batch"], lr_classifier=q["lr"],
        lr_bias=q["lr"], lr_weight=q["lr"], optimizer="sgd-qas", probe_epochs=1, probe_lr=q["lr"],
        ratios=tuple(q["ratios"]), bias_ks=tuple(q["bias_ks"]), weight_convs=tuple(q["weight_convs"]),
    )  # fmt: skip
    specs = grid(layers, protocol)
    raw = {}
    for spec in specs:
        name = "classifier" if spec.kind == "classifier" else f"bias {spec.k}" if spec.kind == "bias" else (
            f"weight {spec.conv_index}@{spec.ratio:g}")  # fmt: skip
        rows = [runs.get(job_id("profile", name, q["lr"], s)) for s in protocol.seeds]
        if any(r is None for r in rows):
            return None
        model = build("int8", methods(p)["profile"][name][1], "cpu")
        raw[spec.id] = {**spec.to_dict(), "id": spec.id, "seeds": list(protocol.seeds),
                        "accuracy": [r["acc"] for r in rows], "trainable_params": trained_elements(model),
                        "train_s": sum(r["seconds"] for r in rows), "eval_s": 0.0, "cache_s": 0.0,
                        "cpu_s": sum(r["seconds"] for r in rows)}  # fmt: skip
    entries = from_runs(specs, raw, layers)
    clf = raw["classifier"]["accuracy"][0]
    devices = sorted({runs[job_id("profile", n, q["lr"], s)]["device"] for n in methods(p)["profile"]
                      for s in protocol.seeds if job_id("profile", n, q["lr"], s) in runs})  # fmt: skip
    doc = ContribProfile(
        model=PROFILE_MODEL, fingerprint=fingerprint(graph), input_shape=[3, res, res],
        weights={"source": "the 256KB paper's int8 ImageNet backbone (tiny-training, MIT), memplan/data/int8",
                 "form": "int8 training graph (memplan.models.int8), QAS"},
        dataset={"name": "cifar10", "classes": 10, "train": 10 * p["train_per_class"],
                 "validation": 10 * p["val_per_class"], "resolution": res, "augment": p["augment"],
                 "description": f"CIFAR-10 train split: {p['train_per_class']} train and {p['val_per_class']} "
                 "validation images per class (seeded, disjoint), 128 px, the MCU transform (pixel - 127.5)"},
        protocol=protocol,
        description=(
            f"Contribution analysis of int8 {MODEL} + QAS on CIFAR-10 under benchmarks/mcu_transfer.py's protocol "
            f"(the rows of its Figure 9 train with it): {p['epochs']} epochs ({p['warmup_epochs']} warm-up, then "
            f"cosine), batch {p['batch']}, {p['augment']}, SGD + QAS at lr {q['lr']} for every tensor, seed "
            f"{protocol.seeds[0]}, accuracy on the validation split. No linear probe: every run trains the head "
            f"from its seeded initialisation (probe_epochs is not used; probe_accuracy holds the classifier-only "
            f"run's accuracy). A reduced grid: biases of the last k convs for k in {list(protocol.bias_ks)}, "
            f"weights of convs {list(protocol.weight_convs)} at ratios {list(protocol.ratios)} (magnitude+)"
            + (f", the finished part of the planned convs {p['profile']['weight_convs']}. "
               if list(protocol.weight_convs) != p["profile"]["weight_convs"] else ". ")
            + f"Device: {' + '.join(devices)}."
        ),
        probe_accuracy=clf, layers=layers, resolution=Resolution(runs=res, costing=res), evaluated_on="validation",
        timing={"run_seconds": round(sum(r["train_s"] for r in raw.values()), 1), "runs": len(raw),
                "executor": "benchmarks/mcu_transfer.py"},
        **entries,
    )  # fmt: skip
    return json.loads(doc.model_dump_json())


def record_evidence(runs: dict[str, dict], p: dict) -> list[str]:
    """Write into each shipped searched scheme how its row trained (``training``) and validated
    (``validation``: the rate chosen on the selection seed, the other rates as runners-up, the
    test seeds' accuracy), once its row has every test seed. Returns the files written."""
    from memplan.io import shipped
    from memplan.plan import TestAccuracy, Training, Validation, load_scheme

    rep = report(runs, ["fig9"], p)["experiments"]["fig9"]
    written = []
    for path in sorted(shipped("schemes").glob(SCHEME_GLOB)):
        scheme = load_scheme(path)
        name = f"memplan {scheme.budget_bytes / 1000:g} kB"
        row = rep.get(name)
        if row is None or len(row["test"]) < len(p["test_seeds"]):
            continue
        val = {lr: runs[job_id("fig9", name, lr, p["selection_seeds"][0])]["acc"] for lr in row["grid"]}
        given_up = {a["lr"]: a["diverged_seeds"] for a in row["abandoned"]}  # the divergence rule's
        data = f"CIFAR-10, benchmarks/mcu_transfer.py protocol ({p['epochs']} epochs, {p['augment']})"
        devices = row["device"]
        scheme = scheme.model_copy(
            update={
                "training": Training(
                    optimizer=row["optimizer"], lr=row["lr"], epochs=p["epochs"], batch_size=p["batch"]
                ),
                "validation": Validation(
                    name=name, accuracy=val[row["lr"]], se=0.0, seeds=list(p["selection_seeds"]),
                    data=f"{data}: validation split, {10 * p['val_per_class']} images",
                    runners_up=[{"name": name, "lr": lr, "accuracy": a, "seeds": list(p["selection_seeds"]),
                                 **({"diverged_test_seeds": given_up[lr]} if lr in given_up else {})}
                                for lr, a in val.items() if lr != row["lr"]],
                    test=TestAccuracy(accuracy=row["mean"], ci95=row["ci95"], seeds=list(p["test_seeds"]),
                                      per_seed=row["test"], diverged=row["diverged_seeds"],
                                      data="the CIFAR-10 test split (10,000 images)",
                                      where=f"benchmarks/mcu_transfer.py fig9 row {name!r} ({devices})"),
                ),
            }
        )  # fmt: skip
        scheme.save(path)
        written.append(str(path))
    return written


def write_report(out: Path, rep: dict) -> int:
    """``report.json`` (atomic), ``fig9.png`` (the memory-accuracy plot) and the Markdown tables of
    ``rep``'s experiments on stdout. An experiment ``rep`` leaves out keeps its rows from the
    existing ``report.json`` where that was made under the same protocol."""
    path = out / "report.json"
    kept = {}
    if path.is_file():
        try:
            old = json.loads(path.read_text())
            kept = old["experiments"] if old.get("protocol") == rep["protocol"] else {}
        except (json.JSONDecodeError, KeyError):
            kept = {}
    whole = {**rep, "experiments": {**kept, **rep["experiments"]}}
    write_text(path, json.dumps(whole, indent=1))
    if rep["experiments"].get("fig9"):
        plot(rep["experiments"]["fig9"], out / "fig9.png")
    print(markdown(rep))
    return 0


def plot(rows: dict, path: Path) -> None:
    """Test accuracy (mean, 95% CI) against the ``tinytraining`` memory (log scale, kB), one
    series per kind of update; the STM32F746's budget as a line."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from memplan.accounting.devices import load_device
    from memplan.io import save_figure

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for kind, marker in ((BIASES_LAST_K, "o"), (WEIGHTS_LAST_K, "s"), ("", "*")):
        pts = [(r["memory"]["tinytraining_bytes"] / 1000, r["mean"], r["ci95"], m) for m, r in rows.items()
               if (r["family"] == kind if kind else r["family"] not in (BIASES_LAST_K, WEIGHTS_LAST_K))]  # fmt: skip
        if not pts:
            continue
        pts.sort()
        xs, ys, es, names = zip(*pts)
        es = [0 if math.isnan(e) else e for e in es]
        ax.errorbar(xs, ys, yerr=es, marker=marker, ms=9 if marker == "*" else 5, capsize=3,
                    ls="-" if kind else "none", label=kind or "other")  # fmt: skip
        for x, y, name in zip(xs, ys, names):
            if not kind:
                ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, -10), fontsize=7)
    dev = load_device(STM32F746)
    ax.axvline(dev.budget_for("tinytraining") / 1000, color="grey", ls=":", label="STM32F746 training budget")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("training memory, tinytraining mode (kB, batch 1, 128 px)")
    ax.set_ylabel("CIFAR-10 test accuracy (%)")
    ax.set_title("int8 mcunet-5fps + QAS on CIFAR-10 (256KB paper's setting)", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def markdown(rep: dict) -> str:
    lines = []
    for e, rows in rep["experiments"].items():
        head = "| method | optimizer | tinytraining (B) | mcu peak (B) | STM32F746 | test acc % | seeds | lr | device |"
        lines += [f"### {e}", "", head, "|---|---|---:|---:|---|---:|---:|---:|---|"]
        for m, r in rows.items():
            mem = r["memory"]
            fits = "fits" if mem["sram_fits"] and mem["flash_fits"] else "no (SRAM)" if mem["flash_fits"] else "no"
            acc = f"{r['mean']:.2f} ± {r['ci95']:.2f}" if len(r["test"]) > 1 else f"{r['mean']:.2f} (1 seed)"
            if r["diverged_seeds"]:
                acc += f" ({r['diverged_seeds']} diverged)"
            lines.append(f"| {m} | {r['optimizer']} | {mem['tinytraining_bytes']:,} | {mem['mcu_peak_bytes']:,} | "
                         f"{fits} | {acc} | {len(r['test'])} | {r['lr']:.3g} | {r['device']} |")  # fmt: skip
        given_up = [f"- {m}: lr {a['lr']:.3g} given up (test seed {', '.join(map(str, a['diverged_seeds']))} diverged "
                    f"there; the divergence rule), its test seeds retrained at {r['lr']:.3g}"
                    for m, r in rows.items() for a in r["abandoned"]]  # fmt: skip
        lines += ["", *given_up, *([""] if given_up else [])]
        if e == "fig9":
            lines += claim_lines(claims(rows))
        if e == "table1":
            lines += gap_lines(gaps(rows))
    return "\n".join(lines)


#: Table 1's gap between fp32 and int8 + QAS, and the part of it the int8 forward makes (the same
#: gap for the head alone, trained on each form's frozen features): (name, row above, row below)
GAPS = (
    ("fp32 SGD-M - int8 SGD-M + QAS (last two blocks)", "fp32 SGD-M", "int8 SGD-M + QAS"),
    ("fp32 - int8 forward (classifier only)", "fp32 classifier only (SGD-M)", "int8 classifier only (SGD-M)"),
)


def difference(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Mean of test accuracies ``a`` minus mean of ``b``, in points: (difference, its standard error,
    Welch's degrees of freedom); seeds are not paired across rows."""
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return float(np.mean(a) - np.mean(b)), math.sqrt(va + vb), df


def gaps(rows: dict) -> dict[str, tuple[float, float]]:
    """:data:`GAPS` whose rows have ≥ 2 test seeds each, as (difference, 95% CI half-width) in points,
    and, with both, their difference: the part of the gap that is not the forward's (training the
    int8 graph), its CI from the two standard errors (Welch-Satterthwaite degrees of freedom); then
    each gap again at every other rate both rows have ≥ 2 test seeds at (``--at-rate`` runs)."""
    from scipy import stats

    have = {name: (a, b) for name, a, b in GAPS if all(m in rows and len(rows[m]["test"]) > 1 for m in (a, b))}
    found = {name: difference(rows[a]["test"], rows[b]["test"]) for name, (a, b) in have.items()}
    if len(found) == len(GAPS):
        (d1, se1, df1), (d2, se2, df2) = found.values()
        se = math.hypot(se1, se2)
        found["the rest: training the int8 graph"] = (d1 - d2, se, se**4 / (se1**4 / df1 + se2**4 / df2))
    for name, (a, b) in have.items():
        at_a, at_b = rows[a].get("test_at", {}), rows[b].get("test_at", {})
        for lr in sorted(set(at_a) & set(at_b), key=float):
            if len(at_a[lr]) > 1 and len(at_b[lr]) > 1 and not float(lr) == rows[a]["lr"] == rows[b]["lr"]:
                found[f"{name}, both at lr {lr}"] = difference(at_a[lr], at_b[lr])
    return {name: (d, stats.t.ppf(0.975, df) * se) for name, (d, se, df) in found.items()}


def gap_lines(g: dict[str, tuple[float, float]]) -> list[str]:
    return [*(f"- {name}: {d:+.2f} ± {ci:.2f} points (95% CI)" for name, (d, ci) in g.items()), *([""] if g else [])]


def claim_lines(c: dict) -> list[str]:
    lines = []
    for m, b in c["budgets"].items():
        lines.append(f"- {m}: chosen on validation among it and the hand-made rows within the budget: "
                     f"{b['validated']}; best hand-made row on test: {b['best_baseline']}; beats it with CIs apart: "
                     f"{b['beats_best']}; hand-made rows above it, CIs apart: {b['loses_to'] or 'none'}; against the "
                     f"paper's 100 KB scheme: {b['vs_paper_scheme']}")  # fmt: skip
    for s in c["smaller"].values():
        ratio = "none" if s["row"] is None else f"{s['row']}, its memory / that row's = 1 / {s['ratio']:.2f}"
        lines.append(f"- best last-k row {s['best_last_k']!r}: the memplan row of least memory within 1 point of it "
                     f"(and no more memory): {ratio} "
                     "(the paper: 1 / 4.5 to 1 / 7.5)")  # fmt: skip
    return [*lines, ""]


def apart(a: dict, b: dict) -> bool:
    """Row ``a`` above row ``b`` with their 95% CIs apart."""
    return a["mean"] - a["ci95"] > b["mean"] + b["ci95"]


def claims(rows: dict) -> dict:
    """Figure 9's acceptance claims from its rows (each with its ``family`` and, searched, its
    ``budget_bytes``): per searched row, the row ``memplan search --validate`` would pick on the
    selection seed among it and the hand-made rows within its budget, the best hand-made row within
    the budget on test (the paper's scheme listed too) and whether the searched row beats it / loses
    to one, CIs apart; and the paper's "4.5-7.5x smaller": per last-k family, its best row against
    the least memory of a searched row within 1 point of it and with no more memory (None where
    there is none). Bytes are ``tinytraining`` bytes."""
    mem = {m: r["memory"]["tinytraining_bytes"] for m, r in rows.items()}
    searched = {m: r for m, r in rows.items() if r["family"] == SEARCHED}
    hand = {m: r for m, r in rows.items() if m not in searched}
    paper = rows.get("paper's 100 KB scheme")
    out: dict = {"budgets": {}}
    for m, r in searched.items():
        within = {b: h for b, h in hand.items() if mem[b] <= r["budget_bytes"]}
        best = max(within, key=lambda b: within[b]["mean"]) if within else None
        pool = {m: r, **within}  # what memplan search --validate compares: the searched scheme and the baselines
        out["budgets"][m] = {
            "validated": max(pool, key=lambda c: (pool[c]["val"], -mem[c])),
            "best_baseline": best,
            "beats_best": best is not None and apart(r, within[best]),
            "loses_to": [b for b, h in within.items() if apart(h, r)],
            "vs_paper_scheme": None if paper is None else (
                "above" if apart(r, paper) else "below" if apart(paper, r) else "within the CIs"),
        }  # fmt: skip
    out["smaller"] = {}
    for family in (WEIGHTS_LAST_K, BIASES_LAST_K):
        last_k = {m: r for m, r in rows.items() if r["family"] == family}
        if not last_k:
            continue
        top = max(last_k, key=lambda m: last_k[m]["mean"])
        near = [m for m, r in searched.items() if r["mean"] >= last_k[top]["mean"] - 1 and mem[m] <= mem[top]]
        cheapest = min(near, key=lambda m: mem[m]) if near else None
        out["smaller"][family] = {"best_last_k": top, "row": cheapest,
                                  "ratio": None if cheapest is None else mem[top] / mem[cheapest]}  # fmt: skip
    return out


def mean_ci(values: list[float]) -> tuple[float, float]:
    from scipy import stats

    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return float(v.mean()), float("nan")
    return float(v.mean()), float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))


def report(runs: dict[str, dict], experiments: list[str], p: dict) -> dict:
    out: dict = {"protocol": p, "experiments": {}}
    table, kinds = methods(p), fig9_rows()  # each reads every shipped scheme: once per report
    for e in experiments:
        rows = {}
        for m, (_, update, opt) in table[e].items():
            sel = select(runs, e, m, opt, p)
            best = sel.lr
            if best is None:
                continue
            tests = [runs[job_id(e, m, best, s)] for s in p["test_seeds"] if job_id(e, m, best, s) in runs]
            if not tests:
                continue
            mean, ci = mean_ci([r["acc"] for r in tests])
            devices = sorted({r["device"] for r in tests})
            val = float(np.mean([runs[job_id(e, m, best, s)]["acc"] for s in p["selection_seeds"]]))
            at = {
                lr: [runs[job_id(e, m, lr, s)]["acc"] for s in p["test_seeds"] if job_id(e, m, lr, s) in runs]
                for lr in sorted({r["lr"] for r in runs.values() if r["experiment"] == e and r["method"] == m})
            }
            rows[m] = {"optimizer": opt, "lr": best, "grid": sel.grid, "val": val, "test": [r["acc"] for r in tests],
                       "test_at": {f"{lr:g}": a for lr, a in at.items() if a},
                       "mean": mean, "abandoned": sel.abandoned,
                       "ci95": ci, "diverged_seeds": sum(map(collapsed, tests)),
                       "device": " + ".join(devices), "memory": memory(update, opt)}  # fmt: skip
            if e == "fig9":
                rows[m] |= {"family": kinds[m].family, "budget_bytes": kinds[m].budget_bytes}
        out["experiments"][e] = rows
    return out
