"""Mode ``pytorch``: what eager PyTorch 2.13 autograd saves, to the byte.

Facts from ``shared/reference/accounting.md`` §1, each checked with
``torch.autograd.graph.saved_tensors_hooks`` (tests/test_pytorch_mode.py measures every zoo
model x strategy). Parameters and buffers saved by an op (conv weight, BN running stats) are
not activations and are not counted here; they are in the weight bytes.
"""

from __future__ import annotations

from ..graph import TensorInfo
from ..plan import OpView
from .base import Mode, Saved, private, register_mode, tensor


class PyTorchMode(Mode):
    name = "pytorch"
    description = "eager PyTorch 2.13 autograd, requires_grad / train-eval flags set the plain way"
    partial_weight_grads = False


pytorch = register_mode(PyTorchMode())
rule = pytorch.rule


@rule("conv")
def conv(op: OpView):
    # convolution saves input and weight whenever recorded, whatever needs a gradient
    yield tensor(op, op.node.in_tensors[0], "input")


def folded(op: OpView, t: TensorInfo, what: str) -> Saved:
    """An operand as mm / bmm keep it: inputs with more than 2 dims are reshaped, which copies
    a non-contiguous tensor (e.g. after a transpose) into a new storage."""
    if len(t.shape) > 2 and not t.contiguous:
        return private(t.nbytes, f"{what} (reshaped copy)")
    return tensor(op, t, what)


@rule("linear")
def linear(op: OpView):
    # addmm / mm: input only if the weight needs a gradient
    if op.train.weight:
        yield folded(op, op.node.in_tensors[0], "input")


@rule("batchnorm")
def batchnorm(op: OpView):
    yield tensor(op, op.node.in_tensors[0], "input")
    if op.norm_train:  # save_mean and save_invstd, one float per channel each
        c = op.node.out.shape[1]
        yield private(c * 4, "mean")
        yield private(c * 4, "invstd")


@rule("groupnorm")
def groupnorm(op: OpView):
    yield tensor(op, op.node.in_tensors[0], "input")
    groups = op.node.module.num_groups
    yield private(op.node.out.shape[0] * groups * 4, "mean")
    yield private(op.node.out.shape[0] * groups * 4, "rstd")


@rule("layernorm")
def layernorm(op: OpView):
    x = op.node.in_tensors[0]
    yield tensor(op, x, "input")
    normalized = 1
    for s in op.node.module.normalized_shape:
        normalized *= s
    rows = x.numel // normalized
    yield private(rows * 4, "mean")
    yield private(rows * 4, "rstd")


@rule("relu", "sigmoid", "tanh", "softmax", "log_softmax", "elu")
def saves_output(op: OpView):
    yield tensor(op, op.node.out, "output")


@rule("leaky_relu")
def leaky_relu(op: OpView):
    # out-of-place saves the input; the in-place variant saves its result
    yield tensor(op, op.node.out if op.node.attrs.get("inplace") else op.node.in_tensors[0], "input")


@rule("hardtanh", "hardswish", "hardsigmoid", "silu", "gelu")
def saves_input(op: OpView):
    x = op.node.in_tensors[0]
    if op.node.attrs.get("inplace"):
        yield private(x.nbytes, "copy of input")  # in-place variants clone the original input
    else:
        yield tensor(op, x, "input")


@rule("maxpool", "adaptive_maxpool")
def maxpool(op: OpView):
    yield tensor(op, op.node.in_tensors[0], "input")
    yield private(op.node.out.numel * 8, "int64 indices")


@rule("avgpool")
def avgpool(op: OpView):
    yield tensor(op, op.node.in_tensors[0], "input")


@rule("adaptive_avgpool")
def adaptive_avgpool(op: OpView):
    # a 1x1 output is computed as mean(), which saves nothing
    if any(s != 1 for s in op.node.out.shape[2:]):
        yield tensor(op, op.node.in_tensors[0], "input")


@rule("dropout")
def dropout(op: OpView):
    if op.node.attrs.get("training", True) and (op.node.module is None or op.node.module.training):
        yield private(op.node.out.nbytes, "mask")


@rule("mul")
def mul(op: OpView):
    # d(a*b)/da = b and d(a*b)/db = a: keep the other operand of each input needing a gradient
    ts = op.node.in_tensors
    if len(ts) == 2:
        if op.req_in[0]:
            yield tensor(op, ts[1], "other operand")
        if op.req_in[1]:
            yield tensor(op, ts[0], "other operand")


@rule("div")
def div(op: OpView):
    # a / b: grad-a keeps b; grad-b keeps a and b
    ts = op.node.in_tensors
    if len(ts) == 2:
        if op.req_in[0] or op.req_in[1]:
            yield tensor(op, ts[1], "divisor")
        if op.req_in[1]:
            yield tensor(op, ts[0], "dividend")


@rule("matmul")
def matmul(op: OpView):
    a, b = op.node.in_tensors[:2]
    if op.req_in[0]:
        yield folded(op, b, "other operand")
    if op.req_in[1]:
        yield folded(op, a, "other operand")


@rule("cross_entropy")
def cross_entropy(op: OpView):
    yield private(op.node.in_tensors[0].nbytes, "log-softmax")
    yield tensor(op, op.node.attrs["target"], "target")
    yield private(4, "total weight")


@rule("add", "sub", "cat", "interpolate", "pad", "mean", "view", "identity", "getitem", "meta", "input", "output")
def saves_nothing(op: OpView):
    return ()
