"""The transfer benchmark's methods and runs (benchmarks/transfer.py): what each method trains
(baselines, the natural hand-made schemes at the largest size that fits each budget, scheme files,
the validated rows of ``memplan search --validate``), its memory, and the training runs on the
validation and test splits, each one line of the checkpoint."""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from transfer_protocol import REFERENCE_DEVICE, counted, run_id, stage_family, stage_name

from memplan.api import profile_captured
from memplan.contrib.checkpoint import Checkpoint
from memplan.contrib.data import Data
from memplan.contrib.protocol import Protocol
from memplan.contrib.runner import Context, Worker, first_trained
from memplan.contrib.setup import Setup
from memplan.errors import MemplanError
from memplan.graph import LayerGraph, conv_layers
from memplan.graph.kinds import NORM_KINDS
from memplan.io import exclusive
from memplan.plan import Plan, Scheme, WeightUpdate, fingerprint, scheme_to_plan
from memplan.rates import Rates, distinct
from memplan.search import run_search
from memplan.search.baselines import BASELINES
from memplan.search.candidates import collect_candidates, sized_candidate
from memplan.search.stage import choose
from memplan.strategies import make_plan, transform_model
from memplan.units import parse_bytes


@dataclass
class Method:
    """One configuration: ``plan(graph)`` is what trains; ``arch`` a strategy whose architecture
    transform the model gets first (TinyTL's lite residual branches); ``cost``: how memplan costs it
    (a strategy name, or a scheme costed by the ``sparse`` strategy)."""

    name: str
    family: str
    plan: Callable[[LayerGraph], Plan]
    cost: str | Scheme
    arch: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    runs_as: str | None = None  # an earlier method that trains exactly the same: its runs are this one's
    lr: Rates | None = None  # the rates the validation stage chose (None: the method's own grid chooses)
    families: frozenset[str] = frozenset(("classifier", "bias", "norm", "weight"))  # what it trains

    @property
    def key(self) -> str:
        """The name its runs are recorded under."""
        return self.runs_as or self.name

    def settings(self, grid: list[Rates]) -> list[Rates]:
        """The distinct trainings of ``grid`` for this method (``memplan.rates.distinct``)."""
        return distinct(grid, self.families)


def what_trains(method: Method, graph: LayerGraph) -> tuple:
    """Everything that decides a run: the architecture transform and the plan's trained tensors
    (with their channels), norms in train mode, approximated activations and norms whose statistics
    are re-estimated."""
    if method.arch is not None:  # its plan reads the transformed model: it shares only with its own strategy
        return method.arch, method.cost if isinstance(method.cost, str) else method.name
    try:
        plan = method.plan(graph)
    except MemplanError:  # not applicable to this model: it fails where it is asked for
        return "not applicable", method.name
    train = sorted((name, repr(t)) for name, t in plan.train.items() if t.any)
    return method.arch, tuple(train), *(tuple(sorted(x)) for x in (plan.norm_train, plan.approx, plan.reestimate))


def share_runs(methods: list[Method], graph: LayerGraph) -> dict[tuple, str]:
    """A method that trains exactly what an earlier one trains (a searched scheme that is the
    classifier only, the same scheme under two objectives) records and reads that one's runs. A
    method that already names its runs keeps them where it trains what no earlier one trains (a
    validated row: the runs of the candidate its stage chose, recorded under the candidate's name).
    Returns what each trains (``what_trains``) -> the key its runs are recorded under."""
    first: dict[tuple, str] = {}
    for m in methods:
        m.runs_as = first.setdefault(what_trains(m, graph), m.key)
        if m.runs_as == m.name:
            m.runs_as = None
    return first


def last_k_scheme(cap, k: int) -> Scheme:
    """Weights and biases of the last ``k`` convs (+ classifier)."""
    convs = conv_layers(cap.graph)
    updates = [WeightUpdate(layer=c.name, conv_index=i, ratio=1.0) for i, c in enumerate(convs) if i >= len(convs) - k]
    return Scheme(
        model=cap.name,
        fingerprint=fingerprint(cap.graph),
        input_shape=list(cap.graph.input_shape[1:]),
        bias_update=k,
        weight_updates=updates,
        mode="benchmark",
    )


