"""Micro-batching (``--micro-batch M``, gradient accumulation): one micro-batch's saved activations,
measured on a real accumulation loop with ``saved_tensors_hooks``; the warning where BatchNorm's
batch statistics make the micro-batched step compute something else, checked on real gradients."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memplan
from memplan.apply import apply_plain
from memplan.cli import main
from memplan.errors import AssumptionWarning, BadOption
from memplan.strategies import make_plan
from memplan.verify.measure import saved_bytes, step_peak_bytes

SHAPE = (3, 8, 8)
BATCH, MICRO = 8, 4


def _net(norm: str = "batch") -> nn.Module:
    torch.manual_seed(0)
    layer = nn.BatchNorm2d(8) if norm == "batch" else nn.GroupNorm(2, 8)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), layer, nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)
    )


def _profile(model: nn.Module, method: str = "full", **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = memplan.profile(model, method, batch=BATCH, input_shape=SHAPE, calibration=None, **kw)
    return p, [w for w in caught if issubclass(w.category, AssumptionWarning)]


@pytest.mark.parametrize("method", ["full", "bias", "last"])
def test_one_micro_batch_of_activations_measured(method):
    model = _net("group")
    p, _ = _profile(model, method, micro_batch=MICRO)
    graph = memplan.capture(model, batch=BATCH // MICRO, input_shape=SHAPE).graph
    apply_plain(model, graph, make_plan(graph, method))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn((BATCH, *SHAPE), generator=g), torch.randint(0, 10, (BATCH,), generator=g)
    measured = {
        saved_bytes(model, xs.clone(), ys.clone(), backward=True).bytes  # micro-batches of their own, as loaded
        for xs, ys in zip(x.chunk(MICRO), y.chunk(MICRO))  # the accumulation loop
    }
    assert measured == {p.totals.saved_activation_bytes}
    whole, _ = _profile(_net("group"), method)
    assert p.totals.weight_bytes == whole.totals.weight_bytes
    assert p.totals.gradient_bytes == whole.totals.gradient_bytes
    assert p.totals.saved_activation_bytes < whole.totals.saved_activation_bytes
    assert p.batch == BATCH // MICRO
    assert p.extras["micro_batch"]["micro_batches"] == MICRO and p.extras["micro_batch"]["batch"] == BATCH


def _accumulated_grads(model: nn.Module, micro: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn((BATCH, *SHAPE), generator=g), torch.randint(0, 10, (BATCH,), generator=g)
    model.train().zero_grad()
    for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
        (F.cross_entropy(model(xs), ys) / micro).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_batchnorm_in_train_mode_warns_and_really_changes_the_gradients():
    p, caught = _profile(_net("batch"), micro_batch=MICRO)
    assert p.extras["micro_batch"]["batch_statistic_norms"] == 1
    assert len(caught) == 1 and "changes what the model computes: 1 BatchNorm layer(s)" in str(caught[0].message)
    assert "(1)" in str(caught[0].message)  # it names the layer
    whole, split = _accumulated_grads(_net("batch"), 1), _accumulated_grads(_net("batch"), MICRO)
    assert not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(whole, split))


def test_group_norm_and_frozen_statistics_do_not_warn():
    p, caught = _profile(_net("group"), micro_batch=MICRO)
    assert not caught and p.extras["micro_batch"]["batch_statistic_norms"] == 0
    whole, split = _accumulated_grads(_net("group"), 1), _accumulated_grads(_net("group"), MICRO)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(whole, split))
    _, caught = _profile(_net("batch"), "last", micro_batch=MICRO)  # BatchNorm in eval mode: running statistics
    assert not caught


def test_a_later_micro_batch_peaks_with_the_accumulated_gradients():
    """The peak of a micro-batch after the first: the accumulated gradients held from its start, each
    op's new ones only until they are added in; measured with the allocation replay of a real
    accumulation loop (the first step leaves the gradients, the second adds into them)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    first = memplan.profile(model, batch=8, input_shape=(64,), calibration=None)
    later = memplan.profile(model, batch=16, input_shape=(64,), micro_batch=2, calibration=None)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn((8, 64), generator=g), torch.randint(0, 10, (8,), generator=g)
    resident = first.totals.weight_bytes + x.nbytes + y.nbytes  # allocated before each measured step
    measured_first = step_peak_bytes(model, x, y)
    measured_later = step_peak_bytes(model, x, y)  # the gradients of the first are there: it accumulates
    grads = later.totals.gradient_bytes
    assert later.totals.peak_bytes > first.totals.peak_bytes
    assert abs(first.totals.peak_bytes - resident - measured_first) <= 0.05 * measured_first
    assert abs(later.totals.peak_bytes - resident - grads - measured_later) <= 0.05 * measured_later


def test_accumulation_refuses_an_in_place_schedule():
    with pytest.raises(BadOption, match="schedule 'tte' applies each update in place"):
        memplan.profile(_net(), batch=BATCH, input_shape=SHAPE, micro_batch=MICRO, schedule="tte", calibration=None)


def test_bad_micro_batch_is_one_line(capsys):
    with pytest.raises(BadOption, match="does not divide --batch 8"):
        memplan.profile(_net(), batch=BATCH, input_shape=SHAPE, micro_batch=3)
    with pytest.raises(SystemExit) as exc:
        main(["profile", "mcunet-5fps", "--batch", "4", "--micro-batch", "0"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exc.value.code == 2 and len(lines) == 1 and "--micro-batch must be a positive integer" in lines[0]
