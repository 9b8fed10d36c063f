"""ResNet-18 and ResNet-50.

Source: He et al., "Deep Residual Learning", CVPR 2016, in the torchvision layout (v1.5:
the bottleneck's stride sits on the 3x3 conv; projection shortcuts only where the shape
changes). BN eps 1e-5. All 8 / 16 residual units sit flat in ``blocks``.
"""

from __future__ import annotations

from torch import nn

from .blocks import BasicBlock, Bottleneck, ConvBNAct, ConvNet


def resnet(num_classes: int, block: type[BasicBlock] | type[Bottleneck], layers: list[int]) -> ConvNet:
    """Stem 7x7 s2 64 + maxpool 3x3 s2 -> 4 stages (64, 128, 256, 512 ch) -> pool -> Linear."""
    stem = nn.Sequential(ConvBNAct(3, 64, 7, 2, act=nn.ReLU), nn.MaxPool2d(3, 2, 1))
    blocks: list[nn.Module] = []
    cin = 64
    for stage, n in enumerate(layers):
        channels = 64 * 2**stage
        for i in range(n):
            blocks.append(block(cin, channels, 2 if stage > 0 and i == 0 else 1))
            cin = channels * block.expansion
    return ConvNet(stem, blocks, None, cin, num_classes)


def resnet18(num_classes: int = 1000) -> ConvNet:
    """ResNet-18, 224 px, 1000 classes: 11,689,512 params, 1.814G conv + FC MACs (reference 11.69M / 1.82G)."""
    return resnet(num_classes, BasicBlock, [2, 2, 2, 2])


def resnet50(num_classes: int = 1000) -> ConvNet:
    """ResNet-50, 224 px, 1000 classes: 25,557,032 params, 4.089G conv + FC MACs (reference 25.56M / 4.1G)."""
    return resnet(num_classes, Bottleneck, [3, 4, 6, 3])
