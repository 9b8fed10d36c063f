"""MCUNet-5FPS, the ImageNet model of "On-Device Training Under 256KB Memory".

Source: Lin et al., NeurIPS 2022 (MCUNet model zoo, ``mcunet-5fps``); layer table in
reference/architectures.md. ReLU6, BN eps 1e-3, no SE, no feature-mix conv, no dropout.
"""

from __future__ import annotations

from torch import nn

from .blocks import ConvBNAct, ConvNet, InvertedResidual

# (in, out, kernel, mid channels, stride) of the 14 MB blocks.
MCUNET_5FPS_BLOCKS = [
    (16, 8, 3, 16, 1), (8, 16, 3, 32, 2), (16, 16, 3, 48, 1), (16, 24, 7, 48, 2),
    (24, 24, 3, 120, 1), (24, 40, 3, 120, 2), (40, 40, 7, 160, 1), (40, 48, 5, 160, 1),
    (48, 48, 3, 144, 1), (48, 48, 3, 192, 1), (48, 96, 7, 240, 2), (96, 96, 5, 384, 1),
    (96, 96, 5, 384, 1), (96, 160, 3, 576, 1),
]  # fmt: skip


def mcunet_5fps(num_classes: int = 1000) -> ConvNet:
    """MCUNet-5FPS: stem 3->16 3x3 s2, 14 MB blocks, pool -> Linear(160, classes); 42 convs.

    Reference: 22.45M conv MACs at 128 px; feature extractor (conv weights + BN) 475,232
    params; at 96 px with a 1000-class FC 12.79M MACs and 0.636M params. Built: 22.4535M,
    475,232 (exact), 12.79M and 636,232.
    """
    blocks: list[nn.Module] = [InvertedResidual(i, o, k, s, m, eps=1e-3) for i, o, k, m, s in MCUNET_5FPS_BLOCKS]
    return ConvNet(ConvBNAct(3, 16, 3, 2, eps=1e-3), blocks, None, 160, num_classes)
