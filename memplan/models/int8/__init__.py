"""The 256KB paper's int8 backbones with their ImageNet weights: the format (:mod:`.format`), the
int8 training graph's ops (:mod:`.ops`) and the two forms built from it (:mod:`.build`)."""

from .build import Fp32Net, Int8Net, fp32_model, int8_model
from .format import NAMES, load, mcu_transform
from .ops import QuantAdd, QuantAvgPool, QuantConv2d

__all__ = [
    "NAMES",
    "Fp32Net",
    "Int8Net",
    "QuantAdd",
    "QuantAvgPool",
    "QuantConv2d",
    "fp32_model",
    "int8_model",
    "load",
    "mcu_transform",
]
