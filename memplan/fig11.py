"""Per-conv update costs, the 256KB paper's Figure 11a: for every conv, the activation and weight
memory of updating it (weight at ratio 1 and bias), under the ``tinytraining`` convention.

Activation = the input kept at 8 bits + the 1-bit mask of the output; weight = the 8-bit
updated weight copy + the 32-bit bias (a conv -> BN model's bias is the BN shift,
``memplan.scheme.bias_carrier``). Units: bits, and KiB = bits / 8 / 1024 (the paper's "kB").
"""

from __future__ import annotations

from .io import save_figure

import os
from dataclasses import dataclass

from .graph import LayerGraph
from .modes.tinytraining import KIB_BITS, Bits, layer_bits
from .plan import Plan, Train, grad_flow
from .scheme import bias_carrier, conv_layers


@dataclass(frozen=True)
class ConvUpdateCost:
    """What updating one conv costs (bits)."""

    conv_index: int  # forward order, stem = 0
    layer: str
    input_bits: int  # input kept at 8 bits
    mask_bits: int  # 1-bit mask of the output
    weight_bits: int  # 8-bit copy of the whole weight
    bias_bits: int  # 32-bit bias

    @property
    def activation_kib(self) -> float:
        return (self.input_bits + self.mask_bits) / KIB_BITS

    @property
    def weight_kib(self) -> float:
        return (self.weight_bits + self.bias_bits) / KIB_BITS

    @property
    def total_kib(self) -> float:
        return self.activation_kib + self.weight_kib


def conv_update_costs(graph: LayerGraph) -> list[ConvUpdateCost]:
    """One row per conv (conv index order): the cost of updating its weight (ratio 1) and bias."""
    convs = conv_layers(graph)
    train = {c.name: Train(1.0, "bias" in c.params) for c in convs}
    for c in convs:
        carrier = bias_carrier(graph, c)
        if carrier is not None and carrier is not c:
            train[carrier.name] = Train(0.0, True)
    views = grad_flow(graph, Plan("update-all", train))
    rows = []
    for i, c in enumerate(convs):
        b = layer_bits(views[c.index])
        carrier = bias_carrier(graph, c)
        if carrier is not None and carrier is not c:
            extra = layer_bits(views[carrier.index])
            b = Bits(b.input + extra.input, b.mask + extra.mask, b.weight + extra.weight, b.bias + extra.bias)
        rows.append(ConvUpdateCost(i, c.name, b.input, b.mask, b.weight, b.bias))
    return rows


def plot_layer_costs(rows: list[ConvUpdateCost], path: str | os.PathLike, title: str = "") -> None:
    """Figure 11a: activation, weight and total KiB per conv index, written to ``path`` (PNG, ...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    save_figure(fig, path)
    plt.close(fig)
