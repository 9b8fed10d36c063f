"""Property-based fuzzing of the cost model on random small CNNs (tests/fuzz_models.py).

For every drawn architecture and 1-3 random trainable subsets:

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
import torch.nn as nn
from hypothesis import given, strategies as st

from memplan.costs import compute
from memplan.graph import Node, capture
from memplan.measure import apply_plain, saved_bytes
from memplan.modes import get_mode
from memplan.strategies import make_plan

from .fuzz_models import build, nets, plans, sample_batch
from .test_flops import measure_flops

#: op kinds the generator must produce over a CI run (checked, so the generator cannot quietly shrink)
GENERATED_KINDS = {
    "conv", "linear", "batchnorm", "groupnorm", "layernorm", "relu", "hardtanh", "leaky_relu", "hardswish",
    "hardsigmoid", "silu", "gelu", "sigmoid", "tanh", "elu", "add", "mul", "cat", "view", "getitem",
    "maxpool", "avgpool", "adaptive_avgpool", "adaptive_maxpool", "dropout", "interpolate", "pad", "matmul",
    "softmax", "mean",
}

#: the padding="same" warning about a zero-padded input copy is expected (and costed)
same_padding_warning = pytest.mark.filterwarnings("ignore:Using padding='same'")


@same_padding_warning
def test_pytorch_mode_and_flops_match_measurement():
    kinds: Counter[str] = Counter()

    @given(st.data())
    def check(data):
        spec = data.draw(nets(), label="spec")
        model = build(spec)
        graph = capture(model, spec.input_shape)
        kinds.update(n.kind for n in graph.nodes)
        x, y = sample_batch(spec)
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
    apply_plan = pytest.importorskip("memplan.apply").apply_plan
    spec = data.draw(nets(), label="spec")
    graph = capture(build(spec), spec.input_shape)
    x, y = sample_batch(spec)
    for plan in data.draw(st.lists(plans(graph, lean_partial), min_size=1, max_size=2), label="plans"):
        model = build(spec)  # apply_plan swaps modules in place: a fresh model per plan
        graph = capture(model, spec.input_shape)
        prof = compute(graph, plan, get_mode("applied"))
        assert prof.unknown_ops == {}
        apply_plan(model, plan, graph)
        meas = saved_bytes(model, x, y, backward=True)
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


@pytest.mark.parametrize("mode", ["pytorch", "ideal"])
def test_unmodelled_ops_are_reported_with_counts(mode):
    graph = capture(WithUnknownOps(), (2, 3, 6, 6), leaf_modules=[Doubled])
    prof = compute(graph, make_plan(graph, "full"), get_mode(mode))
    assert prof.unknown_ops == {"cumsum": 2, "PixelShuffle": 1, "Doubled": 1, "Tensor.cumsum": 1}
    assert [layer.target for layer in prof.layers if layer.kind == "unknown"] == [
        "cumsum", "cumsum", "PixelShuffle", "Doubled", "Tensor.cumsum"]
