"""The validation stage of ``memplan search --validate`` (issue 26): the successive-halving schedule
on its own (hand-worked rungs), and the cheap end-to-end form CI runs: a tiny model and task, the
search's candidates plus every baseline that fits, trained on the validation split, resumed from
the checkpoint; the chosen scheme carries its rate and validation accuracy, and no baseline that
fits scores higher on validation."""

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from memplan.api import capture
from memplan.cli import app
from memplan.contrib.final import Evaluator
from memplan.contrib.halving import planned_runs, successive_halving
from memplan.contrib.profile import load_profile
from memplan.graph import conv_layers
from memplan.nn.train import make_optimizer
from memplan.plan import Scheme, Validation, load_scheme
from memplan.plan.evidence import images_se
from memplan.render.validated import images_warning, margin_warning
from memplan.search.baselines import BASELINES, SIZE_RULES
from memplan.search.rules import CHOICE_RULES

from .test_real import tiny_profile

torch.set_num_threads(1)


def test_halving_keeps_the_better_half_and_every_protected_candidate():
    table = {  # accuracy by (candidate, lr, seed)
        ("a", 1, 0): 90, ("a", 1, 1): 80, ("a", 2, 0): 70, ("a", 2, 1): 99,
        ("b", 1, 0): 85, ("b", 1, 1): 95, ("b", 2, 0): 60, ("b", 2, 1): 99,
        ("base", 1, 0): 50, ("base", 1, 1): 40, ("base", 2, 0): 55, ("base", 2, 1): 45,
    }  # fmt: skip
    calls = []

    def train(c, lr, seed):
        calls.append((c, lr, seed))
        return table[c, lr, seed]

    h = successive_halving(["a", "b", "base"], [1, 2], [0, 1], train, protected=["base"])
    # rung 0: all six; ranked a@1 90, b@1 85, a@2 70, b@2 60, base@2 55, base@1 50 -> top 3 + base's best (@2)
    assert h.rungs[0] == [(c, lr) for c in ("a", "b", "base") for lr in (1, 2)]
    assert sorted(h.rungs[1]) == sorted([("a", 1), ("b", 1), ("a", 2), ("base", 2)])
    assert h.best.candidate == "b" and h.best.lr == 1 and h.best.mean == 90 and h.best.se == pytest.approx(5.0)
    assert len(calls) == 6 + 4
    assert h.best_of("base").lr == 2 and h.best_of("base").mean == 50


def test_halving_drops_diverged_runs_and_counts_runs():
    h = successive_halving(["x", "y"], [1], [0, 1], lambda c, lr, s: math.nan if c == "x" else 70.0)
    assert h.best.candidate == "y" and h.rungs[1] == [("y", 1)]
    assert planned_runs(6, 2) == 6 + 3 and planned_runs(6, 3) == 6 + 3 + 2 and planned_runs(2, 3) == 6


