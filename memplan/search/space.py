"""The search space of the 256KB paper's Eq. 5 and the map from a candidate to a scheme / plan.

A candidate is ``(k, weights)``: the biases of the last ``k`` convs update (conv indices in
forward order, stem = 0, classifier excluded: ``memplan.graph.conv_table``), and each conv
in that range may also update its weight at one channel ratio r of a ratio set ({1/8, 1/4,
1/2, 1} by default; "0" = bias only). The classifier always trains. Its objective is the
summed contribution ``Δacc_b[:k] + Σ Δacc_W(i, r)`` of a contribution profile (accuracy
points, as the profile gives them); memory comes from ``memplan.search.memory``.

A candidate becomes a :class:`memplan.plan.Scheme` and, through
``memplan.plan.scheme_to_plan``, a plan: the search has no plan rules of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..contrib.profile import DELTA_ACC_UNITS, ContribProfile, is_delta_acc, load_profile
from ..contrib.protocol import LATER_FIELDS, LEGACY_MOMENTUM
from ..errors import BadOption, MemplanError
from ..graph import EXPLICIT_SELECT, SELECT_RULES, ConvLayer, LayerGraph, conv_layers, conv_table, is_pw1
from ..names import DEFAULT_ESTIMATOR, DEFAULT_OPTIMIZER, DEFAULT_SELECT
from ..nn.lean import top_channels
from ..plan import BackwardFlags, Execution, Plan, Scheme, WeightUpdate, fingerprint, scheme_to_plan
from ..units import ratio_label
from .objective import PLAIN_OBJECTIVE, apply_objective
from .options import DEFAULT_RATIOS


class ProfileError(MemplanError):
    """A contribution profile that cannot be used for this model."""


@dataclass(frozen=True)
class Contributions:
    """The search's view of a contribution profile (``memplan.contrib.ContribProfile``):
    ``bias[k]`` = Δacc of updating the last k biases over the classifier alone;
    ``weight[layer][r]`` = Δacc of also updating that conv's weight at ratio r over the bias-only
    run that reaches it. Accuracy points (0..100), means over the profile's seeds."""

    bias: dict[int, float]
    weight: dict[str, dict[float, float]]
    fingerprint: str
    sha256: str  # profile_hash of the profile document (the scheme's provenance.profile_hash)
    source: str
    model: str
    classes: int | None = None
    run_shape: tuple[int, ...] | None = None  # per-sample input shape the profile's runs used
    costing_resolution: int | None = None  # input side the profile's schemes are meant to be costed at
    optimizer: str = DEFAULT_OPTIMIZER  # the optimizer the profile's runs trained with (memplan.optim)
    bias_se: dict[int, float | None] = field(default_factory=dict)  # standard errors, points (None: one seed)
    weight_se: dict[str, dict[float, float | None]] = field(default_factory=dict)
    estimator: str = DEFAULT_ESTIMATOR  # what measured the entries (memplan.contrib.estimators)
    units: str = DELTA_ACC_UNITS  # what an entry is, with its unit
    channel_importance: dict[str, list[float]] = field(default_factory=dict)  # conv -> per input channel
    rates: dict[str, float] = field(default_factory=dict)  # family -> the rate the profile chose (lr_selection)
    epochs: int | None = None  # the protocol's epochs and batch (what the rates were chosen with)
    batch_size: int | None = None

    @property
    def is_delta_acc(self) -> bool:
        """Whether the entries are the grid's Δacc (accuracy points of the profile's protocol)."""
        return is_delta_acc(self.units)


#: fields added to the profile later, left out of the hash while they hold the value older profiles imply
_LATER_FIELDS = {
    "resolution": None,
    "evaluated_on": "test",
    "estimator": "grid",
    "units": DELTA_ACC_UNITS,
    "channel_importance": {},
    "lr_selection": {},
}
#: protocol fields added later (adaptive seeding), left out of the hash while they hold their default
_LATER_PROTOCOL_FIELDS = {"max_seeds": None, "adaptive_z": 2.0, **LATER_FIELDS}


