"""An integer-arithmetic implementation of the 256KB paper's int8 format, written from the format's
description (shared/models/tiny-training-int8/README.md, tiny-training's ``quantized_ops.py``
inference ops), in numpy with int32 accumulators: the reference the int8 training graph's forward
is checked against, bit for bit. Independent of memplan's ops: no torch here.

* conv: ``acc = sum((x - x_zero) * w)`` in int32, ``+ bias`` (int32), then
  ``round(float64(acc) * float32(x_scale * w_scales / y_scale)) + y_zero``, clamped to [-128, 127];
* residual add: float32 ``(x1 - z1) * s1 + (x2 - z2) * s2``, then ``round(float64(sum) / s_y) + z_y``, clamped;
* pooling: ``round(mean)``; input: ``round(pixel - 127.5)`` (half to even, as numpy and torch round).
"""

from __future__ import annotations

import numpy as np


def conv(x: np.ndarray, p: dict, arrays: dict, stride: int, groups: int) -> np.ndarray:
    """x: int32 N x C x H x W int8 values -> int32 int8 values."""
    w = arrays[p["weight"]["array"]].astype(np.int32)
    b = arrays[p["bias"]["array"]].astype(np.int32)
    w_scales = arrays[p["w_scales"]["array"]].astype(np.float64)
    scale = (p["x_scale"] * w_scales / p["y_scale"]).astype(np.float32)
    out_c, in_per_group, k, _ = w.shape
    pad = k // 2
    xs = np.pad(x - np.int32(p["x_zero"]), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c, h, wd = x.shape
    oh, ow = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
    acc = np.zeros((n, out_c, oh, ow), dtype=np.int32)
    per_group_out = out_c // groups
    for g in range(groups):
        xg = xs[:, g * in_per_group : (g + 1) * in_per_group]
        wg = w[g * per_group_out : (g + 1) * per_group_out]
        for i in range(k):
            for j in range(k):
                patch = xg[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride]
                acc[:, g * per_group_out : (g + 1) * per_group_out] += np.einsum(
                    "nchw,oc->nohw", patch, wg[:, :, i, j], dtype=np.int32
                )
    acc += b.reshape(1, -1, 1, 1)
    y = np.round(acc.astype(np.float64) * scale.astype(np.float64).reshape(1, -1, 1, 1)) + p["y_zero"]
    return np.clip(y, -128, 127).astype(np.int32)


def add(x1: np.ndarray, x2: np.ndarray, z1, s1, z2, s2, zy, sy) -> np.ndarray:
    f32 = np.float32
    real = (x1 - f32(z1)).astype(f32) * f32(s1) + (x2 - f32(z2)).astype(f32) * f32(s2)
    y = np.round(real.astype(np.float64) / np.float64(f32(sy))) + zy
    return np.clip(y, -128, 127).astype(np.int32)


def _conv_cfg(x: np.ndarray, cfg: dict, arrays: dict) -> np.ndarray:
    return conv(x, cfg["params"], arrays, cfg["stride"], cfg["groups"])


def forward(pixels: np.ndarray, cfg: dict, arrays: dict) -> np.ndarray:
    """uint8 images N x 3 x H x W -> int8 logits (int32 array N x classes)."""
    x = np.round(pixels.astype(np.float64) - 127.5).astype(np.int32)
    x = _conv_cfg(x, cfg["first_conv"], arrays)
    for blk in cfg["blocks"]:
        y = x
        for key in ("pointwise1", "depthwise", "pointwise2"):
            if blk[key] is not None:
                y = _conv_cfg(y, blk[key], arrays)
        if blk["residual"] is not None:
            r, p2 = blk["residual"]["params"], blk["pointwise2"]["params"]
            y = add(x, y, r["x_zero"], r["x_scale"], p2["y_zero"], p2["y_scale"], r["y_zero"], r["y_scale"])
        x = y
    if cfg["feature_mix"] is not None:
        x = _conv_cfg(x, cfg["feature_mix"], arrays)
    x = np.round(x.astype(np.float32).mean(axis=(2, 3), keepdims=True)).astype(np.int32)
    return _conv_cfg(x, cfg["classifier"], arrays).reshape(x.shape[0], -1)
