"""Random but valid small CNNs for property-based tests of the cost model (hypothesis).

A drawn :class:`NetSpec` is plain data (frozen dataclasses whose ``repr`` can be pasted back
into Python), and :func:`build` turns it into an ``nn.Module`` deterministically, so a
failing example hypothesis prints is a complete reproduction::

    from tests.fuzz_models import *
    spec = NetSpec(...)  # as printed
    model = build(spec)
    graph = memplan.graph.capture.capture_graph(model, spec.input_shape)

Shapes stay tiny (batch 1-3, channels <= 16, spatial <= 16) so one example takes
milliseconds. Every op appears in several forms (module, functional, Tensor method,
in-place) because real models mix them and each form traces to a different fx node.

In-place ops are only generated where eager autograd accepts them: on a "fresh" tensor,
i.e. one that no earlier op keeps for backward and nothing else reads (the output of a
conv, norm, add, linear, pooling, ...), never on the output of an activation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import strategies as st

from memplan.graph import LayerGraph, Node
from memplan.graph.kinds import MASK_ACTIVATIONS, NORM_KINDS
from memplan.plan import Plan, Train

MAX_C = 16  # channels
MAX_HW = 16  # spatial size
MAX_UNITS = 5

# --------------------------------------------------------------------------- spec


@dataclass(frozen=True)
class Act:
    """An activation: ``form`` module | functional | method | torch; ``inplace`` only on fresh tensors."""

    kind: str
    form: str = "module"
    inplace: bool = False


@dataclass(frozen=True)
class Norm:
    """bn | gn | ln_w (LayerNorm over [W]) | ln_chw (LayerNorm over [C, H, W])."""

    kind: str
    affine: bool = True
    stats: bool = True  # BatchNorm track_running_stats
    groups: int = 1  # GroupNorm


@dataclass(frozen=True)
class Conv:
    """Conv2d (+ norm, + activation). ``groups == in channels`` with ``out = m x in`` is depthwise;
    ``pad`` an int or "same" / "valid"; ``pad_mode`` zeros | reflect | replicate | circular."""

    out: int
    k: int
    stride: int = 1
    pad: int | str = 0
    dil: int = 1
    groups: int = 1
    bias: bool = True
    norm: Norm | None = None
    act: Act | None = None
    pad_mode: str = "zeros"


@dataclass(frozen=True)
class ConvU:
    conv: Conv


@dataclass(frozen=True)
class Conv1dU:
    """flatten(2) -> Conv1d ('same' padding) -> BatchNorm1d? -> act? -> back to (B, C, H, W)."""

    out: int
    k: int
    bn: bool
    act: Act | None


@dataclass(frozen=True)
class ResidualU:
    """out = body(x) (+ projection of x when the shape changes) -> add -> post activation.

    ``add``: plus | radd | torch | iadd (``out += x``) | method_ (``out.add_(x)``).
    ``share_act``: the post activation is the body's activation module called again.
    """

    body: tuple[Conv, ...]
    proj: Conv | None
    add: str
    post: Act | None
    share_act: bool = False


@dataclass(frozen=True)
class SEU:
    """x * gate(fc2(act(fc1(squeeze(x))))): ``fc`` conv (1x1 convs) | linear (on flattened)."""

    hidden: int
    squeeze: str  # module | functional | mean
    fc: str
    act: Act
    gate: Act
    unflatten: str  # view | getitem | unsqueeze (linear form only)
    mul: str  # times | rtimes | torch


@dataclass(frozen=True)
class ConcatU:
    """torch.cat of ``x`` (or a max-pool of it) and one or two conv branches, along channels."""

    branches: tuple[Conv, ...]
    keep_input: str  # identity | maxpool | none
    fn: str  # cat | concat


@dataclass(frozen=True)
class PoolU:
    """kind max | avg | adaptive_avg | adaptive_max; module or functional form."""

    kind: str
    form: str
    k: int = 1
    stride: int = 1
    pad: int = 0
    ceil: bool = False
    count_include_pad: bool = True
    out_hw: tuple[int, int] = (1, 1)


@dataclass(frozen=True)
class InterpU:
    """nn.Upsample or F.interpolate; ``size`` or ``scale``; nearest | bilinear."""

    mode: str
    form: str
    scale: float | None
    size: tuple[int, int] | None
    align_corners: bool | None


@dataclass(frozen=True)
class DropoutU:
    kind: str  # dropout | dropout2d | functional
    p: float
    inplace: bool


@dataclass(frozen=True)
class PadU:
    """F.pad(x, (left, right, top, bottom), mode), or the padding module of that mode."""

    pads: tuple[int, int, int, int]
    mode: str
    form: str = "functional"  # functional | module


@dataclass(frozen=True)
class ActU:
    act: Act


@dataclass(frozen=True)
class ChannelMixU:
    """ConvNeXt-style: permute to channels-last -> LayerNorm(C)? -> Linear(C, out) -> act? -> permute back."""

    out: int
    ln: bool
    act: Act | None
    contiguous: bool


@dataclass(frozen=True)
class MatmulU:
    """On t = x flattened to (B, C, L = HW), ``form``:
    ``gram``: softmax?(t @ t^T) @ t (bmm, transposed operand);
    ``gram_t``: t @ softmax?(t^T @ t) (two transposed operands; L <= 64);
    ``spatial``: on x itself, softmax?(x @ x^T) @ x (4-dim batched matmul);
    ``weight``: t @ lin.weight + lin(t), lin = Linear(L, L) (3-dim @ 2-dim folded into mm; L <= 64);
    ``left``: lin.weight @ t + lin(t^T)^T, lin = Linear(C, C) (2-dim @ 3-dim; linear on a transposed input).
    ``fn``: the @ operator | torch.matmul | torch.bmm (3-dim forms only)."""

    form: str
    softmax: bool
    flatten: str  # torch | method | reshape
    fn: str


@dataclass(frozen=True)
class Head:
    """pool (adaptive avg / max / mean) or flatten -> norm1d? -> (Linear -> act -> dropout)? -> Linear(classes)."""

    reduce: str  # adaptive_avg | adaptive_max | functional_avg | mean | none
    flatten: str  # module | torch | method | view | reshape
    norm: str | None  # bn | ln
    hidden: int | None
    act: Act | None
    dropout: float | None
    bias: bool


Unit = ConvU | Conv1dU | ResidualU | SEU | ConcatU | PoolU | InterpU | DropoutU | PadU | ActU | ChannelMixU | MatmulU


@dataclass(frozen=True)
class NetSpec:
    batch: int
    in_ch: int
    hw: tuple[int, int]
    units: tuple[Unit, ...]
    head: Head
    classes: int

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.in_ch, *self.hw)


# --------------------------------------------------------------------------- building

ACT_MODULES: dict[str, Callable[[bool], nn.Module]] = {
    "relu": lambda ip: nn.ReLU(inplace=ip),
    "relu6": lambda ip: nn.ReLU6(inplace=ip),
    "hardtanh": lambda ip: nn.Hardtanh(-1.0, 1.0, inplace=ip),
    "leaky_relu": lambda ip: nn.LeakyReLU(0.1, inplace=ip),
    "hardswish": lambda ip: nn.Hardswish(inplace=ip),
    "hardsigmoid": lambda ip: nn.Hardsigmoid(inplace=ip),
    "silu": lambda ip: nn.SiLU(inplace=ip),
    "elu": lambda ip: nn.ELU(inplace=ip),
    "gelu": lambda ip: nn.GELU(),
    "sigmoid": lambda ip: nn.Sigmoid(),
    "tanh": lambda ip: nn.Tanh(),
}
#: (kind, inplace) -> functional call
ACT_FUNCTIONS: dict[tuple[str, bool], Callable[[torch.Tensor], torch.Tensor]] = {
    ("relu", False): F.relu,
    ("relu", True): lambda x: F.relu(x, inplace=True),
    ("relu6", False): F.relu6,
    ("relu6", True): lambda x: F.relu6(x, inplace=True),
    ("hardtanh", False): lambda x: F.hardtanh(x, -1.0, 1.0),
    ("hardtanh", True): lambda x: F.hardtanh(x, -1.0, 1.0, inplace=True),
    ("leaky_relu", False): lambda x: F.leaky_relu(x, 0.2),
    ("leaky_relu", True): lambda x: F.leaky_relu(x, 0.2, inplace=True),
    ("hardswish", False): F.hardswish,
    ("hardswish", True): lambda x: F.hardswish(x, inplace=True),
    ("hardsigmoid", False): F.hardsigmoid,
    ("hardsigmoid", True): lambda x: F.hardsigmoid(x, inplace=True),
    ("silu", False): F.silu,
    ("silu", True): lambda x: F.silu(x, inplace=True),
    ("elu", False): F.elu,
    ("elu", True): lambda x: F.elu(x, inplace=True),
    ("gelu", False): F.gelu,
    ("sigmoid", False): F.sigmoid,
    ("tanh", False): F.tanh,
}
ACT_TORCH: dict[tuple[str, bool], Callable[[torch.Tensor], torch.Tensor]] = {
    ("relu", False): torch.relu,
    ("relu", True): torch.relu_,
    ("sigmoid", False): torch.sigmoid,
    ("sigmoid", True): torch.sigmoid_,
    ("tanh", False): torch.tanh,
    ("tanh", True): torch.tanh_,
    ("hardtanh", True): lambda x: F.hardtanh_(x, -1.0, 1.0),
    ("leaky_relu", True): lambda x: F.leaky_relu_(x, 0.2),
    ("elu", True): F.elu_,
}
ACT_METHODS: dict[tuple[str, bool], Callable[[torch.Tensor], torch.Tensor]] = {
    ("relu", False): lambda x: x.relu(),
    ("relu", True): lambda x: x.relu_(),
    ("sigmoid", False): lambda x: x.sigmoid(),
    ("sigmoid", True): lambda x: x.sigmoid_(),
    ("tanh", False): lambda x: x.tanh(),
    ("tanh", True): lambda x: x.tanh_(),
    ("relu6", False): lambda x: x.clamp(0.0, 6.0),
    ("relu6", True): lambda x: x.clamp_(0.0, 6.0),
}

ACT_FORMS = {"functional": ACT_FUNCTIONS, "method": ACT_METHODS, "torch": ACT_TORCH}
INPLACE_MODULES = frozenset({"relu", "relu6", "hardtanh", "leaky_relu", "hardswish", "hardsigmoid", "silu", "elu"})


def act_module(a: Act | None) -> nn.Module | None:
    return ACT_MODULES[a.kind](a.inplace) if a is not None and a.form == "module" else None


def apply_act(a: Act | None, mod: nn.Module | None, x: torch.Tensor) -> torch.Tensor:
    if a is None:
        return x
    if mod is not None:
        return mod(x)
    return ACT_FORMS[a.form][a.kind, a.inplace](x)


def norm_module(n: Norm | None, c: int, h: int, w: int) -> nn.Module | None:
    if n is None:
        return None
    if n.kind == "bn":
        return nn.BatchNorm2d(c, affine=n.affine, track_running_stats=n.stats)
    if n.kind == "gn":
        return nn.GroupNorm(n.groups, c, affine=n.affine)
    if n.kind == "ln_w":
        return nn.LayerNorm([w], elementwise_affine=n.affine)
    return nn.LayerNorm([c, h, w], elementwise_affine=n.affine)


def conv_out(size: int, k: int, stride: int, pad: int | str, dil: int) -> int:
    if pad == "same":
        return size
    pad = 0 if pad == "valid" else pad
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def conv_shape(conv: Conv, c: int, h: int, w: int) -> tuple[int, int, int]:
    ho, wo = (conv_out(s, conv.k, conv.stride, conv.pad, conv.dil) for s in (h, w))
    return conv.out, ho, wo


class ConvBlock(nn.Module):
    """conv -> norm? -> act? (modules named conv / norm / act)."""

    def __init__(self, spec: Conv, c_in: int, h: int, w: int):
        super().__init__()
        self.spec = spec
        self.conv = nn.Conv2d(
            c_in, spec.out, spec.k, spec.stride, spec.pad, spec.dil, spec.groups, spec.bias, padding_mode=spec.pad_mode
        )
        _, ho, wo = conv_shape(spec, c_in, h, w)
        self.norm = norm_module(spec.norm, spec.out, ho, wo)
        self.act = act_module(spec.act)

    def forward(self, x):
        x = self.conv(x)
        if self.norm is not None:
            x = self.norm(x)
        return apply_act(self.spec.act, self.act, x)


class ConvUnit(nn.Module):
    def __init__(self, spec: ConvU, c: int, h: int, w: int):
        super().__init__()
        self.block = ConvBlock(spec.conv, c, h, w)

    def forward(self, x):
        return self.block(x)


class Conv1dUnit(nn.Module):
    def __init__(self, spec: Conv1dU, c: int, h: int, w: int):
        super().__init__()
        self.spec, self.hw = spec, (h, w)
        self.conv = nn.Conv1d(c, spec.out, spec.k, padding=spec.k // 2)
        self.bn = nn.BatchNorm1d(spec.out) if spec.bn else None
        self.act = act_module(spec.act)

    def forward(self, x):
        t = self.conv(x.flatten(2))
        if self.bn is not None:
            t = self.bn(t)
        t = apply_act(self.spec.act, self.act, t)
        return t.reshape(t.size(0), self.spec.out, *self.hw)


class Residual(nn.Module):
    def __init__(self, spec: ResidualU, c: int, h: int, w: int):
        super().__init__()
        self.spec = spec
        self.proj = ConvBlock(spec.proj, c, h, w) if spec.proj is not None else None
        layers = []
        for conv in spec.body:
            layers.append(ConvBlock(conv, c, h, w))
            c, h, w = conv_shape(conv, c, h, w)
        self.body = nn.Sequential(*layers)
        self.post = None if spec.share_act else act_module(spec.post)

    def forward(self, x):
        out = self.body(x)
        short = self.proj(x) if self.proj is not None else x
        add = self.spec.add
        if add == "plus":
            out = out + short
        elif add == "radd":
            out = short + out
        elif add == "torch":
            out = torch.add(out, short)
        elif add == "iadd":
            out += short
        else:
            out = out.add_(short)
        post = self.body[0].act if self.spec.share_act else self.post
        return apply_act(self.spec.post, post, out)


class SqueezeExcite(nn.Module):
    def __init__(self, spec: SEU, c: int, h: int, w: int):
        super().__init__()
        self.spec, self.c = spec, c
        self.pool = nn.AdaptiveAvgPool2d(1) if spec.squeeze == "module" else None
        if spec.fc == "conv":
            self.fc1, self.fc2 = nn.Conv2d(c, spec.hidden, 1), nn.Conv2d(spec.hidden, c, 1)
        else:
            self.fc1, self.fc2 = nn.Linear(c, spec.hidden), nn.Linear(spec.hidden, c)
        self.act, self.gate = act_module(spec.act), act_module(spec.gate)

    def forward(self, x):
        spec = self.spec
        if spec.squeeze == "module":
            s = self.pool(x)
        elif spec.squeeze == "functional":
            s = F.adaptive_avg_pool2d(x, 1)
        else:
            s = x.mean((2, 3), keepdim=True)
        if spec.fc == "linear":
            s = torch.flatten(s, 1)
        s = apply_act(spec.gate, self.gate, self.fc2(apply_act(spec.act, self.act, self.fc1(s))))
        if spec.fc == "linear":
            if spec.unflatten == "view":
                s = s.view(s.size(0), self.c, 1, 1)
            elif spec.unflatten == "getitem":
                s = s[:, :, None, None]
            else:
                s = s.unsqueeze(-1).unsqueeze(-1)
        if spec.mul == "times":
            return x * s
        if spec.mul == "rtimes":
            return s * x
        return torch.mul(x, s)


class Concat(nn.Module):
    def __init__(self, spec: ConcatU, c: int, h: int, w: int):
        super().__init__()
        self.spec = spec
        self.branches = nn.ModuleList(ConvBlock(b, c, h, w) for b in spec.branches)
        self.pool = nn.MaxPool2d(3, 1, 1) if spec.keep_input == "maxpool" else None

    def forward(self, x):
        parts = [b(x) for b in self.branches]
        if self.spec.keep_input == "identity":
            parts.insert(0, x)
        elif self.spec.keep_input == "maxpool":
            parts.append(self.pool(x))
        return torch.cat(parts, 1) if self.spec.fn == "cat" else torch.concat(parts, dim=1)


class Pool(nn.Module):
    def __init__(self, spec: PoolU, c: int, h: int, w: int):
        super().__init__()
        self.spec = spec
        s = spec
        self.pool = None
        if s.form == "module":
            self.pool = {
                "max": lambda: nn.MaxPool2d(s.k, s.stride, s.pad, ceil_mode=s.ceil),
                "avg": lambda: nn.AvgPool2d(
                    s.k, s.stride, s.pad, ceil_mode=s.ceil, count_include_pad=s.count_include_pad
                ),
                "adaptive_avg": lambda: nn.AdaptiveAvgPool2d(s.out_hw),
                "adaptive_max": lambda: nn.AdaptiveMaxPool2d(s.out_hw),
            }[s.kind]()

    def forward(self, x):
        s = self.spec
        if self.pool is not None:
            return self.pool(x)
        if s.kind == "max":
            return F.max_pool2d(x, s.k, s.stride, s.pad, ceil_mode=s.ceil)
        if s.kind == "avg":
            return F.avg_pool2d(x, s.k, s.stride, s.pad, ceil_mode=s.ceil, count_include_pad=s.count_include_pad)
        if s.kind == "adaptive_avg":
            return F.adaptive_avg_pool2d(x, s.out_hw)
        return F.adaptive_max_pool2d(x, s.out_hw)


class Interp(nn.Module):
    def __init__(self, spec: InterpU, c: int, h: int, w: int):
        super().__init__()
        self.spec = spec
        self.up = (
            nn.Upsample(size=spec.size, scale_factor=spec.scale, mode=spec.mode, align_corners=spec.align_corners)
            if spec.form == "module"
            else None
        )

    def forward(self, x):
        if self.up is not None:
            return self.up(x)
        s = self.spec
        return F.interpolate(x, size=s.size, scale_factor=s.scale, mode=s.mode, align_corners=s.align_corners)


class Drop(nn.Module):
    def __init__(self, spec: DropoutU, c: int, h: int, w: int):
        super().__init__()
        self.spec = spec
        self.drop = {"dropout": nn.Dropout, "dropout2d": nn.Dropout2d}.get(spec.kind)
        self.drop = self.drop(spec.p, inplace=spec.inplace) if self.drop else None

    def forward(self, x):
        if self.drop is not None:
            return self.drop(x)
        return F.dropout(x, self.spec.p, training=self.training, inplace=self.spec.inplace)


PAD_MODULES = {
    "constant": nn.ZeroPad2d,
    "reflect": nn.ReflectionPad2d,
    "replicate": nn.ReplicationPad2d,
    "circular": nn.CircularPad2d,
}


class Pad(nn.Module):
    def __init__(self, spec: PadU, c: int, h: int, w: int):
        super().__init__()
        self.spec = spec
        self.pad = PAD_MODULES[spec.mode](spec.pads) if spec.form == "module" else None

    def forward(self, x):
        return self.pad(x) if self.pad is not None else F.pad(x, self.spec.pads, mode=self.spec.mode)


class Activation(nn.Module):
    def __init__(self, spec: ActU, c: int, h: int, w: int):
        super().__init__()
        self.spec, self.act = spec, act_module(spec.act)

    def forward(self, x):
        return apply_act(self.spec.act, self.act, x)


class ChannelMix(nn.Module):
    def __init__(self, spec: ChannelMixU, c: int, h: int, w: int):
        super().__init__()
        self.spec = spec
        self.ln = nn.LayerNorm(c) if spec.ln else None
        self.fc = nn.Linear(c, spec.out)
        self.act = act_module(spec.act)

    def forward(self, x):
        t = x.permute(0, 2, 3, 1)
        if self.ln is not None:
            t = self.ln(t)
        t = apply_act(self.spec.act, self.act, self.fc(t))
        t = t.permute(0, 3, 1, 2)
        return t.contiguous() if self.spec.contiguous else t


class Matmul(nn.Module):
    def __init__(self, spec: MatmulU, c: int, h: int, w: int):
        super().__init__()
        self.spec, self.shape = spec, (c, h, w)
        features = {"weight": h * w, "left": c}.get(spec.form)
        self.lin = nn.Linear(features, features) if features else None

    def mm(self, a, b):
        fn = self.spec.fn
        return a @ b if fn == "operator" else torch.matmul(a, b) if fn == "matmul" else torch.bmm(a, b)

    def attend(self, a):
        return a.softmax(-1) if self.spec.softmax else a

    def forward(self, x):
        spec = self.spec
        if spec.form == "spatial":
            return self.attend(x @ x.transpose(-2, -1)) @ x
        if spec.flatten == "torch":
            t = torch.flatten(x, 2)
        elif spec.flatten == "method":
            t = x.flatten(2)
        else:
            t = x.reshape(x.size(0), self.shape[0], -1)
        if spec.form == "gram":
            y = self.mm(self.attend(self.mm(t, t.transpose(1, 2))), t)
        elif spec.form == "gram_t":
            y = self.mm(t, self.attend(self.mm(t.transpose(1, 2), t)))
        elif spec.form == "weight":
            y = t @ self.lin.weight + self.lin(t)
        else:
            y = torch.matmul(self.lin.weight, t) + self.lin(t.transpose(1, 2)).transpose(1, 2)
        return y.reshape(y.size(0), *self.shape)


UNIT_MODULES: dict[type, type[nn.Module]] = {
    ConvU: ConvUnit,
    Conv1dU: Conv1dUnit,
    ResidualU: Residual,
    SEU: SqueezeExcite,
    ConcatU: Concat,
    PoolU: Pool,
    InterpU: Interp,
    DropoutU: Drop,
    PadU: Pad,
    ActU: Activation,
    ChannelMixU: ChannelMix,
    MatmulU: Matmul,
}


class HeadModule(nn.Module):
    def __init__(self, spec: Head, c: int, h: int, w: int, classes: int):
        super().__init__()
        self.spec = spec
        self.pool = {"adaptive_avg": nn.AdaptiveAvgPool2d(1), "adaptive_max": nn.AdaptiveMaxPool2d((1, 1))}.get(
            spec.reduce
        )
        self.flat = nn.Flatten() if spec.flatten == "module" and spec.reduce != "mean" else None
        features = c if spec.reduce != "none" else c * h * w
        self.norm = {"bn": nn.BatchNorm1d, "ln": nn.LayerNorm}[spec.norm](features) if spec.norm else None
        self.hidden = nn.Linear(features, spec.hidden) if spec.hidden else None
        self.act = act_module(spec.act) if spec.hidden else None
        self.drop = nn.Dropout(spec.dropout) if spec.hidden and spec.dropout is not None else None
        self.fc = nn.Linear(spec.hidden or features, classes, bias=spec.bias)

    def forward(self, x):
        spec = self.spec
        if self.pool is not None:
            x = self.pool(x)
        elif spec.reduce == "functional_avg":
            x = F.adaptive_avg_pool2d(x, 1)
        elif spec.reduce == "mean":
            x = x.mean((2, 3))
        if spec.reduce != "mean":
            if self.flat is not None:
                x = self.flat(x)
            elif spec.flatten == "torch":
                x = torch.flatten(x, 1)
            elif spec.flatten == "method":
                x = x.flatten(1)
            elif spec.flatten == "view":
                x = x.view(x.size(0), -1)
            else:
                x = x.reshape(x.shape[0], -1)
        if self.norm is not None:
            x = self.norm(x)
        if self.hidden is not None:
            x = apply_act(spec.act, self.act, self.hidden(x))
            if self.drop is not None:
                x = self.drop(x)
        return self.fc(x)


class FuzzNet(nn.Module):
    """``body`` (an nn.Sequential of units) then ``head``; built from a :class:`NetSpec`."""

    def __init__(self, spec: NetSpec):
        super().__init__()
        c, (h, w) = spec.in_ch, spec.hw
        units = []
        for u in spec.units:
            units.append(UNIT_MODULES[type(u)](u, c, h, w))
            c, h, w = unit_out(u, c, h, w)
        self.body = nn.Sequential(*units)
        self.head = HeadModule(spec.head, c, h, w, spec.classes)

    def forward(self, x):
        return self.head(self.body(x))


def build(spec: NetSpec, seed: int = 0) -> FuzzNet:
    """The model of ``spec`` (weights from ``seed``; they do not affect any count)."""
    torch.manual_seed(seed)
    return FuzzNet(spec)


def sample_batch(spec: NetSpec, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """A real input batch and int64 class targets for ``spec``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(spec.input_shape, generator=g), torch.randint(0, spec.classes, (spec.batch,), generator=g)


