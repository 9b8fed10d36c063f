"""The transfer benchmark's fair protocol (issue 39), with a stub trainer in place of training
(``Bench.run``: its accuracy peaks at a known rate outside the protocol's grid, the same for every
seed): the validation stage and every method's grid choose on the validation seeds only (never on
a test seed), every grid widens until its choice is interior, the shipped protocol files are
complete and fair, and the report lists the runs redone."""

import json
import math
from pathlib import Path

import pytest
import torch

from .helpers import load_benchmark
from .test_real import tiny_profile
from .test_transfer_benchmark import protocol

torch.set_num_threads(1)

PROTOCOLS = Path(__file__).resolve().parents[1] / "benchmarks" / "protocols"
RESULTS = PROTOCOLS.parent / "transfer_results" / "fair"  # each protocol's runs, in the folder of its name
RUNS = "transfer.runs.jsonl"
PEAK = 1e-4  # the stub's best rate: below the protocol's grid


@pytest.fixture(scope="module")
def transfer():
    return load_benchmark("transfer")


def stub(calls):
    def run(self, m, lr, seed, split):
        calls.append((m.name, split, seed))
        acc = 80.0 - 5 * abs(math.log10(lr.classifier) - math.log10(PEAK))
        return dict(accuracy=acc, diverged=False, train_s=0.0, eval_s=0.0, cache_s=0.0, cpu_s=0.0, trainable_params=1)

    return run


def test_no_choice_is_made_on_a_test_seed_and_every_grid_loses_its_edges(transfer, tmp_path, monkeypatch):
    npz, profile = tiny_profile(tmp_path, seeds=(0, 1))
    fields = dict(
        data=str(npz), lrs=["1e-3", "1e-2"], stage_lrs=["1e-3", "1e-2"], seeds=list(range(10)), val_seeds=[100, 101],
        profile=str(profile), budgets=["300KB"], validate_candidates=1, widen=3,
    )  # fmt: skip
    calls = []
    monkeypatch.setattr(transfer.Bench, "run", stub(calls))
    out = tmp_path / "bench"
    argv = ["--protocol", protocol(tmp_path / "p.json", **fields), "--out", str(out), "--no-progress"]
    argv += ["--methods", "classifier only,bias only,searched + validated"]
    result = transfer.main(argv)
    assert {split for _, split, _ in calls} == {"validation", "test"}
    assert {seed for _, split, seed in calls if split == "validation"} == {100, 101}  # the stage's runs included
    assert {seed for _, split, seed in calls if split == "test"} == set(range(10))
    rows = {r["name"]: r for r in result["rows"]}
    validated = rows["validated 300KB"]
    assert validated["validation"]["seeds"] == [100, 101]
    assert all(x["seeds"] in ([100], [100, 101]) for x in validated["validation"]["runners_up"])
    for r in rows.values():  # 1e-3 was the grid's bottom: widened to 1e-4 (chosen), then 1e-5 (below it)
        assert r["lr"] == "0.0001" and not r["lr_at_grid_edge"], r["name"]
        assert {"1e-05", "0.0001"} <= set(r["grid"]) and r["seeds"] == list(range(10))
    assert set(rows["bias only"]["grid_validation"]) >= {"1e-05", "0.0001", "0.001", "0.01"}
    ids = [json.loads(x)["run"]["id"] for x in (out / RUNS).read_text().splitlines()[1:]]
    assert all(int(i.split("|")[-1]) in (100, 101) for i in ids if i.startswith("grid|"))
    assert all(int(i.split("|")[-1]) in range(10) for i in ids if i.startswith("final|"))
    assert result["protocol_sha256"] and result["redone"] == []
    assert all("Holm p" in v for v in result["verdicts"] if " vs the best baseline" in v)


def test_the_report_lists_runs_redone_and_why(transfer):
    proto = load_benchmark("transfer_protocol")
    lines = [
        {"id": "grid|a|0.01|100", "protocol_sha256": "new"},
        {"id": "grid|a|0.01|100", "protocol_sha256": "new"},  # trained again
        {"id": "final|a|0.01|0", "protocol_sha256": "old"},  # another protocol
        {"id": "final|a|0.0025|0", "protocol_sha256": "new"},  # a rate no longer chosen
    ]
    got = proto.redone(lines, "new", lambda key: {"0.01"} if key == "a" else set())
    why = {(x["id"], x["why"].split(":")[0].split(" ")[0]) for x in got}
    assert why == {("grid|a|0.01|100", "recorded"), ("final|a|0.01|0", "trained"), ("final|a|0.0025|0", "superseded")}


