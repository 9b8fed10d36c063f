"""Figure 5 of the 256KB paper from a contribution profile: (a) Δacc of bias-only updates
against the number of last convs whose biases train; (b) Δacc of updating the weight of each
conv (x: conv index) at every channel ratio, over the matching bias-only run. Error bars are
the standard deviation over seeds."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import MemplanError
from .profile import ContribProfile
from .protocol import ratio_label


def plot_contrib(profile: ContribProfile, path: str | os.PathLike) -> Path:
    """Draw the figure to ``path`` (format from the suffix: .png, .pdf, .svg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target = Path(path)
    if not target.parent.is_dir():
        raise MemplanError(f"cannot write {target}: directory {target.parent} does not exist")
    fig, (ax_b, ax_w) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [1, 2]})
    ks = sorted(profile.bias)
    ax_b.errorbar(ks, [profile.bias[k] for k in ks], yerr=[profile.bias_std[k] for k in ks],
                  marker="o", ms=3, capsize=2)
    ax_b.axhline(0, color="grey", lw=0.6)
    ax_b.set(xlabel="#last convs whose biases update (k)", ylabel="Δacc vs classifier only (points)",
             title="(a) bias-only update")
    index = {l.name: l.conv_index for l in profile.layers}
    ratios = sorted({r for row in profile.weight.values() for r in row})
    for r in ratios:
        names = sorted((n for n in profile.weight if r in profile.weight[n]), key=index.get)
        ax_w.errorbar([index[n] for n in names], [profile.weight[n][r] for n in names],
                      yerr=[profile.weight_std[n][r] for n in names], marker="o", ms=3, lw=1, capsize=1.5,
                      label=f"ratio {ratio_label(r)}")
    ax_w.axhline(0, color="grey", lw=0.6)
    ax_w.set(xlabel="conv index (stem = 0)", ylabel="Δacc vs bias-only (points)",
             title="(b) weight update of one conv")
    ax_w.legend(fontsize=8)
    fig.suptitle(f"{profile.model} on {profile.dataset.get('name', '')}: contribution analysis "
                 f"(probe {profile.probe_accuracy:.1f}%, seeds {len(profile.protocol.seeds)}, "
                 f"noise ±{profile.noise.delta_std:.2f})", fontsize=10)
    fig.tight_layout()
    fig.savefig(target, dpi=120)
    plt.close(fig)
    return target
