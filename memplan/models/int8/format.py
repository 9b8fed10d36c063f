"""The shipped int8 backbones of "On-Device Training Under 256KB Memory" (Lin et al., NeurIPS
2022), in the paper's quantized format: ``memplan/data/int8/NAME.json`` (the structure, every
scalar field as in the source) and ``NAME.npz`` (every array, keyed by its path). Source: MIT
HAN Lab ``tiny-training``, ``algorithm/assets/mcu_models/*.pkl``, converted losslessly; MIT
licence in ``memplan/data/int8/LICENSE``.

A conv's ``params``: ``weight`` int8 [out, in/groups, k, k] (real ``= weight * w_scales[out]``),
``bias`` int32 (real ``= bias * x_scale * w_scales``), input and output ``x_scale`` /
``x_zero`` / ``y_scale`` / ``y_zero`` (real ``= (q - zero) * scale``). The input is the
"MCU transform" of an 8-bit image, ``pixel - 127.5`` (:func:`mcu_transform`), rounded by the
first conv: ``x_scale = 2/255``, real input in [-1, 1].
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ModelNotFound

DATA_DIR = Path(__file__).resolve().parent.parent.parent / "data" / "int8"
#: the shipped backbones (all at 128 px, 1000 ImageNet classes)
NAMES = ("mcunet-5fps", "mbv2-w0.35", "proxyless-w0.3")


@dataclass(frozen=True)
class Int8Format:
    """One backbone: its structure and its arrays."""

    name: str
    cfg: dict[str, Any]
    arrays: dict[str, np.ndarray]

    def array(self, ref: Any) -> np.ndarray:
        """The array a structure field refers to (``{"array": KEY, ...}``), or the value itself."""
        return self.arrays[ref["array"]] if isinstance(ref, dict) and "array" in ref else np.asarray(ref)


@cache
def load(name: str) -> Int8Format:
    """The shipped backbone ``name`` (one of :data:`NAMES`)."""
    if name not in NAMES:
        raise ModelNotFound(f"no int8 backbone {name!r}", f"known: {', '.join(NAMES)}")
    cfg = json.loads((DATA_DIR / f"{name}.json").read_text())
    with np.load(DATA_DIR / f"{name}.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    return Int8Format(name, cfg, arrays)


def mcu_transform(pixels: Any) -> Any:
    """The format's input from 8-bit pixels (or images in [0, 1] as floats, scaled by 255):
    ``pixel - 127.5`` (the source's normalisation with mean 0.5 and std 1/255)."""
    return pixels - 127.5
