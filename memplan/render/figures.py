"""Figures (matplotlib, Agg backend; imported on first use). Nothing here computes a cost; every
figure is written atomically, its format taken from the path's suffix.

* :func:`plot_layer_costs`: the 256KB paper's Figure 11a (cost of updating each conv);
* :func:`plot_contrib`: its Figure 5 (contribution analysis);
* :func:`plot_search`: its Figures 13 and 11b (search curves, the scheme found).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..io import save_figure
from ..units import ratio_label

if TYPE_CHECKING:  # annotations only: drawing needs none of these packages
    from ..contrib.profile import ContribProfile
    from ..modes.tinytraining import ConvUpdateCost
    from ..search.result import SearchResult


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (matplotlib is imported here, on first use)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: str | os.PathLike, **savefig: Any) -> Path:
    try:
        return save_figure(fig, path, **savefig)
    finally:
        plt.close(fig)


def plot_layer_costs(rows: list[ConvUpdateCost], path: str | os.PathLike, title: str = "") -> Path:
    """Figure 11a: activation, weight and total KiB per conv index, written to ``path``."""
    plt = _pyplot()
    x = [r.conv_index for r in rows]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(x, [r.activation_kib for r in rows], marker="o", ms=3, label="activation")
    ax.plot(x, [r.weight_kib for r in rows], marker="s", ms=3, label="weight")
    ax.plot(x, [r.total_kib for r in rows], color="black", lw=1, label="total")
    ax.set_xlabel("conv index (forward order, stem = 0)")
    ax.set_ylabel("memory of updating the layer (KiB)")
    ax.set_title(title or "update cost per layer (tinytraining, analytic)")
    ax.legend()
    fig.tight_layout()
    return _save(plt, fig, path, bbox_inches="tight")


def plot_contrib(profile: ContribProfile, path: str | os.PathLike) -> Path:
    """The 256KB paper's Figure 5 from a contribution profile, written to ``path`` (format from the
    suffix: .png, .pdf, .svg): (a) Δacc of bias-only updates against the number of last convs
    whose biases train; (b) Δacc of updating the weight of each conv (x: conv index) at every
    channel ratio, over the matching bias-only run. Error bars: the standard deviation over seeds."""
    plt = _pyplot()
    fig, (ax_b, ax_w) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [1, 2]})
    ks = sorted(profile.bias)
    ax_b.errorbar(
        ks, [profile.bias[k] for k in ks], yerr=[profile.bias_std[k] for k in ks], marker="o", ms=3, capsize=2
    )
    ax_b.axhline(0, color="grey", lw=0.6)
    ax_b.set(
        xlabel="#last convs whose biases update (k)",
        ylabel="Δacc vs classifier only (points)",
        title="(a) bias-only update",
    )
    index = {layer.name: layer.conv_index for layer in profile.layers}
    ratios = sorted({r for row in profile.weight.values() for r in row})
    for r in ratios:
        names = sorted((n for n in profile.weight if r in profile.weight[n]), key=index.get)
        ax_w.errorbar(
            [index[n] for n in names],
            [profile.weight[n][r] for n in names],
            yerr=[profile.weight_std[n][r] for n in names],
            marker="o",
            ms=3,
            lw=1,
            capsize=1.5,
            label=f"ratio {ratio_label(r)}",
        )
    ax_w.axhline(0, color="grey", lw=0.6)
    ax_w.set(xlabel="conv index (stem = 0)", ylabel="Δacc vs bias-only (points)", title="(b) weight update of one conv")
    ax_w.legend(fontsize=8)
    fig.suptitle(
        f"{profile.model} on {profile.dataset.get('name', '')}: contribution analysis "
        f"(probe {profile.probe_accuracy:.1f}%, seeds {len(profile.protocol.seeds)}, "
        f"noise ±{profile.noise.delta_std:.2f})",
        fontsize=10,
    )
    fig.tight_layout()
    return _save(plt, fig, path, dpi=120)


def plot_search(result: SearchResult, path: str | os.PathLike) -> Path:
    """The 256KB paper's Figure 13 (evolution vs random search: best summed gain per evaluation,
    in the profile's units under the search's objective, exact optimum as a line; when both ran)
    and Figure 11b (which convs update their bias, and which their weight at which channel
    ratio) side by side, written to ``path``."""
    plt = _pyplot()
    curves = _curves(result)
    fig, axes = plt.subplots(1, 2 if curves else 1, figsize=(12 if curves else 7, 4), squeeze=False)
    if curves:
        _figure13(axes[0][0], result)
    _figure11b(axes[0][-1], result)
    fig.tight_layout()
    return _save(plt, fig, path, dpi=120)


def _curves(result: SearchResult) -> list[tuple[str, Any, str]]:
    """(method, result, line style) of every method run that has a best-so-far curve, in the
    registry's order (``memplan.search.methods.Method.curve``)."""
    from ..search.methods import METHODS

    return [(name, run, METHODS[name].curve) for name, run in result.runs.items() if METHODS[name].curve is not None]


