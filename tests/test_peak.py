"""The simulated training-step peak against torch.profiler's allocation records (CPU)."""

import pytest
import torch

from memplan.costs import compute
from memplan.graph import capture
from memplan.measure import apply_plain, step_peak_bytes
from memplan.modes import get_mode
from memplan.strategies import make_plan

from .helpers import real_model


@pytest.mark.parametrize("name", ["mcunet-5fps", "resnet18", "mobilenetv3-small"])
@pytest.mark.parametrize("method,opts", [("full", {}), ("bias", {}), ("lastk", {"blocks": 2})])
def test_peak_close_to_measured(name, method, opts):
    model = real_model(name)
    shape = (4, 3, 64, 64)
    graph = capture(model, shape)
    plan = make_plan(graph, method, **opts)
    prof = compute(graph, plan, get_mode("pytorch"))
    apply_plain(model, graph, plan)
    model.zero_grad(set_to_none=True)
    x, y = torch.randn(shape), torch.randint(0, 10, (shape[0],))
    measured = step_peak_bytes(model, x, y)
    static = prof.totals.weight_bytes + prof.totals.optimizer_bytes + graph.buffer_bytes
    predicted = prof.totals.peak_bytes - static - x.nbytes  # x and y exist before the measured step
    # kernel workspaces (e.g. an input reorder inside a conv) are not modelled: allow 15%
    assert abs(predicted - measured) <= 0.15 * measured, (predicted, measured)
