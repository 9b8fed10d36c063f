"""Rich and JSON views of the reports: published vs ours (``memplan reproduce``), predicted vs
measured (``memplan verify``) and a searched scheme (``memplan search``). Sizes print
1000-based (kB, MB)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict

from rich.console import Console
from rich.table import Table

from ..modes import get_mode
from ..reproduce import Reproduction
from ..search.exact import relative_gap
from ..search.methods import METHODS, reference_method
from ..search.objective import OBJECTIVES
from ..search.result import SearchResult
from ..units import fmt_bytes, fmt_flops
from ..verify import SETUPS, VerifyReport
from .tables import flash_verdict


def reproduction_json(rows: Sequence[Reproduction]) -> str:
    """``memplan reproduce --json``: one object per figure."""
    return json.dumps([asdict(r) for r in rows], indent=2)


def format_ours(value: float) -> str:
    """memplan's value in the ``reproduce`` table: whole numbers from 1000 on, else 4 significant digits."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def print_reproduction(rows: Sequence[Reproduction], console: Console) -> None:
    """``memplan reproduce``: published vs ours, one row per figure."""
    table = Table(header_style="bold", box=None, pad_edge=False)
    for col in ["figure", "source", "mode", "published", "ours", "error", "status", "note"]:
        table.add_column(
            col,
            justify="right" if col in ("published", "ours", "error") else "left",
            overflow="fold",
            max_width=60 if col == "note" else None,
            no_wrap=col == "figure",
        )
    style = {
        "ok": "green",
        "close": "yellow",
        "differs": "red",
        "not modelled": "dim",
        "in range": "cyan",
        "outside range": "red",
    }
    for r in rows:
        ours = "" if r.ours is None else format_ours(r.ours)
        if r.low is not None:
            ours += f" [{format_ours(r.low)}-{format_ours(r.high)}]"
        err = "" if r.error is None else f"{100 * r.error:+.1f}%"
        table.add_row(
            r.key,
            r.source,
            r.mode,
            f"{r.published:g} {r.unit}",
            ours,
            err,
            f"[{style[r.status]}]{r.status}[/]",
            "" if r.status == "ok" else r.note,
        )
    console.print(table)
    counts = Counter(r.status for r in rows)
    console.print(
        ", ".join(f"{n} {s}" for s, n in counts.items()) + ". ok = within 1% or the printed precision; "
        "close = within 5% (measured figures: 10%); in range = the paper leaves a setting open and "
        "the published value lies in ours over the plausible settings [low-high]. MB = 1e6 B; the "
        "256KB paper's kB = KiB."
    )


def print_verify(report: VerifyReport, console: Console) -> None:
    """Render ``report`` on a rich ``console``: predicted vs measured, pytorch and applied."""
    opts = "".join(f" {k}={v}" for k, v in report.options.items())
    console.print(
        f"[bold]{report.model}[/] · method [bold]{report.method}[/]{opts} · input "
        f"{'x'.join(map(str, report.input_shape))} · {report.device} · {report.optimizer} · "
        f"{report.steps} steps"
    )
    table = Table(show_header=True, header_style="bold")
    table.add_column("")
    for setup in SETUPS:
        table.add_column(f"{setup} predicted", justify="right")
        table.add_column(f"{setup} measured", justify="right")
    runs = (report.pytorch, report.applied)

    def cells(pred_meas: list[tuple[int, int | None]]) -> list[str]:
        return [x for p, m in pred_meas for x in (fmt_bytes(p), "n/a" if m is None else fmt_bytes(m))]

    table.add_row("saved activations", *cells([(r.predicted_saved, r.measured_saved) for r in runs]))
    table.add_row("  exact bytes", *[str(x) for r in runs for x in (r.predicted_saved, r.measured_saved)])
    if all(r.without_recompute is not None for r in runs):
        table.add_row("  without recomputation", *cells([r.without_recompute for r in runs]))
        saving = [(w[0] - r.predicted_saved, w[1] - r.measured_saved) for r in runs if (w := r.without_recompute)]
        table.add_row("  saved by recomputation", *cells(saving))
    if all(r.whole_batch is not None for r in runs):
        table.add_row("  whole batch at once", *cells([r.whole_batch for r in runs]))
        saving = [(w[0] - r.predicted_saved, w[1] - r.measured_saved) for r in runs if (w := r.whole_batch)]
        table.add_row("  saved by micro-batching", *cells(saving))
    table.add_row("step peak", *cells([(r.predicted_peak, r.measured_peak) for r in runs]))
    table.add_row("loss first -> last", *[x for r in runs for x in ("", f"{r.losses[0]:.4f} -> {r.losses[-1]:.4f}")])
    console.print(table)
    console.print(
        f"measured saving of applied over plain PyTorch: {report.saving:.1f}x; "
        f"peak: {report.peak_source} (informational)"
    )
    if report.ok:
        console.print(f"[green]ok[/]: measured saved bytes match the predictions (tolerance {report.tolerance} B)")
        return
    for r in runs:
        if abs(r.saved_error) > report.tolerance:
            console.print(
                f"[red]mismatch[/]: {r.mode}: measured {r.measured_saved} B, predicted "
                f"{r.predicted_saved} B ({r.saved_error:+d} B, tolerance {report.tolerance} B)"
            )
    if report.device.startswith("cuda") and abs(report.pytorch.saved_error) > report.tolerance:
        console.print(
            "note: `pytorch` mode predicts eager PyTorch on the CPU; CUDA kernels may keep other buffers "
            "(measured on an H200: dropout's mask is 1 byte per element there, 4 on the CPU; attention's logsumexp "
            "is padded to 32 positions; autocast keeps the logits once more; docs/concepts/accounting.md)"
        )