def norm_scheme(cap, mode: str) -> Scheme:
    """Every bias and every norm in ``mode`` (``memplan.plan.NORM_MODES``; ``affine``: scale and shift
    train, the norm keeps its running statistics, the ones the linear-probe head was fit on)."""
    norms = [
        n.name for n in cap.graph.nodes if n.kind in NORM_KINDS and n.params and n not in cap.graph.classifier_layers
    ]
    return Scheme(
        model=cap.name,
        fingerprint=fingerprint(cap.graph),
        input_shape=list(cap.graph.input_shape[1:]),
        bias_update=len(conv_layers(cap.graph)),
        norm_modes={n: mode for n in norms},
        mode="benchmark",
    )


def strategy_method(name: str, family: str, strategy: str, arch: str | None = None) -> Method:
    return Method(name, family, lambda g: make_plan(g, strategy), strategy, arch)


def scheme_method(name: str, family: str, scheme: Scheme, **detail: Any) -> Method:
    return Method(name, family, lambda g: scheme_to_plan(g, scheme, method="sparse"), scheme, detail=detail)


def trains_of(m: Method) -> dict[str, Any]:
    """What ``m`` trains as a report row records it (``trains``): a strategy of
    ``memplan.strategies`` or a scheme (its JSON without when and how it was made: the report states
    that), with the architecture transform it gets first."""
    if isinstance(m.cost, Scheme):
        return {"scheme": m.cost.model_dump(mode="json", exclude={"provenance", "validation"}), "arch": m.arch}
    return {"strategy": m.cost, "arch": m.arch}


def method_of(row: dict[str, Any]) -> Method:
    """The method a report row trained, rebuilt from its ``trains`` (:func:`trains_of`)."""
    t = row["trains"]
    if "strategy" in t:
        return strategy_method(row["name"], row["method"], t["strategy"], arch=t["arch"])
    return scheme_method(row["name"], row["method"], Scheme.model_validate(t["scheme"]))


def baselines(cap) -> list[Method]:
    return [
        strategy_method("classifier only", "classifier only", "last"),
        strategy_method("bias only", "bias only", "bias"),
        strategy_method("norm + bias", "norm + bias", "norm"),
        scheme_method("norm + bias, running statistics", "norm + bias (running stats)", norm_scheme(cap, "affine")),
        *(
            scheme_method(f"last-{k} weights+biases", "last-k weights+biases", last_k_scheme(cap, k))
            for k in (1, 2, 4)
            if k <= len(conv_layers(cap.graph))
        ),
        strategy_method("TinyTL lite-residual + bias", "TinyTL", "tinytl-lb", arch="tinytl-lb"),
        strategy_method("MobileTL", "MobileTL", "mobiletl"),
        strategy_method("full fine-tuning", "full fine-tuning", "full"),
        # last: the workers take the methods in this order (the norm variants fit no budget)
        scheme_method(
            "norm + bias, re-estimated statistics",
            "norm + bias (re-estimated stats)",
            norm_scheme(cap, "reestimate"),
        ),
    ]


class BenchTrainer:
    """The validation stage's trainer (``memplan.search.stage.choose``) over the benchmark's own
    runs: a candidate that trains what a method trains reads and writes that method's grid runs
    (``grid|method|lr|seed``, validation split), so the stage and the baselines share them."""

    def __init__(self, run: Run, bench: Bench, graph: LayerGraph, train_missing: bool = True):
        self.run, self.bench, self.graph, self.train_missing = run, bench, graph, train_missing
        p = run.protocol
        self.optimizer, self.epochs, self.batch_size = p.optimizer, p.epochs, p.batch_size
        self.data = f"{run.setup.task.name} (validation split)"
        self.images = len(run.setup.task.y_val)
        self.classifier = run.setup.head
        self.checkpoint, self.trained = str(run.ckpt.path), 0

    def method(self, candidate: Any) -> Method:
        name = f"candidate {candidate.key}"
        if candidate.scheme.added_modules:  # a baseline that changes the architecture (TinyTL): its strategy
            own = BASELINES[candidate.name]
            if own.adjust is not None:
                raise MemplanError(f"candidate {candidate.name!r} adds modules and adjusts its strategy's plan")
            m = strategy_method(name, "candidate", own.method, arch=own.method)
        else:
            m = scheme_method(name, "candidate", candidate.scheme)
        m.runs_as = self.run.runs_of.get(what_trains(m, self.graph))
        m.families = candidate.families
        return m

    def prefetch(self, rung: Sequence[tuple[Any, Rates, int]]) -> None:
        """Train the runs of ``rung`` (the halving's runs on its next seed) that neither the
        checkpoint has nor another process holds, from the rung's end, never waiting: processes that
        walk the same rungs (a stage and its replay under another rule, each a job of its own worker)
        split them, and each reads the other's runs when the halving reaches them."""
        if not self.train_missing:
            return
        runs = []
        for candidate, lr, seed in rung:
            m = self.method(candidate)
            runs.append((run_id("grid", m.key, lr, seed), partial(self.bench.run, m, lr, seed, "validation")))
        self.trained += take_free(self.run, runs)

    def __call__(self, candidate: Any, lr: Rates, seed: int) -> float:
        m = self.method(candidate)
        rid = run_id("grid", m.key, lr, seed)
        done = self.run.done
        if rid not in refresh(self.run):
            if not self.train_missing:
                raise LookupError(rid)
            obtain(self.run, rid, lambda: self.bench.run(m, lr, seed, "validation"))
            self.trained += 1
        return math.nan if done[rid]["diverged"] else done[rid]["accuracy"]


