"""Adaptive seeding of contribution grids (memplan.contrib.adaptive): which entries get another
seed, checked on hand-made records, and a tiny grid end to end (extra seeds checkpointed and
resumed, standard errors from the paired deltas, old profiles still loading)."""

import json
import math
import statistics

import numpy as np
import pytest
import torch

from memplan.contrib.adaptive import merge, next_round, paired_deltas
from memplan.contrib.analysis import run_contrib
from memplan.contrib.profile import load_profile
from memplan.contrib.protocol import Protocol, RunSpec

from .test_real import TINY_GRID

torch.set_num_threads(1)

CLS, BIAS, W = RunSpec("classifier", 0), RunSpec("bias", 1), RunSpec("weight", 1, "conv", 0, 1.0)


def noise_npz(path, n, side=32, classes=3):
    """Labels that the images do not predict: every seed trains to another validation accuracy."""
    rng = np.random.default_rng(0)
    arrays = {}
    for split in ("train", "test"):
        arrays[f"x_{split}"] = rng.normal(0, 1, (n, 3, side, side)).astype(np.float32)
        arrays[f"y_{split}"] = np.arange(n) % classes
    np.savez(path, **arrays)
    return path


def rec(seeds, accs):
    return {"seeds": list(seeds), "accuracy": list(accs), "train_s": 1.0, "eval_s": 0.0, "cache_s": 0.0, "cpu_s": 1.0}


def test_paired_deltas_pair_by_seed_not_by_position():
    assert paired_deltas(rec([0, 1, 2], [50, 60, 70]), rec([2, 0], [65, 40])) == [10, 5]


def test_an_entry_inside_its_noise_gets_one_more_seed_and_its_reference_too():
    p = Protocol(seeds=(0, 1, 2), max_seeds=4, adaptive_z=2.0)
    records = {
        CLS.id: rec([0, 1, 2], [70.0, 70.0, 70.0]),
        # bias: deltas 10, 11, 9 -> mean 10, SE 0.58: resolved
        BIAS.id: rec([0, 1, 2], [80.0, 81.0, 79.0]),
        # weight vs bias: deltas +1, -1, +0.5 -> mean 0.17, SE 0.6: unresolved
        W.id: rec([0, 1, 2], [81.0, 80.0, 79.5]),
    }
    extra = next_round([BIAS, W, CLS], records, p)
    assert [s.id for s in extra] == ["bias:1#seed3", "weight:conv@1#seed3"]
    # the extra runs fold into their runs; the reference needed seed 3 and got it
    records["bias:1#seed3"] = rec([3], [80.0])
    records["weight:conv@1#seed3"] = rec([3], [80.4])
    merged = merge(records)
    assert merged[BIAS.id]["seeds"] == [0, 1, 2, 3] and merged[BIAS.id]["train_s"] == 2.0
    assert paired_deltas(merged[W.id], merged[BIAS.id]) == pytest.approx([1.0, -1.0, 0.5, 0.4])
    # at the cap nothing more is asked, even though the entry is still inside its noise
    assert next_round([BIAS, W, CLS], merged, p) == []
    assert next_round([BIAS, W, CLS], merged, Protocol(seeds=(0, 1, 2))) == []  # no max_seeds: no rounds


def test_a_tiny_grid_samples_adaptively_and_resumes(tmp_path):
    npz = noise_npz(tmp_path / "task.npz", n=90)
    # z huge: every entry whose deltas differ is unresolved; lr high enough that seeds differ
    grid = {
        **TINY_GRID,
        "seeds": (0, 1),
        "max_seeds": 3,
        "adaptive_z": 1e6,
        "lr_bias": 0.5,
        "batch_size": 4,
    }  # z huge: every entry is unresolved
    out = tmp_path / "p.json"
    prof = run_contrib("minilearn-cifar10", data=str(npz), out=out, validation=10, **grid)
    by_id = {r.id: r for r in prof.runs}
    extra = 0
    for r in prof.runs:
        if r.delta is None:
            continue
        first = r.delta[:2]
        # an entry whose two first deltas differ is inside a huge z's noise: sampled up to the cap,
        # its reference too (two equal deltas have SE 0 and are resolved)
        if first[0] != first[1]:
            assert r.seeds == [0, 1, 2] and by_id[r.reference].seeds == [0, 1, 2]
            extra += 1
        se = statistics.stdev(r.delta) / math.sqrt(len(r.delta))
        table = prof.bias_se[r.k] if r.kind == "bias" else prof.weight_se[r.layer][r.ratio]
        assert table == pytest.approx(se)
    assert extra >= 1
    lines = [json.loads(x) for x in (tmp_path / "p.runs.jsonl").read_text().splitlines()]
    assert sum("#seed2" in x["run"]["id"] for x in lines[1:]) == sum(r.seeds == [0, 1, 2] for r in prof.runs)
    # resuming runs nothing again
    again = run_contrib("minilearn-cifar10", data=str(npz), out=out, validation=10, **grid)
    assert again.timing["runs_executed"] == 0
    assert again.bias == prof.bias and load_profile(out).schema_version == 3