def _flops_lines(r: SearchResult) -> tuple[str | None, str | None, str]:
    """(the FLOPs budget, the scheme's backward FLOPs against it; None without a FLOPs budget) and
    what is additive, as printed."""
    add = "additive" if r.additive else "NOT additive"
    if r.flops_budget is None or r.additivity.flops is None:
        return None, None, f"memory is {add}"
    budget = (
        f"FLOPs budget {r.flops_budget:,} FLOPs = {fmt_flops(r.flops_budget)} (2 x MACs; backward of "
        f"conv / linear / matmul per training step) · read as 1000-based from {r.flops_budget_text!r}"
    )
    used = (
        f"backward FLOPs (2 x MACs) {r.backward_flops:,} = {fmt_flops(r.backward_flops)} "
        f"({100 * r.backward_flops / r.flops_budget:.1f}% of the FLOPs budget)"
    )
    additive = (
        f"memory is {'additive' if r.additivity.additive else 'NOT additive'}, backward FLOPs are "
        f"{'additive' if r.additivity.flops.additive else 'NOT additive'}"
    )
    return budget, used, additive


def _summed_text(r: SearchResult) -> str:
    """The scheme's summed profile entries, named by their units (never called Δacc unless they are)."""
    if r.summed_delta_acc is not None:
        return f"summed Δacc (measured means) {r.summed:.4g}"
    return f"summed estimate {r.summed:.4g} ({r.scheme.provenance.estimator}: {r.units})"


def _scheme_text(r: SearchResult, weights: str) -> str:
    """What the scheme trains besides the classifier; "classifier only" and why, when nothing."""
    s = r.scheme
    if s.bias_update or s.weight_updates:
        return f"biases of the last {s.bias_update} convs; weights: {weights}"
    return f"classifier only: {_why_classifier_only(r)}"


def _why_classifier_only(r: SearchResult) -> str:
    """No update fits a budget (memory, or FLOPs), or none that fits gains under the objective."""
    tables = [(r.table, r.budget_bytes, "memory budget", fmt_bytes)]
    if r.flops_table is not None and r.flops_budget is not None:
        tables.append((r.flops_table, r.flops_budget, "FLOPs budget", fmt_flops))
    for table, budget, what, fmt in tables:
        cheapest = min((cost for k, cost in table.base.items() if k > 0), default=None)
        if cheapest is not None and cheapest > budget:
            return (
                f"no update fits the {what} (the cheapest, the last conv's bias, makes {fmt(cheapest)} "
                f"of {fmt(budget)})"
            )
    return OBJECTIVES[r.objective].nothing_gains or f"nothing that fits gains under the {r.objective} objective"