def test_search_validate_end_to_end_and_resume(tmp_path):
    _, profile = tiny_profile(tmp_path, seeds=(0, 1))
    out, folder = tmp_path / "scheme.json", tmp_path / "val"
    argv = [
        "search", "minilearn-cifar10", "--budget", "30KB", "--profile", str(profile), "--validate", "2",
        "--validate-lrs", "0.001,0.01", "--validate-seeds", "0,1", "--validate-dir", str(folder), "--out", str(out),
    ]  # fmt: skip
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 0, r.output
    assert "validation stage" in r.output and "chosen:" in r.output
    scheme = load_scheme(out)
    assert scheme.training.lr in (0.001, 0.01) and scheme.training.optimizer == "sgd"
    val = scheme.validation
    assert len(val.seeds) == 2 and val.runners_up
    assert val.images == 12  # tiny_profile: 4 validation images per class, 3 classes
    # 12 images cannot separate anything: whenever there is a margin, the view says so
    sampled = "12 images alone" in " ".join(r.output.split())
    assert sampled == (val.margin() is not None), r.output
    baselines = [x for x in val.runners_up if x["baseline"]]
    assert baselines and all(x["memory_bytes"] <= 30_000 for x in val.runners_up)
    # never worse on validation than a baseline that fits (both measured on the same seeds)
    assert all(val.accuracy >= x["accuracy"] for x in baselines if x["seeds"] == val.seeds)
    # a choice inside twice its SE of the best baseline is said to be unresolved: always when it is
    # searched (never a baseline); a union of two baselines is no baseline either, so may be said too
    said = "does not separate them" in " ".join(r.output.split())
    unresolved = val.margin() is not None and not val.margin().resolved
    assert not said or unresolved, r.output
    assert said or not (val.name.startswith("searched") and unresolved), r.output
    # the default rule never chooses what validation cannot separate from the best baseline
    assert val.rule == "resolved" and not said, r.output
    best_out = tmp_path / "best.json"
    b = CliRunner().invoke(app, [*argv[:-1], str(best_out), "--validate-rule", "best"])
    assert b.exit_code == 0, b.output
    top = load_scheme(best_out).validation
    assert top.rule == "best" and all(top.accuracy >= x["accuracy"] for x in top.runners_up if x["seeds"] == top.seeds)
    if top.name != val.name:  # the default kept a baseline the best did not clear by twice the SE
        assert any(x["name"] == val.name for x in baselines)
        assert top.accuracy - val.accuracy <= 2 * math.hypot(top.se, val.se)
        assert "keeps the baseline" in " ".join(r.output.split())
    runs = (folder / "validate.runs.jsonl").read_text().splitlines()
    # rerun: every run comes from the checkpoint, the same choice
    again = CliRunner().invoke(app, argv)
    assert again.exit_code == 0, again.output
    assert "0 runs trained now" in again.output
    assert (folder / "validate.runs.jsonl").read_text().splitlines() == runs
    assert json.loads(out.read_text())["validation"] == json.loads(scheme.model_dump_json())["validation"]
    # training code gets the validated optimizer and rate by default
    model = torch.nn.Linear(3, 2)
    opt = make_optimizer(model.parameters(), scheme=scheme)
    assert type(opt) is torch.optim.SGD and opt.defaults["lr"] == scheme.training.lr
    assert make_optimizer(model.parameters(), "adam", 0.5, scheme=scheme).defaults["lr"] == 0.5  # given wins


def test_the_pool_trains_the_same_runs_per_family_and_chooses_the_same(tmp_path, monkeypatch):
    """--validate-workers 2: each rung's runs on contribution analysis's process pool; the same runs
    (ids and accuracies, one torch thread everywhere) and the same choice as one after another. The
    grid has a per-family point: it is a training of its own only for candidates that train weights."""
    monkeypatch.setenv("MEMPLAN_NUM_THREADS", "1")
    _, profile = tiny_profile(tmp_path, seeds=(0, 1))
    lines, chosen = {}, {}
    for workers in (1, 2):
        folder, out = tmp_path / f"val{workers}", tmp_path / f"scheme{workers}.json"
        argv = [
            "search", "minilearn-cifar10", "--budget", "30KB", "--profile", str(profile), "--validate", "2",
            "--validate-lrs", "0.001,0.01,0.01/weight=0.001", "--validate-seeds", "0,1", "--validate-dir", str(folder),
            "--validate-workers", str(workers), "--out", str(out),
        ]  # fmt: skip
        r = CliRunner().invoke(app, argv)
        assert r.exit_code == 0, r.output
        runs = [json.loads(x) for x in (folder / "validate.runs.jsonl").read_text().splitlines()[1:]]
        lines[workers] = {x["run"]["id"]: x["run"]["accuracy"] for x in runs}
        chosen[workers] = load_scheme(out)
    assert lines[1] == lines[2] and len(lines[1]) >= 4
    assert chosen[1].validation == chosen[2].validation and chosen[1].training == chosen[2].training
    ids = list(lines[1])
    per_family = [i for i in ids if "weight=0.001" in i]
    # a candidate that trains no weight never runs the per-family point: it is its 0.01 run
    assert len({i.split("|")[0] for i in per_family}) < len({i.split("|")[0] for i in ids})


