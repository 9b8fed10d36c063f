"""Learning rates chosen per family before the grid (``Protocol.lr_grid``).

A profile measured at one fixed rate misjudges a family that pays only at another (biases gain
nothing at 5e-4 and +3.5 points at 1.25e-2 on EfficientNet-Lite0 -> Fashion-MNIST). With
``lr_grid`` set, contribution analysis first chooses, on the validation split every run is
measured on, one rate per family, each with the rates chosen before it fixed:

1. ``classifier``: the classifier-only run (``lr_classifier``);
2. ``bias``: the deepest bias run, all the biases the grid measures (``lr_bias``);
3. ``weight``: the weight run of the last analysed conv at its largest ratio, on its reference
   (``lr_weight``).

Each family's rates go through successive halving over the protocol's seeds (at least two:
``memplan.contrib.halving``); the best mean wins. The grid then runs at the chosen rates; the
profile's ``protocol`` states them and ``lr_selection`` keeps every accuracy measured. Runs are
checkpointed as ``lr:<family>@<rate>#<seed>`` lines beside the grid's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .halving import successive_halving
from .protocol import Protocol, RunSpec

#: family -> the protocol field it sets
FAMILIES = {"classifier": "lr_classifier", "bias": "lr_bias", "weight": "lr_weight"}


def family_specs(specs: list[RunSpec]) -> dict[str, RunSpec]:
    """The run that stands for each family in ``specs`` (the grid): see the module docstring."""
    out = {"classifier": RunSpec("classifier", 0)}
    biases = [s for s in specs if s.kind == "bias"]
    if biases:
        out["bias"] = max(biases, key=lambda s: s.k)
    weights = [s for s in specs if s.kind == "weight"]
    if weights:
        last = max(s.conv_index for s in weights)
        out["weight"] = max((s for s in weights if s.conv_index == last), key=lambda s: s.ratio)
    return out


def select_rates(
    protocol: Protocol,
    specs: list[RunSpec],
    train: Callable[[RunSpec, Protocol], dict[str, Any]],
    done: dict[str, dict[str, Any]],
    record: Callable[[dict[str, Any]], None],
) -> tuple[Protocol, dict[str, dict[str, Any]]]:
    """(the protocol at the chosen rates, what was measured per family). ``train(spec, protocol)``
    trains one run for the protocol's one seed and returns its record (``accuracy``, ``final_loss``);
    ``done``: records by id from the checkpoint; ``record(rec)``: checkpoint a new one."""
    assert protocol.lr_grid is not None
    seeds = list(protocol.seeds) if len(protocol.seeds) >= 2 else [protocol.seeds[0], protocol.seeds[0] + 1]
    chosen = protocol
    selection: dict[str, dict[str, Any]] = {}
    for family, spec in family_specs(specs).items():
        field = FAMILIES[family]
        run = _runner(family, spec, field, chosen, train, done, record)
        h = successive_halving([family], list(protocol.lr_grid), seeds, run)
        if h.best is None:
            continue  # every rate diverged: the protocol's own rate stays
        chosen = chosen.model_copy(update={field: h.best.lr})
        selection[family] = {
            "lr": h.best.lr,
            "run": spec.id,
            "accuracy": {f"{c.lr:g}": [c.accuracy[s] for s in sorted(c.accuracy)] for c in h.configs},
            "seeds": seeds,
        }
    return chosen, selection


def _runner(
    family: str,
    spec: RunSpec,
    field: str,
    base: Protocol,
    train: Callable[[RunSpec, Protocol], dict[str, Any]],
    done: dict[str, dict[str, Any]],
    record: Callable[[dict[str, Any]], None],
) -> Callable[[Any, float, int], float]:
    """``(candidate, lr, seed) -> accuracy`` of ``family``'s run with ``field`` at ``lr`` (NaN: diverged)."""

    def run(_: Any, lr: float, seed: int) -> float:
        rid = f"lr:{family}@{lr:g}#{seed}"
        if rid not in done:
            rec = train(spec, base.model_copy(update={field: lr, "seeds": (seed,)}))
            ok = math.isfinite(rec["final_loss"][0])
            done[rid] = {"id": rid, "accuracy": rec["accuracy"][0] if ok else math.nan}
            record(done[rid])
        return done[rid]["accuracy"]

    return run
