"""GhostNet (Han et al., "GhostNet: More Features from Cheap Operations", CVPR 2020), written here
as a test model: no library that installs offline provides it (``timm`` 1.0 imports torchvision at
``import timm``, and torchvision has no CPU build for the pinned torch).

The structure follows the published network (Table 1 of the paper; the authors' reference code,
huawei-noah's ``ghostnet_pytorch/ghostnet.py``), written for memplan's tests:

* Ghost module: a primary conv (1x1 by default) + BN (+ ReLU) producing ``ceil(oup / ratio)``
  intrinsic maps, a cheap depthwise conv (3x3) + BN (+ ReLU) on them producing the ghost maps,
  ``torch.cat`` of both along channels, then the slice ``[:, :oup]``;
* Ghost bottleneck: Ghost module (ReLU) expanding, a depthwise stride-2 conv + BN between the two
  Ghost modules where the stride is 2, squeeze-and-excite (global average pool, 1x1 reduce conv,
  in-place ReLU, 1x1 expand conv, hard sigmoid ``relu6(x + 3) / 6`` as gate, ``x * gate``) where the
  table says so, a Ghost module without ReLU projecting, and the shortcut added in place (``x +=``):
  identity, or depthwise conv + BN + 1x1 conv + BN where shape changes;
* stem conv 3x3 stride 2 + BN + ReLU, the 16 bottlenecks of Table 1, 1x1 conv + BN + ReLU to 960
  (x width), global average pool, 1x1 conv head with bias to 1280 + ReLU, flatten, functional
  dropout 0.2 in training, linear classifier. Channels are rounded to multiples of 4.

``ghostnet(width, ratio)``: GhostNet at width multiplier ``width`` (1.0 and ratio 2: the paper's
5.2M-parameter model at 1000 classes).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

#: Table 1 of the paper, per stage: (depthwise kernel, expansion size, output channels, SE ratio, stride)
CFGS = [
    [(3, 16, 16, 0.0, 1)],
    [(3, 48, 24, 0.0, 2)],
    [(3, 72, 24, 0.0, 1)],
    [(5, 72, 40, 0.25, 2)],
    [(5, 120, 40, 0.25, 1)],
    [(3, 240, 80, 0.0, 2)],
    [
        (3, 200, 80, 0.0, 1),
        (3, 184, 80, 0.0, 1),
        (3, 184, 80, 0.0, 1),
        (3, 480, 112, 0.25, 1),
        (3, 672, 112, 0.25, 1),
    ],
    [(5, 672, 160, 0.25, 2)],
    [
        (5, 960, 160, 0.0, 1),
        (5, 960, 160, 0.25, 1),
        (5, 960, 160, 0.0, 1),
        (5, 960, 160, 0.25, 1),
    ],
]


def divisible(v: float, divisor: int = 4) -> int:
    """Round ``v`` to a multiple of ``divisor``, never more than 10% down."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def hard_sigmoid(x: torch.Tensor) -> torch.Tensor:
    return F.relu6(x + 3.0) / 6.0


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, ratio: float = 0.25):
        super().__init__()
        reduced = divisible(channels * ratio)
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.conv_reduce = nn.Conv2d(channels, reduced, 1, bias=True)
        self.act1 = nn.ReLU(inplace=True)
        self.conv_expand = nn.Conv2d(reduced, channels, 1, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        se = self.conv_expand(self.act1(self.conv_reduce(self.avg_pool(x))))
        return x * hard_sigmoid(se)


class GhostModule(nn.Module):
    """Primary conv -> intrinsic maps; cheap depthwise conv on them -> ghost maps; cat; slice."""

    def __init__(self, inp: int, oup: int, kernel: int = 1, ratio: int = 2, dw_kernel: int = 3, relu: bool = True):
        super().__init__()
        self.oup = oup
        init = math.ceil(oup / ratio)
        new = init * (ratio - 1)
        self.primary_conv = nn.Sequential(
            nn.Conv2d(inp, init, kernel, 1, kernel // 2, bias=False),
            nn.BatchNorm2d(init),
            nn.ReLU(inplace=True) if relu else nn.Sequential(),
        )
        self.cheap_operation = nn.Sequential(
            nn.Conv2d(init, new, dw_kernel, 1, dw_kernel // 2, groups=init, bias=False),
            nn.BatchNorm2d(new),
            nn.ReLU(inplace=True) if relu else nn.Sequential(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.primary_conv(x)
        x2 = self.cheap_operation(x1)
        return torch.cat([x1, x2], dim=1)[:, : self.oup, :, :]


class GhostBottleneck(nn.Module):
    def __init__(
        self, cin: int, mid: int, cout: int, dw_kernel: int = 3, stride: int = 1, se_ratio: float = 0.0, ratio: int = 2
    ):
        super().__init__()
        self.stride = stride
        self.ghost1 = GhostModule(cin, mid, ratio=ratio, relu=True)
        if stride > 1:
            pad = (dw_kernel - 1) // 2
            self.conv_dw = nn.Conv2d(mid, mid, dw_kernel, stride, pad, groups=mid, bias=False)
            self.bn_dw = nn.BatchNorm2d(mid)
        self.se = SqueezeExcite(mid, se_ratio) if se_ratio > 0 else None
        self.ghost2 = GhostModule(mid, cout, ratio=ratio, relu=False)
        if cin == cout and stride == 1:
            self.shortcut = nn.Sequential()
        else:
            pad = (dw_kernel - 1) // 2
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cin, dw_kernel, stride, pad, groups=cin, bias=False),
                nn.BatchNorm2d(cin),
                nn.Conv2d(cin, cout, 1, 1, 0, bias=False),
                nn.BatchNorm2d(cout),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x
        x = self.ghost1(x)
        if self.stride > 1:
            x = self.bn_dw(self.conv_dw(x))
        if self.se is not None:
            x = self.se(x)
        x = self.ghost2(x)
        x += self.shortcut(residual)
        return x


class ConvBnAct(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, 1, kernel // 2, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.act1 = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act1(self.bn1(self.conv(x)))


class GhostNet(nn.Module):
    def __init__(self, cfgs=CFGS, num_classes: int = 1000, width: float = 1.0, dropout: float = 0.2, ratio: int = 2):
        super().__init__()
        self.dropout = dropout
        cout = divisible(16 * width)
        self.conv_stem = nn.Conv2d(3, cout, 3, 2, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.act1 = nn.ReLU(inplace=True)
        cin = cout
        stages = []
        for cfg in cfgs:
            layers = []
            for k, exp, c, se, s in cfg:
                cout = divisible(c * width)
                layers.append(GhostBottleneck(cin, divisible(exp * width), cout, k, s, se_ratio=se, ratio=ratio))
                cin = cout
            stages.append(nn.Sequential(*layers))
        cout = divisible(exp * width)
        stages.append(nn.Sequential(ConvBnAct(cin, cout, 1)))
        self.blocks = nn.Sequential(*stages)
        self.global_pool = nn.AdaptiveAvgPool2d((1, 1))
        self.conv_head = nn.Conv2d(cout, 1280, 1, 1, 0, bias=True)
        self.act2 = nn.ReLU(inplace=True)
        self.classifier = nn.Linear(1280, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act1(self.bn1(self.conv_stem(x)))
        x = self.blocks(x)
        x = self.act2(self.conv_head(self.global_pool(x)))
        x = x.view(x.size(0), -1)
        if self.dropout > 0.0:
            x = F.dropout(x, p=self.dropout, training=self.training)
        return self.classifier(x)


def ghostnet(width: float = 1.0, ratio: int = 2, num_classes: int = 10, seed: int = 0) -> GhostNet:
    """A seeded, randomly initialised GhostNet (BN statistics and scales perturbed so that eval
    mode computes something other than the identity). ``ratio``: the Ghost modules' s (the paper
    uses 2 and ablates 2-5); with s = 3 most modules make more maps than they keep (``cat`` of
    ``3 * ceil(oup / 3)`` channels sliced to ``oup``), so the in-place shortcut add writes into a
    channel slice of a larger tensor."""
    torch.manual_seed(seed)
    net = GhostNet(num_classes=num_classes, width=width, ratio=ratio)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
    return net.eval()