def test_validate_trains_tinytl_and_reestimated_statistics(tmp_path):
    """The two baselines that are not a plain plan on the plain model: TinyTL-L+B (its lite residual
    branches built on a worker of their own) and norm + bias with the statistics re-estimated on the
    training split (then the head re-fit): both fit a loose budget, are trained and ranked."""
    _, profile = tiny_profile(tmp_path, "mcunet-5fps", resolution=32)
    out = tmp_path / "scheme.json"
    argv = [
        "search", "mcunet-5fps", "--budget", "50MB", "--profile", str(profile), "--validate", "1",
        "--validate-lrs", "0.01", "--validate-seeds", "0", "--validate-dir", str(tmp_path / "val"), "--out", str(out),
    ]  # fmt: skip
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 0, r.output
    scheme = load_scheme(out)
    rows = {x["name"]: x for x in scheme.validation.runners_up} | {scheme.validation.name: {"accuracy": 0.0}}
    for name in ("TinyTL lite-residual + bias", "norm + bias, re-estimated statistics"):
        assert name in rows and math.isfinite(rows[name]["accuracy"])
    if scheme.validation.name == "TinyTL lite-residual + bias":
        assert scheme.added_modules  # the chosen scheme builds its branches when applied
    # the final evaluation on the test split trains it too (its branches built on a copy)
    cap = capture("mcunet-5fps", resolution=32, method="tinytl-lb")
    tinytl = Scheme.from_plan(cap.graph, BASELINES.choose("TinyTL lite-residual + bias").plan(cap.graph))
    evaluator = Evaluator(load_profile(profile), seeds=(0,))
    result = evaluator.scheme("tinytl", tinytl)
    assert len(result.accuracy) == 1 and math.isfinite(result.mean)
    # on a pool, the branches are built once for the workers of that model: the same accuracy
    (pooled,) = evaluator.schemes([("tinytl", tinytl)], workers=2)
    assert pooled.accuracy == result.accuracy


def test_union_trains_what_both_train_and_refuses_what_it_cannot_say():
    """The union of two baselines written as schemes, applied to a real model, trains exactly the
    parameters that either one trains (compared through requires_grad on torch modules)."""
    import copy

    from memplan.api import capture
    from memplan.apply import apply_scheme
    from memplan.models.zoo import build
    from memplan.plan import Scheme
    from memplan.search.baselines import BASELINES
    from memplan.search.candidates import union

    cap = capture("mcunet-5fps", resolution=64, classes=10)
    schemes = {
        name: Scheme.from_plan(cap.graph, BASELINES[name].plan(cap.graph), model="mcunet-5fps", mode="pytorch")
        for name in ("bias only", "MobileTL", "norm + bias")
    }
    torch.manual_seed(0)
    plain = build("mcunet-5fps", 10)

    def trained(scheme):
        model = apply_scheme(copy.deepcopy(plain), scheme)
        return {n for n, p in model.named_parameters() if p.requires_grad}

    u = union(schemes["bias only"], schemes["MobileTL"])
    assert trained(u) == trained(schemes["bias only"]) | trained(schemes["MobileTL"])
    assert trained(u) > trained(schemes["MobileTL"])  # MobileTL + every bias trains more than MobileTL
    # one norm in two modes (batch statistics here, running statistics there) has no union
    a = schemes["norm + bias"]
    norm = next(iter(a.norm_modes))
    assert a.norm_modes[norm] == "train"
    assert union(a, a.model_copy(update={"norm_modes": {norm: "affine"}})) is None


def _validation(accuracy, se, rivals):
    runners = [{"name": n, "baseline": b, "accuracy": a, "se": e, "seeds": [100, 101]} for n, b, a, e in rivals]
    return Validation(name="searched (lcb)", accuracy=accuracy, se=se, seeds=[100, 101], data="v", runners_up=runners)


