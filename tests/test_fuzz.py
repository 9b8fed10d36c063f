"""Property-based fuzzing of the cost model on random small CNNs (tests/fuzz_models.py).

For every drawn architecture:

* the traced graph's shapes, strides and storage sharing == an eager run of the same trace;

and for 1-3 random trainable subsets of it:

* ``pytorch`` mode saved bytes == saved_tensors_hooks measurement after ``apply_plain``;
* forward FLOPs of conv / linear / matmul == FlopCounterMode's forward count, and their
  grad-input + grad-weight FLOPs == FlopCounterMode's backward count (group-aware conv rule);
* every generated op is known (``unknown_ops == {}``);
* ``applied`` mode == measurement after ``memplan.apply.apply_plan``.

The ``ci`` profile (tests/conftest.py) runs a fixed, derandomized set of examples;
``pytest tests/test_fuzz.py --hypothesis-profile long`` runs thousands of random ones.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
from hypothesis import given, strategies as st

from memplan.accounting.engine import compute
from memplan.apply import apply_plain, apply_plan
from memplan.graph import LayerGraph, Node
from memplan.graph.capture import capture_graph
from memplan.graph.trace import trace
from memplan.modes import get_mode
from memplan.plan import Plan, Train
from memplan.strategies import make_plan
from memplan.verify.measure import saved_bytes

from .fuzz_models import (
    Act,
    ChannelMixU,
    Conv,
    ConvU,
    DropoutU,
    Head,
    MatmulU,
    NetSpec,
    Norm,
    PadU,
    ResidualU,
    build,
    nets,
    plans,
    sample_batch,
)
from .test_flops import measure_flops

#: op kinds the generator must produce over a CI run (checked, so the generator cannot quietly shrink)
GENERATED_KINDS = {
    "conv",
    "linear",
    "batchnorm",
    "groupnorm",
    "layernorm",
    "relu",
    "hardtanh",
    "leaky_relu",
    "hardswish",
    "hardsigmoid",
    "silu",
    "gelu",
    "sigmoid",
    "tanh",
    "elu",
    "add",
    "mul",
    "cat",
    "view",
    "getitem",
    "maxpool",
    "avgpool",
    "adaptive_avgpool",
    "adaptive_maxpool",
    "dropout",
    "interpolate",
    "pad",
    "matmul",
    "softmax",
    "mean",
}

#: the padding="same" warning about a zero-padded input copy is expected (and costed)
same_padding_warning = pytest.mark.filterwarnings("ignore:Using padding='same'")


def assert_layouts_match_eager(model: nn.Module, graph: LayerGraph, x: torch.Tensor) -> None:
    """Every traced tensor has eager's shape and strides, and shares a storage with exactly the
    tensors it shares one with in eager (what view / copy / in-place decisions rest on)."""
    for m in model.modules():  # eval: batch statistics of a batch of one would raise
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            m.eval()
    gm = trace(model)
    run = fx.Interpreter(gm, garbage_collect_values=False)
    with torch.no_grad():
        run.run(x)
    eager: dict[int, list[int]] = {}
    traced: dict[int, list[int]] = {}
    for fx_node, node in zip(gm.graph.nodes, [n for n in graph.nodes if n.kind != "cross_entropy"]):
        value = run.env[fx_node]
        if fx_node.op == "output" or not isinstance(value, torch.Tensor):
            continue
        out = node.outs[0]
        assert (tuple(value.shape), tuple(value.stride())) == (out.shape, out.strides), node
        eager.setdefault(value.untyped_storage().data_ptr(), []).append(node.index)
        traced.setdefault(out.storage, []).append(node.index)
    assert sorted(eager.values()) == sorted(traced.values())


@same_padding_warning
def test_pytorch_mode_and_flops_match_measurement():
    kinds: Counter[str] = Counter()

    @given(st.data())
    def check(data):
        spec = data.draw(nets(), label="spec")
        model = build(spec)
        graph = capture_graph(model, spec.input_shape)
        kinds.update(n.kind for n in graph.nodes)
        x, y = sample_batch(spec)
        assert_layouts_match_eager(model, graph, x)
        for plan in data.draw(st.lists(plans(graph), min_size=1, max_size=3), label="plans"):
            prof = compute(graph, plan, get_mode("pytorch"))
            assert prof.unknown_ops == {}
            apply_plain(model, graph, plan)
            meas = saved_bytes(model, x, y, backward=True)  # backward: the model is valid as trained
            assert prof.totals.saved_activation_bytes == meas.bytes, meas.tensors
            model.zero_grad(set_to_none=True)
            fwd, bwd = measure_flops(model, spec.input_shape, spec.classes)
            t = prof.totals
            assert t.forward_flops == fwd
            assert t.backward_grad_input_flops + t.backward_grad_weight_flops == bwd

    check()
    assert GENERATED_KINDS <= set(kinds), GENERATED_KINDS - set(kinds)


def lean_partial(node: Node) -> bool:
    """Layers apply_plan can update partially: convs with groups 1 or depthwise (SubChannelConv)."""
    return node.kind == "conv" and node.attrs["groups"] in (1, node.in_tensors[0].shape[1])


@same_padding_warning
@given(st.data())
def test_applied_mode_matches_measurement_after_apply_plan(data):
    spec = data.draw(nets(), label="spec")
    graph = capture_graph(build(spec), spec.input_shape)
    x, y = sample_batch(spec)
    for plan in data.draw(st.lists(plans(graph, lean_partial), min_size=1, max_size=2), label="plans"):
        model = build(spec)  # apply_plan swaps modules in place: a fresh model per plan
        graph = capture_graph(model, spec.input_shape)
        prof = compute(graph, plan, get_mode("applied"))
        assert prof.unknown_ops == {}
        apply_plan(model, plan, graph)
        meas = saved_bytes(model, x, y, backward=True)
        assert prof.totals.saved_activation_bytes == meas.bytes, meas.tensors


HEAD = Head("adaptive_avg", "module", None, None, None, None, True)
#: minimal reproductions of what the fuzzer found (each a former byte mismatch in ``pytorch`` mode)
REGRESSIONS = {
    "dropout p=0 keeps nothing": (
        ConvU(Conv(4, 3, pad=1)),
        DropoutU("dropout", 0.0, False),
        DropoutU("functional", 0.0, False),
    ),
    "Dropout2d keeps one mask value per channel": (ConvU(Conv(4, 3, pad=1)), DropoutU("dropout2d", 0.5, False)),
    "BatchNorm without running stats uses batch stats in eval": (
        ConvU(Conv(4, 3, pad=1, norm=Norm("bn", stats=False))),
    ),
    "ELU keeps its input": (ConvU(Conv(4, 3, pad=1, act=Act("elu", "functional"))), ConvU(Conv(4, 1))),
    "in-place torch.* / F.*_ activations": tuple(
        ConvU(Conv(4, 3 if i == 0 else 1, pad=int(i == 0), act=Act(kind, "torch", True)))
        for i, kind in enumerate(["hardtanh", "leaky_relu", "elu", "sigmoid", "tanh"])
    ),
    "bmm keeps transposed operands as views": (
        ConvU(Conv(4, 3, pad=1)),
        MatmulU("gram", False, "torch", "bmm"),
        MatmulU("gram_t", True, "method", "operator"),
    ),
    "4-dim matmul and 2-dim @ 3-dim": (
        ConvU(Conv(4, 3, pad=1)),
        MatmulU("spatial", True, "torch", "operator"),
        MatmulU("left", False, "reshape", "operator"),
    ),
    "conv padding modes and padding='same'": tuple(
        ConvU(Conv(4, k, pad=pad, pad_mode=mode))
        for k, pad, mode in [
            (3, 1, "reflect"),
            (3, 1, "replicate"),
            (3, 1, "circular"),
            (4, "same", "zeros"),
            (2, "same", "reflect"),
        ]
    ),
    # a permuted-back channels-last tensor: conv and BatchNorm keep that layout, LayerNorm does not;
    # the ReLU keeps the tensor the next Linear flattens (a view or a copy, depending on the layout)
    "layouts: conv / norms after a channels-last permute": (ConvU(Conv(4, 3, pad=1)),)
    + tuple(
        u
        for conv in [
            Conv(4, 1, act=Act("relu")),
            Conv(4, 1, norm=Norm("bn"), act=Act("relu")),
            Conv(4, 3, pad=1, pad_mode="reflect", norm=Norm("ln_w"), act=Act("relu")),
        ]
        for u in (ChannelMixU(4, False, None, False), ConvU(conv))
    )
    + (ChannelMixU(4, False, None, False),),
    "reflect / replicate padding keep their input": (ConvU(Conv(4, 3, pad=1)),)
    + tuple(
        PadU(pads, mode, form)
        for pads, mode in [
            ((1, 1, 1, 1), "reflect"),
            ((1, 0, 0, 1), "replicate"),
            ((1, 1, 0, 0), "constant"),
            ((0, 1, 1, 0), "circular"),
        ]
        for form in ("functional", "module")
    ),
}


@same_padding_warning
@pytest.mark.parametrize("name", REGRESSIONS)
@pytest.mark.parametrize("method", ["full", "bias"])
def test_fuzzer_findings_stay_fixed(name, method):
    spec = NetSpec(2, 3, (6, 6), REGRESSIONS[name], HEAD, 3)
    model = build(spec)
    graph = capture_graph(model, spec.input_shape)
    plan = make_plan(graph, method)
    prof = compute(graph, plan, get_mode("pytorch"))
    assert prof.unknown_ops == {}
    apply_plain(model, graph, plan)
    meas = saved_bytes(model, *sample_batch(spec), backward=True)
    assert prof.totals.saved_activation_bytes == meas.bytes, meas.tensors


class Doubled(nn.Module):
    """A custom op memplan has no rule for (made a leaf below)."""

    def forward(self, x):
        return x * 2


class WithUnknownOps(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.shuffle = nn.PixelShuffle(2)  # 8 -> 2 channels, 2x spatial
        self.custom = Doubled()
        self.fc = nn.Linear(2, 4)

    def forward(self, x):
        x = torch.cumsum(torch.cumsum(self.conv(x), 1), 2)
        x = self.custom(self.shuffle(x)).cumsum(3)
        return self.fc(x.mean((2, 3)))


@pytest.mark.parametrize("method", ["full", "bias"])
def test_ops_without_rules_are_observed_and_counted(method):
    """cumsum, PixelShuffle and a user leaf have no cost rule: they are replayed on meta, listed
    with counts, and the total equals the measurement (every mode uses the observed bytes)."""
    model = WithUnknownOps()
    graph = capture_graph(model, (2, 3, 6, 6), leaf_modules=[Doubled])
    plan = make_plan(graph, method)
    for mode in ("pytorch", "ideal"):
        prof = compute(graph, plan, get_mode(mode))
        assert prof.unknown_ops == {}
        assert prof.observed_ops == {"cumsum": 2, "PixelShuffle": 1, "Doubled": 1, "Tensor.cumsum": 1}
        assert "observed" in prof.conventions
        assert [layer.target for layer in prof.layers if layer.kind == "unknown"] == [
            "cumsum",
            "cumsum",
            "PixelShuffle",
            "Doubled",
            "Tensor.cumsum",
        ]
    prof = compute(graph, plan, get_mode("pytorch"))
    apply_plain(model, graph, plan)
    meas = saved_bytes(model, torch.randn(2, 3, 6, 6), torch.randint(0, 4, (2,)))
    assert prof.totals.saved_activation_bytes == meas.bytes, meas.tensors


class MetaIncapable(nn.Module):
    """A leaf whose forward needs data (an unbounded op if it could not run anywhere)."""

    def forward(self, x):
        return x * 2 if x.sum() > 0 else x


def test_op_that_cannot_run_on_meta_is_replayed_on_cpu():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), MetaIncapable(), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))
    graph = capture_graph(model, (2, 3, 6, 6), leaf_modules=[MetaIncapable])
    plan = make_plan(graph, "full")
    prof = compute(graph, plan, get_mode("pytorch"))
    assert prof.observed_ops == {"MetaIncapable": 1} and prof.unknown_ops == {}
    apply_plain(model, graph, plan)
    assert (
        prof.totals.saved_activation_bytes
        == saved_bytes(model, torch.randn(2, 3, 6, 6), torch.randint(0, 2, (2,))).bytes
    )


def test_applied_shared_activation():
    """Found by the fuzzer: apply_plan swaps a module once for all its calls, so the lean
    decision must be one per module (it was per call)."""
    # conv -> [conv -> relu -> conv] + proj(x) -> the same relu again (ResNet BasicBlock style)
    spec = NetSpec(
        1,
        2,
        (4, 4),
        (
            ConvU(Conv(2, 1, bias=False)),
            ResidualU(
                body=(Conv(2, 1, bias=False, act=Act("relu")), Conv(1, 1, bias=False)),
                proj=Conv(1, 1, bias=False),
                add="plus",
                post=Act("relu"),
                share_act=True,
            ),
        ),
        Head("adaptive_avg", "module", None, None, None, None, False),
        classes=2,
    )
    model = build(spec)
    graph = capture_graph(model, spec.input_shape)
    plan = Plan("full", {n.name: Train(1.0) for n in graph.param_nodes()})
    prof = compute(graph, plan, get_mode("applied"))
    apply_plan(model, plan, graph)
    assert prof.totals.saved_activation_bytes == saved_bytes(model, *sample_batch(spec)).bytes


# ---------------------------------------------------------- tied weights (a fuzzer finding, fixed in plan.py)


class Tied(nn.Module):
    """One Linear applied twice (tied weights)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(self.fc(x))


def test_module_called_twice_trains_at_every_call():
    model = Tied()
    graph = capture_graph(model, (2, 8))
    plan = make_plan(graph, "full")
    prof = compute(graph, plan, get_mode("pytorch"))
    apply_plain(model, graph, plan)
    meas = saved_bytes(model, torch.randn(2, 8), torch.zeros(2, dtype=torch.long))
    # both calls keep their (2 x 8) input for the weight gradient, + the loss's log-softmax, target, weight
    assert meas.bytes == 2 * (2 * 8 * 4) + 2 * 8 * 4 + 2 * 8 + 4
    assert prof.totals.saved_activation_bytes == meas.bytes
