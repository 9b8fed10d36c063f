"""The protocol of ``mcu_transfer.py`` (the 256KB paper's setting on CIFAR-10): its settings, the
rows of each experiment, the finished runs it reads back, and the rate each row is trained at
(:func:`select`: the grid, its widening, the divergence rule)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from memplan.models.int8.updates import PAPER_SCHEMES, Update, last_k_weights

MODEL = "mcunet-5fps"
N_CONVS = 42
CHANCE = 10.0  # CIFAR-10 chance accuracy, %
PROTOCOL = {
    "model": MODEL,
    "data": "CIFAR-10 (JPEG copy, ../shared/datasets/cifar10)",
    "train_per_class": 500,
    "val_per_class": 100,
    "resolution": 128,
    "epochs": 12,
    "warmup_epochs": 1,
    "batch": 64,
    "augment": "random-resized crop (0.08-1, 3/4-4/3), flip, colour jitter 0.4",
    "selection_seeds": [100],
    "test_seeds": [0, 1, 2, 3, 4],
    "grids": {
        "sgd": [0.01, 0.03, 0.1],
        "adam": [0.0003, 0.001, 0.003],
    },
    "grid_step": 3.0,
    "max_widen": 6,
    "tie_rule": "the smaller rate",
    "divergence_rule": (
        "a run diverged when its loss is not finite or it ends at chance (10%); a test seed that diverged at "
        "a row's chosen rate marks the rate unstable for that row: the rate is chosen again on validation among "
        "the rates below it (widening downwards while the choice is the lowest), every test seed trains at it, "
        "and the report lists the rate given up"
    ),
    # the contribution profile (experiment ``profile``): one run per entry at one rate on the
    # selection seed, validation split; a reduced grid (expand convs of the last 7 blocks, ratios
    # 1/4 and 1), what two CPU cores afford
    "profile": {
        "lr": 0.03,
        "bias_ks": [3, 6, 9, 12, 15, 18, 21, 22, 42],
        "weight_convs": [21, 24, 27, 30, 33, 36, 39],
        "ratios": [0.25, 1.0],
    },
}


#: Figure 9's families of rows (each row's ``family`` in the report): the two last-k sweeps, the
#: schemes ``memplan search`` found (each with its budget), the rest
BIASES_LAST_K, WEIGHTS_LAST_K, SEARCHED, OTHER = (
    "biases of the last k convs",
    "weights+biases of the last k convs",
    "memplan search",
    "other",
)


@dataclass(frozen=True)
class Row:
    """One row of an experiment: how it trains (``form``: int8 | fp32, the update, the optimizer),
    its family and, for a searched scheme, the budget it was searched under (bytes, 1000-based kB)."""

    form: str
    update: Update
    optimizer: str
    family: str = OTHER
    budget_bytes: int | None = None

    @property
    def spec(self) -> tuple[str, Update, str]:
        return self.form, self.update, self.optimizer


def fig9_rows() -> dict[str, Row]:
    """Figure 9's rows: the classifier, the two last-k sweeps, full update, the paper's 100 KB scheme
    and every shipped searched scheme."""
    rows = {"classifier only": Row("int8", Update(), "sgd-qas")}
    for k in (6, 12, 22, N_CONVS):
        rows[f"biases of the last {k} convs"] = Row("int8", Update(bias_last=k), "sgd-qas", BIASES_LAST_K)
    for k in (2, 4, 6, 12, 22):
        update = Update(bias_last=k, weights=last_k_weights(N_CONVS, k))
        rows[f"weights+biases of the last {k} convs"] = Row("int8", update, "sgd-qas", WEIGHTS_LAST_K)
    rows["full update"] = Row("int8", Update(full=True), "sgd-qas")
    rows["paper's 100 KB scheme"] = Row("int8", PAPER_SCHEMES["mcunet-5fps-paper-100KB"], "sgd-qas")
    rows.update(searched_schemes())
    return rows


def methods(p: dict | None = None) -> dict[str, dict[str, tuple[str, Update, str]]]:
    """experiment -> method name -> (form, update, optimizer) under protocol ``p`` (its profile grid;
    default :data:`PROTOCOL`)."""
    last2 = Update(blocks=2, description="last two blocks")
    return {
        "profile": {name: ("int8", u, "sgd-qas") for name, u in profile_entries((p or PROTOCOL)["profile"]).items()},
        "table1": {
            "fp32 SGD-M": ("fp32", last2, "sgd-momentum"),
            "int8 SGD-M": ("int8", last2, "sgd-momentum"),
            "int8 Adam": ("int8", last2, "adam"),
            "int8 SGD-M + QAS": ("int8", last2, "sgd-momentum-qas"),
            # the head alone on each form's frozen features (an fp32 head on both): how much of the
            # gap between fp32 and int8 + QAS above is the int8 forward, under this protocol
            "fp32 classifier only (SGD-M)": ("fp32", Update(), "sgd-momentum"),
            "int8 classifier only (SGD-M)": ("int8", Update(), "sgd-momentum"),
        },
        "fig9": {name: row.spec for name, row in fig9_rows().items()},
    }


#: the schemes ``memplan search`` found from this benchmark's profile (package data), trained as rows
SCHEME_GLOB = "mcunet-5fps-int8-cifar10-*.json"


def searched_schemes() -> dict[str, Row]:
    """Row name ("memplan 100 kB") -> row of every shipped scheme searched from the profile."""
    from memplan.io import shipped
    from memplan.plan.scheme import load_scheme

    out = {}
    for path in sorted(shipped("schemes").glob(SCHEME_GLOB), key=lambda f: load_scheme(f).budget_bytes or 0):
        scheme = load_scheme(path)
        update = Update(
            bias_last=scheme.bias_update,
            weights=tuple((w.conv_index, w.ratio) for w in scheme.weight_updates),
            description=path.name,
        )
        optimizer = scheme.optimizer or "sgd-qas"
        out[f"memplan {scheme.budget_bytes / 1000:g} kB"] = Row(
            "int8", update, optimizer, SEARCHED, scheme.budget_bytes
        )
    return out


def profile_entries(q: dict) -> dict[str, Update]:
    """The contribution profile's runs (``memplan.contrib.protocol``'s grid): the classifier,
    biases of the last k convs, and the weight of conv i at ratio r with the biases of convs
    i..L-1 (its reference: biases of the last L - i)."""
    out = {"classifier": Update()}
    ks = sorted(set(q["bias_ks"]) | {N_CONVS - i for i in q["weight_convs"]})
    out.update({f"bias {k}": Update(bias_last=k) for k in ks})
    for i in q["weight_convs"]:
        for r in q["ratios"]:
            out[f"weight {i}@{r:g}"] = Update(bias_last=N_CONVS - i, weights=((i, r),))
    return out


def reuse(runs: dict[str, dict], log: Path, table: dict) -> None:
    """Profile runs that another experiment already made (the same form, update, optimizer, rate
    and seed; ``table``: :func:`methods`) are copied into ``log`` under the profile's id, marked
    ``reused_from``."""
    made = {
        (spec_of(table[r["experiment"]][r["method"]]), r["lr"], r["seed"]): r
        for r in runs.values()
        if r["experiment"] != "profile" and r["method"] in table.get(r["experiment"], {})
    }
    for name, spec in table["profile"].items():
        for (key, lr, seed), r in made.items():
            new = job_id("profile", name, lr, seed)
            if key == spec_of(spec) and new not in runs:
                runs[new] = {**r, "id": new, "experiment": "profile", "method": name, "reused_from": r["id"]}
                with open(log, "a") as f:
                    f.write(json.dumps(runs[new]) + "\n")


def grid_of(optimizer: str, p: dict) -> list[float]:
    return list(p["grids"]["adam" if optimizer.startswith("adam") else "sgd"])


def spec_of(spec: tuple[str, Update, str]) -> str:
    """What a row trains, beyond its name: the form, the update and the optimizer (a job carries it
    and its run records it, so that a row whose definition changed, such as a re-searched scheme, is
    trained again, and a worker never reads the scheme files while they change)."""
    form, u, optimizer = spec
    return json.dumps([form, u.bias_last, [list(w) for w in u.weights], u.blocks, u.full, optimizer])


def from_spec(spec: str) -> tuple[str, Update, str]:
    """The (form, update, optimizer) a :func:`spec_of` string describes."""
    form, bias_last, weights, blocks, full, optimizer = json.loads(spec)
    return form, Update(bias_last=bias_last, weights=tuple(map(tuple, weights)), blocks=blocks, full=full), optimizer


def read_runs(path: Path, table: dict) -> dict[str, dict]:
    """Finished runs by id. A run that recorded another definition of its row than ``table``'s
    (:func:`methods`, :func:`spec_of`) is left out: it is trained again."""
    runs = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
                want = table.get(r["experiment"], {}).get(r["method"])
                if want is None or r.get("spec", spec_of(want)) == spec_of(want):
                    runs[r["id"]] = r
            except (json.JSONDecodeError, KeyError):
                continue  # a torn last line: that run is redone
    return runs


def job_id(experiment: str, method: str, lr: float, seed: int) -> str:
    return f"{experiment}|{method}|{lr:g}|{seed}"


def choose(runs: dict[str, dict], experiment: str, method: str, grid: list[float], p: dict) -> float | None:
    """The rate with the best mean validation accuracy over the selection seeds (ties: the smaller)."""
    means = []
    for lr in grid:
        accs = [runs.get(job_id(experiment, method, lr, s)) for s in p["selection_seeds"]]
        if any(a is None for a in accs):
            return None
        means.append((np.mean([a["acc"] for a in accs]), -lr))
    return -max(means)[1]


def collapsed(run: dict) -> bool:
    """A diverged run: its loss is not finite, or it ended at chance accuracy (CIFAR-10: 10%)."""
    return run["diverged"] or run["acc"] <= CHANCE


@dataclass
class Selection:
    """A row's rate and the runs it still needs (:func:`select`)."""

    grid: list[float]  # every rate trained on the selection seeds
    lr: float | None  # the chosen rate; None while selection runs are missing (or no rate is stable)
    missing: list[tuple[float, int]]  # (rate, seed) runs still to train
    abandoned: list[dict] = field(default_factory=list)  # {"lr", "diverged_seeds"}: rates given up