# --------------------------------------------------------------------------- shapes


def pool_out(size: int, k: int, stride: int, pad: int, ceil: bool) -> int:
    """Max / avg pooling output size (torch's rule: the last window starts inside the input)."""
    out = (size + 2 * pad - k + (stride - 1 if ceil else 0)) // stride + 1
    if ceil and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def unit_out(u: Unit, c: int, h: int, w: int) -> tuple[int, int, int]:
    """(channels, height, width) after unit ``u``."""
    if isinstance(u, ConvU):
        return conv_shape(u.conv, c, h, w)
    if isinstance(u, ResidualU):
        for conv in u.body:
            c, h, w = conv_shape(conv, c, h, w)
        return c, h, w
    if isinstance(u, ConcatU):
        keep = c if u.keep_input != "none" else 0
        return keep + sum(b.out for b in u.branches), h, w
    if isinstance(u, PoolU):
        if u.kind.startswith("adaptive"):
            return (c, *u.out_hw)
        return c, pool_out(h, u.k, u.stride, u.pad, u.ceil), pool_out(w, u.k, u.stride, u.pad, u.ceil)
    if isinstance(u, InterpU):
        return (c, *u.size) if u.size is not None else (c, int(h * u.scale), int(w * u.scale))
    if isinstance(u, (Conv1dU, ChannelMixU)):
        return u.out, h, w
    if isinstance(u, PadU):
        left, right, top, bottom = u.pads
        return c, h + top + bottom, w + left + right
    return c, h, w  # SE, dropout, activation, matmul


