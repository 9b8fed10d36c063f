"""The simulated training-step peak against torch.profiler's allocation records (CPU)."""

import pytest
import torch

from memplan.costs.engine import compute
from memplan.graph import capture
from memplan.apply import apply_plain
from memplan.verify.measure import step_peak_bytes
from memplan.modes import get_mode
from memplan.strategies import make_plan

from .helpers import real_model


CASES = [("mcunet-5fps", "full", {}), ("mcunet-5fps", "bias", {}), ("mobilenetv3-small", "full", {}),
         ("mobilenetv3-small", "bias", {})]
#: where CPU kernel workspaces (im2col buffers of dense 3x3-conv backward) dominate the step. Their
#: size depends on the CPU's kernel choice: resnet18 full measured 49.6 MB predicted vs 49.0 MB on an
#: AVX-512 Xeon, 73.7 MB on an AVX2-only EPYC; resnet18 bias 6.9 vs 16.6 MB.
WORKSPACE_DOMINATED = [("resnet18", "full", {}), ("resnet18", "bias", {})]


def predicted_and_measured_peak(name, method, opts):
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
    return predicted, measured


@pytest.mark.parametrize("name,method,opts", CASES)
def test_peak_close_to_measured(name, method, opts):
    """Within 5% where saved activations dominate the step."""
    predicted, measured = predicted_and_measured_peak(name, method, opts)
    assert abs(predicted - measured) <= 0.05 * measured, (predicted, measured)


@pytest.mark.parametrize("name,method,opts", WORKSPACE_DOMINATED)
def test_workspace_dominated_peak_is_a_known_gap(name, method, opts, record_property):
    """Known gap: kernel workspaces are not in the simulated step, so where they dominate the
    prediction is low by a CPU-dependent amount. What holds on any CPU: it is never more than 5%
    above the measurement (the model only leaves memory out). The numbers are recorded."""
    predicted, measured = predicted_and_measured_peak(name, method, opts)
    record_property("peak_predicted_bytes", predicted)
    record_property("peak_measured_bytes", measured)
    print(f"{name} {method}: predicted {predicted} B, measured {measured} B ({predicted / measured:.2f}x)")
    assert predicted <= 1.05 * measured, (predicted, measured)
