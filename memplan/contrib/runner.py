"""Training one grid run (all its seeds) in a worker.

A :class:`Context` is what every worker receives once (the model with its backbone weights
and linear-probe head, the data, the protocol); a :class:`Worker` holds the traced model and
the feature cache of the current split point, so consecutive runs that share a split reuse
it. ``Worker.execute(spec)`` returns the run's record (a JSON-able dict).

Every run: a fresh copy of the model with the run's plan applied by
``memplan.apply.apply_plan`` (the memory-lean modules, sub-channel weights as
``SubChannelConv``, norms in eval mode), SGD with per-role learning rates over ``epochs``
epochs in a seeded order with a cosine decay (``memplan.nn.train.fit``), then test accuracy
in eval mode. The trainable tensors are reset to their initial values before each seed. A plan
that re-estimates norm statistics (``Plan.reestimate``, the norm mode ``reestimate``) has them
re-estimated on the training split first and the linear-probe head re-fit on them
(:meth:`Worker.refit_statistics`).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.fx as fx
import torch.nn as nn
from torch import Tensor

from ..api import capture
from ..apply import add_modules, apply_plan
from ..errors import BadOption
from ..graph import ConvLayer, LayerGraph, Node, conv_table
from ..nn.train import batches_of, fit, reestimate_norm_stats
from ..optim import make_optimizer
from ..plan import Plan, Scheme, scheme_to_plan
from ..rates import Rates, param_groups
from . import cache as fcache
from .data import Data
from .protocol import Protocol, RunSpec, run_plan, split_layer

#: op kinds that differ between train and eval mode without parameters (never inside a cached prefix)
STOCHASTIC_KINDS = frozenset({"dropout"})


@dataclass
class Context:
    """Everything a worker needs (pickled once per worker)."""

    model_name: str
    model: nn.Module  # backbone weights + linear-probe head
    data: Data
    protocol: Protocol
    cache: bool = True
    threads: int = 1
    device: str = "cpu"  # torch device of the runs ("cuda" where a GPU exists)


def resolve_device(name: str) -> str:
    """``cpu``, ``cuda`` (refused in one line where no GPU is visible) or ``auto`` (cuda when present)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise BadOption(f"unknown device {name!r}", "choose cpu, cuda or auto")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise BadOption(f"--device {name}: no CUDA device is visible to torch {torch.__version__}", "use --device cpu")
    return name


def accuracy(forward: Callable[..., Tensor], inputs: Callable[[Tensor | None], list[Tensor]], y: Tensor) -> float:
    """Top-1 accuracy in % of ``forward`` over all samples (chunks of EVAL_CHUNK)."""
    n = y.shape[0]
    correct = 0
    with torch.no_grad():
        for start in range(0, n, fcache.EVAL_CHUNK):
            idx = torch.arange(start, min(n, start + fcache.EVAL_CHUNK))
            correct += int((forward(*inputs(idx)).argmax(1) == y[idx]).sum())
    return 100.0 * correct / n


def channels_last(t: Tensor) -> Tensor:
    """4-D tensors in channels-last layout (1.4-1.6x faster convs on CPU for these nets)."""
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t


@dataclass
class Split:
    """The cached frontier of one split point and the suffix graph that consumes it."""

    layer: str
    suffix: fx.Graph
    train: fcache.Features
    test: fcache.Features
    seconds: float  # time to build the features


