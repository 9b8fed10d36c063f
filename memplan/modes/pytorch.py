"""Mode ``pytorch``: what eager PyTorch 2.13 autograd saves, to the byte.

Facts from ``shared/reference/accounting.md`` §1, each checked with
``torch.autograd.graph.saved_tensors_hooks`` (tests/test_pytorch_mode.py measures every zoo
model x strategy). Parameters and buffers saved by an op (conv weight, BN running stats) are
not activations and are not counted here; they are in the weight bytes.
"""

from __future__ import annotations

import math

import torch

from ..graph import TensorInfo, conv_padding
from ..graph.attention import sdpa_backend
from ..plan import OpView
from .base import Mode, Saved, private, register_mode, tensor


class PyTorchMode(Mode):
    name = "pytorch"
    description = "eager PyTorch 2.13 autograd, requires_grad / train-eval flags set the plain way"
    partial_weight_grads = False
    kernel_workspaces = True
    eager_saved = True


pytorch = register_mode(PyTorchMode())
rule = pytorch.rule


def weight(op: OpView, w: TensorInfo) -> Saved:
    """The weight operand ``w`` kept. Autocast's low-precision copy of a parameter (a ``cast`` node,
    ``memplan.graph.autocast``) is one per autocast region when the parameter requires grad (the cast
    cache: one storage, however many ops keep it); a frozen one is cast again at every use, a copy
    of its own."""
    src = op.graph.nodes[op.node.inputs[op.node.attrs["operands"]["weight"]]]
    if src.kind == "cast" and not op.operand_grad("weight"):
        return private(w.nbytes, "weight (autocast copy)")
    return tensor(op, w, "weight")


@rule("conv")
def conv(op: OpView):
    """Convolution saves input and weight whenever recorded, whatever needs a gradient (a
    weight that is a parameter is not an activation; a computed one is). It keeps a padded copy
    instead of its input when it pads before convolving: a padding_mode other than zeros (F.pad
    first; reflect / replicate pads keep their input too), or padding="same" with an odd total
    (the asymmetric remainder is zero-padded into a copy)."""
    x, w, a = op.node.in_tensors[0], op.operand("weight"), op.node.attrs
    if w is not None:
        yield weight(op, w)
    pads = conv_padding(a["padding"], a["kernel_size"], a["dilation"])
    mode = a.get("padding_mode", "zeros")
    if mode == "zeros":
        extra = [after - before for before, after in pads]
        if not any(extra):
            yield tensor(op, x, "input")
            return
    else:
        extra = [before + after for before, after in pads]
        if mode in ("reflect", "replicate") and op.grad_input:
            yield tensor(op, x, "input")
    spatial = len(pads)
    numel = 1
    for s in x.shape[:-spatial]:
        numel *= s
    for s, e in zip(x.shape[-spatial:], extra):
        numel *= s + e
    yield private(numel * x.itemsize, "padded input copy")


def reshaped(op: OpView, t: TensorInfo, dims: int, what: str) -> Saved:
    """An operand kept after merging its first ``dims`` dims into one (what at::matmul and
    linear do before mm / bmm): the same storage when a view can do it, else a new copy."""
    if t.mergeable(dims):
        return tensor(op, t, what)
    return private(t.nbytes, f"{what} (reshaped copy)")


def _transposed(t: TensorInfo) -> TensorInfo:
    """``t.mT``: the last two dims swapped (a view)."""
    shape, strides = list(t.shape), list(t.layout)
    shape[-2:], strides[-2:] = shape[:-3:-1], strides[:-3:-1]
    return TensorInfo(tuple(shape), t.dtype, t.storage, tuple(strides))


def _expanded(t: TensorInfo, batch: tuple[int, ...]) -> TensorInfo:
    """``t`` broadcast to ``batch`` leading dims (a view; broadcast dims get stride 0)."""
    strides = t.layout
    lead = len(batch) - (len(t.shape) - 2)
    new = [0] * lead + [st if s == b else 0 for s, st, b in zip(t.shape[:-2], strides[:-2], batch[lead:])]
    return TensorInfo(batch + t.shape[-2:], t.dtype, t.storage, tuple(new) + tuple(strides[-2:]))


