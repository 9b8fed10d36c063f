"""The ``importance`` channel selection: explicit, estimator-ranked channel indices carried from the
scheme (schema version 2) through the plan (``Train.channels``) to ``SubChannelConv``.

Truth: rankings and counts recomputed here by hand, the weights an optimizer step really changed,
``saved_tensors_hooks`` measurements (unique storages, ``tests.helpers.saved_bytes``) of what autograd keeps."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memplan
from memplan.accounting.engine import compute
from memplan.apply import apply_plan, apply_scheme, write_back
from memplan.contrib.protocol import Protocol
from memplan.errors import BadOption
from memplan.graph import SELECT_RULES, conv_layers
from memplan.graph.capture import capture_graph
from memplan.modes import get_mode
from memplan.nn.lean import SubChannelConv, select_channels, top_channels
from memplan.plan import Plan, Scheme, Train, WeightUpdate, fingerprint, load_scheme, scheme_from_dict, scheme_to_plan
from memplan.plan.scheme import SCHEMA_VERSION

from .helpers import saved_bytes
from .test_scheme import SmallNet, one_line_error, small_graph

torch.set_num_threads(1)

SHAPE = (4, 3, 8, 8)  # batch 4: four samples give every listed channel a non-zero gradient
C1 = [0, 2, 5, 6]  # c1: 8 input channels at ratio 1/2 -> 4
C2 = [1, 6, 9, 14]  # c2: depthwise, 16 channels at ratio 1/4 -> 4


def kept(n_channels: int, ratio: float) -> int:
    """The paper's count, written out: int(C * r), at least one."""
    return max(1, int(n_channels * ratio))


def importance_scheme(graph, select: str = "importance", **changes) -> Scheme:
    """Biases of c1..c3 (c1, c2 through their BN shifts); c1 at 1/2 and depthwise c2 at 1/4 by ``select``."""
    extra = lambda channels: dict(channels=channels, importance_source="hand") if select == "importance" else {}  # noqa: E731
    fields = dict(
        model="smallnet",
        fingerprint=fingerprint(graph),
        input_shape=list(SHAPE[1:]),
        batch=SHAPE[0],
        bias_update=3,
        weight_updates=[
            WeightUpdate(layer="c1", conv_index=1, ratio=0.5, select=select, **extra(C1)),
            WeightUpdate(layer="c2", conv_index=2, ratio=0.25, select=select, **extra(C2)),
        ],
    )
    return Scheme(**{**fields, **changes})


def data(classes: int = 4):
    g = torch.Generator().manual_seed(11)
    return torch.randn(SHAPE, generator=g), torch.randint(0, classes, (SHAPE[0],), generator=g)


# --------------------------------------------------------------------------- top_channels


def test_top_channels_hand_checked():
    imp = torch.tensor([0.1, 5.0, 3.0, 5.0, -1.0, 2.0, 0.0, 4.0])
    assert top_channels(imp, 0.5) == [1, 2, 3, 7]  # 5, 5, 4, 3
    assert top_channels(imp, 0.25) == [1, 3]
    assert top_channels(imp, 0.01) == [1]  # at least one channel
    assert top_channels(imp, 1.0) == list(range(8))
    assert top_channels(torch.ones(6), 0.5) == [0, 1, 2]  # ties go to the lower index
    assert top_channels(torch.tensor([1.0, 2.0, 2.0, 2.0]), 0.5) == [1, 2]


def test_top_channels_equals_a_plain_sort():
    gen = torch.Generator().manual_seed(0)
    for c in (1, 3, 16, 37):
        imp = torch.randint(0, 5, (c,), generator=gen).float()  # many ties
        for ratio in (0.125, 0.3, 0.5, 1.0):
            n = kept(c, ratio)
            expect = sorted(sorted(range(c), key=lambda i: (-float(imp[i]), i))[:n])
            assert top_channels(imp, ratio) == expect


def test_top_channels_refuses_bad_input():
    with pytest.raises(BadOption, match="not in"):
        top_channels(torch.ones(4), 0.0)
    with pytest.raises(BadOption, match="vector"):
        top_channels(torch.ones(2, 2), 0.5)
    with pytest.raises(BadOption, match="NaN"):
        top_channels(torch.tensor([1.0, float("nan")]), 0.5)