def validated(
    run: Run, bench: Bench, cap: Any, budget: str, train_missing: bool = True, rule: str | None = None
) -> Method | None:
    """``memplan search --validate``'s scheme at ``budget`` (the search in ``applied`` mode at the
    training batch, over ``--profile``) chosen by ``rule`` (None: the protocol's), as a method
    trained at the rate the stage chose (None when the stage's runs are not all in the checkpoint
    and ``train_missing`` is off). Another rule than the protocol's is a replay on the same runs,
    named and grouped apart (``transfer_protocol.stage_name`` / ``stage_family``)."""
    a = run.a
    rule = rule or a.rule
    options = dict(
        profile_path=run.profile, mode="applied", optimizer=a.optimizer, batch=a.batch_size, resolution=a.resolution
    )
    result = run_search(cap.name, budget, **options)
    again = lambda objective, b: run_search(cap.name, b, **{**options, "objective": objective})  # noqa: E731
    classes = run.setup.task.classes
    costing = {"optimizer": a.optimizer}
    candidates = collect_candidates(result, a.validate_candidates, again, costing, classes, a.stage_sizes)
    by_key = {c.key: c for c in candidates}
    trainer = BenchTrainer(run, bench, cap.graph, train_missing)
    try:
        v = choose(
            candidates,
            trainer,
            lrs=a.stage_lrs,
            seeds=a.val_seeds,
            budget_bytes=result.budget_bytes,
            widen=a.widen,
            rule=rule,
        )
    except LookupError:
        return None
    m = trainer.method(v.chosen)
    name = stage_name(budget, rule, a.rule)
    # the stage's own cost: every run it compared (the baselines' included), as memplan search --validate
    # would train them alone on this machine, one after another
    stage_runs = [
        run.done[run_id("grid", trainer.method(by_key[c.candidate]).key, c.lr, seed)]
        for c in v.halving.configs
        for seed in c.accuracy
    ]
    return Method(
        name,
        stage_family(rule, a.rule),
        m.plan,
        v.scheme if m.arch is None else m.cost,  # a scheme that adds modules is costed as its strategy
        arch=m.arch,
        runs_as=m.runs_as or m.name,
        lr=v.config.lr,  # the rule's choice (halving.best is the best on validation)
        detail={
            "budget": budget,
            "chosen": v.chosen.name,
            "rule": rule,
            "validation": v.scheme.validation.model_dump(mode="json"),
            "bias_update": v.scheme.bias_update,
            "weights": [[w.conv_index, w.ratio] for w in v.scheme.weight_updates],
            "norm_modes": len(v.scheme.norm_modes),
            "grid": [str(x) for x in sorted(v.chosen.settings(v.lrs))],  # the stage's grid as used, widened
            "lr_at_grid_edge": v.at_edge,
            "stage_runs": len(stage_runs),
            "stage_run_s": round(sum(r["train_s"] + r["eval_s"] + r["cache_s"] for r in stage_runs), 1),
            "stage_cpu_s": round(sum(r["cpu_s"] for r in stage_runs), 1),
        },
    )


def natural_methods(cap: Any, budgets: list[str], memory: Callable[[Scheme], int]) -> list[Method]:
    """The sized baselines of ``memplan.search.baselines`` (every bias + the weights of the last k
    convs; the biases of the last k convs), each at the largest k whose ``memory(scheme)`` (applied
    bytes at the training batch, as the budgets count) fits each of ``budgets``: one method per
    distinct k, named as the validation stage names it."""
    out: dict[str, Method] = {}
    for budget in budgets:
        for name, baseline in BASELINES.items():
            if baseline.sized is None:
                continue
            c = sized_candidate(name, baseline, cap.graph, memory, parse_bytes(budget), mode="applied")
            if c is not None and c.name not in out:
                out[c.name] = scheme_method(c.name, name, c.scheme)
    return list(out.values())


