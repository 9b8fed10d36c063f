"""Mode ``ideal``: the implementation-agnostic minimum (``accounting.md`` §2, the seeds' Eq. 2).

* conv / linear keep their input only if their weight is updated, and for a sub-channel
  update only the selected input channels; bias and input gradients need no activation;
* norms keep their input only if the scale trains or batch statistics are in use (train-mode
  BN, GroupNorm, LayerNorm) and the input needs a gradient; frozen statistics with a
  trainable shift keep nothing (MobileTL);
* ReLU / ReLU6 / LeakyReLU and dropout keep a 1-bit mask, as does any activation whose
  backward is sign-approximated (MobileTL); h-swish, sigmoid, SiLU keep a full tensor;
* max-pool keeps one byte of argmax position per output instead of the input and int64 indices.
Everything else follows the ``pytorch`` rules (the loss, multiplies, matmul).
"""

from __future__ import annotations

import math

from ..graph import sub_channels
from ..graph.kinds import MASK_ACTIVATIONS
from ..plan import OpView
from .base import Mode, mask_bits, private, register_mode, tensor
from .pytorch import pytorch


class IdealMode(Mode):
    name = "ideal"
    description = "implementation-agnostic minimum: 1-bit masks, no activation for bias / input gradients"


ideal = register_mode(IdealMode(parent=pytorch))
rule = ideal.rule


def selected_input(op: OpView):
    """The layer input restricted to the updated input channels (all of them for ratio 1)."""
    x = op.node.in_tensors[0]
    if op.weight_grad >= 1:
        yield tensor(op, x, "input")
        return
    channels = x.shape[1] if op.kind == "conv" else x.shape[-1]
    n = sub_channels(channels, op.weight_grad)
    yield private(x.nbytes // channels * n, f"input channels {n}/{channels}")


@rule("conv", "linear")
def layer(op: OpView):
    """The (selected) input when the weight needs a gradient; a computed weight tensor (not a
    parameter) when the input needs one."""
    if op.weight_grad:
        yield from selected_input(op)
    w = op.operand("weight")
    if w is not None and op.grad_input:
        yield tensor(op, w, "weight")


@rule("batchnorm", "groupnorm", "layernorm")
def norm(op: OpView):
    batch_stats = op.norm_train or op.kind != "batchnorm"
    if op.train.weight or (batch_stats and op.grad_input):
        yield tensor(op, op.node.in_tensors[0], "input")
    if batch_stats and op.kind == "batchnorm":
        yield private(op.node.out.shape[1] * 4 * 2, "mean, invstd")


@rule("relu", "hardtanh", "leaky_relu", "hardswish", "hardsigmoid", "silu", "gelu", "sigmoid", "tanh", "elu")
def activation(op: OpView):
    if not op.grad_input:
        return
    if op.kind in MASK_ACTIVATIONS or op.approx:
        yield mask_bits(op.node.out.numel)
    else:
        yield from pytorch.find_rule(op.kind)(op)


@rule("dropout")
def dropout(op: OpView):
    if op.grad_input and op.node.attrs.get("training", True):
        yield mask_bits(op.node.out.numel, "dropout mask")


@rule("maxpool", "adaptive_maxpool")
def maxpool(op: OpView):
    if op.grad_input:
        window = math.prod(op.node.in_tensors[0].shape[2:]) // max(1, math.prod(op.node.out.shape[2:]))
        bits = max(1, math.ceil(math.log2(max(2, window))))
        yield private(math.ceil(op.node.out.numel * bits / 8), f"{bits}-bit argmax")


@rule("avgpool", "adaptive_avgpool")
def avgpool(op: OpView):
    return ()
