"""A real transfer benchmark with fair baselines: every method fine-tunes the same pretrained
backbone on the same data with the same optimizer and epoch budget, picks its learning rate on
validation from the same grid, and is measured on the whole test split over several seeds.

Everything a run is fixed by is in a **protocol file** committed before the runs
(``--protocol benchmarks/protocols/<name>.json``; ``transfer_protocol.BenchProtocol``): backbone,
weights, data, resolution, split sizes, epochs, batch, optimizer, the learning-rate grids, the
test and validation seeds, the budgets. The benchmark refuses to run without one and refuses a
command-line option that contradicts it; the report states the file's sha256, its notes and the
runs redone, and why. The shipped protocols: EfficientNet-Lite0 and Lite2 (shipped ImageNet
weights) -> Fashion-MNIST at 64 px, and Lite0 -> CIFAR-10 at 64 px (``transfer_data.cifar10``):
300 training images per class, 50 more per class carved from the training data for validation,
the whole 10,000-image test split for the final numbers only.

Protocol, the same for every method:

* a linear probe first (classifier from zero on frozen features, ``probe_epochs``), which every
  method starts from (the 256KB paper's Sec. 2.2 protocol);
* ``optimizer`` at the learning rates of a grid point (one rate for every trained tensor, or
  rates per parameter family: ``memplan.rates.Rates``), cosine decay to 0 over ``epochs`` epochs
  of batch ``batch_size``, no augmentation, norms in eval mode unless the method trains them with
  batch statistics, dropout active for every method (a cached frozen prefix ends before the first
  dropout: ``Worker.cache_point``);
* learning rate: chosen on **validation** by successive halving over ``val_seeds`` (every ``lrs``
  point at the first seed, the better half at the next; points that differ only in a family the
  method does not train are one; a run whose last loss is not finite, or whose accuracy is at
  chance, is diverged and never chosen; a tie goes to the smaller rate). A rate chosen at an edge
  of its grid widens the grid one step beyond it until the choice is interior (``widen`` times at
  most: ``transfer_protocol.method_grid``). Then ``seeds`` runs at that rate on the **test**
  split. The validation seeds and the test seeds are disjoint (the protocol refuses otherwise):
  no test run re-scores a model a choice was made on;
* memory, bytes, optimizer state counted: ``applied`` (the run as trained: memplan's lean
  modules, eager PyTorch on the CPU, at the training batch, fp32 state; the primary column) and
  ``tinytraining`` (the 256KB paper's analytic memory, batch 1, state at the parameter's bits).

Methods: classifier only; bias only (every bias and norm shift); norm + bias (batch statistics),
norm + bias with running statistics and with statistics re-estimated on the training data (the
probe head re-fit on them: ``Worker.train_plan``); weights + biases of the last k convs (k = 1, 2,
4); TinyTL lite residual + bias (``tinytl-lb``); MobileTL; full fine-tuning; the natural
hand-made schemes of ``memplan.search.baselines`` at the largest k that fits each budget (every
bias + the weights of the last k convs; the biases of the last k convs); and, with a ``profile``,
``validated B`` for each of ``budgets``: what ``memplan search B --validate N`` returns (the search
in ``applied`` mode at the training batch over the profile, then the validation stage,
``memplan.search.stage``: N searched candidates and every baseline that fits, the natural schemes
included, successive halving on the validation split with the same seeds, the baselines' runs
shared, its grid widened like the methods'), trained on test at the rate the stage chose.
``--schemes`` adds scheme files as methods. A method that trains exactly what an earlier one
trains shares its runs.

Verdicts (``transfer_report.comparisons``): each validated row against the best baseline that fits
its budget: the CI verdict (95% Student-t intervals apart or not), the paired per-seed difference
with its paired-t p-value, and the Holm-corrected verdict across the report's budgets
(``transfer_stats``).

Outputs in ``--out``: ``transfer.runs.jsonl`` (the checkpoint: one line per finished run,
fsync'ed, with the protocol's sha256; rerunning skips them), ``NAME.json``, ``NAME.md`` (the
table: method, memory in bytes, test accuracy mean +- 95% CI over seeds, learning rate, wall time;
the verdicts) and ``NAME.png`` (accuracy against memory, log x axis, error bars = 95% CI, Pareto
front marked). ``--workers N`` runs N processes on one checkpoint: each takes the next job (a
method, or a budget's stage and its row) that no other holds, and a run is claimed before it
trains, so none trains twice; jobs that need the same runs (a stage and its replay) split them
(``transfer_runs.obtain_all``); ``--report`` only assembles the outputs from the checkpoint.

Devices: every run records where it trained (``cpu``, or a GPU's name: ``--device cuda``, TF32
off). Each device's runs are a replicate of the protocol of their own (``transfer_protocol.counted``):
a process trains what its device lacks, a report counts one device's runs (the CPU's; ``--runs-of``
another's), and the runs trained on two devices pair as the device effect the report states
(``--pairs-of DEVICE`` trains here DEVICE's final runs at its choices, for pairs alone).
``--merge`` joins a checkpoint written on another machine (``benchmarks/transfer_device.sh``).

Run: python benchmarks/transfer.py --protocol benchmarks/protocols/lite0-fashion-mnist.json
--out DIR [--workers 2] [--report]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from transfer_protocol import (
    CLI_FIELDS,
    ROOT,
    TIES,
    BenchProtocol,
    device_of,
    device_order,
    device_pairs,
    grid_rungs,
    latest,
    load_protocol,
    missing_runs,
    redone,
    rules_of,
    run_id,
    stage_family,
    stage_name,
)
from transfer_report import (
    VALIDATED,
    assemble,
    chosen_lr,
    comparisons,
    left_out,
    markdown,
    plot,
    trainings,
    verdicts,
)
from transfer_runs import (
    MEMORY_COLUMNS,
    Bench,
    Method,
    Run,
    baselines,
    checkpoint_lines,
    claim_path,
    counting,
    device_name,
    memory_of,
    natural_methods,
    obtain_all,
    refresh,
    scheme_method,
    share_runs,
    strategy_method,
    validated,
)
from transfer_stats import mean_ci, paired, pareto_front, unstable_seeds, validation_error

from memplan.api import capture, profile_captured
from memplan.contrib.checkpoint import Checkpoint
from memplan.contrib.protocol import Protocol
from memplan.contrib.runner import linear_probe, resolve_device
from memplan.contrib.setup import Split, build_setup
from memplan.errors import MemplanError
from memplan.io import exclusive, save_state, write_text
from memplan.optim import OPTIMIZERS
from memplan.plan import load_scheme
from memplan.rates import Rates
from memplan.units import parse_bytes

#: what tests and callers read from this module besides its own functions (the transfer_* modules define them)
__all__ = ["VALIDATED", "Bench", "Method", "grid_rungs", "mean_ci", "pareto_front", "strategy_method"]

#: protocol fields whose command-line form is a comma-separated list
LISTS = {"lrs": Rates.parse, "stage_lrs": Rates.parse, "seeds": int, "val_seeds": int, "budgets": str}


# ----------------------------------------------------------------------------- options
def _arguments(ap: argparse.ArgumentParser) -> None:
    """The command line: the protocol file, the protocol's fields (each may only repeat the file's
    value) and what a run does (methods, output, workers)."""
    ap.add_argument("--protocol", default=None, help="the protocol file (benchmarks/protocols/*.json): required")
    for name, f in BenchProtocol.model_fields.items():
        if name in CLI_FIELDS:
            listed = " (comma-separated)" if name in LISTS else ""
            ap.add_argument(f"--{name.replace('_', '-')}", default=None, help=f"{f.description or name}{listed}")
    ap.add_argument("--methods", default=None, help="comma-separated method names to run (default: all)")
    ap.add_argument(
        "--schemes", default="", help="comma-separated scheme JSON files, each one more method (named by its file stem)"
    )
    ap.add_argument(
        "--name",
        default="transfer",
        help="outputs NAME.json / .md / .png (the checkpoint is always transfer.runs.jsonl)",
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "transfer_results"))
    ap.add_argument(
        "--workers", type=int, default=1, help="processes that take the methods and stages in turn (one core each)"
    )
    ap.add_argument("--report", action="store_true", help="only assemble the outputs from the checkpoint")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu | cuda | auto: where the runs train (each run records it)")
    ap.add_argument(
        "--runs-of",
        default=None,
        help="the device whose runs count, as runs record it: cpu or a GPU's name (default: --device's); each "
        "device's runs are a replicate of their own, e.g. --report --runs-of 'NVIDIA H200' --name transfer-h200",
    )
    ap.add_argument(
        "--pairs-of",
        default=None,
        help="the device whose final runs to train again here, each method at the rate that device chose (its "
        "stages' schemes too), no choice made here: pairs for the device effect (e.g. --device cuda --pairs-of cpu "
        "--methods 'validated 30MB')",
    )
    ap.add_argument(
        "--merge",
        default=None,
        help="a checkpoint of the same setup written elsewhere (a GPU machine's copy): its runs this one lacks are "
        "appended, then the report is rewritten",
    )
    ap.add_argument(
        "--verdicts-only",
        action="store_true",
        help="train only the jobs the verdicts need: the methods that fit a budget and the stages (the rest, "
        "full fine-tuning among them, in a later run without it)",
    )
    ap.add_argument("--no-progress", action="store_true")


def _given(name: str, text: str) -> Any:
    """A protocol option as typed on the command line, in the protocol file's form."""
    if name in LISTS:
        items = [x.strip() for x in text.split(",") if x.strip()]
        return [str(Rates.parse(x)) for x in items] if LISTS[name] is Rates.parse else [LISTS[name](x) for x in items]
    field = BenchProtocol.model_fields[name].annotation
    if text == "none" and "None" in str(field):
        return None
    return float(text) if "float" in str(field) else int(text) if "int" in str(field) else text