# ----------------------------------------------------------------------------- the runs
def device_name(device: str) -> str:
    """What a run records as its device: ``cpu``, or for a ``cuda`` device the GPU's name and
    ``fp32``: the benchmark trains there with TF32 off (:func:`full_precision`), to learn whether
    the device effect is TF32's. The first H200 runs (2026-11-27) record the name alone: cuDNN's
    default TF32 convolutions."""
    return f"{torch.cuda.get_device_name(device)} fp32" if device.startswith("cuda") else REFERENCE_DEVICE


def full_precision() -> None:
    """fp32 convolutions and matmuls on CUDA, in this process (torch's defaults let cuDNN convolve in
    TF32, a 10-bit mantissa)."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


class Bench:
    """The setup, the probe head and one worker per (architecture, evaluation split)."""

    def __init__(self, setup: Setup, protocol: Protocol, threads: int, device: str = "cpu"):
        self.setup, self.protocol, self.threads, self.device = setup, protocol, threads, device
        self.device_name = device_name(device)
        if device.startswith("cuda"):
            full_precision()
        task = setup.task
        self.splits = {
            "validation": task.validation_task(),
            "test": Data(
                task.name, task.description, task.x_train, task.y_train, task.x_test, task.y_test, task.classes
            ),
        }
        self.workers: dict[tuple[str | None, str], Worker] = {}

    def worker(self, arch: str | None, split: str) -> Worker:
        key = (arch, split)
        if key not in self.workers:
            for k in [k for k in self.workers if k[0] != arch]:  # one architecture's features at a time
                del self.workers[k]
            net = copy.deepcopy(self.setup.net)
            if arch is not None:
                torch.manual_seed(0)
                net = transform_model(net, arch, input_shape=self.setup.shape)  # the branches at the run's input
            ctx = Context(self.setup.name, net, self.splits[split], self.protocol, True, self.threads, self.device)
            self.workers[key] = Worker(ctx)
        return self.workers[key]

    def run(self, method: Method, lr: Rates, seed: int, split: str) -> dict[str, Any]:
        """Train ``method`` at rates ``lr`` with ``seed``; accuracy (%) on ``split``, seconds and the
        device it ran on ("cpu" or the GPU's name: their float kernels differ, so a run says where)."""
        w = self.worker(method.arch, split)
        proto = self.protocol.at(lr, seed)
        rec = w.train_plan(method.plan, first_trained(w.graph, method.plan(w.graph)), proto)
        acc = rec["accuracy"][0]
        return {
            "accuracy": acc,
            "diverged": not math.isfinite(rec["final_loss"][0]) or acc <= 100.0 / self.setup.task.classes + 1e-9,
            "train_s": rec["train_s"],
            "eval_s": rec["eval_s"],
            "cache_s": rec["cache_s"],
            "cpu_s": rec["cpu_s"],
            "trainable_params": rec["trainable_params"],
            "device": self.device_name,
        }


#: the memory columns: (mode, batch = the training batch?, mode options, what the state is stored as)
MEMORY_COLUMNS = {
    "applied": ("applied", True, {}, "fp32 state"),
    "tinytraining": ("tinytraining", False, {}, "state at the parameter's bits: 8 for weights, 32 for biases"),
}


def memory_of(caps: Callable[[str | None, int], Any], method: Method, optimizer: str, batch: int) -> dict[str, int]:
    """Bytes of ``method`` in every :data:`MEMORY_COLUMNS` mode: ``applied`` (what the run as trained
    allocates, at the training ``batch``, fp32 optimizer state) first, then ``tinytraining`` (the
    256KB paper's analytic memory, batch 1). ``caps(arch, batch)``: the captured model."""
    out = {}
    for column, (mode, at_batch, options, _) in MEMORY_COLUMNS.items():
        b = batch if at_batch else 1
        if isinstance(method.cost, Scheme):
            prof = profile_captured(
                caps(None, b), "sparse", mode=mode, optimizer=optimizer, scheme=method.cost, mode_options=options
            )
        else:
            prof = profile_captured(
                caps(method.arch, b), method.cost, mode=mode, optimizer=optimizer, mode_options=options
            )
        out[column] = prof.totals.total_bytes
    return out


@dataclass
class Run:
    """One invocation: its options, the setup with the probe head, the checkpoint and the methods."""

    a: argparse.Namespace
    setup: Setup
    protocol: Protocol
    ckpt: Checkpoint
    done: dict[str, dict]
    probe: float
    methods: list[Method] = field(default_factory=list)
    memory: dict[str, int] = field(default_factory=dict)
    profile: Path | None = None
    sha: str = ""  # the protocol file's sha256, recorded with every run
    stages: list[str] = field(default_factory=list)  # the budgets whose validation stage is a job
    cap_at: Callable[[str | None, int], Any] | None = None  # (architecture, batch) -> the captured model
    #: what each method trains (``what_trains``) -> the key its runs are recorded under, over every
    #: method before ``--methods`` keeps some: a stage's candidate reads a left-out baseline's runs too
    runs_of: dict[tuple, str] = field(default_factory=dict)
    device: str = REFERENCE_DEVICE  # whose runs count (--runs-of, else its own); counting() switches it


def record(run: Run, rid: str, result: dict[str, Any]) -> None:
    """One finished run into ``run.done`` and the checkpoint, with the protocol it ran under."""
    run.done[rid] = {"id": rid, **result, "protocol_sha256": run.sha}
    run.ckpt.append(run.done[rid])


def claim_path(run: Run, name: str) -> Path:
    """The lock file that claims ``name`` (a run id, or a job of the benchmark) beside the checkpoint
    (``memplan.io.exclusive``: released when its holder leaves the block or dies)."""
    claims = run.ckpt.path.parent / "claims"
    claims.mkdir(exist_ok=True)
    return claims / hashlib.sha1(name.encode()).hexdigest()[:16]


def obtain(run: Run, rid: str, train: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``rid``'s record: from the checkpoint, else trained by ``train()`` and recorded. Processes
    sharing one checkpoint (workers, or runs of ``--methods`` side by side) claim a run before
    training it (:func:`claim_path`): a run another process is training is waited for, then read,
    never trained twice."""
    take(run, rid, train, wait=True)
    return run.done[rid]


def obtain_all(run: Run, runs: Sequence[tuple[str, Callable[[], dict[str, Any]]]]) -> list[dict[str, Any]]:
    """The records of ``runs`` (each a run id and its ``train``): first the runs that neither the
    checkpoint has nor another process holds are trained, from the end (:func:`take_free`), then
    each is read in order (:func:`obtain`, waiting for those another process trains): processes that
    need the same runs (a stage and its replay choosing one scheme) split them."""
    take_free(run, runs)
    return [obtain(run, rid, train) for rid, train in runs]


def take_free(run: Run, runs: Sequence[tuple[str, Callable[[], dict[str, Any]]]]) -> int:
    """Train and record, from the end of ``runs`` (each a run id and its ``train``), those that
    neither the checkpoint has nor another process holds, waiting for none; how many were trained."""
    return sum(take(run, rid, train) for rid, train in reversed(runs))


def take(run: Run, rid: str, train: Callable[[], dict[str, Any]], wait: bool = False) -> bool:
    """Train ``rid`` with ``train()`` and record it, unless the checkpoint has it or (without
    ``wait``) another process holds its claim (:func:`claim_path`; left to that process; with
    ``wait``, waited for and then read, or taken over from a process that died); whether this
    process trained it."""
    if rid in refresh(run):
        return False
    with exclusive(claim_path(run, rid), wait=wait) as mine:
        if not mine or rid in refresh(run):  # held elsewhere, or finished by the process waited for
            return False
        record(run, rid, train())
        return True


def refresh(run: Run, records: list[dict] | None = None) -> dict:
    """``run.done`` brought up to date with the checkpoint (``records``: its run records, already read):
    read before every run, so that processes sharing it (workers, a stage beside a method) never
    train a run twice; the records of ``run.device`` (``transfer_protocol.counted``)."""
    fresh = counted(checkpoint_lines(run.ckpt.path) if records is None else records, run.device)
    run.done.clear()
    run.done.update(fresh)
    return run.done


@contextlib.contextmanager
def counting(run: Run, device: str) -> Iterator[dict]:
    """Inside: ``run.done`` (yielded) and every :func:`refresh` hold ``device``'s runs (``--pairs-of``
    chooses the methods from another device's runs); after: this process's own again."""
    mine = run.device
    run.device = device
    try:
        yield refresh(run)
    finally:
        run.device = mine
        refresh(run)


def checkpoint_lines(path: Path) -> list[dict]:
    """Every run record of the checkpoint, in file order, repeats included (a torn line skipped)."""
    out = []
    for line in path.read_text().splitlines()[1:] if path.is_file() else []:
        with contextlib.suppress(json.JSONDecodeError):
            if "run" in (rec := json.loads(line)):
                out.append(rec["run"])
    return out