def print_search(result: SearchResult, console: Console) -> None:
    """Render a search result: budget, scheme, memory breakdown, methods compared."""
    r = result
    dev = f" (device {r.device.name})" if r.device else ""
    console.print(
        f"[bold]{r.model}[/] · input {'x'.join(map(str, r.input_shape))} · mode [bold]{r.mode}[/] "
        f"({r.metric}) · budget {r.budget_bytes} B = {fmt_bytes(r.budget_bytes)} "
        f"= {fmt_bytes(r.budget_bytes, binary=True)}{dev} · read as {r.budget_convention}"
    )
    console.print(f"budget convention: {r.mode} mode, {r.metric}: {get_mode(r.mode).description}", markup=False)
    if r.flash and r.flash["flash_fits"] is not None:
        console.print(flash_verdict({**r.flash, "name": r.device.name}))
    for warning in getattr(r, "warnings", ()):
        console.print(f"warning: {warning}", style="yellow", markup=False)
    console.print(
        f"profile {r.profile_path or '(given)'} · hash {r.profile_hash} · space: {r.space_size['convs']} convs, "
        f"{r.space_size['bias_depths']} bias depths, {r.space_size['weight_options']} weight options "
        f"on {r.space_size['weight_layers']} layers"
    )
    budget_line, used_line, additive = _flops_lines(r)
    if budget_line:
        console.print(budget_line)
    console.print(
        f"{additive} in this mode (checked on {r.additivity.checked} candidates against compute())"
        + ("; exact solver certified" if r.additive else "; evolutionary search with compute()")
    )
    s = r.scheme
    weights = (
        ", ".join(
            f"{w.conv_index} {w.layer} @{w.ratio:g}" + (f" channels {list(w.channels)}" if w.channels else "")
            for w in s.weight_updates
        )
        or "none"
    )
    console.print(f"[bold]scheme[/] ({r.method}): {_scheme_text(r, weights)}")
    objective = (  # an objective that reads no standard error gains the means: its sum is the one printed next
        f"objective {r.objective} (summed {r.objective_value:.4g}) · "
        if OBJECTIVES[r.objective].needs_se and r.objective_value is not None
        else f"objective {r.objective} · "
    )
    console.print(
        f"{objective}{_summed_text(r)} · memory {r.memory_bytes} B = "
        f"{fmt_bytes(r.memory_bytes)} ({100 * r.memory_bytes / r.budget_bytes:.1f}% of budget)"
    )
    if used_line:
        console.print(used_line)
    if s.execution is not None and s.execution.recompute:
        segments = " | ".join(" + ".join(seg) for seg in s.execution.recompute)
        flops = int((s.predicted or {}).get("recompute_flops", 0))
        console.print(f"recomputed in the backward ({flops:,} FLOPs): {segments}", markup=False)
    if s.execution is not None and s.execution.micro_batches > 1:
        m = s.execution.micro_batches
        console.print(
            f"gradient accumulation: batch {s.batch} in {m} micro-batches of {s.batch // m} "
            "(activations of one micro-batch)"
        )
    table = Table("component", "bytes", "size")
    for k, v in r.breakdown.items():
        table.add_row(k, str(v), fmt_bytes(v))
    console.print(table)
    _print_methods(r, f"summed {r.objective}", console)


def _print_methods(r: SearchResult, value: str, console: Console) -> None:
    """The methods that ran, in the registry's order (``memplan.search.methods.METHODS``): value,
    gap to the reference method's optimum, and each entry's own cells."""
    best = r.reference if r.additive else None
    runs = Table("method", value, f"gap to {reference_method()}", "evaluations", "seconds")
    for name, run in r.runs.items():
        if METHODS[name].reference:  # the optimum itself
            gap = "0"
        else:
            gap = f"{100 * relative_gap(run.value, best.value):.2f}%" if best is not None else "-"
        runs.add_row(name, f"{run.value:.4g}", gap, *METHODS[name].cells(run))
    if runs.row_count:
        console.print(runs)


def device_fit_line(fit: dict) -> str:
    """One line: whether training fits the device (``accounting.devices.fit``), SRAM then flash, bytes."""
    verdict = "fits" if fit["fits"] else "does NOT fit"
    line = (
        f"{fit['name']}: training peak {fit['peak_bytes']:,} B ({fmt_bytes(fit['peak_bytes'])}) in {fit['mode']} mode "
        f"at batch 1 {verdict} its {fit['budget_bytes']:,} B budget ({fit['budget']}), margin "
        f"{fit['margin_bytes']:,} B"
    )
    if fit.get("flash_fits") is not None:
        flash = "fits" if fit["flash_fits"] else "does NOT fit"
        line += f"; frozen model {fit['flash_needed_bytes']:,} B {flash} its {fit['flash_bytes']:,} B flash"
    return line


def evidence_line(scheme) -> str:
    """One line: how a shipped scheme equal to the one found was validated by training (its
    ``validation``: the choice on validation, then the test seeds, and any rate given up because a
    test seed diverged there: a runner-up with ``diverged_test_seeds``)."""
    v = scheme.validation
    line = f"validated by training: {v.name}, {v.accuracy:.2f}% on {v.data} (seeds {', '.join(map(str, v.seeds))})"
    if v.test is not None:
        t = v.test
        line += (
            f"; test {t.accuracy:.2f} ± {t.ci95:.2f}% (95% CI, seeds {', '.join(map(str, t.seeds))}) on {t.data}, "
            f"{t.where}"
        )
        if t.diverged:
            line += f"; {t.diverged} of {len(t.seeds)} test seeds diverged at the chosen rate (counted in the mean)"
    for r in v.runners_up:
        if r.get("diverged_test_seeds"):
            seeds = ", ".join(map(str, r["diverged_test_seeds"]))
            line += f"; lr {r['lr']:g} ({r['accuracy']:.2f}% on validation) given up: test seed {seeds} diverged there"
    return line