@rule("linear")
def linear(op: OpView):
    """addmm / mm: the input if the weight needs a gradient (an input with more than 2 dims
    flattened to (-1, in_features)), the weight if the input needs one (a parameter weight is
    not an activation)."""
    if op.weight_grad:
        x = op.operand("input")
        yield reshaped(op, x, len(x.shape) - 1, "input")
    w = op.operand("weight")
    if w is not None and op.grad_input:
        yield weight(op, w)


@rule("batchnorm")
def batchnorm(op: OpView):
    yield tensor(op, op.operand("input"), "input")
    # batch statistics in train mode, and always without running statistics (track_running_stats=False)
    if op.norm_train or not op.node.attrs["running_stats"]:  # save_mean and save_invstd, one float per channel
        c = op.node.out.shape[1]
        yield private(c * 4, "mean")
        yield private(c * 4, "invstd")


@rule("groupnorm")
def groupnorm(op: OpView):
    yield tensor(op, op.operand("input"), "input")
    groups = op.node.attrs["num_groups"]
    yield private(op.node.out.shape[0] * groups * 4, "mean")
    yield private(op.node.out.shape[0] * groups * 4, "rstd")


@rule("layernorm")
def layernorm(op: OpView):
    x = op.operand("input")
    yield tensor(op, x, "input")
    normalized = 1
    for s in op.node.attrs["normalized_shape"]:
        normalized *= s
    rows = x.numel // normalized
    yield private(rows * 4, "mean")
    yield private(rows * 4, "rstd")


@rule("relu", "sigmoid", "tanh", "softmax", "log_softmax")
def saves_output(op: OpView):
    yield tensor(op, op.node.out, "output")


@rule("leaky_relu", "elu")
def input_or_inplace_result(op: OpView):
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
    # a scaled float mask, one value per element (per (batch, channel) for Dropout1d/2d/3d);
    # p = 0 returns the input itself: nothing to keep
    out = op.node.out
    if op.node.attrs.get("training", True) and op.node.attrs["p"] > 0:
        numel = out.shape[0] * out.shape[1] if op.node.attrs.get("feature") else out.numel
        yield private(numel * out.itemsize, "mask")


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
    """at::matmul: a >2-dim operand against a <=2-dim one is folded into one mm (its leading
    dims merged; for 2-dim @ >2-dim the transposed right operand is folded); two >2-dim
    operands are broadcast to one batch shape whose dims are merged for bmm."""
    a, b = op.node.in_tensors[:2]
    da, db = len(a.shape), len(b.shape)
    if da >= 3 and db <= 2:
        keep_a, keep_b = reshaped(op, a, da - 1, "other operand"), tensor(op, b, "other operand")
    elif da <= 2 and db >= 3:
        keep_a, keep_b = tensor(op, a, "other operand"), reshaped(op, _transposed(b), db - 1, "other operand")
    elif da >= 3:
        batch = tuple(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        keep_a = reshaped(op, _expanded(a, batch), len(batch), "other operand")
        keep_b = reshaped(op, _expanded(b, batch), len(batch), "other operand")
    else:
        keep_a, keep_b = tensor(op, a, "other operand"), tensor(op, b, "other operand")
    if op.req_in[0]:
        yield keep_b
    if op.req_in[1]:
        yield keep_a


def _math_value(op: OpView, v: TensorInfo, batch: tuple[int, ...], acc: int) -> Saved:
    """``value`` as the math kernel keeps it for bmm: merged to 3 dims (a view, or a copy); a float32
    copy where it computes in float32 (broadcast to the batch by a copy where it must be)."""
    if acc != v.itemsize:
        lead = math.prod(batch)
        numel = v.numel if tuple(v.shape[:-2]) == batch else lead * v.shape[-2] * v.shape[-1]
        return private(numel * acc, "value (float32 copy)")
    if len(v.shape) > 2:
        return reshaped(op, _expanded(v, batch), len(batch), "value")
    return tensor(op, v, "value")


@rule("sdpa")
def sdpa(op: OpView):
    """F.scaled_dot_product_attention, as the CPU kernel torch picks
    (:func:`memplan.graph.attention.sdpa_backend`).
    Flash: query, key, value, the output, the float mask (a boolean one converted to a new
    float tensor) and the float32 logsumexp (batch x heads x L). Math: the composite's matmuls,
    softmax and dropout: q x sqrt(scale) and (k x sqrt(scale))^T (new tensors, kept for each
    other's gradient), the softmax output when the scores need a gradient, the dropout mask and
    the dropped-out weights, and ``value`` (merged to 3 dims for bmm: a view, or a copy). The math
    kernel computes float16 / bfloat16 attention in float32 (query, key and value cast up first):
    all of these are then float32, ``value`` a float32 copy."""
    q, k, v, m = (op.operand(n) for n in ("query", "key", "value", "attn_mask"))
    rq, rk, rv, rm = (op.operand_grad(n) for n in ("query", "key", "value", "attn_mask"))
    if sdpa_backend(op) == "flash":
        for t, what in ((q, "query"), (k, "key"), (v, "value")):
            yield tensor(op, t, what)
        if m is not None:
            yield tensor(op, m, "mask") if m.dtype.is_floating_point else private(m.numel * q.itemsize, "float mask")
        yield tensor(op, op.node.out, "output")
        yield private(q.numel // q.shape[-1] * (8 if q.dtype == torch.float64 else 4), "logsumexp")
        return
    batch = tuple(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]))
    lead = 1
    for s in batch:
        lead *= s
    L, S = q.shape[-2], k.shape[-2]
    acc = 4 if q.dtype in (torch.float16, torch.bfloat16) else q.itemsize  # the math kernel's precision
    scores = lead * L * S * acc
    if rq:
        yield private(lead * S * k.shape[-1] * acc, "scaled key (transposed)")
    if rk:
        yield private(lead * L * q.shape[-1] * acc, "scaled query")
    grad_scores = rq or rk or rm
    dropout = op.node.attrs["dropout_p"] > 0
    if grad_scores:
        yield private(scores, "softmax output")
        if dropout:
            yield private(scores, "dropout mask")
        yield _math_value(op, v, batch, acc)
    if rv and (dropout or not grad_scores):
        yield private(scores, "attention weights")