def profile_hash(profile: ContribProfile) -> str:
    """16 hex digits of SHA-256 over the profile's canonical JSON (sorted keys, no spaces); fields
    added later are left out while they hold their implied value, so older hashes stay valid."""
    data = profile.model_dump(mode="json")
    for key, implied in _LATER_FIELDS.items():
        if key in data and data[key] == implied:
            del data[key]
    if data["schema_version"] == 1:  # standard errors a version 1 file derives on load are not part of it
        data.pop("bias_se", None)
        data.pop("weight_se", None)
    protocol = data["protocol"]
    for key, implied in _LATER_PROTOCOL_FIELDS.items():
        if key in protocol and protocol[key] == implied:
            del protocol[key]
    legacy = {v: k for k, v in LEGACY_MOMENTUM.items()}
    if protocol.get("optimizer") in legacy:  # hashed in the form older profiles stored it: their momentum
        protocol["momentum"] = legacy[protocol.pop("optimizer")]
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def contributions_of(profile: ContribProfile, source: str = "contribution profile") -> Contributions:
    classes = profile.dataset.get("classes")
    return Contributions(
        dict(profile.bias),
        {k: dict(v) for k, v in profile.weight.items()},
        profile.fingerprint,
        profile_hash(profile),
        source,
        profile.model,
        classes if isinstance(classes, int) else None,
        tuple(profile.input_shape),
        profile.resolution.costing if profile.resolution is not None else None,
        profile.protocol.optimizer,
        dict(profile.bias_se),
        {k: dict(v) for k, v in profile.weight_se.items()},
        profile.estimator,
        profile.units,
        {k: list(v) for k, v in profile.channel_importance.items()},
        {family: v["lr"] for family, v in profile.lr_selection.items()},
        profile.protocol.epochs,
        profile.protocol.batch_size,
    )


def load_contributions(path: str | os.PathLike) -> Contributions:
    """Read a contribution profile JSON file (``memplan.contrib.load_profile``)."""
    return contributions_of(load_profile(path), f"contribution profile {path}")


@dataclass(frozen=True)
class Candidate:
    """``k`` last biases + weight updates ``(conv_index, ratio)``, ascending conv index."""

    k: int
    weights: tuple[tuple[int, float], ...] = ()

    def describe(self) -> str:
        ws = ", ".join(f"{i}@{ratio_label(r)}" for i, r in self.weights)
        return f"k={self.k}" + (f" weights [{ws}]" if ws else "")


@dataclass(frozen=True)
class LayerChoice:
    """The weight options of one conv: its allowed ratios (ascending) and their Δacc."""

    conv: ConvLayer
    ratios: tuple[float, ...]
    gains: tuple[float, ...]

    @property
    def conv_index(self) -> int:
        return self.conv.conv_index


