"""The three single blocks of MobileTL Table 1 (Chiang et al., AAAI 2023), for ``reproduce``.

One shape fits all three rows (accounting.md §6): C_in = C_out = 96, 5x5 kernel, 7x7 feature
map, batch 8, expansion 1 *with* the 1x1 expansion conv, SE squeeze 24.

* ``conv``: Conv 5x5 -> BN -> ReLU (230,400 + 192 = 230,592 params);
* ``mbv2``: 1x1 expand -> BN -> ReLU6 -> dw 5x5 -> BN -> ReLU6 -> 1x1 project -> BN, identity
  shortcut (2 x 9,216 + 2,400 + 3 x 192 = 21,408);
* ``mbv3``: as mbv2 with h-swish, and SE (pool -> 1x1 96->24 -> ReLU -> 1x1 24->96 ->
  h-sigmoid, convs with biases: 4,728) after the depthwise activation (26,136).

They are not listed in the zoo (it lists whole networks): :func:`mobiletl_block_net` wraps one
block as ``blocks.0`` between an identity stem and pool -> flatten -> Linear(96, classes), and
``memplan.models.zoo.BLOCK_NETS`` resolves ``mobiletl-block-<kind>`` to it at input shape
:data:`BLOCK_INPUT` with ``blocks.0`` as its block, so it is profiled like any model; the Table 1
figures are the sums over the layers of that block.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from .blocks import ConvBNAct, ConvNet, SqueezeExcite

BLOCK_KINDS = ("conv", "mbv2", "mbv3")
BLOCK_INPUT = (96, 7, 7)  # per-sample input (C, H, W); Table 1 uses batch 8
BLOCK_BATCH = 8
BLOCK_NAME = "blocks.0"


class ExpandedIRB(nn.Module):
    """Inverted residual block that keeps the 1x1 expansion conv at expansion ratio 1."""

    def __init__(self, channels: int, kernel: int, act: type[nn.Module], se_channels: int = 0) -> None:
        super().__init__()
        layers: list[tuple[str, nn.Module]] = [
            ("expand", ConvBNAct(channels, channels, 1, act=act)),
            ("dw", ConvBNAct(channels, channels, kernel, 1, channels, act=act)),
        ]
        if se_channels:
            layers.append(("se", SqueezeExcite(channels, se_channels, nn.ReLU, nn.Hardsigmoid)))
        layers.append(("project", ConvBNAct(channels, channels, 1, act=None)))
        self.conv = nn.Sequential(OrderedDict(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x)


def mobiletl_block(kind: str, channels: int = 96, kernel: int = 5, se_channels: int = 24) -> nn.Module:
    """One Table 1 block: ``"conv"``, ``"mbv2"`` or ``"mbv3"``."""
    if kind == "conv":
        return ConvBNAct(channels, channels, kernel, act=nn.ReLU)
    if kind == "mbv2":
        return ExpandedIRB(channels, kernel, nn.ReLU6)
    if kind == "mbv3":
        return ExpandedIRB(channels, kernel, nn.Hardswish, se_channels)
    raise ValueError(f"unknown MobileTL Table 1 block {kind!r}; use one of {BLOCK_KINDS}")


def mobiletl_block_net(kind: str, num_classes: int = 10) -> ConvNet:
    """The block as ``blocks.0`` of a profilable net (identity stem, pool, flatten, linear head)."""
    return ConvNet(nn.Identity(), [mobiletl_block(kind)], None, BLOCK_INPUT[0], num_classes)