@pytest.mark.parametrize("path", sorted(PROTOCOLS.glob("*.json")), ids=lambda p: p.stem)
def test_the_shipped_protocols_are_complete_and_fair(transfer, path):
    proto = load_benchmark("transfer_protocol")
    p, sha = proto.load_protocol(path)
    assert len(sha) == 64 and not p.problems()
    assert len(p.seeds) == 10 and not set(p.seeds) & set(p.val_seeds)
    assert p.widen >= 1 and p.ties == "smaller rate" and p.budgets
    assert set(p.stage_lrs) <= set(p.lrs)
    # the profile the stage searches from was measured on the protocol's own task and split
    ds = json.loads((PROTOCOLS.parents[1] / p.profile).read_text())["dataset"]
    split = (ds["spec"], ds["validation_split"], ds["train_per_class"], ds.get("split_seed", 0))
    assert split == (p.data, p.validation, p.train_per_class, p.split_seed)


def test_a_replicate_shares_no_seed_and_no_split_with_its_study():
    """The Lite0 replicate tests the rule 'resolved' where it was not written: another split, other
    validation and test seeds, its own profile."""
    proto = load_benchmark("transfer_protocol")
    first, _ = proto.load_protocol(PROTOCOLS / "lite0-fashion-mnist.json")
    again, _ = proto.load_protocol(PROTOCOLS / "lite0-fashion-mnist-replicate.json")
    assert first.rule == "best" and again.rule == "resolved" and again.split_seed != first.split_seed
    assert not set(again.seeds + again.val_seeds) & set(first.seeds + first.val_seeds)
    assert again.profile != first.profile
    same = ("lrs", "stage_lrs", "budgets", "epochs", "widen", "validate_candidates", "train_per_class", "validation")
    assert all(getattr(again, f) == getattr(first, f) for f in same)


def test_the_large_validation_study_changes_one_thing_against_the_replicate():
    """The third Lite0/Fashion-MNIST study asks whether a validation split 20 times larger stops the
    stage's losses: the replicate's protocol with 1000 validation images per class, on a split,
    seeds and profile neither earlier study used."""
    proto = load_benchmark("transfer_protocol")
    first, _ = proto.load_protocol(PROTOCOLS / "lite0-fashion-mnist.json")
    replicate, _ = proto.load_protocol(PROTOCOLS / "lite0-fashion-mnist-replicate.json")
    third, _ = proto.load_protocol(PROTOCOLS / "lite0-fashion-mnist-val1000.json")
    assert (replicate.validation, third.validation) == (50, 1000)
    for earlier in (first, replicate):
        assert not set(third.seeds + third.val_seeds) & set(earlier.seeds + earlier.val_seeds)
        assert third.split_seed != earlier.split_seed and third.profile != earlier.profile
    fresh = {"validation", "split_seed", "seeds", "val_seeds", "profile", "notes"}
    assert {f for f in type(third).model_fields if getattr(third, f) != getattr(replicate, f)} == fresh


def test_the_second_lite2_study_changes_three_things_against_the_first():
    """The second Lite2/Fashion-MNIST study tests both remedies on Lite2: the ladder of sizes (the
    first study lost at 40 MB to a size its stage never trained) and 1000 validation images per
    class, with 'resolved' making the verdicts; a split, seeds and profile no study used."""
    proto = load_benchmark("transfer_protocol")
    first, _ = proto.load_protocol(PROTOCOLS / "lite2-fashion-mnist.json")
    second, _ = proto.load_protocol(PROTOCOLS / "lite2-fashion-mnist-val1000-ladder.json")
    changed = {"stage_sizes": ("largest", "ladder"), "validation": (50, 1000), "rule": ("best", "resolved")}
    assert all((getattr(first, f), getattr(second, f)) == v for f, v in changed.items())
    for path in PROTOCOLS.glob("*.json"):
        if path.stem != "lite2-fashion-mnist-val1000-ladder":
            other, _ = proto.load_protocol(path)
            assert not set(second.seeds + second.val_seeds) & set(other.seeds + other.val_seeds), path.stem
            assert (second.data, second.split_seed) != (other.data, other.split_seed), path.stem
            assert second.profile != other.profile
    fresh = {"split_seed", "seeds", "val_seeds", "profile", "notes"}
    assert {f for f in type(second).model_fields if getattr(second, f) != getattr(first, f)} == fresh | set(changed)


def test_the_shipped_protocols():
    shipped = {
        "lite0-fashion-mnist", "lite2-fashion-mnist", "lite0-cifar10", "lite0-fashion-mnist-replicate",
        "lite0-fashion-mnist-val1000", "lite2-fashion-mnist-val1000-ladder",
    }  # fmt: skip
    assert {p.stem for p in PROTOCOLS.glob("*.json")} == shipped


def test_a_protocol_names_a_known_choice_rule_and_without_one_ran_best(tmp_path):
    proto = load_benchmark("transfer_protocol")
    assert proto.load_protocol(protocol(tmp_path / "p.json"))[0].rule == "best"  # the shipped ones: no rule
    assert proto.load_protocol(protocol(tmp_path / "r.json", rule="resolved"))[0].rule == "resolved"
    with pytest.raises(proto.BadOption, match="unknown choice rule 'luck'"):
        proto.load_protocol(protocol(tmp_path / "bad.json", rule="luck"))
    assert proto.rules_of("resolved") == ["resolved", "best"] and proto.rules_of("best") == ["best", "resolved"]