def test_margin_is_over_the_best_baseline_and_its_se_combines_both():
    # Lite0 at 45 MB (fair protocol): 88.2 ± 0.6 over MobileTL's 88.1 ± 0.1; a searched runner-up
    # above MobileTL is no baseline and does not count
    val = _validation(88.2, 0.6, [("searched (mean)", False, 88.15, 0.2), ("MobileTL", True, 88.1, 0.1),
                                  ("bias only", True, 85.1, 0.1)])  # fmt: skip
    m = val.margin()
    assert m.baseline == "MobileTL" and m.points == pytest.approx(0.1) and m.se == pytest.approx(math.hypot(0.6, 0.1))
    assert not m.resolved
    assert str(m) == "+0.10 ± 0.61 points (SE)"
    assert "MobileTL" in margin_warning(val, chosen_baseline=False) and "+0.10 ± 0.61" in margin_warning(val, False)
    assert margin_warning(val, chosen_baseline=True) is None  # a baseline chosen: nothing to separate
    wide = _validation(67.0, 0.6, [("biases of the last k convs (k=39)", True, 63.8, 0.8)])  # 3.2 > 2 x 1.0
    assert wide.margin().resolved and margin_warning(wide, False) is None
    edge = _validation(10.0, 1.0, [("b", True, 8.0, 0.0)])  # exactly twice its SE: not more, unresolved
    assert not edge.margin().resolved
    assert _validation(80.0, 0.5, [("searched (mean)", False, 79.0, 0.5)]).margin() is None  # no baseline
    one = _validation(80.0, 0.0, [("b", True, 79.0, 0.0)]).model_copy(update={"seeds": [100]})
    assert one.margin() is None  # one seed: no SE to judge by (the stage says so on its own)


def test_images_se_is_the_images_sampling_error():
    """Against a bootstrap over the images: two models' right/wrong on 500 images, resampled. With
    independent errors the formula is the bootstrap's SD of the difference; with errors mostly on
    the same images (a model and a copy that differs on a few) it is an upper estimate."""
    g = torch.Generator().manual_seed(0)
    n = 500
    a = (torch.rand(n, generator=g) < 0.88).double()
    b = (torch.rand(n, generator=g) < 0.86).double()
    near = torch.where(torch.rand(n, generator=g) < 0.05, 1 - a, a)  # a with 5% of its answers flipped
    picks = torch.randint(0, n, (4000, n), generator=g)

    def boot(x, y):
        return float(100 * (x[picks].mean(1) - y[picks].mean(1)).std())

    formula = images_se(100 * float(a.mean()), 100 * float(b.mean()), n)
    assert boot(a, b) == pytest.approx(formula, rel=0.1)
    assert boot(a, near) < 0.7 * images_se(100 * float(a.mean()), 100 * float(near.mean()), n)
    assert images_se(88.0, 86.0, 2000) == pytest.approx(images_se(88.0, 86.0, 500) / 2)  # 1/sqrt(n)


def test_the_view_says_when_the_images_alone_could_make_the_margin():
    # the Lite0 replicate's 20 MB stage: +3.80 ± 0.14 over bias only, resolved by the seeds' SE; its
    # 500 images give a difference up to about 2.1 points: the margin is inside twice that
    twenty = _validation(89.1, 0.1, [("bias only", True, 85.3, 0.1)]).model_copy(update={"images": 500})
    m = twenty.margin()
    assert m.resolved and m.within_images and m.images_se == pytest.approx(images_se(89.1, 85.3, 500))
    said = images_warning(twenty)
    assert "+3.80 points from bias only" in said and "500 images alone" in said and f"{m.images_se:.2f}" in said
    big = twenty.model_copy(update={"images": 10_000})  # the third study's split: about 0.46 points
    assert not big.margin().within_images and images_warning(big) is None
    assert twenty.model_copy(update={"images": None}).margin().images_se is None  # not recorded: nothing said
    assert images_warning(twenty.model_copy(update={"images": None})) is None


def _halving(table: dict[str, list[float]], baselines: set[str]):
    """A halving over candidates with one rate whose seeds score ``table``'s accuracies (%), and the
    candidates as the rules read them (cheapest first: the table's order)."""
    from types import SimpleNamespace

    seeds = list(range(len(next(iter(table.values())))))
    h = successive_halving(list(table), [1], seeds, lambda c, lr, s: table[c][s], protected=sorted(baselines))
    return h, [SimpleNamespace(key=k, name=k, baseline=k in baselines) for k in table]


