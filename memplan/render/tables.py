"""Rich views of profiles (nothing here computes a cost): a profile, its layers, a comparison,
per-conv update costs, the zoo and the methods. Sizes print 1000-based (kB, MB) unless
``binary`` (KiB, MiB)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..costs.records import LayerCost, Profile
from ..modes.tinytraining import ConvUpdateCost
from ..strategies import Strategy, Transform
from ..units import fmt_bytes, fmt_count


def _header(p: Profile) -> str:
    shape = "x".join(map(str, p.input_shape[1:]))
    opts = "".join(f" {k}={v}" for k, v in p.options.items())
    capture = " · captured by an eager run (symbolic tracing failed)" if p.capture == "recorded" else ""
    return (
        f"[bold]{p.model}[/] · method [bold]{p.method}[/]{opts} · mode [bold]{p.mode}[/] · batch {p.batch} · "
        f"input {shape} · {p.classes} classes · optimizer {p.optimizer}{capture}"
    )


def _cost_notes(profiles: Sequence[Profile], console: Console) -> None:
    """Ops costed by observation (no rule) and ops that could not be costed exactly, with counts."""
    observed = _tally(p.observed_ops for p in profiles)
    unknown = _tally(p.unknown_ops for p in profiles)
    if observed:
        console.print(f"observed (no cost rule; replayed on meta tensors, what PyTorch saves): {observed}")
    if unknown:
        console.print(
            f"[yellow]NOT exact: could not be replayed, their saved bytes are counted at the upper bound "
            f"(inputs + outputs): {unknown}[/]"
        )


def flash_verdict(dev: dict[str, Any], binary: bool = False) -> str:
    """Whether the frozen model fits the device's flash (a fit dict of ``accounting.devices.fit``
    or ``flash_fit``); "" for a device without flash."""
    if dev.get("flash_fits") is None:
        return ""
    needed, flash = dev["flash_needed_bytes"], dev["flash_bytes"]
    verdict = "[green]fits[/]" if dev["flash_fits"] else "[red]does not fit[/]"
    return (
        f"frozen model {fmt_bytes(needed, binary)} {verdict} the {fmt_bytes(flash, binary)} flash of {dev['name']}"
        f" (margin {fmt_bytes(flash - needed, binary)})"
    )


def _peak_notes(p: Profile, console: Console, binary: bool = False) -> None:
    """How the peak was simulated (schedule, kernel workspaces) and, with a device, whether it fits."""
    ws = p.workspace or {}
    status = ws.get("status", "not modelled")
    if status == "calibrated":
        text = f"kernel workspaces: calibrated ({ws['source']}, {ws['configs']} kernel configurations)"
    elif status in ("missing", "partial"):
        text = (
            f"[yellow]kernel workspaces: {status} ({ws['missing']} of {ws['configs']} kernel configurations "
            f"uncalibrated on this machine): the peak leaves their temporaries out; run `memplan calibrate "
            f"{p.model}`[/]"
        )
    else:
        text = f"kernel workspaces: not modelled ({ws.get('source', 'this mode runs no PyTorch kernels')})"
    console.print(f"peak schedule: {p.schedule} · {text}")
    dev = p.extras.get("device")
    if dev:
        margin = abs(dev["margin_bytes"])
        verdict = (
            f"[green]fits[/] {dev['name']}: {fmt_bytes(margin, binary)} to spare"
            if dev["fits"]
            else f"[red]does not fit[/] {dev['name']} by {fmt_bytes(margin, binary)}"
        )
        console.print(
            f"{verdict} (peak {fmt_bytes(dev['peak_bytes'], binary)} of {fmt_bytes(dev['budget_bytes'], binary)}"
            f" = {dev['budget']})"
        )
        flash = flash_verdict(dev, binary)
        if flash:
            console.print(flash)


def _tally(dicts: Iterable[dict[str, int]]) -> str:
    total: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            total[k] = max(total.get(k, 0), v)
    return ", ".join(f"{k} x{v}" for k, v in sorted(total.items()))


def print_check(p: Profile, console: Console, binary: bool = False) -> None:
    """The self-check: predicted vs observed saved bytes, and the modules where they differ."""
    c = p.check
    verdict = "[green]agree[/]" if c["predicted"] == c["observed"] and not c["differing"] else "[red]DIFFER[/]"
    console.print(
        f"check (pytorch mode vs a real CPU run at batch {c.get('batch', '?')} under saved_tensors_hooks): predicted "
        f"{fmt_bytes(c['predicted'], binary)} ({c['predicted']:,} B), observed "
        f"{fmt_bytes(c['observed'], binary)} ({c['observed']:,} B): {verdict}"
    )
    if c["differing"]:
        table = Table(header_style="bold", box=None, pad_edge=False)
        for col, justify in [("module", "left"), ("predicted B", "right"), ("observed B", "right")]:
            table.add_column(col, justify=justify)
        for row in c["differing"]:
            table.add_row(row["module"] or "(model forward, loss)", f"{row['predicted']:,}", f"{row['observed']:,}")
        console.print(table)
        for row in c["differing"][:8]:  # what each side saved there: the node and the call
            console.print(f"{row['module'] or '(model forward, loss)'}:", markup=False)
            for item in row.get("predicted_items", []):
                console.print(f"  predicted  {item}", markup=False)
            for item in row.get("observed_items", []):
                console.print(f"  observed   {item}", markup=False)


def method_label(p: Profile) -> str:
    opts = ",".join(f"{k}={v}" for k, v in p.options.items() if not isinstance(v, (dict, list)))
    return f"{p.method}({opts})" if opts else p.method


def print_profile(p: Profile, console: Console, per_layer: bool = False, binary: bool = False) -> None:
    t = p.totals
    b = lambda n: fmt_bytes(n, binary)  # noqa: E731
    console.print(_header(p))
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("memory")
    table.add_column("size", justify="right")
    table.add_column("bytes", justify="right")
    for label, value in [
        ("weights" + (f" (frozen at {p.frozen_bits} bit)" if p.frozen_bits != 32 else ""), t.weight_bytes),
        ("gradients", t.gradient_bytes),
        ("optimizer state", t.optimizer_bytes),
        ("saved activations", t.saved_activation_bytes),
        ("total", t.total_bytes),
        (f"peak ({p.peak_phase} at {p.peak_layer})", t.peak_bytes),
    ]:
        table.add_row(label, b(value), f"{value:,}")
    console.print(table)
    console.print(
        f"params {t.params:,} · trainable {t.trainable_params:,} · MACs {fmt_count(t.macs)} · "
        f"forward {fmt_count(t.forward_flops)}FLOPs (+{fmt_count(t.forward_other_flops)} other) · "
        f"backward {fmt_count(t.backward_flops)}FLOPs (input {fmt_count(t.backward_grad_input_flops)}, "
        f"weight {fmt_count(t.backward_grad_weight_flops)}, bias {fmt_count(t.backward_grad_bias_flops)}; "
        f"+{fmt_count(t.backward_other_flops)} other)"
        + (
            f" · recomputed in the backward {fmt_count(t.recompute_flops)}FLOPs "
            f"(+{fmt_count(t.recompute_other_flops)} other)"
            if t.recompute_flops or t.recompute_other_flops
            else ""
        )
    )
    for key, value in p.extras.items():
        if key != "device":
            console.print(f"{key}: {value}")
    _peak_notes(p, console, binary)
    _cost_notes([p], console)
    console.print(
        "[dim]FLOPs = 2 x MACs of conv/linear/matmul; other = norms, activations, adds, pooling, loss. "
        f"Sizes {'1024-based (KiB/MiB)' if binary else '1000-based (kB/MB)'}.[/]"
    )
    if p.check is not None:
        print_check(p, console, binary)
    if per_layer:
        print_layers(p.layers, console, binary)


def print_layers(layers: Sequence[LayerCost], console: Console, binary: bool = False) -> None:
    table = Table(header_style="bold", box=None, pad_edge=False)
    for col, justify in [
        ("#", "right"),
        ("layer", "left"),
        ("kind", "left"),
        ("output", "left"),
        ("block", "left"),
        ("params", "right"),
        ("trainable", "right"),
        ("grad i/w/b", "left"),
        ("saved act", "right"),
        ("fwd FLOPs", "right"),
        ("bwd FLOPs", "right"),
    ]:
        table.add_column(col, justify=justify)
    for i, layer in enumerate(layers):
        if layer.kind in ("view", "identity", "getitem"):
            continue
        grads = "".join(
            [
                "i" if layer.grad_input else "-",
                ("w" if layer.grad_weight >= 1 else f"w{layer.grad_weight:g}") if layer.grad_weight else "-",
                "b" if layer.grad_bias else "-",
            ]
        )
        table.add_row(
            str(i),
            layer.name,
            layer.kind,
            "x".join(map(str, layer.output_shape)),
            layer.block or "",
            f"{layer.params:,}" if layer.params else "",
            f"{layer.trainable_params:,}" if layer.trainable_params else "",
            grads,
            fmt_bytes(layer.saved_activation_bytes, binary) if layer.saved_activation_bytes else "",
            fmt_count(layer.forward_flops + layer.forward_other_flops),
            fmt_count(layer.backward_flops + layer.backward_other_flops),
        )
    console.print(table)


def print_compare(profiles: Sequence[Profile], console: Console, binary: bool = False) -> None:
    p0 = profiles[0]
    console.print(
        f"[bold]{p0.model}[/] · mode [bold]{p0.mode}[/] · batch {p0.batch} · "
        f"input {'x'.join(map(str, p0.input_shape[1:]))} · {p0.classes} classes · optimizer {p0.optimizer}"
    )
    table = Table(header_style="bold", box=None, pad_edge=False)
    for col in [
        "method",
        "trainable params",
        "saved act",
        "weights",
        "grads+opt",
        "total",
        "peak",
        "fwd FLOPs",
        "bwd FLOPs",
    ]:
        table.add_column(col, justify="left" if col == "method" else "right")
    for p in profiles:
        t = p.totals
        table.add_row(
            method_label(p),
            f"{t.trainable_params:,}",
            fmt_bytes(t.saved_activation_bytes, binary),
            fmt_bytes(t.weight_bytes, binary),
            fmt_bytes(t.gradient_bytes + t.optimizer_bytes, binary),
            fmt_bytes(t.total_bytes, binary),
            fmt_bytes(t.peak_bytes, binary),
            fmt_count(t.forward_flops),
            fmt_count(t.backward_flops),
        )
    console.print(table)
    _cost_notes(profiles, console)
    console.print(
        "[dim]FLOPs = 2 x MACs of conv/linear/matmul only. "
        f"Sizes {'1024-based (KiB/MiB)' if binary else '1000-based (kB/MB)'}.[/]"
    )


def print_conv_update_costs(rows: Sequence[ConvUpdateCost], console: Console) -> None:
    """The 256KB paper's Figure 11a as a table: KiB (bits / 8 / 1024) to update each conv."""
    table = Table(
        header_style="bold",
        box=None,
        pad_edge=False,
        title="cost of updating each conv (tinytraining: 8-bit activations/weights, 32-bit bias, 1-bit masks; KiB)",
    )
    for col in ["conv", "layer", "activation KiB", "weight KiB", "total KiB"]:
        table.add_column(col, justify="left" if col == "layer" else "right")
    for r in rows:
        table.add_row(
            str(r.conv_index), r.layer, f"{r.activation_kib:.2f}", f"{r.weight_kib:.2f}", f"{r.total_kib:.2f}"
        )
    console.print(table)