@dataclass
class SearchSpace:
    """Allowed bias depths ``ks`` (ascending, 0 first) and weight options ``layers`` (ascending
    conv index) of one traced model under one contribution profile."""

    graph: LayerGraph
    model: str
    convs: list[ConvLayer]
    ks: tuple[int, ...]
    bias_gain: dict[int, float]
    layers: tuple[LayerChoice, ...]
    ratio_set: tuple[float, ...]
    pw1_only: bool = False
    max_weight_layers: int | None = None
    contributions: Contributions | None = field(default=None, repr=False)
    fingerprint: str = ""  # memplan.plan.fingerprint of the graph
    objective: str = PLAIN_OBJECTIVE  # what the gains are (memplan.search.objective)
    select: str = DEFAULT_SELECT  # channel selection rule of the weight updates (SELECT_RULES)
    recompute: tuple[tuple[str, ...], ...] = ()  # segments every candidate recomputes (Scheme.execution)
    micro_batches: int = 1  # every candidate's micro-batches; the graph is then one micro-batch's (Scheme.execution)

    def __post_init__(self) -> None:
        self.fingerprint = self.fingerprint or fingerprint(self.graph)

    @property
    def n_convs(self) -> int:
        return len(self.convs)

    def first(self, k: int) -> int:
        """Conv index of the first conv whose bias updates at depth k."""
        return self.n_convs - k

    def min_k(self, conv_index: int) -> int:
        """Smallest allowed depth whose range covers ``conv_index``."""
        need = self.n_convs - conv_index
        return min(k for k in self.ks if k >= need)

    def value(self, cand: Candidate) -> float:
        """Summed Δacc of ``cand`` (profile units)."""
        by_index = {c.conv_index: c for c in self.layers}
        total = self.bias_gain[cand.k]
        for i, r in cand.weights:
            c = by_index[i]
            total += c.gains[c.ratios.index(r)]
        return total

    def summed(self, cand: Candidate) -> float:
        """The profile's entries of ``cand`` summed (means; Δacc points for a grid profile, else the
        estimator's units: ``contributions.units``), whatever the objective."""
        c = self.contributions
        if c is None:
            return self.value(cand)
        total = c.bias[cand.k] if cand.k else 0.0
        for i, r in cand.weights:
            row = c.weight[self.convs[i].name]
            total += next(g for q, g in row.items() if abs(q - r) < 1e-12)
        return total

    def check(self, cand: Candidate) -> None:
        """Raise ValueError unless ``cand`` lies in the space."""
        if cand.k not in self.bias_gain:
            raise ValueError(f"bias depth {cand.k} is not in the space")
        by_index = {c.conv_index: c for c in self.layers}
        for i, r in cand.weights:
            if i not in by_index or r not in by_index[i].ratios or i < self.first(cand.k):
                raise ValueError(f"weight update {i}@{r} is not allowed at k={cand.k}")
        if self.max_weight_layers is not None and len(cand.weights) > self.max_weight_layers:
            raise ValueError(f"{len(cand.weights)} weight updates exceed the cap {self.max_weight_layers}")

    def to_scheme(self, cand: Candidate, **fields: Any) -> Scheme:
        """The candidate as a scheme (``fields`` fill mode, budget, predicted, provenance ...)."""
        updates = [self.weight_update(i, r) for i, r in cand.weights]
        base = dict(
            model=self.model,
            fingerprint=self.fingerprint,
            input_shape=list(self.graph.input_shape[1:]),
            batch=self.graph.batch * self.micro_batches,
            backward_flags=BackwardFlags(pw1_weight_only=self.pw1_only),
        )
        if self.recompute or self.micro_batches > 1:
            segments = [list(seg) for seg in self.recompute]
            base["execution"] = Execution(recompute=segments, micro_batches=self.micro_batches)
        return Scheme(**{**base, **fields, "bias_update": cand.k, "weight_updates": updates})

    def weight_update(self, i: int, ratio: float) -> WeightUpdate:
        """The update of conv ``i`` at ``ratio``, its channels chosen by :attr:`select` (``importance``:
        the top channels of the profile's ``channel_importance``, listed)."""
        conv = self.convs[i]
        if self.select != EXPLICIT_SELECT:
            return WeightUpdate(layer=conv.name, conv_index=i, ratio=ratio, select=self.select)
        c = self.contributions
        channels = top_channels(torch.tensor(c.channel_importance[conv.name], dtype=torch.float64), ratio)
        return WeightUpdate(
            layer=conv.name,
            conv_index=i,
            ratio=ratio,
            select=EXPLICIT_SELECT,
            channels=channels,
            importance_source=f"{c.estimator}:{c.sha256}",
        )

    def to_plan(self, cand: Candidate) -> Plan:
        return scheme_to_plan(self.graph, self.to_scheme(cand), method="sparse")


def objective_gains(
    contributions: Contributions, objective: str
) -> tuple[dict[int, float], dict[str, dict[float, float]]]:
    """The bias and weight entries of ``contributions`` under ``objective`` (each family on its own)."""
    ks = list(contributions.bias)
    bias = apply_objective(objective, [contributions.bias[k] for k in ks], [contributions.bias_se.get(k) for k in ks])
    cells = [(name, r) for name, row in contributions.weight.items() for r in row]
    values = apply_objective(
        objective,
        [contributions.weight[n][r] for n, r in cells],
        [contributions.weight_se.get(n, {}).get(r) for n, r in cells],
    )
    weight: dict[str, dict[float, float]] = {}
    for (name, r), v in zip(cells, values, strict=True):
        weight.setdefault(name, {})[r] = v
    return dict(zip(ks, bias, strict=True)), weight


