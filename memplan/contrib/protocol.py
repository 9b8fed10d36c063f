"""The run grid of contribution analysis (Lin et al., "On-Device Training Under 256KB Memory",
NeurIPS 2022, Section 2.2 and Figure 5).

Layers are the model's convs in forward order (``memplan.graph.conv_table``: stem = conv
index 0, a conv classifier excluded); L is their number. A conv's *bias* is its own bias or,
in a conv -> BN model, the shift of the BN right after it with the norm in eval mode
(``memplan.graph.bias_carrier``). Every run is a :class:`memplan.plan.Scheme` and trains
through ``memplan.plan.scheme_to_plan``; all runs start from the same linear-probe head.

* ``classifier``: the classifier only (the k = 0 reference);
* ``bias`` k: the biases of the last k convs + the classifier;
  Δacc_b[:k] = acc(bias k) - acc(classifier);
* ``weight`` (i, r): the weight of conv i at channel ratio r (``max(1, int(C_in * r))`` input
  channels, output channels for a depthwise conv, picked by ``select``) + the biases of convs
  i..L-1 + the classifier; Δacc_W(i, r) = acc(weight i, r) - acc(bias L - i). With
  ``weight_reference="all-biases"`` every weight run trains all L biases instead, and its Δacc is
  taken over bias L: the reference a search pairs weight updates with once it buys every bias.

Δacc is paired by seed (same data order) and reported as mean and standard deviation over
seeds, in accuracy points (0..100).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..errors import BadOption
from ..graph import ConvLayer, LayerGraph
from ..optim import LEGACY_MOMENTUM
from ..plan import Plan, Scheme, WeightUpdate, fingerprint, scheme_to_plan
from ..units import ratio_label
from .options import LATER_FIELDS, PAPER_RATIOS, Protocol

__all__ = [
    "LATER_FIELDS",
    "LEGACY_MOMENTUM",
    "PAPER_RATIOS",
    "Protocol",
    "RunKind",
    "RunSpec",
    "grid",
    "run_plan",
    "run_scheme",
    "split_layer",
]

RunKind = Literal["classifier", "bias", "weight"]


@dataclass(frozen=True)
class RunSpec:
    """One grid run: ``k`` = number of last convs whose biases train; weight runs add ``layer`` at ``ratio``."""

    kind: RunKind
    k: int
    layer: str | None = None
    conv_index: int | None = None
    ratio: float | None = None
    seeds: tuple[int, ...] | None = None  # an extra-seed run of adaptive sampling (None: the protocol's seeds)

    @property
    def id(self) -> str:
        if self.kind == "weight":
            base = f"weight:{self.layer}@{ratio_label(self.ratio)}"
        else:
            base = "classifier" if self.kind == "classifier" else f"bias:{self.k}"
        return base if self.seeds is None else base + "".join(f"#seed{s}" for s in self.seeds)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "k": self.k, "layer": self.layer, "conv_index": self.conv_index, "ratio": self.ratio}

    @property
    def reference(self) -> str | None:
        """Id of the run this one's Δacc is measured against."""
        if self.kind == "classifier":
            return None
        return "classifier" if self.kind == "bias" else RunSpec("bias", self.k).id


def weight_layers(layers: list[ConvLayer], protocol: Protocol) -> list[ConvLayer]:
    """The convs with weight runs: ``weight_convs``, else the last ``weight_layers``, else every conv."""
    if protocol.weight_convs is not None:
        if max(protocol.weight_convs) >= len(layers):
            raise BadOption(
                f"weight_convs names conv {max(protocol.weight_convs)}", f"the model has {len(layers)} convs (0..)"
            )
        return [layers[i] for i in protocol.weight_convs]
    return layers if protocol.weight_layers is None else layers[-protocol.weight_layers :]


def grid(layers: list[ConvLayer], protocol: Protocol) -> list[RunSpec]:
    """All runs, ordered by split point (earliest first, the most expensive), then bias before weight."""
    n = len(layers)
    if n == 0:
        raise BadOption("the model has no conv layers to analyse")
    for k in protocol.bias_ks or ():
        if not 1 <= k <= n:
            raise BadOption(f"bias depth k={k} is out of range", f"the model has {n} convs (k = 1..{n})")
    wl = weight_layers(layers, protocol)
    ks = set(range(1, n + 1)) if protocol.bias_ks is None else set(protocol.bias_ks)
    every = protocol.weight_reference == "all-biases"
    ks |= {n} if every and wl else {n - c.conv_index for c in wl}
    runs = [RunSpec("classifier", 0)]
    for k in sorted(ks, reverse=True):
        runs.append(RunSpec("bias", k))
        for layer in wl if every and k == n else [] if every else [layers[n - k]] if layers[n - k] in wl else []:
            runs += [RunSpec("weight", k, layer.name, layer.conv_index, r) for r in protocol.ratios]
    # earliest split first: classifier run last (it is the cheapest)
    return runs[1:] + runs[:1]


def run_scheme(spec: RunSpec, graph: LayerGraph, model: str, protocol: Protocol) -> Scheme:
    """The run as a sparse-update scheme (what trains; norms stay in eval mode)."""
    updates = []
    if spec.kind == "weight":
        updates = [WeightUpdate(layer=spec.layer, conv_index=spec.conv_index, ratio=spec.ratio, select=protocol.select)]
    shape = list(graph.input_shape[1:])
    return Scheme(
        model=model,
        fingerprint=fingerprint(graph),
        input_shape=shape,
        bias_update=spec.k,
        weight_updates=updates,
        mode="contrib",
    )


def run_plan(spec: RunSpec, graph: LayerGraph, model: str, protocol: Protocol) -> Plan:
    return scheme_to_plan(graph, run_scheme(spec, graph, model, protocol), method=f"contrib-{spec.kind}")


def split_layer(spec: RunSpec, layers: list[ConvLayer], graph: LayerGraph) -> str:
    """Name of the first layer whose input depends on trainable parameters: everything before it
    is a frozen prefix whose output can be cached. For a bias or weight run with depth k this is
    conv L - k (its frozen weight is computed in the suffix); for the classifier run, the classifier."""
    if spec.k == 0:
        return graph.classifier.name
    return layers[len(layers) - spec.k].name
