"""The 256KB paper's int8 backbones, built from the shipped format in two forms:

* :func:`int8_model`: the int8 training graph (:mod:`.ops`), every conv followed by the clamp
  to the int8 range; 1000 classes keep the quantized ImageNet classifier (int8 logits), another
  class count gets the paper's fp32 head (``mcu_head_type: fp``): the pooled int8 features
  dequantized, then a new ``nn.Linear``;
* :func:`fp32_model`: the same network in fp32 with the int8 values dequantized
  (``W = w * w_scales``, ``b = bias * x_scale * w_scales``) and no BatchNorm (it is folded in
  the format); a conv whose output zero point is -128 (real 0 at the bottom of its range) is
  followed by ``ReLU6`` when its range is [0, 6] (``255 * y_scale == 6``), by
  ``Hardtanh(0, 255 * y_scale)`` otherwise; a projection conv has no activation.

Module names follow the zoo's MBConv nets (``stem.conv``, ``blocks.i.conv.expand.conv``,
``blocks.i.conv.dw.conv``, ``blocks.i.conv.project.conv``, ``classifier``), so the zoo's
schemes name the same convs. On the meta device only shapes and scales are built.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import torch
from torch import Tensor, nn

from .format import Int8Format, load
from .ops import Dequantize, QuantAdd, QuantAvgPool, QuantConv2d, clamp

#: a block's convs in the format -> their names in the zoo's MBConv blocks
_BLOCK_CONVS = (("pointwise1", "expand"), ("depthwise", "dw"), ("pointwise2", "project"))


def _kernel(cfg: dict[str, Any]) -> int:
    k = cfg["kernel_size"]
    return int(k[0] if isinstance(k, (list, tuple)) else k)


def _quant_conv(fmt: Int8Format, cfg: dict[str, Any]) -> QuantConv2d:
    p = cfg["params"]
    quant = {**{k: p[k] for k in ("x_scale", "x_zero", "y_scale", "y_zero")}, "w_scales": fmt.array(p["w_scales"])}
    conv = QuantConv2d(cfg["in_channel"], cfg["out_channel"], _kernel(cfg), cfg["stride"], cfg["groups"], quant)
    _fill(conv, fmt.array(p["weight"]), fmt.array(p["bias"]))
    return conv


def _fill(conv: nn.Conv2d, weight: Any, bias: Any) -> None:
    if conv.weight.is_meta:
        return
    with torch.no_grad():
        conv.weight.copy_(torch.as_tensor(weight, dtype=torch.float32).reshape(conv.weight.shape))
        conv.bias.copy_(torch.as_tensor(bias, dtype=torch.float32))


class ConvClamp(nn.Sequential):
    """``QuantConv2d -> Hardtanh(-128, 127)`` (children ``conv``, ``clamp``)."""

    def __init__(self, conv: QuantConv2d) -> None:
        super().__init__(OrderedDict([("conv", conv), ("clamp", clamp())]))


class Int8Block(nn.Module):
    """An int8 MBConv block: ``[expand] -> dw -> project``, each a :class:`ConvClamp`, and the
    residual add (:class:`QuantAdd`, then the clamp) when the format has one."""

    def __init__(self, convs: list[tuple[str, nn.Module]], add: QuantAdd | None) -> None:
        super().__init__()
        self.conv = nn.Sequential(OrderedDict(convs))
        self.add = add
        self.clamp = clamp() if add is not None else None

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv(x)
        if self.add is not None:  # fixed at construction
            y = self.clamp(self.add(x, y))
        return y


def _residual(blk: dict[str, Any]) -> QuantAdd | None:
    res = blk["residual"]
    if res is None:
        return None
    if "kernel_size" in res:
        raise NotImplementedError("a residual with a conv is not in the shipped backbones")
    r, pw2 = res["params"], blk["pointwise2"]["params"]
    return QuantAdd(r["x_zero"], r["x_scale"], pw2["y_zero"], pw2["y_scale"], r["y_zero"], r["y_scale"])


class Int8Net(nn.Module):
    """``stem -> blocks -> [head] -> pool -> classifier``: the format's network (module docstring)."""

    def __init__(self, fmt: Int8Format, num_classes: int) -> None:
        super().__init__()
        cfg = fmt.cfg
        self.stem = ConvClamp(_quant_conv(fmt, cfg["first_conv"]))
        blocks = []
        for blk in cfg["blocks"]:
            convs = [
                (name, ConvClamp(_quant_conv(fmt, blk[key]))) for key, name in _BLOCK_CONVS if blk[key] is not None
            ]
            blocks.append(Int8Block(convs, _residual(blk)))
        self.blocks = nn.Sequential(*blocks)
        self.head = ConvClamp(_quant_conv(fmt, cfg["feature_mix"])) if cfg["feature_mix"] else None
        self.pool = QuantAvgPool()
        self.flatten = nn.Flatten(1)
        fc = cfg["classifier"]
        if num_classes == fc["out_channel"]:  # the quantized ImageNet classifier: int8 logits
            self.dequant = None
            self.classifier: nn.Module = ConvClamp(_quant_conv(fmt, fc))
        else:  # the paper's fp32 head on the dequantized features
            p = fc["params"]
            self.dequant = Dequantize(p["x_zero"], p["x_scale"])
            self.classifier = nn.Linear(fc["in_channel"], num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.blocks(self.stem(x))
        if self.head is not None:
            x = self.head(x)
        x = self.pool(x)
        if self.dequant is None:
            return self.flatten(self.classifier(x))
        return self.classifier(self.dequant(self.flatten(x)))


def _fp32_conv(fmt: Int8Format, cfg: dict[str, Any], act: bool) -> nn.Sequential:
    p = cfg["params"]
    k = _kernel(cfg)
    conv = nn.Conv2d(cfg["in_channel"], cfg["out_channel"], k, cfg["stride"], k // 2, groups=cfg["groups"])
    if not conv.weight.is_meta:
        w_scales = torch.as_tensor(fmt.array(p["w_scales"]), dtype=torch.float64)
        weight = torch.as_tensor(fmt.array(p["weight"]), dtype=torch.float64) * w_scales.view(-1, 1, 1, 1)
        bias = torch.as_tensor(fmt.array(p["bias"]), dtype=torch.float64) * p["x_scale"] * w_scales
        _fill(conv, weight, bias)
    layers: list[tuple[str, nn.Module]] = [("conv", conv)]
    if act and p["y_zero"] == -128:
        top = 255 * p["y_scale"]
        layers.append(("act", nn.ReLU6() if math.isclose(top, 6.0, rel_tol=1e-6) else nn.Hardtanh(0.0, top)))
    return nn.Sequential(OrderedDict(layers))


class _Fp32Block(nn.Module):
    def __init__(self, convs: list[tuple[str, nn.Module]], residual: bool) -> None:
        super().__init__()
        self.conv = nn.Sequential(OrderedDict(convs))
        self.use_residual = residual

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv(x) if self.use_residual else self.conv(x)


class Fp32Net(nn.Module):
    """The format's network in fp32, dequantized, no BatchNorm (module docstring)."""

    def __init__(self, fmt: Int8Format, num_classes: int) -> None:
        super().__init__()
        cfg = fmt.cfg
        self.stem = _fp32_conv(fmt, cfg["first_conv"], act=True)
        blocks = []
        for blk in cfg["blocks"]:
            convs = [
                (name, _fp32_conv(fmt, blk[key], act=key != "pointwise2"))
                for key, name in _BLOCK_CONVS
                if blk[key] is not None
            ]
            blocks.append(_Fp32Block(convs, blk["residual"] is not None))
        self.blocks = nn.Sequential(*blocks)
        self.head = _fp32_conv(fmt, cfg["feature_mix"], act=True) if cfg["feature_mix"] else None
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten(1)
        fc = cfg["classifier"]
        self.classifier = nn.Linear(fc["in_channel"], num_classes)
        if num_classes == fc["out_channel"] and not self.classifier.weight.is_meta:
            p = fc["params"]
            w_scales = torch.as_tensor(fmt.array(p["w_scales"]), dtype=torch.float64)
            weight = torch.as_tensor(fmt.array(p["weight"]), dtype=torch.float64).reshape(num_classes, -1)
            with torch.no_grad():
                self.classifier.weight.copy_(weight * w_scales.view(-1, 1))
                self.classifier.bias.copy_(torch.as_tensor(fmt.array(p["bias"])) * p["x_scale"] * w_scales)

    def forward(self, x: Tensor) -> Tensor:
        x = self.blocks(self.stem(x))
        if self.head is not None:
            x = self.head(x)
        return self.classifier(self.flatten(self.pool(x)))


def int8_model(name: str, num_classes: int = 1000) -> Int8Net:
    """The int8 training graph of shipped backbone ``name`` with its ImageNet weights."""
    return Int8Net(load(name), num_classes)


def fp32_model(name: str, num_classes: int = 1000) -> Fp32Net:
    """The dequantized fp32 form of shipped backbone ``name`` (no BatchNorm)."""
    return Fp32Net(load(name), num_classes)