class Worker:
    """Per-process state: the traced model and the features of the latest split point."""

    def __init__(self, ctx: Context):
        torch.set_num_threads(ctx.threads)
        self.ctx = ctx
        self.model = ctx.model.eval().to(memory_format=torch.channels_last)
        cap = capture(self.model, ctx.data.x_train.shape[1:], name=ctx.model_name, runnable=True)
        self.gm, self.graph = cap.gm, cap.graph
        dev = torch.device(ctx.device)
        self.model.to(dev)
        self.x_train, self.x_test = channels_last(ctx.data.x_train.to(dev)), channels_last(ctx.data.x_test.to(dev))
        self.y_train, self.y_test = ctx.data.y_train.to(dev), ctx.data.y_test.to(dev)
        self.layers: list[ConvLayer] = conv_table(self.graph)
        self.classifier = self.graph.classifier.name
        self.split: Split | None = None
        self.refits: dict[tuple[str, ...], dict[str, Tensor]] = {}  # re-estimated statistics + re-fit head

    def features(self, layer: str) -> Split:
        """The split at ``layer``, reusing the previous one when it is the same layer."""
        if self.split is None or self.split.layer != layer:
            self.split = None  # free the previous features first
            t0 = time.perf_counter()
            prefix_graph, suffix, names = fcache.split(self.gm, layer)
            prefix = fcache.submodel(self.model, prefix_graph)
            tr, te = fcache.build(prefix, names, self.x_train, self.x_test, self.ctx.protocol.bits)
            self.split = Split(layer, suffix, tr, te, time.perf_counter() - t0)
            return self.split
        return Split(layer, self.split.suffix, self.split.train, self.split.test, 0.0)

    def cache_point(self, split_at: str) -> str:
        """Where the frozen prefix really ends: ``split_at``, or the first stochastic module before it
        (a dropout), so that every run trains with the same dropout whatever it trains (a prefix is
        cached in eval mode, where dropout is the identity)."""
        for node in self.graph.nodes:
            if node.op == "call_module" and node.kind in STOCHASTIC_KINDS:
                return node.name
            if node.op == "call_module" and node.name == split_at:
                return split_at
        return split_at

    def execute(self, spec: RunSpec | SchemeRun) -> dict:
        """Train and evaluate ``spec`` for every seed; returns its record."""
        if isinstance(spec, SchemeRun):
            return spec.run_on(self)
        proto = self.ctx.protocol
        if spec.seeds is not None:
            proto = proto.model_copy(update={"seeds": spec.seeds})
        record = self.train_plan(
            lambda graph: run_plan(spec, graph, self.ctx.model_name, proto),
            split_layer(spec, self.layers, self.graph),
            proto,
        )
        return {"id": spec.id, **spec.to_dict(), **record}

    def refit_statistics(self, model: nn.Module, graph: LayerGraph, plan: Plan, protocol: Protocol) -> None:
        """Re-estimate the running statistics of the norms in ``plan.reestimate`` on the training split
        (``memplan.nn.train.reestimate_norm_stats``, consecutive chunks of the protocol's batch), then
        re-fit the linear-probe head on them (:func:`linear_probe`: the head was probed on the old
        statistics). Both are deterministic, so the result is computed once per set of norms and
        loaded into later copies."""
        key = tuple(sorted(plan.reestimate))
        if key not in self.refits:
            names = sorted({norm_module(graph.by_name(n)) for n in plan.reestimate})
            reestimate_norm_stats(model, batches_of(self.x_train, protocol.batch_size), names)
            linear_probe(model, self.classifier, self.ctx.data, protocol, self.ctx.device)
            model.to(self.x_train.device)
            keep = tuple(f"{q}." for q in (*names, self.classifier))
            self.refits[key] = {k: v.detach().clone() for k, v in _tensors(model).items() if k.startswith(keep)}
        tensors = _tensors(model)
        with torch.no_grad():
            for k, v in self.refits[key].items():
                tensors[k].copy_(v)

    def train_plan(  # the seed loop: reset, train and evaluate, timed together
        self, make: Callable[[LayerGraph], Plan], split_at: str | None, protocol: Protocol | None = None
    ) -> dict:
        """Train ``make(graph)``'s plan on a fresh copy of the model for every seed and evaluate it on
        the context's evaluation split. ``split_at``: the first layer whose input depends on a
        trainable parameter (the frozen prefix before it is cached; None: no cache). ``protocol``
        overrides the context's (learning rates, epochs, seeds). Returns accuracies (%) per seed,
        trainable parameter count and seconds."""
        ctx, proto = self.ctx, protocol or self.ctx.protocol
        y_train, y_test = self.y_train, self.y_test
        cpu0 = time.process_time()
        model, graph = copy.deepcopy((self.model, self.graph))  # the graph must describe the copy
        plan = make(graph)
        if plan.reestimate:
            self.refit_statistics(model, graph, plan, proto)
        apply_plan(model, plan, graph)
        train_flags = [(m, m.training) for m in model.modules()]  # apply_plan's train / eval flags
        cache_s, cache_bytes = 0.0, 0
        if ctx.cache and split_at is not None:
            split = self.features(self.cache_point(split_at))
            forward: Callable[..., Tensor] = fcache.submodel(model, split.suffix)
            train_in = lambda idx: [channels_last(t) for t in split.train.batch(idx)]  # noqa: E731
            test_in = lambda idx: [channels_last(t) for t in split.test.batch(idx)]  # noqa: E731
            cache_s, cache_bytes = split.seconds, split.train.nbytes + split.test.nbytes
        else:
            forward = model
            train_in = lambda idx: [self.x_train[idx]]  # noqa: E731
            test_in = lambda idx: [self.x_test[idx]]  # noqa: E731
        groups = param_groups(model, proto.rates, self.classifier)
        params = [p for g in groups for p in g["params"]]
        initial = [p.detach().clone() for p in params]
        buffers = [(b, b.detach().clone()) for b in model.buffers()]  # norm statistics of train-mode norms
        accs, final_loss, train_s, eval_s = [], [], 0.0, 0.0
        for seed in proto.seeds:
            with torch.no_grad():
                for p, p0 in zip(params, initial):
                    p.copy_(p0)
                for b, b0 in buffers:
                    b.copy_(b0)
            for m, flag in train_flags:
                m.training = flag
            t0 = time.perf_counter()
            opt = make_optimizer(groups, proto.optimizer, proto.lr_classifier)
            losses = fit(
                forward,
                opt,
                train_in,
                y_train,
                epochs=proto.epochs,
                batch_size=proto.batch_size,
                seed=seed,
                cosine=True,
            )
            t1 = time.perf_counter()
            final_loss.append(losses[-1])
            model.eval()
            accs.append(accuracy(forward, test_in, y_test))
            eval_s += time.perf_counter() - t1
            train_s += t1 - t0
        return {
            "seeds": list(proto.seeds),
            "accuracy": accs,
            "final_loss": final_loss,  # training loss of the last step per seed (not finite: diverged)
            "trainable_params": sum(p.numel() for p in params),
            "train_s": round(train_s, 4),
            "eval_s": round(eval_s, 4),
            "cache_s": round(cache_s, 4),
            "cache_bytes": cache_bytes,
            "cpu_s": round(time.process_time() - cpu0, 4),
        }


