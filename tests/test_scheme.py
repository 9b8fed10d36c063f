"""Scheme format (v2, reading v1): JSON round trip, tiny-training backward_config import / export, the scheme ->
plan mapping on a hand-checked model, and one-line errors for bad schemes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from memplan.errors import MemplanError
from memplan.graph import conv_layers
from memplan.graph.capture import capture_graph
from memplan.plan import (
    Execution,
    Scheme,
    Train,
    WeightUpdate,
    fingerprint,
    load_scheme,
    new_provenance,
    schema_json,
    scheme_to_plan,
)
from memplan.reproduce.figures import by_key

torch.set_num_threads(1)
SCHEMA_COPY = Path(__file__).resolve().parents[1] / "schema" / "scheme.schema.json"


class SmallNet(nn.Module):
    """c0 3->8 3x3 + BN + ReLU6, c1 8->16 1x1 (pw1) + BN + ReLU6, c2 depthwise 3x3 + BN + ReLU6,
    c3 16->8 1x1 with its own bias (no norm), global pool, fc 8->classes. Convs 0..3 in that order."""

    def __init__(self, classes: int = 4, width: int = 16):
        super().__init__()
        self.c0, self.b0, self.a0 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU6()
        self.c1, self.b1, self.a1 = nn.Conv2d(8, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU6()
        self.c2 = nn.Conv2d(width, width, 3, padding=1, groups=width, bias=False)
        self.b2, self.a2 = nn.BatchNorm2d(width), nn.ReLU6()
        self.c3 = nn.Conv2d(width, 8, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a0(self.b0(self.c0(x)))
        x = self.a1(self.b1(self.c1(x)))
        x = self.a2(self.b2(self.c2(x)))
        return self.fc(torch.flatten(self.pool(self.c3(x)), 1))


def small_graph(classes: int = 4, width: int = 16, side: int = 8, batch: int = 1):
    return capture_graph(SmallNet(classes, width), (batch, 3, side, side), name="smallnet")


def small_scheme(graph, **changes) -> Scheme:
    """Biases of the last 3 convs (c1, c2, c3); c1 weight at 1/2, c2 (depthwise) at 1/4, c3 whole."""
    fields = dict(
        model="smallnet",
        fingerprint=fingerprint(graph),
        input_shape=[3, 8, 8],
        bias_update=3,
        weight_updates=[
            WeightUpdate(layer="c1", conv_index=1, ratio=0.5),
            WeightUpdate(layer="c2", conv_index=2, ratio=0.25),
            WeightUpdate(layer="c3", conv_index=3, ratio=1.0),
        ],
    )
    return Scheme(**{**fields, **changes})


def one_line_error(fn, *args, match: str) -> str:
    with pytest.raises(MemplanError, match=match) as info:
        fn(*args)
    text = str(info.value)
    assert "\n" not in text
    return text


# --------------------------------------------------------------------------- layers, fingerprint


def test_conv_index_is_forward_order():
    assert [c.name for c in conv_layers(small_graph())] == ["c0", "c1", "c2", "c3"]


def test_fingerprint_is_stable_and_ignores_head_and_resolution():
    fp = fingerprint(small_graph())
    assert len(fp) == 16 and int(fp, 16) >= 0
    assert fingerprint(small_graph()) == fp
    assert fingerprint(small_graph(classes=10, side=12, batch=2)) == fp  # head size and input do not matter
    assert fingerprint(small_graph(width=24)) != fp  # a different backbone does


# --------------------------------------------------------------------------- scheme -> plan


def test_scheme_to_plan_hand_checked():
    graph = small_graph()
    plan = scheme_to_plan(graph, small_scheme(graph))
    # c1, c2 have no bias: their BN shift is the bias (eval mode); c3 has its own bias; fc always trains
    assert plan.train == {
        "b1": Train(0.0, True),
        "b2": Train(0.0, True),
        "c1": Train(0.5, False),
        "c2": Train(0.25, False),
        "c3": Train(1.0, True),
        "fc": Train(1.0, True),
    }
    assert plan.norm_train == set() and plan.approx == set()


def test_norm_modes_and_activation_approx():
    graph = small_graph()
    plan = scheme_to_plan(
        graph, small_scheme(graph, norm_modes={"b0": "train", "b1": "affine"}, activation_approx=["a2"])
    )
    assert plan.train["b0"] == Train(1.0, True) and plan.train["b1"] == Train(1.0, True)
    assert plan.norm_train == {"b0"} and plan.approx == {"a2"}


# --------------------------------------------------------------------------- JSON


def test_json_round_trip(tmp_path):
    graph = small_graph()
    s = small_scheme(
        graph,
        budget_bytes=100 * 1024,
        predicted={"total_bytes": 2252.0},
        summed_delta_acc=1.5,
        provenance=new_provenance("memplan plan smallnet", "abc123"),
    )
    path = tmp_path / "s.json"
    s.save(path)
    data = json.loads(path.read_text())
    assert data["schema_version"] == 4 and data["weight_updates"][1]["select"] == "magnitude+"
    assert "channels" not in data["weight_updates"][1]  # only an importance update lists channels
    assert set(data["provenance"]) == {"memplan_version", "command", "date", "profile_hash", "objective", "estimator"}
    assert load_scheme(path) == s


def test_schema_copy_in_repo_is_current():
    assert SCHEMA_COPY.read_text() == schema_json()
    schema = json.loads(schema_json())
    assert schema["properties"]["schema_version"]["enum"] == [1, 2, 3, 4, 5]
    assert {"model", "fingerprint", "bias_update", "input_shape"} <= set(schema["required"])


# --------------------------------------------------------------------------- tiny-training backward_config


def test_backward_config_round_trip():
    graph = small_graph()
    s = small_scheme(graph)
    bc = s.to_backward_config()
    assert bc == {
        "enable_backward_config": 1,
        "n_bias_update": 3,
        "manual_weight_idx": [1, 2, 3],
        "weight_update_ratio": [0.5, 0.25, 1.0],
        "weight_select_criteria": "magnitude+",
        "pw1_weight_only": 0,
        "quantize_gradient": 0,
        "train_scale": 0,
    }
    back = Scheme.from_backward_config(json.loads(json.dumps(bc)), graph, model=s.model, provenance=s.provenance)
    assert back == s
    assert back.to_backward_config() == bc


def test_backward_config_forms():
    graph = small_graph()
    lists = Scheme.from_backward_config(
        {"n_bias_update": 3, "manual_weight_idx": [1, 3], "weight_update_ratio": [0.5, 1]}, graph
    )
    dashed = Scheme.from_backward_config(
        {"n_bias_update": 3, "manual_weight_idx": "1-3", "weight_update_ratio": "0.5-1"}, graph
    )
    assert (
        lists.weight_updates
        == dashed.weight_updates
        == [WeightUpdate(layer="c1", conv_index=1, ratio=0.5), WeightUpdate(layer="c3", conv_index=3, ratio=1.0)]
    )
    # n_weight_update without manual_weight_idx: the last n convs, whole weights; "all" = every conv
    last2 = Scheme.from_backward_config({"n_bias_update": "all", "n_weight_update": 2}, graph)
    assert last2.bias_update == 4 and [(w.conv_index, w.ratio) for w in last2.weight_updates] == [(2, 1.0), (3, 1.0)]
    # ratio 0 = bias only (already covered by n_bias_update): dropped
    zero = Scheme.from_backward_config(
        {"n_bias_update": 3, "manual_weight_idx": [1, 2], "weight_update_ratio": [0, 0.25]}, graph
    )
    assert [w.conv_index for w in zero.weight_updates] == [2]
    # pw1_weight_only keeps only 1x1 convs that expand (c1: 8 -> 16), as tiny-training filters
    pw1 = Scheme.from_backward_config({"n_bias_update": 3, "manual_weight_idx": [1, 2, 3], "pw1_weight_only": 1}, graph)
    assert [w.layer for w in pw1.weight_updates] == ["c1"] and pw1.backward_flags.pw1_weight_only


def test_published_mcunet_scheme_imports():
    import memplan

    cap = memplan.capture("mcunet-5fps", resolution=128, classes=10)
    bc = by_key("tinytraining.fig11.mcunet-5fps.sparse.100kb.memory").options["scheme"]
    s = Scheme.from_backward_config(bc, cap.graph)
    assert s.bias_update == 22 and s.model == "mcunet-5fps" and s.input_shape == [3, 128, 128]
    assert [(w.conv_index, w.ratio) for w in s.weight_updates] == [
        (21, 1.0),
        (24, 1.0),
        (27, 1.0),
        (30, 1.0),
        (36, 0.125),
        (39, 0.25),
    ]
    # all pw1 convs (architectures.md: conv 39 is block 13's 1x1 expansion to 576 channels)
    assert [w.layer for w in s.weight_updates][-1] == "blocks.13.conv.expand.conv"
    out = s.to_backward_config()
    assert {k: out[k] for k in bc} == {**bc, "weight_update_ratio": [1, 1, 1, 1, 0.125, 0.25]}


# --------------------------------------------------------------------------- errors


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(text)
    return path


def test_file_errors(tmp_path):
    one_line_error(load_scheme, tmp_path / "missing.json", match="does not exist")
    one_line_error(load_scheme, write(tmp_path, ""), match="is empty")
    one_line_error(load_scheme, write(tmp_path, '{"schema_version": 1, "model": "x", '), match="not valid JSON")
    one_line_error(load_scheme, write(tmp_path, "[1, 2]"), match="holds a JSON list")
    one_line_error(load_scheme, write(tmp_path, '{"model": "x"}'), match="no schema_version")
    text = one_line_error(load_scheme, write(tmp_path, '{"schema_version": 7}'), match="schema_version 7")
    assert "reads versions 1, 2" in text


def test_validation_errors_name_the_field(tmp_path):
    graph = small_graph()
    good = json.loads(small_scheme(graph).model_dump_json())

    def bad(path_value):
        data = json.loads(json.dumps(good))
        *keys, last, value = path_value
        target = data
        for k in keys:
            target = target[k]
        target[last] = value
        return write(tmp_path, json.dumps(data))

    one_line_error(load_scheme, bad(("weight_updates", 0, "ratio", 1.5)), match=r"'weight_updates\.0\.ratio'")
    one_line_error(load_scheme, bad(("weight_updates", 1, "ratio", 0)), match=r"'weight_updates\.1\.ratio'")
    one_line_error(load_scheme, bad(("weight_updates", 0, "select", "largest")), match=r"'weight_updates\.0\.select'")
    one_line_error(load_scheme, bad(("bias_update", -1)), match="'bias_update'")
    one_line_error(load_scheme, bad(("colour", "red")), match="'colour'")
    one_line_error(load_scheme, bad(("weight_updates", 1, "conv_index", 1)), match="two weight updates")


def test_plan_errors():
    graph = small_graph()
    wu = WeightUpdate
    one_line_error(
        scheme_to_plan,
        graph,
        small_scheme(graph, weight_updates=[wu(layer="c9", conv_index=3, ratio=1)]),
        match="names layer 'c9', but no conv has that name",
    )
    one_line_error(
        scheme_to_plan,
        graph,
        small_scheme(graph, weight_updates=[wu(layer="c1", conv_index=3, ratio=1)]),
        match="conv 3 is 'c3'",
    )
    one_line_error(
        scheme_to_plan,
        graph,
        small_scheme(graph, weight_updates=[wu(layer="c3", conv_index=4, ratio=1)]),
        match="conv index 4 is out of range",
    )
    text = one_line_error(
        scheme_to_plan,
        graph,
        small_scheme(graph, weight_updates=[wu(layer="c0", conv_index=0, ratio=1)]),
        match="outside the bias-update range",
    )
    assert "convs 1 to 3" in text
    one_line_error(scheme_to_plan, graph, small_scheme(graph, bias_update=5), match="the model has 4")
    one_line_error(scheme_to_plan, graph, small_scheme(graph, norm_modes={"nope": "train"}), match="unknown layer")
    one_line_error(scheme_to_plan, graph, small_scheme(graph, activation_approx=["c1"]), match="a conv layer")
    other = small_graph(width=24)
    one_line_error(
        scheme_to_plan,
        other,
        small_scheme(graph),
        match="scheme was planned for smallnet; this model's layer table differs",
    )
    one_line_error(
        Scheme.from_backward_config,
        {"n_bias_update": 1, "manual_weight_idx": [0]},
        graph,
        match="outside the bias-update range",
    )
    one_line_error(
        Scheme.from_backward_config,
        {"n_bias_update": 3, "manual_weight_idx": [1, 2], "weight_update_ratio": [1]},
        graph,
        match="pairs 2",
    )
    one_line_error(Scheme.from_backward_config, {"n_bias_update": 3, "colour": 1}, graph, match="unknown key")
    one_line_error(
        Scheme.from_backward_config, {"n_bias_update": 3, "manual_weight_idx": [3, 1]}, graph, match="not sorted"
    )
    one_line_error(
        Scheme.from_backward_config,
        {"n_bias_update": 3, "manual_weight_idx": [3], "weight_update_ratio": [4]},
        graph,
        match="'weight_updates.0.ratio'",
    )


def test_export_refuses_what_backward_config_cannot_hold():
    graph = small_graph()
    one_line_error(small_scheme(graph, activation_approx=["a2"]).to_backward_config, match="activation_approx")
    mixed = [
        WeightUpdate(layer="c1", conv_index=1, ratio=0.5, select="random"),
        WeightUpdate(layer="c3", conv_index=3, ratio=1.0),
    ]
    one_line_error(small_scheme(graph, weight_updates=mixed).to_backward_config, match="mixes channel selection")
    batched = small_scheme(graph, batch=4, execution=Execution(micro_batches=2))
    one_line_error(batched.to_backward_config, match="execution")
