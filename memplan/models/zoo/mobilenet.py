"""MobileNetV2 (any width) and MobileNetV3-Small / -Large.

Sources: Sandler et al., "MobileNetV2", CVPR 2018 and Howard et al., "Searching for
MobileNetV3", ICCV 2019, with the channel rounding of their reference code (torchvision's
implementation is the same architecture). BN eps is 1e-3 (TF reference); eps does not
change any count.
"""

from __future__ import annotations

from functools import partial

from torch import nn

from .blocks import ConvBNAct, ConvNet, InvertedResidual, make_divisible

# MobileNetV2 stages: expand ratio t, output channels c, repeats n, first stride s.
MBV2_SETTINGS = [
    (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1),
]  # fmt: skip


def mobilenet_v2(
    num_classes: int = 1000, width_mult: float = 1.0, feature_mix: bool = True, dropout: float = 0.2
) -> ConvNet:
    """MobileNetV2 with width multiplier ``width_mult``.

    Every channel count is ``make_divisible(c * width_mult, 8)``; mid = round(cin * t). The
    1x1 feature-mix conv has ``make_divisible(1280 * max(1, width_mult), 8)`` channels (the
    paper keeps 1280 for multipliers below 1). At 224 px, 1000 classes: x1.0 has 3,504,872
    params and 300.8M conv + FC MACs (reference 3.50M / 300M); x1.4 has 6,108,776 params and
    582.2M MACs (TF-slim README: 582M; its 6.06M params leave out the BN affine params).
    ``feature_mix=False`` drops that conv (the 256KB paper's mbv2-w0.35 variant).
    """
    stem_channels = make_divisible(32 * width_mult)
    blocks: list[nn.Module] = []
    cin = stem_channels
    for t, c, n, s in MBV2_SETTINGS:
        cout = make_divisible(c * width_mult)
        for i in range(n):
            blocks.append(InvertedResidual(cin, cout, 3, s if i == 0 else 1, round(cin * t), eps=1e-3))
            cin = cout
    head = None
    if feature_mix:
        head = ConvBNAct(cin, make_divisible(1280 * max(1.0, width_mult)), 1, eps=1e-3)
        cin = head.conv.out_channels
    stem = ConvBNAct(3, stem_channels, 3, 2, eps=1e-3)
    return ConvNet(stem, blocks, head, cin, num_classes, dropout)


def mbv2_w035(num_classes: int = 1000) -> ConvNet:
    """MobileNetV2-w0.35 as used by "On-Device Training Under 256KB Memory" (Lin et al., NeurIPS 2022).

    Stem 16, stage outputs 8, 8, 16, 24, 32, 56, 112, no 1x1 feature-mix conv: the last
    block (112 ch) -> pool -> Linear(112, classes); 51 convs; run at 128x128, no dropout.
    Paper: backbone 17M MACs, 0.25M params; built: 16.65M conv MACs, 250,208 params without
    the classifier.
    """
    return mobilenet_v2(num_classes, 0.35, feature_mix=False, dropout=0.0)


# MobileNetV3 bnecks: kernel, expanded, out, SE, activation ("RE" ReLU / "HS" h-swish), stride.
MBV3_LARGE = [
    (3, 16, 16, False, "RE", 1), (3, 64, 24, False, "RE", 2), (3, 72, 24, False, "RE", 1),
    (5, 72, 40, True, "RE", 2), (5, 120, 40, True, "RE", 1), (5, 120, 40, True, "RE", 1),
    (3, 240, 80, False, "HS", 2), (3, 200, 80, False, "HS", 1), (3, 184, 80, False, "HS", 1),
    (3, 184, 80, False, "HS", 1), (3, 480, 112, True, "HS", 1), (3, 672, 112, True, "HS", 1),
    (5, 672, 160, True, "HS", 2), (5, 960, 160, True, "HS", 1), (5, 960, 160, True, "HS", 1),
]  # fmt: skip
MBV3_SMALL = [
    (3, 16, 16, True, "RE", 2), (3, 72, 24, False, "RE", 2), (3, 88, 24, False, "RE", 1),
    (5, 96, 40, True, "HS", 2), (5, 240, 40, True, "HS", 1), (5, 240, 40, True, "HS", 1),
    (5, 120, 48, True, "HS", 1), (5, 144, 48, True, "HS", 1), (5, 288, 96, True, "HS", 2),
    (5, 576, 96, True, "HS", 1), (5, 576, 96, True, "HS", 1),
]  # fmt: skip
_ACTS: dict[str, type[nn.Module]] = {"RE": nn.ReLU, "HS": nn.Hardswish}


def mobilenet_v3(num_classes: int = 1000, variant: str = "large", dropout: float = 0.2) -> ConvNet:
    """MobileNetV3-Large / -Small (Howard et al., ICCV 2019, Table 1 / Table 2).

    Stem 3x3 s2 16 ch h-swish; bnecks as in the paper; SE after the depthwise activation
    with ``make_divisible(expanded // 4, 8)`` squeeze channels, biased 1x1 convs, ReLU and
    hard-sigmoid; last 1x1 conv (960 / 576 ch, h-swish) -> pool -> Linear(1280 / 1024) ->
    h-swish -> Dropout(0.2) -> Linear(classes). 224 px, 1000 classes: Large 5,483,032
    params, Small 2,542,856 (reference 5.48M / 2.54M).

    MACs: the paper's figures are not pure conv + FC counts. Large: conv + FC = 216.6M, the
    217M of the authors' TF-slim README; the paper's 219M is about what one op per h-swish,
    SE-multiply and residual-add element adds (219.1M). Small: conv + FC = 56.51M; the
    paper's 56M matches conv + FC without the SE 1x1 convs (56.05M).
    """
    config, last_conv, last_linear = (MBV3_LARGE, 960, 1280) if variant == "large" else (MBV3_SMALL, 576, 1024)
    blocks: list[nn.Module] = []
    cin = 16
    for k, mid, cout, se, act, s in config:
        squeeze = make_divisible(mid // 4) if se else 0
        blocks.append(InvertedResidual(cin, cout, k, s, mid, _ACTS[act], squeeze, eps=1e-3))
        cin = cout
    stem = ConvBNAct(3, 16, 3, 2, act=nn.Hardswish, eps=1e-3)
    head = ConvBNAct(cin, last_conv, 1, act=nn.Hardswish, eps=1e-3)
    pre_logits = nn.Sequential(nn.Linear(last_conv, last_linear), nn.Hardswish(inplace=False))
    return ConvNet(stem, blocks, head, last_linear, num_classes, dropout, pre_logits)


mobilenet_v3_large = partial(mobilenet_v3, variant="large")
mobilenet_v3_small = partial(mobilenet_v3, variant="small")