def _with_protocol(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """``a``'s protocol fields from the file (``a.protocol_sha256``, ``a.notes`` beside them); an
    option given on the command line must say what the file says."""
    if a.protocol is None:
        ap.error(
            "give --protocol FILE: the benchmark runs only a protocol fixed before the runs (benchmarks/protocols/)"
        )
    try:
        proto, a.protocol_sha256 = load_protocol(a.protocol)
    except MemplanError as exc:
        ap.error(str(exc))
    for name in CLI_FIELDS:
        value = getattr(proto, name)
        text = getattr(a, name)
        if text is not None:
            try:
                given = _given(name, text)
            except (ValueError, MemplanError) as exc:
                ap.error(f"cannot read --{name.replace('_', '-')} {text!r}: {exc}")
            if given != value:
                ap.error(
                    f"--{name.replace('_', '-')} {text} contradicts the protocol's {value!r} ({a.protocol}): change "
                    "the protocol file before the runs, not the command line"
                )
        setattr(a, name, value)
    a.notes, a.ties = proto.notes, proto.ties


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, with the protocol's fields read from ``--protocol`` and the lists parsed
    (``lrs``, ``stage_lrs`` as rates); bad input exits 2 with one line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _arguments(ap)
    a = ap.parse_args(argv)
    _with_protocol(ap, a)
    a.lrs = [Rates.parse(x) for x in a.lrs]
    a.stage_lrs = [Rates.parse(x) for x in a.stage_lrs]
    if a.workers < 1:
        ap.error(f"--workers must be at least 1, got {a.workers}")
    if a.profile is not None and not Path(a.profile).is_file():
        ap.error(f"the protocol's profile {a.profile}: no such file")
    try:
        a.device = resolve_device(a.device)
    except MemplanError as exc:
        ap.error(str(exc))
    if a.runs_of is not None and not a.report and a.runs_of != device_name(a.device):
        ap.error(f"--runs-of {a.runs_of!r} counts another device's runs than --device trains: only with --report")
    if a.pairs_of is not None and (a.report or a.runs_of is not None):
        ap.error("--pairs-of trains here what another device trained: not with --report or --runs-of")
    if a.pairs_of is not None and a.pairs_of == device_name(a.device):
        ap.error(f"--pairs-of {a.pairs_of!r} is the device these runs train on: name another (cpu, or a GPU's name)")
    if a.merge is not None and not Path(a.merge).is_file():
        ap.error(f"--merge {a.merge}: no such file")
    return a


# ----------------------------------------------------------------------------- the run
def start(a: argparse.Namespace) -> Run:
    """The setup, the checkpoint (its finished runs) and the linear-probe head (trained once, then
    loaded: every method of every worker starts from the same head)."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    protocol = Protocol(
        seeds=tuple(a.seeds),
        epochs=a.epochs,
        batch_size=a.batch_size,
        optimizer=a.optimizer,
        probe_epochs=a.probe_epochs,
        probe_lr=a.probe_lr,
    )
    setup = build_setup(
        a.model,
        None if a.weights == "none" else a.weights,
        a.data,
        resolution=a.resolution,
        split=Split(a.validation, a.train_per_class, a.test_per_class, a.split_seed),
    )
    # the grid and the seeds are not part of the identity: every run's id names its lr and seed, so
    # widening the grid or adding seeds keeps the finished runs
    identity = {**setup.identity(), "protocol": protocol.identity(exclude={"seeds"})}
    ckpt = Checkpoint(out / "transfer.runs.jsonl", identity)
    head_path = out / "transfer.head.pt"
    if a.merge is not None and ckpt.finished(repair=False) is None:
        adopt(Path(a.merge), ckpt, head_path)
    previous = ckpt.finished()  # None: no checkpoint yet
    head = setup.net.get_submodule(setup.head)
    if head_path.is_file() and previous is not None:
        stored = torch.load(head_path, map_location="cpu", weights_only=True)
        head.load_state_dict(stored["head"])
        probe = float(stored["accuracy"])
    elif a.report:
        raise MemplanError(f"nothing measured yet in {out}", "run without --report first")
    else:
        probe = linear_probe(setup.net, setup.head, setup.task.validation_task(), protocol)
        save_state(head_path, {"head": head.state_dict(), "accuracy": torch.tensor(probe)})
        ckpt.start()
    run = Run(a, setup, protocol, ckpt, {}, probe, sha=a.protocol_sha256, device=a.runs_of or device_name(a.device))
    refresh(run)
    return run


def mergeable(other: Path, ckpt: Checkpoint) -> None:
    """A one-line error unless ``other`` is a checkpoint of ``ckpt``'s setup (its identity line)."""
    if Checkpoint(other, ckpt.identity).finished(repair=False) is None:
        raise MemplanError(f"--merge {other}: not a checkpoint of this benchmark (no identity line)")


def adopt(other: Path, ckpt: Checkpoint, head_path: Path) -> None:
    """``--merge`` into a folder with no checkpoint yet: the other checkpoint and the probe's head
    beside it become this folder's (its runs start from that head; its identity is checked as
    this folder's is), so that a protocol a GPU started goes on here; a one-line error without
    the head or for another setup."""
    head = other.parent / head_path.name
    mergeable(other, ckpt)
    if not head.is_file():
        raise MemplanError(
            f"--merge {other}: {ckpt.path.parent} has no checkpoint yet, and {head} is missing",
            "copy the probe's head (transfer.head.pt) the other machine wrote beside its checkpoint",
        )
    write_text(ckpt.path, other.read_text())
    save_state(head_path, torch.load(head, map_location="cpu", weights_only=True))


def split_names(text: str, names: set[str]) -> set[str]:
    """The names a comma-separated ``text`` lists, where a name may hold commas itself ("norm + bias,
    running statistics"): the longest run of comma-separated pieces that is a known name wins."""
    pieces = [p.strip() for p in text.split(",")]
    out, i = set(), 0
    while i < len(pieces):
        j = next((j for j in range(len(pieces), i, -1) if ", ".join(pieces[i:j]) in names), None)
        if j is None:
            raise MemplanError(f"unknown method {pieces[i]!r}", f"choose among: {', '.join(sorted(names))}")
        out.add(", ".join(pieces[i:j]))
        i = j
    return out


def choose_methods(run: Run) -> None:
    """The baselines, the natural schemes at each budget, the scheme files and the validated rows
    whose stage is finished (``--methods`` keeps some), with their memory; ``run.stages``: the
    budgets whose stage is to run (kept by ``--methods``)."""
    a, setup = run.a, run.setup
    caps: dict[tuple[str | None, int], Any] = {}

    def cap_at(arch: str | None, batch: int) -> Any:
        if (arch, batch) not in caps:
            caps[arch, batch] = capture(
                setup.name, resolution=a.resolution, classes=setup.task.classes, method=arch, batch=batch
            )
        return caps[arch, batch]

    run.cap_at = cap_at
    cap = cap_at(None, 1)
    budgets = a.budgets

    def applied(scheme: Any) -> int:  # as the budgets count: applied mode at the training batch
        prof = profile_captured(
            cap_at(None, a.batch_size), "sparse", mode="applied", optimizer=a.optimizer, scheme=scheme
        )
        return prof.totals.total_bytes

    methods = baselines(cap)
    run.profile = Path(a.profile) if a.profile else None
    methods += [
        scheme_method(Path(f).stem, "scheme", load_scheme(f), file=f) for f in filter(None, a.schemes.split(","))
    ]
    methods += natural_methods(cap, budgets, applied)
    run.runs_of = share_runs(methods, cap.graph)
    rules = rules_of(a.rule)
    stages = {stage_name(b, r, a.rule): b for b in budgets for r in rules} if run.profile is not None else {}
    keep = None
    if a.methods:
        keep = split_names(a.methods, {m.name for m in methods} | {m.family for m in methods} | {*stages, VALIDATED})
    kept = [b for name, b in stages.items() if keep is None or name in keep or VALIDATED in keep]
    run.stages = list(dict.fromkeys(kept))
    bench = Bench(run.setup, run.protocol, a.threads, a.device)
    for b in run.stages:  # the finished stages, every rule's row (a stage job trains the rest: train)
        found = [validated(run, bench, cap, b, train_missing=False, rule=r) for r in rules]
        methods += [m for m in found if m is not None]
    share_runs(methods, cap.graph)  # before --methods: a kept method may train what a left-out one trains
    if keep is not None:
        methods = [m for m in methods if m.name in keep or m.family in keep or m.lr is not None]
    run.methods = []
    for m in methods:
        describe(run, m)


def describe(run: Run, m: Method) -> None:
    """``m`` into ``run.methods`` (in place of a method of its name) with its memory and what it
    trains (which decides the grid points that are distinct for it)."""
    run.methods = [x for x in run.methods if x.name != m.name] + [m]
    run.memory[m.name] = memory_of(run.cap_at, m, run.a.optimizer, run.a.batch_size)
    g = run.cap_at(m.arch, 1).graph
    with contextlib.suppress(MemplanError):  # not applicable to this model: it fails where it is trained
        m.families = m.plan(g).families(g)


def train_method(run: Run, bench: Bench, m: Method) -> None:
    """``m``'s grid on validation (successive halving, widened beyond a chosen edge) unless the
    stage chose its rate, then its test seeds at the chosen rate; every run checkpointed."""
    a = run.a
    while m.lr is None and (todo := missing_runs(m.key, m.settings(a.lrs), refresh(run), a.val_seeds, a.widen)):
        obtain_all(run, [(run_id("grid", m.key, lr, s), partial(bench.run, m, lr, s, "validation")) for lr, s in todo])
    best = chosen_lr(m, a, refresh(run))[1]
    if best is None:
        print(f"{m.name}: every learning rate of the grid diverged; widen the protocol's lrs", file=sys.stderr)
        return
    obtain_all(run, [(run_id("final", m.key, best, s), partial(bench.run, m, best, s, "test")) for s in a.seeds])


def job_order(
    own: list[Method], applied: dict[str, int], budgets: list[str], stages: list[str], rest: bool = True
) -> list[Method | str]:
    """The jobs budget by budget, the smallest first, so that each budget's verdict is complete
    before the next budget's work starts: the methods choosing their own rate that fit it
    (``applied`` bytes) and no smaller budget, then its stage (a budget of ``stages``); then, with
    ``rest``, the methods that fit no budget (the verdicts need none of them). Methods keep their
    order within a budget."""
    jobs: list[Method | str] = []
    left = list(own)
    for b in sorted(budgets, key=parse_bytes):
        limit = parse_bytes(b)
        jobs += [m for m in left if applied[m.name] <= limit]
        left = [m for m in left if applied[m.name] > limit]
        jobs += [b] if b in stages else []
    return [*jobs, *left] if rest else jobs


def train(run: Run, t_start: float) -> None:
    """The jobs of :func:`job_order`: each method that chooses its own rate (its grid, then its test
    seeds), each stage (``memplan search --validate`` at a budget, then its row's test seeds); then
    each budget's stage under every other choice rule (a replay on the same runs, widened where its
    choice is at an edge, then its row's test seeds: ``transfer_protocol.rules_of``). A
    job is claimed before it runs (a lock: ``transfer_runs.claim_path``), so workers sharing the
    checkpoint take the jobs in turn; a job another live worker holds is left to it. The report is
    rewritten after each job."""
    a = run.a
    bench = Bench(run.setup, run.protocol, a.threads, a.device)
    own = [m for m in run.methods if m.lr is None]
    applied = {m.name: run.memory[m.name]["applied"] for m in own}
    jobs: list[Method | str | tuple[str, str]] = [*job_order(own, applied, a.budgets, run.stages, not a.verdicts_only)]
    jobs += [(rule, b) for rule in rules_of(a.rule)[1:] for b in run.stages]  # replays, after every verdict's job
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), disable=a.no_progress
    )
    with progress:
        bar = progress.add_task("transfer", total=len(jobs))
        for job in jobs:
            rule, budget = job if isinstance(job, tuple) else (a.rule, job)
            name = job.name if isinstance(job, Method) else stage_name(budget, rule, a.rule)
            progress.update(bar, description=name)
            with exclusive(claim_path(run, f"job {name}"), wait=False) as mine:
                if mine:
                    if not isinstance(job, Method):  # a stage under a rule, then its row
                        job = validated(run, bench, run.cap_at(None, 1), budget, rule=rule)
                        describe(run, job)
                    train_method(run, bench, job)
            if mine:
                report(run, t_start, echo=False)
            progress.advance(bar)


