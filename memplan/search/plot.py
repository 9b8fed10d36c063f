"""Figures of a search: the 256KB paper's Figure 13 (evolution vs random search: best summed Δacc
per evaluation, exact optimum as a line) and Figure 11b (which convs update their bias, and which
update their weight, at which channel ratio). matplotlib, Agg backend; nothing is computed here."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .run import SearchResult


def plot_search(result: "SearchResult", path: str | os.PathLike) -> None:
    """Write Figure 13 (if evolution and random ran) and Figure 11b side by side to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [t for t in (result.evolution, result.random) if t is not None]
    fig, axes = plt.subplots(1, 2 if curves else 1, figsize=(12 if curves else 7, 4), squeeze=False)
    if curves:
        _figure13(axes[0][0], result)
    _figure11b(axes[0][-1], result)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _figure13(ax, result: "SearchResult") -> None:
    for trace, style in ((result.evolution, "-"), (result.random, "--")):
        if trace is None:
            continue
        xs = [i + 1 for i, v in enumerate(trace.best_per_evaluation) if v > float("-inf")]
        ys = [v for v in trace.best_per_evaluation if v > float("-inf")]
        ax.plot(xs, ys, style, label=f"{trace.method} search")
    if result.exact is not None and result.additive:
        ax.axhline(result.exact.value, color="black", lw=0.8, ls=":", label="exact optimum")
    ax.set_xscale("log")
    ax.set_xlabel("evaluations")
    ax.set_ylabel("best summed Δacc")
    ax.set_title(f"{result.model}, {result.budget_bytes / 1000:g} kB ({result.mode}): evolution vs random")
    ax.legend(loc="lower right")


def _figure11b(ax, result: "SearchResult") -> None:
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
    ax.set_title(f"scheme: last {scheme.bias_update} biases, {len(ratio)} weights "
                 f"({result.memory_bytes} B of {result.budget_bytes} B)")
    ax.legend(loc="upper left")