def select(runs: dict[str, dict], experiment: str, method: str, optimizer: str, p: dict) -> Selection:
    """The protocol's rate for one row. The grid is widened (at most ``max_widen`` times) while the
    choice sits on an edge. A test seed that diverged at the chosen rate (``divergence_rule``) marks
    that rate unstable for the row: the rate is chosen again among the rates below it, widening
    downwards while the choice is the lowest, and every test seed trains at the new rate."""

    def unrun(rates: list[float], seeds: list[int]) -> list[tuple[float, int]]:
        return [(lr, s) for lr in rates for s in seeds if job_id(experiment, method, lr, s) not in runs]

    if experiment == "profile":  # one rate, the selection seeds
        lr = p["profile"]["lr"]
        return Selection([lr], lr, unrun([lr], p["selection_seeds"]))
    grid, cap, abandoned, widened = grid_of(optimizer, p), math.inf, [], 0
    while True:
        stable = [lr for lr in grid if lr < cap]
        missing = unrun(stable, p["selection_seeds"])
        if missing or not stable:
            return Selection(grid, None, missing, abandoned)
        best = choose(runs, experiment, method, stable, p)
        low, high = best == stable[0], best == stable[-1] and cap == math.inf
        if widened < p["max_widen"] and (low or high):
            grid = [grid[0] / p["grid_step"], *grid] if low else [*grid, grid[-1] * p["grid_step"]]
            widened += 1
            continue
        tests = {s: runs.get(job_id(experiment, method, best, s)) for s in p["test_seeds"]}
        bad = [s for s, r in tests.items() if r is not None and collapsed(r)]
        if bad and p.get("divergence_rule"):
            abandoned.append({"lr": best, "diverged_seeds": bad})
            cap = best
            continue
        return Selection(grid, best, [(best, s) for s, r in tests.items() if r is None], abandoned)