# --------------------------------------------------------------------------- scheme format


def test_weight_update_validation():
    assert "importance" in SELECT_RULES
    ok = WeightUpdate(layer="c1", conv_index=1, ratio=0.5, select="importance", channels=[0, 3], importance_source="x")
    assert ok.channels == [0, 3] and ok.importance_source == "x"
    bad = [
        dict(select="importance"),  # no channels
        dict(select="importance", channels=[3, 1]),  # not sorted
        dict(select="importance", channels=[1, 1]),  # duplicate
        dict(select="importance", channels=[-1, 2]),  # negative
        dict(select="magnitude+", channels=[0, 1]),  # channels with a computed rule
        dict(select="random", importance_source="fisher:x"),
    ]
    for fields in bad:
        with pytest.raises(ValueError):
            WeightUpdate(layer="c1", conv_index=1, ratio=0.5, **fields)


def test_json_round_trip_and_version(tmp_path):
    graph = small_graph()
    s = importance_scheme(graph)
    path = tmp_path / "s.json"
    s.save(path)
    data = json.loads(path.read_text())
    assert data["schema_version"] == SCHEMA_VERSION == 4
    assert data["weight_updates"][0]["channels"] == C1 and data["weight_updates"][1]["channels"] == C2
    assert data["weight_updates"][0]["importance_source"] == "hand"
    assert load_scheme(path) == s
    # a version 1 document cannot hold an importance selection
    one_line_error(scheme_from_dict, {**data, "schema_version": 1}, match="schema_version 2")


def test_count_checked_against_the_traced_conv():
    graph = small_graph()
    cases = {
        "c1 too few": ([0, 2, 5], C2, "3 channel indices given; ratio 0.5 of 8 channels keeps 4"),
        "c1 out of range": ([0, 2, 5, 8], C2, "index 8 is out of range for 8 channels"),
        "c2 too many": (C1, [1, 6, 9, 14, 15], "5 channel indices given; ratio 0.25 of 16 channels keeps 4"),
        "c2 out of range": (C1, [1, 6, 9, 16], "index 16 is out of range for 16 channels"),
    }
    for c1, c2, message in cases.values():
        s = importance_scheme(graph)
        w1, w2 = s.weight_updates
        s = s.model_copy(
            update={"weight_updates": [w1.model_copy(update={"channels": c1}), w2.model_copy(update={"channels": c2})]}
        )
        one_line_error(scheme_to_plan, graph, s, match=message)


def test_plan_carries_the_channels_and_costs_only_the_count():
    graph = small_graph(batch=SHAPE[0])
    plan = scheme_to_plan(graph, importance_scheme(graph))
    assert plan.train["c1"] == Train(0.5, False, "importance", tuple(C1))
    assert plan.train["c2"] == Train(0.25, False, "importance", tuple(C2))
    magnitude = scheme_to_plan(graph, importance_scheme(graph, select="magnitude+"))
    assert magnitude.train["c1"].channels is None
    for mode in ("pytorch", "ideal", "applied", "tinytraining", "tinytl"):
        a, b = compute(graph, plan, get_mode(mode)), compute(graph, magnitude, get_mode(mode))
        assert a.totals == b.totals and a.extras == b.extras, mode
    with pytest.raises(BadOption, match="explicit channels"):
        Train(0.5, False, "importance")
    with pytest.raises(BadOption, match="explicit channels"):
        Train(0.5, False, "magnitude+", (0, 1))
    with pytest.raises(BadOption, match="not sorted"):
        Train(0.5, False, "importance", (2, 1))