def _figure13(ax: Any, result: SearchResult) -> None:
    from ..search.methods import METHODS, reference_method

    for name, trace, style in _curves(result):
        xs = [i + 1 for i, v in enumerate(trace.best_per_evaluation) if v > float("-inf")]
        ys = [v for v in trace.best_per_evaluation if v > float("-inf")]
        ax.plot(xs, ys, style, label=f"{name} search")
    if result.reference is not None and result.additive:
        ax.axhline(result.reference.value, color="black", lw=0.8, ls=":", label=f"{reference_method()} optimum")
    ax.set_xscale("log")
    ax.set_xlabel("evaluations")
    what = "Δacc" if result.summed_delta_acc is not None else f"estimate ({result.units})"
    ax.set_ylabel(f"best summed {what}, objective {result.objective}")
    drawn = " vs ".join(n for n, m in METHODS.items() if m.curve is not None)
    ax.set_title(f"{result.model}, {result.budget_bytes / 1000:g} kB ({result.mode}): {drawn}")
    ax.legend(loc="lower right")


def _figure11b(ax: Any, result: SearchResult) -> None:
    scheme = result.scheme
    n = result.space_size["convs"]
    first = n - scheme.bias_update
    idx = list(range(n))
    ax.bar(idx, [1.0 if i >= first else 0.0 for i in idx], color="#c6dbef", width=0.9, label="bias updated")
    ratio = {w.conv_index: w.ratio for w in scheme.weight_updates}
    ax.bar(idx, [ratio.get(i, 0.0) for i in idx], color="#08519c", width=0.6, label="weight updated (ratio)")
    ax.set_xlim(-0.8, n - 0.2)
    ax.set_ylim(0, 1.15)
    ax.set_xlabel("conv index (stem = 0)")
    ax.set_ylabel("channel ratio of the weight update")
    ax.set_title(
        f"scheme: last {scheme.bias_update} biases, {len(ratio)} weights "
        f"({result.memory_bytes} B of {result.budget_bytes} B)"
    )
    ax.legend(loc="upper left")


def plot_additivity(check: Any, path: str | os.PathLike) -> Path:
    """The 256KB paper's Figure 5(c) from ``memplan.search.additivity.AdditivityCheck``: real test-accuracy
    gain over classifier-only (y) against summed Δacc (x), one point per trained scheme (colour:
    budget; star: the searched optimum), with a least-squares line and the correlations."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.2))
    budgets = sorted({p.budget_bytes for p in check.points})
    cmap = plt.get_cmap("viridis")
    for i, b in enumerate(budgets):
        colour = cmap(i / max(1, len(budgets) - 1))
        for kind, marker, size in (("random", "o", 30), ("searched", "*", 120)):
            pts = [p for p in check.points if p.budget_bytes == b and p.kind == kind]
            if pts:
                ax.scatter(
                    [p.summed for p in pts],
                    [p.gain for p in pts],
                    marker=marker,
                    s=size,
                    color=colour,
                    label=f"{b / 1000:g} kB" if kind == "random" else None,
                    zorder=3,
                )
    xs = [p.summed for p in check.points]
    ys = [p.gain for p in check.points]
    if len(set(xs)) > 1:
        import numpy as np

        slope, icpt = np.polyfit(xs, ys, 1)
        grid = np.linspace(min(xs), max(xs), 2)
        ax.plot(grid, slope * grid + icpt, color="grey", lw=0.8)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel(
        "summed Δacc of the scheme (contribution profile, points)"
        if check.is_delta_acc
        else f"the scheme's profile entries summed ({check.units})"
    )
    ax.set_ylabel("real test-accuracy gain over classifier only (points)")
    title = (
        f"{check.model}: additivity (Fig. 5c)\nPearson {check.pearson:+.2f} "
        f"[{check.pearson_ci[0]:+.2f}, {check.pearson_ci[1]:+.2f}], Spearman {check.spearman:+.2f} "
        f"[{check.spearman_ci[0]:+.2f}, {check.spearman_ci[1]:+.2f}]"
    )
    extra = []
    if check.ceiling is not None:
        extra.append(f"seed-noise ceiling {check.ceiling['ceiling']:.2f}")
    if check.stable is not None:
        stable = check.stable
        extra.append(f"without collapsed schemes Spearman {stable['spearman']:+.2f} (n={stable['schemes']})")
    if extra:
        title += "\n" + "; ".join(extra)
    ax.set_title(title, fontsize=9)
    ax.legend(title="budget (★ searched)", fontsize=8)
    fig.tight_layout()
    return _save(plt, fig, path, dpi=120)


def plot_accuracy_memory(
    rows: list[dict[str, Any]], path: str | os.PathLike, *, title: str, xlabel: str, ylabel: str
) -> Path:
    """The 256KB paper's Figure 9: accuracy (``accuracy_mean`` ± ``accuracy_std``) against memory
    (``memory_bytes``, log axis, kB) per ``method`` (rows of one method joined in memory order)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.8, 4.4))
    styles = ["*-", "o-", "s-", "D", "^", "v-", "x-"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for method, style in zip(methods, styles * 2):
        pts = sorted(
            (r["memory_bytes"] / 1000, r["accuracy_mean"], r.get("accuracy_std", 0.0))
            for r in rows
            if r["method"] == method
        )
        xs, ys, es = zip(*pts)
        ax.errorbar(xs, ys, yerr=es, fmt=style, capsize=2, label=method, ms=10 if "*" in style else 5)
    ax.set_xscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return _save(plt, fig, path, dpi=120)