def _check_select(select: str, contributions: Contributions, convs: list[str]) -> None:
    """``select`` is a rule; ``importance`` needs the profile's per-channel importance of every conv."""
    if select not in SELECT_RULES:
        raise BadOption(f"unknown channel selection {select!r}", f"use one of: {', '.join(SELECT_RULES)}")
    if select == EXPLICIT_SELECT and not contributions.channel_importance:
        raise ProfileError(
            f"--select {EXPLICIT_SELECT} ranks channels by the profile's per-channel importance; "
            f"{contributions.source} has none",
            "measure one with memplan contrib --estimator fisher (or rgn)",
        )
    if select == EXPLICIT_SELECT:
        missing = [n for n in convs if n not in contributions.channel_importance]
        if missing:
            raise ProfileError(f"{contributions.source} has no channel importance for conv {missing[0]!r}")


def build_space(  # one pass: bias depths, then weight options per conv
    graph: LayerGraph,
    contributions: Contributions,
    *,
    model: str | None = None,
    ratios: Iterable[float] = DEFAULT_RATIOS,
    pw1_only: bool = False,
    max_weight_layers: int | None = None,
    objective: str = PLAIN_OBJECTIVE,
    select: str = DEFAULT_SELECT,
) -> SearchSpace:
    """The space of ``graph`` under ``contributions``: every bias depth the profile measured (and
    0), and every (conv, ratio) in ``ratios`` that it measured, restricted to first-pointwise convs
    with ``pw1_only``. Profile entries for other layers or ratios are ignored. The gains are the
    entries under ``objective`` (``memplan.search.objective``)."""
    ratio_set = tuple(sorted({float(r) for r in ratios}))
    if not ratio_set or any(not 0 < r <= 1 for r in ratio_set):
        raise BadOption(f"weight ratios must lie in (0, 1], got {list(ratios)}")
    if max_weight_layers is not None and max_weight_layers < 0:
        raise BadOption(f"max_weight_layers must be >= 0, got {max_weight_layers}")
    if contributions.fingerprint != fingerprint(graph):
        raise ProfileError(
            f"{contributions.source} was measured on another layer table "
            f"(fingerprint {contributions.fingerprint}, this model {fingerprint(graph)})",
            "measure a profile for this model with memplan contrib",
        )
    convs = conv_table(graph)
    nodes = conv_layers(graph)
    n = len(convs)
    bad = sorted(k for k in contributions.bias if k > n)
    if bad:
        raise ProfileError(f"{contributions.source} has bias depth {bad[0]}; the model has {n} convs")
    _check_select(select, contributions, [c.name for c in convs])
    bias_values, weight_values = objective_gains(contributions, objective)
    gains = {0: 0.0, **{k: g for k, g in bias_values.items() if k > 0}}
    ks = tuple(sorted(gains))
    names = {c.name: i for i, c in enumerate(convs)}
    unknown = sorted(set(contributions.weight) - set(names))
    if unknown:
        raise ProfileError(f"{contributions.source} names layer {unknown[0]!r}, which is not a conv of this model")
    layers = []
    for name, table in weight_values.items():
        i = names[name]
        if pw1_only and not is_pw1(nodes[i]):
            continue
        if n - i > ks[-1]:  # no measured bias depth reaches it
            continue
        rs = tuple(r for r in ratio_set if any(abs(r - q) < 1e-12 for q in table))
        if rs:
            lookup = {round(q, 12): g for q, g in table.items()}
            layers.append(LayerChoice(convs[i], rs, tuple(lookup[round(r, 12)] for r in rs)))
    layers.sort(key=lambda c: c.conv_index)
    return SearchSpace(
        graph,
        model or graph.model_name,
        convs,
        ks,
        gains,
        tuple(layers),
        ratio_set,
        pw1_only,
        max_weight_layers,
        contributions,
        objective=objective,
        select=select,
    )