def test_a_protocol_names_a_known_size_rule_and_without_one_ran_the_largest(transfer, tmp_path):
    """The protocols that ran before the size rule existed name none: their stages trained a sized
    baseline's largest k that fits, the default (a rule one names is checked where every shipped
    protocol is loaded); ``ladder`` reaches the stage's arguments and the report's protocol line."""
    proto = load_benchmark("transfer_protocol")
    assert proto.load_protocol(protocol(tmp_path / "p.json"))[0].stage_sizes == "largest"
    ran = [json.loads(p.read_text()) for p in PROTOCOLS.glob("*.json") if (RESULTS / p.stem / RUNS).exists()]
    assert sum("stage_sizes" not in p for p in ran) >= 5
    with pytest.raises(proto.BadOption, match="unknown size rule 'every'"):
        proto.load_protocol(protocol(tmp_path / "bad.json", stage_sizes="every"))
    a = transfer.parse_args(["--protocol", protocol(tmp_path / "l.json", stage_sizes="ladder")])
    assert a.stage_sizes == "ladder"
    header = {"protocol": "l.json", "protocol_sha256": "0" * 64, "stage_sizes": a.stage_sizes}
    assert "the size rule 'ladder'" in " ".join(load_benchmark("transfer_report")._protocol_lines(header))


def test_a_replayed_rule_trains_its_own_choice_at_its_own_rate(transfer, tmp_path, monkeypatch):
    """The replay of another rule than the protocol's trains the configuration that rule chose, at
    that configuration's rate, not the best one's: a stub where classifier only peaks at 1e-3 below
    every other candidate (which peak at 1e-2), and a ``resolved`` rule replaced by one that always
    takes classifier only."""
    from memplan.search.rules import CHOICE_RULES, ChoiceRule

    npz, profile = tiny_profile(tmp_path, seeds=(0, 1))
    fields = dict(
        data=str(npz), lrs=["1e-4", "1e-3", "1e-2", "1e-1"], stage_lrs=["1e-4", "1e-3", "1e-2", "1e-1"],
        profile=str(profile), budgets=["300KB"], validate_candidates=1, widen=0,
    )  # fmt: skip

    def run(self, m, lr, seed, split):
        peak, top = (1e-3, 79.0) if m.key == "classifier only" else (1e-2, 80.0)
        acc = top - 5 * abs(math.log10(lr.classifier) - math.log10(peak))
        return dict(accuracy=acc, diverged=False, train_s=0.0, eval_s=0.0, cache_s=0.0, cpu_s=0.0, trainable_params=1)

    def classifier_only(halving, candidates):
        return halving.best_of(next(c.key for c in candidates if c.name == "classifier only"))

    monkeypatch.setattr(transfer.Bench, "run", run)
    monkeypatch.setitem(CHOICE_RULES._items, "resolved", ChoiceRule(classifier_only, "test"))
    argv = ["--protocol", protocol(tmp_path / "p.json", **fields), "--out", str(tmp_path / "b"), "--no-progress"]
    result = transfer.main([*argv, "--methods", "classifier only,searched + validated"])
    rows = {r["name"]: r for r in result["rows"]}
    best, kept = rows["validated 300KB"], rows["validated 300KB [rule resolved]"]
    assert best["chosen"] != "classifier only" and best["lr"] == "0.01"
    assert kept["chosen"] == "classifier only" and kept["lr"] == "0.001" == rows["classifier only"]["lr"]
    assert kept["same_runs_as"] == "classifier only" and kept["accuracy"] == rows["classifier only"]["accuracy"]
    assert kept["validation"]["accuracy"] == 79.0 and best["validation"]["accuracy"] == 80.0


def test_the_benchmarks_stage_trains_the_protocols_sizes(transfer, tmp_path, monkeypatch):
    """The protocol's ``stage_sizes`` reaches the benchmark's stage: under ``ladder`` it compares every
    candidate it compares under the default and a sized baseline's halved sizes besides (stub runs)."""
    npz, profile = tiny_profile(tmp_path, seeds=(0, 1))
    monkeypatch.setattr(transfer.Bench, "run", stub([]))
    compared = {}
    for sizes in ("largest", "ladder"):
        fields = dict(
            data=str(npz), lrs=["1e-4", "1e-3"], stage_lrs=["1e-4", "1e-3"], profile=str(profile),
            budgets=["1MB"], validate_candidates=1, widen=0, stage_sizes=sizes,
        )  # fmt: skip
        out = tmp_path / sizes
        argv = ["--protocol", protocol(tmp_path / f"{sizes}.json", **fields), "--out", str(out), "--no-progress"]
        rows = {r["name"]: r for r in transfer.main([*argv, "--methods", "searched + validated"])["rows"]}
        val = rows["validated 1MB"]["validation"]
        compared[sizes] = {x["name"] for x in val["runners_up"]} | {val["name"]}
    extra = compared["ladder"] - compared["largest"]
    assert compared["largest"] <= compared["ladder"] and extra, compared
    assert all(" (k=" in name for name in extra), extra
