"""Contribution estimators: what fills a contribution profile's entries (``bias[k]``,
``weight[layer][ratio]``, their standard errors), one small registered function each.

Every estimator has one signature, ``fn(env: Env) -> Estimate``: it reads the model with its
linear-probed head, the data the runs see, the conv table and the grid's entries, and returns
one number per entry in its own unit (:attr:`Estimator.units`), with a standard error where it
has one. Adding an estimator is one function under ``@estimator(...)``.

* ``grid``: real fine-tuning runs per entry (the 256KB paper's contribution analysis): Δacc in
  accuracy points, SE over seeds;
* ``probe``: the same runs, shortened: one epoch over ``batches`` x batch_size training images
  (a few optimisation steps), seeds 0 and 1: Δacc points of a short run, a proxy;
* ``fisher``: empirical Fisher information of the entry's trainable parameters: per mini-batch b
  of the training split, g_b = the gradient of the batch's mean cross-entropy (model in eval
  mode, norms frozen, as in every run); an entry = sum over its parameters of mean_b g_b^2
  (loss^2 / parameter^2 units, summed), SE over batches. Bias depth k sums the bias carriers of
  the last k convs; weight (i, r) sums the input channels a ratio-r update of conv i trains
  (chosen by the protocol's ``select`` rule);
* ``rgn``: relative gradient norm (surgical fine-tuning, Lee et al., ICLR 2023): per batch,
  ||g_b[entry]|| / ||theta[tensor]|| (unitless), mean and SE over batches; bias depth k sums its
  k bias vectors' RGN, weight (i, r) = ||g_b[chosen channels]|| / ||W_i||.

``fisher`` and ``rgn`` also return per-channel importance of every conv weight on the target data
(``channel_importance``: the conv's input channels, groups for a depthwise conv), from which
``--select importance`` takes the top channels.

How the search consumes an estimate: as a score per entry, added up over the scheme's entries
(Fisher information is additive over parameters), maximised under the budget. The profile
records the estimator and its units; ``memplan search`` prints the summed value in those units
and never calls it Δacc unless the estimator measured accuracy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from .. import names
from ..graph import ConvLayer
from ..nn.lean.conv import select_channels
from ..registry import Registry
from .adaptive import standard_error
from .data import Data
from .profile import DELTA_ACC_UNITS, Noise, RunRecord, from_runs
from .progress import bar as progress_bar
from .protocol import Protocol, RunSpec
from .runner import Context


@dataclass
class Env:
    """What an estimator reads. ``seen``: training split + the split every run is measured on
    (``x_test`` slot); ``specs``: the grid's entries; ``run_grid(ctx, specs)``: executes runs
    (checkpointed, resumable) and returns every finished record by id; ``batches``: mini-batches
    of the gradient estimators (and the probe's optimisation steps per epoch)."""

    net: nn.Module  # backbone weights + linear-probed head
    seen: Data
    layers: list[ConvLayer]
    specs: list[RunSpec]
    protocol: Protocol
    batches: int
    context: Callable[[Data, Protocol], Context]
    run_grid: Callable[[Context, list[RunSpec]], dict[str, dict[str, Any]]]
    progress: bool = False  # a bar on stderr over the gradient estimators' mini-batches

    @property
    def layers_index(self) -> dict[str, int]:
        return {c.name: c.conv_index for c in self.layers}


@dataclass
class Estimate:
    """One number per entry (the estimator's unit) and its standard error (None: not known)."""

    bias: dict[int, float]
    bias_se: dict[int, float | None]
    weight: dict[str, dict[float, float]]
    weight_se: dict[str, dict[float, float | None]]
    bias_std: dict[int, float] = field(default_factory=dict)
    weight_std: dict[str, dict[float, float]] = field(default_factory=dict)
    channel_importance: dict[str, list[float]] = field(default_factory=dict)
    runs: list[RunRecord] = field(default_factory=list)
    noise: Noise | None = None


@dataclass(frozen=True)
class Estimator:
    name: str
    fn: Callable[[Env], Estimate]
    units: str
    description: str
    #: what it measures with: "protocol" (training runs at the protocol), "short" (runs of a shortened
    #: protocol, ``probe_protocol``) or "gradients" (no training: gradients at the probe head)
    runs: str = "protocol"


#: estimator name -> how a profile's entries are measured
ESTIMATORS: Registry[Estimator] = Registry("contribution estimator", names=names.ESTIMATORS)


def estimator(name: str, *, units: str, description: str, runs: str = "protocol"):
    """Decorator registering ``fn(env) -> Estimate`` as estimator ``name`` (``runs``: :attr:`Estimator.runs`)."""

    def decorate(fn: Callable[[Env], Estimate]) -> Callable[[Env], Estimate]:
        ESTIMATORS.add(name, Estimator(name, fn, units, description, runs))
        return fn

    return decorate


# ----------------------------------------------------------------------------- run-based
def _from_runs(env: Env, data: Data, protocol: Protocol) -> Estimate:
    finished = env.run_grid(env.context(data, protocol), env.specs)
    return Estimate(**from_runs(env.specs, finished, env.layers))


@estimator(
    "grid",
    units=DELTA_ACC_UNITS,
    description="real fine-tuning runs per entry (Lin et al., NeurIPS 2022, Sec. 2.2)",
)
def grid(env: Env) -> Estimate:
    return _from_runs(env, env.seen, env.protocol)


#: seeds of the probe estimator's short runs
PROBE_SEEDS = (0, 1)


def probe_protocol(protocol: Protocol) -> Protocol:
    """The probe's protocol: one epoch, seeds :data:`PROBE_SEEDS`, no adaptive seeding."""
    return protocol.model_copy(update={"epochs": 1, "seeds": PROBE_SEEDS, "max_seeds": None})


def subset(data: Data, n: int, seed: int = 0) -> Data:
    """``data`` with a seeded choice of ``n`` training images (all when it has fewer)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(data.x_train.shape[0], generator=g)[:n].sort().values
    return replace(data, x_train=data.x_train[idx], y_train=data.y_train[idx])


@estimator(
    "probe",
    runs="short",
    units="Δacc, accuracy points after one short epoch (a proxy of the grid's Δacc)",
    description="the grid's runs shortened to one epoch over batches x batch_size training images, seeds 0 and 1",
)
def probe(env: Env) -> Estimate:
    data = subset(env.seen, env.batches * env.protocol.batch_size)
    return _from_runs(env, data, probe_protocol(env.protocol))


# ----------------------------------------------------------------------------- gradient-based
def batch_gradients(env: Env) -> list[dict[str, Tensor]]:
    """Per mini-batch of the training split (``env.batches`` batches of the protocol's batch size,
    a seeded draw), the gradient of the batch's mean cross-entropy with respect to every conv
    weight and bias carrier, the model in eval mode (norm statistics frozen)."""
    model = env.net
    was = [(p, p.requires_grad) for p in model.parameters()]
    model.eval()
    params = dict(model.named_parameters())
    names = {f"{c.name}.weight" for c in env.layers}
    names |= {f"{c.bias}.bias" for c in env.layers if c.bias is not None}
    for n in names:
        if n not in params:
            raise KeyError(f"{n} is not a parameter of the model")
    wanted = {n: params[n] for n in sorted(names)}
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(env.seen.x_train.shape[0], generator=g)
    bs = env.protocol.batch_size
    out = []
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        for p in wanted.values():
            p.requires_grad_(True)
        n = min(env.batches, -(-order.numel() // bs))  # a small training split has fewer batches
        bar, task = progress_bar(env.progress, "contrib: gradient mini-batches", n)
        with bar:
            for b in range(n):
                idx = order[b * bs : (b + 1) * bs]
                loss = nn.functional.cross_entropy(model(env.seen.x_train[idx]), env.seen.y_train[idx])
                grads = torch.autograd.grad(loss, list(wanted.values()))
                out.append({n: gr.detach() for n, gr in zip(wanted, grads, strict=True)})
                bar.advance(task)
    finally:
        for p, flag in was:
            p.requires_grad_(flag)
    return out


def per_channel(t: Tensor, groups: int) -> Tensor:
    """Sum of ``t`` (a conv weight's shape) per input channel (groups == 1) or per channel of a
    depthwise conv: the units :func:`memplan.nn.lean.conv.select_channels` chooses among."""
    c_in = t.shape[1] * groups
    if groups == 1:
        return t.transpose(0, 1).reshape(c_in, -1).sum(1)
    return t.reshape(c_in, -1).sum(1)


def chosen(layer: ConvLayer, weight: Tensor, ratio: float, protocol: Protocol) -> Tensor:
    """Indices of the channels a ratio-``ratio`` update of ``layer`` trains under the protocol's rule."""
    return select_channels(weight, layer.groups, ratio, protocol.select)


def squared_gradient(g: dict[str, Tensor], layer: ConvLayer, idx: Tensor | None) -> float:
    """Sum of the squared gradients ``g`` of one entry: ``layer``'s bias carrier (``idx`` None), or
    the channels ``idx`` of its weight (float64)."""
    if idx is None:
        return float(g[f"{layer.bias}.bias"].double().square().sum())
    return float(per_channel(g[f"{layer.name}.weight"].double().square(), layer.groups)[idx].sum())


def _entries(
    env: Env, grads: list[dict[str, Tensor]], value: Callable[[dict[str, Tensor], ConvLayer, Tensor | None], float]
) -> Estimate:
    """Mean and SE over batches of ``value(grads of one batch, layer, channels)`` per entry: a bias
    entry sums its k convs' bias values (``channels`` None), a weight entry is the conv's value
    over the channels its ratio trains."""
    params = dict(env.net.named_parameters())
    n = len(env.layers)
    rows = [[value(g, c, None) if c.bias is not None else 0.0 for c in env.layers] for g in grads]
    ks = sorted({s.k for s in env.specs if s.kind == "bias"})
    bias = {k: [sum(row[n - k :]) for row in rows] for k in ks}
    weight: dict[str, dict[float, list[float]]] = {}
    for s in env.specs:
        if s.kind == "weight":
            layer = env.layers[s.conv_index]
            idx = chosen(layer, params[f"{layer.name}.weight"], s.ratio, env.protocol)
            weight.setdefault(layer.name, {})[s.ratio] = [value(g, layer, idx) for g in grads]
    by_conv = sorted(weight, key=lambda name: env.layers_index[name])
    return Estimate(
        bias={k: statistics.fmean(v) for k, v in bias.items()},
        bias_se={k: standard_error(v) for k, v in bias.items()},
        weight={name: {r: statistics.fmean(v) for r, v in sorted(weight[name].items())} for name in by_conv},
        weight_se={name: {r: standard_error(v) for r, v in sorted(weight[name].items())} for name in by_conv},
    )


@estimator(
    "fisher",
    runs="gradients",
    units="empirical Fisher: sum over the entry's parameters of the mean over mini-batches of the squared "
    "gradient of the batch-mean cross-entropy (loss^2 / parameter^2, summed over parameters)",
    description="empirical Fisher information of the entry's parameters on the target training data",
)
def fisher(env: Env) -> Estimate:
    grads = batch_gradients(env)
    est = _entries(env, grads, squared_gradient)
    est.channel_importance = {
        c.name: per_channel(
            torch.stack([g[f"{c.name}.weight"].double().square() for g in grads]).mean(0), c.groups
        ).tolist()
        for c in env.layers
    }
    return est


@estimator(
    "rgn",
    runs="gradients",
    units="relative gradient norm: ||gradient of the entry's parameters|| / ||the tensor's weights|| per "
    "mini-batch, mean over batches (unitless; a bias depth sums its k bias vectors')",
    description="relative gradient norm (Lee et al., ICLR 2023) of the entry's parameters on the target training data",
)
def rgn(env: Env) -> Estimate:
    grads = batch_gradients(env)
    norms = {n: float(p.detach().double().norm()) for n, p in env.net.named_parameters()}

    def value(g: dict[str, Tensor], layer: ConvLayer, idx: Tensor | None) -> float:
        norm = norms[f"{layer.bias}.bias" if idx is None else f"{layer.name}.weight"]
        return math.sqrt(squared_gradient(g, layer, idx)) / norm if norm > 0 else 0.0

    est = _entries(env, grads, value)
    est.channel_importance = {
        c.name: (
            torch.stack([per_channel(g[f"{c.name}.weight"].double().square(), c.groups).sqrt() for g in grads]).mean(0)
            / max(norms[f"{c.name}.weight"], 1e-30)
        ).tolist()
        for c in env.layers
    }
    return est