def print_methods(
    strategies: Iterable[Strategy], console: Console, transforms: Iterable[Transform] = (), flags: Iterable[str] = ()
) -> None:
    """``memplan methods``: each strategy with its options and description, then the architecture
    options every strategy takes. An option the command line names (``flags``: ``blocks`` ->
    ``--blocks``) is shown as that flag, any other as ``-o key=VALUE``; each once."""
    named = set(flags)

    def spell(option: str) -> str:
        return f"--{option.replace('_', '-')}" if option in named else f"-o {option}=VALUE"

    for st in strategies:
        opts = " ".join(spell(o) for o in dict.fromkeys(st.options + st.transform_options))
        console.print(f"[bold]{st.name}[/] {opts}\n    {st.description}", highlight=False)
    for t in transforms:
        opts = " ".join(f"-o {o}=VALUE" for o in t.options)
        console.print(f"[bold]every method[/] {opts}\n    {t.description}", highlight=False)


def print_models(rows: Sequence[dict[str, Any]], console: Console) -> None:
    """``memplan models``: one row per zoo model (``memplan.api.describe_models``)."""
    table = Table(header_style="bold", box=None, pad_edge=False)
    for col in ["name", "input", "classes", "params", "MACs", "blocks", "description"]:
        table.add_column(col, justify="right" if col in ("params", "MACs", "classes", "blocks") else "left")
    for row in rows:
        table.add_row(
            Text(row["name"]),
            "x".join(map(str, row["input_shape"])),
            str(row["classes"]),
            fmt_count(row["params"]),
            fmt_count(row["macs"]),
            str(row["blocks"]),
            Text(row["description"]),  # literal: "memplan[imagenet]" is no rich markup
        )
    console.print(table)
    console.print(
        "[dim]Any other model: package.module:attr or path/to/file.py:attr (nn.Module class, instance or "
        "zero-argument factory).[/]"
    )
