"""The cheap form of benchmarks/estimators.py that CI runs: a tiny grid profile, two estimators,
one budget, two seeds end to end. It checks that the estimator profiles, the rank correlations,
the searched schemes, their end-to-end runs, the table and the plot are produced; it asserts no
accuracy or time (those depend on the CPU)."""

import json

import pytest
import torch

from memplan.contrib import load_profile
from memplan.contrib.analysis import run_contrib

from .helpers import load_benchmark
from .test_real import make_npz
from .test_transfer_benchmark import protocol as bench_protocol

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def estimators():
    return load_benchmark("estimators")


def test_cheap_form_runs_end_to_end(estimators, tmp_path):
    npz = make_npz(tmp_path / "task.npz", n=30)
    grid = tmp_path / "grid.json"
    protocol = dict(seeds=(0, 1), epochs=1, batch_size=8, probe_epochs=1, ratios=(0.5, 1.0), bias_ks=(1, 2, 3))
    run_contrib("minilearn-cifar10", data=str(npz), out=grid, validation=4, weight_layers=2, **protocol)
    out = tmp_path / "est"
    argv = [
        "--grid", str(grid), "--estimators", "fisher,probe", "--batches", "2", "--budgets", "40KB",
        "--seeds", "0,1", "--train", "--out", str(out),
        # benchmarks/transfer.py's setup for the end-to-end runs
        "--transfer-protocol", bench_protocol(tmp_path / "protocol.json", data=str(npz), lrs=["0.001", "0.01"]),
    ]  # fmt: skip
    result = estimators.main(argv + ["--transfer-out", str(tmp_path / "bench")])
    assert set(result["times"]) == {"fisher", "probe"}
    assert all(t["wall_s"] > 0 and t["estimator_wall_s"] >= 0 for t in result["times"].values())
    fisher = load_profile(out / "fisher.json")
    assert fisher.estimator == "fisher" and fisher.channel_importance
    assert load_profile(out / "probe.json").estimator == "probe"
    assert {"bias/all", "weight/all", "bias/low_se", "weight/low_se"} == set(result["rank"]["fisher"])
    sources = {s["source"] for s in result["schemes"]}
    assert sources == {"grid", "fisher", "probe", "fisher+importance channels"}
    assert all(s["accuracy"] and s["accuracy"]["seeds"] == 2 for s in result["schemes"])
    assert all(s["memory_bytes"] <= 40_000 for s in result["schemes"])
    assert "## Rank correlation" in (out / "estimators.md").read_text()
    assert (out / "estimators.png").stat().st_size > 10_000
    assert json.loads((out / "estimators.json").read_text())["schemes"] == json.loads(json.dumps(result["schemes"]))