def test_version_1_hand_written_means_the_same(tmp_path):
    graph = small_graph()
    v1 = {
        "schema_version": 1,
        "model": "smallnet",
        "fingerprint": fingerprint(graph),
        "input_shape": [3, 8, 8],
        "bias_update": 3,
        "weight_updates": [
            {"layer": "c1", "conv_index": 1, "ratio": 0.5, "select": "magnitude-"},
            {"layer": "c2", "conv_index": 2, "ratio": 0.25},
        ],
    }
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(v1))
    s = load_scheme(path)
    assert s.schema_version == 1
    assert scheme_to_plan(graph, s).train == {
        "b1": Train(0.0, True),
        "b2": Train(0.0, True),
        "c1": Train(0.5, False, "magnitude-"),
        "c2": Train(0.25, False, "magnitude+"),
        "c3": Train(0.0, True),
        "fc": Train(1.0, True),
    }
    s.save(tmp_path / "again.json")  # written back as version 4, meaning the same
    again = load_scheme(tmp_path / "again.json")
    assert json.loads((tmp_path / "again.json").read_text())["schema_version"] == 4
    assert scheme_to_plan(graph, again) == scheme_to_plan(graph, s)
    # and applied, c1 trains its 4 smallest-norm input channels (ranked here by hand)
    model = SmallNet()
    w = model.c1.weight.detach()
    norms = [float(w[:, c].pow(2).sum()) for c in range(8)]
    smallest = sorted(sorted(range(8), key=lambda c: (norms[c], c))[:4])
    apply_scheme(model, s)
    assert model.c1.idx.tolist() == smallest


VERSION_1 = [
    p
    for p in sorted(memplan.shipped_scheme("mcunet-5fps-100KB").parent.glob("*.json"))
    if json.loads(p.read_text())["schema_version"] == 1
]


@pytest.mark.parametrize("path", VERSION_1)
def test_shipped_version_1_schemes_mean_the_same(path, tmp_path):
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 1
    s = load_scheme(path)
    graph = memplan.capture(s.model, s.input_shape[:1] + [32, 32], classes=10).graph  # fingerprint ignores size
    plan = scheme_to_plan(graph, s)
    assert scheme_to_plan(graph, scheme_from_dict({**raw, "schema_version": 2})) == plan
    s.save(tmp_path / "v2.json")
    assert scheme_to_plan(graph, load_scheme(tmp_path / "v2.json")) == plan
    assert all(t.channels is None for t in plan.train.values())
    convs = conv_layers(graph)
    for w in raw["weight_updates"]:  # the file's ratio and rule, read off the JSON itself
        t = plan.train[convs[w["conv_index"]].name]
        assert (t.weight, t.select) == (w["ratio"], w.get("select", "magnitude+"))


# --------------------------------------------------------------------------- tiny-training


def test_backward_config_refuses_explicit_channels():
    graph = small_graph()
    text = one_line_error(importance_scheme(graph).to_backward_config, match="no explicit channel indices")
    assert "conv 1 (c1)" in text
    # a magnitude+ scheme of the same shape exports; importance is no weight_select_criteria
    assert importance_scheme(graph, select="magnitude+").to_backward_config()["weight_select_criteria"] == "magnitude+"
    with pytest.raises(ValueError, match="select must be one of"):  # a contribution protocol cannot list channels
        Protocol(select="importance")
    bc = {"n_bias_update": 3, "manual_weight_idx": [1], "weight_update_ratio": [0.5]}
    one_line_error(
        Scheme.from_backward_config,
        {**bc, "weight_select_criteria": "importance"},
        graph,
        match="unknown weight_select_criteria",
    )


# --------------------------------------------------------------------------- apply


def applied_pair():
    """(plain reference, the same model with the importance scheme applied, graph, plan)."""
    torch.manual_seed(0)
    model = SmallNet()
    reference = copy.deepcopy(model).eval()
    graph = capture_graph(model, SHAPE)
    scheme = importance_scheme(graph)
    plan = scheme_to_plan(graph, scheme)
    apply_scheme(model, scheme, graph)
    return reference, model, graph, plan


def test_apply_outputs_unchanged_and_lean_modules_hold_the_channels():
    reference, model, _, _ = applied_pair()
    assert isinstance(model.c1, SubChannelConv) and model.c1.idx.tolist() == C1 and model.c1.rule == "importance"
    assert isinstance(model.c2, SubChannelConv) and model.c2.idx.tolist() == C2
    x, _ = data()
    with torch.no_grad():
        before = reference(x)
        assert torch.equal(model(x), before)  # as applied (norms in eval mode, nothing stochastic)
        assert torch.equal(model.eval()(x), before)