@pytest.mark.parametrize(
    ("table", "baselines", "best", "resolved"),
    [
        # Lite0 at 45 MB (fair protocol): 88.2 ± 0.6 over MobileTL's 88.1 ± 0.1, inside twice the SE
        ({"searched": [88.8, 87.6], "MobileTL": [88.2, 88.0], "bias only": [85.0, 85.2]}, {"MobileTL", "bias only"},
         "searched", "MobileTL"),
        # 3.2 points over a baseline at SE 1.0: beyond twice it, the searched scheme is kept
        ({"searched": [67.6, 66.4], "k=39": [63.0, 64.6]}, {"k=39"}, "searched", "searched"),
        # a union of two baselines is no baseline: it must clear the best one too
        ({"MobileTL": [88.0, 88.2], "bias + MobileTL": [88.3, 88.1]}, {"MobileTL"}, "bias + MobileTL", "MobileTL"),
        # the best is a baseline: nothing to separate
        ({"searched": [80.0, 81.0], "bias only": [82.0, 82.4]}, {"bias only"}, "bias only", "bias only"),
        # no baseline fits: the best
        ({"searched": [80.0, 81.0], "searched (mean)": [79.0, 79.2]}, set(), "searched", "searched"),
        # one seed: no SE to judge by, the best
        ({"searched": [88.2], "MobileTL": [88.1]}, {"MobileTL"}, "searched", "searched"),
    ],
)  # fmt: skip
def test_choice_rules_by_hand(table, baselines, best, resolved):
    h, candidates = _halving(table, baselines)
    assert CHOICE_RULES.choose("best").choose(h, candidates).candidate == best
    assert CHOICE_RULES.choose("resolved").choose(h, candidates).candidate == resolved


def test_the_view_says_which_candidate_the_rule_passed_over_and_by_how_much():
    from memplan.render.validated import kept_baseline
    from memplan.search.stage import Validated

    table = {"searched": [88.8, 87.6], "MobileTL": [88.2, 88.0]}
    h, candidates = _halving(table, {"MobileTL"})
    for rule, kept in (("resolved", "MobileTL"), ("best", "searched")):
        config = CHOICE_RULES.choose(rule).choose(h, candidates)
        chosen = next(c for c in candidates if c.key == kept)
        v = Validated(None, chosen, candidates, h, [1], [0, 1], 0, 0.0, "", rule=rule, config=config)
        said = kept_baseline(v)
        if rule == "best":
            assert said is None  # the best on validation was chosen: nothing passed over
        else:
            assert said.startswith("the best on validation, searched (88.20%), is +0.10 ± 0.61 points (SE) above")
            assert "--validate-rule best would take searched" in said


def test_the_ladder_trains_each_sized_baseline_halved_down_to_one(tmp_path):
    """--validate-sizes ladder trains every candidate of the default (the largest k of each sized
    baseline that fits) and more: the smaller sizes of a sized baseline, each a halving of a larger
    one (here "biases of the last k convs" fits at every k, its largest being bias only itself)."""
    _, profile = tiny_profile(tmp_path, seeds=(0,))
    names = {}
    for sizes in ("largest", "ladder"):
        out = tmp_path / f"{sizes}.json"
        argv = [
            "search", "minilearn-cifar10", "--budget", "30KB", "--profile", str(profile), "--validate", "1",
            "--validate-lrs", "0.01", "--validate-seeds", "0", "--validate-dir", str(tmp_path / "val"),
            "--validate-sizes", sizes, "--out", str(out),
        ]  # fmt: skip
        r = CliRunner().invoke(app, argv)
        assert r.exit_code == 0, r.output
        val = load_scheme(out).validation
        names[sizes] = {x["name"] for x in val.runners_up} | {val.name}
    convs = len(conv_layers(capture("minilearn-cifar10").graph))
    halved = {f"{n} (k={k})" for n in BASELINES if BASELINES[n].sized for k in SIZE_RULES["ladder"](convs)[1:]}
    extra = names["ladder"] - names["largest"]
    assert names["largest"] <= names["ladder"] and extra and extra <= halved, names
