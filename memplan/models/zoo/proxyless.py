"""ProxylessNAS-Mobile and the 256KB paper's ProxylessNAS-w0.3.

Source: Cai et al., "ProxylessNAS", ICLR 2019 (the released ``proxyless_mobile`` net
config, BN eps 1e-3, no dropout); the w0.3 variant is from Lin et al., "On-Device Training
Under 256KB Memory", NeurIPS 2022. The searched "zero layers" (identity shortcut only,
nothing computed) are omitted, leaving 20 MB blocks.
"""

from __future__ import annotations

from torch import nn

from .blocks import ConvBNAct, ConvNet, InvertedResidual

# (kernel, expand ratio, stride) of the 20 real blocks of proxyless_mobile; zero layers 3, 4 dropped.
PROXYLESS_MOBILE_BLOCKS = [
    (3, 1, 1), (5, 3, 2), (3, 3, 1),
    (7, 3, 2), (3, 3, 1), (5, 3, 1), (5, 3, 1),
    (7, 6, 2), (5, 3, 1), (5, 3, 1), (5, 3, 1),
    (5, 6, 1), (5, 3, 1), (5, 3, 1), (5, 3, 1),
    (7, 6, 2), (7, 6, 1), (7, 3, 1), (7, 3, 1),
    (7, 6, 1),
]  # fmt: skip
MOBILE_OUT = [16, 32, 32, 40, 40, 40, 40, 80, 80, 80, 80, 96, 96, 96, 96, 192, 192, 192, 192, 320]
W03_OUT = [8, 16, 16, 16, 16, 16, 16, 24, 24, 24, 24, 32, 32, 32, 32, 64, 64, 64, 64, 96]


def proxyless_net(num_classes: int, stem: int, outs: list[int], feature_mix: int | None) -> ConvNet:
    """Stem 3x3 s2 -> MB blocks (ReLU6, mid = round(cin * expand)) -> [1x1 feature mix] -> Linear."""
    blocks: list[nn.Module] = []
    cin = stem
    for (k, e, s), cout in zip(PROXYLESS_MOBILE_BLOCKS, outs, strict=True):
        blocks.append(InvertedResidual(cin, cout, k, s, round(cin * e), eps=1e-3))
        cin = cout
    head = None
    if feature_mix is not None:
        head, cin = ConvBNAct(cin, feature_mix, 1, eps=1e-3), feature_mix
    return ConvNet(ConvBNAct(3, stem, 3, 2, eps=1e-3), blocks, head, cin, num_classes)


def proxylessnas_mobile(num_classes: int = 1000) -> ConvNet:
    """ProxylessNAS-Mobile (TinyTL / MobileTL backbone), 224 px: stem 32, blocks to 320 ch,
    feature mix 320->1280, Linear(1280, classes); 61 convs. Reference: 4.081M params and
    320.4M MACs with 1000 classes (built: 4,080,512 and 320.43M conv + FC); 2,927,612 params
    with 100 classes (exact)."""
    return proxyless_net(num_classes, 32, MOBILE_OUT, 1280)


def proxylessnas_w03(num_classes: int = 1000) -> ConvNet:
    """ProxylessNAS-w0.3 of the 256KB paper, 128 px: stem 16, block outputs 8 ... 96, no
    feature mix (Linear(96, classes)); 60 convs. Paper: backbone 19M MACs, 0.33M params;
    built: 18.62M conv MACs, 331,648 params without the classifier."""
    return proxyless_net(num_classes, 16, W03_OUT, None)
