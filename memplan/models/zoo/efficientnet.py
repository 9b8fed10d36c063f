"""EfficientNet-B0.

Source: Tan & Le, "EfficientNet", ICML 2019, Table 1 (torchvision's implementation of the
same architecture). MBConv blocks with SiLU, SE after the depthwise conv with
``max(1, block_in // 4)`` squeeze channels (biased 1x1 convs, SiLU, sigmoid), 1x1 head to
1280 ch, Dropout(0.2). The training-only stochastic depth (drop-connect) is omitted: it
computes nothing at inference and the profiler would only see a mask.
"""

from __future__ import annotations

from torch import nn

from .blocks import ConvBNAct, ConvNet, InvertedResidual

# Stages: expand ratio, kernel, first stride, output channels, repeats.
B0_STAGES = [
    (1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1),
]  # fmt: skip


def efficientnet_b0(num_classes: int = 1000, dropout: float = 0.2) -> ConvNet:
    """EfficientNet-B0, 224 px, 1000 classes: 5,288,548 params and 385.8M conv + FC MACs (SE convs
    included); the paper's "5.3M params, 0.39B FLOPs" (its FLOPs are multiply-adds) round these."""
    blocks: list[nn.Module] = []
    cin = 32
    for e, k, s, cout, n in B0_STAGES:
        for i in range(n):
            blocks.append(
                InvertedResidual(
                    cin, cout, k, s if i == 0 else 1, cin * e, nn.SiLU, max(1, cin // 4), nn.SiLU, nn.Sigmoid, eps=1e-3
                )
            )
            cin = cout
    stem = ConvBNAct(3, 32, 3, 2, act=nn.SiLU, eps=1e-3)
    head = ConvBNAct(cin, 1280, 1, act=nn.SiLU, eps=1e-3)
    return ConvNet(stem, blocks, head, 1280, num_classes, dropout)
