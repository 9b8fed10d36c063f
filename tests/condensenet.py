"""CondenseNet (Huang, Liu, van der Maaten, Weinberger, "CondenseNet: An Efficient DenseNet using
Learned Group Convolutions", CVPR 2018), written here as a test model: no package that installs
offline provides it.

The layers behave as the authors' reference code does (ShichenLiu/CondenseNet, ``layers.py``,
``models/condensenet.py`` and ``models/condensenet_converted.py``), including the habits of code
written for PyTorch 0.3 / 1.x that a user brings along:

* :class:`LearnedGroupConv` (training time): BN, in-place ReLU, optional dropout, then a 1x1 conv
  whose weight is multiplied by a 0/1 mask buffer (``conv.weight * Variable(self._mask)``) before
  ``F.conv2d`` with ``groups=1``. Each call first asks, by comparing the ``_stage`` buffer with the
  global progress (a tensor comparison used as a Python bool: data-dependent control flow), whether
  the condensing schedule has reached a new stage, and then zeroes the mask of the least important
  input channels of each group in place;
* :class:`CondenseConv` (inference time, after condensing): ``torch.index_select`` of the kept input
  channels by an int64 ``index`` buffer, BN, in-place ReLU, a grouped 1x1 conv, then
  :func:`shuffle_layer` (view to ``(n, groups, c / groups, h, w)``, transpose 1-2,
  ``.contiguous()``, view back): the channel permutation that interleaves the groups;
* :class:`CondenseLinear`: ``torch.index_select`` of the kept features, then a linear layer;
* the dense layer: LGC 1x1 to ``bottleneck * growth``, BN + ReLU + grouped 3x3 conv to ``growth``,
  ``torch.cat([x, new], 1)``; transitions are 2x2 average pools; after the last block BN, ReLU and a
  global average pool, ``view`` to features, the classifier.

``condensenet(stages, growth, converted=...)``: the training-time network (learned group convs,
linear classifier) or the converted one (condense convs with channel indices, condense linear
classifier). At CIFAR settings (``stages=(14, 14, 14)``, ``growth=(8, 16, 32)``) these are the
paper's CondenseNet-86; small settings keep the tests fast. The converted network's channel
indices are a seeded choice of ``in / condense_factor`` channels per group (what converting a
trained network leaves: each group keeps its own channels, in the order the mask kept them).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Variable


class LearnedGroupConv(nn.Module):
    """Masked 1x1 convolution whose mask the condensing schedule prunes group by group."""

    global_progress = 0.0

    def __init__(self, in_channels: int, out_channels: int, groups: int, condense_factor: int, dropout: float = 0.0):
        super().__init__()
        self.norm = nn.BatchNorm2d(in_channels)
        self.relu = nn.ReLU(inplace=True)
        self.dropout = dropout
        if dropout > 0:
            self.drop = nn.Dropout(dropout, inplace=False)
        self.conv = nn.Conv2d(in_channels, out_channels, 1, bias=False)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.groups, self.condense_factor = groups, condense_factor
        self.register_buffer("_count", torch.zeros(1))
        self.register_buffer("_stage", torch.zeros(1))
        self.register_buffer("_mask", torch.ones(self.conv.weight.size()))

    @property
    def mask(self) -> torch.Tensor:
        return Variable(self._mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_drop()
        x = self.relu(self.norm(x))
        if self.dropout > 0:
            x = self.drop(x)
        weight = self.conv.weight * self.mask
        return F.conv2d(x, weight, None, self.conv.stride, self.conv.padding, self.conv.dilation, 1)

    def _check_drop(self) -> None:
        progress = LearnedGroupConv.global_progress
        stage = self.condense_factor - 1
        for i in range(self.condense_factor - 1):
            if progress * 2 < (i + 1) / (self.condense_factor - 1):
                stage = i
                break
        if not (self._stage >= stage).all():  # a new stage: drop in_channels / condense_factor more
            self._stage.fill_(stage)
            self._drop(self.in_channels // self.condense_factor)

    def _drop(self, delta: int) -> None:
        weight = (self.conv.weight * self.mask).abs().squeeze()
        d_out = self.out_channels // self.groups
        weight = weight.view(d_out, self.groups, self.in_channels).transpose(0, 1).contiguous()
        weight = weight.view(self.out_channels, self.in_channels)
        count = int(self._count[0])
        for g in range(self.groups):
            dropped = weight[g * d_out : (g + 1) * d_out].sum(0).sort()[1][count : count + delta]
            for d in dropped.tolist():
                self._mask[g :: self.groups, d].fill_(0)
        self._count.fill_(count + delta)


def shuffle_layer(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Interleave the output channels of ``groups`` groups (a copy: ``.contiguous()`` after transpose)."""
    n, c, h, w = x.data.size()
    x = x.view(n, groups, c // groups, h, w)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(n, -1, h, w)


def _kept_channels(in_channels: int, groups: int, condense_factor: int, generator: torch.Generator) -> torch.Tensor:
    """Per group, ``in_channels / condense_factor`` input channels kept (seeded, ascending)."""
    keep = in_channels // condense_factor
    picks = [torch.randperm(in_channels, generator=generator)[:keep].sort()[0] for _ in range(groups)]
    return torch.cat(picks)


class CondenseConv(nn.Module):
    """A condensed learned group convolution: gather the kept channels, BN, ReLU, grouped 1x1, shuffle."""

    def __init__(self, in_channels: int, out_channels: int, groups: int, condense_factor: int, seed: int = 0):
        super().__init__()
        self.in_channels = in_channels * groups // condense_factor
        self.groups = groups
        self.norm = nn.BatchNorm2d(self.in_channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(self.in_channels, out_channels, 1, groups=groups, bias=False)
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("index", _kept_channels(in_channels, groups, condense_factor, g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.index_select(x, 1, Variable(self.index))
        x = self.relu(self.norm(x))
        return shuffle_layer(self.conv(x), self.groups)


class CondenseLinear(nn.Module):
    """Linear classifier on the kept half of the features (``torch.index_select`` by an index buffer)."""

    def __init__(self, in_features: int, out_features: int, drop_rate: float = 0.5, seed: int = 0):
        super().__init__()
        self.in_features = int(in_features * drop_rate)
        self.linear = nn.Linear(self.in_features, out_features)
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("index", torch.randperm(in_features, generator=g)[: self.in_features])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.index_select(x, 1, Variable(self.index)))


class Conv(nn.Sequential):
    """BN, in-place ReLU, conv (no bias)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, padding: int = 0, groups: int = 1):
        super().__init__()
        self.add_module("norm", nn.BatchNorm2d(in_channels))
        self.add_module("relu", nn.ReLU(inplace=True))
        self.add_module(
            "conv", nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding, bias=False, groups=groups)
        )


class DenseLayer(nn.Module):
    def __init__(self, in_channels: int, growth: int, cfg: dict, converted: bool, seed: int):
        super().__init__()
        width = cfg["bottleneck"] * growth
        if converted:
            self.conv_1 = CondenseConv(in_channels, width, cfg["group_1x1"], cfg["condense_factor"], seed)
        else:
            self.conv_1 = LearnedGroupConv(in_channels, width, cfg["group_1x1"], cfg["condense_factor"])
        self.conv_2 = Conv(width, growth, 3, padding=1, groups=cfg["group_3x3"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_ = x
        x = self.conv_1(x)
        x = self.conv_2(x)
        return torch.cat([x_, x], 1)


class Transition(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.AvgPool2d(kernel_size=2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


class CondenseNet(nn.Module):
    """Dense blocks of learned group convolutions (``converted``: condensed) between 2x2 pools."""

    def __init__(
        self,
        stages=(14, 14, 14),
        growth=(8, 16, 32),
        num_classes: int = 10,
        converted: bool = False,
        pool_size: int = 8,
        **cfg,
    ):
        super().__init__()
        cfg = {"bottleneck": 4, "group_1x1": 4, "group_3x3": 4, "condense_factor": 4, **cfg}
        self.features = nn.Sequential()
        self.num_features = 2 * growth[0]
        self.features.add_module("init_conv", nn.Conv2d(3, self.num_features, 3, padding=1, bias=False))
        seed = 0
        for i, (layers, k) in enumerate(zip(stages, growth)):
            block = nn.Sequential()
            for j in range(layers):
                seed += 1
                block.add_module(f"denselayer_{j + 1}", DenseLayer(self.num_features + j * k, k, cfg, converted, seed))
            self.features.add_module(f"denseblock_{i + 1}", block)
            self.num_features += layers * k
            if i < len(stages) - 1:
                self.features.add_module(f"transition_{i + 1}", Transition())
        self.features.add_module("norm_last", nn.BatchNorm2d(self.num_features))
        self.features.add_module("relu_last", nn.ReLU(inplace=True))
        self.features.add_module("pool_last", nn.AvgPool2d(pool_size))
        if converted:
            self.classifier = CondenseLinear(self.num_features, num_classes, 0.5)
        else:
            self.classifier = nn.Linear(self.num_features, num_classes)
        self._init()

    def _init(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                m.weight.data.normal_(0, (2.0 / n) ** 0.5)
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.data.fill_(1)
                m.bias.data.zero_()
            elif isinstance(m, nn.Linear):
                m.bias.data.zero_()

    def forward(self, x: torch.Tensor, progress: float | None = None) -> torch.Tensor:
        if progress:
            LearnedGroupConv.global_progress = progress
        features = self.features(x)
        return self.classifier(features.view(features.size(0), -1))


def condensenet(stages=(14, 14, 14), growth=(8, 16, 32), converted: bool = False, resolution: int = 32) -> CondenseNet:
    """CondenseNet for ``resolution``-px inputs (the last pool covers the final feature map)."""
    pool = resolution // 2 ** (len(stages) - 1)
    return CondenseNet(stages, growth, converted=converted, pool_size=pool)