@dataclass(frozen=True)
class SchemeRun:
    """One run of a whole scheme at rates per family and one seed (the validation stage's unit of
    work, ``memplan.search.stage``, and of the final evaluations, ``memplan.contrib.final``):
    executors run it like a :class:`RunSpec`. ``id``: its checkpoint id."""

    id: str
    scheme: Scheme
    rates: Rates
    seed: int

    def run_on(self, worker: Worker) -> dict:
        """The record: ``id``, ``accuracy`` on the context's evaluation split (%), ``final_loss`` (the
        last step's training loss; not finite: the run diverged), ``trainable_params``, seconds."""
        make = lambda g: scheme_to_plan(g, self.scheme, method="sparse")  # noqa: E731
        proto = worker.ctx.protocol.at(self.rates, self.seed)
        rec = worker.train_plan(make, first_trained(worker.graph, make(worker.graph)), proto)
        keep = ("trainable_params", "train_s", "eval_s", "cache_s")
        return {"id": self.id, "accuracy": rec["accuracy"][0], "final_loss": rec["final_loss"][0]} | {
            k: rec[k] for k in keep
        }


def added_key(scheme: Scheme) -> str:
    """What ``scheme`` adds to the model, as text ("" for the plain model): runs with the same key
    train on the same model."""
    added = [a.model_dump(mode="json") for a in scheme.added_modules]
    return json.dumps(added, sort_keys=True) if added else ""


def with_added_modules(ctx: Context, scheme: Scheme) -> Context:
    """``ctx`` on a copy of its model with ``scheme``'s added modules built
    (``memplan.apply.add_modules``, at the context's input shape); ``ctx`` itself when it adds none."""
    if not scheme.added_modules:
        return ctx
    return replace(ctx, model=add_modules(copy.deepcopy(ctx.model), scheme, ctx.data.x_train.shape[1:]))


def _tensors(model: nn.Module) -> dict[str, Tensor]:
    """Every parameter and buffer of ``model`` by qualname."""
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def first_trained(graph: LayerGraph, plan: Plan) -> str | None:
    """Module name of the first node (forward order) with a trainable parameter under ``plan``, or
    a norm whose statistics it re-estimates: where the frozen prefix of a feature cache ends (None:
    nothing trains)."""
    for node in graph.nodes:
        if node.params and plan.of(node).any and node.layer:
            return node.layer
        if node.name in plan.reestimate:
            return norm_module(node)
    return None


def norm_module(node: Node) -> str:
    """Qualname of the module a norm node runs: its own, or the one running a functional norm."""
    return node.name if node.op == "call_module" else node.layer or node.scope


def linear_probe(model: nn.Module, classifier: str, data: Data, protocol: Protocol, device: str = "cpu") -> float:
    """Train ``model``'s classifier from zero on frozen features (the protocol's optimizer, cosine decay
    over ``probe_epochs``, seed 0); returns its accuracy (%) on ``data``'s evaluation split
    (``x_test``). The features at the classifier's input are computed once, on ``device``; the
    model is left on the CPU."""
    dev = torch.device(device)
    data = Data(
        data.name,
        data.description,
        data.x_train.to(dev),
        data.y_train.to(dev),
        data.x_test.to(dev),
        data.y_test.to(dev),
        data.classes,
    )
    model.eval()
    gm = capture(model, data.x_train.shape[1:], runnable=True).gm  # traced in eval mode, as the probe runs
    model.to(dev)
    head = model.get_submodule(classifier)
    with torch.no_grad():
        for p in head.parameters():
            p.zero_()
    prefix_graph, suffix_graph, names = fcache.split(gm, classifier)
    tr, te = fcache.build(fcache.submodel(model, prefix_graph), names, data.x_train, data.x_test, None)
    suffix = fcache.submodel(model, suffix_graph)
    for p in model.parameters():
        p.requires_grad_(False)
    params = list(head.parameters())
    for p in params:
        p.requires_grad_(True)
    fit(
        suffix,
        make_optimizer(params, protocol.optimizer, protocol.probe_lr),
        tr.batch,
        data.y_train,
        epochs=protocol.probe_epochs,
        batch_size=protocol.batch_size,
        seed=0,
        cosine=True,
    )
    for p in params:
        p.requires_grad_(False)
    acc = accuracy(suffix, te.batch, data.y_test)
    model.to("cpu")
    return acc
