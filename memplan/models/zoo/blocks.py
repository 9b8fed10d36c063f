"""Shared building blocks of the model zoo.

Everything here is ``torch.fx``-traceable (no data-dependent control flow) and uses only
standard leaf modules, so the profiler can count every op. Structure conventions the
profiler relies on (see ``memplan.models.zoo``):

* ``ConvBNAct`` is an ``nn.Sequential`` subclass, so a stem / feature-mix conv is never
  taken for a block;
* block units (``InvertedResidual``, ``BasicBlock``, ``Bottleneck``) are plain modules
  with at least two convs, held in an ``nn.Sequential`` (``ConvNet.blocks``);
* residual adds are functional (``x + self.conv(x)``), the SE gate multiplies inside
  ``SqueezeExcite.forward``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn

Act = type[nn.Module] | None


def make_divisible(value: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Round ``value`` to the nearest multiple of ``divisor``, never going down by more than 10%.

    The channel rounding of the TF MobileNet / EfficientNet reference code (also torchvision's
    ``_make_divisible``).
    """
    min_value = divisor if min_value is None else min_value
    new_value = max(min_value, int(value + divisor / 2) // divisor * divisor)
    if new_value < 0.9 * value:
        new_value += divisor
    return new_value


def new_act(act: type[nn.Module]) -> nn.Module:
    """Instantiate an activation class, never in place."""
    return act(inplace=False) if act in _INPLACE_ACTS else act()


_INPLACE_ACTS = (nn.ReLU, nn.ReLU6, nn.Hardswish, nn.Hardsigmoid, nn.SiLU)


class ConvBNAct(nn.Sequential):
    """``Conv2d(bias=False) -> BatchNorm2d -> activation``; ``act=None`` for a linear projection.

    Children are named ``conv``, ``bn`` and ``act``; padding is ``kernel_size // 2``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        stride: int = 1,
        groups: int = 1,
        act: Act = nn.ReLU6,
        eps: float = 1e-5,
    ) -> None:
        conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, kernel_size // 2, groups=groups, bias=False)
        super().__init__(OrderedDict([("conv", conv), ("bn", nn.BatchNorm2d(out_channels, eps=eps))]))
        if act is not None:
            self.add_module("act", new_act(act))


class SqueezeExcite(nn.Module):
    """Squeeze-and-excitation: ``x * gate(fc2(act(fc1(avgpool(x)))))``; the 1x1 convs carry biases
    (MobileNetV3 / EfficientNet reference implementations)."""

    def __init__(
        self,
        channels: int,
        squeeze_channels: int,
        act: type[nn.Module] = nn.ReLU,
        gate: type[nn.Module] = nn.Hardsigmoid,
    ) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze_channels, 1)
        self.act = new_act(act)
        self.fc2 = nn.Conv2d(squeeze_channels, channels, 1)
        self.gate = new_act(gate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc2(self.act(self.fc1(self.pool(x)))))


class InvertedResidual(nn.Module):
    """MobileNetV2 inverted residual / MBConv: ``[pw1 expand] -> dw kxk (stride) -> [SE] -> pw2 project``.

    The 1x1 expansion is omitted when ``mid_channels == in_channels`` (expand ratio 1); the
    projection has BN and no activation. An identity shortcut is added when ``stride == 1``
    and ``in_channels == out_channels``. ``se_channels > 0`` inserts a ``SqueezeExcite``
    after the depthwise activation (MobileNetV3, EfficientNet).
    """

    def __init__(  # the block's published hyperparameters
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int,
        mid_channels: int,
        act: type[nn.Module] = nn.ReLU6,
        se_channels: int = 0,
        se_act: type[nn.Module] = nn.ReLU,
        se_gate: type[nn.Module] = nn.Hardsigmoid,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        layers: list[tuple[str, nn.Module]] = []
        if mid_channels != in_channels:
            layers.append(("expand", ConvBNAct(in_channels, mid_channels, 1, act=act, eps=eps)))
        layers.append(
            ("dw", ConvBNAct(mid_channels, mid_channels, kernel_size, stride, mid_channels, act=act, eps=eps))
        )
        if se_channels > 0:
            layers.append(("se", SqueezeExcite(mid_channels, se_channels, se_act, se_gate)))
        layers.append(("project", ConvBNAct(mid_channels, out_channels, 1, act=None, eps=eps)))
        self.conv = nn.Sequential(OrderedDict(layers))
        self.use_residual = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_residual:  # fixed at construction: a Python bool, not data-dependent
            return x + self.conv(x)
        return self.conv(x)


class BasicBlock(nn.Module):
    """ResNet basic block: 3x3 (stride) -> 3x3, shortcut (1x1 conv + BN when the shape changes), ReLU."""

    expansion = 1

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        out = channels * self.expansion
        self.conv1 = ConvBNAct(in_channels, channels, 3, stride, act=nn.ReLU)
        self.conv2 = ConvBNAct(channels, out, 3, act=None)
        self.downsample = _shortcut(in_channels, out, stride)
        self.act = nn.ReLU(inplace=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv2(self.conv1(x))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.act(out + shortcut)


class Bottleneck(nn.Module):
    """ResNet-50 bottleneck (v1.5, stride on the 3x3): 1x1 -> 3x3 (stride) -> 1x1 (x4), shortcut, ReLU."""

    expansion = 4

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        out = channels * self.expansion
        self.conv1 = ConvBNAct(in_channels, channels, 1, act=nn.ReLU)
        self.conv2 = ConvBNAct(channels, channels, 3, stride, act=nn.ReLU)
        self.conv3 = ConvBNAct(channels, out, 1, act=None)
        self.downsample = _shortcut(in_channels, out, stride)
        self.act = nn.ReLU(inplace=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv3(self.conv2(self.conv1(x)))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.act(out + shortcut)


def _shortcut(in_channels: int, out_channels: int, stride: int) -> ConvBNAct | None:
    if stride == 1 and in_channels == out_channels:
        return None
    return ConvBNAct(in_channels, out_channels, 1, stride, act=None)


class ConvNet(nn.Module):
    """``stem -> blocks -> [head conv] -> avgpool -> flatten -> [pre_logits] -> [dropout] -> classifier``.

    The common skeleton of every ImageNet model in the zoo; ``classifier`` is the last
    ``nn.Linear`` in forward order.
    """

    def __init__(
        self,
        stem: nn.Module,
        blocks: Sequence[nn.Module],
        head: nn.Module | None,
        num_features: int,
        num_classes: int,
        dropout: float = 0.0,
        pre_logits: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.stem = stem
        self.blocks = nn.Sequential(*blocks)
        self.head = head
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten(1)
        self.pre_logits = pre_logits
        self.dropout = nn.Dropout(dropout) if dropout > 0 else None
        self.classifier = nn.Linear(num_features, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        if self.head is not None:
            x = self.head(x)
        x = self.flatten(self.pool(x))
        if self.pre_logits is not None:
            x = self.pre_logits(x)
        if self.dropout is not None:
            x = self.dropout(x)
        return self.classifier(x)


def init_weights(model: nn.Module) -> None:
    """Kaiming-normal (fan_out) convs, unit/zero norms, N(0, 0.01) linears, zero biases.

    Skipped on the meta device (profiling needs shapes only; random init there would pull in
    torch's decomposition machinery and cost seconds).
    """
    if any(p.is_meta for p in model.parameters()):
        return
    for m in model.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d)):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.zeros_(m.bias)
