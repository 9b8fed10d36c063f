"""`pytorch` mode must equal what eager autograd saves (saved_tensors_hooks), to the byte."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from memplan.models import zoo
from memplan.verify.measure import saved_bytes

from .conftest import small_shape
from .helpers import STRATEGIES, predicted_and_measured, real_model


@pytest.mark.parametrize("name", zoo.names())
def test_zoo_models_all_strategies_byte_exact(name):
    model = real_model(name)
    shape = small_shape(name)
    for method, opts in STRATEGIES:
        prof, meas = predicted_and_measured(model, shape, method, opts)
        assert prof.unknown_ops == {}
        assert prof.totals.saved_activation_bytes == meas.bytes, (name, method, meas.tensors)


@pytest.mark.parametrize(
    "name,batch,res",
    [("mcunet-5fps", 3, 48), ("mobilenetv3-small", 1, 64), ("resnet18", 5, 40), ("proxylessnas-mobile", 4, 56)],
)
def test_other_batch_sizes_and_resolutions(name, batch, res):
    model = real_model(name, classes=7)
    shape = small_shape(name, batch=batch, resolution=res)
    for method, opts in STRATEGIES:
        prof, meas = predicted_and_measured(model, shape, method, opts, classes=7)
        assert prof.totals.saved_activation_bytes == meas.bytes, (name, method)


class Functional(nn.Module):
    """Functional ops as first-class nodes: relu, add, mul, flatten, pooling, interpolate, matmul, cat."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, groups=4)
        self.bn = nn.BatchNorm2d(16)
        self.proj = nn.Linear(16, 16)
        self.fc = nn.Linear(16 * 4, 5)

    def forward(self, x):
        a = F.relu(self.c1(x))
        b = self.c2(a) + a
        b = b * torch.sigmoid(F.adaptive_avg_pool2d(b, 1))
        c = torch.cat([b, F.hardswish(b)], 1)
        c = F.interpolate(self.bn(c), scale_factor=0.5, mode="bilinear", align_corners=False)
        c = F.max_pool2d(c, 2)
        t = torch.flatten(F.adaptive_avg_pool2d(c, 2), 2).transpose(1, 2)  # B x 4 x 16
        t = t @ self.proj.weight + self.proj(t)
        return self.fc(torch.flatten(t, 1))


@pytest.mark.parametrize("method", ["full", "last", "norm", "bias"])
def test_functional_ops_byte_exact(method):
    torch.manual_seed(0)
    model = Functional()
    prof, meas = predicted_and_measured(model, (2, 3, 16, 16), method, {}, classes=5)
    assert prof.unknown_ops == {}
    assert prof.totals.saved_activation_bytes == meas.bytes, meas.tensors


def test_inplace_and_views_share_storage():
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.BatchNorm2d(4),
        nn.ReLU(inplace=True),
        nn.Conv2d(4, 4, 1),
        nn.Hardswish(inplace=True),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 3),
    )
    for method in ["full", "bias", "norm"]:
        prof, meas = predicted_and_measured(model, (2, 3, 8, 8), method, {}, classes=3)
        assert prof.totals.saved_activation_bytes == meas.bytes, (method, meas.tensors)


def test_frozen_prefix_saves_nothing():
    model = real_model("mcunet-5fps")
    prof, meas = predicted_and_measured(model, small_shape("mcunet-5fps"), "last", {})
    # only the classifier's input (batch x 160 floats) and the loss are kept
    assert meas.bytes == prof.totals.saved_activation_bytes == 2 * 160 * 4 + 2 * 10 * 4 + 2 * 8 + 4


def test_measurement_ignores_parameters():
    lin = nn.Linear(4, 3)
    meas = saved_bytes(lin, torch.randn(2, 4, requires_grad=True), torch.zeros(2, dtype=torch.long))
    # weight is a parameter: only the input (frozen? no, trainable weight needs it) and the loss count
    assert meas.bytes == 2 * 4 * 4 + 2 * 3 * 4 + 2 * 8 + 4