@rule("cross_entropy")
def cross_entropy(op: OpView):
    # the log-softmax of the logits, in float32 under autocast (its float32 list)
    logits = op.node.in_tensors[0]
    dtype = op.node.attrs.get("dtype", logits.dtype)
    yield private(logits.numel * dtype.itemsize, "log-softmax")
    yield tensor(op, op.node.attrs["target"], "target")
    yield private(dtype.itemsize, "total weight")


@rule("pad")
def pad(op: OpView):
    # reflect / replicate padding keep their input; constant and circular keep nothing
    if op.node.attrs.get("mode") in ("reflect", "replicate"):
        yield tensor(op, op.node.in_tensors[0], "input")


@rule("getitem")
def getitem(op: OpView):
    """Basic indexing (ints, slices) is a view and keeps nothing; advanced indexing keeps its
    indices for the gradient of the indexed tensor: an integer index tensor (``table[index]``:
    relative position biases; ``x[:, perm]``: a channel permutation) or a boolean mask as given, and
    the new int64 / bool tensor made of a Python sequence (``x[:, [2, 0, 1]]``) at each call."""
    if op.req_in and op.req_in[0]:
        for t in op.node.in_tensors[1:]:
            if not t.dtype.is_floating_point:
                yield tensor(op, t, "index")
        for nbytes in op.node.attrs.get("sequence_index_bytes", ()):
            yield private(nbytes, "index tensor made of a Python sequence")


@rule(
    "add", "sub", "cat", "fold", "interpolate", "mean", "view", "identity", "cast", "meta", "param", "input", "output"
)
def saves_nothing(op: OpView):
    # cast: an autocast copy (ToCopyBackward keeps nothing)
    # fold: F.unfold (im2col) / F.fold (col2im), each the other's backward, which needs only shapes
    return ()