def test_one_step_changes_exactly_the_listed_channels():
    _, model, _, _ = applied_pair()
    w1, w2 = model.c1.weight.detach().clone(), model.c2.weight.detach().clone()
    frozen = {k: v.detach().clone() for k, v in model.named_parameters() if not v.requires_grad}
    x, y = data()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    write_back(model)
    a1, a2 = model.c1.weight.detach(), model.c2.weight.detach()
    changed1 = [c for c in range(8) if not torch.equal(a1[:, c], w1[:, c])]
    changed2 = [c for c in range(16) if not torch.equal(a2[c], w2[c])]  # depthwise: one filter per channel
    assert changed1 == C1 and changed2 == C2
    for name, value in frozen.items():  # everything else that does not train stays bit-identical
        if name not in ("c1.weight", "c2.weight"):
            assert torch.equal(dict(model.named_parameters())[name], value), name


def test_saved_bytes_measured_equal_the_prediction_and_magnitude():
    _, model, graph, plan = applied_pair()
    x, y = data()
    predicted = compute(graph, plan, get_mode("applied")).totals.saved_activation_bytes
    assert saved_bytes(model, x, y, backward=True).bytes == predicted
    # magnitude+ at the same ratios: the same prediction and the same measurement
    torch.manual_seed(0)
    other = SmallNet()
    g2 = capture_graph(other, SHAPE)
    magnitude = importance_scheme(g2, select="magnitude+")
    p2 = scheme_to_plan(g2, magnitude)
    apply_scheme(other, magnitude, g2)
    assert other.c1.idx.tolist() != C1  # a different selection ...
    assert compute(g2, p2, get_mode("applied")).totals.saved_activation_bytes == predicted
    assert saved_bytes(other, x, y, backward=True).bytes == predicted  # ... keeps as many bytes


def test_apply_plan_with_channels_directly():
    torch.manual_seed(0)
    model = SmallNet()
    graph = capture_graph(model, SHAPE)
    plan = Plan("x", {"c1": Train(0.25, False, "importance", (3, 7)), "fc": Train(1.0, True)})
    apply_plan(model, plan, graph)
    assert model.c1.idx.tolist() == [3, 7] and model.c1.weight_sel.shape == (16, 2, 1, 1)
    assert torch.equal(model.c1.weight_sel, model.c1.weight[:, [3, 7]])
    bad = Plan("x", {"c1": Train(0.25, False, "importance", (3,)), "fc": Train(1.0, True)})
    fresh = SmallNet()
    text = str(pytest.raises(BadOption, apply_plan, fresh, bad, capture_graph(fresh, SHAPE)).value)
    assert text == "plan trains listed channels of conv 'c1': 1 channel indices given; ratio 0.25 of 8 channels keeps 2"
    assert not any(isinstance(m, SubChannelConv) for m in fresh.modules())  # refused before any swap


def test_select_channels_refuses_importance_and_lean_conv_checks_channels():
    conv = nn.Conv2d(8, 4, 1)
    with pytest.raises(BadOption, match="explicit channel indices"):
        select_channels(conv.weight, 1, 0.5, "importance")
    with pytest.raises(BadOption, match="explicit channels"):
        SubChannelConv.from_module(copy.deepcopy(conv), 0.5, "importance")  # no channels
    lean = SubChannelConv.from_module(copy.deepcopy(conv), 0.5, "importance", channels=torch.tensor([1, 2, 4, 7]))
    assert lean.idx.tolist() == [1, 2, 4, 7]
    with pytest.raises(BadOption, match="explicit channels"):
        SubChannelConv.from_module(copy.deepcopy(conv), 0.5, "magnitude+", channels=[0, 1, 2, 3])
    with pytest.raises(BadOption, match="not sorted"):
        SubChannelConv.from_module(copy.deepcopy(conv), 0.5, "importance", channels=[3, 2, 1, 0])
