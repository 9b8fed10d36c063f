"""The transfer benchmark's protocol (benchmarks/transfer.py), fixed before the runs:

* the protocol file (``benchmarks/protocols/*.json``, committed before its runs start): the
  backbone, data, budgets, learning-rate grids, seeds and epochs; the benchmark refuses to run
  without one, refuses a command-line option that contradicts it, and its report states the
  file's sha256 (:func:`load_protocol`);
* the validation stage's choice rule (``rule``, ``memplan.search.rules``): the protocol's rule
  makes the verdicts; every other registered rule is replayed on the same validation runs and its
  rows are reported beside them, never as the protocol's verdicts (:func:`rules_of`);
* the choice of a method's learning rate on validation (:func:`grid_rungs`, :func:`choose_lr`):
  successive halving over the validation seeds, the best mean validation accuracy wins, a tie
  goes to the smaller rate (:data:`TIES`);
* grids without edges (:func:`method_grid`): a rate chosen at an edge of its grid, and better
  than its neighbour there (a tie is a plateau), widens the grid one step beyond it
  (``memplan.rates.outward``) until the choice is interior, at most ``widen`` times;
* the device that counts (:func:`counted`): one device's runs per report (the CPU's by default,
  as memplan's ``pytorch`` mode is eager PyTorch on the CPU); a run trained on two devices pairs as
  the device effect (:func:`device_pairs`);
* the runs redone (:func:`redone`): what the checkpoint holds twice, under another protocol, or
  at a rate no longer chosen.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from memplan.errors import BadOption, MemplanError
from memplan.rates import Rates, outward
from memplan.search.baselines import SIZE_RULES
from memplan.search.rules import CHOICE_RULES

ROOT = Path(__file__).resolve().parents[1]
#: the tie rule, as the report states it
TIES = (
    "the higher mean validation accuracy wins; a tie goes to the smaller rate (rates compared family by family: "
    "classifier, bias, norm, weight) and, in the validation stage, first to the cheaper candidate"
)


#: the family of the validated rows made by the protocol's own choice rule (the verdicts)
VALIDATED = "searched + validated"
#: the device whose runs a report counts unless told another (a record that names none ran on the CPU)
REFERENCE_DEVICE = "cpu"


class BenchProtocol(BaseModel):
    """Everything a run of the benchmark is fixed by (every field required: the file states it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    weights: str = Field(description="zoo | a state_dict file | none (as built)")
    data: str = Field(description="a data source of memplan.contrib.data (paths from the repo root, where it runs)")
    resolution: int = Field(gt=0)
    train_per_class: int = Field(gt=0)
    validation: int = Field(gt=0, description="validation images per class, carved from training")
    test_per_class: int | None = Field(description="None: the whole test split")
    split_seed: int = Field(
        0,
        ge=0,
        description="seed of the training/validation split (memplan.contrib.data; absent: 0, the split of the "
        "protocols written before it existed): another seed is a fresh replicate of the same task",
    )
    epochs: int = Field(gt=0)
    batch_size: int = Field(gt=0)
    optimizer: str
    lrs: list[str] = Field(min_length=1, description="every method's own grid (memplan.rates.Rates, as text)")
    seeds: list[int] = Field(min_length=1, description="test seeds")
    val_seeds: list[int] = Field(min_length=1, description="seeds of every choice on validation")
    probe_epochs: int = Field(gt=0)
    probe_lr: float = Field(gt=0)
    profile: str | None = Field(description="contribution profile of the validated rows (a path from the repo root)")
    budgets: list[str] = Field(description="budgets of the validated rows, applied memory at the training batch")
    validate_candidates: int = Field(gt=0, description="searched candidates of the validation stage per budget")
    stage_lrs: list[str] = Field(min_length=1, description="the validation stage's grid")
    widen: int = Field(ge=0, description="times a grid may widen beyond a chosen edge")
    ties: Literal["smaller rate"] = Field(description="the tie rule (TIES)")
    rule: str = Field(
        "best",
        description="the validation stage's choice rule (memplan.search.rules), whose rows are the verdicts; the "
        "others are replayed on the same validation runs beside them (absent: best, the rule before rules existed)",
    )
    stage_sizes: str = Field(
        "largest",
        description="which sizes of a sized baseline the validation stage trains (memplan.search.baselines."
        "SIZE_RULES; absent: largest, the only one before size rules existed)",
    )
    notes: list[str] = Field(default_factory=list, description="why the protocol is as it is; runs redone and why")

    @field_validator("lrs", "stage_lrs")
    @classmethod
    def _rates(cls, v: list[str]) -> list[str]:
        return [str(Rates.parse(x)) for x in v]

    @field_validator("rule")
    @classmethod
    def _rule(cls, v: str) -> str:
        CHOICE_RULES.choose(v)  # an unknown one: a one-line error naming the known ones
        return v

    @field_validator("stage_sizes")
    @classmethod
    def _sizes(cls, v: str) -> str:
        SIZE_RULES.choose(v)
        return v

    @field_validator("seeds", "val_seeds")
    @classmethod
    def _distinct(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError(f"seeds must be distinct, got {v}")
        return v

    def problems(self) -> list[str]:
        """What makes the protocol unfair, in words (empty when nothing)."""
        out = []
        if shared := sorted(set(self.seeds) & set(self.val_seeds)):
            out.append(f"test seeds {shared} are also validation seeds: a choice would be re-scored on its own seed")
        if self.profile is not None and not set(self.stage_lrs) <= set(self.lrs):
            out.append("stage_lrs must be rates of lrs (the baselines' own grid is never smaller)")
        return out


#: protocol fields that are options of the command line too (``--flag`` = the field's name with dashes)
CLI_FIELDS = tuple(f for f in BenchProtocol.model_fields if f not in ("ties", "notes"))


def load_protocol(path: str | Path) -> tuple[BenchProtocol, str]:
    """The protocol file and its sha256 (hex); BadOption (one line) when it cannot be read or is unfair."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        proto = BenchProtocol.model_validate(json.loads(raw))
    except OSError as exc:
        raise BadOption(f"protocol {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise BadOption(f"protocol {path} is not JSON: {exc}") from None
    except (ValidationError, MemplanError) as exc:
        first = exc.errors()[0] if isinstance(exc, ValidationError) else None
        what = f"{'.'.join(map(str, first['loc']))}: {first['msg']}" if first else str(exc)
        raise BadOption(f"protocol {path}: {what}") from None
    if problems := proto.problems():
        raise BadOption(f"protocol {path}: {problems[0]}")
    return proto, hashlib.sha256(raw).hexdigest()


def stage_family(rule: str, own: str) -> str:
    """The family of a validated row chosen by ``rule`` in a report whose protocol's rule is ``own``:
    :data:`VALIDATED` for the protocol's rows (the verdicts), ``VALIDATED [rule R]`` for a replay."""
    return VALIDATED if rule == own else f"{VALIDATED} [rule {rule}]"


def stage_name(budget: str, rule: str, own: str) -> str:
    """A validated row's name: ``validated B``, or ``validated B [rule R]`` for a replay."""
    return f"validated {budget}" if rule == own else f"validated {budget} [rule {rule}]"


def is_stage(family: str) -> bool:
    """Whether ``family`` is a validated row's (any rule's)."""
    return family.startswith(VALIDATED)


def rules_of(own: str) -> list[str]:
    """The choice rules a report shows: the protocol's ``own`` first, then every other registered one."""
    return [own, *(r for r in CHOICE_RULES if r != own)]


# ----------------------------------------------------------------------------- choosing a rate
def run_id(stage: str, method: str, lr: Rates, seed: int) -> str:
    """``stage|method|rates|seed`` (one rate for every family reads as that rate: ``0.0025``)."""
    return f"{stage}|{method}|{lr}|{seed}"


def _mean(runs: list[dict]) -> float:
    return statistics.fmean(r["accuracy"] for r in runs)


def grid_rungs(method: str, lrs: list[Rates], val_seeds: list[int], done: dict[str, dict]) -> list[list[Rates]]:
    """The learning rates each validation seed trains (successive halving): every point at the first
    seed, then the better half (at least two) of the rates still in at each further seed, ranked by
    their mean validation accuracy over the seeds so far (a diverged run drops its rate; a tie goes
    to the smaller rate). Stops at the first rung that is not finished."""
    rungs, alive = [], sorted(lrs)
    for i in range(len(val_seeds)):
        rungs.append(alive)
        runs = {lr: [done.get(run_id("grid", method, lr, s)) for s in val_seeds[: i + 1]] for lr in alive}
        if any(r is None for rs in runs.values() for r in rs):
            break
        ok = [lr for lr in alive if not any(r["diverged"] for r in runs[lr])]
        ok.sort(key=lambda lr: -_mean(runs[lr]))  # stable: the smaller rate first on a tie
        alive = ok[: max(2, len(ok) // 2)]
        if not alive:
            break
    return rungs


def choose_lr(method: str, lrs: list[Rates], done: dict[str, dict], val_seeds: Sequence[int]) -> Rates | None:
    """The rate with the best mean validation accuracy over every validation seed, the smaller rate
    on a tie (None until the last rung of :func:`grid_rungs` is finished, or when every rate diverged)."""
    val_seeds = list(val_seeds)
    rungs = grid_rungs(method, lrs, val_seeds, done)
    if len(rungs) < len(val_seeds):
        return None
    runs = {lr: [done.get(run_id("grid", method, lr, s)) for s in val_seeds] for lr in rungs[-1]}
    if any(r is None for rs in runs.values() for r in rs):
        return None
    ok = [(-_mean(rs), lr) for lr, rs in runs.items() if not any(r["diverged"] for r in rs)]
    return min(ok)[1] if ok else None


def pulled(key: str, best: Rates, inner: Rates, done: dict[str, dict], val_seeds: Sequence[int]) -> bool:
    """Whether ``best`` (at an edge of its grid) beats its neighbour ``inner`` on the validation seeds
    both ran: the data pull it to the edge; a tie is a plateau the tie rule's smaller rate sits on.
    A neighbour that diverged (or never ran) pulls."""
    pairs = [(done.get(run_id("grid", key, best, s)), done.get(run_id("grid", key, inner, s))) for s in val_seeds]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    if not pairs or any(b["diverged"] for _, b in pairs):
        return True
    return _mean([a for a, _ in pairs]) > _mean([b for _, b in pairs])


def method_grid(
    key: str, grid: list[Rates], done: dict[str, dict], val_seeds: Sequence[int], widen: int
) -> tuple[list[Rates], Rates | None, bool]:
    """The grid the method recorded as ``key`` uses, the rate chosen on it (None until chosen) and
    whether that rate is still at an edge the data pull it to: ``grid``, widened one step beyond
    the chosen rate while it lies at such an edge (:func:`pulled`), at most ``widen`` times;
    decided by the finished runs alone, so every process and the report agree."""
    grid = sorted(grid)
    for step in range(widen + 1):
        best = choose_lr(key, grid, done, val_seeds)
        edges = [] if best is None else outward(grid, best)
        beyond = [b for b, inner in edges if b not in grid and pulled(key, best, inner, done, val_seeds)]
        if not beyond or step == widen:
            return grid, best, bool(beyond)
        grid = sorted(grid + beyond)
    raise AssertionError("not reached: the last step returns")


def missing_runs(
    key: str, grid: list[Rates], done: dict[str, dict], val_seeds: Sequence[int], widen: int
) -> list[tuple[Rates, int]]:
    """The validation runs the method must train next: those of the first unfinished rung of its
    (widened) grid; empty once its rate is chosen or every rate diverged."""
    used = method_grid(key, grid, done, val_seeds, widen)[0]
    for i, rung in enumerate(grid_rungs(key, used, list(val_seeds), done)):
        todo = [(lr, val_seeds[i]) for lr in rung if run_id("grid", key, lr, val_seeds[i]) not in done]
        if todo:
            return todo
    return []


# ----------------------------------------------------------------------------- devices
def device_of(rec: dict) -> str:
    """The device a run record trained on: ``cpu`` or a GPU's name (none recorded: the CPU)."""
    return rec.get("device", REFERENCE_DEVICE)


def counted(records: Sequence[dict], device: str = REFERENCE_DEVICE) -> dict[str, dict]:
    """Run id -> the record that counts, of the checkpoint's ``records`` (file order): the last of
    ``device``'s (``cpu`` or a GPU's name as runs record it).

    Each device's runs are a replicate of the protocol of their own, and a report counts one
    device's: a GPU's float kernels (TF32 convolutions under cuDNN among them) give another
    accuracy for one seed, and on Lite0 an H200 scored higher than the CPU on the same runs (the
    report's device lines), so no verdict sets a GPU run against a CPU one. A process trains what
    its own device lacks; a run trained on two devices pairs as the device effect
    (:func:`device_pairs`)."""
    return {rec["id"]: rec for rec in records if device_of(rec) == device}


def latest(records: Sequence[dict]) -> dict[tuple[str, str], dict]:
    """(run id, device) -> the last record of that run on that device, in file order."""
    return {(r["id"], device_of(r)): r for r in records}


def device_order(device: str) -> tuple[bool, str]:
    """Sort key of devices: the CPU first, then the others by name."""
    return device != REFERENCE_DEVICE, device


def device_pairs(records: Sequence[dict]) -> list[tuple[dict, dict]]:
    """(record on device A, record on device B) of every run id trained on two devices, A before B
    in :func:`device_order` (the CPU first), the last record of each: the same run, so B's accuracy
    minus A's is the difference the devices make (in file order of B's records)."""
    last = latest(records)
    on: dict[str, list[str]] = {}  # run id -> the devices that trained it, in device_order
    for rid, dev in sorted(last, key=lambda k: device_order(k[1])):
        on.setdefault(rid, []).append(dev)
    return [
        (last[(rid, a)], rec) for (rid, b), rec in last.items() for a in on[rid] if device_order(a) < device_order(b)
    ]


# ----------------------------------------------------------------------------- runs redone
def redone(lines: Sequence[dict], sha: str, chosen: Callable[[str], set[str]]) -> list[dict[str, str]]:
    """The runs of the checkpoint's ``lines`` (its ``run`` records, in file order) that are redone
    or superseded, each with why (``lines``: one device's, ``counted``'s replicate): an id recorded
    more than once (a second process or a rerun trained it again; the last record counts), a run
    recorded under another protocol (its ``protocol_sha256``; kept when the id is the same, since
    an id fixes the training), and a final run at a rate no method recorded under its
    name chooses now (``chosen(key)``: the rates, as text, the methods recorded as ``key`` choose
    now; empty while none has chosen)."""
    out, seen = [], {}
    for rec in lines:
        rid = rec["id"]
        if rid in seen:
            out.append({"id": rid, "why": "recorded twice: trained again (a process beside another, or a rerun)"})
        seen[rid] = rec
        other = rec.get("protocol_sha256")
        if other is not None and other != sha:
            out.append({"id": rid, "why": f"trained under protocol {other[:12]}, not this one"})
    for rid in seen:
        stage, rest = rid.split("|", 1)
        method, lr, _ = rest.rsplit("|", 2)
        now = chosen(method) if stage == "final" else set()
        if now and lr not in now:
            out.append({"id": rid, "why": f"superseded: {method} now trains at {', '.join(sorted(now))}, not {lr}"})
    return out