def train_pairs(run: Run) -> None:
    """``--pairs-of DEVICE``: on this process's device, the final runs ``DEVICE`` recorded that this
    device lacks, each method at the rate ``DEVICE`` chose (``run.methods`` were chosen from its
    runs: its stages' schemes too); no grid, no choice here, so each run pairs with ``DEVICE``'s as
    the device effect. Each method is a job claimed like :func:`train`'s."""
    a = run.a
    bench = Bench(run.setup, run.protocol, a.threads, a.device)
    with counting(run, a.pairs_of) as done:
        theirs = dict(done)
    for m in run.methods:
        lr = m.lr if m.lr is not None else chosen_lr(m, a, theirs)[1]
        seeds = [s for s in a.seeds if lr is not None and run_id("final", m.key, lr, s) in theirs]
        with exclusive(claim_path(run, f"pairs {m.name}"), wait=False) as mine:
            if mine:
                obtain_all(run, [(run_id("final", m.key, lr, s), partial(bench.run, m, lr, s, "test")) for s in seeds])


def in_workers(a: argparse.Namespace, argv: list[str]) -> None:
    """``--workers N``: N processes of this command (``--workers 1`` each, no progress bar) on one
    checkpoint, waited for; the report is written after them."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--workers", "1", "--no-progress"]
    procs = [subprocess.Popen(cmd) for _ in range(a.workers)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise MemplanError(f"a worker failed (exit codes {codes}); its error is above", "rerun: finished runs are kept")


def merge(run: Run, path: Path) -> int:
    """Append to ``run``'s checkpoint every run of the checkpoint at ``path`` that it lacks (by id
    and device: a run this one holds from another device is a device pair, kept); the same
    identity, else a one-line error; returns how many."""
    mergeable(path, run.ckpt)
    have = latest(checkpoint_lines(run.ckpt.path))
    new = [r for key, r in latest(checkpoint_lines(path)).items() if key not in have]
    for r in new:
        run.ckpt.append(r)
    refresh(run)
    print(f"merged {len(new)} runs from {path}", file=sys.stderr)
    return len(new)


def runs_redone(run: Run, records: list[dict]) -> list[dict[str, str]]:
    """The counted device's runs of the checkpoint's ``records`` redone or superseded, and why
    (``transfer_protocol.redone``); another device's runs are its own replicate, with its own
    choices."""
    chosen: dict[str, set[str]] = {}
    for m in run.methods:
        lr = chosen_lr(m, run.a, run.done)[1]
        if lr is not None:
            chosen.setdefault(m.key, set()).add(str(lr))
    mine = [r for r in records if device_of(r) == run.device]
    return redone(mine, run.sha, lambda key: chosen.get(key, set()))


def header_of(run: Run, records: list[dict]) -> dict[str, Any]:
    """What the report says about the setup, the protocol and the machine (``records``: the
    checkpoint's run records)."""
    a, setup, task, res = run.a, run.setup, run.setup.task, run.a.resolution
    return {
        "model": setup.name,
        "data": task.name,
        "description": (
            f"{setup.name} ({setup.weights.get('source')}) -> {task.name} at {res} px: "
            f"{task.x_train.shape[0]} training images, {task.x_val.shape[0]} validation images carved from the "
            f"training data (split seed {a.split_seed}), {task.x_test.shape[0]} test images (final numbers only). "
            f"Linear probe first ({a.probe_epochs} epochs, lr {a.probe_lr}; validation accuracy {run.probe:.2f}%), "
            "then every method: "
            f"{a.optimizer} ({OPTIMIZERS[a.optimizer].description}), the learning rate(s) of the LR column (one rate "
            f"for every trained tensor, or rates per family: biases / norms / head, then weights), {a.epochs} "
            f"epochs of batch {a.batch_size}, cosine decay, no augmentation."
        ),
        "protocol": str(a.protocol),
        "protocol_sha256": a.protocol_sha256,
        "ties": TIES,
        "rule": a.rule,
        "stage_sizes": a.stage_sizes,
        "widen": a.widen,
        "notes": a.notes,
        "redone": runs_redone(run, records),
        "memory_columns": {
            k: {"mode": v[0], "batch": a.batch_size if v[1] else 1, "state": v[3]} for k, v in MEMORY_COLUMNS.items()
        },
        "batch": a.batch_size,
        "input": f"3x{res}x{res}",
        "optimizer": a.optimizer,
        "seeds": a.seeds,
        "val_seeds": a.val_seeds,
        "lrs": [str(x) for x in a.lrs],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {a.threads} torch thread(s) per process, "
        f"torch {torch.__version__}",
        "counted_device": run.device,
        **devices(records, method_names(run.methods)),
    }


def method_names(methods: list[Method]) -> dict[str, str]:
    """Key runs are recorded under -> the names of the methods that train it, joined by " = "."""
    names: dict[str, list[str]] = {}
    for m in methods:
        names.setdefault(m.key, []).append(m.name)
    return {k: " = ".join(v) for k, v in names.items()}


def devices(records: list[dict], names: dict[str, str] | None = None) -> dict[str, Any]:
    """``runs_by_device``: the finished runs each device trained (one per id and device; a record
    that names none ran on the CPU); ``device_effect``: per pair of devices ``"B - A"``
    (``transfer_protocol.device_pairs``), B's final runs' test accuracy minus the same runs' on A
    (``transfer_stats.paired`` over the run ids trained on both: points, Student-t CI, p), over all
    of them and ``by_method`` (the key runs are recorded under, named by ``names``: key -> the
    methods' names): why each device's runs are a replicate of their own."""
    by = Counter(device_of(r) for r in latest(records).values())
    pairs = [(a, b) for a, b in device_pairs(records) if a["id"].startswith("final|")]
    key_of = lambda rec: rec["id"].split("|")[1]  # noqa: E731
    name_of = lambda key: (names or {}).get(key, key)  # noqa: E731

    def effect_of(on: list[tuple[dict, dict]]) -> dict[str, Any]:
        e = paired({b["id"]: b["accuracy"] for _, b in on}, {a["id"]: a["accuracy"] for a, _ in on})
        return {**e, "runs": e.pop("seeds")}

    effect = {}
    for da, db in sorted({(device_of(a), device_of(b)) for a, b in pairs}, key=lambda d: [*map(device_order, d)]):
        on = [(a, b) for a, b in pairs if (device_of(a), device_of(b)) == (da, db)]
        effect[f"{db} - {da}"] = effect_of(on) | {
            "by_method": {
                name_of(k): effect_of([(a, b) for a, b in on if key_of(a) == k])
                for k in sorted({key_of(a) for a, _ in on}, key=name_of)
            }
        }
    return {"runs_by_device": dict(by), "device_effect": effect}


def report(run: Run, t_start: float, echo: bool = True) -> dict[str, Any]:
    """Write NAME.json / .md / .png from every finished run in the checkpoint (other workers' too);
    returns the JSON. It counts the runs of one device (``run.device``: ``transfer_protocol.counted``)."""
    a, setup, task = run.a, run.setup, run.setup.task
    out, res = Path(a.out), a.resolution
    records = checkpoint_lines(run.ckpt.path)  # read once: other processes append while this one reports
    rows = assemble(run.methods, run.memory, a, refresh(run, records))
    front = pareto_front(rows)
    shown, described = {r["name"] for r in rows}, {m.name for m in run.methods}
    missing = [
        {
            "name": m.name,
            "method": m.family,
            "memory_bytes": run.memory[m.name]["applied"],
            "status": left_out(m, a, run.done),
        }
        for m in run.methods
        if m.name not in shown
    ] + [  # a stage not finished has no scheme yet, so no memory
        {
            "name": stage_name(b, r, a.rule),
            "method": stage_family(r, a.rule),
            "memory_bytes": None,
            "status": "its validation stage is not finished",
        }
        for r in rules_of(a.rule)
        for b in run.stages
        if stage_name(b, r, a.rule) not in described
    ]
    by_rule = {r: comparisons(rows, missing, stage_family(r, a.rule)) for r in rules_of(a.rule)}
    compared = by_rule.pop(a.rule)
    lines = verdicts(rows, compared)
    replays = {r: verdicts(rows, c) for r, c in by_rule.items()}
    header = header_of(run, records)
    result = {
        **header,
        "probe_validation_accuracy": run.probe,
        "profile": str(run.profile) if run.profile else None,
        "rows": rows,
        "pareto_front": front,
        "unstable_seeds": unstable_seeds(rows),
        "validation_error": validation_error(trainings(rows)),
        "comparisons": compared,
        "verdicts": lines,
        "replayed_rules": {r: {"comparisons": by_rule[r], "verdicts": replays[r]} for r in by_rule},
        "missing": missing,
        "report_wall_s": round(time.perf_counter() - t_start, 1),
        "total_run_wall_s": round(sum(r["wall_s"] for r in rows), 1),
    }
    write_text(out / f"{a.name}.json", json.dumps(result, indent=1) + "\n")
    md = markdown(
        rows, header, front, lines, result["missing"], result["unstable_seeds"], replays, result["validation_error"]
    )
    write_text(out / f"{a.name}.md", md)
    if rows:
        title = f"{setup.name} -> {task.name} ({res} px): accuracy vs training memory"
        xlabels = {
            "applied": f"applied: as trained, batch {a.batch_size}, {a.optimizer} fp32 state (bytes, log)",
            "tinytraining": f"tinytraining: batch 1, {a.optimizer} state at parameter bits (bytes, log)",
        }
        plot(rows, front, out / f"{a.name}.png", title, xlabels)
    if echo:
        print(md)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run (or with ``--report`` only assemble) the benchmark; returns NAME.json's content."""
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    t_start = time.perf_counter()
    run = start(a)
    if a.merge is not None:
        merge(run, Path(a.merge))
    elif a.workers > 1 and not a.report:
        in_workers(a, argv)
    with counting(run, a.pairs_of or run.device):  # --pairs-of: the methods chosen from its runs
        choose_methods(run)
    if a.pairs_of is not None and a.merge is None and a.workers == 1:
        train_pairs(run)
    elif not a.report and a.merge is None and a.workers == 1:
        train(run, t_start)
    return report(run, t_start)


if __name__ == "__main__":
    try:
        main()
    except MemplanError as exc:
        print(f"transfer: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
