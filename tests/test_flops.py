"""FLOPs of conv / linear / matmul against independent counts.

Forward: torch.utils.flop_counter.FlopCounterMode. Backward: FlopCounterMode with the conv
backward formula replaced by a group-aware one (torch 2.13 over-counts the weight gradient
of grouped / depthwise convs by the group factor; shown in test_flop_counter_group_bug).
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from memplan.accounting.engine import compute
from memplan.apply import apply_plain
from memplan.costs.observe import conv_backward_flops
from memplan.graph.capture import capture_graph
from memplan.models import zoo
from memplan.modes import get_mode
from memplan.strategies import make_plan

from .conftest import small_shape
from .helpers import STRATEGIES, real_model

aten = torch.ops.aten


def measure_flops(model, shape, classes=10):
    x = torch.randn(shape)
    y = torch.randint(0, classes, (shape[0],))
    with FlopCounterMode(display=False) as fwd:
        loss = F.cross_entropy(model(x), y)
    with FlopCounterMode(display=False, custom_mapping={aten.convolution_backward: conv_backward_flops}) as bwd:
        if loss.requires_grad:
            loss.backward()
    return fwd.get_total_flops(), bwd.get_total_flops()


@pytest.mark.parametrize("name", zoo.names())
def test_forward_and_backward_flops(name):
    model = real_model(name)
    shape = small_shape(name)
    graph = capture_graph(model, shape)
    for method, opts in STRATEGIES:
        if method == "lastk" and not graph.blocks:
            opts = {"layers": 3}
        plan = make_plan(graph, method, **opts)
        prof = compute(graph, plan, get_mode("pytorch"))
        apply_plain(model, graph, plan)
        model.zero_grad(set_to_none=True)
        fwd, bwd = measure_flops(model, shape)
        t = prof.totals
        assert t.forward_flops == fwd == 2 * t.macs, (name, method)
        assert t.backward_grad_input_flops + t.backward_grad_weight_flops == bwd, (name, method)


def test_flop_counter_group_bug_is_avoided():
    """Depthwise conv: FlopCounterMode counts the weight gradient x groups; memplan does not."""
    conv = nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False)
    x = torch.randn(2, 32, 8, 8, requires_grad=True)
    with FlopCounterMode(display=False) as fc:
        conv(x).sum().backward()
    counted = fc.get_total_flops()
    fwd = 2 * 2 * 32 * 8 * 8 * 9  # hand count: 2 x out_numel x (C_in / groups) x k^2
    graph = capture_graph(nn.Sequential(conv, nn.Flatten(), nn.Linear(32 * 64, 2)), (2, 32, 8, 8))
    prof = compute(graph, make_plan(graph, "full"), get_mode("pytorch"))
    layer = prof.layer("0")
    assert layer.forward_flops == fwd
    assert layer.backward_grad_weight_flops == fwd
    assert counted > fwd + 2 * fwd  # torch over-counts (forward + inflated backward)


def test_matmul_and_functional_linear_hand_count():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(6, 5))
            self.fc = nn.Linear(5, 3)

        def forward(self, x):  # x: B x 4 x 6
            h = x @ self.w  # B x 4 x 5: MACs = B*4*5*6
            return self.fc(h.mean(1))

    graph = capture_graph(M(), (2, 4, 6))
    prof = compute(graph, make_plan(graph, "full"), get_mode("pytorch"))
    assert prof.totals.macs == 2 * 4 * 5 * 6 + 2 * 5 * 3


def test_sub_channel_weight_gradient_fraction():
    """A ratio-r update computes r of the weight gradient in the ideal mode (accounting.md §5)."""
    from memplan.plan import Plan, Train

    model = nn.Sequential(nn.Conv2d(16, 8, 1), nn.Flatten(), nn.Linear(8 * 16, 2))
    graph = capture_graph(model, (1, 16, 4, 4))
    plan = Plan("sparse", {"0": Train(0.25, True), "2": Train(1.0, True)})
    full = 2 * 8 * 16 * 16  # 2 x out_numel x C_in
    ideal = compute(graph, plan, get_mode("ideal")).layer("0")
    plain = compute(graph, plan, get_mode("pytorch")).layer("0")
    assert ideal.backward_grad_weight_flops == full // 4
    assert plain.backward_grad_weight_flops == full
    assert ideal.trainable_params == 8 * 4 + 8 and plain.trainable_params == 8 * 16 + 8  # + bias
