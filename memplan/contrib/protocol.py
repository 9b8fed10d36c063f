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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..errors import BadOption
from ..graph import COMPUTED_SELECT_RULES, ConvLayer, LayerGraph
from ..optim import MOMENTUM, OPTIMIZERS
from ..plan import Plan, Scheme, WeightUpdate, fingerprint, scheme_to_plan
from ..rates import Rates
from ..units import ratio_label

RunKind = Literal["classifier", "bias", "weight"]
#: protocol fields added after checkpoints were written, with the value those checkpoints imply
LATER_FIELDS = {"lr_grid": None, "weight_reference": "depth", "lr_norm": None}
PAPER_RATIOS = (0.125, 0.25, 0.5, 1.0)
#: the ``momentum`` of profiles written before ``optimizer`` -> the optimizer it meant
LEGACY_MOMENTUM = {0.0: "sgd", MOMENTUM: "sgd-momentum"}


class Protocol(BaseModel):
    """Everything that determines the measured numbers (the checkpoint's identity)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seeds: tuple[int, ...] = Field((0, 1), min_length=1, description="one training run per seed (data order)")
    max_seeds: int | None = Field(
        None,
        ge=1,
        description="adaptive sampling: an entry whose |Δacc| is below adaptive_z standard errors gets one more seed "
        "per round (and its reference run too) until it has max_seeds; None: the seeds only",
    )
    adaptive_z: float = Field(2.0, gt=0, description="entries with |mean| < adaptive_z x SE are sampled again")
    epochs: int = Field(4, ge=1, description="epochs of every grid run")
    batch_size: int = Field(32, ge=1)
    lr_classifier: float = Field(0.05, gt=0, description="learning rate of the classifier, in every run")
    lr_bias: float = Field(0.02, gt=0, description="learning rate of biases / norm shifts, in every run")
    lr_weight: float = Field(0.1, gt=0, description="learning rate of the analysed conv weight (weight runs)")
    lr_norm: float | None = Field(None, gt=0, description="learning rate of norm scales; None: lr_bias")
    optimizer: str = Field(
        "sgd",
        description="memplan.optim name of the one optimizer of the linear probe and every run (its state is what "
        "memplan search counts for schemes searched from this profile)",
    )
    probe_epochs: int = Field(20, ge=1, description="epochs of the linear probe that every run starts from")
    probe_lr: float = Field(0.05, gt=0)
    ratios: tuple[float, ...] = Field(PAPER_RATIOS, min_length=1, description="channel ratios of weight runs")
    bias_ks: tuple[int, ...] | None = Field(None, description="bias-run depths k; None = every k in 1..L")
    weight_layers: int | None = Field(None, ge=1, description="weight runs for the last N convs; None = all")
    select: str = Field("magnitude+", description="channel selection rule of sub-channel updates")
    lr_grid: tuple[float, ...] | None = Field(
        None,
        description="choose lr_classifier, lr_bias and lr_weight on validation from these rates before the grid "
        "(memplan.contrib.rates; None: the given rates)",
    )
    weight_reference: Literal["depth", "all-biases"] = Field(
        "depth",
        description="what a weight run (i, r) trains besides its weight: the biases of convs i..L-1 (depth, Δacc over "
        "bias L - i) or all L biases (all-biases, Δacc over bias L)",
    )
    bits: int | None = Field(None, ge=1, le=8, description="feature-cache quantisation bits; None = exact fp32")

    @field_validator("lr_grid")
    @classmethod
    def _lr_grid(cls, v: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if v is not None and (not v or any(not x > 0 for x in v)):
            raise ValueError("lr_grid must be positive learning rates")
        return None if v is None else tuple(sorted(set(v)))

    @field_validator("ratios")
    @classmethod
    def _ratios(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if any(not 0 < r <= 1 for r in v):
            raise ValueError("ratios must lie in (0, 1]")
        return tuple(sorted(set(v)))

    @model_validator(mode="before")
    @classmethod
    def _legacy_momentum(cls, data: Any) -> Any:
        """Profiles written before the optimizer table stored ``momentum`` (0: plain SGD)."""
        if isinstance(data, dict) and "momentum" in data:
            data = dict(data)
            momentum = data.pop("momentum")
            if momentum not in LEGACY_MOMENTUM:
                raise ValueError(f"momentum {momentum} is none of memplan's optimizers")
            data.setdefault("optimizer", LEGACY_MOMENTUM[momentum])
        return data

    @field_validator("optimizer")
    @classmethod
    def _optimizer(cls, v: str) -> str:
        if v not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}")
        return v

    @field_validator("select")
    @classmethod
    def _select(cls, v: str) -> str:
        if v not in COMPUTED_SELECT_RULES:  # importance names channels per layer, which a protocol cannot
            raise ValueError(f"select must be one of {', '.join(COMPUTED_SELECT_RULES)}")
        return v

    def identity(self, exclude: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
        """The JSON form a checkpoint is identified by: fields added later (:data:`LATER_FIELDS`) are
        left out while at their default, so checkpoints written before them resume."""
        data = self.model_dump(mode="json", exclude=set(exclude))
        return {k: v for k, v in data.items() if k not in LATER_FIELDS or v != LATER_FIELDS[k]}

    @property
    def rates(self) -> Rates:
        """The learning rate of each parameter family (:mod:`memplan.rates`)."""
        norm = self.lr_bias if self.lr_norm is None else self.lr_norm
        return Rates(classifier=self.lr_classifier, bias=self.lr_bias, norm=norm, weight=self.lr_weight)

    def at(self, rates: Rates | float, seed: int | None = None) -> Protocol:
        """This protocol at ``rates`` (one rate: every family), and at the one ``seed`` if given."""
        r = Rates.of(rates)
        update: dict[str, Any] = dict(lr_classifier=r.classifier, lr_bias=r.bias, lr_weight=r.weight)
        update["lr_norm"] = None if r.norm == r.bias else r.norm
        if seed is not None:
            update["seeds"] = (seed,)
        return self.model_copy(update=update)


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


def grid(layers: list[ConvLayer], protocol: Protocol) -> list[RunSpec]:
    """All runs, ordered by split point (earliest first, the most expensive), then bias before weight."""
    n = len(layers)
    if n == 0:
        raise BadOption("the model has no conv layers to analyse")
    for k in protocol.bias_ks or ():
        if not 1 <= k <= n:
            raise BadOption(f"bias depth k={k} is out of range", f"the model has {n} convs (k = 1..{n})")
    wl = layers if protocol.weight_layers is None else layers[-protocol.weight_layers :]
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