# --------------------------------------------------------------------------- strategies

ACT_KINDS = tuple(ACT_MODULES)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def acts(draw, fresh: bool, kinds: tuple[str, ...] = ACT_KINDS) -> Act:
    """An activation; in place only when its input is ``fresh``."""
    kind = draw(st.sampled_from(kinds))
    variants = {"module": [False] + [True] * (kind in INPLACE_MODULES)}
    for form, table in ACT_FORMS.items():
        variants[form] = [ip for ip in (False, True) if (kind, ip) in table]
    form = draw(st.sampled_from([f for f, v in variants.items() if v and (fresh or False in v)]))
    return Act(kind, form, draw(st.sampled_from([ip for ip in variants[form] if fresh or not ip])))


@st.composite
def norms(draw, c: int, h: int, w: int, batch: int) -> Norm:
    # GroupNorm needs > 1 value per (sample, group); BatchNorm without running statistics
    # always uses batch statistics and needs > 1 value per channel
    gn_groups = [g for g in divisors(c) if batch * (c // g) * h * w > 1]
    kind = draw(st.sampled_from(["bn", "ln_w", "ln_chw"] + ["gn"] * bool(gn_groups)))
    affine = draw(st.booleans())
    stats = kind != "bn" or batch * h * w == 1 or draw(st.booleans())
    groups = draw(st.sampled_from(gn_groups)) if kind == "gn" else 1
    return Norm(kind, affine, stats, groups)


@st.composite
def convs(
    draw,
    c: int,
    h: int,
    w: int,
    batch: int,
    *,
    same: bool = False,
    stride: int | None = None,
    out: int | None = None,
    act: bool = True,
    norm: bool = True,
) -> Conv:
    """A conv with random groups / kernel / stride / padding / dilation (+ norm, + activation).

    ``same``: odd kernel with padding ``dil * (k // 2)`` (spatial size kept at stride 1)."""
    depthwise = out is None and c > 1 and draw(st.booleans())
    if depthwise:
        out = c * draw(st.sampled_from([m for m in (1, 2) if c * m <= MAX_C]))
        groups = c
    else:
        out = out or draw(st.integers(1, MAX_C))
        groups = draw(st.sampled_from(divisors(c) if c == out else [g for g in divisors(c) if out % g == 0]))
    dil = draw(st.sampled_from([1, 2]))
    if same:
        k = draw(st.sampled_from([1, 3, 5]))
        pad: int | str = dil * (k // 2)
        stride = stride or 1
    else:
        stride = stride or draw(st.integers(1, 3))
        pad = draw(st.sampled_from([0, 1, 2] + ["valid"] + ["same"] * (stride == 1)))
        room = min(h, w) + 2 * (pad if isinstance(pad, int) else 0)
        k = draw(st.integers(1, min(5, room if pad == "same" else (room - 1) // dil + 1)))
    # reflect / circular padding must be smaller than the input (what F.pad accepts)
    half = dil * (k - 1) - dil * (k - 1) // 2 if pad == "same" else (pad if isinstance(pad, int) else 0)
    modes = ["zeros", "zeros", "zeros", "replicate"] + ["reflect", "circular"] * (half < min(h, w))
    pad_mode = draw(st.sampled_from(modes))
    bias = draw(st.booleans())
    _, ho, wo = conv_shape(Conv(out, k, stride, pad, dil), c, h, w)
    nrm = draw(st.one_of(st.none(), norms(out, ho, wo, batch))) if norm else None
    a = draw(st.one_of(st.none(), acts(fresh=True))) if act else None
    return Conv(out, k, stride, pad, dil, groups, bias, nrm, a, pad_mode)


@st.composite
def residuals(draw, c: int, h: int, w: int, batch: int) -> ResidualU:
    project = draw(st.booleans())
    stride = draw(st.sampled_from([1, 2])) if project else 1
    n = draw(st.integers(1, 2))
    body = []
    ci, hi, wi = c, h, w
    for i in range(n):
        last = i == n - 1
        conv = draw(
            convs(
                ci,
                hi,
                wi,
                batch,
                same=True,
                stride=stride if i == 0 else 1,
                out=c if last and not project else None,
                act=not last,
            )
        )
        body.append(conv)
        ci, hi, wi = conv_shape(conv, ci, hi, wi)
    proj = None
    if project:
        proj = Conv(ci, 1, stride, bias=draw(st.booleans()), norm=draw(st.one_of(st.none(), st.just(Norm("bn")))))
    first = body[0].act
    share = first is not None and first.form == "module" and draw(st.booleans())
    post = first if share else draw(st.one_of(st.none(), acts(fresh=True)))
    add = draw(st.sampled_from(["plus", "radd", "torch", "iadd", "method_"]))
    return ResidualU(tuple(body), proj, add, post, share)


@st.composite
def squeeze_excites(draw, c: int) -> SEU:
    return SEU(
        hidden=draw(st.integers(1, max(1, c))),
        squeeze=draw(st.sampled_from(["module", "functional", "mean"])),
        fc=draw(st.sampled_from(["conv", "linear"])),
        act=draw(acts(fresh=True, kinds=("relu", "silu", "hardswish", "relu6", "gelu"))),
        gate=draw(acts(fresh=True, kinds=("sigmoid", "hardsigmoid"))),
        unflatten=draw(st.sampled_from(["view", "getitem", "unsqueeze"])),
        mul=draw(st.sampled_from(["times", "rtimes", "torch"])),
    )


@st.composite
def concats(draw, c: int, h: int, w: int, batch: int) -> ConcatU:
    keep = draw(st.sampled_from(["identity", "maxpool", "none"] if c < MAX_C else ["none"]))
    room = MAX_C - (c if keep != "none" else 0)
    branches = []
    for _ in range(draw(st.integers(1, 2 if room >= 2 else 1))):
        out = draw(st.integers(1, room - sum(b.out for b in branches)))
        branches.append(draw(convs(c, h, w, batch, same=True, out=out)))
        if sum(b.out for b in branches) >= room:
            break
    return ConcatU(tuple(branches), keep, draw(st.sampled_from(["cat", "concat"])))


@st.composite
def pools(draw, c: int, h: int, w: int) -> PoolU:
    kind = draw(st.sampled_from(["max", "avg", "adaptive_avg", "adaptive_max"]))
    form = draw(st.sampled_from(["module", "functional"]))
    if kind.startswith("adaptive"):
        return PoolU(kind, form, out_hw=(draw(st.integers(1, h)), draw(st.integers(1, w))))
    k = draw(st.integers(1, min(3, h, w)))
    return PoolU(
        kind, form, k, draw(st.integers(1, k)), draw(st.integers(0, k // 2)), draw(st.booleans()), draw(st.booleans())
    )


@st.composite
def interps(draw, h: int, w: int) -> InterpU:
    mode = draw(st.sampled_from(["nearest", "bilinear"]))
    form = draw(st.sampled_from(["module", "functional"]))
    align = draw(st.sampled_from([None, False, True])) if mode == "bilinear" else None
    scales = [s for s in (2.0, 0.5) if 1 <= int(h * s) <= MAX_HW and 1 <= int(w * s) <= MAX_HW]
    if scales and draw(st.booleans()):
        return InterpU(mode, form, draw(st.sampled_from(scales)), None, align)
    return InterpU(mode, form, None, (draw(st.integers(1, MAX_HW)), draw(st.integers(1, MAX_HW))), align)


@st.composite
def units(draw, c: int, h: int, w: int, batch: int, fresh: bool) -> tuple[Unit, bool]:
    """One unit and whether its output is fresh (safe for a following in-place op)."""
    kind = draw(
        st.sampled_from(
            [
                "conv",
                "conv",
                "residual",
                "residual",
                "se",
                "concat",
                "pool",
                "pool",
                "interp",
                "dropout",
                "pad",
                "act",
                "conv1d",
                "channel_mix",
                "matmul",
            ]
        )
    )
    if kind == "conv":
        conv = draw(convs(c, h, w, batch))
        return ConvU(conv), conv.act is None
    if kind == "residual":
        r = draw(residuals(c, h, w, batch))
        return r, r.post is None
    if kind == "se":
        return draw(squeeze_excites(c)), True
    if kind == "concat":
        return draw(concats(c, h, w, batch)), True
    if kind == "pool":
        return draw(pools(c, h, w)), True
    if kind == "interp":
        return draw(interps(h, w)), True
    if kind == "dropout":
        p = draw(st.sampled_from([0.0, 0.2, 0.5]))
        d = DropoutU(draw(st.sampled_from(["dropout", "dropout2d", "functional"])), p, fresh and draw(st.booleans()))
        return d, fresh or p > 0
    if kind == "pad":
        mode = draw(st.sampled_from(["constant", "reflect", "replicate", "circular"]))
        # reflect / circular padding must be smaller than the input
        limit = [MAX_HW - s if mode in ("constant", "replicate") else min(s - 1, MAX_HW - s) for s in (w, h)]
        left = draw(st.integers(0, max(0, limit[0]) // 2))
        right = draw(st.integers(0, max(0, limit[0]) // 2))
        top = draw(st.integers(0, max(0, limit[1]) // 2))
        bottom = draw(st.integers(0, max(0, limit[1]) // 2))
        return PadU((left, right, top, bottom), mode, draw(st.sampled_from(["functional", "module"]))), True
    if kind == "act":
        return ActU(draw(acts(fresh))), False
    if kind == "conv1d":
        a = draw(st.one_of(st.none(), acts(fresh=True)))
        return Conv1dU(draw(st.integers(1, MAX_C)), draw(st.sampled_from([1, 3, 5])), draw(st.booleans()), a), a is None
    if kind == "channel_mix":
        a = draw(st.one_of(st.none(), acts(fresh=True)))
        contiguous = draw(st.booleans())
        return ChannelMixU(draw(st.integers(1, MAX_C)), draw(st.booleans()), a, contiguous), a is None or contiguous
    forms = ["gram", "spatial", "left"] + (["gram_t", "weight"] if h * w <= 64 else [])
    form = draw(st.sampled_from(forms))
    fns = ["operator", "matmul", "bmm"] if form.startswith("gram") else ["operator"]
    return MatmulU(
        form, draw(st.booleans()), draw(st.sampled_from(["torch", "method", "reshape"])), draw(st.sampled_from(fns))
    ), True


@st.composite
def heads(draw, c: int, h: int, w: int) -> Head:
    reduce = draw(st.sampled_from(["adaptive_avg", "adaptive_max", "functional_avg", "mean", "none"]))
    hidden = draw(st.one_of(st.none(), st.integers(1, MAX_C)))
    return Head(
        reduce=reduce,
        # x.view needs a flattenable layout: only after pooling (the body's output may be a permuted view)
        flatten=draw(st.sampled_from(["module", "torch", "method", "reshape"] + ["view"] * (reduce != "none"))),
        norm=draw(st.sampled_from([None, "bn", "ln"])),
        hidden=hidden,
        act=draw(acts(fresh=True)) if hidden else None,
        dropout=draw(st.sampled_from([None, 0.0, 0.3])) if hidden else None,
        bias=draw(st.booleans()),
    )


@st.composite
def nets(draw, max_units: int = MAX_UNITS) -> NetSpec:
    """A random valid CNN: a conv stem, up to ``max_units - 1`` more units, a classifier head."""
    batch = draw(st.integers(1, 3))
    in_ch = draw(st.integers(1, 4))
    hw = (draw(st.integers(4, MAX_HW)), draw(st.integers(4, MAX_HW)))
    stem = draw(convs(in_ch, *hw, batch))
    body: list[Unit] = [ConvU(stem)]
    c, h, w = conv_shape(stem, in_ch, *hw)
    fresh = stem.act is None
    for _ in range(draw(st.integers(0, max_units - 1))):
        u, fresh = draw(units(c, h, w, batch, fresh))
        body.append(u)
        c, h, w = unit_out(u, c, h, w)
    return NetSpec(batch, in_ch, hw, tuple(body), draw(heads(c, h, w)), draw(st.integers(2, 10)))


def any_layer(node: Node) -> bool:
    return True


@st.composite
def plans(draw, graph: LayerGraph, partial: Callable[[Node], bool] = any_layer) -> Plan:
    """A random trainable subset: per param layer Train(weight 0 / 0.5 / 1, bias) (0.5 only
    where ``partial(node)``), a random set of norms in train mode (BatchNorm only where it sees
    > 1 value per channel) and of activations with approximated backward."""
    layers = graph.param_nodes()
    pattern = draw(st.sampled_from(["random", "all", "none", "suffix"]))
    start = draw(st.integers(0, len(layers))) if pattern == "suffix" else 0
    train: dict[str, Train] = {}
    for i, node in enumerate(layers):
        if pattern == "none" or i < start:
            continue
        full = pattern != "random"
        weight = 1.0 if full else draw(st.sampled_from([0.0, 0.5, 1.0] if partial(node) else [0.0, 1.0]))
        bias = full or draw(st.booleans())
        t = Train(weight if "weight" in node.params else 0.0, bias and "bias" in node.params)
        if t.any:
            train[node.name] = t
    norm_train, approx = set(), set()
    for node in graph.nodes:
        if node.kind in NORM_KINDS and node.module is not None:
            per_channel = node.out.numel // node.out.shape[1]
            if (node.kind != "batchnorm" or per_channel > 1) and draw(st.booleans()):
                norm_train.add(node.name)
        if node.kind in MASK_ACTIVATIONS | {"hardswish"} and draw(st.booleans()):
            approx.add(node.name)
    return Plan("fuzz", train, norm_train, approx)
