"""The grid's ranked subset (``--weight-convs``, ``--rank-by``): weight runs for exactly the named
convs, the top N of a cheaper profile's ranking, and a profile that says which."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from memplan.contrib import load_profile, run_contrib
from memplan.contrib.protocol import Protocol, grid
from memplan.errors import MemplanError
from memplan.graph import conv_table
from memplan.graph.capture import capture_graph
from tests.test_contrib import make_npz, tiny_model

TINY = dict(seeds=(0,), epochs=1, batch_size=8, probe_epochs=2, ratios=(1.0,), validation=2)


def test_weight_convs_name_the_convs_with_weight_runs():
    layers = conv_table(capture_graph(tiny_model(), (1, 3, 8, 8)))  # stem.0, a.0, b.0, c.0
    specs = grid(layers, Protocol(ratios=(1.0,), bias_ks=(1,), weight_convs=(2, 0)))
    assert sorted(s.layer for s in specs if s.kind == "weight") == ["b.0", "stem.0"]
    # depth reference: each weight run's reference bias depth is in the grid (L - i: 4 for stem, 2 for b)
    assert {s.k for s in specs if s.kind == "bias"} == {1, 2, 4}
    every = grid(layers, Protocol(ratios=(1.0,), bias_ks=(1,), weight_convs=(1,), weight_reference="all-biases"))
    assert [(s.layer, s.k) for s in every if s.kind == "weight"] == [("a.0", 4)]
    with pytest.raises(MemplanError, match="names conv 7"):
        grid(layers, Protocol(weight_convs=(7,)))


@pytest.mark.parametrize(
    "bad", [dict(weight_convs=(1, 1)), dict(weight_convs=(-1,)), dict(weight_convs=(1,), weight_layers=2)]
)
def test_a_bad_subset_is_refused(bad):
    with pytest.raises(ValidationError):
        Protocol(**bad)


def test_rank_by_measures_the_top_convs_of_an_estimate_and_says_so(tmp_path: Path):
    npz = make_npz(tmp_path / "toy.npz")
    fisher = tmp_path / "fisher.json"
    run_contrib(tiny_model(), data=str(npz), out=fisher, estimator="fisher", batches=2, validation=2, seeds=(0,))
    raw = json.loads(fisher.read_text())
    index = {layer["name"]: layer["conv_index"] for layer in raw["layers"]}
    best = {index[name]: max(by_ratio.values()) for name, by_ratio in raw["weight"].items()}
    top2 = sorted(sorted(best, key=best.get, reverse=True)[:2])
    assert len(set(best.values())) == len(best), "the toy's ranking has ties: pick another seed"

    out = tmp_path / "grid.json"
    prof = run_contrib(tiny_model(), data=str(npz), out=out, rank_by=fisher, weight_layers=2, bias_ks=(1,), **TINY)
    assert prof.protocol.weight_convs == tuple(top2) and prof.protocol.weight_layers is None
    names = {layer["conv_index"]: layer["name"] for layer in raw["layers"]}
    assert set(prof.weight) == {names[i] for i in top2}
    assert f"convs {top2}" in prof.description and "fisher.json (fisher) ranks highest" in prof.description
    # rerun: the same identity, everything resumed
    again = run_contrib(tiny_model(), data=str(npz), out=out, rank_by=fisher, weight_layers=2, bias_ks=(1,), **TINY)
    assert again.timing["runs_executed"] == 0 and load_profile(out).protocol.weight_convs == tuple(top2)


def test_rank_by_is_refused_without_a_count_or_for_another_model(tmp_path: Path):
    npz = make_npz(tmp_path / "toy.npz")
    fisher = tmp_path / "fisher.json"
    run_contrib(tiny_model(), data=str(npz), out=fisher, estimator="fisher", batches=2, validation=2, seeds=(0,))
    with pytest.raises(MemplanError, match="needs weight_layers"):
        run_contrib(tiny_model(), data=str(npz), rank_by=fisher, **TINY)
    nowhere = str(tmp_path / "no-such-data.npz")  # both refused before the data is read
    with pytest.raises(MemplanError, match="needs weight_layers"):
        run_contrib(tiny_model(), data=nowhere, rank_by=fisher, **TINY)
    with pytest.raises(MemplanError, match="cannot read contribution profile"):
        run_contrib(tiny_model(), data=nowhere, rank_by=tmp_path / "none.json", weight_layers=1, **TINY)
    other = json.loads(fisher.read_text()) | {"fingerprint": "0" * 16, "model": "another"}
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(MemplanError, match="a profile of another model"):
        run_contrib(tiny_model(), data=str(npz), rank_by=tmp_path / "other.json", weight_layers=1, **TINY)
